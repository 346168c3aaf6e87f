"""Worker: runs one (configuration, workload) pair and reports JSON lines.

    python -m torch_tpu.bench --worker --config tpu-strict --workload gemm [--quick]

Each record is printed on stdout as one line "@@BENCH@@ {json}" as soon as it
is known, so figures finished before a crash or timeout are kept.
"""

import gc
import json
import os
import sys
import time
import traceback

from .configs import CONFIGS
from .timing import measure, peak_rss_bytes, reset_peak_rss, rss_bytes
from .workloads import SIZES, WORKLOADS

TAG = "@@BENCH@@"


def emit(obj):
    sys.stdout.write(TAG + " " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _err(e):
    msg = f"{type(e).__name__}: {e}".strip()
    return msg if len(msg) <= 600 else msg[:600] + " ..."


def fused_available(torch):
    """Fused Eager is on when torch_tpu reports it (TORCH_TPU_DEFER_AND_FUSE=1 selects it)."""
    if getattr(torch, "tpu", None) is None:
        return False, "torch.tpu is missing"
    try:
        import torch_tpu
    except ImportError as e:
        return False, _err(e)
    mode = getattr(torch_tpu, "get_eager_mode", lambda: "?")()
    if mode != "fused":
        return False, f"torch_tpu runs in eager mode {mode!r}, not 'fused'"
    return True, ""


def compiled_backend(torch):
    """The torch.compile backend for tpu-compiled, or (None, reason).

    Available when torch_tpu names its backend (torch.tpu.compile_backend, a
    string or callable) or registers a dynamo backend called "tpu".
    """
    tpu = getattr(torch, "tpu", None)
    if tpu is None:
        return None, "torch.tpu is missing"
    be = getattr(tpu, "compile_backend", None)
    if be:
        return be, ""
    try:
        import torch._dynamo

        if "tpu" in torch._dynamo.list_backends(exclude_tags=()):
            return "tpu", ""
    except Exception as e:  # noqa: BLE001
        return None, _err(e)
    return None, "no torch.compile backend for tpu (torch.tpu.compile_backend / dynamo backend 'tpu')"


class Ctx:
    """What a workload needs to know about the configuration it runs under."""

    def __init__(self, config, threads, quick):
        import torch

        self.torch = torch
        self.config = config
        self.quick = quick
        self.size = SIZES[quick]
        torch.set_num_threads(threads)
        self.threads = torch.get_num_threads()
        self.is_tpu = config.device == "tpu"
        self._sync = lambda: None
        self._tpu = None
        self.backend = None
        if self.is_tpu:
            if getattr(torch, "tpu", None) is None:
                try:  # not autoloaded (e.g. not pip-installed): import it explicitly
                    import torch_tpu  # noqa: F401
                except ImportError as e:
                    raise RuntimeError(f"torch.tpu is not registered and torch_tpu does not import: {_err(e)}")
            self._tpu = getattr(torch, "tpu", None)
            if self._tpu is None:
                raise RuntimeError("torch.tpu is not registered (is torch_tpu installed and built?)")
            self.device = torch.device("tpu")
            torch.ones(1).to(self.device)  # fails here if the device is not usable
            self._sync = self._tpu.synchronize
            self._sync()
        else:
            self.device = torch.device("cpu")
        if config.compiler == "tpu":
            self.backend, why = compiled_backend(torch)
            if self.backend is None:
                raise RuntimeError(f"n/a (not implemented): {why}")
        self._fb = self._fallback_fn() if self.is_tpu else None

    # -- execution ------------------------------------------------------------
    def sync(self):
        self._sync()

    def compile(self, fn):
        if self.config.compiler is None:
            return fn
        if self.config.compiler == "inductor":
            return self.torch.compile(fn)
        return self.torch.compile(fn, backend=self.backend)

    def reset_compiler(self):
        if self.config.compiler is not None:
            import torch._dynamo

            torch._dynamo.reset()

    # -- memory ---------------------------------------------------------------
    def mem_begin(self):
        gc.collect()
        if self._tpu is not None:
            for name in ("reset_peak_memory_stats",):
                f = getattr(self._tpu, name, None)
                if callable(f):
                    f()
        reset_peak_rss()
        self._rss0 = rss_bytes()

    def mem_end(self, base_rss):
        out = {}
        peak = peak_rss_bytes()
        if peak is not None:
            out["rss_peak_bytes"] = peak
            out["rss_peak_over_base_bytes"] = peak - base_rss if base_rss else None
        if self._tpu is not None:
            f = getattr(self._tpu, "max_memory_allocated", None)
            if callable(f):
                try:
                    out["device_peak_bytes"] = int(f())
                except Exception as e:  # noqa: BLE001
                    out["device_peak_error"] = _err(e)
        return out

    # -- coverage -------------------------------------------------------------
    @staticmethod
    def _fallback_fn():
        mod = sys.modules.get("torch_tpu")
        if mod is None:
            try:
                import torch_tpu as mod  # noqa: F401
            except Exception:  # noqa: BLE001
                return None
        f = getattr(mod, "fallback_counts", None)
        return f if callable(f) else None

    def fallbacks(self):
        if self._fb is None:
            return None
        try:
            d = self._fb()
            return {str(k): int(v) for k, v in dict(d).items()}
        except Exception:  # noqa: BLE001
            return None


def _fallback_diff(before, after):
    if before is None or after is None:
        return None
    diff = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    top = dict(sorted(diff.items(), key=lambda kv: -kv[1])[:8])
    return {"calls": sum(diff.values()), "ops": len(diff), "top": top}


def probe(config_name, threads):
    """Is this configuration available here? Emits one 'probe' record."""
    cfg = CONFIGS[config_name]
    rec = {"kind": "probe", "config": config_name, "available": True, "reason": ""}
    try:
        import torch

        if getattr(torch, "tpu", None) is None:
            try:
                import torch_tpu  # noqa: F401
            except ImportError:
                pass
        if cfg.requires == "fused":
            ok, why = fused_available(torch)
        elif cfg.requires == "compiled":
            be, why = compiled_backend(torch)
            ok = be is not None
        else:
            ok, why = True, ""
        if not ok:
            rec.update(available=False, reason=f"n/a (not implemented): {why}")
    except Exception as e:  # noqa: BLE001
        rec.update(available=False, reason=f"n/a (not implemented): {_err(e)}")
    emit(rec)
    return 0


def run(config_name, workload_key, threads, quick, timeout):
    t_start = time.perf_counter()
    deadline = t_start + 0.85 * timeout if timeout else None
    cfg = CONFIGS[config_name]
    wl = WORKLOADS[workload_key]
    figures = wl.figures(quick)
    try:
        ctx = Ctx(cfg, threads, quick)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        emit({"kind": "fatal", "error": _err(e)})
        return 1
    torch = ctx.torch
    base_rss = rss_bytes()
    emit({"kind": "info", "torch": torch.__version__, "threads": ctx.threads,
          "interop_threads": torch.get_num_interop_threads(), "device": str(ctx.device),
          "base_rss_bytes": base_rss, "fallback_counts_available": ctx._fb is not None,
          "env": {k: os.environ.get(k) for k in ("TORCH_TPU_LAUNCH_BLOCKING", "TORCH_TPU_DEFER_AND_FUSE",
                                                 "OMP_NUM_THREADS")}})
    state = {}
    for fig in figures:
        rec = {"kind": "figure", "figure": fig.name}
        if deadline is not None and time.perf_counter() > deadline:
            rec.update(status="skipped", error="worker time budget exhausted before this figure")
            emit(rec)
            continue
        fb0 = ctx.fallbacks()
        try:
            ctx.reset_compiler()
            torch.manual_seed(0)
            ctx.mem_begin()
            bench = fig.build(ctx, state, ctx.size)
            ctx.sync()
            res = measure(bench.fn, ctx.sync, fig.repeats, deadline)
            rec.update(status="ok", **res)
            rec["work"] = bench.work
            rec["primary"] = bench.primary
            rec["limit"] = bench.limit
            rec["info"] = bench.info
            rec["memory"] = ctx.mem_end(base_rss)
            del bench
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            rec.update(status="error", error=_err(e))
            try:
                ctx.sync()
            except Exception:  # noqa: BLE001
                pass
        fb = _fallback_diff(fb0, ctx.fallbacks())
        if fb is not None:
            rec["fallbacks"] = fb
        emit(rec)
    state.clear()
    emit({"kind": "done", "wall_s": time.perf_counter() - t_start})
    return 0
