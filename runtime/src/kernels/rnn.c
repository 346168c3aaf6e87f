/* rnn.c - fused LSTM and GRU cells, forward and backward (the RNN family).
 *
 * The cells are what nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell run per time
 * step on an accelerator: the two GEMMs (input and hidden projections) run
 * as MATMUL launches, and one of these ops does everything elementwise after
 * them: bias, gate nonlinearities, the new state, and the activations the
 * backward needs (the "workspace"). Semantics, gate order and workspace
 * layout follow PyTorch's fused cells (ops.def documents each operand), so a
 * workspace could come from either side.
 *
 * DESIGN. Work is split by hidden column: each worker takes a range of
 * columns, cut into panels of RNN_PANEL columns; a panel is walked row by
 * row (batch 0..B-1), and each row in blocks of RNN_BLK columns. Every
 * element (b, j) of a cell reads the G gate columns j, H+j, ... of its row,
 * so a block touches G short runs per row. Each run is loaded
 * into a typed buffer (dtype conversion, any strides, absent operands read
 * as their scalar value) and the math runs over whole buffers with a fixed
 * trip count, which gcc -O2 vectorizes (target_clones'd for AVX-512 / AVX2).
 * Backward also sums gate gradients down the batch for the bias gradients
 * (per panel, in double); since a column's sum always runs over rows 0..B-1
 * in order, on one thread, results do not depend on the worker count. The
 * cost: 16 hidden columns or fewer run on one worker, whatever B.
 *
 * Compute domains: float32 / bfloat16 / float16 compute in float with the
 * branch-free exp of vmath-impl.h (about 1 ulp, vectorizable; PyTorch uses Sleef),
 * float64 in double with libm. Bias sums accumulate in double. */
#include "kernels/kernels-impl.h"
#include "kernels/tile-impl.h"
#include "kernels/vmath-impl.h"
#include <math.h>
#include <stdbool.h>
#include <string.h>

#define RNN_BLK         64   /* columns per block: the buffers' length */
#define RNN_PANEL       512  /* columns per panel (a multiple of RNN_BLK) */
#define RNN_GRAIN_ELEMS 8192 /* about this many elements per worker at least */
#define RNN_INLINE      static inline __attribute__((always_inline))

#if defined(__x86_64__) && defined(__GNUC__)
#define RNN_CLONES TPU_TARGET_CLONES
#else
#define RNN_CLONES
#endif

/* ---- float math (vectorizable: selects through bit masks, no calls) ---- */

RNN_INLINE float rnn_sigmoidf(float x) { return 1.0f / (1.0f + ew_expf(-x)); }

RNN_INLINE double rnn_sigmoidd(double x) { return 1.0 / (1.0 + exp(-x)); }

#define RNN_SIG(x)  _Generic((x), float: rnn_sigmoidf, double: rnn_sigmoidd)(x)
#define RNN_TANH(x) _Generic((x), float: ew_tanhf, double: tanh)(x)

/* ---- the cells over one block of RNN_BLK columns ----
 * Block buffers hold gate k at [k*RNN_BLK, (k+1)*RNN_BLK); panel buffers
 * (bias terms bs, bias gradient sums acc) hold gate k at k*RNN_PANEL, the
 * block's columns at its offset in the panel. Names follow ops.def: gi/gh
 * input and hidden gates, ws the workspace, d* gradients. bs holds, per
 * gate, the bias terms of the pre-activation (zeros when absent): LSTM
 * b1 + b2 for each gate; GRU b1 + b2 for r and z, then b1n and b2n apart. */
#define K0 (0 * RNN_BLK)
#define K1 (1 * RNN_BLK)
#define K2 (2 * RNN_BLK)
#define K3 (3 * RNN_BLK)
#define K4 (4 * RNN_BLK)
#define P1 (1 * RNN_PANEL)
#define P2 (2 * RNN_PANEL)
#define P3 (3 * RNN_PANEL)

