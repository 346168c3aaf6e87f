/* index.c - index_select, gather, scatter_add, scatter, index_add; and advanced
 * indexing (index, index_put: x[i, :, j], x[mask] = v), at the end.
 *
 * All four walk an iteration shape S (out's for index_select, index's for
 * gather/scatter_add, src's for index_add) and move one element per position
 * between a destination and a source, one of which is addressed along `dim`
 * by an index value j instead of the position's own coordinate k:
 *   index_select  out[.., k, ..]  = x[.., j, ..]     j = index[k]
 *   gather        out[.., k, ..]  = x[.., j, ..]     j = index[.., k, ..]
 *   scatter_add   out[.., j, ..] += src[.., k, ..]   j = index[.., k, ..]
 *   scatter       out[.., j, ..]  = src[.., k, ..]   j = index[.., k, ..]
 *   index_add     out[.., j, ..] += a*src[.., k, ..] j = index[k]
 *   scatter_reduce out[.., j, ..] = out (*, max, min) src[.., k, ..], j = index[.., k, ..]
 * Every index is checked before anything is written. Positions that differ
 * outside `dim` never touch the same destination element, so work is split
 * over (outer position, block of inner positions), and each item runs k in
 * order: duplicate indices accumulate deterministically. */
#include "kernels/kernels-impl.h"
#include "kernels/tile-impl.h"
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define IX_BLOCK 4096 /* inner positions per work item */
#ifdef TPU_KERNELS_NO_CLONES
#define IX_CLONES
#else
#define IX_CLONES TPU_TARGET_CLONES
#endif

typedef struct ix_plan {
    tpu_op op;
    int nd, dim;
    int64_t sizes[TPU_MAX_DIMS]; /* iteration shape */
    char *db;                    /* destination storage */
    const char *sb, *ib;         /* source, index storage */
    int64_t dst[TPU_MAX_DIMS], sst[TPU_MAX_DIMS], ist[TPU_MAX_DIMS];
    int64_t doff, soff, ioff;
    bool d_by_idx; /* dst (else src) addressed by j along dim */
    bool var_idx;  /* index varies with every position */
    bool accumulate;
    int red; /* SCATTER_REDUCE: 1 + its reduce parameter (prod, amax, amin); 0 otherwise */
    tpu_dtype dt, idt;
    size_t es;
    double alpha;
    int64_t O, K, I, NB; /* outer, along dim, inner, inner blocks */
} ix_plan;

static inline int64_t ix_get(const char *ib, tpu_dtype idt, int64_t off) {
    return idt == TPU_I64 ? ((const int64_t *)ib)[off] : ((const int32_t *)ib)[off];
}

/* *q += a*s in float, rounded back to float16 (out of line: inlined, its
 * conversions would keep ix_elem from being inlined into the run loops). */
__attribute__((noinline)) static void ix_add_f16(uint16_t *q, uint16_t s, float a) {
    *q = tpu_tile_f32_to_f16(tpu_tile_f16_to_f32(*q) + a * tpu_tile_f16_to_f32(s));
}

/* dst[d] = dst[d] (*, max, min) src[s] as PyTorch's scatter_reduce computes it
 * in the dtype (a product of two halves or floats is exact in double, so one
 * rounding equals theirs); a NaN in src wins, one in dst stays. */
__attribute__((noinline)) static void ix_reduce(const ix_plan *p, int64_t d, int64_t s) {
    char *dp = p->db + (size_t)d * p->es;
    const char *sp = p->sb + (size_t)s * p->es;
    if (tpu_dtype_is_float(p->dt)) {
        double a = tpu_load_f64(dp, p->dt), b = tpu_load_f64(sp, p->dt);
        double r = p->red == 1 ? a * b : b != b ? b : p->red == 2 ? (a < b ? b : a) : (b < a ? b : a);
        tpu_store_f64(dp, p->dt, r);
    } else {
        int64_t a = tpu_load_i64(dp, p->dt), b = tpu_load_i64(sp, p->dt);
        int64_t r = p->red == 1   ? (int64_t)((uint64_t)a * (uint64_t)b)
                    : p->red == 2 ? (a < b ? b : a)
                                  : (b < a ? b : a);
        tpu_store_i64(dp, p->dt, r);
    }
}

