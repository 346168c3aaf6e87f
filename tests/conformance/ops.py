#!/usr/bin/env python
"""Conformance sweep: every OpInfo of PyTorch's op_db on the tpu device vs the CPU.

For each OpInfo in torch.testing._internal.common_methods_invocations.op_db and each dtype
(float32 and bfloat16 by default): its first sample inputs (--samples) plus a few of its reference
inputs (--refs; up to half with NaN / inf / huge values, the rest spread over broadcasting,
non-contiguous, empty, type-promotion cases) run on the CPU and on tpu with the same values and
strides (tensors OpInfo keeps on the CPU whatever the device, found through a 'meta' twin of each
sample, stay there), forward and - where the OpInfo supports autograd for the dtype on the CPU -
backward (torch.autograd.grad with the same random cotangents), and are compared. CPU fallbacks are
counted per sample (torch_tpu.fallback_counts()). Each OpInfo's error_inputs run on both devices
too: the tpu has to raise the exception type the CPU raises.

    python tests/conformance/ops.py [--only add,nn.functional.conv2d] [--limit N] [--skip N]
                                    [--dtypes float32,bfloat16] [--samples 8] [--refs 6]
                                    [--json out.json] [--timeout 90] [--jobs 1] [--chunk 40]
                                    [--mode strict|debug|fused] [--summary-from out.json] [-v]

Categories per (op, dtype, direction):
  native    every sample ran on tpu, zero CPU fallbacks, results matched
  fallback  matched, but some sample used the CPU fallback
  mismatch  some sample's result differs from the CPU's (dtype, shape, device, structure, values):
            potential wrong answers. Each records the max abs error, the worst
            |err| / (atol + rtol*|cpu|) and, where they differ, both devices' distance to a float64
            CPU run of the same inputs; the summary sorts them into wrong? / undefined per OpInfo /
            both off / ties / rounding (see verdict_class)
  raise     tpu raised where the CPU did not (exception type + first line)
  skip      the CPU does not support the dtype / direction, or no sample ran on the CPU
            (samples the CPU rejects, or with nothing to put on the tpu, are skipped)
  crash / timeout   the worker process died / hung (chunks of --chunk OpInfos run in a subprocess,
            --timeout per (op, dtype) or error_inputs unit; the worker is restarted after it)
Priority when samples disagree: mismatch > raise > fallback > native.

Random ops (OpInfo says "output is non-deterministic", or has_nondeterministic_output) and
uninitialized ones (empty*) are compared by structure, shape and dtype only. Integer results that
differ only by picking other ones of equal input values (sort / topk / max(dim) ties) count as a match
(tie_order_differs), and then that sample's gradient is compared by shape only.
Tolerances (|tpu - cpu| <= atol + rtol*|cpu|, NaN == NaN): see TOL.
"""
import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.abspath(__file__)
DEV = "tpu"
# (rtol, atol) per dtype and direction; OpInfo's own defaults for float32 (1.3e-6 / 1e-5) are for the
# same kernels: a different accumulation order or libm needs more. bfloat16: 2 ulps relative.
# (rtol, atol) per dtype and direction. Looser than OpInfo's per-op defaults because one table serves
# every op: float32 forward allows a few ulps of reassociation (our reductions and GEMM sum in another
# order than the CPU's), backward 10x that (gradients chain several such ops); bfloat16 allows 2 (forward)
# and 4 (backward) bf16 ulps of relative error, float16 likewise in its precision. Anything beyond is
# listed as a mismatch and re-run in float64 to see which side is off: a loose table cannot hide a bug
# that the float64 arbiter would show.
TOL = {
    ("float32", "forward"): (1e-4, 1e-5),
    ("float32", "backward"): (1e-3, 1e-4),
    ("bfloat16", "forward"): (1.6e-2, 1e-2),
    ("bfloat16", "backward"): (3.2e-2, 2e-2),
    ("float16", "forward"): (1e-3, 1e-3),
    ("float16", "backward"): (4e-3, 2e-3),
    ("float64", "forward"): (1e-7, 1e-7),
    ("float64", "backward"): (1e-6, 1e-6),
    ("complex64", "forward"): (1e-4, 1e-5),     # complex: its parts as the real dtype's (view_as_real)
    ("complex64", "backward"): (1e-3, 1e-4),
    ("complex128", "forward"): (1e-7, 1e-7),
    ("complex128", "backward"): (1e-6, 1e-6),
}
DEFAULT_TOL = (0.0, 0.0)              # integer / bool dtypes: exact
RANDOM_NAMES = {"randn", "rand", "randint", "nn.functional.alpha_dropout", "bernoulli", "multinomial", "normal"}
# ops whose result (or gradient) picks one of several equal input values: with ties the CPU and the tpu may
# pick differently and both be right
TIE_OPS = {"sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode", "max", "min", "argmax",
           "argmin", "cummax", "cummin", "unique", "unique_consecutive", "nn.functional.max_pool1d",
           "nn.functional.max_pool2d", "nn.functional.max_pool3d", "nn.functional.adaptive_max_pool1d",
           "nn.functional.adaptive_max_pool2d", "nn.functional.adaptive_max_pool3d",
           "max_pool2d_with_indices_backward", "nn.functional.fractional_max_pool2d",
           "nn.functional.fractional_max_pool3d"}
MAX_REF_NUMEL = 1 << 18               # a reference input above this many elements is skipped (not cheap)
DIRS = ("forward", "backward")
CATS = ["native", "fallback", "mismatch", "raise", "crash", "timeout", "skip"]


def _err(e):
    msg = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    first = msg[0] if msg else ""
    return f"{type(e).__name__}: {first[:240]}"


def _norm(msg):
    msg = re.sub(r"0x[0-9a-f]+", "0x#", msg)
    msg = re.sub(r"\d+", "#", msg)
    return msg[:150]


def op_id(info):
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


# --------------------------------------------------------------------------------------------
# OpInfo metadata
# --------------------------------------------------------------------------------------------

def _skip_reason(dec):
    import unittest
    if dec is unittest.expectedFailure:
        return "expectedFailure"
    for c in getattr(dec, "__closure__", None) or ():
        try:
            if isinstance(c.cell_contents, str):
                return c.cell_contents
        except ValueError:
            pass
    return ""


def compare_cpu_notes(info):
    """Reasons OpInfo gives for skipping / xfailing its own device-vs-CPU test (test_compare_cpu).
    Nothing is skipped on their account: they label a mismatch in the summary ([OpInfo: ...]) and
    mark non-deterministic ops, whose values no device can reproduce (compared by shape and dtype)."""
    out = []
    for di in getattr(info, "decorators", ()) or ():
        if getattr(di, "test_name", None) == "test_compare_cpu" and getattr(di, "device_type", None) in (None, "cpu"):
            for d in getattr(di, "decorators", ()):
                out.append(_skip_reason(d))
    return out


def is_random(info):
    if getattr(info, "has_nondeterministic_output", False) or info.name in RANDOM_NAMES:
        return True
    if info.name.startswith(("empty", "new_empty")):
        return True
    return any("non-deterministic" in n for n in compare_cpu_notes(info))


# --------------------------------------------------------------------------------------------
# worker: runs units (op index, kind) and appends JSON lines to a file
# --------------------------------------------------------------------------------------------

class Ctx:
    pass


