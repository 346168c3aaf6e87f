/* copy.c - pinned host memory and stream-ordered copies.
 *
 * Copies are commands on a stream, so they are ordered with kernels. A copy
 * from or to pageable host memory waits before returning (the host buffer
 * may be reused right after the call, as with cudaMemcpyAsync on pageable
 * memory); with pinned memory an asynchronous copy returns at once and the
 * pinned block remembers the stream position it must wait for when freed. */
#define _GNU_SOURCE
#include "vtpu-impl.h"
#include <stdlib.h>
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

static tpu_status resolve(void *dst, const void *src, size_t bytes, tpu_copy_kind kind,
                          void **hd, const void **hs, const void **host_side) {
    bool dst_dev = kind == TPU_COPY_H2D || kind == TPU_COPY_D2D;
    bool src_dev = kind == TPU_COPY_D2H || kind == TPU_COPY_D2D;
    if ((unsigned)kind >= TPU_COPY_KIND_COUNT) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "bad copy kind %d", kind);
    *hd = dst_dev ? tpu_dev_to_host(dst) : dst;
    *hs = src_dev ? tpu_dev_to_host(src) : src;
    if (!*hd || !*hs) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_memcpy: %s pointer %p is not a tpu device address",
                                           !*hd ? "destination" : "source", !*hd ? dst : src);
    /* Bounds: the whole range must lie in the chip's memory. */
    for (int k = 0; k < 2; k++) {
        const void *dp = k == 0 ? (const void *)dst : src;
        bool is_dev = k == 0 ? dst_dev : src_dev;
        if (!is_dev) continue;
        int dev = tpu_mem_device_of(dp);
        tpu_chip *c;
        tpu_status s = tpu_chip_get(dev, &c);
        if (s) return s;
        uintptr_t off = (uintptr_t)dp & (((uintptr_t)1 << TPU_DEVADDR_SHIFT) - 1);
        if (off + bytes < off || off + bytes > c->capacity)
            return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_memcpy: %zu bytes at %p run past the end of device memory", bytes, dp);
    }
    *host_side = kind == TPU_COPY_H2D ? src : kind == TPU_COPY_D2H ? dst : NULL;
    return TPU_OK;
}

static tpu_status do_copy(void *dst, const void *src, size_t bytes, tpu_copy_kind kind, tpu_stream_t stream, bool async) {
    tpu_status s = tpu_check_fork();
    if (s) return s;
    if (bytes == 0) return TPU_OK;
    void *hd = NULL; const void *hs = NULL, *host_side = NULL;
    s = resolve(dst, src, bytes, kind, &hd, &hs, &host_side);
    if (s) return s;
    if (!stream) {
        int dev = tpu_mem_device_of(kind == TPU_COPY_H2D ? dst : src);
        stream = tpu_stream_current(dev);
    }
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
    bool must_wait = !async || (host_side && !pinned_host) || tpu_get_launch_blocking();
    if (must_wait) {
        /* Idle stream: copy on this thread (no wake-up round trip), still in stream order. */
        tpu_status cs;
        if (tpu_stream_try_inline(stream, c, &cs)) return cs;
    }
    s = tpu_stream_enqueue(stream, c, &seq);
    if (s) return s;
    if (r) {
        pthread_mutex_lock(&pin_mu);
        r->last_stream = stream;
        r->last_seq = seq;
        pthread_mutex_unlock(&pin_mu);
    }
    bool wait = !async || (host_side && !pinned_host) || tpu_get_launch_blocking();
    if (wait) {
        tpu_stream_wait_seq(stream, seq);
        if (!async || tpu_get_launch_blocking()) return tpu_stream_synchronize(stream);
    }
    return TPU_OK;
}

tpu_status tpu_memcpy(void *dst, const void *src, size_t bytes, tpu_copy_kind kind, tpu_stream_t stream) {
    return do_copy(dst, src, bytes, kind, stream, false);
}

tpu_status tpu_memcpy_async(void *dst, const void *src, size_t bytes, tpu_copy_kind kind, tpu_stream_t stream) {
    return do_copy(dst, src, bytes, kind, stream, true);
}
