/* compute.c - what every kernel family shares about the machine: the host
 * CPU's features (probed once) and the compute pool, which the device floor
 * registers at start-up so that no kernel reaches up into vtpu/. */
#include "kernels/kernels-impl.h"
#include <cpuid.h>
#include <stdatomic.h>

static _Atomic(const tpu_compute_iface *) compute;

void tpu_kernels_set_compute(const tpu_compute_iface *c) { atomic_store_explicit(&compute, c, memory_order_release); }

void tpu_parallel_for(int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t b, int64_t e), void *ctx) {
    const tpu_compute_iface *c = atomic_load_explicit(&compute, memory_order_acquire);
    if (c)
        c->parallel_for(n, grain, fn, ctx);
    else if (n > 0)
        fn(ctx, 0, n);
}

int tpu_compute_workers(void) {
    const tpu_compute_iface *c = atomic_load_explicit(&compute, memory_order_acquire);
    return c ? c->num_workers() : 1;
}

static unsigned probe_cpu(void) {
    __builtin_cpu_init();
    unsigned f = 0;
    if (__builtin_cpu_supports("avx")) f |= TPU_CPU_AVX;
    if (__builtin_cpu_supports("avx2")) f |= TPU_CPU_AVX2;
    if (__builtin_cpu_supports("fma")) f |= TPU_CPU_FMA;
    if (__builtin_cpu_supports("avx512f")) f |= TPU_CPU_AVX512F;
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        if (((d >> 22) & 1) && ((d >> 24) & 1)) f |= TPU_CPU_AMX;
        unsigned a1 = 0, b1, c1, d1;
        __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
        /* vdpbf16ps needs the CPUID bit, AVX-512F in CPUID and the OS's AVX-512 state. */
        if (((a1 >> 5) & 1) && ((b >> 16) & 1) && (f & TPU_CPU_AVX512F)) f |= TPU_CPU_AVX512BF16;
    }
    return f;
}

unsigned tpu_cpu_features(void) {
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        v = (int)probe_cpu();
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return (unsigned)v;
}

static bool tpu_mxu_forced_portable(void) {
    const tpu_compute_iface *c = atomic_load_explicit(&compute, memory_order_acquire);
    return c && c->mxu_portable;
}

tpu_mxu_kind tpu_mxu_detected(void) {
    if (tpu_mxu_forced_portable()) return TPU_MXU_PORTABLE;
    /* AMX also needs the OS to grant the tile state; we do not use AMX tiles
     * yet (no AMX host to test on), so it is reported but not selected. */
    unsigned f = tpu_cpu_features();
    if (f & TPU_CPU_AVX512BF16) return TPU_MXU_AVX512_BF16;
    return ((f & TPU_CPU_AVX2) && (f & TPU_CPU_FMA)) ? TPU_MXU_AVX2_FMA : TPU_MXU_PORTABLE;
}
