/* test_kernels_ew.c - elementwise, reduction and scan kernels.
 *
 * test-backend-ops style: every EW / RED / SCAN op of ops.def, for every
 * dtype it supports, on odd-prime shapes, broadcast inputs (stride 0),
 * transposed and padded views (offset, holes), 0-dim and empty tensors, host
 * scalars, in-place outputs and launches big enough to span several parallel
 * blocks, with NaN / Inf / -0 among float inputs and dtype extremes among
 * integer inputs. Operands live in plain host memory. The fast kernel and the
 * reference kernel write separate outputs of the same layout; values must
 * agree within a per-dtype tolerance (NaN where NaN, inf where inf, integers
 * exactly) and every output byte outside the view (guards, holes) must keep
 * the sentinel pattern. Golden values computed with PyTorch 2 on CPU pin the
 * semantics of both kernels. Data-dependent failures (integer division by
 * zero) must fail the same way in both. The ops, their kinds (class, integer
 * form, predicate, divisor) and parameter test values come from ops.def: a
 * new elementwise op is tested here without touching this file. */
#include "kernels/kernels-impl.h"
#include "base/base-impl.h"
#include "test.h"
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#define GUARD 64
#define PAT   0xA5

enum { LAY_CONTIG, LAY_TRANS, LAY_PAD };

typedef struct hten {
    tpu_tensor t;
    unsigned char *mem; /* GUARD | storage | GUARD */
    size_t bytes;       /* storage bytes */
} hten;

static char case_desc[320];
static long n_runs; /* fast-vs-ref comparisons made */

/* ---- random numbers (xorshift64*) ---- */

static uint64_t rng_s = 0x2545F4914F6CDD1Dull;

static uint64_t rng_next(void) {
    rng_s ^= rng_s >> 12;
    rng_s ^= rng_s << 25;
    rng_s ^= rng_s >> 27;
    return rng_s * 0x2545F4914F6CDD1Dull;
}
static double urand(double lo, double hi) { return lo + (hi - lo) * (double)(rng_next() >> 11) * 0x1.0p-53; }
static int64_t irand(int64_t n) { return (int64_t)(rng_next() % (uint64_t)n); }

/* ---- value generators ---- */

enum { G_SPECIAL = 1, G_NONZERO = 2, G_EXTREME = 4 };
typedef struct vgen {
    double lo, hi;
    int flags;
} vgen;

static void dtype_range(tpu_dtype dt, int64_t *mn, int64_t *mx) {
    switch (dt) {
    case TPU_U8:
        *mn = 0;
        *mx = 255;
        break;
    case TPU_I8:
        *mn = INT8_MIN;
        *mx = INT8_MAX;
        break;
    case TPU_I16:
        *mn = INT16_MIN;
        *mx = INT16_MAX;
        break;
    case TPU_I32:
        *mn = INT32_MIN;
        *mx = INT32_MAX;
        break;
    case TPU_BOOL:
        *mn = 0;
        *mx = 1;
        break;
    default:
        *mn = INT64_MIN;
        *mx = INT64_MAX;
        break;
    }
}

static void gen_store(void *p, tpu_dtype dt, const vgen *g) {
    if (tpu_dtype_is_float(dt)) {
        static const double sp[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0};
        double v = urand(g->lo, g->hi);
        if ((g->flags & G_NONZERO) && v == 0) v = 1;
        if ((g->flags & G_SPECIAL) && irand(100) < 8) v = sp[irand(5)];
        tpu_store_f64(p, dt, v);
        return;
    }
    int64_t mn, mx, lo = (int64_t)floor(g->lo), hi = (int64_t)floor(g->hi);
    dtype_range(dt, &mn, &mx);
    lo = lo < mn ? mn : lo > mx ? mx : lo;
    hi = hi < lo ? lo : hi > mx ? mx : hi;
    int64_t v = lo + irand(hi - lo + 1);
    if ((g->flags & G_EXTREME) && irand(100) < 6) v = irand(2) ? mn : mx;
    if ((g->flags & G_NONZERO) && v == 0) v = 1;
    tpu_store_i64(p, dt, v);
}

/* ---- host tensors ---- */

/* A view of `sizes`: contiguous, transposed (dims stored in reverse order) or
 * padded (every extent +2, offset 5); dims in bmask are broadcast (stride 0).
 * The whole allocation starts as the sentinel pattern. */
static void hmk(hten *h, tpu_dtype dt, int nd, const int64_t *sizes, int layout, unsigned bmask) {
    memset(h, 0, sizeof *h);
    tpu_tensor *t = &h->t;
    t->dtype = dt;
    t->ndim = nd;
    int64_t st = 1;
    for (int q = 0; q < nd; q++) {
        int d = layout == LAY_TRANS ? q : nd - 1 - q;
        t->sizes[d] = sizes[d];
        if (bmask >> d & 1) continue;
        t->strides[d] = st;
        int64_t ext = sizes[d] + (layout == LAY_PAD ? 2 : 0);
        st *= ext > 0 ? ext : 1;
    }
    t->offset = layout == LAY_PAD ? 5 : 0;
    h->bytes = (size_t)(t->offset + st) * tpu_dtype_size(dt);
    h->mem = malloc(h->bytes + 2 * GUARD);
    if (!h->mem) abort();
    memset(h->mem, PAT, h->bytes + 2 * GUARD);
    t->base = h->mem + GUARD;
    t->nbytes = h->bytes;
}

static void hclone(hten *d, const hten *s) {
    *d = *s;
    d->mem = malloc(s->bytes + 2 * GUARD);
    if (!d->mem) abort();
    memcpy(d->mem, s->mem, s->bytes + 2 * GUARD);
    d->t.base = d->mem + GUARD;
}

static void hfree(hten *h) {
    free(h->mem);
    h->mem = NULL;
}

static int64_t hnumel(const tpu_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
    return n;
}

static int64_t hoff(const tpu_tensor *t, int64_t lin) {
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (lin % t->sizes[d]) * t->strides[d];
        lin /= t->sizes[d];
    }
    return off;
}

static void *hptr(const tpu_tensor *t, int64_t lin) {
    return (char *)t->base + (size_t)hoff(t, lin) * tpu_dtype_size((tpu_dtype)t->dtype);
}

/* Fill every storage element (holes too: kernels must not read them as view elements). */
static void hgen(hten *h, const vgen *g) {
    size_t es = tpu_dtype_size((tpu_dtype)h->t.dtype);
    for (size_t b = 0; b < h->bytes; b += es) gen_store((char *)h->t.base + b, (tpu_dtype)h->t.dtype, g);
}

static void hset_f(hten *h, const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) tpu_store_f64(hptr(&h->t, i), (tpu_dtype)h->t.dtype, v[i]);
}

/* ---- comparing outputs ---- */

static void tolerance(tpu_dtype dt, double *rtol, double *atol) {
    switch (dt) {
    case TPU_F64:
        *rtol = 1e-11;
        *atol = 1e-13;
        break;
    case TPU_F32:
        *rtol = 1e-5;
        *atol = 1e-6;
        break;
    case TPU_F16:
        *rtol = 2e-3;
        *atol = 1e-4;
        break;
    case TPU_BF16:
        *rtol = 1.6e-2;
        *atol = 1e-3;
        break;
    default:
        *rtol = 0;
        *atol = 0;
        break;
    }
}

static bool close_enough(double a, double b, double rtol, double atol) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    return fabs(a - b) <= atol + rtol * fabs(b);
}

/* Bytes that are not elements of the view: the guards and holes. They must
 * hold the pattern (or, for an in-place output, equal the other buffer's). */
static bool holes_ok(const hten *h, const hten *other) {
    size_t total = h->bytes + 2 * GUARD, es = tpu_dtype_size((tpu_dtype)h->t.dtype);
    unsigned char *mark = calloc(total, 1);
    if (!mark) abort();
    for (int64_t i = 0; i < hnumel(&h->t); i++) memset(mark + GUARD + (size_t)hoff(&h->t, i) * es, 1, es);
    bool ok = true;
    for (size_t b = 0; b < total && ok; b++) {
        if (mark[b]) continue;
        bool guard = b < GUARD || b >= GUARD + h->bytes;
        ok = (other && !guard) ? h->mem[b] == other->mem[b] : h->mem[b] == PAT;
    }
    free(mark);
    return ok;
}

/* Fast output f against reference output r; `inplace` outputs have data in their holes. */
static void hcmp(const hten *f, const hten *r, bool inplace, double tolscale) {
    n_runs++;
    CHECK_MSG(holes_ok(f, inplace ? r : NULL), "[%s]: fast kernel wrote outside the view", case_desc);
    CHECK_MSG(holes_ok(r, inplace ? f : NULL), "[%s]: ref kernel wrote outside the view", case_desc);
    tpu_dtype dt = (tpu_dtype)r->t.dtype;
    double rtol, atol;
    tolerance(dt, &rtol, &atol);
    for (int64_t i = 0; i < hnumel(&r->t); i++) {
        bool ok;
        double a = 0, b = 0;
        if (tpu_dtype_is_float(dt)) {
            a = tpu_load_f64(hptr(&f->t, i), dt);
            b = tpu_load_f64(hptr(&r->t, i), dt);
            ok = close_enough(a, b, rtol * tolscale, atol * tolscale);
        } else {
            int64_t x = tpu_load_i64(hptr(&f->t, i), dt), y = tpu_load_i64(hptr(&r->t, i), dt);
            ok = x == y;
            a = (double)x;
            b = (double)y;
        }
        if (!ok) {
            CHECK_MSG(ok, "[%s]: element %lld fast %.9g ref %.9g", case_desc, (long long)i, a, b);
            return;
        }
    }
}

/* Run the fast or the reference kernel of op's family. */
static tpu_status run(bool ref, tpu_op op, const tpu_tensor *ops, int n, const tpu_params *p, char *err) {
    tpu_kargs a;
    memset(&a, 0, sizeof a);
    a.op = op;
    a.n = n;
    memcpy(a.t, ops, (size_t)n * sizeof *ops);
    a.p = *p;
    tpu_status s;
    switch (tpu_op_family_of(op)) {
    case TPU_FAM_EW: s = ref ? tpu_ref_ew(&a) : tpu_k_elementwise(&a); break;
    case TPU_FAM_RED: s = ref ? tpu_ref_red(&a) : tpu_k_reduce(&a); break;
    default: s = ref ? tpu_ref_scan(&a) : tpu_k_scan(&a); break;
    }
    snprintf(err, 256, "%s", a.err);
    return s;
}

/* Run both kernels; both must succeed, or both fail with the same message. */
static bool run_both(tpu_op op, const tpu_tensor *fops, const tpu_tensor *rops, int n, const tpu_params *p) {
    char ef[256], er[256];
    tpu_status sf = run(false, op, fops, n, p, ef), sr = run(true, op, rops, n, p, er);
    CHECK_MSG(sf == sr, "[%s]: fast %s (%s) vs ref %s (%s)", case_desc, tpu_status_name(sf), ef, tpu_status_name(sr),
              er);
    if (sf == sr && sf != TPU_OK) CHECK_MSG(strcmp(ef, er) == 0, "[%s]: '%s' vs '%s'", case_desc, ef, er);
    return sf == TPU_OK && sr == TPU_OK;
}

static const tpu_dtype all_dtypes[] = {TPU_F32, TPU_F64, TPU_F16, TPU_BF16, TPU_U8,
                                       TPU_I8,  TPU_I16, TPU_I32, TPU_I64,  TPU_BOOL};
#define N_ALL 10
static const int op_nin[] = {
#define TPU_OP(e, name, fam, nout, nmin, nmax, ...) nmin,
#include "tpu/ops.def"
#undef TPU_OP
};

/* ======================= golden values (PyTorch) ======================= */

typedef struct gold_ew {
    tpu_op op;
    const char *ins;
    double f[3];
    int64_t i[2];
    float want[12];
} gold_ew;
typedef struct gold_ew_i {
    tpu_op op;
    const char *ins;
    double f[3];
    int64_t i[2];
    int64_t want[8];
} gold_ew_i;
typedef struct gold_red {
    tpu_op op;
    int dim;
    double f0;
    int64_t i0;
    float want[5];
} gold_red;

/* Generated with PyTorch 2.13.0 (CPU, float32), inputs in gold_x/y/z/c. Two
 * deliberate differences: gelu(inf) is inf here (the erf formula); PyTorch's
 * vectorized CPU kernel returns NaN there. hardtanh_backward at a NaN input is
 * 0, as CPU's vectorized kernel gives (its scalar tail, which served these 12
 * elements, passes the gradient through). */
