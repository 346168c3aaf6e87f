/*
 * peak.c - physical limits of this machine, for torch_tpu's benchmark harness.
 *
 * Measures, with hand-written kernels that keep the execution units busy:
 *   - fp32 FMA peak (AVX-512 if available, else AVX2/FMA, else scalar), 1 thread and N threads
 *   - bf16 dot-product peak with AVX512_BF16 (vdpbf16ps), 1 thread and N threads
 *   - bf16 AMX peak (tdpbf16ps), only if the CPU and the OS support AMX
 *   - DRAM read bandwidth, 1 thread and N threads
 * and prints one JSON object on stdout.
 *
 * Built by torch_tpu.bench with plain `gcc -O2 -pthread` (no -march): every
 * ISA-specific kernel carries its own target attribute and is only called
 * after a runtime check, so the binary builds and runs on any x86-64 (and the
 * non-x86 path falls back to scalar code).
 *
 * Usage: peak [--threads N] [--quick]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#define PEAK_X86 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile float g_sink; /* keeps results alive */
static int g_quick = 0;

/* ------------------------------------------------------------------------ */
/* Compute kernels. Each runs `iters` iterations and returns the FLOPs done. */

#define NACC 12 /* independent accumulators: enough to cover FMA latency x pipes */

static double kern_scalar_fma(long iters) {
    float acc[NACC];
    for (int k = 0; k < NACC; k++) acc[k] = (float)k;
    const float a = 0.999999f, b = 1e-6f;
    for (long i = 0; i < iters; i++)
        for (int k = 0; k < NACC; k++) acc[k] = acc[k] * a + b;
    float s = 0;
    for (int k = 0; k < NACC; k++) s += acc[k];
    g_sink = s;
    return 2.0 * NACC * (double)iters;
}

#ifdef PEAK_X86
__attribute__((target("avx2,fma"))) static double kern_avx2_fma(long iters) {
    __m256 acc[NACC];
    for (int k = 0; k < NACC; k++) acc[k] = _mm256_set1_ps((float)k);
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < NACC; k++) acc[k] = _mm256_fmadd_ps(acc[k], a, b);
    }
    __m256 s = acc[0];
    for (int k = 1; k < NACC; k++) s = _mm256_add_ps(s, acc[k]);
    float out[8];
    _mm256_storeu_ps(out, s);
    g_sink = out[0];
    return 2.0 * 8 * NACC * (double)iters;
}

__attribute__((target("avx512f"))) static double kern_avx512_fma(long iters) {
    __m512 acc[NACC];
    for (int k = 0; k < NACC; k++) acc[k] = _mm512_set1_ps((float)k);
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < NACC; k++) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
    }
    __m512 s = acc[0];
    for (int k = 1; k < NACC; k++) s = _mm512_add_ps(s, acc[k]);
    g_sink = _mm512_reduce_add_ps(s);
    return 2.0 * 16 * NACC * (double)iters;
}

/* vdpbf16ps: 32 bf16 pairs -> 16 fp32 lanes, i.e. 32 multiplies + 32 adds. */
__attribute__((target("avx512f,avx512bf16"))) static double kern_avx512_bf16(long iters) {
    __m512 acc[NACC];
    for (int k = 0; k < NACC; k++) acc[k] = _mm512_setzero_ps();
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80); /* 1.0 */
    const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3380); /* ~6e-8 */
    for (long i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int k = 0; k < NACC; k++) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
    }
    __m512 s = acc[0];
    for (int k = 1; k < NACC; k++) s = _mm512_add_ps(s, acc[k]);
    g_sink = _mm512_reduce_add_ps(s);
    return 64.0 * NACC * (double)iters;
}

/* ---- AMX ---------------------------------------------------------------- */
struct tilecfg {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static int amx_cpu_supported(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    if (!(amx_bf16 && amx_tile)) return 0;
    /* OSXSAVE + XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA) */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return 0;
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((lo >> 17) & 3) == 3;
}

static int amx_request_permission(void) {
#if defined(__x86_64__) && defined(SYS_arch_prctl)
    /* ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

/* 16x16 fp32 += 16x32 bf16 * 32x16 bf16: 16*16*32 MACs per tdpbf16ps */
__attribute__((target("amx-tile,amx-bf16"))) static double kern_amx_bf16(long iters) {
    static __thread uint16_t abuf[16 * 32] __attribute__((aligned(64)));
    static __thread float cbuf[16 * 16] __attribute__((aligned(64)));
    struct tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    for (int i = 0; i < 16 * 32; i++) abuf[i] = 0x3380;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, abuf, 64);
    _tile_loadd(5, abuf, 64);
    _tile_loadd(6, abuf, 64);
    _tile_loadd(7, abuf, 64);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, cbuf, 64);
    _tile_release();
    g_sink = cbuf[0];
    return 4.0 * 2.0 * 16 * 16 * 32 * (double)iters;
}
#endif /* PEAK_X86 */

