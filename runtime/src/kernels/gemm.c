/* gemm.c - the matrix unit: out = beta*C + alpha*(A @ B), batched, any strides.
 *
 * DESIGN
 * Goto-style blocking. B is packed once per batch into KC x NR panels (for
 * CONV2D, per image and group, from the image's windows: no im2col buffer); the
 * output is cut into row-block x column-range tasks run on the compute
 * workers; each task packs its A block (MR-row slivers) and runs an MR x NR
 * micro-kernel into an fp32 accumulator tile, then applies the epilogue
 * (alpha, beta*C, dtype conversion, output strides) once.
 *
 * Matrix units, picked at run time per call (TPU_MXU=portable: the last;
 * TPU_MXU=no-amx: not the first):
 *   AMX          bf16 only: a 32x32 block as four 16x16 fp32 tiles, k in
 *                steps of 32 (tdpbf16ps); B packed as for AVX512-BF16 (a
 *                tile is 16 rows of (k, k+1) pairs of 16 columns, every
 *                other 64 bytes of a panel), A as 32 rows of kc bf16; K is
 *                padded with zeros to a multiple of 32. Each task loads the
 *                tile configuration on its thread and releases it after.
 *   AVX512-BF16  8x32 tile; fp32 by vfmadd231ps, bf16 by vdpbf16ps on packed
 *                (k, k+1) pairs
 *   AVX2+FMA     6x16 tile (12 of the 16 ymm registers accumulate); bf16 is
 *                widened to fp32 when packed (exact), then the fp32 kernel:
 *                AVX2 has no bf16 dot product, and widening once per panel
 *                beats widening in the inner loop, which competes with the FMAs
 *   portable     8x32 plain C; bf16 on pairs, as AVX512-BF16 packs them, so
 *                TPU_MXU=portable exercises that packing on any host
 * bf16/f16 inputs and fp32 at "medium" precision use the bf16 unit (f16 is
 * computed in fp32); "high" runs three bf16 passes (hi*hi + hi*lo + lo*hi).
 * Every unit multiplies the same bf16-rounded values exactly and accumulates
 * in fp32; they differ only in summation order.
 * Up to GEMV_M rows of A (decode) skip the blocking: B is streamed once in
 * its own layout (the small-M section below).
 * float64 uses a plain blocked loop. */
#include "kernels/kernels-impl.h"
#include "kernels/tile-impl.h"
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <stdatomic.h>

#define MR         8 /* AVX-512 and portable tile */
#define NR         32
#define MR_AMX     32 /* AMX block: 2 x 2 tiles of 16 x 16 */
#define KSTEP_AMX  32 /* k per tdpbf16ps */
#define MR_MAX     32
#define MR2        6 /* AVX2 tile */
#define NR2        16
#define NR_MAX     32
#define KC         256
#define GROUP_COLS 256 /* columns of a task whose sums accumulate over all k blocks at once (a multiple of NR) */
_Static_assert(MR_MAX >= MR && MR_MAX >= MR2 && MR_MAX >= MR_AMX && NR_MAX >= NR && NR_MAX >= NR2,
               "pack buffers hold the largest tile");
_Static_assert(KC % KSTEP_AMX == 0, "a k block is whole AMX steps");
_Static_assert(GROUP_COLS % NR == 0 && GROUP_COLS % NR2 == 0, "a group is whole panels");

/* ---------------- micro-kernels: acc[MR][NR] (+)= Ap * Bp ----------------
 * c is the tile's corner in the task's fp32 scratch (row stride ldc); first:
 * start from zero instead of c. ap/bp are packed slivers: floats, or bf16
 * (k, k+1) pairs as uint32 for the pair kernels. */
typedef void (*ukr_fn)(int kc, const void *ap, const void *bp, float *c, int ldc, int first);

__attribute__((target("avx512f"))) static void ukr_f32_avx512(int kc, const void *apv, const void *bpv, float *c,
                                                              int ldc, int first) {
    const float *ap = apv, *bp = bpv;
    __m512 acc[MR][2];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        acc[r][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc);
        acc[r][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc + 16);
    }
    for (int k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(bp + k * NR), b1 = _mm512_loadu_ps(bp + k * NR + 16);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m512 a = _mm512_set1_ps(ap[k * MR + r]);
            acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        _mm512_storeu_ps(c + r * ldc, acc[r][0]);
        _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
    }
}

/* AVX2: ap is [kc][MR2], bp is [kc][NR2]; per k, 2 loads of B and 6
 * broadcasts of A feed 12 FMAs. */
__attribute__((target("avx2,fma"))) static void ukr_f32_avx2(int kc, const void *apv, const void *bpv, float *c,
                                                             int ldc, int first) {
    const float *ap = apv, *bp = bpv;
    __m256 acc[MR2][2];
#pragma GCC unroll 6
    for (int r = 0; r < MR2; r++) {
        acc[r][0] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + r * ldc);
        acc[r][1] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(c + r * ldc + 8);
    }
#pragma GCC unroll 4
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(bp + k * NR2), b1 = _mm256_load_ps(bp + k * NR2 + 8);
#pragma GCC unroll 6
        for (int r = 0; r < MR2; r++) {
            __m256 a = _mm256_broadcast_ss(ap + k * MR2 + r);
            acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < MR2; r++) {
        _mm256_storeu_ps(c + r * ldc, acc[r][0]);
        _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
    }
}

static void ukr_f32_c(int kc, const void *apv, const void *bpv, float *c, int ldc, int first) {
    const float *ap = apv, *bp = bpv;
    float acc[MR][NR];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++) acc[r][j] = first ? 0.0f : c[r * ldc + j];
    for (int k = 0; k < kc; k++)
        for (int r = 0; r < MR; r++) {
            float a = ap[k * MR + r];
            for (int j = 0; j < NR; j++) acc[r][j] += a * bp[k * NR + j];
        }
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++) c[r * ldc + j] = acc[r][j];
}

/* bf16: ap is [kc/2][MR] of packed (k, k+1) pairs; bp is [kc/2][NR] pairs. */
__attribute__((target("avx512f,avx512bf16"))) static void ukr_bf16_avx512(int kc, const void *apv, const void *bpv,
                                                                          float *c, int ldc, int first) {
    const uint32_t *ap = apv, *bp = bpv;
    __m512 acc[MR][2];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        acc[r][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc);
        acc[r][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc + 16);
    }
    for (int k = 0; k < kc / 2; k++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + k * NR), b1 = (__m512bh)_mm512_loadu_si512(bp + k * NR + 16);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[k * MR + r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        _mm512_storeu_ps(c + r * ldc, acc[r][0]);
        _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
    }
}

static void ukr_bf16_c(int kc, const void *apv, const void *bpv, float *c, int ldc, int first) {
    const uint32_t *ap = apv, *bp = bpv;
    float acc[MR][NR];
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++) acc[r][j] = first ? 0.0f : c[r * ldc + j];
    for (int k = 0; k < kc / 2; k++)
        for (int r = 0; r < MR; r++) {
            uint32_t a = ap[k * MR + r];
            float a0 = tpu_bf16_to_f32((uint16_t)a), a1 = tpu_bf16_to_f32((uint16_t)(a >> 16));
            for (int j = 0; j < NR; j++) {
                uint32_t b = bp[k * NR + j];
                acc[r][j] += a0 * tpu_bf16_to_f32((uint16_t)b) + a1 * tpu_bf16_to_f32((uint16_t)(b >> 16));
            }
        }
    for (int r = 0; r < MR; r++)
        for (int j = 0; j < NR; j++) c[r * ldc + j] = acc[r][j];
}

