/* optim.c - fused optimizer steps: AdamW and Adam (torch.optim.AdamW / Adam,
 * amsgrad=False; torch._fused_adamw_ / _fused_adam_).
 *
 * Per element, in the order of PyTorch's single-tensor implementation:
 *   grad = -grad if maximize; grad += wd*param if l2 (Adam)
 *   param *= 1 - lr*wd  (AdamW; 1 for Adam)
 *   exp_avg = lerp(exp_avg, grad, 1 - beta1)
 *   exp_avg_sq = exp_avg_sq*beta2 + (1 - beta2)*grad*grad
 *   param += -(lr/bc1) * exp_avg / (sqrt(exp_avg_sq)/sqrt(bc2) + eps)
 * with bc1 = 1 - beta1^step, bc2 = 1 - beta2^step. Scalars are computed in
 * double and used as float, like PyTorch's scalar arguments. f32 follows
 * PyTorch's op order (results within 1 ulp: PyTorch's vectorized lerp fuses a
 * multiply-add); bf16/f16 state is rounded only when stored (one fused step,
 * like torch's fused=True, not one rounding per op); f64 computes in double.
 * The step count comes from a parameter or a one-element step tensor (the
 * fused optimizers keep it on the device); a nonzero found_inf (GradScaler)
 * skips the step. amsgrad is not supported. */
#include "kernels/kernels-impl.h"
#include "kernels/tile-impl.h"
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

typedef struct adamw_c {
    float decay, w, beta2, omb2, bc2s, eps, nstep, gsign, l2;           /* float scalars */
    double ddecay, dw, dbeta2, domb2, dbc2s, deps, dnstep, dgsign, dl2; /* the same in double */
} adamw_c;

static inline void adamw_f(const adamw_c *c, float *p, float *m, float *v, float g) {
    g *= c->gsign;
    if (c->l2 != 0.0f) g = g + c->l2 * *p;
    float pp = *p * c->decay;
    float mm = *m;
    mm = c->w < 0.5f ? mm + c->w * (g - mm) : g - (g - mm) * (1.0f - c->w);
    float vv = *v * c->beta2;
    vv = vv + c->omb2 * g * g;
    float den = sqrtf(vv) / c->bc2s + c->eps;
    *p = pp + c->nstep * mm / den;
    *m = mm;
    *v = vv;
}

static inline void adamw_d(const adamw_c *c, double *p, double *m, double *v, double g) {
    g *= c->dgsign;
    if (c->dl2 != 0.0) g = g + c->dl2 * *p;
    double pp = *p * c->ddecay;
    double mm = *m;
    mm = c->dw < 0.5 ? mm + c->dw * (g - mm) : g - (g - mm) * (1.0 - c->dw);
    double vv = *v * c->dbeta2;
    vv = vv + c->domb2 * g * g;
    double den = sqrt(vv) / c->dbc2s + c->deps;
    *p = pp + c->dnstep * mm / den;
    *m = mm;
    *v = vv;
}

typedef struct adamw_ctx {
    const tpu_kargs *a;
    adamw_c c;
    bool contig;
    int nd;
    int64_t sizes[TPU_MAX_DIMS];
} adamw_ctx;

/* The contiguous f32 and bf16 steps, 8 elements at a time with AVX2 (the
 * vector sqrt has no portable spelling, hence the explicit target and the
 * run-time check). Same operations in the same order as adamw_f, so vector
 * and scalar paths agree bit for bit. */
#define ADAMW_AVX2 __attribute__((target("avx2"), always_inline)) static inline

ADAMW_AVX2 void adamw_v8(const adamw_c *c, vf8 *p, vf8 *m, vf8 *v, const vf8 *g) {
    vf8 gg = *g * c->gsign, mm = *m, vv = *v * c->beta2;
    if (c->l2 != 0.0f) gg = gg + c->l2 * *p;
    mm = c->w < 0.5f ? mm + c->w * (gg - mm) : gg - (gg - mm) * (1.0f - c->w);
    vv = vv + c->omb2 * gg * gg;
    vf8 den = (vf8)_mm256_sqrt_ps((__m256)vv) / c->bc2s + c->eps;
    *p = *p * c->decay + c->nstep * mm / den;
    *m = mm;
    *v = vv;
}

__attribute__((target("avx2"))) static int64_t adamw_f32_avx2(const adamw_c *c, float *p, float *m, float *v,
                                                              const float *g, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        vf8 pp, mm, vv, gg;
        memcpy(&pp, p + i, sizeof pp);
        memcpy(&mm, m + i, sizeof mm);
        memcpy(&vv, v + i, sizeof vv);
        memcpy(&gg, g + i, sizeof gg);
        adamw_v8(c, &pp, &mm, &vv, &gg);
        memcpy(p + i, &pp, sizeof pp);
        memcpy(m + i, &mm, sizeof mm);
        memcpy(v + i, &vv, sizeof vv);
    }
    return i;
}

