"""torch.tpu: the tpu device module, mirroring torch.cuda."""
import contextlib
import os
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

_initialized = False
_FORK_MSG = ("Cannot re-initialize TPU in forked subprocess. To use TPU with multiprocessing, "
             "you must use the 'spawn' start method")


def _ops():
    return torch.ops.torch_tpu


def _forget_init():
    global _initialized
    _initialized = False


# A forked child starts uninitialized, so its first use asks the runtime and raises _FORK_MSG
# (a hook instead of comparing os.getpid() on every call: that is a system call each time).
os.register_at_fork(after_in_child=_forget_init)


def _lazy_init():
    global _initialized
    if _initialized:
        return      # initialized in this process: the checks below passed already
    if _ops().is_forked():
        raise RuntimeError(_FORK_MSG)
    _ops().init()   # a bad TPU_* environment variable raises RuntimeError here
    _initialized = True


_fast = None


def _fast_sync():
    """The extension's pybind entry for synchronize: a call through torch.ops costs ~1.5 us more."""
    global _fast
    if _fast is None:
        from . import _C  # noqa: PLC0415 - the pybind half of the extension (already loaded as a library)
        _fast = _C._synchronize
    return _fast


def _index(device: Optional[Union[int, str, torch.device]]) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        idx = device
    else:
        device = torch.device(device)
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        idx = current_device() if device.index is None else device.index
    n = device_count()
    if idx < 0 or idx >= n:
        raise RuntimeError(f"Invalid device index {idx}: there {'is' if n == 1 else 'are'} {n} tpu "
                           f"device{'' if n == 1 else 's'} (valid indices 0..{n - 1})")
    return idx


def is_available() -> bool:
    """False (with a warning saying why) if the tpu environment is misconfigured, as torch.cuda does."""
    try:
        return device_count() > 0
    except RuntimeError as e:
        import warnings
        warnings.warn(f"tpu initialization: {e}", stacklevel=2)
        return False


def get_amp_supported_dtype() -> list:
    """The dtypes torch.autocast("tpu", dtype=...) accepts (PyTorch asks the device module)."""
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 is native on the tpu (the matrix unit takes it; every kernel computes it)."""
    return True


def is_initialized() -> bool:
    return bool(_ops().is_initialized())


def init() -> None:
    _lazy_init()


def device_count() -> int:
    """Number of tpu chips (TPU_NUM_DEVICES); raises RuntimeError if the environment is invalid."""
    return int(_ops().device_count())


def current_device() -> int:
    return int(_ops().current_device())


def set_device(device) -> None:
    _lazy_init()
    _ops().set_device(_index(device))


class device:
    """Context manager that changes the current tpu device."""

    def __init__(self, device):
        self.idx = _index(device) if device is not None else -1
        self.prev = -1

    def __enter__(self):
        if self.idx >= 0:
            self.prev = current_device()
            set_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev >= 0:
            set_device(self.prev)
        return False


@dataclass(frozen=True)
class _TpuDeviceProperties:
    name: str
    total_memory: int
    matrix_unit: str
    multi_processor_count: int
    index: int

    def __repr__(self):
        return (f"_TpuDeviceProperties(name='{self.name}', total_memory={self.total_memory // (1 << 20)}MB, "
                f"matrix_unit='{self.matrix_unit}', multi_processor_count={self.multi_processor_count})")


def get_device_properties(device=None) -> _TpuDeviceProperties:
    idx = _index(device)
    name, hbm, mxu, workers = _ops().device_props(idx)
    return _TpuDeviceProperties(name, int(hbm), mxu, int(workers), idx)


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


def get_device_capability(device=None):
    return (1, 0)


def synchronize(device=None) -> None:
    if not _initialized:
        _lazy_init()
    (_fast or _fast_sync())(-1 if device is None else _index(device))   # -1: the current device


# ---- streams and events (torch.Stream / torch.Event on the tpu device) ----
# PyTorch's torch.Event methods accept only exact torch.Event objects
# (e1.elapsed_time(e2), stream.record_event(e) check Py_TYPE == torch.Event),
# so torch.tpu.Event makes plain torch.Event objects on the tpu device;
# isinstance(e, torch.tpu.Event) holds for every tpu event, wherever it was
# made. torch.Stream accepts subclasses, so torch.tpu.Stream is one (it adds
# `priority`), and isinstance(s, torch.tpu.Stream) holds for every tpu stream.
_PRIVATEUSE1 = 20   # c10::DeviceType::PrivateUse1


class _EventMeta(type):
    def __instancecheck__(cls, obj):
        return type(obj) is torch.Event and obj.device.type == "tpu"


class Event(metaclass=_EventMeta):
    """A tpu event: a torch.Event on the tpu device (see torch.cuda.Event).

    Marks a point in a stream: record(), wait(), query(), synchronize(),
    elapsed_time(). ``blocking`` is accepted: host waits always sleep after a
    short spin. Interprocess events are not supported."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise NotImplementedError("torch.tpu.Event: interprocess events are not supported on tpu")
        _lazy_init()
        return torch.Event(device=torch.device("tpu", current_device()), enable_timing=enable_timing,
                           blocking=blocking, interprocess=False)