static const float gold_x[12] = {-2.5, -1.0, -0.5, -0.0, 0.0, 0.3, 1.0, 2.0, 3.7, NAN, INFINITY, -INFINITY};
static const float gold_y[12] = {1.5, -2.0, 0.25, 3.0, -0.7, 2.0, -3.0, 0.5, 1.0, 2.0, -1.0, 0.4};
static const float gold_z[12] = {0.2, 0.9, -1.1, 0.6, 0.0, 0.45, 1.5, -0.3, 0.8, 0.1, 0.3, 2.0};
static const float gold_c[12] = {1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0};
static const gold_ew gold_f32[] = {
    {TPU_OP_NEG,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {2.5, 1.0, 0.5, 0.0, -0.0, -0.30000001192092896, -1.0, -2.0, -3.700000047683716, NAN, -INFINITY, INFINITY}},
    {TPU_OP_ABS,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {2.5, 1.0, 0.5, 0.0, 0.0, 0.30000001192092896, 1.0, 2.0, 3.700000047683716, NAN, INFINITY, INFINITY}},
    {TPU_OP_SIGN, "x", {0.0, 0.0, 0.0}, {0, 0}, {-1.0, -1.0, -1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, -1.0}},
    {TPU_OP_EXP,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {0.08208499848842621, 0.3678794503211975, 0.6065306663513184, 1.0, 1.0, 1.3498588800430298, 2.7182817459106445,
      7.389056205749512, 40.44730758666992, NAN, INFINITY, 0.0}},
    {TPU_OP_EXP2,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {0.1767766922712326, 0.5, 0.7071067690849304, 1.0, 1.0, 1.2311444282531738, 2.0, 4.0, 12.996038436889648, NAN,
      INFINITY, 0.0}},
    {TPU_OP_EXPM1,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.9179149866104126, -0.6321205496788025, -0.39346933364868164, -0.0, 0.0, 0.349858820438385, 1.718281865119934,
      6.389056205749512, 39.44730758666992, NAN, INFINITY, -1.0}},
    {TPU_OP_LOG,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {NAN, NAN, NAN, -INFINITY, -INFINITY, -1.2039728164672852, 0.0, 0.6931471824645996, 1.3083328008651733, NAN,
      INFINITY, NAN}},
    {TPU_OP_LOG2,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {NAN, NAN, NAN, -INFINITY, -INFINITY, -1.736965537071228, 0.0, 1.0, 1.8875253200531006, NAN, INFINITY, NAN}},
    {TPU_OP_LOG10,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {NAN, NAN, NAN, -INFINITY, -INFINITY, -0.5228787064552307, 0.0, 0.3010300099849701, 0.5682017207145691, NAN,
      INFINITY, NAN}},
    {TPU_OP_LOG1P,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {NAN, -INFINITY, -0.6931471824645996, -0.0, 0.0, 0.2623642683029175, 0.6931471824645996, 1.0986123085021973,
      1.5475624799728394, NAN, INFINITY, NAN}},
    {TPU_OP_SQRT,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {NAN, NAN, NAN, -0.0, 0.0, 0.547722578048706, 1.0, 1.4142135381698608, 1.9235384464263916, NAN, INFINITY, NAN}},
    {TPU_OP_RSQRT,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {NAN, NAN, NAN, -INFINITY, INFINITY, 1.8257417678833008, 1.0, 0.7071067690849304, 0.5198752284049988, NAN, 0.0,
      NAN}},
    {TPU_OP_RECIPROCAL,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.4000000059604645, -1.0, -2.0, -INFINITY, INFINITY, 3.3333332538604736, 1.0, 0.5, 0.2702702581882477, NAN, 0.0,
      -0.0}},
    {TPU_OP_SIN,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.5984721183776855, -0.8414709568023682, -0.4794255495071411, -0.0, 0.0, 0.29552021622657776, 0.8414709568023682,
      0.9092974066734314, -0.5298361778259277, NAN, NAN, NAN}},
    {TPU_OP_COS,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.8011435866355896, 0.5403023362159729, 0.8775825500488281, 1.0, 1.0, 0.9553365111351013, 0.5403023362159729,
      -0.416146844625473, -0.8481000065803528, NAN, NAN, NAN}},
    {TPU_OP_TAN,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {0.7470223307609558, -1.5574077367782593, -0.5463024973869324, -0.0, 0.0, 0.30933627486228943, 1.5574077367782593,
      -2.185039758682251, 0.6247331500053406, NAN, NAN, NAN}},
    {TPU_OP_ASIN,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {NAN, -1.5707963705062866, -0.5235987901687622, -0.0, 0.0, 0.30469265580177307, 1.5707963705062866, NAN, NAN, NAN,
      NAN, NAN}},
    {TPU_OP_ACOS,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {NAN, 3.1415927410125732, 2.094395160675049, 1.5707963705062866, 1.5707963705062866, 1.2661036252975464, 0.0, NAN,
      NAN, NAN, NAN, NAN}},
    {TPU_OP_ATAN,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-1.1902899742126465, -0.7853981852531433, -0.46364760398864746, -0.0, 0.0, 0.29145681858062744,
      0.7853981852531433, 1.1071487665176392, 1.3068325519561768, NAN, 1.5707963705062866, -1.5707963705062866}},
    {TPU_OP_SINH,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-6.050204753875732, -1.175201177597046, -0.5210952758789062, -0.0, 0.0, 0.30452030897140503, 1.175201177597046,
      3.6268603801727295, 20.211292266845703, NAN, INFINITY, -INFINITY}},
    {TPU_OP_COSH,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {6.132289409637451, 1.5430805683135986, 1.1276259422302246, 1.0, 1.0, 1.04533851146698, 1.5430805683135986,
      3.7621958255767822, 20.23601531982422, NAN, INFINITY, INFINITY}},
    {TPU_OP_TANH,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.9866142868995667, -0.7615941762924194, -0.46211716532707214, -0.0, 0.0, 0.29131263494491577,
      0.7615941762924194, 0.9640275835990906, 0.998778223991394, NAN, 1.0, -1.0}},
    {TPU_OP_ASINH,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-1.6472312211990356, -0.8813735842704773, -0.4812118411064148, -0.0, 0.0, 0.29567307233810425, 0.8813735842704773,
      1.4436354637145996, 2.0192606449127197, NAN, INFINITY, -INFINITY}},
    {TPU_OP_ACOSH,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {NAN, NAN, NAN, NAN, NAN, NAN, 0.0, 1.316957950592041, 1.9826970100402832, NAN, INFINITY, NAN}},
    {TPU_OP_ATANH,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {NAN, -INFINITY, -0.5493061542510986, -0.0, 0.0, 0.30951961874961853, INFINITY, NAN, NAN, NAN, NAN, NAN}},
    {TPU_OP_ERF,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.9995930194854736, -0.8427007794380188, -0.5204998850822449, -0.0, 0.0, 0.3286267817020416, 0.8427007794380188,
      0.9953222870826721, 0.9999998211860657, NAN, 1.0, -1.0}},
    {TPU_OP_ERFC,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {1.9995930194854736, 1.8427008390426636, 1.5204999446868896, 1.0, 1.0, 0.6713732481002808, 0.15729920566082,
      0.004677734803408384, 1.671510005962773e-07, NAN, 0.0, 2.0}},
    {TPU_OP_SIGMOID,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {0.07585817575454712, 0.2689414322376251, 0.3775406777858734, 0.5, 0.5, 0.5744425058364868, 0.7310585975646973,
      0.8807970285415649, 0.9758729934692383, NAN, 1.0, 0.0}},
    {TPU_OP_RELU,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {0.0, 0.0, 0.0, -0.0, 0.0, 0.30000001192092896, 1.0, 2.0, 3.700000047683716, NAN, INFINITY, 0.0}},
    {TPU_OP_SILU,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.189645454287529, -0.2689414322376251, -0.1887703388929367, -0.0, 0.0, 0.172332763671875, 0.7310585975646973,
      1.7615940570831299, 3.6107301712036133, NAN, INFINITY, NAN}},
    {TPU_OP_MISH,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.19681619107723236, -0.3034014403820038, -0.22074376046657562, -0.0, 0.0, 0.20800139009952545,
      0.8650983572006226, 1.9439589977264404, 3.695694923400879, NAN, INFINITY, NAN}},
    {TPU_OP_HARDSIGMOID,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {0.0833333358168602, 0.3333333432674408, 0.4166666567325592, 0.5, 0.5, 0.550000011920929, 0.6666666865348816,
      0.8333333134651184, 1.0, NAN, 1.0, 0.0}},
    {TPU_OP_HARDSWISH,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.2083333283662796, -0.3333333432674408, -0.2083333283662796, -0.0, 0.0, 0.16500000655651093, 0.6666666865348816,
      1.6666666269302368, 3.700000047683716, NAN, INFINITY, NAN}},
    {TPU_OP_FLOOR,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-3.0, -1.0, -1.0, -0.0, 0.0, 0.0, 1.0, 2.0, 3.0, NAN, INFINITY, -INFINITY}},
    {TPU_OP_CEIL,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-2.0, -1.0, -0.0, -0.0, 0.0, 1.0, 1.0, 2.0, 4.0, NAN, INFINITY, -INFINITY}},
    {TPU_OP_ROUND,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-2.0, -1.0, -0.0, -0.0, 0.0, 0.0, 1.0, 2.0, 4.0, NAN, INFINITY, -INFINITY}},
    {TPU_OP_TRUNC,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-2.0, -1.0, -0.0, -0.0, 0.0, 0.0, 1.0, 2.0, 3.0, NAN, INFINITY, -INFINITY}},
    {TPU_OP_FRAC,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.5, 0.0, -0.5, 0.0, 0.0, 0.30000001192092896, 0.0, 0.0, 0.7000000476837158, NAN, NAN, NAN}},
    {TPU_OP_LOGICAL_NOT, "x", {0.0, 0.0, 0.0}, {0, 0}, {0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}},
    {TPU_OP_ISNAN, "x", {0.0, 0.0, 0.0}, {0, 0}, {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0}},
    {TPU_OP_ISINF, "x", {0.0, 0.0, 0.0}, {0, 0}, {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0}},
    {TPU_OP_GELU,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.015524178743362427, -0.15865525603294373, -0.1542687714099884, -0.0, 0.0, 0.1853734403848648,
      0.8413447141647339, 1.9544997215270996, 3.699601411819458, NAN, INFINITY, NAN}},
    {TPU_OP_GELU_TANH,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.015084296464920044, -0.15880799293518066, -0.1542859971523285, -0.0, 0.0, 0.18537093698978424,
      0.8411920070648193, 1.9545977115631104, 3.69972825050354, NAN, INFINITY, NAN}},
    {TPU_OP_SOFTPLUS,
     "x",
     {1.0, 20.0, 0.0},
     {0, 0},
     {0.07888973504304886, 0.3132616877555847, 0.4740769863128662, 0.6931471824645996, 0.6931471824645996,
      0.8543552756309509, 1.31326162815094, 2.1269280910491943, 3.7244229316711426, NAN, INFINITY, 0.0}},
    {TPU_OP_SOFTPLUS,
     "x",
     {2.0, 1.0, 0.0},
     {0, 0},
     {0.003357674228027463, 0.06346400082111359, 0.15663084387779236, 0.3465735912322998, 0.3465735912322998,
      0.5187439918518066, 1.0, 2.0, 3.700000047683716, NAN, INFINITY, 0.0}},
    {TPU_OP_ELU,
     "x",
     {1.0, 1.0, 1.0},
     {0, 0},
     {-0.9179149866104126, -0.6321205496788025, -0.39346933364868164, -0.0, 0.0, 0.30000001192092896, 1.0, 2.0,
      3.700000047683716, NAN, INFINITY, -1.0}},
    {TPU_OP_ELU,
     "x",
     {0.5, 2.0, 1.5},
     {0, 0},
     {-0.9764822721481323, -0.7768698334693909, -0.5276334285736084, -0.0, 0.0, 0.6000000238418579, 2.0, 4.0,
      7.400000095367432, NAN, INFINITY, -1.0}},
    {TPU_OP_LEAKY_RELU,
     "x",
     {0.2, 0.0, 0.0},
     {0, 0},
     {-0.5, -0.20000000298023224, -0.10000000149011612, -0.0, 0.0, 0.30000001192092896, 1.0, 2.0, 3.700000047683716,
      NAN, INFINITY, -INFINITY}},
    {TPU_OP_CLAMP,
     "x",
     {-0.5, 0.7, 0.0},
     {0, 0},
     {-0.5, -0.5, -0.5, -0.0, 0.0, 0.30000001192092896, 0.699999988079071, 0.699999988079071, 0.699999988079071, NAN,
      0.699999988079071, -0.5}},
    {TPU_OP_CLAMP,
     "x",
     {0.1, INFINITY, 0.0},
     {0, 0},
     {0.10000000149011612, 0.10000000149011612, 0.10000000149011612, 0.10000000149011612, 0.10000000149011612,
      0.30000001192092896, 1.0, 2.0, 3.700000047683716, NAN, INFINITY, 0.10000000149011612}},
    {TPU_OP_CLAMP,
     "x",
     {-INFINITY, 0.1, 0.0},
     {0, 0},
     {-2.5, -1.0, -0.5, -0.0, 0.0, 0.10000000149011612, 0.10000000149011612, 0.10000000149011612, 0.10000000149011612,
      NAN, 0.10000000149011612, -INFINITY}},
    {TPU_OP_CLAMP,
     "x",
     {1.0, -1.0, 0.0},
     {0, 0},
     {-1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, NAN, -1.0, -1.0}},
    {TPU_OP_NAN_TO_NUM,
     "x",
     {0.5, 100.0, -100.0},
     {0, 0},
     {-2.5, -1.0, -0.5, -0.0, 0.0, 0.30000001192092896, 1.0, 2.0, 3.700000047683716, 0.5, 100.0, -100.0}},
    {TPU_OP_ADD,
     "xy",
     {2.0, 0.0, 0.0},
     {0, 0},
     {0.5, -5.0, 0.0, 6.0, -1.399999976158142, 4.300000190734863, -5.0, 3.0, 5.699999809265137, NAN, INFINITY,
      -INFINITY}},
    {TPU_OP_SUB,
     "xy",
     {0.5, 0.0, 0.0},
     {0, 0},
     {-3.25, 0.0, -0.625, -1.5, 0.3499999940395355, -0.699999988079071, 2.5, 1.75, 3.200000047683716, NAN, INFINITY,
      -INFINITY}},
    {TPU_OP_MUL,
     "xy",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-3.75, 2.0, -0.125, -0.0, -0.0, 0.6000000238418579, -3.0, 1.0, 3.700000047683716, NAN, -INFINITY, -INFINITY}},
    {TPU_OP_DIV,
     "xy",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-1.6666666269302368, 0.5, -2.0, -0.0, -0.0, 0.15000000596046448, -0.3333333432674408, 4.0, 3.700000047683716, NAN,
      -INFINITY, -INFINITY}},
    {TPU_OP_DIV_TRUNC,
     "xy",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-1.0, 0.0, -2.0, -0.0, -0.0, 0.0, -0.0, 4.0, 3.0, NAN, -INFINITY, -INFINITY}},
    {TPU_OP_DIV_FLOOR,
     "xy",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-2.0, 0.0, -2.0, -0.0, -0.0, 0.0, -1.0, 4.0, 3.0, NAN, NAN, NAN}},
    {TPU_OP_POW,
     "xy",
     {0.0, 0.0, 0.0},
     {0, 0},
     {NAN, 1.0, NAN, -0.0, INFINITY, 0.09000000357627869, 1.0, 1.4142135381698608, 3.700000047683716, NAN, 0.0,
      INFINITY}},
    {TPU_OP_MAXIMUM,
     "xy",
     {0.0, 0.0, 0.0},
     {0, 0},
     {1.5, -1.0, 0.25, 3.0, 0.0, 2.0, 1.0, 2.0, 3.700000047683716, NAN, INFINITY, 0.4000000059604645}},
    {TPU_OP_MINIMUM,
     "xy",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-2.5, -2.0, -0.5, -0.0, -0.699999988079071, 0.30000001192092896, -3.0, 0.5, 1.0, NAN, -1.0, -INFINITY}},
    {TPU_OP_FMOD,
     "xy",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-1.0, -1.0, -0.0, -0.0, 0.0, 0.30000001192092896, 1.0, 0.0, 0.7000000476837158, NAN, NAN, NAN}},
    {TPU_OP_REMAINDER,
     "xy",
     {0.0, 0.0, 0.0},
     {0, 0},
     {0.5, -1.0, -0.0, -0.0, 0.0, 0.30000001192092896, -2.0, 0.0, 0.7000000476837158, NAN, NAN, NAN}},
    {TPU_OP_ATAN2,
     "xy",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-1.0303767919540405, -2.677945137023926, -1.1071487665176392, -0.0, 3.1415927410125732, 0.14888995885849,
      2.8198421001434326, 1.3258177042007446, 1.3068325519561768, NAN, 1.5707963705062866, -1.5707963705062866}},
    {TPU_OP_EQ, "xy", {0.0, 0.0, 0.0}, {0, 0}, {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}},
    {TPU_OP_NE, "xy", {0.0, 0.0, 0.0}, {0, 0}, {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}},
    {TPU_OP_LT, "xy", {0.0, 0.0, 0.0}, {0, 0}, {1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0}},
    {TPU_OP_LE, "xy", {0.0, 0.0, 0.0}, {0, 0}, {1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0}},
    {TPU_OP_GT, "xy", {0.0, 0.0, 0.0}, {0, 0}, {0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0}},
    {TPU_OP_GE, "xy", {0.0, 0.0, 0.0}, {0, 0}, {0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0}},
    {TPU_OP_LOGICAL_AND, "xy", {0.0, 0.0, 0.0}, {0, 0}, {1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}},
    {TPU_OP_LOGICAL_OR, "xy", {0.0, 0.0, 0.0}, {0, 0}, {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}},
    {TPU_OP_LOGICAL_XOR, "xy", {0.0, 0.0, 0.0}, {0, 0}, {0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}},
    {TPU_OP_THRESHOLD_BWD,
     "yx",
     {0.3, 0.0, 0.0},
     {0, 0},
     {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -3.0, 0.5, 1.0, 2.0, -1.0, 0.0}},
    {TPU_OP_GELU_BWD,
     "yx",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.056416600942611694, 0.16663086414337158, 0.03312622755765915, 1.5, -0.3499999940395355, 1.4646555185317993,
      -3.249946117401123, 0.5426159501075745, 1.0014638900756836, NAN, NAN, NAN}},
    {TPU_OP_GELU_TANH_BWD,
     "yx",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.056927479803562164, 0.1659281849861145, 0.033157527446746826, 1.5, -0.3499999940395355, 1.4645910263061523,
      -3.248892307281494, 0.5430496335029602, 1.0011568069458008, NAN, NAN, NAN}},
    {TPU_OP_SILU_BWD,
     "yx",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.14910165965557098, -0.14465896785259247, 0.065009705722332, 1.5, -0.3499999940395355, 1.2955601215362549,
      -2.7830116748809814, 0.5453921556472778, 1.0629889965057373, NAN, NAN, NAN}},
    {TPU_OP_SIGMOID_BWD,
     "yx",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-13.125, 4.0, -0.1875, -0.0, -0.0, 0.42000001668930054, -0.0, -1.0, -9.99000072479248, NAN, INFINITY, -INFINITY}},
    {TPU_OP_TANH_BWD,
     "yx",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-7.875, -0.0, 0.1875, 3.0, -0.699999988079071, 1.8199999332427979, -0.0, -1.5, -12.690000534057617, NAN, INFINITY,
      -INFINITY}},
    {TPU_OP_LEAKY_RELU_BWD,
     "yx",
     {0.2, 0.0, 0.0},
     {0, 0},
     {0.30000001192092896, -0.4000000059604645, 0.05000000074505806, 0.6000000238418579, -0.14000000059604645, 2.0,
      -3.0, 0.5, 1.0, 0.4000000059604645, -1.0, 0.08000000566244125}},
    {TPU_OP_HARDTANH_BWD,
     "yx",
     {-1.0, 1.0, 0.0},
     {0, 0},
     {0.0, 0.0, 0.25, 3.0, -0.699999988079071, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}},
    {TPU_OP_SOFTPLUS_BWD,
     "yx",
     {1.0, 20.0, 0.0},
     {0, 0},
     {0.11378727108240128, -0.5378828644752502, 0.09438516944646835, 1.5, -0.3499999940395355, 1.1488851308822632,
      -2.193175792694092, 0.44039854407310486, 0.9758729934692383, NAN, -1.0, 0.0}},
    {TPU_OP_SOFTPLUS_BWD,
     "yx",
     {2.0, 1.0, 0.0},
     {0, 0},
     {0.01003927644342184, -0.23840583860874176, 0.06723535805940628, 1.5, -0.3499999940395355, 1.2913126945495605,
      -3.0, 0.5, 1.0, NAN, -1.0, 0.0}},
    {TPU_OP_WHERE,
     "cxy",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-2.5, -2.0, -0.5, -0.0, -0.699999988079071, 2.0, 1.0, 0.5, 3.700000047683716, 2.0, INFINITY, -INFINITY}},
    {TPU_OP_ADDCMUL,
     "xyz",
     {0.5, 0.0, 0.0},
     {0, 0},
     {-2.3499999046325684, -1.899999976158142, -0.637499988079071, 0.9000000357627869, 0.0, 0.75, -1.25,
      1.9249999523162842, 4.099999904632568, NAN, INFINITY, -INFINITY}},
    {TPU_OP_ADDCDIV,
     "xyz",
     {0.5, 0.0, 0.0},
     {0, 0},
     {1.25, -2.1111111640930176, -0.6136363744735718, 2.5, -INFINITY, 2.5222222805023193, 0.0, 1.1666667461395264,
      4.324999809265137, NAN, INFINITY, -INFINITY}},
    {TPU_OP_LERP,
     "xyz",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-1.7000000476837158, -1.899999976158142, -1.3249999284744263, 1.8000000715255737, 0.0, 1.065000057220459, -5.0,
      2.450000047683716, 1.5399999618530273, NAN, NAN, INFINITY}},
    {TPU_OP_CLAMP_T,
     "xyz",
     {0.0, 0.0, 0.0},
     {0, 0},
     {0.20000000298023224, -1.0, -1.100000023841858, 0.6000000238418579, 0.0, 0.44999998807907104, 1.0,
      -0.30000001192092896, 0.800000011920929, NAN, 0.30000001192092896, 0.4000000059604645}},
    {TPU_OP_LGAMMA,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.056243717670440674, INFINITY, 1.2655121088027954, INFINITY, INFINITY, 1.0957978963851929, 0.0, 0.0,
      1.4280723333358765, NAN, INFINITY, INFINITY}},
    {TPU_OP_DIGAMMA,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {1.1031566858291626, NAN, 0.03648991510272026, INFINITY, -INFINITY, -3.502523899078369, -0.5772159099578857,
      0.4227842092514038, 1.1671537160873413, NAN, INFINITY, NAN}},
    {TPU_OP_POLYGAMMA,
     "x",
     {3.0, 0.0, 0.0},
     {0, 0},
     {194.74789428710938, INFINITY, 193.40908813476562, INFINITY, INFINITY, 743.1416625976562, 6.493939399719238,
      0.4939393997192383, 0.058279216289520264, NAN, NAN, INFINITY}},
    {TPU_OP_POLYGAMMA,
     "x",
     {2.0, 0.0, 0.0},
     {0, 0},
     {-0.10820404440164566, -INFINITY, -0.8287966251373291, -INFINITY, -INFINITY, -75.27252960205078, -2.40411376953125,
      -0.4041137993335724, -0.09539530426263809, NAN, NAN, -INFINITY}},
    {TPU_OP_ERFINV,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {NAN, -INFINITY, -0.4769362807273865, -0.0, 0.0, 0.27246272563934326, INFINITY, NAN, NAN, NAN, NAN, NAN}},
    {TPU_OP_I0,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {3.289839506149292, 1.2660659551620483, 1.063483476638794, 0.9999999403953552, 0.9999999403953552,
      1.0226268768310547, 1.2660659551620483, 2.279585123062134, 8.738618850708008, NAN, NAN, NAN}},
    {TPU_OP_I0E,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {0.2700464725494385, 0.46575963497161865, 0.6450353264808655, 0.9999999403953552, 0.9999999403953552,
      0.757580578327179, 0.46575963497161865, 0.3085083067417145, 0.216049462556839, NAN, 0.0, 0.0}},
    {TPU_OP_I1,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-2.5167160034179688, -0.5651590824127197, -0.25789427757263184, 0.0, 0.0, 0.15169386565685272, 0.5651590824127197,
      1.5906368494033813, 7.435746192932129, NAN, NAN, NAN}},
    {TPU_OP_I1E,
     "x",
     {0.0, 0.0, 0.0},
     {0, 0},
     {-0.206584632396698, -0.207910418510437, -0.15642079710960388, 0.0, 0.0, 0.11237756907939911, 0.207910418510437,
      0.2152692824602127, 0.18383784592151642, NAN, 0.0, -0.0}},
    {TPU_OP_SIGNBIT, "x", {0.0, 0.0, 0.0}, {0, 0}, {1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0}},
};
/* The special functions of torch.special (and sinc, igamma, logaddexp2, fmax,
 * fmin) in float64, generated with PyTorch 2.13.0 (CPU, float64): special
 * inputs (0, -0, +-inf, NaN, poles, the ends of each approximation's range,
 * large arguments and degrees) per op. x and, for binary ops, y (the
 * polynomials' n, zeta's q, igamma's x). igamma / igammac at (25, 24), (300, 310)
 * and (0.001, 0.7) are mpmath's (40 digits), rounded: PyTorch's float64 there is
 * 8e-10, 1.2e-10 and 1.4e-13 off (its asymptotic series). */
