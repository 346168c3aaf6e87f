/* graph.c - the graph IR and its compilation into a program of steps
 * (fusion of elementwise chains, dead intermediates, slot allocation).
 * See graph-impl.h for the design. */
#include "graph/prog-impl.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- a pointer -> int map (open addressing; keys are storage bases) ---- */

typedef struct ptrmap {
    const void **key;
    int *val;
    size_t mask, count;
    int shift;
    bool bad; /* a growth found no host memory: the map is incomplete */
} ptrmap;

/* Room for about `hint` keys to start with; the map grows as keys come
 * (a window's operands mostly share a few storages, so the operand count is
 * a poor size: a table that large is faulted in and missed in cache). */
static bool pm_init(ptrmap *m, size_t hint) {
    size_t cap = 64;
    int bits = 6;
    while (cap < 2 * hint + 1 && cap < 4096) cap *= 2, bits++;
    m->key = calloc(cap, sizeof *m->key);
    m->val = malloc(cap * sizeof *m->val);
    m->mask = cap - 1;
    m->count = 0;
    m->shift = 64 - bits;
    m->bad = false;
    return m->key && m->val;
}

static void pm_free(ptrmap *m) {
    free(m->key);
    free(m->val);
}

/* Empty again, keeping its room. */
static void pm_clear(ptrmap *m) {
    memset(m->key, 0, (m->mask + 1) * sizeof *m->key);
    m->count = 0;
    m->bad = false;
}

static size_t pm_slot(const ptrmap *m, const void *k) {
    size_t i = (size_t)(((uint64_t)(uintptr_t)k * 0x9E3779B97F4A7C15ull) >> m->shift); /* Fibonacci hashing */
    while (m->key[i] && m->key[i] != k) i = (i + 1) & m->mask;
    return i;
}

/* Value at k, or `dflt`. */
static int pm_get(const ptrmap *m, const void *k, int dflt) {
    size_t i = pm_slot(m, k);
    return m->key[i] ? m->val[i] : dflt;
}

static void pm_put(ptrmap *m, const void *k, int v) {
    if (m->bad) return;
    if (2 * (m->count + 1) > m->mask + 1) { /* grow: rehash into twice the room */
        ptrmap g = {.mask = 2 * m->mask + 1, .shift = m->shift - 1};
        g.key = calloc(g.mask + 1, sizeof *g.key);
        g.val = malloc((g.mask + 1) * sizeof *g.val);
        if (!g.key || !g.val) {
            pm_free(&g);
            m->bad = true;
            return;
        }
        for (size_t i = 0; i <= m->mask; i++)
            if (m->key[i]) {
                size_t j = pm_slot(&g, m->key[i]);
                g.key[j] = m->key[i];
                g.val[j] = m->val[i];
            }
        g.count = m->count;
        pm_free(m);
        *m = g;
    }
    size_t i = pm_slot(m, k);
    m->count += !m->key[i];
    m->key[i] = k;
    m->val[i] = v;
}

/* ---- the plan-cache key's words (see "the plan cache" below) ---- */

#define GR_CACHE_MAX_KEY (1u << 20) /* words: larger windows are planned every time */

typedef struct keybuf {
    uint64_t *w;
    size_t n, cap;
    bool bad;
} keybuf;

static void kput(keybuf *k, uint64_t v) {
    if (k->bad) return;
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 1024;
        uint64_t *w = cap <= GR_CACHE_MAX_KEY ? realloc(k->w, cap * sizeof *w) : NULL;
        if (!w) {
            k->bad = true;
            return;
        }
        k->w = w;
        k->cap = cap;
    }
    k->w[k->n++] = v;
}

/* The key as the graph's nodes are appended: built from the launch being
 * recorded (its views are in cache then; read back from a window of
 * thousands of nodes at the flush they no longer are). */
typedef struct gr_key gr_key;
struct gr_key {
    keybuf k;
    ptrmap ord; /* storage base -> order of first appearance (1, 2, ...) */
    int next;
};

static void key_add(tpu_graph *g, const tpu_kargs *a) {
    if (!g->key && !g->nokey) {
        g->key = calloc(1, sizeof *g->key);
        if (!g->key || !pm_init(&g->key->ord, 64)) {
            if (g->key) pm_free(&g->key->ord);
            free(g->key);
            g->key = NULL;
            g->nokey = true; /* this graph is planned without the cache */
            return;
        }
        g->key->next = 1;
    }
    gr_key *K = g->key;
    if (!K || K->k.bad) return;
    keybuf *k = &K->k;
    kput(k, (uint64_t)a->op | (uint64_t)a->n << 16 | (uint64_t)(uint32_t)a->p.compute_dtype << 32);
    for (int j = 0; j < a->n; j++) {
        const tpu_tensor *t = &a->t[j];
        if (t->is_scalar) {
            kput(k, ~(uint64_t)0);
            continue;
        }
        int o = pm_get(&K->ord, t->base, 0);
        if (!o) pm_put(&K->ord, t->base, o = K->next++);
        kput(k, (uint64_t)o | (uint64_t)(uint32_t)t->dtype << 32 | (uint64_t)(uint32_t)t->ndim << 48);
        kput(k, (uint64_t)t->offset);
        for (int d = 0; d < t->ndim; d++) {
            kput(k, (uint64_t)t->sizes[d]);
            kput(k, (uint64_t)t->strides[d]);
        }
    }
}

/* The graph was emptied (compiled): its key starts over, keeping its room. */
static void key_reset(tpu_graph *g) {
    g->nokey = false;
    if (!g->key) return;
    g->key->k.n = 0;
    g->key->k.bad = false;
    pm_clear(&g->key->ord);
    g->key->next = 1;
}

static void key_free(tpu_graph *g) {
    if (g->key) {
        free(g->key->k.w);
        pm_free(&g->key->ord);
    }
    free(g->key);
    g->key = NULL;
}

/* ---- the IR ---- */

void tpu_graph_init(tpu_graph *g) { memset(g, 0, sizeof *g); }

/* Node arrays are large (a tpu_kargs holds every operand's full view) and a
 * window hands its array to the program it compiles, so a new window would
 * grow a fresh one by reallocation and fault its pages in again each time.
 * Programs give their arrays back here instead, and windows start from one. */
#define GR_POOL_ARRAYS 3
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    tpu_kargs *nodes;
    int cap;
} pool[GR_POOL_ARRAYS];

static void pool_put(tpu_kargs *nodes, int cap) {
    if (!nodes) return;
    pthread_mutex_lock(&pool_mu);
    for (int i = 0; i < GR_POOL_ARRAYS; i++)
        if (!pool[i].nodes) {
            pool[i].nodes = nodes;
            pool[i].cap = cap;
            nodes = NULL;
            break;
        }
    pthread_mutex_unlock(&pool_mu);
    free(nodes);
}

static tpu_kargs *pool_get(int *cap) {
    tpu_kargs *nodes = NULL;
    pthread_mutex_lock(&pool_mu);
    for (int i = 0; i < GR_POOL_ARRAYS && !nodes; i++)
        if (pool[i].nodes) {
            nodes = pool[i].nodes;
            *cap = pool[i].cap;
            pool[i].nodes = NULL;
        }
    pthread_mutex_unlock(&pool_mu);
    return nodes;
}

void tpu_graph_release(tpu_graph *g) {
    pool_put(g->nodes, g->cap);
    key_free(g);
    free(g->freed);
    free(g->freed_at);
    free(g->freed_size);
    free(g->freed_fresh);
    tpu_graph_init(g);
}

/* *d = *s for the fields a view uses: sizes and strides up to its rank
 * (a full tpu_tensor is mostly room for 25 dimensions; nothing reads past
 * ndim, and copying it all was most of a record's memory traffic). */
static inline void copy_view(tpu_tensor *d, const tpu_tensor *s) {
    int nd = s->ndim > 0 && s->ndim <= TPU_MAX_DIMS ? s->ndim : 0;
    memcpy(d, s, offsetof(tpu_tensor, sizes));
    memcpy(d->sizes, s->sizes, (size_t)nd * sizeof *d->sizes);
    memcpy(d->strides, s->strides, (size_t)nd * sizeof *d->strides);
    memcpy(&d->is_scalar, &s->is_scalar, sizeof *d - offsetof(tpu_tensor, is_scalar));
}

