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
 * signgam, a data race between workers).
 * The error-function family (ERFCX NDTRI LOG_NDTR), Hurwitz zeta with
 * PyTorch's conventions (ZETA) and the regularized incomplete gamma
 * functions (IGAMMA IGAMMAC) follow the same rule; their domain conventions
 * are stated where they are defined. Pure functions, the base floor. */
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
/* Hurwitz zeta(x, q) with PyTorch's (Cephes's) conventions and stopping rule:
 * x == 1 is +inf, x < 1 NaN; q a non-positive integer +inf, a negative q
 * with a non-integer x NaN; the direct sum stops once a term is below 2^-53
 * of it (zeta(inf, 1) = 1), else Euler-Maclaurin from q + N > 9 with N >= 9
 * (zeta(inf, q > 1) is NaN there, as on the CPU: inf times 0). */
static inline double tpu_zeta_pt(double x, double q) {
    static const double fact_over_b2j[12] = {
        12.0,
        -720.0,
        30240.0,
        -1209600.0,
        47900160.0,
        -1.8924375803183791606e9,
        7.47242496e10,
        -2.950130727918164224e12,
        1.1646782814350067249e14,
        -4.5979787224074726105e15,
        1.8152105401943546773e17,
        -7.1661652561756670113e18, /* (2j)! / B_2j */
    };
    const double eps = 1.11022302462515654042e-16;
    if (x == 1) return INFINITY;
    if (x < 1) return NAN;
    if (q <= 0) {
        if (q == floor(q)) return INFINITY;
        if (x != floor(x)) return NAN;
    }
    double s = pow(q, -x), a = q, b = 0;
    int i = 0;
    while (i < 9 || a <= 9) {
        i++;
        a += 1;
        b = pow(a, -x);
        s += b;
        if (-eps * s < b && b < eps * s) return s;
    }
    double w = a, f = 1, k = 0;
    s += b * w / (x - 1) - 0.5 * b;
    for (i = 0; i < 12; i++) {
        f *= x + k;
        b /= w;
        double t = f * b / fact_over_b2j[i];
        s += t;
        if (fabs(t / s) < eps) break;
        k += 1;
        f *= x + k;
        b /= w;
        k += 1;
    }
    return s;
}

/* e^(x^2) with x^2 split exactly into hi + lo (x^2 alone loses x^2 ulps). */
static inline double tpu_exp_sq_(double x) {
    double hi = x * x, lo = fma(x, x, -hi);
    return exp(hi) * (1 + lo);
}

/* erfcx(x) = e^(x^2) erfc(x): directly below 8 (erfc is accurate relative
 * to itself in its tail), beyond it the asymptotic series
 * 1/(x sqrt(pi)) sum (-1)^k (2k-1)!! / (2x^2)^k. */
static inline double tpu_erfcx(double x) {
    if (x != x) return x;
    if (x < 8) {
        if (x < -26.7) return INFINITY; /* 2 e^(x^2) overflows */
        return tpu_exp_sq_(x) * erfc(x);
    }
    double z = (0.5 / x) / x, t = 1, s = 1;
    for (int k = 1; k < 40; k++) {
        t *= -(2 * k - 1) * z;
        s += t;
        if (fabs(t) < 1e-17) break;
    }
    return s / (x * 1.77245385090551602730); /* sqrt(pi) */
}

/* t >= 0 with erfc(t) = y, 0 < y <= 1/2: Newton's method on the concave
 * log erfc(t) = log erfcx(t) - t^2 (monotone convergence, no cancellation). */
static inline double tpu_erfcinv_tail_(double y) {
    double t = sqrt(-log(y)), ly = log(y);
    for (int i = 0; i < 60; i++) {
        double e = tpu_erfcx(t), d = (log(e) - t * t - ly) / (-1.12837916709551257390 / e);
        t -= d;
        if (fabs(d) <= 1e-16 * t) break;
    }
    return t;
}

