/* test_tile.c - the shared tile layer of the kernels floor (kernels/tile-impl.h).
 *
 * The branch-free conversions must equal the conversions of base-impl.h bit
 * for bit: float16 -> float32 on all 65536 inputs, float32 -> float16 and
 * bfloat16 on every rounding boundary of the narrow type, every NaN / Inf /
 * subnormal class and a few million floats spread over all 2^32 patterns.
 * The row functions must convert exactly as the per-element reference
 * (tpu_load_f64 / tpu_store_f64 / tpu_load_i64 / tpu_store_i64) for every
 * dtype, at strides 1, 3, 0 and -2 and lengths that end inside a tile, a
 * 16-block and the tail, and write nothing outside the row (sentinels). */
#include "kernels/tile-impl.h"
#include "test.h"
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* float <-> bits: vmath-impl.h's, through tile-impl.h */
#define f2u(f) ((uint32_t)ew_f2b(f))
#define u2f(u) ew_b2f((int32_t)(u))

/* ---- scalar conversions ---- */

static void test_f16_to_f32_all(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t got = f2u(tpu_tile_f16_to_f32((uint16_t)h)), want = f2u(tpu_f16_to_f32((uint16_t)h));
        if (got != want && bad++ < 5) CHECK_MSG(0, "half %04x: got %08x, cast gives %08x", h, got, want);
    }
    CHECK(bad == 0);
}

static int f2h_bad;
static void check_f2h(uint32_t u) {
    float f = u2f(u);
    uint16_t got = tpu_tile_f32_to_f16(f), want = tpu_f32_to_f16(f);
    if (got != want && f2h_bad++ < 5) CHECK_MSG(0, "float %08x: got %04x, cast gives %04x", u, got, want);
}

static void test_f32_to_f16(void) {
    f2h_bad = 0;
    /* Every half, the float halfway to the next half, and one ulp either
     * side of both: all rounding boundaries (subnormal, normal, overflow). */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
            uint32_t a = f2u(tpu_f16_to_f32((uint16_t)(h | sign)));
            uint32_t b = h + 1 == 0x7c00 ? f2u(copysignf(65520.0f, u2f(a))) /* rounds to inf from here */
                                         : f2u(tpu_f16_to_f32((uint16_t)((h + 1) | sign)));
            uint32_t mid = f2u((u2f(a) + u2f(b)) * 0.5f);
            for (int d = -1; d <= 1; d++) {
                check_f2h(a + (uint32_t)d);
                check_f2h(mid + (uint32_t)d);
            }
        }
    }
    /* NaNs (payload bits high and low, both signs), infinities, f32 subnormals. */
    for (uint32_t m = 1; m < 0x800000; m = m * 3 + 1) {
        check_f2h(0x7f800000u | m);
        check_f2h(0xff800000u | m);
        check_f2h(m);
        check_f2h(0x80000000u | m);
    }
    check_f2h(0x7f800000u);
    check_f2h(0xff800000u);
    check_f2h(0x7fffffffu);
    check_f2h(0xffffffffu);
    /* A few million patterns spread over all 2^32. */
    for (uint64_t u = 0; u < (1ull << 32); u += 997) check_f2h((uint32_t)u);
    CHECK(f2h_bad == 0);
}

