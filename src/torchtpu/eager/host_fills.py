"""Small fills of a new shape served from the host: `torch.full`, `fill_` and `zero_` of a whole small
storage (so `torch.ones`/`zeros`/`full_like`/`new_zeros`, which PyTorch builds from `empty` and one
of these) put a host-made array on the device instead of compiling an executable for the shape.

Such a fill's result depends on the shape, dtype and value only, never on the old contents, so the
array PyTorch's CPU kernel makes (its conversion of the value: 2.7 into int64, -0.0, NaN) is exactly
the device's. A first call otherwise compiles one XLA program per shape, ~25-40 ms of CPU on
XLA:CPU, where the host array costs ~20 us: processors and stopping criteria make tensors of a new
shape per call, and `MaxTimeCriteria(0.1)` counted those compiles. A fill that keeps recurring
(HOST_CALLS per shape and dtype) gets its executable as before, so loops keep the C++ fast path and
the fused segments; a large fill never comes here (HOST_BYTES: a host array and a transfer per call).
"""

from __future__ import annotations

import collections
import math

import torch

from .. import metrics
from ..device import platform
from ..device.state import current_device
from ..ops import dtypes as dt
from ..storage.records import RECORDS, covers, new_tensor, set_buffer
from . import asserts

HOST_BYTES = 64 << 10
HOST_CALLS = 64
_served: collections.Counter = collections.Counter()
_NUMBERS = (bool, int, float)


def _take(name, shape, dtype, value) -> bool:
    """Whether this fill goes through the host (and count it)."""
    if type(value) not in _NUMBERS or not 0 < math.prod(shape) * dtype.itemsize <= HOST_BYTES:
        return False
    key = (name, shape, dtype, type(value))
    if _served[key] >= HOST_CALLS:
        return False
    _served[key] += 1
    return True


def _array(shape, dtype, value, index):
    try:
        host = dt.numpy_from_cpu(torch.full(shape, value, dtype=dtype))
    except (TypeError, RuntimeError):  # a dtype without a numpy carrier: the engine's path
        return None
    metrics.counters.h2d_bytes += host.nbytes
    metrics.counters.h2d_transfers += 1
    return platform.put(host, index)


def _fill_whole(kernel, self, value):
    """`self.fill_(value)` when `self` is all of a small storage (not while writes are gated by
    unchecked device-side asserts: eager/asserts.py); None otherwise."""
    r = RECORDS.get(self.untyped_storage().data_ptr())
    if r is None or not covers(self, r) or (r._buffer is not None and asserts.gating()):
        return None
    shape = tuple(self.shape)
    if not _take(kernel.name, shape, self.dtype, value):
        return None
    array = _array(r.shape, self.dtype, value, r.device_index)
    if array is None:
        return None
    # (a buffer still queued in a fused segment is replaced: arrays are immutable, the queued ops
    # read theirs, and the segment writes only records that still hold its Pending: eager/fusion.py)
    set_buffer(r, array)
    return self


# (the engine has run the kernel's host check of the value, its overflow error, before the lookup)
def fill(kernel, args, kwargs):
    if len(args) != 2 or kwargs:
        return None
    return _fill_whole(kernel, args[0], args[1])


def zero(kernel, args, kwargs):
    if len(args) != 1 or kwargs:
        return None
    return _fill_whole(kernel, args[0], 0)


def full(kernel, args, kwargs):
    """`torch.full(size, value, dtype=..., device=...)` of a small shape: a new tensor over a host array."""
    if len(args) != 2 or kwargs.keys() - {"dtype", "layout", "device", "pin_memory"}:
        return None
    size, value = args
    if kwargs.get("layout") not in (None, torch.strided) or kwargs.get("pin_memory"):
        return None
    device = kwargs.get("device")
    index = current_device() if device is None or device.index is None else device.index
    dtype = kwargs.get("dtype")
    if dtype is None:  # PyTorch's inference from the value
        dtype = torch.full((), value).dtype if type(value) in _NUMBERS else None
    shape = tuple(size)
    if dtype is None or not _take(kernel.name, shape, dtype, value):
        return None
    array = _array(shape, dtype, value, index)
    return None if array is None else new_tensor(shape, dtype, index, array)
