"""LSTM and GRU on tpu: the fused cells (_thnn_fused_lstm_cell / _thnn_fused_gru_cell and
their backward ops) run natively, and nn.LSTM / nn.GRU / nn.LSTMCell / nn.GRUCell match
PyTorch on CPU in outputs and in the gradients of inputs, weights and initial states."""
import pytest
import torch
import torch_tpu

from conftest import assert_close

TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}


def _same_module(cls, dtype, **kw):
    torch.manual_seed(0)
    cpu = cls(**kw).to(dtype)
    tpu = cls(**kw).to(dtype)
    tpu.load_state_dict(cpu.state_dict())
    return cpu, tpu.to("tpu")


def _check_grads(cpu_mod, tpu_mod, cpu_inputs, tpu_inputs, **tol):
    for name, p in cpu_mod.named_parameters():
        q = dict(tpu_mod.named_parameters())[name]
        assert q.grad is not None, f"no gradient for {name}"
        assert_close(q.grad, p.grad, **tol)
    for a, b in zip(tpu_inputs, cpu_inputs):
        assert_close(a.grad, b.grad, **tol)


def _leaves(*ts, device):
    return [t.detach().to(device).requires_grad_() for t in ts]


# ---------------------------------------------------------------- nn.LSTM / nn.GRU
# (layers, bidirectional, batch_first, bias): every pair of options appears together at least once
CONFIGS = [(1, False, False, True), (2, True, False, True), (2, False, True, False), (1, True, True, False),
           (2, True, True, True), (1, False, False, False)]


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU], ids=["LSTM", "GRU"])
@pytest.mark.parametrize("layers,bidir,batch_first,bias", CONFIGS,
                         ids=[f"L{l}{'-bi' if b else ''}{'-bf' if f else ''}{'' if s else '-nobias'}"
                              for l, b, f, s in CONFIGS])
