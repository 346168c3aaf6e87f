/* interp.c - the block interpreter: runs a fused group over its iteration
 * space in tiles of up to GR_TILE elements, on the compute pool.
 *
 * The group's memory operands are coalesced together (tpu_tile_coalesce, as
 * one launch's operands are in elementwise.c), then the space is cut into blocks of GR_GRAIN
 * elements for tpu_parallel_for. Each block walks its rows a tile at a time
 * and runs the group's ops in order on tile-sized slots: loads convert any
 * dtype and stride into float32 (the tile layer), the op is its ops.def
 * expression (tpu_ew_tile_f, the fast kernel's own code), the result is
 * rounded to its dtype, and stored if the group decided it reaches memory.
 *
 * Row mode. A group holding a row reduction (a sum, mean, max or min over
 * the last dim of a value the group computes: graph.c) runs a whole row
 * per tile, so the reduction folds the row's values exactly as its kernel
 * folds them in memory (tpu_red_row_value: the same fold, the same
 * association, so the same bits) and stores one value per row; the value
 * it folds is never stored unless something else reads it (x.pow(2).mean(-1)
 * reads x once and writes the means). A layer norm over the last dim runs
 * the same way, through its kernel's row function (tpu_ln_row_f): y over
 * its slot, mean and rstd stored if needed. Blocks of the parallel loop are
 * whole rows.
 *
 * Lookup tables. A group whose only memory input x has 8 or 16 bits
 * (its other inputs host scalars, no random op) computes each stored result
 * as a function of x's bits alone: 256 or 65536 possible inputs. When the
 * tensor is much larger than that and the group has a few ops, the group
 * first runs - through the same code below, so to the same bits - over a
 * buffer holding every possible input, into one table per stored result,
 * then each element's results are looked up: one pass over memory for the
 * whole chain (TorchTPU's eager demo: 150 bf16 ops on 25M elements). Tables
 * are cached by the group's ops, parameters and constants (the next window
 * of a training loop, or the next iteration of a loop, reuses them). */
#include "graph/prog-impl.h"
#include <pthread.h>
#include "kernels/tile-impl.h"
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define GR_GRAIN 16384 /* elements per parallel block */
/* Elements per tile: each op of a group costs a call, a dispatch on its op
 * and its operands' set-up per tile; groups whose slots fit in level-1 cache
 * at 1024 floats each run tiles that long. (Measured on the eager demo, 150
 * bf16 ops: no change beyond noise against 256-element tiles; what made the
 * difference there was constants sharing slots, below.) */
#define GR_TILE       1024
#define GR_LONG_SLOTS 7 /* slots (zeros, constants, live values) of a group run at GR_TILE */
/* Slots lie GR_SLOT_PAD floats more than a tile apart: at a power-of-two
 * distance an op's loads from one slot and its stores to the next alias in
 * the core's 4 KiB store-to-load check and stall. */
#define GR_SLOT_PAD 16
_Static_assert(GR_TILE % TPU_TILE == 0, "tile functions take whole TPU_TILE blocks");
/* Over a tile's n elements in blocks of fixed trip count (they vectorize at -O2). */
#define GR_LOOP(i)                           \
    for (int b_ = 0; b_ < n; b_ += TPU_TILE) \
        for (int i = b_; i < b_ + TPU_TILE; i++)

typedef struct gr_run {
    const gr_group *g;
    const tpu_kargs *nodes;
    bool excess;   /* bf16/f16 results of arithmetic stay float32 in the group */
    int tile;      /* elements per tile: GR_TILE or TPU_TILE, or a row rounded up to TPU_TILE (row mode) */
    int64_t grain; /* elements per parallel block: GR_GRAIN, or whole rows (row mode) */
    /* The group's slots as laid out in memory: constants of equal value
     * share one (a chain of `x + 1` has one tile of ones, not one per op:
     * the slots stay in level-1 cache), phys[slot] is where slot lives. */
    int16_t *phys;
    int nphys;
    float *cval; /* the distinct constants, in phys slots 1 .. ncval */
    int ncval;
    int nd;
    int64_t numel;
    int64_t sz[TPU_MAX_DIMS];
    /* per memory operand (g->nmem of each): */
    int64_t (*st)[TPU_MAX_DIMS];
    char **base; /* element 0 */
    tpu_dtype *dt;
    size_t *esz;
    atomic_bool oom; /* a block found no host memory for its slots */
} gr_run;

