// ops_nn.cpp - tpu ATen kernels for the nn ops: the matrix unit (mm, addmm,
// bmm, baddbmm, addmv, dot), softmax, losses, layer norm, indexing,
// masked_select, random fills and dropout, convolution and pooling, rnn cells.
//
// Each kernel only checks arguments, computes the output's shape and dtype,
// allocates, describes tensors to the runtime and hands the op to submit().
// No math. Batch norm and mse_loss are PyTorch's own decompositions,
// registered from Python (torch_tpu/_decomp.py).
#include "tpu_glue.h"
#include "complex_route.h"

#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/where.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <limits>

namespace at::tpu {

// ---------------------------------------------------------------- matrix unit
static int matmul_precision() {
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST:
      return 0;
    case at::Float32MatmulPrecision::HIGH:
      return 1;
    default:
      return 2;
  }
}

// View a tensor as (batch, rows, cols) with given sizes and strides.
static tpu_tensor as3(const at::Tensor& t, int64_t b, int64_t r, int64_t c, int64_t sb, int64_t sr, int64_t sc) {
  tpu_tensor d = desc(t);
  d.ndim = 3;
  d.sizes[0] = b;
  d.sizes[1] = r;
  d.sizes[2] = c;
  d.strides[0] = sb;
  d.strides[1] = sr;
  d.strides[2] = sc;
  return d;
}
static tpu_tensor mat3(const at::Tensor& m) { return as3(m, 1, m.size(0), m.size(1), 0, m.stride(0), m.stride(1)); }

static void check_mm(const at::Tensor& a, const at::Tensor& b, const char* name) {
  TORCH_CHECK(a.dim() == 2, name, ": self must be a matrix");
  TORCH_CHECK(b.dim() == 2, name, ": mat2 must be a matrix");
  TORCH_CHECK(a.size(1) == b.size(0), "mat1 and mat2 shapes cannot be multiplied (", a.size(0), "x", a.size(1), " and ",
              b.size(0), "x", b.size(1), ")");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(),
              "expected m1 and m2 to have the same dtype, but got: ", a.scalar_type(), " != ", b.scalar_type());
}

static void gemm(const at::Tensor& out, tpu_tensor o, tpu_tensor a, tpu_tensor b, const at::Tensor* c, tpu_tensor cd,
                 double alpha, double beta) {
  if (out.numel() == 0) return;
  tpu_tensor ts[4] = {o, a, b, cd};
  submit(TPU_OP_MATMUL, ts, (c && beta != 0.0) ? 4 : 3,
         TPU_PARAMS(MATMUL, .alpha = alpha, .beta = beta, .precision = matmul_precision()));
}

static at::Tensor& mm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  check_mm(a, b, "mm");
  if (C10_UNLIKELY(a.is_complex())) return complex_mm_out(a, b, out);
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
static tpu_tensor bat3(const at::Tensor& t) {
  return as3(t, t.size(0), t.size(1), t.size(2), t.stride(0), t.stride(1), t.stride(2));
}
static void check_bmm(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 3, "batch1 must be a 3D tensor");
  TORCH_CHECK(b.dim() == 3, "batch2 must be a 3D tensor");
  TORCH_CHECK(a.size(0) == b.size(0), "batch1 and batch2 must have same number of batches, got ", a.size(0), " and ",
              b.size(0));
  TORCH_CHECK(a.size(2) == b.size(1), "Expected size for first two dimensions of batch2 tensor to be: [", a.size(0),
              ", ", a.size(2), "] but got: [", b.size(0), ", ", b.size(1), "].");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "expected scalar type ", a.scalar_type(), " but found ",
              b.scalar_type());
}
static at::Tensor& bmm_out(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  check_bmm(a, b);
  if (C10_UNLIKELY(a.is_complex())) return complex_mm_out(a, b, out);
  at::native::resize_output(out, {a.size(0), a.size(1), b.size(2)});
  gemm(out, bat3(out), bat3(a), bat3(b), nullptr, {}, 1.0, 0.0);
  return out;
}
static at::Tensor& baddbmm_out(const at::Tensor& self, const at::Tensor& a, const at::Tensor& b,
                               const c10::Scalar& beta, const c10::Scalar& alpha, at::Tensor& out) {
  check_bmm(a, b);
  at::native::resize_output(out, {a.size(0), a.size(1), b.size(2)});
  at::Tensor c = self.expand({a.size(0), a.size(1), b.size(2)});
  gemm(out, bat3(out), bat3(a), bat3(b), &c, bat3(c), alpha.toDouble(), beta.toDouble());
  return out;
}
static at::Tensor& addmv_out(const at::Tensor& self, const at::Tensor& m, const at::Tensor& v, const c10::Scalar& beta,
                             const c10::Scalar& alpha, at::Tensor& out) {
  TORCH_CHECK(m.dim() == 2 && v.dim() == 1, "vector + matrix @ vector expected, got ", self.dim(), ", ", m.dim(), ", ",
              v.dim());
  TORCH_CHECK(m.size(1) == v.size(0), "size mismatch, got input (", self.size(0), "), mat (", m.size(0), "x", m.size(1),
              "), vec (", v.size(0), ")");
  at::native::resize_output(out, {m.size(0)});
  at::Tensor c = self.expand({m.size(0)});
  gemm(out, as3(out, 1, m.size(0), 1, 0, out.stride(0), 0), mat3(m), as3(v, 1, v.size(0), 1, 0, v.stride(0), 0), &c,
       as3(c, 1, m.size(0), 1, 0, c.stride(0), 0), alpha.toDouble(), beta.toDouble());
  return out;
}
static at::Tensor dot(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "1D tensors expected, but got ", a.dim(), "D and ", b.dim(), "D tensors");
  TORCH_CHECK(a.numel() == b.numel(), "inconsistent tensor size, expected tensor [", a.numel(), "] and src [",
              b.numel(), "] to have the same number of elements, but got ", a.numel(), " and ", b.numel(),
              " elements respectively");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dot : expected both vectors to have same dtype, but found ",
              a.scalar_type(), " and ", b.scalar_type());
  auto out = at::empty({}, a.options());
  gemm(out, as3(out, 1, 1, 1, 0, 0, 0), as3(a, 1, 1, a.size(0), 0, 0, a.stride(0)),
       as3(b, 1, b.size(0), 1, 0, b.stride(0), 0), nullptr, {}, 1.0, 0.0);
  return out;
}

