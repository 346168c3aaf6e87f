/* ref_nn.c - reference kernels for softmax, loss, norm, index and optimizer
 * ops: the oracle the fast kernels are tested against.
 *
 * Naive on purpose: one element at a time through tpu_load_f64 /
 * tpu_store_f64, every offset computed from a full multi-index, all
 * arithmetic and accumulation in double, serial. Never optimize this file;
 * its value is that it is obviously right. */
#include "ref/ref-impl.h"
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static int64_t ref_off(const tpu_tensor *t, const int64_t *idx) {
    int64_t off = t->offset;
    for (int d = 0; d < t->ndim; d++) off += idx[d] * t->strides[d];
    return off;
}

static void *ref_ptr(const tpu_tensor *t, int64_t off) {
    return (char *)t->base + (size_t)off * tpu_dtype_size((tpu_dtype)t->dtype);
}

static double ref_get(const tpu_tensor *t, const int64_t *idx) {
    if (t->is_scalar) return t->f;
    return tpu_load_f64(ref_ptr(t, ref_off(t, idx)), (tpu_dtype)t->dtype);
}

static void ref_set(const tpu_tensor *t, const int64_t *idx, double v) {
    tpu_store_f64(ref_ptr(t, ref_off(t, idx)), (tpu_dtype)t->dtype, v);
}

/* Element number `lin` of t in row-major order (a multi-index into idx). */
static void ref_unravel(const tpu_tensor *t, int64_t lin, int64_t *idx) {
    for (int d = t->ndim - 1; d >= 0; d--) {
        idx[d] = lin % t->sizes[d];
        lin /= t->sizes[d];
    }
}

static int64_t ref_numel(const tpu_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
    return n;
}

static double ref_linear(const tpu_tensor *t, int64_t i) /* element i of a contiguous tensor */
{
    if (t->is_scalar) return t->f;
    return tpu_load_f64(ref_ptr(t, t->offset + i), (tpu_dtype)t->dtype);
}

static void ref_set_linear(const tpu_tensor *t, int64_t i, double v) {
    tpu_store_f64(ref_ptr(t, t->offset + i), (tpu_dtype)t->dtype, v);
}

/* ---- softmax family ---- */

tpu_status tpu_ref_softmax(tpu_kargs *a) {
    const tpu_tensor *out = &a->t[0], *in0 = &a->t[1], *in1 = a->n > 2 ? &a->t[2] : NULL;
    int nd = out->ndim;
    int dim = (int)tpu_unpack_SOFTMAX(&a->p).dim; /* the same column in all four softmax ops */
    if (dim < 0 || dim >= (nd > 0 ? nd : 1))
        return tpu_kernel_fail(a, "%s: dim %d out of range for a %d-d tensor", tpu_op_name(a->op), dim, nd);
    int64_t numel = ref_numel(out);
    if (numel == 0) return TPU_OK;
    int64_t D = nd > 0 ? out->sizes[dim] : 1;
    int64_t idx[TPU_MAX_DIMS] = {0};
    double *x = malloc((size_t)D * sizeof *x), *y = malloc((size_t)D * sizeof *y);
    if (!x || !y) {
        free(x);
        free(y);
        return tpu_kernel_fail(a, "%s: out of host memory", tpu_op_name(a->op));
    }
    for (int64_t l = 0; l < numel; l++) {
        ref_unravel(out, l, idx);
        if (nd > 0 && idx[dim] != 0) continue; /* one visit per line */
        for (int64_t i = 0; i < D; i++) {
            if (nd > 0) idx[dim] = i;
            x[i] = ref_get(in0, idx);
            y[i] = in1 ? ref_get(in1, idx) : 0;
        }
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < D; i++)
            if (x[i] > m) m = x[i];
        for (int64_t i = 0; i < D; i++) {
            switch (a->op) {
            case TPU_OP_SOFTMAX:
            case TPU_OP_LOG_SOFTMAX: s += exp(x[i] - m); break;
            case TPU_OP_SOFTMAX_BWD: s += x[i] * y[i]; break; /* x = grad, y = output */
            default: s += x[i]; break;
            }
        }
        for (int64_t i = 0; i < D; i++) {
            if (nd > 0) idx[dim] = i;
            double v;
            switch (a->op) {
            case TPU_OP_SOFTMAX: v = exp(x[i] - m) / s; break;
            case TPU_OP_LOG_SOFTMAX: v = x[i] - m - log(s); break;
            case TPU_OP_SOFTMAX_BWD: v = y[i] * (x[i] - s); break;
            default: v = x[i] - exp(y[i]) * s; break;
            }
            ref_set(out, idx, v);
        }
    }
    free(x);
    free(y);
    return TPU_OK;
}

