/* reduce.c - fast kernels for reductions (RED) and scans (SCAN).
 *
 * DESIGN. A reduction's input dims split into kept dims (out.sizes[d] ==
 * in.sizes[d]) and reduced dims (out.sizes[d] == 1 != in.sizes[d]); each
 * group is coalesced separately. Two strategies:
 *  - rows: for each output element, fold the innermost reduced dim a row at
 *    a time. Contiguous float32/float64 rows are read in place with 4x8-lane
 *    vector accumulators (GCC vector extensions, so any -O level vectorizes);
 *    other rows are gathered into a double buffer first. Few outputs with a
 *    long reduction (x.sum()) are split into fixed chunks whose partial
 *    results are combined in chunk order, so the result does not depend on
 *    the number of workers.
 *  - columns: when the innermost kept dim is contiguous in the input and the
 *    reduction runs across it (sum over dim 0 of [N, M], a bias gradient),
 *    blocks of RED_CHUNK outputs are accumulated row after row into a local
 *    accumulator, instead of a strided walk per output. Very short
 *    reductions (sum over the last dim of [N, 3]) use columns too, gathered
 *    with a stride, rather than one call per output.
 * ARGMAX / ARGMIN over floats find the max (min) with the same folds, then
 * the first element equal to it (a NaN when it is NaN).
 * Every op is one or two passes of (map, combine) over the elements plus a
 * finalization: VAR/STD are two-pass (mean, then squared deviations),
 * LOGSUMEXP is max then sum(exp(x - max)). Floats accumulate in double,
 * SUM/PROD/AMAX/AMIN of integer to integer in wrapping int64.
 * Scans (cumsum, cumprod, logcumsumexp, cummax / cummin with indices) walk
 * each line in order (inherently serial); when the scan runs across a
 * contiguous inner dim, RED_CHUNK lines advance together. */
#include "kernels/kernels-impl.h"
#include "kernels/tile-impl.h"
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define RED_CHUNK         TPU_TILE /* gather buffer and column block */
#define RED_GRAIN         32768    /* input elements per parallel task */
#define RED_SPLIT_MAX_OUT 16       /* at most this many outputs: split long reductions */
#define RED_MIN_COLS      16       /* narrower kept inner dims use rows */
#define RED_SHORT         16       /* reductions this short use columns even when strided */
#define RED_L             8        /* lanes per vector */

/* One pass = a map of each element and a combine. */
typedef enum red_code {
    RC_SUM,
    RC_SUM_ABS,
    RC_SUM_SQ,
    RC_SUM_NZ,
    RC_SUM_DEV2,
    RC_SUM_POW,
    RC_SUM_EXPSUB,
    RC_PROD,
    RC_MAX,
    RC_MIN,
    RC_MAX_ABS,
    RC_MIN_ABS,
    RC_ANY,
    RC_ALL
} red_code;

typedef struct red_geom {
    int nk, nr;
    int64_t ksz[TPU_MAX_DIMS], kin[TPU_MAX_DIMS], kout[TPU_MAX_DIMS];
    int64_t rsz[TPU_MAX_DIMS], rin[TPU_MAX_DIMS];
    int64_t nout, nred;
} red_geom;

typedef struct red_ctx {
    tpu_op op;
    bool idom, arg, two_pass;
    red_geom g;
    const char *in;
    char *out;
    tpu_dtype idt, odt;
    size_t ies, oes;
    red_code c1, c2;
    double p, corr;
    int64_t cst;           /* column strategy: input stride between columns */
    int64_t nchunks;       /* split mode: chunks per output */
    red_code cur;          /* split mode: the pass being run */
    double *partial, *aux; /* split mode: [nout * nchunks], [nout] */
} red_ctx;

/* ---- element maps and combines, scalar and vector ---- */

static double red_ident(red_code c) {
    switch (c) {
    case RC_PROD:
    case RC_ALL: return 1;
    case RC_MAX: return -INFINITY;
    case RC_MIN:
    case RC_MIN_ABS: return INFINITY;
    default: return 0;
    }
}

static inline double red_maxn(double a, double b) { return (b > a) | (b != b) ? b : a; }
static inline double red_minn(double a, double b) { return (b < a) | (b != b) ? b : a; }

static double red_combine(red_code c, double a, double b) {
    switch (c) {
    case RC_PROD: return a * b;
    case RC_MAX:
    case RC_MAX_ABS:
    case RC_ANY: return red_maxn(a, b);
    case RC_MIN:
    case RC_MIN_ABS:
    case RC_ALL: return red_minn(a, b);
    default: return a + b;
    }
}

#define RED_VZERO        ((vd8){0})
#define RED_SEL(m, a, b) ((vd8)(((vl8)(a) & (m)) | ((vl8)(b) & ~(m))))
#define RV_ADD(l, v)     ((l) + (v))
#define RV_MUL(l, v)     ((l) * (v))
#define RV_MAX(l, v)     RED_SEL(((v) > (l)) | ((v) != (v)), (v), (l))
#define RV_MIN(l, v)     RED_SEL(((v) < (l)) | ((v) != (v)), (v), (l))
#define RV_ABS(v)        ((vd8)((vl8)(v) & (((vl8){0}) + INT64_MAX)))
#define RV_NZ(v)         __builtin_convertvector(-((v) != RED_VZERO), vd8)
#define RS_ADD(t, v)     ((t) + (v))
#define RS_MUL(t, v)     ((t) * (v))
#define RS_MAX(t, v)     red_maxn((t), (v))
#define RS_MIN(t, v)     red_minn((t), (v))

/* Loads are macros: a function returning a 64-byte vector outside the
 * AVX-512 clone changes the ABI (and trips gcc 12). */
#define RED_LDD(v, p) memcpy(&(v), (p), sizeof(vd8))
#define RED_STD(p, v) memcpy((p), &(v), sizeof(vd8))
#define RED_LDF(v, p)                           \
    do {                                        \
        vf8 f_;                                 \
        memcpy(&f_, (p), sizeof f_);            \
        (v) = __builtin_convertvector(f_, vd8); \
    } while (0)

/* exp of 8 doubles: n = round(x / ln 2), r = x - n ln 2 in two parts, a
 * degree-13 Taylor series of exp(r) (|r| <= ln2 / 2: error below 1 ulp),
 * then 2^n applied in two steps so a subnormal result is rounded once. */
#define RED_VEXP(y, x)                                                    \
    do {                                                                  \
        const vd8 magic_ = RED_VZERO + 0x1.8p52;                          \
        vl8 nan_ = (x) != (x);                                            \
        vd8 xc_ = RED_SEL((x) > 710.0, RED_VZERO + 710.0, (x));           \
        xc_ = RED_SEL(xc_ < -746.0, RED_VZERO - 746.0, xc_);              \
        xc_ = RED_SEL(nan_, RED_VZERO, xc_);                              \
        vd8 t_ = xc_ * 1.4426950408889634074 + magic_, n_ = t_ - magic_;  \
        vl8 ni_ = (vl8)t_ - (vl8)magic_, n1_ = ni_ >> 1, n2_ = ni_ - n1_; \
        vd8 r_ = xc_ - n_ * 6.93147180369123816490e-01;                   \
        r_ = r_ - n_ * 1.90821492927058770002e-10;                        \
        vd8 p_ = RED_VZERO + 1.0 / 6227020800.0;                          \
        p_ = p_ * r_ + 1.0 / 479001600.0;                                 \
        p_ = p_ * r_ + 1.0 / 39916800.0;                                  \
        p_ = p_ * r_ + 1.0 / 3628800.0;                                   \
        p_ = p_ * r_ + 1.0 / 362880.0;                                    \
        p_ = p_ * r_ + 1.0 / 40320.0;                                     \
        p_ = p_ * r_ + 1.0 / 5040.0;                                      \
        p_ = p_ * r_ + 1.0 / 720.0;                                       \
        p_ = p_ * r_ + 1.0 / 120.0;                                       \
        p_ = p_ * r_ + 1.0 / 24.0;                                        \
        p_ = p_ * r_ + 1.0 / 6.0;                                         \
        p_ = p_ * r_ + 0.5;                                               \
        p_ = p_ * r_ + 1.0;                                               \
        p_ = p_ * r_ + 1.0;                                               \
        p_ = p_ * (vd8)((n1_ + 1023) << 52) * (vd8)((n2_ + 1023) << 52);  \
        p_ = RED_SEL((x) > 710.0, RED_VZERO + INFINITY, p_);              \
        p_ = RED_SEL((x) < -746.0, RED_VZERO, p_);                        \
        (y) = RED_SEL(nan_, (x), p_);                                     \
    } while (0)

