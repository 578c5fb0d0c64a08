"""Lowerings: nn."""
from __future__ import annotations

import math

import jax
import numpy as np
import jax.numpy as jnp
import torch
from jax import lax

from .checks import require, require_index
from .shape import cubic_coeffs
from .table import KIND, lowering, real_only_without_lowering


def _f32(a):
    return a.astype(jnp.float32) if a.dtype in (jnp.float16, jnp.bfloat16) else a


@lowering("relu", promote=KIND.DEFAULT, real_only=True)
def relu(a):
    return jnp.maximum(a, 0)


@lowering("threshold", promote=KIND.DEFAULT, promote_args=(0,), real_only=True)
def threshold(a, threshold, value):
    return jnp.where(a <= threshold, value, a)


@lowering("threshold_backward", promote=KIND.DEFAULT, promote_args=(0, 1))
def threshold_backward(grad, a, threshold):
    return jnp.where(a <= threshold, 0, grad)


@lowering("gelu", promote=KIND.DEFAULT)
def gelu(a, approximate="none"):
    return jax.nn.gelu(a, approximate=approximate == "tanh")


@lowering("gelu_backward", promote=KIND.DEFAULT)
def gelu_backward(grad, a, approximate="none"):
    _, vjp = jax.vjp(lambda x: jax.nn.gelu(x, approximate=approximate == "tanh"), a)
    return vjp(grad)[0]


@lowering("silu", promote=KIND.DEFAULT)
def silu(a):
    return a * jax.nn.sigmoid(a)


@lowering("silu_backward", promote=KIND.DEFAULT)
def silu_backward(grad, a):
    s = jax.nn.sigmoid(a)
    return grad * s * (1 + a * (1 - s))


@lowering("sigmoid_backward", promote=KIND.DEFAULT)
def sigmoid_backward(grad, out):
    return grad * jnp.conj(out * (1 - out))   # conj: PyTorch's complex (Wirtinger) convention


@lowering("tanh_backward", promote=KIND.DEFAULT)
def tanh_backward(grad, out):
    return grad * jnp.conj(1 - out * out)


@lowering("_softmax", real_only=True)
def softmax(a, dim, half_to_float=False):
    out = jax.nn.softmax(_f32(a), axis=dim) if a.ndim else jnp.ones_like(_f32(a))
    return out if half_to_float else out.astype(a.dtype)


@lowering("_log_softmax", real_only=True)
def log_softmax(a, dim, half_to_float=False):
    out = jax.nn.log_softmax(_f32(a), axis=dim) if a.ndim else jnp.zeros_like(_f32(a))
    return out if half_to_float else out.astype(a.dtype)


@lowering("_softmax_backward_data")
def softmax_backward(grad, out, dim, input_dtype):
    g, o = _f32(grad), _f32(out)
    return (o * (g - jnp.sum(g * o, axis=dim if g.ndim else None, keepdims=True))).astype(input_dtype)


@lowering("_log_softmax_backward_data")
def log_softmax_backward(grad, out, dim, input_dtype):
    g, o = _f32(grad), _f32(out)
    return (g - jnp.exp(o) * jnp.sum(g, axis=dim if g.ndim else None, keepdims=True)).astype(input_dtype)


@lowering("native_layer_norm", real_only=True)
def native_layer_norm(a, normalized_shape, weight, bias, eps):
    axes = tuple(range(a.ndim - len(normalized_shape), a.ndim))
    x = _f32(a)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.astype(a.dtype), mean.astype(a.dtype), rstd.astype(a.dtype)


@lowering("native_layer_norm_backward")
def native_layer_norm_backward(grad, a, normalized_shape, mean, rstd, weight, bias, output_mask):
    axes = tuple(range(a.ndim - len(normalized_shape), a.ndim))

    # with the saved statistics: y = (x - mean) * rstd * w + b
    x = _f32(a)
    g = _f32(grad)
    xhat = (x - mean) * rstd
    gw = g * weight if weight is not None else g
    dx = rstd * (gw - jnp.mean(gw, axis=axes, keepdims=True)
                 - xhat * jnp.mean(gw * xhat, axis=axes, keepdims=True))
    batch_axes = tuple(range(a.ndim - len(normalized_shape)))
    dw = jnp.sum(g * xhat, axis=batch_axes) if weight is not None and output_mask[1] else None
    db = jnp.sum(g, axis=batch_axes) if bias is not None and output_mask[2] else None
    return (dx.astype(a.dtype) if output_mask[0] else None,
            dw.astype(weight.dtype) if dw is not None else None,
            db.astype(bias.dtype) if db is not None else None)


@lowering("embedding")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    _check_rows(indices, weight.shape[0])
    return jnp.take(weight, indices, axis=0)


