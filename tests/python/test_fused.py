"""Fused Eager (DeferAndFuse): results equal Strict Eager's, bit for bit for
elementwise work; dead intermediates never take device memory; flush points;
errors inside a window; the mode and introspection API. (The shared fixture
also runs every other test of the suite in Fused Eager.)"""
import os
import subprocess
import sys

import pytest
import torch
import torch_tpu


def run_in(mode, fn, *args):
    with torch_tpu.eager_mode(mode):
        out = fn(*args)
        torch_tpu.synchronize()
    return out


def _chain(x, b):
    y = x * 2 + b            # broadcast bias
    y = torch.sigmoid(y) - 0.25
    y.mul_(x)                # in place
    z = y.to(torch.bfloat16)  # cast
    z = z * z + 1
    w = torch.where(y > 0, y, -y).exp()
    return z, w, y[::2, 1:]   # a view of a result


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_chain_equals_strict_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 129, generator=g).to(dtype).to("tpu")
    b = torch.randn(129, generator=g).to(dtype).to("tpu")
    strict = [t.cpu() for t in run_in("strict", _chain, x, b)]
    fused = [t.cpu() for t in run_in("fused", _chain, x, b)]
    for s, f in zip(strict, fused):
        assert s.dtype == f.dtype and s.shape == f.shape
        assert torch.equal(s.view(torch.uint8) if s.dtype != torch.bool else s,
                           f.view(torch.uint8) if f.dtype != torch.bool else f)


def _aliasing(x, y):
    a = x[1:]                # a view one element in: unaligned in-place loads
    b = a * 2 + y[1:]        # loads read in place, b's store computed into memory
    c = b.exp() - a          # b read back from where it was computed
    x.mul_(0.5)              # a store to the storage the group also loads (x, a)
    d = a + c                # reads x after the store: the new values
    y[::2].add_(1)           # an in-place store over a strided view of y
    e = y[1:] * b            # y's storage both loaded and stored in one window
    f = b.clone()
    f.add_(b)                # f loaded and stored; b only loaded
    u = torch.exp(f)
    f.mul_(2)                # one group loads f, stores f in place, reads the new f
    v = u + f
    return x, y, b, c, d, e, f, u, v


@pytest.mark.parametrize("n", [256 * 8 + 1, 1024 * 6 + 1, 4099])
def test_in_place_tile_reads_and_writes_equal_strict(n):
    """The interpreter reads float32 tiles in place and computes stores straight
    into memory where no other operand of the group shares their storage (the
    planner already keeps overlapping views apart): full and partial tiles,
    unaligned views, in-place stores over loaded storages, results read back."""
    g = torch.Generator().manual_seed(n)
    x0, y0 = torch.randn(n, generator=g), torch.randn(n, generator=g)
    outs = {}
    for mode in ("strict", "fused"):
        x, y = x0.to("tpu"), y0.to("tpu")
        outs[mode] = [t.cpu() for t in run_in(mode, _aliasing, x, y)]
    for s, f in zip(outs["strict"], outs["fused"]):
        assert torch.equal(s.view(torch.int32), f.view(torch.int32))


def test_torchtpu_demo_loop_fuses_into_one_pass():
    """TorchTPU's eager-mode demo: x + 1, x * 2, x - 1 in a loop, then a sync."""
    x0 = torch.randn(300, 300).to(torch.bfloat16)
    with torch_tpu.eager_mode("fused"):
        torch_tpu.reset_fused_stats()
        x = x0.to("tpu")
        for _ in range(50):
            x = x + 1
            x = x * 2
            x = x - 1
        assert not torch_tpu.is_materialized(x)
        torch_tpu.synchronize(x)
        assert torch_tpu.is_materialized(x)
        st = torch_tpu.fused_stats()
    ref = x0
    for _ in range(50):
        ref = ((ref + 1) * 2) - 1
    assert torch.equal(x.cpu(), ref)
    assert st["ops_recorded"] == 150 and st["ops_fused"] == 150 and st["fused_groups_run"] == 1
    assert st["results_never_stored"] == 149
    assert st["bytes_never_materialized"] >= 149 * 300 * 300 * 2
    assert st["flushes"]["explicit"] == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chain_over_a_16_bit_tensor_runs_as_a_table(dtype):
    """A long chain over one bf16/f16 tensor with scalar operands runs as a
    lookup table (every possible input computed once, then one pass): the
    bits equal Strict's and the CPU's; TORCH_TPU_FUSED_TABLES=0 is checked
    in the C tests. Inputs include NaN, inf, -0 and subnormals."""
    g = torch.Generator().manual_seed(1)
    x0 = (torch.randn(600, 500, generator=g) * 3).to(dtype)
    x0.view(-1)[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, 6e-8]).to(dtype)

    def chain(x):
        for _ in range(4):
            x = torch.sigmoid(x * 1.5 - 0.3) * 4 - 2
        return x, (x > 0.5), x.float().exp()

    with torch_tpu.eager_mode("fused"):
        torch_tpu.reset_fused_stats()
        fused = [t.cpu() for t in chain(x0.to("tpu"))]
        tables = torch_tpu.fused_stats()["groups_by_table"]
    strict = [t.cpu() for t in run_in("strict", chain, x0.to("tpu"))]
    cpu = chain(x0)
    for f, s, c in zip(fused, strict, cpu):
        assert torch.equal(f.view(torch.uint8), s.view(torch.uint8))
        exact = c.dtype != torch.float32  # (float32 exp: within an ulp of the CPU's)
        torch.testing.assert_close(f, c, atol=0 if exact else None, rtol=0 if exact else None, equal_nan=True)
    assert tables == 1


