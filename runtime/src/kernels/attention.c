/* attention.c - scaled dot-product attention, forward and backward, blocked
 * so that the L x S score matrix is never stored (the ATTN family).
 *
 * DESIGN. FlashAttention's scheme on the CPU. Forward: a task is one block
 * of AT_BQ query rows of one (batch, head); it walks the keys in blocks of
 * AT_BK, computes the block's scores S = Q K^T into a small fp32 tile,
 * folds them into a running max m and sum l per row (online softmax:
 * rescaling the row's output accumulator by exp(m_old - m_new) when the max
 * grows) and accumulates P V. At the end out = acc / l and lse = m + log l,
 * which the backward reuses to recompute P without a second softmax.
 * Backward: a task is one (batch, key head) with all the query heads that
 * read it (grouped-query attention), so dK and dV accumulate in the task's
 * own buffers without atomics; per key block and query block it recomputes
 * P = exp(S - lse), dP = dO V^T, dS = P (dP z - D) with D = rowsum(dO o),
 * and accumulates dV += (P z)^T dO, dQ += dS K, dK += dS^T Q.
 * Every product is one micro-kernel, C (+)= A B over fp32 tiles with B's
 * rows contiguous and 16-float aligned widths (tiles are padded with zeros)
 * and A read through two strides, so A^T products need no transpose:
 * AVX-512 intrinsics (4 rows x 64 columns, 16 accumulators) where the CPU
 * has them, plain C elsewhere. Operands are read once per tile through the
 * tile layer (any dtype, any strides) into fp32; results are rounded once at
 * the store. Causal blocks above the diagonal are skipped, not masked.
 *
 * Costs: the forward parallelizes over B * H * ceil(L / AT_BQ) tasks, the
 * backward over B * Hk only (one worker when B * Hk is 1). The backward
 * holds a head's Q, dO, dQ and a key head's K, V, dK, dV in fp32:
 * (3 L + 4 S) * (E or Ev, rounded up to 16) floats per task, from malloc.
 * Dropout draws one Philox word per score element, the same element numbers
 * as the reference (ref_attn.c), so every mode and tiling drops the same
 * elements. */
#include "kernels/kernels-impl.h"
#include "kernels/tile-impl.h"
#include "kernels/vmath-impl.h"
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define AT_BQ     64 /* query rows per block */
#define AT_BK     64 /* keys per block: score tiles are AT_BK floats wide */
#define AT_INLINE static inline __attribute__((always_inline))
#if defined(__x86_64__) && defined(__GNUC__)
#define AT_CLONES TPU_TARGET_CLONES
#else
#define AT_CLONES
#endif

static int64_t at_pad16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* ---- the micro-kernel: C[M x N] = (zero ? 0 : C) + A B ----
 * A(r, k) = A[r * ars + k * acs]; B is K x N with row stride ldb; N and ldb,
 * ldc multiples of 16. */
static int at_isa = -1; /* 1: AVX-512, 0: C; picked on first use */

#define AT_TILE(MR, NV)                                                                                             \
    __attribute__((target("avx512f"))) static void at_tile_##MR##_##NV(                                             \
        float *restrict C, int64_t ldc, const float *restrict A, int64_t ars, int64_t acs, const float *restrict B, \
        int64_t ldb, int64_t K, bool zero) {                                                                        \
        __m512 c[MR][NV];                                                                                           \
        _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++) _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)   \
            c[r][v] = zero ? _mm512_setzero_ps() : _mm512_loadu_ps(C + r * ldc + 16 * v);                           \
        for (int64_t k = 0; k < K; k++) {                                                                           \
            __m512 b[NV];                                                                                           \
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) b[v] = _mm512_loadu_ps(B + k * ldb + 16 * v);      \
            _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++) {                                                  \
                __m512 s = _mm512_set1_ps(A[r * ars + k * acs]);                                                    \
                _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) c[r][v] = _mm512_fmadd_ps(s, b[v], c[r][v]);   \
            }                                                                                                       \
        }                                                                                                           \
        _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++) _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)   \
            _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);                                                        \
    }
