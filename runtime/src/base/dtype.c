/* dtype.c - op and dtype tables generated from ops.def, the dtype rule
 * check, element load/store, descriptor helpers. */
#include "base/base-impl.h"
#include "base/expr-impl.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const op_names[] = {
#define TPU_OP(e, name, fam, nout, nmin, nmax, ...) name,
#include "tpu/ops.def"
#undef TPU_OP
};
static const tpu_op_family op_fams[] = {
#define TPU_OP(e, name, fam, nout, nmin, nmax, ...) TPU_FAM_##fam,
#include "tpu/ops.def"
#undef TPU_OP
};
_Static_assert(sizeof(op_names) / sizeof(op_names[0]) == TPU_OP_COUNT, "op name table");

const tpu_op_info tpu_op_infos[TPU_OP_COUNT] = {
#define EXPR(f, i)                                                      TPU_EXPR_HAS_I(f, i)
#define NOEXPR                                                          0
#define TPU_OP(e, name, fam, nout, nmin, nmax, dtypes, cls, params, ex) {nout, nmin, nmax, dtypes, TPU_CLASS_##cls, ex},
#include "tpu/ops.def"
#undef TPU_OP
#undef EXPR
#undef NOEXPR
};

/* ops.def's columns agree with each other: an elementwise class has the
 * family and the arity it names; parameter slots exist and are distinct. */
