/* mem.h - device memory (caching allocator), pinned host memory, copies.
 *
 * Device addresses are opaque: host code must not dereference them (they do
 * not map to host memory). Only copies and kernels touch device memory.
 * Thread safety: all functions are thread-safe. */
#ifndef TPU_MEM_H
#define TPU_MEM_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpu_stream *tpu_stream_t;

typedef struct tpu_mem_stats {
    size_t allocated, peak_allocated; /* bytes in live blocks */
    size_t reserved, peak_reserved;   /* bytes held by the allocator (live + cached) */
    uint64_t num_allocs, num_frees;
    uint64_t num_ooms;
    uint64_t num_cache_flushes; /* cache emptied to satisfy a request */
    size_t capacity;            /* HBM capacity */
} tpu_mem_stats;

/* Allocate `bytes` on `dev` for use on `stream` (NULL = default stream).
 * On OOM (after flushing the cache once) returns TPU_ERROR_OUT_OF_MEMORY with
 * "Tried to allocate N bytes ..." in tpu_last_error(). Caller frees. *out is
 * NULL for bytes == 0. */
tpu_status tpu_malloc(int dev, size_t bytes, tpu_stream_t stream, void **out);
/* Return a block to the cache. Reuse is stream-ordered: the block is handed
 * out again only once work queued on its stream before the free has run,
 * or immediately to the same stream. tpu_free(NULL) is a no-op. */
tpu_status tpu_free(void *devptr);
/* The block will also be used on `stream`: its reuse waits for that stream too. */
tpu_status tpu_mem_record_stream(void *devptr, tpu_stream_t stream);
/* Device index owning a device address, or -1 if it is not one. */
int tpu_mem_device_of(const void *devptr);
tpu_status tpu_mem_get_stats(int dev, tpu_mem_stats *out);
tpu_status tpu_mem_reset_peak(int dev);
/* Release cached blocks (synchronizes the device first). */
tpu_status tpu_mem_empty_cache(int dev);
tpu_status tpu_mem_get_info(int dev, size_t *free_bytes, size_t *total_bytes);
/* Allocation hook for fault injection in tests: called before each device
 * allocation; returning false makes it fail as OOM. NULL removes the hook. */
typedef bool (*tpu_alloc_hook_fn)(int dev, size_t bytes, void *user);
void tpu_mem_set_alloc_hook(tpu_alloc_hook_fn fn, void *user);

/* Pinned host memory: page-aligned, usable for asynchronous copies. Freeing
 * waits for the copies that used it. Caller frees with tpu_host_free. */
tpu_status tpu_host_alloc(size_t bytes, void **out);
tpu_status tpu_host_free(void *p);
bool tpu_host_is_pinned(const void *p);

typedef enum tpu_copy_kind { TPU_COPY_H2D = 0, TPU_COPY_D2H, TPU_COPY_D2D, TPU_COPY_KIND_COUNT } tpu_copy_kind;

/* Copy `bytes` in stream order. Synchronous form waits for the copy (and so
 * for the work queued before it); asynchronous form returns at once unless
 * the host side is pageable memory, which is copied before returning.
 * Host buffers are borrowed: a pinned one must live until the copy has run. */
tpu_status tpu_memcpy(void *dst, const void *src, size_t bytes, tpu_copy_kind kind, tpu_stream_t stream);
tpu_status tpu_memcpy_async(void *dst, const void *src, size_t bytes, tpu_copy_kind kind, tpu_stream_t stream);
/* The raw forms above take whole allocations: a device pointer must be the
 * start of a live allocation of at least `bytes` (else TPU_ERROR_INVALID_VALUE).
 *
 * Copy between two contiguous views (struct tpu_tensor, ops.h) of equal byte
 * size: base is the start of the whole storage (device address, or host
 * pointer for the host side), nbytes the storage's current size, offset in
 * elements. Each view is validated against its storage, and a device
 * storage against the allocator, before a byte moves (the same check
 * tpu_launch runs): an out-of-bounds view is an error, never a stray write.
 * Synchronous unless `async` (same rules as tpu_memcpy_async). Views borrowed. */
struct tpu_tensor;
tpu_status tpu_memcpy_view(const struct tpu_tensor *dst, const struct tpu_tensor *src, tpu_copy_kind kind,
                           tpu_stream_t stream, bool async);

#ifdef __cplusplus
}
#endif
#endif