@lowering("embedding_renorm")
def embedding_renorm(weight, indices, max_norm, norm_type):
    """The rows that `indices` name, scaled to norm max_norm where their norm exceeds it (as PyTorch:
    scale = max_norm / (norm + 1e-7)); other rows unchanged. `F.embedding(max_norm=)` calls it in place."""
    _check_rows(indices, weight.shape[0])
    w = _f32(weight)
    named = jnp.zeros((weight.shape[0],), jnp.bool_).at[indices.reshape(-1)].set(True)
    norm = jnp.linalg.norm(w, ord=norm_type, axis=-1)
    scale = jnp.where(named & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return (w * scale[:, None].astype(w.dtype)).astype(weight.dtype)


def _check_rows(indices, rows):
    require_index(indices, rows, False, f"index out of range in self (an embedding of {rows} rows takes "
                                        f"indices 0..{rows - 1})")


@lowering("embedding_dense_backward")
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    g = _f32(grad).reshape(-1, grad.shape[-1])
    idx = indices.reshape(-1)
    if padding_idx >= 0:
        g = jnp.where((idx == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), jnp.int64).at[idx].add(1)
        g = g / counts[idx][:, None]
    return jnp.zeros((num_weights, grad.shape[-1]), g.dtype).at[idx].add(g).astype(grad.dtype)


@lowering("nll_loss_forward", "nll_loss2d_forward", real_only=True)
def nll_loss_forward(a, target, weight, reduction, ignore_index):
    x = a if a.ndim > 1 else a[None]
    t = target if target.ndim else target[None]
    valid = t != ignore_index
    classes = x.shape[1]
    require(~valid | ((t >= 0) & (t < classes)),
            f"Target is out of bounds: class indices must be in 0..{classes - 1} (or ignore_index={ignore_index})")
    safe = jnp.where(valid, t, 0)
    picked = _f32(jnp.take_along_axis(x, jnp.expand_dims(safe, 1), axis=1).squeeze(1))
    w = _f32(weight)[safe] if weight is not None else jnp.ones_like(picked)
    w = jnp.where(valid, w, 0)
    losses = -picked * w
    if reduction == 0:
        return (losses if a.ndim > 1 else losses[0]).astype(a.dtype), jnp.zeros((), a.dtype)
    total = jnp.sum(w)   # accumulated in float32, also for half inputs
    if reduction == 1:
        return (jnp.sum(losses) / total).astype(a.dtype), total.astype(a.dtype)
    return jnp.sum(losses).astype(a.dtype), total.astype(a.dtype)


@lowering("nll_loss_backward", "nll_loss2d_backward")
def nll_loss_backward(grad, a, target, weight, reduction, ignore_index, total_weight):
    x = a if a.ndim > 1 else a[None]
    t = target if target.ndim else target[None]
    valid = t != ignore_index
    classes = x.shape[1]
    require(~valid | ((t >= 0) & (t < classes)),
            f"Target is out of bounds: class indices must be in 0..{classes - 1} (or ignore_index={ignore_index})")
    safe = jnp.where(valid, t, 0)
    w = weight[safe] if weight is not None else jnp.ones(safe.shape, a.dtype)
    w = jnp.where(valid, w, 0).astype(a.dtype)
    g = grad if reduction == 0 else jnp.broadcast_to(grad, w.shape)
    if reduction == 1:
        g = g / total_weight
    if reduction == 0 and a.ndim == 1:
        g = g[None]
    onehot = jax.nn.one_hot(safe, x.shape[1], dtype=a.dtype, axis=1)
    shape = (x.shape[0], 1) + x.shape[2:]
    out = -onehot * (g * w).reshape(shape)
    return out if a.ndim > 1 else out[0]


def _low(a):
    return a.dtype in (jnp.float16, jnp.bfloat16)


def _precision():
    from .linalg import precision
    return precision()


# ---------------------------------------------------------------- convolution
def _conv_dims(nd):
    spatial = "DHW"[3 - nd:] if nd <= 3 else None
    return ("NC" + spatial, "OI" + spatial, "NC" + spatial)


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    """PyTorch's convolution (no bias) on batched input: the output in float32 for half inputs."""
    nd = x.ndim - 2
    stride, padding, dilation = (list(v) * nd if len(v) == 1 else list(v)
                                 for v in (stride, padding, dilation))
    acc = jnp.float32 if _low(x) else None
    if not transposed:
        return lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding], rhs_dilation=dilation,
            feature_group_count=groups, dimension_numbers=_conv_dims(nd), precision=_precision(),
            preferred_element_type=acc)
    output_padding = list(output_padding) * nd if len(output_padding) == 1 else list(output_padding)
    # transposed: a dilated-input convolution with the kernel flipped and its in/out swapped per group
    cin, cout_g = w.shape[0], w.shape[1]
    k = w.shape[2:]
    w = w.reshape((groups, cin // groups, cout_g) + k)
    w = jnp.swapaxes(w, 1, 2).reshape((groups * cout_g, cin // groups) + k)
    w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op)
            for kk, d, p, op in zip(k, dilation, padding, output_padding)]
    return lax.conv_general_dilated(
        x, w, window_strides=[1] * nd, padding=pads, lhs_dilation=stride, rhs_dilation=dilation,
        feature_group_count=groups, dimension_numbers=_conv_dims(nd), precision=_precision(),
        preferred_element_type=acc)


@lowering("convolution", "convolution_overrideable")
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * (x.ndim - 2))
    return out.astype(x.dtype)


@lowering("convolution_backward", "convolution_backward_overrideable")
def convolution_backward(grad, x, w, *rest):
    if len(rest) == 8:   # convolution_backward: bias_sizes first
        _, stride, padding, dilation, transposed, output_padding, groups, mask = rest
    else:                # convolution_backward_overrideable has no bias_sizes
        stride, padding, dilation, transposed, output_padding, groups, mask = rest
    dtype = x.dtype
    acc = jnp.float32 if _low(x) else dtype

    def f(x_, w_):
        return _conv(x_, w_, stride, padding, dilation, transposed, output_padding, groups).astype(acc)

    _, vjp = jax.vjp(f, x, w)
    gx, gw = vjp(grad.astype(acc))
    gb = jnp.sum(grad.astype(acc), axis=(0,) + tuple(range(2, grad.ndim))).astype(dtype) if mask[2] else None
    return (gx.astype(dtype) if mask[0] else None, gw.astype(w.dtype) if mask[1] else None, gb)


# ---------------------------------------------------------------- pooling
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
    outs = [_pool_out(n, kk, ss, pp, dd, ceil) for n, kk, ss, pp, dd in
            zip(x.shape[-nd:], k, s, p, d)]
    pads = [(0, 0)] * (x.ndim - nd)
    for n, kk, ss, pp, dd, o in zip(x.shape[-nd:], k, s, p, d, outs):
        pads.append((pp, max(0, (o - 1) * ss + dd * (kk - 1) + 1 - n - pp)))
    xp = jnp.pad(x, pads, constant_values=fill)
    lead = x.shape[:-nd]
    slices = []
    for offs in _product([range(kk) for kk in k]):
        idx = tuple(slice(o * dd, o * dd + (out - 1) * ss + 1, ss)
                    for o, dd, ss, out in zip(offs, d, s, outs))
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
    arg = jnp.argmax(win, axis=ax) if isnan is None else jnp.where(
        jnp.any(isnan, axis=ax), jnp.argmax(isnan, axis=ax), jnp.argmax(win, axis=ax))
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
    samples = samples.reshape(n, c, nd)
    gathered = xb.reshape(n, c, -1)
    flat = jnp.zeros((n, c) + tuple(output_size) + tuple(kernel_size), jnp.int64)
    for d in range(nd):
        starts = _fractional_starts(samples[..., order[d]], spatial[d], output_size[d], kernel_size[d], dtype)
        pos = starts[..., :, None] + jnp.arange(kernel_size[d])                  # (n, c, out_d, k_d)
        shape = [n, c] + [1] * (2 * nd)
        shape[2 + d], shape[2 + nd + d] = output_size[d], kernel_size[d]
        flat = flat * spatial[d] + pos.reshape(shape)
    window = flat.reshape((n, c) + tuple(output_size) + (-1,))                  # row-major window order
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


def _grad_input_meta(grad, self, *args, **kwargs):
    """Meta kernel (PyTorch ships none) of a backward op whose result has its input's shape and dtype."""
    return torch.empty_like(self)


@lowering("fractional_max_pool3d_backward", missing_meta=_grad_input_meta)
def fractional_max_pool3d_backward(grad, x, kernel_size, output_size, indices):
    return _max_pool_backward(grad, x, 3, indices)


@lowering("max_pool2d_with_indices", real_only=True)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lowering("max_pool3d_with_indices", real_only=True)
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
    xf = _f32(x)
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


# composite pools: they decompose into the lowered ones before reaching the backend
real_only_without_lowering("avg_pool1d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
                           "adaptive_max_pool1d")


@lowering("avg_pool2d", real_only=True)
def avg_pool2d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowering("avg_pool3d", real_only=True)
def avg_pool3d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _vjp_input(f, x, grad):
    xf = _f32(x)
    _, vjp = jax.vjp(f, xf)
    return vjp(_f32(grad))[0].astype(x.dtype)


@lowering("avg_pool2d_backward")
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _vjp_input(lambda v: _avg_pool(v, 2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                          divisor_override), x, grad)


@lowering("avg_pool3d_backward")
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _vjp_input(lambda v: _avg_pool(v, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                          divisor_override), x, grad)


def _bins(n_in, n_out):
    starts = [(i * n_in) // n_out for i in range(n_out)]
    ends = [-((-(i + 1) * n_in) // n_out) for i in range(n_out)]
    return starts, ends


def _adaptive_avg(x, nd, output_size):
    out = _f32(x)
    for i, o in enumerate(output_size):
        ax = x.ndim - nd + i
        starts, ends = _bins(x.shape[ax], o)
        m = np.zeros((x.shape[ax], o), np.float32)
        for j, (a, b) in enumerate(zip(starts, ends)):
            m[a:b, j] = 1.0 / (b - a)
        out = jnp.moveaxis(jnp.tensordot(out, jnp.asarray(m, out.dtype), axes=[[ax], [0]],
                                         precision=lax.Precision.HIGHEST), -1, ax)
    return out.astype(x.dtype)


@lowering("_adaptive_avg_pool2d", real_only=True)
def adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg(x, 2, output_size)


@lowering("_adaptive_avg_pool3d", real_only=True)
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
    valid = None
    for i, o in enumerate(output_size):
        n = x.shape[ax + i]
        starts, ends = _bins(n, o)
        kmax = max(b - a for a, b in zip(starts, ends))
        idx = np.minimum(np.asarray(starts)[:, None] + np.arange(kmax)[None, :], n - 1)   # (o, kmax)
        ok = (np.asarray(starts)[:, None] + np.arange(kmax)[None, :]) < np.asarray(ends)[:, None]
        flat_parts.append((idx, ok, n))
    # gather each dim into (o, kmax), giving (..., o1, k1, o2, k2, ...)
    for i, (idx, ok, n) in enumerate(flat_parts):
        a = ax + 2 * i
        win = jnp.take(win, jnp.asarray(idx.reshape(-1)), axis=a)
        win = win.reshape(win.shape[:a] + idx.shape + win.shape[a + 1:])
    # move the window dims last and merge them
    o_axes = [ax + 2 * i for i in range(nd)]
    k_axes = [ax + 2 * i + 1 for i in range(nd)]
    win = jnp.transpose(win, list(range(ax)) + o_axes + k_axes)
    kshape = tuple(idx.shape[1] for idx, _, _ in flat_parts)
    win = win.reshape(win.shape[:ax + nd] + (-1,))
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


@lowering("adaptive_max_pool2d", real_only=True)
def adaptive_max_pool2d(x, output_size):
    return _adaptive_max(x, 2, output_size)


@lowering("adaptive_max_pool3d", real_only=True)
def adaptive_max_pool3d(x, output_size):
    return _adaptive_max(x, 3, output_size)


# ---------------------------------------------------------------- normalization
def _bn_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


def _bn_apply(x, weight, bias, mean, invstd):
    """(x - mean) * invstd * weight + bias in float32 (float64 for float64 input), statistics per
    channel (dim 1)."""
    s = _bn_shape(x)
    xf = _f32(x)
    out = (xf - mean.astype(xf.dtype).reshape(s)) * invstd.astype(xf.dtype).reshape(s)
    if weight is not None:
        out = out * weight.astype(xf.dtype).reshape(s)
    if bias is not None:
        out = out + bias.astype(xf.dtype).reshape(s)
    return out


def _bn_stats(x, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    xf = _f32(x)
    mean = jnp.mean(xf, axis=axes)
    var = jnp.mean(jnp.square(xf - mean.reshape(_bn_shape(x))), axis=axes)
    return mean, var, lax.rsqrt(var + eps)


def _bn_update(running, stat, momentum):
    return (running.astype(stat.dtype) * (1 - momentum) + stat * momentum).astype(running.dtype)


def _bn_forward(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new running_mean or None, new running_var or None)."""
    if training:
        mean, var, invstd = _bn_stats(x, eps)
        n = x.size // x.shape[1]
        rm = _bn_update(running_mean, mean, momentum) if running_mean is not None else None
        rv = _bn_update(running_var, var * (n / max(n - 1, 1)), momentum) if running_var is not None else None
        return _bn_apply(x, weight, bias, mean, invstd).astype(x.dtype), mean, invstd, rm, rv
    acc = _f32(x).dtype
    invstd = lax.rsqrt(running_var.astype(acc) + eps)
    out = _bn_apply(x, weight, bias, running_mean, invstd).astype(x.dtype)
    # Eval mode's saved statistics follow CUDA and PyTorch's meta kernel (which fake tensors under
    # torch.compile use on every device): running_mean and 1/sqrt(running_var + eps), shape (C,), in
    # the accumulation dtype (float32 for half types). The CPU kernel returns empty (0,) tensors in
    # the input dtype instead; nothing reads them (the backward in eval mode uses the running stats).
    return out, running_mean.astype(acc), invstd, running_mean, running_var


def _drop_none(*values):
    return tuple(v for v in values if v is not None)


@lowering("native_batch_norm", mutates=((3, "running_mean"), (4, "running_var")), real_only=True)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    out, mean, invstd, rm, rv = _bn_forward(x, weight, bias, running_mean, running_var, training, momentum, eps)
    return (out, mean, invstd) + _drop_none(rm, rv)


@lowering("_native_batch_norm_legit", real_only=True)
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering("_native_batch_norm_legit.no_stats", real_only=True)
def native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    return _bn_forward(x, weight, bias, None, None, True, momentum, eps)[:3]


@lowering("_native_batch_norm_legit_functional")
def native_batch_norm_legit_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _bn_forward(x, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering("_native_batch_norm_legit_no_training", real_only=True)
def native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _bn_forward(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lowering("_batch_norm_with_update", real_only=True)
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, rm, rv = _bn_forward(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8), rm, rv


@lowering("_batch_norm_no_update", real_only=True)
def batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    if running_mean is None:
        out, mean, invstd, _, _ = _bn_forward(x, weight, bias, None, None, True, momentum, eps)
    else:
        out, mean, invstd, _, _ = _bn_forward(x, weight, bias, running_mean, running_var, False, momentum, eps)
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8)


def _bn_backward(grad, x, weight, running_mean, running_var, train, eps, mask):
    acc = _f32(x).dtype
    w = weight if weight is not None else jnp.ones((x.shape[1],), acc)
    b = jnp.zeros((x.shape[1],), acc)

    def f(x_, w_, b_):
        if train:
            mean, _, invstd = _bn_stats(x_, eps)
        else:
            mean, invstd = running_mean, lax.rsqrt(running_var.astype(acc) + eps)
        return _bn_apply(x_, w_, b_, mean, invstd)

    _, vjp = jax.vjp(f, _f32(x), w.astype(acc), b)
    gx, gw, gb = vjp(_f32(grad))
    return (gx.astype(x.dtype) if mask[0] else None,
            gw.astype(w.dtype) if mask[1] else None,
            gb.astype(w.dtype) if mask[2] else None)


@lowering("native_batch_norm_backward")
def native_batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_invstd, train,
                               eps, output_mask):
    return _bn_backward(grad, x, weight, running_mean, running_var, train, eps, output_mask)


@lowering("batch_norm_backward")
def batch_norm_backward(grad, x, weight, running_mean, running_var, save_mean, save_var, update, eps,
                        output_mask, reserve):
    train = update or running_mean is None
    return _bn_backward(grad, x, weight, running_mean, running_var, train, eps, output_mask)


def _group_norm(x, weight, bias, n, c, hxw, group, eps):
    xf = _f32(x).reshape(n, group, -1)
    mean = jnp.mean(xf, axis=-1)
    var = jnp.mean(jnp.square(xf - mean[..., None]), axis=-1)
    rstd = lax.rsqrt(var + eps)
    out = ((xf - mean[..., None]) * rstd[..., None]).reshape(n, c, -1)
    if weight is not None:
        out = out * weight.astype(jnp.float32)[None, :, None]
    if bias is not None:
        out = out + bias.astype(jnp.float32)[None, :, None]
    return out.reshape(x.shape), mean, rstd


@lowering("native_group_norm", real_only=True)
def native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    out, mean, rstd = _group_norm(x, weight, bias, n, c, hxw, group, eps)
    return out.astype(x.dtype), mean.astype(x.dtype), rstd.astype(x.dtype)


@lowering("native_group_norm_backward")
def native_group_norm_backward(grad, x, mean, rstd, weight, n, c, hxw, group, output_mask):
    # with the saved statistics, as layer norm: xhat = (x - mean) * rstd per (sample, group)
    shape = (n, group, c // group, -1)
    xf, g = _f32(x).reshape(shape), _f32(grad).reshape(shape)
    m, r = _f32(mean)[:, :, None, None], _f32(rstd)[:, :, None, None]
    xhat = (xf - m) * r
    w = weight.astype(jnp.float32).reshape(1, group, c // group, 1) if weight is not None else 1.0
    gw_ = g * w
    axes = (2, 3)
    dx = r * (gw_ - jnp.mean(gw_, axis=axes, keepdims=True)
              - xhat * jnp.mean(gw_ * xhat, axis=axes, keepdims=True))
    wdt = weight.dtype if weight is not None else x.dtype
    dw = jnp.sum(g * xhat, axis=(0, 3)).reshape(c).astype(wdt) if output_mask[1] else None
    db = jnp.sum(g, axis=(0, 3)).reshape(c).astype(wdt) if output_mask[2] else None
    return (dx.reshape(x.shape).astype(x.dtype) if output_mask[0] else None, dw, db)


# ---------------------------------------------------------------- losses
def _reduce(loss, reduction, dtype):
    if reduction == 1:
        loss = jnp.mean(loss)
    elif reduction == 2:
        loss = jnp.sum(loss)
    return loss.astype(dtype)


def _loss_grad(grad, x, reduction):
    g = _f32(grad)
    return g / x.size if reduction == 1 else g


@lowering("mse_loss", real_only=True)
def mse_loss(x, t, reduction=1):
    return _reduce(jnp.square(_f32(x) - _f32(t)), reduction, x.dtype)


@lowering("mse_loss_backward")
def mse_loss_backward(grad, x, t, reduction):
    return (2 * (_f32(x) - _f32(t)) * _loss_grad(grad, x, reduction)).astype(x.dtype)


def _smooth_l1(d, beta):
    a = jnp.abs(d)
    return jnp.where(a < beta, 0.5 * d * d / jnp.where(beta == 0, 1, beta), a - 0.5 * beta)


@lowering("smooth_l1_loss", real_only=True)
def smooth_l1_loss(x, t, reduction=1, beta=1.0):
    d = _f32(x) - _f32(t)
    return _reduce(jnp.abs(d) if beta == 0 else _smooth_l1(d, beta), reduction, x.dtype)


@lowering("smooth_l1_loss_backward")
def smooth_l1_loss_backward(grad, x, t, reduction, beta):
    d = _f32(x) - _f32(t)
    g = jnp.sign(d) if beta == 0 else jnp.where(jnp.abs(d) < beta, d / (beta or 1), jnp.sign(d))
    return (g * _loss_grad(grad, x, reduction)).astype(x.dtype)


@lowering("huber_loss", real_only=True)
def huber_loss(x, t, reduction=1, delta=1.0):
    d = _f32(x) - _f32(t)
    a = jnp.abs(d)
    return _reduce(jnp.where(a < delta, 0.5 * d * d, delta * (a - 0.5 * delta)), reduction, x.dtype)


@lowering("huber_loss_backward")
def huber_loss_backward(grad, x, t, reduction, delta):
    d = _f32(x) - _f32(t)
    g = jnp.where(d < -delta, -delta, jnp.where(d > delta, delta, d))
    return (g * _loss_grad(grad, x, reduction)).astype(x.dtype)


@lowering("binary_cross_entropy", real_only=True)
def binary_cross_entropy(x, t, weight=None, reduction=1):
    xf, tf = _f32(x), _f32(t)
    require((xf >= 0) & (xf <= 1), "all elements of input should be between 0 and 1")
    # PyTorch clamps the logs at -100 so that 0 and 1 give finite losses
    loss = -(tf * jnp.maximum(jnp.log(xf), -100) + (1 - tf) * jnp.maximum(jnp.log1p(-xf), -100))
    if weight is not None:
        loss = loss * _f32(weight)
    return _reduce(loss, reduction, x.dtype)


@lowering("binary_cross_entropy_backward")
def binary_cross_entropy_backward(grad, x, t, weight=None, reduction=1):
    xf, tf = _f32(x), _f32(t)
    g = (xf - tf) / jnp.maximum((1 - xf) * xf, 1e-12) * _loss_grad(grad, x, reduction)
    if weight is not None:
        g = g * _f32(weight)
    return g.astype(x.dtype)


@lowering("binary_cross_entropy_with_logits", real_only=True)
def binary_cross_entropy_with_logits(x, t, weight=None, pos_weight=None, reduction=1):
    xf, tf = _f32(x), _f32(t)
    softplus_neg = jnp.log1p(jnp.exp(-jnp.abs(xf))) + jnp.maximum(-xf, 0)   # log(1 + exp(-x))
    if pos_weight is not None:
        loss = (1 - tf) * xf + (1 + (_f32(pos_weight) - 1) * tf) * softplus_neg
    else:
        loss = (1 - tf) * xf + softplus_neg
    if weight is not None:
        loss = loss * _f32(weight)
    return _reduce(loss, reduction, x.dtype)


@lowering("soft_margin_loss")
def soft_margin_loss(x, t, reduction=1):
    return _reduce(jnp.log1p(jnp.exp(-_f32(t) * _f32(x))), reduction, x.dtype)


@lowering("soft_margin_loss_backward")
def soft_margin_loss_backward(grad, x, t, reduction):
    z = jnp.exp(-_f32(t) * _f32(x))
    return (-_f32(t) * z / (1 + z) * _loss_grad(grad, x, reduction)).astype(x.dtype)


def _multi_margin(x, target, p, margin, weight, reduction):
    c = x.shape[-1] if x.ndim else 1  # a 0-d input is one sample of one class
    x2 = _f32(x).reshape(-1, c)
    t = target.reshape(-1)
    picked = jnp.take_along_axis(x2, t[:, None], axis=1)
    z = margin - picked + x2
    h = jnp.where(z > 0, jnp.where(p == 1, z, z * z), 0)  # p is a traced Scalar
    if weight is not None:
        h = h * _f32(weight)[t][:, None]
    h = jnp.where(jnp.arange(x2.shape[1])[None, :] == t[:, None], 0, h)  # the target class itself
    loss = jnp.sum(h, axis=1) / x2.shape[1]
    return _reduce(loss.reshape(x.shape[:-1]), reduction, x.dtype)


@lowering("multi_margin_loss", real_only=True)
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=1):
    require_index(target, x.shape[-1] if x.ndim else 1, False, "target out of range")
    return _multi_margin(x, target, p, margin, weight, reduction)


@lowering("multi_margin_loss_backward", missing_meta=_grad_input_meta)
def multi_margin_loss_backward(grad, x, target, p, margin, weight=None, reduction=1):
    _, vjp = jax.vjp(lambda v: _multi_margin(v, target, p, margin, weight, reduction).astype(jnp.float32), _f32(x))
    return vjp(_f32(grad))[0].astype(x.dtype)


def _multilabel_margin(x, target, reduction, is_target=None):
    c = x.shape[-1] if x.ndim else 1
    x2, t = _f32(x).reshape(-1, c), target.reshape(-1, c)
    valid = jnp.cumprod(t != -1, axis=1).astype(bool)  # the targets are the prefix before the first -1
    if is_target is None:
        is_target = jnp.any((t[:, :, None] == jnp.arange(c)) & valid[:, :, None], axis=1).astype(x.dtype)
    picked = jnp.take_along_axis(x2, jnp.where(valid, t, 0), axis=1)                 # (N, targets)
    z = jnp.maximum(1 - picked[:, :, None] + x2[:, None, :], 0)                          # (N, targets, C)
    z = z * valid[:, :, None] * (1 - _f32(is_target).reshape(-1, c))[:, None, :]
    loss = jnp.sum(z, axis=(1, 2)) / c
    return _reduce(loss.reshape(x.shape[:-1]), reduction, x.dtype), is_target.reshape(x.shape)


@lowering("multilabel_margin_loss_forward", real_only=True)
def multilabel_margin_loss_forward(x, target, reduction):
    c = x.shape[-1] if x.ndim else 1
    require((target >= -1) & (target < c), "argument #2 'target' is out of range")   # -1 ends the list
    return _multilabel_margin(x, target, reduction)


@lowering("multilabel_margin_loss_backward", missing_meta=_grad_input_meta)
def multilabel_margin_loss_backward(grad, x, target, reduction, is_target):
    _, vjp = jax.vjp(lambda v: _multilabel_margin(v, target, reduction, is_target)[0].astype(jnp.float32), _f32(x))
    return vjp(_f32(grad))[0].astype(x.dtype)


# ---------------------------------------------------------------- CTC loss
# PyTorch's CPU kernel (LossCTC.cpp), vectorized over the batch: log-space alpha (forward) and beta
# (backward) recursions over time (Graves et al. 2006, eq. 6-16) with lax.scan. The extended target
# l' is blank, l1, blank, l2, ..., blank (2 * max_target_length + 1 states); states beyond a row's
# 2 * target_length and steps beyond its input_length take no part. The lengths are int lists in the
# schema (ctc_loss moves tensor lengths to the host first, as on CUDA), so they are baked in.
def _ctc_lse3(a, b, c):
    """log(e^a + e^b + e^c) as the CPU kernel computes it (shift by the max, 0 when all are -inf)."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    m = jnp.where(m == -jnp.inf, 0, m)
    return jnp.log(jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)) + m


def _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank):
    """(l' labels (N, S'), log_probs at l' (T, N, S') with -inf beyond each row's states, the mask of
    states s whose s-2 transition is allowed (N, S'), input and target lengths as arrays)."""
    if log_probs.size == 0:   # the CPU kernel's check; PyTorch's meta kernel does not make it
        raise RuntimeError("log_probs tensor must not be empty")
    n, classes = log_probs.shape[1], log_probs.shape[2]
    tl = np.asarray(target_lengths, np.int64)
    width = 2 * (int(tl.max()) if n else 0) + 1
    j = np.arange(width // 2)
    valid = j[None, :] < tl[:, None]                               # (N, max_target_length)
    if targets.ndim == 1:                                          # concatenated targets
        offsets = np.concatenate([[0], np.cumsum(tl)[:-1]]).astype(np.int64)
        labels = targets[np.where(valid, offsets[:, None] + j[None, :], 0)] if valid.size else \
            jnp.zeros(valid.shape, targets.dtype)
    else:
        labels = targets[:, :width // 2]
    labels = labels.astype(jnp.int32)
    require(~jnp.asarray(valid) | ((labels >= 0) & (labels < classes)),
            f"ctc_loss: targets must be class indices in [0, {classes})")
    labels = jnp.where(jnp.asarray(valid), labels, blank)
    ext = jnp.full((n, width), blank, jnp.int32).at[:, 1::2].set(labels)
    s = np.arange(width)
    states = jnp.asarray(s[None, :] <= 2 * tl[:, None])            # (N, S')
    lp_ext = jnp.take_along_axis(log_probs, jnp.broadcast_to(ext[None], (log_probs.shape[0],) + ext.shape), 2)
    lp_ext = jnp.where(states[None], lp_ext, -jnp.inf)
    skip = jnp.concatenate([jnp.zeros((n, 2), bool), ext[:, 2:] != ext[:, :-2]], 1) if width > 2 else \
        jnp.zeros((n, width), bool)
    return ext, lp_ext, skip, jnp.asarray(np.asarray(input_lengths, np.int64)), jnp.asarray(tl)


def _ctc_alpha(lp_ext, skip, il):
    """log alpha (T, N, S'); rows t >= input_length repeat the last computed one."""
    ninf = jnp.full(lp_ext.shape[1:2] + (1,), -jnp.inf, lp_ext.dtype)
    first = jnp.full(lp_ext.shape[1:], -jnp.inf, lp_ext.dtype)
    first = first.at[:, :2].set(lp_ext[0, :, :2])

    def step(alpha, xs):
        t, lp_t = xs
        a1 = jnp.concatenate([ninf, alpha[:, :-1]], 1)
        a2 = jnp.where(skip, jnp.concatenate([ninf, ninf, alpha[:, :-2]], 1), -jnp.inf)
        new = jnp.where((t < il)[:, None], _ctc_lse3(alpha, a1, a2) + lp_t, alpha)
        return new, new

    ts = jnp.arange(1, lp_ext.shape[0])
    last, rest = lax.scan(step, first, (ts, lp_ext[1:]))
    return jnp.concatenate([first[None], rest], 0), last


def _ctc_nll(last, il, tl):
    """-log p(l|x) from alpha at each row's last step: eq. (8)."""
    n = last.shape[0]
    idx = (2 * tl).astype(jnp.int32)
    l1 = last[jnp.arange(n), idx]
    l2 = jnp.where(tl > 0, last[jnp.arange(n), jnp.maximum(idx - 1, 0)], -jnp.inf)
    m = jnp.maximum(l1, l2)
    m = jnp.where(m == -jnp.inf, 0, m)
    ll = jnp.log(jnp.exp(l1 - m) + jnp.exp(l2 - m)) + m
    # no input steps: the empty target has probability 1, any other 0 (as the CPU kernel)
    ll = jnp.where(il > 0, ll, jnp.where(tl == 0, 0, -jnp.inf).astype(ll.dtype))
    return -ll


def _ctc_loss_backward_meta(grad, log_probs, *args, **kwargs):
    return torch.empty_like(log_probs)


@lowering("_ctc_loss")
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _, lp_ext, skip, il, tl = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    alpha, last = _ctc_alpha(lp_ext, skip, il)
    # zero_infinity is applied by the composite ctc_loss around this op (where(res == inf, 0, res))
    return _ctc_nll(last, il, tl), jnp.transpose(alpha, (1, 0, 2))


@lowering("_ctc_loss_backward", missing_meta=_ctc_loss_backward_meta)
def ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank,
                      zero_infinity=False):
    ext, lp_ext, skip, il, tl = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    steps, n, width = lp_ext.shape
    alpha = jnp.transpose(log_alpha, (1, 0, 2))
    ninf = jnp.full((n, 1), -jnp.inf, lp_ext.dtype)
    s = jnp.arange(width)
    # beta at each row's last step: eq. (10), the final blank and the last label
    end = jnp.where((s[None, :] == 2 * tl[:, None]) | ((s[None, :] == 2 * tl[:, None] - 1) & (tl[:, None] > 0)),
                    0, -jnp.inf).astype(lp_ext.dtype)
    skip_up = jnp.concatenate([skip[:, 2:], jnp.zeros((n, 2), bool)], 1)    # s -> s+2 allowed

    def step(beta, xs):
        t, lp_t = xs
        b1 = jnp.concatenate([beta[:, 1:], ninf], 1)
        b2 = jnp.where(skip_up, jnp.concatenate([beta[:, 2:], ninf, ninf], 1), -jnp.inf)
        new = jnp.where((t == il - 1)[:, None], end + lp_t,
                        jnp.where((t < il - 1)[:, None], _ctc_lse3(beta, b1, b2) + lp_t, -jnp.inf))
        return new, new

    _, beta = lax.scan(step, jnp.full((n, width), -jnp.inf, lp_ext.dtype),
                       (jnp.arange(steps), lp_ext), reverse=True)
    # log of sum over the states s with l'_s = c of alpha_t(s) beta_t(s): eq. (16)'s sum, per class
    ab = alpha + beta                                                        # (T, N, S')
    # a last target equal to blank (invalid input the CPU accepts): at the last step the CPU kernel
    # assigns the last label's term over the final blank's instead of adding them; do the same
    last_label = jnp.take_along_axis(ext, jnp.maximum(2 * tl - 1, 0).astype(jnp.int32)[:, None], 1)[:, 0]
    overwritten = (tl > 0) & (last_label == blank)
    ab = jnp.where((jnp.arange(steps)[:, None, None] == il[None, :, None] - 1) & overwritten[None, :, None]
                   & (s == 2 * tl[:, None])[None], -jnp.inf, ab)
    t_idx, n_idx = jnp.arange(steps)[:, None, None], jnp.arange(n)[None, :, None]
    c_idx = jnp.broadcast_to(ext[None], ab.shape)
    peak = jnp.full(log_probs.shape, -jnp.inf, ab.dtype).at[t_idx, n_idx, c_idx].max(ab)
    shift = jnp.where(peak == -jnp.inf, 0, peak)
    total = jnp.zeros(log_probs.shape, ab.dtype).at[t_idx, n_idx, c_idx].add(
        jnp.exp(ab - shift[t_idx, n_idx, c_idx]))
    lab = jnp.log(total) + shift
    # the CPU's gradient (as if log_probs came from log_softmax): exp(lp) - exp(lab + nll - lp)
    g = (jnp.exp(log_probs) - jnp.exp(lab + nll[None, :, None] - log_probs)) * grad[None, :, None]
    keep = jnp.arange(steps)[:, None] < il[None, :]
    if zero_infinity:
        keep = keep & (nll != jnp.inf)[None, :]
    return jnp.where(keep[..., None], g, 0).astype(log_probs.dtype)


# ---------------------------------------------------------------- activations
@lowering("leaky_relu", promote=KIND.DEFAULT, promote_args=(0,), real_only=True)
def leaky_relu(a, negative_slope=0.01):
    return jnp.where(a > 0, a, a * negative_slope)


@lowering("leaky_relu_backward", promote=KIND.DEFAULT, promote_args=(0, 1))
def leaky_relu_backward(grad, a, negative_slope, self_is_result):
    return jnp.where(a > 0, grad, grad * negative_slope)


@lowering("elu", promote=KIND.DEFAULT, promote_args=(0,), real_only=True)
def elu(a, alpha=1, scale=1, input_scale=1):
    x = _f32(a)
    return jnp.where(x > 0, x * scale, jnp.expm1(x * input_scale) * alpha * scale).astype(a.dtype)


@lowering("elu_backward", promote=KIND.DEFAULT, promote_args=(0, 5))
def elu_backward(grad, alpha, scale, input_scale, is_result, x):
    g, v = _f32(grad), _f32(x)
    if is_result:
        neg = g * input_scale * (v + alpha * scale)
    else:
        neg = g * input_scale * alpha * scale * jnp.exp(v * input_scale)
    return jnp.where(v > 0 if not is_result else v > 0, g * scale, neg).astype(grad.dtype)


@lowering("hardtanh", promote=KIND.DEFAULT, promote_args=(0,), real_only=True)
def hardtanh(a, min_val=-1, max_val=1):
    return jnp.minimum(jnp.maximum(a, min_val), max_val).astype(a.dtype)


@lowering("hardtanh_backward", promote=KIND.DEFAULT, promote_args=(0, 1))
def hardtanh_backward(grad, a, min_val, max_val):
    return jnp.where((a <= min_val) | (a >= max_val), 0, grad).astype(grad.dtype)


@lowering("hardswish", promote=KIND.DEFAULT, real_only=True)
def hardswish(a):
    x = _f32(a)
    return (x * jnp.clip(x + 3, 0, 6) / 6).astype(a.dtype)


@lowering("hardswish_backward", promote=KIND.DEFAULT)
def hardswish_backward(grad, a):
    g, x = _f32(grad), _f32(a)
    return jnp.where(x < -3, 0, jnp.where(x <= 3, g * (x / 3 + 0.5), g)).astype(grad.dtype)


@lowering("hardsigmoid", promote=KIND.DEFAULT, real_only=True)
def hardsigmoid(a):
    return (jnp.clip(_f32(a) + 3, 0, 6) / 6).astype(a.dtype)


@lowering("hardsigmoid_backward", promote=KIND.DEFAULT)
def hardsigmoid_backward(grad, a):
    return jnp.where((a > -3) & (a < 3), _f32(grad) / 6, 0).astype(grad.dtype)


@lowering("softplus", promote=KIND.DEFAULT, promote_args=(0,), real_only=True)
def softplus(a, beta=1, threshold=20):
    x = _f32(a)
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta).astype(a.dtype)


@lowering("softplus_backward", promote=KIND.DEFAULT, promote_args=(0, 1))
def softplus_backward(grad, a, beta, threshold):
    g, x = _f32(grad), _f32(a)
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, g, g * z / (z + 1)).astype(grad.dtype)


@lowering("mish", promote=KIND.DEFAULT, real_only=True)
def mish(a):
    x = _f32(a)
    return (x * jnp.tanh(jax.nn.softplus(x))).astype(a.dtype)


@lowering("mish_backward", promote=KIND.DEFAULT)
def mish_backward(grad, a):
    g, x = _f32(grad), _f32(a)
    t = jnp.tanh(jax.nn.softplus(x))
    return (g * (t + x * jax.nn.sigmoid(x) * (1 - t * t))).astype(grad.dtype)


@lowering("glu", real_only=True)
def glu(a, dim=-1):
    x, gate = jnp.split(a, 2, axis=dim)
    return (_f32(x) * jax.nn.sigmoid(_f32(gate))).astype(a.dtype)


@lowering("glu_backward")
def glu_backward(grad, a, dim):
    _, vjp = jax.vjp(lambda v: glu(v, dim), _f32(a))
    return vjp(_f32(grad))[0].astype(a.dtype)


@lowering("_prelu_kernel", promote=KIND.DEFAULT, real_only=True)
def prelu_kernel(a, weight):
    return jnp.where(a > 0, a, weight * a)


@lowering("_prelu_kernel_backward")
def prelu_kernel_backward(grad, a, weight):
    return (jnp.where(a > 0, grad, weight * grad).astype(a.dtype),
            jnp.where(a > 0, 0, a * grad).astype(weight.dtype))


@lowering("log_sigmoid_forward", real_only=True)
def log_sigmoid_forward(a):
    x = _f32(a)
    out = jnp.minimum(x, 0) - jnp.log1p(jnp.exp(-jnp.abs(x)))
    return out.astype(a.dtype), jnp.zeros((), a.dtype)   # PyTorch's buffer is empty on CPU


@lowering("log_sigmoid_backward")
def log_sigmoid_backward(grad, a, buffer):
    return (_f32(grad) * jax.nn.sigmoid(-_f32(a))).astype(grad.dtype)


@lowering("softshrink", promote=KIND.DEFAULT, promote_args=(0,), real_only=True)
def softshrink(a, lambd=0.5):
    return jnp.where(a > lambd, a - lambd, jnp.where(a < -lambd, a + lambd, 0)).astype(a.dtype)


@lowering("softshrink_backward", promote=KIND.DEFAULT, promote_args=(0, 1))
def softshrink_backward(grad, a, lambd):
    return jnp.where((a >= -lambd) & (a <= lambd), 0, grad).astype(grad.dtype)


@lowering("hardshrink", promote=KIND.DEFAULT, promote_args=(0,), real_only=True)
def hardshrink(a, lambd=0.5):
    return jnp.where((a >= -lambd) & (a <= lambd), 0, a).astype(a.dtype)


@lowering("hardshrink_backward", promote=KIND.DEFAULT, promote_args=(0, 1))
def hardshrink_backward(grad, a, lambd):
    return jnp.where((a >= -lambd) & (a <= lambd), 0, grad).astype(grad.dtype)


@lowering("rrelu_with_noise", random=True, real_only=True)
def rrelu_with_noise(a, noise, lower=0.125, upper=1 / 3, training=False, generator=None, *, key):
    if training:
        r = jax.random.uniform(key, a.shape, jnp.float32, 0, 1) * (upper - lower) + lower
        new_noise = jnp.where(a >= 0, 1, r).astype(noise.dtype)
        return (a * new_noise.astype(a.dtype)).astype(a.dtype), new_noise
    return jnp.where(a >= 0, a, a * ((lower + upper) / 2)).astype(a.dtype), noise


@lowering("rrelu_with_noise_backward")
def rrelu_with_noise_backward(grad, a, noise, lower, upper, training, self_is_result):
    if training:
        return (grad * noise).astype(grad.dtype)
    return jnp.where(a > 0, grad, grad * ((lower + upper) / 2)).astype(grad.dtype)


# ---------------------------------------------------------------- embedding_bag
def _bag_of(indices, offsets, include_last_offset):
    n_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    bag = jnp.searchsorted(offsets, jnp.arange(indices.shape[0], dtype=offsets.dtype), side="right") - 1
    return jnp.clip(bag, 0, max(n_bags - 1, 0)).astype(jnp.int64), n_bags


@lowering("_embedding_bag", "_embedding_bag_forward_only")
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """(out, offset2bag, bag_size, max_indices), shaped as PyTorch's meta kernel says."""
    _check_rows(indices, weight.shape[0])
    if offsets.shape[0]:
        require(offsets[0] == 0, "embedding_bag: offsets[0] has to be 0, i.e., the first sequence in the "
                                 "mini-batch has to start from position 0")
        require(offsets[-1] <= indices.shape[0], f"embedding_bag: offsets[-1] can not be greater than input's "
                                                 f"length {indices.shape[0]}")
    bag, n_bags = _bag_of(indices, offsets, include_last_offset)
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, jnp.bool_)
    rows = _f32(weight)[indices]                                   # (n, D)
    count = jax.ops.segment_sum(valid.astype(jnp.int64), bag, offsets.shape[0])
    if mode == 2:
        neg = jnp.where(valid[:, None], rows, -jnp.inf)
        best = jax.ops.segment_max(neg, bag, n_bags)               # (B, D)
        pos = jnp.arange(indices.shape[0])[:, None]
        first = jax.ops.segment_min(jnp.where((neg == best[bag]) & valid[:, None], pos, indices.shape[0]),
                                    bag, n_bags)
        empty = count[:n_bags, None] == 0
        out = jnp.where(empty, 0, best)
        max_idx = jnp.where(empty, 0, indices[jnp.minimum(first, indices.shape[0] - 1)])
        return out.astype(weight.dtype), bag, count, max_idx.astype(jnp.int64)
    if per_sample_weights is not None:
        rows = rows * _f32(per_sample_weights)[:, None]
    out = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0), bag, n_bags)
    if mode == 1:
        out = out / jnp.maximum(count[:n_bags], 1)[:, None]
    return out.astype(weight.dtype), bag, count, jnp.zeros((0,), jnp.int64)