/* Fold n contiguous elements into acc: 4 vector accumulators, then lanes. */
#define RED_ROW(ID, MAPV, MAPS, CV, CS)                          \
    {                                                            \
        vd8 l0 = RED_VZERO + (ID), l1 = l0, l2 = l0, l3 = l0, v; \
        double t = (ID);                                         \
        int64_t i = 0;                                           \
        for (; i + 4 * RED_L <= n; i += 4 * RED_L) {             \
            LOADV(v, x + i);                                     \
            l0 = CV(l0, (MAPV));                                 \
            LOADV(v, x + i + RED_L);                             \
            l1 = CV(l1, (MAPV));                                 \
            LOADV(v, x + i + 2 * RED_L);                         \
            l2 = CV(l2, (MAPV));                                 \
            LOADV(v, x + i + 3 * RED_L);                         \
            l3 = CV(l3, (MAPV));                                 \
        }                                                        \
        for (; i + RED_L <= n; i += RED_L) {                     \
            LOADV(v, x + i);                                     \
            l0 = CV(l0, (MAPV));                                 \
        }                                                        \
        for (; i < n; i++) {                                     \
            double s = (double)x[i];                             \
            t = CS(t, (MAPS));                                   \
        }                                                        \
        l0 = CV(l0, l1);                                         \
        l2 = CV(l2, l3);                                         \
        l0 = CV(l0, l2);                                         \
        for (int j = 0; j < RED_L; j++) t = CS(t, l0[j]);        \
        return CS(acc, t);                                       \
    }

/* acc[i] = combine(acc[i], map(x[i])) for n contiguous columns. */
#define RED_COL(MAPV, MAPS, CV, CS)               \
    {                                             \
        int64_t i = 0;                            \
        for (; i + RED_L <= n; i += RED_L) {      \
            vd8 v, va, l;                         \
            LOADV(v, x + i);                      \
            RED_LDD(va, aux + i);                 \
            RED_LDD(l, acc + i);                  \
            (void)va;                             \
            l = CV(l, (MAPV));                    \
            RED_STD(acc + i, l);                  \
        }                                         \
        for (; i < n; i++) {                      \
            double s = (double)x[i], sa = aux[i]; \
            (void)sa;                             \
            acc[i] = CS(acc[i], (MAPS));          \
        }                                         \
        return;                                   \
    }

/* Four rows at once: acc = combine(acc, combine(combine(m(x0), m(x1)),
 * combine(m(x2), m(x3)))), a quarter of the accumulator traffic. */
#define RED_COL4(MAPV, CV)                       \
    {                                            \
        for (int64_t i = 0; i < n; i += RED_L) { \
            vd8 v, va, l, a, b, c2;              \
            RED_LDD(va, aux + i);                \
            (void)va;                            \
            LOADV(v, x0 + i);                    \
            a = (MAPV);                          \
            LOADV(v, x1 + i);                    \
            b = (MAPV);                          \
            a = CV(a, b);                        \
            LOADV(v, x2 + i);                    \
            b = (MAPV);                          \
            LOADV(v, x3 + i);                    \
            c2 = (MAPV);                         \
            b = CV(b, c2);                       \
            a = CV(a, b);                        \
            RED_LDD(l, acc + i);                 \
            l = CV(l, a);                        \
            RED_STD(acc + i, l);                 \
        }                                        \
        return true;                             \
    }

