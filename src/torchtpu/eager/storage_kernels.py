"""The kernels that change how many bytes a tensor's storage holds: `resize_`, and `set_` onto a
storage too small for the view asked for. As on CUDA the storage itself grows (every tensor over it
sees the new bytes, the old ones in front): `UntypedStorage.resize_` through PyTorch's PrivateUse1
hook (device/csrc/tpu_hooks.cpp, storage/records.py resize_storage). Without the C++ extension
there is no hook: `resize_` then moves the tensor alone onto a new storage holding its old elements."""

from __future__ import annotations

import math

import jax
import torch
from torch._C import DispatchKey, DispatchKeySet

from ..device import native
from ..storage import slices
from ..storage.records import contiguous_strides, new_tensor, record_of, set_buffer

aten = torch.ops.aten
CPU_KEYS = DispatchKeySet(DispatchKey.CPU)
_set = aten.set_.source_Storage_storage_offset


def resize_(self, size, memory_format=None):
    size = tuple(size)
    if any(n < 0 for n in size):
        raise RuntimeError(
            "numel: integer multiplication overflow"
            if len(size) == 1
            else f"Trying to create tensor with negative dimension {min(size)}: {list(size)}"
        )
    if memory_format is torch.preserve_format:
        raise RuntimeError("Unsupported memory formatPreserve")
    storage = self.untyped_storage()
    needed = (math.prod(size) + self.storage_offset()) * self.element_size() if math.prod(size) else 0
    if needed > storage.nbytes():
        if native.resizes_storages():  # PyTorch's storage resize reaches our hook
            storage.resize_(needed)
        else:
            storage = _moved_to_new_storage(self, needed)
    if size != tuple(self.shape):  # the same sizes keep their strides (a transposed tensor stays so)
        _set.redispatch(CPU_KEYS, self, storage, self.storage_offset(), size, contiguous_strides(size))
    if memory_format is not None:  # restrides even at the same sizes, as PyTorch's empty_tensor_restride
        st = torch.empty(size, device="meta").contiguous(memory_format=memory_format).stride()
        _set.redispatch(CPU_KEYS, self, storage, self.storage_offset(), size, st)
    return self


def _moved_to_new_storage(self, needed):
    """A new storage of `needed` bytes holding the old one's elements in front, `self` set onto it."""
    r = record_of(self)
    fresh = new_tensor((needed // self.element_size(),), self.dtype, r.device_index)
    if r.buffer is not None and r.dtype == self.dtype:
        old = r.buffer.reshape(-1)[: fresh.numel()]
        set_buffer(record_of(fresh), jax.numpy.pad(old, (0, fresh.numel() - old.size)))
    storage = fresh.untyped_storage()
    _set.redispatch(CPU_KEYS, self, storage, self.storage_offset(), tuple(self.shape), tuple(self.stride()))
    return storage


def set_storage(self, source, storage_offset=0, size=(), stride=()):
    """`set_(storage, offset, size, stride)`: PyTorch's CPU kernel sets the metadata, but where the
    view reaches past the storage's end it would grow the storage with the CPU allocator (a segfault
    on an address torchtpu invented). The storage is grown here first, as CUDA's kernel does."""
    needed = _bytes_needed(self, source, storage_offset, size, stride)
    if needed > source.nbytes():
        source.resize_(needed)
    inside = slices.origin(source)
    if inside is not None:
        source, storage_offset = _onto_parent(self, source, storage_offset, *inside)
    return _set.redispatch(CPU_KEYS, self, source, storage_offset, size, stride)


def _onto_parent(self, source, storage_offset, parent, start):
    """A slice starting inside another storage has no record of its own: the tensor goes onto the
    storage it was cut from, as many bytes further in (storage/slices.py)."""
    if not isinstance(source, torch.UntypedStorage) or source.device != self.device:
        return source, storage_offset  # (PyTorch's kernel raises its own error)
    size = self.element_size()
    if start % size:
        raise NotImplementedError(
            f"torchtpu: a {self.dtype} tensor over a storage slice starting at byte {start} of its storage "
            f"(not a multiple of the element size, {size}) is not supported; slice from a multiple of {size}"
        )
    return parent, storage_offset + start // size


def set_empty(self):
    """`set_()`: the tensor becomes empty, over a new storage of no bytes (as CUDA's kernel)."""
    fresh = new_tensor((0,), self.dtype, self.device.index)
    return _set.redispatch(CPU_KEYS, self, fresh.untyped_storage(), 0, (0,), (1,))


def _bytes_needed(self, source, offset, size, stride):
    """The bytes a view reaches into its storage (PyTorch's computeStorageNbytes), or 0 where the
    arguments are for PyTorch's kernel to reject (it raises its own error)."""
    if not isinstance(source, torch.UntypedStorage) or source.device != self.device:
        return 0
    if len(size) != len(stride) or offset < 0 or any(n < 0 for n in size) or any(s < 0 for s in stride):
        return 0
    if 0 in size:
        return 0
    return (offset + 1 + sum((n - 1) * s for n, s in zip(size, stride))) * self.element_size()
