/* elementwise.c - fast kernels for the elementwise (EW) op family.
 *
 * DESIGN. Operands are first coalesced: size-1 dims are dropped and adjacent
 * dims that are contiguous across every operand are merged, so a contiguous
 * or simply broadcast launch becomes one long row. The output is then walked
 * row by row in tiles of EW_TILE elements. Per tile each input is either
 * used in place (stride 1 and already the compute type: float32 for the
 * float domain, float64, int64) or gathered into a typed buffer with dtype
 * conversion (stride-0 broadcasts are filled once and reused, host scalars
 * once per block). The op then runs over the whole tile with a fixed trip
 * count and restrict pointers, which is what lets gcc -O2 (very-cheap
 * vectorizer cost model: no runtime alias checks, no epilogue) vectorize it;
 * the hot tile functions are target_clones'd for AVX-512 / AVX2 / baseline.
 * Results go straight to the output or through a buffer with conversion.
 * An output that shares storage with an input is always buffered, so an
 * in-place op (add_) reads a whole tile before writing it.
 *
 * The math of every op is its expression in ops.def, expanded once per
 * compute domain by base/expr-cases.h into one switch of fixed-trip tile
 * loops (ew_tile_f / _d / _i). This file only chooses how the expression's
 * vocabulary computes: branch-free approximations of exp/log/tanh/erf (a few
 * ulp; PyTorch uses vectorized Sleef) and selects that do not branch, so the
 * loops vectorize; libm elsewhere. pow with a host-scalar exponent is
 * strength-reduced (x*x ...). Compute domains, shared with ref/ref_ew.c:
 * compute_dtype float32/float16/bfloat16 -> float, float64 -> double,
 * integer/bool -> int64 for ops with an integer form, else double. FILL,
 * COPY and ARANGE ignore compute_dtype and convert straight to the output
 * dtype.
 *
 * Work is split into blocks of EW_GRAIN elements for tpu_parallel_for; a
 * block may start anywhere in a row. */
#define TPU_VMATH_FMA /* vmath's polynomials as fmaf: the float tile functions are built for FMA (below) */
#include "kernels/kernels-impl.h"
#include "kernels/vmath-impl.h"
#include "kernels/tile-impl.h"
#include "base/expr-impl.h"
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#define EW_TILE    TPU_TILE
#define EW_GRAIN   32768
#define EW_NOP     4                      /* output + up to 3 inputs */
#define EW_SQRT1_2 0.70710678118654752440 /* GELU: 1/sqrt(2) */
#define EW_KBETA   0.79788456080286535588 /* GELU tanh form: sqrt(2/pi) */
#define EW_KPDF    0.39894228040143267794 /* 1/sqrt(2*pi) */

/* Math helpers must inline into each ISA clone of the tile functions. */

#if defined(__x86_64__) && defined(__GNUC__)
#define EW_CLONES TPU_TARGET_CLONES
#else
#define EW_CLONES
#endif

typedef enum ew_dom { EW_DOM_F, EW_DOM_D, EW_DOM_I } ew_dom;
enum { EW_POW_GENERIC, EW_POW_RECIP, EW_POW_SQ, EW_POW_CUBE, EW_POW_RSQ };

typedef tpu_ew_par ew_par; /* op parameters, pre-converted for each domain (kernels-impl.h) */

typedef struct ew_ctx {
    tpu_op op;
    ew_dom dom;
    int nin, nd;
    int64_t numel, chunk_max;
    int64_t sz[TPU_MAX_DIMS];
    int64_t st[EW_NOP][TPU_MAX_DIMS];
    char *base[EW_NOP]; /* element 0 of each operand */
    tpu_dtype dt[EW_NOP];
    size_t esz[EW_NOP];
    bool scalar[EW_NOP], direct[EW_NOP];
    double sf[EW_NOP];
    int64_t si[EW_NOP];
    unsigned char pattern[EW_TILE * 8]; /* FILL: EW_TILE copies of the value */
    bool pattern_zero;
    ew_par par;
    atomic_int err;
} ew_ctx;

typedef union ew_bufs {
    float f[EW_NOP][EW_TILE];
    double d[EW_NOP][EW_TILE];
    int64_t i[EW_NOP][EW_TILE];
} ew_bufs;

/* ---- branch-free float helpers (vectorizable) ---- */

/* expm1: Taylor series near 0 (where exp(x) - 1 cancels), else exp(x) - 1. */
EW_INLINE float ew_expm1f(float x) {
    float q = VM_MAD(x, 1.0f / 40320.0f, 1.0f / 5040.0f);
    q = VM_MAD(q, x, 1.0f / 720.0f);
    q = VM_MAD(q, x, 1.0f / 120.0f);
    q = VM_MAD(q, x, 1.0f / 24.0f);
    q = VM_MAD(q, x, 1.0f / 6.0f);
    q = VM_MAD(q, x, 0.5f);
    float small = VM_MAD(x * x, q, x);
    return ew_self(fabsf(x) < 0.5f, small, ew_expf(x) - 1.0f);
}

/* log: Cephes logf (mantissa in [sqrt(1/2), sqrt(2)), degree-9 polynomial).
 * ew_log_parts splits x = 2^e m and returns e, with ln(m) = u - z/2 + y;
 * its users add e times their base's constant (log, log2, log10). */
EW_INLINE float ew_log_parts(float x, float *u, float *y, float *z) {
    int tiny = x < 1.17549435e-38f;
    float xs = ew_self(tiny, x * 8388608.0f, x);
    int32_t b = ew_f2b(xs);
    int32_t e = ((b >> 23) & 0xff) - 126 - 23 * tiny;
    float m = ew_b2f((b & 0x007fffff) | 0x3f000000);
    int c = m < 0.707106781186547524f;
    e -= c;
    *u = ew_self(c, m + m - 1.0f, m - 1.0f);
    *z = *u * *u;
    float p = 7.0376836292e-2f;
    p = VM_MAD(p, *u, -1.1514610310e-1f);
    p = VM_MAD(p, *u, 1.1676998740e-1f);
    p = VM_MAD(p, *u, -1.2420140846e-1f);
    p = VM_MAD(p, *u, 1.4249322787e-1f);
    p = VM_MAD(p, *u, -1.6668057665e-1f);
    p = VM_MAD(p, *u, 2.0000714765e-1f);
    p = VM_MAD(p, *u, -2.4999993993e-1f);
    p = VM_MAD(p, *u, 3.3333331174e-1f);
    *y = p * *u * *z;
    return (float)e;
}
/* log's special values over r: 0 -> -inf, x < 0 -> NaN, inf -> inf, NaN. */
EW_INLINE float ew_log_special(float x, float r) {
    r = ew_self(x == 0.0f, -INFINITY, r);
    r = ew_self(x < 0.0f, NAN, r);
    r = ew_self(x == INFINITY, x, r);
    return ew_self(x != x, x, r);
}
/* ln(x) = e ln2 + ln(m), Cephes' order: e ln2_lo + (u - z/2 + y), then e ln2_hi. */
EW_INLINE float ew_logf(float x) {
    float u, y, z, ef = ew_log_parts(x, &u, &y, &z);
    y = VM_MAD(ef, -2.12194440e-4f, y);
    y = VM_MAD(z, -0.5f, y);
    return ew_log_special(x, VM_MAD(ef, 0.693359375f, u + y));
}
/* log2, log10: e log_b(2) + ln(m) log_b(e), the constants as float pairs. */
EW_INLINE float ew_log2f(float x) {
    float u, y, z, e = ew_log_parts(x, &u, &y, &z), lnm = u + VM_MAD(z, -0.5f, y);
    float r = e + VM_MAD(lnm, 1.44269502162933349609375f, lnm * 1.925963033500011079e-8f);
    return ew_log_special(x, r);
}
EW_INLINE float ew_log10f(float x) {
    float u, y, z, e = ew_log_parts(x, &u, &y, &z), lnm = u + VM_MAD(z, -0.5f, y);
    float t = VM_MAD(lnm, 0.4342944920063018798828125f, lnm * 1.900132345435082e-9f);
    float r = VM_MAD(e, 0.30102999508380889892578125f, VM_MAD(e, 5.6082952802e-11f, t));
    return ew_log_special(x, r);
}

