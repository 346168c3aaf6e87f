/* ref_misc.c - the matrix unit's operand check and reference kernel: a naive
 * loop in double, the oracle the fast kernel (kernels/gemm.c) is tested against. */
#include "ref/ref-impl.h"

tpu_status tpu_gemm_check(tpu_kargs *a) {
    const tpu_tensor *o = &a->t[0], *A = &a->t[1], *B = &a->t[2];
    if (o->ndim != 3 || A->ndim != 3 || B->ndim != 3 || (a->n > 3 && !a->t[3].is_scalar && a->t[3].ndim != 3))
        return tpu_kernel_fail(a, "matmul operands must be 3-d (batch, rows, cols)");
    if (A->sizes[2] != B->sizes[1] || o->sizes[1] != A->sizes[1] || o->sizes[2] != B->sizes[2] ||
        A->sizes[0] != o->sizes[0] || B->sizes[0] != o->sizes[0])
        return tpu_kernel_fail(a, "mat1 and mat2 shapes cannot be multiplied (%lldx%lld and %lldx%lld)",
                               (long long)A->sizes[1], (long long)A->sizes[2], (long long)B->sizes[1],
                               (long long)B->sizes[2]);
    return TPU_OK;
}

/* What the matrix unit sees of x: bf16 rounding (medium/bf16) or hi+lo split (high). */
static double mxu_value(double x, int part) {
    float f = (float)x;
    if (part == 0) return f;
    if (part == 1) return tpu_bf16_to_f32(tpu_f32_to_bf16(f));
    union {
        float f;
        uint32_t u;
    } v = {f};
    v.u &= 0xffff0000u;
    if (part == 2) return v.f;                        /* hi (truncated) */
    return tpu_bf16_to_f32(tpu_f32_to_bf16(f - v.f)); /* lo */
}

/* x * y as the matrix unit multiplies them (dt: A's dtype; prec: MATMUL's). */
static double mxu_product(double x, double y, tpu_dtype dt, int prec, bool f64) {
    if (f64 || (dt == TPU_F32 && prec == 0) || dt == TPU_F16)
        return (f64 ? x : (double)(float)x) * (f64 ? y : (double)(float)y);
    if (dt == TPU_F32 && prec == 1)
        return mxu_value(x, 2) * mxu_value(y, 2) + mxu_value(x, 2) * mxu_value(y, 3) +
               mxu_value(x, 3) * mxu_value(y, 2);
    return mxu_value(x, 1) * mxu_value(y, 1);
}

tpu_status tpu_conv2d_check(tpu_kargs *a, tpu_conv_geom *g) {
    const tpu_tensor *o = &a->t[0], *x = &a->t[1], *w = &a->t[2], *b = a->n > 3 ? &a->t[3] : NULL;
    if (o->ndim != 4 || x->ndim != 4 || w->ndim != 4 || (b && (b->is_scalar || b->ndim != 1)))
        return tpu_kernel_fail(a, "conv2d: expected 4-d output, input and weight and a 1-d bias");
    tpu_args_CONV2D q = tpu_unpack_CONV2D(&a->p);
    *g = (tpu_conv_geom){.N = x->sizes[0],
                         .C = x->sizes[1],
                         .H = x->sizes[2],
                         .W = x->sizes[3],
                         .O = w->sizes[0],
                         .G = q.groups,
                         .kh = (int)(q.kernel & 0xffff),
                         .kw = (int)(q.kernel >> 16),
                         .sh = (int)(q.stride & 0xffff),
                         .sw = (int)(q.stride >> 16),
                         .ph = (int)(q.padding & 0xffff),
                         .pw = (int)(q.padding >> 16),
                         .dh = (int)(q.dilation & 0xffff),
                         .dw = (int)(q.dilation >> 16)};
    if (g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 || g->dh < 1 || g->dw < 1 || g->G < 1)
        return tpu_kernel_fail(a, "conv2d: kernel, stride, dilation and groups must be positive");
    if (g->C % g->G || g->O % g->G || w->sizes[1] * g->G != g->C || w->sizes[2] != g->kh || w->sizes[3] != g->kw)
        return tpu_kernel_fail(a, "conv2d: weight does not match the input channels, groups or kernel");
    g->Cg = g->C / g->G;
    g->Og = g->O / g->G;
    g->K = g->Cg * g->kh * g->kw;
    g->OH = (g->H + 2 * g->ph - g->dh * (g->kh - 1) - 1) / g->sh + 1;
    g->OW = (g->W + 2 * g->pw - g->dw * (g->kw - 1) - 1) / g->sw + 1;
    if (o->sizes[0] != g->N || o->sizes[1] != g->O || o->sizes[2] != g->OH || o->sizes[3] != g->OW ||
        (b && b->sizes[0] != g->O))
        return tpu_kernel_fail(a, "conv2d: output or bias shape does not match the window");
    if (x->dtype != w->dtype || (b && b->dtype != x->dtype) || x->dtype == TPU_F64 || !tpu_dtype_is_float(x->dtype))
        return tpu_kernel_fail(a, "conv2d: input, weight and bias must share a float32 / float16 / bfloat16 dtype");
    return TPU_OK;
}

