// ops.cpp - ATen kernels for the tpu device (PrivateUse1) and the CPU fallback.
//
// Each kernel here only checks arguments, computes the output's shape and
// dtype, allocates, describes tensors to the runtime and hands the op to
// submit(). No math. For structured ops only the `.out` overload is
// registered: PyTorch's CompositeExplicitAutogradNonFunctional wrappers run
// the op's meta function (shape, dtype and error checks in PyTorch's own
// words) and call our `.out` kernel for the functional and in-place forms.
#include "tpu_glue.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/WrapDimUtilsMulti.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TypeProperties.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/result_type.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>

namespace at::tpu {

const at::Generator& default_generator(c10::DeviceIndex idx);
void device_allocator_record(const c10::DataPtr& p, c10::Stream s);
std::pair<uint64_t, uint64_t> philox_next(const std::optional<at::Generator>& gen, c10::DeviceIndex idx);
// Count a CPU fallback of `op` (warned once per op); raises NotImplementedError
// if the fallback is disabled (TORCH_TPU_CPU_FALLBACK=0).
void note_cpu_fallback(const std::string& op);

// ---------------------------------------------------------------- descriptors
bool dtype_supported(c10::ScalarType st) {
  switch (st) {
    case kFloat: case kDouble: case kHalf: case kBFloat16: case kByte: case kChar:
    case kShort: case kInt: case kLong: case kBool: return true;
    default: return false;
  }
}

tpu_dtype to_tpu_dtype(c10::ScalarType st) {
  switch (st) {
    case kFloat: return TPU_F32;
    case kDouble: return TPU_F64;
    case kHalf: return TPU_F16;
    case kBFloat16: return TPU_BF16;
    case kByte: return TPU_U8;
    case kChar: return TPU_I8;
    case kShort: return TPU_I16;
    case kInt: return TPU_I32;
    case kLong: return TPU_I64;
    case kBool: return TPU_BOOL;
    default: TORCH_CHECK_NOT_IMPLEMENTED(false, "tpu does not support dtype ", st, " yet");
  }
}

// The storage part of a descriptor: its start, current size, the offset.
static tpu_tensor storage_desc(const at::Tensor& t) {
  tpu_tensor d{};
  const auto& st = t.storage();
  d.base = st.mutable_data();
  d.nbytes = st.nbytes();
  d.offset = t.storage_offset();
  d.dtype = to_tpu_dtype(t.scalar_type());
  return d;
}

tpu_tensor desc(const at::Tensor& t) {
  TORCH_CHECK(t.dim() <= TPU_MAX_DIMS, "tpu supports tensors of at most ", TPU_MAX_DIMS, " dims, got ", t.dim());
  TORCH_CHECK(t.device().is_privateuseone(), "Expected all tensors to be on the same device, but found at least two "
              "devices, tpu and ", t.device(), "!");
  tpu_tensor d = storage_desc(t);
  d.ndim = static_cast<int32_t>(t.dim());
  for (int64_t i = 0; i < t.dim(); i++) {
    d.sizes[i] = t.size(i);
    d.strides[i] = t.stride(i);
  }
  return d;
}

tpu_tensor desc_scalar(const c10::Scalar& s, c10::ScalarType compute) {
  if (isFloatingType(compute)) return tpu_tensor_scalar_f(s.toDouble(), TPU_F64);
  if (s.isFloatingPoint()) return tpu_tensor_scalar_f(s.toDouble(), TPU_F64);
  if (s.isBoolean()) return tpu_tensor_scalar_i(s.toBool(), TPU_I64);
  return tpu_tensor_scalar_i(s.toLong(), TPU_I64);
}

// A 0-dim tensor seen as 1-d of size 1 (for kernels that take a dim).
static tpu_tensor desc1d(const at::Tensor& t) {
  tpu_tensor d = desc(t);
  if (d.ndim == 0) { d.ndim = 1; d.sizes[0] = 1; d.strides[0] = 1; }
  return d;
}

// An operand of an elementwise op: a CPU 0-dim tensor becomes a host scalar;
// a tpu tensor is broadcast (stride 0) to the output's shape.
static tpu_tensor operand(const at::Tensor& t, const at::Tensor& out, c10::ScalarType compute) {
  if (t.device().is_cpu()) {
    TORCH_CHECK(t.dim() == 0, "Expected all tensors to be on the same device, but found at least two devices, ",
                out.device(), " and cpu!");
    return desc_scalar(t.item(), compute);
  }
  TORCH_CHECK(t.device() == out.device(), "Expected all tensors to be on the same device, but found at least two devices, ",
              out.device(), " and ", t.device(), "!");
  if (t.sizes().equals(out.sizes())) return desc(t);
  return desc(t.expand(out.sizes()));
}

// ---------------------------------------------------------------- dispatch point
// The eager mode is the runtime's launch-blocking flag (TORCH_TPU_LAUNCH_BLOCKING
// sets it at start-up): one piece of state, no copy here.
EagerMode eager_mode() { return tpu_get_launch_blocking() ? EagerMode::Debug : EagerMode::Strict; }

void set_eager_mode(EagerMode m) { tpu_set_launch_blocking(m == EagerMode::Debug); }

void submit(tpu_op op, const tpu_tensor* operands, int n, const tpu_params& p) {
  // Debug Eager: the runtime runs the launch synchronously (launch blocking).
  tpu_status s = tpu_launch(nullptr, op, operands, n, &p);
  if (C10_UNLIKELY(s != TPU_OK)) throw_status(s, tpu_op_name(op));
}

static void launch(tpu_op op, std::initializer_list<tpu_tensor> ts, tpu_params p = {}) {
  submit(op, ts.begin(), static_cast<int>(ts.size()), p);
}

// ---------------------------------------------------------------- elementwise helpers
static c10::ScalarType default_float() { return c10::typeMetaToScalarType(c10::get_default_dtype()); }

static c10::ScalarType float_of(c10::ScalarType t) {
  return isIntegralType(t, /*includeBool=*/true) ? default_float() : t;
}

static void check_cast(c10::ScalarType from, const at::Tensor& out) {
  TORCH_CHECK(canCast(from, out.scalar_type()), "result type ", from, " can't be cast to the desired output type ",
              out.scalar_type());
}

static void ew(tpu_op op, const at::Tensor& out, std::initializer_list<at::Tensor> ins, c10::ScalarType compute,
               tpu_params p = {}) {
  if (out.numel() == 0) return;
  tpu_tensor ts[TPU_MAX_OPERANDS];
  int n = 0;
  ts[n++] = desc(out);
  for (const auto& t : ins) ts[n++] = operand(t, out, compute);
  p.compute_dtype = to_tpu_dtype(compute);
  submit(op, ts, n, p);
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

// out = op(ins...) with broadcasting; `compute` given or the common dtype.
static void device_copy(const at::Tensor& dst, const at::Tensor& src);

// The strides TensorIterator gives an output it allocates, so a result keeps
// its inputs' memory format (x.t().abs() is transposed, as on CPU): inputs of
// one shape with equal dense strides lend them; otherwise dims are ordered
// innermost-first by the first input whose strides tell two dims apart
// (broadcast dims do not vote), and the output is dense in that order.
static std::vector<int64_t> ti_strides(c10::IntArrayRef shape, std::initializer_list<at::Tensor> ins) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  bool same = true;
  const at::Tensor* first = nullptr;
  for (const auto& t : ins) {
    if (!t.sizes().equals(shape) || !t.is_non_overlapping_and_dense()) { same = false; break; }
    if (!first) first = &t;
    else if (!t.strides().equals(first->strides())) { same = false; break; }
  }
  if (same && first) return first->strides().vec();
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
  std::vector<int64_t> perm(nd);   // innermost first
  for (int64_t i = 0; i < nd; i++) perm[i] = nd - 1 - i;
  for (int64_t i = 1; i < nd; i++) {
    int64_t d1 = i;
    for (int64_t d0 = i - 1; d0 >= 0; d0--) {
      int c = should_swap(perm[d0], perm[d1]);
      if (c > 0) { std::swap(perm[d0], perm[d1]); d1 = d0; }
      else if (c < 0) break;
    }
  }
  std::vector<int64_t> strides(nd);
  int64_t f = 1;
  for (int64_t i = 0; i < nd; i++) { strides[perm[i]] = f; f *= shape[perm[i]]; }
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

static at::Tensor wrap(const c10::Scalar& s) {
  auto t = at::scalar_tensor(s, at::TensorOptions().dtype(s.type()));
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// ---------------------------------------------------------------- unary
#define UNARY_FLOAT(fn, OP)                                                     \
  static at::Tensor& fn##_out(const at::Tensor& self, at::Tensor& out) {       \
    return ew_out(TPU_OP_##OP, out, {self}, float_of(self.scalar_type()));     \
  }
#define UNARY_SAME(fn, OP)                                                      \
  static at::Tensor& fn##_out(const at::Tensor& self, at::Tensor& out) {       \
    return ew_out(TPU_OP_##OP, out, {self}, self.scalar_type());               \
  }

UNARY_FLOAT(exp, EXP) UNARY_FLOAT(exp2, EXP2) UNARY_FLOAT(expm1, EXPM1) UNARY_FLOAT(log, LOG)
UNARY_FLOAT(log2, LOG2) UNARY_FLOAT(log10, LOG10) UNARY_FLOAT(log1p, LOG1P) UNARY_FLOAT(sqrt, SQRT)
UNARY_FLOAT(rsqrt, RSQRT) UNARY_FLOAT(reciprocal, RECIPROCAL) UNARY_FLOAT(sin, SIN) UNARY_FLOAT(cos, COS)
UNARY_FLOAT(tan, TAN) UNARY_FLOAT(asin, ASIN) UNARY_FLOAT(acos, ACOS) UNARY_FLOAT(atan, ATAN)
UNARY_FLOAT(sinh, SINH) UNARY_FLOAT(cosh, COSH) UNARY_FLOAT(tanh, TANH) UNARY_FLOAT(asinh, ASINH)
UNARY_FLOAT(acosh, ACOSH) UNARY_FLOAT(atanh, ATANH) UNARY_FLOAT(erf, ERF) UNARY_FLOAT(erfc, ERFC)
UNARY_FLOAT(sigmoid, SIGMOID)
// Activations compute in the input's dtype (not promoted): integer inputs fail the op's dtype rule, as on CPU.
UNARY_SAME(silu, SILU) UNARY_SAME(mish, MISH) UNARY_SAME(hardsigmoid, HARDSIGMOID) UNARY_SAME(hardswish, HARDSWISH)
UNARY_SAME(neg, NEG) UNARY_SAME(abs, ABS) UNARY_SAME(sign, SIGN) UNARY_SAME(floor, FLOOR)
UNARY_SAME(ceil, CEIL) UNARY_SAME(round, ROUND) UNARY_SAME(trunc, TRUNC) UNARY_SAME(frac, FRAC)
UNARY_SAME(bitwise_not, BITWISE_NOT)

static at::Tensor& logical_not_out(const at::Tensor& self, at::Tensor& out) {
  return ew_out(TPU_OP_LOGICAL_NOT, out, {self}, self.scalar_type(), {}, false);
}

static at::Tensor& gelu_out(const at::Tensor& self, c10::string_view approximate, at::Tensor& out) {
  tpu_params p{};
  p.i[0] = approximate == "tanh" ? 1 : 0;
  return ew_out(TPU_OP_GELU, out, {self}, self.scalar_type(), p);
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
  if (out.scalar_type() != self.scalar_type()) { src = at::empty(self.sizes(), out.options()); device_copy(src, self); }
  tpu_params p{};
  p.i[0] = diag;
  tpu_tensor ts[2] = {desc(out), desc(src)};
  submit(op, ts, 2, p);
  return out;
}
static at::Tensor& tril_out(const at::Tensor& self, int64_t diag, at::Tensor& out) { return tri_out(TPU_OP_TRIL, self, diag, out); }
static at::Tensor& triu_out(const at::Tensor& self, int64_t diag, at::Tensor& out) { return tri_out(TPU_OP_TRIU, self, diag, out); }

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
  tpu_params p{};
  p.i[0] = 1;
  p.i[1] = 1;
  p.f[0] = mn.toDouble();
  p.f[1] = mx.toDouble();
  return ew_out(TPU_OP_CLAMP, out, {self}, self.scalar_type(), p);
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
  tpu_params p{};
  p.f[0] = slope.toDouble();
  return ew_out(TPU_OP_LEAKY_RELU, out, {self}, self.scalar_type(), p);
}

static at::Tensor& softplus_out(const at::Tensor& self, const c10::Scalar& beta, const c10::Scalar& th, at::Tensor& out) {
  tpu_params p{};
  p.f[0] = beta.toDouble();
  p.f[1] = th.toDouble();
  return ew_out(TPU_OP_SOFTPLUS, out, {self}, self.scalar_type(), p);
}

static at::Tensor& elu_out(const at::Tensor& self, const c10::Scalar& alpha, const c10::Scalar& scale,
                           const c10::Scalar& iscale, at::Tensor& out) {
  tpu_params p{};
  p.f[0] = alpha.toDouble();
  p.f[1] = scale.toDouble();
  p.f[2] = iscale.toDouble();
  return ew_out(TPU_OP_ELU, out, {self}, self.scalar_type(), p);
}

static at::Tensor& nan_to_num_out(const at::Tensor& self, std::optional<double> nan, std::optional<double> pinf,
                                  std::optional<double> ninf, at::Tensor& out) {
  tpu_params p{};
  double big = self.scalar_type() == kDouble ? std::numeric_limits<double>::max()
             : self.scalar_type() == kHalf ? 65504.0
             : self.scalar_type() == kBFloat16 ? 3.3895313892515355e38
             : double(std::numeric_limits<float>::max());
  p.f[0] = nan.value_or(0.0);
  p.f[1] = pinf.value_or(big);
  p.f[2] = ninf.value_or(-big);
  return ew_out(TPU_OP_NAN_TO_NUM, out, {self}, self.scalar_type(), p);
}

static at::Tensor& clamp_out(const at::Tensor& self, const std::optional<c10::Scalar>& mn,
                             const std::optional<c10::Scalar>& mx, at::Tensor& out) {
  tpu_params p{};
  p.i[0] = mn.has_value();
  p.i[1] = mx.has_value();
  if (mn) p.f[0] = mn->toDouble();
  if (mx) p.f[1] = mx->toDouble();
  c10::ScalarType c = self.scalar_type();
  if (mn) c = at::native::result_type(at::native::update_result_type_state(*mn, at::native::update_result_type_state(self, {})));
  if (mx) c = promoteTypes(c, at::native::result_type(at::native::update_result_type_state(*mx, at::native::update_result_type_state(self, {}))));
  return ew_out(TPU_OP_CLAMP, out, {self}, c, p);
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
static at::Tensor& add_out(const at::Tensor& a, const at::Tensor& b, const c10::Scalar& alpha, at::Tensor& out) {
  tpu_params p{};
  p.f[0] = alpha.toDouble();
  return ew_out(TPU_OP_ADD, out, {a, b}, std::nullopt, p);
}
static at::Tensor& sub_out(const at::Tensor& a, const at::Tensor& b, const c10::Scalar& alpha, at::Tensor& out) {
  tpu_params p{};
  p.f[0] = alpha.toDouble();
  return ew_out(TPU_OP_SUB, out, {a, b}, std::nullopt, p);
}
static at::Tensor& div_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return ew_out(TPU_OP_DIV, out, {a, b}, float_of(common_type({a, b})));
}
static at::Tensor& div_mode_out(const at::Tensor& a, const at::Tensor& b, std::optional<c10::string_view> mode,
                                at::Tensor& out) {
  if (!mode) return div_out(a, b, out);
  tpu_params p{};
  TORCH_CHECK(*mode == "trunc" || *mode == "floor",
              "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '", *mode, "'");
  p.i[0] = *mode == "trunc" ? 1 : 2;
  return ew_out(TPU_OP_DIV, out, {a, b}, std::nullopt, p);
}
static at::Tensor& pow_tt_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return ew_out(TPU_OP_POW, out, {a, b});
}
static at::Tensor& pow_ts_out(const at::Tensor& a, const c10::Scalar& b, at::Tensor& out) {
  return ew_out(TPU_OP_POW, out, {a, wrap(b)});
}
static at::Tensor& pow_st_out(const c10::Scalar& a, const at::Tensor& b, at::Tensor& out) {
  return ew_out(TPU_OP_POW, out, {wrap(a), b});
}

#define BINARY(fn, OP)                                                                 \
  static at::Tensor& fn##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) { \
    return ew_out(TPU_OP_##OP, out, {a, b});                                          \
  }
#define COMPARE(fn, OP)                                                                        \
  static at::Tensor& fn##_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {    \
    return ew_out(TPU_OP_##OP, out, {a, b}, std::nullopt, {}, false);                         \
  }                                                                                            \
  static at::Tensor& fn##_s_out(const at::Tensor& a, const c10::Scalar& b, at::Tensor& out) { \
    return ew_out(TPU_OP_##OP, out, {a, wrap(b)}, std::nullopt, {}, false);                   \
  }

BINARY(mul, MUL) BINARY(maximum, MAXIMUM) BINARY(minimum, MINIMUM) BINARY(fmod, FMOD)
BINARY(remainder, REMAINDER) BINARY(bitwise_and, BITWISE_AND) BINARY(bitwise_or, BITWISE_OR)
BINARY(bitwise_xor, BITWISE_XOR)
static at::Tensor& atan2_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  return ew_out(TPU_OP_ATAN2, out, {a, b}, float_of(common_type({a, b})));
}
COMPARE(eq, EQ) COMPARE(ne, NE) COMPARE(lt, LT) COMPARE(le, LE) COMPARE(gt, GT) COMPARE(ge, GE)
COMPARE(logical_and, LOGICAL_AND) COMPARE(logical_or, LOGICAL_OR) COMPARE(logical_xor, LOGICAL_XOR)

