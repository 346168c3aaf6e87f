"""torch_tpu._core: registration and the eager-mode / fallback API (see the package docstring)."""
import contextlib
import glob
import os

import torch

__all__ = ["set_eager_mode", "get_eager_mode", "eager_mode", "fallback_counts", "reset_fallback_counts",
           "set_cpu_fallback_enabled", "cpu_fallback_enabled", "fused_stats", "reset_fused_stats", "synchronize",
           "is_materialized", "set_allow_excess_precision", "get_allow_excess_precision",
           "set_fused_remat", "get_fused_remat"]

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
    """Select the eager mode for ops issued from now on: "debug", "strict" or
    "fused" (also "defer_and_fuse"); an unknown name raises ValueError.

    The mode is the runtime's (tpu_eager_mode). Switching flushes what Fused
    Eager recorded; switching to "strict" also synchronizes, so errors of
    earlier work surface here, not later."""
    if mode == "strict":
        torch.tpu.synchronize()
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


def fused_stats() -> dict:
    """Fused Eager's counters since start or ``reset_fused_stats()``:
    ``flushes`` (a dict: cause -> count), ``ops_recorded``, ``ops_fused`` (run
    inside a fused group), ``fused_groups_run``, ``kernels_run`` (ops run
    alone by their kernel), ``results_never_stored`` (results of fused ops
    that never reached memory), ``bytes_never_materialized`` (device
    memory freed without ever being bound), ``plan_cache_hits`` and
    ``plan_cache_misses`` (a flush whose window has the structure of an
    earlier one reuses its plan: no analysis), ``groups_by_table`` (fused
    groups over one 8- or 16-bit tensor run as a lookup table: see the
    README; ``TORCH_TPU_FUSED_TABLES=0`` turns that off), ``remat_reads``
    (operands that read a recomputed copy instead of a value kept in memory)
    , ``remat_ops`` (ops recorded again to recompute such values: see the
    README; ``TORCH_TPU_FUSED_REMAT=0`` turns that off), ``ops_rewritten``
    (ops recorded as a cheaper op over values the window holds: a
    ``nll_loss`` of a ``log_softmax`` as one cross entropy from the logits,
    its backward likewise) and ``kernels_dropped`` (ops not run because
    nothing read their results before they were freed)."""
    v = torch.ops.torch_tpu.fused_stats()
    causes = torch.ops.torch_tpu.flush_causes()
    rest = v[len(causes):]
    names = ["ops_recorded", "ops_fused", "fused_groups_run", "kernels_run", "results_never_stored",
             "bytes_never_materialized", "plan_cache_hits", "plan_cache_misses", "groups_by_table",
             "remat_reads", "remat_ops", "ops_rewritten", "kernels_dropped"]
    out = {"flushes": dict(zip(causes, v[:len(causes)]))}
    out.update(zip(names, rest))
    return out


def set_fused_remat(distance: int) -> None:
    """Fused Eager's recomputation: a value an elementwise chain computed
    from tensors the open window has not changed since is recomputed by an
    op that reads it at least ``distance`` recorded ops later (or by a
    matmul-like kernel) instead of being kept in device memory for it
    (autograd's saved activations). ``0`` turns it off; the default is 64
    (``TORCH_TPU_FUSED_REMAT``: ``0`` off, ``1`` the default, or a
    distance). Results are the same bit for bit either way."""
    if isinstance(distance, bool) or not isinstance(distance, int):
        raise TypeError(f"set_fused_remat(): argument 'distance' must be int, not {type(distance).__name__}")
    if distance < 0 or distance == 1:
        raise ValueError(f"set_fused_remat(): distance must be 0 (off) or at least 2, got {distance}")
    torch.ops.torch_tpu.set_fused_remat(min(distance, 1 << 20))


def get_fused_remat() -> int:
    """The distance set by ``set_fused_remat`` (0: off)."""
    return torch.ops.torch_tpu.get_fused_remat()


def reset_fused_stats() -> None:
    torch.ops.torch_tpu.reset_fused_stats()


def synchronize(tensors=None) -> None:
    """Run everything recorded so far (Fused Eager's windows are flushed) and
    wait for it. ``tensors`` (a tensor or a list of them) is accepted as in
    TorchTPU; every window is flushed either way."""
    if tensors is not None:
        ts = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        for t in ts:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"synchronize(): expected tensors, got {type(t).__name__}")
    torch.ops.torch_tpu.flush()
    torch.tpu.synchronize()


def set_allow_excess_precision(allow: bool) -> None:
    """Fused Eager only (off by default): let bfloat16 / float16 results
    stay float32 between the ops of a fused group instead of being rounded
    after each op as Strict Eager does. Results written to memory and
    explicit casts (``.to(torch.bfloat16)``) are still rounded. Faster and
    more accurate, but Fused no longer equals Strict bit for bit. Takes
    effect at the next flush."""
    if not isinstance(allow, bool):
        raise TypeError(f"set_allow_excess_precision(): argument 'allow' must be bool, not {type(allow).__name__}")
    torch.ops.torch_tpu.set_allow_excess_precision(allow)


def get_allow_excess_precision() -> bool:
    return torch.ops.torch_tpu.get_allow_excess_precision()


def is_materialized(t: torch.Tensor) -> bool:
    """Whether a tpu tensor's value is in device memory: False while an op
    recorded by Fused Eager that writes it has not run its flush yet, or if
    its memory was never bound."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"is_materialized(): expected a Tensor, got {type(t).__name__}")
    return torch.ops.torch_tpu.is_materialized(t)


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