/* 2^x: n = rint(x), 2^(x - n) by Cephes exp2f's polynomial (|x - n| <=
 * 1/2, x - n exact), 2^n applied in two steps as in ew_expf. */
EW_INLINE float ew_exp2f(float x) {
    float xc = ew_self(x > 130.0f, 130.0f, x);
    xc = ew_self(xc < -160.0f, -160.0f, xc);
    xc = ew_self(x != x, 0.0f, xc);
    float n = (xc + 12582912.0f) - 12582912.0f;
    float r = xc - n;
    float p = 1.535336188319500e-4f;
    p = VM_MAD(p, r, 1.339887440266574e-3f);
    p = VM_MAD(p, r, 9.618437357674640e-3f);
    p = VM_MAD(p, r, 5.550332471162809e-2f);
    p = VM_MAD(p, r, 2.402264791363012e-1f);
    p = VM_MAD(p, r, 6.931472028550421e-1f);
    float y = VM_MAD(p, r, 1.0f);
    int32_t ni = (int32_t)n;
    int32_t n1 = ni >> 1, n2 = ni - n1;
    int32_t n3 = n2 >> 1; /* (three steps: n down to -150 gives factors within float's exponents) */
    n2 -= n3;
    y = y * ew_b2f((n1 + 127) << 23) * ew_b2f((n2 + 127) << 23) * ew_b2f((n3 + 127) << 23);
    y = ew_self(x >= 128.0f, INFINITY, y);
    y = ew_self(x < -150.0f, 0.0f, y);
    return ew_self(x != x, x, y);
}

/* sinh, cosh: from e = exp(|x|) (sinh below 1 from expm1, where e - 1/e
 * cancels); above 80, e^|x| / 2 = h * (h / 2) with h = exp(|x| / 2), which
 * stays finite as far as the results do. */
EW_INLINE float ew_sinhf(float x) {
    float a = fabsf(x);
    float em = ew_expm1f(a);
    float small = 0.5f * (em + em / (em + 1.0f));
    float e = ew_expf(a);
    float mid = 0.5f * (e - 1.0f / e);
    float h = ew_expf(0.5f * a);
    float big = (0.5f * h) * h;
    float r = ew_self(a < 1.0f, small, ew_self(a < 80.0f, mid, big));
    return ew_self(x != x, x, copysignf(r, x));
}
EW_INLINE float ew_coshf(float x) {
    float a = fabsf(x);
    float e = ew_expf(a);
    float mid = 0.5f * (e + 1.0f / e);
    float h = ew_expf(0.5f * a);
    float big = (0.5f * h) * h;
    float r = ew_self(a < 80.0f, mid, big);
    return ew_self(x != x, x, r);
}
/* atan: Cephes atanf (reduced by pi/2 above tan(3pi/8) and by pi/4 above
 * tan(pi/8), odd polynomial, the reduction's constant added in two parts). */
EW_INLINE float ew_atanf(float x) {
    float a = fabsf(x);
    int hi = a > 2.414213562373095f, mid = (a > 0.4142135623730950f) & !hi;
    float t = ew_self(hi, -1.0f / a, ew_self(mid, (a - 1.0f) / (a + 1.0f), a));
    float y0 = ew_self(hi, 1.5707963267948966f, ew_self(mid, 0.7853981633974483f, 0.0f));
    float y1 = ew_self(hi, -4.37113900018624283e-8f, ew_self(mid, -2.18556950009312141e-8f, 0.0f));
    float z = t * t;
    float p = 8.05374449538e-2f;
    p = VM_MAD(p, z, -1.38776856032e-1f);
    p = VM_MAD(p, z, 1.99777106478e-1f);
    p = VM_MAD(p, z, -3.33329491539e-1f);
    float r = y0 + (VM_MAD(p * z, t, t) + y1); /* (y1: pi/4 or pi/2 minus its float) */
    r = ew_self(a == INFINITY, 1.5707963267948966f, r);
    return ew_self(x != x, x, copysignf(r, x));
}
/* asin, acos: Cephes asinf's polynomial on |x| <= 1/2, and through
 * asin(a) = pi/2 - 2 asin(sqrt((1 - a) / 2)) above. */
EW_INLINE float ew_asin_poly(float t) {
    float z = t * t;
    float p = 4.2163199048e-2f;
    p = VM_MAD(p, z, 2.4181311049e-2f);
    p = VM_MAD(p, z, 4.5470025998e-2f);
    p = VM_MAD(p, z, 7.4953002686e-2f);
    p = VM_MAD(p, z, 1.6666752422e-1f);
    return VM_MAD(p * z, t, t);
}
EW_INLINE float ew_asinf(float x) {
    float a = fabsf(x);
    float s = sqrtf(ew_self(a > 1.0f, 0.0f, 0.5f * (1.0f - a)));
    float big = 1.5707963267948966f - (2.0f * ew_asin_poly(s) + 4.37113900018624283e-8f); /* pi/2 = float + -4.4e-8 */
    float r = ew_self(a > 0.5f, big, ew_asin_poly(a));
    r = ew_self(a > 1.0f, NAN, r);
    return ew_self(x != x, x, copysignf(r, x));
}
EW_INLINE float ew_acosf(float x) {
    float a = fabsf(x);
    float s = sqrtf(ew_self(a > 1.0f, 0.0f, 0.5f * (1.0f - a)));
    float w = 2.0f * ew_asin_poly(s);                                 /* acos(|x|), |x| > 1/2 */
    float neg = 3.14159274101257324f - (w + 8.74227800037248566e-8f); /* acos(-|x|) = pi - acos(|x|) */
    float mid = 1.5707963267948966f - (ew_asin_poly(x) + 4.37113900018624283e-8f);
    float r = ew_self(a > 0.5f, ew_self(x < 0.0f, neg, w), mid);
    r = ew_self(a > 1.0f, NAN, r);
    return ew_self(x != x, x, r);
}

