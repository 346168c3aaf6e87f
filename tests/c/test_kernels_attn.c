/* test_kernels_attn.c - scaled dot-product attention (ATTN family).
 *
 * Each case builds q, k, v (and a mask) in plain host memory, runs the fast
 * kernel and the reference into separate outputs of the same layout and
 * compares them, for the forward and for the backward (fed the reference
 * forward's out and logsumexp); every output byte that is not an element of
 * the view must still hold the sentinel pattern. Cases cover every float
 * dtype, odd sizes around the 64-row / 64-key blocks, grouped-query heads,
 * causal masking with L < S and L > S, float and bool masks (with rows that
 * exclude every key), broadcast masks, dropout, transposed and padded
 * layouts, and each micro-kernel build the CPU has (AVX-512, plain C). The
 * reference's backward is checked against central differences of its
 * forward, and malformed launches must fail in both kernels. */
#include "kernels/kernels-impl.h"
#include "test.h"
#include "hten.h"
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

static char case_desc[256];
static long ncompared;

/* |fast - ref| <= tol * (|ref| + max|ref|); NaN and inf must match. */
static void hcmp(const char *what, const hten *f, const hten *r, double tol) {
    CHECK_MSG(hguards_ok(f), "%s [%s]: fast kernel wrote outside the view", what, case_desc);
    CHECK_MSG(hguards_ok(r), "%s [%s]: ref kernel wrote outside the view", what, case_desc);
    ncompared++;
    int64_t n = hnumel(&r->t);
    double maxabs = 1e-3;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(hget(r, i)) && fabs(hget(r, i)) > maxabs) maxabs = fabs(hget(r, i));
    for (int64_t i = 0; i < n; i++) {
        double a = hget(f, i), b = hget(r, i);
        bool ok = (isnan(a) || isnan(b))   ? isnan(a) && isnan(b)
                  : (isinf(a) || isinf(b)) ? a == b
                                           : fabs(a - b) <= tol * (fabs(b) + maxabs);
        if (!ok) {
            CHECK_MSG(ok, "%s [%s]: element %lld fast %.9g ref %.9g", what, case_desc, (long long)i, a, b);
            return;
        }
    }
}

static double tol(tpu_dtype dt) { return dt == TPU_F32 ? 2e-5 : dt == TPU_F16 ? 4e-3 : 2e-2; }

static tpu_status run(bool ref, const tpu_kargs *tmpl, const tpu_tensor *ops, int n, char *err) {
    tpu_kargs a = *tmpl;
    a.n = n;
    memcpy(a.t, ops, (size_t)n * sizeof *ops);
    tpu_status s = ref ? tpu_ref_run(&a) : tpu_kernel_run(&a);
    if (err)
        snprintf(err, 256, "%s", a.err);
    else
        CHECK_MSG(s == TPU_OK, "%s %s [%s]: %s: %s", ref ? "ref" : "fast", tpu_op_name(a.op), case_desc,
                  tpu_status_name(s), a.err);
    return s;
}

typedef struct acase {
    int64_t B, H, Hk, L, S, E, Ev;
    bool causal;
    int mask; /* 0 none, 1 float, 2 bool, 3 float broadcast over batch and heads */
    double dropout;
    int layout; /* hten layout bits for q, k, v */
} acase;

static void mk4(hten *h, tpu_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d, int layout) {
    const int64_t s[4] = {a, b, c, d};
    hmk(h, dt, 4, s, layout);
}

/* The mask: random values in [-2, 2], some -inf (false), and row 1 of every
 * head excluding every key; bool: true where the float form is finite. */
static void mask_fill(hten *m, bool boolean) {
    const tpu_tensor *t = &m->t;
    int64_t S = t->sizes[3], L = t->sizes[2];
    for (int64_t i = 0; i < hnumel(t); i++) {
        int64_t row = (i / S) % L;
        bool off = row == 1 || urand(0, 1) < 0.2;
        hset(m, i, boolean ? (off ? 0 : 1) : (off ? -INFINITY : urand(-2, 2)));
    }
}

