// autocast.cpp - torch.autocast("tpu"): PyTorch's CUDA op lists and policies
// registered for the AutocastPrivateUse1 key (matmuls and convolutions in the
// autocast dtype; precision-sensitive ops - exp/log, norms, losses, softmax -
// in float32; mixed-input ops promoted to the widest dtype), so code written
// for `torch.autocast("cuda", dtype=torch.bfloat16)` behaves the same on tpu.
// The casting wrappers are PyTorch's own (ATen/autocast_mode.h); nothing here
// computes. A separate translation unit: that header pulls in all of ATen's
// operators, and this file rarely changes (ccache keeps it).
#include <ATen/autocast_mode.h>

namespace {
using namespace at;
using namespace at::autocast;

// As on CUDA: binary_cross_entropy is unsafe to autocast (the log of a
// probability rounded to a half dtype); PyTorch's words, naming the safe op.
Tensor binary_cross_entropy_banned(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
              "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
              "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
              "safe to autocast.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());  // ops not in the lists run as they are
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define TPU_AC_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(TPU_AC_LOWER)
#define TPU_AC_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(TPU_AC_FP32)
#define TPU_AC_FP32_OPT(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_AC_FP32_OPT)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
#define TPU_AC_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(TPU_AC_PROMOTE)
  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_banned));
}
}  // namespace
