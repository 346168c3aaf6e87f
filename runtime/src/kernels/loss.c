/* loss.c - negative log-likelihood loss and its backward.
 *
 * x is [N, C] or [C] (then the target is 0-dim and there is one sample);
 * targets are int64 (int32 accepted). All targets are checked before
 * anything is written, so a bad target leaves the outputs untouched.
 * Arithmetic is in double, rounded once at the store. */
#include "kernels/kernels-impl.h"
#include <math.h>
#include <string.h>

typedef struct nll_shape {
    int64_t N, C;     /* N = 1 for 1-d x */
    int64_t xsn, xsc; /* x (or grad_x) strides: sample, class */
    int64_t tsn;      /* target stride */
} nll_shape;

static double ld(const tpu_tensor *t, int64_t i) {
    if (t->is_scalar) return t->f;
    return tpu_load_f64(tpu_elem_ptr(t, i), (tpu_dtype)t->dtype);
}

static int64_t ld_target(const tpu_tensor *t, int64_t i) {
    if (t->is_scalar) return t->i;
    return tpu_load_i64(tpu_elem_ptr(t, i), (tpu_dtype)t->dtype);
}

/* Shape from x (forward) or grad_x (backward); checks targets and weight. */
static tpu_status nll_prepare(tpu_kargs *a, const tpu_tensor *x, const tpu_tensor *tg, const tpu_tensor *w,
                              int64_t ignore, nll_shape *s) {
    const char *name = tpu_op_name(a->op);
    if (x->is_scalar || (x->ndim != 1 && x->ndim != 2) || !tpu_dtype_is_float((tpu_dtype)x->dtype))
        return tpu_kernel_fail(a, "%s: input must be a 1-d or 2-d floating tensor (got %d-d)", name, x->ndim);
    if (x->ndim == 2) {
        s->N = x->sizes[0];
        s->C = x->sizes[1];
        s->xsn = x->strides[0];
        s->xsc = x->strides[1];
    } else {
        s->N = 1;
        s->C = x->sizes[0];
        s->xsn = 0;
        s->xsc = x->strides[0];
    }
    if (tg->dtype != TPU_I64 && tg->dtype != TPU_I32)
        return tpu_kernel_fail(a, "%s: expected target of dtype int64, got %s", name,
                               tpu_dtype_name((tpu_dtype)tg->dtype));
    int tnd = tg->is_scalar ? 0 : tg->ndim;
    if (x->ndim == 2 && (tnd != 1 || tg->sizes[0] != s->N))
        return tpu_kernel_fail(a, "%s: expected target of shape [%lld] for input of shape [%lld, %lld]", name,
                               (long long)s->N, (long long)s->N, (long long)s->C);
    if (x->ndim == 1 && tnd != 0) return tpu_kernel_fail(a, "%s: expected a 0-dim target for 1-d input", name);
    s->tsn = tnd == 1 ? tg->strides[0] : 0;
    if (w && (w->is_scalar || tpu_tensor_numel(w) != s->C))
        return tpu_kernel_fail(a, "%s: weight must have %lld elements (one per class)", name, (long long)s->C);
    for (int64_t n = 0; n < s->N; n++) {
        int64_t t = ld_target(tg, n * s->tsn);
        if (t != ignore && (t < 0 || t >= s->C))
            return tpu_kernel_fail(a, "Target %lld is out of bounds.", (long long)t);
    }
    return TPU_OK;
}

