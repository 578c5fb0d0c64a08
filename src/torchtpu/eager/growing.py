"""Appends to a growing tensor (`torch.cat([grown, new], dim)`) into spare room of a bucketed storage.

Eager decoding grows tensors by one position per step: Transformers' dynamic cache appends each
layer's keys and values (`cat([keys, k], dim=-2)`), `generate()` its token ids and attention mask
(`cat([ids, next[:, None]], dim=-1)`). An executable's key holds every shape, so each new length
was a new XLA program for the cat, and for every op on a view of the grown tensor, since a view's
program takes its storage's whole array (`isin(ids[:, -1], eos)`, `ids[:, -1:].clone()`): ~10
executables per decode step (benchmarks/RESULTS.md, "where peak host RSS goes").

Here an append whose first tensor was itself made by an append (a chain: a single cat keeps its
contiguous result) writes its result into a storage whose array has room along `dim` up to a size
bucket (`capacity`): the result is the first positions of that array. In PyTorch's view only where
every dimension before `dim` has one element: there the view is still contiguous by PyTorch's rules
(size-1 dimensions' strides do not count), as a CUDA cat's result is. With room behind a longer
dimension it would not be (`.view()` would raise, `is_contiguous()` differ), so there (a batch of
token ids, a cache's (B, H, L, D) keys) the tensor and its storage are the exact result's and the
room is in the record only: its buffer is a `Room` (the padded array and the valid length), which
the next append, `index_select` on another dimension (a beam reorder) and attention (eager/attention.py)
read whole at a program per capacity; any other reader gets the exact values (a slice). The next
append to a view, while the room lasts, is one program per bucket that copies the array and writes
the new positions at the traced length
(`lax.dynamic_update_slice`); a view of its last positions is a traced offset into the same array
shape, so ops on it (the stop check's `isin`, the next step's input `clone`) also compile once per
bucket. Only data moves: the values are the exact cat's, bit for bit. Appends are always served
here (no engine entry is kept for their keys, so that each call can see whether its first tensor
has room); anything else (other dtypes, lazy conj/neg bits, more tensors, sizes that do not match)
goes to the engine's cat as before, with its errors.
"""

from __future__ import annotations

import math
import weakref

import jax
import numpy as np
import torch
from jax import lax

from ..metrics import counters
from ..storage.records import RECORDS, Placeholder, contiguous_strides, covers, new_tensor, new_tensor_with_room
from . import fusion, limits, xla_options
from .executable import input_buffers

MIN_LENGTH = 8  # an append in view whose result is shorter along `dim` stays an exact cat (behind: any length)
SMALLEST_ROOM = 16  # positions along `dim`: the smallest bucket
_MAX_KEPT = 256
_programs: dict = {}  # (buffer shape, piece's buffer shape, its shape, axis, size, dtype) -> jitted append
_appended: dict = {}  # storage address -> axis: exact results of an append (a chain's first link)
_room: dict = {}  # storage address -> axis: storages with room along `axis` made here
_slices: dict = {}  # (room's shape, axis, length, dtype) -> jitted exact slice
_serving = [False]  # inside serve_index_select's call of the engine
_masks: dict = {}  # (device index, capacity, length) -> bool (1, 1, 1, capacity) tensor: length positions True
# record -> its Room, kept after a reader took the exact values (the record then holds `room.exact`):
# the next append, a beam reorder and attention still read the room while no write replaced them
_read_rooms: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
limits.FORGETTERS.append(_programs.clear)
limits.FORGETTERS.append(_slices.clear)


