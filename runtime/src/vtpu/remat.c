/* remat.c - Fused Eager's recomputation: a value that an elementwise chain
 * computed from tensors still unchanged in the window is recomputed where a
 * far-away launch reads it, instead of being kept in memory until then.
 *
 * DESIGN
 * A training step is one window (a few thousand launches). Autograd keeps
 * the forward's intermediates alive until the backward reads them, so the
 * planner must store them: GPT-2's MLP keeps four products of its tanh-GELU
 * per layer, every dropout keeps its mask. Most of them are cheap functions
 * of a tensor that stays alive anyway (the GELU's input, which the matmul
 * before it produced; the Philox counter for a mask).
 *
 * While a window records, each storage T written by one recomputable launch
 * (an elementwise float op, a cast or a Philox fill: what the fuser runs in
 * a group) over a dense range of its elements gets a recipe: the window's
 * node indices that computed T, in order, back to leaves (storages written
 * by anything else, or before the window), each leaf with the stamp of its
 * last write or free at the time. A recipe is valid while every leaf still
 * has its stamp (nothing wrote or freed it since) and T has no newer writer.
 *
 * When a launch reads a view of T inside that range, T's recipe is valid,
 * and the launch is far from T's writer (at least `distance` nodes: a near
 * reader fuses with the writer anyway) or is a kernel that cannot fuse (it
 * would make the planner store T; at most once per T, and not when the
 * recipe draws Philox numbers: a chain bound by its compute would pay more
 * for them than it saves - the elementwise-chain benchmark lost 23 %), the recipe's nodes
 * are appended again, ahead of the launch, writing fresh scratch blocks, and
 * the launch reads the recomputed copy. The scratch blocks are freed right
 * after the launch: the planner fuses the copied nodes with their reader (or
 * stores the copy just for a kernel reading it), and T, read from memory by
 * no one, is a dead intermediate as soon as autograd frees it: it never
 * takes memory. The copied nodes are the same launches over the same
 * inputs with the same parameters (a fill keeps its Philox offset), so the
 * recomputed value is the stored one bit for bit.
 *
 * Recipes live in the window and are dropped at its flush: after a flush
 * every live value is in memory. All functions here run with the window's
 * lock held. */
#define _GNU_SOURCE
#include "vtpu/vtpu-impl.h"
#include <stdlib.h>
#include <string.h>

static _Atomic int remat_distance = -1; /* -1: not read yet */
static _Atomic uint64_t st_reads, st_nodes;

/* TORCH_TPU_FUSED_REMAT: unset or 1 = on at the default distance, 0 = off,
 * an integer >= 2 = on at that distance (tests use small ones). */
int tpu_get_fused_remat(void) {
    int d = atomic_load_explicit(&remat_distance, memory_order_relaxed);
    if (d < 0) {
        const char *v = getenv("TORCH_TPU_FUSED_REMAT");
        d = TPU_REMAT_DISTANCE;
        if (v && *v) {
            char *end;
            long x = strtol(v, &end, 10);
            d = *end ? TPU_REMAT_DISTANCE : x == 0 ? 0 : x == 1 ? TPU_REMAT_DISTANCE : x > 1 << 20 ? 1 << 20 : (int)x;
        }
        atomic_store_explicit(&remat_distance, d, memory_order_relaxed);
    }
    return d;
}

void tpu_set_fused_remat(int distance) {
    atomic_store_explicit(&remat_distance, distance < 0 ? 0 : distance, memory_order_relaxed);
}

void tpu_remat_get_stats(uint64_t *reads, uint64_t *nodes) {
    *reads = atomic_load(&st_reads);
    *nodes = atomic_load(&st_nodes);
}

void tpu_remat_reset_stats(void) {
    atomic_store(&st_reads, 0);
    atomic_store(&st_nodes, 0);
}

/* ---- tpu_rmap: storage base -> 32-bit value (0 = absent) ---- */

static size_t rm_slot(const tpu_rmap *m, const void *k) {
    size_t i = (((uintptr_t)k >> 4) * 0x9E3779B97F4A7C15ull >> 20) & (m->cap - 1);
    while (m->keys[i] && m->keys[i] != k) i = (i + 1) & (m->cap - 1);
    return i;
}

uint32_t tpu_rmap_get(const tpu_rmap *m, const void *k) {
    if (!m->cap) return 0;
    size_t i = rm_slot(m, k);
    return m->keys[i] ? m->vals[i] : 0;
}

