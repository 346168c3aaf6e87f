"""Ops that decoding and sampling need (isin, multinomial, floor_divide), native
on the tpu, against PyTorch CPU; and transformers' generate() with no CPU
fallback at all (greedy equal to CPU token for token)."""
import warnings

import pytest
import torch
import torch_tpu

from conftest import assert_close

D = "tpu"


pytestmark = pytest.mark.usefixtures("native_only")  # ops here must run natively (conftest)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
@pytest.mark.parametrize("invert", [False, True])
def test_isin_matches_cpu(dtype, invert):
    g = torch.Generator().manual_seed(0)
    e = torch.randint(-5, 20, (4, 7), generator=g).to(dtype)
    for t in (torch.tensor([3, -5, 7, 7, 100]).to(dtype), torch.tensor([], dtype=dtype), torch.tensor(3).to(dtype)):
        assert_close(torch.isin(e.to(D), t.to(D), invert=invert), torch.isin(e, t, invert=invert))
    assert_close(torch.isin(e.to(D), 4, invert=invert), torch.isin(e, 4, invert=invert))


def test_isin_large_is_chunked():
    g = torch.Generator().manual_seed(1)
    e, t = torch.randint(0, 10**6, (300000,), generator=g), torch.randint(0, 10**6, (40,), generator=g)
    assert_close(torch.isin(e.to(D), t.to(D)), torch.isin(e, t))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_floor_divide_matches_cpu(dtype):
    a = torch.tensor([7, -7, 7, -7, 0, 9]).to(dtype)
    b = torch.tensor([2, 2, -2, -2, 3, 4]).to(dtype)
    assert_close(torch.floor_divide(a.to(D), b.to(D)), torch.floor_divide(a, b))
    assert_close(a.to(D) // 2, a // 2)
    x = a.clone()
    y = a.to(D)
    x.floor_divide_(b)
    y.floor_divide_(b.to(D))
    assert_close(y, x)


def test_multinomial_distribution_and_rules():
    torch.manual_seed(0)
    p = torch.tensor([[0.1, 0.0, 0.6, 0.3], [1.0, 1.0, 1.0, 1.0]])
    n = 20000
    s = torch.multinomial(p.to(D), n, replacement=True).cpu()
    assert s.shape == (2, n) and s.dtype == torch.long
    for row, probs in zip(s, p / p.sum(-1, keepdim=True)):
        freq = torch.bincount(row, minlength=4).double() / n
        assert (freq - probs.double()).abs().max() < 0.02, freq   # ~5 sigma at n = 20000
    assert (s[0] == 1).sum() == 0                                 # zero probability: never drawn
    w = torch.multinomial(p.to(D), 3).cpu()                       # without replacement: distinct, never index 1
    assert all(len(set(r.tolist())) == 3 for r in w) and (w[0] != 1).all()
    one = torch.multinomial(torch.tensor([0.2, 0.8]).to(D), 1)
    assert one.shape == (1,)


def test_multinomial_reproducible_from_the_seed():
    p = torch.rand(3, 10).to(D)
    torch.manual_seed(5)
    a = torch.multinomial(p, 4).cpu()
    torch.manual_seed(5)
    b = torch.multinomial(p, 4).cpu()
    assert torch.equal(a, b)


@pytest.mark.parametrize("case", [
    (lambda d: torch.multinomial(torch.tensor([0.5, -1.0], device=d), 1)),
    (lambda d: torch.multinomial(torch.tensor([0.0, 0.0], device=d), 1)),
    (lambda d: torch.multinomial(torch.tensor([1.0, 1.0], device=d), 3)),
    (lambda d: torch.multinomial(torch.tensor([float("nan"), 1.0], device=d), 1)),
    (lambda d: torch.multinomial(torch.ones(2, 2, 2, device=d), 1)),
    (lambda d: torch.multinomial(torch.ones(3, device=d), 0)),
])
def test_multinomial_errors_as_cpu(case):
    with pytest.raises(RuntimeError) as cpu:
        case("cpu")
    with pytest.raises(RuntimeError) as ours:
        case(D)
    assert str(ours.value).splitlines()[0] == str(cpu.value).splitlines()[0]


def test_generate_has_no_fallback():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=300, n_positions=64, eos_token_id=299,
                     bos_token_id=299)
    m = GPT2LMHeadModel(cfg).eval()
    mt = GPT2LMHeadModel(cfg).eval()
    mt.load_state_dict(m.state_dict())
    mt = mt.to(D)
    ids = torch.randint(0, 299, (2, 6))
    am = torch.ones_like(ids)
    am[0, :2] = 0                                     # left padding: the padded-mask path
    kw = dict(attention_mask=am, max_new_tokens=6, pad_token_id=0)
    torch_tpu.reset_fallback_counts()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = m.generate(ids, do_sample=False, **kw)
        kw["attention_mask"] = am.to(D)
        b = mt.generate(ids.to(D), do_sample=False, **kw)
        assert torch.equal(a, b.cpu())
        mt.generate(ids.to(D), do_sample=True, top_k=20, top_p=0.9, temperature=0.8, **kw)
        mt.generate(ids.to(D), num_beams=3, **kw)
    assert torch_tpu.fallback_counts() == {}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_repeat_interleave_matches_cpu(dtype):
    r = torch.tensor([2, 0, 3, 1], dtype=dtype)
    assert_close(torch.repeat_interleave(r.to(D)), torch.repeat_interleave(r))
    x = torch.randn(4, 3)
    assert_close(torch.repeat_interleave(x.to(D), r.to(D), dim=0), torch.repeat_interleave(x, r, dim=0))
    assert_close(torch.repeat_interleave(x.to(D), 2, dim=1), torch.repeat_interleave(x, 2, dim=1))
    assert_close(torch.repeat_interleave(torch.tensor([], dtype=dtype).to(D)), torch.repeat_interleave(
        torch.tensor([], dtype=dtype)))
    for bad in (torch.tensor([[1]]), torch.tensor([-1, 2])):
        with pytest.raises(RuntimeError) as cpu:
            torch.repeat_interleave(bad)
        with pytest.raises(RuntimeError) as ours:
            torch.repeat_interleave(bad.to(D))
        assert str(ours.value).splitlines()[0] == str(cpu.value).splitlines()[0]


