/* ops.h - tensor descriptors and kernel launch.
 *
 * A launch is one op from ops.def plus its argument block (operand
 * descriptors and scalar parameters), copied into a command and run in order
 * on a stream. Arguments are validated at launch (op arity, dtypes, ranks,
 * every view inside its storage); data-dependent errors (an index out of
 * range) are raised when the kernel runs and stick to the stream.
 * Thread safety: tpu_launch is thread-safe. */
#ifndef TPU_OPS_H
#define TPU_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "status.h"
#include "stream.h"

#ifdef __cplusplus
extern "C" {
#endif

/* PyTorch's own limit for device kernels (CUDA's MAX_DIMS). Kernels drop
 * size-1 dims and merge contiguous ones, so rank costs nothing at run time. */
#define TPU_MAX_DIMS     25
#define TPU_MAX_OPERANDS 12

typedef enum tpu_op {
#define TPU_OP(e, name, fam, nout, nmin, nmax, ...) TPU_OP_##e,
#include "ops.def"
#undef TPU_OP
    TPU_OP_COUNT
} tpu_op;

/* What the graph engine may do with an op (the CLASS column of ops.def). */
typedef enum tpu_op_class {
    TPU_CLASS_NULLARY,
    TPU_CLASS_UNARY,
    TPU_CLASS_BINARY,
    TPU_CLASS_TERNARY,
    TPU_CLASS_MOVE,
    TPU_CLASS_REDUCTION,
    TPU_CLASS_SCAN,
    TPU_CLASS_MATMUL,
    TPU_CLASS_RANDOM,
    TPU_CLASS_OPAQUE,
    TPU_CLASS_COUNT
} tpu_op_class;

/* The op families, the one list: X(ENUM, fast kernel, reference kernel) names
 * TPU_FAM_<ENUM>, its fast kernel tpu_k_<fast> (runtime/src/kernels/) and its
 * reference tpu_ref_<ref> (runtime/src/ref/); the runtime's dispatch tables
 * and prototypes are generated from it. */
/* clang-format off */
#define TPU_FAMILIES(X)                                                                       \
    X(EW, elementwise, ew) X(RED, reduce, red) X(SCAN, scan, scan) X(GEMM, gemm, gemm)         \
    X(SOFTMAX, softmax, softmax) X(LOSS, loss, loss) X(NORM, norm, norm) X(INDEX, index, index) \
    X(RANDOM, random, random) X(OPTIM, optim, optim) X(SHAPE, shape, shape) X(RNN, rnn, rnn)       \
    X(SORT, sort, sort) X(LINALG, linalg, linalg) X(FFT, fft, fft) X(ATTN, attention, attn)
/* clang-format on */

typedef enum tpu_op_family {
#define TPU_FAM_ENUM_(e, fast, ref) TPU_FAM_##e,
    TPU_FAMILIES(TPU_FAM_ENUM_)
#undef TPU_FAM_ENUM_
        TPU_FAM_COUNT
} tpu_op_family;

/* Same order as c10::ScalarType's first entries is NOT assumed; the glue maps. */
typedef enum tpu_dtype {
    TPU_F32 = 0,
    TPU_F64,
    TPU_F16,
    TPU_BF16,
    TPU_U8,
    TPU_I8,
    TPU_I16,
    TPU_I32,
    TPU_I64,
    TPU_BOOL,
    TPU_C64,  /* complex64: interleaved (real, imag) float32 pairs */
    TPU_C128, /* complex128: (real, imag) float64 pairs */
    TPU_DTYPE_COUNT
} tpu_dtype;
/* The real dtypes come first: kernels' dtype tables and the tile layer's
 * loads and stores cover [0, TPU_DTYPE_REAL_COUNT). Complex tensors are
 * computed on by the FFT family only; the glue copies, casts and fills them
 * through their real views (view_as_real: a float tensor with a last dim of
 * 2), which every real op takes. */
#define TPU_DTYPE_REAL_COUNT TPU_C64

/* A view of device memory (or a host scalar). All fields are values; `base`
 * is a borrowed device address of the whole storage. */
typedef struct tpu_tensor {
    void *base;     /* storage start (device address); NULL if is_scalar */
    size_t nbytes;  /* storage size, for bounds checks */
    int64_t offset; /* in elements */
    int32_t dtype;  /* tpu_dtype */
    int32_t ndim;
    int64_t sizes[TPU_MAX_DIMS];
    int64_t strides[TPU_MAX_DIMS]; /* in elements; 0 = broadcast */
    int32_t is_scalar;             /* host scalar: value in f (float dtypes) or i */
    double f;
    int64_t i;
} tpu_tensor;

typedef struct tpu_params {
    double f[6];
    int64_t i[6];
    int32_t compute_dtype; /* elementwise: dtype inputs are promoted to */
} tpu_params;

/* Named, typed parameters (the PARAMS column of ops.def): per op a struct
 * tpu_args_<OP> with one field per parameter (double for PF, int64_t for PI)
 * and tpu_pack_<OP>() placing them in their slots of tpu_params, so callers
 * write TPU_PARAMS(ADD, .alpha = 2.0) instead of p.f[0] = 2.0; kernels read
 * them back by name with tpu_unpack_<OP>(&params).
 *
 * How: with P, PF and PI defined as below, a PARAMS column
 * P(PF(0, alpha) PI(1, dim)) becomes the sequence (F, 0, alpha)(I, 1, dim),
 * and TPU_PSEQ(seq) applies TPU_PSEQ_M(kind, slot, name) - which the user
 * of the sequence defines - to each element. P, PF and PI are defined only
 * around an include of ops.def (they are short names). */
#define TPU_CAT_(a, b)      TPU_CAT2_(a, b)
#define TPU_CAT2_(a, b)     a##b
#define TPU_PSEQ(seq)       TPU_CAT_(TPU_PSEQ_A seq, _END)
#define TPU_PSEQ_A(k, s, n) TPU_PSEQ_M(k, s, n) TPU_PSEQ_B
#define TPU_PSEQ_B(k, s, n) TPU_PSEQ_M(k, s, n) TPU_PSEQ_A
#define TPU_PSEQ_A_END
#define TPU_PSEQ_B_END
#define TPU_P_TYPE_F double
#define TPU_P_TYPE_I int64_t
#define TPU_P_ARR_F  f
#define TPU_P_ARR_I  i

#define P(...)              __VA_ARGS__
#define PF(slot, name, ...) (F, slot, name)
#define PI(slot, name, ...) (I, slot, name)
#define TPU_PSEQ_M(k, s, n) TPU_P_TYPE_##k n;
#define TPU_OP(e, name, fam, nout, nmin, nmax, dtypes, cls, params, ...) \
    typedef struct tpu_args_##e {                                        \
        TPU_PSEQ(params) char reserved_;                                 \
    } tpu_args_##e;
