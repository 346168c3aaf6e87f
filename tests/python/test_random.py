"""Random ops: range and distribution per dtype, statistically.

Every natively run random op (uniform_ / rand, normal_ / randn, bernoulli_ /
bernoulli, random_ / randint, dropout, cauchy_, log_normal_, geometric_,
normal with tensor mean / std) in every dtype it takes: all values in
range (the upper bound of [from, to) excluded after rounding to the dtype),
mean and variance within five standard errors for n draws, and the whole
distribution by a Kolmogorov-Smirnov distance (continuous ops, taken at the
dtype's representable values, see ks_distance) or a chi-square statistic
(discrete ops). Seeds are fixed, so a run is deterministic; the bounds are set
so that a correct generator fails them with probability about 1e-4 per check,
while a bias of the size of the bf16 bug (2^-9 of the mass on the excluded
bound) fails them outright.
Also: Philox's counter semantics (element i depends only on seed, offset, i).
"""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
ALL = FLOATS + INTS + [torch.bool]
N = 1 << 17
Z = 5.0                    # standard errors allowed for means and variances
KS_C = 2.0                 # sqrt(-ln(alpha / 2) / 2) for alpha ~ 7e-4


def gen(seed):
    return torch.Generator(device="tpu").manual_seed(seed)


def next_up(v):
    return torch.nextafter(v, torch.tensor(math.inf, dtype=v.dtype))


def next_down(v):
    return torch.nextafter(v, torch.tensor(-math.inf, dtype=v.dtype))


def ks_distance(x, cdf, top=None):
    """Kolmogorov-Smirnov distance of sample x (a float dtype) from the law whose CDF is `cdf`,
    rounded to nearest in x's dtype: P(X <= v) = cdf(midpoint of v and the next value up).
    `top`: values that round up to it are moved to the value just below (uniform's [from, to))."""
    x = x.cpu()
    v, counts = torch.unique(x, return_counts=True)
    emp_hi = counts.cumsum(0).double() / x.numel()
    emp_lo = emp_hi - counts.double() / x.numel()
    mid_hi = (v.double() + next_up(v).double()) / 2
    mid_lo = (v.double() + next_down(v).double()) / 2
    if top is not None:
        mid_hi = torch.where(next_up(v).double() >= top, torch.tensor(math.inf, dtype=torch.float64), mid_hi)
    return max((emp_hi - cdf(mid_hi)).abs().max().item(), (emp_lo - cdf(mid_lo)).abs().max().item())


def uniform_cdf(a, b):
    return lambda t: ((t - a) / (b - a)).clamp(0, 1)


def normal_cdf(mu, sigma):
    return lambda t: 0.5 * (1 + torch.erf((t - mu) / (sigma * math.sqrt(2))))


def check_moments(x, mean, var, mu4, what):
    """Sample mean and variance within Z standard errors (mu4: the fourth central moment)."""
    x = x.cpu().double()
    n = x.numel()
    m, s2 = x.mean().item(), x.var().item()
    assert abs(m - mean) <= Z * math.sqrt(var / n), f"{what}: mean {m}, expected {mean}"
    assert abs(s2 - var) <= Z * math.sqrt(max(mu4 - var * var, 1e-300) / n), f"{what}: variance {s2}, expected {var}"


