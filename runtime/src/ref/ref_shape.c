/* ref_shape.c - ops that depend on an element's coordinates: triangular
 * masks (reference), convolution windows (im2col, col2im), 2-d max pooling
 * and its backward, masked_select.
 *
 * The window kernels and masked_select are written element by element, so
 * they are their own reference: the fast kernels (kernels/shape.c) run the
 * same per-plane code on the compute workers (tpu_shape_window with
 * tpu_parallel_for), the reference runs it serially. */
#include "ref/ref-impl.h"
#include <math.h>
#include <string.h>

tpu_status tpu_tri_check(tpu_kargs *a) {
    const tpu_tensor *o = &a->t[0], *x = &a->t[1];
    if (o->ndim < 2 || x->ndim != o->ndim || o->dtype != x->dtype)
        return tpu_kernel_fail(a, "%s: input tensor must have at least 2 dimensions", tpu_op_name(a->op));
    for (int d = 0; d < o->ndim; d++)
        if (o->sizes[d] != x->sizes[d]) return tpu_kernel_fail(a, "%s: shape mismatch", tpu_op_name(a->op));
    return TPU_OK;
}

/* Reference: element by element from the definition. */
static tpu_status tri_ref(tpu_kargs *a) {
    tpu_status s = tpu_tri_check(a);
    if (s) return s;
    const tpu_tensor *o = &a->t[0], *x = &a->t[1];
    int nd = o->ndim;
    int64_t diag = tpu_unpack_TRIL(&a->p).diagonal; /* TRIU: the same column */
    int64_t n = tpu_tensor_numel(o), idx[TPU_MAX_DIMS];
    for (int64_t e = 0; e < n; e++) {
        int64_t rem = e, oo = 0, xo = 0;
        for (int d = nd - 1; d >= 0; d--) {
            idx[d] = rem % o->sizes[d];
            rem /= o->sizes[d];
        }
        for (int d = 0; d < nd; d++) {
            oo += idx[d] * o->strides[d];
            xo += idx[d] * x->strides[d];
        }
        int64_t dj = idx[nd - 1] - idx[nd - 2];
        bool keep = a->op == TPU_OP_TRIL ? dj <= diag : dj >= diag;
        double v = keep ? tpu_load_f64(tpu_elem_ptr(x, xo), (tpu_dtype)x->dtype) : 0.0;
        tpu_store_f64(tpu_elem_ptr(o, oo), (tpu_dtype)o->dtype, v);
    }
    return TPU_OK;
}

/* ---------------- convolution windows and pooling ---------------- */

typedef struct win {
    int64_t N, C, H, W, OH, OW;
    int kh, kw, sh, sw, ph, pw, dh, dw;
} win;

static void unpack_win(const tpu_kargs *a, const tpu_tensor *x, const tpu_tensor *y, win *w) {
    w->N = x->sizes[0];
    w->C = x->sizes[1];
    w->H = x->sizes[2];
    w->W = x->sizes[3];
    tpu_args_IM2COL q = tpu_unpack_IM2COL(&a->p); /* COL2IM, MAXPOOL2D(_BWD): the same columns */
    w->kh = (int)(q.kernel & 0xffff);
    w->kw = (int)(q.kernel >> 16);
    w->sh = (int)(q.stride & 0xffff);
    w->sw = (int)(q.stride >> 16);
    w->ph = (int)(q.padding & 0xffff);
    w->pw = (int)(q.padding >> 16);
    w->dh = (int)(q.dilation & 0xffff);
    w->dw = (int)(q.dilation >> 16);
    w->OH = y->sizes[2];
    w->OW = y->sizes[3];
}

/* Check window parameters and operand ranks; `img` is the (N,C,H,W) operand, `o4` a
 * 4-d (N,C,OH,OW) operand or NULL (then cols gives OH*OW). */
static tpu_status win_check(tpu_kargs *a, const tpu_tensor *img, const tpu_tensor *cols, win *w) {
    if (img->ndim != 4 || (cols && cols->ndim != 3))
        return tpu_kernel_fail(a, "%s: expected 4-d images and 3-d columns", tpu_op_name(a->op));
    tpu_tensor fake = *img;
    unpack_win(a, img, &fake, w);
    if (w->kh < 1 || w->kw < 1 || w->sh < 1 || w->sw < 1 || w->dh < 1 || w->dw < 1)
        return tpu_kernel_fail(a, "%s: kernel, stride and dilation must be positive", tpu_op_name(a->op));
    w->OH = (w->H + 2 * w->ph - w->dh * (w->kh - 1) - 1) / w->sh + 1;
    w->OW = (w->W + 2 * w->pw - w->dw * (w->kw - 1) - 1) / w->sw + 1;
    if (cols && (cols->sizes[0] != w->N || cols->sizes[1] != w->C * w->kh * w->kw || cols->sizes[2] != w->OH * w->OW))
        return tpu_kernel_fail(a, "%s: column shape does not match the window", tpu_op_name(a->op));
    return TPU_OK;
}

