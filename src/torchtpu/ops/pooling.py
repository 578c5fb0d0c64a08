"""Lowerings: max, average, adaptive and fractional pooling, with their backward ops."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .argument_checks import deterministic_alert
from .checks import require
from .dtypes import NOT_FLOATING, WIDE_UNSIGNED, not_implemented_for, to_opmath
from .nn_common import _grad_input_meta, _low
from .table import lowering, real_only_without_lowering

# the CPU's average pools have integer loops for int64 only
_AVG_NO_LOOP = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, *WIDE_UNSIGNED)
_UNPOOL_NO_LOOP = (*NOT_FLOATING, torch.complex64, torch.complex128)


def _tuple(v, nd, default=None):
    if v is None or len(v) == 0:
        return tuple(default) if default is not None else None
    return tuple(v) * nd if len(v) == 1 else tuple(v)


def _pool_out(size, k, s, p, d, ceil):
    """PyTorch's pooling_output_shape."""
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)
    out = num // s + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def _windows(x, nd, k, s, p, d, ceil, fill):
    """The pooling windows of the last `nd` dims: (..., prod(k), *out) with `fill` in the padding,
    and the per-dim output sizes."""
    outs = [_pool_out(n, kk, ss, pp, dd, ceil) for n, kk, ss, pp, dd in zip(x.shape[-nd:], k, s, p, d)]
    pads = [(0, 0)] * (x.ndim - nd)
    for n, kk, ss, pp, dd, o in zip(x.shape[-nd:], k, s, p, d, outs):
        pads.append((pp, max(0, (o - 1) * ss + dd * (kk - 1) + 1 - n - pp)))
    xp = jnp.pad(x, pads, constant_values=fill)
    lead = x.shape[:-nd]
    slices = []
    for offs in _product([range(kk) for kk in k]):
        idx = tuple(slice(o * dd, o * dd + (out - 1) * ss + 1, ss) for o, dd, ss, out in zip(offs, d, s, outs))
        slices.append(xp[(Ellipsis,) + idx])
    return jnp.stack(slices, axis=len(lead)), outs


def _product(ranges):
    import itertools

    return list(itertools.product(*ranges))


def _max_pool(x, nd, kernel_size, stride, padding, dilation, ceil_mode):
    k = _tuple(kernel_size, nd)
    s = _tuple(stride, nd, k)
    p, d = _tuple(padding, nd), _tuple(dilation, nd)
    fill = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    win, outs = _windows(x, nd, k, s, p, d, ceil_mode, fill)
    ax = x.ndim - nd
    # NaN wins, as in PyTorch's kernels; the first maximum wins ties
    isnan = jnp.isnan(win) if jnp.issubdtype(x.dtype, jnp.floating) else None
    arg = (
        jnp.argmax(win, axis=ax)
        if isnan is None
        else jnp.where(jnp.any(isnan, axis=ax), jnp.argmax(isnan, axis=ax), jnp.argmax(win, axis=ax))
    )
    out = jnp.take_along_axis(win, jnp.expand_dims(arg, ax), axis=ax).squeeze(ax)
    # the flat index of the winner inside the input's spatial plane
    offs = jnp.asarray(_product([range(kk) for kk in k]), jnp.int64)  # (K, nd)
    flat = jnp.zeros(arg.shape, jnp.int64)
    for i in range(nd):
        shape = [1] * arg.ndim
        shape[ax + i] = outs[i]
        pos = (jnp.arange(outs[i], dtype=jnp.int64) * s[i] - p[i]).reshape(shape) + offs[arg, i] * d[i]
        flat = flat * x.shape[ax + i] + pos
    return out, flat


def _max_pool_backward(grad, x, nd, indices):
    lead = x.shape[:-nd]
    plane = math.prod(x.shape[-nd:])
    g = grad.reshape((-1, math.prod(grad.shape[-nd:])))
    idx = indices.reshape(g.shape)
    rows = jnp.arange(g.shape[0])[:, None]
    out = jnp.zeros((g.shape[0], plane), jnp.float32 if _low(grad) else grad.dtype).at[rows, idx].add(g)
    return out.reshape(lead + x.shape[-nd:]).astype(x.dtype)


