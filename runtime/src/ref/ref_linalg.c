/* ref_linalg.c - the linear algebra ops' operand checks (shared with the fast
 * kernels, kernels/linalg.c) and their reference kernels: textbook
 * substitution, Cholesky-Crout, Doolittle with partial pivoting, in double,
 * element by element on the strided operands. The oracle the fast kernels
 * are tested against (tests/c/test_kernels_linalg.c). */
#include "ref/ref-impl.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t tpu_linalg_batch_off(const tpu_tensor *t, int nb, int64_t b) {
    int64_t off = t->offset;
    for (int d = nb - 1; d >= 0; d--) {
        off += (b % t->sizes[d]) * t->strides[d];
        b /= t->sizes[d];
    }
    return off;
}

/* t has `nd` dims whose first nb are the batch sizes of ref (t[0]). */
static bool la_batch_ok(const tpu_tensor *t, int nd, const tpu_tensor *ref, int nb) {
    if (t->is_scalar || t->ndim != nd) return false;
    for (int d = 0; d < nb; d++)
        if (t->sizes[d] != ref->sizes[d]) return false;
    return true;
}

tpu_status tpu_linalg_check(tpu_kargs *a, tpu_linalg_dims *d) {
    const char *name = tpu_op_name(a->op);
    const tpu_tensor *t0 = &a->t[0];
    int nd = t0->ndim, nb = a->op == TPU_OP_LU_PERM || a->op == TPU_OP_GESVD ? nd - 1 : nd - 2;
    if (t0->is_scalar || nb < 0) return tpu_kernel_fail(a, "%s: output 0 has %d dims", name, nd);
    memset(d, 0, sizeof *d);
    d->nb = nb;
    d->batch = 1;
    for (int q = 0; q < nb; q++) d->batch *= t0->sizes[q];
    d->m = t0->sizes[nb];
    d->n = a->op == TPU_OP_LU_PERM ? 0 : t0->sizes[nb + 1];
    if (a->op == TPU_OP_GESVD) { /* sizes from A */
        if (a->n < 5 || la_batch_ok(&a->t[4], nb + 2, t0, nb) == false)
            return tpu_kernel_fail(a, "%s: operands of mismatched shapes or dtypes", name);
        d->m = a->t[4].sizes[nb];
        d->n = a->t[4].sizes[nb + 1];
    }
    if (d->m > INT32_MAX || d->n > INT32_MAX) return tpu_kernel_fail(a, "%s: matrices too large", name);
    bool flt = a->op != TPU_OP_LU_PERM;
    if (flt && t0->dtype != TPU_F32 && t0->dtype != TPU_F64)
        return tpu_kernel_fail(a, "%s: float32 or float64 matrices", name);
    const tpu_tensor *m = a->n > 1 ? &a->t[1] : NULL, *k = a->n > 2 ? &a->t[2] : NULL;
    bool ok = true;
    switch (a->op) {
    case TPU_OP_TRSM: { /* B (m x n), A square of B's rows (left) or columns */
        int64_t o = a->p.i[0] ? d->m : d->n;
        ok = la_batch_ok(m, nd, t0, nb) && m->dtype == t0->dtype && m->sizes[nb] == o && m->sizes[nb + 1] == o;
        break;
    }
    case TPU_OP_POTRF:
    case TPU_OP_POTRI: ok = d->m == d->n && la_batch_ok(m, nb, t0, nb) && m->dtype == TPU_I32; break;
    case TPU_OP_GETRF:
        ok = la_batch_ok(m, nb + 1, t0, nb) && m->dtype == TPU_I32 && m->sizes[nb] == (d->m < d->n ? d->m : d->n) &&
             la_batch_ok(k, nb, t0, nb) && k->dtype == TPU_I32;
        break;
    case TPU_OP_GETRS: /* B (n x nrhs), LU (n x n), pivots [n] */
        ok = la_batch_ok(m, nd, t0, nb) && m->dtype == t0->dtype && m->sizes[nb] == d->m && m->sizes[nb + 1] == d->m &&
             la_batch_ok(k, nb + 1, t0, nb) && k->dtype == TPU_I32 && k->sizes[nb] == d->m;
        break;
    case TPU_OP_LU_PERM: /* perm [m] int64, pivots [k <= m] int32 */
        ok = t0->dtype == TPU_I64 && la_batch_ok(m, nd, t0, nb) && m->dtype == TPU_I32 && m->sizes[nb] <= d->m;
        if (ok) d->n = m->sizes[nb];
        break;
    case TPU_OP_GEQRF: /* A (m x n), tau [min(m, n)] */
        ok = la_batch_ok(m, nb + 1, t0, nb) && m->dtype == t0->dtype && m->sizes[nb] == (d->m < d->n ? d->m : d->n);
        break;
    case TPU_OP_ORGQR: /* A (m x n, n <= m), tau [k <= n] */
        ok = d->n <= d->m && la_batch_ok(m, nb + 1, t0, nb) && m->dtype == t0->dtype && m->sizes[nb] <= d->n;
        break;
    case TPU_OP_ORMQR: { /* C (m x n), reflectors (m or n rows x c), tau [k <= min(rows, c)] */
        int64_t r = a->p.i[0] ? d->m : d->n;
        ok = la_batch_ok(m, nd, t0, nb) && m->dtype == t0->dtype && m->sizes[nb] == r &&
             la_batch_ok(k, nb + 1, t0, nb) && k->dtype == t0->dtype && k->sizes[nb] <= m->sizes[nb + 1] &&
             k->sizes[nb] <= r;
        break;
    }
    case TPU_OP_SYEV: /* A (n x n), w [n], info */
        ok = d->m == d->n && la_batch_ok(m, nb + 1, t0, nb) && m->dtype == t0->dtype && m->sizes[nb] == d->m &&
             la_batch_ok(k, nb, t0, nb) && k->dtype == TPU_I32;
        break;
    case TPU_OP_GESVD: { /* S [min(m, n)], U m x (k or m), Vh (k or n) x n (both or neither absent), info; A */
        const tpu_tensor *u = &a->t[1], *vh = &a->t[2], *info = &a->t[3], *A = &a->t[4];
        int64_t mn = d->m < d->n ? d->m : d->n;
        ok = A->dtype == t0->dtype && t0->sizes[nb] == mn && la_batch_ok(info, nb, t0, nb) && info->dtype == TPU_I32 &&
             u->is_scalar == vh->is_scalar;
        if (ok && !u->is_scalar)
            ok = la_batch_ok(u, nd + 1, t0, nb) && la_batch_ok(vh, nd + 1, t0, nb) && u->dtype == t0->dtype &&
                 vh->dtype == t0->dtype && u->sizes[nb] == d->m && vh->sizes[nb + 1] == d->n &&
                 ((u->sizes[nb + 1] == mn && vh->sizes[nb] == mn) || /* reduced, or full matrices */
                  (u->sizes[nb + 1] == d->m && vh->sizes[nb] == d->n));
        break;
    }
    default: ok = false;
    }
    if (!ok) return tpu_kernel_fail(a, "%s: operands of mismatched shapes or dtypes", name);
    return TPU_OK;
}

