/* stream.c - streams, their worker threads, and events.
 *
 * DESIGN
 * A stream is a FIFO of commands (kernel, copy, event record, event wait,
 * host callback) served in order by one worker thread of its own, started on
 * first use (Redis bio.c style). Commands get increasing sequence numbers;
 * `completed` (release/acquire) says how far the worker got, which is all
 * events, synchronization and the allocator's stream-ordered reuse need.
 * The worker spins briefly before sleeping: waking a sleeping thread costs
 * tens of microseconds, more than a small kernel. Waiters spin the same way.
 * A failing kernel's error is stored on the stream (first error wins) and
 * returned once by the next synchronizing call; later commands still run.
 */
#define _GNU_SOURCE
#include "vtpu-impl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sched.h>

struct tpu_stream {
    int dev;
    int64_t id;
    int priority;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    tpu_cmd *head, *tail;
    uint64_t enqueued;                 /* guarded by mu */
    _Atomic uint64_t enqueued_pub;     /* readable without the lock */
    _Atomic uint64_t completed;
    int sleepers;                      /* threads waiting on cv_done */
    bool worker_sleeping, started, stop;
    pthread_t thread;
    tpu_status err;                    /* sticky asynchronous error */
    char errmsg[512];
};

struct tpu_event {
    tpu_stream_t stream;
    uint64_t seq;
    bool timing;
    _Atomic bool stamped;
    struct timespec t;
};

static _Atomic int64_t next_stream_id = 1;
static _Thread_local tpu_stream_t cur_stream[TPU_MAX_DEVICES];

#define SPIN_ITERS 4000   /* ~50 us of pause: longer spins steal one of our two cores */

/* --- command allocation: a small lock-free-ish free list would do; malloc is fine here. --- */
tpu_cmd *tpu_cmd_new(tpu_cmd_kind kind) {
    tpu_cmd *c = malloc(sizeof *c);
    if (!c) return NULL;
    c->kind = kind;
    c->next = NULL;
    return c;
}

static void set_sticky(tpu_stream_t s, tpu_status st, const char *msg) {
    pthread_mutex_lock(&s->mu);
    if (s->err == TPU_OK) {
        s->err = st;
        snprintf(s->errmsg, sizeof s->errmsg, "%s", msg);
    }
    pthread_mutex_unlock(&s->mu);
}

/* Run a kernel; on failure format "tpu kernel 'op' failed: ..." into full. */
static tpu_status run_kernel(tpu_cmd *c, char *full, size_t n) {
    tpu_status st = tpu_kernel_run(&c->u.k);
    if (st) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", c->u.k.err[0] ? c->u.k.err : tpu_status_name(st));
        snprintf(full, n, "tpu kernel '%s' failed: %s", tpu_op_name(c->u.k.op), msg);
        return TPU_ERROR_KERNEL;
    }
    return TPU_OK;
}

static void run_cmd(tpu_stream_t s, tpu_cmd *c) {
    switch (c->kind) {
    case TPU_CMD_KERNEL: {
        char full[512];
        if (run_kernel(c, full, sizeof full)) set_sticky(s, TPU_ERROR_KERNEL, full);
        break;
    }
    case TPU_CMD_COPY:
        memcpy(c->u.copy.dst, c->u.copy.src, c->u.copy.bytes);
        break;
    case TPU_CMD_EVENT:
        clock_gettime(CLOCK_MONOTONIC, &c->u.event.ev->t);
        atomic_store_explicit(&c->u.event.ev->stamped, true, memory_order_release);
        break;
    case TPU_CMD_WAIT:
        tpu_stream_wait_seq(c->u.wait.stream, c->u.wait.seq);
        break;
    case TPU_CMD_CALLBACK:
        c->u.cb.fn(c->u.cb.user);
        break;
    }
}

/* One more command of `s` has run: publish it and wake synchronizing threads. */
static void mark_done(tpu_stream_t s) {
    atomic_fetch_add_explicit(&s->completed, 1, memory_order_release);
    pthread_mutex_lock(&s->mu);
    if (s->sleepers) pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
}