// Activation backward: (grad, x-or-y) -> grad_input
static at::Tensor& threshold_backward_out(const at::Tensor& g, const at::Tensor& x, const c10::Scalar& th, at::Tensor& out) {
  tpu_params p{};
  p.f[0] = th.toDouble();
  return ew_out(TPU_OP_THRESHOLD_BWD, out, {g, x}, std::nullopt, p);
}
static at::Tensor& gelu_backward_out(const at::Tensor& g, const at::Tensor& x, c10::string_view approx, at::Tensor& out) {
  tpu_params p{};
  p.i[0] = approx == "tanh" ? 1 : 0;
  return ew_out(TPU_OP_GELU_BWD, out, {g, x}, std::nullopt, p);
}
static at::Tensor& silu_backward_out(const at::Tensor& g, const at::Tensor& x, at::Tensor& out) {
  return ew_out(TPU_OP_SILU_BWD, out, {g, x});
}
static at::Tensor& sigmoid_backward_out(const at::Tensor& g, const at::Tensor& y, at::Tensor& out) {
  return ew_out(TPU_OP_SIGMOID_BWD, out, {g, y});
}
static at::Tensor& tanh_backward_out(const at::Tensor& g, const at::Tensor& y, at::Tensor& out) {
  return ew_out(TPU_OP_TANH_BWD, out, {g, y});
}
static at::Tensor& leaky_relu_backward_out(const at::Tensor& g, const at::Tensor& x, const c10::Scalar& slope,
                                           bool self_is_result, at::Tensor& out) {
  tpu_params p{};
  p.f[0] = slope.toDouble();
  return ew_out(TPU_OP_LEAKY_RELU_BWD, out, {g, x}, std::nullopt, p);
}
static at::Tensor& softplus_backward_out(const at::Tensor& g, const at::Tensor& x, const c10::Scalar& beta,
                                         const c10::Scalar& th, at::Tensor& out) {
  tpu_params p{};
  p.f[0] = beta.toDouble();
  p.f[1] = th.toDouble();
  return ew_out(TPU_OP_SOFTPLUS_BWD, out, {g, x}, std::nullopt, p);
}
static at::Tensor& hardtanh_backward_out(const at::Tensor& g, const at::Tensor& x, const c10::Scalar& mn,
                                         const c10::Scalar& mx, at::Tensor& out) {
  tpu_params p{};
  p.f[0] = mn.toDouble();
  p.f[1] = mx.toDouble();
  return ew_out(TPU_OP_HARDTANH_BWD, out, {g, x}, std::nullopt, p);
}
static at::Tensor hardtanh_backward(const at::Tensor& g, const at::Tensor& x, const c10::Scalar& mn, const c10::Scalar& mx) {
  auto out = at::empty({0}, g.options());
  return hardtanh_backward_out(g, x, mn, mx, out);
}

// ---------------------------------------------------------------- ternary
static at::Tensor& addcmul_out(const at::Tensor& s, const at::Tensor& t1, const at::Tensor& t2, const c10::Scalar& v,
                               at::Tensor& out) {
  tpu_params p{};
  p.f[0] = v.toDouble();
  return ew_out(TPU_OP_ADDCMUL, out, {s, t1, t2}, std::nullopt, p);
}
static at::Tensor& addcdiv_out(const at::Tensor& s, const at::Tensor& t1, const at::Tensor& t2, const c10::Scalar& v,
                               at::Tensor& out) {
  tpu_params p{};
  p.f[0] = v.toDouble();
  return ew_out(TPU_OP_ADDCDIV, out, {s, t1, t2}, std::nullopt, p);
}
static at::Tensor& lerp_s_out(const at::Tensor& s, const at::Tensor& e, const c10::Scalar& w, at::Tensor& out) {
  auto wt = wrap(w);
  return ew_out(TPU_OP_LERP, out, {s, e, wt}, common_type({s, e}));
}
static at::Tensor& lerp_t_out(const at::Tensor& s, const at::Tensor& e, const at::Tensor& w, at::Tensor& out) {
  return ew_out(TPU_OP_LERP, out, {s, e, w}, common_type({s, e}));
}
static at::Tensor& where_out(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  TORCH_CHECK(c.scalar_type() == kBool || c.scalar_type() == kByte, "where expected condition to be a boolean tensor, but got a tensor with dtype ", c.scalar_type());
  return ew_out(TPU_OP_WHERE, out, {c, a, b}, common_type({a, b}));
}
static at::Tensor where(const at::Tensor& c, const at::Tensor& a, const at::Tensor& b) {
  auto out = at::empty({0}, (a.device().is_cpu() ? b : a).options().dtype(common_type({a, b})));
  return where_out(c, a, b, out);
}
static at::Tensor& masked_fill_s(at::Tensor& self, const at::Tensor& mask, const c10::Scalar& v) {
  TORCH_CHECK(mask.scalar_type() == kBool, "masked_fill_ only supports boolean masks, but got mask with dtype ", mask.scalar_type());
  ew(TPU_OP_WHERE, self, {mask, wrap(v), self}, self.scalar_type());
  return self;
}
static at::Tensor& masked_fill_t(at::Tensor& self, const at::Tensor& mask, const at::Tensor& v) {
  TORCH_CHECK(v.dim() == 0, "masked_fill_ only supports a 0-dimensional value tensor, but got tensor with ", v.dim(), " dimension(s).");
  TORCH_CHECK(mask.scalar_type() == kBool, "masked_fill_ only supports boolean masks, but got mask with dtype ", mask.scalar_type());
  ew(TPU_OP_WHERE, self, {mask, v, self}, self.scalar_type());
  return self;
}