#define RED_FOLD_FNS(SFX, ST, ISA)                                                                                 \
    static ISA bool red_cols4_##SFX(red_code code, double *restrict acc, const ST *x0, const ST *x1, const ST *x2, \
                                    const ST *x3, int64_t n, const double *restrict aux) {                         \
        if (n % RED_L) return false;                                                                               \
        switch (code) {                                                                                            \
        case RC_SUM: RED_COL4(v, RV_ADD)                                                                           \
        case RC_SUM_ABS: RED_COL4(RV_ABS(v), RV_ADD)                                                               \
        case RC_SUM_SQ: RED_COL4(v * v, RV_ADD)                                                                    \
        case RC_SUM_DEV2: RED_COL4((v - va) * (v - va), RV_ADD)                                                    \
        case RC_MAX: RED_COL4(v, RV_MAX)                                                                           \
        case RC_MIN: RED_COL4(v, RV_MIN)                                                                           \
        default: return false;                                                                                     \
        }                                                                                                          \
    }                                                                                                              \
    static ISA double red_row_##SFX(red_code code, double acc, const ST *restrict x, int64_t n, double aux,        \
                                    double p) {                                                                    \
        const vd8 va = RED_VZERO + aux;                                                                            \
        switch (code) {                                                                                            \
        case RC_SUM: RED_ROW(0, v, s, RV_ADD, RS_ADD)                                                              \
        case RC_SUM_ABS: RED_ROW(0, RV_ABS(v), fabs(s), RV_ADD, RS_ADD)                                            \
        case RC_SUM_SQ: RED_ROW(0, v * v, s * s, RV_ADD, RS_ADD)                                                   \
        case RC_SUM_NZ: RED_ROW(0, RV_NZ(v), (double)(s != 0), RV_ADD, RS_ADD)                                     \
        case RC_SUM_DEV2: RED_ROW(0, (v - va) * (v - va), (s - aux) * (s - aux), RV_ADD, RS_ADD)                   \
        case RC_PROD: RED_ROW(1, v, s, RV_MUL, RS_MUL)                                                             \
        case RC_MAX: RED_ROW(-INFINITY, v, s, RV_MAX, RS_MAX)                                                      \
        case RC_MIN: RED_ROW(INFINITY, v, s, RV_MIN, RS_MIN)                                                       \
        case RC_MAX_ABS: RED_ROW(0, RV_ABS(v), fabs(s), RV_MAX, RS_MAX)                                            \
        case RC_MIN_ABS: RED_ROW(INFINITY, RV_ABS(v), fabs(s), RV_MIN, RS_MIN)                                     \
        case RC_ANY: RED_ROW(0, RV_NZ(v), (double)(s != 0), RV_MAX, RS_MAX)                                        \
        case RC_ALL: RED_ROW(1, RV_NZ(v), (double)(s != 0), RV_MIN, RS_MIN)                                        \
        case RC_SUM_EXPSUB: {                                                                                      \
            vd8 l = RED_VZERO, v, y;                                                                               \
            double t = 0;                                                                                          \
            int64_t i = 0;                                                                                         \
            for (; i + RED_L <= n; i += RED_L) {                                                                   \
                LOADV(v, x + i);                                                                                   \
                v = v - va;                                                                                        \
                RED_VEXP(y, v);                                                                                    \
                l = l + y;                                                                                         \
            }                                                                                                      \
            for (; i < n; i++) t += exp((double)x[i] - aux);                                                       \
            for (int j = 0; j < RED_L; j++) t += l[j];                                                             \
            return acc + t;                                                                                        \
        }                                                                                                          \
        default: break;                                                                                            \
        }                                                                                                          \
        for (int64_t i = 0; i < n; i++) { /* libm maps: one element at a time */                                   \
            double s = (double)x[i];                                                                               \
            acc += code == RC_SUM_POW ? pow(fabs(s), p) : exp(s - aux);                                            \
        }                                                                                                          \
        return acc;                                                                                                \
    }                                                                                                              \
    static ISA void red_cols_##SFX(red_code code, double *restrict acc, const ST *restrict x, int64_t n,           \
                                   const double *restrict aux, double p) {                                         \
        switch (code) {                                                                                            \
        case RC_SUM: RED_COL(v, s, RV_ADD, RS_ADD)                                                                 \
        case RC_SUM_ABS: RED_COL(RV_ABS(v), fabs(s), RV_ADD, RS_ADD)                                               \
        case RC_SUM_SQ: RED_COL(v * v, s * s, RV_ADD, RS_ADD)                                                      \
        case RC_SUM_NZ: RED_COL(RV_NZ(v), (double)(s != 0), RV_ADD, RS_ADD)                                        \
        case RC_SUM_DEV2: RED_COL((v - va) * (v - va), (s - sa) * (s - sa), RV_ADD, RS_ADD)                        \
        case RC_PROD: RED_COL(v, s, RV_MUL, RS_MUL)                                                                \
        case RC_MAX: RED_COL(v, s, RV_MAX, RS_MAX)                                                                 \
        case RC_MIN: RED_COL(v, s, RV_MIN, RS_MIN)                                                                 \
        case RC_MAX_ABS: RED_COL(RV_ABS(v), fabs(s), RV_MAX, RS_MAX)                                               \
        case RC_MIN_ABS: RED_COL(RV_ABS(v), fabs(s), RV_MIN, RS_MIN)                                               \
        case RC_ANY: RED_COL(RV_NZ(v), (double)(s != 0), RV_MAX, RS_MAX)                                           \
        case RC_ALL: RED_COL(RV_NZ(v), (double)(s != 0), RV_MIN, RS_MIN)                                           \
        case RC_SUM_EXPSUB: {                                                                                      \
            int64_t i = 0;                                                                                         \
            for (; i + RED_L <= n; i += RED_L) {                                                                   \
                vd8 v, va, l, y;                                                                                   \
                LOADV(v, x + i);                                                                                   \
                RED_LDD(va, aux + i);                                                                              \
                RED_LDD(l, acc + i);                                                                               \
                v = v - va;                                                                                        \
                RED_VEXP(y, v);                                                                                    \
                l = l + y;                                                                                         \
                RED_STD(acc + i, l);                                                                               \
            }                                                                                                      \
            for (; i < n; i++) acc[i] += exp((double)x[i] - aux[i]);                                               \
            return;                                                                                                \
        }                                                                                                          \
        default: break;                                                                                            \
        }                                                                                                          \
        for (int64_t i = 0; i < n; i++) {                                                                          \
            double s = (double)x[i];                                                                               \
            acc[i] += code == RC_SUM_POW ? pow(fabs(s), p) : exp(s - aux[i]);                                      \
        }                                                                                                          \
    }

/* The fold functions are compiled per ISA and picked at run time (gcc 12
 * crashes on target_clones of these vector selects). */
#if defined(__x86_64__) && defined(__GNUC__)
#define RED_ISA_AVX512 __attribute__((target("avx512f")))
#define RED_ISA_AVX2   __attribute__((target("avx2")))
#define LOADV          RED_LDF
RED_FOLD_FNS(f_avx512, float, RED_ISA_AVX512)
RED_FOLD_FNS(f_avx2, float, RED_ISA_AVX2)
RED_FOLD_FNS(f_base, float, )
#undef LOADV
#define LOADV RED_LDD
RED_FOLD_FNS(d_avx512, double, RED_ISA_AVX512)
RED_FOLD_FNS(d_avx2, double, RED_ISA_AVX2)
RED_FOLD_FNS(d_base, double, )
#undef LOADV

static int red_isa(void) {
    unsigned f = tpu_cpu_features();
    return (f & TPU_CPU_AVX512F) ? 2 : (f & TPU_CPU_AVX2) ? 1 : 0;
}

#define RED_DISPATCH(SFX, ST)                                                                                     \
    static double red_row_##SFX(red_code code, double acc, const ST *x, int64_t n, double aux, double p) {        \
        int isa = red_isa();                                                                                      \
        if (isa == 2) return red_row_##SFX##_avx512(code, acc, x, n, aux, p);                                     \
        if (isa == 1) return red_row_##SFX##_avx2(code, acc, x, n, aux, p);                                       \
        return red_row_##SFX##_base(code, acc, x, n, aux, p);                                                     \
    }                                                                                                             \
    static void red_cols_##SFX(red_code code, double *acc, const ST *x, int64_t n, const double *aux, double p) { \
        int isa = red_isa();                                                                                      \
        if (isa == 2)                                                                                             \
            red_cols_##SFX##_avx512(code, acc, x, n, aux, p);                                                     \
        else if (isa == 1)                                                                                        \
            red_cols_##SFX##_avx2(code, acc, x, n, aux, p);                                                       \
        else                                                                                                      \
            red_cols_##SFX##_base(code, acc, x, n, aux, p);                                                       \
    }                                                                                                             \
    static bool red_cols4_##SFX(red_code code, double *acc, const ST *const *x, int64_t n, const double *aux) {   \
        int isa = red_isa();                                                                                      \
        if (isa == 2) return red_cols4_##SFX##_avx512(code, acc, x[0], x[1], x[2], x[3], n, aux);                 \
        if (isa == 1) return red_cols4_##SFX##_avx2(code, acc, x[0], x[1], x[2], x[3], n, aux);                   \
        return red_cols4_##SFX##_base(code, acc, x[0], x[1], x[2], x[3], n, aux);                                 \
    }
RED_DISPATCH(f, float)
RED_DISPATCH(d, double)
#else
#define LOADV RED_LDF
RED_FOLD_FNS(f_base, float, )
#undef LOADV
#define LOADV RED_LDD
RED_FOLD_FNS(d_base, double, )
#undef LOADV
#define red_row_f  red_row_f_base
#define red_row_d  red_row_d_base
#define red_cols_f red_cols_f_base
#define red_cols_d red_cols_d_base
static bool red_cols4_f(red_code code, double *acc, const float *const *x, int64_t n, const double *aux) {
    return red_cols4_f_base(code, acc, x[0], x[1], x[2], x[3], n, aux);
}
static bool red_cols4_d(red_code code, double *acc, const double *const *x, int64_t n, const double *aux) {
    return red_cols4_d_base(code, acc, x[0], x[1], x[2], x[3], n, aux);
}
#endif

/* ---- int64 domain (SUM/PROD/AMAX/AMIN, integer to integer): wrapping ---- */

static int64_t red_ident_i(red_code c) {
    return c == RC_PROD ? 1 : c == RC_MAX ? INT64_MIN : c == RC_MIN ? INT64_MAX : 0;
}

static inline int64_t red_combine_i(red_code c, int64_t a, int64_t b) {
    switch (c) {
    case RC_PROD: return (int64_t)((uint64_t)a * (uint64_t)b);
    case RC_MAX: return a > b ? a : b;
    case RC_MIN: return a < b ? a : b;
    default: return (int64_t)((uint64_t)a + (uint64_t)b);
    }
}