@lowering("_embedding_bag_backward")
def embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, max_indices, num_weights,
                           scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    return embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, max_indices, num_weights,
                                        scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@lowering("_embedding_bag_dense_backward")
def embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, max_indices, num_weights,
                                 scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    g = _f32(grad)
    d = g.shape[-1]
    if mode == 2:
        nonempty = (bag_size[:g.shape[0]] > 0)[:, None]
        cols = jnp.broadcast_to(jnp.arange(d), max_indices.shape)
        out = jnp.zeros((num_weights, d), g.dtype).at[max_indices, cols].add(jnp.where(nonempty, g, 0))
        return out.astype(grad.dtype)
    contrib = g[offset2bag]
    if mode == 1:
        contrib = contrib / jnp.maximum(bag_size[offset2bag], 1)[:, None].astype(g.dtype)
    if per_sample_weights is not None:
        contrib = contrib * _f32(per_sample_weights)[:, None]
    if padding_idx >= 0:
        contrib = jnp.where((indices == padding_idx)[:, None], 0, contrib)
    if scale_grad_by_freq:
        freq = jnp.zeros((num_weights,), jnp.int64).at[indices].add(1)
        contrib = contrib / freq[indices][:, None].astype(g.dtype)
    return jnp.zeros((num_weights, d), g.dtype).at[indices].add(contrib).astype(grad.dtype)


