/* test_kernels_linalg.c - the linear algebra kernels (LINALG family:
 * triangular solve, Cholesky and its inverse, LU factor and solve, the pivot
 * permutation, Householder QR: geqrf, householder_product, ormqr; Jacobi
 * eigh and SVD, whose vectors are compared up to a sign each and checked
 * orthonormal).
 *
 * Each case builds operands in plain host memory (kernels see host
 * pointers), runs the fast kernel and the reference kernel on copies, and
 * compares them; every byte that is not an element of a view must still hold
 * the sentinel pattern. Layouts: contiguous, transposed (dims stored in
 * reverse order) and padded (offset 3, every dim one longer), batches of 0,
 * 1 and 2 dims, a broadcast (stride 0) batch dim. Inputs are well
 * conditioned (triangles with a strong diagonal, M M^T + n I); singular and
 * indefinite matrices must give LAPACK's info; bad pivots must fail both
 * kernels. Hand values pin the pivot convention (LAPACK's: 1-based, the
 * first largest |a|) to what PyTorch's CPU returns. */
#include "kernels/kernels-impl.h"
#include "test.h"
#include "hten.h"
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

enum { L_COUNT = 3 }; /* the layouts of hten.h the cases cycle through: contiguous, transposed, padded */

static char case_desc[256];
static long ncompared;

/* Element (i, j) of matrix b (row-major linear index over batch, rows, cols). */
static int64_t mlin(const tpu_tensor *t, int64_t b, int64_t i, int64_t j) {
    int64_t r = t->sizes[t->ndim - 2], c = t->sizes[t->ndim - 1];
    return (b * r + i) * c + j;
}

/* |fast - ref| <= tol * max(1, max|ref|) element by element (exact for integers). */
static void hcmp(const char *what, const hten *f, const hten *r, double tol) {
    CHECK_MSG(hguards_ok(f), "%s [%s]: fast kernel wrote outside the view", what, case_desc);
    CHECK_MSG(hguards_ok(r), "%s [%s]: ref kernel wrote outside the view", what, case_desc);
    ncompared++;
    int64_t n = hnumel(&r->t);
    double maxabs = 1;
    for (int64_t i = 0; i < n; i++)
        if (fabs(hget(r, i)) > maxabs) maxabs = fabs(hget(r, i));
    for (int64_t i = 0; i < n; i++) {
        double a = hget(f, i), b = hget(r, i);
        if (!(fabs(a - b) <= tol * maxabs)) {
            CHECK_MSG(false, "%s [%s]: element %lld fast %.9g ref %.9g", what, case_desc, (long long)i, a, b);
            return;
        }
    }
}

static double tol(tpu_dtype dt) { return dt == TPU_F64 ? 1e-10 : 2e-4; }

static tpu_status run(bool ref, tpu_op op, const tpu_tensor *ops, int n, tpu_params p, char *err) {
    tpu_kargs a;
    memset(&a, 0, sizeof a);
    a.op = op;
    a.n = n;
    memcpy(a.t, ops, (size_t)n * sizeof *ops);
    a.p = p;
    tpu_status s = ref ? tpu_ref_run(&a) : tpu_kernel_run(&a);
    if (err) snprintf(err, 256, "%s", a.err);
    if (s != TPU_OK && !err)
        CHECK_MSG(s == TPU_OK, "%s %s [%s]: %s", ref ? "ref" : "fast", tpu_op_name(op), case_desc, a.err);
    return s;
}

/* Shapes: batch dims (0, 1 or 2 of them) + the matrix. */
typedef struct shape {
    int nb;
    int64_t b[2];
} shape;
static const shape shapes[] = {{0, {0, 0}}, {1, {3, 0}}, {2, {2, 3}}, {1, {0, 0}}};
#define NSHAPES 4

static int mksizes(const shape *s, int64_t r, int64_t c, int64_t *out) {
    for (int q = 0; q < s->nb; q++) out[q] = s->b[q];
    out[s->nb] = r;
    out[s->nb + 1] = c;
    return s->nb + 2;
}

static int64_t nbatch(const shape *s) {
    int64_t n = 1;
    for (int q = 0; q < s->nb; q++) n *= s->b[q];
    return n;
}

/* A random matrix per batch: triangular-friendly (strong diagonal), SPD (M M^T + n I), or plain. */
enum { M_TRI, M_SPD, M_RAND };
static void fill_mats(hten *h, int kind) {
    const tpu_tensor *t = &h->t;
    int64_t r = t->sizes[t->ndim - 2], c = t->sizes[t->ndim - 1], nb = hnumel(t) / (r * c > 0 ? r * c : 1);
    if (r * c == 0) return;
    double *m = malloc((size_t)(r * c) * sizeof *m);
    if (!m) abort();
    for (int64_t b = 0; b < nb; b++) {
        for (int64_t i = 0; i < r * c; i++) m[i] = urand(-1, 1);
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < c; j++) {
                double v = m[i * c + j];
                if (kind == M_TRI && i == j) v = (v < 0 ? -1 : 1) * (1.5 + fabs(v));
                if (kind == M_SPD) {
                    v = i == j ? (double)r : 0;
                    for (int64_t k = 0; k < c; k++) v += m[i * c + k] * m[j * c + k];
                }
                hset(h, mlin(t, b, i, j), v);
            }
    }
    free(m);
}