def test_rnn_module_matches_cpu(cls, layers, bidir, batch_first, bias):
    T, N, I, H = 4, 3, 5, 7
    cpu, tpu = _same_module(cls, torch.float32, input_size=I, hidden_size=H, num_layers=layers,
                            bidirectional=bidir, batch_first=batch_first, bias=bias)
    g = torch.Generator().manual_seed(1)
    x = torch.randn((N, T, I) if batch_first else (T, N, I), generator=g)
    D = 2 if bidir else 1
    states = [torch.randn(layers * D, N, H, generator=g)]
    if cls is torch.nn.LSTM:
        states.append(torch.randn(layers * D, N, H, generator=g))
    xc, *sc = _leaves(x, *states, device="cpu")
    xt, *st = _leaves(x, *states, device="tpu")
    hc = tuple(sc) if cls is torch.nn.LSTM else sc[0]
    ht = tuple(st) if cls is torch.nn.LSTM else st[0]
    out_c, hn_c = cpu(xc, hc)
    out_t, hn_t = tpu(xt, ht)
    assert_close(out_t, out_c, **TOL[torch.float32])
    assert_close(hn_t, hn_c, **TOL[torch.float32])
    # a loss that reaches every output: the sequence, h_n and (LSTM) c_n
    wc = torch.randn(out_c.shape, generator=g)
    flat_c = hn_c if isinstance(hn_c, tuple) else (hn_c,)
    flat_t = hn_t if isinstance(hn_t, tuple) else (hn_t,)
    loss_c = (out_c * wc).sum() + sum((h * (i + 2)).sum() for i, h in enumerate(flat_c))
    loss_t = (out_t * wc.to("tpu")).sum() + sum((h * (i + 2)).sum() for i, h in enumerate(flat_t))
    loss_c.backward()
    loss_t.backward()
    _check_grads(cpu, tpu, [xc, *sc], [xt, *st], **TOL[torch.float32])


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU], ids=["LSTM", "GRU"])
def test_rnn_default_state_and_float64(cls):
    """No initial state (zeros), float64, an unbatched input."""
    cpu, tpu = _same_module(cls, torch.float64, input_size=4, hidden_size=6, num_layers=2)
    for shape in [(5, 2, 4), (5, 4)]:
        x = torch.randn(shape, dtype=torch.float64)
        xc, xt = _leaves(x, device="cpu")[0], _leaves(x, device="tpu")[0]
        cpu.zero_grad()
        tpu.zero_grad()
        out_c, _ = cpu(xc)
        out_t, _ = tpu(xt)
        assert_close(out_t, out_c, **TOL[torch.float64])
        out_c.square().sum().backward()
        out_t.square().sum().backward()
        _check_grads(cpu, tpu, [xc], [xt], **TOL[torch.float64])


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU], ids=["LSTM", "GRU"])
def test_rnn_packed_sequence(cls):
    """Variable lengths (PackedSequence): the cells run on shrinking batches."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    cpu, tpu = _same_module(cls, torch.float32, input_size=3, hidden_size=5, bidirectional=True)
    x, lengths = torch.randn(6, 4, 3), torch.tensor([6, 4, 4, 1])
    xc, xt = _leaves(x, device="cpu")[0], _leaves(x, device="tpu")[0]
    out_c, _ = pad_packed_sequence(cpu(pack_padded_sequence(xc, lengths))[0])
    out_t, _ = pad_packed_sequence(tpu(pack_padded_sequence(xt, lengths))[0])
    assert_close(out_t, out_c, **TOL[torch.float32])
    out_c.square().sum().backward()
    out_t.square().sum().backward()
    _check_grads(cpu, tpu, [xc], [xt], **TOL[torch.float32])


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
def test_lstm_proj_size():
    cpu, tpu = _same_module(torch.nn.LSTM, torch.float32, input_size=5, hidden_size=8, proj_size=3,
                            bidirectional=True)
    x = torch.randn(4, 2, 5)
    xc, xt = _leaves(x, device="cpu")[0], _leaves(x, device="tpu")[0]
    out_c, _ = cpu(xc)
    out_t, _ = tpu(xt)
    assert_close(out_t, out_c, **TOL[torch.float32])
    out_c.sum().backward()
    out_t.sum().backward()
    _check_grads(cpu, tpu, [xc], [xt], **TOL[torch.float32])


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU], ids=["LSTM", "GRU"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_rnn_half_precision(cls, dtype):
    """bf16 / f16 on tpu against the same (rounded) weights and inputs in float32 on CPU."""
    torch.manual_seed(0)
    ref = cls(6, 8, num_layers=2, batch_first=True).to(dtype).float()
    tpu = cls(6, 8, num_layers=2, batch_first=True)
    tpu.load_state_dict(ref.state_dict())
    tpu = tpu.to("tpu", dtype)
    x = torch.randn(3, 5, 6).to(dtype)
    xc = x.float().requires_grad_()
    xt = x.to("tpu").requires_grad_()
    out_c, _ = ref(xc)
    out_t, _ = tpu(xt)
    assert out_t.dtype == dtype
    torch.testing.assert_close(out_t.float().cpu(), out_c, atol=3e-2, rtol=3e-2)
    out_c.sum().backward()
    out_t.float().sum().backward()
    for name, p in ref.named_parameters():
        q = dict(tpu.named_parameters())[name]
        assert q.grad.dtype == dtype
        torch.testing.assert_close(q.grad.float().cpu(), p.grad, atol=8e-2, rtol=5e-2)
    torch.testing.assert_close(xt.grad.float().cpu(), xc.grad, atol=8e-2, rtol=5e-2)


# ---------------------------------------------------------------- nn.LSTMCell / nn.GRUCell
@pytest.mark.parametrize("cls", [torch.nn.LSTMCell, torch.nn.GRUCell], ids=["LSTMCell", "GRUCell"])
@pytest.mark.parametrize("bias,given_state", [(True, True), (True, False), (False, True)],
                         ids=["bias-state", "bias-nostate", "nobias-state"])
def test_cell_module_matches_cpu(cls, bias, given_state):
    N, I, H = 4, 5, 9
    cpu, tpu = _same_module(cls, torch.float32, input_size=I, hidden_size=H, bias=bias)
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(N, I, generator=g) for _ in range(3)]
    n_states = 2 if cls is torch.nn.LSTMCell else 1
    states = [torch.randn(N, H, generator=g) for _ in range(n_states)] if given_state else []
    xc, xt = _leaves(*xs, device="cpu"), _leaves(*xs, device="tpu")
    sc, st = _leaves(*states, device="cpu"), _leaves(*states, device="tpu")

    def unroll(mod, inputs, state):
        h = (tuple(state) if len(state) == 2 else state[0]) if state else None
        outs = []
        for x in inputs:                     # three steps: the state's gradient flows back through each
            h = mod(x, h)
            outs.append(h[0] * 1.5 + h[1] if isinstance(h, tuple) else h)
        return torch.stack(outs)

    yc, yt = unroll(cpu, xc, sc), unroll(tpu, xt, st)
    assert_close(yt, yc, **TOL[torch.float32])
    w = torch.randn(yc.shape, generator=g)
    (yc * w).sum().backward()
    (yt * w.to("tpu")).sum().backward()
    _check_grads(cpu, tpu, xc + sc, xt + st, **TOL[torch.float32])


def test_cell_unbatched_and_partial_grads():
    """1-d (unbatched) input; a loss on c only (grad_hy absent) and on h only (grad_cy absent)."""
    cpu, tpu = _same_module(torch.nn.LSTMCell, torch.float32, input_size=3, hidden_size=5)
    x = torch.randn(3)
    for pick in (0, 1):
        cpu.zero_grad()
        tpu.zero_grad()
        xc, xt = _leaves(x, device="cpu")[0], _leaves(x, device="tpu")[0]
        hc, ht = cpu(xc)[pick], tpu(xt)[pick]
        assert_close(ht, hc, **TOL[torch.float32])
        hc.sum().backward()
        ht.sum().backward()
        _check_grads(cpu, tpu, [xc], [xt], **TOL[torch.float32])


# ---------------------------------------------------------------- the fused ops themselves
def _lstm_ref(ig, hg, cx, ib, hb):
    gates = ig + hg + (ib + hb if ib is not None else 0)
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


def _gru_ref(ig, hg, hx, ib, hb):
    if ib is not None:
        ig, hg = ig + ib, hg + hb
    ir, iz, in_ = ig.chunk(3, 1)
    hr, hz, hn = hg.chunk(3, 1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, hn], 1)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_fused_ops_direct(bias):
    """The ops as PyTorch defines them (gate order, workspace layout, backward outputs),
    on non-contiguous inputs, against a formula on CPU."""
    B, H = 3, 6
    g = torch.Generator().manual_seed(3)
    for G, ref, op in [(4, _lstm_ref, torch.ops.aten._thnn_fused_lstm_cell), (3, _gru_ref, torch.ops.aten._thnn_fused_gru_cell)]:
        ig = torch.randn(G * H, B, generator=g).t()          # transposed: strides (1, B)
        hg = torch.randn(B, 2 * G * H, generator=g)[:, ::2]  # every other column
        prev = torch.randn(B, H, generator=g)
        ib, hb = (torch.randn(G * H, generator=g), torch.randn(G * H, generator=g)) if bias else (None, None)
        cpu_args = [ig, hg, prev, ib, hb]
        tpu_args = [None if t is None else t.to("tpu") for t in cpu_args]
        tpu_args[0] = ig.t().contiguous().to("tpu").t()
        tpu_args[1] = torch.randn(B, 2 * G * H).to("tpu")[:, ::2].copy_(hg.to("tpu"))
        assert not tpu_args[0].is_contiguous() and not tpu_args[1].is_contiguous()
        # The reference is a formula, not PyTorch's op: its layout says nothing.
        assert_close(op(*tpu_args), ref(*cpu_args), check_layout=False, **TOL[torch.float32])

    # backward ops: against autograd of the formula
    ig, hg, cx = torch.randn(B, 4 * H), torch.randn(B, 4 * H), torch.randn(B, H)
    hy, cy, ws = torch.ops.aten._thnn_fused_lstm_cell(ig.to("tpu"), hg.to("tpu"), cx.to("tpu"))
    ghy, gcy = torch.randn(B, H), torch.randn(B, H)
    for dh, dc in [(ghy, gcy), (ghy, None), (None, gcy)]:
        leaves = _leaves(ig, cx, device="cpu")
        h_ref, c_ref, _ = _lstm_ref(leaves[0], hg, leaves[1], None, None)
        loss = (h_ref * dh).sum() if dh is not None else 0
        loss = loss + ((c_ref * dc).sum() if dc is not None else 0)
        loss.backward()
        out = torch.ops.aten._thnn_fused_lstm_cell_backward_impl(
            None if dh is None else dh.to("tpu"), None if dc is None else dc.to("tpu"), cx.to("tpu"), cy, ws, True)
        assert_close(out[0], leaves[0].grad, **TOL[torch.float32])
        assert_close(out[1], leaves[1].grad, **TOL[torch.float32])
        assert_close(out[2], leaves[0].grad.sum(0), **TOL[torch.float32])
    assert torch.ops.aten._thnn_fused_lstm_cell_backward_impl(None, None, cx.to("tpu"), cy, ws, True) == (None,) * 3

    hx = torch.randn(B, H)
    ig, hg, ib, hb = torch.randn(B, 3 * H), torch.randn(B, 3 * H), torch.randn(3 * H), torch.randn(3 * H)
    _, ws = torch.ops.aten._thnn_fused_gru_cell(*(t.to("tpu") for t in (ig, hg, hx, ib, hb)))
    leaves = _leaves(ig, hg, hx, ib, hb, device="cpu")
    (_gru_ref(*leaves)[0] * ghy).sum().backward()
    out = torch.ops.aten._thnn_fused_gru_cell_backward(ghy.to("tpu"), ws, bias)
    assert_close(out[:3], tuple(t.grad for t in leaves[:3]), **TOL[torch.float32])
    if bias:
        assert_close(out[3:], (leaves[3].grad, leaves[4].grad), **TOL[torch.float32])
    else:
        assert out[3] is None and out[4] is None


def test_fused_ops_errors():
    t = lambda *s: torch.zeros(*s, device="tpu")
    with pytest.raises(RuntimeError, match="expected prev_hidden of size \\[2, 3\\]"):
        torch.ops.aten._thnn_fused_lstm_cell(t(2, 12), t(2, 12), t(2, 4))
    with pytest.raises(RuntimeError, match="expected hidden_gates of size"):
        torch.ops.aten._thnn_fused_gru_cell(t(2, 9), t(2, 12), t(2, 3))
    with pytest.raises(RuntimeError, match="must be given together"):
        torch.ops.aten._thnn_fused_gru_cell(t(2, 9), t(2, 9), t(2, 3), t(9), None)
    with pytest.raises(RuntimeError, match="expected input_bias of size \\[9\\]"):
        torch.ops.aten._thnn_fused_gru_cell(t(2, 9), t(2, 9), t(2, 3), t(8), t(8))
    with pytest.raises(RuntimeError, match="same device"):
        torch.ops.aten._thnn_fused_lstm_cell(t(2, 12), t(2, 12), torch.zeros(2, 3))
    with pytest.raises(RuntimeError, match="expected workspace of size \\[2, 15\\]"):
        torch.ops.aten._thnn_fused_gru_cell_backward(t(2, 3), t(2, 12), True)
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        z = torch.zeros(2, 12, dtype=torch.long, device="tpu")
        torch.ops.aten._thnn_fused_lstm_cell(z, z, torch.zeros(2, 3, dtype=torch.long, device="tpu"))
        torch.tpu.synchronize()


# ---------------------------------------------------------------- training, natively
class _Tagger(torch.nn.Module):
    def __init__(self, cls):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.rnn = cls(8, 16, num_layers=2, bidirectional=True, batch_first=True)
        self.head = torch.nn.Linear(32, 5)

    def forward(self, tokens):
        return self.head(self.rnn(self.emb(tokens))[0])


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU], ids=["LSTM", "GRU"])
def test_training_matches_cpu_without_fallback(cls):
    def train(device):
        torch.manual_seed(0)
        model = _Tagger(cls).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        g = torch.Generator().manual_seed(4)
        losses = []
        for _ in range(4):
            tok = torch.randint(0, 20, (4, 6), generator=g)
            tgt = torch.randint(0, 5, (4, 6), generator=g)
            logits = model(tok.to(device))
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 5), tgt.to(device).reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, model

    torch_tpu.reset_fallback_counts()
    cpu_losses, cpu_model = train("cpu")
    tpu_losses, tpu_model = train("tpu")
    assert tpu_losses == pytest.approx(cpu_losses, rel=1e-4, abs=1e-5)
    for (name, a), b in zip(tpu_model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), atol=1e-4, rtol=1e-4, msg=name)
    assert torch_tpu.fallback_counts() == {}


def test_double_backward_uses_differentiable_cells():
    """create_graph=True takes PyTorch's composite backward of the cells; grads still match."""
    cpu, tpu = _same_module(torch.nn.GRU, torch.float32, input_size=3, hidden_size=4)
    x = torch.randn(2, 1, 3)
    xc, xt = _leaves(x, device="cpu")[0], _leaves(x, device="tpu")[0]
    (gc,) = torch.autograd.grad(cpu(xc)[0].square().sum(), xc, create_graph=True)
    (gt,) = torch.autograd.grad(tpu(xt)[0].square().sum(), xt, create_graph=True)
    assert_close(gt, gc, **TOL[torch.float32])
    (ggc,) = torch.autograd.grad(gc.sum(), xc)
    (ggt,) = torch.autograd.grad(gt.sum(), xt)
    assert_close(ggt, ggc, rtol=1e-4, atol=1e-5)