/* AMX: ap is 32 rows of kc bf16 (row stride kc), bp is [kc/2][NR] pairs;
 * tiles 0-3 hold the block's sums (rows 0-15 / 16-31 x columns 0-15 /
 * 16-31), 4-5 the two row halves of A, 6-7 the two column halves of B. */
__attribute__((target("amx-tile,amx-bf16"))) static void ukr_bf16_amx(int kc, const void *apv, const void *bpv,
                                                                      float *c, int ldc, int first) {
    const uint16_t *ap = apv;
    const uint32_t *bp = bpv;
    size_t cs = sizeof(float) * (size_t)ldc, as = sizeof(uint16_t) * (size_t)kc, bs = sizeof(uint32_t) * NR;
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, c, cs);
        _tile_loadd(1, c + 16, cs);
        _tile_loadd(2, c + 16 * ldc, cs);
        _tile_loadd(3, c + 16 * ldc + 16, cs);
    }
    for (int k = 0; k < kc; k += KSTEP_AMX) {
        const uint32_t *b = bp + (k / 2) * NR;
        _tile_loadd(4, ap + k, as);
        _tile_loadd(5, ap + 16 * kc + k, as);
        _tile_loadd(6, b, bs);
        _tile_loadd(7, b + 16, bs);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, cs);
    _tile_stored(1, c + 16, cs);
    _tile_stored(2, c + 16 * ldc, cs);
    _tile_stored(3, c + 16 * ldc + 16, cs);
}

/* The tile configuration (palette 1): tiles 0-7 of 16 rows of 64 bytes. A
 * constant in memory: GCC's ldtilecfg does not tell the compiler that it
 * reads all 64 bytes, so stores into a local one are dropped as dead. */
static const struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg __attribute__((aligned(64))) = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};
_Static_assert(sizeof amx_cfg == 64, "the tile configuration is 64 bytes");

__attribute__((target("amx-tile"))) static void amx_begin(void) { _tile_loadconfig(&amx_cfg); }

__attribute__((target("amx-tile"))) static void amx_end(void) { _tile_release(); }

/* ---------------- the units ---------------- */

typedef struct gemm_unit {
    const char *name;
    int mr, nr;    /* register tile */
    bool pairs;    /* packs B as bf16 (k, k+1) pairs (and A too unless a_rows) */
    bool a_rows;   /* packs A as mr rows of kc bf16 */
    int kstep;     /* K is padded to a multiple of this */
    int mc_target; /* rows per task (a multiple of mr), before balancing: more where B's
                    * panels are read faster than L3 streams them (AMX) */
    ukr_fn ukr;
    void (*begin)(void), (*end)(void); /* around a task's micro-kernels on its thread, or NULL */
} gemm_unit;

static const gemm_unit unit_amx = {"AMX", MR_AMX, NR, true, true, KSTEP_AMX, 128, ukr_bf16_amx, amx_begin, amx_end};
static const gemm_unit unit_avx512 = {"AVX512", MR, NR, false, false, 1, 64, ukr_f32_avx512, NULL, NULL};
static const gemm_unit unit_avx512_bf16 = {"AVX512-BF16", MR, NR, true, false, 2, 64, ukr_bf16_avx512, NULL, NULL};
static const gemm_unit unit_avx2 = {"AVX2-FMA", MR2, NR2, false, false, 1, 64, ukr_f32_avx2, NULL, NULL};
static const gemm_unit unit_c = {"portable", MR, NR, false, false, 1, 64, ukr_f32_c, NULL, NULL};
static const gemm_unit unit_c_bf16 = {"portable", MR, NR, true, false, 2, 64, ukr_bf16_c, NULL, NULL};

/* The unit for fp32 (bf16 = false) or bf16 operands, by the host's CPU and
 * TPU_MXU. AVX-512 without BF16 takes the AVX2 unit: the fp32 AVX-512 kernel
 * is only validated alongside the bf16 one. */
static const gemm_unit *gemm_pick(bool bf16) {
    switch (tpu_mxu_detected()) {
    case TPU_MXU_AMX: return bf16 ? &unit_amx : &unit_avx512;
    case TPU_MXU_AVX512_BF16: return bf16 ? &unit_avx512_bf16 : &unit_avx512;
    case TPU_MXU_AVX2_FMA: return &unit_avx2;
    default: return bf16 ? &unit_c_bf16 : &unit_c;
    }
}

const char *tpu_gemm_unit_name(bool bf16) { return gemm_pick(bf16)->name; }

/* ---------------- element access ---------------- */

typedef struct mat {
    const char *base;
    tpu_dtype dt;
    int64_t rs, cs;
} mat;

static inline const char *mat_ptr(const mat *m, int64_t r, int64_t c) {
    return m->base + (size_t)(r * m->rs + c * m->cs) * tpu_dtype_size(m->dt);
}

/* Split x into bf16 hi + bf16 lo (part: 0 = plain round, 1 = hi, 2 = lo). */
static inline uint16_t to_bf16_part(float x, int part) {
    if (part == 0) return tpu_f32_to_bf16(x);
    union {
        float f;
        uint32_t u;
    } v = {x};
    v.u &= 0xffff0000u; /* hi: truncation keeps x - hi exact in fp32 */
    if (part == 1) return (uint16_t)(v.u >> 16);
    return tpu_f32_to_bf16(x - v.f);
}

/* ---------------- the driver ---------------- */

/* CONV2D's B: the windows of one image and group as a K x (OH*OW) matrix,
 * row k = (c, i, j) of the kernel, column l = (oh, ow); read straight from
 * the image while B is packed (no im2col buffer). */
typedef struct conv_src {
    const tpu_tensor *x;
    const char *plane0; /* channel 0 of the group in image n */
    tpu_conv_geom g;
} conv_src;

typedef struct gemm_job {
    int64_t M, N, K, Kp; /* Kp: K rounded to the k-step (even for pairs) */
    mat A, B;
    const conv_src *cv; /* B is a convolution's windows (then B is unused) */
    const tpu_kargs *a;
    int64_t batch;
    const gemm_unit *u;
    int use_bf16, passes;       /* passes: 1, or 3 for "high" */
    bool round_a, round_b;      /* fp32 packing of the bf16 unit rounds (values not already bf16) */
    void *bpack[2];             /* packed B (hi, lo): [K/KC][Npad/NR][kc][NR] */
    int64_t npanels;            /* NR-wide column panels */
    int64_t mc, mtasks, nsplit; /* tasks: mc-row blocks x column ranges */
    atomic_bool no_scratch;     /* a task could not allocate its buffers: the launch fails */
} gemm_job;

/* Start of panel `panel` of k-block kb in packed B, in floats or bf16 pairs. */
static size_t bpack_index(const gemm_job *j, int64_t kb, int64_t panel) {
    int64_t kc = j->Kp - kb * KC < KC ? j->Kp - kb * KC : KC;
    int64_t step = j->u->pairs ? 2 : 1;
    return (size_t)((kb * (KC / step) * j->npanels + panel * (kc / step)) * j->u->nr);
}

