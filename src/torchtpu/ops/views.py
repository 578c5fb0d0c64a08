"""Reading and writing a strided view of a storage's buffer, inside a traced JAX function.

A layout is (shape, stride, offset, tensor dtype, numel) over a storage of `numel` elements, whose
buffer holds them in memory order as an array of the storage's shape (storage/records.py: usually the
shape of the tensor the storage was made for). A view that lies along the buffer's own dimensions (the
whole tensor, a transpose, a slice or a select at a known offset, a broadcast) is read and written on
the array as it is (`nd_plan`): on a TPU, whose arrays are tiled, reshaping to 1-D would be a copy.
Other views are read from the flattened buffer: the common layouts become slices, reshapes and
transposes that XLA fuses into the op that consumes them; only overlapping layouts (unfold with
step < size, as_strided tricks) need a gather. All decisions are made from static facts at trace
time, so they cost nothing per call.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..storage.records import is_dense
from .dtypes import COMPLEX32, pack_complex32, stored, unpack_complex32
from .indexing import flat_scatter_pays


@functools.lru_cache(maxsize=8192)
def plan(shape, stride, offset, numel):
    """How to read `shape/stride/offset` out of a flat buffer of `numel` elements:
    ("whole",), ("empty",), ("slice", start, stop), ("box", start, vshape, order) or ("gather",).

    "box": the view is a sub-box of a dense block starting at `start` whose dims, sorted by
    stride, are `order`; `vshape` is that block (plus a trailing dim of the innermost stride).
    """
    size = math.prod(shape)
    if size == 0:
        return ("empty",)
    if is_dense(shape, stride):
        if offset == 0 and size == numel:
            return ("whole",)
        return ("slice", offset, offset + size)
    # Dims that matter: size > 1 and stride != 0 (stride 0 is a broadcast, size 1 is free).
    order = [d for d, (n, s) in enumerate(zip(shape, stride)) if n > 1 and s != 0]
    if any(stride[d] < 0 for d in order):
        return ("gather",)
    order.sort(key=lambda d: -stride[d])
    vshape = [shape[order[0]]] if order else []
    for d, nxt in itertools.pairwise(order):
        if stride[d] % stride[nxt] or stride[d] < stride[nxt] * shape[nxt]:
            return ("gather",)  # overlapping or interleaved: no dense block describes it
        vshape.append(stride[d] // stride[nxt])
    vshape.append(stride[order[-1]] if order else 1)
    return ("box", offset, tuple(vshape), tuple(order))


@functools.lru_cache(maxsize=8192)
def dynamic_plan(shape, stride, numel):
    """Like `plan`, for an offset known only at run time (so that `ts[i]` or `x[i]` in a loop
    reuses one executable): ("empty",), ("slice", size), ("box", pad, vshape, order), ("gather",).
    "box" pads the buffer by `pad` so that the block always fits after any valid offset."""
    size = math.prod(shape)
    if size == 0:
        return ("empty",)
    if is_dense(shape, stride):
        return ("slice", size)
    p = plan(shape, stride, 0, numel + 1)  # the same geometry, at offset 0, never "whole"
    if p[0] != "box":
        return ("gather",)
    _, _, vshape, order = p
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    return ("box", math.prod(vshape) - extent, vshape, order)


class AlongOffset(NamedTuple):
    """A traced storage offset at which the view lies along the storage array's dimensions (the
    executable's key says so for every call: eager/executable.py key_tensor)."""

    value: object


