"""Mixed precision: torch.autocast("tpu"), GradScaler, activation checkpointing.

The oracle for autocast's policies is PyTorch's CUDA op lists (registered for
the tpu's autocast key): matmuls and convolutions run in the autocast dtype,
precision-sensitive ops in float32, mixed-input ops at the widest dtype. The
values are compared with the same computation done by hand on the CPU. Every
test runs with the CPU fallback disabled: the AMP path is native.
"""
import contextlib

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as ckpt
import torch_tpu

from conftest import assert_close

D = "tpu"


pytestmark = pytest.mark.usefixtures("native_only")  # ops here must run natively (conftest)


def test_device_module_declares_amp_dtypes():
    assert torch.tpu.get_amp_supported_dtype() == [torch.bfloat16, torch.float16]
    assert torch.tpu.is_bf16_supported()
    assert torch.amp.is_autocast_available("tpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_policies(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)
    w, bias = torch.randn(4, 16, generator=g), torch.randn(4, generator=g)
    img, k = torch.randn(2, 3, 8, 8, generator=g), torch.randn(5, 3, 3, 3, generator=g)
    ta, tb, tw, tbias, timg, tk = (t.to(D) for t in (a, b, w, bias, img, k))
    with torch.autocast(D, dtype=dtype):
        mm = ta @ tb
        lin = F.linear(ta, tw, tbias)
        conv = F.conv2d(timg, tk)
        bmm = torch.bmm(ta[None], tb[None])
        sm = torch.softmax(mm, -1)                    # float32 policy (set_opt_dtype)
        ln = F.layer_norm(mm, (4,))                   # float32 policy
        ex = torch.exp(mm)                            # float32 policy
        added = mm + ta[:, :4]                        # not listed: ordinary promotion
        prom = torch.addcmul(ta[:, :4], mm, ta[:, :4])  # promote: widest input dtype
        with torch.autocast(D, enabled=False):
            off = ta @ tb                             # autocast off inside
    for t in (mm, lin, conv, bmm):
        assert t.dtype == dtype
    for t in (sm, ln, ex, added, prom, off):
        assert t.dtype == torch.float32
    # values: the same casts done by hand, computed on the CPU
    lo = lambda t: t.to(dtype)  # noqa: E731
    assert_close(mm, (lo(a).float() @ lo(b).float()).to(dtype), atol=2e-2, rtol=2e-2)
    assert_close(lin, F.linear(lo(a).float(), lo(w).float(), lo(bias).float()).to(dtype), atol=2e-2, rtol=2e-2)
    assert_close(conv, F.conv2d(lo(img).float(), lo(k).float()).to(dtype), atol=5e-2, rtol=2e-2)
    assert_close(sm, torch.softmax(mm.cpu().float(), -1))
    assert_close(off, a @ b, atol=1e-5, rtol=1e-5)


def test_outside_autocast_unchanged():
    a = torch.randn(4, 4, device=D)
    assert (a @ a).dtype == torch.float32
    with torch.autocast(D, dtype=torch.bfloat16):
        pass
    assert (a @ a).dtype == torch.float32


def test_bce_is_banned_as_on_cuda():
    p, t = torch.rand(4, device=D), torch.rand(4, device=D)
    with torch.autocast(D, dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, t)
        F.binary_cross_entropy_with_logits(p, t)  # the safe form runs
    # and the device still works (log_sigmoid is native: with_logits runs on the tpu)
    assert_close(F.binary_cross_entropy_with_logits(p, t), F.binary_cross_entropy_with_logits(p.cpu(), t.cpu()))


def test_training_step_under_autocast_matches_manual_casts():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2)).to(D)
    model.load_state_dict(ref.state_dict())
    x, y = torch.randn(5, 8), torch.randint(0, 2, (5,))
    with torch.autocast(D, dtype=torch.bfloat16):
        out = model(x.to(D))
        loss = F.cross_entropy(out, y.to(D))
    assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32
    loss.backward()
    for p in model.parameters():
        assert p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all().item()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # CPU's lists agree on linear and cross_entropy
        ref_loss = F.cross_entropy(ref(x), y)
    assert loss.item() == pytest.approx(ref_loss.item(), abs=3e-2)


def _grads(seed, n=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4 + i, 3, generator=g) for i in range(n)]


@pytest.mark.parametrize("poison", [None, "inf", "nan", "-inf"])
def test_unscale_matches_cpu(poison):
    grads = _grads(1)
    if poison:
        grads[1][2, 1] = float(poison)
    for found0 in (0.0, 1.0):
        cg = [t.clone() for t in grads]
        tg = [t.to(D) for t in grads]
        cf, tf = torch.tensor([found0]), torch.tensor([found0], device=D)
        inv = torch.tensor([0.25])
        torch._amp_foreach_non_finite_check_and_unscale_(cg, cf, inv)
        torch._amp_foreach_non_finite_check_and_unscale_(tg, tf, inv.to(D))
        assert_close(tf, cf)
        for a, b in zip(tg, cg):
            assert_close(a, b)


def test_unscale_checks():
    g = [torch.randn(3, device=D)]
    with pytest.raises(RuntimeError, match="found_inf must be a float tensor"):
        torch._amp_foreach_non_finite_check_and_unscale_(g, torch.zeros(1, dtype=torch.int32, device=D),
                                                         torch.ones(1, device=D))
    with pytest.raises(RuntimeError, match="inv_scale must be a 1-element tensor"):
        torch._amp_foreach_non_finite_check_and_unscale_(g, torch.zeros(1, device=D), torch.ones(2, device=D))


