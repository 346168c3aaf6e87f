// ops_pointwise.cpp - tpu ATen kernels for elementwise ops (unary, binary,
// ternary, activations and their backward) and for reductions and scans.
//
// Each kernel only checks arguments, computes the output's shape and dtype,
// allocates, describes tensors to the runtime and hands the op to submit().
// No math. For structured ops only the `.out` overload is registered:
// PyTorch's CompositeExplicitAutogradNonFunctional wrappers run the op's meta
// function (shape, dtype and error checks in PyTorch's own words) and call our
// `.out` kernel for the functional and in-place forms.
#include "tpu_glue.h"
#include "complex_route.h"

#include <ATen/ExpandUtils.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/WrapDimUtilsMulti.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <torch/library.h>

#include <bitset>
#include <limits>

namespace at::tpu {

// ---------------------------------------------------------------- elementwise helpers

static c10::ScalarType float_of(c10::ScalarType t) {
  return isIntegralType(t, /*includeBool=*/true) ? default_float() : t;
}

static void check_cast(c10::ScalarType from, const at::Tensor& out) {
  TORCH_CHECK(canCast(from, out.scalar_type()), "result type ", from, " can't be cast to the desired output type ",
              out.scalar_type());
}

static std::vector<int64_t> bshape(std::initializer_list<at::Tensor> ts) {
  std::vector<int64_t> s;
  for (const auto& t : ts) s = at::infer_size(s, t.sizes());
  return s;
}

static c10::ScalarType common_type(std::initializer_list<at::Tensor> ts) {
  at::native::ResultTypeState st{};
  for (const auto& t : ts) st = at::native::update_result_type_state(t, st);
  return at::native::result_type(st);
}

// The strides TensorIterator gives an output it allocates, so a result keeps
// its inputs' memory format (x.t().abs() is transposed, as on CPU): inputs of
// one shape with equal dense strides lend them; otherwise dims are ordered
// innermost-first by the first input whose strides tell two dims apart
// (broadcast dims do not vote), and the output is dense in that order.
static at::DimVector ti_strides(c10::IntArrayRef shape, std::initializer_list<at::Tensor> ins) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  bool same = true;
  const at::Tensor* first = nullptr;
  for (const auto& t : ins) {
    if (!t.sizes().equals(shape) || !t.is_non_overlapping_and_dense()) {
      same = false;
      break;
    }
    if (!first)
      first = &t;
    else if (!t.strides().equals(first->strides())) {
      same = false;
      break;
    }
  }
  if (same && first) return at::DimVector(first->strides());
  // Each input's strides against the output shape (0 where broadcast).
  std::vector<std::vector<int64_t>> st;
  for (const auto& t : ins) {
    std::vector<int64_t> v(nd, 0);
    for (int64_t d = 0, off = nd - t.dim(); d < t.dim(); d++)
      v[off + d] = (t.size(d) == 1 && shape[off + d] != 1) ? 0 : t.stride(d);
    st.push_back(std::move(v));
  }
  auto should_swap = [&](int64_t d0, int64_t d1) {
    for (const auto& v : st) {
      if (v[d0] == 0 || v[d1] == 0) continue;
      if (v[d0] < v[d1]) return -1;
      if (v[d0] > v[d1]) return 1;
      if (shape[d0] > shape[d1]) return 1;
    }
    return 0;
  };
  std::vector<int64_t> perm(nd);  // innermost first
  for (int64_t i = 0; i < nd; i++) perm[i] = nd - 1 - i;
  for (int64_t i = 1; i < nd; i++) {
    int64_t d1 = i;
    for (int64_t d0 = i - 1; d0 >= 0; d0--) {
      int c = should_swap(perm[d0], perm[d1]);
      if (c > 0) {
        std::swap(perm[d0], perm[d1]);
        d1 = d0;
      } else if (c < 0)
        break;
    }
  }
  at::DimVector strides(nd);
  int64_t f = 1;
  for (int64_t i = 0; i < nd; i++) {
    strides[perm[i]] = f;
    f *= shape[perm[i]];
  }
  return strides;
}

// Resize `out` to `shape` as TensorIterator does: an out of the right shape is
// kept as given; one that must be resized gets ti_strides().
static void resize_like_ti(at::Tensor& out, c10::IntArrayRef shape, std::initializer_list<at::Tensor> ins) {
  if (out.sizes().equals(shape)) return;
  at::native::resize_output(out, shape);
  auto strides = ti_strides(shape, ins);
  if (!out.strides().equals(strides)) out.as_strided_(shape, strides);
}

static at::Tensor& ew_out(tpu_op op, at::Tensor& out, std::initializer_list<at::Tensor> ins,
                          std::optional<c10::ScalarType> compute = std::nullopt, tpu_params p = {},
                          bool cast_check = true) {
  c10::ScalarType c = compute ? *compute : common_type(ins);
  resize_like_ti(out, bshape(ins), ins);
  if (cast_check) check_cast(c, out);
  ew(op, out, ins, c, p);
  return out;
}

// ---------------------------------------------------------------- unary
// The plain unary ops, one row each: (ATen name, runtime op). The table makes
// both the `<name>_out` kernel and its "<name>.out" registration row.
// FLOAT ops compute in the input's floating type (integers promote to the
// default dtype); SAME ops compute in the input's dtype (activations are not
// promoted: integer inputs fail the op's dtype rule, as on CPU).
// clang-format off
#define TPU_UNARY_FLOAT_OPS(X)                                                                            \
  X(exp, EXP) X(exp2, EXP2) X(expm1, EXPM1) X(log, LOG) X(log2, LOG2) X(log10, LOG10) X(log1p, LOG1P)     \
  X(sqrt, SQRT) X(rsqrt, RSQRT) X(reciprocal, RECIPROCAL) X(sin, SIN) X(cos, COS) X(tan, TAN)             \
  X(asin, ASIN) X(acos, ACOS) X(atan, ATAN) X(sinh, SINH) X(cosh, COSH) X(tanh, TANH) X(asinh, ASINH)     \
  X(acosh, ACOSH) X(atanh, ATANH) X(erf, ERF) X(erfc, ERFC) X(sigmoid, SIGMOID) X(lgamma, LGAMMA)          \
  X(digamma, DIGAMMA) X(erfinv, ERFINV) X(i0, I0) X(special_i0e, I0E) X(special_i1, I1) X(special_i1e, I1E)   \
  X(special_entr, ENTR) X(sinc, SINC) X(special_erfcx, ERFCX) X(special_ndtri, NDTRI)                       \
  X(special_log_ndtr, LOG_NDTR) X(special_bessel_j0, BESSEL_J0) X(special_bessel_j1, BESSEL_J1)             \
  X(special_bessel_y0, BESSEL_Y0) X(special_bessel_y1, BESSEL_Y1) X(special_modified_bessel_i0, MBESSEL_I0) \
  X(special_modified_bessel_i1, MBESSEL_I1) X(special_modified_bessel_k0, MBESSEL_K0)                       \
  X(special_modified_bessel_k1, MBESSEL_K1) X(special_scaled_modified_bessel_k0, MBESSEL_K0E)               \
  X(special_scaled_modified_bessel_k1, MBESSEL_K1E) X(special_airy_ai, AIRY_AI)                              \
  X(special_spherical_bessel_j0, SPHERICAL_J0)
// clang-format on
// clang-format off
#define TPU_UNARY_SAME_OPS(X)                                                                             \
  X(silu, SILU) X(mish, MISH) X(hardsigmoid, HARDSIGMOID) X(hardswish, HARDSWISH) X(neg, NEG) X(abs, ABS) \
  X(sign, SIGN) X(floor, FLOOR) X(ceil, CEIL) X(round, ROUND) X(trunc, TRUNC) X(frac, FRAC)               \
  X(bitwise_not, BITWISE_NOT)
