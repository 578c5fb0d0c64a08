"""Interpret an FX graph of ATen ops as one JAX function: the shared core of torch.compile and of
eager decompositions.

`GraphProgram(graph, owner)` plans the graph once (which JAX function runs each node), and
`program.run(inputs, key)` evaluates it on JAX values inside a trace, so the whole graph becomes
one XLA computation. Every ATen op goes through the lowering table (`LOWERINGS`, via `resolve`,
which also derives in-place / out= variants and traces decompositions). The few ops a graph
needs that are about shape and structure rather than math (views, `getitem`, `sym_size`, `prims.*`,
`_foreach_*`, factories) have interpreter-only lowerings here in `GRAPH_LOWERINGS`; a lowering in
the main table of the same name always wins, so these step aside as the main table grows.

Graph lowerings receive `val` first: the node's meta value (a FakeTensor / meta tensor, a list of
them, or None), which gives PyTorch's own output shape and dtype for factories and casts.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from torch import fx

from ..storage.records import record_of
from . import dtypes as dt
from . import indexing
from .misc import assert_async
from .resolve import NotLowered, functional_twin, resolve
from .table import LOWERINGS, apply
from .views import read

__all__ = ["GRAPH_LOWERINGS", "GraphProgram", "UnsupportedInGraph", "graph_lowering", "node_op_name"]

GRAPH_LOWERINGS: dict[str, Callable] = {}


class UnsupportedInGraph(NotImplementedError):
    pass


# graph lowerings that take a `key=` PRNG key (declared with `random=True`)
_RANDOM_GRAPH_OPS: set = set()


def graph_lowering(*names, random=False):
    def register(fn):
        for name in names:
            full = name if name.count(".") >= 1 else name + ".default"
            GRAPH_LOWERINGS[full] = fn
            if random:
                _RANDOM_GRAPH_OPS.add(full)
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
    return fallback if fallback is not None else dt.to_jax(torch.get_default_dtype())


def _static(shape):
    """The shape as Python ints, or None when it is symbolic (a dynamic-shape graph)."""
    out = []
    for s in shape:
        if type(s) is not int:
            return None
        out.append(s)
    return tuple(out)


def _shape(val):
    shape = _static(val.shape)
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
    from .views import bitcast

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
    from .views import read

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
    return jax.random.uniform(key, _size_from_args(args), d if jnp.issubdtype(d, jnp.floating) else jnp.float32).astype(
        d
    )


@graph_lowering("randn_like", "randn", random=True)
def _randn(val, *args, key, **kw):
    d = _jdtype(val)
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


# ---------------------------------------------------------------- the interpreter
def _meta_like(v):
    """A meta tensor with v's shape, strides and dtype (v: a FakeTensor or meta tensor)."""
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device="meta")
    if isinstance(v, (list, tuple)):
        return type(v)(_meta_like(x) for x in v)
    return v


def _meta_arg(a):
    if isinstance(a, fx.Node):
        return _meta_like(a.meta.get("val"))
    if isinstance(a, (list, tuple)):
        return type(a)(_meta_arg(x) for x in a)
    if isinstance(a, torch.device):
        return torch.device("meta")
    return a


class _Step:
    __slots__ = ("fn", "kind", "mutates", "node", "random_index")


def _static_convert(a):
    """Non-node arguments as lowerings expect them: torch dtypes become jnp dtypes."""
    if isinstance(a, torch.dtype):
        return dt.to_jax(a)
    if isinstance(a, (list, tuple)):
        return type(a)(_static_convert(x) for x in a)
    return a


def _foreach_fn(op):
    """An elementwise JAX function applying the per-tensor op of a `_foreach_*` overload."""
    schema = op._schema
    base = schema.name.split("::")[1][len("_foreach_") :]
    if base.endswith("_"):
        raise UnsupportedInGraph(f"in-place {schema.name} in a non-functional graph")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        raise UnsupportedInGraph(f"torchtpu: no per-tensor op for {schema.name}")
    pos_args = [a for a in schema.arguments if not a.kwarg_only]
    list_pos = {
        i
        for i, a in enumerate(pos_args)
        if str(a.type).startswith(("Tensor[]", "List[Tensor]"))
        or str(a.type) in ("Scalar[]", "List[Scalar]", "number[]")
    }
    # `_foreach_addcmul.Tensor(..., Tensor scalars)`: one value per list element, held in a tensor
    per_elem = {i for i, a in enumerate(pos_args) if a.name == "scalars" and i not in list_pos}
    chosen = {}

    def fn(args, kwargs):
        n = len(args[min(list_pos)])
        outs = []
        for i in range(n):
            elem = [a[i] if (j in list_pos or j in per_elem) else a for j, a in enumerate(args)]
            kinds = tuple(
                "S" if (j in per_elem or not hasattr(x, "shape") or getattr(x, "weak_type", False)) else "T"
                for j, x in enumerate(elem)
            )
            if kinds not in chosen:
                chosen[kinds] = _per_tensor_overload(packet, kinds, kwargs)
            low, extra_kw = chosen[kinds]
            k = dict(kwargs)
            pos = elem[: len(elem) - len(extra_kw)] if extra_kw else elem
            for name, v in zip(extra_kw, elem[len(pos) :]):
                k[name] = v
            outs.append(apply(low, pos, k))
        return tuple(outs)

    return fn