#include "ops.def"
#undef TPU_OP
#undef TPU_PSEQ_M
#define TPU_PSEQ_M(k, s, n) p.TPU_P_ARR_##k[s] = a.n;
#define TPU_OP(e, name, fam, nout, nmin, nmax, dtypes, cls, params, ...) \
    static inline tpu_params tpu_pack_##e(tpu_args_##e a) {              \
        tpu_params p = {{0}, {0}, 0};                                    \
        TPU_PSEQ(params)                                                 \
        (void)a;                                                         \
        return p;                                                        \
    }
#include "ops.def"
#undef TPU_OP
#undef TPU_PSEQ_M
#define TPU_PSEQ_M(k, s, n) a.n = p->TPU_P_ARR_##k[s];
#define TPU_OP(e, name, fam, nout, nmin, nmax, dtypes, cls, params, ...) \
    static inline tpu_args_##e tpu_unpack_##e(const tpu_params *p) {     \
        tpu_args_##e a;                                                  \
        a.reserved_ = 0;                                                 \
        TPU_PSEQ(params)                                                 \
        (void)p;                                                         \
        return a;                                                        \
    }
#include "ops.def"
#undef TPU_OP
#undef TPU_PSEQ_M
#undef P
#undef PF
#undef PI
#ifdef __cplusplus
#define TPU_PARAMS(OP, ...) tpu_pack_##OP({__VA_ARGS__})
#else
#define TPU_PARAMS(OP, ...) tpu_pack_##OP((tpu_args_##OP){__VA_ARGS__})
#endif

