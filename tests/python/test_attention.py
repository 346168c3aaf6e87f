"""F.scaled_dot_product_attention on tpu: the ATTN kernels (blocked, the scores never stored)
run it natively - forward and backward of query, key, value and a float mask - for float32,
bfloat16 and float16, 3-d and 4-d inputs, grouped-query heads, causal and explicit masks
(bool or float, broadcast, rows that exclude every key), any strides, and dropout; the rest
(float64, ...) takes PyTorch's math path on our native ops. Checked against the CPU in
float64 on the same inputs."""
import math

import pytest
import torch
import torch.nn.functional as F
import torch_tpu
from torch.nn.attention import SDPBackend, sdpa_kernel

from conftest import assert_close

pytestmark = pytest.mark.usefixtures("native_only")

TOL = {torch.float32: dict(rtol=2e-5, atol=2e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
       torch.float16: dict(rtol=2e-3, atol=2e-3)}
NATIVE = "ScaledDotProductFusedAttentionOverrideableBackward"


def _inputs(shape_q, shape_k, shape_v, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype) for s in (shape_q, shape_k, shape_v)]


def _run(q, k, v, device, mask=None, grad_mask=False, **kw):
    """Forward, and backward from a fixed upstream gradient; float64 on the CPU."""
    dt = torch.float64 if device == "cpu" else q.dtype
    leaves = [t.detach().to(device, dt).requires_grad_() for t in (q, k, v)]
    m = None
    if mask is not None:
        m = mask.to(device) if mask.dtype == torch.bool else mask.detach().to(device, dt)
        if grad_mask:
            m.requires_grad_()
    out = F.scaled_dot_product_attention(*leaves, attn_mask=m, **kw)
    g = torch.Generator().manual_seed(1)
    up = torch.randn(out.shape, generator=g).to(device, dt)
    out.backward(up)
    grads = [t.grad for t in leaves] + ([m.grad] if grad_mask else [])
    return out, grads


def _compare(q, k, v, mask=None, grad_mask=False, native=True, **kw):
    out, grads = _run(q, k, v, "tpu", mask, grad_mask, **kw)
    ref, rgrads = _run(q, k, v, "cpu", mask, grad_mask, **kw)
    if native:
        assert NATIVE in type(out.grad_fn).__name__, f"not the native kernel: {type(out.grad_fn).__name__}"
    tol = TOL.get(q.dtype, dict(rtol=1e-10, atol=1e-10))
    assert_close(out, ref.to(q.dtype), check_layout=False, **tol)
    for a, b in zip(grads, rgrads):
        assert_close(a, b.to(a.dtype), check_layout=False, **tol)


SHAPES = [  # (B, H, L, S, E, Ev)
    (2, 3, 17, 33, 16, 16),
    (1, 2, 64, 64, 64, 64),
    (1, 1, 130, 70, 8, 24),
    (2, 1, 1, 200, 32, 32),  # decode: one query row
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_matches_cpu(dtype, shape, causal):
    B, H, L, S, E, Ev = shape
    q, k, v = _inputs((B, H, L, E), (B, H, S, E), (B, H, S, Ev), dtype)
    _compare(q, k, v, is_causal=causal)


@pytest.mark.parametrize("kind", ["bool", "float", "float_broadcast", "bool_2d", "float_grad"])
def test_masks(kind):
    B, H, L, S, E = 2, 2, 40, 70, 16
    q, k, v = _inputs((B, H, L, E), (B, H, S, E), (B, H, S, E), torch.float32)
    g = torch.Generator().manual_seed(3)
    if kind.startswith("bool"):
        shape = (L, S) if kind == "bool_2d" else (B, 1, L, S)
        mask = torch.rand(shape, generator=g) > 0.3
        mask[..., 0] = True  # every row keeps a key (the fully excluded row: next test)
    else:
        shape = (1, 1, L, S) if kind == "float_broadcast" else (B, H, L, S)
        mask = torch.randn(shape, generator=g)
        mask[torch.rand(shape, generator=g) < 0.2] = float("-inf")
        mask[..., 0] = 0.0
    _compare(q, k, v, mask=mask, grad_mask=kind == "float_grad")


def test_mask_with_causal():
    """A mask and is_causal together apply both, as the CPU does."""
    q, k, v = _inputs((2, 2, 30, 8), (2, 2, 41, 8), (2, 2, 41, 8), torch.float32)
    mask = torch.rand(2, 1, 30, 41, generator=torch.Generator().manual_seed(5)) > 0.3
    mask[..., 0] = True
    leaves = [[t.detach().to(d).requires_grad_() for t in (q, k, v)] for d in ("tpu", "cpu")]
    outs = [F.scaled_dot_product_attention(*ls, attn_mask=mask.to(ls[0].device), is_causal=True) for ls in leaves]
    assert NATIVE in type(outs[0].grad_fn).__name__
    for o in outs:
        o.backward(torch.ones_like(o))
    assert_close(outs[0], outs[1], check_layout=False, **TOL[torch.float32])
    for a, b in zip(*leaves):
        assert_close(a.grad, b.grad, check_layout=False, **TOL[torch.float32])


def test_row_excluding_every_key():
    """A query row whose mask excludes every key gives what the CPU gives."""
    q, k, v = _inputs((1, 2, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8), torch.float32)
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[2] = False
    _compare(q, k, v, mask=mask)


def test_layouts_3d_gqa_and_scale():
    # (B, L, H, E) transposed to (B, H, L, E), as Hugging Face models hand it over
    q, k, v = _inputs((2, 33, 4, 16), (2, 50, 4, 16), (2, 50, 4, 16), torch.float32)
    _compare(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=0.3)
    # 3-d inputs
    q, k, v = _inputs((3, 20, 8), (3, 30, 8), (3, 30, 12), torch.float32)
    _compare(q, k, v, is_causal=True)
    # grouped-query attention: 4 query heads over 2 key / value heads
    q, k, v = _inputs((1, 4, 20, 16), (1, 2, 24, 16), (1, 2, 24, 16), torch.bfloat16)
    _compare(q, k, v, enable_gqa=True, is_causal=True)


def test_math_path_cases_still_match():
    """float64 and a disabled overrideable backend run PyTorch's math path on native ops."""
    q, k, v = _inputs((1, 2, 9, 8), (1, 2, 11, 8), (1, 2, 11, 8), torch.float64)
    _compare(q, k, v, native=False, is_causal=True)
    q, k, v = _inputs((1, 2, 9, 8), (1, 2, 11, 8), (1, 2, 11, 8), torch.float32)
    with sdpa_kernel([SDPBackend.MATH]):
        out, _ = _run(q, k, v, "tpu")
    assert NATIVE not in type(out.grad_fn).__name__


def test_dropout_matches_its_mask_and_modes():
    """With dropout the kept elements are the ones the seed draws: read the mask back through
    uniform attention onto one-hot values, then check out and every gradient against a float64
    CPU computation with that mask; every eager mode draws the same mask."""
    B, H, L, S, p = 1, 2, 37, 48, 0.3
    eye = torch.eye(S).expand(B, H, S, S)
    masks = []
    for mode in ("debug", "strict", "fused"):
        with torch_tpu.eager_mode(mode):
            torch.manual_seed(123)
            z = F.scaled_dot_product_attention(torch.zeros(B, H, L, 8, device="tpu"),
                                               torch.zeros(B, H, S, 8, device="tpu"), eye.to("tpu"),
                                               dropout_p=p).cpu() * S
            masks.append(z)
    assert torch.equal(masks[0], masks[1]) and torch.equal(masks[0], masks[2])
    z = masks[0]
    kept = (z > 0).double().mean().item()
    assert abs(kept - (1 - p)) < 0.05, kept
    assert torch.allclose(z[z > 0], torch.full_like(z[z > 0], 1 / (1 - p)), rtol=1e-5)

    q, k, v = _inputs((B, H, L, 8), (B, H, S, 8), (B, H, S, 8), torch.float32)
    torch.manual_seed(123)
    out, grads = _run(q, k, v, "tpu", dropout_p=p)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    attn = torch.softmax(leaves[0] @ leaves[1].transpose(-2, -1) / math.sqrt(8), -1)
    ref = (attn * z.double()) @ leaves[2]
    ref.backward(torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).double())
    assert_close(out, ref.float(), check_layout=False, **TOL[torch.float32])
    for a, b in zip(grads, leaves):
        assert_close(a, b.grad.float(), check_layout=False, **TOL[torch.float32])


