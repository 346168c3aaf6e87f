/* ref_rnn.c - reference LSTM and GRU cells (the RNN family): the oracle
 * kernels/rnn.c is tested against, and the operand checks both share.
 *
 * Naive on purpose: one element at a time through tpu_load_f64 /
 * tpu_store_f64, all arithmetic and bias sums in double, serial, written
 * straight from the formulas next to the ops in ops.def. */
#include "ref/ref-impl.h"
#include <math.h>
#include <stdbool.h>
#include <stdio.h>

/* ---- operand checks ---- */

/* One operand of a cell: `w` columns per hidden unit (a [B, w*H] matrix, or
 * a [w*H] vector when `vec`); `opt`: may be absent (a host scalar). */
typedef struct rnn_role {
    const char *name;
    int8_t w, vec, opt;
} rnn_role;

typedef struct rnn_sig {
    int n;     /* operands, biases included */
    int nbias; /* trailing optional forward biases (0 or 2) */
    int state; /* the [B, H] operand that gives B and H */
    rnn_role r[TPU_MAX_OPERANDS];
} rnn_sig;

static const rnn_sig sig_lstm = {8,
                                 2,
                                 5,
                                 {{"hy", 1, 0, 0},
                                  {"cy", 1, 0, 0},
                                  {"workspace", 4, 0, 0},
                                  {"input_gates", 4, 0, 0},
                                  {"hidden_gates", 4, 0, 0},
                                  {"cx", 1, 0, 0},
                                  {"input_bias", 4, 1, 0},
                                  {"hidden_bias", 4, 1, 0}}};
static const rnn_sig sig_lstm_bwd = {8,
                                     0,
                                     5,
                                     {{"grad_gates", 4, 0, 0},
                                      {"grad_cx", 1, 0, 0},
                                      {"grad_bias", 4, 1, 1},
                                      {"grad_hy", 1, 0, 1},
                                      {"grad_cy", 1, 0, 1},
                                      {"cx", 1, 0, 0},
                                      {"cy", 1, 0, 0},
                                      {"workspace", 4, 0, 0}}};
static const rnn_sig sig_gru = {7,
                                2,
                                4,
                                {{"hy", 1, 0, 0},
                                 {"workspace", 5, 0, 0},
                                 {"input_gates", 3, 0, 0},
                                 {"hidden_gates", 3, 0, 0},
                                 {"hx", 1, 0, 0},
                                 {"input_bias", 3, 1, 0},
                                 {"hidden_bias", 3, 1, 0}}};
static const rnn_sig sig_gru_bwd = {7,
                                    0,
                                    5,
                                    {{"grad_input_gates", 3, 0, 0},
                                     {"grad_hidden_gates", 3, 0, 0},
                                     {"grad_hx", 1, 0, 0},
                                     {"grad_input_bias", 3, 1, 1},
                                     {"grad_hidden_bias", 3, 1, 1},
                                     {"grad_hy", 1, 0, 0},
                                     {"workspace", 5, 0, 0}}};

