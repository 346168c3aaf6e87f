"""Ops the tpu device runs as PyTorch's own decompositions into native ops.

The C++ glue holds no math (ARCHITECTURE.md: an ATen kernel checks, shapes,
allocates and hands one op to the runtime). Ops the runtime has no kernel for
yet, but which PyTorch decomposes into ops it has, are registered here for the
PrivateUse1 key with the decomposition from ``torch._decomp``: each piece then
runs natively (no CPU fallback), in every eager mode, through the one dispatch
point. When the runtime gains a kernel for one of these ops, its row moves to
csrc/ and out of this table.

- ``native_batch_norm`` (+ backward): per-channel statistics and the affine
  pass. The forward keeps the tpu kernel's argument checks and messages, and
  returns empty saved statistics in evaluation mode, as before.
- ``var_mean``: the batch-norm forward's statistics (var and mean are native).
- ``mse_loss`` (+ backward).
- ``native_group_norm`` (+ backward): PyTorch's composite kernel views its
  input, which fails on a channels-last tensor; the decomposition reshapes.
  The result keeps the input's memory format, as the CPU kernel's does.
- ``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_``
  (GradScaler): written here with CUDA's semantics and checks, from native
  ops, without a host sync (PyTorch has no decomposition for them).
- PyTorch's own decompositions into ops that are native here (each checked
  against the CPU on OpInfo's samples, forward and backward, with the CPU
  fallback off): ``glu``, ``prelu``, nearest / bilinear / bicubic / trilinear
  upsampling, ``im2col`` / ``col2im`` (``F.unfold`` / ``F.fold``), reflection
  padding, ``max_unpool2d``, ``unfold_backward``, ``index_copy`` (a static
  KV cache's update), ``grid_sampler_2d`` (differentiated through its
  decomposition, as are the upsampling ops, which have no autograd formula of
  their own here), ``eye``, ``logspace``, ``roll``, ``bucketize``, ``index_fill``,
  ``hardswish_backward``, ``flip``, replication padding, linear upsampling,
  adaptive average pooling, ``diag_embed``, ``trace``,
  ``std_mean``, ``aminmax``, ``tril_indices`` / ``triu_indices``, pixel and
  channel shuffles, ``soft_margin_loss``, ``special.xlog1py``, ``sgn`` (real
  dtypes: the sign), ``repeat_interleave`` with a tensor of repeats (its length
  read back first), ``equal`` (a host read, as its bool result needs),
  ``binary_cross_entropy`` (+ backward; the input's [0, 1] range is checked as
  the CPU checks it, which costs a host read).
- ``masked_scatter_``: the mask's count read back, then an index_put with
  the mask (masked_select's backward).
- ``avg_pool2d``: window sums over a zero-padded unfold view divided by
  PyTorch's per-window count (differentiated through, at the autograd level).
- ``_fused_sgd_`` (SGD ``fused=True``): CUDA's order of operations from native
  ops; a set found_inf keeps parameters and buffers as they were.
- ``unfold`` (``Tensor.unfold``): a view (as_strided), as on the CPU.
- ``isin``: each element compared with every test element (in chunks of
  elements, so memory stays bounded), as PyTorch's default algorithm does.
- ``multinomial``: the exponential race (Gumbel-max): sample j is the
  argmax over i of log p_i - log E_i with E_i = -log(1 - U_i) ~ Exp(1), U_i
  drawn by the tpu generator; without replacement, the top num_samples of one race (Gumbel
  top-k), which is distributed as sequential sampling without replacement.
  The probability checks need one host read (as CPU's raise at the call).
"""
import torch
from torch._decomp import decomposition_table

_aten = torch.ops.aten
_lib = None


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    # The checks of the former C++ kernel, in its words.
    if x.dim() < 2:
        raise RuntimeError(f"batch_norm: expected at least 2-d input, got {x.dim()}-d")
    if training:
        n = x.numel() // max(x.size(1), 1)
        if n <= 1:
            raise RuntimeError("Expected more than 1 value per channel when training, got input size "
                               f"[{', '.join(str(s) for s in x.shape)}]")
    elif running_mean is None or running_var is None:
        raise RuntimeError("running_mean and running_var must be defined in evaluation mode")
    y, save_mean, save_invstd = decomposition_table[_aten.native_batch_norm.default](
        x, weight, bias, running_mean, running_var, training, momentum, eps)
    if not training:   # nothing is saved in evaluation mode (as CUDA does)
        return y, x.new_empty((0,)), x.new_empty((0,))
    return y, save_mean, save_invstd


