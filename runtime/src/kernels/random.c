/* random.c - the fast random fill: the per-element Philox function of
 * ref/ref_random.c (which documents the stream layout and the ranges) run on
 * the compute workers, with a block cache and a contiguous store. */
#include "kernels/kernels-impl.h"
#include <stdatomic.h>

static bool is_contiguous(const tpu_tensor *t) {
    int64_t st = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->sizes[d] != 1 && t->strides[d] != st) return false;
        st *= t->sizes[d];
    }
    return true;
}

typedef struct rand_job {
    const tpu_kargs *a;
    atomic_bool bad_p;
} rand_job;

static void chunk(void *ctx, int64_t b, int64_t e) {
    rand_job *j = ctx;
    const tpu_kargs *a = j->a;
    const tpu_tensor *o = &a->t[0];
    tpu_rand_cache cache = {0};
    bool scalar_p = a->op != TPU_OP_RAND_BERNOULLI || a->n < 2 || a->t[1].is_scalar;
    if (is_contiguous(o) && scalar_p && (o->dtype == TPU_F32 || o->dtype == TPU_BOOL)) {
        double p = a->n > 1 ? a->t[1].f : tpu_unpack_RAND_BERNOULLI(&a->p).p; /* used by bernoulli only */
        for (int64_t i = b; i < e; i += 1 << 14) { /* uniform and bernoulli: Philox blocks in batches */
            int m = e - i < 1 << 14 ? (int)(e - i) : 1 << 14;
            if (o->dtype == TPU_BOOL && a->op == TPU_OP_RAND_BERNOULLI)
                tpu_random_bernoulli_bytes(a, i, m, p, (uint8_t *)o->base + o->offset + i);
            else if (o->dtype != TPU_F32 || !tpu_random_floats(a, i, m, p, (float *)o->base + o->offset + i))
                break;
            b = i + m;
        }
        for (int64_t i = b; i < e; i++) {
            double fv = 0;
            int64_t iv = 0;
            tpu_random_element(a, i, &cache, p, &fv, &iv);
            if (o->dtype == TPU_F32)
                ((float *)o->base)[o->offset + i] = a->op == TPU_OP_RAND_INT ? (float)iv : (float)fv;
            else
                ((uint8_t *)o->base)[o->offset + i] = a->op == TPU_OP_RAND_INT ? iv != 0 : fv != 0;
        }
        return;
    }
    int64_t idx[TPU_MAX_DIMS], rem = b;
    for (int d = o->ndim - 1; d >= 0; d--) {
        idx[d] = rem % o->sizes[d];
        rem /= o->sizes[d];
    }
    bool ok = true;
    for (int64_t i = b; i < e; i++) {
        ok &= tpu_random_store(a, i, idx, &cache);
        for (int d = o->ndim - 1; d >= 0; d--) {
            if (++idx[d] < o->sizes[d]) break;
            idx[d] = 0;
        }
    }
    if (!ok) atomic_store_explicit(&j->bad_p, true, memory_order_relaxed);
}

tpu_status tpu_k_random(tpu_kargs *a) {
    int64_t n = tpu_tensor_numel(&a->t[0]);
    tpu_status s = tpu_random_check(a);
    if (s) return s;
    rand_job j = {.a = a};
    atomic_init(&j.bad_p, false);
    tpu_parallel_for(n, 1 << 14, chunk, &j);
    return atomic_load_explicit(&j.bad_p, memory_order_relaxed) ? tpu_random_bad_p(a) : TPU_OK;
}
