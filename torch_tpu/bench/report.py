"""Derived figures (rates, fractions of the limit, ratios), Markdown, chart, README."""

import math
import re
from pathlib import Path

from .configs import BASELINE, CONFIGS, TPU_BASELINE
from .workloads import WORKLOADS

README_START = "<!-- bench:start -->"
README_END = "<!-- bench:end -->"
# a figure is flagged (†) when other processes used more than this many cores, on
# average, while its worker ran: the machine was not quiet, the figure is noisy
BUSY_LOAD = 0.25


# --------------------------------------------------------------------------
# derived values

def enrich(results, limits):
    """Add rates, primary figure, fraction of the physical limit, and ratios."""
    by_key = {(r["config"], r["workload"], r["figure"]): r for r in results}
    for r in results:
        if r.get("status") != "ok":
            continue
        med, w = r["median_s"], r.get("work", {})
        rates = {}
        if w.get("flops"):
            rates["gflops"] = w["flops"] / med / 1e9
        if w.get("bytes"):
            rates["gbs"] = w["bytes"] / med / 1e9
        if w.get("items"):
            rates["items_per_s"] = w["items"] / med
        if w.get("ops"):
            rates["us_per_op"] = med / w["ops"] * 1e6
        r["rates"] = rates
        prim = r.get("primary")
        if prim == "flops":
            r["primary_value"] = {"value": rates["gflops"], "unit": "GFLOP/s", "higher_is_better": True}
        elif prim == "bytes":
            r["primary_value"] = {"value": rates["gbs"], "unit": "GB/s", "higher_is_better": True}
        elif prim == "items":
            r["primary_value"] = {"value": rates["items_per_s"], "unit": f"{w.get('item_unit', 'items')}/s",
                                  "higher_is_better": True}
        elif prim == "ops":
            r["primary_value"] = {"value": rates["us_per_op"], "unit": "µs/op", "higher_is_better": False}
        lim = r.get("limit")
        if limits and lim in ("fp32", "bf16") and "gflops" in rates and limits.get(f"{lim}_gflops"):
            peak = limits[f"{lim}_gflops"]
            isa = limits.get(f"{lim}_isa")
            r["limit_fraction"] = {"kind": f"{lim} {isa} peak", "limit": peak, "unit": "GFLOP/s",
                                   "fraction": rates["gflops"] / peak}
        elif limits and lim == "dram" and "gbs" in rates and limits.get("dram_gbs"):
            peak = limits["dram_gbs"]
            r["limit_fraction"] = {"kind": "DRAM read bandwidth", "limit": peak, "unit": "GB/s",
                                   "fraction": rates["gbs"] / peak}
        mem = r.get("memory", {})
        if CONFIGS[r["config"]].device == "tpu" and mem.get("device_peak_bytes") is not None:
            r["peak_memory"] = {"bytes": mem["device_peak_bytes"], "kind": "device allocator peak"}
        elif mem.get("rss_peak_over_base_bytes") is not None:
            r["peak_memory"] = {"bytes": mem["rss_peak_over_base_bytes"], "kind": "peak RSS over process base"}
    for r in results:
        if r.get("status") != "ok":
            continue
        for base, key in ((BASELINE, "ratio_vs_cpu_eager"), (TPU_BASELINE, "ratio_vs_tpu_strict")):
            if key == "ratio_vs_tpu_strict" and CONFIGS[r["config"]].device != "tpu":
                continue
            b = by_key.get((base, r["workload"], r["figure"]))
            if b and b.get("status") == "ok" and b["median_s"] > 0:
                r[key] = r["median_s"] / b["median_s"]
    return results


# --------------------------------------------------------------------------
# formatting

def fmt_time(s):
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "–"
    a = abs(s)
    if a >= 100:
        return f"{s:.0f} s"
    if a >= 1:
        return f"{s:.2f} s"
    if a >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def fmt_num(v):
    if v is None:
        return "–"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def fmt_bytes(b):
    if b is None:
        return "–"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= div:
            return f"{b / div:.3g} {unit}"
    return f"{b} B"


def fmt_pct(f):
    if f is None:
        return "–"
    if f < 0.001:
        return "<0.1%"
    return f"{f * 100:.0f}%" if f >= 0.01 else f"{f * 100:.1f}%"


def fmt_ratio(x):
    if x is None:
        return "–"
    return f"×{x:.2f}" if x < 10 else f"×{x:.1f}" if x < 100 else f"×{x:,.0f}"


def _short_status(r):
    st = r.get("status")
    if st == "n/a":
        return "n/a"
    if st == "skipped":
        return "skipped"
    if st == "timeout":
        return "timeout"
    return "error"


