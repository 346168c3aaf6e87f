/* specfun-impl.h - special functions for ops.def's expressions (base/expr-impl.h
 * names them LGAMMA DIGAMMA POLYGAMMA ERFINV I0 I0E I1 I1E).
 *
 * Each is computed in double from its textbook definition (series,
 * recurrences, reflection, asymptotic expansions, Newton's method) and
 * rounded once to the op's dtype, so a float result is the correctly rounded
 * value almost everywhere; PyTorch's CPU kernels compute float inputs in
 * float, which is why the two can differ by an ulp. Domain conventions
 * (poles, NaN, signs of zero) follow PyTorch's:
 *   digamma(+-0) = -+inf, digamma(negative integer) = NaN;
 *   polygamma(n >= 1, x) at a non-positive integer x = +inf (n odd) or NaN
 *   from the reflection; erfinv(+-1) = +-inf, |y| > 1 gives NaN; i0 and i1
 *   of +-inf are NaN (the CPU's e^x / sqrt(x) there), their scaled forms 0.
 * lgamma uses libm's reentrant lgamma_r (the plain one writes the global
 * signgam, a data race between workers). Pure functions, the base floor. */
#ifndef TPU_SPECFUN_IMPL_H
#define TPU_SPECFUN_IMPL_H
#include <math.h>
#include <stdint.h>

/* glibc's reentrant forms (POSIX extensions -std=c11 does not declare) */
extern double lgamma_r(double, int *);
extern float lgammaf_r(float, int *);

#define TPU_PI 3.14159265358979323846

static inline float tpu_lgammaf(float x) {
    int s;
    return lgammaf_r(x, &s);
}
static inline double tpu_lgamma(double x) {
    int s;
    return lgamma_r(x, &s);
}

/* psi(x): reflection below 0, the recurrence psi(x) = psi(x+1) - 1/x up to
 * x >= 10, then ln x - 1/(2x) - sum B_2k / (2k x^2k) (Bernoulli numbers). */
static inline double tpu_digamma(double x) {
    if (x == 0) return copysign(INFINITY, -x);
    if (x != x || x == INFINITY) return x;
    if (x < 0) {
        if (x == floor(x)) return NAN;
        return tpu_digamma(1 - x) - TPU_PI / tan(TPU_PI * (x - trunc(x)));
    }
    double r = 0;
    for (; x < 10; x += 1) r -= 1 / x;
    double z = 1 / (x * x);
    double s =
        z * (1.0 / 12 -
             z * (1.0 / 120 - z * (1.0 / 252 - z * (1.0 / 240 - z * (1.0 / 132 - z * (691.0 / 32760 - z / 12))))));
    return r + log(x) - 0.5 / x - s;
}

/* psi'(x): reflection psi'(x) + psi'(1-x) = pi^2 / sin^2(pi x) below 1/2, the
 * recurrence psi'(x) = psi'(x+1) + 1/x^2, then 1/x + 1/(2x^2) + sum B_2k / x^(2k+1). */
static inline double tpu_trigamma(double x) {
    if (x != x) return x;
    if (x < 0.5) {
        double s = sin(TPU_PI * x);
        return TPU_PI * TPU_PI / (s * s) - tpu_trigamma(1 - x);
    }
    double r = 0;
    for (; x < 10; x += 1) r += 1 / (x * x);
    double z = 1 / (x * x);
    double s = 1 + 1 / (2 * x) +
               z * (1.0 / 6 - z * (1.0 / 30 - z * (1.0 / 42 - z * (1.0 / 30 - z * (5.0 / 66 - z * (691.0 / 2730))))));
    return r + s / x;
}

/* Hurwitz zeta(s, q) for s > 1 by Euler-Maclaurin: the first terms summed
 * until q + N >= 10, the tail as its integral, half its first term and twelve
 * Bernoulli corrections B_2j/(2j)! s(s+1)..(s+2j-2) (q+N)^(1-s-2j). */
