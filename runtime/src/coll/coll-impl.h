/* coll-impl.h - the collectives floor: communicators over a shared segment
 * (group.c: transports, barriers, failure detection) and the algorithms
 * over host buffers (algo.c). The vtpu floor above validates device views,
 * translates them and queues tpu_coll_run on a stream (vtpu/collective.c). */
#ifndef TPU_COLL_IMPL_H
#define TPU_COLL_IMPL_H

#include "tpu/coll.h"
#include "base/base-impl.h"
#include <pthread.h>
#include <stdatomic.h>

typedef enum coll_kind {
    COLL_ALL_REDUCE = 0,
    COLL_BROADCAST,
    COLL_REDUCE,
    COLL_ALL_GATHER,
    COLL_REDUCE_SCATTER,
    COLL_GATHER,
    COLL_SCATTER,
    COLL_ALL_TO_ALL,
    COLL_BARRIER,
    COLL_SEND_RECV, /* a broadcast on two ranks from `root`, the sender */
    COLL_KIND_COUNT
} coll_kind;

const char *tpu_coll_kind_name(int kind);

/* One collective call of one rank, with host addresses (translated by the
 * caller). count: elements of `in` for all_reduce, broadcast (of buf = out),
 * reduce, all_gather, gather, reduce_scatter (nranks x the output), and of
 * `out` for scatter. send/recv reads the sender's `out`, writes the receiver's. */
typedef struct tpu_coll_job {
    coll_kind kind;
    tpu_reduce_op op;
    tpu_dtype dtype;
    int root;
    int64_t count;
    const char *in;
    char *out;
    int64_t *send_counts, *recv_counts; /* all_to_all: nranks each (owned by the job) */
    uint64_t ticket;                    /* issue order on its communicator (tpu_coll_issue) */
} tpu_coll_job;

/* Collectives run in the order they were issued, whatever streams they were
 * queued on (the ranks must agree on one order, and a program issues them in
 * the same order on every rank): tpu_coll_issue locks the issue order and
 * gives j its ticket; the caller queues it, then calls tpu_coll_issued (with
 * ok = false if queueing failed: the communicator breaks, as a later ticket
 * could never run). */
void tpu_coll_issue(tpu_comm_t c, tpu_coll_job *j);
void tpu_coll_issued(tpu_comm_t c, bool ok);
/* Run `j` when every collective issued before it has run (blocks until the
 * ranks are through it). On failure: the error text in msg, the
 * communicator broken. */
tpu_status tpu_coll_run(tpu_comm_t c, const tpu_coll_job *j, char *msg, size_t n);
/* Jobs queued and not yet run (vtpu/collective.c keeps the count; destroy waits for 0). */
void tpu_comm_inflight_add(tpu_comm_t c, int d);

/* --- internals shared by group.c and algo.c --- */

typedef struct coll_line {
    _Atomic uint32_t v;
    _Atomic uint32_t sleepers;
    char pad[56];
} coll_line;

typedef struct coll_desc {
    uint64_t call; /* the collective's number on its communicator */
    int32_t kind, op, dtype, root;
    int64_t count;
    int64_t send[TPU_COMM_MAX_RANKS], recv[TPU_COMM_MAX_RANKS]; /* all_to_all */
} coll_desc;

typedef struct coll_ctrl {
    uint64_t magic; /* written last by the creator (release) */
    uint32_t nranks, slot_bytes;
    _Atomic uint32_t broken_claim; /* first rank to fail claims `why` */
    _Atomic uint32_t broken;       /* 1 + that rank, once `why` is written */
    char why[384];
    _Atomic int32_t pid[TPU_COMM_MAX_RANKS]; /* 0: not joined (local: 1), -1: left */
    coll_line arrive[TPU_COMM_MAX_RANKS];    /* steps each rank has reached */
    coll_desc desc[2][TPU_COMM_MAX_RANKS];   /* by parity of the call number */
} coll_ctrl;

struct tpu_comm {
    int rank, nranks;
    int64_t timeout_ms;
    bool shm;
    coll_ctrl *ctrl;
    char *slots; /* nranks x slot_bytes */
    size_t map_bytes;
    struct tpu_comm *local_first; /* local transport: rank 0's handle owns the heap segment */
    _Atomic int *local_refs;
    pthread_mutex_t mu;  /* one collective at a time per rank */
    pthread_mutex_t emu; /* err, errmsg */
    pthread_mutex_t imu; /* issue order: held from tpu_coll_issue to tpu_coll_issued */
    pthread_cond_t turn; /* with mu: `calls` moved on */
    uint64_t issued;     /* tickets handed out (imu) */
    uint32_t step;       /* steps this rank has taken */
    uint64_t calls;      /* collectives run */
    _Atomic uint64_t ncalls_pub;
    _Atomic int inflight;
    tpu_status err; /* sticky: the communicator is broken (emu) */
    char errmsg[512];
    const tpu_coll_job *cur;     /* the collective running (for messages) */
    bool joined;                 /* every rank has mapped the segment (tpu_comm_open_shm: after the first collective) */
    char name[TPU_COMM_KEY_MAX]; /* rank 0 of an unjoined shm communicator: the segment's name, to unlink */
};

static inline char *coll_slot(tpu_comm_t c, int r) { return c->slots + (size_t)r * c->ctrl->slot_bytes; }
/* Every rank reaches this step: publish ours, wait for the others (timeout,
 * dead peers, another rank's failure). */
tpu_status coll_step(tpu_comm_t c, char *msg, size_t n);
/* The join step of a communicator opened with tpu_comm_open_shm, taken by
 * its first collective (then rank 0 removes the segment's name). */
tpu_status coll_join(tpu_comm_t c, char *msg, size_t n);
/* Break the communicator (locally and for every rank) with msg. */
void coll_break(tpu_comm_t c, const char *msg);
/* Describe the running collective ("all_reduce (call #3, float32, 1024 elements, op sum)"). */
void coll_describe(const coll_desc *d, char *buf, size_t n);

#endif