/* bf16 on whole vectors against tpu_bf16_to_f32 / tpu_f32_to_bf16. */
static void test_bf16_vectors(void) {
    int bad = 0;
    uint16_t h[16];
    for (uint32_t base = 0; base < 65536; base += 16) {
        for (int k = 0; k < 16; k++) h[k] = (uint16_t)(base + (uint32_t)k);
        vf8 v8;
        vf16 v16;
        tpu_tile_vload_bf16x8(&v8, h);
        tpu_tile_vload_bf16x16(&v16, h);
        for (int k = 0; k < 16; k++) {
            uint32_t want = f2u(tpu_bf16_to_f32(h[k]));
            if ((k < 8 && f2u(v8[k]) != want) || f2u(v16[k]) != want) bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d bf16 loads differ", bad);
    bad = 0;
    float f[16];
    uint16_t o8[8], o16[16];
    for (uint64_t u = 0; u < (1ull << 32); u += 16 * 1009) {
        for (int k = 0; k < 16; k++) f[k] = u2f((uint32_t)u + (uint32_t)k * 0x8001u);
        f[3] = u2f(0x7f800001u); /* signaling NaN, NaN, inf, a tie */
        f[5] = u2f(0xffc01234u);
        f[9] = INFINITY;
        f[12] = u2f(0x3f808000u);
        vf8 v8;
        vf16 v16;
        memcpy(&v8, f, sizeof v8);
        memcpy(&v16, f, sizeof v16);
        tpu_tile_vstore_bf16x8(o8, &v8);
        tpu_tile_vstore_bf16x16(o16, &v16);
        for (int k = 0; k < 16; k++) {
            uint16_t want = tpu_f32_to_bf16(f[k]);
            if ((k < 8 && o8[k] != want) || o16[k] != want) bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d bf16 stores differ", bad);
}

/* Contiguous float32 -> bfloat16 rows: on an AVX512-BF16 host by
 * vcvtneps2bf16, whose subnormal inputs read as zero, so blocks holding one
 * take the integer path. Every 16-block here mixes the hard cases (subnormals
 * of both signs, the smallest normal, NaNs, ties, values that round up to
 * inf) with ordinary ones, and whole blocks of each kind run too. */
static void test_bf16_row_store(void) {
    enum { N = 4096 + 7 };
    static float f[N];
    static uint16_t got[N];
    const uint32_t hard[] = {0x00000001u, 0x807fffffu, 0x00400000u, 0x00800000u, 0x7f800001u, 0xffc01234u,
                             0x7f800000u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x80000000u, 0x00000000u};
    int bad = 0;
    for (int round = 0; round < 3; round++) {
        uint32_t x = 12345u + (uint32_t)round;
        for (int i = 0; i < N; i++) {
            x = x * 1664525u + 1013904223u;
            bool hard_here = round == 0 ? (i % 16 == 5) : round == 1 ? (i / 16) % 2 == 0 : false;
            f[i] = u2f(hard_here ? hard[(x >> 8) % (sizeof hard / sizeof hard[0])] : x);
        }
        tpu_tile_store_f32(got, 1, f, N, TPU_BF16);
        for (int i = 0; i < N; i++)
            if (got[i] != tpu_f32_to_bf16(f[i]) && bad++ < 5)
                CHECK_MSG(0, "float %08x: got bf16 %04x, want %04x", f2u(f[i]), got[i], tpu_f32_to_bf16(f[i]));
    }
    CHECK(bad == 0);
    if (!(tpu_cpu_features() & TPU_CPU_AVX512BF16)) printf("  vcvtneps2bf16 row path: SKIPPED (no AVX512-BF16)\n");
}

/* ---- rows ---- */

#define SENT 0x5a
#define PAD  64 /* elements of sentinel on each side */
#define MAXN 600

static const int64_t lens[] = {0, 1, 15, 16, 17, 255, 256, 257, 271, 600};
static const int64_t strides[] = {1, 3, 0, -2};

/* A value of dtype dt at element i: every class the dtype holds (NaN,
 * infinities and subnormals only where `specials`), in range of every
 * integer dtype otherwise so conversions to integers are defined. */
static double sample(tpu_dtype dt, int64_t i, bool specials) {
    static const double sp[] = {NAN, INFINITY, -INFINITY, -0.0, 1e-40, 6e-8, 3e-39, 65519.0, 65520.0, 1e30};
    uint64_t r = (uint64_t)i * 0x9E3779B97F4A7C15ull;
    r ^= r >> 29;
    if (dt == TPU_BOOL) return (double)(r % 3 == 0);
    if (!tpu_dtype_is_float(dt)) {
        if (dt == TPU_I64 && specials) return (double)(int64_t)(r | 1); /* beyond 2^53 */
        return (double)((int64_t)(r % 256) - 128);
    }
    if (specials && r % 7 == 0) return sp[(r >> 8) % 10];
    return ((double)(r % 100000) - 50000.0) / 77.0;
}

/* Storage of `len` elements of dt at `stride`, with PAD sentinels around. */
typedef struct row {
    unsigned char mem[(PAD * 2 + MAXN * 3 + 8) * 8];
    size_t es;
    char *p;        /* element 0 */
    int64_t lo, hi; /* element span touched by the row */
} row;

static void row_init(row *r, tpu_dtype dt, int64_t stride, int64_t n) {
    memset(r->mem, SENT, sizeof r->mem);
    r->es = tpu_dtype_size(dt);
    int64_t first = stride < 0 ? (n - 1) * -stride : 0;
    r->p = (char *)r->mem + (size_t)(PAD + first) * r->es;
    r->lo = n ? (stride < 0 ? -first : 0) : 0;
    r->hi = n ? (stride < 0 ? 0 : (n - 1) * stride) : -1;
}

/* Element i of a row at stride st. */
static char *at(const row *r, int64_t i, int64_t st) { return r->p + i * st * (int64_t)r->es; }

static bool row_sentinels_ok(const row *r) {
    const unsigned char *lo = (const unsigned char *)r->p + r->lo * (int64_t)r->es;
    const unsigned char *hi = (const unsigned char *)r->p + (r->hi + 1) * (int64_t)r->es;
    for (const unsigned char *q = r->mem; q < lo; q++)
        if (*q != SENT) return false;
    for (const unsigned char *q = hi; q < r->mem + sizeof r->mem; q++)
        if (*q != SENT) return false;
    return true;
}

/* The reference load of element i into the float32 domain: tpu_load_f64,
 * but int64 rounds once (the documented exception). */
static float ref_load_f32(const void *p, tpu_dtype dt) {
    if (dt == TPU_I64) return (float)*(const int64_t *)p;
    return (float)tpu_load_f64(p, dt);
}

/* Every dtype x stride x length. */
static void each_row_case(void (*fn)(tpu_dtype dt, int64_t st, int64_t n)) {
    for (int k = 0; k < TPU_DTYPE_REAL_COUNT; k++)
        for (size_t si = 0; si < sizeof strides / sizeof *strides; si++)
            for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) fn((tpu_dtype)k, strides[si], lens[li]);
}

static void row_loads_case(tpu_dtype dt, int64_t st, int64_t n) {
    row r;
    row_init(&r, dt, st, n);
    for (int64_t i = 0; i < n; i++) tpu_store_f64(at(&r, i, st), dt, sample(dt, i, true));
    for (int64_t i = 0; i < n && dt == TPU_I64; i++) /* just above a float tie: rounds once */
        *(int64_t *)at(&r, i, st) =
            i % 2 ? (int64_t)((uint64_t)i * 0x9E3779B97F4A7C15ull) : (INT64_C(1) << 62) + (INT64_C(1) << 38) + i + 1;
    float f[MAXN + 1];
    double d[MAXN + 1];
    int64_t l[MAXN + 1];
    f[n] = d[n] = 12345;
    l[n] = 12345;
    tpu_tile_load_f32(f, r.p, st, n, dt);
    tpu_tile_load_f64(d, r.p, st, n, dt);
    tpu_tile_load_i64(l, r.p, st, n, dt);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *e = at(&r, i, st);
        float wf = ref_load_f32(e, dt);
        double wd = tpu_load_f64(e, dt);
        bad += f2u(f[i]) != f2u(wf);
        bad += memcmp(&d[i], &wd, 8) != 0;
        if (!tpu_dtype_is_float(dt) || fabs(wd) < 1e18) /* else undefined in C */
            bad += l[i] != tpu_load_i64(e, dt);
    }
    CHECK_MSG(bad == 0 && f[n] == 12345 && d[n] == 12345 && l[n] == 12345, "load %s stride %lld n %lld: %d differ",
              tpu_dtype_name(dt), (long long)st, (long long)n, bad);
}

/* Each domain against tpu_store_f64 / tpu_store_i64 element by element (at
 * stride 0 every element lands in one place: the last one stays). */
static void row_stores_case(tpu_dtype dt, int64_t st, int64_t n) {
    bool specials = tpu_dtype_is_float(dt);
    float f[MAXN];
    double d[MAXN];
    int64_t l[MAXN];
    for (int64_t i = 0; i < n; i++) {
        d[i] = sample(TPU_F64, i, specials);
        f[i] = (float)sample(TPU_F32, i, specials);
        l[i] = (int64_t)sample(TPU_I64, i, specials);
    }
    for (int dom = 0; dom < 3; dom++) {
        row got, want;
        row_init(&got, dt, st, n);
        row_init(&want, dt, st, n);
        for (int64_t i = 0; i < n; i++) {
            char *e = at(&want, i, st);
            if (dom == 0)
                tpu_store_f64(e, dt, f[i]);
            else if (dom == 1)
                tpu_store_f64(e, dt, d[i]);
            else
                tpu_store_i64(e, dt, l[i]);
        }
        if (dom == 0)
            tpu_tile_store_f32(got.p, st, f, n, dt);
        else if (dom == 1)
            tpu_tile_store_f64(got.p, st, d, n, dt);
        else
            tpu_tile_store_i64(got.p, st, l, n, dt);
        CHECK_MSG(memcmp(got.mem, want.mem, sizeof got.mem) == 0 && row_sentinels_ok(&got),
                  "store %s domain %d stride %lld n %lld", tpu_dtype_name(dt), dom, (long long)st, (long long)n);
    }
}

static void test_row_loads(void) { each_row_case(row_loads_case); }
static void test_row_stores(void) { each_row_case(row_stores_case); }

/* The offset-table forms against the strided ones on a scrambled table. */
static void test_row_tables(void) {
    int64_t off[MAXN];
    for (int k = 0; k < TPU_DTYPE_REAL_COUNT; k++) {
        tpu_dtype dt = (tpu_dtype)k;
        int64_t n = 300;
        for (int64_t i = 0; i < n; i++) off[i] = (i * 7) % n; /* a permutation of [0, n) */
        row r;
        row_init(&r, dt, 1, n);
        for (int64_t i = 0; i < n; i++) tpu_store_f64(at(&r, i, 1), dt, sample(dt, i, true));
        float f[MAXN], fs[MAXN];
        double d[MAXN], ds[MAXN];
        tpu_tile_load_f32_at(f, r.p, off, n, dt);
        tpu_tile_load_f64_at(d, r.p, off, n, dt);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            tpu_tile_load_f32(&fs[i], at(&r, off[i], 1), 1, 1, dt);
            tpu_tile_load_f64(&ds[i], at(&r, off[i], 1), 1, 1, dt);
            bad += f2u(f[i]) != f2u(fs[i]) || memcmp(&d[i], &ds[i], 8) != 0;
        }
        row got, want;
        row_init(&got, dt, 1, n);
        row_init(&want, dt, 1, n);
        tpu_tile_store_f32_at(got.p, off, fs, n, dt);
        for (int64_t i = 0; i < n; i++) tpu_tile_store_f32(at(&want, off[i], 1), 1, &fs[i], 1, dt);
        bad += memcmp(got.mem, want.mem, sizeof got.mem) != 0;
        row_init(&got, dt, 1, n);
        row_init(&want, dt, 1, n);
        tpu_tile_store_f64_at(got.p, off, ds, n, dt);
        for (int64_t i = 0; i < n; i++) tpu_tile_store_f64(at(&want, off[i], 1), 1, &ds[i], 1, dt);
        bad += memcmp(got.mem, want.mem, sizeof got.mem) != 0;
        CHECK_MSG(bad == 0, "%s: %d table loads/stores differ", tpu_dtype_name(dt), bad);
    }
}

int main(void) {
    RUN_TEST(test_f16_to_f32_all);
    RUN_TEST(test_f32_to_f16);
    RUN_TEST(test_bf16_vectors);
    RUN_TEST(test_bf16_row_store);
    RUN_TEST(test_row_loads);
    RUN_TEST(test_row_stores);
    RUN_TEST(test_row_tables);
    return TEST_SUMMARY();
}