typedef struct gold_sp {
    tpu_op op;
    double x[12], y[12], want[12];
} gold_sp;
static const gold_sp gold_special[] = {
    {TPU_OP_ENTR,
     {-1.0, 0.0, -0.0, 1e-300, 0.5, 1.0, 2.5, 10000000000.0, INFINITY, NAN, 0.1, 3.0},
     {0},
     {-INFINITY, 0.0, 0.0, 6.907755278982137e-298, 0.34657359027997264, -0.0, -2.2907268296853878, -230258509299.40457,
      -INFINITY, NAN, 0.23025850929940456, -3.295836866004329}},
    {TPU_OP_SINC,
     {0.0, -0.0, 0.5, 1.0, -1.5, 1e-08, 2.25, 100.5, 1000000.25, INFINITY, NAN, -3.0},
     {0},
     {1.0, 1.0, 0.6366197723675814, 3.8981718325193755e-17, -0.2122065907891938, 0.9999999999999998,
      0.10003514623967844, 0.0031672625490924444, 2.2507902271244603e-07, NAN, NAN, 3.8981718325193755e-17}},
    {TPU_OP_ERFCX,
     {-30.0, -26.0, -3.0, -0.5, 0.0, 1e-10, 0.7, 5.0, 7.9, 8.1, 50.0, 1e+200},
     {0},
     {INFINITY, 7.657724931490568e+293, 16205.988853999586, 1.952360489182557, 1.0, 0.9999999998871619,
      0.525930337349441, 0.11070463773306861, 0.07085747736739714, 0.06913392017734317, 0.011281536265323772,
      5.641895835477563e-201}},
    {TPU_OP_NDTRI,
     {0.0, 1.0, -0.1, 1.1, 0.5, 1e-300, 1e-20, 0.02, 0.25, 0.7, 0.999999, NAN},
     {0},
     {-INFINITY, INFINITY, NAN, NAN, 0.0, -37.0470962993612, -9.262340089798409, -2.053748910631823,
      -0.6744897501960817, 0.5244005127080407, 4.753424308817087, NAN}},
    {TPU_OP_LOG_NDTR,
     {-10000000000.0, -40.0, -5.0, -1.0, -0.999, 0.0, 1.0, 3.0, 10.0, INFINITY, -INFINITY, NAN},
     {0},
     {-5.000000000000001e+19, -804.6084420137539, -15.064998393988727, -1.841021645009264, -1.8394969101647778,
      -0.6931471805599453, -0.17275377902344985, -0.0013508099647481923, -7.619853024160498e-24, -0.0, -INFINITY, NAN}},
    {TPU_OP_BESSEL_J0,
     {0.0, 1e-06, 1.0, -2.4048, 4.99, 5.0, 5.01, 12.5, -30.0, 10000.0, INFINITY, NAN},
     {0},
     {1.0, 0.99999999999975, 0.7651976865579665, 1.3268284301136943e-05, -0.18086691229166424, -0.17759678121123898,
      -0.17431580495335844, 0.14688405469441415, -0.08636798358104034, -0.007096160353386842, NAN, NAN}},
    {TPU_OP_BESSEL_J1,
     {0.0, -1e-06, 1.0, -3.8, 4.99, 5.0, 5.01, 12.5, -30.0, 10000.0, INFINITY, NAN},
     {0},
     {0.0, -4.999999999999375e-07, 0.44005058574493355, -0.012821002930298727, -0.32644149644132375,
      -0.3275791437359959, -0.328683549198815, -0.16548380460322024, 0.11875106261662309, 0.0036474507555281114, NAN,
      NAN}},
    {TPU_OP_BESSEL_Y0,
     {0.0, -1.0, 1e-06, 0.89, 2.0, 5.0, 5.01, 12.5, 30.0, 10000.0, INFINITY, NAN},
     {0},
     {-INFINITY, NAN, -8.869031481659443, -0.0031519646830523392, 0.5103756726497742, -0.3085176376345636,
      -0.3099791420766963, -0.17121430684992747, -0.11729573168666393, 0.003647805558990419, NAN, NAN}},
    {TPU_OP_BESSEL_Y1,
     {0.0, -1.0, 1e-06, 0.5, 2.2, 5.0, 5.01, 12.5, 30.0, 10000.0, INFINITY, NAN},
     {0},
     {-INFINITY, NAN, -636619.772372175, -1.4714723926702433, 0.0014877892897788116, 0.14786315225770025,
      0.14447772351594593, -0.15383825655068392, 0.08442557066174709, 0.0070963427525372515, NAN, NAN}},
    {TPU_OP_MBESSEL_I0,
     {0.0, -1.0, 0.5, 2.0, 7.9, 8.1, -20.0, 50.0, 700.0, INFINITY, -INFINITY, NAN},
     {0},
     {1.0, 1.2660658777520082, 1.0634833707413236, 2.279585302336067, 389.406283282158, 469.5006067101214,
      43558282.559553534, 2.9325537838493355e+20, 1.5295933476718735e+302, NAN, NAN, NAN}},
    {TPU_OP_MBESSEL_I1,
     {0.0, -1.0, 0.5, 2.0, 7.9, 8.1, -20.0, 50.0, 700.0, INFINITY, -INFINITY, NAN},
     {0},
     {0.0, -0.5651591039924851, 0.25789430539089636, 1.5906368546373295, 363.8539440845084, 439.48430891035844,
      -42454973.385127775, 2.9030785901035566e+20, 1.5285003902339006e+302, NAN, NAN, NAN}},
    {TPU_OP_MBESSEL_K0,
     {0.0, -1.0, 1e-10, 0.5, 2.0, 2.01, 10.0, 100.0, 800.0, INFINITY, -INFINITY, NAN},
     {0},
     {INFINITY, NAN, 23.141782445598864, 0.924419071227666, 0.1138938727495334, 0.11250436099872804,
      1.778006231616765e-05, 4.6566282291759025e-45, 0.0, 0.0, NAN, NAN}},
    {TPU_OP_MBESSEL_K1,
     {0.0, -1.0, 1e-10, 0.5, 2.0, 2.01, 10.0, 100.0, 800.0, INFINITY, -INFINITY, NAN},
     {0},
     {INFINITY, NAN, 10000000000.0, 1.6564411200033007, 0.13986588181652246, 0.1380408773192077, 1.8648773453825585e-05,
      4.67985373563691e-45, 0.0, 0.0, NAN, NAN}},
    {TPU_OP_MBESSEL_K0E,
     {0.0, -1.0, 1e-10, 0.5, 2.0, 2.01, 10.0, 100.0, 800.0, INFINITY, -INFINITY, NAN},
     {0},
     {INFINITY, NAN, 23.14178244791304, 1.5241093857739099, 0.8415682150707712, 0.8396557490908679, 0.39163193443659866,
      0.1251756216591266, 0.04430442748664601, 0.0, NAN, NAN}},
    {TPU_OP_MBESSEL_K1E,
     {0.0, -1.0, 1e-10, 0.5, 2.0, 2.01, 10.0, 100.0, 800.0, INFINITY, -INFINITY, NAN},
     {0},
     {INFINITY, NAN, 10000000001.0, 2.7310097082117855, 1.0334768470686888, 1.0302428743356034, 0.4107665705957887,
      0.12579995047957854, 0.04433210911141211, 0.0, NAN, NAN}},
    {TPU_OP_AIRY_AI,
     {-50.0, -5.0, -2.1, -2.0, 0.0, 1.0, 2.0, 2.1, 8.0, 9.0, 110.0, INFINITY},
     {0},
     {-0.16188142361232175, 0.35076100902415286, 0.16348733360139633, 0.22740742820168564, 0.3550280538878172,
      0.13529241631288144, 0.03492413042327433, 0.029952602115866516, 4.692207616099224e-08, 2.4711684308724895e-09,
      0.0, NAN}},
    {TPU_OP_SPHERICAL_J0,
     {0.0, -0.0, 0.25, -0.49, 0.5, 1.0, 3.14, -10.0, 100000.0, INFINITY, -INFINITY, NAN},
     {0},
     {1.0, 1.0, 0.9896158370180917, 0.9604609962676695, 0.958851077208406, 0.8414709848078965, 0.0005072143046136395,
      -0.05440211108893698, 3.574879797201651e-07, 0.0, 0.0, NAN}},
    {TPU_OP_ZETA,
     {1.0, 0.5, 2.0, 2.0, 3.0, 4.5, 2.0, 3.0, INFINITY, INFINITY, 20.0, NAN},
     {1.0, 1.0, 1.0, 0.0, -2.5, 0.3, -1.0, 100.0, 1.0, 2.0, 1.5, 1.0},
     {INFINITY, NAN, 1.6449340668482266, INFINITY, 0.0541020258208641, 225.73807390399492, INFINITY,
      5.0502499916675004e-05, 1.0, NAN, 0.0003007396681671844, NAN}},
    {TPU_OP_IGAMMA,
     {0.0, 0.0, -1.0, 1.0, 0.5, 3.0, 3.0, 25.0, 300.0, 0.001, INFINITY, 2.0},
     {0.0, 1.0, 1.0, 0.0, 0.2, 1.5, 10.0, 24.0, 310.0, 0.7, 1.0, INFINITY},
     {NAN, 1.0, NAN, 0.0, 0.47291074313446185, 0.19115316946194183, 0.9972306042844884, 0.44599877692500434,
      0.7224887541718611, 0.9996259466340252, 0.0, 1.0}},
    {TPU_OP_IGAMMAC,
     {0.0, 0.0, -1.0, 1.0, 0.5, 3.0, 3.0, 25.0, 300.0, 0.001, INFINITY, 2.0},
     {0.0, 1.0, 1.0, 0.0, 0.2, 1.5, 10.0, 24.0, 310.0, 0.7, 1.0, INFINITY},
     {NAN, 0.0, NAN, 1.0, 0.5270892568655381, 0.8088468305380582, 0.0027693957155115775, 0.5540012230749957,
      0.2775112458281389, 0.0003740533659748942, 1.0, 0.0}},
    {TPU_OP_CHEBYSHEV_T,
     {0.3, -1.0, 1.0, 0.5, 2.0, -1.5, 0.3, 0.99, NAN, 0.3, 3.0, 0.3},
     {-1.0, 3.0, 5.0, 0.0, 1.0, 4.0, 7.0, 50.0, 3.0, INFINITY, 1000.0, NAN},
     {0.0, -1.0, 1.0, 1.0, 2.0, 23.5, -0.8461632000000004, 0.7011491981769286, NAN, 0.0, NAN, 0.0}},
    {TPU_OP_CHEBYSHEV_U,
     {0.3, -1.0, 1.0, 0.5, 2.0, -1.5, 0.3, 0.99, 0.0, 0.3, 3.0, 0.6},
     {-1.0, 3.0, 5.0, 0.0, 1.0, 4.0, 9.0, 50.0, 11.0, 2.5, 1000.0, 30.0},
     {0.0, -4.0, 6.0, 1.0, 4.0, 55.0, 0.09908889600000047, 5.705031333482098, -7.347880794884119e-16, -0.64, NAN,
      -0.5681328706619254}},
    {TPU_OP_CHEBYSHEV_V,
     {0.3, -1.0, 1.0, 0.5, 2.0, -1.5, 0.3, 0.99, -0.9, 0.3, 3.0, 0.6},
     {-1.0, 3.0, 5.0, 0.0, 1.0, 4.0, 9.0, 50.0, 11.0, 2.5, 1000.0, 30.0},
     {0.0, -7.0, 1.0, 1.0, 3.0, 76.0, 1.064884736000001, 0.6506049341839472, 3.978224865279997, -1.24, NAN,
      -1.1179966727514776}},
    {TPU_OP_CHEBYSHEV_W,
     {0.3, -1.0, 1.0, 0.5, 2.0, -1.5, 0.3, 0.99, -0.9, 0.3, 3.0, 0.6},
     {-1.0, 3.0, 5.0, 0.0, 1.0, 4.0, 9.0, 50.0, 11.0, 2.5, 1000.0, 30.0},
     {0.0, -1.0, 11.0, 1.0, 5.0, 34.0, -0.866706943999998, 10.759457732780248, -0.4686894899200012,
      -0.03999999999999998, NAN, -0.01826906857236727}},
    {TPU_OP_SCHEBYSHEV_T,
     {0.3, 0.0, 1.0, 0.5, 2.0, -1.5, 0.3, 0.99, 0.6, 0.3, 3.0, 0.6},
     {-1.0, 3.0, 5.0, 0.0, 1.0, 4.0, 9.0, 50.0, 11.0, 2.5, 1000.0, 30.0},
     {0.0, -1.0, 1.0, 1.0, 3.0, 1921.0, 0.5329295360000004, -0.8298462974575936, -0.79961602048, -0.6799999999999999,
      NAN, -0.9707532449271682}},
    {TPU_OP_SCHEBYSHEV_U,
     {0.3, 0.0, 1.0, 0.5, 2.0, -1.5, 0.3, 0.99, 0.6, 0.3, 3.0, 0.6},
     {-1.0, 3.0, 5.0, 0.0, 1.0, 4.0, 9.0, 50.0, 11.0, 2.5, 1000.0, 30.0},
     {0.0, -4.0, 6.0, 1.0, 6.0, 3905.0, 0.9022238719999996, -3.5777815174474576, -0.6770370969600014,
      -0.35999999999999993, NAN, -1.0197592553848038}},
    {TPU_OP_SCHEBYSHEV_V,
     {0.3, 0.0, 1.0, 0.5, 2.0, -1.5, 0.3, 0.99, 0.6, 0.3, 3.0, 0.6},
     {-1.0, 3.0, 5.0, 0.0, 1.0, 4.0, 9.0, 50.0, 11.0, 2.5, 1000.0, 30.0},
     {0.0, -7.0, 1.0, 1.0, 5.0, 4401.0, 1.825459712, -0.7737659868455545, -1.28993171456, 0.4400000000000001, NAN,
      -0.7747292030966275}},
    {TPU_OP_SCHEBYSHEV_W,
     {0.3, 0.0, 1.0, 0.5, 2.0, -1.5, 0.3, 0.99, 0.6, 0.3, 3.0, 0.6},
     {-1.0, 3.0, 5.0, 0.0, 1.0, 4.0, 9.0, 50.0, 11.0, 2.5, 1000.0, 30.0},
     {0.0, -1.0, 11.0, 1.0, 7.0, 3409.0, -0.021011968000000072, -6.3817970480493615, -0.06414247936000009, -1.16, NAN,
      -1.2647893076729801}},
    {TPU_OP_HERMITE_H,
     {0.3, -1.0, 1.0, 0.5, 2.0, -1.5, 0.3, 3.0, 0.6, 0.3, 3.0, 0.6},
     {-1.0, 3.0, 5.0, 0.0, 1.0, 4.0, 9.0, 50.0, 512.0, 513.0, NAN, 2.5},
     {0.0, 4.0, -8.0, 1.0, 4.0, -15.0, 7010.287658496, 2.6751882008697086e+40, NAN, NAN, 0.0, -0.56}},
    {TPU_OP_HERMITE_HE,
     {0.3, -1.0, 1.0, 0.5, 2.0, -1.5, 0.3, 3.0, 0.6, 0.3, 3.0, 0.6},
     {-1.0, 3.0, 5.0, 0.0, 1.0, 4.0, 9.0, 50.0, 512.0, 513.0, NAN, 2.5},
     {0.0, 2.0, 6.0, 1.0, 2.0, -5.4375, 250.390686483, 3.780513387447901e+32, NAN, NAN, 0.0, -0.64}},
    {TPU_OP_LAGUERRE_L,
     {0.3, -1.0, 1.0, 0.0, 2.0, -1.5, 0.3, 3.0, 0.6, 0.3, 30.0, 0.6},
     {-1.0, 3.0, 5.0, 7.0, 1.0, 4.0, 9.0, 50.0, 200.0, 0.0, 20.0, 2.5},
     {0.0, 5.666666666666667, -0.4666666666666667, 1.0, -1.0, 16.2109375, -0.41794299755200853, 0.1463786536365345,
      -0.1520023595978335, 1.0, -18439.42450252093, -0.01999999999999999}},
    {TPU_OP_LEGENDRE_P,
     {0.3, -1.0, 1.0, 0.0, 2.0, -1.5, 0.3, 3.0, 0.6, 0.3, 30.0, 0.6},
     {-1.0, 3.0, 5.0, 7.0, 1.0, 4.0, 9.0, 50.0, 200.0, 0.0, 20.0, 2.5},
     {0.0, -1.0, 1.0, -0.0, 2.0, 14.0859375, 0.0637003817578125, 1.5310086199495848e+37, -0.06152006601258287, 1.0,
      4.55899557850866e+34, 0.039999999999999925}},
    {TPU_OP_LOGADDEXP2,
     {0.0, 1.0, -INFINITY, INFINITY, INFINITY, -INFINITY, NAN, 1000.0, -3.0, 2.5, 0.5, -100.0},
     {0.0, 2.0, -INFINITY, INFINITY, -INFINITY, 3.0, 1.0, 1000.0, 5.0, 2.5, -0.5, -101.0},
     {1.0, 2.584962500721156, -INFINITY, INFINITY, INFINITY, 3.0, NAN, 1001.0, 5.005624549193878, 3.5,
      1.084962500721156, -99.41503749927884}},
    {TPU_OP_FMAX,
     {0.0, 1.0, NAN, 2.0, NAN, -INFINITY, -0.0, 3.0, -1.0, INFINITY, 0.5, -2.0},
     {-0.0, 2.0, 1.0, NAN, NAN, 1.0, 0.0, 3.0, -2.0, 1.0, 0.25, -1.0},
     {0.0, 2.0, 1.0, 2.0, NAN, 1.0, -0.0, 3.0, -1.0, INFINITY, 0.5, -1.0}},
    {TPU_OP_FMIN,
     {0.0, 1.0, NAN, 2.0, NAN, -INFINITY, -0.0, 3.0, -1.0, INFINITY, 0.5, -2.0},
     {-0.0, 2.0, 1.0, NAN, NAN, 1.0, 0.0, 3.0, -2.0, 1.0, 0.25, -1.0},
     {0.0, 1.0, 1.0, 2.0, NAN, -INFINITY, -0.0, 3.0, -2.0, 1.0, 0.25, -2.0}},
};

