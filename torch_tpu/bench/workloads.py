"""The workloads and their figures.

Module level is torch-free (the orchestrator imports it to know the figure
names); builders import torch and run inside the worker.

A builder gets (ctx, state, size) and returns a Bench: the callable to time,
the work one call does (flops / bytes / items / ops), which rate is the primary
figure, and which physical limit that rate is compared to.
"""

from dataclasses import dataclass, field

from .timing import Repeats


@dataclass
class Bench:
    fn: callable
    work: dict  # flops, bytes, items (+ item_unit), ops: work done by ONE call
    primary: str  # "flops" | "bytes" | "items" | "ops"
    limit: str | None = None  # "fp32" | "bf16" | "dram": what `flops`/`bytes` are compared to
    info: dict = field(default_factory=dict)


@dataclass
class Figure:
    name: str
    build: callable
    repeats: Repeats
    desc: str = ""


@dataclass
class Workload:
    key: str
    number: int
    title: str
    step_like: bool  # training/inference: first-step time and warm-up overhead matter
    figures: callable  # figures(quick) -> [Figure]


# --------------------------------------------------------------------------
# Sizes. Full sizes follow the issue; quick sizes only prove the plumbing.

SIZES = {
    False: dict(
        gemm_square=[512, 1024, 2048, 4096],
        gemm_d=768, gemm_tokens=8 * 256, gemm_vocab=50257,
        op_loop=1000,
        ew_shape=(8, 1024, 768),
        mlp=dict(d=1024, h=4096, batch=256),
        gpt_train=dict(batch=8, seq=256),
        gpt_infer=dict(batch=1, prompt=256, new_tokens=32),
        cnn=dict(batch=16, res=224, width=32),
        demo=(5000, 50),
    ),
    True: dict(
        gemm_square=[64, 128],
        gemm_d=64, gemm_tokens=32, gemm_vocab=512,
        op_loop=20,
        ew_shape=(2, 8, 32),
        mlp=dict(d=32, h=64, batch=8),
        gpt_train=dict(batch=2, seq=16),
        gpt_infer=dict(batch=1, prompt=8, new_tokens=4),
        cnn=dict(batch=2, res=32, width=8),
        demo=(64, 5),
    ),
}

# Repeat policy (see benchmarks/README.md, "Repeats"). Full: micro figures aim
# for ~1 s of timed calls (3..50 repeats); training/inference steps use a fixed
# warm-up and repeat count, reduced (to >= 1) only if a configuration is so slow
# that the repeats would exceed cap_s.
REPEATS = {
    False: dict(
        micro=Repeats(warmup=2, min_reps=3, max_reps=50, budget_s=1.0, cap_s=6.0),
        overhead=Repeats(warmup=2, min_reps=5, max_reps=30, budget_s=0.5, cap_s=3.0),
        mlp=Repeats(warmup=3, min_reps=10, max_reps=10, budget_s=0.0, cap_s=60.0),
        gpt_train=Repeats(warmup=2, min_reps=3, max_reps=3, budget_s=0.0, cap_s=150.0),
        gpt_infer=Repeats(warmup=2, min_reps=5, max_reps=5, budget_s=0.0, cap_s=60.0),
        cnn=Repeats(warmup=2, min_reps=5, max_reps=5, budget_s=0.0, cap_s=60.0),
    ),
    True: dict(
        micro=Repeats(warmup=2, min_reps=2, max_reps=3, budget_s=0.01, cap_s=0.5),
        overhead=Repeats(warmup=2, min_reps=2, max_reps=3, budget_s=0.01, cap_s=0.5),
        mlp=Repeats(warmup=2, min_reps=2, max_reps=2, budget_s=0.0, cap_s=5.0),
        gpt_train=Repeats(warmup=2, min_reps=2, max_reps=2, budget_s=0.0, cap_s=5.0),
        gpt_infer=Repeats(warmup=2, min_reps=2, max_reps=2, budget_s=0.0, cap_s=5.0),
        cnn=Repeats(warmup=2, min_reps=2, max_reps=2, budget_s=0.0, cap_s=5.0),
    ),
}


