/* linalg.c - linear algebra over batches of matrices (ops.def: TRSM, POTRF,
 * POTRI, GETRF, GETRS, LU_PERM, GEQRF, ORGQR, ORMQR, SYEV, GESVD).
 *
 * DESIGN. Each matrix of a batch is copied into a dense column-major working
 * buffer (transposed where that turns the problem into one the cores solve:
 * the upper Cholesky factor is the transpose of the lower one of the same
 * matrix, X op(A) = B is op(A)^T X^T = B^T), solved there by LAPACK's
 * unblocked algorithms (linalg-tmpl.h, in the operands' dtype: float32 or
 * float64), and copied back. So every kernel takes any strides, and
 * broadcast batch dims (stride 0) read the same matrix again. Batches run in
 * parallel on the compute pool, each block of matrices with its own
 * buffers. Operand checks are shared with the reference (ref_linalg.c). */
#include "kernels/kernels-impl.h"
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define LA_T    float
#define LA_F(n) n##_f
#define LA_FMA  fmaf
#include "kernels/linalg-tmpl.h"
#undef LA_T
#undef LA_F
#undef LA_FMA
#define LA_T    double
#define LA_F(n) n##_d
#define LA_FMA  fma
#include "kernels/linalg-tmpl.h"
#undef LA_T
#undef LA_F
#undef LA_FMA

typedef struct la_plan {
    tpu_kargs *a;
    tpu_linalg_dims d;
    bool f64;
    int bad; /* a worker found an invalid pivot (1 + its operand), read after the loop */
    int64_t bad_batch, bad_value;
} la_plan;

static int64_t la_off(const tpu_tensor *t, int nb, int64_t b) { return tpu_linalg_batch_off(t, nb, b); }

/* Buffers for one block of matrices: n0 and n1 elements of the dtype, nint int32. */
typedef struct la_buf {
    void *w0, *w1;
    int32_t *piv;
} la_buf;

static void la_buf_get(la_buf *w, const la_plan *p, int64_t n0, int64_t n1, int64_t nint) {
    size_t es = p->f64 ? sizeof(double) : sizeof(float);
    w->w0 = malloc((size_t)(n0 > 0 ? n0 : 1) * es);
    w->w1 = malloc((size_t)(n1 > 0 ? n1 : 1) * es);
    w->piv = malloc((size_t)(nint > 0 ? nint : 1) * sizeof(int32_t));
    if (!w->w0 || !w->w1 || !w->piv) abort(); /* sizes checked at launch: a few matrices at most */
}

static void la_buf_free(la_buf *w) {
    free(w->w0);
    free(w->w1);
    free(w->piv);
}

static void la_set_int(const tpu_tensor *t, int64_t off, int64_t v) { ((int32_t *)t->base)[off] = (int32_t)v; }

/* ---- TRSM: t[0] B (in place), t[1] A ---- */
static void la_trsm(void *ctx, int64_t b0, int64_t b1) {
    la_plan *p = ctx;
    const tpu_tensor *B = &p->a->t[0], *A = &p->a->t[1];
    tpu_args_TRSM q = tpu_unpack_TRSM(&p->a->p);
    int64_t m = p->d.m, n = p->d.n, k = q.left ? m : n, r = q.left ? m : n, c = q.left ? n : m;
    bool right = !q.left, trans = (q.trans != 0) != right;
    la_buf w;
    la_buf_get(&w, p, k * k, r * c, 0);
    for (int64_t b = b0; b < b1; b++) {
        int64_t ao = la_off(A, p->d.nb, b), bo = la_off(B, p->d.nb, b);
        if (p->f64) {
            load_d(A, ao, k, k, false, w.w0);
            load_d(B, bo, r, c, right, w.w1);
            trsm_d(q.upper != 0, trans, q.unit != 0, r, c, w.w0, k, w.w1, r);
            store_d(B, bo, r, c, right, w.w1);
        } else {
            load_f(A, ao, k, k, false, w.w0);
            load_f(B, bo, r, c, right, w.w1);
            trsm_f(q.upper != 0, trans, q.unit != 0, r, c, w.w0, k, w.w1, r);
            store_f(B, bo, r, c, right, w.w1);
        }
    }
    la_buf_free(&w);
}