/* dst[d] (+)= src[s] for one element of dtype p->dt. */
static inline void ix_elem(const ix_plan *p, int64_t d, int64_t s) {
    if (p->red) {
        ix_reduce(p, d, s);
        return;
    }
    if (!p->accumulate) {
        memcpy(p->db + (size_t)d * p->es, p->sb + (size_t)s * p->es, p->es);
        return;
    }
    switch (p->dt) {
    case TPU_F32: ((float *)p->db)[d] += (float)p->alpha * ((const float *)p->sb)[s]; break;
    case TPU_F64: ((double *)p->db)[d] += p->alpha * ((const double *)p->sb)[s]; break;
    case TPU_BF16: {
        uint16_t *q = (uint16_t *)p->db + d;
        *q = tpu_f32_to_bf16(tpu_bf16_to_f32(*q) + (float)p->alpha * tpu_bf16_to_f32(((const uint16_t *)p->sb)[s]));
        break;
    }
    case TPU_F16: ix_add_f16((uint16_t *)p->db + d, ((const uint16_t *)p->sb)[s], (float)p->alpha); break;
    case TPU_I64: ((int64_t *)p->db)[d] += (int64_t)p->alpha * ((const int64_t *)p->sb)[s]; break;
    case TPU_I32: ((int32_t *)p->db)[d] += (int32_t)((int64_t)p->alpha * ((const int32_t *)p->sb)[s]); break;
    case TPU_I16: ((int16_t *)p->db)[d] += (int16_t)((int64_t)p->alpha * ((const int16_t *)p->sb)[s]); break;
    case TPU_I8: ((int8_t *)p->db)[d] += (int8_t)((int64_t)p->alpha * ((const int8_t *)p->sb)[s]); break;
    case TPU_U8: ((uint8_t *)p->db)[d] += (uint8_t)((int64_t)p->alpha * ((const uint8_t *)p->sb)[s]); break;
    default: break;
    }
}

/* d += a*s over contiguous runs (embedding backward rows) */
IX_CLONES static void ix_axpy_f32(float *d, const float *s, int64_t n, float a) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        vf8 x, y;
        memcpy(&x, s + i, sizeof x);
        memcpy(&y, d + i, sizeof y);
        y += a * x;
        memcpy(d + i, &y, sizeof y);
    }
    for (; i < n; i++) d[i] += a * s[i];
}

/* the same on bf16, each sum rounded to bf16 as in tpu_f32_to_bf16 */
IX_CLONES static void ix_axpy_bf16(uint16_t *d, const uint16_t *s, int64_t n, float a) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        vf8 x, y;
        tpu_tile_vload_bf16x8(&x, s + i);
        tpu_tile_vload_bf16x8(&y, d + i);
        y += a * x;
        tpu_tile_vstore_bf16x8(d + i, &y);
    }
    for (; i < n; i++) d[i] = tpu_f32_to_bf16(tpu_bf16_to_f32(d[i]) + a * tpu_bf16_to_f32(s[i]));
}

/* A run of L positions along the last dim with a fixed j. */
static void ix_run_const(const ix_plan *p, int64_t L, int64_t d, int64_t dl, int64_t s, int64_t sl) {
    if (!p->accumulate && dl == 1 && sl == 1) {
        memcpy(p->db + (size_t)d * p->es, p->sb + (size_t)s * p->es, (size_t)L * p->es);
    } else if (p->accumulate && dl == 1 && sl == 1 && p->dt == TPU_F32) {
        ix_axpy_f32((float *)p->db + d, (const float *)p->sb + s, L, (float)p->alpha);
    } else if (p->accumulate && dl == 1 && sl == 1 && p->dt == TPU_BF16) {
        ix_axpy_bf16((uint16_t *)p->db + d, (const uint16_t *)p->sb + s, L, (float)p->alpha);
    } else if (p->accumulate && p->dt == TPU_F32) {
        float *dp = (float *)p->db + d, al = (float)p->alpha;
        const float *sp = (const float *)p->sb + s;
        for (int64_t i = 0; i < L; i++) dp[i * dl] += al * sp[i * sl];
    } else {
        for (int64_t i = 0; i < L; i++) ix_elem(p, d + i * dl, s + i * sl);
    }
}

/* A run of L positions, j read per position (index element ii + i*il): the
 * element loops are typed, with the index dtype and element kind hoisted. */
#define IX_VAR_LOOP(IT, STMT)                                                            \
    do {                                                                                 \
        const IT *ip_ = (const IT *)p->ib + ii;                                          \
        for (int64_t i = 0; i < L; i++) {                                                \
            int64_t j = ip_[i * il], de = d + i * dl + j * jd, se = s + i * sl + j * js; \
            STMT;                                                                        \
        }                                                                                \
    } while (0)
