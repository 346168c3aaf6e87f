/* group.c - communicators: the shared segment, its two transports, and the
 * one synchronization primitive the algorithms use (a step).
 *
 * DESIGN
 * A communicator's ranks share one segment: a control area (coll_ctrl) and
 * one staging slot of TPU_COMM_SLOT_BYTES per rank. The shared-memory
 * transport maps a POSIX shared-memory object (rank 0 creates it, the others
 * open it as soon as it appears; once all have joined its name is unlinked,
 * so no file outlives the ranks; tpu_comm_open_shm defers that join to the
 * first collective, so that opening never waits for a peer that has not
 * reached its side yet - the lazily made point-to-point pairs of tpu_dist);
 * the local transport puts the same segment
 * on the heap for ranks that are threads of this process. Nothing else
 * differs: the algorithms (algo.c) see a segment and a rank.
 *
 * Synchronization is one monotone counter per rank, `arrive[r]`: taking a
 * step publishes this rank's new step count and waits until every rank's
 * count has reached it - a barrier without reset, as the allocator and the
 * streams use sequence numbers. A waiter spins briefly, then sleeps on a
 * futex (shared between processes), waking every few milliseconds to look
 * for failure: the communicator broken by another rank (`broken`, with the
 * reason in `why`), a peer process that exited (its pid gone or a zombie),
 * a peer that left (destroyed its handle), or this wait passing the
 * communicator's timeout. Any of them breaks the communicator for every rank
 * with a message naming the collective and the rank waited for.
 */
#define _GNU_SOURCE
#include "coll/coll-impl.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define COLL_MAGIC     0x7470755f64697374ull /* "tpu_dist" */
#define SPIN_ITERS     2000                  /* ~25 us of pause before sleeping */
#define SLEEP_NS       2000000               /* a sleeping waiter looks for failures this often */
#define CHECK_PEERS_NS 100000000             /* and at its peers' processes this often */
#define JOIN_POLL_NS   1000000

