"""Advanced indexing (aten::index.Tensor, index_put_, masks) and nonzero,
native on the tpu (no CPU fallback), against PyTorch CPU on the same inputs:
values, shapes, strides, errors in PyTorch's words and exception types."""
import pytest
import torch
import torch_tpu

from conftest import assert_close

D = "tpu"
L = lambda *a: torch.tensor(a)  # noqa: E731


pytestmark = pytest.mark.usefixtures("native_only")  # ops here must run natively (conftest)


def _x(dtype, shape=(4, 5, 6), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 3
    if dtype == torch.bool:
        return x > 0
    return x.to(dtype)


GETS = [
    lambda x: x[L(0, 2, -1)],
    lambda x: x[:, L(1, 1, 4)],
    lambda x: x[L(0, 1), L(2, 3)],
    lambda x: x[L(0, 1), :, L(2, 3)],           # separated: the index dims go first
    lambda x: x[..., L(5, 0, -6)],
    lambda x: x[L([0], [1]), L(1, 2)],          # broadcast to [2, 2]
    lambda x: x[x > 0] if x.dtype != torch.bool else x[x],
    lambda x: x[(x[:, :, 0] > 0) if x.dtype != torch.bool else x[:, :, 0]],
    lambda x: x[1:3, L(0, 4)],
    lambda x: x.transpose(0, 2)[L(1, 2), 1:, L(0, 3)],
    lambda x: x[L(1), L(2), L(3)],
    lambda x: x[L(0, 1).int()],
    lambda x: x[L(0, 1), None, L(1, 1)],
    lambda x: x[torch.empty(0, dtype=torch.long)],
    lambda x: x[L([[0, 1], [2, 3]]), :, L(0)],
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("case", range(len(GETS)))
def test_index_matches_cpu(dtype, case):
    x = _x(dtype)
    assert_close(GETS[case](x.to(D)), GETS[case](x), rtol=0, atol=0)


def test_index_noncontiguous_and_views():
    x = _x(torch.float32, (8, 9, 14))
    for v in (lambda t: t.permute(2, 0, 1), lambda t: t[::2, 1:, ::2], lambda t: t.expand(3, 8, 9, 14)):
        xt, xc = v(x.to(D)), v(x)
        for f in GETS[:6]:
            assert_close(f(xt), f(xc), rtol=0, atol=0)


PUTS = [
    lambda x, v: x.index_put_((L(0, 2),), v[:2]),
    lambda x, v: x.index_put_((L(0, 0, 1),), v[:3], accumulate=True),     # duplicates accumulate
    lambda x, v: x.index_put_((L(0, 0), L(1, 1)), v[0, 0], accumulate=True),
    lambda x, v: x.__setitem__(x > 0.5, 7.0),
    lambda x, v: x.__setitem__((slice(None), L(1, 3)), 2.0),
    lambda x, v: x.__setitem__((L(0, 1), slice(None), L(2, 3)), v[0, :2, :5]),
    lambda x, v: x.__setitem__((L(-1, 1), L(0, -5)), v[0, 0]),              # values broadcast
    lambda x, v: x.index_put_((x[:, :, 0] > 0,), v[0, 0], accumulate=True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64])
@pytest.mark.parametrize("case", range(len(PUTS)))
def test_index_put_matches_cpu(dtype, case):
    x = _x(torch.float32)
    v = _x(torch.float32, seed=1)
    x, v = x.to(dtype), v.to(dtype)
    a, b = x.clone(), x.to(D)
    PUTS[case](a, v)
    PUTS[case](b, v.to(D))
    assert_close(b, a, rtol=0, atol=0)


def test_index_put_accumulate_many_duplicates_is_ordered():
    idx = torch.randint(0, 7, (5000,), generator=torch.Generator().manual_seed(3))
    v = torch.randn(5000, generator=torch.Generator().manual_seed(4))
    a = torch.zeros(7).index_put_((idx,), v, accumulate=True)
    b = torch.zeros(7, device=D).index_put_((idx.to(D),), v.to(D), accumulate=True)
    assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_index_backward_matches_cpu():
    x = _x(torch.float32)
    xt, xc = x.to(D).requires_grad_(), x.clone().requires_grad_()
    for t in (xt, xc):
        (t[L(0, 0, 2), :, L(1, 1, 1)] ** 2).sum().backward()
        (t[t > 1] * 3).sum().backward()
    assert_close(xt.grad, xc.grad)


def test_cpu_indices_for_a_tpu_tensor():
    x = _x(torch.float32)
    assert_close(x.to(D)[L(1, 2)], x[L(1, 2)])


ERRORS = [
    (lambda x: x[L(0, 1), L(0, 1, 2)], IndexError, "shape mismatch: indexing tensors could not be broadcast"),
    (lambda x: x[torch.ones(3, dtype=torch.bool)], IndexError, "The shape of the mask \\[3\\] at index 0"),
    (lambda x: x[L(1.0)], IndexError, "tensors used as indices must be long, int, byte or bool tensors"),
    (lambda x: x[L(0), L(0), L(0), L(0)], IndexError, "too many indices for tensor of dimension 3"),
    (lambda x: x.index_put_((L(0),), torch.ones(1, 5, 6, dtype=torch.float64)), RuntimeError,
     "Index put requires the source and destination dtypes match"),
    (lambda x: x.index_put_((L(0, 1),), torch.ones(3, 6)), RuntimeError, "shape mismatch: value tensor of shape"),
]


@pytest.mark.parametrize("case", range(len(ERRORS)))
def test_index_errors_as_cpu(case):
    f, exc, msg = ERRORS[case]
    x = _x(torch.float32)
    with pytest.raises(exc, match=msg):
        f(x)
    with pytest.raises(exc, match=msg):
        f(x.to(D))
    assert_close(x.to(D)[L(1)], x[L(1)])  # the device still works


def test_index_out_of_range_raises_and_device_keeps_working():
    x = _x(torch.float32)
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 4"):
        x[L(9)]
    t = x.to(D)
    # on the device the check runs in the kernel: raised at the op (Debug) or the next sync
    with pytest.raises(RuntimeError, match="index 9 is out of bounds for dimension 0 with size 4"):
        t[L(9)].cpu()
    with pytest.raises(RuntimeError, match="index -6 is out of bounds for dimension 1 with size 5"):
        t2 = t.clone()
        t2[:, L(-6)] = 1.0
        t2.cpu()
    assert_close(t[L(-1)], x[L(-1)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool])
def test_nonzero_matches_cpu(dtype):
    x = _x(torch.float32, (3, 4, 5))
    x[x.abs() < 2] = 0
    x = x.to(dtype)
    for v in (x, x.transpose(0, 2), x[:, ::2], x[1], x.reshape(-1)):
        assert_close(torch.nonzero(v.to(D)), torch.nonzero(v))
        assert_close(torch.argwhere(v.to(D)), torch.argwhere(v))
        for a, b in zip(torch.where(v.to(D)), torch.where(v)):
            assert_close(a, b)


def test_nonzero_special_values_and_shapes():
    x = torch.tensor([0.0, -0.0, float("nan"), 1e-45, float("inf")])
    assert_close(torch.nonzero(x.to(D)), torch.nonzero(x))
    for v in (torch.tensor(3.0), torch.tensor(0.0), torch.zeros(0, 3), torch.zeros(4, 5), torch.ones(70000)):
        assert_close(torch.nonzero(v.to(D)), torch.nonzero(v))


def test_masked_ops_on_device():
    x = _x(torch.float32)
    m = x > 0.3
    assert_close(x.to(D).masked_select(m.to(D)), x.masked_select(m))
    y, yt = x.clone(), x.to(D)
    y[m] = y[m] * 2
    yt[m.to(D)] = yt[m.to(D)] * 2
    assert_close(yt, y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("bins,lo,hi", [(10, 0, 0), (7, -1.5, 2.0), (1, 0, 1), (33, -3, 3)])
def test_histc_matches_cpu(dtype, bins, lo, hi):
    g = torch.Generator().manual_seed(bins)
    x = (torch.randn(150, generator=g) * 2).to(dtype)
    if lo != hi:  # (with a NaN the data range is NaN: both raise "range of [nan, nan] is not finite")
        x[3] = float("nan")
    x[4], x[5] = hi, lo   # both edges (the last bin is closed)
    for v in (x, x.reshape(10, 15).t()):
        assert_close(torch.histc(v.to(D), bins=bins, min=lo, max=hi), torch.histc(v, bins=bins, min=lo, max=hi))


def test_histc_constant_and_empty_input():
    for x in (torch.full((5,), 2.0), torch.zeros(0), torch.tensor([3.0])):
        assert_close(torch.histc(x.to(D), bins=4), torch.histc(x, bins=4))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_integers_as_cuda(dtype):
    """transformers' MoE routing: torch.histc(experts.int(), bins=E, min=0, max=E - 1). The CPU
    rejects integer inputs; CUDA bins them in int64 arithmetic: (x - min) * bins // (max - min)."""
    E = 8
    experts = torch.randint(0, E, (64,), generator=torch.Generator().manual_seed(0)).to(dtype)
    got = torch.histc(experts.to(D), bins=E, min=0, max=E - 1)
    assert got.dtype == dtype
    assert torch.equal(got.cpu(), torch.bincount(experts.long(), minlength=E).to(dtype))
    x = torch.tensor([0, 1, 1, 3, 4, 9], dtype=dtype)
    want = torch.zeros(4, dtype=torch.long)
    for e in x.tolist():
        if 0 <= e <= 3:
            want[min(e * 4 // 3, 3)] += 1
    assert torch.equal(torch.histc(x.to(D), bins=4, min=0, max=3).cpu(), want.to(dtype))


@pytest.mark.parametrize("weights", [None, torch.float32, torch.float64, torch.int64, torch.float16])
def test_bincount_matches_cpu(weights):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 9, (300,), generator=g)
    w = None if weights is None else (torch.rand(300, generator=g) * 4).to(weights)
    for minlength in (0, 5, 20):
        got = torch.bincount(x.to(D), None if w is None else w.to(D), minlength=minlength)
        assert_close(got, torch.bincount(x, w, minlength=minlength), rtol=1e-6, atol=1e-6)
    assert_close(torch.bincount(torch.zeros(0, dtype=torch.long).to(D)), torch.bincount(torch.zeros(0, dtype=torch.long)))


HIST_ERRORS = [
    lambda d: torch.histc(torch.randn(5, device=d), bins=0),
    lambda d: torch.histc(torch.randn(5, device=d), bins=3, min=2, max=1),
    lambda d: torch.histc(torch.tensor([1.0, float("inf")], device=d), bins=3),
    lambda d: torch.bincount(torch.tensor([-1, 2], device=d)),
    lambda d: torch.bincount(torch.tensor([[1]], device=d)),
    lambda d: torch.bincount(torch.tensor([1, 2], device=d), torch.tensor([1.0], device=d)),
    lambda d: torch.bincount(torch.tensor([1, 2], device=d), minlength=-1),
]


@pytest.mark.parametrize("case", range(len(HIST_ERRORS)))
def test_histogram_errors_as_cpu(case):
    with pytest.raises(RuntimeError) as cpu:
        HIST_ERRORS[case]("cpu")
    with pytest.raises(RuntimeError) as ours:
        HIST_ERRORS[case](D)
    assert str(ours.value).splitlines()[0] == str(cpu.value).splitlines()[0]


def _sortable(dtype, shape=(4, 33, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-5, 6, shape, generator=g).to(torch.float32)   # ties
    if dtype.is_floating_point:
        x.view(-1)[::17] = float("nan")
        x.view(-1)[5::19] = float("-inf")
        return x.to(dtype)
    if dtype == torch.bool:
        return x > 0
    if dtype == torch.uint8:
        return x.abs().to(dtype)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                                   torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable_matches_cpu(dtype, dim, descending):
    x = _sortable(dtype)
    for v in (x, x.transpose(0, 2)):
        assert_close(torch.sort(v.to(D), dim=dim, descending=descending, stable=True),
                     torch.sort(v, dim=dim, descending=descending, stable=True))
        assert_close(torch.argsort(v.to(D), dim=dim, descending=descending, stable=True),
                     torch.argsort(v, dim=dim, descending=descending, stable=True))


def test_sort_values_unstable_and_0d():
    x = torch.randn(6, 50)
    assert_close(torch.sort(x.to(D), dim=1)[0], torch.sort(x, dim=1)[0])
    assert_close(torch.sort(x.to(D), dim=1)[1], torch.sort(x, dim=1)[1])   # distinct keys: one answer
    s = torch.tensor(2.5)
    assert_close(torch.sort(s.to(D)), torch.sort(s))
    assert_close(torch.sort(torch.zeros(0, 3).to(D), dim=0), torch.sort(torch.zeros(0, 3), dim=0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("k,dim,largest", [(1, -1, True), (5, -1, False), (3, 0, True), (0, 1, True), (33, 1, True)])
def test_topk_matches_cpu(dtype, k, dim, largest):
    g = torch.Generator().manual_seed(k)
    x = torch.randperm(4 * 33 * 5, generator=g).reshape(4, 33, 5).to(dtype)   # distinct: one right answer
    if dtype == torch.bfloat16:
        x = torch.randn(4, 33, 5, generator=g).to(dtype).unique().reshape(-1)[:4 * 33 * 5]
        x = torch.cat([x, torch.randn(660, generator=g).to(dtype)]).unique()[:660].reshape(4, 33, 5)
    assert_close(torch.topk(x.to(D), k, dim=dim, largest=largest), torch.topk(x, k, dim=dim, largest=largest))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_topk_ties_at_cpu_indices(dtype):
    """Among equal values topk returns the CPU's indices (its selection order: a heap when 64k <= n, else a
    quickselect), sorted or not, NaN counted as largest: a Mixture-of-Experts router over equal scores (a
    zero-initialized gate) must pick the CPU's experts."""
    g = torch.Generator().manual_seed(0)
    for n in (5, 17, 64, 65, 129, 300, 2000):
        for k in sorted({1, 2, n // 64, n // 2, n} - {0}):
            x = torch.randint(0, 3, (3, n), generator=g).to(dtype)
            if dtype.is_floating_point:
                x[torch.rand(3, n, generator=g) < 0.05] = float("nan")
            for largest in (True, False):
                for srt in (True, False):
                    want = torch.topk(x, k, largest=largest, sorted=srt)
                    got = torch.topk(x.to(D), k, largest=largest, sorted=srt)
                    assert torch.equal(got.indices.cpu(), want.indices), (n, k, largest, srt)
                    assert_close(got.values, want.values)
    router = torch.full((32, 8), 0.5, dtype=dtype)      # every expert scores the same
    assert torch.equal(torch.topk(router.to(D), 2, dim=1).indices.cpu(), torch.topk(router, 2, dim=1).indices)


def test_sort_topk_errors_as_cpu():
    x = torch.randn(3, 4)
    for f, exc in ((lambda t: torch.topk(t, 5), RuntimeError), (lambda t: torch.sort(t, dim=2), IndexError),
                   (lambda t: torch.topk(t, -1), RuntimeError)):
        with pytest.raises(exc) as cpu:
            f(x)
        with pytest.raises(exc) as ours:
            f(x.to(D))
        assert str(ours.value).splitlines()[0] == str(cpu.value).splitlines()[0]


def test_generate_style_sampling_ops_are_native():
    """What sampling in generate() runs per token: top-k filter, top-p (sort, cumsum, scatter), multinomial."""
    logits = torch.randn(2, 50).to(D)
    top = torch.topk(logits, 10)[0][..., -1, None]
    logits = logits.masked_fill(logits < top, float("-inf"))
    sorted_logits, sorted_idx = torch.sort(logits, descending=False)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    remove = cum <= 0.1
    remove = remove.scatter(1, sorted_idx, remove)
    logits = logits.masked_fill(remove, float("-inf"))
    assert torch.isfinite(logits).sum().item() >= 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_matches_cpu(dtype, dim):
    g = torch.Generator().manual_seed(dim + 5)
    x = _x(dtype, (4, 6, 5))
    src = _x(dtype, (4, 6, 5), seed=2)
    # a permutation along dim (no duplicates: scatter's result is then unique) on an index smaller than src
    idx = torch.argsort(torch.rand(*[min(a, b) for a, b in zip(x.shape, (3, 5, 4))], generator=g), dim=dim)
    for f in (lambda t, i, s: t.scatter(dim, i, s), lambda t, i, s: t.scatter(dim, i, 1 if dtype != torch.bool else True),
              lambda t, i, s: t.clone().scatter_(dim, i, s)):
        assert_close(f(x.to(D), idx.to(D), src.to(D)), f(x, idx, src))


def test_scatter_errors_as_cpu():
    x, s = torch.randn(3, 4), torch.randn(3, 4)
    for f in (lambda t, i, u: t.scatter(0, i.short(), u), lambda t, i, u: t.scatter(0, i, u.double()),
              lambda t, i, u: t.scatter(1, i[None], u)):
        i = torch.zeros(2, 2, dtype=torch.long)
        with pytest.raises(RuntimeError) as cpu:
            f(x, i, s)
        with pytest.raises(RuntimeError) as ours:
            f(x.to(D), i.to(D), s.to(D))
        assert str(ours.value).splitlines()[0] == str(cpu.value).splitlines()[0]
