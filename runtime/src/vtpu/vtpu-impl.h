/* vtpu-impl.h - internals shared by the software device's files
 * (device.c, alloc.c, stream.c, copy.c, launch.c). */
#ifndef TPU_VTPU_IMPL_H
#define TPU_VTPU_IMPL_H

#include "tpu/tpu.h"
#include "base/base-impl.h"
#include "kernels/kernels-impl.h"
#include "graph/graph-impl.h"
#include "coll/coll-impl.h"
#include <pthread.h>
#include <stdatomic.h>

#define TPU_MAX_DEVICES 16
/* Device addresses of chip d start at (d + 1) << 44: never host-mapped, so a
 * host dereference of a device pointer faults instead of silently working. */
#define TPU_DEVADDR_SHIFT 44
/* The offset of a device address inside its chip's memory. */
static inline uintptr_t tpu_devaddr_offset(const void *devptr) {
    return (uintptr_t)devptr & (((uintptr_t)1 << TPU_DEVADDR_SHIFT) - 1);
}

typedef struct tpu_chip {
    int index;
    size_t capacity;
    char *arena;        /* host mapping of the chip's memory (lazy) */
    _Atomic bool ready; /* brought up: every field above and below is set (published with release) */
    tpu_status init_status;
    tpu_stream_t default_stream;
    struct tpu_alloc *alloc; /* caching allocator state (alloc.c) */
} tpu_chip;

/* Bring chip `dev` up on first use; checks index and fork state. */
tpu_status tpu_chip_get(int dev, tpu_chip **out);
/* Host address of a device address (NULL if not a valid device address). */
void *tpu_dev_to_host(const void *devptr);
/* Fail with TPU_ERROR_FORKED if this is a forked child of an initialized parent. */
tpu_status tpu_check_fork(void);

/* Configuration (device.c): every environment variable the runtime reads,
 * parsed strictly. README "Environment" documents each one and its range. */
typedef struct tpu_config {
    int num_devices;  /* TPU_NUM_DEVICES, 1..TPU_MAX_DEVICES (default 1) */
    size_t hbm_bytes; /* TPU_HBM_BYTES, rounded down to 4 KiB (default 16 GiB) */
    int num_workers;  /* TPU_NUM_WORKERS, 1..64; 0 = unset (online CPUs, at most 8) */
    int mxu_choice;   /* TPU_MXU: a tpu_mxu_choice (kernels-impl.h) */
} tpu_config;
/* Parse the variables read through `get` (getenv, or a table in tests). A bad
 * value: TPU_ERROR_INVALID_VALUE naming each bad variable, its value and what
 * is accepted; *out then holds defaults for the bad fields. */
tpu_status tpu_config_parse(const char *(*get)(const char *name), tpu_config *out);
/* The process's configuration, parsed on first call (never NULL); *st (if
 * not NULL) receives the parse status. Entries needing a chip use tpu_init(). */
const tpu_config *tpu_config_get(tpu_status *st);

/* Compute pool (pool.c). Threads in the pool, the caller included (starts it). */
int tpu_num_workers(void);
/* Hand the pool to the kernels floor (tpu_kernels_set_compute); called once,
 * when the configuration is first read. */
void tpu_pool_register(int mxu_choice);

/* Allocator (alloc.c). */
struct tpu_alloc *tpu_alloc_create(tpu_chip *chip);
/* TPU_OK if devptr starts a live allocation holding at least nbytes. `what`
 * and `k` (operand index) name the caller in the error. */
tpu_status tpu_alloc_check_live(const void *devptr, size_t nbytes, const char *what, int k);
/* The same for the n (at most TPU_MAX_OPERANDS) device views of one launch on
 * chip `dev`, under one lock of its allocator; scalars and empty views
 * (base NULL) pass. */
