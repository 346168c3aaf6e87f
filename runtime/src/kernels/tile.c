/* tile.c - row load and store with dtype conversion, for every kernel family
 * (the contract is in tile-impl.h).
 *
 * Each function is one switch over the data dtype around a typed loop. A
 * contiguous row runs whole TPU_TILE tiles, then blocks of 16, then single
 * elements: the first two have fixed trip counts, which gcc -O2's very-cheap
 * vectorizer cost model requires (no runtime alias checks, no epilogue). */
#include "kernels/tile-impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TILE_CLONES TPU_TARGET_CLONES
#else
#define TILE_CLONES
#endif
#define TILE_BLK 16

/* Where element i of the data is: contiguous, strided, through a table. */
#define TILE_AT_C(i) (i)
#define TILE_AT_S(i) ((i) * stride)
#define TILE_AT_T(i) (off[i])

/* The loop over a row of n at `stride`: MOVE(AT, i) moves element i. */
#define TILE_ROW(MOVE)                                                      \
    if (stride == 1) {                                                      \
        int64_t i0 = 0;                                                     \
        for (; i0 + TPU_TILE <= n; i0 += TPU_TILE)                          \
            for (int64_t k = 0; k < TPU_TILE; k++) MOVE(TILE_AT_C, i0 + k); \
        for (; i0 + TILE_BLK <= n; i0 += TILE_BLK)                          \
            for (int64_t k = 0; k < TILE_BLK; k++) MOVE(TILE_AT_C, i0 + k); \
        for (; i0 < n; i0++) MOVE(TILE_AT_C, i0);                           \
    } else {                                                                \
        for (int64_t i = 0; i < n; i++) MOVE(TILE_AT_S, i);                 \
    }

/* One typed loop per data dtype: DO(T, MOVE) emits the loop over data of
 * type T with the element move TILE_LD1_##MOVE (loads) or TILE_ST1_##MOVE
 * (stores); F / I / H / B / Z name the move for float, integer, float16,
 * bfloat16 and bool data. */
#define TILE_SWITCH(DO, F, I, H, B, Z) \
    switch (dt) {                      \
    case TPU_F32: DO(float, F);        \
    case TPU_F64: DO(double, F);       \
    case TPU_F16: DO(uint16_t, H);     \
    case TPU_BF16: DO(uint16_t, B);    \
    case TPU_U8: DO(uint8_t, I);       \
    case TPU_I8: DO(int8_t, I);        \
    case TPU_I16: DO(int16_t, I);      \
    case TPU_I32: DO(int32_t, I);      \
    case TPU_I64: DO(int64_t, I);      \
    case TPU_BOOL: DO(uint8_t, Z);     \
    default: break;                    \
    }

/* ---- loads ---- */

