/* rng.c - Philox4x32-10 (Salmon et al., SC'11), counter-based: no state
 * between elements, so any tiling or thread count gives the same numbers. */
#include "base/base-impl.h"
#include "tpu/rng.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void tpu_philox4x32_10(const uint32_t ctr_in[4], const uint32_t key_in[2], uint32_t out[4]) {
    uint32_t c0 = ctr_in[0], c1 = ctr_in[1], c2 = ctr_in[2], c3 = ctr_in[3];
    uint32_t k0 = key_in[0], k1 = key_in[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Counters of blocks g0 + b0 .. g0 + b0 + 7 into c0..c3 (lane k: block k). */
static inline void philox_counters(uint64_t offset, uint64_t g, uint32_t *c0, uint32_t *c1, uint32_t *c2,
                                   uint32_t *c3) {
    for (int k = 0; k < 8; k++) {
        c0[k] = (uint32_t)(g + (uint64_t)k);
        c1[k] = (uint32_t)((g + (uint64_t)k) >> 32);
        c2[k] = (uint32_t)offset;
        c3[k] = (uint32_t)(offset >> 32);
    }
}

/* Eight blocks at once, each lane one block: the same rounds as
 * tpu_philox4x32_10 in 8-lane loops (the portable form; compilers turn its
 * 32x32->64 multiplies into poor vector code, hence the AVX2 form below). */
static void philox_blocks_c(uint64_t seed, uint64_t offset, uint64_t g0, int nb, uint32_t *out) {
    for (int b0 = 0; b0 < nb; b0 += 8) {
        uint32_t c0[8], c1[8], c2[8], c3[8];
        philox_counters(offset, g0 + (uint64_t)b0, c0, c1, c2, c3);
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
        for (int r = 0; r < 10; r++) {
            for (int k = 0; k < 8; k++) {
                uint64_t p0 = (uint64_t)PHILOX_M0 * c0[k], p1 = (uint64_t)PHILOX_M1 * c2[k];
                uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[k] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[k] ^ k1;
                c1[k] = (uint32_t)p1;
                c3[k] = (uint32_t)p0;
                c0[k] = n0;
                c2[k] = n2;
            }
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        for (int k = 0; k < 8 && b0 + k < nb; k++) {
            out[4 * (b0 + k)] = c0[k];
            out[4 * (b0 + k) + 1] = c1[k];
            out[4 * (b0 + k) + 2] = c2[k];
            out[4 * (b0 + k) + 3] = c3[k];
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(TPU_NO_CLONES)
#include <immintrin.h>
#define PHILOX_AVX2 1

/* hi and lo 32 bits of c * m in each of 8 lanes (vpmuludq multiplies the
 * even lanes; the odd ones are shifted down first). */
__attribute__((target("avx2"))) static inline void mul_hilo(__m256i c, __m256i m, __m256i *hi, __m256i *lo) {
    __m256i pe = _mm256_mul_epu32(c, m), po = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m);
    *lo = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
}

/* Sixteen blocks per pass as two independent sets of eight lanes (one
 * set's chain of dependent multiplies leaves the core idle), the words
 * transposed to block order for the store. Bit-identical to the C form
 * (tests/c/test_kernels_ew.c compares every block). */
__attribute__((target("avx2"))) static void philox_blocks_avx2(uint64_t seed, uint64_t offset, uint64_t g0, int nb,
                                                               uint32_t *out) {
    const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
    for (int b0 = 0; b0 < nb; b0 += 16) {
        __m256i c0[2], c1[2], c2[2], c3[2];
        for (int s = 0; s < 2; s++) {
            uint64_t g = g0 + (uint64_t)(b0 + 8 * s);
            if ((uint32_t)g <= 0xffffffffu - 7) { /* no carry into the high word inside the set */
                c0[s] =
                    _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)g), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                c1[s] = _mm256_set1_epi32((int)(uint32_t)(g >> 32));
            } else {
                _Alignas(32) uint32_t a0[8], a1[8], a2[8], a3[8];
                philox_counters(offset, g, a0, a1, a2, a3);
                c0[s] = _mm256_load_si256((const __m256i *)a0);
                c1[s] = _mm256_load_si256((const __m256i *)a1);
            }
            c2[s] = _mm256_set1_epi32((int)(uint32_t)offset);
            c3[s] = _mm256_set1_epi32((int)(uint32_t)(offset >> 32));
        }
        /* both sets in named registers, rounds unrolled (arrays indexed in
         * a loop were kept in memory) */
        __m256i a0 = c0[0], a1 = c1[0], a2 = c2[0], a3 = c3[0], d0 = c0[1], d1 = c1[1], d2 = c2[1], d3 = c3[1];
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma GCC unroll 10
        for (int r = 0; r < 10; r++) {
            __m256i vk0 = _mm256_set1_epi32((int)k0), vk1 = _mm256_set1_epi32((int)k1), h0, l0, h1, l1, e0, f0, e1, f1;
            mul_hilo(a0, m0, &h0, &l0);
            mul_hilo(a2, m1, &h1, &l1);
            mul_hilo(d0, m0, &e0, &f0);
            mul_hilo(d2, m1, &e1, &f1);
            a0 = _mm256_xor_si256(_mm256_xor_si256(h1, a1), vk0);
            a2 = _mm256_xor_si256(_mm256_xor_si256(h0, a3), vk1);
            a1 = l1;
            a3 = l0;
            d0 = _mm256_xor_si256(_mm256_xor_si256(e1, d1), vk0);
            d2 = _mm256_xor_si256(_mm256_xor_si256(e0, d3), vk1);
            d1 = f1;
            d3 = f0;
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        c0[0] = a0, c1[0] = a1, c2[0] = a2, c3[0] = a3, c0[1] = d0, c1[1] = d1, c2[1] = d2, c3[1] = d3;
        for (int s = 0; s < 2; s++) {
            int b = b0 + 8 * s;
            if (b >= nb) break;
            __m256i t0 = _mm256_unpacklo_epi32(c0[s], c1[s]), t1 = _mm256_unpackhi_epi32(c0[s], c1[s]);
            __m256i t2 = _mm256_unpacklo_epi32(c2[s], c3[s]), t3 = _mm256_unpackhi_epi32(c2[s], c3[s]);
            __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2); /* blocks 0|4, 1|5 */
            __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3); /* blocks 2|6, 3|7 */
            __m256i w[4] = {_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u2, u3, 0x20),
                            _mm256_permute2x128_si256(u0, u1, 0x31), _mm256_permute2x128_si256(u2, u3, 0x31)};
            if (nb - b >= 8) {
                for (int q = 0; q < 4; q++) _mm256_storeu_si256((__m256i *)(out + 4 * b + 8 * q), w[q]);
            } else {
                _Alignas(32) uint32_t tmp[32];
                for (int q = 0; q < 4; q++) _mm256_store_si256((__m256i *)(tmp + 8 * q), w[q]);
                for (int k = 0; k < 4 * (nb - b); k++) out[4 * b + k] = tmp[k];
            }
        }
    }
}

