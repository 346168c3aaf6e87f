/* ref_ew.c - naive reference kernels for the elementwise (EW) op family.
 *
 * The oracle for kernels/elementwise.c: one element at a time, an N-d index
 * loop over the output, every load and store through tpu_load_* /
 * tpu_store_*. Never optimized, never fused. Keep it obviously correct.
 *
 * Compute domains (same rule as the fast kernel): params.compute_dtype
 * float32/float16/bfloat16 -> float, float64 -> double, integer/bool -> int64
 * for the ops that have integer semantics (ref_ew_int_capable), else double.
 * FILL, COPY and ARANGE ignore compute_dtype: they convert straight to the
 * output dtype. Float math uses libm in the domain's precision (expf for
 * float, exp for double), so the fast kernel's approximations are checked
 * against correctly rounded functions. */
#include "ref/ref-impl.h"
#include <math.h>
#include <stdbool.h>
#include <string.h>

#define REF_SQRT1_2 0.70710678118654752440   /* GELU: 1/sqrt(2) */
#define REF_KBETA 0.79788456080286535588     /* GELU tanh form: sqrt(2/pi) */
#define REF_KPDF 0.39894228040143267794      /* 1/sqrt(2*pi) */

typedef enum ref_dom { REF_DOM_F, REF_DOM_D, REF_DOM_I } ref_dom;

enum { REF_OK = 0, REF_ERR_ZERODIV, REF_ERR_NEGPOW, REF_ERR_FLOAT_BITWISE };

typedef struct ref_ctx {
    tpu_op op;
    const tpu_params *p;
    bool exp_scalar;    /* POW: exponent operand is a host scalar */
    bool cbool;         /* compute dtype is bool */
    int err;
} ref_ctx;

static bool ref_ew_int_capable(tpu_op op, const tpu_params *p) {
    switch (op) {
    case TPU_OP_NEG: case TPU_OP_ABS: case TPU_OP_SIGN: case TPU_OP_RELU: case TPU_OP_CLAMP:
    case TPU_OP_FLOOR: case TPU_OP_CEIL: case TPU_OP_ROUND: case TPU_OP_TRUNC: case TPU_OP_FRAC:
    case TPU_OP_LOGICAL_NOT: case TPU_OP_BITWISE_NOT: case TPU_OP_ISNAN: case TPU_OP_ISINF:
    case TPU_OP_NAN_TO_NUM: case TPU_OP_ADD: case TPU_OP_SUB: case TPU_OP_MUL: case TPU_OP_POW:
    case TPU_OP_MAXIMUM: case TPU_OP_MINIMUM: case TPU_OP_FMOD: case TPU_OP_REMAINDER:
    case TPU_OP_EQ: case TPU_OP_NE: case TPU_OP_LT: case TPU_OP_LE: case TPU_OP_GT: case TPU_OP_GE:
    case TPU_OP_LOGICAL_AND: case TPU_OP_LOGICAL_OR: case TPU_OP_LOGICAL_XOR:
    case TPU_OP_BITWISE_AND: case TPU_OP_BITWISE_OR: case TPU_OP_BITWISE_XOR:
    case TPU_OP_THRESHOLD_BWD: case TPU_OP_HARDTANH_BWD: case TPU_OP_WHERE: case TPU_OP_ADDCMUL:
    case TPU_OP_CLAMP_T:
        return true;
    case TPU_OP_DIV:
        return p->i[0] != 0;
    default:
        return false;
    }
}

static bool ref_ew_is_bitwise(tpu_op op) {
    return op == TPU_OP_BITWISE_NOT || op == TPU_OP_BITWISE_AND || op == TPU_OP_BITWISE_OR ||
           op == TPU_OP_BITWISE_XOR;
}

/* double -> int64 for parameters: NaN -> 0, saturating (never UB). */
static int64_t ref_d2i(double v) {
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}

/* ---- float / double domain: one body, instantiated for both types ---- */

