/* test_kernels_nn.c - softmax, nll loss, cross entropy, layer norm, index, AdamW and matmul kernels.
 *
 * Each case builds operands in plain host memory (kernels see host pointers),
 * runs the fast kernel and the reference kernel into separate outputs with
 * the same layout, and compares them; every output byte that is not an
 * element of the view (guards around the storage, holes of padded views)
 * must still hold the sentinel pattern. Layouts: contiguous, transposed
 * (dims stored in reverse order), padded (every dim's extent +1, offset 3).
 * A few cases are checked against hand-computed numbers, and every
 * out-of-range index or target must fail with PyTorch's message. */
#include "kernels/kernels-impl.h"
#include "vtpu/vtpu-impl.h" /* tpu_pool_register: run the matrix unit's portable path too */
#include "test.h"
#include "hten.h"
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

static char case_desc[256];
static long ncompared; /* output tensors compared fast vs ref */

/* ---- host tensors ---- */

static void hmk1(hten *h, tpu_dtype dt, int64_t n, int layout) { hmk(h, dt, 1, &n, layout); }

/* same layout and contents */
/* element offset of row-major element `lin` */
static void hfill_int(hten *h, int64_t n) {
    for (int64_t i = 0; i < hnumel(&h->t); i++) tpu_store_i64(hptr(&h->t, i), (tpu_dtype)h->t.dtype, irand(n));
}

/* |fast - ref| <= rtol*|ref| + atol*max(1, max|ref|); NaN and inf must match. */
static void hcmp(const char *what, const hten *f, const hten *r, double rtol, double atol) {
    CHECK_MSG(hguards_ok(f), "%s [%s]: fast kernel wrote outside the view", what, case_desc);
    CHECK_MSG(hguards_ok(r), "%s [%s]: ref kernel wrote outside the view", what, case_desc);
    ncompared++;
    int64_t n = hnumel(&r->t);
    double maxabs = 1;
    for (int64_t i = 0; i < n; i++) {
        double v = fabs(hget(r, i));
        if (isfinite(v) && v > maxabs) maxabs = v;
    }
    for (int64_t i = 0; i < n; i++) {
        double a = hget(f, i), b = hget(r, i);
        bool ok;
        if (isnan(b) || isnan(a))
            ok = isnan(a) && isnan(b);
        else if (isinf(b) || isinf(a))
            ok = a == b;
        else
            ok = fabs(a - b) <= rtol * fabs(b) + atol * maxabs;
        if (!ok) {
            CHECK_MSG(ok, "%s [%s]: element %lld fast %.9g ref %.9g", what, case_desc, (long long)i, a, b);
            return;
        }
    }
}

static double tol(tpu_dtype dt) {
    switch (dt) {
    case TPU_F64: return 1e-11;
    case TPU_F32: return 2e-5;
    case TPU_F16: return 3e-3;
    case TPU_BF16: return 2e-2;
    default: return 0;
    }
}

static tpu_status run(bool ref, tpu_op op, const tpu_tensor *ops, int n, const tpu_params *p, char *err) {
    tpu_kargs a;
    memset(&a, 0, sizeof a);
    a.op = op;
    a.n = n;
    memcpy(a.t, ops, (size_t)n * sizeof *ops);
    a.p = *p;
    tpu_status s = ref ? tpu_ref_run(&a) : tpu_kernel_run(&a);
    if (err) snprintf(err, 256, "%s", a.err);
    if (s != TPU_OK && !err)
        CHECK_MSG(s == TPU_OK, "%s %s [%s]: %s: %s", ref ? "ref" : "fast", tpu_op_name(op), case_desc,
                  tpu_status_name(s), a.err);
    return s;
}

static const tpu_dtype float_dtypes[] = {TPU_F32, TPU_F64, TPU_BF16, TPU_F16};
#define NFLOAT 4

/* ================= softmax ================= */

static void softmax_case(tpu_op op, tpu_dtype dt, int ndim, const int64_t *sizes, int dim, int lo, int li) {
    bool bwd = op == TPU_OP_SOFTMAX_BWD || op == TPU_OP_LOG_SOFTMAX_BWD;
    snprintf(case_desc, sizeof case_desc, "%s %s ndim %d dim %d out-layout %d in-layout %d", tpu_op_name(op),
             tpu_dtype_name(dt), ndim, dim, lo, li);
    hten x, y, of, orf;
    hmk(&x, dt, ndim, sizes, li);
    hmk(&y, dt, ndim, sizes, li);
    hfill(&x, bwd ? -1 : -4, bwd ? 1 : 4);
    if (op == TPU_OP_SOFTMAX_BWD)
        hfill(&y, 0, 1);
    else
        hfill(&y, -6, 0);
    if (!bwd && hnumel(&x.t) > 2) hset(&x, 1, -INFINITY); /* a masked element */
    hmk(&of, dt, ndim, sizes, lo);
    hclone(&orf, &of);
    tpu_tensor ops[3] = {of.t, x.t, y.t};
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = dim;
    run(false, op, ops, bwd ? 3 : 2, &p, NULL);
    ops[0] = orf.t;
    run(true, op, ops, bwd ? 3 : 2, &p, NULL);
    hcmp("softmax out", &of, &orf, tol(dt), tol(dt));
    hfree(&x);
    hfree(&y);
    hfree(&of);
    hfree(&orf);
}

static void test_softmax_vs_ref(void) {
    static const struct {
        int ndim;
        int64_t sizes[3];
    } shapes[] = {
        {0, {0}},    {1, {7}},       {2, {3, 5}}, {3, {3, 5, 7}}, {2, {3, 131}},
        {1, {1031}}, {2, {2, 1031}}, {2, {0, 5}}, {3, {5, 1, 3}},
    };
    for (int op = TPU_OP_SOFTMAX; op <= TPU_OP_LOG_SOFTMAX_BWD; op++)
        for (int di = 0; di < NFLOAT; di++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int dim = 0; dim < (shapes[s].ndim ? shapes[s].ndim : 1); dim++)
                    for (int lo = 0; lo < 3; lo++)
                        for (int li = 0; li < 3; li++) {
                            if (shapes[s].sizes[0] * shapes[s].sizes[1] > 1000 && (lo != li || lo == 1)) continue;
                            softmax_case((tpu_op)op, float_dtypes[di], shapes[s].ndim, shapes[s].sizes, dim,
                                         lo == 2 ? L_PERM_PAD : lo, li == 2 ? L_PAD : li);
                        }
}

/* runs op on a 1-d f32/f64 vector, out contiguous */
static void softmax_1d(tpu_op op, tpu_dtype dt, const double *in0, const double *in1, int64_t n, double *out) {
    hten x, y, o;
    hmk1(&x, dt, n, L_CONTIG);
    hmk1(&y, dt, n, L_CONTIG);
    hmk1(&o, dt, n, L_CONTIG);
    for (int64_t i = 0; i < n; i++) {
        hset(&x, i, in0[i]);
        if (in1) hset(&y, i, in1[i]);
    }
    tpu_tensor ops[3] = {o.t, x.t, y.t};
    tpu_params p;
    memset(&p, 0, sizeof p);
    run(false, op, ops, in1 ? 3 : 2, &p, NULL);
    for (int64_t i = 0; i < n; i++) out[i] = hget(&o, i);
    hfree(&x);
    hfree(&y);
    hfree(&o);
}

static void test_softmax_hand(void) {
    snprintf(case_desc, sizeof case_desc, "hand values");
    for (int di = 0; di < 2; di++) {
        tpu_dtype dt = float_dtypes[di];
        double e = dt == TPU_F32 ? 1e-6 : 1e-14, o[2];
        double x[2] = {0, log(2.0)};
        softmax_1d(TPU_OP_SOFTMAX, dt, x, NULL, 2, o);
        CHECK(fabs(o[0] - 1.0 / 3) < e && fabs(o[1] - 2.0 / 3) < e);
        softmax_1d(TPU_OP_LOG_SOFTMAX, dt, x, NULL, 2, o);
        CHECK(fabs(o[0] + log(3.0)) < e && fabs(o[1] - log(2.0 / 3)) < e);
        double y[2] = {1.0 / 3, 2.0 / 3}, g[2] = {1, 0};
        softmax_1d(TPU_OP_SOFTMAX_BWD, dt, g, y, 2, o); /* y*(g - sum(g*y)) */
        CHECK(fabs(o[0] - 2.0 / 9) < e && fabs(o[1] + 2.0 / 9) < e);
        double ly[2] = {log(1.0 / 3), log(2.0 / 3)};
        softmax_1d(TPU_OP_LOG_SOFTMAX_BWD, dt, g, ly, 2, o); /* g - exp(y)*sum(g) */
        CHECK(fabs(o[0] - 2.0 / 3) < e && fabs(o[1] + 2.0 / 3) < e);
        double m[2] = {-INFINITY, 0};
        softmax_1d(TPU_OP_SOFTMAX, dt, m, NULL, 2, o);
        CHECK(o[0] == 0 && o[1] == 1);
        softmax_1d(TPU_OP_LOG_SOFTMAX, dt, m, NULL, 2, o);
        CHECK(o[0] == -INFINITY && o[1] == 0);
        double nn[2] = {NAN, 1}, inf[2] = {INFINITY, 1}; /* PyTorch: all NaN */
        softmax_1d(TPU_OP_SOFTMAX, dt, nn, NULL, 2, o);
        CHECK(isnan(o[0]) && isnan(o[1]));
        softmax_1d(TPU_OP_SOFTMAX, dt, inf, NULL, 2, o);
        CHECK(isnan(o[0]) && isnan(o[1]));
        /* a long row through the vector loops: softmax(log(1..n)) = i / (n(n+1)/2) */
        enum { N = 1031 };
        static double lx[N], lo[N];
        for (int i = 0; i < N; i++) lx[i] = log(i + 1.0);
        softmax_1d(TPU_OP_SOFTMAX, dt, lx, NULL, N, lo);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            double want = (i + 1.0) / (N * (N + 1.0) / 2);
            worst = fmax(worst, fabs(lo[i] - want) / want);
        }
        CHECK_MSG(worst < (dt == TPU_F32 ? 2e-6 : 1e-13), "softmax(log(1..n)) relative error %g", worst);
    }
    /* 0-dim: softmax 1, log_softmax 0 */
    hten x, o;
    hmk(&x, TPU_F32, 0, NULL, L_CONTIG);
    hmk(&o, TPU_F32, 0, NULL, L_CONTIG);
    hset(&x, 0, 3.0);
    tpu_tensor ops[2] = {o.t, x.t};
    tpu_params p;
    memset(&p, 0, sizeof p);
    run(false, TPU_OP_SOFTMAX, ops, 2, &p, NULL);
    CHECK(hget(&o, 0) == 1.0);
    run(false, TPU_OP_LOG_SOFTMAX, ops, 2, &p, NULL);
    CHECK(hget(&o, 0) == 0.0);
    hfree(&x);
    hfree(&o);
}

/* ================= nll loss ================= */

/* A loss's outputs, fast (f) and reference (r): per-sample losses of n rows
 * when per_sample, else 0-dim, and the 0-dim total weight; its parameters. */
static void loss_outputs(tpu_dtype dt, bool per_sample, int64_t n, int reduction, int64_t ignore, hten *lf, hten *lr,
                         hten *twf, hten *twr, tpu_params *p) {
    if (per_sample)
        hmk1(lf, dt, n, L_PAD);
    else
        hmk(lf, dt, 0, NULL, L_CONTIG);
    hclone(lr, lf);
    hmk(twf, dt, 0, NULL, L_CONTIG);
    hclone(twr, twf);
    memset(p, 0, sizeof *p);
    p->i[0] = reduction;
    p->i[1] = ignore;
}

/* N < 0: 1-d x of C classes, 0-dim target */
static void nll_case(tpu_dtype dt, int64_t N, int64_t C, int reduction, bool weighted, int64_t ignore, int xl) {
    snprintf(case_desc, sizeof case_desc, "nll %s N %lld C %lld reduction %d weight %d ignore %lld layout %d",
             tpu_dtype_name(dt), (long long)N, (long long)C, reduction, weighted, (long long)ignore, xl);
    bool two = N >= 0;
    int64_t n = two ? N : 1, xs[2] = {N, C};
    hten x, tg, w, lf, lr, twf, twr;
    if (two)
        hmk(&x, dt, 2, xs, xl);
    else
        hmk1(&x, dt, C, xl);
    hfill(&x, -5, 0);
    if (two)
        hmk1(&tg, TPU_I64, n, L_PAD);
    else
        hmk(&tg, TPU_I64, 0, NULL, L_CONTIG);
    hfill_int(&tg, C);
    for (int64_t i = 0; i < n; i += 3) tpu_store_i64(hptr(&tg.t, i), TPU_I64, ignore); /* some ignored */
    hmk1(&w, dt, C, L_CONTIG);
    hfill(&w, 0.1, 2);
    bool per_sample = reduction == 0 && two;
    tpu_params p;
    loss_outputs(dt, per_sample, n, reduction, ignore, &lf, &lr, &twf, &twr, &p);
    tpu_tensor ops[5] = {lf.t, twf.t, x.t, tg.t, w.t};
    int nops = weighted ? 5 : 4;
    run(false, TPU_OP_NLL_LOSS, ops, nops, &p, NULL);
    ops[0] = lr.t;
    ops[1] = twr.t;
    run(true, TPU_OP_NLL_LOSS, ops, nops, &p, NULL);
    hcmp("nll loss", &lf, &lr, tol(dt), tol(dt) * 1e-2);
    hcmp("nll total_weight", &twf, &twr, tol(dt), tol(dt) * 1e-2);

    /* backward */
    hten gf, gr, go;
    if (two)
        hmk(&gf, dt, 2, xs, xl ^ L_PERM);
    else
        hmk1(&gf, dt, C, L_PAD);
    hclone(&gr, &gf);
    if (per_sample)
        hmk1(&go, dt, n, L_PAD);
    else
        hmk(&go, dt, 0, NULL, L_CONTIG);
    hfill(&go, -1, 1);
    tpu_tensor bops[5] = {gf.t, go.t, tg.t, twr.t, w.t};
    run(false, TPU_OP_NLL_LOSS_BWD, bops, nops, &p, NULL);
    bops[0] = gr.t;
    run(true, TPU_OP_NLL_LOSS_BWD, bops, nops, &p, NULL);
    hcmp("nll grad_x", &gf, &gr, tol(dt), tol(dt) * 1e-2);
    hten *all[] = {&x, &tg, &w, &lf, &lr, &twf, &twr, &gf, &gr, &go};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
}