#define RNN_CELLS(T, SFX)                                                                                         \
    RNN_CLONES static void lstm_fwd_##SFX(const T *restrict gi, const T *restrict gh, const T *restrict bs,       \
                                          const T *restrict cx, T *restrict hy, T *restrict cy, T *restrict ws) { \
        for (int j = 0; j < RNN_BLK; j++) {                                                                       \
            T i = RNN_SIG(gi[K0 + j] + gh[K0 + j] + bs[j]);                                                       \
            T f = RNN_SIG(gi[K1 + j] + gh[K1 + j] + bs[P1 + j]);                                                  \
            T g = RNN_TANH(gi[K2 + j] + gh[K2 + j] + bs[P2 + j]);                                                 \
            T o = RNN_SIG(gi[K3 + j] + gh[K3 + j] + bs[P3 + j]);                                                  \
            T c = f * cx[j] + i * g;                                                                              \
            cy[j] = c;                                                                                            \
            hy[j] = o * RNN_TANH(c);                                                                              \
            ws[K0 + j] = i;                                                                                       \
            ws[K1 + j] = f;                                                                                       \
            ws[K2 + j] = g;                                                                                       \
            ws[K3 + j] = o;                                                                                       \
        }                                                                                                         \
    }                                                                                                             \
                                                                                                                  \
    RNN_CLONES static void lstm_bwd_##SFX(const T *restrict ws, const T *restrict cx, const T *restrict cy,       \
                                          const T *restrict dhy, const T *restrict dcy, T *restrict dg,           \
                                          T *restrict dcx) {                                                      \
        for (int j = 0; j < RNN_BLK; j++) {                                                                       \
            T i = ws[K0 + j], f = ws[K1 + j], g = ws[K2 + j], o = ws[K3 + j];                                     \
            T tc = RNN_TANH(cy[j]);                                                                               \
            T dc = dhy[j] * o * (1 - tc * tc) + dcy[j];                                                           \
            dg[K0 + j] = dc * g * (1 - i) * i;                                                                    \
            dg[K1 + j] = dc * cx[j] * (1 - f) * f;                                                                \
            dg[K2 + j] = dc * i * (1 - g * g);                                                                    \
            dg[K3 + j] = dhy[j] * tc * (1 - o) * o;                                                               \
            dcx[j] = dc * f;                                                                                      \
        }                                                                                                         \
    }                                                                                                             \
                                                                                                                  \
    /* ws = (r, z, n, hx, hn + b2n) */                                                                            \
    RNN_CLONES static void gru_fwd_##SFX(const T *restrict gi, const T *restrict gh, const T *restrict bs,        \
                                         const T *restrict hx, T *restrict hy, T *restrict ws) {                  \
        for (int j = 0; j < RNN_BLK; j++) {                                                                       \
            T r = RNN_SIG(gi[K0 + j] + gh[K0 + j] + bs[j]);                                                       \
            T z = RNN_SIG(gi[K1 + j] + gh[K1 + j] + bs[P1 + j]);                                                  \
            T hn = gh[K2 + j] + bs[P3 + j];                                                                       \
            T n = RNN_TANH(gi[K2 + j] + bs[P2 + j] + r * hn);                                                     \
            hy[j] = n + z * (hx[j] - n);                                                                          \
            ws[K0 + j] = r;                                                                                       \
            ws[K1 + j] = z;                                                                                       \
            ws[K2 + j] = n;                                                                                       \
            ws[K3 + j] = hx[j];                                                                                   \
            ws[K4 + j] = hn;                                                                                      \
        }                                                                                                         \
    }                                                                                                             \
                                                                                                                  \
    /* dg = (dr, dz, dn of the input gates, dn of the hidden gates) */                                            \
    RNN_CLONES static void gru_bwd_##SFX(const T *restrict ws, const T *restrict dhy, T *restrict dg,             \
                                         T *restrict dhx) {                                                       \
        for (int j = 0; j < RNN_BLK; j++) {                                                                       \
            T r = ws[K0 + j], z = ws[K1 + j], n = ws[K2 + j], hx = ws[K3 + j], hn = ws[K4 + j];                   \
            T d = dhy[j];                                                                                         \
            T din = d * (1 - z) * (1 - n * n);                                                                    \
            dg[K0 + j] = din * hn * (1 - r) * r;                                                                  \
            dg[K1 + j] = d * (hx - n) * (1 - z) * z;                                                              \
            dg[K2 + j] = din;                                                                                     \
            dg[K3 + j] = din * r;                                                                                 \
            dhx[j] = d * z;                                                                                       \
        }                                                                                                         \
    }                                                                                                             \
                                                                                                                  \
    RNN_CLONES static void acc_##SFX(double *restrict acc, const T *restrict v, int ngates) {                     \
        for (int k = 0; k < ngates; k++)                                                                          \
            for (int j = 0; j < RNN_BLK; j++) acc[k * RNN_PANEL + j] += (double)v[k * RNN_BLK + j];               \
    }