/* ---- geometry ---- */

/* Append dim (size, strides) to a group, merging with the previous dim when
 * the pair is contiguous for every stride array given. */
static void red_push(int *n, int64_t *sz, int64_t *s1, int64_t *s2, int64_t size, int64_t st1, int64_t st2) {
    if (*n > 0 && s1[*n - 1] == st1 * size && (!s2 || s2[*n - 1] == st2 * size)) {
        sz[*n - 1] *= size;
        s1[*n - 1] = st1;
        if (s2) s2[*n - 1] = st2;
        return;
    }
    sz[*n] = size;
    s1[*n] = st1;
    if (s2) s2[*n] = st2;
    (*n)++;
}

static tpu_status red_geometry(tpu_kargs *a, red_geom *g) {
    const tpu_tensor *o = &a->t[0], *in = &a->t[1];
    if (a->n != 2 || o->ndim != in->ndim || in->is_scalar || o->is_scalar)
        return tpu_kernel_fail(a, "%s: expected out and input of the same rank", tpu_op_name(a->op));
    memset(g, 0, sizeof *g);
    g->nout = 1;
    g->nred = 1;
    for (int d = 0; d < in->ndim; d++) {
        int64_t n = in->sizes[d];
        bool red = o->sizes[d] == 1 && n != 1;
        if (!red && o->sizes[d] != n)
            return tpu_kernel_fail(a, "%s: output size %lld does not match input size %lld at dim %d",
                                   tpu_op_name(a->op), (long long)o->sizes[d], (long long)n, d);
        if (red)
            g->nred *= n;
        else
            g->nout *= n;
        if (n == 1) continue;
        if (red)
            red_push(&g->nr, g->rsz, g->rin, NULL, n, in->strides[d], 0);
        else
            red_push(&g->nk, g->ksz, g->kin, g->kout, n, in->strides[d], o->strides[d]);
    }
    if (g->nk == 0) {
        g->nk = 1;
        g->ksz[0] = 1;
    }
    if (g->nr == 0) {
        g->nr = 1;
        g->rsz[0] = 1;
    }
    return TPU_OK;
}

/* Offsets of kept element `o` (row-major over the kept dims). */
static void red_kept_offsets(const red_geom *g, int64_t o, int64_t *in_off, int64_t *out_off) {
    *in_off = 0;
    *out_off = 0;
    for (int d = g->nk - 1; d >= 0; d--) {
        int64_t i = o % g->ksz[d];
        o /= g->ksz[d];
        *in_off += i * g->kin[d];
        *out_off += i * g->kout[d];
    }
}

/* Input offset of reduced row `row` (row-major over all reduced dims but the innermost). */
static int64_t red_row_offset(const red_geom *g, int64_t row) {
    int64_t off = 0;
    for (int d = g->nr - 2; d >= 0; d--) {
        off += (row % g->rsz[d]) * g->rin[d];
        row /= g->rsz[d];
    }
    return off;
}

/* ---- row strategy ---- */

/* Fold one row of n elements with stride st (any dtype) into acc. */
static double red_fold_row(const red_ctx *c, red_code code, double acc, const char *p, int64_t n, int64_t st,
                           double aux) {
    if (st == 1 && c->idt == TPU_F32) return red_row_f(code, acc, (const float *)p, n, aux, c->p);
    if (st == 1 && c->idt == TPU_F64) return red_row_d(code, acc, (const double *)p, n, aux, c->p);
    if (st == 1 && c->ies == 1 && (code == RC_ANY || code == RC_ALL)) { /* bool / int8 / uint8: a byte scan */
        const uint8_t *q = (const uint8_t *)p;
        unsigned any = 0, all = 1;
        for (int64_t i = 0; i < n; i++) {
            any |= q[i];
            all &= q[i] != 0;
        }
        return code == RC_ANY ? red_maxn(acc, any != 0) : red_minn(acc, all);
    }
    double buf[RED_CHUNK];
    for (int64_t k = 0; k < n; k += RED_CHUNK) {
        int64_t m = n - k < RED_CHUNK ? n - k : RED_CHUNK;
        tpu_tile_load_f64(buf, p + (size_t)(k * st) * c->ies, st, m, c->idt);
        acc = red_row_d(code, acc, buf, m, aux, c->p);
    }
    return acc;
}

static int64_t red_fold_row_i(const red_ctx *c, red_code code, int64_t acc, const char *p, int64_t n, int64_t st) {
    int64_t buf[RED_CHUNK];
    for (int64_t k = 0; k < n; k += RED_CHUNK) {
        int64_t m = n - k < RED_CHUNK ? n - k : RED_CHUNK;
        tpu_tile_load_i64(buf, p + (size_t)(k * st) * c->ies, st, m, c->idt);
        for (int64_t i = 0; i < m; i++) acc = red_combine_i(code, acc, buf[i]);
    }
    return acc;
}

/* Fold reduced elements [rb, re) (row-major over the reduced dims) of the
 * output whose kept offset in the input is in_off. */
static double red_span(const red_ctx *c, red_code code, int64_t in_off, int64_t rb, int64_t re, double aux) {
    const red_geom *g = &c->g;
    int64_t L = g->rsz[g->nr - 1], st = g->rin[g->nr - 1];
    double acc = red_ident(code);
    for (int64_t r = rb; r < re;) {
        int64_t row = r / L, pos = r % L, len = L - pos < re - r ? L - pos : re - r;
        const char *p = c->in + (size_t)(in_off + red_row_offset(g, row) + pos * st) * c->ies;
        acc = red_fold_row(c, code, acc, p, len, st, aux);
        r += len;
    }
    return acc;
}

static int64_t red_span_i(const red_ctx *c, red_code code, int64_t in_off) {
    const red_geom *g = &c->g;
    int64_t L = g->rsz[g->nr - 1], st = g->rin[g->nr - 1];
    int64_t acc = red_ident_i(code);
    if (g->nred == 0) return acc;
    for (int64_t row = 0; row < g->nred / L; row++) {
        const char *p = c->in + (size_t)(in_off + red_row_offset(g, row)) * c->ies;
        acc = red_fold_row_i(c, code, acc, p, L, st);
    }
    return acc;
}

/* The pass-1 result turned into pass 2's parameter (VAR: the mean, LOGSUMEXP:
 * the max with infinities replaced by 0 as PyTorch does). */
static double red_aux(const red_ctx *c, double acc1) {
    if (c->op == TPU_OP_LOGSUMEXP) return isinf(acc1) ? 0 : acc1;
    return acc1 / (double)c->g.nred;
}

static double red_finalize(const red_ctx *c, double acc1, double acc2) {
    double n = (double)c->g.nred;
    switch (c->op) {
    case TPU_OP_MEAN: return acc1 / n;
    case TPU_OP_VAR:
    case TPU_OP_STD: {
        double div = n - c->corr;
        double v = acc2 / (div > 0 ? div : 0);
        return c->op == TPU_OP_STD ? sqrt(v) : v;
    }
    case TPU_OP_NORM:
        if (c->c1 == RC_SUM_SQ) return sqrt(acc1);
        if (c->c1 == RC_SUM_POW) return pow(acc1, 1.0 / c->p);
        return acc1;
    case TPU_OP_LOGSUMEXP: return log(acc2) + red_aux(c, acc1);
    default: return acc1;
    }
}

static void red_store_one_d(const red_ctx *c, int64_t out_off, double v) {
    tpu_store_f64(c->out + (size_t)out_off * c->oes, c->odt, v);
}

/* ARGMAX / ARGMIN: the first extreme element, where a NaN is the extreme.
 * Floats take two passes: the NaN-propagating max (min) with the vector
 * fold, then the first element equal to it (or the first NaN). */