static const int64_t gold_xi[8] = {-7, -3, -1, 0, 1, 2, 5, 9};
static const int64_t gold_yi[8] = {2, -3, 4, 1, -2, 3, 2, -4};
static const int64_t gold_pi[8] = {0, 1, 2, 3, 1, 2, 3, 0};
static const gold_ew_i gold_i64[] = {
    {TPU_OP_NEG, "x", {0.0, 0.0, 0.0}, {0, 0}, {7, 3, 1, 0, -1, -2, -5, -9}},
    {TPU_OP_ABS, "x", {0.0, 0.0, 0.0}, {0, 0}, {7, 3, 1, 0, 1, 2, 5, 9}},
    {TPU_OP_SIGN, "x", {0.0, 0.0, 0.0}, {0, 0}, {-1, -1, -1, 0, 1, 1, 1, 1}},
    {TPU_OP_RELU, "x", {0.0, 0.0, 0.0}, {0, 0}, {0, 0, 0, 0, 1, 2, 5, 9}},
    {TPU_OP_BITWISE_NOT, "x", {0.0, 0.0, 0.0}, {0, 0}, {6, 2, 0, -1, -2, -3, -6, -10}},
    {TPU_OP_LOGICAL_NOT, "x", {0.0, 0.0, 0.0}, {0, 0}, {0, 0, 0, 1, 0, 0, 0, 0}},
    {TPU_OP_CLAMP, "x", {-2.0, 4.0, 0.0}, {0, 0}, {-2, -2, -1, 0, 1, 2, 4, 4}},
    {TPU_OP_ADD, "xy", {2.0, 0.0, 0.0}, {0, 0}, {-3, -9, 7, 2, -3, 8, 9, 1}},
    {TPU_OP_SUB, "xy", {3.0, 0.0, 0.0}, {0, 0}, {-13, 6, -13, -3, 7, -7, -1, 21}},
    {TPU_OP_MUL, "xy", {0.0, 0.0, 0.0}, {0, 0}, {-14, 9, -4, 0, -2, 6, 10, -36}},
    {TPU_OP_DIV_TRUNC, "xy", {0.0, 0.0, 0.0}, {0, 0}, {-3, 1, 0, 0, 0, 0, 2, -2}},
    {TPU_OP_DIV_FLOOR, "xy", {0.0, 0.0, 0.0}, {0, 0}, {-4, 1, -1, 0, -1, 0, 2, -3}},
    {TPU_OP_FMOD, "xy", {0.0, 0.0, 0.0}, {0, 0}, {-1, 0, -1, 0, 1, 2, 1, 1}},
    {TPU_OP_REMAINDER, "xy", {0.0, 0.0, 0.0}, {0, 0}, {1, 0, 3, 0, -1, 2, 1, -3}},
    {TPU_OP_POW, "xp", {0.0, 0.0, 0.0}, {0, 0}, {1, -3, 1, 0, 1, 4, 125, 1}},
    {TPU_OP_MAXIMUM, "xy", {0.0, 0.0, 0.0}, {0, 0}, {2, -3, 4, 1, 1, 3, 5, 9}},
    {TPU_OP_MINIMUM, "xy", {0.0, 0.0, 0.0}, {0, 0}, {-7, -3, -1, 0, -2, 2, 2, -4}},
    {TPU_OP_BITWISE_AND, "xy", {0.0, 0.0, 0.0}, {0, 0}, {0, -3, 4, 0, 0, 2, 0, 8}},
    {TPU_OP_BITWISE_OR, "xy", {0.0, 0.0, 0.0}, {0, 0}, {-5, -3, -1, 1, -1, 3, 7, -3}},
    {TPU_OP_BITWISE_XOR, "xy", {0.0, 0.0, 0.0}, {0, 0}, {-5, 0, -5, 1, -1, 1, 7, -11}},
    {TPU_OP_LT, "xy", {0.0, 0.0, 0.0}, {0, 0}, {1, 0, 1, 1, 0, 1, 0, 0}},
    {TPU_OP_GE, "xy", {0.0, 0.0, 0.0}, {0, 0}, {0, 1, 0, 0, 1, 0, 1, 1}},
    {TPU_OP_LOGICAL_XOR, "xy", {0.0, 0.0, 0.0}, {0, 0}, {0, 0, 0, 1, 0, 0, 0, 0}},
    {TPU_OP_GCD, "xy", {0.0, 0.0, 0.0}, {0, 0}, {1, 3, 1, 1, 1, 1, 1, 1}},
    {TPU_OP_LCM, "xy", {0.0, 0.0, 0.0}, {0, 0}, {14, 3, 4, 0, 2, 6, 10, 36}},
};
static const float gold_m[15] = {0.5, -1.25, 2.0, 3.5, -0.75, 1.0, 1.0, -2.5, 0.25, 4.0, -3.0, 0.125, 0.5, NAN, 2.0};
static const gold_red gold_reds[] = {
    {TPU_OP_SUM, 0, 0.0, 0, {-1.5, -0.125, 0.0, NAN, 5.25}},
    {TPU_OP_SUM, 1, 0.0, 0, {4.0, 3.75, NAN, 0.0, 0.0}},
    {TPU_OP_MEAN, 0, 0.0, 0, {-0.5, -0.0416666679084301, 0.0, NAN, 1.75}},
    {TPU_OP_MEAN, 1, 0.0, 0, {0.800000011920929, 0.75, NAN, 0.0, 0.0}},
    {TPU_OP_PROD, 0, 0.0, 0, {-1.5, -0.15625, -2.5, NAN, -6.0}},
    {TPU_OP_PROD, 1, 0.0, 0, {3.28125, -2.5, NAN, 0.0, 0.0}},
    {TPU_OP_AMAX, 0, 0.0, 0, {1.0, 1.0, 2.0, NAN, 4.0}},
    {TPU_OP_AMAX, 1, 0.0, 0, {3.5, 4.0, NAN, 0.0, 0.0}},
    {TPU_OP_AMIN, 0, 0.0, 0, {-3.0, -1.25, -2.5, NAN, -0.75}},
    {TPU_OP_AMIN, 1, 0.0, 0, {-1.25, -2.5, NAN, 0.0, 0.0}},
    {TPU_OP_ARGMAX, 0, 0.0, 0, {1.0, 1.0, 0.0, 2.0, 1.0}},
    {TPU_OP_ARGMAX, 1, 0.0, 1, {3.0, 4.0, 3.0, 0.0, 0.0}},
    {TPU_OP_ARGMIN, 0, 0.0, 0, {2.0, 0.0, 1.0, 2.0, 0.0}},
    {TPU_OP_ARGMIN, 1, 0.0, 1, {1.0, 2.0, 3.0, 0.0, 0.0}},
    {TPU_OP_VAR, 0, 1.0, 0, {4.75, 1.2864583730697632, 5.25, NAN, 5.6875}},
    {TPU_OP_VAR, 1, 1.0, 0, {3.856250047683716, 5.375, NAN, 0.0, 0.0}},
    {TPU_OP_STD, 0, 0.0, 0, {1.7795130014419556, 0.9260879755020142, 1.8708287477493286, NAN, 1.9472202062606812}},
    {TPU_OP_STD, 1, 0.0, 0, {1.7564167976379395, 2.0736441612243652, NAN, 0.0, 0.0}},
    {TPU_OP_NORM, 0, 2.0, 0, {3.2015621662139893, 1.6056541204452515, 3.240370273590088, NAN, 4.5345892906188965}},
    {TPU_OP_NORM, 1, 2.0, 0, {4.315669059753418, 4.9307708740234375, NAN, 0.0, 0.0}},
    {TPU_OP_NORM, 1, 3.0, 0, {3.7651243209838867, 4.338125705718994, NAN, 0.0, 0.0}},
    {TPU_OP_NORM, 1, INFINITY, 0, {3.5, 4.0, NAN, 0.0, 0.0}},
    {TPU_OP_NORM, 1, 0.0, 0, {5.0, 5.0, 5.0, 0.0, 0.0}},
    {TPU_OP_LOGSUMEXP, 0, 0.0, 0, {1.4854133129119873, 1.4201968908309937, 2.2104547023773193, NAN, 4.134519577026367}},
    {TPU_OP_LOGSUMEXP, 1, 0.0, 0, {3.7591538429260254, 4.117423057556152, NAN, 0.0, 0.0}},
    {TPU_OP_ANY, 0, 0.0, 0, {1.0, 1.0, 1.0, 1.0, 1.0}},
    {TPU_OP_ALL, 1, 0.0, 0, {1.0, 1.0, 1.0, 0.0, 0.0}},
};

