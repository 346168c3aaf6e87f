/* algo.c - the collectives, written once over the shared segment.
 *
 * DESIGN
 * Every rank owns a staging slot of TPU_COMM_SLOT_BYTES; an operand larger
 * than that goes through in pieces. A collective is a sequence of phases
 * separated by steps (group.c): in the first phase each rank also writes
 * its descriptor (kind, dtype, count, op, root, counts), and after the first
 * step every rank compares all descriptors, so ranks that called different
 * collectives fail together with the difference named, before any data
 * moves. Descriptors alternate between two banks by the call's parity: a
 * rank one call ahead never overwrites one still being compared. Each
 * collective ends with a step after its last read of other ranks' slots, so
 * the next one may fill them.
 *
 * Algorithms by size: an all_reduce (or reduce) of a piece up to
 * DIRECT_BYTES has every rank reduce the whole piece from all slots (two
 * steps); larger pieces are reduce-scattered - rank r reduces range r of
 * the piece into its own slot - then all-gathered from the slots (three
 * steps, each byte reduced once). Reductions accumulate across ranks in a
 * fixed rank order (fp32 for fp16/bf16, int64 for integers, wrapping as the
 * dtype does) and round once, so every rank gets the same bits. */
#include "coll/coll-impl.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define DIRECT_BYTES (256u << 10)
#define BLOCK        512 /* elements reduced per pass through the ranks' slots */

/* --- reductions: dst[i] = op over s < ns of src[s][i], for i < n --- */

static inline float fmin_nan(float a, float b) { return (a < b || a != a) ? a : b; }
static inline float fmax_nan(float a, float b) { return (a > b || a != a) ? a : b; }
static inline double dmin_nan(double a, double b) { return (a < b || a != a) ? a : b; }
static inline double dmax_nan(double a, double b) { return (a > b || a != a) ? a : b; }

static void load_f32(float *acc, const char *p, int64_t n, tpu_dtype dt) {
    if (dt == TPU_F32) {
        memcpy(acc, p, (size_t)n * 4);
    } else {
        const uint16_t *h = (const uint16_t *)p;
        if (dt == TPU_BF16)
            for (int64_t i = 0; i < n; i++) acc[i] = tpu_bf16_to_f32(h[i]);
        else
            for (int64_t i = 0; i < n; i++) acc[i] = tpu_f16_to_f32(h[i]);
    }
}

static void reduce_f32(char *dst, const char *const *src, int ns, int64_t n, tpu_dtype dt, tpu_reduce_op op,
                       int nranks) {
    size_t es = tpu_dtype_size(dt);
    float acc[BLOCK], b[BLOCK];
    for (int64_t o = 0; o < n; o += BLOCK) {
        int64_t m = n - o < BLOCK ? n - o : BLOCK;
        load_f32(acc, src[0] + (size_t)o * es, m, dt);
        for (int s = 1; s < ns; s++) {
            load_f32(b, src[s] + (size_t)o * es, m, dt);
            switch (op) {
            case TPU_REDUCE_SUM:
            case TPU_REDUCE_AVG:
                for (int64_t i = 0; i < m; i++) acc[i] += b[i];
                break;
            case TPU_REDUCE_PRODUCT:
                for (int64_t i = 0; i < m; i++) acc[i] *= b[i];
                break;
            case TPU_REDUCE_MIN:
                for (int64_t i = 0; i < m; i++) acc[i] = fmin_nan(acc[i], b[i]);
                break;
            default:
                for (int64_t i = 0; i < m; i++) acc[i] = fmax_nan(acc[i], b[i]);
                break;
            }
        }
        if (op == TPU_REDUCE_AVG)
            for (int64_t i = 0; i < m; i++) acc[i] /= (float)nranks;
        char *d = dst + (size_t)o * es;
        if (dt == TPU_F32) {
            memcpy(d, acc, (size_t)m * 4);
        } else {
            uint16_t *h = (uint16_t *)d;
            if (dt == TPU_BF16)
                for (int64_t i = 0; i < m; i++) h[i] = tpu_f32_to_bf16(acc[i]);
            else
                for (int64_t i = 0; i < m; i++) h[i] = tpu_f32_to_f16(acc[i]);
        }
    }
}

