/* sort.c - sort and topk along a dim (ops.def: SORT, TOPK).
 *
 * Each row - the elements along `dim` at one position of the other dims -
 * is read into keys (double for floating dtypes, which hold every bf16, f16,
 * f32 and f64 value exactly; int64 for the rest) and a permutation of 0..n-1
 * is ordered by them (NaN above every number), then the first n (sort) or k
 * (topk) positions are written: the element itself (its bytes, so the value
 * is exact) and its index. Rows run in parallel on the compute pool, each
 * block of rows with its own buffers.
 *
 * SORT is a stable merge sort (equal keys keep their order). TOPK selects as
 * PyTorch's CPU kernel does, so that ties come out at the CPU's indices (a
 * Mixture-of-Experts router over equal scores picks the CPU's experts): when
 * 64k <= n a heap-based partial sort, else a quickselect of the k-th element
 * followed, if `sorted`, by a sort of the k-1 before it - the algorithms of
 * the C++ standard library PyTorch is built with (libstdc++'s partial_sort,
 * nth_element and sort: median-of-three pivots, depth-limited, insertion
 * sort below 16 elements), step for step, since any other order of
 * comparisons moves equal keys elsewhere. */
#include "kernels/kernels-impl.h"
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct srt_plan {
    const tpu_tensor *x, *v, *ix;
    int dim, nd;
    int64_t n, k, rows;
    bool desc, is_float, topk, sorted;
    size_t es;
} srt_plan;

typedef struct srt_row {
    double *f;
    int64_t *i, *perm, *tmp;
} srt_row;

/* Whether element a goes before element b. */
static inline bool srt_before(const srt_plan *p, const srt_row *r, int64_t a, int64_t b) {
    if (p->is_float) {
        double x = r->f[a], y = r->f[b];
        bool nx = isnan(x), ny = isnan(y);
        if (p->desc) return (nx && !ny) || x > y;
        return (ny && !nx) || x < y;
    }
    return p->desc ? r->i[a] > r->i[b] : r->i[a] < r->i[b];
}

/* Bottom-up merge sort of r->perm[0..n) (stable: the right run's element
 * moves ahead only if it goes strictly before). */
static void srt_sort(const srt_plan *p, srt_row *r, int64_t n) {
    int64_t *src = r->perm, *dst = r->tmp;
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, a = lo, b = mid, o = lo;
            while (a < mid && b < hi) dst[o++] = srt_before(p, r, src[b], src[a]) ? src[b++] : src[a++];
            while (a < mid) dst[o++] = src[a++];
            while (b < hi) dst[o++] = src[b++];
        }
        int64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != r->perm) memcpy(r->perm, src, (size_t)n * sizeof *src);
}

/* ---- topk: libstdc++'s selection over r->perm (cs_*: "CPU sequence") ----
 * Written over an array of element indices e[]; `before` is the comparator
 * (the ordering topk uses: descending for largest). Each function follows
 * the library's of the same name (__adjust_heap, __introselect, ...). */

#define CS_LT(a, b) srt_before(p, r, (a), (b))

static void cs_adjust_heap(const srt_plan *p, const srt_row *r, int64_t *e, int64_t hole, int64_t len, int64_t val) {
    int64_t top = hole, child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (CS_LT(e[child], e[child - 1])) child--;
        e[hole] = e[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        e[hole] = e[child - 1];
        hole = child - 1;
    }
    for (int64_t parent = (hole - 1) / 2; hole > top && CS_LT(e[parent], val); parent = (hole - 1) / 2) {
        e[hole] = e[parent];
        hole = parent;
    }
    e[hole] = val;
}

static void cs_make_heap(const srt_plan *p, const srt_row *r, int64_t *e, int64_t len) {
    if (len < 2) return;
    for (int64_t parent = (len - 2) / 2;; parent--) {
        cs_adjust_heap(p, r, e, parent, len, e[parent]);
        if (parent == 0) return;
    }
}

/* Move the heap's top to e[res] and sift e[res]'s old element in. */
static void cs_pop_heap(const srt_plan *p, const srt_row *r, int64_t *e, int64_t len, int64_t res) {
    int64_t val = e[res];
    e[res] = e[0];
    cs_adjust_heap(p, r, e, 0, len, val);
}

static void cs_heap_select(const srt_plan *p, const srt_row *r, int64_t *e, int64_t mid, int64_t len) {
    cs_make_heap(p, r, e, mid);
    for (int64_t i = mid; i < len; i++)
        if (CS_LT(e[i], e[0])) cs_pop_heap(p, r, e, mid, i);
}