def _to(ctx, t):
    """Make inputs on the cpu (same values for every configuration), then move."""
    return t.to(ctx.device)


# --------------------------------------------------------------------------
# 1. GEMM

def _gemm_shapes(quick):
    s = SIZES[quick]
    d, T, V = s["gemm_d"], s["gemm_tokens"], s["gemm_vocab"]
    shapes = [(f"{n}x{n}x{n}", n, n, n) for n in s["gemm_square"]]
    shapes += [
        (f"qkv {T}x{d}x{3 * d}", T, d, 3 * d),
        (f"attn-proj {T}x{d}x{d}", T, d, d),
        (f"mlp-up {T}x{d}x{4 * d}", T, d, 4 * d),
        (f"mlp-down {T}x{4 * d}x{d}", T, 4 * d, d),
        (f"lm-head {T}x{d}x{V}", T, d, V),
    ]
    return sorted(shapes, key=lambda x: x[1] * x[2] * x[3])


def _mm(a, b):
    import torch

    return torch.mm(a, b)


def _gemm_builder(dtype_name, M, K, N):
    def build(ctx, state, size):
        import torch

        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        g = torch.Generator().manual_seed(0)
        a = _to(ctx, torch.randn(M, K, generator=g).to(dt))
        b = _to(ctx, torch.randn(K, N, generator=g).to(dt))
        f = ctx.compile(_mm)
        return Bench(lambda: f(a, b), {"flops": 2 * M * N * K}, "flops", dtype_name)

    return build


def gemm_figures(quick):
    figs = []
    for label, M, K, N in _gemm_shapes(quick):
        for dt in ("fp32", "bf16"):
            figs.append(Figure(f"{dt} {label}", _gemm_builder(dt, M, K, N), REPEATS[quick]["micro"],
                               f"C[M,N] = A[M,K] @ B[K,N] in {dt}"))
    return figs


# --------------------------------------------------------------------------
# 2. Per-op overhead

def _add(a, b):
    return a + b


def _view(x):
    return x.view(-1)


def _overhead_builder(kind):
    def build(ctx, state, size):
        import torch

        K = size["op_loop"]
        if kind in ("add", "add-sync"):
            a, b = _to(ctx, torch.ones(16)), _to(ctx, torch.ones(16))
            f = ctx.compile(_add)
            args = (a, b)
        elif kind == "matmul":
            a, b = _to(ctx, torch.ones(8, 8)), _to(ctx, torch.ones(8, 8))
            f = ctx.compile(_mm)
            args = (a, b)
        else:
            f = ctx.compile(_view)
            args = (_to(ctx, torch.ones(4, 4)),)
        sync = ctx.sync
        if kind == "add-sync":
            def fn():
                for _ in range(K):
                    f(*args)
                    sync()
        else:
            def fn():
                for _ in range(K):
                    f(*args)
        return Bench(fn, {"ops": K}, "ops")

    return build


def overhead_figures(quick):
    r = REPEATS[quick]["overhead"]
    return [
        Figure("add 16 elems", _overhead_builder("add"), r,
               "c = a + b, back to back, one sync at the end: launch throughput"),
        Figure("add 16 elems + sync", _overhead_builder("add-sync"), r,
               "c = a + b then synchronize, every op: round-trip latency"),
        Figure("matmul 8x8", _overhead_builder("matmul"), r, "8x8 @ 8x8, back to back"),
        Figure("view", _overhead_builder("view"), r, "x.view(-1): no kernel, dispatch only"),
    ]


# --------------------------------------------------------------------------
# 3. Elementwise chain: bias + GELU + dropout + residual + layer norm

def _chain(x, bias, res, w, b):
    import torch.nn.functional as F

    h = F.gelu(x + bias)
    h = F.dropout(h, p=0.1, training=True)
    return F.layer_norm(h + res, (x.shape[-1],), w, b)


