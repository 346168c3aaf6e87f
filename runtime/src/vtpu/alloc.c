/* alloc.c - the per-chip caching allocator.
 *
 * DESIGN
 * Two levels. The arena level hands out address ranges of the chip's memory
 * (first fit over a sorted, coalescing list of free ranges). The cache level
 * sits on top, the way PyTorch's CUDA allocator does: a freed block is not
 * returned to the arena but kept in a free list keyed by its rounded size
 * ("bin"), and handed out again for a request of the same bin.
 *
 * Reuse is stream-ordered. A block freed while work queued on its stream may
 * still read it is only reused by that same stream (whose queue order makes
 * it safe), or by another stream once the freeing stream has completed the
 * sequence number recorded at free time. tpu_mem_record_stream adds streams
 * whose completion must also be awaited.
 *
 * When the arena cannot satisfy a request, every cached block whose pending
 * work has completed is returned to the arena (pages released with
 * MADV_DONTNEED) and the request retried once; then TPU_ERROR_OUT_OF_MEMORY,
 * never an abort. "reserved" = bytes taken from the arena (live + cached).
 *
 * Fused Eager binds memory lazily. A block allocated while the eager mode
 * is Fused is "deferred": it has its address range (so views, checks and
 * recorded launches work unchanged) but is not counted as allocated, and
 * nothing touches its pages, until something writes it - a flushed window
 * that stores to it, a launch in another mode, a copy - which calls
 * tpu_alloc_materialize. A block freed while its stream's window is open
 * is noted in the window (tpu_window_note_free) and freed at once: its
 * stream may reuse it (the window's graph orders the accesses), another
 * stream only after the flushed window has run (its free sequence number is
 * the one the flush will take). A block a launch that cannot fuse wrote is
 * bound before it is freed; one never bound was a dead intermediate.
 * The cache flush before an allocation fails flushes the chip's windows
 * first (their held frees come back).
 */
#define _GNU_SOURCE
#include "vtpu/vtpu-impl.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define NBUCKETS 4096
#define MAX_USES 4

typedef struct block {
    uintptr_t off; /* offset in the arena */
    size_t size;   /* rounded size (bin) */
    size_t requested;
    bool live;
    bool deferred;       /* Fused Eager: not bound yet (not counted as allocated) */
    tpu_stream_t stream; /* allocation stream */
    int nuses;           /* extra streams + the seq each must reach before reuse */
    tpu_stream_t use_stream[MAX_USES];
    uint64_t use_seq[MAX_USES];
    uint64_t free_seq;           /* seq of `stream` at free time */
    struct block *hnext;         /* address hash chain */
    struct block *fnext;         /* free list chain */
    struct block *dnext, *dprev; /* list of deferred blocks */
} block;

typedef struct range {
    uintptr_t off;
    size_t size;
} range;

struct tpu_alloc {
    tpu_chip *chip;
    pthread_mutex_t mu;
    block *by_addr[NBUCKETS];
    block *free_bins[NBUCKETS]; /* hash of bin size -> chain of cached blocks */
    block *deferred;            /* live deferred blocks (Fused Eager), doubly linked */
    range *ranges;              /* free arena ranges, sorted by offset */
    size_t nranges, cap_ranges;
    tpu_mem_stats st;
};

static tpu_alloc_hook_fn alloc_hook;
static _Atomic long deferred_live; /* live deferred blocks, all chips */
static void *alloc_hook_user;

void tpu_mem_set_alloc_hook(tpu_alloc_hook_fn fn, void *user) {
    alloc_hook = fn;
    alloc_hook_user = user;
}

struct tpu_alloc *tpu_alloc_create(tpu_chip *chip) {
    struct tpu_alloc *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->chip = chip;
    pthread_mutex_init(&a->mu, NULL);
    a->cap_ranges = 64;
    a->ranges = malloc(a->cap_ranges * sizeof *a->ranges);
    if (!a->ranges) {
        free(a);
        return NULL;
    }
    a->ranges[0] = (range){0, chip->capacity};
    a->nranges = 1;
    a->st.capacity = chip->capacity;
    return a;
}

