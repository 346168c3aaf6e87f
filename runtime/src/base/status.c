/* status.c - status names and the thread-local last-error string (stb style). */
#include "base/base-impl.h"
#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512] = "no error";

const char *tpu_last_error(void) { return last_error; }

tpu_status tpu_set_error(tpu_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

const char *tpu_status_name(tpu_status s) {
    static const char *const names[] = {"TPU_OK",
                                        "TPU_ERROR_INVALID_VALUE",
                                        "TPU_ERROR_INVALID_DEVICE",
                                        "TPU_ERROR_OUT_OF_MEMORY",
                                        "TPU_ERROR_OVERFLOW",
                                        "TPU_ERROR_NOT_READY",
                                        "TPU_ERROR_KERNEL",
                                        "TPU_ERROR_NOT_SUPPORTED",
                                        "TPU_ERROR_FORKED",
                                        "TPU_ERROR_INTERNAL",
                                        "TPU_ERROR_DEVICE_MISMATCH",
                                        "TPU_ERROR_INTERRUPTED"};
    _Static_assert(sizeof names / sizeof names[0] == TPU_STATUS_COUNT, "status names");
    return (unsigned)s < TPU_STATUS_COUNT ? names[s] : "TPU_ERROR_UNKNOWN";
}
