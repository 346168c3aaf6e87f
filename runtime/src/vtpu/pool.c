/* pool.c - the compute workers behind the kernels' tpu_parallel_for
 * (registered with the kernels floor by tpu_pool_register at start-up).
 *
 * DESIGN
 * One process-wide pool of TPU_NUM_WORKERS-1 threads (default: the number of
 * online CPUs, at most 8; at most 64 when set); the calling thread is the last worker. A parallel
 * region splits [0, n) into one contiguous range per worker. Only one region
 * runs at a time: a second caller (another stream's worker) that finds the
 * pool busy runs its loop serially instead of waiting. Idle workers spin
 * briefly, then sleep on a condition variable. */
#define _GNU_SOURCE
#include "vtpu/vtpu-impl.h"
#include <stdlib.h>
#include <unistd.h>

static int nworkers = 0; /* including the caller */
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t region_mu = PTHREAD_MUTEX_INITIALIZER; /* held by the running region */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static struct {
    void (*fn)(void *, int64_t, int64_t);
    void *ctx;
    int64_t n;
    int parts;
} job;
static _Atomic uint64_t generation;
static _Atomic int pending;

static void run_part(int w) {
    int64_t b = job.n * w / job.parts, e = job.n * (w + 1) / job.parts;
    if (b < e) job.fn(job.ctx, b, e);
}

static void *pool_main(void *arg) {
    int w = (int)(intptr_t)arg;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&generation, memory_order_acquire)) == seen && spins < 20000) {
            __builtin_ia32_pause();
            spins++;
        }
        if (g == seen) {
            pthread_mutex_lock(&mu);
            while ((g = atomic_load_explicit(&generation, memory_order_acquire)) == seen) pthread_cond_wait(&cv, &mu);
            pthread_mutex_unlock(&mu);
        }
        seen = g;
        if (w - 1 < job.parts - 1) run_part(w - 1); /* the caller runs the last part */
        atomic_fetch_sub_explicit(&pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

static void pool_init(void) {
    /* TPU_NUM_WORKERS is validated (1..64) by tpu_init(); unset (or invalid,
     * which fails every chip entry point before a kernel can run): the number
     * of online CPUs, at most 8. */
    int n = tpu_config_get(NULL)->num_workers;
    if (n <= 0) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        n = ncpu < 1 ? 1 : ncpu > 8 ? 8 : (int)ncpu;
    }
    nworkers = n;
    for (int w = 1; w < nworkers; w++) {
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &at, pool_main, (void *)(intptr_t)w) != 0) {
            nworkers = w;
            break;
        }
        pthread_attr_destroy(&at);
    }
}

int tpu_num_workers(void) {
    pthread_once(&pool_once, pool_init);
    return nworkers;
}

static void pool_parallel_for(int64_t n, int64_t grain, void (*fn)(void *ctx, int64_t b, int64_t e), void *ctx) {
    if (n <= 0) return;
    int nw = tpu_num_workers();
    if (grain < 1) grain = 1;
    int parts = (int)((n + grain - 1) / grain);
    if (parts > nw) parts = nw;
    if (parts <= 1 || tpu_is_forked_child() || pthread_mutex_trylock(&region_mu) != 0) {
        fn(ctx, 0, n);
        return;
    }
    job.fn = fn;
    job.ctx = ctx;
    job.n = n;
    job.parts = parts;
    atomic_store_explicit(&pending, nw - 1, memory_order_relaxed);
    pthread_mutex_lock(&mu);
    atomic_fetch_add_explicit(&generation, 1, memory_order_release);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    /* The caller takes the last part. */
    int64_t b = n * (parts - 1) / parts;
    fn(ctx, b, n);
    while (atomic_load_explicit(&pending, memory_order_acquire) > 0) __builtin_ia32_pause();
    pthread_mutex_unlock(&region_mu);
}

static tpu_compute_iface pool_iface = {.parallel_for = pool_parallel_for, .num_workers = tpu_num_workers};

void tpu_pool_register(int mxu_choice) {
    pool_iface.mxu_choice = mxu_choice;
    tpu_kernels_set_compute(&pool_iface);
}
