/* status.h - error codes and the thread-local last-error message.
 *
 * Every action in the runtime returns a tpu_status (TPU_OK == 0). On failure
 * tpu_last_error() returns a message with the numbers in it, valid until the
 * next failing call on the same thread.
 * Thread safety: all functions are safe from any thread; the message is per thread. */
#ifndef TPU_STATUS_H
#define TPU_STATUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpu_status {
    TPU_OK = 0,
    TPU_ERROR_INVALID_VALUE,  /* bad argument from the caller */
    TPU_ERROR_INVALID_DEVICE, /* device index out of range */
    TPU_ERROR_OUT_OF_MEMORY,  /* device or host allocation failed */
    TPU_ERROR_OVERFLOW,       /* a byte count computed from sizes overflows */
    TPU_ERROR_NOT_READY,      /* query: work still pending (not a failure) */
    TPU_ERROR_KERNEL,         /* a kernel failed while running (asynchronous) */
    TPU_ERROR_NOT_SUPPORTED,  /* op/dtype combination has no kernel */
    TPU_ERROR_FORKED,         /* runtime used in a forked child after init */
    TPU_ERROR_INTERNAL,
    TPU_ERROR_DEVICE_MISMATCH, /* operands on different chips (PyTorch raises RuntimeError) */
    TPU_ERROR_INTERRUPTED,     /* a host wait was interrupted (SIGINT); the work still runs */
    TPU_STATUS_COUNT
} tpu_status;

/* Detail of the last failure on this thread (never NULL; borrowed). */
const char *tpu_last_error(void);
/* Short name of a status code, e.g. "TPU_ERROR_OUT_OF_MEMORY" (borrowed, static). */
const char *tpu_status_name(tpu_status s);

/* Call sites: where launches come from, so that a failure found later (a
 * queued or recorded launch's kernel, reported at a synchronizing call) can
 * say which call made it. The caller sets a nonzero id of its choosing for
 * the launches this thread makes next (0 = unknown) and registers a namer
 * that writes an id's text ("train.py:42 in forward") into buf; the namer
 * may run on any thread. */
void tpu_set_launch_site(uint32_t site);
uint32_t tpu_launch_site(void);
typedef void (*tpu_site_namer_fn)(uint32_t site, char *buf, size_t len);
void tpu_set_site_namer(tpu_site_namer_fn fn);

#ifdef __cplusplus
}
#endif
#endif