/* ndtri(p): the x with Phi(x) = p. Central p through erfinv(2p - 1) (exact
 * for p in [1/4, 3/4]), the tails through erfc's inverse of 2p or 2(1 - p).
 * ndtri(0) = -inf, ndtri(1) = inf, outside [0, 1] NaN. */
static inline double tpu_ndtri(double p) {
    if (p != p || p < 0 || p > 1) return NAN;
    if (p == 0) return -INFINITY;
    if (p == 1) return INFINITY;
    if (p >= 0.25 && p <= 0.75) return 1.41421356237309504880 * tpu_erfinv(2 * p - 1);
    if (p < 0.25) return -1.41421356237309504880 * tpu_erfcinv_tail_(2 * p);
    return 1.41421356237309504880 * tpu_erfcinv_tail_(2 * (1 - p));
}

/* log Phi(x), PyTorch's (SciPy's) form: log(erfcx(-x/sqrt2) / 2) - x^2/2
 * below -1, log1p(-erfc(x/sqrt2) / 2) above. */
static inline double tpu_log_ndtr(double x) {
    double t = x * 0.70710678118654752440;
    if (x < -1) return log(tpu_erfcx(-t) / 2) - t * t;
    return log1p(-erfc(t) / 2);
}

/* x^a e^-x / Gamma(a), in logarithms. */
static inline double tpu_igam_prefix_(double a, double x) { return exp(a * log(x) - x - tpu_lgamma(a)); }

/* P(a, x) by its series x^a e^-x / Gamma(a+1) sum x^n / ((a+1)..(a+n)), for x < a + 1. */
static inline double tpu_igam_series_(double a, double x) {
    double pre = tpu_igam_prefix_(a, x);
    if (pre == 0) return 0;
    double r = a, c = 1, s = 1;
    for (int i = 0; i < 200000; i++) {
        r += 1;
        c *= x / r;
        s += c;
        if (c <= 1e-17 * s) break;
    }
    return s * pre / a;
}

/* Q(a, x) for small x (DLMF 8.7.3, as SciPy's igamc series): -expm1(a log x - lgamma(a + 1))
 * - x^a / Gamma(a) sum_n>=1 (-x)^n / (n! (a + n)), without the cancellation of 1 - P when
 * P is near 1 (a small). */
static inline double tpu_igamc_series_(double a, double x) {
    double fac = 1, sum = 0;
    for (int n = 1; n < 2000; n++) {
        fac *= -x / n;
        double term = fac / (a + n);
        sum += term;
        if (fabs(term) <= 1e-17 * fabs(sum)) break;
    }
    double lx = log(x);
    return -expm1(a * lx - tpu_lgamma(1 + a)) - exp(a * lx - tpu_lgamma(a)) * sum;
}

/* Q(a, x) by Legendre's continued fraction (modified Lentz), for x >= a + 1. */
static inline double tpu_igamc_cf_(double a, double x) {
    double pre = tpu_igam_prefix_(a, x);
    if (pre == 0) return 0;
    const double tiny = 1e-300;
    double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
    for (int i = 1; i < 200000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-16) break;
    }
    return pre * h;
}

/* log(1 + s) - s without cancellation for small s (its series below 1/10). */
static inline double tpu_log1pmx_(double s) {
    if (fabs(s) >= 0.1) return log1p(s) - s;
    double t = -s, r = 0; /* sum_k>=2 (-1)^(k+1) s^k / k */
    for (int k = 2; k < 40; k++) {
        t *= -s;
        double term = t / k;
        r += term;
        if (fabs(term) < 1e-17 * fabs(r)) break;
    }
    return r;
}