int64_t tpu_linalg_syev_failure(int64_t n, bool vectors) {
    /* measured: syevd on a NaN-holding matrix; n <= 2 gives NaN eigenvalues without an error */
    if (n <= 2) return 0;
    return vectors ? n - 1 : n - 2;
}

tpu_status tpu_linalg_bad_pivot(tpu_kargs *a, const tpu_linalg_dims *d, int64_t batch, int64_t value) {
    int64_t hi = d->m;
    return tpu_kernel_fail(a,
                           "%s: pivots must be between 1 and %lld inclusive (the pivots of torch.linalg.lu_factor); "
                           "got pivot %lld in matrix %lld",
                           tpu_op_name(a->op), (long long)hi, (long long)value, (long long)batch);
}

/* ---- element access: matrix at element offset off, (i, j) ---- */
static double rl_get(const tpu_tensor *t, int64_t off, int64_t i, int64_t j) {
    int64_t e = off + i * t->strides[t->ndim - 2] + j * t->strides[t->ndim - 1];
    return tpu_load_f64((const char *)t->base + (size_t)e * tpu_dtype_size((tpu_dtype)t->dtype), (tpu_dtype)t->dtype);
}

static void rl_set(const tpu_tensor *t, int64_t off, int64_t i, int64_t j, double v) {
    int64_t e = off + i * t->strides[t->ndim - 2] + j * t->strides[t->ndim - 1];
    tpu_store_f64((char *)t->base + (size_t)e * tpu_dtype_size((tpu_dtype)t->dtype), (tpu_dtype)t->dtype, v);
}

