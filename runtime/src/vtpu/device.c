/* device.c - the vTPU chips: discovery, lazy bring-up of device memory,
 * properties, the per-thread current device, and fork safety.
 *
 * A chip's memory is one anonymous MAP_NORESERVE mapping of TPU_HBM_BYTES:
 * pages cost RAM only once touched, so an idle chip is free. Host code sees
 * only device addresses ((dev+1) << 44 + offset), which the runtime
 * translates; they are not mapped in the host's address space. */
#define _GNU_SOURCE
#include "vtpu-impl.h"
#include <cpuid.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static tpu_chip chips[TPU_MAX_DEVICES];
static int num_chips = -1;
static pthread_once_t count_once = PTHREAD_ONCE_INIT;
static atomic_bool any_initialized;
static atomic_bool forked_child;
static _Thread_local int cur_dev;

size_t tpu_env_size(const char *name, size_t dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v) return dflt;
    if (*end == 'k' || *end == 'K') x <<= 10;
    else if (*end == 'm' || *end == 'M') x <<= 20;
    else if (*end == 'g' || *end == 'G') x <<= 30;
    return (size_t)x;
}

static void atfork_child(void) {
    if (atomic_load_explicit(&any_initialized, memory_order_relaxed))
        atomic_store_explicit(&forked_child, true, memory_order_relaxed);
}

static void count_init(void) {
    size_t n = tpu_env_size("TPU_NUM_DEVICES", 1);
    if (n < 1) n = 1;
    if (n > TPU_MAX_DEVICES) n = TPU_MAX_DEVICES;
    num_chips = (int)n;
    for (int d = 0; d < TPU_MAX_DEVICES; d++) {
        chips[d].index = d;
        chips[d].once = (pthread_once_t)PTHREAD_ONCE_INIT;
    }
    pthread_atfork(NULL, NULL, atfork_child);
}

int tpu_device_count(void) {
    pthread_once(&count_once, count_init);
    return num_chips;
}

bool tpu_is_initialized(void) { return atomic_load_explicit(&any_initialized, memory_order_relaxed); }
bool tpu_is_forked_child(void) { return atomic_load_explicit(&forked_child, memory_order_relaxed); }

tpu_status tpu_check_fork(void) {
    if (atomic_load_explicit(&forked_child, memory_order_relaxed))
        return tpu_set_error(TPU_ERROR_FORKED,
            "Cannot re-initialize TPU in forked subprocess. To use TPU with multiprocessing, "
            "you must use the 'spawn' start method");
    return TPU_OK;
}

/* Per-chip bring-up (runs once per chip, under pthread_once). */
static int init_dev;
static void chip_init(void) {
    tpu_chip *c = &chips[init_dev];
    size_t cap = tpu_env_size("TPU_HBM_BYTES", (size_t)16 << 30);
    if (cap < ((size_t)1 << 20)) cap = (size_t)1 << 20;
    if (cap >= ((size_t)1 << TPU_DEVADDR_SHIFT)) cap = ((size_t)1 << TPU_DEVADDR_SHIFT) - 4096;
    cap &= ~(size_t)4095;
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        c->init_status = tpu_set_error(TPU_ERROR_OUT_OF_MEMORY,
            "could not reserve %zu bytes of address space for tpu:%d", cap, c->index);
        return;
    }
    c->arena = p;
    c->capacity = cap;
    c->alloc = tpu_alloc_create(c);
    c->default_stream = tpu_stream_new_internal(c->index, 0, 0);
    if (!c->alloc || !c->default_stream) {
        c->init_status = tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "could not bring up tpu:%d", c->index);
        return;
    }
    atomic_store_explicit(&any_initialized, true, memory_order_relaxed);
    c->init_status = TPU_OK;
}

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;

tpu_status tpu_chip_get(int dev, tpu_chip **out) {
    tpu_status s = tpu_check_fork();
    if (s) return s;
    int n = tpu_device_count();
    if (dev < 0 || dev >= n)
        return tpu_set_error(TPU_ERROR_INVALID_DEVICE,
            "Invalid device index %d: there %s %d tpu device%s (valid indices 0..%d)",
            dev, n == 1 ? "is" : "are", n, n == 1 ? "" : "s", n - 1);
    tpu_chip *c = &chips[dev];
    if (!c->arena) {
        pthread_mutex_lock(&init_mu);
        if (!c->arena && c->init_status == TPU_OK) { init_dev = dev; chip_init(); }
        pthread_mutex_unlock(&init_mu);
    }
    if (c->init_status) return c->init_status;
    *out = c;
    return TPU_OK;
}