static tpu_params params4(int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
    tpu_params p;
    memset(&p, 0, sizeof p);
    p.i[0] = i0;
    p.i[1] = i1;
    p.i[2] = i2;
    p.i[3] = i3;
    return p;
}

/* ---- triangular solve: every side, triangle, transpose and diagonal; A broadcast over a batch dim ---- */
static void trsm_case(tpu_dtype dt, const shape *s, int64_t m, int64_t n, int layout, bool left, bool upper, bool trans,
                      bool unit, bool bcast) {
    snprintf(case_desc, sizeof case_desc,
             "trsm %s nb %d %lldx%lld layout %d left %d upper %d trans %d unit %d bcast %d", tpu_dtype_name(dt), s->nb,
             (long long)m, (long long)n, layout, left, upper, trans, unit, bcast);
    int64_t bs[4], as[4], k = left ? m : n;
    int nd = mksizes(s, m, n, bs);
    mksizes(s, k, k, as);
    if (bcast && s->nb) as[0] = 1;
    hten A, B, Br;
    hmk(&A, dt, nd, as, (layout + 1) % L_COUNT);
    hmk(&B, dt, nd, bs, layout);
    fill_mats(&A, M_TRI);
    fill_mats(&B, M_RAND);
    if (bcast && s->nb) {
        A.t.sizes[0] = s->b[0];
        A.t.strides[0] = 0;
    }
    hclone(&Br, &B);
    tpu_tensor ops[2] = {B.t, A.t};
    tpu_params p = params4(left, upper, trans, unit);
    run(false, TPU_OP_TRSM, ops, 2, p, NULL);
    ops[0] = Br.t;
    run(true, TPU_OP_TRSM, ops, 2, p, NULL);
    hcmp("trsm", &B, &Br, tol(dt));
    hfree(&A);
    hfree(&B);
    hfree(&Br);
}

static void test_trsm(void) {
    const tpu_dtype dts[] = {TPU_F32, TPU_F64};
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < NSHAPES; s++)
            for (int f = 0; f < 16; f++) {
                int64_t m = 1 + (f * 5) % 9, n = 1 + (f * 3) % 7;
                trsm_case(dts[d], &shapes[s], m, n, (f + s) % L_COUNT, f & 1, f & 2, f & 4, f & 8, f % 3 == 0);
            }
    trsm_case(TPU_F64, &shapes[1], 40, 3, L_PAD, true, false, true, false, false);
    trsm_case(TPU_F32, &shapes[0], 0, 3, L_CONTIG, true, true, false, false, false);
}

/* ---- Cholesky and its inverse ---- */
static void potrf_case(tpu_dtype dt, const shape *s, int64_t n, int layout, bool upper, int64_t bad) {
    snprintf(case_desc, sizeof case_desc, "potrf %s nb %d n %lld layout %d upper %d bad %lld", tpu_dtype_name(dt),
             s->nb, (long long)n, layout, upper, (long long)bad);
    int64_t as[4], is[2] = {s->b[0], s->b[1]};
    int nd = mksizes(s, n, n, as);
    hten A, Ar, info, infor;
    hmk(&A, dt, nd, as, layout);
    fill_mats(&A, M_SPD);
    int64_t nbt = nbatch(s);
    if (bad > 0 && nbt > 0) /* the last matrix indefinite at order `bad` */
        hset(&A, mlin(&A.t, nbt - 1, bad - 1, bad - 1), -1e3);
    hmk(&info, TPU_I32, s->nb, is, L_PAD);
    hclone(&Ar, &A);
    hclone(&infor, &info);
    tpu_tensor ops[2] = {A.t, info.t};
    tpu_params p = params4(upper, 0, 0, 0);
    run(false, TPU_OP_POTRF, ops, 2, p, NULL);
    ops[0] = Ar.t;
    ops[1] = infor.t;
    run(true, TPU_OP_POTRF, ops, 2, p, NULL);
    hcmp("info", &info, &infor, 0);
    if (bad > 0 && nbt > 0) {
        CHECK_MSG(hgeti(&info, nbt - 1) == bad, "[%s] info %lld", case_desc, (long long)hgeti(&info, nbt - 1));
    } else {
        hcmp("potrf", &A, &Ar, tol(dt));
        /* the inverse from the factor: fast vs ref, and A (A^-1) = I through the reference's own numbers */
        hten Ai, Air;
        hclone(&Ai, &A);
        hclone(&Air, &A);
        tpu_tensor o2[2] = {Ai.t, info.t};
        run(false, TPU_OP_POTRI, o2, 2, p, NULL);
        o2[0] = Air.t;
        o2[1] = infor.t;
        run(true, TPU_OP_POTRI, o2, 2, p, NULL);
        hcmp("potri", &Ai, &Air, dt == TPU_F64 ? 1e-9 : 2e-3);
        hfree(&Ai);
        hfree(&Air);
    }
    hfree(&A);
    hfree(&Ar);
    hfree(&info);
    hfree(&infor);
}

