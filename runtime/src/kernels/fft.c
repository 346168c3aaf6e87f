/* fft.c - discrete Fourier transforms along one dim (ops.def: FFT_C2C,
 * FFT_R2C, FFT_C2R).
 *
 * A plan for length n factors it into radices (4 first, then 2, 3, 5 and any
 * prime up to FFT_MAX_RADIX) and runs a Stockham autosort transform: each
 * stage reads one buffer and writes the other, the result comes out in
 * natural order, no bit reversal. A length with a prime factor above
 * FFT_MAX_RADIX goes through Bluestein's chirp-z: a circular convolution of
 * length m (the power of two >= 2n - 1) by two power-of-two transforms and a
 * pointwise product with the chirp's precomputed spectrum.
 * Twiddles come from one table of the n-th roots of unity, each from an exact
 * index (p*k < n), so the error grows with log n, not with n. Math is double
 * for complex64 and complex128 alike (complex64 rounds once, at the store).
 * Lines - the elements along dim at one position of the other dims - are
 * gathered FFT_B at a time (while their buffers fit FFT_B_BYTES) into split
 * real / imaginary buffers with the
 * lines interleaved (element j of line b at j*FFT_B + b), so that every
 * stage's inner loop runs over s*FFT_B contiguous doubles whatever the stage's
 * stride s: the transform vectorizes across lines. Fewer lines than
 * FFT_B / 2 go one at a time through the same stages on interleaved complex
 * numbers. Blocks of lines run in parallel on the compute pool, each with its
 * own buffers.
 * The inverse direction uses the same plan on conjugates:
 * ifft(x) = conj(fft(conj(x))). */
#include "kernels/kernels-impl.h"
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define FFT_MAX_RADIX 64 /* a generic radix-p stage costs p multiplies per point */
#define FFT_PI        3.14159265358979323846

typedef struct cpx {
    double re, im;
} cpx;

static inline cpx c_add(cpx a, cpx b) { return (cpx){a.re + b.re, a.im + b.im}; }
static inline cpx c_sub(cpx a, cpx b) { return (cpx){a.re - b.re, a.im - b.im}; }
static inline cpx c_mul(cpx a, cpx b) { return (cpx){a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re}; }

typedef struct fft_plan {
    int64_t n;
    int nf, fac[64];
    cpx *w; /* w[j] = e^(-2 pi i j / n), j < n (Stockham plans) */
    /* Bluestein (nf == 0, n > 1): */
    int64_t m;
    struct fft_plan *sub; /* power-of-two plan of length m */
    cpx *chirp;           /* chirp[j] = e^(-pi i j^2 / n), j < n */
    cpx *bhat;            /* fft_m of b: b_j = conj(chirp[|j|]) around 0, scaled by 1/m */
    cpx *wh;              /* wh[k] = e^(-pi i k / n), k <= n: a real transform of 2n points by this one */
} fft_plan;

static void fft_plan_free(fft_plan *pl) {
    if (!pl) return;
    fft_plan_free(pl->sub);
    free(pl->w);
    free(pl->chirp);
    free(pl->bhat);
    free(pl->wh);
    free(pl);
}