/* n values in place to what the bf16 unit sees of them, as fp32. */
static void round_bf16(float *x, int64_t n, int part) {
    for (int64_t i = 0; i < n; i++) x[i] = tpu_bf16_to_f32(to_bf16_part(x[i], part));
}

typedef struct pack_ctx {
    gemm_job *j;
    int part;
    void *dst;
} pack_ctx;

/* n values of window row k (kernel offset (c, i, j)) from column l0 on,
 * into dst: per output row oh, zeros where the window leaves the image,
 * one strided load for the rest. */
static void conv_row(const conv_src *cv, int64_t k, int64_t l0, int64_t n, float *dst) {
    const tpu_conv_geom *g = &cv->g;
    const tpu_tensor *x = cv->x;
    int64_t c = k / (g->kh * g->kw), r = k % (g->kh * g->kw), ki = r / g->kw, kj = r % g->kw;
    int64_t shift = kj * g->dw - g->pw; /* input column of ow: ow * sw + shift */
    int64_t lo = shift >= 0 ? 0 : (-shift + g->sw - 1) / g->sw;
    int64_t hi = g->W - shift <= 0 ? 0 : (g->W - shift + g->sw - 1) / g->sw;
    if (hi > g->OW) hi = g->OW;
    if (lo > hi) lo = hi;
    size_t esz = tpu_dtype_size((tpu_dtype)x->dtype);
    for (int64_t l = l0; l < l0 + n;) {
        int64_t oh = l / g->OW, ow = l % g->OW, run = g->OW - ow < l0 + n - l ? g->OW - ow : l0 + n - l;
        int64_t h = oh * g->sh - g->ph + ki * g->dh;
        float *d = dst + (l - l0);
        int64_t a0 = ow > lo ? ow : lo, a1 = ow + run < hi ? ow + run : hi;
        if (h < 0 || h >= g->H || a0 >= a1) {
            memset(d, 0, sizeof(float) * (size_t)run);
        } else {
            for (int64_t q = ow; q < a0; q++) d[q - ow] = 0.0f;
            tpu_tile_load_f32(
                d + (a0 - ow),
                cv->plane0 +
                    (size_t)(c * x->strides[1] + h * x->strides[2] + (a0 * g->sw + shift) * x->strides[3]) * esz,
                g->sw * x->strides[3], a1 - a0, (tpu_dtype)x->dtype);
            for (int64_t q = a1; q < ow + run; q++) d[q - ow] = 0.0f;
        }
        l += run;
    }
}

/* Row k of B, columns [c0, c0 + n), as floats: B itself when it is fp32
 * with contiguous rows, else converted (or gathered from windows) into buf. */
static const float *b_row(const gemm_job *j, int64_t k, int64_t c0, int64_t n, float *buf) {
    if (j->cv) {
        conv_row(j->cv, k, c0, n, buf);
        return buf;
    }
    if (j->B.dt == TPU_F32 && j->B.cs == 1) return (const float *)mat_ptr(&j->B, k, c0);
    tpu_tile_load_f32(buf, mat_ptr(&j->B, k, c0), j->B.cs, n, j->B.dt);
    return buf;
}

/* out[r * nr + q] = word r at w[q] (r < wv, w[q] not NULL), else 0, for
 * r < rows, q < nr: a transpose of 32-bit words (w[q]: 2-byte aligned at
 * least), 16 x 16 blocks at a time on AVX-512. */
__attribute__((target("avx512f"))) static void transpose16_avx512(const char *const *w, int64_t r0, uint32_t *out,
                                                                  int nr) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(w[i] + 4 * r0);
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + c], lane L: rows 4i..4i+3 of column 4L + c */
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int c = 0; c < 4; c++) { /* a 4 x 4 transpose of 128-bit lanes */
        __m512i u0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), u1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee);
        __m512i u2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44),
                u3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
        _mm512_storeu_si512(out + (4 * 0 + c) * nr, _mm512_shuffle_i32x4(u0, u2, 0x88));
        _mm512_storeu_si512(out + (4 * 1 + c) * nr, _mm512_shuffle_i32x4(u0, u2, 0xdd));
        _mm512_storeu_si512(out + (4 * 2 + c) * nr, _mm512_shuffle_i32x4(u1, u3, 0x88));
        _mm512_storeu_si512(out + (4 * 3 + c) * nr, _mm512_shuffle_i32x4(u1, u3, 0xdd));
    }
}

static void pack_words(uint32_t *out, int nr, const char *const *w, int64_t wv, int64_t rows) {
    int64_t rv = 0; /* rows done by blocks, for every q */
    bool full = true;
    for (int q = 0; q < nr; q++) full = full && w[q];
    if (full && nr % 16 == 0 && (tpu_cpu_features() & TPU_CPU_AVX512F)) {
        for (; rv + 16 <= wv; rv += 16)
            for (int q0 = 0; q0 < nr; q0 += 16) transpose16_avx512(w + q0, rv, out + rv * nr + q0, nr);
    }
    for (int q = 0; q < nr; q++)
        for (int64_t r = rv; r < rows; r++) {
            out[r * nr + q] = 0;
            if (w[q] && r < wv) memcpy(&out[r * nr + q], w[q] + 4 * r, 4);
        }
}

#define PACK_CHUNK 64 /* panels packed a row of B at a time, when B's rows are contiguous */

/* Pack B panels [pb, pe) of every k-block (parallel over panels): PACK_CHUNK
 * panels at a time, each row of B read once for all of them (one panel at a
 * time when B's rows are strided, so that its columns stay in cache). */