// clang-format on

#define UNARY_FLOAT(fn, OP)                                                  \
  static at::Tensor& fn##_out(const at::Tensor& self, at::Tensor& out) {     \
    if (TPU_OP_##OP == TPU_OP_RECIPROCAL && C10_UNLIKELY(self.is_complex())) \
      return complex_unary_out(TPU_OP_RECIPROCAL, self, out);                \
    return ew_out(TPU_OP_##OP, out, {self}, float_of(self.scalar_type()));   \
  }
#define UNARY_SAME(fn, OP)                                                                           \
  static at::Tensor& fn##_out(const at::Tensor& self, at::Tensor& out) {                             \
    if ((TPU_OP_##OP == TPU_OP_NEG || TPU_OP_##OP == TPU_OP_ABS) && C10_UNLIKELY(self.is_complex())) \
      return complex_unary_out(TPU_OP_##OP, self, out);                                              \
    return ew_out(TPU_OP_##OP, out, {self}, self.scalar_type());                                     \
  }
TPU_UNARY_FLOAT_OPS(UNARY_FLOAT)
TPU_UNARY_SAME_OPS(UNARY_SAME)
// hardswish is not a structured op: its functional and in-place forms do
// not reach the .out kernel on their own.
static at::Tensor tpu_hardswish(const at::Tensor& self) {
  at::Tensor out = at::empty({0}, self.options());
  return at::tpu::hardswish_out(self, out);
}
static at::Tensor& tpu_hardswish_(at::Tensor& self) { return at::tpu::hardswish_out(self, self); }
#undef UNARY_FLOAT
#undef UNARY_SAME

static at::Tensor& polygamma_out(int64_t n, const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK(n >= 0, "polygamma(n, x) does not support negative n.");
  return ew_out(TPU_OP_POLYGAMMA, out, {self}, float_of(self.scalar_type()), TPU_PARAMS(POLYGAMMA, .order = (double)n));
}
static at::Tensor& signbit_out(const at::Tensor& self, at::Tensor& out) {
  return ew_out(TPU_OP_SIGNBIT, out, {self}, self.scalar_type(), {}, false);
}

static at::Tensor& logical_not_out(const at::Tensor& self, at::Tensor& out) {
  return ew_out(TPU_OP_LOGICAL_NOT, out, {self}, self.scalar_type(), {}, false);
}

static at::Tensor& gelu_out(const at::Tensor& self, c10::string_view approximate, at::Tensor& out) {
  TORCH_CHECK(approximate == "none" || approximate == "tanh", "approximate argument must be either none or tanh.");
  return ew_out(approximate == "tanh" ? TPU_OP_GELU_TANH : TPU_OP_GELU, out, {self}, self.scalar_type());
}

static at::Tensor isnan(const at::Tensor& self) {
  auto out = at::empty_like(self, self.options().dtype(kBool));
  ew(TPU_OP_ISNAN, out, {self}, self.scalar_type());
  return out;
}

static at::Tensor& tri_out(tpu_op op, const at::Tensor& self, int64_t diag, at::Tensor& out) {
  TORCH_CHECK(self.dim() >= 2, op == TPU_OP_TRIL ? "tril" : "triu", ": input tensor must have at least 2 dimensions");
  at::native::resize_output(out, self.sizes());
  if (out.numel() == 0) return out;
  at::Tensor src = self;
  if (out.scalar_type() != self.scalar_type()) {
    src = at::empty(self.sizes(), out.options());
    device_copy(src, self);
  }
  tpu_tensor ts[2] = {desc(out), desc(src)};
  submit(op, ts, 2, TPU_PARAMS(TRIL, .diagonal = diag));  // TRIU packs the same
  return out;
}
static at::Tensor& tril_out(const at::Tensor& self, int64_t diag, at::Tensor& out) {
  return tri_out(TPU_OP_TRIL, self, diag, out);
}
static at::Tensor& triu_out(const at::Tensor& self, int64_t diag, at::Tensor& out) {
  return tri_out(TPU_OP_TRIU, self, diag, out);
}

// isposinf / isneginf: x == +-inf (always false for integer dtypes).
static at::Tensor& isinf_sign_out(const at::Tensor& self, double inf, at::Tensor& out) {
  at::native::resize_output(out, self.sizes());
  if (!isFloatingType(self.scalar_type())) return out.fill_(false);
  tpu_params p{};
  ew(TPU_OP_EQ, out, {self, wrap(inf)}, self.scalar_type(), p);
  return out;
}
static at::Tensor& isposinf_out(const at::Tensor& self, at::Tensor& out) {
  return isinf_sign_out(self, std::numeric_limits<double>::infinity(), out);
}
static at::Tensor& isneginf_out(const at::Tensor& self, at::Tensor& out) {
  return isinf_sign_out(self, -std::numeric_limits<double>::infinity(), out);
}

static at::Tensor& hardtanh_out(const at::Tensor& self, const c10::Scalar& mn, const c10::Scalar& mx, at::Tensor& out) {
  TORCH_CHECK(self.scalar_type() != kBool, "Bool inputs not supported for hardtanh");
  TORCH_CHECK(self.scalar_type() != kByte || (mn.toLong() >= 0 && mx.toLong() >= 0),
              "cannot do hardtanh on an unsigned type with negative limits");
  return ew_out(TPU_OP_CLAMP, out, {self}, self.scalar_type(),
                TPU_PARAMS(CLAMP, .min = mn.toDouble(), .max = mx.toDouble()));
}
static at::Tensor hardtanh(const at::Tensor& self, const c10::Scalar& mn, const c10::Scalar& mx) {
  auto out = at::empty({0}, self.options());
  return hardtanh_out(self, mn, mx, out);
}
static at::Tensor& hardtanh_(at::Tensor& self, const c10::Scalar& mn, const c10::Scalar& mx) {
  return hardtanh_out(self, mn, mx, self);
}

static at::Tensor relu(const at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != kBool, "Boolean inputs not supported for relu");
  auto out = at::empty_like(self);
  ew(TPU_OP_RELU, out, {self}, self.scalar_type());
  return out;
}
static at::Tensor& relu_(at::Tensor& self) {
  TORCH_CHECK(self.scalar_type() != kBool, "Boolean inputs not supported for relu");
  ew(TPU_OP_RELU, self, {self}, self.scalar_type());
  return self;
}

static at::Tensor& leaky_relu_out(const at::Tensor& self, const c10::Scalar& slope, at::Tensor& out) {
  return ew_out(TPU_OP_LEAKY_RELU, out, {self}, self.scalar_type(),
                TPU_PARAMS(LEAKY_RELU, .negative_slope = slope.toDouble()));
}

static at::Tensor& softplus_out(const at::Tensor& self, const c10::Scalar& beta, const c10::Scalar& th,
                                at::Tensor& out) {
  return ew_out(TPU_OP_SOFTPLUS, out, {self}, self.scalar_type(),
                TPU_PARAMS(SOFTPLUS, .beta = beta.toDouble(), .threshold = th.toDouble()));
}

static at::Tensor& elu_out(const at::Tensor& self, const c10::Scalar& alpha, const c10::Scalar& scale,
                           const c10::Scalar& iscale, at::Tensor& out) {
  return ew_out(
      TPU_OP_ELU, out, {self}, self.scalar_type(),
      TPU_PARAMS(ELU, .alpha = alpha.toDouble(), .scale = scale.toDouble(), .input_scale = iscale.toDouble()));
}

static at::Tensor& elu_backward_out(const at::Tensor& g, const c10::Scalar& alpha, const c10::Scalar& scale,
                                    const c10::Scalar& iscale, bool is_result, const at::Tensor& x, at::Tensor& out) {
  TORCH_CHECK(!is_result || alpha.toDouble() >= 0.0,
              "In-place elu backward calculation is triggered with a negative slope ",
              "which is not supported. This is caused by calling in-place forward function with a negative slope, ",
              "please call out-of-place version instead.");
  return ew_out(TPU_OP_ELU_BWD, out, {g, x}, std::nullopt,
                TPU_PARAMS(ELU_BWD, .alpha = alpha.toDouble(), .scale = scale.toDouble(),
                           .input_scale = iscale.toDouble(), .is_result = is_result ? 1.0 : 0.0));
}
static at::Tensor& round_decimals_out(const at::Tensor& self, int64_t decimals, at::Tensor& out) {
  if (decimals == 0 || isIntegralType(self.scalar_type(), true)) return round_out(self, out);
  return ew_out(TPU_OP_ROUND_DECIMALS, out, {self}, self.scalar_type(),
                TPU_PARAMS(ROUND_DECIMALS, .decimals = (double)decimals));
}

static at::Tensor& nan_to_num_out(const at::Tensor& self, std::optional<double> nan, std::optional<double> pinf,
                                  std::optional<double> ninf, at::Tensor& out) {
  double big = self.scalar_type() == kDouble     ? std::numeric_limits<double>::max()
               : self.scalar_type() == kHalf     ? 65504.0
               : self.scalar_type() == kBFloat16 ? 3.3895313892515355e38
                                                 : double(std::numeric_limits<float>::max());
  return ew_out(
      TPU_OP_NAN_TO_NUM, out, {self}, self.scalar_type(),
      TPU_PARAMS(NAN_TO_NUM, .nan = nan.value_or(0.0), .posinf = pinf.value_or(big), .neginf = ninf.value_or(-big)));
}

// A clamp bound in the compute dtype, converted as CPU converts it (Scalar::to:
// a negative bound wraps for uint8, an out-of-range one raises).
static double clamp_bound(const c10::Scalar& s, c10::ScalarType c) {
  switch (c) {
    case kByte:
      return s.to<uint8_t>();
    case kChar:
      return s.to<int8_t>();
    case kShort:
      return s.to<int16_t>();
    case kInt:
      return s.to<int32_t>();
    case kLong:
      return static_cast<double>(s.to<int64_t>());
    case kBool:
      return s.to<bool>();
    default:
      return s.toDouble();
  }
}

static at::Tensor& clamp_out(const at::Tensor& self, const std::optional<c10::Scalar>& mn,
                             const std::optional<c10::Scalar>& mx, at::Tensor& out) {
  c10::ScalarType c = self.scalar_type();
  if (mn)
    c = at::native::result_type(
        at::native::update_result_type_state(*mn, at::native::update_result_type_state(self, {})));
  if (mx)
    c = promoteTypes(c, at::native::result_type(
                            at::native::update_result_type_state(*mx, at::native::update_result_type_state(self, {}))));
  const double inf = std::numeric_limits<double>::infinity();  // a missing bound
  return ew_out(TPU_OP_CLAMP, out, {self}, c,
                TPU_PARAMS(CLAMP, .min = mn ? clamp_bound(*mn, c) : -inf, .max = mx ? clamp_bound(*mx, c) : inf));
}
static at::Tensor& clamp_min_out(const at::Tensor& self, const c10::Scalar& mn, at::Tensor& out) {
  return clamp_out(self, mn, std::nullopt, out);
}
static at::Tensor& clamp_max_out(const at::Tensor& self, const c10::Scalar& mx, at::Tensor& out) {
  return clamp_out(self, std::nullopt, mx, out);
}
static at::Tensor& clamp_t_out(const at::Tensor& self, const std::optional<at::Tensor>& mn,
                               const std::optional<at::Tensor>& mx, at::Tensor& out) {
  TORCH_CHECK(mn.has_value() || mx.has_value(), "torch.clamp: At least one of 'min' or 'max' must not be None");
  if (mn && mx) return ew_out(TPU_OP_CLAMP_T, out, {self, *mn, *mx});
  if (mn) return ew_out(TPU_OP_MAXIMUM, out, {self, *mn});
  return ew_out(TPU_OP_MINIMUM, out, {self, *mx});
}
static at::Tensor& clamp_min_t_out(const at::Tensor& self, const at::Tensor& mn, at::Tensor& out) {
  return ew_out(TPU_OP_MAXIMUM, out, {self, mn});
}
static at::Tensor& clamp_max_t_out(const at::Tensor& self, const at::Tensor& mx, at::Tensor& out) {
  return ew_out(TPU_OP_MINIMUM, out, {self, mx});
}

// ---------------------------------------------------------------- binary
static bool any_complex(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  return a.is_complex() || b.is_complex() || (out.defined() && out.is_complex());
}
static at::Tensor& add_out(const at::Tensor& a, const at::Tensor& b, const c10::Scalar& alpha, at::Tensor& out) {
  at::native::alpha_check(common_type({a, b}), alpha);
  if (C10_UNLIKELY(any_complex(a, b, out))) return complex_binary_out(TPU_OP_ADD, a, b, alpha, out);
  return ew_out(TPU_OP_ADD, out, {a, b}, std::nullopt, TPU_PARAMS(ADD, .alpha = alpha.toDouble()));
}
static at::Tensor& sub_out(const at::Tensor& a, const at::Tensor& b, const c10::Scalar& alpha, at::Tensor& out) {
  at::native::sub_check(a, b);
  at::native::alpha_check(common_type({a, b}), alpha);
  if (C10_UNLIKELY(any_complex(a, b, out))) return complex_binary_out(TPU_OP_SUB, a, b, alpha, out);
  return ew_out(TPU_OP_SUB, out, {a, b}, std::nullopt, TPU_PARAMS(SUB, .alpha = alpha.toDouble()));
}

// The functional forms of the four arithmetic ops, the ones every model runs
// most. PyTorch's structured wrapper would build a TensorIterator for the
// op's meta function (shape, dtype), allocate, then dispatch again to the
// `.out` kernel, which computes the same again: ~0.7 us a call, more than the
// rest of a small op. Here the output takes the broadcast shape
// (at::infer_size: PyTorch's message for mismatched sizes), the inputs'
// common dtype (div: its floating type), TensorIterator's strides
// (ti_strides) and the operands' device; the checks are the meta
// functions' (alpha_check, sub_check).
static at::Tensor binary_new(tpu_op op, const at::Tensor& a, const at::Tensor& b, c10::ScalarType compute,
                             tpu_params p) {
  if (C10_UNLIKELY(isComplexType(compute))) {
    at::Tensor out = at::empty({0}, (a.device().is_cpu() ? b : a).options().dtype(compute));
    return complex_binary_out(op, a, b, 1, out);  // (mul, div: add and sub pass their alpha below)
  }
  const at::Tensor& on = a.device().is_cpu() ? b : a;  // (a zero-dim CPU operand: a host scalar)
  auto shape = at::infer_size_dimvector(a.sizes(), b.sizes());
  at::Tensor out = at::empty_strided(shape, ti_strides(shape, {a, b}), on.options().dtype(compute));
  ew(op, out, {a, b}, compute, p);
  return out;
}
static at::Tensor tpu_add(const at::Tensor& a, const at::Tensor& b, const c10::Scalar& alpha) {
  c10::ScalarType c = common_type({a, b});
  at::native::alpha_check(c, alpha);
  if (C10_UNLIKELY(isComplexType(c))) {
    at::Tensor out = at::empty({0}, (a.device().is_cpu() ? b : a).options().dtype(c));
    return complex_binary_out(TPU_OP_ADD, a, b, alpha, out);
  }
  return binary_new(TPU_OP_ADD, a, b, c, TPU_PARAMS(ADD, .alpha = alpha.toDouble()));
}
static at::Tensor tpu_sub(const at::Tensor& a, const at::Tensor& b, const c10::Scalar& alpha) {
  at::native::sub_check(a, b);
  c10::ScalarType c = common_type({a, b});
  at::native::alpha_check(c, alpha);
  if (C10_UNLIKELY(isComplexType(c))) {
    at::Tensor out = at::empty({0}, (a.device().is_cpu() ? b : a).options().dtype(c));
    return complex_binary_out(TPU_OP_SUB, a, b, alpha, out);
  }
  return binary_new(TPU_OP_SUB, a, b, c, TPU_PARAMS(SUB, .alpha = alpha.toDouble()));
}
static at::Tensor tpu_mul(const at::Tensor& a, const at::Tensor& b) {
  return binary_new(TPU_OP_MUL, a, b, common_type({a, b}), {});
}
static at::Tensor tpu_div(const at::Tensor& a, const at::Tensor& b) {
  return binary_new(TPU_OP_DIV, a, b, float_of(common_type({a, b})), {});
}
// rsub: other - alpha * self (PyTorch's composite kernel for it is CPU/CUDA only)
static at::Tensor rsub(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  at::Tensor out = at::empty({0}, self.options().dtype(common_type({self, other})));
  return sub_out(other, self, alpha, out);
}
static at::Tensor& div_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  if (C10_UNLIKELY(any_complex(a, b, out))) return complex_binary_out(TPU_OP_DIV, a, b, 1, out);
  return ew_out(TPU_OP_DIV, out, {a, b}, float_of(common_type({a, b})));
}
static at::Tensor& div_mode_out(const at::Tensor& a, const at::Tensor& b, std::optional<c10::string_view> mode,
                                at::Tensor& out) {
  if (!mode) return div_out(a, b, out);
  TORCH_CHECK(*mode == "trunc" || *mode == "floor",
              "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '", *mode, "'");
  return ew_out(*mode == "trunc" ? TPU_OP_DIV_TRUNC : TPU_OP_DIV_FLOOR, out, {a, b});
}
// floor_divide is div(rounding_mode="floor") (PyTorch runs the same kernel).
static at::Tensor& tpu_floor_divide_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return ew_out(TPU_OP_DIV_FLOOR, out, {a, b});
}
static at::Tensor tpu_floor_divide(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor out = at::empty({0}, a.options().dtype(common_type({a, b})));
  return tpu_floor_divide_out(a, b, out);
}
static at::Tensor& tpu_floor_divide_(at::Tensor& a, const at::Tensor& b) { return tpu_floor_divide_out(a, b, a); }
static at::Tensor& pow_tt_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return ew_out(TPU_OP_POW, out, {a, b});
}
// x ** 0.5 and x ** -0.5 are sqrt and rsqrt, as on CPU (they differ from
// pow() at -0 and -inf) except for float16, which CPU runs through pow();
// other scalar exponents the kernel strength-reduces.
static at::Tensor& pow_ts_out(const at::Tensor& a, const c10::Scalar& b, at::Tensor& out) {
  c10::ScalarType c =
      at::native::result_type(at::native::update_result_type_state(b, at::native::update_result_type_state(a, {})));
  if (b.isFloatingPoint() && (b.toDouble() == 0.5 || b.toDouble() == -0.5) && c != kHalf)
    return ew_out(b.toDouble() == 0.5 ? TPU_OP_SQRT : TPU_OP_RSQRT, out, {a}, c);
  return ew_out(TPU_OP_POW, out, {a, wrap(b)});
}
static at::Tensor& pow_st_out(const c10::Scalar& a, const at::Tensor& b, at::Tensor& out) {
  return ew_out(TPU_OP_POW, out, {wrap(a), b});
}