AT_TILE(4, 1)
AT_TILE(4, 2)
AT_TILE(4, 3)
AT_TILE(4, 4)
AT_TILE(1, 1)
AT_TILE(1, 2)
AT_TILE(1, 3)
AT_TILE(1, 4)
#undef AT_TILE

typedef void (*at_tile_fn)(float *restrict, int64_t, const float *restrict, int64_t, int64_t, const float *restrict,
                           int64_t, int64_t, bool);
static const at_tile_fn at_tiles[2][4] = {{at_tile_1_1, at_tile_1_2, at_tile_1_3, at_tile_1_4},
                                          {at_tile_4_1, at_tile_4_2, at_tile_4_3, at_tile_4_4}};

static void at_mm_c(float *restrict C, int64_t ldc, const float *restrict A, int64_t ars, int64_t acs,
                    const float *restrict B, int64_t ldb, int64_t M, int64_t N, int64_t K, bool zero) {
    for (int64_t r = 0; r < M; r++) {
        float *c = C + r * ldc;
        if (zero) memset(c, 0, (size_t)N * sizeof *c);
        for (int64_t k = 0; k < K; k++) {
            const float s = A[r * ars + k * acs], *b = B + k * ldb;
            for (int64_t n = 0; n < N; n++) c[n] = fmaf(s, b[n], c[n]);
        }
    }
}

static void at_mm(float *restrict C, int64_t ldc, const float *restrict A, int64_t ars, int64_t acs,
                  const float *restrict B, int64_t ldb, int64_t M, int64_t N, int64_t K, bool zero) {
    if (!at_isa) {
        at_mm_c(C, ldc, A, ars, acs, B, ldb, M, N, K, zero);
        return;
    }
    for (int64_t n0 = 0; n0 < N; n0 += 64) {
        int nv = N - n0 >= 64 ? 4 : (int)((N - n0) / 16);
        int64_t r = 0;
        for (; r + 4 <= M; r += 4)
            at_tiles[1][nv - 1](C + r * ldc + n0, ldc, A + r * ars, ars, acs, B + n0, ldb, K, zero);
        for (; r < M; r++) at_tiles[0][nv - 1](C + r * ldc + n0, ldc, A + r * ars, ars, acs, B + n0, ldb, K, zero);
    }
}

void tpu_attn_set_isa(int isa) { at_isa = isa ? ((tpu_cpu_features() & TPU_CPU_AVX512F) ? 1 : 0) : 0; }
int tpu_attn_get_isa(void) {
    if (at_isa < 0) tpu_attn_set_isa(1);
    return at_isa;
}

/* ---- operand rows ---- */

typedef struct at_job at_job;
struct at_job {
    tpu_kargs *a;
    tpu_attn_dims d;
    int64_t EP, EvP, nqb; /* padded widths; query blocks per head */
    int64_t ws;           /* floats of scratch a task uses */
    void (*task)(at_job *j, float *ws, int64_t task);
    atomic_int oom;
};

static const void *at_row(const tpu_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return tpu_elem_ptr(t, i0 * t->strides[0] + i1 * t->strides[1] + i2 * t->strides[2] + i3 * t->strides[3]);
}
/* dst[0..n) = t(i0, i1, i2, i3 + c) of 4-d t, then zeros up to np. */
static void at_load(float *dst, const tpu_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, int64_t n,
                    int64_t np) {
    tpu_tile_load_f32(dst, at_row(t, i0, i1, i2, i3), t->strides[3], n, (tpu_dtype)t->dtype);
    if (np > n) memset(dst + n, 0, (size_t)(np - n) * sizeof *dst);
}
static void at_store(const tpu_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, const float *src, int64_t n) {
    tpu_tile_store_f32((void *)at_row(t, i0, i1, i2, i3), t->strides[3], src, n, (tpu_dtype)t->dtype);
}
static float *at_lse_ptr(const tpu_tensor *lse, int64_t b, int64_t h, int64_t i) {
    return (float *)tpu_elem_ptr(lse, b * lse->strides[0] + h * lse->strides[1] + i * lse->strides[2]);
}