def _fractional_starts(sample, n_in, n_out, pool, dtype):
    """PyTorch's pseudo-random window starts along one axis, from one uniform sample per plane."""
    if n_out == 1:
        return jnp.full(sample.shape + (1,), n_in - pool, jnp.int64)
    alpha = jnp.asarray(n_in - pool, dtype) / jnp.asarray(n_out - 1, dtype)
    i = jnp.arange(n_out - 1, dtype=dtype)
    s = sample.astype(dtype)[..., None]
    starts = jnp.trunc((i + s) * alpha).astype(jnp.int64) - jnp.trunc(s * alpha).astype(jnp.int64)
    return jnp.concatenate([starts, jnp.full(sample.shape + (1,), n_in - pool, jnp.int64)], axis=-1)


def _fractional_max_pool(x, nd, kernel_size, output_size, samples):
    batched = x.ndim == nd + 2
    xb = x if batched else x[None]
    n, c = xb.shape[:2]
    spatial = xb.shape[2:]
    dtype = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    # samples hold (W, H) for 2-D and (T, H, W) for 3-D, as PyTorch's CPU kernels read them
    order = (1, 0) if nd == 2 else (0, 1, 2)
    # (batch, plane, dim) as CUDA indexes them: a 3-D input may come with the samples of a larger
    # batch (FractionalMaxPool3d's unbatched inputs), of which the first row serves
    samples = samples[:n, :c] if samples.ndim == 3 else samples.reshape(n, c, nd)
    gathered = xb.reshape(n, c, -1)
    flat = jnp.zeros((n, c) + tuple(output_size) + tuple(kernel_size), jnp.int64)
    for d in range(nd):
        starts = _fractional_starts(samples[..., order[d]], spatial[d], output_size[d], kernel_size[d], dtype)
        pos = starts[..., :, None] + jnp.arange(kernel_size[d])  # (n, c, out_d, k_d)
        shape = [n, c] + [1] * (2 * nd)
        shape[2 + d], shape[2 + nd + d] = output_size[d], kernel_size[d]
        flat = flat * spatial[d] + pos.reshape(shape)
    window = flat.reshape((n, c) + tuple(output_size) + (-1,))  # row-major window order
    vals = jnp.take_along_axis(gathered, window.reshape(n, c, -1), axis=2).reshape(window.shape)
    # the first maximum wins ties; a NaN beats every number (PyTorch: `val > max || isnan(val)`)
    key = jnp.where(jnp.isnan(vals), jnp.inf, vals) if jnp.issubdtype(vals.dtype, jnp.floating) else vals
    first_nan = jnp.argmax(jnp.isnan(vals), axis=-1) if jnp.issubdtype(vals.dtype, jnp.floating) else None
    arg = jnp.argmax(key, axis=-1)
    if first_nan is not None:
        arg = jnp.where(jnp.any(jnp.isnan(vals), axis=-1), first_nan, arg)
    out = jnp.take_along_axis(vals, arg[..., None], axis=-1)[..., 0]
    idx = jnp.take_along_axis(window, arg[..., None], axis=-1)[..., 0]
    return (out, idx) if batched else (out[0], idx[0])


@lowering("fractional_max_pool2d")
def fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, 2, kernel_size, output_size, random_samples)


@lowering("fractional_max_pool3d")
def fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, 3, kernel_size, output_size, random_samples)


@lowering("fractional_max_pool2d_backward")
def fractional_max_pool2d_backward(grad, x, kernel_size, output_size, indices):
    return _max_pool_backward(grad, x, 2, indices)


@lowering("fractional_max_pool3d_backward", missing_meta=_grad_input_meta)
def fractional_max_pool3d_backward(grad, x, kernel_size, output_size, indices):
    return _max_pool_backward(grad, x, 3, indices)


@lowering("max_pool2d_with_indices", real_only=True, no_loop_for=(torch.bool, *WIDE_UNSIGNED))
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lowering("max_pool3d_with_indices", real_only=True, no_loop_for=(torch.bool, *WIDE_UNSIGNED))
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, ceil_mode)


@lowering("max_pool2d_with_indices_backward")
def max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(grad, x, 2, indices)


@lowering("max_pool3d_with_indices_backward")
def max_pool3d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _max_pool_backward(grad, x, 3, indices)


@lowering("adaptive_max_pool2d_backward")
def adaptive_max_pool2d_backward(grad, x, indices):
    return _max_pool_backward(grad, x, 2, indices)


@lowering("adaptive_max_pool3d_backward")
def adaptive_max_pool3d_backward(grad, x, indices):
    return _max_pool_backward(grad, x, 3, indices)