/* ---- cross entropy: log-probabilities in double from the logits ---- */

static tpu_status ref_cross_entropy(tpu_kargs *a) {
    bool fwd = a->op == TPU_OP_CROSS_ENTROPY;
    const tpu_tensor *x = &a->t[2];
    const tpu_tensor *tg = &a->t[3];
    const tpu_tensor *w = a->n == (fwd ? 5 : 6) ? &a->t[fwd ? 4 : 5] : NULL;
    tpu_args_CROSS_ENTROPY q = tpu_unpack_CROSS_ENTROPY(&a->p); /* CROSS_ENTROPY_BWD: the same columns */
    int64_t reduction = q.reduction, ignore = q.ignore_index;
    if (x->is_scalar || x->ndim != 2) return tpu_kernel_fail(a, "%s: input must be 2-d", tpu_op_name(a->op));
    int64_t N = x->sizes[0], C = x->sizes[1], idx[2], z[1] = {0};
    for (int64_t n = 0; n < N; n++) {
        int64_t ti[1] = {n};
        int64_t t = tpu_load_i64(ref_ptr(tg, ref_off(tg, ti)), (tpu_dtype)tg->dtype);
        if (t != ignore && (t < 0 || t >= C)) return tpu_kernel_fail(a, "Target %lld is out of bounds.", (long long)t);
    }
    double total = 0, tw = 0, gs = 0;
    if (!fwd && reduction != 0) {
        gs = ref_get(&a->t[1], z);
        if (reduction == 1) gs /= ref_get(&a->t[4], z);
    }
    for (int64_t n = 0; n < N; n++) {
        int64_t ti[1] = {n};
        int64_t t = tpu_load_i64(ref_ptr(tg, ref_off(tg, ti)), (tpu_dtype)tg->dtype);
        double m = -INFINITY, sum = 0;
        idx[0] = n;
        for (int64_t c = 0; c < C; c++) {
            idx[1] = c;
            double v = ref_get(x, idx);
            m = v > m ? v : m;
        }
        for (int64_t c = 0; c < C; c++) {
            idx[1] = c;
            sum += exp(ref_get(x, idx) - m);
        }
        double lse = !fwd && tpu_unpack_CROSS_ENTROPY_BWD(&a->p).logprobs ? 0.0 : m + log(sum),
               wt = t == ignore ? 0.0 : (w ? ref_linear(w, t) : 1.0);
        if (fwd) {
            double l = 0;
            if (t != ignore) {
                idx[1] = t;
                l = -wt * (ref_get(x, idx) - lse);
            }
            if (reduction == 0)
                ref_set(&a->t[0], ti, l);
            else
                total += l, tw += wt;
            continue;
        }
        /* d/dx_c of -w_t g log p_t = w_t g (p_c - [c == t]) */
        double g = reduction == 0 ? ref_get(&a->t[1], ti) : gs,
               k = t == ignore ? 0.0 : wt * g; /* (an ignored row: 0) */
        for (int64_t c = 0; c < C; c++) {
            idx[1] = c;
            double p = exp(ref_get(x, idx) - lse);
            ref_set(&a->t[0], idx, k * (p - (c == t ? 1.0 : 0.0)));
        }
    }
    if (fwd) {
        if (reduction != 0) ref_set(&a->t[0], z, reduction == 1 ? total / tw : total);
        ref_set(&a->t[1], z, reduction == 0 ? 0.0 : tw);
    }
    return TPU_OK;
}

/* ---- nll loss ---- */

