/* ref_attn.c - reference scaled dot-product attention (the ATTN family): the
 * oracle kernels/attention.c is tested against, the operand checks both
 * share, and the dropout draw both use.
 *
 * Naive on purpose: one query row at a time, its S scores in a double
 * buffer, softmax and every sum in double, serial, written straight from
 * the formulas next to the ops in ops.def. */
#include "ref/ref-impl.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- operand checks ---- */

static tpu_status attn_shape(tpu_kargs *a, int k, const char *name, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                             int nd) {
    const tpu_tensor *t = &a->t[k];
    const int64_t want[4] = {d0, d1, d2, d3};
    bool ok = !t->is_scalar && t->ndim == nd;
    for (int d = 0; ok && d < nd; d++) ok = t->sizes[d] == want[d];
    if (ok) return TPU_OK;
    char got[96] = "scalar", exp[96], *p = got;
    if (!t->is_scalar) {
        p += snprintf(got, sizeof got, "[");
        for (int d = 0; d < t->ndim && p < got + sizeof got - 24; d++)
            p += snprintf(p, (size_t)(got + sizeof got - p), d ? ", %lld" : "%lld", (long long)t->sizes[d]);
        snprintf(p, (size_t)(got + sizeof got - p), "]");
    }
    p = exp + snprintf(exp, sizeof exp, "[");
    for (int d = 0; d < nd; d++)
        p += snprintf(p, (size_t)(exp + sizeof exp - p), d ? ", %lld" : "%lld", (long long)want[d]);
    snprintf(p, (size_t)(exp + sizeof exp - p), "]");
    return tpu_kernel_fail(a, "%s: %s has shape %s, expected %s", tpu_op_name(a->op), name, got, exp);
}

tpu_status tpu_attn_check(tpu_kargs *a, tpu_attn_dims *d) {
    const bool bwd = a->op == TPU_OP_ATTN_BWD;
    if (a->op != TPU_OP_ATTN && !bwd) return tpu_kernel_fail(a, "%s: not an attention op", tpu_op_name(a->op));
    const char *op = tpu_op_name(a->op);
    const int nout = bwd ? 4 : 2, iq = nout + (bwd ? 1 : 0);
    if (a->n != nout + (bwd ? 6 : 3) && a->n != nout + (bwd ? 7 : 4))
        return tpu_kernel_fail(a, "%s: expected %d or %d operands, got %d", op, nout + (bwd ? 6 : 3),
                               nout + (bwd ? 7 : 4), a->n);
    const tpu_tensor *q = &a->t[iq], *k = &a->t[iq + 1], *v = &a->t[iq + 2];
    const char *qkv[3] = {"query", "key", "value"};
    for (int i = 0; i < 3; i++)
        if (a->t[iq + i].is_scalar || a->t[iq + i].ndim != 4)
            return tpu_kernel_fail(a, "%s: %s must be 4-d [batch, heads, length, dim], got %d dims", op, qkv[i],
                                   a->t[iq + i].is_scalar ? 0 : a->t[iq + i].ndim);
    d->B = q->sizes[0];
    d->H = q->sizes[1];
    d->L = q->sizes[2];
    d->E = q->sizes[3];
    d->Hk = k->sizes[1];
    d->S = k->sizes[2];
    d->Ev = v->sizes[3];
    tpu_dtype dt = (tpu_dtype)q->dtype;
    if (dt != TPU_F32 && dt != TPU_BF16 && dt != TPU_F16)
        return tpu_kernel_fail(a, "%s: not implemented for dtype %s", op, tpu_dtype_name(dt));
    if (d->Hk <= 0 || d->H % d->Hk)
        return tpu_kernel_fail(a, "%s: query has %lld heads, not a multiple of key's %lld", op, (long long)d->H,
                               (long long)d->Hk);
    tpu_status s;
    if ((s = attn_shape(a, iq + 1, "key", d->B, d->Hk, d->S, d->E, 4))) return s;
    if ((s = attn_shape(a, iq + 2, "value", d->B, d->Hk, d->S, d->Ev, 4))) return s;
    d->mask = a->n == (bwd ? 11 : 6) ? &a->t[a->n - 1] : NULL;
    if (d->mask) {
        if ((s = attn_shape(a, a->n - 1, "mask", d->B, d->H, d->L, d->S, 4))) return s;
        if (d->mask->dtype != (int32_t)dt && d->mask->dtype != TPU_BOOL)
            return tpu_kernel_fail(a, "%s: mask is %s, expected bool or %s like query", op,
                                   tpu_dtype_name((tpu_dtype)d->mask->dtype), tpu_dtype_name(dt));
    }
    /* Every other operand: its role, shape, and dtype (lse float32, the rest q's). */
    struct {
        int k;
        const char *name;
        int64_t s[4];
        int nd;
        bool f32, opt;
    } roles[8];
    int nr = 0;
#define ROLE(K, NAME, A0, A1, A2, A3, ND, F32, OPT) \
    roles[nr++] = (__typeof__(roles[0])) { (K), (NAME), {(A0), (A1), (A2), (A3)}, (ND), (F32), (OPT) }
    if (!bwd) {
        ROLE(0, "out", d->B, d->H, d->L, d->Ev, 4, false, false);
        ROLE(1, "logsumexp", d->B, d->H, d->L, 0, 3, true, false);
    } else {
        ROLE(0, "grad_query", d->B, d->H, d->L, d->E, 4, false, false);
        ROLE(1, "grad_key", d->B, d->Hk, d->S, d->E, 4, false, false);
        ROLE(2, "grad_value", d->B, d->Hk, d->S, d->Ev, 4, false, false);
        ROLE(3, "grad_mask", d->B, d->H, d->L, d->S, 4, false, true);
        ROLE(4, "grad_out", d->B, d->H, d->L, d->Ev, 4, false, false);
        ROLE(8, "out", d->B, d->H, d->L, d->Ev, 4, false, false);
        ROLE(9, "logsumexp", d->B, d->H, d->L, 0, 3, true, false);
    }
#undef ROLE
    for (int r = 0; r < nr; r++) {
        const tpu_tensor *t = &a->t[roles[r].k];
        if (t->is_scalar && roles[r].opt) continue;
        if ((s = attn_shape(a, roles[r].k, roles[r].name, roles[r].s[0], roles[r].s[1], roles[r].s[2], roles[r].s[3],
                            roles[r].nd)))
            return s;
        tpu_dtype want = roles[r].f32 ? TPU_F32 : dt;
        if (t->dtype != (int32_t)want)
            return tpu_kernel_fail(a, "%s: %s is %s, expected %s", op, roles[r].name,
                                   tpu_dtype_name((tpu_dtype)t->dtype), tpu_dtype_name(want));
    }
    for (int i = 1; i < 3; i++)
        if (a->t[iq + i].dtype != (int32_t)dt)
            return tpu_kernel_fail(a, "%s: %s is %s, expected %s like query", op, qkv[i],
                                   tpu_dtype_name((tpu_dtype)a->t[iq + i].dtype), tpu_dtype_name(dt));
    tpu_args_ATTN p = tpu_unpack_ATTN(&a->p);
    d->scale = p.scale;
    d->dropout = p.dropout;
    d->causal = p.causal != 0;
    d->seed = (uint64_t)p.seed;
    d->offset = (uint64_t)p.offset;
    if (!(d->dropout >= 0 && d->dropout < 1))
        return tpu_kernel_fail(a, "%s: dropout probability must be in [0, 1), got %g", op, d->dropout);
    d->grad_mask = bwd && !a->t[3].is_scalar;
    return TPU_OK;
}