/* One Stockham stage of radix P: sub-transforms of length l at stride s. */
static void fft_stage(const fft_plan *pl, int64_t l, int64_t s, int P, const cpx *restrict x, cpx *restrict y) {
    const int64_t m = l / P, tstep = pl->n / l, n = pl->n;
    const cpx *w = pl->w;
    if (P == 2) {
        for (int64_t p = 0; p < m; p++) {
            const cpx w1 = w[tstep * p];
            for (int64_t q = 0; q < s; q++) {
                cpx a = x[q + s * p], b = x[q + s * (p + m)];
                y[q + s * (2 * p)] = c_add(a, b);
                y[q + s * (2 * p + 1)] = c_mul(c_sub(a, b), w1);
            }
        }
    } else if (P == 4) {
        for (int64_t p = 0; p < m; p++) {
            const cpx w1 = w[tstep * p], w2 = w[2 * tstep * p], w3 = w[3 * tstep * p];
            for (int64_t q = 0; q < s; q++) {
                cpx a0 = x[q + s * p], a1 = x[q + s * (p + m)], a2 = x[q + s * (p + 2 * m)],
                    a3 = x[q + s * (p + 3 * m)];
                cpx t0 = c_add(a0, a2), t1 = c_sub(a0, a2), t2 = c_add(a1, a3), d = c_sub(a1, a3);
                cpx t3 = {d.im, -d.re}; /* d * e^(-pi i / 2) */
                cpx *o = y + q + s * (4 * p);
                o[0] = c_add(t0, t2);
                o[s] = c_mul(c_add(t1, t3), w1);
                o[2 * s] = c_mul(c_sub(t0, t2), w2);
                o[3 * s] = c_mul(c_sub(t1, t3), w3);
            }
        }
    } else {
        const int64_t root = n / P; /* w[root * r] = e^(-2 pi i r / P) */
        cpx a[FFT_MAX_RADIX];
        for (int64_t p = 0; p < m; p++)
            for (int64_t q = 0; q < s; q++) {
                for (int r = 0; r < P; r++) a[r] = x[q + s * (p + r * m)];
                for (int k = 0; k < P; k++) {
                    cpx b = a[0];
                    for (int r = 1, rk = k; r < P; r++, rk = (rk + k) % P) b = c_add(b, c_mul(a[r], w[root * rk]));
                    y[q + s * (P * p + k)] = k ? c_mul(b, w[tstep * p * k]) : b;
                }
            }
    }
}

/* The forward transform of buf[0..n) in place; tmp holds n (Stockham) or
 * 2m (Bluestein) points. */
static void fft_exec(const fft_plan *pl, cpx *buf, cpx *tmp) {
    int64_t n = pl->n;
    if (n <= 1) return;
    if (pl->nf == 0) { /* Bluestein: X_k = chirp_k * sum_j (x_j chirp_j) conj(chirp_(k-j)) */
        int64_t m = pl->m;
        cpx *a = tmp, *scratch = tmp + m;
        for (int64_t j = 0; j < n; j++) a[j] = c_mul(buf[j], pl->chirp[j]);
        memset(a + n, 0, (size_t)(m - n) * sizeof *a);
        fft_exec(pl->sub, a, scratch);
        for (int64_t j = 0; j < m; j++) { /* times bhat, conjugated for the inverse transform */
            cpx v = c_mul(a[j], pl->bhat[j]);
            a[j] = (cpx){v.re, -v.im};
        }
        fft_exec(pl->sub, a, scratch);
        for (int64_t k = 0; k < n; k++) buf[k] = c_mul((cpx){a[k].re, -a[k].im}, pl->chirp[k]);
        return;
    }
    cpx *x = buf, *y = tmp;
    int64_t l = n, s = 1;
    for (int f = 0; f < pl->nf; f++) {
        int P = pl->fac[f];
        fft_stage(pl, l, s, P, x, y);
        l /= P;
        s *= P;
        cpx *t = x;
        x = y;
        y = t;
    }
    if (x != buf) memcpy(buf, x, (size_t)n * sizeof *buf);
}

