/* shape.c - the fast triangular masks (tril / triu): rows of the last dim
 * processed whole on the compute workers, the kept prefix/suffix copied, the
 * rest zeroed; any strides, out may alias x. Windows (im2col, col2im,
 * pooling) and masked_select run ref/ref_shape.c's code, the windows split
 * over the workers. */
#include "kernels/kernels-impl.h"
#include <string.h>

typedef struct tri_job {
    const tpu_kargs *a;
    int64_t rows, cols, nrow, diag;
} tri_job;

static void tri_rows(void *ctx, int64_t rb, int64_t re) {
    const tri_job *j = ctx;
    const tpu_tensor *o = &j->a->t[0], *x = &j->a->t[1];
    int nd = o->ndim;
    int64_t diag = j->diag;
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
            if (keep)
                memmove(dst, tpu_elem_ptr(x, xo + jj * x->strides[nd - 1]), es);
            else
                memset(dst, 0, es);
        }
    }
}

static tpu_status tri_fast(tpu_kargs *a) {
    tpu_status s = tpu_tri_check(a);
    if (s) return s;
    const tpu_tensor *o = &a->t[0];
    tri_job j = {a, o->sizes[o->ndim - 2], o->sizes[o->ndim - 1], 0,
                 tpu_unpack_TRIL(&a->p).diagonal}; /* TRIU: the same column */
    int64_t n = tpu_tensor_numel(o);
    if (n == 0) return TPU_OK;
    j.nrow = n / j.cols;
    tpu_parallel_for(j.nrow, 256, tri_rows, &j);
    return TPU_OK;
}

tpu_status tpu_k_shape(tpu_kargs *a) {
    if (a->op == TPU_OP_MASKED_SELECT) return tpu_masked_select(a);
    if (a->op == TPU_OP_TRIL || a->op == TPU_OP_TRIU) return tri_fast(a);
    return tpu_shape_window(a, tpu_parallel_for);
}