static void pack_b_panels(void *ctx, int64_t pb, int64_t pe) {
    pack_ctx *c = ctx;
    gemm_job *j = c->j;
    int nr = j->u->nr;
    int64_t chunk = j->cv || j->B.cs == 1 ? PACK_CHUNK : 1;
    float buf[2][PACK_CHUNK * NR_MAX];
    for (int64_t cb = pb; cb < pe; cb += chunk) {
        int64_t ce = pe - cb < chunk ? pe : cb + chunk, c0 = cb * nr;
        int64_t n = (j->N < ce * nr ? j->N : ce * nr) - c0; /* valid columns of the chunk */
        for (int64_t kb = 0; kb * KC < j->Kp; kb++) {
            int64_t k0 = kb * KC, kc = j->Kp - k0 < KC ? j->Kp - k0 : KC;
            if (j->u->pairs && !j->cv && j->B.dt == TPU_BF16 && j->B.cs == 1 && c->part == 0) {
                /* bf16 rows of B as they are, two at a time, interleaved */
                for (int64_t k = 0; k < kc; k += 2) {
                    const uint16_t *r0 = k0 + k < j->K ? (const uint16_t *)mat_ptr(&j->B, k0 + k, c0) : NULL;
                    const uint16_t *r1 = k0 + k + 1 < j->K ? (const uint16_t *)mat_ptr(&j->B, k0 + k + 1, c0) : NULL;
                    for (int64_t p = cb; p < ce; p++) {
                        uint32_t *out = (uint32_t *)c->dst + bpack_index(j, kb, p) + (k / 2) * nr;
                        int64_t off = (p - cb) * nr;
                        if (r0 && r1 && nr == NR && off + NR <= n)
                            for (int q = 0; q < NR; q++) out[q] = (uint32_t)r0[off + q] | ((uint32_t)r1[off + q] << 16);
                        else
                            for (int q = 0; q < nr; q++)
                                out[q] = (uint32_t)(r0 && off + q < n ? r0[off + q] : 0) |
                                         ((uint32_t)(r1 && off + q < n ? r1[off + q] : 0) << 16);
                    }
                }
            } else if (!j->cv && j->B.rs == 1 && j->B.cs != 1 && c->part == 0 &&
                       (j->u->pairs ? j->B.dt == TPU_BF16 : j->B.dt == TPU_F32 && !j->round_b)) {
                /* B's columns contiguous along k (x @ W.T: the rows of W) and
                 * already of the unit's type: a panel is a transpose of 32-bit
                 * words, a bf16 (k, k+1) pair being one word of a row of W */
                int64_t kv = j->K - k0 < kc ? j->K - k0 : kc; /* valid k of the block */
                int step = j->u->pairs ? 2 : 1;
                for (int64_t p = cb; p < ce; p++) {
                    int64_t off = (p - cb) * nr;
                    const char *w[NR_MAX];
                    for (int q = 0; q < nr; q++) w[q] = off + q < n ? mat_ptr(&j->B, k0, c0 + off + q) : NULL;
                    uint32_t *out = (uint32_t *)c->dst + bpack_index(j, kb, p);
                    pack_words(out, nr, w, kv / step, kc / step);
                    if (step == 2 && kv % 2) /* an odd K's last k: the low half of a pair */
                        for (int q = 0; q < nr; q++) {
                            uint16_t h = 0;
                            if (w[q]) memcpy(&h, w[q] + 2 * (kv - 1), 2);
                            out[(kv / 2) * nr + q] = h;
                        }
                }
            } else if (j->u->pairs) {
                for (int64_t k = 0; k < kc; k += 2) {
                    const float *r0 = k0 + k < j->K ? b_row(j, k0 + k, c0, n, buf[0]) : NULL;
                    const float *r1 = k0 + k + 1 < j->K ? b_row(j, k0 + k + 1, c0, n, buf[1]) : NULL;
                    for (int64_t p = cb; p < ce; p++) {
                        uint32_t *out = (uint32_t *)c->dst + bpack_index(j, kb, p) + (k / 2) * nr;
                        int64_t off = (p - cb) * nr;
                        for (int q = 0; q < nr; q++) {
                            float v0 = r0 && off + q < n ? r0[off + q] : 0.0f,
                                  v1 = r1 && off + q < n ? r1[off + q] : 0.0f;
                            out[q] = (uint32_t)to_bf16_part(v0, c->part) | ((uint32_t)to_bf16_part(v1, c->part) << 16);
                        }
                    }
                }
            } else {
                for (int64_t k = 0; k < kc; k++) {
                    const float *r = b_row(j, k0 + k, c0, n, buf[0]);
                    if (j->round_b) {
                        if (r != buf[0]) memcpy(buf[0], r, sizeof(float) * (size_t)n);
                        round_bf16(buf[0], n, c->part);
                        r = buf[0];
                    }
                    for (int64_t p = cb; p < ce; p++) {
                        float *out = (float *)c->dst + bpack_index(j, kb, p) + k * nr;
                        int64_t off = (p - cb) * nr;
                        if (off + nr <= n && nr == NR2)
                            memcpy(out, r + off, sizeof(float) * NR2);
                        else if (off + nr <= n && nr == NR)
                            memcpy(out, r + off, sizeof(float) * NR);
                        else
                            for (int q = 0; q < nr; q++) out[q] = off + q < n ? r[off + q] : 0.0f;
                    }
                }
            }
        }
    }
}

/* Pack rows [m0, m0+mcp) x k-range of A into MR-row slivers, through tmp
 * (MR_MAX rows of KC floats): rows in, then written out k-major (AMX: row-major). */
static void pack_a(const gemm_job *j, int64_t m0, int64_t mcp, int64_t k0, int64_t kc, int part, void *dst,
                   float *tmp) {
    int mr = j->u->mr;
    int64_t kv = j->K - k0 < kc ? j->K - k0 : kc; /* valid k in this block */
    if (j->u->a_rows && j->A.dt == TPU_BF16 && part == 0) {
        /* bf16 rows as they are: copied, no trip through fp32 */
        for (int64_t r = 0; r < mcp; r++) {
            uint16_t *out = (uint16_t *)dst + r * kc;
            int64_t row = m0 + r, n = row < j->M ? kv : 0;
            const uint16_t *src = n ? (const uint16_t *)mat_ptr(&j->A, row, k0) : NULL;
            if (n && j->A.cs == 1)
                memcpy(out, src, sizeof(uint16_t) * (size_t)n);
            else
                for (int64_t k = 0; k < n; k++) out[k] = src[k * j->A.cs];
            memset(out + n, 0, sizeof(uint16_t) * (size_t)(kc - n));
        }
        return;
    }
    for (int64_t s = 0; s < mcp; s += mr) {
        for (int r = 0; r < mr; r++) {
            float *t = tmp + r * KC;
            int64_t row = m0 + s + r, n = row < j->M ? kv : 0;
            if (n > 0) tpu_tile_load_f32(t, mat_ptr(&j->A, row, k0), j->A.cs, n, j->A.dt);
            for (int64_t k = n; k < kc; k++) t[k] = 0.0f;
            if (j->round_a) round_bf16(t, n, part);
        }
        if (j->u->a_rows) {
            uint16_t *out = (uint16_t *)dst + (s / mr) * kc * mr;
            for (int r = 0; r < mr; r++)
                for (int64_t k = 0; k < kc; k++) out[r * kc + k] = to_bf16_part(tmp[r * KC + k], part);
        } else if (j->u->pairs) {
            uint32_t *out = (uint32_t *)dst + (s / mr) * (kc / 2) * mr;
            for (int64_t k = 0; k < kc; k += 2)
                for (int r = 0; r < mr; r++)
                    out[(k / 2) * mr + r] = (uint32_t)to_bf16_part(tmp[r * KC + k], part) |
                                            ((uint32_t)to_bf16_part(tmp[r * KC + k + 1], part) << 16);
        } else {
            float *out = (float *)dst + (s / mr) * kc * mr;
            for (int64_t k = 0; k < kc; k++)
                for (int r = 0; r < mr; r++) out[k * mr + r] = tmp[r * KC + k];
        }
    }
}

/* acc (the task's scratch) becomes alpha*acc + beta*C in place, then is
 * stored; crow: scratch for a row of C. */
static void epilogue(const gemm_job *j, int64_t batch, int64_t m0, int64_t mc, int64_t n0, int64_t nc, float *acc,
                     int64_t ldc, float *crow) {
    const tpu_kargs *a = j->a;
    const tpu_tensor *o = &a->t[0];
    const tpu_tensor *c = a->n > 3 ? &a->t[3] : NULL;
    tpu_args_MATMUL q = tpu_unpack_MATMUL(&a->p);
    float alpha = (float)q.alpha, beta = (float)q.beta;
    if (!c || beta == 0.0f) c = NULL;
    for (int64_t r = 0; r < mc; r++) {
        int64_t i = m0 + r;
        char *orow = tpu_elem_ptr(o, batch * o->strides[0] + i * o->strides[1] + n0 * o->strides[2]);
        float *arow = acc + r * ldc;
        if (alpha != 1.0f)
            for (int64_t x = 0; x < nc; x++) arow[x] *= alpha;
        if (c && c->is_scalar)
            for (int64_t x = 0; x < nc; x++) arow[x] += beta * (float)c->f;
        else if (c) {
            tpu_tile_load_f32(crow, tpu_elem_ptr(c, batch * c->strides[0] + i * c->strides[1] + n0 * c->strides[2]),
                              c->strides[2], nc, (tpu_dtype)c->dtype);
            for (int64_t x = 0; x < nc; x++) arow[x] += beta * crow[x];
        }
        tpu_tile_store_f32(orow, o->strides[2], arow, nc, (tpu_dtype)o->dtype);
    }
}