static void test_cholesky(void) {
    const tpu_dtype dts[] = {TPU_F32, TPU_F64};
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < NSHAPES; s++)
            for (int f = 0; f < 8; f++) {
                int64_t n = 1 + (f * 5) % 11;
                potrf_case(dts[d], &shapes[s], n, (f + s) % L_COUNT, f & 1, (f & 2) ? 1 + (f * 7) % n : 0);
            }
    potrf_case(TPU_F64, &shapes[1], 37, L_PERM, true, 0);
}

/* Hand values: the inverse of [[4, 2], [2, 3]] from its factor L = [[2, 0], [1, sqrt 2]] is [[3, -2], [-2, 4]] / 8;
 * NaN on the diagonal and a zero pivot are info 1; a zero diagonal element of the factor is POTRI's info. */
static void test_cholesky_hand(void) {
    snprintf(case_desc, sizeof case_desc, "cholesky hand values");
    int64_t s2[2] = {2, 2};
    hten A, info;
    hmk(&A, TPU_F64, 2, s2, L_CONTIG);
    hmk(&info, TPU_I32, 0, NULL, L_CONTIG);
    double v[4] = {4, 2, 2, 3};
    for (int i = 0; i < 4; i++) hset(&A, i, v[i]);
    tpu_tensor ops[2] = {A.t, info.t};
    for (int ref = 0; ref < 2; ref++) {
        for (int i = 0; i < 4; i++) hset(&A, i, v[i]);
        CHECK(run(ref, TPU_OP_POTRF, ops, 2, params4(0, 0, 0, 0), NULL) == TPU_OK);
        CHECK(hgeti(&info, 0) == 0 && hget(&A, 0) == 2 && hget(&A, 2) == 1 && fabs(hget(&A, 3) - sqrt(2)) < 1e-15);
        CHECK(hget(&A, 1) == 2); /* the upper triangle untouched */
        CHECK(run(ref, TPU_OP_POTRI, ops, 2, params4(0, 0, 0, 0), NULL) == TPU_OK);
        double want[4] = {3. / 8, -2. / 8, -2. / 8, 4. / 8};
        for (int i = 0; i < 4; i++)
            CHECK_MSG(fabs(hget(&A, i) - want[i]) < 1e-15, "ref %d %d: %g", ref, i, hget(&A, i));
        hset(&A, 0, NAN);
        CHECK(run(ref, TPU_OP_POTRF, ops, 2, params4(0, 0, 0, 0), NULL) == TPU_OK && hgeti(&info, 0) == 1);
        hset(&A, 0, 0);
        CHECK(run(ref, TPU_OP_POTRI, ops, 2, params4(0, 0, 0, 0), NULL) == TPU_OK && hgeti(&info, 0) == 1);
    }
    hfree(&A);
    hfree(&info);
}

/* ---- LU: factor, solve (both transposes), the permutation ---- */
static void lu_case(tpu_dtype dt, const shape *s, int64_t m, int64_t n, int layout, int64_t zero_col) {
    snprintf(case_desc, sizeof case_desc, "getrf %s nb %d %lldx%lld layout %d zero col %lld", tpu_dtype_name(dt), s->nb,
             (long long)m, (long long)n, layout, (long long)zero_col);
    int64_t as[4], ps[3], is[2] = {s->b[0], s->b[1]}, k = m < n ? m : n;
    int nd = mksizes(s, m, n, as);
    for (int q = 0; q < s->nb; q++) ps[q] = s->b[q];
    ps[s->nb] = k;
    hten A, Ar, piv, pivr, info, infor;
    hmk(&A, dt, nd, as, layout);
    fill_mats(&A, M_RAND);
    int64_t nbt = nbatch(s);
    if (zero_col >= 0 && nbt > 0)
        for (int64_t i = 0; i < m; i++) hset(&A, mlin(&A.t, nbt - 1, i, zero_col), 0);
    hmk(&piv, TPU_I32, s->nb + 1, ps, (layout + 2) % L_COUNT);
    hmk(&info, TPU_I32, s->nb, is, L_CONTIG);
    hclone(&Ar, &A);
    hclone(&pivr, &piv);
    hclone(&infor, &info);
    tpu_tensor ops[3] = {A.t, piv.t, info.t};
    tpu_params p = params4(0, 0, 0, 0);
    run(false, TPU_OP_GETRF, ops, 3, p, NULL);
    tpu_tensor opr[3] = {Ar.t, pivr.t, infor.t};
    run(true, TPU_OP_GETRF, opr, 3, p, NULL);
    hcmp("pivots", &piv, &pivr, 0);
    hcmp("info", &info, &infor, 0);
    hcmp("lu", &A, &Ar, zero_col >= 0 ? 1e-3 : tol(dt) * 10);
    if (zero_col >= 0 && nbt > 0 && zero_col < k) {
        int64_t v = hgeti(&info, nbt - 1);
        CHECK_MSG(v >= 1 && v <= zero_col + 1, "[%s] info %lld", case_desc, (long long)v);
    }
    if (m == n && zero_col < 0) { /* solve with the factor, then the permutation */
        for (int tr = 0; tr < 2; tr++) {
            snprintf(case_desc, sizeof case_desc, "getrs %s nb %d n %lld layout %d trans %d", tpu_dtype_name(dt), s->nb,
                     (long long)n, layout, tr);
            int64_t bs[4];
            mksizes(s, n, 3, bs);
            hten B, Br;
            hmk(&B, dt, nd, bs, (layout + tr) % L_COUNT);
            fill_mats(&B, M_RAND);
            hclone(&Br, &B);
            tpu_tensor o2[3] = {B.t, Ar.t, pivr.t};
            run(false, TPU_OP_GETRS, o2, 3, params4(tr, 0, 0, 0), NULL);
            o2[0] = Br.t;
            run(true, TPU_OP_GETRS, o2, 3, params4(tr, 0, 0, 0), NULL);
            hcmp("getrs", &B, &Br, dt == TPU_F64 ? 1e-8 : 2e-3);
            hfree(&B);
            hfree(&Br);
        }
        hten P, Pr;
        ps[s->nb] = m;
        hmk(&P, TPU_I64, s->nb + 1, ps, layout);
        for (int64_t i = 0; i < hnumel(&P.t); i++) hseti(&P, i, i % m);
        hclone(&Pr, &P);
        tpu_tensor o3[2] = {P.t, pivr.t};
        run(false, TPU_OP_LU_PERM, o3, 2, p, NULL);
        o3[0] = Pr.t;
        run(true, TPU_OP_LU_PERM, o3, 2, p, NULL);
        hcmp("perm", &P, &Pr, 0);
        hfree(&P);
        hfree(&Pr);
    }
    hten *all[] = {&A, &Ar, &piv, &pivr, &info, &infor};
    for (int q = 0; q < 6; q++) hfree(all[q]);
}

