/* random.c - random fills from Philox4x32-10.
 *
 * Element i (row-major position in the output) uses Philox block (seed,
 * offset, i) and its 4 words: words 0-1 make its uniform (53 bits for
 * float64, 24 for others), words 2-3 the Box-Muller partner for normals and
 * the high bits for integer ranges. One block per element wastes entropy but
 * keeps "element i depends on (seed, offset, i) only" trivially true. The
 * same per-element function serves the fast kernel (parallel, any strides)
 * and the reference (serial). */
#include "kernels-impl.h"
#include "random-impl.h"
#include <math.h>

static double unit(const uint32_t w[4], int lo, tpu_dtype dt) {
    if (dt == TPU_F64) return tpu_u64_to_unit_double(((uint64_t)w[lo + 1] << 32) | w[lo]);
    return tpu_u32_to_unit_float(w[lo]);
}

void tpu_random_element(const tpu_kargs *a, int64_t i, double *fv, int64_t *iv) {
    uint32_t w[4];
    tpu_philox_block((uint64_t)a->p.i[0], (uint64_t)a->p.i[1], (uint64_t)i, w);
    tpu_dtype dt = (tpu_dtype)a->t[0].dtype;
    switch (a->op) {
    case TPU_OP_RAND_UNIFORM: {
        double from = a->p.f[0], to = a->p.f[1];
        double v = from + unit(w, 0, dt) * (to - from);
        /* Rounding to a narrower dtype must not produce `to` itself. */
        if (dt != TPU_F64 && v >= to) v = from;
        *fv = v;
        break;
    }
    case TPU_OP_RAND_NORMAL: {
        double u1 = 1.0 - unit(w, 0, TPU_F64), u2 = unit(w, 2, TPU_F64);
        *fv = a->p.f[0] + a->p.f[1] * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        break;
    }
    case TPU_OP_RAND_BERNOULLI:
        *fv = unit(w, 0, TPU_F32) < a->p.f[0];
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
    const tpu_tensor *p = &a->t[1];
    if (p->is_scalar) return p->f;
    int64_t off = 0;
    for (int d = 0; d < p->ndim; d++) off += idx[d] * p->strides[d];
    return tpu_load_f64(tpu_elem_ptr(p, off), (tpu_dtype)p->dtype);
}

void tpu_random_store(const tpu_kargs *a, int64_t i, const int64_t *idx) {
    const tpu_tensor *o = &a->t[0];
    int64_t off = 0;
    for (int d = 0; d < o->ndim; d++) off += idx[d] * o->strides[d];
    char *dst = tpu_elem_ptr(o, off);
    double fv = 0; int64_t iv = 0;
    if (a->op == TPU_OP_RAND_BERNOULLI && a->n > 1) {
        tpu_kargs tmp = *a;
        tmp.p.f[0] = bern_p(a, idx);
        tpu_random_element(&tmp, i, &fv, &iv);
    } else {
        tpu_random_element(a, i, &fv, &iv);
    }
    if (a->op == TPU_OP_RAND_INT) tpu_store_i64(dst, (tpu_dtype)o->dtype, iv);
    else tpu_store_f64(dst, (tpu_dtype)o->dtype, fv);
}

static void chunk(void *ctx, int64_t b, int64_t e) {
    const tpu_kargs *a = ctx;
    const tpu_tensor *o = &a->t[0];
    int64_t idx[TPU_MAX_DIMS], rem = b;
    for (int d = o->ndim - 1; d >= 0; d--) { idx[d] = rem % o->sizes[d]; rem /= o->sizes[d]; }
    for (int64_t i = b; i < e; i++) {
        tpu_random_store(a, i, idx);
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
