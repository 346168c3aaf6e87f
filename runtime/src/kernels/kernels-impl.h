/* kernels-impl.h - the kernels floor (runtime/src/kernels/): fast kernels by
 * family, the registry mapping op -> kernel (registry.c), and what every
 * family shares (compute.c): CPU features and the compute pool interface.
 * Rows in and out of compute buffers (dtype conversion, vector types) are
 * the tile layer's: tile-impl.h; branch-free float math: vmath-impl.h.
 * Uses only ref/ and base/; the device (vtpu/) sits above and hands the
 * kernels its compute pool at start-up (tpu_kernels_set_compute). */
#ifndef TPU_KERNELS_IMPL_H
#define TPU_KERNELS_IMPL_H

#include "ref/ref-impl.h"
#include "tpu/device.h" /* tpu_mxu_kind (a type only: kernels call nothing there) */
#include <stdint.h>
#include <stddef.h>

/* Fast kernels by family (kernels/<family>.c): tpu_k_elementwise, tpu_k_reduce, ... */
#define TPU_K_DECL_(e, fast, ref) tpu_status tpu_k_##fast(tpu_kargs *a);
TPU_FAMILIES(TPU_K_DECL_)
#undef TPU_K_DECL_
/* One elementwise op of ops.def over n float32 lanes (elementwise.c),
 * for the graph floor's block interpreter: the fast kernel's own tile
 * function, so a fused group computes bit for bit what the op's launch
 * computes. tpu_ew_prepare_f says whether launch `a` computes in the float32
 * domain (compute dtype float32 / float16 / bfloat16; a COPY from such a
 * tensor) and pre-converts its parameters into *p; tpu_ew_tile_f then runs
 * the op on dense tiles (y, z: any tile for ops with fewer inputs). */
typedef struct tpu_ew_par {
    float ff[6];
    double fd[6];
    int64_t fi[6]; /* f[] as int64 (saturating) */
    int64_t pi[6]; /* i[] */
    int pow_mode;  /* POW with a host-scalar exponent */
    bool cbool;    /* compute dtype bool */
} tpu_ew_par;
bool tpu_ew_prepare_f(const tpu_kargs *a, tpu_ew_par *p);
void tpu_ew_tile_f(tpu_op op, int n, float *restrict o, const float *restrict x, const float *restrict y,
                   const float *restrict z, const tpu_ew_par *p);
/* The same with each result rounded to bfloat16 (and widened back) in the loop. */
void tpu_ew_tile_f_bf16(tpu_op op, int n, float *restrict o, const float *restrict x, const float *restrict y,
                        const float *restrict z, const tpu_ew_par *p);
/* Which build of the float tile functions runs (elementwise.c): AVX-512F
 * with FMA, AVX2 with FMA, or baseline C. Picked from the CPU on first use;
 * every one gives the same bits (its polynomials are fmaf), which the C
 * tests check by forcing each the host can run. */
enum { TPU_EW_ISA_BASE, TPU_EW_ISA_AVX2_FMA, TPU_EW_ISA_AVX512_FMA };
int tpu_ew_get_isa(void);
void tpu_ew_set_isa(int isa); /* tests only: not while kernels run */
/* Row reductions for the graph engine (reduce.c). Whether reduction launch
 * a (SUM, MEAN, AMAX, AMIN of floats over the last dim, read in place) folds
 * each output over one contiguous row of its input, so that a fused group
 * holding the row's values can reproduce the kernel's result bit for bit: */
bool tpu_red_row_exact(const tpu_kargs *a);
/* ... and that result (before its store: tpu_store_f64 to the output dtype)
 * from the row's n values x, as read from an input of dtype idt. */
double tpu_red_row_value(tpu_op op, tpu_dtype idt, const float *x, int64_t n);
/* One row of LAYER_NORM over float values (norm.c, for float32 / bfloat16 /
 * float16 inputs; the graph interpreter runs it on rows a fused group holds,
 * so a fused layer norm is its kernel's, bit for bit): the row's mean and
 * 1/sqrt(var + eps) (double accumulation, two passes) and y[0..M) =
 * (x - mean) * rstd [* w] [+ b] in float; w, b may be NULL. */