def chi2_limit(df, z=3.7):
    """Upper chi-square quantile (Wilson-Hilferty), z = 3.7: alpha ~ 1e-4."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def check_chi2(counts, probs, what):
    counts = counts.double()
    expected = probs.double() * counts.sum()
    assert (expected >= 5).all(), f"{what}: bins too small for a chi-square test"
    stat = ((counts - expected) ** 2 / expected).sum().item()
    assert stat <= chi2_limit(len(counts) - 1), f"{what}: chi-square {stat:.1f} over {len(counts) - 1} dof"


# ---------------------------------------------------------------- uniform

# (from, to): the unit interval, a range crossing zero, a single binade where fp16/bf16 are coarse
# (1 + u rounds up to 2 for 1/512 (bf16) and 1/2048 (fp16) of the draws), and an exact width.
UNIFORM_RANGES = [(0.0, 1.0), (-3.0, 5.0), (1.0, 2.0), (-0.5, 0.25)]


@pytest.mark.parametrize("dtype", FLOATS)
def test_uniform_range_and_distribution(dtype):
    for k, (a, b) in enumerate(UNIFORM_RANGES):
        x = torch.empty(N, dtype=dtype, device="tpu").uniform_(a, b, generator=gen(10 + k)).cpu()
        what = f"uniform_({a}, {b}) {dtype}"
        assert x.dtype == dtype
        assert torch.isfinite(x).all()
        assert (x >= a).all() and (x < b).all(), f"{what}: min {x.min()}, max {x.max()}"
        w = b - a
        check_moments(x, (a + b) / 2, w * w / 12, w ** 4 / 80, what)
        d = ks_distance(x, uniform_cdf(a, b), top=b)
        assert d <= KS_C / math.sqrt(N), f"{what}: KS distance {d:.5f}"


def test_rand_excludes_one():
    """The issue's case: (torch.rand(1 << 20, bf16) == 1).sum() was about 2000 (CPU: 0)."""
    for dtype in FLOATS:
        x = torch.rand(1 << 20, device="tpu", dtype=dtype, generator=gen(1))
        assert (x == 1).sum().item() == 0, dtype
        assert x.max().item() < 1 and x.min().item() >= 0, dtype
        # the mass that rounds up to 1 is moved one ulp down, not to 0: no spike at the lower bound
        assert (x == 0).sum().item() <= 8, dtype


def test_uniform_degenerate_and_narrow_ranges():
    for dtype in FLOATS:
        assert (torch.empty(100, dtype=dtype, device="tpu").uniform_(2, 2).cpu() == 2).all()
    # bf16 has no value strictly between 100 and 100.5: everything is 100
    x = torch.empty(1000, dtype=torch.bfloat16, device="tpu").uniform_(100, 100.5).cpu()
    assert (x == 100).all()
    # bounds are rounded to the dtype first (as PyTorch does): [0.1, 0.2) in fp16
    x = torch.empty(N, dtype=torch.float16, device="tpu").uniform_(0.1, 0.2, generator=gen(4)).cpu()
    lo, hi = torch.tensor(0.1, dtype=torch.float16), torch.tensor(0.2, dtype=torch.float16)
    assert (x >= lo).all() and (x < hi).all()


def test_uniform_argument_errors_match_cpu():
    for dtype, args in [(torch.float16, (0, 1e6)), (torch.float32, (1, 0)), (torch.bfloat16, (-3e38, 3e38)),
                        (torch.float64, (-1.7e308, 1.7e308))]:
        with pytest.raises(RuntimeError) as cpu:
            torch.empty(3, dtype=dtype).uniform_(*args)
        with pytest.raises(RuntimeError) as tpu:
            torch.empty(3, dtype=dtype, device="tpu").uniform_(*args)
        assert str(tpu.value).split("\n")[0] == str(cpu.value).split("\n")[0]


# ---------------------------------------------------------------- normal

@pytest.mark.parametrize("dtype", FLOATS)
def test_normal_distribution(dtype):
    for k, (mu, sigma) in enumerate([(0.0, 1.0), (3.0, 0.5), (-2.0, 4.0)]):
        x = torch.empty(N, dtype=dtype, device="tpu").normal_(mu, sigma, generator=gen(20 + k)).cpu()
        what = f"normal_({mu}, {sigma}) {dtype}"
        assert x.dtype == dtype and torch.isfinite(x).all()
        check_moments(x, mu, sigma ** 2, 3 * sigma ** 4, what)
        d = ks_distance(x, normal_cdf(mu, sigma))
        assert d <= KS_C / math.sqrt(N), f"{what}: KS distance {d:.5f}"
    y = torch.randn(N, dtype=dtype, device="tpu", generator=gen(30))
    check_moments(y, 0.0, 1.0, 3.0, f"randn {dtype}")
    assert (torch.empty(10, dtype=dtype, device="tpu").normal_(1.5, 0.0).cpu() == 1.5).all()


def test_normal_tails_are_finite_and_symmetric():
    x = torch.randn(1 << 20, device="tpu", generator=gen(5)).cpu()
    assert torch.isfinite(x).all()
    assert x.abs().max().item() < 7         # P(|Z| > 7) ~ 3e-12 per draw
    for t in (1.0, 2.0, 3.0):               # both tails hold the same mass
        hi, lo = (x > t).sum().item(), (x < -t).sum().item()
        p = 0.5 * math.erfc(t / math.sqrt(2))
        sd = math.sqrt(x.numel() * p * (1 - p))
        assert abs(hi - x.numel() * p) <= Z * sd and abs(lo - x.numel() * p) <= Z * sd


