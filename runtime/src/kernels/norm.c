/* norm.c - layer norm forward and backward.
 *
 * x is split into rows: the trailing dims whose product is M = i0 form a row,
 * the leading dims enumerate rows (mean and rstd are written linearly in row
 * order). A row is read in place when its trailing dims are contiguous, else
 * through a table of M element offsets. Statistics use double accumulation
 * (two passes: mean, then squared deviations); the per-element math is in
 * float for f32/bf16/f16 and in double for f64.
 *
 * Backward: rows are cut into a fixed number of chunks (independent of the
 * worker count, so results are deterministic); each chunk writes dx for its
 * rows and partial dw/db column sums (float over LN_FLUSH rows, then double),
 * which are added in chunk order. */
#include "kernels/kernels-impl.h"
#include "kernels/tile-impl.h"
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#ifdef TPU_KERNELS_NO_CLONES
#define LN_CLONES
#else
#define LN_CLONES TPU_TARGET_CLONES
#endif
#define LN_INLINE     static inline __attribute__((always_inline))
#define LN_BWD_CHUNKS 16
#define LN_FLUSH      32 /* rows summed in float before adding into double */

LN_INLINE void vload(vf8 *v, const float *p) { memcpy(v, p, sizeof *v); }
LN_INLINE void vstore(float *p, const vf8 *v) { memcpy(p, v, sizeof *v); }
LN_INLINE void vload16(vf16 *v, const float *p) { memcpy(v, p, sizeof *v); }
LN_INLINE void vstore16(float *p, const vf16 *v) { memcpy(p, v, sizeof *v); }
/* the 8 floats of v as two double vectors (register shuffles: splitting
 * through memory stalls on store forwarding) */
LN_INLINE void vsplit(const vf8 *v, vd4 *lo, vd4 *hi) {
    vf4 l = __builtin_shufflevector(*v, *v, 0, 1, 2, 3);
    vf4 h = __builtin_shufflevector(*v, *v, 4, 5, 6, 7);
    *lo = __builtin_convertvector(l, vd4);
    *hi = __builtin_convertvector(h, vd4);
}
LN_INLINE void vsplit16(const vf16 *v, vd8 *lo, vd8 *hi) {
    vf8 l = __builtin_shufflevector(*v, *v, 0, 1, 2, 3, 4, 5, 6, 7);
    vf8 h = __builtin_shufflevector(*v, *v, 8, 9, 10, 11, 12, 13, 14, 15);
    *lo = __builtin_convertvector(l, vd8);
    *hi = __builtin_convertvector(h, vd8);
}
LN_INLINE double vhsum(const vd4 *a, const vd4 *b) {
    vd4 s = *a + *b;
    return (s[0] + s[1]) + (s[2] + s[3]);
}
LN_INLINE double vhsum8(const vd8 *a, const vd8 *b, const vd8 *c, const vd8 *d) {
    vd8 s = (*a + *b) + (*c + *d);
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* ---- float rows ----
 * A row's sums run in double over 16 floats a step into four (or two)
 * independent accumulators: one accumulator's chain of dependent adds ran at
 * a third of the core's throughput, and the 8-float vectors used half of an
 * AVX-512 register. The order of the additions is fixed by the row's length
 * alone, so Strict's kernel and the fused interpreter (the same functions)
 * agree bit for bit. */

LN_CLONES static double row_sum_f(const float *x, int64_t n) {
    vd8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        vf16 u, v;
        vd8 lo, hi;
        vload16(&u, x + i);
        vload16(&v, x + i + 16);
        vsplit16(&u, &lo, &hi);
        a0 += lo;
        a1 += hi;
        vsplit16(&v, &lo, &hi);
        a2 += lo;
        a3 += hi;
    }
    vd4 b0 = {0}, b1 = {0};
    for (; i + 8 <= n; i += 8) {
        vf8 v;
        vd4 lo, hi;
        vload(&v, x + i);
        vsplit(&v, &lo, &hi);
        b0 += lo;
        b1 += hi;
    }
    double s = vhsum8(&a0, &a1, &a2, &a3) + vhsum(&b0, &b1);
    for (; i < n; i++) s += x[i];
    return s;
}

