"""PrivateUse1 registrations: the engine for every lowered op, and the few hand-written kernels
(views, allocation, transfers, scalars) that are about metadata or the host, not computation."""

from __future__ import annotations

import functools
import math
import warnings

import jax
import numpy as np
import torch
from torch._C import DispatchKey, DispatchKeySet
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense
from torch._subclasses import fake_impls
from torch.nn.parameter import UninitializedTensorMixin
from torch.utils import _pytree as pytree

from .. import config, metrics
from ..device import host_pages, platform
from ..device.state import current_device
from ..ops import argument_checks, factories, pooling
from ..ops import dtypes as dt
from ..ops.linalg_decompositions import CHECK_ERRORS_ON_HOST
from ..ops.resolve import NotLowered, functional_twin, op_name
from ..ops.table import LOWERINGS, declared_facts, reject_missing_loop
from ..storage import host_values, slices
from ..storage.records import RECORDS, covers, new_tensor, record_of, set_buffer
from . import (
    asserts,
    attention,
    data_dependent,
    errors,
    fastpath,
    fusion,
    growing,
    host_cat,
    host_copies,
    host_fills,
    interrupts,
    matrix_batches,
    storage_kernels,
    tpu_check,
)
from .build import META_OVERRIDES
from .engine import OpKernel, describe_last_call, forget_last_call
from .entry import CONSTANT_BYTES, scalar_key
from .fusion import Pending

aten = torch.ops.aten
CPU_KEYS = DispatchKeySet(DispatchKey.CPU)
_lib = None
_fallback_lib = None
KERNELS: dict = {}  # OpOverload -> OpKernel
_cpu_fallback = [config.get("TORCHTPU_CPU_FALLBACK")]


_registered = set()  # overloads given a PrivateUse1 kernel by _impl ("add.Tensor", "nonzero.default")


def _impl(name, fn):
    _lib.impl(name, fn, "PrivateUse1")
    _note_registered(name)


def _note_registered(name):
    _registered.add(name if not isinstance(name, str) else name if "." in name else name + ".default")


# ------------------------------------------------------------------ metadata-only ops
# The CPU kernels of these only touch sizes/strides/offset and share the storage, exactly the
# aliasing PyTorch expects; every composite view op (slice, select, t, expand, ...) builds on them.
_METADATA_OPS = [
    "as_strided",
    "view",
    "_reshape_alias",
    "alias",
    "unfold",
    "set_.source_Storage",
    "set_.source_Tensor",
    "view.dtype",
    "_unsafe_view",
    "lift_fresh",
    "_nested_view_from_buffer",
    "view_as_real",
    "view_as_complex",
    "is_set_to",  # compares storage, offset, sizes and strides only
]


# metadata ops whose CompositeExplicitAutograd kernel serves any device when no C++ fast path is built
_COMPOSITE_METADATA_OPS = ("alias",)


def _redispatch_to_cpu(op):
    # without the C++ fast path (which registers the same redispatch in C++: fastpath.attach_metadata):
    # the C++ redispatch bound to the CPU key, called through one Python frame
    return functools.partial(op._handle.redispatch_boxed, CPU_KEYS)


def _check_sizes(size):
    """PyTorch's error for a negative size (before it reaches the storage constructor)."""
    for n in size:
        if n < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {n}: {list(size)}")


def _warn_if_complex_half(dtype):
    """PyTorch's warning at each new complex32 tensor (once per process unless warn_always)."""
    if dtype == torch.complex32 and (not _complex_half_warned[0] or torch.is_warn_always_enabled()):
        _complex_half_warned[0] = True
        warnings.warn(
            "ComplexHalf support is experimental and many operators don't support it yet.", UserWarning, stacklevel=3
        )


_complex_half_warned = [False]


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_sizes(size)
    index = _device_index(device)
    dt.to_jax(dtype or torch.get_default_dtype())  # a dtype tpu lacks: our TypeError now, not a confusing one later
    _warn_if_complex_half(dtype)
    t = new_tensor(tuple(size), dtype or torch.get_default_dtype(), index)
    if memory_format is not None and memory_format not in (torch.contiguous_format, torch.preserve_format):
        t = _restride(t, memory_format)
    return t


def _restride(t, memory_format):
    strides = torch.empty(t.shape, device="meta").contiguous(memory_format=memory_format).stride()
    return aten.as_strided.default.redispatch(CPU_KEYS, t, t.shape, strides, 0)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    if len(size) != len(stride):
        raise RuntimeError(
            f"dimensionality of sizes ({len(size)}) must match dimensionality of strides ({len(stride)})"
        )
    _check_sizes(size)
    index = _device_index(device)
    dtype = dtype or torch.get_default_dtype()
    dt.to_jax(dtype)
    _warn_if_complex_half(dtype)
    size, stride = tuple(size), tuple(stride)
    extent = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
    if extent == math.prod(size):
        return new_tensor(size, dtype, index, stride=stride)
    base = new_tensor((extent,), dtype, index)
    return aten.as_strided.default.redispatch(CPU_KEYS, base, size, stride, 0)


def _device_index(device):
    if device is None:
        index = current_device()
    else:
        index = current_device() if device.index is None else device.index
    platform.jax_device(index)  # raises naming the index and the device count
    return index


# ------------------------------------------------------------------ host <-> device
def _whole(t: torch.Tensor, r):
    """(t, its record), or for a tensor that is not all of its storage a contiguous copy of it (one
    gather, queued) and its record: the record's buffer then holds exactly t's values."""
    if covers(t, r):
        return t, r
    t = aten.clone.default(t, memory_format=torch.contiguous_format)
    return t, record_of(t)


