/* hten.h - host tensors for the kernel tests (test_kernels_*.c): a
 * descriptor over plain host memory (kernels see host pointers) with a
 * GUARD of sentinel bytes on each side, element access by row-major linear
 * index through any strides, random fills (xorshift64*), and the check that
 * every byte outside the view still holds the sentinel.
 *
 * The includer may define HTEN_SEED (the generator's start, so that each
 * test binary keeps its own sequence) and HTEN_OWN_HMK (it builds tensors
 * with its own hmk and layout names instead of the n-d one here). */
#ifndef TPU_TEST_HTEN_H
#define TPU_TEST_HTEN_H
#include "base/base-impl.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 64
#define PAT   0xA5

#ifndef HTEN_SEED
#define HTEN_SEED 0x9E3779B97F4A7C15ull
#endif

typedef struct hten {
    tpu_tensor t;
    unsigned char *mem; /* GUARD | storage | GUARD */
    size_t bytes;       /* storage bytes */
} hten;

/* ---- random numbers (xorshift64*) ---- */

static uint64_t rng_s = HTEN_SEED;

static inline uint64_t rng_next(void) {
    rng_s ^= rng_s >> 12;
    rng_s ^= rng_s << 25;
    rng_s ^= rng_s >> 27;
    return rng_s * 0x2545F4914F6CDD1Dull;
}
static inline double urand(double lo, double hi) { return lo + (hi - lo) * (double)(rng_next() >> 11) * 0x1.0p-53; }
static inline int64_t irand(int64_t n) { return (int64_t)(rng_next() % (uint64_t)n); }

/* Storage of `elems` elements after the view's offset (t's dtype and offset
 * set), GUARD sentinel bytes each side; the whole allocation starts as PAT. */
static inline void hstorage(hten *h, int64_t elems) {
    tpu_tensor *t = &h->t;
    h->bytes = (size_t)(t->offset + elems) * tpu_dtype_size((tpu_dtype)t->dtype);
    h->mem = malloc(h->bytes + 2 * GUARD);
    if (!h->mem) abort();
    memset(h->mem, PAT, h->bytes + 2 * GUARD);
    t->base = h->mem + GUARD;
    t->nbytes = h->bytes;
}

#ifndef HTEN_OWN_HMK
/* Layouts, as bits: L_PERM stores the dims in reverse order (a transpose),
 * L_PAD starts at offset 3 with every dim one longer (holes between rows). */
enum { L_CONTIG = 0, L_PERM = 1, L_PAD = 2, L_PERM_PAD = 3 };

static inline void hmk(hten *h, tpu_dtype dt, int ndim, const int64_t *sizes, int layout) {
    memset(h, 0, sizeof *h);
    tpu_tensor *t = &h->t;
    t->dtype = dt;
    t->ndim = ndim;
    int64_t st = 1;
    for (int q = 0; q < ndim; q++) {
        int d = (layout & L_PERM) ? q : ndim - 1 - q; /* innermost first */
        t->sizes[d] = sizes[d];
        t->strides[d] = st;
        int64_t ext = sizes[d] + ((layout & L_PAD) ? 1 : 0);
        st *= ext > 0 ? ext : 1;
    }
    t->offset = (layout & L_PAD) ? 3 : 0;
    hstorage(h, st);
}
#endif

static inline void hclone(hten *d, const hten *s) {
    *d = *s;
    d->mem = malloc(s->bytes + 2 * GUARD);
    if (!d->mem) abort();
    memcpy(d->mem, s->mem, s->bytes + 2 * GUARD);
    d->t.base = d->mem + GUARD;
}

static inline void hfree(hten *h) {
    free(h->mem);
    h->mem = NULL;
}

static inline int64_t hnumel(const tpu_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
    return n;
}

/* Element offset of row-major linear index lin. */
static inline int64_t hoff(const tpu_tensor *t, int64_t lin) {
    int64_t off = t->offset;
    for (int d = t->ndim - 1; d >= 0; d--) {
        off += (lin % t->sizes[d]) * t->strides[d];
        lin /= t->sizes[d];
    }
    return off;
}

static inline void *hptr(const tpu_tensor *t, int64_t lin) {
    return (char *)t->base + (size_t)hoff(t, lin) * tpu_dtype_size((tpu_dtype)t->dtype);
}

static inline double hget(const hten *h, int64_t lin) { return tpu_load_f64(hptr(&h->t, lin), (tpu_dtype)h->t.dtype); }
static inline void hset(hten *h, int64_t lin, double v) { tpu_store_f64(hptr(&h->t, lin), (tpu_dtype)h->t.dtype, v); }
static inline int64_t hgeti(const hten *h, int64_t lin) {
    return tpu_load_i64(hptr(&h->t, lin), (tpu_dtype)h->t.dtype);
}
static inline void hseti(hten *h, int64_t lin, int64_t v) { tpu_store_i64(hptr(&h->t, lin), (tpu_dtype)h->t.dtype, v); }

static inline void hfill(hten *h, double lo, double hi) {
    for (int64_t i = 0; i < hnumel(&h->t); i++) hset(h, i, urand(lo, hi));
}

/* Bytes outside the view's elements still hold the pattern? */
static inline bool hguards_ok(const hten *h) {
    size_t total = h->bytes + 2 * GUARD, es = tpu_dtype_size((tpu_dtype)h->t.dtype);
    unsigned char *mark = calloc(total, 1);
    if (!mark) abort();
    for (int64_t i = 0; i < hnumel(&h->t); i++) memset(mark + GUARD + (size_t)hoff(&h->t, i) * es, 1, es);
    bool ok = true;
    for (size_t b = 0; b < total; b++)
        if (!mark[b] && h->mem[b] != PAT) ok = false;
    free(mark);
    return ok;
}

#endif