#define IX_VAR(STMT)                    \
    do {                                \
        if (p->idt == TPU_I64)          \
            IX_VAR_LOOP(int64_t, STMT); \
        else                            \
            IX_VAR_LOOP(int32_t, STMT); \
    } while (0)
#define IX_COPY(T) IX_VAR(((T *)p->db)[de] = ((const T *)p->sb)[se])

static void ix_run_var(const ix_plan *p, int64_t L, int64_t d, int64_t dl, int64_t s, int64_t sl, int64_t ii,
                       int64_t il) {
    int64_t jd = p->d_by_idx ? p->dst[p->dim] : 0, js = p->d_by_idx ? 0 : p->sst[p->dim];
    if (p->red) {
        IX_VAR(ix_reduce(p, de, se));
        return;
    }
    if (!p->accumulate) {
        switch (p->es) {
        case 8: IX_COPY(uint64_t); break;
        case 4: IX_COPY(uint32_t); break;
        case 2: IX_COPY(uint16_t); break;
        default: IX_COPY(uint8_t); break;
        }
        return;
    }
    float al = (float)p->alpha;
    switch (p->dt) {
    case TPU_F32: IX_VAR(((float *)p->db)[de] += al * ((const float *)p->sb)[se]); break;
    case TPU_F64: IX_VAR(((double *)p->db)[de] += p->alpha * ((const double *)p->sb)[se]); break;
    default: IX_VAR(ix_elem(p, de, se)); break;
    }
}

static void ix_item(const ix_plan *p, int64_t o, int64_t ib, int64_t ie) {
    int dim = p->dim, last = p->nd - 1;
    int64_t od = p->doff, os = p->soff, oi = p->ioff, rem = o;
    for (int d = dim - 1; d >= 0; d--) {
        int64_t c = rem % p->sizes[d];
        rem /= p->sizes[d];
        od += c * p->dst[d];
        os += c * p->sst[d];
        oi += c * p->ist[d];
    }
    if (dim == last) { /* one run over k; j read per k, k ascending */
        ix_run_var(p, p->K, od, p->d_by_idx ? 0 : p->dst[dim], os, p->d_by_idx ? p->sst[dim] : 0, oi, p->ist[dim]);
        return;
    }
    /* inner start: multi-index and offsets of position ib */
    int64_t idx0[TPU_MAX_DIMS] = {0}, d0 = 0, s0 = 0, i0 = 0;
    rem = ib;
    for (int d = last; d > dim; d--) {
        idx0[d] = rem % p->sizes[d];
        rem /= p->sizes[d];
        d0 += idx0[d] * p->dst[d];
        s0 += idx0[d] * p->sst[d];
        i0 += idx0[d] * p->ist[d];
    }
    for (int64_t k = 0; k < p->K; k++) {
        int64_t ik = oi + k * p->ist[dim];
        int64_t j = p->var_idx ? 0 : ix_get(p->ib, p->idt, ik);
        int64_t dk = od + (p->d_by_idx ? j : k) * p->dst[dim];
        int64_t sk = os + (p->d_by_idx ? k : j) * p->sst[dim];
        int64_t idx[TPU_MAX_DIMS], di = d0, si = s0, ii = i0;
        memcpy(idx, idx0, sizeof idx);
        for (int64_t pos = ib; pos < ie;) {
            int64_t L = p->sizes[last] - idx[last];
            if (L > ie - pos) L = ie - pos;
            if (p->var_idx)
                ix_run_var(p, L, dk + di, p->dst[last], sk + si, p->sst[last], ik + ii, p->ist[last]);
            else
                ix_run_const(p, L, dk + di, p->dst[last], sk + si, p->sst[last]);
            pos += L;
            idx[last] += L;
            di += L * p->dst[last];
            si += L * p->sst[last];
            ii += L * p->ist[last];
            for (int d = last; d > dim && idx[d] == p->sizes[d]; d--) {
                di -= idx[d] * p->dst[d];
                si -= idx[d] * p->sst[d];
                ii -= idx[d] * p->ist[d];
                idx[d] = 0;
                if (d - 1 > dim) {
                    idx[d - 1]++;
                    di += p->dst[d - 1];
                    si += p->sst[d - 1];
                    ii += p->ist[d - 1];
                }
            }
        }
    }
}

static void ix_items(void *ctx, int64_t b, int64_t e) {
    const ix_plan *p = ctx;
    for (int64_t w = b; w < e; w++) {
        int64_t o = w / p->NB, blk = w % p->NB;
        int64_t ib = blk * IX_BLOCK, ie = ib + IX_BLOCK < p->I ? ib + IX_BLOCK : p->I;
        ix_item(p, o, ib, ie);
    }
}

