/* gemm.c - the matrix unit: out = beta*C + alpha*(A @ B), batched, any strides.
 *
 * DESIGN
 * Goto-style blocking. B is packed once per batch into KC x 32 panels (fp32,
 * or bf16 pairs for the bf16 unit); the output is cut into MC-row x column-range tasks run
 * on the compute workers; each task packs its A block (MR=8 rows per sliver)
 * and runs an 8x32 micro-kernel into an fp32 accumulator tile, then applies
 * the epilogue (alpha, beta*C, dtype conversion, output strides) once.
 *
 * Matrix units, picked at run time:
 *   fp32 FMA      AVX-512 (vfmadd231ps), else portable C
 *   bf16 -> fp32  AVX512-BF16 (vdpbf16ps on k-pairs), else portable C
 * bf16/f16 inputs and fp32 at "medium" precision use the bf16 unit (f16 is
 * computed in fp32); "high" runs three bf16 passes (hi*hi + hi*lo + lo*hi).
 * AMX tiles are detected but not used yet (no AMX host to validate on).
 * float64 uses a plain blocked loop. */
#include "kernels/kernels-impl.h"
#include "kernels/tile-impl.h"
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define MR 8
#define NR 32
#define KC 256
#define MC 64


/* ---------------- micro-kernels: acc[MR][NR] (+)= Ap * Bp ---------------- */