static void reduce_f64(char *dst, const char *const *src, int ns, int64_t n, tpu_reduce_op op, int nranks) {
    double *d = (double *)dst;
    for (int64_t o = 0; o < n; o += BLOCK) {
        int64_t m = n - o < BLOCK ? n - o : BLOCK;
        double acc[BLOCK];
        memcpy(acc, src[0] + (size_t)o * 8, (size_t)m * 8);
        for (int s = 1; s < ns; s++) {
            const double *b = (const double *)src[s] + o;
            switch (op) {
            case TPU_REDUCE_SUM:
            case TPU_REDUCE_AVG:
                for (int64_t i = 0; i < m; i++) acc[i] += b[i];
                break;
            case TPU_REDUCE_PRODUCT:
                for (int64_t i = 0; i < m; i++) acc[i] *= b[i];
                break;
            case TPU_REDUCE_MIN:
                for (int64_t i = 0; i < m; i++) acc[i] = dmin_nan(acc[i], b[i]);
                break;
            default:
                for (int64_t i = 0; i < m; i++) acc[i] = dmax_nan(acc[i], b[i]);
                break;
            }
        }
        if (op == TPU_REDUCE_AVG)
            for (int64_t i = 0; i < m; i++) acc[i] /= (double)nranks;
        memcpy(d + o, acc, (size_t)m * 8);
    }
}

static int64_t load_int(const char *p, tpu_dtype dt) {
    switch (dt) {
    case TPU_U8:
    case TPU_BOOL: return *(const uint8_t *)p;
    case TPU_I8: return *(const int8_t *)p;
    case TPU_I16: return *(const int16_t *)p;
    case TPU_I32: return *(const int32_t *)p;
    default: return *(const int64_t *)p;
    }
}

static void store_int(char *p, tpu_dtype dt, int64_t v) {
    switch (dt) {
    case TPU_BOOL: *(uint8_t *)p = v != 0; break;
    case TPU_U8: *(uint8_t *)p = (uint8_t)v; break;
    case TPU_I8: *(int8_t *)p = (int8_t)v; break;
    case TPU_I16: *(int16_t *)p = (int16_t)v; break;
    case TPU_I32: *(int32_t *)p = (int32_t)v; break;
    default: *(int64_t *)p = v; break;
    }
}

/* Integers wrap as their dtype does (the int64 sum or product, truncated,
 * is the dtype's wrapped one); bool: sum and max are or, product and min and. */
