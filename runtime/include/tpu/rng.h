/* rng.h - Philox4x32-10 counter-based generator.
 *
 * Element i of a random op depends only on (seed, offset, i): the same
 * numbers for every mode, thread count and tiling.
 * Thread safety: pure functions. */
#ifndef TPU_RNG_H
#define TPU_RNG_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One Philox4x32-10 block: 4 outputs from a 128-bit counter and 64-bit key. */
void tpu_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* The 4 words for element group g: counter = (g lo, g hi, offset lo, offset hi), key = seed. */
void tpu_philox_block(uint64_t seed, uint64_t offset, uint64_t g, uint32_t out[4]);
/* Blocks g0 .. g0 + nb - 1 of tpu_philox_block(seed, offset, .) into
 * out[4 * nb], in order: the batched form (vectorized). */
void tpu_philox_blocks(uint64_t seed, uint64_t offset, uint64_t g0, int nb, uint32_t *out);
/* The same in portable C whatever the CPU (tests compare it with the above,
 * which takes an AVX-512 or AVX2 path where the CPU has one). */
void tpu_philox_blocks_portable(uint64_t seed, uint64_t offset, uint64_t g0, int nb, uint32_t *out);
/* The same through one named form (tests): isa 0 portable C, 1 AVX2,
 * 2 AVX-512. Returns false, writing nothing, if this CPU or build lacks it. */
bool tpu_philox_blocks_isa(int isa, uint64_t seed, uint64_t offset, uint64_t g0, int nb, uint32_t *out);
/* Uniform float in [0, 1) from 24 bits / double from 53 bits (inline: the
 * batched fills vectorize them). */
static inline float tpu_u32_to_unit_float(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }
static inline double tpu_u64_to_unit_double(uint64_t x) { return (double)(x >> 11) * (1.0 / 9007199254740992.0); }

#ifdef __cplusplus
}
#endif
#endif
