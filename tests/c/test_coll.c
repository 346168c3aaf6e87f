/* test_coll.c - the collectives (coll.h) against a reference computed here:
 * every collective x dtype x reduce op on 2 and 4 ranks of the local
 * transport (threads, one stream each), operands larger than a staging slot
 * (pieces), uneven all_to_all, send/recv, the errors a rank finds alone (PyTorch's
 * wording) and those the ranks find together (mismatched collectives, a
 * timeout, a rank that left), and the shared-memory transport between
 * processes (this binary re-executed as ranks), including a rank that dies. */
#define _GNU_SOURCE
#include "tpu/tpu.h"
#include "base/base-impl.h"
#include "test.h"
#include <pthread.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>

extern char **environ;

#define MAXR 4

typedef struct world {
    int nranks;
    tpu_comm_t comm[MAXR];
    tpu_stream_t stream[MAXR];
    pthread_barrier_t bar;
    void (*fn)(struct world *w, int rank);
    int failed[MAXR];
} world;

typedef struct rank_arg {
    world *w;
    int rank;
} rank_arg;

static void *rank_main(void *p) {
    rank_arg *a = p;
    a->w->fn(a->w, a->rank);
    return NULL;
}

static void run_world(int nranks, int64_t timeout_ms, void (*fn)(world *, int)) {
    world w = {.nranks = nranks, .fn = fn};
    CHECK_OK(tpu_comm_init_local(nranks, timeout_ms, w.comm));
    for (int r = 0; r < nranks; r++) CHECK_OK(tpu_stream_create(0, 0, &w.stream[r]));
    pthread_barrier_init(&w.bar, NULL, (unsigned)nranks);
    pthread_t th[MAXR];
    rank_arg args[MAXR];
    for (int r = 0; r < nranks; r++) {
        args[r] = (rank_arg){&w, r};
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < nranks; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < nranks; r++) {
        CHECK_MSG(!w.failed[r], "rank %d of %d failed", r, nranks);
        CHECK_OK(tpu_comm_destroy(w.comm[r]));
    }
    pthread_barrier_destroy(&w.bar);
}

/* A rank's CHECK: the harness's flag is not thread-safe, so ranks note failures here. */
#define RCHECK(cond, ...)                                                                   \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "  FAIL %s:%d rank %d: %s: ", __FILE__, __LINE__, rank, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fputc('\n', stderr);                                                            \
            w->failed[rank] = 1;                                                            \
        }                                                                                   \
    } while (0)

/* --- device buffers --- */

typedef struct dbuf {
    tpu_tensor t;
    void *dev;
    size_t bytes;
} dbuf;

static dbuf dalloc(tpu_dtype dt, int64_t n) {
    dbuf b = {0};
    b.bytes = (size_t)n * tpu_dtype_size(dt);
    if (b.bytes) tpu_malloc(0, b.bytes, NULL, &b.dev);
    int64_t sz[1] = {n};
    tpu_tensor_contiguous(&b.t, b.dev, dt, 1, sz);
    return b;
}
static void dfree(dbuf *b) { tpu_free(b->dev); }
static void dput(dbuf *b, const void *h, tpu_stream_t s) {
    if (b->bytes) tpu_memcpy(b->dev, h, b->bytes, TPU_COPY_H2D, s);
}
static tpu_status dget(void *h, dbuf *b, tpu_stream_t s) {
    tpu_status st = tpu_stream_synchronize(s);
    if (b->bytes) tpu_memcpy(h, b->dev, b->bytes, TPU_COPY_D2H, s);
    return st;
}

/* --- values and the reference --- */

static const tpu_dtype DTYPES[] = {TPU_F32, TPU_F64, TPU_F16, TPU_BF16, TPU_U8,
                                   TPU_I8,  TPU_I16, TPU_I32, TPU_I64,  TPU_BOOL};
#define NDT (int)(sizeof DTYPES / sizeof DTYPES[0])

static double value(tpu_dtype dt, int rank, int64_t i) {
    if (dt == TPU_BOOL) return ((i + rank) % 3) != 0;
    if (tpu_dtype_is_float(dt)) return 0.5 * rank + (double)((i * 7 + rank * 3) % 11) - 4.0;
    int64_t v = (i * 7 + rank * 31) % 13;
    return dt == TPU_U8 ? (double)(v + 1) : (double)(v - 6 + (v == 6)); /* never 0: products stay informative */
}

static void fill(char *h, tpu_dtype dt, int rank, int64_t n, int64_t base) {
    size_t es = tpu_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        double v = value(dt, rank, base + i);
        if (tpu_dtype_is_float(dt))
            tpu_store_f64(h + i * es, dt, v);
        else
            tpu_store_i64(h + i * es, dt, (int64_t)v);
    }
}