static inline double ld4(const tpu_tensor *t, int64_t n, int64_t c, int64_t h, int64_t ww) {
    return tpu_load_f64(tpu_elem_ptr(t, n * t->strides[0] + c * t->strides[1] + h * t->strides[2] + ww * t->strides[3]),
                        (tpu_dtype)t->dtype);
}

typedef struct im_job {
    const tpu_kargs *a;
    win w;
} im_job;

/* One (n, c) plane per item. fp32 with dense column rows: for each output
 * row the in-bounds run of ow is computed once, so the inner loop is a plain
 * strided copy with no bounds tests (a straight copy when stride is 1). */
static void im2col_planes(void *ctx, int64_t b, int64_t e) {
    const im_job *j = ctx;
    const win *w = &j->w;
    const tpu_tensor *o = &j->a->t[0], *x = &j->a->t[1];
    bool f32 = o->dtype == TPU_F32 && x->dtype == TPU_F32 && o->strides[2] == 1 && x->strides[3] == 1;
    for (int64_t nc = b; nc < e; nc++) {
        int64_t n = nc / w->C, c = nc % w->C;
        for (int ki = 0; ki < w->kh; ki++)
            for (int kj = 0; kj < w->kw; kj++) {
                int64_t row = (c * w->kh + ki) * w->kw + kj;
                int64_t obase = n * o->strides[0] + row * o->strides[1];
                /* ow with 0 <= ow*sw - pw + kj*dw < W */
                int64_t shift = kj * w->dw - w->pw;
                int64_t lo = shift >= 0 ? 0 : (-shift + w->sw - 1) / w->sw;
                int64_t hi = w->W - shift <= 0 ? 0 : (w->W - shift + w->sw - 1) / w->sw;
                if (hi > w->OW) hi = w->OW;
                if (lo > hi) lo = hi;
                for (int64_t oh = 0; oh < w->OH; oh++) {
                    int64_t h = oh * w->sh - w->ph + ki * w->dh;
                    bool hin = h >= 0 && h < w->H;
                    if (f32) {
                        float *dst = (float *)o->base + o->offset + obase + oh * w->OW;
                        if (!hin) {
                            memset(dst, 0, (size_t)w->OW * sizeof(float));
                            continue;
                        }
                        const float *src = (const float *)x->base + x->offset + n * x->strides[0] + c * x->strides[1] +
                                           h * x->strides[2] + shift;
                        for (int64_t ow = 0; ow < lo; ow++) dst[ow] = 0.0f;
                        if (w->sw == 1)
                            memcpy(dst + lo, src + lo, (size_t)(hi - lo) * sizeof(float));
                        else
                            for (int64_t ow = lo; ow < hi; ow++) dst[ow] = src[ow * w->sw];
                        for (int64_t ow = hi; ow < w->OW; ow++) dst[ow] = 0.0f;
                        continue;
                    }
                    for (int64_t ow = 0; ow < w->OW; ow++) {
                        int64_t ww = ow * w->sw + shift;
                        bool in = hin && ww >= 0 && ww < w->W;
                        tpu_store_f64(tpu_elem_ptr(o, obase + (oh * w->OW + ow) * o->strides[2]), (tpu_dtype)o->dtype,
                                      in ? ld4(x, n, c, h, ww) : 0.0);
                    }
                }
            }
    }
}

/* col2im: each (n, c) plane gathers from its own rows only, so planes run in parallel. */
static void col2im_planes(void *ctx, int64_t b, int64_t e) {
    const im_job *j = ctx;
    const win *w = &j->w;
    const tpu_tensor *o = &j->a->t[0], *cols = &j->a->t[1];
    for (int64_t nc = b; nc < e; nc++) {
        int64_t n = nc / w->C, c = nc % w->C;
        for (int64_t h = 0; h < w->H; h++)
            for (int64_t ww = 0; ww < w->W; ww++)
                tpu_store_f64(
                    tpu_elem_ptr(o, n * o->strides[0] + c * o->strides[1] + h * o->strides[2] + ww * o->strides[3]),
                    (tpu_dtype)o->dtype, 0.0);
        for (int ki = 0; ki < w->kh; ki++)
            for (int kj = 0; kj < w->kw; kj++) {
                int64_t row = (c * w->kh + ki) * w->kw + kj;
                for (int64_t oh = 0; oh < w->OH; oh++) {
                    int64_t h = oh * w->sh - w->ph + ki * w->dh;
                    if (h < 0 || h >= w->H) continue;
                    for (int64_t ow = 0; ow < w->OW; ow++) {
                        int64_t ww = ow * w->sw - w->pw + kj * w->dw;
                        if (ww < 0 || ww >= w->W) continue;
                        double v = tpu_load_f64(tpu_elem_ptr(cols, n * cols->strides[0] + row * cols->strides[1] +
                                                                       (oh * w->OW + ow) * cols->strides[2]),
                                                (tpu_dtype)cols->dtype);
                        char *p = tpu_elem_ptr(o, n * o->strides[0] + c * o->strides[1] + h * o->strides[2] +
                                                      ww * o->strides[3]);
                        tpu_store_f64(p, (tpu_dtype)o->dtype, tpu_load_f64(p, (tpu_dtype)o->dtype) + v);
                    }
                }
            }
    }
}

