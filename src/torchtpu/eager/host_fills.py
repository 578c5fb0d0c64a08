"""Small fills of a new shape served from the host: `torch.full`, `torch.eye`, `fill_` and `zero_` of a whole small
storage (so `torch.ones`/`zeros`/`full_like`/`new_zeros`, which PyTorch builds from `empty` and one
of these) put a host-made array on the device instead of compiling an executable for the shape.

Such a fill's result depends on the shape, dtype and value only, never on the old contents, so the
array PyTorch's CPU kernel makes (its conversion of the value: 2.7 into int64, -0.0, NaN) is exactly
the device's. A first call otherwise compiles one XLA program per shape, ~25-40 ms of CPU on
XLA:CPU, where the host array costs ~20 us: processors and stopping criteria make tensors of a new
shape per call, and `MaxTimeCriteria(0.1)` counted those compiles. A fill that keeps recurring
(HOST_CALLS per shape and dtype) gets its executable as before, so loops keep the C++ fast path and
the fused segments; a large fill never comes here (HOST_BYTES: a host array and a transfer per call).

Such an array stays known to be uniform (one value) while a storage holds it, so the first calls of
a few exact elementwise ops whose tensor inputs are all such fills (`torch.ones(n) / n`, the
`is_done | verdict` of two `torch.full` verdicts) run on the host too (`fold`): the CPU's kernel on
broadcast 0-d stand-ins, its result a new uniform fill. Only ops whose XLA:CPU result is the
CPU's bit for bit (integer and bool ops, comparisons, IEEE add/sub/mul/div) are folded.

Other small host-made integer arrays are known too (`note_known`: a short `arange`'s values), and
folds of them keep their values known: the mask Transformers builds per decode step from host
shapes (`arange(kv_length) + offset`, `kv_idx <= q_idx`, `ones & causal`) runs on the host instead
of a program per key length. Only integer and bool values (no float rounding or subnormals to match).
"""

from __future__ import annotations

import collections
import math
import weakref

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
# id(array) -> (weak reference to the array, its value as a 0-d CPU tensor): the host-made arrays,
# each uniform; a storage holds one while its buffer is that very array (writes replace buffers)
_uniform: dict = {}


def _take(name, shape, dtype, value) -> bool:
    """Whether this fill (a value of `_NUMBERS`; None: a fold's result) goes through the host (and
    count it)."""
    if value is not None and type(value) not in _NUMBERS:
        return False
    if not 0 < math.prod(shape) * dtype.itemsize <= HOST_BYTES:
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
    return _put(host, index, torch.full((), value, dtype=dtype))


def _put(host, index, value):
    """The device array of `host`, noted as uniform with the 0-d CPU tensor `value`."""
    metrics.counters.h2d_bytes += host.nbytes
    metrics.counters.h2d_transfers += 1
    array = platform.put(host, index)
    key = id(array)
    _uniform[key] = (weakref.ref(array, lambda _, key=key: _uniform.pop(key, None)), value)
    return array


def note_known(array, value):
    """Note the device `array` (host-made) as holding the values of the CPU tensor `value` (integer
    or bool, `array`'s elements in order): folds of tensors over it run on the host."""
    if value.dtype.is_floating_point or value.dtype.is_complex or value.numel() * value.itemsize > HOST_BYTES:
        return
    key = id(array)
    _uniform[key] = (weakref.ref(array, lambda _, key=key: _uniform.pop(key, None)), value)


def _uniform_value(t):
    """The CPU tensor of `t`'s values when `t` is all of a storage holding a host-made array of known
    values: 0-d for a fill (one value), else `t`'s shape."""
    r = RECORDS.get(t.untyped_storage().data_ptr())
    if r is None or not covers(t, r):
        return None
    buffer = r._buffer
    known = _uniform.get(id(buffer))
    if known is None or known[0]() is not buffer:
        return None
    value = known[1]
    if value.dim() == 0:
        return value
    return value.reshape(t.shape) if value.numel() == t.numel() else None


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