/* aligned_alloc of at least `bytes` (its size must be a multiple of the alignment). */
static void *alloc64(size_t bytes) { return aligned_alloc(64, (bytes + 64) / 64 * 64); }

/* Task t: row block t / nsplit, column panels range t % nsplit. The rows of
 * A are packed once for every k block; the panels are then taken GROUP_COLS
 * columns at a time, all k blocks of a group before the next, so that the
 * group's fp32 sums (mc x GROUP_COLS) stay in cache while they accumulate
 * and are stored once. */
static void task(void *ctx, int64_t tb, int64_t te) {
    gemm_job *j = ctx;
    const gemm_unit *u = j->u;
    int64_t step = u->pairs ? 2 : 1;
    int64_t ppt = (j->npanels + j->nsplit - 1) / j->nsplit; /* panels per task */
    int64_t gp = GROUP_COLS / u->nr, ldc = GROUP_COLS;      /* panels per group, sums' row stride */
    int nparts = j->passes == 3 ? 2 : 1;                    /* A as is, or its hi and lo parts */
    int64_t mcp_max = (j->mc + u->mr - 1) / u->mr * u->mr, apart_sz = mcp_max * j->Kp / step; /* 4-byte units */
    float *acc = alloc64(sizeof(float) * (size_t)(mcp_max * ldc));
    float *apack = alloc64(sizeof(float) * (size_t)(nparts * apart_sz));
    float *tmp = alloc64(sizeof(float) * (size_t)(MR_MAX * KC + ldc)); /* A rows, then a row of C */
    if (!acc || !apack || !tmp) {
        free(acc);
        free(apack);
        free(tmp);
        atomic_store(&j->no_scratch, true);
        return;
    }
    if (u->begin) u->begin();
    for (int64_t t = tb; t < te; t++) {
        int64_t mt = t / j->nsplit, nt = t % j->nsplit;
        int64_t m0 = mt * j->mc, mc = j->M - m0 < j->mc ? j->M - m0 : j->mc;
        int64_t mcp = (mc + u->mr - 1) / u->mr * u->mr;
        int64_t p0 = nt * ppt, np = j->npanels - p0 < ppt ? j->npanels - p0 : ppt;
        if (np <= 0) continue;
        /* A block kb of part pi starts at apack + pi * apart_sz + mcp * k0 / step */
        for (int pi = 0; pi < nparts; pi++)
            for (int64_t k0 = 0; k0 < j->Kp; k0 += KC)
                pack_a(j, m0, mcp, k0, j->Kp - k0 < KC ? j->Kp - k0 : KC, j->passes == 1 ? 0 : pi + 1,
                       apack + pi * apart_sz + mcp * k0 / step, tmp);
        for (int64_t g0 = 0; g0 < np; g0 += gp) {
            int64_t gn = np - g0 < gp ? np - g0 : gp, n0 = (p0 + g0) * u->nr;
            int64_t nc = j->N - n0 < gn * u->nr ? j->N - n0 : gn * u->nr;
            int first = 1;
            if (j->Kp == 0) memset(acc, 0, sizeof(float) * (size_t)(mcp_max * ldc));
            for (int64_t k0 = 0, kb = 0; k0 < j->Kp; k0 += KC, kb++) {
                int64_t kc = j->Kp - k0 < KC ? j->Kp - k0 : KC;
                for (int pass = 0; pass < j->passes; pass++) {
                    /* passes for "high": (hi,hi), (hi,lo), (lo,hi) */
                    int pi = j->passes == 3 && pass == 2 ? 1 : 0;
                    int bsel = j->passes == 1 ? 0 : (pass == 1 ? 1 : 0);
                    const float *ap = apack + pi * apart_sz + mcp * k0 / step;
                    for (int64_t p = g0; p < g0 + gn; p++)
                        for (int64_t s = 0; s < mcp; s += u->mr)
                            u->ukr((int)kc, ap + (s / u->mr) * (kc / step) * u->mr, /* 4-byte units */
                                   (const float *)j->bpack[bsel] + bpack_index(j, kb, p0 + p),
                                   acc + s * ldc + (p - g0) * u->nr, (int)ldc, first);
                    first = 0;
                }
            }
            epilogue(j, j->batch, m0, mc, n0, nc, acc, ldc, tmp + MR_MAX * KC);
        }
    }
    if (u->end) u->end();
    free(acc);
    free(apack);
    free(tmp);
}

/* ---------------- small M: B streamed once, in its own layout ----------------
 * With a few rows of A (decode: one token per sequence) the blocked path is
 * the wrong shape: it reads B, writes a packed copy and reads that again,
 * and its register tile is mostly padding rows. Here each task owns a range
 * of output columns of one batch and reads its part of B exactly once:
 *   dot   (B.rs == 1: the columns of B are contiguous, x @ W.T of nn.Linear)
 *         out[m][n] = A[m][:] . W[n][:], four columns of B and two rows of
 *         A at a time, eight k per step, summed across lanes at the end;
 *   rows  (otherwise: x @ W of GPT-2's Conv1D, B.cs == 1 at best)
 *         acc[m][cols] += A[m][k] * B[k][cols] over the task's stretch of
 *         each row of B, four k per pass over the stretch.
 * fp32 operands at "highest" precision, bfloat16 and float16: widened
 * exactly and accumulated in fp32, which is what every matrix unit computes
 * (only the summation order differs, as between units). Operands that are
 * not fp32 and contiguous along the streamed dim go through a row buffer. */
#define GEMV_M    8  /* rows of A up to which the small-M path runs */
#define GEMV_KMIN 64 /* fewest rows of B per k range when the rows layout splits k */

typedef struct gemv_job {
    gemm_job *j; /* shapes, A and B of batch 0, the kernel's args */
    const tpu_tensor *A, *B;
    bool dot, avx2;         /* avx2: the AVX2-FMA kernels, else plain C (TPU_MXU=portable) */
    int64_t ncol, nt;       /* columns per chunk, chunks per batch */
    int64_t ksplit, krange; /* k ranges per chunk (rows layout), rows of B per range */
    float *part;            /* ksplit > 1: partial sums [batch][chunk][ksplit][M][ncol] */
} gemv_job;

/* dot: out[mi][q] for q < nq (<= 4 columns whose rows of B start at w[q]),
 * rows mi of A (a: m rows of K floats, row stride K). */