class Room(Placeholder):
    """The buffer of a tensor grown behind a longer dimension (`cat` of (B, H, L, D) keys along L):
    `array` holds it in its first `length` positions along `axis` and room after them (zeros). The
    storage and the tensor are those of the exact result (contiguous, `numel` elements), so nothing
    of the room shows to PyTorch; readers that know it (the next append, `index_select` on another
    dimension, attention, a dtype conversion, an integer `sum`) use `array`, at one program per
    capacity; any other reader takes the exact values, sliced once (`get`: a program per length, as
    the exact cat was). The Room stays after that read (`_read_rooms`) until a write replaces the
    record's buffer."""

    __slots__ = ("array", "axis", "exact", "length")

    def __init__(self, array, axis, length):
        self.array, self.axis, self.length, self.exact = array, axis, length, None

    def get(self):
        if self.exact is None:
            a = self.array
            key = (a.shape, self.axis, self.length, a.dtype)
            fn = _slices.get(key)
            if fn is None:
                axis, length = self.axis, self.length
                fn = _slices[key] = jax.jit(lambda x: lax.slice_in_dim(x, 0, length, axis=axis).reshape(-1))
                counters.eager_compiles += 1
                limits.note_executable()
            self.exact = fn(a)
        return self.exact

    def computing(self):
        return self.exact if self.exact is not None else self.array


def room_of(t):
    """The Room of a tensor that is all of a grown storage (a cache's keys as `cat` returned them),
    else None."""
    if type(t) is not torch.Tensor:  # (a FakeTensor of a trace, a subclass: no storage of ours to read)
        return None
    r = RECORDS.get(t.untyped_storage().data_ptr())
    if r is None or t.is_conj() or t.is_neg() or not covers(t, r):
        return None
    return _room_in(r)


def _room_in(record):
    """The Room of a grown storage's record: its buffer, or the Room whose exact values a reader took
    (still the record's buffer: nothing wrote it since), else None."""
    b = record._buffer
    if type(b) is Room:
        return b
    room = _read_rooms.get(record)
    return room if room is not None and b is room.exact else None


def padded(t, room):
    """A tensor over `room`'s whole array (capacity positions along its axis; for a reader that masks
    or drops the positions past its length)."""
    r = RECORDS[t.untyped_storage().data_ptr()]
    return new_tensor(tuple(room.array.shape), t.dtype, r.device_index, room.array)


def with_room(shape, dtype, device_index, array, axis, length):
    """A new exact tensor of `shape` whose buffer is `array` with room along `axis` past `length`. Its
    record is flat (`numel` elements, the form of a storage made from bytes): engine keys hold a
    record's form, so no executable built for an exact tensor of that shape (or for the whole room of
    a smaller capacity) takes a grown one's key, and each op on a grown tensor comes to its first-call
    path (the serving functions here), as appends do."""
    room = Room(array, axis, length)
    t = new_tensor(tuple(shape), dtype, device_index, room, form=(math.prod(shape),))
    _read_rooms[RECORDS[t.untyped_storage().data_ptr()]] = room
    return t


def valid_positions(device, capacity, length):
    """A bool (1, 1, 1, capacity) tensor on `device`, True at the first `length` positions: the mask
    of attention over keys with room (a transfer per length and device, no program)."""
    key = (device.index or 0, capacity, length)
    mask = _masks.get(key)
    if mask is None:
        if len(_masks) >= 16:
            _masks.pop(next(iter(_masks)))
        host = torch.arange(capacity).reshape(1, 1, 1, capacity) < length
        mask = _masks[key] = host.to(device)
    return mask


