/* linalg-tmpl.h - the column-major cores of kernels/linalg.c, written once
 * and included twice: with LA_T float (float32 computes in float32, as
 * LAPACK's s-routines) and LA_T double. LA_F(name) gives each copy its own
 * names (name_f / name_d). Every routine works on a dense column-major
 * buffer: element (i, j) of a matrix with leading dimension ld is a[i + j*ld].
 * The loops are LAPACK's and the reference BLAS's unblocked ones (dpotf2,
 * dgetf2, dtrsm, dtrti2), in their order of operations. */

/* Matrix (r x c) of t at element offset off -> w (ld r), transposed if tr. */
static void LA_F(load)(const tpu_tensor *t, int64_t off, int64_t r, int64_t c, bool tr, LA_T *w) {
    const LA_T *s = (const LA_T *)t->base + off;
    int64_t s0 = t->strides[t->ndim - 2], s1 = t->strides[t->ndim - 1];
    if (tr) {
        int64_t x = s0;
        s0 = s1;
        s1 = x;
    }
    for (int64_t j = 0; j < c; j++)
        for (int64_t i = 0; i < r; i++) w[i + j * r] = s[i * s0 + j * s1];
}

static void LA_F(store)(const tpu_tensor *t, int64_t off, int64_t r, int64_t c, bool tr, const LA_T *w) {
    LA_T *d = (LA_T *)t->base + off;
    int64_t s0 = t->strides[t->ndim - 2], s1 = t->strides[t->ndim - 1];
    if (tr) {
        int64_t x = s0;
        s0 = s1;
        s1 = x;
    }
    for (int64_t j = 0; j < c; j++)
        for (int64_t i = 0; i < r; i++) d[i * s0 + j * s1] = w[i + j * r];
}

/* B (m x nrhs, ldb) := op(A)^-1 B for triangular A (m x m, lda); op(A) = A^T
 * if trans. dtrsm's Left cases. */
static void LA_F(trsm)(bool upper, bool trans, bool unit, int64_t m, int64_t nrhs, const LA_T *a, int64_t lda, LA_T *b,
                       int64_t ldb) {
    for (int64_t j = 0; j < nrhs; j++) {
        LA_T *x = b + j * ldb;
        if (!trans && upper) {
            for (int64_t k = m - 1; k >= 0; k--) {
                if (x[k] == 0) continue;
                if (!unit) x[k] /= a[k + k * lda];
                LA_T t = x[k];
                const LA_T *ak = a + k * lda;
                for (int64_t i = 0; i < k; i++) x[i] -= t * ak[i];
            }
        } else if (!trans) {
            for (int64_t k = 0; k < m; k++) {
                if (x[k] == 0) continue;
                if (!unit) x[k] /= a[k + k * lda];
                LA_T t = x[k];
                const LA_T *ak = a + k * lda;
                for (int64_t i = k + 1; i < m; i++) x[i] -= t * ak[i];
            }
        } else if (upper) { /* A^T lower: forward, dot products down A's columns */
            for (int64_t i = 0; i < m; i++) {
                LA_T t = x[i];
                const LA_T *ai = a + i * lda;
                for (int64_t k = 0; k < i; k++) t -= ai[k] * x[k];
                if (!unit) t /= ai[i];
                x[i] = t;
            }
        } else {
            for (int64_t i = m - 1; i >= 0; i--) {
                LA_T t = x[i];
                const LA_T *ai = a + i * lda;
                for (int64_t k = i + 1; k < m; k++) t -= ai[k] * x[k];
                if (!unit) t /= ai[i];
                x[i] = t;
            }
        }
    }
}

/* A (n x n, lda) = L L^T from its lower triangle, L in place (dpotf2,
 * lower). Returns 0, or the 1-based order of the first leading minor that
 * is not positive-definite (its diagonal element keeps the value that
 * failed, as LAPACK leaves it). */
