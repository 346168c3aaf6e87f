/* specfun-bessel-impl.h - Bessel and Airy functions for ops.def's expressions
 * (base/expr-impl.h names them BESSEL_J0 BESSEL_J1 BESSEL_Y0 BESSEL_Y1
 * BESSEL_K(nu, scaled, x) AIRY_AI SPHERICAL_J0).
 *
 * PyTorch's CPU kernels (ATen/native/Math.h) evaluate these with the Cephes
 * Math Library's approximations (Copyright (c) 2018 Stephen L. Moshier,
 * 3-clause BSD license): rational functions of x^2 near zero, Hankel's
 * asymptotic forms P cos - Q sin with rational P and Q beyond, Chebyshev
 * series for K0 and K1. The coefficient tables below are Cephes's, in the
 * exact polynomial forms PyTorch evaluates them (its J0/J1 denominators have
 * no implicit leading 1, unlike Cephes's p1evl), so that results agree with
 * the CPU's to the last bits in double. Evaluated in double and rounded once
 * to the op's dtype; I0 and I1 inside K0 and K1 are base/specfun-impl.h's.
 * Domain conventions are PyTorch's: J and Y of +-inf are NaN (cos(inf)
 * times 0), Y of a negative x is NaN and of 0 is -inf, K of 0 is +inf and
 * of a negative x NaN, Ai(+-inf) is NaN and Ai(x > 103.892) is 0.
 * Pure functions, the base floor. */
#ifndef TPU_SPECFUN_BESSEL_IMPL_H
#define TPU_SPECFUN_BESSEL_IMPL_H
#include <math.h>
#include "base/specfun-impl.h"

#define TPU_SQRT_2_PI 0.797884560802865355879892119868763737 /* sqrt(2/pi) */
#define TPU_2_PI      0.636619772367581343075535053490057448 /* 2/pi */
#define TPU_1_SQRTPI  0.564189583547756286948                /* 1/sqrt(pi) */