/* op over ranks 0..P-1 of value(rank, i), as the runtime documents it. */
static void reference(char *h, tpu_dtype dt, tpu_reduce_op op, int P, int64_t n, int64_t base) {
    size_t es = tpu_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        if (tpu_dtype_is_float(dt)) {
            bool f64 = dt == TPU_F64;
            double acc = 0;
            float facc = 0;
            for (int r = 0; r < P; r++) {
                double v = value(dt, r, base + i);
                if (!f64) v = (float)v;
                if (r == 0) {
                    acc = v;
                    facc = (float)v;
                    continue;
                }
                switch (op) {
                case TPU_REDUCE_SUM:
                case TPU_REDUCE_AVG:
                    acc += v;
                    facc += (float)v;
                    break;
                case TPU_REDUCE_PRODUCT:
                    acc *= v;
                    facc *= (float)v;
                    break;
                case TPU_REDUCE_MIN:
                    acc = v < acc ? v : acc;
                    facc = (float)acc;
                    break;
                default:
                    acc = v > acc ? v : acc;
                    facc = (float)acc;
                    break;
                }
            }
            if (op == TPU_REDUCE_AVG) {
                acc /= P;
                facc /= (float)P;
            }
            tpu_store_f64(h + i * es, dt, f64 ? acc : (double)facc);
        } else {
            uint64_t acc = 0;
            for (int r = 0; r < P; r++) {
                int64_t v = (int64_t)value(dt, r, base + i);
                if (dt == TPU_BOOL) v = v != 0;
                if (r == 0) {
                    acc = (uint64_t)v;
                    continue;
                }
                bool bl = dt == TPU_BOOL;
                switch (op) {
                case TPU_REDUCE_SUM:
                case TPU_REDUCE_AVG: acc = bl ? (acc | (uint64_t)v) : acc + (uint64_t)v; break;
                case TPU_REDUCE_PRODUCT: acc = bl ? (acc & (uint64_t)v) : acc * (uint64_t)v; break;
                case TPU_REDUCE_MIN: acc = (int64_t)acc < v ? acc : (uint64_t)v; break;
                case TPU_REDUCE_MAX: acc = (int64_t)acc > v ? acc : (uint64_t)v; break;
                case TPU_REDUCE_BAND: acc &= (uint64_t)v; break;
                case TPU_REDUCE_BOR: acc |= (uint64_t)v; break;
                default: acc ^= (uint64_t)v; break;
                }
            }
            int64_t r = (int64_t)acc;
            if (op == TPU_REDUCE_AVG) {
                /* the runtime divides the value as its dtype wraps it */
                char tmp[8];
                tpu_store_i64(tmp, dt, r);
                r = tpu_load_i64(tmp, dt) / P;
            }
            tpu_store_i64(h + i * es, dt, r);
        }
    }
}

static bool op_applies(tpu_reduce_op op, tpu_dtype dt) {
    if (tpu_dtype_is_float(dt)) return op <= TPU_REDUCE_MAX;
    return !(dt == TPU_BOOL && op == TPU_REDUCE_AVG);
}

/* --- every collective on every dtype --- */

static int64_t g_n; /* elements per rank for the sweep */

