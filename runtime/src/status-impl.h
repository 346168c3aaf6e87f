/* status-impl.h - setting the thread-local last error, and the op table
 * generated from ops.def with its dtype rules (runtime internal). */
#ifndef TPU_STATUS_IMPL_H
#define TPU_STATUS_IMPL_H
#include "tpu/status.h"
#include "tpu/ops.h"

/* Set the last error and return `s` (for `return tpu_set_error(...)`). */
tpu_status tpu_set_error(tpu_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The dtype rule column of ops.def (see its header): bit (1 << tpu_dtype) per
 * accepted dtype, plus flags saying which operands the rule applies to. */
#define DT_F32  (1u << TPU_F32)
#define DT_F64  (1u << TPU_F64)
#define DT_F16  (1u << TPU_F16)
#define DT_BF16 (1u << TPU_BF16)
#define DT_BOOL (1u << TPU_BOOL)
#define DT_FLOAT (DT_F32 | DT_F64 | DT_F16 | DT_BF16)
#define DT_INT ((1u << TPU_U8) | (1u << TPU_I8) | (1u << TPU_I16) | (1u << TPU_I32) | (1u << TPU_I64))
#define DT_NUM (DT_FLOAT | DT_INT)
#define DT_ALL (DT_NUM | DT_BOOL)
#define DT_MASK 0xffffu
#define DT_OUT (1u << 16)        /* the rule applies to output 0 */
#define DT_IN_FLOAT (1u << 17)   /* and every tensor input must be floating */

typedef struct tpu_op_info { int nout, nin_min, nin_max; unsigned dtypes; } tpu_op_info;
extern const tpu_op_info tpu_op_infos[];

/* The op's dtype rule against a launch's operands (already checked for
 * arity and valid dtypes) and params: TPU_OK, or TPU_ERROR_NOT_SUPPORTED with
 * PyTorch's message ("bitwise_and" not implemented for 'Float'). */
tpu_status tpu_op_check_dtypes(tpu_op op, const tpu_tensor *t, int n, const tpu_params *p);
#endif