RNN_CELLS(float, f)
RNN_CELLS(double, d)

/* ---- moving runs of a row in and out of the buffers ---- */

/* Element offset and stride of run `col` of row `row` (a 1-d operand has no row). */
static int64_t run_off(const tpu_tensor *t, int64_t row, int64_t col) {
    if (t->ndim == 1) return t->offset + col * t->strides[0];
    return t->offset + row * t->strides[0] + col * t->strides[1];
}

/* dst[0..n) = the run; dst[n..RNN_BLK) = 0 so the math stays finite. An
 * absent operand (a host scalar) reads as its value. */
static void run_load(const tpu_tensor *t, int64_t row, int64_t col, int n, bool dbl, void *dst) {
    float *df = dst;
    double *dd = dst;
    if (t->is_scalar) {
        for (int j = 0; j < n; j++)
            if (dbl)
                dd[j] = t->f;
            else
                df[j] = (float)t->f;
    } else {
        tpu_dtype dt = (tpu_dtype)t->dtype;
        const char *p = (const char *)t->base + (size_t)run_off(t, row, col) * tpu_dtype_size(dt);
        int64_t st = t->strides[t->ndim - 1];
        if (dbl)
            tpu_tile_load_f64(dd, p, st, n, dt);
        else
            tpu_tile_load_f32(df, p, st, n, dt);
    }
    size_t es = dbl ? 8 : 4;
    memset((char *)dst + (size_t)n * es, 0, (size_t)(RNN_BLK - n) * es);
}

static void run_store(const tpu_tensor *t, int64_t row, int64_t col, int64_t n, bool dbl, const void *src) {
    tpu_dtype dt = (tpu_dtype)t->dtype;
    char *p = (char *)t->base + (size_t)run_off(t, row, col) * tpu_dtype_size(dt);
    int64_t st = t->strides[t->ndim - 1];
    if (dbl)
        tpu_tile_store_f64(p, st, src, n, dt);
    else
        tpu_tile_store_f32(p, st, src, n, dt);
}

/* ---- one launch ---- */

typedef struct rnn_job {
    tpu_kargs *a;
    int64_t B, H;
    bool dbl;  /* float64 domain */
    bool bias; /* forward: biases given; backward: bias gradients wanted */
} rnn_job;

/* Buffers for one block and one panel, in either domain (sized for double). */
typedef struct rnn_bufs {
    _Alignas(64) double gi[5 * RNN_BLK]; /* input gates; workspace (backward) */
    _Alignas(64) double gh[4 * RNN_BLK]; /* hidden gates */
    _Alignas(64) double go[5 * RNN_BLK]; /* workspace (forward); gate gradients (backward) */
    _Alignas(64) double v0[RNN_BLK], v1[RNN_BLK], v2[RNN_BLK], v3[RNN_BLK], v4[RNN_BLK];
    _Alignas(64) double bs[4 * RNN_PANEL];  /* bias terms (forward) */
    _Alignas(64) double acc[4 * RNN_PANEL]; /* bias gradient sums (backward) */
} rnn_bufs;