static bool ew_bool_out(tpu_op op) { return (tpu_op_infos[op].dtypes & DT_PRED) != 0; }

static void check_gold_f32(const hten *o, const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double v = tpu_load_f64(hptr(&o->t, i), (tpu_dtype)o->t.dtype);
        bool ok = close_enough(v, want[i], 1e-5, 1e-6);
        CHECK_MSG(ok, "[%s]: element %lld got %.9g want %.9g", case_desc, (long long)i, v, (double)want[i]);
        if (!ok) return;
    }
}

static void test_golden_ew_f32(void) {
    int64_t n = 12;
    for (size_t g = 0; g < sizeof gold_f32 / sizeof gold_f32[0]; g++) {
        const gold_ew *e = &gold_f32[g];
        int nin = (int)strlen(e->ins);
        tpu_params p;
        memset(&p, 0, sizeof p);
        memcpy(p.f, e->f, sizeof e->f);
        p.i[0] = e->i[0];
        p.i[1] = e->i[1];
        p.compute_dtype = TPU_F32;
        hten in[3], of, orf;
        tpu_tensor fops[4], rops[4];
        hmk(&of, ew_bool_out(e->op) ? TPU_BOOL : TPU_F32, 1, &n, LAY_CONTIG, 0);
        hclone(&orf, &of);
        for (int k = 0; k < nin; k++) {
            char c = e->ins[k];
            hmk(&in[k], TPU_F32, 1, &n, LAY_CONTIG, 0);
            hset_f(&in[k], c == 'x' ? gold_x : c == 'y' ? gold_y : c == 'z' ? gold_z : gold_c, n);
            fops[1 + k] = rops[1 + k] = in[k].t;
        }
        fops[0] = of.t;
        rops[0] = orf.t;
        for (int ref = 0; ref < 2; ref++) {
            snprintf(case_desc, sizeof case_desc, "golden %s #%zu %s", tpu_op_name(e->op), g, ref ? "ref" : "fast");
            char err[256];
            tpu_status s = run(ref, e->op, ref ? rops : fops, 1 + nin, &p, err);
            CHECK_MSG(s == TPU_OK, "[%s]: %s", case_desc, err);
            check_gold_f32(ref ? &orf : &of, e->want, n);
        }
        for (int k = 0; k < nin; k++) hfree(&in[k]);
        hfree(&of);
        hfree(&orf);
    }
}

/* Relative tolerance of an op's float64 golden values: the Cephes ports and
 * the polynomials (PyTorch's own algorithms) agree to rounding; the functions
 * computed by other means (series, Newton's method, continued fractions) to a
 * few ulps more. */
static double gold_special_rtol(tpu_op op) {
    switch (op) {
    case TPU_OP_ERFCX:
    case TPU_OP_NDTRI:
    case TPU_OP_LOG_NDTR:
    case TPU_OP_IGAMMA:
    case TPU_OP_IGAMMAC:
    case TPU_OP_MBESSEL_I0:
    case TPU_OP_MBESSEL_I1:
    case TPU_OP_MBESSEL_K0:
    case TPU_OP_MBESSEL_K1:
    case TPU_OP_MBESSEL_K0E:
    case TPU_OP_MBESSEL_K1E: return 1e-12;
    default: return 1e-13; /* near a zero (Y1(2.2), L_50(3)) the CPU's FMAs move the last bits */
    }
}

static void test_golden_special_f64(void) {
    int64_t n = 12;
    for (size_t g = 0; g < sizeof gold_special / sizeof gold_special[0]; g++) {
        const gold_sp *e = &gold_special[g];
        int nin = op_nin[e->op];
        tpu_params p;
        memset(&p, 0, sizeof p);
        p.compute_dtype = TPU_F64;
        hten in[2], o;
        tpu_tensor ops[3];
        for (int k = 0; k < nin; k++) {
            hmk(&in[k], TPU_F64, 1, &n, LAY_CONTIG, 0);
            memcpy(in[k].t.base, k ? e->y : e->x, sizeof e->x);
            ops[1 + k] = in[k].t;
        }
        for (int ref = 0; ref < 2; ref++) {
            hmk(&o, TPU_F64, 1, &n, LAY_CONTIG, 0);
            ops[0] = o.t;
            snprintf(case_desc, sizeof case_desc, "golden f64 %s #%zu %s", tpu_op_name(e->op), g, ref ? "ref" : "fast");
            char err[256];
            tpu_status s = run(ref, e->op, ops, 1 + nin, &p, err);
            CHECK_MSG(s == TPU_OK, "[%s]: %s", case_desc, err);
            for (int64_t i = 0; s == TPU_OK && i < n; i++) {
                double v = ((double *)o.t.base)[i], w = e->want[i];
                bool ok = (v != v && w != w) || v == w || fabs(v - w) <= gold_special_rtol(e->op) * fabs(w);
                CHECK_MSG(ok, "[%s]: element %lld (x %.17g) got %.17g want %.17g", case_desc, (long long)i, e->x[i], v,
                          w);
            }
            hfree(&o);
        }
        for (int k = 0; k < nin; k++) hfree(&in[k]);
    }
}

static void test_golden_ew_i64(void) {
    int64_t n = 8;
    for (size_t g = 0; g < sizeof gold_i64 / sizeof gold_i64[0]; g++) {
        const gold_ew_i *e = &gold_i64[g];
        int nin = (int)strlen(e->ins);
        tpu_params p;
        memset(&p, 0, sizeof p);
        memcpy(p.f, e->f, sizeof e->f);
        p.i[0] = e->i[0];
        p.i[1] = e->i[1];
        p.compute_dtype = TPU_I64;
        hten in[2], o;
        tpu_tensor ops[3];
        for (int k = 0; k < nin; k++) {
            char c = e->ins[k];
            const int64_t *src = c == 'x' ? gold_xi : c == 'y' ? gold_yi : gold_pi;
            hmk(&in[k], TPU_I64, 1, &n, LAY_CONTIG, 0);
            for (int64_t i = 0; i < n; i++) ((int64_t *)in[k].t.base)[i] = src[i];
            ops[1 + k] = in[k].t;
        }
        for (int ref = 0; ref < 2; ref++) {
            hmk(&o, ew_bool_out(e->op) ? TPU_BOOL : TPU_I64, 1, &n, LAY_CONTIG, 0);
            ops[0] = o.t;
            snprintf(case_desc, sizeof case_desc, "golden int64 %s #%zu %s", tpu_op_name(e->op), g,
                     ref ? "ref" : "fast");
            char err[256];
            tpu_status s = run(ref, e->op, ops, 1 + nin, &p, err);
            CHECK_MSG(s == TPU_OK, "[%s]: %s", case_desc, err);
            for (int64_t i = 0; i < n && s == TPU_OK; i++) {
                int64_t v = tpu_load_i64(hptr(&o.t, i), (tpu_dtype)o.t.dtype);
                CHECK_MSG(v == e->want[i], "[%s]: element %lld got %lld want %lld", case_desc, (long long)i,
                          (long long)v, (long long)e->want[i]);
            }
            hfree(&o);
        }
        for (int k = 0; k < nin; k++) hfree(&in[k]);
    }
}

static void test_golden_reduce(void) {
    int64_t sz[2] = {3, 5};
    hten m;
    hmk(&m, TPU_F32, 2, sz, LAY_CONTIG, 0);
    hset_f(&m, gold_m, 15);
    for (size_t g = 0; g < sizeof gold_reds / sizeof gold_reds[0]; g++) {
        const gold_red *e = &gold_reds[g];
        int64_t osz[2] = {e->dim == 0 ? 1 : 3, e->dim == 1 ? 1 : 5};
        bool arg = e->op == TPU_OP_ARGMAX || e->op == TPU_OP_ARGMIN;
        tpu_dtype odt = arg ? TPU_I64 : (e->op == TPU_OP_ANY || e->op == TPU_OP_ALL) ? TPU_BOOL : TPU_F32;
        tpu_params p;
        memset(&p, 0, sizeof p);
        p.f[0] = e->f0;
        p.i[0] = e->i0;
        for (int ref = 0; ref < 2; ref++) {
            hten o;
            hmk(&o, odt, 2, osz, LAY_CONTIG, 0);
            tpu_tensor ops[2] = {o.t, m.t};
            snprintf(case_desc, sizeof case_desc, "golden %s dim %d p %g %s", tpu_op_name(e->op), e->dim, e->f0,
                     ref ? "ref" : "fast");
            char err[256];
            tpu_status s = run(ref, e->op, ops, 2, &p, err);
            CHECK_MSG(s == TPU_OK, "[%s]: %s", case_desc, err);
            if (s == TPU_OK) check_gold_f32(&o, e->want, osz[0] * osz[1]);
            hfree(&o);
        }
    }
    hfree(&m);
}

/* ======================= elementwise ======================= */

typedef struct ew_shape {
    const char *name;
    int nd;
    int64_t sizes[4];
    int out_lay, in_lay[3];
    unsigned bmask[3];
    bool inplace; /* the output is input 0 */
    bool big;     /* only for a few dtypes: the reference is slow */
} ew_shape;

static const ew_shape ew_shapes[] = {
    {"7x13", 2, {7, 13}, LAY_CONTIG, {LAY_CONTIG, LAY_CONTIG, LAY_CONTIG}, {0, 0, 0}, false, false},
    {"3x5x11 transposed/bcast/padded",
     3,
     {3, 5, 11},
     LAY_CONTIG,
     {LAY_TRANS, LAY_CONTIG, LAY_PAD},
     {0, 2, 0},
     false,
     false},
    {"1031", 1, {1031}, LAY_CONTIG, {LAY_CONTIG, LAY_CONTIG, LAY_CONTIG}, {0, 0, 0}, false, false},
    {"5x17 padded", 2, {5, 17}, LAY_PAD, {LAY_PAD, LAY_PAD, LAY_TRANS}, {0, 0, 0}, false, false},
    {"31x37 out transposed", 2, {31, 37}, LAY_TRANS, {LAY_CONTIG, LAY_CONTIG, LAY_CONTIG}, {0, 1, 2}, false, false},
    {"19x23 inputs transposed", 2, {19, 23}, LAY_CONTIG, {LAY_TRANS, LAY_TRANS, LAY_TRANS}, {0, 0, 0}, false, false},
    {"0x5 empty", 2, {0, 5}, LAY_CONTIG, {LAY_CONTIG, LAY_CONTIG, LAY_CONTIG}, {0, 0, 0}, false, false},
    {"0-dim", 0, {0}, LAY_CONTIG, {LAY_CONTIG, LAY_CONTIG, LAY_CONTIG}, {0, 0, 0}, false, false},
    {"2x3x67 bcast", 3, {2, 3, 67}, LAY_CONTIG, {LAY_CONTIG, LAY_TRANS, LAY_CONTIG}, {5, 0, 4}, false, false},
    {"300 stride-0 input", 1, {300}, LAY_PAD, {LAY_CONTIG, LAY_CONTIG, LAY_CONTIG}, {1, 0, 0}, false, false},
    {"7x13 in-place", 2, {7, 13}, LAY_CONTIG, {LAY_CONTIG, LAY_TRANS, LAY_CONTIG}, {0, 0, 0}, true, false},
    {"9x257 in-place padded", 2, {9, 257}, LAY_PAD, {LAY_PAD, LAY_CONTIG, LAY_CONTIG}, {0, 1, 0}, true, false},
    {"41x1023 blocks", 2, {41, 1023}, LAY_CONTIG, {LAY_CONTIG, LAY_CONTIG, LAY_PAD}, {0, 1, 0}, false, true},
};
#define N_EW_SHAPES (int)(sizeof ew_shapes / sizeof ew_shapes[0])