def _channels_last_like(x, y):
    """y in x's memory format when x is channels-last (and not also contiguous)."""
    for fmt, nd in ((torch.channels_last, 4), (torch.channels_last_3d, 5)):
        if x.dim() == nd and y.dim() == nd and not x.is_contiguous() and x.is_contiguous(memory_format=fmt):
            return y.contiguous(memory_format=fmt)
    return y


def _group_norm(x, weight, bias, n, c, hxw, group, eps):
    y, mean, rstd = decomposition_table[_aten.native_group_norm.default](x, weight, bias, n, c, hxw, group, eps)
    return _channels_last_like(x, y), mean, rstd


def _group_norm_backward(dy, x, mean, rstd, weight, n, c, hxw, group, mask):
    dx, dw, db = decomposition_table[_aten.native_group_norm_backward.default](
        dy, x, mean, rstd, weight, n, c, hxw, group, mask)
    return (_channels_last_like(x, dx) if dx is not None else None), dw, db


def _amp_unscale(grads, found_inf, inv_scale):
    """Multiply each grad by inv_scale; found_inf becomes 1.0 if any grad holds an inf or a NaN."""
    if inv_scale.numel() != 1:
        raise RuntimeError("inv_scale must be a 1-element tensor.")
    if found_inf.numel() != 1:
        raise RuntimeError("found_inf must be a 1-element tensor.")
    if inv_scale.dtype != torch.float32:
        raise RuntimeError("inv_scale must be a float tensor.")
    if found_inf.dtype != torch.float32:
        raise RuntimeError("found_inf must be a float tensor.")
    if not grads:
        return
    for g in grads:
        if g.device != found_inf.device:
            raise RuntimeError("scaled_grads must be on the same device as found_inf and inv_scale.")
        if g.layout != torch.strided:
            raise RuntimeError("one of scaled_grads was not a strided tensor.")
        if not g.is_floating_point():
            raise RuntimeError("_amp_foreach_non_finite_check_and_unscale_ only supports floating-point grads")
    bad = torch.stack([torch.logical_not(torch.isfinite(g)).any() for g in grads]).any()
    found_inf.copy_(torch.where(bad, torch.ones_like(found_inf), found_inf))
    torch._foreach_mul_(grads, inv_scale.reshape(()))


def _amp_update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """GradScaler's scale update (CUDA's rule): back off on inf, grow after growth_interval clean steps."""
    if growth_tracker.numel() != 1 or growth_tracker.dtype != torch.int32:
        raise RuntimeError("growth_tracker must be a 1-element int32 tensor.")
    if scale.numel() != 1 or scale.dtype != torch.float32:
        raise RuntimeError("current_scale must be a 1-element float tensor.")
    if found_inf.numel() != 1 or found_inf.dtype != torch.float32:
        raise RuntimeError("found_inf must be a 1-element float tensor.")
    inf = found_inf.reshape(scale.shape) != 0
    succ = growth_tracker + 1
    grow = torch.logical_and(torch.logical_not(inf), succ == growth_interval)
    grown = scale * growth_factor
    keep_grown = torch.logical_and(grow, torch.isfinite(grown))
    new_scale = torch.where(inf, scale * backoff_factor, torch.where(keep_grown, grown, scale))
    new_tracker = torch.where(torch.logical_or(inf, grow), torch.zeros_like(succ), succ)
    scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)
    return scale


def _flip(x, dims):
    """flip: one index_select per flipped dim (PyTorch's decomposition calls flip itself)."""
    nd = max(x.dim(), 1)
    ds = []
    for d in dims:
        if not -nd <= d < nd:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-nd}, {nd - 1}], but got {d})")
        d = d + nd if d < 0 else d
        if d in ds:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
        ds.append(d)
    out = torch.empty_like(x)   # laid out as x (as the CPU's flip)
    y = x
    for d in ds if x.dim() else []:
        y = y.index_select(d, torch.arange(x.size(d) - 1, -1, -1, device=x.device))
    return out.copy_(y)


def _repeat_interleave(repeats, *, output_size=None):
    """repeat_interleave(repeats): index i repeated repeats[i] times, as bucketize(arange(total), cumsum)."""
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int32, torch.int64):
        raise NotImplementedError(f'"repeat_interleave_cpu" not implemented for \'{str(repeats.dtype)[6:].capitalize()}\'')
    ends = torch.cumsum(repeats, 0)
    if repeats.numel() == 0:
        total = 0
    else:
        lo, last = torch.stack([repeats.min(), ends[-1]]).tolist()   # one host read
        if lo < 0:
            raise RuntimeError("repeats can not be negative")
        total = last if output_size is None else output_size
    pos = torch.arange(total, device=repeats.device, dtype=repeats.dtype)
    return torch.bucketize(pos, ends, right=True, out_int32=repeats.dtype == torch.int32)


