/* view.c - the one check every entry that touches device memory runs on each
 * view before any byte is read or written: launch (every operand), copies in
 * every direction (tpu_memcpy_view and the raw tpu_memcpy), and later fills
 * and collectives.
 *
 * A view is (storage base, storage nbytes, offset, sizes, strides, dtype).
 * It is accepted only if
 *   - its element span [offset + sum of negative extents, offset + sum of
 *     positive extents], computed with overflow-checked arithmetic, lies in
 *     [0, nbytes / itemsize), and
 *   - for device views, the storage itself is a live allocation of this
 *     runtime (its base is the start of a live block whose requested size is
 *     at least nbytes): a caller that passes a stale or inflated storage size
 *     cannot reach past the block either.
 * Empty views (a zero size) touch nothing and are always accepted. */
#include "vtpu/vtpu-impl.h"

/* Element span of a view: *lo and *hi are the lowest and highest element
 * indices it touches; *empty if it touches none. */
static tpu_status view_span(const char *what, int k, const tpu_tensor *t, int64_t *lo, int64_t *hi, bool *empty) {
    *lo = *hi = t->offset;
    *empty = false;
    if (t->offset < 0)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: operand %d has negative storage offset %lld", what, k,
                             (long long)t->offset);
    /* The product of the non-zero sizes must fit too: kernels multiply sizes
     * in any order, and a stride-0 view of 2^62 elements is "in bounds". */
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->sizes[d] < 0)
            return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: operand %d has negative size %lld in dim %d", what, k,
                                 (long long)t->sizes[d], d);
        if (t->sizes[d] == 0)
            *empty = true;
        else if (__builtin_mul_overflow(numel, t->sizes[d], &numel))
            return tpu_set_error(TPU_ERROR_OVERFLOW, "%s: operand %d: its number of elements overflows", what, k);
    }
    if (*empty) return TPU_OK;
    for (int d = 0; d < t->ndim; d++) {
        int64_t ext;
        bool ovf = __builtin_mul_overflow(t->sizes[d] - 1, t->strides[d], &ext);
        ovf = ovf || (ext < 0 ? __builtin_add_overflow(*lo, ext, lo) : __builtin_add_overflow(*hi, ext, hi));
        if (ovf) return tpu_set_error(TPU_ERROR_OVERFLOW, "%s: operand %d: the extent of its view overflows", what, k);
    }
    return TPU_OK;
}

/* Everything but the allocator's live check and the translation; *skip: a
 * scalar or an empty view (nothing more to check). */
static tpu_status view_shape_check(const char *what, int k, tpu_tensor *t, bool device, int *dev, bool *skip) {
    *skip = true;
    if (t->is_scalar) return TPU_OK;
    if ((unsigned)t->dtype >= TPU_DTYPE_COUNT)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: operand %d has unknown dtype %d", what, k, t->dtype);
    if (t->ndim < 0 || t->ndim > TPU_MAX_DIMS)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: operand %d has %d dims (at most %d supported)", what, k,
                             t->ndim, TPU_MAX_DIMS);
    int64_t lo, hi;
    bool empty;
    tpu_status s = view_span(what, k, t, &lo, &hi, &empty);
    if (s) return s;
    if (empty) {
        t->base = NULL;
        return TPU_OK;
    }
    *skip = false;
    size_t es = tpu_dtype_size((tpu_dtype)t->dtype);
    if (lo < 0 || (uint64_t)hi >= t->nbytes / es)
        return tpu_set_error(
            TPU_ERROR_INVALID_VALUE,
            "%s: operand %d: view of elements [%lld, %lld] (%zu bytes each) is outside its storage of %zu bytes", what,
            k, (long long)lo, (long long)hi, es, t->nbytes);
    if (!device) {
        if (!t->base) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: operand %d: host buffer is NULL", what, k);
        return TPU_OK;
    }
    int d = tpu_mem_device_of(t->base);
    if (d < 0)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: operand %d (%p) is not in tpu device memory", what, k,
                             t->base);
    if (*dev >= 0 && d != *dev)
        return tpu_set_error(
            TPU_ERROR_DEVICE_MISMATCH,
            "Expected all tensors to be on the same device, but found at least two devices, tpu:%d and tpu:%d!", *dev,
            d);
    *dev = d;
    return TPU_OK;
}

tpu_status tpu_view_check(const char *what, int k, tpu_tensor *t, bool device, int *dev) {
    bool skip;
    tpu_status s = view_shape_check(what, k, t, device, dev, &skip);
    if (s || skip || !device) return s;
    s = tpu_alloc_check_live(t->base, t->nbytes, what, k);
    if (s) return s;
    t->base = tpu_dev_to_host(t->base);
    return TPU_OK;
}

tpu_status tpu_view_check_all(const char *what, tpu_tensor *t, int n, int *dev) {
    bool skip[TPU_MAX_OPERANDS];
    for (int k = 0; k < n; k++) {
        tpu_status s = view_shape_check(what, k, &t[k], true, dev, &skip[k]);
        if (s) return s;
    }
    if (*dev < 0) return TPU_OK; /* scalars and empty views only */
    tpu_status s = tpu_alloc_check_live_all(*dev, t, n, what);
    if (s) return s;
    for (int k = 0; k < n; k++)
        if (!skip[k]) t[k].base = tpu_dev_to_host(t[k].base);
    return TPU_OK;
}
