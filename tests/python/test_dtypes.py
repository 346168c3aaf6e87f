"""Dtype rules: every natively run op raises where, and as, PyTorch CPU raises.

A sweep of ops x the ten dtypes tpu supports, with PyTorch CPU as the oracle:
where CPU raises NotImplementedError / RuntimeError, tpu raises the same type
at the call (in every eager mode: the runtime checks each op's dtype rule from
ops.def at launch, before anything is queued, so nothing is left to fail at
the next sync); where CPU succeeds, tpu succeeds with the same result dtype
and values.
"""
import pytest
import torch
import torch.nn.functional as F

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8,
          torch.int8, torch.int16, torch.int32, torch.int64, torch.bool]
FLOATS = DTYPES[:4]
NON_FLOATS = DTYPES[4:]

# PyTorch's AT_DISPATCH names for the dtypes, as in "... not implemented for 'Long'".
TORCH_NAME = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
              torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.int32: "Int",
              torch.int64: "Long", torch.bool: "Bool"}


def inputs(dtype, device):
    """Three 4x5 tensors of `dtype`: values in [-3, 3) for floats, nonzero integers (x negative), random bools."""
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(3):
        if dtype.is_floating_point:
            t = (torch.rand(4, 5, generator=g, dtype=torch.float64) * 6 - 3).to(dtype)
        elif dtype == torch.bool:
            t = torch.rand(4, 5, generator=g) > 0.5
        elif dtype == torch.uint8:
            t = torch.randint(1, 10, (4, 5), generator=g, dtype=dtype)
        else:
            t = torch.randint(1, 10, (4, 5), generator=g).to(dtype) * (1 if k else -1)
        out.append(t.to(device))
    return out


def idx(x, *v):
    return torch.tensor(v, device=x.device)


