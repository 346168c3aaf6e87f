/* test_graph.c - Fused Eager through the public API: every fusible op and
 * float dtype gives, fused, the bits Strict Eager gives; chains with
 * broadcasts, host scalars, casts and in-place ops; views that must not
 * fuse; flush points; lazily bound memory (dead intermediates never
 * counted, is_materialized); memory pressure; kernel errors inside a window;
 * recomputation of far reads (and its fallback when scratch cannot be allocated). */
#define _GNU_SOURCE
#include "tpu/tpu.h"
#include "base/base-impl.h" /* tpu_op_infos: the op table */
#include "test.h"
#include <math.h>
#include <pthread.h>
#include <stdint.h>

static uint64_t rng_s = 0x9E3779B97F4A7C15ull;
static double urand(double lo, double hi) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return lo + (hi - lo) * (double)(rng_s >> 11) * 0x1.0p-53;
}

/* A device tensor with host contents of dtype dt (float values converted). */
static tpu_tensor dev_tensor(tpu_dtype dt, int nd, const int64_t *sz, const double *vals) {
    tpu_tensor t;
    tpu_tensor_contiguous(&t, NULL, dt, nd, sz);
    int64_t n = tpu_tensor_numel(&t);
    size_t es = tpu_dtype_size(dt);
    void *d = NULL;
    CHECK_OK(tpu_malloc(0, t.nbytes ? t.nbytes : 1, NULL, &d));
    t.base = d;
    if (vals) {
        unsigned char *h = malloc((size_t)n * es);
        for (int64_t i = 0; i < n; i++) {
            double v = vals[i];
            switch (dt) {
            case TPU_F32: ((float *)h)[i] = (float)v; break;
            case TPU_F64: ((double *)h)[i] = v; break;
            case TPU_F16: {
                _Float16 x = (_Float16)(float)v;
                memcpy(h + 2 * i, &x, 2);
                break;
            }
            case TPU_BF16: {
                float f = (float)v;
                uint32_t u;
                memcpy(&u, &f, 4);
                uint16_t b = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
                if (isnan(f)) b = (uint16_t)((u >> 16) | 0x40);
                memcpy(h + 2 * i, &b, 2);
                break;
            }
            case TPU_BOOL: h[i] = v != 0; break;
            default: ((int64_t *)h)[i] = (int64_t)v; break; /* I64 only in these tests */
            }
        }
        CHECK_OK(tpu_memcpy(d, h, (size_t)n * es, TPU_COPY_H2D, NULL));
        free(h);
    }
    return t;
}

static unsigned char *download(const tpu_tensor *t) {
    size_t bytes = (size_t)tpu_tensor_numel(t) * tpu_dtype_size((tpu_dtype)t->dtype);
    unsigned char *h = calloc(1, bytes ? bytes : 1);
    CHECK_OK(tpu_memcpy(h, t->base, bytes, TPU_COPY_D2H, NULL));
    return h;
}

static tpu_tensor like(const tpu_tensor *t, tpu_dtype dt) { return dev_tensor(dt, t->ndim, t->sizes, NULL); }

static void launch(tpu_op op, tpu_tensor *ops, int n, tpu_params p, tpu_dtype compute) {
    p.compute_dtype = compute;
    CHECK_OK(tpu_launch(NULL, op, ops, n, &p));
}

/* The first test values of op's parameters (PF(slot, name, first, second) in ops.def). */
static const char *const params_text[TPU_OP_COUNT] = {
#define TPU_OP(e, name, fam, nout, nmin, nmax, dtypes, cls, params, ...) #params,
#include "tpu/ops.def"
#undef TPU_OP
};
static tpu_params test_params(tpu_op op) {
    tpu_params p;
    memset(&p, 0, sizeof p);
    int slot;
    double t0, t1;
    for (const char *q = params_text[op]; (q = strstr(q, "PF(")) != NULL; q += 3)
        if (sscanf(q + 3, "%d , %*[A-Za-z_0-9] , %lf , %lf", &slot, &t0, &t1) == 3) p.f[slot] = t0;
    return p;
}

static int fusible_kind(tpu_op op) {
    const tpu_op_info *in = &tpu_op_infos[op];
    if (tpu_op_family_of(op) != TPU_FAM_EW || in->cls < TPU_CLASS_UNARY || in->cls > TPU_CLASS_TERNARY) return 0;
    return (in->dtypes & DT_FLOAT) ? 1 : 0;
}

/* ---- every fusible op, every float dtype: fused == strict, bit for bit ---- */

/* out = op(op(x, y, z), y, z) with the intermediate freed before the sync. */
static unsigned char *run_op_chain(tpu_op op, tpu_dtype dt, tpu_eager_mode mode, const double *xv, const double *yv,
                                   const double *zv, size_t *bytes) {
    CHECK_OK(tpu_set_eager_mode(mode));
    int64_t sz[2] = {7, 150}; /* 1050 elements: full and partial tiles */
    const tpu_op_info *in = &tpu_op_infos[op];
    int nin = in->nin_min;
    tpu_dtype odt = (in->dtypes & DT_PRED) ? TPU_BOOL : dt;
    tpu_tensor x = dev_tensor(dt, 2, sz, xv), y = dev_tensor(dt, 2, sz, yv), z = dev_tensor(dt, 2, sz, zv);
    tpu_tensor a = like(&x, odt), b = like(&x, odt);
    tpu_params p = test_params(op);
    tpu_tensor ops1[4] = {a, x, y, z}, ops2[4] = {b, a, y, z};
    launch(op, ops1, 1 + nin, p, dt);
    launch(op, ops2, 1 + nin, p, dt);
    CHECK_OK(tpu_free(a.base));
    CHECK_OK(tpu_stream_synchronize(tpu_stream_current(0)));
    *bytes = (size_t)tpu_tensor_numel(&b) * tpu_dtype_size(odt);
    unsigned char *h = download(&b);
    CHECK_OK(tpu_free(x.base));
    CHECK_OK(tpu_free(y.base));
    CHECK_OK(tpu_free(z.base));
    CHECK_OK(tpu_free(b.base));
    return h;
}

static void test_every_fusible_op_matches_strict(void) {
    enum { N = 7 * 150 };
    static double xv[N], yv[N], zv[N];
    const double specials[] = {0.0, -0.0, 1.0, -1.0, NAN, INFINITY, -INFINITY, 0.5};
    for (int i = 0; i < N; i++) {
        xv[i] = i < 8 ? specials[i] : urand(-3, 3);
        yv[i] = i % 97 == 5 ? 0.0 : urand(-3, 3);
        zv[i] = urand(-1, 2);
    }
    const tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F16};
    int nops = 0;
    for (int op = 0; op < TPU_OP_COUNT; op++) {
        if (!fusible_kind((tpu_op)op)) continue;
        for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
            if (!(tpu_op_infos[op].dtypes & (1u << dts[d]))) continue;
            tpu_fused_stats s0, s1;
            size_t nb_s, nb_f;
            unsigned char *hs = run_op_chain((tpu_op)op, dts[d], TPU_EAGER_STRICT, xv, yv, zv, &nb_s);
            tpu_fused_get_stats(&s0);
            unsigned char *hf = run_op_chain((tpu_op)op, dts[d], TPU_EAGER_FUSED, xv, yv, zv, &nb_f);
            tpu_fused_get_stats(&s1);
            CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
            CHECK_MSG(nb_s == nb_f && memcmp(hs, hf, nb_s) == 0, "%s %s: fused result differs from strict",
                      tpu_op_name((tpu_op)op), tpu_dtype_name(dts[d]));
            CHECK_MSG(s1.groups_run > s0.groups_run && s1.results_never_stored > s0.results_never_stored,
                      "%s %s: not fused (groups %llu -> %llu)", tpu_op_name((tpu_op)op), tpu_dtype_name(dts[d]),
                      (unsigned long long)s0.groups_run, (unsigned long long)s1.groups_run);
            free(hs);
            free(hf);
            nops++;
        }
    }
    printf("     %d (op, dtype) pairs fused and compared\n", nops);
    CHECK(nops > 100);
}

/* ---- lookup tables: every op over every 16-bit input ---- */

/* c = op(op(op(x, s1, s2))) with host scalars s1, s2 and x holding every
 * bit pattern of dt four times (so the group qualifies for a table); NULL
 * if the op refuses host scalars (its launch fails). */
