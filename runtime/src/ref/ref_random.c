/* ref_random.c - random fills from Philox4x32-10: the per-element function
 * (shared with the fast kernel, kernels/random.c), the checks, and the reference.
 *
 * Element i (row-major position in the output) takes `w` consecutive 32-bit
 * words of the Philox stream (seed, offset): block i*w/4, words from lane
 * (i*w)%4. w = 1 for 32-bit draws (float uniform and cauchy, bernoulli), 2
 * for 64-bit ones (double uniform and cauchy, integer ranges, geometric in
 * any dtype, float normal and log-normal: two uniforms), 4 for a double
 * normal or log-normal. The distributions are PyTorch's transformations of
 * uniforms (ATen/core/TransformationHelper.h): normal by Box-Muller,
 * log-normal its exp, cauchy median + sigma tan(pi (u - 1/2)), geometric
 * ceil(log u / log1p(-p)) (u = 0 read as 2^-54). So element i depends on (seed, offset, i) only, whatever
 * the tiling, thread count or mode. The per-element function is shared by
 * the fast kernel (parallel, block cache, contiguous store) and the
 * reference (serial, one block per element, generic store).
 *
 * Ranges hold in the output dtype, not in double: uniform's bounds are first
 * rounded to the dtype (as PyTorch does), and a draw that rounds up to `to`
 * becomes the dtype's largest value below `to` (for bf16 [0, 1) about one draw
 * in 512 rounds up; moving it one ulp down shifts the mean by 2^-17, where
 * PyTorch's "== to ? from" puts all of them on `from`). */
#include "ref/ref-impl.h"
#include <math.h>
#include <string.h>

static int words_per_elem(const tpu_kargs *a) {
    bool f64 = a->t[0].dtype == TPU_F64;
    switch (a->op) {
    case TPU_OP_RAND_NORMAL:
    case TPU_OP_RAND_LOG_NORMAL: return f64 ? 4 : 2;
    case TPU_OP_RAND_INT:
    case TPU_OP_RAND_GEOMETRIC: return 2;
    case TPU_OP_RAND_UNIFORM:
    case TPU_OP_RAND_CAUCHY: return f64 ? 2 : 1;
    default: return 1;
    }
}

/* v rounded to the float dtype dt exactly as tpu_store_f64 will round it. */
static double round_to(tpu_dtype dt, double v) {
    switch (dt) {
    case TPU_F32: return (float)v;
    case TPU_F16: return tpu_f16_to_f32(tpu_f32_to_f16((float)v));
    case TPU_BF16: return tpu_bf16_to_f32(tpu_f32_to_bf16((float)v));
    default: return v;
    }
}

/* The largest value of float dtype dt below x (x representable in dt, finite). */
static double below(tpu_dtype dt, double x) {
    switch (dt) {
    case TPU_F32: return nextafterf((float)x, -INFINITY);
    case TPU_F16:
    case TPU_BF16: {
        uint16_t h = dt == TPU_F16 ? tpu_f32_to_f16((float)x) : tpu_f32_to_bf16((float)x);
        if ((h & 0x7fffu) == 0)
            h = 0x8001u; /* +-0: the negative subnormal nearest 0 */
        else if (h & 0x8000u)
            h++; /* negative: one step away from 0 */
        else
            h--; /* positive: one step towards 0 */
        return dt == TPU_F16 ? tpu_f16_to_f32(h) : tpu_bf16_to_f32(h);
    }
    default: return nextafter(x, -INFINITY);
    }
}

/* A uniform draw u in [0, 1) mapped to [from, to) of dtype dt. */
static double uniform_in(tpu_dtype dt, double from, double to, double u) {
    from = round_to(dt, from);
    to = round_to(dt, to);
    double v = round_to(dt, from + u * (to - from));
    if (v >= to) {
        v = below(dt, to);
        if (v < from) v = from; /* from == to: the only value there is */
    }
    return v;
}

/* Draws of random_ over [low, high), or [low, high] when inclusive (ranges
 * that end at INT64_MAX; [INT64_MIN, INT64_MAX] is all 2^64 values). */
static uint64_t int_range(tpu_args_RAND_INT q) {
    return (uint64_t)q.high - (uint64_t)q.low + (q.inclusive ? 1u : 0u); /* 0: 2^64 */
}

static double unit_from(const uint32_t *w, bool f64) {
    if (f64) return tpu_u64_to_unit_double(((uint64_t)w[1] << 32) | w[0]);
    return tpu_u32_to_unit_float(w[0]);
}