static size_t ctrl_bytes(void) { return (sizeof(coll_ctrl) + 4095) & ~(size_t)4095; }

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *p, uint32_t expect, long ns) {
    struct timespec ts = {ns / 1000000000, ns % 1000000000};
    syscall(SYS_futex, (uint32_t *)p, FUTEX_WAIT, expect, &ts, NULL, 0);
}
static void futex_wake(_Atomic uint32_t *p) { syscall(SYS_futex, (uint32_t *)p, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

/* Whether process `pid` is gone (or a zombie: exited, not yet reaped). */
static bool process_gone(int32_t pid) {
    if (kill(pid, 0) != 0 && errno == ESRCH) return true;
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

static const char *const kind_names[COLL_KIND_COUNT] = {"all_reduce",     "broadcast", "reduce",  "all_gather",
                                                        "reduce_scatter", "gather",    "scatter", "all_to_all",
                                                        "barrier",        "send/recv"};
const char *tpu_coll_kind_name(int kind) { return (unsigned)kind < COLL_KIND_COUNT ? kind_names[kind] : "?"; }

static const char *const op_names[TPU_REDUCE_OP_COUNT] = {"sum", "avg", "product", "min", "max", "band", "bor", "bxor"};
const char *tpu_reduce_op_name(tpu_reduce_op op) { return (unsigned)op < TPU_REDUCE_OP_COUNT ? op_names[op] : "?"; }

void coll_describe(const coll_desc *d, char *buf, size_t n) {
    int w = snprintf(buf, n, "%s (call #%llu", tpu_coll_kind_name(d->kind), (unsigned long long)d->call);
    if (w < 0 || (size_t)w >= n) return;
    if (d->kind != COLL_BARRIER) {
        w += snprintf(buf + w, n - (size_t)w, ", %s", tpu_dtype_name((tpu_dtype)d->dtype));
        if (d->kind != COLL_ALL_TO_ALL && (size_t)w < n)
            w += snprintf(buf + w, n - (size_t)w, ", %lld elements", (long long)d->count);
    }
    bool reduces = d->kind == COLL_ALL_REDUCE || d->kind == COLL_REDUCE || d->kind == COLL_REDUCE_SCATTER;
    if (reduces && (size_t)w < n) w += snprintf(buf + w, n - (size_t)w, ", op %s", tpu_reduce_op_name(d->op));
    bool rooted =
        d->kind == COLL_BROADCAST || d->kind == COLL_REDUCE || d->kind == COLL_GATHER || d->kind == COLL_SCATTER;
    if (rooted && (size_t)w < n) w += snprintf(buf + w, n - (size_t)w, ", root %d", d->root);
    if (d->kind == COLL_SEND_RECV && (size_t)w < n) w += snprintf(buf + w, n - (size_t)w, ", from rank %d", d->root);
    if ((size_t)w < n) snprintf(buf + w, n - (size_t)w, ")");
}

/* --- failure --- */

void coll_break(tpu_comm_t c, const char *msg) {
    pthread_mutex_lock(&c->emu);
    if (c->err == TPU_OK) {
        c->err = TPU_ERROR_KERNEL;
        snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
    }
    pthread_mutex_unlock(&c->emu);
    pthread_cond_broadcast(&c->turn);
    coll_ctrl *k = c->ctrl;
    uint32_t z = 0;
    if (atomic_compare_exchange_strong(&k->broken_claim, &z, (uint32_t)c->rank + 1)) {
        snprintf(k->why, sizeof k->why, "%s", msg);
        atomic_store_explicit(&k->broken, (uint32_t)c->rank + 1, memory_order_release);
        for (int q = 0; q < c->nranks; q++) futex_wake(&k->arrive[q].v);
    }
}

void tpu_comm_abort(tpu_comm_t c, const char *why) {
    if (!c) return;
    char m[512];
    snprintf(m, sizeof m, "rank %d aborted the communicator: %s", c->rank, why ? why : "tpu_comm_abort");
    coll_break(c, m);
}

/* Why the wait for rank q cannot succeed, or NULL. */
static bool peer_failure(tpu_comm_t c, int q, bool check_procs, char *why, size_t n) {
    coll_ctrl *k = c->ctrl;
    uint32_t b = atomic_load_explicit(&k->broken, memory_order_acquire);
    if (b) {
        snprintf(why, n, "rank %u failed: %s", b - 1, k->why);
        return true;
    }
    int32_t pid = atomic_load_explicit(&k->pid[q], memory_order_acquire);
    if (pid == -1) {
        snprintf(why, n, "rank %d left the communicator (destroyed it or shut its process group down)", q);
        return true;
    }
    if (check_procs && c->shm && pid > 0 && process_gone(pid)) {
        snprintf(why, n, "rank %d (pid %d) exited", q, (int)pid);
        return true;
    }
    return false;
}

static void describe_cur(tpu_comm_t c, char *buf, size_t n) {
    if (!c->cur) {
        snprintf(buf, n, "joining the communicator");
        return;
    }
    coll_desc d = {.call = c->calls + 1,
                   .kind = c->cur->kind,
                   .op = c->cur->op,
                   .dtype = c->cur->dtype,
                   .root = c->cur->root,
                   .count = c->cur->count};
    coll_describe(&d, buf, n);
}

tpu_status coll_step(tpu_comm_t c, char *msg, size_t n) {
    coll_ctrl *k = c->ctrl;
    uint32_t s = ++c->step;
    atomic_store(&k->arrive[c->rank].v, s);
    if (atomic_load(&k->arrive[c->rank].sleepers)) futex_wake(&k->arrive[c->rank].v);
    int64_t start = 0, last_check = 0;
    for (int q = 0; q < c->nranks; q++) {
        coll_line *L = &k->arrive[q];
        for (int i = 0; i < SPIN_ITERS && (int32_t)(atomic_load(&L->v) - s) < 0; i++) __builtin_ia32_pause();
        while ((int32_t)(atomic_load(&L->v) - s) < 0) {
            int64_t t = now_ns();
            if (!start) start = last_check = t;
            char why[448];
            bool check_procs = t - last_check >= CHECK_PEERS_NS;
            if (check_procs) last_check = t;
            bool timed_out = t - start >= c->timeout_ms * 1000000;
            if (peer_failure(c, q, check_procs, why, sizeof why) || timed_out) {
                char what[192];
                describe_cur(c, what, sizeof what);
                if (timed_out && !atomic_load(&k->broken))
                    snprintf(msg, n, "rank %d timed out after %lld ms in %s waiting for rank %d (timeout %lld ms)",
                             c->rank, (long long)((t - start) / 1000000), what, q, (long long)c->timeout_ms);
                else
                    snprintf(msg, n, "rank %d in %s: %s", c->rank, what, why);
                coll_break(c, msg);
                return TPU_ERROR_KERNEL;
            }
            atomic_fetch_add(&L->sleepers, 1);
            uint32_t v = atomic_load(&L->v);
            if ((int32_t)(v - s) < 0) futex_wait(&L->v, v, SLEEP_NS);
            atomic_fetch_sub(&L->sleepers, 1);
        }
    }
    return TPU_OK;
}

/* --- set-up --- */

static tpu_status comm_new(int rank, int nranks, int64_t timeout_ms, tpu_comm_t *out) {
    tpu_comm_t c = calloc(1, sizeof *c);
    if (!c) return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory for a communicator");
    c->rank = rank;
    c->nranks = nranks;
    c->timeout_ms = timeout_ms;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->emu, NULL);
    pthread_mutex_init(&c->imu, NULL);
    pthread_cond_init(&c->turn, NULL);
    *out = c;
    return TPU_OK;
}

static tpu_status check_args(int rank, int nranks, int64_t timeout_ms) {
    if (nranks < 1 || nranks > TPU_COMM_MAX_RANKS)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "a communicator has 1 to %d ranks, not %d", TPU_COMM_MAX_RANKS,
                             nranks);
    if (rank < 0 || rank >= nranks)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "rank %d is outside [0, %d)", rank, nranks);
    if (timeout_ms <= 0)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "a communicator's timeout must be positive, not %lld ms",
                             (long long)timeout_ms);
    return TPU_OK;
}