static int64_t LA_F(potrf)(int64_t n, LA_T *a, int64_t lda) {
    for (int64_t j = 0; j < n; j++) {
        LA_T *cj = a + j * lda, ajj = 0;
        for (int64_t k = 0; k < j; k++) ajj += a[j + k * lda] * a[j + k * lda];
        ajj = cj[j] - ajj;
        if (!(ajj > 0)) { /* NaN too */
            cj[j] = ajj;
            return j + 1;
        }
        ajj = (LA_T)sqrt(ajj);
        cj[j] = ajj;
        for (int64_t k = 0; k < j; k++) {
            LA_T t = a[j + k * lda];
            const LA_T *ck = a + k * lda;
            for (int64_t i = j + 1; i < n; i++) cj[i] -= t * ck[i];
        }
        LA_T r = 1 / ajj;
        for (int64_t i = j + 1; i < n; i++) cj[i] *= r;
    }
    return 0;
}

/* L (n x n lower, lda) -> (L L^T)^-1 into w (n x n, ld n, both triangles):
 * L^-1 in place (dtrti2, lower), then w = L^-T L^-1. Returns 0, or the
 * 1-based index of the first zero diagonal element (nothing computed). */
static int64_t LA_F(potri)(int64_t n, LA_T *a, int64_t lda, LA_T *w) {
    for (int64_t j = 0; j < n; j++)
        if (a[j + j * lda] == 0) return j + 1;
    for (int64_t j = n - 1; j >= 0; j--) {
        LA_T *cj = a + j * lda;
        cj[j] = 1 / cj[j];
        LA_T ajj = -cj[j];
        /* cj[j+1:n] := L^-1[j+1:n, j+1:n] cj[j+1:n] (dtrmv lower), then scaled by ajj */
        for (int64_t q = n - 1; q > j; q--) {
            if (cj[q] == 0) continue;
            LA_T t = cj[q];
            const LA_T *cq = a + q * lda;
            for (int64_t i = n - 1; i > q; i--) cj[i] += t * cq[i];
            cj[q] *= cq[q];
        }
        for (int64_t i = j + 1; i < n; i++) cj[i] *= ajj;
    }
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = j; i < n; i++) {
            LA_T s = 0;
            for (int64_t k = i; k < n; k++) s += a[k + i * lda] * a[k + j * lda];
            w[i + j * n] = s;
            w[j + i * n] = s;
        }
    return 0;
}

/* P A = L U of A (m x n, lda) in place (dgetf2): ipiv[j] (1-based) is the
 * row swapped with row j, the first of the largest |a| in column j at or
 * below the diagonal. Returns 0, or the 1-based index of the first zero
 * pivot (the factorization goes on, as LAPACK's). */
static int64_t LA_F(getrf)(int64_t m, int64_t n, LA_T *a, int64_t lda, int32_t *ipiv) {
    int64_t info = 0, k = m < n ? m : n;
    LA_T sfmin = sizeof(LA_T) == sizeof(float) ? (LA_T)FLT_MIN : (LA_T)DBL_MIN;
    for (int64_t j = 0; j < k; j++) {
        LA_T *cj = a + j * lda;
        int64_t p = j;
        LA_T big = (LA_T)fabs(cj[j]);
        for (int64_t i = j + 1; i < m; i++)
            if ((LA_T)fabs(cj[i]) > big) {
                big = (LA_T)fabs(cj[i]);
                p = i;
            }
        ipiv[j] = (int32_t)(p + 1);
        if (cj[p] != 0) {
            if (p != j)
                for (int64_t q = 0; q < n; q++) {
                    LA_T t = a[j + q * lda];
                    a[j + q * lda] = a[p + q * lda];
                    a[p + q * lda] = t;
                }
            if ((LA_T)fabs(cj[j]) >= sfmin) {
                LA_T r = 1 / cj[j];
                for (int64_t i = j + 1; i < m; i++) cj[i] *= r;
            } else {
                for (int64_t i = j + 1; i < m; i++) cj[i] /= cj[j];
            }
        } else if (info == 0) {
            info = j + 1;
        }
        /* rank-1 update of the trailing matrix, each element in one rounding
         * (fused multiply-add), as LAPACK over an FMA BLAS (MKL on AVX2 and
         * AVX-512 hosts) rounds it */
        for (int64_t q = j + 1; q < n; q++) {
            LA_T *cq = a + q * lda, t = -cq[j];
            for (int64_t i = j + 1; i < m; i++) cq[i] = LA_FMA(cj[i], t, cq[i]);
        }
    }
    return info;
}