# A few elements of a small storage (`bool(mask[i])` in a loop over a tensor) are read from the host
# copy of the whole storage (JAX keeps it with the array; on XLA:CPU it is the buffer itself) instead
# of a gather on the device per read: 5000 reads 3.0 s -> ~0.1 s
_FEW_ELEMENTS = 16
_HOST_COPY_BYTES = 4 << 20


def _few_from_host_copy(t, r):
    if (
        t.numel() > _FEW_ELEMENTS
        or r.nbytes > _HOST_COPY_BYTES
        or t.dtype != r.dtype
        or t.is_conj()  # (lazily conjugated or negated views: their values are not the stored ones)
        or t.is_neg()
        or r._buffer is None
        or covers(t, r)
    ):
        return None
    if type(r._buffer) is not Pending and not isinstance(r._buffer, jax.Array):
        return None
    fusion.count_read(r._buffer)
    # (a value still queued: its segment runs, rather than a gather of this view queued, a program
    # per view layout: `all(verdicts)` reads each element of a new shape)
    buffer = r.buffer
    flat = _host_array(buffer).reshape(-1)
    offset = t.storage_offset()
    if t.numel() == 1:  # (`bool(cond[i])` in a loop: numpy's as_strided is most of such a read)
        out = flat[offset : offset + 1].reshape(tuple(t.shape))
    else:
        size = flat.itemsize
        out = np.lib.stride_tricks.as_strided(
            flat[offset:], tuple(t.shape), tuple(st * size for st in t.stride()), writeable=False
        ).copy()
    metrics.counters.d2h_bytes += out.nbytes
    metrics.counters.d2h_transfers += 1
    return out


def _host_array(buffer) -> np.ndarray:
    """A device array's values on the host; flat where it has more dims than numpy's arrays take
    (XLA's take more than 64)."""
    return np.asarray(buffer.reshape(-1) if buffer.ndim > errors.MAX_DIMS else buffer)


def to_host(t: torch.Tensor) -> np.ndarray:
    """The values of a tpu tensor as a numpy array (a sync point)."""
    if t.dim() > errors.MAX_DIMS:  # (numpy's limit: copies go through flat views, _copy_flat)
        if t.numel() == 1:
            return to_host(t.reshape(()))
        raise errors.too_many_dims("to the host", (t,))
    r = RECORDS.get(t.untyped_storage().data_ptr())
    if r is None:  # a tensor PyTorch made over a storage slice's address (storage/slices.py)
        moved = slices.on_parent(t)
        t = t if moved is None else moved
        r = record_of(t)
    if interrupts.PENDING:
        interrupts.raise_pending()
    if host_copies.PENDING:  # earlier non-blocking copies to the host land first, as in CUDA's stream order
        host_copies.finish(r.device_index)
    asserts.check(r.device_index)
    few = _few_from_host_copy(t, r)
    if few is not None:
        return few
    t, r = _whole(t, r)
    fusion.count_read(r._buffer)
    if r.buffer is None:
        out = np.zeros(tuple(t.shape), dt.storage_jax(t.dtype))
    else:
        try:
            out = _host_array(r.buffer).reshape(tuple(t.shape))  # (t covers its storage: _whole)
        except jax.errors.JaxRuntimeError as e:  # an asynchronous allocation failure surfaces here
            errors.raise_out_of_memory(e)
            raise
    metrics.counters.d2h_bytes += out.nbytes
    metrics.counters.d2h_transfers += 1
    return out


def _from_host(array: np.ndarray, dtype, index):
    """A device buffer of tpu:`index` holding a copy of `array`, in `array`'s shape (a contiguous
    tensor's storage shape: storage/records.py)."""
    # (platform.put copies: the device tensor never aliases the user's CPU tensor)
    host = np.ascontiguousarray(array)
    metrics.counters.h2d_bytes += host.nbytes
    metrics.counters.h2d_transfers += 1
    # (a checkpoint's memory-mapped pages are given back as they are copied: device/host_pages.py)
    return host_pages.put_releasing(host, index, lambda part: platform.put(part, index))


def _write_whole_or_copy(dst, buffer, dtype):
    """Give dst the values of a device buffer (dst's elements in order) of `dtype`."""
    r = record_of(dst)
    if dtype == dst.dtype and covers(dst, r):
        set_buffer(r, buffer)
    else:
        tmp = new_tensor(tuple(dst.shape), dtype, r.device_index, buffer)
        KERNELS[aten.copy_.default](dst, tmp)
    return dst


# A clone, or a copy_ of one whole storage into another of the same shape and dtype, shares the
# source's buffer instead of running an executable: JAX arrays are immutable and every write gives a
# storage a new buffer, so two storages holding one array stay independent (eager ops and compiled graphs
# donate a buffer only when nothing else refers to it: storage/records.py, donatable). Transformers' generate() clones
# and copies logits and token ids every step; this makes those ~6 us instead of ~15-20 (an XLA call).
def _clone(self, *, memory_format=None):
    # only the engine's clone kernel below says what ran (fastpath.describe): not an earlier call's
    forget_last_call()
    r = RECORDS.get(self.untyped_storage().data_ptr())
    if memory_format in (None, torch.preserve_format, torch.contiguous_format):
        if self.numel() == 0 and memory_format is not torch.contiguous_format and is_non_overlapping_and_dense(self):
            # nothing to copy, and an empty tensor's layout is in its strides alone (the CPU keeps them)
            return torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device=self.device)
        if r is not None and r._buffer is not None and covers(self, r):
            return new_tensor(tuple(self.shape), self.dtype, r.device_index, r._buffer, form=r.shape)
        if memory_format is torch.contiguous_format or self.is_contiguous() or not is_non_overlapping_and_dense(self):
            return KERNELS[aten.clone.default](self, memory_format=memory_format)
        # preserve_format keeps a dense tensor's strides (a transposed matrix stays transposed), as CUDA
        return torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device=self.device).copy_(self)
    return torch.empty(self.shape, dtype=self.dtype, device=self.device, memory_format=memory_format).copy_(self)


