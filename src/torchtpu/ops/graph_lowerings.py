"""The interpreter-only lowerings of `ops/graph.py` (`GRAPH_LOWERINGS`): the ops an FX graph needs
that are about shape and structure rather than math (views, scatters into views, factories and casts,
`prims.*`, random factories, no-ops and checks). A lowering in the main table (table.py) of the same
name always wins, so these step aside as the main table grows.

Graph lowerings receive `val` first: the node's meta value (a FakeTensor / meta tensor, a list of
them, or None), which gives PyTorch's own output shape and dtype for factories and casts.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import dtypes as dt
from . import indexing
from . import random as random_ops
from .misc import assert_async
from .views import bitcast, read

__all__ = [
    "GRAPH_LOWERINGS",
    "RANDOM_GRAPH_OPS",
    "UnsupportedInGraph",
    "graph_lowering",
    "node_op_name",
    "static_shape",
]

GRAPH_LOWERINGS: dict[str, Callable] = {}


class UnsupportedInGraph(NotImplementedError):
    pass


# graph lowerings that take a `key=` PRNG key (declared with `random=True`)
RANDOM_GRAPH_OPS: set = set()


def graph_lowering(*names, random=False):
    def register(fn):
        for name in names:
            full = name if name.count(".") >= 1 else name + ".default"
            GRAPH_LOWERINGS[full] = fn
            if random:
                RANDOM_GRAPH_OPS.add(full)
        return fn

    return register


def node_op_name(op) -> str:
    """ "add.Tensor" for aten ops, "prims.convert_element_type.default" for other namespaces."""
    ns, _, name = op._schema.name.partition("::")
    base = f"{name}.{op._schema.overload_name or 'default'}"
    return base if ns == "aten" else f"{ns}.{base}"


def _jdtype(val, fallback=None):
    if isinstance(val, torch.Tensor):
        return dt.to_jax(val.dtype)
    return fallback if fallback is not None else dt.to_jax(dt.default_dtype())


def static_shape(shape):
    """The shape as Python ints, or None when it is symbolic (a dynamic-shape graph)."""
    out = []
    for s in shape:
        if type(s) is not int:
            return None
        out.append(s)
    return tuple(out)


def _shape(val):
    shape = static_shape(val.shape)
    if shape is None:
        raise UnsupportedInGraph("torchtpu: a symbolic shape reached a lowering that needs a static one")
    return shape


def _size_from_args(args):
    """The first list of ints among the arguments (`size`), else the first array's shape."""
    for a in args:
        if isinstance(a, (list, tuple)) and all(isinstance(x, int) for x in a):
            return tuple(a)
    for a in args:
        if hasattr(a, "shape"):
            return tuple(a.shape)
    return ()


# ---------------------------------------------------------------- identity / views
@graph_lowering(
    "alias",
    "detach",
    "lift_fresh",
    "alias_copy",
    "detach_copy",
    "contiguous",
    "resolve_conj",
    "resolve_neg",
    "positive",
)
def _identity(val, a, *rest, **kw):
    return a


# A graph computes values: the lazily conjugated (negated) view's value is the conjugate (negation);
# resolve_conj/resolve_neg then have nothing left to do.
@graph_lowering("_conj", "_conj_copy")
def _conj(val, a):
    return jnp.conj(a) if jnp.iscomplexobj(a) else a


@graph_lowering("view_as_real", "view_as_real_copy")
def _view_as_real(val, a):
    return jnp.stack([a.real, a.imag], axis=-1)


@graph_lowering("view_as_complex", "view_as_complex_copy")
def _view_as_complex(val, a):
    return lax.complex(a[..., 0], a[..., 1])


@graph_lowering("_neg_view", "_neg_view_copy")
def _neg_view(val, a):
    return -a


@graph_lowering("view", "_unsafe_view", "reshape", "view_copy", "_reshape_alias", "_reshape_alias_copy")
def _view(val, a, size, *rest):
    return jnp.reshape(a, tuple(size))


@graph_lowering("view.dtype")
def _view_dtype(val, a, dtype):

    out = bitcast(a.reshape(-1), dtype)
    return out.reshape(tuple(a.shape[:-1]) + (-1,)) if a.ndim else out.reshape(())


@graph_lowering("unfold", "unfold_copy")
def _unfold(val, a, dim, size, step):
    # windows of `size` every `step` along dim -> dim holds the windows, a new last axis their elements
    if a.ndim == 0:
        return a.reshape(1)
    dim %= a.ndim
    count = (a.shape[dim] - size) // step + 1
    index = jnp.arange(count)[:, None] * step + jnp.arange(size)[None, :]
    windows = jnp.take(a, index, axis=dim)  # (..., count, size, ...)
    return jnp.moveaxis(windows, dim + 1, -1)


@graph_lowering("t", "t_copy")
def _t(val, a):
    return a.T if a.ndim == 2 else a


@graph_lowering("transpose.int", "transpose_copy.int")
def _transpose(val, a, d0, d1):
    return jnp.swapaxes(a, d0, d1) if a.ndim else a