static int64_t rl_geti(const tpu_tensor *t, int64_t off, int64_t i) {
    int64_t e = off + i * t->strides[t->ndim - 1];
    return tpu_load_i64((const char *)t->base + (size_t)e * tpu_dtype_size((tpu_dtype)t->dtype), (tpu_dtype)t->dtype);
}

static void rl_seti(const tpu_tensor *t, int64_t off, int64_t i, int64_t v) {
    int64_t e = off + i * t->strides[t->ndim - 1];
    tpu_store_i64((char *)t->base + (size_t)e * tpu_dtype_size((tpu_dtype)t->dtype), (tpu_dtype)t->dtype, v);
}

static void rl_setv(const tpu_tensor *t, int64_t off, int64_t i, double v) { /* element i of a vector */
    int64_t e = off + i * t->strides[t->ndim - 1];
    tpu_store_f64((char *)t->base + (size_t)e * tpu_dtype_size((tpu_dtype)t->dtype), (tpu_dtype)t->dtype, v);
}

/* Solve G x = x in place for triangular G (n x n, row-major g), lower or upper. */
static void rl_subst(const double *g, int64_t n, bool lower, bool unit, double *x) {
    for (int64_t s = 0; s < n; s++) {
        int64_t i = lower ? s : n - 1 - s;
        double v = x[i];
        if (lower)
            for (int64_t k = 0; k < i; k++) v -= g[i * n + k] * x[k];
        else
            for (int64_t k = i + 1; k < n; k++) v -= g[i * n + k] * x[k];
        x[i] = unit ? v : v / g[i * n + i];
    }
}

/* Solve op(A) X = B (left) or X op(A) = B, column by column (row by row). */
static void ref_trsm(tpu_kargs *a, const tpu_linalg_dims *d, int64_t b, double *g, double *x) {
    const tpu_tensor *B = &a->t[0], *A = &a->t[1];
    tpu_args_TRSM q = tpu_unpack_TRSM(&a->p);
    int64_t bo = tpu_linalg_batch_off(B, d->nb, b), ao = tpu_linalg_batch_off(A, d->nb, b);
    int64_t k = q.left ? d->m : d->n, nv = q.left ? d->n : d->m;
    /* G = op(A) (left), op(A)^T (right): the matrix each column of B (row of B) is solved with */
    bool tr = (q.trans != 0) != !q.left;
    for (int64_t i = 0; i < k; i++)
        for (int64_t j = 0; j < k; j++) g[i * k + j] = tr ? rl_get(A, ao, j, i) : rl_get(A, ao, i, j);
    bool lower = (q.upper != 0) == tr;
    for (int64_t v = 0; v < nv; v++) {
        for (int64_t i = 0; i < k; i++) x[i] = q.left ? rl_get(B, bo, i, v) : rl_get(B, bo, v, i);
        rl_subst(g, k, lower, q.unit != 0, x);
        for (int64_t i = 0; i < k; i++) q.left ? rl_set(B, bo, i, v, x[i]) : rl_set(B, bo, v, i, x[i]);
    }
}

/* L (row-major, n x n) of A's lower triangle (upper: of its transpose). */
static void rl_lower(const tpu_tensor *A, int64_t ao, int64_t n, bool up, double *l) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) l[i * n + j] = j > i ? 0 : (up ? rl_get(A, ao, j, i) : rl_get(A, ao, i, j));
}

static void ref_potrf(tpu_kargs *a, const tpu_linalg_dims *d, int64_t b, double *l, double *x) {
    const tpu_tensor *A = &a->t[0], *info = &a->t[1];
    bool up = a->p.i[0] != 0;
    int64_t n = d->m, ao = tpu_linalg_batch_off(A, d->nb, b), v = 0;
    rl_lower(A, ao, n, up, l);
    for (int64_t j = 0; j < n && !v; j++) {
        double s = l[j * n + j];
        for (int64_t k = 0; k < j; k++) s -= l[j * n + k] * l[j * n + k];
        if (!(s > 0)) {
            v = j + 1;
            break;
        }
        l[j * n + j] = sqrt(s);
        for (int64_t i = j + 1; i < n; i++) {
            double t = l[i * n + j];
            for (int64_t k = 0; k < j; k++) t -= l[i * n + k] * l[j * n + k];
            l[i * n + j] = t / l[j * n + j];
        }
    }
    if (!v)
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j <= i; j++) up ? rl_set(A, ao, j, i, l[i * n + j]) : rl_set(A, ao, i, j, l[i * n + j]);
    (void)x;
    tpu_store_i64((int32_t *)info->base + tpu_linalg_batch_off(info, d->nb, b), TPU_I32, v);
}

