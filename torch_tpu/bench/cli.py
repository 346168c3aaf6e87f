"""Orchestrator: python -m torch_tpu.bench [options]  (see --help, benchmarks/README.md)."""

import argparse
import datetime as _dt
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import machine, report
from .configs import ALL_CONFIGS, CONFIGS, QUICK_CONFIGS, worker_env
from .workloads import ALL_WORKLOADS, WORKLOADS, resolve_workloads

TAG = "@@BENCH@@"
PKG_PARENT = Path(__file__).resolve().parents[2]  # directory holding the torch_tpu package
STANDALONE = Path(__file__).resolve().parent / "standalone.py"  # workers start here (see its docstring)


def _loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _cpu_busy_s():
    """CPU seconds spent by everything on this machine (user+nice+system+irq+softirq)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:8]]
        return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _children_cpu_s():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def log(*a):
    print(*a, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m torch_tpu.bench",
        description="Benchmark torch_tpu beside PyTorch CPU eager and Inductor, on the same cores, in one run.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="workloads: " + ", ".join(f"{w.number}={k}" for k, w in WORKLOADS.items())
        + "\nconfigs:   " + ", ".join(ALL_CONFIGS))
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes and few repeats: proves the harness works (numbers mean nothing); "
                        "never touches README.md")
    p.add_argument("--configs", default=None,
                   help=f"comma list or 'all' (default: all; --quick: {','.join(QUICK_CONFIGS)})")
    p.add_argument("--workloads", default="all", help="comma list of names or numbers 1-8, or 'all'")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads for every configuration (default 2; --quick: 1)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds per (config, workload) subprocess (default 900; --quick: 120)")
    p.add_argument("--jobs", type=int, default=None,
                   help="subprocesses run at once (default 1; --quick: 2). >1 shares the cores: only for --quick")
    p.add_argument("--out", default=None,
                   help="output directory (default benchmarks/results; --quick: build/bench/quick)")
    p.add_argument("--update-readme", action="store_true",
                   help="rewrite the <!-- bench:start/end --> region of README.md (ignored with --quick)")
    p.add_argument("--readme", default=None, help="README to update (default: <repo>/README.md)")
    p.add_argument("--no-limits", action="store_true", help="skip the physical-limit microbenchmark")
    p.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    p.add_argument("--fail-on-error", action="store_true",
                   help="exit 2 if any figure of an available configuration did not produce a number")
    p.add_argument("--list", action="store_true", help="list workloads, figures and configurations, then exit")
    # internal
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.timeout is None:
        a.timeout = 120.0 if a.quick else 900.0
    if a.jobs is None:
        a.jobs = 2 if a.quick else 1
    if a.threads is None:
        # --quick runs 2 workers at once; 1 thread each keeps them from fighting over the 2 cores
        a.threads = 1 if a.quick else 2
    return a


def resolve_configs(spec, quick):
    if spec is None:
        return list(QUICK_CONFIGS if quick else ALL_CONFIGS)
    if spec == "all":
        return list(ALL_CONFIGS)
    out = []
    for c in (s.strip() for s in spec.split(",")):
        if c not in CONFIGS:
            raise SystemExit(f"unknown config {c!r}; choose from {', '.join(ALL_CONFIGS)}")
        if c not in out:
            out.append(c)
    return out


# --------------------------------------------------------------------------
# subprocesses

def _spawn(args, config, extra, timeout, log_path, tmp_root):
    cfg = CONFIGS[config]
    env = worker_env(os.environ, cfg, args.threads)
    env["PYTHONPATH"] = os.pathsep.join([str(PKG_PARENT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    cache = None
    if cfg.compiler is not None:
        # a fresh compiler cache per worker: every run pays (and reports) a cold compile
        cache = tempfile.mkdtemp(prefix=f"{config}-", dir=tmp_root)
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(args.threads)
    cmd = [sys.executable, str(STANDALONE), "--worker", "--config", config,
           "--threads", str(args.threads), "--timeout", str(timeout)] + extra + (["--quick"] if args.quick else [])
    t0 = time.perf_counter()
    busy0, kids0 = _cpu_busy_s(), _children_cpu_s()
    timed_out = False
    with open(log_path, "w") as errf:
        errf.write("$ " + " ".join(cmd) + "\n")
        errf.flush()
        proc = subprocess.Popen(cmd, cwd=str(PKG_PARENT), env=env, stdout=subprocess.PIPE, stderr=errf,
                                text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the worker and its compile helpers
            except ProcessLookupError:
                pass
            out, _ = proc.communicate()
        errf.write("\n--- non-record stdout ---\n")
        records = []
        for line in (out or "").splitlines():
            if line.startswith(TAG):
                try:
                    records.append(json.loads(line[len(TAG):]))
                    continue
                except json.JSONDecodeError:
                    pass
            errf.write(line + "\n")
    wall = time.perf_counter() - t0
    busy1, kids1 = _cpu_busy_s(), _children_cpu_s()
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
    # CPU time used by other processes while this worker ran (machine-wide busy
    # time minus what our own subprocesses used): a measure of how noisy it was
    foreign = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) - (kids1 - kids0))
    records.append({"kind": "_noise", "foreign_cpu_s": foreign,
                    "foreign_load": None if foreign is None else foreign / max(wall, 1e-9)})
    return records, proc.returncode, timed_out, wall


def _tail(path, n=6):
    try:
        lines = [ln for ln in Path(path).read_text(errors="replace").splitlines()
                 if ln.strip() and not ln.startswith("$ ") and not ln.startswith("--- non-record")]
        return "\n".join(lines[-n:])
    except OSError:
        return ""


def probe_config(args, config, logs, tmp_root):
    log_path = logs / f"{config}__probe.log"
    recs, rc, to, _ = _spawn(args, config, ["--probe"], 180, log_path, tmp_root)
    for r in recs:
        if r.get("kind") == "probe":
            return r
    return {"available": False, "reason": f"probe failed (rc={rc}{', timeout' if to else ''}): {_tail(log_path, 3)}"}


def run_pair(args, config, workload, logs, tmp_root):
    log_path = logs / f"{config}__{workload}.log"
    recs, rc, timed_out, wall = _spawn(args, config, ["--workload", workload], args.timeout, log_path, tmp_root)
    figs = {r["figure"]: r for r in recs if r.get("kind") == "figure"}
    fatal = next((r for r in recs if r.get("kind") == "fatal"), None)
    info = next((r for r in recs if r.get("kind") == "info"), None)
    done = any(r.get("kind") == "done" for r in recs)
    noise = next((r for r in recs if r.get("kind") == "_noise"), {})
    pair = {"config": config, "workload": workload, "wall_s": wall, "returncode": rc, "log": str(log_path),
            "info": info, "foreign_cpu_s": noise.get("foreign_cpu_s"), "foreign_load": noise.get("foreign_load")}
    if fatal:
        err = fatal["error"]
        pair.update(status="error", error=err)
        if err.startswith("n/a"):
            pair["status"] = "n/a"
    elif timed_out:
        pair.update(status="timeout", error=f"timed out after {args.timeout:.0f} s; last output: {_tail(log_path, 2)}")
    elif not done or rc != 0:
        pair.update(status="error", error=f"worker exited with code {rc}: {_tail(log_path)}")
    else:
        pair["status"] = "ok"
    results = []
    for fig in WORKLOADS[workload].figures(args.quick):
        r = figs.get(fig.name)
        if r is None:
            st = pair["status"] if pair["status"] in ("timeout", "n/a") else "error"
            r = {"figure": fig.name, "status": st, "error": pair.get("error") or "no result reported"}
        r = {k: v for k, v in r.items() if k != "kind"}
        if r.get("status") == "ok" and pair.get("foreign_load") is not None:
            r["foreign_load"] = pair["foreign_load"]
        results.append({"config": config, "workload": workload, **r})
    n_ok = sum(r["status"] == "ok" for r in results)
    if pair["status"] == "ok" and n_ok < len(results):
        pair["status"] = "partial"
        pair["error"] = "; ".join(sorted({r.get("error", "")[:200] for r in results if r["status"] != "ok"}))
    return results, pair


# --------------------------------------------------------------------------

def list_all(quick):
    for k, w in WORKLOADS.items():
        log(f"{w.number}. {k}: {w.title}")
        for f in w.figures(quick):
            log(f"     - {f.name}: {f.desc}")
    log("configs:")
    for c in CONFIGS.values():
        log(f"  {c.name}: {c.description}" + (f" [env {c.env}]" if c.env else ""))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        from . import worker

        if args.probe:
            return worker.probe(args.config, args.threads)
        return worker.run(args.config, args.workload, args.threads, args.quick, args.timeout)
    if args.list:
        list_all(args.quick)
        return 0

    root = machine.repo_root()
    configs = resolve_configs(args.configs, args.quick)
    try:
        workloads = resolve_workloads(args.workloads)
    except ValueError as e:
        raise SystemExit(str(e))
    out_dir = Path(args.out) if args.out else (root / "build" / "bench" / "quick" if args.quick
                                                 else root / "benchmarks" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = _dt.datetime.now().astimezone()
    stamp = started.strftime("%Y%m%d-%H%M%S")
    logs = root / "build" / "bench" / "logs" / stamp
    logs.mkdir(parents=True, exist_ok=True)
    tmp_root = root / "build" / "bench" / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    t_run = time.perf_counter()

    cmd = "python -m torch_tpu.bench" + ("" if argv is None and len(sys.argv) <= 1 else
                                          " " + " ".join(sys.argv[1:] if argv is None else argv))
    log(f"torch_tpu bench: configs={','.join(configs)} workloads={','.join(workloads)} threads={args.threads}"
        f"{' quick' if args.quick else ''} -> {out_dir}")
    run = {
        "schema": 1,
        "run": {"started": started.isoformat(timespec="seconds"), "command": cmd, "quick": args.quick,
                "threads": args.threads, "configs": configs, "workloads": workloads,
                "timeout_s": args.timeout, "jobs": args.jobs, "logs": str(logs)},
        "machine": machine.machine_info(),
        "versions": machine.versions(),
        "commit": machine.commit_info(root),
        "limits": None,
        "configs": {},
        "results": [],
        "pairs": [],
    }
    run["run"]["loadavg_start"] = _loadavg()
    b0 = _cpu_busy_s()
    time.sleep(1.0)
    b1 = _cpu_busy_s()
    if b0 is not None and b1 is not None:
        run["run"]["busy_cores_at_start"] = b1 - b0
        if b1 - b0 > report.BUSY_LOAD:
            log(f"warning: the machine is busy (other processes use {b1 - b0:.2f} cores); figures will be noisy; "
                "figures measured while it stays busy are marked †")
    if args.jobs > 1 and not args.quick:
        log("warning: --jobs > 1 runs configurations concurrently on shared cores; figures are not comparable")

    if not args.no_limits:
        try:
            run["limits"] = machine.measure_limits(args.threads, args.quick, root, log)
            log(report.limits_line(run["limits"]))
        except Exception as e:  # noqa: BLE001
            run["limits"] = {"error": f"{type(e).__name__}: {e}"}
            log(f"warning: physical-limit microbenchmark failed: {e}")

    # availability probes (only configurations that depend on an optional feature)
    need = [c for c in configs if CONFIGS[c].requires]
    with ThreadPoolExecutor(max(1, args.jobs)) as ex:
        probes = dict(zip(need, ex.map(lambda c: probe_config(args, c, logs, tmp_root), need)))
    for c in configs:
        cfg = CONFIGS[c]
        if c in probes:
            pr = probes[c]
            run["configs"][c] = {"status": "ok" if pr.get("available") else "n/a",
                                 "reason": pr.get("reason", ""), "env": cfg.env}
            if not pr.get("available"):
                log(f"{c}: {pr.get('reason')}")
        else:
            run["configs"][c] = {"status": "ok", "reason": "", "env": cfg.env}

    pairs = [(w, c) for w in workloads for c in configs]
    todo = [(w, c) for w, c in pairs if run["configs"][c]["status"] == "ok"]
    done = {}
    counter = [0]

    def one(wc):
        w, c = wc
        res, pair = run_pair(args, c, w, logs, tmp_root)
        counter[0] += 1
        n_ok = sum(r["status"] == "ok" for r in res)
        msg = f"[{counter[0]}/{len(todo)}] {WORKLOADS[w].number}. {w:<12} {c:<13} {pair['status']:<8} " \
              f"{n_ok}/{len(res)} figures  {pair['wall_s']:.1f} s"
        if pair["status"] != "ok":
            msg += f"  ({(pair.get('error') or '').splitlines()[0][:150] if pair.get('error') else ''})"
        if (pair.get("foreign_load") or 0) > report.BUSY_LOAD and args.jobs == 1:
            msg += f"  [busy: other processes used {pair['foreign_load']:.2f} cores]"
        log(msg)
        return wc, res, pair

    if args.jobs > 1:
        with ThreadPoolExecutor(args.jobs) as ex:
            for wc, res, pair in ex.map(one, todo):
                done[wc] = (res, pair)
    else:
        for wc in todo:
            _, res, pair = one(wc)
            done[wc] = (res, pair)

    for w, c in pairs:
        if (w, c) in done:
            res, pair = done[(w, c)]
        else:  # configuration not available: record it, do not fake it
            reason = run["configs"][c]["reason"] or "n/a"
            res = [{"config": c, "workload": w, "figure": f.name, "status": "n/a", "error": reason}
                   for f in WORKLOADS[w].figures(args.quick)]
            pair = {"config": c, "workload": w, "status": "n/a", "error": reason}
        run["pairs"].append(pair)
        run["results"].extend(res)
    # order: workload, figure, config
    fig_pos = {}
    for w in workloads:
        for i, f in enumerate(WORKLOADS[w].figures(args.quick)):
            fig_pos[(w, f.name)] = (workloads.index(w), i)
    run["results"].sort(key=lambda r: (fig_pos[(r["workload"], r["figure"])], configs.index(r["config"])))

    if run["limits"] and "error" not in run["limits"]:
        try:  # measure again at the end; the limit is the best of both readings
            run["limits"] = machine.measure_limits(args.threads, args.quick, root, log, previous=run["limits"])
            log(report.limits_line(run["limits"]) + "  (best of start and end of run)")
        except Exception as e:  # noqa: BLE001
            log(f"warning: second physical-limit measurement failed: {e}")
    report.enrich(run["results"], run["limits"] if run["limits"] and "error" not in run["limits"] else None)
    finished = _dt.datetime.now().astimezone()
    run["run"]["finished"] = finished.isoformat(timespec="seconds")
    run["run"]["duration_s"] = time.perf_counter() - t_run
    run["run"]["loadavg_end"] = _loadavg()
    files = {"json": str(out_dir / "latest.json"), "md": str(out_dir / "latest.md"),
             "png": str(out_dir / "latest.png")}
    sha = (run["commit"].get("sha") or "nocommit")[:8]
    runs_dir = out_dir / "runs"
    runs_dir.mkdir(exist_ok=True)
    files["run_json"] = str(runs_dir / f"{stamp}-{sha}.json")
    run["files"] = files

    if not args.no_chart:
        try:
            report.chart(run, files["png"])
        except Exception as e:  # noqa: BLE001
            log(f"warning: chart failed: {type(e).__name__}: {e}")
    text = json.dumps(run, indent=1, default=str)
    Path(files["json"]).write_text(text)
    Path(files["run_json"]).write_text(text)
    md = report.markdown(run)
    Path(files["md"]).write_text(md)

    log("")
    log(report.summary_table(run))
    log("")
    log(f"wrote {files['json']}, {files['md']}, {files['png']} ({run['run']['duration_s']:.0f} s)")
    if args.update_readme:
        if args.quick:
            log("note: --quick never updates README.md")
        else:
            report.update_readme(args.readme or (root / "README.md"), run, root, log)
    bad = [r for r in run["results"] if r["status"] not in ("ok", "n/a")]
    if bad:
        log(f"{len(bad)} figure(s) without a number; see {files['md']} and the logs in {logs}")
    return 2 if (bad and args.fail_on_error) else 0