/* ---- POTRF / POTRI: t[0] A (in place), t[1] info ---- */
static void la_potrf(void *ctx, int64_t b0, int64_t b1) {
    la_plan *p = ctx;
    const tpu_tensor *A = &p->a->t[0], *info = &p->a->t[1];
    bool up = p->a->p.i[0] != 0, inv = p->a->op == TPU_OP_POTRI;
    int64_t n = p->d.m;
    la_buf w;
    la_buf_get(&w, p, n * n, inv ? n * n : 0, 0);
    for (int64_t b = b0; b < b1; b++) {
        int64_t ao = la_off(A, p->d.nb, b), v;
        if (p->f64) {
            load_d(A, ao, n, n, up, w.w0);
            v = inv ? potri_d(n, w.w0, n, w.w1) : potrf_d(n, w.w0, n);
            if (!inv || v == 0) store_d(A, ao, n, n, up, inv ? w.w1 : w.w0);
        } else {
            load_f(A, ao, n, n, up, w.w0);
            v = inv ? potri_f(n, w.w0, n, w.w1) : potrf_f(n, w.w0, n);
            if (!inv || v == 0) store_f(A, ao, n, n, up, inv ? w.w1 : w.w0);
        }
        la_set_int(info, la_off(info, p->d.nb, b), v);
    }
    la_buf_free(&w);
}

/* ---- GETRF: t[0] A (in place), t[1] pivots, t[2] info ---- */
static void la_getrf(void *ctx, int64_t b0, int64_t b1) {
    la_plan *p = ctx;
    const tpu_tensor *A = &p->a->t[0], *piv = &p->a->t[1], *info = &p->a->t[2];
    int64_t m = p->d.m, n = p->d.n, k = m < n ? m : n;
    la_buf w;
    la_buf_get(&w, p, m * n, 0, k);
    int64_t ps = piv->strides[piv->ndim - 1];
    for (int64_t b = b0; b < b1; b++) {
        int64_t ao = la_off(A, p->d.nb, b), v;
        if (p->f64) {
            load_d(A, ao, m, n, false, w.w0);
            v = getrf_d(m, n, w.w0, m, w.piv);
            store_d(A, ao, m, n, false, w.w0);
        } else {
            load_f(A, ao, m, n, false, w.w0);
            v = getrf_f(m, n, w.w0, m, w.piv);
            store_f(A, ao, m, n, false, w.w0);
        }
        int32_t *pv = (int32_t *)piv->base + la_off(piv, p->d.nb, b);
        for (int64_t j = 0; j < k; j++) pv[j * ps] = w.piv[j];
        la_set_int(info, la_off(info, p->d.nb, b), v);
    }
    la_buf_free(&w);
}

/* Pivots of batch b into w->piv, checked to lie in [1, n]; false (recorded) if one does not. */
static bool la_pivots(la_plan *p, const tpu_tensor *piv, int64_t b, int64_t k, int64_t n, int32_t *out) {
    const int32_t *pv = (const int32_t *)piv->base + la_off(piv, p->d.nb, b);
    int64_t ps = piv->strides[piv->ndim - 1];
    for (int64_t j = 0; j < k; j++) {
        int32_t v = pv[j * ps];
        if (v < 1 || v > n) {
            __atomic_store_n(&p->bad_batch, b, __ATOMIC_RELAXED);
            __atomic_store_n(&p->bad_value, (int64_t)v, __ATOMIC_RELAXED);
            __atomic_store_n(&p->bad, 1, __ATOMIC_RELAXED);
            return false;
        }
        out[j] = v;
    }
    return true;
}