def _ew_builder(backward):
    def build(ctx, state, size):
        import torch

        B, T, H = size["ew_shape"]
        g = torch.Generator().manual_seed(0)
        x = _to(ctx, torch.randn(B, T, H, generator=g))
        res = _to(ctx, torch.randn(B, T, H, generator=g))
        bias = _to(ctx, torch.randn(H, generator=g))
        w, b = _to(ctx, torch.ones(H)), _to(ctx, torch.zeros(H))
        f = ctx.compile(_chain)
        numel = B * T * H
        if not backward:
            held = [None]

            def fn():  # the result is kept (until the next call), so every mode computes it
                held[0] = f(x, bias, res, w, b)
            # ideal traffic: read x and residual, write y
            return Bench(fn, {"bytes": 3 * numel * 4}, "bytes", "dram")
        for t in (x, bias, res, w, b):
            t.requires_grad_(True)
        gy = _to(ctx, torch.randn(B, T, H, generator=g))
        leaves = (x, bias, res, w, b)

        def fn():
            for t in leaves:
                t.grad = None
            f(x, bias, res, w, b).backward(gy)
        # ideal traffic: forward 3 tensors + backward reads dy, x, residual and
        # writes dx, dresidual (mask regenerated, layer-norm stats recomputed)
        return Bench(fn, {"bytes": 8 * numel * 4}, "bytes", "dram")

    return build


def elementwise_figures(quick):
    B, T, H = SIZES[quick]["ew_shape"]
    r = REPEATS[quick]["micro"]
    return [
        Figure(f"fwd {B}x{T}x{H}", _ew_builder(False), r,
               "layer_norm(dropout(gelu(x + bias)) + residual), fp32"),
        Figure(f"fwd+bwd {B}x{T}x{H}", _ew_builder(True), r, "same, plus backward"),
    ]


# --------------------------------------------------------------------------
# 8. TorchTPU's eager-mode demo: x + 1, x * 2, x - 1 in a loop, then a sync

def _demo_build(ctx, state, size):
    import torch

    n, iters = size["demo"]
    x0 = _to(ctx, torch.randn(n, n).to(torch.bfloat16))
    sync = ctx.sync

    def fn():
        x = x0
        for _ in range(iters):
            x = x + 1
            x = x * 2
            x = x - 1
        sync()
    # ideal traffic: read x once, write the result once
    return Bench(fn, {"bytes": 2 * n * n * 2}, "bytes", "dram", info={"ops": 3 * iters})


def demo_figures(quick):
    n, iters = SIZES[quick]["demo"]
    return [Figure(f"{n}x{n} bf16, {iters} x (+1, *2, -1)", _demo_build, REPEATS[quick]["micro"],
                   "TorchTPU's eager-mode demo: 150 elementwise ops on one tensor, then a sync")]


# --------------------------------------------------------------------------
# 4. MLP training step

