/* tile-impl.h - the shared tile layer of the kernels floor: what every kernel
 * family needs to move a row of any dtype in and out of a compute buffer.
 *
 *   - TPU_TILE, the row length kernels buffer at a time;
 *   - the GCC vector types the families compute with (vf8, vd4, ...), and
 *     bf16 <-> float conversion of whole 8- and 16-lane vectors;
 *   - branch-free scalar float16 <-> float32, bit for bit equal to the
 *     _Float16 casts of base-impl.h (tpu_f16_to_f32, tpu_f32_to_f16), NaN
 *     payloads included, but free of library calls and branches so the
 *     loops using them vectorize (the casts are calls into libgcc on CPUs
 *     without F16C). bfloat16 needs nothing new: tpu_bf16_to_f32 and
 *     tpu_f32_to_bf16 of base-impl.h vectorize as they are;
 *   - row load and store (tile.c): n elements of any dtype at any stride,
 *     converted into or out of a float32, float64 or int64 buffer.
 *
 * DESIGN. A family kernel computes in one of three domains: float32 (for
 * float32 / float16 / bfloat16 data), float64, or int64. tpu_tile_load_*
 * gathers a row into a dense buffer of the domain type and tpu_tile_store_*
 * scatters it back, rounding once; the kernel's math then runs over dense,
 * restrict-qualified buffers with fixed trip counts, which is what gcc -O2
 * vectorizes. Contiguous rows are converted TPU_TILE elements at a time,
 * then in blocks of 16, with fixed trip counts too; the row functions are
 * target_clones'd (AVX-512 / AVX2 / baseline).
 *
 * Conversions (those of tpu_load_f64 / tpu_store_f64, the reference's, with
 * the exceptions named):
 *   load   float dtypes: exact widening, or C rounding to float32 (f64 data
 *          into the float32 domain), or C truncation toward zero into int64
 *          (NaN and out-of-range values are undefined in C: whatever the
 *          instruction gives); integers: C conversion (int64 into float32
 *          rounds once, where tpu_load_f64 would round twice through
 *          double); bool: a nonzero byte -> 1.
 *   store  float32 / float64 by C conversion; float16 and bfloat16 through
 *          float32 (rounding to nearest even; from float64 that is two
 *          roundings, as tpu_store_f64 does); integer dtypes through int64
 *          then truncated to the width (wrapping); bool: nonzero -> 1 (NaN
 *          is nonzero).
 *
 * Ownership: every pointer is borrowed for the duration of the call. A
 * destination must not overlap its source (they are restrict). Strides and
 * offsets are in elements of the data's dtype and may be zero or negative;
 * src / dst point at the row's first element (offset already applied).
 * Thread-safety: pure functions of their arguments, no state: safe from any
 * thread, on disjoint destinations. */
#ifndef TPU_TILE_IMPL_H
#define TPU_TILE_IMPL_H

#include "kernels/kernels-impl.h"
#include "kernels/vmath-impl.h" /* ew_f2b / ew_b2f: float <-> bits */
#include <stdint.h>
#include <string.h>

/* Elements a kernel buffers per row at a time (elementwise tiles, reduce
 * chunks, gather buffers). */
#define TPU_TILE 256

#define TPU_TILE_INLINE static inline __attribute__((always_inline))

/* ---- GCC vector types (16 to 64 bytes) ---- */

typedef float vf4 __attribute__((vector_size(16)));
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf16 __attribute__((vector_size(64)));
typedef double vd4 __attribute__((vector_size(32)));
typedef double vd8 __attribute__((vector_size(64)));
typedef int32_t vi8 __attribute__((vector_size(32)));
typedef int32_t vi16 __attribute__((vector_size(64)));
typedef uint32_t vu8 __attribute__((vector_size(32)));
typedef uint32_t vu16 __attribute__((vector_size(64)));
typedef uint16_t vh8 __attribute__((vector_size(16)));
typedef uint16_t vh16 __attribute__((vector_size(32)));
typedef int64_t vl8 __attribute__((vector_size(64)));