@lowering("_embedding_bag_per_sample_weights_backward")
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    out = jnp.sum(_f32(grad)[offset2bag] * _f32(weight)[indices], axis=-1)
    if padding_idx >= 0:
        out = jnp.where(indices == padding_idx, 0, out)
    return out.astype(grad.dtype)


# ---------------------------------------------------------------- attention
# scaled_dot_product_attention on tpu runs as one fused executable forward and one backward: the
# eager layer (eager/attention.py) routes it to these ATen ops, whose autograd formula and
# meta kernel PyTorch already has. Masks arrive additive (float) or as bool (True = attend).
# Large score matrices (B*H*L*S >= attention_blockwise.MIN_SCORES, e.g. SD3's joint attention) go
# blockwise with an online softmax instead of being materialised (ops/attention_blockwise.py).
from . import attention_blockwise as _blockwise  # noqa: E402


def _heads(x, n):
    """(..., H, L, F) viewed with n heads. Grouped-query attention: (..., H, L, F) -> (..., Hkv, H/Hkv * L,
    F), so each key/value head meets its query heads in one product and k, v are never repeated (query
    head h reads key/value head h // (H/Hkv), as PyTorch's enable_gqa and transformers' repeat_kv);
    and back to H heads after the product."""
    return x if x.shape[-3] == n else x.reshape(x.shape[:-3] + (n, -1, x.shape[-1]))