static bool red_is_arg_hit(double v, double m) { return m != m ? v != v : v == m; }

static int64_t red_arg_row_i(const red_ctx *c, int64_t in_off) {
    int64_t L = c->g.rsz[c->g.nr - 1], st = c->g.rin[c->g.nr - 1], best = 0, bi = 0, buf[RED_CHUNK];
    bool amax = c->op == TPU_OP_ARGMAX;
    for (int64_t k = 0; k < L; k += RED_CHUNK) {
        int64_t m = L - k < RED_CHUNK ? L - k : RED_CHUNK;
        tpu_tile_load_i64(buf, c->in + (size_t)(in_off + k * st) * c->ies, st, m, c->idt);
        for (int64_t i = 0; i < m; i++) {
            if (k + i > 0 && !(amax ? buf[i] > bi : buf[i] < bi)) continue;
            best = k + i;
            bi = buf[i];
        }
    }
    return best;
}

static int64_t red_arg_row(const red_ctx *c, int64_t in_off) {
    if (!tpu_dtype_is_float(c->idt)) return red_arg_row_i(c, in_off);
    int64_t L = c->g.rsz[c->g.nr - 1], st = c->g.rin[c->g.nr - 1];
    double m = red_span(c, c->op == TPU_OP_ARGMAX ? RC_MAX : RC_MIN, in_off, 0, L, 0), buf[RED_CHUNK];
    for (int64_t k = 0; k < L; k += RED_CHUNK) {
        int64_t n = L - k < RED_CHUNK ? L - k : RED_CHUNK;
        tpu_tile_load_f64(buf, c->in + (size_t)(in_off + k * st) * c->ies, st, n, c->idt);
        for (int64_t i = 0; i < n; i++)
            if (red_is_arg_hit(buf[i], m)) return k + i;
    }
    return 0;
}

static void red_one_output(const red_ctx *c, int64_t o) {
    int64_t in_off, out_off;
    red_kept_offsets(&c->g, o, &in_off, &out_off);
    char *dst = c->out + (size_t)out_off * c->oes;
    if (c->arg) {
        tpu_store_i64(dst, c->odt, red_arg_row(c, in_off));
        return;
    }
    if (c->idom) {
        tpu_store_i64(dst, c->odt, red_span_i(c, c->c1, in_off));
        return;
    }
    double acc1 = red_span(c, c->c1, in_off, 0, c->g.nred, 0), acc2 = 0;
    if (c->two_pass) acc2 = red_span(c, c->c2, in_off, 0, c->g.nred, red_aux(c, acc1));
    red_store_one_d(c, out_off, red_finalize(c, acc1, acc2));
}

static void red_rows_task(void *ctx, int64_t b, int64_t e) {
    const red_ctx *c = ctx;
    for (int64_t o = b; o < e; o++) red_one_output(c, o);
}

/* Split mode: task t folds chunk t % nchunks of output t / nchunks. */
static void red_split_task(void *ctx, int64_t b, int64_t e) {
    red_ctx *c = ctx;
    for (int64_t t = b; t < e; t++) {
        int64_t o = t / c->nchunks, ch = t % c->nchunks, in_off, out_off;
        red_kept_offsets(&c->g, o, &in_off, &out_off);
        int64_t rb = ch * RED_GRAIN, re = rb + RED_GRAIN < c->g.nred ? rb + RED_GRAIN : c->g.nred;
        c->partial[t] = red_span(c, c->cur, in_off, rb, re, c->aux[o]);
    }
}

static void red_split_pass(red_ctx *c, red_code code, double *res) {
    c->cur = code;
    tpu_parallel_for(c->g.nout * c->nchunks, 1, red_split_task, c);
    for (int64_t o = 0; o < c->g.nout; o++) {
        double acc = red_ident(code);
        for (int64_t ch = 0; ch < c->nchunks; ch++) acc = red_combine(code, acc, c->partial[o * c->nchunks + ch]);
        res[o] = acc;
    }
}

static tpu_status red_run_split(red_ctx *c, tpu_kargs *a) {
    int64_t nout = c->g.nout;
    c->nchunks = (c->g.nred + RED_GRAIN - 1) / RED_GRAIN;
    c->partial = malloc((size_t)(nout * c->nchunks) * sizeof(double));
    c->aux = calloc((size_t)nout * 3, sizeof(double));
    if (!c->partial || !c->aux) {
        free(c->partial);
        free(c->aux);
        return tpu_kernel_fail(a, "%s: out of host memory", tpu_op_name(a->op));
    }
    double *acc1 = c->aux + nout, *acc2 = acc1 + nout;
    red_split_pass(c, c->c1, acc1);
    if (c->two_pass) {
        for (int64_t o = 0; o < nout; o++) c->aux[o] = red_aux(c, acc1[o]);
        red_split_pass(c, c->c2, acc2);
    }
    for (int64_t o = 0; o < nout; o++) {
        int64_t in_off, out_off;
        red_kept_offsets(&c->g, o, &in_off, &out_off);
        red_store_one_d(c, out_off, red_finalize(c, acc1[o], acc2[o]));
    }
    free(c->partial);
    free(c->aux);
    return TPU_OK;
}

/* ---- column strategy ---- */

/* Input offset of reduced element `r` (row-major over all reduced dims). */
static int64_t red_red_offset(const red_geom *g, int64_t r) {
    int64_t off = 0;
    for (int d = g->nr - 1; d >= 0; d--) {
        off += (r % g->rsz[d]) * g->rin[d];
        r /= g->rsz[d];
    }
    return off;
}

/* Rows r..r+3 in place when they are contiguous float32 / float64. */
static bool red_cols_pass4(const red_ctx *c, red_code code, double *acc, int64_t in_off, int64_t r, int64_t m,
                           const double *aux) {
    if (c->cst != 1 || r + 4 > c->g.nred || (c->idt != TPU_F32 && c->idt != TPU_F64)) return false;
    const void *x[4];
    for (int k = 0; k < 4; k++) x[k] = c->in + (size_t)(in_off + red_red_offset(&c->g, r + k)) * c->ies;
    if (c->idt == TPU_F32) return red_cols4_f(code, acc, (const float *const *)x, m, aux);
    return red_cols4_d(code, acc, (const double *const *)x, m, aux);
}

static void red_cols_pass(const red_ctx *c, red_code code, double *acc, int64_t in_off, int64_t m, const double *aux) {
    double buf[RED_CHUNK];
    for (int64_t j = 0; j < m; j++) acc[j] = red_ident(code);
    for (int64_t r = 0; r < c->g.nred; r++) {
        if (red_cols_pass4(c, code, acc, in_off, r, m, aux)) {
            r += 3;
            continue;
        }
        const char *p = c->in + (size_t)(in_off + red_red_offset(&c->g, r)) * c->ies;
        if (c->cst == 1 && c->idt == TPU_F32) {
            red_cols_f(code, acc, (const float *)p, m, aux, c->p);
            continue;
        }
        if (c->cst == 1 && c->idt == TPU_F64) {
            red_cols_d(code, acc, (const double *)p, m, aux, c->p);
            continue;
        }
        tpu_tile_load_f64(buf, p, c->cst, m, c->idt);
        red_cols_d(code, acc, buf, m, aux, c->p);
    }
}

static void red_cols_pass_i(const red_ctx *c, int64_t *acc, int64_t in_off, int64_t m) {
    int64_t buf[RED_CHUNK];
    for (int64_t j = 0; j < m; j++) acc[j] = red_ident_i(c->c1);
    for (int64_t r = 0; r < c->g.nred; r++) {
        tpu_tile_load_i64(buf, c->in + (size_t)(in_off + red_red_offset(&c->g, r)) * c->ies, c->cst, m, c->idt);
        for (int64_t j = 0; j < m; j++) acc[j] = red_combine_i(c->c1, acc[j], buf[j]);
    }
}

