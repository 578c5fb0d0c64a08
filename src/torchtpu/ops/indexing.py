"""Lowerings: indexing (advanced indexing, gather/scatter, index_* ops, take/put).

Boolean masks never reach these lowerings in eager mode: eager/data_dependent.py turns them into
long indices first (their count is data-dependent). Out-of-range indices would be clamped by XLA's
gathers and dropped by its scatters: every lowering states the range PyTorch accepts with
`checks.require_index`, a device-side assert reported at the next synchronization (ops/checks.py).
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import torch
from jax import lax

from ..device.platform import lowering_platform
from ..storage import host_values
from .argument_checks import deterministic_alert, index_fill_value_check
from .checks import require, require_index
from .dtypes import WIDE_UNSIGNED, multiply, not_implemented_for, opmath, rounded_complex_product, scalar_type_name
from .table import INDEXED_WRITE, WriteOverlap, expanded_warning, lowering


def _check(index, size, dim, negative_ok):
    """PyTorch's index range for `dim` (of `size`): [0, size), or [-size, size) where negatives wrap."""
    low = -size if negative_ok else 0
    require_index(
        index, size, negative_ok, f"index out of bounds for dimension {dim} with size {size} (valid: {low}..{size - 1})"
    )


def _advanced(indices, x_shape):
    """PyTorch's index list (None = whole dim) as a NumPy-style index tuple, bounds checked."""
    out = []
    for d, i in enumerate(indices):
        if i is None:
            out.append(slice(None))
        elif i.dtype == jnp.bool_ or i.dtype == jnp.uint8:
            raise NotImplementedError(
                "torchtpu: boolean mask indices have a data-dependent shape and are only supported in "
                "eager mode (they are converted to long indices before the lowering)"
            )
        else:
            _check(i, x_shape[d], d, True)
            out.append(i)
    return tuple(out)


# Index buckets (eager/bucketed_index.py): an op whose result does not depend on its index's length may
# run with the index padded to a size bucket, one past the end of its dimension (the scatter drops it;
# the checks leave it out), and the source padded alike along that axis. Each plan names the padded
# arguments: (argument, element of a list or None, axis, flatten, filler).
_INDEX_DTYPES = (torch.int64, torch.int32)


def _past_end(index, size):
    """`size` as the filler of a padded `index` (one past the end), or None where it cannot be."""
    if not isinstance(index, torch.Tensor) or index.dtype not in _INDEX_DTYPES:
        return None
    return size if index.dtype == torch.int64 or size < (1 << 31) - 1 else None


def _index_put_pads(self, indices, values, *_, **__):
    tensors = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(tensors) != 1 or tensors[0][0] >= self.dim() or tensors[0][1].dim() != 1:
        return None
    d, index = tensors[0]
    fill = _past_end(index, self.shape[d])
    if fill is None or not isinstance(values, torch.Tensor):
        return None
    plan = [("indices", d, 0, False, fill)]
    axis = values.dim() - (self.dim() - d)  # values' axis along the index (they broadcast to the slab)
    if axis >= 0 and values.shape[axis] != 1:
        plan.append(("values", None, axis, False, 0))
    return plan


def _along_dim_pads(self, dim, index, source=None, *_, **__):
    """index_add/index_copy/index_reduce: index, and source along `dim`."""
    if self.dim() == 0 or not isinstance(index, torch.Tensor) or index.dim() != 1:
        return None
    d = dim % self.dim()
    fill = _past_end(index, self.shape[d])
    if fill is None:
        return None
    plan = [("index", None, 0, False, fill)]
    if isinstance(source, torch.Tensor):
        if source.dim() != self.dim():
            return None
        plan.append(("source", None, d, False, 0))
    return plan


def _index_copy_pads(self, dim, index, source, *_, **__):
    # one position per call (a static KV cache's step) repeats its shape and has its own path (_select_one)
    return None if index.numel() == 1 else _along_dim_pads(self, dim, index, source)


