"""Sorting and selection ops, nll_loss2d and 3-d pooling (torch_tpu/_decomp.py) against the CPU, with the CPU
fallback off, on what OpInfo's samples leave out: ties (the index the CPU's quick select / std::sort / max
pooling scan picks), NaN, slices longer than 16 (where libstdc++'s introsort partitions), channels-last
inputs, the error checks."""
import pytest
import torch
import torch_tpu

D = "tpu"
NAN = float("nan")


@pytest.fixture(autouse=True)
def no_fallback():
    torch_tpu.set_cpu_fallback_enabled(False)
    yield
    torch_tpu.set_cpu_fallback_enabled(True)


def _same(exp, got):
    exp = exp if isinstance(exp, (tuple, list)) else (exp,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(exp) == len(got)
    for e, g in zip(exp, got):
        assert g.device.type == D and g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, rtol=0, atol=0, equal_nan=True)


def _ties(shape, hi, dtype, seed, nan=0.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, hi, shape, generator=g).to(dtype)
    if nan:
        x[torch.rand(shape, generator=g) < nan] = NAN
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
def test_kthvalue_ties_and_nan(dtype):
    for seed, (shape, dim) in enumerate([((7, 40), 1), ((300,), 0), ((5, 17, 3), 1), ((4, 6), 0)]):
        x = _ties(shape, 4, dtype, seed, nan=0.1 if dtype.is_floating_point else 0.0)
        for k in sorted({1, 2, x.size(dim) // 2, x.size(dim)}):
            for keepdim in (False, True):
                _same(torch.kthvalue(x, k, dim, keepdim), torch.kthvalue(x.to(D), k, dim, keepdim))


@pytest.mark.parametrize("n", [5, 16, 17, 100, 3000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_mode_ties(n, dtype):
    x = _ties((3, n), 7, dtype, n)
    _same(torch.mode(x), torch.mode(x.to(D)))
    _same(torch.mode(x.t(), 0, True), torch.mode(x.t().to(D), 0, True))


def test_median_nan_and_ties():
    x = _ties((6, 33), 5, torch.float32, 0, nan=0.1)
    x[0] = NAN
    x[1] = 2.0
    x[2, ::2] = -0.0
    x[3, :] = 0.0
    x[3, ::3] = NAN
    xt = x.to(D)
    for dim in (0, 1, -1):
        _same(torch.median(x, dim), torch.median(xt, dim))
        _same(torch.nanmedian(x, dim), torch.nanmedian(xt, dim))
    for r in (x[1:3], x[3], x[4:], x[0]):
        _same(torch.median(r), torch.median(r.to(D)))
        _same(torch.nanmedian(r), torch.nanmedian(r.to(D)))
    for dt in (torch.float32, torch.int64, torch.int16):
        e = torch.empty(0, dtype=dt)
        _same(torch.median(e), torch.median(e.to(D)))
    _same(torch.median(torch.zeros(0, 3), 1), torch.median(torch.zeros(0, 3, device=D), 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_unique_forms(dtype):
    x = _ties((6, 9), 3, dtype, 1)
    xt = x.to(D)
    for inv in (False, True):
        for cnt in (False, True):
            _same(torch.unique(x, return_inverse=inv, return_counts=cnt),
                  torch.unique(xt, return_inverse=inv, return_counts=cnt))
            _same(torch.unique_consecutive(x, return_inverse=inv, return_counts=cnt),
                  torch.unique_consecutive(xt, return_inverse=inv, return_counts=cnt))
            for dim in (0, 1, -1):
                _same(torch.unique(x, dim=dim, return_inverse=inv, return_counts=cnt),
                      torch.unique(xt, dim=dim, return_inverse=inv, return_counts=cnt))
                _same(torch.unique_consecutive(x, dim=dim, return_inverse=inv, return_counts=cnt),
                      torch.unique_consecutive(xt, dim=dim, return_inverse=inv, return_counts=cnt))


def test_unique_nan_and_empty():
    x = torch.tensor([[3.0, NAN, 1.0, -0.0], [NAN, 3.0, 0.0, 1.0]])
    _same(torch.unique(x, return_inverse=True, return_counts=True),
          torch.unique(x.to(D), return_inverse=True, return_counts=True))
    _same(torch.unique_consecutive(x, return_inverse=True, return_counts=True),
          torch.unique_consecutive(x.to(D), return_inverse=True, return_counts=True))
    e = torch.zeros(0, 3)
    _same(torch.unique(e, return_inverse=True, return_counts=True),
          torch.unique(e.to(D), return_inverse=True, return_counts=True))
    _same(torch.unique(e, dim=0, return_inverse=True, return_counts=True),
          torch.unique(e.to(D), dim=0, return_inverse=True, return_counts=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_searchsorted_forms(dtype):
    g = torch.Generator().manual_seed(0)
    bd = torch.sort(torch.randint(0, 9, (3, 4, 11), generator=g).to(dtype), -1).values
    v = torch.randint(-1, 10, (3, 4, 6), generator=g).to(dtype)
    perm = torch.argsort(torch.rand(bd.shape, generator=g), -1)
    shuffled = bd.gather(-1, perm)
    sorter = torch.argsort(shuffled, dim=-1, stable=True)
    for kw in ({}, {"right": True}, {"side": "right"}, {"side": "left", "out_int32": True}):
        _same(torch.searchsorted(bd, v, **kw), torch.searchsorted(bd.to(D), v.to(D), **kw))
        _same(torch.searchsorted(bd[0, 0], v, **kw), torch.searchsorted(bd[0, 0].to(D), v.to(D), **kw))
        _same(torch.searchsorted(shuffled, v, sorter=sorter, **kw),
              torch.searchsorted(shuffled.to(D), v.to(D), sorter=sorter.to(D), **kw))
        _same(torch.searchsorted(bd[1, 2], 4, **kw), torch.searchsorted(bd[1, 2].to(D), 4, **kw))
        _same(torch.searchsorted(bd[1, 2], 4.5, **kw), torch.searchsorted(bd[1, 2].to(D), 4.5, **kw))
    out = torch.empty(0, dtype=torch.int64, device=D)
    r = torch.searchsorted(bd.to(D), v.to(D), out=out)
    assert r is out
    _same(torch.searchsorted(bd, v), out)
    if dtype.is_floating_point:   # NaN among the values and the boundaries: the CPU's binary search steps
        b = torch.tensor([1.0, NAN, 3.0, 4.0, NAN, 6.0]).to(dtype)
        q = torch.tensor([NAN, 0.0, 1.0, 2.0, 3.5, 5.0, 7.0]).to(dtype)
        for right in (False, True):
            _same(torch.searchsorted(b, q, right=right), torch.searchsorted(b.to(D), q.to(D), right=right))


def _raises(fn, *args, **kw):
    with pytest.raises(Exception) as exp:
        fn(*args, **kw)
    on = [a.to(D) if isinstance(a, torch.Tensor) else a for a in args]
    okw = {k: (v.to(D) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    with pytest.raises(type(exp.value)) as got:
        fn(*on, **okw)
    assert str(got.value) == str(exp.value)


def test_errors_in_the_cpu_words():
    x = torch.randn(3, 4)
    _raises(torch.kthvalue, x, 5, 1)
    _raises(torch.kthvalue, x, 0)
    _raises(torch.kthvalue, torch.zeros(0, 2), 1, 0)
    _raises(torch.kthvalue, x > 0, 1)
    _raises(torch.kthvalue, x, 1, 2)
    _raises(torch.median, x > 0)
    _raises(torch.median, x > 0, 0)
    _raises(torch.nanmedian, torch.zeros(0, 2), 0)
    _raises(torch.mode, torch.zeros(0, 2), 0)
    _raises(torch.unique, torch.zeros(0, 0), dim=0)
    _raises(torch.unique, torch.zeros(3, 0), dim=0)
    _raises(torch.unique_consecutive, torch.tensor(1.0), dim=0)
    s = torch.tensor([1.0, 2.0, 3.0])
    _raises(torch.searchsorted, s, s, side="middle")
    _raises(torch.searchsorted, s, s, side="left", right=True)
    _raises(torch.searchsorted, s, s, sorter=torch.tensor([0, 1]))
    _raises(torch.searchsorted, s, s, sorter=torch.tensor([0, 1, 2]).int())
    _raises(torch.searchsorted, s, s, sorter=torch.tensor([0, 1, 3]))
    _raises(torch.searchsorted, s[None], torch.tensor(2.0))
    _raises(torch.searchsorted, torch.tensor(1.0), s)
    _raises(torch.searchsorted, torch.zeros(2, 3), torch.zeros(3, 3))
    _raises(torch.searchsorted, s > 1, s > 2)
    _raises(torch.searchsorted, s, s, out=torch.zeros(3, dtype=torch.int32))


def test_out_forms_and_overlap():
    x = torch.randn(10, device=D)
    with pytest.raises(RuntimeError, match="unsupported operation"):
        torch.kthvalue(x, 5, out=(x, torch.empty(0, dtype=torch.int64, device=D)))
    with pytest.raises(RuntimeError, match="unsupported operation"):
        torch.median(x, 0, out=(x[:1], torch.empty(0, dtype=torch.int64, device=D)))
    with pytest.raises(RuntimeError, match="output values must be of same type as input"):
        torch.kthvalue(x, 5, out=(torch.empty(0, dtype=torch.int64, device=D),) * 2)
    v, i = torch.empty(0, device=D), torch.empty(0, dtype=torch.int64, device=D)
    for fn, args in ((torch.kthvalue, (3, 0)), (torch.median, (0,)), (torch.nanmedian, (0,)), (torch.mode, (0,))):
        r = fn(x, *args, out=(v, i))
        assert r[0] is v and r[1] is i
        _same(tuple(fn(x.cpu(), *args)), (v, i))


def test_nll_loss2d_forms_and_errors():
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 3, 5, generator=g)
    t = torch.randint(0, 4, (2, 3, 5), generator=g)
    w = torch.rand(4, generator=g)
    for red in ("none", "mean", "sum"):
        torch.testing.assert_close(F.nll_loss(x.to(D), t.to(D), w.to(D), ignore_index=1, reduction=red).cpu(),
                                   F.nll_loss(x, t, w, ignore_index=1, reduction=red))
    a = torch.ops.aten.nll_loss2d_forward
    _raises(a, x, t.to(torch.uint8), w, 1, -100)   # (passes the Long-or-Byte check; the 2-d kernel reads Long)
    _raises(a, x, t[0], None, 1, -100)
    _raises(a, x[0], t, None, 1, -100)
    _raises(a, x, t.int(), None, 1, -100)
    _raises(a, x, t, torch.ones(3), 1, -100)
    _raises(a, x, t[:, :2], None, 1, -100)
    _raises(a, x.long(), t, None, 1, -100)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("channels_last", [False, True])
def test_max_pool3d_indices(dtype, channels_last):
    import torch.nn.functional as F
    x = _ties((2, 3, 5, 6, 7), 3, dtype, 3, nan=0.1 if dtype.is_floating_point else 0.0)
    if dtype.is_floating_point:
        x[0, 0] = float("-inf")   # windows nothing in rises above: the CPU kernel's initial index
    if channels_last:
        x = x.to(memory_format=torch.channels_last_3d)
    for args in (((2, 2, 2),), ((3, 2, 3), (2, 1, 2), (1, 1, 1), (1, 2, 1), True), ((2, 3, 2), 1, (1, 0, 1), 2)):
        e = F.max_pool3d(x, *args, return_indices=True)
        got = F.max_pool3d(x.to(D), *args, return_indices=True)
        _same(e, got)
        assert got[0].is_contiguous(memory_format=torch.channels_last_3d) == channels_last
        if dtype == torch.float32:
            xe, xg = x.clone().requires_grad_(), x.to(D).requires_grad_()
            gy = torch.randn(e[0].shape)
            ge = torch.autograd.grad(F.max_pool3d(xe, *args), xe, gy)[0]
            gg = torch.autograd.grad(F.max_pool3d(xg, *args), xg, gy.to(D))[0]
            torch.testing.assert_close(gg.cpu(), ge)
        e = F.adaptive_max_pool3d(x, (2, 3, 4), True) if dtype.is_floating_point else None
        if e is not None:
            _same(e, F.adaptive_max_pool3d(x.to(D), (2, 3, 4), True))


def test_avg_pool3d_sums_as_the_cpu():
    import torch.nn.functional as F
    x = torch.randn(2, 3, 6, 5, 7, generator=torch.Generator().manual_seed(0))
    for kw in ({"kernel_size": 2}, {"kernel_size": (3, 2, 3), "stride": (2, 1, 2), "padding": 1, "ceil_mode": True},
               {"kernel_size": 3, "padding": 1, "count_include_pad": False},
               {"kernel_size": (2, 3, 2), "stride": 2, "ceil_mode": True, "divisor_override": 5}):
        for xx in (x, x.double(), (x * 10).long(), x.to(memory_format=torch.channels_last_3d)):
            _same(F.avg_pool3d(xx, **kw), F.avg_pool3d(xx.to(D), **kw))   # bit for bit (the CPU's order)


def test_pool3d_errors_in_the_cpu_words():
    import torch.nn.functional as F
    x = torch.randn(1, 2, 4, 4, 4)
    _raises(F.avg_pool3d, x.bfloat16(), 2)
    _raises(F.avg_pool3d, x, 2, stride=0)
    _raises(F.avg_pool3d, x, 5)
    _raises(F.avg_pool3d, x, 2, padding=-1)
    _raises(F.avg_pool3d, x, 2, padding=2)
    _raises(F.avg_pool3d, x[0], 2, divisor_override=0)
    _raises(F.avg_pool3d, x[0, 0], 2)
    _raises(F.avg_pool3d, torch.zeros(2, 0, 4, 4, 4), 2)
    _raises(F.max_pool3d, x, 3, padding=2, dilation=2)
    _raises(F.max_pool3d, x, 2, dilation=0)
    _raises(F.max_pool3d, x > 0, 2)
    _raises(F.max_pool3d, torch.zeros(1, 1, 1, 4, 4), 2)
    _raises(F.max_pool3d, torch.zeros(2, 1, 0, 1, 2), 1)
    _raises(F.adaptive_avg_pool3d, x.long(), 2)
    _raises(F.adaptive_max_pool3d, x[:, :0], 2)
    _raises(F.adaptive_avg_pool3d, x[:, :0], 2)
    _raises(torch.ops.aten._adaptive_avg_pool3d, x, [2, 2])
    _raises(torch.ops.aten._adaptive_avg_pool3d, x[0, 0], [2, 2, 2])
