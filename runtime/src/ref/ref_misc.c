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

tpu_status tpu_ref_gemm(tpu_kargs *a) {
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
                    if (f64 || (dt == TPU_F32 && prec == 0) || dt == TPU_F16)
                        acc += (f64 ? x : (double)(float)x) * (f64 ? y : (double)(float)y);
                    else if (dt == TPU_F32 && prec == 1)
                        acc += mxu_value(x, 2) * mxu_value(y, 2) + mxu_value(x, 2) * mxu_value(y, 3) +
                               mxu_value(x, 3) * mxu_value(y, 2);
                    else
                        acc += mxu_value(x, 1) * mxu_value(y, 1);
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
