/* device.c - the vTPU chips: configuration from the environment, discovery,
 * lazy bring-up of device memory, properties, the per-thread current device,
 * and fork safety.
 *
 * A chip's memory is one anonymous MAP_NORESERVE mapping of TPU_HBM_BYTES:
 * pages cost RAM only once touched, so an idle chip is free. Host code sees
 * only device addresses ((dev+1) << 44 + offset), which the runtime
 * translates; they are not mapped in the host's address space. */
#define _GNU_SOURCE
#include "vtpu/vtpu-impl.h"
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

/* ---- configuration ----
 * Every environment variable the runtime reads is parsed here, strictly, once.
 * A bad value is never replaced by a default: it makes tpu_init() (and every
 * entry that needs a chip) fail with a message naming the variable, its value
 * and what is accepted. Unset or empty means the default. */

#define KIB         ((uint64_t)1 << 10)
#define HBM_MIN     ((uint64_t)1 << 20)
#define HBM_MAX     (((uint64_t)1 << TPU_DEVADDR_SHIFT) - 4096) /* device addresses have 44 offset bits */
#define MAX_WORKERS 64

/* Decimal digits only (no sign, space or base prefix); false on overflow. */
static bool parse_digits(const char **p, uint64_t *out) {
    const char *s = *p;
    uint64_t x = 0;
    if (*s < '0' || *s > '9') return false;
    for (; *s >= '0' && *s <= '9'; s++)
        if (__builtin_mul_overflow(x, 10, &x) || __builtin_add_overflow(x, (uint64_t)(*s - '0'), &x)) return false;
    *p = s;
    *out = x;
    return true;
}

/* "<digits>[K|M|G|T][iB]", binary multiples, case-insensitive. */
static bool parse_size(const char *s, uint64_t *out) {
    uint64_t x;
    if (!parse_digits(&s, &x)) return false;
    static const char units[] = "kmgt";
    int shift = 0;
    if (*s) {
        const char *u = strchr(units, *s | 0x20);
        if (!u || !*u) return false;
        shift = 10 * (int)(u - units + 1);
        s++;
        if ((s[0] | 0x20) == 'i' && (s[1] | 0x20) == 'b') s += 2;
    }
    if (*s || (shift && x > (UINT64_MAX >> shift))) return false;
    *out = x << shift;
    return true;
}

typedef struct cfg_err {
    char msg[1024];
    size_t len;
    int n;
} cfg_err;

static void cfg_bad(cfg_err *e, const char *name, const char *val, const char *accepted) {
    int w = snprintf(e->msg + e->len, sizeof e->msg - e->len, "%s%s='%.64s' is not valid: expected %s",
                     e->n++ ? "; " : "invalid tpu configuration: ", name, val, accepted);
    if (w > 0) e->len = e->len + (size_t)w < sizeof e->msg ? e->len + (size_t)w : sizeof e->msg - 1;
}

static void cfg_int(cfg_err *e, const char *(*get)(const char *), const char *name, uint64_t lo, uint64_t hi,
                    const char *what, int *out) {
    const char *v = get(name);
    if (!v || !*v) return;
    const char *p = v;
    uint64_t x;
    if (parse_digits(&p, &x) && !*p && x >= lo && x <= hi) {
        *out = (int)x;
        return;
    }
    char acc[160];
    snprintf(acc, sizeof acc, "an integer from %llu to %llu (%s)", (unsigned long long)lo, (unsigned long long)hi,
             what);
    cfg_bad(e, name, v, acc);
}

static void cfg_choice(cfg_err *e, const char *(*get)(const char *), const char *name, const char *const *choices,
                       const char *accepted, int *out) {
    const char *v = get(name);
    if (!v || !*v) return;
    for (int i = 0; choices[i]; i++)
        if (strcmp(v, choices[i]) == 0) {
            *out = i;
            return;
        }
    cfg_bad(e, name, v, accepted);
}