def _equal(a, b):
    """torch.equal: same shape and every element equal (NaN is not; dtypes promote, as on the CPU)."""
    if a.shape != b.shape:
        return False
    return bool(torch.eq(a, b).all().item())


def _fused_sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
               is_first_step, grad_scale=None, found_inf=None):
    """torch._fused_sgd_ (SGD fused=True) in CUDA's order, from native ops; a set found_inf keeps everything as
    it was (chosen on the device: no host sync)."""
    skip = None if found_inf is None else found_inf.reshape(()).ne(0)

    def keep(old, new):
        return old.copy_(new if skip is None else torch.where(skip, old, new))

    for i, (p, g) in enumerate(zip(params, grads)):
        if grad_scale is not None:
            keep(g, g / grad_scale.reshape(()))
        d = torch.neg(g) if maximize else g
        if weight_decay != 0:
            d = d + weight_decay * p
        if momentum != 0:
            buf = momentum_buffer_list[i]
            nb = d if is_first_step else buf * momentum + (1 - dampening) * d
            keep(buf, nb)
            d = d + momentum * nb if nesterov else nb
        keep(p, p - lr * d)


def _pool_out(n, k, s, p, ceil_mode):
    o = (n + 2 * p - k + ((s - 1) if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= n + p:
        o -= 1
    return o


def _avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    """avg_pool2d: window sums over a zero-padded view (Tensor.unfold, a view here), divided by PyTorch's
    per-window count (the padded area counts if count_include_pad; past it never)."""
    two = lambda v, d: (v, v) if isinstance(v, int) else (tuple(v) * 2 if len(v) == 1 else tuple(v)) if v else d  # noqa: E731
    kh, kw = two(kernel_size, None)
    sh, sw = two(stride, (kh, kw))
    ph, pw = two(padding, (0, 0))
    if x.dim() not in (3, 4):
        raise RuntimeError("non-empty 3D or 4D (batch mode) tensor expected for input")
    if ph > kh // 2 or pw > kw // 2:
        raise RuntimeError("pad should be at most half of effective kernel size, but got pad="
                           f"{ph}, kernel_size={kh} and dilation=1")
    if divisor_override is not None and divisor_override == 0:
        raise RuntimeError("divisor must be not zero")
    H, W = x.shape[-2:]
    oh, ow = _pool_out(H, kh, sh, ph, ceil_mode), _pool_out(W, kw, sw, pw, ceil_mode)
    if oh <= 0 or ow <= 0:
        raise RuntimeError(f"Given input size: ({'x'.join(str(v) for v in x.shape[-3:])}). Calculated output size: "
                           f"({x.shape[-3]}x{oh}x{ow}). Output size is too small")
    eh, ew = max(0, (oh - 1) * sh + kh - (H + 2 * ph)), max(0, (ow - 1) * sw + kw - (W + 2 * pw))
    xp = torch.nn.functional.pad(x, (pw, pw + ew, ph, ph + eh))
    win = xp.unfold(-2, kh, sh).unfold(-2, kw, sw)[..., :oh, :ow, :, :]
    sums = win.sum((-2, -1), dtype=torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else None)
    if divisor_override is not None:
        div = torch.tensor(float(divisor_override))
    else:
        def counts(o, k, s, p, n):
            c = []
            for i in range(o):
                a, b = i * s - p, min(i * s - p + k, n + p)
                c.append(b - a if count_include_pad else min(b, n) - max(a, 0))
            return torch.tensor(c, dtype=torch.float32)
        div = counts(oh, kh, sh, ph, H)[:, None] * counts(ow, kw, sw, pw, W)[None, :]
    return (sums / div.to(device=x.device, dtype=sums.dtype)).to(x.dtype)


def _masked_scatter_(self, mask, source):
    """self[mask] = source's first elements, in order (what masked_select's backward runs)."""
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype "
                           f"{_dtype_name(mask.dtype)}")
    if self.dtype != source.dtype:
        raise RuntimeError(f"masked_scatter: expected self and source to have same dtypes but got"
                           f"{_dtype_name(self.dtype)} and {_dtype_name(source.dtype)}")
    m = mask.expand(self.shape)
    n = int(m.sum().item())
    if n > source.numel():
        raise RuntimeError("Number of elements of source < number of ones in mask")
    if n and self.dim() == 0:   # (a 0-d mask selects the one element)
        self.copy_(source.reshape(-1)[0])
    elif n:
        self.index_put_((m,), source.reshape(-1)[:n])
    return self


def _dtype_name(dt):
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
            torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
            torch.bool: "Bool"}.get(dt, str(dt))


