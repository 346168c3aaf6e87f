/* loss.c - negative log-likelihood loss and its backward; cross entropy
 * (the loss of log_softmax over the class dim) and its backward.
 *
 * x is [N, C] or [C] (then the target is 0-dim and there is one sample);
 * targets are int64 (int32 accepted). All targets are checked before
 * anything is written, so a bad target leaves the outputs untouched.
 * Arithmetic is in double, rounded once at the store.
 *
 * Cross entropy takes x [N, C] (logits) in place of the log-probabilities
 * and computes each row's log-probabilities with LOG_SOFTMAX's own float row
 * function (tpu_softmax_row_f) into a row buffer that stays in cache, then
 * does what NLL_LOSS does with them; its backward builds NLL_LOSS_BWD's row
 * in the output and runs LOG_SOFTMAX_BWD's row function over it. So on
 * float32 both give the two-op results bit for bit, without the [N, C]
 * log-probabilities or their gradient ever reaching memory: Fused Eager
 * rewrites the pair into these (graph/rewrite.c). */
#include "kernels/kernels-impl.h"
#include "kernels/tile-impl.h"
#include <stdlib.h>
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

/* ---- cross entropy ---- */

typedef struct ce_ctx {
    tpu_kargs *a;
    const tpu_tensor *x, *tg, *w, *gx; /* gx: backward only */
    const nll_shape *s;
    int64_t ignore;
    double *lp;                  /* forward: lp[n] = log-probability of row n's target (unused if ignored) */
    double g;                    /* backward, reduced: the gradient scale (grad_out, / total_weight for mean) */
    const tpu_tensor *gout_rows; /* backward, per sample: grad_out [N] */
    bool logprobs;               /* backward: x holds the log-probabilities */
    int failed;
} ce_ctx;

/* Row n's log-probabilities into lp (C floats): x's row converted to float
 * in buf (unless it is contiguous float32), then LOG_SOFTMAX's row function. */
static const float *ce_logprobs(const ce_ctx *c, int64_t n, float *lp, float *buf) {
    const tpu_tensor *x = c->x;
    int64_t C = c->s->C;
    const float *row;
    if (x->dtype == TPU_F32 && c->s->xsc == 1) {
        row = (const float *)tpu_elem_ptr(x, n * c->s->xsn);
    } else {
        tpu_tile_load_f32(buf, tpu_elem_ptr(x, n * c->s->xsn), c->s->xsc, C, (tpu_dtype)x->dtype);
        row = buf;
    }
    if (c->logprobs) return row; /* (the backward given LOG_SOFTMAX's output) */
    tpu_softmax_row_f(TPU_OP_LOG_SOFTMAX, lp, row, NULL, C);
    return lp;
}

static void ce_fwd_rows(void *ctx, int64_t b, int64_t e) {
    ce_ctx *c = ctx;
    int64_t C = c->s->C;
    float *lp = malloc((size_t)C * 2 * sizeof *lp);
    if (!lp) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t n = b; n < e; n++) {
        int64_t t = ld_target(c->tg, n * c->s->tsn);
        if (t == c->ignore) continue;
        c->lp[n] = ce_logprobs(c, n, lp, lp + C)[t];
    }
    free(lp);
}

static tpu_status ce_forward(tpu_kargs *a) {
    const tpu_tensor *loss = &a->t[0], *tw_out = &a->t[1], *x = &a->t[2], *tg = &a->t[3];
    const tpu_tensor *w = a->n == 5 ? &a->t[4] : NULL;
    tpu_args_CROSS_ENTROPY q = tpu_unpack_CROSS_ENTROPY(&a->p);
    int64_t reduction = q.reduction, ignore = q.ignore_index;
    if (x->is_scalar || x->ndim != 2)
        return tpu_kernel_fail(a, "cross_entropy: input must be a 2-d [N, C] floating tensor (got %d-d)",
                               x->is_scalar ? 0 : x->ndim);
    nll_shape s;
    tpu_status st = nll_prepare(a, x, tg, w, ignore, &s);
    if (st != TPU_OK) return st;
    bool per_sample = reduction == 0;
    if (per_sample && (loss->is_scalar || loss->ndim != 1 || loss->sizes[0] != s.N))
        return tpu_kernel_fail(a, "cross_entropy: loss must have shape [%lld] for reduction none", (long long)s.N);
    double *lp = malloc(((size_t)s.N + 1) * sizeof *lp);
    if (!lp) return tpu_kernel_fail(a, "cross_entropy: out of host memory for %lld rows", (long long)s.N);
    ce_ctx c = {.a = a, .x = x, .tg = tg, .w = w, .s = &s, .ignore = ignore, .lp = lp};
    if (s.C > 0) tpu_parallel_for(s.N, s.C >= 16384 ? 1 : 16384 / s.C, ce_fwd_rows, &c);
    if (c.failed) {
        free(lp);
        return tpu_kernel_fail(a, "cross_entropy: out of host memory for a %lld-class row buffer", (long long)s.C);
    }
    /* NLL_LOSS's arithmetic, in its order, on the float log-probabilities */
    double total = 0, tw = 0;
    for (int64_t n = 0; n < s.N; n++) {
        int64_t t = ld_target(tg, n * s.tsn);
        double v = 0, wt = 0;
        if (t != ignore) {
            wt = w ? ld(w, t) : 1.0;
            v = -wt * lp[n];
        }
        if (per_sample) {
            tpu_store_f64(tpu_elem_ptr(loss, n * loss->strides[0]), (tpu_dtype)loss->dtype, v);
        } else if (t != ignore) {
            total -= wt * lp[n];
            tw += wt;
        }
    }
    free(lp);
    if (per_sample) {
        tpu_store_f64(tpu_elem_ptr(tw_out, 0), (tpu_dtype)tw_out->dtype, 0.0);
        return TPU_OK;
    }
    tpu_store_f64(tpu_elem_ptr(loss, 0), (tpu_dtype)loss->dtype, reduction == 1 ? total / tw : total);
    tpu_store_f64(tpu_elem_ptr(tw_out, 0), (tpu_dtype)tw_out->dtype, tw);
    return TPU_OK;
}

