/* window.c - Fused Eager's windows: record launches, flush them as one
 * compiled program, hold frees until the flush, count what happened.
 *
 * DESIGN
 * A window is the graph (graph/) of launches recorded on one stream since
 * its last flush, plus where storages were freed meanwhile. Recording
 * copies the validated launch (host addresses already translated) into the
 * graph. A free inside the window is noted there and done at once (alloc.c):
 * the stream may reuse the block in the same window, which the graph sees
 * as a later write to the same storage; other streams wait for the flushed
 * program. A flush compiles the graph (fusion, dead intermediates), binds
 * every storage the program stores to (tpu_alloc_materialize) and what is
 * still alive, and queues the program as one TPU_CMD_GRAPH command with
 * tpu_stream_enqueue_raw. A block freed without ever being bound is counted
 * as never materialized.
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
static _Atomic uint64_t st_recorded, st_fused, st_groups, st_kernels, st_dead, st_never_bytes, st_hits, st_misses,
    st_tables, st_rewritten, st_dropped;

static const char *const cause_names[TPU_FLUSH_CAUSE_COUNT] = {
    "synchronize", "query",  "copy",     "event",        "stream_wait",  "callback",  "mode_switch",
    "window_full", "memory", "explicit", "memory_stats", "window_bytes", "graph_end", "collective"};

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
    out->groups_by_table = atomic_load(&st_tables);
    out->ops_rewritten = atomic_load(&st_rewritten);
    out->kernels_dropped = atomic_load(&st_dropped);
    tpu_remat_get_stats(&out->remat_reads, &out->remat_ops);
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
    atomic_store(&st_tables, 0);
    atomic_store(&st_rewritten, 0);
    atomic_store(&st_dropped, 0);
    tpu_remat_reset_stats();
}

void tpu_fused_note_never(size_t bytes) { atomic_fetch_add(&st_never_bytes, (uint64_t)bytes); }

/* ---- the set of storages written by launches that cannot fuse ---- */

/* Whether a launch may run inside a fused group (a cheap superset of what
 * the planner fuses: a float-domain elementwise op, a float random fill, a
 * reduction, a layer norm or a softmax-family op). */
static bool may_fuse(const tpu_kargs *a) {
    tpu_op_class c = tpu_op_class_of(a->op);
    if (c == TPU_CLASS_RANDOM) return a->op != TPU_OP_RAND_INT;
    if (a->op == TPU_OP_COPY) return true; /* a cast (class MOVE) */
    if (c == TPU_CLASS_REDUCTION || a->op == TPU_OP_LAYER_NORM) return true;
    if (a->op >= TPU_OP_SOFTMAX && a->op <= TPU_OP_LOG_SOFTMAX_BWD) return true;
    if (c < TPU_CLASS_UNARY || c > TPU_CLASS_TERNARY || tpu_op_family_of(a->op) != TPU_FAM_EW) return false;
    tpu_dtype cd = (tpu_dtype)a->p.compute_dtype;
    return cd == TPU_F32 || cd == TPU_F16 || cd == TPU_BF16;
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
    memset(&w->kw, 0, sizeof w->kw);
    w->bytes = 0;
    w->gen = 0;
    memset(&w->rm_ev, 0, sizeof w->rm_ev);
    memset(&w->rm_rc, 0, sizeof w->rm_rc);
    w->rc = NULL;
    w->nrc = w->caprc = 0;
    w->rm_stamp = 0;
    w->rm_broken = false;
}

bool tpu_window_may_fuse(const tpu_kargs *a) { return may_fuse(a); }

/* Scratch blocks for recomputation (remat.c): allocated and freed outside
 * the window's lock (an allocation may flush windows). */
static bool scratch_alloc(tpu_stream_t s, const tpu_remat_plan *rp, void **dev, void **host) {
    int d = tpu_stream_device(s);
    for (int j = 0; j < rp->nscratch; j++) {
        if (tpu_malloc(d, rp->size[j], s, &dev[j]) || !dev[j]) {
            for (int m = 0; m < j; m++) tpu_free(dev[m]);
            return false;
        }
        host[j] = tpu_dev_to_host(dev[j]);
    }
    return true;
}