/* Element k of buffer p in the job's domain. */
static void *at(const rnn_job *j, const void *p, int64_t k) { return (char *)p + (size_t)k * (j->dbl ? 8 : 4); }

static void load_gates(const rnn_job *j, const tpu_tensor *t, int G, int64_t row, int64_t col, int n, void *dst) {
    for (int k = 0; k < G; k++) run_load(t, row, col + k * j->H, n, j->dbl, at(j, dst, k * RNN_BLK));
}

/* Buffer gates from[0..G) to gates 0..G-1 of t. */
static void store_gates(const rnn_job *j, const tpu_tensor *t, const int *from, int G, int64_t row, int64_t col, int n,
                        const void *src) {
    for (int k = 0; k < G; k++) run_store(t, row, col + k * j->H, n, j->dbl, at(j, src, from[k] * RNN_BLK));
}

/* Columns from col to the end of the block (at most RNN_BLK) in a range ending at c1. */
static int blk_len(int64_t col, int64_t c1) { return c1 - col < RNN_BLK ? (int)(c1 - col) : RNN_BLK; }

/* The panel's bias terms bs (see RNN_CELLS) for a forward launch: slot k is
 * input-bias gate terms[k][0] plus hidden-bias gate terms[k][1] (-1: none). */
static void load_bias_terms(const rnn_job *j, int64_t p0, int64_t p1, rnn_bufs *s) {
    static const int8_t lstm_terms[4][2] = {{0, 0}, {1, 1}, {2, 2}, {3, 3}};
    static const int8_t gru_terms[4][2] = {{0, 0}, {1, 1}, {2, -1}, {-1, 2}};
    const int8_t (*terms)[2] = j->a->op == TPU_OP_LSTM_CELL ? lstm_terms : gru_terms;
    memset(s->bs, 0, sizeof s->bs);
    if (!j->bias) return;
    const tpu_tensor *bias[2] = {&j->a->t[j->a->n - 2], &j->a->t[j->a->n - 1]};
    for (int64_t col = p0; col < p1; col += RNN_BLK) {
        int n = blk_len(col, p1);
        for (int k = 0; k < 4; k++)
            for (int w = 0; w < 2; w++) {
                if (terms[k][w] < 0) continue;
                run_load(bias[w], 0, col + terms[k][w] * j->H, n, j->dbl, s->v0);
                void *dst = at(j, s->bs, k * RNN_PANEL + (col - p0));
                for (int c = 0; c < n; c++)
                    if (j->dbl)
                        ((double *)dst)[c] += s->v0[c];
                    else
                        ((float *)dst)[c] += ((float *)s->v0)[c];
            }
    }
}

/* Bias gradient: gate k of t gets the panel sums of gate from[k]. */
static void store_sums(const rnn_job *j, const tpu_tensor *t, const double *acc, const int *from, int G, int64_t p0,
                       int64_t p1) {
    for (int k = 0; k < G; k++) run_store(t, 0, p0 + k * j->H, p1 - p0, true, acc + from[k] * RNN_PANEL);
}

static const int gates_all[5] = {0, 1, 2, 3, 4};
static const int gates_013[3] = {0, 1, 3};

#define F(p) ((float *)(p))
#define D(p) ((double *)(p))

