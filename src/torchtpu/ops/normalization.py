"""Lowerings: layer norm, batch norm (every ATen variant) and group norm, with their backward ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .dtypes import to_opmath
from .table import lowering


@lowering("native_layer_norm", real_only=True)
def native_layer_norm(a, normalized_shape, weight, bias, eps):
    axes = tuple(range(a.ndim - len(normalized_shape), a.ndim))
    x = to_opmath(a)
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
    x = to_opmath(a)
    g = to_opmath(grad)
    xhat = (x - mean) * rstd
    gw = g * weight if weight is not None else g
    dx = rstd * (gw - jnp.mean(gw, axis=axes, keepdims=True) - xhat * jnp.mean(gw * xhat, axis=axes, keepdims=True))
    batch_axes = tuple(range(a.ndim - len(normalized_shape)))
    dw = jnp.sum(g * xhat, axis=batch_axes) if weight is not None and output_mask[1] else None
    db = jnp.sum(g, axis=batch_axes) if bias is not None and output_mask[2] else None
    return (
        dx.astype(a.dtype) if output_mask[0] else None,
        dw.astype(weight.dtype) if dw is not None else None,
        db.astype(bias.dtype) if db is not None else None,
    )


def _bn_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


def _bn_apply(x, weight, bias, mean, invstd):
    """(x - mean) * invstd * weight + bias in float32 (float64 for float64 input), statistics per
    channel (dim 1)."""
    s = _bn_shape(x)
    xf = to_opmath(x)
    out = (xf - mean.astype(xf.dtype).reshape(s)) * invstd.astype(xf.dtype).reshape(s)
    if weight is not None:
        out = out * weight.astype(xf.dtype).reshape(s)
    if bias is not None:
        out = out + bias.astype(xf.dtype).reshape(s)
    return out


def _bn_stats(x, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    xf = to_opmath(x)
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
    acc = to_opmath(x).dtype
    invstd = lax.rsqrt(running_var.astype(acc) + eps)
    out = _bn_apply(x, weight, bias, running_mean, invstd).astype(x.dtype)
    # Eval mode's saved statistics follow CUDA and PyTorch's meta kernel (which fake tensors under
    # torch.compile use on every device): running_mean and 1/sqrt(running_var + eps), shape (C,), in
    # the accumulation dtype (float32 for half types). The CPU kernel returns empty (0,) tensors in
    # the input dtype instead; nothing reads them (the backward in eval mode uses the running stats).
    return out, running_mean.astype(acc), invstd, running_mean, running_var


# the CPU's batch norm writes a contiguous output, or a channels_last one for a channels_last input
# (suggest_memory_format); PyTorch's meta kernel keeps any permuted input layout
_BN_LAYOUT = "memory_format"


def _drop_none(*values):
    return tuple(v for v in values if v is not None)


@lowering(
    "native_batch_norm",
    mutates=((3, "running_mean"), (4, "running_var")),
    real_only=True,
    output_layout=_BN_LAYOUT,
)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    out, mean, invstd, rm, rv = _bn_forward(x, weight, bias, running_mean, running_var, training, momentum, eps)
    return (out, mean, invstd) + _drop_none(rm, rv)


@lowering("_native_batch_norm_legit", real_only=True, output_layout=_BN_LAYOUT)
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering("_native_batch_norm_legit.no_stats", real_only=True, output_layout=_BN_LAYOUT)
def native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    return _bn_forward(x, weight, bias, None, None, True, momentum, eps)[:3]


@lowering("_native_batch_norm_legit_functional", output_layout=_BN_LAYOUT)
def native_batch_norm_legit_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _bn_forward(x, weight, bias, running_mean, running_var, training, momentum, eps)


@lowering("_native_batch_norm_legit_no_training", real_only=True, output_layout=_BN_LAYOUT)
def native_batch_norm_legit_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _bn_forward(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lowering("_batch_norm_with_update", real_only=True, output_layout=_BN_LAYOUT)
def batch_norm_with_update(x, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, rm, rv = _bn_forward(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8), rm, rv


@lowering("_batch_norm_no_update", real_only=True, output_layout=_BN_LAYOUT)
def batch_norm_no_update(x, weight, bias, running_mean, running_var, momentum, eps):
    if running_mean is None:
        out, mean, invstd, _, _ = _bn_forward(x, weight, bias, None, None, True, momentum, eps)
    else:
        out, mean, invstd, _, _ = _bn_forward(x, weight, bias, running_mean, running_var, False, momentum, eps)
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8)


def _bn_backward(grad, x, weight, running_mean, running_var, train, eps, mask):
    acc = to_opmath(x).dtype
    w = weight if weight is not None else jnp.ones((x.shape[1],), acc)
    b = jnp.zeros((x.shape[1],), acc)

    def f(x_, w_, b_):
        if train:
            mean, _, invstd = _bn_stats(x_, eps)
        else:
            mean, invstd = running_mean, lax.rsqrt(running_var.astype(acc) + eps)
        return _bn_apply(x_, w_, b_, mean, invstd)

    _, vjp = jax.vjp(f, to_opmath(x), w.astype(acc), b)
    gx, gw, gb = vjp(to_opmath(grad))
    return (
        gx.astype(x.dtype) if mask[0] else None,
        gw.astype(w.dtype) if mask[1] else None,
        gb.astype(w.dtype) if mask[2] else None,
    )


@lowering("native_batch_norm_backward")
def native_batch_norm_backward(
    grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    return _bn_backward(grad, x, weight, running_mean, running_var, train, eps, output_mask)


@lowering("batch_norm_backward")
def batch_norm_backward(
    grad, x, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask, reserve
):
    train = update or running_mean is None
    return _bn_backward(grad, x, weight, running_mean, running_var, train, eps, output_mask)


def _group_norm(x, weight, bias, n, c, hxw, group, eps):
    xf = to_opmath(x).reshape(n, group, c // group * hxw)  # (sizes spelled out: n may be 0)
    mean = jnp.mean(xf, axis=-1)
    var = jnp.mean(jnp.square(xf - mean[..., None]), axis=-1)
    rstd = lax.rsqrt(var + eps)
    out = ((xf - mean[..., None]) * rstd[..., None]).reshape(n, c, hxw)
    # weight and bias in the opmath dtype: a float64 norm rounded through float32 loses small steps
    if weight is not None:
        out = out * weight.astype(xf.dtype)[None, :, None]
    if bias is not None:
        out = out + bias.astype(xf.dtype)[None, :, None]
    return out.reshape(x.shape), mean, rstd


@lowering("native_group_norm", real_only=True)
def native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    out, mean, rstd = _group_norm(x, weight, bias, n, c, hxw, group, eps)
    return out.astype(x.dtype), mean.astype(x.dtype), rstd.astype(x.dtype)


@lowering("native_group_norm_backward")
def native_group_norm_backward(grad, x, mean, rstd, weight, n, c, hxw, group, output_mask):
    # with the saved statistics, as layer norm: xhat = (x - mean) * rstd per (sample, group)
    shape = (n, group, c // group, hxw)
    xf, g = to_opmath(x).reshape(shape), to_opmath(grad).reshape(shape)
    m, r = to_opmath(mean)[:, :, None, None], to_opmath(rstd)[:, :, None, None]
    xhat = (xf - m) * r
    w = weight.astype(xf.dtype).reshape(1, group, c // group, 1) if weight is not None else 1.0
    gw_ = g * w
    axes = (2, 3)
    dx = r * (gw_ - jnp.mean(gw_, axis=axes, keepdims=True) - xhat * jnp.mean(gw_ * xhat, axis=axes, keepdims=True))
    wdt = weight.dtype if weight is not None else x.dtype
    dw = jnp.sum(g * xhat, axis=(0, 3)).reshape(c).astype(wdt) if output_mask[1] else None
    db = jnp.sum(g, axis=(0, 3)).reshape(c).astype(wdt) if output_mask[2] else None
    return (dx.reshape(x.shape).astype(x.dtype) if output_mask[0] else None, dw, db)
