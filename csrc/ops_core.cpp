// ops_core.cpp - the core of the tpu ATen kernels: tensor descriptors, the
// dispatch point, the elementwise launch every op file shares, memory and
// views (empty, resize_, set_), fills, copies and device moves, cat, and the
// CPU fallback; with the registration of those ops.
//
// Each kernel only checks arguments, computes the output's shape and dtype,
// allocates, describes tensors to the runtime and hands the op to submit().
// No math.
#include "tpu_glue.h"
#include "complex_route.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/CPUGeneratorImpl.h>

#include <ATen/EmptyTensor.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <atomic>
#include <map>
#include <mutex>

namespace at::tpu {

// ---------------------------------------------------------------- descriptors
bool dtype_supported(c10::ScalarType st) {
  switch (st) {
    case kFloat:
    case kDouble:
    case kHalf:
    case kBFloat16:
    case kByte:
    case kChar:
    case kShort:
    case kInt:
    case kLong:
    case kBool:
    case kComplexFloat:
    case kComplexDouble:
      return true;
    default:
      return false;
  }
}

tpu_dtype to_tpu_dtype(c10::ScalarType st) {
  switch (st) {
    case kFloat:
      return TPU_F32;
    case kDouble:
      return TPU_F64;
    case kHalf:
      return TPU_F16;
    case kBFloat16:
      return TPU_BF16;
    case kByte:
      return TPU_U8;
    case kChar:
      return TPU_I8;
    case kShort:
      return TPU_I16;
    case kInt:
      return TPU_I32;
    case kLong:
      return TPU_I64;
    case kBool:
      return TPU_BOOL;
    case kComplexFloat:
      return TPU_C64;
    case kComplexDouble:
      return TPU_C128;
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "tpu does not support dtype ", st, " yet");
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
  TORCH_CHECK(t.device().is_privateuseone(),
              "Expected all tensors to be on the same device, but found at least two "
              "devices, tpu and ",
              t.device(), "!");
  tpu_tensor d = storage_desc(t);
  d.ndim = static_cast<int32_t>(t.dim());
  for (int64_t i = 0; i < t.dim(); i++) {
    d.sizes[i] = t.size(i);
    d.strides[i] = t.stride(i);
  }
  return d;
}

tpu_tensor desc_real(const at::Tensor& t) { return real_view(desc(t)); }

tpu_tensor real_view(tpu_tensor d) {
  if (!tpu_dtype_is_complex(static_cast<tpu_dtype>(d.dtype))) return d;
  TORCH_CHECK(d.ndim < TPU_MAX_DIMS, "tpu supports complex tensors of at most ", TPU_MAX_DIMS - 1, " dims");
  d.dtype = d.dtype == TPU_C64 ? TPU_F32 : TPU_F64;
  for (int k = 0; k < d.ndim; k++) d.strides[k] *= 2;
  d.sizes[d.ndim] = 2;
  d.strides[d.ndim] = 1;
  d.ndim++;
  d.offset *= 2;
  return d;
}

tpu_tensor desc_scalar(const c10::Scalar& s, c10::ScalarType compute) {
  if (isFloatingType(compute)) return tpu_tensor_scalar_f(s.toDouble(), TPU_F64);
  if (s.isFloatingPoint()) return tpu_tensor_scalar_f(s.toDouble(), TPU_F64);
  if (s.isBoolean()) return tpu_tensor_scalar_i(s.toBool(), TPU_I64);
  return tpu_tensor_scalar_i(s.toLong(), TPU_I64);
}

tpu_tensor desc1d(const at::Tensor& t) {
  tpu_tensor d = desc(t);
  if (d.ndim == 0) {
    d.ndim = 1;
    d.sizes[0] = 1;
    d.strides[0] = 1;
  }
  return d;
}

tpu_tensor operand(const at::Tensor& t, const at::Tensor& out, c10::ScalarType compute) {
  if (t.device().is_cpu()) {
    TORCH_CHECK(t.dim() == 0, "Expected all tensors to be on the same device, but found at least two devices, ",
                out.device(), " and cpu!");
    return desc_scalar(t.item(), compute);
  }
  TORCH_CHECK(t.device() == out.device(),
              "Expected all tensors to be on the same device, but found at least two devices, ", out.device(), " and ",
              t.device(), "!");
  if (t.sizes().equals(out.sizes())) return desc(t);
  return desc(t.expand(out.sizes()));
}

// ---------------------------------------------------------------- dispatch point
// The eager mode is the runtime's (tpu_get_eager_mode; TORCH_TPU_LAUNCH_BLOCKING
// sets it at start-up): one piece of state, no copy here.
void submit(tpu_op op, const tpu_tensor* operands, int n, const tpu_params& p) {
  // Debug Eager: the runtime runs the launch synchronously (launch blocking),
  // its errors raise here; otherwise they surface later, naming this line.
  tpu_set_launch_site(tpu_get_eager_mode() != TPU_EAGER_DEBUG ? python_site() : 0);
  tpu_status s = tpu_launch(nullptr, op, operands, n, &p);
  if (C10_UNLIKELY(s != TPU_OK)) throw_status(s, tpu_op_name(op));
}

// ---------------------------------------------------------------- the elementwise launch every op file uses
c10::ScalarType default_float() { return c10::typeMetaToScalarType(c10::get_default_dtype()); }

// PyTorch's CPU kernels see the host scalar of a binary bfloat16 / float16 op
// rounded to that dtype (TensorIterator casts it: bf16 0.80078125 > 0.8 is
// false, x + 0.8 adds 0.80078125), except mul and the divisions, which use its
// value in float (original_scalar_value). Measured op by op against the CPU.
static bool rounds_host_scalar(tpu_op op, c10::ScalarType compute) {
  if (compute != kBFloat16 && compute != kHalf) return false;
  if (tpu_op_class_of(op) != TPU_CLASS_BINARY) return false;
  return op != TPU_OP_MUL && op != TPU_OP_DIV && op != TPU_OP_DIV_TRUNC && op != TPU_OP_DIV_FLOOR;
}

void ew(tpu_op op, const at::Tensor& out, std::initializer_list<at::Tensor> ins, c10::ScalarType compute,
        tpu_params p) {
  if (out.numel() == 0) return;
  tpu_tensor ts[TPU_MAX_OPERANDS];
  int n = 0;
  ts[n++] = desc(out);
  const bool round = rounds_host_scalar(op, compute);
  for (const auto& t : ins)
    ts[n++] =
        round && t.device().is_cpu() && t.dim() == 0 ? operand(t.to(compute), out, compute) : operand(t, out, compute);
  p.compute_dtype = to_tpu_dtype(compute);
  submit(op, ts, n, p);
}

// One part of a complex tensor's real view (0: real, 1: imaginary) as a
// descriptor of its float dtype, broadcast to `like`'s sizes.
static tpu_tensor part_desc(const at::Tensor& t, int part, const at::Tensor& like) {
  tpu_tensor d = desc_real(t.sizes().equals(like.sizes()) ? t : t.expand(like.sizes()));
  d.ndim--;
  d.offset += part;
  return d;
}

// o = i (descriptors; a complex operand: one part of its real view) by a
// COPY (a cast), or a NEG when `negate`.
static void copy_launch(tpu_tensor o, tpu_tensor i, bool negate) {
  tpu_params p{};
  p.compute_dtype = o.dtype;
  tpu_tensor ts[2] = {o, i};
  submit(negate ? TPU_OP_NEG : TPU_OP_COPY, ts, 2, p);
}
// o = v everywhere.
static void fill_launch(tpu_tensor o, double v) {
  tpu_params p{};
  p.compute_dtype = o.dtype;
  tpu_tensor ts[2] = {o, tpu_tensor_scalar_f(v, TPU_F64)};
  submit(TPU_OP_FILL, ts, 2, p);
}

// The copy at the heart of copy_ on the device: dtype conversion,
// broadcasting src to dst's shape, and the conjugate and negative bits of
// both (dst's data = conj(src) when exactly one of them is conjugated, and so
// for negation). Complex tensors move as their real views: a complex
// destination gets src's real part (or the whole real tensor) and its
// imaginary part (or zeros); a real destination takes the real part, as
// PyTorch's copy_ does.
void device_copy(const at::Tensor& dst, const at::Tensor& src) {
  const bool dc = dst.is_complex(), sc = src.is_complex();
  const bool conj = dst.is_conj() != src.is_conj(), neg = dst.is_neg() != src.is_neg();
  if (!dc && !sc && !neg) {
    ew(TPU_OP_COPY, dst, {src}, dst.scalar_type());
    return;
  }
  if (dst.numel() == 0) return;
  if (sc && !dc) {
    TORCH_WARN_ONCE("Casting complex values to real discards the imaginary part");
  }
  if (src.device().is_cpu()) {  // a 0-dim host value: its parts as host scalars
    TORCH_INTERNAL_ASSERT(src.dim() == 0);
    c10::Scalar v = src.item();
    c10::complex<double> z = v.isComplex() ? v.toComplexDouble() : c10::complex<double>(v.toDouble(), 0);
    if (src.is_conj()) z = std::conj(z);
    if (src.is_neg()) z = -z;
    if (dst.is_conj()) z = std::conj(z);
    if (dst.is_neg()) z = -z;
    if (dc)
      fill_complex(dst, z);
    else
      fill_launch(desc(dst), z.real());
    return;
  }
  tpu_tensor o = dc ? part_desc(dst, 0, dst) : desc(dst);
  tpu_tensor i = sc ? part_desc(src, 0, dst) : operand(src, dst, dst.scalar_type());
  copy_launch(o, i, neg);
  if (!dc) return;
  tpu_tensor oi = part_desc(dst, 1, dst);
  if (sc)
    copy_launch(oi, part_desc(src, 1, dst), neg != conj);
  else
    fill_launch(oi, 0.0);
}

at::Tensor wrap(const c10::Scalar& s) {
  auto t = at::scalar_tensor(s, at::TensorOptions().dtype(s.type()));
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// ---------------------------------------------------------------- fill / arange / copy
// A complex tensor's data set to z: its real view's two parts as fills.
void fill_complex(const at::Tensor& self, c10::complex<double> z) {
  if (self.numel() == 0) return;
  fill_launch(part_desc(self, 0, self), z.real());
  fill_launch(part_desc(self, 1, self), z.imag());
}

static at::Tensor& fill_s(at::Tensor& self, const c10::Scalar& v0) {
  if (self.numel() == 0) return self;
  const c10::Scalar v = self.is_neg() ? -v0 : v0;
  if (self.is_complex()) {
    c10::complex<double> z = v.isComplex() ? v.toComplexDouble() : c10::complex<double>(v.toDouble(), 0);
    fill_complex(self, self.is_conj() ? std::conj(z) : z);
    return self;
  }
  tpu_tensor ts[2] = {desc(self), desc_scalar(v, self.scalar_type())};
  tpu_params p{};
  p.compute_dtype = to_tpu_dtype(self.scalar_type());
  submit(TPU_OP_FILL, ts, 2, p);
  return self;
}
static at::Tensor& fill_t(at::Tensor& self, const at::Tensor& v) {
  TORCH_CHECK(v.dim() == 0, "fill_ only supports 0-dimension value tensor but got tensor with ", v.dim(),
              " dimensions.");
  if (v.device().is_cpu()) return fill_s(self, v.item());
  if (self.is_complex() || v.is_complex() || self.is_neg() || v.is_neg() || v.is_conj()) {
    device_copy(self, v);  // fill with the value's bits resolved
    return self;
  }
  ew(TPU_OP_FILL, self, {v}, self.scalar_type());
  return self;
}
static at::Tensor& zero_(at::Tensor& self) { return fill_s(self, 0); }

static at::Tensor& arange_out(const c10::Scalar& start, const c10::Scalar& end, const c10::Scalar& step,
                              at::Tensor& out) {
  double xs = start.toDouble(), xe = end.toDouble(), st = step.toDouble();
  TORCH_CHECK(st != 0, "step must be nonzero");
  TORCH_CHECK_VALUE(!isIntegralType(out.scalar_type(), true) || step.toLong() != 0, "step must be nonzero");
  TORCH_CHECK(std::isfinite(xs) && std::isfinite(xe), "unsupported range: ", xs, " -> ", xe);
  TORCH_CHECK((st > 0 && xe >= xs) || (st < 0 && xe <= xs), "upper bound and larger bound inconsistent with step sign");
  int64_t n;
  if (isIntegralType(out.scalar_type(), true) && start.isIntegral(true) && end.isIntegral(true) &&
      step.isIntegral(true)) {
    int64_t s = start.toLong(), e = end.toLong(), k = step.toLong();
    n = (e - s + k + (k > 0 ? -1 : 1)) / k;
  } else {
    n = static_cast<int64_t>(std::ceil((xe - xs) / st));
  }
  at::native::resize_output(out, {n});
  if (n == 0) return out;
  tpu_params p = TPU_PARAMS(ARANGE, .start = xs, .step = st);
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
  tpu_params p = TPU_PARAMS(ARANGE, .start = a, .step = steps > 1 ? (b - a) / double(steps - 1) : 0.0);
  p.compute_dtype = to_tpu_dtype(out.scalar_type());
  tpu_tensor t = desc(out);
  submit(TPU_OP_ARANGE, &t, 1, p);
  if (steps > 1) out.select(0, steps - 1).fill_(end);  // exact end point, as PyTorch gives
  return out;
}

static void record_stream(at::Tensor& self, c10::Stream s) { device_allocator_record(self.storage().data_ptr(), s); }

static bool plain(const at::Tensor& t) { return t.is_contiguous() && t.is_non_overlapping_and_dense(); }
// Plain, and its bytes are its values (no conjugate or negative bit): a byte copy serves it.
static bool plain_bits(const at::Tensor& t) { return plain(t) && !t.is_conj() && !t.is_neg(); }

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
    at::Tensor s = self.resolve_conj().resolve_neg().to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    at::Tensor d;
    {
      c10::DeviceGuard g(dst.device());
      d = plain_bits(dst) ? dst : at::empty(dst.sizes(), dst.options());
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
    at::Tensor s = self.resolve_conj().resolve_neg().to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    at::Tensor d = plain_bits(dst) ? dst : at::empty(dst.sizes(), dst.options());
    bool pinned = non_blocking && tpu_host_is_pinned(s.data_ptr());
    copy_bytes(d, s, TPU_COPY_H2D, tpu_stream_current(dst.device().index()), pinned && s.is_same(self));
    if (!d.is_same(dst)) device_copy(dst, d);
    return dst;
  }
  TORCH_CHECK(s_tpu, "copy_from: expected a tpu tensor on one side");
  // device -> host
  c10::DeviceGuard g(self.device());
  at::Tensor s = self;
  if (!(plain_bits(self) && self.scalar_type() == dst.scalar_type() && self.sizes().equals(dst.sizes()))) {
    s = at::empty(dst.sizes(), self.options().dtype(dst.scalar_type()));
    device_copy(s, self);
  }
  bool direct = plain_bits(dst);
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
  return at::detail::empty_generic(size, device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), st,
                                   mf);
}