bool tpu_rmap_put(tpu_rmap *m, const void *k, uint32_t v) {
    if (2 * (m->n + 1) > m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 1024;
        const void **nk = calloc(cap, sizeof *nk);
        uint32_t *nv = malloc(cap * sizeof *nv);
        if (!nk || !nv) {
            free(nk);
            free(nv);
            return false;
        }
        tpu_rmap old = *m;
        m->keys = nk, m->vals = nv, m->cap = cap, m->n = 0;
        for (size_t i = 0; i < old.cap; i++)
            if (old.keys[i]) {
                size_t j = rm_slot(m, old.keys[i]);
                m->keys[j] = old.keys[i], m->vals[j] = old.vals[i], m->n++;
            }
        free(old.keys);
        free(old.vals);
    }
    size_t i = rm_slot(m, k);
    if (!m->keys[i]) m->keys[i] = k, m->n++;
    m->vals[i] = v;
    return true;
}

void tpu_rmap_clear(tpu_rmap *m) {
    if (m->n) memset(m->keys, 0, m->cap * sizeof *m->keys);
    m->n = 0;
}

void tpu_remat_reset(tpu_window *w) {
    tpu_rmap_clear(&w->rm_ev);
    tpu_rmap_clear(&w->rm_rc);
    w->nrc = 0;
    w->rm_stamp = 0;
    w->rm_broken = false;
}

/* ---- views ---- */

/* Whether view t covers a dense range of its storage's elements [lo, hi). */
static bool dense_range(const tpu_tensor *t, int64_t *lo, int64_t *hi) {
    int64_t numel = 1;
    int d[TPU_MAX_DIMS], nd = 0;
    for (int k = 0; k < t->ndim; k++) {
        if (t->sizes[k] == 0) return false;
        numel *= t->sizes[k];
        if (t->sizes[k] > 1) d[nd++] = k;
    }
    for (int i = 1; i < nd; i++) /* dims by stride (insertion sort: few dims) */
        for (int j = i; j > 0 && t->strides[d[j]] < t->strides[d[j - 1]]; j--) {
            int x = d[j];
            d[j] = d[j - 1], d[j - 1] = x;
        }
    int64_t want = 1;
    for (int i = 0; i < nd; i++) {
        if (t->strides[d[i]] != want) return false;
        want *= t->sizes[d[i]];
    }
    *lo = t->offset;
    *hi = t->offset + numel;
    return true;
}

/* Whether every element view t reads lies in [lo, hi). */
static bool reads_within(const tpu_tensor *t, int64_t lo, int64_t hi) {
    int64_t last = t->offset;
    for (int k = 0; k < t->ndim; k++) {
        if (t->sizes[k] == 0) return false;
        if (t->strides[k] < 0) return false;
        last += (t->sizes[k] - 1) * t->strides[k];
    }
    return t->offset >= lo && last < hi;
}

/* Launches whose result may be recomputed: the one-output launches a fused
 * group may run (tpu_window_may_fuse: float elementwise ops, casts, Philox
 * fills) other than row reductions, layer norms and the softmax family.
 * Each is a function of its operands and parameters only. */
static bool recomputable(const tpu_kargs *a) {
    if (tpu_op_infos[a->op].nout != 1 || a->n < 1 || a->t[0].is_scalar || !tpu_window_may_fuse(a)) return false;
    return tpu_op_class_of(a->op) != TPU_CLASS_REDUCTION && a->op != TPU_OP_LAYER_NORM &&
           !(a->op >= TPU_OP_SOFTMAX && a->op <= TPU_OP_LOG_SOFTMAX_BWD);
}

/* ---- recipes ---- */

static tpu_recipe *recipe_of(const tpu_window *w, const void *base) {
    uint32_t r = tpu_rmap_get(&w->rm_rc, base);
    return r ? &w->rc[r - 1] : NULL;
}

static bool recipe_valid(const tpu_window *w, const tpu_recipe *r) {
    for (int k = 0; k < r->nleaves; k++)
        if (tpu_rmap_get(&w->rm_ev, r->leaf[k]) != r->leaf_ev[k]) return false;
    return true;
}