static unsigned char *run_table_chain(tpu_op op, tpu_dtype dt, tpu_eager_mode mode, size_t *bytes) {
    CHECK_OK(tpu_set_eager_mode(mode));
    int64_t sz[1] = {4 << 16};
    const tpu_op_info *in = &tpu_op_infos[op];
    int nin = in->nin_min;
    tpu_dtype odt = (in->dtypes & DT_PRED) ? TPU_BOOL : dt;
    tpu_tensor x = dev_tensor(dt, 1, sz, NULL), a = like(&x, odt), b = like(&x, odt), c = like(&x, odt);
    uint16_t *bits = malloc((size_t)sz[0] * 2);
    for (int64_t i = 0; i < sz[0]; i++) bits[i] = (uint16_t)(i * 40503u); /* every pattern, shuffled */
    CHECK_OK(tpu_memcpy(x.base, bits, (size_t)sz[0] * 2, TPU_COPY_H2D, NULL));
    free(bits);
    tpu_params p = test_params(op);
    p.compute_dtype = dt;
    tpu_tensor s1 = tpu_tensor_scalar_f(0.75, TPU_F64), s2 = tpu_tensor_scalar_f(-1.5, TPU_F64);
    tpu_tensor o1[4] = {a, x, s1, s2}, o2[4] = {b, a, s1, s2}, o3[4] = {c, b, s1, s2};
    bool ok = tpu_launch(NULL, op, o1, 1 + nin, &p) == TPU_OK && tpu_launch(NULL, op, o2, 1 + nin, &p) == TPU_OK &&
              tpu_launch(NULL, op, o3, 1 + nin, &p) == TPU_OK;
    CHECK_OK(tpu_free(a.base));
    CHECK_OK(tpu_free(b.base));
    CHECK_OK(tpu_stream_synchronize(tpu_stream_current(0)));
    *bytes = (size_t)sz[0] * tpu_dtype_size(odt);
    unsigned char *h = ok ? download(&c) : NULL;
    CHECK_OK(tpu_free(x.base));
    CHECK_OK(tpu_free(c.base));
    return h;
}

static void test_tables_match_strict(void) {
    const tpu_dtype dts[] = {TPU_BF16, TPU_F16};
    int npairs = 0, refused = 0;
    for (int op = 0; op < TPU_OP_COUNT; op++) {
        if (!fusible_kind((tpu_op)op)) continue;
        for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
            if (!(tpu_op_infos[op].dtypes & (1u << dts[d]))) continue;
            size_t nb_s = 0, nb_f = 0;
            tpu_fused_stats s0, s1;
            unsigned char *hs = run_table_chain((tpu_op)op, dts[d], TPU_EAGER_STRICT, &nb_s);
            if (!hs) {
                refused++;
                continue;
            }
            tpu_fused_get_stats(&s0);
            unsigned char *hf = run_table_chain((tpu_op)op, dts[d], TPU_EAGER_FUSED, &nb_f);
            tpu_fused_get_stats(&s1);
            CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
            CHECK_MSG(hf && nb_s == nb_f && memcmp(hs, hf, nb_s) == 0, "%s %s: table result differs from strict",
                      tpu_op_name((tpu_op)op), tpu_dtype_name(dts[d]));
            CHECK_MSG(s1.groups_by_table == s0.groups_by_table + 1, "%s %s: not run as a table",
                      tpu_op_name((tpu_op)op), tpu_dtype_name(dts[d]));
            free(hs);
            free(hf);
            npairs++;
        }
    }
    printf("     %d (op, dtype) pairs run as tables over all 65536 inputs (%d refuse host scalars)\n", npairs, refused);
    CHECK(npairs > 80);

    /* off: the same window runs the usual way */
    tpu_set_fused_tables(false);
    tpu_fused_stats s0, s1;
    size_t nb_s = 0, nb_f = 0;
    unsigned char *hs = run_table_chain(TPU_OP_MUL, TPU_BF16, TPU_EAGER_STRICT, &nb_s);
    tpu_fused_get_stats(&s0);
    unsigned char *hf = run_table_chain(TPU_OP_MUL, TPU_BF16, TPU_EAGER_FUSED, &nb_f);
    tpu_fused_get_stats(&s1);
    tpu_set_fused_tables(true);
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
    CHECK(hs && hf && memcmp(hs, hf, nb_s) == 0);
    CHECK(s1.groups_by_table == s0.groups_by_table && s1.groups_run == s0.groups_run + 1);
    free(hs);
    free(hf);
}

/* A bool input (a dropout mask scaled, shifted, squared) indexes a table of
 * 256 entries; two stored results; a tensor too small for a table does not. */
static void test_tables_bool_input_and_size(void) {
    for (int big = 0; big < 2; big++) {
        unsigned char *res[2][2];
        size_t nb = 0;
        tpu_fused_stats s0, s1;
        for (int m = 0; m < 2; m++) {
            if (m) tpu_fused_get_stats(&s0);
            CHECK_OK(tpu_set_eager_mode(m ? TPU_EAGER_FUSED : TPU_EAGER_STRICT));
            int64_t sz[1] = {big ? 5000 : 1000};
            static double mv[5000];
            for (int i = 0; i < 5000; i++) mv[i] = i % 3 == 0;
            tpu_tensor mask = dev_tensor(TPU_BOOL, 1, sz, mv), a = like(&mask, TPU_F32), b = like(&mask, TPU_F32),
                       c = like(&mask, TPU_BF16);
            tpu_tensor o1[] = {a, mask, tpu_tensor_scalar_f(1 / 0.9, TPU_F64)};
            tpu_tensor o2[] = {b, a, tpu_tensor_scalar_f(-0.25, TPU_F64)};
            tpu_tensor o3[] = {c, b, b};
            launch(TPU_OP_MUL, o1, 3, (tpu_params){0}, TPU_F32);
            launch(TPU_OP_ADD, o2, 3, TPU_PARAMS(ADD, .alpha = 1), TPU_F32);
            launch(TPU_OP_MUL, o3, 3, (tpu_params){0}, TPU_F32);
            CHECK_OK(tpu_free(a.base));
            CHECK_OK(tpu_stream_synchronize(tpu_stream_current(0)));
            nb = (size_t)sz[0];
            res[m][0] = download(&b);
            res[m][1] = download(&c);
            tpu_tensor all[] = {mask, b, c};
            for (int i = 0; i < 3; i++) CHECK_OK(tpu_free(all[i].base));
        }
        tpu_fused_get_stats(&s1);
        CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
        CHECK(memcmp(res[0][0], res[1][0], nb * 4) == 0 && memcmp(res[0][1], res[1][1], nb * 2) == 0);
        CHECK_MSG(s1.groups_by_table - s0.groups_by_table == (uint64_t)big, "size %d: %llu tables", big,
                  (unsigned long long)(s1.groups_by_table - s0.groups_by_table));
        for (int m = 0; m < 2; m++) free(res[m][0]), free(res[m][1]);
    }
}

/* ---- row reductions fused with their producers ---- */

/* r = red(exp(x * 0.5) + x) over the last dim of [rows, n] (or [2, rows/2, n]),
 * the two intermediates freed before the sync; out: r's bytes. */
static unsigned char *run_row_red(tpu_op op, tpu_dtype dt, tpu_dtype odt, int nd, int64_t rows, int64_t n,
                                  tpu_eager_mode mode, size_t *bytes) {
    CHECK_OK(tpu_set_eager_mode(mode));
    int64_t sz[3] = {rows, n, 0}, osz[3] = {rows, 1, 0};
    if (nd == 3) { sz[0] = osz[0] = 2, sz[1] = osz[1] = rows / 2, sz[2] = n, osz[2] = 1; }
    int64_t numel = rows * n;
    double *xv = malloc((size_t)numel * sizeof *xv);
    const double specials[] = {NAN, INFINITY, -INFINITY, -0.0, 1e30};
    rng_s = 0x1234567ull + (uint64_t)n; /* the same values in both modes */
    for (int64_t i = 0; i < numel; i++) xv[i] = i % 997 == 13 ? specials[(i / 997) % 5] : urand(-4, 4);
    tpu_tensor x = dev_tensor(dt, nd, sz, xv), a = like(&x, dt), b = like(&x, dt), c = like(&x, dt);
    free(xv);
    tpu_tensor r = dev_tensor(odt, nd, osz, NULL);
    tpu_tensor o1[] = {a, x, tpu_tensor_scalar_f(0.5, TPU_F64)}, o2[] = {b, a}, o3[] = {c, b, x}, o4[] = {r, c};
    launch(TPU_OP_MUL, o1, 3, (tpu_params){0}, dt);
    launch(TPU_OP_EXP, o2, 2, (tpu_params){0}, dt);
    launch(TPU_OP_ADD, o3, 3, TPU_PARAMS(ADD, .alpha = 1), dt);
    launch(op, o4, 2, (tpu_params){0}, odt);
    CHECK_OK(tpu_free(a.base));
    CHECK_OK(tpu_free(b.base));
    CHECK_OK(tpu_free(c.base));
    CHECK_OK(tpu_stream_synchronize(tpu_stream_current(0)));
    *bytes = (size_t)(numel / n) * tpu_dtype_size(odt);
    unsigned char *h = download(&r);
    CHECK_OK(tpu_free(x.base));
    CHECK_OK(tpu_free(r.base));
    return h;
}

