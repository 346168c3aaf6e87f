// ops_spectral.cpp - tpu ATen kernels for complex tensors' own ops and the
// discrete Fourier transforms: view_as_real / view_as_complex (PyTorch's
// device-generic views), conj_physical, torch.complex, complex arithmetic
// (add, sub, mul, div, neg, abs, mm, bmm: real launches on the real and
// imaginary parts, which Fused Eager fuses), and the three primitives torch.fft
// is built on - _fft_c2c, _fft_r2c, _fft_c2r (+ .out) - which torch.fft.fft,
// ifft, rfft, irfft, fft2, fftn, hfft, stft and istft reach after their
// argument handling (padding, trimming, norm names) in PyTorch's own code.
//
// A transform over several dims is one FFT launch per dim (ops.def: FFT_C2C,
// FFT_R2C, FFT_C2R): r2c along the last of `dim`, then c2c over the others;
// c2r the other way round. The normalization (PyTorch's fft_norm_mode: none,
// 1/sqrt(n), 1/n over the product of the signal sizes) becomes each launch's
// scale for its own dim. Dtypes as the CPU's: complex64 / complex128, and
// float32 / float64 on the real side (half precision raises as it does there).
#include "tpu_glue.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/native/Resize.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ops/_conj.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/add.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/div.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/where.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/hypot.h>
#include <ATen/ops/imag.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/real.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <torch/library.h>

#include <cmath>