__attribute__((target("avx512f")))
static void ukr_f32_avx512(int kc, const float *ap, const float *bp, float *c, int ldc, int first) {
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

static void ukr_f32_c(int kc, const float *ap, const float *bp, float *c, int ldc, int first) {
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
__attribute__((target("avx512f,avx512bf16")))
static void ukr_bf16_avx512(int kc, const uint32_t *ap, const uint32_t *bp, float *c, int ldc, int first) {
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

static void ukr_bf16_c(int kc, const uint32_t *ap, const uint32_t *bp, float *c, int ldc, int first) {
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

/* ---------------- element access ---------------- */

typedef struct mat { const char *base; tpu_dtype dt; int64_t rs, cs; } mat;

static inline const char *mat_ptr(const mat *m, int64_t r, int64_t c) {
    return m->base + (size_t)(r * m->rs + c * m->cs) * tpu_dtype_size(m->dt);
}

/* Split x into bf16 hi + bf16 lo (part: 0 = plain round, 1 = hi, 2 = lo). */
static inline uint16_t to_bf16_part(float x, int part) {
    if (part == 0) return tpu_f32_to_bf16(x);
    union { float f; uint32_t u; } v = { x };
    v.u &= 0xffff0000u;                       /* hi: truncation keeps x - hi exact in fp32 */
    if (part == 1) return (uint16_t)(v.u >> 16);
    return tpu_f32_to_bf16(x - v.f);
}

/* ---------------- the driver ---------------- */

typedef struct gemm_job {
    int64_t M, N, K, Kp;      /* Kp: K rounded to the k-step (even for bf16) */
    mat A, B;
    const tpu_kargs *a;
    int64_t batch;
    int use_bf16, passes, avx;     /* passes: 1, or 3 for "high" */
    void *bpack[2];                /* packed B (hi, lo): [K/KC][Npad/NR][kc][NR] */
    int64_t npanels;               /* NR-wide column panels */
    int64_t mtasks, nsplit;        /* tasks: MC-row blocks x column ranges */
} gemm_job;

/* Start of panel `panel` of k-block kb in packed B, in floats or bf16 pairs. */
static size_t bpack_index(const gemm_job *j, int64_t kb, int64_t panel) {
    int64_t kc = j->Kp - kb * KC < KC ? j->Kp - kb * KC : KC;
    int64_t step = j->use_bf16 ? 2 : 1;
    return (size_t)((kb * (KC / step) * j->npanels + panel * (kc / step)) * NR);
}

typedef struct pack_ctx { gemm_job *j; int part; void *dst; } pack_ctx;

/* Pack B panels [pb, pe) of every k-block (parallel over panels). */
static void pack_b_panels(void *ctx, int64_t pb, int64_t pe) {
    pack_ctx *c = ctx;
    gemm_job *j = c->j;
    float row[NR], row2[NR];
    for (int64_t kb = 0; kb * KC < j->Kp; kb++) {
        int64_t k0 = kb * KC, kc = j->Kp - k0 < KC ? j->Kp - k0 : KC;
        for (int64_t p = pb; p < pe; p++) {
            int64_t c0 = p * NR, nc = j->N - c0 < NR ? j->N - c0 : NR;
            if (j->use_bf16) {
                uint32_t *out = (uint32_t *)c->dst + bpack_index(j, kb, p);
                for (int64_t k = 0; k < kc; k += 2) {
                    memset(row, 0, sizeof row);
                    memset(row2, 0, sizeof row2);
                    if (k0 + k < j->K) tpu_tile_load_f32(row, mat_ptr(&j->B, k0 + k, c0), j->B.cs, nc, j->B.dt);
                    if (k0 + k + 1 < j->K)
                        tpu_tile_load_f32(row2, mat_ptr(&j->B, k0 + k + 1, c0), j->B.cs, nc, j->B.dt);
                    for (int q = 0; q < NR; q++)
                        out[(k / 2) * NR + q] = (uint32_t)to_bf16_part(row[q], c->part) |
                                                ((uint32_t)to_bf16_part(row2[q], c->part) << 16);
                }
            } else {
                float *out = (float *)c->dst + bpack_index(j, kb, p);
                for (int64_t k = 0; k < kc; k++) {
                    if (nc < NR) memset(out + k * NR, 0, NR * sizeof(float));
                    tpu_tile_load_f32(out + k * NR, mat_ptr(&j->B, k0 + k, c0), j->B.cs, nc, j->B.dt);
                }
            }
        }
    }
}

/* Pack rows [m0, m0+mcp) x k-range of A into MR-row slivers. */
static void pack_a(const gemm_job *j, int64_t m0, int64_t mcp, int64_t k0, int64_t kc, int part, void *dst, float *tmp) {
    for (int64_t s = 0; s < mcp; s += MR) {
        for (int r = 0; r < MR; r++) {
            int64_t row = m0 + s + r;
            int64_t kv = j->K - k0 < kc ? j->K - k0 : kc;       /* valid k in this block */
            if (row < j->M && kv > 0) tpu_tile_load_f32(tmp, mat_ptr(&j->A, row, k0), j->A.cs, kv, j->A.dt);
            else kv = 0;
            for (int64_t k = kv; k < kc; k++) tmp[k] = 0.0f;
            if (j->use_bf16) {
                uint32_t *out = (uint32_t *)dst + (s / MR) * (kc / 2) * MR;
                for (int64_t k = 0; k < kc; k += 2)
                    out[(k / 2) * MR + r] = (uint32_t)to_bf16_part(tmp[k], part) | ((uint32_t)to_bf16_part(tmp[k + 1], part) << 16);
            } else {
                float *out = (float *)dst + (s / MR) * kc * MR;
                for (int64_t k = 0; k < kc; k++) out[k * MR + r] = tmp[k];
            }
        }
    }
}

/* acc (the task's scratch) becomes alpha*acc + beta*C in place, then is stored. */
static void epilogue(const gemm_job *j, int64_t m0, int64_t mc, int64_t n0, int64_t nc, float *acc, int64_t ldc) {
    const tpu_kargs *a = j->a;
    const tpu_tensor *o = &a->t[0];
    const tpu_tensor *c = a->n > 3 ? &a->t[3] : NULL;
    float alpha = (float)a->p.f[0], beta = (float)a->p.f[1];
    tpu_dtype odt = (tpu_dtype)o->dtype;
    bool plain = !c && alpha == 1.0f && odt == TPU_F32 && o->strides[2] == 1;
    for (int64_t r = 0; r < mc; r++) {
        int64_t i = m0 + r;
        char *orow = tpu_elem_ptr(o, j->batch * o->strides[0] + i * o->strides[1] + n0 * o->strides[2]);
        float *arow = acc + r * ldc;
        for (int64_t q = 0; q < nc && !plain; q++) {
            float v = alpha * arow[q];
            if (c && beta != 0.0f) {
                float cv = c->is_scalar ? (float)c->f :
                    (float)tpu_load_f64(tpu_elem_ptr(c, j->batch * c->strides[0] + i * c->strides[1] + (n0 + q) * c->strides[2]), (tpu_dtype)c->dtype);
                v += beta * cv;
            }
            arow[q] = v;
        }
        tpu_tile_store_f32(orow, o->strides[2], arow, nc, odt);
    }
}

typedef void (*ukr_f32_fn)(int, const float *, const float *, float *, int, int);
typedef void (*ukr_bf16_fn)(int, const uint32_t *, const uint32_t *, float *, int, int);

/* Task t: row block t / nsplit, column panels range t % nsplit. */
static void task(void *ctx, int64_t tb, int64_t te) {
    gemm_job *j = ctx;
    int64_t ppt = (j->npanels + j->nsplit - 1) / j->nsplit;        /* panels per task */
    int64_t ldc = ppt * NR;
    float *acc = aligned_alloc(64, sizeof(float) * (size_t)(MC * ldc));
    void *apack = aligned_alloc(64, sizeof(float) * MC * KC);
    float *tmp = aligned_alloc(64, sizeof(float) * KC);
    if (!acc || !apack || !tmp) { free(acc); free(apack); free(tmp); return; }   /* leaves output unset */
    ukr_f32_fn uf = j->avx ? ukr_f32_avx512 : ukr_f32_c;
    ukr_bf16_fn ub = j->avx ? ukr_bf16_avx512 : ukr_bf16_c;
    for (int64_t t = tb; t < te; t++) {
        int64_t mt = t / j->nsplit, nt = t % j->nsplit;
        int64_t m0 = mt * MC, mc = j->M - m0 < MC ? j->M - m0 : MC;
        int64_t mcp = (mc + MR - 1) / MR * MR;
        int64_t p0 = nt * ppt, np = j->npanels - p0 < ppt ? j->npanels - p0 : ppt;
        if (np <= 0) continue;
        int64_t n0 = p0 * NR, nc = j->N - n0 < np * NR ? j->N - n0 : np * NR;
        int first = 1;
        if (j->Kp == 0) memset(acc, 0, sizeof(float) * (size_t)(MC * ldc));
        for (int64_t kb = 0; kb * KC < j->Kp; kb++) {
            int64_t k0 = kb * KC, kc = j->Kp - k0 < KC ? j->Kp - k0 : KC;
            for (int pass = 0; pass < j->passes; pass++) {
                /* passes for "high": (hi,hi), (hi,lo), (lo,hi) */
                int apart = j->passes == 1 ? 0 : (pass == 2 ? 2 : 1);
                int bsel = j->passes == 1 ? 0 : (pass == 1 ? 1 : 0);
                pack_a(j, m0, mcp, k0, kc, apart, apack, tmp);
                for (int64_t p = 0; p < np; p++)
                    for (int64_t s = 0; s < mcp; s += MR) {
                        float *cp = acc + s * ldc + p * NR;
                        if (j->use_bf16)
                            ub((int)kc, (const uint32_t *)apack + (s / MR) * (kc / 2) * MR,
                               (const uint32_t *)j->bpack[bsel] + bpack_index(j, kb, p0 + p), cp, (int)ldc, first);
                        else
                            uf((int)kc, (const float *)apack + (s / MR) * kc * MR,
                               (const float *)j->bpack[0] + bpack_index(j, kb, p0 + p), cp, (int)ldc, first);
                    }
                first = 0;
            }
        }
        epilogue(j, m0, mc, n0, nc, acc, ldc);
    }
    free(acc);
    free(apack);
    free(tmp);
}

/* float64 (and anything else): straightforward, exact in double. Rows of B
 * and of the output move through double buffers. */
static void gemm_f64_rows(void *ctx, int64_t rb, int64_t re) {
    gemm_job *j = ctx;
    const tpu_kargs *a = j->a;
    const tpu_tensor *o = &a->t[0], *c = a->n > 3 ? &a->t[3] : NULL;
    size_t N = (size_t)(j->N ? j->N : 1);
    double *row = malloc(sizeof(double) * 2 * N), *brow = row + N;
    if (!row) return;
    for (int64_t i = rb; i < re; i++) {
        for (int64_t q = 0; q < j->N; q++) row[q] = 0;
        for (int64_t k = 0; k < j->K; k++) {
            double av = tpu_load_f64(mat_ptr(&j->A, i, k), j->A.dt);
            tpu_tile_load_f64(brow, mat_ptr(&j->B, k, 0), j->B.cs, j->N, j->B.dt);
            for (int64_t q = 0; q < j->N; q++) row[q] += av * brow[q];
        }
        for (int64_t q = 0; q < j->N; q++) {
            double v = a->p.f[0] * row[q];
            if (c && a->p.f[1] != 0.0)
                v += a->p.f[1] * (c->is_scalar ? c->f : tpu_load_f64(tpu_elem_ptr(c, j->batch * c->strides[0] + i * c->strides[1] + q * c->strides[2]), (tpu_dtype)c->dtype));
            row[q] = v;
        }
        tpu_tile_store_f64(tpu_elem_ptr(o, j->batch * o->strides[0] + i * o->strides[1]), o->strides[2], row, j->N,
                           (tpu_dtype)o->dtype);
    }
    free(row);
}

tpu_status tpu_k_gemm(tpu_kargs *a) {
    tpu_status s = tpu_gemm_check(a);
    if (s) return s;
    const tpu_tensor *o = &a->t[0], *A = &a->t[1], *B = &a->t[2];
    gemm_job j;
    memset(&j, 0, sizeof j);
    j.a = a;
    j.M = o->sizes[1]; j.N = o->sizes[2]; j.K = A->sizes[2];
    if (j.M == 0 || j.N == 0) return TPU_OK;
    tpu_dtype dt = (tpu_dtype)A->dtype;
    int prec = (int)a->p.i[0];
    bool any_f64 = dt == TPU_F64 || B->dtype == TPU_F64 || o->dtype == TPU_F64;
    j.avx = tpu_mxu_detected() != TPU_MXU_PORTABLE;
    j.use_bf16 = !any_f64 && (dt == TPU_BF16 || (dt == TPU_F32 && prec >= 1));
    j.passes = (dt == TPU_F32 && prec == 1) ? 3 : 1;
    j.Kp = j.use_bf16 ? (j.K + 1) / 2 * 2 : j.K;
    j.npanels = (j.N + NR - 1) / NR;
    j.mtasks = (j.M + MC - 1) / MC;
    /* Enough tasks for every worker: split columns only when row blocks are few. */
    int nw = tpu_compute_workers();
    j.nsplit = j.mtasks >= 2 * nw ? 1 : (2 * nw + j.mtasks - 1) / j.mtasks;
    if (j.nsplit > j.npanels) j.nsplit = j.npanels;
    size_t bytes = (size_t)(j.Kp ? j.Kp : 1) * (size_t)j.npanels * NR * (j.use_bf16 ? 2 : 4);
    for (int64_t b = 0; b < o->sizes[0]; b++) {
        j.batch = b;
        j.A = (mat){ tpu_elem_ptr(A, b * A->strides[0]), dt, A->strides[1], A->strides[2] };
        j.B = (mat){ tpu_elem_ptr(B, b * B->strides[0]), (tpu_dtype)B->dtype, B->strides[1], B->strides[2] };
        if (any_f64 || !tpu_dtype_is_float(dt) || !tpu_dtype_is_float((tpu_dtype)B->dtype)) {
            tpu_parallel_for(j.M, 16, gemm_f64_rows, &j);
            continue;
        }
        int nb = j.passes == 3 ? 2 : 1;
        for (int q = 0; q < nb; q++) {
            j.bpack[q] = aligned_alloc(64, (bytes + 63) / 64 * 64);
            if (!j.bpack[q]) { free(j.bpack[0]); return tpu_kernel_fail(a, "out of scratch memory for matmul"); }
            pack_ctx pc = { &j, j.passes == 3 ? q + 1 : 0, j.bpack[q] };
            tpu_parallel_for(j.npanels, 4, pack_b_panels, &pc);
        }
        tpu_parallel_for(j.mtasks * j.nsplit, 1, task, &j);
        for (int q = 0; q < nb; q++) { free(j.bpack[q]); j.bpack[q] = NULL; }
    }
    return TPU_OK;
}