// The plain binary ops, one row each: (ATen name, runtime op, overload of the
// `.out` row). BINARY ops compute in the inputs' common dtype and check the
// cast to out; COMPARE ops (Tensor and Scalar forms) and LOGICAL ops write any
// out dtype (bool usually).
// clang-format off
#define TPU_BINARY_OPS(X)                                                                                   \
  X(mul, MUL, out) X(maximum, MAXIMUM, out) X(minimum, MINIMUM, out) X(fmod, FMOD, Tensor_out)              \
  X(remainder, REMAINDER, Tensor_out) X(bitwise_and, BITWISE_AND, Tensor_out)                               \
  X(bitwise_or, BITWISE_OR, Tensor_out) X(bitwise_xor, BITWISE_XOR, Tensor_out) X(gcd, GCD, out)           \
  X(lcm, LCM, out) X(fmax, FMAX, out) X(fmin, FMIN, out) X(igamma, IGAMMA, out) X(igammac, IGAMMAC, out)
// clang-format on
#define TPU_COMPARE_OPS(X) X(eq, EQ) X(ne, NE) X(lt, LT) X(le, LE) X(gt, GT) X(ge, GE)
#define TPU_LOGICAL_OPS(X) X(logical_and, LOGICAL_AND) X(logical_or, LOGICAL_OR) X(logical_xor, LOGICAL_XOR)