tpu_kargs *tpu_graph_append(tpu_graph *g, const tpu_kargs *a) {
    if (!g->nodes) g->nodes = pool_get(&g->cap);
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        tpu_kargs *nn = realloc(g->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return NULL;
        g->nodes = nn;
        g->cap = cap;
    }
    tpu_kargs *node = &g->nodes[g->n++];
    node->op = a->op; /* the operands in use only: t[n..] stay unset */
    node->n = a->n;
    node->site = a->site;
    node->p = a->p;
    node->err[0] = 0;
    for (int k = 0; k < a->n; k++) copy_view(&node->t[k], &a->t[k]);
    key_add(g, a);
    return node;
}

bool tpu_graph_add_freed(tpu_graph *g, void *base, size_t bytes, bool fresh) {
    if (g->nfreed == g->capfreed) {
        int cap = g->capfreed ? 2 * g->capfreed : 64;
        void **nf = realloc(g->freed, (size_t)cap * sizeof *nf);
        if (nf) g->freed = nf;
        int *na = nf ? realloc(g->freed_at, (size_t)cap * sizeof *na) : NULL;
        if (na) g->freed_at = na;
        size_t *ns = na ? realloc(g->freed_size, (size_t)cap * sizeof *ns) : NULL;
        if (ns) g->freed_size = ns;
        bool *nb = ns ? realloc(g->freed_fresh, (size_t)cap * sizeof *nb) : NULL;
        if (!nb) return false;
        g->freed_fresh = nb;
        g->capfreed = cap;
    }
    g->freed[g->nfreed] = base;
    g->freed_size[g->nfreed] = bytes;
    g->freed_fresh[g->nfreed] = fresh;
    g->freed_at[g->nfreed++] = g->n;
    return true;
}

int tpu_gr_output_at(const tpu_kargs *a, const void *base) {
    int nout = tpu_op_infos[a->op].nout;
    for (int k = 0; k < nout && k < a->n; k++)
        if (!a->t[k].is_scalar && a->t[k].base == base) return k;
    return -1;
}

bool tpu_graph_writes(const tpu_graph *g, const void *base) {
    for (int i = 0; i < g->n; i++)
        if (tpu_gr_output_at(&g->nodes[i], base) >= 0) return true;
    return false;
}

/* A (group, pointer) -> int map: the views each group under construction
 * has touched, for every group of one compilation (group ids are never
 * reused, so nothing is ever cleared). Sized for 16 * n keys; a full map
 * refuses new keys (pair_put returns false). */
typedef struct pairmap {
    const void **key;
    int *gid, *val;
    size_t mask, used;
    int next_gid; /* the next group id to hand out */
} pairmap;

static bool pair_init(pairmap *m, size_t nkeys) {
    size_t cap = 64;
    while (cap < 2 * nkeys + 1) cap *= 2;
    m->key = malloc(cap * sizeof *m->key);
    m->gid = malloc(cap * sizeof *m->gid);
    m->val = malloc(cap * sizeof *m->val);
    m->mask = cap - 1;
    m->used = 0;
    m->next_gid = 0;
    if (m->gid)
        for (size_t i = 0; i < cap; i++) m->gid[i] = -1;
    return m->key && m->gid && m->val;
}

static void pair_free(pairmap *m) {
    free(m->key);
    free(m->gid);
    free(m->val);
}

static size_t pair_slot(const pairmap *m, int gid, const void *k) {
    size_t h = (((uintptr_t)k >> 4) ^ ((size_t)gid * 0x632BE59BD9B4E019ull)) * 0x9E3779B97F4A7C15ull;
    size_t i = (h >> 20) & m->mask;
    while (m->gid[i] >= 0 && (m->gid[i] != gid || m->key[i] != k)) i = (i + 1) & m->mask;
    return i;
}

static int pair_get(const pairmap *m, int gid, const void *k, int dflt) {
    size_t i = pair_slot(m, gid, k);
    return m->gid[i] >= 0 ? m->val[i] : dflt;
}

static bool pair_put(pairmap *m, int gid, const void *k, int v) {
    size_t i = pair_slot(m, gid, k);
    if (m->gid[i] < 0) {
        if (2 * (m->used + 1) > m->mask) return false;
        m->used++;
    }
    m->key[i] = k;
    m->gid[i] = gid;
    m->val[i] = v;
    return true;
}

/* ---- grouping ---- */

bool tpu_gr_same_view(const tpu_tensor *a, const tpu_tensor *b) {
    if (a->base != b->base || a->offset != b->offset || a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->sizes[d] != b->sizes[d] || (a->strides[d] != b->strides[d] && a->sizes[d] != 1)) return false;
    return true;
}

static int64_t view_numel(const tpu_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
    return n;
}

/* A random fill the interpreter can compute in a group: uniform, normal,
 * bernoulli with a scalar p, whose arguments pass the kernel's checks (else
 * it runs alone and fails there, as in Strict). */
static bool fusible_random(const tpu_kargs *a) {
    if (a->op != TPU_OP_RAND_UNIFORM && a->op != TPU_OP_RAND_NORMAL && a->op != TPU_OP_RAND_BERNOULLI) return false;
    if (a->n > 2 || (a->n == 2 && !a->t[1].is_scalar)) return false;
    tpu_kargs probe;
    memcpy(&probe, a, offsetof(tpu_kargs, err));
    return tpu_random_check(&probe) == TPU_OK;
}

static bool is_random(tpu_op op) { return tpu_op_class_of(op) == TPU_CLASS_RANDOM; }

/* Rows shorter than this are not worth a row of interpretation each. */
#define GR_ROW_MIN 64

/* A reduction a group can compute from the row it holds (see the
 * interpreter's row mode): its result equals the kernel's, bit for bit. */
static bool is_reduction(const tpu_kargs *a) { return tpu_op_class_of(a->op) == TPU_CLASS_REDUCTION; }
static bool fusible_row_reduction(const tpu_kargs *a) {
    if (!tpu_red_row_exact(a)) return false;
    for (int d = 0; d < a->t[0].ndim; d++)
        if (a->t[0].sizes[d] > 1 && a->t[0].strides[d] == 0) return false; /* an expanded output */
    int64_t n = a->t[1].sizes[a->t[1].ndim - 1];
    return n >= GR_ROW_MIN && n <= GR_ROW_MAX;
}

/* A layer norm over the last dim that a group can run on the row it holds
 * (interp.c: the kernel's own row function, tpu_ln_row_f): float operands,
 * weight and bias contiguous, outputs not expanded. */
static bool is_layer_norm(const tpu_kargs *a) { return a->op == TPU_OP_LAYER_NORM; }
static bool fusible_layer_norm(const tpu_kargs *a) {
    tpu_args_LAYER_NORM q = tpu_unpack_LAYER_NORM(&a->p);
    const tpu_tensor *x = &a->t[3];
    if (a->n != 4 + (q.has_weight != 0) + (q.has_bias != 0) || x->is_scalar || x->ndim < 1) return false;
    int64_t M = x->sizes[x->ndim - 1];
    if (q.cols != M || M < GR_ROW_MIN || M > GR_ROW_MAX) return false;
    if (a->t[0].ndim != x->ndim || !tpu_gr_row_shaped(x, &a->t[1]) || !tpu_gr_row_shaped(x, &a->t[2])) return false;
    for (int d = 0; d < x->ndim; d++)
        if (a->t[0].sizes[d] != x->sizes[d]) return false;
    for (int k = 0; k < a->n; k++) {
        const tpu_tensor *t = &a->t[k];
        tpu_dtype dt = (tpu_dtype)t->dtype;
        if (t->is_scalar || (dt != TPU_F32 && dt != TPU_BF16 && dt != TPU_F16)) return false;
        if (k >= 4 && (t->ndim != 1 || t->sizes[0] != M || t->strides[0] != 1)) return false; /* weight, bias */
        if (k < 3)
            for (int d = 0; d < t->ndim; d++)
                if (t->sizes[d] > 1 && t->strides[d] == 0) return false; /* an expanded output */
    }
    return true;
}