/* A 0-dim tensor is seen as [1]. */
static void ix_view(tpu_tensor *v, const tpu_tensor *t) {
    *v = *t;
    if (v->ndim == 0) {
        v->ndim = 1;
        v->sizes[0] = 1;
        v->strides[0] = 0;
    }
}

/* Check every index value is in [0, lim) before anything is written. The
 * index is walked as runs along its last dim (only `dim` for 1-d indices). */
#define IX_CHECK_RUN(IT)                         \
    do {                                         \
        const IT *ip_ = (const IT *)p->ib + off; \
        for (int64_t i = 0; i < L; i++) {        \
            int64_t j = ip_[i * st];             \
            if (j < 0 || j >= lim) {             \
                bad = j;                         \
                goto out_of_range;               \
            }                                    \
        }                                        \
    } while (0)

static tpu_status ix_check(tpu_kargs *a, const ix_plan *p, int64_t lim) {
    int nd = p->var_idx ? p->nd : 1;
    int64_t sizes[TPU_MAX_DIMS] = {0}, strides[TPU_MAX_DIMS] = {0}, bad;
    for (int d = 0; d < nd; d++) {
        int dd = p->var_idx ? d : p->dim;
        sizes[d] = p->sizes[dd];
        strides[d] = p->ist[dd];
    }
    int64_t L = sizes[nd - 1], st = strides[nd - 1], runs = 1;
    for (int d = 0; d < nd - 1; d++) runs *= sizes[d];
    int64_t idx[TPU_MAX_DIMS] = {0}, off = p->ioff;
    for (int64_t q = 0; q < runs; q++) {
        if (p->idt == TPU_I64)
            IX_CHECK_RUN(int64_t);
        else
            IX_CHECK_RUN(int32_t);
        for (int d = nd - 2; d >= 0; d--) {
            off += strides[d];
            if (++idx[d] < sizes[d]) break;
            off -= idx[d] * strides[d];
            idx[d] = 0;
        }
    }
    return TPU_OK;
out_of_range:
    if (a->op == TPU_OP_INDEX_SELECT) return tpu_kernel_fail(a, "index out of range in self");
    return tpu_kernel_fail(a, "index %lld is out of bounds for dimension %d with size %lld", (long long)bad, p->dim,
                           (long long)lim);
}

/* PyTorch's shape rules; x is the tensor read (input, or src for the adds). */
static tpu_status ix_check_shapes(tpu_kargs *a, const tpu_tensor *out, const tpu_tensor *x, const tpu_tensor *ix,
                                  int dim, int64_t K) {
    const char *name = tpu_op_name(a->op);
    if (x->ndim != out->ndim) return tpu_kernel_fail(a, "%s: operands have %d and %d dims", name, out->ndim, x->ndim);
    for (int d = 0; d < out->ndim; d++) {
        int64_t so = out->sizes[d], sx = x->sizes[d], si = ix->sizes[d];
        bool ok;
        switch (a->op) {
        case TPU_OP_INDEX_SELECT: ok = d == dim ? so == K : so == sx; break;
        case TPU_OP_INDEX_ADD: ok = d == dim ? sx == K : so == sx; break;
        case TPU_OP_GATHER: ok = so == si && (d == dim || si <= sx); break;
        default: ok = si <= sx && (d == dim || si <= so); break; /* scatter_add */
        }
        if (!ok)
            return tpu_kernel_fail(a, "%s: size mismatch at dim %d (out %lld, input %lld, index %lld)", name, d,
                                   (long long)so, (long long)sx, (long long)si);
    }
    return TPU_OK;
}

static tpu_status adv_run(tpu_kargs *a);
static tpu_status nz_run(tpu_kargs *a);

