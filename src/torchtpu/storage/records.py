"""One record per PyTorch storage on "tpu": its JAX buffer, element dtype, size and device.

A tpu storage is an ordinary PyTorch storage whose data pointer is an address we invent and never
dereference. Addresses come from a bump counter and are never reused, so an address names one
storage forever and the record is found from any tensor with `untyped_storage().data_ptr()`.
The buffer is a JAX array holding the storage's elements in memory order, or None until something is
written (so `torch.empty(<huge>)` costs no device memory). Its shape is the record's `shape`, fixed
when the storage is made: the shape of the tensor the storage was made for (in memory order), so that
on a TPU, where an array's layout is tiled, an op on a whole tensor reads the array as it is instead of
reshaping a flat buffer (a copy there). A storage made from bytes (`torch.UntypedStorage`) is flat.
PyTorch keeps a storage's Python object alive as
long as the storage lives, so a weak reference to it tells us exactly when PyTorch frees it.
"""

from __future__ import annotations

import math
import sys
import weakref

import torch
from torch._C import DispatchKey, DispatchKeySet

from ..device import native

CPU_KEYS = DispatchKeySet(DispatchKey.CPU)
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset
_redispatch_set = _set_storage._handle.redispatch_boxed
_alias = torch.ops.aten.alias.default
_create_empty = torch._C._acc.create_empty_tensor
_make_storage = torch._C._construct_storage_from_data_pointer

# the spacing of the storage addresses torchtpu invents: a guard page after each storage (the C++
# fast path makes addresses with the same spacing: eager/fastpath.py FastPathTable)
PAGE_BYTES = 4096


class Placeholder:
    """A buffer that a higher layer will produce (the "fused" eager mode's queued results:
    eager/fusion.py): `get()` produces it. The storage layer knows nothing more of it."""

    __slots__ = ()

    def get(self):
        raise NotImplementedError

    def computing(self):
        """An array the value is computed from, which a wait on the device can wait for without
        producing the value (eager/growing.py Room), or None: `get()` it."""
        return None

    def failed(self):
        """Whether producing it failed (that error was raised then): `get()` raises, and nothing is
        left to wait for."""
        return False


class StorageRecord:
    __slots__ = ("__weakref__", "_buffer", "device_index", "dtype", "nbytes", "numel", "oom", "ref", "shape")

    def __init__(self, dtype, numel, nbytes, device_index, buffer, shape=None):
        # jax.Array of shape `shape` (`numel` elements of torch dtype `dtype`), or None; or a
        # Placeholder, which reading `buffer` turns into the array
        self._buffer = buffer
        self.shape = (numel,) if shape is None else shape
        self.dtype = dtype  # torch dtype of the elements the buffer holds
        self.numel = numel
        self.nbytes = nbytes
        self.device_index = device_index
        self.ref = None
        self.oom = False  # its first write failed for lack of memory (MemoryStats.failed)

    @property
    def buffer(self):
        b = self._buffer
        if isinstance(b, Placeholder):
            b = self._buffer = b.get()
        return b

    @buffer.setter
    def buffer(self, value):
        self._buffer = value


class _StorageRef(weakref.ref):
    __slots__ = ("address",)


RECORDS: dict[int, StorageRecord] = {}


class MemoryStats:
    """Per-device counters in the names CUDA's `memory_stats()` uses.

    A storage counts as allocated from its creation, as on CUDA, though it holds device memory only
    from its first write (`materialized`). If that first write fails for lack of memory, the storage
    is an allocation that failed, which CUDA would never have counted: it leaves the peak (the peak
    falls back to the larger of the peak of materialized bytes and the old peak less its size) and
    stays out of it (`failed`) until it is freed or a later write succeeds."""

    __slots__ = ("allocated", "failed", "materialized", "num_alloc", "num_free", "peak", "peak_materialized")

    def __init__(self):
        self.allocated = self.peak = self.num_alloc = self.num_free = self.materialized = 0
        self.peak_materialized = self.failed = 0


