/* vmath-impl.h - branch-free float math shared by kernel families
 * (elementwise, rnn, and the fused interpreter to come): bit casts, a
 * select without a branch, exp and tanh. Everything is inline and free of
 * calls and branches, so the loops that use it vectorize. */
#ifndef TPU_VMATH_IMPL_H
#define TPU_VMATH_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define EW_INLINE static inline __attribute__((always_inline))

/* VM_MAD(a, b, c) = a * b + c. In a file that defines TPU_VMATH_FMA before
 * including this header it is fmaf: one rounding, so the same bits on every
 * ISA, and one instruction in functions built for an FMA target (the file
 * must build its users so: elementwise.c's float tile functions); elsewhere
 * a multiply and an add (a libm fmaf call per element in a loop built
 * without FMA would be slow). */
#ifdef TPU_VMATH_FMA
#define VM_MAD(a, b, c) fmaf((a), (b), (c))
#else
#define VM_MAD(a, b, c) ((a) * (b) + (c))
#endif

EW_INLINE int32_t ew_f2b(float f) {
    int32_t i;
    memcpy(&i, &f, 4);
    return i;
}
EW_INLINE float ew_b2f(int32_t i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
EW_INLINE int64_t ew_d2b(double f) {
    int64_t i;
    memcpy(&i, &f, 8);
    return i;
}
EW_INLINE double ew_b2d(int64_t i) {
    double f;
    memcpy(&f, &i, 8);
    return f;
}
/* c ? a : b without a branch: FP ops are never speculated by gcc under
 * -ftrapping-math, so a plain ?: on computed values blocks vectorization. */
/* f rounded to bfloat16 (nearest even; a NaN stays a quiet NaN) and widened
 * back: what a bf16 store and load give (tpu_f32_to_bf16), as integer ops
 * that vectorize (the NaN test is signed: AVX2 has no unsigned compare). */
EW_INLINE float ew_round_bf16(float f) {
    uint32_t u = (uint32_t)ew_f2b(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    uint32_t m = -(uint32_t)((int32_t)(u & 0x7fffffffu) > 0x7f800000);
    return ew_b2f((int32_t)((((u | 0x400000u) & 0xffff0000u) & m) | (r & ~m)));
}

EW_INLINE float ew_self(int c, float a, float b) {
    int32_t m = -(int32_t)c;
    return ew_b2f((ew_f2b(a) & m) | (ew_f2b(b) & ~m));
}
EW_INLINE double ew_seld(int c, double a, double b) {
    int64_t m = -(int64_t)c;
    return ew_b2d((ew_d2b(a) & m) | (ew_d2b(b) & ~m));
}
/* exp: Cephes expf polynomial, 2^n applied in two steps so results that
 * become subnormal are rounded once. About 1 ulp. */
EW_INLINE float ew_expf(float x) {
    float xc = ew_self(x > 100.0f, 100.0f, x);
    xc = ew_self(xc < -110.0f, -110.0f, xc);
    xc = ew_self(x != x, 0.0f, xc);
    float t = xc * 1.44269504088896341f;
    float n = (t + 12582912.0f) - 12582912.0f;
    float r = VM_MAD(n, -0.693359375f, xc);
    r = VM_MAD(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = VM_MAD(p, r, 1.3981999507e-3f);
    p = VM_MAD(p, r, 8.3334519073e-3f);
    p = VM_MAD(p, r, 4.1665795894e-2f);
    p = VM_MAD(p, r, 1.6666665459e-1f);
    p = VM_MAD(p, r, 5.0000001201e-1f);
    float y = VM_MAD(p * r, r, r) + 1.0f;
    int32_t ni = (int32_t)n;
    int32_t n1 = ni >> 1, n2 = ni - n1;
    y = y * ew_b2f((n1 + 127) << 23) * ew_b2f((n2 + 127) << 23);
    y = ew_self(x > 88.72283935546875f, INFINITY, y);
    y = ew_self(x < -103.97208404541015625f, 0.0f, y);
    return ew_self(x != x, x, y);
}

/* tanh: Cephes odd polynomial for |x| < 0.625, else 1 - 2 / (exp(2|x|) + 1). */
EW_INLINE float ew_tanhf(float x) {
    float z = x * x;
    float ps = -5.70498872745e-3f;
    ps = VM_MAD(ps, z, 2.06390887954e-2f);
    ps = VM_MAD(ps, z, -5.37397155531e-2f);
    ps = VM_MAD(ps, z, 1.33314422036e-1f);
    ps = VM_MAD(ps, z, -3.33332819422e-1f);
    ps = VM_MAD(ps * z, x, x);
    float ax = fabsf(x);
    float e = ew_expf(ax + ax);
    float pl = copysignf(1.0f - 2.0f / (e + 1.0f), x);
    return ew_self(ax < 0.625f, ps, pl);
}

#endif