static void test_row_reductions_fuse_bit_for_bit(void) {
    const tpu_op ops[] = {TPU_OP_SUM, TPU_OP_MEAN, TPU_OP_AMAX, TPU_OP_AMIN};
    const tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F16};
    const struct {
        int nd;
        int64_t rows, n;
    } shapes[] = {{2, 50, 100}, {2, 3, 1000}, {2, 20, 5000}, {2, 1, 300}, {2, 17, 64}, {3, 6, 129}, {2, 40, 16384}};
    int cases = 0;
    for (int o = 0; o < 4; o++)
        for (int d = 0; d < 3; d++)
            for (int k = 0; k < (int)(sizeof shapes / sizeof *shapes); k++) {
                tpu_dtype odt = o == 1 && d == 1 ? TPU_F32 : dts[d]; /* (a mean of bf16 into float32 too) */
                size_t nb_s = 0, nb_f = 0;
                tpu_fused_stats s0, s1;
                unsigned char *hs = run_row_red(ops[o], dts[d], odt, shapes[k].nd, shapes[k].rows, shapes[k].n,
                                                TPU_EAGER_STRICT, &nb_s);
                tpu_fused_get_stats(&s0);
                unsigned char *hf =
                    run_row_red(ops[o], dts[d], odt, shapes[k].nd, shapes[k].rows, shapes[k].n, TPU_EAGER_FUSED, &nb_f);
                tpu_fused_get_stats(&s1);
                CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
                CHECK_MSG(nb_s == nb_f && memcmp(hs, hf, nb_s) == 0, "%s %s [%lld x %lld]: fused differs from strict",
                          tpu_op_name(ops[o]), tpu_dtype_name(dts[d]), (long long)shapes[k].rows,
                          (long long)shapes[k].n);
                /* mul, exp, add and the reduction in one group; the three intermediates never stored */
                CHECK_MSG(s1.ops_fused - s0.ops_fused == 4 && s1.results_never_stored - s0.results_never_stored == 3,
                          "%s %s [%lld x %lld]: %llu fused, %llu never stored", tpu_op_name(ops[o]),
                          tpu_dtype_name(dts[d]), (long long)shapes[k].rows, (long long)shapes[k].n,
                          (unsigned long long)(s1.ops_fused - s0.ops_fused),
                          (unsigned long long)(s1.results_never_stored - s0.results_never_stored));
                free(hs);
                free(hf);
                cases++;
            }
    printf("     %d (reduction, dtype, shape) cases fused and compared\n", cases);
}

/* Row view r ([..., 1]) expanded over n columns (stride 0), as the glue
 * broadcasts an operand. */
static tpu_tensor expand_last(tpu_tensor r, int64_t n) {
    r.sizes[r.ndim - 1] = n;
    r.strides[r.ndim - 1] = 0;
    return r;
}

/* kind 0, RMSNorm: y = x * rsqrt(mean(x * x) + eps) * w; kind 1, softmax
 * by hand: e = exp(x - amax(x)), y = e / sum(e). Every intermediate freed
 * before the sync; out: y's bytes (and the row values, stored: rsqrt's or
 * the sum's, which a backward would keep). */
static unsigned char *run_row_chain(int kind, tpu_dtype dt, int64_t rows, int64_t n, tpu_eager_mode mode, size_t *bytes,
                                    unsigned char **rowv) {
    CHECK_OK(tpu_set_eager_mode(mode));
    int64_t sz[2] = {rows, n}, osz[2] = {rows, 1}, wsz[1] = {n};
    double *xv = malloc((size_t)(rows * n) * sizeof *xv), *wv = malloc((size_t)n * sizeof *wv);
    rng_s = 0xabcdefull + (uint64_t)(n * 3 + kind);
    for (int64_t i = 0; i < rows * n; i++) xv[i] = i == 7 ? NAN : i == 9 * n + 2 ? INFINITY : urand(-5, 5);
    for (int64_t i = 0; i < n; i++) wv[i] = urand(0.5, 1.5);
    tpu_tensor x = dev_tensor(dt, 2, sz, xv), w = dev_tensor(dt, 1, wsz, wv), y = like(&x, dt);
    free(xv);
    free(wv);
    tpu_tensor t1 = like(&x, dt), t2 = like(&x, dt), r1 = dev_tensor(dt, 2, osz, NULL),
               r2 = dev_tensor(dt, 2, osz, NULL);
    tpu_tensor r3 = dev_tensor(dt, 2, osz, NULL), wb = w;
    wb.ndim = 2, wb.sizes[0] = rows, wb.sizes[1] = n, wb.strides[0] = 0, wb.strides[1] = 1;
    if (kind == 0) {
        tpu_tensor a1[] = {t1, x, x}, a2[] = {r1, t1}, a3[] = {r2, r1, tpu_tensor_scalar_f(1e-6, TPU_F64)};
        tpu_tensor a4[] = {r3, r2}, a5[] = {t2, x, expand_last(r3, n)}, a6[] = {y, t2, wb};
        launch(TPU_OP_MUL, a1, 3, (tpu_params){0}, dt);
        launch(TPU_OP_MEAN, a2, 2, (tpu_params){0}, dt);
        launch(TPU_OP_ADD, a3, 3, TPU_PARAMS(ADD, .alpha = 1), dt);
        launch(TPU_OP_RSQRT, a4, 2, (tpu_params){0}, dt);
        launch(TPU_OP_MUL, a5, 3, (tpu_params){0}, dt);
        launch(TPU_OP_MUL, a6, 3, (tpu_params){0}, dt);
    } else {
        tpu_tensor a1[] = {r1, x}, a2[] = {t1, x, expand_last(r1, n)}, a3[] = {t2, t1}, a4[] = {r3, t2};
        tpu_tensor a5[] = {y, t2, expand_last(r3, n)};
        launch(TPU_OP_AMAX, a1, 2, (tpu_params){0}, dt);
        launch(TPU_OP_SUB, a2, 3, TPU_PARAMS(SUB, .alpha = 1), dt);
        launch(TPU_OP_EXP, a3, 2, (tpu_params){0}, dt);
        launch(TPU_OP_SUM, a4, 2, (tpu_params){0}, dt);
        launch(TPU_OP_DIV, a5, 3, (tpu_params){0}, dt);
    }
    tpu_tensor dead[] = {t1, t2, r1, r2};
    for (int i = 0; i < 4; i++) CHECK_OK(tpu_free(dead[i].base));
    CHECK_OK(tpu_stream_synchronize(tpu_stream_current(0)));
    *bytes = (size_t)(rows * n) * tpu_dtype_size(dt);
    unsigned char *h = download(&y);
    *rowv = download(&r3);
    tpu_tensor all[] = {x, w, y, r3};
    for (int i = 0; i < 4; i++) CHECK_OK(tpu_free(all[i].base));
    return h;
}

static void test_row_values_feed_the_row(void) {
    const tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F16};
    const int64_t shapes[][2] = {{12, 64}, {33, 500}, {3, 4096}, {64, 257}};
    for (int kind = 0; kind < 2; kind++)
        for (int d = 0; d < 3; d++)
            for (int k = 0; k < 4; k++) {
                size_t nb_s = 0, nb_f = 0;
                unsigned char *rs = NULL, *rf = NULL;
                tpu_fused_stats s0, s1;
                unsigned char *hs =
                    run_row_chain(kind, dts[d], shapes[k][0], shapes[k][1], TPU_EAGER_STRICT, &nb_s, &rs);
                tpu_fused_get_stats(&s0);
                unsigned char *hf =
                    run_row_chain(kind, dts[d], shapes[k][0], shapes[k][1], TPU_EAGER_FUSED, &nb_f, &rf);
                tpu_fused_get_stats(&s1);
                CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
                size_t rb = (size_t)shapes[k][0] * tpu_dtype_size(dts[d]);
                CHECK_MSG(nb_s == nb_f && memcmp(hs, hf, nb_s) == 0 && memcmp(rs, rf, rb) == 0,
                          "%s %s [%lld x %lld]: fused differs from strict", kind ? "softmax" : "rmsnorm",
                          tpu_dtype_name(dts[d]), (long long)shapes[k][0], (long long)shapes[k][1]);
                int nops = kind ? 5 : 6;
                CHECK_MSG(s1.ops_fused - s0.ops_fused == (uint64_t)nops && s1.groups_run - s0.groups_run == 1 &&
                              s1.results_never_stored - s0.results_never_stored == (uint64_t)(nops - 2),
                          "%s %s [%lld x %lld]: %llu of %d fused in %llu groups", kind ? "softmax" : "rmsnorm",
                          tpu_dtype_name(dts[d]), (long long)shapes[k][0], (long long)shapes[k][1],
                          (unsigned long long)(s1.ops_fused - s0.ops_fused), nops,
                          (unsigned long long)(s1.groups_run - s0.groups_run));
                free(hs), free(hf), free(rs), free(rf);
            }
}