def test_in_place_chain_over_its_own_input_runs_as_a_table():
    """The table's input and its result are one storage (in-place ops on a
    materialized bf16 tensor): every element read before it is written."""
    x0 = torch.linspace(-6, 6, 700 * 400).reshape(700, 400).to(torch.bfloat16)
    with torch_tpu.eager_mode("fused"):
        y = x0.to("tpu")
        torch_tpu.synchronize()
        torch_tpu.reset_fused_stats()
        y.mul_(1.5).sub_(0.3).sigmoid_().mul_(3)
        torch_tpu.synchronize()
        tables = torch_tpu.fused_stats()["groups_by_table"]
    assert torch.equal(y.cpu(), x0.mul(1.5).sub(0.3).sigmoid().mul(3))
    assert tables == 1


class _RMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm, verbatim in its arithmetic."""

    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, n))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_reductions_fuse_with_their_producers(dtype):
    """A sum / mean / max / min over the last dim of a value computed in a
    fused group folds the group's rows as the kernel folds memory: the same
    bits as Strict, and the folded value is never stored (RMSNorm's pow)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 33, 512, generator=g).to(dtype)
    norm = _RMSNorm(512)

    def run(mode):
        with torch_tpu.eager_mode(mode):
            torch_tpu.reset_fused_stats()
            xt, m = x.to("tpu"), _RMSNorm(512).to("tpu")
            m.load_state_dict(norm.state_dict())
            torch_tpu.synchronize()
            torch_tpu.reset_fused_stats()
            y = m(xt)
            torch_tpu.synchronize(y)
            st = torch_tpu.fused_stats()
            s = (xt * 2 - 1).exp().sum(-1)
            mx = torch.sigmoid(xt).amax(-1, keepdim=True)
            e = (xt - mx).exp()
            sm = e / e.sum(-1, keepdim=True)  # softmax by hand: row values read back over the row
            out = [y.cpu(), s.cpu(), mx.cpu(), sm.cpu()]
            return out, st

    strict, _ = run("strict")
    fused, st = run("fused")
    for a, b in zip(strict, fused):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    # (against the CPU module: its mean accumulates in float, ours in double as the Strict kernel does, so
    # the normalized values may round one ulp apart - 2^-7 relative in bf16 - before the product by weight)
    torch.testing.assert_close(fused[0], norm(x), rtol=0.02 if dtype == torch.bfloat16 else 1e-5, atol=1e-5)
    # the whole RMSNorm (casts, pow, mean, + eps, rsqrt, the two products) is one pass over x
    assert st["fused_groups_run"] == 1 and st["kernels_run"] == 0 and st["ops_fused"] == st["ops_recorded"]


def _run_counted(seed, fn):
    """fn() from a seeded generator after a sync, its result synchronized: (result, fused_stats of fn alone)."""
    torch.manual_seed(seed)
    torch_tpu.synchronize()
    torch_tpu.reset_fused_stats()
    y = fn()
    torch_tpu.synchronize(y)
    return y, torch_tpu.fused_stats()


def _strict_then_fused_same_bits(run, train):
    """run(mode, train) -> (tensors, fused_stats) in Strict, then in Fused: the same bits; Fused's pair."""
    strict, _ = run("strict", train)
    fused, st = run("fused", train)
    assert len(strict) == len(fused)
    for a, b in zip(strict, fused):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return fused, st


def _ln_block(x, bias, res, ln, p_drop):
    h = torch.nn.functional.gelu(x + bias)
    h = torch.nn.functional.dropout(h, p=p_drop, training=p_drop > 0)
    return ln(h + res) * 0.5 + 1   # a consumer of y in the same pass


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_fuses_with_producers_and_consumers(dtype, affine):
    """layer_norm over the last dim runs inside the group that computes its
    input, on the rows it holds, with the kernel's own row function: y, and
    the mean / rstd autograd saves, equal Strict's bit for bit (forward and
    backward), and its input (h + res) is never stored in inference."""
    g = torch.Generator().manual_seed(5)
    H = 384
    x, res = torch.randn(3, 17, H, generator=g).to(dtype), torch.randn(3, 17, H, generator=g).to(dtype)
    bias, gy = torch.randn(H, generator=g).to(dtype), torch.randn(3, 17, H, generator=g).to(dtype)
    ln0 = torch.nn.LayerNorm(H, elementwise_affine=affine, dtype=dtype)
    if affine:
        with torch.no_grad():
            ln0.weight.copy_(torch.randn(H, generator=g))
            ln0.bias.copy_(torch.randn(H, generator=g))

    def run(mode, train):
        with torch_tpu.eager_mode(mode):
            ln = torch.nn.LayerNorm(H, elementwise_affine=affine, device="tpu", dtype=dtype)
            ln.load_state_dict(ln0.state_dict())
            xt, rt, bt = (t.to("tpu").requires_grad_(train) for t in (x, res, bias))
            y, st = _run_counted(7, lambda: _ln_block(xt, bt, rt, ln, 0.1 if train else 0.0))
            out = [y.detach().cpu()]
            if train:
                y.backward(gy.to("tpu"))
                out += [xt.grad.cpu(), rt.grad.cpu(), bt.grad.cpu()]
                out += [p.grad.cpu() for p in ln.parameters()]
            return out, st

    for train in (True, False):
        fused, st = _strict_then_fused_same_bits(run, train)
        assert st["kernels_run"] == 0 and st["ops_fused"] == st["ops_recorded"]
    assert st["fused_groups_run"] == 1  # inference: one pass, x, bias, res and the weights in, y out
    ref = _ln_block(x.float(), bias.float(), res.float(), ln0.float(), 0.0)
    tol = dict(rtol=0.02, atol=0.05) if dtype != torch.float32 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused[0].float(), ref, **tol)