def _mlp_build(ctx, state, size):
    import torch
    import torch.nn.functional as F

    from .models import MLP

    p = size["mlp"]
    torch.manual_seed(0)
    model = MLP(p["d"], p["h"]).to(ctx.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    xb = _to(ctx, torch.randn(p["batch"], p["d"], generator=g))
    yb = _to(ctx, torch.randn(p["batch"], p["d"], generator=g))
    cm = ctx.compile(model)

    def step():
        loss = F.mse_loss(cm(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    macs = p["batch"] * (p["d"] * p["h"] + p["h"] * p["h"] + p["h"] * p["d"])
    return Bench(step, {"flops": 6 * macs, "items": p["batch"], "item_unit": "samples"}, "items",
                 "fp32", {"params": sum(t.numel() for t in model.parameters())})


def mlp_figures(quick):
    p = SIZES[quick]["mlp"]
    return [Figure(f"train step {p['d']}-{p['h']}-{p['h']}-{p['d']} b{p['batch']}", _mlp_build,
                   REPEATS[quick]["mlp"], "fwd + MSE loss + bwd + AdamW, fp32")]


# --------------------------------------------------------------------------
# 5. Transformer training step

def _gpt_train_build(ctx, state, size):
    import torch

    from .models import gpt2_flops_per_token_fwd, gpt2_model

    p = size["gpt_train"]
    model = gpt2_model(ctx.quick).to(ctx.device)
    model.train()
    cfg = model.config
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    ids = _to(ctx, torch.randint(0, cfg.vocab_size, (p["batch"], p["seq"]), generator=g))
    cm = ctx.compile(model)

    def step():
        out = cm(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    tokens = p["batch"] * p["seq"]
    flops = 3 * tokens * gpt2_flops_per_token_fwd(cfg, p["seq"])
    return Bench(step, {"flops": flops, "items": tokens, "item_unit": "tokens"}, "items", "fp32",
                 {"params": sum(t.numel() for t in model.parameters()),
                  "attn_implementation": getattr(cfg, "_attn_implementation", None)})


def gpt_train_figures(quick):
    p = SIZES[quick]["gpt_train"]
    return [Figure(f"train step b{p['batch']} s{p['seq']}", _gpt_train_build, REPEATS[quick]["gpt_train"],
                   "GPT-2 LM: fwd + loss + bwd + AdamW, fp32, random weights")]


# --------------------------------------------------------------------------
# 6. Transformer inference: prefill and greedy decode

def _gpt_infer_state(ctx, state):
    if "model" not in state:
        import torch

        from .models import gpt2_model

        model = gpt2_model(ctx.quick).to(ctx.device).eval()
        state["model"] = model
        state["params"] = sum(t.numel() for t in model.parameters())
        g = torch.Generator().manual_seed(0)
        p = ctx.size["gpt_infer"]
        state["prompt"] = _to(ctx, torch.randint(0, model.config.vocab_size, (p["batch"], p["prompt"]),
                                                 generator=g))
    return state


def _prefill_build(ctx, state, size):
    import torch

    from .models import gpt2_flops_per_token_fwd

    st = _gpt_infer_state(ctx, state)
    model, prompt = st["model"], st["prompt"]
    cm = ctx.compile(model)

    def fn():
        with torch.no_grad():
            out = cm(input_ids=prompt, use_cache=True)
            out.logits[:, -1].argmax(-1)

    tokens = prompt.numel()
    flops = tokens * gpt2_flops_per_token_fwd(model.config, prompt.shape[1])
    return Bench(fn, {"flops": flops, "items": tokens, "item_unit": "tokens"}, "items", "fp32",
                 {"params": st["params"]})


def _decode_build(ctx, state, size):
    import time

    import torch

    st = _gpt_infer_state(ctx, state)
    model, prompt = st["model"], st["prompt"]
    n_new = size["gpt_infer"]["new_tokens"]
    cm = ctx.compile(model)
    sync = ctx.sync

    def fn():
        with torch.no_grad():
            out = cm(input_ids=prompt, use_cache=True)  # untimed prefill
            past = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            sync()
            t0 = time.perf_counter()
            for _ in range(n_new):
                out = cm(input_ids=nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
            sync()
            return time.perf_counter() - t0

    cfg = model.config
    B, P = prompt.shape
    # bytes per decoded token: every weight once (fp32) + the KV cache read
    # (2 * layers * context * d * 4 bytes at the mean context length)
    mean_ctx = P + (n_new + 1) / 2
    per_step = st["params"] * 4 + B * 2 * cfg.n_layer * mean_ctx * cfg.n_embd * 4
    return Bench(fn, {"bytes": n_new * per_step, "items": B * n_new, "item_unit": "tokens"}, "items",
                 "dram", {"params": st["params"]})


def gpt_infer_figures(quick):
    p = SIZES[quick]["gpt_infer"]
    r = REPEATS[quick]["gpt_infer"]
    return [
        Figure(f"prefill b{p['batch']} p{p['prompt']}", _prefill_build, r,
               "GPT-2 forward over the prompt with KV cache, fp32"),
        Figure(f"decode b{p['batch']} {p['new_tokens']} tokens", _decode_build, r,
               "greedy decode with KV cache after the prompt (prefill untimed)"),
    ]


# --------------------------------------------------------------------------
# 7. Small ResNet-style CNN inference

def _cnn_build(ctx, state, size):
    import torch

    from .models import SmallResNet, count_flops

    p = size["cnn"]
    torch.manual_seed(0)
    model = SmallResNet(width=p["width"]).eval()
    g = torch.Generator().manual_seed(0)
    x_cpu = torch.randn(p["batch"], 3, p["res"], p["res"], generator=g)
    flops = count_flops(model, x_cpu[:1]) * p["batch"]
    model = model.to(ctx.device)
    x = _to(ctx, x_cpu)
    cm = ctx.compile(model)

    held = [None]

    def fn():  # the logits are kept (until the next call), so every mode computes them
        with torch.no_grad():
            held[0] = cm(x)

    return Bench(fn, {"flops": flops, "items": p["batch"], "item_unit": "images"}, "items", "fp32",
                 {"params": sum(t.numel() for t in model.parameters())})


def cnn_figures(quick):
    p = SIZES[quick]["cnn"]
    return [Figure(f"inference b{p['batch']} {p['res']}x{p['res']}", _cnn_build, REPEATS[quick]["cnn"],
                   f"ResNet-18 layout at width {p['width']}, eval, fp32")]


# --------------------------------------------------------------------------
# 9. FFT

def _fft_builder(kind, shape):
    def build(ctx, state, size):
        import math

        import torch

        g = torch.Generator().manual_seed(0)
        if kind == "rfft":
            x = _to(ctx, torch.randn(*shape, generator=g))
            f = ctx.compile(lambda t: torch.fft.rfft(t))
        else:
            x = _to(ctx, torch.randn(*shape, dtype=torch.complex64, generator=g))
            f = ctx.compile((lambda t: torch.fft.fft2(t)) if kind == "fft2" else (lambda t: torch.fft.fft(t)))
        held = [None]

        def fn():
            held[0] = f(x)

        dims = shape[-2:] if kind == "fft2" else shape[-1:]
        lines_flops = 0.0
        for d in dims:  # the usual count: 5 n log2 n per complex line (a real one: half)
            lines = math.prod(shape) // d
            lines_flops += lines * 5 * d * math.log2(d) * (0.5 if kind == "rfft" else 1.0)
        return Bench(fn, {"flops": int(lines_flops)}, "flops")

    return build


def fft_figures(quick):
    if quick:
        cases = [("fft", (4, 64)), ("rfft", (4, 64)), ("fft", (2, 67)), ("fft2", (32, 32))]
    else:
        cases = [("fft", (64, 16384)), ("rfft", (64, 16384)), ("fft", (64, 4099)), ("fft2", (1024, 1024))]
    return [Figure(f"{k} {'x'.join(map(str, s))}", _fft_builder(k, s), REPEATS[quick]["micro"],
                   f"torch.fft.{k} of complex64 (rfft: float32) " + ("(4099: a prime, Bluestein)" if 4099 in s else ""))
            for k, s in cases]


WORKLOADS = {
    w.key: w
    for w in [
        Workload("gemm", 1, "GEMM", False, gemm_figures),
        Workload("overhead", 2, "Per-op overhead", False, overhead_figures),
        Workload("elementwise", 3, "Elementwise chain", False, elementwise_figures),
        Workload("mlp", 4, "MLP training", True, mlp_figures),
        Workload("gpt2-train", 5, "Transformer training", True, gpt_train_figures),
        Workload("gpt2-infer", 6, "Transformer inference", True, gpt_infer_figures),
        Workload("cnn", 7, "CNN inference", True, cnn_figures),
        Workload("eager-demo", 8, "TorchTPU eager demo", False, demo_figures),
        Workload("fft", 9, "FFT", False, fft_figures),
    ]
}
ALL_WORKLOADS = list(WORKLOADS)


def resolve_workloads(spec):
    """'all' | comma list of keys or numbers (e.g. 'gemm,5,cnn')."""
    if not spec or spec == "all":
        return list(ALL_WORKLOADS)
    by_num = {str(w.number): k for k, w in WORKLOADS.items()}
    out = []
    for item in spec.split(","):
        item = item.strip()
        key = by_num.get(item, item)
        if key not in WORKLOADS:
            raise ValueError(f"unknown workload {item!r}; choose from {', '.join(ALL_WORKLOADS)} or 1-{len(WORKLOADS)}")
        if key not in out:
            out.append(key)
    return out