// ---------------------------------------------------------------- fill / arange / copy
static at::Tensor& fill_s(at::Tensor& self, const c10::Scalar& v) {
  if (self.numel() == 0) return self;
  tpu_tensor ts[2] = {desc(self), desc_scalar(v, self.scalar_type())};
  tpu_params p{};
  p.compute_dtype = to_tpu_dtype(self.scalar_type());
  submit(TPU_OP_FILL, ts, 2, p);
  return self;
}
static at::Tensor& fill_t(at::Tensor& self, const at::Tensor& v) {
  TORCH_CHECK(v.dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor with ", v.dim(), " dimensions.");
  if (v.device().is_cpu()) return fill_s(self, v.item());
  ew(TPU_OP_FILL, self, {v}, self.scalar_type());
  return self;
}
static at::Tensor& zero_(at::Tensor& self) { return fill_s(self, 0); }

static at::Tensor& arange_out(const c10::Scalar& start, const c10::Scalar& end, const c10::Scalar& step, at::Tensor& out) {
  double xs = start.toDouble(), xe = end.toDouble(), st = step.toDouble();
  TORCH_CHECK(st != 0, "step must be nonzero");
  TORCH_CHECK(std::isfinite(xs) && std::isfinite(xe), "unsupported range: ", xs, " -> ", xe);
  TORCH_CHECK((st > 0 && xe >= xs) || (st < 0 && xe <= xs), "upper bound and larger bound inconsistent with step sign");
  int64_t n;
  if (isIntegralType(out.scalar_type(), true) && start.isIntegral(true) && end.isIntegral(true) && step.isIntegral(true)) {
    int64_t s = start.toLong(), e = end.toLong(), k = step.toLong();
    n = (e - s + k + (k > 0 ? -1 : 1)) / k;
  } else {
    n = static_cast<int64_t>(std::ceil((xe - xs) / st));
  }
  at::native::resize_output(out, {n});
  if (n == 0) return out;
  tpu_params p{};
  p.f[0] = xs;
  p.f[1] = st;
  p.compute_dtype = to_tpu_dtype(out.scalar_type());
  tpu_tensor t = desc(out);
  submit(TPU_OP_ARANGE, &t, 1, p);
  return out;
}

static at::Tensor& linspace_out(const c10::Scalar& start, const c10::Scalar& end, int64_t steps, at::Tensor& out) {
  TORCH_CHECK(steps >= 0, "number of steps must be non-negative");
  at::native::resize_output(out, {steps});
  if (steps == 0) return out;
  double a = start.toDouble(), b = end.toDouble();
  tpu_params p{};
  p.f[0] = a;
  p.f[1] = steps > 1 ? (b - a) / double(steps - 1) : 0.0;
  p.compute_dtype = to_tpu_dtype(out.scalar_type());
  tpu_tensor t = desc(out);
  submit(TPU_OP_ARANGE, &t, 1, p);
  if (steps > 1) out.select(0, steps - 1).fill_(end);   // exact end point, as PyTorch gives
  return out;
}

static void record_stream(at::Tensor& self, c10::Stream s) {
  device_allocator_record(self.storage().data_ptr(), s);
}

// Device copy with dtype conversion and broadcasting of src to dst's shape.
static void device_copy(const at::Tensor& dst, const at::Tensor& src) {
  ew(TPU_OP_COPY, dst, {src}, dst.scalar_type());
}

static bool plain(const at::Tensor& t) { return t.is_contiguous() && t.is_non_overlapping_and_dense(); }

// A contiguous tensor (tpu or host) as the runtime's copy view: its whole
// storage (base, current size) and the 1-d range it covers. The runtime checks
// the range against the storage (and a device storage against the allocator)
// before any byte moves.
static tpu_tensor copy_view(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(plain(t));
  tpu_tensor d = storage_desc(t);
  d.ndim = 1;
  d.sizes[0] = t.numel();
  d.strides[0] = 1;
  return d;
}

static void copy_bytes(const at::Tensor& dst, const at::Tensor& src, tpu_copy_kind kind, tpu_stream_t stream,
                       bool async) {
  tpu_tensor d = copy_view(dst), s = copy_view(src);
  TPU_CHECK(tpu_memcpy_view(&d, &s, kind, stream, async));
}

static at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "copy_ on undefined tensors");
  if (dst.numel() == 0) return dst;
  const bool s_tpu = self.device().is_privateuseone(), d_tpu = dst.device().is_privateuseone();
  TORCH_CHECK(dtype_supported(dst.scalar_type()) && dtype_supported(self.scalar_type()),
              "tpu does not support copies of dtype ", self.scalar_type(), " -> ", dst.scalar_type(), " yet");
  if (s_tpu && d_tpu) {
    if (self.device() == dst.device()) {
      c10::DeviceGuard g(dst.device());
      device_copy(dst, self);
      return dst;
    }
    // Between chips: make a dense source, move its bytes, then lay out on the destination chip.
    at::Tensor s = self.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    at::Tensor d;
    {
      c10::DeviceGuard g(dst.device());
      d = plain(dst) ? dst : at::empty(dst.sizes(), dst.options());
    }
    TPU_CHECK(tpu_device_synchronize(self.device().index()));
    copy_bytes(d, s, TPU_COPY_D2D, tpu_stream_current(dst.device().index()), false);
    if (!d.is_same(dst)) {
      c10::DeviceGuard g(dst.device());
      device_copy(dst, d);
    }
    return dst;
  }
  if (d_tpu) {  // host -> device
    c10::DeviceGuard g(dst.device());
    at::Tensor s = self.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    at::Tensor d = plain(dst) ? dst : at::empty(dst.sizes(), dst.options());
    bool pinned = non_blocking && tpu_host_is_pinned(s.data_ptr());
    copy_bytes(d, s, TPU_COPY_H2D, tpu_stream_current(dst.device().index()), pinned && s.is_same(self));
    if (!d.is_same(dst)) device_copy(dst, d);
    return dst;
  }
  TORCH_CHECK(s_tpu, "copy_from: expected a tpu tensor on one side");
  // device -> host
  c10::DeviceGuard g(self.device());
  at::Tensor s = self;
  if (!(plain(self) && self.scalar_type() == dst.scalar_type() && self.sizes().equals(dst.sizes()))) {
    s = at::empty(dst.sizes(), self.options().dtype(dst.scalar_type()));
    device_copy(s, self);
  }
  bool direct = plain(dst);
  at::Tensor h = direct ? dst : at::empty(dst.sizes(), dst.options().memory_format(c10::MemoryFormat::Contiguous));
  bool pinned = non_blocking && direct && tpu_host_is_pinned(h.data_ptr());
  auto stream = tpu_stream_current(self.device().index());
  copy_bytes(h, s, TPU_COPY_D2H, stream, pinned);
  if (pinned && !s.is_same(self))
    s.record_stream(c10::Stream(c10::Stream::UNSAFE, self.device(), tpu_stream_id(stream)));
  if (!direct) dst.copy_(h);
  return dst;
}

static at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

static c10::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "a Tensor with ", self.numel(), " elements cannot be converted to Scalar");
  at::Tensor h = at::empty(self.sizes(), self.options().device(c10::kCPU));
  copy_from(self, h, false);
  return h.item();
}

// ---------------------------------------------------------------- memory / views
static at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                      std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                      std::optional<bool> pin, std::optional<c10::MemoryFormat> mf) {
  c10::OptionalDeviceGuard g(device);
  auto st = dtype.value_or(default_float());
  TORCH_CHECK(dtype_supported(st), "tpu does not support dtype ", st, " yet");
  return at::detail::empty_generic(size, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), st, mf);
}

static at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                                std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                std::optional<bool> pin) {
  c10::OptionalDeviceGuard g(device);
  auto st = dtype.value_or(default_float());
  TORCH_CHECK(dtype_supported(st), "tpu does not support dtype ", st, " yet");
  return at::detail::empty_strided_generic(size, stride, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), st);
}

static void resize_storage(const at::Tensor& self, size_t nbytes) {
  auto* st = self.storage().unsafeGetStorageImpl();
  if (nbytes <= st->nbytes()) return;
  TORCH_CHECK(st->resizable(), "Trying to resize storage that is not resizable");
  c10::DeviceGuard g(self.device());
  resize_storage_bytes(st, nbytes);
}

static const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::MemoryFormat> mf) {
  for (auto s : size) TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", size);
  auto* impl = self.unsafeGetTensorImpl();
  // As PyTorch's resize_: the same sizes keep the strides (an out= argument
  // of the right shape keeps its layout); new sizes are laid out contiguously.
  if (self.sizes().equals(size) && !(mf && *mf != c10::MemoryFormat::Preserve)) return self;
  impl->set_sizes_contiguous(size);
  if (mf && *mf != c10::MemoryFormat::Preserve) impl->empty_tensor_restride(*mf);
  size_t nbytes = at::detail::computeStorageNbytes(size, impl->strides(), self.dtype().itemsize(), self.storage_offset());
  resize_storage(self, nbytes);
  return self;
}

// set_ as CPU does it: PyTorch's own argument checks, then the storage grows
// if the new view needs more bytes than it holds (set_ documents this).
static at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  TORCH_CHECK(source.device_type() == c10::DeviceType::PrivateUse1 || source.nbytes() == 0,
              "Expected a tpu storage, got ", source.device());
  at::native::checkSetStorage(self, source, offset, size, stride);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(offset);
  if (stride.data()) impl->set_sizes_and_strides(size, stride);
  else impl->set_sizes_contiguous(size);
  size_t nbytes = at::detail::computeStorageNbytes(impl->sizes(), impl->strides(), self.dtype().itemsize(), offset);
  resize_storage(self, nbytes);
  return self;
}
static at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {n}, {});
}
static at::Tensor& set_source_storage_offset(at::Tensor& self, c10::Storage source, int64_t off, c10::IntArrayRef size,
                                             c10::IntArrayRef stride) {
  return set_storage(self, std::move(source), off, size, stride);
}
static at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& src) {
  return set_storage(self, src.storage(), src.storage_offset(), src.sizes(), src.strides());
}
static at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage st(c10::Storage::use_byte_size_t(), 0, device_allocator(), true);
  return set_storage(self, st, 0, {0}, {});
}

// Module.to("tpu") keeps parameter identity (tied weights stay tied) only if
// PyTorch sees a CPU tensor and a tpu tensor as shallow-copy compatible, as it
// does CPU and CUDA: Module._apply then swaps `.data` in place instead of
// building a new Parameter per module. TensorImpl's own dense-backend list
// omits PrivateUse1 (pytorch/pytorch#196975), so we answer the op for our key:
// two dense strided tensors on CPU-like backends or tpu are compatible; anything
// else gets PyTorch's own answer.
static bool dense_strided(const at::Tensor& t) {
  if (t.layout() != c10::kStrided || t.is_quantized() || t.is_nested()) return false;
  switch (t.device().type()) {
    case c10::DeviceType::CPU: case c10::DeviceType::CUDA: case c10::DeviceType::HIP:
    case c10::DeviceType::MPS: case c10::DeviceType::XPU: case c10::DeviceType::HPU:
    case c10::DeviceType::PrivateUse1: return true;
    default: return false;
  }
}
static bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  return (self.is_privateuseone() || from.is_privateuseone()) && dense_strided(self) && dense_strided(from);
}

// ---------------------------------------------------------------- reductions
// Output descriptor in "keepdim" form: reduced dims have size 1 (stride 0).
static tpu_tensor red_out_desc(const at::Tensor& self, const at::Tensor& out, std::bitset<64> mask, bool keepdim) {
  tpu_tensor d = desc(out);
  int64_t nd = std::max<int64_t>(self.dim(), 1);
  if (self.dim() == 0) { d.ndim = 1; d.sizes[0] = 1; d.strides[0] = 0; return d; }
  if (keepdim) {
    for (int64_t i = 0; i < nd; i++) if (mask[i]) d.strides[i] = 0;
    return d;
  }
  int64_t j = 0;
  for (int64_t i = 0; i < nd; i++) {
    if (mask[i]) { d.sizes[i] = 1; d.strides[i] = 0; }
    else { d.sizes[i] = out.size(j); d.strides[i] = out.stride(j); j++; }
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
    if (mask[i]) { if (keepdim) s.push_back(1); }
    else s.push_back(self.size(i));
  }
  return s;
}

static at::Tensor& reduce(tpu_op op, const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, at::Tensor& out,
                          tpu_params p = {}) {
  auto mask = red_mask(self, dims);
  at::native::resize_output(out, red_shape(self, mask, keepdim));
  if (out.numel() == 0) return out;
  tpu_tensor ts[2] = {red_out_desc(self, out, mask, keepdim), desc1d(self)};
  p.compute_dtype = to_tpu_dtype(out.scalar_type());
  submit(op, ts, 2, p);
  return out;
}

static at::Tensor& sum_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                           std::optional<c10::ScalarType>, at::Tensor& out) {
  return reduce(TPU_OP_SUM, self, dims, keepdim, out);
}
static at::Tensor& mean_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                            std::optional<c10::ScalarType>, at::Tensor& out) {
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
static at::Tensor& amax_out(const at::Tensor& self, c10::IntArrayRef dims, bool keepdim, at::Tensor& out) {
  return reduce(TPU_OP_AMAX, self, dims, keepdim, out);
}
static at::Tensor& amin_out(const at::Tensor& self, c10::IntArrayRef dims, bool keepdim, at::Tensor& out) {
  return reduce(TPU_OP_AMIN, self, dims, keepdim, out);
}
static at::Tensor full_minmax(tpu_op op, const at::Tensor& self, const char* name) {
  TORCH_CHECK(self.numel() > 0, name, "(): Expected reduction dim to be specified for input.numel() == 0. "
              "Specify the reduction dim with the 'dim' argument.");
  auto out = at::empty({}, self.options());
  return reduce(op, self, std::nullopt, false, out);
}
static at::Tensor max_all(const at::Tensor& self) { return full_minmax(TPU_OP_AMAX, self, "max"); }
static at::Tensor min_all(const at::Tensor& self) { return full_minmax(TPU_OP_AMIN, self, "min"); }

static at::Tensor& arg_out(tpu_op op, const at::Tensor& self, std::optional<int64_t> dim, bool keepdim, at::Tensor& out) {
  if (!dim) {
    at::Tensor flat = self.reshape({-1});
    at::native::resize_output(out, keepdim ? std::vector<int64_t>(self.dim(), 1) : std::vector<int64_t>{});
    tpu_params p{};
    p.i[0] = 0;
    tpu_tensor o = desc(out);
    o.ndim = 1; o.sizes[0] = 1; o.strides[0] = 0;
    tpu_tensor ts[2] = {o, desc1d(flat)};
    submit(op, ts, 2, p);
    return out;
  }
  int64_t d = at::maybe_wrap_dim(*dim, std::max<int64_t>(self.dim(), 1));
  tpu_params p{};
  p.i[0] = d;
  return reduce(op, self, at::IntArrayRef(d), keepdim, out, p);
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
  tpu_params p{};
  p.f[0] = correction ? correction->toDouble() : 1.0;
  return reduce(op, self, dims, keepdim, out, p);
}
static at::Tensor var_c(const at::Tensor& self, at::OptionalIntArrayRef dims, const std::optional<c10::Scalar>& c, bool k) {
  return var_std(TPU_OP_VAR, self, dims, c, k);
}
static at::Tensor std_c(const at::Tensor& self, at::OptionalIntArrayRef dims, const std::optional<c10::Scalar>& c, bool k) {
  return var_std(TPU_OP_STD, self, dims, c, k);
}
static at::Tensor& any_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  return reduce(TPU_OP_ANY, self, at::IntArrayRef(at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1))), keepdim, out);
}
static at::Tensor& any_dims_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, at::Tensor& out) {
  return reduce(TPU_OP_ANY, self, dims, keepdim, out);
}
static at::Tensor& any_all_out(const at::Tensor& self, at::Tensor& out) { return reduce(TPU_OP_ANY, self, std::nullopt, false, out); }
static at::Tensor& all_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  return reduce(TPU_OP_ALL, self, at::IntArrayRef(at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1))), keepdim, out);
}
static at::Tensor& all_dims_out(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim, at::Tensor& out) {
  return reduce(TPU_OP_ALL, self, dims, keepdim, out);
}
static at::Tensor& all_all_out(const at::Tensor& self, at::Tensor& out) { return reduce(TPU_OP_ALL, self, std::nullopt, false, out); }
static at::Tensor& norm_out(const at::Tensor& self, const c10::Scalar& ord, at::OptionalIntArrayRef dims, bool keepdim,
                            std::optional<c10::ScalarType>, at::Tensor& out) {
  tpu_params p{};
  p.f[0] = ord.toDouble();
  return reduce(TPU_OP_NORM, self, dims, keepdim, out, p);
}
static at::Tensor& scan_out(tpu_op op, const at::Tensor& self, int64_t dim, at::Tensor& out) {
  at::native::resize_output(out, self.sizes());
  if (out.numel() == 0) return out;
  tpu_params p{};
  p.i[0] = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
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

// ---------------------------------------------------------------- matrix unit
static int matmul_precision() {
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST: return 0;
    case at::Float32MatmulPrecision::HIGH: return 1;
    default: return 2;
  }
}