def _index_fill_pads(self, dim, index, *_, **__):
    return _along_dim_pads(self, dim, index)


def _scatter_pads(self, dim, index, src=None, *_, **__):
    """scatter, scatter_add, scatter_reduce: index (and src) along `dim`."""
    if self.dim() == 0 or not isinstance(index, torch.Tensor) or index.dim() != self.dim():
        return None
    d = dim % self.dim()
    fill = _past_end(index, self.shape[d])
    if fill is None:
        return None
    plan = [("index", None, d, False, fill)]
    if isinstance(src, torch.Tensor) and src.dim() == index.dim():
        plan.append(("src", None, d, False, 0))
    elif isinstance(src, torch.Tensor) and src.numel() != 1:
        return None
    return plan


def _put_pads(self, index, source, *_, **__):
    """put: index and source flattened (the op reads them so)."""
    fill = _past_end(index, self.numel())
    if fill is None or not isinstance(source, torch.Tensor):
        return None
    return [("index", None, 0, True, fill), ("source", None, 0, True, 0)]


# mask_args: the index list (argument 1) may hold boolean masks, which the eager kernel turns into
# indices first (their shapes depend on values; eager/data_dependent.py)
@lowering("index.Tensor", mask_args=1)
def index(x, indices):
    return x[_advanced(indices, x.shape)]


@lowering(
    "index_put",
    "_index_put_impl",
    index_buckets=_index_put_pads,
    mask_args={"index_put.default": 1, "index_put_.default": 1, "_index_put_impl_.default": 1},
    write_overlap=WriteOverlap(
        expanded_warning("index_put_", "tensor[indices] = tensor"), no_overlap=("indices", "values")
    ),
    no_loop_for=WIDE_UNSIGNED,
)
def index_put(x, indices, values, accumulate=False, unsafe=False):
    if values.dtype != x.dtype:  # as the CPU and CUDA kernels (a float64 value into float32 raises)
        raise RuntimeError(
            f"Index put requires the source and destination dtypes match, got "
            f"{scalar_type_name(x.dtype)} for the destination and {scalar_type_name(values.dtype)} "
            f"for the source."
        )
    return _index_put(x, indices, values, accumulate)


def _index_put(x, indices, values, accumulate=False):
    idx = _advanced(indices, x.shape)
    values = values.astype(x.dtype)
    if accumulate:
        return _scatter_add(x, idx, values)
    tensors = [d for d, i in enumerate(indices) if i is not None]
    if len(tensors) == 1 and indices[tensors[0]].ndim == 1:  # x[:, :, pos] = v: a slab along one dim
        d = tensors[0]
        pos = indices[d]
        pos = jnp.where(pos < 0, pos + x.shape[d], pos)
        slab = x.shape[:d] + (pos.shape[0],) + x.shape[d + 1 :]
        if flat_scatter_pays(x.size, math.prod(slab)):
            return flat_set(x, d, pos, jnp.broadcast_to(values, slab))
    return x.at[idx].set(values)


@lowering("_unsafe_index.Tensor")
def unsafe_index(x, indices):
    return x[_advanced(indices, x.shape)]


@lowering("_unsafe_index_put", index_buckets=_index_put_pads)
def unsafe_index_put(x, indices, values, accumulate=False):
    return _index_put(x, indices, values, accumulate)


def _dim(dim, ndim):
    return dim % ndim if ndim else 0


def _full_index(index, dim):
    """The coordinates scatter/gather address: `index` along `dim`, iotas along the other dims."""
    coords = []
    for d in range(index.ndim):
        coords.append(index if d == dim else lax.broadcasted_iota(jnp.int64, index.shape, d))
    return tuple(coords)


def _fit(src, shape):
    """src cut down to `shape` (scatter and gather use the leading part of larger tensors)."""
    if src.shape == tuple(shape):
        return src
    return src[tuple(slice(0, n) for n in shape)]


