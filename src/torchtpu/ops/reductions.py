"""Lowerings: reductions."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .table import KIND, lowering


def _dims(a, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(d % max(a.ndim, 1) for d in dim) if a.ndim else None


def _acc_dtype(a, dtype):
    if dtype is not None:
        return dtype
    if a.dtype == jnp.bool_ or jnp.issubdtype(a.dtype, jnp.integer):
        return jnp.int64
    return a.dtype


@lowering("sum", "sum.dim_IntList")
def sum_(a, dim=None, keepdim=False, dtype=None):
    d = _acc_dtype(a, dtype)
    acc = jnp.float32 if d in (jnp.float16, jnp.bfloat16) else d
    return jnp.sum(a.astype(acc), axis=_dims(a, dim), keepdims=keepdim).astype(d)


@lowering("mean", "mean.dim")
def mean(a, dim=None, keepdim=False, dtype=None):
    d = dtype or a.dtype
    acc = jnp.float32 if d in (jnp.float16, jnp.bfloat16) else d
    return jnp.mean(a.astype(acc), axis=_dims(a, dim), keepdims=keepdim).astype(d)


@lowering("prod", "prod.dim_int")
def prod(a, dim=None, keepdim=False, dtype=None):
    d = _acc_dtype(a, dtype)
    return jnp.prod(a.astype(d), axis=_dims(a, dim), keepdims=keepdim)


@lowering("amax")
def amax(a, dim=(), keepdim=False):
    return jnp.max(a, axis=_dims(a, dim), keepdims=keepdim)


@lowering("amin")
def amin(a, dim=(), keepdim=False):
    return jnp.min(a, axis=_dims(a, dim), keepdims=keepdim)


@lowering("max")
def max_all(a):
    return jnp.max(a)


@lowering("min")
def min_all(a):
    return jnp.min(a)


def _arg_reduce(a, dim, keepdim, fn):
    if dim is None:
        return fn(a.reshape(-1), axis=0).astype(jnp.int64).reshape((1,) * a.ndim if keepdim else ())
    d = dim % max(a.ndim, 1)
    return fn(a, axis=d, keepdims=keepdim).astype(jnp.int64) if a.ndim else jnp.zeros((), jnp.int64)


@lowering("argmax")
def argmax(a, dim=None, keepdim=False):
    return _arg_reduce(a, dim, keepdim, jnp.argmax)


@lowering("argmin")
def argmin(a, dim=None, keepdim=False):
    return _arg_reduce(a, dim, keepdim, jnp.argmin)


@lowering("max.dim")
def max_dim(a, dim, keepdim=False):
    d = dim % max(a.ndim, 1)
    if a.ndim == 0:
        return a, jnp.zeros((), jnp.int64)
    return jnp.max(a, axis=d, keepdims=keepdim), jnp.argmax(a, axis=d, keepdims=keepdim).astype(jnp.int64)


@lowering("min.dim")
def min_dim(a, dim, keepdim=False):
    d = dim % max(a.ndim, 1)
    if a.ndim == 0:
        return a, jnp.zeros((), jnp.int64)
    return jnp.min(a, axis=d, keepdims=keepdim), jnp.argmin(a, axis=d, keepdims=keepdim).astype(jnp.int64)


@lowering("any", "any.dim", "any.dims")
def any_(a, dim=None, keepdim=False):
    return jnp.any(a, axis=_dims(a, dim), keepdims=keepdim)


@lowering("all", "all.dim", "all.dims")
def all_(a, dim=None, keepdim=False):
    return jnp.all(a, axis=_dims(a, dim), keepdims=keepdim)


@lowering("var.correction")
def var(a, dim=None, correction=None, keepdim=False):
    ddof = 1 if correction is None else correction
    acc = jnp.float32 if a.dtype in (jnp.float16, jnp.bfloat16) else a.dtype
    return jnp.var(a.astype(acc), axis=_dims(a, dim), ddof=ddof, keepdims=keepdim).astype(a.dtype)


@lowering("std.correction")
def std(a, dim=None, correction=None, keepdim=False):
    return jnp.sqrt(var(a, dim, correction, keepdim))


@lowering("var_mean.correction")
def var_mean(a, dim=None, correction=None, keepdim=False):
    return var(a, dim, correction, keepdim), mean(a, dim, keepdim)


@lowering("logsumexp")
def logsumexp(a, dim, keepdim=False):
    if not jnp.issubdtype(a.dtype, jnp.floating):
        a = a.astype(jnp.float32)
    return jax.nn.logsumexp(a, axis=_dims(a, dim), keepdims=keepdim)


@lowering("cumsum")
def cumsum(a, dim, dtype=None):
    d = _acc_dtype(a, dtype)
    return jnp.cumsum(a.astype(d), axis=dim % max(a.ndim, 1)) if a.ndim else a.astype(d)


@lowering("cumprod")
def cumprod(a, dim, dtype=None):
    d = _acc_dtype(a, dtype)
    return jnp.cumprod(a.astype(d), axis=dim % max(a.ndim, 1)) if a.ndim else a.astype(d)


@lowering("linalg_vector_norm")
def vector_norm(a, ord=2, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        a = a.astype(dtype)
    axis = _dims(a, dim)
    x = jnp.abs(a)
    if ord == float("inf"):
        return jnp.max(x, axis=axis, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(x, axis=axis, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((x != 0).astype(a.dtype), axis=axis, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(x, axis=axis, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=keepdim))
    return jnp.sum(x ** ord, axis=axis, keepdims=keepdim) ** (1.0 / ord)