/* (L L^T)^-1 column by column: L y = e_c, L^T x = y. */
static void ref_potri(tpu_kargs *a, const tpu_linalg_dims *d, int64_t b, double *l, double *x) {
    const tpu_tensor *A = &a->t[0], *info = &a->t[1];
    bool up = a->p.i[0] != 0;
    int64_t n = d->m, ao = tpu_linalg_batch_off(A, d->nb, b), v = 0;
    rl_lower(A, ao, n, up, l);
    for (int64_t j = 0; j < n && !v; j++)
        if (l[j * n + j] == 0) v = j + 1;
    double *lt = x + n;
    for (int64_t i = 0; i < n && !v; i++)
        for (int64_t j = 0; j < n; j++) lt[i * n + j] = l[j * n + i];
    for (int64_t c = 0; c < n && !v; c++) {
        for (int64_t i = 0; i < n; i++) x[i] = i == c;
        rl_subst(l, n, true, false, x);
        rl_subst(lt, n, false, false, x);
        for (int64_t i = 0; i < n; i++) rl_set(A, ao, i, c, x[i]);
    }
    tpu_store_i64((int32_t *)info->base + tpu_linalg_batch_off(info, d->nb, b), TPU_I32, v);
}

static void ref_getrf(tpu_kargs *a, const tpu_linalg_dims *d, int64_t b, double *w, double *x) {
    const tpu_tensor *A = &a->t[0], *piv = &a->t[1], *info = &a->t[2];
    int64_t m = d->m, n = d->n, k = m < n ? m : n, v = 0, ao = tpu_linalg_batch_off(A, d->nb, b);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) w[i * n + j] = rl_get(A, ao, i, j);
    int64_t po = tpu_linalg_batch_off(piv, d->nb, b);
    for (int64_t j = 0; j < k; j++) {
        int64_t p = j;
        for (int64_t i = j + 1; i < m; i++)
            if (fabs(w[i * n + j]) > fabs(w[p * n + j])) p = i;
        rl_seti(piv, po, j, p + 1);
        if (w[p * n + j] == 0) {
            if (!v) v = j + 1;
            continue;
        }
        for (int64_t q = 0; q < n; q++) {
            double t = w[j * n + q];
            w[j * n + q] = w[p * n + q];
            w[p * n + q] = t;
        }
        for (int64_t i = j + 1; i < m; i++) {
            w[i * n + j] /= w[j * n + j];
            for (int64_t q = j + 1; q < n; q++) w[i * n + q] -= w[i * n + j] * w[j * n + q];
        }
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) rl_set(A, ao, i, j, w[i * n + j]);
    (void)x;
    tpu_store_i64((int32_t *)info->base + tpu_linalg_batch_off(info, d->nb, b), TPU_I32, v);
}

/* A = P L U: A x = b is L U x = P^T b; A^T x = b is U^T L^T (P^T x) = b. */
static bool ref_getrs(tpu_kargs *a, const tpu_linalg_dims *d, int64_t b, double *w, double *x, int64_t *bad) {
    const tpu_tensor *B = &a->t[0], *LU = &a->t[1], *piv = &a->t[2];
    bool tr = a->p.i[0] != 0;
    int64_t n = d->m, lo = tpu_linalg_batch_off(LU, d->nb, b), bo = tpu_linalg_batch_off(B, d->nb, b);
    int64_t po = tpu_linalg_batch_off(piv, d->nb, b);
    for (int64_t i = 0; i < n; i++) {
        int64_t p = rl_geti(piv, po, i);
        if (p < 1 || p > n) {
            *bad = p;
            return false;
        }
    }
    double *l = w, *u = w + n * n; /* row-major L (unit) and U, or their transposes */
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            double e = rl_get(LU, lo, i, j), lij = i == j ? 1 : (j < i ? e : 0), uij = j >= i ? e : 0;
            if (tr) {
                l[j * n + i] = lij;
                u[j * n + i] = uij;
            } else {
                l[i * n + j] = lij;
                u[i * n + j] = uij;
            }
        }
    for (int64_t c = 0; c < d->n; c++) {
        for (int64_t i = 0; i < n; i++) x[i] = rl_get(B, bo, i, c);
        if (!tr) {
            for (int64_t i = 0; i < n; i++) {
                int64_t p = rl_geti(piv, po, i) - 1;
                double t = x[i];
                x[i] = x[p];
                x[p] = t;
            }
            rl_subst(l, n, true, true, x);
            rl_subst(u, n, false, false, x);
        } else {
            rl_subst(u, n, true, false, x);
            rl_subst(l, n, false, true, x);
            for (int64_t i = n - 1; i >= 0; i--) {
                int64_t p = rl_geti(piv, po, i) - 1;
                double t = x[i];
                x[i] = x[p];
                x[p] = t;
            }
        }
        for (int64_t i = 0; i < n; i++) rl_set(B, bo, i, c, x[i]);
    }
    return true;
}