tpu_status tpu_ref_loss(tpu_kargs *a) {
    if (a->op == TPU_OP_CROSS_ENTROPY || a->op == TPU_OP_CROSS_ENTROPY_BWD) return ref_cross_entropy(a);
    bool fwd = a->op == TPU_OP_NLL_LOSS;
    const tpu_tensor *x = fwd ? &a->t[2] : &a->t[0]; /* x, or grad_x (same shape) */
    const tpu_tensor *tg = fwd ? &a->t[3] : &a->t[2];
    const tpu_tensor *w = a->n == 5 ? &a->t[4] : NULL;
    tpu_args_NLL_LOSS q = tpu_unpack_NLL_LOSS(&a->p); /* NLL_LOSS_BWD: the same columns */
    int64_t reduction = q.reduction, ignore = q.ignore_index;
    bool two = x->ndim == 2;
    int64_t N = two ? x->sizes[0] : 1, C = two ? x->sizes[1] : x->sizes[0];
    int64_t idx[2], z[1] = {0};
    for (int64_t n = 0; n < N; n++) {
        int64_t ti[1] = {n};
        int64_t t = tg->is_scalar ? tg->i : tpu_load_i64(ref_ptr(tg, ref_off(tg, ti)), (tpu_dtype)tg->dtype);
        if (t != ignore && (t < 0 || t >= C)) return tpu_kernel_fail(a, "Target %lld is out of bounds.", (long long)t);
    }
    if (fwd) {
        const tpu_tensor *loss = &a->t[0], *tw_out = &a->t[1];
        double total = 0, tw = 0;
        for (int64_t n = 0; n < N; n++) {
            int64_t ti[1] = {n};
            int64_t t = tg->is_scalar ? tg->i : tpu_load_i64(ref_ptr(tg, ref_off(tg, ti)), (tpu_dtype)tg->dtype);
            double l = 0, wt = 0;
            if (t != ignore) {
                idx[0] = two ? n : t;
                idx[1] = t;
                wt = w ? ref_linear(w, t) : 1.0;
                l = -wt * ref_get(x, idx);
            }
            if (reduction == 0 && two) {
                ref_set(loss, ti, l);
            } else {
                total += l;
                tw += wt;
            }
        }
        if (reduction == 0 && two) {
            ref_set(tw_out, z, 0.0);
        } else {
            ref_set(loss, z, reduction == 1 ? total / tw : total);
            ref_set(tw_out, z, tw);
        }
        return TPU_OK;
    }
    const tpu_tensor *gout = &a->t[1], *twt = &a->t[3];
    for (int64_t n = 0; n < N; n++) {
        for (int64_t c = 0; c < C; c++) {
            idx[0] = two ? n : c;
            idx[1] = c;
            ref_set(x, idx, 0.0);
        }
    }
    for (int64_t n = 0; n < N; n++) {
        int64_t ti[1] = {n};
        int64_t t = tg->is_scalar ? tg->i : tpu_load_i64(ref_ptr(tg, ref_off(tg, ti)), (tpu_dtype)tg->dtype);
        if (t == ignore) continue;
        double g = reduction == 0 && two ? ref_get(gout, ti) : ref_get(gout, z);
        if (reduction == 1) g = g / ref_get(twt, z);
        idx[0] = two ? n : t;
        idx[1] = t;
        ref_set(x, idx, -(w ? ref_linear(w, t) : 1.0) * g);
    }
    return TPU_OK;
}

/* ---- layer norm ---- */

/* x's element (row r, column j) with rows of M consecutive row-major elements */
static void ref_rc(const tpu_tensor *x, int64_t M, int64_t r, int64_t j, int64_t *idx) {
    ref_unravel(x, r * M + j, idx);
}

static tpu_status ref_ln_fwd(tpu_kargs *a) {
    const tpu_tensor *y = &a->t[0], *mean_t = &a->t[1], *rstd_t = &a->t[2], *x = &a->t[3];
    tpu_args_LAYER_NORM q = tpu_unpack_LAYER_NORM(&a->p);
    int64_t M = q.cols;
    bool has_w = q.has_weight != 0, has_b = q.has_bias != 0;
    const tpu_tensor *w = has_w ? &a->t[4] : NULL, *b = has_b ? &a->t[4 + has_w] : NULL;
    int64_t rows = 1, prod = 1;
    int lead = x->ndim; /* leading dims: the trailing ones multiply to M */
    while (prod != M && lead > 0) prod *= x->sizes[--lead];
    for (int d = 0; d < lead; d++) rows *= x->sizes[d];
    int64_t idx[TPU_MAX_DIMS];
    for (int64_t r = 0; r < rows; r++) {
        double s = 0, ss = 0;
        for (int64_t j = 0; j < M; j++) {
            ref_rc(x, M, r, j, idx);
            s += ref_get(x, idx);
        }
        double mean = M > 0 ? s / (double)M : 0.0;
        for (int64_t j = 0; j < M; j++) {
            ref_rc(x, M, r, j, idx);
            double d = ref_get(x, idx) - mean;
            ss += d * d;
        }
        double rstd = M > 0 ? 1.0 / sqrt(ss / (double)M + q.eps) : NAN;
        ref_set_linear(mean_t, r, mean);
        ref_set_linear(rstd_t, r, rstd);
        for (int64_t j = 0; j < M; j++) {
            ref_rc(x, M, r, j, idx);
            double v = (ref_get(x, idx) - mean) * rstd;
            if (w) v *= ref_linear(w, j);
            if (b) v += ref_linear(b, j);
            ref_set(y, idx, v);
        }
    }
    return TPU_OK;
}