static void test_nll_vs_ref(void) {
    static const int64_t Ns[] = {-1, 0, 1, 7, 13}, Cs[] = {1, 5, 11};
    for (int di = 0; di < NFLOAT; di++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t ci = 0; ci < sizeof Cs / sizeof Cs[0]; ci++)
                for (int red = 0; red < 3; red++)
                    for (int wt = 0; wt < 2; wt++)
                        for (int ig = 0; ig < 2; ig++)
                            nll_case(float_dtypes[di], Ns[ni], Cs[ci], red, wt, ig ? (Cs[ci] > 2 ? 2 : 0) : -100,
                                     (int)((ni + ci + (size_t)red) % 3) == 2 ? L_PAD : (int)((ni + ci) % 2));
}

/* loss of x = [[-1,-2],[-3,-4]] with targets t; returns (loss, total_weight) */
static void nll_hand(int reduction, const int64_t *t, const double *w, double *loss, double *tw, double *grad) {
    int64_t xs[2] = {2, 2};
    hten x, tg, wt, l, twt, g, go;
    hmk(&x, TPU_F32, 2, xs, L_CONTIG);
    for (int i = 0; i < 4; i++) hset(&x, i, -(i + 1.0));
    hmk1(&tg, TPU_I64, 2, L_CONTIG);
    for (int i = 0; i < 2; i++) tpu_store_i64(hptr(&tg.t, i), TPU_I64, t[i]);
    hmk1(&wt, TPU_F32, 2, L_CONTIG);
    if (w)
        for (int i = 0; i < 2; i++) hset(&wt, i, w[i]);
    if (reduction == 0)
        hmk1(&l, TPU_F32, 2, L_CONTIG);
    else
        hmk(&l, TPU_F32, 0, NULL, L_CONTIG);
    hmk(&twt, TPU_F32, 0, NULL, L_CONTIG);
    tpu_tensor ops[5] = {l.t, twt.t, x.t, tg.t, wt.t};
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = reduction;
    p.i[1] = -100;
    run(false, TPU_OP_NLL_LOSS, ops, w ? 5 : 4, &p, NULL);
    loss[0] = hget(&l, 0);
    if (reduction == 0) loss[1] = hget(&l, 1);
    *tw = hget(&twt, 0);
    hmk(&g, TPU_F32, 2, xs, L_CONTIG);
    memset(g.t.base, 0x7f, g.bytes); /* must be fully overwritten */
    if (reduction == 0)
        hmk1(&go, TPU_F32, 2, L_CONTIG);
    else
        hmk(&go, TPU_F32, 0, NULL, L_CONTIG);
    for (int64_t i = 0; i < hnumel(&go.t); i++) hset(&go, i, 1.0);
    tpu_tensor bops[5] = {g.t, go.t, tg.t, twt.t, wt.t};
    run(false, TPU_OP_NLL_LOSS_BWD, bops, w ? 5 : 4, &p, NULL);
    for (int i = 0; i < 4; i++) grad[i] = hget(&g, i);
    hten *all[] = {&x, &tg, &wt, &l, &twt, &g, &go};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
}

static void test_nll_hand(void) {
    snprintf(case_desc, sizeof case_desc, "nll hand values");
    double loss[2], tw, g[4];
    int64_t t01[2] = {0, 1}, ign[2] = {-100, -100}, t1i[2] = {-100, 1};
    double w[2] = {1, 3};
    nll_hand(1, t01, NULL, loss, &tw, g); /* (1 + 4)/2 */
    CHECK(loss[0] == 2.5 && tw == 2);
    CHECK(g[0] == -0.5 && g[1] == 0 && g[2] == 0 && g[3] == -0.5);
    nll_hand(1, t01, w, loss, &tw, g); /* (1*1 + 3*4)/(1 + 3) */
    CHECK(loss[0] == 3.25 && tw == 4);
    CHECK(g[0] == -0.25 && g[3] == -0.75 && g[1] == 0 && g[2] == 0);
    nll_hand(2, t01, w, loss, &tw, g);
    CHECK(loss[0] == 13 && tw == 4 && g[0] == -1 && g[3] == -3);
    nll_hand(0, t1i, w, loss, &tw, g); /* none: per sample, total_weight 0 */
    CHECK(loss[0] == 0 && loss[1] == 12 && tw == 0);
    CHECK(g[0] == 0 && g[1] == 0 && g[2] == 0 && g[3] == -3);
    nll_hand(1, ign, NULL, loss, &tw, g); /* all ignored: NaN, like PyTorch */
    CHECK(isnan(loss[0]) && tw == 0);
    CHECK(g[0] == 0 && g[1] == 0 && g[2] == 0 && g[3] == 0);
}

/* nll_loss and cross_entropy (ce), forward and backward, fast and reference */
static void test_nll_errors(void) {
    static const int64_t bad[] = {5, -1, 100};
    for (size_t bi = 0; bi < sizeof bad / sizeof bad[0]; bi++)
        for (int k = 0; k < 4; k++) {
            bool ref = k & 1, ce = k & 2;
            snprintf(case_desc, sizeof case_desc, "%s target %lld %s", ce ? "cross_entropy" : "nll", (long long)bad[bi],
                     ref ? "ref" : "fast");
            int64_t xs[2] = {3, 5};
            hten x, tg, l, l0, twt, g, g0, go;
            hmk(&x, TPU_F32, 2, xs, L_CONTIG);
            hfill(&x, -3, 0);
            hmk1(&tg, TPU_I64, 3, L_CONTIG);
            int64_t tv[3] = {1, bad[bi], 2};
            for (int i = 0; i < 3; i++) tpu_store_i64(hptr(&tg.t, i), TPU_I64, tv[i]);
            hmk(&l, TPU_F32, 0, NULL, L_CONTIG);
            hmk(&twt, TPU_F32, 0, NULL, L_CONTIG);
            hclone(&l0, &l);
            tpu_tensor ops[4] = {l.t, twt.t, x.t, tg.t};
            tpu_params p;
            memset(&p, 0, sizeof p);
            p.i[0] = 1;
            p.i[1] = -100;
            char err[256], want[64];
            snprintf(want, sizeof want, "Target %lld is out of bounds.", (long long)bad[bi]);
            CHECK(run(ref, ce ? TPU_OP_CROSS_ENTROPY : TPU_OP_NLL_LOSS, ops, 4, &p, err) == TPU_ERROR_KERNEL);
            CHECK_MSG(strcmp(err, want) == 0, "message '%s'", err);
            CHECK(memcmp(l.mem, l0.mem, l.bytes + 2 * GUARD) == 0);
            hmk(&g, TPU_F32, 2, xs, L_CONTIG);
            hclone(&g0, &g);
            hmk(&go, TPU_F32, 0, NULL, L_CONTIG);
            hset(&go, 0, 1);
            hset(&twt, 0, 2);
            tpu_tensor bops[5] = {g.t, go.t, tg.t, twt.t}, cops[5] = {g.t, go.t, x.t, tg.t, twt.t};
            err[0] = 0;
            CHECK(ce ? run(ref, TPU_OP_CROSS_ENTROPY_BWD, cops, 5, &p, err) == TPU_ERROR_KERNEL
                     : run(ref, TPU_OP_NLL_LOSS_BWD, bops, 4, &p, err) == TPU_ERROR_KERNEL);
            CHECK_MSG(strcmp(err, want) == 0, "message '%s'", err);
            CHECK(memcmp(g.mem, g0.mem, g.bytes + 2 * GUARD) == 0);
            hten *all[] = {&x, &tg, &l, &l0, &twt, &g, &g0, &go};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
        }
}

/* ================= cross entropy ================= */

/* Cross entropy over x [N, C] (layout xl) and its backward, from the logits
 * and from the log-probabilities, against the reference; on float32 also
 * against the pair it replaces (LOG_SOFTMAX then NLL_LOSS, NLL_LOSS_BWD then
 * LOG_SOFTMAX_BWD, fast kernels), which must match bit for bit. */
static void ce_case(tpu_dtype dt, int64_t N, int64_t C, int reduction, bool weighted, int64_t ignore, int xl) {
    snprintf(case_desc, sizeof case_desc, "cross_entropy %s N %lld C %lld reduction %d weight %d ignore %lld layout %d",
             tpu_dtype_name(dt), (long long)N, (long long)C, reduction, weighted, (long long)ignore, xl);
    int64_t xs[2] = {N, C};
    hten x, tg, w, lf, lr, twf, twr, go, lp;
    hmk(&x, dt, 2, xs, xl);
    hfill(&x, -8, 6);
    if (N > 2) hset(&x, 2 % (N * C), 40); /* a row with one large logit */
    hmk1(&tg, TPU_I64, N, L_PAD);
    hfill_int(&tg, C);
    for (int64_t i = 1; i < N; i += 4) tpu_store_i64(hptr(&tg.t, i), TPU_I64, ignore); /* some ignored */
    hmk1(&w, dt, C, L_CONTIG);
    hfill(&w, 0.1, 2);
    tpu_params p;
    loss_outputs(dt, reduction == 0, N, reduction, ignore, &lf, &lr, &twf, &twr, &p);
    int nops = weighted ? 5 : 4;
    tpu_tensor ops[5] = {lf.t, twf.t, x.t, tg.t, w.t};
    run(false, TPU_OP_CROSS_ENTROPY, ops, nops, &p, NULL);
    ops[0] = lr.t;
    ops[1] = twr.t;
    run(true, TPU_OP_CROSS_ENTROPY, ops, nops, &p, NULL);
    hcmp("cross_entropy loss", &lf, &lr, tol(dt), tol(dt) * 1e-2);
    hcmp("cross_entropy total_weight", &twf, &twr, tol(dt), tol(dt) * 1e-2);

    /* backward, from the logits (i2 0) and from LOG_SOFTMAX's output (i2 1) */
    if (reduction == 0)
        hmk1(&go, dt, N, L_PAD);
    else
        hmk(&go, dt, 0, NULL, L_CONTIG);
    hfill(&go, -1, 1.5);
    hmk(&lp, dt, 2, xs, L_CONTIG);
    tpu_params sp;
    memset(&sp, 0, sizeof sp);
    sp.i[0] = 1;
    tpu_tensor sops[2] = {lp.t, x.t};
    run(false, TPU_OP_LOG_SOFTMAX, sops, 2, &sp, NULL);
    for (int logprobs = 0; logprobs < 2; logprobs++) {
        hten gf, gr;
        hmk(&gf, dt, 2, xs, xl ^ L_PERM);
        hclone(&gr, &gf);
        tpu_params bp = p;
        bp.i[2] = logprobs;
        tpu_tensor bops[6] = {gf.t, go.t, logprobs ? lp.t : x.t, tg.t, twr.t, w.t};
        run(false, TPU_OP_CROSS_ENTROPY_BWD, bops, nops + 1, &bp, NULL);
        bops[0] = gr.t;
        run(true, TPU_OP_CROSS_ENTROPY_BWD, bops, nops + 1, &bp, NULL);
        hcmp(logprobs ? "cross_entropy grad from log-probabilities" : "cross_entropy grad", &gf, &gr, tol(dt),
             tol(dt) * 1e-2);
        if (dt == TPU_F32 && !((xl ^ L_PERM) & L_PERM)) { /* the pair, bit for bit (row-wise outputs) */
            hten G, gp;
            hmk(&G, dt, 2, xs, L_CONTIG);
            hclone(&gp, &gf);
            tpu_tensor nops_[5] = {G.t, go.t, tg.t, twr.t, w.t};
            run(false, TPU_OP_NLL_LOSS_BWD, nops_, nops, &p, NULL);
            tpu_tensor lops[3] = {gp.t, G.t, lp.t};
            run(false, TPU_OP_LOG_SOFTMAX_BWD, lops, 3, &sp, NULL);
            int64_t n = hnumel(&gf.t), bad = -1;
            for (int64_t i = 0; i < n && bad < 0; i++) {
                float a = (float)hget(&gf, i), b = (float)hget(&gp, i);
                if (memcmp(&a, &b, sizeof a) != 0) bad = i;
            }
            CHECK_MSG(bad < 0, "cross_entropy grad [%s] (logprobs %d) differs from the pair at %lld", case_desc,
                      logprobs, (long long)bad);
            hfree(&G);
            hfree(&gp);
        }
        hfree(&gf);
        hfree(&gr);
    }
    if (dt == TPU_F32) { /* forward against the pair */
        hten lq, twq;
        hclone(&lq, &lf);
        hclone(&twq, &twf);
        tpu_tensor qops[5] = {lq.t, twq.t, lp.t, tg.t, w.t};
        run(false, TPU_OP_NLL_LOSS, qops, nops, &p, NULL);
        int64_t n = hnumel(&lf.t);
        bool same = true;
        for (int64_t i = 0; i < n; i++) {
            float a = (float)hget(&lf, i), b = (float)hget(&lq, i);
            same = same && memcmp(&a, &b, sizeof a) == 0;
        }
        CHECK_MSG(same && hget(&twf, 0) == hget(&twq, 0), "cross_entropy loss [%s] differs from the pair", case_desc);
        hfree(&lq);
        hfree(&twq);
    }
    hten *all[] = {&x, &tg, &w, &lf, &lr, &twf, &twr, &go, &lp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
}

static void test_cross_entropy(void) {
    static const int64_t Ns[] = {0, 1, 7, 13}, Cs[] = {1, 5, 17, 300};
    const tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F16};
    for (size_t di = 0; di < 3; di++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t ci = 0; ci < sizeof Cs / sizeof Cs[0]; ci++)
                for (int red = 0; red < 3; red++)
                    for (int wt = 0; wt < 2; wt++)
                        ce_case(dts[di], Ns[ni], Cs[ci], red, wt, (ni + ci) % 2 ? (Cs[ci] > 2 ? 2 : 0) : -100,
                                (int)((ni + ci + (size_t)red) % 3) == 2 ? L_PAD : (int)((ni + ci + di) % 2));
    /* float64 is the pair's (CPU reference only): refused at launch */
    hten x;
    int64_t xs[2] = {2, 3};
    hmk(&x, TPU_F64, 2, xs, L_CONTIG);
    tpu_tensor ops[4] = {x.t, x.t, x.t, x.t};
    tpu_params p;
    memset(&p, 0, sizeof p);
    CHECK(tpu_op_check_dtypes(TPU_OP_CROSS_ENTROPY, ops, 4, &p) == TPU_ERROR_NOT_SUPPORTED);
    hfree(&x);
}