// ---------------------------------------------------------------- softmax / losses / norms
static at::Tensor& softmax_like(tpu_op op, const at::Tensor& x, int64_t dim, at::Tensor& out) {
  at::native::resize_output(out, x.sizes());
  if (out.numel() == 0) return out;
  tpu_tensor ts[2] = {desc1d(out), desc1d(x)};
  submit(op, ts, 2,
         TPU_PARAMS(SOFTMAX,
                    .dim = at::maybe_wrap_dim(dim, std::max<int64_t>(x.dim(), 1))));  // LOG_SOFTMAX packs the same
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
  tpu_tensor ts[3] = {desc1d(out), desc1d(g), desc1d(y)};
  submit(op, ts, 3,
         TPU_PARAMS(SOFTMAX_BWD,
                    .dim = at::maybe_wrap_dim(dim, std::max<int64_t>(g.dim(), 1))));  // LOG_SOFTMAX_BWD packs the same
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
                                                                 const std::optional<at::Tensor>& weight,
                                                                 int64_t reduction, int64_t ignore_index,
                                                                 at::Tensor& output, at::Tensor& total_weight) {
  TORCH_CHECK(self.dim() > 0 && self.dim() <= 2, "input tensor should be 1D or 2D");
  TORCH_CHECK(target.dim() <= 1, "0D or 1D target tensor expected, multi-target not supported");
  const bool no_batch = self.dim() == 1 && target.dim() == 0;
  TORCH_CHECK(no_batch || self.size(0) == target.size(0), "size mismatch (got input: ", self.sizes(),
              ", target: ", target.sizes(), ")");
  if (reduction == 0 && self.dim() == 2)
    at::native::resize_output(output, {self.size(0)});
  else
    at::native::resize_output(output, {});
  at::native::resize_output(total_weight, {});
  bool hw = weight.has_value() && weight->defined();
  tpu_tensor ts[5] = {desc(output), desc(total_weight), desc(self), desc(target), hw ? desc(*weight) : tpu_tensor{}};
  submit(TPU_OP_NLL_LOSS, ts, hw ? 5 : 4, TPU_PARAMS(NLL_LOSS, .reduction = reduction, .ignore_index = ignore_index));
  return {output, total_weight};
}
static at::Tensor& nll_loss_backward_out(const at::Tensor& grad_output, const at::Tensor& self,
                                         const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                         int64_t reduction, int64_t ignore_index, const at::Tensor& total_weight,
                                         at::Tensor& grad_input) {
  at::native::resize_output(grad_input, self.sizes());
  if (grad_input.numel() == 0) return grad_input;
  bool hw = weight.has_value() && weight->defined();
  tpu_tensor ts[5] = {desc(grad_input), desc(grad_output), desc(target), desc(total_weight),
                      hw ? desc(*weight) : tpu_tensor{}};
  submit(TPU_OP_NLL_LOSS_BWD, ts, hw ? 5 : 4,
         TPU_PARAMS(NLL_LOSS_BWD, .reduction = reduction, .ignore_index = ignore_index));
  return grad_input;
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(const at::Tensor& x, c10::IntArrayRef nshape,
                                                                        const std::optional<at::Tensor>& w,
                                                                        const std::optional<at::Tensor>& b,
                                                                        double eps) {
  const int64_t nd = static_cast<int64_t>(nshape.size());
  TORCH_CHECK(nd >= 1 && x.dim() >= nd && x.sizes().slice(x.dim() - nd).equals(nshape),
              "Given normalized_shape=", nshape, ", expected input with shape [*, ", c10::Join(", ", nshape),
              "], but got input of size", x.sizes());
  bool hw = w.has_value() && w->defined(), hb = b.has_value() && b->defined();
  if (hw)
    TORCH_CHECK(w->sizes().equals(nshape),
                "Expected weight to be of same shape as normalized_shape, but got weight of shape ", w->sizes(),
                " and normalized_shape = ", nshape);
  if (hb)
    TORCH_CHECK(b->sizes().equals(nshape),
                "Expected bias to be of same shape as normalized_shape, but got bias of shape ", b->sizes(),
                " and normalized_shape = ", nshape);
  int64_t M = c10::multiply_integers(nshape);
  std::vector<int64_t> sshape(x.sizes().begin(), x.sizes().end() - nd);
  for (int64_t i = 0; i < nd; i++) sshape.push_back(1);
  auto y = at::empty(x.sizes(), x.options());
  auto mean = at::empty(sshape, x.options());
  auto rstd = at::empty(sshape, x.options());
  if (x.numel() == 0) return {y, mean, rstd};
  tpu_tensor ts[6];
  int n = 0;
  ts[n++] = desc(y);
  ts[n++] = desc(mean);
  ts[n++] = desc(rstd);
  ts[n++] = desc(x);
  at::Tensor wc, bc;
  if (hw) {
    wc = w->contiguous();
    ts[n++] = desc(wc);
  }
  if (hb) {
    bc = b->contiguous();
    ts[n++] = desc(bc);
  }
  submit(TPU_OP_LAYER_NORM, ts, n, TPU_PARAMS(LAYER_NORM, .cols = M, .has_weight = hw, .has_bias = hb, .eps = eps));
  return {y, mean, rstd};
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(
    const at::Tensor& g, const at::Tensor& x, c10::IntArrayRef nshape, const at::Tensor& mean, const at::Tensor& rstd,
    const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& b, std::array<bool, 3> mask) {
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
  tpu_tensor none = tpu_tensor_scalar_f(0, TPU_F32);
  at::Tensor gc = g.contiguous(), xc = x.contiguous(), wc;
  tpu_tensor ts[8] = {dx.defined() ? desc(dx) : none,
                      dw.defined() ? desc(dw) : none,
                      db.defined() ? desc(db) : none,
                      desc(gc),
                      desc(xc),
                      desc(mean.contiguous()),
                      desc(rstd.contiguous()),
                      {}};
  int n = 7;
  if (hw) {
    wc = w->contiguous();
    ts[n++] = desc(wc);
  }
  submit(TPU_OP_LAYER_NORM_BWD, ts, n, TPU_PARAMS(LAYER_NORM_BWD, .cols = M));
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
// An out= tensor that overlaps itself or an input: PyTorch's words (ATen/MemoryOverlap).
// Out kernels that resize check the given tensor for internal overlap first and
// the resized one against the inputs, in the CPU's order.
static void check_out_overlap(const at::Tensor& out, std::initializer_list<at::Tensor> ins, bool internal = true) {
  if (internal) at::assert_no_internal_overlap(out);
  for (const at::Tensor& t : ins)
    if (t.defined() && t.device() == out.device()) at::assert_no_overlap(out, t);
}
static at::Tensor& index_select_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, at::Tensor& out) {
  check_index(index, "index_select");
  TORCH_CHECK(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  std::vector<int64_t> shape(self.sizes().begin(), self.sizes().end());
  if (self.dim() > 0)
    shape[d] = index.numel();
  else
    TORCH_CHECK(index.numel() == 1, "index_select(): Index to scalar can have only 1 value, got ", index.numel(),
                " value(s)");
  at::assert_no_internal_overlap(out);
  at::native::resize_output(out, shape);
  check_out_overlap(out, {self, index}, false);
  if (out.numel() == 0) return out;
  tpu_tensor ts[3] = {desc1d(out), desc1d(self), desc1d(index)};
  submit(TPU_OP_INDEX_SELECT, ts, 3, TPU_PARAMS(INDEX_SELECT, .dim = d));
  return out;
}
static at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  auto out = at::empty({0}, self.options());
  return index_select_out(self, dim, index, out);
}
// Advanced indexing (x[i, :, j], x[mask], x[i] = v): PyTorch's rules turned
// into the runtime's form (ops.def: INDEX / INDEX_PUT). Boolean masks become
// their nonzero() coordinates; the index tensors broadcast together to B;
// the result's shape is B in place of the indexed dims when they are
// adjacent, else B first, then the remaining dims. The indexed tensor is
// described as a view over the result's shape (stride 0 across B) plus the
// indexed dims, each index as a view over the result's shape.
struct AdvIndex {
  std::vector<int64_t> shape;     // the result's (iteration) shape
  at::Tensor view;                // self's storage: shape's dims, then the indexed dims
  std::vector<at::Tensor> index;  // each over `shape`
  int64_t dims = 0;               // self's indexed dims, 5 bits each
};

static AdvIndex adv_index(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  TORCH_CHECK_INDEX(static_cast<int64_t>(indices.size()) <= self.dim(), "too many indices for tensor of dimension ",
                    self.dim(), " (got ", indices.size(), ")");
  std::vector<std::pair<int64_t, at::Tensor>> idx;  // (self dim, index)
  int64_t d = 0;
  for (const std::optional<at::Tensor>& o : indices) {
    if (!o.has_value() || !o->defined()) {
      d++;
      continue;
    }
    at::Tensor t = *o;
    auto st = t.scalar_type();
    TORCH_CHECK_INDEX(st == kLong || st == kInt || st == kBool || st == kByte,
                      "tensors used as indices must be long, int, byte or bool tensors");
    if (t.device() != self.device()) t = t.to(self.device());
    if (st == kBool || st == kByte) {
      if (st == kByte)
        TORCH_WARN("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.");
      TORCH_CHECK_INDEX(d + t.dim() <= self.dim(), "too many indices for tensor of dimension ", self.dim());
      for (int64_t j = 0; j < t.dim(); j++)
        TORCH_CHECK_INDEX(t.size(j) == self.size(d + j), "The shape of the mask ", t.sizes(), " at index ", j,
                          " does not match the shape of the indexed tensor ", self.sizes(), " at index ", d + j);
      at::Tensor nz = at::nonzero(t);  // (a data-dependent shape: waits for the mask)
      for (int64_t j = 0; j < t.dim(); j++) idx.emplace_back(d + j, nz.select(1, j));
      d += t.dim();
    } else {
      idx.emplace_back(d++, t);
    }
  }
  TORCH_CHECK(!idx.empty(), "index(): at least one index must be a tensor");
  TORCH_CHECK(idx.size() <= 6, "tpu: indexing with more than 6 index tensors is not supported yet (got ", idx.size(),
              ")");
  std::vector<int64_t> b;  // the indices' broadcast shape
  for (auto& [dim, t] : idx) {
    auto s = t.sizes();
    std::vector<int64_t> r(std::max(b.size(), s.size()), 1);
    for (size_t i = 0; i < r.size(); i++) {
      int64_t x = i < r.size() - b.size() ? 1 : b[i - (r.size() - b.size())];
      int64_t y = i < r.size() - s.size() ? 1 : s[i - (r.size() - s.size())];
      if (x != y && x != 1 && y != 1) {
        std::string all;
        for (auto& p : idx) all += (all.empty() ? "" : ", ") + c10::str(p.second.sizes());
        TORCH_CHECK_INDEX(false, "shape mismatch: indexing tensors could not be broadcast together with shapes ", all);
      }
      r[i] = x == 1 ? y : x;
    }
    b = r;
  }
  bool adjacent = idx.back().first - idx.front().first + 1 == static_cast<int64_t>(idx.size());
  int64_t nb = static_cast<int64_t>(b.size());
  AdvIndex r;
  std::vector<int64_t> vst;                       // the view's strides over the result's dims
  int64_t b0 = adjacent ? idx.front().first : 0;  // where B sits in the result
  for (int64_t i = 0; i < self.dim(); i++) {
    if (i == b0 && (adjacent || i == 0)) {
      r.shape.insert(r.shape.end(), b.begin(), b.end());
      vst.insert(vst.end(), b.size(), 0);
    }
    bool indexed = std::any_of(idx.begin(), idx.end(), [&](auto& p) { return p.first == i; });
    if (indexed) continue;
    r.shape.push_back(self.size(i));
    vst.push_back(self.stride(i));
  }
  if (static_cast<int64_t>(r.shape.size()) + static_cast<int64_t>(idx.size()) > TPU_MAX_DIMS)
    TORCH_CHECK_NOT_IMPLEMENTED(false, "tpu: indexing into more than ", TPU_MAX_DIMS, " dims is not supported");
  std::vector<int64_t> vsz = r.shape;
  for (size_t j = 0; j < idx.size(); j++) {
    vsz.push_back(self.size(idx[j].first));
    vst.push_back(self.stride(idx[j].first));
    r.dims |= idx[j].first << (5 * j);
  }
  r.view = self.as_strided(vsz, vst, self.storage_offset());
  for (auto& [dim, t] : idx) {
    at::Tensor e = t.expand(b);
    std::vector<int64_t> st(r.shape.size(), 0);
    for (int64_t i = 0; i < nb; i++) st[b0 + i] = e.stride(i);
    r.index.push_back(e.as_strided(r.shape, st, e.storage_offset()));
  }
  return r;
}

// torch._fused_adamw_ / _fused_adam_ (torch.optim.AdamW / Adam with
// fused=True, transformers' default optimizer): one ADAMW_STEP launch per
// parameter, the step count read on the device from its state tensor (no
// host sync). With a GradScaler, the grads are unscaled first unless found_inf
// is set (then the step is skipped in the kernel and the grads stay as they
// were, as on CUDA).
static void fused_adam(bool adamw, at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                       at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs, at::TensorList steps, double lr,
                       double beta1, double beta2, double weight_decay, double eps, bool amsgrad, bool maximize,
                       const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {
  TORCH_CHECK_NOT_IMPLEMENTED(!amsgrad,
                              "tpu: the fused Adam/AdamW step with amsgrad=True is not supported yet; "
                              "use fused=False (the foreach implementation runs natively)");
  size_t n = params.size();
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n && steps.size() == n,
              "_fused_adam: the tensor lists must have the same length");
  bool hs = grad_scale.has_value() && grad_scale->defined(), hf = found_inf.has_value() && found_inf->defined();
  for (size_t i = 0; i < n; i++) {
    at::Tensor g = grads[i];
    if (hs) {
      at::Tensor unscaled = g.div(grad_scale->reshape({}));
      g.copy_(hf ? at::where(found_inf->reshape({}).ne(0), g, unscaled) : unscaled);
    }
    std::vector<tpu_tensor> ts = {desc(params[i]), desc(exp_avgs[i]), desc(exp_avg_sqs[i]), desc(g), desc(steps[i])};
    if (hf) ts.push_back(desc(*found_inf));
    submit(TPU_OP_ADAMW_STEP, ts.data(), static_cast<int>(ts.size()),
           TPU_PARAMS(ADAMW_STEP, .lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay,
                      .step = 1, .maximize = maximize, .l2 = !adamw));
  }
}
static void fused_adamw_(at::TensorList p, at::TensorList g, at::TensorList m, at::TensorList v, at::TensorList mx,
                         at::TensorList st, double lr, double b1, double b2, double wd, double eps, bool ams, bool maxi,
                         const std::optional<at::Tensor>& gs, const std::optional<at::Tensor>& fi) {
  fused_adam(true, p, g, m, v, mx, st, lr, b1, b2, wd, eps, ams, maxi, gs, fi);
}
static void fused_adam_(at::TensorList p, at::TensorList g, at::TensorList m, at::TensorList v, at::TensorList mx,
                        at::TensorList st, double lr, double b1, double b2, double wd, double eps, bool ams, bool maxi,
                        const std::optional<at::Tensor>& gs, const std::optional<at::Tensor>& fi) {
  fused_adam(false, p, g, m, v, mx, st, lr, b1, b2, wd, eps, ams, maxi, gs, fi);
}

// sort and topk (ops.def: SORT, TOPK): a stable sort along dim; topk
// selects in the CPU's order. A 0-dim tensor is seen as [1].
static void sort_launch(tpu_op op, const at::Tensor& self, int64_t dim, bool flag, bool sorted,
                        const at::Tensor& values, const at::Tensor& indices) {
  if (values.numel() == 0) return;
  tpu_tensor ts[3] = {desc1d(values), desc1d(indices), desc1d(self)};
  submit(op, ts, 3,
         op == TPU_OP_SORT ? TPU_PARAMS(SORT, .dim = dim, .descending = flag)
                           : TPU_PARAMS(TOPK, .dim = dim, .largest = flag, .sorted = sorted));
}
static std::tuple<at::Tensor&, at::Tensor&> sort_values_stable(const at::Tensor& self, std::optional<bool>, int64_t dim,
                                                               bool descending, at::Tensor& values,
                                                               at::Tensor& indices) {
  int64_t d = at::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK(indices.scalar_type() == kLong, "sort(): Expected indices to have scalar type Long");
  at::native::resize_output(values, self.sizes());
  at::native::resize_output(indices, self.sizes());
  sort_launch(TPU_OP_SORT, self, self.dim() ? d : 0, descending, true, values, indices);
  return {values, indices};
}
static std::tuple<at::Tensor, at::Tensor> sort_stable(const at::Tensor& self, std::optional<bool> stable, int64_t dim,
                                                      bool descending) {
  // laid out as self is (as CPU's sort lays its results out)
  at::Tensor v = at::empty_like(self), i = at::empty_like(self, self.options().dtype(kLong));
  sort_values_stable(self, stable, dim, descending, v, i);
  return {v, i};
}
static std::tuple<at::Tensor&, at::Tensor&> topk_values(const at::Tensor& self, int64_t k, int64_t dim, bool largest,
                                                        bool sorted, at::Tensor& values, at::Tensor& indices) {
  int64_t d = at::maybe_wrap_dim(dim, self.dim());
  TORCH_CHECK(k >= 0 && k <= (self.dim() > 0 ? self.size(d) : 1), "selected index k out of range");
  TORCH_CHECK(self.scalar_type() != kBool, "\"topk_cpu\" not implemented for 'Bool'");
  std::vector<int64_t> shape(self.sizes().begin(), self.sizes().end());
  if (self.dim() > 0) shape[d] = k;
  at::native::resize_output(values, shape);
  at::native::resize_output(indices, shape);
  sort_launch(TPU_OP_TOPK, self, self.dim() ? d : 0, largest, sorted, values, indices);
  return {values, indices};
}
static std::tuple<at::Tensor, at::Tensor> topk(const at::Tensor& self, int64_t k, int64_t dim, bool largest,
                                               bool sorted) {
  at::Tensor v = at::empty({0}, self.options()), i = at::empty({0}, self.options().dtype(kLong));
  topk_values(self, k, dim, largest, sorted, v, i);
  return {v, i};
}

// histc and bincount: the range (histc with min == max) and the length
// (bincount) depend on the data: read back first (a host sync), as on CUDA.
// histc takes integer inputs too, as CUDA's does (the CPU's rejects them;
// transformers' Mixture-of-Experts routing calls it on int tensors).
static at::Tensor& histc_out(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max,
                             at::Tensor& out) {
  TORCH_CHECK(bins > 0, "torch.histogram(): bins must be > 0, but got ", bins, " for dimension 0");
  TORCH_CHECK(self.scalar_type() != kBool, "\"histc\" not implemented for 'Bool'");
  double lo = min.toDouble(), hi = max.toDouble();
  if (lo == hi && self.numel() > 0) {
    lo = self.min().item<double>();
    hi = self.max().item<double>();
  }
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  TORCH_CHECK(!(std::isinf(lo) || std::isinf(hi) || std::isnan(lo) || std::isnan(hi)), "torch.histc: range of [", lo,
              ", ", hi, "] is not finite");
  TORCH_CHECK(lo < hi, "torch.histc: max must be larger than min");
  at::native::resize_output(out, {bins});
  tpu_tensor ts[2] = {desc(out), desc(self)};
  submit(TPU_OP_HISTC, ts, 2, TPU_PARAMS(HISTC, .min = lo, .max = hi));
  return out;
}
static at::Tensor histc(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max) {
  at::Tensor out = at::empty({0}, self.options());
  return histc_out(self, bins, min, max, out);
}
static at::Tensor bincount(const at::Tensor& self, const std::optional<at::Tensor>& weights, int64_t minlength) {
  TORCH_CHECK(minlength >= 0, "minlength should be >= 0");
  TORCH_CHECK(at::isIntegralType(self.scalar_type(), false), "\"bincount_cpu\" not implemented for '",
              self.scalar_type(), "'");
  TORCH_CHECK(self.dim() == 1 && (self.numel() == 0 || self.min().item<int64_t>() >= 0),
              "bincount only supports 1-d non-negative integral inputs.");
  bool hw = weights.has_value() && weights->defined();
  TORCH_CHECK(!hw || (weights->dim() == 1 && weights->size(0) == self.size(0)),
              "weights should be 1-d and have the same length as input");
  int64_t n = self.numel() == 0 ? minlength : std::max(self.max().item<int64_t>() + 1, minlength);
  auto dt = !hw ? kLong : weights->scalar_type() == kFloat ? kFloat : kDouble;
  at::Tensor out = at::empty({n}, self.options().dtype(dt));
  if (n == 0) return out;
  at::Tensor w = hw ? (weights->device() == self.device() ? *weights : weights->to(self.device())) : at::Tensor();
  tpu_tensor ts[3] = {desc(out), desc(self), hw ? desc(w) : tpu_tensor{}};
  submit(TPU_OP_BINCOUNT, ts, hw ? 3 : 2, {});
  return out;
}

// nonzero: the count first (a host sync: the result's shape depends on the
// data), then the coordinates. The functional form's result is column-major
// ([ndim, n] transposed), as CPU's and CUDA's are.
static int64_t nonzero_count(const at::Tensor& self) {
  TORCH_CHECK(self.dim() <= TPU_MAX_DIMS, "nonzero is not supported for tensors with more than ", TPU_MAX_DIMS,
              " dimensions");
  return self.numel() == 0 ? 0 : at::ne(self, 0).sum().item<int64_t>();
}
static void nonzero_fill(const at::Tensor& self, const at::Tensor& out) {
  if (out.numel() == 0) return;
  tpu_tensor ts[2] = {desc(out), desc(self)};
  submit(TPU_OP_NONZERO, ts, 2, {});
}
static at::Tensor& nonzero_out(const at::Tensor& self, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == kLong, "nonzero: Expected out tensor to have scalar type Long but got scalar type",
              out.scalar_type());
  at::native::resize_output(out, {nonzero_count(self), self.dim()});
  nonzero_fill(self, out);
  return out;
}
static at::Tensor nonzero(const at::Tensor& self) {
  at::Tensor out = at::empty({self.dim(), nonzero_count(self)}, self.options().dtype(kLong)).t();
  nonzero_fill(self, out);
  return out;
}

// The result's strides as CPU's TensorIterator lays them out: dims ordered
// by the strides of the first operand that tells them apart (the indexed
// view over the result's dims, then each index), ties by size.
static std::vector<int64_t> index_out_strides(const AdvIndex& a) {
  int64_t nd = static_cast<int64_t>(a.shape.size());
  std::vector<const at::Tensor*> ops = {&a.view};
  for (auto& t : a.index) ops.push_back(&t);
  auto swap = [&](int64_t d0, int64_t d1) {
    for (const at::Tensor* t : ops) {
      int64_t s0 = t->stride(d0), s1 = t->stride(d1);
      if (s0 == 0 || s1 == 0) continue;
      if (s0 != s1) return s0 < s1 ? -1 : 1;
      if (a.shape[d0] > a.shape[d1]) return 1;
    }
    return 0;
  };
  std::vector<int64_t> perm(nd);  // fastest first
  for (int64_t i = 0; i < nd; i++) perm[i] = nd - 1 - i;
  for (int64_t i = 1; i < nd; i++)
    for (int64_t d1 = i, d0 = i - 1; d0 >= 0; d0--) {
      int c = swap(perm[d0], perm[d1]);
      if (c > 0) {
        std::swap(perm[d0], perm[d1]);
        d1 = d0;
      } else if (c < 0) {
        break;
      }
    }
  std::vector<int64_t> st(nd);
  int64_t next = 1;
  for (int64_t d : perm) {
    st[d] = next;
    next *= std::max<int64_t>(a.shape[d], 1);
  }
  return st;
}

static at::Tensor index_tensor(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  AdvIndex a = adv_index(self, indices);
  at::Tensor out = at::empty_strided(a.shape, index_out_strides(a), self.options());
  if (out.numel() == 0) return out;
  std::vector<tpu_tensor> ts = {desc(out), desc(a.view)};
  for (auto& t : a.index) ts.push_back(desc(t));
  submit(TPU_OP_INDEX, ts.data(), static_cast<int>(ts.size()), TPU_PARAMS(INDEX, .dims = a.dims));
  return out;
}
static at::Tensor& index_tensor_out(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                                    at::Tensor& out) {
  at::Tensor r = index_tensor(self, indices);
  at::native::resize_output(out, r.sizes());
  device_copy(out, r);
  return out;
}

static at::Tensor& index_put_impl(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                                  const at::Tensor& values_in, bool accumulate, bool unsafe) {
  TORCH_CHECK(self.scalar_type() == values_in.scalar_type(),
              "Index put requires the source and destination dtypes match, got ", self.scalar_type(),
              " for the destination and ", values_in.scalar_type(), " for the source.");
  at::Tensor values = values_in.device() == self.device() ? values_in : values_in.to(self.device());
  at::assert_no_internal_overlap(self);
  at::assert_no_overlap(self, values);
  for (const std::optional<at::Tensor>& o : indices)
    if (o.has_value() && o->defined() && o->device() == self.device()) at::assert_no_overlap(self, *o);
  AdvIndex a = adv_index(self, indices);
  int64_t n = 1;
  for (int64_t s : a.shape) n *= s;
  auto vs = values.sizes();
  bool fits = vs.size() <= a.shape.size();
  for (size_t i = 0; fits && i < vs.size(); i++) {
    int64_t want = a.shape[a.shape.size() - vs.size() + i];
    fits = vs[i] == want || vs[i] == 1;
  }
  TORCH_CHECK(fits, "shape mismatch: value tensor of shape ", vs, " cannot be broadcast to indexing result of shape ",
              at::IntArrayRef(a.shape));
  if (n == 0) return self;
  at::Tensor v = values.expand(a.shape);
  std::vector<tpu_tensor> ts = {desc(a.view), desc(v)};
  for (auto& t : a.index) ts.push_back(desc(t));
  submit(TPU_OP_INDEX_PUT, ts.data(), static_cast<int>(ts.size()),
         TPU_PARAMS(INDEX_PUT, .dims = a.dims, .accumulate = accumulate));
  return self;
}

static at::Tensor& gather_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool, at::Tensor& out) {
  check_index(index, "gather", true);
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "Expected out tensor to have dtype ", self.dtype(), ", but got ",
              out.dtype(), " instead");
  at::assert_no_internal_overlap(out);
  at::native::resize_output(out, index.sizes());
  check_out_overlap(out, {self, index}, false);
  if (out.numel() == 0) return out;
  tpu_tensor ts[3] = {desc1d(out), desc1d(self), desc1d(index)};
  submit(TPU_OP_GATHER, ts, 3, TPU_PARAMS(GATHER, .dim = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1))));
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
  tpu_tensor ts[3] = {desc1d(out), desc1d(index), desc1d(src)};
  submit(TPU_OP_SCATTER_ADD, ts, 3,
         TPU_PARAMS(SCATTER_ADD, .dim = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1))));
  return out;
}
// scatter's and scatter_reduce's shape rules, in the CPU's words (d wrapped).
static void check_scatter_shapes(const at::Tensor& self, int64_t d, const at::Tensor& index, const at::Tensor& src) {
  if (index.numel() == 0) return;
  TORCH_CHECK(std::max<int64_t>(index.dim(), 1) == std::max<int64_t>(self.dim(), 1),
              "Index tensor must have the same number of dimensions as self tensor");
  TORCH_CHECK(std::max<int64_t>(src.dim(), 1) == std::max<int64_t>(self.dim(), 1),
              "Index tensor must have the same number of dimensions as src tensor");
  bool ok = true;
  for (int64_t i = 0; i < index.dim(); i++)
    ok = ok && index.size(i) <= src.size(i) && (i == d || index.size(i) <= self.size(i));
  TORCH_CHECK(ok, "Expected index ", index.sizes(), " to be no larger than self ", self.sizes(),
              " apart from dimension ", d, " and to be no larger size than src ", src.sizes());
}
// scatter (a copy; the value form scatters a host scalar, filled to the
// index's shape first). Checks in PyTorch's words (its structured meta does
// not run for an out kernel registered here).
static at::Tensor& scatter_src_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                                   at::Tensor& out) {
  TORCH_CHECK(index.numel() == 0 || index.scalar_type() == kLong || index.scalar_type() == kInt,
              "scatter(): Expected dtype int32/int64 for index");
  TORCH_CHECK(self.scalar_type() == src.scalar_type(), "scatter(): Expected self.dtype to be equal to src.dtype");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  check_scatter_shapes(self, d, index, src);
  if (!out.is_same(self)) {
    at::native::resize_output(out, self.sizes());
    device_copy(out, self);
  }
  if (index.numel() == 0) return out;
  tpu_tensor ts[3] = {desc1d(out), desc1d(index), desc1d(src)};
  submit(TPU_OP_SCATTER, ts, 3, TPU_PARAMS(SCATTER, .dim = d));
  return out;
}
static at::Tensor& scatter_value_out(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                                     const c10::Scalar& value, at::Tensor& out) {
  at::Tensor src = at::empty(index.sizes(), self.options());
  src.fill_(value);
  return scatter_src_out(self, dim, index, src, out);
}
// scatter_reduce (index_reduce runs on its index expanded to the source's
// shape): sum and mean through SCATTER_ADD (mean divides by the count, self's
// element counted with include_self; floor division for integers, as the CPU),
// prod / amax / amin through SCATTER_REDUCE. Without include_self the
// scattered-to positions start from the reduction's identity.
static at::Tensor& reduce_scattered(const at::Tensor& self, int64_t d, const at::Tensor& index, const at::Tensor& src,
                                    c10::string_view reduce, bool include_self, at::Tensor& out) {
  if (!out.is_same(self)) {
    at::native::resize_output(out, self.sizes());
    device_copy(out, self);
  }
  if (index.numel() == 0) return out;
  const bool mean = reduce == "mean", add = reduce == "sum" || mean;
  const bool mx = reduce == "amax" || reduce == "max", mn = reduce == "amin" || reduce == "min";  // (old names)
  if (!include_self) {
    c10::Scalar id = 0;
    if (reduce == "prod") id = 1;
    if (mx || mn) {
      if (at::isFloatingType(self.scalar_type()))
        id = mx ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
      else
        AT_DISPATCH_INTEGRAL_TYPES(self.scalar_type(), "scatter_reduce", [&] {
          id = mx ? std::numeric_limits<scalar_t>::lowest() : std::numeric_limits<scalar_t>::max();
        });
    }
    scatter_value_out(out, d, index, id, out);
  }
  if (add) {
    scatter_add_out(out, d, index, src, out);
  } else {
    tpu_tensor ts[3] = {desc1d(out), desc1d(index), desc1d(src)};
    submit(TPU_OP_SCATTER_REDUCE, ts, 3, TPU_PARAMS(SCATTER_REDUCE, .dim = d, .reduce = mx ? 1 : mn ? 2 : 0));
  }
  if (mean) {
    at::Tensor cnt = include_self ? at::ones_like(out) : at::zeros_like(out);
    cnt.scatter_add_(d, index, at::ones_like(src));
    cnt.masked_fill_(cnt.eq(0), 1);
    if (at::isFloatingType(out.scalar_type()))
      out.div_(cnt);
    else
      out.div_(cnt, "floor");
  }
  return out;
}
static at::Tensor& scatter_reduce_out(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                                      const at::Tensor& src, c10::string_view reduce, bool include_self,
                                      at::Tensor& out) {
  TORCH_CHECK(reduce == "sum" || reduce == "prod" || reduce == "mean" || reduce == "amax" || reduce == "amin" ||
                  reduce == "max" || reduce == "min",  // the CPU takes the old names too
              "reduce argument must be either sum, prod, mean, amax or amin, got ", reduce);
  TORCH_CHECK(index.numel() == 0 || index.scalar_type() == kLong, "scatter(): Expected dtype int64 for index");
  TORCH_CHECK(self.scalar_type() == src.scalar_type(), "scatter(): Expected self.dtype to be equal to src.dtype");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  check_scatter_shapes(self, d, index, src);
  if (!out.is_same(self)) check_out_overlap(out, {self, index, src});
  return reduce_scattered(self, d, index, src, reduce, include_self, out);
}
static at::Tensor& index_reduce_out(const at::Tensor& self, int64_t dim, const at::Tensor& index,
                                    const at::Tensor& source, c10::string_view reduce, bool include_self,
                                    at::Tensor& out) {
  TORCH_CHECK(reduce == "prod" || reduce == "mean" || reduce == "amax" || reduce == "amin",
              "index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got ", reduce, ".");
  int64_t d = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1));
  TORCH_CHECK(index.dim() <= 1, "index_reduce_(): Index is supposed to be a vector");
  TORCH_CHECK(index.scalar_type() == kLong || index.scalar_type() == kInt,
              "index_reduce_(): Expected dtype int32/int64 for index but got: ", index.scalar_type());
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "index_reduce_(): self (", self.scalar_type(),
              ") and source (", source.scalar_type(), ") must have the same scalar type");
  TORCH_CHECK(d == 0 || d < source.dim(), "index_reduce_(): Indexing dim ", d,
              " is out of bounds of the source tensor with dim ", source.dim());
  TORCH_CHECK(index.numel() == (source.dim() == 0 ? 1 : source.size(d)), "index_reduce_(): Number of indices (",
              index.numel(), ") should be equal to source.size(dim) (", (source.dim() == 0 ? 1 : source.size(d)), ")");
  at::Tensor src = source.dim() == 0 ? source.reshape({1}) : source;
  std::vector<int64_t> shape(std::max<int64_t>(self.dim(), 1), 1);
  shape[d] = index.numel();
  at::Tensor ix = index.to(kLong).reshape(shape).expand(src.sizes());
  if (self.dim() == 0) {  // a 0-dim self is seen as [1]
    at::Tensor o = out.is_same(self) ? out.view({1}) : out;
    if (!out.is_same(self)) {
      at::native::resize_output(out, self.sizes());
      device_copy(out, self);
      o = out.view({1});
    }
    reduce_scattered(o, 0, ix, src, reduce, include_self, o);
    return out;
  }
  return reduce_scattered(self, d, ix, src, reduce, include_self, out);
}
static at::Tensor& index_add_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                                 const c10::Scalar& alpha, at::Tensor& out) {
  check_index(index, "index_add");
  if (!out.is_same(self)) {
    at::native::resize_output(out, self.sizes());
    device_copy(out, self);
  }
  if (index.numel() == 0) return out;
  tpu_tensor ts[3] = {desc1d(out), desc1d(index), desc1d(src)};
  submit(TPU_OP_INDEX_ADD, ts, 3,
         TPU_PARAMS(INDEX_ADD, .dim = at::maybe_wrap_dim(dim, std::max<int64_t>(self.dim(), 1)),
                    .alpha = alpha.toDouble()));
  return out;
}
static at::Tensor embedding_dense_backward(const at::Tensor& grad, const at::Tensor& indices, int64_t num_weights,
                                           int64_t padding_idx, bool scale_grad_by_freq) {
  TORCH_CHECK_NOT_IMPLEMENTED(!scale_grad_by_freq,
                              "embedding backward with scale_grad_by_freq=True is not implemented on tpu yet");
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
    case kDouble:
      return std::numeric_limits<double>::max();
    case kHalf:
      return 65504.0;
    case kBFloat16:
      return 3.3895313892515355e38;
    default:
      return std::numeric_limits<float>::max();
  }
}
static int float_digits(c10::ScalarType st) {
  switch (st) {
    case kDouble:
      return 53;
    case kHalf:
      return 11;
    case kBFloat16:
      return 8;
    default:
      return 24;
  }
}

