/* copy.c - pinned host memory and stream-ordered copies.
 *
 * Copies are commands on a stream, so they are ordered with kernels. A copy
 * from or to pageable host memory waits before returning (the host buffer
 * may be reused right after the call, as with cudaMemcpyAsync on pageable
 * memory); with pinned memory an asynchronous copy returns at once and the
 * pinned block remembers the stream position it must wait for when freed. */
#define _GNU_SOURCE
#include "vtpu/vtpu-impl.h"
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

typedef struct pinned {
    void *p;
    size_t bytes;
    tpu_stream_t last_stream;
    uint64_t last_seq;
    struct pinned *next;
} pinned;

static pinned *pinned_list;
static pthread_mutex_t pin_mu = PTHREAD_MUTEX_INITIALIZER;

tpu_status tpu_host_alloc(size_t bytes, void **out) {
    *out = NULL;
    if (bytes == 0) return TPU_OK;
    pinned *rec = malloc(sizeof *rec);
    void *p = NULL;
    size_t rounded = (bytes + 4095) & ~(size_t)4095;
    if (rounded < bytes || !rec || posix_memalign(&p, 4096, rounded) != 0) {
        free(rec);
        return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "pinned host allocation of %zu bytes failed", bytes);
    }
    rec->p = p;
    rec->bytes = bytes;
    rec->last_stream = NULL;
    rec->last_seq = 0;
    pthread_mutex_lock(&pin_mu);
    rec->next = pinned_list;
    pinned_list = rec;
    pthread_mutex_unlock(&pin_mu);
    *out = p;
    return TPU_OK;
}

/* Pinned record containing host address p (caller holds pin_mu). */
static pinned *find_pinned(const void *p) {
    for (pinned *r = pinned_list; r; r = r->next)
        if ((const char *)p >= (char *)r->p && (const char *)p < (char *)r->p + r->bytes) return r;
    return NULL;
}

bool tpu_host_is_pinned(const void *p) {
    pthread_mutex_lock(&pin_mu);
    bool r = find_pinned(p) != NULL;
    pthread_mutex_unlock(&pin_mu);
    return r;
}

tpu_status tpu_host_free(void *p) {
    if (!p) return TPU_OK;
    pthread_mutex_lock(&pin_mu);
    pinned **pp = &pinned_list;
    while (*pp && (*pp)->p != p) pp = &(*pp)->next;
    pinned *r = *pp;
    if (r) *pp = r->next;
    pthread_mutex_unlock(&pin_mu);
    if (!r) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_host_free: %p is not pinned memory", p);
    if (r->last_stream) tpu_stream_wait_seq(r->last_stream, r->last_seq);
    free(r->p);
    free(r);
    return TPU_OK;
}

/* True if the view is dense row-major (a plain byte range). */
static bool view_contiguous(const tpu_tensor *t) {
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->sizes[d] == 1) continue;
        if (t->strides[d] != expect) return false;
        expect *= t->sizes[d];
    }
    return true;
}

/* Validate both sides through the shared view check (view.c) and resolve the
 * host addresses and byte count of the copy. *dev: the device whose stream
 * orders the copy (the destination's for H2D, the source's otherwise). */
static tpu_status resolve(tpu_tensor *dst, tpu_tensor *src, tpu_copy_kind kind, void **hd, const void **hs,
                          size_t *bytes, int *dev) {
    if ((unsigned)kind >= TPU_COPY_KIND_COUNT) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "bad copy kind %d", kind);
    const bool on_dev[2] = {kind == TPU_COPY_H2D || kind == TPU_COPY_D2D, kind == TPU_COPY_D2H || kind == TPU_COPY_D2D};
    static const char *const what[2] = {"tpu_memcpy (destination)", "tpu_memcpy (source)"};
    tpu_tensor *v[2] = {dst, src};
    int vdev[2] = {-1, -1};
    int64_t n[2];
    char *p[2];
    for (int k = 0; k < 2; k++) {
        if (v[k]->is_scalar || !view_contiguous(v[k]))
            return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: the view must be a contiguous tensor", what[k]);
        int64_t off = v[k]->offset;
        tpu_status s = tpu_view_check(what[k], k, v[k], on_dev[k], &vdev[k]);
        if (s) return s;
        size_t es = tpu_dtype_size((tpu_dtype)v[k]->dtype);
        n[k] = tpu_tensor_numel(v[k]) * (int64_t)es; /* in bounds, so no overflow */
        p[k] = v[k]->base ? (char *)v[k]->base + (size_t)off * es : NULL;
    }
    if (n[0] != n[1])
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_memcpy: destination has %lld bytes, source %lld",
                             (long long)n[0], (long long)n[1]);
    *hd = p[0];
    *hs = p[1];
    *bytes = (size_t)n[0];
    *dev = kind == TPU_COPY_H2D ? vdev[0] : vdev[1];
    return TPU_OK;
}