/* kt[e * AT_BK + c] = rows[c * ld + e] for c < nk, zero up to AT_BK: a
 * transposed key (or value) block from its fp32 rows. */
static void at_transpose(float *kt, const float *rows, int64_t ld, int64_t nk, int64_t E) {
    for (int64_t e = 0; e < E; e++) {
        float *row = kt + e * AT_BK;
        for (int64_t c = 0; c < nk; c++) row[c] = rows[c * ld + e];
        for (int64_t c = nk; c < AT_BK; c++) row[c] = 0;
    }
}

/* Scores of row i against keys j0 .. j0 + AT_BK: x = scale * s + mask, -inf
 * where excluded (past nk, above the diagonal, a false bool mask). */
AT_CLONES static void at_scores(const at_job *j, float *x, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t nk,
                                float *mrow) {
    const tpu_attn_dims *d = &j->d;
    const float scale = (float)d->scale;
    int64_t lim = nk;
    if (d->causal && i - j0 + 1 < lim) lim = i - j0 + 1 > 0 ? i - j0 + 1 : 0;
    if (!d->mask) {
        for (int c = 0; c < AT_BK; c++) x[c] = c < lim ? x[c] * scale : -INFINITY;
        return;
    }
    at_load(mrow, d->mask, b, h, i, j0, nk, AT_BK);
    if (d->mask->dtype == TPU_BOOL)
        for (int c = 0; c < AT_BK; c++) mrow[c] = mrow[c] != 0 ? 0.0f : -INFINITY;
    for (int c = 0; c < AT_BK; c++) x[c] = c < lim ? x[c] * scale + mrow[c] : -INFINITY;
}

/* z[c] for keys j0 .. j0 + nk of row i: 1 / (1 - p) if kept, else 0. */
static void at_dropout(const at_job *j, float *z, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t nk) {
    const tpu_attn_dims *d = &j->d;
    uint64_t n0 =
        (((uint64_t)b * (uint64_t)d->H + (uint64_t)h) * (uint64_t)d->L + (uint64_t)i) * (uint64_t)d->S + (uint64_t)j0;
    uint64_t g0 = n0 >> 2, g1 = (n0 + (uint64_t)nk + 3) >> 2;
    uint32_t w[4 * (AT_BK / 4 + 2)];
    tpu_philox_blocks(d->seed, d->offset, g0, (int)(g1 - g0), w);
    const float p = (float)d->dropout, keep = (float)(1.0 / (1.0 - d->dropout));
    for (int64_t c = 0; c < nk; c++) z[c] = tpu_u32_to_unit_float(w[n0 + (uint64_t)c - 4 * g0]) >= p ? keep : 0.0f;
    for (int64_t c = nk; c < AT_BK; c++) z[c] = 0;
}

/* ---- forward ---- */

AT_CLONES static void at_softmax_step(float *restrict x, float *restrict m, float *restrict l, float *restrict acc,
                                      int64_t EvP) {
    float mx = -INFINITY;
    for (int c = 0; c < AT_BK; c++) mx = x[c] > mx ? x[c] : mx;
    float mn = mx > *m ? mx : *m, mu = mn == -INFINITY ? 0.0f : mn;
    float alpha = ew_expf(*m - mu), sum = 0;
    for (int c = 0; c < AT_BK; c++) {
        x[c] = ew_expf(x[c] - mu);
        sum += x[c];
    }
    *l = *l * alpha + sum;
    *m = mn;
    if (alpha != 1.0f)
        for (int64_t e = 0; e < EvP; e++) acc[e] *= alpha;
}