#define TILE_LD(T, MOVE)             \
    {                                \
        const T *q = (const T *)src; \
        TILE_ROW(TILE_LD1_##MOVE)    \
    }                                \
    break
#define TILE_LD_AT(T, MOVE)                                            \
    {                                                                  \
        const T *q = (const T *)base;                                  \
        for (int64_t i = 0; i < n; i++) TILE_LD1_##MOVE(TILE_AT_T, i); \
    }                                                                  \
    break
#define TILE_LD1_F32(AT, i) d[i] = (float)q[AT(i)]
#define TILE_LD1_F64(AT, i) d[i] = (double)q[AT(i)]
#define TILE_LD1_I64(AT, i) d[i] = (int64_t)q[AT(i)]
#define TILE_LD1_H2F(AT, i) d[i] = tpu_tile_f16_to_f32(q[AT(i)])
#define TILE_LD1_H2I(AT, i) d[i] = (int64_t)tpu_tile_f16_to_f32(q[AT(i)])
#define TILE_LD1_B2F(AT, i) d[i] = tpu_bf16_to_f32(q[AT(i)])
#define TILE_LD1_B2I(AT, i) d[i] = (int64_t)tpu_bf16_to_f32(q[AT(i)])
#define TILE_LD1_NZF(AT, i) d[i] = (float)(q[AT(i)] != 0)
#define TILE_LD1_NZD(AT, i) d[i] = (double)(q[AT(i)] != 0)
#define TILE_LD1_NZI(AT, i) d[i] = (int64_t)(q[AT(i)] != 0)

TILE_CLONES void tpu_tile_load_f32_conv(float *restrict d, const void *src, int64_t stride, int64_t n, tpu_dtype dt) {
    TILE_SWITCH(TILE_LD, F32, F32, H2F, B2F, NZF);
}
TILE_CLONES void tpu_tile_load_f64_conv(double *restrict d, const void *src, int64_t stride, int64_t n, tpu_dtype dt) {
    TILE_SWITCH(TILE_LD, F64, F64, H2F, B2F, NZD);
}
TILE_CLONES void tpu_tile_load_i64_conv(int64_t *restrict d, const void *src, int64_t stride, int64_t n, tpu_dtype dt) {
    TILE_SWITCH(TILE_LD, I64, I64, H2I, B2I, NZI);
}
TILE_CLONES void tpu_tile_load_f32_at(float *restrict d, const void *base, const int64_t *off, int64_t n,
                                      tpu_dtype dt) {
    TILE_SWITCH(TILE_LD_AT, F32, F32, H2F, B2F, NZF);
}
TILE_CLONES void tpu_tile_load_f64_at(double *restrict d, const void *base, const int64_t *off, int64_t n,
                                      tpu_dtype dt) {
    TILE_SWITCH(TILE_LD_AT, F64, F64, H2F, B2F, NZD);
}

/* ---- stores ---- */

#define TILE_ST(T, MOVE)          \
    {                             \
        T *q = (T *)dst;          \
        TILE_ROW(TILE_ST1_##MOVE) \
    }                             \
    break
#define TILE_ST_AT(T, MOVE)                                            \
    {                                                                  \
        T *q = (T *)base;                                              \
        for (int64_t i = 0; i < n; i++) TILE_ST1_##MOVE(TILE_AT_T, i); \
    }                                                                  \
    break
#define TILE_ST1_ID(AT, i)  q[AT(i)] = s[i]          /* C conversion to the data type */
#define TILE_ST1_INT(AT, i) q[AT(i)] = (int64_t)s[i] /* through int64, then truncated */
#define TILE_ST1_F2H(AT, i) q[AT(i)] = tpu_tile_f32_to_f16((float)s[i])
#define TILE_ST1_F2B(AT, i) q[AT(i)] = tpu_f32_to_bf16((float)s[i])
#define TILE_ST1_NZ(AT, i)  q[AT(i)] = s[i] != 0

/* Float data take the plain C conversion, float16 / bfloat16 go through
 * float32, integer data through int64. */
#define TILE_STORE_SWITCH(DO) TILE_SWITCH(DO, ID, INT, F2H, F2B, NZ)

#if defined(__x86_64__) && defined(__GNUC__)
/* float32 -> contiguous bfloat16 by vcvtneps2bf16, 16 at a time; returns the
 * elements done. It rounds to nearest even and quiets a NaN (top bits | 0x40)
 * as tpu_f32_to_bf16 does, but reads a subnormal input as zero: a block of
 * 16 holding one takes the integer path. One instruction where the integer
 * path takes about ten per 8 elements, which bounded bf16 GEMM epilogues. */
__attribute__((target("avx512f,avx512bf16,avx512vl"))) static int64_t
store_bf16_avx512bf16(uint16_t *q, const float *restrict s, int64_t n) {
    const __m512i mag = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
    const __m512i sub = _mm512_set1_epi32(0x007ffffe); /* |x| - 1 <= this: |x| is subnormal */
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(s + i);
        __m512i m = _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(v), mag), one);
        if (_mm512_cmple_epu32_mask(m, sub)) {
            vf16 w;
            memcpy(&w, s + i, sizeof w);
            tpu_tile_vstore_bf16x16(q + i, &w);
        } else {
            __m256bh h = _mm512_cvtneps_pbh(v);
            memcpy(q + i, &h, sizeof h);
        }
    }
    return i;
}
#define TILE_BF16_CVT 1
#endif

/* float32 -> contiguous bfloat16 in whole vectors: faster than what gcc
 * makes of the scalar loop (the same rounding). */
TPU_TILE_INLINE void tile_store_bf16_contig(uint16_t *q, const float *restrict s, int64_t n) {
    int64_t i = 0;
#ifdef TILE_BF16_CVT
    if (n >= 16 && (tpu_cpu_features() & TPU_CPU_AVX512BF16)) i = store_bf16_avx512bf16(q, s, n);
#endif
    for (; i + 8 <= n; i += 8) {
        vf8 v;
        memcpy(&v, s + i, sizeof v);
        tpu_tile_vstore_bf16x8(q + i, &v);
    }
    for (; i < n; i++) q[i] = tpu_f32_to_bf16(s[i]);
}