void tpu_random_element(const tpu_kargs *a, int64_t i, tpu_rand_cache *cache, double p_override, double *fv,
                        int64_t *iv) {
    int wpe = words_per_elem(a);
    uint64_t word = (uint64_t)i * (uint64_t)wpe, g = word / 4;
    if (!cache->valid || cache->g != g) {
        tpu_args_RAND_INT s = tpu_unpack_RAND_INT(&a->p); /* seed, offset: the same slots in every RANDOM op */
        tpu_philox_block((uint64_t)s.seed, (uint64_t)s.offset, g, cache->w);
        cache->g = g;
        cache->valid = true;
    }
    const uint32_t *w = cache->w + (word % 4);
    bool f64 = a->t[0].dtype == TPU_F64;
    switch (a->op) {
    case TPU_OP_RAND_UNIFORM: {
        tpu_args_RAND_UNIFORM q = tpu_unpack_RAND_UNIFORM(&a->p);
        *fv = uniform_in((tpu_dtype)a->t[0].dtype, q.from, q.to, unit_from(w, f64));
        break;
    }
    case TPU_OP_RAND_NORMAL:
    case TPU_OP_RAND_LOG_NORMAL: { /* Box-Muller; log-normal is e^normal (the same packing) */
        tpu_args_RAND_NORMAL q = tpu_unpack_RAND_NORMAL(&a->p);
        double u1 = 1.0 - unit_from(w, f64), u2 = unit_from(w + (f64 ? 2 : 1), f64);
        *fv = q.mean + q.std * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
        if (a->op == TPU_OP_RAND_LOG_NORMAL) *fv = exp(*fv);
        break;
    }
    case TPU_OP_RAND_CAUCHY: { /* median + sigma tan(pi (u - 1/2)), as PyTorch's transformation */
        tpu_args_RAND_CAUCHY q = tpu_unpack_RAND_CAUCHY(&a->p);
        *fv = q.median + q.sigma * tan(3.14159265358979323846 * (unit_from(w, f64) - 0.5));
        break;
    }
    case TPU_OP_RAND_GEOMETRIC: { /* trials to the first success: ceil(log u / log(1 - p)), u in (0, 1) */
        tpu_args_RAND_GEOMETRIC q = tpu_unpack_RAND_GEOMETRIC(&a->p);
        double u = unit_from(w, true);
        *fv = ceil(log(u > 0 ? u : 0x1p-54) / log1p(-q.p));
        break;
    }
    case TPU_OP_RAND_BERNOULLI: *fv = tpu_u32_to_unit_float(w[0]) < p_override; break;
    case TPU_OP_RAND_INT: {
        tpu_args_RAND_INT q = tpu_unpack_RAND_INT(&a->p);
        uint64_t range = int_range(q);
        uint64_t x = ((uint64_t)w[1] << 32) | w[0];
        *iv = (int64_t)((uint64_t)q.low + (range ? x % range : x));
        break;
    }
    default: break;
    }
}

/* The Philox words of elements pos, pos + 1, ... of a one-word-per-element
 * fill, as many as one batch holds (at most n): *x points at the first,
 * the count is returned. */
enum { RAND_BATCH_BLOCKS = 64 };
static int fill_words(const tpu_kargs *a, int64_t pos, int n, uint32_t w[4 * RAND_BATCH_BLOCKS], const uint32_t **x) {
    tpu_args_RAND_INT s = tpu_unpack_RAND_INT(&a->p);
    int lane = (int)(pos % 4), m = n < 4 * RAND_BATCH_BLOCKS - lane ? n : 4 * RAND_BATCH_BLOCKS - lane;
    tpu_philox_blocks((uint64_t)s.seed, (uint64_t)s.offset, (uint64_t)pos / 4, (lane + m + 3) / 4, w);
    *x = w + lane;
    return m;
}

/* Bernoulli as the element function decides it, in integers: u = (w >> 8)
 * * 2^-24 exactly, so u < p iff (w >> 8) < ceil(p * 2^24) (the scaling by a
 * power of two is exact; NaN and p <= 0 give 0: never). */
static uint32_t bernoulli_limit(double p) {
    if (!(p > 0)) return 0;
    if (p >= 1) return 1u << 24;
    return (uint32_t)ceil(p * 16777216.0);
}

/* Eight draws of bernoulli against limit slim (bernoulli_limit, as a signed
 * int: below 2^24), as vector lanes of -1 / 0 (GCC vector extensions: -O2
 * does not vectorize the scalar loop, and each element's branch mispredicts). */