def _attn_scores(q, k, is_causal, mask, scale):
    e = q.shape[-1]
    s = (1.0 / math.sqrt(e)) if scale is None else scale
    scores = jnp.einsum("...le,...se->...ls", _heads(q, k.shape[-3]), k, precision=_precision(),
                        preferred_element_type=_blockwise.acc_dtype(q.dtype)) * s   # float64 stays float64
    scores = _heads(scores, q.shape[-3])
    if mask is not None:
        scores = scores + (jnp.where(mask, 0.0, -jnp.inf) if mask.dtype == jnp.bool_ else _f32(mask))
    if is_causal:
        l, sk = scores.shape[-2], scores.shape[-1]
        scores = jnp.where(jnp.tril(jnp.ones((l, sk), jnp.bool_)), scores, -jnp.inf)
    return scores, s


@lowering("_scaled_dot_product_flash_attention_for_cpu")
def sdpa_fused(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    if _blockwise.eligible(q, k, v):
        return _blockwise.forward(q, k, v, attn_mask, is_causal, scale, _precision())
    scores, _ = _attn_scores(q, k, is_causal, attn_mask, scale)
    m = jnp.max(scores, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0)          # rows with every key masked give 0, as _safe_softmax
    p = jnp.exp(scores - m)
    total = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("...ls,...se->...le", _heads(p.astype(v.dtype) if _low(v) else p, v.shape[-3]), v,
                     precision=_precision(), preferred_element_type=p.dtype)
    out = _heads(out, q.shape[-3])
    out = jnp.where(total > 0, out / jnp.where(total > 0, total, 1), 0)
    lse = jnp.where(total[..., 0] > 0, jnp.log(jnp.where(total[..., 0] > 0, total[..., 0], 1)) + m[..., 0], 0)  # as CPU
    return out.astype(q.dtype), lse


@lowering("_scaled_dot_product_flash_attention_for_cpu_backward")
def sdpa_fused_backward(grad, q, k, v, out, lse, dropout_p, is_causal, attn_mask=None, scale=None):
    if _blockwise.eligible(q, k, v):
        return _blockwise.backward(grad, q, k, v, out, lse, attn_mask, is_causal, scale, _precision())
    scores, s = _attn_scores(q, k, is_causal, attn_mask, scale)
    lse_ = lse[..., None]
    p = jnp.where(jnp.isfinite(lse_), jnp.exp(scores - jnp.where(jnp.isfinite(lse_), lse_, 0)), 0)
    g, o = _f32(grad), _f32(out)
    prec = _precision()
    hq, hk = q.shape[-3], k.shape[-3]
    g_g, p_g = _heads(g, hk), _heads(p, hk)   # GQA: sums over a key/value head's query heads
    dv = jnp.einsum("...ls,...le->...se", p_g, g_g, precision=prec)
    dp = _heads(jnp.einsum("...le,...se->...ls", g_g, _f32(v), precision=prec), hq)
    ds = p * (dp - jnp.sum(g * o, axis=-1, keepdims=True))
    ds_g = _heads(ds, hk)
    dq = _heads(jnp.einsum("...ls,...se->...le", ds_g, _f32(k), precision=prec), hq) * s
    dk = jnp.einsum("...ls,...le->...se", ds_g, _heads(_f32(q), hk), precision=prec) * s
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# ---------------------------------------------------------------- nn.MultiheadAttention / Transformer fast paths
# (taken in eval mode under no_grad: PyTorch counts PrivateUse1 among the fast-path devices)
def _linear(x, w, b):
    y = jnp.einsum("...i,oi->...o", x, w, precision=_precision(), preferred_element_type=jnp.float32)
    return y + _f32(b) if b is not None else y


def _mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
         mask_type):
    """(output in float32, attention probabilities (B, H, L, S) in float32)."""
    d = embed_dim
    wq, wk, wv = qkv_weight[:d], qkv_weight[d:2 * d], qkv_weight[2 * d:]
    bq, bk, bv = qkv_bias[:d], qkv_bias[d:2 * d], qkv_bias[2 * d:]
    b, l, _ = query.shape
    s = key.shape[1]
    hd = d // num_head

    def heads(x, n):
        return x.reshape(b, n, num_head, hd).transpose(0, 2, 1, 3)

    q = heads(_linear(query, wq, bq), l) / math.sqrt(hd)
    k = heads(_linear(key, wk, bk), s)
    v = heads(_linear(value, wv, bv), s)
    scores = jnp.einsum("bhle,bhse->bhls", q, k, precision=_precision())
    if mask is not None:
        masked = mask.astype(jnp.bool_)   # PyTorch's fast path: any nonzero mask entry masks
        if mask_type == 1 or (mask_type is None and masked.ndim == 2 and masked.shape == (b, s)
                              and l != s):
            masked = masked.reshape(b, 1, 1, s)
        scores = jnp.where(masked, -jnp.inf, scores)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - jnp.where(jnp.isfinite(m), m, 0))
    total = jnp.sum(p, axis=-1, keepdims=True)
    p = jnp.where(total > 0, p / jnp.where(total > 0, total, 1), 0)
    ctx = jnp.einsum("bhls,bhse->bhle", p, v, precision=_precision())
    ctx = ctx.transpose(0, 2, 1, 3).reshape(b, l, d)
    return _linear(ctx, proj_weight, proj_bias), p