/* sin, cos, tan: x reduced by pi/2 in double (k = rint(2x/pi), r = x - k
 * pi/2 in two fused steps: exact to ~2^-52 for |x| < EW_TRIG_MAX), then
 * Cephes sinf / cosf polynomials on the float r, picked by k's quadrant.
 * Larger |x| (and inf, NaN) are redone with libm after the loop
 * (ew_trig_big): their reduction needs more bits of pi than double has. */
#define EW_TRIG_MAX 8388608.0f
EW_INLINE float ew_trig_r(float x, int32_t *q) {
    double xd = (double)ew_self(fabsf(x) < EW_TRIG_MAX, x, 0.0f);
    double k = nearbyint(xd * 0.63661977236758134308);
    double r = fma(-k, 1.5707963267948966192, xd);
    r = fma(-k, 6.123233995736766036e-17, r);
    *q = (int32_t)k;
    return (float)r;
}
EW_INLINE float ew_sin_poly(float r, float z) {
    float p = -1.9515295891e-4f;
    p = VM_MAD(p, z, 8.3321608736e-3f);
    p = VM_MAD(p, z, -1.6666654611e-1f);
    return VM_MAD(p * z, r, r);
}
EW_INLINE float ew_cos_poly(float z) {
    float p = 2.443315711809948e-5f;
    p = VM_MAD(p, z, -1.388731625493765e-3f);
    p = VM_MAD(p, z, 4.166664568298827e-2f);
    return VM_MAD(p * z, z, VM_MAD(z, -0.5f, 1.0f));
}
EW_INLINE float ew_sinf(float x) {
    int32_t q;
    float r = ew_trig_r(x, &q), z = r * r;
    float v = ew_self(q & 1, ew_cos_poly(z), ew_sin_poly(r, z));
    return ew_b2f(ew_f2b(v) ^ (int32_t)(((uint32_t)q & 2u) << 30));
}
EW_INLINE float ew_cosf(float x) {
    int32_t q;
    float r = ew_trig_r(x, &q), z = r * r;
    float v = ew_self(q & 1, ew_sin_poly(r, z), ew_cos_poly(z));
    return ew_b2f(ew_f2b(v) ^ (int32_t)((((uint32_t)q + 1u) & 2u) << 30));
}
EW_INLINE float ew_tanf(float x) { /* Cephes tanf's polynomial; -1/tan(r) in odd quadrants */
    int32_t q;
    float r = ew_trig_r(x, &q), z = r * r;
    float p = 9.38540185543e-3f;
    p = VM_MAD(p, z, 3.11992232697e-3f);
    p = VM_MAD(p, z, 2.44301354525e-2f);
    p = VM_MAD(p, z, 5.34112807005e-2f);
    p = VM_MAD(p, z, 1.33387994085e-1f);
    p = VM_MAD(p, z, 3.33331568548e-1f);
    float t = VM_MAD(p * z, r, r);
    return ew_self(q & 1, -1.0f / t, t);
}

/* log1p(x) = log(u) * x / (u - 1) with u = 1 + x (Goldberg): exact for u == 1. */
EW_INLINE float ew_log1pf(float x) {
    float u = 1.0f + x;
    float d = u - 1.0f;
    float r = ew_logf(u) * (x / d);
    r = ew_self(d == 0.0f, x, r);
    return ew_self(u == INFINITY, u, r);
}

/* atanh = log1p(2|x| / (1 - |x|)) / 2 with x's sign (1 -> inf, beyond -> NaN). */
EW_INLINE float ew_atanhf(float x) {
    float a = fabsf(x);
    float r = 0.5f * ew_log1pf((a + a) / (1.0f - a));
    r = ew_self(a > 1.0f, NAN, r);
    return ew_self(x != x, x, copysignf(r, x));
}

/* erf for GELU: Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7), the formula
 * PyTorch's vectorized CPU GELU uses. */
EW_INLINE float ew_erf_gelu_f(float x) {
    float ax = fabsf(x);
    float t = 1.0f / VM_MAD(0.3275911f, ax, 1.0f);
    float r = 1.061405429f;
    r = VM_MAD(r, t, -1.453152027f);
    r = VM_MAD(r, t, 1.421413741f);
    r = VM_MAD(r, t, -0.284496736f);
    r = VM_MAD(r, t, 0.254829592f);
    float e = ew_expf(-(x * x));
    return copysignf(VM_MAD(-(e * t), r, 1.0f), x);
}

/* erf, vectorizable, within 1.41 ulp of the correctly rounded result over
 * every float in [0, 5] (98.3 % of them correctly rounded; erf is odd, and
 * 1 beyond). libm's erff per element ran at a fifteenth of PyTorch CPU's
 * speed (MKL's vsErf).
 * |x| < 1: x (C0 + t P(t)), t = x^2, C0 = 2/sqrt(pi) as a float pair;
 * 1 <= |x| < 4: 1 - exp(Q(|x|)), Q approximating log(erfc) (erfc(4) is below
 * half an ulp of 1, so |x| >= 4 evaluates Q at 4). P (degree 7) and Q
 * (degree 8) were fitted by weighted least squares (Lawson's iteration
 * towards minimax) against erf in 30-digit arithmetic, relative error in
 * erf the weight: fit error 4e-11 and 2e-11, float evaluation the rest.
 * Both branches are computed and one selected, so the loop vectorizes. */
EW_INLINE float ew_erff(float x) {
    float a = fabsf(x), t = x * x;
    float p = -9.684223187e-06f;
    p = VM_MAD(p, t, 1.127302457e-04f);
    p = VM_MAD(p, t, -8.485249709e-04f);
    p = VM_MAD(p, t, 5.221131258e-03f);
    p = VM_MAD(p, t, -2.686547674e-02f);
    p = VM_MAD(p, t, 1.128378361e-01f);
    p = VM_MAD(p, t, -3.761263788e-01f);
    p = VM_MAD(p, t, 5.9631755e-08f); /* t P(t) + (2/sqrt(pi) - 1.12837911f) */
    float small = VM_MAD(x, 1.12837911f, x * p);
    float b = ew_self(a < 4.0f, a, 4.0f);
    float q = 2.120856948e-07f;
    q = VM_MAD(q, b, -2.475423571e-05f);
    q = VM_MAD(q, b, 4.603578418e-04f);
    q = VM_MAD(q, b, -4.270636011e-03f);
    q = VM_MAD(q, b, 2.534892596e-02f);
    q = VM_MAD(q, b, -1.086065993e-01f);
    q = VM_MAD(q, b, -6.330657601e-01f);
    q = VM_MAD(q, b, -1.129649401e+00f);
    q = VM_MAD(q, b, 2.020654356e-04f);
    float big = copysignf(1.0f - ew_expf(q), x);
    float r = ew_self(a < 1.0f, small, big);
    return ew_self(x != x, x, r);
}

/* floor / ceil / trunc from nearbyint (rounding without raising inexact is
 * what gcc vectorizes; floorf under -ftrapping-math is not). The result
 * always has the sign of x. */