/* ================= layer norm ================= */

/* ndim/sizes of x; M normalized elements; rows the number of rows */
static void ln_case(tpu_dtype dt, int ndim, const int64_t *sizes, int64_t M, int64_t rows, int xl, int yl, bool hw,
                    bool hb) {
    snprintf(case_desc, sizeof case_desc, "layer_norm %s ndim %d M %lld x-layout %d y-layout %d w %d b %d",
             tpu_dtype_name(dt), ndim, (long long)M, xl, yl, hw, hb);
    hten x, w, b, yf, yr, mf, mr, rf, rr;
    hmk(&x, dt, ndim, sizes, xl);
    hfill(&x, -1.5, 4.5);
    hmk1(&w, dt, M, L_CONTIG);
    hfill(&w, 0.5, 1.5);
    hmk1(&b, dt, M, L_CONTIG);
    hfill(&b, -1, 1);
    hmk(&yf, dt, ndim, sizes, yl);
    hclone(&yr, &yf);
    hmk1(&mf, dt, rows, L_CONTIG);
    hclone(&mr, &mf);
    hmk1(&rf, dt, rows, L_CONTIG);
    hclone(&rr, &rf);
    tpu_tensor ops[6] = {yf.t, mf.t, rf.t, x.t};
    int n = 4;
    if (hw) ops[n++] = w.t;
    if (hb) ops[n++] = b.t;
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = M;
    p.i[1] = hw;
    p.i[2] = hb;
    p.f[0] = 1e-5;
    run(false, TPU_OP_LAYER_NORM, ops, n, &p, NULL);
    ops[0] = yr.t;
    ops[1] = mr.t;
    ops[2] = rr.t;
    run(true, TPU_OP_LAYER_NORM, ops, n, &p, NULL);
    double e = tol(dt);
    hcmp("layer_norm y", &yf, &yr, e, e);
    hcmp("layer_norm mean", &mf, &mr, e, e);
    hcmp("layer_norm rstd", &rf, &rr, e, e);

    /* backward, with each set of requested outputs */
    for (int want = 0; want < 3; want++) { /* 0 all, 1 dx only, 2 dw/db only */
        hten g, dxf, dxr, dwf, dwr, dbf, dbr;
        hmk(&g, dt, ndim, sizes, yl);
        hfill(&g, -1, 1);
        hmk(&dxf, dt, ndim, sizes, yl ^ L_PAD);
        hclone(&dxr, &dxf);
        hmk1(&dwf, dt, M, L_CONTIG);
        hclone(&dwr, &dwf);
        hmk1(&dbf, dt, M, L_CONTIG);
        hclone(&dbr, &dbf);
        tpu_tensor none = tpu_tensor_scalar_f(0, dt);
        tpu_tensor bops[8] = {
            want == 2 ? none : dxf.t, want == 1 ? none : dwf.t, want == 1 ? none : dbf.t, g.t, x.t, mr.t, rr.t, w.t};
        int bn = hw ? 8 : 7;
        run(false, TPU_OP_LAYER_NORM_BWD, bops, bn, &p, NULL);
        if (want != 2) bops[0] = dxr.t;
        if (want != 1) {
            bops[1] = dwr.t;
            bops[2] = dbr.t;
        }
        run(true, TPU_OP_LAYER_NORM_BWD, bops, bn, &p, NULL);
        hcmp("layer_norm_backward dx", &dxf, &dxr, e, e);
        hcmp("layer_norm_backward dw", &dwf, &dwr, e, e);
        hcmp("layer_norm_backward db", &dbf, &dbr, e, e);
        hten *all[] = {&g, &dxf, &dxr, &dwf, &dwr, &dbf, &dbr};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
    }
    hten *all[] = {&x, &w, &b, &yf, &yr, &mf, &mr, &rf, &rr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
}

static void test_layer_norm_vs_ref(void) {
    static const struct {
        int ndim;
        int64_t sizes[3];
        int64_t M, rows;
    } cases[] = {
        {3, {3, 5, 7}, 7, 15}, {3, {3, 5, 7}, 35, 3},   {3, {3, 5, 7}, 105, 1},
        {2, {11, 13}, 13, 11}, {2, {3, 1031}, 1031, 3}, {1, {5}, 1, 5},
        {2, {0, 7}, 7, 0},     {2, {4, 0}, 0, 4},       {3, {2, 1, 9}, 9, 2},
    };
    for (int di = 0; di < NFLOAT; di++)
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            for (int xl = 0; xl < 3; xl++)
                for (int wb = 0; wb < 4; wb++)
                    ln_case(float_dtypes[di], cases[c].ndim, cases[c].sizes, cases[c].M, cases[c].rows,
                            xl == 2 ? L_PAD : xl, (xl + wb) % 2 ? L_PAD : L_CONTIG, wb & 1, wb & 2);
}

static void test_layer_norm_hand(void) {
    snprintf(case_desc, sizeof case_desc, "layer_norm hand values");
    int64_t s = 4;
    hten x, y, m, r;
    hmk(&x, TPU_F32, 1, &s, L_CONTIG);
    hmk(&y, TPU_F32, 1, &s, L_CONTIG);
    hmk1(&m, TPU_F32, 1, L_CONTIG);
    hmk1(&r, TPU_F32, 1, L_CONTIG);
    for (int i = 0; i < 4; i++) hset(&x, i, i + 1.0);
    tpu_tensor ops[4] = {y.t, m.t, r.t, x.t};
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = 4; /* eps 0: var 1.25 */
    run(false, TPU_OP_LAYER_NORM, ops, 4, &p, NULL);
    double rstd = 1 / sqrt(1.25);
    CHECK(fabs(hget(&m, 0) - 2.5) < 1e-6 && fabs(hget(&r, 0) - rstd) < 1e-6);
    for (int i = 0; i < 4; i++) CHECK(fabs(hget(&y, i) - (i + 1 - 2.5) * rstd) < 1e-6);
    hten *all[] = {&x, &y, &m, &r};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
}

/* ================= index ops ================= */

static const tpu_dtype index_dtypes[] = {TPU_F32, TPU_F64, TPU_BF16, TPU_F16, TPU_I64, TPU_I32};
#define NINDEX_DT 6

static void fill_any(hten *h) {
    if (tpu_dtype_is_float((tpu_dtype)h->t.dtype))
        hfill(h, -4, 4);
    else
        hfill_int(h, 100);
}

/* index 1-d of length K (K < 0: 0-dim), values in [0, lim) */
static void mk_index1(hten *ix, tpu_dtype idt, int64_t K, int64_t lim) {
    if (K < 0)
        hmk(ix, idt, 0, NULL, L_CONTIG);
    else
        hmk1(ix, idt, K, K % 2 ? L_PAD : L_CONTIG);
    for (int64_t i = 0; i < hnumel(&ix->t); i++)
        tpu_store_i64(hptr(&ix->t, i), idt, i == 1 ? tpu_load_i64(hptr(&ix->t, 0), idt) : irand(lim)); /* a duplicate */
}

static void select_case(tpu_dtype dt, tpu_dtype idt, int ndim, const int64_t *xs, int dim, int64_t K, int xl, int ol) {
    snprintf(case_desc, sizeof case_desc, "index_select %s index %s ndim %d dim %d K %lld x-layout %d out-layout %d",
             tpu_dtype_name(dt), tpu_dtype_name(idt), ndim, dim, (long long)K, xl, ol);
    int64_t os[TPU_MAX_DIMS];
    memcpy(os, xs, (size_t)ndim * sizeof *os);
    if (ndim) os[dim] = K < 0 ? 1 : K;
    hten x, ix, of, orf;
    hmk(&x, dt, ndim, xs, xl);
    fill_any(&x);
    mk_index1(&ix, idt, K, ndim ? xs[dim] : 1);
    hmk(&of, dt, ndim, os, ol);
    hclone(&orf, &of);
    tpu_tensor ops[3] = {of.t, x.t, ix.t};
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = dim;
    run(false, TPU_OP_INDEX_SELECT, ops, 3, &p, NULL);
    ops[0] = orf.t;
    run(true, TPU_OP_INDEX_SELECT, ops, 3, &p, NULL);
    hcmp("index_select", &of, &orf, 0, 0);
    hfree(&x);
    hfree(&ix);
    hfree(&of);
    hfree(&orf);
}

/* gather (scatter=false) or scatter_add: index shape is, per dim, is[d] */
static void gather_scatter_case(bool scatter, tpu_dtype dt, int ndim, const int64_t *xs, const int64_t *is, int dim,
                                int xl, int il) {
    snprintf(case_desc, sizeof case_desc, "%s %s ndim %d dim %d x-layout %d index-layout %d",
             scatter ? "scatter_add" : "gather", tpu_dtype_name(dt), ndim, dim, xl, il);
    hten x, ix, of, orf, src;
    hmk(&x, dt, ndim, xs, xl); /* gather input, or the scatter_add output */
    fill_any(&x);
    hmk(&ix, TPU_I64, ndim, is, il);
    hfill_int(&ix, ndim ? xs[dim] : 1);
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = dim;
    if (!scatter) {
        hmk(&of, dt, ndim, is, xl ^ L_PERM);
        hclone(&orf, &of);
        tpu_tensor ops[3] = {of.t, x.t, ix.t};
        run(false, TPU_OP_GATHER, ops, 3, &p, NULL);
        ops[0] = orf.t;
        run(true, TPU_OP_GATHER, ops, 3, &p, NULL);
        hcmp("gather", &of, &orf, 0, 0);
    } else {
        int64_t ss[TPU_MAX_DIMS];
        for (int d = 0; d < ndim; d++) ss[d] = is[d] + 1;
        hmk(&src, dt, ndim, ss, il ^ L_PERM);
        fill_any(&src);
        hclone(&of, &x);
        hclone(&orf, &x);
        tpu_tensor ops[3] = {of.t, ix.t, src.t};
        run(false, TPU_OP_SCATTER_ADD, ops, 3, &p, NULL);
        ops[0] = orf.t;
        run(true, TPU_OP_SCATTER_ADD, ops, 3, &p, NULL);
        hcmp("scatter_add", &of, &orf, tol(dt), tol(dt));
        hfree(&of);
        hfree(&orf);
        hclone(&of, &x); /* scatter (a copy; duplicates: the last wins, in both paths) */
        hclone(&orf, &x);
        ops[0] = of.t;
        run(false, TPU_OP_SCATTER, ops, 3, &p, NULL);
        ops[0] = orf.t;
        run(true, TPU_OP_SCATTER, ops, 3, &p, NULL);
        hcmp("scatter", &of, &orf, 0, 0);
        for (int red = 0; red < 3; red++) { /* scatter_reduce prod / amax / amin: in k order in both */
            if (dt == TPU_BOOL) break;
            hfree(&of);
            hfree(&orf);
            hclone(&of, &x);
            hclone(&orf, &x);
            p.i[1] = red;
            ops[0] = of.t;
            run(false, TPU_OP_SCATTER_REDUCE, ops, 3, &p, NULL);
            ops[0] = orf.t;
            run(true, TPU_OP_SCATTER_REDUCE, ops, 3, &p, NULL);
            hcmp("scatter_reduce", &of, &orf, 0, 0);
        }
        hfree(&src);
    }
    hfree(&x);
    hfree(&ix);
    hfree(&of);
    hfree(&orf);
}

static void index_add_case(tpu_dtype dt, tpu_dtype idt, int ndim, const int64_t *os, int dim, int64_t K, double alpha,
                           int ol, int sl) {
    snprintf(case_desc, sizeof case_desc, "index_add %s index %s ndim %d dim %d K %lld alpha %g layouts %d %d",
             tpu_dtype_name(dt), tpu_dtype_name(idt), ndim, dim, (long long)K, alpha, ol, sl);
    int64_t ss[TPU_MAX_DIMS];
    memcpy(ss, os, (size_t)ndim * sizeof *ss);
    if (ndim) ss[dim] = K < 0 ? 1 : K;
    hten of, orf, ix, src;
    hmk(&of, dt, ndim, os, ol);
    fill_any(&of);
    hclone(&orf, &of);
    mk_index1(&ix, idt, K, ndim ? os[dim] : 1);
    hmk(&src, dt, ndim, ss, sl);
    fill_any(&src);
    tpu_tensor ops[3] = {of.t, ix.t, src.t};
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = dim;
    p.f[0] = alpha;
    run(false, TPU_OP_INDEX_ADD, ops, 3, &p, NULL);
    ops[0] = orf.t;
    run(true, TPU_OP_INDEX_ADD, ops, 3, &p, NULL);
    hcmp("index_add", &of, &orf, tol(dt), tol(dt));
    hfree(&of);
    hfree(&orf);
    hfree(&ix);
    hfree(&src);
}

static void test_index_vs_ref(void) {
    static const struct {
        int ndim;
        int64_t sizes[3];
    } shapes[] = {
        {0, {0}}, {1, {7}}, {3, {5, 7, 3}}, {2, {11, 131}}, {2, {0, 3}},
    };
    static const int64_t Ks[] = {-1, 0, 1, 4, 9};
    for (int di = 0; di < NINDEX_DT; di++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int dim = 0; dim < (shapes[s].ndim ? shapes[s].ndim : 1); dim++)
                for (int lay = 0; lay < 4; lay++) {
                    int nd = shapes[s].ndim;
                    const int64_t *xs = shapes[s].sizes;
                    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
                        if (Ks[ki] != 1 && Ks[ki] != -1 && nd == 0) continue;
                        if (Ks[ki] != 0 && nd && xs[dim] == 0) continue;
                        tpu_dtype idt = (ki + (size_t)lay) % 2 ? TPU_I32 : TPU_I64;
                        select_case(index_dtypes[di], idt, nd, xs, dim, Ks[ki], lay, 3 - lay);
                        if (!tpu_dtype_is_float(index_dtypes[di]) && index_dtypes[di] != TPU_I64) continue;
                        index_add_case(index_dtypes[di], idt, nd, xs, dim, Ks[ki], lay == 1 ? 0.5 : 1.0, lay, 3 - lay);
                    }
                    /* index shapes: smaller than x off dim, any size along dim */
                    int64_t is[TPU_MAX_DIMS];
                    for (int shrink = 0; shrink < 2; shrink++) {
                        bool empty = false;
                        for (int d = 0; d < nd; d++) {
                            is[d] = d == dim ? (shrink ? 9 : xs[d]) : (shrink && xs[d] > 1 ? xs[d] - 1 : xs[d]);
                            empty |= xs[d] == 0;
                        }
                        if (empty && shrink) continue;
                        if (nd && xs[dim] == 0) is[dim] = 0;
                        gather_scatter_case(false, index_dtypes[di], nd, xs, is, dim, lay, 3 - lay);
                        gather_scatter_case(true, index_dtypes[di], nd, xs, is, dim, lay, 3 - lay);
                    }
                }
    /* the embedding shapes: forward select rows, backward index_add rows */
    int64_t V[2] = {11, 131};
    select_case(TPU_F32, TPU_I64, 2, V, 0, 17, L_CONTIG, L_CONTIG);
    index_add_case(TPU_F32, TPU_I64, 2, V, 0, 17, 1.0, L_CONTIG, L_CONTIG);
    index_add_case(TPU_BF16, TPU_I64, 2, V, 0, 17, 1.0, L_CONTIG, L_CONTIG);
    int64_t big[2] = {7, 5003}; /* several inner blocks */
    index_add_case(TPU_F32, TPU_I64, 2, big, 0, 9, -2.0, L_PAD, L_CONTIG);
    select_case(TPU_F32, TPU_I32, 2, big, 0, 9, L_PAD, L_CONTIG);
}

