/* random-impl.h - the per-element random function shared by kernels/random.c and ref/. */
#ifndef TPU_RANDOM_IMPL_H
#define TPU_RANDOM_IMPL_H
#include "kernels-impl.h"

/* The last Philox block computed (consecutive elements share blocks). */
typedef struct tpu_rand_cache { uint64_t g; uint32_t w[4]; bool valid; } tpu_rand_cache;

/* Value of element i; p_override is the bernoulli probability at that element. */
void tpu_random_element(const tpu_kargs *a, int64_t i, tpu_rand_cache *cache, double p_override, double *fv, int64_t *iv);
/* Compute element i and store it at multi-index idx of the output. */
void tpu_random_store(const tpu_kargs *a, int64_t i, const int64_t *idx, tpu_rand_cache *cache);
#endif