# name -> f(x, y, z). Deterministic ops only (random ops: RANDOM_OPS, compared by dtype and error only).
OPS = {
    **{n: (lambda f: lambda x, y, z: f(x))(getattr(torch, n)) for n in [
        "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "sin", "cos",
        "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc",
        "sigmoid", "neg", "abs", "sign", "floor", "ceil", "round", "trunc", "frac", "bitwise_not",
        "logical_not", "relu", "nan_to_num", "isnan", "isposinf", "isneginf", "tril"]},
    "silu": lambda x, y, z: F.silu(x),
    "mish": lambda x, y, z: F.mish(x),
    "hardsigmoid": lambda x, y, z: F.hardsigmoid(x),
    "gelu": lambda x, y, z: F.gelu(x),
    "gelu_tanh": lambda x, y, z: F.gelu(x, approximate="tanh"),
    "leaky_relu": lambda x, y, z: F.leaky_relu(x, 0.1),
    "softplus": lambda x, y, z: F.softplus(x),
    "elu": lambda x, y, z: F.elu(x),
    "hardtanh": lambda x, y, z: F.hardtanh(x),
    "hardtanh_pos": lambda x, y, z: F.hardtanh(x, 0, 2),
    "clamp_pos": lambda x, y, z: torch.clamp(x, 1, 2),
    "clamp_min": lambda x, y, z: torch.clamp_min(x, 1),
    "clamp_t": lambda x, y, z: torch.clamp(x, y, z),
    "triu": lambda x, y, z: torch.triu(x, 1),
    "add": lambda x, y, z: x + y,
    "add_scalar": lambda x, y, z: x + 2,
    "sub": lambda x, y, z: x - y,
    "mul": lambda x, y, z: x * y,
    "mul_float_scalar": lambda x, y, z: x * 1.5,
    "div": lambda x, y, z: x / y,
    "div_trunc": lambda x, y, z: torch.div(x, y, rounding_mode="trunc"),
    "div_floor": lambda x, y, z: torch.div(x, y, rounding_mode="floor"),
    "pow": lambda x, y, z: torch.pow(x, y.abs()),
    "pow_scalar": lambda x, y, z: torch.pow(x, 2),
    "maximum": lambda x, y, z: torch.maximum(x, y),
    "minimum": lambda x, y, z: torch.minimum(x, y),
    "fmod": lambda x, y, z: torch.fmod(x, y),
    "remainder": lambda x, y, z: torch.remainder(x, y),
    "atan2": lambda x, y, z: torch.atan2(x, y),
    "and": lambda x, y, z: x & y,
    "or": lambda x, y, z: x | y,
    "xor": lambda x, y, z: x ^ y,
    "iand": lambda x, y, z: x.__iand__(y),
    **{n: (lambda f: lambda x, y, z: f(x, y))(getattr(torch, n)) for n in [
        "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"]},
    "lt_scalar": lambda x, y, z: x < 1,
    "addcmul": lambda x, y, z: torch.addcmul(x, y, z),
    "addcdiv": lambda x, y, z: torch.addcdiv(x, y, z),
    "lerp": lambda x, y, z: torch.lerp(x, y, 0.3),
    "lerp_t": lambda x, y, z: torch.lerp(x, y, z),
    "where": lambda x, y, z: torch.where(x > y, y, z),
    "masked_fill": lambda x, y, z: x.masked_fill(y > z, 1),
    "sum": lambda x, y, z: x.sum(),
    "sum_dim": lambda x, y, z: x.sum(1),
    "mean": lambda x, y, z: x.mean(1),
    "prod": lambda x, y, z: x.prod(1),
    "amax": lambda x, y, z: x.amax(1),
    "amin": lambda x, y, z: x.amin(0),
    "max": lambda x, y, z: x.max(),
    "min": lambda x, y, z: x.min(),
    "max_dim": lambda x, y, z: x.max(1)[0],
    "argmax": lambda x, y, z: x.argmax(1),
    "argmin": lambda x, y, z: x.argmin(),
    "var": lambda x, y, z: x.var(1),
    "std": lambda x, y, z: x.std(),
    "any": lambda x, y, z: x.any(1),
    "all": lambda x, y, z: x.all(),
    "norm": lambda x, y, z: torch.linalg.vector_norm(x, dim=1),
    "cumsum": lambda x, y, z: x.cumsum(1),
    "cumprod": lambda x, y, z: x.cumprod(0),
    "mm": lambda x, y, z: x @ y.t(),
    "bmm": lambda x, y, z: torch.bmm(x[None], y.t()[None]),
    "addmm": lambda x, y, z: torch.addmm(z[:, :4], x, y.t()),
    "dot": lambda x, y, z: torch.dot(x[0], y[0]),
    "mv": lambda x, y, z: torch.mv(x, y[0]),
    "softmax": lambda x, y, z: torch.softmax(x, -1),
    "log_softmax": lambda x, y, z: torch.log_softmax(x, 1),
    "softmax_to_f32": lambda x, y, z: torch.softmax(x, -1, dtype=torch.float32),
    "layer_norm": lambda x, y, z: F.layer_norm(x, (5,)),
    "cross_entropy": lambda x, y, z: F.cross_entropy(x, idx(x, 0, 1, 2, 3)),
    "nll_loss": lambda x, y, z: F.nll_loss(x, idx(x, 0, 1, 2, 3)),
    "index_select": lambda x, y, z: x.index_select(1, idx(x, 0, 2)),
    "gather": lambda x, y, z: x.gather(1, idx(x, [0], [2], [1], [4])),
    "scatter_add": lambda x, y, z: x.scatter_add(1, idx(x, [0], [2], [1], [4]), y[:, :1]),
    "index_add": lambda x, y, z: x.index_add(1, idx(x, 0, 2), y[:, :2]),
    "embedding": lambda x, y, z: F.embedding(idx(x, 1, 3), x),
    "max_pool2d": lambda x, y, z: F.max_pool2d(x[None, None], 2),
    "conv2d": lambda x, y, z: F.conv2d(x[None, None], y[None, None, :2, :2]),
    "fill_": lambda x, y, z: x.fill_(3),
    "zero_": lambda x, y, z: x.zero_(),
    "to_f32": lambda x, y, z: x.to(torch.float32),
    "cat": lambda x, y, z: torch.cat([x, y]),
    "arange": lambda x, y, z: torch.arange(5, dtype=x.dtype, device=x.device),
}