static void sweep_rank(world *w, int rank) {
    int P = w->nranks;
    tpu_comm_t c = w->comm[rank];
    tpu_stream_t s = w->stream[rank];
    int64_t n = g_n;
    for (int di = 0; di < NDT; di++) {
        tpu_dtype dt = DTYPES[di];
        size_t es = tpu_dtype_size(dt);
        char *h = malloc((size_t)(n * P + 1) * es), *ref = malloc((size_t)(n * P + 1) * es),
             *got = malloc((size_t)(n * P + 1) * es);
        /* all_reduce (in place and out of place), reduce, reduce_scatter: every op */
        for (int op = 0; op < TPU_REDUCE_OP_COUNT; op++) {
            if (!op_applies((tpu_reduce_op)op, dt)) continue;
            dbuf in = dalloc(dt, n), out = dalloc(dt, n);
            fill(h, dt, rank, n, 0);
            dput(&in, h, s);
            tpu_status st = tpu_all_reduce(c, &in.t, &out.t, (tpu_reduce_op)op, s);
            st = st ? st : tpu_all_reduce(c, &in.t, &in.t, (tpu_reduce_op)op, s);
            RCHECK(st == TPU_OK, "all_reduce %s %s: %s", tpu_dtype_name(dt), tpu_reduce_op_name(op), tpu_last_error());
            reference(ref, dt, (tpu_reduce_op)op, P, n, 0);
            RCHECK(dget(got, &out, s) == TPU_OK, "%s", tpu_last_error());
            RCHECK(memcmp(got, ref, (size_t)n * es) == 0, "all_reduce %s %s n=%lld differs", tpu_dtype_name(dt),
                   tpu_reduce_op_name(op), (long long)n);
            dget(got, &in, s);
            RCHECK(memcmp(got, ref, (size_t)n * es) == 0, "in-place all_reduce %s %s differs", tpu_dtype_name(dt),
                   tpu_reduce_op_name(op));
            /* reduce to the last rank */
            dput(&in, h, s);
            memset(got, 0, (size_t)n * es);
            dput(&out, got, s);
            st = tpu_reduce(c, &in.t, rank == P - 1 ? &out.t : NULL, (tpu_reduce_op)op, P - 1, s);
            RCHECK(st == TPU_OK, "reduce: %s", tpu_last_error());
            dget(got, &out, s);
            if (rank == P - 1)
                RCHECK(memcmp(got, ref, (size_t)n * es) == 0, "reduce %s %s differs", tpu_dtype_name(dt),
                       tpu_reduce_op_name(op));
            dfree(&in);
            dfree(&out);
            /* reduce_scatter: in = P chunks of n; chunk d of rank r holds value(r, d * n + i) */
            dbuf rin = dalloc(dt, n * P), rout = dalloc(dt, n);
            fill(h, dt, rank, n * P, 0);
            dput(&rin, h, s);
            st = tpu_reduce_scatter(c, &rin.t, &rout.t, (tpu_reduce_op)op, s);
            RCHECK(st == TPU_OK, "reduce_scatter: %s", tpu_last_error());
            reference(ref, dt, (tpu_reduce_op)op, P, n, (int64_t)rank * n);
            dget(got, &rout, s);
            RCHECK(memcmp(got, ref, (size_t)n * es) == 0, "reduce_scatter %s %s differs", tpu_dtype_name(dt),
                   tpu_reduce_op_name(op));
            dfree(&rin);
            dfree(&rout);
        }
        /* broadcast from rank 1 % P */
        {
            int root = 1 % P;
            dbuf b = dalloc(dt, n);
            fill(h, dt, rank, n, 0);
            dput(&b, h, s);
            RCHECK(tpu_broadcast(c, &b.t, root, s) == TPU_OK, "broadcast: %s", tpu_last_error());
            fill(ref, dt, root, n, 0);
            dget(got, &b, s);
            RCHECK(memcmp(got, ref, (size_t)n * es) == 0, "broadcast %s differs", tpu_dtype_name(dt));
            dfree(&b);
        }
        /* all_gather, gather to rank 0, scatter from rank 0 */
        {
            dbuf in = dalloc(dt, n), out = dalloc(dt, n * P);
            fill(h, dt, rank, n, 0);
            dput(&in, h, s);
            RCHECK(tpu_all_gather(c, &in.t, &out.t, s) == TPU_OK, "all_gather: %s", tpu_last_error());
            for (int q = 0; q < P; q++) fill(ref + (size_t)(q * n) * es, dt, q, n, 0);
            dget(got, &out, s);
            RCHECK(memcmp(got, ref, (size_t)(n * P) * es) == 0, "all_gather %s differs", tpu_dtype_name(dt));
            memset(got, 0, (size_t)(n * P) * es);
            dput(&out, got, s);
            RCHECK(tpu_gather(c, &in.t, rank == 0 ? &out.t : NULL, 0, s) == TPU_OK, "gather: %s", tpu_last_error());
            dget(got, &out, s);
            if (rank == 0) RCHECK(memcmp(got, ref, (size_t)(n * P) * es) == 0, "gather %s differs", tpu_dtype_name(dt));
            /* scatter: root's out holds every rank's values; rank r gets chunk r */
            dput(&out, ref, s);
            RCHECK(tpu_scatter(c, rank == 0 ? &out.t : NULL, &in.t, 0, s) == TPU_OK, "scatter: %s", tpu_last_error());
            dget(got, &in, s);
            RCHECK(memcmp(got, ref + (size_t)(rank * n) * es, (size_t)n * es) == 0, "scatter %s differs",
                   tpu_dtype_name(dt));
            dfree(&in);
            dfree(&out);
        }
        free(h);
        free(ref);
        free(got);
    }
    RCHECK(tpu_comm_barrier(c, 0, s) == TPU_OK, "barrier: %s", tpu_last_error());
    RCHECK(tpu_stream_synchronize(s) == TPU_OK, "%s", tpu_last_error());
}

static void test_every_collective_2_and_4_ranks(void) {
    int64_t sizes[] = {1, 37, 70000}; /* 70000 x 8 bytes: past the direct all_reduce */
    for (int k = 0; k < 3; k++) {
        g_n = sizes[k];
        run_world(2, 20000, sweep_rank);
        if (k < 2) run_world(4, 20000, sweep_rank);
    }
}