@lowering("gather", no_loop_for=WIDE_UNSIGNED)
def gather(x, dim, index, sparse_grad=False):
    if index.size == 0:  # PyTorch lets an empty index have any number of dimensions
        return jnp.zeros(index.shape, x.dtype)
    if x.ndim == 0:
        return x.reshape(index.shape) if index.ndim == 0 else jnp.broadcast_to(x, index.shape)
    dim = _dim(dim, x.ndim)
    _check(index, x.shape[dim], dim, False)
    if index.ndim == 0:
        return x.reshape(-1)[index]
    return x[_full_index(index, dim)]


def _scatter_target(x, dim, index):
    """(coordinates, dim) a scatter writes at; None for an empty index, which leaves x as it is and, as
    on the CPU, may have any number of dimensions."""
    if index.size == 0:
        return None, dim
    dim = _dim(dim, x.ndim)
    if x.ndim == 0:
        return (), dim
    _check(index, x.shape[dim], dim, False)
    return _full_index(index, dim), dim


def _scatter_add(x, at, v):
    """x.at[at].add(v); on bool, PyTorch's sum is a logical or (XLA has no bool add)."""
    if x.dtype == jnp.bool_:
        return x.at[at].max(v)
    return x.at[at].add(v)


def _scatter_add_rounded_once(x, at, v):
    """_scatter_add as the CPU's scatter_add and index_add: half types summed in float32, rounded once
    (XLA:CPU's half scatter rounds after each update: duplicate indices differed)."""
    if x.dtype not in (jnp.bfloat16, jnp.float16):
        return _scatter_add(x, at, v)
    acc = opmath(x.dtype)
    return _scatter_add(x.astype(acc), at, v.astype(acc)).astype(x.dtype)


def _scatter_mul(x, at, v):
    """x.at[at].multiply(v); on bool, a logical and; complex on XLA:CPU: the products of `multiply`,
    which the scatter's own combiner would round otherwise (the elementwise `*=` and the scatter must
    agree, and both the CPU's)."""
    if x.dtype == jnp.bool_:
        return x.at[at].min(v)
    if jnp.iscomplexobj(x) and lowering_platform() == "cpu":
        if v.size == 0:  # (an empty index may have fewer dims than x)
            return x
        if not at:  # a 0-dim x
            return multiply(x, v.reshape(())) if v.size == 1 else x.at[at].multiply(v)
        return _scatter_with_combiner(x, at, v, rounded_complex_product)
    return x.at[at].multiply(v)


def _scatter_with_combiner(x, at, v, combine):
    """x with combine(x[at[.][i]], v[i]) stored for each update i in turn (as XLA's scatter-multiply:
    out-of-range updates dropped). JAX's public scatters fix their combiner; its scatter primitive
    takes any, through internals checked against jax 0.10 (absent: the plain multiply)."""
    try:
        from jax._src import core
        from jax._src.lax import lax as lax_internal
        from jax._src.lax import slicing
    except ImportError:  # pragma: no cover - another jax
        return x.at[at].multiply(v)
    indices = jnp.stack([jnp.broadcast_to(c, v.shape) for c in at], axis=-1)
    dnums = lax.ScatterDimensionNumbers(
        update_window_dims=(),
        inserted_window_dims=tuple(range(x.ndim)),
        scatter_dims_to_operand_dims=tuple(range(x.ndim)),
    )
    jaxpr, consts = lax_internal._reduction_jaxpr(combine, core.ShapedArray((), x.dtype))
    return slicing.scatter_mul_p.bind(
        x,
        indices,
        v,
        update_jaxpr=jaxpr,
        update_consts=consts,
        dimension_numbers=dnums,
        indices_are_sorted=False,
        unique_indices=False,
        mode=slicing.GatherScatterMode.FILL_OR_DROP,
    )


def _src(src, index, dtype):
    if hasattr(src, "shape") and src.ndim > 0:
        return _fit(src, index.shape).astype(dtype)
    return jnp.broadcast_to(jnp.asarray(src, dtype), index.shape)