/* NaN-propagating max / min, as torch.maximum / torch.minimum. */
#define REF_MAXN(a, b) (((a) != (a)) ? (a) : ((b) != (b)) ? (b) : ((a) > (b) ? (a) : (b)))
#define REF_MINN(a, b) (((a) != (a)) ? (a) : ((b) != (b)) ? (b) : ((a) < (b) ? (a) : (b)))

/* PyTorch's div_floor_floating. */
#define REF_DIV_FLOOR_BODY(T, FMOD, FLOOR, COPYSIGN) {                   \
    if (b == 0) return a / b;                                            \
    T mod = FMOD(a, b);                                                  \
    T div = (a - mod) / b;                                               \
    if (mod != 0 && (b < 0) != (mod < 0)) div -= (T)1;                   \
    if (div == 0) return COPYSIGN((T)0, a / b);                          \
    T fl = FLOOR(div);                                                   \
    if (div - fl > (T)0.5) fl += (T)1;                                   \
    return fl;                                                           \
}
static float ref_divfloor_f(float a, float b) REF_DIV_FLOOR_BODY(float, fmodf, floorf, copysignf)
static double ref_divfloor_d(double a, double b) REF_DIV_FLOOR_BODY(double, fmod, floor, copysign)

#define REF_REMAINDER_BODY(T, FMOD) {                                    \
    T m = FMOD(a, b);                                                    \
    if (m != 0 && ((b < 0) != (m < 0))) m += b;                          \
    return m;                                                            \
}
static float ref_rem_f(float a, float b) REF_REMAINDER_BODY(float, fmodf)
static double ref_rem_d(double a, double b) REF_REMAINDER_BODY(double, fmod)

/* PyTorch's pow(tensor, scalar) fast cases, then plain pow. */
#define REF_POW_BODY(T, POW, SQRT) {                                     \
    if (scalar_exp) {                                                    \
        if (b == (T)0.5) return SQRT(a);                                 \
        if (b == (T)-0.5) return (T)1 / SQRT(a);                         \
        if (b == (T)-1) return (T)1 / a;                                 \
        if (b == (T)2) return a * a;                                     \
        if (b == (T)3) return a * a * a;                                 \
        if (b == (T)-2) return (T)1 / (a * a);                           \
    }                                                                    \
    return POW(a, b);                                                    \
}
static float ref_pow_f(float a, float b, bool scalar_exp) REF_POW_BODY(float, powf, sqrtf)
static double ref_pow_d(double a, double b, bool scalar_exp) REF_POW_BODY(double, pow, sqrt)

/* The float-domain op table. M(name) picks the libm function of the type
 * (expf / exp), K(v) makes a constant of the type. */