LN_CLONES static double row_sqdev_f(const float *x, int64_t n, double mean) {
    vd8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        vf16 u, v;
        vd8 lo, hi;
        vload16(&u, x + i);
        vload16(&v, x + i + 16);
        vsplit16(&u, &lo, &hi);
        lo -= mean;
        hi -= mean;
        a0 += lo * lo;
        a1 += hi * hi;
        vsplit16(&v, &lo, &hi);
        lo -= mean;
        hi -= mean;
        a2 += lo * lo;
        a3 += hi * hi;
    }
    vd4 b0 = {0}, b1 = {0};
    for (; i + 8 <= n; i += 8) {
        vf8 v;
        vd4 lo, hi;
        vload(&v, x + i);
        vsplit(&v, &lo, &hi);
        lo -= mean;
        hi -= mean;
        b0 += lo * lo;
        b1 += hi * hi;
    }
    double s = vhsum8(&a0, &a1, &a2, &a3) + vhsum(&b0, &b1);
    for (; i < n; i++) s += (x[i] - mean) * (x[i] - mean);
    return s;
}

/* y = (x - mean)*rstd [* w] [+ b]; the subtraction form stays exact when
 * the variance is tiny next to the mean (x*rstd - mean*rstd would cancel). */
LN_CLONES static void row_apply_f(float *y, const float *x, int64_t n, float mean, float rstd, const float *w,
                                  const float *b) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        vf16 v;
        vload16(&v, x + i);
        v = (v - mean) * rstd;
        if (w) {
            vf16 t;
            vload16(&t, w + i);
            v *= t;
        }
        if (b) {
            vf16 t;
            vload16(&t, b + i);
            v += t;
        }
        vstore16(y + i, &v);
    }
    for (; i < n; i++) {
        float v = (x[i] - mean) * rstd;
        if (w) v *= w[i];
        if (b) v += b[i];
        y[i] = v;
    }
}

/* Backward sums over a row: sum(g) and sum(g*xhat), g = grad [* w]. */
LN_CLONES static void row_bwd_sums_f(const float *gr, const float *x, const float *w, int64_t n, float mean, float rstd,
                                     double *sg, double *sgx) {
    vd8 a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        vf16 g, xh;
        vd8 lo, hi;
        vload16(&g, gr + i);
        vload16(&xh, x + i);
        xh = (xh - mean) * rstd;
        if (w) {
            vf16 t;
            vload16(&t, w + i);
            g *= t;
        }
        vsplit16(&g, &lo, &hi);
        a0 += lo;
        a1 += hi;
        g *= xh;
        vsplit16(&g, &lo, &hi);
        b0 += lo;
        b1 += hi;
    }
    vd8 z = {0};
    double s1 = vhsum8(&a0, &a1, &z, &z), s2 = vhsum8(&b0, &b1, &z, &z);
    for (; i < n; i++) {
        float g = w ? gr[i] * w[i] : gr[i];
        float xh = (x[i] - mean) * rstd;
        s1 += g;
        s2 += g * xh;
    }
    *sg = s1;
    *sgx = s2;
}

/* aw += g*xhat, ab += g (float; flushed to double every LN_FLUSH rows) */
LN_CLONES static void row_dwdb_f(float *aw, float *ab, const float *gr, const float *x, int64_t n, float mean,
                                 float rstd) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        vf16 g, xh, w, b;
        vload16(&g, gr + i);
        vload16(&xh, x + i);
        vload16(&w, aw + i);
        vload16(&b, ab + i);
        xh = (xh - mean) * rstd;
        w += g * xh;
        b += g;
        vstore16(aw + i, &w);
        vstore16(ab + i, &b);
    }
    for (; i < n; i++) {
        aw[i] += gr[i] * ((x[i] - mean) * rstd);
        ab[i] += gr[i];
    }
}