/* Run `op` on `stream` (NULL = current stream of the calling thread's device). */
tpu_status tpu_launch(tpu_stream_t stream, tpu_op op, const tpu_tensor *operands, int n, const tpu_params *params);

const char *tpu_op_name(tpu_op op);
tpu_op_family tpu_op_family_of(tpu_op op);
tpu_op_class tpu_op_class_of(tpu_op op);
size_t tpu_dtype_size(tpu_dtype dt);
const char *tpu_dtype_name(tpu_dtype dt);
bool tpu_dtype_is_float(tpu_dtype dt);
bool tpu_dtype_is_complex(tpu_dtype dt);

/* Host-side helpers for building descriptors. */
void tpu_tensor_contiguous(tpu_tensor *t, void *base, tpu_dtype dt, int ndim, const int64_t *sizes);
tpu_tensor tpu_tensor_scalar_f(double v, tpu_dtype dt);
tpu_tensor tpu_tensor_scalar_i(int64_t v, tpu_dtype dt);
int64_t tpu_tensor_numel(const tpu_tensor *t);

/* Eager modes: how launches (and copies) issued from now on run. One
 * process-wide setting; thread-safe (a relaxed atomic); a thread may
 * override it (tpu_set_thread_eager_mode).
 *   TPU_EAGER_DEBUG   every launch and copy waits for its work, errors raise
 *                     at the op (TORCH_TPU_LAUNCH_BLOCKING=1 at start-up)
 *   TPU_EAGER_STRICT  op by op, queued on the stream, asynchronous (default)
 *   TPU_EAGER_FUSED   DeferAndFuse: launches are recorded and run fused at
 *                     flush points (graph.h) */
typedef enum tpu_eager_mode { TPU_EAGER_DEBUG, TPU_EAGER_STRICT, TPU_EAGER_FUSED, TPU_EAGER_MODE_COUNT } tpu_eager_mode;
tpu_eager_mode tpu_get_eager_mode(void);
/* TPU_ERROR_INVALID_VALUE for a value outside the enum (the mode is unchanged
 * then). Switching modes flushes every window first. */
tpu_status tpu_set_eager_mode(tpu_eager_mode m);
/* This thread's mode: m (a tpu_eager_mode), or -1 to follow the process-wide
 * one again; *prev (may be NULL) gets the override it replaces (-1: none).
 * Changing the thread's mode away from Fused Eager flushes every window
 * (TPU_FLUSH_GRAPH_END), and into Debug Eager also synchronizes the current
 * device: the status is that of the work recorded meanwhile (the override
 * is changed either way). Entering Fused Eager flushes nothing. What
 * torch.compile(backend="tpu") runs a graph in: its ops recorded into one
 * window whatever the process's mode. TPU_ERROR_INVALID_VALUE outside
 * -1 .. TPU_EAGER_MODE_COUNT - 1 (nothing changed then). */
tpu_status tpu_set_thread_eager_mode(int m, int *prev);
/* "debug", "strict", "fused" ("?" outside the enum); static strings. */
const char *tpu_eager_mode_name(tpu_eager_mode m);
/* The mode named `name` (its tpu_eager_mode_name, or "defer_and_fuse" for
 * fused); TPU_ERROR_INVALID_VALUE naming the modes there are otherwise. */
tpu_status tpu_eager_mode_from_name(const char *name, tpu_eager_mode *out);

#ifdef __cplusplus
}
#endif
#endif