static void at_fwd_block(at_job *j, float *ws, int64_t task) {
    const tpu_attn_dims *d = &j->d;
    tpu_kargs *a = j->a;
    const tpu_tensor *o = &a->t[0], *lse = &a->t[1], *q = &a->t[2], *k = &a->t[3], *v = &a->t[4];
    const int64_t E = d->E, Ev = d->Ev, EvP = j->EvP, bh = task / j->nqb;
    const int64_t b = bh / d->H, h = bh % d->H, hk = h / (d->H / d->Hk);
    const int64_t i0 = (task % j->nqb) * AT_BQ, nq = d->L - i0 < AT_BQ ? d->L - i0 : AT_BQ;
    float *qb = ws, *kt = qb + AT_BQ * E, *vb = kt + E * AT_BK, *x = vb + AT_BK * EvP, *acc = x + AT_BQ * AT_BK;
    float *m = acc + AT_BQ * EvP, *l = m + AT_BQ, *mrow = l + AT_BQ, *z = mrow + AT_BK, *kr = z + AT_BK;
    for (int64_t r = 0; r < nq; r++) {
        at_load(qb + r * E, q, b, h, i0 + r, 0, E, E);
        m[r] = -INFINITY;
        l[r] = 0;
    }
    memset(acc, 0, (size_t)(nq * EvP) * sizeof *acc);
    int64_t jend = d->causal && i0 + nq < d->S ? i0 + nq : d->S;
    for (int64_t j0 = 0; j0 < jend; j0 += AT_BK) {
        const int64_t nk = jend - j0 < AT_BK ? jend - j0 : AT_BK;
        for (int64_t c = 0; c < nk; c++) {
            at_load(kr + c * E, k, b, hk, j0 + c, 0, E, E);
            at_load(vb + c * EvP, v, b, hk, j0 + c, 0, Ev, EvP);
        }
        at_transpose(kt, kr, E, nk, E);
        at_mm(x, AT_BK, qb, E, 1, kt, AT_BK, nq, AT_BK, E, true);
        for (int64_t r = 0; r < nq; r++) {
            float *xr = x + r * AT_BK;
            at_scores(j, xr, b, h, i0 + r, j0, nk, mrow);
            at_softmax_step(xr, &m[r], &l[r], acc + r * EvP, EvP);
            if (d->dropout > 0) {
                at_dropout(j, z, b, h, i0 + r, j0, nk);
                for (int c = 0; c < AT_BK; c++) xr[c] *= z[c];
            }
        }
        at_mm(acc, EvP, x, AT_BK, 1, vb, EvP, nq, EvP, nk, false);
    }
    for (int64_t r = 0; r < nq; r++) {
        float inv = l[r] > 0 ? 1.0f / l[r] : l[r] == 0 ? 0.0f : NAN, *ar = acc + r * EvP;
        for (int64_t e = 0; e < Ev; e++) ar[e] *= inv;
        at_store(o, b, h, i0 + r, 0, ar, Ev);
        *at_lse_ptr(lse, b, h, i0 + r) = l[r] > 0 ? m[r] + logf(l[r]) : l[r] == 0 ? -INFINITY : NAN;
    }
}

static int64_t at_fwd_ws(const at_job *j) {
    const int64_t E = j->d.E, EvP = j->EvP;
    return AT_BQ * E + E * AT_BK + AT_BK * EvP + AT_BQ * AT_BK + AT_BQ * EvP + 2 * AT_BQ + 2 * AT_BK + AT_BK * E;
}

/* ---- backward ---- */

/* One score row of the backward: x holds the scores, dp = dO V^T; leaves dS
 * in x and P z (the weights out used) in dp. z NULL: no dropout. */