static void test_index_hand(void) {
    snprintf(case_desc, sizeof case_desc, "index hand values");
    int64_t xs[2] = {3, 2}, os[2] = {3, 2}, s22[2] = {2, 2};
    hten x, ix, o;
    tpu_params p;
    memset(&p, 0, sizeof p);
    /* index_select dim 0 */
    hmk(&x, TPU_F32, 2, xs, L_CONTIG);
    for (int i = 0; i < 6; i++) hset(&x, i, i + 1);
    hmk1(&ix, TPU_I64, 3, L_CONTIG);
    int64_t iv[3] = {2, 0, 2};
    for (int i = 0; i < 3; i++) tpu_store_i64(hptr(&ix.t, i), TPU_I64, iv[i]);
    hmk(&o, TPU_F32, 2, os, L_CONTIG);
    tpu_tensor ops[3] = {o.t, x.t, ix.t};
    run(false, TPU_OP_INDEX_SELECT, ops, 3, &p, NULL);
    double want_sel[6] = {5, 6, 1, 2, 5, 6};
    for (int i = 0; i < 6; i++) CHECK(hget(&o, i) == want_sel[i]);
    hfree(&x);
    hfree(&o);
    hfree(&ix);
    /* index_add with duplicates: zeros(3).index_add_(0, [0, 0, 2], [1, 2, 3], alpha=2) = [6, 0, 6] */
    hmk1(&o, TPU_F32, 3, L_CONTIG);
    for (int i = 0; i < 3; i++) hset(&o, i, 0);
    hmk1(&ix, TPU_I64, 3, L_CONTIG);
    int64_t av[3] = {0, 0, 2};
    for (int i = 0; i < 3; i++) tpu_store_i64(hptr(&ix.t, i), TPU_I64, av[i]);
    hmk1(&x, TPU_F32, 3, L_CONTIG);
    for (int i = 0; i < 3; i++) hset(&x, i, i + 1);
    p.f[0] = 2;
    tpu_tensor aops[3] = {o.t, ix.t, x.t};
    run(false, TPU_OP_INDEX_ADD, aops, 3, &p, NULL);
    CHECK(hget(&o, 0) == 6 && hget(&o, 1) == 0 && hget(&o, 2) == 6);
    hfree(&x);
    hfree(&o);
    hfree(&ix);
    /* scatter_add dim 1: zeros(2,2), index [[0,0],[1,0]], src [[1,2],[3,4]] -> [[3,0],[4,3]];
     * gather dim 1 of [[1,2],[3,4]] with the same index -> [[1,1],[4,3]] */
    p.i[0] = 1;
    hmk(&o, TPU_F32, 2, s22, L_CONTIG);
    hmk(&ix, TPU_I64, 2, s22, L_CONTIG);
    hmk(&x, TPU_F32, 2, s22, L_CONTIG);
    int64_t gv[4] = {0, 0, 1, 0};
    for (int i = 0; i < 4; i++) {
        hset(&o, i, 0);
        hset(&x, i, i + 1);
        tpu_store_i64(hptr(&ix.t, i), TPU_I64, gv[i]);
    }
    tpu_tensor sops[3] = {o.t, ix.t, x.t};
    run(false, TPU_OP_SCATTER_ADD, sops, 3, &p, NULL);
    double want_sc[4] = {3, 0, 4, 3}, want_g[4] = {1, 1, 4, 3};
    for (int i = 0; i < 4; i++) CHECK(hget(&o, i) == want_sc[i]);
    tpu_tensor gops[3] = {o.t, x.t, ix.t};
    run(false, TPU_OP_GATHER, gops, 3, &p, NULL);
    for (int i = 0; i < 4; i++) CHECK(hget(&o, i) == want_g[i]);
    hfree(&x);
    hfree(&o);
    hfree(&ix);
}

/* One bad index value in each op; the output must be left untouched. */
static void test_index_errors(void) {
    int64_t s[2] = {5, 3};
    static const int64_t bad[] = {5, -1};
    for (int op = TPU_OP_INDEX_SELECT; op <= TPU_OP_INDEX_ADD; op++)
        for (size_t bi = 0; bi < 2; bi++)
            for (int ref = 0; ref < 2; ref++) {
                snprintf(case_desc, sizeof case_desc, "%s index %lld %s", tpu_op_name((tpu_op)op), (long long)bad[bi],
                         ref ? "ref" : "fast");
                bool one_d = op == TPU_OP_INDEX_SELECT || op == TPU_OP_INDEX_ADD;
                hten x, ix, o, o0;
                hmk(&x, TPU_F32, 2, s, L_CONTIG);
                hfill(&x, -1, 1);
                if (one_d)
                    hmk1(&ix, TPU_I64, 3, L_CONTIG);
                else
                    hmk(&ix, TPU_I64, 2, s, L_CONTIG);
                hfill_int(&ix, 5);
                tpu_store_i64(hptr(&ix.t, 2), TPU_I64, bad[bi]);
                int64_t os[2] = {3, 3};
                hmk(&o, TPU_F32, 2, op == TPU_OP_INDEX_SELECT ? os : s, L_CONTIG);
                hfill(&o, -1, 1);
                hclone(&o0, &o);
                tpu_tensor ops[3] = {o.t, x.t, ix.t};
                if (op == TPU_OP_SCATTER_ADD || op == TPU_OP_INDEX_ADD || op == TPU_OP_SCATTER ||
                    op == TPU_OP_SCATTER_REDUCE) {
                    ops[1] = ix.t;
                    ops[2] = x.t;
                    if (op == TPU_OP_INDEX_ADD) ops[2].sizes[0] = 3; /* src [3, 3] */
                }
                tpu_params p;
                memset(&p, 0, sizeof p);
                p.f[0] = 1;
                char err[256], want[128];
                if (op == TPU_OP_INDEX_SELECT)
                    snprintf(want, sizeof want, "index out of range in self");
                else
                    snprintf(want, sizeof want, "index %lld is out of bounds for dimension 0 with size 5",
                             (long long)bad[bi]);
                CHECK(run(ref, (tpu_op)op, ops, 3, &p, err) == TPU_ERROR_KERNEL);
                CHECK_MSG(strcmp(err, want) == 0, "message '%s'", err);
                CHECK(memcmp(o.mem, o0.mem, o.bytes + 2 * GUARD) == 0);
                hfree(&x);
                hfree(&ix);
                hfree(&o);
                hfree(&o0);
            }
}

/* index / index_put: X of shape [A, I0, I1, C] (any layout) indexed on
 * dims 1 and 2 (k = 2) or dim 1 alone (k = 1) by indices of shape [M]
 * (the second may be broadcast from [1]), iteration shape S = [A, M, C].
 * Indices include negative values and a duplicate; fast against ref. */
static void adv_case(tpu_dtype dt, tpu_dtype idt, int k, bool bcast, int xl, int64_t M, int accumulate) {
    snprintf(case_desc, sizeof case_desc, "index/index_put %s idx %s k %d bcast %d layout %d M %lld acc %d",
             tpu_dtype_name(dt), tpu_dtype_name(idt), k, bcast, xl, (long long)M, accumulate);
    int64_t xs[4] = {2, 5, 3, 4}, S[3] = {xs[0], M, xs[3]};
    hten x, i0, i1, o, orf, vals, xp, xpr;
    hmk(&x, dt, 4, xs, xl);
    fill_any(&x);
    hmk1(&i0, idt, M, L_PAD);
    hmk1(&i1, idt, bcast ? 1 : M, L_CONTIG);
    for (int64_t m = 0; m < M; m++) tpu_store_i64(hptr(&i0.t, m), idt, m == 1 ? -5 + 0 : irand(10) - 5); /* [-5, 5) */
    if (M > 2) tpu_store_i64(hptr(&i0.t, 2), idt, tpu_load_i64(hptr(&i0.t, 0), idt));             /* a duplicate */
    for (int64_t m = 0; m < hnumel(&i1.t); m++) tpu_store_i64(hptr(&i1.t, m), idt, irand(6) - 3); /* [-3, 3) */
    if (M > 2 && !bcast) tpu_store_i64(hptr(&i1.t, 2), idt, tpu_load_i64(hptr(&i1.t, 0), idt));
    /* the indexed view: S's dims, then the indexed dims */
    tpu_tensor xv = x.t;
    xv.ndim = 3 + k;
    int64_t vs[6] = {xs[0], M, xs[3], xs[1], xs[2], 0},
            vst[6] = {x.t.strides[0], 0, x.t.strides[3], x.t.strides[1], x.t.strides[2], 0};
    if (k == 1) { /* X[:, i0, 1]: dim 2 fixed at 1 (an offset), S stays [A, M, C] */
        vs[3] = xs[1];
        vst[3] = x.t.strides[1];
        xv.offset += x.t.strides[2];
    }
    memcpy(xv.sizes, vs, sizeof vs);
    memcpy(xv.strides, vst, sizeof vst);
    tpu_tensor iv[2] = {i0.t, i1.t};
    for (int j = 0; j < 2; j++) {
        iv[j].ndim = 3;
        iv[j].sizes[0] = S[0];
        iv[j].sizes[1] = S[1];
        iv[j].sizes[2] = S[2];
        iv[j].strides[0] = iv[j].strides[2] = 0;
        iv[j].strides[1] = (j == 1 && bcast) ? 0 : (j == 0 ? i0.t.strides[0] : i1.t.strides[0]);
    }
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = 1 | (2 << 5);
    p.i[1] = accumulate;
    /* index */
    hmk(&o, dt, 3, S, xl ^ L_PERM);
    hclone(&orf, &o);
    tpu_tensor ops[4] = {o.t, xv, iv[0], iv[1]};
    CHECK(run(false, TPU_OP_INDEX, ops, 2 + k, &p, NULL) == TPU_OK);
    ops[0] = orf.t;
    CHECK(run(true, TPU_OP_INDEX, ops, 2 + k, &p, NULL) == TPU_OK);
    hcmp("index", &o, &orf, 0, 0);
    /* index_put into a copy of X (values of shape S) */
    hmk(&vals, dt, 3, S, L_PAD);
    fill_any(&vals);
    hclone(&xp, &x);
    hclone(&xpr, &x);
    tpu_tensor pv = xv;
    pv.base = xp.t.base;
    tpu_tensor pops[4] = {pv, vals.t, iv[0], iv[1]};
    CHECK(run(false, TPU_OP_INDEX_PUT, pops, 2 + k, &p, NULL) == TPU_OK);
    pops[0].base = xpr.t.base;
    CHECK(run(true, TPU_OP_INDEX_PUT, pops, 2 + k, &p, NULL) == TPU_OK);
    hcmp("index_put", &xp, &xpr, tol(dt), tol(dt));
    hten *all[] = {&x, &i0, &i1, &o, &orf, &vals, &xp, &xpr};
    for (size_t q = 0; q < sizeof all / sizeof *all; q++) hfree(all[q]);
}

