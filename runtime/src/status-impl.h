/* status-impl.h - setting the thread-local last error (runtime internal). */
#ifndef TPU_STATUS_IMPL_H
#define TPU_STATUS_IMPL_H
#include "tpu/status.h"

/* Set the last error and return `s` (for `return tpu_set_error(...)`). */
tpu_status tpu_set_error(tpu_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef struct tpu_op_info { int nout, nin_min, nin_max; } tpu_op_info;
extern const tpu_op_info tpu_op_infos[];
#endif