/* One elementwise configuration: dtypes, params, generators, scalar input. */
typedef struct ew_cfg {
    tpu_op op;
    int nin;
    tpu_dtype out_dt, in_dt[3];
    tpu_params p;
    vgen gen[3];
    int scalar_in; /* input given as a host scalar, -1 for none */
    double scalar_val;
} ew_cfg;

static void ew_run_shape(const ew_cfg *c, const ew_shape *s) {
    snprintf(case_desc, sizeof case_desc, "%s out %s in %s/%s/%s compute %s i0 %lld f %g,%g,%g scalar %d=%g shape %s",
             tpu_op_name(c->op), tpu_dtype_name(c->out_dt), tpu_dtype_name(c->in_dt[0]),
             c->nin > 1 ? tpu_dtype_name(c->in_dt[1]) : "-", c->nin > 2 ? tpu_dtype_name(c->in_dt[2]) : "-",
             tpu_dtype_name((tpu_dtype)c->p.compute_dtype), (long long)c->p.i[0], c->p.f[0], c->p.f[1], c->p.f[2],
             c->scalar_in, c->scalar_val, s->name);
    bool inplace = s->inplace && c->in_dt[0] == c->out_dt && c->scalar_in != 0 && c->nin > 0;
    hten of, orf, in[3];
    tpu_tensor fops[4], rops[4];
    hmk(&of, c->out_dt, s->nd, s->sizes, s->out_lay, 0);
    if (inplace) hgen(&of, &c->gen[0]);
    hclone(&orf, &of);
    fops[0] = of.t;
    rops[0] = orf.t;
    for (int k = 0; k < c->nin; k++) {
        if (k == c->scalar_in) {
            fops[1 + k] = tpu_dtype_is_float(c->in_dt[k]) ? tpu_tensor_scalar_f(c->scalar_val, c->in_dt[k])
                                                          : tpu_tensor_scalar_i((int64_t)c->scalar_val, c->in_dt[k]);
            rops[1 + k] = fops[1 + k];
        } else if (k == 0 && inplace) {
            fops[1] = of.t;
            rops[1] = orf.t;
        } else {
            hmk(&in[k], c->in_dt[k], s->nd, s->sizes, s->in_lay[k], s->bmask[k]);
            hgen(&in[k], &c->gen[k]);
            fops[1 + k] = rops[1 + k] = in[k].t;
        }
    }
    if (run_both(c->op, fops, rops, 1 + c->nin, &c->p))
        hcmp(&of, &orf, inplace, 1);
    else
        n_runs++;
    for (int k = 0; k < c->nin; k++)
        if (k != c->scalar_in && !(k == 0 && inplace)) hfree(&in[k]);
    hfree(&of);
    hfree(&orf);
}

static void ew_run_all_shapes(const ew_cfg *c, bool big_ok) {
    for (int i = 0; i < N_EW_SHAPES; i++) {
        if (ew_shapes[i].big && !big_ok) continue;
        if (c->scalar_in >= 0 && i > 3) continue; /* scalars: a few shapes are enough */
        ew_run_shape(c, &ew_shapes[i]);
    }
}

enum { K_FLOAT, K_INT, K_BITWISE, K_BOOL_OUT, K_SPECIAL };

/* What the table says about op: its class, its integer form, its dtype rule. */
static int ew_kind(tpu_op op) {
    const tpu_op_info *in = &tpu_op_infos[op];
    if (in->cls < TPU_CLASS_UNARY || in->cls > TPU_CLASS_TERNARY) return K_SPECIAL;
    if (!(in->dtypes & DT_FLOAT)) return K_BITWISE;
    if (in->dtypes & DT_PRED) return K_BOOL_OUT;
    return in->int_form ? K_INT : K_FLOAT;
}

/* The test values of each op's parameters (PF(slot, name, first, second) in
 * ops.def), read from the column's text: the first set, the second, and
 * each parameter alone at its second value. Returns the number of variants
 * (at most EW_MAX_PV); 0 if a parameter lacks its test values. */
#define EW_MAX_PV 8
static const char *const ew_params_text[TPU_OP_COUNT] = {
#define TPU_OP(e, name, fam, nout, nmin, nmax, dtypes, cls, params, ...) #params,
#include "tpu/ops.def"
#undef TPU_OP
};
static int ew_params(tpu_op op, tpu_params *v) {
    int n = 0, slot[6];
    double t[6][2];
    for (const char *q = ew_params_text[op]; (q = strstr(q, "PF(")) != NULL && n < 6; q += 3, n++)
        if (sscanf(q + 3, "%d , %*[A-Za-z_0-9] , %lf , %lf", &slot[n], &t[n][0], &t[n][1]) != 3) return 0;
    int nv = n > 1 ? 2 + n : 2;
    memset(v, 0, EW_MAX_PV * sizeof *v);
    for (int k = 0; k < nv; k++)
        for (int j = 0; j < n; j++) v[k].f[slot[j]] = t[j][k == 1 || k - 2 == j];
    return nv;
}

/* Input generators for op over dtype dt (k = input index). */
static vgen ew_gen(tpu_op op, tpu_dtype dt, int k) {
    bool flt = tpu_dtype_is_float(dt);
    vgen g = {-3, 3, G_SPECIAL};
    if (!flt) g = (vgen){-20, 20, G_EXTREME};
    if (dt == TPU_U8) g.lo = 0, g.hi = 40;
    if (op == TPU_OP_WHERE && k == 0) g = (vgen){0, 1, 0};
    /* a polynomial's degree: Laguerre and Legendre run their recurrence n times (as the CPU's), so
     * an extreme integer degree would take seconds per element */
    if (k == 1 && op >= TPU_OP_CHEBYSHEV_T && op <= TPU_OP_LEGENDRE_P) g = (vgen){-3, 40, flt ? G_SPECIAL : 0};
    if (!flt && k == 1 && (tpu_op_infos[op].dtypes & DT_DIVISOR)) g.flags |= G_NONZERO;
    return g;
}

static void ew_cfg_init(ew_cfg *c, tpu_op op, tpu_dtype in_dt, tpu_dtype out_dt, tpu_dtype cdt, const tpu_params *p) {
    memset(c, 0, sizeof *c);
    c->op = op;
    c->nin = op_nin[op];
    c->out_dt = out_dt;
    c->p = *p;
    c->p.compute_dtype = cdt;
    c->scalar_in = -1;
    for (int k = 0; k < 3; k++) {
        c->in_dt[k] = (op == TPU_OP_WHERE && k == 0) ? TPU_BOOL : in_dt;
        c->gen[k] = ew_gen(op, in_dt, k);
    }
}

/* The scalar-input variants of a configuration. */
static void ew_run_scalars(ew_cfg c) {
    bool ints = !tpu_dtype_is_float(c.in_dt[c.nin - 1]);
    if (c.nin < 2) return;
    c.scalar_in = c.nin - 1;
    if (c.op == TPU_OP_POW) {
        static const double fe[] = {2, 3, 0.5, -0.5, -1, -2, 1.7, 0};
        static const double ie[] = {0, 1, 2, 3, -1};
        int n = ints ? 5 : 8;
        for (int k = 0; k < n; k++) {
            c.scalar_val = ints ? ie[k] : fe[k];
            ew_run_all_shapes(&c, false);
        }
        return;
    }
    c.scalar_val = ints ? 3 : (c.op == TPU_OP_LERP ? 0.7 : 0.75);
    ew_run_all_shapes(&c, false);
    if (c.op == TPU_OP_LERP) {
        c.scalar_val = 0.3;
        ew_run_all_shapes(&c, false);
    }
}

/* The compute dtypes ew_test_op runs op in (a superset of its ops.def rule: test_dtype_rules). */
static bool ew_tested(tpu_op op, tpu_dtype dt) {
    int kind = ew_kind(op);
    bool flt = tpu_dtype_is_float(dt);
    if (kind == K_SPECIAL || (kind == K_BITWISE && flt)) return false;
    return !(kind == K_FLOAT && !flt && dt != TPU_I32 && dt != TPU_I64);
}

static void ew_test_op(tpu_op op) {
    int kind = ew_kind(op);
    for (int di = 0; di < N_ALL; di++) {
        tpu_dtype dt = all_dtypes[di];
        if (!ew_tested(op, dt)) continue;
        tpu_params pv[EW_MAX_PV];
        int np = ew_params(op, pv);
        CHECK_MSG(np > 0, "%s: a parameter without its two test values in ops.def", tpu_op_name(op));
        for (int pi = 0; pi < np; pi++) {
            tpu_dtype out = kind == K_BOOL_OUT ? TPU_BOOL : dt, cdt = dt;
            if (kind == K_FLOAT && dt == TPU_I32) out = cdt = TPU_F32; /* promoted like PyTorch */
            if (kind == K_FLOAT && dt == TPU_I64) out = TPU_F32;       /* integer compute: double math */
            ew_cfg c;
            ew_cfg_init(&c, op, dt, out, cdt, &pv[pi]);
            ew_run_all_shapes(&c, dt == TPU_F32 || dt == TPU_I64);
            ew_run_scalars(c);
        }
    }
}

static void test_ew_ops(void) {
    for (int op = 0; op < TPU_OP_COUNT; op++)
        if (tpu_op_family_of((tpu_op)op) == TPU_FAM_EW && ew_kind((tpu_op)op) != K_SPECIAL) ew_test_op((tpu_op)op);
}

/* Inputs of different dtypes promoted to a common compute dtype. */
static void test_ew_mixed(void) {
    static const struct {
        tpu_op op;
        tpu_dtype in[3], cdt, out;
        int64_t i0;
    } cases[] = {
        {TPU_OP_ADD, {TPU_F16, TPU_F32}, TPU_F32, TPU_F32, 0},
        {TPU_OP_MUL, {TPU_I32, TPU_F32}, TPU_F32, TPU_F32, 0},
        {TPU_OP_SUB, {TPU_U8, TPU_I8}, TPU_I16, TPU_I16, 0},
        {TPU_OP_LT, {TPU_U8, TPU_I8}, TPU_I16, TPU_BOOL, 0},
        {TPU_OP_DIV, {TPU_I64, TPU_I32}, TPU_F32, TPU_F32, 0},
        {TPU_OP_DIV_FLOOR, {TPU_I8, TPU_I64}, TPU_I64, TPU_I64, 0},
        {TPU_OP_MAXIMUM, {TPU_BF16, TPU_F16}, TPU_F32, TPU_F32, 0},
        {TPU_OP_WHERE, {TPU_BOOL, TPU_I64, TPU_F64}, TPU_F64, TPU_F64, 0},
        {TPU_OP_ADD, {TPU_BOOL, TPU_BOOL}, TPU_BOOL, TPU_BOOL, 0},
        {TPU_OP_EQ, {TPU_F64, TPU_I64}, TPU_F64, TPU_BOOL, 0},
        {TPU_OP_ADDCMUL, {TPU_F32, TPU_F16, TPU_BF16}, TPU_F32, TPU_F32, 0},
        {TPU_OP_MUL, {TPU_F32, TPU_F32}, TPU_F32, TPU_F16, 0},
        {TPU_OP_POW, {TPU_F16, TPU_I32}, TPU_F16, TPU_F16, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tpu_params p;
        memset(&p, 0, sizeof p);
        p.f[0] = 1;
        p.i[0] = cases[i].i0;
        ew_cfg c;
        ew_cfg_init(&c, cases[i].op, cases[i].in[0], cases[i].out, cases[i].cdt, &p);
        for (int k = 0; k < c.nin; k++) {
            c.in_dt[k] = cases[i].in[k];
            c.gen[k] = ew_gen(c.op, cases[i].cdt, k);
            if (!tpu_dtype_is_float(c.in_dt[k])) c.gen[k] = (vgen){k == 0 ? 0 : 1, 9, G_NONZERO};
        }
        ew_run_all_shapes(&c, true);
        ew_run_scalars(c);
    }
}

/* A 0-dim tensor input of a launch of higher rank: read as one element. */
static void test_ew_rank0_input(void) {
    static const tpu_op ops[] = {TPU_OP_ADD, TPU_OP_MUL, TPU_OP_MAXIMUM, TPU_OP_WHERE, TPU_OP_COPY, TPU_OP_FILL};
    int64_t sz[2] = {7, 13};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        tpu_op op = ops[i];
        int nin = op == TPU_OP_FILL ? 1 : op_nin[op];
        hten in[3], of, orf;
        tpu_tensor fo[4], ro[4];
        hmk(&of, TPU_F32, 2, sz, LAY_CONTIG, 0);
        hclone(&orf, &of);
        fo[0] = of.t;
        ro[0] = orf.t;
        for (int k = 0; k < nin; k++) {
            bool rank0 = k == nin - 1;
            hmk(&in[k], op == TPU_OP_WHERE && k == 0 ? TPU_BOOL : TPU_F32, rank0 ? 0 : 2, sz, LAY_CONTIG, 0);
            hgen(&in[k], &(vgen){0, 2, 0});
            fo[1 + k] = ro[1 + k] = in[k].t;
        }
        tpu_params p;
        memset(&p, 0, sizeof p);
        p.f[0] = 1;
        p.compute_dtype = TPU_F32;
        snprintf(case_desc, sizeof case_desc, "%s with a 0-dim last input", tpu_op_name(op));
        if (run_both(op, fo, ro, 1 + nin, &p)) hcmp(&of, &orf, false, 1);
        for (int k = 0; k < nin; k++) hfree(&in[k]);
        hfree(&of);
        hfree(&orf);
    }
}

/* COPY between every pair of dtypes; float sources stay in the target's range. */
static void test_ew_copy(void) {
    for (int a = 0; a < N_ALL; a++) {
        for (int b = 0; b < N_ALL; b++) {
            tpu_dtype src = all_dtypes[a], dst = all_dtypes[b];
            tpu_params p;
            memset(&p, 0, sizeof p);
            ew_cfg c;
            ew_cfg_init(&c, TPU_OP_COPY, src, dst, src, &p);
            if (tpu_dtype_is_float(src)) {
                bool to_int = !tpu_dtype_is_float(dst) && dst != TPU_BOOL;
                c.gen[0] = to_int ? (vgen){dst == TPU_U8 ? 0 : -100, 120, 0} : (vgen){-1e4, 1e4, G_SPECIAL};
            } else {
                c.gen[0] = (vgen){-1000, 1000, G_EXTREME};
            }
            ew_run_all_shapes(&c, a == b || (src == TPU_F32 && dst == TPU_BF16));
            c.scalar_in = 0;
            c.scalar_val = tpu_dtype_is_float(src) ? 2.75 : 77;
            ew_run_shape(&c, &ew_shapes[0]);
            ew_run_shape(&c, &ew_shapes[4]);
        }
    }
}

/* Copies out of views with the last two dims swapped (x.transpose(-1, -2)
 * .contiguous()), the tiled path, for every element size. */