tpu_status tpu_rnn_check(tpu_kargs *a, int64_t *B, int64_t *H) {
    const rnn_sig *s;
    switch (a->op) {
    case TPU_OP_LSTM_CELL: s = &sig_lstm; break;
    case TPU_OP_LSTM_CELL_BWD: s = &sig_lstm_bwd; break;
    case TPU_OP_GRU_CELL: s = &sig_gru; break;
    case TPU_OP_GRU_CELL_BWD: s = &sig_gru_bwd; break;
    default: return tpu_kernel_fail(a, "%s: not an rnn op", tpu_op_name(a->op));
    }
    const char *op = tpu_op_name(a->op);
    if (a->n != s->n && a->n != s->n - s->nbias)
        return tpu_kernel_fail(a, "%s: expected %d operands%s, got %d", op, s->n,
                               s->nbias ? " (or none of the biases)" : "", a->n);
    const tpu_tensor *st = &a->t[s->state];
    if (st->is_scalar || st->ndim != 2)
        return tpu_kernel_fail(a, "%s: %s must be 2-d [batch, hidden], got %d dims", op, s->r[s->state].name,
                               st->is_scalar ? 0 : st->ndim);
    tpu_dtype dt = (tpu_dtype)st->dtype;
    if (!tpu_dtype_is_float(dt)) return tpu_kernel_fail(a, "%s: not implemented for dtype %s", op, tpu_dtype_name(dt));
    *B = st->sizes[0];
    *H = st->sizes[1];
    for (int k = 0; k < a->n; k++) {
        const tpu_tensor *t = &a->t[k];
        const rnn_role *r = &s->r[k];
        if (t->is_scalar) {
            if (!r->opt) return tpu_kernel_fail(a, "%s: %s (operand %d) is missing", op, r->name, k);
            continue;
        }
        if (t->dtype != (int32_t)dt)
            return tpu_kernel_fail(a, "%s: %s is %s, expected %s like %s", op, r->name,
                                   tpu_dtype_name((tpu_dtype)t->dtype), tpu_dtype_name(dt), s->r[s->state].name);
        int64_t cols = t->ndim ? t->sizes[t->ndim - 1] : 1;
        bool ok = t->ndim == (r->vec ? 1 : 2) && cols % r->w == 0 && cols / r->w == *H && (r->vec || t->sizes[0] == *B);
        if (!ok) {
            char got[96] = "[", *p = got + 1;
            for (int d = 0; d < t->ndim && p < got + sizeof got - 24; d++)
                p += snprintf(p, (size_t)(got + sizeof got - p), d ? ", %lld" : "%lld", (long long)t->sizes[d]);
            snprintf(p, (size_t)(got + sizeof got - p), "]");
            if (r->vec)
                return tpu_kernel_fail(a, "%s: %s has shape %s, expected [%lld]", op, r->name, got,
                                       (long long)(r->w * *H));
            return tpu_kernel_fail(a, "%s: %s has shape %s, expected [%lld, %lld]", op, r->name, got, (long long)*B,
                                   (long long)(r->w * *H));
        }
    }
    if (a->op == TPU_OP_GRU_CELL_BWD && a->t[3].is_scalar != a->t[4].is_scalar)
        return tpu_kernel_fail(a, "%s: the two bias gradients are wanted together or not at all", op);
    return TPU_OK;
}

/* ---- element access ---- */

static double get2(const tpu_tensor *t, int64_t b, int64_t c) {
    if (t->is_scalar) return t->f;
    int64_t off = t->offset + b * t->strides[0] + c * t->strides[1];
    return tpu_load_f64((const char *)t->base + (size_t)off * tpu_dtype_size((tpu_dtype)t->dtype), (tpu_dtype)t->dtype);
}

static void set2(const tpu_tensor *t, int64_t b, int64_t c, double v) {
    int64_t off = t->offset + b * t->strides[0] + c * t->strides[1];
    tpu_store_f64((char *)t->base + (size_t)off * tpu_dtype_size((tpu_dtype)t->dtype), (tpu_dtype)t->dtype, v);
}

static double get1(const tpu_tensor *t, int64_t c) {
    int64_t off = t->offset + c * t->strides[0];
    return tpu_load_f64((const char *)t->base + (size_t)off * tpu_dtype_size((tpu_dtype)t->dtype), (tpu_dtype)t->dtype);
}

static void set1(const tpu_tensor *t, int64_t c, double v) {
    int64_t off = t->offset + c * t->strides[0];
    tpu_store_f64((char *)t->base + (size_t)off * tpu_dtype_size((tpu_dtype)t->dtype), (tpu_dtype)t->dtype, v);
}

static double sigmoid(double x) { return 1 / (1 + exp(-x)); }

/* Pre-activation of gate k at (b, j): input + hidden gates + both biases. */
static double preact(const tpu_kargs *a, int first, bool bias, int64_t H, int64_t b, int64_t j, int k) {
    double v = get2(&a->t[first], b, k * H + j) + get2(&a->t[first + 1], b, k * H + j);
    if (bias) v += get1(&a->t[a->n - 2], k * H + j) + get1(&a->t[a->n - 1], k * H + j);
    return v;
}

/* ---- the cells ---- */

/* (hy, cy, ws) <- (gi, gh, cx [, b1, b2]); gates i, f, g, o. */
static void ref_lstm(tpu_kargs *a, int64_t B, int64_t H) {
    bool bias = a->n == 8;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < H; j++) {
            double i = sigmoid(preact(a, 3, bias, H, b, j, 0));
            double f = sigmoid(preact(a, 3, bias, H, b, j, 1));
            double g = tanh(preact(a, 3, bias, H, b, j, 2));
            double o = sigmoid(preact(a, 3, bias, H, b, j, 3));
            double c = f * get2(&a->t[5], b, j) + i * g;
            set2(&a->t[0], b, j, o * tanh(c));
            set2(&a->t[1], b, j, c);
            set2(&a->t[2], b, j, i);
            set2(&a->t[2], b, H + j, f);
            set2(&a->t[2], b, 2 * H + j, g);
            set2(&a->t[2], b, 3 * H + j, o);
        }
}