/* y = layer_norm(x * 0.5) [* w] [+ b] + x, over the last dim; mean and
 * rstd kept (as autograd keeps them) or freed before the sync. out: y's
 * bytes, and mean's and rstd's (kept) back to back. */
static unsigned char *run_ln_chain(tpu_dtype dt, int64_t rows, int64_t n, bool hw, bool hb, bool keep,
                                   tpu_eager_mode mode, size_t *bytes, unsigned char **stats) {
    CHECK_OK(tpu_set_eager_mode(mode));
    int64_t sz[2] = {rows, n}, osz[2] = {rows, 1}, wsz[1] = {n};
    double *xv = malloc((size_t)(rows * n) * sizeof *xv), *wv = malloc((size_t)n * sizeof *wv);
    double *bv = malloc((size_t)n * sizeof *bv);
    rng_s = 0x5eedull + (uint64_t)(n * 7 + rows);
    for (int64_t i = 0; i < rows * n; i++) xv[i] = i == 5 ? NAN : i == 2 * n + 1 ? -INFINITY : urand(-3, 3) + 100.0;
    for (int64_t i = 0; i < n; i++) wv[i] = urand(0.5, 1.5), bv[i] = urand(-1, 1);
    tpu_tensor x = dev_tensor(dt, 2, sz, xv), w = dev_tensor(dt, 1, wsz, wv), b = dev_tensor(dt, 1, wsz, bv);
    free(xv), free(wv), free(bv);
    tpu_tensor t1 = like(&x, dt), yl = like(&x, dt), y = like(&x, dt);
    tpu_tensor mean = dev_tensor(dt, 2, osz, NULL), rstd = dev_tensor(dt, 2, osz, NULL);
    tpu_tensor a1[] = {t1, x, tpu_tensor_scalar_f(0.5, TPU_F64)}, a3[] = {y, yl, x};
    tpu_tensor a2[6] = {yl, mean, rstd, t1};
    int na = 4;
    if (hw) a2[na++] = w;
    if (hb) a2[na++] = b;
    launch(TPU_OP_MUL, a1, 3, (tpu_params){0}, dt);
    launch(TPU_OP_LAYER_NORM, a2, na, TPU_PARAMS(LAYER_NORM, .cols = n, .has_weight = hw, .has_bias = hb, .eps = 1e-5),
           dt);
    launch(TPU_OP_ADD, a3, 3, TPU_PARAMS(ADD, .alpha = 1), dt);
    CHECK_OK(tpu_free(t1.base));
    CHECK_OK(tpu_free(yl.base));
    if (!keep) {
        CHECK_OK(tpu_free(mean.base));
        CHECK_OK(tpu_free(rstd.base));
    }
    CHECK_OK(tpu_stream_synchronize(tpu_stream_current(0)));
    *bytes = (size_t)(rows * n) * tpu_dtype_size(dt);
    unsigned char *h = download(&y);
    *stats = NULL;
    if (keep) {
        size_t rb = (size_t)rows * tpu_dtype_size(dt);
        unsigned char *m = download(&mean), *r = download(&rstd);
        *stats = malloc(2 * rb);
        memcpy(*stats, m, rb), memcpy(*stats + rb, r, rb);
        free(m), free(r);
        CHECK_OK(tpu_free(mean.base));
        CHECK_OK(tpu_free(rstd.base));
    }
    tpu_tensor all[] = {x, w, b, y};
    for (int i = 0; i < 4; i++) CHECK_OK(tpu_free(all[i].base));
    return h;
}

/* A layer norm over the last dim runs inside its producers' group on the
 * rows the group holds (the kernel's row function): y, mean and rstd equal
 * Strict's bit for bit; its input and its y are never stored. */
static void test_layer_norm_fuses_bit_for_bit(void) {
    const tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F16};
    const int64_t shapes[][2] = {{12, 64}, {33, 500}, {3, 4096}, {2, 16384}, {1, 777}};
    int cases = 0;
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 5; k++)
            for (int aff = 0; aff < 4; aff++)
                for (int keep = 0; keep < 2; keep++) {
                    bool hw = aff & 1, hb = aff & 2;
                    size_t nb_s = 0, nb_f = 0, rb = 2 * (size_t)shapes[k][0] * tpu_dtype_size(dts[d]);
                    unsigned char *ss = NULL, *sf = NULL;
                    tpu_fused_stats s0, s1;
                    unsigned char *hs =
                        run_ln_chain(dts[d], shapes[k][0], shapes[k][1], hw, hb, keep, TPU_EAGER_STRICT, &nb_s, &ss);
                    tpu_fused_get_stats(&s0);
                    unsigned char *hf =
                        run_ln_chain(dts[d], shapes[k][0], shapes[k][1], hw, hb, keep, TPU_EAGER_FUSED, &nb_f, &sf);
                    tpu_fused_get_stats(&s1);
                    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
                    CHECK_MSG(nb_s == nb_f && memcmp(hs, hf, nb_s) == 0 && (!keep || memcmp(ss, sf, rb) == 0),
                              "layer_norm %s [%lld x %lld] w%d b%d keep%d: fused differs from strict",
                              tpu_dtype_name(dts[d]), (long long)shapes[k][0], (long long)shapes[k][1], hw, hb, keep);
                    CHECK_MSG(s1.ops_fused - s0.ops_fused == 3 && s1.groups_run - s0.groups_run == 1 &&
                                  s1.kernels_run == s0.kernels_run &&
                                  s1.results_never_stored - s0.results_never_stored == 2,
                              "layer_norm %s [%lld x %lld]: %llu of 3 fused in %llu groups, %llu kernels",
                              tpu_dtype_name(dts[d]), (long long)shapes[k][0], (long long)shapes[k][1],
                              (unsigned long long)(s1.ops_fused - s0.ops_fused),
                              (unsigned long long)(s1.groups_run - s0.groups_run),
                              (unsigned long long)(s1.kernels_run - s0.kernels_run));
                    free(hs), free(hf), free(ss), free(sf);
                    cases++;
                }
    printf("     %d (dtype, shape, affine, saved stats) cases fused and compared\n", cases);
}

/* y = softmax(x * 0.5) (or log_softmax), gi = its backward of g = x * 2,
 * out = gi + x; y kept (a backward would keep it). out: out's bytes, then
 * y's. */
static unsigned char *run_softmax_chain(bool logsm, tpu_dtype dt, int64_t rows, int64_t n, tpu_eager_mode mode,
                                        size_t *bytes) {
    CHECK_OK(tpu_set_eager_mode(mode));
    int64_t sz[2] = {rows, n};
    double *xv = malloc((size_t)(rows * n) * sizeof *xv);
    rng_s = 0x50f7ull + (uint64_t)(n * 5 + rows);
    for (int64_t i = 0; i < rows * n; i++) xv[i] = i == 3 ? NAN : i == n + 4 ? INFINITY : urand(-8, 8);
    tpu_tensor x = dev_tensor(dt, 2, sz, xv);
    free(xv);
    tpu_tensor t1 = like(&x, dt), y = like(&x, dt), g = like(&x, dt), gi = like(&x, dt), out = like(&x, dt);
    tpu_params sp = TPU_PARAMS(SOFTMAX, .dim = 1);
    tpu_tensor a1[] = {t1, x, tpu_tensor_scalar_f(0.5, TPU_F64)}, a2[] = {y, t1},
               a3[] = {g, x, tpu_tensor_scalar_f(2, TPU_F64)}, a4[] = {gi, g, y}, a5[] = {out, gi, x};
    launch(TPU_OP_MUL, a1, 3, (tpu_params){0}, dt);
    launch(logsm ? TPU_OP_LOG_SOFTMAX : TPU_OP_SOFTMAX, a2, 2, sp, dt);
    launch(TPU_OP_MUL, a3, 3, (tpu_params){0}, dt);
    launch(logsm ? TPU_OP_LOG_SOFTMAX_BWD : TPU_OP_SOFTMAX_BWD, a4, 3, sp, dt);
    launch(TPU_OP_ADD, a5, 3, TPU_PARAMS(ADD, .alpha = 1), dt);
    tpu_tensor dead[] = {t1, g, gi};
    for (int i = 0; i < 3; i++) CHECK_OK(tpu_free(dead[i].base));
    CHECK_OK(tpu_stream_synchronize(tpu_stream_current(0)));
    size_t nb = (size_t)(rows * n) * tpu_dtype_size(dt);
    unsigned char *h = malloc(2 * nb), *ho = download(&out), *hy = download(&y);
    memcpy(h, ho, nb), memcpy(h + nb, hy, nb);
    free(ho), free(hy);
    *bytes = 2 * nb;
    tpu_tensor all[] = {x, y, out};
    for (int i = 0; i < 3; i++) CHECK_OK(tpu_free(all[i].base));
    return h;
}

