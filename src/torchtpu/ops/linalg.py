"""Lowerings: linalg."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .checks import require
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


def _pair_diff(x1, x2):
    return jnp.expand_dims(x1, -2) - jnp.expand_dims(x2, -3)   # (..., P, R, M)


def _distance(diff, p):
    """p-norm over the last axis (the coordinates) of point differences."""
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    from .reductions import _norm
    return _norm(diff, p, (diff.ndim - 1,), False)


@lowering("_cdist_forward")
def cdist(x1, x2, p, compute_mode=None):
    return _distance(_pair_diff(x1, x2), p)


def _dist_grad(diff, dist, p):
    """d dist / d diff for a p-norm distance, as PyTorch's cdist/pdist backward kernels define it
    (zero where the distance is zero, so coincident points get no NaN)."""
    safe = jnp.where(dist == 0, 1, dist)
    if p == 0:
        g = jnp.zeros_like(diff)
    elif p == 1:
        g = jnp.sign(diff)
    elif p == 2:
        g = diff / safe
    elif p == float("inf"):
        g = jnp.sign(diff) * (jnp.abs(diff) == dist)
    elif p < 2:
        g = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1)
        g = jnp.where((p < 1) & (diff == 0), 0, g)
    else:
        g = diff * jnp.abs(diff) ** (p - 2) / safe ** (p - 1)
    return jnp.where(dist == 0, 0, g)


@lowering("_cdist_backward")
def cdist_backward(grad, x1, x2, p, cdist):
    g = _dist_grad(_pair_diff(x1, x2), jnp.expand_dims(cdist, -1), p) * jnp.expand_dims(grad, -1)
    return jnp.sum(g, axis=-2).astype(x1.dtype)


@lowering("_pdist_forward")
def pdist(x, p=2.0):
    i, j = jnp.triu_indices(x.shape[0], 1)  # pairs i < j, row-major: PyTorch's order
    return _distance(x[i] - x[j], p)


@lowering("_pdist_backward")
def pdist_backward(grad, x, p, pdist):
    i, j = jnp.triu_indices(x.shape[0], 1)
    g = _dist_grad(x[i] - x[j], pdist[:, None], p) * grad[:, None]
    return jnp.zeros_like(x).at[i].add(g).at[j].add(-g)


# ---------------------------------------------------------------- decompositions: error reporting
_FAILURES = {   # PyTorch's wording, without the failing element's number (the check runs on the device)
    "cholesky": "The factorization could not be completed because the input is not positive-definite",
    "inv": "The diagonal element is zero, the inversion could not be completed because the input matrix is singular",
    "solve": "The solver failed because the input matrix is singular",
    "lu_factor": "The factorization could not be completed because the input matrix is singular (a zero pivot)",
    "eigh": "The algorithm failed to converge because the input matrix is ill-conditioned or has too many "
            "repeated eigenvalues",
    "svd": "The algorithm failed to converge because the input matrix is ill-conditioned or has too many "
           "repeated singular values",
}


@lowering("_linalg_check_errors")
def linalg_check_errors(info, api_name, is_matrix):
    """`check_errors=True` of the linalg ops: a nonzero `info` is a device-side assert (checks.py)."""
    kind = next((k for k in _FAILURES if api_name.split(".")[-1].startswith(k)), None)
    reason = _FAILURES[kind] if kind else "the operation failed (info != 0)"
    require(info == 0, f"{api_name}: {reason}")
    return ()