static at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                                std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                std::optional<bool> pin) {
  c10::OptionalDeviceGuard g(device);
  auto st = dtype.value_or(default_float());
  TORCH_CHECK(dtype_supported(st), "tpu does not support dtype ", st, " yet");
  return at::detail::empty_strided_generic(size, stride, device_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), st);
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
  size_t nbytes =
      at::detail::computeStorageNbytes(size, impl->strides(), self.dtype().itemsize(), self.storage_offset());
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
  if (stride.data())
    impl->set_sizes_and_strides(size, stride);
  else
    impl->set_sizes_contiguous(size);
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
    case c10::DeviceType::CPU:
    case c10::DeviceType::CUDA:
    case c10::DeviceType::HIP:
    case c10::DeviceType::MPS:
    case c10::DeviceType::XPU:
    case c10::DeviceType::HPU:
    case c10::DeviceType::PrivateUse1:
      return true;
    default:
      return false;
  }
}
static bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  return (self.is_privateuseone() || from.is_privateuseone()) && dense_strided(self) && dense_strided(from);
}

// ---------------------------------------------------------------- cat
static at::Tensor& cat_out(const at::ITensorListRef& tensors, int64_t dim, at::Tensor& out) {
  auto mat = tensors.materialize();
  TORCH_CHECK(!mat.empty(), "torch.cat(): expected a non-empty list of Tensors");
  // Skip legacy empty 1-d tensors, as PyTorch does.
  const at::Tensor* ref = nullptr;
  for (const at::Tensor& t : mat)
    if (!(t.dim() == 1 && t.numel() == 0)) {
      ref = &t;
      break;
    }
  at::assert_no_internal_overlap(out);
  for (const at::Tensor& t : mat) at::assert_no_overlap(out, t);
  if (!ref) {
    at::native::resize_output(out, {0});
    return out;
  }
  int64_t d = at::maybe_wrap_dim(dim, ref->dim());
  std::vector<int64_t> shape(ref->sizes().begin(), ref->sizes().end());
  int64_t total = 0;
  for (const at::Tensor& t : mat) {
    if (t.dim() == 1 && t.numel() == 0) continue;
    TORCH_CHECK(t.dim() == ref->dim(), "Tensors must have same number of dimensions: got ", ref->dim(), " and ",
                t.dim());
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

}  // namespace

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
    TORCH_WARN("The operator '", full,
               "' is not currently supported on the tpu backend and will fall back to run "
               "on the CPU. This may have performance implications.");
}