@pytest.mark.parametrize("found,tracker,interval,scale", [
    (0.0, 0, 3, 1024.0), (0.0, 2, 3, 1024.0), (1.0, 2, 3, 1024.0), (0.0, 1, 2, 3e38), (1.0, 0, 1, 1.0)])
def test_update_scale_matches_cpu(found, tracker, interval, scale):
    res = {}
    for dev in ("cpu", D):
        s = torch.tensor([scale], device=dev)
        t = torch.tensor([tracker], dtype=torch.int32, device=dev)
        out = torch._amp_update_scale_(s, t, torch.tensor([found], device=dev), 2.0, 0.5, interval)
        assert out is s
        res[dev] = (s.cpu(), t.cpu())
    assert torch.equal(res[D][0], res["cpu"][0]) and torch.equal(res[D][1], res["cpu"][1])


def test_grad_scaler_training_matches_cpu():
    """GradScaler's whole loop, including an overflowing step (skipped) and growth."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(6, 3)
    model = torch.nn.Linear(6, 3).to(D)
    model.load_state_dict(ref.state_dict())
    scalers, opts = {}, {}
    for dev, m in (("cpu", ref), (D, model)):
        scalers[dev] = torch.amp.GradScaler(dev, init_scale=4.0, growth_interval=2)
        opts[dev] = torch.optim.SGD(m.parameters(), lr=0.1)
    xs = [torch.randn(4, 6) for _ in range(5)]
    xs[2][0, 0] = float("inf")  # one step overflows: skipped, scale backs off
    for x in xs:
        for dev, m in (("cpu", ref), (D, model)):
            loss = m(x.to(dev)).square().mean()
            scalers[dev].scale(loss).backward()
            scalers[dev].step(opts[dev])
            scalers[dev].update()
            opts[dev].zero_grad()
        assert scalers[D].get_scale() == scalers["cpu"].get_scale()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert_close(a.detach(), b.detach(), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("autocast", [False, True])
def test_checkpoint_matches_plain_backward(reentrant, autocast):
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.3), torch.nn.GELU()).to(D)
    x = torch.randn(4, 8, device=D, requires_grad=True)
    ctx = (lambda: torch.autocast(D, dtype=torch.bfloat16)) if autocast else contextlib.nullcontext

    def run(use_ckpt):
        torch.manual_seed(1)  # dropout's mask is replayed by the recomputation
        with ctx():
            y = ckpt.checkpoint(block, x, use_reentrant=reentrant) if use_ckpt else block(x)
        y.float().square().sum().backward()
        grads = [x.grad.clone()] + [p.grad.clone() for p in block.parameters()]
        x.grad = None
        block.zero_grad(set_to_none=True)
        return y.detach(), grads

    y0, g0 = run(False)
    y1, g1 = run(True)
    assert torch.equal(y0.cpu(), y1.cpu())
    for a, b in zip(g0, g1):
        assert torch.equal(a.cpu(), b.cpu())


def _steps_match_cpu(ref, model, cpu_opt, tpu_opt, steps=4):
    """The same training steps on the CPU model and its tpu copy; then their parameters agree."""
    for _ in range(steps):
        x = torch.randn(4, 8)
        for m, opt, dev in ((ref, cpu_opt, "cpu"), (model, tpu_opt, D)):
            m(x.to(dev)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert_close(a.detach(), b.detach(), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cls,kw", [(torch.optim.AdamW, {}), (torch.optim.Adam, dict(weight_decay=0.1)),
                                    (torch.optim.AdamW, dict(maximize=True, weight_decay=0.05))])
def test_fused_adam_matches_cpu_fused(cls, kw):
    """fused=True (transformers' default optimizer): one native step per parameter, against CPU's fused kernel."""
    import copy
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    model = copy.deepcopy(ref).to(D)
    _steps_match_cpu(ref, model, cls(ref.parameters(), lr=1e-2, fused=True, **kw),
                     cls(model.parameters(), lr=1e-2, fused=True, **kw))


def test_fused_adamw_with_grad_scaler_matches_cpu():
    """GradScaler + fused AdamW: the grads are unscaled in the step, an overflowing step is skipped."""
    import copy
    torch.manual_seed(0)
    ref = torch.nn.Linear(6, 3)
    model = copy.deepcopy(ref).to(D)
    run = {}
    for dev, m in (("cpu", ref), (D, model)):
        run[dev] = (torch.amp.GradScaler(dev, init_scale=8.0, growth_interval=2),
                    torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True))
    xs = [torch.randn(4, 6) for _ in range(5)]
    xs[1][0, 0] = float("inf")
    for x in xs:
        for dev, m in (("cpu", ref), (D, model)):
            scaler, opt = run[dev]
            scaler.scale(m(x.to(dev)).square().mean()).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        assert run[D][0].get_scale() == run["cpu"][0].get_scale()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert_close(a.detach(), b.detach(), atol=1e-6, rtol=1e-5)


def test_fused_amsgrad_says_what_to_use():
    p = torch.nn.Parameter(torch.randn(3, device=D))
    p.grad = torch.randn(3, device=D)
    with pytest.raises(NotImplementedError, match="fused=False"):
        torch.optim.AdamW([p], amsgrad=True, fused=True).step()


@pytest.mark.parametrize("kw", [dict(momentum=0.9), dict(momentum=0.9, nesterov=True, weight_decay=0.01),
                                dict(momentum=0.5, dampening=0.1, maximize=True), dict()])
def test_fused_sgd_matches_cpu_fused(kw):
    import copy
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    model = copy.deepcopy(ref).to(D)
    _steps_match_cpu(ref, model, torch.optim.SGD(ref.parameters(), lr=0.05, fused=True, **kw),
                     torch.optim.SGD(model.parameters(), lr=0.05, fused=True, **kw))