// Empty tensors are launched too (seed and offset 0): the runtime's dtype check raises for any size, as PyTorch does.
static std::pair<int64_t, int64_t> rand_seed(const at::Tensor& self, const std::optional<at::Generator>& gen) {
  if (self.numel() == 0) return {0, 0};
  auto [seed, off] = philox_next(gen, self.device().index());
  return {static_cast<int64_t>(seed), static_cast<int64_t>(off)};
}
static void rand_fill(tpu_op op, const at::Tensor& self, const tpu_params& p, const at::Tensor* prob = nullptr) {
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
  auto [seed, off] = rand_seed(self, gen);
  rand_fill(TPU_OP_RAND_UNIFORM, self, TPU_PARAMS(RAND_UNIFORM, .seed = seed, .offset = off, .from = from, .to = to));
  return self;
}
static at::Tensor& normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  auto [seed, off] = rand_seed(self, gen);
  rand_fill(TPU_OP_RAND_NORMAL, self, TPU_PARAMS(RAND_NORMAL, .seed = seed, .offset = off, .mean = mean, .std = std));
  return self;
}
static at::Tensor& bernoulli_f(at::Tensor& self, double prob, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 <= prob && prob <= 1, "bernoulli_ expects p to be in [0, 1], but got p=", prob);
  at::assert_no_internal_overlap(self);
  auto [seed, off] = rand_seed(self, gen);
  rand_fill(TPU_OP_RAND_BERNOULLI, self, TPU_PARAMS(RAND_BERNOULLI, .seed = seed, .offset = off, .p = prob));
  return self;
}
static at::Tensor& bernoulli_t(at::Tensor& self, const at::Tensor& prob, std::optional<at::Generator> gen) {
  check_out_overlap(self, {prob});
  auto [seed, off] = rand_seed(self, gen);
  rand_fill(TPU_OP_RAND_BERNOULLI, self, TPU_PARAMS(RAND_BERNOULLI, .seed = seed, .offset = off), &prob);
  return self;
}
// cauchy_, log_normal_ and geometric_ with the checks and words of PyTorch's templates (DistributionTemplates.h).
static at::Tensor& cauchy_(at::Tensor& self, double median, double sigma, std::optional<at::Generator> gen) {
  TORCH_CHECK(isFloatingType(self.scalar_type()),
              "Cauchy distribution is a continuous probability distribution. dtype must be a floating point but "
              "you specified ",
              self.dtype());
  TORCH_CHECK(sigma > 0.0, "cauchy_ expects sigma > 0.0, but found sigma=", sigma);
  auto [seed, off] = rand_seed(self, gen);
  rand_fill(TPU_OP_RAND_CAUCHY, self,
            TPU_PARAMS(RAND_CAUCHY, .seed = seed, .offset = off, .median = median, .sigma = sigma));
  return self;
}
static at::Tensor& log_normal_(at::Tensor& self, double mean, double std, std::optional<at::Generator> gen) {
  TORCH_CHECK(std > 0.0, "log_normal_ expects std > 0.0, but found std=", std);
  auto [seed, off] = rand_seed(self, gen);
  rand_fill(TPU_OP_RAND_LOG_NORMAL, self,
            TPU_PARAMS(RAND_LOG_NORMAL, .seed = seed, .offset = off, .mean = mean, .std = std));
  return self;
}
static at::Tensor& geometric_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(0 < p && p < 1, "geometric_ expects p to be in (0, 1), but got p=", p);
  auto [seed, off] = rand_seed(self, gen);
  rand_fill(TPU_OP_RAND_GEOMETRIC, self, TPU_PARAMS(RAND_GEOMETRIC, .seed = seed, .offset = off, .p = p));
  return self;
}