static void test_index_adv(void) {
    static const tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F16, TPU_F64, TPU_I64, TPU_I32, TPU_U8, TPU_BOOL};
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
        for (int k = 1; k <= 2; k++)
            for (int acc = 0; acc < 2; acc++) {
                adv_case(dts[d], d % 2 ? TPU_I32 : TPU_I64, k, false, (int)(d % 4), 7, acc);
                adv_case(dts[d], TPU_I64, k, true, (int)((d + 1) % 4), 1 + (int64_t)d, acc);
            }
    /* hand values: x = [[1,2,3],[4,5,6]]; x[[1,-2],[2,0]] = [6,1]; put [10,20] with accumulate
     * at [[1,1],[2,2]] (a duplicate) -> x[1,2] = 6 + 30 */
    snprintf(case_desc, sizeof case_desc, "index hand values");
    int64_t xs[2] = {2, 3};
    hten x, i0, i1, o, v;
    hmk(&x, TPU_F32, 2, xs, L_CONTIG);
    for (int i = 0; i < 6; i++) hset(&x, i, i + 1);
    hmk1(&i0, TPU_I64, 2, L_CONTIG);
    hmk1(&i1, TPU_I64, 2, L_CONTIG);
    hmk1(&o, TPU_F32, 2, L_CONTIG);
    hmk1(&v, TPU_F32, 2, L_CONTIG);
    int64_t a0[2] = {1, -2}, a1[2] = {2, 0};
    for (int i = 0; i < 2; i++) {
        tpu_store_i64(hptr(&i0.t, i), TPU_I64, a0[i]);
        tpu_store_i64(hptr(&i1.t, i), TPU_I64, a1[i]);
        hset(&v, i, 10 * (i + 1));
    }
    tpu_tensor xv = x.t;
    xv.ndim = 3;
    xv.sizes[0] = 2;
    xv.strides[0] = 0;
    xv.sizes[1] = 2;
    xv.strides[1] = 3;
    xv.sizes[2] = 3;
    xv.strides[2] = 1;
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = 0 | (1 << 5);
    for (int ref = 0; ref < 2; ref++) {
        tpu_tensor ops[4] = {o.t, xv, i0.t, i1.t};
        CHECK(run(ref, TPU_OP_INDEX, ops, 4, &p, NULL) == TPU_OK);
        CHECK(hget(&o, 0) == 6 && hget(&o, 1) == 1);
    }
    tpu_store_i64(hptr(&i0.t, 1), TPU_I64, 1);
    tpu_store_i64(hptr(&i1.t, 1), TPU_I64, 2);
    p.i[1] = 1;
    tpu_tensor pops[4] = {xv, v.t, i0.t, i1.t};
    CHECK(run(false, TPU_OP_INDEX_PUT, pops, 4, &p, NULL) == TPU_OK);
    CHECK(hget(&x, 5) == 36 && hget(&x, 4) == 5);
    /* out of range: index 2 in dim 1... the message names dim 1 and size 3; nothing written */
    tpu_store_i64(hptr(&i1.t, 1), TPU_I64, 3);
    for (int ref = 0; ref < 2; ref++) {
        hten o0;
        hclone(&o0, &x);
        char err[256];
        pops[0].base = x.t.base;
        CHECK(run(ref, TPU_OP_INDEX_PUT, pops, 4, &p, err) == TPU_ERROR_KERNEL);
        CHECK_MSG(strcmp(err, "index 3 is out of bounds for dimension 1 with size 3") == 0, "message '%s'", err);
        CHECK(memcmp(x.mem, o0.mem, x.bytes + 2 * GUARD) == 0);
        hfree(&o0);
    }
    hten *all[] = {&x, &i0, &i1, &o, &v};
    for (size_t q = 0; q < sizeof all / sizeof *all; q++) hfree(all[q]);
}

/* histc and bincount: hand values (one implementation serves both paths). */
static void hist_vals(hten *h, tpu_dtype dt, int n, const double *v) {
    hmk1(h, dt, n, L_PAD);
    for (int i = 0; i < n; i++) hset(h, i, v[i]);
}

static void test_histogram(void) {
    static const tpu_dtype fdt[] = {TPU_F32, TPU_BF16, TPU_F16, TPU_F64};
    for (int ref = 0; ref < 2; ref++) {
        for (size_t d = 0; d < 4; d++) {
            snprintf(case_desc, sizeof case_desc, "histc %s %s", tpu_dtype_name(fdt[d]), ref ? "ref" : "fast");
            double xv[6] = {1, 2, 2, 3, 5, NAN};
            hten x, o;
            hist_vals(&x, fdt[d], 6, xv);
            hmk1(&o, fdt[d], 3, L_CONTIG);
            tpu_params p;
            memset(&p, 0, sizeof p);
            p.f[0] = 1;
            p.f[1] = 3;
            tpu_tensor ops[2] = {o.t, x.t};
            CHECK(run(ref, TPU_OP_HISTC, ops, 2, &p, NULL) == TPU_OK);
            CHECK(hget(&o, 0) == 1 && hget(&o, 1) == 2 && hget(&o, 2) == 1);
            hfree(&x);
            hfree(&o);
        }
        snprintf(case_desc, sizeof case_desc, "histc int32 %s", ref ? "ref" : "fast");
        double iv[5] = {0, 1, 1, 3, 4};
        hten x, o, w;
        hist_vals(&x, TPU_I32, 5, iv);
        hmk1(&o, TPU_I32, 4, L_CONTIG);
        tpu_params p;
        memset(&p, 0, sizeof p);
        p.f[1] = 3;
        tpu_tensor ops[3] = {o.t, x.t};
        CHECK(run(ref, TPU_OP_HISTC, ops, 2, &p, NULL) == TPU_OK); /* (e - 0) * 4 / 3: 0, 1, 1, 4 -> 3 */
        CHECK(hget(&o, 0) == 1 && hget(&o, 1) == 2 && hget(&o, 2) == 0 && hget(&o, 3) == 1);
        hfree(&x);
        hfree(&o);
        snprintf(case_desc, sizeof case_desc, "bincount %s", ref ? "ref" : "fast");
        double bv[3] = {1, 1, 3}, wv[3] = {0.5, 0.25, 2};
        hist_vals(&x, TPU_I64, 3, bv);
        hist_vals(&w, TPU_F32, 3, wv);
        hmk1(&o, TPU_I64, 5, L_CONTIG);
        memset(&p, 0, sizeof p);
        ops[0] = o.t;
        ops[1] = x.t;
        CHECK(run(ref, TPU_OP_BINCOUNT, ops, 2, &p, NULL) == TPU_OK);
        CHECK(hget(&o, 0) == 0 && hget(&o, 1) == 2 && hget(&o, 3) == 1 && hget(&o, 4) == 0);
        hfree(&o);
        hmk1(&o, TPU_F32, 5, L_CONTIG);
        ops[0] = o.t;
        ops[2] = w.t;
        CHECK(run(ref, TPU_OP_BINCOUNT, ops, 3, &p, NULL) == TPU_OK);
        CHECK(hget(&o, 1) == 0.75 && hget(&o, 3) == 2 && hget(&o, 2) == 0);
        /* a value past the end: fails, out untouched */
        hset(&x, 2, 5);
        hten o0;
        hclone(&o0, &o);
        char err[256];
        CHECK(run(ref, TPU_OP_BINCOUNT, ops, 3, &p, err) == TPU_ERROR_KERNEL);
        CHECK_MSG(strstr(err, "out of range") != NULL, "message '%s'", err);
        CHECK(memcmp(o.mem, o0.mem, o.bytes + 2 * GUARD) == 0);
        hten *all[] = {&x, &o, &w, &o0};
        for (size_t q = 0; q < 4; q++) hfree(all[q]);
    }
}

/* topk's indices, whose order among ties is the CPU's (tested against
 * PyTorch in tests/python): each names an element of x holding its value,
 * and no row names one twice. */
static void topk_index_check(const hten *x, const hten *v, const hten *ix, int nd, int dim) {
    int64_t n = hnumel(&ix->t), idx[TPU_MAX_DIMS], dstep = 1; /* dstep: one step along dim, linearly */
    for (int d = nd - 1; d > dim; d--) dstep *= ix->t.sizes[d];
    for (int64_t lin = 0; lin < n; lin++) {
        for (int64_t d = nd - 1, rem = lin; d >= 0; d--) {
            idx[d] = rem % ix->t.sizes[d];
            rem /= ix->t.sizes[d];
        }
        int64_t j = hgeti(ix, lin), at = idx[dim], xl = 0, step = 1;
        CHECK(j >= 0 && j < x->t.sizes[dim]);
        idx[dim] = j;
        for (int d = nd - 1; d >= 0; d--) {
            xl += idx[d] * step;
            step *= x->t.sizes[d];
        }
        double a = hget(x, xl), b = hget(v, lin);
        CHECK(a == b || (isnan(a) && isnan(b)));
        for (int64_t o = 1; o <= at; o++) CHECK(hgeti(ix, lin - o * dstep) != j); /* the row's earlier outputs */
    }
}

/* sort / topk against the reference: ties (small integers), NaN and
 * infinities among floats, every dim, both orders, odd layouts. topk's
 * values match the reference's (sorted: in order); its indices are checked
 * by topk_index_check. */
static void sort_case(tpu_op op, tpu_dtype dt, int nd, const int64_t *xs, int dim, int64_t k, bool desc, int layout,
                      bool sorted) {
    snprintf(case_desc, sizeof case_desc, "%s %s nd %d dim %d k %lld desc %d layout %d sorted %d", tpu_op_name(op),
             tpu_dtype_name(dt), nd, dim, (long long)k, desc, layout, sorted);
    int64_t os[TPU_MAX_DIMS];
    memcpy(os, xs, (size_t)nd * sizeof *os);
    os[dim] = k;
    hten x, v, vr, ix, ixr;
    hmk(&x, dt, nd, xs, layout);
    for (int64_t i = 0; i < hnumel(&x.t); i++) {
        int64_t r = irand(12);
        double val = (double)(r % 6) - 2; /* ties */
        if (tpu_dtype_is_float(dt) && r == 11) val = NAN;
        if (tpu_dtype_is_float(dt) && r == 10) val = -INFINITY;
        if (dt == TPU_BOOL) val = r % 2;
        if (dt == TPU_U8 && val < 0) val = -val;
        hset(&x, i, val);
    }
    hmk(&v, dt, nd, os, layout ^ L_PERM);
    hmk(&ix, TPU_I64, nd, os, L_PAD);
    hclone(&vr, &v);
    hclone(&ixr, &ix);
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = dim;
    p.i[1] = desc;
    p.i[2] = sorted;
    tpu_tensor ops[3] = {v.t, ix.t, x.t};
    CHECK(run(false, op, ops, 3, &p, NULL) == TPU_OK);
    ops[0] = vr.t;
    ops[1] = ixr.t;
    CHECK(run(true, op, ops, 3, &p, NULL) == TPU_OK);
    if (op == TPU_OP_SORT || sorted) hcmp(tpu_op_name(op), &v, &vr, 0, 0);
    if (op == TPU_OP_SORT)
        hcmp("indices", &ix, &ixr, 0, 0);
    else
        topk_index_check(&x, &v, &ix, nd, dim);
    hten *all[] = {&x, &v, &vr, &ix, &ixr};
    for (size_t q = 0; q < 5; q++) hfree(all[q]);
}

