/* status.h - error codes and the thread-local last-error message.
 *
 * Every action in the runtime returns a tpu_status (TPU_OK == 0). On failure
 * tpu_last_error() returns a message with the numbers in it, valid until the
 * next failing call on the same thread.
 * Thread safety: all functions are safe from any thread; the message is per thread. */
#ifndef TPU_STATUS_H
#define TPU_STATUS_H

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

#ifdef __cplusplus
}
#endif
#endif