EW_INLINE float ew_floorf(float x) {
    float r = nearbyintf(x);
    return copysignf(ew_self(r > x, r - 1.0f, r), x);
}
EW_INLINE float ew_ceilf(float x) {
    float r = nearbyintf(x);
    return copysignf(ew_self(r < x, r + 1.0f, r), x);
}
EW_INLINE float ew_truncf(float x) {
    float a = fabsf(x), r = nearbyintf(a);
    return copysignf(ew_self(r > a, r - 1.0f, r), x);
}

/* The fast kernel's vocabulary: base/expr-impl.h's reference names,
 * redefined where a branch-free approximation vectorizes (float only:
 * double keeps libm) or a select must not branch. */
#undef EXP
#undef EXPM1
#undef LOG
#undef LOG1P
#undef TANH
#undef ERF
#undef ERF_GELU
#undef EXP2
#undef LOG2
#undef LOG10
#undef SIN
#undef COS
#undef TAN
#undef ASIN
#undef ACOS
#undef ATAN
#undef SINH
#undef COSH
#undef ATANH
#undef FLOOR
#undef CEIL
#undef TRUNC
#undef SEL
#undef MAXN
#undef MINN
#define EXP(v)       _Generic((v), float: ew_expf, default: exp)(v)
#define EXPM1(v)     _Generic((v), float: ew_expm1f, default: expm1)(v)
#define LOG(v)       _Generic((v), float: ew_logf, default: log)(v)
#define LOG1P(v)     _Generic((v), float: ew_log1pf, default: log1p)(v)
#define TANH(v)      _Generic((v), float: ew_tanhf, default: tanh)(v)
#define ERF(v)       _Generic((v), float: ew_erff, default: erf)(v)
#define EXP2(v)      _Generic((v), float: ew_exp2f, default: exp2)(v)
#define LOG2(v)      _Generic((v), float: ew_log2f, default: log2)(v)
#define LOG10(v)     _Generic((v), float: ew_log10f, default: log10)(v)
#define SIN(v)       _Generic((v), float: ew_sinf, default: sin)(v)
#define COS(v)       _Generic((v), float: ew_cosf, default: cos)(v)
#define TAN(v)       _Generic((v), float: ew_tanf, default: tan)(v)
#define ASIN(v)      _Generic((v), float: ew_asinf, default: asin)(v)
#define ACOS(v)      _Generic((v), float: ew_acosf, default: acos)(v)
#define ATAN(v)      _Generic((v), float: ew_atanf, default: atan)(v)
#define SINH(v)      _Generic((v), float: ew_sinhf, default: sinh)(v)
#define COSH(v)      _Generic((v), float: ew_coshf, default: cosh)(v)
#define ATANH(v)     _Generic((v), float: ew_atanhf, default: atanh)(v)
#define ERF_GELU(v)  _Generic((v), float: ew_erf_gelu_f, default: erf)(v)
#define FLOOR(v)     _Generic((v), float: ew_floorf, default: floor)(v)
#define CEIL(v)      _Generic((v), float: ew_ceilf, default: ceil)(v)
#define TRUNC(v)     _Generic((v), float: ew_truncf, default: trunc)(v)
#define SEL(c, a, b) _Generic((a), float: ew_self, double: ew_seld, default: ew_seli)((c), (a), (b))
#define MAXN(a, b)   _Generic((a), float: ew_maxnf, double: ew_maxnd, default: tpu_max_i)(a, b)
#define MINN(a, b)   _Generic((a), float: ew_minnf, double: ew_minnd, default: tpu_min_i)(a, b)

EW_INLINE int64_t ew_seli(int c, int64_t a, int64_t b) { return c ? a : b; }
EW_INLINE float ew_maxnf(float a, float b) { return ew_self((a > b) | (a != a), a, b); }
EW_INLINE double ew_maxnd(double a, double b) { return ew_seld((a > b) | (a != a), a, b); }
EW_INLINE float ew_minnf(float a, float b) { return ew_self((a < b) | (a != a), a, b); }
EW_INLINE double ew_minnd(double a, double b) { return ew_seld((a < b) | (a != a), a, b); }

/* ---- tile functions: one op over n elements, from its ops.def expression ----
 * n is EW_TILE in the kernel; the graph interpreter's tiles may be longer,
 * always a multiple of EW_TILE: the loops run blocks of that fixed trip
 * count, which is what gcc -O2 vectorizes (its cheap cost model leaves a
 * loop of unknown count scalar). */
#define EW_LOOP(i)                          \
    for (int b_ = 0; b_ < n; b_ += EW_TILE) \
        for (int i = b_; i < b_ + EW_TILE; i++)

/* pow with a host-scalar exponent: strength-reduced as PyTorch's CPU kernel
 * does (x*x for 2 ...); checked against the reference's pow(). */
#define EW_POW_SCALAR(T)                                               \
    switch (p->pow_mode) {                                             \
    case EW_POW_SQ: EW_LOOP(i) O[i] = X[i] * X[i]; return 0;           \
    case EW_POW_CUBE: EW_LOOP(i) O[i] = X[i] * X[i] * X[i]; return 0;  \
    case EW_POW_RECIP: EW_LOOP(i) O[i] = (T)1 / X[i]; return 0;        \
    case EW_POW_RSQ: EW_LOOP(i) O[i] = (T)1 / (X[i] * X[i]); return 0; \
    default: break;                                                    \
    }

/* EW_OUT(v): what a tile function stores for result v (v itself, or v
 * rounded to bfloat16 in ew_tile_f_bf16). */
#define EW_OUT(v) (v)
#define TPU_EXPR_BODY(e)                \
    EW_LOOP(i) {                        \
        T x = X[i], y = Y[i], z = Z[i]; \
        (void)x;                        \
        (void)y;                        \
        (void)z;                        \
        O[i] = EW_OUT((T)(e));          \
    }
#define TPU_EXPR_PARAM_I(s) ((T)p->pi[s])

#define EW_TILE_F_ARGS                                                                                              \
    tpu_op op, int n, float *restrict O, const float *restrict X, const float *restrict Y, const float *restrict Z, \
        const ew_par *p
#define EW_TILE_F_PASS op, n, O, X, Y, Z, p
static int ew_tile_f(EW_TILE_F_ARGS);

/* sin, cos, tan, sinc of arguments at or beyond EW_TRIG_MAX (and inf,
 * NaN) redone with libm after the vector loop: rare, so the loop only
 * scans the tile's bits for one. */
static void ew_trig_big(tpu_op op, int n, float *O, const float *X, bool bf16) {
    for (int i = 0; i < n; i++) {
        float x = X[i], px = op == TPU_OP_SINC ? (float)TPU_PI * x : x; /* (sinc's own product) */
        if (fabsf(px) < EW_TRIG_MAX) continue;
        float v = op == TPU_OP_SIN ? sinf(x) : op == TPU_OP_COS ? cosf(x) : op == TPU_OP_TAN ? tanf(x) : sinf(px) / px;
        O[i] = bf16 ? ew_round_bf16(v) : v;
    }
}
EW_INLINE void ew_trig_fix(tpu_op op, int n, float *restrict O, const float *restrict X, bool bf16) {
    if (op != TPU_OP_SIN && op != TPU_OP_COS && op != TPU_OP_TAN && op != TPU_OP_SINC) return;
    const float s = op == TPU_OP_SINC ? (float)TPU_PI : 1.0f;
    const int32_t lim = ew_f2b(EW_TRIG_MAX);
    int32_t any = 0;
    EW_LOOP(i) any |= (ew_f2b(s * X[i]) & 0x7fffffff) >= lim; /* (NaN and inf included) */
    if (any) ew_trig_big(op, n, O, X, bf16);
}