static bool ref_perm(tpu_kargs *a, const tpu_linalg_dims *d, int64_t b, int64_t *bad) {
    const tpu_tensor *perm = &a->t[0], *piv = &a->t[1];
    int64_t po = tpu_linalg_batch_off(perm, d->nb, b), vo = tpu_linalg_batch_off(piv, d->nb, b);
    for (int64_t i = 0; i < d->n; i++) {
        int64_t j = rl_geti(piv, vo, i);
        if (j < 1 || j > d->m) {
            *bad = j;
            return false;
        }
        int64_t t = rl_geti(perm, po, i);
        rl_seti(perm, po, i, rl_geti(perm, po, j - 1));
        rl_seti(perm, po, j - 1, t);
    }
    return true;
}

/* ---- Householder QR: H_i = I - tau_i v_i v_i^T, v_i = (0.., 1, A[i+1:, i]) ---- */
static void rl_reflect(const double *v, double tau, double *x, int64_t n) { /* x := H x, v and x of length n */
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i] * x[i];
    for (int64_t i = 0; i < n; i++) x[i] -= tau * s * v[i];
}

static double rl_tau(const tpu_tensor *t, int64_t off, int64_t i) {
    int64_t e = off + i * t->strides[t->ndim - 1];
    return tpu_load_f64((const char *)t->base + (size_t)e * tpu_dtype_size((tpu_dtype)t->dtype), (tpu_dtype)t->dtype);
}

/* Column by column: v from the column's norm (beta = -sign(alpha) ||x||), then H applied to the columns right of it. */
static void ref_geqrf(tpu_kargs *a, const tpu_linalg_dims *d, int64_t b, double *w, double *v) {
    const tpu_tensor *A = &a->t[0], *tau = &a->t[1];
    int64_t m = d->m, n = d->n, k = m < n ? m : n, ao = tpu_linalg_batch_off(A, d->nb, b);
    int64_t to = tpu_linalg_batch_off(tau, d->nb, b);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) w[i * n + j] = rl_get(A, ao, i, j);
    for (int64_t i = 0; i < k; i++) {
        double alpha = w[i * n + i], xn = 0, t = 0;
        for (int64_t r = i + 1; r < m; r++) xn += w[r * n + i] * w[r * n + i];
        for (int64_t r = 0; r < m; r++) v[r] = r < i ? 0 : (r == i ? 1 : 0);
        if (xn > 0) {
            double beta = sqrt(alpha * alpha + xn);
            if (alpha >= 0) beta = -beta;
            t = (beta - alpha) / beta;
            for (int64_t r = i + 1; r < m; r++) v[r] = w[r * n + i] / (alpha - beta);
            w[i * n + i] = beta;
            for (int64_t r = i + 1; r < m; r++) w[r * n + i] = v[r];
        }
        for (int64_t j = i + 1; j < n; j++) {
            double s = 0;
            for (int64_t r = i; r < m; r++) s += v[r] * w[r * n + j];
            for (int64_t r = i; r < m; r++) w[r * n + j] -= t * s * v[r];
        }
        rl_setv(tau, to, i, t);
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) rl_set(A, ao, i, j, w[i * n + j]);
}

/* The reflectors of A (rows r, columns c) as rows of v (k x r). */
static void rl_reflectors(const tpu_tensor *A, int64_t ao, int64_t r, int64_t k, double *v) {
    for (int64_t i = 0; i < k; i++)
        for (int64_t q = 0; q < r; q++) v[i * r + q] = q < i ? 0 : (q == i ? 1 : rl_get(A, ao, q, i));
}

