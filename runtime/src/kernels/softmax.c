/* softmax.c - softmax, log_softmax and their backwards along one dim (i0).
 *
 * Every operand is viewed as lines along `dim`: D = sizes[dim] elements at
 * stride strides[dim], one line per position of the other dims. Lines are
 * independent and split across the compute workers. A line is used in place
 * when it has unit stride and the compute dtype: the contiguous last-dim
 * case of transformers and classifiers. Otherwise it is gathered (converted)
 * into a per-chunk buffer that stays in L1, computed there and scattered
 * back; contiguous bf16 lines convert with vector loops.
 *
 * When the lines are not contiguous but neighbouring lines are neighbouring
 * elements (softmax over a leading dim), SM_W lines are computed at once,
 * one vector per position along dim, with no gather at all.
 *
 * Compute dtype: float for f32/bf16/f16 outputs (sums in float lanes over
 * short blocks, blocks added in double), double for f64. The float loops use
 * GCC vector extensions, so they vectorize at any -O level, and are cloned
 * for AVX-512/AVX2 (define TPU_KERNELS_NO_CLONES to build one portable
 * version, e.g. to test it). exp() of floats is a Cephes-style polynomial
 * (about 1 ulp) that keeps NaN and gives 0 below -87.3; it is called on
 * x - max <= 0 and on log-probabilities. */
#include "kernels/kernels-impl.h"
#include "kernels/tile-impl.h"
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#ifdef TPU_KERNELS_NO_CLONES
#define SM_CLONES
#else
#define SM_CLONES TPU_TARGET_CLONES
#endif
#define SM_INLINE static inline __attribute__((always_inline))

/* SM_W float lanes: one AVX-512 register, two AVX2 registers. */
#define SM_W 16
typedef vf16 vf;
typedef vi16 vi;
typedef vu16 vu;
_Static_assert(sizeof(vf) == 4 * SM_W, "SM_W lanes per vector");

#define VSPLAT(c)     ((vf){0} + (c))
#define VSEL(m, a, b) ((vf)(((m) & (vi)(a)) | (~(m) & (vi)(b))))

/* Vector helpers take pointers: vectors by value would trip -Wpsabi in the
 * non-AVX clones, and these are always inlined anyway. */
SM_INLINE void vload(vf *v, const float *p) { memcpy(v, p, sizeof *v); }
SM_INLINE void vstore(float *p, const vf *v) { memcpy(p, v, sizeof *v); }

/* Sums: SM_W float lanes over blocks of SM_BLOCK elements, each block's
 * lanes added into a double. Short float chains keep the accuracy close to
 * a double sum without converting every vector. */
#define SM_BLOCK 256

SM_INLINE double vlanes(const vf *v) {
    double s = 0;
    for (int j = 0; j < SM_W; j++) s += (*v)[j];
    return s;
}

/* exp(x) for x <= 88.3 (larger gives +inf), NaN kept, 0 below -87.3. */
SM_INLINE void vexp(vf *px) {
    const vf lo = VSPLAT(-87.3f), hi = VSPLAT(88.3f);
    vf x = *px;
    vf xc = VSEL(x < lo, lo, x);
    xc = VSEL(xc > hi, hi, xc);
    vf t = xc * 1.44269504088896341f + 12582912.0f; /* 1.5*2^23: round to int */
    vf n = t - 12582912.0f;
    vf r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vu sb = ((vu)t - 0x4B400000u + 127u) << 23; /* 2^n */
    vf y = p * (vf)sb;
    y = VSEL(x < lo, VSPLAT(0.0f), y);
    *px = VSEL(x > hi, VSPLAT(INFINITY), y);
}

/* The same formula on one float, for row tails. */
SM_INLINE float sexp(float x) {
    union {
        float f;
        uint32_t u;
    } t, sc;
    float xc = x < -87.3f ? -87.3f : x;
    xc = xc > 88.3f ? 88.3f : xc;
    t.f = xc * 1.44269504088896341f + 12582912.0f;
    float n = t.f - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    sc.u = (t.u - 0x4B400000u + 127u) << 23;
    float y = p * sc.f;
    y = x < -87.3f ? 0.0f : y;
    return x > 88.3f ? INFINITY : y;
}

/* ---- float rows (n >= 1): whole vectors, then a scalar tail ---- */