EW_INLINE int ew_tile_f_body(EW_TILE_F_ARGS) {
    typedef float T;
    if (op == TPU_OP_POW) EW_POW_SCALAR(float)
    switch (op) {
#define TPU_EXPR_FORM       TPU_EXPR_F
#define TPU_EXPR_PARAM_F(s) p->ff[s]
#include "base/expr-cases.h"
    case TPU_OP_COPY: EW_LOOP(i) O[i] = X[i]; break; /* a cast */
#undef TPU_EXPR_PARAM_F
    default: EW_LOOP(i) O[i] = NAN; break;
    }
    ew_trig_fix(op, n, O, X, false);
    return 0;
}

/* ew_tile_f with each result rounded to bfloat16 in the same loop (the
 * graph interpreter's bf16 results: one pass over the tile, not two). */
#undef EW_OUT
#define EW_OUT(v) ew_round_bf16(v)
EW_INLINE int ew_tile_f_bf16_body(EW_TILE_F_ARGS) {
    typedef float T;
    if (op == TPU_OP_POW && p->pow_mode != EW_POW_GENERIC) {
        ew_tile_f(op, n, O, X, Y, Z, p);
        EW_LOOP(i) O[i] = ew_round_bf16(O[i]);
        return 0;
    }
    switch (op) {
#define TPU_EXPR_PARAM_F(s) p->ff[s]
#include "base/expr-cases.h"
    case TPU_OP_COPY: EW_LOOP(i) O[i] = ew_round_bf16(X[i]); break;
#undef TPU_EXPR_PARAM_F
    default: EW_LOOP(i) O[i] = NAN; break;
    }
    ew_trig_fix(op, n, O, X, true);
    return 0;
}
#undef EW_OUT
#define EW_OUT(v) (v)

/* The float tile functions per ISA, with FMA: target_clones cannot ask for
 * AVX2 and FMA in one clone (and its AVX-512F clone has no FMA either), so
 * the variants are spelled out and picked once from the CPU's features.
 * VM_MAD is fmaf, so every variant gives the same bits (the baseline's is a
 * libm call: slow, and only for CPUs without AVX2 and FMA); Strict and
 * Fused run the same function, so they agree bit for bit on any host. */
typedef int ew_tile_f_fn(EW_TILE_F_ARGS);
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__) && !defined(TPU_NO_CLONES)
__attribute__((target("avx512f,fma"))) static int ew_tile_f_512(EW_TILE_F_ARGS) {
    return ew_tile_f_body(EW_TILE_F_PASS);
}
__attribute__((target("avx512f,fma"))) static int ew_tile_f_bf16_512(EW_TILE_F_ARGS) {
    return ew_tile_f_bf16_body(EW_TILE_F_PASS);
}
__attribute__((target("avx2,fma"))) static int ew_tile_f_256(EW_TILE_F_ARGS) { return ew_tile_f_body(EW_TILE_F_PASS); }
__attribute__((target("avx2,fma"))) static int ew_tile_f_bf16_256(EW_TILE_F_ARGS) {
    return ew_tile_f_bf16_body(EW_TILE_F_PASS);
}
#define EW_ISA_VARIANTS 1
#endif
static int ew_tile_f_base(EW_TILE_F_ARGS) { return ew_tile_f_body(EW_TILE_F_PASS); }
static int ew_tile_f_bf16_base(EW_TILE_F_ARGS) { return ew_tile_f_bf16_body(EW_TILE_F_PASS); }

static _Atomic int ew_isa = -1; /* TPU_EW_ISA_*: picked on first use, or set by tests */

void tpu_ew_set_isa(int isa) { atomic_store_explicit(&ew_isa, isa, memory_order_relaxed); }

int tpu_ew_get_isa(void) {
    int isa = atomic_load_explicit(&ew_isa, memory_order_relaxed);
    if (isa >= 0) return isa;
    unsigned f = tpu_cpu_features();
    isa = TPU_EW_ISA_BASE;
#ifdef EW_ISA_VARIANTS
    if ((f & TPU_CPU_FMA) && (f & TPU_CPU_AVX512F))
        isa = TPU_EW_ISA_AVX512_FMA;
    else if ((f & TPU_CPU_FMA) && (f & TPU_CPU_AVX2))
        isa = TPU_EW_ISA_AVX2_FMA;
#else
    (void)f;
#endif
    atomic_store_explicit(&ew_isa, isa, memory_order_relaxed);
    return isa;
}

static ew_tile_f_fn *ew_variant(bool bf16) {
    switch (tpu_ew_get_isa()) {
#ifdef EW_ISA_VARIANTS
    case TPU_EW_ISA_AVX512_FMA: return bf16 ? ew_tile_f_bf16_512 : ew_tile_f_512;
    case TPU_EW_ISA_AVX2_FMA: return bf16 ? ew_tile_f_bf16_256 : ew_tile_f_256;
#endif
    default: return bf16 ? ew_tile_f_bf16_base : ew_tile_f_base;
    }
}

static int ew_tile_f(EW_TILE_F_ARGS) { return ew_variant(false)(EW_TILE_F_PASS); }
static void ew_tile_f_bf16(EW_TILE_F_ARGS) { ew_variant(true)(EW_TILE_F_PASS); }

static EW_CLONES int ew_tile_d(tpu_op op, int n, double *restrict O, const double *restrict X, const double *restrict Y,
                               const double *restrict Z, const ew_par *p) {
    typedef double T;
    if (op == TPU_OP_POW) EW_POW_SCALAR(double)
    switch (op) {
#define TPU_EXPR_PARAM_F(s) p->fd[s]
#include "base/expr-cases.h"
    case TPU_OP_COPY: EW_LOOP(i) O[i] = X[i]; break; /* a cast */
#undef TPU_EXPR_FORM
#undef TPU_EXPR_PARAM_F
    default: EW_LOOP(i) O[i] = NAN; break;
    }
    return 0;
}

/* Integer domain: wrapping int64. Padding past a row's end reads 1 (see
 * ew_input_tile), so divisions there never fail. */
static EW_CLONES int ew_tile_i(tpu_op op, int n, int64_t *restrict O, const int64_t *restrict X,
                               const int64_t *restrict Y, const int64_t *restrict Z, const ew_par *p) {
    typedef int64_t T;
    const bool cbool = p->cbool;
    int expr_err = 0;
    (void)cbool;
    switch (op) {
#define TPU_EXPR_FORM       TPU_EXPR_I
#define TPU_EXPR_PARAM_F(s) p->fi[s]
#include "base/expr-cases.h"
    case TPU_OP_COPY: EW_LOOP(i) O[i] = X[i]; break; /* a cast */
#undef TPU_EXPR_FORM
#undef TPU_EXPR_PARAM_F
    default: EW_LOOP(i) O[i] = 0; break;
    }
    return expr_err;
}
#undef TPU_EXPR_BODY
#undef TPU_EXPR_PARAM_I
#undef EW_OUT