/* softmax, log_softmax and their backwards over the last dim run inside
 * their producers' and consumers' group (the kernel's row function): the
 * same bits as Strict, NaN and infinities included. */
static void test_softmax_fuses_bit_for_bit(void) {
    const tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F16};
    const int64_t shapes[][2] = {{12, 64}, {33, 500}, {3, 4096}, {2, 16384}, {7, 777}};
    int cases = 0;
    for (int lg = 0; lg < 2; lg++)
        for (int d = 0; d < 3; d++)
            for (int k = 0; k < 5; k++) {
                size_t nb_s = 0, nb_f = 0;
                tpu_fused_stats s0, s1;
                unsigned char *hs = run_softmax_chain(lg, dts[d], shapes[k][0], shapes[k][1], TPU_EAGER_STRICT, &nb_s);
                tpu_fused_get_stats(&s0);
                unsigned char *hf = run_softmax_chain(lg, dts[d], shapes[k][0], shapes[k][1], TPU_EAGER_FUSED, &nb_f);
                tpu_fused_get_stats(&s1);
                CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
                CHECK_MSG(nb_s == nb_f && memcmp(hs, hf, nb_s) == 0, "%s %s [%lld x %lld]: fused differs from strict",
                          lg ? "log_softmax" : "softmax", tpu_dtype_name(dts[d]), (long long)shapes[k][0],
                          (long long)shapes[k][1]);
                CHECK_MSG(s1.ops_fused - s0.ops_fused == 5 && s1.groups_run - s0.groups_run == 1 &&
                              s1.kernels_run == s0.kernels_run &&
                              s1.results_never_stored - s0.results_never_stored == 3,
                          "%s %s [%lld x %lld]: %llu of 5 fused in %llu groups", lg ? "log_softmax" : "softmax",
                          tpu_dtype_name(dts[d]), (long long)shapes[k][0], (long long)shapes[k][1],
                          (unsigned long long)(s1.ops_fused - s0.ops_fused),
                          (unsigned long long)(s1.groups_run - s0.groups_run));
                free(hs), free(hf);
                cases++;
            }
    printf("     %d (op, dtype, shape) cases fused and compared\n", cases);
}

/* ---- a chain with broadcasts, scalars, casts, in-place ops ---- */

typedef struct chain_out {
    unsigned char *t3, *t5;
    size_t peak_delta;
} chain_out;

static chain_out run_chain(tpu_eager_mode mode) {
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
    int64_t sz[2] = {64, 300}, bsz[1] = {300};
    static double xv[64 * 300], bv[300];
    for (int i = 0; i < 64 * 300; i++) xv[i] = sin(i * 0.37) * 3;
    for (int i = 0; i < 300; i++) bv[i] = cos(i * 0.11);
    tpu_tensor x = dev_tensor(TPU_F32, 2, sz, xv), bias = dev_tensor(TPU_F32, 1, bsz, bv);
    CHECK_OK(tpu_device_synchronize(0));
    tpu_mem_stats m0, m1;
    CHECK_OK(tpu_mem_reset_peak(0));
    CHECK_OK(tpu_mem_get_stats(0, &m0));
    CHECK_OK(tpu_set_eager_mode(mode));
    tpu_tensor t1 = like(&x, TPU_F32), t2 = like(&x, TPU_F32), t3 = like(&x, TPU_F32);
    tpu_tensor t4 = like(&x, TPU_BF16), t5 = like(&x, TPU_BF16);
    tpu_tensor bb = bias; /* broadcast over rows */
    bb.ndim = 2;
    bb.sizes[0] = 64;
    bb.sizes[1] = 300;
    bb.strides[0] = 0;
    bb.strides[1] = 1;
    tpu_tensor a1[] = {t1, x, tpu_tensor_scalar_f(2.0, TPU_F32)};
    launch(TPU_OP_MUL, a1, 3, (tpu_params){0}, TPU_F32);
    tpu_tensor a2[] = {t2, t1, bb};
    launch(TPU_OP_ADD, a2, 3, TPU_PARAMS(ADD, .alpha = 1.0), TPU_F32);
    tpu_tensor a3[] = {t3, t2};
    launch(TPU_OP_SIGMOID, a3, 2, (tpu_params){0}, TPU_F32);
    tpu_tensor a3b[] = {t3, t3, x}; /* in place: t3 += x */
    launch(TPU_OP_ADD, a3b, 3, TPU_PARAMS(ADD, .alpha = 0.5), TPU_F32);
    tpu_tensor a4[] = {t4, t3}; /* cast to bf16 */
    launch(TPU_OP_COPY, a4, 2, (tpu_params){0}, TPU_BF16);
    tpu_tensor a5[] = {t5, t4, t4};
    launch(TPU_OP_MUL, a5, 3, (tpu_params){0}, TPU_BF16);
    CHECK_OK(tpu_free(t1.base));
    CHECK_OK(tpu_free(t2.base));
    CHECK_OK(tpu_free(t4.base));
    if (mode == TPU_EAGER_FUSED) {
        CHECK(!tpu_mem_is_materialized(t5.base));
        CHECK(tpu_mem_is_materialized(x.base));
    }
    CHECK_OK(tpu_stream_synchronize(tpu_stream_current(0)));
    CHECK(tpu_mem_is_materialized(t5.base));
    CHECK_OK(tpu_mem_get_stats(0, &m1));
    chain_out r = {download(&t3), download(&t5), m1.peak_allocated - m0.allocated};
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
    CHECK_OK(tpu_free(t3.base));
    CHECK_OK(tpu_free(t5.base));
    CHECK_OK(tpu_free(x.base));
    CHECK_OK(tpu_free(bias.base));
    return r;
}

static void test_chain_broadcast_scalar_cast_inplace(void) {
    chain_out s = run_chain(TPU_EAGER_STRICT);
    tpu_fused_stats f0, f1;
    tpu_fused_get_stats(&f0);
    chain_out f = run_chain(TPU_EAGER_FUSED);
    tpu_fused_get_stats(&f1);
    CHECK(memcmp(s.t3, f.t3, 64 * 300 * 4) == 0);
    CHECK(memcmp(s.t5, f.t5, 64 * 300 * 2) == 0);
    CHECK_MSG(f1.ops_fused - f0.ops_fused == 6, "fused %llu", (unsigned long long)(f1.ops_fused - f0.ops_fused));
    CHECK_MSG(f1.results_never_stored - f0.results_never_stored == 4, "dead %llu",
              (unsigned long long)(f1.results_never_stored - f0.results_never_stored));
    CHECK_MSG(f1.bytes_never_materialized - f0.bytes_never_materialized >= 2 * 64 * 300 * 4 + 64 * 300 * 2, "%llu",
              (unsigned long long)(f1.bytes_never_materialized - f0.bytes_never_materialized));
    /* Strict binds all five results; fused binds only t3 and t5. */
    CHECK_MSG(f.peak_delta < s.peak_delta && f.peak_delta <= 64 * 300 * (4 + 2) + 8192, "peak fused %zu strict %zu",
              f.peak_delta, s.peak_delta);
    free(s.t3);
    free(s.t5);
    free(f.t3);
    free(f.t5);
}

/* ---- the plan cache: same structure, new addresses and parameters ---- */

