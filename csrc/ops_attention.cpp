// ops_attention.cpp - F.scaled_dot_product_attention on the ATTN kernels.
//
// PyTorch asks the device's _fused_sdp_choice_stub which backend runs a call.
// Ours answers "overrideable" whenever the ATTN kernels can run it, and
// PyTorch then calls _scaled_dot_product_fused_attention_overrideable, whose
// autograd formula calls its _backward: the L x S scores are never stored,
// only out and a float32 logsumexp per query row. Every other call takes
// PyTorch's math path, which runs on our native matmul, softmax and dropout:
// float64, nested tensors, ranks other than 3 and 4, key / value batch or
// head counts that need broadcasting (or grouped heads without enable_gqa),
// dropout_p >= 1, and `sdpa_kernel` contexts that disable the overrideable
// backend. Dropout masks come from the tpu generator (one Philox draw per
// score, ops.def), so they are not the CPU's numbers; the backward redraws
// the same ones from the seed and offset the forward returns. A mask together
// with is_causal applies both, as the CPU does.
#include "tpu_glue.h"

#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/scalar_tensor.h>
#include <torch/library.h>

#include <cmath>

namespace at::tpu {

static bool attn_dtype(c10::ScalarType st) { return st == kFloat || st == kBFloat16 || st == kHalf; }

static int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                                std::optional<double> scale, bool enable_gqa) {
  const auto math = static_cast<int64_t>(at::SDPBackend::math);
  if (!at::globalContext().userEnabledOverrideableSDP()) return math;
  if (q.is_nested() || k.is_nested() || v.is_nested()) return math;
  if (!attn_dtype(q.scalar_type()) || k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type())
    return math;
  // Sizes as SymInts: under torch.compile a dynamic sequence length stays dynamic (guards, no specialization).
  const int64_t nd = q.dim();
  if ((nd != 3 && nd != 4) || k.dim() != nd || v.dim() != nd) return math;
  if (nd == 4 && (k.sym_size(0) != q.sym_size(0) || v.sym_size(0) != q.sym_size(0))) return math;
  const c10::SymInt H = q.sym_size(-3), Hk = k.sym_size(-3);
  if (v.sym_size(-3) != Hk || v.sym_size(-2) != k.sym_size(-2) || k.sym_size(-1) != q.sym_size(-1)) return math;
  if (Hk != H && !(enable_gqa && Hk > 0 && H % Hk == 0)) return math;
  if (!(dropout_p >= 0 && dropout_p < 1)) return math;
  if (mask.has_value() && mask->defined()) {
    if (mask->is_nested()) return math;
    if (mask->scalar_type() != kBool && mask->scalar_type() != q.scalar_type()) return math;
    const std::vector<c10::SymInt> full = {nd == 4 ? q.sym_size(0) : c10::SymInt(1), H, q.sym_size(-2), k.sym_size(-2)};
    if (mask->dim() > 4 || !at::is_expandable_to(mask->sym_sizes(), full)) return math;
  }
  return static_cast<int64_t>(at::SDPBackend::overrideable);
}

static at::Tensor as4(const at::Tensor& t) { return t.dim() == 3 ? t.unsqueeze(0) : t; }

// The output with query's dim order (PyTorch's alloc_with_matching_layout).
static at::Tensor alloc_like_layout(const at::Tensor& q, c10::IntArrayRef shape) {
  const int64_t nd = q.dim();
  std::vector<int64_t> order(nd);
  for (int64_t d = 0; d < nd; d++) order[d] = d;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return q.stride(a) > q.stride(b); });
  std::vector<int64_t> psize(nd), inv(nd);
  for (int64_t d = 0; d < nd; d++) {
    psize[d] = shape[order[d]];
    inv[order[d]] = d;
  }
  return at::empty(psize, q.options()).permute(inv);
}

static void check_attn(const char* fn, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 3 || q.dim() == 4, fn, ": query must be 3-d or 4-d, got ", q.dim(), "-d");
  TORCH_CHECK(k.dim() == q.dim() && v.dim() == q.dim(), fn, ": query, key and value must have the same rank, got ",
              q.dim(), ", ", k.dim(), " and ", v.dim());
  TORCH_CHECK_NOT_IMPLEMENTED(attn_dtype(q.scalar_type()), fn, " not implemented for '", q.scalar_type(), "' on tpu");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), fn,
              ": expected query, key and value to have the same dtype");
}

static double attn_scale(const at::Tensor& q, std::optional<double> scale) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}

