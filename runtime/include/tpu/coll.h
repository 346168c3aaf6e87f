/* coll.h - collectives between chips: communicators and stream-ordered
 * collectives (the runtime under torch.distributed's `tpu_dist` backend).
 *
 * A communicator joins `nranks` ranks. Each rank is one participant: a
 * process (the shared-memory transport, ranks on one host) or a thread of
 * this process (the local transport, e.g. one thread per chip). Ranks talk
 * through a shared segment - a control area and one staging slot per rank -
 * that only the runtime touches: a collective copies a piece of its operand
 * from device memory into its rank's slot, the ranks meet at a barrier,
 * reduce or gather from the slots, and copy the result into device memory.
 * Every algorithm is written once over that segment; the transports differ
 * only in where it lives (a POSIX shared-memory object, or the heap).
 *
 * Collectives are stream-ordered: a call validates its operands (the same
 * view checks as a launch), flushes the stream's Fused Eager window and
 * queues the collective on `stream` (NULL: the current stream of the
 * operands' chip) like a kernel; it runs on the queue's worker when the work
 * before it has run, and the work after it waits. Operands must be
 * contiguous (non-overlapping and dense: the caller passes such views with
 * contiguous strides) and of one dtype.
 *
 * Failures found while running - a peer that took longer than the
 * communicator's timeout, a peer process that exited, ranks that called
 * different collectives (kind, dtype, element count, reduce op or root),
 * another rank's failure - stick to the queue like a kernel's error (named
 * "tpu collective '<name>' failed: ...", returned by the next synchronizing
 * call), and leave the communicator broken: every rank's later collectives
 * fail at once with the first error. A broken communicator is destroyed and
 * a new one created to go on.
 *
 * Every rank must call the same collectives in the same order (MPMD code is
 * fine as long as that holds: the ranks compare what they called at every
 * collective and fail with the difference). Ranks of one process need
 * distinct queues: two ranks queued on one stream would wait for each other.
 * Thread safety: a communicator is used by one rank; its calls are queued
 * in the order they are made. */
#ifndef TPU_COLL_H
#define TPU_COLL_H

#include <stdint.h>
#include <stdbool.h>
#include "status.h"
#include "stream.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPU_COMM_MAX_RANKS  64
#define TPU_COMM_KEY_MAX    96         /* bytes of a shared-memory key, with its NUL */
#define TPU_COMM_SLOT_BYTES (4u << 20) /* staging bytes per rank: larger operands go in pieces */

typedef struct tpu_comm *tpu_comm_t;

typedef enum tpu_reduce_op {
    TPU_REDUCE_SUM = 0,
    TPU_REDUCE_AVG, /* sum / nranks (integers: truncated toward zero) */
    TPU_REDUCE_PRODUCT,
    TPU_REDUCE_MIN,
    TPU_REDUCE_MAX,
    TPU_REDUCE_BAND, /* integers and bool only */
    TPU_REDUCE_BOR,
    TPU_REDUCE_BXOR,
    TPU_REDUCE_OP_COUNT
} tpu_reduce_op;

/* Shared-memory communicator (ranks are processes on one host). Rank 0
 * creates the segment named by `key` (letters, digits, '.', '_' and '-';
 * unique per communicator: the caller agrees on it through its own channel,
 * e.g. torch.distributed's store) and must have returned before another rank
 * calls this; the others open it. The call returns once every rank has
 * joined (or fails after `timeout_ms`); the segment's name is then removed,
 * so nothing is left behind when the ranks exit, however they exit.
 * `timeout_ms` (> 0) also bounds each wait inside a collective. */
tpu_status tpu_comm_init_shm(const char *key, int rank, int nranks, int64_t timeout_ms, tpu_comm_t *out);
/* As tpu_comm_init_shm, but returns without waiting for the other ranks:
 * rank 0 does not wait at all (it creates the segment), the others wait only
 * for it to appear. The first collective waits for everyone to have joined
 * (bounded by `timeout_ms`, naming that collective and the missing rank).
 * For communicators made on demand, where a blocking join could deadlock
 * (rank a waits to join {a, b} while b waits to join {b, c}). */
