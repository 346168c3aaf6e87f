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
 * gathered into a contiguous buffer, transformed, scattered; they run in
 * parallel on the compute pool, each block of lines with its own buffers.
 * The inverse direction uses the same plan on conjugates:
 * ifft(x) = conj(fft(conj(x))). */
#include "kernels/kernels-impl.h"
#include <math.h>
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
} fft_plan;

static void fft_plan_free(fft_plan *pl) {
    if (!pl) return;
    fft_plan_free(pl->sub);
    free(pl->w);
    free(pl->chirp);
    free(pl->bhat);
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

typedef struct fft_job {
    const fft_plan *pl;
    const tpu_tensor *o, *x;
    tpu_op op;
    int dim;
    bool inverse;
    double scale;
    int64_t n, tmp_len;
} fft_job;

static int64_t fft_line_off(const tpu_tensor *t, int dim, int64_t line) {
    int64_t off = t->offset;
    for (int k = t->ndim - 1; k >= 0; k--) {
        if (k == dim) continue;
        off += (line % t->sizes[k]) * t->strides[k];
        line /= t->sizes[k];
    }
    return off;
}

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

static void fft_lines(void *ctx, int64_t l0, int64_t l1) {
    const fft_job *j = ctx;
    cpx *buf = malloc((size_t)(j->n + j->tmp_len) * sizeof *buf);
    if (!buf) abort(); /* (the caller checked one allocation of this size) */
    for (int64_t l = l0; l < l1; l++) {
        fft_gather(j, fft_line_off(j->x, j->dim, l), buf);
        fft_exec(j->pl, buf, buf + j->n);
        fft_scatter(j, fft_line_off(j->o, j->dim, l), buf);
    }
    free(buf);
}

tpu_status tpu_k_fft(tpu_kargs *a) {
    int dim;
    int64_t n, lines;
    tpu_status st = tpu_fft_check(a, &dim, &n, &lines);
    if (st != TPU_OK) return st;
    if (n == 0 || lines == 0 || a->t[0].sizes[dim] == 0) return TPU_OK;
    fft_job j = {NULL, &a->t[0], &a->t[1], a->op, dim, false, a->p.f[0], n, 0};
    j.inverse = a->op == TPU_OP_FFT_C2R || (a->op == TPU_OP_FFT_C2C && a->p.i[1] != 0);
    fft_plan *pl = fft_plan_new(n);
    void *probe = pl ? malloc((size_t)(2 * n + 2 * pl->m) * sizeof(cpx)) : NULL;
    if (!probe) {
        fft_plan_free(pl);
        return tpu_kernel_fail(a, "%s: out of host memory for a plan of length %lld", tpu_op_name(a->op), (long long)n);
    }
    free(probe);
    j.pl = pl;
    j.tmp_len = pl->nf == 0 && n > 1 ? 2 * pl->m : n;
    int64_t work = n * (pl->nf ? pl->nf : 4 * 20);
    tpu_parallel_for(lines, work >= 16384 ? 1 : 16384 / work, fft_lines, &j);
    fft_plan_free(pl);
    return TPU_OK;
}