/* dx = rstd * (g - c1 - xhat*c2) */
LN_CLONES static void row_bwd_dx_f(float *dx, const float *gr, const float *x, const float *w, int64_t n, float mean,
                                   float rstd, float c1, float c2) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        vf16 g, xh;
        vload16(&g, gr + i);
        vload16(&xh, x + i);
        xh = (xh - mean) * rstd;
        if (w) {
            vf16 t;
            vload16(&t, w + i);
            g *= t;
        }
        g = rstd * (g - c1 - xh * c2);
        vstore16(dx + i, &g);
    }
    for (; i < n; i++) {
        float g = w ? gr[i] * w[i] : gr[i];
        float xh = (x[i] - mean) * rstd;
        dx[i] = rstd * (g - c1 - xh * c2);
    }
}

void tpu_ln_row_f(float *y, const float *x, int64_t M, const float *w, const float *b, double eps, double *mean,
                  double *rstd) {
    double m = row_sum_f(x, M) / (double)M;
    double r = 1.0 / sqrt(row_sqdev_f(x, M, m) / (double)M + eps);
    row_apply_f(y, x, M, (float)m, (float)r, w, b);
    *mean = m;
    *rstd = r;
}

/* ---- row mapping and conversion ---- */

/* Where row r, column j of a tensor lives: leading dims give the row base,
 * `tab` (NULL when the row is contiguous) the column offset. */
typedef struct ln_map {
    int nl;
    int64_t lsizes[TPU_MAX_DIMS], lst[TPU_MAX_DIMS];
    int64_t *tab; /* owned */
} ln_map;

/* Number of trailing dims of t whose product is M, or -1. */
static int ln_split(const tpu_tensor *t, int64_t M) {
    int64_t prod = 1;
    for (int k = 0; k <= t->ndim; k++) {
        if (prod == M) return k;
        if (k == t->ndim) break;
        prod *= t->sizes[t->ndim - 1 - k];
    }
    return -1;
}

static bool ln_map_init(ln_map *m, const tpu_tensor *t, int k, int64_t M) {
    memset(m, 0, sizeof *m);
    m->nl = t->ndim - k;
    for (int d = 0; d < m->nl; d++) {
        m->lsizes[d] = t->sizes[d];
        m->lst[d] = t->strides[d];
    }
    int64_t expect = 1;
    bool contig = true;
    for (int d = t->ndim - 1; d >= m->nl; d--) {
        if (t->sizes[d] != 1 && t->strides[d] != expect) contig = false;
        expect *= t->sizes[d];
    }
    if (contig || M == 0) return true;
    m->tab = malloc((size_t)M * sizeof *m->tab);
    if (!m->tab) return false;
    int64_t idx[TPU_MAX_DIMS] = {0}, off = 0;
    for (int64_t j = 0; j < M; j++) {
        m->tab[j] = off;
        for (int d = t->ndim - 1; d >= m->nl; d--) {
            off += t->strides[d];
            if (++idx[d] < t->sizes[d]) break;
            off -= idx[d] * t->strides[d];
            idx[d] = 0;
        }
    }
    return true;
}

static int64_t ln_row_base(const ln_map *m, const tpu_tensor *t, int64_t r) {
    int64_t off = t->offset;
    for (int d = m->nl - 1; d >= 0; d--) {
        off += (r % m->lsizes[d]) * m->lst[d];
        r /= m->lsizes[d];
    }
    return off;
}

/* dst (float, or double if dbl) <- n elements at base (+tab[j] or +j) */
static void ln_gather(void *dst, bool dbl, const tpu_tensor *t, int64_t base, const int64_t *tab, int64_t n) {
    tpu_dtype dt = (tpu_dtype)t->dtype;
    const char *p = (const char *)t->base + (size_t)base * tpu_dtype_size(dt);
    if (dbl && tab)
        tpu_tile_load_f64_at(dst, p, tab, n, dt);
    else if (dbl)
        tpu_tile_load_f64(dst, p, 1, n, dt);
    else if (tab)
        tpu_tile_load_f32_at(dst, p, tab, n, dt);
    else
        tpu_tile_load_f32(dst, p, 1, n, dt);
}