static void test_lu(void) {
    const tpu_dtype dts[] = {TPU_F32, TPU_F64};
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < NSHAPES; s++)
            for (int f = 0; f < 10; f++) {
                int64_t m = 1 + (f * 5) % 9, n = f % 3 ? m : 1 + (f * 3) % 7;
                lu_case(dts[d], &shapes[s], m, n, (f + s) % L_COUNT, f == 4 ? (m < n ? m : n) - 1 : -1);
            }
    lu_case(TPU_F64, &shapes[1], 33, 33, L_PERM, -1);
    lu_case(TPU_F32, &shapes[0], 0, 4, L_CONTIG, -1);
}

/* PyTorch's CPU on [[1, 2, 3], [2, 4, 6], [1, 1, 1]]: LU [[2, 4, 6], [0.5, -1, -2], [0.5, -0, 0]], pivots
 * [2, 3, 3], info 3; on zeros: pivots [1, 2, 3], info 1. A bad pivot fails both kernels. */
static void test_lu_hand(void) {
    snprintf(case_desc, sizeof case_desc, "lu hand values");
    int64_t s3[2] = {3, 3}, n3 = 3;
    hten A, piv, info;
    hmk(&A, TPU_F32, 2, s3, L_PERM);
    hmk(&piv, TPU_I32, 1, &n3, L_CONTIG);
    hmk(&info, TPU_I32, 0, NULL, L_CONTIG);
    tpu_tensor ops[3] = {A.t, piv.t, info.t};
    for (int ref = 0; ref < 2; ref++) {
        double v[9] = {1, 2, 3, 2, 4, 6, 1, 1, 1}, want[9] = {2, 4, 6, 0.5, -1, -2, 0.5, 0, 0};
        for (int i = 0; i < 9; i++) hset(&A, i, v[i]);
        CHECK(run(ref, TPU_OP_GETRF, ops, 3, params4(0, 0, 0, 0), NULL) == TPU_OK);
        for (int i = 0; i < 9; i++) CHECK_MSG(hget(&A, i) == want[i], "ref %d elem %d: %g", ref, i, hget(&A, i));
        CHECK(hgeti(&piv, 0) == 2 && hgeti(&piv, 1) == 3 && hgeti(&piv, 2) == 3 && hgeti(&info, 0) == 3);
        for (int i = 0; i < 9; i++) hset(&A, i, 0);
        CHECK(run(ref, TPU_OP_GETRF, ops, 3, params4(0, 0, 0, 0), NULL) == TPU_OK);
        CHECK(hgeti(&piv, 0) == 1 && hgeti(&piv, 1) == 2 && hgeti(&piv, 2) == 3 && hgeti(&info, 0) == 1);
        /* bad pivots */
        hten P;
        hmk(&P, TPU_I64, 1, &n3, L_CONTIG);
        for (int i = 0; i < 3; i++) hseti(&P, i, i);
        hseti(&piv, 1, 4);
        tpu_tensor o2[2] = {P.t, piv.t};
        char err[256];
        CHECK(run(ref, TPU_OP_LU_PERM, o2, 2, params4(0, 0, 0, 0), err) == TPU_ERROR_KERNEL);
        CHECK_MSG(strstr(err, "got pivot 4") != NULL, "'%s'", err);
        tpu_tensor o3[3] = {A.t, A.t, piv.t};
        hseti(&piv, 1, 0);
        CHECK(run(ref, TPU_OP_GETRS, o3, 3, params4(0, 0, 0, 0), err) == TPU_ERROR_KERNEL);
        CHECK_MSG(strstr(err, "got pivot 0") != NULL, "'%s'", err);
        hfree(&P);
    }
    hfree(&A);
    hfree(&piv);
    hfree(&info);
}

