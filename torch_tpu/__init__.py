"""torch_tpu: PyTorch's ``tpu`` device, backed by the vTPU runtime.

Importing torch is enough: torch loads this package through the
``torch.backends`` entry point (``_autoload``). Then ``torch.device("tpu")``
works, ``torch.tpu`` mirrors ``torch.cuda`` and ``torch.accelerator`` reports
tpu.

Eager modes (see ``set_eager_mode``):
  * "debug"  - every op runs synchronously; errors point at the op
               (``TORCH_TPU_LAUNCH_BLOCKING=1``).
  * "strict" - the default: ops are queued on the device's streams and run
               asynchronously, like CUDA.
  * "fused"  - Fused Eager (DeferAndFuse, ``TORCH_TPU_DEFER_AND_FUSE=1``): ops
               are recorded and run fused when something needs their results
               (``.item()``, ``.cpu()``, a synchronize, ...); intermediates
               freed before that never take device memory. ``fused_stats()``
               says what happened; ``TORCH_TPU_FUSED_DUMP=1`` prints each
               flushed window.

``torch.compile(model, backend="tpu")`` runs each compiled graph as one
Fused Eager window (``compile_stats()``).
"""
# torch loads this package from its own import (torch.backends entry point):
# `_autoload` must exist before `import torch` below, because importing
# torch_tpu first imports torch, which calls back into this half-initialized
# module. The real work lives in torch_tpu._core.


def _autoload():
    """Entry point called by ``import torch`` (torch.backends group)."""
    from . import _compile, _core, _decomp, _dist
    _core._register()
    _decomp._register()
    _dist._register()
    _compile._install_inductor_hook()


import torch  # noqa: E402

from ._compile import compile_stats, reset_compile_stats  # noqa: E402
from ._core import (  # noqa: E402
    cpu_fallback_enabled,
    eager_mode,
    fallback_counts,
    fused_stats,
    get_allow_excess_precision,
    get_eager_mode,
    get_fused_remat,
    is_materialized,
    reset_fallback_counts,
    reset_fused_stats,
    set_allow_excess_precision,
    set_cpu_fallback_enabled,
    set_eager_mode,
    set_fused_remat,
    synchronize,
)

__all__ = ["set_eager_mode", "get_eager_mode", "eager_mode", "fallback_counts", "reset_fallback_counts",
           "set_cpu_fallback_enabled", "cpu_fallback_enabled", "fused_stats", "reset_fused_stats", "synchronize",
           "is_materialized", "set_allow_excess_precision", "get_allow_excess_precision",
           "set_fused_remat", "get_fused_remat", "compile_stats", "reset_compile_stats"]

_autoload()

import atexit as _atexit  # noqa: E402

from ._core import _at_exit  # noqa: E402

_atexit.register(_at_exit)
