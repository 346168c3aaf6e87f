#define _GNU_SOURCE
/* test_bounds.c - no entry point may touch bytes outside a storage.
 *
 * Every runtime entry that touches device memory (kernel launch, copies in
 * every direction, raw copies, fills) is driven with out-of-bounds views:
 * past the end, below the start, overflowing extents, negative strides, a
 * storage size larger than its allocation, a pointer into the middle of an
 * allocation, a freed allocation. Each must be refused with an error before
 * a byte moves, and the raw device memory around the target (read through
 * the device's own address translation: this is the test bench looking at
 * the hardware) must be unchanged.
 *
 * Then a fuzzer throws random sizes, strides, offsets, storage sizes and
 * dtypes at fill, copy (as source and as destination) and the view copies,
 * with an independent oracle: the view is enumerated element by element, and
 * the call must succeed exactly when every element lies in the storage, must
 * write exactly the elements of the view, and nothing else may change.
 * TPU_FUZZ_CASES sets the number of cases (default 400; `make fuzz` runs
 * many more), TPU_FUZZ_SEED the seed. */
#include "tpu/tpu.h"
#include "vtpu/vtpu-impl.h"
#include "test.h"
#include <stdint.h>

#define HBM       (64u << 20)
#define GUARD     4096 /* bytes of raw memory checked on each side of the target */
#define TGT_BYTES 1000 /* the target allocation: not a multiple of the bin size */
#define REGION    (GUARD + 1024 + GUARD)

static void *guard_lo, *tgt, *guard_hi, *scratch; /* scratch lies beyond the checked region */
static unsigned char *raw;                        /* host view of [tgt - GUARD, tgt + 1024 + GUARD) */
static unsigned char model[REGION];               /* what raw must hold */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static int64_t rnd_in(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }

/* Fill the whole region with a fresh pattern, directly (the bench, not the API). */
static void reset_region(void) {
    CHECK_OK(tpu_device_synchronize(0));
    for (int i = 0; i < REGION; i++) model[i] = (unsigned char)(rnd() | 1);
    memcpy(raw, model, REGION);
}

static int region_diff(void) {
    CHECK_OK(tpu_device_synchronize(0));
    for (int i = 0; i < REGION; i++)
        if (raw[i] != model[i]) return i;
    return -1;
}

static void setup(void) {
    /* Guards first so the target is never at the arena's start; distinct bins. */
    CHECK_OK(tpu_malloc(0, 2 * GUARD, NULL, &guard_lo));
    CHECK_OK(tpu_malloc(0, TGT_BYTES, NULL, &tgt));
    CHECK_OK(tpu_malloc(0, 3 * GUARD, NULL, &guard_hi));
    CHECK_OK(tpu_malloc(0, 16 * GUARD, NULL, &scratch));
    raw = (unsigned char *)tpu_dev_to_host(tgt) - GUARD;
}

static tpu_tensor view1(void *base, size_t nbytes, tpu_dtype dt, int64_t off, int64_t n, int64_t stride) {
    tpu_tensor t;
    memset(&t, 0, sizeof t);
    t.base = base;
    t.nbytes = nbytes;
    t.dtype = dt;
    t.offset = off;
    t.ndim = 1;
    t.sizes[0] = n;
    t.strides[0] = stride;
    return t;
}

static tpu_status fill(tpu_tensor out, double v) {
    tpu_tensor ops[2] = {out, tpu_tensor_scalar_f(v, TPU_F64)};
    tpu_params p = {.compute_dtype = out.dtype};
    return tpu_launch(NULL, TPU_OP_FILL, ops, 2, &p);
}

/* Every case here must be refused, and nothing in the region may change. */
static void expect_refused(const char *what, tpu_status s) {
    CHECK_MSG(s != TPU_OK, "%s was accepted", what);
    int d = region_diff();
    CHECK_MSG(d < 0, "%s changed raw byte %d of the region (target starts at %d)", what, d, GUARD);
}