/* A plan for length n >= 1; NULL when host memory runs out. */
static fft_plan *fft_plan_new(int64_t n) {
    fft_plan *pl = calloc(1, sizeof *pl);
    if (!pl) return NULL;
    pl->n = n;
    pl->wh = malloc((size_t)(n + 1) * sizeof *pl->wh);
    if (!pl->wh) {
        fft_plan_free(pl);
        return NULL;
    }
    for (int64_t k = 0; k <= n; k++) { /* angles in [-pi/2, 0] and their mirror: exact conjugate pairs */
        double ang = -FFT_PI * (double)(2 * k <= n ? k : k - n) / (double)n;
        cpx v = {cos(ang), sin(ang)};
        pl->wh[k] = 2 * k <= n ? v : (cpx){-v.re, -v.im}; /* e^(-pi i k/n) = -e^(-pi i (k-n)/n) */
    }
    int64_t r = n;
    while (r % 4 == 0) pl->fac[pl->nf++] = 4, r /= 4;
    while (r % 2 == 0) pl->fac[pl->nf++] = 2, r /= 2;
    for (int64_t p = 3; p <= FFT_MAX_RADIX && r > 1; p += 2)
        while (r % p == 0) pl->fac[pl->nf++] = (int)p, r /= p;
    if (r > 1) { /* a prime factor above FFT_MAX_RADIX */
        pl->nf = 0;
        int64_t m = 1;
        while (m < 2 * n - 1) m *= 2;
        pl->m = m;
        pl->sub = fft_plan_new(m);
        pl->chirp = malloc((size_t)n * sizeof *pl->chirp);
        pl->bhat = calloc((size_t)m, sizeof *pl->bhat);
        cpx *scratch = malloc((size_t)m * sizeof *scratch);
        if (!pl->sub || !pl->chirp || !pl->bhat || !scratch) {
            free(scratch);
            fft_plan_free(pl);
            return NULL;
        }
        for (int64_t j = 0; j < n; j++) { /* angle pi (j^2 mod 2n) / n, exact index */
            int64_t q = (int64_t)(((unsigned __int128)j * (unsigned __int128)j) % (unsigned __int128)(2 * n));
            double ang = -FFT_PI * (double)q / (double)n;
            pl->chirp[j] = (cpx){cos(ang), sin(ang)};
        }
        for (int64_t j = 0; j < n; j++) {
            cpx b = {pl->chirp[j].re / (double)m, -pl->chirp[j].im / (double)m};
            pl->bhat[j] = b;
            if (j) pl->bhat[m - j] = b;
        }
        fft_exec(pl->sub, pl->bhat, scratch);
        free(scratch);
        return pl;
    }
    pl->w = malloc((size_t)(n ? n : 1) * sizeof *pl->w);
    if (!pl->w) {
        fft_plan_free(pl);
        return NULL;
    }
    for (int64_t j = 0; j < n; j++) {
        /* angles in (-pi, pi]: w[j] and w[n - j] are exact conjugates */
        double ang = -2.0 * FFT_PI * (double)(j <= n / 2 ? j : j - n) / (double)n;
        pl->w[j] = (cpx){cos(ang), sin(ang)};
    }
    return pl;
}

/* ---- FFT_B lines at once, split format: x[e*FFT_B + b] is element e of line b ---- */
#define FFT_B       8
#define FFT_B_BYTES (1 << 20) /* at most this much buffer per group (the L2 it should stay in) */

/* One Stockham stage of radix P over FFT_B lines: the point (q, r) of each
 * line is a run of s*FFT_B doubles at (s*(p + r*m))*FFT_B. */
#define FFTB_STAGE_ARGS                                                                                    \
    const fft_plan *pl, int64_t l, int64_t s, int P, const double *restrict xr, const double *restrict xi, \
        double *restrict yr, double *restrict yi
/* The inner loops: runs of s*FFT_B doubles as blocks of FFT_B (a constant
 * trip count the compiler vectorizes, one AVX-512 vector per block). */