typedef uint32_t rv_u8 __attribute__((vector_size(32)));
typedef int32_t rv_i8 __attribute__((vector_size(32)));
typedef float rv_f8 __attribute__((vector_size(32)));
typedef double rv_d8 __attribute__((vector_size(64)));
typedef uint8_t rv_b8 __attribute__((vector_size(8)));
#define BERN8(c, x, slim)                \
    do {                                 \
        rv_u8 v_;                        \
        memcpy(&v_, (x), sizeof v_);     \
        (c) = (rv_i8)(v_ >> 8) < (slim); \
    } while (0) /* (a macro: a function returning a vector changes the ABI outside the AVX clone) */

TPU_TARGET_CLONES bool tpu_random_floats(const tpu_kargs *a, int64_t pos, int n, double p, float *out) {
    tpu_dtype dt = (tpu_dtype)a->t[0].dtype;
    bool uni = a->op == TPU_OP_RAND_UNIFORM && dt != TPU_F64;
    if (!uni && a->op != TPU_OP_RAND_BERNOULLI) return false; /* one 32-bit word per element: these two */
    double from = 0, to = 0;
    if (uni) { /* uniform_in, its bounds rounded once */
        tpu_args_RAND_UNIFORM q = tpu_unpack_RAND_UNIFORM(&a->p);
        from = round_to(dt, q.from);
        to = round_to(dt, q.to);
    }
    uint32_t w[4 * RAND_BATCH_BLOCKS];
    int32_t slim = (int32_t)bernoulli_limit(p); /* (at most 2^24) */
    for (int j0 = 0; j0 < n;) {
        const uint32_t *x;
        int m = fill_words(a, pos + j0, n - j0, w, &x);
        float *o = out + j0;
        if (uni) { /* uniform_in's steps, in passes of fixed-count blocks (they vectorize at -O2) */
            int j = 0;
            for (; j + 8 <= m; j += 8) { /* (vector types: gcc left the scalar loop scalar, 4x slower) */
                rv_u8 v;
                memcpy(&v, x + j, sizeof v);
                rv_f8 u = __builtin_convertvector((rv_i8)(v >> 8), rv_f8) * (1.0f / 16777216.0f);
                rv_d8 d = from + __builtin_convertvector(u, rv_d8) * (to - from);
                rv_f8 f = __builtin_convertvector(d, rv_f8);
                memcpy(o + j, &f, sizeof f);
            }
            for (; j < m; j++) o[j] = (float)(from + (double)tpu_u32_to_unit_float(x[j]) * (to - from));
            if (dt == TPU_BF16)
                for (j = 0; j < m; j++) o[j] = tpu_bf16_to_f32(tpu_f32_to_bf16(o[j]));
            else if (dt == TPU_F16)
                for (j = 0; j < m; j++) o[j] = tpu_f16_to_f32(tpu_f32_to_f16(o[j]));
            int up = 0; /* draws that rounded up to `to` (rare) */
            rv_i8 upv = {0};
            const float tof = (float)to; /* (exact: `to` is rounded to dt, at most a float) */
            for (j = 0; j + 8 <= m; j += 8) {
                rv_f8 f;
                memcpy(&f, o + j, sizeof f);
                upv |= f >= tof;
            }
            for (int k = 0; k < 8; k++) up |= upv[k] != 0;
            for (; j < m; j++) up |= o[j] >= to;
            if (up) {
                float lo = (float)(below(dt, to) < from ? from : below(dt, to));
                for (j = 0; j < m; j++)
                    if (o[j] >= to) o[j] = lo;
            }
        } else {
            int j = 0;
            for (; j + 8 <= m; j += 8) {
                rv_i8 c;
                BERN8(c, x + j, slim);
                rv_f8 f = __builtin_convertvector(-c, rv_f8);
                memcpy(o + j, &f, sizeof f);
            }
            for (; j < m; j++) o[j] = (float)((int32_t)(x[j] >> 8) < slim);
        }
        j0 += m;
    }
    return true;
}

TPU_TARGET_CLONES void tpu_random_bernoulli_bytes(const tpu_kargs *a, int64_t pos, int n, double p, uint8_t *out) {
    uint32_t w[4 * RAND_BATCH_BLOCKS];
    int32_t slim = (int32_t)bernoulli_limit(p); /* (at most 2^24) */
    for (int j0 = 0; j0 < n;) {
        const uint32_t *x;
        int m = fill_words(a, pos + j0, n - j0, w, &x);
        uint8_t *o = out + j0;
        int j = 0;
        for (; j + 8 <= m; j += 8) {
            rv_i8 c;
            BERN8(c, x + j, slim);
            rv_b8 b = __builtin_convertvector(-c, rv_b8);
            memcpy(o + j, &b, sizeof b);
        }
        for (; j < m; j++) o[j] = (uint8_t)((int32_t)(x[j] >> 8) < slim);
        j0 += m;
    }
}

