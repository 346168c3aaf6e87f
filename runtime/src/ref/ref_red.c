/* ref_red.c - naive reference kernels for reductions (RED) and scans (SCAN).
 *
 * The oracle for kernels/reduce.c. For every output element the reduced
 * input elements are collected in row-major order into a plain array and
 * folded sequentially: sums, products and moments in double (int64 for
 * SUM/PROD/AMAX/AMIN when input and output are integer/bool, wrapping like
 * the C++ integer types), variance by two passes. Scans walk each line in
 * order with the same accumulator rule. Never optimized. */
#include "ref/ref-impl.h"
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref_red_geom {
    int nd;
    int64_t nout, nred;
    bool red[TPU_MAX_DIMS]; /* dim d is reduced */
} ref_red_geom;

static bool ref_red_is_int(tpu_dtype dt) { return !tpu_dtype_is_float(dt); }

static bool ref_red_int_domain(tpu_op op, const tpu_tensor *in, const tpu_tensor *out) {
    bool ints = ref_red_is_int((tpu_dtype)in->dtype) && ref_red_is_int((tpu_dtype)out->dtype);
    return ints && (op == TPU_OP_SUM || op == TPU_OP_PROD || op == TPU_OP_AMAX || op == TPU_OP_AMIN);
}

static tpu_status ref_red_geometry(tpu_kargs *a, ref_red_geom *g) {
    const tpu_tensor *o = &a->t[0], *in = &a->t[1];
    if (a->n != 2 || o->ndim != in->ndim || in->is_scalar)
        return tpu_kernel_fail(a, "%s: expected out and input of the same rank", tpu_op_name(a->op));
    g->nd = in->ndim;
    g->nout = 1;
    g->nred = 1;
    for (int d = 0; d < g->nd; d++) {
        g->red[d] = o->sizes[d] == 1 && in->sizes[d] != 1;
        if (!g->red[d] && o->sizes[d] != in->sizes[d])
            return tpu_kernel_fail(a, "%s: output size %lld does not match input size %lld at dim %d",
                                   tpu_op_name(a->op), (long long)o->sizes[d], (long long)in->sizes[d], d);
        if (g->red[d])
            g->nred *= in->sizes[d];
        else
            g->nout *= o->sizes[d];
    }
    return TPU_OK;
}

/* Element offset in `in` of reduced element r (row-major over the reduced
 * dims) for the output element whose multi-index is oi. */
static int64_t ref_red_in_offset(const ref_red_geom *g, const tpu_tensor *in, const int64_t *oi, int64_t r) {
    int64_t off = 0;
    for (int d = g->nd - 1; d >= 0; d--) {
        int64_t i = oi[d];
        if (g->red[d]) {
            i = r % in->sizes[d];
            r /= in->sizes[d];
        }
        off += i * in->strides[d];
    }
    return off;
}

static void ref_red_out_index(const tpu_tensor *o, int64_t lin, int64_t *oi, int64_t *off) {
    *off = 0;
    for (int d = o->ndim - 1; d >= 0; d--) {
        oi[d] = lin % o->sizes[d];
        lin /= o->sizes[d];
        *off += oi[d] * o->strides[d];
    }
}

static double ref_maxn(double a, double b) { return a != a ? a : b != b ? b : a > b ? a : b; }
static double ref_minn(double a, double b) { return a != a ? a : b != b ? b : a < b ? a : b; }

static double ref_norm(const double *v, int64_t n, double p) {
    double acc = 0;
    if (isinf(p)) {
        acc = p > 0 ? 0 : INFINITY;
        for (int64_t i = 0; i < n; i++) acc = p > 0 ? ref_maxn(acc, fabs(v[i])) : ref_minn(acc, fabs(v[i]));
        return acc;
    }
    for (int64_t i = 0; i < n; i++) {
        if (p == 0)
            acc += v[i] != 0;
        else if (p == 1)
            acc += fabs(v[i]);
        else if (p == 2)
            acc += v[i] * v[i];
        else
            acc += pow(fabs(v[i]), p);
    }
    if (p == 0 || p == 1) return acc;
    return p == 2 ? sqrt(acc) : pow(acc, 1.0 / p);
}

