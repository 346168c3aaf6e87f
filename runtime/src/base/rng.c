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

/* Eight blocks at once, each lane one block: the same rounds as
 * tpu_philox4x32_10 in 8-lane loops, which the AVX2 / AVX-512 clones run as
 * vector multiplies (one block at a time the chain of dependent 32x32
 * multiplies was most of a random fill's time). */
TPU_TARGET_CLONES void tpu_philox_blocks(uint64_t seed, uint64_t offset, uint64_t g0, int nb, uint32_t *out) {
    for (int b0 = 0; b0 < nb; b0 += 8) {
        uint32_t c0[8], c1[8], c2[8], c3[8];
        for (int k = 0; k < 8; k++) {
            uint64_t g = g0 + (uint64_t)(b0 + k);
            c0[k] = (uint32_t)g;
            c1[k] = (uint32_t)(g >> 32);
            c2[k] = (uint32_t)offset;
            c3[k] = (uint32_t)(offset >> 32);
        }
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

void tpu_philox_block(uint64_t seed, uint64_t offset, uint64_t g, uint32_t out[4]) {
    uint32_t ctr[4] = {(uint32_t)g, (uint32_t)(g >> 32), (uint32_t)offset, (uint32_t)(offset >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    tpu_philox4x32_10(ctr, key, out);
}