#define BINARY(fn, OP, overload)                                                           \
  static at::Tensor& fn##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) { \
    if (TPU_OP_##OP == TPU_OP_MUL && C10_UNLIKELY(any_complex(a, b, out)))                 \
      return complex_binary_out(TPU_OP_MUL, a, b, 1, out);                                 \
    return ew_out(TPU_OP_##OP, out, {a, b});                                               \
  }
#define LOGICAL(fn, OP)                                                                    \
  static at::Tensor& fn##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) { \
    return ew_out(TPU_OP_##OP, out, {a, b}, std::nullopt, {}, false);                      \
  }
#define COMPARE(fn, OP)                                                                       \
  LOGICAL(fn, OP)                                                                             \
  static at::Tensor& fn##_s_out(const at::Tensor& a, const c10::Scalar& b, at::Tensor& out) { \
    return ew_out(TPU_OP_##OP, out, {a, wrap(b)}, std::nullopt, {}, false);                   \
  }
TPU_BINARY_OPS(BINARY)
TPU_COMPARE_OPS(COMPARE)
TPU_LOGICAL_OPS(LOGICAL)
#undef BINARY
#undef LOGICAL
#undef COMPARE

// Binary ops computing in floating point (integers promote to the default dtype).
#define TPU_BINARY_FLOAT_OPS(X) \
  X(atan2, ATAN2)               \
  X(hypot, HYPOT) X(copysign, COPYSIGN) X(logaddexp, LOGADDEXP) X(xlogy, XLOGY) X(logaddexp2, LOGADDEXP2)
// The special functions of two arguments (x, n for the polynomials), each registered as "<name>.out".
// clang-format off
#define TPU_SPECIAL_BINARY_OPS(X)                                                                         \
  X(special_zeta, ZETA) X(special_chebyshev_polynomial_t, CHEBYSHEV_T)                                    \
  X(special_chebyshev_polynomial_u, CHEBYSHEV_U) X(special_chebyshev_polynomial_v, CHEBYSHEV_V)           \
  X(special_chebyshev_polynomial_w, CHEBYSHEV_W) X(special_shifted_chebyshev_polynomial_t, SCHEBYSHEV_T)  \
  X(special_shifted_chebyshev_polynomial_u, SCHEBYSHEV_U)                                                 \
  X(special_shifted_chebyshev_polynomial_v, SCHEBYSHEV_V)                                                 \
  X(special_shifted_chebyshev_polynomial_w, SCHEBYSHEV_W) X(special_hermite_polynomial_h, HERMITE_H)      \
  X(special_hermite_polynomial_he, HERMITE_HE) X(special_laguerre_polynomial_l, LAGUERRE_L)               \
  X(special_legendre_polynomial_p, LEGENDRE_P)
// clang-format on
#define BINARY_FLOAT(fn, OP)                                                               \
  static at::Tensor& fn##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) { \
    return ew_out(TPU_OP_##OP, out, {a, b}, float_of(common_type({a, b})));                \
  }
TPU_BINARY_FLOAT_OPS(BINARY_FLOAT)
TPU_SPECIAL_BINARY_OPS(BINARY_FLOAT)
#undef BINARY_FLOAT

static at::Tensor& hardshrink_out(const at::Tensor& self, const c10::Scalar& l, at::Tensor& out) {
  return ew_out(TPU_OP_HARDSHRINK, out, {self}, self.scalar_type(), TPU_PARAMS(HARDSHRINK, .lambd = l.toDouble()));
}
static at::Tensor& softshrink_out(const at::Tensor& self, const c10::Scalar& l, at::Tensor& out) {
  return ew_out(TPU_OP_SOFTSHRINK, out, {self}, self.scalar_type(), TPU_PARAMS(SOFTSHRINK, .lambd = l.toDouble()));
}
static at::Tensor& shrink_backward_out(const at::Tensor& g, const at::Tensor& x, const c10::Scalar& l,
                                       at::Tensor& out) {
  return ew_out(TPU_OP_SHRINK_BWD, out, {g, x}, std::nullopt, TPU_PARAMS(SHRINK_BWD, .lambd = l.toDouble()));
}

// Activation backward: (grad, x-or-y) -> grad_input
static at::Tensor& threshold_backward_out(const at::Tensor& g, const at::Tensor& x, const c10::Scalar& th,
                                          at::Tensor& out) {
  return ew_out(TPU_OP_THRESHOLD_BWD, out, {g, x}, std::nullopt, TPU_PARAMS(THRESHOLD_BWD, .threshold = th.toDouble()));
}
static at::Tensor& gelu_backward_out(const at::Tensor& g, const at::Tensor& x, c10::string_view approx,
                                     at::Tensor& out) {
  return ew_out(approx == "tanh" ? TPU_OP_GELU_TANH_BWD : TPU_OP_GELU_BWD, out, {g, x});
}
static at::Tensor& silu_backward_out(const at::Tensor& g, const at::Tensor& x, at::Tensor& out) {
  return ew_out(TPU_OP_SILU_BWD, out, {g, x});
}
// log_sigmoid: CPU's `buffer` (its saved intermediate) is not needed here;
// it is returned empty, as CUDA does.
static std::tuple<at::Tensor&, at::Tensor&> log_sigmoid_forward_out(const at::Tensor& self, at::Tensor& out,
                                                                    at::Tensor& buffer) {
  ew_out(TPU_OP_LOG_SIGMOID, out, {self}, self.scalar_type());
  return {out, buffer};
}
static std::tuple<at::Tensor, at::Tensor> log_sigmoid_forward(const at::Tensor& self) {
  at::Tensor out = at::empty({0}, self.options()), buffer = at::empty({0}, self.options());
  log_sigmoid_forward_out(self, out, buffer);
  return {out, buffer};
}
static at::Tensor& log_sigmoid_backward_out(const at::Tensor& g, const at::Tensor& x, const at::Tensor&,
                                            at::Tensor& out) {
  return ew_out(TPU_OP_LOG_SIGMOID_BWD, out, {g, x});
}
static at::Tensor log_sigmoid_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& buffer) {
  at::Tensor out = at::empty({0}, g.options());
  return log_sigmoid_backward_out(g, x, buffer, out);
}
static at::Tensor& sigmoid_backward_out(const at::Tensor& g, const at::Tensor& y, at::Tensor& out) {
  return ew_out(TPU_OP_SIGMOID_BWD, out, {g, y});
}
static at::Tensor& tanh_backward_out(const at::Tensor& g, const at::Tensor& y, at::Tensor& out) {
  return ew_out(TPU_OP_TANH_BWD, out, {g, y});
}
static at::Tensor& leaky_relu_backward_out(const at::Tensor& g, const at::Tensor& x, const c10::Scalar& slope,
                                           bool self_is_result, at::Tensor& out) {
  return ew_out(TPU_OP_LEAKY_RELU_BWD, out, {g, x}, std::nullopt,
                TPU_PARAMS(LEAKY_RELU_BWD, .negative_slope = slope.toDouble()));
}
static at::Tensor& softplus_backward_out(const at::Tensor& g, const at::Tensor& x, const c10::Scalar& beta,
                                         const c10::Scalar& th, at::Tensor& out) {
  return ew_out(TPU_OP_SOFTPLUS_BWD, out, {g, x}, std::nullopt,
                TPU_PARAMS(SOFTPLUS_BWD, .beta = beta.toDouble(), .threshold = th.toDouble()));
}
static at::Tensor& hardtanh_backward_out(const at::Tensor& g, const at::Tensor& x, const c10::Scalar& mn,
                                         const c10::Scalar& mx, at::Tensor& out) {
  return ew_out(TPU_OP_HARDTANH_BWD, out, {g, x}, std::nullopt,
                TPU_PARAMS(HARDTANH_BWD, .min_val = mn.toDouble(), .max_val = mx.toDouble()));
}
static at::Tensor hardtanh_backward(const at::Tensor& g, const at::Tensor& x, const c10::Scalar& mn,
                                    const c10::Scalar& mx) {
  auto out = at::empty({0}, g.options());
  return hardtanh_backward_out(g, x, mn, mx, out);
}

