/* expr-impl.h - the vocabulary of ops.def's elementwise expressions.
 *
 * An elementwise op's math is one expression in ops.def (its EXPR column),
 * written over the inputs x, y, z of type T and the op's named parameters.
 * Every user expands that same text: the reference kernel (ref/ref_ew.c)
 * with the definitions below (libm, correctly rounded in the domain's
 * precision), the fast kernel (kernels/elementwise.c) with the same names
 * redefined as branch-free vectorizable approximations where that pays
 * (EXP, LOG, TANH, SEL, ...), and later the fused interpreter and the code
 * generator. An expander includes this header, defines T (float, double or
 * int64_t) in scope, declares the parameters and the locals `cbool` (the
 * compute dtype is bool) and `expr_err` (an int the integer helpers set to
 * TPU_EXPR_ERR_ZERODIV), and picks the float or integer form with
 * TPU_EXPR_F / TPU_EXPR_I; base/expr-cases.h generates the switch cases.
 *
 * Float domain (T float or double; the function follows T via _Generic):
 *   EXP EXP2 EXPM1 LOG LOG2 LOG10 LOG1P SQRT SIN COS TAN ASIN ACOS ATAN SINH
 *   COSH TANH ASINH ACOSH ATANH ERF ERFC FABS FLOOR CEIL TRUNC RINT (half to
 *   even) FMOD ATAN2 POW HYPOT COPYSIGN; DIVFLOOR (PyTorch's floor
 *   division), REM (Python's modulus); ERF_GELU (erf where GELU uses it:
 *   the fast kernel may use the approximation PyTorch's vectorized GELU
 *   uses); LGAMMA DIGAMMA POLYGAMMA(n, x) ERFINV BESSEL_I(nu, scaled, x)
 *   ZETA(x, q) ERFCX NDTRI LOG_NDTR IGAMMA(a, x) IGAMMAC(a, x)
 *   (base/specfun-impl.h), BESSEL_J0 BESSEL_J1 BESSEL_Y0 BESSEL_Y1
 *   BESSEL_K(nu, scaled, x) AIRY_AI SPHERICAL_J0 (base/specfun-bessel-impl.h),
 *   POLY(name, x, n) (base/specfun-poly-impl.h: chebyshev_t, hermite_h, ...,
 *   computed in T), SIGNBIT; SEL(c, a, b) (c ? a : b on values, both computed), MAXN / MINN
 *   (NaN-propagating); K(v) (a constant of type T).
 * Integer domain (T int64_t, wrapping like the narrow C++ types): WADD WSUB
 *   WMUL WNEG; IDIV_TRUNC IDIV_FLOOR IFMOD IREM (a zero divisor sets
 *   expr_err); IPOW; IGCD ILCM; SEL, MAXN, MINN as above.
 * Pure functions only: no state but expr_err. Plain data, the base floor. */
#ifndef TPU_EXPR_IMPL_H
#define TPU_EXPR_IMPL_H
#include <math.h>
#include <stdint.h>
#include <stdbool.h>
#include "base/specfun-impl.h"
#include "base/specfun-bessel-impl.h"
#include "base/specfun-poly-impl.h"

#define TPU_SQRT1_2   0.70710678118654752440 /* 1/sqrt(2) */
#define TPU_SQRT2_PI  0.79788456080286535588 /* sqrt(2/pi) */
#define TPU_1_SQRT2PI 0.39894228040143267794 /* 1/sqrt(2*pi) */

enum { TPU_EXPR_OK, TPU_EXPR_ERR_ZERODIV };

/* ---- picking a form out of the EXPR column ---- */
/* EXPR((float expression), INT | I(expression) | NOINT) */
#define TPU_EXPR_F(f, i)    f
#define TPU_EXPR_I(f, i)    TPU_EXPR_I_##i(f)
#define TPU_EXPR_I_INT(f)   f
#define TPU_EXPR_I_NOINT(f) (0)
#define TPU_EXPR_I_I(...)   (__VA_ARGS__) TPU_EXPR_DROP_
#define TPU_EXPR_DROP_(...)
#define TPU_EXPR_HAS_I(f, i)  TPU_EXPR_HAS_I_##i
#define TPU_EXPR_HAS_I_INT    1
#define TPU_EXPR_HAS_I_NOINT  0
#define TPU_EXPR_HAS_I_I(...) 1
#define NOFLOAT               ((T)NAN) /* integer-only ops: their dtype rule keeps floats out */

/* ---- scalar helpers both kernels share ---- */

static inline int64_t tpu_d2i(double v) { /* NaN -> 0, saturating (never UB) */
    if (v != v) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}