/* Operands larger than a slot go through in pieces (f32 sum, all_gather, reduce_scatter). */
static void big_rank(world *w, int rank) {
    int P = w->nranks;
    tpu_comm_t c = w->comm[rank];
    tpu_stream_t s = w->stream[rank];
    int64_t n = (int64_t)(TPU_COMM_SLOT_BYTES / 4) * 2 + 12345;
    float *h = malloc((size_t)n * P * 4), *got = malloc((size_t)n * P * 4);
    dbuf in = dalloc(TPU_F32, n), out = dalloc(TPU_F32, n * P);
    for (int64_t i = 0; i < n; i++) h[i] = (float)((i % 1000) + rank);
    dput(&in, h, s);
    RCHECK(tpu_all_reduce(c, &in.t, &in.t, TPU_REDUCE_SUM, s) == TPU_OK, "%s", tpu_last_error());
    dget(got, &in, s);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += got[i] != (float)(P * (i % 1000) + P * (P - 1) / 2);
    RCHECK(bad == 0, "%d of %lld elements differ after a pieced all_reduce", bad, (long long)n);
    dput(&in, h, s);
    RCHECK(tpu_all_gather(c, &in.t, &out.t, s) == TPU_OK, "%s", tpu_last_error());
    dget(got, &out, s);
    bad = 0;
    for (int q = 0; q < P; q++)
        for (int64_t i = 0; i < n; i++) bad += got[q * n + i] != (float)((i % 1000) + q);
    RCHECK(bad == 0, "%d elements differ after a pieced all_gather", bad);
    dbuf rout = dalloc(TPU_F32, n);
    for (int64_t i = 0; i < n * P; i++) got[i] = (float)(i % 777);
    dput(&out, got, s);
    RCHECK(tpu_reduce_scatter(c, &out.t, &rout.t, TPU_REDUCE_MAX, s) == TPU_OK, "%s", tpu_last_error());
    dget(h, &rout, s);
    bad = 0;
    for (int64_t i = 0; i < n; i++) bad += h[i] != (float)((rank * n + i) % 777);
    RCHECK(bad == 0, "%d elements differ after a pieced reduce_scatter", bad);
    dfree(&in);
    dfree(&out);
    dfree(&rout);
    free(h);
    free(got);
}

static void test_pieces_larger_than_a_slot(void) { run_world(2, 30000, big_rank); }

/* Uneven all_to_all: rank r sends (r + d) % 3 * 1000 + d elements to rank d (past a slot's share for some). */
static int64_t a2a_count(int from, int to) { return ((from + to) % 3) * 700001 / 2 + to; }

static void a2a_rank(world *w, int rank) {
    int P = w->nranks;
    tpu_comm_t c = w->comm[rank];
    tpu_stream_t s = w->stream[rank];
    int64_t sc[MAXR], rc[MAXR], ts = 0, tr = 0;
    for (int q = 0; q < P; q++) {
        sc[q] = a2a_count(rank, q);
        rc[q] = a2a_count(q, rank);
        ts += sc[q];
        tr += rc[q];
    }
    int32_t *h = malloc((size_t)(ts + 1) * 4), *got = malloc((size_t)(tr + 1) * 4);
    int64_t o = 0;
    for (int q = 0; q < P; q++)
        for (int64_t i = 0; i < sc[q]; i++) h[o++] = (int32_t)(rank * 1000000 + q * 100000 + (i % 99991));
    dbuf in = dalloc(TPU_I32, ts), out = dalloc(TPU_I32, tr);
    dput(&in, h, s);
    RCHECK(tpu_all_to_all(c, &in.t, sc, &out.t, rc, s) == TPU_OK, "%s", tpu_last_error());
    dget(got, &out, s);
    int bad = 0;
    o = 0;
    for (int q = 0; q < P; q++)
        for (int64_t i = 0; i < rc[q]; i++) bad += got[o++] != (int32_t)(q * 1000000 + rank * 100000 + (i % 99991));
    RCHECK(bad == 0, "%d elements differ after all_to_all", bad);
    dfree(&in);
    dfree(&out);
    free(h);
    free(got);
}

static void test_all_to_all_uneven(void) {
    run_world(2, 30000, a2a_rank);
    run_world(3, 30000, a2a_rank);
}

/* Collectives run in issue order whatever stream they were queued on: rank
 * 0 queues A on a stream held up by a slow callback, then B on another; rank
 * 1 queues both on one stream. B must not overtake A on rank 0. */
static void slow_cb(void *u) {
    (void)u;
    struct timespec ts = {0, 150000000};
    nanosleep(&ts, NULL);
}

static void order_rank(world *w, int rank) {
    tpu_comm_t c = w->comm[rank];
    tpu_stream_t s = w->stream[rank], s2;
    RCHECK(tpu_stream_create(0, -1, &s2) == TPU_OK, "%s", tpu_last_error());
    dbuf a = dalloc(TPU_F32, 4), b = dalloc(TPU_F32, 6);
    float ha[4] = {1, 1, 1, 1}, hb[6] = {2, 2, 2, 2, 2, 2}, ga[4], gb[6];
    dput(&a, ha, s);
    dput(&b, hb, s);
    tpu_stream_synchronize(s);
    if (rank == 0) {
        tpu_stream_add_callback(s2, slow_cb, NULL);
        RCHECK(tpu_all_reduce(c, &a.t, &a.t, TPU_REDUCE_SUM, s2) == TPU_OK, "%s", tpu_last_error());
        RCHECK(tpu_all_reduce(c, &b.t, &b.t, TPU_REDUCE_SUM, s) == TPU_OK, "%s", tpu_last_error());
        RCHECK(tpu_stream_synchronize(s2) == TPU_OK, "%s", tpu_last_error());
    } else {
        RCHECK(tpu_all_reduce(c, &a.t, &a.t, TPU_REDUCE_SUM, s) == TPU_OK, "%s", tpu_last_error());
        RCHECK(tpu_all_reduce(c, &b.t, &b.t, TPU_REDUCE_SUM, s) == TPU_OK, "%s", tpu_last_error());
    }
    RCHECK(dget(gb, &b, s) == TPU_OK, "%s", tpu_last_error());
    RCHECK(dget(ga, &a, s) == TPU_OK, "%s", tpu_last_error());
    RCHECK(ga[0] == 2 && gb[5] == 4, "got %g %g", ga[0], gb[5]);
    dfree(&a);
    dfree(&b);
}