def _setup_worker(mode):
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch_tpu
    torch.set_num_threads(1)
    torch_tpu.set_cpu_fallback_enabled(True)
    if mode:
        torch_tpu.set_eager_mode(mode)
    from torch.testing._internal.common_methods_invocations import op_db
    c = Ctx()
    c.torch, c.tt, c.op_db = torch, torch_tpu, op_db
    from torch.utils._pytree import tree_flatten, tree_map
    c.tree_flatten, c.tree_map = tree_flatten, tree_map
    c.dev = torch.device(DEV)
    return c


def to_device(c, tree, memo, device=DEV, pinned=()):
    """Copy every tensor of a sample to `device` as a leaf with the same values, strides and storage offset
    (the same tensor twice stays one tensor; views of one another become separate leaves, on both devices
    alike). For tpu: device arguments 'cpu' become 'tpu', a CPU generator is dropped, and the leaves at
    the positions `pinned` stay on the CPU; memo["on_tpu"] says whether anything went to the tpu."""
    torch = c.torch
    to_tpu = device == DEV

    def conv(k, x):
        if isinstance(x, torch.Tensor):
            if id(x) in memo:
                return memo[id(x)]
            dev = "cpu" if k in pinned else device
            if x.layout != torch.strided or x.is_quantized:
                y = x.detach().to(dev, copy=True)
            else:
                st = x.untyped_storage()
                n = st.nbytes() // x.element_size()
                base = torch.empty(0, dtype=x.dtype).set_(st, 0, (n,), (1,))
                base = base.to(dev) if dev != "cpu" else base.clone()
                y = base.as_strided(x.size(), x.stride(), x.storage_offset()).detach()
            if x.requires_grad:
                y.requires_grad_(True)
            memo[id(x)] = y
            if dev == DEV:
                memo["on_tpu"] = True
            return y
        if not to_tpu:
            return x
        if isinstance(x, torch.device) and x.type == "cpu":
            memo["on_tpu"] = True
            return c.dev
        if isinstance(x, str) and (x == "cpu" or x.startswith("cpu:")):
            memo["on_tpu"] = True
            return DEV
        if isinstance(x, torch.Generator):
            return None
        return x
    leaves, spec = c.tree_flatten(tree)
    return spec.unflatten([conv(k, x) for k, x in enumerate(leaves)])


def to_f64(c, tree):
    torch = c.torch
    memo = {}

    def conv(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            if id(x) not in memo:
                memo[id(x)] = x.detach().double().requires_grad_(x.requires_grad)
            return memo[id(x)]
        if isinstance(x, torch.dtype) and x.is_floating_point:
            return torch.float64
        return x
    return c.tree_map(conv, tree)


def call(info, s_in, args, kwargs):
    return info(s_in, *args, **kwargs)


def compare_leaf(c, a, b, rtol, atol, random):
    """a: CPU value, b: tpu value. Returns (ok, detail dict)."""
    torch = c.torch
    if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
        return False, {"reason": f"type {type(a).__name__} vs {type(b).__name__}"}
    if not isinstance(a, torch.Tensor):
        if isinstance(a, float) and isinstance(b, (float, int)):
            if a != a and b != b:
                return True, {}
            d = abs(a - b)
            ok = d <= atol + rtol * abs(a) or a == b
            return ok, ({} if ok else {"reason": "value", "max_abs": d})
        try:
            ok = bool(a == b)
        except Exception:  # noqa: BLE001
            ok = repr(a) == repr(b)
        return ok, ({} if ok else {"reason": f"value {str(a)[:40]} vs {str(b)[:40]}"})
    if b.device.type != DEV:
        return False, {"reason": f"result on {b.device.type}"}
    if a.dtype != b.dtype:
        return False, {"reason": f"dtype {a.dtype} vs {b.dtype}".replace("torch.", "")}
    if a.shape != b.shape:
        return False, {"reason": f"shape {tuple(a.shape)} vs {tuple(b.shape)}"}
    if a.layout != b.layout:
        return False, {"reason": f"layout {a.layout} vs {b.layout}"}
    det = {}
    if a.numel() > 1 and a.layout == torch.strided and a.stride() != b.stride():
        det["stride"] = f"{a.stride()} vs {b.stride()}"
    if random or a.numel() == 0:
        return True, det
    a = a.detach()
    b = b.detach().cpu()
    if a.is_complex():
        a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
    if not (a.is_floating_point() or a.is_complex()):
        if torch.equal(a, b):
            return True, det
        ne = a != b
        det.update(reason="value", n_bad=int(ne.sum()), numel=a.numel(),
                   max_abs=float((a[ne].double() - b[ne].double()).abs().max()) if a.dtype != torch.bool else 1.0)
        return False, det
    a, b = a.double(), b.double()
    na, nb = torch.isnan(a), torch.isnan(b)
    if not torch.equal(na, nb):
        det.update(reason="nan pattern", n_bad=int((na != nb).sum()), numel=a.numel())
        return False, det
    fin_a, fin_b = torch.isfinite(a), torch.isfinite(b)
    inf_bad = (~na) & ((fin_a != fin_b) | ((~fin_a) & (a != b)))
    if inf_bad.any():
        det.update(reason="inf pattern", n_bad=int(inf_bad.sum()), numel=a.numel())
        return False, det
    f = fin_a
    if not f.any():
        return True, det
    af, bf = a[f], b[f]
    diff = (af - bf).abs()
    tol = atol + rtol * af.abs()
    ratio = diff / tol.clamp_min(1e-300) if (atol or rtol) else torch.where(diff > 0, float("inf"), 0.0)
    det["max_abs"] = float(diff.max())
    det["max_ratio"] = float(ratio.max())
    bad = diff > tol
    if bad.any():
        i = int(ratio.argmax())
        det.update(reason="value", n_bad=int(bad.sum()), numel=a.numel(), at_cpu=float(af[i]), at_tpu=float(bf[i]))
        return False, det
    return True, det


def compare_out(c, a, b, rtol, atol, random):
    """Compare pytrees. Returns (ok, worst detail dict with 'leaf')."""
    la, sa = c.tree_flatten(a)
    lb, sb = c.tree_flatten(b)
    if len(la) != len(lb) or str(sa) != str(sb):
        return False, {"reason": f"structure {str(sa)[:60]} vs {str(sb)[:60]}"}
    ok_all, worst, stride = True, {}, None
    for i, (x, y) in enumerate(zip(la, lb)):
        ok, det = compare_leaf(c, x, y, rtol, atol, random)
        if det.get("stride") and stride is None:
            stride = det["stride"]
        if not ok:
            if ok_all or det.get("max_ratio", float("inf")) > worst.get("max_ratio", 0):
                worst = dict(det, leaf=i)
            ok_all = False
        elif ok_all and det.get("max_ratio", 0) >= worst.get("max_ratio", 0):
            worst = dict(det, leaf=i)
    if stride:
        worst["stride"] = stride
    return ok_all, worst


def _leaf(c, tree, i):
    return c.tree_flatten(tree)[0][i]


def f64_check(c, cpu_val, tpu_val, ref_val, rtol, atol):
    """Distance of the CPU's and the tpu's result to a float64 CPU run of the same inputs, over the elements
    where the two disagree (NaN vs a number: inf)."""
    torch = c.torch
    try:
        if not all(isinstance(x, torch.Tensor) for x in (cpu_val, tpu_val, ref_val)):
            return None
        a, b, r = (x.detach().cpu().double() for x in (cpu_val, tpu_val, ref_val))
        if a.is_complex() or a.shape != b.shape or a.shape != r.shape:
            return None
        na, nb = torch.isnan(a), torch.isnan(b)
        with torch.no_grad():
            d = (a - b).abs()
            bad = (na != nb) | (~na & ~nb & ~(a == b) & ~(d <= atol + rtol * a.abs()))
        if not bad.any():
            return None

        def dist(x):
            x, y = x[bad], r[bad]
            nx, ny = torch.isnan(x), torch.isnan(y)
            e = torch.where(nx & ny, 0.0, torch.where(nx | ny, float("inf"), (x - y).abs()))
            e = torch.where(x == y, 0.0, e)        # equal infinities
            return float(e.max())
        ea, eb = dist(a), dist(b)
        rb = r[bad]
        rb = rb[torch.isfinite(rb)]
        scale = max(1.0, float(rb.abs().max())) if rb.numel() else 1.0
        if eb > 2 * ea + 1e-12:
            verdict = "tpu further from float64 than the CPU"
        elif eb <= 0.1 * scale:
            verdict = "rounding (tpu about as close to float64 as the CPU, or closer)"
        else:
            verdict = "both off (the CPU as far from float64 as the tpu: special values, ill-conditioned)"
        return {"cpu_err_f64": ea, "tpu_err_f64": eb, "f64_scale": scale, "verdict": verdict}
    except Exception:  # noqa: BLE001
        return None


def tie_only(c, x, cpu_out, tpu_out, rtol, atol):
    """True if the results differ only in integer leaves (indices) that pick equal input values: ties, whose
    order PyTorch leaves open (sort / topk / kthvalue / median / mode / max(dim) / argmax ...)."""
    torch = c.torch
    if not isinstance(x, torch.Tensor):
        return False
    la, lb = c.tree_flatten(cpu_out)[0], c.tree_flatten(tpu_out)[0]
    vals = [a for a in la if isinstance(a, torch.Tensor) and a.is_floating_point()]
    bad = []
    for a, b in zip(la, lb):
        ok, _ = compare_leaf(c, a, b, rtol, atol, False)
        if not ok:
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == torch.int64
                    and b.dtype == a.dtype and a.shape == b.shape and b.device.type == DEV):
                return False
            bad.append((a, b.cpu()))
    if not bad:
        return False
    xd = x.detach()
    for ia, ib in bad:
        found = False
        cands = [None] + list(range(xd.dim()))
        for d in cands:
            try:
                if d is None:
                    if ia.numel() != 1:
                        continue
                    va, vb = xd.reshape(-1)[ia.reshape(-1)], xd.reshape(-1)[ib.reshape(-1)]
                else:
                    ja, jb = ia, ib
                    if ja.dim() == xd.dim() - 1:
                        ja, jb = ja.unsqueeze(d), jb.unsqueeze(d)
                    if ja.dim() != xd.dim() or any(ja.shape[k] != xd.shape[k] for k in range(xd.dim()) if k != d):
                        continue
                    va, vb = torch.gather(xd, d, ja), torch.gather(xd, d, jb)
                    # the dim is right if the CPU's indices give the CPU's values (when there are values)
                    if vals and not any(v.shape == va.reshape(v.shape).shape and torch.equal(
                            torch.nan_to_num(v.detach().reshape(va.shape)), torch.nan_to_num(va))
                            for v in vals if v.numel() == va.numel()):
                        continue
                if torch.equal(torch.nan_to_num(va), torch.nan_to_num(vb)):
                    found = True
                    break
            except Exception:  # noqa: BLE001
                continue
        if not found:
            return False
    return True