def bucket(n: int) -> int:
    """Positions along the growing dimension for a result of `n`: the next power of two (at least
    SMALLEST_ROOM), in quarter-octave steps above 64 (at most 25% spare)."""
    if n <= 64:
        return max(SMALLEST_ROOM, 1 << (n - 1).bit_length())
    step = 1 << ((n - 1).bit_length() - 3)
    return -(-n // step) * step


def _remember(table, address, axis):
    if len(table) >= _MAX_KEPT:
        table.pop(next(iter(table)))  # addresses are never reused: a dropped one only loses its room
    table[address] = axis


def _program(buffer_shape, piece_shape, new_shape, axis, size, dtype):
    user = xla_options.ACTIVE[0]  # (sorted (name, value) pairs: the user's options in force)
    key = (buffer_shape, piece_shape, new_shape, axis, size, dtype, user)
    fn = _programs.get(key)
    if fn is None:
        pad = [(0, 0)] * len(buffer_shape)
        pad[axis] = (0, size - buffer_shape[axis])

        def append(grown, piece, length):
            if pad[axis][1]:
                grown = jax.numpy.pad(grown, pad)
            return lax.dynamic_update_slice_in_dim(grown, piece.reshape(new_shape), length, axis)

        # compiled as an eager op's program is (a copy: the small-program options without a reduction)
        fn = _programs[key] = jax.jit(append, compiler_options=xla_options.op_options(dict(user)))
        counters.eager_compiles += 1
        limits.note_executable()
    return fn


def serve_cat(kernel, args, kwargs):
    """`cat([a, b], dim)`'s first call when it appends (b shorter than a along dim): the result, or
    None for the engine's cat."""
    tensors = args[0] if args else kwargs.get("tensors")
    if kwargs.keys() - {"tensors", "dim"} or len(tensors) != 2:
        return None
    a, b = tensors
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dtype != b.dtype:
        return None
    n = a.dim()
    if n == 0 or b.dim() != n or a.dtype == torch.complex32 or a.is_conj() or b.is_conj() or a.is_neg() or b.is_neg():
        return None
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if not isinstance(dim, int) or not -n <= dim < n:
        return None
    d = dim % n
    behind = any(a.shape[i] != 1 for i in range(d))  # room in PyTorch's view would make it non-contiguous
    la, lb = a.shape[d], b.shape[d]
    if not 1 <= lb < la or (la + lb < MIN_LENGTH and not behind) or a.device != b.device:
        return None
    if a.requires_grad or b.requires_grad:
        return None
    if any(a.shape[i] != b.shape[i] for i in range(n) if i != d) or 0 in a.shape:
        return None
    address = a.untyped_storage().data_ptr()
    ra = RECORDS.get(address)
    rb = RECORDS.get(b.untyped_storage().data_ptr())
    if ra is None or rb is None or ra.dtype != a.dtype:
        return None
    total = la + lb
    if behind:
        return _append_behind(a, b, ra, rb, d, address)
    if _room.get(address) == d and _is_prefix(a, ra, d):
        room = ra.shape[d]
        size = room if total <= room else bucket(total)
    elif covers(a, ra) and ra.shape == tuple(a.shape):
        size = bucket(total) if _appended.get(address) == d else total
    else:
        return None
    if not covers(b, rb):
        b = b.clone()  # (one program per layout of the new positions, not per length; a view may be
        # contiguous and still a part of its storage: contiguous() would keep it)
        rb = RECORDS[b.untyped_storage().data_ptr()]
    fusion.run_inputs((ra._buffer, rb._buffer))  # (as the engine's cold cat: no tick of the sync clock)
    grown, piece = input_buffers([ra, rb])
    fn = _program(grown.shape, piece.shape, tuple(b.shape), d, size, grown.dtype)
    out = fn(grown, piece, np.int32(la))
    shape = list(a.shape)
    shape[d] = total
    if size == total:  # an exact result: contiguous, as the engine's cat
        t = new_tensor_with_room(shape, contiguous_strides(shape), a.dtype, ra.device_index, out)
        _remember(_appended, t.untyped_storage().data_ptr(), d)
        return t
    t = new_tensor_with_room(shape, contiguous_strides(out.shape), a.dtype, ra.device_index, out)
    _remember(_room, t.untyped_storage().data_ptr(), d)
    return t


def _is_prefix(a, record, d):
    """Whether `a` is the first positions along `d` of its storage's array (every other dimension whole)."""
    shape = record.shape
    if a.storage_offset() or len(shape) != a.dim() or a.shape[d] > shape[d]:
        return False
    if any(a.shape[i] != shape[i] for i in range(a.dim()) if i != d):
        return False
    return all(s == e or a.shape[i] == 1 for i, (s, e) in enumerate(zip(a.stride(), contiguous_strides(shape))))


def _append_behind(a, b, ra, rb, d, address):
    """An append behind a longer dimension: into the Room of `a`'s buffer (a program per capacity),
    a first link exact (remembered), a second link into a new Room."""
    if not covers(a, ra):
        return None
    la, lb = a.shape[d], b.shape[d]
    total = la + lb
    room = _room_in(ra)
    if room is not None and room.axis == d and room.length == la:
        grown = room.array
        size = grown.shape[d] if total <= grown.shape[d] else bucket(total)
    elif ra.shape != tuple(a.shape):
        return None
    else:
        size = bucket(total) if _appended.get(address) == d else total
        grown = None
    if not covers(b, rb):
        b = b.clone()
        rb = RECORDS[b.untyped_storage().data_ptr()]
    fusion.run_inputs((ra._buffer, rb._buffer))  # (as the engine's cold cat: no tick of the sync clock)
    exact = grown is None and size == total  # a first link
    if grown is None:
        grown, piece = input_buffers([ra, rb])
    else:
        (piece,) = input_buffers([rb])
    fn = _program(grown.shape, piece.shape, tuple(b.shape), d, size, grown.dtype)
    out = fn(grown, piece, np.int32(la))
    shape = list(a.shape)
    shape[d] = total
    if exact:
        t = new_tensor(shape, a.dtype, ra.device_index, out)
        _remember(_appended, t.untyped_storage().data_ptr(), d)
        return t
    return with_room(shape, a.dtype, ra.device_index, out, d, total)


def serve_index_select(kernel, args, kwargs):
    """`index_select(grown, dim, index)` on another dimension than the room's (a beam search's cache
    reorder): the engine's index_select of the whole room (a program per capacity, with its checks and
    errors), the result keeping the room; None for the engine."""
    if kwargs or len(args) != 3:
        return None
    t, dim, index = args
    if not isinstance(t, torch.Tensor) or not isinstance(index, torch.Tensor) or not isinstance(dim, int):
        return None
    if t.requires_grad or index.device != t.device or index.dim() > 1 or t.dim() == 0:
        return None
    if index.dtype not in (torch.int64, torch.int32) or not -t.dim() <= dim < t.dim():
        return None
    if _serving[0]:  # (the engine's own call below, at this same key)
        return None
    room = room_of(t)
    d = dim % t.dim()
    if room is None:  # a reordered first link of a chain: given room here (a program per length, once)
        address = t.untyped_storage().data_ptr()
        axis = _appended.get(address)
        r = RECORDS.get(address)
        if axis is None or axis == d or r is None or not covers(t, r) or r.shape != tuple(t.shape):
            return None
        fusion.run_inputs((r._buffer,))
        (exact,) = input_buffers([r])
        size = bucket(t.shape[axis] + 1)
        fn = _program(exact.shape, (0,) * t.dim(), (0,) * t.dim(), axis, size, exact.dtype)
        room = Room(fn(exact, np.zeros((0,) * t.dim(), exact.dtype), np.int32(0)), axis, t.shape[axis])
    if d == room.axis:
        return None
    shape = list(t.shape)
    shape[d] = index.numel()
    return _keeping(room, shape, _engine(kernel, padded(t, room), dim, index))


def serve_to_copy(kernel, args, kwargs):
    """`t.to(dtype)` of a whole grown tensor (a padded batch's attention mask, converted every step):
    the engine's conversion of the whole room (a program per capacity; the room's zeros convert to
    zeros), the result keeping the room; None for the engine."""
    if len(args) != 1 or kwargs.keys() != {"dtype"} or _serving[0]:
        return None
    t = args[0]
    room = room_of(t)
    if room is None or t.requires_grad:
        return None
    return _keeping(room, t.shape, _engine(kernel, padded(t, room), **kwargs))


def serve_sum(kernel, args, kwargs):
    """`t.sum()` of a whole grown integer or bool tensor (`fast_all` of a padded batch's mask): the
    engine's sum of the whole room (its positions past the length hold zeros, and integer sums do not
    depend on their order), a program per capacity; None for the engine."""
    if len(args) != 1 or kwargs or _serving[0]:
        return None
    t = args[0]
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return None
    room = room_of(t)
    return None if room is None else _engine(kernel, padded(t, room))


def _keeping(room, shape, out):
    """`out` (an op's result over `room`'s whole array) as an exact tensor of `shape` with that room."""
    r = RECORDS[out.untyped_storage().data_ptr()]
    fusion.run_inputs((r._buffer,))  # (a queued result runs: the room holds an array)
    return with_room(shape, out.dtype, r.device_index, r.buffer, room.axis, room.length)


def _engine(kernel, *args, **kwargs):
    _serving[0] = True
    try:
        return kernel(*args, **kwargs)
    finally:
        _serving[0] = False