def _scatter_values(x, index, src):
    """The updates of a scatter into x: src (or its value) fitted to the index, and to a 0-dim x as a
    0-dim value (its one-element index may be 1-d: gather's backward into a 0-dim input)."""
    v = _src(src, index, x.dtype)
    return v.reshape(()) if x.ndim == 0 else v


@lowering(
    "scatter.src", "scatter.value", write_overlap=INDEXED_WRITE, index_buckets=_scatter_pads, no_loop_for=WIDE_UNSIGNED
)
def scatter(x, dim, index, src):
    at, _ = _scatter_target(x, dim, index)
    if at is None:
        return x
    return x.at[at].set(_scatter_values(x, index, src))


@lowering(
    "scatter.reduce",
    "scatter.value_reduce",
    write_overlap=INDEXED_WRITE,
    index_buckets=_scatter_pads,
    no_loop_for=WIDE_UNSIGNED,
)
def scatter_reduce_legacy(x, dim, index, src, reduce):
    at, _ = _scatter_target(x, dim, index)
    if at is None:
        return x
    v = _scatter_values(x, index, src)
    return _scatter_add_rounded_once(x, at, v) if reduce == "add" else _scatter_mul(x, at, v)


@lowering("scatter_add", write_overlap=INDEXED_WRITE, index_buckets=_scatter_pads, no_loop_for=WIDE_UNSIGNED)
def scatter_add(x, dim, index, src):
    at, _ = _scatter_target(x, dim, index)
    if at is None:
        return x
    return _scatter_add_rounded_once(x, at, _scatter_values(x, index, src))


def _scatter_reduce(x, at, v, reduce, include_self, counts=None, fold=None):
    """PyTorch's scatter_reduce at index `at` (coordinates or a NumPy-style tuple) with updates `v` of
    x's dtype. `include_self`: a bool, or a traced one (index_reduce's travels as a value). `counts`:
    how many updates land on each element (int64, broadcastable to x), where the caller has them
    cheaper than a scatter over x. `fold(base, multiply)`: where given, sums and products combine the
    updates into `base` one at a time, each step rounded to x's dtype, instead of a scatter."""
    if counts is None:
        counts = jnp.zeros(x.shape, jnp.int64).at[at].add(1)
    hit = counts > 0

    def start(ident):  # x, or the reduction's identity where an update lands and self is left out
        if include_self is True:
            return x
        fresh = hit if include_self is False else hit & ~jnp.asarray(include_self, jnp.bool_)
        return jnp.where(fresh, jnp.asarray(ident, x.dtype), x)

    if reduce in ("sum", "mean"):
        acc = opmath(x.dtype)
        if fold is not None:
            total = fold(start(0), False).astype(acc)
        else:
            total = _scatter_add(start(0).astype(acc), at, v.astype(acc))
        if reduce == "sum":
            return total.astype(x.dtype)
        # as the CPU: the sum is accumulated in opmath, stored in x's dtype, then divided
        total = total.astype(x.dtype).astype(acc)
        count = jnp.maximum(counts + jnp.asarray(include_self, jnp.int64), 1)
        # a true division: XLA turns one by a broadcast into a multiplication by its reciprocal
        count = lax.optimization_barrier(jnp.broadcast_to(count, x.shape))
        if jnp.issubdtype(x.dtype, jnp.integer):
            out = jnp.floor_divide(total, count.astype(total.dtype))
        else:
            out = total / count.astype(total.dtype)
        return jnp.where(hit, out, x).astype(x.dtype)
    if reduce == "prod":
        return fold(start(1), True) if fold is not None else _scatter_mul(start(1), at, v)
    if reduce in ("amax", "amin"):
        if jnp.issubdtype(x.dtype, jnp.floating):
            ident = -jnp.inf if reduce == "amax" else jnp.inf
        elif x.dtype == jnp.bool_:
            ident = reduce != "amax"
        else:
            info = jnp.iinfo(x.dtype)
            ident = info.min if reduce == "amax" else info.max
        base = start(ident)
        return base.at[at].max(v) if reduce == "amax" else base.at[at].min(v)
    raise ValueError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")


