"""Distributed benchmark: tpu_dist beside Gloo, 2 ranks on this host.

    python -m torch_tpu.bench.dist [--quick] [--update-readme]

In one run: all_reduce (sum) and all_gather (into a tensor) of float32, 1 KB
to 256 MB per rank, through tpu_dist on tpu tensors and through Gloo on CPU
tensors (PyTorch's own CPU backend, the peer), and the machine's memory-copy
bandwidth (a 256 MB torch CPU copy on the same cores: the limit a transport
over shared memory is compared to). Figures are bus bandwidth as
nccl-tests defines it (all_reduce: bytes x 2(n-1)/n per second; all_gather:
output bytes x (n-1)/n), the slower rank's time. Then a DDP training step
(an MLP) in one process and on 2 ranks over the same cores, each rank on
half the batch: the communication's cost per step.

Writes benchmarks/results/dist-latest.json and, with --update-readme, the
<!-- bench-dist:start/end --> region of README.md.
"""
import argparse
import datetime
import json
import os
import tempfile
import time
from pathlib import Path

README_START, README_END = "<!-- bench-dist:start -->", "<!-- bench-dist:end -->"
WORLD = 2


def _sizes(quick):
    return [1 << 10, 1 << 16, 1 << 20] if quick else [1 << k for k in range(10, 29, 2)]


def _iters(nbytes, quick):
    return 3 if quick else max(3, min(200, (64 << 20) // nbytes))


def _rank(rank, backend, init_file, quick, q):
    try:
        os.environ.setdefault("TPU_HBM_BYTES", "3G")
        import torch
        import torch.distributed as dist
        dev = "tpu" if backend == "tpu_dist" else "cpu"
        if dev == "tpu":
            import torch_tpu  # noqa: F401
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=300))
        sync = torch.tpu.synchronize if dev == "tpu" else (lambda: None)
        out = {}
        for kind in ("all_reduce", "all_gather"):
            rows = []
            for nbytes in _sizes(quick):
                n = nbytes // 4
                x = torch.ones(n, device=dev)
                y = torch.empty(n * WORLD, device=dev) if kind == "all_gather" else None
                op = (lambda: dist.all_reduce(x)) if kind == "all_reduce" else \
                    (lambda: dist.all_gather_into_tensor(y, x))
                op()
                sync()
                iters = _iters(nbytes, quick)
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    op()
                sync()
                dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=dev)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX)
                sec = float(dt.item())
                factor = 2 * (WORLD - 1) / WORLD if kind == "all_reduce" else (WORLD - 1) / WORLD
                moved = nbytes if kind == "all_reduce" else nbytes * WORLD
                rows.append({"bytes": nbytes, "us": sec * 1e6, "busbw_gbs": moved * factor / sec / 1e9})
                del x, y
            out[kind] = rows
        dist.destroy_process_group()
        q.put((rank, out))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        import traceback
        q.put((rank, traceback.format_exc() + repr(e)))