/* ---- Householder QR: geqrf, then Q from the reflectors and Q / Q^T applied from either side ---- */
static void qr_case(tpu_dtype dt, const shape *s, int64_t m, int64_t n, int layout) {
    snprintf(case_desc, sizeof case_desc, "geqrf %s nb %d %lldx%lld layout %d", tpu_dtype_name(dt), s->nb, (long long)m,
             (long long)n, layout);
    int64_t as[4], ts[3], k = m < n ? m : n;
    int nd = mksizes(s, m, n, as);
    for (int q = 0; q < s->nb; q++) ts[q] = s->b[q];
    ts[s->nb] = k;
    hten A, Ar, tau, taur;
    hmk(&A, dt, nd, as, layout);
    fill_mats(&A, M_RAND);
    hmk(&tau, dt, s->nb + 1, ts, (layout + 1) % L_COUNT);
    hclone(&Ar, &A);
    hclone(&taur, &tau);
    tpu_tensor ops[2] = {A.t, tau.t};
    tpu_params p = params4(0, 0, 0, 0);
    run(false, TPU_OP_GEQRF, ops, 2, p, NULL);
    ops[0] = Ar.t;
    ops[1] = taur.t;
    run(true, TPU_OP_GEQRF, ops, 2, p, NULL);
    hcmp("geqrf", &A, &Ar, tol(dt) * 10);
    hcmp("tau", &tau, &taur, tol(dt) * 10);
    if (n <= m) { /* Q's first n columns */
        snprintf(case_desc, sizeof case_desc, "orgqr %s nb %d %lldx%lld layout %d", tpu_dtype_name(dt), s->nb,
                 (long long)m, (long long)n, layout);
        hten Q, Qr;
        hclone(&Q, &Ar);
        hclone(&Qr, &Ar);
        tpu_tensor o2[2] = {Q.t, taur.t};
        run(false, TPU_OP_ORGQR, o2, 2, p, NULL);
        o2[0] = Qr.t;
        run(true, TPU_OP_ORGQR, o2, 2, p, NULL);
        hcmp("orgqr", &Q, &Qr, tol(dt) * 10);
        hfree(&Q);
        hfree(&Qr);
    }
    for (int f = 0; f < 4; f++) { /* op(Q) C: left (C has m rows) or right (m columns), Q or Q^T */
        bool left = f & 1, tr = f & 2;
        snprintf(case_desc, sizeof case_desc, "ormqr %s nb %d %lldx%lld layout %d left %d trans %d", tpu_dtype_name(dt),
                 s->nb, (long long)m, (long long)n, layout, left, tr);
        int64_t cs[4];
        mksizes(s, left ? m : 3, left ? 2 : m, cs);
        hten C, Cr;
        hmk(&C, dt, nd, cs, (layout + f) % L_COUNT);
        fill_mats(&C, M_RAND);
        hclone(&Cr, &C);
        tpu_tensor o3[3] = {C.t, Ar.t, taur.t};
        run(false, TPU_OP_ORMQR, o3, 3, params4(left, tr, 0, 0), NULL);
        o3[0] = Cr.t;
        run(true, TPU_OP_ORMQR, o3, 3, params4(left, tr, 0, 0), NULL);
        hcmp("ormqr", &C, &Cr, tol(dt) * 10);
        hfree(&C);
        hfree(&Cr);
    }
    hten *all[] = {&A, &Ar, &tau, &taur};
    for (int q = 0; q < 4; q++) hfree(all[q]);
}

static void test_qr(void) {
    const tpu_dtype dts[] = {TPU_F32, TPU_F64};
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < NSHAPES; s++)
            for (int f = 0; f < 8; f++)
                qr_case(dts[d], &shapes[s], 1 + (f * 5) % 9, 1 + (f * 3) % 7, (f + s) % L_COUNT);
    qr_case(TPU_F64, &shapes[1], 30, 20, L_PERM);
}

/* LAPACK's signs: [[3], [4]] -> R = -5 (beta = -sign(alpha) ||x||), v = (1, 0.5), tau = 1.6; a zero column
 * below the diagonal is H = I (tau 0), as is a 1 x n matrix. */
static void test_qr_hand(void) {
    snprintf(case_desc, sizeof case_desc, "qr hand values");
    int64_t s21[2] = {2, 1}, one = 1;
    hten A, tau;
    hmk(&A, TPU_F64, 2, s21, L_CONTIG);
    hmk(&tau, TPU_F64, 1, &one, L_CONTIG);
    tpu_tensor ops[2] = {A.t, tau.t};
    for (int ref = 0; ref < 2; ref++) {
        hset(&A, 0, 3);
        hset(&A, 1, 4);
        CHECK(run(ref, TPU_OP_GEQRF, ops, 2, params4(0, 0, 0, 0), NULL) == TPU_OK);
        CHECK_MSG(fabs(hget(&A, 0) + 5) < 1e-15 && fabs(hget(&A, 1) - 0.5) < 1e-15 && fabs(hget(&tau, 0) - 1.6) < 1e-15,
                  "ref %d: %g %g %g", ref, hget(&A, 0), hget(&A, 1), hget(&tau, 0));
        hset(&A, 0, -2);
        hset(&A, 1, 0);
        CHECK(run(ref, TPU_OP_GEQRF, ops, 2, params4(0, 0, 0, 0), NULL) == TPU_OK);
        CHECK(hget(&A, 0) == -2 && hget(&A, 1) == 0 && hget(&tau, 0) == 0);
    }
    hfree(&A);
    hfree(&tau);
}