static void cs_partial_sort(const srt_plan *p, const srt_row *r, int64_t *e, int64_t mid, int64_t len) {
    cs_heap_select(p, r, e, mid, len);
    for (int64_t last = mid; last > 1;) {
        last--;
        cs_pop_heap(p, r, e, last, last);
    }
}

static void cs_linear_insert(const srt_plan *p, const srt_row *r, int64_t *e, int64_t i) {
    int64_t val = e[i];
    for (; CS_LT(val, e[i - 1]); i--) e[i] = e[i - 1];
    e[i] = val;
}

static void cs_insertion_sort(const srt_plan *p, const srt_row *r, int64_t *e, int64_t lo, int64_t hi) {
    for (int64_t i = lo + 1; i < hi; i++) {
        if (CS_LT(e[i], e[lo])) {
            int64_t val = e[i];
            memmove(e + lo + 1, e + lo, (size_t)(i - lo) * sizeof *e);
            e[lo] = val;
        } else {
            cs_linear_insert(p, r, e, i);
        }
    }
}

static inline void cs_swap(int64_t *e, int64_t a, int64_t b) {
    int64_t t = e[a];
    e[a] = e[b];
    e[b] = t;
}

/* Median of e[lo+1], e[mid], e[hi-1] to e[lo], then Hoare's partition of
 * [lo+1, hi) around it; returns the cut. */
static int64_t cs_partition_pivot(const srt_plan *p, const srt_row *r, int64_t *e, int64_t lo, int64_t hi) {
    int64_t a = lo + 1, b = lo + (hi - lo) / 2, c = hi - 1, m;
    if (CS_LT(e[a], e[b]))
        m = CS_LT(e[b], e[c]) ? b : CS_LT(e[a], e[c]) ? c : a;
    else
        m = CS_LT(e[a], e[c]) ? a : CS_LT(e[b], e[c]) ? c : b;
    cs_swap(e, lo, m);
    int64_t f = lo + 1, l = hi;
    for (;;) {
        while (CS_LT(e[f], e[lo])) f++;
        l--;
        while (CS_LT(e[lo], e[l])) l--;
        if (!(f < l)) return f;
        cs_swap(e, f, l);
        f++;
    }
}

static inline int64_t cs_lg(int64_t n) { return 63 - __builtin_clzll((unsigned long long)n); }

static void cs_introsort_loop(const srt_plan *p, const srt_row *r, int64_t *e, int64_t lo, int64_t hi, int64_t depth) {
    while (hi - lo > 16) {
        if (depth == 0) {
            cs_partial_sort(p, r, e + lo, hi - lo, hi - lo);
            return;
        }
        depth--;
        int64_t cut = cs_partition_pivot(p, r, e, lo, hi);
        cs_introsort_loop(p, r, e, cut, hi, depth);
        hi = cut;
    }
}

static void cs_sort(const srt_plan *p, const srt_row *r, int64_t *e, int64_t n) {
    if (n <= 0) return;
    cs_introsort_loop(p, r, e, 0, n, cs_lg(n) * 2);
    if (n > 16) {
        cs_insertion_sort(p, r, e, 0, 16);
        for (int64_t i = 16; i < n; i++) cs_linear_insert(p, r, e, i);
    } else {
        cs_insertion_sort(p, r, e, 0, n);
    }
}

static void cs_nth_element(const srt_plan *p, const srt_row *r, int64_t *e, int64_t nth, int64_t n) {
    int64_t lo = 0, hi = n, depth = cs_lg(n) * 2;
    while (hi - lo > 3) {
        if (depth == 0) {
            cs_heap_select(p, r, e + lo, nth - lo + 1, hi - lo);
            cs_swap(e, lo, nth);
            return;
        }
        depth--;
        int64_t cut = cs_partition_pivot(p, r, e, lo, hi);
        if (cut <= nth)
            lo = cut;
        else
            hi = cut;
    }
    cs_insertion_sort(p, r, e, lo, hi);
}

/* PyTorch CPU's topk over r->perm[0..n): the first k hold the result. */
static void srt_topk(const srt_plan *p, srt_row *r, int64_t n) {
    if (p->k * 64 <= n) {
        cs_partial_sort(p, r, r->perm, p->k, n);
    } else {
        cs_nth_element(p, r, r->perm, p->k - 1, n);
        if (p->sorted) cs_sort(p, r, r->perm, p->k - 1);
    }
}

#undef CS_LT