class _StreamMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Stream) and obj.device_type == _PRIVATEUSE1


class Stream(torch.Stream, metaclass=_StreamMeta):
    """A tpu stream: an in-order queue of work on one chip (see torch.cuda.Stream).

    Streams map onto a fixed pool of 32 queues per chip and priority, handed
    out round-robin, as CUDA's do: any number can be created; ``priority`` 0
    is low (the default), negative is high."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        _lazy_init()
        idx = _index(device)
        return super().__new__(cls, device=torch.device("tpu", idx), priority=priority)

    @property
    def priority(self) -> int:
        return int(_ops().stream_priority(self.device_index, self.stream_id))


def _as_tpu_stream(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device=None) -> Stream:
    _lazy_init()
    return _as_tpu_stream(torch.accelerator.current_stream(_index(device)))


def default_stream(device=None) -> Stream:
    _lazy_init()
    return Stream(stream_id=0, device_index=_index(device), device_type=_PRIVATEUSE1)


def set_stream(stream: torch.Stream) -> None:
    if stream is None:
        return
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager selecting a stream (``with torch.tpu.stream(s): ...``)."""

    def __init__(self, stream: Optional[torch.Stream]):
        self.stream = stream
        self.prev = None

    def __enter__(self):
        if self.stream is None:
            return self
        self.prev = torch.accelerator.current_stream(self.stream.device_index)
        torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.prev is not None:
            torch.accelerator.set_stream(self.prev)
        return False


def stream(stream: Optional[torch.Stream]) -> StreamContext:
    return StreamContext(stream)


# ---- random ----
def manual_seed(seed: int) -> None:
    _ops().manual_seed(current_device(), int(seed) & 0xFFFFFFFFFFFFFFFF if seed >= 0 else int(seed))


def manual_seed_all(seed: int) -> None:
    for d in range(device_count()):
        _ops().manual_seed(d, int(seed))


def seed() -> None:
    _ops().seed(current_device())


def seed_all() -> None:
    for d in range(device_count()):
        _ops().seed(d)


def initial_seed() -> int:
    return int(_ops().initial_seed(current_device())) & 0xFFFFFFFFFFFFFFFF


def get_rng_state(device="tpu") -> torch.Tensor:
    return _ops().get_rng_state(_index(device))


def get_rng_state_all():
    return [get_rng_state(d) for d in range(device_count())]


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _ops().set_rng_state(_index(device), new_state.to("cpu", torch.uint8).contiguous())


def set_rng_state_all(states) -> None:
    for d, s in enumerate(states):
        set_rng_state(s, d)


# ---- memory ----
def _stats(device=None):
    return _ops().mem_stats(_index(device))


def memory_allocated(device=None) -> int:
    return int(_stats(device)[0])


def max_memory_allocated(device=None) -> int:
    return int(_stats(device)[1])


def memory_reserved(device=None) -> int:
    return int(_stats(device)[2])


def max_memory_reserved(device=None) -> int:
    return int(_stats(device)[3])


def reset_peak_memory_stats(device=None) -> None:
    _ops().reset_peak(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    _ops().empty_cache()


def mem_get_info(device=None):
    free, total = _ops().mem_get_info(_index(device))
    return int(free), int(total)


def memory_stats(device=None) -> dict:
    a, pa, r, pr, nalloc, nfree, nooms, flushes, cap = (int(x) for x in _stats(device))
    return {
        "allocated_bytes.all.current": a, "allocated_bytes.all.peak": pa,
        "reserved_bytes.all.current": r, "reserved_bytes.all.peak": pr,
        "active_bytes.all.current": a, "active_bytes.all.peak": pa,
        "allocation.all.allocated": nalloc, "allocation.all.freed": nfree,
        "allocation.all.current": nalloc - nfree,
        "num_alloc_retries": flushes, "num_ooms": nooms, "capacity_bytes": cap,
    }


def memory_summary(device=None) -> str:
    s = memory_stats(device)
    return "\n".join(f"{k:32s} {v}" for k, v in s.items())


def _is_in_bad_fork() -> bool:
    return bool(_ops().is_forked())