/* Round a request to its bin: 512 B steps up to 1 MiB, then 8 steps per power of two. */
static size_t round_size(size_t n) {
    if (n < 512) return 512;
    if (n <= ((size_t)1 << 20)) return (n + 511) & ~(size_t)511;
    int lg = 63 - __builtin_clzll((unsigned long long)n);
    size_t step = ((size_t)1 << lg) / 8;
    return (n + step - 1) / step * step;
}

static unsigned hash_ptr(uintptr_t x) { return (unsigned)((x >> 9) * 2654435761u) % NBUCKETS; }
static unsigned hash_size(size_t x) { return (unsigned)((x >> 9) * 40503u) % NBUCKETS; }

/* --- arena level --- */

static bool arena_take(struct tpu_alloc *a, size_t size, uintptr_t *off) {
    for (size_t i = 0; i < a->nranges; i++) {
        range *r = &a->ranges[i];
        if (r->size < size) continue;
        *off = r->off;
        r->off += size;
        r->size -= size;
        if (r->size == 0) {
            memmove(r, r + 1, (a->nranges - i - 1) * sizeof *r);
            a->nranges--;
        }
        return true;
    }
    return false;
}

static bool arena_give(struct tpu_alloc *a, uintptr_t off, size_t size) {
    size_t i = 0;
    while (i < a->nranges && a->ranges[i].off < off) i++;
    bool merge_prev = i > 0 && a->ranges[i - 1].off + a->ranges[i - 1].size == off;
    bool merge_next = i < a->nranges && off + size == a->ranges[i].off;
    /* Release the physical pages: device memory that is not reserved costs no RAM. */
    madvise(a->chip->arena + off, size, MADV_DONTNEED);
    if (merge_prev && merge_next) {
        a->ranges[i - 1].size += size + a->ranges[i].size;
        memmove(&a->ranges[i], &a->ranges[i + 1], (a->nranges - i - 1) * sizeof(range));
        a->nranges--;
    } else if (merge_prev) {
        a->ranges[i - 1].size += size;
    } else if (merge_next) {
        a->ranges[i].off = off;
        a->ranges[i].size += size;
    } else {
        if (a->nranges == a->cap_ranges) {
            range *nr = realloc(a->ranges, a->cap_ranges * 2 * sizeof(range));
            if (!nr) return false;
            a->ranges = nr;
            a->cap_ranges *= 2;
        }
        memmove(&a->ranges[i + 1], &a->ranges[i], (a->nranges - i) * sizeof(range));
        a->ranges[i] = (range){off, size};
        a->nranges++;
    }
    return true;
}

/* --- cache level --- */

static bool block_ready_for(const block *b, tpu_stream_t s) {
    if (b->stream != s && tpu_stream_completed(b->stream) < b->free_seq) return false;
    for (int k = 0; k < b->nuses; k++)
        if (b->use_stream[k] != s && tpu_stream_completed(b->use_stream[k]) < b->use_seq[k]) return false;
    return true;
}

static block *cache_take(struct tpu_alloc *a, size_t size, tpu_stream_t s) {
    block **pp = &a->free_bins[hash_size(size)];
    for (; *pp; pp = &(*pp)->fnext) {
        block *b = *pp;
        if (b->size == size && block_ready_for(b, s)) {
            *pp = b->fnext;
            b->fnext = NULL;
            return b;
        }
    }
    return NULL;
}

static void unlink_addr(struct tpu_alloc *a, block *b) {
    block **pp = &a->by_addr[hash_ptr(b->off)];
    while (*pp && *pp != b) pp = &(*pp)->hnext;
    if (*pp) *pp = b->hnext;
}

/* Return cached blocks to the arena; with `wait`, blocks with pending work too
 * (the caller has synchronized the device). */
static void cache_flush(struct tpu_alloc *a, bool all) {
    for (int h = 0; h < NBUCKETS; h++) {
        block **pp = &a->free_bins[h];
        while (*pp) {
            block *b = *pp;
            if (!all && !block_ready_for(b, NULL)) {
                pp = &b->fnext;
                continue;
            }
            *pp = b->fnext;
            unlink_addr(a, b);
            arena_give(a, b->off, b->size);
            a->st.reserved -= b->size;
            free(b);
        }
    }
}