static void *worker_main(void *arg) {
    tpu_stream_t s = arg;
    for (;;) {
        /* Spin a little for new work before taking the lock and sleeping. */
        for (int i = 0; i < SPIN_ITERS; i++) {
            if (atomic_load_explicit(&s->enqueued_pub, memory_order_acquire) >
                atomic_load_explicit(&s->completed, memory_order_relaxed)) break;
            __builtin_ia32_pause();
        }
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->stop) {
            s->worker_sleeping = true;
            pthread_cond_wait(&s->cv_work, &s->mu);
            s->worker_sleeping = false;
        }
        if (!s->head && s->stop) { pthread_mutex_unlock(&s->mu); break; }
        tpu_cmd *c = s->head;
        s->head = c->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        /* A command run inline by a launching thread may still be finishing. */
        while (atomic_load_explicit(&s->completed, memory_order_acquire) + 1 < c->seq) __builtin_ia32_pause();

        run_cmd(s, c);
        free(c);

        mark_done(s);
    }
    return NULL;
}

tpu_stream_t tpu_stream_new_internal(int dev, int priority, int64_t id) {
    tpu_stream_t s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->dev = dev;
    s->id = id;
    s->priority = priority;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    return s;
}

/* Streams of each device, for device-wide synchronization. */
#define MAX_STREAMS 1024
static tpu_stream_t all_streams[TPU_MAX_DEVICES][MAX_STREAMS];
static int nstreams[TPU_MAX_DEVICES];
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;

static void register_stream(tpu_stream_t s) {
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (!all_streams[s->dev][i]) {
            all_streams[s->dev][i] = s;
            if (i >= nstreams[s->dev]) nstreams[s->dev] = i + 1;
            break;
        }
    pthread_mutex_unlock(&reg_mu);
}

static void unregister_stream(tpu_stream_t s) {
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < nstreams[s->dev]; i++)
        if (all_streams[s->dev][i] == s) all_streams[s->dev][i] = NULL;
    pthread_mutex_unlock(&reg_mu);
}

tpu_stream_t tpu_stream_default(int dev) {
    tpu_chip *c;
    if (tpu_chip_get(dev, &c)) return NULL;
    static bool registered[TPU_MAX_DEVICES];
    if (!registered[dev]) {
        pthread_mutex_lock(&reg_mu);
        bool r = registered[dev];
        registered[dev] = true;
        pthread_mutex_unlock(&reg_mu);
        if (!r) register_stream(c->default_stream);
    }
    return c->default_stream;
}

tpu_stream_t tpu_stream_current(int dev) {
    if (dev < 0 || dev >= TPU_MAX_DEVICES) return NULL;
    return cur_stream[dev] ? cur_stream[dev] : tpu_stream_default(dev);
}

tpu_status tpu_stream_set_current(tpu_stream_t s) {
    if (!s) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_stream_set_current: NULL stream");
    cur_stream[s->dev] = s;
    return TPU_OK;
}

tpu_status tpu_stream_create(int dev, int priority, tpu_stream_t *out) {
    tpu_chip *c;
    tpu_status st = tpu_chip_get(dev, &c);
    if (st) return st;
    tpu_stream_default(dev);
    tpu_stream_t s = tpu_stream_new_internal(dev, priority, atomic_fetch_add(&next_stream_id, 1));
    if (!s) return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "tpu_stream_create: out of host memory");
    register_stream(s);
    *out = s;
    return TPU_OK;
}

tpu_status tpu_stream_destroy(tpu_stream_t s) {
    if (!s) return TPU_OK;
    tpu_chip *c;
    if (tpu_chip_get(s->dev, &c) == TPU_OK && c->default_stream == s)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "cannot destroy a device's default stream");
    tpu_stream_wait_seq(s, tpu_stream_enqueued(s));
    unregister_stream(s);
    tpu_alloc_forget_stream(s->dev, s);
    pthread_mutex_lock(&s->mu);
    bool started = s->started;
    s->stop = true;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    if (started) pthread_join(s->thread, NULL);
    for (int d = 0; d < TPU_MAX_DEVICES; d++)
        if (cur_stream[d] == s) cur_stream[d] = NULL;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_done);
    free(s);
    return TPU_OK;
}

int tpu_stream_device(tpu_stream_t s) { return s ? s->dev : -1; }
int64_t tpu_stream_id(tpu_stream_t s) { return s ? s->id : -1; }
int tpu_stream_priority(tpu_stream_t s) { return s ? s->priority : 0; }

uint64_t tpu_stream_completed(tpu_stream_t s) {
    return s ? atomic_load_explicit(&s->completed, memory_order_acquire) : UINT64_MAX;
}
uint64_t tpu_stream_enqueued(tpu_stream_t s) {
    return s ? atomic_load_explicit(&s->enqueued_pub, memory_order_acquire) : 0;
}