/* A softmax, log_softmax or backward of one over the last dim, whose
 * output is contiguous along it: its kernel then runs its row function on
 * every line (softmax.c), which a group holding the rows runs too. */
static bool is_softmax(const tpu_kargs *a) { return a->op >= TPU_OP_SOFTMAX && a->op <= TPU_OP_LOG_SOFTMAX_BWD; }
static bool fusible_softmax(const tpu_kargs *a) {
    const tpu_tensor *o = &a->t[0];
    int nin = a->op == TPU_OP_SOFTMAX || a->op == TPU_OP_LOG_SOFTMAX ? 1 : 2;
    int64_t dim = tpu_unpack_SOFTMAX(&a->p).dim;
    if (a->n != 1 + nin || o->is_scalar || o->ndim < 1 || dim != o->ndim - 1) return false;
    int64_t D = o->sizes[dim];
    if (D < GR_ROW_MIN || D > GR_ROW_MAX || o->strides[dim] != 1) return false;
    for (int k = 0; k < a->n; k++) {
        const tpu_tensor *t = &a->t[k];
        tpu_dtype dt = (tpu_dtype)t->dtype;
        if (t->is_scalar || (dt != TPU_F32 && dt != TPU_BF16 && dt != TPU_F16) || t->ndim != o->ndim) return false;
        for (int d = 0; d < o->ndim; d++)
            if (t->sizes[d] != o->sizes[d] || (k == 0 && o->sizes[d] > 1 && o->strides[d] == 0)) return false;
    }
    return true;
}

/* A node the interpreter can run inside a group. */
static bool fusible(const tpu_kargs *a, tpu_ew_par *par) {
    memset(par, 0, sizeof *par);
    if (is_reduction(a)) return fusible_row_reduction(a);
    if (is_layer_norm(a)) return fusible_layer_norm(a);
    if (is_softmax(a)) return fusible_softmax(a);
    if (tpu_op_infos[a->op].nout != 1) return false;
    if (is_random(a->op) ? !fusible_random(a) : !tpu_ew_prepare_f(a, par)) return false;
    const tpu_tensor *o = &a->t[0];
    tpu_dtype dt = (tpu_dtype)o->dtype;
    if (o->is_scalar || (dt != TPU_F32 && dt != TPU_BF16 && dt != TPU_F16 && dt != TPU_BOOL)) return false;
    if (view_numel(o) == 0) return false;
    for (int d = 0; d < o->ndim; d++)
        if (o->sizes[d] > 1 && o->strides[d] == 0) return false; /* an expanded output: elements alias */
    return true;
}

/* A value of a group being built: loaded from memory, a host scalar, or
 * computed by op `op`. */
enum { V_LOAD, V_CONST, V_OP };
typedef struct gval {
    int kind, op, last_use, mem, node, k;
    int16_t slot;
    bool row;    /* a row reduction's result: one value per row, not readable inside the group */
    bool noread; /* a layer norm's mean or rstd: stored if needed, never read inside the group */
} gval;

/* A view the group has touched, and the value it holds now; entries of
 * one storage are chained (newest first) from the group's map. */
typedef struct gent {
    const tpu_tensor *view;
    int val, next;
    bool written;
} gent;

typedef struct gbuild {
    const tpu_kargs *nodes;
    pairmap *map; /* shared: (gid, storage base) -> the group's newest entry of it */
    int gid;
    gr_op *ops;
    int nops, capops;
    int *inval; /* 3 per op */
    int *outval;
    int capin, capout;
    gval *vals;
    int nvals, capvals;
    gent *ent;
    int nent, capent, nloads;
    bool rows; /* row mode: a row reduction joined (ops over the row space [..., 1] may join too) */
} gbuild;

/* An empty group with a fresh id (its arrays grow as it does). */
static void build_reset(gbuild *b) {
    b->nops = b->nent = b->nloads = b->nvals = 0;
    b->rows = false;
    b->gid = b->map->next_gid++;
}

static void build_free(gbuild *b) {
    free(b->ops);
    free(b->inval);
    free(b->outval);
    free(b->vals);
    free(b->ent);
    memset(b, 0, sizeof *b);
}

static bool grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* Room for one more op (its values and entries). */
static bool build_reserve(gbuild *b) {
    return grow((void **)&b->ops, &b->capops, b->nops + 1, sizeof *b->ops) &&
           grow((void **)&b->inval, &b->capin, 3 * (b->nops + 1), sizeof *b->inval) &&
           grow((void **)&b->outval, &b->capout, b->nops + 1, sizeof *b->outval) &&
           grow((void **)&b->vals, &b->capvals, b->nvals + 8, sizeof *b->vals) &&
           grow((void **)&b->ent, &b->capent, b->nent + 8, sizeof *b->ent);
}

static int find_ent(const gbuild *b, const tpu_tensor *t) {
    for (int e = pair_get(b->map, b->gid, t->base, -1); e >= 0; e = b->ent[e].next)
        if (tpu_gr_same_view(b->ent[e].view, t)) return e;
    return -1;
}

/* Whether t is row view r (sizes [..., 1]) expanded over the row: the same
 * storage, offset, dtype, leading sizes and strides, the last dim of size
 * > 1 and stride 0 (how an op over the group's space reads a row value). */
static bool expands(const tpu_tensor *r, const tpu_tensor *t) {
    int l = t->ndim - 1;
    if (l < 0 || r->base != t->base || r->offset != t->offset || r->dtype != t->dtype || r->ndim != t->ndim ||
        r->sizes[l] != 1 || t->sizes[l] < 2 || t->strides[l] != 0)
        return false;
    for (int d = 0; d < l; d++)
        if (r->sizes[d] != t->sizes[d] || (r->strides[d] != t->strides[d] && r->sizes[d] != 1)) return false;
    return true;
}

/* The group's row value that t expands, or -1. */
static int find_row_ent(const gbuild *b, const tpu_tensor *t) {
    if (!b->rows) return -1;
    for (int e = pair_get(b->map, b->gid, t->base, -1); e >= 0; e = b->ent[e].next)
        if (b->vals[b->ent[e].val].row && expands(b->ent[e].view, t)) return e;
    return -1;
}

/* The group's iteration space: its first node's output, or the input a
 * row reduction folds when one opened the group. */
static const tpu_tensor *group_space(const gbuild *b) {
    const tpu_kargs *a0 = &b->nodes[b->ops[0].node];
    return b->ops[0].red ? &a0->t[1] : &a0->t[0];
}

bool tpu_gr_row_shaped(const tpu_tensor *space, const tpu_tensor *t) {
    int l = space->ndim - 1;
    if (l < 0 || t->ndim != space->ndim || t->sizes[l] != 1 || space->sizes[l] < 2) return false;
    for (int d = 0; d < l; d++)
        if (t->sizes[d] != space->sizes[d]) return false;
    return true;
}

static int add_ent(gbuild *b, const tpu_tensor *view, int val) {
    int e = b->nent++;
    b->ent[e] = (gent){view, val, pair_get(b->map, b->gid, view->base, -1), false};
    pair_put(b->map, b->gid, view->base, e); /* (room checked by try_join) */
    return e;
}

/* Whether the group wrote the storage at `base` (through any view). */
static bool base_written(const gbuild *b, const void *base) {
    for (int e = pair_get(b->map, b->gid, base, -1); e >= 0; e = b->ent[e].next)
        if (b->ent[e].written) return true;
    return false;
}

/* Whether every view of `base` the group touched is `v`. */
static bool base_only_view(const gbuild *b, const tpu_tensor *v) {
    for (int e = pair_get(b->map, b->gid, v->base, -1); e >= 0; e = b->ent[e].next)
        if (!tpu_gr_same_view(b->ent[e].view, v)) return false;
    return true;
}

