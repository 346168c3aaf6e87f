/* compute.c - what every kernel family shares about the machine: the host
 * CPU's features (probed once) and the compute pool, which the device floor
 * registers at start-up so that no kernel reaches up into vtpu/. */
#define _GNU_SOURCE /* syscall */
#include "kernels/kernels-impl.h"
#include <cpuid.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

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
        /* AMX-BF16 and AMX-TILE, with XTILECFG and XTILEDATA enabled in XCR0
         * (xgetbv needs OSXSAVE, leaf 1's ecx bit 27). */
        unsigned a7, b7, c7, d7;
        bool osxsave = __get_cpuid(1, &a7, &b7, &c7, &d7) && ((c7 >> 27) & 1);
        if (((d >> 22) & 1) && ((d >> 24) & 1) && osxsave) {
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            if (((lo >> 17) & 3) == 3) f |= TPU_CPU_AMX;
        }
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

static int mxu_choice(void) {
    const tpu_compute_iface *c = atomic_load_explicit(&compute, memory_order_acquire);
    return c ? c->mxu_choice : TPU_MXU_CHOICE_AUTO;
}

/* Linux keeps AMX's tile data (8 KiB of state) off until a process asks for
 * it: ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, granted to the whole
 * process. Refused (older kernel, a thread's sigaltstack too small for the
 * larger signal frame) means no AMX: the AVX-512 unit runs instead. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18

bool tpu_amx_usable(void) {
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_acquire);
    if (v < 0) {
        v = (tpu_cpu_features() & TPU_CPU_AMX) && (tpu_cpu_features() & TPU_CPU_AVX512BF16) &&
            syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
        atomic_store_explicit(&cached, v, memory_order_release);
    }
    return v == 1;
}

tpu_mxu_kind tpu_mxu_detected(void) {
    int choice = mxu_choice();
    if (choice == TPU_MXU_CHOICE_PORTABLE) return TPU_MXU_PORTABLE;
    unsigned f = tpu_cpu_features();
    if (choice != TPU_MXU_CHOICE_NO_AMX && tpu_amx_usable()) return TPU_MXU_AMX;
    if (f & TPU_CPU_AVX512BF16) return TPU_MXU_AVX512_BF16;
    return ((f & TPU_CPU_AVX2) && (f & TPU_CPU_FMA)) ? TPU_MXU_AVX2_FMA : TPU_MXU_PORTABLE;
}
