"""Appends to a growing tensor (`torch.cat([grown, new], dim)`) into spare room of a bucketed storage.

Eager decoding grows tensors by one position per step: Transformers' dynamic cache appends each
layer's keys and values (`cat([keys, k], dim=-2)`), `generate()` its token ids and attention mask
(`cat([ids, next[:, None]], dim=-1)`). An executable's key holds every shape, so each new length
was a new XLA program for the cat, and for every op on a view of the grown tensor, since a view's
program takes its storage's whole array (`isin(ids[:, -1], eos)`, `ids[:, -1:].clone()`): ~10
executables per decode step (benchmarks/RESULTS.md, "where peak host RSS goes").

Here an append whose first tensor was itself made by an append (a chain: a single cat keeps its
contiguous result) writes its result into a storage whose array has room along `dim` up to a size
bucket (`capacity`): the result is the first positions of that array. Only where every dimension
before `dim` has one element: there the view is still contiguous by PyTorch's rules (size-1
dimensions' strides do not count), as a CUDA cat's result is; with room behind a longer dimension it
would not be (`.view()` would raise, `is_contiguous()` differ), so those appends stay exact cats
(a batch of token ids, a cache's keys of several heads). The next append to such a view, while the
room lasts, is one program per bucket that copies the array and writes the new positions at the traced length
(`lax.dynamic_update_slice`); a view of its last positions is a traced offset into the same array
shape, so ops on it (the stop check's `isin`, the next step's input `clone`) also compile once per
bucket. Only data moves: the values are the exact cat's, bit for bit. Appends are always served
here (no engine entry is kept for their keys, so that each call can see whether its first tensor
has room); anything else (other dtypes, lazy conj/neg bits, more tensors, sizes that do not match)
goes to the engine's cat as before, with its errors.
"""

from __future__ import annotations

import jax
import numpy as np
import torch
from jax import lax

from ..metrics import counters
from ..storage.records import RECORDS, contiguous_strides, covers, new_tensor_with_room
from . import fusion, limits, xla_options
from .executable import input_buffers

MIN_LENGTH = 8  # an append whose result is shorter along `dim` stays an exact cat
SMALLEST_ROOM = 16  # positions along `dim`: the smallest bucket
_MAX_KEPT = 256
_programs: dict = {}  # (buffer shape, piece's buffer shape, its shape, axis, size, dtype) -> jitted append
_appended: dict = {}  # storage address -> axis: exact results of an append (a chain's first link)
_room: dict = {}  # storage address -> axis: storages with room along `axis` made here
limits.FORGETTERS.append(_programs.clear)


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
    if any(a.shape[i] != 1 for i in range(d)):  # room there would make the result non-contiguous
        return None
    la, lb = a.shape[d], b.shape[d]
    if not 1 <= lb < la or la + lb < MIN_LENGTH or a.device != b.device or a.requires_grad or b.requires_grad:
        return None
    if any(a.shape[i] != b.shape[i] for i in range(n) if i != d) or 0 in a.shape:
        return None
    address = a.untyped_storage().data_ptr()
    ra = RECORDS.get(address)
    rb = RECORDS.get(b.untyped_storage().data_ptr())
    if ra is None or rb is None or ra.dtype != a.dtype:
        return None
    total = la + lb
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
