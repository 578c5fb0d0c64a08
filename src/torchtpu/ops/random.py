"""Lowerings: random."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .table import KIND, lowering



def _float(a):
    return a.dtype if jnp.issubdtype(a.dtype, jnp.floating) else jnp.float32


@lowering("uniform", random=True)
def uniform(a, from_=0.0, to=1.0, generator=None, *, key):
    u = jax.random.uniform(key, a.shape, jnp.float32 if a.dtype != jnp.float64 else jnp.float64)
    return (from_ + u * (to - from_)).astype(a.dtype)


@lowering("normal_functional", random=True)
def normal(a, mean=0.0, std=1.0, generator=None, *, key):
    z = jax.random.normal(key, a.shape, jnp.float32 if a.dtype != jnp.float64 else jnp.float64)
    return (mean + z * std).astype(a.dtype)


@lowering("bernoulli.p", random=True)
def bernoulli_p(a, p=0.5, generator=None, *, key):
    return (jax.random.uniform(key, a.shape, jnp.float32) < p).astype(a.dtype)


@lowering("bernoulli.Tensor", random=True)
def bernoulli_t(a, p, generator=None, *, key):
    return (jax.random.uniform(key, a.shape, jnp.float32) < p).astype(a.dtype)


@lowering("bernoulli", random=True)
def bernoulli(a, generator=None, *, key):
    return (jax.random.uniform(key, a.shape, jnp.float32) < a).astype(a.dtype)


@lowering("native_dropout", random=True)
def native_dropout(a, p, train, *, key):
    if not train or p == 0:
        return a, jnp.ones(a.shape, jnp.bool_)
    keep = jax.random.uniform(key, a.shape, jnp.float32) >= p
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    return jnp.where(keep, a * scale, 0).astype(a.dtype), keep


@lowering("native_dropout_backward")
def native_dropout_backward(grad, mask, scale):
    return (grad * mask * scale).astype(grad.dtype)