/* Row n of grad_x: NLL_LOSS_BWD's row (zeros, the target's -g * w stored as
 * its dtype would store it) in g, then LOG_SOFTMAX_BWD's row function over
 * it and the row's log-probabilities. */
static void ce_bwd_rows(void *ctx, int64_t b, int64_t e) {
    ce_ctx *c = ctx;
    const tpu_tensor *gx = c->gx;
    int64_t C = c->s->C;
    bool direct = gx->dtype == TPU_F32 && gx->strides[1] == 1;
    float *buf = malloc((size_t)C * 3 * sizeof *buf);
    if (!buf) {
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *lp = buf, *xb = buf + C, *gb = buf + 2 * C;
    for (int64_t n = b; n < e; n++) {
        float *g = direct ? (float *)tpu_elem_ptr(gx, n * gx->strides[0]) : gb;
        memset(g, 0, (size_t)C * sizeof *g);
        int64_t t = ld_target(c->tg, n * c->s->tsn);
        if (t != c->ignore) {
            double gn = c->gout_rows ? ld(c->gout_rows, n * c->gout_rows->strides[0]) : c->g;
            double v = -gn * (c->w ? ld(c->w, t) : 1.0);
            float f = (float)v; /* the value as grad_x's dtype holds it */
            if (gx->dtype != TPU_F32) {
                uint16_t h;
                tpu_store_f64(&h, (tpu_dtype)gx->dtype, v);
                f = (float)tpu_load_f64(&h, (tpu_dtype)gx->dtype);
            }
            g[t] = f;
        }
        tpu_softmax_row_f(TPU_OP_LOG_SOFTMAX_BWD, g, g, ce_logprobs(c, n, lp, xb), C);
        if (!direct)
            tpu_tile_store_f32(tpu_elem_ptr(gx, n * gx->strides[0]), gx->strides[1], g, C, (tpu_dtype)gx->dtype);
    }
    free(buf);
}

static tpu_status ce_backward(tpu_kargs *a) {
    const tpu_tensor *gx = &a->t[0], *gout = &a->t[1], *x = &a->t[2], *tg = &a->t[3], *twt = &a->t[4];
    const tpu_tensor *w = a->n == 6 ? &a->t[5] : NULL;
    tpu_args_CROSS_ENTROPY_BWD q = tpu_unpack_CROSS_ENTROPY_BWD(&a->p);
    int64_t reduction = q.reduction, ignore = q.ignore_index;
    if (x->is_scalar || x->ndim != 2 || gx->is_scalar || gx->ndim != 2 || gx->sizes[0] != x->sizes[0] ||
        gx->sizes[1] != x->sizes[1])
        return tpu_kernel_fail(a, "cross_entropy_backward: input and grad_input must be 2-d [N, C] of one shape");
    nll_shape s;
    tpu_status st = nll_prepare(a, x, tg, w, ignore, &s);
    if (st != TPU_OK) return st;
    bool per_sample = reduction == 0;
    if (per_sample && (gout->is_scalar || gout->ndim != 1 || gout->sizes[0] != s.N))
        return tpu_kernel_fail(a, "cross_entropy_backward: grad_output must have shape [%lld] for reduction none",
                               (long long)s.N);
    if (s.N * s.C == 0) return TPU_OK;
    ce_ctx c = {.a = a, .x = x, .tg = tg, .w = w, .gx = gx, .s = &s, .ignore = ignore, .logprobs = q.logprobs != 0};
    if (per_sample) {
        c.gout_rows = gout;
    } else {
        c.g = ld(gout, 0);
        if (reduction == 1) c.g /= ld(twt, 0);
    }
    tpu_parallel_for(s.N, s.C >= 16384 ? 1 : 16384 / s.C, ce_bwd_rows, &c);
    if (c.failed)
        return tpu_kernel_fail(a, "cross_entropy_backward: out of host memory for a %lld-class row buffer",
                               (long long)s.C);
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
    case TPU_OP_CROSS_ENTROPY:
        if (a->n != 4 && a->n != 5) break;
        return ce_forward(a);
    case TPU_OP_CROSS_ENTROPY_BWD:
        if (a->n != 5 && a->n != 6) break;
        return ce_backward(a);
    default: break;
    }
    return tpu_kernel_fail(a, "%s: not a loss op or wrong operand count %d", tpu_op_name(a->op), a->n);
}