static void attn_case(tpu_dtype dt, const acase *c) {
    snprintf(case_desc, sizeof case_desc,
             "%s B %lld H %lld/%lld L %lld S %lld E %lld Ev %lld causal %d mask %d dropout %g layout %d isa %d",
             tpu_dtype_name(dt), (long long)c->B, (long long)c->H, (long long)c->Hk, (long long)c->L, (long long)c->S,
             (long long)c->E, (long long)c->Ev, c->causal, c->mask, c->dropout, c->layout, tpu_attn_get_isa());
    hten q, k, v, m, go, out[2], rout[2], g[4], rg[4];
    memset(&m, 0, sizeof m);
    mk4(&q, dt, c->B, c->H, c->L, c->E, c->layout);
    mk4(&k, dt, c->B, c->Hk, c->S, c->E, (c->layout + 1) & 3);
    mk4(&v, dt, c->B, c->Hk, c->S, c->Ev, c->layout);
    hfill(&q, -1.5, 1.5);
    hfill(&k, -1.5, 1.5);
    hfill(&v, -2, 2);
    if (c->mask == 3) {
        mk4(&m, dt, 1, 1, c->L, c->S, L_CONTIG);
        mask_fill(&m, false);
        m.t.sizes[0] = c->B;
        m.t.sizes[1] = c->H;
        m.t.strides[0] = m.t.strides[1] = 0;
    } else if (c->mask) {
        mk4(&m, c->mask == 2 ? TPU_BOOL : dt, c->B, c->H, c->L, c->S, L_PAD);
        mask_fill(&m, c->mask == 2);
    }
    tpu_kargs tmpl;
    memset(&tmpl, 0, sizeof tmpl);
    tmpl.op = TPU_OP_ATTN;
    tmpl.p = TPU_PARAMS(ATTN, .scale = 1.0 / sqrt((double)c->E), .dropout = c->dropout, .causal = c->causal,
                        .seed = 1234, .offset = 7);
    mk4(&out[0], dt, c->B, c->H, c->L, c->Ev, c->layout);
    const int64_t ls[3] = {c->B, c->H, c->L};
    hmk(&out[1], TPU_F32, 3, ls, L_PAD);
    hclone(&rout[0], &out[0]);
    hclone(&rout[1], &out[1]);
    tpu_tensor ops[TPU_MAX_OPERANDS] = {out[0].t, out[1].t, q.t, k.t, v.t, m.t};
    int n = c->mask ? 6 : 5;
    run(false, &tmpl, ops, n, NULL);
    ops[0] = rout[0].t;
    ops[1] = rout[1].t;
    run(true, &tmpl, ops, n, NULL);
    hcmp("attention out", &out[0], &rout[0], tol(dt));
    hcmp("attention logsumexp", &out[1], &rout[1], tol(TPU_F32) * 4);

    /* Backward from the reference forward's results. */
    mk4(&go, dt, c->B, c->H, c->L, c->Ev, (c->layout + 2) & 3);
    hfill(&go, -1, 1);
    mk4(&g[0], dt, c->B, c->H, c->L, c->E, c->layout);
    mk4(&g[1], dt, c->B, c->Hk, c->S, c->E, L_CONTIG);
    mk4(&g[2], dt, c->B, c->Hk, c->S, c->Ev, L_PAD);
    bool gm = c->mask == 1;
    if (gm) mk4(&g[3], dt, c->B, c->H, c->L, c->S, L_PERM);
    for (int i = 0; i < 3 + gm; i++) hclone(&rg[i], &g[i]);
    tmpl.op = TPU_OP_ATTN_BWD;
    tpu_tensor b_ops[TPU_MAX_OPERANDS] = {g[0].t,    g[1].t,    g[2].t, tpu_tensor_scalar_f(0, dt), go.t, q.t, k.t, v.t,
                                          rout[0].t, rout[1].t, m.t};
    if (gm) b_ops[3] = g[3].t;
    n = c->mask ? 11 : 10;
    run(false, &tmpl, b_ops, n, NULL);
    for (int i = 0; i < 3 + gm; i++) b_ops[i] = rg[i].t;
    run(true, &tmpl, b_ops, n, NULL);
    const char *names[4] = {"grad_query", "grad_key", "grad_value", "grad_mask"};
    for (int i = 0; i < 3 + gm; i++) {
        char what[64];
        snprintf(what, sizeof what, "attention_backward %s", names[i]);
        hcmp(what, &g[i], &rg[i], tol(dt) * (dt == TPU_F32 ? 5 : 1));
        hfree(&g[i]);
        hfree(&rg[i]);
    }
    hfree(&go);
    for (int i = 0; i < 2; i++) {
        hfree(&out[i]);
        hfree(&rout[i]);
    }
    hfree(&q);
    hfree(&k);
    hfree(&v);
    if (c->mask) hfree(&m);
}