_stats: dict[int, MemoryStats] = {}
_bump = [1 << 40]


def stats(device_index: int) -> MemoryStats:
    s = _stats.get(device_index)
    if s is None:
        s = _stats[device_index] = MemoryStats()
    return s


def _on_free(ref):
    free_storage(ref.address)


def free_storage(address):
    """The storage at `address` is gone: drop its record and count the bytes as freed."""
    record = RECORDS.pop(address, None)
    if record is not None:
        s = _stats[record.device_index]
        s.allocated -= record.nbytes
        s.num_free += 1
        if record._buffer is not None:
            s.materialized -= record.nbytes
        elif record.oom:
            s.failed -= record.nbytes


_seeds: dict[int, torch.Tensor] = {}


def _shell(dtype, device_index):
    """A fresh TensorImpl on the PrivateUse1 key for `tpu:device_index`, not yet on any storage."""
    if device_index == 0:
        return _create_empty([0], dtype)
    seed = _seeds.get(device_index)
    if seed is None:
        seed = _seeds[device_index] = _seed_tensor(device_index)
    t = _alias.redispatch(CPU_KEYS, seed)
    return t.view(dtype) if dtype != seed.dtype else t


def _seed_tensor(device_index):
    # create_empty_tensor only makes tpu:0 tensors; DLPack's "extension device" maps to PrivateUse1
    # with the index we give, which yields a tpu:i tensor to alias for every later tpu:i tensor.
    from . import dlpack_seed

    return dlpack_seed.make(device_index)


def new_tensor(shape, dtype, device_index=0, buffer=None, stride=None, form=None):
    """A plain torch.Tensor on tpu:device_index over a new storage holding `buffer`: the tensor's
    elements in memory order, as an array of any shape (see `storage_shape`). `form`: the shape of
    a Placeholder `buffer`'s array where it is not `storage_shape(shape, stride)`."""
    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    # Non-overlapping ranges with a guard page, so PyTorch's overlap checks on data_ptr stay valid.
    address = _fresh_address(nbytes)
    fresh = _make_storage(address, _DEVICES.get(device_index) or _device(device_index), nbytes)
    # (create_empty_tensor gives a dimension before a zero-size one stride 0, PyTorch's contiguous
    # strides count a zero-size dimension as 1: those take the slow path; so do dense layouts whose
    # size-1 dimensions have other strides, which PyTorch keeps: empty_like of a (4, 1, 3) slice)
    if device_index == 0 and numel and (stride is None or list(stride) == contiguous_strides(shape)):
        # Fast path (the engine's outputs): create_empty_tensor already has the sizes and
        # contiguous strides; give its storage our address and size instead of a `set_`.
        t = _create_empty(shape, dtype)
        storage = t.untyped_storage()
        storage._swap_data_ptr_(fresh)
    else:
        t = _create_empty([0], dtype) if device_index == 0 else _shell(dtype, device_index)
        storage = fresh
        _redispatch_set(CPU_KEYS, t, storage, 0, shape, stride if stride is not None else contiguous_strides(shape))
    if buffer is not None and not isinstance(buffer, Placeholder):
        form = buffer.shape
    elif form is None:
        form = storage_shape(shape, stride)
    record = StorageRecord(dtype, numel, nbytes, device_index, buffer, form)
    ref = _StorageRef(storage, _on_free)
    ref.address = address
    record.ref = ref
    RECORDS[address] = record
    s = _stats.get(device_index) or stats(device_index)
    s.allocated += nbytes
    s.num_alloc += 1
    if s.allocated - s.failed > s.peak:
        s.peak = s.allocated - s.failed
    if buffer is not None:
        s.materialized += nbytes
        if s.materialized > s.peak_materialized:
            s.peak_materialized = s.materialized
    return t