tpu_status tpu_config_parse(const char *(*get)(const char *name), tpu_config *out) {
    cfg_err e = {.len = 0, .n = 0};
    e.msg[0] = 0;
    *out = (tpu_config){.num_devices = 1, .hbm_bytes = (size_t)16 << 30, .num_workers = 0, .mxu_choice = 0};
    cfg_int(&e, get, "TPU_NUM_DEVICES", 1, TPU_MAX_DEVICES, "the number of virtual tpu chips", &out->num_devices);
    const char *v = get("TPU_HBM_BYTES");
    uint64_t hbm;
    if (v && *v) {
        if (parse_size(v, &hbm) && hbm >= HBM_MIN && hbm <= HBM_MAX)
            out->hbm_bytes = (size_t)(hbm & ~(KIB * 4 - 1));
        else
            cfg_bad(&e, "TPU_HBM_BYTES", v,
                    "a whole number of bytes from 1048576 (1M) to 17592186040320 (16T - 4K), optionally with a "
                    "binary suffix K, M, G or T (or KiB, MiB, GiB, TiB), e.g. 16G");
    }
    cfg_int(&e, get, "TPU_NUM_WORKERS", 1, MAX_WORKERS, "compute threads per process", &out->num_workers);
    static const char *const mxu[] = {"auto", "portable", "no-amx", NULL}; /* in tpu_mxu_choice's order */
    int m = 0;
    cfg_choice(&e, get, "TPU_MXU", mxu, "'auto', 'portable' or 'no-amx'", &m);
    out->mxu_choice = m;
    static const char *const flag[] = {"0", "1", NULL};
    int f = 0;
    cfg_choice(&e, get, "TORCH_TPU_LAUNCH_BLOCKING", flag, "0 or 1", &f);
    /* Read by the Python package and the C++ glue; validated here so that
     * every bad value is reported the same way, at the same point. */
    cfg_choice(&e, get, "TORCH_TPU_CPU_FALLBACK", flag, "0 or 1", &f);
    cfg_choice(&e, get, "TORCH_TPU_DEFER_AND_FUSE", flag, "0 or 1", &f);
    if (e.n) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s", e.msg);
    return TPU_OK;
}

static const char *env_get(const char *name) { return getenv(name); }

static tpu_config config;
static tpu_status config_status;
static char config_msg[1024];
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static void config_init(void) {
    config_status = tpu_config_parse(env_get, &config);
    if (config_status) snprintf(config_msg, sizeof config_msg, "%s", tpu_last_error());
    tpu_pool_register(config.mxu_choice); /* the kernels' compute pool, from the first runtime entry on */
}

const tpu_config *tpu_config_get(tpu_status *st) {
    pthread_once(&config_once, config_init);
    if (st) *st = config_status;
    return &config;
}

tpu_status tpu_init(void) {
    tpu_status st;
    tpu_config_get(&st);
    return st ? tpu_set_error(st, "%s", config_msg) : TPU_OK;
}

static void atfork_child(void) {
    if (atomic_load_explicit(&any_initialized, memory_order_relaxed))
        atomic_store_explicit(&forked_child, true, memory_order_relaxed);
}

static void count_init(void) {
    tpu_status st;
    const tpu_config *cfg = tpu_config_get(&st);
    num_chips = st ? 0 : cfg->num_devices;
    for (int d = 0; d < TPU_MAX_DEVICES; d++) { chips[d].index = d; }
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

/* Per-chip bring-up (runs once per chip, under init_mu). */
static int init_dev;
static void chip_init(void) {
    tpu_chip *c = &chips[init_dev];
    size_t cap = tpu_config_get(NULL)->hbm_bytes; /* validated: 1 MiB .. 16 TiB - 4 KiB, page multiple */
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        c->init_status = tpu_set_error(TPU_ERROR_OUT_OF_MEMORY,
                                       "could not reserve %zu bytes of address space for tpu:%d", cap, c->index);
        return;
    }
    c->arena = p;
    c->capacity = cap;
    c->alloc = tpu_alloc_create(c);
    c->default_stream = tpu_stream_pool_init(c->index);
    if (!c->alloc || !c->default_stream) {
        c->init_status = tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "could not bring up tpu:%d", c->index);
        return;
    }
    atomic_store_explicit(&any_initialized, true, memory_order_relaxed);
    c->init_status = TPU_OK;
    atomic_store_explicit(&c->ready, true, memory_order_release);
}