def _figure_rows(run):
    """[(workload_key, figure_name)] in run order."""
    rows, seen = [], set()
    for r in run["results"]:
        k = (r["workload"], r["figure"])
        if k not in seen:
            seen.add(k)
            rows.append(k)
    return rows


def _index(run):
    return {(r["config"], r["workload"], r["figure"]): r for r in run["results"]}


def _metric_label(run, wl, fig):
    for r in run["results"]:
        if r["workload"] == wl and r["figure"] == fig and r.get("primary_value"):
            pv = r["primary_value"]
            arrow = "↑" if pv["higher_is_better"] else "↓"
            return f"{pv['unit']} {arrow}"
    return ""


def limits_line(lim):
    if not lim or lim.get("error"):
        return "Physical limits: not measured" + (f" ({lim['error']})." if lim else ".")
    raw = lim.get("raw", {})
    t = lim.get("threads")
    thr = "thread" if t == 1 else "threads"
    parts = [f"fp32 {str(raw.get('fp32_isa', '?')).upper()} FMA {fmt_num(raw.get('fp32_fma_gflops_1t'))} GFLOP/s "
             f"per core, {fmt_num(raw.get('fp32_fma_gflops_nt'))} on {t} {thr}"]
    if raw.get("bf16_avx512_gflops_1t"):
        parts.append(f"bf16 AVX512-BF16 {fmt_num(raw.get('bf16_avx512_gflops_1t'))} per core, "
                     f"{fmt_num(raw.get('bf16_avx512_gflops_nt'))} on {t} {thr}")
    else:
        parts.append("AVX512-BF16: absent")
    if raw.get("amx_usable"):
        parts.append(f"AMX bf16 {fmt_num(raw.get('bf16_amx_gflops_1t'))} per core, "
                     f"{fmt_num(raw.get('bf16_amx_gflops_nt'))} on {t} {thr}")
    else:
        parts.append("AMX: absent" + (" (CPU has it, OS refused)" if raw.get("has_amx_bf16") else ""))
    parts.append(f"DRAM read {fmt_num(raw.get('dram_read_gbs_1t'))} GB/s on 1 thread, "
                 f"{fmt_num(raw.get('dram_read_gbs_nt'))} on {t}")
    return (f"Physical limits (`benchmarks/peak.c`{', --quick: rough' if lim.get('quick') else ''}): "
            + "; ".join(parts) + f". GEMM fractions use the {t}-{thr.rstrip('s')} fp32 / {lim.get('bf16_isa')} bf16 peaks, "
            "memory-bound fractions the DRAM read bandwidth.")


def _cell(r, show_ratio=True):
    if r is None:
        return "–"
    if r.get("status") != "ok":
        return _short_status(r)
    pv = r.get("primary_value")
    s = fmt_num(pv["value"]) if pv else fmt_time(r["median_s"])
    lf = r.get("limit_fraction")
    if lf:
        s += f" ({fmt_pct(lf['fraction'])})"
    if show_ratio and r.get("ratio_vs_cpu_eager") is not None and r["config"] != BASELINE:
        s += f" {fmt_ratio(r['ratio_vs_cpu_eager'])}"
    if _busy(r):
        s += " †"
    return s


def _busy(r):
    return (r.get("foreign_load") or 0) > BUSY_LOAD


