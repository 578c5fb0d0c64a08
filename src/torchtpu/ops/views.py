"""Reading and writing a strided view of a flat storage buffer, inside a traced JAX function.

A layout is (shape, stride, offset, tensor dtype) over a flat buffer of `numel` elements. The
common layouts become slices, reshapes and transposes that XLA fuses into the op that consumes
them; only overlapping layouts (unfold with step < size, as_strided tricks) need a gather.
All decisions are made from static facts at trace time, so they cost nothing per call.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..storage.records import is_dense
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
    return lax.dynamic_slice(padded, (start,), (length,))


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
    region = lax.dynamic_slice(padded, (start,), (length,)).reshape(vshape)
    region = lax.dynamic_update_slice(region, v, (0,) * len(vshape))
    padded = lax.dynamic_update_slice(padded, region.reshape(-1), (start,))
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


def read(flat, layout):
    """The value of a view. layout = (shape, stride, offset, dtype, numel)."""
    shape, stride, offset, dtype, numel = layout
    if flat.dtype != dtype:
        flat = bitcast(flat, dtype)
        numel = flat.shape[0]
    if not isinstance(offset, int):  # traced offset
        p = dynamic_plan(shape, stride, numel)
        kind = p[0]
        if kind == "slice":
            return lax.dynamic_slice(flat, (offset,), (p[1],)).reshape(shape)
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


def write(flat, layout, value):
    """`flat` with the view `layout` set to `value` (broadcast and cast to the view's dtype)."""
    shape, stride, offset, dtype, numel = layout
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
            return lax.dynamic_update_slice(flat, value.reshape(-1), (offset,))
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
        return lax.dynamic_update_slice(flat, value.reshape(-1), (p[1],))
    if kind == "empty":
        return flat
    if kind == "box" and not flat_scatter_pays(math.prod(p[2]), math.prod(shape)):
        return _box_write(flat, shape, p[1], p[2], p[3], value)
    idx = _gather_indices(shape, stride, offset)
    return flat.at[idx.reshape(-1)].set(value.reshape(-1))
