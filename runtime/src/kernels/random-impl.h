/* random-impl.h - the per-element random function shared by kernels/random.c and ref/. */
#ifndef TPU_RANDOM_IMPL_H
#define TPU_RANDOM_IMPL_H
#include "kernels-impl.h"
void tpu_random_element(const tpu_kargs *a, int64_t i, double *fv, int64_t *iv);
void tpu_random_store(const tpu_kargs *a, int64_t i, const int64_t *idx);
#endif