static void maxpool_planes(void *ctx, int64_t b, int64_t e) {
    const im_job *j = ctx;
    const win *w = &j->w;
    const tpu_tensor *y = &j->a->t[0], *ix = &j->a->t[1], *x = &j->a->t[2];
    /* float32 in and out, int64 indices: the same rule over float pointers, no dtype switch per element */
    bool f32 = x->dtype == TPU_F32 && y->dtype == TPU_F32 && ix->dtype == TPU_I64;
    for (int64_t nc = b; nc < e; nc++) {
        int64_t n = nc / w->C, c = nc % w->C;
        int64_t xo = n * x->strides[0] + c * x->strides[1];
        int64_t yo = n * y->strides[0] + c * y->strides[1], io = n * ix->strides[0] + c * ix->strides[1];
        const float *xp = f32 ? (const float *)x->base + x->offset + xo : NULL;
        for (int64_t oh = 0; oh < w->OH; oh++)
            for (int64_t ow = 0; ow < w->OW; ow++) {
                double best = -INFINITY;
                int64_t bi = -1;
                for (int ki = 0; ki < w->kh; ki++) {
                    int64_t h = oh * w->sh - w->ph + ki * w->dh;
                    if (h < 0 || h >= w->H) continue;
                    for (int kj = 0; kj < w->kw; kj++) {
                        int64_t ww = ow * w->sw - w->pw + kj * w->dw;
                        if (ww < 0 || ww >= w->W) continue;
                        double v = f32 ? xp[h * x->strides[2] + ww * x->strides[3]] : ld4(x, n, c, h, ww);
                        if (bi < 0 || v > best || (v != v && best == best)) {
                            best = v;
                            bi = h * w->W + ww;
                        } /* NaN wins */
                    }
                }
                int64_t yq = yo + oh * y->strides[2] + ow * y->strides[3],
                        iq = io + oh * ix->strides[2] + ow * ix->strides[3];
                if (f32) {
                    ((float *)y->base)[y->offset + yq] = (float)best;
                    ((int64_t *)ix->base)[ix->offset + iq] = bi;
                } else {
                    tpu_store_f64(tpu_elem_ptr(y, yq), (tpu_dtype)y->dtype, best);
                    tpu_store_i64(tpu_elem_ptr(ix, iq), (tpu_dtype)ix->dtype, bi);
                }
            }
    }
}

static void maxpool_bwd_planes(void *ctx, int64_t b, int64_t e) {
    const im_job *j = ctx;
    const win *w = &j->w;
    const tpu_tensor *dx = &j->a->t[0], *g = &j->a->t[1], *ix = &j->a->t[2];
    for (int64_t nc = b; nc < e; nc++) {
        int64_t n = nc / w->C, c = nc % w->C;
        for (int64_t h = 0; h < w->H; h++)
            for (int64_t ww = 0; ww < w->W; ww++)
                tpu_store_f64(tpu_elem_ptr(dx, n * dx->strides[0] + c * dx->strides[1] + h * dx->strides[2] +
                                                   ww * dx->strides[3]),
                              (tpu_dtype)dx->dtype, 0.0);
        for (int64_t oh = 0; oh < w->OH; oh++)
            for (int64_t ow = 0; ow < w->OW; ow++) {
                int64_t k = tpu_load_i64(tpu_elem_ptr(ix, n * ix->strides[0] + c * ix->strides[1] +
                                                              oh * ix->strides[2] + ow * ix->strides[3]),
                                         (tpu_dtype)ix->dtype);
                if (k < 0 || k >= w->H * w->W) continue; /* checked before the launch ran (see below) */
                int64_t h = k / w->W, ww = k % w->W;
                char *p = tpu_elem_ptr(dx, n * dx->strides[0] + c * dx->strides[1] + h * dx->strides[2] +
                                               ww * dx->strides[3]);
                double gv = ld4(g, n, c, oh, ow);
                tpu_store_f64(p, (tpu_dtype)dx->dtype, tpu_load_f64(p, (tpu_dtype)dx->dtype) + gv);
            }
    }
}