void *tpu_dev_to_host(const void *devptr) {
    uintptr_t a = (uintptr_t)devptr;
    uintptr_t d = (a >> TPU_DEVADDR_SHIFT);
    if (d < 1 || d > (uintptr_t)TPU_MAX_DEVICES) return NULL;
    tpu_chip *c = &chips[d - 1];
    uintptr_t off = a & (((uintptr_t)1 << TPU_DEVADDR_SHIFT) - 1);
    if (!c->arena || off > c->capacity) return NULL;
    return c->arena + off;
}

int tpu_mem_device_of(const void *devptr) {
    uintptr_t a = (uintptr_t)devptr;
    uintptr_t d = a >> TPU_DEVADDR_SHIFT;
    if (d < 1 || d > (uintptr_t)tpu_device_count()) return -1;
    return chips[d - 1].arena ? (int)(d - 1) : -1;
}

static tpu_mxu_kind detect_mxu(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return TPU_MXU_PORTABLE;
    bool amx = (d >> 22) & 1 && (d >> 24) & 1;
    unsigned a1 = 0, b1, c1, d1;
    __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
    bool bf16 = (a1 >> 5) & 1;
    bool avx512f = (b >> 16) & 1;
    /* AMX also needs the OS to grant the tile state; we do not use AMX tiles
     * yet (no AMX host to test on), so it is reported but not selected. */
    (void)amx;
    if (bf16 && avx512f && __builtin_cpu_supports("avx512f")) return TPU_MXU_AVX512_BF16;
    return TPU_MXU_PORTABLE;
}

bool tpu_host_has_amx(void);
bool tpu_host_has_amx(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return ((d >> 22) & 1) && ((d >> 24) & 1);
}

tpu_mxu_kind tpu_mxu_detected(void);
tpu_mxu_kind tpu_mxu_detected(void) {
    static int cached = -1;
    if (cached < 0) {
        const char *force = getenv("TPU_MXU");   /* "portable" forces the C path (tests) */
        cached = (force && strcmp(force, "portable") == 0) ? TPU_MXU_PORTABLE : (int)detect_mxu();
    }
    return (tpu_mxu_kind)cached;
}

const char *tpu_mxu_name(tpu_mxu_kind k) {
    switch (k) {
    case TPU_MXU_AMX: return "AMX";
    case TPU_MXU_AVX512_BF16: return "AVX512-BF16";
    default: return "portable";
    }
}

int tpu_num_workers(void);

tpu_status tpu_device_get_props(int dev, tpu_device_props *out) {
    tpu_status s = tpu_check_fork();
    if (s) return s;
    int n = tpu_device_count();
    if (dev < 0 || dev >= n)
        return tpu_set_error(TPU_ERROR_INVALID_DEVICE,
            "Invalid device index %d: there %s %d tpu device%s", dev, n == 1 ? "is" : "are", n, n == 1 ? "" : "s");
    memset(out, 0, sizeof *out);
    out->mxu = tpu_mxu_detected();
    snprintf(out->name, sizeof out->name, "vTPU (%s)", tpu_mxu_name(out->mxu));
    size_t cap = tpu_env_size("TPU_HBM_BYTES", (size_t)16 << 30);
    out->hbm_bytes = chips[dev].arena ? chips[dev].capacity : (cap & ~(size_t)4095);
    out->num_workers = tpu_num_workers();
    out->index = dev;
    return TPU_OK;
}

int tpu_device_current(void) { return cur_dev; }

tpu_status tpu_device_set(int dev) {
    int n = tpu_device_count();
    if (dev < 0 || dev >= n)
        return tpu_set_error(TPU_ERROR_INVALID_DEVICE,
            "Invalid device index %d: there %s %d tpu device%s", dev, n == 1 ? "is" : "are", n, n == 1 ? "" : "s");
    cur_dev = dev;
    return TPU_OK;
}
