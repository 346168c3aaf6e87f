/* random-impl.h - the per-element random function shared by kernels/random.c and ref/. */
#ifndef TPU_RANDOM_IMPL_H
#define TPU_RANDOM_IMPL_H
#include "kernels-impl.h"

/* The last Philox block computed (consecutive elements share blocks). */
typedef struct tpu_rand_cache { uint64_t g; uint32_t w[4]; bool valid; } tpu_rand_cache;

/* Value of element i; p_override is the bernoulli probability at that element. */
void tpu_random_element(const tpu_kargs *a, int64_t i, tpu_rand_cache *cache, double p_override, double *fv, int64_t *iv);
/* Parameter checks shared by both kernels (from < to); fails the launch. */
tpu_status tpu_random_check(tpu_kargs *a);
/* The failure for a tensor of probabilities with a value outside [0, 1] (NaN included). */
tpu_status tpu_random_bad_p(tpu_kargs *a);
/* Compute element i and store it at multi-index idx of the output; false if
 * its bernoulli probability (read from a tensor) is outside [0, 1]. */
bool tpu_random_store(const tpu_kargs *a, int64_t i, const int64_t *idx, tpu_rand_cache *cache);
#endif
