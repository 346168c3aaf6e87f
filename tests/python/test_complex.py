"""Complex tensors (complex64, complex128) and torch.fft against the CPU, in every eager mode.

Native, with the CPU fallback off: storage and moves between host and device, casts between complex and
real dtypes, fills, views (view_as_real / view_as_complex, real / imag, conj and its resolution, slices),
cat, and the FFT family (fft, ifft, rfft, irfft, hfft, fft2, fftn, rfftn, irfftn, stft, istft) over every
norm, odd lengths (mixed radix and Bluestein's large primes), padding and trimming (n=), non-contiguous
inputs and out=; arithmetic: add, sub, mul, div (with real and scalar operands, broadcasting, in place), neg,
abs, reciprocal, sum, mean, mm / bmm / matmul, torch.complex, sgn, polar (from native ops, with their autograd).
The rest of complex math (prod, exp, angle, roll, vdot, ...) is not native
yet: it goes to the CPU fallback, counted, and gives the CPU's answer; with the fallback off it raises
NotImplementedError.
"""
import warnings

import pytest
import torch
import torch_tpu

D = "tpu"
CDTYPES = [torch.complex64, torch.complex128]


@pytest.fixture
def no_fallback():
    torch_tpu.set_cpu_fallback_enabled(False)
    yield
    torch_tpu.set_cpu_fallback_enabled(True)


def _tol(dtype):
    return dict(rtol=2e-5, atol=2e-5) if dtype in (torch.complex64, torch.float32) else dict(rtol=1e-12, atol=1e-12)


def _same(exp, got, exact=False, **tol):
    assert got.device.type == D, got.device
    assert got.dtype == exp.dtype and got.shape == exp.shape, (got.dtype, exp.dtype, got.shape, exp.shape)
    g = got.cpu()
    if exact:
        assert torch.equal(g.resolve_conj(), exp.resolve_conj()), (g, exp)
    else:
        torch.testing.assert_close(g, exp, **(tol or _tol(exp.dtype)))


def _rand(shape, dtype, seed=0):
    return torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("dtype", CDTYPES)