/* Column ARGMAX / ARGMIN: the reduced dim is the single one. */
static void red_cols_arg_i(const red_ctx *c, int64_t *idx, int64_t in_off, int64_t m) {
    int64_t best[RED_CHUNK], buf[RED_CHUNK];
    bool amax = c->op == TPU_OP_ARGMAX;
    for (int64_t r = 0; r < c->g.nred; r++) {
        tpu_tile_load_i64(r ? buf : best, c->in + (size_t)(in_off + r * c->g.rin[0]) * c->ies, c->cst, m, c->idt);
        for (int64_t j = 0; j < m && r == 0; j++) idx[j] = 0;
        for (int64_t j = 0; j < m && r > 0; j++) {
            if (!(amax ? buf[j] > best[j] : buf[j] < best[j])) continue;
            idx[j] = r;
            best[j] = buf[j];
        }
    }
}

static void red_cols_arg(const red_ctx *c, int64_t *idx, int64_t in_off, int64_t m) {
    if (!tpu_dtype_is_float(c->idt)) {
        red_cols_arg_i(c, idx, in_off, m);
        return;
    }
    double ext[RED_CHUNK], buf[RED_CHUNK], aux[RED_CHUNK] = {0};
    bool found[RED_CHUNK] = {0};
    red_cols_pass(c, c->op == TPU_OP_ARGMAX ? RC_MAX : RC_MIN, ext, in_off, m, aux);
    int64_t left = m;
    for (int64_t r = 0; r < c->g.nred && left > 0; r++) {
        tpu_tile_load_f64(buf, c->in + (size_t)(in_off + r * c->g.rin[0]) * c->ies, c->cst, m, c->idt);
        for (int64_t j = 0; j < m; j++) {
            if (found[j] || !red_is_arg_hit(buf[j], ext[j])) continue;
            idx[j] = r;
            found[j] = true;
            left--;
        }
    }
}

static void red_cols_block(const red_ctx *c, int64_t t) {
    const red_geom *g = &c->g;
    int64_t K = g->ksz[g->nk - 1], nblk = (K + RED_CHUNK - 1) / RED_CHUNK;
    int64_t col0 = (t % nblk) * RED_CHUNK, m = K - col0 < RED_CHUNK ? K - col0 : RED_CHUNK;
    int64_t in_off, out_off, ost = g->kout[g->nk - 1];
    red_kept_offsets(g, (t / nblk) * K + col0, &in_off, &out_off);
    char *dst = c->out + (size_t)out_off * c->oes;
    double acc1[RED_CHUNK], acc2[RED_CHUNK], aux[RED_CHUNK] = {0};
    int64_t acci[RED_CHUNK];
    if (c->arg || c->idom) {
        if (c->arg)
            red_cols_arg(c, acci, in_off, m);
        else
            red_cols_pass_i(c, acci, in_off, m);
        tpu_tile_store_i64(dst, ost, acci, m, c->odt);
        return;
    }
    red_cols_pass(c, c->c1, acc1, in_off, m, aux);
    if (c->two_pass) {
        for (int64_t j = 0; j < m; j++) aux[j] = red_aux(c, acc1[j]);
        red_cols_pass(c, c->c2, acc2, in_off, m, aux);
    }
    for (int64_t j = 0; j < m; j++) acc1[j] = red_finalize(c, acc1[j], c->two_pass ? acc2[j] : 0);
    tpu_tile_store_f64(dst, ost, acc1, m, c->odt);
}

static void red_cols_task(void *ctx, int64_t b, int64_t e) {
    for (int64_t t = b; t < e; t++) red_cols_block(ctx, t);
}

/* ---- setup ---- */

static void red_setup_codes(red_ctx *c, const tpu_params *p) {
    c->p = tpu_unpack_NORM(p).p;
    c->corr = tpu_unpack_VAR(p).correction; /* STD: the same column */
    c->two_pass = false;
    switch (c->op) {
    case TPU_OP_PROD: c->c1 = RC_PROD; break;
    case TPU_OP_AMAX: c->c1 = RC_MAX; break;
    case TPU_OP_AMIN: c->c1 = RC_MIN; break;
    case TPU_OP_ANY: c->c1 = RC_ANY; break;
    case TPU_OP_ALL: c->c1 = RC_ALL; break;
    case TPU_OP_VAR:
    case TPU_OP_STD:
        c->c1 = RC_SUM;
        c->c2 = RC_SUM_DEV2;
        c->two_pass = true;
        break;
    case TPU_OP_LOGSUMEXP:
        c->c1 = RC_MAX;
        c->c2 = RC_SUM_EXPSUB;
        c->two_pass = true;
        break;
    case TPU_OP_NORM:
        c->c1 = isinf(c->p) ? (c->p > 0 ? RC_MAX_ABS : RC_MIN_ABS)
                : c->p == 0 ? RC_SUM_NZ
                : c->p == 1 ? RC_SUM_ABS
                : c->p == 2 ? RC_SUM_SQ
                            : RC_SUM_POW;
        break;
    default: c->c1 = RC_SUM; break;
    }
}

static bool red_needs_data(const red_ctx *c) {
    return c->arg || c->op == TPU_OP_AMAX || c->op == TPU_OP_AMIN || c->c1 == RC_MAX_ABS || c->c1 == RC_MIN_ABS;
}

/* ARGMAX / ARGMIN reduce exactly dim i0 (or nothing, for a size-1 dim). */
static tpu_status red_check_arg_dim(tpu_kargs *a) {
    const tpu_tensor *in = &a->t[1], *o = &a->t[0];
    int64_t dim = tpu_unpack_ARGMAX(&a->p).dim; /* ARGMIN: the same column */
    int64_t d = dim < 0 ? dim + in->ndim : dim;
    if (in->ndim == 0) return TPU_OK;
    if (d < 0 || d >= in->ndim)
        return tpu_kernel_fail(a, "%s: dim %lld out of range", tpu_op_name(a->op), (long long)dim);
    for (int k = 0; k < in->ndim; k++)
        if (k != d && o->sizes[k] == 1 && in->sizes[k] != 1)
            return tpu_kernel_fail(a, "%s: reduces dim %d but i0 is %lld", tpu_op_name(a->op), k, (long long)d);
    return TPU_OK;
}

/* Columns when the innermost kept dim is contiguous in the input (the
 * reduction runs across it), or when each reduction is so short that a call
 * per output would dominate: then the columns are gathered with a stride. */
static bool red_use_columns(const red_ctx *c) {
    const red_geom *g = &c->g;
    if (g->nred <= 1 || g->ksz[g->nk - 1] < RED_MIN_COLS || (c->arg && g->nr != 1)) return false;
    return g->kin[g->nk - 1] == 1 || g->nred <= RED_SHORT;
}

static tpu_status red_setup(red_ctx *c, tpu_kargs *a) {
    memset(c, 0, sizeof *c);
    tpu_status st = red_geometry(a, &c->g);
    if (st != TPU_OK) return st;
    const tpu_tensor *o = &a->t[0], *in = &a->t[1];
    c->op = a->op;
    c->arg = a->op == TPU_OP_ARGMAX || a->op == TPU_OP_ARGMIN;
    if (c->arg && (st = red_check_arg_dim(a)) != TPU_OK) return st;
    c->idt = (tpu_dtype)in->dtype;
    c->odt = (tpu_dtype)o->dtype;
    c->ies = tpu_dtype_size(c->idt);
    c->oes = tpu_dtype_size(c->odt);
    c->in = (const char *)in->base + (size_t)in->offset * c->ies;
    c->out = (char *)o->base + (size_t)o->offset * c->oes;
    c->idom = !tpu_dtype_is_float(c->idt) && !tpu_dtype_is_float(c->odt) &&
              (c->op == TPU_OP_SUM || c->op == TPU_OP_PROD || c->op == TPU_OP_AMAX || c->op == TPU_OP_AMIN);
    red_setup_codes(c, &a->p);
    return TPU_OK;
}