def has_ties(c, info, x):
    torch = c.torch
    if info.name not in TIE_OPS or not isinstance(x, torch.Tensor) or x.numel() < 2:
        return False
    try:
        return torch.unique(x.detach()).numel() < x.numel()
    except Exception:  # noqa: BLE001
        return False


def verdict_class(r, x):
    """For a mismatch: 'undefined' (OpInfo says some of its inputs give undefined results), 'rounding'
    (every recorded sample: the tpu about as close to float64 as the CPU, and close), 'ties' (equal input
    values a sort / max-like op may pick in either order), 'both off' (the CPU's own result is as far from
    float64 as the tpu's: NaN / inf inputs, ill-conditioned), else 'wrong?'."""
    if any("undefined" in n for n in r.get("compare_cpu_notes") or ()):
        return "undefined"
    ms = x.get("mismatches") or []
    if not ms:
        return "wrong?"
    v = [(m.get("verdict") or "").split(" ")[0] for m in ms]
    if all(x == "rounding" for x in v):
        return "rounding"
    if all(m.get("ties_in_input") or x == "rounding" for m, x in zip(ms, v)):
        return "ties"
    if all(x in ("rounding", "both") for x in v):
        return "both off"
    return "wrong?"


def grad_parts(c, out, s_in, args, kwargs):
    """(differentiable output tensors, positions in the flattened output, leaf inputs requiring grad)."""
    torch = c.torch
    leaves = c.tree_flatten(out)[0]
    pos = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.requires_grad
           and (t.is_floating_point() or t.is_complex())]
    ins, seen = [], set()
    for t in c.tree_flatten((s_in, args, kwargs))[0]:
        if isinstance(t, torch.Tensor) and t.requires_grad and id(t) not in seen:
            seen.add(id(t))
            ins.append(t)
    return [leaves[i] for i in pos], pos, ins


def new_dir_rec():
    return {"counts": collections.Counter(), "fallbacks": collections.Counter(), "errors": [], "mismatches": [],
            "strides": 0, "ties": 0, "worst_ratio": 0.0, "worst_abs": 0.0}


def _note_err(rec, msg, k):
    if len(rec["errors"]) < 3 and all(e["error"] != msg for e in rec["errors"]):
        rec["errors"].append({"sample": k, "error": msg})


def finish_dir(rec, skip_reason=None):
    cnt = rec["counts"]
    if cnt["mismatch"]:
        cat = "mismatch"
    elif cnt["raise"]:
        cat = "raise"
    elif cnt["fallback"]:
        cat = "fallback"
    elif cnt["native"]:
        cat = "native"
    else:
        cat = "skip"
    out = {"cat": cat, "counts": dict(cnt), "fallbacks": dict(rec["fallbacks"])}
    if cat == "skip":
        out["skip_reason"] = skip_reason or rec.get("skip_reason") or "no sample ran on the CPU"
    for k in ("errors", "mismatches"):
        if rec[k]:
            out[k] = rec[k]
    if rec["strides"]:
        out["stride_differs"] = rec["strides"]
    if rec["ties"]:
        out["tie_order_differs"] = rec["ties"]
    if rec.get("no_tpu_input"):
        out["samples_without_tpu_input"] = rec["no_tpu_input"]
    if cnt["native"] or cnt["fallback"] or cnt["mismatch"]:
        out["worst_ratio"] = rec["worst_ratio"]
        out["worst_abs"] = rec["worst_abs"]
    return out


def _tensors(c, s):
    return [t for t in c.tree_flatten((s.input, s.args, s.kwargs))[0] if isinstance(t, c.torch.Tensor)]