def _scatter_reduce_mean_check(x, dim, index, src, reduce, *_, **__):
    if reduce == "mean" and x.dtype == torch.bool:  # (the CPU's other reductions have a bool loop)
        raise not_implemented_for("scatter_gather_tensor_reduce_mean", x.dtype)


@lowering(
    "scatter_reduce.two",
    write_overlap=INDEXED_WRITE,
    index_buckets=_scatter_pads,
    no_loop_for=WIDE_UNSIGNED,
    meta_check=dict.fromkeys(
        ("scatter_reduce.two", "scatter_reduce_.two", "scatter_reduce.two_out"), _scatter_reduce_mean_check
    ),
)
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    if reduce in ("amax", "amin") and jnp.iscomplexobj(x):  # no order on complex numbers (as the CPU)
        raise NotImplementedError(f"\"scatter_reduce_tpu_{reduce}\" not implemented for '{scalar_type_name(x.dtype)}'")
    at, _ = _scatter_target(x, dim, index)
    if at is None:
        return x
    return _scatter_reduce(x, at, _scatter_values(x, index, src), reduce, include_self)


def _along(dim, ndim, index):
    return (slice(None),) * dim + (index,)


# The index_* family's index may be a CPU tensor on a tpu op: moved to the device, as CUDA's advanced
# indexing (`x[cpu_index]`) moves one (eager/engine.py); their other tensors keep the device error.
CPU_INDEX = ("index",)


def _index_select_checks(self, dim, index, **_):
    """The CPU's checks of index_select that PyTorch's meta kernel words otherwise (a dim out of range:
    its bare "list assignment index out of range") or leaves to the lowering (a float index)."""
    ndim = max(self.dim(), 1)
    if not -ndim <= dim < ndim:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], but got {dim})")
    if index.dtype not in _INDEX_DTYPES:
        raise RuntimeError("index_select(): Expected dtype int32 or int64 for index")


def _index_select_bounds_check(self, dim, index, *_, **__):
    """host_check: an index whose values the host knows (a CPU index, or one just copied from it:
    storage/host_values.py) out of range raises at the op, in the CPU's words: its kernel along dim 1
    of a tensor of 2+ dims says "INDICES element is out of DATA bounds" (a RuntimeError), its others
    "index out of range in self" (an IndexError). Any other index is checked on the device (the
    lowering's require), reported at the next sync as on CUDA."""
    if not -max(self.dim(), 1) <= dim < max(self.dim(), 1):
        return  # (meta_check's error)
    if index.dtype not in _INDEX_DTYPES:
        return
    if index.device.type != "cpu":
        values = host_values.numpy_of(index)
        if values is None:
            return
    else:
        values = index.resolve_neg().numpy()
    if not values.size:
        return
    size = self.shape[dim] if self.dim() else 1
    if values.min() >= 0 and values.max() < size:  # (numpy: torch's CPU ops cost ~10 µs each)
        return
    if self.dim() > 1 and dim % self.dim() == 1:
        value = int(values[(values < 0) | (values >= size)].reshape(-1)[0])
        raise RuntimeError(f"INDICES element is out of DATA bounds, id={value} axis_dim={size}")
    raise IndexError("index out of range in self")


# it raises only for an index whose values the host knows: the C++ fast path serves any other call
_index_select_bounds_check.reads_host_values = True


@lowering(
    "index_select",
    write_overlap=WriteOverlap(no_overlap=("self", "index")),
    no_loop_for=WIDE_UNSIGNED,
    cpu_operands=CPU_INDEX,
    meta_check=_index_select_checks,
    host_check=_index_select_bounds_check,
)
def index_select(x, dim, index):
    if index.ndim > 1:  # the meta kernel lets this through, the CPU kernel does not
        raise IndexError("index_select(): Index is supposed to be a vector")
    if x.ndim == 0:
        return x.reshape(-1)[index.reshape(-1)].reshape(())
    dim = _dim(dim, x.ndim)
    index = index.reshape(-1)
    _check(index, x.shape[dim], dim, False)
    return jnp.take(x, index, axis=dim)


