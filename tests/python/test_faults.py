"""Reliability: the defects a new user hit, kept as a suite (issue 6).

Parameter identity across devices (tied weights), memory safety (no path
touches bytes outside a storage), errors raised where and as PyTorch raises
them, memory formats of results, ranks up to PyTorch's limit, fallbacks that
were promised, OOM in the middle of a training step, a corrupt checkpoint.
Streams/events, configuration, dtype rules, random ranges and RNN cells have
their own files (test_streams, test_config, test_dtypes, test_random,
test_rnn). Every test runs in each eager mode (conftest)."""
import copy
import io
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_tpu

from conftest import assert_close

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_MODE_ENV = {"debug": {"TORCH_TPU_LAUNCH_BLOCKING": "1"}, "fused": {"TORCH_TPU_DEFER_AND_FUSE": "1"}}


def run_py(code, env=None, timeout=120):
    e = dict(os.environ)
    e.update(_MODE_ENV.get(torch_tpu.get_eager_mode(), {}))   # the child runs in this test's eager mode
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=timeout,
                          cwd=ROOT)


# ---------------------------------------------------------------- 0. tied weights

def tied_model():
    torch.manual_seed(0)
    e = nn.Embedding(10, 4)
    l = nn.Linear(4, 10, bias=False)
    l.weight = e.weight
    return nn.ModuleDict(dict(e=e, l=l))


def test_to_keeps_parameter_identity():
    m = tied_model()
    w = m.e.weight
    m.to("tpu")
    assert m.e.weight is m.l.weight, "Module.to('tpu') untied shared parameters"
    assert m.e.weight is w, "the Parameter object must survive the move, as on CUDA"
    assert m.e.weight.device.type == "tpu"
    m.cpu()
    assert m.e.weight is m.l.weight and m.e.weight is w and m.e.weight.device.type == "cpu"
    # A gradient moves with its parameter, and stays tied too.
    m.e.weight.grad = torch.ones(10, 4)
    m.tpu()
    assert m.e.weight.grad.device.type == "tpu" and m.e.weight is m.l.weight
    # The optimizer built before the move sees the moved parameter.
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    assert opt.param_groups[0]["params"][0] is m.e.weight
    assert len(list(m.parameters())) == 1


def test_shallow_copy_compatibility_mirrors_cuda():
    c, t = torch.ones(2), torch.ones(2, device="tpu")
    assert torch._has_compatible_shallow_copy_type(c, t)
    assert torch._has_compatible_shallow_copy_type(t, c)
    assert torch._has_compatible_shallow_copy_type(t, t)
    assert not torch._has_compatible_shallow_copy_type(t, torch.ones(2).to_sparse())
    p = nn.Parameter(torch.ones(3, device="tpu"))
    p.data = torch.zeros(3)             # works on CUDA too: p moves to the CPU, identity kept
    assert p.device.type == "cpu" and p.sum().item() == 0