tpu_status tpu_shape_window(tpu_kargs *a, tpu_for_fn for_each) {
    im_job j = {a, {0}};
    tpu_status s;
    switch (a->op) {
    case TPU_OP_IM2COL: s = win_check(a, &a->t[1], &a->t[0], &j.w); break;
    case TPU_OP_COL2IM: s = win_check(a, &a->t[0], &a->t[1], &j.w); break;
    case TPU_OP_MAXPOOL2D:
        s = win_check(a, &a->t[2], NULL, &j.w);
        j.w.OH = a->t[0].sizes[2];
        j.w.OW = a->t[0].sizes[3]; /* ceil_mode sizes come from the caller */
        if (!s && (a->t[0].ndim != 4 || a->t[1].ndim != 4)) s = tpu_kernel_fail(a, "max_pool2d: expected 4-d outputs");
        break;
    default:
        s = win_check(a, &a->t[0], NULL, &j.w);
        j.w.OH = a->t[1].sizes[2];
        j.w.OW = a->t[1].sizes[3];
        if (!s && (a->t[1].ndim != 4 || a->t[2].ndim != 4))
            s = tpu_kernel_fail(a, "max_pool2d_backward: expected 4-d operands");
        if (!s) { /* indices must point inside the plane */
            const tpu_tensor *ix = &a->t[2];
            int64_t n = tpu_tensor_numel(ix), idx[4];
            for (int64_t e = 0; e < n && !s; e++) {
                int64_t rem = e, off = 0;
                for (int d = 3; d >= 0; d--) {
                    idx[d] = rem % ix->sizes[d];
                    rem /= ix->sizes[d];
                    off += idx[d] * ix->strides[d];
                }
                int64_t k = tpu_load_i64(tpu_elem_ptr(ix, off), (tpu_dtype)ix->dtype);
                if (k < 0 || k >= j.w.H * j.w.W)
                    s = tpu_kernel_fail(a, "max_pool2d_backward: index %lld out of range", (long long)k);
            }
        }
        break;
    }
    if (s) return s;
    void (*fn)(void *, int64_t, int64_t) = a->op == TPU_OP_IM2COL      ? im2col_planes
                                           : a->op == TPU_OP_COL2IM    ? col2im_planes
                                           : a->op == TPU_OP_MAXPOOL2D ? maxpool_planes
                                                                       : maxpool_bwd_planes;
    int64_t planes = j.w.N * j.w.C;
    if (for_each)
        for_each(planes, 4, fn, &j);
    else
        fn(&j, 0, planes);
    return TPU_OK;
}

/* masked_select: a serial scan (the output position of an element depends on
 * every mask value before it). The output must hold exactly the selected count. */
tpu_status tpu_masked_select(tpu_kargs *a) {
    const tpu_tensor *o = &a->t[0], *x = &a->t[1], *m = &a->t[2];
    if (o->ndim != 1 || x->ndim != m->ndim || x->dtype != o->dtype)
        return tpu_kernel_fail(a, "masked_select: bad operands");
    for (int d = 0; d < x->ndim; d++)
        if (x->sizes[d] != m->sizes[d]) return tpu_kernel_fail(a, "masked_select: mask and input sizes differ");
    int64_t n = tpu_tensor_numel(x), idx[TPU_MAX_DIMS] = {0}, k = 0;
    size_t es = tpu_dtype_size((tpu_dtype)x->dtype);
    for (int64_t e = 0; e < n; e++) {
        int64_t xo = 0, mo = 0;
        for (int d = 0; d < x->ndim; d++) {
            xo += idx[d] * x->strides[d];
            mo += idx[d] * m->strides[d];
        }
        if (tpu_load_i64(tpu_elem_ptr(m, mo), (tpu_dtype)m->dtype)) {
            if (k >= o->sizes[0])
                return tpu_kernel_fail(a, "masked_select: more selected elements than the output holds");
            memcpy(tpu_elem_ptr(o, k * o->strides[0]), tpu_elem_ptr(x, xo), es);
            k++;
        }
        for (int d = x->ndim - 1; d >= 0; d--) {
            if (++idx[d] < x->sizes[d]) break;
            idx[d] = 0;
        }
    }
    if (k != o->sizes[0]) return tpu_kernel_fail(a, "masked_select: mask changed between counting and selecting");
    return TPU_OK;
}

tpu_status tpu_ref_shape(tpu_kargs *a) {
    if (a->op == TPU_OP_MASKED_SELECT) return tpu_masked_select(a); /* already the naive scan */
    if (a->op == TPU_OP_TRIL || a->op == TPU_OP_TRIU) return tri_ref(a);
    return tpu_shape_window(a, NULL);
}