/* v over a tile of n floats (n a multiple of TPU_TILE; vectorized). */
static TPU_TARGET_CLONES void gr_fill(float *restrict t, float v, int n) { GR_LOOP(i) t[i] = v; }

/* Round a tile to dt as a store to dt and a load back would. */
static TPU_TARGET_CLONES void gr_round(float *restrict v, int n, tpu_dtype dt) {
    switch (dt) {
    case TPU_BF16: GR_LOOP(i) v[i] = ew_round_bf16(v[i]); break;
    case TPU_F16: GR_LOOP(i) v[i] = tpu_tile_f16_to_f32(tpu_tile_f32_to_f16(v[i])); break;
    case TPU_BOOL: /* nonzero (NaN included) -> 1 */ GR_LOOP(i) v[i] = v[i] != 0.0f ? 1.0f : 0.0f; break;
    default: break;
    }
}

/* A random fill's tile: elements pos .. pos + len of its output, each from
 * (seed, offset, element index) exactly as the random kernel draws it. */
static void gr_random(const tpu_kargs *a, float *out, int64_t pos, int len, int tile) {
    double p = a->op != TPU_OP_RAND_BERNOULLI ? 0.0 : a->n > 1 ? a->t[1].f : tpu_unpack_RAND_BERNOULLI(&a->p).p;
    if (tpu_random_floats(a, pos, len, p, out)) {
        for (int j = len; j < tile; j++) out[j] = 0.0f;
        return;
    }
    tpu_rand_cache cache;
    memset(&cache, 0, sizeof cache);
    for (int j = 0; j < len; j++) {
        double fv = 0;
        int64_t iv = 0;
        tpu_random_element(a, pos + j, &cache, p, &fv, &iv);
        out[j] = (float)fv;
    }
    for (int j = len; j < tile; j++) out[j] = 0.0f;
}

/* A row function's result (row mode: the tile is the row), stored if needed. */
static void gr_store_row(const gr_run *r, const gr_op *o, const int64_t *off, int64_t inner, const float *out,
                         int len) {
    int m = o->store;
    if (m < 0) return;
    int64_t s = r->st[m][r->nd - 1];
    tpu_tile_store_f32(r->base[m] + (size_t)(off[m] + inner * s) * r->esz[m], s, out, len, r->dt[m]);
}

/* One tile: len elements starting `inner` into the current row, `pos` into
 * the iteration space (row-major: the outputs' element index). */