tpu_status tpu_k_reduce(tpu_kargs *a) {
    if (tpu_op_family_of(a->op) != TPU_FAM_RED) return tpu_kernel_fail(a, "%s: not a reduction", tpu_op_name(a->op));
    red_ctx c;
    tpu_status st = red_setup(&c, a);
    if (st != TPU_OK || c.g.nout == 0) return st;
    if (c.g.nred == 0 && red_needs_data(&c))
        return tpu_kernel_fail(a, "%s(): Expected reduction dim to be specified for input.numel() == 0.",
                               tpu_op_name(a->op));
    int64_t work = c.g.nout * (c.g.nred > 0 ? c.g.nred : 1);
    if (red_use_columns(&c)) {
        c.cst = c.g.kin[c.g.nk - 1];
        int64_t K = c.g.ksz[c.g.nk - 1], ntask = c.g.nout / K * ((K + RED_CHUNK - 1) / RED_CHUNK);
        int64_t per = c.g.nred * RED_CHUNK;
        tpu_parallel_for(ntask, per >= RED_GRAIN ? 1 : RED_GRAIN / per, red_cols_task, &c);
        return TPU_OK;
    }
    if (!c.arg && !c.idom && c.g.nout <= RED_SPLIT_MAX_OUT && c.g.nred >= 2 * RED_GRAIN) return red_run_split(&c, a);
    int64_t per = work / c.g.nout;
    tpu_parallel_for(c.g.nout, per >= RED_GRAIN ? 1 : RED_GRAIN / (per > 0 ? per : 1), red_rows_task, &c);
    return TPU_OK;
}

/* ---- rows for the graph engine ---- */

bool tpu_red_row_exact(const tpu_kargs *a) {
    if (a->op != TPU_OP_SUM && a->op != TPU_OP_MEAN && a->op != TPU_OP_AMAX && a->op != TPU_OP_AMIN) return false;
    if (a->n != 2 || a->t[1].is_scalar || a->t[0].ndim != a->t[1].ndim || a->t[1].ndim < 1) return false;
    const tpu_tensor *o = &a->t[0], *in = &a->t[1];
    int last = in->ndim - 1;
    for (int d = 0; d < last; d++)
        if (o->sizes[d] != in->sizes[d]) return false;
    if (o->sizes[last] != 1 || in->strides[last] != 1) return false; /* the last dim, read in place */
    tpu_dtype idt = (tpu_dtype)in->dtype, odt = (tpu_dtype)o->dtype;
    if ((idt != TPU_F32 && idt != TPU_BF16 && idt != TPU_F16) || (odt != TPU_F32 && odt != TPU_BF16 && odt != TPU_F16))
        return false;
    tpu_kargs probe; /* (red_setup may write a failure into it) */
    memcpy(&probe, a, offsetof(tpu_kargs, err));
    red_ctx c;
    if (red_setup(&c, &probe) != TPU_OK || c.g.nout == 0 || c.g.nred != in->sizes[last]) return false;
    if (red_use_columns(&c) || (c.g.nout <= RED_SPLIT_MAX_OUT && c.g.nred >= 2 * RED_GRAIN)) return false;
    return c.g.nr == 1 && c.g.rin[0] == 1 && !c.two_pass;
}

double tpu_red_row_value(tpu_op op, tpu_dtype idt, const float *x, int64_t n) {
    red_code code = op == TPU_OP_AMAX ? RC_MAX : op == TPU_OP_AMIN ? RC_MIN : RC_SUM;
    double acc = red_ident(code);
    if (idt == TPU_F32) {
        acc = red_row_f(code, acc, x, n, 0, 0);
    } else { /* red_fold_row's chunks of doubles */
        double buf[RED_CHUNK];
        for (int64_t k = 0; k < n; k += RED_CHUNK) {
            int64_t m = n - k < RED_CHUNK ? n - k : RED_CHUNK;
            for (int64_t i = 0; i < m; i++) buf[i] = (double)x[k + i];
            acc = red_row_d(code, acc, buf, m, 0, 0);
        }
    }
    return op == TPU_OP_MEAN ? acc / (double)n : acc;
}

/* ---- scans ---- */

/* What a scan folds: CUMSUM, CUMPROD, LOGCUMSUMEXP (floats), CUMMAX / CUMMIN
 * (values and the index each came from: ties and NaN take the later index,
 * a NaN stays, as PyTorch's kernels do). */
enum { SCAN_SUM, SCAN_PROD, SCAN_LSE, SCAN_MAX, SCAN_MIN };

typedef struct scan_ctx {
    bool idom;
    int kind;
    const char *in;
    char *out, *idx; /* idx: CUMMAX / CUMMIN's int64 indices, out's strides */
    tpu_dtype idt, odt;
    size_t ies, oes;
    int64_t len, sin, sout; /* the scanned dim */
    int nl;                 /* line dims (all others), coalesced */
    int64_t lsz[TPU_MAX_DIMS], lin[TPU_MAX_DIMS], lout[TPU_MAX_DIMS];
    int64_t nlines;
    bool columns;
} scan_ctx;

/* log(e^x + e^y) as PyTorch's scan accumulates it (equal infinities stay). */
static inline double scan_lse(double x, double y) {
    double mn = y != y ? y : (y < x ? y : x), mx = y != y ? y : (x < y ? y : x);
    return (mn != mx || isfinite(mn)) ? mx + log1p(exp(mn - mx)) : x;
}
static inline void scan_step_f(int kind, double *acc, int64_t *at, double v, int64_t k) {
    switch (kind) {
    case SCAN_SUM: *acc += v; break;
    case SCAN_PROD: *acc *= v; break;
    case SCAN_LSE: *acc = scan_lse(*acc, v); break;
    default:
        if (k == 0 || v != v || (*acc == *acc && (kind == SCAN_MAX ? v >= *acc : v <= *acc))) {
            *acc = v;
            *at = k;
        }
    }
}
static inline void scan_step_i(int kind, int64_t *acc, int64_t *at, int64_t v, int64_t k) {
    switch (kind) {
    case SCAN_SUM: *acc = (int64_t)((uint64_t)*acc + (uint64_t)v); break;
    case SCAN_PROD: *acc = (int64_t)((uint64_t)*acc * (uint64_t)v); break;
    default:
        if (k == 0 || (kind == SCAN_MAX ? v >= *acc : v <= *acc)) {
            *acc = v;
            *at = k;
        }
    }
}
static double scan_init(int kind) { return kind == SCAN_PROD ? 1 : kind == SCAN_LSE ? -INFINITY : 0; }

static void scan_line_offsets(const scan_ctx *c, int64_t line, int64_t *io, int64_t *oo) {
    *io = 0;
    *oo = 0;
    for (int d = c->nl - 1; d >= 0; d--) {
        int64_t i = line % c->lsz[d];
        line /= c->lsz[d];
        *io += i * c->lin[d];
        *oo += i * c->lout[d];
    }
}