static void ln_scatter(const tpu_tensor *t, int64_t base, const int64_t *tab, const void *src, bool dbl, int64_t n) {
    tpu_dtype dt = (tpu_dtype)t->dtype;
    char *p = (char *)t->base + (size_t)base * tpu_dtype_size(dt);
    if (dbl && tab)
        tpu_tile_store_f64_at(p, tab, src, n, dt);
    else if (dbl)
        tpu_tile_store_f64(p, 1, src, n, dt);
    else if (tab)
        tpu_tile_store_f32_at(p, tab, src, n, dt);
    else
        tpu_tile_store_f32(p, 1, src, n, dt);
}

/* A row of t for reading: in place if possible, else gathered into buf. */
static void *ln_row_in(const tpu_tensor *t, const ln_map *m, int64_t r, bool dbl, void *buf, int64_t M) {
    int64_t base = ln_row_base(m, t, r);
    if (!m->tab && t->dtype == (dbl ? TPU_F64 : TPU_F32))
        return (char *)t->base + (size_t)base * (dbl ? sizeof(double) : sizeof(float));
    ln_gather(buf, dbl, t, base, m->tab, M);
    return buf;
}

/* A row of t for writing: in place if possible, else buf (then ln_row_out). */
static void *ln_row_dst(const tpu_tensor *t, const ln_map *m, int64_t r, bool dbl, void *buf) {
    if (!m->tab && t->dtype == (dbl ? TPU_F64 : TPU_F32))
        return (char *)t->base + (size_t)ln_row_base(m, t, r) * (dbl ? sizeof(double) : sizeof(float));
    return buf;
}

static void ln_row_out(const tpu_tensor *t, const ln_map *m, int64_t r, bool dbl, const void *row, int64_t M) {
    if (!m->tab && t->dtype == (dbl ? TPU_F64 : TPU_F32)) return; /* written in place */
    ln_scatter(t, ln_row_base(m, t, r), m->tab, row, dbl, M);
}

/* A contiguous M-element vector (weight, bias) in the compute dtype;
 * *owned is set when it had to be converted. */
static void *ln_vec(const tpu_tensor *t, bool dbl, int64_t M, void **owned) {
    *owned = NULL;
    if (t->dtype == (dbl ? TPU_F64 : TPU_F32))
        return (char *)t->base + (size_t)t->offset * (dbl ? sizeof(double) : sizeof(float));
    void *v = malloc((size_t)(M > 0 ? M : 1) * (dbl ? sizeof(double) : sizeof(float)));
    if (!v) return NULL;
    ln_gather(v, dbl, t, t->offset, NULL, M);
    *owned = v;
    return v;
}

/* ---- forward ---- */

typedef struct ln_fwd {
    tpu_kargs *a;
    const tpu_tensor *y, *mean, *rstd, *x;
    ln_map xm, ym;
    int64_t M;
    double eps;
    bool dbl;
    const void *w, *b;
    int failed;
} ln_fwd;

