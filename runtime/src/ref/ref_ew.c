/* ref_ew.c - naive reference kernels for the elementwise (EW) op family.
 *
 * The oracle for kernels/elementwise.c: one element at a time, an N-d index
 * loop over the output, every load and store through tpu_load_* /
 * tpu_store_*. Never optimized, never fused. Keep it obviously correct.
 *
 * The math is each op's expression in ops.def, expanded here with the
 * reference vocabulary of base/expr-impl.h: libm in the domain's precision
 * (expf for float, exp for double), so the fast kernel's approximations are
 * checked against correctly rounded functions, and the expression itself is
 * pinned by the golden values of tests/c/test_kernels_ew.c (PyTorch's).
 *
 * Compute domains (same rule as the fast kernel): params.compute_dtype
 * float32/float16/bfloat16 -> float, float64 -> double, integer/bool -> int64
 * for the ops with an integer form in ops.def, else double. FILL, COPY and
 * ARANGE ignore compute_dtype: they convert straight to the output dtype. */
#include "ref/ref-impl.h"
#include "base/expr-impl.h"
#include <math.h>
#include <stdbool.h>
#include <string.h>

typedef enum ref_dom { REF_DOM_F, REF_DOM_D, REF_DOM_I } ref_dom;

enum { REF_ERR_FLOAT_BITWISE = 100 };

/* ---- one element of op, in each domain, from its ops.def expression ---- */

#define TPU_EXPR_BODY(e)    return (T)(e);
#define TPU_EXPR_PARAM_I(s) ((T)p->i[s])

static float ref_expr_f(tpu_op op, const tpu_params *p, float x, float y, float z) {
    typedef float T;
    int expr_err = 0;
    (void)expr_err;
    switch (op) {
#define TPU_EXPR_FORM       TPU_EXPR_F
#define TPU_EXPR_PARAM_F(s) ((T)p->f[s])
#include "base/expr-cases.h"
    default: break;
    }
    return NAN;
}

static double ref_expr_d(tpu_op op, const tpu_params *p, double x, double y, double z) {
    typedef double T;
    int expr_err = 0;
    (void)expr_err;
    switch (op) {
#include "base/expr-cases.h"
#undef TPU_EXPR_FORM
#undef TPU_EXPR_PARAM_F
    default: break;
    }
    return NAN;
}

#undef TPU_EXPR_BODY
#define TPU_EXPR_BODY(e) \
    {                    \
        T r_ = (e);      \
        *err = expr_err; \
        return r_;       \
    }
static int64_t ref_expr_i(tpu_op op, const tpu_params *p, bool cbool, int64_t x, int64_t y, int64_t z, int *err) {
    typedef int64_t T;
    int expr_err = 0;
    switch (op) {
#define TPU_EXPR_FORM       TPU_EXPR_I
#define TPU_EXPR_PARAM_F(s) tpu_d2i(p->f[s])
#include "base/expr-cases.h"
#undef TPU_EXPR_FORM
#undef TPU_EXPR_PARAM_F
    default: break;
    }
    (void)cbool;
    return 0;
}
#undef TPU_EXPR_BODY
#undef TPU_EXPR_PARAM_I

/* ---- element access ---- */

/* Element offset of the output's linear index `lin` in operand t (row-major
 * over the output sizes `sz`; broadcast dims carry stride 0). */
static int64_t ref_offset(const tpu_tensor *t, const int64_t *sz, int nd, int64_t lin) {
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t i = lin % sz[d];
        lin /= sz[d];
        off += i * t->strides[d];
    }
    return off;
}

/* An input of another rank can only be a one-element tensor: its element 0. */
static const void *ref_in_ptr(const tpu_tensor *t, const int64_t *sz, int nd, int64_t lin) {
    return tpu_elem_ptr(t, t->ndim == nd ? ref_offset(t, sz, nd, lin) : 0);
}

static double ref_load_d(const tpu_tensor *t, const int64_t *sz, int nd, int64_t lin) {
    if (t->is_scalar) return t->f;
    return tpu_load_f64(ref_in_ptr(t, sz, nd, lin), (tpu_dtype)t->dtype);
}