def new_tensor_with_room(shape, stride, dtype, device_index, buffer):
    """A tensor of `shape`/`stride` at offset 0 of a new storage holding the array `buffer`, which may
    hold more elements than the tensor (room for the tensor to grow into: eager/growing.py)."""
    t = new_tensor(buffer.shape, dtype, device_index, buffer)
    if tuple(shape) != tuple(buffer.shape) or list(stride) != list(t.stride()):
        _redispatch_set(CPU_KEYS, t, t.untyped_storage(), 0, list(shape), list(stride))
    return t


def memory_order(shape, stride):
    """The dimensions of a tensor from outermost to innermost in memory (ties, which only size-1 and
    size-0 dimensions can have in a dense layout, in index order)."""
    return tuple(sorted(range(len(shape)), key=lambda d: -stride[d]))


def storage_shape(shape, stride=None):
    """The shape of the array a new storage for a tensor of `shape`/`stride` holds: the tensor's shape
    in memory order (a permuted dense layout, e.g. channels_last, gives the permuted shape), or flat
    when the layout has gaps or overlaps."""
    shape = tuple(shape)
    if stride is None or is_dense(shape, stride):
        return shape
    order = memory_order(shape, stride)
    permuted = tuple(shape[d] for d in order)
    if is_dense(permuted, tuple(stride[d] for d in order)):
        return permuted
    return (math.prod(shape),)


def is_dense(shape, stride):
    """Whether sizes/strides are the contiguous layout (size-1 dims may have any stride)."""
    expected = 1
    for n, st in zip(reversed(shape), reversed(stride)):
        if n != 1 and st != expected:
            return False
        expected *= n
    return True


_DEVICES: dict[int, torch.device] = {}


def _device(index):
    d = _DEVICES[index] = torch.device("tpu", index)
    return d


def record_of(t: torch.Tensor) -> StorageRecord:
    return RECORDS[t.untyped_storage().data_ptr()]


def covers(t: torch.Tensor, record: StorageRecord) -> bool:
    """Whether `t` is all of its storage's elements, in order, in the storage's dtype, with no lazy
    conjugate or negative bit: its values are then exactly the record's buffer."""
    return (
        t.dtype == record.dtype
        and t.storage_offset() == 0
        and t.numel() == record.numel
        and t.is_contiguous()
        and not t.is_conj()
        and not t.is_neg()
    )


def set_buffer(record: StorageRecord, buffer):
    """Give `record` the array `buffer` (the storage's elements in memory order, of any shape): kept in
    the record's shape, which keys executables (a reshape where they differ). A Placeholder must
    produce an array of the record's shape."""
    if not isinstance(buffer, Placeholder) and buffer.shape != record.shape:
        buffer = buffer.reshape(record.shape)
    if record._buffer is None:
        materialize(record)
    record.buffer = buffer


def materialize(record: StorageRecord):
    """Count `record`, which held no buffer, as holding one (the caller gives it the buffer)."""
    s = stats(record.device_index)
    s.materialized += record.nbytes
    if s.materialized > s.peak_materialized:
        s.peak_materialized = s.materialized
    if record.oom:  # an earlier first write failed; this one did not: it counts again
        record.oom = False
        s.failed -= record.nbytes
        if s.allocated - s.failed > s.peak:
            s.peak = s.allocated - s.failed


def allocation_failed(record: StorageRecord):
    """The first write of `record` (no buffer yet) failed for lack of memory: take it out of the peak."""
    s = stats(record.device_index)
    if record._buffer is None and not record.oom:
        record.oom = True
        s.failed += record.nbytes
        s.peak = max(s.peak_materialized, s.peak - record.nbytes, s.allocated - s.failed)


def donatable(buffers, slots):
    """Whether each buffers[s] is held only by its storage record and the `buffers` list (so XLA may
    take it over: eager in-place ops and compiled graphs donate such buffers)."""
    return all(sys.getrefcount(buffers[s]) <= 3 for s in slots)