/* ---- the tile walker ---- */

static void *ew_buf(ew_ctx *c, ew_bufs *b, int k) {
    return c->dom == EW_DOM_F ? (void *)b->f[k] : c->dom == EW_DOM_D ? (void *)b->d[k] : (void *)b->i[k];
}

static void ew_load(ew_ctx *c, void *d, const char *s, int64_t st, int n, tpu_dtype dt) {
    if (c->dom == EW_DOM_F)
        tpu_tile_load_f32(d, s, st, n, dt);
    else if (c->dom == EW_DOM_D)
        tpu_tile_load_f64(d, s, st, n, dt);
    else
        tpu_tile_load_i64(d, s, st, n, dt);
}

static void ew_prefill_scalars(ew_ctx *c, ew_bufs *b) {
    for (int k = 1; k <= c->nin; k++) {
        if (!c->scalar[k]) continue;
        for (int i = 0; i < EW_TILE; i++) {
            if (c->dom == EW_DOM_F)
                b->f[k][i] = (float)c->sf[k];
            else if (c->dom == EW_DOM_D)
                b->d[k][i] = c->sf[k];
            else
                b->i[k][i] = c->si[k];
        }
    }
}

/* Pointer to input k's tile: in place, or gathered into its buffer. */
static const void *ew_input_tile(ew_ctx *c, ew_bufs *b, int k, const int64_t *off, int64_t inner, int len,
                                 const char **cached) {
    void *buf = ew_buf(c, b, k);
    if (c->scalar[k]) return buf;
    int64_t s = c->st[k][c->nd - 1];
    const char *src = c->base[k] + (size_t)(off[k] + inner * s) * c->esz[k];
    if (c->direct[k] && len == EW_TILE) return src;
    if (s == 0) {
        if (cached[k] != src) ew_load(c, buf, src, 0, EW_TILE, c->dt[k]);
        cached[k] = src;
        return buf;
    }
    ew_load(c, buf, src, s, len, c->dt[k]);
    if (len < EW_TILE && c->dom == EW_DOM_I) { /* 1, not 0: a divisor there must not fail */
        for (int i = len; i < EW_TILE; i++) ((int64_t *)buf)[i] = 1;
    } else if (len < EW_TILE) {
        size_t es = c->dom == EW_DOM_F ? 4 : 8;
        memset((char *)buf + (size_t)len * es, 0, (size_t)(EW_TILE - len) * es);
    }
    return buf;
}

static void ew_compute_tile(ew_ctx *c, ew_bufs *b, const int64_t *off, int64_t inner, int len, int64_t pos,
                            const char **cached) {
    const void *in[3];
    for (int j = 0; j < 3; j++)
        in[j] = j < c->nin ? ew_input_tile(c, b, j + 1, off, inner, len, cached) : ew_buf(c, b, 3);
    int64_t s0 = c->st[0][c->nd - 1];
    char *dst = c->base[0] + (size_t)(off[0] + inner * s0) * c->esz[0];
    bool odirect = c->direct[0] && len == EW_TILE;
    void *o = odirect ? (void *)dst : ew_buf(c, b, 0);
    if (c->op == TPU_OP_ARANGE) {
        double *od = o;
        for (int i = 0; i < len; i++) od[i] = c->par.fd[0] + (double)(pos + i) * c->par.fd[1];
    } else if (c->dom == EW_DOM_F) {
        ew_tile_f(c->op, EW_TILE, o, in[0], in[1], in[2], &c->par);
    } else if (c->dom == EW_DOM_D) {
        ew_tile_d(c->op, EW_TILE, o, in[0], in[1], in[2], &c->par);
    } else {
        int err = ew_tile_i(c->op, EW_TILE, o, in[0], in[1], in[2], &c->par);
        if (err) {
            atomic_store_explicit(&c->err, err, memory_order_relaxed);
            return;
        }
    }
    if (odirect) return;
    if (c->dom == EW_DOM_F)
        tpu_tile_store_f32(dst, s0, o, len, c->dt[0]);
    else if (c->dom == EW_DOM_D)
        tpu_tile_store_f64(dst, s0, o, len, c->dt[0]);
    else
        tpu_tile_store_i64(dst, s0, o, len, c->dt[0]);
}

/* FILL: replicate the value's bytes along the row. */
static void ew_fill_row(ew_ctx *c, const int64_t *off, int64_t inner, int64_t len) {
    size_t es = c->esz[0];
    int64_t s0 = c->st[0][c->nd - 1];
    char *dst = c->base[0] + (size_t)(off[0] + inner * s0) * es;
    if (s0 != 1) {
        for (int64_t i = 0; i < len; i++) memcpy(dst + (size_t)(i * s0) * es, c->pattern, es);
        return;
    }
    if (c->pattern_zero) {
        memset(dst, 0, (size_t)len * es);
        return;
    }
    for (int64_t i = 0; i < len; i += EW_TILE) {
        int64_t m = len - i < EW_TILE ? len - i : EW_TILE;
        memcpy(dst + (size_t)i * es, c->pattern, (size_t)m * es);
    }
}

/* COPY between equal dtypes: bytes only. */
static void ew_copy_row(ew_ctx *c, const int64_t *off, int64_t inner, int64_t len) {
    size_t es = c->esz[0];
    int64_t s0 = c->st[0][c->nd - 1], s1 = c->st[1][c->nd - 1];
    char *dst = c->base[0] + (size_t)(off[0] + inner * s0) * es;
    const char *src = c->base[1] + (size_t)(off[1] + inner * s1) * es;
    if (s0 == 1 && s1 == 1) {
        memmove(dst, src, (size_t)len * es);
        return;
    }
    switch (es) {
    case 1:
        for (int64_t i = 0; i < len; i++) dst[i * s0] = src[i * s1];
        break;
    case 2:
        for (int64_t i = 0; i < len; i++) ((uint16_t *)dst)[i * s0] = ((const uint16_t *)src)[i * s1];
        break;
    case 4:
        for (int64_t i = 0; i < len; i++) ((uint32_t *)dst)[i * s0] = ((const uint32_t *)src)[i * s1];
        break;
    default:
        for (int64_t i = 0; i < len; i++) ((uint64_t *)dst)[i * s0] = ((const uint64_t *)src)[i * s1];
        break;
    }
}

static bool ew_raw_copy(const ew_ctx *c) { return c->op == TPU_OP_COPY && !c->scalar[1] && c->dt[0] == c->dt[1]; }

/* ---- transposing copy: x.t().contiguous() ---- */

/* A raw copy whose output is contiguous along the last dim while the input
 * is contiguous along the one before: copy EW_TT x EW_TT tiles so that both
 * sides stay in cache, instead of a strided gather per output row. */
#define EW_TT 8