static void test_issue_order_across_streams(void) { run_world(2, 5000, order_rank); }

/* send/recv: each dtype one way, a pieced bf16 operand the other way, and a
 * mismatched pair (two sends) that fails on both ranks naming it. */
static int g_p2p_bad;

static void p2p_rank(world *w, int rank) {
    tpu_comm_t c = w->comm[rank];
    tpu_stream_t s = w->stream[rank];
    if (g_p2p_bad) {
        dbuf a = dalloc(TPU_F32, 5);
        float h[5] = {0};
        dput(&a, h, s);
        RCHECK(tpu_send(c, &a.t, s) == TPU_OK, "%s", tpu_last_error());
        tpu_status st = tpu_stream_synchronize(s);
        RCHECK(st == TPU_ERROR_KERNEL &&
                   strstr(tpu_last_error(), "send/recv (call #1, float32, 5 elements, from rank") &&
                   strstr(tpu_last_error(), "mismatched collectives"),
               "%s", tpu_last_error());
        dfree(&a);
        return;
    }
    for (int k = 0; k < NDT; k++) {
        tpu_dtype dt = DTYPES[k];
        int64_t n = 1000 + k;
        size_t es = tpu_dtype_size(dt);
        char *h = malloc((size_t)n * es), *want = malloc((size_t)n * es);
        dbuf b = dalloc(dt, n);
        fill(want, dt, 0, n, k);
        if (rank == 0) {
            dput(&b, want, s);
            RCHECK(tpu_send(c, &b.t, s) == TPU_OK, "%s", tpu_last_error());
            RCHECK(tpu_stream_synchronize(s) == TPU_OK, "%s", tpu_last_error());
        } else {
            memset(h, 0, (size_t)n * es);
            dput(&b, h, s);
            RCHECK(tpu_recv(c, &b.t, s) == TPU_OK, "%s", tpu_last_error());
            RCHECK(dget(h, &b, s) == TPU_OK, "%s", tpu_last_error());
            RCHECK(memcmp(h, want, (size_t)n * es) == 0, "recv of %s differs", tpu_dtype_name(dt));
        }
        dfree(&b);
        free(h);
        free(want);
    }
    int64_t n = (int64_t)TPU_COMM_SLOT_BYTES + 777; /* bf16: two slots and a bit */
    uint16_t *h = malloc((size_t)n * 2);
    dbuf b = dalloc(TPU_BF16, n);
    for (int64_t i = 0; i < n; i++) h[i] = rank == 1 ? (uint16_t)(i * 31 + 7) : 0;
    dput(&b, h, s);
    RCHECK((rank == 1 ? tpu_send(c, &b.t, s) : tpu_recv(c, &b.t, s)) == TPU_OK, "%s", tpu_last_error());
    RCHECK(dget(h, &b, s) == TPU_OK, "%s", tpu_last_error());
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += h[i] != (uint16_t)(i * 31 + 7);
    RCHECK(bad == 0, "%d of %lld elements differ after a pieced send/recv", bad, (long long)n);
    dfree(&b);
    free(h);
}