def train_steps(model, device, steps, lr=0.05):
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    torch.manual_seed(1)
    x = torch.randint(0, 10, (8,))
    losses = []
    for _ in range(steps):
        logits = model.l(model.e(x.to(device)))
        loss = F.cross_entropy(logits, x.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return model, losses


def test_tied_training_matches_cpu():
    mc, lc = train_steps(tied_model(), "cpu", 5)
    mt, lt = train_steps(tied_model(), "tpu", 5)
    assert mt.e.weight is mt.l.weight
    torch.testing.assert_close(torch.tensor(lt), torch.tensor(lc), rtol=1e-4, atol=1e-5)
    assert_close(mt.e.weight.detach(), mc.e.weight.detach(), rtol=1e-4, atol=1e-5)


def test_transformers_tied_lm_head_trains_like_cpu():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                  tie_word_embeddings=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    ref = transformers.GPT2LMHeadModel(cfg)
    dev = copy.deepcopy(ref)
    ids = torch.randint(0, 64, (2, 12))
    out = {}
    for name, model, device in (("cpu", ref, "cpu"), ("tpu", dev, "tpu")):
        model.to(device)
        assert model.lm_head.weight is model.transformer.wte.weight, f"{name}: lm_head untied"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(3):
            loss = model(ids.to(device), labels=ids.to(device)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        out[name] = (losses, model.transformer.wte.weight.detach().cpu())
    torch.testing.assert_close(torch.tensor(out["tpu"][0]), torch.tensor(out["cpu"][0]), rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(out["tpu"][1], out["cpu"][1], rtol=1e-3, atol=1e-4)


def test_move_between_chips_keeps_identity():
    r = run_py("""
import torch, torch.nn as nn
e = nn.Embedding(10, 4); l = nn.Linear(4, 10, bias=False); l.weight = e.weight
m = nn.ModuleDict(dict(e=e, l=l)).to('tpu:0'); w = m.e.weight
m.to('tpu:1')
assert m.e.weight is m.l.weight and m.e.weight is w and w.device == torch.device('tpu:1'), w.device
print('ok')
""", env={"TPU_NUM_DEVICES": "2"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


# ---------------------------------------------------------------- 1. memory safety

def test_set_grows_the_storage_like_cpu():
    src = torch.arange(10.)
    c = torch.empty(0).set_(src.untyped_storage(), 8, (5,), (1,))
    s = torch.arange(10., device="tpu")
    t = torch.empty(0, device="tpu").set_(s.untyped_storage(), 8, (5,), (1,))
    assert t.untyped_storage().nbytes() == c.untyped_storage().nbytes() == 52
    assert t[:2].cpu().tolist() == [8.0, 9.0]
    t[2:] = 1.0                          # the grown part is writable, in bounds
    assert t.cpu().tolist() == [8.0, 9.0, 1.0, 1.0, 1.0]
    with pytest.raises(RuntimeError):
        torch.empty(0, device="tpu").set_(s.untyped_storage(), -1, (5,), (1,))
    with pytest.raises(RuntimeError):
        torch.empty(0, device="tpu").set_(s.untyped_storage(), 0, (5,), (1, 1))


def shrunk_views():
    u = torch.zeros(4096, device="tpu")
    v = u[2048:]
    keep = torch.full((64,), 3.0, device="tpu")   # a neighbour that must not change
    u.untyped_storage().resize_(64)
    return u, v, keep


@pytest.mark.parametrize("how", ["copy_h2d", "copy_d2d", "cpu", "item", "add", "fill", "inplace", "clone", "sum"])
def test_views_past_a_shrunk_storage_raise(how):
    u, v, keep = shrunk_views()
    ops = {
        "copy_h2d": lambda: v.copy_(torch.full((2048,), 7.)),
        "copy_d2d": lambda: v.copy_(torch.full((2048,), 7., device="tpu")),
        "cpu": lambda: v.cpu(),
        "item": lambda: v[5].item(),
        "add": lambda: v + 1,
        "fill": lambda: v.fill_(7.0),
        "inplace": lambda: v.mul_(2),
        "clone": lambda: v.clone(),
        "sum": lambda: v.sum(),
    }
    with pytest.raises(RuntimeError, match="outside its storage|out of bounds for storage"):
        ops[how]()
        torch.tpu.synchronize()
    assert keep.cpu().eq(3.0).all()
    # The device keeps working, and the storage's own bytes are intact.
    assert u.untyped_storage().nbytes() == 64
    assert (torch.ones(3, device="tpu") * 2).sum().item() == 6.0


def test_freed_storage_is_not_reachable():
    # A tensor whose storage was resized to 0 has no memory to read.
    u = torch.ones(16, device="tpu")
    v = u[4:]
    u.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError):
        v.cpu()


# ---------------------------------------------------------------- 2. errors as PyTorch raises them

MISMATCH = [
    ("matmul", lambda a, b: a @ b),
    ("mm", lambda a, b: torch.mm(a, b)),
    ("bmm", lambda a, b: torch.bmm(a.unsqueeze(0), b.unsqueeze(0))),
    ("linear", lambda a, b: F.linear(a, b)),
    ("addmm", lambda a, b: torch.addmm(a, a, b)),
    ("index_select", lambda a, b: torch.index_select(a, 0, torch.tensor([0], device=b.device))),
    ("gather", lambda a, b: torch.gather(a, 0, torch.zeros(2, 3, dtype=torch.long, device=b.device))),
    ("embedding", lambda a, b: F.embedding(torch.tensor([0], device=b.device), a)),
    ("cross_entropy", lambda a, b: F.cross_entropy(a, torch.tensor([0, 1, 2], device=b.device))),
    ("add", lambda a, b: a + b),
    ("where", lambda a, b: torch.where(a > 0, a, b)),
]


@pytest.mark.parametrize("name,fn", MISMATCH, ids=[m[0] for m in MISMATCH])
def test_device_mismatch_is_runtime_error(name, fn):
    a = torch.randn(3, 3, device="tpu")
    b = torch.randn(3, 3)
    for x, y in ((a, b), (b.to("tpu"), a.cpu())):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device") as ei:
            fn(x, y)
        assert not isinstance(ei.value, ValueError)


def test_device_mismatch_between_chips():
    r = run_py("""
import torch, torch.nn.functional as F
a = torch.randn(3, 3, device='tpu:0'); b = torch.randn(3, 3, device='tpu:1')
for f in (lambda: a @ b, lambda: a + b, lambda: F.linear(a, b), lambda: torch.index_select(a, 0, torch.tensor([0], device='tpu:1'))):
    try:
        f(); torch.tpu.synchronize(); print('no error')
    except RuntimeError as e:
        assert type(e) is RuntimeError and 'same device' in str(e), (type(e), e)
print('ok')
""", env={"TPU_NUM_DEVICES": "2"})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok") and "no error" not in r.stdout, r.stdout + r.stderr[-2000:]


@pytest.mark.parametrize("shape", [(1,), (1, 1), (1, 1, 1), ()])
def test_item_of_one_element_tensors(shape):
    for dt in (torch.float32, torch.int64, torch.bool, torch.bfloat16):
        c = torch.ones(shape, dtype=dt)
        t = c.to("tpu")
        assert t.item() == c.item()
        assert float(t) == float(c) and int(t) == int(c) and bool(t) == bool(c)
    with pytest.raises(RuntimeError, match="a Tensor with 2 elements cannot be converted to Scalar"):
        torch.ones(2, device="tpu").item()
    with pytest.raises(RuntimeError, match="a Tensor with 0 elements cannot be converted to Scalar"):
        torch.ones(0, device="tpu").item()


def test_empty_index_of_any_integer_dtype():
    x = torch.randn(4, 5)
    for dt in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        e = torch.empty(0, 5, dtype=dt)
        assert_close(torch.gather(x.to("tpu"), 0, e.to("tpu")), torch.gather(x, 0, e))
        assert_close(x.to("tpu").scatter_add(0, e.to("tpu"), torch.empty(0, 5, device="tpu")),
                     x.scatter_add(0, e, torch.empty(0, 5)))
    # Non-empty indices of the wrong dtype still raise as on CPU.
    for fn in (lambda d: torch.gather(x.to(d), 0, torch.zeros(1, 5, dtype=torch.uint8, device=d)),
               lambda d: torch.index_select(x.to(d), 0, torch.zeros(1, dtype=torch.int16, device=d)),
               lambda d: torch.index_select(x.to(d), 0, torch.empty(0, dtype=torch.uint8, device=d))):
        with pytest.raises(RuntimeError) as cpu_err:
            fn("cpu")
        with pytest.raises(RuntimeError) as tpu_err:
            fn("tpu")
        assert str(tpu_err.value).split("\n")[0] == str(cpu_err.value).split("\n")[0]


@pytest.mark.parametrize("nd", [9, 12, 25])
def test_high_rank_tensors(nd):
    torch.manual_seed(0)
    shape = [2 if d % 3 == 0 else 1 for d in range(nd)]
    shape[-1] = 3
    x = torch.randn(shape)
    t = x.to("tpu")
    assert_close(t + 1, x + 1)
    assert_close(t * t.exp(), x * x.exp())
    assert_close(t.sum(dim=0), x.sum(dim=0))
    assert_close(t.sum(), x.sum(), rtol=1e-5, atol=1e-5)
    assert_close(t.amax(dim=(0, nd - 1)), x.amax(dim=(0, nd - 1)))
    perm = list(reversed(range(nd)))
    assert_close(t.permute(*perm).contiguous(), x.permute(*perm).contiguous())
    torch.testing.assert_close(t.permute(*perm).cpu(), x.permute(*perm))
    assert_close(torch.where(t > 0, t, 0.0), torch.where(x > 0, x, 0.0))
    y = torch.randn([2] * nd if nd <= 12 else [1] * (nd - 2) + [4, 4])
    assert_close(y.to("tpu").transpose(0, -1).contiguous(), y.transpose(0, -1).contiguous())


def test_rank_beyond_the_limit_is_a_clear_error():
    x = torch.ones([1] * 26)
    with pytest.raises(RuntimeError, match="at most 25 dims"):
        x.to("tpu").add(1)


# ---------------------------------------------------------------- memory formats

UNARY_LAYOUT = ["abs", "neg", "exp", "sigmoid", "relu", "isnan", "logical_not", "sgn", "signbit", "lgamma",
                "digamma", "sin", "floor", "sign", "bitwise_not", "isinf", "nan_to_num", "square", "sqrt"]


@pytest.mark.parametrize("name", UNARY_LAYOUT)
def test_unary_results_keep_the_input_layout(name):
    base = torch.randn(3, 4, 5)
    if name == "bitwise_not":
        base = torch.randint(-5, 5, (3, 4, 5))
    for view in (lambda t: t.transpose(0, 2), lambda t: t.permute(1, 2, 0), lambda t: t[:, :, ::2]):
        c = view(base)
        t = view(base.to("tpu"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rc, rt = getattr(torch, name)(c), getattr(torch, name)(t)
        assert rt.stride() == rc.stride(), f"{name}: strides {rt.stride()} vs CPU {rc.stride()}"
        assert_close(rt, rc, rtol=1e-5, atol=1e-5)


def test_binary_and_ternary_results_keep_the_layout():
    a = torch.randn(4, 6).t()
    b = torch.randn(6, 4)
    cases = [
        lambda x, y: x + y, lambda x, y: x * 2, lambda x, y: torch.where(x > 0, x, y),
        lambda x, y: F.hardtanh(x), lambda x, y: torch.clamp(x, -0.5, 0.5), lambda x, y: torch.maximum(x, x),
        lambda x, y: x > y, lambda x, y: torch.lerp(x, x, 0.3), lambda x, y: x.masked_fill(x > 0, 1.0),
        lambda x, y: F.gelu(x), lambda x, y: F.leaky_relu(x), lambda x, y: x + torch.randn(1, 4).to(x.device),
    ]
    for i, f in enumerate(cases):
        rc, rt = f(a, b), f(a.to("tpu"), b.to("tpu"))
        assert rt.stride() == rc.stride(), f"case {i}: strides {rt.stride()} vs CPU {rc.stride()}"
    # The original report: this works on CPU.
    x = torch.randn(4, 3, device="tpu").t()
    assert x.abs().t().view(-1).shape == (12,)
    # An out= tensor of the right shape keeps its own layout.
    out = torch.empty(4, 6, device="tpu").t()
    torch.abs(a.to("tpu"), out=out)
    assert out.stride() == (1, 6)


# ---------------------------------------------------------------- OOM mid-step, corrupt checkpoints

def test_oom_in_the_middle_of_a_training_step_recovers():
    r = run_py("""
import torch, torch.nn as nn
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to('tpu')
opt = torch.optim.AdamW(m.parameters())
def step(bs):
    x = torch.randn(bs, 256, device='tpu'); y = torch.randint(0, 10, (bs,), device='tpu')
    loss = nn.functional.cross_entropy(m(x), y); loss.backward(); opt.step(); opt.zero_grad()
    return loss.item()
step(32)
base = torch.tpu.memory_allocated()
try:
    step(200000)   # activations do not fit in 64 MiB
    raise SystemExit('no OOM')
except torch.OutOfMemoryError as e:
    assert 'Tried to allocate' in str(e), e
opt.zero_grad()
import gc; gc.collect()
assert torch.tpu.memory_allocated() == base, (torch.tpu.memory_allocated(), base)
for _ in range(3): l = step(32)
assert l == l
print('ok')
""", env={"TPU_HBM_BYTES": str(64 << 20)})
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr[-3000:]


def test_corrupt_checkpoint_raises_and_device_keeps_working(tmp_path):
    m = nn.Linear(4, 3).to("tpu")
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    data = bytearray(buf.getvalue())
    for cut in (len(data) // 2, 40):
        with pytest.raises(Exception):
            torch.load(io.BytesIO(bytes(data[:cut])), map_location="tpu", weights_only=True)
    flipped = bytearray(data)
    for i in range(len(flipped) // 3, len(flipped) // 3 + 64):
        flipped[i] ^= 0xFF
    try:
        sd = torch.load(io.BytesIO(bytes(flipped)), map_location="tpu", weights_only=True)
        m.load_state_dict(sd)   # a flip inside the tensor bytes may still load: values, not safety
    except Exception:
        pass
    assert (torch.ones(2, device="tpu") + 1).sum().item() == 4.0


def test_clamp_integer_bounds_convert_like_cpu():
    x = torch.arange(5, dtype=torch.uint8)
    assert_close(torch.clamp(x.to("tpu"), -1, 2), torch.clamp(x, -1, 2))      # -1 wraps to 255 for uint8
    assert_close(torch.clamp(x.to("tpu"), min=1), torch.clamp(x, min=1))
    y = torch.arange(-4, 5, dtype=torch.int32)
    assert_close(torch.clamp(y.to("tpu"), -2, 3), torch.clamp(y, -2, 3))
    with pytest.raises(RuntimeError, match="overflow"):
        torch.clamp(torch.arange(5, dtype=torch.int8).to("tpu"), -200, 100)
