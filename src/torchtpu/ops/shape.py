"""Lowerings: shape (concatenation, padding, flips, resampling, patches).

View ops (view, slice, select, transpose, expand, ...) are not here: they are metadata kernels that
share storage (eager/kernels.py). These are the ops that produce new values.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from torch._prims_common import suggest_memory_format

from .argument_checks import input_loop_check, out_overlaps_inputs_check
from .dtypes import INTEGERS, NOT_FLOATING, WIDE_UNSIGNED, scalar_type_name, to_opmath
from .table import lowering


# ---------------------------------------------------------------- concatenation
def _cat_out_dtype_check(tensors, dim=0, *, out):
    """The CPU's refusal of an `out` of another kind than the inputs' (a float cat into an integer
    tensor), a TypeError; PyTorch's meta kernel raises a RuntimeError with another message."""
    if tensors:
        dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
        if not torch.can_cast(dtype, out.dtype):
            raise TypeError(
                f"torch.cat(): input types can't be cast to the desired output type {scalar_type_name(out.dtype)}"
            )


def _cat_shape_check(tensors, dim=0, **_):
    """The CPU's first checks of cat, in its words (PyTorch's meta kernel has others, and an IndexError
    for 0-dim tensors): no 0-dim tensor, then each tensor's number of dims against the first one's
    (legacy empty 1-d tensors skipped). A compiled graph's tensors may have symbolic sizes: only a
    size known to be 0 counts as empty (no guard is added after tracing)."""
    for i, t in enumerate(tensors):
        if t.dim() == 0:
            raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")

    def legacy_empty(t):
        return t.dim() == 1 and type(t.shape[0]) is int and t.shape[0] == 0

    kept = [t for t in tensors if not legacy_empty(t)]
    for t in kept[1:]:
        if t.dim() != kept[0].dim():
            raise RuntimeError(f"Tensors must have same number of dimensions: got {kept[0].dim()} and {t.dim()}")
    if not kept or not -kept[0].dim() <= dim < kept[0].dim():
        return  # (a dim out of range: PyTorch's meta kernel raises the CPU's IndexError)
    d = dim % kept[0].dim()
    for i, t in enumerate(tensors):
        if legacy_empty(t):
            continue
        for k, (a, b) in enumerate(zip(kept[0].shape, t.shape)):
            if k != d and type(a) is int and type(b) is int and a != b:
                raise RuntimeError(
                    f"Sizes of tensors must match except in dimension {d}. Expected size {a} but got size {b} "
                    f"for tensor number {i} in the list."
                )


def _cat_out_check(tensors, dim=0, *, out):
    _cat_shape_check(tensors, dim)
    _cat_out_dtype_check(tensors, dim, out=out)


@lowering(
    "cat",
    host_check={"cat.out": out_overlaps_inputs_check},
    meta_check={"cat": _cat_shape_check, "cat.out": _cat_out_check},
)
def cat(tensors, dim=0):
    # PyTorch skips legacy empty 1-D tensors of shape (0,) when the others have more dims
    full = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not full:
        return tensors[0]
    dtype = jnp.result_type(*tensors)
    dim = dim % full[0].ndim
    return jnp.concatenate([t.astype(dtype) for t in full], axis=dim)


@lowering("stack")
def stack(tensors, dim=0):
    dtype = jnp.result_type(*tensors)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=dim % (tensors[0].ndim + 1))


@lowering("split_with_sizes_copy")
def split_with_sizes_copy(x, split_sizes, dim=0):
    dim = dim % x.ndim
    out, start = [], 0
    for n in split_sizes:
        out.append(lax.slice_in_dim(x, start, start + n, axis=dim))
        start += n
    return out


@lowering("split_copy.Tensor")
def split_copy(x, split_size, dim=0):
    dim = dim % x.ndim
    n = x.shape[dim]
    sizes = [min(split_size, n - s) for s in range(0, n, split_size)] if split_size else [n]
    return split_with_sizes_copy(x, sizes or [0], dim)


