/* interp.c - the block interpreter: runs a fused group over its iteration
 * space in tiles of up to GR_TILE elements, on the compute pool.
 *
 * The group's memory operands are coalesced together (tpu_tile_coalesce, as
 * one launch's operands are in elementwise.c), then the space is cut into blocks of GR_GRAIN
 * elements for tpu_parallel_for. Each block walks its rows a tile at a time
 * and runs the group's ops in order on tile-sized slots: loads convert any
 * dtype and stride into float32 (the tile layer), the op is its ops.def
 * expression (tpu_ew_tile_f, the fast kernel's own code), the result is
 * rounded to its dtype, and stored if the group decided it reaches memory. */
#include "graph/prog-impl.h"
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
    bool excess; /* bf16/f16 results of arithmetic stay float32 in the group */
    int tile;    /* elements per tile: GR_TILE or TPU_TILE */
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
        const float *x = S + (size_t)r->phys[o->in[0]] * SS, *y = S + (size_t)r->phys[o->in[1]] * SS;
        const float *z = S + (size_t)r->phys[o->in[2]] * SS;
        bool half = o->round == TPU_BF16 || o->round == TPU_F16;
        if (o->random) {
            gr_random(&r->nodes[o->node], out, pos, len, T);
            gr_round(out, T, o->round);
        } else if (half && r->excess && r->nodes[o->node].op != TPU_OP_COPY) { /* (a cast still rounds) */
            tpu_ew_tile_f(r->nodes[o->node].op, T, out, x, y, z, &o->par);     /* a store rounds what it writes */
        } else if (o->round == TPU_BF16) {
            tpu_ew_tile_f_bf16(r->nodes[o->node].op, T, out, x, y, z, &o->par); /* rounds in the loop */
        } else {
            tpu_ew_tile_f(r->nodes[o->node].op, T, out, x, y, z, &o->par);
            gr_round(out, T, o->round);
        }
        if (o->store >= 0) {
            int m = o->store;
            int64_t s = r->st[m][r->nd - 1];
            tpu_tile_store_f32(r->base[m] + (size_t)(off[m] + inner * s) * r->esz[m], s, out, len, r->dt[m]);
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
        int64_t lo = blk * GR_GRAIN, hi = lo + GR_GRAIN < r->numel ? lo + GR_GRAIN : r->numel;
        gr_range(r, S, off, lo, hi);
    }
    if (S != stack_slots) free(S);
    if (off != stack_off) free(off);
}

tpu_status tpu_gr_run_group(const tpu_gprog *p, const gr_group *g) {
    gr_run *r = malloc(sizeof *r);
    size_t nm = (size_t)(g->nmem ? g->nmem : 1);
    void *arrays = malloc(nm * (sizeof *r->st + sizeof *r->base + sizeof *r->dt + sizeof *r->esz));
    const tpu_tensor **views = malloc(nm * sizeof *views);
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
    r->st = arrays; /* int64 rows first: every part stays aligned */
    r->base = (char **)(r->st + nm);
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
    for (int m = 0; m < g->nmem; m++) {
        const tpu_tensor *t = views[m] = &p->nodes[g->mem[m].node].t[g->mem[m].k];
        r->dt[m] = (tpu_dtype)t->dtype;
        r->esz[m] = tpu_dtype_size(r->dt[m]);
        r->base[m] = (char *)t->base + (size_t)t->offset * r->esz[m];
    }
    r->numel = tpu_tile_coalesce(&p->nodes[g->ops[0].node].t[0], g->nmem, views, r->sz, r->st, &r->nd);
    free(views);
    if (r->numel > 0) tpu_parallel_for((r->numel + GR_GRAIN - 1) / GR_GRAIN, 1, gr_blocks, r);
    bool oom = atomic_load(&r->oom);
    free(arrays);
    free(phys);
    free(cval);
    free(r);
    return oom ? TPU_ERROR_OUT_OF_MEMORY : TPU_OK;
}
