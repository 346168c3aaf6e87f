"""Random programs run in Fused Eager and in Strict Eager must agree bit for bit.

A program is drawn op by op from a seed: elementwise ops with broadcasting,
host scalars and mixed float dtypes, casts, views, in-place ops (on views
too), reductions, softmax, matmuls, random ops, frees, and flush points
(.item(), synchronize) anywhere. Decisions depend only on the pool's shapes
and dtypes, so both runs draw the same program. Fused runs recompute values
at distances of a few ops (most programs) or not at all. `make test` runs a few
hundred programs (120 per fixture mode); `make fuzz` runs 3 x 3,400."""
import os
import random

import pytest
import torch
import torch_tpu

N_PROGRAMS = int(os.environ.get("TPU_FUSED_FUZZ_PROGRAMS", "120"))  # per fixture mode
N_CHUNKS = 4
REMAT = [64, 2, 3, 0, 5]  # Fused Eager's recomputation distance per program (0: off)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
UNARY = [torch.neg, torch.exp, torch.tanh, torch.sigmoid, torch.abs, torch.relu, torch.sin,
         lambda a: torch.sqrt(torch.abs(a)), torch.nn.functional.gelu, lambda a: a.clamp(-1, 2)]
BINARY = [torch.add, torch.sub, torch.mul, torch.maximum, torch.minimum,
          lambda a, b: torch.where(a > 0, a, b), lambda a, b: a / (b.abs() + 1)]


def _program(seed):
    rng = random.Random(seed)
    R, C = rng.randint(1, 40), rng.randint(1, 300)
    g = torch.Generator().manual_seed(seed)
    pool = [torch.randn(R, C, generator=g).to(rng.choice(DTYPES)).to("tpu") for _ in range(3)]
    W = torch.randn(C, C, generator=g).to("tpu")
    torch.manual_seed(seed)
    out = []

    def pick():
        return rng.randrange(len(pool))

    def operand(like):
        """Another pool tensor of like's shape (maybe broadcast-shaped), or a Python scalar."""
        r = rng.random()
        same = [t for t in pool if t.shape == like.shape]
        if r < 0.2 or not same:
            return rng.choice([0.5, -2.0, 3.0])
        b = rng.choice(same)
        if r < 0.35:
            return b[:1]            # (1, C): broadcast over rows
        if r < 0.45:
            return b[:, :1]         # (R, 1): broadcast over columns
        return b

    for _ in range(rng.randint(5, 40)):
        k = rng.random()
        a = pool[pick()]
        if k < 0.22:
            pool.append(rng.choice(UNARY)(a))
        elif k < 0.50:
            b = operand(a)
            ops = BINARY if isinstance(b, torch.Tensor) else BINARY[:3]
            pool.append(rng.choice(ops)(a, b))
        elif k < 0.56:
            pool.append(a.to(rng.choice(DTYPES)))
        elif k < 0.62:                                    # views
            v = rng.choice([lambda t: t[::2], lambda t: t[:, 1:], lambda t: t.flip(0) * 1,  # flip: index_selects
                            lambda t: t.t().contiguous().t()])
            pool.append(v(a))
        elif k < 0.70:                                    # in place, maybe on a view
            tgt = a if rng.random() < 0.6 else a[::2]
            src = operand(tgt)
            if isinstance(src, torch.Tensor) and torch.promote_types(src.dtype, tgt.dtype) != tgt.dtype:
                src = src.to(tgt.dtype)
            if isinstance(src, torch.Tensor) and src.untyped_storage().data_ptr() == tgt.untyped_storage().data_ptr():
                src = src.clone()
            if rng.random() < 0.5:
                tgt.add_(src)
            else:
                tgt.mul_(0.5)
        elif k < 0.76 and a.shape[0] > 0 and a.shape[-1] > 0:  # reductions (amax / amin need elements)
            r = rng.choice([lambda t: t.sum(1, keepdim=True), lambda t: t.float().mean(0, keepdim=True),
                            lambda t: torch.softmax(t.float(), -1), lambda t: t.amax(1, keepdim=True),
                            lambda t: (t * 1.5).exp().mean(-1, keepdim=True),     # rows fused with producers
                            lambda t: t.pow(2).sum(-1)[:, None], lambda t: (t - 1).amin(1, keepdim=True),
                            lambda t: t - t.amax(-1, keepdim=True),              # row values read over the row
                            lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6),
                            lambda t: (e := (t * 0.5).exp()) / e.sum(-1, keepdim=True),
                            lambda t: torch.nn.functional.layer_norm(t.float() * 2, (t.shape[-1],)) + 1,
                            lambda t: torch.log_softmax(t * 2, -1).exp() + t,
                            lambda t: torch.nn.functional.layer_norm(t + 1, (t.shape[-1],), t[0], t[-1] * 2)])
            pool.append(r(a))
        elif k < 0.80:
            if a.shape[-1] == C:
                pool.append(a.float() @ W)
        elif k < 0.84:
            pool.append(torch.rand_like(a.float()) * a)
        elif k < 0.88 and len(pool) > 2:
            del pool[pick()]
        elif k < 0.92:
            out.append(a.float().sum().item())            # a flush point in the middle
        elif k < 0.94:
            torch.tpu.synchronize()
        else:
            pool.append(torch.nn.functional.dropout(a, 0.3))
    out.extend(t.cpu() for t in pool)
    return out


def _same(x, y):
    if isinstance(x, float):
        return x == y or (x != x and y != y)
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    return torch.equal(x.contiguous().view(-1).view(torch.uint8), y.contiguous().view(-1).view(torch.uint8))


@pytest.mark.parametrize("chunk", range(N_CHUNKS))
def test_random_programs_fused_equal_strict(chunk, eager_mode):
    """Fused against the fixture's mode (Debug or Strict; Strict when the fixture is Fused itself);
    each fixture mode draws its own programs."""
    ref_mode = "strict" if eager_mode == "fused" else eager_mode
    base = {"debug": 0, "strict": 1, "fused": 2}[eager_mode] * N_PROGRAMS
    for seed in range(base + chunk, base + N_PROGRAMS, N_CHUNKS):
        with torch_tpu.eager_mode(ref_mode):
            ref = _program(seed)
        remat = torch_tpu.get_fused_remat()
        torch_tpu.set_fused_remat(REMAT[seed % len(REMAT)])  # recomputation at short distances: often
        try:
            with torch_tpu.eager_mode("fused"):
                got = _program(seed)
                torch_tpu.synchronize()
        finally:
            torch_tpu.set_fused_remat(remat)
        assert len(ref) == len(got), seed
        for i, (r, f) in enumerate(zip(ref, got)):
            assert _same(r, f), f"program {seed}: result {i} differs"