// ---------------------------------------------------------------- ternary
static at::Tensor& addcmul_out(const at::Tensor& s, const at::Tensor& t1, const at::Tensor& t2, const c10::Scalar& v,
                               at::Tensor& out) {
  return ew_out(TPU_OP_ADDCMUL, out, {s, t1, t2}, std::nullopt, TPU_PARAMS(ADDCMUL, .value = v.toDouble()));
}
static at::Tensor& addcdiv_out(const at::Tensor& s, const at::Tensor& t1, const at::Tensor& t2, const c10::Scalar& v,
                               at::Tensor& out) {
  return ew_out(TPU_OP_ADDCDIV, out, {s, t1, t2}, std::nullopt, TPU_PARAMS(ADDCDIV, .value = v.toDouble()));
}
static at::Tensor& lerp_s_out(const at::Tensor& s, const at::Tensor& e, const c10::Scalar& w, at::Tensor& out) {
  auto wt = wrap(w);
  return ew_out(TPU_OP_LERP, out, {s, e, wt}, common_type({s, e}));
}
static at::Tensor& lerp_t_out(const at::Tensor& s, const at::Tensor& e, const at::Tensor& w, at::Tensor& out) {
  return ew_out(TPU_OP_LERP, out, {s, e, w}, common_type({s, e}));
}
static at::Tensor& where_out(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  TORCH_CHECK(c.scalar_type() == kBool || c.scalar_type() == kByte,
              "where expected condition to be a boolean tensor, but got a tensor with dtype ", c.scalar_type());
  return ew_out(TPU_OP_WHERE, out, {c, a, b}, common_type({a, b}));
}
static at::Tensor where(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  auto out = at::empty({0}, (a.device().is_cpu() ? b : a).options().dtype(common_type({a, b})));
  return where_out(c, a, b, out);
}
static at::Tensor& masked_fill_s(at::Tensor& self, const at::Tensor& mask, const c10::Scalar& v) {
  TORCH_CHECK(mask.scalar_type() == kBool, "masked_fill_ only supports boolean masks, but got mask with dtype ",
              mask.scalar_type());
  ew(TPU_OP_WHERE, self, {mask, wrap(v), self}, self.scalar_type());
  return self;
}
static at::Tensor& masked_fill_t(at::Tensor& self, const at::Tensor& mask, const at::Tensor& v) {
  TORCH_CHECK(v.dim() == 0, "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with ", v.dim(),
              " dimension(s).");
  TORCH_CHECK(mask.scalar_type() == kBool, "masked_fill_ only supports boolean masks, but got mask with dtype ",
              mask.scalar_type());
  ew(TPU_OP_WHERE, self, {mask, v, self}, self.scalar_type());
  return self;
}