static tpu_status ref_ln_bwd(tpu_kargs *a) {
    const tpu_tensor *dx = &a->t[0], *dw = &a->t[1], *db = &a->t[2];
    const tpu_tensor *g = &a->t[3], *x = &a->t[4], *mean_t = &a->t[5], *rstd_t = &a->t[6];
    const tpu_tensor *w = a->n == 8 ? &a->t[7] : NULL;
    int64_t M = tpu_unpack_LAYER_NORM_BWD(&a->p).cols;
    if (M == 0) return TPU_OK;
    int64_t rows = ref_numel(x) / M;
    double *sw = calloc((size_t)M, sizeof *sw), *sb = calloc((size_t)M, sizeof *sb);
    if (!sw || !sb) {
        free(sw);
        free(sb);
        return tpu_kernel_fail(a, "layer_norm_backward: out of host memory");
    }
    int64_t idx[TPU_MAX_DIMS];
    for (int64_t r = 0; r < rows; r++) {
        double mean = ref_linear(mean_t, r), rstd = ref_linear(rstd_t, r);
        double s1 = 0, s2 = 0;
        for (int64_t j = 0; j < M; j++) {
            ref_rc(x, M, r, j, idx);
            double gj = ref_get(g, idx), xh = (ref_get(x, idx) - mean) * rstd;
            double gw = w ? gj * ref_linear(w, j) : gj;
            s1 += gw;
            s2 += gw * xh;
            sw[j] += gj * xh;
            sb[j] += gj;
        }
        if (dx->is_scalar) continue;
        for (int64_t j = 0; j < M; j++) {
            ref_rc(x, M, r, j, idx);
            double gj = ref_get(g, idx), xh = (ref_get(x, idx) - mean) * rstd;
            double gw = w ? gj * ref_linear(w, j) : gj;
            ref_set(dx, idx, rstd * (gw - s1 / (double)M - xh * s2 / (double)M));
        }
    }
    for (int64_t j = 0; j < M; j++) {
        if (!dw->is_scalar) ref_set_linear(dw, j, sw[j]);
        if (!db->is_scalar) ref_set_linear(db, j, sb[j]);
    }
    free(sw);
    free(sb);
    return TPU_OK;
}

tpu_status tpu_ref_norm(tpu_kargs *a) {
    if (a->op == TPU_OP_LAYER_NORM) return ref_ln_fwd(a);
    return ref_ln_bwd(a);
}

/* ---- index ops ---- */

static int64_t ref_index_at(const tpu_tensor *ix, const int64_t *idx) {
    return tpu_load_i64(ref_ptr(ix, ref_off(ix, idx)), (tpu_dtype)ix->dtype);
}

/* dst[di] += alpha * src[si], in double (int64 for integer dtypes) */
static void ref_accumulate(const tpu_tensor *dst, const int64_t *di, const tpu_tensor *src, const int64_t *si,
                           double alpha) {
    void *dp = ref_ptr(dst, ref_off(dst, di)), *sp = ref_ptr(src, ref_off(src, si));
    tpu_dtype dt = (tpu_dtype)dst->dtype;
    if (tpu_dtype_is_float(dt)) {
        tpu_store_f64(dp, dt, tpu_load_f64(dp, dt) + alpha * tpu_load_f64(sp, dt));
    } else {
        tpu_store_i64(dp, dt, tpu_load_i64(dp, dt) + (int64_t)alpha * tpu_load_i64(sp, dt));
    }
}

/* index / index_put (see ops.def): one position of the iteration shape at a
 * time, the indexed operand's offset from the full multi-index. */