/* Integer dtypes convert to float directly (one rounding, like C++). */
static float ref_load_f(const tpu_tensor *t, const int64_t *sz, int nd, int64_t lin) {
    if (t->is_scalar) return (float)t->f;
    const void *p = ref_in_ptr(t, sz, nd, lin);
    if (tpu_dtype_is_float((tpu_dtype)t->dtype)) return (float)tpu_load_f64(p, (tpu_dtype)t->dtype);
    return (float)tpu_load_i64(p, (tpu_dtype)t->dtype);
}

static int64_t ref_load_i(const tpu_tensor *t, const int64_t *sz, int nd, int64_t lin) {
    if (t->is_scalar) return t->i;
    return tpu_load_i64(ref_in_ptr(t, sz, nd, lin), (tpu_dtype)t->dtype);
}

/* ---- the three ops that ignore compute_dtype ---- */

static void ref_fill(tpu_kargs *a, int64_t n) {
    const tpu_tensor *o = &a->t[0], *s = &a->t[1];
    bool of = tpu_dtype_is_float((tpu_dtype)o->dtype);
    double vf = s->is_scalar ? s->f : tpu_load_f64(tpu_elem_ptr(s, 0), (tpu_dtype)s->dtype);
    int64_t vi = s->is_scalar ? s->i : tpu_load_i64(tpu_elem_ptr(s, 0), (tpu_dtype)s->dtype);
    for (int64_t k = 0; k < n; k++) {
        void *dst = tpu_elem_ptr(o, ref_offset(o, o->sizes, o->ndim, k));
        if (of)
            tpu_store_f64(dst, (tpu_dtype)o->dtype, vf);
        else
            tpu_store_i64(dst, (tpu_dtype)o->dtype, vi);
    }
}

static void ref_copy(tpu_kargs *a, int64_t n) {
    const tpu_tensor *o = &a->t[0], *s = &a->t[1];
    bool sf = tpu_dtype_is_float((tpu_dtype)s->dtype);
    for (int64_t k = 0; k < n; k++) {
        void *dst = tpu_elem_ptr(o, ref_offset(o, o->sizes, o->ndim, k));
        if (s->is_scalar) {
            if (sf)
                tpu_store_f64(dst, (tpu_dtype)o->dtype, s->f);
            else
                tpu_store_i64(dst, (tpu_dtype)o->dtype, s->i);
            continue;
        }
        const void *src = ref_in_ptr(s, o->sizes, o->ndim, k);
        if (sf)
            tpu_store_f64(dst, (tpu_dtype)o->dtype, tpu_load_f64(src, (tpu_dtype)s->dtype));
        else
            tpu_store_i64(dst, (tpu_dtype)o->dtype, tpu_load_i64(src, (tpu_dtype)s->dtype));
    }
}

static void ref_arange(tpu_kargs *a, int64_t n) {
    const tpu_tensor *o = &a->t[0];
    for (int64_t k = 0; k < n; k++) {
        void *dst = tpu_elem_ptr(o, ref_offset(o, o->sizes, o->ndim, k));
        tpu_store_f64(dst, (tpu_dtype)o->dtype, a->p.f[0] + (double)k * a->p.f[1]);
    }
}

/* ---- one element in each domain ---- */

typedef struct ref_ctx {
    tpu_op op;
    const tpu_params *p;
    bool cbool; /* compute dtype is bool */
    int err;
} ref_ctx;

static void ref_elem_f(ref_ctx *c, tpu_kargs *a, int nin, int64_t k) {
    const tpu_tensor *o = &a->t[0];
    float v[3] = {0, 0, 0};
    for (int j = 0; j < nin; j++) v[j] = ref_load_f(&a->t[1 + j], o->sizes, o->ndim, k);
    float r = ref_expr_f(c->op, c->p, v[0], v[1], v[2]);
    tpu_store_f64(tpu_elem_ptr(o, ref_offset(o, o->sizes, o->ndim, k)), (tpu_dtype)o->dtype, r);
}