static tpu_status nll_forward(tpu_kargs *a) {
    const tpu_tensor *loss = &a->t[0], *tw_out = &a->t[1], *x = &a->t[2], *tg = &a->t[3];
    const tpu_tensor *w = a->n == 5 ? &a->t[4] : NULL;
    tpu_args_NLL_LOSS q = tpu_unpack_NLL_LOSS(&a->p);
    int64_t reduction = q.reduction, ignore = q.ignore_index;
    nll_shape s;
    tpu_status st = nll_prepare(a, x, tg, w, ignore, &s);
    if (st != TPU_OK) return st;

    if (reduction == 0 && x->ndim == 2) {
        for (int64_t n = 0; n < s.N; n++) {
            int64_t t = ld_target(tg, n * s.tsn);
            double v = 0;
            if (t != ignore) v = -(w ? ld(w, t) : 1.0) * ld(x, n * s.xsn + t * s.xsc);
            tpu_store_f64(tpu_elem_ptr(loss, n * loss->strides[0]), (tpu_dtype)loss->dtype, v);
        }
        tpu_store_f64(tpu_elem_ptr(tw_out, 0), (tpu_dtype)tw_out->dtype, 0.0);
        return TPU_OK;
    }
    double total = 0, tw = 0;
    for (int64_t n = 0; n < s.N; n++) {
        int64_t t = ld_target(tg, n * s.tsn);
        if (t == ignore) continue;
        double wt = w ? ld(w, t) : 1.0;
        total -= wt * ld(x, n * s.xsn + t * s.xsc);
        tw += wt;
    }
    double out = reduction == 1 ? total / tw : total;
    tpu_store_f64(tpu_elem_ptr(loss, 0), (tpu_dtype)loss->dtype, out);
    tpu_store_f64(tpu_elem_ptr(tw_out, 0), (tpu_dtype)tw_out->dtype, tw);
    return TPU_OK;
}

typedef struct nll_zero_ctx {
    const tpu_tensor *gx;
    const nll_shape *s;
} nll_zero_ctx;

/* All-zero bytes are +0.0 in every floating dtype. */
static void nll_zero_rows(void *ctx, int64_t b, int64_t e) {
    const nll_zero_ctx *z = ctx;
    size_t es = tpu_dtype_size((tpu_dtype)z->gx->dtype);
    for (int64_t n = b; n < e; n++) {
        char *row = tpu_elem_ptr(z->gx, n * z->s->xsn);
        if (z->s->xsc == 1) {
            memset(row, 0, (size_t)z->s->C * es);
        } else {
            for (int64_t c = 0; c < z->s->C; c++) memset(row + (size_t)(c * z->s->xsc) * es, 0, es);
        }
    }
}

static tpu_status nll_backward(tpu_kargs *a) {
    const tpu_tensor *gx = &a->t[0], *gout = &a->t[1], *tg = &a->t[2], *twt = &a->t[3];
    const tpu_tensor *w = a->n == 5 ? &a->t[4] : NULL;
    tpu_args_NLL_LOSS_BWD q = tpu_unpack_NLL_LOSS_BWD(&a->p);
    int64_t reduction = q.reduction, ignore = q.ignore_index;
    nll_shape s;
    tpu_status st = nll_prepare(a, gx, tg, w, ignore, &s);
    if (st != TPU_OK) return st;
    bool per_sample = reduction == 0 && gx->ndim == 2;
    if (per_sample && (gout->is_scalar || gout->ndim != 1 || gout->sizes[0] != s.N))
        return tpu_kernel_fail(a, "%s: grad_output must have shape [%lld] for reduction none", tpu_op_name(a->op),
                               (long long)s.N);
    if (s.N * s.C == 0) return TPU_OK;

    nll_zero_ctx z = {gx, &s};
    int64_t grain = s.C >= 65536 ? 1 : 65536 / s.C;
    tpu_parallel_for(s.N, grain, nll_zero_rows, &z);

    double g = per_sample ? 0 : ld(gout, 0);
    if (reduction == 1) g /= ld(twt, 0);
    for (int64_t n = 0; n < s.N; n++) {
        int64_t t = ld_target(tg, n * s.tsn);
        if (t == ignore) continue;
        double gn = per_sample ? ld(gout, n * gout->strides[0]) : g;
        double v = -gn * (w ? ld(w, t) : 1.0);
        tpu_store_f64(tpu_elem_ptr(gx, n * s.xsn + t * s.xsc), (tpu_dtype)gx->dtype, v);
    }
    return TPU_OK;
}

tpu_status tpu_k_loss(tpu_kargs *a) {
    switch (a->op) {
    case TPU_OP_NLL_LOSS:
        if (a->n != 4 && a->n != 5) break;
        return nll_forward(a);
    case TPU_OP_NLL_LOSS_BWD:
        if (a->n != 4 && a->n != 5) break;
        return nll_backward(a);
    default: break;
    }
    return tpu_kernel_fail(a, "%s: not a loss op or wrong operand count %d", tpu_op_name(a->op), a->n);
}
