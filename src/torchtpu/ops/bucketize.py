"""Lowerings: searchsorted and bucketize, with the CPU's argument checks and performance warnings."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from .argument_checks import warn_at_caller
from .checks import require_index
from .dtypes import WIDE_UNSIGNED, not_implemented_for, scalar_type_name
from .table import lowering


def _searchsorted(seq, values, right, sorter):
    if sorter is not None:
        require_index(sorter, seq.shape[-1], False, "torch.searchsorted(): sorter index out of range")
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    side = "right" if right else "left"
    if seq.ndim == 1:
        return jnp.searchsorted(seq, values, side=side, method="compare_all" if seq.shape[0] <= 64 else "scan")
    # explicit sizes: an empty batch or row leaves -1 undetermined (seq (0, 0))
    flat_seq = seq.reshape(math.prod(seq.shape[:-1]), seq.shape[-1])
    flat_val = values.reshape(flat_seq.shape[0], values.shape[-1])
    out = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(flat_seq, flat_val)
    return out.reshape(values.shape)


_searchsorted_warned = set()


def _non_contiguous_warning(what, tensor):
    """The CPU's performance warning for a non-contiguous operand of searchsorted/bucketize: once per
    program and operand (TORCH_WARN_ONCE) unless torch.set_warn_always(True)."""
    if not isinstance(tensor, torch.Tensor) or tensor.is_contiguous():
        return
    if what in _searchsorted_warned and not torch.is_warn_always_enabled():
        return
    _searchsorted_warned.add(what)
    warn_at_caller(
        f"torch.searchsorted(): {what} tensor is non-contiguous, this will lower the performance due to extra "
        f"data copy when converting non-contiguous tensor to contiguous, please use contiguous {what} tensor if "
        "possible. This message will only appear once per program."
    )


def _searchsorted_contiguity(boundaries, values, *args, sorter=None, **kwargs):
    """host_check of searchsorted (values may be a Scalar): the CPU's order of warnings."""
    _non_contiguous_warning("input value", values)
    _non_contiguous_warning("boundary", boundaries)
    _non_contiguous_warning("sorter", sorter)


def _bucketize_contiguity(values, boundaries, *args, **kwargs):
    _searchsorted_contiguity(boundaries, values)


def _searchsorted_check(boundaries, values, *, out_int32=False, right=False, side=None, sorter=None, out=None):
    """meta_check of searchsorted and bucketize: the CPU's argument checks, in its order and words
    (the meta kernels make only some of them)."""
    if side is not None and side not in ("left", "right"):
        raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
    if side == "left" and right:
        raise RuntimeError(
            "torch.searchsorted(): side and right can't be set to opposites, got side of left while right was True"
        )
    if sorter is not None:
        if sorter.shape != boundaries.shape:
            raise RuntimeError(
                "torch.searchsorted(): boundary and sorter must have the same size, but got boundary tensor "
                f"{list(boundaries.shape)}and got sorter tensor {list(sorter.shape)}"
            )
        if sorter.dtype != torch.int64:
            raise RuntimeError(
                "torch.searchsorted(): sorter must be a tensor of long dtype but got dtype "
                + scalar_type_name(sorter.dtype)
            )
    if boundaries.dim() != 1 and (not isinstance(values, torch.Tensor) or values.dim() == 0):
        raise RuntimeError(
            "torch.searchsorted(): input value can be a scalar only when boundaries tensor dimension is 1, but we "
            f"got boundaries tensor dim({boundaries.dim()}) and input value's dim(0) numel(1)"
        )
    if isinstance(out, torch.Tensor) and out.dtype != (torch.int32 if out_int32 else torch.int64):
        raise RuntimeError(
            "torch.searchsorted(): output tensor's dtype is wrong, it can only be Int(int32) or Long(int64) depending "
            f"on whether out_int32 flag is True, but we got output tensor's dtype {scalar_type_name(out.dtype)} and "
            f"out_int32 flag is {out_int32}"
        )
    # the CPU searches in the operands' common dtype, and has no bool or wide unsigned loop for it
    common = torch.result_type(boundaries, values)
    empty = isinstance(values, torch.Tensor) and values.numel() == 0  # (returns before its dispatch)
    if not empty and (common == torch.bool or common in WIDE_UNSIGNED):
        raise not_implemented_for("searchsorted_out", common)


def _bucketize_check(values, boundaries, *, out_int32=False, right=False, out=None):
    if boundaries.dim() != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.dim()})")
    _searchsorted_check(boundaries, values, out_int32=out_int32, right=right, out=out)


@lowering(
    "searchsorted.Tensor",
    real_only=True,
    host_check=dict.fromkeys(("searchsorted.Tensor", "searchsorted.Tensor_out"), _searchsorted_contiguity),
    meta_check=dict.fromkeys(("searchsorted.Tensor", "searchsorted.Tensor_out"), _searchsorted_check),
)
def searchsorted(seq, values, out_int32=False, right=False, side=None, sorter=None):
    right = right or side == "right"
    out = _searchsorted(seq, values, right, sorter)
    return out.astype(jnp.int32 if out_int32 else jnp.int64)


@lowering(
    "searchsorted.Scalar",
    real_only=True,
    host_check=dict.fromkeys(("searchsorted.Scalar", "searchsorted.Scalar_out"), _searchsorted_contiguity),
    meta_check=dict.fromkeys(("searchsorted.Scalar", "searchsorted.Scalar_out"), _searchsorted_check),
)
def searchsorted_scalar(seq, value, out_int32=False, right=False, side=None, sorter=None):
    right = right or side == "right"
    value = jnp.asarray(value, seq.dtype) if not hasattr(value, "shape") or value.ndim == 0 else value
    out = _searchsorted(
        seq, value.reshape(()) if seq.ndim == 1 else jnp.broadcast_to(value, seq.shape[:-1] + (1,)), right, sorter
    )
    return out.astype(jnp.int32 if out_int32 else jnp.int64)


@lowering(
    "bucketize.Tensor",
    real_only=True,
    host_check=dict.fromkeys(("bucketize.Tensor", "bucketize.Tensor_out"), _bucketize_contiguity),
    meta_check=dict.fromkeys(("bucketize.Tensor", "bucketize.Tensor_out"), _bucketize_check),
)
def bucketize(values, boundaries, out_int32=False, right=False):
    out = _searchsorted(boundaries, values, right, None)
    return out.astype(jnp.int32 if out_int32 else jnp.int64)


@lowering(
    "bucketize.Scalar",
    real_only=True,
    host_check=_bucketize_contiguity,
    meta_check=dict.fromkeys(("bucketize.Scalar", "bucketize.Scalar_out"), _bucketize_check),
)
def bucketize_scalar(value, boundaries, out_int32=False, right=False):
    out = _searchsorted(boundaries, jnp.asarray(value, boundaries.dtype), right, None)
    return out.astype(jnp.int32 if out_int32 else jnp.int64)