tpu_status tpu_k_index(tpu_kargs *a) {
    if (a->op == TPU_OP_INDEX || a->op == TPU_OP_INDEX_PUT) return adv_run(a);
    if (a->op == TPU_OP_NONZERO) return nz_run(a);
    if (a->op == TPU_OP_HISTC || a->op == TPU_OP_BINCOUNT) return tpu_histogram(a);
    if (a->op < TPU_OP_INDEX_SELECT || a->op > TPU_OP_INDEX_ADD || a->n != 3)
        return tpu_kernel_fail(a, "%s: not an index op or wrong operand count %d", tpu_op_name(a->op), a->n);
    bool select_like = a->op == TPU_OP_INDEX_SELECT || a->op == TPU_OP_INDEX_ADD;
    bool scatter = a->op == TPU_OP_SCATTER_ADD || a->op == TPU_OP_INDEX_ADD || a->op == TPU_OP_SCATTER ||
                   a->op == TPU_OP_SCATTER_REDUCE;
    tpu_tensor out, ix, x; /* x: the read tensor (input for select/gather, src for the adds) */
    ix_view(&out, &a->t[0]);
    ix_view(&ix, &a->t[scatter ? 1 : 2]);
    ix_view(&x, &a->t[scatter ? 2 : 1]);
    const char *name = tpu_op_name(a->op);
    /* INDEX_ADD's columns: dim as in the other three, plus alpha (INDEX_ADD only) */
    tpu_args_INDEX_ADD q = tpu_unpack_INDEX_ADD(&a->p);
    int64_t dim = q.dim;
    if (dim < 0 || dim >= out.ndim)
        return tpu_kernel_fail(a, "%s: dim %lld out of range for a %d-d tensor", name, (long long)dim, a->t[0].ndim);
    if (ix.dtype != TPU_I64 && ix.dtype != TPU_I32)
        return tpu_kernel_fail(a, "%s: index must be int64 or int32, got %s", name,
                               tpu_dtype_name((tpu_dtype)ix.dtype));
    if (out.dtype != x.dtype)
        return tpu_kernel_fail(a, "%s: dtypes %s and %s differ", name, tpu_dtype_name((tpu_dtype)out.dtype),
                               tpu_dtype_name((tpu_dtype)x.dtype));
    if (scatter && a->op != TPU_OP_SCATTER && (out.dtype == TPU_BOOL || out.dtype >= TPU_DTYPE_REAL_COUNT)) {
        tpu_kernel_fail(a, "%s: dtype %s not supported", name, tpu_dtype_name((tpu_dtype)out.dtype));
        return TPU_ERROR_NOT_SUPPORTED;
    }
    if (select_like && a->t[scatter ? 1 : 2].ndim > 1) return tpu_kernel_fail(a, "%s: index must be 0-d or 1-d", name);
    if (!select_like && ix.ndim != out.ndim)
        return tpu_kernel_fail(a, "%s: index has %d dims, expected %d", name, ix.ndim, out.ndim);
    int64_t K = select_like ? ix.sizes[0] : 0;
    tpu_status st = ix_check_shapes(a, &out, &x, &ix, (int)dim, K);
    if (st != TPU_OK) return st;

    ix_plan p;
    memset(&p, 0, sizeof p);
    p.op = a->op;
    p.nd = out.ndim;
    p.dim = (int)dim;
    p.d_by_idx = scatter;
    p.var_idx = !select_like;
    p.accumulate = scatter && a->op != TPU_OP_SCATTER;
    if (a->op == TPU_OP_SCATTER_REDUCE) {
        int64_t r = tpu_unpack_SCATTER_REDUCE(&a->p).reduce;
        if (r < 0 || r > 2) return tpu_kernel_fail(a, "%s: reduce %lld is not 0, 1 or 2", name, (long long)r);
        p.red = 1 + (int)r;
    }
    p.dt = (tpu_dtype)out.dtype;
    p.idt = (tpu_dtype)ix.dtype;
    p.es = tpu_dtype_size(p.dt);
    p.alpha = a->op == TPU_OP_INDEX_ADD ? q.alpha : 1.0;
    const tpu_tensor *shape = a->op == TPU_OP_INDEX_SELECT ? &out : a->op == TPU_OP_INDEX_ADD ? &x : &ix;
    const tpu_tensor *rd = &x; /* the tensor read (src side) */
    p.db = out.base;
    p.sb = rd->base;
    p.ib = ix.base;
    p.doff = out.offset;
    p.soff = rd->offset;
    p.ioff = ix.offset;
    int64_t numel = 1;
    for (int d = 0; d < p.nd; d++) {
        p.sizes[d] = shape->sizes[d];
        p.dst[d] = out.strides[d];
        p.sst[d] = rd->strides[d];
        p.ist[d] = select_like ? (d == dim ? ix.strides[0] : 0) : ix.strides[d];
        numel *= p.sizes[d];
    }
    if (numel == 0) return TPU_OK;
    st = ix_check(a, &p, scatter ? out.sizes[dim] : x.sizes[dim]);
    if (st != TPU_OK) return st;

    p.K = p.sizes[dim];
    p.O = 1;
    for (int d = 0; d < dim; d++) p.O *= p.sizes[d];
    p.I = numel / p.O / p.K;
    p.NB = (p.I + IX_BLOCK - 1) / IX_BLOCK;
    int64_t per_item = p.K * (p.I < IX_BLOCK ? p.I : IX_BLOCK);
    int64_t grain = per_item >= 16384 ? 1 : 16384 / per_item;
    tpu_parallel_for(p.O * p.NB, grain, ix_items, &p);
    return TPU_OK;
}