def live_buffers(device_index=None, computing=False):
    """The buffers of the live storages (of tpu:`device_index`); with `computing`, only those still
    being computed (what an event or a synchronize waits for: most buffers, the weights, were
    computed long ago). One pass: generate()'s per-token stop check records an event every token."""
    buffers = []
    for r in list(RECORDS.values()):
        b = r._buffer
        if b is None or (device_index is not None and r.device_index != device_index):
            continue
        if isinstance(b, Placeholder):
            if b.failed():  # (a synchronize after a failed or given-up op raises nothing again)
                continue
            # a queued result of the fused mode runs its segment (read once per record); a grown
            # tensor's room is waited for as it is (its exact slice would be a program per length)
            a = b.computing()
            b = r.buffer if a is None else a
        if not computing or not b.is_ready():
            buffers.append(b)
    return buffers


def contiguous_strides(shape):
    strides = []
    acc = 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d if d > 1 else 1
    strides.reverse()
    return strides


def allocate_storage(nbytes):
    """A storage PyTorch makes itself through the PrivateUse1 allocator (`torch.UntypedStorage(8,
    device="tpu")`): a fresh address and its record (bytes, no buffer until written), on the current
    device; (address, device index). free_storage drops it when PyTorch frees the storage."""
    from ..device.state import current_device

    index = current_device()
    address = _fresh_address(nbytes)
    RECORDS[address] = StorageRecord(torch.uint8, nbytes, nbytes, index, None)
    s = stats(index)
    s.allocated += nbytes
    s.num_alloc += 1
    if s.allocated - s.failed > s.peak:
        s.peak = s.allocated - s.failed
    return address, index


def _fresh_address(nbytes):
    address = _bump[0]
    _bump[0] = address + ((nbytes + 2 * PAGE_BYTES - 1) // PAGE_BYTES) * PAGE_BYTES
    return address


def resize_storage(address, nbytes):
    """PyTorch resizes the storage at `address` to `nbytes` bytes (`storage.resize_(n)`, a tensor's
    resize_ growing its storage: device/csrc/tpu_hooks.cpp resizePrivateUse1Bytes). As CUDA reallocates,
    the record moves to a fresh address (a grown storage would overlap the next one's range) and keeps
    the old elements in front; new elements read as zeros (CUDA leaves them uninitialised). The record
    keeps its element dtype: a size that is not a whole number of elements keeps the last, partial one
    (every view of the storage lies inside `nbytes`, PyTorch checks). Returns the new address."""
    record = RECORDS.get(address)
    if record is None:
        raise RuntimeError(f"torchtpu: no tpu storage at address {address:#x} to resize")
    if nbytes == record.nbytes:
        return address
    numel = -(-nbytes // record.dtype.itemsize)
    s = stats(record.device_index)
    buffer = record.buffer  # (a queued result of the fused mode is computed first)
    if buffer is not None:
        flat = buffer.reshape(-1)
        if numel == 0:
            buffer = None  # nothing left to hold: the device memory goes now (FSDP2's resize_(0))
        elif numel <= flat.shape[0]:
            buffer = flat[:numel]
        else:
            import jax.numpy as jnp

            buffer = jnp.pad(flat, (0, numel - flat.shape[0]))
        s.materialized += (nbytes if buffer is not None else 0) - record.nbytes
    new = _fresh_address(nbytes)
    del RECORDS[address]  # (the old data pointer's deleter, when it has one, then finds nothing)
    s.allocated += nbytes - record.nbytes
    record._buffer, record.numel, record.nbytes, record.shape = buffer, numel, nbytes, (numel,)
    if record.ref is not None:
        record.ref.address = new
    RECORDS[new] = record
    if s.allocated - s.failed > s.peak:
        s.peak = s.allocated - s.failed
    if s.materialized > s.peak_materialized:
        s.peak_materialized = s.materialized
    return new


native.set_storage_callbacks(allocate_storage, free_storage, resize_storage)