/* B (n x nrhs, ldb) := A^-1 B (A^-T B if trans) from getrf's LU and ipiv (dgetrs). */
static void LA_F(getrs)(bool trans, int64_t n, int64_t nrhs, const LA_T *lu, int64_t lda, const int32_t *ipiv, LA_T *b,
                        int64_t ldb) {
    if (!trans) {
        for (int64_t j = 0; j < nrhs; j++)
            for (int64_t i = 0; i < n; i++) {
                int64_t p = ipiv[i] - 1;
                if (p == i) continue;
                LA_T t = b[i + j * ldb];
                b[i + j * ldb] = b[p + j * ldb];
                b[p + j * ldb] = t;
            }
        LA_F(trsm)(false, false, true, n, nrhs, lu, lda, b, ldb);
        LA_F(trsm)(true, false, false, n, nrhs, lu, lda, b, ldb);
    } else {
        LA_F(trsm)(true, true, false, n, nrhs, lu, lda, b, ldb);
        LA_F(trsm)(false, true, true, n, nrhs, lu, lda, b, ldb);
        for (int64_t j = 0; j < nrhs; j++)
            for (int64_t i = n - 1; i >= 0; i--) {
                int64_t p = ipiv[i] - 1;
                if (p == i) continue;
                LA_T t = b[i + j * ldb];
                b[i + j * ldb] = b[p + j * ldb];
                b[p + j * ldb] = t;
            }
    }
}

/* ---- Householder QR (dgeqr2, dorg2r, dorm2r) ----
 * H = I - tau v v^T with v[0] = 1, v[1:] below the diagonal of A's column. */

/* dlarfg: H (alpha, x) = (beta, 0), beta = -sign(alpha) * ||(alpha, x)||;
 * x (n - 1, stride 1) becomes v[1:]. Returns tau (0: H = I). */
static LA_T LA_F(larfg)(int64_t n, LA_T *alpha, LA_T *x) {
    if (n <= 1) return 0;
    LA_T scale = 0, ssq = 1; /* dnrm2 of x, scaled */
    for (int64_t i = 0; i < n - 1; i++)
        if (x[i] != 0) {
            LA_T ax = (LA_T)fabs(x[i]);
            if (scale < ax) {
                ssq = 1 + ssq * (scale / ax) * (scale / ax);
                scale = ax;
            } else {
                ssq += (ax / scale) * (ax / scale);
            }
        }
    LA_T xnorm = scale * (LA_T)sqrt(ssq);
    if (xnorm == 0) return 0;
    LA_T beta = (LA_T)hypot(*alpha, xnorm);
    if (*alpha >= 0) beta = -beta;
    LA_T tau = (beta - *alpha) / beta, r = 1 / (*alpha - beta);
    for (int64_t i = 0; i < n - 1; i++) x[i] *= r;
    *alpha = beta;
    return tau;
}

/* dlarf: C (m x n, ldc) := H C (left) or C H, v (stride 1, v[0] used as is). */
static void LA_F(larf)(bool left, int64_t m, int64_t n, const LA_T *v, LA_T tau, LA_T *c, int64_t ldc) {
    if (tau == 0) return;
    if (left) {
        for (int64_t j = 0; j < n; j++) {
            LA_T *cj = c + j * ldc, w = 0;
            for (int64_t i = 0; i < m; i++) w += cj[i] * v[i];
            w *= -tau;
            for (int64_t i = 0; i < m; i++) cj[i] += v[i] * w;
        }
    } else {
        for (int64_t i = 0; i < m; i++) {
            LA_T w = 0;
            for (int64_t j = 0; j < n; j++) w += c[i + j * ldc] * v[j];
            w *= -tau;
            for (int64_t j = 0; j < n; j++) c[i + j * ldc] += w * v[j];
        }
    }
}