/* Cephes's coefficients, highest power first (PyTorch's Math.h). */
static const double tpu_airy_an_[8] = {
    0.346538101525629,  12.007595273964581, 76.27960536152345,  168.08922493463058,
    159.75639135016442, 70.53609068404442,  14.026469116338967, 1.0,
};
static const double tpu_airy_ad_[8] = {
    0.5675945326387702, 14.75625625848472, 84.51389701414746,  177.31808814540045,
    164.2346928715297,  71.47784008255756, 14.095913560783403, 1.0,
};
static const double tpu_airy_afn_[9] = {
    -0.1316963234183318,    -0.6264565444319123,    -0.6931580360369335,
    -0.2797799815451191,    -0.04919001326095003,   -0.004062659235948854,
    -0.0001592764962392621, -2.776491081552329e-06, -1.6778769848911465e-08,
};
static const double tpu_airy_afd_[9] = {
    13.356042070655324,  32.682503279522464,   26.736704094149957,    9.187074029072596,      1.4752914677166642,
    0.11568717379518804, 0.004402916416152112, 7.547203482874142e-05, 4.5185009297058035e-07,
};
static const double tpu_airy_agn_[11] = {
    0.01973399320916857,  0.39110302961568827,   1.0657989759959559,    0.9391692298166502,
    0.35146565610554764,  0.06338889196289255,   0.005858041130483885,  0.000282851600836737,
    6.98793669997261e-06, 8.117892395543892e-08, 3.415517847659236e-10,
};
static const double tpu_airy_agd_[10] = {
    9.30892908077442,    19.835292871831214,   15.564662893286462,     5.476860694229755,      0.9542936116189619,
    0.08645808263523921, 0.004126565238242226, 0.00010125908511650914, 1.1716673321441352e-06, 4.9183457006293e-09,
};
static const double tpu_j0_pp_[7] = {
    0.0007969367292973471,
    0.08283523921074408,
    1.239533716464143,
    5.447250030587687,
    8.74716500199817,
    5.303240382353949,
    1.0,
};
static const double tpu_j0_pq_[7] = {
    0.0009244088105588637,
    0.08562884743544745,
    1.2535274390105895,
    5.470977403304171,
    8.761908832370695,
    5.306052882353947,
    1.0,
};
static const double tpu_j0_qp_[8] = {
    -0.011366383889846916, -1.2825271867050931, -19.553954425773597, -93.20601521237683,
    -177.68116798048806,   -147.07750515495118, -51.41053267665993,  -6.050143506007285,
};
static const double tpu_j0_qq_[7] = {
    64.3178256118178,  856.4300259769806,  3882.4018360540163, 7240.467741956525,
    5930.727011873169, 2062.0933166032783, 242.0057402402914,
};
static const double tpu_j0_rp_[4] = {
    -4794432209.782018,
    1956174919465.5657,
    -249248344360967.72,
    9708622510473064.0,
};
static const double tpu_j0_rq_[8] = {
    499.563147152651,  173785.4016763747,  48440965.83399621,      11185553704.535683,
    2112775201154.892, 310518229857422.56, 3.1812195594320496e+16, 1.7108629408104315e+18,
};
static const double tpu_j1_pp_[7] = {
    0.0007621256162081731,
    0.07313970569409176,
    1.1271960812968493,
    5.112079511468076,
    8.424045901417724,
    5.214515986823615,
    1.0,
};
static const double tpu_j1_pq_[7] = {
    0.0005713231280725487,
    0.06884559087544954,
    1.105142326340617,
    5.073863861286015,
    8.399855543276042,
    5.209828486823619,
    1.0,
};
static const double tpu_j1_qp_[8] = {
    0.05108625947501766, 4.982138729512334, 75.82382841325453,  366.7796093601508,
    710.8563049989261,   597.4896124006136, 211.68875710057213, 25.207020585802372,
};
static const double tpu_j1_qq_[7] = {
    74.23732770356752, 1056.4488603826283, 4986.410583376536, 9562.318924047562,
    7997.041604473507, 2826.1927851763908, 336.0936078106983,
};
static const double tpu_j1_rp_[4] = {
    -899971225.7055594,
    452228297998.19403,
    -72749424522181.83,
    3682957328638529.0,
};
static const double tpu_j1_rq_[8] = {
    620.8364781180543, 256987.25675774884, 83514679.14319493,     22151159547.97925,
    4749141220799.914, 784369607876235.9,  8.952223361846274e+16, 5.322786203326801e+18,
};
static const double tpu_y0_yp_[8] = {
    15592.436785523574, -14663929.59039716,  5435264770.518765,      -982136065717.9115,
    87590639439536.7,   -3466283033847297.0, 4.4273326857256984e+16, -1.8495080043698668e+16,
};
static const double tpu_y0_yq_[7] = {
    1041.2835366425984, 626107.330137135,   268919633.39381415,     86400248710.3935,
    20297961275010.555, 3171577528429750.5, 2.5059625617265306e+17,
};
static const double tpu_y1_yp_[6] = {
    1263204747.9017804,  -647355876379.1603,    114509511541823.73,
    -8127702555013251.0, 2.024394757135949e+17, -7.788771962659501e+17,
};
static const double tpu_y1_yq_[8] = {
    594.3015923461282,  235564.09294306856, 73481194.44597217,     18760131610.870617,
    3882312774962.3857, 620557727146953.8,  6.871410873553005e+16, 3.9727060811656064e+18,
};
static const double tpu_k0_a_[10] = {
    1.374465435613523e-16, 4.25981614279661e-14, 1.0349695257633842e-11, 1.904516377220209e-09, 2.5347910790261494e-07,
    2.286212103119452e-05, 0.001264615411446926, 0.0359799365153615,     0.3442898999246285,    -0.5353273932339028,
};
static const double tpu_k0_b_[25] = {
    5.300433772686263e-18,  -1.6475804301524212e-17, 5.2103915050390274e-17, -1.678231096805412e-16,
    5.512055978524319e-16,  -1.848593377343779e-15,  6.3400764774050706e-15, -2.2275133269916698e-14,
    8.032890775363575e-14,  -2.9800969231727303e-13, 1.140340588208475e-12,  -4.514597883373944e-12,
    1.8559491149547177e-11, -7.957489244477107e-11,  3.577397281400301e-10,  -1.69753450938906e-09,
    8.574034017414225e-09,  -4.660489897687948e-08,  2.766813639445015e-07,  -1.8317555227191195e-06,
    1.39498137188765e-05,   -0.00012849549581627802, 0.0015698838857300533,  -0.0314481013119645,
    2.4403030820659555,
};
static const double tpu_k1_a_[11] = {
    -7.023863479386288e-18, -2.427449850519366e-15,  -6.666901694199329e-13, -1.4114883926335278e-10,
    -2.213387630734726e-08, -2.4334061415659684e-06, -0.0001730288957513052, -0.006975723859639864,
    -0.12261118082265715,   -0.3531559607765449,     1.5253002273389478,
};
static const double tpu_k1_b_[25] = {
    -5.756744483665017e-18,  1.7940508731475592e-17, -5.689462558442859e-17,  1.838093544366639e-16,
    -6.057047248373319e-16,  2.038703165624334e-15,  -7.019837090418314e-15,  2.4771544244813043e-14,
    -8.976705182324994e-14,  3.3484196660784293e-13, -1.2891739609510289e-12, 5.13963967348173e-12,
    -2.1299678384275683e-11, 9.218315187605006e-11,  -4.1903547593418965e-10, 2.015049755197033e-09,
    -1.0345762465678097e-08, 5.7410841254500495e-08, -3.5019606030878126e-07, 2.406484947837217e-06,
    -1.936197974166083e-05,  0.00019521551847135162, -0.002857816859622779,   0.10392373657681724,
    2.7206261904844427,
};