/* ---- GETRS: t[0] B (in place), t[1] LU, t[2] pivots ---- */
static void la_getrs(void *ctx, int64_t b0, int64_t b1) {
    la_plan *p = ctx;
    const tpu_tensor *B = &p->a->t[0], *LU = &p->a->t[1], *piv = &p->a->t[2];
    bool tr = p->a->p.i[0] != 0;
    int64_t n = p->d.m, nrhs = p->d.n;
    la_buf w;
    la_buf_get(&w, p, n * n, n * nrhs, n);
    for (int64_t b = b0; b < b1; b++) {
        if (!la_pivots(p, piv, b, n, n, w.piv)) break;
        int64_t lo = la_off(LU, p->d.nb, b), bo = la_off(B, p->d.nb, b);
        if (p->f64) {
            load_d(LU, lo, n, n, false, w.w0);
            load_d(B, bo, n, nrhs, false, w.w1);
            getrs_d(tr, n, nrhs, w.w0, n, w.piv, w.w1, n);
            store_d(B, bo, n, nrhs, false, w.w1);
        } else {
            load_f(LU, lo, n, n, false, w.w0);
            load_f(B, bo, n, nrhs, false, w.w1);
            getrs_f(tr, n, nrhs, w.w0, n, w.piv, w.w1, n);
            store_f(B, bo, n, nrhs, false, w.w1);
        }
    }
    la_buf_free(&w);
}

/* ---- LU_PERM: t[0] perm int64 [.., m] (in place), t[1] pivots [.., k] ---- */
static void la_perm(void *ctx, int64_t b0, int64_t b1) {
    la_plan *p = ctx;
    const tpu_tensor *perm = &p->a->t[0], *piv = &p->a->t[1];
    int64_t m = p->d.m, k = p->d.n, s = perm->strides[perm->ndim - 1];
    int32_t *pv = malloc((size_t)(k > 0 ? k : 1) * sizeof *pv);
    if (!pv) abort();
    for (int64_t b = b0; b < b1; b++) {
        if (!la_pivots(p, piv, b, k, m, pv)) break;
        int64_t *x = (int64_t *)perm->base + la_off(perm, p->d.nb, b);
        for (int64_t i = 0; i < k; i++) {
            int64_t j = pv[i] - 1, t = x[i * s];
            x[i * s] = x[j * s];
            x[j * s] = t;
        }
    }
    free(pv);
}

/* ---- GEQRF: t[0] A (in place), t[1] tau; ORGQR: t[0] A (in place), t[1] tau ---- */
static void la_qr(void *ctx, int64_t b0, int64_t b1) {
    la_plan *p = ctx;
    const tpu_tensor *A = &p->a->t[0], *tau = &p->a->t[1];
    bool gen = p->a->op == TPU_OP_ORGQR;
    int64_t m = p->d.m, n = p->d.n, k = tau->sizes[tau->ndim - 1], ts = tau->strides[tau->ndim - 1];
    la_buf w;
    la_buf_get(&w, p, m * n, k, 0);
    for (int64_t b = b0; b < b1; b++) {
        int64_t ao = la_off(A, p->d.nb, b), to = la_off(tau, p->d.nb, b);
        if (p->f64) {
            double *t = w.w1, *tb = (double *)tau->base + to;
            load_d(A, ao, m, n, false, w.w0);
            if (gen) {
                for (int64_t i = 0; i < k; i++) t[i] = tb[i * ts];
                orgqr_d(m, n, k, w.w0, m, t);
            } else {
                geqrf_d(m, n, w.w0, m, t);
                for (int64_t i = 0; i < k; i++) tb[i * ts] = t[i];
            }
            store_d(A, ao, m, n, false, w.w0);
        } else {
            float *t = w.w1, *tb = (float *)tau->base + to;
            load_f(A, ao, m, n, false, w.w0);
            if (gen) {
                for (int64_t i = 0; i < k; i++) t[i] = tb[i * ts];
                orgqr_f(m, n, k, w.w0, m, t);
            } else {
                geqrf_f(m, n, w.w0, m, t);
                for (int64_t i = 0; i < k; i++) tb[i * ts] = t[i];
            }
            store_f(A, ao, m, n, false, w.w0);
        }
    }
    la_buf_free(&w);
}