RANDOM_OPS = {
    "uniform_": lambda x, y, z: x.uniform_(),
    "normal_": lambda x, y, z: x.normal_(),
    "bernoulli_": lambda x, y, z: x.bernoulli_(0.5),
    "bernoulli_p": lambda x, y, z: torch.zeros(4, 5, device=x.device).bernoulli_(x.sigmoid() if x.is_floating_point() else x),
    "random_": lambda x, y, z: x.random_(0, 2),
    "random_full": lambda x, y, z: x.random_(),
    "dropout": lambda x, y, z: F.dropout(x, 0.5, training=True),
    "rand": lambda x, y, z: torch.rand(3, dtype=x.dtype, device=x.device),
    "randn": lambda x, y, z: torch.randn(3, dtype=x.dtype, device=x.device),
}

# Where tpu knowingly differs from CPU, it must at least raise NotImplementedError at the call
# (never a wrong answer, never a failure at the next sync). Each entry says why.
KNOWN_GAPS = {
    # the scatter_add / index_add kernels have no bool path (runtime/src/kernels/index.c)
    ("scatter_add", torch.bool), ("index_add", torch.bool),
}


def _run(fn, dtype, device):
    """(exception type or None, result): the exception raised by the call itself."""
    x, y, z = inputs(dtype, device)
    try:
        return None, fn(x, y, z)
    except (NotImplementedError, RuntimeError) as e:
        return type(e), e


def _mismatch(name, fn, dtype, compare_values):
    """None if tpu behaves as CPU for this op and dtype, else what differs."""
    cpu_exc, cpu = _run(fn, dtype, "cpu")
    tpu_exc, tpu = _run(fn, dtype, "tpu")
    if (name, dtype) in KNOWN_GAPS:
        return None if tpu_exc is NotImplementedError else f"known gap: {tpu_exc} ({tpu}), not NotImplementedError"
    if tpu_exc is not cpu_exc:
        return f"CPU raised {cpu_exc} ({cpu if cpu_exc else ''}), tpu {tpu_exc} ({tpu if tpu_exc else ''})"
    if cpu_exc is not None:
        return None
    try:
        torch.tpu.synchronize()    # nothing may be left to fail later
    except Exception as e:
        return f"raised at the next sync: {e}"
    if tpu.dtype != cpu.dtype or tpu.shape != cpu.shape:
        return f"result {tpu.dtype} {tuple(tpu.shape)}, CPU {cpu.dtype} {tuple(cpu.shape)}"
    if compare_values:
        # This sweep checks dtype rules, not accuracy (test_ops checks values per op). In half
        # precision we compute in fp32 and round once, while some CPU kernels round each step
        # in the half type: results may differ by a couple of bf16 ulps (2^-8 relative each).
        tol = dict(atol=1e-2, rtol=1e-2) if dtype in (torch.float16, torch.bfloat16) else {}
        try:
            torch.testing.assert_close(tpu.cpu(), cpu, equal_nan=True, **tol)
        except AssertionError as e:
            return str(e).split("\n")[0]
    return None


def _sweep(ops, compare_values):
    bad = []
    for name, fn in ops.items():
        for dtype in DTYPES:
            why = _mismatch(name, fn, dtype, compare_values)
            if why:
                bad.append(f"{name} {dtype}: {why}")
    assert not bad, f"{len(bad)} op/dtype pairs differ from CPU:\n" + "\n".join(bad)