/* c[0] t^(n-1) + ... + c[n-1] (Horner). */
static inline double tpu_polevl(double t, const double *c, int n) {
    double r = 0;
    for (int i = 0; i < n; i++) r = r * t + c[i];
    return r;
}
/* Cephes's chbevl: sum' c_i T_i(t/2) by Clenshaw's recurrence. */
static inline double tpu_chbevl(double t, const double *c, int n) {
    double b0 = c[0], b1 = 0, b2 = 0;
    for (int i = 1; i < n; i++) {
        b2 = b1;
        b1 = b0;
        b0 = t * b1 - b2 + c[i];
    }
    return 0.5 * (b0 - b2);
}

/* Hankel's form for x > 5: sqrt(2/(pi x)) (P cos(x - phase) - 5/x Q sin(x - phase)),
 * or with sin and cos exchanged (Y, `second`), P and Q rational in 25/x^2. */
static inline double tpu_bessel_hankel_(double x, int order, int second) {
    const double *pp = order ? tpu_j1_pp_ : tpu_j0_pp_, *pq = order ? tpu_j1_pq_ : tpu_j0_pq_;
    const double *qp = order ? tpu_j1_qp_ : tpu_j0_qp_, *qq = order ? tpu_j1_qq_ : tpu_j0_qq_;
    double w = order ? (5.0 / x) * (5.0 / x) : 25.0 / (x * x);
    double p = tpu_polevl(w, pp, 7) / tpu_polevl(w, pq, 7), q = tpu_polevl(w, qp, 8) / tpu_polevl(w, qq, 7);
    double xn = x - (order ? 2.356194490192344928846982537459627163 : 0.785398163397448309615660845819875721);
    double v = second ? p * sin(xn) + 5.0 / x * q * cos(xn) : p * cos(xn) - 5.0 / x * q * sin(xn);
    return v * TPU_SQRT_2_PI / sqrt(x);
}

static inline double tpu_bessel_j0(double x) {
    x = fabs(x);
    if (x <= 5) {
        if (x < 1e-5) return 1 - x * x / 4;
        double z = x * x; /* the factors vanish at the first two zeros of J0 */
        return (z - 5.78318596294678452118) * (z - 30.4712623436620863991) * tpu_polevl(z, tpu_j0_rp_, 4) /
               tpu_polevl(z, tpu_j0_rq_, 8);
    }
    return tpu_bessel_hankel_(x, 0, 0);
}

static inline double tpu_bessel_j1(double x) {
    if (x < 0) return -tpu_bessel_j1(-x);
    if (x <= 5) {
        double z = x * x;
        return tpu_polevl(z, tpu_j1_rp_, 4) / tpu_polevl(z, tpu_j1_rq_, 8) * x * (z - 14.6819706421238932572) *
               (z - 49.2184563216946036703);
    }
    return tpu_bessel_hankel_(x, 1, 0);
}

static inline double tpu_bessel_y0(double x) {
    if (x <= 5) {
        if (x == 0) return -INFINITY;
        if (x < 0) return NAN;
        double z = x * x;
        return tpu_polevl(z, tpu_y0_yp_, 8) / tpu_polevl(z, tpu_y0_yq_, 7) + TPU_2_PI * log(x) * tpu_bessel_j0(x);
    }
    return tpu_bessel_hankel_(x, 0, 1);
}