static int new_val(gbuild *b, int kind, int op) {
    gval *v = &b->vals[b->nvals];
    memset(v, 0, sizeof *v);
    v->kind = kind;
    v->op = op;
    v->last_use = op;
    v->mem = -1;
    v->slot = -1;
    return b->nvals++;
}

/* Add node i to the group if it can run inside it (see graph-impl.h). */
static bool try_join(gbuild *b, int i, const tpu_ew_par *par) {
    const tpu_kargs *a = &b->nodes[i];
    const tpu_tensor *o = &a->t[0];
    bool red = is_reduction(a), ln = is_layer_norm(a), rowfn = ln || is_softmax(a), rowop = false;
    const tpu_tensor *space = red ? &a->t[1] : o; /* a row reduction runs over its input's elements */
    int nout = ln ? 3 : 1;                        /* a layer norm: y, mean, rstd */
    if (b->nops >= GR_MAX_OPS) return false;
    if (b->nops > 0) {
        const tpu_tensor *o0 = group_space(b);
        bool same = o0->ndim == space->ndim;
        for (int d = 0; same && d < space->ndim; d++) same = o0->sizes[d] == space->sizes[d];
        /* in row mode an op over the row space computes one value per row (a row value) */
        rowop = !same && !red && !rowfn && b->rows && !is_random(a->op) && tpu_gr_row_shaped(o0, o);
        if (!same && !rowop) return false;
    }
    int nin = is_random(a->op) ? 0 : a->n - nout, newloads = 0; /* (bernoulli's p is read from the node) */
    int rowin[3] = {-1, -1, -1};                                /* inputs reading a row value expanded over the row */
    for (int j = 0; j < nin; j++) {
        const tpu_tensor *t = &a->t[nout + j];
        int e = t->is_scalar ? -1 : find_ent(b, t);
        if (e < 0 && !t->is_scalar && !rowop && (e = find_row_ent(b, t)) >= 0) rowin[j] = e;
        if (e >= 0 && b->vals[b->ent[e].val].noread) return false;
        if (e >= 0 && rowin[j] < 0 && b->vals[b->ent[e].val].row && !rowop) return false; /* (not over the row) */
        if ((red || rowfn) && e >= 0 && b->vals[b->ent[e].val].row) return false; /* folds values over the row */
        if (t->is_scalar || e >= 0) continue;
        if (base_written(b, t->base)) return false; /* another view of a result */
        for (int k = 0; k < nout; k++)
            if (t->base == a->t[k].base && (k > 0 || !tpu_gr_same_view(t, o))) return false; /* partly in place */
        newloads++;
    }
    for (int k = 0; k < nout; k++)
        if (!base_only_view(b, &a->t[k])) return false;
    for (int k = 1; k < nout; k++)
        if (a->t[k].base == o->base || (k == 2 && a->t[2].base == a->t[1].base)) return false;
    if (b->nloads + newloads > GR_MAX_LOADS || !build_reserve(b)) return false;
    if (2 * (b->map->used + 8) > b->map->mask) return false; /* the shared map is full (a node adds <= 6) */

    int op = b->nops++;
    gr_op *g = &b->ops[op];
    memset(g, 0, sizeof *g);
    g->node = i;
    g->nin = nin;
    g->par = *par;
    g->random = is_random(a->op);
    g->red = red;
    g->rowop = rowop;
    g->rowfn = rowfn;
    g->ln = ln;
    g->lnstore[0] = g->lnstore[1] = -1;
    b->rows = b->rows || red || rowfn;
    g->round = (tpu_dtype)o->dtype;
    for (int j = 0; j < 3; j++) b->inval[3 * op + j] = -1;
    for (int j = 0; j < nin; j++) {
        const tpu_tensor *t = &a->t[nout + j];
        int v;
        if (t->is_scalar) {
            v = new_val(b, V_CONST, op);
            b->vals[v].node = i;
            b->vals[v].k = 1 + j;
        } else {
            int e = rowin[j] >= 0 ? rowin[j] : find_ent(b, t);
            if (e < 0) {
                e = add_ent(b, t, new_val(b, V_LOAD, op));
                b->nloads++;
                b->vals[b->ent[e].val].node = i;
                b->vals[b->ent[e].val].k = nout + j;
            }
            v = b->ent[e].val;
        }
        b->vals[v].last_use = op;
        b->inval[3 * op + j] = v;
    }
    int v = new_val(b, V_OP, op);
    b->vals[v].row = red || rowop;
    int e = find_ent(b, o);
    if (e < 0) e = add_ent(b, o, v);
    b->ent[e].val = v;
    b->ent[e].written = true;
    b->outval[op] = v;
    for (int k = 1; k < nout; k++) { /* a layer norm's mean and rstd */
        int w = new_val(b, V_OP, op);
        b->vals[w].row = b->vals[w].noread = true;
        int ek = find_ent(b, &a->t[k]);
        if (ek < 0) ek = add_ent(b, &a->t[k], w);
        b->ent[ek].val = w;
        b->ent[ek].written = true;
    }
    return true;
}

/* ---- slots ---- */

typedef struct slots {
    int16_t *free;
    int nfree, next;
} slots;

static int16_t slot_take(slots *s) { return s->nfree ? s->free[--s->nfree] : (int16_t)s->next++; }
static void slot_give(slots *s, int16_t k) { s->free[s->nfree++] = k; }

/* Turn the built group into its runnable form: memory operands, constants,
 * slots (store decisions are in ops[].store as -2 "store" / -1 "not yet"). */
static bool finish_group(gbuild *b, gr_group *g) {
    memset(g, 0, sizeof *g);
    g->ops = malloc((size_t)b->nops * sizeof *g->ops);
    g->cst = malloc((size_t)(b->nvals + 1) * sizeof *g->cst);
    g->mem = malloc((size_t)(b->nloads + 3 * b->nops) * sizeof *g->mem); /* (a layer norm stores 3) */
    slots s = {malloc((size_t)(b->nvals + 2) * sizeof(int16_t)), 0, 1};  /* slot 0: zeros */
    if (!g->ops || !g->cst || !g->mem || !s.free) {
        free(g->ops);
        free(g->cst);
        free(g->mem);
        free(s.free);
        return false;
    }
    memcpy(g->ops, b->ops, (size_t)b->nops * sizeof *g->ops);
    g->nops = b->nops;
    for (int v = 0; v < b->nvals; v++)
        if (b->vals[v].kind == V_CONST) {
            b->vals[v].slot = slot_take(&s);
            g->cst[g->ncst++] = (gr_const){b->vals[v].node, b->vals[v].k, b->vals[v].slot};
        }
    for (int op = 0; op < g->nops; op++) {
        gr_op *o = &g->ops[op];
        for (int j = 0; j < 3; j++) {
            o->in[j] = 0;
            o->load[j] = -1;
            int v = b->inval[3 * op + j];
            if (v < 0) continue;
            gval *val = &b->vals[v];
            if (val->kind == V_LOAD && val->slot < 0) {
                val->slot = slot_take(&s);
                val->mem = g->nmem;
                g->mem[g->nmem++] = (gr_mem){val->node, val->k};
                o->load[j] = (int16_t)val->mem;
            }
            o->in[j] = val->slot;
        }
        gval *out = &b->vals[b->outval[op]];
        bool store = o->store == -2, side = false;
        o->store = -1;
        for (int k = 0; k < 2; k++) { /* a layer norm's mean and rstd */
            if (o->lnstore[k] == -2) {
                o->lnstore[k] = (int16_t)g->nmem;
                g->mem[g->nmem++] = (gr_mem){o->node, 1 + k};
                side = true;
            } else {
                o->lnstore[k] = -1;
            }
        }
        o->skip = !store && !side && out->last_use == op;
        if (!o->skip) {
            out->slot = slot_take(&s);
            o->out = out->slot;
            if (store) {
                o->store = (int16_t)g->nmem;
                g->mem[g->nmem++] = (gr_mem){o->node, 0};
            }
        }
        for (int j = 0; j < 3; j++) { /* inputs read for the last time (once each) */
            int v = b->inval[3 * op + j];
            bool dup = (j > 0 && v == b->inval[3 * op]) || (j > 1 && v == b->inval[3 * op + 1]);
            if (v >= 0 && !dup && b->vals[v].kind != V_CONST && b->vals[v].last_use == op)
                slot_give(&s, b->vals[v].slot);
        }
        if (!o->skip && out->last_use == op) slot_give(&s, out->slot);
    }
    g->nslots = s.next;
    free(s.free);
    return true;
}