def test_equal_matches_cpu():
    a = torch.randn(3, 4)
    cases = [(a, a.clone()), (a, a + 1), (a, a.t()), (torch.tensor([1]), torch.tensor([1.0])),
             (torch.tensor([float("nan")]), torch.tensor([float("nan")])), (a[:, :1].expand(3, 4), a[:, :1].repeat(1, 4)),
             (torch.zeros(0), torch.zeros(0))]
    for x, y in cases:
        assert torch.equal(x.to(D), y.to(D)) == torch.equal(x, y)


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("k,s,p,div", [(3, 2, 1, None), (2, 2, 0, None), (3, 1, 1, 5), ((3, 2), (2, 3), (1, 0), None)])
def test_avg_pool2d_matches_cpu(ceil_mode, count_include_pad, k, s, p, div):
    import torch.nn.functional as F
    x = torch.randn(2, 3, 9, 8, generator=torch.Generator().manual_seed(0))
    kw = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
              divisor_override=div)
    xt, xc = x.to(D).requires_grad_(), x.clone().requires_grad_()
    yt, yc = F.avg_pool2d(xt, **kw), F.avg_pool2d(xc, **kw)
    assert_close(yt, yc, atol=1e-6, rtol=1e-5)
    g = torch.randn_like(yc)
    yt.backward(g.to(D))
    yc.backward(g)
    assert_close(xt.grad, xc.grad, atol=1e-6, rtol=1e-5)
    assert_close(F.avg_pool2d(x[0].to(D), **kw), F.avg_pool2d(x[0], **kw), atol=1e-6, rtol=1e-5)  # unbatched


def test_masked_scatter_and_masked_select_backward_match_cpu():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 5, generator=g)
    m = torch.rand(4, 5, generator=g) > 0.5
    src = torch.randn(30, generator=g)
    assert_close(x.to(D).masked_scatter(m.to(D), src.to(D)), x.masked_scatter(m, src))
    assert_close(x.to(D).masked_scatter(m[0].to(D), src.to(D)), x.masked_scatter(m[0], src))   # broadcast mask
    xt, xc = x.to(D).requires_grad_(), x.clone().requires_grad_()
    (xt.masked_select(m.to(D)) ** 2).sum().backward()
    (xc.masked_select(m) ** 2).sum().backward()
    assert_close(xt.grad, xc.grad)
    for f in (lambda t, mm, s: t.masked_scatter(mm, s[:2]), lambda t, mm, s: t.masked_scatter(mm.int(), s),
              lambda t, mm, s: t.masked_scatter(mm, s.long())):
        with pytest.raises(RuntimeError) as cpu:
            f(x, m, src)
        with pytest.raises(RuntimeError) as ours:
            f(x.to(D), m.to(D), src.to(D))
        assert str(ours.value).splitlines()[0] == str(cpu.value).splitlines()[0]


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", [((2, 3, 37, 45), (13, 20), None, False), ((1, 2, 16, 16), (40, 33), None, True),
                                  ((1, 1, 50, 50), None, (0.3, 0.45), False), ((1, 2, 20, 30), (1, 1), None, True)],
                         ids=["down", "up", "scale", "to1x1"])
def test_antialiased_interpolate_matches_cpu(mode, dtype, case):
    """F.interpolate(antialias=True) (_upsample_bilinear2d_aa / _upsample_bicubic2d_aa, e.g. torchvision's
    Resize): native, forward and backward, downsampling and upsampling, align_corners both ways."""
    shape, size, sf, ac = case
    x = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
    res = []
    for dev in ("cpu", D):
        xx = x.detach().to(dev).clone().requires_grad_()
        o = torch.nn.functional.interpolate(xx, size=size, scale_factor=sf, mode=mode, align_corners=ac,
                                            antialias=True)
        o.backward(torch.randn(o.shape, dtype=dtype, generator=torch.Generator().manual_seed(1)).to(dev))
        res.append((o, xx.grad))
    tol = dict(rtol=1e-5, atol=1e-5)
    assert_close(res[1][0], res[0][0], **tol)
    assert_close(res[1][1], res[0][1], **tol)