static uintptr_t devaddr(tpu_chip *c, uintptr_t off) { return ((uintptr_t)(c->index + 1) << TPU_DEVADDR_SHIFT) + off; }

static void fmt_bytes(char *buf, size_t n, size_t bytes) {
    if (bytes >= ((size_t)1 << 30))
        snprintf(buf, n, "%.2f GiB", bytes / 1073741824.0);
    else if (bytes >= ((size_t)1 << 20))
        snprintf(buf, n, "%.2f MiB", bytes / 1048576.0);
    else
        snprintf(buf, n, "%zu bytes", bytes);
}

/* The deferred list (caller holds a->mu). */
static void defer_link(struct tpu_alloc *a, block *b) {
    b->dprev = NULL;
    b->dnext = a->deferred;
    if (a->deferred) a->deferred->dprev = b;
    a->deferred = b;
    atomic_fetch_add_explicit(&deferred_live, 1, memory_order_relaxed);
}

static void defer_unlink(struct tpu_alloc *a, block *b) {
    if (b->dprev)
        b->dprev->dnext = b->dnext;
    else
        a->deferred = b->dnext;
    if (b->dnext) b->dnext->dprev = b->dprev;
    b->deferred = false;
    atomic_fetch_sub_explicit(&deferred_live, 1, memory_order_relaxed);
}

/* Count a deferred block as allocated (caller holds a->mu). */
static void bind_locked(struct tpu_alloc *a, block *b) {
    defer_unlink(a, b);
    a->st.allocated += b->size;
    if (a->st.allocated > a->st.peak_allocated) a->st.peak_allocated = a->st.allocated;
}

tpu_status tpu_malloc(int dev, size_t bytes, tpu_stream_t stream, void **out) {
    tpu_chip *c;
    tpu_status s = tpu_chip_get(dev, &c);
    if (s) return s;
    *out = NULL;
    if (bytes == 0) return TPU_OK;
    if (!stream) stream = tpu_stream_current(dev);
    struct tpu_alloc *a = c->alloc;
    if (bytes > c->capacity) goto oom_unlocked;
    size_t size = round_size(bytes);
    if (alloc_hook && !alloc_hook(dev, bytes, alloc_hook_user)) goto oom_unlocked;
    pthread_mutex_lock(&a->mu);
    block *b = cache_take(a, size, stream);
    if (!b) {
        uintptr_t off = 0;
        bool got = arena_take(a, size, &off);
        if (!got) {
            /* One cache flush, as on hardware: pending blocks need the device idle.
             * Fused Eager's windows go first: their held frees come back. */
            pthread_mutex_unlock(&a->mu);
            tpu_windows_flush_dev(dev, TPU_FLUSH_MEMORY);
            tpu_device_synchronize_all(dev);
            pthread_mutex_lock(&a->mu);
            a->st.num_cache_flushes++;
            cache_flush(a, false);
            got = arena_take(a, size, &off);
        }
        if (!got) {
            pthread_mutex_unlock(&a->mu);
            goto oom_unlocked;
        }
        b = calloc(1, sizeof *b);
        if (!b) {
            arena_give(a, off, size);
            pthread_mutex_unlock(&a->mu);
            goto oom_unlocked;
        }
        b->off = off;
        b->size = size;
        unsigned h = hash_ptr(off);
        b->hnext = a->by_addr[h];
        a->by_addr[h] = b;
        a->st.reserved += size;
        if (a->st.reserved > a->st.peak_reserved) a->st.peak_reserved = a->st.reserved;
    }
    b->live = true;
    b->requested = bytes;
    b->stream = stream;
    b->nuses = 0;
    b->deferred = tpu_get_eager_mode() == TPU_EAGER_FUSED;
    if (b->deferred)
        defer_link(a, b);
    else
        a->st.allocated += size;
    a->st.num_allocs++;
    if (a->st.allocated > a->st.peak_allocated) a->st.peak_allocated = a->st.allocated;
    pthread_mutex_unlock(&a->mu);
    *out = (void *)devaddr(c, b->off);
    return TPU_OK;

oom_unlocked:
    {
        pthread_mutex_lock(&a->mu);
        a->st.num_ooms++;
        size_t alloc = a->st.allocated, res = a->st.reserved;
        pthread_mutex_unlock(&a->mu);
        char req[32], cap[32], fr[32], al[32], rs[32];
        fmt_bytes(req, sizeof req, bytes);
        fmt_bytes(cap, sizeof cap, c->capacity);
        fmt_bytes(fr, sizeof fr, c->capacity - res);
        fmt_bytes(al, sizeof al, alloc);
        fmt_bytes(rs, sizeof rs, res);
        return tpu_set_error(TPU_ERROR_OUT_OF_MEMORY,
                             "TPU out of memory. Tried to allocate %s (%zu bytes). tpu:%d has a total capacity of %s "
                             "(%zu bytes) of which %s is free. Of the allocated memory %s is allocated by the "
                             "caching allocator and %s is reserved.",
                             req, bytes, dev, cap, c->capacity, fr, al, rs);
    }
}