/* ---- compilation ---- */

static void prog_free_parts(tpu_gprog *p) {
    for (int i = 0; i < p->ngroups; i++) {
        free(p->groups[i].ops);
        free(p->groups[i].cst);
        free(p->groups[i].mem);
    }
    free(p->groups);
    free(p->steps);
    free(p->stores);
    free(p->mev);
    free(p->node_step);
    free(p->node_store);
    free(p->order);
}

void tpu_gprog_free(tpu_gprog *p) {
    if (!p) return;
    prog_free_parts(p);
    pool_put(p->nodes, p->cap);
    free(p);
}

/* ---- liveness: per storage, where it is read and where it is freed ----
 * Positions are node indices in program order; a free at position f came
 * after node f - 1. touch[] lists every (position, group) reading a
 * storage, sorted by position; frees[] its free positions, sorted. */

typedef struct touches {
    int *pos, *grp; /* reads */
    int n, cap;
    int *fpos; /* frees */
    int nf, capf;
} touches;

typedef struct liveness {
    ptrmap idx; /* storage base -> 1 + index into t[] */
    touches *t;
    int nt;
} liveness;

static touches *live_of(liveness *L, const void *base, bool add) {
    int k = pm_get(&L->idx, base, 0);
    if (k) return &L->t[k - 1];
    if (!add) return NULL;
    pm_put(&L->idx, base, ++L->nt);
    touches *t = &L->t[L->nt - 1];
    memset(t, 0, sizeof *t);
    return t;
}

static void live_free(liveness *L) {
    for (int k = 0; k < L->nt; k++) {
        free(L->t[k].pos);
        free(L->t[k].grp);
        free(L->t[k].fpos);
    }
    free(L->t);
    pm_free(&L->idx);
}

/* Reads (every operand of a node run alone: a kernel may read its outputs)
 * and frees of each storage; group_of[i]: node i's planner group or -1. */
static bool live_build(liveness *L, const tpu_graph *gr, const int *group_of) {
    size_t nops = 1 + (size_t)gr->nfreed;
    for (int i = 0; i < gr->n; i++) nops += (size_t)gr->nodes[i].n;
    L->t = malloc(nops * sizeof *L->t);
    L->nt = 0;
    if (!L->t || !pm_init(&L->idx, nops)) return false;
    for (int i = 0; i < gr->n; i++) {
        const tpu_kargs *a = &gr->nodes[i];
        int k0 = group_of[i] >= 0 ? tpu_op_infos[a->op].nout : 0; /* (a fused node reads only its inputs) */
        for (int k = k0; k < a->n; k++) {
            if (a->t[k].is_scalar || !a->t[k].base) continue;
            touches *t = live_of(L, a->t[k].base, true);
            int cap = t->cap;
            if (!grow((void **)&t->pos, &cap, t->n + 1, sizeof *t->pos) ||
                !grow((void **)&t->grp, &t->cap, t->n + 1, sizeof *t->grp))
                return false;
            t->pos[t->n] = i;
            t->grp[t->n++] = group_of[i];
        }
    }
    for (int f = 0; f < gr->nfreed; f++) {
        touches *t = live_of(L, gr->freed[f], true);
        if (!grow((void **)&t->fpos, &t->capf, t->nf + 1, sizeof *t->fpos)) return false;
        t->fpos[t->nf++] = gr->freed_at[f];
    }
    return !L->idx.bad;
}

/* Whether the value node i writes to `base` must reach memory: its storage
 * is not freed after it, or a node outside group g reads the storage
 * before that free. */
static bool value_needed(liveness *L, const void *base, int i, int g) {
    touches *t = live_of(L, base, false);
    if (!t) return true;
    int f = -1;
    for (int k = 0; k < t->nf && f < 0; k++)
        if (t->fpos[k] > i) f = t->fpos[k];
    if (f < 0) return true;
    for (int k = 0; k < t->n; k++)
        if (t->pos[k] > i && t->pos[k] < f && t->grp[k] != g) return true;
    return false;
}

/* Whether the storage node i writes at `base` is read by a later node
 * before it is freed (or is never freed in the graph). */
static bool value_read(liveness *L, const void *base, int i) {
    touches *t = live_of(L, base, false);
    int f = -1;
    for (int k = 0; t && k < t->nf && f < 0; k++)
        if (t->fpos[k] > i) f = t->fpos[k];
    if (f < 0) return true;
    for (int k = 0; k < t->n; k++)
        if (t->pos[k] > i && t->pos[k] < f) return true;
    return false;
}

/* Decide which results of group g reach memory: the last write of each
 * storage inside the group, if its value is needed (value_needed). */
static void decide_stores(gbuild *b, int g, liveness *L) {
    int later = b->map->next_gid++; /* a scratch set: storages written by a later op of the group */
    for (int op = b->nops - 1; op >= 0; op--) {
        gr_op *go = &b->ops[op];
        const tpu_kargs *a = &b->nodes[go->node];
        for (int k = go->ln ? 2 : 0; k >= 0; k--) { /* (a layer norm: y, mean, rstd) */
            const tpu_tensor *o = &a->t[k];
            bool later_write = pair_get(b->map, later, o->base, 0);
            pair_put(b->map, later, o->base, 1);
            bool needed = value_needed(L, o->base, go->node, g);
            int16_t d = (!later_write && needed) ? -2 : -1;
            if (k == 0)
                go->store = d;
            else
                go->lnstore[k - 1] = d;
        }
    }
}

/* ---- phase A: which nodes fuse with which ----
 * Nodes are taken in program order. A fusible node joins the open group of
 * one of its producers (the last writer of an input), or else the group of
 * the node just before it, if it can run there: a group runs at the place
 * of its first node, so joining moves the node up, past the nodes in
 * between - allowed only if none of those that still run after the group
 * writes a storage the node reads, or reads or writes the storage it
 * writes. A node that joins no group opens one (at most GR_OPEN groups are
 * open: the oldest closes). */

#define GR_OPEN  512  /* groups open at once */
#define GR_HOIST 4096 /* farthest a node moves up to join a group */

typedef struct agroup {
    int pos;      /* first node: where the group runs */
    int *members; /* node indices, program order */
    int n, cap;
    gbuild b; /* while open */
    bool open;
} agroup;

typedef struct planner {
    const tpu_graph *gr;
    pairmap map;
    ptrmap last_writer; /* storage base -> 1 + index of the last node writing it */
    int *group_of;      /* node -> agroup index, or -1 */
    int *eff_pos;       /* node -> where it runs */
    agroup *groups;
    int ngroups;
    int open[GR_OPEN], nopen;
} planner;

/* Whether node i may move up to run at group g's place (see above). */
static bool may_hoist(const planner *pl, int g, int i) {
    int pos = pl->groups[g].pos;
    if (i - pos > GR_HOIST) return false;
    const tpu_kargs *a = &pl->gr->nodes[i];
    int nout_a = tpu_op_infos[a->op].nout;
    for (int k = pos + 1; k < i; k++) {
        if (pl->group_of[k] == g || pl->eff_pos[k] < pos) continue; /* in the group, or runs before it */
        const tpu_kargs *c = &pl->gr->nodes[k];
        int nout_c = tpu_op_infos[c->op].nout;
        for (int x = 0; x < c->n; x++) {
            const tpu_tensor *t = &c->t[x];
            if (t->is_scalar) continue;
            for (int j = 0; j < nout_a && j < a->n; j++)
                if (t->base == a->t[j].base) return false; /* it reads or writes what i writes */
            if (x < nout_c)
                for (int j = nout_a; j < a->n; j++)
                    if (!a->t[j].is_scalar && a->t[j].base == t->base) return false; /* it writes what i reads */
        }
    }
    return true;
}