// The largest value random_ draws without `to`: 2^digits for floating dtypes, the dtype's max otherwise.
static int64_t random_max(c10::ScalarType st) {
  switch (st) {
    case kFloat:
    case kDouble:
    case kHalf:
    case kBFloat16:
      return int64_t{1} << float_digits(st);
    case kBool:
      return 1;
    case kByte:
      return 255;
    case kChar:
      return 127;
    case kShort:
      return 32767;
    case kInt:
      return 2147483647;
    default:
      return std::numeric_limits<int64_t>::max();
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
static at::Tensor& random_from(at::Tensor& self, int64_t from, std::optional<int64_t> to,
                               std::optional<at::Generator> gen) {
  auto st = self.scalar_type();
  int64_t high = 0, inclusive = 0;
  if (to) {  // [from, to)
    TORCH_CHECK(from < *to, "random_ expects 'from' to be less than 'to', but got from=", from, " >= to=", *to);
    check_random_range(self, from, *to - 1);
    high = *to;
  } else if (from != std::numeric_limits<int64_t>::lowest()) {  // [from, random_max]
    int64_t to_inc = random_max(st);
    if (isFloatingType(st))
      TORCH_CHECK(from < to_inc,
                  "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' casted "
                  "to dtype, but got from=",
                  from, " > to_inc=", to_inc);
    check_random_range(self, from, to_inc);
    high = to_inc;
    inclusive = 1;
  } else {  // all 2^64 values
    TORCH_CHECK(st == kLong || st == kDouble || st == kFloat || st == kBFloat16,
                "random_full_64_bits_range_kernel handles only int64, double, float and bfloat16");
    high = std::numeric_limits<int64_t>::max();
    inclusive = 1;
  }
  auto [seed, off] = rand_seed(self, gen);
  rand_fill(TPU_OP_RAND_INT, self,
            TPU_PARAMS(RAND_INT, .seed = seed, .offset = off, .low = from, .high = high, .inclusive = inclusive));
  return self;
}
static at::Tensor& random_to(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  return random_from(self, 0, to, gen);
}
static at::Tensor& random_all(at::Tensor& self, std::optional<at::Generator> gen) {
  return random_from(self, 0, std::nullopt, gen);
}

static std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  auto mask = at::empty(input.sizes(), input.options().dtype(kBool));
  if (!train.has_value() || *train) {
    // PyTorch scales by a float (input * mask * (1 / (1 - p))), which an integer tensor cannot hold.
    TORCH_CHECK(isFloatingType(input.scalar_type()), "result type Float can't be cast to the desired output type ",
                input.scalar_type());
    if (p >= 1.0) {
      mask.zero_();
      auto z = at::empty(input.sizes(), input.options());
      z.zero_();
      return {z, mask};
    }
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

// ---------------------------------------------------------------- convolution, pooling
static int64_t pack2(int64_t h, int64_t w) {
  TORCH_CHECK(h >= 0 && w >= 0 && h < 65536 && w < 65536, "tpu convolution/pooling parameters must be in [0, 65535]");
  return h | (w << 16);
}
static int64_t at2(c10::IntArrayRef v, size_t i, int64_t dflt) { return v.empty() ? dflt : v[v.size() == 1 ? 0 : i]; }

// Window parameters (kh, kw, stride, padding, dilation) in the runtime's packed form
// (IM2COL, COL2IM and MAXPOOL2D pack the same; MAXPOOL2D_BWD's kernel reads them too).
static tpu_params win_params(int64_t kh, int64_t kw, c10::IntArrayRef st, c10::IntArrayRef pad, c10::IntArrayRef dil,
                             bool one_d) {
  return TPU_PARAMS(IM2COL, .kernel = pack2(kh, kw),
                    .stride = one_d ? pack2(1, at2(st, 0, 1)) : pack2(at2(st, 0, 1), at2(st, 1, 1)),
                    .padding = one_d ? pack2(0, at2(pad, 0, 0)) : pack2(at2(pad, 0, 0), at2(pad, 1, 0)),
                    .dilation = one_d ? pack2(1, at2(dil, 0, 1)) : pack2(at2(dil, 0, 1), at2(dil, 1, 1)));
}
// Where a convolution sums partial products outside the matrix unit (the
// windows COL2IM folds, the batch's weight gradients) the half types sum in
// float32 and round once, as the CPU's kernels do.
static c10::ScalarType window_acc(c10::ScalarType st) {
  return st == at::kHalf || st == at::kBFloat16 ? at::kFloat : st;
}
static int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

// 3-d convolutions (conv3d, conv_transpose3d) are composed from the 2-d ones
// below; their definitions follow the 2-d backward.
static at::Tensor conv3d(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                         c10::IntArrayRef output_padding, int64_t groups);
static std::tuple<at::Tensor, at::Tensor, at::Tensor> conv3d_backward(const at::Tensor& grad, const at::Tensor& input,
                                                                      const at::Tensor& weight, c10::IntArrayRef stride,
                                                                      c10::IntArrayRef padding,
                                                                      c10::IntArrayRef dilation, bool transposed,
                                                                      c10::IntArrayRef output_padding, int64_t groups,
                                                                      std::array<bool, 3> mask);

// Transposed convolution (1-d, 2-d): the input-gradient of a convolution
// whose weight it shares (Cin, Cout/G, kh, kw). Forward, per group: the
// columns W_g^T @ x_g folded into the output by COL2IM, then the bias.
// Backward: dx = conv(dy, W) (IM2COL, GEMM); dW_g = sum over the batch of
// x_g @ im2col(dy_g)^T; db = dy summed over batch and space. When
// output_padding reaches the stride, the windows no longer tile the output:
// COL2IM / IM2COL then work on the uncropped image (no padding; the output
// is its window [padding, padding + size), zeros past its end).
struct ConvT {
  bool one_d, direct;  // direct: output_padding < stride (the windows tile the output)
  at::Tensor x, w;     // 4-d views; x contiguous
  int64_t N, Cin, H, W, G, Cig, Cog, kh, kw, K, L;
  int64_t OH, OW;          // the output's size
  int64_t FH, FW, ph, pw;  // the uncropped image's size; the padding
  tpu_params p, p0;        // window parameters, and the same without padding
};
static ConvT convt_setup(const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
                         c10::IntArrayRef padding, c10::IntArrayRef dilation, c10::IntArrayRef output_padding,
                         int64_t groups) {
  ConvT c;
  c.one_d = input.dim() == 3;
  c.x = (c.one_d ? input.unsqueeze(2) : input).contiguous();
  c.w = c.one_d ? weight.unsqueeze(2) : weight;
  c.N = c.x.size(0), c.Cin = c.x.size(1), c.H = c.x.size(2), c.W = c.x.size(3), c.G = groups;
  TORCH_CHECK(groups > 0 && c.Cin % groups == 0 && c.w.size(0) == c.Cin, "Given transposed=1, weight of size ",
              weight.sizes(), ", expected input", input.sizes(), " to have ", c.w.size(0), " channels, but got ", c.Cin,
              " channels instead");
  c.Cig = c.Cin / groups, c.Cog = c.w.size(1), c.kh = c.w.size(2), c.kw = c.w.size(3);
  c.K = c.Cog * c.kh * c.kw, c.L = c.H * c.W;
  c.p = win_params(c.kh, c.kw, stride, padding, dilation, c.one_d);
  const tpu_args_IM2COL win = tpu_unpack_IM2COL(&c.p);
  const int64_t sh = win.stride & 0xffff, sw = win.stride >> 16, dh = win.dilation & 0xffff, dw = win.dilation >> 16;
  const int64_t oph = c.one_d ? 0 : at2(output_padding, 0, 0), opw = at2(output_padding, c.one_d ? 0 : 1, 0);
  c.ph = win.padding & 0xffff, c.pw = win.padding >> 16;
  c.FH = (c.H - 1) * sh + dh * (c.kh - 1) + 1, c.FW = (c.W - 1) * sw + dw * (c.kw - 1) + 1;
  c.OH = c.FH - 2 * c.ph + oph, c.OW = c.FW - 2 * c.pw + opw;
  c.direct = oph < sh && opw < sw;
  c.p0 = TPU_PARAMS(IM2COL, .kernel = win.kernel, .stride = win.stride, .padding = 0, .dilation = win.dilation);
  return c;
}
static at::Tensor conv_transpose(const at::Tensor& input, const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                 c10::IntArrayRef padding, c10::IntArrayRef dilation, c10::IntArrayRef output_padding,
                                 int64_t groups) {
  ConvT c = convt_setup(input, weight, stride, padding, dilation, output_padding, groups);
  TORCH_CHECK(c.OH > 0 && c.OW > 0, "Given input size per channel: (", c.H, " x ", c.W,
              "). Calculated output size per channel: (", c.OH, " x ", c.OW, "). Output size is too small");
  const auto acc = c.x.options().dtype(window_acc(c.x.scalar_type()));
  at::Tensor out = at::empty({c.N, c.Cog * c.G, c.direct ? c.OH : c.FH, c.direct ? c.OW : c.FW}, acc);
  at::Tensor cols = at::empty({c.N, c.K, c.L}, acc);
  at::Tensor wm = c.w.reshape({c.Cin, c.K});
  for (int64_t g = 0; g < c.G; g++) {
    at::Tensor xg = c.x.narrow(1, g * c.Cig, c.Cig), wg = wm.narrow(0, g * c.Cig, c.Cig);
    gemm(cols, bat3(cols), as3(wg, c.N, c.K, c.Cig, 0, wg.stride(1), wg.stride(0)),
         as3(xg, c.N, c.Cig, c.L, xg.stride(0), xg.stride(1), 1), nullptr, {}, 1.0, 0.0);
    at::Tensor og = out.narrow(1, g * c.Cog, c.Cog);
    tpu_tensor ts[2] = {desc(og), desc(cols)};
    submit(TPU_OP_COL2IM, ts, 2, c.direct ? c.p : c.p0);
  }
  if (!c.direct) {  // the output: the uncropped image's window at the padding, zeros past its end
    at::Tensor full = out;
    out = at::zeros({c.N, c.Cog * c.G, c.OH, c.OW}, acc);
    int64_t rows = std::min(c.OH, c.FH - c.ph), colsn = std::min(c.OW, c.FW - c.pw);
    if (rows > 0 && colsn > 0)
      out.narrow(2, 0, rows).narrow(3, 0, colsn).copy_(full.narrow(2, c.ph, rows).narrow(3, c.pw, colsn));
  }
  if (bias.has_value() && bias->defined()) out.add_(bias->view({1, -1, 1, 1}));
  out = out.to(c.x.scalar_type());
  return c.one_d ? out.squeeze(2) : out;
}
static std::tuple<at::Tensor, at::Tensor, at::Tensor> conv_transpose_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, c10::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> mask) {
  ConvT c = convt_setup(input, weight, stride, padding, dilation, output_padding, groups);
  at::Tensor gy = (c.one_d ? grad.unsqueeze(2) : grad).contiguous(), gyo = gy;
  if (!c.direct) {  // dy placed in the uncropped image
    at::Tensor full = at::zeros({c.N, c.Cog * c.G, c.FH, c.FW}, gy.options());
    int64_t rows = std::min(c.OH, c.FH - c.ph), colsn = std::min(c.OW, c.FW - c.pw);
    if (rows > 0 && colsn > 0)
      full.narrow(2, c.ph, rows).narrow(3, c.pw, colsn).copy_(gy.narrow(2, 0, rows).narrow(3, 0, colsn));
    gy = full;
  }
  at::Tensor gx, gw, gb;
  if (mask[0]) gx = at::empty(c.x.sizes(), c.x.options());
  if (mask[1]) gw = at::empty({c.Cin, c.K}, c.w.options());
  if (mask[2]) gb = gyo.sum({0, 2, 3});
  at::Tensor wm = c.w.reshape({c.Cin, c.K});
  at::Tensor cols = at::empty({c.N, c.K, c.L}, c.x.options());
  for (int64_t g = 0; (mask[0] || mask[1]) && g < c.G; g++) {
    at::Tensor gyg = gy.narrow(1, g * c.Cog, c.Cog);
    tpu_tensor ts[2] = {desc(cols), desc(gyg)};
    submit(TPU_OP_IM2COL, ts, 2, c.direct ? c.p : c.p0);  // windows of dy: (N, Cog*kh*kw, H*W)
    at::Tensor wg = wm.narrow(0, g * c.Cig, c.Cig);
    if (mask[0]) {
      at::Tensor gxg = gx.narrow(1, g * c.Cig, c.Cig);
      gemm(gx, as3(gxg, c.N, c.Cig, c.L, gxg.stride(0), gxg.stride(1), 1),
           as3(wg, c.N, c.Cig, c.K, 0, wg.stride(0), wg.stride(1)), bat3(cols), nullptr, {}, 1.0, 0.0);
    }
    if (mask[1]) {
      at::Tensor xg = c.x.narrow(1, g * c.Cig, c.Cig);
      at::Tensor part = at::empty({c.N, c.Cig, c.K}, c.x.options().dtype(window_acc(c.x.scalar_type())));
      gemm(part, bat3(part), as3(xg, c.N, c.Cig, c.L, xg.stride(0), xg.stride(1), 1),
           as3(cols, c.N, c.L, c.K, cols.stride(0), 1, cols.stride(1)), nullptr, {}, 1.0, 0.0);
      gw.narrow(0, g * c.Cig, c.Cig).copy_(part.sum(0));
    }
  }
  if (gw.defined()) gw = gw.view(c.w.sizes());
  if (c.one_d) {
    if (gx.defined()) gx = gx.squeeze(2);
    if (gw.defined()) gw = gw.squeeze(2);
  }
  return {gx, gw, gb};
}

static at::Tensor convolution(const at::Tensor& input_, const at::Tensor& weight_,
                              const std::optional<at::Tensor>& bias, c10::IntArrayRef stride, c10::IntArrayRef padding,
                              c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
                              int64_t groups) {
  if (input_.dim() == 5)
    return conv3d(input_, weight_, bias, stride, padding, dilation, transposed, output_padding, groups);
  if (transposed) return conv_transpose(input_, weight_, bias, stride, padding, dilation, output_padding, groups);
  const bool one_d = input_.dim() == 3;
  at::Tensor x = one_d ? input_.unsqueeze(2) : input_, w = one_d ? weight_.unsqueeze(2) : weight_;
  const int64_t N = x.size(0), C = x.size(1), O = w.size(0), kh = w.size(2), kw = w.size(3);
  TORCH_CHECK(groups > 0 && C % groups == 0 && O % groups == 0 && w.size(1) * groups == C, "Given groups=", groups,
              ", weight of size ", weight_.sizes(), ", expected input", input_.sizes(), " to have ", w.size(1) * groups,
              " channels, but got ", C, " channels instead");
  tpu_params p = win_params(kh, kw, stride, padding, dilation, one_d);
  const tpu_args_IM2COL win = tpu_unpack_IM2COL(&p);
  const int64_t sh = win.stride & 0xffff, sw = win.stride >> 16, ph = win.padding & 0xffff, pw = win.padding >> 16;
  const int64_t dh = win.dilation & 0xffff, dw = win.dilation >> 16;
  const int64_t OH = conv_out(x.size(2), kh, sh, ph, dh), OW = conv_out(x.size(3), kw, sw, pw, dw);
  TORCH_CHECK(OH > 0 && OW > 0, "Calculated output size is too small for the input size ", input_.sizes());
  TORCH_CHECK(w.scalar_type() == x.scalar_type(), "expected scalar type ", x.scalar_type(), " but found ",
              w.scalar_type());
  const int64_t G = groups, Cg = C / G, Og = O / G, K = Cg * kh * kw, L = OH * OW;
  at::Tensor out = at::empty({N, O, OH, OW}, x.options());
  const auto st = x.scalar_type();
  if (st == at::kFloat || st == at::kBFloat16 || st == at::kHalf) {
    // The matrix unit reads the windows straight from the image (no im2col buffer);
    // float64 and integers take im2col + the exact matmul below.
    const bool has_bias = bias.has_value() && bias->defined();
    if (out.numel() > 0) {
      at::Tensor wc = w.contiguous();  // (C/groups, kh, kw) dense together, as the kernel requires
      tpu_tensor ts[4] = {desc(out), desc(x), desc(wc), has_bias ? desc(*bias) : tpu_tensor{}};
      submit(TPU_OP_CONV2D, ts, has_bias ? 4 : 3,
             TPU_PARAMS(CONV2D, .kernel = win.kernel, .stride = win.stride, .padding = win.padding,
                        .dilation = win.dilation, .groups = groups, .precision = matmul_precision()));
    }
    return one_d ? out.squeeze(2) : out;
  }
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

// The output's layout, as the CPU's kernels choose it: channels-last when the
// input or the weight is (oneDNN's rule; its float64 3-d kernel stays
// contiguous). A 1-d convolution is a 2-d one on unsqueezed tensors there too.
static at::Tensor conv_layout(at::Tensor out, const at::Tensor& input, const at::Tensor& weight) {
  const int nd = static_cast<int>(input.dim());
  const auto st = input.scalar_type();
  if (!isFloatingType(st) || (nd == 5 && st == at::kDouble)) return out;
  auto fmt = nd == 5 ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast;
  auto as4 = [nd](const at::Tensor& t) { return nd == 3 ? t.unsqueeze(2) : t; };
  if (nd < 3 || (as4(input).suggest_memory_format() != fmt && as4(weight).suggest_memory_format() != fmt)) return out;
  return nd == 3 ? out.unsqueeze(2).contiguous(fmt).squeeze(2) : out.contiguous(fmt);
}
static at::Tensor convolution_op(const at::Tensor& input, const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                 c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                 c10::IntArrayRef output_padding, int64_t groups) {
  return conv_layout(
      at::tpu::convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups), input,
      weight);
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_, const at::Tensor& input_, const at::Tensor& weight_, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> mask) {
  if (input_.dim() == 5)
    return conv3d_backward(grad_, input_, weight_, stride, padding, dilation, transposed, output_padding, groups, mask);
  if (transposed)
    return conv_transpose_backward(grad_, input_, weight_, stride, padding, dilation, output_padding, groups, mask);
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
  const auto acc = x.options().dtype(window_acc(x.scalar_type()));
  at::Tensor cols = at::empty({N, K, L}, x.options()), dcols = mask[0] ? at::empty({N, K, L}, acc) : at::Tensor();
  at::Tensor gxa = mask[0] && acc.dtype() != x.dtype() ? at::empty(x.sizes(), acc) : gx;
  at::Tensor gy3 = gy.view({N, O, L});
  for (int64_t g = 0; g < G; g++) {
    at::Tensor gyg = gy3.narrow(1, g * Og, Og);
    if (mask[1]) {  // dW_g = sum_n gy_g[n] @ cols_g[n]^T
      at::Tensor xg = x.narrow(1, g * Cg, Cg);
      tpu_tensor ts[2] = {desc(cols), desc(xg)};
      submit(TPU_OP_IM2COL, ts, 2, p);
      at::Tensor part = at::empty({N, Og, K}, acc);
      gemm(part, bat3(part), bat3(gyg), as3(cols, N, L, K, cols.stride(0), 1, cols.stride(1)), nullptr, {}, 1.0, 0.0);
      gw.narrow(0, g * Og, Og).copy_(part.sum(0));
    }
    if (mask[0]) {  // dcols = W_g^T @ gy_g, then fold windows back
      at::Tensor wg = wm.narrow(0, g * Og, Og);
      gemm(dcols, bat3(dcols), as3(wg, N, K, Og, 0, wg.stride(1), wg.stride(0)), bat3(gyg), nullptr, {}, 1.0, 0.0);
      at::Tensor gxg = gxa.narrow(1, g * Cg, Cg);
      tpu_tensor ts[2] = {desc(gxg), desc(dcols)};
      submit(TPU_OP_COL2IM, ts, 2, p);
    }
  }
  if (mask[0] && !gxa.is_same(gx)) gx.copy_(gxa);
  if (gw.defined()) gw = gw.view(w.sizes());
  if (one_d) {
    if (gx.defined()) gx = gx.squeeze(2);
    if (gw.defined()) gw = gw.squeeze(2);
  }
  return {gx, gw, gb};
}

// 3-d convolution as one 2-d convolution over depth windows. A kernel of
// depth KD, stride sd and dilation dd reads, for output depth od, the
// depth-padded input's slices od * sd + kd * dd. Gathered into the channels
// (channel c * KD + kd, so each group's channels stay together), those
// windows make conv3d(x, w) the conv2d of an (N * OD, C * KD, H, W) image with
// the weight (O, C / G * KD, kh, kw), a view of w: the 2-d kernels then
// accumulate each output over the whole window once, as the CPU's 3-d kernel.
// Transposed, it is the adjoint: the conv_transpose2d of the depth slices
// gives (N * D, Cout * KD, OH, OW), whose windows add back into the uncropped
// depth. The gradients follow the same two maps the other way. Sums of
// windows that overlap (sd < KD * dd) run in float32 for the half types.
struct Conv3 {
  int64_t KD, sd, pd, dd, opd;
  std::vector<int64_t> s2, p2, d2, op2;  // the 2-d convolution's parameters (height, width)
};
static Conv3 conv3_setup(const at::Tensor& weight, c10::IntArrayRef stride, c10::IntArrayRef padding,
                         c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding) {
  Conv3 c{weight.size(2),
          at2(stride, 0, 1),
          at2(padding, 0, 0),
          at2(dilation, 0, 1),
          transposed ? at2(output_padding, 0, 0) : 0,
          {},
          {},
          {},
          {}};
  for (size_t i = 1; i < 3; i++) {
    c.s2.push_back(at2(stride, i, 1));
    c.p2.push_back(at2(padding, i, 0));
    c.d2.push_back(at2(dilation, i, 1));
    c.op2.push_back(transposed ? at2(output_padding, i, 0) : 0);
  }
  return c;
}
// (N, C, Dp, H, W) -> (N * n, C * KD, H, W): the n depth windows of a volume, window i at depth i * sd.
static at::Tensor depth_windows(const at::Tensor& v, const Conv3& c, int64_t n) {
  const int64_t N = v.size(0), C = v.size(1), H = v.size(3), W = v.size(4);
  auto s = v.strides();
  return v.as_strided({N, n, C, c.KD, H, W}, {s[0], c.sd * s[2], s[1], c.dd * s[2], s[3], s[4]}, v.storage_offset())
      .reshape({N * n, C * c.KD, H, W});
}
// The adjoint: t (N * n, C * KD, H, W) added into the volume acc (N, C, Dp, H, W), one strided slice per kd.
static void depth_windows_add(at::Tensor& acc, const at::Tensor& t, const Conv3& c, int64_t n) {
  const int64_t N = acc.size(0), C = acc.size(1), H = acc.size(3), W = acc.size(4);
  at::Tensor tv = t.view({N, n, C, c.KD, H, W});
  for (int64_t kd = 0; kd < c.KD; kd++)
    acc.slice(2, kd * c.dd, kd * c.dd + (n - 1) * c.sd + 1, c.sd).add_(tv.select(3, kd).permute({0, 2, 1, 3, 4}));
}
// x zero-padded by `before` / `after` slices in depth (d: the depth kept from x).
static at::Tensor pad_depth(const at::Tensor& x, int64_t before, int64_t after, int64_t d) {
  if (before == 0 && after == 0 && d == x.size(2)) return x;
  auto sz = x.sizes().vec();
  sz[2] = before + d + after;
  at::Tensor out = at::zeros(sz, x.options());
  if (d > 0) out.narrow(2, before, d).copy_(x.narrow(2, 0, d));
  return out;
}
// (N, n, C, H, W) <-> (N * n, C, H, W) with the depth moved next to the batch.
static at::Tensor depth_to_batch(const at::Tensor& x) {
  return x.permute({0, 2, 1, 3, 4}).reshape({x.size(0) * x.size(2), x.size(1), x.size(3), x.size(4)});
}
// A fresh contiguous copy with the CPU's strides (contiguous() keeps a view whose only odd strides are at size-1 dims).
static at::Tensor dense(const at::Tensor& t) { return t.clone(at::MemoryFormat::Contiguous); }
static at::Tensor batch_to_depth(const at::Tensor& x, int64_t N) {
  return dense(x.view({N, x.size(0) / N, x.size(1), x.size(2), x.size(3)}).permute({0, 2, 1, 3, 4}));
}

static at::Tensor conv3d(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                         c10::IntArrayRef output_padding, int64_t groups) {
  const Conv3 c = conv3_setup(weight, stride, padding, dilation, transposed, output_padding);
  const int64_t N = input.size(0), D = input.size(2);
  at::Tensor w2 = weight.reshape({weight.size(0), weight.size(1) * c.KD, weight.size(3), weight.size(4)});
  const bool has_bias = bias.has_value() && bias->defined();
  if (!transposed) {
    const int64_t OD = conv_out(D, c.KD, c.sd, c.pd, c.dd);
    TORCH_CHECK(OD > 0, "Calculated output size is too small for the input size ", input.sizes());
    at::Tensor x2 = depth_windows(pad_depth(input, c.pd, c.pd, D), c, OD);
    return batch_to_depth(at::tpu::convolution(x2, w2, bias, c.s2, c.p2, c.d2, false, c.op2, groups), N);
  }
  const int64_t Dp = (D - 1) * c.sd + c.dd * (c.KD - 1) + 1, OD = Dp - 2 * c.pd + c.opd;
  TORCH_CHECK(OD > 0, "Given input size per channel: (", D, " x ", input.size(3), " x ", input.size(4),
              "). Output size is too small");
  // Overlapping windows sum the slices' partial outputs: the half types run in float32 then (one rounding).
  const auto wdt = c.sd < c.KD * c.dd ? window_acc(input.scalar_type()) : input.scalar_type();
  at::Tensor t = at::tpu::convolution(depth_to_batch(input).to(wdt), w2.to(wdt), std::nullopt, c.s2, c.p2, c.d2, true,
                                      c.op2, groups);
  const int64_t Cout = t.size(1) / c.KD;
  at::Tensor acc = at::zeros({N, Cout, std::max(Dp, c.pd + OD), t.size(2), t.size(3)},
                             t.options().dtype(window_acc(t.scalar_type())));
  depth_windows_add(acc, t, c, D);
  at::Tensor out = acc.narrow(2, c.pd, OD);
  if (has_bias) out = out.add(bias->view({1, -1, 1, 1, 1}));
  return dense(out.to(input.scalar_type()));
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor> conv3d_backward(const at::Tensor& grad, const at::Tensor& input,
                                                                      const at::Tensor& weight, c10::IntArrayRef stride,
                                                                      c10::IntArrayRef padding,
                                                                      c10::IntArrayRef dilation, bool transposed,
                                                                      c10::IntArrayRef output_padding, int64_t groups,
                                                                      std::array<bool, 3> mask) {
  const Conv3 c = conv3_setup(weight, stride, padding, dilation, transposed, output_padding);
  const int64_t N = input.size(0), D = input.size(2), OD = grad.size(2);
  at::Tensor w2 = weight.reshape({weight.size(0), weight.size(1) * c.KD, weight.size(3), weight.size(4)});
  at::Tensor gx, gw, gb;
  if (mask[2]) gb = grad.sum({0, 2, 3, 4});
  if (!mask[0] && !mask[1]) return {gx, gw, gb};
  std::array<bool, 3> m2{mask[0], mask[1], false};
  if (!transposed) {
    // x2's values only feed the weight gradient; the input gradient needs its shape.
    // Overlapping windows sum the slices' input gradients: the half types run in float32 then (one rounding).
    const auto wdt = mask[0] && c.sd < c.KD * c.dd ? window_acc(input.scalar_type()) : input.scalar_type();
    auto shape = std::vector<int64_t>{N * OD, input.size(1) * c.KD, input.size(3), input.size(4)};
    at::Tensor x2 = mask[1] ? depth_windows(pad_depth(input, c.pd, c.pd, D), c, OD).to(wdt)
                            : at::empty(shape, input.options().dtype(wdt));
    auto [gx2, gw2, gb2] = at::tpu::convolution_backward(depth_to_batch(grad).to(wdt), x2, w2.to(wdt), c.s2, c.p2, c.d2,
                                                         false, c.op2, groups, m2);
    if (mask[0]) {
      at::Tensor acc = at::zeros({N, input.size(1), D + 2 * c.pd, input.size(3), input.size(4)},
                                 input.options().dtype(window_acc(input.scalar_type())));
      depth_windows_add(acc, gx2, c, OD);
      gx = dense(acc.narrow(2, c.pd, D).to(input.scalar_type()));
    }
    if (mask[1]) gw = gw2.view(weight.sizes()).to(weight.scalar_type());
    return {gx, gw, gb};
  }
  const int64_t Dp = (D - 1) * c.sd + c.dd * (c.KD - 1) + 1;
  at::Tensor gt =
      depth_windows(pad_depth(grad, c.pd, std::max<int64_t>(0, Dp - c.pd - OD), std::min(OD, Dp - c.pd)), c, D);
  auto [gx2, gw2, gb2] =
      at::tpu::convolution_backward(gt, depth_to_batch(input), w2, c.s2, c.p2, c.d2, true, c.op2, groups, m2);
  if (mask[0]) gx = batch_to_depth(gx2, N);
  if (mask[1]) gw = gw2.view(weight.sizes());
  return {gx, gw, gb};
}

static int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;  // rounded down, as PyTorch's div_rtn
  if (ceil_mode && (o - 1) * s >= in + p) o--;
  return o;
}

static std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(const at::Tensor& input, c10::IntArrayRef ks,
                                                                  c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                                  c10::IntArrayRef dilation, bool ceil_mode) {
  TORCH_CHECK(input.dim() == 3 || input.dim() == 4, "non-empty 3D or 4D (batch mode) tensor expected for input");
  TORCH_CHECK(ks.size() == 1 || ks.size() == 2,
              "max_pool2d: kernel_size must either be a single int, or a tuple of two ints");
  at::Tensor x = input.dim() == 3 ? input.unsqueeze(0) : input;
  int64_t kh = ks[0], kw = ks.size() == 2 ? ks[1] : ks[0];
  c10::IntArrayRef st = stride.empty() ? ks : stride;
  tpu_params p = win_params(kh, kw, st, padding, dilation, false);
  tpu_args_MAXPOOL2D win = tpu_unpack_MAXPOOL2D(&p);
  int64_t sh = win.stride & 0xffff, sw = win.stride >> 16, ph = win.padding & 0xffff, pw = win.padding >> 16;
  int64_t dh = win.dilation & 0xffff, dw = win.dilation >> 16;
  TORCH_CHECK(ph <= kh / 2 && pw <= kw / 2, "pad should be at most half of effective kernel size, but got pad=", ph,
              ", kernel_size=", kh, " and dilation=", dh);
  int64_t OH = pool_out(x.size(2), kh, sh, ph, dh, ceil_mode), OW = pool_out(x.size(3), kw, sw, pw, dw, ceil_mode);
  TORCH_CHECK(OH > 0 && OW > 0, "Given input size: (", x.size(1), "x", x.size(2), "x", x.size(3),
              "). Calculated output size: (", x.size(1), "x", OH, "x", OW, "). Output size is too small");
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
                                                   c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                   c10::IntArrayRef dilation, bool ceil_mode,
                                                   const at::Tensor& indices) {
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
static at::Tensor& masked_select_out(const at::Tensor& self, const at::Tensor& mask, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == self.scalar_type(),
              "masked_select(): self and result must have the same scalar type");
  check_out_overlap(out, {self, mask});
  at::Tensor r = at::tpu::masked_select(self, mask);
  at::native::resize_output(out, r.sizes());
  device_copy(out, r);
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
  TORCH_CHECK(ig.dim() == 2, fn, ": expected input_gates to be 2-d [batch, ", factor, " * hidden], got size ",
              ig.sizes());
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
    TORCH_CHECK(ts[k]->device() == ig.device(),
                "Expected all tensors to be on the same device, but found at least "
                "two devices, ",
                ig.device(), " and ", ts[k]->device(), "!");
    TORCH_CHECK(ts[k]->scalar_type() == ig.scalar_type(), fn, ": expected ", kCellArgs[k], " to have dtype ",
                ig.scalar_type(), ", got ", ts[k]->scalar_type());
  }
  return hi;
}

static void check_same(const char* fn, const char* what, const at::Tensor& t, c10::IntArrayRef size,
                       const at::Tensor& like) {
  TORCH_CHECK(t.sizes().equals(size), fn, ": expected ", what, " of size ", size, ", got ", t.sizes());
  TORCH_CHECK(t.device() == like.device(),
              "Expected all tensors to be on the same device, but found at least two "
              "devices, ",
              like.device(), " and ", t.device(), "!");
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), fn, ": expected ", what, " to have dtype ", like.scalar_type(),
              ", got ", t.scalar_type());
}