tpu_status tpu_comm_open_shm(const char *key, int rank, int nranks, int64_t timeout_ms, tpu_comm_t *out);
/* Local communicator: `nranks` ranks in this process (one thread each);
 * out[r] is rank r's. They share one heap segment. */
tpu_status tpu_comm_init_local(int nranks, int64_t timeout_ms, tpu_comm_t *out);
/* Waits for the collectives queued on the communicator, then frees it. A
 * peer still inside a collective sees this rank as gone (an error, not a hang). */
tpu_status tpu_comm_destroy(tpu_comm_t c);
/* Mark the communicator broken with `why` (e.g. the caller's own timeout):
 * this rank's queued and later collectives fail, and so do the other ranks'. */
void tpu_comm_abort(tpu_comm_t c, const char *why);
int tpu_comm_rank(tpu_comm_t c);
int tpu_comm_size(tpu_comm_t c);
/* TPU_OK, or the error that broke the communicator (message in tpu_last_error()). */
tpu_status tpu_comm_error(tpu_comm_t c);
/* Collectives run on the communicator so far (each call counts once). */
uint64_t tpu_comm_count(tpu_comm_t c);

/* out = op over ranks of in (in == out allowed; same dtype and element count). */
tpu_status tpu_all_reduce(tpu_comm_t c, const tpu_tensor *in, const tpu_tensor *out, tpu_reduce_op op,
                          tpu_stream_t stream);
/* buf of `root` is copied to every rank's buf. */
tpu_status tpu_broadcast(tpu_comm_t c, const tpu_tensor *buf, int root, tpu_stream_t stream);
/* root's out = op over ranks of in; out is read only on root (NULL elsewhere). */
tpu_status tpu_reduce(tpu_comm_t c, const tpu_tensor *in, const tpu_tensor *out, tpu_reduce_op op, int root,
                      tpu_stream_t stream);
/* out (nranks x numel(in)) = every rank's in, in rank order. */
tpu_status tpu_all_gather(tpu_comm_t c, const tpu_tensor *in, const tpu_tensor *out, tpu_stream_t stream);
/* out (numel(in) / nranks) = op over ranks of in's chunk `rank`. */
tpu_status tpu_reduce_scatter(tpu_comm_t c, const tpu_tensor *in, const tpu_tensor *out, tpu_reduce_op op,
                              tpu_stream_t stream);
/* root's out (nranks x numel(in); NULL elsewhere) = every rank's in. */
tpu_status tpu_gather(tpu_comm_t c, const tpu_tensor *in, const tpu_tensor *out, int root, tpu_stream_t stream);
/* out = chunk `rank` of root's in (nranks x numel(out); NULL elsewhere). */
tpu_status tpu_scatter(tpu_comm_t c, const tpu_tensor *in, const tpu_tensor *out, int root, tpu_stream_t stream);
/* Rank r sends send_counts[d] elements of in (consecutive chunks, in rank
 * order) to rank d, and receives recv_counts[s] elements from rank s into
 * out (consecutive chunks). Counts must agree between sender and receiver. */
tpu_status tpu_all_to_all(tpu_comm_t c, const tpu_tensor *in, const int64_t *send_counts, const tpu_tensor *out,
                          const int64_t *recv_counts, tpu_stream_t stream);
/* Point-to-point, on a communicator of exactly two ranks: a tpu_send on one
 * rank pairs with a tpu_recv on the other, in issue order (no tags), and the
 * sender's `in` lands in the receiver's `out` (the same dtype and element
 * count, or both fail as mismatched collectives; two sends or two recvs
 * also fail). A send runs when its recv does, as any collective: to send in
 * both directions at once, use one communicator and one stream per
 * direction (the tpu_dist backend does). Debug Eager does not wait for a
 * send or recv at the call (an exchange would deadlock): synchronize the
 * stream to see its error. */
tpu_status tpu_send(tpu_comm_t c, const tpu_tensor *in, tpu_stream_t stream);
tpu_status tpu_recv(tpu_comm_t c, const tpu_tensor *out, tpu_stream_t stream);
/* Every rank reaches this point in `stream`'s order before any goes on. */
tpu_status tpu_comm_barrier(tpu_comm_t c, int dev, tpu_stream_t stream);

const char *tpu_reduce_op_name(tpu_reduce_op op);

#ifdef __cplusplus
}
#endif
#endif