def _plain(t):
    """`t` as a plain Tensor: a subclass may hide what a kernel reads (a lazy module's
    UninitializedParameter raises on `.shape`; PyTorch's CPU and CUDA kernels see the C++ tensor)."""
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


def _copy_(self, src, non_blocking=False):
    if type(src) is not torch.Tensor:
        src = _plain(src)
    if src.is_complex() and not self.is_complex():
        warnings.warn("Casting complex values to real discards the imaginary part", UserWarning, stacklevel=2)
    if (self.dim() > errors.MAX_DIMS or src.dim() > errors.MAX_DIMS) and self.device != src.device:
        return _copy_flat(self, src, non_blocking)
    if self.device.type == "tpu" and src.device.type == "tpu":
        if self.device.index == src.device.index:
            rd, rs = record_of(self), record_of(src)
            # (not while device-side asserts are unchecked: the engine's copy is gated, eager/asserts.py)
            if (
                rs._buffer is not None
                and self.dtype == src.dtype
                and self.shape == src.shape
                and covers(self, rd)
                and covers(src, rs)
                and not asserts.gating()
            ):
                set_buffer(rd, rs._buffer if rs.shape == rd.shape else rs.buffer)
                return self
            return KERNELS[aten.copy_.default](self, src)
        value = to_host(src) if src.numel() else np.zeros(tuple(src.shape), dt.storage_jax(src.dtype))
        moved = platform.put(np.ascontiguousarray(value), self.device.index)
        return (
            _write_whole_or_copy(self, moved, src.dtype)
            if tuple(src.shape) == tuple(self.shape)
            else KERNELS[aten.copy_.default](self, new_tensor(tuple(src.shape), src.dtype, self.device.index, moved))
        )
    if self.device.type == "tpu":  # host -> device
        if src.device.type != "cpu":
            src = src.cpu()
        if src.is_conj() or src.is_neg():
            src = src.resolve_conj().resolve_neg()
        dt.to_jax(src.dtype)  # a dtype tpu has no arrays for raises our TypeError, not numpy's
        index = self.device.index
        if src.dtype != self.dtype and tuple(src.shape) == tuple(self.shape):
            # (a bfloat16 checkpoint loaded as float32: converted by torch CPU into the pages the device
            # buffer adopts, on XLA:CPU: device/host_pages.py)
            moved = host_pages.put_converted(src.contiguous(), self.dtype, dt.storage_jax(self.dtype), index)
            if moved is not None:
                metrics.counters.h2d_bytes += src.nbytes
                metrics.counters.h2d_transfers += 1
                return _write_whole_or_copy(self, moved, self.dtype)
        host = dt.numpy_from_cpu(src.contiguous())
        if tuple(src.shape) == tuple(self.shape):
            buffer = _from_host(host, src.dtype, index)
            # an index list (`x[[5]]`) or a mask: checked on the host at the op (storage/host_values.py)
            host_values.remember(self.untyped_storage().data_ptr(), buffer, host.reshape(-1), src.dtype)
            return _write_whole_or_copy(self, buffer, src.dtype)
        tmp = new_tensor(tuple(src.shape), src.dtype, index, _from_host(host, src.dtype, index))
        return KERNELS[aten.copy_.default](self, tmp)
    # device -> host
    if (
        non_blocking
        and tuple(self.shape) == tuple(src.shape)
        and src.numel()
        and self.is_pinned()
        and not (src.is_conj() or src.is_neg())
    ):
        return _copy_to_host_async(self, src)
    host = dt.cpu_from_numpy(to_host(src), src.dtype)
    return self.copy_(host)


def _copy_flat(dst, src, non_blocking):
    """A copy between the host and tpu of more dims than numpy's arrays take (64; XLA takes more):
    through a dense flat tensor on each side (views of the dense tensors, made by ops on their
    own devices)."""
    dense = src.expand(dst.shape).contiguous()
    flat = dense.view(-1).to(dst.device, non_blocking=non_blocking)
    return dst.copy_(flat.view(dst.shape))


def _copy_to_host_async(dst, src):
    """`dst.copy_(src, non_blocking=True)` into pinned host memory: the transfer starts now and
    lands at the device's next sync point (eager/host_copies.py), as CUDA's does."""
    src, r = _whole(src, record_of(src))
    fusion.count_read(r._buffer)
    buffer = r.buffer
    if buffer is None:  # never written: nothing on the device to wait for
        return dst.copy_(dt.cpu_from_numpy(np.zeros(tuple(src.shape), dt.storage_jax(src.dtype)), src.dtype))
    host_copies.start(dst, buffer, tuple(src.shape), src.dtype, r.device_index)
    return dst


def _copy_from(self, dst, non_blocking=False):
    return _copy_(dst, self, non_blocking)


def _local_scalar_dense(self):
    if self.dtype == torch.complex32:  # (its host array holds uint32: ops/dtypes.py TO_JAX)
        return dt.cpu_from_numpy(to_host(self), self.dtype).item()
    return to_host(self).item()


def _equal(self, other):
    if self.shape != other.shape:
        return False
    return bool(torch.eq(self, other).all().item())