/* ---- ORMQR: t[0] C (in place), t[1] reflectors A (r x k), t[2] tau [k] ---- */
static void la_ormqr(void *ctx, int64_t b0, int64_t b1) {
    la_plan *p = ctx;
    const tpu_tensor *C = &p->a->t[0], *A = &p->a->t[1], *tau = &p->a->t[2];
    tpu_args_ORMQR q = tpu_unpack_ORMQR(&p->a->p);
    int64_t m = p->d.m, n = p->d.n, r = A->sizes[A->ndim - 2], k = tau->sizes[tau->ndim - 1];
    int64_t ts = tau->strides[tau->ndim - 1], ac = A->sizes[A->ndim - 1];
    la_buf w;
    la_buf_get(&w, p, r * ac + k, m * n, 0);
    for (int64_t b = b0; b < b1; b++) {
        int64_t ao = la_off(A, p->d.nb, b), co = la_off(C, p->d.nb, b), to = la_off(tau, p->d.nb, b);
        if (p->f64) {
            double *a = w.w0, *t = a + r * ac, *tb = (double *)tau->base + to;
            load_d(A, ao, r, ac, false, a);
            load_d(C, co, m, n, false, w.w1);
            for (int64_t i = 0; i < k; i++) t[i] = tb[i * ts];
            ormqr_d(q.left != 0, q.trans != 0, m, n, k, a, r, t, w.w1, m);
            store_d(C, co, m, n, false, w.w1);
        } else {
            float *a = w.w0, *t = a + r * ac, *tb = (float *)tau->base + to;
            load_f(A, ao, r, ac, false, a);
            load_f(C, co, m, n, false, w.w1);
            for (int64_t i = 0; i < k; i++) t[i] = tb[i * ts];
            ormqr_f(q.left != 0, q.trans != 0, m, n, k, a, r, t, w.w1, m);
            store_f(C, co, m, n, false, w.w1);
        }
    }
    la_buf_free(&w);
}

/* ---- SYEV: t[0] A (in place -> eigenvectors), t[1] w, t[2] info ---- */
static void la_syev(void *ctx, int64_t b0, int64_t b1) {
    la_plan *p = ctx;
    const tpu_tensor *A = &p->a->t[0], *W = &p->a->t[1], *info = &p->a->t[2];
    tpu_args_SYEV q = tpu_unpack_SYEV(&p->a->p);
    int64_t n = p->d.m, ws = W->strides[W->ndim - 1];
    la_buf w;
    la_buf_get(&w, p, n * n + n, n * n, 0);
    for (int64_t b = b0; b < b1; b++) {
        int64_t ao = la_off(A, p->d.nb, b), wo = la_off(W, p->d.nb, b);
        bool ok;
        if (p->f64) {
            double *a = w.w0, *ev = a + n * n, *wb = (double *)W->base + wo;
            load_d(A, ao, n, n, q.upper != 0, a); /* the lower triangle of a is the one to read */
            for (int64_t j = 0; j < n; j++)
                for (int64_t i = 0; i < j; i++) a[i + j * n] = a[j + i * n];
            ok = syev_d(n, a, n, ev, q.vectors ? w.w1 : NULL);
            for (int64_t i = 0; i < n; i++) wb[i * ws] = ev[i];
            if (q.vectors) store_d(A, ao, n, n, false, w.w1);
        } else {
            float *a = w.w0, *ev = a + n * n, *wb = (float *)W->base + wo;
            load_f(A, ao, n, n, q.upper != 0, a);
            for (int64_t j = 0; j < n; j++)
                for (int64_t i = 0; i < j; i++) a[i + j * n] = a[j + i * n];
            ok = syev_f(n, a, n, ev, q.vectors ? w.w1 : NULL);
            for (int64_t i = 0; i < n; i++) wb[i * ws] = ev[i];
            if (q.vectors) store_f(A, ao, n, n, false, w.w1);
        }
        la_set_int(info, la_off(info, p->d.nb, b), ok ? 0 : tpu_linalg_syev_failure(n, q.vectors != 0));
    }
    la_buf_free(&w);
}