/* ---- scalar conversions, branch-free ---- */

/* c ? a : b through a mask (a ?: on computed values can block vectorization). */
TPU_TILE_INLINE uint32_t tpu_tile_selu(int c, uint32_t a, uint32_t b) {
    uint32_t m = -(uint32_t)c;
    return (a & m) | (b & ~m);
}

/* float16 -> float32: exact. Subnormals through an exact int -> float
 * multiply; a signaling NaN comes out quiet, as from the cast. */
TPU_TILE_INLINE float tpu_tile_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
    uint32_t special = (em << 13) | 0x7f800000u | tpu_tile_selu(em > 0x7c00u, 0x00400000u, 0); /* quiet NaN */
    uint32_t r = tpu_tile_selu(em >= 0x7c00u, special, (em << 13) + 0x38000000u);
    float sub = (float)(int32_t)em * 5.9604644775390625e-8f; /* subnormal: em * 2^-24 */
    r = tpu_tile_selu(em < 0x400u, (uint32_t)ew_f2b(sub), r);
    return ew_b2f((int32_t)(r | sign));
}

/* float32 -> float16, rounding to nearest even; overflow -> inf; a NaN keeps
 * its sign and the top of its payload and comes out quiet, as from the cast. */
TPU_TILE_INLINE uint16_t tpu_tile_f32_to_f16(float f) {
    uint32_t x = (uint32_t)ew_f2b(f), sign = x & 0x80000000u;
    x ^= sign;
    uint32_t sub = (uint32_t)ew_f2b(ew_b2f((int32_t)x) + 0.5f) - 0x3f000000u; /* subnormal: rounds in the add */
    uint32_t nrm = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;                /* rebias, round to even */
    uint32_t o = tpu_tile_selu(x < 0x38800000u, sub, nrm);
    uint32_t nan = 0x7e00u | ((x >> 13) & 0x3ffu);
    o = tpu_tile_selu(x >= 0x47800000u, tpu_tile_selu(x > 0x7f800000u, nan, 0x7c00u), o);
    return (uint16_t)((sign >> 16) | o);
}

/* ---- bf16 <-> float on whole vectors (W = 8 or 16 lanes) ----
 * Vectors go by pointer: by value they would trip -Wpsabi in clones
 * without AVX. Same rounding as tpu_f32_to_bf16. */
#define TPU_TILE_VBF16_(W)                                                       \
    TPU_TILE_INLINE void tpu_tile_vload_bf16x##W(vf##W *v, const uint16_t *p) {  \
        vh##W h;                                                                 \
        memcpy(&h, p, sizeof h);                                                 \
        *v = (vf##W)(__builtin_convertvector(h, vu##W) << 16);                   \
    }                                                                            \
    TPU_TILE_INLINE void tpu_tile_vstore_bf16x##W(uint16_t *p, const vf##W *v) { \
        vu##W u = (vu##W) * v;                                                   \
        vu##W r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;                        \
        vi##W nan = (vi##W)((u & 0x7fffffffu) > 0x7f800000u);                    \
        r = (vu##W)((nan & (vi##W)((u >> 16) | 0x40u)) | (~nan & (vi##W)r));     \
        vh##W h = __builtin_convertvector(r, vh##W);                             \
        memcpy(p, &h, sizeof h);                                                 \
    }
TPU_TILE_VBF16_(8)
TPU_TILE_VBF16_(16)
#undef TPU_TILE_VBF16_

/* ---- rows ----
 * load:  dst[i] = src[i * stride] converted to the domain, i in [0, n).
 * store: dst[i * stride] = src[i] converted to dt, i in [0, n).
 * The _at forms address element i at base + off[i] (a table of element
 * offsets, for rows no single stride describes). n <= 0 does nothing; a dt
 * outside tpu_dtype leaves the destination untouched.
 *
 * A contiguous row already of the domain type is a plain copy, done inline
 * here (runs of a few dozen elements, as in rnn, would otherwise pay a call);
 * everything else is converted by the _conv functions of tile.c. */
