/* random.c - random fills from Philox4x32-10.
 *
 * Element i (row-major position in the output) takes `w` consecutive 32-bit
 * words of the Philox stream (seed, offset): block i*w/4, words from lane
 * (i*w)%4. w = 1 for 32-bit draws (float uniform, bernoulli), 2 for 64-bit
 * ones (double uniform, integer ranges, float normal: two uniforms), 4 for a
 * double normal. So element i depends on (seed, offset, i) only, whatever
 * the tiling, thread count or mode. The per-element function is shared by
 * the fast kernel (parallel, block cache, contiguous store) and the
 * reference (serial, one block per element, generic store). */
#include "kernels-impl.h"
#include "random-impl.h"
#include <math.h>

static int words_per_elem(const tpu_kargs *a) {
    bool f64 = a->t[0].dtype == TPU_F64;
    switch (a->op) {
    case TPU_OP_RAND_NORMAL: return f64 ? 4 : 2;
    case TPU_OP_RAND_INT: return 2;
    case TPU_OP_RAND_UNIFORM: return f64 ? 2 : 1;
    default: return 1;
    }
}

static double unit_from(const uint32_t *w, bool f64) {
    if (f64) return tpu_u64_to_unit_double(((uint64_t)w[1] << 32) | w[0]);
    return tpu_u32_to_unit_float(w[0]);
}

void tpu_random_element(const tpu_kargs *a, int64_t i, tpu_rand_cache *cache, double p_override, double *fv, int64_t *iv) {
    int wpe = words_per_elem(a);
    uint64_t word = (uint64_t)i * (uint64_t)wpe, g = word / 4;
    if (!cache->valid || cache->g != g) {
        tpu_philox_block((uint64_t)a->p.i[0], (uint64_t)a->p.i[1], g, cache->w);
        cache->g = g;
        cache->valid = true;
    }
    const uint32_t *w = cache->w + (word % 4);
    bool f64 = a->t[0].dtype == TPU_F64;
    switch (a->op) {
    case TPU_OP_RAND_UNIFORM: {
        double from = a->p.f[0], to = a->p.f[1];
        double v = from + unit_from(w, f64) * (to - from);
        if (!f64 && v >= to) v = from;     /* rounding to a narrower dtype must not give `to` */
        *fv = v;
        break;
    }
    case TPU_OP_RAND_NORMAL: {
        double u1 = 1.0 - unit_from(w, f64), u2 = unit_from(w + (f64 ? 2 : 1), f64);
        *fv = a->p.f[0] + a->p.f[1] * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        break;
    }
    case TPU_OP_RAND_BERNOULLI:
        *fv = tpu_u32_to_unit_float(w[0]) < p_override;
        break;
    case TPU_OP_RAND_INT: {
        uint64_t range = (uint64_t)(a->p.i[3] - a->p.i[2]);
        uint64_t x = ((uint64_t)w[1] << 32) | w[0];
        *iv = a->p.i[2] + (int64_t)(range ? x % range : 0);
        break;
    }
    default: break;
    }
}

/* Bernoulli with a tensor of probabilities: p read at the same position. */
static double bern_p(const tpu_kargs *a, const int64_t *idx) {
    if (a->n < 2) return a->p.f[0];
    const tpu_tensor *p = &a->t[1];
    if (p->is_scalar) return p->f;
    int64_t off = 0;
    for (int d = 0; d < p->ndim; d++) off += idx[d] * p->strides[d];
    return tpu_load_f64(tpu_elem_ptr(p, off), (tpu_dtype)p->dtype);
}

void tpu_random_store(const tpu_kargs *a, int64_t i, const int64_t *idx, tpu_rand_cache *cache) {
    const tpu_tensor *o = &a->t[0];
    int64_t off = 0;
    for (int d = 0; d < o->ndim; d++) off += idx[d] * o->strides[d];
    char *dst = tpu_elem_ptr(o, off);
    double fv = 0;
    int64_t iv = 0;
    tpu_random_element(a, i, cache, a->op == TPU_OP_RAND_BERNOULLI ? bern_p(a, idx) : 0.0, &fv, &iv);
    if (a->op == TPU_OP_RAND_INT) tpu_store_i64(dst, (tpu_dtype)o->dtype, iv);
    else tpu_store_f64(dst, (tpu_dtype)o->dtype, fv);
}

static bool is_contiguous(const tpu_tensor *t) {
    int64_t st = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->sizes[d] != 1 && t->strides[d] != st) return false;
        st *= t->sizes[d];
    }
    return true;
}

static void chunk(void *ctx, int64_t b, int64_t e) {
    const tpu_kargs *a = ctx;
    const tpu_tensor *o = &a->t[0];
    tpu_rand_cache cache = { 0 };
    bool scalar_p = a->op != TPU_OP_RAND_BERNOULLI || a->n < 2 || a->t[1].is_scalar;
    if (is_contiguous(o) && scalar_p && (o->dtype == TPU_F32 || o->dtype == TPU_BOOL)) {
        double p = a->n > 1 ? a->t[1].f : a->p.f[0];
        for (int64_t i = b; i < e; i++) {
            double fv = 0;
            int64_t iv = 0;
            tpu_random_element(a, i, &cache, p, &fv, &iv);
            if (o->dtype == TPU_F32) ((float *)o->base)[o->offset + i] = a->op == TPU_OP_RAND_INT ? (float)iv : (float)fv;
            else ((uint8_t *)o->base)[o->offset + i] = a->op == TPU_OP_RAND_INT ? iv != 0 : fv != 0;
        }
        return;
    }
    int64_t idx[TPU_MAX_DIMS], rem = b;
    for (int d = o->ndim - 1; d >= 0; d--) { idx[d] = rem % o->sizes[d]; rem /= o->sizes[d]; }
    for (int64_t i = b; i < e; i++) {
        tpu_random_store(a, i, idx, &cache);
        for (int d = o->ndim - 1; d >= 0; d--) {
            if (++idx[d] < o->sizes[d]) break;
            idx[d] = 0;
        }
    }
}

tpu_status tpu_k_random(tpu_kargs *a) {
    int64_t n = tpu_tensor_numel(&a->t[0]);
    if (a->op == TPU_OP_RAND_INT && a->p.i[3] <= a->p.i[2])
        return tpu_kernel_fail(a, "random_ expects 'from' to be less than 'to', but got from=%lld >= to=%lld",
                               (long long)a->p.i[2], (long long)a->p.i[3]);
    tpu_parallel_for(n, 1 << 14, chunk, a);
    return TPU_OK;
}