void tpu_ln_row_f(float *y, const float *x, int64_t M, const float *w, const float *b, double eps, double *mean,
                  double *rstd);
/* One line of SOFTMAX / LOG_SOFTMAX (in0: x) or of their backwards (in0:
 * grad, in1: y) over n contiguous floats (softmax.c): the float kernel's
 * own row code, which it runs whenever the output is contiguous along dim,
 * so a fused group holding the row gets the kernel's bits. */
void tpu_softmax_row_f(tpu_op op, float *out, const float *in0, const float *in1, int64_t n);
/* Which build of the attention micro-kernel runs (attention.c): 1 AVX-512
 * (where the CPU has it), 0 plain C. Picked on first use; tests force each. */
int tpu_attn_get_isa(void);
void tpu_attn_set_isa(int isa); /* tests only: not while kernels run */
/* Run the fast kernel of a.op (registry.c: dispatch by family). */
tpu_status tpu_kernel_run(tpu_kargs *a);
/* The unit gemm.c runs for fp32 (bf16 = false) or bf16 operands on this host:
 * "AVX512", "AVX512-BF16", "AVX2-FMA" or "portable" (a static string). */
const char *tpu_gemm_unit_name(bool bf16);

/* TPU_MXU: which matrix units the kernels may pick. */
typedef enum tpu_mxu_choice {
    TPU_MXU_CHOICE_AUTO = 0, /* the best unit the host has */
    TPU_MXU_CHOICE_PORTABLE, /* plain C only */
    TPU_MXU_CHOICE_NO_AMX,   /* the best unit but AMX tiles (AVX512-BF16 on an AMX host) */
} tpu_mxu_choice;

/* ---- the compute pool, provided by the floor above (compute.c) ----
 * The device registers its pool once at start-up (vtpu/pool.c, from the
 * first runtime entry); until then (kernel-only programs) loops run serially
 * on the calling thread. Thread-safe: the interface pointer is published
 * with release / read with acquire. */
typedef struct tpu_compute_iface {
    /* fn(ctx, begin, end) on disjoint ranges of [0, n) of at least `grain` items. */
    void (*parallel_for)(int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t b, int64_t e), void *ctx);
    int (*num_workers)(void); /* compute threads, the caller included */
    int mxu_choice;           /* TPU_MXU: a tpu_mxu_choice */
} tpu_compute_iface;
/* Borrowed: `c` must live as long as the process (a static). */
void tpu_kernels_set_compute(const tpu_compute_iface *c);

/* Parallel loop over [0, n) on the chip's compute workers: fn(ctx, begin, end)
 * is called on disjoint ranges of at least `grain` items (serial if small). */
void tpu_parallel_for(int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t b, int64_t e), void *ctx);
/* Compute threads a parallel loop may use (1 without a pool). */
int tpu_compute_workers(void);

/* ---- the host CPU (compute.c): probed once, cached ---- */
enum {
    TPU_CPU_AVX = 1u << 0,
    TPU_CPU_AVX2 = 1u << 1,
    TPU_CPU_AVX512F = 1u << 2,
    TPU_CPU_AVX512BF16 = 1u << 3, /* with the OS's AVX-512 state */
    TPU_CPU_AMX = 1u << 4,        /* AMX-TILE and AMX-BF16 in CPUID, tile state enabled by the OS */
    TPU_CPU_FMA = 1u << 5,        /* FMA3 (vfmadd231ps on ymm) */
};
unsigned tpu_cpu_features(void);
/* The matrix unit the kernels use for bf16: AMX if the host has it and the
 * OS grants this process the tile data (arch_prctl, asked once), else
 * AVX512-BF16, else AVX2-FMA, else portable; capped by the registered
 * TPU_MXU choice. fp32 at "highest" runs on AVX-512 FMAs where this says AMX. */
tpu_mxu_kind tpu_mxu_detected(void);
/* Whether this process may use AMX tiles (CPUID, XCR0 and the OS's
 * permission; cached). Ignores TPU_MXU. */
bool tpu_amx_usable(void);

#endif