// View a tensor as (batch, rows, cols) with given sizes and strides.
static tpu_tensor as3(const at::Tensor& t, int64_t b, int64_t r, int64_t c, int64_t sb, int64_t sr, int64_t sc) {
  tpu_tensor d = desc(t);
  d.ndim = 3;
  d.sizes[0] = b; d.sizes[1] = r; d.sizes[2] = c;
  d.strides[0] = sb; d.strides[1] = sr; d.strides[2] = sc;
  return d;
}
static tpu_tensor mat3(const at::Tensor& m) { return as3(m, 1, m.size(0), m.size(1), 0, m.stride(0), m.stride(1)); }

static void check_mm(const at::Tensor& a, const at::Tensor& b, const char* name) {
  TORCH_CHECK(a.dim() == 2, name, ": self must be a matrix");
  TORCH_CHECK(b.dim() == 2, name, ": mat2 must be a matrix");
  TORCH_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", a.size(0), "x", a.size(1), " and ",
              b.size(0), "x", b.size(1), ")");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected m1 and m2 to have the same dtype, but got: ", a.scalar_type(),
              " != ", b.scalar_type());
}

static void gemm(const at::Tensor& out, tpu_tensor o, tpu_tensor a, tpu_tensor b, const at::Tensor* c, tpu_tensor cd,
                 double alpha, double beta) {
  if (out.numel() == 0) return;
  tpu_params p{};
  p.f[0] = alpha;
  p.f[1] = beta;
  p.i[0] = matmul_precision();
  tpu_tensor ts[4] = {o, a, b, cd};
  submit(TPU_OP_MATMUL, ts, (c && beta != 0.0) ? 4 : 3, p);
}

static at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  check_mm(a, b, "mm");
  at::native::resize_output(out, {a.size(0), b.size(1)});
  gemm(out, mat3(out), mat3(a), mat3(b), nullptr, {}, 1.0, 0.0);
  return out;
}
static at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& beta,
                             const c10::Scalar& alpha, at::Tensor& out) {
  check_mm(a, b, "addmm");
  at::native::resize_output(out, {a.size(0), b.size(1)});
  at::Tensor c = self.expand({a.size(0), b.size(1)});
  gemm(out, mat3(out), mat3(a), mat3(b), &c, mat3(c), alpha.toDouble(), beta.toDouble());
  return out;
}
static tpu_tensor bat3(const at::Tensor& t) { return as3(t, t.size(0), t.size(1), t.size(2), t.stride(0), t.stride(1), t.stride(2)); }
static void check_bmm(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 3, "batch1 must be a 3D tensor");
  TORCH_CHECK(b.dim() == 3, "batch2 must be a 3D tensor");
  TORCH_CHECK(a.size(0) == b.size(0), "batch1 and batch2 must have same number of batches, got ", a.size(0), " and ", b.size(0));
  TORCH_CHECK(a.size(2) == b.size(1), "Expected size for first two dimensions of batch2 tensor to be: [", a.size(0), ", ",
              a.size(2), "] but got: [", b.size(0), ", ", b.size(1), "].");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected scalar type ", a.scalar_type(), " but found ", b.scalar_type());
}
static at::Tensor& bmm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  check_bmm(a, b);
  at::native::resize_output(out, {a.size(0), a.size(1), b.size(2)});
  gemm(out, bat3(out), bat3(a), bat3(b), nullptr, {}, 1.0, 0.0);
  return out;
}
static at::Tensor& baddbmm_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& beta,
                               const c10::Scalar& alpha, at::Tensor& out) {
  check_bmm(a, b);
  at::native::resize_output(out, {a.size(0), a.size(1), b.size(2)});
  at::Tensor c = self.expand({a.size(0), a.size(1), b.size(2)});
  gemm(out, bat3(out), bat3(a), bat3(b), &c, bat3(c), alpha.toDouble(), beta.toDouble());
  return out;
}
static at::Tensor& addmv_out(const at::Tensor& self, const at::Tensor& m, const at::Tensor& v, const c10::Scalar& beta,
                             const c10::Scalar& alpha, at::Tensor& out) {
  TORCH_CHECK(m.dim() == 2 && v.dim() == 1, "vector + matrix @ vector expected, got ", self.dim(), ", ", m.dim(), ", ", v.dim());
  TORCH_CHECK(m.size(1) == v.size(0), "size mismatch, got input (", self.size(0), "), mat (", m.size(0), "x", m.size(1), "), vec (", v.size(0), ")");
  at::native::resize_output(out, {m.size(0)});
  at::Tensor c = self.expand({m.size(0)});
  gemm(out, as3(out, 1, m.size(0), 1, 0, out.stride(0), 0), mat3(m), as3(v, 1, v.size(0), 1, 0, v.stride(0), 0), &c,
       as3(c, 1, m.size(0), 1, 0, c.stride(0), 0), alpha.toDouble(), beta.toDouble());
  return out;
}
static at::Tensor dot(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "1D tensors expected, but got ", a.dim(), "D and ", b.dim(), "D tensors");
  TORCH_CHECK(a.numel() == b.numel(), "inconsistent tensor size, expected tensor [", a.numel(), "] and src [", b.numel(),
              "] to have the same number of elements, but got ", a.numel(), " and ", b.numel(), " elements respectively");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dot : expected both vectors to have same dtype, but found ", a.scalar_type(), " and ", b.scalar_type());
  auto out = at::empty({}, a.options());
  gemm(out, as3(out, 1, 1, 1, 0, 0, 0), as3(a, 1, 1, a.size(0), 0, 0, a.stride(0)), as3(b, 1, b.size(0), 1, 0, b.stride(0), 0),
       nullptr, {}, 1.0, 0.0);
  return out;
}

// ---------------------------------------------------------------- softmax / losses / norms
static at::Tensor& softmax_like(tpu_op op, const at::Tensor& x, int64_t dim, at::Tensor& out) {
  at::native::resize_output(out, x.sizes());
  if (out.numel() == 0) return out;
  tpu_params p{};
  p.i[0] = at::maybe_wrap_dim(dim, std::max<int64_t>(x.dim(), 1));
  tpu_tensor ts[2] = {desc1d(out), desc1d(x)};
  submit(op, ts, 2, p);
  return out;
}
static at::Tensor& softmax_out(const at::Tensor& x, int64_t dim, bool half_to_float, at::Tensor& out) {
  TORCH_CHECK(!half_to_float, "softmax with half to float conversion is not supported on tpu");
  return softmax_like(TPU_OP_SOFTMAX, x, dim, out);
}
static at::Tensor& log_softmax_out(const at::Tensor& x, int64_t dim, bool half_to_float, at::Tensor& out) {
  TORCH_CHECK(!half_to_float, "log_softmax with half to float conversion is not supported on tpu");
  return softmax_like(TPU_OP_LOG_SOFTMAX, x, dim, out);
}
static at::Tensor& softmax_bwd(tpu_op op, const at::Tensor& g, const at::Tensor& y, int64_t dim, at::Tensor& out) {
  at::native::resize_output(out, g.sizes());
  if (out.numel() == 0) return out;
  tpu_params p{};
  p.i[0] = at::maybe_wrap_dim(dim, std::max<int64_t>(g.dim(), 1));
  tpu_tensor ts[3] = {desc1d(out), desc1d(g), desc1d(y)};
  submit(op, ts, 3, p);
  return out;
}
static at::Tensor& softmax_backward_out(const at::Tensor& g, const at::Tensor& y, int64_t dim, c10::ScalarType,
                                        at::Tensor& out) {
  return softmax_bwd(TPU_OP_SOFTMAX_BWD, g, y, dim, out);
}
static at::Tensor& log_softmax_backward_out(const at::Tensor& g, const at::Tensor& y, int64_t dim, c10::ScalarType,
                                            at::Tensor& out) {
  return softmax_bwd(TPU_OP_LOG_SOFTMAX_BWD, g, y, dim, out);
}

static std::tuple<at::Tensor&, at::Tensor&> nll_loss_forward_out(const at::Tensor& self, const at::Tensor& target,
    const std::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index, at::Tensor& output,
    at::Tensor& total_weight) {
  TORCH_CHECK(self.dim() > 0 && self.dim() <= 2, "input tensor should be 1D or 2D");
  TORCH_CHECK(target.dim() <= 1, "0D or 1D target tensor expected, multi-target not supported");
  const bool no_batch = self.dim() == 1 && target.dim() == 0;
  TORCH_CHECK(no_batch || self.size(0) == target.size(0), "size mismatch (got input: ", self.sizes(), ", target: ",
              target.sizes(), ")");
  if (reduction == 0 && self.dim() == 2) at::native::resize_output(output, {self.size(0)});
  else at::native::resize_output(output, {});
  at::native::resize_output(total_weight, {});
  tpu_params p{};
  p.i[0] = reduction;
  p.i[1] = ignore_index;
  bool hw = weight.has_value() && weight->defined();
  tpu_tensor ts[5] = {desc(output), desc(total_weight), desc(self), desc(target), hw ? desc(*weight) : tpu_tensor{}};
  submit(TPU_OP_NLL_LOSS, ts, hw ? 5 : 4, p);
  return {output, total_weight};
}
static at::Tensor& nll_loss_backward_out(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
    const std::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index, const at::Tensor& total_weight,
    at::Tensor& grad_input) {
  at::native::resize_output(grad_input, self.sizes());
  if (grad_input.numel() == 0) return grad_input;
  tpu_params p{};
  p.i[0] = reduction;
  p.i[1] = ignore_index;
  bool hw = weight.has_value() && weight->defined();
  tpu_tensor ts[5] = {desc(grad_input), desc(grad_output), desc(target), desc(total_weight), hw ? desc(*weight) : tpu_tensor{}};
  submit(TPU_OP_NLL_LOSS_BWD, ts, hw ? 5 : 4, p);
  return grad_input;
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(const at::Tensor& x, c10::IntArrayRef nshape,
    const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& b, double eps) {
  const int64_t nd = static_cast<int64_t>(nshape.size());
  TORCH_CHECK(nd >= 1 && x.dim() >= nd && x.sizes().slice(x.dim() - nd).equals(nshape),
              "Given normalized_shape=", nshape, ", expected input with shape [*, ", c10::Join(", ", nshape),
              "], but got input of size", x.sizes());
  bool hw = w.has_value() && w->defined(), hb = b.has_value() && b->defined();
  if (hw) TORCH_CHECK(w->sizes().equals(nshape), "Expected weight to be of same shape as normalized_shape, but got weight of shape ", w->sizes(), " and normalized_shape = ", nshape);
  if (hb) TORCH_CHECK(b->sizes().equals(nshape), "Expected bias to be of same shape as normalized_shape, but got bias of shape ", b->sizes(), " and normalized_shape = ", nshape);
  int64_t M = c10::multiply_integers(nshape);
  std::vector<int64_t> sshape(x.sizes().begin(), x.sizes().end() - nd);
  for (int64_t i = 0; i < nd; i++) sshape.push_back(1);
  auto y = at::empty(x.sizes(), x.options());
  auto mean = at::empty(sshape, x.options());
  auto rstd = at::empty(sshape, x.options());
  if (x.numel() == 0) return {y, mean, rstd};
  tpu_params p{};
  p.i[0] = M;
  p.i[1] = hw;
  p.i[2] = hb;
  p.f[0] = eps;
  tpu_tensor ts[6];
  int n = 0;
  ts[n++] = desc(y); ts[n++] = desc(mean); ts[n++] = desc(rstd); ts[n++] = desc(x);
  at::Tensor wc, bc;
  if (hw) { wc = w->contiguous(); ts[n++] = desc(wc); }
  if (hb) { bc = b->contiguous(); ts[n++] = desc(bc); }
  submit(TPU_OP_LAYER_NORM, ts, n, p);
  return {y, mean, rstd};
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(const at::Tensor& g, const at::Tensor& x,
    c10::IntArrayRef nshape, const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& w,
    const std::optional<at::Tensor>& b, std::array<bool, 3> mask) {
  bool hw = w.has_value() && w->defined();
  int64_t M = c10::multiply_integers(nshape);
  at::Tensor dx, dw, db;
  if (mask[0]) dx = at::empty(x.sizes(), x.options());
  if (mask[1] && hw) dw = at::empty(nshape, x.options());
  if (mask[2] && b.has_value() && b->defined()) db = at::empty(nshape, x.options());
  if (x.numel() == 0) {
    if (dw.defined()) dw.zero_();
    if (db.defined()) db.zero_();
    return {dx, dw, db};
  }
  tpu_params p{};
  p.i[0] = M;
  tpu_tensor none = tpu_tensor_scalar_f(0, TPU_F32);
  at::Tensor gc = g.contiguous(), xc = x.contiguous(), wc;
  tpu_tensor ts[8] = {dx.defined() ? desc(dx) : none, dw.defined() ? desc(dw) : none, db.defined() ? desc(db) : none,
                      desc(gc), desc(xc), desc(mean.contiguous()), desc(rstd.contiguous()), {}};
  int n = 7;
  if (hw) { wc = w->contiguous(); ts[n++] = desc(wc); }
  submit(TPU_OP_LAYER_NORM_BWD, ts, n, p);
  return {dx, dw, db};
}

// ---------------------------------------------------------------- indexing
// Index dtype rules as CPU applies them: gather and scatter_add accept an
// empty index of any dtype; index_select and index_add check always.
static void check_index(const at::Tensor& index, const char* name, bool empty_any = false) {
  if (empty_any && index.numel() == 0) return;
  bool ok = index.scalar_type() == kLong || index.scalar_type() == kInt;
  if (ok) return;
  std::string_view n(name);
  TORCH_CHECK(n != "index_select", "index_select(): Expected dtype int32 or int64 for index");
  TORCH_CHECK(n != "index_add", "index_add_(): Expected dtype int32/int64 for index but got: ", index.scalar_type());
  TORCH_CHECK(false, name, "(): Expected dtype int32/int64 for index");
}
static at::Tensor& index_select_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, at::Tensor& out) {
  check_index(index, "index_select");
  TORCH_CHECK(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  std::vector<int64_t> shape(self.sizes().begin(), self.sizes().end());
  if (self.dim() > 0) shape[d] = index.numel();
  else TORCH_CHECK(index.numel() == 1, "index_select(): Index to scalar can have only 1 value, got ", index.numel(), " value(s)");
  at::native::resize_output(out, shape);
  if (out.numel() == 0) return out;
  tpu_params p{};
  p.i[0] = d;
  tpu_tensor ts[3] = {desc1d(out), desc1d(self), desc1d(index)};
  submit(TPU_OP_INDEX_SELECT, ts, 3, p);
  return out;
}
static at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  auto out = at::empty({0}, self.options());
  return index_select_out(self, dim, index, out);
}
static at::Tensor& gather_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool, at::Tensor& out) {
  check_index(index, "gather", true);
  at::native::resize_output(out, index.sizes());
  if (out.numel() == 0) return out;
  tpu_params p{};
  p.i[0] = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  tpu_tensor ts[3] = {desc1d(out), desc1d(self), desc1d(index)};
  submit(TPU_OP_GATHER, ts, 3, p);
  return out;
}
static at::Tensor& scatter_add_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                                   at::Tensor& out) {
  check_index(index, "scatter_add", true);
  if (!out.is_same(self)) {
    at::native::resize_output(out, self.sizes());
    device_copy(out, self);
  }
  if (index.numel() == 0) return out;
  tpu_params p{};
  p.i[0] = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  tpu_tensor ts[3] = {desc1d(out), desc1d(index), desc1d(src)};
  submit(TPU_OP_SCATTER_ADD, ts, 3, p);
  return out;
}
static at::Tensor& index_add_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                                 const c10::Scalar& alpha, at::Tensor& out) {
  check_index(index, "index_add");
  if (!out.is_same(self)) {
    at::native::resize_output(out, self.sizes());
    device_copy(out, self);
  }
  if (index.numel() == 0) return out;
  tpu_params p{};
  p.i[0] = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  p.f[0] = alpha.toDouble();
  tpu_tensor ts[3] = {desc1d(out), desc1d(index), desc1d(src)};
  submit(TPU_OP_INDEX_ADD, ts, 3, p);
  return out;
}
static at::Tensor embedding_dense_backward(const at::Tensor& grad, const at::Tensor& indices, int64_t num_weights,
                                           int64_t padding_idx, bool scale_grad_by_freq) {
  TORCH_CHECK_NOT_IMPLEMENTED(!scale_grad_by_freq, "embedding backward with scale_grad_by_freq=True is not implemented on tpu yet");
  int64_t D = grad.size(-1);
  auto out = at::zeros({num_weights, D}, grad.options());
  auto idx = indices.reshape({-1});
  auto g = grad.reshape({-1, D});
  index_add_out(out, 0, idx, g, 1, out);
  if (padding_idx >= 0 && padding_idx < num_weights) out.select(0, padding_idx).zero_();
  return out;
}