@lowering("_native_multi_head_attention")
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                proj_bias, mask=None, need_weights=True, average_attn_weights=True,
                                mask_type=None):
    out, p = _mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
                  mask, mask_type)
    if not need_weights:
        return out.astype(query.dtype), jnp.zeros((0,), query.dtype)
    w = jnp.mean(p, axis=1) if average_attn_weights else p
    return out.astype(query.dtype), w.astype(query.dtype)


def _layer_norm(x, w, b, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * _f32(w) + _f32(b)


@lowering("_transformer_encoder_layer_fwd")
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                  use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                                  norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                                  mask_type=None):
    x = _f32(src)
    h = _layer_norm(x, norm_weight_1, norm_bias_1, eps) if norm_first else x
    attn, _ = _mha(h, h, h, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
                   mask_type)
    x = x + attn
    if not norm_first:
        x = _layer_norm(x, norm_weight_1, norm_bias_1, eps)
    h = _layer_norm(x, norm_weight_2, norm_bias_2, eps) if norm_first else x
    h = _linear(h, ffn_weight_1, ffn_bias_1)
    h = jax.nn.gelu(h, approximate=False) if use_gelu else jnp.maximum(h, 0)
    x = x + _linear(h, ffn_weight_2, ffn_bias_2)
    if not norm_first:
        x = _layer_norm(x, norm_weight_2, norm_bias_2, eps)
    return x.astype(src.dtype)