# ---------------------------------------------------------------- bernoulli

@pytest.mark.parametrize("p", [0.0, 0.3, 0.9, 1.0])
def test_bernoulli_scalar_p_every_dtype(p):
    for k, dtype in enumerate(ALL):
        x = torch.empty(N, dtype=dtype, device="tpu").bernoulli_(p, generator=gen(40 + k)).cpu()
        assert x.dtype == dtype
        assert ((x == 0) | (x == 1)).all(), f"bernoulli_({p}) {dtype}: values outside {{0, 1}}"
        ones = (x == 1).sum().item()
        sd = math.sqrt(N * p * (1 - p))
        assert abs(ones - N * p) <= Z * sd, f"bernoulli_({p}) {dtype}: {ones} ones of {N}"


def test_bernoulli_tensor_p():
    """p varying per element: each sixteenth of [0, 1] gets its own frequency."""
    for k, pdtype in enumerate(FLOATS):
        p = torch.linspace(0, 1, N, device="tpu").to(pdtype).reshape(512, -1)
        x = torch.bernoulli(p, generator=gen(50 + k)).cpu()
        assert x.dtype == pdtype and ((x == 0) | (x == 1)).all()
        pc = p.cpu().double().reshape(16, -1)        # p ascending: 16 slices of [0, 1]
        xf = x.double().reshape(16, -1)
        want, sd = pc.sum(1), (pc * (1 - pc)).sum(1).sqrt()
        assert ((xf.sum(1) - want).abs() <= Z * sd + 1e-9).all(), f"bernoulli tensor p {pdtype}: {xf.sum(1)} vs {want}"
        assert xf.flatten()[0] == 0 and xf.flatten()[-1] == 1      # p = 0 and p = 1 exactly
    # a tensor of probabilities into a bool / int output
    b = torch.zeros(N, dtype=torch.bool, device="tpu").bernoulli_(torch.full((N,), 0.25, device="tpu"), generator=gen(9))
    assert abs(b.sum().item() - N / 4) <= Z * math.sqrt(N * 0.25 * 0.75)


def test_bernoulli_p_outside_unit_interval():
    with pytest.raises(RuntimeError, match=r"bernoulli_ expects p to be in \[0, 1\], but got p=1.5"):
        torch.empty(3, device="tpu").bernoulli_(1.5)
    # a tensor of probabilities is checked where it is read, like an out-of-range index: at the next sync
    x = torch.empty(4, device="tpu")
    try:
        x.bernoulli_(torch.tensor([0.5, 2.0, 0.1, 0.2], device="tpu"))
        torch.tpu.synchronize()
        raised = None
    except RuntimeError as e:
        raised = e
    assert raised is not None and "p_in >= 0 && p_in <= 1" in str(raised)
    torch.tpu.synchronize()    # reported once


# ---------------------------------------------------------------- random_ / randint

def small_ranges(dtype):
    if dtype == torch.bool:
        return [(0, 2)]
    if dtype == torch.uint8:
        return [(0, 7), (250, 256)]
    return [(-3, 5), (0, 10), (-128, 127)]


def test_random_from_to():
    for dtype in ALL:
        check_random_from_to(dtype)


def check_random_from_to(dtype):
    for k, (a, b) in enumerate(small_ranges(dtype)):
        x = torch.empty(N, dtype=dtype, device="tpu").random_(a, b, generator=gen(60 + k)).cpu()
        assert x.dtype == dtype
        xl = x.long()
        assert (xl >= a).all() and (xl < b).all(), f"random_({a}, {b}) {dtype}: [{xl.min()}, {xl.max()}]"
        counts = torch.bincount(xl - a, minlength=b - a)
        check_chi2(counts, torch.full((b - a,), 1.0 / (b - a)), f"random_({a}, {b}) {dtype}")
    r = torch.randint(2, 9, (N,), dtype=dtype if dtype != torch.bool else torch.int64, device="tpu", generator=gen(70))
    counts = torch.bincount(r.cpu().long() - 2, minlength=7)
    check_chi2(counts, torch.full((7,), 1 / 7), f"randint {dtype}")