// ---------------------------------------------------------------- random
// Argument checks in PyTorch's words (ATen/native/DistributionTemplates.h).
// The dtype rules (uniform_ and normal_ fill floating tensors only, bernoulli
// takes floating probabilities) are the ops' rules in the runtime's ops.def.
static double float_max(c10::ScalarType st) {
  switch (st) {
    case kDouble: return std::numeric_limits<double>::max();
    case kHalf: return 65504.0;
    case kBFloat16: return 3.3895313892515355e38;
    default: return std::numeric_limits<float>::max();
  }
}
static int float_digits(c10::ScalarType st) {
  switch (st) {
    case kDouble: return 53;
    case kHalf: return 11;
    case kBFloat16: return 8;
    default: return 24;
  }
}

// Empty tensors are launched too: the runtime's dtype check raises for any size, as PyTorch does.
static void rand_fill(tpu_op op, const at::Tensor& self, std::optional<at::Generator> gen, tpu_params p,
                      const at::Tensor* prob = nullptr) {
  if (self.numel() > 0) {
    auto [seed, off] = philox_next(gen, self.device().index());
    p.i[0] = static_cast<int64_t>(seed);
    p.i[1] = static_cast<int64_t>(off);
  }
  tpu_tensor ts[2] = {desc(self), prob ? operand(*prob, self, kFloat) : tpu_tensor{}};
  submit(op, ts, prob ? 2 : 1, p);
}
static at::Tensor& uniform_(at::Tensor& self, double from, double to, std::optional<at::Generator> gen) {
  if (isFloatingType(self.scalar_type())) {
    double mx = float_max(self.scalar_type());
    TORCH_CHECK(from >= -mx && from <= mx, "from is out of bounds for ", self.dtype());
    TORCH_CHECK(to >= -mx && to <= mx, "to is out of bounds for ", self.dtype());
    TORCH_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from, " > to=", to);
    TORCH_CHECK(to - from <= mx, "uniform_ expects to-from <= std::numeric_limits<", self.scalar_type(),
                ">::max(), but found to=", to, " and from=", from, " which result in to-from to exceed the limit");
  }
  tpu_params p{};
  p.f[0] = from;
  p.f[1] = to;
  rand_fill(TPU_OP_RAND_UNIFORM, self, gen, p);
  return self;
}
static at::Tensor& normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  tpu_params p{};
  p.f[0] = mean;
  p.f[1] = std;
  rand_fill(TPU_OP_RAND_NORMAL, self, gen, p);
  return self;
}
static at::Tensor& bernoulli_f(at::Tensor& self, double prob, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 <= prob && prob <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", prob);
  tpu_params p{};
  p.f[0] = prob;
  rand_fill(TPU_OP_RAND_BERNOULLI, self, gen, p);
  return self;
}
static at::Tensor& bernoulli_t(at::Tensor& self, const at::Tensor& prob, std::optional<at::Generator> gen) {
  rand_fill(TPU_OP_RAND_BERNOULLI, self, gen, {}, &prob);
  return self;
}
// The largest value random_ draws without `to`: 2^digits for floating dtypes, the dtype's max otherwise.
static int64_t random_max(c10::ScalarType st) {
  switch (st) {
    case kFloat: case kDouble: case kHalf: case kBFloat16: return int64_t{1} << float_digits(st);
    case kBool: return 1;
    case kByte: return 255;
    case kChar: return 127;
    case kShort: return 32767;
    case kInt: return 2147483647;
    default: return std::numeric_limits<int64_t>::max();
  }
}
// [from, to_inc] must fit the dtype (PyTorch's check_from_to_in_range, warnings included).
static void check_random_range(const at::Tensor& self, int64_t from, int64_t to_inc) {
  auto st = self.scalar_type();
  if (isFloatingType(st)) {
    double mx = float_max(st);
    TORCH_CHECK(from >= -mx && from <= mx, "from is out of bounds for ", self.dtype());
    TORCH_CHECK(to_inc >= -mx && to_inc <= mx, "to - 1 is out of bounds for ", self.dtype());
    int d = float_digits(st);
    int64_t lim = int64_t{1} << d;
    for (auto [v, name] : {std::pair{from, "from"}, std::pair{to_inc, "to - 1"}})
      if (v < -lim || v > lim)
        TORCH_WARN(name, " is out of bounds [-(2^", d, "), 2^", d, "]. Due to precision limitations ", self.dtype(),
                   " can support discrete uniform distribution only within this range. This warning will become an "
                   "error in version 1.7 release, please fix the code in advance");
    return;
  }
  int64_t mx = random_max(st), mn = st == kByte || st == kBool ? 0 : -mx - 1;
  TORCH_CHECK(from >= mn && from <= mx, "from is out of bounds for ", self.dtype());
  TORCH_CHECK(to_inc >= mn && to_inc <= mx, "to - 1 is out of bounds for ", self.dtype());
}
static at::Tensor& random_from(at::Tensor& self, int64_t from, std::optional<int64_t> to, std::optional<at::Generator> gen) {
  auto st = self.scalar_type();
  tpu_params p{};
  p.i[2] = from;
  if (to) {                                          // [from, to)
    TORCH_CHECK(from < *to, "random_ expects 'from' to be less than 'to', but got from=", from, " >= to=", *to);
    check_random_range(self, from, *to - 1);
    p.i[3] = *to;
  } else if (from != std::numeric_limits<int64_t>::lowest()) {   // [from, random_max]
    int64_t to_inc = random_max(st);
    if (isFloatingType(st))
      TORCH_CHECK(from < to_inc, "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' casted "
                  "to dtype, but got from=", from, " > to_inc=", to_inc);
    check_random_range(self, from, to_inc);
    p.i[3] = to_inc;
    p.i[4] = 1;
  } else {                                           // all 2^64 values
    TORCH_CHECK(st == kLong || st == kDouble || st == kFloat || st == kBFloat16,
                "random_full_64_bits_range_kernel handles only int64, double, float and bfloat16");
    p.i[3] = std::numeric_limits<int64_t>::max();
    p.i[4] = 1;
  }
  rand_fill(TPU_OP_RAND_INT, self, gen, p);
  return self;
}
static at::Tensor& random_to(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) { return random_from(self, 0, to, gen); }
static at::Tensor& random_all(at::Tensor& self, std::optional<at::Generator> gen) { return random_from(self, 0, std::nullopt, gen); }

static std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  auto mask = at::empty(input.sizes(), input.options().dtype(kBool));
  if (!train.has_value() || *train) {
    // PyTorch scales by a float (input * mask * (1 / (1 - p))), which an integer tensor cannot hold.
    TORCH_CHECK(isFloatingType(input.scalar_type()), "result type Float can't be cast to the desired output type ",
                input.scalar_type());
    if (p >= 1.0) { mask.zero_(); auto z = at::empty(input.sizes(), input.options()); z.zero_(); return {z, mask}; }
    bernoulli_f(mask, 1.0 - p, std::nullopt);
    auto out = at::empty(input.sizes(), input.options());
    ew(TPU_OP_MUL, out, {input, mask}, input.scalar_type());
    ew(TPU_OP_MUL, out, {out, wrap(1.0 / (1.0 - p))}, input.scalar_type());
    return {out, mask};
  }
  mask.fill_(true);
  auto out = at::empty(input.sizes(), input.options());
  device_copy(out, input);
  return {out, mask};
}

static at::Tensor native_dropout_backward(const at::Tensor& grad, const at::Tensor& mask, double scale) {
  auto out = at::empty(grad.sizes(), grad.options());
  ew(TPU_OP_MUL, out, {grad, mask}, grad.scalar_type());
  ew(TPU_OP_MUL, out, {out, wrap(scale)}, grad.scalar_type());
  return out;
}

// ---------------------------------------------------------------- convolution, pooling, batch norm
static int64_t pack2(int64_t h, int64_t w) {
  TORCH_CHECK(h >= 0 && w >= 0 && h < 65536 && w < 65536, "tpu convolution/pooling parameters must be in [0, 65535]");
  return h | (w << 16);
}
static int64_t at2(c10::IntArrayRef v, size_t i, int64_t dflt) { return v.empty() ? dflt : v[v.size() == 1 ? 0 : i]; }

// Window parameters (kh, kw, stride, padding, dilation) in the runtime's packed form.
static tpu_params win_params(int64_t kh, int64_t kw, c10::IntArrayRef st, c10::IntArrayRef pad, c10::IntArrayRef dil,
                             bool one_d) {
  tpu_params p{};
  p.i[0] = pack2(kh, kw);
  p.i[1] = one_d ? pack2(1, at2(st, 0, 1)) : pack2(at2(st, 0, 1), at2(st, 1, 1));
  p.i[2] = one_d ? pack2(0, at2(pad, 0, 0)) : pack2(at2(pad, 0, 0), at2(pad, 1, 0));
  p.i[3] = one_d ? pack2(1, at2(dil, 0, 1)) : pack2(at2(dil, 0, 1), at2(dil, 1, 1));
  return p;
}
static int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) { return (in + 2 * p - d * (k - 1) - 1) / s + 1; }

// Transposed and 3-d convolutions are not native yet: they run through the
// counted CPU fallback (warned once, off with TORCH_TPU_CPU_FALLBACK=0).
// convolution_overrideable has no CPU kernel for the boxed fallback to call,
// so the fallback calls CPU's convolution here.
static bool conv_native(const at::Tensor& input, bool transposed) {
  return !transposed && (input.dim() == 3 || input.dim() == 4);
}
static at::Tensor convolution_fallback(const at::Tensor& input, const at::Tensor& weight,
                                       const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                       c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                       c10::IntArrayRef output_padding, int64_t groups) {
  note_cpu_fallback("aten::convolution_overrideable");
  std::optional<at::Tensor> b;
  if (bias && bias->defined()) b = bias->cpu();
  return at::convolution(input.cpu(), weight.cpu(), b, stride, padding, dilation, transposed, output_padding, groups)
      .to(input.device());
}