static void lstm_fwd_cols(void *ctx, int64_t c0, int64_t c1) {
    const rnn_job *j = ctx;
    const tpu_tensor *t = j->a->t; /* hy, cy, ws, gi, gh, cx [, b1, b2] */
    rnn_bufs s;
    for (int64_t p0 = c0; p0 < c1; p0 += RNN_PANEL) {
        int64_t p1 = c1 - p0 < RNN_PANEL ? c1 : p0 + RNN_PANEL;
        load_bias_terms(j, p0, p1, &s);
        for (int64_t b = 0; b < j->B; b++)
            for (int64_t col = p0; col < p1; col += RNN_BLK) {
                int n = blk_len(col, p1);
                void *bs = at(j, s.bs, col - p0);
                load_gates(j, &t[3], 4, b, col, n, s.gi);
                load_gates(j, &t[4], 4, b, col, n, s.gh);
                run_load(&t[5], b, col, n, j->dbl, s.v0);
                if (j->dbl)
                    lstm_fwd_d(D(s.gi), D(s.gh), D(bs), D(s.v0), D(s.v1), D(s.v2), D(s.go));
                else
                    lstm_fwd_f(F(s.gi), F(s.gh), F(bs), F(s.v0), F(s.v1), F(s.v2), F(s.go));
                run_store(&t[0], b, col, n, j->dbl, s.v1);
                run_store(&t[1], b, col, n, j->dbl, s.v2);
                store_gates(j, &t[2], gates_all, 4, b, col, n, s.go);
            }
    }
}

static void lstm_bwd_cols(void *ctx, int64_t c0, int64_t c1) {
    const rnn_job *j = ctx;
    const tpu_tensor *t = j->a->t; /* dgates, dcx, dbias?, dhy?, dcy?, cx, cy, ws */
    rnn_bufs s;
    for (int64_t p0 = c0; p0 < c1; p0 += RNN_PANEL) {
        int64_t p1 = c1 - p0 < RNN_PANEL ? c1 : p0 + RNN_PANEL;
        memset(s.acc, 0, sizeof s.acc);
        for (int64_t b = 0; b < j->B; b++)
            for (int64_t col = p0; col < p1; col += RNN_BLK) {
                int n = blk_len(col, p1);
                load_gates(j, &t[7], 4, b, col, n, s.gi);
                run_load(&t[5], b, col, n, j->dbl, s.v0);
                run_load(&t[6], b, col, n, j->dbl, s.v1);
                run_load(&t[3], b, col, n, j->dbl, s.v2);
                run_load(&t[4], b, col, n, j->dbl, s.v3);
                if (j->dbl) {
                    lstm_bwd_d(D(s.gi), D(s.v0), D(s.v1), D(s.v2), D(s.v3), D(s.go), D(s.v4));
                    if (j->bias) acc_d(s.acc + (col - p0), D(s.go), 4);
                } else {
                    lstm_bwd_f(F(s.gi), F(s.v0), F(s.v1), F(s.v2), F(s.v3), F(s.go), F(s.v4));
                    if (j->bias) acc_f(s.acc + (col - p0), F(s.go), 4);
                }
                store_gates(j, &t[0], gates_all, 4, b, col, n, s.go);
                run_store(&t[1], b, col, n, j->dbl, s.v4);
            }
        if (j->bias) store_sums(j, &t[2], s.acc, gates_all, 4, p0, p1);
    }
}

static void gru_fwd_cols(void *ctx, int64_t c0, int64_t c1) {
    const rnn_job *j = ctx;
    const tpu_tensor *t = j->a->t; /* hy, ws, gi, gh, hx [, b1, b2] */
    rnn_bufs s;
    for (int64_t p0 = c0; p0 < c1; p0 += RNN_PANEL) {
        int64_t p1 = c1 - p0 < RNN_PANEL ? c1 : p0 + RNN_PANEL;
        load_bias_terms(j, p0, p1, &s);
        for (int64_t b = 0; b < j->B; b++)
            for (int64_t col = p0; col < p1; col += RNN_BLK) {
                int n = blk_len(col, p1);
                void *bs = at(j, s.bs, col - p0);
                load_gates(j, &t[2], 3, b, col, n, s.gi);
                load_gates(j, &t[3], 3, b, col, n, s.gh);
                run_load(&t[4], b, col, n, j->dbl, s.v0);
                if (j->dbl)
                    gru_fwd_d(D(s.gi), D(s.gh), D(bs), D(s.v0), D(s.v1), D(s.go));
                else
                    gru_fwd_f(F(s.gi), F(s.gh), F(bs), F(s.v0), F(s.v1), F(s.go));
                run_store(&t[0], b, col, n, j->dbl, s.v1);
                store_gates(j, &t[1], gates_all, 5, b, col, n, s.go);
            }
    }
}