def _sgn(x):
    """sgn of a real tensor is its sign (complex tensors are not supported here yet)."""
    return torch.sign(x)


def _sgn_out(x, *, out):
    return torch.sign(x, out=out)


def _bce(x, target, weight=None, reduction=1):
    if torch.logical_or(x < 0, x > 1).any().item():
        raise RuntimeError("all elements of input should be between 0 and 1")
    return decomposition_table[_aten.binary_cross_entropy.default](x, target, weight, reduction)


def _unfold(x, dim, size, step):
    """Tensor.unfold as the view it is: windows of `size` every `step` along dim, as a new last dim."""
    nd = x.dim()
    d = dim + nd if dim < 0 else dim
    if not (0 <= d < max(nd, 1)):
        raise IndexError(f"Dimension out of range (expected to be in range of [{-max(nd, 1)}, {max(nd, 1) - 1}], "
                         f"but got {dim})")
    n = x.size(d) if nd else 1
    if size > n:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {n} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    if nd == 0:
        return x.as_strided([size], [1], x.storage_offset())
    sizes, strides = list(x.shape), list(x.stride())
    sizes[d] = (n - size) // step + 1
    strides[d] = x.stride(d) * step
    return x.as_strided(sizes + [size], strides + [x.stride(d)], x.storage_offset())


_ISIN_CHUNK = 1 << 22   # elements x test elements compared at once


def _isin(elements, test_elements, assume_unique=False, invert=False):
    e = elements if isinstance(elements, torch.Tensor) else torch.tensor(elements, device=test_elements.device)
    t = test_elements if isinstance(test_elements, torch.Tensor) else torch.tensor(test_elements, device=e.device)
    t = t.reshape(-1)
    flat = e.reshape(-1)
    step = max(1, _ISIN_CHUNK // max(1, t.numel()))
    parts = [(flat[i:i + step, None] == t[None, :]).any(-1) for i in range(0, flat.numel(), step)]
    out = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool, device=e.device)
    out = out.reshape(e.shape)
    return torch.logical_not(out) if invert else out


def _isin_out(elements, test_elements, assume_unique=False, invert=False, *, out):
    r = _isin(elements, test_elements, assume_unique, invert)
    out.resize_(r.shape)
    return out.copy_(r)


def _exponential(shape, device, generator):
    """Exp(1) draws from the tpu generator: -log(1 - U), U uniform in [0, 1)."""
    return torch.neg(torch.log1p(torch.neg(torch.rand(shape, device=device, generator=generator))))


def _multinomial(p, num_samples, replacement=False, *, generator=None):
    if p.dim() not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not p.is_floating_point():
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {p.dtype}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    n = p.size(-1)
    if not replacement and num_samples > n:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    q = p.float()
    bad = torch.logical_or(q < 0, torch.logical_not(torch.isfinite(q))).any()
    empty = (q.sum(-1) <= 0).any()
    flags = torch.stack([bad, empty]).tolist()   # one host read for both checks
    if flags[0]:
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if flags[1]:
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    rows = q.reshape(-1, n)
    logp = torch.log(rows)
    if replacement and num_samples > 1:
        e = _exponential((rows.size(0), num_samples, n), p.device, generator)
        idx = (logp[:, None, :] - torch.log(e)).argmax(-1)
    else:
        idx = torch.topk(logp - torch.log(_exponential(rows.shape, p.device, generator)), num_samples, dim=-1).indices
    return idx.reshape(*p.shape[:-1], num_samples)