#define REF_FLOAT_OPS(T, M, K, SFX)                                                          \
static T ref_gelu_##SFX(T x, int64_t approx) {                                               \
    if (approx) {                                                                            \
        T inner = K(REF_KBETA) * (x + K(0.044715) * (x * x * x));           \
        return K(0.5) * x * (K(1) + M(tanh)(inner));                                         \
    }                                                                                        \
    return x * K(0.5) * (K(1) + M(erf)(x * K(REF_SQRT1_2)));                                   \
}                                                                                            \
static T ref_gelu_bwd_##SFX(T dy, T x, int64_t approx) {                                     \
    if (approx) {                                                                            \
        T kb = K(REF_KBETA), kk = K(0.044715);                              \
        T inner = kb * (x + kk * (x * x * x));                                               \
        T t = M(tanh)(inner);                                                                \
        T left = K(0.5) * x, right = K(1) + t;                                               \
        T dleft = K(0.5) * right;                                                            \
        T dright = left * (K(1) - t * t) * (kb * (K(1) + K(3) * kk * x * x));                \
        return dy * (dleft + dright);                                                        \
    }                                                                                        \
    T cdf = K(0.5) * (K(1) + M(erf)(x * K(REF_SQRT1_2)));                                      \
    T pdf = K(REF_KPDF) * M(exp)(K(-0.5) * x * x);                       \
    return dy * (cdf + x * pdf);                                                             \
}                                                                                            \
static T ref_clamp_##SFX(T x, const tpu_params *p) {                                         \
    T r = x;                                                                                 \
    if (p->i[0]) r = REF_MAXN(r, (T)p->f[0]);                                                \
    if (p->i[1]) r = REF_MINN(r, (T)p->f[1]);                                                \
    return r;                                                                                \
}                                                                                            \
static T ref_unary_##SFX(ref_ctx *c, T x) {                                                  \
    const tpu_params *p = c->p;                                                              \
    T f0 = (T)p->f[0], f1 = (T)p->f[1], f2 = (T)p->f[2];                                     \
    switch (c->op) {                                                                         \
    case TPU_OP_NEG: return -x;                                                              \
    case TPU_OP_ABS: return M(fabs)(x);                                                      \
    case TPU_OP_SIGN: return (T)((x > 0) - (x < 0));                                         \
    case TPU_OP_EXP: return M(exp)(x);                                                       \
    case TPU_OP_EXP2: return M(exp2)(x);                                                     \
    case TPU_OP_EXPM1: return M(expm1)(x);                                                   \
    case TPU_OP_LOG: return M(log)(x);                                                       \
    case TPU_OP_LOG2: return M(log2)(x);                                                     \
    case TPU_OP_LOG10: return M(log10)(x);                                                   \
    case TPU_OP_LOG1P: return M(log1p)(x);                                                   \
    case TPU_OP_SQRT: return M(sqrt)(x);                                                     \
    case TPU_OP_RSQRT: return K(1) / M(sqrt)(x);                                             \
    case TPU_OP_RECIPROCAL: return K(1) / x;                                                 \
    case TPU_OP_SIN: return M(sin)(x);                                                       \
    case TPU_OP_COS: return M(cos)(x);                                                       \
    case TPU_OP_TAN: return M(tan)(x);                                                       \
    case TPU_OP_ASIN: return M(asin)(x);                                                     \
    case TPU_OP_ACOS: return M(acos)(x);                                                     \
    case TPU_OP_ATAN: return M(atan)(x);                                                     \
    case TPU_OP_SINH: return M(sinh)(x);                                                     \
    case TPU_OP_COSH: return M(cosh)(x);                                                     \
    case TPU_OP_TANH: return M(tanh)(x);                                                     \
    case TPU_OP_ASINH: return M(asinh)(x);                                                   \
    case TPU_OP_ACOSH: return M(acosh)(x);                                                   \
    case TPU_OP_ATANH: return M(atanh)(x);                                                   \
    case TPU_OP_ERF: return M(erf)(x);                                                       \
    case TPU_OP_ERFC: return M(erfc)(x);                                                     \
    case TPU_OP_SIGMOID: return K(1) / (K(1) + M(exp)(-x));                                  \
    case TPU_OP_RELU: return x < 0 ? K(0) : x;                                               \
    case TPU_OP_GELU: return ref_gelu_##SFX(x, p->i[0]);                                     \
    case TPU_OP_SILU: return x / (K(1) + M(exp)(-x));                                        \
    case TPU_OP_MISH: return x * M(tanh)(M(log1p)(M(exp)(x)));                               \
    case TPU_OP_SOFTPLUS:                                                                    \
        return x * f0 > f1 ? x : M(log1p)(M(exp)(x * f0)) / f0;                              \
    case TPU_OP_ELU:                                                                         \
        return x > 0 ? x * f1 : M(expm1)(x * f2) * (T)(p->f[0] * p->f[1]);                   \
    case TPU_OP_LEAKY_RELU: return x > 0 ? x : x * f0;                                       \
    case TPU_OP_HARDSIGMOID: return REF_MINN(REF_MAXN(x + K(3), K(0)), K(6)) / K(6);         \
    case TPU_OP_HARDSWISH: return x * REF_MINN(REF_MAXN(x + K(3), K(0)), K(6)) / K(6);       \
    case TPU_OP_CLAMP: return ref_clamp_##SFX(x, p);                                         \
    case TPU_OP_FLOOR: return M(floor)(x);                                                   \
    case TPU_OP_CEIL: return M(ceil)(x);                                                     \
    case TPU_OP_ROUND: return M(nearbyint)(x);                                               \
    case TPU_OP_TRUNC: return M(trunc)(x);                                                   \
    case TPU_OP_FRAC: return x - M(trunc)(x);                                                \
    case TPU_OP_LOGICAL_NOT: return (T)(x == 0);                                             \
    case TPU_OP_ISNAN: return (T)(x != x);                                                   \
    case TPU_OP_ISINF: return (T)(M(fabs)(x) == (T)INFINITY);                                \
    case TPU_OP_NAN_TO_NUM:                                                                  \
        return x != x ? f0 : x == (T)INFINITY ? f1 : x == -(T)INFINITY ? f2 : x;             \
    default: return (T)NAN;                                                                  \
    }                                                                                        \
}                                                                                            \
static T ref_div_##SFX(const tpu_params *p, T a, T b) {                                      \
    if (p->i[0] == 1) return M(trunc)(a / b);                                                \
    if (p->i[0] == 2) return ref_divfloor_##SFX(a, b);                                       \
    return a / b;                                                                            \
}                                                                                            \
static T ref_binary_##SFX(ref_ctx *c, T a, T b) {                                            \
    const tpu_params *p = c->p;                                                              \
    T f0 = (T)p->f[0], f1 = (T)p->f[1];                                                      \
    switch (c->op) {                                                                         \
    case TPU_OP_ADD: return a + f0 * b;                                                      \
    case TPU_OP_SUB: return a - f0 * b;                                                      \
    case TPU_OP_MUL: return a * b;                                                           \
    case TPU_OP_DIV: return ref_div_##SFX(p, a, b);                                          \
    case TPU_OP_POW: return ref_pow_##SFX(a, b, c->exp_scalar);                              \
    case TPU_OP_MAXIMUM: return REF_MAXN(a, b);                                              \
    case TPU_OP_MINIMUM: return REF_MINN(a, b);                                              \
    case TPU_OP_FMOD: return M(fmod)(a, b);                                                  \
    case TPU_OP_REMAINDER: return ref_rem_##SFX(a, b);                                       \
    case TPU_OP_ATAN2: return M(atan2)(a, b);                                                \
    case TPU_OP_EQ: return (T)(a == b);                                                      \
    case TPU_OP_NE: return (T)(a != b);                                                      \
    case TPU_OP_LT: return (T)(a < b);                                                       \
    case TPU_OP_LE: return (T)(a <= b);                                                      \
    case TPU_OP_GT: return (T)(a > b);                                                       \
    case TPU_OP_GE: return (T)(a >= b);                                                      \
    case TPU_OP_LOGICAL_AND: return (T)(a != 0 && b != 0);                                   \
    case TPU_OP_LOGICAL_OR: return (T)(a != 0 || b != 0);                                    \
    case TPU_OP_LOGICAL_XOR: return (T)((a != 0) != (b != 0));                               \
    case TPU_OP_THRESHOLD_BWD: return b <= f0 ? K(0) : a;                                    \
    case TPU_OP_GELU_BWD: return ref_gelu_bwd_##SFX(a, b, p->i[0]);                          \
    case TPU_OP_SILU_BWD: {                                                                  \
        T s = K(1) / (K(1) + M(exp)(-b));                                                    \
        return a * s * (K(1) + b * (K(1) - s));                                              \
    }                                                                                        \
    case TPU_OP_SIGMOID_BWD: return a * (K(1) - b) * b;                                      \
    case TPU_OP_TANH_BWD: return a * (K(1) - b * b);                                         \
    case TPU_OP_LEAKY_RELU_BWD: return b > 0 ? a : a * f0;                                   \
    case TPU_OP_HARDTANH_BWD: return (b <= f0 || b >= f1) ? K(0) : a;                        \
    case TPU_OP_SOFTPLUS_BWD: {                                                              \
        T z = M(exp)(b * f0);                                                                \
        return b * f0 > f1 ? a : a * z / (z + K(1));                                         \
    }                                                                                        \
    default: return (T)NAN;                                                                  \
    }                                                                                        \
}                                                                                            \
static T ref_ternary_##SFX(ref_ctx *c, T a, T b, T d) {                                      \
    T f0 = (T)c->p->f[0];                                                                    \
    switch (c->op) {                                                                         \
    case TPU_OP_WHERE: return a != 0 ? b : d;                                                \
    case TPU_OP_ADDCMUL: return a + f0 * b * d;                                              \
    case TPU_OP_ADDCDIV: return a + f0 * b / d;                                              \
    case TPU_OP_LERP:                                                                        \
        return M(fabs)(d) < K(0.5) ? a + d * (b - a) : b - (b - a) * (K(1) - d);             \
    case TPU_OP_CLAMP_T: return REF_MINN(REF_MAXN(a, b), d);                                 \
    default: return (T)NAN;                                                                  \
    }                                                                                        \
}

