"""torch.compile(backend="tpu"): compiled graphs against eager code on the same inputs.

A compiled graph runs its ATen ops as one Fused Eager window (torch_tpu/_compile.py),
so in every eager mode its results equal eager Strict's bit for bit wherever the
compiled graph computes the same ops (random ops included: the Philox offset is
taken in the same order). Models and compiled functions live at module scope:
Dynamo compiles each once, and the other two eager modes run the same compiled
graphs (what a graph does depends on the mode at its call, not at its compile).
"""
import copy
import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_tpu

torch._dynamo.config.cache_size_limit = 64


def _grads(model):
    return [p.grad.detach().cpu().clone() for p in model.parameters()]


# ---- the backend, the default backend, options ----

@pytest.mark.mode_independent
def test_backend_works_after_bare_import_torch_and_inductor_refuses_tpu_graphs():
    code = r"""
import torch
assert "tpu" in torch._dynamo.list_backends()
f = torch.compile(lambda x: x * 2 + 1, backend="tpu")
print(f(torch.ones(3, device="tpu")).tolist())
g = torch.compile(lambda x: x * 2 + 1)
try:
    g(torch.ones(3, device="tpu"))
    print("no error")
except Exception as e:
    print(type(e).__name__, "|", str(e).splitlines()[1] if "\n" in str(e) else str(e))
print((torch.ones(2, device="tpu") + 1).tolist())
print(torch.compile(lambda x: x * 2 + 1)(torch.ones(2)).tolist())   # Inductor on the CPU is untouched
"""
    env = dict(os.environ, TORCH_TPU_CPU_FALLBACK="1")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.strip().splitlines()
    assert lines[0] == "[3.0, 3.0, 3.0]"
    assert lines[1].startswith("BackendCompilerFailed")
    assert 'backend="tpu"' in lines[1] and "jax" not in p.stdout
    assert lines[2] == "[2.0, 2.0]" and lines[3] == "[3.0, 3.0]"


def test_modes_accepted_and_unknown_options_raise():
    def f(x):
        return torch.sin(x) * 2

    x = torch.randn(8, device="tpu")
    for mode in ("default", "reduce-overhead", "max-autotune"):
        torch.testing.assert_close(torch.compile(f, backend="tpu", mode=mode)(x), f(x), rtol=0, atol=0)
    with pytest.raises(Exception, match="Unexpected optimization option"):
        torch.compile(f, backend="tpu", options={"bogus": 1})(x)
    with pytest.raises(Exception, match="Unrecognized mode"):
        torch_tpu._compile.tpu_backend(None, [], mode="fastest")


def _elementwise(x, b):
    return F.gelu(x + b) * torch.sigmoid(x) - x.exp() / 3