static void test_ew_transpose_copy(void) {
    static const int64_t shapes[][4] = {{2, 19, 23, 0}, {3, 8, 8, 0}, {2, 3, 17, 40}, {2, 1, 9, 33}};
    static const int nds[] = {3, 3, 4, 4};
    static const tpu_dtype dts[] = {TPU_U8, TPU_F16, TPU_F32, TPU_F64, TPU_BOOL};
    for (int si = 0; si < 4; si++) {
        for (int di = 0; di < 5; di++) {
            int nd = nds[si];
            const int64_t *sz = shapes[si];
            hten in, of, orf;
            int64_t isz[4];
            memcpy(isz, sz, sizeof isz);
            isz[nd - 1] = sz[nd - 2];
            isz[nd - 2] = sz[nd - 1];
            hmk(&in, dts[di], nd, isz, LAY_CONTIG, 0); /* contiguous, then viewed transposed */
            hgen(&in, &(vgen){-50, 50, 0});
            int64_t t = in.t.strides[nd - 1];
            in.t.strides[nd - 1] = in.t.strides[nd - 2];
            in.t.strides[nd - 2] = t;
            in.t.sizes[nd - 1] = sz[nd - 1];
            in.t.sizes[nd - 2] = sz[nd - 2];
            hmk(&of, dts[di], nd, sz, LAY_CONTIG, 0);
            hclone(&orf, &of);
            snprintf(case_desc, sizeof case_desc, "transpose copy %s shape #%d", tpu_dtype_name(dts[di]), si);
            tpu_params p;
            memset(&p, 0, sizeof p);
            tpu_tensor fo[2] = {of.t, in.t}, ro[2] = {orf.t, in.t};
            if (run_both(TPU_OP_COPY, fo, ro, 2, &p)) hcmp(&of, &orf, false, 1);
            hfree(&in);
            hfree(&of);
            hfree(&orf);
        }
    }
}

/* FILL from a host scalar or a one-element tensor; ARANGE. */
static void test_ew_fill_arange(void) {
    for (int a = 0; a < N_ALL; a++) {
        tpu_dtype dt = all_dtypes[a];
        bool flt = tpu_dtype_is_float(dt);
        tpu_params p;
        memset(&p, 0, sizeof p);
        ew_cfg c;
        ew_cfg_init(&c, TPU_OP_FILL, dt, dt, dt, &p);
        static const double vals[] = {1.25, 0, -7, NAN};
        for (int v = 0; v < 4; v++) {
            if (!flt && isnan(vals[v])) continue;
            c.scalar_in = 0;
            c.scalar_val = vals[v];
            for (int s = 0; s < N_EW_SHAPES; s++)
                if (!ew_shapes[s].inplace) ew_run_shape(&c, &ew_shapes[s]);
        }
        c.scalar_in = -1; /* a one-element tensor broadcast with stride 0 */
        c.in_dt[0] = flt ? TPU_I32 : TPU_F64;
        c.gen[0] = (vgen){-5, 5, 0};
        ew_shape s1 = ew_shapes[1];
        s1.bmask[0] = 7;
        ew_run_shape(&c, &s1);

        ew_cfg_init(&c, TPU_OP_ARANGE, dt, dt, dt, &p);
        c.p.f[0] = flt ? 1.5 : -5;
        c.p.f[1] = flt ? 0.25 : 3;
        for (int s = 0; s < N_EW_SHAPES; s++)
            if (!ew_shapes[s].inplace) ew_run_shape(&c, &ew_shapes[s]);
    }
}

/* Data-dependent failures must match (and carry PyTorch's message). */
static void test_ew_errors(void) {
    static const tpu_op ops[] = {TPU_OP_DIV_TRUNC, TPU_OP_DIV_FLOOR, TPU_OP_FMOD, TPU_OP_REMAINDER};
    int64_t n = 700;
    for (int i = 0; i < 4; i++) {
        for (int di = 4; di < N_ALL - 1; di++) {
            tpu_dtype dt = all_dtypes[di];
            hten x, y, of, orf;
            hmk(&x, dt, 1, &n, LAY_CONTIG, 0);
            hmk(&y, dt, 1, &n, LAY_CONTIG, 0);
            hmk(&of, dt, 1, &n, LAY_CONTIG, 0);
            hmk(&orf, dt, 1, &n, LAY_CONTIG, 0);
            hgen(&x, &(vgen){-9, 9, 0});
            hgen(&y, &(vgen){1, 9, 0});
            tpu_store_i64(hptr(&y.t, 600), dt, 0);
            tpu_params p;
            memset(&p, 0, sizeof p);
            p.compute_dtype = dt;
            tpu_tensor fo[3] = {of.t, x.t, y.t}, ro[3] = {orf.t, x.t, y.t};
            snprintf(case_desc, sizeof case_desc, "%s %s by zero", tpu_op_name(ops[i]), tpu_dtype_name(dt));
            char ef[256], er[256];
            tpu_status sf = run(false, ops[i], fo, 3, &p, ef), sr = run(true, ops[i], ro, 3, &p, er);
            CHECK_MSG(sf == TPU_ERROR_KERNEL && sr == TPU_ERROR_KERNEL, "[%s]: %d %d", case_desc, sf, sr);
            CHECK_MSG(strcmp(ef, "ZeroDivisionError") == 0 && strcmp(er, ef) == 0, "[%s]: '%s' '%s'", case_desc, ef,
                      er);
            hfree(&x);
            hfree(&y);
            hfree(&of);
            hfree(&orf);
        }
    }
    /* integer ** negative: 1 / x^n truncated, as PyTorch's tensor exponents
     * (a negative scalar exponent is refused at the call, by PyTorch's meta) */
    hten x, o;
    hmk(&x, TPU_I32, 1, &n, LAY_CONTIG, 0);
    hmk(&o, TPU_I32, 1, &n, LAY_CONTIG, 0);
    hgen(&x, &(vgen){-3, 3, 0});
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.compute_dtype = TPU_I32;
    tpu_tensor ops2[3] = {o.t, x.t, tpu_tensor_scalar_i(-2, TPU_I64)};
    for (int ref = 0; ref < 2; ref++) {
        char err[256];
        snprintf(case_desc, sizeof case_desc, "pow int32 ** -2 %s", ref ? "ref" : "fast");
        tpu_status s = run(ref, TPU_OP_POW, ops2, 3, &p, err);
        CHECK_MSG(s == TPU_OK, "[%s]: %s '%s'", case_desc, tpu_status_name(s), err);
        for (int64_t i = 0; i < n && s == TPU_OK; i++) {
            int64_t xv = tpu_load_i64(hptr(&x.t, i), TPU_I32), ov = tpu_load_i64(hptr(&o.t, i), TPU_I32);
            int64_t want = xv == 1 ? 1 : xv == -1 ? 1 : 0;
            if (ov != want) {
                CHECK_MSG(ov == want, "[%s]: %lld ** -2 = %lld", case_desc, (long long)xv, (long long)ov);
                break;
            }
        }
    }
    /* bitwise ops need an integer compute dtype */
    p.compute_dtype = TPU_F32;
    tpu_tensor ops3[3] = {o.t, x.t, x.t};
    for (int ref = 0; ref < 2; ref++) {
        char err[256];
        snprintf(case_desc, sizeof case_desc, "bitwise_and float %s", ref ? "ref" : "fast");
        CHECK_MSG(run(ref, TPU_OP_BITWISE_AND, ops3, 3, &p, err) == TPU_ERROR_NOT_SUPPORTED, "[%s]", case_desc);
    }
    hfree(&x);
    hfree(&o);
}

/* ======================= reductions ======================= */

typedef struct red_shape {
    const char *name;
    int nd;
    int64_t sizes[3];
    int in_lay, out_lay;
    unsigned bmask;
    bool big;
} red_shape;

static const red_shape red_shapes[] = {
    {"7x13", 2, {7, 13}, LAY_CONTIG, LAY_CONTIG, 0, false},
    {"3x5x11 transposed", 3, {3, 5, 11}, LAY_TRANS, LAY_CONTIG, 0, false},
    {"3x5x11 padded", 3, {3, 5, 11}, LAY_PAD, LAY_PAD, 0, false},
    {"1031", 1, {1031}, LAY_CONTIG, LAY_CONTIG, 0, false},
    {"0x5 empty", 2, {0, 5}, LAY_CONTIG, LAY_CONTIG, 0, false},
    {"0-dim", 0, {0}, LAY_CONTIG, LAY_CONTIG, 0, false},
    {"6x9 stride-0 dim 0", 2, {6, 9}, LAY_CONTIG, LAY_CONTIG, 1, false},
    {"67x257 out transposed", 2, {67, 257}, LAY_CONTIG, LAY_TRANS, 0, false},
    {"40x5", 2, {40, 5}, LAY_CONTIG, LAY_PAD, 0, false},
    {"2x70001 split", 2, {2, 70001}, LAY_CONTIG, LAY_CONTIG, 0, true},
    {"40000x3", 2, {40000, 3}, LAY_CONTIG, LAY_CONTIG, 0, true},
};
#define N_RED_SHAPES (int)(sizeof red_shapes / sizeof red_shapes[0])

typedef struct red_cfg {
    tpu_op op;
    tpu_dtype in_dt, out_dt;
    tpu_params p;
    vgen gen;
} red_cfg;

static void red_run(const red_cfg *c, const red_shape *s, unsigned mask) {
    snprintf(case_desc, sizeof case_desc, "%s %s -> %s f0 %g i0 %lld shape %s reduce-mask %u", tpu_op_name(c->op),
             tpu_dtype_name(c->in_dt), tpu_dtype_name(c->out_dt), c->p.f[0], (long long)c->p.i[0], s->name, mask);
    int64_t osz[3];
    for (int d = 0; d < s->nd; d++) osz[d] = (mask >> d & 1) ? 1 : s->sizes[d];
    hten in, of, orf;
    hmk(&in, c->in_dt, s->nd, s->sizes, s->in_lay, s->bmask);
    hgen(&in, &c->gen);
    hmk(&of, c->out_dt, s->nd, osz, s->out_lay, 0);
    hclone(&orf, &of);
    tpu_tensor fo[2] = {of.t, in.t}, ro[2] = {orf.t, in.t};
    if (run_both(c->op, fo, ro, 2, &c->p))
        hcmp(&of, &orf, false, 1);
    else
        n_runs++;
    hfree(&in);
    hfree(&of);
    hfree(&orf);
}

static void red_run_shapes(red_cfg *c) {
    bool arg = c->op == TPU_OP_ARGMAX || c->op == TPU_OP_ARGMIN;
    for (int i = 0; i < N_RED_SHAPES; i++) {
        const red_shape *s = &red_shapes[i];
        if (s->big && c->in_dt != TPU_F32 && c->in_dt != TPU_I32) continue;
        for (unsigned mask = 0; mask < (1u << s->nd) || (s->nd == 0 && mask == 0); mask++) {
            if (arg && s->nd > 0 && mask != 0 && (mask & (mask - 1))) continue; /* one dim */
            if (s->big && mask == 0) continue;
            if (arg) c->p.i[0] = mask ? __builtin_ctz(mask) : 0;
            red_run(c, s, mask);
            if (s->nd == 0) break;
        }
    }
}

static void test_red_ops(void) {
    for (int op = 0; op < TPU_OP_COUNT; op++) {
        if (tpu_op_family_of((tpu_op)op) != TPU_FAM_RED) continue;
        bool int_ok = op == TPU_OP_SUM || op == TPU_OP_PROD || op == TPU_OP_AMAX || op == TPU_OP_AMIN ||
                      op == TPU_OP_ANY || op == TPU_OP_ALL || op == TPU_OP_ARGMAX || op == TPU_OP_ARGMIN ||
                      op == TPU_OP_MEAN;
        for (int di = 0; di < N_ALL; di++) {
            tpu_dtype dt = all_dtypes[di];
            bool flt = tpu_dtype_is_float(dt);
            if (!flt && !int_ok) continue;
            red_cfg c;
            memset(&c, 0, sizeof c);
            c.op = (tpu_op)op;
            c.in_dt = dt;
            c.out_dt = dt;
            if (op == TPU_OP_SUM || op == TPU_OP_PROD) c.out_dt = flt ? dt : TPU_I64;
            if (op == TPU_OP_MEAN && !flt) c.out_dt = TPU_F32;
            if (op == TPU_OP_ANY || op == TPU_OP_ALL) c.out_dt = TPU_BOOL;
            if (op == TPU_OP_ARGMAX || op == TPU_OP_ARGMIN) c.out_dt = TPU_I64;
            c.gen = flt ? (vgen){-3, 3, 0} : (vgen){-20, 20, op == TPU_OP_MEAN ? 0 : G_EXTREME};
            if (op == TPU_OP_PROD) c.gen = flt ? (vgen){0.6, 1.5, 0} : (vgen){-3, 3, 0};
            if (op == TPU_OP_ANY || op == TPU_OP_ALL) /* (integers: bytes other than 0 and 1 too) */
                c.gen = flt || dt == TPU_BOOL ? (vgen){0, 1.02, 0} : (vgen){-2, 2.5, 0};
            int nv = op == TPU_OP_VAR || op == TPU_OP_STD ? 3 : op == TPU_OP_NORM ? 7 : 1;
            static const double corr[] = {1, 0, 1e9};
            static const double pn[] = {2, 1, 0, INFINITY, -INFINITY, 3, 0.5};
            for (int v = 0; v < nv; v++) {
                c.p.f[0] = op == TPU_OP_NORM ? pn[v] : corr[v];
                red_run_shapes(&c);
            }
            if (flt) { /* NaN / Inf / -0 among the inputs */
                c.gen.flags |= G_SPECIAL;
                c.p.f[0] = op == TPU_OP_NORM ? 2 : 1;
                red_run(&c, &red_shapes[0], 1);
                red_run(&c, &red_shapes[0], 2);
                red_run(&c, &red_shapes[1], 5);
            }
        }
        if (op == TPU_OP_SUM) { /* narrow integer results wrap */
            red_cfg c = {TPU_OP_SUM, TPU_I8, TPU_I8, {{0}, {0}, 0}, {-120, 120, 0}};
            red_run_shapes(&c);
            c.out_dt = TPU_F32; /* integer input, float output: double math */
            red_run_shapes(&c);
        }
    }
}

/* Empty reductions: neutral values, or a failure when there is no value. */
static void test_red_empty(void) {
    int64_t sz[2] = {3, 0}, osz[2] = {3, 1};
    hten in, o;
    hmk(&in, TPU_F32, 2, sz, LAY_CONTIG, 0);
    static const struct {
        tpu_op op;
        double f0;
        double want;
    } cases[] = {
        {TPU_OP_SUM, 0, 0},   {TPU_OP_MEAN, 0, NAN}, {TPU_OP_PROD, 0, 1},    {TPU_OP_VAR, 1, NAN},
        {TPU_OP_ANY, 0, 0},   {TPU_OP_ALL, 0, 1},    {TPU_OP_NORM, 2, 0},    {TPU_OP_LOGSUMEXP, 0, -INFINITY},
        {TPU_OP_AMAX, 0, -1}, {TPU_OP_AMIN, 0, -1},  {TPU_OP_ARGMAX, 0, -1}, {TPU_OP_NORM, INFINITY, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int ref = 0; ref < 2; ref++) {
            hmk(&o, cases[i].op == TPU_OP_ARGMAX ? TPU_I64 : TPU_F32, 2, osz, LAY_CONTIG, 0);
            tpu_tensor ops[2] = {o.t, in.t};
            tpu_params p;
            memset(&p, 0, sizeof p);
            p.f[0] = cases[i].f0;
            p.i[0] = 1;
            snprintf(case_desc, sizeof case_desc, "empty %s f0 %g %s", tpu_op_name(cases[i].op), cases[i].f0,
                     ref ? "ref" : "fast");
            char err[256];
            tpu_status s = run(ref, cases[i].op, ops, 2, &p, err);
            if (cases[i].want == -1) {
                CHECK_MSG(s == TPU_ERROR_KERNEL, "[%s]: expected a failure, got %s", case_desc, tpu_status_name(s));
            } else {
                CHECK_MSG(s == TPU_OK, "[%s]: %s", case_desc, err);
                for (int64_t k = 0; k < 3 && s == TPU_OK; k++) {
                    double v = tpu_load_f64(hptr(&o.t, k), TPU_F32);
                    CHECK_MSG(close_enough(v, cases[i].want, 0, 0), "[%s]: got %g want %g", case_desc, v,
                              cases[i].want);
                }
            }
            hfree(&o);
        }
    }
    hfree(&in);
}