# ---------------------------------------------------------------- grid_sample
def _rounding(dtype):
    """PyTorch's CPU grid sampler computes half types in the half type itself: every operation
    rounds. `r` reproduces that on float32 values (identity for float32/float64)."""
    if dtype in (jnp.float16, jnp.bfloat16):
        # reduce_precision, not a convert pair: XLA may fold f32->f16->f32 converts away under jit
        info = jnp.finfo(dtype)
        return lambda v: lax.reduce_precision(v, info.nexp, info.nmant)
    return lambda v: v


def _grid_unnormalize(coord, size, align_corners, r=lambda v: v, vectorized=True):
    if align_corners:
        return r(r(r(coord + 1) / 2) * (size - 1))
    if vectorized:  # the form of PyTorch's vectorized 2-D CPU kernel, which rounds this way
        return r(r(r(coord + 1) * (size / 2)) - 0.5)
    return r(r(r(r(coord + 1) * size) - 1) / 2)  # its scalar kernel (3-D)


def _grid_pad(x, size, padding_mode, align_corners, r=lambda v: v):
    """PyTorch's padding modes on pixel coordinates: border clips, reflection mirrors then clips."""
    if padding_mode == 1:      # border
        x = jnp.clip(x, 0, size - 1)
    elif padding_mode == 2:    # reflection
        lo, hi = (0.0, 2.0 * (size - 1)) if align_corners else (-1.0, 2.0 * size - 1)
        if lo == hi:
            x = jnp.zeros_like(x)
        else:
            mn, span = lo / 2, (hi - lo) / 2
            d = r(jnp.abs(x - mn))
            extra = r(jnp.fmod(d, span))
            flips = jnp.floor(r(d / span))
            x = r(jnp.where(jnp.fmod(flips, 2) == 0, extra + mn, span - extra + mn))
        x = jnp.clip(x, 0, size - 1)
    return x


