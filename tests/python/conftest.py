"""Shared fixtures: every test runs in each eager mode, with a leak check.

Modes: "debug" (synchronous), "strict" (asynchronous) and "fused" (Fused
Eager: recorded, fused and run at flush points).
"""
import gc
import time

import pytest
import torch
import torch_tpu
from torch._prims_common import is_non_overlapping_and_dense_or_false as _dense

EAGER_MODES = ["debug", "strict", "fused"]

# torch's own objects never die: keep them out of the collections the leak
# check runs twice per test (0.25 s each otherwise).
gc.collect()
gc.freeze()


def pytest_configure(config):
    config.addinivalue_line("markers", "mode_independent: a process- or configuration-level test (its "
                            "subprocess reads its own environment): runs once, in strict")


@pytest.fixture(params=EAGER_MODES, autouse=True)
def eager_mode(request):
    if request.param != "strict" and request.node.get_closest_marker("mode_independent"):
        pytest.skip("mode-independent: runs in strict only")
    torch_tpu.set_eager_mode(request.param)
    yield request.param
    torch.tpu.synchronize()
    torch_tpu.set_eager_mode("strict")


def pytest_collection_finish(session):
    # The collected test items live for the whole session: freeze them too.
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.call_failed = rep.failed


@pytest.fixture(autouse=True)
def no_leak(request):
    """After a test's tensors are freed, memory_allocated is back where it started."""
    gc.collect()
    # What survived is alive for good (modules, pytest's state): keep it out of
    # later collections, so the check after the test looks at the test's objects only.
    gc.freeze()
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    yield
    after = before - 1
    for _ in range(20):
        # (autograd's device thread drops a finished graph - its saved tensors and
        # grad buffers - on its own time, just after backward() returns)
        gc.collect()
        torch.tpu.synchronize()
        after = torch.tpu.memory_allocated()
        if after == before:
            break
        time.sleep(0.01)
    if getattr(request.node, "call_failed", False):
        return   # a failed test's traceback keeps its tensors alive: not a leak
    assert after == before, f"tpu memory leak: {after - before} bytes still allocated after {request.node.name}"


@pytest.fixture
def native_only():
    """The CPU fallback switched off (a fallback raises): for files whose ops must run natively
    (pytestmark = pytest.mark.usefixtures("native_only"))."""
    torch_tpu.set_cpu_fallback_enabled(False)
    yield
    torch_tpu.set_cpu_fallback_enabled(True)


def assert_close(tpu_result, cpu_result, check_layout=True, **kw):
    """Compare a tpu result with the CPU oracle: values, dtype, shape, NaN
    positions, and the layout (strides) wherever PyTorch's is well defined
    (the CPU result is dense and has more than one element)."""
    if isinstance(tpu_result, (tuple, list)):
        assert len(tpu_result) == len(cpu_result)
        for a, b in zip(tpu_result, cpu_result):
            assert_close(a, b, check_layout, **kw)
        return
    if not isinstance(tpu_result, torch.Tensor):
        assert tpu_result == cpu_result
        return
    assert tpu_result.device.type == "tpu", f"result on {tpu_result.device}, expected tpu"
    if check_layout and cpu_result.numel() > 1 and _dense(cpu_result):
        ours = [s for s, n in zip(tpu_result.stride(), tpu_result.shape) if n > 1]
        theirs = [s for s, n in zip(cpu_result.stride(), cpu_result.shape) if n > 1]
        assert ours == theirs, f"strides {tpu_result.stride()} differ from CPU's {cpu_result.stride()}"
    torch.testing.assert_close(tpu_result.cpu(), cpu_result, equal_nan=True, **kw)