def _per_tensor_overload(packet, kinds, kwargs):
    """(lowering, names of kwarg-only parameters fed from trailing positional values)."""
    best = None
    short = packet._qualified_op_name.split("::")[1]
    for ov in packet.overloads():
        low = LOWERINGS.get(f"{short}.{ov}")
        if low is None:
            continue
        arguments = getattr(packet, ov)._schema.arguments
        pos = [a for a in arguments if not a.kwarg_only]
        kwo = [a for a in arguments if a.kwarg_only and a.name not in kwargs]
        extra = max(0, len(kinds) - len(pos))
        if extra > len(kwo):
            continue
        params = pos[: len(kinds)] + kwo[:extra]
        ok = True
        for k, a in zip(kinds, params):
            t = str(a.type)
            if k == "T" and not t.startswith(("Tensor", "Optional[Tensor]")):
                ok = False
            if k == "S" and t.startswith("Tensor"):
                ok = False
        if ok:
            cand = (low, tuple(a.name for a in kwo[:extra]))
            if best is None or ov in ("default", "Tensor", "List", "Scalar"):
                best = cand
    if best is None:
        raise UnsupportedInGraph(f"torchtpu: no lowering for the per-tensor op of _foreach_{short} {kinds}")
    return best


def _data_dependent(node):
    """Whether the node's value has a shape (or is a scalar) known only from the data."""
    val = node.meta.get("val")
    if val is None:
        return False
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    try:
        return bool(free_unbacked_symbols(val))
    except AssertionError:  # a value PyTorch holds no sizes for (a script object, say): no symbols to find
        return False


def _data_dependent_message(node):
    what = node.target if not isinstance(node.target, torch._ops.OpOverload) else f"aten::{node_op_name(node.target)}"
    return (
        f"torchtpu: {what} has a data-dependent output (its shape or value is known only after running), "
        f"which one static XLA computation cannot express. Use a static-shape alternative: "
        f"torch.where(mask, x, 0) or (x * mask).sum() instead of x[mask], a fixed-size torch.topk instead of "
        f"nonzero, keep values as tensors instead of .item(); or allow a graph break (fullgraph=False, and "
        f"leave torch._dynamo.config.capture_scalar_outputs / capture_dynamic_output_shape_ops off) so "
        f"the op runs in eager mode on the device."
    )


# torch's symbolic-int functions and their JAX forms: a graph's int input can be a traced value
# (compile/backend.py: ints no shape depends on), which torch.sym_max and friends reject
_TRACED_SYM_FUNCTIONS = {
    torch.sym_max: jnp.maximum,
    torch.sym_min: jnp.minimum,
    torch.sym_not: jnp.logical_not,
    torch.sym_ite: jnp.where,
}


def _sym_function(target):
    traced = _TRACED_SYM_FUNCTIONS[target]

    def sym(*args):
        if any(isinstance(a, jax.Array) for a in args):
            return traced(*args)
        return target(*args)

    return sym


def _rng_state_step(node):
    """(kind, lowering) of the RNG higher-order ops AOTAutograd emits for activation checkpointing
    (torch.utils.checkpoint recomputes a random op in the backward with the forward's draw), or the
    reason it cannot be lowered. The saved state is the op's JAX key data, so the replay draws the
    same numbers from the same key."""
    name = getattr(node.target, "__name__", str(node.target))
    kinds = {"run_and_save_rng_state": ("rng_save", 0), "run_with_rng_state": ("rng_replay", 1)}
    if name not in kinds:
        return f"torchtpu: higher-order op {name} is not supported in compiled graphs yet"
    kind, op_position = kinds[name]
    op = node.args[op_position]
    low = LOWERINGS.get(node_op_name(op)) if isinstance(op, torch._ops.OpOverload) else None
    if low is None or not low.random:
        return f"torchtpu: {name} of {op} is not supported in compiled graphs (no random lowering)"
    return kind, low