tpu_status tpu_stream_enqueue(tpu_stream_t s, tpu_cmd *c, uint64_t *seq) {
    tpu_status st = tpu_check_fork();
    if (st) { free(c); return st; }
    pthread_mutex_lock(&s->mu);
    if (!s->started) {
        if (pthread_create(&s->thread, NULL, worker_main, s) != 0) {
            pthread_mutex_unlock(&s->mu);
            free(c);
            return tpu_set_error(TPU_ERROR_INTERNAL, "could not start the worker thread of a tpu stream");
        }
        s->started = true;
    }
    c->next = NULL;
    if (s->tail) s->tail->next = c; else s->head = c;
    s->tail = c;
    uint64_t n = ++s->enqueued;
    c->seq = n;
    atomic_store_explicit(&s->enqueued_pub, n, memory_order_release);
    if (s->worker_sleeping) pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    if (seq) *seq = n;
    return TPU_OK;
}

bool tpu_stream_try_inline(tpu_stream_t s, tpu_cmd *c, tpu_status *st) {
    if (c->kind != TPU_CMD_KERNEL && c->kind != TPU_CMD_COPY) return false;
    pthread_mutex_lock(&s->mu);
    if (s->head || atomic_load_explicit(&s->completed, memory_order_acquire) != s->enqueued || s->err) {
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    uint64_t n = ++s->enqueued;
    c->seq = n;
    atomic_store_explicit(&s->enqueued_pub, n, memory_order_release);
    pthread_mutex_unlock(&s->mu);
    *st = TPU_OK;
    char full[512];
    if (c->kind == TPU_CMD_KERNEL) {
        if (run_kernel(c, full, sizeof full)) *st = tpu_set_error(TPU_ERROR_KERNEL, "%s", full);
    } else {
        memcpy(c->u.copy.dst, c->u.copy.src, c->u.copy.bytes);
    }
    free(c);
    mark_done(s);
    return true;
}

/* While the worker sleeps (or has been signalled but not yet scheduled), a
 * thread waiting for `seq` runs the queued commands itself: waking a thread
 * costs far more than a small kernel. Order is kept: the worker waits for
 * `completed` to reach a command's predecessor before running it. */
static void help_until(tpu_stream_t s, uint64_t seq) {
    for (;;) {
        pthread_mutex_lock(&s->mu);
        tpu_cmd *c = s->head;
        if (!c || c->seq > seq || !s->worker_sleeping) { pthread_mutex_unlock(&s->mu); return; }
        s->head = c->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        while (atomic_load_explicit(&s->completed, memory_order_acquire) + 1 < c->seq) __builtin_ia32_pause();
        run_cmd(s, c);
        free(c);
        mark_done(s);
    }
}

void tpu_stream_wait_seq(tpu_stream_t s, uint64_t seq) {
    if (!s) return;
    if (atomic_load_explicit(&s->completed, memory_order_acquire) < seq) help_until(s, seq);
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (atomic_load_explicit(&s->completed, memory_order_acquire) >= seq) return;
        __builtin_ia32_pause();
    }
    pthread_mutex_lock(&s->mu);
    s->sleepers++;
    while (atomic_load_explicit(&s->completed, memory_order_acquire) < seq)
        pthread_cond_wait(&s->cv_done, &s->mu);
    s->sleepers--;
    pthread_mutex_unlock(&s->mu);
}

tpu_status tpu_stream_query(tpu_stream_t s) {
    if (!s) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "NULL stream");
    return tpu_stream_completed(s) >= tpu_stream_enqueued(s) ? TPU_OK : TPU_ERROR_NOT_READY;
}

/* Return (and clear) the stream's sticky error. */
static tpu_status take_error(tpu_stream_t s) {
    pthread_mutex_lock(&s->mu);
    tpu_status st = s->err;
    if (st) {
        tpu_set_error(st, "%s", s->errmsg);
        s->err = TPU_OK;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

tpu_status tpu_stream_synchronize(tpu_stream_t s) {
    if (!s) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "NULL stream");
    tpu_status st = tpu_check_fork();
    if (st) return st;
    tpu_stream_wait_seq(s, tpu_stream_enqueued(s));
    return take_error(s);
}

tpu_status tpu_device_synchronize_all(int dev) {
    tpu_stream_t ss[MAX_STREAMS];
    int n = 0;
    tpu_stream_default(dev);
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < nstreams[dev]; i++)
        if (all_streams[dev][i]) ss[n++] = all_streams[dev][i];
    pthread_mutex_unlock(&reg_mu);
    for (int i = 0; i < n; i++) tpu_stream_wait_seq(ss[i], tpu_stream_enqueued(ss[i]));
    return TPU_OK;
}

