"""Lowerings: embedding, embedding_renorm and embedding_bag, with their backward ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .checks import require, require_index
from .dtypes import to_opmath
from .table import lowering


def _embedding_check(weight, indices, *_, **__):
    """The CPU's checks of embedding, in its order and words (PyTorch's meta kernel asserts the weight's
    dimensions in other words, an AssertionError)."""
    if weight.dim() != 2:
        raise RuntimeError("'weight' must be 2-D")
    if indices.dtype not in (torch.int64, torch.int32):
        legacy = indices.type().replace("torch.meta.", "torch.tpu.")
        raise RuntimeError(
            "Expected tensor for argument #1 'indices' to have one of the following scalar types: Long, Int; "
            f"but got {legacy} instead (while checking arguments for embedding)"
        )


@lowering("embedding", meta_check=_embedding_check)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    _check_rows(indices, weight.shape[0])
    return jnp.take(weight, indices, axis=0)


@lowering("embedding_renorm")
def embedding_renorm(weight, indices, max_norm, norm_type):
    """The rows that `indices` name, scaled to norm max_norm where their norm exceeds it (as PyTorch:
    scale = max_norm / (norm + 1e-7)); other rows unchanged. `F.embedding(max_norm=)` calls it in place."""
    _check_rows(indices, weight.shape[0])
    w = to_opmath(weight)
    named = jnp.zeros((weight.shape[0],), jnp.bool_).at[indices.reshape(-1)].set(True)
    norm = jnp.linalg.norm(w, ord=norm_type, axis=-1)
    scale = jnp.where(named & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return (w * scale[:, None].astype(w.dtype)).astype(weight.dtype)


def _check_rows(indices, rows):
    require_index(
        indices, rows, False, f"index out of range in self (an embedding of {rows} rows takes indices 0..{rows - 1})"
    )


@lowering("embedding_dense_backward")
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    g = to_opmath(grad).reshape(-1, grad.shape[-1])
    idx = indices.reshape(-1)
    if padding_idx >= 0:
        g = jnp.where((idx == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), jnp.int64).at[idx].add(1)
        g = g / counts[idx][:, None]
    return jnp.zeros((num_weights, grad.shape[-1]), g.dtype).at[idx].add(g).astype(grad.dtype)


# ---------------------------------------------------------------- one_hot
def one_hot_range_check(num_classes, low, high):
    """The CPU's checks of one_hot's class values, given their least and greatest (known to the host:
    just copied from it, or read by the sync that num_classes=-1 needs, as on CUDA)."""
    if low < 0:
        raise RuntimeError("Class values must be non-negative.")
    if num_classes != -1 and num_classes <= high:
        raise RuntimeError("Class values must be smaller than num_classes.")


def _one_hot_arguments_check(self, num_classes=-1):
    """host_check of one_hot: the CPU's dtype and empty-input errors (the class values: eager's
    data_dependent.one_hot_classes at the op where the host knows them, else the lowering's asserts)."""
    if self.dtype != torch.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if self.numel() == 0 and num_classes <= 0:
        raise RuntimeError("Can not infer total number of classes from empty tensor.")


# CompositeImplicit in ATen (zeros, then a scatter_ whose device assert names scatter_ on CUDA and
# PrivateUse1, where ATen skips the CPU's range checks): taken whole in eager, with the CPU's words
@lowering("one_hot", composite_in_eager=True, host_check=_one_hot_arguments_check)
def one_hot(x, num_classes=-1):
    """num_classes > 0 here: eager resolves -1 from the values first (a sync, as CUDA's `.item()`)."""
    if x.size:
        require(x >= 0, "Class values must be non-negative.", recoverable=True)
        require(x < num_classes, "Class values must be smaller than num_classes.", recoverable=True)
    return (x[..., None] == jnp.arange(num_classes, dtype=x.dtype)).astype(jnp.int64)


# ---------------------------------------------------------------- embedding_bag
def _bag_of(indices, offsets, include_last_offset):
    n_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    bag = jnp.searchsorted(offsets, jnp.arange(indices.shape[0], dtype=offsets.dtype), side="right") - 1
    return jnp.clip(bag, 0, max(n_bags - 1, 0)).astype(jnp.int64), n_bags