static void test_plan_cache(void) {
    int64_t sz[1] = {3000};
    double xv[3000];
    for (int i = 0; i < 3000; i++) xv[i] = i * 0.5;
    tpu_fused_stats s0, s1;
    tpu_fused_get_stats(&s0);
    for (int round = 0; round < 3; round++) {
        tpu_tensor x = dev_tensor(TPU_F32, 1, sz, xv);
        CHECK_OK(tpu_set_eager_mode(TPU_EAGER_FUSED));
        tpu_tensor y = like(&x, TPU_F32), z = like(&x, TPU_F32);
        double scale = 2.0 + round, alpha = 1.0 + round;
        tpu_tensor a1[] = {y, x, tpu_tensor_scalar_f(scale, TPU_F32)};
        launch(TPU_OP_MUL, a1, 3, (tpu_params){0}, TPU_F32);
        tpu_tensor a2[] = {z, y, x};
        launch(TPU_OP_ADD, a2, 3, TPU_PARAMS(ADD, .alpha = alpha), TPU_F32);
        CHECK_OK(tpu_free(y.base));
        float h[3000];
        CHECK_OK(tpu_memcpy(h, z.base, sizeof h, TPU_COPY_D2H, NULL));
        CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
        bool ok = true;
        for (int i = 0; i < 3000; i++) ok = ok && h[i] == (float)((float)(xv[i] * scale) + (float)(alpha * xv[i]));
        CHECK_MSG(ok, "round %d", round);
        CHECK_OK(tpu_free(x.base));
        CHECK_OK(tpu_free(z.base));
    }
    tpu_fused_get_stats(&s1);
    CHECK_MSG(s1.plan_cache_hits - s0.plan_cache_hits >= 2, "hits %llu misses %llu",
              (unsigned long long)(s1.plan_cache_hits - s0.plan_cache_hits),
              (unsigned long long)(s1.plan_cache_misses - s0.plan_cache_misses));
}

/* A window over many storages (the planner's maps grow past their first
 * room); recorded again it hits the cache; with a different free pattern it
 * is a different key, planned afresh; every round's sum is exact. */
static void test_plan_cache_many_storages(void) {
    enum { N = 300, E = 40 };
    int64_t sz[1] = {E};
    double v[E];
    tpu_fused_stats s0, s1;
    for (int round = 0; round < 4; round++) {
        CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
        tpu_tensor x[N];
        for (int i = 0; i < N; i++) {
            for (int e = 0; e < E; e++) v[e] = (i % 7) + e;
            x[i] = dev_tensor(TPU_F32, 1, sz, v);
        }
        tpu_tensor acc = like(&x[0], TPU_F32);
        CHECK_OK(tpu_set_eager_mode(TPU_EAGER_FUSED));
        tpu_fused_get_stats(&s0);
        tpu_tensor c0[] = {acc, x[0]};
        launch(TPU_OP_COPY, c0, 2, (tpu_params){0}, TPU_F32);
        for (int i = 1; i < N; i++) {
            tpu_tensor a[] = {acc, acc, x[i]};
            launch(TPU_OP_ADD, a, 3, TPU_PARAMS(ADD, .alpha = 1), TPU_F32);
            if (round == 3 && i == N / 2) CHECK_OK(tpu_free(x[i].base)); /* freed once read */
        }
        float h[E];
        CHECK_OK(tpu_memcpy(h, acc.base, sizeof h, TPU_COPY_D2H, NULL));
        tpu_fused_get_stats(&s1);
        CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
        bool ok = true;
        for (int e = 0; e < E; e++) {
            double want = 0;
            for (int i = 0; i < N; i++) want += (i % 7) + e;
            ok = ok && h[e] == (float)want;
        }
        CHECK_MSG(ok, "round %d: sum of %d storages", round, N);
        uint64_t hits = s1.plan_cache_hits - s0.plan_cache_hits, misses = s1.plan_cache_misses - s0.plan_cache_misses;
        if (round == 1 || round == 2)
            CHECK_MSG(hits == 1 && misses == 0, "round %d: hits %llu misses %llu", round, (unsigned long long)hits,
                      (unsigned long long)misses);
        if (round == 3) CHECK_MSG(misses == 1, "round 3 (new free pattern): misses %llu", (unsigned long long)misses);
        for (int i = 0; i < N; i++)
            if (round != 3 || i != N / 2) CHECK_OK(tpu_free(x[i].base));
        CHECK_OK(tpu_free(acc.base));
    }
}

/* ---- random fills fuse with their consumers, drawing the same numbers ---- */

static unsigned char *run_dropout(tpu_eager_mode mode, tpu_dtype dt, unsigned char **mask_out) {
    CHECK_OK(tpu_set_eager_mode(mode));
    int64_t sz[2] = {33, 257};
    static double xv[33 * 257];
    for (int i = 0; i < 33 * 257; i++) xv[i] = cos(i * 0.1);
    tpu_tensor x = dev_tensor(dt, 2, sz, xv), mask = like(&x, TPU_BOOL), y = like(&x, dt), u = like(&x, dt);
    tpu_tensor n = like(&x, TPU_F32), out = like(&x, dt);
    tpu_tensor b[] = {mask, tpu_tensor_scalar_f(0.7, TPU_F64)};
    launch(TPU_OP_RAND_BERNOULLI, b, 2, TPU_PARAMS(RAND_BERNOULLI, .seed = 42, .offset = 8), TPU_BOOL);
    tpu_tensor m1[] = {y, x, mask};
    launch(TPU_OP_MUL, m1, 3, (tpu_params){0}, dt);
    tpu_tensor m2[] = {y, y, tpu_tensor_scalar_f(1 / 0.7, TPU_F64)};
    launch(TPU_OP_MUL, m2, 3, (tpu_params){0}, dt);
    tpu_tensor r1[] = {u};
    launch(TPU_OP_RAND_UNIFORM, r1, 1, TPU_PARAMS(RAND_UNIFORM, .seed = 7, .offset = 1000, .from = -1, .to = 2), dt);
    tpu_tensor r2[] = {n};
    launch(TPU_OP_RAND_NORMAL, r2, 1, TPU_PARAMS(RAND_NORMAL, .seed = 7, .offset = 5000, .mean = 1, .std = 3), TPU_F32);
    tpu_tensor a1[] = {out, y, u, n}; /* out = y + value * u * n */
    launch(TPU_OP_ADDCMUL, a1, 4, TPU_PARAMS(ADDCMUL, .value = 0.5), dt);
    CHECK_OK(tpu_free(u.base));
    CHECK_OK(tpu_free(n.base));
    unsigned char *h = download(&out);
    *mask_out = download(&mask);
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
    tpu_tensor all[] = {x, mask, y, out};
    for (int i = 0; i < 4; i++) CHECK_OK(tpu_free(all[i].base));
    return h;
}

static void test_random_fuses_bit_for_bit(void) {
    const tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F16};
    for (int d = 0; d < 3; d++) {
        unsigned char *ms, *mf;
        tpu_fused_stats s0, s1;
        unsigned char *s = run_dropout(TPU_EAGER_STRICT, dts[d], &ms);
        tpu_fused_get_stats(&s0);
        unsigned char *f = run_dropout(TPU_EAGER_FUSED, dts[d], &mf);
        tpu_fused_get_stats(&s1);
        size_t n = 33 * 257;
        CHECK_MSG(memcmp(s, f, n * tpu_dtype_size(dts[d])) == 0, "%s", tpu_dtype_name(dts[d]));
        CHECK(memcmp(ms, mf, n) == 0);
        CHECK_MSG(s1.ops_fused - s0.ops_fused == 6, "%s: fused %llu of 6", tpu_dtype_name(dts[d]),
                  (unsigned long long)(s1.ops_fused - s0.ops_fused));
        free(s);
        free(f);
        free(ms);
        free(mf);
    }
}

/* ---- a result read through another view must not come from a slot ---- */

static unsigned char *run_transpose(tpu_eager_mode mode) {
    CHECK_OK(tpu_set_eager_mode(mode));
    enum { R = 40 };
    int64_t sz[2] = {R, R};
    static double xv[R * R];
    for (int i = 0; i < R * R; i++) xv[i] = i * 0.01;
    tpu_tensor x = dev_tensor(TPU_F32, 2, sz, xv), t1 = like(&x, TPU_F32), t2 = like(&x, TPU_F32);
    tpu_tensor a1[] = {t1, x, tpu_tensor_scalar_f(1.0, TPU_F32)};
    launch(TPU_OP_ADD, a1, 3, TPU_PARAMS(ADD, .alpha = 1.0), TPU_F32);
    tpu_tensor t1t = t1; /* t1.T */
    t1t.strides[0] = 1;
    t1t.strides[1] = R;
    tpu_tensor a2[] = {t2, t1t, t1};
    launch(TPU_OP_SUB, a2, 3, TPU_PARAMS(SUB, .alpha = 1.0), TPU_F32);
    tpu_tensor a3[] = {t1, t1t, t2}; /* writes t1 while reading its transpose: must not fuse */
    launch(TPU_OP_MUL, a3, 3, (tpu_params){0}, TPU_F32);
    unsigned char *h = download(&t1);
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
    CHECK_OK(tpu_free(x.base));
    CHECK_OK(tpu_free(t1.base));
    CHECK_OK(tpu_free(t2.base));
    return h;
}