tpu_status tpu_device_synchronize(int dev) {
    tpu_chip *c;
    tpu_status st = tpu_chip_get(dev, &c);
    if (st) return st;
    tpu_device_synchronize_all(dev);
    tpu_status first = TPU_OK;
    pthread_mutex_lock(&reg_mu);
    int n = nstreams[dev];
    tpu_stream_t ss[MAX_STREAMS];
    for (int i = 0; i < n; i++) ss[i] = all_streams[dev][i];
    pthread_mutex_unlock(&reg_mu);
    char msg[512] = "";
    for (int i = 0; i < n; i++) {
        if (!ss[i]) continue;
        tpu_status e = take_error(ss[i]);
        if (e && !first) { first = e; snprintf(msg, sizeof msg, "%s", tpu_last_error()); }
    }
    if (first) tpu_set_error(first, "%s", msg);
    return first;
}

tpu_status tpu_stream_add_callback(tpu_stream_t s, tpu_host_fn fn, void *user) {
    if (!s || !fn) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_stream_add_callback: NULL argument");
    tpu_cmd *c = tpu_cmd_new(TPU_CMD_CALLBACK);
    if (!c) return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory");
    c->u.cb.fn = fn;
    c->u.cb.user = user;
    return tpu_stream_enqueue(s, c, NULL);
}

/* --- events --- */

tpu_status tpu_event_create(bool enable_timing, tpu_event_t *out) {
    tpu_event_t e = calloc(1, sizeof *e);
    if (!e) return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory");
    e->timing = enable_timing;
    *out = e;
    return TPU_OK;
}

tpu_status tpu_event_destroy(tpu_event_t e) {
    if (!e) return TPU_OK;
    /* A pending record command points at the event: wait for it first. */
    if (e->stream) tpu_stream_wait_seq(e->stream, e->seq);
    free(e);
    return TPU_OK;
}

tpu_status tpu_event_record(tpu_event_t e, tpu_stream_t s) {
    if (!e || !s) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_event_record: NULL argument");
    if (e->stream) tpu_stream_wait_seq(e->stream, e->seq);   /* previous record still pending */
    tpu_cmd *c = tpu_cmd_new(TPU_CMD_EVENT);
    if (!c) return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory");
    c->u.event.ev = e;
    atomic_store_explicit(&e->stamped, false, memory_order_relaxed);
    e->stream = s;
    uint64_t seq;
    tpu_status st = tpu_stream_enqueue(s, c, &seq);
    if (st) return st;
    e->seq = seq;
    return TPU_OK;
}

tpu_status tpu_event_query(tpu_event_t e) {
    if (!e) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "NULL event");
    if (!e->stream) return TPU_OK;
    return tpu_stream_completed(e->stream) >= e->seq ? TPU_OK : TPU_ERROR_NOT_READY;
}

tpu_status tpu_event_synchronize(tpu_event_t e) {
    if (!e) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "NULL event");
    if (e->stream) tpu_stream_wait_seq(e->stream, e->seq);
    return TPU_OK;
}

tpu_status tpu_stream_wait_event(tpu_stream_t s, tpu_event_t e) {
    if (!s || !e) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_stream_wait_event: NULL argument");
    if (!e->stream || e->stream == s) return TPU_OK;     /* nothing to wait for / same-stream order */
    if (tpu_stream_completed(e->stream) >= e->seq) return TPU_OK;
    tpu_cmd *c = tpu_cmd_new(TPU_CMD_WAIT);
    if (!c) return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory");
    c->u.wait.stream = e->stream;
    c->u.wait.seq = e->seq;
    return tpu_stream_enqueue(s, c, NULL);
}

tpu_status tpu_event_elapsed_ms(tpu_event_t a, tpu_event_t b, float *ms) {
    if (!a || !b || !ms) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_event_elapsed_ms: NULL argument");
    if (!a->timing || !b->timing)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "Both events must be created with argument 'enable_timing=True'.");
    if (!a->stream || !b->stream)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "Both events must be recorded before calculating elapsed time.");
    if (tpu_event_query(a) || tpu_event_query(b))
        return tpu_set_error(TPU_ERROR_NOT_READY, "Both events must be completed before calculating elapsed time.");
    double d = (b->t.tv_sec - a->t.tv_sec) * 1e3 + (b->t.tv_nsec - a->t.tv_nsec) / 1e6;
    *ms = (float)d;
    return TPU_OK;
}