// ---------------------------------------------------------------- reductions
// Output descriptor in "keepdim" form: reduced dims have size 1 (stride 0).
static tpu_tensor red_out_desc(const at::Tensor& self, const at::Tensor& out, std::bitset<64> mask, bool keepdim) {
  tpu_tensor d = desc(out);
  int64_t nd = std::max<int64_t>(self.dim(), 1);
  if (self.dim() == 0) {
    d.ndim = 1;
    d.sizes[0] = 1;
    d.strides[0] = 0;
    return d;
  }
  if (keepdim) {
    for (int64_t i = 0; i < nd; i++)
      if (mask[i]) d.strides[i] = 0;
    return d;
  }
  int64_t j = 0;
  for (int64_t i = 0; i < nd; i++) {
    if (mask[i]) {
      d.sizes[i] = 1;
      d.strides[i] = 0;
    } else {
      d.sizes[i] = out.size(j);
      d.strides[i] = out.stride(j);
      j++;
    }
  }
  d.ndim = static_cast<int32_t>(nd);
  return d;
}

static std::bitset<64> red_mask(const at::Tensor& self, at::OptionalIntArrayRef dims) {
  int64_t nd = std::max<int64_t>(self.dim(), 1);
  if (!dims || dims->empty()) {
    std::bitset<64> m;
    for (int64_t i = 0; i < nd; i++) m.set(i);
    return m;
  }
  return at::dim_list_to_bitset(*dims, nd);
}

static std::vector<int64_t> red_shape(const at::Tensor& self, std::bitset<64> mask, bool keepdim) {
  std::vector<int64_t> s;
  for (int64_t i = 0; i < self.dim(); i++) {
    if (mask[i]) {
      if (keepdim) s.push_back(1);
    } else
      s.push_back(self.size(i));
  }
  return s;
}

static at::Tensor& reduce(tpu_op op, const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                          at::Tensor& out, tpu_params p = {}) {
  auto mask = red_mask(self, dims);
  at::native::resize_output(out, red_shape(self, mask, keepdim));
  if (out.numel() == 0) return out;
  tpu_tensor ts[2] = {red_out_desc(self, out, mask, keepdim), desc1d(self)};
  p.compute_dtype = to_tpu_dtype(out.scalar_type());
  submit(op, ts, 2, p);
  return out;
}

// A complex sum or mean is the real one over the real views: the parts'
// dim (the last, size 2) is not reduced.
static at::Tensor& complex_reduce(tpu_op op, const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                                  at::Tensor& out) {
  check_cast(self.scalar_type(), out);
  if (!self.is_complex()) return complex_reduce(op, self.to(out.scalar_type()), dims, keepdim, out);  // (dtype=)
  auto mask = red_mask(self, dims);
  at::native::resize_output(out, red_shape(self, mask, keepdim));
  if (out.numel() == 0) return out;
  tpu_tensor ts[2] = {real_view(red_out_desc(self, out, mask, keepdim)), real_view(desc1d(self))};
  tpu_params p{};
  p.compute_dtype = ts[0].dtype;
  submit(op, ts, 2, p);
  return out;
}
static at::Tensor& sum_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                           std::optional<c10::ScalarType>, at::Tensor& out) {
  if (C10_UNLIKELY(self.is_complex() || out.is_complex())) return complex_reduce(TPU_OP_SUM, self, dims, keepdim, out);
  return reduce(TPU_OP_SUM, self, dims, keepdim, out);
}
static at::Tensor& mean_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                            std::optional<c10::ScalarType>, at::Tensor& out) {
  if (C10_UNLIKELY(self.is_complex() || out.is_complex())) return complex_reduce(TPU_OP_MEAN, self, dims, keepdim, out);
  return reduce(TPU_OP_MEAN, self, dims, keepdim, out);
}
static at::Tensor& prod_out(const at::Tensor& self, int64_t dim, bool keepdim, std::optional<c10::ScalarType>,
                            at::Tensor& out) {
  int64_t d = at::maybe_wrap_dim(dim, self.dim());
  return reduce(TPU_OP_PROD, self, at::IntArrayRef(d), keepdim, out);
}
static at::Tensor prod(const at::Tensor& self, std::optional<c10::ScalarType> dtype) {
  auto st = dtype.value_or(isIntegralType(self.scalar_type(), true) ? kLong : self.scalar_type());
  auto out = at::empty({}, self.options().dtype(st));
  return reduce(TPU_OP_PROD, self, std::nullopt, false, out);
}
static void check_same_dtype_out(const at::Tensor& self, const at::Tensor& out) {
  TORCH_CHECK(self.scalar_type() == out.scalar_type(), "Expected the dtype for input and out to match, but got ",
              self.scalar_type(), " for input's dtype and ", out.scalar_type(), " for out's dtype.");
}
static at::Tensor& amax_out(const at::Tensor& self, c10::IntArrayRef dims, bool keepdim, at::Tensor& out) {
  check_same_dtype_out(self, out);
  return reduce(TPU_OP_AMAX, self, dims, keepdim, out);
}
static at::Tensor& amin_out(const at::Tensor& self, c10::IntArrayRef dims, bool keepdim, at::Tensor& out) {
  check_same_dtype_out(self, out);
  return reduce(TPU_OP_AMIN, self, dims, keepdim, out);
}
static at::Tensor full_minmax(tpu_op op, const at::Tensor& self, const char* name) {
  TORCH_CHECK(self.numel() > 0, name,
              "(): Expected reduction dim to be specified for input.numel() == 0. "
              "Specify the reduction dim with the 'dim' argument.");
  auto out = at::empty({}, self.options());
  return reduce(op, self, std::nullopt, false, out);
}
static at::Tensor max_all(const at::Tensor& self) { return full_minmax(TPU_OP_AMAX, self, "max"); }
static at::Tensor min_all(const at::Tensor& self) { return full_minmax(TPU_OP_AMIN, self, "min"); }