def full_range_max(dtype):
    if dtype.is_floating_point:
        return 1 << {torch.float32: 24, torch.float64: 53, torch.float16: 11, torch.bfloat16: 8}[dtype]
    return 1 if dtype == torch.bool else torch.iinfo(dtype).max


def test_random_full_range():
    """random_() covers [0, 2^mantissa] (floats) or [0, max] (integers), uniformly: 64 bins of the range."""
    for dtype in ALL:
        check_random_full_range(dtype)


def check_random_full_range(dtype):
    mx = full_range_max(dtype)
    x = torch.empty(N, dtype=dtype, device="tpu").random_(generator=gen(80)).cpu()
    xl = x.long() if dtype != torch.float64 else x.double().long()
    assert xl.min() >= 0 and xl.max() <= mx, f"random_() {dtype}: [{xl.min()}, {xl.max()}]"
    size = mx + 1                              # number of values
    bins = min(64, size)
    edges = [size * i // bins for i in range(bins + 1)]
    probs = torch.tensor([(edges[i + 1] - edges[i]) / size for i in range(bins)], dtype=torch.float64)
    idx = torch.bucketize(xl, torch.tensor(edges[1:-1], dtype=torch.int64), right=True)
    check_chi2(torch.bincount(idx, minlength=bins), probs, f"random_() {dtype}")
    if dtype in (torch.int64, torch.int32):   # the top value is reachable (not [0, max))
        assert xl.max() > mx - mx // 1000


def test_random_int64_extremes():
    lo = torch.iinfo(torch.int64).min
    # from = INT64_MIN and no `to`: all 2^64 values; the top 6 bits are uniform
    x = torch.empty(N, dtype=torch.int64, device="tpu").random_(lo, None, generator=gen(90)).cpu()
    top = ((x >> 58) + 32)                      # arithmetic shift: -32 .. 31
    check_chi2(torch.bincount(top, minlength=64), torch.full((64,), 1 / 64), "random_(INT64_MIN, None)")
    # [from, INT64_MAX]: nothing below from
    y = torch.empty(N, dtype=torch.int64, device="tpu").random_(-5, None, generator=gen(91)).cpu()
    assert y.min() >= -5
    z = torch.empty(N, dtype=torch.int64, device="tpu").random_(lo, lo + 3, generator=gen(92)).cpu()
    assert set(z.unique().tolist()) == {lo, lo + 1, lo + 2}


def test_random_argument_errors_match_cpu():
    cases = [(torch.uint8, (0, 300)), (torch.uint8, (-1, 5)), (torch.int8, (-200, 5)), (torch.bool, (0, 3)),
             (torch.int32, (5, 5)), (torch.float16, (0, 100000)), (torch.int16, (0, 40000))]
    for dtype, args in cases:
        with pytest.raises(RuntimeError) as cpu:
            torch.empty(3, dtype=dtype).random_(*args)
        with pytest.raises(RuntimeError) as tpu:
            torch.empty(3, dtype=dtype, device="tpu").random_(*args)
        assert str(tpu.value).split("\n")[0] == str(cpu.value).split("\n")[0], f"{dtype} {args}"
    # beyond the mantissa: PyTorch's precision warning, and the values stay in range
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        x = torch.empty(1000, dtype=torch.bfloat16, device="tpu").random_(0, 1000).cpu()
    assert any("out of bounds [-(2^8), 2^8]" in str(m.message) for m in w)
    assert x.min() >= 0 and x.max() <= 1000


# ---------------------------------------------------------------- dropout

@pytest.mark.parametrize("dtype", FLOATS)
def test_dropout(dtype):
    for k, p in enumerate([0.1, 0.5, 0.8]):
        x = torch.ones(N, dtype=dtype, device="tpu", requires_grad=True)
        torch.tpu.manual_seed(100 + k)
        y = F.dropout(x, p, training=True)
        yc = y.detach().cpu()
        scale = (torch.ones(1, dtype=dtype) * (1.0 / (1.0 - p)))[0]
        assert y.dtype == dtype
        assert ((yc == 0) | (yc == scale)).all(), f"dropout({p}) {dtype}: values other than 0 and {scale}"
        zeros = (yc == 0).sum().item()
        assert abs(zeros - N * p) <= Z * math.sqrt(N * p * (1 - p)), f"dropout({p}) {dtype}: {zeros} zeros"
        y.sum().backward()                      # the same mask scales the gradient
        assert torch.equal(x.grad.cpu() == 0, yc == 0)
    x = torch.randn(1000, dtype=dtype, device="tpu")
    assert torch.equal(F.dropout(x, 0.0, training=True).cpu(), x.cpu())
    assert (F.dropout(x, 1.0, training=True).cpu() == 0).all()
    assert torch.equal(F.dropout(x, 0.5, training=False).cpu(), x.cpu())
    out, mask = torch.native_dropout(x, 0.5, True)
    assert mask.dtype == torch.bool and torch.equal(out.cpu() != 0, mask.cpu() & (x.cpu() != 0))


def test_dropout_integer_input_raises_like_cpu():
    for dtype in INTS + [torch.bool]:
        with pytest.raises(RuntimeError) as cpu:
            torch.native_dropout(torch.ones(4, dtype=dtype), 0.5, True)
        with pytest.raises(RuntimeError) as tpu:
            torch.native_dropout(torch.ones(4, dtype=dtype, device="tpu"), 0.5, True)
        assert str(tpu.value).split("\n")[0] == str(cpu.value).split("\n")[0]


# ---------------------------------------------------------------- exponential_ / rrelu (compositions in _decomp.py)

@pytest.mark.parametrize("dtype", FLOATS)
def test_exponential_distribution(dtype, native_only):
    lam = 2.0
    x = torch.empty(N, dtype=dtype, device="tpu").exponential_(lam, generator=gen(31))
    assert x.dtype == dtype and (x.cpu() >= 0).all()
    check_moments(x, 1 / lam, 1 / lam ** 2, 9 / lam ** 4, f"exponential_ {dtype}")
    assert ks_distance(x, lambda t: (1 - torch.exp(-lam * t)).clamp(min=0)) <= KS_C / math.sqrt(N)
    assert torch.equal(x.cpu(), torch.empty(N, dtype=dtype, device="tpu").exponential_(lam, generator=gen(31)).cpu())
    g = F.gumbel_softmax(torch.randn(8, 10, dtype=dtype, device="tpu"), tau=0.5, hard=True)
    assert ((g.cpu() == 0) | (g.cpu() == 1)).all() and (g.cpu().sum(-1) == 1).all()
    for bad in (0.0, -1.5):
        with pytest.raises(RuntimeError) as cpu:
            torch.empty(3, dtype=dtype).exponential_(bad)
        with pytest.raises(RuntimeError) as tpu:
            torch.empty(3, dtype=dtype, device="tpu").exponential_(bad)
        assert str(tpu.value) == str(cpu.value)


@pytest.mark.parametrize("dtype", FLOATS)
def test_rrelu_training_slopes(dtype, native_only):
    """Training: each x <= 0 scaled by a slope uniform in [lower, upper] (kept in noise, 1 elsewhere), which
    is the gradient too; evaluation: the mean slope, as the CPU."""
    x = torch.randn(N, dtype=dtype, device="tpu", requires_grad=True)
    noise = torch.empty_like(x)
    y = torch.ops.aten.rrelu_with_noise(x, noise, 0.1, 0.3, True, gen(32))
    neg = (x <= 0).cpu()
    nc = noise.detach().cpu()
    slopes = nc[neg]
    assert (nc[~neg] == 1).all() and (slopes >= 0.1).all() and (slopes.double() <= 0.3 + 1e-2).all()
    assert ks_distance(slopes, uniform_cdf(0.1, 0.3)) <= KS_C / math.sqrt(slopes.numel())
    torch.testing.assert_close(y.detach().cpu(), (x.detach().cpu().double() * nc.double()).to(dtype))
    y.sum().backward()
    assert torch.equal(x.grad.cpu(), nc)
    again = torch.ops.aten.rrelu_with_noise(x.detach(), torch.empty_like(x), 0.1, 0.3, True, gen(32))
    assert torch.equal(again.cpu(), y.detach().cpu())
    xc = torch.randn(100, dtype=dtype)
    torch.testing.assert_close(F.rrelu(xc.to("tpu"), 0.1, 0.3, training=False).cpu(), F.rrelu(xc, 0.1, 0.3))


# ---------------------------------------------------------------- cauchy_ / log_normal_ / geometric_ / normal(Tensor)

@pytest.mark.parametrize("dtype", FLOATS)
def test_cauchy_and_log_normal_distributions(dtype, native_only):
    m, s = 1.5, 0.5
    x = torch.empty(N, dtype=dtype, device="tpu").cauchy_(m, s, generator=gen(41))
    assert x.dtype == dtype and not x.isnan().any()
    assert ks_distance(x, lambda t: 0.5 + torch.atan((t - m) / s) / math.pi) <= KS_C / math.sqrt(N)
    assert torch.equal(x.cpu(), torch.empty(N, dtype=dtype, device="tpu").cauchy_(m, s, generator=gen(41)).cpu())
    mu, sigma = -0.5, 0.75
    y = torch.empty(N, dtype=dtype, device="tpu").log_normal_(mu, sigma, generator=gen(42))
    assert y.dtype == dtype and (y.cpu() > 0).all() and torch.isfinite(y.cpu()).all()
    lcdf = normal_cdf(mu, sigma)
    assert ks_distance(y, lambda t: torch.where(t > 0, lcdf(torch.log(t.clamp(min=1e-300))), 0.0)) <= KS_C / math.sqrt(N)
    check_moments(torch.log(y.cpu().double()), mu, sigma ** 2, 3 * sigma ** 4, f"log(log_normal_) {dtype}")
    for bad in ((0.0, 0.0), (1.0, -1.0)):
        for fn in ("cauchy_", "log_normal_"):
            with pytest.raises(RuntimeError) as cpu:
                getattr(torch.empty(3, dtype=dtype), fn)(*bad)
            with pytest.raises(RuntimeError) as tpu:
                getattr(torch.empty(3, dtype=dtype, device="tpu"), fn)(*bad)
            assert str(tpu.value) == str(cpu.value)
    for fn in ("cauchy_", "log_normal_"):  # floating dtypes only, in the CPU's words
        with pytest.raises(RuntimeError) as cpu:
            getattr(torch.empty(3, dtype=torch.int64), fn)()
        with pytest.raises(RuntimeError) as tpu:
            getattr(torch.empty(3, dtype=torch.int64, device="tpu"), fn)()
        assert str(tpu.value).split('"')[0][:20] == str(cpu.value).split('"')[0][:20]


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_geometric_distribution(dtype, native_only):
    p = 0.3
    x = torch.empty(N, dtype=dtype, device="tpu").geometric_(p, generator=gen(43)).cpu()
    assert torch.equal(x, torch.empty(N, dtype=dtype, device="tpu").geometric_(p, generator=gen(43)).cpu())
    assert x.dtype == dtype and (x >= 1).all()
    k = torch.arange(1, 16, dtype=torch.float64)
    probs = torch.cat([(1 - p) ** (k - 1) * p, torch.tensor([(1 - p) ** 15])])
    counts = torch.stack([(x.double() == v).sum() for v in k.tolist()] + [(x.double() > 15).sum()])
    check_chi2(counts, probs, f"geometric_({p}) {dtype}")
    for bad in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(RuntimeError) as cpu:
            torch.empty(3, dtype=dtype).geometric_(bad)
        with pytest.raises(RuntimeError) as tpu:
            torch.empty(3, dtype=dtype, device="tpu").geometric_(bad)
        assert str(tpu.value) == str(cpu.value)


def test_normal_with_tensor_mean_and_std(native_only):
    mean = torch.tensor([-4.0, 0.0, 10.0], device="tpu")[:, None]
    std = torch.tensor([0.5, 2.0], device="tpu")
    x = torch.normal(mean.expand(3, 2)[:, :, None].expand(3, 2, N // 8), std[None, :, None].expand(3, 2, N // 8),
                     generator=gen(44))
    assert x.shape == (3, 2, N // 8) and x.dtype == torch.float32
    for i, mu in enumerate((-4.0, 0.0, 10.0)):
        for j, sd in enumerate((0.5, 2.0)):
            check_moments(x[i, j], mu, sd ** 2, 3 * sd ** 4, f"normal(Tensor, Tensor) {mu} {sd}")
    y = torch.normal(mean.double(), 3.0, generator=gen(45))            # Tensor_float: mean's shape and dtype
    assert y.shape == (3, 1) and y.dtype == torch.float64
    z = torch.normal(2.0, std.expand(N, 2), generator=gen(46))         # float_Tensor: std's shape and dtype
    check_moments(z[:, 1], 2.0, 4.0, 48.0, "normal(float, Tensor)")
    assert torch.normal(torch.zeros(2, 1, device="tpu"), torch.ones(3, device="tpu")).shape == (2, 3)
    out = torch.empty(0, device="tpu")
    torch.normal(mean, std, out=out, generator=gen(47))
    assert out.shape == (3, 2)
    a = torch.normal(mean, std, generator=gen(48)).cpu()
    assert torch.equal(a, torch.normal(mean, std, generator=gen(48)).cpu())
    for args in ((torch.zeros(3), torch.tensor([1.0, -1.0, 2.0])), (torch.zeros(3), -1.0),
                 (0.0, torch.tensor([1.0, -1.0]))):
        with pytest.raises(RuntimeError) as cpu:
            torch.normal(*args)
        with pytest.raises(RuntimeError) as tpu:
            torch.normal(*(t.to("tpu") if isinstance(t, torch.Tensor) else t for t in args))
        assert str(tpu.value) == str(cpu.value)


# ---------------------------------------------------------------- Philox counter semantics

def test_counter_based_prefix_and_layout():
    """Element i depends only on (seed, offset, i): a longer draw extends a shorter one, and a
    strided output gets the same numbers at the same row-major positions (strided and contiguous
    kernel paths agree)."""
    for dtype in FLOATS:
        for fill in (lambda t, g: t.uniform_(generator=g), lambda t, g: t.normal_(generator=g),
                     lambda t, g: t.bernoulli_(0.4, generator=g), lambda t, g: t.cauchy_(generator=g),
                     lambda t, g: t.log_normal_(generator=g), lambda t, g: t.geometric_(0.2, generator=g)):
            short = fill(torch.empty(1000, dtype=dtype, device="tpu"), gen(7)).cpu()
            long_ = fill(torch.empty(50000, dtype=dtype, device="tpu"), gen(7)).cpu()
            assert torch.equal(short, long_[:1000])
            t = torch.empty(37, 41, dtype=dtype, device="tpu").t()     # transposed view
            strided = fill(t, gen(7)).cpu()
            contig = fill(torch.empty(41, 37, dtype=dtype, device="tpu"), gen(7)).cpu()
            assert torch.equal(strided, contig)
    a = torch.empty(5000, dtype=torch.int64, device="tpu").random_(0, 1000, generator=gen(8)).cpu()
    b = torch.empty(100, dtype=torch.int64, device="tpu").random_(0, 1000, generator=gen(8)).cpu()
    assert torch.equal(a[:100], b)


def test_successive_draws_differ_and_seed_repeats():
    torch.tpu.manual_seed(1234)
    a, b = torch.rand(1000, device="tpu").cpu(), torch.rand(1000, device="tpu").cpu()
    torch.tpu.manual_seed(1234)
    c = torch.rand(1000, device="tpu").cpu()
    assert not torch.equal(a, b) and torch.equal(a, c)
    assert (a == b).sum() < 5


FALLBACK_RANDOM = {
    "randperm": lambda g: torch.randperm(50, device="tpu", generator=g),
    "multinomial": lambda g: torch.multinomial(torch.ones(6, device="tpu"), 3, generator=g),
    "poisson": lambda g: torch.poisson(torch.full((64,), 3.0, device="tpu"), generator=g),
}


@pytest.mark.parametrize("name", sorted(FALLBACK_RANDOM))
def test_fallback_random_ops_follow_the_tpu_generator(name):
    """Random ops that still run through the CPU fallback draw from the tpu
    generator: torch.tpu.manual_seed (or a tpu Generator) makes them
    reproducible whatever the CPU's RNG has done, and successive calls
    differ. (A tpu Generator used to be refused by the CPU kernel.)"""
    fn = FALLBACK_RANDOM[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.tpu.manual_seed(11)
        torch.rand(7)                                     # the CPU RNG moves on
        a, a2 = fn(None).cpu(), fn(None).cpu()
        torch.tpu.manual_seed(11)
        torch.rand(123)
        b = fn(None).cpu()
        torch.tpu.manual_seed(12)
        c = fn(None).cpu()
        g = torch.Generator("tpu").manual_seed(5)
        d = fn(g).cpu()
        g.manual_seed(5)
        e = fn(g).cpu()
    assert torch.equal(a, b)
    assert not torch.equal(a, a2) and not torch.equal(a, c)
    assert torch.equal(d, e)
