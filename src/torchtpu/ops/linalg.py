"""Lowerings: linalg."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .table import KIND, lowering

import torch


PRECISION_EPOCH = [0]  # bumped by torch.set_float32_matmul_precision (see eager/kernels.py)


def precision():
    """PyTorch's float32 matmul setting as XLA precision (XLA's TPU default would be bf16 passes)."""
    setting = torch.get_float32_matmul_precision()
    return {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH}.get(setting, lax.Precision.DEFAULT)


def _acc(a):
    return jnp.float32 if a.dtype in (jnp.float16, jnp.bfloat16) else None


def matmul(a, b):
    return jnp.matmul(a, b, precision=precision(), preferred_element_type=_acc(a)).astype(a.dtype)


@lowering("mm", "bmm", "matmul", "dot", "vdot", "mv")
def mm(a, b):
    return matmul(a, b)


def _scaled_sum(c, prod, beta, alpha):
    """beta * c + alpha * prod, as PyTorch: integer results take integer alpha/beta (truncated), and
    beta == 0 ignores c entirely (NaN included). alpha/beta may be traced Scalars."""
    d = prod.dtype
    if not jnp.issubdtype(d, jnp.inexact):
        alpha = alpha if isinstance(alpha, int) else jnp.asarray(alpha).astype(d)
        beta = beta if isinstance(beta, int) else jnp.asarray(beta).astype(d)
    out = prod if (isinstance(alpha, int) and alpha == 1) else prod * alpha
    if isinstance(beta, (int, float)):
        if beta == 0:
            return out.astype(d)
        c = c if (isinstance(beta, int) and beta == 1) else c * beta
    else:
        c = jnp.where(beta == 0, jnp.zeros_like(c), c * beta)
    return (c + out).astype(d)


@lowering("addmm", "baddbmm", "addmv", promote=KIND.DEFAULT, promote_args=(0, 1, 2))
def addmm(c, a, b, beta=1, alpha=1):
    return _scaled_sum(c, matmul(a, b), beta, alpha)


@lowering("addbmm", promote=KIND.DEFAULT, promote_args=(0, 1, 2))
def addbmm(c, a, b, beta=1, alpha=1):
    return _scaled_sum(c, matmul(a, b).sum(0), beta, alpha)


@lowering("addr", promote=KIND.DEFAULT, promote_args=(0, 1, 2))
def addr(c, a, b, beta=1, alpha=1):
    return _scaled_sum(c, jnp.outer(a, b), beta, alpha)


@lowering("_cdist_forward")
def cdist(x1, x2, p, compute_mode=None):
    from .reductions import _norm
    diff = jnp.expand_dims(x1, -2) - jnp.expand_dims(x2, -3)   # (..., P, R, M)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    return _norm(diff, p, (diff.ndim - 1,), False)
