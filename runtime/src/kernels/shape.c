/* shape.c - elementwise ops that depend on an element's coordinates
 * (triangular masks). Rows of the last dim are processed whole: the kept
 * prefix/suffix is copied, the rest zeroed. Any strides; out may alias x. */
#include "kernels-impl.h"
#include <string.h>

typedef struct tri_job { const tpu_kargs *a; int64_t rows, cols, nrow; } tri_job;

static void tri_rows(void *ctx, int64_t rb, int64_t re) {
    const tri_job *j = ctx;
    const tpu_tensor *o = &j->a->t[0], *x = &j->a->t[1];
    int nd = o->ndim;
    int64_t diag = j->a->p.i[0];
    bool lower = j->a->op == TPU_OP_TRIL;
    size_t es = tpu_dtype_size((tpu_dtype)o->dtype);
    for (int64_t r = rb; r < re; r++) {
        /* r indexes (batch..., i); decompose into an element offset */
        int64_t rem = r, oo = 0, xo = 0;
        int64_t i = rem % j->rows;
        rem /= j->rows;
        oo += i * o->strides[nd - 2];
        xo += i * x->strides[nd - 2];
        for (int d = nd - 3; d >= 0; d--) {
            int64_t c = rem % o->sizes[d];
            rem /= o->sizes[d];
            oo += c * o->strides[d];
            xo += c * x->strides[d];
        }
        for (int64_t jj = 0; jj < j->cols; jj++) {
            bool keep = lower ? jj - i <= diag : jj - i >= diag;
            char *dst = tpu_elem_ptr(o, oo + jj * o->strides[nd - 1]);
            if (keep) memmove(dst, tpu_elem_ptr(x, xo + jj * x->strides[nd - 1]), es);
            else memset(dst, 0, es);
        }
    }
}

static tpu_status tri_check(tpu_kargs *a) {
    const tpu_tensor *o = &a->t[0], *x = &a->t[1];
    if (o->ndim < 2 || x->ndim != o->ndim || o->dtype != x->dtype)
        return tpu_kernel_fail(a, "%s: input tensor must have at least 2 dimensions", tpu_op_name(a->op));
    for (int d = 0; d < o->ndim; d++)
        if (o->sizes[d] != x->sizes[d]) return tpu_kernel_fail(a, "%s: shape mismatch", tpu_op_name(a->op));
    return TPU_OK;
}

tpu_status tpu_k_shape(tpu_kargs *a) {
    tpu_status s = tri_check(a);
    if (s) return s;
    const tpu_tensor *o = &a->t[0];
    tri_job j = { a, o->sizes[o->ndim - 2], o->sizes[o->ndim - 1], 0 };
    int64_t n = tpu_tensor_numel(o);
    if (n == 0) return TPU_OK;
    j.nrow = n / j.cols;
    tpu_parallel_for(j.nrow, 256, tri_rows, &j);
    return TPU_OK;
}

/* Reference: element by element from the definition. */
tpu_status tpu_ref_shape(tpu_kargs *a) {
    tpu_status s = tri_check(a);
    if (s) return s;
    const tpu_tensor *o = &a->t[0], *x = &a->t[1];
    int nd = o->ndim;
    int64_t n = tpu_tensor_numel(o), idx[TPU_MAX_DIMS];
    for (int64_t e = 0; e < n; e++) {
        int64_t rem = e, oo = 0, xo = 0;
        for (int d = nd - 1; d >= 0; d--) { idx[d] = rem % o->sizes[d]; rem /= o->sizes[d]; }
        for (int d = 0; d < nd; d++) { oo += idx[d] * o->strides[d]; xo += idx[d] * x->strides[d]; }
        int64_t dj = idx[nd - 1] - idx[nd - 2];
        bool keep = a->op == TPU_OP_TRIL ? dj <= a->p.i[0] : dj >= a->p.i[0];
        double v = keep ? tpu_load_f64(tpu_elem_ptr(x, xo), (tpu_dtype)x->dtype) : 0.0;
        tpu_store_f64(tpu_elem_ptr(o, oo), (tpu_dtype)o->dtype, v);
    }
    return TPU_OK;
}