TILE_CLONES void tpu_tile_store_f32_conv(void *dst, int64_t stride, const float *restrict s, int64_t n, tpu_dtype dt) {
    if (dt == TPU_BF16 && stride == 1) {
        tile_store_bf16_contig(dst, s, n);
        return;
    }
    TILE_STORE_SWITCH(TILE_ST);
}
TILE_CLONES void tpu_tile_store_f64_conv(void *dst, int64_t stride, const double *restrict s, int64_t n, tpu_dtype dt) {
    TILE_STORE_SWITCH(TILE_ST);
}
TILE_CLONES void tpu_tile_store_i64_conv(void *dst, int64_t stride, const int64_t *restrict s, int64_t n,
                                         tpu_dtype dt) {
    TILE_STORE_SWITCH(TILE_ST);
}
TILE_CLONES void tpu_tile_store_f32_at(void *base, const int64_t *off, const float *restrict s, int64_t n,
                                       tpu_dtype dt) {
    TILE_STORE_SWITCH(TILE_ST_AT);
}
TILE_CLONES void tpu_tile_store_f64_at(void *base, const int64_t *off, const double *restrict s, int64_t n,
                                       tpu_dtype dt) {
    TILE_STORE_SWITCH(TILE_ST_AT);
}

int64_t tpu_tile_coalesce(const tpu_tensor *o, int nop, const tpu_tensor *const *t, int64_t *sz,
                          int64_t (*st)[TPU_MAX_DIMS], int *nd_out) {
    int nd = 0;
    int64_t numel = 1;
    for (int d = 0; d < o->ndim; d++) {
        numel *= o->sizes[d];
        if (o->sizes[d] == 1) continue;
        for (int k = 0; k < nop; k++) st[k][nd] = (t[k]->is_scalar || t[k]->ndim != o->ndim) ? 0 : t[k]->strides[d];
        sz[nd] = o->sizes[d];
        if (nd > 0) {
            bool merge = true;
            for (int k = 0; k < nop; k++) merge = merge && st[k][nd - 1] == st[k][nd] * sz[nd];
            if (merge) {
                sz[nd - 1] *= sz[nd];
                for (int k = 0; k < nop; k++) st[k][nd - 1] = st[k][nd];
                continue;
            }
        }
        nd++;
    }
    if (nd == 0) {
        sz[0] = 1;
        for (int k = 0; k < nop; k++) st[k][0] = 0;
        nd = 1;
    }
    *nd_out = nd;
    return numel;
}

int64_t tpu_tile_coalesce_by_out(const tpu_tensor *o, int nop, const tpu_tensor *const *t, int64_t *sz,
                                 int64_t (*st)[TPU_MAX_DIMS], int *nd_out) {
    int nd = o->ndim, perm[TPU_MAX_DIMS], n = 0;
    bool ordered = true;
    for (int d = 0; d < nd; d++) { /* the dims of more than one element, stably by descending output stride */
        if (o->sizes[d] == 1) continue;
        int j = n++;
        for (; j > 0 && o->strides[perm[j - 1]] < o->strides[d]; j--) perm[j] = perm[j - 1];
        perm[j] = d;
        ordered = ordered && j == n - 1;
    }
    for (int d = 0; d < nd; d++) /* then the size-1 dims, which coalescing drops */
        if (o->sizes[d] == 1) perm[n++] = d;
    if (ordered || nop > 8) return tpu_tile_coalesce(o, nop, t, sz, st, nd_out);
    tpu_tensor po = *o, pt[8];
    const tpu_tensor *pp[8];
    for (int d = 0; d < nd; d++) {
        po.sizes[d] = o->sizes[perm[d]];
        po.strides[d] = o->strides[perm[d]];
    }
    for (int k = 0; k < nop; k++) {
        pp[k] = t[k];
        if (t[k] == o) {
            pp[k] = &po;
        } else if (!t[k]->is_scalar && t[k]->ndim == nd) {
            pt[k] = *t[k];
            for (int d = 0; d < nd; d++) {
                pt[k].sizes[d] = t[k]->sizes[perm[d]];
                pt[k].strides[d] = t[k]->strides[perm[d]];
            }
            pp[k] = &pt[k];
        }
    }
    return tpu_tile_coalesce(&po, nop, pp, sz, st, nd_out);
}