static void close_group(planner *pl, int slot) {
    agroup *g = &pl->groups[pl->open[slot]];
    g->open = false;
    build_free(&g->b);
    pl->open[slot] = pl->open[--pl->nopen];
}

static bool add_member(agroup *g, int i) {
    if (!grow((void **)&g->members, &g->cap, g->n + 1, sizeof *g->members)) return false;
    g->members[g->n++] = i;
    return true;
}

/* Try node i in open group g. */
static bool join(planner *pl, int g, int i, const tpu_ew_par *par) {
    agroup *ag = &pl->groups[g];
    if (!ag->open || !may_hoist(pl, g, i) || !try_join(&ag->b, i, par)) return false;
    if (!add_member(ag, i)) return false; /* (host memory: the group still holds i; it runs alone below) */
    pl->group_of[i] = g;
    pl->eff_pos[i] = ag->pos;
    return true;
}

/* Open a group for node i (closing the oldest open one if needed). */
static void open_group(planner *pl, int i, const tpu_ew_par *par) {
    if (pl->nopen == GR_OPEN) {
        int oldest = 0;
        for (int k = 1; k < pl->nopen; k++)
            if (pl->groups[pl->open[k]].pos < pl->groups[pl->open[oldest]].pos) oldest = k;
        close_group(pl, oldest);
    }
    int g = pl->ngroups;
    agroup *ag = &pl->groups[g];
    memset(ag, 0, sizeof *ag);
    ag->pos = i;
    ag->b.nodes = pl->gr->nodes;
    ag->b.map = &pl->map;
    build_reset(&ag->b);
    if (!try_join(&ag->b, i, par) || !add_member(ag, i)) {
        build_free(&ag->b);
        free(ag->members);
        return; /* runs alone */
    }
    ag->open = true;
    pl->ngroups++;
    pl->open[pl->nopen++] = g;
    pl->group_of[i] = g;
}

static void phase_a(planner *pl, const bool *fus, const tpu_ew_par *par) {
    const tpu_graph *gr = pl->gr;
    for (int i = 0; i < gr->n; i++) {
        const tpu_kargs *a = &gr->nodes[i];
        pl->group_of[i] = -1;
        pl->eff_pos[i] = i;
        if (fus[i]) {
            int cand[4], nc = 0; /* producers' groups first, then the previous node's */
            for (int j = tpu_op_infos[a->op].nout; j < a->n && nc < 3; j++) {
                if (a->t[j].is_scalar) continue;
                int w = pm_get(&pl->last_writer, a->t[j].base, 0) - 1;
                if (w >= 0 && pl->group_of[w] >= 0) cand[nc++] = pl->group_of[w];
            }
            if (i > 0 && pl->group_of[i - 1] >= 0) cand[nc++] = pl->group_of[i - 1];
            bool joined = false;
            for (int c = 0; c < nc && !joined; c++) {
                bool seen = false;
                for (int d = 0; d < c; d++) seen = seen || cand[d] == cand[c];
                joined = !seen && join(pl, cand[c], i, &par[i]);
            }
            if (!joined) open_group(pl, i, &par[i]);
        }
        int nout = tpu_op_infos[a->op].nout;
        for (int k = 0; k < nout && k < a->n; k++)
            if (!a->t[k].is_scalar && a->t[k].base) pm_put(&pl->last_writer, a->t[k].base, i + 1);
    }
    while (pl->nopen) close_group(pl, 0);
}

/* The plan of graph gr (steps, groups, which results are stored), without
 * the nodes or the list of storages written (plan_bind adds those). */
static tpu_gprog *plan_fresh(const tpu_graph *gr) {
    int n = gr->n, n1 = n ? n : 1;
    tpu_gprog *p = calloc(1, sizeof *p);
    planner pl = {0};
    pl.gr = gr;
    gbuild b = {0};
    liveness L = {0};
    tpu_ew_par *par = malloc((size_t)n1 * sizeof *par);
    bool *fus = malloc((size_t)n1 * sizeof *fus);
    pl.group_of = malloc((size_t)n1 * sizeof *pl.group_of);
    pl.eff_pos = malloc((size_t)n1 * sizeof *pl.eff_pos);
    pl.groups = malloc((size_t)n1 * sizeof *pl.groups);
    bool ok = p && par && fus && pl.group_of && pl.eff_pos && pl.groups;
    ok = ok && pair_init(&pl.map, 16 * (size_t)n1) && pm_init(&pl.last_writer, (size_t)n1 * TPU_MAX_OPERANDS);
    if (ok) {
        p->steps = malloc((size_t)n1 * sizeof *p->steps);
        p->groups = calloc((size_t)n1, sizeof *p->groups);
        p->order = malloc((size_t)n1 * sizeof *p->order);
        p->node_step = malloc((size_t)n1 * sizeof *p->node_step);
        p->node_store = calloc((size_t)n1, 1);
        ok = p->steps && p->groups && p->order && p->node_step && p->node_store;
    }
    if (!ok) goto oom;

    /* 1. Groups (phase A), then steps in the order they run: a group at its first node. */
    for (int i = 0; i < n; i++) fus[i] = fusible(&gr->nodes[i], &par[i]);
    phase_a(&pl, fus, par);
    if (pl.last_writer.bad) goto oom;
    int norder = 0;
    for (int i = 0; i < n; i++) {
        int g = pl.group_of[i];
        if (g >= 0 && pl.groups[g].n > 1 && pl.groups[g].pos != i) continue; /* runs with its group */
        gr_step *s = &p->steps[p->nsteps];
        if (g >= 0 && pl.groups[g].n > 1) {
            *s = (gr_step){norder, pl.groups[g].n, -2 - g, false}; /* (planner group, resolved below) */
            for (int m = 0; m < pl.groups[g].n; m++) p->order[norder++] = pl.groups[g].members[m];
        } else {
            *s = (gr_step){norder, 1, -1, false};
            p->order[norder++] = i;
        }
        for (int m = s->first; m < s->first + s->count; m++) p->node_step[p->order[m]] = p->nsteps;
        p->nsteps++;
    }

    /* 2. Liveness: where each storage is read and freed (groups of two or more only). */
    for (int i = 0; i < n; i++)
        if (pl.group_of[i] >= 0 && pl.groups[pl.group_of[i]].n < 2) pl.group_of[i] = -1;
    if (!live_build(&L, gr, pl.group_of)) goto oom;

    /* 3. Groups: rebuild each (same joins as phase A), decide stores, allocate slots. */
    b.nodes = gr->nodes;
    b.map = &pl.map;
    for (int st = 0; st < p->nsteps; st++) {
        gr_step *s = &p->steps[st];
        for (int m = s->first; m < s->first + s->count; m++) p->node_store[p->order[m]] = 1;
        if (s->group == -1) {
            const tpu_kargs *a = &gr->nodes[p->order[s->first]];
            s->dropped = tpu_graph_droppable(a) && !value_read(&L, a->t[0].base, p->order[s->first]);
            p->node_store[p->order[s->first]] = !s->dropped;
            p->info.dropped += s->dropped;
            p->info.dead_results += s->dropped;
            continue;
        }
        build_reset(&b);
        for (int m = s->first; m < s->first + s->count; m++) try_join(&b, p->order[m], &par[p->order[m]]);
        if (b.nops != s->count) goto oom; /* (the shared map ran full: cannot happen at 16 keys per node) */
        decide_stores(&b, pl.group_of[p->order[s->first]], &L);
        if (!finish_group(&b, &p->groups[p->ngroups])) goto oom;
        p->groups[p->ngroups].table_in = (int16_t)tpu_gr_table_input(&p->groups[p->ngroups], gr->nodes);
        p->info.table_groups += p->groups[p->ngroups].table_in >= 0;
        s->group = p->ngroups++;
        p->info.groups++;
        p->info.fused_nodes += s->count;
        const gr_group *g = &p->groups[s->group];
        for (int m = 0; m < s->count; m++) {
            p->node_store[g->ops[m].node] = g->ops[m].store >= 0;
            p->info.dead_results += g->ops[m].store < 0;
        }
    }
    p->info.nodes = n;
    p->info.steps = p->nsteps;
    goto done;

oom:
    if (p) prog_free_parts(p);
    free(p);
    p = NULL;
done:
    for (int g = 0; pl.groups && g < pl.ngroups; g++) {
        build_free(&pl.groups[g].b);
        free(pl.groups[g].members);
    }
    build_free(&b);
    free(pl.groups);
    free(pl.group_of);
    free(pl.eff_pos);
    pair_free(&pl.map);
    pm_free(&pl.last_writer);
    live_free(&L);
    free(par);
    free(fus);
    return p;
}

