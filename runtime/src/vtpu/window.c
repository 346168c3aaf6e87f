/* window.c - Fused Eager's windows: record launches, flush them as one
 * compiled program, hold frees until the flush, count what happened.
 *
 * DESIGN
 * A window is the graph (graph/) of launches recorded on one stream since
 * its last flush, plus the storages freed meanwhile. Recording copies the
 * validated launch (host addresses already translated) into the graph. A
 * flush compiles the graph (fusion, dead intermediates), binds every
 * storage the program stores to (tpu_alloc_materialize), queues the program
 * as one TPU_CMD_GRAPH command with tpu_stream_enqueue_raw, then frees for
 * real the blocks whose free the window held back: their free sequence
 * number now lies after the program, so the allocator's stream-ordered
 * reuse stays correct, and a block freed inside a window is never handed
 * out again within it. A block that was never bound is counted as never
 * materialized.
 *
 * The window's lock is held across a flush (compile, bind, queue), so
 * flushes and recordings of one stream are serialized; lock order is
 * window -> allocator -> queue. */
#define _GNU_SOURCE
#include "vtpu/vtpu-impl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Atomic uint64_t st_flushes[TPU_FLUSH_CAUSE_COUNT];
static _Atomic uint64_t st_recorded, st_fused, st_groups, st_kernels, st_dead, st_never_bytes, st_hits, st_misses;

static const char *const cause_names[TPU_FLUSH_CAUSE_COUNT] = {"synchronize", "query",    "copy",        "event",
                                                               "stream_wait", "callback", "mode_switch", "window_full",
                                                               "memory",      "explicit", "memory_stats"};

const char *tpu_flush_cause_name(tpu_flush_cause c) {
    return (unsigned)c < TPU_FLUSH_CAUSE_COUNT ? cause_names[c] : "?";
}

void tpu_fused_get_stats(tpu_fused_stats *out) {
    for (int c = 0; c < TPU_FLUSH_CAUSE_COUNT; c++) out->flushes[c] = atomic_load(&st_flushes[c]);
    out->ops_recorded = atomic_load(&st_recorded);
    out->ops_fused = atomic_load(&st_fused);
    out->groups_run = atomic_load(&st_groups);
    out->kernels_run = atomic_load(&st_kernels);
    out->results_never_stored = atomic_load(&st_dead);
    out->bytes_never_materialized = atomic_load(&st_never_bytes);
    out->plan_cache_hits = atomic_load(&st_hits);
    out->plan_cache_misses = atomic_load(&st_misses);
}

void tpu_fused_reset_stats(void) {
    for (int c = 0; c < TPU_FLUSH_CAUSE_COUNT; c++) atomic_store(&st_flushes[c], 0);
    atomic_store(&st_recorded, 0);
    atomic_store(&st_fused, 0);
    atomic_store(&st_groups, 0);
    atomic_store(&st_kernels, 0);
    atomic_store(&st_dead, 0);
    atomic_store(&st_never_bytes, 0);
    atomic_store(&st_hits, 0);
    atomic_store(&st_misses, 0);
}

/* TORCH_TPU_FUSED_DUMP=1: print each flushed window's program to stderr. */
static _Atomic int dump_on = -1;
static bool dump_enabled(void) {
    int on = atomic_load_explicit(&dump_on, memory_order_relaxed);
    if (on < 0) {
        const char *v = getenv("TORCH_TPU_FUSED_DUMP");
        on = v && *v && strcmp(v, "0") != 0;
        atomic_store_explicit(&dump_on, on, memory_order_relaxed);
    }
    return on;
}

void tpu_window_init(tpu_window *w) {
    pthread_mutex_init(&w->mu, NULL);
    tpu_graph_init(&w->g);
    atomic_init(&w->n, 0);
}

static size_t view_span_bytes(const tpu_tensor *t) {
    if (t->is_scalar) return 0;
    int64_t hi = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->sizes[d] == 0) return 0;
        hi += (t->sizes[d] - 1) * (t->strides[d] < 0 ? -t->strides[d] : t->strides[d]);
    }
    return (size_t)hi * tpu_dtype_size((tpu_dtype)t->dtype);
}

tpu_status tpu_window_record(tpu_stream_t s, const tpu_kargs *a) {
    tpu_window *w = tpu_stream_window(s);
    pthread_mutex_lock(&w->mu);
    tpu_kargs *node = tpu_graph_add(&w->g);
    if (!node) {
        pthread_mutex_unlock(&w->mu);
        return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory recording %s", tpu_op_name(a->op));
    }
    node->op = a->op; /* the operands in use only: t[n..] stay unset */
    node->n = a->n;
    memcpy(node->t, a->t, (size_t)a->n * sizeof *a->t);
    node->p = a->p;
    node->err[0] = 0;
    for (int k = 0; k < tpu_op_infos[a->op].nout && k < a->n; k++) w->g.out_bytes += view_span_bytes(&a->t[k]);
    int n = w->g.n;
    atomic_store_explicit(&w->n, n, memory_order_release);
    pthread_mutex_unlock(&w->mu);
    atomic_fetch_add_explicit(&st_recorded, 1, memory_order_relaxed);
    if (n >= TPU_WINDOW_MAX_OPS) return tpu_window_flush(s, TPU_FLUSH_WINDOW_FULL);
    return TPU_OK;
}

typedef struct bind_ctx {
    int dev;
} bind_ctx;

