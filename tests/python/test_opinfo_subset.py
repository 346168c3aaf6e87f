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
    "nn.functional.max_unpool2d", "nn.functional.binary_cross_entropy", "nn.functional.hardswish", "eye", "logspace",
    "roll", "bucketize", "index_copy", "unfold", "sort", "argsort", "topk", "nonzero", "argwhere", "histc", "bincount",
    "isin", "floor_divide", "scatter", "index_put", "take_along_dim", "nn.functional.logsigmoid",
    "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d", "nn.functional.group_norm", "flip",
    "diag_embed", "trace", "std_mean", "aminmax", "tril_indices", "triu_indices", "nn.functional.pixel_shuffle",
    "nn.functional.pixel_unshuffle", "nn.functional.channel_shuffle", "nn.functional.soft_margin_loss",
    "special.xlog1py", "sgn", "nn.functional.grid_sample", "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool2d", "masked_select", "masked_scatter",
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
            samples = list(info.sample_inputs("cpu", dtype, requires_grad=grad))[:6]
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