static void test_launch_refuses_out_of_bounds(void) {
    const int64_t nf = TGT_BYTES / 4; /* 250 floats */
    struct {
        const char *what;
        tpu_tensor t;
    } cases[] = {
        {"one past the end", view1(tgt, TGT_BYTES, TPU_F32, 0, nf + 1, 1)},
        {"offset past the end", view1(tgt, TGT_BYTES, TPU_F32, nf, 1, 1)},
        {"stride past the end", view1(tgt, TGT_BYTES, TPU_F32, 0, 2, nf)},
        {"negative offset", view1(tgt, TGT_BYTES, TPU_F32, -1, 2, 1)},
        {"negative stride below 0", view1(tgt, TGT_BYTES, TPU_F32, 3, 5, -1)},
        {"size*stride overflows", view1(tgt, TGT_BYTES, TPU_F32, 0, INT64_MAX / 2, 4)},
        {"offset+extent overflows", view1(tgt, TGT_BYTES, TPU_F32, INT64_MAX - 2, 8, 1)},
        {"storage larger than its allocation", view1(tgt, 4096, TPU_F32, 0, 1024, 1)},
        {"storage bigger by one byte", view1(tgt, TGT_BYTES + 1, TPU_U8, 0, TGT_BYTES + 1, 1)},
        {"pointer into an allocation", view1((char *)tgt + 512, 256, TPU_F32, 0, 4, 1)},
        {"f64 view of an f32 storage's tail", view1(tgt, TGT_BYTES, TPU_F64, 124, 2, 1)},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        reset_region();
        expect_refused(cases[i].what, fill(cases[i].t, 7.0));
        /* As the source of a copy into a valid destination, and as an add operand:
         * the destination has the same size, stride 0 (in bounds whatever the
         * size: every element is element 0). */
        reset_region();
        tpu_tensor ops[2] = {view1(tgt, TGT_BYTES, TPU_F32, 0, cases[i].t.sizes[0], 0), cases[i].t};
        tpu_params p = {.compute_dtype = TPU_F32};
        expect_refused(cases[i].what, tpu_launch(NULL, TPU_OP_COPY, ops, 2, &p));
        reset_region();
        tpu_tensor add[3] = {ops[0], ops[0], cases[i].t};
        p.f[0] = 1.0;
        expect_refused(cases[i].what, tpu_launch(NULL, TPU_OP_ADD, add, 3, &p));
    }
    /* A freed allocation is no storage at all. */
    void *tmp;
    CHECK_OK(tpu_malloc(0, 256, NULL, &tmp));
    CHECK_OK(tpu_free(tmp));
    CHECK(fill(view1(tmp, 256, TPU_F32, 0, 4, 1), 1.0) != TPU_OK);
    CHECK(strstr(tpu_last_error(), "live") != NULL);
    /* Errors name the op and the operand. */
    CHECK(fill(view1(tgt, TGT_BYTES, TPU_F32, 0, 251, 1), 1.0) == TPU_ERROR_INVALID_VALUE);
    CHECK_MSG(strstr(tpu_last_error(), "fill") && strstr(tpu_last_error(), "outside its storage"), "%s",
              tpu_last_error());
    /* The device keeps working: an in-bounds fill of the whole target. */
    reset_region();
    CHECK_OK(fill(view1(tgt, TGT_BYTES, TPU_F32, 0, 250, 1), 2.0));
    float two = 2.0f;
    for (int i = 0; i < 250; i++) memcpy(model + GUARD + 4 * i, &two, 4);
    CHECK(region_diff() < 0);
}

