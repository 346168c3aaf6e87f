"""torch_tpu._core: registration and the eager-mode / fallback API (see the package docstring)."""
import contextlib
import glob
import os

import torch

__all__ = ["set_eager_mode", "get_eager_mode", "eager_mode", "fallback_counts", "reset_fallback_counts",
           "set_cpu_fallback_enabled", "cpu_fallback_enabled"]

_loaded = False


def _load_library():
    here = os.path.dirname(os.path.abspath(__file__))
    libs = sorted(glob.glob(os.path.join(here, "_C*.so")))
    if not libs:
        raise ImportError("torch_tpu: the extension torch_tpu/_C*.so is not built; run `make build`")
    torch.ops.load_library(libs[0])


def _register():
    global _loaded
    if _loaded:
        return
    _load_library()
    torch.utils.rename_privateuse1_backend("tpu")
    from . import tpu as _tpu_module  # noqa: PLC0415
    torch._register_device_module("tpu", _tpu_module)
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_packed_sequence=True,
                                                        for_storage=True)
    # Ctrl-C during a host wait (synchronize, .item(), a full launch queue)
    # raises KeyboardInterrupt within ~50 ms instead of after the backlog.
    import threading  # noqa: PLC0415
    torch.ops.torch_tpu.install_interrupt_check(threading.main_thread().ident)
    _loaded = True


def set_eager_mode(mode: str) -> None:
    """Select the eager mode for ops issued from now on: "debug" or "strict".

    The mode is the runtime's (tpu_eager_mode): "fused" (or "defer_and_fuse")
    raises NotImplementedError, an unknown name ValueError."""
    if mode == "strict":
        torch.tpu.synchronize()   # errors of earlier debug-mode work surface here, not later
    torch.ops.torch_tpu.set_eager_mode(mode)


def get_eager_mode() -> str:
    return torch.ops.torch_tpu.get_eager_mode()


@contextlib.contextmanager
def eager_mode(mode: str):
    """Scoped eager mode: ``with torch_tpu.eager_mode("debug"): ...``."""
    prev = get_eager_mode()
    set_eager_mode(mode)
    try:
        yield
    finally:
        set_eager_mode(prev)


def fallback_counts() -> dict:
    """Number of calls per op that ran on the CPU because tpu has no kernel for it."""
    names, counts = torch.ops.torch_tpu.fallback_counts()
    return dict(zip(names, counts))


def reset_fallback_counts() -> None:
    torch.ops.torch_tpu.reset_fallback_counts()


def set_cpu_fallback_enabled(on: bool) -> None:
    """Off: ops without a tpu kernel raise NotImplementedError (also TORCH_TPU_CPU_FALLBACK=0)."""
    torch.ops.torch_tpu.set_fallback_enabled(bool(on))


def cpu_fallback_enabled() -> bool:
    return torch.ops.torch_tpu.fallback_enabled()



def _at_exit():
    # PyTorch's autograd device thread for a chip other than 0 drops its last
    # reference to a finished backward's GraphTask a moment after backward()
    # returns; if the interpreter is already finalizing then, that thread
    # aborts the process ("terminate called without an active exception", a
    # race in torch's engine shutdown). Give it that moment.
    try:
        if torch.ops.torch_tpu.is_initialized() and torch.ops.torch_tpu.device_count() > 1:
            import time
            time.sleep(0.02)
    except Exception:  # noqa: BLE001 - never fail at exit
        pass

