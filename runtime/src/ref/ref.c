/* ref.c - the reference dispatcher: an op to its family's naive kernel
 * (one entry per family of TPU_FAMILIES, tpu/ops.h). */
#include "ref/ref-impl.h"

static const tpu_kernel_fn ref_kernels[TPU_FAM_COUNT] = {
#define TPU_REF_ENTRY_(e, fast, ref) [TPU_FAM_##e] = tpu_ref_##ref,
    TPU_FAMILIES(TPU_REF_ENTRY_)
#undef TPU_REF_ENTRY_
};

tpu_status tpu_ref_run(tpu_kargs *a) { return tpu_run_by_family(ref_kernels, a); }