static const acase cases[] = {
    {1, 1, 1, 1, 1, 1, 1, false, 0, 0, L_CONTIG},     {2, 2, 2, 5, 7, 3, 5, false, 0, 0, L_PERM},
    {1, 4, 2, 70, 130, 16, 20, false, 0, 0, L_PAD},   {2, 2, 2, 65, 65, 64, 64, true, 0, 0, L_CONTIG},
    {1, 2, 1, 130, 20, 8, 8, true, 0, 0, L_PERM_PAD}, {1, 1, 1, 20, 130, 24, 40, true, 0, 0, L_CONTIG},
    {2, 2, 2, 33, 70, 16, 16, false, 1, 0, L_CONTIG}, {1, 2, 2, 66, 66, 32, 32, false, 2, 0, L_PAD},
    {2, 3, 3, 40, 90, 8, 72, false, 3, 0, L_PERM},    {2, 2, 2, 70, 70, 16, 16, false, 0, 0.25, L_CONTIG},
    {1, 2, 1, 65, 130, 16, 16, true, 0, 0.5, L_PAD},  {1, 1, 1, 64, 64, 128, 128, false, 1, 0.1, L_CONTIG},
    {1, 1, 1, 3, 0, 4, 4, false, 0, 0, L_CONTIG},     {1, 1, 1, 0, 5, 4, 4, false, 0, 0, L_CONTIG},
};

static void test_attention_vs_ref(void) {
    const tpu_dtype dts[3] = {TPU_F32, TPU_BF16, TPU_F16};
    int had = tpu_attn_get_isa();
    for (int isa = 1; isa >= 0; isa--) {
        tpu_attn_set_isa(isa);
        if (tpu_attn_get_isa() != isa) {
            printf("  attention: AVX-512 micro-kernel skipped (this CPU has no AVX-512F)\n");
            continue;
        }
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            for (int t = 0; t < 3; t++)
                if (t == 0 || cases[i].L * cases[i].S < 5000) attn_case(dts[t], &cases[i]);
    }
    tpu_attn_set_isa(had);
    printf("  attention: %ld comparisons\n", ncompared);
}

/* sum(out * w) through the reference forward, in float32. */
static double ref_loss(const acase *c, hten *q, hten *k, hten *v, const hten *w) {
    hten out, lse;
    mk4(&out, TPU_F32, c->B, c->H, c->L, c->Ev, L_CONTIG);
    const int64_t ls[3] = {c->B, c->H, c->L};
    hmk(&lse, TPU_F32, 3, ls, L_CONTIG);
    tpu_kargs a;
    memset(&a, 0, sizeof a);
    a.op = TPU_OP_ATTN;
    a.n = 5;
    a.p = TPU_PARAMS(ATTN, .scale = 0.7, .dropout = c->dropout, .causal = c->causal, .seed = 5, .offset = 1);
    a.t[0] = out.t;
    a.t[1] = lse.t;
    a.t[2] = q->t;
    a.t[3] = k->t;
    a.t[4] = v->t;
    CHECK_OK(tpu_ref_run(&a));
    double s = 0;
    for (int64_t i = 0; i < hnumel(&out.t); i++) s += hget(&out, i) * hget(w, i);
    hfree(&out);
    hfree(&lse);
    return s;
}