static void gr_tile(const gr_run *r, float *S, const int64_t *off, int64_t inner, int len, int64_t pos) {
    const gr_group *g = r->g;
    const int T = r->tile, SS = T + GR_SLOT_PAD;
    for (int i = 0; i < g->nops; i++) {
        const gr_op *o = &g->ops[i];
        for (int j = 0; j < o->nin; j++) {
            int m = o->load[j];
            if (m < 0) continue;
            int64_t s = r->st[m][r->nd - 1];
            float *dst = S + (size_t)r->phys[o->in[j]] * SS;
            tpu_tile_load_f32(dst, r->base[m] + (size_t)(off[m] + inner * s) * r->esz[m], s, len, r->dt[m]);
            if (len < T) memset(dst + len, 0, (size_t)(T - len) * sizeof *dst);
        }
        if (o->skip) continue;
        float *out = S + (size_t)r->phys[o->out] * SS;
        if (o->ln) { /* row mode: the tile is x's row; y over the slot, mean and rstd stored if needed */
            const tpu_kargs *ln = &r->nodes[o->node];
            tpu_args_LAYER_NORM q = tpu_unpack_LAYER_NORM(&ln->p);
            int j = 1;
            const float *w = q.has_weight ? S + (size_t)r->phys[o->in[j++]] * SS : NULL;
            const float *b = q.has_bias ? S + (size_t)r->phys[o->in[j]] * SS : NULL;
            double st[2];
            tpu_ln_row_f(out, S + (size_t)r->phys[o->in[0]] * SS, len, w, b, q.eps, &st[0], &st[1]);
            gr_round(out, T, o->round);
            for (int k = 0; k < 2; k++)
                if (o->lnstore[k] >= 0)
                    tpu_store_f64(r->base[o->lnstore[k]] + (size_t)off[o->lnstore[k]] * r->esz[o->lnstore[k]],
                                  r->dt[o->lnstore[k]], st[k]);
            gr_store_row(r, o, off, inner, out, len);
            continue;
        }
        if (o->red) { /* row mode: the tile is the row; its value as stored, over the slot */
            const tpu_kargs *rn = &r->nodes[o->node];
            double v = tpu_red_row_value(rn->op, (tpu_dtype)rn->t[1].dtype, S + (size_t)r->phys[o->in[0]] * SS, len);
            unsigned char held[8];
            tpu_store_f64(held, o->round, v);
            float f = (float)tpu_load_f64(held, o->round);
            gr_fill(out, f, T);
            if (o->store >= 0)
                memcpy(r->base[o->store] + (size_t)off[o->store] * r->esz[o->store], held, r->esz[o->store]);
            continue;
        }
        if (o->rowfn) { /* row mode: a softmax-family op over the row (its kernel's row function) */
            tpu_softmax_row_f(r->nodes[o->node].op, out, S + (size_t)r->phys[o->in[0]] * SS,
                              o->nin > 1 ? S + (size_t)r->phys[o->in[1]] * SS : NULL, len);
            gr_round(out, T, o->round);
            gr_store_row(r, o, off, inner, out, len);
            continue;
        }
        const float *x = S + (size_t)r->phys[o->in[0]] * SS, *y = S + (size_t)r->phys[o->in[1]] * SS;
        const float *z = S + (size_t)r->phys[o->in[2]] * SS;
        bool half = o->round == TPU_BF16 || o->round == TPU_F16;
        const int n = o->rowop ? TPU_TILE : T; /* a row op: one value per row, computed once */
        if (o->random) {
            gr_random(&r->nodes[o->node], out, pos, len, T);
            gr_round(out, T, o->round);
        } else if (half && r->excess && r->nodes[o->node].op != TPU_OP_COPY) { /* (a cast still rounds) */
            tpu_ew_tile_f(r->nodes[o->node].op, n, out, x, y, z, &o->par);     /* a store rounds what it writes */
        } else if (o->round == TPU_BF16) {
            tpu_ew_tile_f_bf16(r->nodes[o->node].op, n, out, x, y, z, &o->par); /* rounds in the loop */
        } else {
            tpu_ew_tile_f(r->nodes[o->node].op, n, out, x, y, z, &o->par);
            gr_round(out, n, o->round);
        }
        if (o->rowop) gr_fill(out, out[0], T);
        if (o->store >= 0) {
            int m = o->store;
            int64_t s = r->st[m][r->nd - 1];
            tpu_tile_store_f32(r->base[m] + (size_t)(off[m] + inner * s) * r->esz[m], s, out, o->rowop ? 1 : len,
                               r->dt[m]);
        }
    }
}