/* ------------------------------------------------------------------------ */
/* Running a kernel on 1..N threads. */

typedef double (*kern_fn)(long);

struct job {
    kern_fn fn;
    long iters;
    int cpu;
    int needs_amx;
    pthread_barrier_t *bar;
    double flops;
    int ok;
};

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set); /* best effort */
}

static void *run_job(void *p) {
    struct job *j = p;
    if (j->cpu >= 0) pin(j->cpu);
#ifdef PEAK_X86
    if (j->needs_amx && !amx_request_permission()) {
        j->ok = 0;
        pthread_barrier_wait(j->bar);
        return NULL;
    }
#endif
    j->ok = 1;
    j->fn(j->iters / 100 + 1); /* warm up: clocks, AVX-512 power state */
    pthread_barrier_wait(j->bar);
    j->flops = j->fn(j->iters);
    return NULL;
}

/* Returns GFLOP/s over all threads (best of `trials`), or -1 on failure. */
static double measure(kern_fn fn, int nthreads, int needs_amx) {
    /* calibrate iterations so one trial lasts ~target seconds on one thread */
    double target = g_quick ? 0.03 : 0.25;
    int trials = g_quick ? 2 : 4;
    long iters = 1000;
    for (;;) {
        double t0 = now();
        fn(iters);
        double dt = now() - t0;
        if (dt > target / 8 || iters > (1L << 40)) {
            iters = (long)(iters * target / (dt > 1e-9 ? dt : 1e-9));
            break;
        }
        iters *= 4;
    }
    if (iters < 1) iters = 1;
    double best = -1;
    for (int t = 0; t < trials; t++) {
        pthread_t th[256];
        struct job jobs[256];
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)nthreads + 1);
        for (int i = 0; i < nthreads; i++) {
            jobs[i] = (struct job){fn, iters, nthreads > 1 ? i : -1, needs_amx, &bar, 0, 0};
            pthread_create(&th[i], NULL, run_job, &jobs[i]);
        }
        pthread_barrier_wait(&bar);
        double t0 = now();
        for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
        double dt = now() - t0;
        pthread_barrier_destroy(&bar);
        double fl = 0;
        int ok = 1;
        for (int i = 0; i < nthreads; i++) {
            fl += jobs[i].flops;
            ok &= jobs[i].ok;
        }
        if (!ok) return -1;
        double g = fl / dt / 1e9;
        if (g > best) best = g;
    }
    return best;
}

/* ------------------------------------------------------------------------ */
/* DRAM read bandwidth */

struct bwjob {
    const char *buf;
    size_t bytes;
    int cpu;
    pthread_barrier_t *bar;
    int passes;
};

#ifdef PEAK_X86
__attribute__((target("avx512f"))) static float read_avx512(const char *p, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        s0 = _mm512_add_ps(s0, _mm512_load_ps((const float *)(p + i)));
        s1 = _mm512_add_ps(s1, _mm512_load_ps((const float *)(p + i + 64)));
        s2 = _mm512_add_ps(s2, _mm512_load_ps((const float *)(p + i + 128)));
        s3 = _mm512_add_ps(s3, _mm512_load_ps((const float *)(p + i + 192)));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}
__attribute__((target("avx2"))) static float read_avx2(const char *p, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps((const float *)(p + i)));
        s1 = _mm256_add_ps(s1, _mm256_load_ps((const float *)(p + i + 32)));
        s2 = _mm256_add_ps(s2, _mm256_load_ps((const float *)(p + i + 64)));
        s3 = _mm256_add_ps(s3, _mm256_load_ps((const float *)(p + i + 96)));
    }
    float o[8];
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return o[0] + o[1] + o[2] + o[3] + o[4] + o[5] + o[6] + o[7];
}
#endif
static float read_scalar(const char *p, size_t n) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= n / 8; i += 4) {
        s0 += q[i];
        s1 += q[i + 1];
        s2 += q[i + 2];
        s3 += q[i + 3];
    }
    return (float)(s0 + s1 + s2 + s3);
}

static float (*g_read)(const char *, size_t) = read_scalar;
static const char *g_read_isa = "scalar";

static void *run_bw(void *p) {
    struct bwjob *j = p;
    if (j->cpu >= 0) pin(j->cpu);
    float s = 0;
    pthread_barrier_wait(j->bar);
    for (int k = 0; k < j->passes; k++) s += g_read(j->buf, j->bytes);
    g_sink = s;
    return NULL;
}

