"""The benchmark harness works end to end (python -m torch_tpu.bench --quick).

Runs the harness on tiny sizes for cpu-eager, tpu-strict and tpu-fused (plus
the availability probe of tpu-compiled) into a temporary directory and
checks the JSON, Markdown and PNG it writes. It asserts nothing about speed.
While the tpu device cannot run a workload, the tpu-strict figures are errors
and this test fails on purpose: the harness reports coverage honestly.
"""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["cpu-eager", "tpu-strict", "tpu-fused", "tpu-compiled"]
MUST_RUN = ["cpu-eager", "tpu-strict", "tpu-fused"]
# One subprocess per (configuration, workload): each costs an interpreter and torch's import. The
# transformers workloads (gpt2-train, gpt2-infer) and the two whose code paths the others share
# (gemm, overhead and eager-demo: micro figures like elementwise's; cnn: a step workload like mlp) are
# left to `make bench` (GPT-2 and CNNs - ResNet, ConvNeXt - are tested in test_training.py /
# test_models.py): one micro and one step workload prove the harness in make test.
WORKLOADS = {"elementwise", "mlp"}
STEP_WORKLOADS = {"mlp"}


def _bench_module(name):
    """Load torch_tpu/bench/<name>.py without importing the torch_tpu package."""
    spec = importlib.util.spec_from_file_location("_bench_standalone", ROOT / "torch_tpu" / "bench" / "standalone.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return __import__(f"torch_tpu_bench.{name}", fromlist=[name])


@pytest.fixture(autouse=True)
def eager_mode():
    """Overrides conftest's per-eager-mode parametrization: the harness selects the tpu
    modes itself (one subprocess per configuration), so these tests run once."""
    yield None


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    readme = ROOT / "README.md"
    before = readme.read_bytes() if readme.exists() else None
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torch_tpu.bench", "--quick", "--configs", ",".join(CONFIGS),
                           "--workloads", ",".join(sorted(WORKLOADS)), "--out", str(out), "--update-readme"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    print(proc.stdout[-4000:], proc.stderr[-4000:], f"\nquick run took {wall:.1f} s", sep="\n")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = readme.read_bytes() if readme.exists() else None
    return out, json.loads((out / "latest.json").read_text()), before, after


def test_outputs_exist(quick_run):
    out, run, _, _ = quick_run
    for name in ("latest.json", "latest.md", "latest.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((out / "runs").glob("*.json")), "a JSON file per run"


def test_json_structure(quick_run):
    _, run, _, _ = quick_run
    for key in ("schema", "run", "machine", "versions", "commit", "limits", "configs", "results", "pairs"):
        assert key in run, key
    assert run["run"]["quick"] is True and run["run"]["configs"] == CONFIGS
    assert set(run["run"]["workloads"]) == WORKLOADS
    m = run["machine"]
    assert isinstance(m["amx"], bool) and "avx512f" in m["cpu_features"]
    assert run["versions"]["torch"]
    lim = run["limits"]
    assert lim and "error" not in lim, lim
    for k in ("fp32_gflops", "bf16_gflops", "dram_gbs"):
        assert lim[k] and lim[k] > 0, k
    assert "bf16_amx_gflops_nt" in lim["raw"]  # null when the machine has no AMX


def test_every_figure_measured(quick_run):
    _, run, _, _ = quick_run
    res = run["results"]
    assert {r["workload"] for r in res} == WORKLOADS
    figures = {(r["workload"], r["figure"]) for r in res}
    by_key = {(r["config"], r["workload"], r["figure"]): r for r in res}
    problems = []
    for cfg in MUST_RUN:
        for wl, fig in sorted(figures):
            r = by_key.get((cfg, wl, fig))
            if r is None or r["status"] != "ok":
                problems.append(f"{cfg} / {wl} / {fig}: {r and r['status']}: {r and r.get('error')}")
                continue
            assert r["n"] >= 1 and len(r["times_s"]) == r["n"]
            assert r["min_s"] <= r["median_s"] <= r["max_s"]
            for k in ("first_s", "warmup_wall_s", "warmup_overhead_s", "primary_value", "peak_memory", "work"):
                assert k in r, (cfg, wl, fig, k)
            if wl in STEP_WORKLOADS:
                assert r["warmup_n"] >= 1
            if cfg != "cpu-eager":
                assert r["ratio_vs_cpu_eager"] > 0
            if cfg.startswith("tpu"):
                assert r["ratio_vs_tpu_strict"] > 0
                assert r["peak_memory"]["kind"].startswith("device")
    assert not problems, "figures without a number:\n" + "\n".join(problems)


def test_unavailable_configs_are_not_faked(quick_run):
    _, run, _, _ = quick_run
    assert run["configs"]["tpu-fused"]["status"] != "n/a"
    for cfg in ("tpu-compiled",):
        status = run["configs"][cfg]["status"]
        rows = [r for r in run["results"] if r["config"] == cfg]
        assert rows
        if status == "n/a":
            assert "not implemented" in run["configs"][cfg]["reason"]
            assert all(r["status"] == "n/a" and "median_s" not in r for r in rows)


def test_markdown_and_readme(quick_run):
    out, run, before, after = quick_run
    md = (out / "latest.md").read_text()
    assert "| # | Workload | Figure | Metric | " + " | ".join(CONFIGS) + " |" in md
    assert "time(config) / time(cpu-eager)" in md and "latest.png" in md
    assert before == after, "--quick must never touch README.md"


def test_readme_region_update(tmp_path):
    report = _bench_module("report")
    run = json.loads(json.dumps({
        "run": {"configs": ["cpu-eager"], "started": "2026-01-01T00:00:00", "threads": 2, "quick": False},
        "machine": {"cpu_model": "cpu", "usable_cpus": 2, "amx": False}, "versions": {"torch": "x"},
        "commit": {"sha": "abc"}, "limits": None, "configs": {}, "results": [],
        "files": {"json": str(tmp_path / "r.json"), "md": str(tmp_path / "r.md"), "png": str(tmp_path / "r.png")}}))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- bench:start -->\nold\n<!-- bench:end -->\noutro\n")
    assert report.update_readme(readme, run, tmp_path, log=lambda *a: None)
    text = readme.read_text()
    assert text.startswith("intro\n<!-- bench:start -->") and text.endswith("<!-- bench:end -->\noutro\n")
    assert "old" not in text and "r.png" in text
    readme.write_text("no markers\n")
    msgs = []
    assert not report.update_readme(readme, run, tmp_path, log=msgs.append)
    assert readme.read_text() == "no markers\n" and "warning" in msgs[0]


def test_distributed_bench_quick():
    """python -m torch_tpu.bench.dist --quick: both backends on 2 ranks, every size, the DDP rows; it
    writes nothing (no JSON, no README change) in quick mode."""
    readme = ROOT / "README.md"
    before = readme.read_bytes()
    proc = subprocess.run([sys.executable, "-m", "torch_tpu.bench.dist", "--quick", "--update-readme"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| ") and (" KB |" in ln or " MB |" in ln)]
    assert [r.split("|")[1].strip() for r in rows] == ["1 KB", "64 KB", "1 MB"], proc.stdout
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert len(cells) == 9 and all(float(c) > 0 for c in (cells[1], cells[2], cells[5], cells[6])), r
    assert "DDP training step" in proc.stdout and "2 ranks on the same cores" in proc.stdout
    assert readme.read_bytes() == before
