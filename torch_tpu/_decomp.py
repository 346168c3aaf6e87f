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
  padding, ``max_unpool2d`` / ``max_unpool3d``, ``hardsigmoid_backward``, ``unfold_backward``, ``index_copy`` (a static
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
  the CPU checks it, which costs a host read), ``huber_loss`` and
  ``smooth_l1_loss`` (+ backward), ``nansum`` (and so ``nanmean``),
  ``count_nonzero``, ``renorm``, ``linalg.matrix_exp`` (Higham's Pade 13
  scaling and squaring in float64 from native matmuls and solve: PyTorch's
  kernel builds its coefficients on the CPU for any device but CUDA), ``threshold``, ``norm.out``
  (``F.pairwise_distance``, the triplet margin losses), ``heaviside`` (with
  the CPU's dtype checks), ``rrelu_with_noise_backward``.
- Compositions of native ops with the CPU kernels' checks and words, equal to
  the CPU forward and backward (bit for bit where noted):
  ``logit`` (+ backward; each op rounded in the dtype, as the CPU's);
  ``take`` / ``put_`` (the flattened tensor indexed; the index range checked
  with one host read); the shifts ``<<`` / ``>>`` (``bitwise_left_shift`` /
  ``bitwise_right_shift``, in-place forms too: a * 2**b wrapping, a // 2**b,
  and the CPU's result for a shift past the width; bit-exact); ``frexp`` and
  ``nextafter`` (read from and stepped on the bits; bit-exact);
  ``linalg_cross``; ``_cdist_forward`` / ``_pdist_forward`` (+ backward, with
  the CPU kernel's per-p formulas and its 0 where a distance is 0);
  ``multi_margin_loss`` / ``multilabel_margin_loss`` (+ backward; PyTorch's
  multilabel decomposition counts the slots after the first -1, so it is not
  used); ``_weight_norm_interface`` (+ backward; ``nn.utils.weight_norm`` and
  the parametrization); ``adaptive_max_pool2d`` (+ backward; each window
  gathered, short ones padded with their last row / column; 1-d pooling goes
  through it); ``nonzero_static``; ``addbmm`` (an addmm per batch, as the CPU's);
  ``segment_reduce`` (+ backward: lengths or offsets, any axis, initial; a
  scatter_reduce into the segments, the CPU's gradient rules element by element);
  ``exponential_`` (``gumbel_softmax``), ``normal`` with a
  tensor mean and / or std (the native normal fill scaled and shifted, as the
  CPU's normal_out_impl) and
  ``rrelu_with_noise`` (training: the slopes drawn by the tpu generator).
- ``_upsample_bilinear2d_aa`` / ``_upsample_bicubic2d_aa`` (``F.interpolate(...,
  antialias=True)``; differentiated through at the autograd level): two native
  matmuls with PyTorch's interpolation matrices (its _compute_weights_aa: the
  filter stretched by the scale when downsampling, normalized per output), which
  depend on the sizes only and are built on the host in float64, like an index
  table; half types compute in float32.
- ``_embedding_bag`` (sum / mean / max, offsets or 2-d input, per-sample
  weights, padding_idx, include_last_offset; differentiated through at the
  autograd level): bags padded to the longest (one host read, with the checks of
  the offsets and indices), rows gathered by ``torch.embedding``. bfloat16
  sums round as the CPU's (fbgemm's ties away from zero, without padding_idx)
  and the mean's gradient is scaled by the count's reciprocal in the dtype:
  the CPU's forward values bit for bit. scale_grad_by_freq divides by each index's count, as documented (the
  CPU's bag backward divides by the wrong count, pytorch#190063).
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
- Sorting and selection, on the native stable ``torch.sort`` (NaN last), with
  the CPU kernels' checks and words (out= forms with its overlap checks):
  ``kthvalue`` the CPU's quick select itself (median of three, Hoare
  partition), run on all slices at once, one partition pass per step (its
  swaps paired by rank; the slices' progress read back once per pass): the
  CPU's value and its index among equal values; ``median`` / ``nanmedian``
  (all-reduce and dim forms) the stable sort's middle (the CPU's nth_element
  orders by value, then index; median's NaN is the slice's first, an all-NaN
  slice's nanmedian index the one nth_element leaves first); ``mode`` the
  most frequent value (the smallest of equally frequent ones) and the index
  libstdc++'s std::sort leaves last among them: its introsort partition
  passes emulated level by level, then the final insertion sort, a stable
  sort (exact for slices without NaN; a NaN, which the CPU's comparisons
  leave in place, counts once and sorts last here); ``_unique2``,
  ``unique_dim``, ``unique_consecutive``, ``unique_dim_consecutive`` (the
  group count is the one host read; slices sorted lexicographically, a stable
  sort per column; NaNs in order of appearance, where the CPU's unstable sort
  leaves them in a machine-dependent order); ``searchsorted`` (Tensor and
  Scalar, out=, sorter, side, out_int32, 1-d or N-d boundaries) the CPU's
  binary search step for step, on all values at once.
- ``nll_loss2d_forward`` / ``nll_loss2d_backward`` (``F.nll_loss`` /
  ``cross_entropy`` on (N, C, H, ...) inputs): every pixel a row of the native
  nll_loss, with the 2-d kernel's checks (bfloat16 sums accumulate in float32,
  as the native nll_loss's: the correctly rounded loss, where the CPU's sums
  round in bfloat16).
- 3-d pooling with the CPU's checks and words: ``avg_pool3d`` (+ backward)
  the sum of one strided view of the zero-padded input per kernel offset, in
  the CPU's order (its float sums bit for bit), over PyTorch's divisor (int64:
  truncated); its backward adds each output's share to the same views.
  ``max_pool3d_with_indices`` (+ backward) the CPU kernel's scan, offset by
  offset: greater or NaN replaces (the first of equal maxima, the last NaN),
  the padding never; the CPU's initial index for a window nothing rises above
  (its channels-last kernel's leaves out the T term); outputs in the input's
  memory format. ``_adaptive_avg_pool3d`` (+ backward; separable window sums
  in float32 for the half types, where the CPU rounds in them) and
  ``adaptive_max_pool3d`` (+ backward; the same first-max / last-NaN choice).
"""
import math

import torch
import torch.utils._pytree as pytree
from torch._decomp import decomposition_table
from torch._prims_common import suggest_memory_format

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
    # the statistics take the parameters' dtype (float32 ones with a half input: float32), as the CPU's
    p = next((t for t in (weight, running_mean) if t is not None), None)
    st = p.dtype if p is not None and p.dtype.is_floating_point else x.dtype
    return y, save_mean.to(st), save_invstd.to(st)


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


def _out(fn, *names):
    """The out= form of a functional implementation: its results resized into and copied to the out
    tensors (keyword names: out, or the overload's own)."""
    names = names or ("out",)

    def run(*args, **kw):
        outs = [kw.pop(n) for n in names]
        r = fn(*args, **kw)
        for o, v in zip(outs, r if len(names) > 1 else (r,)):
            o.resize_(v.shape)
            o.copy_(v)
        return tuple(outs) if len(names) > 1 else outs[0]
    return run


def _no_overlap(out, *inputs):
    """PyTorch's memory-overlap checks of an out tensor (assert_no_internal_overlap / assert_no_overlap)."""
    def span(t):
        return t.data_ptr(), t.data_ptr() + t.element_size() * sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    if any(n > 1 and s == 0 for n, s in zip(out.shape, out.stride())):
        raise RuntimeError("unsupported operation: more than one element of the written-to tensor refers to a single "
                           "memory location. Please clone() the tensor before performing the operation.")
    (a, b) = span(out)
    for t in inputs:
        c, d = span(t)
        if out.numel() and t.numel() and out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() \
                and a <= d and c <= b:
            raise RuntimeError("unsupported operation: some elements of the input tensor and the written-to tensor "
                               "refer to a single memory location. Please clone() the tensor before performing the "
                               "operation.")


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


# Pade (13, 13) coefficients and the 1-norm up to which it is accurate to float64's rounding
# (Higham, "The scaling and squaring method for the matrix exponential revisited", 2005, table 2.3).
_PADE13 = (64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0, 129060195264000.0,
           10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0, 40840800.0, 960960.0, 16380.0, 182.0, 1.0)
_THETA13 = 5.371920351148152


def _matrix_exp(a):
    """linalg.matrix_exp by scaling and squaring with Higham's Pade (13, 13) approximant, in float64 on the
    tpu (matmuls and one linalg.solve) whatever the input's float dtype, rounded once at the end. PyTorch's
    own kernel cannot serve this device: it builds its polynomial coefficients on the CPU for every device
    but CUDA's. The number of squarings (the largest of the batch) is read back to the host, as CUDA's
    kernel reads its norms. Autograd uses PyTorch's formula, which calls this on a 2n x 2n block matrix.
    float32 results are closer to float64's than the CPU's (OpInfo's samples: 1e-9 against 3e-4), and in
    bfloat16 the CPU's kernel returns NaN for OpInfo's samples (exponentials near 9e4), this one the value."""
    if a.dim() < 2:
        raise RuntimeError("linalg.matrix_exp: The input tensor A must have at least 2 dimensions.")
    if a.shape[-1] != a.shape[-2]:
        raise RuntimeError(f"linalg.matrix_exp: A must be batches of square matrices, but they are "
                           f"{a.shape[-2]} by {a.shape[-1]} matrices")
    if not a.is_floating_point():
        raise RuntimeError(f"linalg.matrix_exp: Expected a floating point or complex tensor as input. "
                           f"Got {_dtype_name(a.dtype)}")
    n = a.shape[-1]
    if a.numel() == 0:
        return a.clone()
    if n == 1:
        return a.exp()
    x = a.to(torch.float64)
    norm = float(x.detach().abs().sum(-2).amax(-1).max().item())
    s = max(0, math.ceil(math.log2(norm / _THETA13))) if math.isfinite(norm) and norm > 0 else 0
    x = x / (2.0 ** s)
    b = _PADE13
    eye = torch.eye(n, dtype=x.dtype, device=x.device)
    x2 = x @ x
    x4 = x2 @ x2
    x6 = x4 @ x2
    u = x @ (x6 @ (b[13] * x6 + b[11] * x4 + b[9] * x2) + b[7] * x6 + b[5] * x4 + b[3] * x2 + b[1] * eye)
    v = x6 @ (b[12] * x6 + b[10] * x4 + b[8] * x2) + b[6] * x6 + b[4] * x4 + b[2] * x2 + b[0] * eye
    r = torch.linalg.solve(v - u, v + u)
    for _ in range(s):
        r = r @ r
    return r.to(a.dtype).contiguous()   # solve's result is column-major; the CPU returns row-major


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
    """sgn: the sign of a real tensor; z / |z| of a complex one (0 at 0), from native complex division."""
    if x.is_complex():
        a = torch.abs(x)
        nz = a != 0            # 0 at 0, and so is its gradient there (the CPU's sgn_backward)
        return x / torch.where(nz, a, torch.ones_like(a)) * nz.to(a.dtype)
    return torch.sign(x)


def _sgn_out(x, *, out):
    if x.is_complex():
        return _out(_sgn)(x, out=out)
    return torch.sign(x, out=out)


def _polar(abs, angle):
    """polar: abs*cos(angle) + i*abs*sin(angle), as the CPU's kernel computes it."""
    if abs.dtype != angle.dtype:
        raise RuntimeError(f"Expected object of scalar type {_dtype_name(abs.dtype)} but got scalar type "
                           f"{_dtype_name(angle.dtype)} for second argument")
    return torch.complex(abs * torch.cos(angle), abs * torch.sin(angle))


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




def _uniform(shape, device, generator, dtype=torch.float32):
    """U uniform in [0, 1) from the tpu generator, drawn in float32 for the half types."""
    return torch.rand(shape, device=device, generator=generator, dtype=torch.float32 if dtype in _LOW else dtype)


def _exponential(shape, device, generator, dtype=torch.float32):
    """Exp(1) draws from the tpu generator: -log(1 - U)."""
    return torch.neg(torch.log1p(torch.neg(_uniform(shape, device, generator, dtype))))


def _exponential_(self, lambd=1.0, *, generator=None):
    if not self.is_floating_point():
        raise RuntimeError("Exponential distribution is a continuous probability distribution. dtype must be a "
                           f"floating point but you specified {_dtype_name(self.dtype)}")
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd:g}")
    return self.copy_(_exponential(self.shape, self.device, generator, self.dtype) / lambd)


def _normal_check_std(std):
    """The CPU's std checks (CHECK_NORMAL_TENSOR_STD / CHECK_NORMAL_STD): a tensor's costs one host read."""
    if isinstance(std, torch.Tensor):
        if std.is_complex():
            raise RuntimeError("normal expects standard deviation to be non-complex")
        if std.numel() and not bool((std >= 0).all()):
            raise RuntimeError("normal expects all elements of std >= 0.0")
    elif not std >= 0.0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")


def _normal(mean, std=1.0, *, generator=None):
    """normal with a tensor mean and / or std, as the CPU's normal_out_impl: standard normal draws of the
    native Philox fill (the tpu generator) in the dtype of the tensor argument (mean's if both), scaled by std
    and shifted by mean in place."""
    _normal_check_std(std)
    like = mean if isinstance(mean, torch.Tensor) else std
    shape = torch.broadcast_shapes(mean.shape, std.shape) if isinstance(std, torch.Tensor) and \
        isinstance(mean, torch.Tensor) else like.shape
    out = torch.empty(shape, dtype=like.dtype, device=like.device)
    if not isinstance(std, torch.Tensor):
        return out.normal_(0.0, std, generator=generator).add_(mean)
    return out.normal_(0.0, 1.0, generator=generator).mul_(std).add_(mean)


def _addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    """beta self + alpha sum_b batch1[b] @ batch2[b], as the CPU's addbmm: one native addmm per batch into
    the result (so the half types round after each batch, as there), with its checks and words; beta == 0
    ignores self (NaN included)."""
    out = self.expand(batch1.size(1), batch2.size(2))  # checked first, as the CPU's expand_size
    if batch1.dim() != 3:
        raise RuntimeError("batch1 must be a 3D tensor")
    if batch2.dim() != 3:
        raise RuntimeError("batch2 must be a 3D tensor")
    b, n, k = batch1.shape
    if batch2.size(0) != b:
        raise RuntimeError(f"batch1 and batch2 must have same number of batches, got {b} and {batch2.size(0)}")
    if batch2.size(1) != k:
        raise RuntimeError(f"Incompatible matrix sizes for bmm ({n}x{k} and {batch2.size(1)}x{batch2.size(2)})")
    out = out.clone(memory_format=torch.contiguous_format)
    if b == 0:
        return out.zero_() if beta == 0 else out.mul_(beta)
    for i in range(b):
        out = torch.addmm(out, batch1[i], batch2[i], beta=beta if i == 0 else 1, alpha=alpha)
    return out


def _addbmm_(self, batch1, batch2, *, beta=1, alpha=1):
    return self.copy_(_addbmm(self, batch1, batch2, beta=beta, alpha=alpha))


_SEG_REDUCE = {"max": "amax", "amax": "amax", "min": "amin", "amin": "amin", "sum": "sum", "mean": "mean",
               "prod": "prod"}


def _segment_lengths(data, lengths, offsets, axis, who):
    """The segment lengths (lengths, or the differences of offsets) and axis, with the CPU's checks."""
    axis = axis + data.dim() if axis < 0 else axis
    if not 0 <= axis < max(data.dim(), 1):
        raise IndexError(f"Dimension out of range (expected to be in range of [{-data.dim()}, {data.dim() - 1}], "
                         f"but got {axis})")
    if lengths is None and offsets is None:
        raise RuntimeError(f"{who}(): Either lengths or offsets must be defined.")
    if offsets is not None:
        if axis != offsets.dim() - 1:
            raise RuntimeError(f"{who}(): Expected axis to be the last dimension of offsets but got {axis}.")
        return offsets.narrow(-1, 1, offsets.size(-1) - 1) - offsets.narrow(-1, 0, offsets.size(-1) - 1), axis
    if axis != lengths.dim() - 1:
        raise RuntimeError(f"{who}(): Expected axis to be the last dimension of lengths but got {axis}.")
    return lengths, axis


def _segment_ids(data, lengths, axis):
    """For every position along axis (per leading index), the segment it belongs to (S past the last
    one), broadcast over data's trailing dims: the index of a scatter / gather along axis."""
    ends = torch.cumsum(lengths, -1)
    pos = torch.arange(data.size(axis), device=data.device).expand(*lengths.shape[:-1], data.size(axis))
    seg = torch.searchsorted(ends.contiguous(), pos.contiguous(), right=True)
    return seg.reshape(*seg.shape, *([1] * (data.dim() - axis - 1))).expand(data.shape)


def _segment_init(reduce, initial, dtype):
    if initial is not None:
        return initial
    return {"amax": float("-inf"), "amin": float("inf"), "sum": 0, "mean": 0, "prod": 1}[reduce]


def _segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    """The CPU's segment_reduce from native ops: each segment's reduction, starting from `initial` (or the
    reduction's identity), one scatter_reduce along axis into the segments plus one slot past them; mean is
    (initial + sum) / length, NaN for an empty segment without initial. Two host reads for the checks of
    lengths the CPU makes when not unsafe."""
    if reduce not in _SEG_REDUCE:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    if indices is not None:
        raise RuntimeError("segment_reduce(): indices based reduction is not supported yet.")
    lengths, axis = _segment_lengths(data, lengths, offsets, axis, "segment_reduce")
    if offsets is None and not unsafe:
        if lengths.numel() and lengths.min().item() < 0:
            raise RuntimeError("lengths contains negative value!")
        if not bool((lengths.sum(-1) == data.size(axis)).all()):
            raise RuntimeError("segment_reduce(): Expected all rows of lengths along axis to sum to "
                               "data.size(lengths.dim()-1) when !unsafe.")
    red = _SEG_REDUCE[reduce]
    shape = list(data.shape)
    shape[axis] = lengths.size(-1) + 1
    out = torch.full(shape, _segment_init(red, initial, data.dtype), dtype=data.dtype, device=data.device)
    seg = _segment_ids(data, lengths, axis)
    out.scatter_reduce_(axis, seg, data, "sum" if red == "mean" else red, include_self=True)
    out = out.narrow(axis, 0, lengths.size(-1))
    if red == "mean":
        n = lengths.reshape(*lengths.shape, *([1] * (data.dim() - axis - 1))).expand(out.shape)
        empty = torch.full_like(out, float("nan")) if initial is None else out
        out = torch.where(n > 0, out / n.to(out.dtype), empty)
    return out.contiguous()


def _segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    """The CPU's gradient, element by element: sum the output's gradient, mean that over the length; max /
    min the gradient at every element equal to the result (or NaN), positive ones divided by their count
    when there are several; prod grad * output / x, or for x 0 or NaN the product of the others (with
    initial) times grad. Elements past the last segment get 0."""
    red = _SEG_REDUCE[reduce]
    lengths, axis = _segment_lengths(data, lengths, offsets, axis, "segment_reduce")
    seg = _segment_ids(data, lengths, axis)
    pad = [0, 0] * (data.dim() - axis - 1) + [0, 1]

    def at(t):  # t (per segment) read at every element's segment, 0 past the last one
        return torch.gather(torch.nn.functional.pad(t, pad), axis, seg)

    g, o = at(grad.to(data.dtype)), at(output)
    inside = seg < lengths.size(-1)
    zero = torch.zeros_like(data)
    if red == "sum":
        return torch.where(inside, g, zero)
    n = lengths.reshape(*lengths.shape, *([1] * (data.dim() - axis - 1))).expand(output.shape)
    if red == "mean":
        return torch.where(inside, g / at(n.to(data.dtype)), zero)
    if red in ("amax", "amin"):
        hit = inside & (torch.isnan(data) | (data == o))
        shape = list(data.shape)
        shape[axis] = lengths.size(-1) + 1
        cnt = torch.zeros(shape, dtype=data.dtype, device=data.device).scatter_add_(axis, seg, hit.to(data.dtype))
        cnt = torch.gather(cnt, axis, seg)
        gi = torch.where(hit, g, zero)
        return torch.where((cnt >= 2) & (gi > 0), gi / cnt, gi)
    # prod: the product of the others for an x that is 0 or NaN (counted apart so that it divides nothing)
    odd = inside & ((data == 0) | torch.isnan(data))
    shape = list(data.shape)
    shape[axis] = lengths.size(-1) + 1
    ones = torch.ones(shape, dtype=data.dtype, device=data.device)
    rest = ones.scatter_reduce(axis, seg, torch.where(odd, torch.ones_like(data), data), "prod")
    zeros = torch.zeros(shape, dtype=data.dtype, device=data.device).scatter_add(axis, seg, (data == 0).to(data.dtype))
    nans = torch.zeros(shape, dtype=data.dtype, device=data.device).scatter_add(axis, seg, torch.isnan(data).to(data.dtype))
    rest, zeros, nans = (torch.gather(t, axis, seg) for t in (rest, zeros, nans))
    zeros = zeros - (data == 0).to(data.dtype)
    nans = nans - torch.isnan(data).to(data.dtype)
    init = 1.0 if initial is None else float(initial)
    excl = torch.where(nans > 0, float("nan"), torch.where(zeros > 0, rest * 0, rest * init))
    return torch.where(odd, g * excl, torch.where(inside, g * o / data, zero))


def _rrelu_with_noise(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    """Evaluation: leaky_relu with the mean slope. Training: each x <= 0 times a slope drawn uniform in
    [lower, upper] by the tpu generator, kept in noise (1 elsewhere) for the backward."""
    if lower > upper:
        raise RuntimeError("Lower bound should be less than or equal to the upper bound")
    if noise.shape != x.shape:
        raise RuntimeError(f"noise tensor shape must match self tensor shape. Got self.shape = {list(x.shape)} "
                           f"noise.shape = {list(noise.shape)}")
    if not training:
        return torch.nn.functional.leaky_relu(x, (lower + upper) / 2)
    r = torch.where(x <= 0, _uniform(x.shape, x.device, generator, x.dtype) * (upper - lower) + lower, 1)
    noise.copy_(r)
    return (x * r).to(x.dtype)


def _rrelu_with_noise_(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    return x.copy_(_rrelu_with_noise(x, noise, lower, upper, training, generator))


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


_LOW = (torch.bfloat16, torch.float16)


def _acc(x):
    """x in its accumulation type: float32 for the half types (as the CPU kernels compute them)."""
    return x.float() if x.dtype in _LOW else x


def _check_flat_index(op, self, index, empty):
    """take / put_'s checks of index into self's flattened elements, in the CPU's words (one host read)."""
    if index.dtype != torch.int64:
        raise RuntimeError(f"{op}(): Expected a long tensor for index, but got {_dtype_name(index.dtype)}")
    n = self.numel()
    if index.numel() and n == 0:
        raise IndexError(f"{op}(): {empty}")
    bad = torch.logical_or(index < -n, index >= n)
    if index.numel() and bad.any().item():
        raise IndexError(f"out of range: tried to access index {index[bad][0].item()} on a tensor of {n} elements.")


def _take(self, index):
    _check_flat_index("take", self, index, "tried to take from an empty tensor")
    return self.reshape(-1)[index]


def _take_out(self, index, *, out):
    _no_overlap(out, self, index)
    return _out(_take)(self, index, out=out)


def _put_(self, index, source, accumulate=False):
    if index.numel() != source.numel():
        raise IndexError("put_(): Expected source and index to have the same number of elements, but got "
                         f"source.numel() = {source.numel()}, index.numel() = {index.numel()}")
    if self.dtype != source.dtype:
        raise RuntimeError("put_(): self and source expected to have the same dtype, but got self.dtype = "
                           f"{_dtype_name(self.dtype)} and source.dtype = {_dtype_name(source.dtype)}")
    _check_flat_index("put_", self, index, "Tried to put elements into an empty tensor")
    if index.numel():
        flat = self.reshape(-1).index_put((index.reshape(-1),), source.reshape(-1), accumulate)
        self.copy_(flat.view(self.shape))
    return self


def _float(x):
    """x, or x in the default float dtype when it holds integers (as a unary float op promotes)."""
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _logit(x, eps=None):
    """log(x / (1 - x)) with each op rounded in x's dtype, as the CPU kernel computes."""
    x = _float(x)
    if eps is not None and eps >= 0:
        x = x.clamp(eps, 1 - eps)
    return torch.log(x / (1 - x))


def _logit_backward(dy, x, eps=None):
    x = _float(x)
    if eps is None or eps < 0:
        return torch.where(torch.logical_or(x < 0, x > 1), float("nan"), dy / (x * (1 - x)))
    # (the bounds in x's dtype, as the CPU compares)
    return torch.where(torch.logical_or(x < x.new_tensor(eps), x > x.new_tensor(1 - eps)), 0.0, dy / (x * (1 - x)))


def _shift(a, b, left):
    """a << b (a * 2**b, wrapping) or a >> b (a // 2**b) in the promoted integer dtype; a shift past the
    width (or negative) gives 0, or the sign for a signed right shift, as the CPU kernel does."""
    dt = torch.result_type(a, b)
    if dt.is_floating_point or dt.is_complex or dt == torch.bool:
        raise NotImplementedError(f'"{"l" if left else "r"}shift_cpu" not implemented for \'{_dtype_name(dt)}\'')
    dev = (a if isinstance(a, torch.Tensor) else b).device
    a, b = (v.to(dt) if isinstance(v, torch.Tensor) else torch.tensor(v, device=dev).to(dt) for v in (a, b))
    bits, signed = torch.iinfo(dt).bits, torch.iinfo(dt).min < 0
    ok = torch.logical_and(b >= 0, b < bits)
    pows = [1 << i for i in range(min(bits, 63))] + [-(1 << 63)] * (bits == 64)   # 2**i, wrapped to dt
    pw = torch.tensor(pows, device=dev).to(dt)[b.clamp(0, bits - 1).long()]
    if left:
        return torch.where(ok, a * pw, 0)
    if signed:   # (2**(bits-1) is negative in dtype: a shift by bits-1 is the sign, too)
        return torch.where(torch.logical_and(ok, b < bits - 1), torch.floor_divide(a, pw), (a < 0).to(dt).neg())
    return torch.where(ok, torch.floor_divide(a, pw), 0)


def _lshift(a, b):
    return _shift(a, b, True)


def _rshift(a, b):
    return _shift(a, b, False)


def _inplace(fn):
    """The in-place form of a binary functional implementation (its result cast to self's dtype, if it can be)."""
    def run(self, other, **kw):
        rt = torch.result_type(self, other)
        if not torch.can_cast(rt, self.dtype):
            raise RuntimeError(f"result type {_dtype_name(rt)} can't be cast to the desired output type "
                               f"{_dtype_name(self.dtype)}")
        return self.copy_(fn(self, other, **kw))
    return run


_BITS = {torch.float32: torch.int32, torch.float64: torch.int64,   # the same-width integer of each float dtype
         torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _frexp(x):
    """The exponent and mantissa fields read from the bits (subnormals scaled up first, exactly); half types
    through float32, which holds them exactly."""
    if not x.is_floating_point():
        raise RuntimeError("torch.frexp() only supports floating-point dtypes")
    f = x.float() if x.dtype in _LOW else x
    mb, emax = (23, 0xff) if f.dtype == torch.float32 else (52, 0x7ff)
    bias = emax // 2 - 1
    sub = f.abs() < torch.finfo(f.dtype).tiny
    b = torch.where(sub, f * 2.0 ** (mb + 2), f).view(_BITS[f.dtype])
    e = torch.floor_divide(torch.bitwise_and(b, emax << mb), 1 << mb) - bias - sub.to(b.dtype) * (mb + 2)
    m = torch.bitwise_or(torch.bitwise_and(b, ~(emax << mb)), bias << mb).view(f.dtype)
    special = torch.logical_or(f == 0, torch.logical_not(torch.isfinite(f)))
    return torch.where(special, f, m).to(x.dtype), torch.where(special, 0, e).to(torch.int32)


def _nextafter(x, y):
    """The neighbour of x toward y: x's bits stepped by one (away from zero if y is), exactly as the C library."""
    dt = torch.result_type(x, y)
    if not dt.is_floating_point:
        raise NotImplementedError(f'"nextafter_cpu" not implemented for \'{_dtype_name(dt)}\'')
    x, y = x.to(dt), y.to(dt)
    b = x.view(_BITS[dt])
    r = (b + torch.eq(x < y, x > 0).to(b.dtype) * 2 - 1).view(dt)
    r = torch.where(x == 0, torch.copysign(torch.ones((), dtype=b.dtype, device=x.device).view(dt), y), r)
    return torch.where(x == y, y, torch.where(torch.logical_or(torch.isnan(x), torch.isnan(y)), x + y, r))


def _heaviside(x, values):
    if x.is_complex() or values.is_complex():
        raise RuntimeError("heaviside is not yet implemented for complex tensors.")
    if x.dtype != values.dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")
    return decomposition_table[_aten.heaviside.default](x, values)


def _linalg_cross(a, b, *, dim=-1):
    """Each component a_j b_k - a_k b_j, rounded per op in the dtype, as the CPU kernel computes."""
    if a.dim() != b.dim():
        raise RuntimeError("linalg.cross: inputs must have the same number of dimensions.")
    if a.size(dim) != 3 or b.size(dim) != 3:
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got {a.size(dim)} and "
                           f"{b.size(dim)}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"expected scalar type {_dtype_name(a.dtype)} but found {_dtype_name(b.dtype)}")
    a, b = torch.broadcast_tensors(a, b)
    j, k = torch.tensor([1, 2, 0], device=a.device), torch.tensor([2, 0, 1], device=a.device)
    return a.index_select(dim, j) * b.index_select(dim, k) - a.index_select(dim, k) * b.index_select(dim, j)


def _pnorm(d, p):
    """The p-distance of |differences| d over the last dim, reduced as the CPU's kernels map and reduce."""
    if p == 0:
        return d.ceil().clamp(max=1).sum(-1)
    if p == 1:
        return d.sum(-1)
    if p == 2:
        return (d * d).sum(-1).sqrt()
    if p == float("inf"):
        return d.amax(-1) if d.size(-1) else d.sum(-1)
    return d.pow(p).sum(-1).pow(1 / p)


def _pnorm_grad(diff, g, dist, p):
    """d(dist)/d(diff) times g, with the CPU kernels' value where a distance (or, for p < 1, a difference) is 0."""
    if p == 0:
        return torch.zeros_like(diff)
    s = torch.sign(diff)
    if p == 1:
        return g * s
    if p == float("inf"):
        return g * s * (1 - (diff.abs() - dist).abs().ceil().clamp(max=1))
    zero = dist == 0
    if p < 1:
        zero = torch.logical_or(zero, diff == 0)
    if p < 2:
        r = s * diff.abs().pow(p - 1) * g / dist.pow(p - 1)
    elif p == 2:
        r = g * diff / dist
    else:
        r = diff * diff.abs().pow(p - 2) * g / dist.pow(p - 1)
    return torch.where(zero, 0, r)


def _float_kernel(op, *xs, types=(torch.float32, torch.float64)):
    """A CPU kernel dispatched for float and double only (or types) raises this for any other dtype."""
    for x in xs:
        if x.dtype not in types:
            raise NotImplementedError(f'"{op}" not implemented for \'{_dtype_name(x.dtype)}\'')


def _cdist_forward(x1, x2, p, compute_mode):
    for name, x in (("X1", x1), ("X2", x2)):
        if x.dim() < 2:
            raise RuntimeError(f"cdist only supports at least 2D tensors, {name} got: {x.dim()}D")
    if x1.size(-1) != x2.size(-1):
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.size(-1)} X2: {x2.size(-1)}")
    for name, x in (("X1", x1), ("X2", x2)):
        if not x.is_floating_point():
            raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: {_dtype_name(x.dtype)}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")
    if compute_mode is not None and compute_mode not in (0, 1, 2):
        raise RuntimeError(f"possible modes: 0, 1, 2, but was: {compute_mode}")
    if x1.dtype != x2.dtype:
        raise RuntimeError(f"expected scalar type {_dtype_name(x1.dtype)} but found {_dtype_name(x2.dtype)}")
    _float_kernel("cdist", x1)
    mode = compute_mode or 0
    if p == 2 and (mode == 1 or (mode == 0 and (x1.size(-2) > 25 or x2.size(-2) > 25))) and x1.size(-1):
        return torch._euclidean_dist(x1, x2)   # (the CPU's matrix-product form)
    return _pnorm((x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs(), p)


def _cdist_backward(grad, x1, x2, p, cdist):
    """The gradient for x1 at the broadcast batch shape (autograd sums it back), as the CPU kernel returns it."""
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    return _pnorm_grad(diff, grad.unsqueeze(-1), cdist.unsqueeze(-1), p).sum(-2)


def _pdist_pairs(x):
    i, j = torch.triu_indices(x.size(0), x.size(0), 1, device=x.device)
    return i, j, x.index_select(0, i) - x.index_select(0, j)


def _pdist_forward(x, p=2):
    if not x.is_contiguous():
        raise RuntimeError("_pdist_forward requires contiguous input")
    _float_kernel("pdist", x)
    return _pnorm(_pdist_pairs(x)[2].abs(), p)


def _pdist_backward(grad, x, p, pdist):
    i, j, diff = _pdist_pairs(x)
    g = _pnorm_grad(diff, grad.unsqueeze(-1), pdist.unsqueeze(-1), p)
    return torch.zeros_like(x).index_add_(0, i, g).index_add_(0, j, g, alpha=-1)


def _margin_shapes(x):
    """(frames, classes) of a margin loss's input: a non-empty vector or matrix (or a scalar), as the CPU checks."""
    if not ((x.dim() == 2 and x.size(1)) or (x.dim() == 1 and x.size(0)) or x.dim() == 0):
        raise RuntimeError("Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
                           f"{list(x.shape)}")
    return (x.size(0) if x.dim() == 2 else 1), (x.size(-1) if x.dim() else 1)


def _long_target(target):
    if target.dtype != torch.int64:
        raise RuntimeError(f"expected scalar type Long but found {_dtype_name(target.dtype)}")


def _multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=1):
    nframe, dim = _margin_shapes(x)
    if target.dim() > 1 or target.numel() != nframe:
        raise RuntimeError("multi_margin_loss: target tensor should be 1-D with size equal to the number of input "
                           f"samples (batch size). Expected target size [{nframe}], but got {list(target.shape)}. "
                           f"Input has shape {list(x.shape)}.")
    if weight is not None and (weight.dim() > 1 or weight.numel() != dim):
        raise RuntimeError(f"inconsistent weight size, expected {dim} but got {list(weight.shape)}")
    if p not in (1, 2):
        raise RuntimeError("only p == 1 and p == 2 supported")
    _float_kernel("multi_margin_loss_cpu_kernel", x)
    _long_target(target)
    if weight is not None and weight.dtype != x.dtype:
        raise RuntimeError(f"expected scalar type {_dtype_name(x.dtype)} but found {_dtype_name(weight.dtype)}")
    if target.numel() and torch.logical_or(target < 0, target >= dim).any().item():
        raise RuntimeError("target out of range")
    loss = decomposition_table[_aten.multi_margin_loss.default](x, target, p, margin, weight, reduction)
    return loss.reshape(target.shape) if reduction == 0 else loss


def _margin_grad(x, grad_output, reduction, h):
    """A margin loss's input gradient from its per-element terms h (frames x classes), as the CPU kernel scales it."""
    nframe, dim = h.shape
    h = h / (nframe * dim if reduction == 1 else dim)
    return (h * (grad_output.reshape(-1, 1) if reduction == 0 else grad_output)).reshape(x.shape)


def _multi_margin_loss_backward(grad_output, x, target, p, margin, weight=None, reduction=1):
    """Each class d != target with z = margin - x[target] + x[d] > 0 gets dz (1, or 2z for p = 2, times the target's
    weight); the target class gets minus their sum."""
    x2, t = x.reshape(-1, _margin_shapes(x)[1]), target.reshape(-1, 1)
    z = margin - x2.gather(1, t) + x2
    h = torch.ones_like(z) if p == 1 else 2 * z
    if weight is not None:
        h = h * weight.reshape(-1)[t]
    on = torch.logical_and(z > 0, torch.arange(z.size(1), device=x.device) != t)
    h = torch.where(on, h, 0)
    return _margin_grad(x, grad_output, reduction, h.scatter(1, t, -h.sum(1, keepdim=True)))


def _multilabel_terms(x, target):
    """Per frame, label slot k (those before the first -1) and class d: z = 1 - x[label k] + x[d], the mask of the
    terms that count (a valid slot, d not a label), the slots' labels and the frame's is-a-label mask."""
    dim = _margin_shapes(x)[1]
    x2, t2 = x.reshape(-1, dim), target.reshape(-1, dim)
    idx = torch.arange(dim, device=x.device)
    valid = idx < torch.where(t2 == -1, idx, dim).amin(-1, keepdim=True)
    tk = torch.where(valid, t2, 0)
    is_t = torch.zeros_like(x2).scatter_add(1, tk, valid.to(x.dtype)) > 0
    z = 1 - x2.gather(1, tk).unsqueeze(-1) + x2.unsqueeze(1)
    return z, torch.logical_and(valid.unsqueeze(-1), torch.logical_not(is_t).unsqueeze(1)), tk, is_t


def _multilabel_margin_loss_forward(x, target, reduction):
    """(PyTorch's decomposition counts the slots after the first -1 too.)"""
    nframe, dim = _margin_shapes(x)
    if (target.dim() > 1 or target.numel() != dim) if x.dim() <= 1 else target.shape != x.shape:
        raise RuntimeError(f"inconsistent target size: {list(target.shape)} for input of size: {list(x.shape)}")
    _float_kernel("multilabel_margin_loss_forward_out_frame", x)
    _long_target(target)
    if target.numel():
        lo, hi = torch.stack([target.min(), target.max()]).tolist()   # one host read
        if lo < -1 or hi >= dim:
            raise RuntimeError("argument #2 'target' is out of range")
    z, on, _, is_t = _multilabel_terms(x, target)
    loss = torch.where(on, z.clamp_min(0), 0).sum((1, 2)) / dim
    loss = loss.mean() if reduction == 1 else loss.sum() if reduction == 2 else loss.reshape(x.shape[:-1])
    return loss, is_t.to(x.dtype).reshape(target.shape)


def _multilabel_margin_loss_backward(grad_output, x, target, reduction, is_target):
    """Each counted term with z > 0: +1 to its class d, -1 to its label."""
    z, on, tk, _ = _multilabel_terms(x, target)
    m = torch.logical_and(on, z > 0).to(x.dtype)
    return _margin_grad(x, grad_output, reduction, m.sum(1) - torch.zeros_like(m[:, 0]).scatter_add(1, tk, m.sum(2)))


def _weight_norm_interface(v, g, dim=0):
    """w = v * (g / ||v||) over all dims but dim, in the accumulation type; the norms stay in it, as the CPU's."""
    if g.dtype != v.dtype:
        raise RuntimeError(f"expected scalar type {_dtype_name(v.dtype)} but found {_dtype_name(g.dtype)}")
    ds = [d for d in range(v.dim()) if d != dim]   # (none for a vector: each element its own norm)
    norm = torch.linalg.vector_norm(_acc(v), 2, ds, keepdim=True) if ds else _acc(v).abs()
    return (_acc(v) * (_acc(g) / norm)).to(v.dtype), norm


def _weight_norm_interface_backward(grad_w, v, g, norms, dim):
    """grad_g = sum(grad_w * v) / norm; grad_v = (g / norm) * (grad_w - v * grad_g / norm) (the CPU kernel's)."""
    gw, vf = _acc(grad_w), _acc(v)
    ds = [d for d in range(v.dim()) if d != dim]
    grad_g = ((gw * vf).sum(ds, keepdim=True) if ds else gw * vf) / norms
    a = _acc(g) / norms
    return (a * gw - a * grad_g / norms * vf).to(v.dtype), grad_g.to(g.dtype)


def _adaptive_max_pool2d(x, output_size):
    """Each output's window [floor(i H / oh), ceil((i + 1) H / oh)) gathered (short windows padded with their last
    row / column, which leaves the max and its first index as they are), then one max over it."""
    if len(output_size) != 2:
        raise RuntimeError("adaptive_max_pool2d(): internal error: output_size.size() must be 2")
    if x.dim() not in (3, 4):
        raise RuntimeError(f"adaptive_max_pool2d(): Expected 3D or 4D tensor, but got: {list(x.shape)}")
    for i in range(1, x.dim()):
        if x.size(i) <= 0:
            raise RuntimeError("adaptive_max_pool2d(): Expected input to have non-zero size for non-batch "
                               f"dimensions, but input has sizes {list(x.shape)} with dimension {i} being empty")
    (H, W), (oh, ow) = x.shape[-2:], output_size
    if oh < 0 or ow < 0:
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(oh, ow)}: {[*x.shape[:-2], oh, ow]}")
    _float_kernel("adaptive_max_pool2d", x, types=(torch.float32, torch.float64, *_LOW))

    def windows(n, o):
        st = [i * n // o for i in range(o)]
        en = [-(-(i + 1) * n // o) for i in range(o)]
        k = max((e - b for b, e in zip(st, en)), default=1)
        return torch.tensor([[min(b + j, e - 1) for j in range(k)] for b, e in zip(st, en)],
                            device=x.device, dtype=torch.int64).reshape(o, k)
    ih, iw = windows(H, oh), windows(W, ow)
    flat = (ih[:, None, :, None] * W + iw[None, :, None, :]).flatten(-2)   # (oh, ow, kh * kw) input positions
    val, k = x.flatten(-2)[..., flat].max(-1)
    idx = flat.expand(*k.shape, flat.size(-1)).gather(-1, k.unsqueeze(-1)).squeeze(-1)
    return _channels_last_like(x, val), _channels_last_like(x, idx)


def _adaptive_max_pool2d_backward(grad, x, indices):
    """Each output's gradient added at its max's input position."""
    g = torch.zeros_like(x, memory_format=torch.contiguous_format).flatten(-2)
    return _channels_last_like(x, g.scatter_add(-1, indices.flatten(-2), grad.flatten(-2)).view(x.shape))


def _type_check(arg, t, names):
    if _dtype_name(t.dtype) not in names:
        raise RuntimeError(f"Expected tensor for argument #1 '{arg}' to have one of the following scalar types: "
                           f"{', '.join(names)}; but got torch.{_dtype_name(t.dtype)}Tensor instead (while checking "
                           "arguments for embedding_bag)")


def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """Bags padded to the longest (its length read back with the checks of the offsets and indices, in one host
    read): the rows are gathered by torch.embedding (whose backward skips padding_idx), then summed, averaged or
    maxed over each bag's valid slots; autograd differentiates through it (the max's gradient goes to the first
    maximal row, as the CPU's)."""
    _type_check("indices", indices, ("Long", "Int"))
    _type_check("offsets", offsets, ("Long", "Int"))
    _type_check("weight", weight, ("Half", "BFloat16", "Float", "Double"))
    if indices.dim() != 1:
        raise RuntimeError(f"input has to be a 1D Tensor, but got Tensor of dimension {indices.dim()}")
    if offsets.dim() != 1:
        raise RuntimeError(f"offsets has to be a 1D Tensor, but got Tensor of dimension {offsets.dim()}")
    if mode not in (0, 1, 2):
        raise RuntimeError("`mode` must be sum, mean, or max.")
    psw = per_sample_weights
    if psw is not None:
        if mode != 0:
            raise RuntimeError("embedding_bag: per_sample_weights only supported with mode='sum'")
        if psw.dtype != weight.dtype:
            raise RuntimeError("Expected tensor for argument #1 'weight' to have the same type as tensor for argument "
                               f"#1 'per_sample_weights'; but type torch.{_dtype_name(weight.dtype)}Tensor does not "
                               f"equal torch.{_dtype_name(psw.dtype)}Tensor (while checking arguments for "
                               "embedding_bag)")
        if psw.dim() != 1 or psw.numel() != indices.numel():
            raise RuntimeError(f"expected per_sample_weights to be a 1D tensor with {indices.numel()} elements, "
                               f"got {list(psw.shape)}")
    n, dev = indices.numel(), weight.device
    starts = offsets[:-1] if include_last_offset else offsets
    nbag = starts.numel()
    ends = offsets[1:] if include_last_offset else torch.cat([offsets[1:], offsets.new_full((1,), n)])[:nbag]
    size = ends - starts
    ranged = [offsets[0], offsets[-1], size.max()] if offsets.numel() and nbag else []
    ranged += [indices.min(), indices.max()] if n else []
    vals = torch.stack(ranged).to(torch.int64).tolist() if ranged else []   # one host read
    if nbag and vals[0] != 0:
        raise RuntimeError("offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
                           f"position 0. However, got {vals[0]}\n[ torch.LongTensor{{}} ]")
    if nbag and vals[1] > n:
        raise RuntimeError(f"offsets[-1] can not be greater than input's length {n} but got offsets[-1] of {vals[1]}")
    if n and (vals[-2] < 0 or vals[-1] >= weight.size(0)):
        bad = indices[torch.logical_or(indices < 0, indices >= weight.size(0))][0].item()
        raise RuntimeError(f"embedding_bag: Expected idx >= 0 && idx < num_embeddings but found idx to be {bad}")
    slots = torch.arange(vals[2] if nbag else 0, device=dev)
    valid = slots < size.unsqueeze(1)
    pos = torch.where(valid, starts.unsqueeze(1) + slots, 0)
    ids = indices[pos]
    if padding_idx >= 0:
        valid = torch.logical_and(valid, ids != padding_idx)
    rows = torch.embedding(weight, indices, padding_idx)
    if scale_grad_by_freq and rows.requires_grad:   # (each row's gradient over its index's count)
        freq = torch.bincount(indices, minlength=weight.size(0))[indices].unsqueeze(-1).to(rows.dtype)
        rows.register_hook(lambda g: g / freq)
    rows = rows[pos]
    if psw is not None:
        rows = _acc(rows) * _acc(psw[pos]).unsqueeze(-1)
    count = valid.sum(1)
    keep = valid.unsqueeze(-1)
    offset2bag = torch.bucketize(torch.arange(n, device=dev), starts, right=True) - 1
    if mode == 2:
        out, k = torch.where(keep, rows, float("-inf")).max(1) if slots.numel() else (rows.sum(1), None)
        nonempty = (count > 0).unsqueeze(-1)
        out = torch.where(nonempty, out, 0)
        maxi = torch.where(nonempty, ids.gather(1, k), 0) if k is not None else out.to(torch.int64)
        return out, offset2bag, count, maxi
    # (summed in float32 for the half types; the CPU's fbgemm path, taken without padding_idx, rounds that to
    # bfloat16 with ties away from zero; the mean's gradient scaled by the reciprocal of the count in the dtype)
    out = torch.where(keep, _acc(rows), 0).sum(1)
    if weight.dtype == torch.bfloat16 and padding_idx < 0 and weight.stride(-1) == 1:
        up = torch.bitwise_and(out.detach().view(torch.int32) + 0x8000, ~0xffff).view(torch.float32)
        out = _with_grad_of(out.to(weight.dtype), up.to(weight.dtype))
    out = out.to(weight.dtype)
    if mode == 1:
        c = count.clamp(min=1).unsqueeze(-1).to(out.dtype)
        out = _with_grad_of(out * torch.reciprocal(c), out.detach() / c)
    return out, offset2bag, count, count.new_zeros(nbag)


def _with_grad_of(x, v):
    """v's values with x's gradient (v within a few ulps of x, so that x + (v - x) is exactly v)."""
    return torch.where(v == x, x, x + (v - x).detach())


def _nonzero_static(x, *, size, fill_value=-1):
    """nonzero's first size rows, padded with fill_value rows."""
    if size < 0:
        raise RuntimeError("nonzero_static: 'size' must be an non-negative integer")
    nz = torch.nonzero(x)[:size]
    return torch.cat([nz, nz.new_full((size - nz.size(0), nz.size(1)), fill_value)])


def _wrap_dim(dim, nd):
    """dim wrapped into [0, max(nd, 1)) as PyTorch wraps a reduction dim (a 0-d tensor takes 0 or -1)."""
    n = max(nd, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim + n if dim < 0 else dim


def _zero_numel_check(x, dim, fn):
    if x.dim() and x.size(dim) == 0:
        raise IndexError(f"{fn}: Expected reduction dim {dim} to have non-zero size.")


def _no_bool(x, kernel):
    if x.dtype == torch.bool:
        raise NotImplementedError(f'"{kernel}" not implemented for \'Bool\'')


def _rows(x, dim):
    """x's slices along dim as the rows of a (slices, size) matrix (a 0-d x: one row of one)."""
    return x.reshape(1, 1) if x.dim() == 0 else x.movedim(dim, -1).reshape(-1, x.size(dim))


def _unrows(r, x, dim, keepdim):
    """A (slices,) result back in the reduced shape of x (keepdim keeps dim as a 1)."""
    if x.dim() == 0:
        return r.reshape(())
    shape = list(x.shape)
    shape[dim] = 1
    r = r.reshape(shape[:dim] + shape[dim + 1:] + [1]).movedim(-1, dim)
    return r if keepdim else r.squeeze(dim)


def _cmp_view(a):
    """The values compared: the half types in float32 (exactly), bool as uint8."""
    return a.float() if a.dtype in _LOW else a.to(torch.uint8) if a.dtype == torch.bool else a


def _gt_nan(x, y):
    """x > y, with NaN above every number (the order of the CPU's quick select)."""
    if not x.is_floating_point():
        return x > y
    return torch.logical_or(torch.logical_and(torch.isnan(x), torch.logical_not(torch.isnan(y))), x > y)


def _quick_select(a, k):
    """The columns the CPU's kthvalue selects: its quick select (quick_select_template: median of three, then
    a Hoare partition; NaN above every number) run on all rows (a: rows x n) at once, one partition pass of
    every row's range [L, R] per step. A pass's swaps are paired by rank: the m-th position from the left
    that stops the left scan (not below the pivot) with the m-th from the right that stops the right scan,
    while the first is left of the second; where the scans stop after it follows from the same ranks. The
    ranges' progress is read back once per pass. Returns the column of each row's k-th smallest (0-based),
    with the CPU's choice among equal values."""
    B, n = a.shape
    dev = a.device
    pos = torch.arange(n, device=dev).expand(B, n)
    ix = pos.clone()
    L = torch.zeros(B, 1, dtype=torch.int64, device=dev)
    R = torch.full((B, 1), n - 1, dtype=torch.int64, device=dev)
    top = torch.full((B, 2), n, dtype=torch.int64, device=dev)
    bot = torch.full((B, 2), -1, dtype=torch.int64, device=dev)

    def at(t, i):
        return t.gather(1, i.clamp(0, t.size(1) - 1))
    while B and n > 1 and bool((R > L).any().item()):
        three, two = R > L + 1, R == L + 1
        P = L + (R - L) // 2
        # median of three: the slots L, L + 1, R hold the columns at L, P, R once P and L + 1 are swapped
        s0, s1, s2 = L, P, R
        v0, v1, v2 = at(a, L), at(a, P), at(a, R)
        for (i, j) in ((1, 2), (0, 2), (1, 0)):
            vi, vj, si, sj = (v0, v1, v2)[i], (v0, v1, v2)[j], (s0, s1, s2)[i], (s0, s1, s2)[j]
            c = _gt_nan(vi, vj)
            vs, ss = [v0, v1, v2], [s0, s1, s2]
            vs[i], vs[j] = torch.where(c, vj, vi), torch.where(c, vi, vj)
            ss[i], ss[j] = torch.where(c, sj, si), torch.where(c, si, sj)
            (v0, v1, v2), (s0, s1, s2) = vs, ss
        c2 = torch.logical_and(two, _gt_nan(at(a, L), at(a, R)))   # two elements: ordered
        perm = torch.where(torch.logical_and(three, pos == P), L + 1, pos)
        perm = torch.where(pos == L, torch.where(three, s0, torch.where(c2, R, L)), perm)
        perm = torch.where(torch.logical_and(three, pos == L + 1), s1, perm)
        perm = torch.where(pos == R, torch.where(three, s2, torch.where(c2, L, R)), perm)
        a, ix = a.gather(1, perm), ix.gather(1, perm)
        # the partition around piv = a[L]
        inside = torch.logical_and(three, torch.logical_and(pos >= L + 1, pos <= R))
        I = torch.logical_and(torch.logical_and(inside, pos >= L + 2), torch.logical_not(_gt_nan(v0, a)))
        J = torch.logical_and(torch.logical_and(inside, pos < R), torch.logical_not(_gt_nan(a, v0)))
        rI = torch.cumsum(I, 1) - 1                     # rank from the left of each stop of the left scan
        cJ = torch.cumsum(J, 1)
        rJ = cJ[:, -1:] - cJ                            # stops of the right scan to the right of each column
        M = torch.logical_and(I, rJ > rI).sum(1, keepdim=True)   # the swaps
        Ip = torch.cat([top, top[:, :1].expand(B, n)], 1).scatter(1, torch.where(I, rI, n + 1), pos)
        Jp = torch.cat([bot, bot[:, :1].expand(B, n)], 1).scatter(1, torch.where(J, rJ, n + 1), pos)
        perm = torch.where(torch.logical_and(I, rI < M), at(Jp, rI), pos)
        perm = torch.where(torch.logical_and(J, rJ < M), at(Ip, rJ), perm)
        iM, jM = at(Ip, M), at(Jp, M)
        ip, jp = torch.where(M > 0, at(Ip, M - 1), L + 1), torch.where(M > 0, at(Jp, M - 1), R)
        meet = iM == jM                                 # both scans stop at one element equal to the pivot
        i = torch.minimum(torch.where(meet, at(Ip, M + 1), iM), jp)
        j = torch.maximum(torch.where(meet, at(Jp, M + 1), jM), ip)
        j = torch.where(three, j, L)
        sw = torch.where(pos == L, j, torch.where(pos == j, L, pos))   # the pivot to j
        perm = perm.gather(1, sw)
        a, ix = a.gather(1, perm), ix.gather(1, perm)
        L, R = (torch.where(torch.logical_and(three, j <= k), i, L),
                torch.where(three, torch.where(j >= k, j - 1, R), torch.where(two, L, R)))
    return ix[:, k]


def _kthvalue_check(x, k, dim=-1, keepdim=False):
    d = _wrap_dim(dim, x.dim())
    _zero_numel_check(x, d, "kthvalue()")
    if not 1 <= k <= (x.size(d) if x.dim() else 1):
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {d}")
    _no_bool(x, "kthvalue_cpu")
    return d


def _kthvalue(x, k, dim=-1, keepdim=False):
    d = _kthvalue_check(x, k, dim)
    rows = _rows(x, d)
    idx = _quick_select(_cmp_view(rows), k - 1).unsqueeze(1) if rows.numel() else rows.new_zeros(
        (rows.size(0), 1), dtype=torch.int64)
    return _unrows(rows.gather(1, idx), x, d, keepdim), _unrows(idx, x, d, keepdim)


def _values_indices_out(fn, op, check):
    def run(x, *args, values, indices):
        check(x, *args)
        if values.dtype != x.dtype:
            raise RuntimeError("output values must be of same type as input" if op == "kthvalue" else
                               f"Expected tensor for 'values' to have the same type as tensor for argument #2 "
                               f"'self'; but type torch.{_dtype_name(values.dtype)}Tensor does not equal "
                               f"torch.{_dtype_name(x.dtype)}Tensor (while checking arguments for {op})")
        if indices.dtype != torch.int64:
            raise RuntimeError("output indices must be of scalar type Long" if op == "kthvalue" else
                               "Expected tensor for argument #1 'indices' to have scalar type Long; but got "
                               f"torch.{_dtype_name(indices.dtype)}Tensor instead (while checking arguments for "
                               f"{op})")
        _no_overlap(values, x)
        _no_overlap(indices, x)
        return _out(fn, "values", "indices")(x, *args, values=values, indices=indices)
    return run


def _median_check(x, dim, kernel):
    d = _wrap_dim(dim, x.dim())
    _zero_numel_check(x, d, "median()")
    _no_bool(x, kernel)
    return d


def _nth_of_equals(n):
    """The column libstdc++'s nth_element leaves first among n equivalent elements (nanmedian's all-NaN slice):
    each introselect step swaps the middle to the front, then its partition swaps the pairs (1 + t, n - 1 - t);
    the front traced back through the steps."""
    steps, last, depth = [], n, 2 * (n.bit_length() - 1)
    while last > 3 and depth:
        depth -= 1
        steps.append(last)
        last = 1 + (last - 1) // 2
    p = 0
    for last in reversed(steps):
        t = (last - 1) // 2
        if 1 <= p <= t or last - t <= p <= last - 1:
            p = last - p
        p = last // 2 if p == 0 else 0 if p == last // 2 else p
    return p


def _median_dim(x, dim, keepdim=False, ignore_nan=False):
    """The CPU's nth_element orders by (value, index): the stable sort's middle element. median returns a row's
    first NaN if it has one; nanmedian the middle of the numbers (of an all-NaN slice, the NaN nth_element
    leaves first)."""
    d = _median_check(x, dim, "median_out")
    rows = _rows(x, d)
    n = rows.size(1)
    if not rows.numel():
        e = rows.new_zeros((0, 1), dtype=torch.int64)
        return _unrows(rows[:, :1], x, d, keepdim), _unrows(e, x, d, keepdim)
    s, p = torch.sort(rows, dim=1, stable=True)   # (NaN last, in order)
    if rows.is_floating_point():
        nans = torch.isnan(rows).sum(1, keepdim=True)
        k = (n - nans - 1).clamp(min=0) // 2 if ignore_nan else torch.where(nans > 0, n - nans, (n - 1) // 2)
        p = p.gather(1, k)
        if ignore_nan:
            p = torch.where(nans == n, _nth_of_equals(n), p)
        return _unrows(s.gather(1, k), x, d, keepdim), _unrows(p, x, d, keepdim)
    k = torch.full((rows.size(0), 1), (n - 1) // 2, dtype=torch.int64, device=x.device)
    return _unrows(s.gather(1, k), x, d, keepdim), _unrows(p.gather(1, k), x, d, keepdim)


def _nanmedian_dim(x, dim, keepdim=False):
    return _median_dim(x, dim, keepdim, ignore_nan=True)


def _median_all(x, ignore_nan=False):
    _no_bool(x, "median_cpu")
    flat = x.reshape(-1)
    n = flat.numel()
    if n == 0:   # (NaN, converted to the dtype as the CPU converts it)
        return torch.tensor(float("nan")).to(x.dtype).to(x.device)
    s = torch.sort(flat, stable=True)[0]
    if not x.is_floating_point():
        return s[(n - 1) // 2]
    nans = torch.isnan(flat).sum().reshape(1)
    k = (n - nans - 1).clamp(min=0) // 2 if ignore_nan else torch.where(nans > 0, n - nans, (n - 1) // 2)
    return s.gather(0, k).reshape(())


def _nanmedian_all(x):
    return _median_all(x, ignore_nan=True)


def _introsort_order(a):
    """Each row's elements (a: rows x n) in the order libstdc++'s std::sort leaves them, as the CPU's mode sorts
    (value, column) pairs by value: introsort's partition passes (median of three moved to the front, then an
    unguarded Hoare partition; the pivot stays in the left part), all segments longer than 16 partitioned at
    once, one level per step, then the final insertion sort, which is a stable sort of that order. Returns
    the columns in the final order. (The heap sort libstdc++ falls back to past 2 log2(n) levels, which
    median-of-three partitions of real data do not reach, is not emulated: a stable sort takes its place.)"""
    B, n = a.shape
    dev = a.device
    pos = torch.arange(n, device=dev).expand(B, n)
    ix = pos.clone()
    start = pos == 0
    nend = torch.full((B, 1), n, dtype=torch.int64, device=dev)

    def at(t, i):
        return t.gather(1, i.clamp(0, t.size(1) - 1))
    for _ in range(2 * (n.bit_length() - 1) if n else 0):
        f = torch.cummax(torch.where(start, pos, 0), 1).values
        sm = torch.flip(torch.cummin(torch.flip(torch.where(start, pos, n), [1]), 1).values, [1])
        l = torch.cat([sm[:, 1:], nend], 1)
        act = l - f > 16
        if not bool(act.any().item()):
            break
        mid = f + (l - f) // 2
        va, vb, vc = at(a, f + 1), at(a, mid), at(a, l - 1)
        ab, bc, ac = va < vb, vb < vc, va < vc
        ch = torch.where(ab, torch.where(bc, mid, torch.where(ac, l - 1, f + 1)),
                         torch.where(ac, f + 1, torch.where(bc, l - 1, mid)))
        perm = torch.where(act, torch.where(pos == f, ch, torch.where(pos == ch, f, pos)), pos)
        a, ix = a.gather(1, perm), ix.gather(1, perm)
        piv = at(a, f)
        inside = torch.logical_and(act, pos > f)
        I = torch.logical_and(inside, torch.logical_not(a < piv))
        J = torch.logical_and(inside, torch.logical_not(piv < a))
        cI = torch.cumsum(I, 1)
        rI = cI - 1 - at(cI - I.long(), f)             # rank from the segment's left
        cJ = torch.cumsum(J, 1)
        rJ = at(cJ, l - 1) - cJ                        # right scan's stops to the right, in the segment
        mI = torch.cumsum(torch.logical_and(I, rJ > rI), 1)
        M = at(mI, l - 1) - at(mI, f) + at(torch.logical_and(I, rJ > rI).long(), f)
        Ip = torch.cat([torch.full_like(ix, n), nend], 1).scatter(1, torch.where(I, f + rI, n), pos)
        Jp = torch.cat([torch.full_like(ix, -1), nend], 1).scatter(1, torch.where(J, f + rJ, n), pos)
        perm = torch.where(torch.logical_and(I, rI < M), at(Jp, f + rI), pos)
        perm = torch.where(torch.logical_and(J, rJ < M), at(Ip, f + rJ), perm)
        a, ix = a.gather(1, perm), ix.gather(1, perm)
        cut = torch.minimum(at(Ip, f + M), torch.where(M > 0, at(Jp, f + M - 1), l))
        start = torch.logical_or(start, torch.logical_and(act, pos == cut))
    return ix.gather(1, torch.sort(a, dim=1, stable=True)[1])


def _mode(x, dim=-1, keepdim=False):
    """The most frequent value of each slice (the smallest of equally frequent ones) and the column of its last
    element in the order the CPU's std::sort leaves the slice in (numbers: exactly; a NaN, which the CPU's
    comparisons leave in place, counts once, and sorts last here)."""
    d = _wrap_dim(dim, x.dim())
    _zero_numel_check(x, d, "mode()")
    rows = _rows(x, d)
    B, n = rows.shape
    if not rows.numel():
        e = rows.new_zeros((0, 1), dtype=torch.int64)
        return _unrows(rows[:, :1], x, d, keepdim), _unrows(e, x, d, keepdim)
    a = _cmp_view(rows)
    order = _introsort_order(a)
    s = a.gather(1, order)
    pos = torch.arange(n, device=x.device).expand(B, n)
    new = torch.cat([torch.ones_like(s[:, :1], dtype=torch.bool), s[:, 1:] != s[:, :-1]], 1)   # NaN != NaN
    last = torch.cat([new[:, 1:], torch.ones_like(new[:, :1])], 1)
    count = pos - torch.cummax(torch.where(new, pos, 0), 1).values + 1
    best = torch.where(last, count, 0).argmax(1, keepdim=True)   # (the first most frequent)
    idx = order.gather(1, best)
    return _unrows(rows.gather(1, idx), x, d, keepdim), _unrows(idx, x, d, keepdim)


def _mode_values(x, dim=-1, keepdim=False, *, values, indices):
    if values.dtype != x.dtype:
        raise RuntimeError(f"expected scalar type '{_dtype_name(x.dtype)}' but got '{_dtype_name(values.dtype)}' "
                           "for values output")
    if indices.dtype != torch.int64:
        raise RuntimeError(f"expected scalar type 'Long' but got '{_dtype_name(indices.dtype)}' for indices output")
    return _out(_mode, "values", "indices")(x, dim, keepdim, values=values, indices=indices)


def _groups(s):
    """Flags of the elements (rows of s along dim 0) that differ from the one before (NaN differs from all)."""
    if s.size(0) == 0:
        return torch.zeros(0, dtype=torch.bool, device=s.device)
    ne = s[1:] != s[:-1]
    if ne.dim() > 1:
        ne = ne.flatten(1).any(1)
    return torch.cat([torch.ones(1, dtype=torch.bool, device=s.device), ne])


def _group_results(s, new, perm, inverse_shape, want_inverse, want_counts, always_inverse=False):
    """unique's outputs from sorted (or consecutive) elements s with their group flags: the first of each
    group, each element's group (at its place before sorting: perm), and each group's size. The group count is
    read back (the one host read: the output's size)."""
    dev = s.device
    gid = torch.cumsum(new, 0) - 1
    first = torch.nonzero(new).reshape(-1)
    out = s.index_select(0, first)
    inv = torch.empty(0, dtype=torch.int64, device=dev)
    if want_inverse or always_inverse:
        inv = (gid if perm is None else torch.empty_like(gid).scatter_(0, perm, gid)).reshape(inverse_shape)
    counts = torch.empty(0, dtype=torch.int64, device=dev)
    if want_counts:
        counts = torch.diff(torch.cat([first, torch.tensor([s.size(0)], device=dev)]))
    return out, inv, counts


def _unique2(x, sorted=True, return_inverse=False, return_counts=False):
    """torch.unique (always sorted, as on the CPU): a stable sort, then groups of equal neighbours (each NaN
    its own)."""
    flat = x.reshape(-1)
    s, perm = torch.sort(flat, stable=True)
    return _group_results(s, _groups(s), perm, x.shape, return_inverse, return_counts)


def _unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    if dim is None or (x.dim() == 1 and _wrap_dim(dim, 1) == 0):
        flat = x.reshape(-1)
        return _group_results(flat, _groups(flat), None, x.shape, return_inverse, return_counts)
    return _unique_dim(x, dim, True, return_inverse, return_counts, consecutive=True)


def _unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False, consecutive=False):
    """Slices along dim as rows, sorted lexicographically (a stable sort per column, the last column first),
    then grouped (a slice holding a NaN, which the CPU's lexicographic order leaves undefined, is its own group
    and sorts by its numbers with NaN last)."""
    if x.dim() == 0:
        raise IndexError("Dimension specified as 0 but tensor has no dimensions")
    d = _wrap_dim(dim, x.dim())
    dev = x.device
    empty = torch.empty(0, dtype=torch.int64, device=dev)
    if x.size(d) == 0:
        if list(x.shape).count(0) != 1:
            raise RuntimeError("Number of zero sized dimensions is more than one, so unique cannot be applied ")
        return torch.empty_like(x, memory_format=torch.contiguous_format), empty, empty
    if x.numel() == 0:
        raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique cannot be applied")
    rows = x.movedim(d, 0)
    shape = rows.shape
    rows = rows.reshape(shape[0], -1)
    perm = None
    if not consecutive:
        perm = torch.arange(rows.size(0), device=dev)
        for c in range(rows.size(1) - 1, -1, -1):
            perm = perm.index_select(0, torch.sort(rows[:, c].index_select(0, perm), stable=True)[1])
        rows = rows.index_select(0, perm)
    out, inv, counts = _group_results(rows, _groups(rows), perm, (shape[0],), return_inverse, return_counts,
                                      always_inverse=True)
    if not return_counts:   # (the CPU's kernel counts anyway)
        counts = torch.diff(torch.cat([torch.nonzero(_groups(rows)).reshape(-1),
                                       torch.tensor([rows.size(0)], device=dev)]))
    return out.reshape(-1, *shape[1:]).movedim(0, d), inv, counts


def _unique_dim_consecutive(x, dim, return_inverse=False, return_counts=False):
    return _unique_dim(x, dim, True, return_inverse, return_counts, consecutive=True)


def _searchsorted(sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None, out_dtype=None):
    """The CPU's binary search (cus_lower_bound / cus_upper_bound) run on every value at once, step for step
    (so that NaNs, in the values or the boundaries, land where the CPU's comparisons put them)."""
    bd = sorted_sequence
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
        if right and side != "right":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of "
                               f"{side} while right was True")
    scalar = not isinstance(x, torch.Tensor)
    if sorter is not None:
        if sorter.shape != bd.shape:
            raise RuntimeError("torch.searchsorted(): boundary and sorter must have the same size, but got boundary "
                               f"tensor {list(bd.shape)}and got sorter tensor {list(sorter.shape)}")
        if sorter.dtype != torch.int64:
            raise RuntimeError("torch.searchsorted(): sorter must be a tensor of long dtype but got dtype "
                               f"{_dtype_name(sorter.dtype)}")
        if sorter.numel():
            lo, hi = torch.stack([sorter.min(), sorter.max()]).tolist()   # one host read
            if lo < 0 or hi >= sorter.size(-1):
                raise RuntimeError("torch.searchsorted(): sorter index out of range")
    xd = 0 if scalar else x.dim()
    xn = 1 if scalar else x.numel()
    if not (xd > 0 or (xn == 1 and bd.dim() == 1)):
        raise RuntimeError("torch.searchsorted(): input value can be a scalar only when boundaries tensor dimension "
                           f"is 1, but we got boundaries tensor dim({bd.dim()}) and input value's dim({xd}) "
                           f"numel({xn})")
    if bd.dim() == 0:
        raise RuntimeError("torch.searchsorted(): boundaries tensor should have positive dimension, but got 0 "
                           "dimension")
    if bd.dim() != 1 and (bd.dim() != xd or bd.shape[:-1] != x.shape[:-1]):
        raise RuntimeError("torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
                           "dimensions of boundaries tensor and input value tensor must match, but we got "
                           f"boundaries tensor {list(bd.shape)} and input value tensor {list(x.shape)}")
    want = torch.int32 if out_int32 else torch.int64
    if out_dtype is not None and out_dtype != want:
        raise RuntimeError("torch.searchsorted(): output tensor's dtype is wrong, it can only be Int(int32) or "
                           "Long(int64) depending on whether out_int32 flag is True, but we got output tensor's "
                           f"dtype {_dtype_name(out_dtype)} and out_int32 flag is {out_int32}")
    dt = torch.result_type(bd, x)
    _no_bool(torch.empty(0, dtype=dt), "searchsorted_out_cpu")
    right = side == "right" if side is not None else right
    if scalar:
        x = torch.tensor(x, device=bd.device)
    x = x.to(dt)
    n = bd.size(-1)
    if x.numel() == 0 or n == 0:
        return torch.zeros(x.shape, dtype=want, device=x.device)
    bd = bd.to(dt)
    if sorter is not None:
        bd = bd.gather(-1, sorter)
    one = bd.dim() == 1
    v = x.reshape(-1) if one else x.reshape(-1, x.size(-1))
    rows = None if one else bd.reshape(-1, n)
    lo = torch.zeros(v.shape, dtype=torch.int64, device=x.device)
    hi = torch.full(v.shape, n, dtype=torch.int64, device=x.device)
    for _ in range(n.bit_length()):
        mid = lo + (hi - lo) // 2
        m = mid.clamp(max=n - 1)
        mv = bd.index_select(0, m) if one else rows.gather(1, m)
        go = torch.logical_not(mv > v if right else mv >= v)
        live = lo < hi
        lo, hi = torch.where(torch.logical_and(live, go), mid + 1, lo), torch.where(
            torch.logical_and(live, torch.logical_not(go)), mid, hi)
    return lo.reshape(x.shape).to(want)


def _searchsorted_out(sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None, out):
    r = _searchsorted(sorted_sequence, x, out_int32=out_int32, right=right, side=side, sorter=sorter,
                      out_dtype=out.dtype)
    out.resize_(r.shape)
    return out.copy_(r)

def _nll_loss2d_check(x, target, weight):
    if target.dim() != 3:
        raise RuntimeError("only batches of spatial targets supported (3D tensors) but got targets of dimension: "
                           f"{target.dim()}")
    if x.dim() != 4:
        raise RuntimeError("only batches of spatial inputs supported (4D tensors), but got input of dimension: "
                           f"{x.dim()}")
    if target.dtype not in (torch.int64, torch.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {_dtype_name(target.dtype)}")
    if weight is not None and weight.numel() != x.size(1):
        raise RuntimeError("weight tensor should be defined either for all or no classes")
    if (x.size(0), x.size(2), x.size(3)) != tuple(target.shape):
        raise RuntimeError(f"size mismatch (got input: {list(x.shape)} , target: {list(target.shape)}")
    _float_kernel("nll_loss2d_forward_out_frame", x, types=(torch.float32, torch.float64, *_LOW))
    if target.dtype != torch.int64:   # (the CPU's 2-d kernel reads Long targets only)
        raise RuntimeError(f"expected scalar type Long but found {_dtype_name(target.dtype)}")


def _pixels(x, target):
    """(N, C, H, W) scores and (N, H, W) targets as the rows of a 1-d nll_loss: one per pixel."""
    return x.permute(0, 2, 3, 1).reshape(-1, x.size(1)), target.reshape(-1)


def _nll_loss2d_forward(x, target, weight, reduction, ignore_index):
    """nll_loss over (N, C, H, W): every pixel a row of the native nll_loss (which checks the targets' range, as
    for 1-d losses)."""
    _nll_loss2d_check(x, target, weight)
    out, total = _aten.nll_loss_forward(*_pixels(x, target), weight, reduction, ignore_index)
    return (out.reshape(target.shape) if reduction == 0 else out), total


def _nll_loss2d_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    n, c, h, w = x.shape
    g = _aten.nll_loss_backward(grad.reshape(-1) if reduction == 0 else grad, *_pixels(x, target), weight,
                                reduction, ignore_index, total_weight)
    return g.reshape(n, h, w, c).permute(0, 3, 1, 2).contiguous()

def _triple(v, name, what, default=None):
    """A pooling argument (an int or 1 or 3 ints; empty: default) as 3 ints, with the CPU's message."""
    v = [v] if isinstance(v, int) else list(v)
    if not v and default is not None:
        return default
    if len(v) not in (1, 3):
        raise RuntimeError(f"{name}: {what}")
    return tuple(v) * 3 if len(v) == 1 else tuple(v)


def _pool3d_sizes(x, k, s, p, dil, ceil_mode, fn, check_input_size=False):
    """pooling_output_shape for T, H, W, then pool3d_shape_check (the CPU's order and words)."""
    outs = []
    for n, kk, ss, pp, dd in zip(x.shape[-3:], k, s, p, dil):
        if ss == 0:
            raise RuntimeError("stride should not be zero")
        if pp < 0:
            raise RuntimeError(f"pad must be non-negative, but got pad: {pp}")
        if pp > ((kk - 1) * dd + 1) // 2:
            raise RuntimeError(f"pad should be at most half of effective kernel size, but got pad={pp}, "
                               f"kernel_size={kk} and dilation={dd}")
        outs.append(_pool_out(n, (kk - 1) * dd + 1, ss, pp, ceil_mode))
    if min(k) <= 0:
        raise RuntimeError(f"kernel size should be greater than zero, but got kT: {k[0]} kH: {k[1]} kW: {k[2]}")
    if min(s) <= 0:
        raise RuntimeError(f"stride should be greater than zero, but got dT: {s[0]} dH: {s[1]} dW: {s[2]}")
    if min(dil) <= 0:
        raise RuntimeError("dilation should be greater than zero, but got dilationT: "
                           f"{dil[0]} dilationH: {dil[1]} dilationW: {dil[2]}")
    if x.dim() not in (4, 5):
        raise RuntimeError(f"{fn}: Expected 4D or 5D tensor for input, but got: {list(x.shape)}")
    for i in range(x.dim()):
        if x.size(i) <= 0 and not (x.dim() == 5 and i == 0):
            raise RuntimeError(f"{fn}: Expected input's non-batch dimensions to have positive length, but input has "
                               f"a shape of {list(x.shape)} and non-batch dimension {x.size(i)} has length zero!")
    t, h, w = x.shape[-3:]
    if check_input_size and (t < k[0] or h < k[1] or w < k[2]):
        raise RuntimeError(f"input image (T: {t} H: {h} W: {w}) smaller than kernel size (kT: {k[0]} kH: {k[1]} "
                           f"kW: {k[2]})")
    if k[0] // 2 < p[0] or k[2] // 2 < p[2] or k[1] // 2 < p[1]:
        raise RuntimeError(f"pad should be smaller than or equal to half of kernel size, but got kT: {k[0]} kW: "
                           f"{k[2]} kH: {k[1]} padT: {p[0]} padW: {p[2]} padH: {p[1]}")
    if min(outs) < 1:
        raise RuntimeError(f"Given input size: ({x.size(-4)}x{t}x{h}x{w}). Calculated output size: "
                           f"({x.size(-4)}x{outs[0]}x{outs[1]}x{outs[2]}). Output size is too small")
    return outs


def _pool3d_view(xp, o, s, off):
    """The strided view of padded xp holding, for every output position, its window element at offset off."""
    return xp[..., off[0]:off[0] + s[0] * (o[0] - 1) + 1:s[0], off[1]:off[1] + s[1] * (o[1] - 1) + 1:s[1],
              off[2]:off[2] + s[2] * (o[2] - 1) + 1:s[2]]


def _pool3d_pad(x, k, s, p, dil, o, value):
    """x padded by p before and by p (plus what the last ceil_mode windows reach) after, in each of T, H, W."""
    pads = []
    for n, kk, ss, pp, dd, oo in zip(x.shape[-3:], k, s, p, dil, o):
        pads = [pp, max(pp, (oo - 1) * ss + (kk - 1) * dd + 1 - n - pp)] + pads
    return torch.nn.functional.pad(x, pads, value=value)


def _avg_pool3d_args(x, kernel_size, stride, padding, divisor_override):
    k = _triple(kernel_size, "avg_pool3d", "kernel_size must be a single int, or a tuple of three ints")
    s = _triple(stride, "avg_pool3d", "stride must be omitted, a single int, or a tuple of three ints", k)
    p = _triple(padding, "avg_pool3d", "padding must be a single int, or a tuple of three ints")
    if x.dim() not in (4, 5):
        raise RuntimeError("non-empty 4D or 5D (batch mode) tensor expected for input")
    if divisor_override is not None and divisor_override == 0:
        raise RuntimeError("divisor must be not zero")
    return k, s, p


def _avg_pool3d_divisor(x, k, s, p, o, ceil_mode, count_include_pad, divisor_override):
    """Each window's divisor, as the CPU's kernel counts it (the padded area if count_include_pad; past it never)."""
    if divisor_override is not None:
        return torch.tensor(divisor_override, device=x.device)
    per = []
    for n, kk, ss, pp, oo in zip(x.shape[-3:], k, s, p, o):
        c = []
        for i in range(oo):
            a, b = i * ss - pp, min(i * ss - pp + kk, n + pp)
            c.append(b - a if count_include_pad else min(b, n) - max(a, 0))
        per.append(c)
    div = torch.tensor(per[0])[:, None, None] * torch.tensor(per[1])[None, :, None] * torch.tensor(per[2])[None, None]
    return div.to(x.device)


def _avg_div(total, div):
    """sum / divisor as the CPU's kernel divides: in the dtype, truncating for integers."""
    if total.is_floating_point():
        return total / div.to(total.dtype)
    return torch.div(total, div.to(total.dtype), rounding_mode="trunc")


def _avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    """avg_pool3d: each window's sum, one strided view of the zero-padded input per kernel offset (summed in the
    CPU's order), over PyTorch's divisor."""
    k, s, p = _avg_pool3d_args(x, kernel_size, stride, padding, divisor_override)
    o = _pool3d_sizes(x, k, s, p, (1, 1, 1), ceil_mode, "avg_pool3d()", check_input_size=True)
    _float_kernel("avg_pool3d_out_frame", x, types=(torch.float32, torch.float64, torch.int64))
    xp = _pool3d_pad(x, k, s, p, (1, 1, 1), o, 0)
    total = torch.zeros((*x.shape[:-3], *o), dtype=x.dtype, device=x.device)
    for a in range(k[0]):
        for b in range(k[1]):
            for c in range(k[2]):
                total.add_(_pool3d_view(xp, o, s, (a, b, c)))
    return _avg_div(total, _avg_pool3d_divisor(x, k, s, p, o, ceil_mode, count_include_pad, divisor_override))


def _avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """Each output's gradient over its divisor, added to every element of its window (one strided view of a
    zero-padded buffer per kernel offset)."""
    k, s, p = _avg_pool3d_args(x, kernel_size, stride, padding, divisor_override)
    o = _pool3d_sizes(x, k, s, p, (1, 1, 1), ceil_mode, "avg_pool3d_backward()", check_input_size=True)
    want = (*x.shape[:-3], *o)
    if grad.dim() != x.dim() or tuple(grad.shape) != want:
        for i, (gs, ws) in enumerate(zip(grad.shape, want)):
            if gs != ws:
                raise RuntimeError(f"Expected a tensor of dimension {x.dim()} and tensor.size[{i}] == {ws} but got: "
                                   f"dimension {grad.dim()} and tensor.size[{i}] = {gs}")
    _float_kernel("avg_pool3d_backward_out_frame", x, types=(torch.float32, torch.float64, torch.int64))
    g = _avg_div(grad, _avg_pool3d_divisor(x, k, s, p, o, ceil_mode, count_include_pad, divisor_override))
    gp = torch.zeros_like(_pool3d_pad(x, k, s, p, (1, 1, 1), o, 0), memory_format=torch.contiguous_format)
    for a in range(k[0]):
        for b in range(k[1]):
            for c in range(k[2]):
                _pool3d_view(gp, o, s, (a, b, c)).add_(g)
    t, h, w = x.shape[-3:]
    return gp[..., p[0]:p[0] + t, p[1]:p[1] + h, p[2]:p[2] + w].contiguous()


def _max_pool3d_args(x, kernel_size, stride, padding, dilation):
    k = _triple(kernel_size, "max_pool3d", "kernel_size must either be a single int, or a tuple of three ints")
    s = _triple(stride, "max_pool3d", "stride must either be omitted, a single int, or a tuple of three ints", k)
    p = _triple(padding, "max_pool3d", "padding must either be a single int, or a tuple of three ints")
    d = _triple(dilation, "max_pool3d", "dilation must be either a single int, or a tuple of three ints")
    cl = x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d)
    if not cl and x.dim() not in (4, 5):
        raise RuntimeError("non-empty 4D or 5D (batch mode) tensor expected for input")
    return k, s, p, d


def _lowest(dtype):
    return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min


def _max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Each window's max and the flattened T x H x W index of it, by the CPU kernel's rule, applied offset by
    offset in its scan order: an element replaces the max if it is greater or NaN (so the first of equal
    maxima and the last NaN), the padding never (it holds the lowest value, and each index starts at the
    window's first element in the input)."""
    k, s, p, dil = _max_pool3d_args(x, kernel_size, stride, padding, dilation)
    o = _pool3d_sizes(x, k, s, p, dil, ceil_mode, "max_pool3d_with_indices_out_cpu_template()")
    if x.dtype == torch.bool:
        raise NotImplementedError('"max_pool3d" not implemented for \'Bool\'')
    t, h, w = x.shape[-3:]
    xp = _pool3d_pad(x.contiguous(), k, s, p, dil, o, _lowest(x.dtype))
    dev = x.device

    def pos(n, oo, ss, pp, kk, dd):   # (o, k) input positions of each window's elements
        return torch.arange(oo)[:, None] * ss - pp + torch.arange(kk)[None, :] * dd
    pt, ph, pw = (pos(*a) for a in zip((t, h, w), o, s, p, k, dil))

    cl = x.dim() == 5 and suggest_memory_format(x) == torch.channels_last_3d

    def first(q):   # each window's start moved by the dilation up to 0 (past the input for an empty window)
        d = q[:, 1:2] - q[:, :1] if q.size(1) > 1 else torch.ones_like(q[:, :1])
        return torch.where(q[:, 0] < 0, q[:, 0] + d[:, 0] * ((-q[:, 0] + d[:, 0] - 1) // d[:, 0]), q[:, 0])
    # the index a window keeps if nothing in it is above the lowest value: the CPU kernel's first element (its
    # channels-last kernel's leaves out the T term)
    idx = ((0 if cl else first(pt)[:, None, None] * (h * w)) + first(ph)[None, :, None] * w
           + first(pw)[None, None, :]).to(dev).expand(*x.shape[:-3], *o).clone()
    best = None
    for a in range(k[0]):
        for b in range(k[1]):
            for c in range(k[2]):
                v = _pool3d_view(xp, o, s, (a * dil[0], b * dil[1], c * dil[2]))
                at = (pt[:, a, None, None] * (h * w) + ph[None, :, b, None] * w + pw[None, None, :, c]).to(dev)
                if best is None:
                    best = torch.full_like(v, _lowest(x.dtype), memory_format=torch.contiguous_format)
                take = v > best
                if x.is_floating_point():
                    take = torch.logical_or(take, torch.isnan(v))
                best = torch.where(take, v, best)
                idx = torch.where(take, at, idx)
    fmt = torch.channels_last_3d if cl else torch.contiguous_format
    return best.contiguous(memory_format=fmt), idx.contiguous(memory_format=fmt)


def _max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Each output's gradient added at its max's input position."""
    g = torch.zeros((*x.shape[:-3], x.shape[-3] * x.shape[-2] * x.shape[-1]), dtype=grad.dtype, device=grad.device)
    i, gr = indices.reshape(*indices.shape[:-3], -1), grad.reshape(*grad.shape[:-3], -1)
    ok = i < g.size(-1)   # (an empty window's index is past the input: its gradient goes nowhere)
    g = g.scatter_add(-1, torch.where(ok, i, 0), torch.where(ok, gr, 0)).view(x.shape)
    return g.contiguous(memory_format=suggest_memory_format(x)) if x.dim() == 5 else g


def _adaptive3d_check(x, output_size, fn):
    for i in range(1, x.dim()):
        if x.size(i) <= 0:
            raise RuntimeError(f"{fn}(): Expected input to have non-zero size for non-batch dimensions, but input "
                               f"has sizes {list(x.shape)} with dimension {i} being empty")


def _adaptive_windows(n, o, dev):
    """Each output's input positions [floor(i n / o), ceil((i + 1) n / o)) as (o, longest) positions, the short
    windows padded with their last position, and each window's length."""
    st = [i * n // o for i in range(o)]
    en = [-(-(i + 1) * n // o) for i in range(o)]
    k = max((e - b for b, e in zip(st, en)), default=1)
    pos = torch.tensor([[min(b + j, e - 1) for j in range(k)] for b, e in zip(st, en)], dtype=torch.int64)
    return pos.reshape(o, k).to(dev), torch.tensor([e - b for b, e in zip(st, en)], dtype=torch.int64).to(dev)


def _adaptive_avg_pool3d(x, output_size):
    """Each window's mean: its sum over T, then H, then W (a window padded with its last position counts that
    element once: the padding slots are masked), over its size."""
    if len(output_size) != 3:
        raise RuntimeError("adaptive_avg_pool3d: output_size must be 3")
    if x.dim() not in (4, 5):
        raise RuntimeError(f"adaptive_avg_pool3d(): Expected 4D or 5D tensor, but got {list(x.shape)}")
    _adaptive3d_check(x, output_size, "adaptive_avg_pool3d")
    _float_kernel("adaptive_avg_pool3d_cpu", x, types=(torch.float32, torch.float64, *_LOW))
    y = _acc(x)
    count = None
    for d, (n, o) in enumerate(zip(x.shape[-3:], output_size)):
        dim = y.dim() - 3 + d
        pos, cnt = _adaptive_windows(n, o, x.device)
        kk = pos.size(1)
        keep = (torch.arange(kk, device=x.device)[None, :] < cnt[:, None]).reshape(-1)
        g = y.index_select(dim, pos.reshape(-1))
        g = g.unflatten(dim, (o, kk))
        shape = [1] * g.dim()
        shape[dim], shape[dim + 1] = o, kk
        y = torch.where(keep.reshape(shape), g, 0).sum(dim + 1)
        c = cnt.reshape([o if i == d else 1 for i in range(3)])
        count = c if count is None else count * c
    return (y / count.to(y.dtype)).to(x.dtype)


def _adaptive_avg_pool3d_backward(grad, x):
    """Each output's gradient over its window's size, added to the window's elements (T, H, W in turn)."""
    _float_kernel("adaptive_avg_pool3d_backward_cpu", x, types=(torch.float32, torch.float64, *_LOW))
    g = _acc(grad)
    osz = grad.shape[-3:]
    count = None
    for d, (n, o) in enumerate(zip(x.shape[-3:], osz)):
        c = _adaptive_windows(n, o, x.device)[1].reshape([o if i == d else 1 for i in range(3)])
        count = c if count is None else count * c
    g = g / count.to(g.dtype)
    for d, (n, o) in enumerate(zip(x.shape[-3:], osz)):
        dim = g.dim() - 3 + d
        pos, cnt = _adaptive_windows(n, o, x.device)
        kk = pos.size(1)
        keep = torch.arange(kk, device=x.device)[None, :] < cnt[:, None]
        src = pos.masked_select(keep)
        win = torch.arange(o, device=x.device)[:, None].expand(o, kk).masked_select(keep)
        shape = list(g.shape)
        shape[dim] = n
        g = torch.zeros(shape, dtype=g.dtype, device=g.device).index_add_(dim, src, g.index_select(dim, win))
    return g.to(x.dtype).contiguous()


def _adaptive_max_pool3d(x, output_size):
    """Each output's window gathered (short windows padded with their last position), then the CPU kernel's
    choice: the first of equal maxima, or the last NaN."""
    if len(output_size) != 3:
        raise RuntimeError("adaptive_max_pool3d(): internal error: output_size.size() must be 3")
    if x.dim() not in (4, 5):
        raise RuntimeError(f"adaptive_max_pool3d(): Expected 4D or 5D tensor, but got: {list(x.shape)}")
    _adaptive3d_check(x, output_size, "adaptive_max_pool3d")
    if min(output_size) < 0:
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(output_size)}: "
                           f"{[*x.shape[:-3], *output_size]}")
    _float_kernel("adaptive_max_pool3d_cpu", x, types=(torch.float32, torch.float64, *_LOW))
    (t, h, w), (ot, oh, ow) = x.shape[-3:], output_size
    it, ih, iw = (_adaptive_windows(n, o, x.device)[0] for n, o in zip((t, h, w), output_size))
    flat = (it[:, None, None, :, None, None] * (h * w) + ih[None, :, None, None, :, None] * w
            + iw[None, None, :, None, None, :]).reshape(ot, oh, ow, it.size(1) * ih.size(1) * iw.size(1))
    win = x.contiguous().flatten(-3)[..., flat]
    k = _first_max_last_nan(win)
    return win.gather(-1, k).squeeze(-1), flat.expand(*win.shape).gather(-1, k).squeeze(-1)


def _first_max_last_nan(win):
    """The position along the last dim of the first maximum, or of the last NaN if there is one (as the CPU's
    max pooling kernels scan: greater or NaN replaces)."""
    m = win.amax(-1, keepdim=True) if win.size(-1) else win.sum(-1, keepdim=True)
    k = torch.logical_or(win == m, torch.isnan(m)).to(torch.uint8).argmax(-1, keepdim=True)
    if win.is_floating_point():
        nan = torch.isnan(win)
        last = win.size(-1) - 1 - torch.flip(nan, [-1]).to(torch.uint8).argmax(-1, keepdim=True)
        k = torch.where(nan.any(-1, keepdim=True), last, k)
    return k


def _adaptive_max_pool3d_backward(grad, x, indices):
    g = torch.zeros((*x.shape[:-3], x.shape[-3] * x.shape[-2] * x.shape[-1]), dtype=grad.dtype, device=grad.device)
    g = g.scatter_add(-1, indices.reshape(*indices.shape[:-3], -1), grad.reshape(*grad.shape[:-3], -1))
    return g.view(x.shape)

# (schema name, overload, implementation)

# ---- antialiased resize (F.interpolate(..., antialias=True), torchvision's Resize)
def _aa_filter_linear(x):
    x = x.abs()
    return torch.where(x < 1, 1 - x, torch.zeros_like(x))


def _aa_filter_cubic(x, a=-0.5):
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def _aa_weights(n_in, n_out, align_corners, scale, filt, interp_size):
    """The out x in interpolation matrix of PyTorch's antialiased kernels (_compute_weights_aa):
    output i averages the inputs within `support` of its centre, weighted by the filter
    stretched by the scale when downsampling, normalized to sum 1. A function of the sizes
    only, built on the host like an index table, in float64."""
    if align_corners:
        sc = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    else:
        sc = 1.0 / scale if scale is not None and scale > 0 else n_in / n_out
    support = interp_size * 0.5 * sc if sc >= 1.0 else interp_size * 0.5
    invscale = 1.0 / sc if sc >= 1.0 else 1.0
    centre = sc * (torch.arange(n_out, dtype=torch.float64) + 0.5)
    lo = torch.trunc(centre - support + 0.5).clamp(min=0)
    hi = torch.trunc(centre + support + 0.5).clamp(max=n_in)
    j = torch.arange(n_in, dtype=torch.float64)
    w = filt((j[None, :] - centre[:, None] + 0.5) * invscale)
    w = torch.where((j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None]), w, torch.zeros_like(w))
    total = w.sum(1, keepdim=True)
    return torch.where(total != 0, w / torch.where(total != 0, total, torch.ones_like(total)), w)


def _upsample_aa(name, filt, interp_size):
    def run(x, output_size, align_corners, scales_h=None, scales_w=None):
        if len(output_size) != 2:
            raise RuntimeError(f"It is expected output_size equals to 2, but got size {len(output_size)}")
        if x.dim() != 4 or x.numel() == 0 and math.prod(x.shape[1:]) == 0:
            raise RuntimeError(f"Non-empty 4D data tensor expected but got a tensor with sizes {list(x.shape)}")
        ih, iw = x.shape[-2:]
        oh, ow = output_size
        if not (ih > 0 and iw > 0 and oh > 0 and ow > 0):
            raise RuntimeError(f"Input and output sizes should be greater than 0, but got input (H: {ih}, W: {iw}) "
                               f"output (H: {oh}, W: {ow})")
        ct = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
        wh = _aa_weights(ih, oh, align_corners, scales_h, filt, interp_size).to(x.device, ct)
        ww = _aa_weights(iw, ow, align_corners, scales_w, filt, interp_size).to(x.device, ct)
        y = torch.matmul(torch.matmul(wh, x.to(ct)), ww.t()).to(x.dtype)
        return y.contiguous(memory_format=suggest_memory_format(x))

    run.__name__ = name
    return run


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
    ("isin", "Tensor_Tensor_out", _out(_isin)),
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
    ("_upsample_bilinear2d_aa", "default", _upsample_aa("_upsample_bilinear2d_aa", _aa_filter_linear, 2)),
    ("_upsample_bicubic2d_aa", "default", _upsample_aa("_upsample_bicubic2d_aa", _aa_filter_cubic, 4)),
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
    ("max_unpool3d", "default", None),
    ("polar", "out", _out(_polar)),
    ("hardsigmoid_backward", "default", None),
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
    ("linalg_matrix_exp", "default", _matrix_exp),
    ("linalg_matrix_exp", "out", _out(_matrix_exp)),
    ("_fused_sgd_", "default", _fused_sgd),
    ("avg_pool2d", "default", _avg_pool2d),
    ("masked_scatter_", "default", _masked_scatter_),
    ("sgn", "out", _sgn_out),
    ("huber_loss", "default", None),
    ("huber_loss_backward", "default", None),
    ("smooth_l1_loss", "out", None),
    ("smooth_l1_loss_backward", "default", None),
    ("nansum", "default", None),
    ("count_nonzero", "dim_IntList", None),
    ("logit", "default", _logit),
    ("logit_backward", "default", _logit_backward),
    ("renorm", "out", None),
    ("take", "default", _take),
    ("take", "out", _take_out),
    ("put_", "default", _put_),
    ("threshold", "out", None),
    ("bitwise_left_shift", "Tensor_out", _out(_lshift)),
    ("bitwise_right_shift", "Tensor_out", _out(_rshift)),
    ("__lshift__", "Tensor", _lshift),
    ("__lshift__", "Scalar", _lshift),
    ("__rshift__", "Tensor", _rshift),
    ("__rshift__", "Scalar", _rshift),
    ("__ilshift__", "Tensor", _inplace(_lshift)),
    ("__ilshift__", "Scalar", _inplace(_lshift)),
    ("__irshift__", "Tensor", _inplace(_rshift)),
    ("__irshift__", "Scalar", _inplace(_rshift)),
    ("frexp", "Tensor", _frexp),
    ("frexp", "Tensor_out", _out(_frexp, "mantissa", "exponent")),
    ("nextafter", "default", _nextafter),
    ("nextafter", "out", _out(_nextafter)),
    ("heaviside", "default", _heaviside),
    ("heaviside", "out", _out(_heaviside)),
    ("linalg_cross", "default", _linalg_cross),
    ("linalg_cross", "out", _out(_linalg_cross)),
    ("_cdist_forward", "default", _cdist_forward),
    ("_cdist_backward", "default", _cdist_backward),
    ("_pdist_forward", "default", _pdist_forward),
    ("_pdist_backward", "default", _pdist_backward),
    ("norm", "out", None),
    ("multi_margin_loss", "default", _multi_margin_loss),
    ("multi_margin_loss_backward", "default", _multi_margin_loss_backward),
    ("multilabel_margin_loss_forward", "default", _multilabel_margin_loss_forward),
    ("multilabel_margin_loss_backward", "default", _multilabel_margin_loss_backward),
    ("exponential_", "default", _exponential_),
    ("segment_reduce", "default", _segment_reduce),
    ("_segment_reduce_backward", "default", _segment_reduce_backward),
    ("addbmm", "default", _addbmm),
    ("addbmm", "out", _out(_addbmm)),
    ("addbmm_", "default", _addbmm_),
    ("normal", "Tensor_Tensor", _normal),
    ("normal", "Tensor_float", _normal),
    ("normal", "float_Tensor", _normal),
    ("normal", "Tensor_Tensor_out", _out(_normal)),
    ("normal", "Tensor_float_out", _out(_normal)),
    ("normal", "float_Tensor_out", _out(_normal)),
    ("rrelu_with_noise", "default", _rrelu_with_noise),
    ("rrelu_with_noise_", "default", _rrelu_with_noise_),
    ("rrelu_with_noise_backward", "default", None),
    ("_weight_norm_interface", "default", _weight_norm_interface),
    ("_weight_norm_interface_backward", "default", _weight_norm_interface_backward),
    ("adaptive_max_pool2d", "default", _adaptive_max_pool2d),
    ("adaptive_max_pool2d", "out", _out(_adaptive_max_pool2d, "out", "indices")),
    ("adaptive_max_pool2d_backward", "default", _adaptive_max_pool2d_backward),
    ("_embedding_bag", "default", _embedding_bag),
    ("_embedding_bag_forward_only", "default", _embedding_bag),
    ("nonzero_static", "default", _nonzero_static),
    ("nonzero_static", "out", _out(_nonzero_static)),
    ("kthvalue", "default", _kthvalue),
    ("kthvalue", "values", _values_indices_out(_kthvalue, "kthvalue", _kthvalue_check)),
    ("median", "default", _median_all),
    ("median", "dim", _median_dim),
    ("median", "dim_values", _values_indices_out(_median_dim, "median",
                                                 lambda x, dim, keepdim=False: _median_check(x, dim, "median_out"))),
    ("nanmedian", "default", _nanmedian_all),
    ("nanmedian", "dim", _nanmedian_dim),
    ("nanmedian", "dim_values", _values_indices_out(_nanmedian_dim, "median",
                                                    lambda x, dim, keepdim=False: _median_check(x, dim, "median_out"))),
    ("mode", "default", _mode),
    ("mode", "values", _mode_values),
    ("_unique2", "default", _unique2),
    ("unique_consecutive", "default", _unique_consecutive),
    ("unique_dim", "default", _unique_dim),
    ("unique_dim_consecutive", "default", _unique_dim_consecutive),
    ("searchsorted", "Tensor", _searchsorted),
    ("searchsorted", "Scalar", _searchsorted),
    ("searchsorted", "Tensor_out", _searchsorted_out),
    ("searchsorted", "Scalar_out", _searchsorted_out),
    ("nll_loss2d_forward", "default", _nll_loss2d_forward),
    ("nll_loss2d_forward", "output", _out(_nll_loss2d_forward, "output", "total_weight")),
    ("nll_loss2d_backward", "default", _nll_loss2d_backward),
    ("nll_loss2d_backward", "grad_input", _out(_nll_loss2d_backward, "grad_input")),
    ("avg_pool3d", "default", _avg_pool3d),
    ("avg_pool3d", "out", _out(_avg_pool3d)),
    ("avg_pool3d_backward", "default", _avg_pool3d_backward),
    ("avg_pool3d_backward", "grad_input", _out(_avg_pool3d_backward, "grad_input")),
    ("max_pool3d_with_indices", "default", _max_pool3d_with_indices),
    ("max_pool3d_with_indices", "out", _out(_max_pool3d_with_indices, "out", "indices")),
    ("max_pool3d_with_indices_backward", "default", _max_pool3d_with_indices_backward),
    ("max_pool3d_with_indices_backward", "grad_input", _out(_max_pool3d_with_indices_backward, "grad_input")),
    ("_adaptive_avg_pool3d", "default", _adaptive_avg_pool3d),
    ("_adaptive_avg_pool3d_backward", "default", _adaptive_avg_pool3d_backward),
    ("adaptive_avg_pool3d", "out", _out(_adaptive_avg_pool3d)),
    ("adaptive_avg_pool3d_backward", "grad_input", _out(_adaptive_avg_pool3d_backward, "grad_input")),
    ("adaptive_max_pool3d", "default", _adaptive_max_pool3d),
    ("adaptive_max_pool3d", "out", _out(_adaptive_max_pool3d, "out", "indices")),
    ("adaptive_max_pool3d_backward", "default", _adaptive_max_pool3d_backward),
    ("adaptive_max_pool3d_backward", "grad_input", _out(_adaptive_max_pool3d_backward, "grad_input")),
]


# Ops whose overload has no autograd formula of its own in PyTorch (the
# upsampling ones) or whose backward has no native kernel (grid_sampler_2d,
# replication padding, adaptive average pooling, linear upsampling; sgn's
# needs a ZeroTensor; _embedding_bag's backward kernels):
# their decomposition is registered at the autograd level too, so autograd
# differentiates the native ops it is made of (as CompositeImplicitAutograd
# would for this device).
_AUTOGRAD_LEVEL = {"avg_pool2d", "sgn", "replication_pad1d", "replication_pad2d", "replication_pad3d", "upsample_linear1d",
                   "_adaptive_avg_pool2d", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
                   "_upsample_nearest_exact2d", "upsample_bilinear2d", "upsample_bicubic2d", "upsample_trilinear3d",
                   "grid_sampler_2d", "_embedding_bag", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"}


# rows whose function takes complex tensors itself (polar writes a complex result from real inputs, sgn divides)
_HANDLES_COMPLEX = {"polar", "sgn"}


def _is_complex_arg(a):
    if isinstance(a, torch.Tensor):
        return a.is_complex()
    return isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) and t.is_complex() for t in a)


def _complex_routed(op, full, fn):
    """fn, except that a call with a complex tensor argument runs `op` on the
    CPU: these decompositions compute in real dtypes only. Counted and warned
    as the C++ CPU fallback is (and refused under TORCH_TPU_CPU_FALLBACK=0);
    mutated arguments get the results copied back."""
    schema = op._schema
    written = [i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]

    def run(*args, **kwargs):
        if not (any(_is_complex_arg(a) for a in args) or any(_is_complex_arg(a) for a in kwargs.values())):
            return fn(*args, **kwargs)
        torch.ops.torch_tpu.note_cpu_fallback(f"aten::{full}")
        dev = next(t.device for t in pytree.tree_leaves((args, kwargs))
                   if isinstance(t, torch.Tensor) and t.device.type == "tpu")
        cargs, ckw = pytree.tree_map_only(torch.Tensor, lambda t: t.cpu(), (args, kwargs))
        res = op(*cargs, **ckw)
        back = {}
        for i in written:
            a = schema.arguments[i]
            orig, cpu = (args[i], cargs[i]) if i < len(args) else (kwargs.get(a.name), ckw.get(a.name))
            if isinstance(orig, torch.Tensor):
                orig.copy_(cpu)
                back[id(cpu)] = orig
        return pytree.tree_map_only(torch.Tensor, lambda t: back[id(t)] if id(t) in back else t.to(dev), res)

    return run


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
            impl = fn or decomposition_table[op]
            lib.impl(full, impl if name in _HANDLES_COMPLEX else _complex_routed(op, full, impl), key)
    _lib = lib