static void ref_elem_d(ref_ctx *c, tpu_kargs *a, int nin, int64_t k) {
    const tpu_tensor *o = &a->t[0];
    double v[3] = {0, 0, 0};
    for (int j = 0; j < nin; j++) v[j] = ref_load_d(&a->t[1 + j], o->sizes, o->ndim, k);
    double r = ref_expr_d(c->op, c->p, v[0], v[1], v[2]);
    tpu_store_f64(tpu_elem_ptr(o, ref_offset(o, o->sizes, o->ndim, k)), (tpu_dtype)o->dtype, r);
}

static void ref_elem_i(ref_ctx *c, tpu_kargs *a, int nin, int64_t k) {
    const tpu_tensor *o = &a->t[0];
    int64_t v[3] = {0, 0, 0};
    for (int j = 0; j < nin; j++) v[j] = ref_load_i(&a->t[1 + j], o->sizes, o->ndim, k);
    int64_t r = ref_expr_i(c->op, c->p, c->cbool, v[0], v[1], v[2], &c->err);
    if (c->err) return;
    tpu_store_i64(tpu_elem_ptr(o, ref_offset(o, o->sizes, o->ndim, k)), (tpu_dtype)o->dtype, r);
}

static tpu_status ref_ew_error(tpu_kargs *a, int err) {
    if (err == TPU_EXPR_ERR_ZERODIV) return tpu_kernel_fail(a, "ZeroDivisionError");
    tpu_kernel_fail(a, "%s: not supported for floating point compute dtype", tpu_op_name(a->op));
    return TPU_ERROR_NOT_SUPPORTED;
}

tpu_status tpu_ref_ew(tpu_kargs *a) {
    if (tpu_op_family_of(a->op) != TPU_FAM_EW || a->n < 1)
        return tpu_kernel_fail(a, "%s: not an elementwise launch", tpu_op_name(a->op));
    int nin = a->n - 1;
    int64_t n = tpu_tensor_numel(&a->t[0]);
    switch (a->op) {
    case TPU_OP_FILL: ref_fill(a, n); return TPU_OK;
    case TPU_OP_COPY: ref_copy(a, n); return TPU_OK;
    case TPU_OP_ARANGE: ref_arange(a, n); return TPU_OK;
    default: break;
    }
    if (nin < 1 || nin > 3) return tpu_kernel_fail(a, "%s: %d inputs", tpu_op_name(a->op), nin);
    tpu_dtype cdt = (tpu_dtype)a->p.compute_dtype;
    if ((unsigned)cdt >= TPU_DTYPE_REAL_COUNT)
        return tpu_kernel_fail(a, "%s: bad compute dtype %d", tpu_op_name(a->op), (int)cdt);
    const tpu_op_info *info = &tpu_op_infos[a->op];
    if (info->cls < TPU_CLASS_UNARY || info->cls > TPU_CLASS_TERNARY || nin != info->nin_min)
        return tpu_kernel_fail(a, "%s: %d inputs", tpu_op_name(a->op), nin);
    ref_dom dom = cdt == TPU_F64            ? REF_DOM_D
                  : tpu_dtype_is_float(cdt) ? REF_DOM_F
                  : info->int_form          ? REF_DOM_I
                                            : REF_DOM_D;
    if (dom != REF_DOM_I && !(info->dtypes & DT_FLOAT)) return ref_ew_error(a, REF_ERR_FLOAT_BITWISE);
    ref_ctx c = {a->op, &a->p, cdt == TPU_BOOL, TPU_EXPR_OK};
    for (int64_t k = 0; k < n && !c.err; k++) {
        if (dom == REF_DOM_F)
            ref_elem_f(&c, a, nin, k);
        else if (dom == REF_DOM_D)
            ref_elem_d(&c, a, nin, k);
        else
            ref_elem_i(&c, a, nin, k);
    }
    return c.err ? ref_ew_error(a, c.err) : TPU_OK;
}