/* A (m x n, lda) = Q R in place: R on and above the diagonal, the reflectors below; tau[min(m, n)]. */
static void LA_F(geqrf)(int64_t m, int64_t n, LA_T *a, int64_t lda, LA_T *tau) {
    int64_t k = m < n ? m : n;
    for (int64_t i = 0; i < k; i++) {
        LA_T *ci = a + i * lda;
        tau[i] = LA_F(larfg)(m - i, &ci[i], ci + i + 1);
        if (i < n - 1) {
            LA_T aii = ci[i];
            ci[i] = 1;
            LA_F(larf)(true, m - i, n - i - 1, ci + i, tau[i], a + i + (i + 1) * lda, lda);
            ci[i] = aii;
        }
    }
}

/* A (m x n, lda; the first k columns hold reflectors) := the first n columns of H_0 .. H_{k-1}. */
static void LA_F(orgqr)(int64_t m, int64_t n, int64_t k, LA_T *a, int64_t lda, const LA_T *tau) {
    for (int64_t j = k; j < n; j++) {
        for (int64_t i = 0; i < m; i++) a[i + j * lda] = 0;
        if (j < m) a[j + j * lda] = 1;
    }
    for (int64_t i = k - 1; i >= 0; i--) {
        LA_T *ci = a + i * lda;
        if (i < n - 1) {
            ci[i] = 1;
            LA_F(larf)(true, m - i, n - i - 1, ci + i, tau[i], a + i + (i + 1) * lda, lda);
        }
        for (int64_t l = i + 1; l < m; l++) ci[l] *= -tau[i];
        ci[i] = 1 - tau[i];
        for (int64_t l = 0; l < i; l++) ci[l] = 0;
    }
}

/* C (m x n, ldc) := op(Q) C (left) or C op(Q), Q = H_0 .. H_{k-1} from the reflectors in a (lda). */
static void LA_F(ormqr)(bool left, bool trans, int64_t m, int64_t n, int64_t k, LA_T *a, int64_t lda, const LA_T *tau,
                        LA_T *c, int64_t ldc) {
    bool fwd = left == trans; /* H_0 first */
    for (int64_t s = 0; s < k; s++) {
        int64_t i = fwd ? s : k - 1 - s;
        LA_T *ci = a + i * lda, aii = ci[i];
        ci[i] = 1;
        if (left)
            LA_F(larf)(true, m - i, n, ci + i, tau[i], c + i, ldc);
        else
            LA_F(larf)(false, m, n - i, ci + i, tau[i], c + i * ldc, ldc);
        ci[i] = aii;
    }
}

/* ---- Jacobi: symmetric eigenproblem (two-sided) and SVD (one-sided, Hestenes) ----
 * Rotations are applied until the off-diagonal part (the columns' inner
 * products) is below the dtype's epsilon relative to the matrix's norm: as
 * accurate as LAPACK's QR-based drivers, simpler, O(n^3) per sweep. */
#define LA_EPS (sizeof(LA_T) == sizeof(float) ? (LA_T)FLT_EPSILON : (LA_T)DBL_EPSILON)

static bool LA_F(finite)(int64_t r, int64_t c, const LA_T *a, int64_t lda) {
    for (int64_t j = 0; j < c; j++)
        for (int64_t i = 0; i < r; i++)
            if (!isfinite(a[i + j * lda])) return false;
    return true;
}

/* a (n x n, lda, symmetric: both triangles) is destroyed; w[n] ascending and, if v, the eigenvectors in v's
 * columns (ld n). Returns false if it did not converge (w, v then hold NaN). */