/* Output elements [lo, hi) in row-major order (as ew_run_range). */
static void gr_range(const gr_run *r, float *S, int64_t *off, int64_t lo, int64_t hi) {
    int nd = r->nd, nm = r->g->nmem;
    int64_t n0 = r->sz[nd - 1], rest = lo / n0, inner = lo % n0;
    int64_t idx[TPU_MAX_DIMS] = {0};
    memset(off, 0, (size_t)nm * sizeof *off);
    for (int d = nd - 2; d >= 0; d--) {
        idx[d] = rest % r->sz[d];
        rest /= r->sz[d];
    }
    for (int m = 0; m < nm; m++)
        for (int d = 0; d < nd - 1; d++) off[m] += idx[d] * r->st[m][d];
    for (int64_t pos = lo; pos < hi;) {
        int64_t len = n0 - inner < hi - pos ? n0 - inner : hi - pos;
        if (len > r->tile) len = r->tile;
        gr_tile(r, S, off, inner, (int)len, pos);
        pos += len;
        inner += len;
        if (inner < n0) continue;
        inner = 0;
        for (int d = nd - 2; d >= 0; d--) {
            for (int m = 0; m < nm; m++) off[m] += r->st[m][d];
            if (++idx[d] < r->sz[d]) break;
            for (int m = 0; m < nm; m++) off[m] -= idx[d] * r->st[m][d];
            idx[d] = 0;
        }
    }
}

static void gr_blocks(void *ctx, int64_t b0, int64_t b1) {
    gr_run *r = ctx;
    const gr_group *g = r->g;
    const int T = r->tile, SS = T + GR_SLOT_PAD;
    enum {
        STACK_FLOATS = 16 * (TPU_TILE + GR_SLOT_PAD) > GR_LONG_SLOTS * (GR_TILE + GR_SLOT_PAD)
            ? 16 * (TPU_TILE + GR_SLOT_PAD)
            : GR_LONG_SLOTS * (GR_TILE + GR_SLOT_PAD)
    };
    _Alignas(64) float stack_slots[STACK_FLOATS];
    int64_t stack_off[32];
    float *S =
        (size_t)r->nphys * SS <= STACK_FLOATS ? stack_slots : aligned_alloc(64, (size_t)r->nphys * SS * sizeof(float));
    int64_t *off = g->nmem <= 32 ? stack_off : malloc((size_t)g->nmem * sizeof *off);
    if (!S || !off) {
        if (S != stack_slots) free(S);
        if (off != stack_off) free(off);
        atomic_store(&r->oom, true);
        return;
    }
    memset(S, 0, (size_t)T * sizeof *S); /* slot 0: zeros */
    for (int c = 0; c < r->ncval; c++) {
        float v = r->cval[c], *d = S + (size_t)(1 + c) * SS;
        for (int i = 0; i < T; i++) d[i] = v;
    }
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t lo = blk * r->grain, hi = lo + r->grain < r->numel ? lo + r->grain : r->numel;
        gr_range(r, S, off, lo, hi);
    }
    if (S != stack_slots) free(S);
    if (off != stack_off) free(off);
}

/* ---- lookup tables ---- */

#define GR_TABLE_MIN_OPS    3 /* ops computed per element: fewer are as fast to compute as to look up */
#define GR_TABLE_MIN_RATIO  4 /* elements per table entry, at least */
#define GR_TABLE_MAX_STORES 4
#define GR_TABLE_CACHE      8

int tpu_gr_table_input(const gr_group *g, const tpu_kargs *nodes) {
    int in = -1, nstores = 0, ncomp = 0;
    for (int i = 0; i < g->nops; i++) {
        const gr_op *o = &g->ops[i];
        if (o->random || o->red || o->rowfn) return -1;
        for (int j = 0; j < o->nin; j++)
            if (o->load[j] >= 0) {
                if (in >= 0 && in != o->load[j]) return -1; /* a second tensor input */
                in = o->load[j];
            }
        nstores += o->store >= 0;
        ncomp += !o->skip;
    }
    if (in < 0 || nstores == 0 || nstores > GR_TABLE_MAX_STORES || ncomp < GR_TABLE_MIN_OPS) return -1;
    const tpu_tensor *x = &nodes[g->mem[in].node].t[g->mem[in].k];
    size_t esz = tpu_dtype_size((tpu_dtype)x->dtype);
    if (esz > 2) return -1;
    /* every operand over the same contiguous run of elements */
    const tpu_tensor *views[GR_MAX_LOADS + GR_TABLE_MAX_STORES];
    if (g->nmem > GR_MAX_LOADS + GR_TABLE_MAX_STORES) return -1;
    for (int m = 0; m < g->nmem; m++) views[m] = &nodes[g->mem[m].node].t[g->mem[m].k];
    int64_t sz[TPU_MAX_DIMS], st[GR_MAX_LOADS + GR_TABLE_MAX_STORES][TPU_MAX_DIMS];
    int nd = 0;
    int64_t numel = tpu_tile_coalesce(&nodes[g->ops[0].node].t[0], g->nmem, views, sz, st, &nd);
    if (nd != 1 || numel < GR_TABLE_MIN_RATIO * ((int64_t)1 << (8 * esz))) return -1;
    for (int m = 0; m < g->nmem; m++)
        if (st[m][0] != 1) return -1;
    return in;
}