static double ref_var(const double *v, int64_t n, double correction) {
    double s = 0, m2 = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    double mean = s / (double)n;
    for (int64_t i = 0; i < n; i++) m2 += (v[i] - mean) * (v[i] - mean);
    double div = (double)n - correction;
    return m2 / (div > 0 ? div : 0);
}

static double ref_logsumexp(const double *v, int64_t n) {
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < n; i++) m = ref_maxn(m, v[i]);
    if (isinf(m)) m = 0;
    for (int64_t i = 0; i < n; i++) s += exp(v[i] - m);
    return log(s) + m;
}

/* One output of a double-domain reduction over the n collected values. */
static double ref_red_fold_d(tpu_op op, const double *v, int64_t n, const tpu_params *p) {
    double acc;
    switch (op) {
    case TPU_OP_SUM:
    case TPU_OP_MEAN:
        acc = 0;
        for (int64_t i = 0; i < n; i++) acc += v[i];
        return op == TPU_OP_MEAN ? acc / (double)n : acc;
    case TPU_OP_PROD:
        acc = 1;
        for (int64_t i = 0; i < n; i++) acc *= v[i];
        return acc;
    case TPU_OP_AMAX:
    case TPU_OP_AMIN:
        acc = v[0];
        for (int64_t i = 1; i < n; i++) acc = op == TPU_OP_AMAX ? ref_maxn(acc, v[i]) : ref_minn(acc, v[i]);
        return acc;
    case TPU_OP_VAR: return ref_var(v, n, tpu_unpack_VAR(p).correction);
    case TPU_OP_STD: return sqrt(ref_var(v, n, tpu_unpack_STD(p).correction));
    case TPU_OP_ANY:
        for (int64_t i = 0; i < n; i++)
            if (v[i] != 0) return 1;
        return 0;
    case TPU_OP_ALL:
        for (int64_t i = 0; i < n; i++)
            if (v[i] == 0) return 0;
        return 1;
    case TPU_OP_NORM: return ref_norm(v, n, tpu_unpack_NORM(p).p);
    case TPU_OP_LOGSUMEXP: return ref_logsumexp(v, n);
    default: return NAN;
    }
}

static int64_t ref_red_fold_i(tpu_op op, const int64_t *v, int64_t n) {
    uint64_t acc = op == TPU_OP_PROD ? 1 : 0;
    if (op == TPU_OP_AMAX || op == TPU_OP_AMIN) {
        int64_t m = v[0];
        for (int64_t i = 1; i < n; i++)
            if (op == TPU_OP_AMAX ? v[i] > m : v[i] < m) m = v[i];
        return m;
    }
    for (int64_t i = 0; i < n; i++) acc = op == TPU_OP_PROD ? acc * (uint64_t)v[i] : acc + (uint64_t)v[i];
    return (int64_t)acc;
}

/* ARGMAX / ARGMIN: first extreme; a NaN counts as the extreme (first NaN wins). */
static int64_t ref_arg_d(tpu_op op, const double *v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        double b = v[best];
        if (b != b) break;
        bool better = op == TPU_OP_ARGMAX ? v[i] > b : v[i] < b;
        if (better || v[i] != v[i]) best = i;
    }
    return best;
}

static int64_t ref_arg_i(tpu_op op, const int64_t *v, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (op == TPU_OP_ARGMAX ? v[i] > v[best] : v[i] < v[best]) best = i;
    return best;
}

static bool ref_red_needs_data(tpu_op op, const tpu_params *p) {
    bool inf_norm = op == TPU_OP_NORM && isinf(tpu_unpack_NORM(p).p);
    return op == TPU_OP_AMAX || op == TPU_OP_AMIN || op == TPU_OP_ARGMAX || op == TPU_OP_ARGMIN || inf_norm;
}