/* ---- Jacobi eigh and SVD: values directly, vectors up to a sign per vector ---- */
/* Column j (or row j if rows) of every matrix of f against r's, r's sign flipped to f's; the first `cnt` only. */
static void hcmp_vecs(const char *what, const hten *f, const hten *r, bool rows, int64_t cnt, double tol) {
    const tpu_tensor *t = &f->t;
    int64_t R = t->sizes[t->ndim - 2], C = t->sizes[t->ndim - 1], nb = R > 0 && C > 0 ? hnumel(t) / (R * C) : 0;
    int64_t len = rows ? C : R;
    ncompared++;
    CHECK_MSG(hguards_ok(f), "%s [%s]: fast kernel wrote outside the view", what, case_desc);
    for (int64_t b = 0; b < nb; b++)
        for (int64_t j = 0; j < cnt; j++) {
            double d = 0;
            for (int64_t i = 0; i < len; i++) {
                int64_t l = rows ? mlin(t, b, j, i) : mlin(t, b, i, j);
                d += hget(f, l) * hget(r, l);
            }
            double sg = d < 0 ? -1 : 1;
            for (int64_t i = 0; i < len; i++) {
                int64_t l = rows ? mlin(t, b, j, i) : mlin(t, b, i, j);
                if (!(fabs(hget(f, l) - sg * hget(r, l)) <= tol)) {
                    CHECK_MSG(false, "%s [%s]: matrix %lld vector %lld elem %lld fast %.9g ref %.9g", what, case_desc,
                              (long long)b, (long long)j, (long long)i, hget(f, l), sg * hget(r, l));
                    return;
                }
            }
        }
}

/* Every matrix of h has orthonormal columns (rows if rows). */
static void horthonormal(const char *what, const hten *h, bool rows, double tol) {
    const tpu_tensor *t = &h->t;
    int64_t R = t->sizes[t->ndim - 2], C = t->sizes[t->ndim - 1], nb = R > 0 && C > 0 ? hnumel(t) / (R * C) : 0;
    int64_t nv = rows ? R : C, len = rows ? C : R;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t i = 0; i < nv; i++)
            for (int64_t j = 0; j < nv; j++) {
                double d = 0;
                for (int64_t k = 0; k < len; k++)
                    d += rows ? hget(h, mlin(t, b, i, k)) * hget(h, mlin(t, b, j, k))
                              : hget(h, mlin(t, b, k, i)) * hget(h, mlin(t, b, k, j));
                if (!(fabs(d - (i == j)) <= tol)) {
                    CHECK_MSG(false, "%s [%s]: matrix %lld vectors %lld, %lld: dot %.9g", what, case_desc, (long long)b,
                              (long long)i, (long long)j, d);
                    return;
                }
            }
}

static void eigh_case(tpu_dtype dt, const shape *s, int64_t n, int layout, bool upper, bool vectors) {
    snprintf(case_desc, sizeof case_desc, "eigh %s nb %d n %lld layout %d upper %d vectors %d", tpu_dtype_name(dt),
             s->nb, (long long)n, layout, upper, vectors);
    int64_t as[4], ws[3], is[2] = {s->b[0], s->b[1]};
    int nd = mksizes(s, n, n, as);
    for (int q = 0; q < s->nb; q++) ws[q] = s->b[q];
    ws[s->nb] = n;
    hten A, Ar, w, wr, info, infor;
    hmk(&A, dt, nd, as, layout);
    fill_mats(&A, M_RAND); /* not symmetric: only the triangle read counts */
    hmk(&w, dt, s->nb + 1, ws, (layout + 1) % L_COUNT);
    hmk(&info, TPU_I32, s->nb, is, L_CONTIG);
    hclone(&Ar, &A);
    hclone(&wr, &w);
    hclone(&infor, &info);
    tpu_tensor ops[3] = {A.t, w.t, info.t};
    tpu_params p = params4(upper, vectors, 0, 0);
    run(false, TPU_OP_SYEV, ops, 3, p, NULL);
    tpu_tensor opr[3] = {Ar.t, wr.t, infor.t};
    run(true, TPU_OP_SYEV, opr, 3, p, NULL);
    hcmp("eigenvalues", &w, &wr, tol(dt) * 10);
    hcmp("info", &info, &infor, 0);
    if (vectors) {
        hcmp_vecs("eigenvectors", &A, &Ar, false, n, dt == TPU_F64 ? 1e-8 : 2e-3);
        horthonormal("eigenvectors", &A, false, dt == TPU_F64 ? 1e-12 : 1e-5);
    }
    hten *all[] = {&A, &Ar, &w, &wr, &info, &infor};
    for (int q = 0; q < 6; q++) hfree(all[q]);
}