/* ---- advanced indexing ----
 * index:     out[s] = x[s, w(i0[s]), .., w(ik-1[s])]
 * index_put: out[s, w(i0[s]), ..] = values[s]   (+= with accumulate)
 * over the iteration shape S (out's for index, values' for index_put), with
 * w(v) = v < 0 ? v + size : v. The indexed operand (x, or out for
 * index_put) is a view of nd + k dims: S's, then the k indexed dims. index
 * runs rows of S in parallel; index_put runs in S's row-major order on one
 * thread, so duplicate indices accumulate in the order the CPU's does. */

#define ADV_MAXK (TPU_MAX_OPERANDS - 2)

typedef struct adv_plan {
    int nd, k;
    bool put, accumulate;
    int64_t sizes[TPU_MAX_DIMS], rows, numel;
    char *ob;       /* written: out */
    const char *rb; /* read: x (index) or values (index_put) */
    int64_t ooff, roff, ost[TPU_MAX_DIMS], rst[TPU_MAX_DIMS];
    const char *ib[ADV_MAXK];
    tpu_dtype idt[ADV_MAXK];
    int64_t ioff[ADV_MAXK], ist[ADV_MAXK][TPU_MAX_DIMS];
    int64_t lim[ADV_MAXK], jst[ADV_MAXK]; /* indexed dims: size and stride (in the indexed operand) */
    tpu_dtype dt;
    size_t es;
} adv_plan;

/* Offsets of row r (all dims but the last at r's multi-index). */
static void adv_row(const adv_plan *p, int64_t r, int64_t *o, int64_t *x, int64_t *ix) {
    *o = p->ooff;
    *x = p->roff;
    for (int j = 0; j < p->k; j++) ix[j] = p->ioff[j];
    for (int d = p->nd - 2; d >= 0; d--) {
        int64_t c = r % p->sizes[d];
        r /= p->sizes[d];
        *o += c * p->ost[d];
        *x += c * p->rst[d];
        for (int j = 0; j < p->k; j++) ix[j] += c * p->ist[j][d];
    }
}

/* The offset into the indexed operand that position (row offsets ix, column
 * c) selects; false if an index is out of range (its value in *bad, which
 * index in *which). */
static inline bool adv_sel(const adv_plan *p, const int64_t *ix, int64_t c, int64_t *sel, int64_t *bad, int *which) {
    int64_t s = 0, last = p->nd - 1;
    for (int j = 0; j < p->k; j++) {
        int64_t v = ix_get(p->ib[j], p->idt[j], ix[j] + c * p->ist[j][last]);
        if (v < -p->lim[j] || v >= p->lim[j]) {
            *bad = v;
            *which = j;
            return false;
        }
        s += (v < 0 ? v + p->lim[j] : v) * p->jst[j];
    }
    *sel = s;
    return true;
}

static void adv_gather_rows(void *ctx, int64_t r0, int64_t r1) {
    const adv_plan *p = ctx;
    int64_t n = p->sizes[p->nd - 1], ol = p->ost[p->nd - 1], xl = p->rst[p->nd - 1];
    for (int64_t r = r0; r < r1; r++) {
        int64_t o, x, ix[ADV_MAXK], sel, bad;
        int which;
        adv_row(p, r, &o, &x, ix);
        for (int64_t c = 0; c < n; c++) {
            if (!adv_sel(p, ix, c, &sel, &bad, &which)) continue; /* (checked before: cannot happen) */
            memcpy(p->ob + (size_t)(o + c * ol) * p->es, p->rb + (size_t)(x + c * xl + sel) * p->es, p->es);
        }
    }
}

/* *d += *s in dtype dt (bool: or), as the CPU's accumulation rounds. */
static void adv_acc(void *d, const void *s, tpu_dtype dt) {
    switch (dt) {
    case TPU_F32: *(float *)d += *(const float *)s; break;
    case TPU_F64: *(double *)d += *(const double *)s; break;
    case TPU_BF16:
        *(uint16_t *)d = tpu_f32_to_bf16(tpu_bf16_to_f32(*(uint16_t *)d) + tpu_bf16_to_f32(*(const uint16_t *)s));
        break;
    case TPU_F16: ix_add_f16(d, *(const uint16_t *)s, 1.0f); break;
    case TPU_BOOL: *(uint8_t *)d = *(uint8_t *)d | *(const uint8_t *)s; break;
    default: tpu_store_i64(d, dt, (int64_t)((uint64_t)tpu_load_i64(d, dt) + (uint64_t)tpu_load_i64(s, dt))); break;
    }
}

