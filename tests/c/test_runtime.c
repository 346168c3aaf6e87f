#define _GNU_SOURCE
/* test_runtime.c - the vTPU runtime: devices, allocator, streams, events,
 * copies, launch validation, asynchronous errors, configuration, the stream
 * pool, the bounded queue, host interrupts, Philox, and the matrix
 * unit and random kernels against their references. Run under ASan+UBSan,
 * and under TSan for the thread-heavy parts. */
#include "tpu/tpu.h"
#include "kernels/kernels-impl.h"
#include "vtpu/vtpu-impl.h"
#include "test.h"
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#define HBM (64u << 20) /* set before first use: 64 MiB chips */

static float *dev_to_host_f32(void *d, size_t n) {
    float *h = malloc(n * sizeof(float));
    CHECK_OK(tpu_memcpy(h, d, n * sizeof(float), TPU_COPY_D2H, NULL));
    return h;
}

static void fill_f32(void *d, int64_t n, double v, tpu_stream_t s) {
    tpu_tensor t[2];
    tpu_tensor_contiguous(&t[0], d, TPU_F32, 1, &n);
    t[1] = tpu_tensor_scalar_f(v, TPU_F32);
    tpu_params p = {.compute_dtype = TPU_F32};
    CHECK_OK(tpu_launch(s, TPU_OP_FILL, t, 2, &p));
}

static void test_devices(void) {
    CHECK(tpu_device_count() == 2);
    tpu_device_props p;
    CHECK_OK(tpu_device_get_props(0, &p));
    CHECK(p.hbm_bytes == HBM);
    CHECK(strstr(p.name, "vTPU") != NULL);
    CHECK(tpu_device_get_props(2, &p) == TPU_ERROR_INVALID_DEVICE);
    CHECK(strstr(tpu_last_error(), "2 tpu devices") != NULL);
    CHECK(tpu_device_set(5) == TPU_ERROR_INVALID_DEVICE);
    CHECK_OK(tpu_device_set(1));
    CHECK(tpu_device_current() == 1);
    CHECK_OK(tpu_device_set(0));
}

static void test_alloc_reuse_and_stats(void) {
    tpu_mem_stats st0, st;
    CHECK_OK(tpu_mem_get_stats(0, &st0));
    void *a, *b;
    CHECK_OK(tpu_malloc(0, 1000, NULL, &a));
    CHECK(a != NULL && tpu_mem_device_of(a) == 0);
    CHECK_OK(tpu_mem_get_stats(0, &st));
    CHECK(st.allocated == st0.allocated + 1024);
    CHECK_OK(tpu_free(a));
    CHECK_OK(tpu_malloc(0, 900, NULL, &b)); /* same bin, same stream: reused */
    CHECK(a == b);
    CHECK_OK(tpu_free(b));
    CHECK_OK(tpu_mem_get_stats(0, &st));
    CHECK(st.allocated == st0.allocated);
    CHECK(st.reserved >= 1024);
    CHECK(st.peak_allocated >= st0.allocated + 1024);
    CHECK_OK(tpu_mem_reset_peak(0));
    CHECK_OK(tpu_mem_get_stats(0, &st));
    CHECK(st.peak_allocated == st.allocated);
    CHECK_OK(tpu_mem_empty_cache(0));
    CHECK_OK(tpu_mem_get_stats(0, &st));
    CHECK(st.reserved == st.allocated);
    void *z;
    CHECK_OK(tpu_malloc(0, 0, NULL, &z));
    CHECK(z == NULL);
    CHECK_OK(tpu_free(NULL));
    CHECK(tpu_free((void *)0x1234) == TPU_ERROR_INVALID_VALUE);
}

static void test_oom(void) {
    tpu_mem_stats st0, st;
    CHECK_OK(tpu_mem_get_stats(0, &st0));
    void *p;
    CHECK(tpu_malloc(0, (size_t)HBM + 1, NULL, &p) == TPU_ERROR_OUT_OF_MEMORY);
    CHECK(strstr(tpu_last_error(), "Tried to allocate") != NULL);
    CHECK(strstr(tpu_last_error(), "out of memory") != NULL);
    CHECK(tpu_malloc(0, SIZE_MAX, NULL, &p) == TPU_ERROR_OUT_OF_MEMORY);
    /* Fill the chip with cached blocks, then ask for a big one: one flush makes room. */
    void *blk[6];
    for (int i = 0; i < 6; i++) CHECK_OK(tpu_malloc(0, 8u << 20, NULL, &blk[i]));
    for (int i = 0; i < 6; i++) CHECK_OK(tpu_free(blk[i]));
    CHECK_OK(tpu_malloc(0, 40u << 20, NULL, &p));
    CHECK_OK(tpu_mem_get_stats(0, &st));
    CHECK(st.num_cache_flushes > st0.num_cache_flushes);
    CHECK(st.num_ooms == st0.num_ooms + 2);
    CHECK_OK(tpu_free(p));
    CHECK_OK(tpu_malloc(0, 1024, NULL, &p)); /* device keeps working */
    CHECK_OK(tpu_free(p));
}

static int hook_calls;
static bool fail_hook(int dev, size_t bytes, void *user) {
    (void)dev;
    (void)bytes;
    (void)user;
    hook_calls++;
    return false;
}

static void test_fault_injection(void) {
    tpu_mem_set_alloc_hook(fail_hook, NULL);
    void *p;
    CHECK(tpu_malloc(0, 4096, NULL, &p) == TPU_ERROR_OUT_OF_MEMORY);
    CHECK(hook_calls == 1);
    tpu_mem_set_alloc_hook(NULL, NULL);
    CHECK_OK(tpu_malloc(0, 4096, NULL, &p));
    CHECK_OK(tpu_free(p));
}

static void test_copies_and_fill(void) {
    int64_t n = 1001;
    void *d;
    CHECK_OK(tpu_malloc(0, n * 4, NULL, &d));
    float *h = malloc(n * 4);
    for (int64_t i = 0; i < n; i++) h[i] = (float)i;
    CHECK_OK(tpu_memcpy(d, h, n * 4, TPU_COPY_H2D, NULL));
    void *d2;
    CHECK_OK(tpu_malloc(0, n * 4, NULL, &d2));
    CHECK_OK(tpu_memcpy_async(d2, d, n * 4, TPU_COPY_D2D, NULL));
    float *r = dev_to_host_f32(d2, n);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += r[i] != (float)i;
    CHECK(bad == 0);
    fill_f32(d2, n, 2.5, NULL);
    free(r);
    r = dev_to_host_f32(d2, n);
    CHECK(r[0] == 2.5f && r[n - 1] == 2.5f);
    /* Pinned memory, asynchronous round trip. */
    float *pin;
    CHECK_OK(tpu_host_alloc(n * 4, (void **)&pin));
    CHECK(tpu_host_is_pinned(pin) && !tpu_host_is_pinned(h));
    CHECK_OK(tpu_memcpy_async(pin, d, n * 4, TPU_COPY_D2H, NULL));
    CHECK_OK(tpu_stream_synchronize(tpu_stream_current(0)));
    CHECK(pin[7] == 7.0f);
    CHECK_OK(tpu_host_free(pin));
    /* A copy that runs past device memory is refused. */
    CHECK(tpu_memcpy(h, (char *)d + HBM, 8, TPU_COPY_D2H, NULL) != TPU_OK);
    CHECK(tpu_memcpy(h, h, 8, TPU_COPY_D2H, NULL) == TPU_ERROR_INVALID_VALUE);
    free(h);
    free(r);
    CHECK_OK(tpu_free(d));
    CHECK_OK(tpu_free(d2));
}