static block *find_block(struct tpu_alloc *a, uintptr_t off) {
    for (block *b = a->by_addr[hash_ptr(off)]; b; b = b->hnext)
        if (b->off == off) return b;
    return NULL;
}

static tpu_status lookup(const void *devptr, tpu_chip **c, struct tpu_alloc **a, uintptr_t *off) {
    int dev = tpu_mem_device_of(devptr);
    if (dev < 0) return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%p is not a tpu device address", devptr);
    tpu_status s = tpu_chip_get(dev, c);
    if (s) return s;
    *a = (*c)->alloc;
    *off = tpu_devaddr_offset(devptr);
    return TPU_OK;
}

/* The block at devptr (NULL if none) with its allocator locked (*a; NULL
 * and nothing locked if devptr is not a device address: *st says why). */
static block *lock_block(const void *devptr, struct tpu_alloc **a, tpu_status *st) {
    tpu_chip *c = NULL;
    uintptr_t off = 0;
    *a = NULL;
    *st = lookup(devptr, &c, a, &off);
    if (*st) {
        *a = NULL;
        return NULL;
    }
    pthread_mutex_lock(&(*a)->mu);
    return find_block(*a, off);
}

/* Free live block b (caller holds a->mu); returns the bytes never bound. */
static size_t free_locked(struct tpu_alloc *a, block *b, bool pending) {
    b->live = false;
    b->free_seq = tpu_stream_enqueued(b->stream) + (pending ? 1 : 0);
    for (int k = 0; k < b->nuses; k++) b->use_seq[k] = tpu_stream_enqueued(b->use_stream[k]);
    size_t never = 0;
    if (b->deferred) {
        defer_unlink(a, b);
        never = b->size;
    } else {
        a->st.allocated -= b->size;
    }
    a->st.num_frees++;
    unsigned h = hash_size(b->size);
    b->fnext = a->free_bins[h];
    a->free_bins[h] = b;
    return never;
}

/* Free block at devptr now; `pending`: an open window of its stream still
 * holds work on it (queued as the stream's next command at the flush). */
static tpu_status free_now(void *devptr, bool pending) {
    struct tpu_alloc *a;
    tpu_status s;
    block *b = lock_block(devptr, &a, &s);
    if (!a) return s;
    if (!b || !b->live) {
        pthread_mutex_unlock(&a->mu);
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "tpu_free: %p is not a live allocation", devptr);
    }
    size_t never = free_locked(a, b, pending);
    pthread_mutex_unlock(&a->mu);
    if (never) tpu_fused_note_never(never);
    return TPU_OK;
}