static void test_copies_refuse_out_of_bounds(void) {
    static unsigned char host[8192];
    tpu_tensor h = view1(host, sizeof host, TPU_U8, 0, 1, 1);
    struct {
        const char *what;
        tpu_tensor d;
    } cases[] = {
        {"past the end", view1(tgt, TGT_BYTES, TPU_U8, 900, 101, 1)},
        {"offset past the end", view1(tgt, TGT_BYTES, TPU_U8, 1000, 1, 1)},
        {"storage larger than its allocation", view1(tgt, 1024, TPU_U8, 0, 1024, 1)},
        {"interior pointer", view1((char *)tgt + 8, 16, TPU_U8, 0, 16, 1)},
        {"negative offset", view1(tgt, TGT_BYTES, TPU_U8, -8, 16, 1)},
        {"overflow", view1(tgt, TGT_BYTES, TPU_F64, INT64_MAX / 4, 4, 1)},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tpu_tensor hv = h;
        hv.dtype = cases[i].d.dtype;
        hv.sizes[0] = cases[i].d.sizes[0];
        if (hv.sizes[0] * (int64_t)tpu_dtype_size((tpu_dtype)hv.dtype) > (int64_t)sizeof host) hv.sizes[0] = 1;
        for (int async = 0; async < 2; async++) {
            reset_region();
            expect_refused(cases[i].what, tpu_memcpy_view(&cases[i].d, &hv, TPU_COPY_H2D, NULL, async));
            reset_region();
            memset(host, 0x5a, sizeof host);
            expect_refused(cases[i].what, tpu_memcpy_view(&hv, &cases[i].d, TPU_COPY_D2H, NULL, async));
            for (size_t k = 0; k < sizeof host; k++) CHECK(host[k] == 0x5a);
            tpu_tensor ok = view1(scratch, 16 * GUARD, cases[i].d.dtype, 0, cases[i].d.sizes[0], 1);
            if (ok.sizes[0] * (int64_t)tpu_dtype_size((tpu_dtype)ok.dtype) > 16 * GUARD) ok.sizes[0] = 1;
            reset_region();
            expect_refused(cases[i].what, tpu_memcpy_view(&cases[i].d, &ok, TPU_COPY_D2D, NULL, async));
        }
    }
    /* Host side out of its buffer. */
    reset_region();
    tpu_tensor d = view1(tgt, TGT_BYTES, TPU_U8, 0, 16, 1);
    tpu_tensor hb = view1(host, 8, TPU_U8, 0, 16, 1);
    expect_refused("host view past its buffer", tpu_memcpy_view(&d, &hb, TPU_COPY_H2D, NULL, false));
    /* Mismatched sizes and non-contiguous views. */
    hb = view1(host, sizeof host, TPU_U8, 0, 15, 1);
    expect_refused("size mismatch", tpu_memcpy_view(&d, &hb, TPU_COPY_H2D, NULL, false));
    hb = view1(host, sizeof host, TPU_U8, 0, 16, 2);
    expect_refused("strided host view", tpu_memcpy_view(&d, &hb, TPU_COPY_H2D, NULL, false));
    /* Raw copies take whole allocations only. */
    reset_region();
    expect_refused("raw copy longer than the allocation", tpu_memcpy(tgt, host, TGT_BYTES + 1, TPU_COPY_H2D, NULL));
    expect_refused("raw copy into an interior pointer", tpu_memcpy((char *)tgt + 4, host, 4, TPU_COPY_H2D, NULL));
    expect_refused("raw copy from an interior pointer", tpu_memcpy(host, (char *)tgt + 4, 4, TPU_COPY_D2H, NULL));
    expect_refused("raw device-to-device past the end", tpu_memcpy(tgt, guard_hi, 2048, TPU_COPY_D2D, NULL));
    /* And the valid forms work. */
    reset_region();
    for (int i = 0; i < 100; i++) host[i] = (unsigned char)(i + 1);
    tpu_tensor dv = view1(tgt, TGT_BYTES, TPU_U8, 900, 100, 1), hv = view1(host, sizeof host, TPU_U8, 0, 100, 1);
    CHECK_OK(tpu_memcpy_view(&dv, &hv, TPU_COPY_H2D, NULL, false));
    memcpy(model + GUARD + 900, host, 100);
    CHECK(region_diff() < 0);
}

/* ---- the fuzzer ---- */