# A cat or stack of more tensors than this runs as cats of chunks: one program with a parameter per
# tensor compiles in time that grows with their count (`torch.stack` of 997 tensors: 2.4 s of CPU;
# in chunks of 64, whose program the other chunks reuse, 0.14 s).
CAT_CHUNK = 64


def _cat_in_chunks(kernel, args, kwargs):
    """The first call of a cat/stack with over CAT_CHUNK tensors of one dtype: chunks, then a cat of
    their results (stack's chunks are stacks along `dim`); None otherwise, or where the chunks refuse
    (the whole op then raises the CPU's error, naming the tensor's place in the whole list)."""
    tensors = args[0] if args else kwargs.get("tensors")
    if len(tensors) <= CAT_CHUNK or kwargs.keys() - {"dim"} or len({t.dtype for t in tensors}) != 1:
        return None
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    try:
        parts = [kernel(tensors[i : i + CAT_CHUNK], dim) for i in range(0, len(tensors), CAT_CHUNK)]
        return kernel_for(aten.cat.default)(parts, dim)
    except RuntimeError:
        return None


def _cat_first_call(kernel, args, kwargs):
    """A cat's first call: an append to a growing tensor (eager/growing.py), a small cat on the host
    (eager/host_cat.py, XLA:CPU), else in chunks."""
    results = growing.serve_cat(kernel, args, kwargs)
    if results is None:
        results = host_cat.serve(kernel, args, kwargs)
    return results if results is not None else _cat_in_chunks(kernel, args, kwargs)


def _stack_first_call(kernel, args, kwargs):
    """A stack's first call: small on the host (eager/host_cat.py, XLA:CPU), else in chunks."""
    results = host_cat.serve(kernel, args, kwargs, stack=True)
    return results if results is not None else _cat_in_chunks(kernel, args, kwargs)


def _addbmm_into_broadcast_self(kernel, args, kwargs):
    """addbmm_ of a `self` that only broadcasts to the product's (n, p): ATen's addbmm_ is addbmm.out
    into `self`, which computes with `self` broadcast, then resizes it (CPU and CUDA alike); PyTorch's
    meta kernel refuses instead. Only a `self` of one element or one row: the CPU reads a column-shaped
    one through the storage it is overwriting. None otherwise (the engine's path, and its errors)."""
    self, batch1, batch2 = args[:3]
    if batch1.dim() != 3 or batch2.dim() != 3 or self.numel() not in (1, batch2.shape[2]) or self.dim() > 2:
        return None
    if tuple(self.shape) == (batch1.shape[1], batch2.shape[2]) or (self.dim() == 2 and self.shape[0] != 1):
        return None
    try:
        result = kernel_for(aten.addbmm.default)(*args, **kwargs)
    except RuntimeError:
        return None
    return self.resize_(result.shape).copy_(result)


# ------------------------------------------------------------------ registration and fallback
def _all_overloads():
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::"):
            continue
        name, _, overload = qualified[6:].partition(".")
        packet = getattr(aten, name, None)
        if packet is None:
            continue
        try:
            yield getattr(packet, overload or "default")
        except AttributeError:  # an overload this torch does not have
            continue


def _lowered(op) -> bool:
    if op_name(op) in LOWERINGS:
        return True
    twin = functional_twin(op)
    return twin is not None and op_name(twin[0]) in LOWERINGS


_COMPOSITE_IN_EAGER = declared_facts("composite_in_eager")
_CPU_OPERANDS = declared_facts("cpu_operands")


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def _whole_composite(op, kernel):
    """A composite op's engine kernel, for plain tpu tensors outside any dispatch mode. It sits on the
    Autograd key, before the Python key: fake and functional tensors (Dynamo, export), functorch's
    wrappers and a TorchDispatchMode get the decomposition, as before; complex32 too (the lowering
    would see complex64 and round once, where each step of the decomposition rounds)."""
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor

    def whole(*args, **kwargs):
        if torch._C._len_torch_dispatch_stack() or any(
            isinstance(a, torch.Tensor) and (type(a) not in _PLAIN_TENSORS or wrapped(a) or a.dtype == torch.complex32)
            for a in args
        ):
            return op.decompose(*args, **kwargs)
        return kernel(*args, **kwargs)

    return whole


def kernel_for(op) -> OpKernel:
    k = KERNELS.get(op)
    if k is None:
        k = KERNELS[op] = OpKernel(op)
        name = op_name(op)
        twin = functional_twin(op)
        low = LOWERINGS.get(name) or (LOWERINGS.get(op_name(twin[0])) if twin else None)
        k.random = bool(low and low.random)
        k.draws_by_index = bool(low and low.draws_by_index)
        k.index_buckets = low.index_buckets if low is not None else None
        movable = _CPU_OPERANDS.get(low.name) if low is not None else None
        if movable:
            arguments = op._schema.arguments
            k.cpu_operands = (
                frozenset(i for i, a in enumerate(arguments) if a.name in movable and not a.kwarg_only),
                frozenset(a.name for a in arguments if a.name in movable),
            )
        for i, a in enumerate(op._schema.arguments):
            if low is not None and a.name in low.traced:  # e.g. a fused optimizer's lr
                if a.kwarg_only:
                    k.scalar_names.add(a.name)
                else:
                    k.scalar_pos.add(i)
        if low is not None and low.traced:
            k.set_filled_defaults(low.traced)
        if name in matrix_batches.PLANS:  # batched decompositions: a flat batch, one program per bucket
            k.split_call = matrix_batches.serve
    return k


def set_cpu_fallback(enabled: bool = True):
    """Run ops that have no tpu lowering on the CPU (warning once per op) instead of raising."""
    _cpu_fallback[0] = bool(enabled)