static void ln_fwd_rows(void *ctx, int64_t rb, int64_t re) {
    ln_fwd *f = ctx;
    size_t es = f->dbl ? sizeof(double) : sizeof(float);
    char *buf = malloc(2 * (size_t)f->M * es);
    if (!buf) {
        __atomic_store_n(&f->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t r = rb; r < re; r++) {
        void *xr = ln_row_in(f->x, &f->xm, r, f->dbl, buf, f->M);
        void *yr = ln_row_dst(f->y, &f->ym, r, f->dbl, buf + (size_t)f->M * es);
        double mean, rstd;
        if (f->dbl) {
            const double *xd = xr;
            double s = 0;
            for (int64_t j = 0; j < f->M; j++) s += xd[j];
            mean = s / (double)f->M;
            s = 0;
            for (int64_t j = 0; j < f->M; j++) s += (xd[j] - mean) * (xd[j] - mean);
            rstd = 1.0 / sqrt(s / (double)f->M + f->eps);
            const double *w = f->w, *b = f->b;
            double *yd = yr;
            for (int64_t j = 0; j < f->M; j++) {
                double v = (xd[j] - mean) * rstd;
                if (w) v *= w[j];
                if (b) v += b[j];
                yd[j] = v;
            }
        } else {
            tpu_ln_row_f(yr, xr, f->M, f->w, f->b, f->eps, &mean, &rstd);
        }
        ln_row_out(f->y, &f->ym, r, f->dbl, yr, f->M);
        tpu_store_f64(tpu_elem_ptr(f->mean, r), (tpu_dtype)f->mean->dtype, mean);
        tpu_store_f64(tpu_elem_ptr(f->rstd, r), (tpu_dtype)f->rstd->dtype, rstd);
    }
    free(buf);
}

static tpu_status ln_check(tpu_kargs *a, const tpu_tensor *x, int64_t M, int *k) {
    if (x->is_scalar || !tpu_dtype_is_float((tpu_dtype)x->dtype))
        return tpu_kernel_fail(a, "%s: input must be a floating tensor", tpu_op_name(a->op));
    *k = ln_split(x, M);
    if (M < 0 || *k < 0)
        return tpu_kernel_fail(a, "%s: normalized size %lld is not a product of trailing dims of a %d-d input",
                               tpu_op_name(a->op), (long long)M, x->ndim);
    return TPU_OK;
}

static int64_t ln_rows(const tpu_tensor *x, int k) {
    int64_t rows = 1;
    for (int d = 0; d < x->ndim - k; d++) rows *= x->sizes[d];
    return rows;
}

static tpu_status ln_forward(tpu_kargs *a) {
    tpu_args_LAYER_NORM q = tpu_unpack_LAYER_NORM(&a->p);
    int64_t M = q.cols;
    bool has_w = q.has_weight != 0, has_b = q.has_bias != 0;
    if (a->n != 4 + has_w + has_b)
        return tpu_kernel_fail(a, "layer_norm: %d operands, expected %d", a->n, 4 + has_w + has_b);
    ln_fwd f;
    memset(&f, 0, sizeof f);
    f.a = a;
    f.y = &a->t[0];
    f.mean = &a->t[1];
    f.rstd = &a->t[2];
    f.x = &a->t[3];
    f.M = M;
    f.eps = q.eps;
    f.dbl = f.y->dtype == TPU_F64;
    int k;
    tpu_status st = ln_check(a, f.x, M, &k);
    if (st != TPU_OK) return st;
    int64_t rows = ln_rows(f.x, k);
    if (rows == 0) return TPU_OK;
    if (M == 0) { /* PyTorch: mean 0, rstd NaN */
        for (int64_t r = 0; r < rows; r++) {
            tpu_store_f64(tpu_elem_ptr(f.mean, r), (tpu_dtype)f.mean->dtype, 0.0);
            tpu_store_f64(tpu_elem_ptr(f.rstd, r), (tpu_dtype)f.rstd->dtype, NAN);
        }
        return TPU_OK;
    }
    void *wown = NULL, *bown = NULL;
    st = TPU_ERROR_KERNEL;
    if (!ln_map_init(&f.xm, f.x, k, M) || !ln_map_init(&f.ym, f.y, k, M)) goto out_free_maps;
    if (has_w && !(f.w = ln_vec(&a->t[4], f.dbl, M, &wown))) goto out_free_maps;
    if (has_b && !(f.b = ln_vec(&a->t[4 + has_w], f.dbl, M, &bown))) goto out_free_vecs;
    int64_t grain = M >= 16384 ? 1 : 16384 / M;
    tpu_parallel_for(rows, grain, ln_fwd_rows, &f);
    st = f.failed ? TPU_ERROR_KERNEL : TPU_OK;
out_free_vecs:
    free(bown);
    free(wown);
out_free_maps:
    free(f.ym.tab);
    free(f.xm.tab);
    if (st != TPU_OK)
        return tpu_kernel_fail(a, "layer_norm: out of host memory for %lld-element row buffers", (long long)M);
    return st;
}

/* ---- backward ---- */

typedef struct ln_bwd {
    tpu_kargs *a;
    const tpu_tensor *dx, *grad, *x, *mean, *rstd;
    ln_map dxm, gm, xm;
    int64_t M, rows;
    bool dbl, want_dx, want_dwdb;
    const void *w;
    double *part; /* [LN_BWD_CHUNKS][2][M]: dw, db partial sums */
    int failed;
} ln_bwd;

static void ln_bwd_row_d(ln_bwd *b, const double *g, const double *x, double mean, double rstd, double *dx, double *pw,
                         double *pb) {
    const double *w = b->w;
    int64_t M = b->M;
    if (b->want_dx) {
        double sg = 0, sgx = 0;
        for (int64_t j = 0; j < M; j++) {
            double gw = w ? g[j] * w[j] : g[j];
            sg += gw;
            sgx += gw * (x[j] - mean) * rstd;
        }
        double c1 = sg / (double)M, c2 = sgx / (double)M;
        for (int64_t j = 0; j < M; j++) {
            double gw = w ? g[j] * w[j] : g[j];
            dx[j] = rstd * (gw - c1 - (x[j] - mean) * rstd * c2);
        }
    }
    if (pw) {
        for (int64_t j = 0; j < M; j++) {
            pw[j] += g[j] * (x[j] - mean) * rstd;
            pb[j] += g[j];
        }
    }
}

static void ln_bwd_chunks(void *ctx, int64_t cb, int64_t ce) {
    ln_bwd *b = ctx;
    size_t es = b->dbl ? sizeof(double) : sizeof(float), M = (size_t)b->M;
    /* row buffers: grad, x, dx; then float dw/db accumulators */
    char *buf = malloc(3 * M * es + (b->dbl ? 0 : 2 * M * sizeof(float)));
    if (!buf) {
        __atomic_store_n(&b->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *aw = (float *)(buf + 3 * M * es), *ab = aw + M;
    for (int64_t c = cb; c < ce; c++) {
        int64_t r0 = b->rows * c / LN_BWD_CHUNKS, r1 = b->rows * (c + 1) / LN_BWD_CHUNKS;
        double *pw = b->want_dwdb ? b->part + (size_t)c * 2 * M : NULL;
        double *pb = pw ? pw + M : NULL;
        if (pw && !b->dbl) memset(aw, 0, 2 * M * sizeof(float));
        for (int64_t r = r0; r < r1; r++) {
            void *gr = ln_row_in(b->grad, &b->gm, r, b->dbl, buf, b->M);
            void *xr = ln_row_in(b->x, &b->xm, r, b->dbl, buf + M * es, b->M);
            void *dxr = b->want_dx ? ln_row_dst(b->dx, &b->dxm, r, b->dbl, buf + 2 * M * es) : NULL;
            double mean = tpu_load_f64(tpu_elem_ptr(b->mean, r), (tpu_dtype)b->mean->dtype);
            double rstd = tpu_load_f64(tpu_elem_ptr(b->rstd, r), (tpu_dtype)b->rstd->dtype);
            if (b->dbl) {
                ln_bwd_row_d(b, gr, xr, mean, rstd, dxr, pw, pb);
            } else {
                if (b->want_dx) {
                    double sg, sgx;
                    row_bwd_sums_f(gr, xr, b->w, b->M, (float)mean, (float)rstd, &sg, &sgx);
                    row_bwd_dx_f(dxr, gr, xr, b->w, b->M, (float)mean, (float)rstd, (float)(sg / (double)M),
                                 (float)(sgx / (double)M));
                }
                if (pw) {
                    row_dwdb_f(aw, ab, gr, xr, b->M, (float)mean, (float)rstd);
                    if ((r - r0) % LN_FLUSH == LN_FLUSH - 1 || r == r1 - 1) {
                        for (size_t j = 0; j < M; j++) {
                            pw[j] += aw[j];
                            pb[j] += ab[j];
                        }
                        memset(aw, 0, 2 * M * sizeof(float));
                    }
                }
            }
            if (b->want_dx) ln_row_out(b->dx, &b->dxm, r, b->dbl, dxr, b->M);
        }
    }
    free(buf);
}

/* dw/db = sum of the chunk partials, in chunk order */
static void ln_bwd_reduce(ln_bwd *b, const tpu_tensor *dw, const tpu_tensor *db) {
    for (int64_t j = 0; j < b->M; j++) {
        double sw = 0, sb = 0;
        for (int c = 0; c < LN_BWD_CHUNKS; c++) {
            sw += b->part[(size_t)c * 2 * (size_t)b->M + (size_t)j];
            sb += b->part[((size_t)c * 2 + 1) * (size_t)b->M + (size_t)j];
        }
        if (!dw->is_scalar) tpu_store_f64(tpu_elem_ptr(dw, j), (tpu_dtype)dw->dtype, sw);
        if (!db->is_scalar) tpu_store_f64(tpu_elem_ptr(db, j), (tpu_dtype)db->dtype, sb);
    }
}

static tpu_status ln_backward(tpu_kargs *a) {
    if (a->n != 7 && a->n != 8) return tpu_kernel_fail(a, "layer_norm_backward: %d operands, expected 7 or 8", a->n);
    ln_bwd b;
    memset(&b, 0, sizeof b);
    const tpu_tensor *dw = &a->t[1], *db = &a->t[2];
    b.a = a;
    b.dx = &a->t[0];
    b.grad = &a->t[3];
    b.x = &a->t[4];
    b.mean = &a->t[5];
    b.rstd = &a->t[6];
    b.M = tpu_unpack_LAYER_NORM_BWD(&a->p).cols;
    b.want_dx = !b.dx->is_scalar;
    b.want_dwdb = !dw->is_scalar || !db->is_scalar;
    b.dbl = b.x->dtype == TPU_F64;
    int k;
    tpu_status st = ln_check(a, b.x, b.M, &k);
    if (st != TPU_OK) return st;
    b.rows = ln_rows(b.x, k);
    if (b.M == 0) return TPU_OK;
    void *wown = NULL;
    st = TPU_ERROR_KERNEL;
    if (!ln_map_init(&b.xm, b.x, k, b.M) || !ln_map_init(&b.gm, b.grad, k, b.M)) goto out_free_maps;
    if (b.want_dx && !ln_map_init(&b.dxm, b.dx, k, b.M)) goto out_free_maps;
    if (a->n == 8 && b.want_dx && !(b.w = ln_vec(&a->t[7], b.dbl, b.M, &wown))) goto out_free_maps;
    if (b.want_dwdb && !(b.part = calloc((size_t)LN_BWD_CHUNKS * 2 * (size_t)b.M, sizeof *b.part))) goto out_free_vec;
    tpu_parallel_for(LN_BWD_CHUNKS, 1, ln_bwd_chunks, &b);
    if (!b.failed) {
        if (b.want_dwdb) ln_bwd_reduce(&b, dw, db);
        st = TPU_OK;
    }
    free(b.part);
out_free_vec:
    free(wown);
out_free_maps:
    free(b.dxm.tab);
    free(b.gm.tab);
    free(b.xm.tab);
    if (st != TPU_OK)
        return tpu_kernel_fail(a, "layer_norm_backward: out of host memory for %lld-element row buffers",
                               (long long)b.M);
    return st;
}

tpu_status tpu_k_norm(tpu_kargs *a) {
    switch (a->op) {
    case TPU_OP_LAYER_NORM: return ln_forward(a);
    case TPU_OP_LAYER_NORM_BWD: return ln_backward(a);
    default: return tpu_kernel_fail(a, "%s: not a norm op", tpu_op_name(a->op));
    }
}