__attribute__((target("avx2,fma"))) static void
gemv_dot_avx2(const float *a, int64_t m, int64_t K, const float *const w[4], int nq, float *acc, int64_t ldc) {
    int64_t K8 = K / 8 * 8;
    for (int64_t mi = 0; mi < m; mi += 2) {
        const float *a0 = a + mi * K, *a1 = mi + 1 < m ? a0 + K : a0;
        __m256 s[2][4];
        for (int q = 0; q < 4; q++) s[0][q] = s[1][q] = _mm256_setzero_ps();
        for (int64_t k = 0; k < K8; k += 8) {
            __m256 x0 = _mm256_loadu_ps(a0 + k), x1 = _mm256_loadu_ps(a1 + k);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) {
                __m256 v = _mm256_loadu_ps(w[q] + k);
                s[0][q] = _mm256_fmadd_ps(x0, v, s[0][q]);
                s[1][q] = _mm256_fmadd_ps(x1, v, s[1][q]);
            }
        }
        for (int r = 0; r < 2 && mi + r < m; r++)
            for (int q = 0; q < nq; q++) {
                __m128 h = _mm_add_ps(_mm256_castps256_ps128(s[r][q]), _mm256_extractf128_ps(s[r][q], 1));
                h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                h = _mm_add_ss(h, _mm_movehdup_ps(h));
                float t = _mm_cvtss_f32(h);
                const float *ar = r ? a1 : a0;
                for (int64_t k = K8; k < K; k++) t += ar[k] * w[q][k];
                acc[(mi + r) * ldc + q] = t;
            }
    }
}

static void gemv_dot_c(const float *a, int64_t m, int64_t K, const float *const w[4], int nq, float *acc, int64_t ldc) {
    for (int64_t mi = 0; mi < m; mi++)
        for (int q = 0; q < nq; q++) {
            float s[8] = {0};
            int64_t K8 = K / 8 * 8;
            for (int64_t k = 0; k < K8; k += 8)
                for (int l = 0; l < 8; l++) s[l] += a[mi * K + k + l] * w[q][k + l];
            float t = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
            for (int64_t k = K8; k < K; k++) t += a[mi * K + k] * w[q][k];
            acc[mi * ldc + q] = t;
        }
}

/* rows: acc[mi][0..nc) += sum over r < nk of a[mi][k0 + r] * b[r][0..nc),
 * nk <= 4 rows of B (b[r]: nc floats). */
__attribute__((target("avx2,fma"))) static void gemv_rows_avx2(const float *a, int64_t m, int64_t K, int64_t k0,
                                                               const float *const b[4], int nk, float *acc, int64_t ldc,
                                                               int64_t nc) {
    int64_t n8 = nc / 8 * 8;
    if (nk == 4) {
        for (int64_t x = 0; x < n8; x += 8) {
            __m256 b0 = _mm256_loadu_ps(b[0] + x), b1 = _mm256_loadu_ps(b[1] + x);
            __m256 b2 = _mm256_loadu_ps(b[2] + x), b3 = _mm256_loadu_ps(b[3] + x);
            for (int64_t mi = 0; mi < m; mi++) {
                const float *ar = a + mi * K + k0;
                __m256 c = _mm256_loadu_ps(acc + mi * ldc + x);
                c = _mm256_fmadd_ps(_mm256_broadcast_ss(ar), b0, c);
                c = _mm256_fmadd_ps(_mm256_broadcast_ss(ar + 1), b1, c);
                c = _mm256_fmadd_ps(_mm256_broadcast_ss(ar + 2), b2, c);
                c = _mm256_fmadd_ps(_mm256_broadcast_ss(ar + 3), b3, c);
                _mm256_storeu_ps(acc + mi * ldc + x, c);
            }
        }
    } else {
        for (int r = 0; r < nk; r++)
            for (int64_t x = 0; x < n8; x += 8) {
                __m256 bv = _mm256_loadu_ps(b[r] + x);
                for (int64_t mi = 0; mi < m; mi++) {
                    __m256 c = _mm256_loadu_ps(acc + mi * ldc + x);
                    _mm256_storeu_ps(acc + mi * ldc + x,
                                     _mm256_fmadd_ps(_mm256_broadcast_ss(a + mi * K + k0 + r), bv, c));
                }
            }
    }
    for (int64_t mi = 0; mi < m; mi++)
        for (int r = 0; r < nk; r++)
            for (int64_t x = n8; x < nc; x++) acc[mi * ldc + x] += a[mi * K + k0 + r] * b[r][x];
}

static void gemv_rows_c(const float *a, int64_t m, int64_t K, int64_t k0, const float *const b[4], int nk, float *acc,
                        int64_t ldc, int64_t nc) {
    for (int64_t mi = 0; mi < m; mi++)
        for (int r = 0; r < nk; r++) {
            float av = a[mi * K + k0 + r];
            for (int64_t x = 0; x < nc; x++) acc[mi * ldc + x] += av * b[r][x];
        }
}

/* A row of B's stream (len elements from p at stride st) as floats: the data
 * itself when it already is contiguous fp32, else converted into buf. */
static const float *gemv_row(const char *p, int64_t st, int64_t len, tpu_dtype dt, float *buf) {
    if (dt == TPU_F32 && st == 1) return (const float *)p;
    tpu_tile_load_f32(buf, p, st, len, dt);
    return buf;
}

/* Rows of A of `batch` into a (M rows of K floats). */
static void gemv_load_a(const gemv_job *g, int64_t batch, float *a) {
    const tpu_tensor *A = g->A;
    for (int64_t i = 0; i < g->j->M; i++)
        tpu_tile_load_f32(a + i * g->j->K, tpu_elem_ptr(A, batch * A->strides[0] + i * A->strides[1]), A->strides[2],
                          g->j->K, (tpu_dtype)A->dtype);
}

/* Task t: (batch, column chunk, k range); without a k split it stores the
 * result, else its partial sums go to g->part[t]. */
static void gemv_task(void *ctx, int64_t tb, int64_t te) {
    const gemv_job *g = ctx;
    const gemm_job *j = g->j;
    const tpu_tensor *B = g->B;
    int64_t M = j->M, K = j->K, N = j->N, ldc = g->ncol;
    int64_t blen = g->dot ? K : ldc; /* floats per buffered row of B */
    float *a = malloc(sizeof(float) * (size_t)(M * K + M * ldc + ldc + 4 * blen + 1));
    if (!a) {
        atomic_store(&g->j->no_scratch, true);
        return;
    }
    float *acc = a + M * K, *crow = acc + M * ldc, *bbuf = crow + ldc;
    int64_t loaded = -1; /* batch whose rows of A are in a */
    size_t esz = tpu_dtype_size((tpu_dtype)B->dtype);
    tpu_dtype bdt = (tpu_dtype)B->dtype;
    for (int64_t t = tb; t < te; t++) {
        int64_t ks = t % g->ksplit, c = t / g->ksplit % g->nt, batch = t / g->ksplit / g->nt;
        int64_t n0 = c * g->ncol, nc = N - n0 < g->ncol ? N - n0 : g->ncol;
        int64_t k0 = ks * g->krange, k1 = K - k0 < g->krange ? K : k0 + g->krange;
        if (loaded != batch) gemv_load_a(g, batch, a);
        loaded = batch;
        const char *bb = tpu_elem_ptr(B, batch * B->strides[0]);
        float *out = g->part ? g->part + t * M * ldc : acc;
        if (g->dot) {
            for (int64_t n = n0; n < n0 + nc; n += 4) {
                int nq = N - n < 4 ? (int)(N - n) : 4;
                const float *w[4];
                for (int q = 0; q < 4; q++) {
                    int64_t col = n + (q < nq ? q : 0);
                    w[q] = gemv_row(bb + (size_t)(col * B->strides[2]) * esz, B->strides[1], K, bdt, bbuf + q * blen);
                    if (q >= nq) w[q] = w[0];
                }
                (g->avx2 ? gemv_dot_avx2 : gemv_dot_c)(a, M, K, w, nq, out + (n - n0), ldc);
            }
        } else {
            memset(out, 0, sizeof(float) * (size_t)(M * ldc));
            for (int64_t k = k0; k < k1; k += 4) {
                int nk = k1 - k < 4 ? (int)(k1 - k) : 4;
                const float *b[4];
                for (int r = 0; r < nk; r++)
                    b[r] = gemv_row(bb + (size_t)((k + r) * B->strides[1] + n0 * B->strides[2]) * esz, B->strides[2],
                                    nc, bdt, bbuf + r * blen);
                (g->avx2 ? gemv_rows_avx2 : gemv_rows_c)(a, M, K, k, b, nk, out, ldc, nc);
            }
        }
        if (!g->part) epilogue(j, batch, 0, M, n0, nc, acc, ldc, crow);
    }
    free(a);
}