def test_errors_as_cpu():
    """Bad calls raise the CPU's exception type, and the device keeps working."""
    cases = [
        lambda d: F.scaled_dot_product_attention(torch.randn(1, 2, 3, 4, device=d),
                                                 torch.randn(1, 2, 5, 4, device=d, dtype=torch.float64),
                                                 torch.randn(1, 2, 5, 4, device=d)),
        lambda d: F.scaled_dot_product_attention(torch.randn(1, 4, 3, 4, device=d), torch.randn(1, 2, 5, 4, device=d),
                                                 torch.randn(1, 2, 5, 4, device=d)),
        lambda d: F.scaled_dot_product_attention(torch.randn(1, 2, 3, 4, device=d), torch.randn(1, 2, 5, 6, device=d),
                                                 torch.randn(1, 2, 5, 4, device=d)),
        lambda d: F.scaled_dot_product_attention(torch.randn(1, 4, 3, 4, device=d), torch.randn(1, 3, 5, 4, device=d),
                                                 torch.randn(1, 3, 5, 4, device=d), enable_gqa=True),
    ]
    for make in cases:
        with pytest.raises(Exception) as cpu_err:
            make("cpu")
        with pytest.raises(cpu_err.type):
            make("tpu")
    q, k, v = _inputs((1, 1, 4, 4), (1, 1, 4, 4), (1, 1, 4, 4), torch.float32)
    _compare(q, k, v)


def test_memory_does_not_grow_with_scores():
    """A long sequence's forward and backward never hold the L x S scores (32 MiB here)."""
    B, H, L, E = 1, 2, 2048, 64
    q, k, v = (torch.randn(B, H, L, E, device="tpu", requires_grad=True) for _ in range(3))
    torch.tpu.synchronize()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.memory_allocated()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()
    torch.tpu.synchronize()
    peak = torch.tpu.max_memory_allocated() - base
    scores = B * H * L * L * 4
    assert peak < scores / 4, f"peak {peak} bytes for scores of {scores}"
    del out


def test_compiled_matches_eager():
    """torch.compile(backend="tpu") over attention with a mask, two sequence lengths (the second
    compiles a dynamic-shape graph): outputs and gradients equal eager's."""
    torch._dynamo.reset()

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m).sum(-1)

    cf = torch.compile(f, backend="tpu")
    for L in (24, 40):
        q, k, v = _inputs((2, 2, L, 16), (2, 2, L, 16), (2, 2, L, 16), torch.float32, seed=L)
        m = torch.rand(2, 1, L, L, generator=torch.Generator().manual_seed(L)) > 0.2
        m[..., 0] = True
        res = []
        for fn in (f, cf):
            leaves = [t.to("tpu").requires_grad_() for t in (q, k, v)]
            out = fn(*leaves, m.to("tpu"))
            out.sum().backward()
            res.append([out] + [t.grad for t in leaves])
        for a, b in zip(*res):
            torch.testing.assert_close(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-5)