@graph_lowering("permute", "permute_copy")
def _permute(val, a, dims):
    return jnp.transpose(a, [d % max(a.ndim, 1) for d in dims]) if a.ndim else a


@graph_lowering("expand", "expand_copy")
def _expand(val, a, size, implicit=False):
    lead = len(size) - a.ndim
    return jnp.broadcast_to(a, tuple(a.shape[i - lead] if n == -1 else n for i, n in enumerate(size)))


@graph_lowering("unsqueeze", "unsqueeze_copy")
def _unsqueeze(val, a, dim):
    return jnp.expand_dims(a, dim % (a.ndim + 1))


@graph_lowering("squeeze", "squeeze.dim", "squeeze.dims", "squeeze_copy", "squeeze_copy.dim", "squeeze_copy.dims")
def _squeeze(val, a, dim=None):
    if a.ndim == 0:
        return a
    dims = range(a.ndim) if dim is None else ([dim] if isinstance(dim, int) else dim)
    dims = tuple(sorted({d % a.ndim for d in dims if a.shape[d % a.ndim] == 1}))
    return lax.squeeze(a, dims) if dims else a


@graph_lowering("slice.Tensor", "slice_copy.Tensor")
def _slice(val, a, dim=0, start=None, end=None, step=1):
    dim %= a.ndim
    start, end, step = slice(start, end, step).indices(a.shape[dim])
    return (
        lax.slice_in_dim(a, start, max(start, end), step, axis=dim)
        if step > 0
        else a[(slice(None),) * dim + (slice(start, end, step),)]
    )


@graph_lowering("select.int", "select_copy.int")
def _select(val, a, dim, index):
    dim %= a.ndim
    return lax.index_in_dim(a, index % a.shape[dim], axis=dim, keepdims=False)


@graph_lowering("narrow", "narrow_copy")
def _narrow(val, a, dim, start, length):
    dim %= a.ndim
    start = start % a.shape[dim] if start < 0 else start
    return lax.slice_in_dim(a, start, start + length, axis=dim)


@graph_lowering("as_strided", "as_strided_copy")
def _as_strided(val, a, size, stride, storage_offset=None):
    # A graph value has no storage of its own: read the strides against its contiguous elements.

    flat = a.reshape(-1)
    return read(flat, (tuple(size), tuple(stride), storage_offset or 0, flat.dtype, flat.shape[0]))


