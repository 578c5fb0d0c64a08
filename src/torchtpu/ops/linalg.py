"""Lowerings: linalg."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .table import KIND, lowering

import torch


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
    out = prod if (isinstance(alpha, int) and alpha == 1) else prod * alpha
    if isinstance(beta, (int, float)) and beta == 0:
        return out  # PyTorch ignores c (even NaN) when beta == 0
    c = c if (isinstance(beta, int) and beta == 1) else c * beta
    return (c + out).astype(prod.dtype)


@lowering("addmm", "baddbmm", "addmv", promote=KIND.DEFAULT, promote_args=(0, 1, 2))
def addmm(c, a, b, beta=1, alpha=1):
    return _scaled_sum(c, matmul(a, b), beta, alpha)


@lowering("addbmm", promote=KIND.DEFAULT, promote_args=(0, 1, 2))
def addbmm(c, a, b, beta=1, alpha=1):
    return _scaled_sum(c, matmul(a, b).sum(0), beta, alpha)


@lowering("addr", promote=KIND.DEFAULT, promote_args=(0, 1, 2))
def addr(c, a, b, beta=1, alpha=1):
    return _scaled_sum(c, jnp.outer(a, b), beta, alpha)