tpu_status tpu_window_record(tpu_stream_t s, const tpu_kargs *a) {
    tpu_window *w = tpu_stream_window(s);
    tpu_remat_plan rp;
    void *sdev[TPU_REMAT_MAX_SCRATCH], *shost[TPU_REMAT_MAX_SCRATCH];
    int nscratch = 0;
    tpu_kargs red; /* a with operands redirected to recomputed copies */
    const tpu_kargs *rec = a;
    pthread_mutex_lock(&w->mu);
    if (tpu_remat_prepare(w, a, &rp)) {
        uint64_t gen = w->gen;
        pthread_mutex_unlock(&w->mu);
        bool got = scratch_alloc(s, &rp, sdev, shost);
        pthread_mutex_lock(&w->mu);
        if (got) nscratch = rp.nscratch;
        if (got && w->gen == gen) { /* (a flush meanwhile dropped the recipes: read as recorded) */
            memcpy(&red, a, offsetof(tpu_kargs, err));
            red.err[0] = 0;
            if (tpu_remat_emit(w, &rp, shost, &red)) rec = &red;
        }
    }
    tpu_kargs rw; /* a as a cheaper launch over what the window holds (graph/rewrite.c) */
    bool redirected = rec != a, rewritten = tpu_graph_rewrite(&w->g, rec, &rw);
    if (rewritten) rec = &rw;
    tpu_kargs *node = tpu_graph_append(&w->g, rec);
    if (!node) {
        pthread_mutex_unlock(&w->mu);
        for (int j = 0; j < nscratch; j++) tpu_free(sdev[j]);
        return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory recording %s", tpu_op_name(a->op));
    }
    tpu_remat_recorded(w, rewritten ? rec : a, w->g.n - 1, redirected);
    /* (a kernel the planner may drop is not bound at its free: the plan stores its result if it runs) */
    bool fuses = may_fuse(rec) || tpu_graph_droppable(rec);
    for (int k = 0; k < tpu_op_infos[rec->op].nout && k < rec->n; k++) {
        if (rec->t[k].is_scalar) continue;
        w->bytes += (size_t)tpu_tensor_numel(&rec->t[k]) * tpu_dtype_size((tpu_dtype)rec->t[k].dtype);
        if (!fuses) tpu_rmap_put(&w->kw, rec->t[k].base, 1); /* (no host memory: its free will not bind it) */
    }
    int n = w->g.n;
    size_t bytes = w->bytes;
    atomic_store_explicit(&w->n, n, memory_order_release);
    pthread_mutex_unlock(&w->mu);
    for (int j = 0; j < nscratch; j++) tpu_free(sdev[j]); /* read by the launch only: dead after it */
    atomic_fetch_add_explicit(&st_recorded, 1, memory_order_relaxed);
    if (rewritten) atomic_fetch_add_explicit(&st_rewritten, 1, memory_order_relaxed);
    if (n >= TPU_WINDOW_MAX_OPS) return tpu_window_flush(s, TPU_FLUSH_WINDOW_FULL);
    if (bytes >= TPU_WINDOW_BYTES_PER_CHIP * tpu_config_get(NULL)->hbm_bytes)
        return tpu_window_flush(s, TPU_FLUSH_WINDOW_BYTES);
    return TPU_OK;
}

static void bind_store(void *dev, void *host) { tpu_alloc_materialize(tpu_host_to_dev(*(int *)dev, host)); }
static size_t fresh_alive(void *dev, void *host) { return tpu_alloc_deferred_size(tpu_host_to_dev(*(int *)dev, host)); }

tpu_status tpu_window_flush(tpu_stream_t s, tpu_flush_cause cause) {
    tpu_window *w = tpu_stream_window(s);
    if (!w || atomic_load_explicit(&w->n, memory_order_acquire) == 0) return TPU_OK;
    pthread_mutex_lock(&w->mu);
    if (w->g.n == 0) {
        pthread_mutex_unlock(&w->mu);
        return TPU_OK;
    }
    int dev = tpu_stream_device(s);
    tpu_gprog *p = tpu_graph_compile(&w->g);
    tpu_cmd *c = p ? tpu_cmd_new(TPU_CMD_GRAPH) : NULL;
    if (!c) {
        tpu_gprog_free(p); /* (the graph's nodes went with it: cannot happen once compiled) */
        pthread_mutex_unlock(&w->mu);
        return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory flushing a window");
    }
    w->bytes = 0;
    w->gen++;
    tpu_rmap_clear(&w->kw);
    tpu_remat_reset(w);
    tpu_alloc_note_window_peak(dev, tpu_gprog_mem_peak(p, fresh_alive, &dev)); /* (before the stores are bound) */
    tpu_gprog_foreach_store(p, bind_store, &dev);
    tpu_gprog_info info = tpu_gprog_get_info(p);
    if (dump_enabled()) {
        fprintf(stderr, "[torch_tpu] flush (%s) on tpu:%d stream %lld\n", tpu_flush_cause_name(cause), dev,
                (long long)tpu_stream_id(s));
        tpu_gprog_dump(p, stderr);
    }
    c->u.graph = p;
    tpu_status st = tpu_stream_enqueue_raw(s, c, NULL);
    tpu_alloc_bind_all(dev); /* what is still alive exists now (an empty() nothing wrote included) */
    /* Empty only once the program is queued: a copy run inline on another
     * thread (tpu_stream_try_inline_copy) takes n == 0 with an idle queue to mean
     * that nothing recorded is still to run before it. */
    atomic_store_explicit(&w->n, 0, memory_order_release);
    pthread_mutex_unlock(&w->mu);
    atomic_fetch_add(&st_flushes[cause], 1);
    atomic_fetch_add(&st_fused, (uint64_t)info.fused_nodes);
    atomic_fetch_add(&st_groups, (uint64_t)info.groups);
    atomic_fetch_add(&st_kernels, (uint64_t)(info.steps - info.groups - info.dropped));
    atomic_fetch_add(&st_dropped, (uint64_t)info.dropped);
    atomic_fetch_add(&st_dead, (uint64_t)info.dead_results);
    atomic_fetch_add(&st_tables, (uint64_t)info.table_groups);
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

bool tpu_window_open(tpu_stream_t s) {
    tpu_window *w = s ? tpu_stream_window(s) : NULL;
    return w && atomic_load_explicit(&w->n, memory_order_acquire) != 0;
}

bool tpu_window_note_free(tpu_stream_t s, void *devptr, size_t bytes, bool fresh, bool *kernel_written) {
    tpu_window *w = s ? tpu_stream_window(s) : NULL;
    *kernel_written = false;
    if (!w || atomic_load_explicit(&w->n, memory_order_acquire) == 0) return false;
    void *host = tpu_dev_to_host(devptr);
    pthread_mutex_lock(&w->mu);
    bool open = w->g.n > 0 && host;
    if (open) {
        tpu_graph_add_freed(&w->g, host, bytes, fresh); /* (no host memory: unseen, its value is stored) */
        tpu_remat_note_free(w, host);
        *kernel_written = tpu_rmap_get(&w->kw, host) != 0;
    }
    pthread_mutex_unlock(&w->mu);
    return open;
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