static void test_send_recv(void) {
    g_p2p_bad = 0;
    run_world(2, 20000, p2p_rank);
    g_p2p_bad = 1;
    run_world(2, 5000, p2p_rank);
    tpu_comm_t c[3];
    CHECK_OK(tpu_comm_init_local(3, 1000, c));
    dbuf a = dalloc(TPU_F32, 4);
    CHECK(tpu_send(c[0], &a.t, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK(strstr(tpu_last_error(), "needs a communicator of 2 ranks") != NULL);
    CHECK(tpu_comm_count(c[0]) == 0);
    dfree(&a);
    for (int r = 0; r < 3; r++) CHECK_OK(tpu_comm_destroy(c[r]));
}

/* --- errors a rank finds alone: at the call, PyTorch's wording, nothing queued --- */

static void test_argument_errors(void) {
    tpu_comm_t c[2];
    CHECK_OK(tpu_comm_init_local(2, 1000, c));
    dbuf a = dalloc(TPU_F32, 8), b = dalloc(TPU_F32, 12), i8 = dalloc(TPU_I32, 8);
    CHECK(tpu_all_reduce(c[0], &a.t, &a.t, TPU_REDUCE_BAND, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK(strstr(tpu_last_error(), "Cannot use ReduceOp.BAND with non-integral dtype") != NULL);
    CHECK(tpu_all_reduce(c[0], &a.t, &b.t, TPU_REDUCE_SUM, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK(tpu_all_reduce(c[0], &a.t, &i8.t, TPU_REDUCE_SUM, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK(strstr(tpu_last_error(), "dtype") != NULL);
    tpu_tensor strided = a.t;
    strided.sizes[0] = 4;
    strided.strides[0] = 2;
    CHECK(tpu_all_reduce(c[0], &strided, &strided, TPU_REDUCE_SUM, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK(strstr(tpu_last_error(), "Tensors must be contiguous") != NULL);
    tpu_tensor past = a.t;
    past.offset = 4;
    CHECK(tpu_all_reduce(c[0], &past, &past, TPU_REDUCE_SUM, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK(strstr(tpu_last_error(), "outside its storage") != NULL);
    CHECK(tpu_all_gather(c[0], &a.t, &b.t, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK(strstr(tpu_last_error(), "output tensor size must be equal to world_size times input tensor size") != NULL);
    CHECK(tpu_reduce_scatter(c[0], &b.t, &a.t, TPU_REDUCE_SUM, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK(tpu_broadcast(c[0], &a.t, 2, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK(strstr(tpu_last_error(), "Invalid rootRank") != NULL);
    int64_t sc[2] = {4, 3}, rc[2] = {4, 4};
    CHECK(tpu_all_to_all(c[0], &a.t, sc, &a.t, rc, NULL) == TPU_ERROR_INVALID_VALUE);
    CHECK(strstr(tpu_last_error(), "Split sizes") != NULL);
    CHECK(tpu_comm_count(c[0]) == 0); /* nothing was queued */
    dfree(&a);
    dfree(&b);
    dfree(&i8);
    CHECK_OK(tpu_comm_destroy(c[0]));
    CHECK_OK(tpu_comm_destroy(c[1]));
    CHECK(tpu_comm_init_local(0, 1000, c) == TPU_ERROR_INVALID_VALUE);
    CHECK(tpu_comm_init_local(2, 0, c) == TPU_ERROR_INVALID_VALUE);
    CHECK(tpu_comm_init_shm("bad/key", 0, 2, 1000, c) == TPU_ERROR_INVALID_VALUE);
}

/* --- errors the ranks find together --- */

static int g_mismatch; /* 0: rank 1 calls another collective; 1: rank 2 passes more elements */

static void mismatch_rank(world *w, int rank) {
    tpu_comm_t c = w->comm[rank];
    tpu_stream_t s = w->stream[rank];
    dbuf a = dalloc(TPU_F32, 8), b = dalloc(TPU_F32, 9);
    float h[9] = {0};
    dput(&a, h, s);
    dput(&b, h, s);
    RCHECK(tpu_all_reduce(c, &a.t, &a.t, TPU_REDUCE_SUM, s) == TPU_OK, "%s", tpu_last_error()); /* call 1 agrees */
    if (g_mismatch == 0 && rank == 1)
        tpu_broadcast(c, &a.t, 0, s);
    else if (g_mismatch == 1 && rank == 2)
        tpu_all_reduce(c, &b.t, &b.t, TPU_REDUCE_SUM, s);
    else
        tpu_all_reduce(c, &a.t, &a.t, TPU_REDUCE_SUM, s);
    tpu_status st = tpu_stream_synchronize(s);
    RCHECK(st == TPU_ERROR_KERNEL, "a mismatch must fail (got %s)", tpu_status_name(st));
    const char *want = g_mismatch == 0 ? "rank 1 called broadcast (call #2" : "9 elements";
    RCHECK(strstr(tpu_last_error(), "mismatched collectives") && strstr(tpu_last_error(), "tpu collective") &&
               (strstr(tpu_last_error(), want) || strstr(tpu_last_error(), "failed: rank")),
           "%s", tpu_last_error());
    /* broken: the next call fails at once, and the stream is usable */
    RCHECK(tpu_all_reduce(c, &a.t, &a.t, TPU_REDUCE_SUM, s) == TPU_ERROR_KERNEL, "broken communicator");
    RCHECK(strstr(tpu_last_error(), "unusable after an earlier error") != NULL, "%s", tpu_last_error());
    RCHECK(tpu_stream_synchronize(s) == TPU_OK, "%s", tpu_last_error());
    dfree(&a);
    dfree(&b);
}

static void test_mismatched_collectives_fail_on_every_rank(void) {
    for (g_mismatch = 0; g_mismatch < 2; g_mismatch++) run_world(3, 5000, mismatch_rank);
}

static void timeout_rank(world *w, int rank) {
    tpu_comm_t c = w->comm[rank];
    tpu_stream_t s = w->stream[rank];
    if (rank == 1) { /* never joins the collective: waits until rank 0 has given up */
        pthread_barrier_wait(&w->bar);
        return;
    }
    dbuf a = dalloc(TPU_F32, 4);
    RCHECK(tpu_all_reduce(c, &a.t, &a.t, TPU_REDUCE_SUM, s) == TPU_OK, "queued");
    tpu_status st = tpu_stream_synchronize(s);
    RCHECK(st == TPU_ERROR_KERNEL, "timeout must fail");
    RCHECK(strstr(tpu_last_error(), "timed out after") != NULL && strstr(tpu_last_error(), "all_reduce") != NULL &&
               strstr(tpu_last_error(), "waiting for rank 1") != NULL,
           "%s", tpu_last_error());
    dfree(&a);
    pthread_barrier_wait(&w->bar);
}

static void test_timeout_names_the_collective_and_rank(void) { run_world(2, 300, timeout_rank); }

static void left_rank(world *w, int rank) {
    if (rank == 1) return; /* run_world destroys it after the join: rank 0 must see it gone */
    tpu_comm_t c = w->comm[rank];
    (void)c;
}

static void test_peer_left(void) {
    tpu_comm_t c[2];
    CHECK_OK(tpu_comm_init_local(2, 60000, c));
    tpu_stream_t s;
    CHECK_OK(tpu_stream_create(0, 0, &s));
    dbuf a = dalloc(TPU_F32, 4);
    CHECK_OK(tpu_comm_destroy(c[1]));
    CHECK_OK(tpu_all_reduce(c[0], &a.t, &a.t, TPU_REDUCE_SUM, s));
    CHECK(tpu_stream_synchronize(s) == TPU_ERROR_KERNEL);
    CHECK(strstr(tpu_last_error(), "rank 1 left the communicator") != NULL);
    dfree(&a);
    CHECK_OK(tpu_comm_destroy(c[0]));
    (void)left_rank;
}

/* --- the shared-memory transport: this binary re-executed as ranks --- */

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* tpu_comm_open_shm: rank 0 returns at once, before rank 1 has come; the
 * first collective joins. "lazy-absent": rank 1 never comes, and rank 0's
 * first collective times out naming it, leaving no segment behind. */
static int lazy_child(const char *key, int rank, const char *mode) {
    bool absent = strcmp(mode, "lazy-absent") == 0;
    if (rank == 1) {
        if (absent) return 0;
        struct timespec ts = {0, 300 * 1000000};
        nanosleep(&ts, NULL); /* rank 0 must not be waiting for this */
    }
    tpu_comm_t c;
    int64_t t0 = mono_ns();
    if (tpu_comm_open_shm(key, rank, 2, absent ? 400 : 20000, &c)) {
        fprintf(stderr, "rank %d: open: %s\n", rank, tpu_last_error());
        return 2;
    }
    if (rank == 0 && mono_ns() - t0 > 200 * 1000000) {
        fprintf(stderr, "rank 0: tpu_comm_open_shm waited %lld ms for rank 1\n",
                (long long)((mono_ns() - t0) / 1000000));
        return 3;
    }
    tpu_stream_t s = tpu_stream_default(0);
    dbuf a = dalloc(TPU_F32, 5);
    float h[5] = {1, 2, 3, 4, 5}, z[5] = {0};
    dput(&a, rank == 0 ? h : z, s);
    tpu_status st = rank == 0 ? tpu_send(c, &a.t, s) : tpu_recv(c, &a.t, s);
    st = st ? st : tpu_stream_synchronize(s);
    int rc = 0;
    if (absent) {
        if (st != TPU_ERROR_KERNEL || !strstr(tpu_last_error(), "timed out") ||
            !strstr(tpu_last_error(), "send/recv") || !strstr(tpu_last_error(), "waiting for rank 1")) {
            fprintf(stderr, "rank 0: expected a timeout naming send/recv and rank 1, got %s: %s\n", tpu_status_name(st),
                    tpu_last_error());
            rc = 4;
        }
    } else if (st) {
        fprintf(stderr, "rank %d: send/recv: %s\n", rank, tpu_last_error());
        rc = 5;
    } else {
        dget(z, &a, s);
        if (memcmp(z, h, sizeof h)) rc = 6;
    }
    dfree(&a);
    tpu_comm_destroy(c);
    char path[160];
    snprintf(path, sizeof path, "/dev/shm/torch_tpu.%s", key);
    if (rank == 0 && access(path, F_OK) == 0) {
        fprintf(stderr, "rank 0: %s outlived the communicator\n", path);
        rc = 7;
    }
    return rc;
}

static int shm_child(const char *key, int rank, int nranks, const char *mode) {
    if (tpu_init()) return 1;
    tpu_comm_t c;
    if (strncmp(mode, "lazy", 4) == 0) return lazy_child(key, rank, mode);
    if (tpu_comm_init_shm(key, rank, nranks, 20000, &c)) {
        fprintf(stderr, "rank %d: init: %s\n", rank, tpu_last_error());
        return 2;
    }
    if (strcmp(mode, "die") == 0 && rank == 1) _exit(0); /* a rank that dies without a word */
    tpu_stream_t s = tpu_stream_default(0);
    int64_t n = 300000;
    dbuf a = dalloc(TPU_BF16, n);
    char *h = malloc((size_t)n * 2), *ref = malloc((size_t)n * 2);
    fill(h, TPU_BF16, rank, n, 0);
    dput(&a, h, s);
    tpu_status st = tpu_all_reduce(c, &a.t, &a.t, TPU_REDUCE_SUM, s);
    st = st ? st : tpu_stream_synchronize(s);
    if (strcmp(mode, "die") == 0) {
        bool ok =
            st == TPU_ERROR_KERNEL && strstr(tpu_last_error(), "rank 1 (pid") && strstr(tpu_last_error(), "exited");
        if (!ok)
            fprintf(stderr, "rank 0: expected 'rank 1 exited', got %s: %s\n", tpu_status_name(st), tpu_last_error());
        dfree(&a);
        free(h);
        free(ref);
        tpu_comm_destroy(c);
        return ok ? 0 : 3;
    }
    if (st) {
        fprintf(stderr, "rank %d: all_reduce: %s\n", rank, tpu_last_error());
        _exit(4);
    }
    dget(h, &a, s);
    reference(ref, TPU_BF16, TPU_REDUCE_SUM, nranks, n, 0);
    int rc = memcmp(h, ref, (size_t)n * 2) ? 5 : 0;
    if (rc) fprintf(stderr, "rank %d: shm all_reduce differs\n", rank);
    st = tpu_comm_barrier(c, 0, s);
    st = st ? st : tpu_stream_synchronize(s);
    if (st) rc = 6;
    dfree(&a);
    free(h);
    free(ref);
    tpu_comm_destroy(c);
    return rc;
}

static void spawn_world(int nranks, const char *mode, int *codes) {
    char key[64];
    snprintf(key, sizeof key, "test.%d.%s.%d", (int)getpid(), mode, nranks);
    pid_t pids[MAXR];
    for (int r = 0; r < nranks; r++) {
        char rs[16], ns[16];
        snprintf(rs, sizeof rs, "%d", r);
        snprintf(ns, sizeof ns, "%d", nranks);
        char *argv[] = {"/proc/self/exe", "--shm-rank", key, rs, ns, (char *)mode, NULL};
        CHECK(posix_spawn(&pids[r], "/proc/self/exe", NULL, NULL, argv, environ) == 0);
    }
    for (int r = 0; r < nranks; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
    }
}

static void test_shm_transport_between_processes(void) {
    int codes[MAXR];
    spawn_world(2, "ok", codes);
    CHECK_MSG(codes[0] == 0 && codes[1] == 0, "exit codes %d %d", codes[0], codes[1]);
    spawn_world(4, "ok", codes);
    for (int r = 0; r < 4; r++) CHECK_MSG(codes[r] == 0, "rank %d exit code %d", r, codes[r]);
}

static void test_shm_open_joins_at_first_collective(void) {
    int codes[MAXR];
    spawn_world(2, "lazy", codes);
    CHECK_MSG(codes[0] == 0 && codes[1] == 0, "exit codes %d %d", codes[0], codes[1]);
    spawn_world(2, "lazy-absent", codes);
    CHECK_MSG(codes[0] == 0 && codes[1] == 0, "exit codes %d %d", codes[0], codes[1]);
}

static void test_shm_dead_rank_fails_fast(void) {
    int codes[MAXR];
    spawn_world(2, "die", codes);
    CHECK_MSG(codes[0] == 0, "rank 0 exit code %d (see its message above)", codes[0]);
}

int main(int argc, char **argv) {
    setenv("TPU_HBM_BYTES", "512M", 1);
    if (argc == 6 && strcmp(argv[1], "--shm-rank") == 0)
        return shm_child(argv[2], atoi(argv[3]), atoi(argv[4]), argv[5]);
    CHECK_OK(tpu_init());
    RUN_TEST(test_argument_errors);
    RUN_TEST(test_every_collective_2_and_4_ranks);
    RUN_TEST(test_pieces_larger_than_a_slot);
    RUN_TEST(test_all_to_all_uneven);
    RUN_TEST(test_issue_order_across_streams);
    RUN_TEST(test_send_recv);
    RUN_TEST(test_mismatched_collectives_fail_on_every_rank);
    RUN_TEST(test_timeout_names_the_collective_and_rank);
    RUN_TEST(test_peer_left);
    RUN_TEST(test_shm_transport_between_processes);
    RUN_TEST(test_shm_open_joins_at_first_collective);
    RUN_TEST(test_shm_dead_rank_fails_fast);
    return TEST_SUMMARY();
}