tpu_status tpu_alloc_check_live_all(int dev, const tpu_tensor *t, int n, const char *what);
/* Fused Eager binds memory lazily: a block allocated in Fused Eager is
 * "deferred" (not counted as allocated, its pages never touched) until
 * something writes it or finds it alive: a flushed window that stores to
 * it, the end of any flush of its chip, a launch in another mode, a copy. tpu_alloc_materialize counts a deferred block
 * (no-op for anything else); tpu_alloc_any_deferred is a cheap check that
 * some deferred block exists (relaxed). tpu_alloc_is_bound: devptr starts
 * a live block that is not deferred. */
void tpu_alloc_materialize(const void *devptr);
/* Bind every live deferred block of chip `dev` (a flush: what is alive now exists). */
void tpu_alloc_bind_all(int dev);
/* A window being flushed takes `bytes` beyond what is allocated now at its
 * fullest (tpu_gprog_mem_peak): the peak counts allocated + bytes. */
void tpu_alloc_note_window_peak(int dev, size_t bytes);
/* The size of the live block at devptr if it is not bound yet (Fused Eager:
 * allocated in the open window), else 0. */
size_t tpu_alloc_deferred_size(const void *devptr);
bool tpu_alloc_any_deferred(void);
bool tpu_alloc_is_bound(const void *devptr);
/* Device address of host address `host` inside chip `dev`'s arena. */
void *tpu_host_to_dev(int dev, const void *host);

/* Views (view.c): validate a view against its storage (and, for a device
 * view, the storage against the allocator) and translate its base to a host
 * address. *dev is the device seen so far (-1: none); a view on another
 * device is TPU_ERROR_DEVICE_MISMATCH. Scalars and empty views pass. */
tpu_status tpu_view_check(const char *what, int k, tpu_tensor *t, bool device, int *dev);
/* tpu_view_check of a launch's n device views, the allocator locked once for all. */
tpu_status tpu_view_check_all(const char *what, tpu_tensor *t, int n, int *dev);

/* Fused Eager windows (window.c). Each stream has one: in Fused Eager a
 * launch is recorded into its stream's window (a graph) instead of queued;
 * anything else that touches the stream or device memory in order (a copy,
 * an event, a wait, a synchronize or query, a mode switch, a full window,
 * memory pressure, an explicit tpu_flush) first flushes it: the graph is
 * compiled, its stored outputs are bound, and the program is queued as one
 * command. A block freed while its stream's window is open is freed at once
 * (its stream may reuse it in the same window: the graph orders accesses to
 * a storage, frees included); the window notes where the free happened.
 * `n` mirrors g.n for lock-free emptiness checks; `kw` is the set of
 * storages written by launches that cannot fuse (a kernel will write them,
 * so they are bound when freed). */
/* A map from storage base (host address) to a nonzero 32-bit value, open
 * addressing, for a window's bookkeeping (remat.c). get: 0 if absent; put:
 * false if out of host memory (the entry is not kept); clear keeps the room. */
typedef struct tpu_rmap {
    const void **keys;
    uint32_t *vals;
    size_t cap, n;
} tpu_rmap;
uint32_t tpu_rmap_get(const tpu_rmap *m, const void *k);
bool tpu_rmap_put(tpu_rmap *m, const void *k, uint32_t v);
void tpu_rmap_clear(tpu_rmap *m);

#define TPU_REMAT_DISTANCE    64 /* nodes between a value's writer and a reader that recomputes it */
#define TPU_REMAT_MAX_NODES   16 /* launches in one recipe */
#define TPU_REMAT_MAX_LEAVES  6  /* storages a recipe reads */
#define TPU_REMAT_MAX_SCRATCH 32 /* scratch blocks one launch's recomputations take */

/* How to recompute storage `base`: the window's nodes[] that computed the
 * dense element range [lo, hi) it holds now (ascending; the last wrote it),
 * from leaves whose write stamps must still be leaf_ev[]. */
typedef struct tpu_recipe {
    const void *base;
    int64_t lo, hi;
    int32_t dtype;
    int writer;  /* the node that wrote it */
    bool kread;  /* a near kernel read recomputed it once already */
    bool random; /* a node is a Philox fill (costly: a near kernel read does not recompute it) */
    int nnodes, nleaves;
    int nodes[TPU_REMAT_MAX_NODES];
    const void *leaf[TPU_REMAT_MAX_LEAVES];
    uint32_t leaf_ev[TPU_REMAT_MAX_LEAVES];
} tpu_recipe;

