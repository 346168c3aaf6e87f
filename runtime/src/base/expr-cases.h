/* expr-cases.h - one `case` per elementwise op of ops.def, generated from
 * its EXPR column. Included (repeatedly: no include guard) inside a switch
 * on the op, after base/expr-impl.h, with these defined by the includer:
 *   T                      the domain type (float, double, int64_t)
 *   TPU_EXPR_FORM          TPU_EXPR_F or TPU_EXPR_I: which form to expand
 *   TPU_EXPR_BODY(e)       statements that use the expression e, e.g. a loop
 *                          storing it for every element
 *   TPU_EXPR_PARAM_F(slot) the value of float parameter `slot` as a T
 *   TPU_EXPR_PARAM_I(slot) the value of integer parameter `slot` as a T
 * Each case declares the op's parameters as const locals of their ops.def
 * names, runs TPU_EXPR_BODY and breaks. Ops of other classes get no case. */
#define P(...)              __VA_ARGS__
#define PF(slot, name, ...) (F, slot, name)
#define PI(slot, name, ...) (I, slot, name)
#define EXPR(f, i)          TPU_EXPR_FORM(f, i)
#define TPU_PSEQ_M(k, s, n)            \
    const T n = TPU_EXPR_PARAM_##k(s); \
    (void)n;
#define TPU_EXPR_CASE_(e, params, ex)      \
    case TPU_OP_##e: {                     \
        TPU_PSEQ(params) TPU_EXPR_BODY(ex) \
    } break;
#define TPU_EXPR_CASE_UNARY   TPU_EXPR_CASE_
#define TPU_EXPR_CASE_BINARY  TPU_EXPR_CASE_
#define TPU_EXPR_CASE_TERNARY TPU_EXPR_CASE_
#define TPU_EXPR_CASE_NULLARY(e, params, ex)
#define TPU_EXPR_CASE_MOVE(e, params, ex)
#define TPU_EXPR_CASE_REDUCTION(e, params, ex)
#define TPU_EXPR_CASE_SCAN(e, params, ex)
#define TPU_EXPR_CASE_MATMUL(e, params, ex)
#define TPU_EXPR_CASE_RANDOM(e, params, ex)
#define TPU_EXPR_CASE_OPAQUE(e, params, ex)
#define TPU_OP(e, name, fam, nout, nmin, nmax, dtypes, cls, params, ex) TPU_EXPR_CASE_##cls(e, params, ex)
#include "tpu/ops.def"
#undef TPU_OP
#undef TPU_EXPR_CASE_
#undef TPU_EXPR_CASE_UNARY
#undef TPU_EXPR_CASE_BINARY
#undef TPU_EXPR_CASE_TERNARY
#undef TPU_EXPR_CASE_NULLARY
#undef TPU_EXPR_CASE_MOVE
#undef TPU_EXPR_CASE_REDUCTION
#undef TPU_EXPR_CASE_SCAN
#undef TPU_EXPR_CASE_MATMUL
#undef TPU_EXPR_CASE_RANDOM
#undef TPU_EXPR_CASE_OPAQUE
#undef TPU_PSEQ_M
#undef EXPR
#undef P
#undef PF
#undef PI