/* A cached set of tables: the group's key (what its results depend on) and
 * one table per stored result, in store order. */
typedef struct gr_table {
    uint64_t hash, stamp;
    unsigned char *key;
    size_t keylen;
    unsigned char *tab; /* the tables, back to back */
    int refs;           /* runs using it now: not evicted while > 0 */
} gr_table;

static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static gr_table tables[GR_TABLE_CACHE];
static uint64_t table_clock;

typedef struct keyw {
    unsigned char *b;
    size_t n, cap;
} keyw;

static void kw_put(keyw *k, const void *p, size_t n) {
    if (k->n + n > k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 4096;
        while (cap < k->n + n) cap *= 2;
        unsigned char *b = realloc(k->b, cap);
        if (!b) { /* no host memory: an empty key (the group runs without tables) */
            free(k->b);
            *k = (keyw){0};
            k->cap = (size_t)-1;
            return;
        }
        k->b = b;
        k->cap = cap;
    }
    if (k->cap == (size_t)-1) return;
    memcpy(k->b + k->n, p, n);
    k->n += n;
}

/* What the results of group r depend on: per op its opcode and everything
 * the interpreter reads from it (slots, loads, stores, rounding, parameters
 * as pre-converted), the constants' values and slots, the operands' dtypes,
 * excess precision. Equal keys: equal tables. */
static bool table_key(const gr_run *r, keyw *k) {
    const gr_group *g = r->g;
    kw_put(k, &r->excess, sizeof r->excess);
    kw_put(k, &g->nops, sizeof g->nops);
    for (int i = 0; i < g->nops; i++) {
        gr_op o;
        memcpy(&o, &g->ops[i], sizeof o); /* (bytes, padding included: zeroed where ops are built) */
        int op = (int)r->nodes[o.node].op;
        o.node = 0; /* (where the node sits in the window is no input) */
        kw_put(k, &op, sizeof op);
        kw_put(k, &o, sizeof o);
    }
    kw_put(k, &r->nphys, sizeof r->nphys);
    kw_put(k, r->phys, (size_t)g->nslots * sizeof *r->phys);
    kw_put(k, &r->ncval, sizeof r->ncval);
    kw_put(k, r->cval, (size_t)r->ncval * sizeof *r->cval);
    kw_put(k, &g->nmem, sizeof g->nmem);
    kw_put(k, r->dt, (size_t)g->nmem * sizeof *r->dt);
    return k->b && k->cap != (size_t)-1;
}

static uint64_t key_hash(const keyw *k) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < k->n; i++) h = (h ^ k->b[i]) * 1099511628211ull;
    return h;
}

/* The cached entry for key k (its refs taken), or NULL. */
static gr_table *table_find(const keyw *k, uint64_t h) {
    gr_table *t = NULL;
    pthread_mutex_lock(&table_mu);
    for (int i = 0; i < GR_TABLE_CACHE && !t; i++)
        if (tables[i].tab && tables[i].hash == h && tables[i].keylen == k->n && memcmp(tables[i].key, k->b, k->n) == 0)
            t = &tables[i];
    if (t) {
        t->refs++;
        t->stamp = ++table_clock;
    }
    pthread_mutex_unlock(&table_mu);
    return t;
}

/* Keep tab under key k (both owned by the cache from here, refs taken), or
 * NULL if every entry is in use (the caller keeps and frees them). */