/* One line, in order, RED_CHUNK elements at a time. */
static void scan_line(const scan_ctx *c, int64_t line) {
    int64_t io, oo;
    scan_line_offsets(c, line, &io, &oo);
    double bd[RED_CHUNK], accd = scan_init(c->kind);
    int64_t bi[RED_CHUNK], bx[RED_CHUNK], acci = (int64_t)accd, at = 0;
    for (int64_t k = 0; k < c->len; k += RED_CHUNK) {
        int64_t m = c->len - k < RED_CHUNK ? c->len - k : RED_CHUNK;
        const char *src = c->in + (size_t)(io + k * c->sin) * c->ies;
        size_t off = (size_t)(oo + k * c->sout);
        if (c->idom) {
            tpu_tile_load_i64(bi, src, c->sin, m, c->idt);
            for (int64_t i = 0; i < m; i++) {
                scan_step_i(c->kind, &acci, &at, bi[i], k + i);
                bi[i] = acci;
                bx[i] = at;
            }
            tpu_tile_store_i64(c->out + off * c->oes, c->sout, bi, m, c->odt);
        } else {
            tpu_tile_load_f64(bd, src, c->sin, m, c->idt);
            for (int64_t i = 0; i < m; i++) {
                scan_step_f(c->kind, &accd, &at, bd[i], k + i);
                bd[i] = accd;
                bx[i] = at;
            }
            tpu_tile_store_f64(c->out + off * c->oes, c->sout, bd, m, c->odt);
        }
        if (c->idx) tpu_tile_store_i64(c->idx + off * 8, c->sout, bx, m, TPU_I64);
    }
}

/* RED_CHUNK adjacent lines (contiguous inner dim) scanned together. */
static void scan_columns(const scan_ctx *c, int64_t t) {
    int64_t K = c->lsz[c->nl - 1], nblk = (K + RED_CHUNK - 1) / RED_CHUNK;
    int64_t col0 = (t % nblk) * RED_CHUNK, m = K - col0 < RED_CHUNK ? K - col0 : RED_CHUNK, io, oo;
    scan_line_offsets(c, (t / nblk) * K + col0, &io, &oo);
    double accd[RED_CHUNK], bd[RED_CHUNK];
    int64_t acci[RED_CHUNK], bi[RED_CHUNK], at[RED_CHUNK];
    for (int64_t j = 0; j < m; j++) {
        accd[j] = scan_init(c->kind);
        acci[j] = (int64_t)accd[j];
        at[j] = 0;
    }
    for (int64_t k = 0; k < c->len; k++) {
        const char *src = c->in + (size_t)(io + k * c->sin) * c->ies;
        size_t off = (size_t)(oo + k * c->sout);
        if (c->idom) {
            tpu_tile_load_i64(bi, src, 1, m, c->idt);
            for (int64_t j = 0; j < m; j++) scan_step_i(c->kind, &acci[j], &at[j], bi[j], k);
            tpu_tile_store_i64(c->out + off * c->oes, 1, acci, m, c->odt);
        } else {
            tpu_tile_load_f64(bd, src, 1, m, c->idt);
            for (int64_t j = 0; j < m; j++) scan_step_f(c->kind, &accd[j], &at[j], bd[j], k);
            tpu_tile_store_f64(c->out + off * c->oes, 1, accd, m, c->odt);
        }
        if (c->idx) tpu_tile_store_i64(c->idx + off * 8, 1, at, m, TPU_I64);
    }
}

static void scan_task(void *ctx, int64_t b, int64_t e) {
    const scan_ctx *c = ctx;
    for (int64_t t = b; t < e; t++) {
        if (c->columns)
            scan_columns(c, t);
        else
            scan_line(c, t);
    }
}

/* The scanned dim and the coalesced line dims. Operands: (out, in), or
 * (values, indices, in) for CUMMAX / CUMMIN with indices laid out as values. */
static tpu_status scan_setup(scan_ctx *c, tpu_kargs *a) {
    bool two = a->op == TPU_OP_CUMMAX || a->op == TPU_OP_CUMMIN;
    const tpu_tensor *o = &a->t[0], *in = &a->t[two ? 2 : 1], *ix = two ? &a->t[1] : NULL;
    if (tpu_op_family_of(a->op) != TPU_FAM_SCAN || a->n != (two ? 3 : 2) || o->ndim != in->ndim || in->is_scalar)
        return tpu_kernel_fail(a, "%s: expected out and input of the same rank", tpu_op_name(a->op));
    int nd = in->ndim;
    int64_t d0 = tpu_unpack_CUMSUM(&a->p).dim; /* every scan: the same column */
    int64_t dim = d0 < 0 ? d0 + nd : d0;
    if (nd > 0 && (dim < 0 || dim >= nd))
        return tpu_kernel_fail(a, "%s: dim %lld out of range", tpu_op_name(a->op), (long long)d0);
    for (int d = 0; d < nd; d++)
        if (o->sizes[d] != in->sizes[d]) return tpu_kernel_fail(a, "%s: output shape differs", tpu_op_name(a->op));
    if (ix) {
        bool same = ix->dtype == TPU_I64 && ix->ndim == nd;
        for (int d = 0; same && d < nd; d++) same = ix->sizes[d] == o->sizes[d] && ix->strides[d] == o->strides[d];
        if (!same) return tpu_kernel_fail(a, "%s: indices must be int64 laid out as values", tpu_op_name(a->op));
    }
    memset(c, 0, sizeof *c);
    c->idt = (tpu_dtype)in->dtype;
    c->odt = (tpu_dtype)o->dtype;
    c->ies = tpu_dtype_size(c->idt);
    c->oes = tpu_dtype_size(c->odt);
    c->in = (const char *)in->base + (size_t)in->offset * c->ies;
    c->out = (char *)o->base + (size_t)o->offset * c->oes;
    c->idx = ix ? (char *)ix->base + (size_t)ix->offset * 8 : NULL;
    c->idom = !tpu_dtype_is_float(c->idt) && !tpu_dtype_is_float(c->odt);
    c->kind = a->op == TPU_OP_CUMPROD        ? SCAN_PROD
              : a->op == TPU_OP_LOGCUMSUMEXP ? SCAN_LSE
              : a->op == TPU_OP_CUMMAX       ? SCAN_MAX
              : a->op == TPU_OP_CUMMIN       ? SCAN_MIN
                                             : SCAN_SUM;
    c->len = nd ? in->sizes[dim] : 1;
    c->sin = nd ? in->strides[dim] : 0;
    c->sout = nd ? o->strides[dim] : 0;
    for (int d = 0; d < nd; d++)
        if (d != dim && in->sizes[d] != 1)
            red_push(&c->nl, c->lsz, c->lin, c->lout, in->sizes[d], in->strides[d], o->strides[d]);
    if (c->nl == 0) {
        c->nl = 1;
        c->lsz[0] = 1;
    }
    return TPU_OK;
}

tpu_status tpu_k_scan(tpu_kargs *a) {
    scan_ctx c;
    tpu_status st = scan_setup(&c, a);
    int64_t numel = tpu_tensor_numel(&a->t[a->n - 1]);
    if (st != TPU_OK || numel == 0) return st;
    c.nlines = numel / c.len;
    int64_t K = c.lsz[c.nl - 1], ntask = c.nlines;
    c.columns = c.len > 1 && K >= RED_MIN_COLS && c.lin[c.nl - 1] == 1 && c.lout[c.nl - 1] == 1;
    if (c.columns) ntask = c.nlines / K * ((K + RED_CHUNK - 1) / RED_CHUNK);
    int64_t per = c.columns ? c.len * RED_CHUNK : c.len;
    tpu_parallel_for(ntask, per >= RED_GRAIN ? 1 : RED_GRAIN / per, scan_task, &c);
    return TPU_OK;
}