static at::Tensor convolution(const at::Tensor& input_, const at::Tensor& weight_, const std::optional<at::Tensor>& bias,
                              c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                              c10::IntArrayRef output_padding, int64_t groups) {
  if (!conv_native(input_, transposed))
    return convolution_fallback(input_, weight_, bias, stride, padding, dilation, transposed, output_padding, groups);
  const bool one_d = input_.dim() == 3;
  at::Tensor x = one_d ? input_.unsqueeze(2) : input_, w = one_d ? weight_.unsqueeze(2) : weight_;
  const int64_t N = x.size(0), C = x.size(1), O = w.size(0), kh = w.size(2), kw = w.size(3);
  TORCH_CHECK(groups > 0 && C % groups == 0 && O % groups == 0 && w.size(1) * groups == C,
              "Given groups=", groups, ", weight of size ", weight_.sizes(), ", expected input", input_.sizes(),
              " to have ", w.size(1) * groups, " channels, but got ", C, " channels instead");
  tpu_params p = win_params(kh, kw, stride, padding, dilation, one_d);
  const int64_t sh = p.i[1] & 0xffff, sw = p.i[1] >> 16, ph = p.i[2] & 0xffff, pw = p.i[2] >> 16;
  const int64_t dh = p.i[3] & 0xffff, dw = p.i[3] >> 16;
  const int64_t OH = conv_out(x.size(2), kh, sh, ph, dh), OW = conv_out(x.size(3), kw, sw, pw, dw);
  TORCH_CHECK(OH > 0 && OW > 0, "Calculated output size is too small for the input size ", input_.sizes());
  const int64_t G = groups, Cg = C / G, Og = O / G, K = Cg * kh * kw, L = OH * OW;
  at::Tensor out = at::empty({N, O, OH, OW}, x.options());
  at::Tensor cols = at::empty({N, K, L}, x.options());
  at::Tensor wm = w.reshape({O, K});
  for (int64_t g = 0; g < G; g++) {
    at::Tensor xg = x.narrow(1, g * Cg, Cg);
    tpu_tensor ts[2] = {desc(cols), desc(xg)};
    submit(TPU_OP_IM2COL, ts, 2, p);
    at::Tensor og = out.narrow(1, g * Og, Og), wg = wm.narrow(0, g * Og, Og);
    tpu_tensor o3 = as3(og, N, Og, L, og.stride(0), og.stride(1), 1);
    tpu_tensor a3 = as3(wg, N, Og, K, 0, wg.stride(0), wg.stride(1));
    if (bias.has_value() && bias->defined()) {
      at::Tensor bg = bias->narrow(0, g * Og, Og);
      gemm(out, o3, a3, bat3(cols), &bg, as3(bg, N, Og, L, 0, bg.stride(0), 0), 1.0, 1.0);
    } else {
      gemm(out, o3, a3, bat3(cols), nullptr, {}, 1.0, 0.0);
    }
  }
  return one_d ? out.squeeze(2) : out;
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(const at::Tensor& grad_, const at::Tensor& input_,
    const at::Tensor& weight_, c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> mask) {
  if (!conv_native(input_, transposed)) {
    note_cpu_fallback("aten::convolution_backward_overrideable");
    std::vector<int64_t> bias_sizes{weight_.size(transposed ? 1 : 0) * (transposed ? groups : 1)};
    auto [gi, gw, gb] = at::convolution_backward(grad_.cpu(), input_.cpu(), weight_.cpu(),
        mask[2] ? std::optional<c10::IntArrayRef>(bias_sizes) : std::nullopt, stride, padding, dilation, transposed,
        output_padding, groups, mask);
    auto back = [&](const at::Tensor& t) { return t.defined() ? t.to(input_.device()) : t; };
    return {back(gi), back(gw), back(gb)};
  }
  const bool one_d = input_.dim() == 3;
  at::Tensor x = one_d ? input_.unsqueeze(2) : input_, w = one_d ? weight_.unsqueeze(2) : weight_;
  at::Tensor gy = (one_d ? grad_.unsqueeze(2) : grad_).contiguous();
  const int64_t N = x.size(0), C = x.size(1), O = w.size(0), kh = w.size(2), kw = w.size(3);
  const int64_t OH = gy.size(2), OW = gy.size(3), G = groups, Cg = C / G, Og = O / G, K = Cg * kh * kw, L = OH * OW;
  tpu_params p = win_params(kh, kw, stride, padding, dilation, one_d);
  at::Tensor gx, gw, gb;
  if (mask[0]) gx = at::empty(x.sizes(), x.options());
  if (mask[1]) gw = at::empty({O, K}, w.options());
  if (mask[2]) gb = gy.sum({0, 2, 3});
  at::Tensor wm = w.reshape({O, K});
  at::Tensor cols = at::empty({N, K, L}, x.options());
  at::Tensor gy3 = gy.view({N, O, L});
  for (int64_t g = 0; g < G; g++) {
    at::Tensor gyg = gy3.narrow(1, g * Og, Og);
    if (mask[1]) {      // dW_g = sum_n gy_g[n] @ cols_g[n]^T
      at::Tensor xg = x.narrow(1, g * Cg, Cg);
      tpu_tensor ts[2] = {desc(cols), desc(xg)};
      submit(TPU_OP_IM2COL, ts, 2, p);
      at::Tensor part = at::empty({N, Og, K}, x.options());
      gemm(part, bat3(part), bat3(gyg), as3(cols, N, L, K, cols.stride(0), 1, cols.stride(1)), nullptr, {}, 1.0, 0.0);
      gw.narrow(0, g * Og, Og).copy_(part.sum(0));
    }
    if (mask[0]) {      // dcols = W_g^T @ gy_g, then fold windows back
      at::Tensor wg = wm.narrow(0, g * Og, Og);
      gemm(cols, bat3(cols), as3(wg, N, K, Og, 0, wg.stride(1), wg.stride(0)), bat3(gyg), nullptr, {}, 1.0, 0.0);
      at::Tensor gxg = gx.narrow(1, g * Cg, Cg);
      tpu_tensor ts[2] = {desc(gxg), desc(cols)};
      submit(TPU_OP_COL2IM, ts, 2, p);
    }
  }
  if (gw.defined()) gw = gw.view(w.sizes());
  if (one_d) {
    if (gx.defined()) gx = gx.squeeze(2);
    if (gw.defined()) gw = gw.squeeze(2);
  }
  return {gx, gw, gb};
}

static int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  int64_t o = (in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0)) / s + 1;
  if (ceil_mode && (o - 1) * s >= in + p) o--;
  return o;
}

static std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(const at::Tensor& input, c10::IntArrayRef ks,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode) {
  TORCH_CHECK(input.dim() == 3 || input.dim() == 4, "non-empty 3D or 4D (batch mode) tensor expected for input");
  TORCH_CHECK(ks.size() == 1 || ks.size() == 2, "max_pool2d: kernel_size must either be a single int, or a tuple of two ints");
  at::Tensor x = input.dim() == 3 ? input.unsqueeze(0) : input;
  int64_t kh = ks[0], kw = ks.size() == 2 ? ks[1] : ks[0];
  c10::IntArrayRef st = stride.empty() ? ks : stride;
  tpu_params p = win_params(kh, kw, st, padding, dilation, false);
  int64_t sh = p.i[1] & 0xffff, sw = p.i[1] >> 16, ph = p.i[2] & 0xffff, pw = p.i[2] >> 16, dh = p.i[3] & 0xffff, dw = p.i[3] >> 16;
  TORCH_CHECK(ph <= kh / 2 && pw <= kw / 2, "pad should be at most half of effective kernel size, but got pad=", ph,
              ", kernel_size=", kh, " and dilation=", dh);
  int64_t OH = pool_out(x.size(2), kh, sh, ph, dh, ceil_mode), OW = pool_out(x.size(3), kw, sw, pw, dw, ceil_mode);
  TORCH_CHECK(OH > 0 && OW > 0, "max_pool2d: output size is too small");
  at::Tensor y = at::empty({x.size(0), x.size(1), OH, OW}, x.options());
  at::Tensor ix = at::empty({x.size(0), x.size(1), OH, OW}, x.options().dtype(kLong));
  if (y.numel() > 0) {
    tpu_tensor ts[3] = {desc(y), desc(ix), desc(x)};
    submit(TPU_OP_MAXPOOL2D, ts, 3, p);
  }
  if (input.dim() == 3) return {y.squeeze(0), ix.squeeze(0)};
  return {y, ix};
}

static at::Tensor max_pool2d_with_indices_backward(const at::Tensor& grad, const at::Tensor& input, c10::IntArrayRef ks,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode, const at::Tensor& indices) {
  const bool three = input.dim() == 3;
  at::Tensor x = three ? input.unsqueeze(0) : input;
  at::Tensor g = three ? grad.unsqueeze(0) : grad, ix = three ? indices.unsqueeze(0) : indices;
  int64_t kh = ks[0], kw = ks.size() == 2 ? ks[1] : ks[0];
  tpu_params p = win_params(kh, kw, stride.empty() ? ks : stride, padding, dilation, false);
  at::Tensor dx = at::empty(x.sizes(), x.options());
  if (dx.numel() > 0) {
    tpu_tensor ts[3] = {desc(dx), desc(g), desc(ix)};
    submit(TPU_OP_MAXPOOL2D_BWD, ts, 3, p);
  }
  return three ? dx.squeeze(0) : dx;
}

// Batch norm, composed from native ops (per-channel statistics, then one fused affine pass).
static std::vector<int64_t> chan_shape(const at::Tensor& x) {
  std::vector<int64_t> s(x.dim(), 1);
  s[1] = x.size(1);
  return s;
}
static std::vector<int64_t> red_dims(const at::Tensor& x) {
  std::vector<int64_t> d{0};
  for (int64_t i = 2; i < x.dim(); i++) d.push_back(i);
  return d;
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(const at::Tensor& x,
    const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& b, const std::optional<at::Tensor>& rm,
    const std::optional<at::Tensor>& rv, bool training, double momentum, double eps) {
  TORCH_CHECK(x.dim() >= 2, "batch_norm: expected at least 2-d input, got ", x.dim(), "-d");
  const int64_t C = x.size(1);
  auto cs = chan_shape(x);
  bool has_rm = rm.has_value() && rm->defined(), has_rv = rv.has_value() && rv->defined();
  at::Tensor mean, invstd;
  if (training) {
    auto dims = red_dims(x);
    int64_t n = x.numel() / std::max<int64_t>(C, 1);
    TORCH_CHECK(n > 1, "Expected more than 1 value per channel when training, got input size ", x.sizes());
    mean = x.mean(dims);
    at::Tensor var = x.var(dims, /*correction=*/0, false);
    invstd = var.add(eps).rsqrt();
    at::NoGradGuard ng;
    if (has_rm) rm->mul_(1 - momentum).add_(mean, momentum);
    if (has_rv) rv->mul_(1 - momentum).add_(var.mul(double(n) / double(n - 1)), momentum);
  } else {
    TORCH_CHECK(has_rm && has_rv, "running_mean and running_var must be defined in evaluation mode");
    mean = *rm;
    invstd = rv->add(eps).rsqrt();
  }
  at::Tensor scale = (w.has_value() && w->defined()) ? invstd.mul(*w) : invstd;
  at::Tensor shift = (b.has_value() && b->defined()) ? b->sub(mean.mul(scale)) : mean.mul(scale).neg();
  at::Tensor y = at::empty(x.sizes(), x.options());
  at::Tensor sv = scale.view(cs), hv = shift.view(cs);
  ew(TPU_OP_ADDCMUL, y, {hv, x, sv}, x.scalar_type(), tpu_params{{1.0}});
  if (!training) return {y, at::empty({0}, x.options()), at::empty({0}, x.options())};
  return {y, mean, invstd};
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_backward(const at::Tensor& g, const at::Tensor& x,
    const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& rm, const std::optional<at::Tensor>& rv,
    const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_invstd, bool train, double eps,
    std::array<bool, 3> mask) {
  auto cs = chan_shape(x);
  auto dims = red_dims(x);
  at::Tensor mean = train ? *save_mean : *rm;
  at::Tensor invstd = train ? *save_invstd : rv->add(eps).rsqrt();
  at::Tensor xhat = x.sub(mean.view(cs)).mul(invstd.view(cs));
  at::Tensor gx, gw, gb;
  at::Tensor gsum = g.sum(dims);
  at::Tensor gxhat = g.mul(xhat).sum(dims);
  if (mask[1]) gw = gxhat;
  if (mask[2]) gb = gsum;
  if (mask[0]) {
    at::Tensor k = (w.has_value() && w->defined()) ? invstd.mul(*w) : invstd;
    if (train) {
      int64_t n = x.numel() / std::max<int64_t>(x.size(1), 1);
      at::Tensor mg = gsum.div(double(n)), mgx = gxhat.div(double(n));
      gx = g.sub(mg.view(cs)).sub(xhat.mul(mgx.view(cs))).mul(k.view(cs));
    } else {
      gx = g.mul(k.view(cs));
    }
  }
  return {gx, gw, gb};
}

// masked_select: count on the device, read the count (a sync, as on any
// accelerator: the output size depends on the data), then compact.
static at::Tensor masked_select(const at::Tensor& self, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == kBool, "masked_select: expected BoolTensor for mask");
  auto shape = at::infer_size(self.sizes(), mask.sizes());
  at::Tensor x = self.expand(shape), m = mask.expand(shape);
  std::vector<int64_t> all(shape.size());
  for (size_t i = 0; i < all.size(); i++) all[i] = static_cast<int64_t>(i);
  int64_t n = shape.empty() ? m.to(kLong).item<int64_t>() : m.sum(all, false, kLong).item<int64_t>();
  at::Tensor out = at::empty({n}, self.options());
  if (n == 0) return out;
  tpu_tensor ts[3] = {desc(out), desc1d(x), desc1d(m)};
  submit(TPU_OP_MASKED_SELECT, ts, 3, {});
  return out;
}

// mse_loss from native ops: (x - y)^2, reduced.
static at::Tensor& mse_loss_out(const at::Tensor& x, const at::Tensor& y, int64_t reduction, at::Tensor& out) {
  at::Tensor d = x.sub(y);
  at::Tensor sq = d.mul(d);
  if (reduction == 0) { at::native::resize_output(out, sq.sizes()); out.copy_(sq); return out; }
  at::native::resize_output(out, {});
  return reduce(reduction == 1 ? TPU_OP_MEAN : TPU_OP_SUM, sq, std::nullopt, false, out);
}
static at::Tensor& mse_loss_backward_out(const at::Tensor& g, const at::Tensor& x, const at::Tensor& y, int64_t reduction,
                                         at::Tensor& gi) {
  double scale = reduction == 1 ? 2.0 / double(std::max<int64_t>(x.numel(), 1)) : 2.0;
  at::Tensor r = x.sub(y).mul(g).mul(scale);
  at::native::resize_output(gi, r.sizes());
  gi.copy_(r);
  return gi;
}
static at::Tensor mse_loss_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& y, int64_t reduction) {
  auto gi = at::empty({0}, x.options());
  return mse_loss_backward_out(g, x, y, reduction, gi);
}