static tpu_status ref_red_check_arg(tpu_kargs *a, const ref_red_geom *g) {
    int64_t dim = tpu_unpack_ARGMAX(&a->p).dim; /* ARGMIN: the same column */
    int64_t d = dim < 0 ? dim + g->nd : dim;
    if (g->nd == 0) return TPU_OK;
    if (d < 0 || d >= g->nd) return tpu_kernel_fail(a, "%s: dim %lld out of range", tpu_op_name(a->op), (long long)dim);
    for (int k = 0; k < g->nd; k++)
        if (g->red[k] && k != d)
            return tpu_kernel_fail(a, "%s: reduces dim %d but i0 is %lld", tpu_op_name(a->op), k, (long long)d);
    return TPU_OK;
}

static void ref_red_one(tpu_kargs *a, const ref_red_geom *g, bool idom, int64_t lin, double *vd, int64_t *vi) {
    const tpu_tensor *o = &a->t[0], *in = &a->t[1];
    int64_t oi[TPU_MAX_DIMS], ooff;
    ref_red_out_index(o, lin, oi, &ooff);
    bool arg = a->op == TPU_OP_ARGMAX || a->op == TPU_OP_ARGMIN;
    bool iload = idom || (arg && ref_red_is_int((tpu_dtype)in->dtype));
    for (int64_t r = 0; r < g->nred; r++) {
        const void *src = tpu_elem_ptr(in, ref_red_in_offset(g, in, oi, r));
        if (iload)
            vi[r] = tpu_load_i64(src, (tpu_dtype)in->dtype);
        else
            vd[r] = tpu_load_f64(src, (tpu_dtype)in->dtype);
    }
    void *dst = tpu_elem_ptr(o, ooff);
    if (arg)
        tpu_store_i64(dst, (tpu_dtype)o->dtype, iload ? ref_arg_i(a->op, vi, g->nred) : ref_arg_d(a->op, vd, g->nred));
    else if (idom)
        tpu_store_i64(dst, (tpu_dtype)o->dtype, ref_red_fold_i(a->op, vi, g->nred));
    else
        tpu_store_f64(dst, (tpu_dtype)o->dtype, ref_red_fold_d(a->op, vd, g->nred, &a->p));
}

tpu_status tpu_ref_red(tpu_kargs *a) {
    if (tpu_op_family_of(a->op) != TPU_FAM_RED) return tpu_kernel_fail(a, "%s: not a reduction", tpu_op_name(a->op));
    ref_red_geom g = {0};
    tpu_status st = ref_red_geometry(a, &g);
    if (st != TPU_OK) return st;
    if ((a->op == TPU_OP_ARGMAX || a->op == TPU_OP_ARGMIN) && (st = ref_red_check_arg(a, &g)) != TPU_OK) return st;
    if (g.nout == 0) return TPU_OK;
    if (g.nred == 0 && ref_red_needs_data(a->op, &a->p))
        return tpu_kernel_fail(a, "%s(): Expected reduction dim to be specified for input.numel() == 0.",
                               tpu_op_name(a->op));
    bool idom = ref_red_int_domain(a->op, &a->t[1], &a->t[0]);
    size_t cap = (size_t)(g.nred > 0 ? g.nred : 1);
    double *vd = malloc(cap * sizeof *vd);
    int64_t *vi = malloc(cap * sizeof *vi);
    if (!vd || !vi) {
        free(vd);
        free(vi);
        return tpu_kernel_fail(a, "%s: out of host memory", tpu_op_name(a->op));
    }
    for (int64_t lin = 0; lin < g.nout; lin++) ref_red_one(a, &g, idom, lin, vd, vi);
    free(vd);
    free(vi);
    return TPU_OK;
}

/* ---- scans ---- */

/* CUMSUM, CUMPROD, LOGCUMSUMEXP; CUMMAX / CUMMIN also write the index of
 * each running extreme (ties and NaN move it to the later element). */