/* Commands on one stream run in order: a chain of adds gives an exact count. */
/* The arguments of `d[0:n] += 1` (float32): an add of d, d and the scalar 1. */
static void incr_args(tpu_tensor t[3], tpu_params *p, void *d, int64_t *n) {
    tpu_tensor_contiguous(&t[0], d, TPU_F32, 1, n);
    t[1] = t[0];
    t[2] = tpu_tensor_scalar_f(1.0, TPU_F32);
    *p = (tpu_params){.f = {1.0}, .compute_dtype = TPU_F32};
}

static void test_stream_order(void) {
    int64_t n = 4096;
    void *d;
    CHECK_OK(tpu_malloc(0, n * 4, NULL, &d));
    fill_f32(d, n, 0, NULL);
    tpu_tensor t[3];
    tpu_params p;
    incr_args(t, &p, d, &n);
    for (int i = 0; i < 200; i++) CHECK_OK(tpu_launch(NULL, TPU_OP_ADD, t, 3, &p));
    float *r = dev_to_host_f32(d, n);
    CHECK_MSG(r[0] == 200.0f && r[n - 1] == 200.0f, "got %f", r[0]);
    free(r);
    CHECK_OK(tpu_free(d));
}

/* Strict Eager runs a small kernel on the launching thread only when its
 * stream is idle: behind queued work it queues (and so reads what that work
 * wrote), and past the queue's depth of small launches every one still runs
 * once, in order (the queue recycles its command blocks). */
static void test_small_kernels_keep_order(void) {
    int64_t big = 1 << 22, n = 16;
    void *d, *o;
    CHECK_OK(tpu_malloc(0, big * 4, NULL, &d));
    CHECK_OK(tpu_malloc(0, n * 4, NULL, &o));
    fill_f32(d, big, 0, NULL);
    CHECK_OK(tpu_device_synchronize(0));
    for (int round = 0; round < 3; round++) {
        fill_f32(d, big, 7 + round, NULL); /* 4M elements: queued to the worker */
        tpu_tensor t[3];
        tpu_tensor_contiguous(&t[0], o, TPU_F32, 1, &n);
        tpu_tensor_contiguous(&t[1], d, TPU_F32, 1, &n); /* the first 16 elements of d */
        t[1].nbytes = (size_t)big * 4;
        t[2] = tpu_tensor_scalar_f(1.0, TPU_F32);
        tpu_params p = {.f = {1.0}, .compute_dtype = TPU_F32};
        CHECK_OK(tpu_launch(NULL, TPU_OP_ADD, t, 3, &p)); /* small: must wait for the fill */
        float *r = dev_to_host_f32(o, n);
        CHECK_MSG(r[0] == 8.0f + round && r[n - 1] == 8.0f + round, "round %d: got %f", round, r[0]);
        free(r);
    }
    /* Many more small launches than the queue holds, half of them behind a big one. */
    fill_f32(o, n, 0, NULL);
    tpu_tensor t[3];
    tpu_params p;
    incr_args(t, &p, o, &n);
    int total = 3 * TPU_STREAM_QUEUE_DEPTH;
    for (int i = 0; i < total; i++) {
        if (i % 700 == 0) fill_f32(d, big, i, NULL);
        CHECK_OK(tpu_launch(NULL, TPU_OP_ADD, t, 3, &p));
    }
    float *r = dev_to_host_f32(o, n);
    CHECK_MSG(r[0] == (float)total && r[n - 1] == (float)total, "got %f, expected %d", r[0], total);
    free(r);
    CHECK_OK(tpu_free(d));
    CHECK_OK(tpu_free(o));
}

static _Atomic int flag;
static void slow_cb(void *u) {
    (void)u;
    usleep(20000);
    atomic_store(&flag, 1);
}
static void check_cb(void *u) { *(int *)u = atomic_load(&flag); }

static void test_events(void) {
    tpu_stream_t s1, s2;
    CHECK_OK(tpu_stream_create(0, 0, &s1));
    CHECK_OK(tpu_stream_create(0, 0, &s2));
    CHECK(tpu_stream_id(s1) != tpu_stream_id(s2) && tpu_stream_id(tpu_stream_default(0)) == 0);
    tpu_event_t e0, e1, e;
    CHECK_OK(tpu_event_create(true, &e0));
    CHECK_OK(tpu_event_create(true, &e1));
    CHECK_OK(tpu_event_create(false, &e));
    CHECK_OK(tpu_event_query(e)); /* never recorded: complete */
    CHECK_OK(tpu_event_record(e0, s1));
    atomic_store(&flag, 0);
    CHECK_OK(tpu_stream_add_callback(s1, slow_cb, NULL));
    CHECK_OK(tpu_event_record(e1, s1));
    CHECK_OK(tpu_event_record(e, s1));
    CHECK(tpu_event_query(e1) == TPU_ERROR_NOT_READY);
    CHECK(tpu_stream_query(s1) == TPU_ERROR_NOT_READY);
    /* s2 waits for s1's event: its callback sees the flag set. */
    int seen = -1;
    CHECK_OK(tpu_stream_wait_event(s2, e));
    CHECK_OK(tpu_stream_add_callback(s2, check_cb, &seen));
    CHECK_OK(tpu_stream_synchronize(s2));
    CHECK(seen == 1);
    CHECK_OK(tpu_event_synchronize(e1));
    float ms = -1;
    CHECK_OK(tpu_event_elapsed_ms(e0, e1, &ms));
    CHECK_MSG(ms >= 15.0f && ms < 2000.0f, "elapsed %f", ms);
    CHECK(tpu_event_elapsed_ms(e0, e, &ms) == TPU_ERROR_INVALID_VALUE); /* e has no timing */
    CHECK_OK(tpu_stream_query(s1));
    tpu_event_destroy(e0);
    tpu_event_destroy(e1);
    tpu_event_destroy(e);
    CHECK_OK(tpu_stream_destroy(s1));
    CHECK_OK(tpu_stream_destroy(s2));
    CHECK(tpu_stream_destroy(tpu_stream_default(0)) == TPU_ERROR_INVALID_VALUE);
}

/* A block freed on a busy stream is not handed to another stream early. */
static void test_stream_ordered_reuse(void) {
    tpu_stream_t s1, s2;
    CHECK_OK(tpu_stream_create(0, 0, &s1));
    CHECK_OK(tpu_stream_create(0, 0, &s2));
    void *a, *b;
    CHECK_OK(tpu_malloc(0, 3u << 20, s1, &a));
    atomic_store(&flag, 0);
    CHECK_OK(tpu_stream_add_callback(s1, slow_cb, NULL));
    CHECK_OK(tpu_free(a));
    CHECK_OK(tpu_malloc(0, 3u << 20, s2, &b));
    CHECK(a != b); /* s1 still busy */
    CHECK_OK(tpu_free(b));
    CHECK_OK(tpu_stream_synchronize(s1));
    void *c;
    CHECK_OK(tpu_malloc(0, 3u << 20, s2, &c)); /* now either block is fine */
    CHECK(c == a || c == b);
    CHECK_OK(tpu_free(c));
    CHECK_OK(tpu_stream_destroy(s1));
    CHECK_OK(tpu_stream_destroy(s2));
}