@lowering(
    "index_add",
    write_overlap=INDEXED_WRITE,
    index_buckets=_along_dim_pads,
    no_loop_for=WIDE_UNSIGNED,
    cpu_operands=CPU_INDEX,
)
def index_add(x, dim, index, source, alpha=1):
    if x.ndim == 0:
        return x + source.reshape(()).astype(x.dtype) * alpha
    dim = _dim(dim, x.ndim)
    _check(index, x.shape[dim], dim, False)
    at = _along(dim, x.ndim, index.reshape(-1))
    one = isinstance(alpha, (int, float)) and alpha == 1
    if one:  # (with another alpha the CPU rounds half types otherwise, per path: not matched bit for bit)
        return _scatter_add_rounded_once(x, at, source.astype(x.dtype))
    src = source.astype(x.dtype)
    if not one:
        src = (src * alpha).astype(x.dtype)
    return _scatter_add(x, at, src)


# index_copy writing a small slab into a large array (a static KV cache's new position) is a scatter at
# flat element offsets: XLA:CPU turns the slab form into a dynamic-update-slice that it will not run in
# place when the result is also read reshaped (the flat storage buffer written back, attention reading
# the cache) and copies the whole array three to five times per call; the flat scatter updates it in
# place (a (1, 4, 4096, 32) float32 cache read by a dot: 95 us per step instead of 989, jax 0.10.2).
FLAT_SCATTER_MIN = 1 << 14  # elements of x, at least
FLAT_SCATTER_RATIO = 8  # x at least this many times the source


def _flat_offsets(shape, dim, index, src_shape):
    """Row-major offsets in an array of `shape` of every element of a `src_shape` slab whose
    coordinate along `dim` is index[j]; out-of-range positions get the array's size."""
    offsets = jnp.zeros(src_shape, jnp.int64)
    stride = 1
    for d in range(len(shape) - 1, -1, -1):
        coord = lax.broadcasted_iota(jnp.int64, src_shape, d)
        if d == dim:
            coord = index.astype(jnp.int64)[coord]
        offsets = offsets + coord * stride
        stride *= shape[d]
    valid = (index >= 0) & (index < shape[dim])
    return jnp.where(valid[lax.broadcasted_iota(jnp.int32, src_shape, dim)], offsets, stride)


@lowering(
    "index_copy",
    write_overlap=INDEXED_WRITE,
    index_buckets=_index_copy_pads,
    no_loop_for=WIDE_UNSIGNED,
    cpu_operands=CPU_INDEX,
)
def index_copy(x, dim, index, source):
    if x.ndim == 0:
        return source.reshape(()).astype(x.dtype)
    dim = _dim(dim, x.ndim)
    _check(index, x.shape[dim], dim, False)  # (before any reshape: a padded index is checked as itself)
    index = index.reshape(-1)
    source = jnp.broadcast_to(source, x.shape[:dim] + (index.shape[0],) + x.shape[dim + 1 :]).astype(x.dtype)
    if flat_scatter_pays(x.size, source.size):
        return flat_set(x, dim, index, source)
    return x.at[_along(dim, x.ndim, index)].set(source)


def flat_scatter_pays(total, part):
    """Whether writing `part` elements of a `total`-element array goes as a flat scatter."""
    return total >= FLAT_SCATTER_MIN and part * FLAT_SCATTER_RATIO <= total


def flat_set(x, dim, index, source):
    """x with x[..., index[j], ...] (along dim) = source[..., j, ...], as a scatter at flat offsets."""
    if index.shape[0] == 1 and x.dtype in (jnp.bfloat16, jnp.float16):
        from ..device.platform import lowering_platform

        if lowering_platform() == "cpu":
            return _select_one(x, dim, index[0], source)
    at = _flat_offsets(x.shape, dim, index, source.shape).reshape(-1)
    return x.reshape(-1).at[at].set(source.reshape(-1), mode="drop").reshape(x.shape)


