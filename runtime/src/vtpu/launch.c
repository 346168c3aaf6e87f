/* launch.c - kernel launch: validate the argument block, translate device
 * addresses, queue the command (or run and wait, in Debug Eager); the eager mode.
 *
 * Everything checkable without reading device memory is checked here and
 * returned synchronously: the op, its arity, and every operand through the
 * shared view check (view.c): rank, dtype, the view inside its storage, the
 * storage a live allocation. In Fused Eager the launch is then recorded
 * into the stream's window (window.c) instead of queued. */
#include "vtpu/vtpu-impl.h"
#include <stdlib.h>
#include <string.h>

/* A Strict Eager launch whose operands hold at most this many elements in
 * all runs on the launching thread when its stream is idle: a 16-element add
 * takes ~0.1 us there, and handing it to the worker ~0.4 us more (the command
 * block and the queue's cache lines cross cores, the result's wait spins).
 * 8192 float elements are ~2 us of elementwise work on one core, about where
 * the overlap with the caller's next op starts to pay. */
#define TPU_INLINE_ELEMS 8192

/* ---- the eager mode: the one copy of it (the C++ glue and Python read it here) ---- */
static _Atomic int eager_mode = TPU_EAGER_STRICT;
static pthread_once_t mode_once = PTHREAD_ONCE_INIT;
static const char *const mode_names[TPU_EAGER_MODE_COUNT] = {"debug", "strict", "fused"};
_Static_assert(TPU_EAGER_MODE_COUNT == 3, "eager mode names");

/* TORCH_TPU_LAUNCH_BLOCKING (any value but unset, "" or "0"; tpu_init()
 * rejects anything but 0 or 1) starts in Debug Eager; else
 * TORCH_TPU_DEFER_AND_FUSE=1 starts in Fused Eager. */
static void mode_init(void) {
    const char *v = getenv("TORCH_TPU_LAUNCH_BLOCKING");
    const char *f = getenv("TORCH_TPU_DEFER_AND_FUSE");
    if (v && *v && strcmp(v, "0") != 0)
        atomic_store_explicit(&eager_mode, TPU_EAGER_DEBUG, memory_order_relaxed);
    else if (f && strcmp(f, "1") == 0)
        atomic_store_explicit(&eager_mode, TPU_EAGER_FUSED, memory_order_relaxed);
}

/* A thread's override of the process-wide mode (-1: none): a compiled
 * graph's region (tpu_set_thread_eager_mode). */
static _Thread_local int thread_mode = -1;

tpu_eager_mode tpu_get_eager_mode(void) {
    if (thread_mode >= 0) return (tpu_eager_mode)thread_mode;
    pthread_once(&mode_once, mode_init);
    return (tpu_eager_mode)atomic_load_explicit(&eager_mode, memory_order_relaxed);
}

tpu_status tpu_set_thread_eager_mode(int m, int *prev) {
    if (m < -1 || m >= TPU_EAGER_MODE_COUNT) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "unknown eager mode %d", m);
    tpu_eager_mode was = tpu_get_eager_mode();
    if (prev) *prev = thread_mode;
    thread_mode = m;
    tpu_eager_mode now = tpu_get_eager_mode();
    if (was != TPU_EAGER_FUSED || now == TPU_EAGER_FUSED || !tpu_is_initialized()) return TPU_OK;
    /* Leaving Fused Eager on this thread: what it recorded runs now, and in
     * Debug Eager has finished (its errors raise here). */
    tpu_status s = tpu_windows_flush_dev(-1, TPU_FLUSH_GRAPH_END);
    if (!s && now == TPU_EAGER_DEBUG) s = tpu_device_synchronize(tpu_device_current());
    return s;
}

tpu_status tpu_set_eager_mode(tpu_eager_mode m) {
    if ((unsigned)m >= TPU_EAGER_MODE_COUNT)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "unknown eager mode %d", (int)m);
    pthread_once(&mode_once, mode_init);
    /* Switching flushes: what was recorded runs as recorded, before the new mode's work. */
    if (m != (tpu_eager_mode)atomic_load_explicit(&eager_mode, memory_order_relaxed) && tpu_is_initialized()) {
        tpu_status s = tpu_windows_flush_dev(-1, TPU_FLUSH_MODE_SWITCH);
        if (s) return s;
    }
    atomic_store_explicit(&eager_mode, (int)m, memory_order_relaxed);
    return TPU_OK;
}

