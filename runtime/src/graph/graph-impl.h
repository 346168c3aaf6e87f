/* graph-impl.h - the graph floor (runtime/src/graph/): the IR that Fused
 * Eager records into (and torch.compile will lower FX graphs to), the pass
 * that turns a recorded graph into a program of steps (fusion, dead
 * intermediates), and the block interpreter that runs it. Uses only
 * kernels/, ref/ and base/; the device (vtpu/) owns the windows, binds
 * memory and queues programs on its streams.
 *
 * DESIGN
 * A graph is a list of nodes in program order; a node is one launch exactly
 * as tpu_launch validated it (tpu_kargs: op, operand views with host
 * addresses, named parameters), so running a node alone is running the
 * launch. Buffers are identified by their storage base; two operands are the
 * same value when their views are equal (base, offset, dtype, sizes,
 * strides). Storages freed while the graph was open are listed with it,
 * each with its place among the nodes: the value a node writes is dead if
 * its storage is freed before any node outside its group reads it (the
 * allocator may hand the storage out again at once: for the graph that is
 * just a later write to the same storage, ordered like any other).
 *
 * tpu_graph_compile partitions the nodes, in order, into steps: a fused
 * group of consecutive elementwise nodes computing in the float32 domain
 * over one iteration space (and row reductions - a sum, mean, max or min
 * over the last dim whose kernel would fold the same contiguous row - with
 * ops over their one-value-per-row results and ops reading those back over
 * the row; layer norms over the last dim, through their kernel's own row
 * function, with mean and rstd stored only if something needs them; the
 * group then runs a row per tile), or a single node run by its fast kernel. Inside
 * a group an operand is either loaded from memory, a host scalar, or the
 * value an earlier node of the group computed for the same view (never
 * reloaded); a node joins only if every storage the group writes is
 * accessed through that one view (then running the group tile by tile is
 * running its nodes one after another). A group's result is stored only if
 * its storage is still alive at the flush or read by a later step: a dead
 * intermediate never touches memory. Every result is rounded to its dtype
 * as the launch would store it, so fused and unfused runs agree bit for bit.
 *
 * The block interpreter walks a group's iteration space in tiles of
 * TPU_TILE elements on the compute pool; per tile each node loads what it
 * needs from memory, runs the op's ops.def expression through the fast
 * kernel's tile function (tpu_ew_tile_f), rounds, and stores if needed.
 * Values live in a few tile-sized slots reused by liveness.
 *
 * Plans are cached by the graph's structure (graph.c: the plan cache): a
 * window recorded again with the same ops, shapes, layouts and storage
 * pattern - every training step after the first - reuses its plan, and
 * only the operands' addresses and parameters are new.
 *
 * Thread-safety: a graph and a program belong to one thread at a time (the
 * device serializes a window's recording and flushing; a program runs on
 * one stream worker, which fans tiles out to the compute pool); the plan
 * cache has its own lock. */
#ifndef TPU_GRAPH_IMPL_H
#define TPU_GRAPH_IMPL_H

#include "kernels/kernels-impl.h"
#include <stdio.h>

typedef struct tpu_graph {
    tpu_kargs *nodes; /* owned; operand bases are host addresses */
    int n, cap;
    void **freed;       /* storage bases (host) freed while the graph was open ... */
    int *freed_at;      /* ... each after how many nodes (a storage may be freed, reused and freed again) */
    size_t *freed_size; /* ... and the bytes of the block freed */
    bool *freed_fresh;  /* ... and whether the block was not bound yet (allocated inside the window) */
    int nfreed, capfreed;
    struct gr_key *key; /* the plan-cache key, built as nodes are appended (graph.c) */
    bool nokey;         /* no host memory for it: planned without the cache */
} tpu_graph;