AT_CLONES static void at_bwd_row(float *restrict x, float *restrict dp, const float *restrict z, float lse, float D) {
    if (lse == -INFINITY) {
        memset(x, 0, AT_BK * sizeof *x);
        memset(dp, 0, AT_BK * sizeof *dp);
        return;
    }
    if (z)
        for (int c = 0; c < AT_BK; c++) {
            float p = ew_expf(x[c] - lse);
            x[c] = p * (dp[c] * z[c] - D);
            dp[c] = p * z[c];
        }
    else
        for (int c = 0; c < AT_BK; c++) {
            float p = ew_expf(x[c] - lse);
            x[c] = p * (dp[c] - D);
            dp[c] = p;
        }
}

static void at_bwd_task(at_job *j, float *ws, int64_t task) {
    const tpu_attn_dims *d = &j->d;
    tpu_kargs *a = j->a;
    const tpu_tensor *dq = &a->t[0], *dk = &a->t[1], *dv = &a->t[2], *dm = &a->t[3];
    const tpu_tensor *go = &a->t[4], *q = &a->t[5], *k = &a->t[6], *v = &a->t[7], *o = &a->t[8], *lse = &a->t[9];
    const int64_t L = d->L, S = d->S, E = d->E, Ev = d->Ev, EP = j->EP, EvP = j->EvP, G = d->H / d->Hk;
    const int64_t b = task / d->Hk, hk = task % d->Hk;
    float *Q = ws, *dO = Q + L * EP, *dQ = dO + L * EvP, *K = dQ + L * EP, *V = K + S * EP, *dK = V + S * EvP;
    float *dV = dK + S * EP, *D = dV + S * EvP, *lv = D + L, *kt = lv + L, *vt = kt + E * AT_BK;
    float *x = vt + Ev * AT_BK, *dp = x + AT_BQ * AT_BK, *mrow = dp + AT_BQ * AT_BK, *z = mrow + AT_BK;
    float *orow = z + AT_BK;
    const float scale = (float)d->scale;
    for (int64_t c = 0; c < S; c++) {
        at_load(K + c * EP, k, b, hk, c, 0, E, EP);
        at_load(V + c * EvP, v, b, hk, c, 0, Ev, EvP);
    }
    memset(dK, 0, (size_t)(S * EP) * sizeof *dK);
    memset(dV, 0, (size_t)(S * EvP) * sizeof *dV);
    for (int64_t h = hk * G; h < (hk + 1) * G; h++) {
        for (int64_t i = 0; i < L; i++) {
            at_load(Q + i * EP, q, b, h, i, 0, E, EP);
            at_load(dO + i * EvP, go, b, h, i, 0, Ev, EvP);
            at_load(orow, o, b, h, i, 0, Ev, Ev);
            double acc = 0;
            for (int64_t e = 0; e < Ev; e++) acc += (double)orow[e] * dO[i * EvP + e];
            D[i] = (float)acc;
            lv[i] = *at_lse_ptr(lse, b, h, i);
        }
        memset(dQ, 0, (size_t)(L * EP) * sizeof *dQ);
        for (int64_t j0 = 0; j0 < S; j0 += AT_BK) {
            const int64_t nk = S - j0 < AT_BK ? S - j0 : AT_BK;
            at_transpose(kt, K + j0 * EP, EP, nk, E);
            at_transpose(vt, V + j0 * EvP, EvP, nk, Ev);
            int64_t qstart = d->causal ? j0 / AT_BQ * AT_BQ : 0;
            for (int64_t i0 = qstart; i0 < L; i0 += AT_BQ) {
                const int64_t nq = L - i0 < AT_BQ ? L - i0 : AT_BQ;
                at_mm(x, AT_BK, Q + i0 * EP, EP, 1, kt, AT_BK, nq, AT_BK, E, true);
                at_mm(dp, AT_BK, dO + i0 * EvP, EvP, 1, vt, AT_BK, nq, AT_BK, Ev, true);
                for (int64_t r = 0; r < nq; r++) {
                    const int64_t i = i0 + r;
                    float *xr = x + r * AT_BK, *dr = dp + r * AT_BK, li = lv[i], Di = D[i];
                    at_scores(j, xr, b, h, i, j0, nk, mrow);
                    if (d->dropout > 0) at_dropout(j, z, b, h, i, j0, nk);
                    at_bwd_row(xr, dr, d->dropout > 0 ? z : NULL, li, Di);
                    if (d->grad_mask) at_store(dm, b, h, i, j0, xr, nk);
                }
                /* dV[j0..] += (P z)^T dO; dK[j0..] += dS^T Q; dQ[i0..] += dS K. */
                at_mm(dV + j0 * EvP, EvP, dp, 1, AT_BK, dO + i0 * EvP, EvP, nk, EvP, nq, false);
                at_mm(dK + j0 * EP, EP, x, 1, AT_BK, Q + i0 * EP, EP, nk, EP, nq, false);
                at_mm(dQ + i0 * EP, EP, x, AT_BK, 1, K + j0 * EP, EP, nq, EP, nk, false);
            }
            if (d->grad_mask && d->causal) /* rows above the skipped blocks' diagonal: zero */
                for (int64_t i = 0; i < qstart; i++) {
                    memset(x, 0, AT_BK * sizeof *x);
                    at_store(dm, b, h, i, j0, x, nk);
                }
        }
        for (int64_t i = 0; i < L; i++) {
            float *r = dQ + i * EP;
            for (int64_t e = 0; e < E; e++) r[e] *= scale;
            at_store(dq, b, h, i, 0, r, E);
        }
    }
    for (int64_t c = 0; c < S; c++) {
        float *r = dK + c * EP;
        for (int64_t e = 0; e < E; e++) r[e] *= scale;
        at_store(dk, b, hk, c, 0, r, E);
        at_store(dv, b, hk, c, 0, dV + c * EvP, Ev);
    }
}