static tpu_status adv_run(tpu_kargs *a) {
    adv_plan p;
    memset(&p, 0, sizeof p);
    p.put = a->op == TPU_OP_INDEX_PUT;
    p.k = a->n - 2;
    const char *name = tpu_op_name(a->op);
    const tpu_tensor *out = &a->t[0], *rd = &a->t[1];
    const tpu_tensor *shape = p.put ? rd : out, *xv = p.put ? out : rd; /* iteration shape; the indexed view */
    tpu_args_INDEX_PUT q = tpu_unpack_INDEX_PUT(&a->p);
    p.accumulate = p.put && q.accumulate != 0;
    if (p.k < 1 || p.k > ADV_MAXK) return tpu_kernel_fail(a, "%s: %d index tensors (1..%d)", name, p.k, ADV_MAXK);
    p.nd = shape->ndim;
    if (xv->ndim != p.nd + p.k)
        return tpu_kernel_fail(a, "%s: the indexed view has %d dims, expected %d + %d", name, xv->ndim, p.nd, p.k);
    if (out->dtype != rd->dtype)
        return tpu_kernel_fail(a, "%s: dtypes %s and %s differ", name, tpu_dtype_name((tpu_dtype)out->dtype),
                               tpu_dtype_name((tpu_dtype)rd->dtype));
    p.dt = (tpu_dtype)out->dtype;
    p.es = tpu_dtype_size(p.dt);
    p.numel = 1;
    for (int d = 0; d < p.nd; d++) {
        if (shape->sizes[d] != xv->sizes[d] || (!p.put && rd->sizes[d] != out->sizes[d]))
            return tpu_kernel_fail(a, "%s: size mismatch at dim %d", name, d);
        p.sizes[d] = shape->sizes[d];
        p.ost[d] = out->strides[d];
        p.rst[d] = rd->strides[d];
        p.numel *= p.sizes[d];
    }
    p.ob = out->base;
    p.rb = rd->base;
    p.ooff = out->offset;
    p.roff = rd->offset;
    for (int j = 0; j < p.k; j++) {
        const tpu_tensor *ix = &a->t[2 + j];
        if (ix->dtype != TPU_I64 && ix->dtype != TPU_I32)
            return tpu_kernel_fail(a, "%s: index must be int64 or int32, got %s", name,
                                   tpu_dtype_name((tpu_dtype)ix->dtype));
        if (ix->ndim != p.nd)
            return tpu_kernel_fail(a, "%s: index %d has %d dims, expected %d", name, j, ix->ndim, p.nd);
        for (int d = 0; d < p.nd; d++)
            if (ix->sizes[d] != p.sizes[d])
                return tpu_kernel_fail(a, "%s: index %d: size mismatch at dim %d", name, j, d);
        p.ib[j] = ix->base;
        p.idt[j] = (tpu_dtype)ix->dtype;
        p.ioff[j] = ix->offset;
        memcpy(p.ist[j], ix->strides, sizeof p.ist[j]);
        p.lim[j] = xv->sizes[p.nd + j];
        p.jst[j] = xv->strides[p.nd + j];
    }
    if (p.numel == 0) return TPU_OK;
    if (p.nd == 0) { /* a 0-d shape is one row of one element */
        p.nd = 1;
        p.sizes[0] = 1;
        p.ost[0] = p.rst[0] = 0;
        for (int j = 0; j < p.k; j++) p.ist[j][0] = 0;
    }
    int64_t n = p.sizes[p.nd - 1];
    p.rows = p.numel / n;
    for (int64_t r = 0; r < p.rows; r++) { /* check every index first: nothing written on failure */
        int64_t o, x, ix[ADV_MAXK], sel, bad;
        int which;
        adv_row(&p, r, &o, &x, ix);
        for (int64_t c = 0; c < n; c++)
            if (!adv_sel(&p, ix, c, &sel, &bad, &which))
                return tpu_kernel_fail(a, "index %lld is out of bounds for dimension %d with size %lld", (long long)bad,
                                       (int)((q.dims >> (5 * which)) & 31), (long long)p.lim[which]);
    }
    if (!p.put) {
        int64_t grain = n >= 4096 ? 1 : 4096 / n;
        tpu_parallel_for(p.rows, grain, adv_gather_rows, &p);
        return TPU_OK;
    }
    int64_t ol = p.ost[p.nd - 1], vl = p.rst[p.nd - 1];
    for (int64_t r = 0; r < p.rows; r++) {
        int64_t o, v, ix[ADV_MAXK], sel = 0, bad;
        int which;
        adv_row(&p, r, &o, &v, ix);
        for (int64_t c = 0; c < n; c++) {
            adv_sel(&p, ix, c, &sel, &bad, &which);
            char *d = p.ob + (size_t)(o + c * ol + sel) * p.es;
            const char *s = p.rb + (size_t)(v + c * vl) * p.es;
            if (p.accumulate)
                adv_acc(d, s, p.dt);
            else
                memcpy(d, s, p.es);
        }
    }
    return TPU_OK;
}

