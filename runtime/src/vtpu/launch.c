/* launch.c - kernel launch: validate the argument block, translate device
 * addresses, queue the command (or run and wait, in launch-blocking mode).
 *
 * Everything checkable without reading device memory is checked here and
 * returned synchronously: the op, its arity, and every operand through the
 * shared view check (view.c): rank, dtype, the view inside its storage, the
 * storage a live allocation. */
#include "vtpu-impl.h"
#include <stdlib.h>
#include <string.h>

static atomic_bool launch_blocking;
static pthread_once_t blocking_once = PTHREAD_ONCE_INIT;

static void blocking_init(void) {
    const char *v = getenv("TORCH_TPU_LAUNCH_BLOCKING");
    if (v && *v && strcmp(v, "0") != 0) atomic_store(&launch_blocking, true);
}

void tpu_set_launch_blocking(bool on) {
    pthread_once(&blocking_once, blocking_init);
    atomic_store_explicit(&launch_blocking, on, memory_order_relaxed);
}
bool tpu_get_launch_blocking(void) {
    pthread_once(&blocking_once, blocking_init);
    return atomic_load_explicit(&launch_blocking, memory_order_relaxed);
}

tpu_status tpu_launch(tpu_stream_t stream, tpu_op op, const tpu_tensor *operands, int n, const tpu_params *params) {
    tpu_status s = tpu_check_fork();
    if (s) return s;
    if ((unsigned)op >= TPU_OP_COUNT) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "unknown op %d", op);
    const tpu_op_info *info = &tpu_op_infos[op];
    if (n < info->nout + info->nin_min || n > info->nout + info->nin_max || n > TPU_MAX_OPERANDS)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: expected %d to %d operands, got %d", tpu_op_name(op),
                             info->nout + info->nin_min, info->nout + info->nin_max, n);
    tpu_cmd *c = tpu_cmd_new(TPU_CMD_KERNEL);
    if (!c) return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory");
    tpu_kargs *a = &c->u.k;
    a->op = op;
    a->n = n;
    a->err[0] = 0;
    memcpy(a->t, operands, (size_t)n * sizeof *operands);
    if (params) a->p = *params; else memset(&a->p, 0, sizeof a->p);
    int dev = -1;
    for (int k = 0; k < n; k++) {
        s = tpu_view_check(tpu_op_name(op), k, &a->t[k], true, &dev);
        if (s) { free(c); return s; }
    }
    s = tpu_op_check_dtypes(op, a->t, n, &a->p);   /* the op's dtype rule (ops.def), before anything is queued */
    if (s) { free(c); return s; }
    if (!stream) stream = tpu_stream_current(dev >= 0 ? dev : tpu_device_current());
    if (!stream) { free(c); return tpu_set_error(TPU_ERROR_INVALID_DEVICE, "no stream for device %d", dev); }
    if (dev >= 0 && tpu_stream_device(stream) != dev) {
        free(c);
        return tpu_set_error(TPU_ERROR_DEVICE_MISMATCH,
            "Expected all tensors to be on the same device, but found at least two devices, tpu:%d and tpu:%d!",
            dev, tpu_stream_device(stream));
    }
    if (tpu_get_launch_blocking()) {
        /* Debug Eager: run on this thread when the stream is idle (no wake-up round trip). */
        tpu_status ks;
        if (tpu_stream_try_inline(stream, c, &ks)) return ks;
        s = tpu_stream_enqueue(stream, c, NULL);
        return s ? s : tpu_stream_synchronize(stream);
    }
    return tpu_stream_enqueue(stream, c, NULL);
}
