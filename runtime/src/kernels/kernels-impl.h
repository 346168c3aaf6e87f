/* kernels-impl.h - what a kernel sees, shared by fast (kernels/) and reference (ref/) kernels.
 *
 * A kernel gets a tpu_kargs: the op, its operands with `base` already
 * translated to a host-addressable pointer (the vTPU's device memory), and
 * the parameters. Launch-time validation (arity, ranks, storage bounds) has
 * already been done; a kernel checks data-dependent things (index ranges)
 * and reports failures with tpu_kernel_fail(), which names the op. */
#ifndef TPU_KERNELS_IMPL_H
#define TPU_KERNELS_IMPL_H

#include "tpu/tpu.h"
#include <stdint.h>
#include <stddef.h>

typedef struct tpu_kargs {
    tpu_op op;
    int n;                               /* operands: outputs first */
    tpu_tensor t[TPU_MAX_OPERANDS];      /* t[k].base is a host pointer here */
    tpu_params p;
    char err[256];                       /* filled by tpu_kernel_fail */
} tpu_kargs;

typedef tpu_status (*tpu_kernel_fn)(tpu_kargs *a);

/* Per-ISA clones of hot loops (AVX-512 / AVX2 / baseline, picked at load
 * time by an ifunc). ThreadSanitizer crashes on ifunc resolvers that run
 * before it is initialized, so TSan builds get the baseline only. */
#if defined(__SANITIZE_THREAD__) || defined(TPU_NO_CLONES)
#define TPU_TARGET_CLONES
#else
#define TPU_TARGET_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

/* Record a kernel failure; returns TPU_ERROR_KERNEL for `return tpu_kernel_fail(...)`. */
tpu_status tpu_kernel_fail(tpu_kargs *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Fast kernels by family (kernels/<family>.c); ref kernels (ref/ref.c). */
tpu_status tpu_k_elementwise(tpu_kargs *a);
tpu_status tpu_k_reduce(tpu_kargs *a);
tpu_status tpu_k_scan(tpu_kargs *a);
tpu_status tpu_k_gemm(tpu_kargs *a);
tpu_status tpu_k_softmax(tpu_kargs *a);
tpu_status tpu_k_loss(tpu_kargs *a);
tpu_status tpu_k_norm(tpu_kargs *a);
tpu_status tpu_k_index(tpu_kargs *a);
tpu_status tpu_k_random(tpu_kargs *a);
tpu_status tpu_k_optim(tpu_kargs *a);
tpu_status tpu_k_shape(tpu_kargs *a);
tpu_status tpu_k_rnn(tpu_kargs *a);
/* Reference: one naive implementation of every op, never fast, never fused.
 * tpu_ref_run dispatches by family to tpu_ref_<family> (ref/ref_<family>.c). */
tpu_status tpu_ref_run(tpu_kargs *a);
tpu_status tpu_ref_ew(tpu_kargs *a);
tpu_status tpu_ref_red(tpu_kargs *a);
tpu_status tpu_ref_scan(tpu_kargs *a);
tpu_status tpu_ref_gemm(tpu_kargs *a);
tpu_status tpu_ref_softmax(tpu_kargs *a);
tpu_status tpu_ref_loss(tpu_kargs *a);
tpu_status tpu_ref_norm(tpu_kargs *a);
tpu_status tpu_ref_index(tpu_kargs *a);
tpu_status tpu_ref_random(tpu_kargs *a);
tpu_status tpu_ref_optim(tpu_kargs *a);
tpu_status tpu_ref_shape(tpu_kargs *a);
tpu_status tpu_ref_rnn(tpu_kargs *a);
/* Operand checks of an RNN-family launch, shared by the fast and reference
 * kernels (ref/ref_rnn.c): *B, *H are the batch and hidden sizes. */
tpu_status tpu_rnn_check(tpu_kargs *a, int64_t *B, int64_t *H);
/* Run the fast kernel of a.op (dispatch by family). */
tpu_status tpu_kernel_run(tpu_kargs *a);

/* Parallel loop over [0, n) on the chip's compute workers: fn(ctx, begin, end)
 * is called on disjoint ranges of at least `grain` items (serial if small). */
void tpu_parallel_for(int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t b, int64_t e), void *ctx);

/* Element pointer helpers. */
static inline char *tpu_elem_ptr(const tpu_tensor *t, int64_t elem_off) {
    return (char *)t->base + (size_t)(t->offset + elem_off) * tpu_dtype_size((tpu_dtype)t->dtype);
}

/* bf16 / f16 conversions (round to nearest even). */
static inline float tpu_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; return v.f;
}
static inline uint16_t tpu_f32_to_bf16(float f) {
    union { uint32_t u; float f; } v; v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* quiet NaN */
    uint32_t r = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + r) >> 16);
}
static inline float tpu_f16_to_f32(uint16_t h) { _Float16 x; __builtin_memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t tpu_f32_to_f16(float f) { _Float16 x = (_Float16)f; uint16_t h; __builtin_memcpy(&h, &x, 2); return h; }

/* Generic load/store of one element converted to/from double and int64. */
double tpu_load_f64(const void *p, tpu_dtype dt);
int64_t tpu_load_i64(const void *p, tpu_dtype dt);
void tpu_store_f64(void *p, tpu_dtype dt, double v);
void tpu_store_i64(void *p, tpu_dtype dt, int64_t v);

#endif