/* The reference backward against central differences of its forward. */
static void test_ref_backward_numeric(void) {
    const acase cs[2] = {{1, 2, 1, 5, 6, 3, 4, true, 0, 0, L_CONTIG}, {1, 1, 1, 4, 7, 3, 2, false, 0, 0.3, L_CONTIG}};
    for (int ci = 0; ci < 2; ci++) {
        const acase *c = &cs[ci];
        hten q, k, v, w, out, lse, g[3];
        mk4(&q, TPU_F32, c->B, c->H, c->L, c->E, L_CONTIG);
        mk4(&k, TPU_F32, c->B, c->Hk, c->S, c->E, L_CONTIG);
        mk4(&v, TPU_F32, c->B, c->Hk, c->S, c->Ev, L_CONTIG);
        mk4(&w, TPU_F32, c->B, c->H, c->L, c->Ev, L_CONTIG);
        mk4(&out, TPU_F32, c->B, c->H, c->L, c->Ev, L_CONTIG);
        const int64_t ls[3] = {c->B, c->H, c->L};
        hmk(&lse, TPU_F32, 3, ls, L_CONTIG);
        hfill(&q, -1, 1);
        hfill(&k, -1, 1);
        hfill(&v, -1, 1);
        hfill(&w, -1, 1);
        mk4(&g[0], TPU_F32, c->B, c->H, c->L, c->E, L_CONTIG);
        mk4(&g[1], TPU_F32, c->B, c->Hk, c->S, c->E, L_CONTIG);
        mk4(&g[2], TPU_F32, c->B, c->Hk, c->S, c->Ev, L_CONTIG);
        tpu_kargs a;
        memset(&a, 0, sizeof a);
        a.op = TPU_OP_ATTN;
        a.n = 5;
        a.p = TPU_PARAMS(ATTN, .scale = 0.7, .dropout = c->dropout, .causal = c->causal, .seed = 5, .offset = 1);
        tpu_tensor f[5] = {out.t, lse.t, q.t, k.t, v.t};
        memcpy(a.t, f, sizeof f);
        CHECK_OK(tpu_ref_run(&a));
        a.op = TPU_OP_ATTN_BWD;
        a.n = 10;
        tpu_tensor bo[10] = {g[0].t, g[1].t, g[2].t, tpu_tensor_scalar_f(0, TPU_F32), w.t, q.t, k.t, v.t, out.t, lse.t};
        memcpy(a.t, bo, sizeof bo);
        CHECK_OK(tpu_ref_run(&a));
        hten *in[3] = {&q, &k, &v};
        double worst = 0;
        for (int t = 0; t < 3; t++)
            for (int64_t i = 0; i < hnumel(&in[t]->t); i++) {
                double x0 = hget(in[t], i), hstep = 1e-2;
                hset(in[t], i, x0 + hstep);
                double lp = ref_loss(c, &q, &k, &v, &w);
                hset(in[t], i, x0 - hstep);
                double lm = ref_loss(c, &q, &k, &v, &w);
                hset(in[t], i, x0);
                double num = (lp - lm) / (2 * hstep), an = hget(&g[t], i);
                if (fabs(num - an) > worst) worst = fabs(num - an);
                CHECK_MSG(fabs(num - an) <= 2e-3 + 2e-3 * fabs(num),
                          "case %d input %d element %lld: analytic %.6g numeric %.6g", ci, t, (long long)i, an, num);
            }
        printf("  reference backward case %d: worst |analytic - numeric| %.2g\n", ci, worst);
        hfree(&q);
        hfree(&k);
        hfree(&v);
        hfree(&w);
        hfree(&out);
        hfree(&lse);
        for (int t = 0; t < 3; t++) hfree(&g[t]);
    }
}

