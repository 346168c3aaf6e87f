/* collective.c - the stream-ordered entries of coll.h: check the operands,
 * queue the collective on a stream, run it there (the algorithms are the
 * coll floor's).
 *
 * A call checks everything a rank can check alone - the communicator is
 * usable, operands are live contiguous device views (the shared view check)
 * of one dtype on one chip, sizes agree with the kind of collective, the
 * reduce op suits the dtype - and fails at once with PyTorch's wording. It
 * then binds outputs allocated in Fused Eager (a collective writes them),
 * translates the views and queues a TPU_CMD_COLL on the stream, which
 * flushes the stream's open window first (cause "collective"). Debug Eager
 * waits for it. What only the ranks together can find (a mismatch, a
 * timeout, a dead peer) fails on the worker: the queue's sticky error. */
#include "vtpu/vtpu-impl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct operand {
    const tpu_tensor *t; /* NULL: not passed */
    const char *name;
    bool written;
} operand;

static bool contiguous(const tpu_tensor *t) {
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->sizes[d] != 1 && t->strides[d] != expect) return false;
        expect *= t->sizes[d];
    }
    return true;
}

static int64_t numel_of(const tpu_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
    return n;
}

/* Check and translate: host[k] = first element of operand k (host address). */
static tpu_status check_operands(const char *what, operand *ops, int n, char **host, int64_t *numel, int *dev,
                                 tpu_dtype *dt) {
    *dev = -1;
    int dtype = -1;
    for (int k = 0; k < n; k++) {
        host[k] = NULL;
        numel[k] = 0;
        if (!ops[k].t) continue;
        tpu_tensor t = *ops[k].t;
        if (t.is_scalar)
            return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: the %s must be a tensor, not a scalar", what,
                                 ops[k].name);
        if (!contiguous(&t))
            return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: Tensors must be contiguous (the %s is not)", what,
                                 ops[k].name);
        if (dtype >= 0 && t.dtype != dtype)
            return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: the %s has dtype %s, expected %s like the others", what,
                                 ops[k].name, tpu_dtype_name((tpu_dtype)t.dtype), tpu_dtype_name((tpu_dtype)dtype));
        tpu_status s = tpu_view_check(what, k, &t, true, dev);
        if (s) return s;
        if (tpu_dtype_is_complex((tpu_dtype)t.dtype)) /* (the glue hands collectives real views) */
            return tpu_set_error(TPU_ERROR_NOT_SUPPORTED, "%s: dtype %s is not supported by collectives", what,
                                 tpu_dtype_name((tpu_dtype)t.dtype));
        dtype = t.dtype;
        numel[k] = numel_of(&t);
        if (numel[k] && ops[k].written && tpu_alloc_any_deferred()) tpu_alloc_materialize(ops[k].t->base);
        host[k] = t.base ? (char *)t.base + (size_t)t.offset * tpu_dtype_size((tpu_dtype)t.dtype) : NULL;
    }
    *dt = dtype >= 0 ? (tpu_dtype)dtype : TPU_F32;
    return TPU_OK;
}

static tpu_status check_op(const char *what, tpu_reduce_op op, tpu_dtype dt) {
    if ((unsigned)op >= TPU_REDUCE_OP_COUNT)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: unknown reduce op %d", what, (int)op);
    bool fl = tpu_dtype_is_float(dt);
    if (fl && (op == TPU_REDUCE_BAND || op == TPU_REDUCE_BOR || op == TPU_REDUCE_BXOR))
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: Cannot use ReduceOp.%s with non-integral dtype %s", what,
                             op == TPU_REDUCE_BAND  ? "BAND"
                             : op == TPU_REDUCE_BOR ? "BOR"
                                                    : "BXOR",
                             tpu_dtype_name(dt));
    if (dt == TPU_BOOL && op == TPU_REDUCE_AVG)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: Cannot use ReduceOp.AVG with dtype bool", what);
    return TPU_OK;
}

static tpu_status check_root(const char *what, tpu_comm_t c, int root) {
    if (root < 0 || root >= c->nranks)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: Invalid rootRank %d (the communicator has %d ranks)", what,
                             root, c->nranks);
    return TPU_OK;
}

static tpu_status usable(const char *what, tpu_comm_t c) {
    if (!c) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: NULL communicator", what);
    pthread_mutex_lock(&c->emu);
    tpu_status st = c->err;
    if (st) tpu_set_error(st, "%s: the communicator is unusable after an earlier error: %s", what, c->errmsg);
    pthread_mutex_unlock(&c->emu);
    return st;
}