typedef struct tpu_window {
    pthread_mutex_t mu;
    tpu_graph g;
    _Atomic int n;
    tpu_rmap kw;    /* storages written by launches that cannot fuse (value 1) */
    size_t bytes;   /* of the results recorded (TPU_WINDOW_BYTES_PER_CHIP) */
    uint64_t gen;   /* flushes so far (a recording that dropped the lock checks it) */
    tpu_rmap rm_ev; /* storage -> stamp of its last write or free in the window */
    tpu_rmap rm_rc; /* storage -> 1 + index into rc of its recipe (0: none) */
    tpu_recipe *rc;
    int nrc, caprc;
    uint32_t rm_stamp;
    bool rm_broken; /* a map ran out of host memory: no recomputation until the flush */
} tpu_window;

/* A launch's recomputations (tpu_remat_plan): recipes red[j].r, their
 * scratch blocks from red[j].first in size[]; operand[k]: which of them
 * operand k reads instead (-1: its own storage). */
typedef struct tpu_remat_plan {
    int nred, nscratch;
    struct {
        int r, first;
        bool near; /* a kernel reading it within the distance (tpu_recipe.kread) */
    } red[TPU_MAX_OPERANDS];
    size_t size[TPU_REMAT_MAX_SCRATCH];
    int operand[TPU_MAX_OPERANDS];
} tpu_remat_plan;

/* remat.c; every call with the window's lock held. Scratch blocks needed
 * to recompute what launch `a` reads (0: none; the plan says which). */
int tpu_remat_prepare(tpu_window *w, const tpu_kargs *a, tpu_remat_plan *rp);
/* Append the recipes' nodes (host[] the scratch blocks' host bases, in
 * plan order) and point a's operands at the copies; false: host memory. */
bool tpu_remat_emit(tpu_window *w, const tpu_remat_plan *rp, void *const *host, tpu_kargs *a);
/* Launch `a` was appended as nodes[node] (`redirected`: it reads copies). */
void tpu_remat_recorded(tpu_window *w, const tpu_kargs *a, int node, bool redirected);
/* The storage at `host` was freed in the window. */
void tpu_remat_note_free(tpu_window *w, const void *host);
/* The window was flushed: no recipes. */
void tpu_remat_reset(tpu_window *w);
void tpu_remat_get_stats(uint64_t *reads, uint64_t *nodes);
void tpu_remat_reset_stats(void);
/* Whether launch `a` may run inside a fused group (window.c). */
bool tpu_window_may_fuse(const tpu_kargs *a);
tpu_window *tpu_stream_window(tpu_stream_t s);
void tpu_window_init(tpu_window *w);
/* Record launch `a` (validated, host addresses) into s's window. */
tpu_status tpu_window_record(tpu_stream_t s, const tpu_kargs *a);
/* Flush s's window (nothing to do if empty). */
tpu_status tpu_window_flush(tpu_stream_t s, tpu_flush_cause cause);
/* Flush every window of chip `dev` (every chip if dev < 0). */
tpu_status tpu_windows_flush_dev(int dev, tpu_flush_cause cause);
/* s's window holds recorded launches (a relaxed look: the caller decides what to lock). */
bool tpu_window_open(tpu_stream_t s);
/* If s's window is open, note the free of the block at device address
 * `devptr` there (fresh: not bound yet) and return true (*kernel_written: a
 * recorded launch that cannot fuse writes it); else false. */
bool tpu_window_note_free(tpu_stream_t s, void *devptr, size_t bytes, bool fresh, bool *kernel_written);
/* Count bytes freed without ever being bound (fused_stats). */
void tpu_fused_note_never(size_t bytes);
/* Whether any open window of chip `dev` writes the storage at `devptr`. */
bool tpu_windows_write(int dev, const void *devptr);