def _attention(q, k, v, mask, p_drop):
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5 + mask
    a = torch.softmax(s, -1)
    a = torch.nn.functional.dropout(a, p_drop, training=p_drop > 0)
    return a @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_softmax_fuses_with_producers_and_consumers(dtype):
    """softmax / log_softmax over the last dim (and their backwards) run
    inside the group of their producers and consumers, through the kernel's
    row function: attention's scale + mask + softmax + dropout is one pass
    between its two matmuls, and cross-entropy's log_softmax joins its
    producers; values and gradients equal Strict's bit for bit."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 3, 96, 64, generator=g).to(dtype) for _ in range(3))
    mask = torch.where(torch.rand(96, 96, generator=g) < 0.2, -1e4, 0.0).to(dtype)
    logits, tgt = torch.randn(50, 200, generator=g).to(dtype), torch.randint(0, 200, (50,), generator=g)

    def run(mode, train):
        with torch_tpu.eager_mode(mode):
            qt, kt, vt, lt = (t.to("tpu").requires_grad_(train) for t in (q, k, v, logits))
            mt, tt = mask.to("tpu"), tgt.to("tpu")
            o, st = _run_counted(3, lambda: _attention(qt, kt, vt, mt, 0.1 if train else 0.0))
            lp = torch.log_softmax(lt * 2 - 1, -1)
            loss = torch.nn.functional.cross_entropy(lt.float() * 0.5, tt)
            out = [o.detach().cpu(), lp.detach().cpu(), loss.detach().cpu().reshape(1)]
            if train:
                (o.float().sum() + loss + lp.float().mean()).backward()
                out += [t.grad.cpu() for t in (qt, kt, vt, lt)]
            return out, st

    for train in (True, False):
        fused, st = _strict_then_fused_same_bits(run, train)
        assert st["kernels_run"] == 2 and st["fused_groups_run"] == 1  # the two matmuls, one group between
    ref = _attention(q.float(), k.float(), v.float(), mask.float(), 0.0)
    tol = dict(rtol=0.03, atol=0.03) if dtype != torch.float32 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fused[0].float(), ref, **tol)
    torch.testing.assert_close(fused[1].float(), torch.log_softmax(logits.float() * 2 - 1, -1), **tol)


@pytest.mark.parametrize("shape,nshape", [((4, 8, 16), (8, 16)), ((5, 40), (40,)), ((2, 3, 20000), (20000,))])
def test_layer_norm_shapes_the_group_cannot_hold_still_equal_strict(shape, nshape):
    """Over several dims, a short row or a row longer than a group holds: the
    kernel runs alone, with the same results."""
    x = torch.randn(*shape)
    w, b = torch.randn(*nshape), torch.randn(*nshape)

    def run(mode):
        with torch_tpu.eager_mode(mode):
            xt = x.to("tpu")
            y = torch.nn.functional.layer_norm(torch.tanh(xt), nshape, w.to("tpu"), b.to("tpu"))
            return y.cpu()

    assert torch.equal(run("strict"), run("fused"))


def test_dead_intermediates_lower_peak_memory():
    n = 1 << 18

    def work():
        x = torch.ones(n, device="tpu")
        torch_tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        base = torch.tpu.memory_allocated()
        y = x
        for _ in range(20):
            y = torch.tanh(y * 1.5 + 0.1)
        s = y.sum().item()
        return s, torch.tpu.max_memory_allocated() - base

    s_strict, peak_strict = run_in("strict", work)
    s_fused, peak_fused = run_in("fused", work)
    assert s_strict == s_fused
    assert peak_fused <= 2 * n * 4 + 4096 < peak_strict


def test_peak_counts_results_stored_then_freed():
    """A fused result that a kernel reads took memory even if it was freed before the flush."""
    with torch_tpu.eager_mode("fused"):
        x = torch.ones(512, 512, device="tpu")
        torch_tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        base = torch.tpu.memory_allocated()
        y = torch.tanh(x * 2)     # fused, stored: the matmul reads it
        z = y @ y
        del y
        assert z[0, 0].item() == pytest.approx(512 * torch.tanh(torch.tensor(2.0)).item() ** 2, rel=1e-5)
        peak = torch.tpu.max_memory_allocated() - base
    assert peak >= 2 * 512 * 512 * 4      # y and z existed at once
    del z


def test_peak_counts_kernel_results_alive_together():
    """Results of kernels (matmuls) alive at once inside a window count together in the
    peak, as in Strict, even when all are freed before the flush; the fused intermediates
    that never reach memory do not count."""
    def work():
        x = torch.ones(512, 512, device="tpu")
        torch_tpu.synchronize()
        torch.tpu.reset_peak_memory_stats()
        base = torch.tpu.memory_allocated()
        a, b, c = x @ x, x @ x, x @ x          # three 1 MiB kernel results alive together
        d = ((a + b).tanh() * 2 + c).sum()     # the chain's intermediates: never stored in Fused
        del a, b, c
        v = d.item()
        return v, torch.tpu.max_memory_allocated() - base

    v_strict, peak_strict = run_in("strict", work)
    v_fused, peak_fused = run_in("fused", work)
    assert v_strict == v_fused
    mib = 512 * 512 * 4  # Fused: a, b, c and the chain's result (the sum kernel reads it); Strict: its temporaries too
    assert 4 * mib <= peak_fused <= 4 * mib + 4096 < 5 * mib <= peak_strict


def test_memory_allocated_counts_what_is_alive():
    with torch_tpu.eager_mode("fused"):
        before = torch.tpu.memory_allocated()
        x = torch.empty(1 << 20, device="tpu")          # nothing writes it
        assert torch.tpu.memory_allocated() == before + 4 * (1 << 20)   # a stats query binds what is alive
        y = x.fill_(2) + 1
        assert not torch_tpu.is_materialized(y)
        assert torch.tpu.memory_allocated() == before + 8 * (1 << 20)
        assert torch_tpu.is_materialized(y)
        del x, y


def test_flush_points_by_cause():
    with torch_tpu.eager_mode("fused"):
        torch_tpu.reset_fused_stats()
        x = torch.arange(10.0, device="tpu") * 2
        assert x[3].item() == 6.0                       # copy to host
        y = x + 1
        assert y.tolist()[0] == 1.0
        z = y * 3
        torch.tpu.synchronize()                         # synchronize
        e = torch.tpu.Event()
        w = z - 1
        e.record()                                      # event
        e.synchronize()
        v = w + 2
        _ = repr(v)                                     # print/repr: a copy
        u = v * 0
        s = torch.tpu.Stream()
        s.wait_stream(torch.tpu.current_stream())       # an event recorded on the current stream
        st = torch_tpu.fused_stats()
    f = st["flushes"]
    assert f["copy"] >= 3 and f["synchronize"] >= 1 and f["event"] >= 2
    assert st["ops_recorded"] >= 7
    del u


def test_window_caps_ops_and_bytes():
    with torch_tpu.eager_mode("fused"):
        torch_tpu.reset_fused_stats()
        x = torch.zeros(8, device="tpu")
        for _ in range(5000):                           # more launches than a window holds
            x = x + 1
        assert torch_tpu.fused_stats()["flushes"]["window_full"] == 1
        assert x[0].item() == 5000
    # results recorded past four times the chip's memory (a 256 MiB chip here)
    code = """