/* The valid recipe that reproduces what view t reads, or NULL. */
static tpu_recipe *usable(const tpu_window *w, const tpu_tensor *t) {
    if (t->is_scalar || !t->base) return NULL;
    tpu_recipe *r = recipe_of(w, t->base);
    if (!r || r->dtype != t->dtype || !reads_within(t, r->lo, r->hi)) return NULL;
    return recipe_valid(w, r) ? r : NULL;
}

/* A write to or free of `base`: its readers' recipes see a new stamp, its
 * own recipe is gone. Needed only once the window holds a recipe (a leaf's
 * stamp is taken when the recipe is made), whether recomputation is on now
 * or not (it may be turned on again in the same window). */
static void stamp(tpu_window *w, const void *base) {
    if (!tpu_rmap_put(&w->rm_ev, base, ++w->rm_stamp)) w->rm_broken = true;
    if (tpu_rmap_get(&w->rm_rc, base)) tpu_rmap_put(&w->rm_rc, base, 0);
}

void tpu_remat_note_free(tpu_window *w, const void *host) {
    if (w->nrc) stamp(w, host);
}

int tpu_remat_prepare(tpu_window *w, const tpu_kargs *a, tpu_remat_plan *rp) {
    rp->nred = rp->nscratch = 0;
    for (int k = 0; k < a->n; k++) rp->operand[k] = -1;
    int dist = tpu_get_fused_remat();
    if (!dist || w->rm_broken || !w->nrc) return 0;
    bool kernel = !tpu_window_may_fuse(a);
    for (int k = tpu_op_infos[a->op].nout; k < a->n; k++) {
        tpu_recipe *r = usable(w, &a->t[k]);
        if (!r) continue;
        bool far = w->g.n - r->writer >= dist;
        if (!far && !(kernel && !r->kread && !r->random)) continue;
        int same = -1;
        for (int j = 0; j < rp->nred; j++)
            if (rp->red[j].r == (int)(r - w->rc)) same = j;
        if (same < 0) {
            if (rp->nscratch + r->nnodes > TPU_REMAT_MAX_SCRATCH) continue;
            same = rp->nred++;
            rp->red[same].r = (int)(r - w->rc);
            rp->red[same].first = rp->nscratch;
            rp->red[same].near = !far;
            for (int j = 0; j < r->nnodes; j++) rp->size[rp->nscratch++] = w->g.nodes[r->nodes[j]].t[0].nbytes;
        }
        rp->operand[k] = same;
    }
    return rp->nscratch;
}

/* Append recipe r's nodes writing scratch blocks host[0..r->nnodes); returns
 * the base of the copy of T (the last node's output), or NULL (host memory). */
static void *emit(tpu_window *w, const tpu_recipe *r, void *const *host) {
    const void *from[TPU_REMAT_MAX_NODES];
    void *to[TPU_REMAT_MAX_NODES];
    int nmap = 0;
    void *last = NULL;
    for (int j = 0; j < r->nnodes; j++) {
        tpu_kargs tmp;
        memcpy(&tmp, &w->g.nodes[r->nodes[j]], offsetof(tpu_kargs, err));
        tmp.err[0] = 0;
        for (int k = 1; k < tmp.n; k++) /* inputs written earlier in the recipe read its copy */
            for (int m = nmap - 1; m >= 0; m--)
                if (!tmp.t[k].is_scalar && tmp.t[k].base == from[m]) {
                    tmp.t[k].base = to[m];
                    break;
                }
        int m = nmap - 1;
        while (m >= 0 && from[m] != tmp.t[0].base) m--;
        if (m < 0) { /* first write of this storage in the recipe: a scratch block of its size */
            from[nmap] = tmp.t[0].base;
            to[nmap] = host[j]; /* (allocated at node j's output size; unused ones are freed all the same) */
            m = nmap++;
        }
        tmp.t[0].base = to[m];
        last = to[m];
        if (!tpu_graph_append(&w->g, &tmp)) return NULL;
        w->bytes += (size_t)tpu_tensor_numel(&tmp.t[0]) * tpu_dtype_size((tpu_dtype)tmp.t[0].dtype);
    }
    atomic_fetch_add_explicit(&st_nodes, (uint64_t)r->nnodes, memory_order_relaxed);
    return last;
}