/* Streams (stream.c). */
typedef enum tpu_cmd_kind {
    TPU_CMD_KERNEL,
    TPU_CMD_COPY,
    TPU_CMD_EVENT,
    TPU_CMD_WAIT,
    TPU_CMD_CALLBACK,
    TPU_CMD_GRAPH,
    TPU_CMD_COLL
} tpu_cmd_kind;
typedef struct tpu_cmd {
    tpu_cmd_kind kind;
    struct tpu_cmd *next;
    uint64_t seq;   /* position in its stream, set when queued */
    bool cancelled; /* a copy given up by an interrupted host wait: skipped (guarded by the queue's lock) */
    union {
        tpu_kargs k;
        struct {
            void *dst;
            const void *src;
            size_t bytes;
        } copy;
        struct {
            tpu_event_t ev;
            uint64_t gen;
        } event;
        struct {
            tpu_stream_t stream;
            uint64_t seq;
        } wait;
        struct {
            tpu_host_fn fn;
            void *user;
        } cb;
        tpu_gprog *graph; /* a flushed window's program (owned) */
        struct {
            tpu_comm_t comm;
            struct tpu_coll_job *job; /* owned (collective.c) */
        } coll;
    } u;
} tpu_cmd;

tpu_cmd *tpu_cmd_new(tpu_cmd_kind kind);
/* Collectives (collective.c): run a queued TPU_CMD_COLL on its worker; on
 * failure the text for the queue's sticky error goes in full. */
tpu_status tpu_coll_cmd_run(tpu_cmd *c, char *full, size_t n);
/* Queue a command (takes ownership); returns its sequence number in *seq.
 * Flushes the stream's Fused Eager window first; the _raw form does not
 * (the flush itself queues with it). */
tpu_status tpu_stream_enqueue(tpu_stream_t s, tpu_cmd *c, uint64_t *seq);
tpu_status tpu_stream_enqueue_raw(tpu_stream_t s, tpu_cmd *c, uint64_t *seq);
/* Queues of chip `dev` (the default stream first); returns how many. */
int tpu_stream_queues(int dev, tpu_stream_t *out, int max);
/* Run copy `c` on the calling thread if `s` has nothing queued, running or
 * recorded, keeping stream order; releases c. Returns false (c untouched)
 * if the stream is busy or c is not a copy. (Kernels: tpu_stream_run_kernel
 * and tpu_stream_run_small.) */
bool tpu_stream_try_inline_copy(tpu_stream_t s, tpu_cmd *c);
/* Queue a kernel launch: its arguments (a->n operands) are copied into a
 * command block the queue recycles. Flushes the stream's window first. */
tpu_status tpu_stream_enqueue_kernel(tpu_stream_t s, const tpu_kargs *a);
/* Debug Eager's launch: run `a` on this thread if `s` is idle (errors
 * returned here, not made sticky), else queue it and synchronize. */
tpu_status tpu_stream_run_kernel(tpu_stream_t s, tpu_kargs *a);
/* Strict Eager's launch of a small kernel: if `s` is idle, run it on this
 * thread now (handing it to the worker costs more than it does) and return
 * true; its error, if any, is made sticky, so it raises at the same later
 * point as a queued kernel's. False: nothing was done. */
bool tpu_stream_run_small(tpu_stream_t s, tpu_kargs *a);
uint64_t tpu_stream_completed(tpu_stream_t s); /* acquire */
uint64_t tpu_stream_enqueued(tpu_stream_t s);
/* Set up chip `dev`'s fixed pool of hardware queues; returns its default
 * stream (device.c calls this once per chip). */
tpu_stream_t tpu_stream_pool_init(int dev);
/* Wait until `s` has completed `seq`; on return the command at `seq` has run
 * or will never run: if a host interrupt arrives (tpu_set_interrupt_check)
 * while `seq` is a copy still queued, the copy is cancelled and the calling
 * thread is left interrupted, so its next synchronizing call returns
 * TPU_ERROR_INTERRUPTED. Any other command is waited for. */
void tpu_stream_wait_seq(tpu_stream_t s, uint64_t seq);
/* Sync all streams of a device (no error reporting) - used by empty_cache. */
tpu_status tpu_device_synchronize_all(int dev);

#endif