/* Q[:, j] = H_0 .. H_{k-1} e_j. */
static void ref_orgqr(tpu_kargs *a, const tpu_linalg_dims *d, int64_t b, double *v, double *x) {
    const tpu_tensor *A = &a->t[0], *tau = &a->t[1];
    int64_t m = d->m, n = d->n, k = tau->sizes[tau->ndim - 1], ao = tpu_linalg_batch_off(A, d->nb, b);
    int64_t to = tpu_linalg_batch_off(tau, d->nb, b);
    rl_reflectors(A, ao, m, k, v);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t q = 0; q < m; q++) x[q] = q == j;
        for (int64_t i = k - 1; i >= 0; i--) rl_reflect(v + i * m, rl_tau(tau, to, i), x, m);
        for (int64_t q = 0; q < m; q++) rl_set(A, ao, q, j, x[q]);
    }
}

/* op(Q) C column by column (left) or (C op(Q))^T = op(Q)^T C^T row by row. */
static void ref_ormqr(tpu_kargs *a, const tpu_linalg_dims *d, int64_t b, double *v, double *x) {
    const tpu_tensor *C = &a->t[0], *A = &a->t[1], *tau = &a->t[2];
    tpu_args_ORMQR q = tpu_unpack_ORMQR(&a->p);
    int64_t r = q.left ? d->m : d->n, nv = q.left ? d->n : d->m, k = tau->sizes[tau->ndim - 1];
    int64_t ao = tpu_linalg_batch_off(A, d->nb, b), co = tpu_linalg_batch_off(C, d->nb, b);
    int64_t to = tpu_linalg_batch_off(tau, d->nb, b);
    rl_reflectors(A, ao, r, k, v);
    bool fwd = (q.left != 0) == (q.trans != 0); /* op(Q) (or op(Q)^T) applies H_0 first */
    for (int64_t c = 0; c < nv; c++) {
        for (int64_t i = 0; i < r; i++) x[i] = q.left ? rl_get(C, co, i, c) : rl_get(C, co, c, i);
        for (int64_t s = 0; s < k; s++) {
            int64_t i = fwd ? s : k - 1 - s;
            rl_reflect(v + i * r, rl_tau(tau, to, i), x, r);
        }
        for (int64_t i = 0; i < r; i++) q.left ? rl_set(C, co, i, c, x[i]) : rl_set(C, co, c, i, x[i]);
    }
}

/* ---- eigh and SVD: Jacobi on a row-major double copy (eigh); SVD from the eigen-decomposition of G^T G ---- */
static bool rl_finite(const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

/* Textbook cyclic Jacobi: s (n x n row-major symmetric) -> w ascending, v's columns (row-major n x n). */
static void rl_jacobi(double *s, int64_t n, double *w, double *v) {
    for (int64_t i = 0; i < n * n; i++) v[i] = i % (n + 1) == 0;
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0, nrm = 0;
        for (int64_t i = 0; i < n * n; i++) {
            nrm += s[i] * s[i];
            if (i % (n + 1)) off += s[i] * s[i];
        }
        if (!(off > 1e-34 * nrm)) break;
        for (int64_t p = 0; p < n; p++)
            for (int64_t q = p + 1; q < n; q++) {
                if (s[p * n + q] == 0) continue;
                double th = (s[q * n + q] - s[p * n + p]) / (2 * s[p * n + q]);
                double t = (th >= 0 ? 1 : -1) / (fabs(th) + sqrt(th * th + 1)), c = 1 / sqrt(t * t + 1), sn = t * c;
                for (int64_t k = 0; k < n; k++) {
                    double x = s[k * n + p], y = s[k * n + q];
                    s[k * n + p] = c * x - sn * y;
                    s[k * n + q] = sn * x + c * y;
                }
                for (int64_t k = 0; k < n; k++) {
                    double x = s[p * n + k], y = s[q * n + k];
                    s[p * n + k] = c * x - sn * y;
                    s[q * n + k] = sn * x + c * y;
                    x = v[k * n + p];
                    y = v[k * n + q];
                    v[k * n + p] = c * x - sn * y;
                    v[k * n + q] = sn * x + c * y;
                }
            }
    }
    for (int64_t i = 0; i < n; i++) w[i] = s[i * n + i];
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = i + 1; j < n; j++)
            if (w[j] < w[i]) {
                double t = w[i];
                w[i] = w[j];
                w[j] = t;
                for (int64_t k = 0; k < n; k++) {
                    t = v[k * n + i];
                    v[k * n + i] = v[k * n + j];
                    v[k * n + j] = t;
                }
            }
}