/* Queue job j (owned) on `stream` (NULL: current stream of dev); Debug
 * Eager waits for it unless `nowait`. */
static tpu_status submit_job(tpu_comm_t c, tpu_coll_job *j, int dev, tpu_stream_t stream, bool nowait) {
    tpu_status s = tpu_check_fork();
    if (!s && !stream) stream = tpu_stream_current(dev >= 0 ? dev : tpu_device_current());
    if (!s && !stream) s = tpu_set_error(TPU_ERROR_INVALID_DEVICE, "no stream for device %d", dev);
    if (!s && dev >= 0 && tpu_stream_device(stream) != dev)
        s = tpu_set_error(TPU_ERROR_DEVICE_MISMATCH,
                          "Expected all tensors to be on the same device, but found at least two devices, tpu:%d and "
                          "tpu:%d!",
                          dev, tpu_stream_device(stream));
    tpu_cmd *cmd = s ? NULL : tpu_cmd_new(TPU_CMD_COLL);
    if (!s && !cmd) s = tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory");
    if (s) {
        free(j->send_counts);
        free(j);
        return s;
    }
    cmd->u.coll.comm = c;
    cmd->u.coll.job = j;
    tpu_comm_inflight_add(c, 1);
    tpu_coll_issue(c, j);
    s = tpu_stream_enqueue(stream, cmd, NULL); /* frees cmd on failure */
    tpu_coll_issued(c, s == TPU_OK);
    if (s) {
        tpu_comm_inflight_add(c, -1);
        free(j->send_counts);
        free(j);
        return s;
    }
    return !nowait && tpu_get_eager_mode() == TPU_EAGER_DEBUG ? tpu_stream_synchronize(stream) : TPU_OK;
}

static tpu_status submit(tpu_comm_t c, tpu_coll_job *j, int dev, tpu_stream_t stream) {
    return submit_job(c, j, dev, stream, false);
}

tpu_status tpu_coll_cmd_run(tpu_cmd *cmd, char *full, size_t n) {
    tpu_comm_t c = cmd->u.coll.comm;
    tpu_coll_job *j = cmd->u.coll.job;
    char msg[512];
    tpu_status st = tpu_coll_run(c, j, msg, sizeof msg);
    if (st) snprintf(full, n, "tpu collective '%s' failed: %s", tpu_coll_kind_name(j->kind), msg);
    free(j->send_counts);
    free(j);
    tpu_comm_inflight_add(c, -1);
    return st;
}

static tpu_coll_job *job_new(coll_kind kind, tpu_reduce_op op, tpu_dtype dt, int root, int64_t count) {
    tpu_coll_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->kind = kind;
    j->op = op;
    j->dtype = dt;
    j->root = root;
    j->count = count;
    return j;
}

#define NEW_JOB(...)                        \
    tpu_coll_job *j = job_new(__VA_ARGS__); \
    if (!j) return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory for a collective")

tpu_status tpu_all_reduce(tpu_comm_t c, const tpu_tensor *in, const tpu_tensor *out, tpu_reduce_op op,
                          tpu_stream_t stream) {
    const char *what = "all_reduce";
    tpu_status s = usable(what, c);
    if (s) return s;
    if (!in || !out) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: input and output are required", what);
    operand ops[2] = {{in, "input", false}, {out, "output", true}};
    char *h[2];
    int64_t ne[2];
    int dev;
    tpu_dtype dt;
    if ((s = check_operands(what, ops, 2, h, ne, &dev, &dt)) || (s = check_op(what, op, dt))) return s;
    if (ne[0] != ne[1])
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: input has %lld elements, output %lld", what,
                             (long long)ne[0], (long long)ne[1]);
    NEW_JOB(COLL_ALL_REDUCE, op, dt, 0, ne[0]);
    j->in = h[0];
    j->out = h[1];
    return submit(c, j, dev, stream);
}

tpu_status tpu_broadcast(tpu_comm_t c, const tpu_tensor *buf, int root, tpu_stream_t stream) {
    const char *what = "broadcast";
    tpu_status s = usable(what, c);
    if (s || (s = check_root(what, c, root))) return s;
    if (!buf) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: a tensor is required", what);
    operand ops[1] = {{buf, "tensor", c->rank != root}};
    char *h[1];
    int64_t ne[1];
    int dev;
    tpu_dtype dt;
    if ((s = check_operands(what, ops, 1, h, ne, &dev, &dt))) return s;
    NEW_JOB(COLL_BROADCAST, TPU_REDUCE_SUM, dt, root, ne[0]);
    j->out = h[0];
    return submit(c, j, dev, stream);
}