def _avg_pool(x, nd, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    k = _tuple(kernel_size, nd)
    s = _tuple(stride, nd, k)
    p = _tuple(padding, nd)
    d = (1,) * nd
    xf = to_opmath(x)
    win, outs = _windows(xf, nd, k, s, p, d, ceil_mode, 0)
    ax = x.ndim - nd
    total = jnp.sum(win, axis=ax)
    if divisor_override:
        return (total / divisor_override).astype(x.dtype)
    # count: ones over the input (and over the padding when it counts), zeros past it
    shape = x.shape[-nd:]
    if count_include_pad:
        ones = jnp.pad(jnp.ones(shape, xf.dtype), [(pp, pp) for pp in p], constant_values=1)
        cnt, _ = _windows_count(ones, nd, k, s, p, outs)
    else:
        cnt, _ = _windows(jnp.ones(shape, xf.dtype), nd, k, s, p, d, ceil_mode, 0)
    return (total / jnp.sum(cnt, axis=0)).astype(x.dtype)


def _windows_count(padded_ones, nd, k, s, p, outs):
    # ceil mode + count_include_pad: windows may run past the padding, where nothing counts
    pads = [(0, max(0, (o - 1) * ss + kk - n)) for n, kk, ss, o in zip(padded_ones.shape, k, s, outs)]
    xp = jnp.pad(padded_ones, pads)
    slices = []
    for offs in _product([range(kk) for kk in k]):
        slices.append(xp[tuple(slice(o, o + (out - 1) * ss + 1, ss) for o, ss, out in zip(offs, s, outs))])
    return jnp.stack(slices, 0), outs


def max_pool1d_dtype_check(x):
    """max_pool1d is composite: on the CPU, without a gradient, it runs `max_pool1d_impl`, which has
    floating loops only (an integer input raises); on other devices it takes max_pool2d_with_indices,
    which has integer loops on the CPU. tpu raises as the CPU (eager/kernels.py puts this check before
    the composite; bool and complex inputs already raise in max_pool2d_with_indices)."""
    if x.dtype in NOT_FLOATING and x.dtype != torch.bool:
        raise not_implemented_for("max_pool1d_impl", x.dtype)


# composite pools: they decompose into the lowered ones before reaching the backend
real_only_without_lowering(
    "avg_pool1d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool1d"
)


@lowering("avg_pool2d", real_only=True, no_loop_for=_AVG_NO_LOOP)
def avg_pool2d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowering("avg_pool3d", real_only=True, no_loop_for=(*_AVG_NO_LOOP, torch.float16, torch.bfloat16))
def avg_pool3d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _vjp_input(f, x, grad):
    xf = to_opmath(x)
    _, vjp = jax.vjp(f, xf)
    return vjp(to_opmath(grad))[0].astype(x.dtype)


@lowering("avg_pool2d_backward")
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _vjp_input(
        lambda v: _avg_pool(v, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override), x, grad
    )


@lowering("avg_pool3d_backward")
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _vjp_input(
        lambda v: _avg_pool(v, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override), x, grad
    )


def _bins(n_in, n_out):
    starts = [(i * n_in) // n_out for i in range(n_out)]
    ends = [-((-(i + 1) * n_in) // n_out) for i in range(n_out)]
    return starts, ends


def _adaptive_avg(x, nd, output_size):
    out = to_opmath(x)
    for i, o in enumerate(output_size):
        ax = x.ndim - nd + i
        starts, ends = _bins(x.shape[ax], o)
        m = np.zeros((x.shape[ax], o), np.float32)
        for j, (a, b) in enumerate(zip(starts, ends)):
            m[a:b, j] = 1.0 / (b - a)
        out = jnp.moveaxis(
            jnp.tensordot(out, jnp.asarray(m, out.dtype), axes=[[ax], [0]], precision=lax.Precision.HIGHEST), -1, ax
        )
    return out.astype(x.dtype)


@lowering("_adaptive_avg_pool2d", real_only=True, no_loop_for=(torch.bool, *WIDE_UNSIGNED))
def adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg(x, 2, output_size)


@lowering("_adaptive_avg_pool3d", real_only=True, no_loop_for=(torch.bool, *WIDE_UNSIGNED))
def adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg(x, 3, output_size)


@lowering("_adaptive_avg_pool2d_backward")
def adaptive_avg_pool2d_backward(grad, x):
    return _vjp_input(lambda v: _adaptive_avg(v, 2, grad.shape[-2:]), x, grad)


@lowering("_adaptive_avg_pool3d_backward")
def adaptive_avg_pool3d_backward(grad, x):
    return _vjp_input(lambda v: _adaptive_avg(v, 3, grad.shape[-3:]), x, grad)


def _adaptive_max(x, nd, output_size):
    ax = x.ndim - nd
    fill = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    win = x
    flat_parts = []
    for i, o in enumerate(output_size):
        n = x.shape[ax + i]
        starts, ends = _bins(n, o)
        kmax = max(b - a for a, b in zip(starts, ends))
        idx = np.minimum(np.asarray(starts)[:, None] + np.arange(kmax)[None, :], n - 1)  # (o, kmax)
        ok = (np.asarray(starts)[:, None] + np.arange(kmax)[None, :]) < np.asarray(ends)[:, None]
        flat_parts.append((idx, ok, n))
    # gather each dim into (o, kmax), giving (..., o1, k1, o2, k2, ...)
    for i, (idx, _ok, _n) in enumerate(flat_parts):
        a = ax + 2 * i
        win = jnp.take(win, jnp.asarray(idx.reshape(-1)), axis=a)
        win = win.reshape(win.shape[:a] + idx.shape + win.shape[a + 1 :])
    # move the window dims last and merge them
    o_axes = [ax + 2 * i for i in range(nd)]
    k_axes = [ax + 2 * i + 1 for i in range(nd)]
    win = jnp.transpose(win, list(range(ax)) + o_axes + k_axes)
    kshape = tuple(idx.shape[1] for idx, _, _ in flat_parts)
    win = win.reshape(win.shape[: ax + nd] + (-1,))
    mask = np.ones(tuple(output_size) + kshape, bool)
    flat = np.zeros(tuple(output_size) + kshape, np.int64)
    for i, (idx, ok, n) in enumerate(flat_parts):
        shape = [1] * (2 * nd)
        shape[i] = idx.shape[0]
        shape[nd + i] = idx.shape[1]
        mask = mask & ok.reshape(shape)
        flat = flat * n + idx.reshape(shape)
    mask = mask.reshape(tuple(output_size) + (-1,))
    flat = flat.reshape(tuple(output_size) + (-1,))
    win = jnp.where(jnp.asarray(mask), win, fill)
    if jnp.issubdtype(x.dtype, jnp.floating):
        isnan = jnp.isnan(win)
        arg = jnp.where(jnp.any(isnan, -1), jnp.argmax(isnan, -1), jnp.argmax(win, -1))
    else:
        arg = jnp.argmax(win, -1)
    out = jnp.take_along_axis(win, arg[..., None], -1)[..., 0]
    ind = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(flat), win.shape), arg[..., None], -1)[..., 0]
    return out, ind


@lowering("adaptive_max_pool2d", real_only=True, no_loop_for=NOT_FLOATING)
def adaptive_max_pool2d(x, output_size):
    return _adaptive_max(x, 2, output_size)


@lowering("adaptive_max_pool3d", real_only=True, no_loop_for=NOT_FLOATING)
def adaptive_max_pool3d(x, output_size):
    return _adaptive_max(x, 3, output_size)


def _max_unpool(x, indices, output_size):
    """Each (batch, channel) plane's values written at their flat positions in a zero plane of
    `output_size`; an index outside the plane is the CPU's error (a device-side assert here)."""
    dims = len(output_size)
    out_shape = (*x.shape[: x.ndim - dims], *output_size)
    plane = math.prod(output_size)
    if math.prod(out_shape) == 0 or x.size == 0:
        return jnp.zeros(out_shape, x.dtype)
    planes = math.prod(x.shape[: x.ndim - dims])
    at = indices.reshape(planes, -1)
    require(
        (at >= 0) & (at < plane),
        f"Found an invalid max index (output volumes are of size {'x'.join(map(str, output_size))})",
        recoverable=True,
    )
    rows = jnp.arange(planes)[:, None]
    out = jnp.zeros((planes, plane), x.dtype).at[rows, at].set(x.reshape(planes, -1), mode="drop")
    return out.reshape(out_shape)


# the CPU alerts: with duplicate indices (not from max_pool) which value lands is not defined
@lowering("max_unpool2d", host_check=deterministic_alert("max_unpooling2d_forward_out"), no_loop_for=_UNPOOL_NO_LOOP)
def max_unpool2d(x, indices, output_size):
    return _max_unpool(x, indices, tuple(output_size))


@lowering("max_unpool3d", host_check=deterministic_alert("max_unpooling3d_forward_out"), no_loop_for=_UNPOOL_NO_LOOP)
def max_unpool3d(x, indices, output_size, stride, padding):
    return _max_unpool(x, indices, tuple(output_size))