def _select_one(x, dim, position, source):
    """flat_set of one position of a bfloat16/float16 array on XLA:CPU, as an elementwise select. XLA:CPU
    computes a half-precision scatter (and dynamic-update-slice) in float32: the whole array converted
    there and back at every call (a (1, 8, 4096, 128) bf16 KV cache: 3-17 ms per written position
    against 0.1 ms in float32); the select is one pass over the array in its own dtype (0.35 ms), in place.
    An out-of-range position matches nothing: nothing is written, as the scatter's "drop"."""
    at = lax.broadcasted_iota(position.dtype, x.shape, dim) == position
    return jnp.where(at, jnp.broadcast_to(source, x.shape), x)


@lowering(
    "index_fill.int_Scalar",
    "index_fill.int_Tensor",
    host_check=dict.fromkeys(
        ("index_fill.int_Scalar", "index_fill_.int_Scalar", "index_fill.int_Tensor", "index_fill_.int_Tensor"),
        index_fill_value_check,
    ),
    write_overlap=WriteOverlap(expanded_warning("index_fill_", "tensor[mask] = scalar"), no_overlap=("index",)),
    index_buckets=_index_fill_pads,
    no_loop_for=WIDE_UNSIGNED,
    cpu_operands=CPU_INDEX,
)
def index_fill(x, dim, index, value):
    if x.ndim == 0:
        return jnp.asarray(value, x.dtype).reshape(())
    dim = _dim(dim, x.ndim)
    _check(index, x.shape[dim], dim, True)
    index = index.reshape(-1)
    index = jnp.where(index < 0, index + x.shape[dim], index)
    return x.at[_along(dim, x.ndim, index)].set(jnp.asarray(value).astype(x.dtype))


# include_self travels as a value (`traced=`): keyed by it, each index_reduce_ compiled twice
@lowering(
    "index_reduce",
    real_only=True,
    write_overlap=INDEXED_WRITE,
    traced=("include_self",),
    index_buckets=_along_dim_pads,
    no_loop_for=(torch.bool, *WIDE_UNSIGNED),
    cpu_operands=CPU_INDEX,
)
def index_reduce(x, dim, index, source, reduce, include_self=True):
    if x.ndim == 0:
        x, source = x.reshape(1), source.reshape(1)
        return index_reduce(x, 0, index, source, reduce, include_self).reshape(())
    dim = _dim(dim, x.ndim)
    _check(index, x.shape[dim], dim, False)
    index = index.reshape(-1)
    # whole slices along dim (a scatter of windows: cheaper to compile than coordinates per element)
    shape = [1] * x.ndim
    shape[dim] = -1
    counts = jnp.zeros(x.shape[dim], jnp.int64).at[index].add(1).reshape(shape)
    source = source.astype(x.dtype)
    fold = None
    if x.dtype in (jnp.bfloat16, jnp.float16) and index.shape[0] <= FOLD_MAX:
        fold = functools.partial(_fold_along, dim=dim, index=index, source=source)
    return _scatter_reduce(x, _along(dim, x.ndim, index), source, reduce, include_self, counts, fold)


# The CPU's index_reduce adds and multiplies the source's slices into self one at a time in self's
# dtype: in half types each step rounds (a bfloat16 mean off by 3% from a sum rounded once, as a
# scatter on XLA:CPU computes it in float32). A loop step per index entry, up to FOLD_MAX of them.
FOLD_MAX = 1 << 12


def _fold_along(base, multiply, *, dim, index, source):
    if index.shape[0] == 0:
        return base

    size = base.shape[dim]

    def step(i, acc):
        j = index[i]
        row, s = lax.dynamic_index_in_dim(acc, j, dim), lax.dynamic_index_in_dim(source, i, dim)
        new = (row * s if multiply else row + s).astype(acc.dtype)
        # an index out of range is dropped, as the scatter drops it (a padded one: eager/bucketed_index.py)
        new = jnp.where((j >= 0) & (j < size), new, row)
        return lax.dynamic_update_index_in_dim(acc, new, j, dim)

    return lax.fori_loop(0, index.shape[0], step, base)


