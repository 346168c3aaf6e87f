/* stream.c - hardware queues, the streams mapped onto them, and events.
 *
 * DESIGN
 * Each chip has a fixed pool of hardware queues, as a CUDA device does: its
 * default stream's queue, TPU_STREAM_POOL_SIZE low-priority queues and as
 * many high-priority ones. A stream *is* one of these queues: creating a
 * stream hands out the next queue of its priority round-robin, so any number
 * of streams can be created, streams that share a queue simply run in order
 * with each other, the worker threads stay bounded (one per queue, started on
 * first use, Redis bio.c style) and device synchronization walks a fixed list.
 * Queues live as long as the process: a stream handle never dangles.
 *
 * A queue is a FIFO of commands (kernel, copy, event record, event wait, host
 * callback) served in order by its worker. Commands get increasing sequence
 * numbers; `completed` (release/acquire) says how far the worker got, which is
 * all events, synchronization and the allocator's stream-ordered reuse need:
 * (stream, seq) is the one synchronization currency.
 *
 * A queue holds at most TPU_STREAM_QUEUE_DEPTH commands; a launching thread
 * that finds it full sleeps until half of them have completed (CUDA's launch
 * queue blocks the same way; waking it for every completion would cost a
 * futex round trip per small kernel). The worker spins briefly before
 * sleeping: waking a sleeping thread costs tens of microseconds, more than a
 * small kernel. Waiters spin the same way, run queued commands themselves
 * while the worker sleeps, then sleep in 50 ms slices between which they ask
 * the interrupt check (the glue's: "did the user press Ctrl-C?"). A sleeper
 * posts the sequence number it waits for in `wake_at` (the smallest posted
 * wins; a woken sleeper that is not done posts its own again), and the
 * worker takes the lock to wake sleepers only once `completed` reaches it, so
 * a completion nobody waits for costs one atomic add. An interrupted wait
 * returns TPU_ERROR_INTERRUPTED and the work keeps running; a copy whose own
 * caller gave up waiting is cancelled instead, because its host buffer may
 * be gone once the caller unwinds.
 *
 * Commands are a few KB (a kernel's operand block). A finished one goes to
 * its queue's spare list (under the lock the worker takes anyway to pop the
 * next) and the next kernel launch on that queue copies its arguments into
 * it under the lock it takes anyway to queue: no malloc / free pair per
 * launch crossing threads, which glibc serves from its arena with page
 * faults once a thousand of them are in flight.
 *
 * A failing kernel's error is stored on its queue (first error wins) and
 * returned once by the next synchronizing call; later commands still run.
 */
#define _GNU_SOURCE
#include "vtpu/vtpu-impl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NQUEUES    (1 + 2 * TPU_STREAM_POOL_SIZE) /* default, low pool, high pool */
#define SPIN_ITERS 4000                           /* ~50 us of pause: longer spins steal one of our two cores */
#define SLICE_NS   50000000                       /* a sleeping host wait checks for interrupts this often */
#define MAX_SPARES TPU_STREAM_QUEUE_DEPTH         /* finished commands a queue keeps (a full queue: ~4 MB) */
#define NO_WAKE    UINT64_MAX

struct tpu_stream {
    int dev;
    int64_t id;   /* 0 default, 1..POOL low, POOL+1..2*POOL high */
    int priority; /* 0 low, -1 high (PyTorch: lower is higher) */
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* the worker: a command was queued */
    pthread_cond_t cv_done; /* waiters (completion or room): a command completed */
    tpu_cmd *head, *tail;
    uint64_t enqueued;             /* guarded by mu */
    _Atomic uint64_t enqueued_pub; /* readable without the lock */
    _Atomic uint64_t completed;
    _Atomic uint64_t wake_at; /* smallest seq a sleeper on cv_done waits for (NO_WAKE: none); set under mu */
    tpu_cmd *spares;          /* finished commands for reuse (guarded by mu) */
    int nspares;
    bool worker_sleeping, started;
    pthread_t thread;
    tpu_status err; /* sticky asynchronous error */
    char errmsg[640];
    tpu_window win; /* Fused Eager's recording window (window.c) */
};