static tpu_status ref_index_adv(tpu_kargs *a) {
    bool put = a->op == TPU_OP_INDEX_PUT;
    int k = a->n - 2;
    tpu_args_INDEX_PUT q = tpu_unpack_INDEX_PUT(&a->p);
    const tpu_tensor *rd = &a->t[1], *shape = put ? rd : &a->t[0], *xv = put ? &a->t[0] : rd;
    int nd = shape->ndim;
    if (k < 1 || xv->ndim != nd + k) return tpu_kernel_fail(a, "%s: bad operands", tpu_op_name(a->op));
    int64_t n = ref_numel(shape), idx[TPU_MAX_DIMS] = {0}, full[TPU_MAX_DIMS];
    for (int pass = 0; pass < 2; pass++) { /* pass 0 checks, pass 1 writes */
        for (int64_t l = 0; l < n; l++) {
            ref_unravel(shape, l, idx);
            memcpy(full, idx, sizeof full);
            for (int j = 0; j < k; j++) {
                int64_t v = ref_index_at(&a->t[2 + j], idx), lim = xv->sizes[nd + j];
                if (v < -lim || v >= lim)
                    return tpu_kernel_fail(a, "index %lld is out of bounds for dimension %d with size %lld",
                                           (long long)v, (int)((q.dims >> (5 * j)) & 31), (long long)lim);
                full[nd + j] = v < 0 ? v + lim : v;
            }
            if (pass == 0) continue;
            tpu_dtype dt = (tpu_dtype)a->t[0].dtype;
            void *dp = ref_ptr(&a->t[0], ref_off(&a->t[0], put ? full : idx));
            const void *sp = ref_ptr(rd, ref_off(rd, put ? idx : full));
            if (put && q.accumulate && dt == TPU_BOOL)
                tpu_store_i64(dp, dt, tpu_load_i64(dp, dt) | tpu_load_i64(sp, dt));
            else if (put && q.accumulate)
                ref_accumulate(&a->t[0], full, rd, idx, 1.0);
            else
                memcpy(dp, sp, tpu_dtype_size(dt));
        }
    }
    return TPU_OK;
}

/* v rounded to dt (a store and a load back). */
static double hist_rnd(double v, tpu_dtype dt) {
    char tmp[8];
    tpu_store_f64(tmp, dt, v);
    return tpu_load_f64(tmp, dt);
}

/* The bin of e for histc, or -1: the CPU's formula for floats, in the input's
 * dtype with each step rounded (bf16/f16 arithmetic rounds per op, int64 bin
 * count included); CUDA's int64 arithmetic for integers. */
static int64_t histc_bin(const void *p, tpu_dtype dt, double mn, double mx, int64_t nb) {
    int64_t pos;
    if (tpu_dtype_is_float(dt)) {
        double e = tpu_load_f64(p, dt), lo = hist_rnd(mn, dt), hi = hist_rnd(mx, dt);
        if (!(e >= lo && e <= hi)) return -1;
        if (dt == TPU_F64) {
            pos = (int64_t)((e - lo) * (double)nb / (hi - lo));
        } else if (dt == TPU_F32) {
            pos = (int64_t)(((float)e - (float)lo) * (float)nb / ((float)hi - (float)lo));
        } else {
            double d = hist_rnd(e - lo, dt), m = hist_rnd(d * hist_rnd((double)nb, dt), dt);
            pos = (int64_t)hist_rnd(m / hist_rnd(hi - lo, dt), dt);
        }
    } else {
        int64_t e = tpu_load_i64(p, dt), lo = (int64_t)mn, hi = (int64_t)mx;
        if (e < lo || e > hi) return -1;
        pos = (int64_t)(((uint64_t)e - (uint64_t)lo) * (uint64_t)nb / ((uint64_t)hi - (uint64_t)lo));
    }
    if (pos == nb) pos = nb - 1; /* the last bin is closed on the right */
    return pos >= 0 && pos < nb ? pos : -1;
}