/* Temme's uniform expansion for large a with x near a (DLMF 8.12.3-4, 8.12.8):
 * Q(a, x) = erfc(eta sqrt(a/2)) / 2 + e^(-a eta^2 / 2) / sqrt(2 pi a) sum_k C_k(eta) a^-k,
 * eta^2 / 2 = x/a - 1 - log(x/a), sign of x - a; P = 1 - Q the same way with the signs
 * flipped. C_0..C_2 by their Taylor coefficients in eta (DLMF 8.12.10-11, the values
 * PyTorch's and SciPy's tables start with): for a > 1e6 and |x - a| < 4.5 sqrt(a),
 * |eta| < 0.005, the rest is below 1e-17. */
static inline double tpu_igam_temme_(double a, double x, int upper) {
    static const double d[3][10] = {
        {-0.3333333333333333, 0.08333333333333333, -0.014814814814814815, 0.0011574074074074073, 0.0003527336860670194,
         -0.0001787551440329218, 3.919263178522438e-05, -2.1854485106799924e-06, -1.85406221071516e-06,
         8.296711340953087e-07},
        {-0.001851851851851852, -0.003472222222222222, 0.0026455026455026454, -0.0009902263374485596,
         0.00020576131687242798, -4.018775720164609e-07, -1.8098550334489977e-05, 7.64916091608111e-06,
         -1.6120900894563446e-06, 4.647127802807434e-09},
        {0.004133597883597883, -0.0026813271604938273, 0.0007716049382716049, 2.0093878600823047e-06,
         -0.00010736653226365161, 5.2923448829120125e-05, -1.2760635188618728e-05, 3.423578734096138e-08,
         1.3721957309062932e-06, -6.298992138380055e-07},
    };
    double eta = sqrt(-2 * tpu_log1pmx_((x - a) / a)), sgn = upper ? 1 : -1, sum = 0, afac = 1;
    if (x < a) eta = -eta;
    for (int k = 0; k < 3; k++, afac /= a) {
        double ck = 0;
        for (int n = 9; n >= 0; n--) ck = ck * eta + d[k][n];
        sum += ck * afac;
    }
    return 0.5 * erfc(sgn * eta * sqrt(a / 2)) + sgn * exp(-0.5 * a * eta * eta) * sum / sqrt(2 * TPU_PI * a);
}

/* The regularized incomplete gamma functions P(a, x) (igamma) and
 * Q(a, x) = 1 - P (igammac) with PyTorch's (SciPy's) boundary values, tested in its order: NaN for
 * a < 0 or x < 0; at a == 0, P = 1 and Q = 0 for x > 0 (NaN at x == 0); at
 * x == 0, P = 0, Q = 1; a = inf: P = 0, Q = 1 (NaN if x is inf too);
 * x = inf: P = 1, Q = 0. Between them: Temme's expansion for a > 1e6 near
 * x, else the series below x = a + 1 (Q by its own series for a < 1, x <= 1.5)
 * and the continued fraction above, each giving the smaller of P and Q directly. */
static inline double tpu_igamma_(double a, double x, int upper) {
    if (x < 0 || a < 0) return NAN; /* the CPU's order: igamma(NaN, 0) = 0, igamma(inf, NaN) = 0 */
    if (a == 0) return x > 0 ? (double)!upper : NAN;
    if (x == 0) return upper;
    if (isinf(a)) return isinf(x) ? NAN : upper;
    if (isinf(x)) return !upper;
    if (a != a || x != x) return NAN;
    if (a > 1e6 && fabs(x - a) < 4.5 * sqrt(a)) return tpu_igam_temme_(a, x, upper);
    if (x < a + 1) {
        if (upper && x <= 1.5 && a < 1) return tpu_igamc_series_(a, x); /* Q small: not 1 - P */
        double p = tpu_igam_series_(a, x);
        return upper ? 1 - p : p;
    }
    double q = tpu_igamc_cf_(a, x);
    return upper ? q : 1 - q;
}
static inline double tpu_igamma(double a, double x) { return tpu_igamma_(a, x, 0); }
static inline double tpu_igammac(double a, double x) { return tpu_igamma_(a, x, 1); }
#endif
