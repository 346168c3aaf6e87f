/* test_kernels_rnn.c - the fused LSTM and GRU cells (RNN family).
 *
 * Each case builds operands in plain host memory (kernels see host
 * pointers), runs the fast kernel and the reference kernel into separate
 * outputs with the same layout, and compares them; every output byte that is
 * not an element of the view must still hold the sentinel pattern. Layouts:
 * contiguous, transposed (column-major) and padded (offset 3, every row and
 * column one longer). The reference itself is checked against hand-computed
 * values and its backward against central differences of its forward, and
 * malformed launches must fail in both kernels with a message. */
#include "kernels/kernels-impl.h"
#define HTEN_SEED    0x2545F4914F6CDD1Dull
#define HTEN_OWN_HMK /* 2-d matrices with L_TRANS */
#include "test.h"
#include "hten.h"
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

enum { L_CONTIG = 0, L_TRANS = 1, L_PAD = 2, L_COUNT = 3 };

static char case_desc[256];
static long ncompared;

/* ---- host tensors: 2-d [r, c] (or 1-d [c] when r < 0) ---- */

static void hmk(hten *h, tpu_dtype dt, int64_t r, int64_t c, int layout) {
    memset(h, 0, sizeof *h);
    tpu_tensor *t = &h->t;
    t->dtype = dt;
    int64_t pad = layout == L_PAD, span;
    if (r < 0) {
        t->ndim = 1;
        t->sizes[0] = c;
        t->strides[0] = 1 + pad;
        span = c * (1 + pad);
    } else {
        t->ndim = 2;
        t->sizes[0] = r;
        t->sizes[1] = c;
        if (layout == L_TRANS) {
            t->strides[0] = 1;
            t->strides[1] = r > 0 ? r : 1;
        } else {
            t->strides[0] = c + pad;
            t->strides[1] = 1;
        }
        span = r * (c + pad);
    }
    t->offset = pad ? 3 : 0;
    hstorage(h, span + pad);
}

/* |fast - ref| <= tol*|ref| + tol*max(1, max|ref|); NaN and inf must match. */
static void hcmp(const char *what, const hten *f, const hten *r, double tol) {
    CHECK_MSG(hguards_ok(f), "%s [%s]: fast kernel wrote outside the view", what, case_desc);
    CHECK_MSG(hguards_ok(r), "%s [%s]: ref kernel wrote outside the view", what, case_desc);
    ncompared++;
    int64_t n = hnumel(&r->t);
    double maxabs = 1;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(hget(r, i)) && fabs(hget(r, i)) > maxabs) maxabs = fabs(hget(r, i));
    for (int64_t i = 0; i < n; i++) {
        double a = hget(f, i), b = hget(r, i);
        bool ok = (isnan(a) || isnan(b))   ? isnan(a) && isnan(b)
                  : (isinf(a) || isinf(b)) ? a == b
                                           : fabs(a - b) <= tol * fabs(b) + tol * maxabs;
        if (!ok) {
            CHECK_MSG(ok, "%s [%s]: element %lld fast %.9g ref %.9g", what, case_desc, (long long)i, a, b);
            return;
        }
    }
}

static double tol(tpu_dtype dt) {
    switch (dt) {
    case TPU_F64: return 1e-12;
    case TPU_F32: return 1e-5;
    case TPU_F16: return 3e-3;
    case TPU_BF16: return 2e-2;
    default: return 0;
    }
}

/* Run the fast or reference kernel; err (if given) receives the message and a failure is expected. */
static tpu_status run(bool ref, tpu_op op, const tpu_tensor *ops, int n, char *err) {
    tpu_kargs a;
    memset(&a, 0, sizeof a);
    a.op = op;
    a.n = n;
    memcpy(a.t, ops, (size_t)n * sizeof *ops);
    tpu_status s = ref ? tpu_ref_run(&a) : tpu_kernel_run(&a);
    if (err)
        snprintf(err, 256, "%s", a.err);
    else
        CHECK_MSG(s == TPU_OK, "%s %s [%s]: %s: %s", ref ? "ref" : "fast", tpu_op_name(op), case_desc,
                  tpu_status_name(s), a.err);
    return s;
}

static const tpu_dtype float_dtypes[] = {TPU_F32, TPU_F64, TPU_BF16, TPU_F16};
#define NFLOAT 4

