/* specfun-poly-impl.h - the orthogonal polynomials of torch.special for
 * ops.def's expressions (base/expr-impl.h names them CHEBYSHEV_T/U/V/W,
 * SHIFTED_CHEBYSHEV_T/U/V/W, HERMITE_H, HERMITE_HE, LAGUERRE_L, LEGENDRE_P;
 * binary ops over (x, n)).
 *
 * PyTorch's CPU kernels (ATen/native/Math.h) step for step: the same special
 * cases, the same closed forms for |x| < 1 and large n (cos(n acos x) and
 * kin), evaluated in the op's compute type T (float for f32, double for f64)
 * as the CPU evaluates them, so they round the same way; the three-term
 * recurrences (their first terms included: 2x - 1 is exact in double for a
 * float x) run in double and are rounded once (the CPU's float
 * recurrence, contracted to FMAs or not by its compiler, is a few ulps off
 * where the recurrence cancels), with float's overflow kept: a value beyond
 * float's range becomes +-inf at that step, so the recurrence turns inf or
 * NaN and stops where the CPU's float one does. The degree n
 * is the element of the second tensor converted to int64 as the CPU's
 * conversion does on x86 (NaN, inf and out-of-range values become INT64_MIN,
 * so the polynomial is 0); n < 0 gives 0. Where PyTorch's code returns an
 * uninitialized value (x NaN with n >= 2, the recurrence never runs) this
 * returns NaN. HERMITE_H/HE are NaN beyond n = 128 (float) or 512 (double),
 * as on the CPU. Pure functions, the base floor. */
#ifndef TPU_SPECFUN_POLY_IMPL_H
#define TPU_SPECFUN_POLY_IMPL_H
#include <math.h>
#include <stdint.h>

/* x86's cvttsd2si: NaN, inf and out-of-range values give INT64_MIN. */
static inline int64_t tpu_poly_n(double v) {
    if (!(v > -9.2233720368547758e18 && v < 9.2233720368547758e18)) return INT64_MIN;
    return (int64_t)v;
}

/* A recurrence's value as the compute type holds it: beyond float's range, +-inf (OVF_f); doubles as they are. */
static inline double tpu_poly_ovf_f(double v) { return fabs(v) > 3.4028234663852886e38 ? v * INFINITY : v; }
static inline double tpu_poly_ovf_(double v) { return v; }