tpu_status tpu_free(void *devptr) {
    if (!devptr) return TPU_OK;
    if (tpu_is_forked_child()) return TPU_OK; /* parent's memory: nothing to do */
    struct tpu_alloc *a;
    tpu_status s;
    block *b = lock_block(devptr, &a, &s);
    if (!a) return s;
    if (b && b->live && !b->nuses && !tpu_window_open(b->stream)) {
        /* The common case (Strict Eager; nothing recorded on its stream): at once, one lock. */
        size_t never = free_locked(a, b, false);
        pthread_mutex_unlock(&a->mu);
        if (never) tpu_fused_note_never(never);
        return TPU_OK;
    }
    tpu_stream_t stream = b && b->live ? b->stream : NULL;
    size_t bytes = b && b->live ? b->size : 0;
    bool fresh = b && b->live && b->deferred;
    int nuses = b && b->live ? b->nuses : 0;
    tpu_stream_t uses[MAX_USES];
    for (int k = 0; k < nuses; k++) uses[k] = b->use_stream[k];
    pthread_mutex_unlock(&a->mu);
    /* Streams it was recorded on: their recorded work must be queued before the free counts it. */
    for (int k = 0; k < nuses; k++) tpu_window_flush(uses[k], TPU_FLUSH_STREAM_WAIT);
    /* Its stream's window is open: the window may still read or write it. */
    bool kernel_written = false;
    bool pending = stream && tpu_window_note_free(stream, devptr, bytes, fresh, &kernel_written);
    if (kernel_written) tpu_alloc_materialize(devptr); /* a kernel writes it: it exists */
    return free_now(devptr, pending);
}

bool tpu_alloc_any_deferred(void) { return atomic_load_explicit(&deferred_live, memory_order_relaxed) > 0; }

void tpu_alloc_materialize(const void *devptr) {
    struct tpu_alloc *a;
    tpu_status s;
    if (!tpu_alloc_any_deferred() || tpu_mem_device_of(devptr) < 0) return;
    block *b = lock_block(devptr, &a, &s);
    if (!a) return;
    if (b && b->live && b->deferred) bind_locked(a, b);
    pthread_mutex_unlock(&a->mu);
}

size_t tpu_alloc_deferred_size(const void *devptr) {
    struct tpu_alloc *a;
    tpu_status s;
    if (!tpu_alloc_any_deferred() || tpu_mem_device_of(devptr) < 0) return 0;
    block *b = lock_block(devptr, &a, &s);
    if (!a) return 0;
    size_t n = b && b->live && b->deferred ? b->size : 0;
    pthread_mutex_unlock(&a->mu);
    return n;
}

void tpu_alloc_note_window_peak(int dev, size_t bytes) {
    tpu_chip *c;
    if (!bytes || tpu_chip_get(dev, &c)) return;
    struct tpu_alloc *a = c->alloc;
    pthread_mutex_lock(&a->mu);
    if (a->st.allocated + bytes > a->st.peak_allocated) a->st.peak_allocated = a->st.allocated + bytes;
    pthread_mutex_unlock(&a->mu);
}

void tpu_alloc_bind_all(int dev) {
    tpu_chip *c;
    if (!tpu_alloc_any_deferred() || tpu_chip_get(dev, &c)) return;
    struct tpu_alloc *a = c->alloc;
    pthread_mutex_lock(&a->mu);
    while (a->deferred) bind_locked(a, a->deferred);
    pthread_mutex_unlock(&a->mu);
}

bool tpu_alloc_is_bound(const void *devptr) {
    struct tpu_alloc *a;
    tpu_status s;
    if (tpu_mem_device_of(devptr) < 0) return false;
    block *b = lock_block(devptr, &a, &s);
    if (!a) return false;
    bool bound = b && b->live && !b->deferred;
    pthread_mutex_unlock(&a->mu);
    return bound;
}

static tpu_status not_live(const void *devptr, size_t nbytes, const char *what, int k, bool live, size_t have) {
    if (!live)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE,
                             "%s: operand %d: %p is not the start of a live tpu allocation "
                             "(freed, or a pointer into the middle of one)",
                             what, k, devptr);
    if (nbytes > have)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE,
                             "%s: operand %d: storage of %zu bytes claimed, but the "
                             "allocation at %p holds %zu bytes",
                             what, k, nbytes, devptr, have);
    return TPU_OK;
}

/* The storage [devptr, devptr + nbytes) must be a live block of at least
 * nbytes (requested size): see view.c. */