static gr_table *table_insert(keyw *k, uint64_t h, unsigned char *tab) {
    gr_table *t = NULL;
    unsigned char *oldkey = NULL, *oldtab = NULL;
    pthread_mutex_lock(&table_mu);
    for (int i = 0; i < GR_TABLE_CACHE; i++)
        if (tables[i].refs == 0 && (!t || tables[i].stamp < t->stamp)) t = &tables[i];
    if (t) {
        oldkey = t->key;
        oldtab = t->tab;
        *t = (gr_table){h, ++table_clock, k->b, k->n, tab, 1};
        k->b = NULL;
    }
    pthread_mutex_unlock(&table_mu);
    free(oldkey);
    free(oldtab);
    return t;
}

static void table_release(gr_table *t) {
    pthread_mutex_lock(&table_mu);
    t->refs--;
    pthread_mutex_unlock(&table_mu);
}

/* The stored results of group r: memory operand and element size of each. */
static int table_stores(const gr_run *r, int *mem, size_t *esz) {
    int n = 0;
    for (int i = 0; i < r->g->nops; i++)
        if (r->g->ops[i].store >= 0) {
            mem[n] = r->g->ops[i].store;
            esz[n++] = r->esz[r->g->ops[i].store];
        }
    return n;
}

/* Run group r over every possible input into tables (the group's own
 * blocks, over a contiguous buffer of all 2^(8 esz) bit patterns). */
static unsigned char *table_build(const gr_run *r, int in, size_t entries) {
    int mem[GR_TABLE_MAX_STORES], ns;
    size_t esz[GR_TABLE_MAX_STORES], total = 0;
    ns = table_stores(r, mem, esz);
    for (int j = 0; j < ns; j++) total += esz[j] * entries;
    int nm = r->g->nmem;
    unsigned char *tab = malloc(total);
    unsigned char *ident = malloc(entries * r->esz[in]);
    gr_run *t = malloc(sizeof *t);
    char **base = malloc((size_t)nm * sizeof *base);
    int64_t (*st)[TPU_MAX_DIMS] = malloc((size_t)nm * sizeof *st);
    if (!tab || !ident || !t || !base || !st) {
        free(tab);
        tab = NULL;
        goto done;
    }
    for (size_t e = 0; e < entries; e++) {
        if (r->esz[in] == 1)
            ident[e] = (unsigned char)e;
        else
            ((uint16_t *)ident)[e] = (uint16_t)e;
    }
    memcpy(t, r, sizeof *t); /* (the oom flag too: clear below) */
    atomic_init(&t->oom, false);
    t->numel = (int64_t)entries;
    t->grain = GR_GRAIN;
    t->nd = 1;
    t->sz[0] = (int64_t)entries;
    t->st = st;
    t->base = base;
    for (int m = 0; m < nm; m++) {
        st[m][0] = 1;
        base[m] = m == in ? (char *)ident : NULL; /* (only the input and the stores are touched) */
    }
    size_t off = 0;
    for (int j = 0; j < ns; j++) {
        base[mem[j]] = (char *)tab + off;
        off += esz[j] * entries;
    }
    tpu_parallel_for(((int64_t)entries + GR_GRAIN - 1) / GR_GRAIN, 1, gr_blocks, t);
    if (atomic_load(&t->oom)) {
        free(tab);
        tab = NULL;
    }
done:
    free(ident);
    free(t);
    free(base);
    free(st);
    return tab;
}

typedef struct table_job {
    const gr_run *r;
    int in, ns, mem[GR_TABLE_MAX_STORES];
    size_t esz[GR_TABLE_MAX_STORES];
    const unsigned char *tab[GR_TABLE_MAX_STORES];
} table_job;

/* Elements of blocks [b0, b1): their input bits first (a store may write
 * over the input in place), then each result from its table. */