static void init_ctrl(coll_ctrl *k, int nranks) {
    k->nranks = (uint32_t)nranks;
    k->slot_bytes = TPU_COMM_SLOT_BYTES;
    atomic_store_explicit((_Atomic uint64_t *)&k->magic, COLL_MAGIC, memory_order_release);
}

static tpu_status shm_attach(const char *key, int rank, int nranks, int64_t timeout_ms, bool lazy, tpu_comm_t *out) {
    *out = NULL;
    tpu_status st = check_args(rank, nranks, timeout_ms);
    if (st) return st;
    size_t kl = key ? strlen(key) : 0;
    if (kl == 0 || kl + 12 > TPU_COMM_KEY_MAX ||
        strspn(key, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                    "0123456789._-") != kl)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "communicator key '%s': 1 to %d letters, digits, '.', '_' or '-'",
                             key ? key : "", TPU_COMM_KEY_MAX - 12);
    char name[TPU_COMM_KEY_MAX];
    snprintf(name, sizeof name, "/torch_tpu.%s", key);
    size_t bytes = ctrl_bytes() + (size_t)nranks * TPU_COMM_SLOT_BYTES;
    int64_t start = now_ns();
    int fd;
    if (rank == 0) {
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0)
            return tpu_set_error(TPU_ERROR_INVALID_VALUE, "cannot create shared memory '%s': %s", name,
                                 strerror(errno));
        if (ftruncate(fd, (off_t)bytes) != 0) {
            int e = errno;
            close(fd);
            shm_unlink(name);
            return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "cannot size shared memory '%s' to %zu bytes: %s", name,
                                 bytes, strerror(e));
        }
    } else {
        for (;;) { /* rank 0 creates it: wait for it to appear, sized */
            fd = shm_open(name, O_RDWR, 0600);
            struct stat sb;
            if (fd >= 0 && fstat(fd, &sb) == 0 && (size_t)sb.st_size >= bytes) break;
            if (fd < 0 && errno != ENOENT)
                return tpu_set_error(TPU_ERROR_INVALID_VALUE, "cannot open shared memory '%s': %s", name,
                                     strerror(errno));
            if (fd >= 0) close(fd);
            if (now_ns() - start >= timeout_ms * 1000000)
                return tpu_set_error(TPU_ERROR_KERNEL,
                                     "rank %d timed out after %lld ms waiting for rank 0 to create the communicator",
                                     rank, (long long)timeout_ms);
            struct timespec ts = {0, JOIN_POLL_NS};
            nanosleep(&ts, NULL);
        }
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        if (rank == 0) shm_unlink(name);
        return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "cannot map shared memory '%s': %s", name, strerror(errno));
    }
    coll_ctrl *k = p;
    if (rank == 0) init_ctrl(k, nranks);
    while (atomic_load_explicit((_Atomic uint64_t *)&k->magic, memory_order_acquire) != COLL_MAGIC) {
        if (now_ns() - start >= timeout_ms * 1000000) {
            munmap(p, bytes);
            return tpu_set_error(TPU_ERROR_KERNEL, "rank %d timed out waiting for rank 0 to set up the communicator",
                                 rank);
        }
        struct timespec ts = {0, JOIN_POLL_NS};
        nanosleep(&ts, NULL);
    }
    if (k->nranks != (uint32_t)nranks) {
        munmap(p, bytes);
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "rank %d joined a communicator of %u ranks, expecting %d", rank,
                             k->nranks, nranks);
    }
    tpu_comm_t c = NULL;
    st = comm_new(rank, nranks, timeout_ms, &c);
    if (st) {
        munmap(p, bytes);
        if (rank == 0) shm_unlink(name);
        return st;
    }
    c->shm = true;
    c->ctrl = k;
    c->slots = (char *)p + ctrl_bytes();
    c->map_bytes = bytes;
    atomic_store(&k->pid[rank], (int32_t)getpid());
    if (lazy) { /* the first collective takes the join step (coll_join) */
        if (rank == 0) snprintf(c->name, sizeof c->name, "%s", name);
        *out = c;
        return TPU_OK;
    }
    char msg[512];
    st = coll_step(c, msg, sizeof msg); /* everyone has mapped it */
    if (rank == 0) shm_unlink(name);
    if (st) {
        tpu_set_error(st, "%s", msg);
        atomic_store(&k->pid[rank], -1);
        munmap(p, bytes);
        pthread_mutex_destroy(&c->mu);
        pthread_mutex_destroy(&c->emu);
        pthread_mutex_destroy(&c->imu);
        pthread_cond_destroy(&c->turn);
        free(c);
        return st;
    }
    c->joined = true;
    *out = c;
    return TPU_OK;
}