/* Bernoulli with a tensor of probabilities: p read at the same position. */
static double bern_p(const tpu_kargs *a, const int64_t *idx) {
    if (a->n < 2) return tpu_unpack_RAND_BERNOULLI(&a->p).p;
    const tpu_tensor *p = &a->t[1];
    if (p->is_scalar) return p->f;
    int64_t off = 0;
    for (int d = 0; d < p->ndim; d++) off += idx[d] * p->strides[d];
    return tpu_load_f64(tpu_elem_ptr(p, off), (tpu_dtype)p->dtype);
}

bool tpu_random_store(const tpu_kargs *a, int64_t i, const int64_t *idx, tpu_rand_cache *cache) {
    const tpu_tensor *o = &a->t[0];
    int64_t off = 0;
    for (int d = 0; d < o->ndim; d++) off += idx[d] * o->strides[d];
    char *dst = tpu_elem_ptr(o, off);
    double fv = 0, p = a->op == TPU_OP_RAND_BERNOULLI ? bern_p(a, idx) : 0.0;
    int64_t iv = 0;
    tpu_random_element(a, i, cache, p, &fv, &iv);
    if (a->op == TPU_OP_RAND_INT)
        tpu_store_i64(dst, (tpu_dtype)o->dtype, iv);
    else
        tpu_store_f64(dst, (tpu_dtype)o->dtype, fv);
    return p >= 0 && p <= 1;
}

tpu_status tpu_random_bad_p(tpu_kargs *a) {
    return tpu_kernel_fail(a, "bernoulli_: Expected p_in >= 0 && p_in <= 1 to be true, but got false.");
}

tpu_status tpu_random_check(tpu_kargs *a) {
    if (a->op == TPU_OP_RAND_INT) {
        tpu_args_RAND_INT q = tpu_unpack_RAND_INT(&a->p);
        if (q.inclusive ? q.high < q.low : q.high <= q.low)
            return tpu_kernel_fail(a, "random_ expects 'from' to be less than 'to', but got from=%lld >= to=%lld",
                                   (long long)q.low, (long long)q.high);
    }
    if (a->op == TPU_OP_RAND_BERNOULLI && (a->n < 2 || a->t[1].is_scalar)) {
        double p = a->n < 2 ? tpu_unpack_RAND_BERNOULLI(&a->p).p : a->t[1].f;
        if (!(p >= 0 && p <= 1)) return tpu_kernel_fail(a, "bernoulli_ expects p to be in [0, 1], but got p=%g", p);
    }
    if (a->op == TPU_OP_RAND_GEOMETRIC) {
        double p = tpu_unpack_RAND_GEOMETRIC(&a->p).p;
        if (!(p > 0 && p < 1)) return tpu_kernel_fail(a, "geometric_ expects p to be in (0, 1), but got p=%g", p);
    }
    if (a->op == TPU_OP_RAND_CAUCHY || a->op == TPU_OP_RAND_LOG_NORMAL) { /* sigma / std: the same slot */
        double sd = tpu_unpack_RAND_CAUCHY(&a->p).sigma;
        if (!(sd > 0))
            return tpu_kernel_fail(
                a, "%s expects %s > 0.0, but found %s=%g", a->op == TPU_OP_RAND_CAUCHY ? "cauchy_" : "log_normal_",
                a->op == TPU_OP_RAND_CAUCHY ? "sigma" : "std", a->op == TPU_OP_RAND_CAUCHY ? "sigma" : "std", sd);
    }
    if (a->op == TPU_OP_RAND_UNIFORM) {
        tpu_args_RAND_UNIFORM q = tpu_unpack_RAND_UNIFORM(&a->p);
        if (!(q.from <= q.to))
            return tpu_kernel_fail(a, "uniform_ expects to return a [from, to) range, but found from=%g > to=%g",
                                   q.from, q.to);
    }
    return TPU_OK;
}

tpu_status tpu_ref_random(tpu_kargs *a) {
    const tpu_tensor *o = &a->t[0];
    tpu_status s = tpu_random_check(a);
    if (s) return s;
    int64_t n = tpu_tensor_numel(o), idx[TPU_MAX_DIMS];
    bool ok = true;
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i;
        for (int d = o->ndim - 1; d >= 0; d--) {
            idx[d] = rem % o->sizes[d];
            rem /= o->sizes[d];
        }
        tpu_rand_cache fresh = {0}; /* no reuse: one block per element */
        ok &= tpu_random_store(a, i, idx, &fresh);
    }
    return ok ? TPU_OK : tpu_random_bad_p(a);
}