// An absent optional operand: a host scalar 0 of the cell's dtype.
static tpu_tensor absent(const at::Tensor& like) { return tpu_tensor_scalar_f(0, to_tpu_dtype(like.scalar_type())); }

static std::tuple<at::Tensor, at::Tensor, at::Tensor> thnn_fused_lstm_cell(const at::Tensor& ig, const at::Tensor& hg,
                                                                           const at::Tensor& cx,
                                                                           const std::optional<at::Tensor>& ib,
                                                                           const std::optional<at::Tensor>& hb) {
  const bool bias = check_cell("_thnn_fused_lstm_cell", ig, hg, cx, ib, hb, 4);
  at::Tensor hy = at::empty(cx.sizes(), cx.options()), cy = at::empty(cx.sizes(), cx.options());
  at::Tensor ws = at::empty(ig.sizes(), ig.options());
  tpu_tensor ts[8] = {desc(hy), desc(cy), desc(ws), desc(ig), desc(hg), desc(cx)};
  if (bias) {
    ts[6] = desc(*ib);
    ts[7] = desc(*hb);
  }
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
  tpu_tensor ts[8] = {desc(gg),
                      desc(gcx),
                      has_bias ? desc(gb) : absent(cx),
                      dh ? desc(*grad_hy) : absent(cx),
                      dc ? desc(*grad_cy) : absent(cx),
                      desc(cx),
                      desc(cy),
                      desc(ws)};
  submit(TPU_OP_LSTM_CELL_BWD, ts, 8, tpu_params{});
  return {gg, gcx, gb};
}

