"""Environment variables: bad values raise a RuntimeError naming the variable, its value and
what is accepted, at first use (import torch still works); good values take effect.
The parser itself is tested value by value in tests/c/test_runtime.c (test_config_parse)."""
import json
import os
import subprocess
import sys

import pytest

# Every test here runs a fresh process with its own environment (the variables under test):
# the parent's eager mode does not reach it.
pytestmark = pytest.mark.mode_independent

_PROBE = """
import json, sys, warnings
import torch                                   # must not fail: the error comes at first use
res = {"imported": True}
try:
    torch.zeros(2, device="tpu")
    res["zeros"] = "ok"
except RuntimeError as e:
    res["zeros"] = str(e)
try:
    res["count"] = torch.tpu.device_count()
except RuntimeError as e:
    res["count"] = str(e)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    res["available"] = torch.tpu.is_available()
    res["warnings"] = [str(x.message) for x in w]
if res["zeros"] == "ok":
    p = torch.tpu.get_device_properties(0)
    res["total_memory"] = p.total_memory
    res["workers"] = p.multi_processor_count
print(json.dumps(res))
"""


def _probe(eager_mode, **env_vars):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_", "TORCH_TPU_"))}
    if eager_mode == "debug":
        env["TORCH_TPU_LAUNCH_BLOCKING"] = "1"
    env.update(env_vars)
    p = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]   # an error, never a crash
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_bad_values_raise_at_first_use(eager_mode):
    # Each of these used to give 16 chips, a 1 MiB chip or a default without a word.
    bad = {"TPU_NUM_DEVICES": "99", "TPU_HBM_BYTES": "1.5G", "TPU_NUM_WORKERS": "-1", "TPU_MXU": "fast"}
    res = _probe(eager_mode, **bad)
    assert res["imported"]
    for what in ("zeros", "count"):
        msg = res[what]
        assert msg.startswith("invalid tpu configuration"), res
        for name, value in bad.items():
            assert f"{name}='{value}'" in msg, (name, msg)
        assert "expected an integer from 1 to 16" in msg
        assert "binary suffix K, M, G or T" in msg
        assert "expected an integer from 1 to 64" in msg
    assert res["available"] is False
    assert any("TPU_NUM_DEVICES='99'" in w for w in res["warnings"]), res


def test_good_values_take_effect(eager_mode):
    res = _probe(eager_mode, TPU_NUM_DEVICES="3", TPU_HBM_BYTES="96MiB", TPU_NUM_WORKERS="1")
    assert res == {**res, "zeros": "ok", "count": 3, "available": True, "warnings": [],
                   "total_memory": 96 << 20, "workers": 1}, json.dumps(res)