static inline double tpu_zeta(double s, double q) {
    static const double b2j_over_fact[12] = {
        1.0 / 6 / 2,
        -1.0 / 30 / 24,
        1.0 / 42 / 720,
        -1.0 / 30 / 40320,
        5.0 / 66 / 3628800,
        -691.0 / 2730 / 479001600,
        7.0 / 6 / 87178291200.0,
        -3617.0 / 510 / 20922789888000.0,
        43867.0 / 798 / 6402373705728000.0,
        -174611.0 / 330 / 2432902008176640000.0,
        854513.0 / 138 / 1.1240007277776077e21,
        -236364091.0 / 2730 / 6.204484017332394e23,
    };
    if (s != s || q != q) return NAN;
    if (s == 1) return INFINITY;
    if (s < 1) return NAN;
    if (q <= 0 && q == floor(q)) return INFINITY;
    if (q <= 0 && s != floor(s)) return NAN;
    double sum = 0;
    int n = 0;
    for (; n < 9 || q + n < 10; n++) sum += pow(q + n, -s);
    double a = q + n, t = pow(a, -s);
    sum += a * t / (s - 1) + 0.5 * t;
    double fac = s, ap = t / a; /* s(s+1)..(s+2j-2), a^(-s-2j+1) */
    for (int j = 0; j < 12; j++) {
        double term = b2j_over_fact[j] * fac * ap;
        sum += term;
        if (fabs(term) < 1e-17 * fabs(sum)) break;
        fac *= (s + 2 * j + 1) * (s + 2 * j + 2);
        ap /= a * a;
    }
    return sum;
}

/* psi^(n)(x) = (-1)^(n+1) n! zeta(n+1, x) for n >= 2. */
static inline double tpu_polygamma(double n, double x) {
    int64_t k = (int64_t)n;
    if (k == 0) return tpu_digamma(x);
    if (k == 1) return tpu_trigamma(x);
    return ((k % 2) ? 1.0 : -1.0) * exp(tpu_lgamma((double)k + 1)) * tpu_zeta((double)k + 1, x);
}

/* erfinv: a rational first guess refined by Newton's method on erf (on erfc
 * for |y| >= 1/2, where 1 - |y| is exact). */
static inline double tpu_erfinv(double y) {
    if (y != y || y < -1 || y > 1) return NAN;
    if (y == 1 || y == -1) return copysign(INFINITY, y);
    double ay = fabs(y), w = -log((1 - ay) * (1 + ay)), p;
    if (w < 5) {
        w -= 2.5;
        p = 2.81022636e-08;
        p = 3.43273939e-07 + p * w;
        p = -3.5233877e-06 + p * w;
        p = -4.39150654e-06 + p * w;
        p = 0.00021858087 + p * w;
        p = -0.00125372503 + p * w;
        p = -0.00417768164 + p * w;
        p = 0.246640727 + p * w;
        p = 1.50140941 + p * w;
    } else {
        w = sqrt(w) - 3;
        p = -0.000200214257;
        p = 0.000100950558 + p * w;
        p = 0.00134934322 + p * w;
        p = -0.00367342844 + p * w;
        p = 0.00573950773 + p * w;
        p = -0.0076224613 + p * w;
        p = 0.00943887047 + p * w;
        p = 1.00167406 + p * w;
        p = 2.83297682 + p * w;
    }
    double x = p * ay;
    for (int i = 0; i < 4; i++) {
        double d = 1.12837916709551257390 * exp(-x * x); /* erf'(x) */
        if (d == 0) break;
        double f = ay < 0.5 ? erf(x) - ay : (1 - ay) - erfc(x);
        x -= f / d;
    }
    return copysign(x, y);
}

/* I_nu(|x|) for nu = 0, 1, scaled by e^-|x| when `scaled`: the power series
 * sum (x/2)^(2k+nu) / (k! (k+nu)!) up to |x| = 30, beyond it the asymptotic
 * expansion e^x / sqrt(2 pi x) sum_k c_k / x^k, c_k = c_(k-1) ((2k-1)^2 - 4nu^2) / (8k). */
static inline double tpu_bessel_i(int nu, double x, int scaled) {
    double ax = fabs(x), r;
    if (ax != ax || (ax == INFINITY && !scaled)) return NAN; /* PyTorch's CPU: I(+-inf) is NaN */
    if (ax <= 30) {
        double q = ax * ax / 4, t = nu ? ax / 2 : 1, s = t;
        for (int k = 1; k < 500 && t > 1e-17 * s; k++) {
            t *= q / ((double)k * (k + nu));
            s += t;
        }
        r = scaled ? s * exp(-ax) : s;
    } else {
        double t = 1, s = 1;
        for (int k = 1; k < 60; k++) {
            double f = ((2.0 * k - 1) * (2.0 * k - 1) - 4.0 * nu * nu) / (8.0 * k * ax);
            if (fabs(f) >= 1) break;
            t *= f;
            s += t;
            if (fabs(t) < 1e-17 * fabs(s)) break;
        }
        r = s / sqrt(2 * TPU_PI * ax);
        if (!scaled) r *= exp(ax);
    }
    return nu && x < 0 ? -r : r;
}
#endif