SM_CLONES static float row_max_f(const float *x, int64_t n) {
    vf m = VSPLAT(-INFINITY), v;
    int64_t i = 0;
    for (; i + SM_W <= n; i += SM_W) {
        vload(&v, x + i);
        m = VSEL(v > m, v, m);
    }
    float r = -INFINITY;
    for (int j = 0; j < SM_W; j++) r = m[j] > r ? m[j] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

/* sum(exp(x - m)); also y = exp(x - m) when y */
SM_CLONES static double row_exp_sum_f(float *y, const float *x, int64_t n, float m) {
    double s = 0;
    int64_t i = 0;
    while (i + SM_W <= n) {
        int64_t end = n - i > SM_BLOCK ? i + SM_BLOCK : n;
        vf acc = VSPLAT(0.0f), v;
        for (; i + SM_W <= end; i += SM_W) {
            vload(&v, x + i);
            v -= m;
            vexp(&v);
            if (y) vstore(y + i, &v);
            acc += v;
        }
        s += vlanes(&acc);
    }
    for (; i < n; i++) {
        float e = sexp(x[i] - m);
        if (y) y[i] = e;
        s += e;
    }
    return s;
}

SM_CLONES static void row_scale_f(float *y, int64_t n, float c) {
    int64_t i = 0;
    for (; i + SM_W <= n; i += SM_W) {
        vf v;
        vload(&v, y + i);
        v *= c;
        vstore(y + i, &v);
    }
    for (; i < n; i++) y[i] *= c;
}

/* y = (x - m) - c */
SM_CLONES static void row_sub2_f(float *y, const float *x, int64_t n, float m, float c) {
    int64_t i = 0;
    for (; i + SM_W <= n; i += SM_W) {
        vf v;
        vload(&v, x + i);
        v = (v - m) - c;
        vstore(y + i, &v);
    }
    for (; i < n; i++) y[i] = (x[i] - m) - c;
}

/* sum(a*b), or sum(a) when b is NULL */
SM_CLONES static double row_dot_f(const float *a, const float *b, int64_t n) {
    double s = 0;
    int64_t i = 0;
    while (i + SM_W <= n) {
        int64_t end = n - i > SM_BLOCK ? i + SM_BLOCK : n;
        vf acc = VSPLAT(0.0f), v, w = VSPLAT(1.0f);
        for (; i + SM_W <= end; i += SM_W) {
            vload(&v, a + i);
            if (b) vload(&w, b + i);
            acc += v * w;
        }
        s += vlanes(&acc);
    }
    for (; i < n; i++) s += b ? a[i] * b[i] : a[i];
    return s;
}

/* softmax_bwd: gi = y*(g - s); log_softmax_bwd: gi = g - exp(y)*s */
SM_CLONES static void row_bwd_f(bool logsm, float *gi, const float *g, const float *y, int64_t n, float s) {
    int64_t i = 0;
    for (; i + SM_W <= n; i += SM_W) {
        vf vg, vy;
        vload(&vg, g + i);
        vload(&vy, y + i);
        if (logsm) {
            vexp(&vy);
            vg = vg - vy * s;
        } else {
            vg = vy * (vg - s);
        }
        vstore(gi + i, &vg);
    }
    for (; i < n; i++) gi[i] = logsm ? g[i] - sexp(y[i]) * s : y[i] * (g[i] - s);
}

static void row_f(tpu_op op, float *out, const float *in0, const float *in1, int64_t n) {
    switch (op) {
    case TPU_OP_SOFTMAX: {
        float m = row_max_f(in0, n);
        double s = row_exp_sum_f(out, in0, n, m);
        row_scale_f(out, n, (float)(1.0 / s));
        break;
    }
    case TPU_OP_LOG_SOFTMAX: {
        float m = row_max_f(in0, n);
        double s = row_exp_sum_f(NULL, in0, n, m);
        row_sub2_f(out, in0, n, m, (float)log(s));
        break;
    }
    case TPU_OP_SOFTMAX_BWD: row_bwd_f(false, out, in0, in1, n, (float)row_dot_f(in0, in1, n)); break;
    case TPU_OP_LOG_SOFTMAX_BWD: row_bwd_f(true, out, in0, in1, n, (float)row_dot_f(in0, NULL, n)); break;
    default: break;
    }
}

void tpu_softmax_row_f(tpu_op op, float *out, const float *in0, const float *in1, int64_t n) {
    row_f(op, out, in0, in1, n);
}

/* ---- double rows ---- */

static void row_d(tpu_op op, double *out, const double *in0, const double *in1, int64_t n) {
    double s = 0;
    switch (op) {
    case TPU_OP_SOFTMAX:
    case TPU_OP_LOG_SOFTMAX: {
        double m = -INFINITY;
        for (int64_t i = 0; i < n; i++) m = in0[i] > m ? in0[i] : m;
        if (op == TPU_OP_SOFTMAX) {
            for (int64_t i = 0; i < n; i++) {
                out[i] = exp(in0[i] - m);
                s += out[i];
            }
            double r = 1.0 / s;
            for (int64_t i = 0; i < n; i++) out[i] *= r;
        } else {
            for (int64_t i = 0; i < n; i++) s += exp(in0[i] - m);
            double lse = log(s);
            for (int64_t i = 0; i < n; i++) out[i] = (in0[i] - m) - lse;
        }
        break;
    }
    case TPU_OP_SOFTMAX_BWD:
        for (int64_t i = 0; i < n; i++) s += in0[i] * in1[i];
        for (int64_t i = 0; i < n; i++) out[i] = in1[i] * (in0[i] - s);
        break;
    case TPU_OP_LOG_SOFTMAX_BWD:
        for (int64_t i = 0; i < n; i++) s += in0[i];
        for (int64_t i = 0; i < n; i++) out[i] = in0[i] - exp(in1[i]) * s;
        break;
    default: break;
    }
}

/* ---- SM_W adjacent lines at once (dim is not the innermost dim) ----
 * When consecutive lines are consecutive elements (the innermost other dim
 * has unit stride), element i of SM_W lines is one vector at i*stride:
 * no gather, vectorized across lines. Operands are f32 or bf16. */

typedef struct sm_cols {
    char *base[3]; /* element 0 of line 0, per operand */
    int64_t st[3]; /* stride along dim, in elements */
    bool bf[3];    /* bf16 (else f32) */
} sm_cols;

SM_INLINE void cload(vf *v, const sm_cols *c, int k, int64_t i) {
    if (c->bf[k])
        tpu_tile_vload_bf16x16(v, (const uint16_t *)c->base[k] + i * c->st[k]);
    else
        vload(v, (const float *)c->base[k] + i * c->st[k]);
}

SM_INLINE void cstore(const sm_cols *c, int64_t i, const vf *v) {
    if (c->bf[0])
        tpu_tile_vstore_bf16x16((uint16_t *)c->base[0] + i * c->st[0], v);
    else
        vstore((float *)c->base[0] + i * c->st[0], v);
}

/* per-lane sums over the D elements of: 0 exp(x - m), 1 g*y, 2 g;
 * softmax with an f32 output also stores exp(x - m) */
SM_INLINE void cols_sums(const sm_cols *c, int64_t D, int what, const vf *m, bool store, double *s) {
    for (int j = 0; j < SM_W; j++) s[j] = 0;
    for (int64_t i0 = 0; i0 < D; i0 += SM_BLOCK) {
        int64_t i1 = D - i0 > SM_BLOCK ? i0 + SM_BLOCK : D;
        vf acc = VSPLAT(0.0f);
        for (int64_t i = i0; i < i1; i++) {
            vf v;
            cload(&v, c, 1, i);
            if (what == 0) {
                v -= *m;
                vexp(&v);
                if (store) cstore(c, i, &v);
            } else if (what == 1) {
                vf y;
                cload(&y, c, 2, i);
                v *= y;
            }
            acc += v;
        }
        for (int j = 0; j < SM_W; j++) s[j] += acc[j];
    }
}

SM_CLONES static void cols_f(tpu_op op, const sm_cols *c, int64_t D) {
    vf m = VSPLAT(-INFINITY), r;
    double s[SM_W];
    if (op == TPU_OP_SOFTMAX || op == TPU_OP_LOG_SOFTMAX) {
        for (int64_t i = 0; i < D; i++) {
            vf v;
            cload(&v, c, 1, i);
            m = VSEL(v > m, v, m);
        }
    }
    switch (op) {
    case TPU_OP_SOFTMAX: {
        bool reuse = !c->bf[0]; /* rescale the stored exps; bf16 recomputes them */
        cols_sums(c, D, 0, &m, reuse, s);
        for (int j = 0; j < SM_W; j++) r[j] = (float)(1.0 / s[j]);
        for (int64_t i = 0; i < D; i++) {
            vf v;
            if (reuse) {
                cload(&v, c, 0, i);
            } else {
                cload(&v, c, 1, i);
                v -= m;
                vexp(&v);
            }
            v *= r;
            cstore(c, i, &v);
        }
        break;
    }
    case TPU_OP_LOG_SOFTMAX:
        cols_sums(c, D, 0, &m, false, s);
        for (int j = 0; j < SM_W; j++) r[j] = (float)log(s[j]);
        for (int64_t i = 0; i < D; i++) {
            vf v;
            cload(&v, c, 1, i);
            v = (v - m) - r;
            cstore(c, i, &v);
        }
        break;
    case TPU_OP_SOFTMAX_BWD:
        cols_sums(c, D, 1, &m, false, s);
        for (int j = 0; j < SM_W; j++) r[j] = (float)s[j];
        for (int64_t i = 0; i < D; i++) {
            vf g, y;
            cload(&g, c, 1, i);
            cload(&y, c, 2, i);
            g = y * (g - r);
            cstore(c, i, &g);
        }
        break;
    case TPU_OP_LOG_SOFTMAX_BWD:
        cols_sums(c, D, 2, &m, false, s);
        for (int j = 0; j < SM_W; j++) r[j] = (float)s[j];
        for (int64_t i = 0; i < D; i++) {
            vf g, y;
            cload(&g, c, 1, i);
            cload(&y, c, 2, i);
            vexp(&y);
            g = g - y * r;
            cstore(c, i, &g);
        }
        break;
    default: break;
    }
}

/* ---- strided line gather/scatter with dtype conversion ---- */

/* dst (float, or double if dbl) <- n elements of t at element offset off, stride st */
static void sm_gather(void *dst, bool dbl, const tpu_tensor *t, int64_t off, int64_t st, int64_t n) {
    tpu_dtype dt = (tpu_dtype)t->dtype;
    const char *p = (const char *)t->base + (size_t)off * tpu_dtype_size(dt);
    if (dbl)
        tpu_tile_load_f64(dst, p, st, n, dt);
    else
        tpu_tile_load_f32(dst, p, st, n, dt);
}

static void sm_scatter(const tpu_tensor *t, int64_t off, int64_t st, const void *src, bool dbl, int64_t n) {
    tpu_dtype dt = (tpu_dtype)t->dtype;
    char *p = (char *)t->base + (size_t)off * tpu_dtype_size(dt);
    if (dbl)
        tpu_tile_store_f64(p, st, src, n, dt);
    else
        tpu_tile_store_f32(p, st, src, n, dt);
}

/* ---- the line loop ---- */

typedef struct sm_plan {
    tpu_kargs *a;
    int nops;       /* out + 1 or 2 inputs */
    int64_t D;      /* line length */
    int64_t dst[3]; /* stride along dim, per operand */
    int nd;         /* the other dims */
    int64_t sizes[TPU_MAX_DIMS];
    int64_t st[3][TPU_MAX_DIMS];
    bool dbl;       /* compute in double */
    bool direct[3]; /* line used in place */
    bool any_gather;
    bool cols;  /* SM_W adjacent lines at a time (cols_f) */
    int failed; /* a chunk could not get its buffer */
} sm_plan;

static void sm_lines(void *ctx, int64_t b, int64_t e) {
    sm_plan *p = ctx;
    const tpu_tensor *t = p->a->t;
    size_t esz = p->dbl ? sizeof(double) : sizeof(float);
    char *buf = NULL;
    if (p->any_gather) {
        buf = malloc((size_t)p->D * esz * (size_t)p->nops);
        if (!buf) {
            __atomic_store_n(&p->failed, 1, __ATOMIC_RELAXED);
            return;
        }
    }
    int64_t idx[TPU_MAX_DIMS], off[3];
    int64_t rem = b;
    for (int k = 0; k < p->nops; k++) off[k] = t[k].offset;
    for (int d = p->nd - 1; d >= 0; d--) {
        idx[d] = rem % p->sizes[d];
        rem /= p->sizes[d];
        for (int k = 0; k < p->nops; k++) off[k] += idx[d] * p->st[k][d];
    }
    int last = p->nd - 1;
    for (int64_t l = b; l < e;) {
        int64_t run = 1;
        if (p->cols && e - l >= SM_W && p->sizes[last] - idx[last] >= SM_W) {
            sm_cols c;
            for (int k = 0; k < p->nops; k++) {
                c.bf[k] = t[k].dtype == TPU_BF16;
                c.base[k] = (char *)t[k].base + (size_t)off[k] * (c.bf[k] ? 2 : 4);
                c.st[k] = p->dst[k];
            }
            cols_f(p->a->op, &c, p->D);
            run = SM_W;
        } else {
            void *ptr[3] = {NULL, NULL, NULL};
            for (int k = 0; k < p->nops; k++) {
                if (p->direct[k]) {
                    ptr[k] = (char *)t[k].base + (size_t)off[k] * esz;
                } else {
                    ptr[k] = buf + (size_t)k * (size_t)p->D * esz;
                    if (k > 0) sm_gather(ptr[k], p->dbl, &t[k], off[k], p->dst[k], p->D);
                }
            }
            if (p->dbl)
                row_d(p->a->op, ptr[0], ptr[1], ptr[2], p->D);
            else
                row_f(p->a->op, ptr[0], ptr[1], ptr[2], p->D);
            if (!p->direct[0]) sm_scatter(&t[0], off[0], p->dst[0], ptr[0], p->dbl, p->D);
        }
        for (int64_t r = 0; r < run; r++) {
            for (int d = last; d >= 0; d--) {
                for (int k = 0; k < p->nops; k++) off[k] += p->st[k][d];
                if (++idx[d] < p->sizes[d]) break;
                for (int k = 0; k < p->nops; k++) off[k] -= idx[d] * p->st[k][d];
                idx[d] = 0;
            }
        }
        l += run;
    }
    free(buf);
}

tpu_status tpu_k_softmax(tpu_kargs *a) {
    const tpu_tensor *out = &a->t[0];
    int nops = (a->op == TPU_OP_SOFTMAX || a->op == TPU_OP_LOG_SOFTMAX) ? 2 : 3;
    if (a->op < TPU_OP_SOFTMAX || a->op > TPU_OP_LOG_SOFTMAX_BWD || a->n != nops)
        return tpu_kernel_fail(a, "%s: not a softmax op or wrong operand count %d", tpu_op_name(a->op), a->n);
    int64_t dim = tpu_unpack_SOFTMAX(&a->p).dim; /* the same column in all four softmax ops */
    int ndim = out->ndim;
    if (dim < 0 || dim >= (ndim > 0 ? ndim : 1))
        return tpu_kernel_fail(a, "%s: dim %lld out of range for a %d-d tensor", tpu_op_name(a->op), (long long)dim,
                               ndim);
    for (int k = 0; k < nops; k++) {
        const tpu_tensor *t = &a->t[k];
        if (t->is_scalar || !tpu_dtype_is_float((tpu_dtype)t->dtype) || t->ndim != ndim)
            return tpu_kernel_fail(a, "%s: operand %d must be a %d-d floating tensor", tpu_op_name(a->op), k, ndim);
        for (int d = 0; d < ndim; d++)
            if (t->sizes[d] != out->sizes[d])
                return tpu_kernel_fail(a, "%s: operand %d size %lld differs from output size %lld at dim %d",
                                       tpu_op_name(a->op), k, (long long)t->sizes[d], (long long)out->sizes[d], d);
    }
    int64_t numel = tpu_tensor_numel(out);
    if (numel == 0) return TPU_OK;

    sm_plan p;
    memset(&p, 0, sizeof p);
    p.a = a;
    p.nops = nops;
    p.dbl = out->dtype == TPU_F64;
    p.D = ndim > 0 ? out->sizes[dim] : 1;
    tpu_dtype native = p.dbl ? TPU_F64 : TPU_F32;
    for (int k = 0; k < nops; k++) {
        const tpu_tensor *t = &a->t[k];
        p.dst[k] = ndim > 0 ? t->strides[dim] : 0;
        p.direct[k] = t->dtype == (int32_t)native && (p.dst[k] == 1 || p.D == 1);
        p.any_gather |= !p.direct[k];
    }
    for (int d = 0; d < ndim; d++) {
        if (d == dim) continue;
        p.sizes[p.nd] = out->sizes[d];
        for (int k = 0; k < nops; k++) p.st[k][p.nd] = a->t[k].strides[d];
        p.nd++;
    }
    /* lines that would need a gather, f32/bf16, adjacent in memory: cols_f */
    p.cols = !p.dbl && p.nd > 0 && p.D > 1 && p.dst[0] != 1;
    for (int k = 0; k < nops && p.cols; k++)
        p.cols = (a->t[k].dtype == TPU_F32 || a->t[k].dtype == TPU_BF16) && p.st[k][p.nd - 1] == 1;
    int64_t lines = numel / p.D;
    int64_t grain = p.D >= 16384 ? 1 : 16384 / p.D;
    tpu_parallel_for(lines, grain, sm_lines, &p);
    if (p.failed)
        return tpu_kernel_fail(a, "%s: out of host memory for a %lld-element line buffer", tpu_op_name(a->op),
                               (long long)p.D);
    return TPU_OK;
}