#define P(...)              __VA_ARGS__
#define PF(slot, name, ...) (F, slot, name)
#define PI(slot, name, ...) (I, slot, name)
#define OPP_SHIFT_F         0
#define OPP_SHIFT_I         8
#define TPU_PSEQ_M(k, s, n) | (1u << ((s) + OPP_SHIFT_##k))
#define TPU_OP(e, name, fam, nout, nmin, nmax, dtypes, cls, params, ...)                                               \
    _Static_assert(TPU_CLASS_##cls > TPU_CLASS_TERNARY || (TPU_FAM_##fam == TPU_FAM_EW && nout == 1 && nmin == nmax && \
                                                           (TPU_CLASS_##cls != TPU_CLASS_UNARY || nmin == 1) &&        \
                                                           (TPU_CLASS_##cls != TPU_CLASS_BINARY || nmin == 2) &&       \
                                                           (TPU_CLASS_##cls != TPU_CLASS_TERNARY || nmin == 3)),       \
                   #e ": class, family and arity");                                                                    \
    _Static_assert((0u TPU_PSEQ(params)) < (1u << 14) && ((0u TPU_PSEQ(params)) & 0xc0u) == 0,                         \
                   #e ": parameter slots are 0..5");                                                                   \
    enum { OPP_##e = 0 TPU_PSEQ(params) };
#include "tpu/ops.def"
#undef TPU_OP
#undef TPU_PSEQ_M
#define TPU_PSEQ_M(k, s, n) +1
#define TPU_OP(e, name, fam, nout, nmin, nmax, dtypes, cls, params, ...) \
    _Static_assert(__builtin_popcount(OPP_##e) == 0 TPU_PSEQ(params), #e ": two parameters in one slot");
#include "tpu/ops.def"
#undef TPU_OP
#undef TPU_PSEQ_M
#undef P
#undef PF
#undef PI
#undef OPP_SHIFT_F
#undef OPP_SHIFT_I

tpu_op_class tpu_op_class_of(tpu_op op) {
    return (unsigned)op < TPU_OP_COUNT ? tpu_op_infos[op].cls : TPU_CLASS_OPAQUE;
}

const char *tpu_op_name(tpu_op op) { return (unsigned)op < TPU_OP_COUNT ? op_names[op] : "?"; }
tpu_op_family tpu_op_family_of(tpu_op op) { return (unsigned)op < TPU_OP_COUNT ? op_fams[op] : TPU_FAM_COUNT; }

static const size_t dt_size[TPU_DTYPE_COUNT] = {4, 8, 2, 2, 1, 1, 2, 4, 8, 1, 8, 16};
static const char *const dt_name[TPU_DTYPE_COUNT] = {"float32", "float64", "float16",   "bfloat16",
                                                     "uint8",   "int8",    "int16",     "int32",
                                                     "int64",   "bool",    "complex64", "complex128"};
_Static_assert(TPU_DTYPE_COUNT == 12, "dtype tables");

/* PyTorch's names (c10::toString), for messages users search for. */
static const char *const dt_torch_name[TPU_DTYPE_COUNT] = {"Float", "Double", "Half",         "BFloat16",
                                                           "Byte",  "Char",   "Short",        "Int",
                                                           "Long",  "Bool",   "ComplexFloat", "ComplexDouble"};

static tpu_status dtype_refused(tpu_op op, tpu_dtype dt) {
    return tpu_set_error(TPU_ERROR_NOT_SUPPORTED, "\"%s\" not implemented for '%s'", tpu_op_name(op),
                         dt_torch_name[dt]);
}

tpu_status tpu_op_check_dtypes(tpu_op op, const tpu_tensor *t, int n, const tpu_params *p) {
    unsigned rule = tpu_op_infos[op].dtypes;
    int nout = tpu_op_infos[op].nout;
    int32_t dt = t[0].dtype;
    if (!(rule & DT_OUT) && op_fams[op] == TPU_FAM_EW) {
        dt = p->compute_dtype;
    } else if (!(rule & DT_OUT)) { /* the first tensor input (an absent optional one is a host scalar) */
        int k = nout;
        while (k < n && t[k].is_scalar) k++;
        if (k == n) return TPU_OK;
        dt = t[k].dtype;
    }
    if ((unsigned)dt >= TPU_DTYPE_COUNT)
        return tpu_set_error(TPU_ERROR_INVALID_VALUE, "%s: unknown dtype %d", tpu_op_name(op), (int)dt);
    if (op_fams[op] != TPU_FAM_FFT) /* complex operands go to the FFT family only (real views elsewhere) */
        for (int k = 0; k < n; k++)
            if (!t[k].is_scalar && (unsigned)t[k].dtype < TPU_DTYPE_COUNT &&
                tpu_dtype_is_complex((tpu_dtype)t[k].dtype))
                return dtype_refused(op, (tpu_dtype)t[k].dtype);
    if (!(rule & (1u << dt))) return dtype_refused(op, (tpu_dtype)dt);
    if (rule & DT_IN_FLOAT)
        for (int k = nout; k < n; k++)
            if (!t[k].is_scalar && !tpu_dtype_is_float((tpu_dtype)t[k].dtype))
                return dtype_refused(op, (tpu_dtype)t[k].dtype);
    return TPU_OK;
}

size_t tpu_dtype_size(tpu_dtype dt) { return (unsigned)dt < TPU_DTYPE_COUNT ? dt_size[dt] : 0; }
const char *tpu_dtype_name(tpu_dtype dt) { return (unsigned)dt < TPU_DTYPE_COUNT ? dt_name[dt] : "?"; }
bool tpu_dtype_is_float(tpu_dtype dt) { return dt <= TPU_BF16; }
bool tpu_dtype_is_complex(tpu_dtype dt) { return dt == TPU_C64 || dt == TPU_C128; }

double tpu_load_f64(const void *p, tpu_dtype dt) {
    switch (dt) {
    case TPU_F32: return *(const float *)p;
    case TPU_F64: return *(const double *)p;
    case TPU_F16: return tpu_f16_to_f32(*(const uint16_t *)p);
    case TPU_BF16: return tpu_bf16_to_f32(*(const uint16_t *)p);
    case TPU_U8: return *(const uint8_t *)p;
    case TPU_I8: return *(const int8_t *)p;
    case TPU_I16: return *(const int16_t *)p;
    case TPU_I32: return *(const int32_t *)p;
    case TPU_I64: return (double)*(const int64_t *)p;
    case TPU_BOOL: return *(const uint8_t *)p != 0;
    default: return 0;
    }
}

int64_t tpu_load_i64(const void *p, tpu_dtype dt) {
    switch (dt) {
    case TPU_F32: return (int64_t)*(const float *)p;
    case TPU_F64: return (int64_t)*(const double *)p;
    case TPU_F16: return (int64_t)tpu_f16_to_f32(*(const uint16_t *)p);
    case TPU_BF16: return (int64_t)tpu_bf16_to_f32(*(const uint16_t *)p);
    case TPU_U8: return *(const uint8_t *)p;
    case TPU_I8: return *(const int8_t *)p;
    case TPU_I16: return *(const int16_t *)p;
    case TPU_I32: return *(const int32_t *)p;
    case TPU_I64: return *(const int64_t *)p;
    case TPU_BOOL: return *(const uint8_t *)p != 0;
    default: return 0;
    }
}

void tpu_store_f64(void *p, tpu_dtype dt, double v) {
    switch (dt) {
    case TPU_F32: *(float *)p = (float)v; break;
    case TPU_F64: *(double *)p = v; break;
    case TPU_F16: *(uint16_t *)p = tpu_f32_to_f16((float)v); break;
    case TPU_BF16: *(uint16_t *)p = tpu_f32_to_bf16((float)v); break;
    case TPU_U8: *(uint8_t *)p = (uint8_t)(int64_t)v; break;
    case TPU_I8: *(int8_t *)p = (int8_t)(int64_t)v; break;
    case TPU_I16: *(int16_t *)p = (int16_t)(int64_t)v; break;
    case TPU_I32: *(int32_t *)p = (int32_t)(int64_t)v; break;
    case TPU_I64: *(int64_t *)p = (int64_t)v; break;
    case TPU_BOOL: *(uint8_t *)p = v != 0; break;
    default: break;
    }
}

void tpu_store_i64(void *p, tpu_dtype dt, int64_t v) {
    switch (dt) {
    case TPU_F32: *(float *)p = (float)v; break;
    case TPU_F64: *(double *)p = (double)v; break;
    case TPU_F16: *(uint16_t *)p = tpu_f32_to_f16((float)v); break;
    case TPU_BF16: *(uint16_t *)p = tpu_f32_to_bf16((float)v); break;
    case TPU_U8: *(uint8_t *)p = (uint8_t)v; break;
    case TPU_I8: *(int8_t *)p = (int8_t)v; break;
    case TPU_I16: *(int16_t *)p = (int16_t)v; break;
    case TPU_I32: *(int32_t *)p = (int32_t)v; break;
    case TPU_I64: *(int64_t *)p = v; break;
    case TPU_BOOL: *(uint8_t *)p = v != 0; break;
    default: break;
    }
}

tpu_status tpu_kernel_fail(tpu_kargs *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->err, sizeof a->err, fmt, ap);
    va_end(ap);
    return TPU_ERROR_KERNEL;
}

void tpu_tensor_contiguous(tpu_tensor *t, void *base, tpu_dtype dt, int ndim, const int64_t *sizes) {
    memset(t, 0, sizeof *t);
    t->base = base;
    t->dtype = dt;
    t->ndim = ndim;
    int64_t st = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t->sizes[d] = sizes[d];
        t->strides[d] = st;
        st *= sizes[d] > 1 ? sizes[d] : 1;
    }
    t->nbytes = (size_t)tpu_tensor_numel(t) * tpu_dtype_size(dt);
}

tpu_tensor tpu_tensor_scalar_f(double v, tpu_dtype dt) {
    tpu_tensor t;
    memset(&t, 0, sizeof t);
    t.is_scalar = 1;
    t.dtype = dt;
    t.f = v;
    t.i = (int64_t)v;
    return t;
}

tpu_tensor tpu_tensor_scalar_i(int64_t v, tpu_dtype dt) {
    tpu_tensor t;
    memset(&t, 0, sizeof t);
    t.is_scalar = 1;
    t.dtype = dt;
    t.i = v;
    t.f = (double)v;
    return t;
}

int64_t tpu_tensor_numel(const tpu_tensor *t) {
    if (t->is_scalar) return 1;
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
    return n;
}

tpu_status tpu_run_by_family(const tpu_kernel_fn *by_family, tpu_kargs *a) {
    tpu_op_family f = tpu_op_family_of(a->op);
    if ((unsigned)f >= TPU_FAM_COUNT) return tpu_kernel_fail(a, "%s: unknown op family", tpu_op_name(a->op));
    return by_family[f](a);
}