tpu_status tpu_histogram(tpu_kargs *a) {
    const tpu_tensor *o = &a->t[0], *x = &a->t[1];
    tpu_dtype ot = (tpu_dtype)o->dtype, xt = (tpu_dtype)x->dtype;
    const char *name = tpu_op_name(a->op);
    if (o->ndim != 1) return tpu_kernel_fail(a, "%s: out must be 1-d", name);
    int64_t nb = o->sizes[0], n = ref_numel(x), idx[TPU_MAX_DIMS] = {0}, oi[1];
    if (a->op == TPU_OP_BINCOUNT && x->ndim != 1) return tpu_kernel_fail(a, "%s: input must be 1-d", name);
    const tpu_tensor *w = a->n > 2 ? &a->t[2] : NULL;
    if (w && (w->ndim != 1 || w->sizes[0] != n)) return tpu_kernel_fail(a, "%s: weights must match the input", name);
    if (a->op == TPU_OP_BINCOUNT)
        for (int64_t l = 0; l < n; l++) { /* check first: nothing written on failure */
            int64_t v = tpu_load_i64(ref_ptr(x, ref_off(x, &l)), xt);
            if (v < 0 || v >= nb)
                return tpu_kernel_fail(a, "bincount: value %lld out of range [0, %lld)", (long long)v, (long long)nb);
        }
    for (oi[0] = 0; oi[0] < nb; oi[0]++) tpu_store_f64(ref_ptr(o, ref_off(o, oi)), ot, 0.0);
    if (a->op == TPU_OP_HISTC) {
        tpu_args_HISTC q = tpu_unpack_HISTC(&a->p);
        int64_t *cnt = calloc((size_t)(nb > 0 ? nb : 1), sizeof *cnt);
        if (!cnt) return tpu_kernel_fail(a, "histc: out of host memory");
        for (int64_t l = 0; l < n; l++) {
            ref_unravel(x, l, idx);
            int64_t b = histc_bin(ref_ptr(x, ref_off(x, idx)), xt, q.min, q.max, nb);
            if (b >= 0) cnt[b]++;
        }
        for (oi[0] = 0; oi[0] < nb; oi[0]++) tpu_store_f64(ref_ptr(o, ref_off(o, oi)), ot, (double)cnt[oi[0]]);
        free(cnt);
        return TPU_OK;
    }
    for (int64_t l = 0; l < n; l++) { /* bincount: in order, accumulating in out's dtype */
        oi[0] = tpu_load_i64(ref_ptr(x, ref_off(x, &l)), xt);
        void *d = ref_ptr(o, ref_off(o, oi));
        if (!w) {
            tpu_store_i64(d, ot, tpu_load_i64(d, ot) + 1);
        } else {
            double wv = tpu_load_f64(ref_ptr(w, ref_off(w, &l)), (tpu_dtype)w->dtype);
            if (ot == TPU_F32)
                tpu_store_f64(d, ot, (double)((float)tpu_load_f64(d, ot) + (float)wv));
            else
                tpu_store_f64(d, ot, tpu_load_f64(d, ot) + wv);
        }
    }
    return TPU_OK;
}

/* nonzero: count, then write each nonzero element's multi-index. */
static tpu_status ref_nonzero(tpu_kargs *a) {
    const tpu_tensor *o = &a->t[0], *x = &a->t[1];
    int64_t n = ref_numel(x), count = 0, idx[TPU_MAX_DIMS] = {0};
    if (o->dtype != TPU_I64 || o->ndim != 2 || o->sizes[1] != x->ndim)
        return tpu_kernel_fail(a, "nonzero: out must be int64 of shape [n, %d]", x->ndim);
    for (int64_t l = 0; l < n; l++) {
        ref_unravel(x, l, idx);
        count += ref_get(x, idx) != 0.0;
    }
    if (count != o->sizes[0])
        return tpu_kernel_fail(a, "nonzero: the input has %lld nonzero elements, out has %lld rows", (long long)count,
                               (long long)o->sizes[0]);
    int64_t row = 0, oi[2];
    for (int64_t l = 0; l < n; l++) {
        ref_unravel(x, l, idx);
        if (ref_get(x, idx) == 0.0) continue;
        for (int d = 0; d < x->ndim; d++) {
            oi[0] = row;
            oi[1] = d;
            tpu_store_i64(ref_ptr(o, ref_off(o, oi)), TPU_I64, idx[d]);
        }
        row++;
    }
    return TPU_OK;
}