/* Offsets of row `row` in t (every dim but p->dim at row's multi-index). */
static int64_t srt_off(const srt_plan *p, const tpu_tensor *t, int64_t row) {
    int64_t off = t->offset;
    for (int d = p->nd - 1; d >= 0; d--) {
        if (d == p->dim) continue;
        off += (row % t->sizes[d]) * t->strides[d];
        row /= t->sizes[d];
    }
    return off;
}

static void srt_rows(void *ctx, int64_t r0, int64_t r1) {
    const srt_plan *p = ctx;
    srt_row r = {0};
    int64_t n = p->n;
    r.perm = malloc((size_t)n * sizeof *r.perm);
    r.tmp = malloc((size_t)n * sizeof *r.tmp);
    if (p->is_float)
        r.f = malloc((size_t)n * sizeof *r.f);
    else
        r.i = malloc((size_t)n * sizeof *r.i);
    if (!r.perm || !r.tmp || (!r.f && !r.i)) abort(); /* (sizes checked by the caller: a few MB at most) */
    tpu_dtype dt = (tpu_dtype)p->x->dtype;
    int64_t xs = p->x->strides[p->dim], vs = p->v->strides[p->dim], is = p->ix->strides[p->dim];
    for (int64_t row = r0; row < r1; row++) {
        const char *xb = (const char *)p->x->base + (size_t)srt_off(p, p->x, row) * p->es;
        for (int64_t j = 0; j < n; j++) {
            const char *e = xb + (size_t)(j * xs) * p->es;
            if (p->is_float)
                r.f[j] = tpu_load_f64(e, dt);
            else
                r.i[j] = tpu_load_i64(e, dt);
            r.perm[j] = j;
        }
        if (p->topk)
            srt_topk(p, &r, n);
        else
            srt_sort(p, &r, n);
        char *vb = (char *)p->v->base + (size_t)srt_off(p, p->v, row) * p->es;
        int64_t *ib = (int64_t *)p->ix->base + srt_off(p, p->ix, row);
        for (int64_t j = 0; j < p->k; j++) {
            memcpy(vb + (size_t)(j * vs) * p->es, xb + (size_t)(r.perm[j] * xs) * p->es, p->es);
            ib[j * is] = r.perm[j];
        }
    }
    free(r.perm);
    free(r.tmp);
    free(r.f);
    free(r.i);
}

tpu_status tpu_k_sort(tpu_kargs *a) {
    const tpu_tensor *v = &a->t[0], *ix = &a->t[1], *x = &a->t[2];
    tpu_args_TOPK q = tpu_unpack_TOPK(&a->p); /* SORT: its (dim, descending) are these slots 0 and 1 */
    bool topk = a->op == TPU_OP_TOPK;
    srt_plan p = {.x = x,
                  .v = v,
                  .ix = ix,
                  .dim = (int)q.dim,
                  .nd = x->ndim,
                  .rows = 1,
                  .desc = q.largest != 0,
                  .is_float = tpu_dtype_is_float((tpu_dtype)x->dtype),
                  .topk = topk,
                  .sorted = !topk || q.sorted != 0,
                  .es = tpu_dtype_size((tpu_dtype)x->dtype)};
    const char *name = tpu_op_name(a->op);
    if (p.nd == 0 || v->ndim != p.nd || ix->ndim != p.nd || p.dim < 0 || p.dim >= p.nd)
        return tpu_kernel_fail(a, "%s: operands of %d, %d, %d dims, dim %d", name, v->ndim, ix->ndim, p.nd, p.dim);
    if (v->dtype != x->dtype || ix->dtype != TPU_I64) return tpu_kernel_fail(a, "%s: bad output dtypes", name);
    p.n = x->sizes[p.dim];
    p.k = v->sizes[p.dim];
    for (int d = 0; d < p.nd; d++) {
        if (v->sizes[d] != ix->sizes[d] || (d != p.dim && v->sizes[d] != x->sizes[d]))
            return tpu_kernel_fail(a, "%s: size mismatch at dim %d", name, d);
        if (d != p.dim) p.rows *= x->sizes[d];
    }
    if (p.k > p.n || (a->op == TPU_OP_SORT && p.k != p.n))
        return tpu_kernel_fail(a, "%s: %lld outputs along dim %d for %lld elements", name, (long long)p.k, p.dim,
                               (long long)p.n);
    if (p.rows == 0 || p.k == 0) return TPU_OK;
    int64_t grain = p.n >= 4096 ? 1 : 4096 / p.n;
    tpu_parallel_for(p.rows, grain, srt_rows, &p);
    return TPU_OK;
}