/* An empty graph (no allocation until the first node). */
void tpu_graph_init(tpu_graph *g);
/* Free everything the graph owns; it is empty again. */
void tpu_graph_release(tpu_graph *g);
/* Append a copy of launch a as the last node (NULL: out of host memory). */
tpu_kargs *tpu_graph_append(tpu_graph *g, const tpu_kargs *a);
/* Note that the storage at `base` was freed now, after the nodes recorded
 * so far (false: out of host memory). */
bool tpu_graph_add_freed(tpu_graph *g, void *base, size_t bytes, bool fresh);
/* Whether a node of the graph writes the storage at `base`. */
bool tpu_graph_writes(const tpu_graph *g, const void *base);
/* Which output of launch a views the storage at `base` (-1: none). */
int tpu_gr_output_at(const tpu_kargs *a, const void *base);
/* Whether two views hold the same elements in the same order (a size-1
 * dim's stride addresses nothing). */
bool tpu_gr_same_view(const tpu_tensor *a, const tpu_tensor *b);

/* Whether launch a, about to be appended to g, runs as a cheaper launch over
 * values g already holds (rewrite.c: cross entropy from its log_softmax and
 * nll_loss pair); if so *out is that launch, to record in a's place (frees
 * of what it reads that were noted since are moved after it). */
bool tpu_graph_rewrite(tpu_graph *g, const tpu_kargs *a, tpu_kargs *out);
/* Whether a's kernel only computes its output from its inputs, so the
 * planner drops the node when nothing reads its result (rewrite.c). */
bool tpu_graph_droppable(const tpu_kargs *a);

/* A compiled graph: steps ready to run. */
typedef struct tpu_gprog tpu_gprog;

typedef struct tpu_gprog_info {
    int nodes;            /* nodes in the graph */
    int steps;            /* steps run (groups + single nodes) */
    int groups;           /* fused groups of two nodes or more */
    int fused_nodes;      /* nodes inside those groups */
    int64_t dead_results; /* node results never stored (dead intermediates, dropped kernels included) */
    int dropped;          /* kernel nodes not run: nothing reads their results (tpu_graph_droppable) */
    int table_groups;     /* of the groups, those run as lookup tables (interp.c) */
    bool cache_hit;       /* the plan came from the plan cache (no analysis) */
} tpu_gprog_info;

/* Compile g into a program, which takes g's nodes (g is left empty, its
 * freed list included). NULL with TPU_ERROR_OUT_OF_MEMORY set: out of host
 * memory (g untouched). */
tpu_gprog *tpu_graph_compile(tpu_graph *g);
tpu_gprog_info tpu_gprog_get_info(const tpu_gprog *p);
/* fn(user, base) for each storage the program writes to memory (once per
 * storage), so the device can bind it before the program runs. */
void tpu_gprog_foreach_store(const tpu_gprog *p, void (*fn)(void *user, void *base), void *user);
/* Memory the program's run takes at its fullest, beyond what is bound
 * (allocated) when it is flushed: in run order, a block bound before the
 * window counts until the window frees it, a block allocated inside it from
 * the node that first stores to it until it is freed (one never stored to
 * is a dead intermediate: nothing) or, if it is alive at the end, as
 * fresh_alive(user, base) says (its bytes if it is not bound yet, else 0).
 * The device adds the result to the allocated bytes for the peak. */
size_t tpu_gprog_mem_peak(const tpu_gprog *p, size_t (*fresh_alive)(void *user, void *base), void *user);
/* Run every step in order; the first failing step's status is returned and
 * its message ("tpu kernel 'op' failed: ...") written to err; later steps
 * still run, as queued launches would. */
tpu_status tpu_gprog_run(tpu_gprog *p, char *err, size_t errlen);
/* The program as text: one line per node (op, shape, dtype, step, stored or
 * dead); for TORCH_TPU_FUSED_DUMP. */
void tpu_gprog_dump(const tpu_gprog *p, FILE *f);
void tpu_gprog_free(tpu_gprog *p);

#endif