def _fallback(op, *args, **kwargs):
    """Ops with no PrivateUse1 kernel: decompose if PyTorch can, else CPU fallback or a clear error."""
    k = KERNELS.get(op)
    try:
        if k is None:
            k = kernel_for(op)
        return k(*args, **kwargs)
    except NotLowered:
        KERNELS.pop(op, None)
        _refuse_layout(op)
        if not _cpu_fallback[0]:
            raise
    return _run_on_cpu(op, args, kwargs)


# Ops that make or take sparse, quantized or MKL-DNN tensors: tpu tensors are dense (strided) only,
# and a CPU fallback could not bring such a result back to the device.
_LAYOUT_WORDS = (("sparse", "sparse layouts"), ("quantize", "quantized tensors"), ("mkldnn", "the mkldnn layout"))


def _sparse_fallback(op, *args, **kwargs):
    """The SparsePrivateUse1 key: every op reaching it makes or takes a sparse tpu tensor."""
    raise NotImplementedError(
        f"torchtpu: aten::{op_name(op)}: sparse layouts are not supported on the tpu device (tpu tensors are "
        f"dense and strided); keep sparse tensors on the CPU, or call .to_dense() before moving them"
    )


def _nested_fallback(op, *args, **kwargs):
    """The NestedTensorPrivateUse1 key: an op with no kernel for nested tpu tensors (PyTorch has
    NestedTensorCPU/CUDA kernels; a nested tpu tensor is made, viewed and unbound, not computed on)."""
    raise NotImplementedError(
        f"torchtpu: aten::{op_name(op)}: nested tensors (the NestedTensor layout) are not supported on the tpu "
        f"device; keep them on the CPU, or pad them there (torch.nested.to_padded_tensor) and move the padded "
        f"tensor, with a mask"
    )


def _refuse_layout(op):
    name = op_name(op)
    for word, what in _LAYOUT_WORDS:
        if word in name:
            raise NotImplementedError(
                f"torchtpu: aten::{name}: {what} are not supported on the tpu device (tpu tensors are dense "
                f"and strided); keep such tensors on the CPU"
            )


@functools.cache
def _warn_once(name):
    warnings.warn(
        f"torchtpu: aten::{name} has no tpu lowering; running it on the CPU (TORCHTPU_CPU_FALLBACK is on)", stacklevel=3
    )


def _run_on_cpu(op, args, kwargs):
    """Run `op` on CPU copies of its tpu tensors; write mutated arguments back; results to tpu."""
    _warn_once(op_name(op))
    metrics.counters.cpu_fallbacks += 1
    originals = {}  # id(cpu copy) -> tpu tensor

    def to_cpu(x):
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            c = x.cpu()
            originals[id(c)] = x
            return c
        return x

    cpu_args, cpu_kwargs = pytree.tree_map(to_cpu, (list(args), dict(kwargs)))
    out = op(*cpu_args, **cpu_kwargs)
    if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
        for c in pytree.tree_leaves((cpu_args, cpu_kwargs)):
            if id(c) in originals:
                originals[id(c)].copy_(c)
    device = next(
        (
            x.device
            for x in pytree.tree_leaves((args, kwargs))
            if isinstance(x, torch.Tensor) and x.device.type == "tpu"
        ),
        torch.device("tpu", 0),
    )

    def back(x):  # a returned argument (an in-place op's self) is the tpu tensor it was copied from
        if not isinstance(x, torch.Tensor):
            return x
        original = originals.get(id(x))
        return original if original is not None else x.to(device)

    return pytree.tree_map(back, out)


def _to_copy(self, *, non_blocking=False, **kwargs):
    """PyTorch's own _to_copy, except that a non-blocking copy to the CPU does not ask for pinned
    host memory (there is no pinned allocator for tpu; our device-to-host copies complete before
    they return, so the result is the same as CUDA's once synchronised), and that a copy keeping
    device, dtype and layout is a clone. (Registered for tpu: `self` is always a tpu tensor.)"""
    if isinstance(self, UninitializedTensorMixin):
        # a lazy module's placeholder (`LazyConv1d().to("tpu").double()`): its `shape` raises, and the
        # engine keys on shapes; the plain tensor underneath (size 0) converts as the CPU's does
        self = self.as_subclass(torch.Tensor)
    device = kwargs.get("device")
    if device is not None:
        device = torch.device(device)
        if non_blocking and device.type == "cpu":
            non_blocking = False
    dtype, layout = kwargs.get("dtype"), kwargs.get("layout")
    on_device = (
        (device is None or device == self.device)
        and (layout is None or layout == torch.strided)
        and not kwargs.get("pin_memory")
    )
    if on_device and (dtype is None or dtype == self.dtype):
        # `x.to(copy=True)` on its own device is a clone: one executable at most (none for a whole
        # storage), not empty_strided + copy_ into it (which first fills the new storage)
        return _clone(self, memory_format=kwargs.get("memory_format"))
    # only the engine's conversion kernel below says what ran (fastpath.describe)
    forget_last_call()
    memory_format = kwargs.get("memory_format")
    if (
        on_device
        and not (self.is_complex() and not dtype.is_complex)
        and (memory_format is torch.contiguous_format or self.is_contiguous())
    ):
        # `x.to(dtype)` (bfloat16 models' norms do it twice each): one executable that the C++ fast
        # path serves from its second call, not empty_strided + a Python copy_ (~50 µs). (Complex to
        # real keeps PyTorch's path; a non-contiguous tensor's preserved strides too.)
        if memory_format is torch.contiguous_format and not self.is_contiguous():
            # (asked for explicitly: the result is contiguous, whatever `self`'s layout)
            return KERNELS[aten._to_copy.default](self, dtype=dtype, memory_format=memory_format)
        return KERNELS[aten._to_copy.default](self, dtype=dtype)
    return aten._to_copy.default._op_dk(
        DispatchKey.CompositeExplicitAutograd, self, non_blocking=non_blocking, **kwargs
    )