static bool ew_is_transpose(const ew_ctx *c) {
    int nd = c->nd;
    return ew_raw_copy(c) && nd >= 2 && c->st[0][nd - 1] == 1 && c->st[1][nd - 2] == 1 && c->st[1][nd - 1] > EW_TT &&
           c->sz[nd - 1] >= EW_TT && c->sz[nd - 2] >= EW_TT;
}

#define EW_TILE_COPY(T)                                    \
    for (int64_t i = i0; i < i1; i++) {                    \
        T *d = (T *)dst + (i - i0) * so;                   \
        const T *s = (const T *)src + (i - i0);            \
        for (int64_t j = 0; j < nj; j++) d[j] = s[j * si]; \
    }                                                      \
    break

/* Tile t: outer index, row block, column block of the last two dims. */
static void ew_transpose_tile(const ew_ctx *c, int64_t t) {
    int nd = c->nd;
    int64_t R = c->sz[nd - 2], C = c->sz[nd - 1];
    int64_t nbr = (R + EW_TT - 1) / EW_TT, nbc = (C + EW_TT - 1) / EW_TT;
    int64_t bc = t % nbc, br = (t / nbc) % nbr, outer = t / nbc / nbr;
    int64_t off0 = 0, off1 = 0;
    for (int d = nd - 3; d >= 0; d--) {
        int64_t i = outer % c->sz[d];
        outer /= c->sz[d];
        off0 += i * c->st[0][d];
        off1 += i * c->st[1][d];
    }
    int64_t i0 = br * EW_TT, i1 = i0 + EW_TT < R ? i0 + EW_TT : R, j0 = bc * EW_TT;
    int64_t nj = C - j0 < EW_TT ? C - j0 : EW_TT, so = c->st[0][nd - 2], si = c->st[1][nd - 1];
    size_t es = c->esz[0];
    char *dst = c->base[0] + (size_t)(off0 + i0 * so + j0) * es;
    const char *src = c->base[1] + (size_t)(off1 + i0 + j0 * si) * es;
    switch (es) {
    case 1: EW_TILE_COPY(uint8_t);
    case 2: EW_TILE_COPY(uint16_t);
    case 4: EW_TILE_COPY(uint32_t);
    default: EW_TILE_COPY(uint64_t);
    }
}

static void ew_transpose_tiles(void *ctx, int64_t b, int64_t e) {
    for (int64_t t = b; t < e; t++) ew_transpose_tile(ctx, t);
}

static void ew_transpose_copy(ew_ctx *c) {
    int nd = c->nd;
    int64_t R = c->sz[nd - 2], C = c->sz[nd - 1];
    int64_t ntiles = c->numel / (R * C) * ((R + EW_TT - 1) / EW_TT) * ((C + EW_TT - 1) / EW_TT);
    tpu_parallel_for(ntiles, EW_GRAIN / (EW_TT * EW_TT), ew_transpose_tiles, c);
}

/* Walk output elements [lo, hi) in row-major order, a chunk at a time. */
static void ew_run_range(ew_ctx *c, ew_bufs *b, int64_t lo, int64_t hi) {
    int nd = c->nd, nop = c->nin + 1;
    int64_t n0 = c->sz[nd - 1], rest = lo / n0, inner = lo % n0;
    int64_t idx[TPU_MAX_DIMS] = {0}, off[EW_NOP] = {0};
    for (int d = nd - 2; d >= 0; d--) {
        idx[d] = rest % c->sz[d];
        rest /= c->sz[d];
    }
    for (int k = 0; k < nop; k++)
        for (int d = 0; d < nd - 1; d++) off[k] += idx[d] * c->st[k][d];
    const char *cached[EW_NOP] = {0};
    for (int64_t pos = lo; pos < hi;) {
        int64_t len = n0 - inner < hi - pos ? n0 - inner : hi - pos;
        if (len > c->chunk_max) len = c->chunk_max;
        if (c->op == TPU_OP_FILL)
            ew_fill_row(c, off, inner, len);
        else if (ew_raw_copy(c))
            ew_copy_row(c, off, inner, len);
        else
            ew_compute_tile(c, b, off, inner, (int)len, pos, cached);
        pos += len;
        inner += len;
        if (inner < n0) continue;
        inner = 0;
        for (int d = nd - 2; d >= 0; d--) {
            for (int k = 0; k < nop; k++) off[k] += c->st[k][d];
            if (++idx[d] < c->sz[d]) break;
            for (int k = 0; k < nop; k++) off[k] -= idx[d] * c->st[k][d];
            idx[d] = 0;
        }
    }
}

static void ew_blocks(void *ctx, int64_t b0, int64_t b1) {
    ew_ctx *c = ctx;
    _Alignas(64) ew_bufs bufs;
    ew_prefill_scalars(c, &bufs);
    for (int64_t blk = b0; blk < b1; blk++) {
        int64_t lo = blk * EW_GRAIN, hi = lo + EW_GRAIN < c->numel ? lo + EW_GRAIN : c->numel;
        ew_run_range(c, &bufs, lo, hi);
        if (atomic_load_explicit(&c->err, memory_order_relaxed)) return;
    }
}

/* ---- setup ---- */

/* The launch's iteration space, in the output's memory order (ARANGE: in
 * its logical order, which its values follow). Returns numel. */
static int64_t ew_coalesce(ew_ctx *c, const tpu_kargs *a) {
    const tpu_tensor *t[EW_NOP];
    for (int k = 0; k <= c->nin; k++) t[k] = &a->t[k];
    if (c->op == TPU_OP_ARANGE) return tpu_tile_coalesce(&a->t[0], c->nin + 1, t, c->sz, c->st, &c->nd);
    return tpu_tile_coalesce_by_out(&a->t[0], c->nin + 1, t, c->sz, c->st, &c->nd);
}

static void ew_setup_params(ew_par *p, ew_dom dom, int nin, const tpu_kargs *a) {
    for (int k = 0; k < 6; k++) {
        p->ff[k] = (float)a->p.f[k];
        p->fd[k] = a->p.f[k];
        p->fi[k] = tpu_d2i(a->p.f[k]);
        p->pi[k] = a->p.i[k];
    }
    p->cbool = a->p.compute_dtype == TPU_BOOL;
    p->pow_mode = EW_POW_GENERIC;
    if (a->op == TPU_OP_POW && nin == 2 && a->t[2].is_scalar && dom != EW_DOM_I) {
        double e = a->t[2].f;
        p->pow_mode = e == -1   ? EW_POW_RECIP
                      : e == 2  ? EW_POW_SQ
                      : e == 3  ? EW_POW_CUBE
                      : e == -2 ? EW_POW_RSQ
                                : EW_POW_GENERIC;
    }
}