import torch, torch_tpu
big = torch.zeros(16 << 20, device="tpu")       # 64 MiB per result
y = big
for _ in range(20):
    y = y + 1
print(torch_tpu.fused_stats()["flushes"]["window_bytes"], y[-1].item())
"""
    env = dict(os.environ, TORCH_TPU_DEFER_AND_FUSE="1", TPU_HBM_BYTES="256M")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "20.0"], out.stdout


@pytest.mark.parametrize("distinct", [1, 5, 100])
def test_chain_of_host_scalars_equals_strict(distinct):
    # constants of equal value share a tile slot; past a few the tiles get
    # shorter; past 64 distinct values the rest keep their own: all exact
    def chain():
        x = torch.linspace(-3, 3, 4099, device="tpu").to(torch.bfloat16)
        for k in range(120):
            x = x * (1 + (k % distinct) / 997) + (k % distinct) / 31
        return x.cpu()

    assert torch.equal(run_in("strict", chain), run_in("fused", chain))


def test_excess_precision():
    x = torch.linspace(-2, 2, 1000).to(torch.bfloat16)
    xf = x.to("tpu").float()

    def f():
        d = x.to("tpu")
        y = (d + 1e-3) * 3          # bf16 ops: rounded after each one unless excess precision
        y = y / 3 - 1e-3
        c = (xf * 3).to(torch.bfloat16)  # a cast rounds in either setting
        return y.cpu(), (c * 1).cpu()

    assert torch_tpu.get_allow_excess_precision() is False
    strict = run_in("strict", f)
    try:
        torch_tpu.set_allow_excess_precision(True)
        assert torch_tpu.get_allow_excess_precision() is True
        fused = run_in("fused", f)
    finally:
        torch_tpu.set_allow_excess_precision(False)
    want = (((x.float() + 1e-3) * 3) / 3 - 1e-3).to(torch.bfloat16)   # float32 throughout, rounded once
    assert torch.equal(fused[0], want)
    assert not torch.equal(strict[0], want)
    assert torch.equal(fused[1], strict[1])
    assert torch.equal(run_in("fused", f)[0], strict[0])   # off again: equal to Strict
    with pytest.raises(TypeError, match="must be bool"):
        torch_tpu.set_allow_excess_precision(1)


def test_mode_switch_flushes():
    with torch_tpu.eager_mode("fused"):
        torch_tpu.reset_fused_stats()
        x = torch.ones(100, device="tpu") + 1
        assert not torch_tpu.is_materialized(x)
        with torch_tpu.eager_mode("debug"):
            assert torch_tpu.fused_stats()["flushes"]["mode_switch"] == 1
            assert torch_tpu.is_materialized(x)
            assert x.sum().item() == 200


def test_random_ops_identical_in_every_mode():
    def draw():
        torch.manual_seed(1234)
        a = torch.rand(1000, device="tpu")
        b = torch.nn.functional.dropout(torch.ones(1000, device="tpu"), 0.3)
        c = torch.randn(64, device="tpu") * 2 + a[:64]
        return a.cpu(), b.cpu(), c.cpu()

    ref = run_in("strict", draw)
    for mode in ("debug", "fused"):
        got = run_in(mode, draw)
        for r, g in zip(ref, got):
            assert torch.equal(r, g), mode


def test_kernel_error_in_window_raises_at_flush_and_device_recovers():
    with torch_tpu.eager_mode("fused"):
        a = torch.arange(8, device="tpu")
        z = torch.tensor([1, 1, 0, 1, 1, 1, 1, 1], device="tpu")
        q = torch.div(a, z, rounding_mode="trunc")     # integer division by zero, recorded
        ok = torch.ones(8, device="tpu") * 3 + 1
        with pytest.raises(RuntimeError, match="div_trunc.*ZeroDivisionError"):
            torch_tpu.synchronize()
        assert ok.sum().item() == 32                    # the window's other work completed
        assert (torch.ones(3, device="tpu") * 2).tolist() == [2.0, 2.0, 2.0]
        del q


def _bad_lookup(emb, idx):
    return torch.nn.functional.embedding(idx, emb) * 2   # the line a failure must name


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_kernel_error_names_the_python_line(mode):
    import inspect
    line = inspect.getsourcelines(_bad_lookup)[1] + 1
    with torch_tpu.eager_mode(mode):
        emb = torch.randn(10, 4, device="tpu")
        y = _bad_lookup(emb, torch.tensor([1, 20, 3], device="tpu"))
        with pytest.raises(RuntimeError) as info:
            y.sum().item()
        msg = str(info.value)
        assert "index out of range in self" in msg
        assert f"(called at {__file__}:{line} in _bad_lookup)" in msg, msg
        assert (emb * 0).abs().sum().item() == 0        # the device keeps working


def test_autograd_in_place_checks_as_in_strict():
    with torch_tpu.eager_mode("fused"):
        x = torch.randn(10, device="tpu", requires_grad=True)
        y = x.exp()
        y.add_(1)                                        # exp saved its result: modified in place
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def _train(mode, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 4)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 32, generator=g)
    y = torch.randint(0, 4, (16,), generator=g)
    losses = []
    with torch_tpu.eager_mode(mode):
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(model(x.to("tpu")), y.to("tpu"))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        torch_tpu.synchronize()
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_training_equals_strict():
    ls, ps = _train("strict", steps=4)
    torch_tpu.reset_fused_stats()
    lf, pf = _train("fused", steps=4)
    st = torch_tpu.fused_stats()
    assert st["ops_fused"] > 0 and st["results_never_stored"] > 0
    assert st["plan_cache_hits"] >= 2, st        # the steps after the first reuse their plans
    assert ls == lf
    for a, b in zip(ps, pf):
        assert torch.equal(a, b)


def test_env_var_and_dump():
    code = ("import torch, torch_tpu\n"
            "assert torch_tpu.get_eager_mode() == 'fused'\n"
            "x = torch.ones(4, device='tpu')\n"
            "y = (x + 1) * 2\n"
            "print(y.tolist())\n")
    env = dict(os.environ, TORCH_TPU_DEFER_AND_FUSE="1", TORCH_TPU_FUSED_DUMP="1")
    env.pop("TORCH_TPU_LAUNCH_BLOCKING", None)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "[4.0, 4.0, 4.0, 4.0]" in p.stdout
    assert "tpu fused window" in p.stderr and "fused" in p.stderr and "dead" in p.stderr


def test_api_argument_errors():
    with pytest.raises(TypeError):
        torch_tpu.is_materialized([1, 2])
    with pytest.raises(TypeError):
        torch_tpu.synchronize([1])
    with pytest.raises(RuntimeError, match="expected a tpu tensor"):
        torch_tpu.is_materialized(torch.ones(2))


# ---- recomputation (runtime/src/vtpu/remat.c) ----

class _remat:
    """Fused Eager's recomputation at `distance` for a block (restored after)."""

    def __init__(self, distance):
        self.d = distance

    def __enter__(self):
        self.old = torch_tpu.get_fused_remat()
        torch_tpu.set_fused_remat(self.d)

    def __exit__(self, *exc):
        torch_tpu.set_fused_remat(self.old)


