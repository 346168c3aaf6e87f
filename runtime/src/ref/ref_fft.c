/* ref_fft.c - the FFT family's operand check, the line offsets both its kernels use, and the reference kernel: the
 * discrete Fourier transform by its definition, O(n^2) per line, summed in
 * long double with each angle reduced exactly (j*k mod n) before the sine
 * and cosine, the oracle the fast kernel (kernels/fft.c) is tested against. */
#include "ref/ref-impl.h"
#include <math.h>
#include <stdlib.h>

static tpu_dtype fft_real_of(tpu_dtype c) { return c == TPU_C64 ? TPU_F32 : TPU_F64; }

tpu_status tpu_fft_check(tpu_kargs *a, int *dim, int64_t *n, int64_t *lines) {
    const tpu_tensor *o = &a->t[0], *x = &a->t[1];
    const char *name = tpu_op_name(a->op);
    int64_t d = a->p.i[0];
    if (a->n != 2 || o->is_scalar || x->is_scalar) return tpu_kernel_fail(a, "%s: expects (out, in) tensors", name);
    if (o->ndim != x->ndim || x->ndim == 0 || d < 0 || d >= x->ndim)
        return tpu_kernel_fail(a, "%s: operands of %d and %d dims, dim %lld", name, o->ndim, x->ndim, (long long)d);
    tpu_dtype od = (tpu_dtype)o->dtype, xd = (tpu_dtype)x->dtype;
    bool ok;
    switch (a->op) {
    case TPU_OP_FFT_C2C: ok = tpu_dtype_is_complex(xd) && od == xd; break;
    case TPU_OP_FFT_R2C: ok = (xd == TPU_F32 || xd == TPU_F64) && od == (xd == TPU_F32 ? TPU_C64 : TPU_C128); break;
    default: ok = tpu_dtype_is_complex(xd) && od == fft_real_of(xd); break;
    }
    if (!ok)
        return tpu_kernel_fail(a, "%s: output dtype %s does not go with input dtype %s", name, tpu_dtype_name(od),
                               tpu_dtype_name(xd));
    *lines = 1;
    for (int k = 0; k < x->ndim; k++) {
        if (k == d) continue;
        if (o->sizes[k] != x->sizes[k])
            return tpu_kernel_fail(a, "%s: size mismatch at dim %d (%lld and %lld)", name, k, (long long)o->sizes[k],
                                   (long long)x->sizes[k]);
        *lines *= x->sizes[k];
    }
    int64_t on = o->sizes[d], xn = x->sizes[d];
    switch (a->op) {
    case TPU_OP_FFT_C2C:
        ok = on == xn;
        *n = xn;
        break;
    case TPU_OP_FFT_R2C:
        ok = on <= xn;
        *n = xn;
        break;
    default:
        ok = xn >= on / 2 + 1 || on == 0;
        *n = on;
        break;
    }
    if (!ok)
        return tpu_kernel_fail(a, "%s: %lld output and %lld input points along dim %lld", name, (long long)on,
                               (long long)xn, (long long)d);
    *dim = (int)d;
    return TPU_OK;
}

int64_t tpu_fft_line_off(const tpu_tensor *t, int dim, int64_t line) {
    int64_t off = t->offset;
    for (int k = t->ndim - 1; k >= 0; k--) {
        if (k == dim) continue;
        off += (line % t->sizes[k]) * t->strides[k];
        line /= t->sizes[k];
    }
    return off;
}

/* Element j of a line as a complex number (real dtypes: imaginary part 0). */
static void fft_load(const tpu_tensor *t, int64_t off, long double *re, long double *im) {
    const char *p = (const char *)t->base;
    switch ((tpu_dtype)t->dtype) {
    case TPU_C64: *re = ((const float *)p)[2 * off], *im = ((const float *)p)[2 * off + 1]; break;
    case TPU_C128: *re = ((const double *)p)[2 * off], *im = ((const double *)p)[2 * off + 1]; break;
    default: *re = tpu_load_f64(p + (size_t)off * tpu_dtype_size((tpu_dtype)t->dtype), (tpu_dtype)t->dtype), *im = 0;
    }
}

static void fft_store(const tpu_tensor *t, int64_t off, long double re, long double im) {
    char *p = (char *)t->base;
    switch ((tpu_dtype)t->dtype) {
    case TPU_C64: ((float *)p)[2 * off] = (float)re, ((float *)p)[2 * off + 1] = (float)im; break;
    case TPU_C128: ((double *)p)[2 * off] = (double)re, ((double *)p)[2 * off + 1] = (double)im; break;
    default: tpu_store_f64(p + (size_t)off * tpu_dtype_size((tpu_dtype)t->dtype), (tpu_dtype)t->dtype, (double)re);
    }
}

tpu_status tpu_ref_fft(tpu_kargs *a) {
    int dim;
    int64_t n, lines;
    tpu_status st = tpu_fft_check(a, &dim, &n, &lines);
    if (st != TPU_OK) return st;
    const tpu_tensor *o = &a->t[0], *x = &a->t[1];
    int64_t on = o->sizes[dim], os = o->strides[dim], xs = x->strides[dim];
    bool inv = a->op == TPU_OP_FFT_C2R || (a->op == TPU_OP_FFT_C2C && a->p.i[1] != 0);
    long double scale = a->p.f[0], sgn = inv ? 1 : -1, tau = 6.283185307179586476925286766559L;
    if (n == 0 || lines == 0 || on == 0) return TPU_OK;
    long double *re = malloc((size_t)n * sizeof *re), *im = malloc((size_t)n * sizeof *im);
    if (!re || !im) {
        free(re);
        free(im);
        return tpu_kernel_fail(a, "%s: out of host memory", tpu_op_name(a->op));
    }
    for (int64_t l = 0; l < lines; l++) {
        int64_t xo = tpu_fft_line_off(x, dim, l), oo = tpu_fft_line_off(o, dim, l);
        /* The line's n input points; c2r: the Hermitian extension of its n/2+1 bins. */
        for (int64_t j = 0; j < n; j++) {
            if (a->op != TPU_OP_FFT_C2R || j <= n / 2) {
                fft_load(x, xo + j * xs, &re[j], &im[j]);
            } else {
                fft_load(x, xo + (n - j) * xs, &re[j], &im[j]);
                im[j] = -im[j];
            }
        }
        for (int64_t k = 0; k < on; k++) {
            long double sr = 0, si = 0;
            for (int64_t j = 0; j < n; j++) {
                long double ang = sgn * tau * (long double)((j * k) % n) / (long double)n;
                long double c = cosl(ang), s = sinl(ang);
                sr += re[j] * c - im[j] * s;
                si += re[j] * s + im[j] * c;
            }
            fft_store(o, oo + k * os, scale * sr, scale * si);
        }
    }
    free(re);
    free(im);
    return TPU_OK;
}