namespace {
// A random op that falls back draws from the tpu generator, as native ones
// do: its `Generator?` argument (absent, or a tpu generator, which a CPU
// kernel would refuse) becomes a CPU generator seeded from the next
// (seed, offset) of the tpu device's generator. torch.tpu.manual_seed then
// makes fallback random ops reproducible, whatever the CPU RNG's state.
void use_tpu_generator(const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  const auto& args = schema.arguments();
  const size_t base = stack->size() - args.size();
  for (size_t i = 0; i < args.size(); i++) {
    const auto& ty = args[i].real_type();

    if (ty->kind() != c10::TypeKind::OptionalType ||
        ty->castRaw<c10::OptionalType>()->getElementType()->kind() != c10::TypeKind::GeneratorType)
      continue;
    c10::IValue& iv = (*stack)[base + i];
    std::optional<at::Generator> gen;
    if (!iv.isNone()) gen = iv.toGenerator();
    if (gen && gen->defined() && gen->device().type() == c10::DeviceType::CPU) continue;  // the caller's own
    c10::DeviceIndex dev = gen && gen->defined() ? gen->device().index() : -1;
    for (size_t k = base; k < stack->size() && dev < 0; k++)
      if ((*stack)[k].isTensor() && (*stack)[k].toTensor().device().type() == c10::DeviceType::PrivateUse1)
        dev = (*stack)[k].toTensor().device().index();
    for (size_t k = base; k < stack->size() && dev < 0; k++)  // factory functions: device=tpu:N
      if ((*stack)[k].isDevice() && (*stack)[k].toDevice().type() == c10::DeviceType::PrivateUse1)
        dev = (*stack)[k].toDevice().index();
    auto [seed, off] = philox_next(gen, dev);
    iv = c10::IValue(at::detail::createCPUGenerator(seed ^ (off * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL)));
  }
}

}  // namespace

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  note_cpu_fallback(name.name + (name.overload_name.empty() ? "" : "." + name.overload_name));
  use_tpu_generator(op.schema(), stack);
  at::native::cpu_fallback(op, stack);
}