/* Hand-computed: one query, two keys, scale 1: out = softmax(q.k) v. */
static void test_ref_known_values(void) {
    hten q, k, v, out, lse;
    mk4(&q, TPU_F32, 1, 1, 1, 1, L_CONTIG);
    mk4(&k, TPU_F32, 1, 1, 2, 1, L_CONTIG);
    mk4(&v, TPU_F32, 1, 1, 2, 1, L_CONTIG);
    mk4(&out, TPU_F32, 1, 1, 1, 1, L_CONTIG);
    const int64_t ls[3] = {1, 1, 1};
    hmk(&lse, TPU_F32, 3, ls, L_CONTIG);
    hset(&q, 0, 1);
    hset(&k, 0, 0);
    hset(&k, 1, log(3.0)); /* scores 0, ln 3: weights 1/4, 3/4 */
    hset(&v, 0, 4);
    hset(&v, 1, 8);
    for (int fast = 0; fast < 2; fast++) {
        tpu_kargs a;
        memset(&a, 0, sizeof a);
        a.op = TPU_OP_ATTN;
        a.n = 5;
        a.p = TPU_PARAMS(ATTN, .scale = 1.0);
        tpu_tensor f[5] = {out.t, lse.t, q.t, k.t, v.t};
        memcpy(a.t, f, sizeof f);
        CHECK_OK(fast ? tpu_kernel_run(&a) : tpu_ref_run(&a));
        CHECK_MSG(fabs(hget(&out, 0) - 7.0) < 1e-5, "%s: out %.9g, expected 7", fast ? "fast" : "ref", hget(&out, 0));
        CHECK_MSG(fabs(hget(&lse, 0) - log(4.0)) < 1e-5, "%s: lse %.9g, expected ln 4", fast ? "fast" : "ref",
                  hget(&lse, 0));
    }
    hfree(&q);
    hfree(&k);
    hfree(&v);
    hfree(&out);
    hfree(&lse);
}

static void test_bad_launches(void) {
    hten q, k, v, out, lse;
    mk4(&q, TPU_F32, 1, 2, 3, 4, L_CONTIG);
    mk4(&k, TPU_F32, 1, 2, 5, 3, L_CONTIG); /* E 3 != 4 */
    mk4(&v, TPU_F32, 1, 2, 5, 4, L_CONTIG);
    mk4(&out, TPU_F32, 1, 2, 3, 4, L_CONTIG);
    const int64_t ls[3] = {1, 2, 3};
    hmk(&lse, TPU_F32, 3, ls, L_CONTIG);
    tpu_kargs tmpl;
    memset(&tmpl, 0, sizeof tmpl);
    tmpl.op = TPU_OP_ATTN;
    tmpl.p = TPU_PARAMS(ATTN, .scale = 1.0);
    tpu_tensor ops[5] = {out.t, lse.t, q.t, k.t, v.t};
    char err[256];
    for (int ref = 0; ref < 2; ref++) {
        snprintf(case_desc, sizeof case_desc, "bad key shape (%s)", ref ? "ref" : "fast");
        CHECK(run(ref, &tmpl, ops, 5, err) != TPU_OK);
        CHECK_MSG(strstr(err, "key has shape [1, 2, 5, 3], expected [1, 2, 5, 4]"), "message: %s", err);
    }
    hfree(&k);
    mk4(&k, TPU_F32, 1, 2, 5, 4, L_CONTIG);
    ops[3] = k.t;
    tmpl.p = TPU_PARAMS(ATTN, .scale = 1.0, .dropout = 1.0);
    for (int ref = 0; ref < 2; ref++) {
        CHECK(run(ref, &tmpl, ops, 5, err) != TPU_OK);
        CHECK_MSG(strstr(err, "dropout probability must be in [0, 1)"), "message: %s", err);
    }
    hfree(&q);
    hfree(&k);
    hfree(&v);
    hfree(&out);
    hfree(&lse);
}

int main(void) {
    RUN_TEST(test_ref_known_values);
    RUN_TEST(test_ref_backward_numeric);
    RUN_TEST(test_attention_vs_ref);
    RUN_TEST(test_bad_launches);
    return TEST_SUMMARY();
}