static void ref_syev(tpu_kargs *a, const tpu_linalg_dims *d, int64_t b, double *s, double *x) {
    const tpu_tensor *A = &a->t[0], *W = &a->t[1], *info = &a->t[2];
    tpu_args_SYEV q = tpu_unpack_SYEV(&a->p);
    int64_t n = d->m, ao = tpu_linalg_batch_off(A, d->nb, b), wo = tpu_linalg_batch_off(W, d->nb, b);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            bool low = i >= j; /* from the triangle read */
            s[i * n + j] = q.upper ? (low ? rl_get(A, ao, j, i) : rl_get(A, ao, i, j))
                                   : (low ? rl_get(A, ao, i, j) : rl_get(A, ao, j, i));
        }
    double *w = x, *v = x + n;
    bool ok = rl_finite(s, n * n);
    if (ok) rl_jacobi(s, n, w, v);
    for (int64_t i = 0; i < n; i++) rl_setv(W, wo, i, ok ? w[i] : NAN);
    if (q.vectors)
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++) rl_set(A, ao, i, j, ok ? v[i * n + j] : NAN);
    tpu_store_i64((int32_t *)info->base + tpu_linalg_batch_off(info, d->nb, b), TPU_I32,
                  ok ? 0 : tpu_linalg_syev_failure(n, q.vectors != 0));
}

/* Columns [r, c) of the row-major p x c matrix u completed to an orthonormal set (as the fast kernel). */
static void rl_complete(double *u, int64_t p, int64_t c, int64_t r, double *x) {
    for (int64_t j = r; j < c; j++) {
        int64_t best = 0;
        double bres = -1;
        for (int64_t e = 0; e < p; e++) {
            double res = 1;
            for (int64_t k = 0; k < j; k++) res -= u[e * c + k] * u[e * c + k];
            if (res > bres) bres = res, best = e;
        }
        for (int64_t i = 0; i < p; i++) x[i] = i == best;
        for (int pass = 0; pass < 2; pass++)
            for (int64_t k = 0; k < j; k++) {
                double dd = 0;
                for (int64_t i = 0; i < p; i++) dd += u[i * c + k] * x[i];
                for (int64_t i = 0; i < p; i++) x[i] -= dd * u[i * c + k];
            }
        double nrm = 0;
        for (int64_t i = 0; i < p; i++) nrm += x[i] * x[i];
        for (int64_t i = 0; i < p; i++) u[i * c + j] = x[i] / sqrt(nrm);
    }
}