/* PyTorch's div_floor_floating. */
#define TPU_DIV_FLOOR_BODY_(T_, FMOD_, FLOOR_, COPYSIGN_)   \
    {                                                       \
        if (b == 0) return a / b;                           \
        T_ mod = FMOD_(a, b);                               \
        T_ div = (a - mod) / b;                             \
        if (mod != 0 && (b < 0) != (mod < 0)) div -= (T_)1; \
        if (div == 0) return COPYSIGN_((T_)0, a / b);       \
        T_ fl = FLOOR_(div);                                \
        if (div - fl > (T_)0.5) fl += (T_)1;                \
        return fl;                                          \
    }
static inline float tpu_divfloor_f(float a, float b)
    TPU_DIV_FLOOR_BODY_(float, fmodf, floorf, copysignf) static inline double tpu_divfloor_d(double a, double b)
        TPU_DIV_FLOOR_BODY_(double, fmod, floor, copysign) static inline float tpu_rem_f(float a, float b) {
    float m = fmodf(a, b);
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}
static inline double tpu_rem_d(double a, double b) {
    double m = fmod(a, b);
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}

static inline float tpu_maxn_f(float a, float b) { return a != a ? a : b != b ? b : a > b ? a : b; }
static inline double tpu_maxn_d(double a, double b) { return a != a ? a : b != b ? b : a > b ? a : b; }
static inline float tpu_minn_f(float a, float b) { return a != a ? a : b != b ? b : a < b ? a : b; }
static inline double tpu_minn_d(double a, double b) { return a != a ? a : b != b ? b : a < b ? a : b; }
static inline int64_t tpu_max_i(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t tpu_min_i(int64_t a, int64_t b) { return a < b ? a : b; }

static inline int64_t tpu_wrap(uint64_t v) { return (int64_t)v; }
static inline int64_t tpu_igcd(int64_t a, int64_t b) { /* PyTorch's Euclid on |a|, |b| (|INT64_MIN| wraps) */
    a = a < 0 ? tpu_wrap(0u - (uint64_t)a) : a;
    b = b < 0 ? tpu_wrap(0u - (uint64_t)b) : b;
    while (a != 0) {
        int64_t t = a == -1 ? 0 : b % a;
        b = a;
        a = t;
    }
    return b;
}
static inline int64_t tpu_ilcm(int64_t a, int64_t b) { /* |a / gcd * b|, 0 when both are 0 */
    int64_t g = tpu_igcd(a, b);
    if (g == 0) return 0;
    int64_t v = tpu_wrap((uint64_t)(g == -1 ? tpu_wrap(0u - (uint64_t)a) : a / g) * (uint64_t)b);
    return v < 0 ? tpu_wrap(0u - (uint64_t)v) : v;
}
static inline int64_t tpu_ipow(int64_t b, int64_t e) { /* negative e: 1 / b^|e| truncated */
    if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;
    uint64_t r = 1, x = (uint64_t)b;
    while (e) {
        if (e & 1) r *= x;
        x *= x;
        e >>= 1;
    }
    return tpu_wrap(r);
}
/* a / b truncated (floor: rounded down); b == -1 wraps like the C++ types. */
static inline int64_t tpu_idiv(int64_t a, int64_t b, bool floor_, int *err) {
    if (b == 0) {
        *err = TPU_EXPR_ERR_ZERODIV;
        return 0;
    }
    if (b == -1) return tpu_wrap(0u - (uint64_t)a);
    int64_t q = a / b;
    if (floor_ && (a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
}
/* C's % (python: the sign of b, as Python's and PyTorch's remainder). */
static inline int64_t tpu_imod(int64_t a, int64_t b, bool python, int *err) {
    if (b == 0) {
        *err = TPU_EXPR_ERR_ZERODIV;
        return 0;
    }
    if (b == -1) return 0;
    int64_t r = a % b;
    if (python && r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

/* ---- the vocabulary: reference definitions ---- */
#define K(v)               ((T)(v))
#define TPU_M1_(fn, v)     _Generic((v), float: fn##f, default: fn)(v)
#define TPU_M2_(fn, a, b)  _Generic((a), float: fn##f, default: fn)(a, b)
#define EXP(v)             TPU_M1_(exp, v)
#define EXP2(v)            TPU_M1_(exp2, v)
#define EXPM1(v)           TPU_M1_(expm1, v)
#define LOG(v)             TPU_M1_(log, v)
#define LOG2(v)            TPU_M1_(log2, v)
#define LOG10(v)           TPU_M1_(log10, v)
#define LOG1P(v)           TPU_M1_(log1p, v)
#define SQRT(v)            TPU_M1_(sqrt, v)
#define SIN(v)             TPU_M1_(sin, v)
#define COS(v)             TPU_M1_(cos, v)
#define TAN(v)             TPU_M1_(tan, v)
#define ASIN(v)            TPU_M1_(asin, v)
#define ACOS(v)            TPU_M1_(acos, v)
#define ATAN(v)            TPU_M1_(atan, v)
#define SINH(v)            TPU_M1_(sinh, v)
#define COSH(v)            TPU_M1_(cosh, v)
#define TANH(v)            TPU_M1_(tanh, v)
#define ASINH(v)           TPU_M1_(asinh, v)
#define ACOSH(v)           TPU_M1_(acosh, v)
#define ATANH(v)           TPU_M1_(atanh, v)
#define ERF(v)             TPU_M1_(erf, v)
#define ERFC(v)            TPU_M1_(erfc, v)
#define ERF_GELU(v)        ERF(v)
#define LGAMMA(v)          _Generic((v), float: tpu_lgammaf, default: tpu_lgamma)(v)
#define DIGAMMA(v)         ((T)tpu_digamma((double)(v)))
#define POLYGAMMA(n, v)    ((T)tpu_polygamma((double)(n), (double)(v)))
#define ERFINV(v)          ((T)tpu_erfinv((double)(v)))
#define BESSEL_I(nu, s, v) ((T)tpu_bessel_i(nu, (double)(v), s))
#define ZETA(a, b)         ((T)tpu_zeta_pt((double)(a), (double)(b)))
#define ERFCX(v)           ((T)tpu_erfcx((double)(v)))
#define NDTRI(v)           ((T)tpu_ndtri((double)(v)))
#define LOG_NDTR(v)        ((T)tpu_log_ndtr((double)(v)))
#define IGAMMA(a, b)       ((T)tpu_igamma((double)(a), (double)(b)))
#define IGAMMAC(a, b)      ((T)tpu_igammac((double)(a), (double)(b)))
#define BESSEL_J0(v)       ((T)tpu_bessel_j0((double)(v)))
#define BESSEL_J1(v)       ((T)tpu_bessel_j1((double)(v)))
#define BESSEL_Y0(v)       ((T)tpu_bessel_y0((double)(v)))
#define BESSEL_Y1(v)       ((T)tpu_bessel_y1((double)(v)))
#define BESSEL_K(nu, s, v) ((T)tpu_bessel_k(nu, (double)(v), s))
#define AIRY_AI(v)         ((T)tpu_airy_ai((double)(v)))
#define SPHERICAL_J0(v)    ((T)tpu_spherical_j0((double)(v)))
#define POLY(name, v, n)   _Generic((v), float: tpu_##name##f, default: tpu_##name)((v), tpu_poly_n((double)(n)))
#define SIGNBIT(v)         ((T)(signbit(v) != 0))
#define FABS(v)            TPU_M1_(fabs, v)
#define FLOOR(v)           TPU_M1_(floor, v)
#define CEIL(v)            TPU_M1_(ceil, v)
#define TRUNC(v)           TPU_M1_(trunc, v)
#define RINT(v)            TPU_M1_(nearbyint, v)
#define FMOD(a, b)         TPU_M2_(fmod, a, b)
#define ATAN2(a, b)        TPU_M2_(atan2, a, b)
#define POW(a, b)          TPU_M2_(pow, a, b)
#define HYPOT(a, b)        TPU_M2_(hypot, a, b)
#define COPYSIGN(a, b)     TPU_M2_(copysign, a, b)
#define DIVFLOOR(a, b)     _Generic((a), float: tpu_divfloor_f, default: tpu_divfloor_d)(a, b)
#define REM(a, b)          _Generic((a), float: tpu_rem_f, default: tpu_rem_d)(a, b)
#define SEL(c, a, b)       ((c) ? (a) : (b))
#define MAXN(a, b)         _Generic((a), float: tpu_maxn_f, double: tpu_maxn_d, default: tpu_max_i)(a, b)
#define MINN(a, b)         _Generic((a), float: tpu_minn_f, double: tpu_minn_d, default: tpu_min_i)(a, b)
#define WADD(a, b)         tpu_wrap((uint64_t)(a) + (uint64_t)(b))
#define WSUB(a, b)         tpu_wrap((uint64_t)(a) - (uint64_t)(b))
#define WMUL(a, b)         tpu_wrap((uint64_t)(a) * (uint64_t)(b))
#define WNEG(a)            tpu_wrap(0u - (uint64_t)(a))
#define IDIV_TRUNC(a, b)   tpu_idiv(a, b, false, &expr_err)
#define IDIV_FLOOR(a, b)   tpu_idiv(a, b, true, &expr_err)
#define IFMOD(a, b)        tpu_imod(a, b, false, &expr_err)
#define IREM(a, b)         tpu_imod(a, b, true, &expr_err)
#define IPOW(a, b)         tpu_ipow(a, b)
#define IGCD(a, b)         tpu_igcd(a, b)
#define ILCM(a, b)         tpu_ilcm(a, b)
#endif
