/* rewrite.c - launches recorded as cheaper ones over what the graph holds,
 * and the kernels the planner may drop.
 *
 * DESIGN
 * A rewrite is decided when a launch is recorded, from the graph so far: a
 * launch whose input was computed in the window by a launch that the
 * rewritten one can compute itself, from inputs still unchanged, reads
 * those inputs instead. The intermediate is then read by no one; when
 * autograd frees it inside the window, its writer is a dead node and the
 * planner drops it (graph.c), so the intermediate never takes memory. The
 * rewritten launch runs the same row functions on the same values, so its
 * results are the pair's bit for bit (loss.c).
 *
 * The rewrites (float32, [N, C] over dim 1, outputs with unit stride along
 * it, so the softmax kernel would have run row by row as these do):
 *   nll_loss(log_softmax(x))           -> cross_entropy(x)
 *   log_softmax_backward(nll_loss_backward(g), y)
 *                                      -> cross_entropy_backward(g, x)
 *                                         (x = log_softmax's input if it is
 *                                         unchanged, else y itself)
 * In a training step with a large vocabulary this takes two of the four
 * [N, C] buffers off the peak: the log-probabilities and their gradient.
 * What it costs: cross_entropy recomputes each row's log-softmax (in cache,
 * one pass over x); if something else keeps the log-probabilities (they are
 * then stored anyway), that pass is extra.
 *
 * A rewrite only looks at the graph (nodes, frees): the planner sees the
 * rewritten launch as recorded, and the plan cache keys on it. */
#include "graph/graph-impl.h"
#include <string.h>

/* The last node writing storage `base`, and which output (-1: none). */
static int last_writer(const tpu_graph *g, const void *base, int *k_out) {
    for (int i = g->n - 1; i >= 0; i--)
        if ((*k_out = tpu_gr_output_at(&g->nodes[i], base)) >= 0) return i;
    return -1;
}

/* Whether storage `base` was written by a node after node `from`. */
static bool written_since(const tpu_graph *g, const void *base, int from) {
    for (int i = from + 1; i < g->n; i++)
        if (tpu_gr_output_at(&g->nodes[i], base) >= 0) return true;
    return false;
}

/* Whether storage `base` was freed after node `from` was recorded. */
static bool freed_since(const tpu_graph *g, const void *base, int from) {
    for (int f = 0; f < g->nfreed; f++)
        if (g->freed[f] == base && g->freed_at[f] > from) return true;
    return false;
}

static bool touched_since(const tpu_graph *g, const void *base, int from) {
    return written_since(g, base, from) || freed_since(g, base, from);
}

/* Storage `base`'s frees after node `from` move to after the node about to
 * be appended, which reads it: nothing wrote it since, so the block still
 * holds the value (a freed block is reused only by its own stream, whose
 * later writes the graph orders after that node). */
static void hold_until_next(tpu_graph *g, const void *base, int from) {
    for (int f = 0; f < g->nfreed; f++)
        if (g->freed[f] == base && g->freed_at[f] > from) g->freed_at[f] = g->n + 1;
}

static bool f32_rows(const tpu_tensor *t) { return !t->is_scalar && t->ndim == 2 && t->dtype == TPU_F32; }

/* An output the softmax kernel computes row by row (its line loop, not the
 * column-vector one), as the cross-entropy kernels do. */
static bool unit_rows(const tpu_tensor *t) { return t->strides[1] == 1 || t->sizes[1] == 1; }

/* The node that wrote view v, if it is op `op` and wrote exactly v; its
 * inputs from operand `k0` on not written since, and not freed since unless
 * `freed_ok` (-1: none). */
static int producer(const tpu_graph *g, const tpu_tensor *v, tpu_op op, int k0, bool freed_ok) {
    int k, i = v->is_scalar ? -1 : last_writer(g, v->base, &k);
    if (i < 0 || g->nodes[i].op != op || k != 0 || !tpu_gr_same_view(&g->nodes[i].t[0], v)) return -1;
    const tpu_kargs *p = &g->nodes[i];
    for (int m = k0; m < p->n; m++)
        if (!p->t[m].is_scalar && p->t[m].base &&
            (freed_ok ? written_since(g, p->t[m].base, i) : touched_since(g, p->t[m].base, i)))
            return -1;
    return i;
}

/* A log_softmax over dim 1 of float32 [N, C] that wrote v from an input
 * still unchanged: its node (-1: none). */
static int log_softmax_of(const tpu_graph *g, const tpu_tensor *v) {
    int i = producer(g, v, TPU_OP_LOG_SOFTMAX, 1, false);
    if (i < 0) return -1;
    const tpu_kargs *a = &g->nodes[i];
    return a->n == 2 && tpu_unpack_LOG_SOFTMAX(&a->p).dim == 1 && f32_rows(&a->t[0]) && f32_rows(&a->t[1]) &&
                   unit_rows(&a->t[0])
               ? i
               : -1;
}

bool tpu_graph_rewrite(tpu_graph *g, const tpu_kargs *a, tpu_kargs *out) {
    if (a->op == TPU_OP_NLL_LOSS && (a->n == 4 || a->n == 5) && f32_rows(&a->t[2])) {
        int s = log_softmax_of(g, &a->t[2]);
        if (s < 0) return false;
        memcpy(out, a, offsetof(tpu_kargs, err));
        out->err[0] = 0;
        out->op = TPU_OP_CROSS_ENTROPY; /* same operands and parameters, x for the log-probabilities */
        out->t[2] = g->nodes[s].t[1];
        return true;
    }
    if (a->op == TPU_OP_LOG_SOFTMAX_BWD && a->n == 3 && tpu_unpack_LOG_SOFTMAX_BWD(&a->p).dim == 1 &&
        f32_rows(&a->t[0]) && f32_rows(&a->t[1]) && f32_rows(&a->t[2]) && unit_rows(&a->t[0])) {
        /* (autograd frees nll_loss_backward's saved target and total_weight once it has run) */
        int c = producer(g, &a->t[1], TPU_OP_NLL_LOSS_BWD, 1, true);
        if (c < 0) return false;
        const tpu_kargs *nb = &g->nodes[c]; /* (grad_x, grad_out, target, total_weight, weight?) */
        for (int k = 1; k < nb->n; k++)
            if (!nb->t[k].is_scalar && nb->t[k].base) hold_until_next(g, nb->t[k].base, c);
        tpu_args_NLL_LOSS_BWD q = tpu_unpack_NLL_LOSS_BWD(&nb->p);
        int s = log_softmax_of(g, &a->t[2]);
        memcpy(out, a, offsetof(tpu_kargs, err));
        out->err[0] = 0;
        out->op = TPU_OP_CROSS_ENTROPY_BWD;
        out->n = nb->n + 1;
        out->t[0] = a->t[0];
        out->t[1] = nb->t[1];
        out->t[2] = s >= 0 ? g->nodes[s].t[1] : a->t[2];
        for (int k = 2; k < nb->n; k++) out->t[k + 1] = nb->t[k];
        out->p =
            TPU_PARAMS(CROSS_ENTROPY_BWD, .reduction = q.reduction, .ignore_index = q.ignore_index, .logprobs = s < 0);
        out->p.compute_dtype = a->p.compute_dtype;
        return true;
    }
    return false;
}

bool tpu_graph_droppable(const tpu_kargs *a) {
    return (a->op == TPU_OP_LOG_SOFTMAX || a->op == TPU_OP_NLL_LOSS_BWD) && tpu_op_infos[a->op].nout == 1;
}