/* Fast and ref into clones of the same outputs; compare every output. */
static void run_both(tpu_op op, hten *outs, int nout, const tpu_tensor *ins, int nin, const char *const *names,
                     double e) {
    hten ref[TPU_MAX_OPERANDS];
    tpu_tensor ops[TPU_MAX_OPERANDS];
    for (int k = 0; k < nout; k++) {
        hclone(&ref[k], &outs[k]);
        ops[k] = outs[k].t;
    }
    memcpy(ops + nout, ins, (size_t)nin * sizeof *ins);
    run(false, op, ops, nout + nin, NULL);
    for (int k = 0; k < nout; k++) ops[k] = ref[k].t;
    run(true, op, ops, nout + nin, NULL);
    for (int k = 0; k < nout; k++) {
        char what[64];
        snprintf(what, sizeof what, "%s %s", tpu_op_name(op), names[k]);
        hcmp(what, &outs[k], &ref[k], e);
        hfree(&ref[k]);
    }
}

/* ================= LSTM ================= */

static void lstm_case(tpu_dtype dt, int64_t B, int64_t H, int layout, bool bias, double scale) {
    snprintf(case_desc, sizeof case_desc, "lstm %s B %lld H %lld layout %d bias %d scale %g", tpu_dtype_name(dt),
             (long long)B, (long long)H, layout, bias, scale);
    double e = tol(dt);
    hten gi, gh, cx, b1, b2, out[3];
    hmk(&gi, dt, B, 4 * H, layout);
    hmk(&gh, dt, B, 4 * H, (layout + 1) % L_COUNT);
    hmk(&cx, dt, B, H, layout);
    hmk(&b1, dt, -1, 4 * H, layout);
    hmk(&b2, dt, -1, 4 * H, L_CONTIG);
    hfill(&gi, -scale, scale);
    hfill(&gh, -scale, scale);
    hfill(&cx, -2, 2);
    hfill(&b1, -1, 1);
    hfill(&b2, -1, 1);
    hmk(&out[0], dt, B, H, layout);
    hmk(&out[1], dt, B, H, (layout + 2) % L_COUNT);
    hmk(&out[2], dt, B, 4 * H, L_CONTIG);
    tpu_tensor ins[5] = {gi.t, gh.t, cx.t, b1.t, b2.t};
    static const char *const fnames[] = {"hy", "cy", "workspace"};
    run_both(TPU_OP_LSTM_CELL, out, 3, ins, bias ? 5 : 3, fnames, e);

    /* backward from the forward's cy and workspace, with each gradient absent in turn */
    static const char *const bnames[] = {"grad_gates", "grad_cx", "grad_bias"};
    for (int absent = 0; absent < 3; absent++) { /* 0 none, 1 grad_hy, 2 grad_cy */
        hten dhy, dcy, g[3];
        hmk(&dhy, dt, B, H, layout);
        hmk(&dcy, dt, B, H, L_PAD);
        hfill(&dhy, -1, 1);
        hfill(&dcy, -1, 1);
        hmk(&g[0], dt, B, 4 * H, layout);
        hmk(&g[1], dt, B, H, L_CONTIG);
        hmk(&g[2], dt, -1, 4 * H, layout);
        tpu_tensor zero = tpu_tensor_scalar_f(0, dt);
        tpu_tensor bins[5] = {absent == 1 ? zero : dhy.t, absent == 2 ? zero : dcy.t, cx.t, out[1].t, out[2].t};
        if (bias) {
            run_both(TPU_OP_LSTM_CELL_BWD, g, 3, bins, 5, bnames, e);
        } else { /* no bias gradient: operand 2 absent */
            tpu_tensor ops[8] = {g[0].t, g[1].t, zero};
            memcpy(ops + 3, bins, sizeof bins);
            hten r0, r1;
            hclone(&r0, &g[0]);
            hclone(&r1, &g[1]);
            run(false, TPU_OP_LSTM_CELL_BWD, ops, 8, NULL);
            ops[0] = r0.t;
            ops[1] = r1.t;
            run(true, TPU_OP_LSTM_CELL_BWD, ops, 8, NULL);
            hcmp("lstm_cell_backward grad_gates", &g[0], &r0, e);
            hcmp("lstm_cell_backward grad_cx", &g[1], &r1, e);
            CHECK_MSG(hguards_ok(&g[2]), "[%s] absent grad_bias written", case_desc);
            hfree(&r0);
            hfree(&r1);
        }
        hten *all[] = {&dhy, &dcy, &g[0], &g[1], &g[2]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
    }
    hten *all[] = {&gi, &gh, &cx, &b1, &b2, &out[0], &out[1], &out[2]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
}

/* ================= GRU ================= */

static void gru_case(tpu_dtype dt, int64_t B, int64_t H, int layout, bool bias, double scale) {
    snprintf(case_desc, sizeof case_desc, "gru %s B %lld H %lld layout %d bias %d scale %g", tpu_dtype_name(dt),
             (long long)B, (long long)H, layout, bias, scale);
    double e = tol(dt);
    hten gi, gh, hx, b1, b2, out[2];
    hmk(&gi, dt, B, 3 * H, layout);
    hmk(&gh, dt, B, 3 * H, (layout + 1) % L_COUNT);
    hmk(&hx, dt, B, H, (layout + 2) % L_COUNT);
    hmk(&b1, dt, -1, 3 * H, L_CONTIG);
    hmk(&b2, dt, -1, 3 * H, layout);
    hfill(&gi, -scale, scale);
    hfill(&gh, -scale, scale);
    hfill(&hx, -1, 1);
    hfill(&b1, -1, 1);
    hfill(&b2, -1, 1);
    hmk(&out[0], dt, B, H, layout);
    hmk(&out[1], dt, B, 5 * H, (layout + 1) % L_COUNT);
    tpu_tensor ins[5] = {gi.t, gh.t, hx.t, b1.t, b2.t};
    static const char *const fnames[] = {"hy", "workspace"};
    run_both(TPU_OP_GRU_CELL, out, 2, ins, bias ? 5 : 3, fnames, e);

    static const char *const bnames[] = {"grad_input_gates", "grad_hidden_gates", "grad_hx", "grad_input_bias",
                                         "grad_hidden_bias"};
    hten dhy, g[5];
    hmk(&dhy, dt, B, H, layout);
    hfill(&dhy, -1, 1);
    hmk(&g[0], dt, B, 3 * H, layout);
    hmk(&g[1], dt, B, 3 * H, L_PAD);
    hmk(&g[2], dt, B, H, L_TRANS);
    hmk(&g[3], dt, -1, 3 * H, layout);
    hmk(&g[4], dt, -1, 3 * H, L_CONTIG);
    tpu_tensor bins[2] = {dhy.t, out[1].t};
    if (bias) {
        run_both(TPU_OP_GRU_CELL_BWD, g, 5, bins, 2, bnames, e);
    } else {
        hten r[3];
        tpu_tensor zero = tpu_tensor_scalar_f(0, dt);
        tpu_tensor ops[7] = {g[0].t, g[1].t, g[2].t, zero, zero, dhy.t, out[1].t};
        for (int k = 0; k < 3; k++) hclone(&r[k], &g[k]);
        run(false, TPU_OP_GRU_CELL_BWD, ops, 7, NULL);
        for (int k = 0; k < 3; k++) ops[k] = r[k].t;
        run(true, TPU_OP_GRU_CELL_BWD, ops, 7, NULL);
        for (int k = 0; k < 3; k++) {
            hcmp(bnames[k], &g[k], &r[k], e);
            hfree(&r[k]);
        }
        CHECK_MSG(hguards_ok(&g[3]) && hguards_ok(&g[4]), "[%s] absent bias gradients written", case_desc);
    }
    hten *all[] = {&gi, &gh, &hx, &b1, &b2, &out[0], &out[1], &dhy, &g[0], &g[1], &g[2], &g[3], &g[4]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
}

static const struct {
    int64_t B, H;
} shapes[] = {
    {1, 1}, {3, 5}, {4, 64}, {2, 67}, {7, 130}, {33, 17}, {0, 3}, {3, 0}, {1, 129},
};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

static void test_lstm_vs_ref(void) {
    for (int di = 0; di < NFLOAT; di++)
        for (size_t s = 0; s < NSHAPES; s++)
            for (int l = 0; l < L_COUNT; l++)
                for (int bias = 0; bias < 2; bias++) lstm_case(float_dtypes[di], shapes[s].B, shapes[s].H, l, bias, 3);
    lstm_case(TPU_F32, 5, 19, L_CONTIG, true, 60); /* saturated gates */
    lstm_case(TPU_BF16, 5, 19, L_PAD, true, 60);
}

static void test_gru_vs_ref(void) {
    for (int di = 0; di < NFLOAT; di++)
        for (size_t s = 0; s < NSHAPES; s++)
            for (int l = 0; l < L_COUNT; l++)
                for (int bias = 0; bias < 2; bias++) gru_case(float_dtypes[di], shapes[s].B, shapes[s].H, l, bias, 3);
    gru_case(TPU_F32, 5, 19, L_TRANS, true, 60);
    gru_case(TPU_BF16, 5, 19, L_CONTIG, false, 60);
}

/* Sizes big enough to be split across the compute workers. */
static void test_parallel_sizes(void) {
    for (int di = 0; di < 3; di += 2) {
        lstm_case(float_dtypes[di], 5, 1031, L_CONTIG, true, 3);
        lstm_case(float_dtypes[di], 300, 40, L_CONTIG, true, 3);
        gru_case(float_dtypes[di], 5, 1031, L_CONTIG, true, 3);
        gru_case(float_dtypes[di], 300, 40, L_TRANS, true, 3);
    }
}

/* ================= the reference against hand values and finite differences ================= */

static void test_hand(void) {
    snprintf(case_desc, sizeof case_desc, "hand values");
    /* zero gates: i = f = o = 1/2, g = 0, so cy = cx/2 and hy = tanh(cy)/2 */
    hten gi, gh, cx, hy, cy, ws;
    hmk(&gi, TPU_F32, 1, 4, L_CONTIG);
    hmk(&gh, TPU_F32, 1, 4, L_CONTIG);
    hmk(&cx, TPU_F32, 1, 1, L_CONTIG);
    hmk(&hy, TPU_F32, 1, 1, L_CONTIG);
    hmk(&cy, TPU_F32, 1, 1, L_CONTIG);
    hmk(&ws, TPU_F32, 1, 5, L_CONTIG);
    for (int k = 0; k < 4; k++) hset(&gi, k, 0), hset(&gh, k, 0);
    hset(&cx, 0, 2.0);
    for (int ref = 0; ref < 2; ref++) {
        tpu_tensor ops[6] = {hy.t, cy.t, ws.t, gi.t, gh.t, cx.t};
        ops[2].sizes[1] = 4;
        run(ref, TPU_OP_LSTM_CELL, ops, 6, NULL);
        CHECK(fabs(hget(&cy, 0) - 1.0) < 1e-6 && fabs(hget(&hy, 0) - 0.5 * tanh(1.0)) < 1e-6);
        CHECK(hget(&ws, 0) == 0.5f && hget(&ws, 2) == 0.0f);
        /* GRU, zero gates: r = z = 1/2, n = 0, hy = hx/2; ws = (1/2, 1/2, 0, hx, 0) */
        tpu_tensor gops[5] = {hy.t, ws.t, gi.t, gh.t, cx.t};
        gops[2].sizes[1] = gops[3].sizes[1] = 3;
        run(ref, TPU_OP_GRU_CELL, gops, 5, NULL);
        CHECK(fabs(hget(&hy, 0) - 1.0) < 1e-6);
        CHECK(hget(&ws, 1) == 0.5f && hget(&ws, 2) == 0.0f && hget(&ws, 3) == 2.0f && hget(&ws, 4) == 0.0f);
    }
    hten *all[] = {&gi, &gh, &cx, &hy, &cy, &ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
}

/* loss = sum(wh * hy) [+ sum(wc * cy)] of the reference forward, float64. */
static double fd_loss(bool lstm, tpu_tensor *ins, int nin, const hten *wh, const hten *wc, int64_t B, int64_t H) {
    hten out[3];
    hmk(&out[0], TPU_F64, B, H, L_CONTIG);
    hmk(&out[1], TPU_F64, B, lstm ? H : 5 * H, L_CONTIG);
    hmk(&out[2], TPU_F64, B, 4 * H, L_CONTIG);
    tpu_tensor ops[8] = {out[0].t, out[1].t, out[2].t};
    int nout = lstm ? 3 : 2;
    memcpy(ops + nout, ins, (size_t)nin * sizeof *ins);
    run(true, lstm ? TPU_OP_LSTM_CELL : TPU_OP_GRU_CELL, ops, nout + nin, NULL);
    double l = 0;
    for (int64_t i = 0; i < B * H; i++) {
        l += hget(wh, i) * hget(&out[0], i);
        if (lstm) l += hget(wc, i) * hget(&out[1], i);
    }
    for (int k = 0; k < 3; k++) hfree(&out[k]);
    return l;
}

/* Reference backward == central differences of the reference forward, for
 * every input of both cells (gates, state, biases). */
static void test_ref_gradients(void) {
    const int64_t B = 3, H = 4;
    for (int lstm = 0; lstm < 2; lstm++) {
        snprintf(case_desc, sizeof case_desc, "%s finite differences", lstm ? "lstm" : "gru");
        int G = lstm ? 4 : 3;
        hten in[5], wh, wc, out[3], g[5];
        hmk(&in[0], TPU_F64, B, G * H, L_CONTIG);
        hmk(&in[1], TPU_F64, B, G * H, L_TRANS);
        hmk(&in[2], TPU_F64, B, H, L_CONTIG);
        hmk(&in[3], TPU_F64, -1, G * H, L_CONTIG);
        hmk(&in[4], TPU_F64, -1, G * H, L_PAD);
        for (int k = 0; k < 5; k++) hfill(&in[k], -1.5, 1.5);
        hmk(&wh, TPU_F64, B, H, L_CONTIG);
        hmk(&wc, TPU_F64, B, H, L_CONTIG);
        hfill(&wh, -1, 1);
        hfill(&wc, -1, 1);
        tpu_tensor ins[5];
        for (int k = 0; k < 5; k++) ins[k] = in[k].t;
        /* forward for the saved state, then the analytic backward */
        hmk(&out[0], TPU_F64, B, H, L_CONTIG);
        hmk(&out[1], TPU_F64, B, lstm ? H : 5 * H, L_CONTIG);
        hmk(&out[2], TPU_F64, B, 4 * H, L_CONTIG);
        tpu_tensor ops[8] = {out[0].t, out[1].t, out[2].t};
        memcpy(ops + 2 + lstm, ins, sizeof ins);
        run(true, lstm ? TPU_OP_LSTM_CELL : TPU_OP_GRU_CELL, ops, 7 + lstm, NULL);
        hmk(&g[0], TPU_F64, B, G * H, L_CONTIG);
        hmk(&g[1], TPU_F64, B, lstm ? H : G * H, L_CONTIG);
        hmk(&g[2], TPU_F64, lstm ? -1 : B, lstm ? G * H : H, L_CONTIG);
        hmk(&g[3], TPU_F64, -1, G * H, L_CONTIG);
        hmk(&g[4], TPU_F64, -1, G * H, L_CONTIG);
        /* analytic gradient of each input's element i, from the backward outputs */
        const hten *grad_of[5];
        if (lstm) {
            tpu_tensor bops[8] = {g[0].t, g[1].t, g[2].t, wh.t, wc.t, in[2].t, out[1].t, out[2].t};
            run(true, TPU_OP_LSTM_CELL_BWD, bops, 8, NULL);
            grad_of[0] = grad_of[1] = &g[0];
            grad_of[2] = &g[1];
            grad_of[3] = grad_of[4] = &g[2];
        } else {
            tpu_tensor bops[7] = {g[0].t, g[1].t, g[2].t, g[3].t, g[4].t, wh.t, out[1].t};
            run(true, TPU_OP_GRU_CELL_BWD, bops, 7, NULL);
            grad_of[0] = &g[0];
            grad_of[1] = &g[1];
            grad_of[2] = &g[2];
            grad_of[3] = &g[3];
            grad_of[4] = &g[4];
        }
        for (int k = 0; k < 5; k++)
            for (int64_t i = 0; i < hnumel(&in[k].t); i++) {
                double v = hget(&in[k], i), h = 1e-6;
                hset(&in[k], i, v + h);
                double lp = fd_loss(lstm, ins, 5, &wh, &wc, B, H);
                hset(&in[k], i, v - h);
                double lm = fd_loss(lstm, ins, 5, &wh, &wc, B, H);
                hset(&in[k], i, v);
                double fd = (lp - lm) / (2 * h), an = hget(grad_of[k], i);
                CHECK_MSG(fabs(fd - an) < 1e-6 * (1 + fabs(fd)), "[%s] input %d element %lld: analytic %.12g fd %.12g",
                          case_desc, k, (long long)i, an, fd);
            }
        hten *all[] = {&in[0],  &in[1],  &in[2], &in[3], &in[4], &wh,   &wc,  &out[0],
                       &out[1], &out[2], &g[0],  &g[1],  &g[2],  &g[3], &g[4]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
    }
}

/* ================= malformed launches ================= */

static void expect_fail(tpu_op op, const tpu_tensor *ops, int n, const char *needle) {
    for (int ref = 0; ref < 2; ref++) {
        char err[256];
        tpu_status s = run(ref, op, ops, n, err);
        CHECK_MSG(s != TPU_OK && strstr(err, needle), "[%s] %s: expected an error with \"%s\", got %s \"%s\"",
                  case_desc, ref ? "ref" : "fast", needle, tpu_status_name(s), err);
    }
}

static void test_errors(void) {
    snprintf(case_desc, sizeof case_desc, "errors");
    const int64_t B = 2, H = 3;
    hten gi, gh, cx, hy, cy, ws, bias, gi_bad, ci;
    hmk(&gi, TPU_F32, B, 4 * H, L_CONTIG);
    hmk(&gh, TPU_F32, B, 4 * H, L_CONTIG);
    hmk(&cx, TPU_F32, B, H, L_CONTIG);
    hmk(&hy, TPU_F32, B, H, L_CONTIG);
    hmk(&cy, TPU_F32, B, H, L_CONTIG);
    hmk(&ws, TPU_F32, B, 4 * H, L_CONTIG);
    hmk(&bias, TPU_F32, -1, 4 * H, L_CONTIG);
    hmk(&gi_bad, TPU_F32, B, 4 * H + 1, L_CONTIG);
    hmk(&ci, TPU_I32, B, H, L_CONTIG);
    hten *all[] = {&gi, &gh, &cx, &hy, &cy, &ws, &bias, &gi_bad, &ci};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfill(all[i], -1, 1);

    tpu_tensor ok[8] = {hy.t, cy.t, ws.t, gi.t, gh.t, cx.t, bias.t, bias.t};
    tpu_tensor t[8];
    memcpy(t, ok, sizeof t);
    t[3] = gi_bad.t;
    expect_fail(TPU_OP_LSTM_CELL, t, 6, "input_gates has shape [2, 13], expected [2, 12]");
    memcpy(t, ok, sizeof t);
    expect_fail(TPU_OP_LSTM_CELL, t, 7, "expected 8 operands (or none of the biases), got 7");
    t[6] = cx.t;
    expect_fail(TPU_OP_LSTM_CELL, t, 8, "input_bias has shape [2, 3], expected [12]");
    memcpy(t, ok, sizeof t);
    t[4].dtype = TPU_F64;
    expect_fail(TPU_OP_LSTM_CELL, t, 6, "hidden_gates is float64, expected float32");
    memcpy(t, ok, sizeof t);
    t[5] = ci.t;
    expect_fail(TPU_OP_LSTM_CELL, t, 6, "not implemented for dtype int32");
    memcpy(t, ok, sizeof t);
    t[5] = tpu_tensor_scalar_f(0, TPU_F32);
    expect_fail(TPU_OP_LSTM_CELL, t, 6, "cx must be 2-d");
    t[5] = cx.t;
    t[3] = tpu_tensor_scalar_f(0, TPU_F32);
    expect_fail(TPU_OP_LSTM_CELL, t, 6, "input_gates (operand 3) is missing");
    /* GRU backward: bias gradients come in pairs */
    hten g3, wsg;
    hmk(&g3, TPU_F32, B, 3 * H, L_CONTIG);
    hmk(&wsg, TPU_F32, B, 5 * H, L_CONTIG);
    hfill(&wsg, -1, 1);
    tpu_tensor gb[7] = {g3.t, g3.t, cx.t, bias.t, tpu_tensor_scalar_f(0, TPU_F32), cx.t, wsg.t};
    gb[3].sizes[0] = 3 * H;
    expect_fail(TPU_OP_GRU_CELL_BWD, gb, 7, "wanted together");
    hfree(&g3);
    hfree(&wsg);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
}

int main(void) {
    /* Bring the runtime up so kernels run on its compute pool, as under a launch. */
    if (tpu_init() != TPU_OK) return 1;
    RUN_TEST(test_hand);
    RUN_TEST(test_ref_gradients);
    RUN_TEST(test_lstm_vs_ref);
    RUN_TEST(test_gru_vs_ref);
    RUN_TEST(test_parallel_sizes);
    RUN_TEST(test_errors);
    printf("%ld output tensors compared against the reference\n", ncompared);
    return TEST_SUMMARY();
}