static void test_sort(void) {
    static const tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F16, TPU_F64, TPU_I64, TPU_I32, TPU_I8, TPU_U8, TPU_BOOL};
    int64_t shapes[3][3] = {{5, 37, 3}, {1, 1, 1}, {2, 3, 300}};
    for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
        for (int sh = 0; sh < 3; sh++)
            for (int dim = 0; dim < 3; dim++)
                for (int desc = 0; desc < 2; desc++) {
                    int64_t n = shapes[sh][dim];
                    sort_case(TPU_OP_SORT, dts[d], 3, shapes[sh], dim, n, desc, (int)((d + sh) % 4), true);
                    if (dts[d] != TPU_BOOL) {
                        /* k = 3 of 300 takes the heap path, k = 3 of 37 and k = n the quickselect */
                        for (int srt = 0; srt < 2; srt++) {
                            sort_case(TPU_OP_TOPK, dts[d], 3, shapes[sh], dim, n > 3 ? 3 : n, desc, (int)(d % 4), srt);
                            sort_case(TPU_OP_TOPK, dts[d], 3, shapes[sh], dim, n, desc, (int)((d + 1) % 4), srt);
                        }
                        sort_case(TPU_OP_TOPK, dts[d], 3, shapes[sh], dim, 0, desc, 0, true);
                    }
                }
    /* hand values: [3, NaN, 1, 3, -inf] ascending -> [-inf, 1, 3, 3, NaN], indices [4, 2, 0, 3, 1] (stable) */
    snprintf(case_desc, sizeof case_desc, "sort hand values");
    double xv[5] = {3, NAN, 1, 3, -INFINITY};
    hten x, v, ix;
    hmk1(&x, TPU_F32, 5, L_CONTIG);
    hmk1(&v, TPU_F32, 5, L_CONTIG);
    hmk1(&ix, TPU_I64, 5, L_CONTIG);
    for (int i = 0; i < 5; i++) hset(&x, i, xv[i]);
    tpu_params p;
    memset(&p, 0, sizeof p);
    tpu_tensor ops[3] = {v.t, ix.t, x.t};
    CHECK(run(false, TPU_OP_SORT, ops, 3, &p, NULL) == TPU_OK);
    int64_t want[5] = {4, 2, 0, 3, 1};
    for (int i = 0; i < 5; i++) CHECK(tpu_load_i64(hptr(&ix.t, i), TPU_I64) == want[i]);
    CHECK(isnan(hget(&v, 4)) && hget(&v, 0) == -INFINITY && hget(&v, 2) == 3);
    p.i[1] = 1; /* descending: NaN first, ties in order */
    CHECK(run(false, TPU_OP_SORT, ops, 3, &p, NULL) == TPU_OK);
    int64_t wantd[5] = {1, 0, 3, 2, 4};
    for (int i = 0; i < 5; i++) CHECK(tpu_load_i64(hptr(&ix.t, i), TPU_I64) == wantd[i]);
    hfree(&x);
    hfree(&v);
    hfree(&ix);
}

/* ================= FFT ================= */

/* The real view of a complex host tensor (view_as_real): float32 / float64
 * with a last dim of 2; other dtypes as they are. Shares h's memory. */
static hten hreal(const hten *h) {
    hten r = *h;
    if (!tpu_dtype_is_complex((tpu_dtype)h->t.dtype)) return r;
    tpu_tensor *t = &r.t;
    t->dtype = h->t.dtype == TPU_C64 ? TPU_F32 : TPU_F64;
    for (int d = 0; d < t->ndim; d++) t->strides[d] *= 2;
    t->sizes[t->ndim] = 2;
    t->strides[t->ndim] = 1;
    t->ndim++;
    t->offset *= 2;
    return r;
}

/* One launch of op, fast against the reference: in of sizes xs (n along
 * dim; c2r: bins along dim), out with on points along dim. */
static void fft_case(tpu_op op, tpu_dtype cdt, int nd, const int64_t *xs, int dim, int64_t on, int inverse,
                     int layout) {
    tpu_dtype rdt = cdt == TPU_C64 ? TPU_F32 : TPU_F64;
    tpu_dtype idt = op == TPU_OP_FFT_R2C ? rdt : cdt, odt = op == TPU_OP_FFT_C2R ? rdt : cdt;
    int64_t n = op == TPU_OP_FFT_C2R ? on : xs[dim];
    snprintf(case_desc, sizeof case_desc, "%s %s nd %d dim %d n %lld out %lld inverse %d layout %d", tpu_op_name(op),
             tpu_dtype_name(cdt), nd, dim, (long long)n, (long long)on, inverse, layout);
    int64_t os[TPU_MAX_DIMS];
    memcpy(os, xs, (size_t)nd * sizeof *os);
    os[dim] = on;
    hten x, o, orf;
    hmk(&x, idt, nd, xs, layout);
    hten xr = hreal(&x);
    hfill(&xr, -1, 1);
    hmk(&o, odt, nd, os, layout ^ L_PERM);
    hclone(&orf, &o);
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = dim;
    p.i[1] = inverse;
    p.f[0] = n > 0 ? 1.0 / sqrt((double)n) : 1.0;
    tpu_tensor ops[2] = {o.t, x.t};
    CHECK(run(false, op, ops, 2, &p, NULL) == TPU_OK);
    ops[0] = orf.t;
    CHECK(run(true, op, ops, 2, &p, NULL) == TPU_OK);
    hten of = hreal(&o), orr = hreal(&orf);
    hcmp(tpu_op_name(op), &of, &orr, 0, cdt == TPU_C64 ? 2e-6 : 1e-13);
    hfree(&x);
    hfree(&o);
    hfree(&orf);
}

static void test_fft(void) {
    /* radix 4, 2, 3, 5, general primes up to 61, Bluestein above (67, 97, 127, 1009) */
    static const int64_t lens[] = {1,  2,  3,  4,  5,  6,  7,   8,   9,   12,  16,  17,  25,  30,
                                   49, 60, 61, 64, 67, 97, 100, 127, 128, 134, 210, 243, 256, 1009};
    static const tpu_dtype cdts[] = {TPU_C64, TPU_C128};
    for (size_t c = 0; c < 2; c++)
        for (size_t k = 0; k < sizeof lens / sizeof *lens; k++) {
            int64_t n = lens[k];
            int64_t sh[3] = {2, n, 3};
            if (n > 1000) sh[0] = sh[2] = 1;
            int lay = (int)((c + k) % 4);
            fft_case(TPU_OP_FFT_C2C, cdts[c], 3, sh, 1, n, (int)(k % 2), lay);
            fft_case(TPU_OP_FFT_R2C, cdts[c], 3, sh, 1, n / 2 + 1, 0, lay);
            if (k % 3 == 0) fft_case(TPU_OP_FFT_R2C, cdts[c], 3, sh, 1, n, 0, lay ^ 1); /* two-sided */
            int64_t bins[3] = {2, n / 2 + 1 + (int64_t)(k % 2), 3};                     /* c2r may get extra bins */
            if (n > 1000) bins[0] = bins[2] = 1;
            fft_case(TPU_OP_FFT_C2R, cdts[c], 3, bins, 1, n, 1, lay);
            int64_t one[2] = {1, n}; /* a single line: one at a time (the others: FFT_B lines at once) */
            fft_case(TPU_OP_FFT_C2C, cdts[c], 2, one, 1, n, (int)(k % 2), lay);
            fft_case(TPU_OP_FFT_R2C, cdts[c], 2, one, 1, n / 2 + 1, 0, lay);
        }
    int64_t many[2] = {37, 24}; /* five groups of lines, the last partial */
    fft_case(TPU_OP_FFT_C2C, TPU_C64, 2, many, 1, 24, 0, L_PAD);
    fft_case(TPU_OP_FFT_C2R, TPU_C128, 2, many, 1, 46, 1, L_PERM);
    int64_t sh2[2] = {12, 5}; /* along dim 0 and along the last dim */
    fft_case(TPU_OP_FFT_C2C, TPU_C64, 2, sh2, 0, 12, 0, L_PAD);
    fft_case(TPU_OP_FFT_C2C, TPU_C128, 2, sh2, 1, 5, 1, L_PERM);
    int64_t empty[2] = {0, 8};
    fft_case(TPU_OP_FFT_C2C, TPU_C64, 2, empty, 1, 8, 0, L_CONTIG);

    /* hand values: fft [1, 2, 3, 4] = [10, -2+2i, -2, -2-2i]; ifft of that (scale 1/4) gives them back */
    snprintf(case_desc, sizeof case_desc, "fft hand values");
    hten x, y, z;
    hmk1(&x, TPU_C128, 4, L_CONTIG);
    hmk1(&y, TPU_C128, 4, L_CONTIG);
    hmk1(&z, TPU_F64, 4, L_CONTIG);
    double *xv = (double *)x.t.base, *yv = (double *)y.t.base;
    for (int i = 0; i < 4; i++) xv[2 * i] = i + 1, xv[2 * i + 1] = 0;
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.f[0] = 1;
    tpu_tensor ops[2] = {y.t, x.t};
    CHECK(run(false, TPU_OP_FFT_C2C, ops, 2, &p, NULL) == TPU_OK);
    double want[8] = {10, 0, -2, 2, -2, 0, -2, -2};
    for (int i = 0; i < 8; i++) CHECK_MSG(fabs(yv[i] - want[i]) < 1e-12, "fft [1,2,3,4] part %d: %g", i, yv[i]);
    p.i[1] = 1;
    p.f[0] = 0.25;
    ops[0] = x.t;
    ops[1] = y.t;
    CHECK(run(false, TPU_OP_FFT_C2C, ops, 2, &p, NULL) == TPU_OK);
    for (int i = 0; i < 4; i++) CHECK(fabs(xv[2 * i] - (i + 1)) < 1e-12 && fabs(xv[2 * i + 1]) < 1e-12);
    /* c2r of the onesided spectrum [10, -2+2i, -2] (n = 4, scale 1/4): [1, 2, 3, 4] */
    y.t.sizes[0] = 3;
    ops[0] = z.t;
    ops[1] = y.t;
    CHECK(run(false, TPU_OP_FFT_C2R, ops, 2, &p, NULL) == TPU_OK);
    for (int i = 0; i < 4; i++) CHECK(fabs(hget(&z, i) - (i + 1)) < 1e-12);
    /* operand errors: mismatched dtypes, too few bins, a bad dim */
    char err[256];
    ops[0] = x.t; /* c2r into complex */
    CHECK(run(false, TPU_OP_FFT_C2R, ops, 2, &p, err) == TPU_ERROR_KERNEL && strstr(err, "dtype"));
    y.t.sizes[0] = 2;
    ops[0] = z.t;
    ops[1] = y.t;
    CHECK(run(false, TPU_OP_FFT_C2R, ops, 2, &p, err) == TPU_ERROR_KERNEL && strstr(err, "points"));
    p.i[0] = 1;
    CHECK(run(true, TPU_OP_FFT_C2R, ops, 2, &p, err) == TPU_ERROR_KERNEL && strstr(err, "dim"));
    hfree(&x);
    hfree(&y);
    hfree(&z);
}

/* ================= AdamW ================= */

static void adamw_params(tpu_params *p, double lr, double wd, int64_t step) {
    memset(p, 0, sizeof *p);
    p->f[0] = lr;
    p->f[1] = 0.9;
    p->f[2] = 0.999;
    p->f[3] = 1e-8;
    p->f[4] = wd;
    p->i[0] = step;
}

/* The fused optimizers' forms: step from a tensor, maximize, Adam's L2
 * decay, a found_inf that skips the step; fast against the reference. */
static void adam_variant_case(tpu_dtype dt, int maximize, int l2, double found) {
    snprintf(case_desc, sizeof case_desc, "adam %s maximize %d l2 %d found_inf %g", tpu_dtype_name(dt), maximize, l2,
             found);
    int64_t sz[2] = {7, 45};
    hten pf, mf, vf, g, pr, mr, vr, st, fi;
    hmk(&pf, dt, 2, sz, L_PAD);
    hfill(&pf, -1, 1);
    hmk(&mf, dt, 2, sz, L_CONTIG);
    hfill(&mf, -0.1, 0.1);
    hmk(&vf, dt, 2, sz, L_CONTIG);
    hfill(&vf, 0, 0.01);
    hmk(&g, dt, 2, sz, L_PERM);
    hfill(&g, -1, 1);
    hclone(&pr, &pf);
    hclone(&mr, &mf);
    hclone(&vr, &vf);
    hmk(&st, TPU_F32, 0, NULL, L_CONTIG);
    hset(&st, 0, 3); /* the step count, from the tensor (the parameter says 1) */
    hmk(&fi, TPU_F32, 0, NULL, L_CONTIG);
    hset(&fi, 0, found);
    tpu_params p;
    adamw_params(&p, 1e-2, 0.1, 1);
    p.i[2] = maximize;
    p.i[3] = l2;
    tpu_tensor ops[6] = {pf.t, mf.t, vf.t, g.t, st.t, fi.t};
    CHECK(run(false, TPU_OP_ADAMW_STEP, ops, 6, &p, NULL) == TPU_OK);
    tpu_tensor rops[6] = {pr.t, mr.t, vr.t, g.t, st.t, fi.t};
    CHECK(run(true, TPU_OP_ADAMW_STEP, rops, 6, &p, NULL) == TPU_OK);
    double e = tol(dt);
    hcmp("adam param", &pf, &pr, e, e * 1e-3);
    hcmp("adam exp_avg", &mf, &mr, e, e * 1e-3);
    hcmp("adam exp_avg_sq", &vf, &vr, e, e * 1e-5);
    if (found != 0) CHECK(memcmp(pf.mem, pr.mem, pf.bytes + 2 * GUARD) == 0); /* both untouched */
    hten *all[] = {&pf, &mf, &vf, &g, &pr, &mr, &vr, &st, &fi};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
}

