"""Timing and memory helpers shared by all workloads (worker side)."""

import re
import statistics
import time
from dataclasses import dataclass

pc = time.perf_counter


@dataclass(frozen=True)
class Repeats:
    """How one figure is repeated.

    warmup:   untimed-for-the-median calls (each is still timed: the first gives
              the first-step time, their sum the warm-up wall time).
    min_reps / max_reps: bounds on the timed repeats.
    budget_s: aim for this much timed work per figure (n = budget / step time).
    cap_s:    never spend more than ~this on timed repeats (slow configurations
              get fewer repeats, at least 1) so a slow device cannot blow up the run.
    """

    warmup: int
    min_reps: int
    max_reps: int
    budget_s: float
    cap_s: float


def choose_reps(t_est, r: Repeats):
    t_est = max(t_est, 1e-9)
    n = min(r.max_reps, max(r.min_reps, int(r.budget_s / t_est)))
    if n * t_est > r.cap_s:
        n = max(1, int(r.cap_s / t_est))
    return n


def measure(fn, sync, r: Repeats, deadline=None):
    """Time fn() (+ sync) warmup times, then n times; n is chosen adaptively.

    If fn returns a float, that float is the timed duration of the call (used
    when a call needs untimed preparation, e.g. a prefill before timed decode).
    """

    def once():
        t0 = pc()
        out = fn()
        sync()
        dt = pc() - t0
        return out if isinstance(out, float) else dt

    # A call slower than the figure's whole timed cap (PyTorch's bf16 GEMM on
    # a CPU without AVX512-BF16 takes minutes) ends the warm-up and is itself
    # the one sample: repeating it would only push the worker past its timeout.
    warm = []
    for _ in range(r.warmup):
        warm.append(once())
        if warm[-1] > r.cap_s:
            break
    t_est = warm[-1] if warm else once()
    times = []
    truncated = False
    if warm and warm[-1] > r.cap_s:
        times, warm = [warm[-1]], warm[:-1]
        truncated = "one call: slower than the figure's time cap"
    for _ in range(choose_reps(t_est, r) if not times else 0):
        if times and deadline is not None and pc() > deadline:
            truncated = "stopped early: worker time budget"
            break
        times.append(once())
    med = statistics.median(times)
    res = {
        "n": len(times),
        "median_s": med,
        "min_s": min(times),
        "max_s": max(times),
        "times_s": times,
        "warmup_n": len(warm),
        "warmup_times_s": warm,
        "first_s": warm[0] if warm else times[0],
        "warmup_wall_s": sum(warm),
        "warmup_overhead_s": (sum(warm) - len(warm) * med) if warm else 0.0,
    }
    if truncated:
        res["truncated"] = truncated
    return res


# ---- process memory (cpu configs; also recorded for tpu) -------------------

def _status_kb(field):
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M)
        return int(m.group(1)) * 1024 if m else None
    except OSError:
        return None


def rss_bytes():
    return _status_kb("VmRSS")


def reset_peak_rss():
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes():
    return _status_kb("VmHWM")