struct tpu_event {
    tpu_stream_t stream; /* last record (NULL: never recorded) */
    uint64_t seq;
    bool timing;
    _Atomic uint64_t gen; /* bumped by every record; only the latest stamps */
    _Atomic int refs;     /* the owner + each queued record command */
    struct timespec t;    /* written by the worker before `completed` is released */
};

static struct tpu_stream queues[TPU_MAX_DEVICES][NQUEUES];
static _Atomic unsigned next_in_pool[TPU_MAX_DEVICES][2];
static _Thread_local tpu_stream_t cur_stream[TPU_MAX_DEVICES];
static _Atomic(tpu_interrupt_fn) interrupt_fn;
static _Thread_local bool interrupted; /* latched until tpu_interrupt_clear() */

/* --- interrupts --- */

void tpu_set_interrupt_check(tpu_interrupt_fn fn) { atomic_store_explicit(&interrupt_fn, fn, memory_order_release); }
void tpu_interrupt_clear(void) { interrupted = false; }
bool tpu_interrupted(void) { return interrupted; }

/* Ask the check (never with a queue lock held: it may take the GIL). */
static bool poll_interrupt(void) {
    if (interrupted) return true;
    tpu_interrupt_fn fn = atomic_load_explicit(&interrupt_fn, memory_order_acquire);
    if (fn && fn()) interrupted = true;
    return interrupted;
}

static tpu_status interrupted_error(tpu_stream_t s) {
    return tpu_set_error(TPU_ERROR_INTERRUPTED,
                         "interrupted while waiting for tpu:%d (stream %lld); work already queued keeps running",
                         s->dev, (long long)s->id);
}

/* --- commands --- */

tpu_cmd *tpu_cmd_new(tpu_cmd_kind kind) {
    tpu_cmd *c = malloc(sizeof *c);
    if (!c) return NULL;
    c->kind = kind;
    c->next = NULL;
    c->cancelled = false;
    return c;
}

static uint64_t completed_of(tpu_stream_t s) { return atomic_load_explicit(&s->completed, memory_order_acquire); }

static void set_sticky(tpu_stream_t s, tpu_status st, const char *msg) {
    pthread_mutex_lock(&s->mu);
    if (s->err == TPU_OK) {
        s->err = st;
        snprintf(s->errmsg, sizeof s->errmsg, "%s", msg);
    }
    pthread_mutex_unlock(&s->mu);
}

/* Run a kernel; on failure format "tpu kernel 'op' failed: ..." into full. */
static tpu_status run_kernel(tpu_kargs *a, char *full, size_t n) {
    tpu_status st = tpu_kernel_run(a);
    if (st) {
        tpu_kernel_failure_text(a, st, full, n);
        return TPU_ERROR_KERNEL;
    }
    return TPU_OK;
}

static void wait_complete(tpu_stream_t s, uint64_t seq);

static void event_unref(tpu_event_t e) {
    if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1) free(e);
}

static void run_cmd(tpu_stream_t s, tpu_cmd *c) {
    switch (c->kind) {
    case TPU_CMD_KERNEL: {
        char full[512];
        if (run_kernel(&c->u.k, full, sizeof full)) set_sticky(s, TPU_ERROR_KERNEL, full);
        break;
    }
    case TPU_CMD_COPY:
        if (!c->cancelled) memcpy(c->u.copy.dst, c->u.copy.src, c->u.copy.bytes);
        break;
    case TPU_CMD_EVENT: {
        tpu_event_t e = c->u.event.ev;
        /* A later record of the same event supersedes this one. */
        if (atomic_load_explicit(&e->gen, memory_order_acquire) == c->u.event.gen)
            clock_gettime(CLOCK_MONOTONIC, &e->t);
        event_unref(e);
        break;
    }
    case TPU_CMD_WAIT: wait_complete(c->u.wait.stream, c->u.wait.seq); break;
    case TPU_CMD_CALLBACK: c->u.cb.fn(c->u.cb.user); break;
    case TPU_CMD_GRAPH: {
        char full[512];
        if (tpu_gprog_run(c->u.graph, full, sizeof full)) set_sticky(s, TPU_ERROR_KERNEL, full);
        tpu_gprog_free(c->u.graph);
        break;
    }
    case TPU_CMD_COLL: {
        char full[640];
        if (tpu_coll_cmd_run(c, full, sizeof full)) set_sticky(s, TPU_ERROR_KERNEL, full);
        break;
    }
    }
}