namespace at::tpu {

// ---------------------------------------------------------------- conj
static at::Tensor& conj_physical_out(const at::Tensor& self, at::Tensor& out) {
  at::native::resize_output(out, self.sizes());
  // The copy resolves the bits: out's data = conj(self) for a view of self
  // with its conjugate bit flipped (a real tensor: a plain copy).
  device_copy(out, self.is_complex() ? at::_conj(self) : self);
  return out;
}

// ---------------------------------------------------------------- complex arithmetic
// An operand as complex dtype c on the device, broadcast to `shape` (a 0-dim
// host operand is moved: it is a value, not a tensor the op owns).
static at::Tensor cplx_operand(const at::Tensor& t, c10::ScalarType c, c10::IntArrayRef shape, c10::Device dev) {
  at::Tensor x = t.device().is_cpu() ? t.to(dev) : t;
  if (x.scalar_type() != c) x = x.to(c);
  return x.expand(shape);
}

// out (resized to shape, complex or able to take complex c) = re + i im.
static at::Tensor& cplx_store(const at::Tensor& re, const at::Tensor& im, c10::ScalarType c, c10::IntArrayRef shape,
                              at::Tensor& out) {
  TORCH_CHECK(c10::canCast(c, out.scalar_type()), "result type ", c, " can't be cast to the desired output type ",
              out.scalar_type());
  at::native::resize_output(out, shape);
  if (out.scalar_type() == c && !out.is_conj()) {
    at::real(out).copy_(re);
    at::imag(out).copy_(im);
  } else {
    at::Tensor t = at::empty(shape, out.options().dtype(c));
    at::real(t).copy_(re);
    at::imag(t).copy_(im);
    out.copy_(t);
  }
  return out;
}

at::Tensor& complex_binary_out(tpu_op op, const at::Tensor& a, const at::Tensor& b, const c10::Scalar& alpha,
                               at::Tensor& out) {
  at::native::ResultTypeState st{};
  st = at::native::update_result_type_state(a, st);
  st = at::native::update_result_type_state(b, st);
  c10::ScalarType c = at::native::result_type(st);
  if (!isComplexType(c)) c = c10::toComplexType(isFloatingType(c) ? c : default_float());  // a complex out
  const c10::Device dev = (a.device().is_cpu() ? b : a).device();
  auto shape = at::infer_size_dimvector(a.sizes(), b.sizes());
  at::Tensor A = cplx_operand(a, c, shape, dev), B = cplx_operand(b, c, shape, dev);
  if ((op == TPU_OP_ADD || op == TPU_OP_SUB) && alpha.isComplex() && alpha.toComplexDouble().imag() != 0) {
    at::Tensor s = at::empty({}, A.options());
    s.fill_(alpha);
    at::Tensor prod = at::empty({0}, A.options());
    B = complex_binary_out(TPU_OP_MUL, B, s, 1, prod);
    return complex_binary_out(op, A, B, 1, out);
  }
  at::Tensor ar = at::real(A), ai = at::imag(A), br = at::real(B), bi = at::imag(B), re, im;
  switch (op) {
    case TPU_OP_ADD:
    case TPU_OP_SUB: {
      c10::Scalar al = alpha.isComplex() ? c10::Scalar(alpha.toComplexDouble().real()) : alpha;
      re = op == TPU_OP_ADD ? at::add(ar, br, al) : at::sub(ar, br, al);
      im = op == TPU_OP_ADD ? at::add(ai, bi, al) : at::sub(ai, bi, al);
      break;
    }
    case TPU_OP_MUL:  // (ar br - ai bi) + i (ar bi + ai br)
      re = at::sub(at::mul(ar, br), at::mul(ai, bi));
      im = at::add(at::mul(ar, bi), at::mul(ai, br));
      break;
    case TPU_OP_DIV: {  // scaled by s = max(|br|, |bi|), so that |b|^2 neither overflows nor underflows
      at::Tensor s = at::maximum(at::abs(br), at::abs(bi));
      at::Tensor cr = at::div(br, s), ci = at::div(bi, s), xr = at::div(ar, s), xi = at::div(ai, s);
      at::Tensor den = at::add(at::mul(cr, cr), at::mul(ci, ci));
      re = at::div(at::add(at::mul(xr, cr), at::mul(xi, ci)), den);
      im = at::div(at::sub(at::mul(xi, cr), at::mul(xr, ci)), den);
      break;
    }
    default:
      TORCH_INTERNAL_ASSERT(false, "complex_binary_out: ", tpu_op_name(op));
  }
  return cplx_store(re, im, c, shape, out);
}

at::Tensor& complex_unary_out(tpu_op op, const at::Tensor& self, at::Tensor& out) {
  at::Tensor re = at::real(self), im = at::imag(self);
  if (op == TPU_OP_ABS) {  // |z| = hypot(re, im), real
    if (out.is_complex())
      return cplx_store(at::hypot(re, im), at::zeros_like(re), out.scalar_type(), self.sizes(), out);
    at::native::resize_output(out, self.sizes());
    out.copy_(at::hypot(re, im));
    return out;
  }
  if (op == TPU_OP_RECIPROCAL) {  // 1 / z as c10::complex divides (Smith's algorithm: the CPU's infs and NaNs)
    at::Tensor ac = at::abs(re), ad = at::abs(im), big_c = at::ge(ac, ad);
    at::Tensor rat = at::where(big_c, at::div(im, re), at::div(re, im));  // d/c or c/d
    at::Tensor scl = at::reciprocal(at::where(big_c, at::add(re, at::mul(im, rat)), at::add(im, at::mul(re, rat))));
    at::Tensor r = at::where(big_c, scl, at::mul(rat, scl)),
               i = at::where(big_c, at::neg(at::mul(rat, scl)), at::neg(scl));
    at::Tensor zero = at::logical_and(at::eq(ac, 0), at::eq(ad, 0));  // 1/|c| and 0/|d|: (inf, nan)
    r = at::where(zero, at::reciprocal(ac), r);
    i = at::where(zero, at::div(at::zeros_like(ad), ad), i);
    return cplx_store(r, i, self.scalar_type(), self.sizes(), out);
  }
  TORCH_INTERNAL_ASSERT(op == TPU_OP_NEG);
  return cplx_store(at::neg(re), at::neg(im), self.scalar_type(), self.sizes(), out);
}

// (ar + i ai)(br + i bi) by four real products on the matrix unit.
at::Tensor& complex_mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  auto mm = [&](const at::Tensor& x, const at::Tensor& y) {
    return a.dim() == 2 ? at::mm(x.contiguous(), y.contiguous()) : at::bmm(x.contiguous(), y.contiguous());
  };
  at::Tensor ar = at::real(a), ai = at::imag(a), br = at::real(b), bi = at::imag(b);
  at::Tensor re = at::sub(mm(ar, br), mm(ai, bi)), im = at::add(mm(ar, bi), mm(ai, br));
  return cplx_store(re, im, a.scalar_type(), re.sizes(), out);
}

