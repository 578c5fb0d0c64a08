"""Ops whose output shape depends on values (nonzero, masked_select, unique, ...): eager only.

They run on the device in two steps: a small executable computes the size (a sync point, as on
CUDA), then a second one, compiled for that size, computes the values. Boolean-mask indexing
(`x[mask]`, `x[mask] = v`) goes through here too: the masks become long indices (nonzero), then
the ordinary index / index_put kernels run.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from ..ops import dtypes as dt
from ..ops.argument_checks import warn_at_caller
from ..ops.embedding import one_hot_range_check
from ..ops.reductions import nonzero_indices
from ..ops.table import declared_facts
from ..storage import host_values
from ..storage.records import new_tensor, record_of
from . import overlap, tpu_check
from .executable import device_mismatch, zeros

aten = torch.ops.aten


# ------------------------------------------------------------------ reading inputs
def _flat(t: torch.Tensor):
    """(jax array of t's values in t's dtype and shape, device index): a contiguous copy when needed."""
    r = record_of(t)
    if not (t.dtype == r.dtype and t.storage_offset() == 0 and t.numel() == r.numel and t.is_contiguous()):
        t = aten.clone.default(t, memory_format=torch.contiguous_format)
        r = record_of(t)
    buf = r.buffer
    if buf is None:
        buf = zeros(r.shape, r.dtype, r.device_index)
    if buf.shape != tuple(t.shape):  # (the storage's array may have another shape: `x.view(-1)`)
        buf = buf.reshape(tuple(t.shape))
    return buf, r.device_index


def _check_tpu(*ts):
    for t in ts:
        if t.device.type != "tpu":
            device_mismatch("a data-dependent op", "tpu", t.device)


# ------------------------------------------------------------------ executables (cached per shape)
@tpu_check.jitting(static_argnums=(1,))
def _count(buf, shape):
    return jnp.count_nonzero(buf.reshape(shape))


@tpu_check.jitting(static_argnums=(1, 2))
def _nonzero(buf, shape, n):
    if not shape:  # a 0-d input has (n, 0) indices: nothing to compute
        return jnp.zeros((0,), jnp.int64)
    idx = nonzero_indices(buf.reshape(shape), n)
    if not idx:
        return jnp.zeros((n * 0,), jnp.int64)
    return jnp.stack(idx, axis=1).reshape(-1)


@tpu_check.jitting(static_argnums=(2, 3, 4))
def _masked_select(xbuf, mbuf, xshape, mshape, n):
    shape = jnp.broadcast_shapes(xshape, mshape)
    x = jnp.broadcast_to(xbuf.reshape(xshape), shape).reshape(-1)
    m = jnp.broadcast_to(mbuf.reshape(mshape), shape).reshape(-1)
    (idx,) = nonzero_indices(m, n)
    return x[idx]


def _rows(x, dim):
    """x as (D, rest) rows along `dim` (dim None: every element is a row)."""
    if dim is None:
        return x.reshape(-1, 1)
    moved = jnp.moveaxis(x, dim, 0)
    return moved.reshape(moved.shape[0], -1)


def _row_less(a, rows):
    """For each row of `rows`: whether `a` sorts before it, as the CPU's unique(dim) compares slices:
    the first column where one is < or > the other decides; NaN is neither, so that column is skipped."""
    lt, gt = a[None, :] < rows, a[None, :] > rows
    decisive = lt | gt
    first = jnp.argmax(decisive, axis=1)
    return jnp.any(decisive, axis=1) & jnp.take_along_axis(lt, first[:, None], axis=1)[:, 0]


# Up to this many slices, the CPU's std::sort is an insertion sort, which _insertion_order repeats step
# by step: with NaNs (unordered) its order is the algorithm's, not a sorted one (`[nan, 0, nan, 1]`).
_CPU_INSERTION_SORT_ROWS = 16


def _insertion_order(rows):
    """The permutation an insertion sort with _row_less leaves (libstdc++'s: a slice less than the first
    goes to the front, else it moves left while less than its left neighbour)."""
    d = rows.shape[0]
    perm = jnp.arange(d)
    slots = jnp.arange(d)
    for i in range(1, d):
        v = perm[i]
        less = _row_less(rows[v], rows[perm[:i]])  # against the slices placed so far
        trailing = jnp.sum(jnp.cumprod(less[::-1].astype(jnp.int32)))  # run of `less` ending at i - 1
        j = jnp.where(less[0], 0, i - trailing)
        shifted = jnp.where(slots > j, perm[jnp.maximum(slots - 1, 0)], perm)
        perm = jnp.where(slots > i, perm, jnp.where(slots == j, v, shifted))
    return perm


def _groups(x, dim, sort):
    rows = _rows(x, dim)
    d = rows.shape[0]
    if sort and d and dim is not None and jnp.issubdtype(rows.dtype, jnp.floating) and d <= _CPU_INSERTION_SORT_ROWS:
        perm = _insertion_order(rows)
    elif sort and d:
        keys = [rows[:, j] for j in range(rows.shape[1] - 1, -1, -1)]  # lexsort: last key is primary
        perm = jnp.lexsort(keys) if keys else jnp.arange(d)
    else:
        perm = jnp.arange(d)
    srt = rows[perm]
    if d == 0:
        start = jnp.zeros((0,), jnp.bool_)
    else:
        start = jnp.concatenate([jnp.ones((1,), jnp.bool_), jnp.any(srt[1:] != srt[:-1], axis=1)])
    return rows, perm, srt, start


@tpu_check.jitting(static_argnums=(1, 2, 3))
def _unique_count(buf, shape, dim, sort):
    _, _, _, start = _groups(buf.reshape(shape), dim, sort)
    return jnp.sum(start.astype(jnp.int64))


@tpu_check.jitting(static_argnums=(1, 2, 3, 4))
def _unique(buf, shape, dim, sort, n):
    x = buf.reshape(shape)
    rows, perm, srt, start = _groups(x, dim, sort)
    group = jnp.cumsum(start.astype(jnp.int64)) - 1
    (first,) = nonzero_indices(start, n)
    values = srt[first]
    if dim is None:
        values = values.reshape(-1)
    else:
        moved = jnp.moveaxis(x, dim, 0)
        values = jnp.moveaxis(values.reshape((n,) + moved.shape[1:]), 0, dim)
    inverse = jnp.zeros((rows.shape[0],), jnp.int64).at[perm].set(group)
    counts = jnp.zeros((n,), jnp.int64).at[group].add(1)
    return values.reshape(-1), inverse, counts


# ------------------------------------------------------------------ kernels
# Inputs of at most this many elements find their nonzero indices on the host: the count is read
# back anyway (a sync point), while the device form compiles a program per (shape, count) that costs
# 0.2-0.4 s of CPU time to compile on XLA:CPU (an eager MoE layer's `torch.where(expert_mask[e])`
# gives a new count per expert and batch); reading 64 Ki elements costs well under a millisecond.
HOST_NONZERO_ELEMENTS = 1 << 16


def nonzero(self):
    _check_tpu(self)
    if self.dtype in dt.WIDE_UNSIGNED:  # (the CPU's nonzero and masked_select have no loop for them)
        raise dt.not_implemented_for("nonzero_count", self.dtype)
    if self.numel() <= HOST_NONZERO_ELEMENTS:
        return _host_nonzero(self)
    buf, dev = _flat(self)
    shape = tuple(self.shape)
    n = int(_count(buf, shape))  # sync point
    return new_tensor((n, self.dim()), torch.int64, dev, _nonzero(buf, shape, n))


def _host_nonzero(self):
    host = self.cpu()  # (the device's sync point, its checks and its order of pending copies)
    if host.dim() > 64:  # (numpy's arrays take at most 64 dims: the CPU's kernel)
        return torch.nonzero(host).to(self.device)
    if host.dtype in _NO_NUMPY_DTYPES:  # exact: zeros (of either sign) and NaNs stay what they were
        host = host.to(torch.complex64 if host.is_complex() else torch.float32)
    # (argwhere's array is a transpose: a contiguous copy, or the device copy keeps its strides)
    indices = torch.from_numpy(np.ascontiguousarray(np.argwhere(host.numpy()), dtype=np.int64))
    return indices.to(self.device)  # (a small copy from the host: its values stay known there)


_NO_NUMPY_DTYPES = frozenset(
    {
        torch.bfloat16,
        torch.complex32,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.float8_e4m3fnuz,
        torch.float8_e5m2fnuz,
    }
)


def masked_select(self, mask):
    _check_tpu(self, mask)
    if mask.dtype != torch.bool:
        raise RuntimeError("masked_select: expected BoolTensor for mask")  # (the CPU names no dtype)
    if self.dtype in dt.WIDE_UNSIGNED:
        raise dt.not_implemented_for("masked_select", self.dtype)
    xbuf, dev = _flat(self)
    mbuf, _ = _flat(mask)
    xs, ms = tuple(self.shape), tuple(mask.shape)
    torch.broadcast_shapes(xs, ms)  # PyTorch's error for shapes that do not broadcast
    shape = tuple(torch.broadcast_shapes(xs, ms))
    n = int(_count(jnp.broadcast_to(mbuf.reshape(ms), shape).reshape(-1), (-1,)))
    return new_tensor((n,), self.dtype, dev, _masked_select(xbuf, mbuf, xs, ms, n))


def _unique_impl(self, dim, sort, return_inverse, return_counts, inverse_shape):
    _check_tpu(self)
    if self.is_complex():  # complex numbers have no order to sort by: the CPU and CUDA raise
        raise NotImplementedError(f"\"unique\" not implemented for '{dt.scalar_type_name(self.dtype)}'")
    shape = tuple(self.shape)
    if dim is not None:
        dim = dim % max(self.dim(), 1)
        if self.dim() == 0:
            raise IndexError("Dimension out of range (expected to be in range of [-1, 0], but got 1)")
    if dim is not None and self.numel() == 0:  # as the CPU: nothing to group along an empty dim
        if sum(n == 0 for n in shape) > 1:  # (the CPU's message ends in a space)
            raise RuntimeError("Number of zero sized dimensions is more than one, so unique cannot be applied ")
        if shape[dim] != 0:
            raise RuntimeError("There are 0 sized dimensions, and they aren't selected, so unique cannot be applied")
        dev = self.device.index
        empty = new_tensor((0,), torch.int64, dev, zeros(0, torch.int64, dev))
        return new_tensor(shape, self.dtype, dev, zeros(0, self.dtype, dev)), empty, empty.clone()
    if _unique_on_host(self):
        return _host_unique(self, dim, sort, return_inverse, return_counts)
    buf, dev = _flat(self)
    n = int(_unique_count(buf, shape, dim, sort))  # sync point
    values, inverse, counts = _unique(buf, shape, dim, sort, n)
    vshape = (n,) if dim is None else shape[:dim] + (n,) + shape[dim + 1 :]
    out = new_tensor(vshape, self.dtype, dev, values)
    inv = (
        new_tensor(inverse_shape, torch.int64, dev, inverse)
        if return_inverse
        else new_tensor((0,), torch.int64, dev, zeros(0, torch.int64, dev))
    )
    cnt = (
        new_tensor((n,), torch.int64, dev, counts)
        if return_counts
        else new_tensor((0,), torch.int64, dev, zeros(0, torch.int64, dev))
    )
    return out, inv, cnt


def _unique_on_host(self) -> bool:
    """Whether unique runs on a host copy: a small input where device buffers are host memory. The
    device form compiles two programs per (shape, count), 0.5-1.8 s of XLA:CPU compile for each new
    count (PyTorch's test_unique_dim: 48 compiles, 50 s), and the count is read back anyway (a sync
    point, as on CUDA); the CPU's kernel gives the CPU's answer. On a TPU the device form stays (the
    TPU compile check sees it)."""
    return self.numel() <= HOST_NONZERO_ELEMENTS and tpu_check.host_work_allowed()


def _host_unique(self, dim, sort, return_inverse, return_counts):
    host = self.cpu()  # (the device's sync point, its checks and its order of pending copies)
    if not sort:
        values, inverse, counts = aten.unique_consecutive.default(host, return_inverse, return_counts, dim)
    elif dim is None:
        values, inverse, counts = aten._unique2.default(host, True, return_inverse, return_counts)
    else:
        values, inverse, counts = aten.unique_dim.default(host, dim, True, return_inverse, return_counts)
    device = self.device
    empty = torch.empty(0, dtype=torch.int64, device=device)  # (what the device form returns when not asked)
    return (
        values.to(device),
        inverse.to(device) if return_inverse else empty,
        counts.to(device) if return_counts else empty.clone(),
    )


def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    # always sorted, as on CUDA (sorted=False only promises nothing about the order)
    return _unique_impl(self, None, True, return_inverse, return_counts, tuple(self.shape))


def unique(self, sorted=True, return_inverse=False):
    out, inv, _ = _unique_impl(self, None, True, return_inverse, False, tuple(self.shape))
    return out, inv


def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    d = dim % max(self.dim(), 1)
    return _unique_impl(self, dim, True, return_inverse, return_counts, (self.shape[d],))


def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    if dim is None:
        return _unique_impl(self, None, False, return_inverse, return_counts, tuple(self.shape))
    d = dim % max(self.dim(), 1)
    return _unique_impl(self, dim, False, return_inverse, return_counts, (self.shape[d],))


def unique_dim_consecutive(self, dim, return_inverse=False, return_counts=False):
    return unique_consecutive(self, return_inverse, return_counts, dim)


@tpu_check.jitting(static_argnums=(1,))
def _repeat_indices(repeats, total):
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=repeats.dtype), repeats, total_repeat_length=total)


def repeat_interleave(repeats, output_size=None):
    """aten::repeat_interleave.Tensor: index i repeated repeats[i] times (the other overloads build on it)."""
    _check_tpu(repeats)
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int32, torch.int64):
        raise RuntimeError("repeats has to be Long or Int tensor")
    buf, dev = _flat(repeats)
    if output_size is None:
        total = int(jnp.sum(buf))  # sync point
        if repeats.numel() and int(jnp.min(buf)) < 0:
            raise RuntimeError("repeats can not be negative")
    else:
        total = int(output_size)
    return new_tensor((total,), repeats.dtype, dev, _repeat_indices(buf, total))


# ------------------------------------------------------------------ boolean-mask indexing
def _long_indices(indices, device):
    """The index list with boolean / uint8 masks replaced by the long indices of their Trues and CPU
    index tensors moved to the device (as CUDA accepts them), or None when nothing changes."""
    if not any(i is not None and (i.dtype in (torch.bool, torch.uint8) or i.device != device) for i in indices):
        return None
    out = []
    for i in indices:
        if i is not None and i.device != device:
            i = i.to(device)
        if i is not None and i.dtype in (torch.bool, torch.uint8):
            nz = nonzero(i if i.dtype == torch.bool else i.bool())
            out.extend(aten.select.int(nz, 1, j) for j in range(i.dim()))
        else:
            out.append(i)
    return out


_INDEX_DTYPES = frozenset({torch.int64, torch.int32, torch.uint8, torch.bool})


def _check_index_dtypes(indices):
    """PyTorch's error for index tensors of other dtypes (int8, int16, floats), before they reach a
    lowering (an int8 index would otherwise be taken for a mask by nonzero's meta kernel)."""
    for i in indices:
        if i is not None and i.dtype not in _INDEX_DTYPES:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")


def _check_host_indices(self, indices):
    """Index tensors whose values the host knows (on the CPU, or just copied from it: `x[[5]]`,
    `x[torch.tensor([5], device="tpu")]`): an index out of range raises PyTorch's IndexError at the op,
    as on the CPU, not a device-side assert at the next synchronization. (The CPU's message counts the
    dimension among the indexed ones: `x[:, [9]]` is out of bounds "for dimension 0".)"""
    dim = 0
    indexed = 0
    for i in indices:
        if i is None:
            dim += 1
            continue
        if i.dtype in (torch.bool, torch.uint8):
            dim += i.dim()
            indexed += i.dim()
            continue
        if i.device.type != "cpu" and i.numel():
            i = host_values.values_of(i)
        if i is not None and i.device.type == "cpu" and i.numel() and dim < self.dim():
            size = self.shape[dim]
            bad = (i < -size) | (i >= size)
            if bad.any():
                if size == 0:  # the CPU's words for indexing an empty dimension: no value, no dimension
                    raise IndexError("index is out of bounds for dimension with size 0")
                value = int(i[bad].reshape(-1)[0])
                raise IndexError(f"index {value} is out of bounds for dimension {indexed} with size {size}")
        dim += 1
        indexed += 1


def _check_mask_shapes(self, indices):
    # PyTorch's message for a mask that does not match the indexed dims
    d = 0
    for i in indices:
        if i is not None and i.dtype in (torch.bool, torch.uint8):
            for j, n in enumerate(i.shape):
                if d + j >= self.dim() or self.shape[d + j] != n:
                    raise IndexError(
                        f"The shape of the mask {list(i.shape)} at index {j} does not match the shape of "
                        f"the indexed tensor {list(self.shape)} at index {d + j}"
                    )
            d += i.dim()
        else:
            d += 1


def _warn_byte_masks(indices):
    for i in indices:
        if i is not None and i.dtype == torch.uint8:  # the CPU warns once per byte mask, every call
            warn_at_caller("indexing with dtype torch.uint8 is now deprecated, please use a dtype torch.bool instead.")


def _shape_text(shape):
    return "[" + ", ".join(str(n) for n in shape) + "]"


def _indexing_result_shape(shape, longs):
    """The shape `x[indices]` has (long indices only), or PyTorch's IndexError where they do not broadcast."""
    indexed = [d for d, i in enumerate(longs) if i is not None]
    if not indexed:
        return tuple(shape)
    if len(indexed) == 1:  # (most calls: nothing to broadcast)
        together = tuple(longs[indexed[0]].shape)
    else:
        together = _broadcast_indices(longs, indexed)
    kept = [n for d, n in enumerate(shape) if d >= len(longs) or longs[d] is None]
    if indexed == list(range(indexed[0], indexed[-1] + 1)):  # adjacent: the result's dims go in their place
        return tuple(kept[: indexed[0]]) + together + tuple(kept[indexed[0] :])
    return together + tuple(kept)


def _broadcast_indices(longs, indexed):
    try:
        return tuple(torch.broadcast_shapes(*(tuple(longs[d].shape) for d in indexed)))
    except RuntimeError:
        shapes = ", ".join(_shape_text(longs[d].shape) for d in indexed)
        message = f"shape mismatch: indexing tensors could not be broadcast together with shapes {shapes}"
        raise IndexError(message) from None


def _check_values_fit(values, result_shape):
    """index_put's check: the values expand to the indexing result (no extra dims, even of size 1)."""
    vshape = tuple(values.shape)
    fits = len(vshape) <= len(result_shape) and all(
        v in (1, r) for v, r in zip(reversed(vshape), reversed(result_shape))
    )
    if not fits:
        raise RuntimeError(
            f"shape mismatch: value tensor of shape {_shape_text(vshape)} cannot be broadcast to indexing "
            f"result of shape {_shape_text(result_shape)}"
        )


def _single_mask_fill(self, indices, values, accumulate):
    """`x[mask] = v` with one mask over x's leading dims and a single value: which elements change
    does not need their count, so it is x.masked_fill(mask, v) (no sync, no executable per count)."""
    if accumulate or not isinstance(values, torch.Tensor) or values.numel() != 1 or values.dtype != self.dtype:
        return None
    if len(indices) != 1 or indices[0] is None or indices[0].dtype not in (torch.bool, torch.uint8):
        return None
    mask = indices[0]
    if mask.dim() == 0 or tuple(mask.shape) != tuple(self.shape[: mask.dim()]) or values.device != self.device:
        return None
    if values.dim() > 1 + self.dim() - mask.dim():  # more dims than the indexing result: index_put raises
        return None
    # (a byte mask stays one: masked_fill refuses it with the CPU's error, as the CPU's index_put_ does)
    mask = mask.to(self.device).reshape(tuple(mask.shape) + (1,) * (self.dim() - mask.dim()))
    return mask, values.reshape(())


def with_masks(engine_kernel, position, name=""):
    inplace = name.split(".")[0].endswith("_")  # index_put_, _index_put_impl_ (index_put: a new tensor)

    def kernel(*args, **kwargs):
        indices = args[position] if len(args) > position else kwargs.get("indices")
        if indices is not None and position == 1:
            values = args[2] if len(args) > 2 else kwargs.get("values")
            accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
            fill = _single_mask_fill(args[0], indices, values, accumulate)
            if fill is not None:
                _warn_byte_masks(indices)
                return (aten.masked_fill_ if inplace else aten.masked_fill).Tensor(args[0], *fill)
        if indices is not None:
            _check_index_dtypes(indices)
            _warn_byte_masks(indices)
            _check_host_indices(args[0], indices)
        longs = _long_indices(indices, args[0].device) if indices is not None else None
        if longs is not None:
            _check_mask_shapes(args[0], indices)
        if indices is not None:
            result_shape = _indexing_result_shape(tuple(args[0].shape), indices if longs is None else longs)
            values = args[position + 1] if len(args) > position + 1 else kwargs.get("values")
            if isinstance(values, torch.Tensor):  # the index_put family: values follow the indices
                _check_values_fit(values, result_shape)
        if longs is not None:
            if len(args) > position:
                args = args[:position] + (longs,) + args[position + 1 :]
            else:
                kwargs = dict(kwargs, indices=longs)
        return engine_kernel(*args, **kwargs)

    return kernel


# ------------------------------------------------------------------ fused attention
# index ops whose index list may hold boolean masks: op name -> position of the index list
# (declared with mask_args= on their lowerings, ops/indexing.py)
MASK_ARGUMENT_OPS = declared_facts("mask_args")


@tpu_check.jitting(static_argnums=(2,))
def _bincount(x, weights, n):
    ones = jnp.ones(x.shape, jnp.int64) if weights is None else weights
    return jnp.zeros((n,), ones.dtype).at[x].add(ones)


@tpu_check.jitting()
def _min_max(x):
    return jnp.min(x), jnp.max(x)


_BINCOUNT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def bincount(self, weights=None, minlength=0):
    _check_tpu(self, *([weights] if weights is not None else []))
    if self.dtype not in _BINCOUNT_DTYPES:  # the CPU checks the dtype first (its kernel's dispatch)
        raise NotImplementedError(f"\"bincount_tpu\" not implemented for '{dt.scalar_type_name(self.dtype)}'")
    if self.dim() != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != self.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    buf, dev = _flat(self)
    x = buf.reshape(tuple(self.shape))
    n = minlength
    if self.numel():
        lo, hi = (int(v) for v in _min_max(x))  # sync point: the length depends on the data
        if lo < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        n = max(hi + 1, minlength)
    # PyTorch counts in int64, sums float32 weights in float32 and any other weights in float64
    out_dtype = torch.int64 if weights is None else (torch.float32 if weights.dtype == torch.float32 else torch.float64)
    w = None
    if weights is not None:
        wbuf, _ = _flat(weights)
        w = wbuf.reshape(tuple(weights.shape)).astype(jnp.float32 if out_dtype == torch.float32 else jnp.float64)
    return new_tensor((n,), out_dtype, dev, _bincount(x, w, n))


def one_hot_classes(kernel):
    """one_hot's engine kernel behind the CPU's checks of the class values at the op where the host
    knows them (copied from it: storage/host_values.py) or reads them anyway: num_classes <= 0 needs
    the greatest value (a sync, as on CUDA), and the same sync gives the least. Other values are
    checked on the device (the lowering's asserts), reported at the next sync as CUDA's."""

    def run(self, num_classes=-1):
        if self.numel() and self.device.type == "tpu":
            known = host_values.values_of(self)
            if known is not None:
                low, high = int(known.min()), int(known.max())
            elif num_classes <= 0:
                buf, _ = _flat(self)
                low, high = (int(v) for v in _min_max(buf))
            else:
                return kernel(self, num_classes)
            one_hot_range_check(num_classes, low, high)
            if num_classes == -1:
                num_classes = high + 1
        return kernel(self, num_classes)

    return run


# Composite ops eager takes whole (ops/table.py composite_in_eager) whose arguments depend on values
RESOLVED_COMPOSITES = {"one_hot.default": one_hot_classes}


# The CPU's out= checks of each data-dependent op, in its words (its kernels check dtype first)
def _nonzero_dtype_message(out, result):
    # (the CPU's message lacks the space before the out tensor's type)
    want, got = dt.scalar_type_name(result.dtype), dt.scalar_type_name(out.dtype)
    return f"nonzero: Expected out tensor to have scalar type {want} but got scalar type{got}"


_OUT_DTYPE_MESSAGES = {
    "nonzero": _nonzero_dtype_message,
    "masked_select": lambda out, result: "masked_select(): self and result must have the same scalar type",
}


def _into(out, result, name, inputs=()):
    """The `out=` form of a data-dependent op: PyTorch resizes `out` to the result. `inputs`: the
    tensors the CPU's kernel checks `out` against (assert_no_internal_overlap, assert_no_overlap),
    after its dtype."""
    if out.dtype != result.dtype:
        message = _OUT_DTYPE_MESSAGES.get(name)
        raise RuntimeError(
            message(out, result)
            if message
            else f"{name}: Expected out tensor to have dtype {result.dtype}, but got {out.dtype} instead"
        )
    if out.device != result.device:  # CUDA's kernels say "on the same device"
        raise RuntimeError(
            f"{name}: Expected out tensor to be on the same device as self ({result.device}), but got {out.device}"
        )
    if inputs:
        if out.numel() and overlap.has_internal_overlap(out):
            raise RuntimeError(overlap.INTERNAL)
        for t in inputs:
            overlap.assert_no_overlap(out, t)
    out.resize_(result.shape)
    return out.copy_(result)


def register(impl):
    """Called by kernels.register_all with `impl(name_or_op, fn)` to add PrivateUse1 kernels."""
    impl("nonzero", nonzero)
    impl("nonzero.out", lambda self, *, out: _into(out, nonzero(self), "nonzero"))
    impl("masked_select", masked_select)
    impl(
        "masked_select.out",
        lambda self, mask, *, out: _into(out, masked_select(self, mask), "masked_select", (self, mask)),
    )
    impl("bincount", bincount)
    impl(
        "bincount.out",
        lambda self, weights=None, minlength=0, *, out: _into(out, bincount(self, weights, minlength), "bincount"),
    )
    impl("_unique2", unique2)
    impl("_unique", unique)
    impl("unique_dim", unique_dim)
    impl("unique_consecutive", unique_consecutive)
    impl("unique_dim_consecutive", unique_dim_consecutive)
    impl("repeat_interleave.Tensor", repeat_interleave)