def _masked_scatter_source_check(self, mask, source, *_, **__):
    """host_check: a mask whose values the host knows (just copied from it: storage/host_values.py)
    with more ones than `source` has elements raises the CPU's error at the op. Any other mask is
    checked on the device (the require below), reported at the next sync as on CUDA: counting its
    ones here would be a sync per call."""
    if not host_values.KNOWN or not _source_may_be_short(self, mask, source):
        return
    known = host_values.values_of(mask)
    if known is not None:
        ones = int(known.broadcast_to(torch.broadcast_shapes(self.shape, mask.shape)).count_nonzero())
        if ones > source.numel():
            raise RuntimeError("Number of elements of source < number of ones in mask")


def _source_may_be_short(self, mask, source, *_, **__):
    # (shapes key the eager cache: where this is False the C++ fast path skips the check)
    return source.numel() < math.prod(torch.broadcast_shapes(self.shape, mask.shape))


_masked_scatter_source_check.can_raise = _source_may_be_short


def _masked_scatter_mask_check(self, mask, *_, **__):
    """The CPU takes bool masks only (PyTorch's meta kernel lets uint8 through, in other words)."""
    if mask.dtype != torch.bool:
        raise RuntimeError(
            f"masked_scatter_ only supports boolean masks, but got mask with dtype {scalar_type_name(mask.dtype)}"
        )


@lowering(
    "masked_scatter",
    no_loop_for=WIDE_UNSIGNED,
    write_overlap=WriteOverlap(),
    meta_check=dict.fromkeys(("masked_scatter", "masked_scatter_", "masked_scatter.out"), _masked_scatter_mask_check),
    host_check=dict.fromkeys(("masked_scatter", "masked_scatter_", "masked_scatter.out"), _masked_scatter_source_check),
)
def masked_scatter(x, mask, source):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x = jnp.broadcast_to(x, shape)
    m = jnp.broadcast_to(mask, shape).reshape(-1)
    require(
        jnp.sum(m, dtype=jnp.int64) <= source.size,
        "masked_scatter: Number of elements of source < number of ones in mask",
        recoverable=True,  # a read of `source` out of bounds: nothing else is wrong
    )
    # the k-th True takes the k-th element of source
    pos = jnp.clip(jnp.cumsum(m.astype(jnp.int64)) - 1, 0, max(source.size - 1, 0))
    src = source.reshape(-1).astype(x.dtype)
    picked = src[pos] if source.size else jnp.zeros(m.shape, x.dtype)
    return jnp.where(m, picked, x.reshape(-1)).reshape(shape)


@lowering("take", write_overlap=WriteOverlap(no_overlap=("self", "index")), no_loop_for=WIDE_UNSIGNED)
def take(x, index):
    flat = x.reshape(-1)
    _check(index, flat.shape[0], 0, True)
    return flat[jnp.where(index < 0, index + flat.shape[0], index)]


def _put_alerts(self, index, source, accumulate=False):
    return not accumulate  # duplicate indices: which source wins is not defined (the CPU's rule)


@lowering(
    "put",
    write_overlap=INDEXED_WRITE,
    host_check=dict.fromkeys(("put", "put_"), deterministic_alert("put_", _put_alerts)),
    index_buckets=_put_pads,
    no_loop_for=WIDE_UNSIGNED,
)
def put(x, index, source, accumulate=False):
    flat = x.reshape(-1)
    _check(index, flat.shape[0], 0, True)
    idx = index.reshape(-1)
    idx = jnp.where(idx < 0, idx + flat.shape[0], idx)
    src = source.reshape(-1).astype(x.dtype)
    out = _scatter_add(flat, idx, src) if accumulate else flat.at[idx].set(src)
    return out.reshape(x.shape)