tpu_status tpu_ref_scan(tpu_kargs *a) {
    bool two = a->op == TPU_OP_CUMMAX || a->op == TPU_OP_CUMMIN;
    const tpu_tensor *o = &a->t[0], *in = &a->t[two ? 2 : 1], *ix = two ? &a->t[1] : NULL;
    if (tpu_op_family_of(a->op) != TPU_FAM_SCAN || a->n != (two ? 3 : 2) || o->ndim != in->ndim || in->is_scalar)
        return tpu_kernel_fail(a, "%s: expected out and input of the same rank", tpu_op_name(a->op));
    int nd = in->ndim;
    int64_t d0 = tpu_unpack_CUMSUM(&a->p).dim; /* every scan: the same column */
    int64_t dim = d0 < 0 ? d0 + nd : d0;
    if (nd == 0)
        dim = 0;
    else if (dim < 0 || dim >= nd)
        return tpu_kernel_fail(a, "%s: dim %lld out of range", tpu_op_name(a->op), (long long)d0);
    for (int d = 0; d < nd; d++)
        if (o->sizes[d] != in->sizes[d] || (ix && ix->sizes[d] != in->sizes[d]))
            return tpu_kernel_fail(a, "%s: output shape differs", tpu_op_name(a->op));
    if (ix && (ix->dtype != TPU_I64 || ix->ndim != nd))
        return tpu_kernel_fail(a, "%s: indices must be int64", tpu_op_name(a->op));
    bool idom = ref_red_is_int((tpu_dtype)in->dtype) && ref_red_is_int((tpu_dtype)o->dtype);
    bool prod = a->op == TPU_OP_CUMPROD, lse = a->op == TPU_OP_LOGCUMSUMEXP, mx = a->op == TPU_OP_CUMMAX;
    int64_t len = nd ? in->sizes[dim] : 1, numel = tpu_tensor_numel(in);
    if (numel == 0) return TPU_OK;
    for (int64_t line = 0; line < numel / len; line++) {
        int64_t rest = line, ioff = 0, ooff = 0, xoff = 0;
        for (int d = nd - 1; d >= 0; d--) {
            if (d == dim) continue;
            int64_t i = rest % in->sizes[d];
            rest /= in->sizes[d];
            ioff += i * in->strides[d];
            ooff += i * o->strides[d];
            if (ix) xoff += i * ix->strides[d];
        }
        double accd = prod ? 1 : lse ? -INFINITY : 0;
        uint64_t acci = prod ? 1 : 0;
        int64_t at = 0;
        for (int64_t k = 0; k < len; k++) {
            const void *src = tpu_elem_ptr(in, ioff + (nd ? k * in->strides[dim] : 0));
            void *dst = tpu_elem_ptr(o, ooff + (nd ? k * o->strides[dim] : 0));
            if (two) {
                double v = tpu_load_f64(src, (tpu_dtype)in->dtype);
                int64_t vi = tpu_load_i64(src, (tpu_dtype)in->dtype);
                bool take = k == 0 || (idom ? (mx ? vi >= (int64_t)acci : vi <= (int64_t)acci)
                                            : (isnan(v) || (!isnan(accd) && (mx ? v >= accd : v <= accd))));
                if (take) {
                    accd = v;
                    acci = (uint64_t)vi;
                    at = k;
                }
                tpu_store_i64(tpu_elem_ptr(ix, xoff + (nd ? k * ix->strides[dim] : 0)), TPU_I64, at);
            } else if (lse) {
                double v = tpu_load_f64(src, (tpu_dtype)in->dtype), lo = fmin(accd, v), hi = fmax(accd, v);
                if (isnan(v) || isnan(accd))
                    accd = NAN;
                else if (lo != hi || isfinite(lo))
                    accd = hi + log1p(exp(lo - hi));
            } else if (idom) {
                uint64_t v = (uint64_t)tpu_load_i64(src, (tpu_dtype)in->dtype);
                acci = prod ? acci * v : acci + v;
            } else {
                double v = tpu_load_f64(src, (tpu_dtype)in->dtype);
                accd = prod ? accd * v : accd + v;
            }
            if (idom)
                tpu_store_i64(dst, (tpu_dtype)o->dtype, (int64_t)acci);
            else
                tpu_store_f64(dst, (tpu_dtype)o->dtype, accd);
        }
    }
    return TPU_OK;
}
