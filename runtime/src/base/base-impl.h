/* base-impl.h - the bottom floor of the runtime (runtime/src/base/): the
 * thread-local last error, the op table generated from ops.def with its dtype
 * rules, what a kernel sees (tpu_kargs), and per-element dtype helpers.
 *
 * Floors (each uses only those below it; `make lint` checks the includes and
 * the linked symbols): base -> ref -> kernels -> vtpu. Everything here is
 * plain data and pure functions: no threads, no device. */
#ifndef TPU_BASE_IMPL_H
#define TPU_BASE_IMPL_H
#include "tpu/status.h"
#include "tpu/ops.h"
#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>

/* Set the last error and return `s` (for `return tpu_set_error(...)`). */
tpu_status tpu_set_error(tpu_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The dtype rule column of ops.def (see its header): bit (1 << tpu_dtype) per
 * accepted dtype, plus flags saying which operands the rule applies to. */
#define DT_F32      (1u << TPU_F32)
#define DT_F64      (1u << TPU_F64)
#define DT_F16      (1u << TPU_F16)
#define DT_BF16     (1u << TPU_BF16)
#define DT_BOOL     (1u << TPU_BOOL)
#define DT_FLOAT    (DT_F32 | DT_F64 | DT_F16 | DT_BF16)
#define DT_INT      ((1u << TPU_U8) | (1u << TPU_I8) | (1u << TPU_I16) | (1u << TPU_I32) | (1u << TPU_I64))
#define DT_NUM      (DT_FLOAT | DT_INT)
#define DT_ALL      (DT_NUM | DT_BOOL)
#define DT_CPLX     ((1u << TPU_C64) | (1u << TPU_C128)) /* complex: the FFT family */
#define DT_MASK     0xffffu
#define DT_OUT      (1u << 16) /* the rule applies to output 0 */
#define DT_IN_FLOAT (1u << 17) /* and every tensor input must be floating */
#define DT_PRED     (1u << 18) /* a predicate: the output is bool */
#define DT_DIVISOR  (1u << 19) /* integer domain: input 1 is a divisor (0 fails) */

typedef struct tpu_op_info {
    int nout, nin_min, nin_max;
    unsigned dtypes; /* DT_* rule and flags */
    tpu_op_class cls;
    bool int_form; /* elementwise: computes in int64 for integer/bool compute dtypes */
} tpu_op_info;
extern const tpu_op_info tpu_op_infos[];

/* The op's dtype rule against a launch's operands (already checked for
 * arity and valid dtypes) and params: TPU_OK, or TPU_ERROR_NOT_SUPPORTED with
 * PyTorch's message ("bitwise_and" not implemented for 'Float'). */
tpu_status tpu_op_check_dtypes(tpu_op op, const tpu_tensor *t, int n, const tpu_params *p);

/* Per-ISA clones of hot loops (AVX-512 / AVX2 / baseline, picked at load
 * time by an ifunc). ThreadSanitizer crashes on ifunc resolvers that run
 * before it is initialized, so TSan builds get the baseline only. */
#if defined(__SANITIZE_THREAD__) || defined(TPU_NO_CLONES)
#define TPU_TARGET_CLONES
#else
#define TPU_TARGET_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

/* What a kernel sees, fast (kernels/) or reference (ref/): the op, its
 * operands with `base` already translated to a host-addressable pointer (the
 * vTPU's device memory), and the parameters. Launch-time validation (arity,
 * ranks, storage bounds) has already been done; a kernel checks
 * data-dependent things (index ranges) and reports failures with
 * tpu_kernel_fail(), which names the op. */
typedef struct tpu_kargs {
    tpu_op op;
    int n;         /* operands: outputs first */
    uint32_t site; /* the launch's call site (tpu_set_launch_site; 0 = unknown) */
    tpu_params p;  /* before t[]: a recorded graph's node reads op, n, p and t[0] in a few cache lines */
    tpu_tensor t[TPU_MAX_OPERANDS]; /* t[k].base is a host pointer here */
    char err[256];                  /* filled by tpu_kernel_fail */
} tpu_kargs;

typedef tpu_status (*tpu_kernel_fn)(tpu_kargs *a);

/* Run by_family[family of a->op] (a table of TPU_FAM_COUNT kernels built
 * from TPU_FAMILIES: the fast registry and the reference dispatcher). */
tpu_status tpu_run_by_family(const tpu_kernel_fn *by_family, tpu_kargs *a);

/* "tpu kernel 'op' failed: <a->err or the status> (called at <site>)" into buf. */
void tpu_kernel_failure_text(const tpu_kargs *a, tpu_status st, char *buf, size_t len);

/* Record a kernel failure; returns TPU_ERROR_KERNEL for `return tpu_kernel_fail(...)`. */
tpu_status tpu_kernel_fail(tpu_kargs *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Element pointer helpers. */
static inline char *tpu_elem_ptr(const tpu_tensor *t, int64_t elem_off) {
    return (char *)t->base + (size_t)(t->offset + elem_off) * tpu_dtype_size((tpu_dtype)t->dtype);
}

/* bf16 / f16 conversions (round to nearest even). */
static inline float tpu_bf16_to_f32(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
static inline uint16_t tpu_f32_to_bf16(float f) {
    union {
        uint32_t u;
        float f;
    } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* quiet NaN */
    uint32_t r = 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)((v.u + r) >> 16);
}
static inline float tpu_f16_to_f32(uint16_t h) {
    _Float16 x;
    __builtin_memcpy(&x, &h, 2);
    return (float)x;
}
static inline uint16_t tpu_f32_to_f16(float f) {
    _Float16 x = (_Float16)f;
    uint16_t h;
    __builtin_memcpy(&h, &x, 2);
    return h;
}

/* Generic load/store of one element converted to/from double and int64. */
double tpu_load_f64(const void *p, tpu_dtype dt);
int64_t tpu_load_i64(const void *p, tpu_dtype dt);
void tpu_store_f64(void *p, tpu_dtype dt, double v);
void tpu_store_i64(void *p, tpu_dtype dt, int64_t v);
#endif