// ---------------------------------------------------------------- cat
static at::Tensor& cat_out(const at::ITensorListRef& tensors, int64_t dim, at::Tensor& out) {
  auto mat = tensors.materialize();
  TORCH_CHECK(!mat.empty(), "torch.cat(): expected a non-empty list of Tensors");
  // Skip legacy empty 1-d tensors, as PyTorch does.
  const at::Tensor* ref = nullptr;
  for (const at::Tensor& t : mat) if (!(t.dim() == 1 && t.numel() == 0)) { ref = &t; break; }
  if (!ref) { at::native::resize_output(out, {0}); return out; }
  int64_t d = at::maybe_wrap_dim(dim, ref->dim());
  std::vector<int64_t> shape(ref->sizes().begin(), ref->sizes().end());
  int64_t total = 0;
  for (const at::Tensor& t : mat) {
    if (t.dim() == 1 && t.numel() == 0) continue;
    TORCH_CHECK(t.dim() == ref->dim(), "Tensors must have same number of dimensions: got ", ref->dim(), " and ", t.dim());
    for (int64_t i = 0; i < t.dim(); i++)
      TORCH_CHECK(i == d || t.size(i) == shape[i], "Sizes of tensors must match except in dimension ", d,
                  ". Expected size ", shape[i], " but got size ", t.size(i), " for tensor number 1 in the list.");
    total += t.size(d);
  }
  shape[d] = total;
  at::native::resize_output(out, shape);
  int64_t off = 0;
  for (const at::Tensor& t : mat) {
    if (t.dim() == 1 && t.numel() == 0) continue;
    int64_t n = t.size(d);
    if (n > 0) device_copy(out.narrow(d, off, n), t);
    off += n;
  }
  return out;
}

// ---------------------------------------------------------------- rnn cells
// On an accelerator PyTorch runs nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell
// as two gate GEMMs per step plus one fused cell (_thnn_fused_*_cell), whose
// backward autograd calls when it is not itself recording (create_graph runs
// PyTorch's composite _thnn_differentiable_*_backward instead). Each cell is
// one runtime op; inputs go with their own strides.
static const char* const kCellArgs[] = {"input_gates", "hidden_gates", "prev_hidden", "input_bias", "hidden_bias"};

// Shapes as PyTorch's fused cells check them; returns whether biases are given.
static bool check_cell(const char* fn, const at::Tensor& ig, const at::Tensor& hg, const at::Tensor& prev,
                       const std::optional<at::Tensor>& ib, const std::optional<at::Tensor>& hb, int64_t factor) {
  TORCH_CHECK(ig.dim() == 2, fn, ": expected input_gates to be 2-d [batch, ", factor, " * hidden], got size ", ig.sizes());
  TORCH_CHECK(hg.sizes().equals(ig.sizes()), fn, ": expected hidden_gates of size ", ig.sizes(), ", got ", hg.sizes());
  TORCH_CHECK(ig.size(1) % factor == 0, fn, ": input_gates has ", ig.size(1), " columns, not a multiple of ", factor);
  const int64_t B = ig.size(0), H = ig.size(1) / factor;
  TORCH_CHECK(prev.dim() == 2 && prev.size(0) == B && prev.size(1) == H, fn, ": expected ", kCellArgs[2], " of size [",
              B, ", ", H, "], got ", prev.sizes());
  const bool hi = ib.has_value() && ib->defined(), hh = hb.has_value() && hb->defined();
  TORCH_CHECK(hi == hh, fn, ": input_bias and hidden_bias must be given together");
  const at::Tensor* ts[5] = {&ig, &hg, &prev, hi ? &*ib : nullptr, hh ? &*hb : nullptr};
  for (int k = 0; k < 5; k++) {
    if (!ts[k]) continue;
    if (k >= 3)
      TORCH_CHECK(ts[k]->dim() == 1 && ts[k]->size(0) == ig.size(1), fn, ": expected ", kCellArgs[k], " of size [",
                  ig.size(1), "], got ", ts[k]->sizes());
    TORCH_CHECK(ts[k]->device() == ig.device(), "Expected all tensors to be on the same device, but found at least "
                "two devices, ", ig.device(), " and ", ts[k]->device(), "!");
    TORCH_CHECK(ts[k]->scalar_type() == ig.scalar_type(), fn, ": expected ", kCellArgs[k], " to have dtype ",
                ig.scalar_type(), ", got ", ts[k]->scalar_type());
  }
  return hi;
}

static void check_same(const char* fn, const char* what, const at::Tensor& t, c10::IntArrayRef size, const at::Tensor& like) {
  TORCH_CHECK(t.sizes().equals(size), fn, ": expected ", what, " of size ", size, ", got ", t.sizes());
  TORCH_CHECK(t.device() == like.device(), "Expected all tensors to be on the same device, but found at least two "
              "devices, ", like.device(), " and ", t.device(), "!");
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), fn, ": expected ", what, " to have dtype ", like.scalar_type(),
              ", got ", t.scalar_type());
}

// An absent optional operand: a host scalar 0 of the cell's dtype.
static tpu_tensor absent(const at::Tensor& like) { return tpu_tensor_scalar_f(0, to_tpu_dtype(like.scalar_type())); }

static std::tuple<at::Tensor, at::Tensor, at::Tensor> thnn_fused_lstm_cell(const at::Tensor& ig, const at::Tensor& hg,
    const at::Tensor& cx, const std::optional<at::Tensor>& ib, const std::optional<at::Tensor>& hb) {
  const bool bias = check_cell("_thnn_fused_lstm_cell", ig, hg, cx, ib, hb, 4);
  at::Tensor hy = at::empty(cx.sizes(), cx.options()), cy = at::empty(cx.sizes(), cx.options());
  at::Tensor ws = at::empty(ig.sizes(), ig.options());
  tpu_tensor ts[8] = {desc(hy), desc(cy), desc(ws), desc(ig), desc(hg), desc(cx)};
  if (bias) { ts[6] = desc(*ib); ts[7] = desc(*hb); }
  submit(TPU_OP_LSTM_CELL, ts, bias ? 8 : 6, tpu_params{});
  return {hy, cy, ws};
}

// Returns (grad_gates, grad_cx, grad_bias); grad_gates is the gradient of
// both gate inputs, grad_bias of both biases (PyTorch's composite
// _thnn_fused_lstm_cell_backward hands each out twice).
static std::tuple<at::Tensor, at::Tensor, at::Tensor> thnn_fused_lstm_cell_backward_impl(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& ws, bool has_bias) {
  const char* fn = "_thnn_fused_lstm_cell_backward";
  const bool dh = grad_hy.has_value() && grad_hy->defined(), dc = grad_cy.has_value() && grad_cy->defined();
  if (!dh && !dc) return {};
  TORCH_CHECK(cx.dim() == 2, fn, ": expected cx to be 2-d, got size ", cx.sizes());
  const int64_t B = cx.size(0), H = cx.size(1);
  check_same(fn, "cy", cy, cx.sizes(), cx);
  check_same(fn, "workspace", ws, {B, 4 * H}, cx);
  if (dh) check_same(fn, "grad_hy", *grad_hy, cx.sizes(), cx);
  if (dc) check_same(fn, "grad_cy", *grad_cy, cx.sizes(), cx);
  at::Tensor gg = at::empty({B, 4 * H}, ws.options()), gcx = at::empty(cx.sizes(), cx.options());
  at::Tensor gb = has_bias ? at::empty({4 * H}, ws.options()) : at::Tensor();
  tpu_tensor ts[8] = {desc(gg), desc(gcx), has_bias ? desc(gb) : absent(cx), dh ? desc(*grad_hy) : absent(cx),
                      dc ? desc(*grad_cy) : absent(cx), desc(cx), desc(cy), desc(ws)};
  submit(TPU_OP_LSTM_CELL_BWD, ts, 8, tpu_params{});
  return {gg, gcx, gb};
}

static std::tuple<at::Tensor, at::Tensor> thnn_fused_gru_cell(const at::Tensor& ig, const at::Tensor& hg,
    const at::Tensor& hx, const std::optional<at::Tensor>& ib, const std::optional<at::Tensor>& hb) {
  const bool bias = check_cell("_thnn_fused_gru_cell", ig, hg, hx, ib, hb, 3);
  at::Tensor hy = at::empty(hx.sizes(), hx.options());
  at::Tensor ws = at::empty({hx.size(0), hx.size(1) * 5}, hx.options());
  tpu_tensor ts[7] = {desc(hy), desc(ws), desc(ig), desc(hg), desc(hx)};
  if (bias) { ts[5] = desc(*ib); ts[6] = desc(*hb); }
  submit(TPU_OP_GRU_CELL, ts, bias ? 7 : 5, tpu_params{});
  return {hy, ws};
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> thnn_fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& ws, bool has_bias) {
  const char* fn = "_thnn_fused_gru_cell_backward";
  TORCH_CHECK(grad_hy.dim() == 2, fn, ": expected grad_hy to be 2-d, got size ", grad_hy.sizes());
  const int64_t B = grad_hy.size(0), H = grad_hy.size(1);
  check_same(fn, "workspace", ws, {B, 5 * H}, grad_hy);
  auto opt = ws.options();
  at::Tensor gi = at::empty({B, 3 * H}, opt), gh = at::empty({B, 3 * H}, opt), ghx = at::empty({B, H}, opt);
  at::Tensor gib, ghb;
  if (has_bias) { gib = at::empty({3 * H}, opt); ghb = at::empty({3 * H}, opt); }
  tpu_tensor ts[7] = {desc(gi), desc(gh), desc(ghx), has_bias ? desc(gib) : absent(ws), has_bias ? desc(ghb) : absent(ws),
                      desc(grad_hy), desc(ws)};
  submit(TPU_OP_GRU_CELL_BWD, ts, 7, tpu_params{});
  return {gi, gh, ghx, gib, ghb};
}

// ---------------------------------------------------------------- CPU fallback
namespace {
std::mutex g_fb_mu;
std::map<std::string, int64_t>& fb_counts() {
  static std::map<std::string, int64_t> m;
  return m;
}
std::atomic<int> g_fb_enabled{-1};
bool fb_enabled_now() {
  int v = g_fb_enabled.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("TORCH_TPU_CPU_FALLBACK");
    v = (e && std::string(e) == "0") ? 0 : 1;
    g_fb_enabled.store(v);
  }
  return v == 1;
}

} // namespace

void note_cpu_fallback(const std::string& full) {
  TORCH_CHECK_NOT_IMPLEMENTED(fb_enabled_now(), "The operator '", full,
      "' is not currently implemented for the tpu device, and the CPU fallback is disabled "
      "(TORCH_TPU_CPU_FALLBACK=0). Unset it to run this op on the CPU.");
  bool first;
  {
    std::lock_guard<std::mutex> g(g_fb_mu);
    first = fb_counts()[full]++ == 0;
  }
  if (first)
    TORCH_WARN("The operator '", full, "' is not currently supported on the tpu backend and will fall back to run "
               "on the CPU. This may have performance implications.");
}

namespace {
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  note_cpu_fallback(name.name + (name.overload_name.empty() ? "" : "." + name.overload_name));
  at::native::cpu_fallback(op, stack);
}
} // namespace