static void bind_store(void *user, void *host) {
    bind_ctx *b = user;
    tpu_alloc_materialize(tpu_host_to_dev(b->dev, host));
}

tpu_status tpu_window_flush(tpu_stream_t s, tpu_flush_cause cause) {
    tpu_window *w = tpu_stream_window(s);
    if (!w || atomic_load_explicit(&w->n, memory_order_acquire) == 0) return TPU_OK;
    pthread_mutex_lock(&w->mu);
    if (w->g.n == 0) {
        pthread_mutex_unlock(&w->mu);
        return TPU_OK;
    }
    int dev = tpu_stream_device(s);
    /* Keep the held frees: compile empties the graph's list. */
    int nfreed = w->g.nfreed;
    void **freed = NULL;
    if (nfreed) {
        freed = malloc((size_t)nfreed * sizeof *freed);
        if (!freed) {
            pthread_mutex_unlock(&w->mu);
            return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory flushing a window");
        }
        memcpy(freed, w->g.freed, (size_t)nfreed * sizeof *freed);
    }
    tpu_gprog *p = tpu_graph_compile(&w->g);
    tpu_cmd *c = p ? tpu_cmd_new(TPU_CMD_GRAPH) : NULL;
    if (!c) {
        tpu_gprog_free(p); /* (the graph's nodes went with it: cannot happen once compiled) */
        free(freed);
        pthread_mutex_unlock(&w->mu);
        return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory flushing a window");
    }
    atomic_store_explicit(&w->n, 0, memory_order_release);
    bind_ctx b = {dev};
    tpu_gprog_foreach_store(p, bind_store, &b);
    tpu_gprog_info info = tpu_gprog_get_info(p);
    if (dump_enabled()) {
        fprintf(stderr, "[torch_tpu] flush (%s) on tpu:%d stream %lld\n", tpu_flush_cause_name(cause), dev,
                (long long)tpu_stream_id(s));
        tpu_gprog_dump(p, stderr);
    }
    c->u.graph = p;
    tpu_status st = tpu_stream_enqueue_raw(s, c, NULL);
    size_t never = 0;
    for (int i = 0; i < nfreed; i++) never += tpu_alloc_release(tpu_host_to_dev(dev, freed[i]));
    free(freed);
    tpu_alloc_bind_all(dev); /* what is still alive exists now (an empty() nothing wrote included) */
    pthread_mutex_unlock(&w->mu);
    atomic_fetch_add(&st_flushes[cause], 1);
    atomic_fetch_add(&st_fused, (uint64_t)info.fused_nodes);
    atomic_fetch_add(&st_groups, (uint64_t)info.groups);
    atomic_fetch_add(&st_kernels, (uint64_t)(info.steps - info.groups));
    atomic_fetch_add(&st_dead, (uint64_t)info.dead_results);
    atomic_fetch_add(&st_never_bytes, (uint64_t)never);
    atomic_fetch_add(info.cache_hit ? &st_hits : &st_misses, 1);
    return st;
}

tpu_status tpu_windows_flush_dev(int dev, tpu_flush_cause cause) {
    int lo = dev < 0 ? 0 : dev, hi = dev < 0 ? tpu_device_count() : dev + 1;
    tpu_status first = TPU_OK;
    for (int d = lo; d < hi; d++) {
        tpu_stream_t qs[1 + 2 * TPU_STREAM_POOL_SIZE];
        int n = tpu_stream_queues(d, qs, 1 + 2 * TPU_STREAM_POOL_SIZE);
        for (int i = 0; i < n; i++) {
            tpu_status st = tpu_window_flush(qs[i], cause);
            if (st && !first) first = st;
        }
    }
    return first;
}

tpu_status tpu_flush(tpu_stream_t s) {
    return s ? tpu_window_flush(s, TPU_FLUSH_EXPLICIT) : tpu_windows_flush_dev(-1, TPU_FLUSH_EXPLICIT);
}

bool tpu_window_defer_free(tpu_stream_t s, void *devptr) {
    tpu_window *w = s ? tpu_stream_window(s) : NULL;
    if (!w || atomic_load_explicit(&w->n, memory_order_acquire) == 0) return false;
    void *host = tpu_dev_to_host(devptr);
    pthread_mutex_lock(&w->mu);
    bool held = w->g.n > 0 && host && tpu_graph_add_freed(&w->g, host);
    pthread_mutex_unlock(&w->mu);
    return held;
}

bool tpu_windows_write(int dev, const void *devptr) {
    const void *host = tpu_dev_to_host(devptr);
    if (!host) return false;
    tpu_stream_t qs[1 + 2 * TPU_STREAM_POOL_SIZE];
    int n = tpu_stream_queues(dev, qs, 1 + 2 * TPU_STREAM_POOL_SIZE);
    bool writes = false;
    for (int i = 0; i < n && !writes; i++) {
        tpu_window *w = tpu_stream_window(qs[i]);
        if (atomic_load_explicit(&w->n, memory_order_acquire) == 0) continue;
        pthread_mutex_lock(&w->mu);
        writes = tpu_graph_writes(&w->g, host);
        pthread_mutex_unlock(&w->mu);
    }
    return writes;
}

bool tpu_mem_is_materialized(const void *devptr) {
    int dev = tpu_mem_device_of(devptr);
    if (dev < 0 || !tpu_alloc_is_bound(devptr)) return false;
    return !tpu_windows_write(dev, devptr);
}