static void test_other_views_do_not_fuse(void) {
    unsigned char *s = run_transpose(TPU_EAGER_STRICT), *f = run_transpose(TPU_EAGER_FUSED);
    CHECK(memcmp(s, f, 40 * 40 * 4) == 0);
    free(s);
    free(f);
}

/* ---- flush points ---- */

static void test_flush_points(void) {
    int64_t sz[1] = {1000};
    tpu_tensor x = dev_tensor(TPU_F32, 1, sz, NULL), y = like(&x, TPU_F32);
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_FUSED));
    tpu_fused_stats s0, s1;
    tpu_fused_get_stats(&s0);
    tpu_tensor f[] = {x, tpu_tensor_scalar_f(3.0, TPU_F32)};
    launch(TPU_OP_FILL, f, 2, (tpu_params){0}, TPU_F32);
    tpu_stream_t st = tpu_stream_current(0);
    CHECK(tpu_stream_query(st) == TPU_OK || tpu_stream_query(st) == TPU_ERROR_NOT_READY); /* query flushes */
    tpu_tensor a[] = {y, x, x};
    launch(TPU_OP_MUL, a, 3, (tpu_params){0}, TPU_F32);
    tpu_event_t e;
    CHECK_OK(tpu_event_create(false, &e));
    CHECK_OK(tpu_event_record(e, st)); /* event record flushes */
    CHECK_OK(tpu_event_synchronize(e));
    launch(TPU_OP_NEG, a, 2, (tpu_params){0}, TPU_F32);
    CHECK_OK(tpu_flush(NULL));
    launch(TPU_OP_NEG, a, 2, (tpu_params){0}, TPU_F32);
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT)); /* mode switch flushes */
    float h[1000];
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_FUSED));
    launch(TPU_OP_NEG, a, 2, (tpu_params){0}, TPU_F32);
    CHECK_OK(tpu_memcpy(h, y.base, sizeof h, TPU_COPY_D2H, NULL)); /* copy flushes */
    tpu_fused_get_stats(&s1);
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
    CHECK(s1.flushes[TPU_FLUSH_QUERY] - s0.flushes[TPU_FLUSH_QUERY] == 1);
    CHECK(s1.flushes[TPU_FLUSH_EVENT] - s0.flushes[TPU_FLUSH_EVENT] == 1);
    CHECK(s1.flushes[TPU_FLUSH_EXPLICIT] - s0.flushes[TPU_FLUSH_EXPLICIT] == 1);
    CHECK(s1.flushes[TPU_FLUSH_MODE_SWITCH] - s0.flushes[TPU_FLUSH_MODE_SWITCH] == 1);
    CHECK(s1.flushes[TPU_FLUSH_COPY] - s0.flushes[TPU_FLUSH_COPY] == 1);
    CHECK(s1.ops_recorded - s0.ops_recorded == 5);
    CHECK(h[0] == -3.0f && h[999] == -3.0f); /* y = -x */
    CHECK(strcmp(tpu_flush_cause_name(TPU_FLUSH_MEMORY), "memory") == 0);
    CHECK_OK(tpu_event_destroy(e));
    CHECK_OK(tpu_free(x.base));
    CHECK_OK(tpu_free(y.base));
}

/* ---- a thread's own mode (what a compiled graph runs in) ---- */

static void *other_thread_mode(void *arg) {
    *(int *)arg = (int)tpu_get_eager_mode();
    return NULL;
}

static void test_thread_eager_mode(void) {
    int64_t sz[1] = {1000};
    tpu_tensor x = dev_tensor(TPU_F32, 1, sz, NULL), y = like(&x, TPU_F32);
    tpu_fused_stats s0, s1, s2;
    tpu_fused_get_stats(&s0);
    int prev = 7, seen = -1;
    CHECK(tpu_get_eager_mode() == TPU_EAGER_STRICT);
    CHECK(tpu_set_thread_eager_mode(TPU_EAGER_MODE_COUNT, &prev) == TPU_ERROR_INVALID_VALUE && prev == 7);
    CHECK(tpu_set_thread_eager_mode(-2, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK_OK(tpu_set_thread_eager_mode(TPU_EAGER_FUSED, &prev));
    CHECK(prev == -1 && tpu_get_eager_mode() == TPU_EAGER_FUSED);
    pthread_t th; /* the process's mode is unchanged for every other thread */
    CHECK(pthread_create(&th, NULL, other_thread_mode, &seen) == 0 && pthread_join(th, NULL) == 0);
    CHECK(seen == TPU_EAGER_STRICT);
    tpu_tensor f[] = {x, tpu_tensor_scalar_f(2.0, TPU_F32)};
    launch(TPU_OP_FILL, f, 2, (tpu_params){0}, TPU_F32);
    tpu_tensor a[] = {y, x, x};
    launch(TPU_OP_MUL, a, 3, (tpu_params){0}, TPU_F32);
    tpu_fused_get_stats(&s1);
    CHECK(s1.ops_recorded - s0.ops_recorded == 2 && s1.flushes[TPU_FLUSH_GRAPH_END] == s0.flushes[TPU_FLUSH_GRAPH_END]);
    CHECK_OK(tpu_set_thread_eager_mode(TPU_EAGER_FUSED, &prev)); /* fused -> fused: nothing flushed */
    CHECK(prev == TPU_EAGER_FUSED);
    CHECK_OK(tpu_set_thread_eager_mode(-1, &prev)); /* back to the process's mode: flushes */
    CHECK(prev == TPU_EAGER_FUSED && tpu_get_eager_mode() == TPU_EAGER_STRICT);
    tpu_fused_get_stats(&s2);
    CHECK(s2.flushes[TPU_FLUSH_GRAPH_END] - s0.flushes[TPU_FLUSH_GRAPH_END] == 1);
    float h[1000];
    CHECK_OK(tpu_memcpy(h, y.base, sizeof h, TPU_COPY_D2H, NULL));
    CHECK(h[0] == 4.0f && h[999] == 4.0f);
    /* Into Debug Eager: flushed and finished; a process in Fused Eager keeps its window. */
    CHECK_OK(tpu_set_thread_eager_mode(TPU_EAGER_FUSED, NULL));
    launch(TPU_OP_NEG, a, 2, (tpu_params){0}, TPU_F32);
    CHECK_OK(tpu_set_thread_eager_mode(TPU_EAGER_DEBUG, NULL));
    CHECK(tpu_stream_query(tpu_stream_current(0)) == TPU_OK);
    CHECK_OK(tpu_set_thread_eager_mode(-1, NULL));
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_FUSED));
    tpu_fused_get_stats(&s1);
    CHECK_OK(tpu_set_thread_eager_mode(TPU_EAGER_FUSED, NULL));
    tpu_tensor f5[] = {y, tpu_tensor_scalar_f(5.0, TPU_F32)};
    launch(TPU_OP_FILL, f5, 2, (tpu_params){0}, TPU_F32);
    CHECK_OK(tpu_set_thread_eager_mode(-1, NULL));
    tpu_fused_get_stats(&s2);
    CHECK(s2.flushes[TPU_FLUSH_GRAPH_END] == s1.flushes[TPU_FLUSH_GRAPH_END]);
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT)); /* (flushes: mode switch) */
    CHECK_OK(tpu_memcpy(h, y.base, sizeof h, TPU_COPY_D2H, NULL));
    CHECK(h[0] == 5.0f && strcmp(tpu_flush_cause_name(TPU_FLUSH_GRAPH_END), "graph_end") == 0);
    CHECK_OK(tpu_free(x.base));
    CHECK_OK(tpu_free(y.base));
}

/* ---- memory pressure: a window whose freed blocks (of ever new sizes: the
 * cache cannot hand them out again) would exhaust the chip ---- */

