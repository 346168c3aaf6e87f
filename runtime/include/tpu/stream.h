/* stream.h - streams (in-order work queues) and events.
 *
 * Each chip has a default stream; more can be created. Work on a stream runs
 * in order on a worker thread. An error raised by a kernel run asynchronously
 * sticks to its stream and is returned (once) by the next synchronizing call
 * on that stream or device, naming the op; the stream stays usable.
 * Thread safety: all functions are thread-safe; the current stream is per
 * thread and per device. */
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

/* Caller frees with tpu_stream_destroy (which waits for queued work). */
tpu_status tpu_stream_create(int dev, int priority, tpu_stream_t *out);
tpu_status tpu_stream_destroy(tpu_stream_t s);
/* Default stream of `dev` (borrowed; lives as long as the process). NULL if dev is invalid. */
tpu_stream_t tpu_stream_default(int dev);
/* Current stream of the calling thread for `dev` (default stream unless set). */
tpu_stream_t tpu_stream_current(int dev);
tpu_status tpu_stream_set_current(tpu_stream_t s);
int tpu_stream_device(tpu_stream_t s);
/* Stable small id: 0 for the default stream of a device. */
int64_t tpu_stream_id(tpu_stream_t s);
int tpu_stream_priority(tpu_stream_t s);
/* TPU_OK if all work has run, TPU_ERROR_NOT_READY otherwise. */
tpu_status tpu_stream_query(tpu_stream_t s);
tpu_status tpu_stream_synchronize(tpu_stream_t s);
/* Queue a host callback; runs on the worker in stream order. */
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

#ifdef __cplusplus
}
#endif
#endif
