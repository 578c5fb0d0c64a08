"""Lowerings: activations and their backward ops, softmax and log_softmax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .argument_checks import input_loop_check
from .dtypes import NOT_FLOATING, scalar_type_name, to_opmath
from .table import KIND, WriteOverlap, lowering


def _relu_bool_check(a, *_, **__):
    if a.dtype == torch.bool:  # the CPU's and CUDA's check, before any kernel
        raise RuntimeError("Boolean inputs not supported for relu")


@lowering("relu", promote=KIND.DEFAULT, real_only=True, meta_check=dict.fromkeys(("relu", "relu_"), _relu_bool_check))
def relu(a):
    return jnp.maximum(a, 0)


@lowering(
    "threshold",
    promote=KIND.DEFAULT,
    promote_args=(0,),
    real_only=True,
    no_loop_for=(torch.bool,),
    write_overlap=WriteOverlap(unchecked=True),
)
def threshold(a, threshold, value):
    return jnp.where(a <= threshold, value, a)


@lowering("threshold_backward", promote=KIND.DEFAULT, promote_args=(0, 1))
def threshold_backward(grad, a, threshold):
    return jnp.where(a <= threshold, 0, grad)


@lowering("gelu", promote=KIND.DEFAULT, no_loop_for=NOT_FLOATING)
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


@lowering("sigmoid_backward", promote=KIND.DEFAULT, no_loop_for=NOT_FLOATING)
def sigmoid_backward(grad, out):
    return grad * jnp.conj(out * (1 - out))  # conj: PyTorch's complex (Wirtinger) convention


@lowering("tanh_backward", promote=KIND.DEFAULT, no_loop_for=NOT_FLOATING)
def tanh_backward(grad, out):
    return grad * jnp.conj(1 - out * out)


def _softmax_has_loop(a, kernel):
    """_softmax/_log_softmax's CPU and CUDA kernels take floating inputs only, but return an input
    without elements (of any dtype) as it is, before choosing a kernel."""
    return not a.numel() or a.is_floating_point()


@lowering("_softmax", real_only=True, meta_check=input_loop_check(("_softmax",), _softmax_has_loop))
def softmax(a, dim, half_to_float=False):
    if not a.size:
        return a.astype(jnp.float32) if half_to_float else a
    # a 0-d input is one element along its dim: 1, but nan for a non-finite one (inf - inf) as on the CPU
    out = jax.nn.softmax(to_opmath(a).reshape(a.shape or (1,)), axis=dim if a.ndim else 0).reshape(a.shape)
    return out if half_to_float else out.astype(a.dtype)


@lowering("_log_softmax", real_only=True, meta_check=input_loop_check(("_log_softmax",), _softmax_has_loop))
def log_softmax(a, dim, half_to_float=False):
    if not a.size:
        return a.astype(jnp.float32) if half_to_float else a
    out = jax.nn.log_softmax(to_opmath(a).reshape(a.shape or (1,)), axis=dim if a.ndim else 0).reshape(a.shape)
    return out if half_to_float else out.astype(a.dtype)


@lowering("_softmax_backward_data")
def softmax_backward(grad, out, dim, input_dtype):
    g, o = to_opmath(grad), to_opmath(out)
    return (o * (g - jnp.sum(g * o, axis=dim if g.ndim else None, keepdims=True))).astype(input_dtype)


@lowering("_log_softmax_backward_data")
def log_softmax_backward(grad, out, dim, input_dtype):
    g, o = to_opmath(grad), to_opmath(out)
    return (g - jnp.exp(o) * jnp.sum(g, axis=dim if g.ndim else None, keepdims=True)).astype(input_dtype)


@lowering("leaky_relu", promote=KIND.DEFAULT, promote_args=(0,), real_only=True, no_loop_for=NOT_FLOATING)
def leaky_relu(a, negative_slope=0.01):
    return jnp.where(a > 0, a, a * negative_slope)


def _inplace_negative_slope_check(name, slope_at, result_at):
    """The CPU's host check of an in-place activation's backward (the forward's result saved instead of
    its input): a negative slope makes the input unrecoverable from the result."""

    def check(*args, **kwargs):
        slope, from_result = args[slope_at], args[result_at]
        if from_result and slope < 0:
            raise RuntimeError(
                f"In-place {name} backward calculation is triggered with a negative slope which is not supported. "
                "This is caused by calling in-place forward function with a negative slope, please call "
                "out-of-place version instead."
            )

    return check


_LEAKY_RELU_RESULT_CHECK = _inplace_negative_slope_check("leakyReLu", 2, 3)


@lowering(
    "leaky_relu_backward",
    promote=KIND.DEFAULT,
    promote_args=(0, 1),
    host_check=_LEAKY_RELU_RESULT_CHECK,
)
def leaky_relu_backward(grad, a, negative_slope, self_is_result):
    return jnp.where(a > 0, grad, grad * negative_slope)


@lowering("elu", promote=KIND.DEFAULT, promote_args=(0,), real_only=True, no_loop_for=NOT_FLOATING)
def elu(a, alpha=1, scale=1, input_scale=1):
    x = to_opmath(a)
    return jnp.where(x > 0, x * scale, jnp.expm1(x * input_scale) * alpha * scale).astype(a.dtype)


@lowering(
    "elu_backward", promote=KIND.DEFAULT, promote_args=(0, 5), host_check=_inplace_negative_slope_check("elu", 1, 4)
)
def elu_backward(grad, alpha, scale, input_scale, is_result, x):
    g, v = to_opmath(grad), to_opmath(x)
    if is_result:
        neg = g * input_scale * (v + alpha * scale)
    else:
        neg = g * input_scale * alpha * scale * jnp.exp(v * input_scale)
    return jnp.where(v > 0, g * scale, neg).astype(grad.dtype)


@lowering("hardtanh", promote=KIND.DEFAULT, promote_args=(0,), real_only=True)
def hardtanh(a, min_val=-1, max_val=1):
    return jnp.minimum(jnp.maximum(a, min_val), max_val).astype(a.dtype)


@lowering("hardtanh_backward", promote=KIND.DEFAULT, promote_args=(0, 1))
def hardtanh_backward(grad, a, min_val, max_val):
    return jnp.where((a <= min_val) | (a >= max_val), 0, grad).astype(grad.dtype)


@lowering("hardswish", promote=KIND.DEFAULT, no_loop_for=(torch.bool,), real_only=True)
def hardswish(a):
    x = to_opmath(a)
    return (x * jnp.clip(x + 3, 0, 6) / 6).astype(a.dtype)


@lowering("hardswish_backward", promote=KIND.DEFAULT)
def hardswish_backward(grad, a):
    g, x = to_opmath(grad), to_opmath(a)  # at the kinks PyTorch takes the outer pieces: 0 at -3, g at 3
    return jnp.where(x <= -3, 0, jnp.where(x < 3, g * (x / 3 + 0.5), g)).astype(grad.dtype)


@lowering("hardsigmoid", promote=KIND.DEFAULT, no_loop_for=NOT_FLOATING, real_only=True)
def hardsigmoid(a):
    return (jnp.clip(to_opmath(a) + 3, 0, 6) / 6).astype(a.dtype)


@lowering("hardsigmoid_backward", promote=KIND.DEFAULT)
def hardsigmoid_backward(grad, a):
    return jnp.where((a > -3) & (a < 3), to_opmath(grad) / 6, 0).astype(grad.dtype)


@lowering("softplus", promote=KIND.DEFAULT, promote_args=(0,), real_only=True, no_loop_for=NOT_FLOATING)
def softplus(a, beta=1, threshold=20):
    x = to_opmath(a)
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta).astype(a.dtype)


@lowering("softplus_backward", promote=KIND.DEFAULT, promote_args=(0, 1))
def softplus_backward(grad, a, beta, threshold):
    g, x = to_opmath(grad), to_opmath(a)
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, g, g * z / (z + 1)).astype(grad.dtype)


@lowering("mish", promote=KIND.DEFAULT, no_loop_for=NOT_FLOATING, real_only=True)
def mish(a):
    x = to_opmath(a)
    return (x * jnp.tanh(jax.nn.softplus(x))).astype(a.dtype)


@lowering("mish_backward", promote=KIND.DEFAULT)
def mish_backward(grad, a):
    g, x = to_opmath(grad), to_opmath(a)
    t = jnp.tanh(jax.nn.softplus(x))
    return (g * (t + x * jax.nn.sigmoid(x) * (1 - t * t))).astype(grad.dtype)


@lowering("glu", real_only=True)
def glu(a, dim=-1):
    x, gate = jnp.split(a, 2, axis=dim)
    return (to_opmath(x) * jax.nn.sigmoid(to_opmath(gate))).astype(a.dtype)


@lowering("glu_backward")
def glu_backward(grad, a, dim):
    _, vjp = jax.vjp(lambda v: glu(v, dim), to_opmath(a))
    return vjp(to_opmath(grad))[0].astype(a.dtype)


@lowering("_prelu_kernel", promote=KIND.DEFAULT, real_only=True, no_loop_for=NOT_FLOATING)
def prelu_kernel(a, weight):
    return jnp.where(a > 0, a, weight * a)


@lowering("_prelu_kernel_backward")
def prelu_kernel_backward(grad, a, weight):
    return (jnp.where(a > 0, grad, weight * grad).astype(a.dtype), jnp.where(a > 0, 0, a * grad).astype(weight.dtype))


@lowering("log_sigmoid_forward", real_only=True, no_loop_for=NOT_FLOATING)
def log_sigmoid_forward(a):
    x = to_opmath(a)
    out = jnp.minimum(x, 0) - jnp.log1p(jnp.exp(-jnp.abs(x)))
    return out.astype(a.dtype), jnp.zeros((), a.dtype)  # PyTorch's buffer is empty on CPU


@lowering("log_sigmoid_backward")
def log_sigmoid_backward(grad, a, buffer):
    return (to_opmath(grad) * jax.nn.sigmoid(-to_opmath(a))).astype(grad.dtype)


def _softshrink_lambda_check(a, lambd=0.5, **out):
    """The CPU's check and words (PyTorch's meta kernel formats the bound and dtype as Python does)."""
    bound = torch.finfo(a.dtype).max if a.dtype.is_floating_point else None
    if bound is not None and not 0 <= float(lambd) <= bound:
        raise RuntimeError(
            f"lambda must be in range [0, {bound:g}] for input dtype {scalar_type_name(a.dtype)}, but found {lambd:g}"
        )


@lowering(
    "softshrink",
    promote=KIND.DEFAULT,
    promote_args=(0,),
    real_only=True,
    meta_check=dict.fromkeys(("softshrink", "softshrink.out"), _softshrink_lambda_check),
    no_loop_for=NOT_FLOATING,
)
def softshrink(a, lambd=0.5):
    # NaN stays NaN, as on the CPU (its vectorized loop; CUDA's gives 0)
    shrunk = jnp.where(a > lambd, a - lambd, jnp.where(a < -lambd, a + lambd, 0))
    return jnp.where(jnp.isnan(a), a, shrunk).astype(a.dtype)


@lowering("softshrink_backward", promote=KIND.DEFAULT, promote_args=(0, 1))
def softshrink_backward(grad, a, lambd):
    return jnp.where((a >= -lambd) & (a <= lambd), 0, grad).astype(grad.dtype)


@lowering("hardshrink", promote=KIND.DEFAULT, no_loop_for=NOT_FLOATING, promote_args=(0,), real_only=True)
def hardshrink(a, lambd=0.5):
    return jnp.where((a >= -lambd) & (a <= lambd), 0, a).astype(a.dtype)


@lowering("hardshrink_backward", promote=KIND.DEFAULT, promote_args=(0, 1))
def hardshrink_backward(grad, a, lambd):
    return jnp.where((a >= -lambd) & (a <= lambd), 0, grad).astype(grad.dtype)


@lowering("rrelu_with_noise", "rrelu_with_noise_", random=True, real_only=True, no_loop_for=NOT_FLOATING)
def rrelu_with_noise(a, noise, lower=0.125, upper=1 / 3, training=False, generator=None, *, key):
    if training:
        r = jax.random.uniform(key, a.shape, jnp.float32, 0, 1) * (upper - lower) + lower
        new_noise = jnp.where(a >= 0, 1, r).astype(noise.dtype)
        return (a * new_noise.astype(a.dtype)).astype(a.dtype), new_noise
    return jnp.where(a >= 0, a, a * ((lower + upper) / 2)).astype(a.dtype), noise


def _rrelu_inplace_check(grad, a, noise, lower, upper, training, self_is_result):
    """host_check: out of training the CPU's backward is leaky_relu's at the mean slope, whose check
    refuses a negative slope when the forward was in place (rrelu_)."""
    if not training:
        _LEAKY_RELU_RESULT_CHECK(grad, a, (lower + upper) / 2, self_is_result)


@lowering("rrelu_with_noise_backward", host_check=_rrelu_inplace_check)
def rrelu_with_noise_backward(grad, a, noise, lower, upper, training, self_is_result):
    if training:
        return (grad * noise).astype(grad.dtype)
    return jnp.where(a > 0, grad, grad * ((lower + upper) / 2)).astype(grad.dtype)
