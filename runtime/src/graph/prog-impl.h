/* prog-impl.h - a compiled graph (graph.c builds it, interp.c runs it);
 * private to the graph floor. See graph-impl.h for the design. */
#ifndef TPU_PROG_IMPL_H
#define TPU_PROG_IMPL_H

#include "graph/graph-impl.h"

#define GR_MAX_OPS   1024  /* nodes of one fused group */
#define GR_MAX_LOADS 64    /* distinct views one group loads from memory */
#define GR_ROW_MAX   16384 /* longest row a group with a row reduction holds in one tile */

/* One node of a fused group, as the interpreter runs it. Slots are tiles of
 * TPU_TILE floats; slot 0 holds zeros (the unused inputs of unary ops). */
typedef struct gr_op {
    int node;    /* index into the program's nodes */
    int nin;     /* inputs (1..3; 0 for a random fill) */
    bool random; /* a random fill: element i from (seed, offset, i), as tpu_random_element */
    bool red;    /* a row reduction (tpu_red_row_exact): folds slot in[0] over the row (the tile)
                      * into one value per row, stored to `store` and broadcast over slot `out` */
    bool rowop;  /* an op over the row space [..., 1] (row mode): one value per row, broadcast over
                      * its slot; its memory operands are one element per row */
    bool rowfn;  /* a softmax-family op or a layer norm over the last dim (row mode): computed from
                  * whole rows of its inputs by its kernel's own row function */
    bool ln;     /* a LAYER_NORM over the last dim (row mode): slot in[0] is the row of x, in[1] / in[2]
                      * its weight and bias (as present) read along the row; out is y; mean and rstd
                      * are stored to lnstore[0] / [1] (memory operands, or -1) and never read in the group */
    int16_t lnstore[2];
    int16_t in[3];   /* slot of input j */
    int16_t load[3]; /* >= 0: memory operand loaded into slot in[j] before the op */
    int16_t out;     /* slot of the result */
    int16_t store;   /* >= 0: memory operand the result is stored to */
    tpu_dtype round; /* the result's dtype: what it is rounded to */
    bool skip;       /* result neither stored nor read: not computed */
    tpu_ew_par par;  /* the op's parameters, pre-converted */
} gr_op;

/* A memory operand of a group: operand k of node `node` (its view). */
typedef struct gr_mem {
    int node, k;
} gr_mem;

/* A host scalar input: operand k of node `node`, held in `slot`. */
typedef struct gr_const {
    int node, k;
    int16_t slot;
} gr_const;

typedef struct gr_group {
    gr_op *ops;
    int nops;
    gr_mem *mem; /* loads, then stores, in first-use order */
    int nmem;
    gr_const *cst;
    int ncst;
    int nslots;
    int16_t table_in; /* >= 0: the group may run as a lookup table over this load (see interp.c) */
} gr_group;

/* Nodes order[first .. first + count) (a group's in program order); group
 * >= 0: fused group index, else one node run by its fast kernel. Steps run
 * in the order of the array: a group where its first node was recorded. */
typedef struct gr_step {
    int first, count, group;
    bool dropped; /* one node whose results nothing reads (tpu_graph_droppable): not run */
} gr_step;

struct tpu_gprog {
    tpu_kargs *nodes;
    int n, cap; /* cap: the nodes array's room (it goes back to the pool) */
    gr_step *steps;
    int nsteps;
    gr_group *groups;
    int ngroups;
    void **stores; /* distinct storages written to memory */
    int nstores;
    int *order;         /* node indices in the order they run */
    int *node_step;     /* step of each node (dump) */
    int8_t *node_store; /* 1: the node's result reaches memory (dump) */
    tpu_gprog_info info;
    /* memory events for tpu_gprog_mem_peak: a write (step position, storage) per
     * store and kernel output, a free (after how many nodes, bytes, fresh) per free */
    struct gr_memev *mev; /* (graph.c) */
    int nmev;
    bool excess; /* keep float32 between bf16/f16 ops (tpu_set_allow_excess_precision at compile) */
    bool tables; /* run table-eligible groups as lookup tables (tpu_set_fused_tables at compile) */
};

/* Whether t's sizes are space's with the last dim 1 where space's is > 1:
 * one element per row of space (the row space of a group in row mode). */
bool tpu_gr_row_shaped(const tpu_tensor *space, const tpu_tensor *t);

/* Whether group g (views in nodes) can run as a lookup table: the memory
 * operand it would index by, or -1 (interp.c). */
int tpu_gr_table_input(const gr_group *g, const tpu_kargs *nodes);

/* Run fused group g of program p (interp.c); TPU_ERROR_OUT_OF_MEMORY if the
 * host had no memory for its slots (then its results are not all written). */
tpu_status tpu_gr_run_group(const tpu_gprog *p, const gr_group *g);

#endif