static at::Tensor& complex_out(const at::Tensor& re, const at::Tensor& im, at::Tensor& out) {
  TORCH_CHECK(re.scalar_type() == im.scalar_type(), "Expected object of scalar type ", re.scalar_type(),
              " but got scalar type ", im.scalar_type(), " for second argument");
  TORCH_CHECK(re.scalar_type() == kFloat || re.scalar_type() == kDouble || re.scalar_type() == kHalf,
              "Expected both inputs to be Half, Float or Double tensors but got ", re.scalar_type(), " and ",
              im.scalar_type());
  TORCH_CHECK(re.scalar_type() != kHalf, "tpu does not support dtype ComplexHalf yet");
  const c10::ScalarType c = c10::toComplexType(re.scalar_type());
  TORCH_CHECK(out.scalar_type() == c, "Expected object of scalar type ", c, " but got scalar type ", out.scalar_type(),
              " for argument 'out'");
  auto shape = at::infer_size_dimvector(re.sizes(), im.sizes());
  return cplx_store(re.expand(shape), im.expand(shape), c, shape, out);
}

// ---------------------------------------------------------------- FFT
// The scale of one dim's launch for a signal of n points.
static double fft_scale(int64_t norm, int64_t n) {
  switch (norm) {
    case 0:
      return 1.0;
    case 1:
      return 1.0 / std::sqrt(static_cast<double>(n));
    case 2:
      return 1.0 / static_cast<double>(n);
    default:
      TORCH_CHECK(false, "Invalid normalization mode: ", norm);
  }
  return 1.0;
}

static void fft_check_real(const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == kFloat || t.scalar_type() == kDouble, "Unsupported dtype ", t.scalar_type());
}

static std::vector<int64_t> fft_dims(c10::IntArrayRef dim, int64_t ndim) {
  std::vector<int64_t> d;
  for (int64_t x : dim) d.push_back(at::maybe_wrap_dim(x, ndim));
  return d;
}

static void fft_launch(tpu_op op, const at::Tensor& out, const at::Tensor& in, int64_t dim, double scale,
                       bool inverse) {
  tpu_tensor ts[2] = {desc(out), desc(in)};
  tpu_params p = op == TPU_OP_FFT_C2C   ? TPU_PARAMS(FFT_C2C, .dim = dim, .inverse = inverse, .scale = scale)
                 : op == TPU_OP_FFT_R2C ? TPU_PARAMS(FFT_R2C, .dim = dim, .scale = scale)
                                        : TPU_PARAMS(FFT_C2R, .dim = dim, .scale = scale);
  submit(op, ts, 2, p);
}

// out (sized) = c2c of self over dims; out and self may be one tensor.
static void fft_c2c_into(const at::Tensor& self, const std::vector<int64_t>& dims, int64_t norm, bool forward,
                         const at::Tensor& out) {
  if (out.numel() == 0) return;
  if (dims.empty()) {
    if (!out.is_same(self)) device_copy(out, self);
    return;
  }
  const at::Tensor* src = &self;
  for (int64_t d : dims) {
    fft_launch(TPU_OP_FFT_C2C, out, *src, d, fft_scale(norm, self.size(d)), !forward);
    src = &out;
  }
}

// A result tensor that may not overlap the input: out itself, or a fresh one copied back by fft_finish.
static at::Tensor fft_target(const at::Tensor& out, const at::Tensor& self) {
  if (at::get_overlap_status(out, self) == at::MemOverlapStatus::No) return out;
  return at::empty(out.sizes(), out.options());
}
static at::Tensor& fft_finish(at::Tensor& out, const at::Tensor& t) {
  if (!t.is_same(out)) out.copy_(t);
  return out;
}