#define REF_MF(fn) fn##f
#define REF_KF(v) ((float)(v))
#define REF_MD(fn) fn
#define REF_KD(v) ((double)(v))
REF_FLOAT_OPS(float, REF_MF, REF_KF, f)
REF_FLOAT_OPS(double, REF_MD, REF_KD, d)

/* ---- int64 domain: wrapping arithmetic like the narrow C++ types ---- */

static int64_t ref_wrap(uint64_t v) { return (int64_t)v; }

static int64_t ref_powi(int64_t b, int64_t e) {
    if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;
    uint64_t r = 1, x = (uint64_t)b;
    while (e) {
        if (e & 1) r *= x;
        x *= x;
        e >>= 1;
    }
    return ref_wrap(r);
}

static int64_t ref_unary_i(ref_ctx *c, int64_t x) {
    const tpu_params *p = c->p;
    switch (c->op) {
    case TPU_OP_NEG: return ref_wrap(0u - (uint64_t)x);
    case TPU_OP_ABS: return x < 0 ? ref_wrap(0u - (uint64_t)x) : x;
    case TPU_OP_SIGN: return (x > 0) - (x < 0);
    case TPU_OP_RELU: return x < 0 ? 0 : x;
    case TPU_OP_CLAMP: {
        int64_t r = x;
        if (p->i[0] && r < ref_d2i(p->f[0])) r = ref_d2i(p->f[0]);
        if (p->i[1] && r > ref_d2i(p->f[1])) r = ref_d2i(p->f[1]);
        return r;
    }
    case TPU_OP_FLOOR: case TPU_OP_CEIL: case TPU_OP_ROUND: case TPU_OP_TRUNC:
    case TPU_OP_NAN_TO_NUM:
        return x;
    case TPU_OP_FRAC: case TPU_OP_ISNAN: case TPU_OP_ISINF: return 0;
    case TPU_OP_LOGICAL_NOT: return x == 0;
    case TPU_OP_BITWISE_NOT: return c->cbool ? x == 0 : ~x;
    default: return 0;
    }
}