/* A deep copy of plan t (no nodes, no stores). */
static tpu_gprog *plan_clone(const tpu_gprog *t) {
    tpu_gprog *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    int n = t->info.nodes ? t->info.nodes : 1;
    p->nsteps = t->nsteps;
    p->ngroups = t->ngroups;
    p->info = t->info;
    p->steps = malloc((size_t)(t->nsteps ? t->nsteps : 1) * sizeof *p->steps);
    p->groups = calloc((size_t)(t->ngroups ? t->ngroups : 1), sizeof *p->groups);
    p->node_step = malloc((size_t)n * sizeof *p->node_step);
    p->node_store = malloc((size_t)n);
    p->order = malloc((size_t)n * sizeof *p->order);
    bool ok = p->steps && p->groups && p->node_step && p->node_store && p->order;
    for (int i = 0; ok && i < t->ngroups; i++) {
        const gr_group *s = &t->groups[i];
        gr_group *d = &p->groups[i];
        *d = *s;
        d->ops = NULL, d->cst = NULL, d->mem = NULL; /* (not the template's, if a malloc below fails) */
        d->ops = malloc((size_t)s->nops * sizeof *d->ops);
        d->cst = malloc((size_t)(s->ncst ? s->ncst : 1) * sizeof *d->cst);
        d->mem = malloc((size_t)(s->nmem ? s->nmem : 1) * sizeof *d->mem);
        ok = d->ops && d->cst && d->mem;
        if (!ok) break;
        memcpy(d->ops, s->ops, (size_t)s->nops * sizeof *d->ops);
        memcpy(d->cst, s->cst, (size_t)s->ncst * sizeof *d->cst);
        memcpy(d->mem, s->mem, (size_t)s->nmem * sizeof *d->mem);
    }
    if (!ok) {
        tpu_gprog_free(p);
        return NULL;
    }
    memcpy(p->steps, t->steps, (size_t)t->nsteps * sizeof *p->steps);
    memcpy(p->node_step, t->node_step, (size_t)t->info.nodes * sizeof *p->node_step);
    memcpy(p->node_store, t->node_store, (size_t)t->info.nodes);
    memcpy(p->order, t->order, (size_t)t->info.nodes * sizeof *p->order);
    return p;
}

/* A memory event of a program (tpu_gprog_mem_peak): at `pos` (a node's
 * index; a free after pos nodes), storage `base` written, or freed (bytes;
 * fresh: allocated inside the window, not bound before). Sorted by storage,
 * then position, a free before a write at the same position. */
enum { MEV_FREE_FRESH, MEV_FREE_BOUND, MEV_WRITE };
typedef struct gr_memev {
    void *base;
    int pos, kind;
    size_t bytes;
} gr_memev;

static int memev_cmp(const void *x, const void *y) {
    const gr_memev *a = x, *b = y;
    if (a->base != b->base) return (uintptr_t)a->base < (uintptr_t)b->base ? -1 : 1;
    if (a->pos != b->pos) return a->pos < b->pos ? -1 : 1;
    return (a->kind > MEV_FREE_BOUND) - (b->kind > MEV_FREE_BOUND);
}

size_t tpu_gprog_mem_peak(const tpu_gprog *p, size_t (*fresh_alive)(void *user, void *base), void *user) {
    int n = p->n;
    int64_t *delta = calloc((size_t)n + 2, sizeof *delta), total = 0;
    for (int e = 0; e < p->nmev;) {
        void *base = p->mev[e].base;
        int w = -1; /* the current lifetime's first write */
        for (; e < p->nmev && p->mev[e].base == base; e++) {
            const gr_memev *v = &p->mev[e];
            int from = -1;
            if (v->kind == MEV_WRITE) {
                if (w < 0) w = v->pos;
                continue;
            }
            if (v->kind == MEV_FREE_BOUND)
                from = 0; /* bound before the window: it counts until freed */
            else if (w >= 0)
                from = w; /* (fresh and never stored: a dead intermediate) */
            w = -1;
            if (from < 0 || from >= v->pos) continue;
            total += (int64_t)v->bytes;
            if (delta) delta[from] += (int64_t)v->bytes, delta[v->pos] -= (int64_t)v->bytes;
        }
        size_t alive = w >= 0 ? fresh_alive(user, base) : 0; /* alive at the end, bound by the flush */
        total += (int64_t)alive;
        if (delta) delta[w >= 0 ? w : n + 1] += (int64_t)alive;
    }
    if (!delta) return (size_t)total; /* (no host memory: everything at once, an upper bound) */
    int64_t cur = 0, peak = 0;
    for (int i = 0; i <= n + 1; i++) {
        cur += delta[i];
        if (cur > peak) peak = cur;
    }
    free(delta);
    return (size_t)peak;
}

/* Give plan p the graph's nodes (gr is left empty) and list the storages
 * it writes; `refresh`: recompute each fused op's parameters from its node
 * (a cached plan meets new parameter values). */
static bool plan_bind(tpu_gprog *p, tpu_graph *gr, bool refresh) {
    int n = gr->n;
    ptrmap seen = {0};
    size_t nops = 1;
    for (int i = 0; i < n; i++) nops += (size_t)gr->nodes[i].n;
    p->stores = malloc(nops * sizeof *p->stores);
    p->mev = malloc((nops + (size_t)gr->nfreed) * sizeof *p->mev);
    p->nmev = 0;
    if (!p->stores || !p->mev || !pm_init(&seen, nops)) {
        pm_free(&seen);
        return false;
    }
    for (int st = 0; st < p->nsteps; st++) {
        const gr_step *s = &p->steps[st];
        for (int m = s->first; m < s->first + s->count; m++) {
            int i = p->order[m];
            const tpu_kargs *a = &gr->nodes[i];
            const gr_op *go = s->group >= 0 ? &p->groups[s->group].ops[m - s->first] : NULL;
            if (refresh && go && !is_random(a->op) && !go->rowfn)
                tpu_ew_prepare_f(a, &p->groups[s->group].ops[m - s->first].par);
            int nout = go ? (go->ln ? 3 : 1) : tpu_op_infos[a->op].nout;
            for (int k = 0; k < nout && k < a->n; k++) {
                if (go ? (k == 0 ? go->store < 0 : go->lnstore[k - 1] < 0) : !p->node_store[i]) continue;
                void *base = a->t[k].base;
                if (a->t[k].is_scalar || !base) continue;
                p->mev[p->nmev++] = (gr_memev){base, i, MEV_WRITE, 0};
                if (pm_get(&seen, base, 0)) continue;
                pm_put(&seen, base, 1);
                p->stores[p->nstores++] = base;
            }
        }
    }
    for (int f = 0; f < gr->nfreed; f++)
        p->mev[p->nmev++] = (gr_memev){gr->freed[f], gr->freed_at[f],
                                       gr->freed_fresh[f] ? MEV_FREE_FRESH : MEV_FREE_BOUND, gr->freed_size[f]};
    qsort(p->mev, (size_t)p->nmev, sizeof *p->mev, memev_cmp);
    bool bad = seen.bad;
    pm_free(&seen);
    if (bad) return false;
    p->nodes = gr->nodes;
    p->n = n;
    p->cap = gr->cap;
    gr->nodes = NULL;
    gr->n = gr->cap = 0;
    gr->nfreed = 0;
    return true;
}

