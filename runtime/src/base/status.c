/* status.c - status names and the thread-local last-error string (stb style). */
#include "base/base-impl.h"
#include <stdarg.h>
#include <stdatomic.h>
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

static _Thread_local uint32_t launch_site;
static _Atomic(tpu_site_namer_fn) site_namer;

void tpu_set_launch_site(uint32_t site) { launch_site = site; }
uint32_t tpu_launch_site(void) { return launch_site; }
void tpu_set_site_namer(tpu_site_namer_fn fn) { atomic_store(&site_namer, fn); }

void tpu_kernel_failure_text(const tpu_kargs *a, tpu_status st, char *buf, size_t len) {
    int w =
        snprintf(buf, len, "tpu kernel '%s' failed: %s", tpu_op_name(a->op), a->err[0] ? a->err : tpu_status_name(st));
    tpu_site_namer_fn namer = atomic_load(&site_namer);
    if (!a->site || !namer || w < 0 || (size_t)w + 16 >= len) return;
    char site[256];
    site[0] = 0;
    namer(a->site, site, sizeof site);
    if (site[0]) snprintf(buf + w, len - (size_t)w, " (called at %s)", site);
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