const char *tpu_eager_mode_name(tpu_eager_mode m) { return (unsigned)m < TPU_EAGER_MODE_COUNT ? mode_names[m] : "?"; }

tpu_status tpu_eager_mode_from_name(const char *name, tpu_eager_mode *out) {
    for (int m = 0; m < TPU_EAGER_MODE_COUNT; m++)
        if (strcmp(name, mode_names[m]) == 0) {
            *out = (tpu_eager_mode)m;
            return TPU_OK;
        }
    if (strcmp(name, "defer_and_fuse") == 0) {
        *out = TPU_EAGER_FUSED;
        return TPU_OK;
    }
    return tpu_set_error(TPU_ERROR_INVALID_VALUE, "unknown eager mode '%.64s'; expected one of ['%s', '%s', '%s']",
                         name, mode_names[TPU_EAGER_DEBUG], mode_names[TPU_EAGER_FUSED], mode_names[TPU_EAGER_STRICT]);
}

tpu_status tpu_launch(tpu_stream_t stream, tpu_op op, const tpu_tensor *operands, int n, const tpu_params *params) {
    tpu_status s = tpu_check_fork();
    if (s) return s;
    if ((unsigned)op >= TPU_OP_COUNT) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "unknown op %d", op);
    const tpu_op_info *info = &tpu_op_infos[op];
    if (n < info->nout + info->nin_min || n > info->nout + info->nin_max || n > TPU_MAX_OPERANDS)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: expected %d to %d operands, got %d", tpu_op_name(op),
                             info->nout + info->nin_min, info->nout + info->nin_max, n);
    /* The arguments are built on the stack: Fused Eager records them, Strict
     * copies them into a recycled command block of the queue. */
    tpu_eager_mode mode = tpu_get_eager_mode();
    tpu_kargs local, *a = &local;
    a->op = op;
    a->n = n;
    a->site = tpu_launch_site();
    a->err[0] = 0;
    memcpy(a->t, operands, (size_t)n * sizeof *operands);
    if (params)
        a->p = *params;
    else
        memset(&a->p, 0, sizeof a->p);
    int dev = -1;
    s = tpu_view_check_all(tpu_op_name(op), a->t, n, &dev);
    if (s) return s;
    s = tpu_op_check_dtypes(op, a->t, n, &a->p); /* the op's dtype rule (ops.def), before anything is queued */
    if (s) return s;
    if (!stream) stream = tpu_stream_current(dev >= 0 ? dev : tpu_device_current());
    if (!stream) return tpu_set_error(TPU_ERROR_INVALID_DEVICE, "no stream for device %d", dev);
    if (dev >= 0 && tpu_stream_device(stream) != dev)
        return tpu_set_error(
            TPU_ERROR_DEVICE_MISMATCH,
            "Expected all tensors to be on the same device, but found at least two devices, tpu:%d and tpu:%d!", dev,
            tpu_stream_device(stream));
    if (mode == TPU_EAGER_FUSED) return tpu_window_record(stream, a);
    /* Outputs allocated in Fused Eager and never written yet are bound now. */
    if (tpu_alloc_any_deferred())
        for (int k = 0; k < info->nout && k < n; k++)
            if (!operands[k].is_scalar) tpu_alloc_materialize(operands[k].base);
    /* Debug Eager: run on this thread when the stream is idle (no wake-up round trip). */
    if (mode == TPU_EAGER_DEBUG) return tpu_stream_run_kernel(stream, a);
    /* Strict Eager: a small kernel (all operands' elements) on an idle stream runs here too. */
    int64_t elems = 0;
    for (int k = 0; k < n && elems <= TPU_INLINE_ELEMS; k++)
        if (!a->t[k].is_scalar) elems += tpu_tensor_numel(&a->t[k]);
    if (elems <= TPU_INLINE_ELEMS && tpu_stream_run_small(stream, a)) return TPU_OK;
    return tpu_stream_enqueue_kernel(stream, a);
}
