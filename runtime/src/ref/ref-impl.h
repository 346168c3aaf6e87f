/* ref-impl.h - the reference floor (runtime/src/ref/): one naive
 * implementation of every op, never fast, never fused - the oracle the fast
 * kernels are tested against - and the operand checks and per-element
 * functions the fast kernels share with it. Uses only base/. */
#ifndef TPU_REF_IMPL_H
#define TPU_REF_IMPL_H
#include "base/base-impl.h"
#include "tpu/rng.h"
#include <stdbool.h>

/* tpu_ref_run (ref.c) dispatches by family (TPU_FAMILIES, tpu/ops.h) to
 * tpu_ref_ew, tpu_ref_red, ... (ref/ref_<family>.c). */
tpu_status tpu_ref_run(tpu_kargs *a);
#define TPU_REF_DECL_(e, fast, ref) tpu_status tpu_ref_##ref(tpu_kargs *a);
TPU_FAMILIES(TPU_REF_DECL_)
#undef TPU_REF_DECL_

/* A loop runner: fn(ctx, b, e) over disjoint ranges covering [0, n) (the
 * fast kernels pass tpu_parallel_for; NULL in the reference means serial). */
typedef void (*tpu_range_fn)(void *ctx, int64_t b, int64_t e);
typedef void (*tpu_for_fn)(int64_t n, int64_t grain, tpu_range_fn fn, void *ctx);

/* Shape ops written element by element (ref/ref_shape.c), shared by both
 * kernels: the window ops (im2col, col2im, max pooling) one (n, c) plane per
 * item, run by `for_each`; masked_select, a serial scan; tril/triu checks. */
tpu_status tpu_shape_window(tpu_kargs *a, tpu_for_fn for_each);
tpu_status tpu_masked_select(tpu_kargs *a);
tpu_status tpu_tri_check(tpu_kargs *a);

/* Operand checks shared by the fast and reference kernels of a family. */
/* GEMM (ref/ref_misc.c): ranks, inner sizes, batch and output shape. */
tpu_status tpu_gemm_check(tpu_kargs *a);
/* CONV2D's geometry, unpacked and checked against its operands. */
typedef struct tpu_conv_geom {
    int64_t N, C, H, W, O, OH, OW, G, Cg, Og, K; /* K = Cg * kh * kw */
    int kh, kw, sh, sw, ph, pw, dh, dw;
} tpu_conv_geom;
tpu_status tpu_conv2d_check(tpu_kargs *a, tpu_conv_geom *g);
/* FFT (ref/ref_fft.c): ranks, dtypes, sizes; *n is the transform length,
 * *lines the number of lines (positions of the dims other than dim). */
tpu_status tpu_fft_check(tpu_kargs *a, int *dim, int64_t *n, int64_t *lines);
/* Element offset in t of line `line` (row-major over the dims but dim). */
int64_t tpu_fft_line_off(const tpu_tensor *t, int dim, int64_t line);
/* RNN cells (ref/ref_rnn.c): *B, *H are the batch and hidden sizes. */
tpu_status tpu_rnn_check(tpu_kargs *a, int64_t *B, int64_t *H);

/* Attention (ref/ref_attn.c; ops.def: ATTN, ATTN_BWD): sizes, parameters and
 * the optional mask of a launch, checked against every operand. */
typedef struct tpu_attn_dims {
    int64_t B, H, Hk, L, S, E, Ev;
    double scale, dropout;
    bool causal, grad_mask;
    uint64_t seed, offset;
    const tpu_tensor *mask; /* NULL if none */
} tpu_attn_dims;
tpu_status tpu_attn_check(tpu_kargs *a, tpu_attn_dims *d);
/* Whether dropout keeps element n = ((b H + h) L + i) S + j (one Philox draw). */
bool tpu_attn_keep(const tpu_attn_dims *d, uint64_t n);

/* Linear algebra (ref/ref_linalg.c; ops.def: TRSM .. LU_PERM). A launch's
 * batch dims (nb of them, batch matrices) and matrix sizes: m x n of output 0
 * (TRSM: B; GETRS: m = the order, n = B's columns; LU_PERM: m = the
 * permutation's length, n = the pivots'; GESVD: A's). */
typedef struct tpu_linalg_dims {
    int nb;
    int64_t batch, m, n;
} tpu_linalg_dims;
/* Ranks, sizes and dtypes of every operand; fails the launch otherwise. */
tpu_status tpu_linalg_check(tpu_kargs *a, tpu_linalg_dims *d);
/* Element offset (t->offset included) of matrix b of t's first nb dims. */
int64_t tpu_linalg_batch_off(const tpu_tensor *t, int nb, int64_t b);
/* SYEV's info for a matrix with a non-finite element: what the CPU's LAPACK
 * (syevd) reports for one (0 for n <= 2, whose results are NaN). */
int64_t tpu_linalg_syev_failure(int64_t n, bool vectors);
/* The failure for a pivot outside [1, m] in matrix `batch`. */
tpu_status tpu_linalg_bad_pivot(tpu_kargs *a, const tpu_linalg_dims *d, int64_t batch, int64_t value);

/* Random fills (ref/ref_random.c): the per-element function shared by the
 * fast kernel (kernels/random.c) and the reference. */
/* The last Philox block computed (consecutive elements share blocks). */
typedef struct tpu_rand_cache {
    uint64_t g;
    uint32_t w[4];
    bool valid;
} tpu_rand_cache;

/* Value of element i; p_override is the bernoulli probability at that element. */
void tpu_random_element(const tpu_kargs *a, int64_t i, tpu_rand_cache *cache, double p_override, double *fv,
                        int64_t *iv);
/* Elements pos .. pos + n of random fill a as float32, each exactly
 * (float) of what tpu_random_element gives, with the Philox blocks made in
 * batches: for uniform of a float32 / float16 / bfloat16 output and
 * bernoulli with probability p (false, nothing written: another op). */
bool tpu_random_floats(const tpu_kargs *a, int64_t pos, int n, double p, float *out);
/* The same for bernoulli with probability p into bytes 0 / 1 (a bool output). */
void tpu_random_bernoulli_bytes(const tpu_kargs *a, int64_t pos, int n, double p, uint8_t *out);
/* Parameter checks shared by both kernels (from < to); fails the launch. */
tpu_status tpu_random_check(tpu_kargs *a);
/* The failure for a tensor of probabilities with a value outside [0, 1] (NaN included). */
tpu_status tpu_random_bad_p(tpu_kargs *a);
/* Compute element i and store it at multi-index idx of the output; false if
 * its bernoulli probability (read from a tensor) is outside [0, 1]. */
bool tpu_random_store(const tpu_kargs *a, int64_t i, const int64_t *idx, tpu_rand_cache *cache);
/* histc and bincount (ops.def): serial and exact, one implementation for
 * both the reference and the fast kernel (index.c); tested against hand
 * values in C and against PyTorch CPU in Python. */
tpu_status tpu_histogram(tpu_kargs *a);

#endif