def _gelu_new(x):  # transformers' NewGELUActivation: four products of x saved by autograd
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def _mlp_step(seed=0):
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(64, 256, generator=g).div(8).to("tpu").requires_grad_()
    w2 = torch.randn(256, 64, generator=g).div(16).to("tpu").requires_grad_()
    x = torch.randn(128, 64, generator=g).to("tpu")
    torch_tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    h = x @ w1
    y = torch.nn.functional.dropout(_gelu_new(h), 0.1, training=True) @ w2
    loss = (y * y).mean()
    loss.backward()
    out = [loss.detach().cpu(), w1.grad.cpu(), w2.grad.cpu()]
    return out, torch.tpu.max_memory_allocated() - base


def test_recomputation_keeps_saved_activations_out_of_memory():
    """A tanh-GELU + dropout between two matmuls, forward and backward in one window:
    with recomputation the GELU's saved products and the dropout's mask are recomputed
    from the matmul's result where the backward (and the second matmul) read them, never
    stored (the dropout's output, which would need its Philox numbers drawn again for the
    matmul, is stored); the gradients equal Strict's bit for bit."""
    torch.manual_seed(0)
    with torch_tpu.eager_mode("strict"):
        ref, peak_strict = _mlp_step()
    runs = {}
    for d in (0, 16):
        with _remat(d), torch_tpu.eager_mode("fused"):
            torch.manual_seed(0)
            torch_tpu.reset_fused_stats()
            runs[d] = _mlp_step()
            torch_tpu.synchronize()
            runs[d] += (torch_tpu.fused_stats(),)
    for d, (out, peak, st) in runs.items():
        for a, b in zip(ref, out):
            assert torch.equal(a, b), d
    (_, peak_off, st_off), (_, peak_on, st_on) = runs[0], runs[16]
    assert st_off["remat_reads"] == 0 and st_on["remat_reads"] >= 5 and st_on["remat_ops"] >= st_on["remat_reads"]
    act = 128 * 256 * 4
    assert peak_on <= peak_off - 3 * act, (peak_strict, peak_off, peak_on)