static void reduce_int(char *dst, const char *const *src, int ns, int64_t n, tpu_dtype dt, tpu_reduce_op op,
                       int nranks) {
    size_t es = tpu_dtype_size(dt);
    bool bl = dt == TPU_BOOL;
    for (int64_t i = 0; i < n; i++) {
        uint64_t acc = (uint64_t)load_int(src[0] + (size_t)i * es, dt);
        for (int s = 1; s < ns; s++) {
            int64_t v = load_int(src[s] + (size_t)i * es, dt);
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
        if (op == TPU_REDUCE_AVG && !bl) r /= nranks;
        store_int(dst + (size_t)i * es, dt, r);
    }
}

static void reduce_into(char *dst, const char *const *src, int ns, int64_t n, tpu_dtype dt, tpu_reduce_op op,
                        int nranks) {
    if (n <= 0) return;
    switch (dt) {
    case TPU_F32:
    case TPU_BF16:
    case TPU_F16: reduce_f32(dst, src, ns, n, dt, op, nranks); break;
    case TPU_F64: reduce_f64(dst, src, ns, n, op, nranks); break;
    default: reduce_int(dst, src, ns, n, dt, op, nranks); break;
    }
}

/* --- descriptors --- */

static void write_desc(tpu_comm_t c, const tpu_coll_job *j) {
    coll_desc *d = &c->ctrl->desc[(c->calls + 1) & 1][c->rank];
    d->call = c->calls + 1;
    d->kind = j->kind;
    d->op = j->op;
    d->dtype = j->dtype;
    d->root = j->root;
    d->count = j->count;
    if (j->kind == COLL_ALL_TO_ALL)
        for (int q = 0; q < c->nranks; q++) {
            d->send[q] = j->send_counts[q];
            d->recv[q] = j->recv_counts[q];
        }
}

/* After the first step: every rank's descriptor against this rank's. */
static tpu_status check_descs(tpu_comm_t c, char *msg, size_t n) {
    coll_desc *all = c->ctrl->desc[(c->calls + 1) & 1];
    const coll_desc *me = &all[c->rank];
    bool reduces = me->kind == COLL_ALL_REDUCE || me->kind == COLL_REDUCE || me->kind == COLL_REDUCE_SCATTER;
    bool rooted = me->kind == COLL_BROADCAST || me->kind == COLL_REDUCE || me->kind == COLL_GATHER ||
                  me->kind == COLL_SCATTER || me->kind == COLL_SEND_RECV;
    for (int q = 0; q < c->nranks; q++) {
        const coll_desc *o = &all[q];
        bool same = o->call == me->call && o->kind == me->kind;
        if (same && me->kind != COLL_BARRIER) same = o->dtype == me->dtype;
        if (same && me->kind != COLL_BARRIER && me->kind != COLL_ALL_TO_ALL) same = o->count == me->count;
        if (same && reduces) same = o->op == me->op;
        if (same && rooted) same = o->root == me->root;
        if (same && me->kind == COLL_ALL_TO_ALL && o->send[c->rank] != me->recv[q]) {
            snprintf(msg, n,
                     "ranks called mismatched collectives: in all_to_all (call #%llu) rank %d sends %lld elements "
                     "to rank %d, which expects %lld from it",
                     (unsigned long long)me->call, q, (long long)o->send[c->rank], c->rank, (long long)me->recv[q]);
            return TPU_ERROR_KERNEL;
        }
        if (!same) {
            char a[192], b[192];
            coll_describe(me, a, sizeof a);
            coll_describe(o, b, sizeof b);
            snprintf(msg, n, "ranks called mismatched collectives: rank %d called %s, rank %d called %s", c->rank, a, q,
                     b);
            return TPU_ERROR_KERNEL;
        }
    }
    return TPU_OK;
}

/* --- the algorithms --- */

#define STEP()                                 \
    do {                                       \
        tpu_status st_ = coll_step(c, msg, n); \
        if (st_) return st_;                   \
        if (first) {                           \
            first = false;                     \
            st_ = check_descs(c, msg, n);      \
            if (st_) return st_;               \
        }                                      \
    } while (0)

static int64_t lo_of(int64_t len, int q, int P) { return len * q / P; }

static tpu_status run_all_reduce(tpu_comm_t c, const tpu_coll_job *j, bool to_all, char *msg, size_t n) {
    int P = c->nranks, r = c->rank;
    size_t es = tpu_dtype_size(j->dtype);
    int64_t m = (int64_t)(c->ctrl->slot_bytes / es);
    bool first = true;
    const char *src[TPU_COMM_MAX_RANKS];
    for (int q = 0; q < P; q++) src[q] = coll_slot(c, q);
    int64_t off = 0;
    do {
        int64_t len = j->count - off < m ? j->count - off : m;
        memcpy(coll_slot(c, r), j->in + (size_t)off * es, (size_t)len * es);
        STEP();
        bool mine = to_all || r == j->root;
        if ((size_t)len * es <= DIRECT_BYTES) {
            if (mine) reduce_into(j->out + (size_t)off * es, src, P, len, j->dtype, j->op, P);
        } else {
            int64_t lo = lo_of(len, r, P), hi = lo_of(len, r + 1, P);
            const char *part[TPU_COMM_MAX_RANKS];
            for (int q = 0; q < P; q++) part[q] = src[q] + (size_t)lo * es;
            reduce_into(coll_slot(c, r) + (size_t)lo * es, part, P, hi - lo, j->dtype, j->op, P);
            STEP();
            if (mine)
                for (int q = 0; q < P; q++) {
                    int64_t a = lo_of(len, q, P), b = lo_of(len, q + 1, P);
                    memcpy(j->out + (size_t)(off + a) * es, coll_slot(c, q) + (size_t)a * es, (size_t)(b - a) * es);
                }
        }
        STEP();
        off += len;
    } while (off < j->count);
    return TPU_OK;
}

static tpu_status run_broadcast(tpu_comm_t c, const tpu_coll_job *j, char *msg, size_t n) {
    size_t es = tpu_dtype_size(j->dtype);
    int64_t m = (int64_t)(c->ctrl->slot_bytes / es);
    bool first = true, root = c->rank == j->root;
    int64_t off = 0;
    do {
        int64_t len = j->count - off < m ? j->count - off : m;
        if (root) memcpy(coll_slot(c, j->root), j->out + (size_t)off * es, (size_t)len * es);
        STEP();
        if (!root) memcpy(j->out + (size_t)off * es, coll_slot(c, j->root), (size_t)len * es);
        STEP();
        off += len;
    } while (off < j->count);
    return TPU_OK;
}

/* all_gather (to_all) and gather: out[q * count + i] = rank q's in[i]. */
static tpu_status run_gather(tpu_comm_t c, const tpu_coll_job *j, bool to_all, char *msg, size_t n) {
    int P = c->nranks;
    size_t es = tpu_dtype_size(j->dtype);
    int64_t m = (int64_t)(c->ctrl->slot_bytes / es);
    bool first = true, mine = to_all || c->rank == j->root;
    int64_t off = 0;
    do {
        int64_t len = j->count - off < m ? j->count - off : m;
        memcpy(coll_slot(c, c->rank), j->in + (size_t)off * es, (size_t)len * es);
        STEP();
        if (mine)
            for (int q = 0; q < P; q++)
                memcpy(j->out + (size_t)(q * j->count + off) * es, coll_slot(c, q), (size_t)len * es);
        STEP();
        off += len;
    } while (off < j->count);
    return TPU_OK;
}

/* reduce_scatter: in holds P chunks of w = count / P; out = op over ranks of chunk `rank`. */
static tpu_status run_reduce_scatter(tpu_comm_t c, const tpu_coll_job *j, char *msg, size_t n) {
    int P = c->nranks, r = c->rank;
    size_t es = tpu_dtype_size(j->dtype);
    int64_t w = j->count / P, m = (int64_t)(c->ctrl->slot_bytes / es) / P;
    bool first = true;
    int64_t off = 0;
    do {
        int64_t len = w - off < m ? w - off : m;
        for (int d = 0; d < P; d++)
            memcpy(coll_slot(c, r) + (size_t)(d * len) * es, j->in + (size_t)(d * w + off) * es, (size_t)len * es);
        STEP();
        const char *part[TPU_COMM_MAX_RANKS];
        for (int q = 0; q < P; q++) part[q] = coll_slot(c, q) + (size_t)(r * len) * es;
        reduce_into(j->out + (size_t)off * es, part, P, len, j->dtype, j->op, P);
        STEP();
        off += len;
    } while (off < w);
    return TPU_OK;
}

/* scatter: root's in holds P chunks of count; out = chunk `rank`. */
static tpu_status run_scatter(tpu_comm_t c, const tpu_coll_job *j, char *msg, size_t n) {
    int P = c->nranks, r = c->rank;
    size_t es = tpu_dtype_size(j->dtype);
    int64_t w = j->count, m = (int64_t)(c->ctrl->slot_bytes / es) / P;
    bool first = true;
    int64_t off = 0;
    do {
        int64_t len = w - off < m ? w - off : m;
        if (r == j->root)
            for (int d = 0; d < P; d++)
                memcpy(coll_slot(c, r) + (size_t)(d * len) * es, j->in + (size_t)(d * w + off) * es, (size_t)len * es);
        STEP();
        memcpy(j->out + (size_t)off * es, coll_slot(c, j->root) + (size_t)(r * len) * es, (size_t)len * es);
        STEP();
        off += len;
    } while (off < w);
    return TPU_OK;
}

/* all_to_all with uneven counts: round k moves the k-th piece of every
 * pair's chunk (at most slot / P elements each). The rounds are counted from
 * every rank's counts, read after the first step, so all ranks agree. */
static tpu_status run_all_to_all(tpu_comm_t c, const tpu_coll_job *j, char *msg, size_t n) {
    int P = c->nranks, r = c->rank;
    size_t es = tpu_dtype_size(j->dtype);
    int64_t m = (int64_t)(c->ctrl->slot_bytes / es) / P;
    int64_t sdisp[TPU_COMM_MAX_RANKS], rdisp[TPU_COMM_MAX_RANKS];
    int64_t s = 0, t = 0;
    for (int q = 0; q < P; q++) {
        sdisp[q] = s;
        rdisp[q] = t;
        s += j->send_counts[q];
        t += j->recv_counts[q];
    }
    bool first = true;
    int64_t rounds = 1;
    for (int64_t k = 0; k < rounds; k++) {
        for (int d = 0; d < P; d++) {
            int64_t a = k * m, len = j->send_counts[d] - a;
            if (len > m) len = m;
            if (len > 0)
                memcpy(coll_slot(c, r) + (size_t)(d * m) * es, j->in + (size_t)(sdisp[d] + a) * es, (size_t)len * es);
        }
        STEP();
        if (k == 0) { /* descriptors agree: count the rounds from every rank's sends */
            const coll_desc *all = c->ctrl->desc[(c->calls + 1) & 1];
            for (int q = 0; q < P; q++)
                for (int d = 0; d < P; d++) {
                    int64_t need = (all[q].send[d] + m - 1) / m;
                    if (need > rounds) rounds = need;
                }
        }
        for (int q = 0; q < P; q++) {
            int64_t a = k * m, len = j->recv_counts[q] - a;
            if (len > m) len = m;
            if (len > 0)
                memcpy(j->out + (size_t)(rdisp[q] + a) * es, coll_slot(c, q) + (size_t)(r * m) * es, (size_t)len * es);
        }
        STEP();
    }
    return TPU_OK;
}

void tpu_coll_issue(tpu_comm_t c, tpu_coll_job *j) {
    pthread_mutex_lock(&c->imu);
    j->ticket = ++c->issued;
}

void tpu_coll_issued(tpu_comm_t c, bool ok) {
    if (!ok) coll_break(c, "a collective could not be queued (its successors could never run in order)");
    pthread_mutex_unlock(&c->imu);
}

static bool broken(tpu_comm_t c) {
    pthread_mutex_lock(&c->emu);
    bool b = c->err != TPU_OK;
    pthread_mutex_unlock(&c->emu);
    return b;
}

static int64_t mono_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Wait (holding mu) for the collectives issued before j to have run. */
static tpu_status wait_turn(tpu_comm_t c, const tpu_coll_job *j, char *msg, size_t n) {
    int64_t start = mono_ms();
    while (c->calls + 1 != j->ticket && !broken(c)) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 50000000;
        if (dl.tv_nsec >= 1000000000) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&c->turn, &c->mu, &dl);
        if (c->calls + 1 != j->ticket && mono_ms() - start >= c->timeout_ms) {
            snprintf(msg, n,
                     "rank %d timed out after %lld ms: %s (call #%llu) waited for call #%llu, issued before it and "
                     "queued on another stream that has not reached it",
                     c->rank, (long long)(mono_ms() - start), tpu_coll_kind_name(j->kind),
                     (unsigned long long)j->ticket, (unsigned long long)(c->calls + 1));
            coll_break(c, msg);
            return TPU_ERROR_KERNEL;
        }
    }
    return TPU_OK;
}