static bool LA_F(syev)(int64_t n, LA_T *a, int64_t lda, LA_T *w, LA_T *v) {
    bool ok = LA_F(finite)(n, n, a, lda);
    if (v)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < n; i++) v[i + j * n] = i == j;
    for (int sweep = 0; ok && sweep < 60; sweep++) {
        LA_T off = 0, nrm = 0;
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < n; i++) {
                LA_T x = a[i + j * lda] * a[i + j * lda];
                nrm += x;
                if (i != j) off += x;
            }
        if (!(off > LA_EPS * LA_EPS * nrm * (LA_T)0.01)) break;
        if (sweep == 59) ok = false;
        for (int64_t p = 0; p < n - 1; p++)
            for (int64_t q = p + 1; q < n; q++) {
                LA_T apq = a[p + q * lda];
                if (apq == 0) continue;
                LA_T theta = (a[q + q * lda] - a[p + p * lda]) / (2 * apq);
                LA_T t = (theta >= 0 ? 1 : -1) / ((LA_T)fabs(theta) + (LA_T)hypot(theta, 1));
                LA_T c = 1 / (LA_T)hypot(t, 1), s = t * c;
                LA_T *cp = a + p * lda, *cq = a + q * lda;
                for (int64_t k = 0; k < n; k++) { /* A J */
                    LA_T x = cp[k], y = cq[k];
                    cp[k] = c * x - s * y;
                    cq[k] = s * x + c * y;
                }
                for (int64_t k = 0; k < n; k++) { /* J^T (A J) */
                    LA_T x = a[p + k * lda], y = a[q + k * lda];
                    a[p + k * lda] = c * x - s * y;
                    a[q + k * lda] = s * x + c * y;
                }
                a[p + q * lda] = a[q + p * lda] = 0;
                if (v) {
                    LA_T *vp = v + p * n, *vq = v + q * n;
                    for (int64_t k = 0; k < n; k++) {
                        LA_T x = vp[k], y = vq[k];
                        vp[k] = c * x - s * y;
                        vq[k] = s * x + c * y;
                    }
                }
            }
    }
    for (int64_t i = 0; i < n; i++) w[i] = ok ? a[i + i * lda] : (LA_T)NAN;
    for (int64_t i = 0; i < n; i++) { /* ascending (selection sort: stable enough, n small) */
        int64_t b = i;
        for (int64_t j = i + 1; j < n; j++)
            if (w[j] < w[b]) b = j;
        if (b == i) continue;
        LA_T t = w[i];
        w[i] = w[b];
        w[b] = t;
        if (v)
            for (int64_t k = 0; k < n; k++) {
                LA_T x = v[k + i * n];
                v[k + i * n] = v[k + b * n];
                v[k + b * n] = x;
            }
    }
    if (v && !ok)
        for (int64_t i = 0; i < n * n; i++) v[i] = (LA_T)NAN;
    return ok;
}

/* Columns [r, c) of q (p x c, ld p) made orthonormal to the ones before: each the standard basis vector
 * with the largest part outside their span, orthogonalized twice (classical Gram-Schmidt) and normalized. */
static void LA_F(complete)(int64_t p, int64_t c, int64_t r, LA_T *q, LA_T *x) {
    for (int64_t j = r; j < c; j++) {
        int64_t best = 0;
        LA_T bres = -1;
        for (int64_t e = 0; e < p; e++) { /* |e - Q Q^T e|^2 = 1 - sum_k q[e, k]^2 */
            LA_T res = 1;
            for (int64_t k = 0; k < j; k++) res -= q[e + k * p] * q[e + k * p];
            if (res > bres) {
                bres = res;
                best = e;
            }
        }
        for (int64_t i = 0; i < p; i++) x[i] = i == best;
        for (int pass = 0; pass < 2; pass++)
            for (int64_t k = 0; k < j; k++) {
                LA_T d = 0;
                for (int64_t i = 0; i < p; i++) d += q[i + k * p] * x[i];
                for (int64_t i = 0; i < p; i++) x[i] -= d * q[i + k * p];
            }
        LA_T nrm = 0;
        for (int64_t i = 0; i < p; i++) nrm += x[i] * x[i];
        nrm = (LA_T)sqrt(nrm);
        for (int64_t i = 0; i < p; i++) q[i + j * p] = x[i] / nrm;
    }
}