def _views_and_writes():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(33, 70, generator=g).to("tpu")
    b = torch.randn(70, generator=g).to(torch.bfloat16).to("tpu")
    m = torch.randn(70, 70, generator=g).to("tpu")
    t = torch.sigmoid(x * 2 + b)          # recipe: leaves x, b (cast, broadcast)
    u = (t.to(torch.bfloat16) * 3).exp()  # a chain through a cast
    v = torch.tanh(x) + 1
    v.mul_(0.5)                           # in place on a value with a recipe
    w = x.clone()
    w.add_(1)                             # a leaf that changes: its readers' recipes are void
    k = torch.relu(w) * 2
    w[::2].mul_(3)                        # a partial write after k was computed
    p = torch.cos(x)
    p[:, 5:].zero_()                      # a partial in-place write to a value with a recipe
    q = torch.sin(v)
    del v                                 # freed: q's recipe reads v's recipe's leaves only
    s = torch.exp(x[:, :7] - 1)
    out = [t.t() @ m[:33, :], u[::3, 1:].float().sum(0), t[:, ::2] * 2, k + w, p * 1, q[1:] - 1,
           s.t().contiguous(), (t.t() * 1).tanh(), u.float() @ m]
    x.add_(100)                           # the leaf of t, u, v... changes: later reads read memory
    out += [t * 1, u * 1, q * 1, k @ m]
    return [o.cpu() for o in out]