tpu_status tpu_alloc_check_live(const void *devptr, size_t nbytes, const char *what, int k) {
    tpu_chip *c = NULL;
    struct tpu_alloc *a = NULL;
    uintptr_t off = 0;
    tpu_status s = lookup(devptr, &c, &a, &off);
    if (s) return s;
    pthread_mutex_lock(&a->mu);
    block *b = find_block(a, off);
    bool live = b && b->live;
    size_t have = live ? b->requested : 0;
    pthread_mutex_unlock(&a->mu);
    return not_live(devptr, nbytes, what, k, live, have);
}

tpu_status tpu_alloc_check_live_all(int dev, const tpu_tensor *t, int n, const char *what) {
    tpu_chip *c;
    tpu_status s = tpu_chip_get(dev, &c);
    if (s) return s;
    struct tpu_alloc *a = c->alloc;
    bool live[TPU_MAX_OPERANDS];
    size_t have[TPU_MAX_OPERANDS];
    pthread_mutex_lock(&a->mu);
    for (int k = 0; k < n; k++) {
        if (t[k].is_scalar || !t[k].base) continue;
        block *b = find_block(a, tpu_devaddr_offset(t[k].base));
        live[k] = b && b->live;
        have[k] = live[k] ? b->requested : 0;
    }
    pthread_mutex_unlock(&a->mu);
    for (int k = 0; k < n; k++)
        if (!t[k].is_scalar && t[k].base && (s = not_live(t[k].base, t[k].nbytes, what, k, live[k], have[k]))) return s;
    return TPU_OK;
}

tpu_status tpu_mem_record_stream(void *devptr, tpu_stream_t stream) {
    tpu_chip *c = NULL;
    struct tpu_alloc *a = NULL;
    uintptr_t off = 0;
    tpu_status s = lookup(devptr, &c, &a, &off);
    if (s) return s;
    pthread_mutex_lock(&a->mu);
    block *b = find_block(a, off);
    bool overflow = false;
    if (b && b->live && stream != b->stream) {
        int k = 0;
        while (k < b->nuses && b->use_stream[k] != stream) k++;
        if (k == b->nuses) {
            if (k < MAX_USES) {
                b->use_stream[k] = stream;
                b->nuses++;
            } else
                overflow = true;
        }
    }
    pthread_mutex_unlock(&a->mu);
    /* Too many streams to track: fall back to waiting for this one now. */
    if (overflow) return tpu_stream_synchronize(stream);
    return b ? TPU_OK : tpu_set_error(TPU_ERROR_INVALID_VALUE, "%p is not a live allocation", devptr);
}

tpu_status tpu_mem_get_stats(int dev, tpu_mem_stats *out) {
    tpu_chip *c;
    tpu_status s = tpu_chip_get(dev, &c);
    if (s) return s;
    /* Fused Eager: the figures count what is alive now, recorded work included. */
    if ((s = tpu_windows_flush_dev(dev, TPU_FLUSH_MEMORY_STATS))) return s;
    tpu_alloc_bind_all(dev);
    pthread_mutex_lock(&c->alloc->mu);
    *out = c->alloc->st;
    pthread_mutex_unlock(&c->alloc->mu);
    return TPU_OK;
}

tpu_status tpu_mem_reset_peak(int dev) {
    tpu_chip *c;
    tpu_status s = tpu_chip_get(dev, &c);
    if (s) return s;
    pthread_mutex_lock(&c->alloc->mu);
    c->alloc->st.peak_allocated = c->alloc->st.allocated;
    c->alloc->st.peak_reserved = c->alloc->st.reserved;
    pthread_mutex_unlock(&c->alloc->mu);
    return TPU_OK;
}

tpu_status tpu_mem_empty_cache(int dev) {
    tpu_chip *c;
    tpu_status s = tpu_chip_get(dev, &c);
    if (s) return s;
    tpu_device_synchronize_all(dev);
    pthread_mutex_lock(&c->alloc->mu);
    cache_flush(c->alloc, true);
    pthread_mutex_unlock(&c->alloc->mu);
    return TPU_OK;
}

tpu_status tpu_mem_get_info(int dev, size_t *free_bytes, size_t *total_bytes) {
    tpu_mem_stats st;
    tpu_status s = tpu_mem_get_stats(dev, &st);
    if (s) return s;
    *free_bytes = st.capacity - st.reserved;
    *total_bytes = st.capacity;
    return TPU_OK;
}