static inline double tpu_bessel_y1(double x) {
    if (x <= 5) {
        if (x == 0) return -INFINITY;
        if (x < 0) return NAN;
        double z = x * x;
        return x * (tpu_polevl(z, tpu_y1_yp_, 6) / tpu_polevl(z, tpu_y1_yq_, 8)) +
               TPU_2_PI * (tpu_bessel_j1(x) * log(x) - 1 / x);
    }
    return tpu_bessel_hankel_(x, 1, 1);
}

/* K_nu(x) for nu = 0, 1, times e^x when `scaled`: below 2, Chebyshev series
 * in x^2 - 2 plus the logarithmic term -+ log(x/2) I_nu(x); beyond, a Chebyshev
 * series in 8/x - 2 for e^x sqrt(x) K_nu(x). */
static inline double tpu_bessel_k(int nu, double x, int scaled) {
    if (x == 0) return INFINITY;
    if (x < 0) return NAN;
    if (x <= 2) {
        double c = tpu_chbevl(x * x - 2, nu ? tpu_k1_a_ : tpu_k0_a_, nu ? 11 : 10);
        double r = nu ? log(0.5 * x) * tpu_bessel_i(1, x, 0) + c / x : c - log(0.5 * x) * tpu_bessel_i(0, x, 0);
        return scaled ? r * exp(x) : r;
    }
    double r = tpu_chbevl(8 / x - 2, nu ? tpu_k1_b_ : tpu_k0_b_, 25) / sqrt(x);
    return scaled ? r : exp(-x) * r;
}

/* Ai(x): below -2.09 the oscillating asymptotic form with rational
 * corrections in 1/zeta^2, zeta = (2/3) |x|^(3/2); from 2.09 the decaying
 * form e^-zeta / (2 sqrt(pi) x^(1/4)) times a rational function of 1/zeta;
 * between, the Maclaurin series c1 f(x) - c2 g(x). */
static inline double tpu_airy_ai(double x) {
    if (isinf(x)) return NAN;
    if (x > 103.892) return 0;
    if (x < -2.09) {
        double s = -x * sqrt(-x) * (2.0 / 3), z = 1 / s, z2 = z * z;
        double f = 1 + z2 * tpu_polevl(z2, tpu_airy_afn_, 9) / tpu_polevl(z2, tpu_airy_afd_, 9);
        double g = z * tpu_polevl(z2, tpu_airy_agn_, 11) / tpu_polevl(z2, tpu_airy_agd_, 10);
        double t = s + 0.25 * TPU_PI;
        return TPU_1_SQRTPI / sqrt(sqrt(-x)) * (sin(t) * f - cos(t) * g);
    }
    if (x >= 2.09) {
        double zeta = x * sqrt(x) * (2.0 / 3), iz = 1 / zeta;
        return TPU_1_SQRTPI * (tpu_polevl(iz, tpu_airy_an_, 8) / tpu_polevl(iz, tpu_airy_ad_, 8)) /
               (2 * sqrt(sqrt(x)) * exp(zeta));
    }
    /* f = sum 3^k (1/3)_k x^3k / (3k)!, g = sum 3^k (2/3)_k x^(3k+1) / (3k+1)! */
    double f = 1, g = x, m = 1, n = x, k = 1, z = x * x * x, t = 1;
    while (t > 2.220446049250313e-16) {
        m *= z / ((k + 1) * (k + 2));
        n *= z / ((k + 2) * (k + 3));
        k += 3;
        f += m;
        g += n;
        t = fabs(m / f);
    }
    return 0.355028053887817239260 * f - 0.258819403792806798405 * g;
}

/* j0(x) = sin(x) / x, its Taylor polynomial below 1/2; 0 at +-inf. */
static inline double tpu_spherical_j0(double x) {
    if (isinf(x)) return 0;
    if (fabs(x) < 0.5) {
        double z = x * x;
        return 1 + z * (-1.0 / 6 +
                        z * (1.0 / 120 + z * (-1.0 / 5040 +
                                              z * (1.0 / 362880 + z * (-1.0 / 39916800 + z * (1.0 / 6227020800.0))))));
    }
    return sin(x) / x;
}
#endif