tpu_status tpu_ref_index(tpu_kargs *a) {
    if (a->op == TPU_OP_INDEX || a->op == TPU_OP_INDEX_PUT) return ref_index_adv(a);
    if (a->op == TPU_OP_NONZERO) return ref_nonzero(a);
    if (a->op == TPU_OP_HISTC || a->op == TPU_OP_BINCOUNT)
        return tpu_histogram(a); /* (serial, one element at a time: it is its own reference) */
    const tpu_tensor *out = &a->t[0];
    tpu_args_INDEX_ADD q = tpu_unpack_INDEX_ADD(&a->p); /* dim as in the other three; alpha: INDEX_ADD only */
    int dim = (int)q.dim;
    bool scatter = a->op == TPU_OP_SCATTER_ADD || a->op == TPU_OP_INDEX_ADD || a->op == TPU_OP_SCATTER ||
                   a->op == TPU_OP_SCATTER_REDUCE;
    const tpu_tensor *ix = &a->t[scatter ? 1 : 2], *x = &a->t[scatter ? 2 : 1];
    /* the iteration tensor: its multi-index addresses every element once */
    const tpu_tensor *it = a->op == TPU_OP_INDEX_SELECT ? out : a->op == TPU_OP_INDEX_ADD ? x : ix;
    bool one_d = a->op == TPU_OP_INDEX_SELECT || a->op == TPU_OP_INDEX_ADD;
    int64_t lim = out->ndim == 0 ? 1 : scatter ? out->sizes[dim] : x->sizes[dim];
    int64_t n = ref_numel(it), idx[TPU_MAX_DIMS] = {0}, jdx[TPU_MAX_DIMS];
    for (int pass = 0; pass < 2; pass++) { /* pass 0 checks, pass 1 writes */
        for (int64_t l = 0; l < n; l++) {
            ref_unravel(it, l, idx);
            int64_t k = it->ndim ? idx[dim] : 0;
            int64_t ki[1] = {k};
            int64_t j = one_d ? ref_index_at(ix, ix->ndim ? ki : idx) : ref_index_at(ix, idx);
            if (pass == 0) {
                if (j >= 0 && j < lim) continue;
                if (a->op == TPU_OP_INDEX_SELECT) return tpu_kernel_fail(a, "index out of range in self");
                return tpu_kernel_fail(a, "index %lld is out of bounds for dimension %d with size %lld", (long long)j,
                                       dim, (long long)lim);
            }
            memcpy(jdx, idx, sizeof jdx);
            if (it->ndim) jdx[dim] = j;
            switch (a->op) {
            case TPU_OP_INDEX_SELECT:
            case TPU_OP_GATHER: /* out[idx] = x[idx with dim = j] */
                if (tpu_dtype_is_float((tpu_dtype)out->dtype))
                    ref_set(out, idx, ref_get(x, jdx));
                else
                    tpu_store_i64(ref_ptr(out, ref_off(out, idx)), (tpu_dtype)out->dtype,
                                  tpu_load_i64(ref_ptr(x, ref_off(x, jdx)), (tpu_dtype)x->dtype));
                break;
            case TPU_OP_SCATTER: /* out[idx with dim = j] = src[idx] (in order: the last wins) */
                memcpy(ref_ptr(out, ref_off(out, jdx)), ref_ptr(x, ref_off(x, idx)),
                       tpu_dtype_size((tpu_dtype)out->dtype));
                break;
            case TPU_OP_SCATTER_ADD: /* out[idx with dim = j] += src[idx] */
                ref_accumulate(out, jdx, x, idx, 1.0);
                break;
            case TPU_OP_SCATTER_REDUCE: { /* out[idx with dim = j] = out (*, max, min) src[idx] */
                int64_t red = tpu_unpack_SCATTER_REDUCE(&a->p).reduce;
                void *dp = ref_ptr(out, ref_off(out, jdx));
                const void *sp = ref_ptr(x, ref_off(x, idx));
                tpu_dtype dt = (tpu_dtype)out->dtype;
                if (red < 0 || red > 2) return tpu_kernel_fail(a, "scatter_reduce: reduce %lld", (long long)red);
                if (tpu_dtype_is_float(dt)) {
                    double u = tpu_load_f64(dp, dt), v = tpu_load_f64(sp, dt);
                    if (red == 0)
                        u *= v;
                    else if (isnan(v) || (red == 1 ? v > u : v < u))
                        u = v;
                    tpu_store_f64(dp, dt, u);
                } else {
                    int64_t u = tpu_load_i64(dp, dt), v = tpu_load_i64(sp, dt);
                    u = red == 0 ? (int64_t)((uint64_t)u * (uint64_t)v) : (red == 1 ? v > u : v < u) ? v : u;
                    tpu_store_i64(dp, dt, u);
                }
                break;
            }
            default: /* index_add */ ref_accumulate(out, jdx, x, idx, q.alpha); break;
            }
        }
    }
    return TPU_OK;
}

/* ---- AdamW ---- */