static void test_memory_pressure_flushes(void) {
    tpu_mem_stats m;
    CHECK_OK(tpu_mem_get_stats(0, &m));
    int64_t n0 = (int64_t)(m.capacity / 16 / sizeof(float)), step = (int64_t)(m.capacity / 128 / sizeof(float));
    int64_t sz[1] = {n0};
    tpu_tensor x = dev_tensor(TPU_F32, 1, sz, NULL);
    tpu_tensor f[] = {x, tpu_tensor_scalar_f(1.0, TPU_F32)};
    launch(TPU_OP_FILL, f, 2, (tpu_params){0}, TPU_F32);
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_FUSED));
    tpu_fused_stats s0, s1;
    tpu_fused_get_stats(&s0);
    tpu_tensor cur = x;
    for (int i = 1; i <= 12; i++) { /* 12 blocks of 1/16 of the chip and more, each a new size: 1.4 chips */
        int64_t szi[1] = {n0 + i * step};
        tpu_tensor nx = dev_tensor(TPU_F32, 1, szi, NULL);
        if (!nx.base) break;
        nx.sizes[0] = n0; /* the first n0 elements: nx[:n0] = cur[:n0] + 1 */
        cur.sizes[0] = n0;
        tpu_tensor a[] = {nx, cur, tpu_tensor_scalar_f(1.0, TPU_F32)};
        launch(TPU_OP_ADD, a, 3, TPU_PARAMS(ADD, .alpha = 1.0), TPU_F32);
        CHECK_OK(tpu_free(cur.base));
        cur = nx;
    }
    float h[4];
    CHECK_OK(tpu_memcpy(h, cur.base, sizeof h, TPU_COPY_D2H, NULL));
    tpu_fused_get_stats(&s1);
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
    CHECK_MSG(h[0] == 13.0f && h[3] == 13.0f, "%g", h[0]);
    CHECK(s1.flushes[TPU_FLUSH_MEMORY] > s0.flushes[TPU_FLUSH_MEMORY]);
    CHECK_OK(tpu_free(cur.base));
}

/* ---- a kernel error inside a window: raised at the flush's sync, device usable ---- */

static void name_site(uint32_t site, char *buf, size_t len) { snprintf(buf, len, "model.py:%u in forward", site); }

static void test_error_in_window(void) {
    tpu_set_site_namer(name_site);
    int64_t sz[1] = {16};
    double xi[16], zi[16];
    for (int i = 0; i < 16; i++) xi[i] = i + 1, zi[i] = i == 7 ? 0 : 1;
    tpu_tensor a = dev_tensor(TPU_I64, 1, sz, xi), b = dev_tensor(TPU_I64, 1, sz, zi), q = like(&a, TPU_I64);
    tpu_tensor x = dev_tensor(TPU_F32, 1, sz, xi), y = like(&x, TPU_F32), w = like(&x, TPU_F32);
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_FUSED));
    tpu_tensor d[] = {q, a, b};
    tpu_set_launch_site(42);
    launch(TPU_OP_DIV_TRUNC, d, 3, (tpu_params){0}, TPU_I64);
    tpu_set_launch_site(0);
    tpu_tensor m1[] = {y, x, x}, m2[] = {w, y, x};
    launch(TPU_OP_MUL, m1, 3, (tpu_params){0}, TPU_F32);
    launch(TPU_OP_ADD, m2, 3, TPU_PARAMS(ADD, .alpha = 1.0), TPU_F32);
    tpu_status st = tpu_stream_synchronize(tpu_stream_current(0));
    CHECK(st == TPU_ERROR_KERNEL);
    CHECK_MSG(strstr(tpu_last_error(), "div_trunc") && strstr(tpu_last_error(), "ZeroDivisionError") &&
                  strstr(tpu_last_error(), "(called at model.py:42 in forward)"),
              "%s", tpu_last_error());
    float h[16];
    CHECK_OK(tpu_memcpy(h, w.base, sizeof h, TPU_COPY_D2H, NULL)); /* the window's other results completed */
    CHECK(h[3] == 4.0f * 4.0f + 4.0f && h[15] == 16.0f * 16.0f + 16.0f);
    CHECK_OK(tpu_stream_synchronize(tpu_stream_current(0)));
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
    tpu_tensor all[] = {a, b, q, x, y, w};
    for (int i = 0; i < 6; i++) CHECK_OK(tpu_free(all[i].base));
    tpu_set_site_namer(NULL);
}

/* ---- recomputation (vtpu/remat.c): a far reader reads a recomputed copy;
 * when its scratch blocks cannot be allocated it reads memory, the same bits ---- */

static bool fail_alloc(int dev, size_t bytes, void *user) {
    (void)dev, (void)bytes;
    return !*(bool *)user;
}

static unsigned char *remat_program(tpu_eager_mode mode, bool fail, uint64_t *reads) {
    int64_t sz[2] = {37, 129};
    double *xv = malloc(37 * 129 * sizeof *xv);
    for (int i = 0; i < 37 * 129; i++) xv[i] = urand(-3, 3);
    tpu_tensor x = dev_tensor(TPU_F32, 2, sz, xv), t = like(&x, TPU_F32), w = like(&x, TPU_F32), y = like(&x, TPU_F32);
    free(xv);
    bool failing = false;
    tpu_mem_set_alloc_hook(fail_alloc, &failing);
    CHECK_OK(tpu_set_eager_mode(mode));
    tpu_fused_stats s0, s1;
    tpu_fused_get_stats(&s0);
    tpu_tensor e[] = {t, x}, f[] = {w, x, tpu_tensor_scalar_f(1.0, TPU_F32)}, m[] = {y, t, w};
    launch(TPU_OP_EXP, e, 2, (tpu_params){0}, TPU_F32);               /* t: a recipe, leaf x */
    launch(TPU_OP_ADD, f, 3, TPU_PARAMS(ADD, .alpha = 1.0), TPU_F32); /* (distance) */
    failing = fail;
    launch(TPU_OP_MUL, m, 3, (tpu_params){0}, TPU_F32); /* reads t two launches later */
    failing = false;
    unsigned char *h = download(&y);
    tpu_fused_get_stats(&s1);
    *reads = s1.remat_reads - s0.remat_reads;
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
    tpu_mem_set_alloc_hook(NULL, NULL);
    tpu_tensor all[] = {x, t, w, y};
    for (int i = 0; i < 4; i++) CHECK_OK(tpu_free(all[i].base));
    return h;
}

static void test_remat_reads_copies_and_survives_failed_scratch(void) {
    int old = tpu_get_fused_remat();
    tpu_set_fused_remat(2);
    uint64_t r_strict, r_fail, r_on;
    uint64_t seed = rng_s;
    unsigned char *hs = remat_program(TPU_EAGER_STRICT, false, &r_strict);
    rng_s = seed;
    unsigned char *hf = remat_program(TPU_EAGER_FUSED, true, &r_fail);
    rng_s = seed;
    unsigned char *ho = remat_program(TPU_EAGER_FUSED, false, &r_on);
    tpu_set_fused_remat(old);
    size_t bytes = 37 * 129 * sizeof(float);
    CHECK(memcmp(hs, hf, bytes) == 0 && memcmp(hs, ho, bytes) == 0);
    CHECK_MSG(r_strict == 0 && r_fail == 0 && r_on == 1, "%llu %llu %llu", (unsigned long long)r_strict,
              (unsigned long long)r_fail, (unsigned long long)r_on);
    free(hs), free(hf), free(ho);
}

int main(void) {
    setenv("TPU_HBM_BYTES", "256M", 1);
    CHECK_OK(tpu_init());
    RUN_TEST(test_every_fusible_op_matches_strict);
    RUN_TEST(test_tables_match_strict);
    RUN_TEST(test_tables_bool_input_and_size);
    RUN_TEST(test_row_reductions_fuse_bit_for_bit);
    RUN_TEST(test_row_values_feed_the_row);
    RUN_TEST(test_layer_norm_fuses_bit_for_bit);
    RUN_TEST(test_softmax_fuses_bit_for_bit);
    RUN_TEST(test_chain_broadcast_scalar_cast_inplace);
    RUN_TEST(test_plan_cache);
    RUN_TEST(test_plan_cache_many_storages);
    RUN_TEST(test_random_fuses_bit_for_bit);
    RUN_TEST(test_other_views_do_not_fuse);
    RUN_TEST(test_flush_points);
    RUN_TEST(test_thread_eager_mode);
    RUN_TEST(test_memory_pressure_flushes);
    RUN_TEST(test_error_in_window);
    RUN_TEST(test_remat_reads_copies_and_survives_failed_scratch);
    return TEST_SUMMARY();
}