/* One more command of `s` has run: publish it and wake the threads waiting
 * for it. Both sides are sequentially consistent: a sleeper posts wake_at
 * and then reads completed, the worker bumps completed and then reads
 * wake_at, so at least one of them sees the other (no lost wake-up); the
 * sleeper holds mu from its post until it waits, so the broadcast, which
 * takes mu, finds it waiting. */
static void mark_done(tpu_stream_t s) {
    uint64_t n = atomic_fetch_add(&s->completed, 1) + 1;
    if (atomic_load(&s->wake_at) > n) return;
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->wake_at, NO_WAKE); /* the woken that are not done post theirs again */
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
}

/* Keep a finished command for reuse, or free it (caller holds mu). */
static void spare_locked(tpu_stream_t s, tpu_cmd *c) {
    if (s->nspares >= MAX_SPARES) {
        free(c);
        return;
    }
    c->next = s->spares;
    s->spares = c;
    s->nspares++;
}

static void release_cmd(tpu_stream_t s, tpu_cmd *c) {
    pthread_mutex_lock(&s->mu);
    spare_locked(s, c);
    pthread_mutex_unlock(&s->mu);
}

/* Pop the head (caller holds mu, head is not NULL). */
static tpu_cmd *pop_locked(tpu_stream_t s) {
    tpu_cmd *c = s->head;
    s->head = c->next;
    if (!s->head) s->tail = NULL;
    return c;
}

/* Run a popped command in stream order: a command run inline by a launching
 * or helping thread may still be finishing. The caller releases c. */
static void run_popped(tpu_stream_t s, tpu_cmd *c) {
    while (completed_of(s) + 1 < c->seq) __builtin_ia32_pause();
    run_cmd(s, c);
    mark_done(s);
}

static void *worker_main(void *arg) {
    tpu_stream_t s = arg;
    tpu_cmd *done = NULL; /* released under the next pop's lock */
    for (;;) {
        /* Spin a little for new work before taking the lock and sleeping. */
        for (int i = 0; i < SPIN_ITERS; i++) {
            if (atomic_load_explicit(&s->enqueued_pub, memory_order_acquire) >
                atomic_load_explicit(&s->completed, memory_order_relaxed))
                break;
            __builtin_ia32_pause();
        }
        pthread_mutex_lock(&s->mu);
        if (done) spare_locked(s, done);
        done = NULL;
        while (!s->head) {
            s->worker_sleeping = true;
            pthread_cond_wait(&s->cv_work, &s->mu);
            s->worker_sleeping = false;
        }
        tpu_cmd *c = pop_locked(s);
        pthread_mutex_unlock(&s->mu);
        run_popped(s, c);
        done = c;
    }
    return NULL;
}

/* --- the pool --- */

static void queue_init(tpu_stream_t s, int dev, int64_t id, int priority) {
    s->dev = dev;
    s->id = id;
    s->priority = priority;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv_done, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&s->wake_at, NO_WAKE);
    tpu_window_init(&s->win);
}

tpu_stream_t tpu_stream_pool_init(int dev) {
    for (int q = 0; q < NQUEUES; q++) queue_init(&queues[dev][q], dev, q, q > TPU_STREAM_POOL_SIZE ? -1 : 0);
    return &queues[dev][0];
}

tpu_stream_t tpu_stream_default(int dev) {
    tpu_chip *c;
    if (tpu_chip_get(dev, &c)) return NULL;
    return c->default_stream;
}