# (schema name, overload, implementation)
_ROWS = [
    ("native_batch_norm", "default", _batch_norm),
    ("native_batch_norm_backward", "default", None),
    ("var_mean", "correction", None),
    ("mse_loss", "default", None),
    ("mse_loss", "out", None),
    ("mse_loss_backward", "default", None),
    ("mse_loss_backward", "grad_input", None),
    ("native_group_norm", "default", _group_norm),
    ("native_group_norm_backward", "default", _group_norm_backward),
    ("_amp_foreach_non_finite_check_and_unscale_", "default", _amp_unscale),
    ("_amp_update_scale_", "default", _amp_update_scale),
    ("isin", "Tensor_Tensor", _isin),
    ("isin", "Tensor_Tensor_out", _isin_out),
    ("isin", "Tensor_Scalar", _isin),
    ("isin", "Scalar_Tensor", _isin),
    ("multinomial", "default", _multinomial),
    ("unfold", "default", _unfold),
    ("unfold_backward", "default", None),
    ("index_copy", "default", None),
    ("index_copy_", "default", None),
    ("index_fill", "int_Tensor", None),
    ("index_fill_", "int_Tensor", None),
    ("binary_cross_entropy", "default", _bce),
    ("binary_cross_entropy_backward", "default", None),
    ("glu", "default", None),
    ("glu_backward", "default", None),
    ("_prelu_kernel", "default", None),
    ("_prelu_kernel_backward", "default", None),
    ("upsample_nearest1d", "default", None),
    ("upsample_nearest1d", "vec", None),
    ("upsample_nearest2d", "default", None),
    ("upsample_nearest2d", "vec", None),
    ("upsample_nearest3d", "default", None),
    ("upsample_nearest3d", "vec", None),
    ("_upsample_nearest_exact1d", "default", None),
    ("_upsample_nearest_exact2d", "default", None),
    ("_upsample_nearest_exact2d", "vec", None),
    ("upsample_bilinear2d", "default", None),
    ("upsample_bilinear2d", "vec", None),
    ("upsample_bicubic2d", "default", None),
    ("upsample_bicubic2d", "vec", None),
    ("upsample_trilinear3d", "default", None),
    ("upsample_trilinear3d", "vec", None),
    ("im2col", "default", None),
    ("col2im", "default", None),
    ("reflection_pad1d", "default", None),
    ("reflection_pad2d", "default", None),
    ("reflection_pad3d", "default", None),
    ("reflection_pad1d_backward", "default", None),
    ("reflection_pad2d_backward", "default", None),
    ("reflection_pad3d_backward", "default", None),
    ("max_unpool2d", "default", None),
    ("grid_sampler_2d", "default", None),
    ("eye", "default", None),
    ("eye", "m", None),
    ("logspace", "default", None),
    ("roll", "default", None),
    ("bucketize", "Tensor", None),
    ("index_fill", "int_Scalar", None),
    ("index_fill_", "int_Scalar", None),
    ("hardswish_backward", "default", None),
    ("flip", "default", _flip),
    ("diag_embed", "default", None),
    ("std_mean", "correction", None),
    ("aminmax", "default", None),
    ("replication_pad1d", "default", None),
    ("replication_pad2d", "default", None),
    ("replication_pad3d", "default", None),
    ("upsample_linear1d", "default", None),
    ("_adaptive_avg_pool2d", "default", None),
    ("soft_margin_loss", "default", None),
    ("trace", "default", None),
    ("tril_indices", "default", None),
    ("triu_indices", "default", None),
    ("pixel_shuffle", "default", None),
    ("pixel_unshuffle", "default", None),
    ("channel_shuffle", "default", None),
    ("special_xlog1py", "default", None),
    ("sgn", "default", _sgn),
    ("repeat_interleave", "Tensor", _repeat_interleave),
    ("equal", "default", _equal),
    ("_fused_sgd_", "default", _fused_sgd),
    ("avg_pool2d", "default", _avg_pool2d),
    ("masked_scatter_", "default", _masked_scatter_),
    ("sgn", "out", _sgn_out),
]


# Ops whose overload has no autograd formula of its own in PyTorch (the
# upsampling ones) or whose backward has no native kernel (grid_sampler_2d,
# replication padding, adaptive average pooling, linear upsampling; sgn's
# needs a ZeroTensor):
# their decomposition is registered at the autograd level too, so autograd
# differentiates the native ops it is made of (as CompositeImplicitAutograd
# would for this device).
_AUTOGRAD_LEVEL = {"avg_pool2d", "sgn", "replication_pad1d", "replication_pad2d", "replication_pad3d", "upsample_linear1d",
                   "_adaptive_avg_pool2d", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
                   "_upsample_nearest_exact2d", "upsample_bilinear2d", "upsample_bicubic2d", "upsample_trilinear3d",
                   "grid_sampler_2d"}


def _register():
    """Register the table for PrivateUse1 (once)."""
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name, overload, fn in _ROWS:
        op = getattr(getattr(_aten, name), overload)
        full = name if overload == "default" else f"{name}.{overload}"
        keys = ("PrivateUse1", "AutogradPrivateUse1") if name in _AUTOGRAD_LEVEL and overload != "out" \
            else ("PrivateUse1",)
        for key in keys:
            lib.impl(full, fn or decomposition_table[op], key)
    _lib = lib
