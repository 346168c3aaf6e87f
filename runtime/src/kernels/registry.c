/* registry.c - the op -> fast kernel registry: ops.def gives each op its
 * family, TPU_FAMILIES (tpu/ops.h) each family its kernel. */
#include "kernels/kernels-impl.h"

static const tpu_kernel_fn fast_kernels[TPU_FAM_COUNT] = {
#define TPU_K_ENTRY_(e, fast, ref) [TPU_FAM_##e] = tpu_k_##fast,
    TPU_FAMILIES(TPU_K_ENTRY_)
#undef TPU_K_ENTRY_
};

tpu_status tpu_kernel_run(tpu_kargs *a) { return tpu_run_by_family(fast_kernels, a); }