static void table_blocks(void *ctx, int64_t b0, int64_t b1) {
    const table_job *j = ctx;
    const gr_run *r = j->r;
    uint16_t idx[GR_GRAIN];
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t lo = blk * GR_GRAIN, n = r->numel - lo < GR_GRAIN ? r->numel - lo : GR_GRAIN;
        if (r->esz[j->in] == 1) {
            const uint8_t *x = (const uint8_t *)r->base[j->in] + lo;
            for (int64_t i = 0; i < n; i++) idx[i] = x[i];
        } else {
            memcpy(idx, (const uint16_t *)r->base[j->in] + lo, (size_t)n * sizeof *idx);
        }
        for (int s = 0; s < j->ns; s++) {
            char *o = r->base[j->mem[s]] + (size_t)lo * j->esz[s];
            switch (j->esz[s]) {
            case 1:
                for (int64_t i = 0; i < n; i++) ((uint8_t *)o)[i] = j->tab[s][idx[i]];
                break;
            case 2:
                for (int64_t i = 0; i < n; i++) ((uint16_t *)o)[i] = ((const uint16_t *)j->tab[s])[idx[i]];
                break;
            default:
                for (int64_t i = 0; i < n; i++) ((uint32_t *)o)[i] = ((const uint32_t *)j->tab[s])[idx[i]];
                break;
            }
        }
    }
}

/* Group r as a lookup table over memory operand `in`; false: no host
 * memory for the tables (then the group runs the usual way). */
static bool table_run(const gr_run *r, int in) {
    size_t entries = (size_t)1 << (8 * r->esz[in]);
    keyw k = {0};
    if (!table_key(r, &k)) return false;
    uint64_t h = key_hash(&k);
    gr_table *t = table_find(&k, h);
    unsigned char *own = NULL; /* tables the cache had no room for */
    const unsigned char *tab;
    if (t) {
        tab = t->tab;
    } else {
        own = table_build(r, in, entries);
        if (!own) {
            free(k.b);
            return false;
        }
        t = table_insert(&k, h, own);
        if (t) own = NULL;
        tab = t ? t->tab : own;
    }
    free(k.b);
    table_job j = {.r = r, .in = in};
    j.ns = table_stores(r, j.mem, j.esz);
    size_t off = 0;
    for (int s = 0; s < j.ns; s++) {
        j.tab[s] = tab + off;
        off += j.esz[s] * entries;
    }
    tpu_parallel_for((r->numel + GR_GRAIN - 1) / GR_GRAIN, 1, table_blocks, &j);
    if (t) table_release(t);
    free(own);
    return true;
}