def _ddp_rank(rank, world, init_file, quick, q):
    try:
        import torch
        import torch.distributed as dist
        import torch_tpu  # noqa: F401
        from torch.nn.parallel import DistributedDataParallel as DDP
        if world > 1:
            dist.init_process_group("tpu_dist", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=300))
        torch.manual_seed(0)
        d, h, batch = (64, 128, 16) if quick else (1024, 4096, 256)
        model = torch.nn.Sequential(torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d)).to("tpu")
        if world > 1:
            model = DDP(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(batch // world, d, device="tpu")
        times = []
        for i in range(3 if quick else 12):
            t0 = time.perf_counter()
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            torch.tpu.synchronize()
            times.append(time.perf_counter() - t0)
        med = sorted(times[2:])[len(times[2:]) // 2] if len(times) > 2 else times[-1]
        params = sum(p.numel() for p in model.parameters())
        if world > 1:
            dist.destroy_process_group()
        q.put((rank, {"ms": med * 1e3, "params": params, "batch": batch, "shape": f"{d}-{h}-{d}"}))
    except BaseException as e:  # noqa: BLE001
        import traceback
        q.put((rank, traceback.format_exc() + repr(e)))


def _world(target, world, what, quick):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init_file = os.path.join(tempfile.mkdtemp(prefix="tpu_bench_dist_"), "init")
    procs = [ctx.Process(target=target, args=(r, what, init_file, quick, q)) for r in range(world)]
    for p in procs:
        p.start()
    res = dict(q.get(timeout=1800) for _ in range(world))
    for p in procs:
        p.join(timeout=60)
    for r, v in res.items():
        if isinstance(v, str):
            raise RuntimeError(f"rank {r} failed:\n{v}")
    return res[0]


def _copy_gbs(quick):
    import torch
    n = (16 << 20 if quick else 256 << 20) // 4
    a, b = torch.ones(n), torch.empty(n)
    b.copy_(a)
    best = float("inf")
    for _ in range(3 if quick else 7):
        t0 = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t0)
    return n * 4 / best / 1e9


def _fmt_bytes(n):
    for unit, div in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}"
    return f"{n} B"


def table(run):
    lines = [f"Distributed, {WORLD} ranks on this host (`python -m torch_tpu.bench.dist`, {run['date']}, "
             f"{run['cpu']}, {run['threads']} cores): bus bandwidth in GB/s (nccl-tests' definition), tpu_dist on "
             f"tpu tensors beside Gloo on CPU tensors, and the ratio; the machine's memory-copy bandwidth (one "
             f"256 MB torch copy) is {run['copy_gbs']:.1f} GB/s.", "",
             "| size per rank | all_reduce tpu_dist | Gloo | ratio | % of copy | all_gather tpu_dist | Gloo | ratio "
             "| % of copy |", "|---|---|---|---|---|---|---|---|---|"]
    for i, row in enumerate(run["tpu_dist"]["all_reduce"]):
        cells = [_fmt_bytes(row["bytes"])]
        for kind in ("all_reduce", "all_gather"):
            t, g = run["tpu_dist"][kind][i]["busbw_gbs"], run["gloo"][kind][i]["busbw_gbs"]
            cells += [f"{t:.3g}", f"{g:.3g}", f"{t / g:.1f}x", f"{100 * t / run['copy_gbs']:.0f} %"]
        lines.append("| " + " | ".join(cells) + " |")
    d1, d2 = run["ddp"][1], run["ddp"][2]
    lines += ["", f"DDP training step (MLP {d1['shape']}, {d1['params']:,} parameters, SGD, global batch "
              f"{d1['batch']}): one process {d1['ms']:.1f} ms; 2 ranks on the same cores, half the batch each, "
              f"{d2['ms']:.1f} ms ({d2['ms'] / d1['ms']:.2f}x: the gradient all_reduce and two processes sharing "
              f"{run['threads']} cores)."]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="three small sizes, to prove it works")
    p.add_argument("--update-readme", action="store_true", help="rewrite the bench-dist region of README.md")
    args = p.parse_args(argv)
    from . import machine
    root = machine.repo_root()
    run = {"date": datetime.date.today().isoformat(), "cpu": machine.machine_info().get("cpu_model", "?"),
           "threads": os.cpu_count(), "quick": args.quick}
    print("memory-copy bandwidth ...", flush=True)
    run["copy_gbs"] = _copy_gbs(args.quick)
    for backend in ("tpu_dist", "gloo"):
        print(f"{backend}: all_reduce, all_gather ...", flush=True)
        run[backend] = _world(_rank, WORLD, backend, args.quick)
    print("DDP step, 1 and 2 ranks ...", flush=True)
    run["ddp"] = {w: _world(_ddp_rank, w, w, args.quick) for w in (1, 2)}
    text = table(run)
    print(text)
    out = Path(root) / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    if not args.quick:
        (out / "dist-latest.json").write_text(json.dumps(run, indent=1, default=str))
    if args.update_readme and not args.quick:
        readme = Path(root) / "README.md"
        s = readme.read_text()
        a, b = s.index(README_START) + len(README_START), s.index(README_END)
        readme.write_text(s[:a] + "\n" + text + "\n" + s[b:])
        print(f"README.md: {README_START} region rewritten")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