static void gru_bwd_cols(void *ctx, int64_t c0, int64_t c1) {
    const rnn_job *j = ctx;
    const tpu_tensor *t = j->a->t; /* dgi, dgh, dhx, dbi?, dbh?, dhy, ws */
    rnn_bufs s;
    for (int64_t p0 = c0; p0 < c1; p0 += RNN_PANEL) {
        int64_t p1 = c1 - p0 < RNN_PANEL ? c1 : p0 + RNN_PANEL;
        memset(s.acc, 0, sizeof s.acc);
        for (int64_t b = 0; b < j->B; b++)
            for (int64_t col = p0; col < p1; col += RNN_BLK) {
                int n = blk_len(col, p1);
                load_gates(j, &t[6], 5, b, col, n, s.gi);
                run_load(&t[5], b, col, n, j->dbl, s.v0);
                if (j->dbl) {
                    gru_bwd_d(D(s.gi), D(s.v0), D(s.go), D(s.v1));
                    if (j->bias) acc_d(s.acc + (col - p0), D(s.go), 4);
                } else {
                    gru_bwd_f(F(s.gi), F(s.v0), F(s.go), F(s.v1));
                    if (j->bias) acc_f(s.acc + (col - p0), F(s.go), 4);
                }
                store_gates(j, &t[0], gates_all, 3, b, col, n, s.go); /* dr, dz, dn (input) */
                store_gates(j, &t[1], gates_013, 3, b, col, n, s.go); /* dr, dz, dn (hidden) */
                run_store(&t[2], b, col, n, j->dbl, s.v1);
            }
        if (j->bias) {
            store_sums(j, &t[3], s.acc, gates_all, 3, p0, p1);
            store_sums(j, &t[4], s.acc, gates_013, 3, p0, p1);
        }
    }
}

tpu_status tpu_k_rnn(tpu_kargs *a) {
    rnn_job j = {.a = a};
    tpu_status s = tpu_rnn_check(a, &j.B, &j.H);
    if (s) return s;
    j.dbl = a->t[0].dtype == TPU_F64;
    void (*fn)(void *, int64_t, int64_t);
    switch (a->op) {
    case TPU_OP_LSTM_CELL:
        fn = lstm_fwd_cols;
        j.bias = a->n == 8;
        break;
    case TPU_OP_LSTM_CELL_BWD:
        fn = lstm_bwd_cols;
        j.bias = !a->t[2].is_scalar;
        break;
    case TPU_OP_GRU_CELL:
        fn = gru_fwd_cols;
        j.bias = a->n == 7;
        break;
    case TPU_OP_GRU_CELL_BWD:
        fn = gru_bwd_cols;
        j.bias = !a->t[3].is_scalar;
        break;
    default: return tpu_kernel_fail(a, "%s: not an rnn op", tpu_op_name(a->op));
    }
    if (j.H == 0) return TPU_OK;
    /* Column ranges of at least RNN_GRAIN_ELEMS elements (and 16 columns) per worker. */
    int64_t grain = j.B > 0 ? RNN_GRAIN_ELEMS / j.B : j.H;
    if (grain < 16) grain = 16;
    tpu_parallel_for(j.H, grain, fn, &j);
    return TPU_OK;
}