tpu_status tpu_comm_init_shm(const char *key, int rank, int nranks, int64_t timeout_ms, tpu_comm_t *out) {
    return shm_attach(key, rank, nranks, timeout_ms, false, out);
}

tpu_status tpu_comm_open_shm(const char *key, int rank, int nranks, int64_t timeout_ms, tpu_comm_t *out) {
    return shm_attach(key, rank, nranks, timeout_ms, true, out);
}

tpu_status coll_join(tpu_comm_t c, char *msg, size_t n) {
    tpu_status st = coll_step(c, msg, n);
    if (c->name[0]) shm_unlink(c->name); /* joined or failed: nobody else will open it */
    c->name[0] = 0;
    if (!st) c->joined = true;
    return st;
}

tpu_status tpu_comm_init_local(int nranks, int64_t timeout_ms, tpu_comm_t *out) {
    tpu_status st = check_args(0, nranks, timeout_ms);
    if (st) return st;
    size_t bytes = ctrl_bytes() + (size_t)nranks * TPU_COMM_SLOT_BYTES;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    _Atomic int *refs = malloc(sizeof *refs);
    if (p == MAP_FAILED || !refs) {
        if (p != MAP_FAILED) munmap(p, bytes);
        free(refs);
        return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory for a communicator of %d ranks", nranks);
    }
    atomic_init(refs, nranks);
    init_ctrl(p, nranks);
    for (int r = 0; r < nranks; r++) {
        st = comm_new(r, nranks, timeout_ms, &out[r]);
        if (st) {
            for (int q = 0; q < r; q++) free(out[q]);
            munmap(p, bytes);
            free(refs);
            return st;
        }
        out[r]->ctrl = p;
        out[r]->slots = (char *)p + ctrl_bytes();
        out[r]->map_bytes = bytes;
        out[r]->local_refs = refs;
        out[r]->joined = true;
        atomic_store(&((coll_ctrl *)p)->pid[r], 1);
    }
    return TPU_OK;
}

void tpu_comm_inflight_add(tpu_comm_t c, int d) { atomic_fetch_add(&c->inflight, d); }

tpu_status tpu_comm_destroy(tpu_comm_t c) {
    if (!c) return TPU_OK;
    while (atomic_load(&c->inflight) > 0) { /* queued collectives still hold it */
        struct timespec ts = {0, JOIN_POLL_NS};
        nanosleep(&ts, NULL);
    }
    if (c->name[0]) shm_unlink(c->name); /* opened lazily, never joined */
    coll_ctrl *k = c->ctrl;
    atomic_store_explicit(&k->pid[c->rank], -1, memory_order_release);
    for (int q = 0; q < c->nranks; q++) futex_wake(&k->arrive[q].v);
    if (c->shm) {
        munmap(k, c->map_bytes);
    } else if (atomic_fetch_sub(c->local_refs, 1) == 1) {
        munmap(k, c->map_bytes);
        free((void *)c->local_refs);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->emu);
    pthread_mutex_destroy(&c->imu);
    pthread_cond_destroy(&c->turn);
    free(c);
    return TPU_OK;
}

int tpu_comm_rank(tpu_comm_t c) { return c ? c->rank : -1; }
int tpu_comm_size(tpu_comm_t c) { return c ? c->nranks : 0; }
uint64_t tpu_comm_count(tpu_comm_t c) { return c ? atomic_load(&c->ncalls_pub) : 0; }

tpu_status tpu_comm_error(tpu_comm_t c) {
    if (!c) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "NULL communicator");
    pthread_mutex_lock(&c->emu);
    tpu_status st = c->err;
    if (st) tpu_set_error(st, "%s", c->errmsg);
    pthread_mutex_unlock(&c->emu);
    return st;
}