/* g (p x q, ld p, p >= q) = U diag(s) V^T: on return g holds U's first q columns (orthonormal; columns of
 * zero singular values completed), s[q] descending, v (q x q, ld q; if not NULL) V. x: p scratch elements.
 * Returns false for non-finite input (s, g, v then NaN). */
static bool LA_F(gesvj)(int64_t p, int64_t q, LA_T *g, LA_T *s, LA_T *v, LA_T *x) {
    bool ok = LA_F(finite)(p, q, g, p);
    if (v)
        for (int64_t j = 0; j < q; j++)
            for (int64_t i = 0; i < q; i++) v[i + j * q] = i == j;
    for (int sweep = 0; ok && sweep < 60; sweep++) {
        bool rotated = false;
        for (int64_t i = 0; i < q - 1; i++)
            for (int64_t j = i + 1; j < q; j++) {
                LA_T *gi = g + i * p, *gj = g + j * p, al = 0, be = 0, ga = 0;
                for (int64_t k = 0; k < p; k++) {
                    al += gi[k] * gi[k];
                    be += gj[k] * gj[k];
                    ga += gi[k] * gj[k];
                }
                if (ga == 0 || (LA_T)fabs(ga) <= LA_EPS * (LA_T)sqrt(al) * (LA_T)sqrt(be)) continue;
                rotated = true;
                LA_T zeta = (be - al) / (2 * ga);
                LA_T t = (zeta >= 0 ? 1 : -1) / ((LA_T)fabs(zeta) + (LA_T)hypot(zeta, 1));
                LA_T c = 1 / (LA_T)hypot(t, 1), sn = t * c;
                for (int64_t k = 0; k < p; k++) {
                    LA_T a = gi[k], b = gj[k];
                    gi[k] = c * a - sn * b;
                    gj[k] = sn * a + c * b;
                }
                if (v) {
                    LA_T *vi = v + i * q, *vj = v + j * q;
                    for (int64_t k = 0; k < q; k++) {
                        LA_T a = vi[k], b = vj[k];
                        vi[k] = c * a - sn * b;
                        vj[k] = sn * a + c * b;
                    }
                }
            }
        if (!rotated) break;
    }
    if (!ok) {
        for (int64_t i = 0; i < q; i++) s[i] = (LA_T)NAN;
        for (int64_t i = 0; i < p * q; i++) g[i] = (LA_T)NAN;
        if (v)
            for (int64_t i = 0; i < q * q; i++) v[i] = (LA_T)NAN;
        return false;
    }
    for (int64_t i = 0; i < q; i++) {
        LA_T nrm = 0;
        for (int64_t k = 0; k < p; k++) nrm += g[k + i * p] * g[k + i * p];
        s[i] = (LA_T)sqrt(nrm);
    }
    for (int64_t i = 0; i < q; i++) { /* descending */
        int64_t b = i;
        for (int64_t j = i + 1; j < q; j++)
            if (s[j] > s[b]) b = j;
        if (b == i) continue;
        LA_T t = s[i];
        s[i] = s[b];
        s[b] = t;
        for (int64_t k = 0; k < p; k++) {
            t = g[k + i * p];
            g[k + i * p] = g[k + b * p];
            g[k + b * p] = t;
        }
        if (v)
            for (int64_t k = 0; k < q; k++) {
                t = v[k + i * q];
                v[k + i * q] = v[k + b * q];
                v[k + b * q] = t;
            }
    }
    int64_t r = 0; /* columns with a singular value clear of zero give U's columns; the rest are completed */
    LA_T tiny = (LA_T)p * LA_EPS * (q > 0 ? s[0] : 0);
    while (r < q && s[r] > tiny && s[r] > 0) {
        for (int64_t k = 0; k < p; k++) g[k + r * p] /= s[r];
        r++;
    }
    LA_F(complete)(p, q, r, g, x);
    return true;
}