_SYM_QUERIES = ("sym_size.int", "sym_stride.int", "sym_numel.default", "sym_storage_offset.default")
# ops whose output shape is known only from the data, even when the graph's meta value hides it
_DATA_DEPENDENT_OPS = (
    "_local_scalar_dense.default",
    "nonzero.default",
    "masked_select.default",
    "unique2.default",
    "_unique2.default",
)


def _plan(node):
    """How a call_function node runs: (kind, fn, whether it draws random numbers, the position of the
    argument an in-place op writes or None), or why it cannot run in one static computation."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return _plan_aten(node, target)
    if target is operator.getitem:
        return "getitem", None, False, None
    if isinstance(target, torch._ops.HigherOrderOperator):
        rng = _rng_state_step(node)
        if isinstance(rng, str):
            return rng
        kind, low = rng
        return kind, low, kind == "rng_save", None
    if callable(target) and getattr(target, "__module__", "") in ("_operator", "operator", "math", "builtins"):
        return "python", target, False, None
    if isinstance(target, type) and issubclass(target, tuple):  # return_types namedtuples
        return "python", lambda *a, **k: tuple(a) + tuple(k.values()), False, None
    if target in _TRACED_SYM_FUNCTIONS:
        return "python", _sym_function(target), False, None
    if callable(target) and "sym" in getattr(target, "__name__", ""):
        return "python", target, False, None
    return f"torchtpu: cannot interpret graph node {node.format_node()}"


def _plan_aten(node, target):
    """_plan for an ATen overload: the lowering table first, then the interpreter's own lowerings,
    then a twin or decomposition (resolve)."""
    name = node_op_name(target)
    low = LOWERINGS.get(name)
    if low is not None:
        return "lowering", low, low.random, None
    if name == "copy_.default":
        return "copy_", None, False, None
    if name in GRAPH_LOWERINGS:
        return "graph", GRAPH_LOWERINGS[name], name in _RANDOM_GRAPH_OPS, None
    if name.startswith("_foreach_"):
        try:
            return "call", _foreach_fn(target), False, None
        except UnsupportedInGraph as e:
            return str(e)
    if name in _SYM_QUERIES:
        return "sym", name, False, None
    if name in _DATA_DEPENDENT_OPS:
        return _data_dependent_message(node)
    meta_args = _meta_arg(node.args)
    meta_kwargs = {k: _meta_arg(v) for k, v in node.kwargs.items()}
    try:
        fn = resolve(target, list(meta_args), meta_kwargs)
    except NotLowered as e:
        return str(e)
    twin = functional_twin(target)
    mutates = None
    if twin is not None and not twin[1]:
        # in-place op in a non-functional trace: the first mutable argument gets the value
        mutates = next(
            i for i, a in enumerate(target._schema.arguments) if a.alias_info is not None and a.alias_info.is_write
        )
    twin_lowering = LOWERINGS.get(node_op_name(twin[0])) if twin is not None else None
    return "call", fn, twin_lowering is not None and twin_lowering.random, mutates


class GraphProgram:
    """A planned FX graph: `run(inputs, key)` evaluates it on JAX values (inside a trace).

    `owner` is the GraphModule holding get_attr constants (or None). Returns (outputs, mutations)
    where mutations maps a placeholder index to its new value (from `copy_` into graph inputs).
    """

    def __init__(self, graph: fx.Graph, owner=None):
        self.graph = graph
        self.owner = owner
        self.placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        self.ph_index = {n: i for i, n in enumerate(self.placeholders)}
        self.steps = []
        n_random = 0
        unsupported = []
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            planned = _data_dependent_message(node) if _data_dependent(node) else _plan(node)
            if isinstance(planned, str):
                unsupported.append(planned)
                continue
            s = _Step()
            s.node = node
            s.kind, s.fn, draws, s.mutates = planned
            s.random_index = n_random if draws else None  # each random step folds its own index into the key
            n_random += draws
            self.steps.append(s)
        self.mutated_placeholders = []  # placeholder indices written by copy_ or an in-place op
        for s in self.steps:
            dst = s.node.args[0] if s.kind == "copy_" else (s.node.args[s.mutates] if s.mutates is not None else None)
            written = self.ph_index.get(dst) if isinstance(dst, fx.Node) else None
            if written is not None and written not in self.mutated_placeholders:
                self.mutated_placeholders.append(written)
        self.n_random = n_random
        self.random = n_random > 0
        if unsupported:
            raise NotLowered("\n".join(dict.fromkeys(unsupported)))

    def run(self, inputs, key=None):
        env = {}
        for n, v in zip(self.placeholders, inputs):
            env[n] = v
        mutations = {}

        def load(a):
            if isinstance(a, fx.Node):
                return env[a]
            if isinstance(a, (list, tuple)):
                return type(a)(load(x) for x in a)
            if isinstance(a, torch.dtype):
                return dt.to_jax(a)
            return a

        for n in self.graph.nodes:
            if n.op == "get_attr":
                env[n] = _constant(getattr(self.owner, n.target))
        for s in self.steps:
            node = s.node
            args = [load(a) for a in node.args]
            kwargs = {k: load(v) for k, v in node.kwargs.items()}
            kind = s.kind
            val = node.meta.get("val")
            if kind == "lowering":
                if s.random_index is not None:
                    kwargs["key"] = jax.random.fold_in(key, s.random_index)
                out = apply(s.fn, args, kwargs)
            elif kind == "graph":
                if s.random_index is not None:
                    kwargs["key"] = jax.random.fold_in(key, s.random_index)
                out = s.fn(val, *args, **kwargs)
            elif kind == "call":
                if s.random_index is not None:
                    kwargs["key"] = jax.random.fold_in(key, s.random_index)
                out = s.fn(args, kwargs)
                if s.mutates is not None:
                    target_node = node.args[s.mutates]
                    if isinstance(target_node, fx.Node):
                        env[target_node] = out
                        if target_node in self.ph_index:
                            mutations[self.ph_index[target_node]] = out
            elif kind == "rng_save":  # run_and_save_rng_state(op, *args): (state, op's value)
                op_key = jax.random.fold_in(key, s.random_index)
                out = (jax.random.key_data(op_key), apply(s.fn, args[1:], dict(kwargs, key=op_key)))
            elif kind == "rng_replay":  # run_with_rng_state(state, op, *args): op's value again
                out = apply(s.fn, args[2:], dict(kwargs, key=jax.random.wrap_key_data(args[0])))
            elif kind == "getitem":
                out = args[0][args[1]]
            elif kind == "copy_":
                dst, src = args[0], args[1]
                out = jnp.broadcast_to(jnp.asarray(src).astype(dst.dtype), dst.shape)
                dst_node = node.args[0]
                env[dst_node] = out
                if dst_node in self.ph_index:
                    mutations[self.ph_index[dst_node]] = out
            elif kind == "sym":
                a = args[0]
                if s.fn == "sym_size.int":
                    out = int(a.shape[args[1]])
                elif s.fn == "sym_numel.default":
                    out = int(a.size)
                elif s.fn == "sym_stride.int":
                    out = int(_contig_stride(a.shape)[args[1]])
                else:
                    out = 0
            else:  # python operator on static ints
                out = s.fn(*args, **kwargs)
            env[node] = _fix(out, val) if kind in ("lowering", "call", "graph") else out
        out_node = next(n for n in reversed(self.graph.nodes) if n.op == "output")
        return load(out_node.args[0]), mutations


def _contig_stride(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return tuple(reversed(st))


def _fix(out, val):
    """Make a lowering's value agree with PyTorch's meta value (dtype, broadcast shape)."""
    if isinstance(val, torch.Tensor) and hasattr(out, "dtype") and hasattr(out, "shape"):
        d = dt.to_jax(val.dtype)
        if out.dtype != d:
            out = out.astype(d)
        shape = _static(val.shape)
        if shape is None:  # symbolic: the traced value is the truth
            return out
        if tuple(out.shape) != shape and math.prod(shape) == math.prod(out.shape) == 1:
            out = out.reshape(shape)
        elif tuple(out.shape) != shape and len(out.shape) <= len(shape):
            out = jnp.broadcast_to(out, shape)
        return out
    if isinstance(val, (list, tuple)) and isinstance(out, (list, tuple)) and len(val) == len(out):
        return type(out)(_fix(o, v) for o, v in zip(out, val))
    return out


def _constant(t):
    """A get_attr constant (a tensor attribute of the graph module) as a JAX value."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.device.type == "tpu":
        r = record_of(t)
        flat = r.buffer if r.buffer is not None else jnp.zeros((r.numel,), dt.to_jax(r.dtype))
        return read(flat, (tuple(t.shape), tuple(t.stride()), t.storage_offset(), dt.to_jax(t.dtype), r.numel))
    host = dt.numpy_from_cpu(t.detach().contiguous()) if hasattr(dt, "numpy_from_cpu") else t.detach().numpy()
    return jnp.asarray(host, dt.to_jax(t.dtype))