tpu_stream_t tpu_stream_from_id(int dev, int64_t id) {
    if (id < 0 || id >= NQUEUES || !tpu_stream_default(dev)) return NULL;
    return &queues[dev][id];
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
    int high = priority < 0;
    unsigned k = atomic_fetch_add_explicit(&next_in_pool[dev][high], 1, memory_order_relaxed) % TPU_STREAM_POOL_SIZE;
    *out = &queues[dev][1 + high * TPU_STREAM_POOL_SIZE + (int)k];
    return TPU_OK;
}

tpu_status tpu_stream_destroy(tpu_stream_t s) {
    if (!s) return TPU_OK;
    if (s->id == 0) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "cannot destroy a device's default stream");
    /* The queue goes back to the pool (it may be shared); its work so far must run. */
    wait_complete(s, tpu_stream_enqueued(s));
    return TPU_OK;
}

int tpu_stream_device(tpu_stream_t s) { return s ? s->dev : -1; }
int64_t tpu_stream_id(tpu_stream_t s) { return s ? s->id : -1; }
int tpu_stream_priority(tpu_stream_t s) { return s ? s->priority : 0; }

uint64_t tpu_stream_completed(tpu_stream_t s) { return s ? completed_of(s) : UINT64_MAX; }
uint64_t tpu_stream_enqueued(tpu_stream_t s) {
    return s ? atomic_load_explicit(&s->enqueued_pub, memory_order_acquire) : 0;
}

/* --- waiting --- */

enum wait_mode {
    WAIT_FULLY,        /* until done, whatever happens (worker waits, the allocator, event lifetime) */
    WAIT_OR_CANCEL,    /* interrupted: cancel `seq` if it is a queued copy, and return */
    WAIT_OR_INTERRUPT, /* interrupted: return TPU_ERROR_INTERRUPTED */
};

/* Cancel the queued copy with sequence number `seq` (caller holds mu). */
static bool cancel_copy_locked(tpu_stream_t s, uint64_t seq) {
    for (tpu_cmd *c = s->head; c && c->seq <= seq; c = c->next)
        if (c->seq == seq && c->kind == TPU_CMD_COPY) {
            c->cancelled = true;
            return true;
        }
    return false;
}

static void add_ns(struct timespec *t, long ns) {
    t->tv_nsec += ns;
    if (t->tv_nsec >= 1000000000) {
        t->tv_sec++;
        t->tv_nsec -= 1000000000;
    }
}

static bool reached(const struct timespec *now, const struct timespec *t) {
    return now->tv_sec > t->tv_sec || (now->tv_sec == t->tv_sec && now->tv_nsec >= t->tv_nsec);
}

/* Sleep until `s` completes `target` (caller holds mu). Unless mode is
 * WAIT_FULLY, the interrupt check runs every SLICE_NS however often
 * completions wake the thread (a backlog of small kernels wakes it often). */
static tpu_status sleep_until_locked(tpu_stream_t s, uint64_t target, enum wait_mode mode) {
    tpu_status st = TPU_OK;
    struct timespec poll_at;
    clock_gettime(CLOCK_MONOTONIC, &poll_at);
    add_ns(&poll_at, SLICE_NS);
    for (;;) {
        if (atomic_load(&s->wake_at) > target) atomic_store(&s->wake_at, target); /* (we hold mu) */
        if (atomic_load(&s->completed) >= target) break;
        if (mode == WAIT_FULLY) {
            pthread_cond_wait(&s->cv_done, &s->mu);
            continue;
        }
        pthread_cond_timedwait(&s->cv_done, &s->mu, &poll_at);
        if (completed_of(s) >= target) break;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (!reached(&now, &poll_at)) continue;
        poll_at = now;
        add_ns(&poll_at, SLICE_NS);
        pthread_mutex_unlock(&s->mu);
        bool intr = poll_interrupt();
        pthread_mutex_lock(&s->mu);
        if (!intr) continue;
        if (mode == WAIT_OR_INTERRUPT) {
            st = TPU_ERROR_INTERRUPTED;
            break;
        }
        if (cancel_copy_locked(s, target)) break;
    }
    return st;
}

/* While the worker sleeps (or has been signalled but not yet scheduled), a
 * thread waiting for `seq` runs the queued commands itself: waking a thread
 * costs far more than a small kernel. Order is kept by run_popped. Host
 * callbacks, cross-stream waits and flushed Fused Eager windows, which may
 * run for as long as they like, are left to the worker so the waiter stays
 * interruptible. */