tpu_status tpu_gr_run_group(const tpu_gprog *p, const gr_group *g) {
    gr_run *r = malloc(sizeof *r);
    size_t nm = (size_t)(g->nmem ? g->nmem : 1);
    void *arrays = malloc((nm + 1) * (sizeof *r->st + sizeof *r->base + sizeof *r->dt + sizeof *r->esz));
    const tpu_tensor **views = malloc((nm + 1) * sizeof *views);
    int16_t *phys = malloc((size_t)(g->nslots + 1) * sizeof *phys);
    float *cval = malloc((size_t)(g->ncst + 1) * sizeof *cval);
    if (!r || !arrays || !views || !phys || !cval) {
        free(r);
        free(arrays);
        free(views);
        free(phys);
        free(cval);
        return TPU_ERROR_OUT_OF_MEMORY;
    }
    r->st = arrays;                      /* int64 rows first: every part stays aligned */
    r->base = (char **)(r->st + nm + 1); /* (st: one more row, for row mode's marker) */
    r->esz = (size_t *)(r->base + nm);
    r->dt = (tpu_dtype *)(r->esz + nm);
    r->g = g;
    atomic_init(&r->oom, false);
    r->nodes = p->nodes;
    r->excess = p->excess;
    /* constants hold slots 1 .. ncst (graph.c: finish_group), values the rest */
    r->phys = phys;
    r->cval = cval;
    r->ncval = 0;
    for (int sl = 0; sl < g->nslots; sl++) phys[sl] = (int16_t)sl;
    for (int c = 0; c < g->ncst; c++) {
        float v = (float)p->nodes[g->cst[c].node].t[g->cst[c].k].f;
        int d = 0;
        while (d < r->ncval && d < 64 && memcmp(&cval[d], &v, sizeof v) != 0) d++; /* (bits: -0 and NaNs kept apart) */
        if (d == r->ncval || d == 64) cval[d = r->ncval++] = v;
        phys[g->cst[c].slot] = (int16_t)(1 + d);
    }
    for (int sl = 1 + g->ncst; sl < g->nslots; sl++) phys[sl] = (int16_t)(sl - g->ncst + r->ncval);
    r->nphys = g->nslots - g->ncst + r->ncval;
    r->tile = r->nphys <= GR_LONG_SLOTS ? GR_TILE : TPU_TILE;
    const tpu_kargs *a0 = &p->nodes[g->ops[0].node];
    const tpu_tensor *space = g->ops[0].red ? &a0->t[1] : &a0->t[0]; /* (graph.c: group_space) */
    int64_t row = 0;                                                 /* row mode: the row's length */
    tpu_tensor *expanded = NULL; /* row mode: each row reduction's output seen over the space (stride 0 in the row) */
    for (int i = 0; i < g->nops; i++)
        if (g->ops[i].red || g->ops[i].rowfn) row = space->sizes[space->ndim - 1];
    if (row && !(expanded = malloc((size_t)(g->nmem + 1) * sizeof *expanded))) {
        free(r), free(arrays), free(views), free(phys), free(cval);
        return TPU_ERROR_OUT_OF_MEMORY;
    }
    for (int m = 0; m < g->nmem; m++) {
        const tpu_tensor *t = views[m] = &p->nodes[g->mem[m].node].t[g->mem[m].k];
        r->dt[m] = (tpu_dtype)t->dtype;
        r->esz[m] = tpu_dtype_size(r->dt[m]);
        r->base[m] = (char *)t->base + (size_t)t->offset * r->esz[m];
        if (row && tpu_gr_row_shaped(space, t)) { /* one element per row (row reductions and row ops) */
            expanded[m] = *t;
            expanded[m].sizes[t->ndim - 1] = row;
            expanded[m].strides[t->ndim - 1] = 0;
            views[m] = &expanded[m];
        } else if (p->nodes[g->mem[m].node].op == TPU_OP_LAYER_NORM && g->mem[m].k >= 4) {
            expanded[m] = *space; /* a layer norm's weight or bias: the same row for every row */
            expanded[m].base = t->base;
            expanded[m].offset = t->offset;
            expanded[m].dtype = t->dtype;
            for (int d = 0; d < space->ndim; d++) expanded[m].strides[d] = 0;
            expanded[m].strides[space->ndim - 1] = t->strides[0];
            views[m] = &expanded[m];
        }
    }
    int ncv = g->nmem;
    if (row) { /* a marker: rows contiguous, stride 0 along them (so coalescing never merges a row away) */
        tpu_tensor *mk = &expanded[g->nmem];
        *mk = *space;
        int64_t st = 1;
        mk->strides[space->ndim - 1] = 0;
        for (int d = space->ndim - 2; d >= 0; d--) {
            mk->strides[d] = st;
            st *= space->sizes[d];
        }
        views[ncv++] = mk;
    }
    r->numel = tpu_tile_coalesce(space, ncv, views, r->sz, r->st, &r->nd);
    r->grain = GR_GRAIN;
    if (row) { /* (the expanded outputs keep the row a dim of its own) */
        r->tile = (int)((row + TPU_TILE - 1) / TPU_TILE * TPU_TILE);
        r->grain = (GR_GRAIN / row > 1 ? GR_GRAIN / row : 1) * row;
    }
    free(views);
    free(expanded);
    bool done = r->numel > 0 && p->tables && g->table_in >= 0 && r->nd == 1 && table_run(r, g->table_in);
    if (!done && r->numel > 0) tpu_parallel_for((r->numel + r->grain - 1) / r->grain, 1, gr_blocks, r);
    bool oom = atomic_load(&r->oom);
    free(arrays);
    free(phys);
    free(cval);
    free(r);
    return oom ? TPU_ERROR_OUT_OF_MEMORY : TPU_OK;
}
