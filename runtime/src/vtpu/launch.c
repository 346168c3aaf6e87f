/* launch.c - kernel launch: validate the argument block, translate device
 * addresses, queue the command (or run and wait, in launch-blocking mode).
 *
 * Everything checkable without reading device memory is checked here and
 * returned synchronously: the op, its arity, ranks, dtypes, and that every
 * view (offset + extent of sizes and strides) lies inside its storage, and
 * every storage inside its chip's memory. */
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

/* Check one operand and translate its base. `k` is its position for messages. */
static tpu_status check_operand(tpu_op op, int k, tpu_tensor *t, int *dev) {
    if (t->is_scalar) return TPU_OK;
    if ((unsigned)t->dtype >= TPU_DTYPE_COUNT)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: operand %d has unknown dtype %d", tpu_op_name(op), k, t->dtype);
    if (t->ndim < 0 || t->ndim > TPU_MAX_DIMS)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: operand %d has %d dims (at most %d supported)",
                             tpu_op_name(op), k, t->ndim, TPU_MAX_DIMS);
    int64_t lo = t->offset, hi = t->offset;   /* element span touched by the view */
    bool empty = false;
    for (int d = 0; d < t->ndim; d++) {
        if (t->sizes[d] < 0)
            return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: operand %d has negative size %lld in dim %d",
                                 tpu_op_name(op), k, (long long)t->sizes[d], d);
        if (t->sizes[d] == 0) { empty = true; continue; }
        int64_t ext;
        if (__builtin_mul_overflow(t->sizes[d] - 1, t->strides[d], &ext))
            return tpu_set_error(TPU_ERROR_OVERFLOW, "%s: operand %d extent overflows", tpu_op_name(op), k);
        if (ext < 0) lo += ext; else hi += ext;
    }
    if (empty) { t->base = NULL; return TPU_OK; }
    size_t es = tpu_dtype_size((tpu_dtype)t->dtype);
    if (lo < 0 || (uint64_t)(hi + 1) > t->nbytes / es)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE,
            "%s: operand %d view [%lld, %lld] (elements) is outside its storage of %zu bytes",
            tpu_op_name(op), k, (long long)lo, (long long)hi, t->nbytes);
    int d = tpu_mem_device_of(t->base);
    if (d < 0)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: operand %d (%p) is not in tpu device memory", tpu_op_name(op), k, t->base);
    if (*dev >= 0 && d != *dev)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE,
            "Expected all tensors to be on the same device, but found at least two devices, tpu:%d and tpu:%d!", *dev, d);
    *dev = d;
    tpu_chip *c;
    tpu_status s = tpu_chip_get(d, &c);
    if (s) return s;
    uintptr_t off = (uintptr_t)t->base & (((uintptr_t)1 << TPU_DEVADDR_SHIFT) - 1);
    if (off + t->nbytes < off || off + t->nbytes > c->capacity)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: operand %d storage runs past the end of device memory", tpu_op_name(op), k);
    t->base = tpu_dev_to_host(t->base);
    return TPU_OK;
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
        s = check_operand(op, k, &a->t[k], &dev);
        if (s) { free(c); return s; }
    }
    if (!stream) stream = tpu_stream_current(dev >= 0 ? dev : tpu_device_current());
    if (!stream) { free(c); return tpu_set_error(TPU_ERROR_INVALID_DEVICE, "no stream for device %d", dev); }
    if (dev >= 0 && tpu_stream_device(stream) != dev) {
        free(c);
        return tpu_set_error(TPU_ERROR_INVALID_VALUE,
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