@lowering("unbind_copy.int")
def unbind_copy(x, dim=0):
    dim = dim % x.ndim
    return [lax.index_in_dim(x, i, axis=dim, keepdims=False) for i in range(x.shape[dim])]


# ---------------------------------------------------------------- padding
@lowering("constant_pad_nd")
def constant_pad_nd(x, pad, value=0):
    # pad pairs start at the last dim; negative pads crop (lax.pad allows both)
    cfg = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        cfg[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value).astype(x.dtype), cfg)


def _mode_pad(x, padding, mode):
    nd = len(padding) // 2
    widths = [(0, 0)] * (x.ndim - nd) + [(padding[2 * (nd - 1 - i)], padding[2 * (nd - 1 - i) + 1]) for i in range(nd)]
    # a negative width crops: pad by the positive parts, then slice the negative ones off
    out = jnp.pad(x, [(max(lo, 0), max(hi, 0)) for lo, hi in widths], mode=mode)
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        out = out[tuple(slice(-min(lo, 0), out.shape[d] + min(hi, 0)) for d, (lo, hi) in enumerate(widths))]
    return out


def _pad_backward(grad, x, padding, mode):
    _, vjp = jax.vjp(lambda v: _mode_pad(v, padding, mode), to_opmath(x))
    return vjp(to_opmath(grad))[0].astype(x.dtype)


def _laid_out_as_input(*names, input_position=0):
    """meta= of ops whose CPU kernels lay the result out as their input suggests (a channels_last
    input, a channels_last result), where PyTorch's meta kernels make it contiguous."""

    def meta_of(name):
        op = getattr(torch.ops.aten, name).default

        def meta(*args):
            out = op(*args)
            layout = suggest_memory_format(args[input_position])
            if layout is torch.contiguous_format or out.dim() != args[input_position].dim():
                return out
            return out.contiguous(memory_format=layout)

        return meta

    return {name: meta_of(name) for name in names}


_PADS = ("reflection_pad1d", "reflection_pad2d", "reflection_pad3d")
_REPLICATION = ("replication_pad1d", "replication_pad2d", "replication_pad3d")


@lowering(*_PADS, meta=_laid_out_as_input(*_PADS), no_loop_for=(torch.bool, *WIDE_UNSIGNED))
def reflection_pad(x, padding):
    return _mode_pad(x, padding, "reflect")


@lowering(*_REPLICATION, meta=_laid_out_as_input(*_REPLICATION), no_loop_for=(torch.bool, *WIDE_UNSIGNED))
def replication_pad(x, padding):
    return _mode_pad(x, padding, "edge")


# the gradient is laid out as the input (not as the incoming gradient), as on the CPU
@lowering(
    *(n + "_backward" for n in _PADS), meta=_laid_out_as_input(*(n + "_backward" for n in _PADS), input_position=1)
)
def reflection_pad_backward(grad, x, padding):
    return _pad_backward(grad, x, padding, "reflect")


@lowering(
    *(n + "_backward" for n in _REPLICATION),
    meta=_laid_out_as_input(*(n + "_backward" for n in _REPLICATION), input_position=1),
)
def replication_pad_backward(grad, x, padding):
    return _pad_backward(grad, x, padding, "edge")


# ---------------------------------------------------------------- rearrangements
def _flip_loop_check(a, dims, *_, **__):
    """The CPU's flip has no loop for uint16/32/64 where it flips the innermost dimension (flipping
    only outer ones moves whole rows, for any dtype)."""
    if a.dtype in WIDE_UNSIGNED and (a.dim() == 0 or a.dim() - 1 in {d % a.dim() for d in dims}):
        from .dtypes import not_implemented_for

        raise not_implemented_for("flip", a.dtype)


@lowering("flip", meta_check=dict.fromkeys(("flip", "flip.out"), _flip_loop_check))
def flip(x, dims):
    return jnp.flip(x, axis=tuple(d % x.ndim for d in dims)) if x.ndim else x


def _roll_alignment_check(x, shifts, dims=()):
    # the CPU compares the lengths before it wraps the dims (PyTorch's meta wraps them first)
    if len(shifts) and len(shifts) != len(dims) and not (len(dims) == 0 and len(shifts) == 1):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:{len(dims)}")


