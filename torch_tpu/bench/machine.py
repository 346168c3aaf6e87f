"""Machine description, versions, commit, and the physical-limit microbenchmark."""

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

# CPU flags that matter for the figures (as spelled in /proc/cpuinfo).
INTERESTING_FLAGS = [
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
    "avx_vnni", "sha_ni",
]


def repo_root():
    """The checkout this package lives in (torch_tpu/bench/machine.py -> repo)."""
    return Path(__file__).resolve().parents[2]


def _cpuinfo():
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_flags():
    m = re.search(r"^flags\s*:\s*(.*)$", _cpuinfo(), re.M)
    return set(m.group(1).split()) if m else set()


def _meminfo_gib():
    try:
        m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        return round(int(m.group(1)) / 2**20, 1)
    except (OSError, AttributeError):
        return None


def _caches():
    out = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")):
        try:
            level = (idx / "level").read_text().strip()
            typ = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        key = f"L{level}" + ({"Data": "d", "Instruction": "i"}.get(typ, ""))
        out[key] = size
    return out


def machine_info():
    info = _cpuinfo()
    model = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
    family = re.search(r"^cpu family\s*:\s*(\d+)$", info, re.M)
    cpu_model = re.search(r"^model\s*:\s*(\d+)$", info, re.M)
    flags = cpu_flags()
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "cpu_model": model.group(1).strip() if model else platform.processor(),
        "cpu_family": int(family.group(1)) if family else None,
        "cpu_model_number": int(cpu_model.group(1)) if cpu_model else None,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "hypervisor": "hypervisor" in flags,
        "memory_gib": _meminfo_gib(),
        "caches": _caches(),
        "cpu_features": {f: (f in flags) for f in INTERESTING_FLAGS},
        "amx": bool({"amx_tile", "amx_bf16"} <= flags),
    }


def _version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions():
    v = {"python": platform.python_version()}
    for dist in ["torch", "torch_tpu", "transformers", "accelerate", "numpy", "matplotlib"]:
        v[dist] = _version(dist) or _version(dist.replace("_", "-"))
    gcc = shutil.which("gcc")
    if gcc:
        try:
            v["gcc"] = subprocess.run([gcc, "-dumpfullversion"], capture_output=True,
                                      text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            v["gcc"] = None
    return v


def commit_info(root=None):
    """Current commit read straight from .git (no git subprocess needed)."""
    root = Path(root or repo_root())
    git = root / ".git"
    if git.is_file():  # worktree: "gitdir: <path>"
        m = re.match(r"gitdir:\s*(.*)", git.read_text().strip())
        git = (root / m.group(1)).resolve() if m else git
    out = {"sha": None, "branch": None}
    try:
        head = (git / "HEAD").read_text().strip()
    except OSError:
        return out
    if not head.startswith("ref:"):
        out["sha"] = head
        return out
    ref = head[4:].strip()
    out["branch"] = ref.rsplit("/", 1)[-1] if ref.startswith("refs/heads/") else ref
    common = git
    if (git / "commondir").exists():
        common = (git / (git / "commondir").read_text().strip()).resolve()
    for base in (git, common):
        p = base / ref
        if p.exists():
            out["sha"] = p.read_text().strip()
            return out
    for base in (git, common):
        packed = base / "packed-refs"
        if packed.exists():
            for line in packed.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    out["sha"] = parts[0]
                    return out
    return out


# --------------------------------------------------------------------------
# Physical limits: benchmarks/peak.c, compiled on demand into build/bench/.

def build_peak(root=None, log=print):
    root = Path(root or repo_root())
    src = root / "benchmarks" / "peak.c"
    if not src.exists():
        raise FileNotFoundError(src)
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise RuntimeError("no C compiler (gcc) found to build benchmarks/peak.c")
    flags = ["-O2", "-pthread", "-std=gnu11"]
    digest = hashlib.sha1(src.read_bytes() + " ".join([cc] + flags).encode()).hexdigest()[:12]
    out_dir = root / "build" / "bench" / f"peak-{digest}"
    exe = out_dir / "peak"
    if not exe.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        log(f"building {src.relative_to(root)} -> {exe.relative_to(root)}")
        tmp = out_dir / "peak.tmp"
        r = subprocess.run([cc, *flags, "-o", str(tmp), str(src)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"compiling peak.c failed:\n{r.stderr}")
        tmp.replace(exe)
    return exe


def _derive(raw, threads, quick):
    lim = {"raw": raw, "threads": threads, "source": "benchmarks/peak.c", "quick": quick}
    lim["fp32_gflops"] = raw.get("fp32_fma_gflops_nt")
    lim["fp32_isa"] = raw.get("fp32_isa")
    if raw.get("bf16_amx_gflops_nt"):
        lim["bf16_gflops"], lim["bf16_isa"] = raw["bf16_amx_gflops_nt"], "amx"
    elif raw.get("bf16_avx512_gflops_nt"):
        lim["bf16_gflops"], lim["bf16_isa"] = raw["bf16_avx512_gflops_nt"], "avx512_bf16"
    else:
        lim["bf16_gflops"], lim["bf16_isa"] = lim["fp32_gflops"], raw.get("fp32_isa")
    lim["dram_gbs"] = raw.get("dram_read_gbs_nt")
    return lim


def run_peak(threads, quick=False, root=None, log=print):
    """One run of peak.c: its raw JSON."""
    exe = build_peak(root, log)
    cmd = [str(exe), "--threads", str(threads)] + (["--quick"] if quick else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{exe} failed ({r.returncode}): {r.stderr}")
    return json.loads(r.stdout)


def measure_limits(threads, quick=False, root=None, log=print, previous=None):
    """Run peak.c; returns its JSON plus the limits the report divides by.

    With `previous` (the result of an earlier call in the same run), each rate is
    the maximum of both measurements: a physical limit is what the machine can
    do, and a lower reading only means something else was running at the time.
    Both raw readings are kept in "samples".
    """
    raw = run_peak(threads, quick, root, log)
    samples = list((previous or {}).get("samples", [])) + [raw]
    merged = dict(raw)
    for s in samples:
        for k, v in s.items():
            if k.endswith(("_gflops_1t", "_gflops_nt", "_gbs_1t", "_gbs_nt")) and v is not None:
                merged[k] = max(v, merged.get(k) or 0)
    lim = _derive(merged, threads, quick)
    lim["samples"] = samples
    return lim


if __name__ == "__main__":  # python -m torch_tpu.bench.machine
    print(json.dumps({"machine": machine_info(), "versions": versions(), "commit": commit_info(),
                      "limits": measure_limits(os.cpu_count() or 1, quick="--quick" in sys.argv)},
                     indent=2))