# One test per table (each test costs the leak check's set-up; the message lists every mismatch).
def test_ops_x_dtypes_match_cpu():
    _sweep(OPS, compare_values=True)


def test_random_ops_x_dtypes_match_cpu():
    _sweep(RANDOM_OPS, compare_values=False)


def test_sweep_covers_raising_and_passing_cases():
    """The sweep above must contain both kinds, or it proves nothing."""
    raising = passing = 0
    for name in ["and", "softmax", "layer_norm", "frac", "add"]:
        for dtype in DTYPES:
            exc, _ = _run(OPS[name], dtype, "cpu")
            raising += exc is not None
            passing += exc is None
    assert raising >= 20 and passing >= 10


# ---- the cases named in the issue, with PyTorch's exact words ----

def test_bitwise_on_float_raises_at_call():
    for dtype in FLOATS:
        t = torch.ones(3, dtype=dtype, device="tpu")
        for op, kernel in [(lambda: t & t, "bitwise_and"), (lambda: t | t, "bitwise_or"),
                           (lambda: t ^ t, "bitwise_xor"), (lambda: torch.bitwise_not(t), "bitwise_not")]:
            with pytest.raises(NotImplementedError, match=f"\"{kernel}\" not implemented for '{TORCH_NAME[dtype]}'"):
                op()
        torch.tpu.synchronize()    # and nothing sticks to the stream
        assert t.sum().item() == 3


def test_softmax_layer_norm_on_integers_raise_at_call():
    for dtype in NON_FLOATS:
        t = torch.ones(2, 3, dtype=dtype, device="tpu")
        for op, kernel in [(lambda: torch.softmax(t, -1), "softmax"), (lambda: torch.log_softmax(t, -1), "log_softmax"),
                           (lambda: F.layer_norm(t, (3,)), "layer_norm")]:
            with pytest.raises(NotImplementedError, match=f"\"{kernel}\" not implemented for '{TORCH_NAME[dtype]}'"):
                op()
        torch.tpu.synchronize()


def test_normal_uniform_on_integers_raise():
    for dtype in NON_FLOATS:
        t = torch.zeros(3, dtype=dtype, device="tpu")
        with pytest.raises(NotImplementedError, match=f"\"normal\" not implemented for '{TORCH_NAME[dtype]}'"):
            t.normal_()
        with pytest.raises(NotImplementedError, match=f"\"uniform\" not implemented for '{TORCH_NAME[dtype]}'"):
            t.uniform_(0, 1)
        with pytest.raises(NotImplementedError):
            torch.empty(0, dtype=dtype, device="tpu").normal_()    # CPU raises for empty tensors too
        assert (t.cpu() == 0).all()      # untouched, and nothing queued that fails later
        torch.tpu.synchronize()


def test_bernoulli_integer_probabilities_raise():
    with pytest.raises(NotImplementedError, match="\"bernoulli\" not implemented for 'Long'"):
        torch.zeros(3, device="tpu").bernoulli_(torch.ones(3, dtype=torch.long, device="tpu"))


def test_valid_mixed_dtypes_still_run():
    """Promotion picks the compute dtype the rule is checked against: these must not raise."""
    i = torch.arange(6, device="tpu").reshape(2, 3)
    f = torch.ones(2, 3, device="tpu", dtype=torch.bfloat16)
    assert (i & 3).dtype == torch.int64
    assert torch.exp(i).dtype == torch.float32
    assert (i / 2).dtype == torch.float32
    assert (i < f).dtype == torch.bool
    assert (i * f).dtype == torch.bfloat16
    assert torch.softmax(i, -1, dtype=torch.float32).dtype == torch.float32
    assert torch.where(i > 2, i, f).dtype == torch.bfloat16
    b = torch.zeros(5, dtype=torch.bool, device="tpu").bernoulli_(0.5)
    assert b.dtype == torch.bool
    torch.tpu.synchronize()