@lowering("roll", meta_check=_roll_alignment_check)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(d % x.ndim for d in dims))


@lowering("repeat")
def repeat(x, repeats):
    return jnp.tile(x, tuple(repeats))


@lowering("tril", no_loop_for=WIDE_UNSIGNED)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowering("triu", no_loop_for=WIDE_UNSIGNED)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lowering("diag_embed")
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    n = x.shape[-1] + abs(offset)
    idx = jnp.arange(x.shape[-1])
    rows, cols = idx + max(-offset, 0), idx + max(offset, 0)
    out = jnp.zeros(x.shape[:-1] + (n, n), x.dtype).at[..., rows, cols].set(x)
    nd = x.ndim + 1
    d1, d2 = dim1 % nd, dim2 % nd
    return jnp.moveaxis(out, (-2, -1), (d1, d2))


@lowering("pixel_shuffle", meta=_laid_out_as_input("pixel_shuffle"), no_loop_for=WIDE_UNSIGNED)
def pixel_shuffle(x, r):
    *lead, c, h, w = x.shape
    oc = c // (r * r)
    y = x.reshape(tuple(lead) + (oc, r, r, h, w))
    n = len(lead)
    y = jnp.transpose(y, tuple(range(n)) + (n, n + 3, n + 1, n + 4, n + 2))
    return y.reshape(tuple(lead) + (oc, h * r, w * r))