@graph_lowering("diagonal", "diagonal_copy")
def _diagonal(val, a, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(a, offset, dim1, dim2)


@graph_lowering("unbind.int")
def _unbind(val, a, dim=0):
    dim %= a.ndim
    return tuple(lax.index_in_dim(a, i, axis=dim, keepdims=False) for i in range(a.shape[dim]))


@graph_lowering("split.Tensor")
def _split(val, a, split_size, dim=0):
    dim %= a.ndim
    n = a.shape[dim]
    return (
        tuple(lax.slice_in_dim(a, s, min(s + split_size, n), axis=dim) for s in range(0, n, max(split_size, 1)))
        if n
        else (a,)
    )


@graph_lowering("split_with_sizes")
def _split_with_sizes(val, a, sizes, dim=0):
    dim %= a.ndim
    out, s = [], 0
    for n in sizes:
        out.append(lax.slice_in_dim(a, s, s + n, axis=dim))
        s += n
    return tuple(out)


# ---------------------------------------------------------------- indexing
# cat, stack, pads, index/index_put, gather/scatter... come from the main lowering table.


# A small slab written into a large array (`cache[:, :, p] = k` in a compiled decode step) goes as a
# scatter at flat offsets, as index_copy does (ops/indexing.py: XLA:CPU runs that in place, the slab
# form copied the whole array several times).
@graph_lowering("slice_scatter")
def _slice_scatter(val, a, src, dim=0, start=None, end=None, step=1):
    dim %= a.ndim
    start, end, step = slice(start, end, step).indices(a.shape[dim])
    src = src.astype(a.dtype)
    if src.size and indexing.flat_scatter_pays(a.size, src.size):
        return indexing.flat_set(a, dim, jnp.arange(start, end, step), src)
    return a.at[(slice(None),) * dim + (slice(start, end, step),)].set(src)


@graph_lowering("select_scatter")
def _select_scatter(val, a, src, dim, index):
    dim %= a.ndim
    src = src.astype(a.dtype)
    if isinstance(index, int) and indexing.flat_scatter_pays(a.size, src.size):
        index %= a.shape[dim]
        return indexing.flat_set(a, dim, jnp.array([index]), jnp.expand_dims(src, dim))
    return a.at[(slice(None),) * dim + (index,)].set(src)


@graph_lowering("diagonal_scatter")
def _diagonal_scatter(val, a, src, offset=0, dim1=0, dim2=1):
    idx = np.arange(a.shape[dim1] * a.shape[dim2]).reshape(a.shape[dim1], a.shape[dim2])
    d = np.diagonal(idx, offset)
    rows, cols = d // a.shape[dim2], d % a.shape[dim2]
    moved = jnp.moveaxis(a, (dim1, dim2), (-2, -1))
    moved = moved.at[..., rows, cols].set(src.astype(a.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))


# ---------------------------------------------------------------- factories and casts
@graph_lowering("to.dtype", "to.dtype_layout", "to.device", "_to_dim_order_copy")  # (_to_copy: the main table)
def _to_copy(val, a, *args, **kw):
    return dt.convert(a, _jdtype(val, a.dtype)) if hasattr(a, "astype") else jnp.asarray(a, _jdtype(val))


@graph_lowering(
    "empty.memory_format",
    "empty_strided",
    "zeros",
    "new_zeros",
    "new_empty",
    "new_empty_strided",
    "zeros_like",
    "empty_like",
    "empty_permuted",
)
def _zeros(val, *args, **kw):
    return jnp.zeros(_size_from_args(args), _jdtype(val))


@graph_lowering("ones", "new_ones", "ones_like")
def _ones(val, *args, **kw):
    return jnp.ones(_size_from_args(args), _jdtype(val))


@graph_lowering("full_like")
def _full_like(val, a, fill_value, *args, **kw):
    return jnp.full(a.shape, fill_value, _jdtype(val))


@graph_lowering("new_full")
def _new_full(val, a, size, fill_value, *args, **kw):
    return jnp.full(tuple(size), fill_value, _jdtype(val))


@graph_lowering("arange.default", "arange.start")
def _arange(val, *args, **kw):
    nums = [x for x in args if isinstance(x, (int, float))]
    start, end = (0, nums[0]) if len(nums) == 1 else (nums[0], nums[1])
    n = max(0, math.ceil(end - start))
    d = _jdtype(val)
    acc = jnp.float64 if jnp.issubdtype(d, jnp.floating) else jnp.int64
    return (start + jnp.arange(n, dtype=acc)).astype(d)


@graph_lowering("prims.iota.default")
def _iota(val, length, *, start, step, dtype, device=None, requires_grad=False):
    return (start + jnp.arange(length, dtype=jnp.int64) * step).astype(dtype)


@graph_lowering("prims.convert_element_type.default")
def _convert(val, a, dtype):
    return dt.convert(jnp.asarray(a), dtype)


@graph_lowering("prims.broadcast_in_dim.default")
def _broadcast_in_dim(val, a, shape, broadcast_dimensions):
    return lax.broadcast_in_dim(a, tuple(shape), tuple(broadcast_dimensions))


@graph_lowering("prims.squeeze.default")
def _prims_squeeze(val, a, dimensions):
    return lax.squeeze(a, tuple(dimensions))


@graph_lowering(
    "prims.collapse_view.default",
    "prims.collapse.default",
    "prims.split_dim.default",
    "prims.reshape.default",
    "prims.view_of.default",
)
def _prims_reshape(val, a, *args):
    return jnp.reshape(a, _shape(val))


@graph_lowering("prims.transpose.default")
def _prims_transpose(val, a, permutation):
    return jnp.transpose(a, tuple(permutation))


@graph_lowering("prims.where.default")
def _prims_where(val, pred, a, b):
    return jnp.where(pred, a, b)


@graph_lowering("prims.sum.default")
def _prims_sum(val, a, dims, *, output_dtype=None):
    return jnp.sum(a, axis=tuple(dims)).astype(_jdtype(val, a.dtype))


@graph_lowering("prims.var.default")
def _prims_var(val, a, dims, correction=1, *, output_dtype=None):
    n = math.prod(a.shape[d] for d in dims)
    return (jnp.var(a, axis=tuple(dims)) * n / max(n - correction, 0)).astype(_jdtype(val, a.dtype))


# ---------------------------------------------------------------- random ops without a table lowering
@graph_lowering("rand_like", "rand", random=True)
def _rand(val, *args, key, **kw):
    d = _jdtype(val)
    if jnp.issubdtype(d, jnp.inexact):  # (complex: both parts; half types: never rounded up to 1)
        half = getattr(val, "dtype", None) == torch.complex32
        return random_ops.uniform_values(key, _size_from_args(args), d, half_parts=half)
    return jax.random.uniform(key, _size_from_args(args), d if jnp.issubdtype(d, jnp.floating) else jnp.float32).astype(
        d
    )


@graph_lowering("randn_like", "randn", random=True)
def _randn(val, *args, key, **kw):
    d = _jdtype(val)
    if jnp.issubdtype(d, jnp.inexact):  # (complex: both parts)
        return random_ops.normal_values(key, _size_from_args(args), d)
    return jax.random.normal(key, _size_from_args(args), d if jnp.issubdtype(d, jnp.floating) else jnp.float32).astype(
        d
    )


# ---------------------------------------------------------------- no-ops and checks
@graph_lowering(
    "_assert_tensor_metadata",
    "_assert_scalar",
    "record_stream",
    "_print",
    "sym_constrain_range_for_size",
    "_functional_sym_constrain_range_for_size",
)
def _noop(val, *args, **kw):
    return None


@graph_lowering("_functional_assert_async.msg")
def _functional_assert_async(val, a, msg, dep_token=None):
    """The functionalized `_assert_async`: the same device-side assert (ops/misc.py)."""
    assert_async(a, msg)
    return None