static void test_adam_variants(void) {
    static const tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F64};
    for (size_t d = 0; d < 3; d++)
        for (int mx = 0; mx < 2; mx++)
            for (int l2 = 0; l2 < 2; l2++) adam_variant_case(dts[d], mx, l2, 0);
    adam_variant_case(TPU_F32, 0, 0, 1);
    /* a skipped step leaves param, exp_avg and exp_avg_sq as they were */
    snprintf(case_desc, sizeof case_desc, "adam found_inf skips");
    int64_t n = 33;
    hten pf, p0, mf, vf, g, st, fi;
    hmk(&pf, TPU_F32, 1, &n, L_CONTIG);
    hfill(&pf, -1, 1);
    hclone(&p0, &pf);
    hmk(&mf, TPU_F32, 1, &n, L_CONTIG);
    hfill(&mf, 0, 0);
    hmk(&vf, TPU_F32, 1, &n, L_CONTIG);
    hfill(&vf, 0, 0);
    hmk(&g, TPU_F32, 1, &n, L_CONTIG);
    hfill(&g, -1, 1);
    hmk(&st, TPU_F32, 0, NULL, L_CONTIG);
    hset(&st, 0, 1);
    hmk(&fi, TPU_F32, 0, NULL, L_CONTIG);
    hset(&fi, 0, 1);
    tpu_params p;
    adamw_params(&p, 1e-2, 0.1, 1);
    for (int ref = 0; ref < 2; ref++) {
        tpu_tensor ops[6] = {pf.t, mf.t, vf.t, g.t, st.t, fi.t};
        CHECK(run(ref, TPU_OP_ADAMW_STEP, ops, 6, &p, NULL) == TPU_OK);
        CHECK(memcmp(pf.mem, p0.mem, pf.bytes + 2 * GUARD) == 0);
    }
    hten *all[] = {&pf, &p0, &mf, &vf, &g, &st, &fi};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
}

static void adamw_case(tpu_dtype dt, int ndim, const int64_t *sizes, int layout, double wd, int steps) {
    snprintf(case_desc, sizeof case_desc, "adamw %s ndim %d layout %d wd %g steps %d", tpu_dtype_name(dt), ndim, layout,
             wd, steps);
    hten pf, mf, vf, pr, mr, vr, g;
    hmk(&pf, dt, ndim, sizes, layout);
    hfill(&pf, -1, 1);
    hmk(&mf, dt, ndim, sizes, layout ^ L_PAD);
    hfill(&mf, 0, 0);
    hmk(&vf, dt, ndim, sizes, layout);
    hfill(&vf, 0, 0);
    hmk(&g, dt, ndim, sizes, layout ^ L_PERM);
    hclone(&pr, &pf);
    hclone(&mr, &mf);
    hclone(&vr, &vf);
    /* the PyTorch f32 sequence, op for op, on contiguous copies */
    int64_t n = hnumel(&pf.t);
    float *ep = malloc((size_t)(n + 1) * sizeof *ep), *em = calloc((size_t)n + 1, sizeof *em);
    float *ev = calloc((size_t)n + 1, sizeof *ev);
    for (int64_t i = 0; i < n; i++) ep[i] = (float)hget(&pf, i);
    for (int s = 1; s <= steps; s++) {
        hfill(&g, -1, 1);
        tpu_params p;
        adamw_params(&p, 1e-2, wd, s);
        tpu_tensor ops[4] = {pf.t, mf.t, vf.t, g.t};
        run(false, TPU_OP_ADAMW_STEP, ops, 4, &p, NULL);
        tpu_tensor rops[4] = {pr.t, mr.t, vr.t, g.t};
        run(true, TPU_OP_ADAMW_STEP, rops, 4, &p, NULL);
        double bc1 = 1 - pow(0.9, s), bc2 = 1 - pow(0.999, s);
        float decay = (float)(1 - 1e-2 * wd), w = (float)(1 - 0.9), b2 = 0.999f, omb2 = (float)(1 - 0.999);
        float bc2s = (float)sqrt(bc2), eps = 1e-8f, nstep = (float)(-(1e-2 / bc1));
        for (int64_t i = 0; i < n; i++) {
            float gv = (float)hget(&g, i);
            ep[i] = ep[i] * decay;
            em[i] = em[i] + w * (gv - em[i]);
            ev[i] = ev[i] * b2;
            ev[i] = ev[i] + omb2 * gv * gv;
            float den = sqrtf(ev[i]) / bc2s + eps;
            ep[i] = ep[i] + nstep * em[i] / den;
        }
    }
    double e = tol(dt);
    hcmp("adamw param", &pf, &pr, e, e * 1e-3);
    hcmp("adamw exp_avg", &mf, &mr, e, e * 1e-3);
    /* (float16 holds nothing finer than its subnormal step 2^-24 ~ 6e-8 there: one step apart is equal) */
    hcmp("adamw exp_avg_sq", &vf, &vr, e, dt == TPU_F16 ? 0x1p-24 : e * 1e-5);
    if (dt == TPU_F32) {
        for (int64_t i = 0; i < n; i++) {
            CHECK_MSG(fabs(hget(&pf, i) - ep[i]) <= 2e-7 * fabs(ep[i]), "[%s] param %lld: %.9g vs formula %.9g",
                      case_desc, (long long)i, hget(&pf, i), (double)ep[i]);
            CHECK_MSG(fabs(hget(&vf, i) - ev[i]) <= 2e-7 * fabs(ev[i]), "[%s] exp_avg_sq %lld", case_desc,
                      (long long)i);
            if (test_cur_failed) break;
        }
    }
    free(ep);
    free(em);
    free(ev);
    hten *all[] = {&pf, &mf, &vf, &pr, &mr, &vr, &g};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) hfree(all[i]);
}

static void test_adamw(void) {
    int64_t s1[1] = {1031}, s2[2] = {5, 7}, s0[1] = {0};
    for (int di = 0; di < NFLOAT; di++)
        for (int wdi = 0; wdi < 2; wdi++) {
            double wd = wdi ? 0.01 : 0;
            adamw_case(float_dtypes[di], 1, s1, L_CONTIG, wd, 5);
            adamw_case(float_dtypes[di], 2, s2, L_PERM, wd, 3);
            adamw_case(float_dtypes[di], 2, s2, L_PAD, wd, 1);
            adamw_case(float_dtypes[di], 1, s0, L_CONTIG, wd, 1);
        }
}

static void test_adamw_hand(void) {
    /* Adam's first step moves each parameter by lr against the gradient's sign. */
    snprintf(case_desc, sizeof case_desc, "adamw hand values");
    hten p, m, v, g;
    int64_t n = 2;
    hmk(&p, TPU_F32, 1, &n, L_CONTIG);
    hmk(&m, TPU_F32, 1, &n, L_CONTIG);
    hmk(&v, TPU_F32, 1, &n, L_CONTIG);
    hmk(&g, TPU_F32, 1, &n, L_CONTIG);
    hset(&p, 0, 1);
    hset(&p, 1, 1);
    hset(&m, 0, 0);
    hset(&m, 1, 0);
    hset(&v, 0, 0);
    hset(&v, 1, 0);
    hset(&g, 0, 0.5);
    hset(&g, 1, -3);
    tpu_params prm;
    adamw_params(&prm, 0.1, 0.5, 1); /* decay: p *= 1 - 0.05 */
    tpu_tensor ops[4] = {p.t, m.t, v.t, g.t};
    run(false, TPU_OP_ADAMW_STEP, ops, 4, &prm, NULL);
    CHECK(fabs(hget(&p, 0) - (0.95 - 0.1)) < 1e-6 && fabs(hget(&p, 1) - (0.95 + 0.1)) < 1e-6);
    CHECK(fabs(hget(&m, 0) - 0.05) < 1e-7 && fabs(hget(&v, 1) - 0.009) < 1e-8);
    prm.i[1] = 1; /* amsgrad */
    char err[256];
    CHECK(run(false, TPU_OP_ADAMW_STEP, ops, 4, &prm, err) == TPU_ERROR_NOT_SUPPORTED);
    hfree(&p);
    hfree(&m);
    hfree(&v);
    hfree(&g);
}

/* ================= matmul ================= */

/* C operand of a matmul case: none, a full tensor, one row broadcast over
 * batch and rows (strides 0), or a host scalar. */
enum { C_NONE, C_FULL, C_ROW, C_SCALAR };

/* out = alpha * A @ B (+ beta * C) on (nb, M, K) x (nb, K, N); la, lb, lo:
 * layouts of A, B and out (and of a full C); L_PERM stores the dims reversed,
 * so A and B are transposed (and batch is the innermost dim). */
static void gemm_case(tpu_dtype dt, int prec, int64_t nb, int64_t M, int64_t N, int64_t K, int la, int lb, int lo,
                      int cmode) {
    snprintf(case_desc, sizeof case_desc,
             "matmul %s prec %d %lldx(%lldx%lld @ %lldx%lld) layouts A %d B %d out %d C %d", tpu_dtype_name(dt), prec,
             (long long)nb, (long long)M, (long long)K, (long long)K, (long long)N, la, lb, lo, cmode);
    hten A, B, C, of, orf;
    int64_t sa[3] = {nb, M, K}, sb[3] = {nb, K, N}, so[3] = {nb, M, N}, srow[3] = {1, 1, N};
    hmk(&A, dt, 3, sa, la);
    hmk(&B, dt, 3, sb, lb);
    hmk(&of, dt, 3, so, lo);
    hfill(&A, -1, 1);
    hfill(&B, -1, 1);
    hclone(&orf, &of);
    tpu_tensor ops[4] = {of.t, A.t, B.t};
    memset(&C, 0, sizeof C);
    if (cmode == C_FULL || cmode == C_ROW) {
        hmk(&C, dt, 3, cmode == C_FULL ? so : srow, cmode == C_FULL ? lo : L_CONTIG);
        hfill(&C, -1, 1);
        ops[3] = C.t;
        if (cmode == C_ROW) {
            ops[3].sizes[0] = nb, ops[3].sizes[1] = M;
            ops[3].strides[0] = ops[3].strides[1] = 0;
        }
    } else if (cmode == C_SCALAR) {
        ops[3] = tpu_tensor_scalar_f(0.375, dt);
    }
    int n = cmode == C_NONE ? 3 : 4;
    tpu_params p = TPU_PARAMS(MATMUL, .alpha = 0.75, .beta = cmode == C_NONE ? 0.0 : -1.5, .precision = prec);
    if (run(false, TPU_OP_MATMUL, ops, n, &p, NULL) == TPU_OK) {
        ops[0] = orf.t;
        if (run(true, TPU_OP_MATMUL, ops, n, &p, NULL) == TPU_OK) hcmp("out", &of, &orf, tol(dt), tol(dt));
    }
    hfree(&A);
    hfree(&B);
    hfree(&C);
    hfree(&of);
    hfree(&orf);
}

/* Shapes around the units' tiles (AVX2 6x16, AVX-512 / portable 8x32, k
 * blocks of 256, pairs of k for bf16), the task split, and both layouts of B
 * in the small-M path and the packing (contiguous rows; contiguous columns:
 * L_PERM with one batch, packed as a transpose, 16 x 16 words at a time on
 * AVX-512, with odd K's half pairs and partial panels). */
static void test_matmul_vs_ref(void) {
    /* M, N, K; from {1, 70, 300} on, the small-M path (M <= 8): k and column
     * tails, k split into ranges, chunks of columns; then several k blocks
     * and column groups (256) at once; then several row blocks of the AMX
     * unit (128 rows, 32-row slivers, k in steps of 32) with every tail */
    static const int64_t shapes[][3] = {
        {1, 1, 1},      {7, 1, 13},     {1, 19, 5},     {13, 17, 1},    {6, 16, 256},   {8, 32, 257},
        {37, 41, 53},   {5, 7, 0},      {0, 7, 3},      {4, 0, 3},      {67, 100, 301}, {97, 35, 513},
        {71, 531, 9},   {131, 20, 600}, {1, 70, 300},   {3, 131, 77},   {8, 2100, 9},   {2, 9, 700},
        {1, 16500, 21}, {5, 61, 1030},  {40, 300, 520}, {290, 97, 545}, {33, 65, 31},   {257, 600, 40},
    };
    const int ns = (int)(sizeof shapes / sizeof shapes[0]);
    for (int di = 0; di < NFLOAT; di++)
        for (int si = 0; si < ns; si++) {
            const int64_t *s = shapes[si];
            int64_t nb = si % 3 == 1 ? 3 : 1;
            gemm_case(float_dtypes[di], 0, nb, s[0], s[1], s[2], L_CONTIG, L_CONTIG, L_CONTIG, si % 4);
            gemm_case(float_dtypes[di], 0, nb, s[0], s[1], s[2], si & 1 ? L_PERM : L_PAD, L_PERM_PAD - (si & 1),
                      si % 3 == 2 ? L_PERM : L_PAD, (si + 1) % 4);
            /* B's columns contiguous (x @ W.T): packed as a transpose of W's rows */
            gemm_case(float_dtypes[di], 0, 1, s[0], s[1], s[2], L_CONTIG, L_PERM, L_CONTIG, (si + 2) % 4);
        }
    /* fp32 at "high" (three bf16 passes) and "medium" (one). */
    for (int prec = 1; prec <= 2; prec++)
        for (int si = 0; si < ns; si += 2) {
            const int64_t *s = shapes[si];
            gemm_case(TPU_F32, prec, 2, s[0], s[1], s[2], L_CONTIG, L_PERM, L_CONTIG, C_FULL);
            gemm_case(TPU_F32, prec, 1, s[0], s[1], s[2], L_PAD, L_CONTIG, L_PAD, C_ROW);
        }
}