static tpu_status p2p(const char *what, tpu_comm_t c, const tpu_tensor *t, bool send, tpu_stream_t stream) {
    tpu_status s = usable(what, c);
    if (s) return s;
    if (c->nranks != 2)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: needs a communicator of 2 ranks (point-to-point), not %d",
                             what, c->nranks);
    if (!t) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: a tensor is required", what);
    operand ops[1] = {{t, "tensor", !send}};
    char *h[1];
    int64_t ne[1];
    int dev;
    tpu_dtype dt;
    if ((s = check_operands(what, ops, 1, h, ne, &dev, &dt))) return s;
    NEW_JOB(COLL_SEND_RECV, TPU_REDUCE_SUM, dt, send ? c->rank : 1 - c->rank, ne[0]);
    j->out = h[0];
    /* not even Debug Eager waits here: a send waits for its recv, and two
     * ranks exchanging (both send, then both recv) would wait forever; the
     * caller waits where it can (tpu_dist: at Work.wait()) */
    return submit_job(c, j, dev, stream, true);
}

tpu_status tpu_send(tpu_comm_t c, const tpu_tensor *in, tpu_stream_t stream) {
    return p2p("send", c, in, true, stream);
}

tpu_status tpu_recv(tpu_comm_t c, const tpu_tensor *out, tpu_stream_t stream) {
    return p2p("recv", c, out, false, stream);
}

tpu_status tpu_reduce(tpu_comm_t c, const tpu_tensor *in, const tpu_tensor *out, tpu_reduce_op op, int root,
                      tpu_stream_t stream) {
    const char *what = "reduce";
    tpu_status s = usable(what, c);
    if (s || (s = check_root(what, c, root))) return s;
    bool is_root = c->rank == root;
    if (!in || (is_root && !out))
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: input%s required", what,
                             is_root ? " and output are" : " is");
    operand ops[2] = {{in, "input", false}, {is_root ? out : NULL, "output", true}};
    char *h[2];
    int64_t ne[2];
    int dev;
    tpu_dtype dt;
    if ((s = check_operands(what, ops, 2, h, ne, &dev, &dt)) || (s = check_op(what, op, dt))) return s;
    if (is_root && ne[0] != ne[1])
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: input has %lld elements, output %lld", what,
                             (long long)ne[0], (long long)ne[1]);
    NEW_JOB(COLL_REDUCE, op, dt, root, ne[0]);
    j->in = h[0];
    j->out = h[1];
    return submit(c, j, dev, stream);
}

/* all_gather and gather: out holds nranks x numel(in). */
static tpu_status gather_common(const char *what, coll_kind kind, tpu_comm_t c, const tpu_tensor *in,
                                const tpu_tensor *out, int root, tpu_stream_t stream) {
    tpu_status s = usable(what, c);
    if (s || (s = check_root(what, c, root))) return s;
    bool has_out = kind == COLL_ALL_GATHER || c->rank == root;
    if (!in || (has_out && !out))
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: input%s required", what,
                             has_out ? " and output are" : " is");
    operand ops[2] = {{in, "input", false}, {has_out ? out : NULL, "output", true}};
    char *h[2];
    int64_t ne[2];
    int dev;
    tpu_dtype dt;
    if ((s = check_operands(what, ops, 2, h, ne, &dev, &dt))) return s;
    if (has_out && ne[1] != ne[0] * c->nranks)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE,
                             "%s: output tensor size must be equal to world_size times input tensor size (output has "
                             "%lld elements, input %lld, world size %d)",
                             what, (long long)ne[1], (long long)ne[0], c->nranks);
    NEW_JOB(kind, TPU_REDUCE_SUM, dt, root, ne[0]);
    j->in = h[0];
    j->out = h[1];
    return submit(c, j, dev, stream);
}

tpu_status tpu_all_gather(tpu_comm_t c, const tpu_tensor *in, const tpu_tensor *out, tpu_stream_t stream) {
    return gather_common("all_gather", COLL_ALL_GATHER, c, in, out, 0, stream);
}

tpu_status tpu_gather(tpu_comm_t c, const tpu_tensor *in, const tpu_tensor *out, int root, tpu_stream_t stream) {
    return gather_common("gather", COLL_GATHER, c, in, out, root, stream);
}

