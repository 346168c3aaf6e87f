"""torch_tpu._dist: the ``tpu_dist`` backend of torch.distributed.

Registered when torch_tpu loads (with ``import torch``), as TorchTPU names
it, and as the default backend of device type ``tpu``: so
``init_process_group("tpu_dist")``, ``init_process_group()`` (no backend, on a
tpu machine) and ``init_process_group("cpu:gloo,tpu:tpu_dist")`` all work.

The backend (csrc/dist.cpp) runs the runtime's collectives (coll.h) over
shared memory between the ranks of one host, stream-ordered like kernels.
Ranks on different hosts are not supported yet (the backend raises
NotImplementedError at ``init_process_group``); neither are send / recv.
"""
import torch.distributed as dist

_registered = False


def _create_backend(store, rank, size, timeout):
    from . import _C  # noqa: PLC0415 - the pybind half of the extension (already loaded as a library)

    return _C._create_tpu_dist(store, rank, size, max(1, int(timeout.total_seconds() * 1000)))


def _register():
    global _registered
    if _registered or not dist.is_available():
        return
    dist.Backend.register_backend("tpu_dist", _create_backend, devices=["tpu"])
    _registered = True
