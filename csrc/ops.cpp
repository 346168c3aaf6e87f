// ops.cpp - the one translation unit of the tpu ATen kernels.
//
// The kernels live in one file per concern (see tpu_glue.h); each is a
// self-contained source (it includes what it uses and registers its own rows).
// They are compiled together here because on two cores every translation unit
// that includes the ATen and torch/library.h headers costs about 45 s: three
// separate units made the clean build of the extension ~30% slower (2m31 vs
// 1m55 measured), one unit keeps it where it was. The files share no static
// names (TORCH_LIBRARY_IMPL blocks get unique names per use).
#include "ops_core.cpp"
#include "ops_pointwise.cpp"
#include "ops_nn.cpp"
#include "ops_linalg.cpp"
#include "ops_spectral.cpp"
#include "ops_attention.cpp"