/* ---- the plan cache ----
 * A plan depends on the graph's structure only: per node the op, operand
 * count and compute dtype, per operand whether it is a host scalar, else
 * its dtype, rank, sizes, strides, offset and which storage it views (the
 * storage's order of first appearance, not its address); and which of
 * those storages were freed. That sequence of words is the key; its hash
 * finds the entry and the whole key is compared, so a hit is exact. */

#define GR_CACHE_ENTRIES 32

typedef struct gr_cache_entry {
    uint64_t hash, stamp;
    uint64_t *key;
    size_t len;
    tpu_gprog *plan;
} gr_cache_entry;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static gr_cache_entry cache[GR_CACHE_ENTRIES];
static uint64_t cache_clock;

/* The key of gr: its nodes' words (built as they were appended) and then
 * its frees'; NULL if too large or no host memory. The words stay the
 * graph's; key_unfreeze takes the frees' back off. */
static const uint64_t *plan_key(tpu_graph *gr, size_t *len, uint64_t *hash) {
    gr_key *K = gr->key;
    if (!K || K->k.bad || K->ord.bad) return NULL;
    keybuf *k = &K->k;
    kput(k, ~(uint64_t)1);
    for (int f = 0; f < gr->nfreed; f++) {
        kput(k, (uint64_t)pm_get(&K->ord, gr->freed[f], 0) | (uint64_t)(uint32_t)gr->freed_at[f] << 32);
        kput(k, (uint64_t)gr->freed_size[f]);
    }
    if (k->bad) return NULL;
    /* FNV-1a over the words, in four interleaved lanes (one serial chain
     * of multiplies was most of a cached flush's time) */
    uint64_t l[4] = {1469598103934665603ull, 1, 2, 3};
    size_t i = 0;
    for (; i + 4 <= k->n; i += 4)
        for (int j = 0; j < 4; j++) l[j] = (l[j] ^ k->w[i + j]) * 1099511628211ull;
    for (; i < k->n; i++) l[0] = (l[0] ^ k->w[i]) * 1099511628211ull;
    uint64_t h = l[0];
    for (int j = 1; j < 4; j++) h = (h ^ l[j]) * 1099511628211ull;
    *len = k->n;
    *hash = h;
    return k->w;
}

/* A copy of the cached plan for key, or NULL. */
static tpu_gprog *cache_find(uint64_t hash, const uint64_t *key, size_t len) {
    tpu_gprog *p = NULL;
    pthread_mutex_lock(&cache_mu);
    for (int i = 0; i < GR_CACHE_ENTRIES; i++) {
        gr_cache_entry *e = &cache[i];
        if (e->plan && e->hash == hash && e->len == len && memcmp(e->key, key, len * sizeof *key) == 0) {
            e->stamp = ++cache_clock;
            p = plan_clone(e->plan);
            break;
        }
    }
    pthread_mutex_unlock(&cache_mu);
    return p;
}

/* Keep a copy of plan p under (a copy of) key; evicts the least recently used entry. */
static void cache_insert(uint64_t hash, const uint64_t *k, size_t len, const tpu_gprog *p) {
    tpu_gprog *copy = plan_clone(p);
    uint64_t *key = copy ? malloc(len * sizeof *key) : NULL;
    if (!key) {
        tpu_gprog_free(copy);
        return;
    }
    memcpy(key, k, len * sizeof *key);
    pthread_mutex_lock(&cache_mu);
    int victim = 0;
    for (int i = 1; i < GR_CACHE_ENTRIES; i++)
        if (cache[i].stamp < cache[victim].stamp) victim = i;
    gr_cache_entry *e = &cache[victim];
    tpu_gprog *old = e->plan;
    uint64_t *oldkey = e->key;
    *e = (gr_cache_entry){hash, ++cache_clock, key, len, copy};
    pthread_mutex_unlock(&cache_mu);
    tpu_gprog_free(old);
    free(oldkey);
}

static _Atomic bool allow_excess;
void tpu_set_allow_excess_precision(bool on) { atomic_store(&allow_excess, on); }
bool tpu_get_allow_excess_precision(void) { return atomic_load(&allow_excess); }

/* Lookup tables: on unless TORCH_TPU_FUSED_TABLES=0 (or set off). */
static _Atomic int tables_on = -1;
void tpu_set_fused_tables(bool on) { atomic_store(&tables_on, on ? 1 : 0); }
bool tpu_get_fused_tables(void) {
    int on = atomic_load_explicit(&tables_on, memory_order_relaxed);
    if (on < 0) {
        const char *v = getenv("TORCH_TPU_FUSED_TABLES");
        on = !(v && strcmp(v, "0") == 0);
        atomic_store_explicit(&tables_on, on, memory_order_relaxed);
    }
    return on;
}

tpu_gprog *tpu_graph_compile(tpu_graph *gr) {
    size_t len = 0;
    uint64_t hash = 0;
    size_t nodes_len = gr->key ? gr->key->k.n : 0;
    const uint64_t *key = plan_key(gr, &len, &hash);
    tpu_gprog *p = key ? cache_find(hash, key, len) : NULL;
    bool hit = p != NULL;
    if (!p) p = plan_fresh(gr);
    if (p && !hit && key) cache_insert(hash, key, len, p);
    if (gr->key) gr->key->k.n = nodes_len; /* the frees' words off again */
    if (p) p->info.cache_hit = hit;
    if (p && plan_bind(p, gr, hit)) {
        key_reset(gr);
        p->excess = atomic_load_explicit(&allow_excess, memory_order_relaxed);
        p->tables = tpu_get_fused_tables();
    } else {
        tpu_gprog_free(p);
        tpu_set_error(TPU_ERROR_OUT_OF_MEMORY, "out of host memory compiling a graph of %d nodes", gr->n);
        return NULL;
    }
    return p;
}

tpu_gprog_info tpu_gprog_get_info(const tpu_gprog *p) {
    tpu_gprog_info info = p->info;
    if (!p->tables) info.table_groups = 0;
    return info;
}

void tpu_gprog_foreach_store(const tpu_gprog *p, void (*fn)(void *user, void *base), void *user) {
    for (int i = 0; i < p->nstores; i++) fn(user, p->stores[i]);
}

tpu_status tpu_gprog_run(tpu_gprog *p, char *err, size_t errlen) {
    tpu_status first = TPU_OK;
    for (int st = 0; st < p->nsteps; st++) {
        const gr_step *s = &p->steps[st];
        if (s->group >= 0) {
            tpu_status gs = tpu_gr_run_group(p, &p->groups[s->group]);
            if (gs && !first) {
                first = TPU_ERROR_KERNEL;
                snprintf(err, errlen, "tpu fused group of %d ops (from '%s') failed: out of host memory", s->count,
                         tpu_op_name(p->nodes[p->order[s->first]].op));
            }
            continue;
        }
        if (s->dropped) continue;
        tpu_kargs *a = &p->nodes[p->order[s->first]];
        a->err[0] = 0;
        tpu_status ks = tpu_kernel_run(a);
        if (ks && !first) {
            first = TPU_ERROR_KERNEL;
            tpu_kernel_failure_text(a, ks, err, errlen);
        }
    }
    return first;
}

void tpu_gprog_dump(const tpu_gprog *p, FILE *f) {
    fprintf(f, "tpu fused window: %d nodes, %d steps, %d fused groups (%d nodes), %lld results never stored\n",
            p->info.nodes, p->info.steps, p->info.groups, p->info.fused_nodes, (long long)p->info.dead_results);
    for (int i = 0; i < p->n; i++) {
        const tpu_kargs *a = &p->nodes[i];
        const gr_step *s = &p->steps[p->node_step[i]];
        fprintf(f, "  %4d %-18s %-8s [", i, tpu_op_name(a->op), tpu_dtype_name((tpu_dtype)a->t[0].dtype));
        for (int d = 0; d < a->t[0].ndim; d++) fprintf(f, d ? ", %lld" : "%lld", (long long)a->t[0].sizes[d]);
        fprintf(f, "]  step %d %s %s\n", p->node_step[i],
                s->group >= 0 ? "fused"
                : s->dropped  ? "dropped"
                              : "kernel",
                p->node_store[i] ? "stored" : "dead");
    }
}
