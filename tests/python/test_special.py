"""Special functions (lgamma, digamma, polygamma, erfinv, Bessel I0/I1 and their
scaled forms), signbit, gcd / lcm, and the scans logcumsumexp / cummax /
cummin: native on the tpu (fallback off), forward and backward, against
PyTorch CPU, every eager mode (conftest)."""
import math

import pytest
import torch

from conftest import assert_close

D = "tpu"
pytestmark = pytest.mark.usefixtures("native_only")

SPECIALS = {float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, 2.0, -1.0, -2.0, 0.5, -0.5, 1e-30, 30.5, 31.0, 100.0}
FLOATS = [torch.float32, torch.bfloat16, torch.float64, torch.float16]


def _inputs(dtype, lo=-6.0, hi=6.0, n=2000):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo
    x = torch.cat([x, torch.tensor(sorted(SPECIALS, key=str), dtype=torch.float64)])
    return x.to(dtype)


UNARY = {
    "lgamma": torch.lgamma, "digamma": torch.digamma, "erfinv": torch.erfinv, "i0": torch.i0,
    "i0e": torch.special.i0e, "i1": torch.special.i1, "i1e": torch.special.i1e,
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_special_matches_cpu(name, dtype):
    f = UNARY[name]
    x = _inputs(dtype, -1.2, 1.2) if name == "erfinv" else _inputs(dtype)
    if name in ("i0", "i1") and dtype in (torch.float32, torch.float64):
        x = torch.cat([x, torch.tensor([-80.0, 45.0, 88.0, 95.0], dtype=dtype)])  # the asymptotic branch, overflow
    if dtype == torch.float16 and name in ("i1", "i1e"):
        pytest.skip("PyTorch's CPU has no float16 kernel for special.i1 / i1e")
    # Computed in double and rounded once: the CPU's float kernels are a few ulps off here and there.
    want = f(x.double()).to(dtype) if dtype in (torch.float32, torch.float64) else f(x)
    tol = {torch.float32: (1e-5, 1e-6), torch.float64: (1e-12, 1e-12)}.get(dtype, (1.6e-2, 1e-5))
    assert_close(f(x.to(D)), want, rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_polygamma_matches_cpu(n, dtype):
    x = _inputs(dtype, -4.0, 8.0)
    x = x[(x != x.round()) | (x > 0) | x.isnan()]  # poles: CPU's float value there depends on its float sin(pi x)
    # PyTorch's float32 polygamma is up to 4e-4 off near poles; compare with its float64 result, rounded.
    want = torch.polygamma(n, x.double()).to(dtype) if dtype != torch.bfloat16 else torch.polygamma(n, x)
    # float64: PyTorch's trigamma (n = 1) is accurate to about 1e-10 (ours to 1e-15, checked with mpmath)
    tol = {torch.float32: (2e-6, 1e-6), torch.float64: (1e-9, 1e-12)}.get(dtype, (1.6e-2, 1e-5))
    assert_close(torch.polygamma(n, x.to(D)), want, rtol=tol[0], atol=tol[1])
    with pytest.raises(RuntimeError, match="does not support negative n"):
        torch.polygamma(-1, x.to(D))


def test_special_backward_and_integer_inputs():
    x = torch.rand(50, dtype=torch.float64) * 4 + 0.2
    for f in (torch.lgamma, torch.digamma, lambda t: torch.polygamma(2, t), torch.i0, torch.special.i0e,
              torch.special.i1, torch.special.i1e, lambda t: torch.erfinv(t / 5)):
        a = x.clone().requires_grad_()
        b = x.to(D).requires_grad_()
        f(a).sum().backward()
        f(b).sum().backward()
        assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-12)  # digamma' is trigamma: CPU's to ~1e-10
    i = torch.arange(-5, 6)
    for f in (torch.lgamma, torch.digamma, torch.erfinv, torch.i0):
        assert_close(f(i.to(D)), f(i))
    assert torch.special.multigammaln(x.to(D) + 3, 3).device.type == D


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int8, torch.uint8, torch.bool])
def test_signbit_matches_cpu(dtype):
    x = torch.tensor([-2.5, -0.0, 0.0, 1.0, float("-inf"), float("inf"), float("nan"), -1e-40, 3.0])
    x = x.to(dtype) if dtype.is_floating_point else torch.tensor([-3, 0, 5, 1, -128, 127]).to(dtype)
    got = torch.signbit(x.to(D))
    assert got.dtype == torch.bool
    assert_close(got, torch.signbit(x))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_gcd_lcm_match_cpu(dtype):
    g = torch.Generator().manual_seed(0)
    lo = 0 if dtype == torch.uint8 else -60
    a, b = (torch.randint(lo, 60, (400,), generator=g).to(dtype) for _ in range(2))
    a[:3] = 0
    b[1:4] = 0
    for f in (torch.gcd, torch.lcm):
        assert_close(f(a.to(D), b.to(D)), f(a, b))
        assert_close(f(a.to(D), b[7].to(D)), f(a, b[7]))
    if dtype == torch.int64:  # |INT64_MIN| wraps, as in PyTorch's Euclid (CPU's lcm there divides by -1: SIGFPE)
        m = torch.tensor([-(2**63), -(2**63), 12])
        assert_close(torch.gcd(m.to(D), torch.tensor([6, 0, -(2**63)], device=D)), torch.tensor([-2, -(2**63), 4]))
        assert torch.lcm(m.to(D), torch.tensor([5, 0, 1], device=D)).tolist() == [-(2**63), 0, 12]
    with pytest.raises(RuntimeError, match="not implemented for 'Float'"):
        torch.gcd(a.float().to(D), b.float().to(D))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("fn", ["cummax", "cummin"])
