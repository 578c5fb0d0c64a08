"""Lowerings: nn."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .table import KIND, lowering


def _f32(a):
    return a.astype(jnp.float32) if a.dtype in (jnp.float16, jnp.bfloat16) else a


@lowering("relu", promote=KIND.DEFAULT)
def relu(a):
    return jnp.maximum(a, 0)


@lowering("threshold", promote=KIND.DEFAULT, promote_args=(0,))
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
    return grad * out * (1 - out)


@lowering("tanh_backward", promote=KIND.DEFAULT)
def tanh_backward(grad, out):
    return grad * (1 - out * out)


@lowering("_softmax")
def softmax(a, dim, half_to_float=False):
    out = jax.nn.softmax(_f32(a), axis=dim)
    return out if half_to_float else out.astype(a.dtype)


@lowering("_log_softmax")
def log_softmax(a, dim, half_to_float=False):
    out = jax.nn.log_softmax(_f32(a), axis=dim)
    return out if half_to_float else out.astype(a.dtype)


@lowering("_softmax_backward_data")
def softmax_backward(grad, out, dim, input_dtype):
    g, o = _f32(grad), _f32(out)
    return (o * (g - jnp.sum(g * o, axis=dim, keepdims=True))).astype(input_dtype)


@lowering("_log_softmax_backward_data")
def log_softmax_backward(grad, out, dim, input_dtype):
    g, o = _f32(grad), _f32(out)
    return (g - jnp.exp(o) * jnp.sum(g, axis=dim, keepdims=True)).astype(input_dtype)


@lowering("native_layer_norm")
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
    return jnp.take(weight, indices, axis=0)


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


@lowering("nll_loss_forward")
def nll_loss_forward(a, target, weight, reduction, ignore_index):
    x = a if a.ndim > 1 else a[None]
    t = target if target.ndim else target[None]
    c = x.shape[1]
    valid = t != ignore_index
    safe = jnp.where(valid, t, 0)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe, 1), axis=1).squeeze(1)
    w = weight[safe] if weight is not None else jnp.ones_like(picked)
    w = jnp.where(valid, w, 0).astype(x.dtype)
    losses = -picked * w
    if reduction == 0:
        return (losses if a.ndim > 1 else losses[0]), jnp.zeros((), a.dtype)
    total = jnp.sum(w)
    if reduction == 1:
        return jnp.sum(losses) / total, total
    del c
    return jnp.sum(losses), total


@lowering("nll_loss_backward")
def nll_loss_backward(grad, a, target, weight, reduction, ignore_index, total_weight):
    x = a if a.ndim > 1 else a[None]
    t = target if target.ndim else target[None]
    valid = t != ignore_index
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