static void test_async_error(void) {
    int64_t n = 16;
    void *d;
    CHECK_OK(tpu_malloc(0, n * 8, NULL, &d));
    tpu_tensor t;
    tpu_tensor_contiguous(&t, d, TPU_I64, 1, &n);
    tpu_params p = {.i = {1, 0, 5, 5}}; /* random_ with from == to: fails when run */
    CHECK_OK(tpu_launch(NULL, TPU_OP_RAND_INT, &t, 1, &p));
    tpu_status s = tpu_stream_synchronize(tpu_stream_current(0));
    CHECK(s == TPU_ERROR_KERNEL);
    CHECK(strstr(tpu_last_error(), "random") != NULL);
    CHECK_OK(tpu_stream_synchronize(tpu_stream_current(0))); /* reported once */
    p.i[3] = 10;
    CHECK_OK(tpu_launch(NULL, TPU_OP_RAND_INT, &t, 1, &p)); /* stream still usable */
    int64_t h[16];
    CHECK_OK(tpu_memcpy(h, d, sizeof h, TPU_COPY_D2H, NULL));
    CHECK(h[0] >= 5 && h[0] < 10);
    CHECK_OK(tpu_device_synchronize(0));
    /* Debug Eager: the failure is returned by the launch itself. */
    tpu_eager_mode mode0 = tpu_get_eager_mode();
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_DEBUG));
    CHECK(tpu_get_eager_mode() == TPU_EAGER_DEBUG);
    p.i[3] = 5;
    CHECK(tpu_launch(NULL, TPU_OP_RAND_INT, &t, 1, &p) == TPU_ERROR_KERNEL);
    CHECK(strstr(tpu_last_error(), "random") != NULL);
    CHECK_OK(tpu_stream_synchronize(tpu_stream_current(0))); /* nothing left sticky */
    p.i[3] = 10;
    CHECK_OK(tpu_launch(NULL, TPU_OP_RAND_INT, &t, 1, &p));
    CHECK_OK(tpu_memcpy(h, d, sizeof h, TPU_COPY_D2H, NULL));
    CHECK(h[3] >= 5 && h[3] < 10);
    /* A mode outside the enum: refused, the mode unchanged. */
    CHECK(tpu_set_eager_mode(TPU_EAGER_MODE_COUNT) == TPU_ERROR_INVALID_VALUE);
    CHECK(tpu_get_eager_mode() == TPU_EAGER_DEBUG);
    tpu_eager_mode m;
    CHECK(tpu_eager_mode_from_name("defer_and_fuse", &m) == TPU_OK && m == TPU_EAGER_FUSED);
    CHECK(tpu_eager_mode_from_name("strict", &m) == TPU_OK && m == TPU_EAGER_STRICT);
    CHECK(tpu_eager_mode_from_name("bogus", &m) == TPU_ERROR_INVALID_VALUE);
    CHECK(strcmp(tpu_last_error(), "unknown eager mode 'bogus'; expected one of ['debug', 'fused', 'strict']") == 0);
    CHECK(strcmp(tpu_eager_mode_name(TPU_EAGER_FUSED), "fused") == 0);
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
    CHECK_OK(tpu_set_eager_mode(mode0));
    CHECK_OK(tpu_free(d));
}

