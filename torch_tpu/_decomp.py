"""Ops the tpu device runs as PyTorch's own decompositions into native ops.

The C++ glue holds no math (ARCHITECTURE.md: an ATen kernel checks, shapes,
allocates and hands one op to the runtime). Ops the runtime has no kernel for
yet, but which PyTorch decomposes into ops it has, are registered here for the
PrivateUse1 key with the decomposition from ``torch._decomp``: each piece then
runs natively (no CPU fallback), in every eager mode, through the one dispatch
point. When the runtime gains a kernel for one of these ops, its row moves to
csrc/ and out of this table.

- ``native_batch_norm`` (+ backward): per-channel statistics and the affine
  pass. The forward keeps the tpu kernel's argument checks and messages, and
  returns empty saved statistics in evaluation mode, as before.
- ``var_mean``: the batch-norm forward's statistics (var and mean are native).
- ``mse_loss`` (+ backward).
"""
import torch
from torch._decomp import decomposition_table

_aten = torch.ops.aten
_lib = None


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    # The checks of the former C++ kernel, in its words.
    if x.dim() < 2:
        raise RuntimeError(f"batch_norm: expected at least 2-d input, got {x.dim()}-d")
    if training:
        n = x.numel() // max(x.size(1), 1)
        if n <= 1:
            raise RuntimeError("Expected more than 1 value per channel when training, got input size "
                               f"[{', '.join(str(s) for s in x.shape)}]")
    elif running_mean is None or running_var is None:
        raise RuntimeError("running_mean and running_var must be defined in evaluation mode")
    y, save_mean, save_invstd = decomposition_table[_aten.native_batch_norm.default](
        x, weight, bias, running_mean, running_var, training, momentum, eps)
    if not training:   # nothing is saved in evaluation mode (as CUDA does)
        return y, x.new_empty((0,)), x.new_empty((0,))
    return y, save_mean, save_invstd


# (schema name, overload, implementation)
_ROWS = [
    ("native_batch_norm", "default", _batch_norm),
    ("native_batch_norm_backward", "default", None),
    ("var_mean", "correction", None),
    ("mse_loss", "default", None),
    ("mse_loss", "out", None),
    ("mse_loss_backward", "default", None),
    ("mse_loss_backward", "grad_input", None),
]


def _register():
    """Register the table for PrivateUse1 (once)."""
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name, overload, fn in _ROWS:
        op = getattr(getattr(_aten, name), overload)
        lib.impl(name if overload == "default" else f"{name}.{overload}", fn or decomposition_table[op],
                 "PrivateUse1")
    _lib = lib