static int64_t ref_div_i(ref_ctx *c, int64_t a, int64_t b) {
    if (b == 0) { c->err = REF_ERR_ZERODIV; return 0; }
    if (b == -1) return ref_wrap(0u - (uint64_t)a);
    int64_t q = a / b;
    if (c->p->i[0] == 2 && (a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
}

static int64_t ref_mod_i(ref_ctx *c, int64_t a, int64_t b, bool python) {
    if (b == 0) { c->err = REF_ERR_ZERODIV; return 0; }
    if (b == -1) return 0;
    int64_t r = a % b;
    if (python && r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

static int64_t ref_binary_i(ref_ctx *c, int64_t a, int64_t b) {
    const tpu_params *p = c->p;
    switch (c->op) {
    case TPU_OP_ADD: return ref_wrap((uint64_t)a + (uint64_t)ref_d2i(p->f[0]) * (uint64_t)b);
    case TPU_OP_SUB: return ref_wrap((uint64_t)a - (uint64_t)ref_d2i(p->f[0]) * (uint64_t)b);
    case TPU_OP_MUL: return ref_wrap((uint64_t)a * (uint64_t)b);
    case TPU_OP_DIV: return ref_div_i(c, a, b);
    case TPU_OP_POW:
        if (b < 0 && c->exp_scalar) { c->err = REF_ERR_NEGPOW; return 0; }
        return ref_powi(a, b);
    case TPU_OP_MAXIMUM: return a > b ? a : b;
    case TPU_OP_MINIMUM: return a < b ? a : b;
    case TPU_OP_FMOD: return ref_mod_i(c, a, b, false);
    case TPU_OP_REMAINDER: return ref_mod_i(c, a, b, true);
    case TPU_OP_EQ: return a == b;
    case TPU_OP_NE: return a != b;
    case TPU_OP_LT: return a < b;
    case TPU_OP_LE: return a <= b;
    case TPU_OP_GT: return a > b;
    case TPU_OP_GE: return a >= b;
    case TPU_OP_LOGICAL_AND: return a != 0 && b != 0;
    case TPU_OP_LOGICAL_OR: return a != 0 || b != 0;
    case TPU_OP_LOGICAL_XOR: return (a != 0) != (b != 0);
    case TPU_OP_BITWISE_AND: return a & b;
    case TPU_OP_BITWISE_OR: return a | b;
    case TPU_OP_BITWISE_XOR: return a ^ b;
    case TPU_OP_THRESHOLD_BWD: return b <= ref_d2i(p->f[0]) ? 0 : a;
    case TPU_OP_HARDTANH_BWD: return (b <= ref_d2i(p->f[0]) || b >= ref_d2i(p->f[1])) ? 0 : a;
    default: return 0;
    }
}

static int64_t ref_ternary_i(ref_ctx *c, int64_t a, int64_t b, int64_t d) {
    switch (c->op) {
    case TPU_OP_WHERE: return a != 0 ? b : d;
    case TPU_OP_ADDCMUL:
        return ref_wrap((uint64_t)a + (uint64_t)ref_d2i(c->p->f[0]) * (uint64_t)b * (uint64_t)d);
    case TPU_OP_CLAMP_T: {
        int64_t r = a > b ? a : b;
        return r < d ? r : d;
    }
    default: return 0;
    }
}

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
        if (of) tpu_store_f64(dst, (tpu_dtype)o->dtype, vf);
        else tpu_store_i64(dst, (tpu_dtype)o->dtype, vi);
    }
}

static void ref_copy(tpu_kargs *a, int64_t n) {
    const tpu_tensor *o = &a->t[0], *s = &a->t[1];
    bool sf = tpu_dtype_is_float((tpu_dtype)s->dtype);
    for (int64_t k = 0; k < n; k++) {
        void *dst = tpu_elem_ptr(o, ref_offset(o, o->sizes, o->ndim, k));
        if (s->is_scalar) {
            if (sf) tpu_store_f64(dst, (tpu_dtype)o->dtype, s->f);
            else tpu_store_i64(dst, (tpu_dtype)o->dtype, s->i);
            continue;
        }
        const void *src = ref_in_ptr(s, o->sizes, o->ndim, k);
        if (sf) tpu_store_f64(dst, (tpu_dtype)o->dtype, tpu_load_f64(src, (tpu_dtype)s->dtype));
        else tpu_store_i64(dst, (tpu_dtype)o->dtype, tpu_load_i64(src, (tpu_dtype)s->dtype));
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

static void ref_elem_f(ref_ctx *c, tpu_kargs *a, int nin, int64_t k) {
    const tpu_tensor *o = &a->t[0];
    float v[3] = { 0, 0, 0 }, r;
    for (int j = 0; j < nin; j++) v[j] = ref_load_f(&a->t[1 + j], o->sizes, o->ndim, k);
    if (nin == 1) r = ref_unary_f(c, v[0]);
    else if (nin == 2) r = ref_binary_f(c, v[0], v[1]);
    else r = ref_ternary_f(c, v[0], v[1], v[2]);
    tpu_store_f64(tpu_elem_ptr(o, ref_offset(o, o->sizes, o->ndim, k)), (tpu_dtype)o->dtype, r);
}

static void ref_elem_d(ref_ctx *c, tpu_kargs *a, int nin, int64_t k) {
    const tpu_tensor *o = &a->t[0];
    double v[3] = { 0, 0, 0 }, r;
    for (int j = 0; j < nin; j++) v[j] = ref_load_d(&a->t[1 + j], o->sizes, o->ndim, k);
    if (nin == 1) r = ref_unary_d(c, v[0]);
    else if (nin == 2) r = ref_binary_d(c, v[0], v[1]);
    else r = ref_ternary_d(c, v[0], v[1], v[2]);
    tpu_store_f64(tpu_elem_ptr(o, ref_offset(o, o->sizes, o->ndim, k)), (tpu_dtype)o->dtype, r);
}

static void ref_elem_i(ref_ctx *c, tpu_kargs *a, int nin, int64_t k) {
    const tpu_tensor *o = &a->t[0];
    int64_t v[3] = { 0, 0, 0 }, r;
    for (int j = 0; j < nin; j++) v[j] = ref_load_i(&a->t[1 + j], o->sizes, o->ndim, k);
    if (nin == 1) r = ref_unary_i(c, v[0]);
    else if (nin == 2) r = ref_binary_i(c, v[0], v[1]);
    else r = ref_ternary_i(c, v[0], v[1], v[2]);
    if (c->err) return;
    tpu_store_i64(tpu_elem_ptr(o, ref_offset(o, o->sizes, o->ndim, k)), (tpu_dtype)o->dtype, r);
}

static tpu_status ref_ew_error(tpu_kargs *a, int err) {
    switch (err) {
    case REF_ERR_ZERODIV: return tpu_kernel_fail(a, "ZeroDivisionError");
    case REF_ERR_NEGPOW: return tpu_kernel_fail(a, "Integers to negative integer powers are not allowed.");
    default:
        tpu_kernel_fail(a, "%s: not supported for floating point compute dtype", tpu_op_name(a->op));
        return TPU_ERROR_NOT_SUPPORTED;
    }
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
    if ((unsigned)cdt >= TPU_DTYPE_COUNT)
        return tpu_kernel_fail(a, "%s: bad compute dtype %d", tpu_op_name(a->op), (int)cdt);
    ref_dom dom = cdt == TPU_F64 ? REF_DOM_D : tpu_dtype_is_float(cdt) ? REF_DOM_F
                : ref_ew_int_capable(a->op, &a->p) ? REF_DOM_I : REF_DOM_D;
    if (dom != REF_DOM_I && ref_ew_is_bitwise(a->op)) return ref_ew_error(a, REF_ERR_FLOAT_BITWISE);
    ref_ctx c = { a->op, &a->p, nin >= 2 && a->t[2].is_scalar, cdt == TPU_BOOL, REF_OK };
    for (int64_t k = 0; k < n && !c.err; k++) {
        if (dom == REF_DOM_F) ref_elem_f(&c, a, nin, k);
        else if (dom == REF_DOM_D) ref_elem_d(&c, a, nin, k);
        else ref_elem_i(&c, a, nin, k);
    }
    return c.err ? ref_ew_error(a, c.err) : TPU_OK;
}