/* After a k split: (batch, column chunk) u sums its partials in k order
 * and stores. */
static void gemv_finish(void *ctx, int64_t ub, int64_t ue) {
    const gemv_job *g = ctx;
    int64_t M = g->j->M, N = g->j->N, ldc = g->ncol, sz = M * ldc;
    float *acc = malloc(sizeof(float) * (size_t)(sz + ldc));
    if (!acc) {
        atomic_store(&g->j->no_scratch, true);
        return;
    }
    for (int64_t u = ub; u < ue; u++) {
        int64_t n0 = u % g->nt * g->ncol, nc = N - n0 < g->ncol ? N - n0 : g->ncol;
        const float *p = g->part + u * g->ksplit * sz;
        memcpy(acc, p, sizeof(float) * (size_t)sz);
        for (int64_t s = 1; s < g->ksplit; s++)
            for (int64_t i = 0; i < sz; i++) acc[i] += p[s * sz + i];
        epilogue(g->j, u / g->nt, 0, M, n0, nc, acc, ldc, acc + sz);
    }
    free(acc);
}

/* The whole product by the small-M path. dot: tasks are (batch, 64-column
 * range). rows: (batch, column chunk whose M rows of sums fit in 64 KiB,
 * k range); the k range is split when there are fewer chunks than twice
 * the workers, so that each task streams whole rows of B, contiguous, and
 * the partial sums are added in k order afterwards. */
static tpu_status gemv_run(tpu_kargs *a, gemm_job *j, const tpu_tensor *A, const tpu_tensor *B, int64_t nb) {
    gemv_job g = {.j = j,
                  .A = A,
                  .B = B,
                  .dot = B->strides[1] == 1 && B->strides[2] != 1,
                  .avx2 = tpu_mxu_detected() != TPU_MXU_PORTABLE &&
                          (tpu_cpu_features() & (TPU_CPU_AVX2 | TPU_CPU_FMA)) == (TPU_CPU_AVX2 | TPU_CPU_FMA)};
    int nw = tpu_compute_workers();
    int64_t most = g.dot ? 64 : (16384 / j->M) / 8 * 8, nt = (j->N + most - 1) / most;
    if (g.dot && nb == 1) nt = (nt + nw - 1) / nw * nw;
    g.ncol = ((j->N + nt - 1) / nt + 7) / 8 * 8;
    g.nt = (j->N + g.ncol - 1) / g.ncol;
    g.ksplit = 1;
    if (!g.dot && nb * g.nt < 2 * nw) {
        int64_t want = (2 * nw + nb * g.nt - 1) / (nb * g.nt), most_k = (j->K + GEMV_KMIN - 1) / GEMV_KMIN;
        g.ksplit = want < most_k ? want : most_k;
    }
    g.krange = ((j->K + g.ksplit - 1) / g.ksplit + 3) / 4 * 4;
    g.ksplit = (j->K + g.krange - 1) / g.krange;
    int64_t ntask = nb * g.nt * g.ksplit;
    if (g.ksplit > 1) {
        g.part = malloc(sizeof(float) * (size_t)(ntask * j->M * g.ncol));
        if (!g.part) return tpu_kernel_fail(a, "out of scratch memory for matmul");
    }
    tpu_parallel_for(ntask, 1, gemv_task, &g);
    if (g.part) tpu_parallel_for(nb * g.nt, 1, gemv_finish, &g);
    free(g.part);
    return atomic_load(&j->no_scratch) ? tpu_kernel_fail(a, "out of scratch memory for matmul") : TPU_OK;
}

/* float64 (and anything else): straightforward, exact in double. Rows of B
 * and of the output move through double buffers. */
static void gemm_f64_rows(void *ctx, int64_t rb, int64_t re) {
    gemm_job *j = ctx;
    const tpu_kargs *a = j->a;
    const tpu_tensor *o = &a->t[0], *c = a->n > 3 ? &a->t[3] : NULL;
    tpu_args_MATMUL prm = tpu_unpack_MATMUL(&a->p);
    size_t N = (size_t)(j->N ? j->N : 1);
    double *row = malloc(sizeof(double) * 2 * N), *brow = row + N;
    if (!row) {
        atomic_store(&j->no_scratch, true);
        return;
    }
    for (int64_t i = rb; i < re; i++) {
        for (int64_t q = 0; q < j->N; q++) row[q] = 0;
        for (int64_t k = 0; k < j->K; k++) {
            double av = tpu_load_f64(mat_ptr(&j->A, i, k), j->A.dt);
            tpu_tile_load_f64(brow, mat_ptr(&j->B, k, 0), j->B.cs, j->N, j->B.dt);
            for (int64_t q = 0; q < j->N; q++) row[q] += av * brow[q];
        }
        for (int64_t q = 0; q < j->N; q++) {
            double v = prm.alpha * row[q];
            if (c && prm.beta != 0.0)
                v += prm.beta * (c->is_scalar ? c->f
                                              : tpu_load_f64(tpu_elem_ptr(c, j->batch * c->strides[0] +
                                                                                 i * c->strides[1] + q * c->strides[2]),
                                                             (tpu_dtype)c->dtype));
            row[q] = v;
        }
        tpu_tile_store_f64(tpu_elem_ptr(o, j->batch * o->strides[0] + i * o->strides[1]), o->strides[2], row, j->N,
                           (tpu_dtype)o->dtype);
    }
    free(row);
}

/* The product of a checked MATMUL launch; cv: B is a convolution's windows
 * (one batch, float operands). */