static std::tuple<at::Tensor, at::Tensor> thnn_fused_gru_cell(const at::Tensor& ig, const at::Tensor& hg,
                                                              const at::Tensor& hx, const std::optional<at::Tensor>& ib,
                                                              const std::optional<at::Tensor>& hb) {
  const bool bias = check_cell("_thnn_fused_gru_cell", ig, hg, hx, ib, hb, 3);
  at::Tensor hy = at::empty(hx.sizes(), hx.options());
  at::Tensor ws = at::empty({hx.size(0), hx.size(1) * 5}, hx.options());
  tpu_tensor ts[7] = {desc(hy), desc(ws), desc(ig), desc(hg), desc(hx)};
  if (bias) {
    ts[5] = desc(*ib);
    ts[6] = desc(*hb);
  }
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
  if (has_bias) {
    gib = at::empty({3 * H}, opt);
    ghb = at::empty({3 * H}, opt);
  }
  tpu_tensor ts[7] = {
      desc(gi),      desc(gh), desc(ghx), has_bias ? desc(gib) : absent(ws), has_bias ? desc(ghb) : absent(ws),
      desc(grad_hy), desc(ws)};
  submit(TPU_OP_GRU_CELL_BWD, ts, 7, tpu_params{});
  return {gi, gh, ghx, gib, ghb};
}

}  // namespace at::tpu