static void help_until(tpu_stream_t s, uint64_t seq) {
    for (;;) {
        pthread_mutex_lock(&s->mu);
        tpu_cmd *c = s->head;
        if (!c || c->seq > seq || !s->worker_sleeping || c->kind == TPU_CMD_CALLBACK || c->kind == TPU_CMD_WAIT ||
            c->kind == TPU_CMD_GRAPH) {
            if (c && c->seq <= seq && s->worker_sleeping) pthread_cond_signal(&s->cv_work);
            pthread_mutex_unlock(&s->mu);
            return;
        }
        pop_locked(s);
        pthread_mutex_unlock(&s->mu);
        run_popped(s, c);
        release_cmd(s, c);
    }
}

static tpu_status wait_seq_mode(tpu_stream_t s, uint64_t seq, enum wait_mode mode) {
    if (completed_of(s) >= seq) return TPU_OK;
    help_until(s, seq);
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (completed_of(s) >= seq) return TPU_OK;
        __builtin_ia32_pause();
    }
    pthread_mutex_lock(&s->mu);
    tpu_status st = sleep_until_locked(s, seq, mode);
    pthread_mutex_unlock(&s->mu);
    return st ? interrupted_error(s) : TPU_OK;
}

static void wait_complete(tpu_stream_t s, uint64_t seq) {
    if (s) wait_seq_mode(s, seq, WAIT_FULLY);
}

void tpu_stream_wait_seq(tpu_stream_t s, uint64_t seq) {
    if (s) wait_seq_mode(s, seq, WAIT_OR_CANCEL);
}

/* A synchronizing wait: fails at once if the thread is already interrupted. */
static tpu_status sync_wait(tpu_stream_t s, uint64_t seq) {
    if (interrupted) return interrupted_error(s);
    return wait_seq_mode(s, seq, WAIT_OR_INTERRUPT);
}

/* --- queueing --- */

static bool on_worker(tpu_stream_t s) { return s->started && pthread_equal(pthread_self(), s->thread); }

tpu_window *tpu_stream_window(tpu_stream_t s) { return &s->win; }

int tpu_stream_queues(int dev, tpu_stream_t *out, int max) {
    if (dev < 0 || dev >= TPU_MAX_DEVICES || !tpu_stream_default(dev)) return 0;
    int n = 0;
    for (int q = 0; q < NQUEUES && n < max; q++) out[n++] = &queues[dev][q];
    return n;
}

static tpu_flush_cause flush_cause_of(tpu_cmd_kind k) {
    switch (k) {
    case TPU_CMD_COPY: return TPU_FLUSH_COPY;
    case TPU_CMD_EVENT: return TPU_FLUSH_EVENT;
    case TPU_CMD_WAIT: return TPU_FLUSH_STREAM_WAIT;
    case TPU_CMD_CALLBACK: return TPU_FLUSH_CALLBACK;
    case TPU_CMD_COLL: return TPU_FLUSH_COLLECTIVE;
    default: return TPU_FLUSH_EXPLICIT;
    }
}

tpu_status tpu_stream_enqueue(tpu_stream_t s, tpu_cmd *c, uint64_t *seq) {
    tpu_status st = tpu_window_flush(s, flush_cause_of(c->kind));
    if (st) {
        free(c);
        return st;
    }
    return tpu_stream_enqueue_raw(s, c, seq);
}