static at::Tensor& arg_out(tpu_op op, const at::Tensor& self, std::optional<int64_t> dim, bool keepdim,
                           at::Tensor& out) {
  if (!dim) {
    at::Tensor flat = self.reshape({-1});
    at::native::resize_output(out, keepdim ? std::vector<int64_t>(self.dim(), 1) : std::vector<int64_t>{});
    tpu_tensor o = desc(out);
    o.ndim = 1;
    o.sizes[0] = 1;
    o.strides[0] = 0;
    tpu_tensor ts[2] = {o, desc1d(flat)};
    submit(op, ts, 2, TPU_PARAMS(ARGMAX, .dim = 0));  // ARGMIN packs the same
    return out;
  }
  int64_t d = at::maybe_wrap_dim(*dim, std::max<int64_t>(self.dim(), 1));
  return reduce(op, self, at::IntArrayRef(d), keepdim, out, TPU_PARAMS(ARGMAX, .dim = d));
}
static at::Tensor& argmax_out(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim, at::Tensor& out) {
  return arg_out(TPU_OP_ARGMAX, self, dim, keepdim, out);
}
static at::Tensor& argmin_out(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim, at::Tensor& out) {
  return arg_out(TPU_OP_ARGMIN, self, dim, keepdim, out);
}
static std::tuple<at::Tensor&, at::Tensor&> max_dim_out(const at::Tensor& self, int64_t dim, bool keepdim,
                                                        at::Tensor& values, at::Tensor& indices) {
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  reduce(TPU_OP_AMAX, self, at::IntArrayRef(d), keepdim, values);
  arg_out(TPU_OP_ARGMAX, self, d, keepdim, indices);
  return {values, indices};
}
static std::tuple<at::Tensor&, at::Tensor&> min_dim_out(const at::Tensor& self, int64_t dim, bool keepdim,
                                                        at::Tensor& values, at::Tensor& indices) {
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  reduce(TPU_OP_AMIN, self, at::IntArrayRef(d), keepdim, values);
  arg_out(TPU_OP_ARGMIN, self, d, keepdim, indices);
  return {values, indices};
}
static at::Tensor var_std(tpu_op op, const at::Tensor& self, at::OptionalIntArrayRef dims,
                          const std::optional<c10::Scalar>& correction, bool keepdim) {
  TORCH_CHECK(isFloatingType(self.scalar_type()), "std and var only support floating point and complex dtypes");
  auto out = at::empty({0}, self.options());
  return reduce(op, self, dims, keepdim, out,
                TPU_PARAMS(VAR, .correction = correction ? correction->toDouble() : 1.0));  // STD packs the same
}
static at::Tensor var_c(const at::Tensor& self, at::OptionalIntArrayRef dims, const std::optional<c10::Scalar>& c,
                        bool k) {
  return var_std(TPU_OP_VAR, self, dims, c, k);
}
static at::Tensor std_c(const at::Tensor& self, at::OptionalIntArrayRef dims, const std::optional<c10::Scalar>& c,
                        bool k) {
  return var_std(TPU_OP_STD, self, dims, c, k);
}
static at::Tensor& any_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  return reduce(TPU_OP_ANY, self, at::IntArrayRef(at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1))), keepdim,
                out);
}
static at::Tensor& any_dims_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, at::Tensor& out) {
  return reduce(TPU_OP_ANY, self, dims, keepdim, out);
}
static at::Tensor& any_all_out(const at::Tensor& self, at::Tensor& out) {
  return reduce(TPU_OP_ANY, self, std::nullopt, false, out);
}
static at::Tensor& all_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  return reduce(TPU_OP_ALL, self, at::IntArrayRef(at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1))), keepdim,
                out);
}
static at::Tensor& all_dims_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, at::Tensor& out) {
  return reduce(TPU_OP_ALL, self, dims, keepdim, out);
}
static at::Tensor& all_all_out(const at::Tensor& self, at::Tensor& out) {
  return reduce(TPU_OP_ALL, self, std::nullopt, false, out);
}
static at::Tensor& norm_out(const at::Tensor& self, const c10::Scalar& ord, at::OptionalIntArrayRef dims, bool keepdim,
                            std::optional<c10::ScalarType>, at::Tensor& out) {
  return reduce(TPU_OP_NORM, self, dims, keepdim, out, TPU_PARAMS(NORM, .p = ord.toDouble()));
}
static at::Tensor& scan_out(tpu_op op, const at::Tensor& self, int64_t dim, at::Tensor& out) {
  const int64_t d = at::maybe_wrap_dim(dim, self.dim());  // an empty tensor's dim is checked too, as on CPU
  at::native::resize_output(out, self.sizes());
  if (out.numel() == 0) return out;
  tpu_params p = TPU_PARAMS(CUMSUM, .dim = d);  // every scan packs the same
  p.compute_dtype = to_tpu_dtype(out.scalar_type());
  tpu_tensor ts[2] = {desc1d(out), desc1d(self)};
  submit(op, ts, 2, p);
  return out;
}
static at::Tensor& cumsum_out(const at::Tensor& self, int64_t dim, std::optional<c10::ScalarType>, at::Tensor& out) {
  return scan_out(TPU_OP_CUMSUM, self, dim, out);
}
static at::Tensor& cumprod_out(const at::Tensor& self, int64_t dim, std::optional<c10::ScalarType>, at::Tensor& out) {
  return scan_out(TPU_OP_CUMPROD, self, dim, out);
}
static at::Tensor& logcumsumexp_out(const at::Tensor& self, int64_t dim, at::Tensor& out) {
  return scan_out(TPU_OP_LOGCUMSUMEXP, self, dim, out);
}
static at::Tensor logcumsumexp(const at::Tensor& self, int64_t dim) {
  at::Tensor out = at::empty_like(self, at::MemoryFormat::Contiguous);
  return scan_out(TPU_OP_LOGCUMSUMEXP, self, dim, out);
}
// cummax / cummin: PyTorch's composite has checked the dtypes, resized both
// outputs and wrapped dim; the kernel wants the indices laid out as values.
static void cum_extreme(tpu_op op, const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  bool same = values.strides().equals(indices.strides());
  at::Tensor v = same ? values : at::empty(self.sizes(), values.options());
  at::Tensor i = same ? indices : at::empty(self.sizes(), indices.options());
  tpu_params p = TPU_PARAMS(CUMMAX, .dim = dim);  // CUMMIN packs the same
  p.compute_dtype = to_tpu_dtype(self.scalar_type());
  tpu_tensor ts[3] = {desc1d(v), desc1d(i), desc1d(self)};
  submit(op, ts, 3, p);
  if (!same) {
    values.copy_(v);
    indices.copy_(i);
  }
}
static void cummax_helper(const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  cum_extreme(TPU_OP_CUMMAX, self, values, indices, dim);
}
static void cummin_helper(const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t dim) {
  cum_extreme(TPU_OP_CUMMIN, self, values, indices, dim);
}

}  // namespace at::tpu

// The kernels above that hand complex arguments to complex_binary_out / complex_unary_out.
TPU_HANDLES_COMPLEX(add_out);
TPU_HANDLES_COMPLEX(sub_out);
TPU_HANDLES_COMPLEX(tpu_add);
TPU_HANDLES_COMPLEX(tpu_sub);
TPU_HANDLES_COMPLEX(tpu_mul);
TPU_HANDLES_COMPLEX(tpu_div);
TPU_HANDLES_COMPLEX(mul_out);
TPU_HANDLES_COMPLEX(div_out);
TPU_HANDLES_COMPLEX(neg_out);
TPU_HANDLES_COMPLEX(abs_out);
TPU_HANDLES_COMPLEX(reciprocal_out);
TPU_HANDLES_COMPLEX(sum_out);
TPU_HANDLES_COMPLEX(mean_out);

// This file's rows of the op table (ops_core.cpp and ops_nn.cpp register theirs).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace at::tpu;
  // unary: the tables, then the ops with parameters or their own rules
#define ROW(fn, OP) TPU_IMPL(m, #fn ".out", fn##_out);
  TPU_UNARY_FLOAT_OPS(ROW)
  TPU_UNARY_SAME_OPS(ROW)
  TPU_IMPL(m, "hardswish", tpu_hardswish);
  TPU_IMPL(m, "hardswish_", tpu_hardswish_);