# Meta kernels for ops PyTorch ships without one (the engine needs shapes and dtypes), declared with
# the op's lowering (`missing_meta=`); the meta functions used instead of PyTorch's: build.py
_MISSING_META = declared_facts("missing_meta")


def _register_fake_overrides():
    ops = {
        getattr(getattr(aten, n.partition(".")[0]), n.partition(".")[2] or "default"): fn
        for n, fn in META_OVERRIDES.items()
    }

    def fake_impl(fake_mode, func, *args, **kwargs):
        devices = {a.device for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        if not any(d.type == "tpu" for d in devices):
            return NotImplemented  # other devices keep PyTorch's own rules
        device = next(d for d in devices if d.type == "tpu")
        with fake_impls.in_kernel_invocation_manager(fake_mode):
            out = ops[func](*args, **kwargs)
        return pytree.tree_map_only(
            torch.Tensor, lambda t: fake_mode.fake_tensor_converter.from_meta_and_device(fake_mode, t, device), out
        )

    fake_impls.register_op_impl(lambda func: func in ops)(fake_impl)


def _register_missing_meta():
    for name, fn in _MISSING_META.items():
        name = name.removesuffix(".default")  # the dispatcher names a default overload by its op alone
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
            _lib.impl(name, fn, "Meta")


def _arange_checks(start, end, step):
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if not all(math.isfinite(float(v)) for v in (start, end)):
        raise RuntimeError(f"unsupported range: {start} -> {end}")
    if not ((step > 0 and end >= start) or (step < 0 and end <= start)):
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")


@functools.cache
def _arange_executable(n, jdtype, device_index):
    """One executable per (length, dtype, device): start and step are traced arguments."""
    sharding = jax.sharding.SingleDeviceSharding(platform.jax_device(device_index))
    return tpu_check.jit(
        lambda start, step: factories._arange_values(start, step, n, jdtype),
        f"aten::arange of {n} x {jdtype}",
        out_shardings=sharding,
    )


def _arange(start, end=None, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    """torch.arange on tpu in one executable call: PyTorch's length and values, with start and step
    traced, so a decoding loop's `arange(pos, pos + n)` reuses one executable for every position
    (PyTorch's composite would run empty, resize_ and arange.start_out: ~140 µs instead of ~20)."""
    if end is None:
        start, end = 0, start
    # (generate()'s static cache asks for the same `arange(kv_length)` in every layer at every token:
    # integer calls seen before skip the checks and the length, 8.8 -> 6.3 µs in a tight loop)
    seen = type(start) is int and type(end) is int and type(step) is int and (dtype is None or dtype is torch.int64)
    if seen:
        key = (start, end, step, device, current_device())
        hit = _arange_seen.get(key)
        if hit is not None:
            n, jd, index = hit
            metrics.counters.eager_cache_hits += 1
            return new_tensor((n,), torch.int64, index, _arange_values(n, jd, index, start, step))
    d = (
        dtype
        if dtype is not None
        else (torch.int64 if all(isinstance(v, int) for v in (start, end, step)) else torch.get_default_dtype())
    )
    if d in factories.ARANGE_NO_LOOP:  # the CPU's NotImplementedError (the lowering's fact)
        reject_missing_loop(LOWERINGS["arange.start_step"], (), {"dtype": d})
    _arange_checks(start, end, step)
    jd = dt.to_jax(d)
    n = factories.arange_length(start, end, step, jd)
    if not d.is_floating_point and not all(isinstance(v, int) for v in (start, end, step)):
        # an integer result from float arguments: sized in double, filled with the truncated values
        start, step = int(start), int(step)
    index = torch.device(device).index if device is not None else None
    if index is None:
        index = current_device()
    if seen:
        if len(_arange_seen) >= 256:
            _arange_seen.clear()
        _arange_seen[key] = (n, jd, index)
    metrics.counters.eager_cache_hits += 1
    return new_tensor((n,), d, index, _arange_values(n, jd, index, start, step))


_arange_kept: dict = {}
_arange_seen: dict = {}  # (start, end, step, device, current device) of integer calls -> (length, dtype, index)


def _arange_values(n, jd, index, start, step):
    """The array of arange's values; short ones are kept (immutable; shared like the engine's constant
    results): generate() asks for the same `arange(kv_length)` for every token."""
    if n * jd.itemsize > CONSTANT_BYTES:
        return _arange_executable(n, jd, index)(start, step)
    key = (n, jd, index) + scalar_key((start, step))
    values = _arange_kept.get(key)
    if values is None:
        if len(_arange_kept) >= 256:
            _arange_kept.clear()
        host = _host_arange(n, jd, start, step)
        values = _arange_kept[key] = _from_host(host, None, index)
        if host.dtype.kind == "i":  # (its values known: folds of masks built from it run on the host)
            host_fills.note_known(values, torch.from_numpy(host))
    else:
        metrics.counters.eager_constants_reused += 1
    return values


def _host_arange(n, jd, start, step):
    """A short arange's values computed on the host, in the arithmetic of factories._arange_values
    (PyTorch's): a new length then costs a transfer instead of an XLA compile (~30-100 ms CPU here;
    masks and position ids ask for one per sequence length)."""
    d = np.dtype(jd)
    if d.kind in "iub":
        return (int(start) + np.arange(n, dtype=np.int64) * int(step)).astype(d)
    acc = np.float32 if d.itemsize < 4 else np.float64  # (float16, bfloat16: PyTorch's CPU acc_type)
    with np.errstate(over="ignore"):  # (beyond float16's range: inf, as on the CPU)
        return (acc(start) + np.arange(n, dtype=acc) * acc(step)).astype(d)


def _arange_start_out(start, end, step=1, *, out):
    # size `out` first: the engine keys executables on layouts, and arange's length comes from values
    _arange_checks(start, end, step)
    if out.dtype.is_floating_point or all(isinstance(v, int) for v in (start, end, step)):
        n = factories.arange_length(start, end, step, dt.to_jax(out.dtype))
        if out.numel() != n:
            if out.numel() > 0:  # the CPU's warning: a non-empty `out` of another length (rounding, often)
                argument_checks.warn_at_caller(
                    f"The number of elements in the out tensor of shape {list(out.shape)} is {out.numel()} "
                    f"which does not match the computed number of elements {n}. Note that this may occur "
                    f"as a result of rounding error. The out tensor will be resized to a tensor of shape ({n},)."
                )
            out.resize_((n,))
    return kernel_for(aten.arange.start_out)(start, end, step, out=out)


def _has_compatible_shallow_copy_type(self, other):
    """Whether `self.data = other` may swap storages in place. PyTorch says yes between the CPU and
    CUDA (both "dense" backends) but no for PrivateUse1: `model.to("tpu")` then built new Parameter
    objects, and an optimizer made before the move kept updating the stale CPU ones. Dense tensors on
    "cpu" and "tpu" are as interchangeable as CPU and CUDA ones."""

    def dense(t):
        return t.layout == torch.strided and t.device.type in ("cpu", "tpu") and not t.is_quantized

    return (dense(self) and dense(other)) or (self.device == other.device and self.layout == other.layout)


def register_all():
    global _lib, _fallback_lib
    if _lib is not None:
        return
    _lib = torch.library.Library("aten", "IMPL")
    _fallback_lib = torch.library.Library("_", "IMPL")
    fast = fastpath.load(describe_last_call, OpKernel._run.__name__)
    _register_metadata_ops(fast)
    _impl("empty.memory_format", _empty_memory_format)
    _impl("empty_strided", _empty_strided)
    _impl("resize_", storage_kernels.resize_)
    _impl("set_.source_Storage_storage_offset", storage_kernels.set_storage)
    _impl("set_", storage_kernels.set_empty)
    _impl("copy_", _copy_)
    _impl("_copy_from", _copy_from)
    _impl("_copy_from_and_resize", lambda self, dst: _copy_(dst.resize_(self.shape), self))
    _impl("_local_scalar_dense", _local_scalar_dense)
    _impl("equal", _equal)
    _impl("arange.start_step", _arange)
    # arange.default/.start are CompositeImplicit (they would decompose into empty + resize_ +
    # arange.start_out before the backend sees them): a backend kernel, and one on the Autograd key
    # for calls that carry it, take the fast path instead
    for name in ("arange", "arange.start"):
        _impl(name, _arange)
        _lib.impl(name, _arange, "AutogradPrivateUse1")
    _impl("arange.start_out", _arange_start_out)
    for key in ("PrivateUse1", "AutogradPrivateUse1"):
        _lib.impl("_has_compatible_shallow_copy_type", _has_compatible_shallow_copy_type, key)
    _lib.impl("max_pool1d", _max_pool1d, "AutogradPrivateUse1")
    _impl("_compute_linear_combination", _compute_linear_combination)
    _impl("_compute_linear_combination.out", _compute_linear_combination_out)
    _register_missing_meta()
    _register_fake_overrides()
    _register_engine_kernels(fast)
    _fallback_lib.fallback(_fallback, "PrivateUse1")
    for key in ("SparsePrivateUse1", "SparseCsrPrivateUse1"):
        if hasattr(DispatchKey, key):
            _fallback_lib.fallback(_sparse_fallback, key)
    if hasattr(DispatchKey, "NestedTensorPrivateUse1"):
        _fallback_lib.fallback(_nested_fallback, "NestedTensorPrivateUse1")


def _max_pool1d(x, *args, **kwargs):
    """The composite max_pool1d, after the CPU's dtype check (ops/pooling.py)."""
    pooling.max_pool1d_dtype_check(x)
    return aten.max_pool1d.default.decompose(x, *args, **kwargs)


def _compute_linear_combination(input, coefficients):
    """matrix_exp's helper (ATen's, for the CPU and CUDA): out[i] = sum_j coefficients[i, j] input[j],
    in the input's dtype."""
    out = input.new_zeros((coefficients.shape[0], *input.shape[1:]))
    return _compute_linear_combination_out(input, coefficients, out)


def _compute_linear_combination_out(input, coefficients, out):
    """Its out= variant adds the combination into `out`, as ATen's does (not a plain out= write,
    which the engine's functional twins give)."""
    if input.dim() == 0 or input.numel() == 0:
        raise RuntimeError("Empty tensor not supported")
    m, n = coefficients.shape[0], input.shape[0]
    terms = coefficients.reshape(m, n, *([1] * (input.dim() - 1))) * input.unsqueeze(0)
    return out.add_(terms.sum(1))


def _register_metadata_ops(fast):
    """View-like ops: the CPU kernel sets sizes, strides and offset over the shared storage (in C++
    where the fast path is loaded)."""
    for name in _METADATA_OPS:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet, None), overload or "default", None)
        if op is not None:
            if fast and fastpath.attach_metadata(op):
                _note_registered(name)
            elif name in _COMPOSITE_METADATA_OPS:
                pass  # PyTorch's own C++ kernel: a Python kernel's result keeps its Python object, and
                # `as_subclass` (every tensor subclass's `.to("tpu")`) then refuses to re-type it
            else:
                _impl(name, _redispatch_to_cpu(op))