static void svd_case(tpu_dtype dt, const shape *s, int64_t m, int64_t n, int layout, int uv) {
    snprintf(case_desc, sizeof case_desc, "svd %s nb %d %lldx%lld layout %d uv %d", tpu_dtype_name(dt), s->nb,
             (long long)m, (long long)n, layout, uv);
    int64_t k = m < n ? m : n, as[4], ss[3], is[2] = {s->b[0], s->b[1]}, us[4], vs[4];
    int nd = mksizes(s, m, n, as);
    mksizes(s, m, uv == 2 ? m : k, us);
    mksizes(s, uv == 2 ? n : k, n, vs);
    for (int q = 0; q < s->nb; q++) ss[q] = s->b[q];
    ss[s->nb] = k;
    hten A, S, Sr, U, Ur, V, Vr, info, infor;
    hmk(&A, dt, nd, as, layout);
    fill_mats(&A, M_RAND);
    hmk(&S, dt, s->nb + 1, ss, L_PAD);
    hmk(&U, dt, nd, us, (layout + 1) % L_COUNT);
    hmk(&V, dt, nd, vs, (layout + 2) % L_COUNT);
    hmk(&info, TPU_I32, s->nb, is, L_CONTIG);
    hclone(&Sr, &S);
    hclone(&Ur, &U);
    hclone(&Vr, &V);
    hclone(&infor, &info);
    tpu_tensor none = tpu_tensor_scalar_f(0, dt);
    tpu_tensor ops[5] = {S.t, uv ? U.t : none, uv ? V.t : none, info.t, A.t};
    tpu_params p = params4(0, 0, 0, 0);
    run(false, TPU_OP_GESVD, ops, 5, p, NULL);
    tpu_tensor opr[5] = {Sr.t, uv ? Ur.t : none, uv ? Vr.t : none, infor.t, A.t};
    run(true, TPU_OP_GESVD, opr, 5, p, NULL);
    hcmp("singular values", &S, &Sr, tol(dt) * 10);
    hcmp("info", &info, &infor, 0);
    if (uv) {
        double vt = dt == TPU_F64 ? 1e-8 : 2e-3, ot = dt == TPU_F64 ? 1e-12 : 1e-5;
        hcmp_vecs("U", &U, &Ur, false, k, vt);
        hcmp_vecs("Vh", &V, &Vr, true, k, vt);
        horthonormal("U", &U, false, ot);
        horthonormal("Vh", &V, true, ot);
    }
    hten *all[] = {&A, &S, &Sr, &U, &Ur, &V, &Vr, &info, &infor};
    for (int q = 0; q < 9; q++) hfree(all[q]);
}

static void test_eigh_svd(void) {
    const tpu_dtype dts[] = {TPU_F32, TPU_F64};
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < NSHAPES; s++)
            for (int f = 0; f < 6; f++) {
                int64_t n = 1 + (f * 5) % 9, m = 1 + (f * 3) % 7;
                eigh_case(dts[d], &shapes[s], n, (f + s) % L_COUNT, f & 1, f != 3);
                svd_case(dts[d], &shapes[s], m, n, (f + s) % L_COUNT, f % 3);
                svd_case(dts[d], &shapes[s], n, m, (f + s + 1) % L_COUNT, (f + 1) % 3);
            }
    eigh_case(TPU_F64, &shapes[1], 24, L_PERM, false, true);
    svd_case(TPU_F32, &shapes[0], 20, 9, L_CONTIG, 2);
}

/* Hand values: [[2, 1], [1, 2]] has eigenvalues 1, 3; [[3, 0], [4, 5]] singular values sqrt 45, sqrt 5; a rank-1
 * matrix's second singular value is 0 and its singular vectors still orthonormal; NaN gives NaN and LAPACK's info. */