def _grid_coord(coord, size, padding_mode, align_corners, r=lambda v: v, vectorized=True):
    """Normalized [-1, 1] grid coordinates to pixel coordinates, with PyTorch's padding modes."""
    return _grid_pad(_grid_unnormalize(coord, size, align_corners, r, vectorized), size, padding_mode,
                     align_corners, r)


def _grid_bicubic(xf, gx, gy, padding_mode, align_corners, r=lambda v: v):
    n, c, h, w = xf.shape
    ix = _grid_unnormalize(gx, w, align_corners, r)
    iy = _grid_unnormalize(gy, h, align_corners, r)
    x0, y0 = jnp.floor(ix), jnp.floor(iy)
    cx, cy = cubic_coeffs(r(ix - x0), r=r), cubic_coeffs(r(iy - y0), r=r)

    def tap(yy, xx):
        if padding_mode != 0:  # padded taps are read at their mirrored/clipped position
            yy = _grid_pad(yy, h, padding_mode, align_corners, r)
            xx = _grid_pad(xx, w, padding_mode, align_corners, r)
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        yc, xc = jnp.clip(yy, 0, h - 1).astype(jnp.int32), jnp.clip(xx, 0, w - 1).astype(jnp.int32)
        vals = jax.vmap(lambda img, a, b: img[:, a, b])(xf, yc, xc)
        return jnp.where(inside[:, None], vals, 0)

    def interp(p, coeffs):  # x0*c0 + x1*c1 + x2*c2 + x3*c3, left to right
        acc = r(p[0] * coeffs[0][:, None])
        for k in range(1, 4):
            acc = r(acc + r(p[k] * coeffs[k][:, None]))
        return acc

    rows = [interp([tap(y0 - 1 + j, x0 - 1 + i) for i in range(4)], cx) for j in range(4)]
    return interp(rows, cy)


def _grid_sample(x, grid, mode, padding_mode, align_corners):
    n, c, h, w = x.shape
    g = _f32(grid)
    r = _rounding(x.dtype)
    ix = _grid_coord(g[..., 0], w, padding_mode, align_corners, r)
    iy = _grid_coord(g[..., 1], h, padding_mode, align_corners, r)
    xf = _f32(x)

    def tap(yy, xx):
        """x at integer (yy, xx) per batch, zero outside: (N, C, Ho, Wo)."""
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        yc, xc = jnp.clip(yy, 0, h - 1).astype(jnp.int32), jnp.clip(xx, 0, w - 1).astype(jnp.int32)
        vals = jax.vmap(lambda img, a, b: img[:, a, b])(xf, yc, xc)
        return jnp.where(inside[:, None], vals, 0)

    if mode == 1:   # nearest (round half to even, as nearbyint)
        return tap(jnp.round(iy), jnp.round(ix))
    if mode == 2:
        return _grid_bicubic(xf, g[..., 0], g[..., 1], padding_mode, align_corners, r)
    x0, y0 = jnp.floor(ix), jnp.floor(iy)
    weights = ((y0, x0, r(r(x0 + 1 - ix) * r(y0 + 1 - iy))), (y0, x0 + 1, r(r(ix - x0) * r(y0 + 1 - iy))),
               (y0 + 1, x0, r(r(x0 + 1 - ix) * r(iy - y0))), (y0 + 1, x0 + 1, r(r(ix - x0) * r(iy - y0))))
    out = 0
    for yy, xx, wt in weights:
        out = r(out + r(tap(yy, xx) * wt[:, None]))
    return out


def _grid_sample_3d(x, grid, mode, padding_mode, align_corners):
    n, c, d, h, w = x.shape
    g = _f32(grid)
    r = _rounding(x.dtype)
    ix = _grid_coord(g[..., 0], w, padding_mode, align_corners, r, vectorized=False)
    iy = _grid_coord(g[..., 1], h, padding_mode, align_corners, r, vectorized=False)
    iz = _grid_coord(g[..., 2], d, padding_mode, align_corners, r, vectorized=False)
    xf = _f32(x)

    def tap(zz, yy, xx):
        """x at integer (zz, yy, xx) per batch, zero outside: (N, C, Do, Ho, Wo)."""
        inside = (zz >= 0) & (zz < d) & (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        zc = jnp.clip(zz, 0, d - 1).astype(jnp.int32)
        yc, xc = jnp.clip(yy, 0, h - 1).astype(jnp.int32), jnp.clip(xx, 0, w - 1).astype(jnp.int32)
        vals = jax.vmap(lambda vol, a, b, e: vol[:, a, b, e])(xf, zc, yc, xc)
        return jnp.where(inside[:, None], vals, 0)

    if mode == 1:   # nearest
        return tap(jnp.round(iz), jnp.round(iy), jnp.round(ix))
    if mode != 0:
        raise NotImplementedError("torchtpu: 3-D grid_sample supports 'bilinear' and 'nearest' (as PyTorch)")
    x0, y0, z0 = jnp.floor(ix), jnp.floor(iy), jnp.floor(iz)
    out = 0
    # PyTorch's corner order (tnw, tne, tsw, tse, bnw, bne, bsw, bse), each weight a rounded product
    for dz in (0, 1):
        wz = r(z0 + 1 - iz) if dz == 0 else r(iz - z0)
        for dy in (0, 1):
            wy = r(y0 + 1 - iy) if dy == 0 else r(iy - y0)
            for dx in (0, 1):
                wx = r(x0 + 1 - ix) if dx == 0 else r(ix - x0)
                wt = r(r(wx * wy) * wz)
                out = r(out + r(tap(z0 + dz, y0 + dy, x0 + dx) * wt[:, None]))
    return out


def _grid_sampler_backward(sample, grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    _, vjp = jax.vjp(lambda a, b: sample(a, b, interpolation_mode, padding_mode, align_corners), _f32(x), _f32(grid))
    gx, gg = vjp(_f32(grad))
    # (the meta kernel always returns a grad_grid, even when output_mask[1] is False)
    return (gx.astype(x.dtype) if output_mask[0] else None,
            gg.astype(grid.dtype) if output_mask[1] else jnp.zeros(grid.shape, grid.dtype))


def _sampler(x):
    return _grid_sample if x.ndim == 4 else _grid_sample_3d   # (N, C, H, W) or (N, C, D, H, W)


@lowering("grid_sampler_2d", "grid_sampler_3d")
def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    return _sampler(x)(x, grid, interpolation_mode, padding_mode, align_corners).astype(x.dtype)


@lowering("grid_sampler_2d_backward", "grid_sampler_3d_backward")
def grid_sampler_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return _grid_sampler_backward(_sampler(x), grad, x, grid, interpolation_mode, padding_mode, align_corners,
                                  output_mask)