def test_moves_casts_fills_views(dtype):
    z = _rand((4, 6), dtype)
    t = z.to(D)
    _same(z, t, exact=True)
    _same(z.t(), t.t().contiguous(), exact=True)                          # strided device copy
    _same(z[1:, ::2], t[1:, ::2], exact=True)
    _same(torch.view_as_real(z), torch.view_as_real(t), exact=True)
    _same(torch.view_as_complex(torch.view_as_real(z)), torch.view_as_complex(torch.view_as_real(t)), exact=True)
    _same(z.real, t.real, exact=True)
    _same(z.imag, t.imag, exact=True)
    _same(z.conj(), t.conj(), exact=True)                                 # the conj bit, resolved at .cpu()
    _same(z.conj().resolve_conj(), t.conj().resolve_conj(), exact=True)   # on the device
    _same(z.conj().imag, t.conj().imag, exact=True)                       # a negative bit
    _same(z.conj().imag.resolve_neg(), t.conj().imag.resolve_neg(), exact=True)
    _same(torch.conj_physical(z), torch.conj_physical(t), exact=True)
    other = torch.complex128 if dtype == torch.complex64 else torch.complex64
    _same(z.to(other), t.to(other), exact=True)                           # complex -> complex cast
    x = _rand((4, 6), torch.float32, 1)
    _same(x.to(dtype), x.to(D).to(dtype), exact=True)                     # real -> complex
    _same(x.to(torch.int64).to(dtype), x.to(torch.int64).to(D).to(dtype), exact=True)
    with warnings.catch_warnings():                                       # (warned once per process, as on CPU)
        warnings.simplefilter("ignore")
        _same(z.to(torch.float64), t.to(torch.float64), exact=True)      # complex -> real: the real part
    _same(torch.zeros(3, 2, dtype=dtype), torch.zeros(3, 2, dtype=dtype, device=D), exact=True)
    _same(torch.full((5,), 1.5 - 2j, dtype=dtype), torch.full((5,), 1.5 - 2j, dtype=dtype, device=D), exact=True)
    _same(z.clone().fill_(3j), t.clone().fill_(3j), exact=True)
    _same(z.clone().fill_(torch.tensor(2 + 1j)), t.clone().fill_(torch.tensor(2 + 1j, device=D)), exact=True)
    _same(torch.cat([z, z.conj()]), torch.cat([t, t.conj()]), exact=True)
    u = t.clone()
    u[1:3].copy_(t.conj()[0:2])                                           # copy_ into a slice, conj source
    w = z.clone()
    w[1:3].copy_(z.conj()[0:2])
    _same(w, u, exact=True)
    u.conj().copy_(t)                                                     # a conjugated destination
    w.conj().copy_(z)
    _same(w, u, exact=True)
    h = torch.empty(4, 6, dtype=dtype)
    h.conj().copy_(t)                                                     # device -> conjugated host view
    _same(z.conj(), h.to(D), exact=True)
    assert t[1, 2].item() == z[1, 2].item()
    assert t.tolist() == z.tolist()


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("n", [1, 2, 5, 8, 12, 45, 64, 67, 128, 210, 257, 1000])
def test_fft_lengths(dtype, n):
    z = _rand((3, n), dtype, n)
    t = z.to(D)
    for norm in (None, "ortho", "forward"):
        _same(torch.fft.fft(z, norm=norm), torch.fft.fft(t, norm=norm))
        _same(torch.fft.ifft(z, norm=norm), torch.fft.ifft(t, norm=norm))
    real = torch.float32 if dtype == torch.complex64 else torch.float64
    x = _rand((2, n), real, n + 1)
    _same(torch.fft.rfft(x), torch.fft.rfft(x.to(D)))
    _same(torch.fft.irfft(z, n=n), torch.fft.irfft(t, n=n))
    _same(torch.fft.hfft(z, n=n), torch.fft.hfft(t, n=n))
    _same(torch.fft.ihfft(x), torch.fft.ihfft(x.to(D)))


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("dtype", CDTYPES)
def test_fft_nd_padding_layouts_out(dtype):
    z = _rand((4, 6, 10), dtype, 3)
    t = z.to(D)
    _same(torch.fft.fft2(z), torch.fft.fft2(t))
    _same(torch.fft.ifftn(z, norm="ortho"), torch.fft.ifftn(t, norm="ortho"))
    _same(torch.fft.fftn(z, s=(5, 13), dim=(0, 2)), torch.fft.fftn(t, s=(5, 13), dim=(0, 2)))  # pad and trim
    _same(torch.fft.fft(z, n=4, dim=1), torch.fft.fft(t, n=4, dim=1))
    _same(torch.fft.fft(z.transpose(0, 2), dim=0), torch.fft.fft(t.transpose(0, 2), dim=0))      # strided input
    _same(torch.fft.fft(z[:, ::2], dim=1), torch.fft.fft(t[:, ::2], dim=1))
    _same(torch.fft.fft(z.conj()), torch.fft.fft(t.conj()))
    real = torch.float32 if dtype == torch.complex64 else torch.float64
    x = _rand((4, 6, 10), real, 4)
    xt = x.to(D)
    _same(torch.fft.rfft2(x), torch.fft.rfft2(xt))
    _same(torch.fft.rfftn(x, norm="forward"), torch.fft.rfftn(xt, norm="forward"))
    spec = torch.fft.rfftn(x)
    _same(torch.fft.irfftn(spec, s=x.shape), torch.fft.irfftn(spec.to(D), s=x.shape))
    _same(torch.fft.irfft2(z, s=(6, 7)), torch.fft.irfft2(t, s=(6, 7)))
    _same(torch.fft.fftshift(torch.fft.fftfreq(9)), torch.fft.fftshift(torch.fft.fftfreq(9, device=D)))
    out = torch.empty(0, dtype=dtype, device=D)
    r = torch.fft.fft(t, out=out)
    assert r.data_ptr() == out.data_ptr()
    _same(torch.fft.fft(z), out)
    _same(torch.fft.fft(x), torch.fft.fft(xt))                                                  # real input to fft