def gen_samples(c, info, dtype, grad, n_samples, n_refs):
    """The first n_samples sample inputs, then up to n_refs of the reference inputs that follow the sample
    inputs (at most MAX_REF_NUMEL elements each): up to half of them with NaN / inf / huge values, the
    rest spread over the list (broadcasting, non-contiguous, empty, type promotion ...).
    Returns [(key, sample, (stream, position))]."""
    import itertools
    torch = c.torch
    torch.manual_seed(0)
    samples = [(f"s{i}", s, ("s", i)) for i, s in
               enumerate(itertools.islice(info.sample_inputs("cpu", dtype, requires_grad=grad), n_samples))]
    if n_refs and info.reference_inputs_func is not None:
        extras = []
        try:   # a reference generator may fail part way (e.g. integer tensors with requires_grad): keep the rest
            torch.manual_seed(0)
            n_all = sum(1 for _ in info.sample_inputs("cpu", dtype, requires_grad=grad))
            torch.manual_seed(1)
            for j, s in enumerate(info.reference_inputs("cpu", dtype, requires_grad=grad)):
                if j >= n_all + 300:
                    break
                if j >= n_all and sum(t.numel() for t in _tensors(c, s)) <= MAX_REF_NUMEL:
                    extras.append((j, s))
        except Exception:  # noqa: BLE001
            pass

        def special(s):
            for t in _tensors(c, s):
                if t.is_floating_point() and t.numel():
                    with torch.no_grad():
                        v = t.detach().abs()
                        if not bool(torch.isfinite(v).all()) or float(v.max()) > 1e6:
                            return True
            return False
        sp = [e for e in extras if special(e[1])][:n_refs // 2]
        rest = [e for e in extras if not any(e is x for x in sp)]
        k = n_refs - len(sp)
        if k >= len(rest):
            pick = rest
        elif k == 1:
            pick = [rest[len(rest) // 2]]
        else:
            pick = [rest[round(i * (len(rest) - 1) / (k - 1))] for i in range(k)] if k > 0 else []
        chosen = sorted(sp + pick, key=lambda e: e[0])
        samples += [(f"r{j}", s, ("r", j)) for j, s in chosen]
    return samples


def cpu_pinned(c, info, dtype, grad, samples):
    """Which tensors of each sample the OpInfo puts on the CPU whatever the device (torch.tensor(...)
    without a device: tensor_split's indices, CPU scalar tensors): found by making the same samples for the
    'meta' device. {key: set of leaf positions}; a sample whose meta twin cannot be made pins nothing."""
    import itertools
    torch = c.torch
    want = {pos: key for key, _, pos in samples}
    out = {}

    def scan(stream, gen, limit):
        try:
            for i, m in enumerate(itertools.islice(gen, limit)):
                key = want.get((stream, i))
                if key is None:
                    continue
                leaves = c.tree_flatten((m.input, m.args, m.kwargs))[0]
                out[key] = (len(leaves), {k for k, t in enumerate(leaves)
                                          if isinstance(t, torch.Tensor) and t.device.type == "cpu"})
        except Exception:  # noqa: BLE001
            pass
    n_s = max([p[1] + 1 for p in want if p[0] == "s"], default=0)
    n_r = max([p[1] + 1 for p in want if p[0] == "r"], default=0)
    if n_s:
        torch.manual_seed(0)
        scan("s", info.sample_inputs("meta", dtype, requires_grad=grad), n_s)
    if n_r:
        torch.manual_seed(1)
        scan("r", info.reference_inputs("meta", dtype, requires_grad=grad), n_r)
    res = {}
    for key, s, _ in samples:
        if key in out:
            n, pins = out[key]
            if pins and n == len(c.tree_flatten((s.input, s.args, s.kwargs))[0]):
                res[key] = pins
    return res


def run_dtype(c, info, dtname, opts, emit):
    """Forward then backward for one (op, dtype); emits one 'part' line per direction."""
    torch, tt = c.torch, c.tt
    dtype = getattr(torch, dtname)
    random = is_random(info)
    fwd, bwd = new_dir_rec(), new_dir_rec()
    if dtype not in info.supported_dtypes("cpu"):
        for d in DIRS:
            emit(d, finish_dir(new_dir_rec(), "CPU does not support the dtype"))
        return
    bwd_reason = None
    if not info.supports_autograd:
        bwd_reason = "OpInfo does not support autograd"
    elif not (dtype.is_floating_point or dtype.is_complex):
        bwd_reason = "dtype not differentiable"
    elif dtype not in info.supported_backward_dtypes("cpu"):
        bwd_reason = "CPU backward does not support the dtype"
    grad = bwd_reason is None and "backward" in opts.dirs
    if "backward" not in opts.dirs:
        bwd_reason = "backward not requested"
    rtol, atol = TOL.get((dtname, "forward"), DEFAULT_TOL)
    brtol, batol = TOL.get((dtname, "backward"), DEFAULT_TOL)
    try:
        samples = gen_samples(c, info, dtype, grad, opts.samples, opts.refs)
    except Exception as e:  # noqa: BLE001
        for d in DIRS:
            emit(d, finish_dir(new_dir_rec(), f"sample generation failed: {_err(e)}"))
        return
    if not samples:
        for d in DIRS:
            emit(d, finish_dir(new_dir_rec(), "no samples"))
        return
    kept = []   # (key, sample, cpu_out, cpu sample, tpu sample, tpu_out, tie) for backward
    emit_stage = lambda s: emit(None, None, stage=s)  # noqa: E731
    pins = cpu_pinned(c, info, dtype, grad, samples)
    for key, s, _ in samples:
        emit_stage(f"forward {key}")
        try:
            c_in, c_args, c_kw = to_device(c, (s.input, s.args, s.kwargs), {}, "cpu")
        except Exception:  # noqa: BLE001
            fwd["counts"]["skip"] += 1
            continue
        memo = {}
        try:
            t_in, t_args, t_kw = to_device(c, (c_in, c_args, c_kw), memo, DEV, pins.get(key, ()))
            tt.synchronize()
        except Exception as e:  # noqa: BLE001
            fwd["counts"]["raise"] += 1
            _note_err(fwd, "to tpu: " + _err(e), key)
            continue
        if not memo.get("on_tpu"):
            fwd["counts"]["skip"] += 1        # no tensor and no device argument: it would run on the CPU
            fwd["no_tpu_input"] = fwd.get("no_tpu_input", 0) + 1
            continue
        try:
            torch.manual_seed(2)
            cpu_out = call(info, c_in, c_args, c_kw)
        except Exception:  # noqa: BLE001
            fwd["counts"]["skip"] += 1      # the CPU rejects this sample
            continue
        tt.reset_fallback_counts()
        try:
            torch.manual_seed(2)
            tpu_out = call(info, t_in, t_args, t_kw)
            tt.synchronize()
        except Exception as e:  # noqa: BLE001
            raised(fwd, e, key, tt)
            if grad:
                bwd["counts"]["raise"] += 1
                _note_err(bwd, "forward raised: " + _err(e), key)
            continue
        fb = tt.fallback_counts()
        fwd["fallbacks"].update(fb)
        ok, det = compare_out(c, cpu_out, tpu_out, rtol, atol, random)
        if not ok and s.output_process_fn_grad is not None:
            try:      # e.g. eigenvectors / singular vectors: equal up to a sign or phase
                ok2, _ = compare_out(c, s.output_process_fn_grad(cpu_out), s.output_process_fn_grad(tpu_out),
                                     rtol, atol, random)
                if ok2:
                    ok, det = True, dict(det, note="matched after output_process_fn_grad")
            except Exception:  # noqa: BLE001
                pass
        tie = False
        if not ok and tie_only(c, c_in, cpu_out, tpu_out, rtol, atol):
            ok, tie = True, True
            fwd["ties"] += 1
        def f64_fwd(leaf):
            with torch.no_grad():
                r = call(info, *_split(to_f64(c, (c_in, c_args, c_kw))))
            return f64_check(c, _leaf(c, cpu_out, leaf), _leaf(c, tpu_out, leaf), _leaf(c, r, leaf), rtol, atol)
        tally(fwd, ok, det, fb, key, c, s, info, c_in, f64_fwd)
        if grad:
            kept.append((key, s, cpu_out, (c_in, c_args, c_kw), (t_in, t_args, t_kw), tpu_out, tie))
    emit("forward", finish_dir(fwd))
    # ---- backward
    if bwd_reason:
        emit("backward", finish_dir(new_dir_rec(), bwd_reason))
        return
    for key, s, cpu_out, (c_in, c_args, c_kw), (t_in, t_args, t_kw), tpu_out, tie in kept:
        emit_stage(f"backward {key}")
        try:
            co = s.output_process_fn_grad(cpu_out) if s.output_process_fn_grad else cpu_out
            couts, cpos, cins = grad_parts(c, co, c_in, c_args, c_kw)
            if not couts or not cins:
                bwd["counts"]["skip"] += 1
                continue
            g = torch.Generator().manual_seed(3)
            gys = [torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype) for t in couts]
            cg = torch.autograd.grad(couts, cins, gys, allow_unused=True)
        except Exception:  # noqa: BLE001
            bwd["counts"]["skip"] += 1
            continue
        tt.reset_fallback_counts()
        try:
            to = s.output_process_fn_grad(tpu_out) if s.output_process_fn_grad else tpu_out
            touts, tpos, tins = grad_parts(c, to, t_in, t_args, t_kw)
            if tpos != cpos or len(tins) != len(cins):
                raise RuntimeError(f"differentiable outputs/inputs differ: outputs {cpos} vs {tpos}, "
                                   f"inputs {len(cins)} vs {len(tins)}")
            tg = torch.autograd.grad(touts, tins, [x.to(DEV) for x in gys], allow_unused=True)
            tt.synchronize()
        except Exception as e:  # noqa: BLE001
            raised(bwd, e, key, tt)
            continue
        fb = tt.fallback_counts()
        bwd["fallbacks"].update(fb)
        # an unused input's gradient may be None on one side and zeros on the other
        cg = [x if x is not None else (torch.zeros_like(i) if y is not None else None) for x, y, i in zip(cg, tg, cins)]
        tg = [y if y is not None else (torch.zeros_like(i) if x is not None else None) for x, y, i in zip(cg, tg, tins)]
        # after a tie picked other indices, the gradient lands elsewhere: compare shapes only
        ok, det = compare_out(c, list(cg), list(tg), brtol, batol, random or tie)
        if tie:
            bwd["ties"] += 1
        def f64_bwd(leaf):
            fs = to_f64(c, (c_in, c_args, c_kw))
            r = call(info, *_split(fs))
            r = s.output_process_fn_grad(r) if s.output_process_fn_grad else r
            routs, _, rins = grad_parts(c, r, *_split(fs))
            rg = torch.autograd.grad(routs, rins, [x.double() for x in gys], allow_unused=True)
            return f64_check(c, cg[leaf], tg[leaf], rg[leaf], brtol, batol)
        tally(bwd, ok, det, fb, key, c, s, info, c_in, f64_bwd)
    emit("backward", finish_dir(bwd))


def raised(rec, e, key, tt):
    """Count a sample whose tpu run raised; a pending device error is drained so the next sample starts clean."""
    rec["fallbacks"].update(tt.fallback_counts())
    rec["counts"]["raise"] += 1
    _note_err(rec, _err(e), key)
    try:
        tt.synchronize()
    except Exception:  # noqa: BLE001
        pass


def tally(rec, ok, det, fb, key, c, s, info, c_in, f64):
    """Count one compared sample of a direction; a mismatch (the first 3 kept) records its details and,
    where f64(leaf) can say, both devices' distance to a float64 CPU run."""
    if det.get("stride"):
        rec["strides"] += 1
    rec["worst_ratio"] = max(rec["worst_ratio"], det.get("max_ratio", 0.0) if ok else 0.0)
    rec["worst_abs"] = max(rec["worst_abs"], det.get("max_abs", 0.0) if ok else 0.0)
    if ok:
        rec["counts"]["fallback" if fb else "native"] += 1
        return
    rec["counts"]["mismatch"] += 1
    if len(rec["mismatches"]) >= 3:
        return
    m = dict(det, sample=key, desc=sample_desc(c, s))
    if has_ties(c, info, c_in):
        m["ties_in_input"] = True
    if "leaf" in m and "max_abs" in m:
        try:
            m.update(f64(m["leaf"]) or {})
        except Exception:  # noqa: BLE001
            pass
    rec["mismatches"].append(m)


def _split(t):
    return t[0], t[1], t[2]


def sample_desc(c, s):
    torch = c.torch

    def d(x):
        if isinstance(x, torch.Tensor):
            nc = "" if x.is_contiguous() else ",nc"
            return f"T{list(x.shape)}{nc}"
        if isinstance(x, (list, tuple)):
            return "[" + ",".join(d(v) for v in x) + "]"
        return repr(x)[:30]
    out = d(s.input)
    if s.args:
        out += " args=" + ",".join(d(a) for a in s.args)
    if s.kwargs:
        out += " kw=" + ",".join(f"{k}={d(v)}" for k, v in s.kwargs.items())
    return out[:200]


def run_errors(c, info, emit):
    """Each error input on the CPU and on tpu (made by error_inputs("tpu"); if that fails, e.g. on a complex
    tensor, made on the CPU and copied, an input that cannot be copied counted as tpu_input_unsupported)."""
    torch, tt = c.torch, c.tt
    rec = {"n": 0, "same": 0, "different": 0, "tpu_no_raise": 0, "tpu_only": 0, "neither": 0, "details": []}
    if info.error_inputs_func is None:
        emit("errors", {"n": 0})
        return
    try:
        torch.manual_seed(0)
        cpu_eis = list(info.error_inputs("cpu"))
    except Exception as e:  # noqa: BLE001
        emit("errors", {"skip_reason": f"CPU error_inputs failed: {_err(e)}", "n": 0})
        return
    if not cpu_eis:
        emit("errors", {"n": 0})
        return
    try:
        torch.manual_seed(0)
        tpu_eis = [e.sample_input for e in info.error_inputs(DEV)]
        if len(tpu_eis) != len(cpu_eis):
            raise RuntimeError(f"{len(tpu_eis)} error inputs on tpu, {len(cpu_eis)} on the CPU")
    except Exception as e:  # noqa: BLE001
        rec["made_on_cpu"] = _err(e)
        tpu_eis = []
        for ce in cpu_eis:
            try:
                cs = ce.sample_input
                ti, ta, tk = to_device(c, (cs.input, cs.args, cs.kwargs), {})
                tpu_eis.append(types.SimpleNamespace(input=ti, args=ta, kwargs=tk))
            except Exception as e2:  # noqa: BLE001
                tpu_eis.append(_err(e2))
    for k, (ce, ts) in enumerate(zip(cpu_eis, tpu_eis)):
        emit(None, None, stage=f"error_input {k}")
        rec["n"] += 1
        cs = ce.sample_input
        try:
            call(info, cs.input, cs.args, cs.kwargs)
            cexc = None
        except Exception as e:  # noqa: BLE001
            cexc = e
        if isinstance(ts, str):
            rec["tpu_input_unsupported"] = rec.get("tpu_input_unsupported", 0) + 1
            continue
        try:
            call(info, ts.input, ts.args, ts.kwargs)
            tt.synchronize()
            texc = None
        except Exception as e:  # noqa: BLE001
            texc = e
            try:
                tt.synchronize()
            except Exception:  # noqa: BLE001
                pass
        if cexc is None and texc is None:
            rec["neither"] += 1
            continue
        if cexc is None:
            rec["tpu_only"] += 1
            kind = "tpu_only"
        elif texc is None:
            rec["tpu_no_raise"] += 1
            kind = "tpu_no_raise"
        elif type(cexc) is type(texc):
            rec["same"] += 1
            continue
        else:
            rec["different"] += 1
            kind = "different"
        if len(rec["details"]) < 4:
            rec["details"].append({"k": k, "kind": kind, "cpu": _err(cexc) if cexc else None,
                                   "tpu": _err(texc) if texc else None, "expected": ce.error_type.__name__,
                                   "desc": sample_desc(c, cs)})
    if not rec["details"]:
        del rec["details"]
    emit("errors", rec)


def worker(task_path, out_path):
    with open(task_path) as f:
        task = json.load(f)
    out = open(out_path, "a", buffering=1)

    def line(d):
        out.write(json.dumps(d, default=str) + "\n")
        out.flush()

    class O:
        pass
    opts = O()
    opts.samples, opts.refs, opts.dirs = task["samples"], task["refs"], task["dirs"]
    c = _setup_worker(task.get("mode"))
    line({"t": "ready"})
    for idx, kind in task["units"]:
        info = c.op_db[idx]
        line({"t": "start", "idx": idx, "kind": kind, "time": time.time()})
        t0 = time.time()

        def emit(direction, rec, stage=None, idx=idx, kind=kind):
            if stage is not None:
                line({"t": "stage", "idx": idx, "kind": kind, "stage": stage})
            else:
                line({"t": "part", "idx": idx, "kind": kind, "dir": direction, "rec": rec})
        try:
            if kind == "errors":
                run_errors(c, info, emit)
            else:
                run_dtype(c, info, kind, opts, emit)
        except Exception as e:  # noqa: BLE001  (a bug of the sweep, not of the tpu)
            line({"t": "unit_error", "idx": idx, "kind": kind, "error": _err(e)})
        line({"t": "done", "idx": idx, "kind": kind, "secs": round(time.time() - t0, 2)})
    out.close()


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------

class Slot:
    """One worker subprocess working through a list of units; restarted after a crash or timeout."""

    def __init__(self, units, a, on_unit):
        self.units = list(units)      # remaining
        self.a = a
        self.on_unit = on_unit
        self.p = None
        self.restarts = 0
        self._start()

    def _start(self):
        fd, self.task_path = tempfile.mkstemp(prefix="confops_task_", suffix=".json", dir="/tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"units": self.units, "samples": self.a.samples, "refs": self.a.refs, "dirs": self.a.dirs,
                       "mode": self.a.mode}, f)
        fd, self.out_path = tempfile.mkstemp(prefix="confops_out_", suffix=".jsonl", dir="/tmp")
        os.close(fd)
        fd, self.err_path = tempfile.mkstemp(prefix="confops_err_", suffix=".txt", dir="/tmp")
        self.errf = os.fdopen(fd, "w")
        env = dict(os.environ)
        for k in ("TORCH_TPU_DEFER_AND_FUSE", "TORCH_TPU_LAUNCH_BLOCKING", "TORCH_TPU_FUSED_DUMP",
                  "TORCH_TPU_CPU_FALLBACK"):
            env.pop(k, None)
        env.update(PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
        self.p = subprocess.Popen([sys.executable, HERE, "--worker", self.task_path, self.out_path], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.errf,
                                  start_new_session=True)
        self.pos = 0
        self.buf = ""
        self.cur = None            # (idx, kind, start time, stage)
        self.parts = {}
        self.ready_at = None
        self.started = time.time()

    def _cleanup(self):
        self.errf.close()
        for p in (self.task_path, self.out_path, self.err_path):
            try:
                os.unlink(p)
            except OSError:
                pass

    def _read(self):
        with open(self.out_path) as f:
            f.seek(self.pos)
            data = f.read()
            self.pos = f.tell()
        self.buf += data
        *lines, self.buf = self.buf.split("\n")
        for ln in lines:
            if not ln.strip():
                continue
            d = json.loads(ln)
            t = d["t"]
            if t == "ready":
                self.ready_at = time.time()
            elif t == "start":
                self.cur = [d["idx"], d["kind"], time.time(), "start"]
                self.parts = {}
            elif t == "stage":
                if self.cur:
                    self.cur[3] = d["stage"]
            elif t == "part":
                self.parts[d["dir"]] = d["rec"]
            elif t == "unit_error":
                self.parts["unit_error"] = d["error"]
            elif t == "done":
                self.on_unit(d["idx"], d["kind"], self.parts, d["secs"], None)
                self.units.pop(0)
                self.cur = None
                self.parts = {}

    def _stderr_tail(self):
        try:
            with open(self.err_path, errors="replace") as f:
                lines = [ln.rstrip() for ln in f if ln.strip() and "Warning" not in ln and "warnings.warn" not in ln]
            return lines[-3:]
        except OSError:
            return []

    def poll(self):
        """True while working."""
        self._read()
        rc = self.p.poll()
        if rc is not None:
            self._read()
            if not self.units:
                self._cleanup()
                return False
            # died in the middle of a unit (or before the first)
            tail = self._stderr_tail()
            sig = f"signal {-rc}" if rc < 0 else f"exit {rc}"
            idx, kind = self.units[0]
            stage = self.cur[3] if self.cur else "import"
            self.on_unit(idx, kind, self.parts, round(time.time() - (self.cur[2] if self.cur else self.started), 1),
                         {"cat": "crash", "error": f"Crash: {sig} at {stage}: " + (tail[-1][:240] if tail else ""),
                          "stderr_tail": tail})
            self.units.pop(0)
            return self._restart()
        limit = self.a.timeout if self.cur else self.a.timeout + 120     # the import of op_db takes a while
        since = self.cur[2] if self.cur else self.started
        if time.time() - since > limit:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
            self._read()
            if not self.units:
                self._cleanup()
                return False
            idx, kind = self.units[0]
            stage = self.cur[3] if self.cur else "import"
            self.on_unit(idx, kind, self.parts, round(time.time() - since, 1),
                         {"cat": "timeout", "error": f"Timeout: no result after {limit:.0f}s at {stage}"})
            self.units.pop(0)
            return self._restart()
        return True

    def _restart(self):
        self._cleanup()
        self.restarts += 1
        if not self.units:
            return False
        self._start()
        return True

    def kill(self):
        if self.p and self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        self._cleanup()


def summarize(recs, dtypes, out=sys.stdout, top_ops=30, top_errs=15):
    p = lambda *a: print(*a, file=out)  # noqa: E731
    p(f"\n== {len(recs)} OpInfos: category per (op, dtype, direction); % of the applicable (not skip) ==")
    hdr = f"  {'':18s}" + "".join(f"{c:>14s}" for c in CATS) + f"{'applicable':>12s}"
    p(hdr)
    for dt in dtypes:
        for d in DIRS:
            cnt = collections.Counter(r["dtypes"].get(dt, {}).get(d, {}).get("cat", "skip") for r in recs)
            app = sum(v for k, v in cnt.items() if k != "skip")
            cells = []
            for cat in CATS:
                n = cnt.get(cat, 0)
                cells.append(f"{n:5d}" + (f" ({100 * n / app:4.1f}%)" if app and cat != "skip" else " " * 8))
            p(f"  {dt + ' ' + d:18s}" + "".join(f"{x:>14s}" for x in cells) + f"{app:12d}")
    # ops native in every applicable (dtype, direction)
    full = sum(1 for r in recs if all(r["dtypes"].get(dt, {}).get(d, {}).get("cat", "skip") in ("native", "skip")
                                      for dt in dtypes for d in DIRS)
               and any(r["dtypes"].get(dt, {}).get(d, {}).get("cat") == "native" for dt in dtypes for d in DIRS))
    p(f"  OpInfos native in every applicable dtype/direction: {full}")

    # fallback ops: how many OpInfos each blocks
    blocks, sole, calls = collections.Counter(), collections.Counter(), collections.Counter()
    for r in recs:
        ops_here, sole_here = set(), set()
        for dt in dtypes:
            for d in DIRS:
                x = r["dtypes"].get(dt, {}).get(d, {})
                if x.get("cat") in ("fallback", "mismatch", "raise"):
                    fb = x.get("fallbacks") or {}
                    ops_here |= set(fb)
                    for op, n in fb.items():
                        calls[op] += n
                    if x.get("cat") == "fallback" and len(fb) == 1:
                        sole_here |= set(fb)
        blocks.update(ops_here)
        sole.update(sole_here)
    p(f"\n== top CPU-fallback aten ops ({len(blocks)} distinct): #OpInfos using it (any dtype/direction), "
      f"#OpInfos where it is the only fallback of a 'fallback' combination, calls ==")
    for op, n in blocks.most_common(top_ops):
        p(f"  {n:4d} opinfos  {sole.get(op, 0):4d} sole  {calls[op]:6d} calls  {op}")

    errs, ex = collections.Counter(), {}
    n_fwd_raised = 0
    for r in recs:
        for dt in dtypes:
            for d in DIRS:
                x = r["dtypes"].get(dt, {}).get(d, {})
                if x.get("cat") in ("raise", "crash", "timeout"):
                    e = (x.get("errors") or [{}])[0].get("error") or x.get("error") or "?"
                    if e.startswith("forward raised"):
                        n_fwd_raised += 1
                        continue
                    k = f"[{x['cat']}] " + _norm(e)
                    errs[k] += 1
                    ex.setdefault(k, [])
                    if r["id"] not in ex[k]:
                        ex[k].append(r["id"])
    p(f"\n== top tpu errors (raise / crash / timeout; per op, dtype, direction; not counted: {n_fwd_raised} "
      f"backward raises whose forward raised) ==")
    for k, n in errs.most_common(top_errs):
        p(f"  {n:4d}  {k}   e.g. {', '.join(ex[k][:4])}")
    strides = [(r["id"], dt, d, r["dtypes"][dt][d]["stride_differs"]) for r in recs for dt in dtypes for d in DIRS
               if r["dtypes"].get(dt, {}).get(d, {}).get("stride_differs")]
    if strides:
        p(f"\n== results that match but are laid out differently from the CPU's (strides; {len(strides)}) ==")
        p("  " + ", ".join(f"{i} {dt} {d[:3]} ({n})" for i, dt, d, n in strides))

    crashes = [(r["id"], dt, d, r["dtypes"][dt][d].get("error", ""))
               for r in recs for dt in dtypes for d in DIRS
               if r["dtypes"].get(dt, {}).get(d, {}).get("cat") in ("crash", "timeout")]
    if crashes:
        p(f"\n== crashes / timeouts ==")
        for i, dt, d, e in crashes:
            p(f"  {i:40s} {dt:9s} {d:9s} {e[:160]}")

    mism = [(r, dt, d, r["dtypes"][dt][d]) for r in recs for dt in dtypes for d in DIRS
            if r["dtypes"].get(dt, {}).get(d, {}).get("cat") == "mismatch"]
    order = {"wrong?": 0, "undefined": 1, "both off": 2, "ties": 3, "rounding": 4}
    mism.sort(key=lambda t: (order[verdict_class(t[0], t[3])], t[0]["id"], t[1], t[2]))
    vc = collections.Counter(verdict_class(r, x) for r, _, _, x in mism)
    p(f"\n== mismatches ({len(mism)}): potential wrong answers. Where they differ, both are compared with a "
      f"float64 CPU run of the same inputs.\n   ! wrong? {vc['wrong?']} | u: undefined per OpInfo {vc['undefined']} "
      f"| b: both off (the CPU as far from float64 as the tpu) {vc['both off']} | t: ties in a sort/max-like op "
      f"{vc['ties']} | ~: rounding (the tpu at most 2x as far from float64 as the CPU) {vc['rounding']} ==")
    mark = {"wrong?": "!", "undefined": "u", "both off": "b", "ties": "t", "rounding": "~"}
    for r, dt, d, x in mism:
        m = x["mismatches"][0] if x.get("mismatches") else {}
        cnt = x.get("counts", {})
        n_s = sum(cnt.get(k, 0) for k in ("native", "fallback", "mismatch"))
        err = ""
        if "max_abs" in m:
            err = f"max_abs {m['max_abs']:.3g} (x{m.get('max_ratio', 0):.3g} tol)"
        if "tpu_err_f64" in m:
            err += f" f64: cpu {m['cpu_err_f64']:.2g} tpu {m['tpu_err_f64']:.2g}"
        note = " [OpInfo: " + "; ".join(r["compare_cpu_notes"]) + "]" if r.get("compare_cpu_notes") else ""
        fb = " fb" if x.get("fallbacks") else ""
        p(f"{mark[verdict_class(r, x)]} {r['id']:36s} {dt:9s} {d:9s} {cnt.get('mismatch', 0)}/{n_s}{fb} "
          f"{m.get('reason', '?')}: {err} @{m.get('sample')} {m.get('desc', '')[:70]}{note}")

    ei = collections.Counter()
    n_ops = 0
    for r in recs:
        e = r.get("error_inputs") or {}
        if e.get("n"):
            n_ops += 1
        for k in ("n", "same", "different", "tpu_no_raise", "tpu_only", "neither", "tpu_input_unsupported"):
            ei[k] += e.get(k, 0) or 0
        if e.get("cat") in ("crash", "timeout"):
            ei[e["cat"]] += 1
    raised = ei["same"] + ei["different"] + ei["tpu_no_raise"]
    p(f"\n== error_inputs: {ei['n']} inputs of {n_ops} OpInfos ==")
    if raised:
        p(f"  CPU raised {raised}: tpu same type {ei['same']} ({100 * ei['same'] / raised:.1f}%), other type "
          f"{ei['different']}, tpu did not raise {ei['tpu_no_raise']}; tpu-only raise {ei['tpu_only']}, "
          f"neither {ei['neither']}, input not copyable to tpu {ei['tpu_input_unsupported']}, crash {ei['crash']}, "
          f"timeout {ei['timeout']}")
    bad = [(r["id"], dd) for r in recs for dd in ((r.get("error_inputs") or {}).get("details") or [])]
    if bad:
        p("  first differences:")
        for i, dd in bad[:25]:
            p(f"    {i:34s} {dd['kind']:13s} cpu {str(dd['cpu'])[:70]} | tpu {str(dd['tpu'])[:70]}")


def select(op_db, a):
    items = [(i, info) for i, info in enumerate(op_db)]
    if a.only:
        want = [x.strip() for x in a.only.split(",") if x.strip()]
        sel = [(i, info) for i, info in items if info.name in want or op_id(info) in want]
        found = {info.name for _, info in sel} | {op_id(info) for _, info in sel}
        unknown = [x for x in want if x not in found]
        if unknown:
            sys.exit(f"unknown OpInfo names: {unknown}")
        items = sel
    items = items[a.skip:]
    if a.limit:
        items = items[:a.limit]
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated OpInfo names (name or name.variant)")
    ap.add_argument("--limit", type=int, help="first N OpInfos (op_db order, after --skip)")
    ap.add_argument("--skip", type=int, default=0, help="skip the first N OpInfos")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--dirs", default="forward,backward", help="forward,backward")
    ap.add_argument("--no-errors", action="store_true", help="do not run error_inputs")
    ap.add_argument("--samples", type=int, default=8, help="sample inputs per op and dtype")
    ap.add_argument("--refs", type=int, default=6, help="extra reference inputs per op and dtype")
    ap.add_argument("--json", help="write all records here (rewritten as results come in)")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per (op, dtype) / error_inputs unit")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes at a time")
    ap.add_argument("--chunk", type=int, default=40, help="OpInfos per worker process")
    ap.add_argument("--mode", choices=["strict", "debug", "fused"], help="eager mode on the tpu (default: strict)")
    ap.add_argument("--summary-from", help="only print the summary of an existing --json file")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    a.dirs = [d for d in a.dirs.split(",") if d]
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    if a.summary_from:
        with open(a.summary_from) as f:
            data = json.load(f)
        summarize(data["results"], data.get("dtypes", dtypes))
        return
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    for dt in dtypes:
        if not isinstance(getattr(torch, dt, None), torch.dtype):
            sys.exit(f"unknown dtype {dt}")
    from torch.testing._internal.common_methods_invocations import op_db
    items = select(op_db, a)
    recs = {}
    for i, info in items:
        recs[i] = {"id": op_id(info), "name": info.name, "variant": info.variant_test_name, "idx": i,
                   "random": is_random(info), "dtypes": {dt: {} for dt in dtypes}}
        notes = compare_cpu_notes(info)
        if notes:
            recs[i]["compare_cpu_notes"] = notes
    units_per_op = {i: ([] if a.no_errors else [(i, "errors")]) + [(i, dt) for dt in dtypes] for i, _ in items}
    pending_units = {i: len(u) for i, u in units_per_op.items()}
    t0 = time.time()
    done_ops = []

    def write_json():
        if not a.json:
            return
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"torch": torch.__version__, "dtypes": dtypes, "dirs": a.dirs, "samples": a.samples,
                       "refs": a.refs, "tol": {f"{k[0]}/{k[1]}": v for k, v in TOL.items()},
                       "mode": a.mode or "strict", "timeout": a.timeout, "elapsed": round(time.time() - t0, 1),
                       "complete": len(done_ops) == len(items),
                       "results": [recs[i] for i, _ in items if pending_units[i] == 0]}, f, indent=1, default=str)
        os.replace(tmp, a.json)

    def on_unit(idx, kind, parts, secs, failure):
        r = recs[idx]
        r.setdefault("secs", 0.0)
        r["secs"] = round(r["secs"] + (secs or 0), 2)
        if "unit_error" in parts:
            r.setdefault("sweep_errors", []).append(f"{kind}: {parts['unit_error']}")
        if kind == "errors":
            r["error_inputs"] = parts.get("errors") or (dict(failure) if failure else {"n": 0})
        else:
            for d in DIRS:
                if d in parts:
                    r["dtypes"][kind][d] = parts[d]
                elif failure:
                    r["dtypes"][kind][d] = dict(failure)
                else:
                    r["dtypes"][kind][d] = {"cat": "skip", "skip_reason": parts.get("unit_error", "not run")}
        pending_units[idx] -= 1
        if pending_units[idx] == 0:
            done_ops.append(idx)
            report(r)
            if len(done_ops) % 10 == 0 or len(done_ops) == len(items):
                write_json()

    short = {"native": "N", "fallback": "F", "mismatch": "MISMATCH", "raise": "R", "crash": "CRASH",
             "timeout": "TIMEOUT", "skip": "-"}
    dabbr = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64"}

    def report(r):
        cells = []
        fbs = set()
        extra = []
        for dt in dtypes:
            x = r["dtypes"][dt]
            cells.append(f"{dabbr.get(dt, dt)} " + "/".join(short.get(x.get(d, {}).get("cat"), "?") for d in DIRS))
            for d in DIRS:
                y = x.get(d, {})
                fbs |= set(y.get("fallbacks") or {})
                if y.get("cat") in ("raise", "crash", "timeout") and (a.verbose or not extra):
                    e = (y.get("errors") or [{}])[0].get("error") or y.get("error", "")
                    extra.append(f"{dt[:4]}/{d[:3]}: {e[:120]}")
                if y.get("cat") == "mismatch":
                    m = (y.get("mismatches") or [{}])[0]
                    extra.append(f"{dt[:4]}/{d[:3]} MISMATCH {m.get('reason')} max_abs={m.get('max_abs', '-')}")
        e = r.get("error_inputs") or {}
        ecell = ""
        if e.get("n"):
            ecell = f"err {e.get('same', 0)}/{e.get('same', 0) + e.get('different', 0) + e.get('tpu_no_raise', 0)}"
        elif e.get("cat"):
            ecell = f"err {e['cat']}"
        line = (f"[{len(done_ops):3d}/{len(items)}] {r['id'][:36]:36s} {'  '.join(cells):34s} {ecell:10s} "
                f"{r.get('secs', 0):5.1f}s")
        if fbs:
            line += "  fb: " + ",".join(sorted(x.replace("aten::", "") for x in fbs))[:100]
        print(line, flush=True)
        for x in (extra if a.verbose else extra[:1]):
            print(f"        {x}", flush=True)

    order = [i for i, _ in items]
    chunks = [order[k:k + a.chunk] for k in range(0, len(order), a.chunk)]
    print(f"{len(items)} of {len(op_db)} OpInfos, dtypes {','.join(dtypes)}, {a.samples} samples + {a.refs} "
          f"reference inputs, timeout {a.timeout:.0f}s per unit, {a.jobs} worker(s), chunks of {a.chunk}", flush=True)
    slots = []
    restarts = 0
    try:
        while chunks or slots:
            while chunks and len(slots) < a.jobs:
                ch = chunks.pop(0)
                slots.append(Slot([u for i in ch for u in units_per_op[i]], a, on_unit))
            alive = []
            for s in slots:
                if s.poll():
                    alive.append(s)
                else:
                    restarts += s.restarts
            slots = alive
            time.sleep(0.2)
    except KeyboardInterrupt:
        for s in slots:
            s.kill()
        print("interrupted", flush=True)
    write_json()
    summarize([recs[i] for i, _ in items if pending_units[i] == 0], dtypes)
    print(f"\nelapsed {time.time() - t0:.0f}s, worker restarts (after crash/timeout) {restarts}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main()