/* ---- nonzero ----
 * Two passes over blocks of x in row-major order on the compute pool: count
 * each block's nonzero elements, then (after a prefix sum on the caller)
 * write each block's coordinates at its offset. */

#define NZ_BLOCK 65536

typedef struct nz_plan {
    const tpu_tensor *x, *out;
    int64_t numel, *count; /* per block; then its first row */
    bool write;
    size_t es;
} nz_plan;

static void nz_blocks(void *ctx, int64_t b0, int64_t b1) {
    const nz_plan *p = ctx;
    const tpu_tensor *x = p->x, *o = p->out;
    int nd = x->ndim;
    tpu_dtype dt = (tpu_dtype)x->dtype;
    for (int64_t b = b0; b < b1; b++) {
        int64_t lo = b * NZ_BLOCK, hi = lo + NZ_BLOCK < p->numel ? lo + NZ_BLOCK : p->numel;
        int64_t idx[TPU_MAX_DIMS] = {0}, off = x->offset, rem = lo, row = p->write ? p->count[b] : 0, n = 0;
        for (int d = nd - 1; d >= 0; d--) {
            idx[d] = rem % x->sizes[d];
            rem /= x->sizes[d];
            off += idx[d] * x->strides[d];
        }
        for (int64_t pos = lo; pos < hi; pos++) {
            if (tpu_load_f64((const char *)x->base + (size_t)off * p->es, dt) != 0.0) { /* (NaN counts; -0 does not) */
                if (p->write) {
                    int64_t *r = (int64_t *)o->base + o->offset + row * o->strides[0];
                    for (int d = 0; d < nd; d++) r[d * o->strides[1]] = idx[d];
                    row++;
                }
                n++;
            }
            for (int d = nd - 1; d >= 0; d--) {
                off += x->strides[d];
                if (++idx[d] < x->sizes[d]) break;
                off -= idx[d] * x->strides[d];
                idx[d] = 0;
            }
        }
        if (!p->write) p->count[b] = n;
    }
}

static tpu_status nz_run(tpu_kargs *a) {
    const tpu_tensor *o = &a->t[0], *x = &a->t[1];
    nz_plan p = {x, o, 1, NULL, false, tpu_dtype_size((tpu_dtype)x->dtype)};
    for (int d = 0; d < x->ndim; d++) p.numel *= x->sizes[d];
    if (o->dtype != TPU_I64 || o->ndim != 2 || o->sizes[1] != x->ndim)
        return tpu_kernel_fail(a, "nonzero: out must be int64 of shape [n, %d]", x->ndim);
    int64_t nb = (p.numel + NZ_BLOCK - 1) / NZ_BLOCK, total = 0;
    if (p.numel == 0) {
        if (o->sizes[0] != 0)
            return tpu_kernel_fail(a, "nonzero: %lld rows for an empty input", (long long)o->sizes[0]);
        return TPU_OK;
    }
    p.count = malloc((size_t)nb * sizeof *p.count);
    if (!p.count) return tpu_kernel_fail(a, "nonzero: out of host memory");
    tpu_parallel_for(nb, 1, nz_blocks, &p);
    for (int64_t b = 0; b < nb; b++) {
        int64_t c = p.count[b];
        p.count[b] = total;
        total += c;
    }
    if (total != o->sizes[0]) {
        free(p.count);
        return tpu_kernel_fail(a, "nonzero: the input has %lld nonzero elements, out has %lld rows", (long long)total,
                               (long long)o->sizes[0]);
    }
    p.write = true;
    if (x->ndim > 0) tpu_parallel_for(nb, 1, nz_blocks, &p);
    free(p.count);
    return TPU_OK;
}