static void test_launch_validation(void) {
    void *d;
    CHECK_OK(tpu_malloc(0, 64, NULL, &d));
    tpu_tensor t[2];
    int64_t n = 17; /* 68 bytes > 64 */
    tpu_tensor_contiguous(&t[0], d, TPU_F32, 1, &n);
    t[0].nbytes = 64;
    t[1] = tpu_tensor_scalar_f(1, TPU_F32);
    CHECK(tpu_launch(NULL, TPU_OP_FILL, t, 2, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK(strstr(tpu_last_error(), "outside its storage") != NULL);
    n = 16;
    tpu_tensor_contiguous(&t[0], d, TPU_F32, 1, &n);
    t[0].offset = -1;
    CHECK(tpu_launch(NULL, TPU_OP_FILL, t, 2, NULL) == TPU_ERROR_INVALID_VALUE);
    t[0].offset = 0;
    t[0].strides[0] = INT64_MAX;
    CHECK(tpu_launch(NULL, TPU_OP_FILL, t, 2, NULL) == TPU_ERROR_OVERFLOW);
    CHECK(tpu_launch(NULL, TPU_OP_ADD, t, 2, NULL) == TPU_ERROR_INVALID_VALUE); /* arity */
    CHECK(tpu_launch(NULL, (tpu_op)9999, t, 2, NULL) == TPU_ERROR_INVALID_VALUE);
    float host[16];
    tpu_tensor_contiguous(&t[0], host, TPU_F32, 1, &n); /* a host pointer is not device memory */
    CHECK(tpu_launch(NULL, TPU_OP_FILL, t, 2, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK_OK(tpu_free(d));
}

static void test_philox_vectors(void) {
    /* Known-answer tests from Random123 (kat_vectors, philox4x32_10). */
    uint32_t out[4];
    uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
    tpu_philox4x32_10(c0, k0, out);
    CHECK(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu && out[3] == 0x9b00dbd8u);
    uint32_t c1[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, k1[2] = {0xffffffffu, 0xffffffffu};
    tpu_philox4x32_10(c1, k1, out);
    CHECK(out[0] == 0x408f276du && out[1] == 0x41c83b0eu && out[2] == 0xa20bc7c6u && out[3] == 0x6d5451fdu);
    uint32_t c2[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, k2[2] = {0xa4093822u, 0x299f31d0u};
    tpu_philox4x32_10(c2, k2, out);
    CHECK(out[0] == 0xd16cfe09u && out[1] == 0x94fdccebu && out[2] == 0x5001e420u && out[3] == 0x24126ea1u);

    /* The batched forms (portable C, AVX2, AVX-512 where the CPU has them,
     * and the dispatcher) equal one block at a time: every count 1..70
     * (partial sets of 8, 16 and 32), counters that carry into the high word
     * inside a set of 8 or of 16, keys with both halves set. */
    static const uint64_t g0s[] = {0, 5, 0xfffffff9ull, 0xffffffe5ull, 0x123456789abcdefull},
                          seeds[] = {0, 0x9e3779b97f4a7c15ull};
    enum { NBMAX = 70 };
    uint32_t got[4 * (NBMAX + 1)], one[4];
    int bad = 0;
    bool have[3] = {false, false, false};
    for (int isa = -1; isa < 3; isa++)
        for (int gi = 0; gi < 5; gi++)
            for (int si = 0; si < 2; si++)
                for (int nb = 1; nb <= NBMAX; nb++) {
                    got[4 * nb] = 0xdeadbeefu; /* past the end: untouched */
                    if (isa < 0)
                        tpu_philox_blocks(seeds[si], 77, g0s[gi], nb, got);
                    else if (!tpu_philox_blocks_isa(isa, seeds[si], 77, g0s[gi], nb, got))
                        continue;
                    else
                        have[isa] = true;
                    bad += got[4 * nb] != 0xdeadbeefu;
                    for (int b = 0; b < nb; b++) {
                        tpu_philox_block(seeds[si], 77, g0s[gi] + (uint64_t)b, one);
                        for (int j = 0; j < 4; j++) bad += got[4 * b + j] != one[j];
                    }
                }
    CHECK(bad == 0 && have[0]);
    if (!have[1]) printf("  (no AVX2 on this CPU: the AVX2 Philox path was not tested)\n");
    if (!have[2]) printf("  (no AVX-512 on this CPU: the AVX-512 Philox path was not tested)\n");
}

/* Fast kernels against references, on host buffers (kernel-level). */
static void fill_rand(float *x, int64_t n, unsigned seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = ((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
}

static void gemm_case(int64_t B, int64_t M, int64_t N, int64_t K, tpu_dtype dt, int prec, bool transA, bool withC) {
    size_t es = tpu_dtype_size(dt);
    int64_t na = B * M * K, nb = B * K * N, no = B * M * N;
    float *fa = malloc(na * 4), *fb = malloc(nb * 4), *fc = malloc((no ? no : 1) * 4);
    fill_rand(fa, na, 1);
    fill_rand(fb, nb, 2);
    fill_rand(fc, no, 3);
    char *A = malloc(na * es + 1), *Bm = malloc(nb * es + 1), *C = malloc(no * es + 1);
    char *O1 = malloc(no * es + 64), *O2 = malloc(no * es + 64);
    for (int64_t i = 0; i < na; i++) tpu_store_f64(A + i * es, dt, fa[i]);
    for (int64_t i = 0; i < nb; i++) tpu_store_f64(Bm + i * es, dt, fb[i]);
    for (int64_t i = 0; i < no; i++) tpu_store_f64(C + i * es, dt, fc[i]);
    memset(O1, 0x5a, no * es + 64);
    memset(O2, 0x5a, no * es + 64);
    tpu_kargs a1;
    memset(&a1, 0, sizeof a1);
    a1.op = TPU_OP_MATMUL;
    a1.n = withC ? 4 : 3;
    int64_t so[3] = {B, M, N}, sa[3] = {B, M, K}, sb[3] = {B, K, N};
    tpu_tensor_contiguous(&a1.t[0], O1, dt, 3, so);
    tpu_tensor_contiguous(&a1.t[1], A, dt, 3, sa);
    if (transA) {
        a1.t[1].strides[1] = 1;
        a1.t[1].strides[2] = M;
    } /* A stored as (B, K, M) */
    tpu_tensor_contiguous(&a1.t[2], Bm, dt, 3, sb);
    tpu_tensor_contiguous(&a1.t[3], C, dt, 3, so);
    a1.t[3].strides[0] = 0; /* broadcast over batch */
    a1.p.f[0] = 0.5;
    a1.p.f[1] = withC ? 2.0 : 0.0;
    a1.p.i[0] = prec;
    tpu_kargs a2 = a1;
    a2.t[0].base = O2;
    CHECK_OK(tpu_k_gemm(&a1));
    CHECK_OK(tpu_ref_gemm(&a2));
    double tol = dt == TPU_BF16 ? 2e-2 : dt == TPU_F16 ? 5e-3 : (dt == TPU_F32 && prec == 2) ? 1e-2 : 1e-4;
    double worst = 0;
    for (int64_t i = 0; i < no; i++) {
        double x = tpu_load_f64(O1 + i * es, dt), y = tpu_load_f64(O2 + i * es, dt);
        double err = fabs(x - y) / (1.0 + fabs(y)) / sqrt((double)(K ? K : 1));
        if (err > worst) worst = err;
    }
    CHECK_MSG(worst <= tol, "gemm B%lld M%lld N%lld K%lld %s prec%d: rel err %g", (long long)B, (long long)M,
              (long long)N, (long long)K, tpu_dtype_name(dt), prec, worst);
    for (int k = 0; k < 64; k++) CHECK((unsigned char)O1[no * es + k] == 0x5a); /* sentinel */
    free(fa);
    free(fb);
    free(fc);
    free(A);
    free(Bm);
    free(C);
    free(O1);
    free(O2);
}

static void test_gemm_vs_ref(void) {
    tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F16, TPU_F64};
    for (int d = 0; d < 4; d++) {
        gemm_case(1, 1, 1, 1, dts[d], 0, false, false);
        gemm_case(2, 37, 41, 53, dts[d], 0, false, true);
        gemm_case(1, 67, 300, 301, dts[d], 0, true, true);
        gemm_case(1, 5, 7, 0, dts[d], 0, false, true);
        gemm_case(1, 0, 7, 3, dts[d], 0, false, false);
    }
    for (int prec = 0; prec < 3; prec++) {
        gemm_case(1, 129, 65, 513, TPU_F32, prec, false, true);
        gemm_case(3, 9, 33, 17, TPU_F32, prec, true, false);
    }
}

static void test_random_vs_ref(void) {
    tpu_op ops[] = {TPU_OP_RAND_UNIFORM, TPU_OP_RAND_NORMAL,     TPU_OP_RAND_BERNOULLI, TPU_OP_RAND_INT,
                    TPU_OP_RAND_CAUCHY,  TPU_OP_RAND_LOG_NORMAL, TPU_OP_RAND_GEOMETRIC};
    tpu_dtype dts[] = {TPU_F32, TPU_F64, TPU_BF16, TPU_I64};
    int64_t n = 100003;
    for (int k = 0; k < (int)(sizeof ops / sizeof ops[0]); k++) {
        tpu_dtype dt = ops[k] == TPU_OP_RAND_INT ? TPU_I64 : ops[k] == TPU_OP_RAND_GEOMETRIC ? TPU_I32 : dts[k % 3];
        size_t es = tpu_dtype_size(dt);
        char *o1 = malloc(n * es), *o2 = malloc(n * es);
        tpu_kargs a;
        memset(&a, 0, sizeof a);
        a.op = ops[k];
        a.n = 1;
        tpu_tensor_contiguous(&a.t[0], o1, dt, 1, &n);
        a.p.i[0] = 42;
        a.p.i[1] = 7;
        a.p.i[2] = -3;
        a.p.i[3] = 11;
        a.p.f[0] = ops[k] == TPU_OP_RAND_BERNOULLI || ops[k] == TPU_OP_RAND_GEOMETRIC ? 0.3 : 0.0;
        a.p.f[1] = 1.0;
        tpu_kargs b = a;
        b.t[0].base = o2;
        CHECK_OK(tpu_k_random(&a));
        CHECK_OK(tpu_ref_random(&b));
        CHECK(memcmp(o1, o2, n * es) == 0);
        double sum = 0, sq = 0, neg = 0;
        for (int64_t i = 0; i < n; i++) {
            double v = tpu_load_f64(o1 + i * es, dt);
            sum += v;
            sq += v * v;
            neg += v < 0;
        }
        double mean = sum / n, var = sq / n - mean * mean;
        if (ops[k] == TPU_OP_RAND_UNIFORM)
            CHECK_MSG(fabs(mean - 0.5) < 0.01 && fabs(var - 1.0 / 12) < 0.01, "mean %f var %f", mean, var);
        if (ops[k] == TPU_OP_RAND_NORMAL)
            CHECK_MSG(fabs(mean) < 0.02 && fabs(var - 1.0) < 0.03, "mean %f var %f", mean, var);
        if (ops[k] == TPU_OP_RAND_BERNOULLI) CHECK_MSG(fabs(mean - 0.3) < 0.01, "mean %f", mean);
        if (ops[k] == TPU_OP_RAND_INT) CHECK_MSG(fabs(mean - 3.5) < 0.1, "mean %f", mean);
        if (ops[k] == TPU_OP_RAND_CAUCHY) CHECK_MSG(fabs(neg / n - 0.5) < 0.01, "P(X < median) %f", neg / n);
        if (ops[k] == TPU_OP_RAND_LOG_NORMAL) /* e^N(0, 1): mean e^(1/2), variance (e - 1) e */
            CHECK_MSG(neg == 0 && fabs(mean - 1.6487212707) < 0.04 && fabs(var - 4.6707742705) < 0.6, "mean %f var %f",
                      mean, var);
        if (ops[k] == TPU_OP_RAND_GEOMETRIC) /* p = 0.3: mean 1/p, variance (1 - p) / p^2 */
            CHECK_MSG(fabs(mean - 1 / 0.3) < 0.05 && fabs(var - 0.7 / 0.09) < 0.3, "mean %f var %f", mean, var);
        /* a different offset gives different numbers */
        b.p.i[1] = 8;
        CHECK_OK(tpu_ref_random(&b));
        CHECK(memcmp(o1, o2, n * es) != 0);
        free(o1);
        free(o2);
    }
}

/* The batched uniform / bernoulli fill (Philox blocks eight at a time)
 * equals the per-element function at any position and length, for every
 * float dtype, awkward ranges (draws rounding up to `to`) and probabilities
 * that are not floats; the fast kernel equals the reference. */
static void test_random_batched_vs_element(void) {
    double ranges[][2] = {{0, 1}, {-3, 5}, {1, 1.0000001}, {2, 2}};
    double probs[] = {0.3, 0.9,     0.5,        1.0,
                      0.0, 1.0 / 3, 0.99999999, 0x1.8p-23 + 1e-20}; /* (the last: just above 3 * 2^-24) */
    tpu_dtype dts[] = {TPU_F32, TPU_BF16, TPU_F16, TPU_BOOL};
    int64_t n = 5003;
    float out[1100];
    for (int op = 0; op < 2; op++)
        for (int d = 0; d < 4; d++)
            for (int c = 0; c < (op ? 8 : 4); c++) {
                tpu_dtype dt = dts[d];
                if (op == 0 && dt == TPU_BOOL) continue;
                size_t es = tpu_dtype_size(dt);
                char *o1 = malloc(n * es), *o2 = malloc(n * es);
                tpu_kargs a;
                memset(&a, 0, sizeof a);
                a.op = op ? TPU_OP_RAND_BERNOULLI : TPU_OP_RAND_UNIFORM;
                a.n = 1;
                tpu_tensor_contiguous(&a.t[0], o1, dt, 1, &n);
                a.p.i[0] = 1234567 + c;
                a.p.i[1] = 3 + d;
                a.p.f[0] = op ? probs[c] : ranges[c][0];
                a.p.f[1] = op ? 0 : ranges[c][1];
                tpu_kargs b = a;
                b.t[0].base = o2;
                CHECK_OK(tpu_k_random(&a));
                CHECK_OK(tpu_ref_random(&b));
                CHECK_MSG(memcmp(o1, o2, n * es) == 0, "op %d dtype %s case %d", op, tpu_dtype_name(dt), c);
                int64_t pos[] = {0, 1, 3, 4, 1021, 2999};
                int len[] = {1, 7, 8, 9, 257, 1100};
                for (int q = 0; q < 6; q++) {
                    CHECK(tpu_random_floats(&a, pos[q], len[q], a.p.f[0], out));
                    tpu_rand_cache cache = {0};
                    bool same = true;
                    for (int j = 0; j < len[q]; j++) {
                        double fv = 0;
                        int64_t iv = 0;
                        tpu_random_element(&a, pos[q] + j, &cache, a.p.f[0], &fv, &iv);
                        same = same && out[j] == (float)fv;
                    }
                    CHECK_MSG(same, "op %d dtype %s case %d at %lld+%d", op, tpu_dtype_name(dt), c, (long long)pos[q],
                              len[q]);
                }
                free(o1);
                free(o2);
            }
}

static void test_triangle_vs_ref(void) {
    /* (2, 5, 7) float32 viewed transposed in the last two dims, and int64 */
    int64_t sz[3] = {2, 7, 5};
    for (int dt = 0; dt < 2; dt++) {
        tpu_dtype t = dt ? TPU_I64 : TPU_F32;
        size_t es = tpu_dtype_size(t);
        char *x = malloc(70 * es), *o1 = malloc(70 * es + 16), *o2 = malloc(70 * es + 16);
        for (int i = 0; i < 70; i++) tpu_store_f64(x + i * es, t, i + 1);
        for (int op = 0; op < 2; op++)
            for (int64_t diag = -3; diag <= 3; diag++) {
                memset(o1, 0x5a, 70 * es + 16);
                memset(o2, 0x33, 70 * es + 16);
                tpu_kargs a;
                memset(&a, 0, sizeof a);
                a.op = op ? TPU_OP_TRIU : TPU_OP_TRIL;
                a.n = 2;
                a.p.i[0] = diag;
                int64_t osz[3] = {2, 5, 7};
                tpu_tensor_contiguous(&a.t[0], o1, t, 3, osz);
                tpu_tensor_contiguous(&a.t[1], x, t, 3, sz);
                a.t[1].sizes[1] = 5;
                a.t[1].sizes[2] = 7;
                a.t[1].strides[1] = 1;
                a.t[1].strides[2] = 5; /* transposed */
                tpu_kargs b = a;
                b.t[0].base = o2;
                CHECK_OK(tpu_k_shape(&a));
                CHECK_OK(tpu_ref_shape(&b));
                CHECK(memcmp(o1, o2, 70 * es) == 0);
                CHECK((unsigned char)o1[70 * es] == 0x5a);
                /* spot check: tril keeps (i=0, j=0) when diag >= 0 */
                double v = tpu_load_f64(o1, t);
                CHECK(op == 0 ? (diag >= 0 ? v == 1 : v == 0) : (diag <= 0 ? v == 1 : v == 0));
            }
        free(x);
        free(o1);
        free(o2);
    }
}

/* Four threads, each with its own stream, run ops at once. */
static void *thread_body(void *arg) {
    int id = (int)(intptr_t)arg;
    tpu_stream_t s;
    if (tpu_stream_create(0, 0, &s)) return (void *)1;
    int64_t n = 10000;
    void *d;
    if (tpu_malloc(0, n * 4, s, &d)) return (void *)1;
    tpu_tensor t[3];
    tpu_tensor_contiguous(&t[0], d, TPU_F32, 1, &n);
    t[1] = tpu_tensor_scalar_f(id, TPU_F32);
    tpu_params p = {.f = {1.0}, .compute_dtype = TPU_F32};
    uintptr_t bad = tpu_launch(s, TPU_OP_FILL, t, 2, &p) != TPU_OK;
    t[1] = t[0];
    t[2] = tpu_tensor_scalar_f(1.0, TPU_F32);
    for (int i = 0; i < 50; i++) bad |= tpu_launch(s, TPU_OP_ADD, t, 3, &p) != TPU_OK;
    float h[3];
    bad |= tpu_memcpy(h, d, sizeof h, TPU_COPY_D2H, s) != TPU_OK;
    bad |= h[0] != (float)(id + 50) || h[2] != (float)(id + 50);
    tpu_free(d);
    tpu_stream_destroy(s);
    return (void *)bad;
}

static void test_threads(void) {
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, thread_body, (void *)(intptr_t)i);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        CHECK(r == NULL);
    }
}

/* Fused Eager from four threads at once, each on its own stream: windows
 * recorded, flushed by their own copies and by tpu_flush(NULL) from other
 * threads, with frees held by the windows. */
static void *fused_body(void *arg) {
    int id = (int)(intptr_t)arg;
    tpu_stream_t s;
    if (tpu_stream_create(0, 0, &s)) return (void *)1;
    tpu_stream_set_current(s);
    int64_t n = 5000;
    void *d;
    if (tpu_malloc(0, n * 4, s, &d)) return (void *)1;
    tpu_tensor t[3];
    tpu_tensor_contiguous(&t[0], d, TPU_F32, 1, &n);
    t[1] = tpu_tensor_scalar_f(id, TPU_F32);
    tpu_params p = {.f = {1.0}, .compute_dtype = TPU_F32};
    uintptr_t bad = tpu_launch(s, TPU_OP_FILL, t, 2, &p) != TPU_OK;
    for (int i = 0; i < 40; i++) {
        void *nd;
        if (tpu_malloc(0, n * 4, s, &nd)) return (void *)1;
        tpu_tensor a[3] = {t[0], t[0], tpu_tensor_scalar_f(1.0, TPU_F32)};
        a[0].base = nd;
        bad |= tpu_launch(s, TPU_OP_ADD, a, 3, &p) != TPU_OK;
        bad |= tpu_free(d) != TPU_OK;
        d = nd;
        t[0].base = d;
        if (i % 13 == id) bad |= tpu_flush(NULL) != TPU_OK;
    }
    float h[3];
    bad |= tpu_memcpy(h, d, sizeof h, TPU_COPY_D2H, s) != TPU_OK;
    bad |= h[0] != (float)(id + 40) || h[2] != (float)(id + 40);
    tpu_free(d);
    tpu_stream_set_current(tpu_stream_default(0));
    tpu_stream_destroy(s);
    return (void *)bad;
}

static void test_fused_threads(void) {
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_FUSED));
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, fused_body, (void *)(intptr_t)i);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        CHECK(r == NULL);
    }
    CHECK_OK(tpu_set_eager_mode(TPU_EAGER_STRICT));
    CHECK_OK(tpu_device_synchronize(0));
}

static void test_second_device(void) {
    void *a;
    CHECK_OK(tpu_malloc(1, 4096, NULL, &a));
    CHECK(tpu_mem_device_of(a) == 1);
    fill_f32(a, 1024, 3.0, tpu_stream_default(1));
    float *r = dev_to_host_f32(a, 1024);
    CHECK(r[1023] == 3.0f);
    free(r);
    /* Device 0's stream cannot run device 1's memory. */
    int64_t n = 4;
    tpu_tensor t[2];
    tpu_tensor_contiguous(&t[0], a, TPU_F32, 1, &n);
    t[1] = tpu_tensor_scalar_f(1, TPU_F32);
    CHECK(tpu_launch(tpu_stream_default(0), TPU_OP_FILL, t, 2, NULL) == TPU_ERROR_DEVICE_MISMATCH);
    CHECK(strstr(tpu_last_error(), "same device") != NULL);
    CHECK_OK(tpu_free(a));
}

/* ---- configuration, the stream pool, the bounded queue, interrupts ---- */

static const char *const *fake_env;
static const char *fake_get(const char *name) {
    for (int i = 0; fake_env[i]; i += 2)
        if (strcmp(fake_env[i], name) == 0) return fake_env[i + 1];
    return NULL;
}

/* Every variable: accepted forms parse to the right value, everything else is
 * an error naming the variable, its value and what is accepted. */
static void test_config_parse(void) {
    static const struct {
        const char *name, *val;
        long long want;
    } good[] = {
        {"TPU_NUM_DEVICES", "1", 1},
        {"TPU_NUM_DEVICES", "16", 16},
        {"TPU_NUM_DEVICES", "007", 7},
        {"TPU_NUM_DEVICES", "", 1},
        {"TPU_HBM_BYTES", "1048576", 1 << 20},
        {"TPU_HBM_BYTES", "64M", 64 << 20},
        {"TPU_HBM_BYTES", "64MiB", 64 << 20},
        {"TPU_HBM_BYTES", "2g", 2LL << 30},
        {"TPU_HBM_BYTES", "1T", 1LL << 40},
        {"TPU_HBM_BYTES", "1048577", 1 << 20}, /* page-rounded */
        {"TPU_HBM_BYTES", "17592186040320", (1LL << 44) - 4096},
        {"TPU_NUM_WORKERS", "1", 1},
        {"TPU_NUM_WORKERS", "64", 64},
        {"TPU_MXU", "portable", 1},
        {"TPU_MXU", "auto", 0},
        {"TPU_MXU", "no-amx", 2},
        {"TORCH_TPU_LAUNCH_BLOCKING", "1", -1},
        {"TORCH_TPU_CPU_FALLBACK", "0", -1},
        {"TORCH_TPU_DEFER_AND_FUSE", "0", -1},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        const char *env[] = {good[i].name, good[i].val, NULL};
        fake_env = env;
        tpu_config c;
        tpu_status st = tpu_config_parse(fake_get, &c);
        CHECK_MSG(st == TPU_OK, "%s=%s: %s", good[i].name, good[i].val, tpu_last_error());
        long long got = strcmp(good[i].name, "TPU_NUM_DEVICES") == 0   ? c.num_devices
                        : strcmp(good[i].name, "TPU_HBM_BYTES") == 0   ? (long long)c.hbm_bytes
                        : strcmp(good[i].name, "TPU_NUM_WORKERS") == 0 ? c.num_workers
                        : strcmp(good[i].name, "TPU_MXU") == 0         ? c.mxu_choice
                                                                       : -1;
        CHECK_MSG(got == good[i].want, "%s=%s gave %lld", good[i].name, good[i].val, got);
    }
    static const struct {
        const char *name, *val, *accepted;
    } bad[] = {
        {"TPU_NUM_DEVICES", "-1", "from 1 to 16"},
        {"TPU_NUM_DEVICES", "0", "from 1 to 16"},
        {"TPU_NUM_DEVICES", "99", "from 1 to 16"},
        {"TPU_NUM_DEVICES", "17", "from 1 to 16"},
        {"TPU_NUM_DEVICES", "abc", "from 1 to 16"},
        {"TPU_NUM_DEVICES", " 2", "from 1 to 16"},
        {"TPU_NUM_DEVICES", "2 ", "from 1 to 16"},
        {"TPU_NUM_DEVICES", "+2", "from 1 to 16"},
        {"TPU_NUM_DEVICES", "0x2", "from 1 to 16"},
        {"TPU_NUM_DEVICES", "99999999999999999999999", "from 1 to 16"},
        {"TPU_HBM_BYTES", "-1", "binary suffix"},
        {"TPU_HBM_BYTES", "0", "from 1048576"},
        {"TPU_HBM_BYTES", "1.5G", "binary suffix"},
        {"TPU_HBM_BYTES", "1048575", "from 1048576"},
        {"TPU_HBM_BYTES", "16T", "16T - 4K"},
        {"TPU_HBM_BYTES", "12Q", "binary suffix"},
        {"TPU_HBM_BYTES", "1GB", "binary suffix"},
        {"TPU_HBM_BYTES", "G", "binary suffix"},
        {"TPU_HBM_BYTES", "99999999999T", "binary suffix"},
        {"TPU_HBM_BYTES", "1Gi", "binary suffix"},
        {"TPU_NUM_WORKERS", "0", "from 1 to 64"},
        {"TPU_NUM_WORKERS", "65", "from 1 to 64"},
        {"TPU_NUM_WORKERS", "four", "from 1 to 64"},
        {"TPU_MXU", "amx", "'auto', 'portable' or 'no-amx'"},
        {"TORCH_TPU_LAUNCH_BLOCKING", "yes", "0 or 1"},
        {"TORCH_TPU_CPU_FALLBACK", "off", "0 or 1"},
        {"TORCH_TPU_DEFER_AND_FUSE", "true", "0 or 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *env[] = {bad[i].name, bad[i].val, NULL};
        fake_env = env;
        tpu_config c;
        char quoted[128];
        snprintf(quoted, sizeof quoted, "%s='%s'", bad[i].name, bad[i].val);
        CHECK_MSG(tpu_config_parse(fake_get, &c) == TPU_ERROR_INVALID_VALUE, "%s accepted", quoted);
        CHECK_MSG(strstr(tpu_last_error(), quoted) && strstr(tpu_last_error(), bad[i].accepted), "%s: message '%s'",
                  quoted, tpu_last_error());
        CHECK(c.num_devices == 1 && c.hbm_bytes == (size_t)16 << 30); /* defaults, never used by a chip */
    }
    /* Several bad values: every one is named. */
    const char *env[] = {"TPU_NUM_DEVICES", "0", "TPU_HBM_BYTES", "1.5G", "TPU_NUM_WORKERS", "64", NULL};
    fake_env = env;
    tpu_config c;
    CHECK(tpu_config_parse(fake_get, &c) == TPU_ERROR_INVALID_VALUE);
    CHECK(strstr(tpu_last_error(), "TPU_NUM_DEVICES='0'") && strstr(tpu_last_error(), "TPU_HBM_BYTES='1.5G'"));
    CHECK(c.num_workers == 64);
    /* The process's own (valid) configuration. */
    CHECK_OK(tpu_init());
}

static int count_threads(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int n = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1) break;
    if (f) fclose(f);
    return n;
}

static _Atomic int gate; /* callbacks block while 0 */
static void gate_cb(void *u) {
    (void)u;
    while (!atomic_load(&gate)) usleep(200);
}
static void count_cb(void *u) { atomic_fetch_add((_Atomic int *)u, 1); }

/* Any number of streams map onto the fixed pool: ids stay in range, threads
 * stay bounded, device synchronization covers all of them. */
static void test_stream_pool(void) {
    int before = count_threads();
    tpu_stream_t first_low = NULL, first_high = NULL;
    _Atomic int ran = 0;
    atomic_store(&gate, 0);
    tpu_stream_t gated = NULL;
    for (int i = 0; i < 1500; i++) {
        tpu_stream_t s;
        bool high = i % 3 == 0;
        CHECK_OK(tpu_stream_create(0, high ? -1 : 0, &s));
        int64_t id = tpu_stream_id(s);
        CHECK_MSG(high ? id > TPU_STREAM_POOL_SIZE && id <= 2 * TPU_STREAM_POOL_SIZE
                       : id >= 1 && id <= TPU_STREAM_POOL_SIZE,
                  "stream %d has id %lld", i, (long long)id);
        CHECK(tpu_stream_priority(s) == (high ? -1 : 0));
        CHECK(tpu_stream_from_id(0, id) == s);
        if (!high && !first_low) first_low = s;
        if (high && !first_high) first_high = s;
        if (i == 1400) {
            gated = s;
            CHECK_OK(tpu_stream_add_callback(s, gate_cb, NULL));
        }
        CHECK_OK(tpu_stream_add_callback(s, count_cb, (void *)&ran));
        if (i < 1400) CHECK_OK(tpu_stream_destroy(s)); /* waits for its queue, which a later stream may share */
    }
    int during = count_threads();
    CHECK_MSG(during - before <= 2 * TPU_STREAM_POOL_SIZE + 1, "%d threads before, %d after 1500 streams", before,
              during);
    CHECK(tpu_stream_query(gated) == TPU_ERROR_NOT_READY);
    atomic_store(&gate, 1);
    CHECK_OK(tpu_device_synchronize(0));
    CHECK(atomic_load(&ran) == 1500); /* every stream's work, the 1401st's included */
    CHECK(tpu_stream_from_id(0, 2 * TPU_STREAM_POOL_SIZE + 1) == NULL && tpu_stream_from_id(0, -1) == NULL);
    CHECK(tpu_stream_from_id(7, 1) == NULL);
    CHECK(first_low != first_high);
}

static _Atomic int launched;
static void *launch_body(void *arg) {
    tpu_stream_t s = arg;
    for (int i = 0; i < TPU_STREAM_QUEUE_DEPTH + 100; i++) {
        if (tpu_stream_add_callback(s, gate_cb, NULL)) return (void *)1;
        atomic_fetch_add(&launched, 1);
    }
    return NULL;
}

/* A full queue makes the launching thread wait until a command completes. */
static void test_queue_bound(void) {
    tpu_stream_t s;
    CHECK_OK(tpu_stream_create(0, 0, &s));
    CHECK_OK(tpu_stream_synchronize(s));
    atomic_store(&gate, 0);
    atomic_store(&launched, 0);
    pthread_t th;
    pthread_create(&th, NULL, launch_body, s);
    usleep(200000);
    int n = atomic_load(&launched);
    CHECK_MSG(n >= TPU_STREAM_QUEUE_DEPTH - 1 && n <= TPU_STREAM_QUEUE_DEPTH, "%d commands queued behind a blocked one",
              n);
    atomic_store(&gate, 1);
    void *r;
    pthread_join(th, &r);
    CHECK(r == NULL && atomic_load(&launched) == TPU_STREAM_QUEUE_DEPTH + 100);
    CHECK_OK(tpu_stream_synchronize(s));
}

static _Atomic int interrupt_after; /* the check says "interrupted" once this many calls have been made */
static _Atomic int interrupt_calls;
static bool test_interrupt_check(void) {
    return atomic_fetch_add(&interrupt_calls, 1) + 1 >= atomic_load(&interrupt_after);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Host waits give up when the interrupt check fires; the work keeps running,
 * a copy whose caller gave up never runs, and the device stays usable. */
static void test_interrupt(void) {
    tpu_stream_t s;
    CHECK_OK(tpu_stream_create(0, 0, &s));
    void *d;
    CHECK_OK(tpu_malloc(0, 4096, s, &d));
    fill_f32(d, 1024, 5.0, s);
    CHECK_OK(tpu_stream_synchronize(s));
    atomic_store(&gate, 0);
    CHECK_OK(tpu_stream_add_callback(s, gate_cb, NULL));
    tpu_event_t e;
    CHECK_OK(tpu_event_create(false, &e));
    CHECK_OK(tpu_event_record(e, s));
    atomic_store(&interrupt_calls, 0);
    atomic_store(&interrupt_after, 3);
    tpu_set_interrupt_check(test_interrupt_check);
    double t0 = now_s();
    CHECK(tpu_stream_synchronize(s) == TPU_ERROR_INTERRUPTED);
    double dt = now_s() - t0;
    CHECK_MSG(dt >= 0.1 && dt < 1.0, "interrupted after %.3f s (3 checks, 50 ms apart)", dt);
    CHECK(strstr(tpu_last_error(), "interrupted") != NULL);
    CHECK(tpu_interrupted());
    /* Latched: later waits fail at once, without asking the check again. */
    int calls = atomic_load(&interrupt_calls);
    CHECK(tpu_event_synchronize(e) == TPU_ERROR_INTERRUPTED);
    CHECK(tpu_device_synchronize(0) == TPU_ERROR_INTERRUPTED);
    CHECK(atomic_load(&interrupt_calls) == calls);
    tpu_interrupt_clear();
    CHECK(!tpu_interrupted());
    /* A read of device memory queued behind the blocked work: the copy is
     * cancelled, the host buffer never written, the caller told. */
    float h[4] = {-1, -1, -1, -1};
    atomic_store(&interrupt_after, 0);
    CHECK(tpu_memcpy(h, d, sizeof h, TPU_COPY_D2H, s) == TPU_ERROR_INTERRUPTED);
    tpu_interrupt_clear();
    /* A launch into a full queue gives up too (the command is not queued). */
    for (int i = 0; i < TPU_STREAM_QUEUE_DEPTH; i++)
        if (tpu_stream_enqueued(s) - tpu_stream_completed(s) < TPU_STREAM_QUEUE_DEPTH)
            CHECK_OK(tpu_stream_add_callback(s, count_cb, (void *)&interrupt_calls));
    uint64_t queued = tpu_stream_enqueued(s);
    CHECK(tpu_stream_add_callback(s, count_cb, NULL) == TPU_ERROR_INTERRUPTED);
    CHECK(tpu_stream_enqueued(s) == queued);
    tpu_interrupt_clear();
    tpu_set_interrupt_check(NULL);
    CHECK(tpu_event_query(e) == TPU_ERROR_NOT_READY); /* nothing ran past the gate */
    atomic_store(&gate, 1);
    CHECK_OK(tpu_stream_synchronize(s));
    CHECK_OK(tpu_event_synchronize(e));
    CHECK(h[0] == -1 && h[3] == -1); /* the cancelled copy never ran */
    CHECK_OK(tpu_memcpy(h, d, sizeof h, TPU_COPY_D2H, s));
    CHECK(h[0] == 5.0f && h[3] == 5.0f); /* and the device still works */
    CHECK_OK(tpu_event_destroy(e));
    CHECK_OK(tpu_free(d));
}

/* Re-recording an event does not wait for its previous record; destroying
 * one with a record still queued is safe. */
static void test_event_rerecord(void) {
    tpu_stream_t s1, s2;
    CHECK_OK(tpu_stream_create(0, 0, &s1));
    CHECK_OK(tpu_stream_create(0, 0, &s2));
    atomic_store(&gate, 0);
    CHECK_OK(tpu_stream_add_callback(s1, gate_cb, NULL));
    tpu_event_t a, b, c;
    CHECK_OK(tpu_event_create(true, &a));
    CHECK_OK(tpu_event_create(true, &b));
    CHECK_OK(tpu_event_create(true, &c));
    CHECK_OK(tpu_event_record(a, s1)); /* stuck behind the gate */
    CHECK_OK(tpu_event_record(c, s1));
    CHECK_OK(tpu_event_destroy(c)); /* freed once its record has run */
    double t0 = now_s();
    CHECK_OK(tpu_event_record(a, s2)); /* re-record elsewhere: returns at once */
    CHECK_OK(tpu_event_record(b, s2));
    CHECK(now_s() - t0 < 0.5);
    CHECK_OK(tpu_event_synchronize(b));
    CHECK_OK(tpu_event_query(a)); /* the latest record counts */
    float ms = -1;
    CHECK_OK(tpu_event_elapsed_ms(a, b, &ms));
    CHECK(ms >= 0 && ms < 500);
    atomic_store(&gate, 1);
    CHECK_OK(tpu_device_synchronize(0));
    tpu_event_destroy(a);
    tpu_event_destroy(b);
}

int main(int argc, char **argv) {
    setenv("TPU_HBM_BYTES", "67108864", 1);
    setenv("TPU_NUM_DEVICES", "2", 1);
    bool tsan_subset = argc > 1 && strcmp(argv[1], "--threads") == 0;
    RUN_TEST(test_devices);
    RUN_TEST(test_alloc_reuse_and_stats);
    RUN_TEST(test_stream_order);
    RUN_TEST(test_small_kernels_keep_order);
    RUN_TEST(test_events);
    RUN_TEST(test_stream_ordered_reuse);
    RUN_TEST(test_threads);
    RUN_TEST(test_fused_threads);
    RUN_TEST(test_async_error);
    RUN_TEST(test_stream_pool);
    RUN_TEST(test_queue_bound);
    RUN_TEST(test_interrupt);
    RUN_TEST(test_event_rerecord);
    if (!tsan_subset) {
        RUN_TEST(test_config_parse);
        RUN_TEST(test_oom);
        RUN_TEST(test_fault_injection);
        RUN_TEST(test_copies_and_fill);
        RUN_TEST(test_launch_validation);
        RUN_TEST(test_philox_vectors);
        RUN_TEST(test_gemm_vs_ref);
        RUN_TEST(test_random_vs_ref);
        RUN_TEST(test_random_batched_vs_element);
        RUN_TEST(test_triangle_vs_ref);
        RUN_TEST(test_second_device);
    }
    return TEST_SUMMARY();
}