/* ---- GESVD: t[0] S, t[1] U?, t[2] Vh?, t[3] info, t[4] A ---- */
static void la_svd(void *ctx, int64_t b0, int64_t b1) {
    la_plan *p = ctx;
    const tpu_tensor *S = &p->a->t[0], *U = &p->a->t[1], *Vh = &p->a->t[2], *info = &p->a->t[3], *A = &p->a->t[4];
    bool uv = !U->is_scalar, tall = p->d.m >= p->d.n;
    /* G = A (tall) or A^T: G (gp x gq, gp >= gq) = G_U diag(s) G_V^T */
    int64_t m = p->d.m, n = p->d.n, gp = tall ? m : n, gq = tall ? n : m, ss = S->strides[S->ndim - 1];
    int64_t uc = uv ? U->sizes[U->ndim - 1] : 0, vr = uv ? Vh->sizes[Vh->ndim - 2] : 0;
    int64_t gc = uv ? (tall ? uc : vr) : gq; /* G_U's columns wanted: gq, or gp (full matrices) */
    la_buf w;
    la_buf_get(&w, p, gp * (gc > gq ? gc : gq) + gq + gp, gq * gq, 0);
    for (int64_t b = b0; b < b1; b++) {
        int64_t ao = la_off(A, p->d.nb, b), so = la_off(S, p->d.nb, b);
        bool ok;
        if (p->f64) {
            double *g = w.w0, *sv = g + gp * (gc > gq ? gc : gq), *x = sv + gq, *sb = (double *)S->base + so;
            load_d(A, ao, gp, gq, !tall, g);
            ok = gesvj_d(gp, gq, g, sv, uv ? w.w1 : NULL, x);
            for (int64_t i = 0; i < gq; i++) sb[i * ss] = sv[i];
            if (uv && ok) {
                complete_d(gp, gc, gq, g, x);
                /* tall: U = G_U, Vh = G_V^T; wide: U = G_V, Vh = G_U^T */
                store_d(tall ? U : Vh, la_off(tall ? U : Vh, p->d.nb, b), gp, gc, !tall, g);
                store_d(tall ? Vh : U, la_off(tall ? Vh : U, p->d.nb, b), gq, gq, tall, w.w1);
            }
        } else {
            float *g = w.w0, *sv = g + gp * (gc > gq ? gc : gq), *x = sv + gq, *sb = (float *)S->base + so;
            load_f(A, ao, gp, gq, !tall, g);
            ok = gesvj_f(gp, gq, g, sv, uv ? w.w1 : NULL, x);
            for (int64_t i = 0; i < gq; i++) sb[i * ss] = sv[i];
            if (uv && ok) {
                complete_f(gp, gc, gq, g, x);
                store_f(tall ? U : Vh, la_off(tall ? U : Vh, p->d.nb, b), gp, gc, !tall, g);
                store_f(tall ? Vh : U, la_off(tall ? Vh : U, p->d.nb, b), gq, gq, tall, w.w1);
            }
        }
        la_set_int(info, la_off(info, p->d.nb, b), ok ? 0 : -4);
    }
    la_buf_free(&w);
}

tpu_status tpu_k_linalg(tpu_kargs *a) {
    la_plan p;
    memset(&p, 0, sizeof p);
    p.a = a;
    tpu_status s = tpu_linalg_check(a, &p.d);
    if (s || p.d.batch == 0) return s;
    p.f64 = a->t[0].dtype == TPU_F64;
    void (*fn)(void *, int64_t, int64_t) = NULL;
    switch (a->op) {
    case TPU_OP_TRSM: fn = la_trsm; break;
    case TPU_OP_POTRF:
    case TPU_OP_POTRI: fn = la_potrf; break;
    case TPU_OP_GETRF: fn = la_getrf; break;
    case TPU_OP_GETRS: fn = la_getrs; break;
    case TPU_OP_LU_PERM: fn = la_perm; break;
    case TPU_OP_GEQRF:
    case TPU_OP_ORGQR: fn = la_qr; break;
    case TPU_OP_ORMQR: fn = la_ormqr; break;
    case TPU_OP_SYEV: fn = la_syev; break;
    case TPU_OP_GESVD: fn = la_svd; break;
    default: return tpu_kernel_fail(a, "%s: not a linalg op", tpu_op_name(a->op));
    }
    /* about 64k multiply-adds per block of matrices */
    int64_t mm = p.d.m > p.d.n ? p.d.m : p.d.n, work = mm * mm * (mm + 1) + 1;
    int64_t grain = work >= 65536 ? 1 : 65536 / work;
    tpu_parallel_for(p.d.batch, grain, fn, &p);
    if (p.bad) return tpu_linalg_bad_pivot(a, &p.d, p.bad_batch, p.bad_value);
    return TPU_OK;
}