/* One definition per polynomial, expanded for float (suffix f) and double. */
#define TPU_POLY_DEFS_(T, S, ACOS, COS, SIN)                                                                       \
    /* T, U, V, W: one recurrence from their own first terms */                                                    \
    static inline T tpu_chebyshev_rec##S(double x, double q, int64_t n) {                                          \
        double p = 1, r = q = tpu_poly_ovf_##S(q);                                                                 \
        for (int64_t k = 2; k <= n && q == q; k++) {                                                               \
            r = tpu_poly_ovf_##S((x + x) * q - p);                                                                 \
            p = q;                                                                                                 \
            q = r;                                                                                                 \
        }                                                                                                          \
        return (T)r;                                                                                               \
    }                                                                                                              \
    static inline T tpu_chebyshev_t##S(T x, int64_t n) {                                                           \
        if (n < 0) return 0;                                                                                       \
        if (fabs(x) == 1) return (x > 0 || n % 2 == 0) ? 1 : -1;                                                   \
        if (n > 6 && fabs(x) < 1) return COS((T)n * ACOS(x));                                                      \
        if (n == 0) return 1;                                                                                      \
        if (n == 1) return x;                                                                                      \
        return tpu_chebyshev_rec##S(x, x, n);                                                                      \
    }                                                                                                              \
    static inline T tpu_chebyshev_u##S(T x, int64_t n) {                                                           \
        if (n < 0) return 0;                                                                                       \
        if (fabs(x) == 1) return (x > 0 || n % 2 == 0) ? (T)(n + 1) : (T) - (n + 1);                               \
        if (n > 8 && fabs(x) < 1) {                                                                                \
            if (SIN(ACOS(x)) != 0) return SIN((T)(n + 1) * ACOS(x)) / SIN(ACOS(x));                                \
            return (T)(n + 1) * COS((T)(n + 1) * ACOS(x)) / x;                                                     \
        }                                                                                                          \
        if (n == 0) return 1;                                                                                      \
        if (n == 1) return x + x;                                                                                  \
        return tpu_chebyshev_rec##S(x, (double)x + x, n);                                                          \
    }                                                                                                              \
    static inline T tpu_chebyshev_v##S(T x, int64_t n) {                                                           \
        if (n < 0) return 0;                                                                                       \
        if (fabs(x) == 1) return x > 0 ? 1 : n % 2 == 0 ? (T)(n + n + 1) : (T) - (n + n + 1);                      \
        if (n > 8 && fabs(x) < 1) {                                                                                \
            if (SIN(ACOS(x) / 2) != 1) return COS(((T)n + (T)0.5) * ACOS(x)) / COS(ACOS(x) / 2);                   \
            return n % 2 == 0 ? (T)(n + n + 1) : (T) - (n + n + 1);                                                \
        }                                                                                                          \
        if (n == 0) return 1;                                                                                      \
        if (n == 1) return x + x - 1;                                                                              \
        return tpu_chebyshev_rec##S(x, (double)x + x - 1, n);                                                      \
    }                                                                                                              \
    static inline T tpu_chebyshev_w##S(T x, int64_t n) {                                                           \
        if (n < 0) return 0;                                                                                       \
        if (fabs(x) == 1) return x > 0 ? (T)(n + n + 1) : n % 2 == 0 ? 1 : -1;                                     \
        if (n > 8 && fabs(x) < 1) {                                                                                \
            if (COS(ACOS(x) / 2) != 1) return SIN(((T)n + (T)0.5) * ACOS(x)) / SIN(ACOS(x) / 2);                   \
            return x > 0 ? (T)(n + n + 1) : n % 2 == 0 ? 1 : -1;                                                   \
        }                                                                                                          \
        if (n == 0) return 1;                                                                                      \
        if (n == 1) return x + x + 1;                                                                              \
        return tpu_chebyshev_rec##S(x, (double)x + x + 1, n);                                                      \
    }                                                                                                              \
    /* shifted: the same in y = 2x - 1, with x == 1 and x == 0 exact */                                            \
    static inline T tpu_shifted_chebyshev_t##S(T x, int64_t n) {                                                   \
        T y = x + x - 1;               /* the closed forms' argument, in T as the CPU's */                         \
        double yd = (double)x + x - 1; /* the recurrence's, exact for float x */                                   \
        if (n < 0) return 0;                                                                                       \
        if (x == 1) return 1;                                                                                      \
        if (x == 0) return n % 2 == 0 ? 1 : -1;                                                                    \
        if (n > 6 && fabs(y) < 1) return COS((T)n * ACOS(y));                                                      \
        if (n == 0) return 1;                                                                                      \
        if (n == 1) return y;                                                                                      \
        return tpu_chebyshev_rec##S(yd, yd, n);                                                                    \
    }                                                                                                              \
    static inline T tpu_shifted_chebyshev_u##S(T x, int64_t n) {                                                   \
        T y = x + x - 1;               /* the closed forms' argument, in T as the CPU's */                         \
        double yd = (double)x + x - 1; /* the recurrence's, exact for float x */                                   \
        if (n < 0) return 0;                                                                                       \
        if (x == 1) return (T)(n + 1);                                                                             \
        if (x == 0) return n % 2 == 0 ? (T)(n + 1) : (T) - (n + 1);                                                \
        if (n > 6 && fabs(y) < 1) {                                                                                \
            if (SIN(ACOS(y)) != 0) return SIN((T)(n + 1) * ACOS(y)) / SIN(ACOS(y));                                \
            return (T)(n + 1) * COS((T)(n + 1) * ACOS(y)) / y;                                                     \
        }                                                                                                          \
        if (n == 0) return 1;                                                                                      \
        if (n == 1) return y + y;                                                                                  \
        return tpu_chebyshev_rec##S(yd, yd + yd, n);                                                               \
    }                                                                                                              \
    static inline T tpu_shifted_chebyshev_v##S(T x, int64_t n) {                                                   \
        T y = x + x - 1;               /* the closed forms' argument, in T as the CPU's */                         \
        double yd = (double)x + x - 1; /* the recurrence's, exact for float x */                                   \
        if (n < 0) return 0;                                                                                       \
        if (x == 1) return 1;                                                                                      \
        if (x == 0) return n % 2 == 0 ? (T)(n + n + 1) : (T) - (n + n + 1);                                        \
        if (n > 6 && fabs(y) < 1) {                                                                                \
            if (SIN(ACOS(y) / 2) != 1) return COS(((T)n + (T)0.5) * ACOS(y)) / COS(ACOS(y) / 2);                   \
            return n % 2 == 0 ? (T)(n + n + 1) : (T) - (n + n + 1);                                                \
        }                                                                                                          \
        if (n == 0) return 1;                                                                                      \
        if (n == 1) return y + y - 1;                                                                              \
        return tpu_chebyshev_rec##S(yd, yd + yd - 1, n);                                                           \
    }                                                                                                              \
    static inline T tpu_shifted_chebyshev_w##S(T x, int64_t n) {                                                   \
        T y = x + x - 1;               /* the closed forms' argument, in T as the CPU's */                         \
        double yd = (double)x + x - 1; /* the recurrence's, exact for float x */                                   \
        if (n < 0) return 0;                                                                                       \
        if (x == 1) return (T)(n + n + 1);                                                                         \
        if (x == 0) return n % 2 == 0 ? 1 : -1;                                                                    \
        if (n > 4 && fabs(y) < 1) {                                                                                \
            if (COS(ACOS(y) / 2) != 1) return SIN(((T)n + (T)0.5) * ACOS(y)) / SIN(ACOS(y) / 2);                   \
            return n % 2 == 0 ? 1 : -1;                                                                            \
        }                                                                                                          \
        if (n == 0) return 1;                                                                                      \
        if (n == 1) return y + y + 1;                                                                              \
        return tpu_chebyshev_rec##S(yd, yd + yd + 1, n);                                                           \
    }                                                                                                              \
    static inline T tpu_hermite_h##S(T x, int64_t n) {                                                             \
        if (n < 0) return 0;                                                                                       \
        if (n == 0) return 1;                                                                                      \
        if (n == 1) return x + x;                                                                                  \
        if (n > (sizeof(T) == 4 ? 128 : 512)) return NAN;                                                          \
        double p = 1, q = tpu_poly_ovf_##S((double)x + x), r = 0;                                                  \
        for (int64_t k = 2; k < n + n; k += 2) {                                                                   \
            r = tpu_poly_ovf_##S(((double)x + x) * q - (double)k * p);                                             \
            p = q;                                                                                                 \
            q = r;                                                                                                 \
        }                                                                                                          \
        return r;                                                                                                  \
    }                                                                                                              \
    static inline T tpu_hermite_he##S(T x, int64_t n) {                                                            \
        if (n < 0) return 0;                                                                                       \
        if (n == 0) return 1;                                                                                      \
        if (n == 1) return x;                                                                                      \
        if (n > (sizeof(T) == 4 ? 128 : 512)) return NAN;                                                          \
        double p = 1, q = x, r = 0;                                                                                \
        for (int64_t k = 1; k < n; k++) {                                                                          \
            r = tpu_poly_ovf_##S(x * q - (double)k * p);                                                           \
            p = q;                                                                                                 \
            q = r;                                                                                                 \
        }                                                                                                          \
        return r;                                                                                                  \
    }                                                                                                              \
    static inline T tpu_laguerre_l##S(T x, int64_t n) {                                                            \
        if (n < 0) return 0;                                                                                       \
        if (fabs(x) == 0) return 1;                                                                                \
        if (n == 0) return 1;                                                                                      \
        if (n == 1) return 1 - x;                                                                                  \
        double p = 1, q = 1 - (double)x, r = q;                                                                    \
        for (int64_t k = 1; k < n && q == q; k++) {                                                                \
            r = tpu_poly_ovf_##S(tpu_poly_ovf_##S(((double)(k + k) + (1 - (double)x)) * q - (double)k * p) /       \
                                 (double)(k + 1));                                                                 \
            p = q;                                                                                                 \
            q = r;                                                                                                 \
        }                                                                                                          \
        return r;                                                                                                  \
    }                                                                                                              \
    static inline T tpu_legendre_p##S(T x, int64_t n) {                                                            \
        if (n < 0) return 0;                                                                                       \
        if (fabs(x) == 1) return (x > 0 || n % 2 == 0) ? 1 : -1;                                                   \
        if (n == 0) return 1;                                                                                      \
        if (n == 1) return x;                                                                                      \
        double p = 1, q = x, r = x;                                                                                \
        for (int64_t k = 1; k < n && q == q; k++) {                                                                \
            r = tpu_poly_ovf_##S(tpu_poly_ovf_##S((double)(k + k + 1) * x * q - (double)k * p) / (double)(k + 1)); \
            p = q;                                                                                                 \
            q = r;                                                                                                 \
        }                                                                                                          \
        return r;                                                                                                  \
    }
TPU_POLY_DEFS_(float, f, acosf, cosf, sinf)
TPU_POLY_DEFS_(double, , acos, cos, sin)
#undef TPU_POLY_DEFS_
#endif