__attribute__((target("avx2"))) static int64_t adamw_bf16_avx2(const adamw_c *c, uint16_t *p, uint16_t *m, uint16_t *v,
                                                               const uint16_t *g, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        vf8 pp, mm, vv, gg;
        tpu_tile_vload_bf16x8(&pp, p + i);
        tpu_tile_vload_bf16x8(&mm, m + i);
        tpu_tile_vload_bf16x8(&vv, v + i);
        tpu_tile_vload_bf16x8(&gg, g + i);
        adamw_v8(c, &pp, &mm, &vv, &gg);
        tpu_tile_vstore_bf16x8(p + i, &pp);
        tpu_tile_vstore_bf16x8(m + i, &mm);
        tpu_tile_vstore_bf16x8(v + i, &vv);
    }
    return i;
}

static void adamw_f32_contig(const adamw_c *c, float *p, float *m, float *v, const float *g, int64_t n) {
    int64_t i = (tpu_cpu_features() & TPU_CPU_AVX2) ? adamw_f32_avx2(c, p, m, v, g, n) : 0;
    for (; i < n; i++) adamw_f(c, p + i, m + i, v + i, g[i]);
}

static void adamw_bf16_contig(const adamw_c *c, uint16_t *p, uint16_t *m, uint16_t *v, const uint16_t *g, int64_t n) {
    int64_t i = (tpu_cpu_features() & TPU_CPU_AVX2) ? adamw_bf16_avx2(c, p, m, v, g, n) : 0;
    for (; i < n; i++) {
        float pp = tpu_bf16_to_f32(p[i]), mm = tpu_bf16_to_f32(m[i]), vv = tpu_bf16_to_f32(v[i]);
        adamw_f(c, &pp, &mm, &vv, tpu_bf16_to_f32(g[i]));
        p[i] = tpu_f32_to_bf16(pp);
        m[i] = tpu_f32_to_bf16(mm);
        v[i] = tpu_f32_to_bf16(vv);
    }
}

/* A run of n <= TPU_TILE elements along the last dim, any floating dtypes
 * and strides, through float (double for a float64 param) buffers. */
static void adamw_run(const adamw_c *c, const tpu_tensor *t, const int64_t *off, int64_t n) {
    char *ptr[4];
    int64_t st[4];
    tpu_dtype dt[4];
    for (int k = 0; k < 4; k++) {
        ptr[k] = tpu_elem_ptr(&t[k], off[k] - t[k].offset);
        st[k] = t[k].ndim ? t[k].strides[t[k].ndim - 1] : 0;
        dt[k] = (tpu_dtype)t[k].dtype;
    }
    if (dt[0] == TPU_F64) {
        double x[4][TPU_TILE];
        for (int k = 0; k < 4; k++) tpu_tile_load_f64(x[k], ptr[k], st[k], n, dt[k]);
        for (int64_t i = 0; i < n; i++) adamw_d(c, &x[0][i], &x[1][i], &x[2][i], x[3][i]);
        for (int k = 0; k < 3; k++) tpu_tile_store_f64(ptr[k], st[k], x[k], n, dt[k]);
    } else {
        float x[4][TPU_TILE];
        for (int k = 0; k < 4; k++) tpu_tile_load_f32(x[k], ptr[k], st[k], n, dt[k]);
        for (int64_t i = 0; i < n; i++) adamw_f(c, &x[0][i], &x[1][i], &x[2][i], x[3][i]);
        for (int k = 0; k < 3; k++) tpu_tile_store_f32(ptr[k], st[k], x[k], n, dt[k]);
    }
}

static void adamw_range(void *ctx, int64_t b, int64_t e) {
    const adamw_ctx *x = ctx;
    const tpu_tensor *t = x->a->t;
    if (x->contig && t[0].dtype == TPU_F32) {
        adamw_f32_contig(&x->c, (float *)t[0].base + t[0].offset + b, (float *)t[1].base + t[1].offset + b,
                         (float *)t[2].base + t[2].offset + b, (const float *)t[3].base + t[3].offset + b, e - b);
        return;
    }
    if (x->contig && t[0].dtype == TPU_BF16) {
        adamw_bf16_contig(&x->c, (uint16_t *)t[0].base + t[0].offset + b, (uint16_t *)t[1].base + t[1].offset + b,
                          (uint16_t *)t[2].base + t[2].offset + b, (const uint16_t *)t[3].base + t[3].offset + b,
                          e - b);
        return;
    }
    int last = x->nd - 1;
    int64_t idx[TPU_MAX_DIMS], off[4], rem = b;
    for (int k = 0; k < 4; k++) off[k] = t[k].offset;
    for (int d = last; d >= 0; d--) {
        idx[d] = rem % x->sizes[d];
        rem /= x->sizes[d];
        for (int k = 0; k < 4; k++) off[k] += idx[d] * t[k].strides[d];
    }
    for (int64_t i = b; i < e;) {
        int64_t L = last < 0 ? 1 : x->sizes[last] - idx[last];
        if (L > e - i) L = e - i;
        if (L > TPU_TILE) L = TPU_TILE;
        adamw_run(&x->c, t, off, L);
        i += L;
        if (last < 0) break;
        idx[last] += L;
        for (int k = 0; k < 4; k++) off[k] += L * t[k].strides[last];
        for (int d = last; d > 0 && idx[d] == x->sizes[d]; d--) { /* carry into the dims above */
            for (int k = 0; k < 4; k++) off[k] += t[k].strides[d - 1] - idx[d] * t[k].strides[d];
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
}

static bool adamw_contig(const tpu_tensor *t, const tpu_tensor *ref) {
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->sizes[d] != 1 && t->strides[d] != expect) return false;
        expect *= t->sizes[d];
    }
    return t->dtype == ref->dtype;
}