/* G (gp x gq, G = A or A^T) = G_U S G_V^T: G_V, S^2 from the eigen-decomposition of G^T G, G_U = G G_V / S. */
static void ref_svd(tpu_kargs *a, const tpu_linalg_dims *d, int64_t b) {
    const tpu_tensor *S = &a->t[0], *U = &a->t[1], *Vh = &a->t[2], *info = &a->t[3], *A = &a->t[4];
    bool tall = d->m >= d->n, uv = !U->is_scalar;
    int64_t gp = tall ? d->m : d->n, gq = tall ? d->n : d->m, ao = tpu_linalg_batch_off(A, d->nb, b);
    int64_t gc = uv ? (tall ? U->sizes[U->ndim - 1] : Vh->sizes[Vh->ndim - 2]) : gq;
    double *g = malloc((size_t)(gp * gq + 2 * gq * gq + gq + gp * gc + gp + 1) * sizeof *g);
    if (!g) abort(); /* (test-sized matrices) */
    double *s = g + gp * gq, *v = s + gq * gq, *w = v + gq * gq, *u = w + gq, *x = u + gp * gc;
    for (int64_t i = 0; i < gp; i++)
        for (int64_t j = 0; j < gq; j++) g[i * gq + j] = tall ? rl_get(A, ao, i, j) : rl_get(A, ao, j, i);
    bool ok = rl_finite(g, gp * gq);
    if (ok) {
        for (int64_t i = 0; i < gq; i++)
            for (int64_t j = 0; j < gq; j++) {
                double t = 0;
                for (int64_t k = 0; k < gp; k++) t += g[k * gq + i] * g[k * gq + j];
                s[i * gq + j] = t;
            }
        rl_jacobi(s, gq, w, v);
        for (int64_t i = 0; i < gq / 2; i++) { /* descending */
            int64_t j = gq - 1 - i;
            double t = w[i];
            w[i] = w[j];
            w[j] = t;
            for (int64_t k = 0; k < gq; k++) {
                t = v[k * gq + i];
                v[k * gq + i] = v[k * gq + j];
                v[k * gq + j] = t;
            }
        }
        int64_t r = 0;
        for (int64_t j = 0; j < gq; j++) {
            double sj = sqrt(w[j] > 0 ? w[j] : 0);
            rl_setv(S, tpu_linalg_batch_off(S, d->nb, b), j, sj);
            if (sj > 1e-12 * sqrt(w[0] > 0 ? w[0] : 0) && r == j) {
                for (int64_t i = 0; i < gp; i++) {
                    double t = 0;
                    for (int64_t k = 0; k < gq; k++) t += g[i * gq + k] * v[k * gq + j];
                    u[i * gc + j] = t / sj;
                }
                r++;
            }
        }
        rl_complete(u, gp, gc, r, x);
        if (uv) {
            const tpu_tensor *tu = tall ? U : Vh, *tv = tall ? Vh : U;
            int64_t uo = tpu_linalg_batch_off(tu, d->nb, b), vo = tpu_linalg_batch_off(tv, d->nb, b);
            for (int64_t i = 0; i < gp; i++)
                for (int64_t j = 0; j < gc; j++)
                    tall ? rl_set(tu, uo, i, j, u[i * gc + j]) : rl_set(tu, uo, j, i, u[i * gc + j]);
            for (int64_t i = 0; i < gq; i++)
                for (int64_t j = 0; j < gq; j++)
                    tall ? rl_set(tv, vo, j, i, v[i * gq + j]) : rl_set(tv, vo, i, j, v[i * gq + j]);
        }
    } else {
        for (int64_t j = 0; j < gq; j++) rl_setv(S, tpu_linalg_batch_off(S, d->nb, b), j, NAN);
    }
    tpu_store_i64((int32_t *)info->base + tpu_linalg_batch_off(info, d->nb, b), TPU_I32, ok ? 0 : -4);
    free(g);
}

tpu_status tpu_ref_linalg(tpu_kargs *a) {
    tpu_linalg_dims d;
    tpu_status s = tpu_linalg_check(a, &d);
    if (s || d.batch == 0) return s;
    int64_t mm = d.m > d.n ? d.m : d.n;
    double *w = malloc((size_t)(2 * mm * mm + 1) * sizeof *w), *x = malloc((size_t)(3 * mm * mm + 1) * sizeof *x);
    if (!w || !x) {
        free(w);
        free(x);
        return tpu_kernel_fail(a, "%s: out of host memory", tpu_op_name(a->op));
    }
    for (int64_t b = 0; b < d.batch && !s; b++) {
        int64_t bad = 0;
        switch (a->op) {
        case TPU_OP_TRSM: ref_trsm(a, &d, b, w, x); break;
        case TPU_OP_POTRF: ref_potrf(a, &d, b, w, x); break;
        case TPU_OP_POTRI: ref_potri(a, &d, b, w, x); break;
        case TPU_OP_GETRF: ref_getrf(a, &d, b, w, x); break;
        case TPU_OP_GETRS:
            if (!ref_getrs(a, &d, b, w, x, &bad)) s = tpu_linalg_bad_pivot(a, &d, b, bad);
            break;
        case TPU_OP_LU_PERM:
            if (!ref_perm(a, &d, b, &bad)) s = tpu_linalg_bad_pivot(a, &d, b, bad);
            break;
        case TPU_OP_GEQRF: ref_geqrf(a, &d, b, w, x); break;
        case TPU_OP_ORGQR: ref_orgqr(a, &d, b, w, x); break;
        case TPU_OP_ORMQR: ref_ormqr(a, &d, b, w, x); break;
        case TPU_OP_SYEV: ref_syev(a, &d, b, w, x); break;
        case TPU_OP_GESVD: ref_svd(a, &d, b); break;
        default: s = tpu_kernel_fail(a, "%s: not a linalg op", tpu_op_name(a->op));
        }
    }
    free(w);
    free(x);
    return s;
}