@pytest.mark.parametrize("distance", [2, 5])
def test_recomputation_is_exact_through_views_writes_and_frees(distance):
    with torch_tpu.eager_mode("strict"):
        ref = _views_and_writes()
    with _remat(distance), torch_tpu.eager_mode("fused"):
        torch_tpu.reset_fused_stats()
        got = _views_and_writes()
        st = torch_tpu.fused_stats()
    assert st["remat_reads"] > 0
    for i, (a, b) in enumerate(zip(ref, got)):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), i


@pytest.mark.mode_independent
def test_recomputation_api_and_env():
    with pytest.raises(TypeError):
        torch_tpu.set_fused_remat("on")
    with pytest.raises(TypeError):
        torch_tpu.set_fused_remat(True)
    with pytest.raises(ValueError, match="at least 2"):
        torch_tpu.set_fused_remat(1)
    with pytest.raises(ValueError):
        torch_tpu.set_fused_remat(-3)
    code = "import torch, torch_tpu\nprint(torch_tpu.get_fused_remat())\n"
    for val, want in (("0", "0"), ("", "64"), ("1", "64"), ("12", "12")):
        env = dict(os.environ, TORCH_TPU_FUSED_REMAT=val)
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and p.stdout.split()[-1] == want, (val, p.stdout, p.stderr)


def test_recomputation_sees_writes_made_while_it_was_off():
    """Turning recomputation off and on inside one window: a leaf written while it
    was off still voids the recipes that read it."""
    def prog(toggle):
        x = torch.arange(40.0, device="tpu").reshape(4, 10)
        t = torch.exp(x / 10)                     # recipe, leaf x
        if toggle:
            torch_tpu.set_fused_remat(0)
        x.mul_(2)                                 # the leaf changes
        if toggle:
            torch_tpu.set_fused_remat(2)
        u = x + 1                                 # (distance)
        return (t * 1).cpu(), u.cpu()
    with torch_tpu.eager_mode("strict"):
        ref = prog(False)
    with _remat(2), torch_tpu.eager_mode("fused"):
        got = prog(True)
    for a, b in zip(ref, got):
        assert torch.equal(a, b)


# ---- cross entropy: nll_loss(log_softmax(x)) and its backward rewritten from the logits ----

def _ce_step(N, C, reduction="mean", weighted=False, ignore_index=-100, keep_logits=True, flush_after_forward=False,
             label_smoothing=0.0, x_layout="contiguous"):
    g = torch.Generator().manual_seed(0)
    W = torch.randn(24, C, generator=g).to("tpu").requires_grad_()
    h = torch.randn(N, 24, generator=g).to("tpu")
    t = torch.randint(0, C, (N,), generator=g)
    t[::5] = ignore_index           # some rows ignored
    t = t.to("tpu")
    w = torch.rand(C, generator=g).to("tpu") if weighted else None
    gl = torch.randn(N, generator=g).to("tpu") if reduction == "none" else None
    torch_tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    torch_tpu.reset_fused_stats()
    logits = h @ W if x_layout == "contiguous" else (W.t() @ h.t()).t()   # the latter: a transposed view
    loss = torch.nn.functional.cross_entropy(logits, t, weight=w, reduction=reduction, ignore_index=ignore_index,
                                             label_smoothing=label_smoothing)
    if not keep_logits:
        del logits
    if flush_after_forward:
        loss.sum().item()
    loss.backward(gl)
    torch_tpu.synchronize()
    st = torch_tpu.fused_stats()
    return (loss.detach().cpu(), W.grad.cpu(), torch.tpu.max_memory_allocated() - base, st)


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