TPU_HANDLES_COMPLEX(mm_out);  // (complex_mm_out)
TPU_HANDLES_COMPLEX(bmm_out);

// This file's rows of the op table (ops_core.cpp and ops_pointwise.cpp register theirs).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace at::tpu;
  // matrix unit
  TPU_IMPL(m, "mm.out", mm_out);
  TPU_IMPL(m, "addmm.out", addmm_out);
  TPU_IMPL(m, "bmm.out", bmm_out);
  TPU_IMPL(m, "baddbmm.out", baddbmm_out);
  TPU_IMPL(m, "addmv.out", addmv_out);
  TPU_IMPL(m, "dot", dot);
  TPU_IMPL(m, "vdot", dot);  // real dtypes only here: the conjugate is the identity
  // softmax, losses, norms
  TPU_IMPL(m, "_softmax.out", softmax_out);
  TPU_IMPL(m, "_log_softmax.out", log_softmax_out);
  TPU_IMPL(m, "_softmax_backward_data.out", softmax_backward_out);
  TPU_IMPL(m, "_log_softmax_backward_data.out", log_softmax_backward_out);
  TPU_IMPL(m, "nll_loss_forward.output", nll_loss_forward_out);
  TPU_IMPL(m, "nll_loss_backward.grad_input", nll_loss_backward_out);
  TPU_IMPL(m, "native_layer_norm", native_layer_norm);
  TPU_IMPL(m, "native_layer_norm_backward", native_layer_norm_backward);
  // indexing
  TPU_IMPL(m, "index_select", index_select);
  TPU_IMPL(m, "index_select.out", index_select_out);
  TPU_IMPL(m, "nonzero", nonzero);
  TPU_IMPL(m, "histc", histc);
  TPU_IMPL(m, "sort.stable", sort_stable);
  TPU_IMPL(m, "_fused_adamw_", fused_adamw_);
  TPU_IMPL(m, "_fused_adam_", fused_adam_);
  TPU_IMPL(m, "sort.values_stable", sort_values_stable);
  TPU_IMPL(m, "topk", topk);
  TPU_IMPL(m, "topk.values", topk_values);
  TPU_IMPL(m, "histc.out", histc_out);
  TPU_IMPL(m, "bincount", bincount);
  TPU_IMPL(m, "nonzero.out", nonzero_out);
  TPU_IMPL(m, "index.Tensor", index_tensor);
  TPU_IMPL(m, "index.Tensor_out", index_tensor_out);
  TPU_IMPL(m, "_index_put_impl_", index_put_impl);
  TPU_IMPL(m, "gather.out", gather_out);
  TPU_IMPL(m, "scatter_add.out", scatter_add_out);
  TPU_IMPL(m, "scatter.src_out", scatter_src_out);
  TPU_IMPL(m, "scatter.value_out", scatter_value_out);
  TPU_IMPL(m, "scatter_reduce.two_out", scatter_reduce_out);
  TPU_IMPL(m, "index_reduce.out", index_reduce_out);
  TPU_IMPL(m, "index_add.out", index_add_out);
  TPU_IMPL(m, "embedding_dense_backward", embedding_dense_backward);
  TPU_IMPL(m, "masked_select", masked_select);
  TPU_IMPL(m, "masked_select.out", masked_select_out);
  // convolution, pooling
  TPU_IMPL(m, "convolution_overrideable", convolution_op);
  TPU_IMPL(m, "convolution_backward_overrideable", convolution_backward);
  TPU_IMPL(m, "max_pool2d_with_indices", max_pool2d_with_indices);
  TPU_IMPL(m, "max_pool2d_with_indices_backward", max_pool2d_with_indices_backward);
  // random
  TPU_IMPL(m, "uniform_", uniform_);
  TPU_IMPL(m, "cauchy_", cauchy_);
  TPU_IMPL(m, "log_normal_", log_normal_);
  TPU_IMPL(m, "geometric_", geometric_);
  TPU_IMPL(m, "normal_", normal_);
  TPU_IMPL(m, "bernoulli_.float", bernoulli_f);
  TPU_IMPL(m, "bernoulli_.Tensor", bernoulli_t);
  TPU_IMPL(m, "random_.from", random_from);
  TPU_IMPL(m, "random_.to", random_to);
  TPU_IMPL(m, "random_", random_all);
  TPU_IMPL(m, "native_dropout", native_dropout);
  TPU_IMPL(m, "native_dropout_backward", native_dropout_backward);
  // rnn cells
  TPU_IMPL(m, "_thnn_fused_lstm_cell", thnn_fused_lstm_cell);
  TPU_IMPL(m, "_thnn_fused_lstm_cell_backward_impl", thnn_fused_lstm_cell_backward_impl);
  TPU_IMPL(m, "_thnn_fused_gru_cell", thnn_fused_gru_cell);
  TPU_IMPL(m, "_thnn_fused_gru_cell_backward", thnn_fused_gru_cell_backward);
}
