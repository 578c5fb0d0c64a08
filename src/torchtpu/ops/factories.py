"""Lowerings: factories."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .table import KIND, lowering



@lowering("full")
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, dtype or jnp.float32)


@lowering("scalar_tensor")
def scalar_tensor(s, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s, dtype or jnp.float32)


@lowering("arange.start_step", static_scalars=True)
def arange(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    # length is static (PyTorch computes it the same way); values from start + i * step
    import math
    n = max(0, math.ceil((end - start) / step))
    d = dtype or (jnp.int64 if all(isinstance(v, int) for v in (start, end, step)) else jnp.float32)
    acc = jnp.float64 if jnp.issubdtype(d, jnp.floating) else jnp.int64
    return (start + jnp.arange(n, dtype=acc) * step).astype(d)


@lowering("arange.start_out", static_scalars=True)
def arange_out(start, end, step=1, *, out):
    # `out` arrives already resized to PyTorch's length; its dtype decides the values' type
    return arange(start, end, step, dtype=out.dtype)