@lowering("pixel_unshuffle", no_loop_for=WIDE_UNSIGNED)
def pixel_unshuffle(x, r):
    *lead, c, h, w = x.shape
    n = len(lead)
    y = x.reshape(tuple(lead) + (c, h // r, r, w // r, r))
    y = jnp.transpose(y, tuple(range(n)) + (n, n + 2, n + 4, n + 1, n + 3))
    return y.reshape(tuple(lead) + (c * r * r, h // r, w // r))


# ---------------------------------------------------------------- patches
def _im2col(x, kernel_size, dilation, padding, stride):
    batched = x.ndim == 4
    if not batched:
        x = x[None]
    n, c, h, w = x.shape
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel_size, dilation, padding, stride
    oh = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    ow = (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    xp = jnp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = [
        xp[:, :, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw]
        for i in range(kh)
        for j in range(kw)
    ]
    out = jnp.stack(cols, axis=2).reshape(n, c * kh * kw, oh * ow)
    return out if batched else out[0]


@lowering("im2col", no_loop_for=INTEGERS)  # (bool has a loop)
def im2col(x, kernel_size, dilation, padding, stride):
    return _im2col(x, kernel_size, dilation, padding, stride)


@lowering("col2im")
def col2im(cols, output_size, kernel_size, dilation, padding, stride):
    # col2im is the adjoint of im2col: the VJP of im2col at any point
    batched = cols.ndim == 3
    n = cols.shape[0] if batched else 1
    kh, kw = kernel_size
    c = (cols.shape[1] if batched else cols.shape[0]) // (kh * kw)
    shape = ((n,) if batched else ()) + (c,) + tuple(output_size)
    zero = jnp.zeros(shape, to_opmath(cols).dtype)
    _, vjp = jax.vjp(lambda v: _im2col(v, kernel_size, dilation, padding, stride), zero)
    return vjp(to_opmath(cols))[0].astype(cols.dtype)


# ---------------------------------------------------------------- resampling
def _scale(n_in, n_out, align_corners, scale):
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n_in / n_out


def _nearest_index(n_in, n_out, scale, exact):
    s = np.float32(_scale(n_in, n_out, False, scale))
    dst = np.arange(n_out, dtype=np.float32)
    src = np.floor((dst + np.float32(0.5)) * s if exact else dst * s).astype(np.int64)
    return np.minimum(src, n_in - 1)


def _nearest(x, output_size, scales, exact):
    nd = len(output_size)
    for i, n_out in enumerate(output_size):
        ax = x.ndim - nd + i
        x = jnp.take(x, jnp.asarray(_nearest_index(x.shape[ax], n_out, scales[i], exact)), axis=ax)
    return x


def _weight_dtype(x):
    """The dtype PyTorch's CPU kernels compute resampling positions and weights in: double for
    float64 data, float for everything else (half types compute in float)."""
    return np.float64 if x.dtype == jnp.float64 else np.float32


def _linear_weights(n_in, n_out, align_corners, scale, dtype=np.float32):
    s = dtype(_scale(n_in, n_out, align_corners, scale))
    dst = np.arange(n_out, dtype=dtype)
    src = s * dst if align_corners else np.maximum(s * (dst + dtype(0.5)) - dtype(0.5), 0)
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    l1 = (src - i0).astype(dtype)
    return i0, i1, 1 - l1, l1


def _pass_order(x, nd):
    """The resampled dimensions in the order the CPU's kernel passes over them: uint8 images go
    through its separable integer kernel, width first."""
    return range(nd - 1, -1, -1) if x.dtype == jnp.uint8 else range(nd)


def _pass_result(x, y):
    """One pass's result: a uint8 image's is rounded half up and saturated, as the CPU's fixed-point
    uint8 kernel stores each pass (a cubic's overshoot clamps before the next pass)."""
    return jnp.clip(jnp.floor(y + 0.5), 0, 255) if x.dtype == jnp.uint8 else y


# the CPU's resampling kernels with a uint8 loop (images); its others take floating inputs only
_UINT8_RESAMPLING = ("upsample_bilinear2d", "upsample_bicubic2d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa")


def _resample_has_loop(x, kernel):
    """Integer inputs other than the CPU's uint8 images have no resampling loop on the CPU (nor CUDA)."""
    return x.is_floating_point() or x.is_complex() or (x.dtype == torch.uint8 and kernel in _UINT8_RESAMPLING)


def _resample_input_check(*kernels):
    return input_loop_check(kernels, _resample_has_loop)


def _linear(x, output_size, align_corners, scales):
    nd = len(output_size)
    y = to_opmath(x)
    for i in _pass_order(x, nd):
        n_out = output_size[i]
        ax = y.ndim - nd + i
        i0, i1, l0, l1 = _linear_weights(y.shape[ax], n_out, align_corners, scales[i], _weight_dtype(x))
        shape = [1] * y.ndim
        shape[ax] = n_out
        y = jnp.take(y, jnp.asarray(i0), axis=ax) * jnp.asarray(l0).reshape(shape) + jnp.take(
            y, jnp.asarray(i1), axis=ax
        ) * jnp.asarray(l1).reshape(shape)
        y = _pass_result(x, y)
    return y.astype(x.dtype)


def _same(v):
    return v


# Keys' cubic convolution kernel, PyTorch's form and operation order; `r` rounds after every step
# (the grid sampler's half types do that on the CPU), identity otherwise.
def _cubic_near(u, a, r=_same):  # |u| <= 1
    return r(r(r(r(r((a + 2) * u) - (a + 3)) * u) * u) + 1)


def _cubic_far(u, a, r=_same):  # 1 < |u| < 2
    return r(r(r(r(r(r(a * u) - 5 * a) * u) + 8 * a) * u) - 4 * a)


def cubic_coeffs(t, a=-0.75, r=_same):
    """Weights of the 4 taps around a point at fraction t."""
    return _cubic_far(r(t + 1), a, r), _cubic_near(t, a, r), _cubic_near(r(1 - t), a, r), _cubic_far(r(2 - t), a, r)


def _bicubic(x, output_size, align_corners, scales):
    y = to_opmath(x)
    dtype = _weight_dtype(x)
    for i in _pass_order(x, 2):
        n_out = output_size[i]
        ax = y.ndim - 2 + i
        n_in = y.shape[ax]
        s = dtype(_scale(n_in, n_out, align_corners, scales[i]))
        dst = np.arange(n_out, dtype=dtype)
        src = s * dst if align_corners else s * (dst + dtype(0.5)) - dtype(0.5)
        f = np.floor(src)
        t = (src - f).astype(dtype)
        f = f.astype(np.int64)
        shape = [1] * y.ndim
        shape[ax] = n_out
        acc = 0
        for k, c in enumerate(cubic_coeffs(t)):
            idx = np.clip(f - 1 + k, 0, n_in - 1)
            acc = acc + jnp.take(y, jnp.asarray(idx), axis=ax) * jnp.asarray(c.astype(dtype)).reshape(shape)
        y = _pass_result(x, acc)
    return y.astype(x.dtype)


def _resample_backward(fn, grad, input_size):
    zero = jnp.zeros(tuple(input_size), to_opmath(grad).dtype)
    _, vjp = jax.vjp(fn, zero)
    return vjp(to_opmath(grad))[0].astype(grad.dtype)


def _scales(scales, output_size):
    """The optional scale factors, one per resampled dimension (output_size has one size per dimension)."""
    nd = len(output_size)
    return (list(scales) + [None] * nd)[:nd]


# the CPU's nearest kernels (and CUDA's) have loops for the floating types and uint8 only (images)
NEAREST_NO_LOOP = tuple(t for t in NOT_FLOATING if t != torch.uint8)


@lowering(
    "upsample_nearest1d",
    "upsample_nearest2d",
    "upsample_nearest3d",
    real_only=True,
    no_loop_for=NEAREST_NO_LOOP,
)
def upsample_nearest(x, output_size, *scales):
    return _nearest(x, output_size, _scales(scales, output_size), False)


@lowering(
    "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d",
    "_upsample_nearest_exact3d",
    real_only=True,
    no_loop_for=NEAREST_NO_LOOP,
)
def upsample_nearest_exact(x, output_size, *scales):
    return _nearest(x, output_size, _scales(scales, output_size), True)


@lowering("upsample_nearest1d_backward", "upsample_nearest2d_backward", "upsample_nearest3d_backward")
def upsample_nearest_backward(grad, output_size, input_size, *scales):
    sc = _scales(scales, output_size)
    return _resample_backward(lambda v: _nearest(v, output_size, sc, False), grad, input_size)


@lowering(
    "_upsample_nearest_exact1d_backward", "_upsample_nearest_exact2d_backward", "_upsample_nearest_exact3d_backward"
)
def upsample_nearest_exact_backward(grad, output_size, input_size, *scales):
    sc = _scales(scales, output_size)
    return _resample_backward(lambda v: _nearest(v, output_size, sc, True), grad, input_size)


@lowering(
    "upsample_linear1d",
    "upsample_bilinear2d",
    "upsample_trilinear3d",
    real_only=True,
    meta_check=_resample_input_check("upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d"),
)
def upsample_linear(x, output_size, align_corners, *scales):
    return _linear(x, output_size, align_corners, _scales(scales, output_size))


@lowering("upsample_linear1d_backward", "upsample_bilinear2d_backward", "upsample_trilinear3d_backward")
def upsample_linear_backward(grad, output_size, input_size, align_corners, *scales):
    sc = _scales(scales, output_size)
    return _resample_backward(lambda v: _linear(v, output_size, align_corners, sc), grad, input_size)


@lowering("upsample_bicubic2d", real_only=True, meta_check=_resample_input_check("upsample_bicubic2d"))
def upsample_bicubic2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _bicubic(x, output_size, align_corners, (scales_h, scales_w))


@lowering("upsample_bicubic2d_backward")
def upsample_bicubic2d_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _resample_backward(lambda v: _bicubic(v, output_size, align_corners, (scales_h, scales_w)), grad, input_size)


def _aa_weights(n_in, n_out, align_corners, scale_arg, interp_size, kernel, dtype):
    """PyTorch's antialiased resampling weights along one axis, an (n_out, n_in) matrix: each output
    averages the inputs under a kernel stretched by the downscale factor (PIL's method)."""
    scale = dtype(_scale(n_in, n_out, align_corners, scale_arg))
    support = dtype(interp_size * 0.5 * scale) if scale >= 1.0 else dtype(interp_size * 0.5)
    invscale = dtype(1.0) / scale if scale >= 1.0 else dtype(1.0)
    w = np.zeros((n_out, n_in), dtype)
    for i in range(n_out):
        center = scale * dtype(i + 0.5)
        lo = max(int(center - support + dtype(0.5)), 0)
        size = min(int(center + support + dtype(0.5)), n_in) - lo
        taps = np.array([kernel((dtype(j + lo) - center + dtype(0.5)) * invscale) for j in range(size)], dtype)
        total = taps.sum(dtype=dtype)
        w[i, lo : lo + size] = taps / total if total != 0 else taps
    return w


def _aa_triangle(x):
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def _aa_cubic(x, a=-0.5):
    x = abs(x)
    return _cubic_near(x, a) if x < 1.0 else _cubic_far(x, a) if x < 2.0 else 0.0


def _resample_aa(x, output_size, align_corners, scales, interp_size, kernel):
    np_dtype = np.float64 if x.dtype == jnp.float64 else np.float32
    y = x.astype(jnp.float64 if x.dtype == jnp.float64 else jnp.float32)
    for i in (1, 0):  # width first, then height, as PyTorch's separable passes
        ax = y.ndim - 2 + i
        w = _aa_weights(y.shape[ax], output_size[i], align_corners, scales[i], interp_size, kernel, np_dtype)
        y = jnp.moveaxis(jnp.tensordot(y, jnp.asarray(w), axes=([ax], [1]), precision=lax.Precision.HIGHEST), -1, ax)
        y = _pass_result(x, y)
    return y.astype(x.dtype)


@lowering("_upsample_bilinear2d_aa", real_only=True, meta_check=_resample_input_check("_upsample_bilinear2d_aa"))
def upsample_bilinear2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _resample_aa(x, output_size, align_corners, (scales_h, scales_w), 2, _aa_triangle)


@lowering("_upsample_bilinear2d_aa_backward")
def upsample_bilinear2d_aa_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _resample_backward(
        lambda v: _resample_aa(v, output_size, align_corners, (scales_h, scales_w), 2, _aa_triangle), grad, input_size
    )


@lowering("_upsample_bicubic2d_aa", real_only=True, meta_check=_resample_input_check("_upsample_bicubic2d_aa"))
def upsample_bicubic2d_aa(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _resample_aa(x, output_size, align_corners, (scales_h, scales_w), 4, _aa_cubic)


@lowering("_upsample_bicubic2d_aa_backward")
def upsample_bicubic2d_aa_backward(grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    return _resample_backward(
        lambda v: _resample_aa(v, output_size, align_corners, (scales_h, scales_w), 4, _aa_cubic), grad, input_size
    )


@lowering("unfold_backward")
def unfold_backward(grad, input_sizes, dim, size, step):
    """The gradient of `x.unfold(dim, size, step)`: each window's values added back where it was read
    (windows overlap when step < size)."""
    if not input_sizes:  # a 0-d input unfolds into one window of size 1 (or 0: PyTorch gives shape (0,))
        return jnp.sum(grad).astype(grad.dtype) if size else jnp.zeros((0,), grad.dtype)
    dim = dim % len(input_sizes)
    length = input_sizes[dim]
    # grad: input_sizes with dim replaced by the window count, then the window's own dimension; its
    # size-1 dims other than those two broadcast as on the CPU (istft's reference passes (1, windows, size))
    windows = grad.shape[dim]
    grad = jnp.broadcast_to(grad, (*input_sizes[:dim], windows, *input_sizes[dim + 1 :], grad.shape[-1]))
    g = jnp.moveaxis(grad, (dim, grad.ndim - 1), (0, 1))  # (windows, size, rest...)
    rest = g.shape[2:]
    positions = (np.arange(windows)[:, None] * step + np.arange(size)[None, :]).reshape(-1)
    out = jnp.zeros((length, *rest), grad.dtype).at[positions].add(g.reshape(windows * size, *rest))
    return jnp.moveaxis(out, 0, dim).reshape(tuple(input_sizes))