typedef struct {
    tpu_tensor t;
    bool in_bounds;
    int64_t n;
    int64_t idx[4096];
} fview;

static const tpu_dtype fdt[] = {TPU_F32, TPU_F64, TPU_F16, TPU_BF16, TPU_U8, TPU_I16, TPU_I32, TPU_I64};

/* A random view of the target with an independent bounds verdict: enumerate
 * every element's index and compare with the storage. */
static void random_view(fview *v) {
    memset(&v->t, 0, sizeof v->t);
    tpu_dtype dt = fdt[rnd() % (sizeof fdt / sizeof fdt[0])];
    int64_t es = (int64_t)tpu_dtype_size(dt);
    int64_t cap = TGT_BYTES / es;
    v->t.base = tgt;
    v->t.dtype = dt;
    int r = (int)(rnd() % 8);
    v->t.nbytes = r == 0 ? TGT_BYTES + (size_t)rnd_in(1, 64) : r == 1 ? (size_t)rnd_in(0, TGT_BYTES) : TGT_BYTES;
    v->t.ndim = (int)rnd_in(0, 4);
    int64_t n = 1;
    for (int d = 0; d < v->t.ndim; d++) {
        v->t.sizes[d] = rnd() % 16 == 0 ? 0 : rnd_in(1, 6);
        int s = (int)(rnd() % 6);
        v->t.strides[d] = s == 0 ? 0 : s == 1 ? -rnd_in(1, 5) : s == 2 ? rnd_in(cap / 8, cap) : rnd_in(1, 12);
        n *= v->t.sizes[d];
    }
    v->t.offset = rnd() % 10 == 0 ? -rnd_in(1, 4) : rnd_in(0, cap + 4);
    if (rnd() % 3 == 0) {
        /* On the edge: the highest (or lowest) element lands just inside or just outside. */
        int64_t pos = 0, neg = 0;
        for (int d = 0; d < v->t.ndim; d++) {
            int64_t e = v->t.sizes[d] > 0 ? (v->t.sizes[d] - 1) * v->t.strides[d] : 0;
            if (e > 0)
                pos += e;
            else
                neg -= e;
        }
        int64_t limit = (int64_t)(v->t.nbytes / (size_t)es);
        v->t.offset = rnd() & 1 ? limit - 1 - pos + rnd_in(0, 1) : neg - rnd_in(0, 1);
    }
    if (rnd() % 50 == 0 && v->t.ndim) { /* an extent that overflows, or (times 4) a numel that does */
        v->t.sizes[0] = INT64_MAX / 3;
        if (v->t.strides[0] == 0) v->t.strides[0] = 1;
        if (v->t.ndim > 1 && rnd() % 2) v->t.sizes[1] = 4;
    }
    bool overflow = false, empty = false;
    for (int d = 0; d < v->t.ndim; d++) {
        if (v->t.sizes[d] > 1000) overflow = true;
        if (v->t.sizes[d] == 0) empty = true;
    }
    v->n = overflow || empty ? 0 : n;
    /* The verdict: a negative offset is always refused; an empty view touches
     * nothing and is accepted; otherwise every element must lie in the
     * storage, and the storage in its allocation. */
    bool ok;
    int64_t nz = 1; /* the product of the non-zero sizes must fit in int64 even when empty */
    bool numel_ovf = false;
    for (int d = 0; d < v->t.ndim; d++)
        if (v->t.sizes[d]) numel_ovf |= __builtin_mul_overflow(nz, v->t.sizes[d], &nz);
    if (v->t.offset < 0 || numel_ovf)
        ok = false;
    else if (empty)
        ok = true;
    else if (overflow)
        ok = false; /* huge size with a non-zero stride: out of any storage */
    else {
        ok = v->t.nbytes <= TGT_BYTES;
        int64_t limit = (int64_t)(v->t.nbytes / (size_t)es);
        for (int64_t i = 0; i < n; i++) {
            int64_t rem = i, idx = v->t.offset;
            for (int d = v->t.ndim - 1; d >= 0; d--) {
                idx += (rem % v->t.sizes[d]) * v->t.strides[d];
                rem /= v->t.sizes[d];
            }
            v->idx[i] = idx;
            if (idx < 0 || idx >= limit) ok = false;
        }
    }
    v->in_bounds = ok;
}