static tpu_status ew_setup_domain(ew_ctx *c, tpu_kargs *a) {
    if (c->op == TPU_OP_FILL) return TPU_OK;
    if (c->op == TPU_OP_ARANGE) {
        c->dom = EW_DOM_D;
        return TPU_OK;
    }
    if (c->op == TPU_OP_COPY) {
        tpu_dtype s = c->dt[1];
        bool exact_f = s != TPU_F64 && !c->scalar[1]; /* float scalars arrive as double */
        c->dom = !tpu_dtype_is_float(s) ? EW_DOM_I : exact_f ? EW_DOM_F : EW_DOM_D;
        return TPU_OK;
    }
    tpu_dtype cdt = (tpu_dtype)a->p.compute_dtype;
    if ((unsigned)cdt >= TPU_DTYPE_REAL_COUNT)
        return tpu_kernel_fail(a, "%s: bad compute dtype %d", tpu_op_name(a->op), (int)cdt);
    c->dom = cdt == TPU_F64                 ? EW_DOM_D
             : tpu_dtype_is_float(cdt)      ? EW_DOM_F
             : tpu_op_infos[a->op].int_form ? EW_DOM_I
                                            : EW_DOM_D;
    if (c->dom != EW_DOM_I && !(tpu_op_infos[a->op].dtypes & DT_FLOAT)) {
        tpu_kernel_fail(a, "%s: not supported for floating point compute dtype", tpu_op_name(a->op));
        return TPU_ERROR_NOT_SUPPORTED;
    }
    return TPU_OK;
}

/* FILL's value as EW_TILE copies of the output element's bytes. */
static void ew_setup_fill(ew_ctx *c, const tpu_kargs *a) {
    const tpu_tensor *s = &a->t[1];
    tpu_dtype odt = c->dt[0];
    unsigned char elem[8] = {0};
    if (tpu_dtype_is_float(odt)) {
        double v = s->is_scalar ? s->f : tpu_load_f64(tpu_elem_ptr(s, 0), (tpu_dtype)s->dtype);
        tpu_store_f64(elem, odt, v);
    } else {
        int64_t v = s->is_scalar ? s->i : tpu_load_i64(tpu_elem_ptr(s, 0), (tpu_dtype)s->dtype);
        tpu_store_i64(elem, odt, v);
    }
    size_t es = c->esz[0];
    c->pattern_zero = true;
    for (size_t k = 0; k < es; k++) c->pattern_zero = c->pattern_zero && elem[k] == 0;
    for (int i = 0; i < EW_TILE; i++) memcpy(c->pattern + (size_t)i * es, elem, es);
}

/* Operand k is used in place when its inner stride is 1 and its dtype is
 * the domain's own; the output also must not share storage with an input. */
static void ew_setup_direct(ew_ctx *c, const tpu_kargs *a) {
    tpu_dtype native = c->dom == EW_DOM_F ? TPU_F32 : c->dom == EW_DOM_D ? TPU_F64 : TPU_I64;
    for (int k = 0; k <= c->nin; k++) c->direct[k] = !c->scalar[k] && c->dt[k] == native && c->st[k][c->nd - 1] == 1;
    for (int k = 1; k <= c->nin; k++)
        if (!c->scalar[k] && a->t[k].base == a->t[0].base) c->direct[0] = false;
}

/* Capture operands, pick the domain, coalesce. Leaves numel 0 for nothing to do. */
static tpu_status ew_setup(ew_ctx *c, tpu_kargs *a) {
    int nin = a->n - 1;
    int nin_expected = a->op == TPU_OP_ARANGE ? 0 : a->op == TPU_OP_FILL || a->op == TPU_OP_COPY ? 1 : -1;
    if (tpu_op_family_of(a->op) != TPU_FAM_EW || nin < 0 || nin > 3 || (nin_expected >= 0 && nin != nin_expected) ||
        (nin_expected < 0 && nin < 1))
        return tpu_kernel_fail(a, "%s: bad elementwise launch (%d operands)", tpu_op_name(a->op), a->n);
    memset(c, 0, sizeof *c);
    c->op = a->op;
    c->nin = a->op == TPU_OP_FILL ? 0 : nin; /* FILL's value goes into c->pattern */
    for (int k = 0; k <= c->nin; k++) {
        const tpu_tensor *t = &a->t[k];
        c->dt[k] = (tpu_dtype)t->dtype;
        c->esz[k] = tpu_dtype_size(c->dt[k]);
        c->scalar[k] = t->is_scalar;
        c->sf[k] = t->f;
        c->si[k] = t->i;
        c->base[k] = t->is_scalar ? NULL : (char *)t->base + (size_t)t->offset * c->esz[k];
    }
    tpu_status st = ew_setup_domain(c, a);
    if (st != TPU_OK) return st;
    c->numel = ew_coalesce(c, a);
    if (c->numel == 0) return TPU_OK;
    ew_setup_params(&c->par, c->dom, c->nin, a);
    ew_setup_direct(c, a);
    c->chunk_max = EW_TILE;
    if (c->op == TPU_OP_FILL) {
        ew_setup_fill(c, a);
        c->chunk_max = INT64_MAX;
    } else if (ew_raw_copy(c)) {
        c->chunk_max = INT64_MAX;
    }
    atomic_init(&c->err, TPU_EXPR_OK);
    return TPU_OK;
}

tpu_status tpu_k_elementwise(tpu_kargs *a) {
    ew_ctx c;
    tpu_status st = ew_setup(&c, a);
    if (st != TPU_OK || c.numel == 0) return st;
    if (ew_is_transpose(&c)) {
        ew_transpose_copy(&c);
        return TPU_OK;
    }
    tpu_parallel_for((c.numel + EW_GRAIN - 1) / EW_GRAIN, 1, ew_blocks, &c);
    switch (atomic_load(&c.err)) {
    case TPU_EXPR_ERR_ZERODIV: return tpu_kernel_fail(a, "ZeroDivisionError");
    default: return TPU_OK;
    }
}

/* ---- one op over one tile, for the graph floor's block interpreter ---- */

bool tpu_ew_prepare_f(const tpu_kargs *a, tpu_ew_par *p) {
    tpu_op op = a->op;
    int nin = a->n - 1;
    if (tpu_op_family_of(op) != TPU_FAM_EW || op == TPU_OP_FILL || op == TPU_OP_ARANGE || nin < 1 || nin > 3)
        return false;
    if (op == TPU_OP_COPY) { /* the float32 domain exactly when ew_setup_domain picks it */
        tpu_dtype s = (tpu_dtype)a->t[1].dtype;
        if (a->t[1].is_scalar || !tpu_dtype_is_float(s) || s == TPU_F64) return false;
    } else {
        tpu_dtype cdt = (tpu_dtype)a->p.compute_dtype;
        if (cdt != TPU_F32 && cdt != TPU_F16 && cdt != TPU_BF16) return false;
        if (!(tpu_op_infos[op].dtypes & DT_FLOAT)) return false;
    }
    memset(p, 0, sizeof *p);
    ew_setup_params(p, EW_DOM_F, nin, a);
    return true;
}

void tpu_ew_tile_f(tpu_op op, int n, float *restrict o, const float *restrict x, const float *restrict y,
                   const float *restrict z, const tpu_ew_par *p) {
    ew_tile_f(op, n, o, x, y, z, p);
}

void tpu_ew_tile_f_bf16(tpu_op op, int n, float *restrict o, const float *restrict x, const float *restrict y,
                        const float *restrict z, const tpu_ew_par *p) {
    ew_tile_f_bf16(op, n, o, x, y, z, p);
}