_CE_CASES = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(weighted=True),
             dict(weighted=True, reduction="none"), dict(ignore_index=3), dict(keep_logits=False),
             dict(flush_after_forward=True), dict(label_smoothing=0.1), dict(x_layout="transposed"), dict(C=1),
             dict(N=1)]


@pytest.mark.parametrize("case", _CE_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_cross_entropy_rewrite_equals_strict_bit_for_bit(case):
    """Fused Eager records nll_loss(log_softmax(x)) as one cross entropy from the logits, and its
    backward likewise, so the [N, C] log-probabilities and their gradient need no memory; the
    results are Strict's bit for bit, whether or not the rewrite applies."""
    kw = dict(N=37, C=300)
    kw.update(case)
    ls, gs, _, _ = run_in("strict", lambda: _ce_step(**kw))
    lf, gf, _, st = run_in("fused", lambda: _ce_step(**kw))
    assert _same_bits(ls, lf) and _same_bits(gs, gf)      # (N=1: every row ignored, a NaN mean)
    # label smoothing adds a term over the log-probabilities: its backward's gradient is a sum, not
    # nll_loss_backward's (the forward is still rewritten); a transposed x is still row-wise for log_softmax
    rewrites = 1 if kw.get("label_smoothing") else 2
    assert st["ops_rewritten"] >= rewrites, st
    if rewrites == 2 and not kw.get("flush_after_forward") and kw.get("keep_logits", True):
        assert st["kernels_dropped"] == 2, st   # log_softmax and nll_loss_backward never ran


def test_cross_entropy_rewrite_lowers_the_peak():
    """With the logits kept (as a Hugging Face model's output keeps them), Strict holds the
    logits, the log-probabilities, their gradient and the logits' gradient at the backward's
    peak; Fused holds the logits and the logits' gradient."""
    N, C = 64, 4096
    nc = N * C * 4
    _, _, peak_s, _ = run_in("strict", _ce_step, N, C)
    _, _, peak_f, st = run_in("fused", _ce_step, N, C)
    assert peak_s >= 4 * nc and peak_f <= 2 * nc + (1 << 20), (peak_s, peak_f)
    assert st["bytes_never_materialized"] >= 2 * nc


def test_cross_entropy_rewrite_with_the_transformers_loss():
    from transformers.loss.loss_utils import ForCausalLMLoss

    def step():
        g = torch.Generator().manual_seed(0)
        W = torch.randn(16, 500, generator=g).to("tpu").requires_grad_()
        h = torch.randn(2, 9, 16, generator=g).to("tpu")
        labels = torch.randint(0, 500, (2, 9), generator=g)
        labels[0, :3] = -100
        labels = labels.to("tpu")
        torch_tpu.synchronize()
        torch_tpu.reset_fused_stats()
        logits = h @ W                       # kept, as the model's output keeps them
        loss = ForCausalLMLoss(logits, labels, 500)
        loss.backward()
        torch_tpu.synchronize()
        return loss.detach().cpu(), W.grad.cpu(), torch_tpu.fused_stats()

    ls, gs, _ = run_in("strict", step)
    lf, gf, st = run_in("fused", step)
    assert _same_bits(ls, lf) and _same_bits(gs, gf)
    assert st["ops_rewritten"] == 2 and st["kernels_dropped"] == 2, st


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_cross_entropy_bad_target_raises_as_in_strict(mode):
    with torch_tpu.eager_mode(mode):
        W = torch.randn(8, 10, device="tpu", requires_grad=True)
        h = torch.randn(4, 8, device="tpu")
        t = torch.tensor([1, 2, 10, 3], device="tpu")
        loss = torch.nn.functional.cross_entropy(h @ W, t)
        with pytest.raises((RuntimeError, IndexError), match="Target 10 is out of bounds"):
            loss.backward()
            torch_tpu.synchronize()
        t = torch.tensor([1, 2, 9, 3], device="tpu")
        loss = torch.nn.functional.cross_entropy(h @ W, t)        # the device keeps working
        loss.backward()
        ref = torch.nn.functional.cross_entropy(h.cpu() @ W.detach().cpu(), t.cpu())
        assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