/* From the definition: each output element a sum over its window. */
static tpu_status ref_conv2d(tpu_kargs *a) {
    tpu_conv_geom g;
    tpu_status s = tpu_conv2d_check(a, &g);
    if (s) return s;
    const tpu_tensor *o = &a->t[0], *x = &a->t[1], *w = &a->t[2], *b = a->n > 3 ? &a->t[3] : NULL;
    tpu_dtype dt = (tpu_dtype)x->dtype;
    int prec = (int)tpu_unpack_CONV2D(&a->p).precision;
    for (int64_t n = 0; n < g.N; n++)
        for (int64_t oc = 0; oc < g.O; oc++)
            for (int64_t oh = 0; oh < g.OH; oh++)
                for (int64_t ow = 0; ow < g.OW; ow++) {
                    double acc = 0;
                    int64_t c0 = oc / g.Og * g.Cg;
                    for (int64_t c = 0; c < g.Cg; c++)
                        for (int i = 0; i < g.kh; i++)
                            for (int j = 0; j < g.kw; j++) {
                                int64_t h = oh * g.sh - g.ph + i * g.dh, v = ow * g.sw - g.pw + j * g.dw;
                                if (h < 0 || h >= g.H || v < 0 || v >= g.W) continue;
                                double xv = tpu_load_f64(tpu_elem_ptr(x, n * x->strides[0] + (c0 + c) * x->strides[1] +
                                                                             h * x->strides[2] + v * x->strides[3]),
                                                         dt);
                                double wv = tpu_load_f64(tpu_elem_ptr(w, oc * w->strides[0] + c * w->strides[1] +
                                                                             i * w->strides[2] + j * w->strides[3]),
                                                         dt);
                                acc += mxu_product(wv, xv, dt, prec, false);
                            }
                    if (b) acc += tpu_load_f64(tpu_elem_ptr(b, oc * b->strides[0]), dt);
                    tpu_store_f64(tpu_elem_ptr(o, n * o->strides[0] + oc * o->strides[1] + oh * o->strides[2] +
                                                      ow * o->strides[3]),
                                  (tpu_dtype)o->dtype, acc);
                }
    return TPU_OK;
}

tpu_status tpu_ref_gemm(tpu_kargs *a) {
    if (a->op == TPU_OP_CONV2D) return ref_conv2d(a);
    tpu_status s = tpu_gemm_check(a);
    if (s) return s;
    const tpu_tensor *o = &a->t[0], *A = &a->t[1], *B = &a->t[2], *C = a->n > 3 ? &a->t[3] : NULL;
    tpu_dtype dt = (tpu_dtype)A->dtype;
    tpu_args_MATMUL q = tpu_unpack_MATMUL(&a->p);
    int prec = (int)q.precision;
    bool f64 = dt == TPU_F64 || B->dtype == TPU_F64 || o->dtype == TPU_F64 || !tpu_dtype_is_float(dt);
    for (int64_t b = 0; b < o->sizes[0]; b++)
        for (int64_t i = 0; i < o->sizes[1]; i++)
            for (int64_t j = 0; j < o->sizes[2]; j++) {
                double acc = 0;
                for (int64_t k = 0; k < A->sizes[2]; k++) {
                    double x =
                        tpu_load_f64(tpu_elem_ptr(A, b * A->strides[0] + i * A->strides[1] + k * A->strides[2]), dt);
                    double y = tpu_load_f64(tpu_elem_ptr(B, b * B->strides[0] + k * B->strides[1] + j * B->strides[2]),
                                            (tpu_dtype)B->dtype);
                    acc += mxu_product(x, y, dt, prec, f64);
                }
                double v = q.alpha * acc;
                if (C && q.beta != 0.0)
                    v += q.beta *
                         (C->is_scalar
                              ? C->f
                              : tpu_load_f64(tpu_elem_ptr(C, b * C->strides[0] + i * C->strides[1] + j * C->strides[2]),
                                             (tpu_dtype)C->dtype));
                tpu_store_f64(tpu_elem_ptr(o, b * o->strides[0] + i * o->strides[1] + j * o->strides[2]),
                              (tpu_dtype)o->dtype, v);
            }
    return TPU_OK;
}