void tpu_tile_load_f32_conv(float *restrict dst, const void *src, int64_t stride, int64_t n, tpu_dtype dt);
void tpu_tile_load_f64_conv(double *restrict dst, const void *src, int64_t stride, int64_t n, tpu_dtype dt);
void tpu_tile_load_i64_conv(int64_t *restrict dst, const void *src, int64_t stride, int64_t n, tpu_dtype dt);
void tpu_tile_store_f32_conv(void *dst, int64_t stride, const float *restrict src, int64_t n, tpu_dtype dt);
void tpu_tile_store_f64_conv(void *dst, int64_t stride, const double *restrict src, int64_t n, tpu_dtype dt);
void tpu_tile_store_i64_conv(void *dst, int64_t stride, const int64_t *restrict src, int64_t n, tpu_dtype dt);

#define TPU_TILE_ROW_(SFX, T, DT)                                                                          \
    TPU_TILE_INLINE void tpu_tile_load_##SFX(T *restrict dst, const void *src, int64_t stride, int64_t n,  \
                                             tpu_dtype dt) {                                               \
        if (dt != DT || stride != 1)                                                                       \
            tpu_tile_load_##SFX##_conv(dst, src, stride, n, dt);                                           \
        else if (n > 0)                                                                                    \
            memcpy(dst, src, (size_t)n * sizeof *dst);                                                     \
    }                                                                                                      \
    TPU_TILE_INLINE void tpu_tile_store_##SFX(void *dst, int64_t stride, const T *restrict src, int64_t n, \
                                              tpu_dtype dt) {                                              \
        if (dt != DT || stride != 1)                                                                       \
            tpu_tile_store_##SFX##_conv(dst, stride, src, n, dt);                                          \
        else if (n > 0)                                                                                    \
            memcpy(dst, src, (size_t)n * sizeof *src);                                                     \
    }
TPU_TILE_ROW_(f32, float, TPU_F32)
TPU_TILE_ROW_(f64, double, TPU_F64)
TPU_TILE_ROW_(i64, int64_t, TPU_I64)
#undef TPU_TILE_ROW_

void tpu_tile_load_f32_at(float *restrict dst, const void *base, const int64_t *off, int64_t n, tpu_dtype dt);
void tpu_tile_load_f64_at(double *restrict dst, const void *base, const int64_t *off, int64_t n, tpu_dtype dt);
void tpu_tile_store_f32_at(void *base, const int64_t *off, const float *restrict src, int64_t n, tpu_dtype dt);
void tpu_tile_store_f64_at(void *base, const int64_t *off, const double *restrict src, int64_t n, tpu_dtype dt);

/* ---- iteration spaces ----
 * The space of output view o walked over nop operand views t[k]: size-1
 * dims dropped, adjacent dims contiguous across every operand merged, so a
 * contiguous or simply broadcast launch becomes one long row. A host scalar,
 * or an operand of another rank than o, gets stride 0 (broadcast). Writes
 * sz[0 .. *nd) and st[k][0 .. *nd) (at least one dim); returns numel. */
int64_t tpu_tile_coalesce(const tpu_tensor *o, int nop, const tpu_tensor *const *t, int64_t *sz,
                          int64_t (*st)[TPU_MAX_DIMS], int *nd);

/* The same space with its dims first put in the order of o's memory
 * (largest stride outermost; equal strides keep their order), as PyTorch's
 * TensorIterator walks it: a channels-last or permuted output is then
 * written contiguously and merges into long rows. For launches whose result
 * does not depend on the order elements are visited in (not ARANGE, whose
 * values follow the logical index). */
int64_t tpu_tile_coalesce_by_out(const tpu_tensor *o, int nop, const tpu_tensor *const *t, int64_t *sz,
                                 int64_t (*st)[TPU_MAX_DIMS], int *nd);

#endif