/* (dgates, dcx, dbias?) <- (dhy?, dcy?, cx, cy, ws). */
static void ref_lstm_bwd(tpu_kargs *a, int64_t B, int64_t H) {
    const tpu_tensor *db = &a->t[2];
    for (int64_t j = 0; j < H; j++) {
        double sum[4] = {0, 0, 0, 0};
        for (int64_t b = 0; b < B; b++) {
            const tpu_tensor *ws = &a->t[7];
            double i = get2(ws, b, j), f = get2(ws, b, H + j), g = get2(ws, b, 2 * H + j), o = get2(ws, b, 3 * H + j);
            double dhy = get2(&a->t[3], b, j), dcy = get2(&a->t[4], b, j);
            double cx = get2(&a->t[5], b, j), tc = tanh(get2(&a->t[6], b, j));
            double dc = dhy * o * (1 - tc * tc) + dcy; /* d cy, through hy and directly */
            double d[4] = {dc * g * i * (1 - i), dc * cx * f * (1 - f), dc * i * (1 - g * g), dhy * tc * o * (1 - o)};
            for (int k = 0; k < 4; k++) {
                set2(&a->t[0], b, k * H + j, d[k]);
                sum[k] += d[k];
            }
            set2(&a->t[1], b, j, dc * f);
        }
        if (!db->is_scalar)
            for (int k = 0; k < 4; k++) set1(db, k * H + j, sum[k]);
    }
}

/* (hy, ws) <- (gi, gh, hx [, b1, b2]); gates r, z, n; ws = (r, z, n, hx, hn + b2n). */
static void ref_gru(tpu_kargs *a, int64_t B, int64_t H) {
    bool bias = a->n == 7;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < H; j++) {
            double r = sigmoid(preact(a, 2, bias, H, b, j, 0));
            double z = sigmoid(preact(a, 2, bias, H, b, j, 1));
            double hn = get2(&a->t[3], b, 2 * H + j) + (bias ? get1(&a->t[6], 2 * H + j) : 0);
            double in = get2(&a->t[2], b, 2 * H + j) + (bias ? get1(&a->t[5], 2 * H + j) : 0);
            double n = tanh(in + r * hn);
            double hx = get2(&a->t[4], b, j);
            set2(&a->t[0], b, j, (1 - z) * n + z * hx);
            double w[5] = {r, z, n, hx, hn};
            for (int k = 0; k < 5; k++) set2(&a->t[1], b, k * H + j, w[k]);
        }
}

/* (dgi, dgh, dhx, dbi?, dbh?) <- (dhy, ws). */
static void ref_gru_bwd(tpu_kargs *a, int64_t B, int64_t H) {
    const tpu_tensor *ws = &a->t[6];
    bool bias = !a->t[3].is_scalar;
    for (int64_t j = 0; j < H; j++) {
        double si[3] = {0, 0, 0}, sh[3] = {0, 0, 0};
        for (int64_t b = 0; b < B; b++) {
            double r = get2(ws, b, j), z = get2(ws, b, H + j), n = get2(ws, b, 2 * H + j);
            double hx = get2(ws, b, 3 * H + j), hn = get2(ws, b, 4 * H + j);
            double d = get2(&a->t[5], b, j);
            double dn = d * (1 - z) * (1 - n * n); /* d of n's pre-activation */
            double dr = dn * hn * r * (1 - r), dz = d * (hx - n) * z * (1 - z);
            double gi[3] = {dr, dz, dn}, gh[3] = {dr, dz, dn * r};
            for (int k = 0; k < 3; k++) {
                set2(&a->t[0], b, k * H + j, gi[k]);
                set2(&a->t[1], b, k * H + j, gh[k]);
                si[k] += gi[k];
                sh[k] += gh[k];
            }
            set2(&a->t[2], b, j, d * z);
        }
        if (bias)
            for (int k = 0; k < 3; k++) {
                set1(&a->t[3], k * H + j, si[k]);
                set1(&a->t[4], k * H + j, sh[k]);
            }
    }
}

tpu_status tpu_ref_rnn(tpu_kargs *a) {
    int64_t B, H;
    tpu_status s = tpu_rnn_check(a, &B, &H);
    if (s) return s;
    switch (a->op) {
    case TPU_OP_LSTM_CELL: ref_lstm(a, B, H); break;
    case TPU_OP_LSTM_CELL_BWD: ref_lstm_bwd(a, B, H); break;
    case TPU_OP_GRU_CELL: ref_gru(a, B, H); break;
    case TPU_OP_GRU_CELL_BWD: ref_gru_bwd(a, B, H); break;
    default: return tpu_kernel_fail(a, "%s: not an rnn op", tpu_op_name(a->op));
    }
    return TPU_OK;
}