_elementwise_c = torch.compile(_elementwise, backend="tpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_graph_is_one_window_bit_identical_to_eager(eager_mode, dtype):
    x = torch.randn(64, 96, device="tpu", dtype=dtype)
    b = torch.randn(96, device="tpu", dtype=dtype)
    ref = _elementwise(x, b)
    torch.tpu.synchronize()
    torch_tpu.reset_fused_stats()
    out = _elementwise_c(x, b)
    graph_end = torch_tpu.fused_stats()["flushes"]["graph_end"]
    assert torch.equal(out.cpu(), ref.cpu())
    st = torch_tpu.fused_stats()
    # The graph's ops ran fused in one window, flushed at the graph's end, except
    # in Fused Eager, where the graph joins the eager window (flushed by .cpu()).
    assert st["ops_fused"] >= 5 and st["fused_groups_run"] == 1
    assert graph_end == (0 if eager_mode == "fused" else 1)
    assert torch_tpu.get_eager_mode() == eager_mode


# ---- training: the MLP, the CNN, GPT-2 ----

torch.manual_seed(0)
_MLP = nn.Sequential(nn.Linear(48, 96), nn.GELU(), nn.Dropout(0.2), nn.Linear(96, 32), nn.LayerNorm(32),
                     nn.Linear(32, 5)).to("tpu")
_MLP_C = copy.deepcopy(_MLP)


def _mlp_step(model, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss


_mlp_step_c = torch.compile(_mlp_step, backend="tpu")


def test_mlp_training_step_equals_eager(eager_mode):
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(32, 48, generator=g).to("tpu"), torch.randint(0, 5, (32,), generator=g).to("tpu")
    for model, fn in ((_MLP, _mlp_step), (_MLP_C, _mlp_step_c)):
        model.zero_grad(set_to_none=True)
        torch.tpu.manual_seed(11)   # the same dropout masks
        loss = fn(model, x, y)
        model.loss = loss.item()
    assert _MLP.loss == _MLP_C.loss
    for a, b in zip(_grads(_MLP), _grads(_MLP_C)):
        assert torch.equal(a, b)
    _MLP.zero_grad(set_to_none=True)
    _MLP_C.zero_grad(set_to_none=True)


class _CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)
        x = F.relu(self.c2(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


torch.manual_seed(1)
_CNN_E = _CNN().to("tpu")
_CNN_C = copy.deepcopy(_CNN_E)
_cnn_step_c = torch.compile(_mlp_step, backend="tpu")


def test_cnn_training_step_matches_eager(eager_mode):
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(4, 3, 16, 16, generator=g).to("tpu"), torch.randint(0, 10, (4,), generator=g).to("tpu")
    le = _mlp_step(_CNN_E, x, y)
    lc = _cnn_step_c(_CNN_C, x, y)
    torch.testing.assert_close(lc.cpu(), le.cpu(), rtol=1e-5, atol=1e-6)
    for a, b in zip(_grads(_CNN_E), _grads(_CNN_C)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    for a, b in zip(_CNN_E.buffers(), _CNN_C.buffers()):   # batch norm's running stats (an input mutation)
        torch.testing.assert_close(b.cpu(), a.cpu(), rtol=1e-5, atol=1e-6)
    _CNN_E.zero_grad(set_to_none=True)
    _CNN_C.zero_grad(set_to_none=True)


def _gpt_step(model, ids):
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss


@pytest.fixture(scope="module")
def gpt():
    """A tiny GPT-2 twice (eager, compiled) with AdamW each, one step taken (optimizer
    state and compiled graphs exist before the leak check of the first test)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=128, n_positions=64, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    m = GPT2LMHeadModel(cfg).to("tpu")
    mc = copy.deepcopy(m)
    G = dict(m=m, mc=mc, opt=torch.optim.AdamW(m.parameters(), lr=1e-3),
             optc=torch.optim.AdamW(mc.parameters(), lr=1e-3), step=torch.compile(_gpt_step, backend="tpu"))
    G["opt_step"] = torch.compile(G["optc"].step, backend="tpu")
    ids = torch.randint(0, 128, (2, 16)).to("tpu")
    torch._dynamo.mark_dynamic(ids, 1)   # the sequence length: one compile serves every length
    _gpt_step(m, ids)
    G["step"](mc, ids)
    G["opt"].step()
    G["opt_step"]()
    G["opt"].zero_grad(set_to_none=True)
    G["optc"].zero_grad(set_to_none=True)
    del ids
    yield G
    G.clear()


def test_gpt2_forward_backward_adamw_and_new_sequence_lengths(eager_mode, gpt):
    G = gpt
    torch_tpu.reset_fallback_counts()
    g = torch.Generator().manual_seed(5)
    before = torch_tpu.compile_stats()["frames_compiled"]
    for L in (16, 24, 33):
        ids = torch.randint(0, 128, (2, L), generator=g).to("tpu")
        le = _gpt_step(G["m"], ids)
        lc = G["step"](G["mc"], ids)
        torch.testing.assert_close(lc.cpu(), le.cpu(), rtol=1e-5, atol=1e-5)
        for a, b in zip(_grads(G["m"]), _grads(G["mc"])):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        G["opt"].step()
        G["opt_step"]()
        G["opt"].zero_grad(set_to_none=True)
        G["optc"].zero_grad(set_to_none=True)
    assert torch_tpu.compile_stats()["frames_compiled"] == before, "a new sequence length compiled again"
    # (Adam divides by sqrt(v): where a gradient is near 0, its rounding-level differences (the
    # compiled step sums in another order) move an update by up to lr; 4 steps of lr 1e-3 here)
    for a, b in zip(G["m"].parameters(), G["mc"].parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach().cpu(), rtol=1e-3, atol=1e-4)
    assert torch_tpu.fallback_counts() == {}


# ---- shapes, graph breaks, errors ----

def _affine(x, w):
    return torch.tanh(x @ w) + 1


def test_marked_dynamic_batch_compiles_once(eager_mode):
    fn = torch.compile(_affine, backend="tpu", dynamic=True)
    w = torch.randn(16, 8, device="tpu")
    torch_tpu.reset_compile_stats()
    for n in (3, 5, 9, 17):
        x = torch.randn(n, 16, device="tpu")
        torch.testing.assert_close(fn(x, w).cpu(), _affine(x, w).cpu(), rtol=1e-6, atol=1e-6)
    st = torch_tpu.compile_stats()
    assert st["frames_compiled"] <= 1 and st["recompiles"] == 0 and st["graph_calls"] == 4


def _with_break(x):
    y = x.sin() * 2
    if y.sum().item() > 0:   # a data-dependent branch: a graph break, run in the current eager mode
        y = y + 1
    return y.cos()


def test_graph_break_runs_in_the_current_eager_mode(eager_mode):
    fn = torch.compile(_with_break, backend="tpu")
    x = torch.randn(10, device="tpu")
    assert torch.equal(fn(x).cpu(), _with_break(x).cpu())
    assert torch.equal(fn(-x).cpu(), _with_break(-x).cpu())
    assert torch_tpu.get_eager_mode() == eager_mode


def _gather_rows(table, idx):
    return F.embedding(idx, table) * 2


_gather_rows_c = torch.compile(_gather_rows, backend="tpu")


def test_errors_inside_compiled_graphs_raise_and_the_device_keeps_working(eager_mode):
    # (traced on fake tensors: the message is the meta kernel's, as under Inductor on CUDA; the
    # fake-tensor logger's record of it would hold the tensors in pytest's log capture)
    log = logging.getLogger("torch._subclasses.fake_tensor")
    log.disabled = True
    try:
        with pytest.raises(RuntimeError, match="same reduction dim|cannot be multiplied"):
            torch.compile(lambda a, b: a @ b, backend="tpu")(torch.ones(2, 3, device="tpu"),
                                                              torch.ones(4, 5, device="tpu"))
    finally:
        log.disabled = False
    table = torch.randn(6, 4, device="tpu")
    bad = torch.tensor([1, 7], device="tpu")   # out of range: found by the kernel, not at trace time
    with pytest.raises(RuntimeError, match="out of range") as err:   # (as in eager code: found on the device)
        _gather_rows_c(table, bad).cpu()
    if eager_mode == "debug":   # raised at the graph's end, noted with the function compiled
        assert any("_gather_rows (" in n for n in getattr(err.value, "__notes__", [])), err.value
    assert torch_tpu.get_eager_mode() == eager_mode
    good = torch.tensor([1, 5], device="tpu")
    assert torch.equal(_gather_rows_c(table, good).cpu(), _gather_rows(table, good).cpu())


def test_compile_stats_name_the_function_and_count_recompiles():
    def scaled(x, k):
        return x * k

    torch._dynamo.reset()   # (the earlier modes' run compiled this code already)
    fn = torch.compile(scaled, backend="tpu", dynamic=False)
    torch_tpu.reset_compile_stats()
    x = torch.ones(4, device="tpu")
    fn(x, 2)
    fn(x, 3)   # a new constant: a guard fails, Dynamo compiles again
    st = torch_tpu.compile_stats()
    name = next(k for k in st["per_function"] if k.startswith("scaled ("))
    assert st["per_function"][name] == 2 and st["recompiles"] == 1
    assert st["graph_calls"] == 2 and st["inference_graphs"] == 2


# ---- ops through compile (a subset of OpInfo's database) ----

_OPS = ["add", "mul", "div", "exp", "log", "tanh", "sigmoid", "softmax", "log_softmax", "nn.functional.gelu",
        "nn.functional.silu", "nn.functional.layer_norm", "sum", "mean", "amax", "matmul", "where", "clamp",
        "nn.functional.relu", "pow", "rsqrt", "nn.functional.embedding", "cumsum", "var"]


def _opinfos():
    from torch.testing._internal.common_methods_invocations import op_db

    by_name = {}
    for o in op_db:   # the plain OpInfo of each name, else its first variant (div has only variants)
        if o.name in _OPS and (o.name not in by_name or (by_name[o.name].variant_test_name and
                                                         not o.variant_test_name)):
            by_name[o.name] = o
    assert set(by_name) == set(_OPS), set(_OPS) - set(by_name)
    return [by_name[n] for n in _OPS]


@pytest.mark.mode_independent
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opinfo_subset_through_compile(dtype):
    torch_tpu.reset_fallback_counts()
    checked = 0
    for op in _opinfos():
        if dtype not in op.supported_dtypes("cpu"):
            continue
        for s in list(op.sample_inputs("tpu", dtype, requires_grad=False))[:2 if dtype == torch.float32 else 1]:
            def fn(inp, *args, _op=op, _kw=s.kwargs):
                return _op(inp, *args, **_kw)

            ref = fn(s.input, *s.args)
            torch._dynamo.reset()
            out = torch.compile(fn, backend="tpu")(s.input, *s.args)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, equal_nan=True,
                                       msg=lambda m, _o=op.name: f"{_o}: {m}")
            checked += 1
    assert checked >= (40 if dtype == torch.float32 else 20)
    assert torch_tpu.fallback_counts() == {}