static tpu_status gemm_run(tpu_kargs *a, const conv_src *cv) {
    const tpu_tensor *o = &a->t[0], *A = &a->t[1], *B = &a->t[2];
    gemm_job j;
    memset(&j, 0, sizeof j);
    atomic_init(&j.no_scratch, false);
    j.a = a;
    j.cv = cv;
    j.M = o->sizes[1];
    j.N = o->sizes[2];
    j.K = A->sizes[2];
    if (j.M == 0 || j.N == 0) return TPU_OK;
    tpu_dtype dt = (tpu_dtype)A->dtype;
    int prec = (int)tpu_unpack_MATMUL(&a->p).precision;
    bool any_f64 = dt == TPU_F64 || B->dtype == TPU_F64 || o->dtype == TPU_F64;
    j.use_bf16 = !any_f64 && (dt == TPU_BF16 || (dt == TPU_F32 && prec >= 1));
    j.passes = (dt == TPU_F32 && prec == 1) ? 3 : 1;
    j.u = gemm_pick(j.use_bf16);
    j.round_a = j.use_bf16 && !j.u->pairs && (j.passes == 3 || dt != TPU_BF16);
    j.round_b = j.use_bf16 && !j.u->pairs && (j.passes == 3 || B->dtype != TPU_BF16);
    j.Kp = (j.K + j.u->kstep - 1) / j.u->kstep * j.u->kstep;
    j.npanels = (j.N + j.u->nr - 1) / j.u->nr;
    /* Row blocks of about the unit's mc_target rows, as many as a multiple of the
     * workers (so that they end together), each a multiple of MR; split
     * columns too when row blocks are few. */
    int nw = tpu_compute_workers();
    int64_t mr = j.u->mr, blocks = (j.M + j.u->mc_target - 1) / j.u->mc_target;
    blocks = (blocks + nw - 1) / nw * nw;
    j.mc = ((j.M + blocks - 1) / blocks + mr - 1) / mr * mr;
    j.mtasks = (j.M + j.mc - 1) / j.mc;
    j.nsplit = j.mtasks >= 2 * nw ? 1 : (2 * nw + j.mtasks - 1) / j.mtasks;
    if (j.nsplit > j.npanels) j.nsplit = j.npanels;
    bool gemv_dtypes = tpu_dtype_size(dt) <= 4 && tpu_dtype_size((tpu_dtype)B->dtype) <= 4 &&
                       tpu_dtype_is_float((tpu_dtype)B->dtype) && !(dt == TPU_F32 && prec >= 1);
    if (!cv && !any_f64 && tpu_dtype_is_float(dt) && gemv_dtypes && j.M <= GEMV_M && j.K > 0) {
        return gemv_run(a, &j, A, B, o->sizes[0]);
    }
    size_t bytes = (size_t)(j.Kp ? j.Kp : 1) * (size_t)j.npanels * (size_t)j.u->nr * (j.u->pairs ? 2 : 4);
    int nb = j.passes == 3 ? 2 : 1;
    bool f64_rows = any_f64 || !tpu_dtype_is_float(dt) || !tpu_dtype_is_float((tpu_dtype)B->dtype);
    for (int q = 0; q < nb && !f64_rows; q++)
        if (!(j.bpack[q] = alloc64(bytes))) {
            free(j.bpack[0]);
            return tpu_kernel_fail(a, "out of scratch memory for matmul");
        }
    for (int64_t b = 0; b < o->sizes[0]; b++) {
        j.batch = b;
        j.A = (mat){tpu_elem_ptr(A, b * A->strides[0]), dt, A->strides[1], A->strides[2]};
        j.B = (mat){tpu_elem_ptr(B, b * B->strides[0]), (tpu_dtype)B->dtype, B->strides[1], B->strides[2]};
        if (f64_rows) {
            tpu_parallel_for(j.M, 16, gemm_f64_rows, &j);
            continue;
        }
        for (int q = 0; q < nb; q++) {
            pack_ctx pc = {&j, j.passes == 3 ? q + 1 : 0, j.bpack[q]};
            tpu_parallel_for(j.npanels, 4, pack_b_panels, &pc);
        }
        tpu_parallel_for(j.mtasks * j.nsplit, 1, task, &j);
    }
    for (int q = 0; q < nb; q++) free(j.bpack[q]);
    return atomic_load(&j.no_scratch) ? tpu_kernel_fail(a, "out of scratch memory for matmul") : TPU_OK;
}

/* A tensor descriptor as a 3-d (1, r, c) matrix at element offset off with
 * row and column strides sr, sc. */
static tpu_tensor as_mat(const tpu_tensor *t, int64_t off, int64_t r, int64_t c, int64_t sr, int64_t sc) {
    tpu_tensor m = *t;
    m.offset += off;
    m.ndim = 3;
    m.sizes[0] = 1, m.sizes[1] = r, m.sizes[2] = c;
    m.strides[0] = 0, m.strides[1] = sr, m.strides[2] = sc;
    return m;
}

/* CONV2D: per image and group, out (Og x OH*OW) = w (Og x K) @ windows
 * (K x OH*OW) + bias, the windows packed straight from the image. */
static tpu_status conv2d(tpu_kargs *a) {
    tpu_conv_geom g;
    tpu_status s = tpu_conv2d_check(a, &g);
    if (s) return s;
    const tpu_tensor *o = &a->t[0], *x = &a->t[1], *w = &a->t[2], *b = a->n > 3 ? &a->t[3] : NULL;
    if (g.OH > 1 && o->strides[2] != g.OW * o->strides[3])
        return tpu_kernel_fail(a, "conv2d: the output's (oh, ow) dims must be dense together");
    if ((g.kw > 1 || g.kh > 1 || g.Cg > 1) && ((g.kh > 1 && w->strides[2] != g.kw * w->strides[3]) ||
                                               (g.Cg > 1 && w->strides[1] != g.kh * g.kw * w->strides[3])))
        return tpu_kernel_fail(a, "conv2d: the weight's (C/groups, kh, kw) dims must be dense together");
    int64_t L = g.OH * g.OW;
    if (g.N == 0 || g.O == 0 || L == 0) return TPU_OK;
    tpu_kargs *sub = malloc(sizeof *sub);
    if (!sub) return tpu_kernel_fail(a, "out of scratch memory for conv2d");
    tpu_args_CONV2D q = tpu_unpack_CONV2D(&a->p);
    for (int64_t n = 0; n < g.N && !s; n++)
        for (int64_t grp = 0; grp < g.G && !s; grp++) {
            sub->op = TPU_OP_MATMUL;
            sub->n = b ? 4 : 3;
            sub->site = a->site;
            sub->p = TPU_PARAMS(MATMUL, .alpha = 1.0, .beta = b ? 1.0 : 0.0, .precision = q.precision);
            sub->t[0] =
                as_mat(o, n * o->strides[0] + grp * g.Og * o->strides[1], g.Og, L, o->strides[1], o->strides[3]);
            sub->t[1] = as_mat(w, grp * g.Og * w->strides[0], g.Og, g.K, w->strides[0], w->strides[3]);
            sub->t[2] = as_mat(x, 0, g.K, L, 0, 0); /* its dtype and shape; the data comes through cv */
            if (b) sub->t[3] = as_mat(b, grp * g.Og * b->strides[0], g.Og, L, b->strides[0], 0);
            conv_src cv = {x, tpu_elem_ptr(x, n * x->strides[0] + grp * g.Cg * x->strides[1]), g};
            s = gemm_run(sub, &cv);
            if (s) memcpy(a->err, sub->err, sizeof a->err);
        }
    free(sub);
    return s;
}

tpu_status tpu_k_gemm(tpu_kargs *a) {
    if (a->op == TPU_OP_CONV2D) return conv2d(a);
    tpu_status s = tpu_gemm_check(a);
    if (s) return s;
    return gemm_run(a, NULL);
}