static tpu_status adamw_step(tpu_kargs *a) {
    const tpu_tensor *t = a->t;
    if (a->n < 4 || a->n > 6) return tpu_kernel_fail(a, "adamw_step: %d operands, expected 4 to 6", a->n);
    tpu_args_ADAMW_STEP q = tpu_unpack_ADAMW_STEP(&a->p);
    if (q.amsgrad != 0) {
        tpu_kernel_fail(a, "adamw_step: amsgrad is not supported");
        return TPU_ERROR_NOT_SUPPORTED;
    }
    double step = (double)q.step;
    for (int k = 4; k < a->n; k++)
        if (t[k].is_scalar || tpu_tensor_numel(&t[k]) != 1)
            return tpu_kernel_fail(a, "adamw_step: operand %d (%s) must be a one-element tensor", k,
                                   k == 4 ? "step" : "found_inf");
    if (a->n > 5 && tpu_load_f64(tpu_elem_ptr(&t[5], 0), (tpu_dtype)t[5].dtype) != 0.0) return TPU_OK; /* skipped */
    if (a->n > 4) step = tpu_load_f64(tpu_elem_ptr(&t[4], 0), (tpu_dtype)t[4].dtype);
    if (!(step >= 1)) return tpu_kernel_fail(a, "adamw_step: step must be >= 1, got %g", step);
    for (int k = 0; k < 4; k++) {
        if (t[k].is_scalar || !tpu_dtype_is_float((tpu_dtype)t[k].dtype) || t[k].ndim != t[0].ndim)
            return tpu_kernel_fail(a, "adamw_step: operand %d must be a floating tensor shaped like param", k);
        for (int d = 0; d < t[0].ndim; d++)
            if (t[k].sizes[d] != t[0].sizes[d])
                return tpu_kernel_fail(a, "adamw_step: operand %d size %lld differs from param size %lld at dim %d", k,
                                       (long long)t[k].sizes[d], (long long)t[0].sizes[d], d);
    }
    double lr = q.lr, beta1 = q.beta1, beta2 = q.beta2, eps = q.eps, wd = q.weight_decay;
    double bc1 = 1.0 - pow(beta1, step), bc2 = 1.0 - pow(beta2, step);
    adamw_ctx x;
    memset(&x, 0, sizeof x);
    x.a = a;
    x.c.ddecay = q.l2 ? 1.0 : 1.0 - lr * wd;
    x.c.dl2 = q.l2 ? wd : 0.0;
    x.c.dgsign = q.maximize ? -1.0 : 1.0;
    x.c.l2 = (float)x.c.dl2;
    x.c.gsign = (float)x.c.dgsign;
    x.c.dw = 1.0 - beta1;
    x.c.dbeta2 = beta2;
    x.c.domb2 = 1.0 - beta2;
    x.c.dbc2s = sqrt(bc2);
    x.c.deps = eps;
    x.c.dnstep = -(lr / bc1);
    x.c.decay = (float)x.c.ddecay;
    x.c.w = (float)x.c.dw;
    x.c.beta2 = (float)x.c.dbeta2;
    x.c.omb2 = (float)x.c.domb2;
    x.c.bc2s = (float)x.c.dbc2s;
    x.c.eps = (float)x.c.deps;
    x.c.nstep = (float)x.c.dnstep;
    x.nd = t[0].ndim;
    memcpy(x.sizes, t[0].sizes, sizeof x.sizes);
    x.contig = true;
    for (int k = 0; k < 4; k++) x.contig &= adamw_contig(&t[k], &t[0]);
    int64_t n = tpu_tensor_numel(&t[0]);
    tpu_parallel_for(n, 16384, adamw_range, &x);
    return TPU_OK;
}

tpu_status tpu_k_optim(tpu_kargs *a) {
    if (a->op == TPU_OP_ADAMW_STEP) return adamw_step(a);
    return tpu_kernel_fail(a, "%s: not an optimizer op", tpu_op_name(a->op));
}