tpu_status tpu_ref_optim(tpu_kargs *a) {
    tpu_args_ADAMW_STEP q = tpu_unpack_ADAMW_STEP(&a->p);
    if (q.amsgrad != 0) {
        tpu_kernel_fail(a, "adamw_step: amsgrad is not supported");
        return TPU_ERROR_NOT_SUPPORTED;
    }
    const tpu_tensor *p = &a->t[0], *m = &a->t[1], *v = &a->t[2], *g = &a->t[3];
    int64_t zero[TPU_MAX_DIMS] = {0};
    if (a->n > 5 && ref_get(&a->t[5], zero) != 0.0) return TPU_OK; /* found_inf: skipped */
    double lr = q.lr, b1 = q.beta1, b2 = q.beta2, eps = q.eps, wd = q.weight_decay;
    double step = a->n > 4 ? ref_get(&a->t[4], zero) : (double)q.step;
    if (!(step >= 1)) return tpu_kernel_fail(a, "adamw_step: step must be >= 1, got %g", step);
    double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
    int64_t n = ref_numel(p), idx[TPU_MAX_DIMS];
    for (int64_t l = 0; l < n; l++) {
        ref_unravel(p, l, idx);
        double pv = ref_get(p, idx), mv = ref_get(m, idx), vv = ref_get(v, idx), gv = ref_get(g, idx);
        if (q.maximize) gv = -gv;
        if (q.l2)
            gv += wd * pv; /* Adam: L2 penalty in the gradient */
        else
            pv *= 1.0 - lr * wd; /* AdamW: decoupled decay */
        mv = mv + (1.0 - b1) * (gv - mv);
        vv = vv * b2 + (1.0 - b2) * gv * gv;
        pv -= lr / bc1 * mv / (sqrt(vv) / sqrt(bc2) + eps);
        ref_set(p, idx, pv);
        ref_set(m, idx, mv);
        ref_set(v, idx, vv);
    }
    return TPU_OK;
}

/* ---- sort / topk: per row, a stable insertion sort of (key, index) ---- */

static bool ref_sort_before(double x, double y, bool desc) {
    bool nx = isnan(x), ny = isnan(y);
    return desc ? (nx && !ny) || x > y : (ny && !nx) || x < y;
}

tpu_status tpu_ref_sort(tpu_kargs *a) {
    const tpu_tensor *v = &a->t[0], *ix = &a->t[1], *x = &a->t[2];
    tpu_args_SORT q = tpu_unpack_SORT(&a->p);
    int dim = (int)q.dim, nd = x->ndim;
    bool desc = q.descending != 0, flt = tpu_dtype_is_float((tpu_dtype)x->dtype);
    if (nd == 0 || dim < 0 || dim >= nd || v->ndim != nd || ix->ndim != nd)
        return tpu_kernel_fail(a, "%s: bad operands", tpu_op_name(a->op));
    int64_t n = x->sizes[dim], k = v->sizes[dim], rows = 1;
    for (int d = 0; d < nd; d++)
        if (d != dim) rows *= x->sizes[d];
    int64_t *perm = malloc((size_t)(n ? n : 1) * sizeof *perm);
    double *key = malloc((size_t)(n ? n : 1) * sizeof *key);
    int64_t *ikey = malloc((size_t)(n ? n : 1) * sizeof *ikey);
    if (!perm || !key || !ikey) {
        free(perm);
        free(key);
        free(ikey);
        return tpu_kernel_fail(a, "sort: out of host memory");
    }
    int64_t idx[TPU_MAX_DIMS] = {0};
    for (int64_t row = 0; row < rows; row++) {
        int64_t rem = row;
        for (int d = nd - 1; d >= 0; d--) {
            if (d == dim) continue;
            idx[d] = rem % x->sizes[d];
            rem /= x->sizes[d];
        }
        for (int64_t j = 0; j < n; j++) {
            idx[dim] = j;
            const void *e = ref_ptr(x, ref_off(x, idx));
            key[j] = tpu_load_f64(e, (tpu_dtype)x->dtype);
            ikey[j] = tpu_load_i64(e, (tpu_dtype)x->dtype);
            int64_t m = j; /* insert j after every element that does not go strictly after it */
            while (m > 0 && (flt ? ref_sort_before(key[j], key[perm[m - 1]], desc)
                                 : (desc ? ikey[j] > ikey[perm[m - 1]] : ikey[j] < ikey[perm[m - 1]]))) {
                perm[m] = perm[m - 1];
                m--;
            }
            perm[m] = j;
        }
        for (int64_t j = 0; j < k; j++) {
            int64_t src[TPU_MAX_DIMS];
            memcpy(src, idx, sizeof src);
            src[dim] = perm[j];
            idx[dim] = j;
            memcpy(ref_ptr(v, ref_off(v, idx)), ref_ptr(x, ref_off(x, src)), tpu_dtype_size((tpu_dtype)x->dtype));
            tpu_store_i64(ref_ptr(ix, ref_off(ix, idx)), TPU_I64, perm[j]);
        }
    }
    free(perm);
    free(key);
    free(ikey);
    return TPU_OK;
}