/* A product with a known answer: ones(M, K) @ (k+1 in column j) = K(K+1)/2,
 * exact in every dtype's accumulator at these sizes. */
static void test_matmul_hand(void) {
    for (int di = 0; di < NFLOAT; di++) {
        tpu_dtype dt = float_dtypes[di];
        int64_t M = 9, N = 35, K = 31;
        snprintf(case_desc, sizeof case_desc, "matmul hand %s", tpu_dtype_name(dt));
        hten A, B, o;
        hmk(&A, dt, 3, (int64_t[]){1, M, K}, L_CONTIG);
        hmk(&B, dt, 3, (int64_t[]){1, K, N}, L_PERM);
        hmk(&o, dt, 3, (int64_t[]){1, M, N}, L_PAD);
        for (int64_t i = 0; i < M * K; i++) hset(&A, i, 1.0);
        for (int64_t i = 0; i < K * N; i++) hset(&B, i, (double)(i / N + 1));
        tpu_tensor ops[3] = {o.t, A.t, B.t};
        tpu_params p = TPU_PARAMS(MATMUL, .alpha = 2.0, .beta = 0.0, .precision = dt == TPU_F32 ? 2 : 0);
        if (run(false, TPU_OP_MATMUL, ops, 3, &p, NULL) == TPU_OK) {
            for (int64_t i = 0; i < M * N; i++)
                if (hget(&o, i) != (double)(K * (K + 1))) {
                    CHECK_MSG(0, "[%s] element %lld: %g, expected %lld", case_desc, (long long)i, hget(&o, i),
                              (long long)(K * (K + 1)));
                    break;
                }
            CHECK_MSG(hguards_ok(&o), "[%s]: wrote outside the view", case_desc);
        }
        hfree(&A);
        hfree(&B);
        hfree(&o);
    }
}

static void test_conv2d_vs_ref(void);

/* The unit this host should run, then every matmul and conv2d test again on
 * each unit below it: AVX512-BF16 (TPU_MXU=no-amx) where AMX was picked,
 * then the portable C unit (TPU_MXU=portable); then back. A host without
 * AMX says so: the AMX unit is skipped there. */
static void test_matmul_units(void) {
    unsigned f = tpu_cpu_features();
    int choice = tpu_config_get(NULL)->mxu_choice;
    bool portable = choice == TPU_MXU_CHOICE_PORTABLE,
         amx = !portable && choice != TPU_MXU_CHOICE_NO_AMX && tpu_amx_usable();
    const char *want32 = portable                                    ? "portable"
                         : (f & TPU_CPU_AVX512BF16)                  ? "AVX512"
                         : ((f & TPU_CPU_AVX2) && (f & TPU_CPU_FMA)) ? "AVX2-FMA"
                                                                     : "portable";
    const char *want16 = amx ? "AMX" : strcmp(want32, "AVX512") == 0 ? "AVX512-BF16" : want32;
    printf("  matrix unit: fp32 %s, bf16 %s\n", tpu_gemm_unit_name(false), tpu_gemm_unit_name(true));
    if (!tpu_amx_usable())
        printf("  AMX unit: SKIPPED (%s)\n", (f & TPU_CPU_AMX) ? "the OS did not grant this process the tile data"
                                                               : "this host has no AMX-BF16 tiles");
    CHECK_MSG(strcmp(tpu_gemm_unit_name(false), want32) == 0, "fp32 unit %s, expected %s", tpu_gemm_unit_name(false),
              want32);
    CHECK_MSG(strcmp(tpu_gemm_unit_name(true), want16) == 0, "bf16 unit %s, expected %s", tpu_gemm_unit_name(true),
              want16);
    if (amx) {
        tpu_pool_register(TPU_MXU_CHOICE_NO_AMX);
        CHECK(strcmp(tpu_gemm_unit_name(true), "AVX512-BF16") == 0 && strcmp(tpu_gemm_unit_name(false), want32) == 0);
        printf("  again on the AVX512-BF16 unit (TPU_MXU=no-amx)\n");
        test_matmul_hand();
        test_matmul_vs_ref();
        test_conv2d_vs_ref();
    }
    tpu_pool_register(TPU_MXU_CHOICE_PORTABLE);
    CHECK(strcmp(tpu_gemm_unit_name(false), "portable") == 0 && strcmp(tpu_gemm_unit_name(true), "portable") == 0);
    test_matmul_hand();
    test_matmul_vs_ref();
    test_conv2d_vs_ref();
    tpu_pool_register(choice);
    CHECK(strcmp(tpu_gemm_unit_name(false), want32) == 0 && strcmp(tpu_gemm_unit_name(true), want16) == 0);
}

/* Sizes big enough to be split across the compute workers. */
static void test_parallel_sizes(void) {
    int64_t rows[2] = {67, 1031}, wide[2] = {3, 20011};
    for (int di = 0; di < NFLOAT; di++) {
        softmax_case(TPU_OP_SOFTMAX, float_dtypes[di], 2, rows, 1, L_CONTIG, L_CONTIG);
        softmax_case(TPU_OP_LOG_SOFTMAX_BWD, float_dtypes[di], 2, rows, 1, L_CONTIG, L_CONTIG);
        softmax_case(TPU_OP_LOG_SOFTMAX, float_dtypes[di], 2, rows, 0, L_CONTIG, L_CONTIG);
        softmax_case(TPU_OP_SOFTMAX, float_dtypes[di], 2, wide, 1, L_CONTIG, L_PAD);
        ln_case(float_dtypes[di], 2, rows, 1031, 67, L_CONTIG, L_CONTIG, true, true);
        ln_case(float_dtypes[di], 2, wide, 20011, 3, L_PERM, L_CONTIG, true, false);
    }
    int64_t big[2] = {13, 20011}, n1[1] = {40009};
    index_add_case(TPU_F32, TPU_I64, 2, big, 0, 29, 1.0, L_CONTIG, L_CONTIG);
    index_add_case(TPU_BF16, TPU_I64, 2, big, 1, 29, 1.0, L_CONTIG, L_PERM);
    select_case(TPU_F32, TPU_I64, 2, big, 0, 29, L_CONTIG, L_CONTIG);
    gather_scatter_case(true, TPU_F32, 2, big, big, 0, L_CONTIG, L_CONTIG);
    for (int di = 0; di < NFLOAT; di++) adamw_case(float_dtypes[di], 1, n1, L_CONTIG, 0.01, 2);
}

/* ================= convolution ================= */

typedef struct conv_spec {
    int64_t N, C, H, W, O;
    int kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t G;
    bool bias;
} conv_spec;

static tpu_params conv_params(const conv_spec *c, int prec) {
    return TPU_PARAMS(CONV2D, .kernel = c->kh | c->kw << 16, .stride = c->sh | c->sw << 16,
                      .padding = c->ph | c->pw << 16, .dilation = c->dh | c->dw << 16, .groups = c->G,
                      .precision = prec);
}

/* CONV2D fast vs reference; lx: the input's layout (any strides). */
static void conv_case(tpu_dtype dt, int prec, const conv_spec *c, int lx) {
    int64_t OH = (c->H + 2 * c->ph - c->dh * (c->kh - 1) - 1) / c->sh + 1;
    int64_t OW = (c->W + 2 * c->pw - c->dw * (c->kw - 1) - 1) / c->sw + 1;
    snprintf(case_desc, sizeof case_desc,
             "conv2d %s prec %d x %lldx%lldx%lldx%lld (layout %d) w %lld/%lld k %dx%d s %d,%d p %d,%d d %d,%d bias %d",
             tpu_dtype_name(dt), prec, (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W, lx,
             (long long)c->O, (long long)c->G, c->kh, c->kw, c->sh, c->sw, c->ph, c->pw, c->dh, c->dw, c->bias);
    hten x, w, b, of, orf;
    hmk(&x, dt, 4, (int64_t[]){c->N, c->C, c->H, c->W}, lx);
    hmk(&w, dt, 4, (int64_t[]){c->O, c->C / c->G, c->kh, c->kw}, L_CONTIG);
    hmk(&of, dt, 4, (int64_t[]){c->N, c->O, OH, OW}, L_CONTIG);
    hmk1(&b, dt, c->O, L_PAD);
    hfill(&x, -1, 1);
    hfill(&w, -1, 1);
    hfill(&b, -1, 1);
    hclone(&orf, &of);
    tpu_tensor ops[4] = {of.t, x.t, w.t, b.t};
    int n = c->bias ? 4 : 3;
    tpu_params p = conv_params(c, prec);
    if (run(false, TPU_OP_CONV2D, ops, n, &p, NULL) == TPU_OK) {
        ops[0] = orf.t;
        if (run(true, TPU_OP_CONV2D, ops, n, &p, NULL) == TPU_OK) hcmp("out", &of, &orf, tol(dt), tol(dt));
    }
    hfree(&x);
    hfree(&w);
    hfree(&b);
    hfree(&of);
    hfree(&orf);
}

/* Windows through padding, strides, dilation and groups (depthwise too),
 * kernels larger than the input, several k blocks (K > 256) and row blocks
 * (O > 64), rows of windows across panel and chunk boundaries. */
static void test_conv2d_vs_ref(void) {
    static const conv_spec specs[] = {
        {2, 3, 9, 11, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, true},    {1, 4, 8, 8, 6, 3, 3, 2, 2, 1, 1, 1, 1, 2, false},
        {2, 6, 7, 7, 6, 3, 3, 1, 1, 2, 2, 2, 2, 6, true},     {1, 3, 20, 17, 40, 5, 3, 2, 1, 2, 0, 1, 1, 1, true},
        {1, 8, 5, 5, 70, 1, 1, 1, 1, 0, 0, 1, 1, 1, false},   {1, 2, 40, 40, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1, true},
        {1, 30, 12, 12, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, true}, {2, 1, 3, 3, 2, 5, 5, 1, 1, 1, 1, 1, 1, 1, true},
        {1, 5, 1, 70, 7, 1, 3, 1, 3, 0, 1, 1, 2, 1, false},
    };
    static const tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F16};
    for (int si = 0; si < (int)(sizeof specs / sizeof specs[0]); si++)
        for (int di = 0; di < 3; di++)
            conv_case(dts[di], 0, &specs[si], si % 3 == 0 ? L_CONTIG : si % 3 == 1 ? L_PAD : L_PERM);
    for (int prec = 1; prec <= 2; prec++) conv_case(TPU_F32, prec, &specs[6], L_CONTIG);
}

/* float64 and mismatched weights fail with a message; nothing is written. */
static void test_conv2d_errors(void) {
    conv_spec c = {1, 4, 5, 5, 2, 3, 3, 1, 1, 0, 0, 1, 1, 1, false};
    tpu_params p = conv_params(&c, 0);
    hten x, w, o;
    char err[256];
    hmk(&x, TPU_F64, 4, (int64_t[]){1, 4, 5, 5}, L_CONTIG);
    hmk(&w, TPU_F64, 4, (int64_t[]){2, 4, 3, 3}, L_CONTIG);
    hmk(&o, TPU_F64, 4, (int64_t[]){1, 2, 3, 3}, L_CONTIG);
    tpu_tensor ops[3] = {o.t, x.t, w.t};
    CHECK(run(false, TPU_OP_CONV2D, ops, 3, &p, err) != TPU_OK && strstr(err, "float32"));
    hfree(&x);
    hfree(&w);
    hfree(&o);
    hmk(&x, TPU_F32, 4, (int64_t[]){1, 4, 5, 5}, L_CONTIG);
    hmk(&w, TPU_F32, 4, (int64_t[]){2, 3, 3, 3}, L_CONTIG);
    hmk(&o, TPU_F32, 4, (int64_t[]){1, 2, 3, 3}, L_CONTIG);
    tpu_tensor ops2[3] = {o.t, x.t, w.t};
    CHECK(run(false, TPU_OP_CONV2D, ops2, 3, &p, err) != TPU_OK && strstr(err, "weight"));
    CHECK(hguards_ok(&o));
    hfree(&x);
    hfree(&w);
    hfree(&o);
}

int main(void) {
    /* Bring the runtime up so kernels run on its compute pool, as under a launch. */
    if (tpu_init() != TPU_OK) return 1;
    RUN_TEST(test_softmax_hand);
    RUN_TEST(test_softmax_vs_ref);
    RUN_TEST(test_nll_hand);
    RUN_TEST(test_nll_vs_ref);
    RUN_TEST(test_nll_errors);
    RUN_TEST(test_cross_entropy);
    RUN_TEST(test_layer_norm_hand);
    RUN_TEST(test_layer_norm_vs_ref);
    RUN_TEST(test_index_hand);
    RUN_TEST(test_index_vs_ref);
    RUN_TEST(test_index_errors);
    RUN_TEST(test_index_adv);
    RUN_TEST(test_histogram);
    RUN_TEST(test_sort);
    RUN_TEST(test_fft);
    RUN_TEST(test_adam_variants);
    RUN_TEST(test_adamw_hand);
    RUN_TEST(test_adamw);
    RUN_TEST(test_parallel_sizes);
    RUN_TEST(test_matmul_hand);
    RUN_TEST(test_matmul_vs_ref);
    RUN_TEST(test_matmul_units);
    RUN_TEST(test_conv2d_vs_ref);
    RUN_TEST(test_conv2d_errors);
    printf("%ld output tensors compared against the reference\n", ncompared);
    return TEST_SUMMARY();
}