@functools.lru_cache(maxsize=8192)
def nd_plan(shape, stride, offset, sshape):
    """How to address the view `shape/stride/offset` on a storage array of shape `sshape` (row major)
    without flattening it: (starts, axes) where the view is the box of the array from `starts`
    whose dimension `axes[i]` runs along view dimension i (None: a broadcast or size-1 dimension of
    the view; storage dimensions no view dimension runs along have extent 1 in the box), or None
    when the view does not lie along the array's dimensions (then read through the flat buffer)."""
    if len(sshape) < 2 or math.prod(shape) == 0 or not 0 <= offset < math.prod(sshape):
        return None
    spans, acc = [], 1
    for n in reversed(sshape):
        spans.append(acc)
        acc *= n
    spans.reverse()  # the array's row-major strides
    starts, rest = [], offset
    for span in spans:
        starts.append(rest // span)
        rest %= span
    axes, used = [], set()
    for n, st in zip(shape, stride):
        if n == 1 or st == 0:
            axes.append(None)
            continue
        j = next((j for j, span in enumerate(spans) if span == st and sshape[j] > 1), None)
        if j is None or j in used or starts[j] + n > sshape[j]:
            return None
        used.add(j)
        axes.append(j)
    return tuple(starts), tuple(axes)


def _nd_box(shape, sshape, starts, axes):
    """The box's extents and the view dimensions that run along array dimensions, in array order."""
    sizes = [1] * len(sshape)
    for i, j in enumerate(axes):
        if j is not None:
            sizes[j] = shape[i]
    along = sorted((j, i) for i, j in enumerate(axes) if j is not None)
    return sizes, along


# (every start below is a storage offset, never negative: lax's dynamic slices then skip the
# normalisation of negative starts, a compare, an add and a select per traced start)
NONNEG = {"allow_negative_indices": False}


def _traced_starts(offset, sshape):
    """The array index of flat element `offset` (traced, 0 <= offset < the array's size). With lax's
    truncating div/rem (exact for non-negative values: jnp's `//` and `%` each trace and lower a nested
    jit: 12 -> 6 ms to trace and lower a read of a 4-d view), none on a dimension of 1 or for the first."""
    offset = jnp.asarray(offset)
    starts, span, first = [], math.prod(sshape), True
    for n in sshape:
        span //= n
        if n == 1:
            starts.append(0)
            continue
        start = lax.div(offset, np.array(span, offset.dtype)) if span != 1 else offset
        starts.append(start if first else lax.rem(start, np.array(n, offset.dtype)))
        first = False
    return tuple(starts)


def _nd_read(arr, shape, starts, axes):
    sizes, along = _nd_box(shape, arr.shape, starts, axes)
    if not all(isinstance(s, int) for s in starts):
        arr = lax.dynamic_slice(arr, starts, sizes, **NONNEG)
    elif any(starts) or tuple(sizes) != arr.shape:
        arr = lax.slice(arr, starts, tuple(s + n for s, n in zip(starts, sizes)))
    unused = tuple(j for j in range(arr.ndim) if j not in {j for j, _ in along})
    if unused:
        arr = lax.squeeze(arr, unused)
    view_dims = [i for _, i in along]  # the view dimension of each remaining array dimension
    if view_dims != sorted(view_dims):
        arr = jnp.transpose(arr, np.argsort(view_dims))
    if arr.shape != tuple(shape):
        arr = lax.broadcast_in_dim(arr, tuple(shape), tuple(sorted(view_dims)))
    return arr


def _nd_write(arr, shape, starts, axes, value):
    sizes, along = _nd_box(shape, arr.shape, starts, axes)
    # only the view's elements that address memory (index 0 of broadcast and size-1 dimensions)
    v = value[tuple(slice(None) if j is not None else 0 for j in axes)]
    kept = sorted(i for _, i in along)
    order = [kept.index(i) for _, i in along]
    if order != sorted(order):
        v = jnp.transpose(v, order)
    v = v.reshape(sizes)
    if tuple(sizes) == arr.shape:
        return v
    return lax.dynamic_update_slice(arr, v, starts, **NONNEG)


def _gather_indices(shape, stride, offset):
    idx = np.full(shape, offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(shape, stride)):
        r = [1] * len(shape)
        r[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(r)
    return idx


def _pad_to(flat, stop):
    if stop > flat.shape[0]:
        flat = jnp.pad(flat, (0, stop - flat.shape[0]))
    return flat


def _region(flat, start, length, pad=None):
    """`length` elements of `flat` from `start` (static, or traced with `pad` elements of slack)."""
    if pad is None:
        return lax.slice(_pad_to(flat, start + length), (start,), (start + length,))
    padded = jnp.pad(flat, (0, pad)) if pad else flat
    return lax.dynamic_slice(padded, (start,), (length,), **NONNEG)


def _box_read(flat, shape, start, vshape, order, pad=None):
    region = _region(flat, start, math.prod(vshape), pad).reshape(vshape)
    keep = tuple(shape[d] for d in order)
    region = lax.slice(region, (0,) * len(vshape), keep + (1,)).reshape(keep)
    region = jnp.transpose(region, np.argsort(order)) if len(order) > 1 else region
    return lax.broadcast_in_dim(region, tuple(shape), tuple(sorted(order)))


def _box_write(flat, shape, start, vshape, order, value, pad=None):
    length = math.prod(vshape)
    # keep only the dims that address memory (index 0 of broadcast and size-1 dims), in stride order
    v = value[tuple(slice(None) if d in order else 0 for d in range(len(shape)))]
    ascending = sorted(order)
    v = jnp.transpose(v, [ascending.index(d) for d in order])[..., None]
    padded = _pad_to(flat, start + length) if pad is None else (jnp.pad(flat, (0, pad)) if pad else flat)
    region = lax.dynamic_slice(padded, (start,), (length,), **NONNEG).reshape(vshape)
    region = lax.dynamic_update_slice(region, v, (0,) * len(vshape), **NONNEG)
    padded = lax.dynamic_update_slice(padded, region.reshape(-1), (start,), **NONNEG)
    return padded[: flat.shape[0]] if padded.shape[0] != flat.shape[0] else padded


def bitcast(x, dtype):
    """Reinterpret elements (a tensor viewed with `.view(dtype)` of another element width too)."""
    if x.dtype == dtype:
        return x
    if jnp.issubdtype(x.dtype, jnp.complexfloating):  # XLA cannot bitcast complex: (real, imag) pairs
        return bitcast(jnp.stack([x.real, x.imag], -1).reshape(-1), dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = bitcast(x, jnp.float32 if dtype == jnp.complex64 else jnp.float64).reshape(-1, 2)
        return lax.complex(part[:, 0], part[:, 1])
    src, dst = jnp.dtype(x.dtype).itemsize, jnp.dtype(dtype).itemsize
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    if dtype == jnp.bool_:
        return bitcast(x, jnp.uint8).astype(jnp.bool_)
    if src == dst:
        return lax.bitcast_convert_type(x, dtype)
    if src > dst:  # one element becomes several along the flat axis
        return lax.bitcast_convert_type(x, dtype).reshape(-1)
    return lax.bitcast_convert_type(x.reshape(-1, dst // src), dtype)


def apply_bits(x, bits):
    """A lazily conjugated/negated view's values, bits = (conjugate, negative), from its storage's (or
    the storage's from the view's: both are involutions)."""
    if bits[0]:
        x = jnp.conj(x)
    return -x if bits[1] else x


def read(buffer, layout):
    """The value of a view of the storage whose array is `buffer`. layout = (shape, stride, offset,
    dtype, numel)."""
    shape, stride, offset, dtype, numel = layout
    if dtype is COMPLEX32:  # stored as uint32, computed as complex64 (ops/dtypes.py TO_JAX)
        return unpack_complex32(read(buffer, (shape, stride, offset, stored(dtype), numel)))
    if type(offset) is AlongOffset:
        if math.prod(shape) == 0:
            return jnp.zeros(shape, dtype)
        _, axes = nd_plan(shape, stride, 0, buffer.shape)  # (a view that fits somewhere fits at offset 0)
        return _nd_read(buffer, shape, _traced_starts(offset.value, buffer.shape), axes)
    if buffer.ndim > 1 and buffer.dtype == dtype and isinstance(offset, int):
        if buffer.shape == shape and offset == 0 and is_dense(shape, stride):
            return buffer
        p = nd_plan(shape, stride, offset, buffer.shape)
        if p is not None:
            return _nd_read(buffer, shape, *p)
    flat = buffer.reshape(-1) if buffer.ndim != 1 else buffer
    if flat.dtype != dtype:
        flat = bitcast(flat, dtype)
        numel = flat.shape[0]
    if not isinstance(offset, int):  # traced offset
        p = dynamic_plan(shape, stride, numel)
        kind = p[0]
        if kind == "slice":
            return lax.dynamic_slice(flat, (offset,), (p[1],), **NONNEG).reshape(shape)
        if kind == "box":
            return _box_read(flat, shape, offset, p[2], p[3], pad=p[1])
        if kind == "empty":
            return jnp.zeros(shape, flat.dtype)
        return flat[offset + _gather_indices(shape, stride, 0)]
    p = plan(shape, stride, offset, numel)
    kind = p[0]
    if kind == "whole":
        return flat.reshape(shape)
    if kind == "slice":
        return lax.slice(flat, (p[1],), (p[2],)).reshape(shape)
    if kind == "empty":
        return jnp.zeros(shape, flat.dtype)
    if kind == "box":
        return _box_read(flat, shape, p[1], p[2], p[3])
    return flat[_gather_indices(shape, stride, offset)]


def write(buffer, layout, value):
    """`buffer` (a storage's array) with the view `layout` set to `value` (broadcast and cast to the
    view's dtype), in `buffer`'s shape."""
    shape, stride, offset, dtype, numel = layout
    if dtype is COMPLEX32:
        return write(buffer, (shape, stride, offset, stored(dtype), numel), pack_complex32(value))
    if type(offset) is AlongOffset:
        if math.prod(shape) == 0:
            return buffer
        _, axes = nd_plan(shape, stride, 0, buffer.shape)  # (a view that fits somewhere fits at offset 0)
        value = jnp.broadcast_to(jnp.asarray(value).astype(dtype), shape)
        return _nd_write(buffer, shape, _traced_starts(offset.value, buffer.shape), axes, value)
    if buffer.ndim != 1:
        if buffer.dtype == dtype and isinstance(offset, int):
            p = nd_plan(shape, stride, offset, buffer.shape)
            if p is not None:
                value = jnp.broadcast_to(jnp.asarray(value).astype(dtype), shape)
                return _nd_write(buffer, shape, *p, value)
        return write(buffer.reshape(-1), layout, value).reshape(buffer.shape)
    flat = buffer
    if flat.dtype != dtype:
        # write through a reinterpreting view: do it in the view's dtype, then reinterpret back
        src_dtype = flat.dtype
        flat = bitcast(flat, dtype)
        out = write(flat, (shape, stride, offset, dtype, flat.shape[0]), value)
        return bitcast(out, src_dtype)
    value = jnp.broadcast_to(jnp.asarray(value).astype(dtype), shape)
    if not isinstance(offset, int):  # traced offset
        p = dynamic_plan(shape, stride, numel)
        kind = p[0]
        if kind == "slice":
            return lax.dynamic_update_slice(flat, value.reshape(-1), (offset,), **NONNEG)
        # a box covering a small part of a large block goes as a scatter at the view's own offsets,
        # which XLA:CPU runs in place (ops/indexing.py: flat_scatter_pays)
        if kind == "box" and not flat_scatter_pays(math.prod(p[2]), math.prod(shape)):
            return _box_write(flat, shape, offset, p[2], p[3], value, pad=p[1])
        if kind == "empty":
            return flat
        return flat.at[(offset + _gather_indices(shape, stride, 0)).reshape(-1)].set(value.reshape(-1))
    p = plan(shape, stride, offset, numel)
    kind = p[0]
    if kind == "whole":
        return value.reshape(-1)
    if kind == "slice":
        return lax.dynamic_update_slice(flat, value.reshape(-1), (p[1],), **NONNEG)
    if kind == "empty":
        return flat
    if kind == "box" and not flat_scatter_pays(math.prod(p[2]), math.prod(shape)):
        return _box_write(flat, shape, p[1], p[2], p[3], value)
    idx = _gather_indices(shape, stride, offset)
    return flat.at[idx.reshape(-1)].set(value.reshape(-1))