std::tuple<std::vector<std::string>, std::vector<int64_t>> fallback_counts() {
  std::lock_guard<std::mutex> g(g_fb_mu);
  std::vector<std::string> n;
  std::vector<int64_t> c;
  for (auto& [k, v] : fb_counts()) { n.push_back(k); c.push_back(v); }
  return {n, c};
}
void reset_fallback_counts() {
  std::lock_guard<std::mutex> g(g_fb_mu);
  fb_counts().clear();
}
void set_fallback_enabled(bool on) { g_fb_enabled.store(on ? 1 : 0); }
bool fallback_enabled() { return fb_enabled_now(); }

} // namespace at::tpu

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&at::tpu::cpu_fallback>());
}

// Answered above the autograd layer too: the op is CompositeImplicitAutograd,
// and the tensors' highest key is AutogradPrivateUse1 even under no_grad.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(at::tpu::has_compatible_shallow_copy_type));
}

// The op table: one line per registered kernel.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace at::tpu;
  // memory, views, copies
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage", TORCH_FN(set_source_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_source_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("fill_.Scalar", TORCH_FN(fill_s));
  m.impl("fill_.Tensor", TORCH_FN(fill_t));
  m.impl("zero_", TORCH_FN(zero_));
  m.impl("arange.start_out", TORCH_FN(arange_out));
  m.impl("cat.out", TORCH_FN(cat_out));
  m.impl("linspace.out", TORCH_FN(linspace_out));
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("isnan", TORCH_FN(isnan));
  m.impl("masked_select", TORCH_FN(masked_select));
  m.impl("mse_loss.out", TORCH_FN(mse_loss_out));
  m.impl("mse_loss_backward", TORCH_FN(mse_loss_backward));
  m.impl("mse_loss_backward.grad_input", TORCH_FN(mse_loss_backward_out));
  m.impl("isposinf.out", TORCH_FN(isposinf_out)); m.impl("isneginf.out", TORCH_FN(isneginf_out));
  m.impl("tril.out", TORCH_FN(tril_out)); m.impl("triu.out", TORCH_FN(triu_out));
  m.impl("hardtanh", TORCH_FN(hardtanh)); m.impl("hardtanh.out", TORCH_FN(hardtanh_out));
  m.impl("hardtanh_", TORCH_FN(hardtanh_));
  // unary
  m.impl("exp.out", TORCH_FN(exp_out)); m.impl("exp2.out", TORCH_FN(exp2_out)); m.impl("expm1.out", TORCH_FN(expm1_out));
  m.impl("log.out", TORCH_FN(log_out)); m.impl("log2.out", TORCH_FN(log2_out)); m.impl("log10.out", TORCH_FN(log10_out));
  m.impl("log1p.out", TORCH_FN(log1p_out)); m.impl("sqrt.out", TORCH_FN(sqrt_out)); m.impl("rsqrt.out", TORCH_FN(rsqrt_out));
  m.impl("reciprocal.out", TORCH_FN(reciprocal_out)); m.impl("sin.out", TORCH_FN(sin_out)); m.impl("cos.out", TORCH_FN(cos_out));
  m.impl("tan.out", TORCH_FN(tan_out)); m.impl("asin.out", TORCH_FN(asin_out)); m.impl("acos.out", TORCH_FN(acos_out));
  m.impl("atan.out", TORCH_FN(atan_out)); m.impl("sinh.out", TORCH_FN(sinh_out)); m.impl("cosh.out", TORCH_FN(cosh_out));
  m.impl("tanh.out", TORCH_FN(tanh_out)); m.impl("asinh.out", TORCH_FN(asinh_out)); m.impl("acosh.out", TORCH_FN(acosh_out));
  m.impl("atanh.out", TORCH_FN(atanh_out)); m.impl("erf.out", TORCH_FN(erf_out)); m.impl("erfc.out", TORCH_FN(erfc_out));
  m.impl("sigmoid.out", TORCH_FN(sigmoid_out)); m.impl("silu.out", TORCH_FN(silu_out)); m.impl("mish.out", TORCH_FN(mish_out));
  m.impl("hardsigmoid.out", TORCH_FN(hardsigmoid_out)); m.impl("hardswish.out", TORCH_FN(hardswish_out));
  m.impl("neg.out", TORCH_FN(neg_out)); m.impl("abs.out", TORCH_FN(abs_out)); m.impl("sign.out", TORCH_FN(sign_out));
  m.impl("floor.out", TORCH_FN(floor_out)); m.impl("ceil.out", TORCH_FN(ceil_out)); m.impl("round.out", TORCH_FN(round_out));
  m.impl("trunc.out", TORCH_FN(trunc_out)); m.impl("frac.out", TORCH_FN(frac_out));
  m.impl("bitwise_not.out", TORCH_FN(bitwise_not_out)); m.impl("logical_not.out", TORCH_FN(logical_not_out));
  m.impl("gelu.out", TORCH_FN(gelu_out)); m.impl("relu", TORCH_FN(relu)); m.impl("relu_", TORCH_FN(relu_));
  m.impl("leaky_relu.out", TORCH_FN(leaky_relu_out)); m.impl("softplus.out", TORCH_FN(softplus_out));
  m.impl("elu.out", TORCH_FN(elu_out)); m.impl("nan_to_num.out", TORCH_FN(nan_to_num_out));
  m.impl("clamp.out", TORCH_FN(clamp_out)); m.impl("clamp_min.out", TORCH_FN(clamp_min_out));
  m.impl("clamp_max.out", TORCH_FN(clamp_max_out)); m.impl("clamp.Tensor_out", TORCH_FN(clamp_t_out));
  m.impl("clamp_min.Tensor_out", TORCH_FN(clamp_min_t_out)); m.impl("clamp_max.Tensor_out", TORCH_FN(clamp_max_t_out));
  // binary
  m.impl("add.out", TORCH_FN(add_out)); m.impl("sub.out", TORCH_FN(sub_out)); m.impl("mul.out", TORCH_FN(mul_out));
  m.impl("div.out", TORCH_FN(div_out)); m.impl("div.out_mode", TORCH_FN(div_mode_out));
  m.impl("pow.Tensor_Tensor_out", TORCH_FN(pow_tt_out)); m.impl("pow.Tensor_Scalar_out", TORCH_FN(pow_ts_out));
  m.impl("pow.Scalar_out", TORCH_FN(pow_st_out));
  m.impl("maximum.out", TORCH_FN(maximum_out)); m.impl("minimum.out", TORCH_FN(minimum_out));
  m.impl("fmod.Tensor_out", TORCH_FN(fmod_out)); m.impl("remainder.Tensor_out", TORCH_FN(remainder_out));
  m.impl("atan2.out", TORCH_FN(atan2_out));
  m.impl("bitwise_and.Tensor_out", TORCH_FN(bitwise_and_out)); m.impl("bitwise_or.Tensor_out", TORCH_FN(bitwise_or_out));
  m.impl("bitwise_xor.Tensor_out", TORCH_FN(bitwise_xor_out));
  m.impl("eq.Tensor_out", TORCH_FN(eq_out)); m.impl("ne.Tensor_out", TORCH_FN(ne_out)); m.impl("lt.Tensor_out", TORCH_FN(lt_out));
  m.impl("le.Tensor_out", TORCH_FN(le_out)); m.impl("gt.Tensor_out", TORCH_FN(gt_out)); m.impl("ge.Tensor_out", TORCH_FN(ge_out));
  m.impl("eq.Scalar_out", TORCH_FN(eq_s_out)); m.impl("ne.Scalar_out", TORCH_FN(ne_s_out)); m.impl("lt.Scalar_out", TORCH_FN(lt_s_out));
  m.impl("le.Scalar_out", TORCH_FN(le_s_out)); m.impl("gt.Scalar_out", TORCH_FN(gt_s_out)); m.impl("ge.Scalar_out", TORCH_FN(ge_s_out));
  m.impl("logical_and.out", TORCH_FN(logical_and_out)); m.impl("logical_or.out", TORCH_FN(logical_or_out));
  m.impl("logical_xor.out", TORCH_FN(logical_xor_out));
  m.impl("threshold_backward.grad_input", TORCH_FN(threshold_backward_out));
  m.impl("gelu_backward.grad_input", TORCH_FN(gelu_backward_out));
  m.impl("silu_backward.grad_input", TORCH_FN(silu_backward_out));
  m.impl("sigmoid_backward.grad_input", TORCH_FN(sigmoid_backward_out));
  m.impl("tanh_backward.grad_input", TORCH_FN(tanh_backward_out));
  m.impl("leaky_relu_backward.grad_input", TORCH_FN(leaky_relu_backward_out));
  m.impl("softplus_backward.grad_input", TORCH_FN(softplus_backward_out));
  m.impl("hardtanh_backward.grad_input", TORCH_FN(hardtanh_backward_out));
  m.impl("hardtanh_backward", TORCH_FN(hardtanh_backward));
  // ternary
  m.impl("addcmul.out", TORCH_FN(addcmul_out)); m.impl("addcdiv.out", TORCH_FN(addcdiv_out));
  m.impl("lerp.Scalar_out", TORCH_FN(lerp_s_out)); m.impl("lerp.Tensor_out", TORCH_FN(lerp_t_out));
  m.impl("where.self", TORCH_FN(where)); m.impl("where.self_out", TORCH_FN(where_out));
  m.impl("masked_fill_.Scalar", TORCH_FN(masked_fill_s)); m.impl("masked_fill_.Tensor", TORCH_FN(masked_fill_t));
  // reductions
  m.impl("sum.IntList_out", TORCH_FN(sum_out)); m.impl("mean.out", TORCH_FN(mean_out));
  m.impl("prod.int_out", TORCH_FN(prod_out)); m.impl("prod", TORCH_FN(prod));
  m.impl("amax.out", TORCH_FN(amax_out)); m.impl("amin.out", TORCH_FN(amin_out));
  m.impl("max", TORCH_FN(max_all)); m.impl("min", TORCH_FN(min_all));
  m.impl("argmax.out", TORCH_FN(argmax_out)); m.impl("argmin.out", TORCH_FN(argmin_out));
  m.impl("max.dim_max", TORCH_FN(max_dim_out)); m.impl("min.dim_min", TORCH_FN(min_dim_out));
  m.impl("var.correction", TORCH_FN(var_c)); m.impl("std.correction", TORCH_FN(std_c));
  m.impl("any.out", TORCH_FN(any_out)); m.impl("any.dims_out", TORCH_FN(any_dims_out)); m.impl("any.all_out", TORCH_FN(any_all_out));
  m.impl("all.out", TORCH_FN(all_out)); m.impl("all.dims_out", TORCH_FN(all_dims_out)); m.impl("all.all_out", TORCH_FN(all_all_out));
  m.impl("linalg_vector_norm.out", TORCH_FN(norm_out));
  m.impl("cumsum.out", TORCH_FN(cumsum_out)); m.impl("cumprod.out", TORCH_FN(cumprod_out));
  // matrix unit
  m.impl("mm.out", TORCH_FN(mm_out)); m.impl("addmm.out", TORCH_FN(addmm_out));
  m.impl("bmm.out", TORCH_FN(bmm_out)); m.impl("baddbmm.out", TORCH_FN(baddbmm_out));
  m.impl("addmv.out", TORCH_FN(addmv_out)); m.impl("dot", TORCH_FN(dot));
  // softmax, losses, norms
  m.impl("_softmax.out", TORCH_FN(softmax_out)); m.impl("_log_softmax.out", TORCH_FN(log_softmax_out));
  m.impl("_softmax_backward_data.out", TORCH_FN(softmax_backward_out));
  m.impl("_log_softmax_backward_data.out", TORCH_FN(log_softmax_backward_out));
  m.impl("nll_loss_forward.output", TORCH_FN(nll_loss_forward_out));
  m.impl("nll_loss_backward.grad_input", TORCH_FN(nll_loss_backward_out));
  m.impl("native_layer_norm", TORCH_FN(native_layer_norm));
  m.impl("native_layer_norm_backward", TORCH_FN(native_layer_norm_backward));
  // indexing
  m.impl("index_select", TORCH_FN(index_select)); m.impl("index_select.out", TORCH_FN(index_select_out));
  m.impl("gather.out", TORCH_FN(gather_out)); m.impl("scatter_add.out", TORCH_FN(scatter_add_out));
  m.impl("index_add.out", TORCH_FN(index_add_out));
  m.impl("embedding_dense_backward", TORCH_FN(embedding_dense_backward));
  // convolution, pooling, batch norm
  m.impl("convolution_overrideable", TORCH_FN(convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward));
  m.impl("max_pool2d_with_indices", TORCH_FN(max_pool2d_with_indices));
  m.impl("max_pool2d_with_indices_backward", TORCH_FN(max_pool2d_with_indices_backward));
  m.impl("native_batch_norm", TORCH_FN(native_batch_norm));
  m.impl("native_batch_norm_backward", TORCH_FN(native_batch_norm_backward));
  // random
  m.impl("uniform_", TORCH_FN(uniform_)); m.impl("normal_", TORCH_FN(normal_));
  m.impl("bernoulli_.float", TORCH_FN(bernoulli_f)); m.impl("bernoulli_.Tensor", TORCH_FN(bernoulli_t));
  m.impl("random_.from", TORCH_FN(random_from)); m.impl("random_.to", TORCH_FN(random_to)); m.impl("random_", TORCH_FN(random_all));
  m.impl("native_dropout", TORCH_FN(native_dropout));
  m.impl("native_dropout_backward", TORCH_FN(native_dropout_backward));
  // rnn cells
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(thnn_fused_lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(thnn_fused_lstm_cell_backward_impl));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(thnn_fused_gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(thnn_fused_gru_cell_backward));
}