@lowering("_embedding_bag", "_embedding_bag_forward_only")
def embedding_bag(
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    """(out, offset2bag, bag_size, max_indices), shaped as PyTorch's meta kernel says."""
    _check_rows(indices, weight.shape[0])
    if offsets.shape[0]:
        require(
            offsets[0] == 0,
            "embedding_bag: offsets[0] has to be 0, i.e., the first sequence in the "
            "mini-batch has to start from position 0",
        )
        require(
            offsets[-1] <= indices.shape[0],
            f"embedding_bag: offsets[-1] can not be greater than input's length {indices.shape[0]}",
        )
    bag, n_bags = _bag_of(indices, offsets, include_last_offset)
    valid = indices != padding_idx if padding_idx >= 0 else jnp.ones(indices.shape, jnp.bool_)
    rows = to_opmath(weight)[indices]  # (n, D)
    count = jax.ops.segment_sum(valid.astype(jnp.int64), bag, offsets.shape[0])
    if mode == 2:
        neg = jnp.where(valid[:, None], rows, -jnp.inf)
        best = jax.ops.segment_max(neg, bag, n_bags)  # (B, D)
        pos = jnp.arange(indices.shape[0])[:, None]
        first = jax.ops.segment_min(jnp.where((neg == best[bag]) & valid[:, None], pos, indices.shape[0]), bag, n_bags)
        empty = count[:n_bags, None] == 0
        out = jnp.where(empty, 0, best)
        max_idx = jnp.where(empty, 0, indices[jnp.minimum(first, indices.shape[0] - 1)])
        return out.astype(weight.dtype), bag, count, max_idx.astype(jnp.int64)
    if per_sample_weights is not None:
        rows = rows * to_opmath(per_sample_weights)[:, None]
    out = jax.ops.segment_sum(jnp.where(valid[:, None], rows, 0), bag, n_bags)
    if mode == 1:
        out = out / jnp.maximum(count[:n_bags], 1)[:, None]
    return out.astype(weight.dtype), bag, count, jnp.zeros((0,), jnp.int64)


@lowering("_embedding_bag_backward")
def embedding_bag_backward(
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    max_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights,
    padding_idx=-1,
):
    return embedding_bag_dense_backward(
        grad,
        indices,
        offset2bag,
        bag_size,
        max_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


@lowering("_embedding_bag_dense_backward")
def embedding_bag_dense_backward(
    grad,
    indices,
    offset2bag,
    bag_size,
    max_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights,
    padding_idx=-1,
):
    g = to_opmath(grad)
    d = g.shape[-1]
    if mode == 2:
        nonempty = (bag_size[: g.shape[0]] > 0)[:, None]
        cols = jnp.broadcast_to(jnp.arange(d), max_indices.shape)
        out = jnp.zeros((num_weights, d), g.dtype).at[max_indices, cols].add(jnp.where(nonempty, g, 0))
        return out.astype(grad.dtype)
    contrib = g[offset2bag]
    if mode == 1:
        contrib = contrib / jnp.maximum(bag_size[offset2bag], 1)[:, None].astype(g.dtype)
    if per_sample_weights is not None:
        contrib = contrib * to_opmath(per_sample_weights)[:, None]
    if padding_idx >= 0:
        contrib = jnp.where((indices == padding_idx)[:, None], 0, contrib)
    if scale_grad_by_freq:
        freq = jnp.zeros((num_weights,), jnp.int64).at[indices].add(1)
        contrib = contrib / freq[indices][:, None].astype(g.dtype)
    return jnp.zeros((num_weights, d), g.dtype).at[indices].add(contrib).astype(grad.dtype)


@lowering("_embedding_bag_per_sample_weights_backward")
def embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    out = jnp.sum(to_opmath(grad)[offset2bag] * to_opmath(weight)[indices], axis=-1)
    if padding_idx >= 0:
        out = jnp.where(indices == padding_idx, 0, out)
    return out.astype(grad.dtype)