@pytest.mark.usefixtures("no_fallback")
def test_stft_istft():
    x = _rand((2, 1000), torch.float32, 5)
    w = torch.hann_window(128)
    args = dict(n_fft=128, hop_length=32, window=w, return_complex=True)
    S = torch.stft(x, **args)
    St = torch.stft(x.to(D), **{**args, "window": w.to(D)})
    _same(S, St, rtol=1e-4, atol=1e-4)
    y = torch.istft(S, 128, hop_length=32, window=w, length=1000)
    yt = torch.istft(St, 128, hop_length=32, window=w.to(D), length=1000)
    _same(y, yt, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(yt.cpu(), x, rtol=1e-4, atol=1e-4)                            # round trip


@pytest.mark.usefixtures("no_fallback")
def test_fft_backward():
    x = _rand((3, 50), torch.float64, 6)

    def run(dev):
        a = x.to(dev).detach().clone().requires_grad_()
        spec = torch.view_as_complex(torch.view_as_real(torch.fft.rfft(a)) * (torch.arange(26.0, device=dev) / 32)[:, None])
        y = torch.fft.irfft(spec, n=50) + torch.fft.hfft(spec, n=50)
        (y * torch.arange(50.0, device=dev)).sum().backward()
        return a.grad
    _same(run("cpu"), run(D))
    z = _rand((4, 9), torch.complex128, 7)

    def run_c(dev):
        a = z.to(dev).detach().clone().requires_grad_()
        torch.view_as_real(torch.fft.fft2(a)).pow(2).sum().backward()
        return a.grad
    torch.testing.assert_close(run_c(D).cpu(), run_c("cpu"), rtol=1e-10, atol=1e-10)


@pytest.mark.usefixtures("no_fallback")
def test_errors_in_pytorch_words():
    h = torch.ones(8, dtype=torch.float16, device=D)
    with pytest.raises(RuntimeError, match="Unsupported dtype Half"):
        torch.fft.rfft(h)
    with pytest.raises(RuntimeError, match="Invalid number of data points"):
        torch.fft.fft(torch.ones(4, dtype=torch.complex64, device=D), n=0)
    with pytest.raises(RuntimeError, match="rfft expects a real input tensor"):
        torch.fft.rfft(torch.ones(4, dtype=torch.complex64, device=D))
    z = torch.ones(4, dtype=torch.complex64, device=D)
    with pytest.raises(NotImplementedError, match="CPU fallback is disabled"):
        torch.exp(z)                                                    # not native yet: the fallback serves it
    with pytest.raises(RuntimeError, match="result type ComplexFloat can't be cast to the desired output type Float"):
        torch.mul(z, z, out=torch.empty(4, device=D))
    with pytest.raises(RuntimeError, match="view_as_real doesn't work on unresolved conjugated tensors"):
        torch.view_as_real(z.conj())
    _same(torch.fft.fft(z.cpu()), torch.fft.fft(z))                     # the device still works


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("dtype", CDTYPES)
def test_native_arithmetic(dtype):
    real = torch.float32 if dtype == torch.complex64 else torch.float64
    a, b = _rand((5, 7), dtype, 9), _rand((5, 7), dtype, 10)
    x = _rand((7,), real, 11)
    ta, tb, tx = a.to(D), b.to(D), x.to(D)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.complex64 else dict(rtol=1e-12, atol=1e-12)
    cases = [
        lambda p, q, r: p + q, lambda p, q, r: p - q * 2, lambda p, q, r: torch.add(p, q, alpha=2 - 1j),
        lambda p, q, r: torch.sub(p, q, alpha=3), lambda p, q, r: p * q, lambda p, q, r: p * r,  # broadcast real
        lambda p, q, r: r * p.conj(), lambda p, q, r: p / q, lambda p, q, r: p / r, lambda p, q, r: r / q,
        lambda p, q, r: p * 2 + 1j, lambda p, q, r: (1 + 1j) / p, lambda p, q, r: -p, lambda p, q, r: p.abs(),
        lambda p, q, r: p @ q.t(), lambda p, q, r: torch.bmm(p[None], q.t()[None]),
        lambda p, q, r: torch.complex(r, r * 2), lambda p, q, r: p.clone().mul_(q).add_(1j).div_(q + 1),
        lambda p, q, r: torch.fft.ifft(torch.fft.fft(p) * torch.fft.fft(q)),  # a circular convolution
        lambda p, q, r: p.sum(), lambda p, q, r: p.t().sum(1), lambda p, q, r: p.conj().mean(0, keepdim=True),
        lambda p, q, r: torch.sum(r, 0, dtype=dtype), lambda p, q, r: (p * q.conj()).sum(dim=1),
    ]
    for i, f in enumerate(cases):
        got, exp = f(ta, tb, tx), f(a, b, x)
        assert got.dtype == exp.dtype, i
        _same(exp, got, **tol)
    z = torch.zeros(3, dtype=dtype)                                     # 0 / 0, x / 0: CPU's NaN and inf pattern
    _same(torch.ones(3, dtype=dtype) / z, torch.ones(3, dtype=dtype, device=D) / z.to(D), equal_nan=True)


@pytest.mark.filterwarnings("ignore:The operator")
def test_complex_ops_not_native_fall_back_counted():
    z = _rand((5, 7), torch.complex64, 8)
    t = z.to(D)
    torch_tpu.reset_fallback_counts()
    for f in (lambda a: a.prod(dim=1), lambda a: torch.exp(a), lambda a: a.angle(), lambda a: a.roll(2, 1),
              lambda a: torch.vdot(a[0], a[1])):
        _same(f(z), f(t), rtol=1e-5, atol=1e-5)
    counts = torch_tpu.fallback_counts()
    assert any(k.startswith("aten::exp") for k in counts), counts
    assert any(k.startswith("aten::roll") for k in counts), counts                     # a Python decomposition
    u = t.clone()
    u.exp_()                                                             # in place, through the fallback
    _same(z.exp(), u, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("dtype", CDTYPES)
def test_sgn_and_polar_native(dtype):
    """sgn of a complex tensor (z / |z|, 0 at 0) and polar (llama4's rotary embedding) with their gradients."""
    z = _rand((4, 6), dtype, 3)
    z[0, 0] = 0
    _same(z.sgn(), z.to(D).sgn(), rtol=1e-6, atol=1e-6)
    _same(z.sgn(), torch.sgn(z.to(D), out=torch.empty(0, dtype=dtype, device=D)), rtol=1e-6, atol=1e-6)
    real = torch.float32 if dtype == torch.complex64 else torch.float64
    a, t = torch.rand(4, 6, dtype=real) + 0.1, torch.randn(4, 6, dtype=real) * 3
    w = torch.arange(48, dtype=real).view(4, 6, 2)
    res = {}
    for dev in ("cpu", D):
        ar, tr = a.to(dev).detach().requires_grad_(), t.to(dev).detach().requires_grad_()
        p = torch.polar(ar, tr)
        (torch.view_as_real(p) * w.to(dev)).sum().backward()
        res[dev] = (p.detach(), ar.grad, tr.grad)
    for want, got in zip(res["cpu"], res[D]):
        _same(want, got, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="Expected object of scalar type"):
        torch.polar(a.to(D), t.to(D).to(torch.float16))
