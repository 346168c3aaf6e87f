/* vtpu-impl.h - internals shared by the software device's files
 * (device.c, alloc.c, stream.c, copy.c, launch.c). */
#ifndef TPU_VTPU_IMPL_H
#define TPU_VTPU_IMPL_H

#include "tpu/tpu.h"
#include "../status-impl.h"
#include "../kernels/kernels-impl.h"
#include <pthread.h>
#include <stdatomic.h>

#define TPU_MAX_DEVICES 16
/* Device addresses of chip d start at (d + 1) << 44: never host-mapped, so a
 * host dereference of a device pointer faults instead of silently working. */
#define TPU_DEVADDR_SHIFT 44

typedef struct tpu_chip {
    int index;
    size_t capacity;
    char *arena;                 /* host mapping of the chip's memory (lazy) */
    pthread_once_t once;
    tpu_status init_status;
    tpu_stream_t default_stream;
    struct tpu_alloc *alloc;     /* caching allocator state (alloc.c) */
} tpu_chip;

/* Bring chip `dev` up on first use; checks index and fork state. */
tpu_status tpu_chip_get(int dev, tpu_chip **out);
/* Host address of a device address (NULL if not a valid device address). */
void *tpu_dev_to_host(const void *devptr);
/* Fail with TPU_ERROR_FORKED if this is a forked child of an initialized parent. */
tpu_status tpu_check_fork(void);
size_t tpu_env_size(const char *name, size_t dflt);

/* Allocator (alloc.c). */
struct tpu_alloc *tpu_alloc_create(tpu_chip *chip);
void tpu_alloc_forget_stream(int dev, tpu_stream_t s);

/* Streams (stream.c). */
typedef enum tpu_cmd_kind { TPU_CMD_KERNEL, TPU_CMD_COPY, TPU_CMD_EVENT, TPU_CMD_WAIT, TPU_CMD_CALLBACK } tpu_cmd_kind;
typedef struct tpu_cmd {
    tpu_cmd_kind kind;
    struct tpu_cmd *next;
    uint64_t seq;                /* position in its stream, set when queued */
    union {
        tpu_kargs k;
        struct { void *dst; const void *src; size_t bytes; } copy;
        struct { tpu_event_t ev; } event;
        struct { tpu_stream_t stream; uint64_t seq; } wait;
        struct { tpu_host_fn fn; void *user; } cb;
    } u;
} tpu_cmd;

tpu_cmd *tpu_cmd_new(tpu_cmd_kind kind);
/* Queue a command (takes ownership); returns its sequence number in *seq. */
tpu_status tpu_stream_enqueue(tpu_stream_t s, tpu_cmd *c, uint64_t *seq);
/* Run `c` (a kernel or copy) on the calling thread if `s` has nothing queued
 * or running, keeping stream order; frees c. Returns false (c untouched) if
 * the stream is busy. A failing kernel's error is returned in *st (and set as
 * the last error), not made sticky. */
bool tpu_stream_try_inline(tpu_stream_t s, tpu_cmd *c, tpu_status *st);
uint64_t tpu_stream_completed(tpu_stream_t s);   /* acquire */
uint64_t tpu_stream_enqueued(tpu_stream_t s);
/* Create a chip's default stream (device.c calls this once). */
tpu_stream_t tpu_stream_new_internal(int dev, int priority, int64_t id);
/* Wait until `s` has completed `seq`. */
void tpu_stream_wait_seq(tpu_stream_t s, uint64_t seq);
/* Sync all streams of a device (no error reporting) - used by empty_cache. */
tpu_status tpu_device_synchronize_all(int dev);

#endif