static void test_eigh_svd_hand(void) {
    snprintf(case_desc, sizeof case_desc, "eigh / svd hand values");
    int64_t s2[2] = {2, 2}, two = 2, three[2] = {3, 3};
    hten A, w, U, V, info, B;
    hmk(&A, TPU_F64, 2, s2, L_CONTIG);
    hmk(&w, TPU_F64, 1, &two, L_CONTIG);
    hmk(&U, TPU_F64, 2, s2, L_CONTIG);
    hmk(&V, TPU_F64, 2, s2, L_CONTIG);
    hmk(&info, TPU_I32, 0, NULL, L_CONTIG);
    hmk(&B, TPU_F64, 2, s2, L_PERM);
    for (int ref = 0; ref < 2; ref++) {
        double e[4] = {2, 1, 1, 2};
        for (int i = 0; i < 4; i++) hset(&A, i, e[i]);
        tpu_tensor o1[3] = {A.t, w.t, info.t};
        CHECK(run(ref, TPU_OP_SYEV, o1, 3, params4(0, 1, 0, 0), NULL) == TPU_OK);
        CHECK_MSG(fabs(hget(&w, 0) - 1) < 1e-15 && fabs(hget(&w, 1) - 3) < 1e-15 && hgeti(&info, 0) == 0,
                  "ref %d: %g %g", ref, hget(&w, 0), hget(&w, 1));
        CHECK(fabs(fabs(hget(&A, 0)) - sqrt(0.5)) < 1e-15 &&
              fabs(hget(&A, 0) + hget(&A, 2)) < 1e-15); /* (1, -1) / sqrt 2 */
        double sv[4] = {3, 0, 4, 5}, r1[4] = {1, 2, 2, 4};
        for (int i = 0; i < 4; i++) hset(&B, i, sv[i]);
        tpu_tensor o2[5] = {w.t, U.t, V.t, info.t, B.t};
        CHECK(run(ref, TPU_OP_GESVD, o2, 5, params4(0, 0, 0, 0), NULL) == TPU_OK);
        CHECK_MSG(fabs(hget(&w, 0) - sqrt(45)) < 1e-13 && fabs(hget(&w, 1) - sqrt(5)) < 1e-13, "ref %d: %g %g", ref,
                  hget(&w, 0), hget(&w, 1));
        for (int i = 0; i < 4; i++) hset(&B, i, r1[i]);
        CHECK(run(ref, TPU_OP_GESVD, o2, 5, params4(0, 0, 0, 0), NULL) == TPU_OK);
        CHECK_MSG(fabs(hget(&w, 0) - 5) < 1e-13 && fabs(hget(&w, 1)) < 1e-7, "ref %d: %g %g", ref, hget(&w, 0),
                  hget(&w, 1));
        horthonormal("rank-1 U", &U, false, 1e-12);
        horthonormal("rank-1 Vh", &V, true, 1e-12);
        hset(&B, 0, NAN);
        CHECK(run(ref, TPU_OP_GESVD, o2, 5, params4(0, 0, 0, 0), NULL) == TPU_OK);
        CHECK(hgeti(&info, 0) == -4 && isnan(hget(&w, 0)));
        hset(&A, 3, NAN);
        CHECK(run(ref, TPU_OP_SYEV, o1, 3, params4(0, 1, 0, 0), NULL) == TPU_OK);
        CHECK(hgeti(&info, 0) == 0 && isnan(hget(&w, 0)) && isnan(hget(&A, 0)));
    }
    hten C, wc;
    hmk(&C, TPU_F32, 2, three, L_CONTIG);
    hmk(&wc, TPU_F32, 1, &three[0], L_CONTIG);
    for (int i = 0; i < 9; i++) hset(&C, i, i == 4 ? NAN : 1);
    tpu_tensor o3[3] = {C.t, wc.t, info.t};
    CHECK(run(false, TPU_OP_SYEV, o3, 3, params4(0, 0, 0, 0), NULL) == TPU_OK && hgeti(&info, 0) == 1);
    hten *all[] = {&A, &w, &U, &V, &info, &B, &C, &wc};
    for (int q = 0; q < 8; q++) hfree(all[q]);
}

/* Malformed launches fail both kernels with a message. */
static void test_errors(void) {
    snprintf(case_desc, sizeof case_desc, "errors");
    int64_t s34[2] = {3, 4}, s33[2] = {3, 3};
    hten A, B, info;
    hmk(&A, TPU_F32, 2, s34, L_CONTIG);
    hmk(&B, TPU_F64, 2, s33, L_CONTIG);
    hmk(&info, TPU_I32, 0, NULL, L_CONTIG);
    char err[256];
    for (int ref = 0; ref < 2; ref++) {
        tpu_tensor o1[2] = {A.t, info.t}; /* not square */
        CHECK(run(ref, TPU_OP_POTRF, o1, 2, params4(0, 0, 0, 0), err) == TPU_ERROR_KERNEL && err[0]);
        tpu_tensor o2[2] = {B.t, A.t}; /* dtypes differ, A not square */
        CHECK(run(ref, TPU_OP_TRSM, o2, 2, params4(1, 0, 0, 0), err) == TPU_ERROR_KERNEL && err[0]);
        tpu_tensor o3[2] = {B.t, B.t}; /* info not int32 */
        CHECK(run(ref, TPU_OP_POTRF, o3, 2, params4(0, 0, 0, 0), err) == TPU_ERROR_KERNEL && err[0]);
    }
    hfree(&A);
    hfree(&B);
    hfree(&info);
}

/* Large batches run on the compute pool: every matrix solved. */
static void test_parallel_batch(void) {
    shape big = {1, {301, 0}};
    trsm_case(TPU_F32, &big, 5, 4, L_PAD, true, false, false, false, true);
    potrf_case(TPU_F64, &big, 6, L_PERM, false, 0);
    lu_case(TPU_F32, &big, 7, 7, L_CONTIG, -1);
}

int main(void) {
    /* Bring the runtime up so kernels run on its compute pool, as under a launch. */
    if (tpu_init() != TPU_OK) return 1;
    RUN_TEST(test_trsm);
    RUN_TEST(test_cholesky);
    RUN_TEST(test_cholesky_hand);
    RUN_TEST(test_lu);
    RUN_TEST(test_lu_hand);
    RUN_TEST(test_qr);
    RUN_TEST(test_qr_hand);
    RUN_TEST(test_eigh_svd);
    RUN_TEST(test_eigh_svd_hand);
    RUN_TEST(test_errors);
    RUN_TEST(test_parallel_batch);
    printf("%ld output tensors compared against the reference\n", ncompared);
    return TEST_SUMMARY();
}