bool tpu_attn_keep(const tpu_attn_dims *d, uint64_t n) {
    uint32_t w[4];
    tpu_philox_block(d->seed, d->offset, n >> 2, w);
    return tpu_u32_to_unit_float(w[n & 3]) >= (float)d->dropout;
}

/* ---- the reference ---- */

static int64_t off4(const tpu_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return i0 * t->strides[0] + i1 * t->strides[1] + i2 * t->strides[2] + i3 * t->strides[3];
}
static double ld4(const tpu_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    return tpu_load_f64(tpu_elem_ptr(t, off4(t, i0, i1, i2, i3)), (tpu_dtype)t->dtype);
}
static void st4(const tpu_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double v) {
    tpu_store_f64(tpu_elem_ptr(t, off4(t, i0, i1, i2, i3)), (tpu_dtype)t->dtype, v);
}
static int64_t off3(const tpu_tensor *t, int64_t i0, int64_t i1, int64_t i2) {
    return i0 * t->strides[0] + i1 * t->strides[1] + i2 * t->strides[2];
}

/* Row i's scores s[0..S) of head (b, h): -inf where excluded. */
static void ref_scores(const tpu_attn_dims *d, const tpu_tensor *q, const tpu_tensor *k, int64_t b, int64_t h,
                       int64_t i, double *s) {
    const int64_t hk = h / (d->H / d->Hk);
    for (int64_t j = 0; j < d->S; j++) {
        double acc = 0;
        for (int64_t e = 0; e < d->E; e++) acc += ld4(q, b, h, i, e) * ld4(k, b, hk, j, e);
        double x = d->scale * acc;
        if (d->mask) {
            double m = ld4(d->mask, b, h, i, j);
            x = d->mask->dtype == TPU_BOOL ? (m != 0 ? x : -INFINITY) : x + m;
        }
        s[j] = d->causal && j > i ? -INFINITY : x;
    }
}

static double ref_z(const tpu_attn_dims *d, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (d->dropout == 0) return 1;
    uint64_t n =
        (((uint64_t)b * (uint64_t)d->H + (uint64_t)h) * (uint64_t)d->L + (uint64_t)i) * (uint64_t)d->S + (uint64_t)j;
    return tpu_attn_keep(d, n) ? 1.0 / (1.0 - d->dropout) : 0.0;
}