static int64_t at_bwd_ws(const at_job *j) {
    const int64_t L = j->d.L, S = j->d.S, E = j->d.E, Ev = j->d.Ev, EP = j->EP, EvP = j->EvP;
    return 2 * L * EP + L * EvP + 2 * S * EP + 2 * S * EvP + 2 * L + E * AT_BK + Ev * AT_BK + 2 * AT_BQ * AT_BK +
           2 * AT_BK + Ev;
}

/* A worker's share of the tasks, with one buffer of j->ws floats for all of them. */
static void at_range(void *ctx, int64_t t0, int64_t t1) {
    at_job *j = ctx;
    float *ws = malloc((size_t)j->ws * sizeof *ws);
    if (!ws) {
        atomic_store(&j->oom, 1);
        return;
    }
    for (int64_t t = t0; t < t1; t++) j->task(j, ws, t);
    free(ws);
}

tpu_status tpu_k_attention(tpu_kargs *a) {
    at_job j = {.a = a};
    tpu_status st = tpu_attn_check(a, &j.d);
    if (st) return st;
    tpu_attn_get_isa();
    j.EP = at_pad16(j.d.E);
    j.EvP = at_pad16(j.d.Ev);
    j.nqb = (j.d.L + AT_BQ - 1) / AT_BQ;
    atomic_init(&j.oom, 0);
    if (a->op == TPU_OP_ATTN) {
        j.task = at_fwd_block;
        j.ws = at_fwd_ws(&j);
        if (j.d.B * j.d.H * j.d.L == 0) return TPU_OK;
        tpu_parallel_for(j.d.B * j.d.H * j.nqb, 1, at_range, &j);
    } else {
        j.task = at_bwd_task;
        j.ws = at_bwd_ws(&j);
        if (j.d.B * j.d.Hk == 0) return TPU_OK;
        tpu_parallel_for(j.d.B * j.d.Hk, 1, at_range, &j);
    }
    if (atomic_load(&j.oom))
        return tpu_kernel_fail(a, "%s: out of host memory for the kernel's buffers", tpu_op_name(a->op));
    return TPU_OK;
}