std::tuple<std::vector<std::string>, std::vector<int64_t>> fallback_counts() {
  std::lock_guard<std::mutex> g(g_fb_mu);
  std::vector<std::string> n;
  std::vector<int64_t> c;
  for (auto& [k, v] : fb_counts()) {
    n.push_back(k);
    c.push_back(v);
  }
  return {n, c};
}
void reset_fallback_counts() {
  std::lock_guard<std::mutex> g(g_fb_mu);
  fb_counts().clear();
}
void set_fallback_enabled(bool on) { g_fb_enabled.store(on ? 1 : 0); }
bool fallback_enabled() { return fb_enabled_now(); }

}  // namespace at::tpu

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&at::tpu::cpu_fallback>());
}

// Answered above the autograd layer too: the op is CompositeImplicitAutograd,
// and the tensors' highest key is AutogradPrivateUse1 even under no_grad.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(at::tpu::has_compatible_shallow_copy_type));
}

// PyTorch's conjugate and negative fallbacks would resolve a bit on
// _copy_from's arguments by cloning, and a clone is a copy_, which calls
// _copy_from again (CUDA has no _copy_from). copy_from resolves the bits
// itself (device_copy), so those keys pass it through.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

// This file's rows of the op table (ops_pointwise.cpp and ops_nn.cpp register theirs).
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
  m.impl("record_stream", TORCH_FN(record_stream));
  // fills, cat
  m.impl("fill_.Scalar", TORCH_FN(fill_s));
  m.impl("fill_.Tensor", TORCH_FN(fill_t));
  m.impl("zero_", TORCH_FN(zero_));
  m.impl("arange.start_out", TORCH_FN(arange_out));
  m.impl("linspace.out", TORCH_FN(linspace_out));
  m.impl("cat.out", TORCH_FN(cat_out));
}