static void ref_fwd(tpu_kargs *a, const tpu_attn_dims *d, double *s) {
    const tpu_tensor *o = &a->t[0], *lse = &a->t[1], *q = &a->t[2], *k = &a->t[3], *v = &a->t[4];
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t h = 0; h < d->H; h++)
            for (int64_t i = 0; i < d->L; i++) {
                const int64_t hk = h / (d->H / d->Hk);
                ref_scores(d, q, k, b, h, i, s);
                double m = -INFINITY;
                bool nan = false;
                for (int64_t j = 0; j < d->S; j++) {
                    nan |= s[j] != s[j];
                    if (s[j] > m) m = s[j];
                }
                double l = 0;
                if (m != -INFINITY || nan)
                    for (int64_t j = 0; j < d->S; j++) l += s[j] = exp(s[j] - (nan ? 0 : m));
                for (int64_t e = 0; e < d->Ev; e++) {
                    double acc = 0;
                    if (l != 0)
                        for (int64_t j = 0; j < d->S; j++) acc += s[j] / l * ref_z(d, b, h, i, j) * ld4(v, b, hk, j, e);
                    st4(o, b, h, i, e, nan ? NAN : acc);
                }
                double lv = nan ? NAN : l != 0 ? m + log(l) : -INFINITY;
                tpu_store_f64(tpu_elem_ptr(lse, off3(lse, b, h, i)), TPU_F32, lv);
            }
}

/* dS, dq, dk, dv from P_ij = exp(s_ij - lse_i) (0 where lse_i is -inf) and D_i = grad_out_i . out_i. */
static tpu_status ref_bwd(tpu_kargs *a, const tpu_attn_dims *d, double *s) {
    const tpu_tensor *dq = &a->t[0], *dk = &a->t[1], *dv = &a->t[2], *dm = &a->t[3];
    const tpu_tensor *go = &a->t[4], *q = &a->t[5], *k = &a->t[6], *v = &a->t[7], *o = &a->t[8], *lse = &a->t[9];
    const int64_t nk = d->B * d->Hk * d->S;
    double *gk = calloc((size_t)(nk * d->E + nk * d->Ev + d->E + 1), sizeof *gk);
    if (!gk) return tpu_kernel_fail(a, "%s: out of host memory", tpu_op_name(a->op));
    double *gv = gk + nk * d->E, *gq = gv + nk * d->Ev;
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t h = 0; h < d->H; h++)
            for (int64_t i = 0; i < d->L; i++) {
                const int64_t hk = h / (d->H / d->Hk), kv = (b * d->Hk + hk) * d->S;
                ref_scores(d, q, k, b, h, i, s);
                double lv = tpu_load_f64(tpu_elem_ptr(lse, off3(lse, b, h, i)), TPU_F32), D = 0;
                for (int64_t e = 0; e < d->Ev; e++) D += ld4(go, b, h, i, e) * ld4(o, b, h, i, e);
                for (int64_t e = 0; e < d->E; e++) gq[e] = 0;
                for (int64_t j = 0; j < d->S; j++) {
                    double p = lv == -INFINITY ? 0 : exp(s[j] - lv), z = ref_z(d, b, h, i, j), dp = 0;
                    for (int64_t e = 0; e < d->Ev; e++) {
                        double g = ld4(go, b, h, i, e);
                        dp += g * ld4(v, b, hk, j, e);
                        gv[(kv + j) * d->Ev + e] += p * z * g;
                    }
                    double ds = p * (dp * z - D);
                    if (d->grad_mask) st4(dm, b, h, i, j, ds);
                    for (int64_t e = 0; e < d->E; e++) {
                        gq[e] += ds * ld4(k, b, hk, j, e);
                        gk[(kv + j) * d->E + e] += ds * ld4(q, b, h, i, e);
                    }
                }
                for (int64_t e = 0; e < d->E; e++) st4(dq, b, h, i, e, d->scale * gq[e]);
            }
    for (int64_t b = 0; b < d->B; b++)
        for (int64_t hk = 0; hk < d->Hk; hk++)
            for (int64_t j = 0; j < d->S; j++) {
                const int64_t r = (b * d->Hk + hk) * d->S + j;
                for (int64_t e = 0; e < d->E; e++) st4(dk, b, hk, j, e, d->scale * gk[r * d->E + e]);
                for (int64_t e = 0; e < d->Ev; e++) st4(dv, b, hk, j, e, gv[r * d->Ev + e]);
            }
    free(gk);
    return TPU_OK;
}

tpu_status tpu_ref_attn(tpu_kargs *a) {
    tpu_attn_dims d;
    tpu_status st = tpu_attn_check(a, &d);
    if (st) return st;
    double *s = malloc((size_t)(d.S + 1) * sizeof *s);
    if (!s) return tpu_kernel_fail(a, "%s: out of host memory", tpu_op_name(a->op));
    if (a->op == TPU_OP_ATTN)
        ref_fwd(a, &d, s);
    else
        st = ref_bwd(a, &d, s);
    free(s);
    return st;
}