def test_cummax_cummin_match_cpu(fn, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 4, (5, 37, 6), generator=g).to(dtype)  # many ties: the later index wins
    if dtype.is_floating_point:
        x[1, 4, 2] = float("nan")
        x[2, 10, :] = float("nan")
        x[3, 0, 0] = float("-inf")
    f = getattr(torch, fn)
    for dim in (0, 1, 2, -1):
        for t in (x, x.transpose(0, 2)):
            want = f(t, dim)
            got = f(t.to(D), dim)
            assert_close(got.values, want.values)
            assert_close(got.indices, want.indices)
    want = f(torch.tensor(3).to(dtype), 0)
    got = f(torch.tensor(3).to(dtype).to(D), 0)
    assert_close(got.values, want.values) and assert_close(got.indices, want.indices)
    v, i = torch.empty(0, device=D, dtype=dtype), torch.empty(0, device=D, dtype=torch.int64)
    f(x.to(D), 1, out=(v, i))
    assert_close(v, f(x, 1).values)
    if dtype in (torch.float32, torch.float64):  # bf16: scatter_add's rounding order differs from CPU's
        a = x.clone().nan_to_num_(0).requires_grad_()
        b = a.detach().to(D).requires_grad_()
        w = torch.randn(a.shape, generator=g, dtype=torch.float64).to(dtype)
        (f(a, 1).values * w).sum().backward()
        (f(b, 1).values * w.to(D)).sum().backward()
        assert_close(b.grad, a.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_logcumsumexp_matches_cpu(dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 300, generator=g, dtype=torch.float64) * 30).to(dtype)
    x[0, 5] = float("inf")
    x[1, 7] = float("-inf")
    x[1, :3] = float("-inf")
    x[2, 9] = float("nan")
    for dim in (0, 1):
        assert_close(torch.logcumsumexp(x.to(D), dim), torch.logcumsumexp(x, dim),
                     rtol=1e-5 if dtype == torch.float32 else None, atol=1e-5 if dtype == torch.float32 else None)
    y = torch.randn(6, 9, dtype=torch.float64, generator=g)
    a, b = y.clone().requires_grad_(), y.to(D).requires_grad_()
    (torch.logcumsumexp(a, 1) ** 2).sum().backward()
    (torch.logcumsumexp(b, 1) ** 2).sum().backward()
    assert_close(b.grad, a.grad)
    with pytest.raises(RuntimeError, match="not implemented for 'Long'"):
        torch.logcumsumexp(torch.arange(4, device=D), 0)
    assert math.isinf(torch.logcumsumexp(torch.full((3,), float("-inf"), device=D), 0)[-1].item())