// The mask as [B, H, L, S] (stride 0 where broadcast).
static at::Tensor mask4(const at::Tensor& m, const at::Tensor& q4, const at::Tensor& k4) {
  return m.expand({q4.size(0), q4.size(1), q4.size(2), k4.size(2)});
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor,
                  at::Tensor>
sdpa_overrideable(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                  const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal, bool return_debug_mask,
                  std::optional<double> scale) {
  const char* fn = "_scaled_dot_product_fused_attention_overrideable";
  check_attn(fn, query, key, value);
  TORCH_CHECK(!return_debug_mask, fn, ": return_debug_mask is not supported on tpu");
  TORCH_CHECK(dropout_p >= 0 && dropout_p < 1, fn, ": dropout_p must be in [0, 1), got ", dropout_p);
  const at::Tensor q4 = as4(query), k4 = as4(key), v4 = as4(value);
  const int64_t B = q4.size(0), H = q4.size(1), L = q4.size(2), S = k4.size(2);
  std::vector<int64_t> oshape(query.sizes().begin(), query.sizes().end());
  oshape.back() = value.size(-1);
  at::Tensor out = alloc_like_layout(query, oshape);
  at::Tensor lse = at::empty({B, H, L}, query.options().dtype(kFloat));
  uint64_t seed = 0, off = 0;
  if (dropout_p > 0 && B * H * L * S > 0) std::tie(seed, off) = philox_next(std::nullopt, query.device().index());
  const bool has_mask = attn_bias.has_value() && attn_bias->defined();
  at::Tensor m4 = has_mask ? mask4(*attn_bias, q4, k4) : at::Tensor();
  tpu_tensor ts[6] = {desc(as4(out)), desc(lse), desc(q4), desc(k4), desc(v4), has_mask ? desc(m4) : tpu_tensor{}};
  submit(TPU_OP_ATTN, ts, has_mask ? 6 : 5,
         TPU_PARAMS(ATTN, .scale = attn_scale(query, scale), .dropout = dropout_p, .causal = is_causal,
                    .seed = static_cast<int64_t>(seed), .offset = static_cast<int64_t>(off)));
  auto cpu_long = at::TensorOptions().dtype(kLong).device(kCPU);
  return {out,
          lse,
          at::Tensor(),
          at::Tensor(),
          c10::SymInt(L),
          c10::SymInt(S),
          at::scalar_tensor(static_cast<int64_t>(seed), cpu_long),
          at::scalar_tensor(static_cast<int64_t>(off), cpu_long),
          at::Tensor()};
}

static std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_overrideable_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, int64_t max_q, int64_t max_k,
    double dropout_p, bool is_causal, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    std::optional<double> scale) {
  const char* fn = "_scaled_dot_product_fused_attention_overrideable_backward";
  if (!grad_out.defined()) return {};
  check_attn(fn, query, key, value);
  const at::Tensor q4 = as4(query), k4 = as4(key), v4 = as4(value);
  TORCH_CHECK(grad_out.sizes().equals(out.sizes()), fn, ": grad_out has shape ", grad_out.sizes(), ", expected ",
              out.sizes());
  TORCH_CHECK(logsumexp.dim() == 3, fn, ": logsumexp must be 3-d, got ", logsumexp.sizes());
  const bool has_mask = attn_bias.defined(), grad_mask = has_mask && grad_input_mask[3];
  at::Tensor gq = at::empty_like(query), gk = at::empty_like(key), gv = at::empty_like(value), gm;
  at::Tensor m4 = has_mask ? mask4(attn_bias, q4, k4) : at::Tensor();
  if (grad_mask) gm = at::empty({q4.size(0), q4.size(1), q4.size(2), k4.size(2)}, query.options());
  const int64_t seed = philox_seed.defined() && philox_seed.numel() ? philox_seed.item<int64_t>() : 0;
  const int64_t off = philox_offset.defined() && philox_offset.numel() ? philox_offset.item<int64_t>() : 0;
  tpu_tensor ts[11] = {desc(as4(gq)),
                       desc(as4(gk)),
                       desc(as4(gv)),
                       grad_mask ? desc(gm) : tpu_tensor_scalar_f(0, to_tpu_dtype(query.scalar_type())),
                       desc(as4(grad_out)),
                       desc(q4),
                       desc(k4),
                       desc(v4),
                       desc(as4(out)),
                       desc(logsumexp),
                       has_mask ? desc(m4) : tpu_tensor{}};
  submit(TPU_OP_ATTN_BWD, ts, has_mask ? 11 : 10,
         TPU_PARAMS(ATTN_BWD, .scale = attn_scale(query, scale), .dropout = dropout_p, .causal = is_causal,
                    .seed = seed, .offset = off));
  at::Tensor gb;
  if (grad_mask) gb = at::sum_to(gm, attn_bias.sizes());
  return {grad_input_mask[0] ? gq : at::Tensor(), grad_input_mask[1] ? gk : at::Tensor(),
          grad_input_mask[2] ? gv : at::Tensor(), gb};
}

}  // namespace at::tpu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &at::tpu::fused_sdp_choice)
}  // namespace at::native

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(at::tpu::sdpa_overrideable));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(at::tpu::sdpa_overrideable_backward));
}