def summary_table(run):
    cfgs = run["run"]["configs"]
    idx = _index(run)
    head = "| # | Workload | Figure | Metric | " + " | ".join(cfgs) + " |"
    sep = "|---|---|---|---|" + "---|" * len(cfgs)
    lines = [head, sep]
    for wl, fig in _figure_rows(run):
        w = WORKLOADS[wl]
        cells = [_cell(idx.get((c, wl, fig))) for c in cfgs]
        lines.append(f"| {w.number} | {w.title} | {fig} | {_metric_label(run, wl, fig)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


SUMMARY_LEGEND = (
    "Each cell: the figure in the Metric column's unit (↑ higher is better, ↓ lower is better), "
    "in parentheses its fraction of this machine's physical limit (compute peak for GFLOP/s, DRAM read "
    "bandwidth for GB/s and decode), then **×r = time(config) / time(cpu-eager)**: the time ratio, lower is "
    "better (×0.50 = twice as fast as PyTorch CPU; the throughput ratio is 1/r). "
    "Medians over repeats after warm-up; `n/a` = configuration not implemented yet; min/max, first step, "
    "warm-up overhead, memory and CPU-fallback counts are in the details. "
    f"† = measured while other processes used more than {BUSY_LOAD} cores on average (noisy).")


def details_table(run):
    idx = _index(run)
    cols = ["Workload", "Figure", "Config", "Median", "Min", "Max", "n", "Figure value", "% of limit",
            "First step", "Warm-up (n)", "Warm-up overhead", "Peak memory", "× cpu-eager", "× tpu-strict",
            "CPU fallbacks", "Status"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for wl, fig in _figure_rows(run):
        for c in run["run"]["configs"]:
            r = idx.get((c, wl, fig))
            if r is None:
                continue
            if r.get("status") != "ok":
                err = (r.get("error") or "").replace("|", "\\|").replace("\n", " ")
                st = _short_status(r)
                lines.append(f"| {WORKLOADS[wl].title} | {fig} | {c} | " + " | ".join(["–"] * 13)
                             + f" | {err[:160] if err.startswith(st) else f'{st}: {err[:160]}'} |")
                continue
            pv = r.get("primary_value")
            lf = r.get("limit_fraction")
            fb = r.get("fallbacks")
            mem = r.get("peak_memory")
            lines.append("| " + " | ".join([
                WORKLOADS[wl].title, fig, c, fmt_time(r["median_s"]), fmt_time(r["min_s"]), fmt_time(r["max_s"]),
                str(r["n"]), f"{fmt_num(pv['value'])} {pv['unit']}" if pv else "–",
                fmt_pct(lf["fraction"]) if lf else "–",
                fmt_time(r.get("first_s")), f"{fmt_time(r.get('warmup_wall_s'))} ({r.get('warmup_n')})",
                fmt_time(r.get("warmup_overhead_s")),
                (fmt_bytes(mem["bytes"]) + (" dev" if mem["kind"].startswith("device") else " rss")) if mem else "–",
                fmt_ratio(r.get("ratio_vs_cpu_eager")), fmt_ratio(r.get("ratio_vs_tpu_strict")),
                str(fb["calls"]) if fb else "–", "ok" + (" (truncated)" if r.get("truncated") else "")
                + (f" † busy {r['foreign_load']:.2f} cores" if _busy(r) else ""),
            ]) + " |")
    return "\n".join(lines)


def header_line(run):
    m, ru, cm = run["machine"], run["run"], run.get("commit", {})
    sha = (cm.get("sha") or "unknown")[:10]
    return (f"{ru['started'][:16].replace('T', ' ')} · commit `{sha}` · {m['cpu_model']} "
            f"({m['usable_cpus']} cpus{', AMX' if m.get('amx') else ', no AMX'}) · "
            f"{ru['threads']} thread{'' if ru['threads'] == 1 else 's'} for every configuration · torch {run['versions'].get('torch')}"
            + (" · **--quick (tiny sizes, not a measurement)**" if ru.get("quick") else ""))


def markdown(run):
    out = [f"# torch_tpu benchmarks", "", header_line(run), "",
           f"Command: `{run['run']['command']}` · wall time {fmt_time(run['run'].get('duration_s'))}", "",
           limits_line(run.get("limits")), "", "## Configurations", "",
           "| Config | Status | What |", "|---|---|---|"]
    for c in run["run"]["configs"]:
        ci = run["configs"].get(c, {})
        st, why = ci.get("status", "?"), ci.get("reason") or ""
        out.append(f"| {c} | {why if why.startswith(st) else (st + (': ' + why if why else ''))} | "
                   f"{CONFIGS[c].description} |")
    out += ["", "## Summary", "", SUMMARY_LEGEND, "", summary_table(run), "",
            f"![speed relative to cpu-eager]({Path(run['files']['png']).name})", "",
            "## Details", "",
            "Times are per call (GEMM, elementwise), per loop of the per-op figures (µs/op in the summary), "
            "or per step (training, inference). First step: the first call, including any compilation. "
            "Warm-up overhead: wall time of the warm-up calls minus that many median calls. Peak memory: "
            "device allocator peak for tpu (`dev`), peak RSS above the worker's post-import RSS for cpu (`rss`). "
            "CPU fallbacks: op calls that torch_tpu ran on the CPU during the figure (warm-up included).",
            "", details_table(run), ""]
    pairs_bad = [p for p in run.get("pairs", []) if p.get("status") not in ("ok", "n/a")]
    if pairs_bad:
        out += ["## Errors", ""]
        for p in pairs_bad:
            out.append(f"- **{p['config']} / {p['workload']}**: {p.get('status')}: "
                       f"{(p.get('error') or '').splitlines()[0][:300] if p.get('error') else ''}"
                       + (f" (log: `{p['log']}`)" if p.get("log") else ""))
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------
# chart

CHART_GROUPS = [
    ("GEMM", ["gemm"]),
    ("Per-op overhead & elementwise", ["overhead", "elementwise"]),
    ("Training & inference", ["mlp", "gpt2-train", "gpt2-infer", "cnn"]),
]

COLORS = {"cpu-inductor": "#4c72b0", "tpu-debug": "#dd8452", "tpu-strict": "#c44e52",
          "tpu-fused": "#8172b3", "tpu-compiled": "#55a868"}


def chart(run, path):
    """Grouped bars of speed relative to cpu-eager, one panel per workload family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    idx = _index(run)
    rows = _figure_rows(run)
    avail = [c for c in run["run"]["configs"] if c != BASELINE and run["configs"].get(c, {}).get("status") == "ok"]
    na = [c for c in run["run"]["configs"] if c != BASELINE and c not in avail]
    groups = [(t, [(wl, f) for wl, f in rows if wl in wls]) for t, wls in CHART_GROUPS]
    groups = [g for g in groups if g[1]] or [("(no figures)", [])]
    most = max(len(g[1]) for g in groups)
    nb = max(1, len(avail))
    fig, axes = plt.subplots(len(groups), 1, squeeze=False,
                             figsize=(min(20, max(10, 0.28 * most * (nb + 1) + 3)), 3.4 * len(groups) + 1.2))
    bw = 0.8 / nb
    for ax, (title, figs) in zip(axes[:, 0], groups):
        ax.axhline(1.0, color="black", lw=1, ls="--", label=f"{BASELINE} = 1")
        vals = []
        for j, c in enumerate(avail):
            xs, ys = [], []
            for i, (wl, f) in enumerate(figs):
                r = idx.get((c, wl, f))
                x = i - 0.4 + bw * (j + 0.5)
                if r and r.get("ratio_vs_cpu_eager"):
                    xs.append(x)
                    ys.append(1.0 / r["ratio_vs_cpu_eager"])
                else:
                    ax.text(x, 1.0, " " + (_short_status(r) if r else "–"), rotation=90, ha="center",
                            va="bottom", fontsize=6, color=COLORS.get(c, "gray"))
            # bars start at 1 (= cpu-eager): up is faster, down is slower
            ax.bar(xs, [y - 1.0 for y in ys], bw, bottom=1.0, label=c, color=COLORS.get(c))
            if nb * len(figs) <= 40:
                for x, y in zip(xs, ys):
                    ax.text(x, y, f"{y:.2g}" if y < 100 else f"{y:,.0f}", ha="center", va="bottom" if y >= 1 else "top", fontsize=6)
            vals += ys
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(plt.FuncFormatter(lambda v, _: ""))
        if vals:
            lo, hi = min(vals + [1.0]), max(vals + [1.0])
            ax.set_ylim(lo / 2.5, hi * 2.5)
            subs = (1.0, 2.0, 5.0) if hi / lo < 300 else (1.0,)
            ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=subs))
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_ylabel("speed vs cpu-eager\n(higher is better)", fontsize=8)
        ax.set_xticks(range(len(figs)))
        ax.set_xticklabels([f"{WORKLOADS[wl].number}. {f}" for wl, f in figs], rotation=25, ha="right", fontsize=7)
        ax.set_xlim(-0.6, max(len(figs), 1) - 0.4)
        ax.grid(axis="y", which="major", alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    axes[0, 0].legend(handles, labels, loc="upper right", ncol=min(6, len(labels)), fontsize=7, framealpha=0.8)
    sub = header_line(run).replace("**", "").replace("`", "")
    if na:
        sub += "\nnot available: " + ", ".join(f"{c} ({run['configs'][c].get('status')})" for c in na)
    fig.suptitle("Speed relative to PyTorch CPU eager = time(cpu-eager) / time(config), log scale\n" + sub,
                 fontsize=9, x=0.01, y=0.995, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.3 + 0.15 * bool(na)) / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------
# README

def readme_block(run, root):
    files = run["files"]

    def rel(p):
        try:
            return Path(p).resolve().relative_to(Path(root).resolve()).as_posix()
        except ValueError:
            return str(p)

    return "\n".join([
        README_START,
        f"_Latest `make bench`: {header_line(run)}. "
        f"Details (min/max, first step, warm-up overhead, memory, CPU fallbacks): "
        f"[{rel(files['md'])}]({rel(files['md'])}), raw data: [{rel(files['json'])}]({rel(files['json'])})._",
        "",
        limits_line(run.get("limits")),
        "",
        SUMMARY_LEGEND,
        "",
        summary_table(run),
        "",
        f"![speed relative to PyTorch CPU eager]({rel(files['png'])})",
        README_END,
    ])


def update_readme(readme, run, root, log=print):
    p = Path(readme)
    if not p.exists():
        log(f"warning: {p} not found; README not updated")
        return False
    text = p.read_text()
    pat = re.compile(re.escape(README_START) + r".*?" + re.escape(README_END), re.S)
    if not pat.search(text):
        log(f"warning: markers {README_START} / {README_END} not found in {p}; README not updated")
        return False
    block = readme_block(run, root)
    p.write_text(pat.sub(lambda m: block, text, count=1))
    log(f"updated benchmark section of {p}")
    return True