def _errors_on_host(kernel, api_name):
    """A linalg `_ex` op whose `check_errors=True` raises at the op (ops/linalg_decompositions.py
    CHECK_ERRORS_ON_HOST): the op unchecked, then `_linalg_check_errors` on its `info`."""
    check = torch.ops.aten._linalg_check_errors.default

    def call(*args, check_errors=False, **kwargs):
        results = kernel(*args, **kwargs)
        if check_errors:
            check(results[-1], api_name, is_matrix=args[0].dim() == 2)
        return results

    return call


def _cholesky_checked_on_host():
    """The deprecated torch.cholesky always checks: as linalg.cholesky, the factor unchecked, then
    `_linalg_check_errors` on its `info` (raised at the op, in the CPU's words)."""
    check = torch.ops.aten._linalg_check_errors.default
    cholesky_ex = torch.ops.aten.linalg_cholesky_ex.default

    def call(a, upper=False):
        factor, info = cholesky_ex(a, upper=upper)
        check(info, "cholesky", is_matrix=a.dim() == 2)
        return factor

    return call


def _register_engine_kernels(fast):
    """The engine's OpKernel for every lowered overload, behind the C++ fast path's kernel where
    the overload is eligible (the engine's on PrivateUse3, the C++ one on PrivateUse1)."""
    deferred = []  # (op, kernel): the engine's kernel on PrivateUse3, the C++ fast path's on PrivateUse1
    manual = {"copy_", "resize_", "equal", "_local_scalar_dense", "clone", "_to_copy"}
    for op in _all_overloads():
        name = op_name(op)
        if name.split(".")[0] in manual or name in ("arange.start_step", "arange.start_out") or not _lowered(op):
            continue
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
            if name in _COMPOSITE_IN_EAGER:  # taken whole, before the Autograd key decomposes it
                kernel = kernel_for(op)
                resolve = data_dependent.RESOLVED_COMPOSITES.get(name)
                whole = _whole_composite(op, argument_checks.wrap(name, resolve(kernel) if resolve else kernel))
                _impl(op, whole)
                _lib.impl(op, whole, "AutogradPrivateUse1")
            continue  # decomposes before reaching the backend
        kernel = plain = kernel_for(op)
        if name in data_dependent.MASK_ARGUMENT_OPS:  # boolean masks become indices first
            kernel = data_dependent.with_masks(kernel, data_dependent.MASK_ARGUMENT_OPS[name], name)
        check = argument_checks.CHECKS.get(name)  # host checks of Scalar arguments (pow, fill)
        if check is not None and kernel is plain:
            plain.host_check = check  # the engine runs it (and knows when it cannot raise)
        else:
            kernel = argument_checks.wrap(name, kernel)
        api_name = CHECK_ERRORS_ON_HOST.get(name)
        if api_name is not None:
            kernel = _errors_on_host(kernel, api_name)
        elif name == "cholesky.default":
            kernel = _cholesky_checked_on_host()
        if fast and kernel is plain and fastpath.eligible(op, kernel):
            deferred.append((op, kernel))
        else:
            _impl(op, kernel)
    data_dependent.register(_impl)
    attention.register()
    kernel_for(aten.stack.default).split_call = _stack_first_call
    kernel_for(aten.cat.default).split_call = _cat_first_call
    kernel_for(aten.index_select.default).split_call = growing.serve_index_select
    kernel_for(aten._to_copy.default).split_call = growing.serve_to_copy
    kernel_for(aten.sum.default).split_call = growing.serve_sum
    for op, serve in ((aten.fill_.Scalar, host_fills.fill), (aten.zero_.default, host_fills.zero)):
        kernel_for(op).split_call = serve
    kernel_for(aten.full.default).split_call = host_fills.full
    for op in (aten.eye.default, aten.eye.m):
        kernel_for(op).split_call = host_fills.eye
    kernel_for(aten.addbmm_.default).split_call = _addbmm_into_broadcast_self
    for name in host_fills.FOLDED:
        packet, _, overload = name.partition(".")
        kernel_for(getattr(getattr(aten, packet), overload)).split_call = host_fills.fold
    for op, kernel in deferred:
        if op in _registered or op_name(op) in _registered:  # a later registration took the overload over
            continue
        _lib.impl(op, kernel, "PrivateUse3")
        if not fastpath.attach(op, kernel):
            _impl(op, kernel)
    # copy_ between tpu tensors goes through the engine (fused view read/write and cast)
    KERNELS[aten.copy_.default] = OpKernel(aten.copy_.default)
    # clone: _clone shares a whole storage's buffer and otherwise runs the engine's kernel, whose
    # calls the C++ fast path then serves (generate() clones a slice of its token ids every step);
    # _to_copy likewise sends an on-device conversion to the engine's kernel (bfloat16 models
    # convert twice per norm)
    for op, python_kernel in ((aten.clone.default, _clone), (aten._to_copy.default, _to_copy)):
        engine_kernel = kernel_for(op)
        if fast and fastpath.eligible(op, engine_kernel):
            _lib.impl(op, python_kernel, "PrivateUse3")
            if fastpath.attach(op, engine_kernel):
                continue
        _impl(op, python_kernel)
