/* stream.h - streams (in-order work queues), events, host interrupts.
 *
 * Streams map onto a fixed pool of hardware queues per chip, as CUDA's do:
 * the default stream (id 0), TPU_STREAM_POOL_SIZE low-priority queues (ids
 * 1..32) and as many high-priority ones (ids 33..64). tpu_stream_create hands
 * out the queues of a priority round-robin, so any number of streams can be
 * created; streams sharing a queue run in order with each other. Each queue
 * runs its work in order on one worker thread (started on first use), so a
 * chip never has more than 65 stream threads. A queue holds at most
 * TPU_STREAM_QUEUE_DEPTH commands: past that, a launching thread waits for
 * room. An error raised by a kernel run asynchronously sticks to its queue and
 * is returned (once) by the next synchronizing call on that stream or device,
 * naming the op; the stream stays usable.
 * Thread safety: all functions are thread-safe; the current stream and the
 * interrupted state are per thread (the current stream per device too). */
#ifndef TPU_STREAM_H
#define TPU_STREAM_H

#include <stdint.h>
#include <stdbool.h>
#include "status.h"
#include "mem.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpu_event *tpu_event_t;

#define TPU_STREAM_POOL_SIZE   32   /* queues per chip and priority, besides the default one */
#define TPU_STREAM_QUEUE_DEPTH 1024 /* commands queued before a launch waits (as CUDA's ~1024) */

/* Next queue of the pool for `priority` (0 or more: low, the default stream's;
 * negative: high, as in PyTorch where lower numbers are higher priority). The
 * handle is borrowed and lives as long as the process; the vTPU's workers
 * are OS threads, so priority chooses the pool but does not preempt. */
tpu_status tpu_stream_create(int dev, int priority, tpu_stream_t *out);
/* Hand a stream back: waits for the work queued on it so far. The default
 * stream cannot be destroyed (TPU_ERROR_INVALID_VALUE). */
tpu_status tpu_stream_destroy(tpu_stream_t s);
/* Default stream of `dev` (borrowed; lives as long as the process). NULL if dev is invalid. */
tpu_stream_t tpu_stream_default(int dev);
/* The stream with tpu_stream_id() `id` on `dev` (borrowed); NULL if either is invalid. */
tpu_stream_t tpu_stream_from_id(int dev, int64_t id);
/* Current stream of the calling thread for `dev` (default stream unless set). */
tpu_stream_t tpu_stream_current(int dev);
tpu_status tpu_stream_set_current(tpu_stream_t s);
int tpu_stream_device(tpu_stream_t s);
/* Stable small id: 0 for the default stream of a device, 1..64 for the pool. */
int64_t tpu_stream_id(tpu_stream_t s);
/* 0 (low) or -1 (high). */
int tpu_stream_priority(tpu_stream_t s);
/* TPU_OK if all work has run, TPU_ERROR_NOT_READY otherwise. */
tpu_status tpu_stream_query(tpu_stream_t s);
/* Wait for all work queued on `s`; returns its sticky error, or
 * TPU_ERROR_INTERRUPTED (see tpu_set_interrupt_check). */
tpu_status tpu_stream_synchronize(tpu_stream_t s);
/* Queue a host callback; runs on the worker in stream order. It must not
 * wait for work queued after it on its own stream. */
typedef void (*tpu_host_fn)(void *user);
tpu_status tpu_stream_add_callback(tpu_stream_t s, tpu_host_fn fn, void *user);

/* Events mark a point in a stream. Caller frees with tpu_event_destroy. */
tpu_status tpu_event_create(bool enable_timing, tpu_event_t *out);
tpu_status tpu_event_destroy(tpu_event_t e);
tpu_status tpu_event_record(tpu_event_t e, tpu_stream_t s);
/* TPU_OK if the recorded work has run (or never recorded), else TPU_ERROR_NOT_READY. */
tpu_status tpu_event_query(tpu_event_t e);
tpu_status tpu_event_synchronize(tpu_event_t e);
/* Work queued on `s` after this call waits for the event. */
tpu_status tpu_stream_wait_event(tpu_stream_t s, tpu_event_t e);
/* Milliseconds between two completed, timing-enabled events. */
tpu_status tpu_event_elapsed_ms(tpu_event_t start, tpu_event_t end, float *ms);

/* Host interrupts. A host wait that sleeps (tpu_stream_synchronize,
 * tpu_event_synchronize, tpu_device_synchronize, a launch waiting for room in
 * a full queue, a copy waiting for itself) calls `fn` every 50 ms, on the
 * waiting thread with no runtime lock held. When `fn` returns true the wait
 * gives up with TPU_ERROR_INTERRUPTED. Work already queued keeps running,
 * except a copy whose own caller gave up waiting for it: that copy is
 * cancelled (it never touches host memory). The thread then stays
 * interrupted - its synchronizing calls return TPU_ERROR_INTERRUPTED at once -
 * until it calls tpu_interrupt_clear(). NULL removes the check. */
typedef bool (*tpu_interrupt_fn)(void);
void tpu_set_interrupt_check(tpu_interrupt_fn fn);
void tpu_interrupt_clear(void);
bool tpu_interrupted(void);

#ifdef __cplusplus
}
#endif
#endif