static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;

tpu_status tpu_chip_get(int dev, tpu_chip **out) {
    tpu_status s = tpu_check_fork();
    if (s) return s;
    if ((s = tpu_init())) return s;
    int n = tpu_device_count();
    if (dev < 0 || dev >= n)
        return tpu_set_error(TPU_ERROR_INVALID_DEVICE,
                             "Invalid device index %d: there %s %d tpu device%s (valid indices 0..%d)", dev,
                             n == 1 ? "is" : "are", n, n == 1 ? "" : "s", n - 1);
    tpu_chip *c = &chips[dev];
    if (!atomic_load_explicit(&c->ready, memory_order_acquire)) { /* (arena is set before the allocator) */
        pthread_mutex_lock(&init_mu);
        if (!atomic_load_explicit(&c->ready, memory_order_relaxed) && c->init_status == TPU_OK) {
            init_dev = dev;
            chip_init();
        }
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
    uintptr_t off = tpu_devaddr_offset(devptr);
    if (!c->arena || off > c->capacity) return NULL;
    return c->arena + off;
}

void *tpu_host_to_dev(int dev, const void *host) {
    if (dev < 0 || dev >= TPU_MAX_DEVICES || !chips[dev].arena) return NULL;
    return (void *)(((uintptr_t)(dev + 1) << TPU_DEVADDR_SHIFT) + (uintptr_t)((const char *)host - chips[dev].arena));
}

int tpu_mem_device_of(const void *devptr) {
    uintptr_t a = (uintptr_t)devptr;
    uintptr_t d = a >> TPU_DEVADDR_SHIFT;
    if (d < 1 || d > (uintptr_t)tpu_device_count()) return -1;
    return chips[d - 1].arena ? (int)(d - 1) : -1;
}

const char *tpu_mxu_name(tpu_mxu_kind k) {
    switch (k) {
    case TPU_MXU_AMX: return "AMX";
    case TPU_MXU_AVX512_BF16: return "AVX512-BF16";
    case TPU_MXU_AVX2_FMA: return "AVX2-FMA";
    default: return "portable";
    }
}

tpu_status tpu_device_get_props(int dev, tpu_device_props *out) {
    tpu_status s = tpu_check_fork();
    if (s || (s = tpu_init())) return s;
    int n = tpu_device_count();
    if (dev < 0 || dev >= n)
        return tpu_set_error(TPU_ERROR_INVALID_DEVICE, "Invalid device index %d: there %s %d tpu device%s", dev,
                             n == 1 ? "is" : "are", n, n == 1 ? "" : "s");
    memset(out, 0, sizeof *out);
    out->mxu = tpu_mxu_detected();
    snprintf(out->name, sizeof out->name, "vTPU (%s)", tpu_mxu_name(out->mxu));
    out->hbm_bytes = chips[dev].arena ? chips[dev].capacity : tpu_config_get(NULL)->hbm_bytes;
    out->num_workers = tpu_num_workers();
    out->index = dev;
    return TPU_OK;
}

int tpu_device_current(void) { return cur_dev; }

tpu_status tpu_device_set(int dev) {
    tpu_status s = tpu_init();
    if (s) return s;
    int n = tpu_device_count();
    if (dev < 0 || dev >= n)
        return tpu_set_error(TPU_ERROR_INVALID_DEVICE, "Invalid device index %d: there %s %d tpu device%s", dev,
                             n == 1 ? "is" : "are", n, n == 1 ? "" : "s");
    cur_dev = dev;
    return TPU_OK;
}
