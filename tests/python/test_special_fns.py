"""torch.special's remaining functions (Bessel J/Y/I/K and their scaled forms,
Airy Ai, spherical j0, entr, erfcx, ndtri, log_ndtr, Hurwitz zeta, the
orthogonal polynomials), igamma / igammac, sinc, logaddexp2, fmax / fmin:
native on the tpu (CPU fallback off), against PyTorch CPU on the same inputs,
special values included, every dtype the CPU supports, backward where PyTorch
defines one, in every eager mode (conftest)."""
import pytest
import torch

from conftest import assert_close

D = "tpu"
pytestmark = pytest.mark.usefixtures("native_only")
S = torch.special
INF, NAN = float("inf"), float("nan")
SPECIALS = [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 1e-30, 5.0, 8.0, 2.09, -2.09, 30.5, 100.0]
F64, F32 = torch.float64, torch.float32

# op -> (function, input range, dtypes beyond float32/float64 the CPU has a kernel for)
UNARY = {
    "bessel_j0": (S.bessel_j0, (-40, 40), ()),
    "bessel_j1": (S.bessel_j1, (-40, 40), ()),
    "bessel_y0": (S.bessel_y0, (-1, 40), ()),
    "bessel_y1": (S.bessel_y1, (-1, 40), ()),
    "modified_bessel_i0": (S.modified_bessel_i0, (-30, 30), ()),
    "modified_bessel_i1": (S.modified_bessel_i1, (-30, 30), ()),
    "modified_bessel_k0": (S.modified_bessel_k0, (-1, 30), ()),
    "modified_bessel_k1": (S.modified_bessel_k1, (-1, 30), ()),
    "scaled_modified_bessel_k0": (S.scaled_modified_bessel_k0, (-1, 30), ()),
    "scaled_modified_bessel_k1": (S.scaled_modified_bessel_k1, (-1, 30), ()),
    "airy_ai": (S.airy_ai, (-30, 12), ()),
    "spherical_bessel_j0": (S.spherical_bessel_j0, (-30, 30), ()),
    "entr": (S.entr, (-2, 10), (torch.bfloat16, torch.float16)),
    "erfcx": (S.erfcx, (-10, 40), ()),
    "ndtri": (S.ndtri, (-0.1, 1.1), ()),
    "log_ndtr": (S.log_ndtr, (-40, 10), ()),
    "sinc": (torch.sinc, (-20, 20), (torch.bfloat16, torch.float16)),
}
# functions of x and n (the degree, read as an integer)
POLY = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
        "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
        "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
        "legendre_polynomial_p"]
# (rtol, atol): float64 agrees to rounding with the CPU (the same algorithms, or more accurate ones); float32 is
# computed in double and rounded once here, in float by the CPU: a few float ulps, and near a zero of the
# function (J, Y, Ai) absolutely.
TOL = {F64: (1e-11, 1e-14), F32: (2e-5, 2e-6), torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (2e-3, 1e-5)}


def _inputs(lo, hi, dtype, n=1500):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, generator=g, dtype=F64) * (hi - lo) + lo
    return torch.cat([x, torch.tensor(SPECIALS, dtype=F64)]).to(dtype)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_cpu(name):
    f, (lo, hi), more = UNARY[name]
    for dtype in (F64, F32) + more:
        x = _inputs(lo, hi, dtype)
        want = f(x)
        rtol, atol = TOL[dtype]
        if dtype == F32 and name in ("erfcx", "log_ndtr", "ndtri", "airy_ai"):
            # the CPU's float erfcx is a few ulps off (more in log_ndtr's far tail); its float Ai(x) for x < -25
            # loses digits in the phase (2/3) |x|^(3/2) (Ai(-29.35): 4e-4 relative): compare with its float64
            want = f(x.double()).float()
        assert_close(f(x.to(D)), want, rtol=rtol, atol=atol)
    if not more:
        with pytest.raises(RuntimeError, match="not implemented for 'BFloat16'"):
            f(torch.ones(3, dtype=torch.bfloat16, device=D))
    assert_close(f(torch.arange(-3, 9, device=D)), f(torch.arange(-3, 9)))  # integers: the default float dtype