tpu_status tpu_coll_run(tpu_comm_t c, const tpu_coll_job *j, char *msg, size_t n) {
    pthread_mutex_lock(&c->mu);
    tpu_status st = wait_turn(c, j, msg, n);
    if (!st) {
        pthread_mutex_lock(&c->emu);
        st = c->err;
        if (st) snprintf(msg, n, "the communicator is unusable after an earlier error: %s", c->errmsg);
        pthread_mutex_unlock(&c->emu);
    }
    if (!st) {
        c->cur = j;
        if (!c->joined) st = coll_join(c, msg, n);
    }
    if (!st) {
        write_desc(c, j);
        switch (j->kind) {
        case COLL_ALL_REDUCE: st = run_all_reduce(c, j, true, msg, n); break;
        case COLL_REDUCE: st = run_all_reduce(c, j, false, msg, n); break;
        case COLL_BROADCAST:
        case COLL_SEND_RECV: st = run_broadcast(c, j, msg, n); break;
        case COLL_ALL_GATHER: st = run_gather(c, j, true, msg, n); break;
        case COLL_GATHER: st = run_gather(c, j, false, msg, n); break;
        case COLL_REDUCE_SCATTER: st = run_reduce_scatter(c, j, msg, n); break;
        case COLL_SCATTER: st = run_scatter(c, j, msg, n); break;
        case COLL_ALL_TO_ALL: st = run_all_to_all(c, j, msg, n); break;
        default: {
            st = coll_step(c, msg, n);
            if (!st) st = check_descs(c, msg, n);
            break;
        }
        }
    }
    if (c->cur) {
        if (st) coll_break(c, msg);
        c->cur = NULL;
        c->calls++;
        atomic_store(&c->ncalls_pub, c->calls);
        pthread_cond_broadcast(&c->turn);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}