/* Store element value v (as dtype dt) at byte position p of the model. */
static void model_store(unsigned char *p, tpu_dtype dt, double v) {
    switch (dt) {
    case TPU_F32: {
        float x = (float)v;
        memcpy(p, &x, 4);
        break;
    }
    case TPU_F64: memcpy(p, &v, 8); break;
    case TPU_F16: {
        uint16_t x = v == 3.0 ? 0x4200 : 0x4000;
        memcpy(p, &x, 2);
        break;
    } /* 3.0 or 2.0 */
    case TPU_BF16: {
        uint16_t x = v == 3.0 ? 0x4040 : 0x4000;
        memcpy(p, &x, 2);
        break;
    }
    case TPU_U8: *p = (unsigned char)v; break;
    case TPU_I16: {
        int16_t x = (int16_t)v;
        memcpy(p, &x, 2);
        break;
    }
    case TPU_I32: {
        int32_t x = (int32_t)v;
        memcpy(p, &x, 4);
        break;
    }
    case TPU_I64: {
        int64_t x = (int64_t)v;
        memcpy(p, &x, 8);
        break;
    }
    default: break;
    }
}

static fview fv;

static void fuzz_case(int k) {
    int kind = k % 4;
    random_view(&fv);
    size_t es = tpu_dtype_size((tpu_dtype)fv.t.dtype);
    reset_region();
    tpu_status s;
    if (kind == 0) {
        /* fill: the view is written */
        s = fill(fv.t, 3.0);
        if (s == TPU_OK)
            for (int64_t i = 0; i < fv.n; i++)
                model_store(model + GUARD + fv.idx[i] * (int64_t)es, (tpu_dtype)fv.t.dtype, 3.0);
    } else if (kind == 1) {
        /* copy with the view as source into guard_hi (contiguous, same shape): nothing in the region may change */
        tpu_tensor ops[2] = {fv.t, fv.t};
        ops[0].base = scratch;
        ops[0].nbytes = 16 * GUARD;
        ops[0].offset = 0;
        int64_t st = 1;
        for (int d = ops[0].ndim - 1; d >= 0; d--) {
            ops[0].strides[d] = st;
            st *= ops[0].sizes[d] > 0 && ops[0].sizes[d] < 1000 ? ops[0].sizes[d] : 1;
        }
        tpu_params p = {.compute_dtype = fv.t.dtype};
        s = tpu_launch(NULL, TPU_OP_COPY, ops, 2, &p);
    } else if (kind == 2) {
        /* copy into the view from a broadcast scalar-like source in guard_lo */
        tpu_tensor ops[2] = {fv.t, fv.t};
        ops[1].base = guard_lo;
        ops[1].nbytes = 2 * GUARD;
        ops[1].offset = 0;
        for (int d = 0; d < ops[1].ndim; d++) ops[1].strides[d] = 0;
        tpu_params p = {.compute_dtype = fv.t.dtype};
        CHECK_OK(fill(view1(guard_lo, 2 * GUARD, (tpu_dtype)fv.t.dtype, 0, 1, 1), 2.0));
        s = tpu_launch(NULL, TPU_OP_COPY, ops, 2, &p);
        if (s == TPU_OK)
            for (int64_t i = 0; i < fv.n; i++)
                model_store(model + GUARD + fv.idx[i] * (int64_t)es, (tpu_dtype)fv.t.dtype, 2.0);
    } else {
        /* view copies: contiguous 1-d views with random offset/length/storage size, H2D then D2H */
        static unsigned char host[2048];
        int64_t off = rnd() % 8 == 0 ? -rnd_in(1, 3) : rnd_in(0, TGT_BYTES + 8);
        int64_t len = rnd_in(0, 300);
        size_t nb = rnd() % 6 == 0 ? (size_t)rnd_in(0, TGT_BYTES + 64) : TGT_BYTES;
        tpu_tensor d = view1(tgt, nb, TPU_U8, off, len, 1);
        int64_t hoff = rnd() % 8 == 0 ? rnd_in(1900, 2048) : rnd_in(0, 100);
        tpu_tensor h = view1(host, sizeof host, TPU_U8, hoff, len, 1);
        bool dev_ok = off >= 0 && (len == 0 || (off + len <= (int64_t)nb && nb <= TGT_BYTES));
        bool host_ok = len == 0 || hoff + len <= (int64_t)sizeof host;
        for (int i = 0; i < (int)sizeof host; i++) host[i] = (unsigned char)rnd();
        s = tpu_memcpy_view(&d, &h, TPU_COPY_H2D, NULL, rnd() & 1);
        CHECK_MSG((s == TPU_OK) == (dev_ok && host_ok),
                  "case %d: H2D off %lld len %lld nbytes %zu hoff %lld -> %s (%s)", k, (long long)off, (long long)len,
                  nb, (long long)hoff, tpu_status_name(s), tpu_last_error());
        if (s == TPU_OK && len) memcpy(model + GUARD + off, host + hoff, (size_t)len);
        int dd = region_diff();
        CHECK_MSG(dd < 0, "case %d: H2D left raw byte %d wrong", k, dd);
        unsigned char before[sizeof host];
        memcpy(before, host, sizeof host);
        s = tpu_memcpy_view(&h, &d, TPU_COPY_D2H, NULL, false);
        CHECK((s == TPU_OK) == (dev_ok && host_ok));
        if (s == TPU_OK && len) memcpy(before + hoff, model + GUARD + off, (size_t)len);
        CHECK_MSG(memcmp(before, host, sizeof host) == 0, "case %d: D2H wrote the wrong host bytes", k);
        return;
    }
    CHECK_MSG((s == TPU_OK) == fv.in_bounds,
              "case %d kind %d: dtype %s ndim %d offset %lld nbytes %zu: %s, expected %s (%s)", k, kind,
              tpu_dtype_name((tpu_dtype)fv.t.dtype), fv.t.ndim, (long long)fv.t.offset, fv.t.nbytes, tpu_status_name(s),
              fv.in_bounds ? "accepted" : "refused", tpu_last_error());
    if ((s == TPU_OK) != fv.in_bounds)
        for (int d = 0; d < fv.t.ndim; d++)
            fprintf(stderr, "     dim %d: size %lld stride %lld\n", d, (long long)fv.t.sizes[d],
                    (long long)fv.t.strides[d]);
    tpu_status ss = tpu_device_synchronize(0);
    CHECK_MSG(ss == TPU_OK, "case %d: kernel failed: %s", k, tpu_last_error());
    int d = region_diff();
    CHECK_MSG(d < 0, "case %d kind %d: raw byte %d differs from the model (target at %d..%d)", k, kind, d, GUARD,
              GUARD + TGT_BYTES);
}

static void test_fuzz_views(void) {
    const char *e = getenv("TPU_FUZZ_CASES");
    const char *sd = getenv("TPU_FUZZ_SEED");
    int n = e ? atoi(e) : 400;
    if (sd) rng_state = strtoull(sd, NULL, 10) | 1;
    printf("     fuzz: %d cases, seed %llu\n", n, (unsigned long long)rng_state);
    int failed_before = test_cur_failed;
    for (int k = 0; k < n && test_cur_failed == failed_before; k++) fuzz_case(k);
}

int main(void) {
    setenv("TPU_HBM_BYTES", "67108864", 1);
    setenv("TPU_NUM_DEVICES", "1", 1);
    setup();
    RUN_TEST(test_launch_refuses_out_of_bounds);
    RUN_TEST(test_copies_refuse_out_of_bounds);
    RUN_TEST(test_fuzz_views);
    return TEST_SUMMARY();
}