static double measure_bw(char *buf, size_t bytes, int nthreads) {
    int trials = g_quick ? 2 : 5, passes = g_quick ? 1 : 2;
    size_t chunk = (bytes / (size_t)nthreads) & ~(size_t)4095;
    double best = -1;
    for (int t = 0; t < trials; t++) {
        pthread_t th[256];
        struct bwjob jobs[256];
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)nthreads + 1);
        for (int i = 0; i < nthreads; i++) {
            jobs[i] = (struct bwjob){buf + (size_t)i * chunk, chunk, nthreads > 1 ? i : -1, &bar, passes};
            pthread_create(&th[i], NULL, run_bw, &jobs[i]);
        }
        pthread_barrier_wait(&bar);
        double t0 = now();
        for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
        double dt = now() - t0;
        pthread_barrier_destroy(&bar);
        double gbs = (double)chunk * nthreads * passes / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

/* ------------------------------------------------------------------------ */

static void emit(const char *key, double v, int last) {
    if (v < 0)
        printf("  \"%s\": null%s\n", key, last ? "" : ",");
    else
        printf("  \"%s\": %.3f%s\n", key, v, last ? "" : ",");
}

int main(int argc, char **argv) {
    int nthreads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            g_quick = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            nthreads = atoi(argv[++i]);
    }
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 256) nthreads = 256;

    int has_avx2 = 0, has_avx512 = 0, has_bf16 = 0, has_amx = 0, amx_os = 0;
    kern_fn fp32 = kern_scalar_fma;
    const char *fp32_isa = "scalar";
#ifdef PEAK_X86
    __builtin_cpu_init();
    has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    has_avx512 = __builtin_cpu_supports("avx512f");
    has_bf16 = has_avx512 && __builtin_cpu_supports("avx512bf16");
    has_amx = amx_cpu_supported();
    amx_os = has_amx && amx_request_permission();
    if (has_avx512) {
        fp32 = kern_avx512_fma;
        fp32_isa = "avx512";
        g_read = read_avx512;
        g_read_isa = "avx512";
    } else if (has_avx2) {
        fp32 = kern_avx2_fma;
        fp32_isa = "avx2";
        g_read = read_avx2;
        g_read_isa = "avx2";
    }
#endif

    double fp32_1 = measure(fp32, 1, 0), fp32_n = measure(fp32, nthreads, 0);
    double bf16_1 = -1, bf16_n = -1, amx_1 = -1, amx_n = -1;
#ifdef PEAK_X86
    if (has_bf16) {
        bf16_1 = measure(kern_avx512_bf16, 1, 0);
        bf16_n = measure(kern_avx512_bf16, nthreads, 0);
    }
    if (amx_os) {
        amx_1 = measure(kern_amx_bf16, 1, 1);
        amx_n = measure(kern_amx_bf16, nthreads, 1);
    }
#endif

    size_t bytes = (g_quick ? 256UL : 512UL) << 20;
    char *buf = aligned_alloc(4096, bytes);
    double bw_1 = -1, bw_n = -1;
    if (buf) {
        memset(buf, 1, bytes); /* fault every page in before timing */
        bw_1 = measure_bw(buf, bytes, 1);
        bw_n = measure_bw(buf, bytes, nthreads);
        free(buf);
    }

    printf("{\n");
    printf("  \"threads\": %d,\n", nthreads);
    printf("  \"quick\": %s,\n", g_quick ? "true" : "false");
    printf("  \"fp32_isa\": \"%s\",\n", fp32_isa);
    printf("  \"read_isa\": \"%s\",\n", g_read_isa);
    printf("  \"has_avx2_fma\": %s,\n", has_avx2 ? "true" : "false");
    printf("  \"has_avx512f\": %s,\n", has_avx512 ? "true" : "false");
    printf("  \"has_avx512_bf16\": %s,\n", has_bf16 ? "true" : "false");
    printf("  \"has_amx_bf16\": %s,\n", has_amx ? "true" : "false");
    printf("  \"amx_usable\": %s,\n", amx_os ? "true" : "false");
    printf("  \"dram_buffer_mib\": %zu,\n", bytes >> 20);
    emit("fp32_fma_gflops_1t", fp32_1, 0);
    emit("fp32_fma_gflops_nt", fp32_n, 0);
    emit("bf16_avx512_gflops_1t", bf16_1, 0);
    emit("bf16_avx512_gflops_nt", bf16_n, 0);
    emit("bf16_amx_gflops_1t", amx_1, 0);
    emit("bf16_amx_gflops_nt", amx_n, 0);
    emit("dram_read_gbs_1t", bw_1, 0);
    emit("dram_read_gbs_nt", bw_n, 1);
    printf("}\n");
    return 0;
}