static at::Tensor& fft_c2c_out(const at::Tensor& self, c10::IntArrayRef dim, int64_t norm, bool forward,
                               at::Tensor& out) {
  TORCH_CHECK(self.is_complex(), "expects a complex input tensor, but got ", self.scalar_type());
  at::native::resize_output(out, self.sizes());
  at::Tensor t = fft_target(out, self);
  fft_c2c_into(self, fft_dims(dim, self.dim()), norm, forward, t);
  return fft_finish(out, t);
}
static at::Tensor fft_c2c(const at::Tensor& self, c10::IntArrayRef dim, int64_t norm, bool forward) {
  at::Tensor out = at::empty({0}, self.options());
  return fft_c2c_out(self, dim, norm, forward, out);
}

static at::Tensor& fft_r2c_out(const at::Tensor& self, c10::IntArrayRef dim, int64_t norm, bool onesided,
                               at::Tensor& out) {
  fft_check_real(self);
  auto dims = fft_dims(dim, self.dim());
  TORCH_CHECK(!dims.empty(), "_fft_r2c: expects at least one dim");
  const int64_t last = dims.back();
  std::vector<int64_t> sizes(self.sizes().begin(), self.sizes().end());
  if (onesided) sizes[last] = sizes[last] / 2 + 1;
  at::native::resize_output(out, sizes);
  at::Tensor t = fft_target(out, self);
  if (t.numel() > 0) {
    fft_launch(TPU_OP_FFT_R2C, t, self, last, fft_scale(norm, self.size(last)), false);
    dims.pop_back();
    for (int64_t d : dims) fft_launch(TPU_OP_FFT_C2C, t, t, d, fft_scale(norm, self.size(d)), false);
  }
  return fft_finish(out, t);
}
static at::Tensor fft_r2c(const at::Tensor& self, c10::IntArrayRef dim, int64_t norm, bool onesided) {
  fft_check_real(self);
  at::Tensor out = at::empty({0}, self.options().dtype(c10::toComplexType(self.scalar_type())));
  return fft_r2c_out(self, dim, norm, onesided, out);
}

static at::Tensor& fft_c2r_out(const at::Tensor& self, c10::IntArrayRef dim, int64_t norm, int64_t last_dim_size,
                               at::Tensor& out) {
  TORCH_CHECK(self.is_complex(), "expects a complex input tensor, but got ", self.scalar_type());
  auto dims = fft_dims(dim, self.dim());
  TORCH_CHECK(!dims.empty(), "_fft_c2r: expects at least one dim");
  TORCH_CHECK(last_dim_size >= 1, "Invalid number of data points (", last_dim_size, ") specified");
  const int64_t last = dims.back();
  std::vector<int64_t> sizes(self.sizes().begin(), self.sizes().end());
  sizes[last] = last_dim_size;
  at::native::resize_output(out, sizes);
  if (out.numel() == 0) return out;
  // The other dims first (into a temporary: the input stays as it is), then c2r along the last.
  dims.pop_back();
  at::Tensor spec = self;
  if (!dims.empty()) {
    spec = at::empty(self.sizes(), self.options());
    fft_c2c_into(self, dims, norm, false, spec);
  }
  at::Tensor t = fft_target(out, spec);
  fft_launch(TPU_OP_FFT_C2R, t, spec, last, fft_scale(norm, last_dim_size), true);
  return fft_finish(out, t);
}
static at::Tensor fft_c2r(const at::Tensor& self, c10::IntArrayRef dim, int64_t norm, int64_t last_dim_size) {
  TORCH_CHECK(self.is_complex(), "expects a complex input tensor, but got ", self.scalar_type());
  at::Tensor out = at::empty({0}, self.options().dtype(c10::toRealValueType(self.scalar_type())));
  return fft_c2r_out(self, dim, norm, last_dim_size, out);
}

}  // namespace at::tpu

// This file's rows of the op table.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace at::tpu;
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("conj_physical.out", TORCH_FN(conj_physical_out));
  m.impl("complex.out", TORCH_FN(complex_out));
  m.impl("_fft_c2c", TORCH_FN(fft_c2c));
  m.impl("_fft_c2c.out", TORCH_FN(fft_c2c_out));
  m.impl("_fft_r2c", TORCH_FN(fft_r2c));
  m.impl("_fft_r2c.out", TORCH_FN(fft_r2c_out));
  m.impl("_fft_c2r", TORCH_FN(fft_c2r));
  m.impl("_fft_c2r.out", TORCH_FN(fft_c2r_out));
}
