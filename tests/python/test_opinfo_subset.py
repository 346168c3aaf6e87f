"""A fast subset of the OpInfo sweep: PyTorch's own sample inputs for the ops
this project made native (kernels and decompositions), forward and backward,
against the CPU, with the CPU fallback off (a fallback would raise)."""
import warnings

import pytest
import torch
import torch_tpu

D = "tpu"
NAMES = [
    "nn.functional.glu", "nn.functional.prelu", "nn.functional.unfold", "nn.functional.fold",
    "nn.functional.max_unpool2d", "nn.functional.max_unpool3d", "nn.functional.hardsigmoid", "nn.functional.binary_cross_entropy", "nn.functional.hardswish", "eye", "logspace",
    "roll", "bucketize", "index_copy", "unfold", "sort", "argsort", "topk", "nonzero", "argwhere", "histc", "bincount",
    "isin", "floor_divide", "scatter", "index_put", "take_along_dim", "nn.functional.logsigmoid",
    "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d", "nn.functional.conv3d", "nn.functional.group_norm", "flip",
    "diag_embed", "trace", "std_mean", "aminmax", "tril_indices", "triu_indices", "nn.functional.pixel_shuffle",
    "nn.functional.pixel_unshuffle", "nn.functional.channel_shuffle", "nn.functional.soft_margin_loss",
    "special.xlog1py", "sgn", "nn.functional.grid_sample", "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool2d", "masked_select", "masked_scatter",
]
NAMES += [
    "nn.functional.huber_loss", "nn.functional.smooth_l1_loss", "nansum", "nanmean", "count_nonzero", "logit", "renorm",
    "take", "put", "nn.functional.threshold", "bitwise_left_shift", "bitwise_right_shift", "heaviside", "nextafter",
    "frexp", "cross", "linalg.cross", "cdist", "nn.functional.pdist", "nn.functional.pairwise_distance",
    "nn.functional.triplet_margin_loss", "nn.functional.triplet_margin_with_distance_loss",
    "nn.functional.multi_margin_loss", "nn.functional.multilabel_margin_loss", "nn.functional.adaptive_max_pool1d",
    "nn.functional.adaptive_max_pool2d", "nonzero_static", "nn.functional.embedding_bag",
]
# C kernels: special functions (polygamma is in test_special.py: CPU's float32 kernel is the less accurate one),
# scans, elementwise forms the OpInfo sweep found falling back or wrong
NAMES += [
    "lgamma", "digamma", "erfinv", "i0", "special.i0e", "special.i1", "special.i1e", "signbit", "gcd", "lcm",
    "mvlgamma", "cummax", "cummin", "logcumsumexp", "nn.functional.elu", "round", "rsub", "vdot",
    "nn.functional.hardtanh", "nn.functional.relu6", "scatter_reduce", "index_reduce",
]
# sorting and selection (test_sorting_ops.py: ties, NaN, long slices), nll_loss2d, 3-d pooling
NAMES += [
    "kthvalue", "median", "nanmedian", "mode", "unique", "unique_consecutive", "searchsorted", "msort",
    "nn.functional.nll_loss", "nn.functional.cross_entropy", "nn.functional.avg_pool3d", "nn.functional.max_pool3d",
    "nn.functional.adaptive_avg_pool3d", "nn.functional.adaptive_max_pool3d",
]
# torch.special's other functions and the ops around them (test_special_fns.py: special values, float64), addbmm,
# segment_reduce (test_ops.py)
NAMES += [
    "special.zeta", "special.entr", "special.ndtri", "special.log_ndtr", "special.erfcx", "special.airy_ai",
    "special.bessel_j0", "special.bessel_j1", "special.bessel_y0", "special.bessel_y1",
    "special.modified_bessel_i0", "special.modified_bessel_i1", "special.modified_bessel_k0",
    "special.modified_bessel_k1", "special.scaled_modified_bessel_k0", "special.scaled_modified_bessel_k1",
    "special.spherical_bessel_j0", "special.chebyshev_polynomial_t", "special.chebyshev_polynomial_u",
    "special.chebyshev_polynomial_v", "special.chebyshev_polynomial_w", "special.shifted_chebyshev_polynomial_t",
    "special.shifted_chebyshev_polynomial_u", "special.shifted_chebyshev_polynomial_v",
    "special.shifted_chebyshev_polynomial_w", "special.hermite_polynomial_h", "special.hermite_polynomial_he",
    "special.laguerre_polynomial_l", "special.legendre_polynomial_p", "igamma", "igammac", "sinc", "logaddexp2",
    "fmax", "fmin", "addbmm", "_segment_reduce",
]
VARIANTS = {("nn.functional.interpolate", v) for v in ("nearest", "bilinear", "bicubic", "linear", "trilinear")} | \
    {("nn.functional.pad", v) for v in ("reflect", "constant", "circular", "replicate")}


def _infos():
    from torch.testing._internal.common_methods_invocations import op_db
    out = []
    for info in op_db:
        if info.name in NAMES or (info.name, info.variant_test_name) in VARIANTS:
            out.append(pytest.param(info, id=f"{info.name}.{info.variant_test_name}".rstrip(".")))
    return out


def _to(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to(D).requires_grad_(x.requires_grad)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v) for v in x)
    return x


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


@pytest.mark.parametrize("info", _infos())
def test_opinfo_samples_native(info):
    dtype = torch.float32 if torch.float32 in info.supported_dtypes("cpu") else torch.int64
    grad = info.supports_autograd and dtype.is_floating_point
    torch_tpu.set_cpu_fallback_enabled(False)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            samples = list(info.sample_inputs("cpu", dtype, requires_grad=grad))[:2]  # (conformance-ops: 8 + refs)
            assert samples
            for s in samples:
                exp = info(s.input, *s.args, **s.kwargs)
                ti = _to(s.input)
                kw = {k: (D if k == "device" else _to(v)) for k, v in s.kwargs.items()}   # factories: made on the tpu
                got = info(ti, *_to(list(s.args)), **kw)
                e0, g0 = _first(exp), _first(got)
                assert g0.device.type == D
                torch.testing.assert_close(g0.detach().cpu(), e0.detach(), atol=1e-4, rtol=1e-4, equal_nan=True)
                if grad and isinstance(s.input, torch.Tensor) and e0.requires_grad:
                    gy = torch.randn_like(e0)
                    ce = torch.autograd.grad(e0, [s.input], gy, allow_unused=True)[0]
                    ct = torch.autograd.grad(g0, [ti], gy.to(D), allow_unused=True)[0]
                    if ce is not None:
                        torch.testing.assert_close(ct.cpu(), ce, atol=1e-3, rtol=1e-3)
    finally:
        torch_tpu.set_cpu_fallback_enabled(True)