def test_bessel_large_and_asymptotic_arguments():
    x = torch.tensor([4.999, 5.0, 5.001, 25.0, 1e3, 1e5, 1e8, 2.0, 2.001, 8.3203353, 103.0, 103.9, 700.0, 710.0],
                     dtype=F64)
    for f in (S.bessel_j0, S.bessel_j1, S.bessel_y0, S.bessel_y1, S.modified_bessel_k0, S.modified_bessel_k1,
              S.scaled_modified_bessel_k0, S.scaled_modified_bessel_k1, S.airy_ai, S.modified_bessel_i0,
              S.modified_bessel_i1):
        for t in (x, -x):
            assert_close(f(t.to(D)), f(t), rtol=1e-11, atol=1e-300)


@pytest.mark.parametrize("name", POLY)
def test_polynomial_matches_cpu(name):
    f = getattr(S, name)
    g = torch.Generator().manual_seed(1)
    xs = torch.cat([torch.rand(300, generator=g, dtype=F64) * 2.4 - 1.2,  # |x| < 1: closed forms for large n
                    torch.tensor([0.0, 1.0, -1.0, 0.5, 2.0, -3.0, 1e3, NAN, INF, -INF], dtype=F64)])
    ns = torch.tensor([-1.0, 0.0, 1.0, 2.0, 3.0, 4.5, 5.0, 7.0, 9.0, 12.0, 40.0, 129.0, 600.0, NAN, INF])
    for dtype in (F64, F32):
        x = xs.to(dtype)[:, None].expand(-1, len(ns))
        n = ns.to(dtype)[None, :].expand(len(xs), -1)
        keep = ~(x.isnan() & (n >= 2) & n.isfinite())  # the CPU returns an uninitialized value there (NaN here)
        want = f(x, n)
        got = f(x.to(D), n.to(D)).cpu()
        if dtype == F64:
            # the CPU's recurrences may be contracted to FMAs: last-bit differences, amplified where they cancel
            torch.testing.assert_close(got[keep], want[keep], rtol=1e-12, atol=1e-13, equal_nan=True)
        else:
            # float32: the closed forms (|x| < 1, large n) run in float as on the CPU (its value); the recurrences
            # run in double, rounded once (the correctly rounded value, where the CPU's float recurrence can be
            # far off: laguerre_l 28%, legendre_p 5e-4); inf / NaN from float's overflow exactly as the CPU's
            right = f(x.double(), n.double()).float()
            same = (got == want) | (got.isnan() & want.isnan())
            near_cpu = (got.double() - want.double()).abs() <= 2e-6 * want.double().abs()
            near_f64 = (got.double() - right.double()).abs() <= 2e-6 * right.double().abs()
            assert ((same | want.isfinite() & (near_cpu | near_f64)) | ~keep).all()
        assert got[~keep].isnan().all()
    x = torch.tensor([0.25, -0.7, 3.0])
    assert_close(f(x.to(D), 4), f(x, 4))  # a host scalar n (n_scalar)
    assert_close(f(0.5, x.to(D).abs()), f(0.5, x.abs()))  # a host scalar x (x_scalar)
    assert_close(f(x.to(D), torch.tensor([1, 2, 3], device=D)), f(x, torch.tensor([1, 2, 3])))  # int n: float32