bool tpu_remat_emit(tpu_window *w, const tpu_remat_plan *rp, void *const *host, tpu_kargs *a) {
    void *copy[TPU_MAX_OPERANDS];
    for (int j = 0; j < rp->nred; j++) {
        tpu_recipe *r = &w->rc[rp->red[j].r];
        copy[j] = emit(w, r, host + rp->red[j].first);
        if (!copy[j]) return false;
        if (rp->red[j].near) r->kread = true; /* (a near kernel read: once) */
    }
    for (int k = 0; k < a->n; k++)
        if (rp->operand[k] >= 0) {
            a->t[k].base = copy[rp->operand[k]];
            atomic_fetch_add_explicit(&st_reads, 1, memory_order_relaxed);
        }
    return true;
}

/* Add leaf `base` (stamp ev) to recipe r; false if it has no room. */
static bool add_leaf(tpu_recipe *r, const void *base, uint32_t ev) {
    for (int m = 0; m < r->nleaves; m++)
        if (r->leaf[m] == base) return true;
    if (r->nleaves == TPU_REMAT_MAX_LEAVES) return false;
    r->leaf[r->nleaves] = base;
    r->leaf_ev[r->nleaves++] = ev;
    return true;
}

/* Merge recipe `in`'s nodes (ascending) and leaves into r; false if no room. */
static bool merge(tpu_recipe *r, const tpu_recipe *in) {
    for (int j = 0; j < in->nnodes; j++) {
        int x = in->nodes[j], at = 0;
        while (at < r->nnodes && r->nodes[at] < x) at++;
        if (at < r->nnodes && r->nodes[at] == x) continue;
        if (r->nnodes == TPU_REMAT_MAX_NODES - 1) return false; /* (room for the launch itself) */
        memmove(&r->nodes[at + 1], &r->nodes[at], (size_t)(r->nnodes - at) * sizeof *r->nodes);
        r->nodes[at] = x;
        r->nnodes++;
    }
    for (int j = 0; j < in->nleaves; j++)
        if (!add_leaf(r, in->leaf[j], in->leaf_ev[j])) return false;
    r->random = r->random || in->random;
    return true;
}

/* The recipe of launch a's output (nodes[node]) from its inputs' recipes, read before the write. */
static bool make_recipe(const tpu_window *w, const tpu_kargs *a, int node, tpu_recipe *nr) {
    if (!recomputable(a) || !dense_range(&a->t[0], &nr->lo, &nr->hi)) return false;
    nr->base = a->t[0].base;
    nr->dtype = a->t[0].dtype;
    nr->writer = node;
    nr->kread = false;
    nr->random = tpu_op_class_of(a->op) == TPU_CLASS_RANDOM;
    nr->nnodes = nr->nleaves = 0;
    for (int k = 1; k < a->n; k++) {
        const tpu_tensor *t = &a->t[k];
        if (t->is_scalar || !t->base) continue;
        const tpu_recipe *r = usable(w, t);
        if (r ? !merge(nr, r)
              : t->base == a->t[0].base /* reads what it overwrites, not from a recipe */ ||
                    !add_leaf(nr, t->base, tpu_rmap_get(&w->rm_ev, t->base)))
            return false;
    }
    nr->nodes[nr->nnodes++] = node;
    /* A leaf that a node of the recipe also writes would read the copy when replayed: refuse. */
    for (int j = 0; j < nr->nnodes; j++)
        for (int m = 0; m < nr->nleaves; m++)
            if (nr->leaf[m] == w->g.nodes[nr->nodes[j]].t[0].base) return false;
    return true;
}

void tpu_remat_recorded(tpu_window *w, const tpu_kargs *a, int node, bool redirected) {
    if (w->rm_broken) return;
    tpu_recipe nr;
    bool ok = tpu_get_fused_remat() && !redirected && make_recipe(w, a, node, &nr);
    if (ok || w->nrc)
        for (int k = 0; k < tpu_op_infos[a->op].nout && k < a->n; k++)
            if (!a->t[k].is_scalar && a->t[k].base) stamp(w, a->t[k].base);
    if (!ok) return;
    if (w->nrc == w->caprc) {
        int cap = w->caprc ? 2 * w->caprc : 256;
        tpu_recipe *n = realloc(w->rc, (size_t)cap * sizeof *n);
        if (!n) return; /* (its stamp is new: no recipe of it is left) */
        w->rc = n;
        w->caprc = cap;
    }
    w->rc[w->nrc] = nr;
    if (tpu_rmap_put(&w->rm_rc, nr.base, (uint32_t)w->nrc + 1))
        w->nrc++;
    else
        w->rm_broken = true;
}
