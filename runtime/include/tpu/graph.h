/* graph.h - Fused Eager (DeferAndFuse): windows, flushes, statistics.
 *
 * In Fused Eager (tpu_set_eager_mode(TPU_EAGER_FUSED)) tpu_launch records
 * the launch into the current stream's window instead of queueing it; the
 * launch's arguments are still validated at the call. A window is flushed -
 * compiled (elementwise chains fused into one pass, dead intermediates never
 * stored), its outputs bound to memory, and queued as one command - before
 * anything else that needs its work in order: a copy, an event record, a
 * stream wait, a synchronize or query, a mode switch, a full window
 * (TPU_WINDOW_MAX_OPS), an allocation that would otherwise fail, or
 * tpu_flush(), tpu_mem_get_stats(). Memory allocated in Fused Eager is
 * bound lazily: it counts as allocated (tpu_mem_get_stats) from the first
 * flush, copy or launch in another mode that finds it alive, and a block
 * freed before the flush whose contents nothing else reads is never
 * materialized: never counted, its pages never touched.
 * Thread safety: all functions are thread-safe. */
#ifndef TPU_GRAPH_H
#define TPU_GRAPH_H

#include <stdbool.h>
#include <stdint.h>
#include "status.h"
#include "mem.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPU_WINDOW_MAX_OPS 4096 /* launches one window records before it flushes */
/* A window also flushes once the results it recorded (outputs' views, dead
 * ones included) add up to TPU_WINDOW_BYTES_PER_CHIP times the chip's
 * memory size (TPU_HBM_BYTES): most of them die inside the window and never
 * take memory, and a lower cap flushes a training step's window before its
 * intermediates die, so they are stored (GPT-2 small at b8 s256 records over
 * 16 GiB per step; at a 16 GiB cap its peak memory went from 0.67x Strict's
 * to 0.83x). */
#define TPU_WINDOW_BYTES_PER_CHIP 4

/* Why a window was flushed. */
typedef enum tpu_flush_cause {
    TPU_FLUSH_SYNCHRONIZE,  /* stream / device synchronize */
    TPU_FLUSH_QUERY,        /* stream query */
    TPU_FLUSH_COPY,         /* a copy (to or from the host, or between devices) */
    TPU_FLUSH_EVENT,        /* event record */
    TPU_FLUSH_STREAM_WAIT,  /* another stream's event waited for */
    TPU_FLUSH_CALLBACK,     /* host callback queued */
    TPU_FLUSH_MODE_SWITCH,  /* tpu_set_eager_mode */
    TPU_FLUSH_WINDOW_FULL,  /* TPU_WINDOW_MAX_OPS reached */
    TPU_FLUSH_MEMORY,       /* an allocation would fail: flush, then retry */
    TPU_FLUSH_EXPLICIT,     /* tpu_flush */
    TPU_FLUSH_MEMORY_STATS, /* tpu_mem_get_stats: the figures count what is alive */
    TPU_FLUSH_WINDOW_BYTES, /* TPU_WINDOW_BYTES_PER_CHIP x the chip's memory of results recorded */
    TPU_FLUSH_GRAPH_END,    /* a thread left Fused Eager (tpu_set_thread_eager_mode): a compiled graph ended */
    TPU_FLUSH_COLLECTIVE,   /* a collective (coll.h) queued */
    TPU_FLUSH_CAUSE_COUNT
} tpu_flush_cause;

/* "synchronize", "query", "copy", ...: static strings ("?" outside the enum). */
const char *tpu_flush_cause_name(tpu_flush_cause c);

/* Process-wide counters since start or the last reset. */
typedef struct tpu_fused_stats {
    uint64_t flushes[TPU_FLUSH_CAUSE_COUNT]; /* windows flushed, by cause */
    uint64_t ops_recorded;                   /* launches recorded */
    uint64_t ops_fused;                      /* of those, run inside a fused group */
    uint64_t groups_run;                     /* fused groups (two launches or more) run */
    uint64_t kernels_run;                    /* launches run alone by their kernel */
    uint64_t results_never_stored;           /* results of fused launches kept out of memory */
    uint64_t bytes_never_materialized;       /* bytes of blocks freed without ever being bound */
    uint64_t plan_cache_hits;                /* flushes that reused a cached plan (no analysis) */
    uint64_t plan_cache_misses;              /* flushes that planned their window */
    uint64_t groups_by_table;                /* fused groups run as lookup tables (tpu_set_fused_tables) */
    uint64_t remat_reads;                    /* operands read from a recomputed copy (tpu_set_fused_remat) */
    uint64_t remat_ops;                      /* launches recorded again to recompute them */
    uint64_t ops_rewritten;                  /* launches recorded as a cheaper one (cross entropy from its pair) */
    uint64_t kernels_dropped;                /* kernel nodes not run: nothing read their results */
} tpu_fused_stats;
void tpu_fused_get_stats(tpu_fused_stats *out);
void tpu_fused_reset_stats(void);

/* Flush the window of `s` (NULL: every window of every chip). Returns
 * errors of the flush itself (host memory); kernel errors surface at the
 * next synchronizing call, as for queued launches. */
tpu_status tpu_flush(tpu_stream_t s);

/* Excess precision (off by default): inside a fused group, results of
 * bfloat16 / float16 arithmetic stay float32 for the ops that read them in
 * the group, instead of being rounded to their dtype as Strict Eager does;
 * what reaches memory is still rounded, and casts still round. Faster and
 * more accurate, but no longer equal to Strict bit for bit. Read when a
 * window is flushed. */
void tpu_set_allow_excess_precision(bool on);
bool tpu_get_allow_excess_precision(void);

/* Lookup tables (on by default; TORCH_TPU_FUSED_TABLES=0 turns them off): a
 * fused group whose only tensor input is one of 8 or 16 bits (bfloat16,
 * float16, int8, uint8, int16, bool) and whose other operands are host
 * scalars computes a function of 256 / 65536 possible inputs. Above a size
 * and a number of ops it runs once over every possible input (the same
 * interpreter, so the same bits) and then once over the tensor as a table
 * lookup per element: one pass over memory whatever the chain's length.
 * Read when a window is flushed. */
void tpu_set_fused_tables(bool on);
bool tpu_get_fused_tables(void);

/* Recomputation (on by default; TORCH_TPU_FUSED_REMAT=0 turns it off, an
 * integer >= 2 sets the distance): in an open window, a value computed by
 * elementwise launches from storages the window has not changed since is
 * recomputed, from those storages, by a launch that reads it at least
 * `distance` launches later (or by a kernel that cannot fuse), instead of
 * being read from memory; kept alive only for such readers (autograd's
 * saved tensors), it is then never stored. Bit-identical results. Read at
 * every launch; 0 turns it off. */
void tpu_set_fused_remat(int distance);
int tpu_get_fused_remat(void);

/* Whether the storage at device address `devptr` holds its value in device
 * memory: bound, and written by no launch still recorded in a window. */
bool tpu_mem_is_materialized(const void *devptr);

#ifdef __cplusplus
}
#endif
#endif