def test_zeta_igamma_match_cpu():
    g = torch.Generator().manual_seed(2)
    a = torch.cat([torch.rand(400, generator=g, dtype=F64) * 12 - 2, torch.tensor(SPECIALS, dtype=F64)])
    b = torch.cat([torch.rand(400, generator=g, dtype=F64) * 14 - 2, torch.tensor(SPECIALS[::-1], dtype=F64)])
    a2, b2 = a[:, None], b[None, ::7]
    for dtype in (F64, F32):
        x, q = a2.to(dtype), b2.to(dtype)
        rtol, atol = TOL[dtype]
        assert_close(S.zeta(x.to(D), q.to(D)), S.zeta(x, q), rtol=rtol, atol=atol)
    big = torch.tensor([30.0, 150.0, 250.0, 1e3, 1e4], dtype=F64)
    for dtype in (F64, F32, torch.bfloat16, torch.float16):
        x, y = a2.abs().to(dtype), b2.abs().to(dtype)
        # float32 / half types: the CPU computes in float, here in double (rounded once)
        rtol, atol = (1e-10, 1e-13) if dtype == F64 else TOL[dtype] if dtype != F32 else (1e-4, 2e-6)
        for f in (torch.igamma, torch.igammac):
            want = f(x.double(), y.double()).to(dtype) if dtype == F32 else f(x, y)
            assert_close(f(x.to(D), y.to(D)), want, rtol=rtol, atol=atol)
        if dtype == F64:  # a ~ x, large: PyTorch's uniform asymptotic expansion, a series / continued fraction here
            for f in (torch.igamma, torch.igammac):
                assert_close(f(big.to(D), (big * 1.05).to(D)), f(big, big * 1.05), rtol=1e-9, atol=1e-15)
    x, y = a[:8].abs() + 1, b[:8]
    assert_close(S.zeta(x.to(D), 2.0), S.zeta(x, 2.0))  # other_scalar
    assert_close(S.zeta(3.0, y.to(D)), S.zeta(3.0, y))  # self_scalar
    with pytest.raises(RuntimeError, match="not implemented for 'Half'"):
        S.zeta(x.half().to(D), y.half().to(D))
    with pytest.raises(RuntimeError, match="not implemented for 'Long'"):
        torch.igamma(torch.arange(3, device=D), torch.arange(3, device=D))


@pytest.mark.parametrize("dtype", [F32, torch.bfloat16, F64, torch.float16])
def test_logaddexp2_fmax_fmin_match_cpu(dtype):
    g = torch.Generator().manual_seed(3)
    s = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 1.0, 2.0], dtype=F64)
    x = torch.cat([torch.randn(200, generator=g, dtype=F64) * 30, s.repeat_interleave(7)]).to(dtype)
    y = torch.cat([torch.randn(200, generator=g, dtype=F64) * 30, s.repeat(7)]).to(dtype)
    for f in (torch.logaddexp2, torch.fmax, torch.fmin):
        assert_close(f(x.to(D), y.to(D)), f(x, y), rtol=TOL[dtype][0], atol=TOL[dtype][1])
        assert_close(f(x.to(D), y.to(D)[:1]), f(x, y[:1]), rtol=TOL[dtype][0], atol=TOL[dtype][1])
    i = torch.tensor([-3, 0, 7, 2])
    for t in (torch.int64, torch.uint8, torch.bool):
        a, b = i.to(t), i.flip(0).to(t)
        assert_close(torch.fmax(a.to(D), b.to(D)), torch.fmax(a, b))
        assert_close(torch.fmin(a.to(D), b.to(D)), torch.fmin(a, b))


def test_backward_matches_cpu():
    g = torch.Generator().manual_seed(4)
    x = torch.rand(60, generator=g, dtype=F64) * 4 + 0.1
    p = torch.rand(60, generator=g, dtype=F64) * 0.98 + 0.01
    cases = [(S.entr, x), (S.erfcx, x - 2), (S.ndtri, p), (S.log_ndtr, x * 3 - 8), (torch.sinc, x - 2)]
    for f, t in cases:
        a = t.clone().requires_grad_()
        b = t.to(D).requires_grad_()
        f(a).sum().backward()
        f(b).sum().backward()
        assert_close(b.grad, a.grad, rtol=1e-10, atol=1e-12)
    q = x + 0.5
    for f in (lambda u, v: S.zeta(u.detach() + 1.5, v), lambda u, v: torch.igamma(u.detach(), v),
              lambda u, v: torch.igammac(u.detach(), v), torch.logaddexp2, torch.fmax, torch.fmin):
        a, b = x.clone().requires_grad_(), q.clone().requires_grad_()
        c, d = x.to(D).requires_grad_(), q.to(D).requires_grad_()
        f(a, b).sum().backward()
        f(c, d).sum().backward()
        assert_close(d.grad, b.grad, rtol=1e-9, atol=1e-12)
        if a.grad is not None:
            assert_close(c.grad, a.grad, rtol=1e-9, atol=1e-12)