def eye(kernel, args, kwargs):
    """`torch.eye(n[, m], dtype=..., device=...)` of a small shape: a new tensor over the CPU kernel's
    array (ones on the diagonal: exact in every dtype), instead of a program per (n, m) and dtype."""
    if not 1 <= len(args) <= 2 or kwargs.keys() - {"dtype", "layout", "device", "pin_memory"}:
        return None
    if kwargs.get("layout") not in (None, torch.strided) or kwargs.get("pin_memory"):
        return None
    if any(type(a) is not int or a < 0 for a in args):  # (bad sizes: the engine's path raises the CPU's error)
        return None
    device = kwargs.get("device")
    index = current_device() if device is None or device.index is None else device.index
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    shape = (args[0], args[-1])
    if not _take(kernel.name, shape, dtype, None):
        return None
    try:
        host = dt.numpy_from_cpu(torch.eye(*args, dtype=dtype))
    except (TypeError, RuntimeError):  # a dtype without a numpy carrier: the engine's path
        return None
    metrics.counters.h2d_bytes += host.nbytes
    metrics.counters.h2d_transfers += 1
    return new_tensor(shape, dtype, index, platform.put(host, index))


def _plain(value) -> bool:
    """Whether a value (0-d: a fill's) is neither complex nor a subnormal float (known arrays: integer
    or bool only)."""
    if value.dtype.is_complex or (value.dim() and value.dtype.is_floating_point):
        return False
    if not value.dtype.is_floating_point:
        return True
    magnitude = abs(float(value))
    return not 0 < magnitude < torch.finfo(value.dtype).tiny


# Elementwise ops whose XLA:CPU results equal the CPU kernel's bit for bit (no transcendental ops;
# complex products and subnormal floats, which XLA:CPU flushes to zero, are not folded)
FOLDED = (
    "add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor",
    "bitwise_or.Tensor", "bitwise_and.Tensor", "bitwise_xor.Tensor",
    "logical_or.default", "logical_and.default", "logical_xor.default", "logical_not.default",
    "eq.Tensor", "ne.Tensor", "lt.Tensor", "le.Tensor", "gt.Tensor", "ge.Tensor",
    "eq.Scalar", "ne.Scalar", "lt.Scalar", "le.Scalar", "gt.Scalar", "ge.Scalar",
)  # fmt: skip


def fold(kernel, args, kwargs):
    """A first call of a FOLDED op whose tpu tensors all hold known host-made values: the CPU kernel's
    result on stand-ins of their values (a fill's 0-d value broadcast to its shape; its promotion,
    wrapped numbers and errors are the CPU's), put on the device as a new known array (a uniform
    fill where every input was one); None otherwise (the engine's path)."""
    index, stand_ins, uniform = None, [], True
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type == "tpu":
            value = _uniform_value(a)
            if value is None or not _plain(value):
                return None
            index = a.device.index if a.device.index is not None else current_device()
            uniform = uniform and value.dim() == 0
            a = value.expand(a.shape)
        stand_ins.append(a)
    if index is None or any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return None
    try:  # (torch's function, not the overload: a Python number in a Tensor slot is a wrapped number)
        result = getattr(torch, kernel.name.partition(".")[0])(*stand_ins, **kwargs)
    except (RuntimeError, TypeError, ValueError, ZeroDivisionError):
        return None  # the engine's path raises its own error
    if result.numel() == 0 or result.dtype.is_complex:
        return None
    shape = tuple(result.shape)
    value = result.reshape(-1)[0].clone() if uniform else result.contiguous()
    tiny = torch.finfo(result.dtype).tiny if result.dtype.is_floating_point else 0
    if not _plain(value) or any(0 < abs(a) < tiny for a in args if type(a) is float):
        return None
    if not _take(kernel.name, shape, result.dtype, None):
        return None
    try:
        host = dt.numpy_from_cpu(result.contiguous())
    except (TypeError, RuntimeError):
        return None
    return new_tensor(shape, result.dtype, index, _put(host, index, value))