static tpu_status do_copy(tpu_tensor dst, tpu_tensor src, tpu_copy_kind kind, tpu_stream_t stream, bool async) {
    tpu_status s = tpu_check_fork();
    if (s) return s;
    void *hd = NULL;
    const void *hs = NULL;
    size_t bytes = 0;
    int dev = -1;
    void *dst_dev = dst.base;
    s = resolve(&dst, &src, kind, &hd, &hs, &bytes, &dev);
    if (s) return s;
    if (kind != TPU_COPY_D2H && tpu_alloc_any_deferred()) tpu_alloc_materialize(dst_dev); /* Fused Eager: bind */
    if (bytes == 0) return TPU_OK;
    const void *host_side = kind == TPU_COPY_H2D ? hs : kind == TPU_COPY_D2H ? (const void *)hd : NULL;
    if (!stream) stream = tpu_stream_current(dev);
    if (!stream) return tpu_set_error(TPU_ERROR_INVALID_DEVICE, "no stream for device %d", dev);
    tpu_cmd *c = tpu_cmd_new(TPU_CMD_COPY);
    if (!c) return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory");
    c->u.copy.dst = hd;
    c->u.copy.src = hs;
    c->u.copy.bytes = bytes;
    uint64_t seq;
    bool pinned_host = false;
    pthread_mutex_lock(&pin_mu);
    pinned *r = host_side ? find_pinned(host_side) : NULL;
    pthread_mutex_unlock(&pin_mu);
    pinned_host = r != NULL;
    bool must_wait = !async || (host_side && !pinned_host) || tpu_get_eager_mode() == TPU_EAGER_DEBUG;
    if (must_wait) {
        /* Idle stream: copy on this thread (no wake-up round trip), still in stream order. */
        if (tpu_stream_try_inline_copy(stream, c)) return TPU_OK;
    }
    s = tpu_stream_enqueue(stream, c, &seq);
    if (s) return s;
    if (r) {
        pthread_mutex_lock(&pin_mu);
        r->last_stream = stream;
        r->last_seq = seq;
        pthread_mutex_unlock(&pin_mu);
    }
    bool wait = !async || (host_side && !pinned_host) || tpu_get_eager_mode() == TPU_EAGER_DEBUG;
    if (wait) {
        tpu_stream_wait_seq(stream, seq);
        /* An interrupted wait cancelled the copy: say so now, not at the next sync. */
        if (tpu_interrupted())
            return tpu_set_error(TPU_ERROR_INTERRUPTED, "copy of %zu bytes interrupted before it ran", bytes);
        if (!async || tpu_get_eager_mode() == TPU_EAGER_DEBUG) return tpu_stream_synchronize(stream);
    }
    return TPU_OK;
}

/* A raw pointer copy as a view copy: each device side must be a whole live
 * allocation (its start, at least `bytes` long); the host side is trusted for
 * `bytes`. */
static tpu_tensor raw_view(const void *p, size_t bytes) {
    tpu_tensor t;
    memset(&t, 0, sizeof t);
    t.base = (void *)p;
    t.nbytes = bytes;
    t.dtype = TPU_U8;
    t.ndim = 1;
    t.sizes[0] = (int64_t)bytes;
    t.strides[0] = 1;
    return t;
}

tpu_status tpu_memcpy(void *dst, const void *src, size_t bytes, tpu_copy_kind kind, tpu_stream_t stream) {
    if (bytes > INT64_MAX) return tpu_set_error(TPU_ERROR_OVERFLOW, "tpu_memcpy: %zu bytes", bytes);
    return do_copy(raw_view(dst, bytes), raw_view(src, bytes), kind, stream, false);
}

tpu_status tpu_memcpy_async(void *dst, const void *src, size_t bytes, tpu_copy_kind kind, tpu_stream_t stream) {
    if (bytes > INT64_MAX) return tpu_set_error(TPU_ERROR_OVERFLOW, "tpu_memcpy_async: %zu bytes", bytes);
    return do_copy(raw_view(dst, bytes), raw_view(src, bytes), kind, stream, true);
}

tpu_status tpu_memcpy_view(const tpu_tensor *dst, const tpu_tensor *src, tpu_copy_kind kind, tpu_stream_t stream,
                           bool async) {
    if (!dst || !src) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_memcpy_view: NULL view");
    return do_copy(*dst, *src, kind, stream, async);
}
