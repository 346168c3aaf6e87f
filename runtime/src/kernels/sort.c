/* sort.c - sort and topk along a dim (ops.def: SORT, TOPK).
 *
 * Each row - the elements along `dim` at one position of the other dims -
 * is read into keys (double for floating dtypes, which hold every bf16, f16,
 * f32 and f64 value exactly; int64 for the rest), a permutation of 0..n-1 is
 * merge-sorted by them (stable: equal keys keep their order; NaN above every
 * number), and the first n (sort) or k (topk) positions are written: the
 * element itself (its bytes, so the value is exact) and its index. Rows run
 * in parallel on the compute pool, each block of rows with its own buffers. */
#include "kernels/kernels-impl.h"
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct srt_plan {
    const tpu_tensor *x, *v, *ix;
    int dim, nd;
    int64_t n, k, rows;
    bool desc, is_float;
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
    tpu_args_SORT q = tpu_unpack_SORT(&a->p);
    srt_plan p = {x,
                  v,
                  ix,
                  (int)q.dim,
                  x->ndim,
                  0,
                  0,
                  1,
                  q.descending != 0,
                  tpu_dtype_is_float((tpu_dtype)x->dtype),
                  tpu_dtype_size((tpu_dtype)x->dtype)};
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