#undef ROW
  TPU_IMPL(m, "logical_not.out", logical_not_out);
  TPU_IMPL(m, "polygamma.out", polygamma_out);
  TPU_IMPL(m, "signbit.out", signbit_out);
  TPU_IMPL(m, "gelu.out", gelu_out);
  TPU_IMPL(m, "relu", relu);
  TPU_IMPL(m, "relu_", relu_);
  TPU_IMPL(m, "leaky_relu.out", leaky_relu_out);
  TPU_IMPL(m, "softplus.out", softplus_out);
  TPU_IMPL(m, "elu.out", elu_out);
  TPU_IMPL(m, "elu_backward.grad_input", elu_backward_out);
  TPU_IMPL(m, "round.decimals_out", round_decimals_out);
  TPU_IMPL(m, "nan_to_num.out", nan_to_num_out);
  TPU_IMPL(m, "clamp.out", clamp_out);
  TPU_IMPL(m, "clamp_min.out", clamp_min_out);
  TPU_IMPL(m, "clamp_max.out", clamp_max_out);
  TPU_IMPL(m, "clamp.Tensor_out", clamp_t_out);
  TPU_IMPL(m, "clamp_min.Tensor_out", clamp_min_t_out);
  TPU_IMPL(m, "clamp_max.Tensor_out", clamp_max_t_out);
  TPU_IMPL(m, "isnan", isnan);
  TPU_IMPL(m, "isposinf.out", isposinf_out);
  TPU_IMPL(m, "isneginf.out", isneginf_out);
  TPU_IMPL(m, "tril.out", tril_out);
  TPU_IMPL(m, "triu.out", triu_out);
  TPU_IMPL(m, "hardtanh", hardtanh);
  TPU_IMPL(m, "hardtanh.out", hardtanh_out);
  TPU_IMPL(m, "hardtanh_", hardtanh_);
  // binary: the tables, then the rest
#define ROW(fn, OP, overload) TPU_IMPL(m, #fn "." #overload, fn##_out);
  TPU_BINARY_OPS(ROW)
#undef ROW
#define ROW(fn, OP)                         \
  TPU_IMPL(m, #fn ".Tensor_out", fn##_out); \
  TPU_IMPL(m, #fn ".Scalar_out", fn##_s_out);
  TPU_COMPARE_OPS(ROW)
#undef ROW
#define ROW(fn, OP) TPU_IMPL(m, #fn ".out", fn##_out);
  TPU_LOGICAL_OPS(ROW)
#undef ROW
  TPU_IMPL(m, "add.out", add_out);
  TPU_IMPL(m, "sub.out", sub_out);
  TPU_IMPL(m, "add.Tensor", tpu_add);
  TPU_IMPL(m, "sub.Tensor", tpu_sub);
  TPU_IMPL(m, "mul.Tensor", tpu_mul);
  TPU_IMPL(m, "div.Tensor", tpu_div);
  TPU_IMPL(m, "rsub.Tensor", rsub);
  TPU_IMPL(m, "div.out", div_out);
  TPU_IMPL(m, "div.out_mode", div_mode_out);
  TPU_IMPL(m, "floor_divide", tpu_floor_divide);
  TPU_IMPL(m, "floor_divide.out", tpu_floor_divide_out);
  TPU_IMPL(m, "floor_divide_.Tensor", tpu_floor_divide_);
  TPU_IMPL(m, "pow.Tensor_Tensor_out", pow_tt_out);
  TPU_IMPL(m, "pow.Tensor_Scalar_out", pow_ts_out);
  TPU_IMPL(m, "pow.Scalar_out", pow_st_out);
  TPU_IMPL(m, "atan2.out", atan2_out);
  TPU_IMPL(m, "hypot.out", hypot_out);
  TPU_IMPL(m, "copysign.out", copysign_out);
  TPU_IMPL(m, "logaddexp.out", logaddexp_out);
  TPU_IMPL(m, "logaddexp2.out", logaddexp2_out);
#define ROW(fn, OP) TPU_IMPL(m, #fn ".out", fn##_out);
  TPU_SPECIAL_BINARY_OPS(ROW)
#undef ROW
  TPU_IMPL(m, "xlogy.OutTensor", xlogy_out);
  TPU_IMPL(m, "hardshrink.out", hardshrink_out);
  TPU_IMPL(m, "softshrink.out", softshrink_out);
  TPU_IMPL(m, "hardshrink_backward.grad_input", shrink_backward_out);
  TPU_IMPL(m, "softshrink_backward.grad_input", shrink_backward_out);
  // activation backward
  TPU_IMPL(m, "threshold_backward.grad_input", threshold_backward_out);
  TPU_IMPL(m, "gelu_backward.grad_input", gelu_backward_out);
  TPU_IMPL(m, "silu_backward.grad_input", silu_backward_out);
  TPU_IMPL(m, "sigmoid_backward.grad_input", sigmoid_backward_out);
  TPU_IMPL(m, "log_sigmoid_forward", log_sigmoid_forward);
  TPU_IMPL(m, "log_sigmoid_forward.output", log_sigmoid_forward_out);
  TPU_IMPL(m, "log_sigmoid_backward", log_sigmoid_backward);
  TPU_IMPL(m, "log_sigmoid_backward.grad_input", log_sigmoid_backward_out);
  TPU_IMPL(m, "tanh_backward.grad_input", tanh_backward_out);
  TPU_IMPL(m, "leaky_relu_backward.grad_input", leaky_relu_backward_out);
  TPU_IMPL(m, "softplus_backward.grad_input", softplus_backward_out);
  TPU_IMPL(m, "hardtanh_backward.grad_input", hardtanh_backward_out);
  TPU_IMPL(m, "hardtanh_backward", hardtanh_backward);
  // ternary
  TPU_IMPL(m, "addcmul.out", addcmul_out);
  TPU_IMPL(m, "addcdiv.out", addcdiv_out);
  TPU_IMPL(m, "lerp.Scalar_out", lerp_s_out);
  TPU_IMPL(m, "lerp.Tensor_out", lerp_t_out);
  TPU_IMPL(m, "where.self", where);
  TPU_IMPL(m, "where.self_out", where_out);
  TPU_IMPL(m, "masked_fill_.Scalar", masked_fill_s);
  TPU_IMPL(m, "masked_fill_.Tensor", masked_fill_t);
  // reductions
  TPU_IMPL(m, "sum.IntList_out", sum_out);
  TPU_IMPL(m, "mean.out", mean_out);
  TPU_IMPL(m, "prod.int_out", prod_out);
  TPU_IMPL(m, "prod", prod);
  TPU_IMPL(m, "amax.out", amax_out);
  TPU_IMPL(m, "amin.out", amin_out);
  TPU_IMPL(m, "max", max_all);
  TPU_IMPL(m, "min", min_all);
  TPU_IMPL(m, "argmax.out", argmax_out);
  TPU_IMPL(m, "argmin.out", argmin_out);
  TPU_IMPL(m, "max.dim_max", max_dim_out);
  TPU_IMPL(m, "min.dim_min", min_dim_out);
  TPU_IMPL(m, "var.correction", var_c);
  TPU_IMPL(m, "std.correction", std_c);
  TPU_IMPL(m, "any.out", any_out);
  TPU_IMPL(m, "any.dims_out", any_dims_out);
  TPU_IMPL(m, "any.all_out", any_all_out);
  TPU_IMPL(m, "all.out", all_out);
  TPU_IMPL(m, "all.dims_out", all_dims_out);
  TPU_IMPL(m, "all.all_out", all_all_out);
  TPU_IMPL(m, "linalg_vector_norm.out", norm_out);
  TPU_IMPL(m, "cumsum.out", cumsum_out);
  TPU_IMPL(m, "cumprod.out", cumprod_out);
  TPU_IMPL(m, "_logcumsumexp", logcumsumexp);
  TPU_IMPL(m, "_logcumsumexp.out", logcumsumexp_out);
  TPU_IMPL(m, "_cummax_helper", cummax_helper);
  TPU_IMPL(m, "_cummin_helper", cummin_helper);
}