/* Queue c (caller holds mu; on failure c is freed and mu still held). */
static tpu_status enqueue_locked(tpu_stream_t s, tpu_cmd *c, uint64_t *seq) {
    if (!s->started) {
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&s->thread, &at, worker_main, s);
        pthread_attr_destroy(&at);
        if (rc != 0) {
            free(c);
            return tpu_set_error(TPU_ERROR_INTERNAL, "could not start the worker thread of tpu:%d queue %lld", s->dev,
                                 (long long)s->id);
        }
        s->started = true;
    }
    /* Bounded queue: when full, wait until half of it has run. A host
     * callback queueing on its own queue is let through (waiting there would
     * wait for itself). */
    if (s->enqueued - completed_of(s) >= TPU_STREAM_QUEUE_DEPTH && !on_worker(s)) {
        if (interrupted || sleep_until_locked(s, s->enqueued - TPU_STREAM_QUEUE_DEPTH / 2, WAIT_OR_INTERRUPT)) {
            free(c);
            return interrupted_error(s);
        }
    }
    c->next = NULL;
    if (s->tail)
        s->tail->next = c;
    else
        s->head = c;
    s->tail = c;
    uint64_t n = ++s->enqueued;
    c->seq = n;
    atomic_store_explicit(&s->enqueued_pub, n, memory_order_release);
    if (s->worker_sleeping) pthread_cond_signal(&s->cv_work);
    if (seq) *seq = n;
    return TPU_OK;
}

