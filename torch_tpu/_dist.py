"""torch_tpu._dist: the ``tpu_dist`` backend of torch.distributed.

Registered when torch_tpu loads (with ``import torch``), as TorchTPU names
it, and as the default backend of device type ``tpu``: so
``init_process_group("tpu_dist")``, ``init_process_group()`` (no backend, on a
tpu machine) and ``init_process_group("cpu:gloo,tpu:tpu_dist")`` all work.

The backend (csrc/dist.cpp) runs the runtime's collectives (coll.h) over
shared memory between the ranks of one host, stream-ordered like kernels.
When the ranks are on more than one host (compared through the store), a
Gloo process group carries the data instead: tpu tensors are staged in host
memory and each call waits for Gloo.
"""
import os
import socket

import torch.distributed as dist

_registered = False
transport = None  # of the last tpu_dist group made here: "shared memory" or "gloo" (tests read it)


def _host_identity():
    """This host, as the ranks compare it: hostname and boot id (TORCH_TPU_DIST_HOST overrides it, so
    that tests can put ranks of one machine on different "hosts" and take the cross-host path)."""
    forced = os.environ.get("TORCH_TPU_DIST_HOST")
    if forced:
        return forced
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _create_backend(store, rank, size, timeout):
    from . import _C  # noqa: PLC0415 - the pybind half of the extension (already loaded as a library)

    me = _host_identity()
    store.set(f"tpu_dist/host/{rank}", me)
    hosts = {store.get(f"tpu_dist/host/{r}").decode() for r in range(size)}
    global transport
    gloo, transport = None, "shared memory"
    if len(hosts) > 1:  # shared memory cannot reach every rank: Gloo carries the data (host copies)
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("tpu_dist/gloo/", store), rank, size, timeout)
        transport = "gloo"
    return _C._create_tpu_dist(store, rank, size, max(1, int(timeout.total_seconds() * 1000)), gloo)


def _register():
    global _registered
    if _registered or not dist.is_available():
        return
    dist.Backend.register_backend("tpu_dist", _create_backend, devices=["tpu"])
    _registered = True
