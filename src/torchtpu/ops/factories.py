"""Lowerings: factories."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from .table import KIND, lowering



@lowering("full")
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, dtype or jnp.float32)


@lowering("_efficientzerotensor")
def efficient_zero_tensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    # PyTorch's ZeroTensor is a CPU/CUDA storage-free optimisation; a dense zero is equivalent
    return jnp.zeros(tuple(size), dtype or jnp.float32)


@lowering("scalar_tensor")
def scalar_tensor(s, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s, dtype or jnp.float32)


@lowering("arange.start_step", static_scalars=True)
def arange(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    # the length is static: PyTorch's own formula (its int64 kernel truncates start/end/step to
    # integers and divides in integer arithmetic; other dtypes use doubles)
    d = dtype or (jnp.int64 if all(isinstance(v, int) for v in (start, end, step)) else jnp.float32)
    if d == jnp.int64:
        s, e, st = int(start), int(end), int(step)
        sgn = (st > 0) - (st < 0)
        num = e - s + st - sgn
        n = abs(num) // abs(st) * (1 if (num >= 0) == (st > 0) else -1)  # C++ truncating division
        return s + jnp.arange(max(n, 0), dtype=jnp.int64) * st
    n = max(0, math.ceil((float(end) - float(start)) / float(step)))
    if jnp.issubdtype(d, jnp.integer) or d == jnp.bool_:
        return (int(start) + jnp.arange(n, dtype=jnp.int64) * int(step)).astype(d)
    return (start + jnp.arange(n, dtype=jnp.float64) * step).astype(d)


@lowering("arange.start_out", static_scalars=True)
def arange_out(start, end, step=1, *, out):
    # `out` arrives already resized to PyTorch's length; its dtype decides the values' type
    return arange(start, end, step, dtype=out.dtype)


def _compute_dtype(d):
    # PyTorch's CPU kernel steps in double for integers and in the (op-math) float type otherwise
    if jnp.issubdtype(d, jnp.integer) or d == jnp.bool_ or d == jnp.float64:
        return jnp.float64
    return jnp.float32


def _ramp(start, end, steps, d):
    """PyTorch's linspace: start + i*step for the first half, end - (steps-1-i)*step after."""
    c = _compute_dtype(d)
    s = jnp.asarray(start).astype(d).astype(c)
    e = jnp.asarray(end).astype(d).astype(c)
    if steps == 1:
        return jnp.reshape(s, (1,))
    i = jnp.arange(steps, dtype=c)
    step = (e - s) / (steps - 1)
    return jnp.where(i < steps // 2, s + step * i, e - step * (steps - 1 - i))


@lowering("linspace", "linspace.Tensor_Tensor", "linspace.Tensor_Scalar", "linspace.Scalar_Tensor")
def linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    d = dtype or jnp.float32
    if steps == 0:
        return jnp.zeros((0,), d)
    return _ramp(start, end, steps, d).astype(d)


@lowering("logspace", "logspace.Tensor_Tensor", "logspace.Tensor_Scalar", "logspace.Scalar_Tensor")
def logspace(start, end, steps, base=10.0, dtype=None, layout=None, device=None, pin_memory=None):
    d = dtype or jnp.float32
    if steps == 0:
        return jnp.zeros((0,), d)
    c = _compute_dtype(d)
    return jnp.power(jnp.asarray(base, c), _ramp(start, end, steps, d)).astype(d)


# out= factories have no functional twin with the same arguments (their dtype comes from `out`)
@lowering("linspace.out", "linspace.Tensor_Tensor_out", "linspace.Tensor_Scalar_out", "linspace.Scalar_Tensor_out")
def linspace_out(start, end, steps, *, out):
    return linspace(start, end, steps, dtype=out.dtype)


@lowering("logspace.out", "logspace.Tensor_Tensor_out", "logspace.Tensor_Scalar_out", "logspace.Scalar_Tensor_out")
def logspace_out(start, end, steps, base=10.0, *, out):
    return logspace(start, end, steps, base, dtype=out.dtype)


@lowering("eye", "eye.m")
def eye(n, m=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=dtype or jnp.float32)