/* The AVX-512 form: the same rounds over two sets of sixteen lanes (32
 * blocks a pass, twice the AVX2 form's width); the words are transposed to
 * block order within 128-bit lanes, then the lanes across registers. */
__attribute__((target("avx512f"))) static inline void mul_hilo16(__m512i c, __m512i m, __m512i *hi, __m512i *lo) {
    __m512i pe = _mm512_mul_epu32(c, m), po = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m);
    *lo = _mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);
}

__attribute__((target("avx512f"))) static void philox_blocks_avx512(uint64_t seed, uint64_t offset, uint64_t g0, int nb,
                                                                    uint32_t *out) {
    const __m512i m0 = _mm512_set1_epi32((int)PHILOX_M0), m1 = _mm512_set1_epi32((int)PHILOX_M1);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int b0 = 0; b0 < nb; b0 += 32) {
        __m512i c0[2], c1[2], c2[2], c3[2];
        for (int s = 0; s < 2; s++) {
            uint64_t g = g0 + (uint64_t)(b0 + 16 * s);
            if ((uint32_t)g <= 0xffffffffu - 15) { /* no carry into the high word inside the set */
                c0[s] = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)g), lane);
                c1[s] = _mm512_set1_epi32((int)(uint32_t)(g >> 32));
            } else {
                _Alignas(64) uint32_t a0[16], a1[16], a2[8], a3[8];
                philox_counters(offset, g, a0, a1, a2, a3);
                philox_counters(offset, g + 8, a0 + 8, a1 + 8, a2, a3);
                c0[s] = _mm512_load_si512((const void *)a0);
                c1[s] = _mm512_load_si512((const void *)a1);
            }
            c2[s] = _mm512_set1_epi32((int)(uint32_t)offset);
            c3[s] = _mm512_set1_epi32((int)(uint32_t)(offset >> 32));
        }
        __m512i a0 = c0[0], a1 = c1[0], a2 = c2[0], a3 = c3[0], d0 = c0[1], d1 = c1[1], d2 = c2[1], d3 = c3[1];
        uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma GCC unroll 10
        for (int r = 0; r < 10; r++) {
            __m512i vk0 = _mm512_set1_epi32((int)k0), vk1 = _mm512_set1_epi32((int)k1), h0, l0, h1, l1, e0, f0, e1, f1;
            mul_hilo16(a0, m0, &h0, &l0);
            mul_hilo16(a2, m1, &h1, &l1);
            mul_hilo16(d0, m0, &e0, &f0);
            mul_hilo16(d2, m1, &e1, &f1);
            a0 = _mm512_xor_si512(_mm512_xor_si512(h1, a1), vk0);
            a2 = _mm512_xor_si512(_mm512_xor_si512(h0, a3), vk1);
            a1 = l1;
            a3 = l0;
            d0 = _mm512_xor_si512(_mm512_xor_si512(e1, d1), vk0);
            d2 = _mm512_xor_si512(_mm512_xor_si512(e0, d3), vk1);
            d1 = f1;
            d3 = f0;
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        c0[0] = a0, c1[0] = a1, c2[0] = a2, c3[0] = a3, c0[1] = d0, c1[1] = d1, c2[1] = d2, c3[1] = d3;
        for (int s = 0; s < 2; s++) {
            int b = b0 + 16 * s;
            if (b >= nb) break;
            /* per 128-bit lane L: u_k holds block 4L + k */
            __m512i t0 = _mm512_unpacklo_epi32(c0[s], c1[s]), t1 = _mm512_unpackhi_epi32(c0[s], c1[s]);
            __m512i t2 = _mm512_unpacklo_epi32(c2[s], c3[s]), t3 = _mm512_unpackhi_epi32(c2[s], c3[s]);
            __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
            __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
            __m512i v0 = _mm512_shuffle_i32x4(u0, u1, 0x44), v1 = _mm512_shuffle_i32x4(u2, u3, 0x44); /* lanes 0, 1 */
            __m512i v2 = _mm512_shuffle_i32x4(u0, u1, 0xEE), v3 = _mm512_shuffle_i32x4(u2, u3, 0xEE); /* lanes 2, 3 */
            __m512i w[4] = {_mm512_shuffle_i32x4(v0, v1, 0x88), _mm512_shuffle_i32x4(v0, v1, 0xDD),
                            _mm512_shuffle_i32x4(v2, v3, 0x88), _mm512_shuffle_i32x4(v2, v3, 0xDD)};
            if (nb - b >= 16) {
                for (int q = 0; q < 4; q++) _mm512_storeu_si512((void *)(out + 4 * b + 16 * q), w[q]);
            } else {
                _Alignas(64) uint32_t tmp[64];
                for (int q = 0; q < 4; q++) _mm512_store_si512((void *)(tmp + 16 * q), w[q]);
                for (int k = 0; k < 4 * (nb - b); k++) out[4 * b + k] = tmp[k];
            }
        }
    }
}
#endif