tpu_status tpu_reduce_scatter(tpu_comm_t c, const tpu_tensor *in, const tpu_tensor *out, tpu_reduce_op op,
                              tpu_stream_t stream) {
    const char *what = "reduce_scatter";
    tpu_status s = usable(what, c);
    if (s) return s;
    if (!in || !out) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: input and output are required", what);
    operand ops[2] = {{in, "input", false}, {out, "output", true}};
    char *h[2];
    int64_t ne[2];
    int dev;
    tpu_dtype dt;
    if ((s = check_operands(what, ops, 2, h, ne, &dev, &dt)) || (s = check_op(what, op, dt))) return s;
    if (ne[0] != ne[1] * c->nranks)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE,
                             "%s: input tensor must be the same size as output size times world size (input has "
                             "%lld elements, output %lld, world size %d)",
                             what, (long long)ne[0], (long long)ne[1], c->nranks);
    NEW_JOB(COLL_REDUCE_SCATTER, op, dt, 0, ne[0]);
    j->in = h[0];
    j->out = h[1];
    return submit(c, j, dev, stream);
}

tpu_status tpu_scatter(tpu_comm_t c, const tpu_tensor *in, const tpu_tensor *out, int root, tpu_stream_t stream) {
    const char *what = "scatter";
    tpu_status s = usable(what, c);
    if (s || (s = check_root(what, c, root))) return s;
    bool is_root = c->rank == root;
    if (!out || (is_root && !in))
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: output%s required", what,
                             is_root ? " and input are" : " is");
    operand ops[2] = {{is_root ? in : NULL, "input", false}, {out, "output", true}};
    char *h[2];
    int64_t ne[2];
    int dev;
    tpu_dtype dt;
    if ((s = check_operands(what, ops, 2, h, ne, &dev, &dt))) return s;
    if (is_root && ne[0] != ne[1] * c->nranks)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE,
                             "%s: input tensor must be world size times the output size (input has %lld elements, "
                             "output %lld, world size %d)",
                             what, (long long)ne[0], (long long)ne[1], c->nranks);
    NEW_JOB(COLL_SCATTER, TPU_REDUCE_SUM, dt, root, ne[1]);
    j->in = h[0];
    j->out = h[1];
    return submit(c, j, dev, stream);
}

tpu_status tpu_all_to_all(tpu_comm_t c, const tpu_tensor *in, const int64_t *send_counts, const tpu_tensor *out,
                          const int64_t *recv_counts, tpu_stream_t stream) {
    const char *what = "all_to_all";
    tpu_status s = usable(what, c);
    if (s) return s;
    if (!in || !out || !send_counts || !recv_counts)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: input, output and both counts are required", what);
    operand ops[2] = {{in, "input", false}, {out, "output", true}};
    char *h[2];
    int64_t ne[2];
    int dev;
    tpu_dtype dt;
    if ((s = check_operands(what, ops, 2, h, ne, &dev, &dt))) return s;
    int64_t ts = 0, tr = 0;
    for (int q = 0; q < c->nranks; q++) {
        if (send_counts[q] < 0 || recv_counts[q] < 0)
            return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: split sizes must be non-negative", what);
        ts += send_counts[q];
        tr += recv_counts[q];
    }
    if (ts != ne[0] || tr != ne[1])
        return tpu_set_error(TPU_ERROR_INVALID_VALUE,
                             "%s: Split sizes doesn't match total dim 0 size (input %lld elements, splits sum to "
                             "%lld; output %lld, splits sum to %lld)",
                             what, (long long)ne[0], (long long)ts, (long long)ne[1], (long long)tr);
    NEW_JOB(COLL_ALL_TO_ALL, TPU_REDUCE_SUM, dt, 0, ne[0]);
    j->send_counts = malloc(2 * (size_t)c->nranks * sizeof(int64_t));
    if (!j->send_counts) {
        free(j);
        return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory for a collective");
    }
    j->recv_counts = j->send_counts + c->nranks;
    memcpy(j->send_counts, send_counts, (size_t)c->nranks * sizeof(int64_t));
    memcpy(j->recv_counts, recv_counts, (size_t)c->nranks * sizeof(int64_t));
    j->in = h[0];
    j->out = h[1];
    return submit(c, j, dev, stream);
}

tpu_status tpu_comm_barrier(tpu_comm_t c, int dev, tpu_stream_t stream) {
    tpu_status s = usable("barrier", c);
    if (s) return s;
    NEW_JOB(COLL_BARRIER, TPU_REDUCE_SUM, TPU_F32, 0, 0);
    return submit(c, j, stream ? tpu_stream_device(stream) : dev, stream);
}