tpu_status tpu_stream_enqueue_raw(tpu_stream_t s, tpu_cmd *c, uint64_t *seq) {
    tpu_status st = tpu_check_fork();
    if (st) {
        free(c);
        return st;
    }
    pthread_mutex_lock(&s->mu);
    st = enqueue_locked(s, c, seq);
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* The used part of a kernel's argument block: its operands, not all TPU_MAX_OPERANDS. */
static void copy_kargs(tpu_kargs *dst, const tpu_kargs *a) {
    memcpy(dst, a, offsetof(tpu_kargs, t) + (size_t)a->n * sizeof a->t[0]);
    dst->err[0] = 0;
}

tpu_status tpu_stream_enqueue_kernel(tpu_stream_t s, const tpu_kargs *a) {
    tpu_status st = tpu_check_fork();
    if (!st) st = tpu_window_flush(s, TPU_FLUSH_EXPLICIT);
    if (st) return st;
    pthread_mutex_lock(&s->mu);
    tpu_cmd *c = s->spares;
    if (c) {
        s->spares = c->next;
        s->nspares--;
    } else {
        pthread_mutex_unlock(&s->mu);
        if (!(c = malloc(sizeof *c))) return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory");
        pthread_mutex_lock(&s->mu);
    }
    c->kind = TPU_CMD_KERNEL;
    c->cancelled = false;
    copy_kargs(&c->u.k, a);
    st = enqueue_locked(s, c, NULL);
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Take the next sequence number for a command run on this thread, if `s`
 * has nothing queued, running or recorded. */
static bool inline_begin(tpu_stream_t s) {
    if (atomic_load_explicit(&s->win.n, memory_order_acquire)) return false; /* recorded work first: enqueue flushes */
    pthread_mutex_lock(&s->mu);
    if (s->head || completed_of(s) != s->enqueued || s->err) {
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    uint64_t n = ++s->enqueued;
    atomic_store_explicit(&s->enqueued_pub, n, memory_order_release);
    pthread_mutex_unlock(&s->mu);
    return true;
}

static tpu_status inline_kernel(tpu_stream_t s, tpu_kargs *a) {
    char full[512];
    tpu_status st = TPU_OK;
    if (run_kernel(a, full, sizeof full)) st = tpu_set_error(TPU_ERROR_KERNEL, "%s", full);
    mark_done(s);
    return st;
}

bool tpu_stream_try_inline_copy(tpu_stream_t s, tpu_cmd *c) {
    if (c->kind != TPU_CMD_COPY || !inline_begin(s)) return false;
    memcpy(c->u.copy.dst, c->u.copy.src, c->u.copy.bytes);
    mark_done(s);
    release_cmd(s, c);
    return true;
}

bool tpu_stream_run_small(tpu_stream_t s, tpu_kargs *a) {
    if (!inline_begin(s)) return false;
    char full[512];
    if (run_kernel(a, full, sizeof full))
        set_sticky(s, TPU_ERROR_KERNEL, full); /* raised where a queued one would be */
    mark_done(s);
    return true;
}

tpu_status tpu_stream_run_kernel(tpu_stream_t s, tpu_kargs *a) {
    tpu_status st = tpu_check_fork();
    if (st) return st;
    if (inline_begin(s)) return inline_kernel(s, a);
    st = tpu_stream_enqueue_kernel(s, a);
    return st ? st : tpu_stream_synchronize(s);
}

tpu_status tpu_stream_query(tpu_stream_t s) {
    if (!s) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "NULL stream");
    tpu_status fs = tpu_window_flush(s, TPU_FLUSH_QUERY);
    if (fs) return fs;
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
    if ((st = tpu_window_flush(s, TPU_FLUSH_SYNCHRONIZE))) return st;
    if ((st = sync_wait(s, tpu_stream_enqueued(s)))) return st;
    return take_error(s);
}

/* Queues of `dev` that have ever run work (a queue never used has nothing to wait for). */
static int used_queues(int dev, tpu_stream_t *out) {
    int n = 0;
    for (int q = 0; q < NQUEUES; q++)
        if (tpu_stream_enqueued(&queues[dev][q])) out[n++] = &queues[dev][q];
    return n;
}

tpu_status tpu_device_synchronize_all(int dev) {
    if (!tpu_stream_default(dev)) return TPU_OK;
    tpu_windows_flush_dev(dev, TPU_FLUSH_SYNCHRONIZE);
    tpu_stream_t qs[NQUEUES];
    int n = used_queues(dev, qs);
    for (int i = 0; i < n; i++) wait_complete(qs[i], tpu_stream_enqueued(qs[i]));
    return TPU_OK;
}

tpu_status tpu_device_synchronize(int dev) {
    tpu_chip *c;
    tpu_status st = tpu_chip_get(dev, &c);
    if (st) return st;
    if ((st = tpu_windows_flush_dev(dev, TPU_FLUSH_SYNCHRONIZE))) return st;
    tpu_stream_t qs[NQUEUES];
    int n = used_queues(dev, qs);
    for (int i = 0; i < n; i++)
        if ((st = sync_wait(qs[i], tpu_stream_enqueued(qs[i])))) return st;
    tpu_status first = TPU_OK;
    char msg[512] = "";
    for (int i = 0; i < n; i++) {
        tpu_status e = take_error(qs[i]);
        if (e && !first) {
            first = e;
            snprintf(msg, sizeof msg, "%s", tpu_last_error());
        }
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
    atomic_init(&e->refs, 1);
    *out = e;
    return TPU_OK;
}

tpu_status tpu_event_destroy(tpu_event_t e) {
    if (e) event_unref(e); /* a queued record keeps it alive until it has run */
    return TPU_OK;
}

tpu_status tpu_event_record(tpu_event_t e, tpu_stream_t s) {
    if (!e || !s) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_event_record: NULL argument");
    tpu_cmd *c = tpu_cmd_new(TPU_CMD_EVENT);
    if (!c) return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory");
    c->u.event.ev = e;
    c->u.event.gen = atomic_fetch_add_explicit(&e->gen, 1, memory_order_acq_rel) + 1;
    atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
    uint64_t seq;
    tpu_status st = tpu_stream_enqueue(s, c, &seq); /* frees c on failure */
    if (st) {
        event_unref(e);
        return st;
    }
    e->stream = s;
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
    return e->stream ? sync_wait(e->stream, e->seq) : TPU_OK;
}

tpu_status tpu_stream_wait_event(tpu_stream_t s, tpu_event_t e) {
    if (!s || !e) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_stream_wait_event: NULL argument");
    if (!e->stream || e->stream == s) return TPU_OK; /* nothing to wait for / same-queue order */
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
        return tpu_set_error(TPU_ERROR_INVALID_VALUE,
                             "Both events must be created with argument 'enable_timing=True'.");
    if (!a->stream || !b->stream)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "Both events must be recorded before calculating elapsed time.");
    if (tpu_event_query(a) || tpu_event_query(b))
        return tpu_set_error(TPU_ERROR_NOT_READY, "Both events must be completed before calculating elapsed time.");
    double d = (b->t.tv_sec - a->t.tv_sec) * 1e3 + (b->t.tv_nsec - a->t.tv_nsec) / 1e6;
    *ms = (float)d;
    return TPU_OK;
}