#define FFTB_FOR(t)                                   \
    for (int64_t t##0 = 0; t##0 < run; t##0 += FFT_B) \
        for (int64_t t = t##0; t < t##0 + FFT_B; t++)
static inline __attribute__((always_inline)) void fftb_stage_body(FFTB_STAGE_ARGS) {
    const int64_t m = l / P, tstep = pl->n / l, n = pl->n, run = s * FFT_B;
    const cpx *w = pl->w;
    for (int64_t p = 0; p < m; p++) {
        const int64_t in0 = s * p * FFT_B, istep = s * m * FFT_B, out0 = s * P * p * FFT_B;
        if (P == 2) {
            const cpx w1 = w[tstep * p];
            const double *ar = xr + in0, *ai = xi + in0, *br = xr + in0 + istep, *bi = xi + in0 + istep;
            double *o0r = yr + out0, *o0i = yi + out0, *o1r = yr + out0 + run, *o1i = yi + out0 + run;
            FFTB_FOR(t) {
                double dr = ar[t] - br[t], di = ai[t] - bi[t];
                o0r[t] = ar[t] + br[t];
                o0i[t] = ai[t] + bi[t];
                o1r[t] = dr * w1.re - di * w1.im;
                o1i[t] = dr * w1.im + di * w1.re;
            }
        } else if (P == 4) {
            const cpx w1 = w[tstep * p], w2 = w[2 * tstep * p], w3 = w[3 * tstep * p];
            const double *a0r = xr + in0, *a0i = xi + in0, *a1r = a0r + istep, *a1i = a0i + istep, *a2r = a1r + istep,
                         *a2i = a1i + istep, *a3r = a2r + istep, *a3i = a2i + istep;
            double *o0r = yr + out0, *o0i = yi + out0, *o1r = o0r + run, *o1i = o0i + run, *o2r = o1r + run,
                   *o2i = o1i + run, *o3r = o2r + run, *o3i = o2i + run;
            FFTB_FOR(t) {
                double t0r = a0r[t] + a2r[t], t0i = a0i[t] + a2i[t], t1r = a0r[t] - a2r[t], t1i = a0i[t] - a2i[t];
                double t2r = a1r[t] + a3r[t], t2i = a1i[t] + a3i[t], t3r = a1i[t] - a3i[t], t3i = a3r[t] - a1r[t];
                o0r[t] = t0r + t2r;
                o0i[t] = t0i + t2i;
                double ur = t1r + t3r, ui = t1i + t3i, vr = t0r - t2r, vi = t0i - t2i, zr = t1r - t3r, zi = t1i - t3i;
                o1r[t] = ur * w1.re - ui * w1.im;
                o1i[t] = ur * w1.im + ui * w1.re;
                o2r[t] = vr * w2.re - vi * w2.im;
                o2i[t] = vr * w2.im + vi * w2.re;
                o3r[t] = zr * w3.re - zi * w3.im;
                o3i[t] = zr * w3.im + zi * w3.re;
            }
        } else {
            const int64_t root = n / P;
            for (int k = 0; k < P; k++) {
                double *orr = yr + out0 + k * run, *oi = yi + out0 + k * run;
                memcpy(orr, xr + in0, (size_t)run * sizeof *orr);
                memcpy(oi, xi + in0, (size_t)run * sizeof *oi);
                for (int r = 1, rk = k; r < P; r++, rk = (rk + k) % P) {
                    const cpx c = w[root * rk];
                    const double *ar = xr + in0 + r * istep, *ai = xi + in0 + r * istep;
                    FFTB_FOR(t) {
                        orr[t] += ar[t] * c.re - ai[t] * c.im;
                        oi[t] += ar[t] * c.im + ai[t] * c.re;
                    }
                }
                if (k) {
                    const cpx c = w[tstep * p * k];
                    FFTB_FOR(t) {
                        double vr = orr[t], vi = oi[t];
                        orr[t] = vr * c.re - vi * c.im;
                        oi[t] = vr * c.im + vi * c.re;
                    }
                }
            }
        }
    }
}

typedef void fftb_stage_fn(FFTB_STAGE_ARGS);
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__SANITIZE_THREAD__) && !defined(TPU_NO_CLONES)
__attribute__((target("avx512f,fma"))) static void fftb_stage_512(FFTB_STAGE_ARGS) {
    fftb_stage_body(pl, l, s, P, xr, xi, yr, yi);
}
__attribute__((target("avx2,fma"))) static void fftb_stage_256(FFTB_STAGE_ARGS) {
    fftb_stage_body(pl, l, s, P, xr, xi, yr, yi);
}
#define FFT_ISA_VARIANTS 1
#endif
static void fftb_stage_base(FFTB_STAGE_ARGS) { fftb_stage_body(pl, l, s, P, xr, xi, yr, yi); }

/* The stage function for this CPU (AVX-512 or AVX2 with FMA, else baseline). */
static fftb_stage_fn *fftb_stage_pick(void) {
#ifdef FFT_ISA_VARIANTS
    unsigned f = tpu_cpu_features();
    if ((f & TPU_CPU_FMA) && (f & TPU_CPU_AVX512F)) return fftb_stage_512;
    if ((f & TPU_CPU_FMA) && (f & TPU_CPU_AVX2)) return fftb_stage_256;
#endif
    return fftb_stage_base;
}

/* The forward transform of FFT_B lines (re, im: n*FFT_B each) in place;
 * tr, ti hold n*FFT_B (Stockham) or 2m*FFT_B (Bluestein) doubles each. */
static void fftb_exec(const fft_plan *pl, double *re, double *im, double *tr, double *ti, fftb_stage_fn *stage) {
    const int64_t n = pl->n;
    if (n <= 1) return;
    if (pl->nf == 0) { /* Bluestein, as fft_exec, lane by lane */
        const int64_t m = pl->m;
        double *ar = tr, *ai = ti, *sr = tr + m * FFT_B, *si = ti + m * FFT_B;
        for (int64_t j = 0; j < n; j++) {
            const cpx c = pl->chirp[j];
            for (int b = 0; b < FFT_B; b++) {
                double xr = re[j * FFT_B + b], xi = im[j * FFT_B + b];
                ar[j * FFT_B + b] = xr * c.re - xi * c.im;
                ai[j * FFT_B + b] = xr * c.im + xi * c.re;
            }
        }
        memset(ar + n * FFT_B, 0, (size_t)((m - n) * FFT_B) * sizeof *ar);
        memset(ai + n * FFT_B, 0, (size_t)((m - n) * FFT_B) * sizeof *ai);
        fftb_exec(pl->sub, ar, ai, sr, si, stage);
        for (int64_t j = 0; j < m; j++) {
            const cpx c = pl->bhat[j];
            for (int b = 0; b < FFT_B; b++) {
                double xr = ar[j * FFT_B + b], xi = ai[j * FFT_B + b];
                ar[j * FFT_B + b] = xr * c.re - xi * c.im;
                ai[j * FFT_B + b] = -(xr * c.im + xi * c.re);
            }
        }
        fftb_exec(pl->sub, ar, ai, sr, si, stage);
        for (int64_t k = 0; k < n; k++) {
            const cpx c = pl->chirp[k];
            for (int b = 0; b < FFT_B; b++) {
                double xr = ar[k * FFT_B + b], xi = -ai[k * FFT_B + b];
                re[k * FFT_B + b] = xr * c.re - xi * c.im;
                im[k * FFT_B + b] = xr * c.im + xi * c.re;
            }
        }
        return;
    }
    double *xr = re, *xi = im, *yr = tr, *yi = ti;
    int64_t l = n, s = 1;
    for (int f = 0; f < pl->nf; f++) {
        int P = pl->fac[f];
        stage(pl, l, s, P, xr, xi, yr, yi);
        l /= P;
        s *= P;
        double *t = xr;
        xr = yr;
        yr = t;
        t = xi;
        xi = yi;
        yi = t;
    }
    if (xr != re) {
        memcpy(re, xr, (size_t)(n * FFT_B) * sizeof *re);
        memcpy(im, xi, (size_t)(n * FFT_B) * sizeof *im);
    }
}

/* Plans are kept for reuse (a plan costs n sines and cosines, more than the
 * transform of a few lines): FFT_CACHE of them, lengths up to FFT_CACHE_MAX,
 * the least recently used replaced; a plan in use is never freed (refs). */
#define FFT_CACHE     8
#define FFT_CACHE_MAX (1 << 20)
static struct {
    fft_plan *pl;
    int refs;
    uint64_t used;
} fft_cache[FFT_CACHE];
static pthread_mutex_t fft_cache_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t fft_clock;

static fft_plan *fft_plan_get(int64_t n) {
    pthread_mutex_lock(&fft_cache_mu);
    for (int i = 0; i < FFT_CACHE; i++)
        if (fft_cache[i].pl && fft_cache[i].pl->n == n) {
            fft_cache[i].refs++;
            fft_cache[i].used = ++fft_clock;
            pthread_mutex_unlock(&fft_cache_mu);
            return fft_cache[i].pl;
        }
    pthread_mutex_unlock(&fft_cache_mu);
    fft_plan *pl = fft_plan_new(n); /* (outside the lock: other lengths go on) */
    if (!pl || n > FFT_CACHE_MAX) return pl;
    pthread_mutex_lock(&fft_cache_mu);
    int v = -1;
    for (int i = 0; i < FFT_CACHE; i++)
        if (fft_cache[i].refs == 0 &&
            (v < 0 || !fft_cache[i].pl || (fft_cache[v].pl && fft_cache[i].used < fft_cache[v].used)))
            v = i;
    fft_plan *old = NULL;
    if (v >= 0) {
        old = fft_cache[v].pl;
        fft_cache[v].pl = pl;
        fft_cache[v].refs = 1;
        fft_cache[v].used = ++fft_clock;
    }
    pthread_mutex_unlock(&fft_cache_mu);
    fft_plan_free(old);
    return pl;
}

/* Done with a plan from fft_plan_get (one the cache did not take is freed). */
static void fft_plan_put(fft_plan *pl) {
    pthread_mutex_lock(&fft_cache_mu);
    for (int i = 0; i < FFT_CACHE; i++)
        if (fft_cache[i].pl == pl) {
            fft_cache[i].refs--;
            pthread_mutex_unlock(&fft_cache_mu);
            return;
        }
    pthread_mutex_unlock(&fft_cache_mu);
    fft_plan_free(pl);
}

typedef struct fft_job {
    const fft_plan *pl;
    const tpu_tensor *o, *x;
    tpu_op op;
    int dim;
    bool inverse;
    double scale;
    bool half;     /* a real transform of even n as a complex one of tn = n/2 points */
    int64_t n, tn; /* signal length, transform length */
    int64_t tmp_len, lines;
    fftb_stage_fn *stage;
} fft_job;

/* Gather one line into buf as complex numbers, conjugated for the inverse
 * (c2r: the Hermitian extension of its first n/2+1 bins). */
static void fft_gather(const fft_job *j, int64_t off, cpx *buf) {
    const tpu_tensor *x = j->x;
    const int64_t s = x->strides[j->dim], n = j->n;
    const double sg = j->inverse ? -1.0 : 1.0;
    const int64_t cnt = j->op == TPU_OP_FFT_C2R ? n / 2 + 1 : n;
    switch ((tpu_dtype)x->dtype) {
    case TPU_C64: {
        const float *p = (const float *)x->base + 2 * off;
        for (int64_t i = 0; i < cnt; i++) buf[i] = (cpx){p[2 * i * s], sg * p[2 * i * s + 1]};
        break;
    }
    case TPU_C128: {
        const double *p = (const double *)x->base + 2 * off;
        for (int64_t i = 0; i < cnt; i++) buf[i] = (cpx){p[2 * i * s], sg * p[2 * i * s + 1]};
        break;
    }
    case TPU_F32: {
        const float *p = (const float *)x->base + off;
        for (int64_t i = 0; i < n; i++) buf[i] = (cpx){p[i * s], 0};
        break;
    }
    default: {
        const double *p = (const double *)x->base + off;
        for (int64_t i = 0; i < n; i++) buf[i] = (cpx){p[i * s], 0};
    }
    }
    if (j->op == TPU_OP_FFT_C2R)
        for (int64_t i = cnt; i < n; i++) buf[i] = (cpx){buf[n - i].re, -buf[n - i].im};
}

/* Scatter the transformed line (conjugated back for the inverse) times scale. */
static void fft_scatter(const fft_job *j, int64_t off, const cpx *buf) {
    const tpu_tensor *o = j->o;
    const int64_t s = o->strides[j->dim], cnt = o->sizes[j->dim];
    const double sc = j->scale, si = j->inverse ? -sc : sc;
    switch ((tpu_dtype)o->dtype) {
    case TPU_C64: {
        float *p = (float *)o->base + 2 * off;
        for (int64_t i = 0; i < cnt; i++)
            p[2 * i * s] = (float)(sc * buf[i].re), p[2 * i * s + 1] = (float)(si * buf[i].im);
        break;
    }
    case TPU_C128: {
        double *p = (double *)o->base + 2 * off;
        for (int64_t i = 0; i < cnt; i++) p[2 * i * s] = sc * buf[i].re, p[2 * i * s + 1] = si * buf[i].im;
        break;
    }
    case TPU_F32: {
        float *p = (float *)o->base + off;
        for (int64_t i = 0; i < cnt; i++) p[i * s] = (float)(sc * buf[i].re);
        break;
    }
    default: {
        double *p = (double *)o->base + off;
        for (int64_t i = 0; i < cnt; i++) p[i * s] = sc * buf[i].re;
    }
    }
}

/* A real transform of even length n = 2N runs as a complex one of N points
 * (job->half): z_j = x_2j + i x_2j+1, Z = fft_N(z), and the spectrum is
 * X_k = (Z_k + conj Z_(N-k)) / 2 - i e^(-pi i k/N) (Z_k - conj Z_(N-k)) / 2;
 * the inverse builds Z from the first N+1 bins the other way round. */
static double fft_real_at(const tpu_tensor *t, int64_t off) {
    return t->dtype == TPU_F32 ? ((const float *)t->base)[off] : ((const double *)t->base)[off];
}
static cpx fft_cplx_at(const tpu_tensor *t, int64_t off) {
    if (t->dtype == TPU_C64) return (cpx){((const float *)t->base)[2 * off], ((const float *)t->base)[2 * off + 1]};
    return (cpx){((const double *)t->base)[2 * off], ((const double *)t->base)[2 * off + 1]};
}

/* The transform's input for the line at `off` (tn points in buf). */
static void fft_load_line(const fft_job *j, int64_t off, cpx *buf) {
    if (!j->half) {
        fft_gather(j, off, buf);
        return;
    }
    const tpu_tensor *x = j->x;
    const int64_t s = x->strides[j->dim], N = j->tn;
    if (j->op == TPU_OP_FFT_R2C) {
        for (int64_t i = 0; i < N; i++)
            buf[i] = (cpx){fft_real_at(x, off + 2 * i * s), fft_real_at(x, off + (2 * i + 1) * s)};
        return;
    }
    const cpx *wh = j->pl->wh;
    for (int64_t k = 0; k < N; k++) { /* c2r: Z_k = (A + B) + i conj(wh_k) (A - B), A = X_k, B = conj X_(N-k) */
        cpx A = fft_cplx_at(x, off + k * s), b = fft_cplx_at(x, off + (N - k) * s);
        if (k == 0) A.im = 0, b.im = 0; /* the imaginary parts of bins 0 and N do not count */
        cpx B = {b.re, -b.im}, d = c_sub(A, B), w = {wh[k].re, -wh[k].im}, wd = c_mul(w, d);
        cpx z = {A.re + B.re - wd.im, A.im + B.im + wd.re};
        buf[k] = (cpx){z.re, -z.im}; /* conjugated: the inverse by the forward plan */
    }
}

/* Store the transformed line (tn points in buf; tmp holds n). */
static void fft_store_line(const fft_job *j, int64_t off, const cpx *buf, cpx *tmp) {
    if (!j->half) {
        fft_scatter(j, off, buf);
        return;
    }
    const int64_t N = j->tn, cnt = j->o->sizes[j->dim];
    if (j->op == TPU_OP_FFT_R2C) {
        const cpx *wh = j->pl->wh;
        for (int64_t k = 0; k < cnt; k++) {
            int64_t q = k <= N ? k : j->n - k; /* bins above N: conj of bin n - k */
            cpx A = buf[q % N], b = buf[(N - q) % N], B = {b.re, -b.im};
            cpx e = {0.5 * (A.re + B.re), 0.5 * (A.im + B.im)}, d = c_sub(A, B);
            cpx od = {0.5 * d.im, -0.5 * d.re}; /* (A - B) / 2i */
            cpx X = c_add(e, c_mul(wh[q], od));
            tmp[k] = k <= N ? X : (cpx){X.re, -X.im};
        }
    } else {
        for (int64_t i = 0; i < N; i++) tmp[2 * i] = (cpx){buf[i].re, 0}, tmp[2 * i + 1] = (cpx){-buf[i].im, 0};
    }
    fft_scatter(j, off, tmp);
}

static void fft_lines(void *ctx, int64_t l0, int64_t l1) {
    const fft_job *j = ctx;
    cpx *buf = malloc((size_t)(j->n + j->tn + j->tmp_len) * sizeof *buf);
    if (!buf) abort(); /* (the caller checked one allocation of this size) */
    for (int64_t l = l0; l < l1; l++) {
        fft_load_line(j, tpu_fft_line_off(j->x, j->dim, l), buf);
        fft_exec(j->pl, buf, buf + j->tn);
        fft_store_line(j, tpu_fft_line_off(j->o, j->dim, l), buf, buf + j->tn + j->tmp_len);
    }
    free(buf);
}

/* Groups g0..g1 of FFT_B lines (the last may be partial: its empty lanes
 * transform zeros and are not stored). */
static void fftb_groups(void *ctx, int64_t g0, int64_t g1) {
    const fft_job *j = ctx;
    const int64_t n = j->tn, len = n + j->tmp_len, lines = j->lines;
    double *mem = malloc((size_t)(2 * len * FFT_B) * sizeof *mem);
    cpx *line = malloc((size_t)(n + j->n) * sizeof *line), *tmp = line + n;
    if (!mem || !line) abort(); /* (the caller checked one allocation of this size) */
    double *re = mem, *im = mem + len * FFT_B, *tr = re + n * FFT_B, *ti = im + n * FFT_B;
    for (int64_t g = g0; g < g1; g++) {
        const int64_t l0 = g * FFT_B, nb = lines - l0 < FFT_B ? lines - l0 : FFT_B;
        for (int64_t b = 0; b < FFT_B; b++) {
            if (b < nb)
                fft_load_line(j, tpu_fft_line_off(j->x, j->dim, l0 + b), line);
            else
                memset(line, 0, (size_t)n * sizeof *line);
            for (int64_t e = 0; e < n; e++) re[e * FFT_B + b] = line[e].re, im[e * FFT_B + b] = line[e].im;
        }
        fftb_exec(j->pl, re, im, tr, ti, j->stage);
        const int64_t cnt = j->half ? n : j->o->sizes[j->dim];
        for (int64_t b = 0; b < nb; b++) {
            for (int64_t e = 0; e < cnt; e++) line[e] = (cpx){re[e * FFT_B + b], im[e * FFT_B + b]};
            fft_store_line(j, tpu_fft_line_off(j->o, j->dim, l0 + b), line, tmp);
        }
    }
    free(mem);
    free(line);
}

tpu_status tpu_k_fft(tpu_kargs *a) {
    int dim;
    int64_t n, lines;
    tpu_status st = tpu_fft_check(a, &dim, &n, &lines);
    if (st != TPU_OK) return st;
    if (n == 0 || lines == 0 || a->t[0].sizes[dim] == 0) return TPU_OK;
    const bool half = a->op != TPU_OP_FFT_C2C && n % 2 == 0;
    fft_job j = {NULL, &a->t[0], &a->t[1],         a->op, dim, false, a->p.f[0], half, n, half ? n / 2 : n,
                 0,    lines,    fftb_stage_pick()};
    /* (half: the conjugations of the inverse are in fft_load_line / fft_store_line) */
    j.inverse = !half && (a->op == TPU_OP_FFT_C2R || (a->op == TPU_OP_FFT_C2C && a->p.i[1] != 0));
    fft_plan *pl = fft_plan_get(j.tn);
    void *probe = pl ? malloc((size_t)(2 * n + 2 * pl->m) * sizeof(cpx) * FFT_B) : NULL;
    if (!probe) {
        if (pl) fft_plan_put(pl);
        return tpu_kernel_fail(a, "%s: out of host memory for a plan of length %lld", tpu_op_name(a->op), (long long)n);
    }
    free(probe);
    j.pl = pl;
    j.tmp_len = pl->nf == 0 && j.tn > 1 ? 2 * pl->m : j.tn;
    int64_t work = j.tn * (pl->nf ? pl->nf : 4 * 20);
    if (lines >= FFT_B / 2 && (j.tn + j.tmp_len) * FFT_B * 16 <= FFT_B_BYTES) { /* vectorized across lines */
        int64_t groups = (lines + FFT_B - 1) / FFT_B, gw = work * FFT_B;
        tpu_parallel_for(groups, gw >= 16384 ? 1 : 16384 / gw, fftb_groups, &j);
    } else {
        tpu_parallel_for(lines, work >= 16384 ? 1 : 16384 / work, fft_lines, &j);
    }
    fft_plan_put(pl);
    return TPU_OK;
}