void tpu_philox_blocks(uint64_t seed, uint64_t offset, uint64_t g0, int nb, uint32_t *out) {
    /* The widest form this CPU runs; the portable one always does. */
    if (!tpu_philox_blocks_isa(2, seed, offset, g0, nb, out) && !tpu_philox_blocks_isa(1, seed, offset, g0, nb, out))
        philox_blocks_c(seed, offset, g0, nb, out);
}

/* The portable form whatever the CPU (tests compare the two). */
void tpu_philox_blocks_portable(uint64_t seed, uint64_t offset, uint64_t g0, int nb, uint32_t *out) {
    philox_blocks_c(seed, offset, g0, nb, out);
}

bool tpu_philox_blocks_isa(int isa, uint64_t seed, uint64_t offset, uint64_t g0, int nb, uint32_t *out) {
    switch (isa) {
    case 0: philox_blocks_c(seed, offset, g0, nb, out); return true;
#ifdef PHILOX_AVX2
    case 1:
        if (!__builtin_cpu_supports("avx2")) return false;
        philox_blocks_avx2(seed, offset, g0, nb, out);
        return true;
    case 2:
        if (!__builtin_cpu_supports("avx512f")) return false;
        philox_blocks_avx512(seed, offset, g0, nb, out);
        return true;
#endif
    default: return false;
    }
}

void tpu_philox_block(uint64_t seed, uint64_t offset, uint64_t g, uint32_t out[4]) {
    uint32_t ctr[4] = {(uint32_t)g, (uint32_t)(g >> 32), (uint32_t)offset, (uint32_t)(offset >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    tpu_philox4x32_10(ctr, key, out);
}