/* A row of -inf: logsumexp is -inf (the max is replaced by 0). */
static void test_red_logsumexp_inf(void) {
    int64_t sz[2] = {2, 300}, osz[2] = {2, 1};
    hten in, o;
    hmk(&in, TPU_F32, 2, sz, LAY_CONTIG, 0);
    for (int64_t i = 0; i < 600; i++)
        tpu_store_f64(hptr(&in.t, i), TPU_F32, i < 300 ? -INFINITY : (i == 450 ? INFINITY : 1.0));
    for (int ref = 0; ref < 2; ref++) {
        hmk(&o, TPU_F32, 2, osz, LAY_CONTIG, 0);
        tpu_tensor ops[2] = {o.t, in.t};
        tpu_params p;
        memset(&p, 0, sizeof p);
        char err[256];
        snprintf(case_desc, sizeof case_desc, "logsumexp inf rows %s", ref ? "ref" : "fast");
        CHECK_MSG(run(ref, TPU_OP_LOGSUMEXP, ops, 2, &p, err) == TPU_OK, "[%s]: %s", case_desc, err);
        double a = tpu_load_f64(hptr(&o.t, 0), TPU_F32), b = tpu_load_f64(hptr(&o.t, 1), TPU_F32);
        CHECK_MSG(a == -INFINITY && b == INFINITY, "[%s]: got %g %g", case_desc, a, b);
        hfree(&o);
    }
    hfree(&in);
}

/* ======================= scans ======================= */

static void test_scan_ops(void) {
    static const struct {
        tpu_dtype in, out;
    } dts[] = {
        {TPU_F32, TPU_F32}, {TPU_F64, TPU_F64}, {TPU_F16, TPU_F16}, {TPU_BF16, TPU_BF16},
        {TPU_I32, TPU_I64}, {TPU_I64, TPU_I64}, {TPU_U8, TPU_I64},  {TPU_BOOL, TPU_I64},
        {TPU_I8, TPU_I8},   {TPU_F32, TPU_F64}, {TPU_I16, TPU_F32},
    };
    static const struct {
        const char *name;
        int nd;
        int64_t sizes[3];
        int in_lay, out_lay;
    } shapes[] = {
        {"7x13", 2, {7, 13}, LAY_CONTIG, LAY_CONTIG},       {"3x5x11 transposed", 3, {3, 5, 11}, LAY_TRANS, LAY_CONTIG},
        {"3x5x11 padded", 3, {3, 5, 11}, LAY_PAD, LAY_PAD}, {"1031", 1, {1031}, LAY_CONTIG, LAY_TRANS},
        {"0x5", 2, {0, 5}, LAY_CONTIG, LAY_CONTIG},         {"0-dim", 0, {0}, LAY_CONTIG, LAY_CONTIG},
        {"300x41", 2, {300, 41}, LAY_CONTIG, LAY_CONTIG},   {"41x300 out padded", 2, {41, 300}, LAY_CONTIG, LAY_PAD},
    };
    static const tpu_op ops[] = {TPU_OP_CUMSUM, TPU_OP_CUMPROD, TPU_OP_LOGCUMSUMEXP, TPU_OP_CUMMAX, TPU_OP_CUMMIN};
    for (size_t opi = 0; opi < sizeof ops / sizeof ops[0]; opi++) {
        tpu_op op = ops[opi];
        bool prod = op == TPU_OP_CUMPROD, two = op == TPU_OP_CUMMAX || op == TPU_OP_CUMMIN;
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
            bool flt = tpu_dtype_is_float(dts[di].in);
            if (op == TPU_OP_LOGCUMSUMEXP && !flt) continue;
            if (two && dts[di].in != dts[di].out && dts[di].in != TPU_BOOL) continue;
            tpu_dtype odt = two ? dts[di].in : dts[di].out;
            vgen g = flt ? (prod ? (vgen){0.8, 1.25, 0} : (vgen){-3, 3, 0}) : (vgen){prod ? -2 : -20, prod ? 2 : 20, 0};
            if (two && !flt) g = (vgen){-3, 3, 0}; /* ties */
            for (int spec = 0; spec < (flt ? 2 : 1); spec++) {
                if (spec) g.flags |= G_SPECIAL;
                for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                    for (int dim = 0; dim < (shapes[si].nd ? shapes[si].nd : 1); dim++) {
                        snprintf(case_desc, sizeof case_desc, "%s %s -> %s dim %d shape %s%s", tpu_op_name(op),
                                 tpu_dtype_name(dts[di].in), tpu_dtype_name(odt), dim, shapes[si].name,
                                 spec ? " specials" : "");
                        hten in, of, orf, xf, xr;
                        hmk(&in, dts[di].in, shapes[si].nd, shapes[si].sizes, shapes[si].in_lay, 0);
                        hgen(&in, &g);
                        hmk(&of, odt, shapes[si].nd, shapes[si].sizes, shapes[si].out_lay, 0);
                        hclone(&orf, &of);
                        hmk(&xf, TPU_I64, shapes[si].nd, shapes[si].sizes, shapes[si].out_lay, 0);
                        hclone(&xr, &xf);
                        tpu_params p;
                        memset(&p, 0, sizeof p);
                        p.i[0] = dim;
                        tpu_tensor fo[3] = {of.t, in.t}, ro[3] = {orf.t, in.t};
                        if (two) {
                            tpu_tensor fx[3] = {of.t, xf.t, in.t}, rx[3] = {orf.t, xr.t, in.t};
                            memcpy(fo, fx, sizeof fx);
                            memcpy(ro, rx, sizeof rx);
                        }
                        if (run_both(op, fo, ro, two ? 3 : 2, &p)) {
                            hcmp(&of, &orf, false, 1);
                            if (two) hcmp(&xf, &xr, false, 1);
                        }
                        hfree(&in);
                        hfree(&of);
                        hfree(&orf);
                        hfree(&xf);
                        hfree(&xr);
                    }
                }
            }
        }
    }
}

/* ---- the dtype rules of ops.def, as checked at launch ---- */

static tpu_status check_dt(tpu_op op, int n, const tpu_dtype *dts, tpu_dtype compute) {
    tpu_tensor t[TPU_MAX_OPERANDS];
    memset(t, 0, sizeof t);
    for (int k = 0; k < n; k++) t[k].dtype = dts[k];
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.compute_dtype = compute;
    return tpu_op_check_dtypes(op, t, n, &p);
}

static void expect_refused(tpu_op op, int n, const tpu_dtype *dts, tpu_dtype compute, const char *msg) {
    tpu_status s = check_dt(op, n, dts, compute);
    CHECK_MSG(s == TPU_ERROR_NOT_SUPPORTED, "%s: %s", tpu_op_name(op), tpu_status_name(s));
    CHECK_MSG(strcmp(tpu_last_error(), msg) == 0, "'%s' vs '%s'", tpu_last_error(), msg);
}

static void test_dtype_rules(void) {
    for (int op = 0; op < TPU_OP_COUNT; op++) {
        unsigned rule = tpu_op_infos[op].dtypes;
        CHECK_MSG((rule & DT_MASK) != 0 && (rule & DT_MASK & ~DT_ALL) == 0, "%s: rule %#x", tpu_op_name(op), rule);
        /* the operand the rule reads exists in every launch the arity allows */
        if (!(rule & DT_OUT) && tpu_op_family_of(op) != TPU_FAM_EW)
            CHECK_MSG(tpu_op_infos[op].nin_min >= 1, "%s: no input to check", tpu_op_name(op));
        /* every dtype an elementwise rule admits is one the kernels are tested in */
        if (tpu_op_family_of(op) == TPU_FAM_EW && ew_kind(op) != K_SPECIAL)
            for (int d = 0; d < TPU_DTYPE_COUNT; d++)
                if (rule & (1u << d))
                    CHECK_MSG(ew_tested(op, d), "%s admits %s, untested", tpu_op_name(op), tpu_dtype_name(d));
    }
    tpu_dtype i2[2] = {TPU_I64, TPU_I64}, b3[3] = {TPU_BOOL, TPU_BOOL, TPU_BOOL};
    /* elementwise: the compute dtype decides, whatever the operands */
    expect_refused(TPU_OP_BITWISE_AND, 3, (tpu_dtype[]){TPU_F32, TPU_F32, TPU_F32}, TPU_F32,
                   "\"bitwise_and\" not implemented for 'Float'");
    expect_refused(TPU_OP_BITWISE_NOT, 2, (tpu_dtype[]){TPU_BF16, TPU_BF16}, TPU_BF16,
                   "\"bitwise_not\" not implemented for 'BFloat16'");
    CHECK_OK(check_dt(TPU_OP_BITWISE_XOR, 3, b3, TPU_BOOL));
    CHECK_OK(check_dt(TPU_OP_EXP, 2, (tpu_dtype[]){TPU_F32, TPU_I64}, TPU_F32)); /* int input, float compute */
    expect_refused(TPU_OP_EXP, 2, i2, TPU_I64, "\"exp\" not implemented for 'Long'");
    CHECK_OK(check_dt(TPU_OP_LT, 3, (tpu_dtype[]){TPU_BOOL, TPU_U8, TPU_I8}, TPU_I16));
    expect_refused(TPU_OP_SUB, 3, b3, TPU_BOOL, "\"sub\" not implemented for 'Bool'");
    CHECK(check_dt(TPU_OP_ADD, 3, b3, (tpu_dtype)99) == TPU_ERROR_INVALID_VALUE);
    CHECK_OK(check_dt(TPU_OP_COPY, 2, (tpu_dtype[]){TPU_BOOL, TPU_F64}, (tpu_dtype)99)); /* fills: output only */
    expect_refused(TPU_OP_ARANGE, 1, (tpu_dtype[]){TPU_BOOL}, TPU_F32, "\"arange\" not implemented for 'Bool'");
    /* others: the first input */
    expect_refused(TPU_OP_SOFTMAX, 2, (tpu_dtype[]){TPU_F32, TPU_I64}, TPU_F32,
                   "\"softmax\" not implemented for 'Long'");
    expect_refused(TPU_OP_LAYER_NORM, 4, (tpu_dtype[]){TPU_F32, TPU_F32, TPU_F32, TPU_I32}, TPU_F32,
                   "\"layer_norm\" not implemented for 'Int'");
    CHECK_OK(check_dt(TPU_OP_SUM, 2, (tpu_dtype[]){TPU_I64, TPU_BOOL}, TPU_F32));
    expect_refused(TPU_OP_MATMUL, 3, (tpu_dtype[]){TPU_BOOL, TPU_BOOL, TPU_BOOL}, TPU_F32,
                   "\"matmul\" not implemented for 'Bool'");
    /* an absent optional input is a host scalar: the first tensor input decides */
    tpu_tensor t3[3];
    memset(t3, 0, sizeof t3);
    t3[0].dtype = TPU_F32;
    t3[1] = tpu_tensor_scalar_i(0, TPU_I64);
    t3[2].dtype = TPU_I32;
    tpu_params p0;
    memset(&p0, 0, sizeof p0);
    CHECK(tpu_op_check_dtypes(TPU_OP_SOFTMAX_BWD, t3, 3, &p0) == TPU_ERROR_NOT_SUPPORTED);
    CHECK(strcmp(tpu_last_error(), "\"softmax_backward\" not implemented for 'Int'") == 0);
    t3[2].dtype = TPU_BF16;
    CHECK_OK(tpu_op_check_dtypes(TPU_OP_SOFTMAX_BWD, t3, 3, &p0));
    /* DT_OUT: the output (random fills, in-place scatters) */
    expect_refused(TPU_OP_RAND_NORMAL, 1, (tpu_dtype[]){TPU_I64}, TPU_F32, "\"normal\" not implemented for 'Long'");
    expect_refused(TPU_OP_RAND_UNIFORM, 1, (tpu_dtype[]){TPU_U8}, TPU_F32, "\"uniform\" not implemented for 'Byte'");
    CHECK_OK(check_dt(TPU_OP_RAND_UNIFORM, 1, (tpu_dtype[]){TPU_F16}, TPU_I64));
    CHECK_OK(check_dt(TPU_OP_RAND_INT, 1, (tpu_dtype[]){TPU_BOOL}, TPU_F32));
    expect_refused(TPU_OP_SCATTER_ADD, 3, (tpu_dtype[]){TPU_BOOL, TPU_I64, TPU_BOOL}, TPU_F32,
                   "\"scatter_add\" not implemented for 'Bool'");
    CHECK_OK(check_dt(TPU_OP_SCATTER_ADD, 3, (tpu_dtype[]){TPU_I8, TPU_I64, TPU_I8}, TPU_F32));
    /* DT_IN_FLOAT: bernoulli's probabilities must be floating, any output dtype */
    CHECK_OK(check_dt(TPU_OP_RAND_BERNOULLI, 2, (tpu_dtype[]){TPU_BOOL, TPU_BF16}, TPU_F32));
    CHECK_OK(check_dt(TPU_OP_RAND_BERNOULLI, 1, (tpu_dtype[]){TPU_I16}, TPU_F32));
    expect_refused(TPU_OP_RAND_BERNOULLI, 2, (tpu_dtype[]){TPU_F32, TPU_I64}, TPU_F32,
                   "\"bernoulli\" not implemented for 'Long'");
}

int main(void) {
    /* Bring the runtime up so kernels run on its compute pool, as under a launch. */
    if (tpu_init() != TPU_OK) return 1;
    RUN_TEST(test_dtype_rules);
    RUN_TEST(test_golden_ew_f32);
    RUN_TEST(test_golden_special_f64);
    RUN_TEST(test_golden_ew_i64);
    RUN_TEST(test_golden_reduce);
    RUN_TEST(test_ew_ops);
    RUN_TEST(test_ew_mixed);
    RUN_TEST(test_ew_rank0_input);
    RUN_TEST(test_ew_copy);
    RUN_TEST(test_ew_transpose_copy);
    RUN_TEST(test_ew_fill_arange);
    RUN_TEST(test_ew_errors);
    RUN_TEST(test_red_ops);
    RUN_TEST(test_red_empty);
    RUN_TEST(test_red_logsumexp_inf);
    RUN_TEST(test_scan_ops);
    printf("%ld fast-vs-reference comparisons\n", n_runs);
    return TEST_SUMMARY();
}
