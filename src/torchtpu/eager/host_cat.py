"""`cat` and `stack` of small tensors of a new signature without an XLA compile (XLA:CPU only).

An executable's key holds every input's shape and the number of inputs, so each new list of shapes
compiled a concatenation program of its own: PyTorch's cat/stack/hstack/vstack/dstack tests made 522
of test_tensor_creation_ops' subset's 741 compiles that way (docs/upstream_tests.md, "Cold start,
twelfth session"). A concatenation computes nothing: it moves elements. Where device buffers are host
memory (XLA:CPU), the first calls of a new signature whose result is small (HOST_BYTES) concatenate on
the host instead: each input read through its view (shape, strides, storage offset) from its storage's
array, joined along `dim` (stack: each input with a new size-1 dimension there), laid out in the
result's memory order and put back on the device. No program, and the same bits as the exact program.

PyTorch's answer still decides everything else: the op runs on meta tensors first (eager/build.py
_meta_call: its shape, its strides, a channels_last cat staying channels_last, and its errors in
the CPU's words); inputs of several dtypes (promotion would convert: a computation), lazy conj/neg
bits, complex32 (stored packed), tensors of other devices, legacy empty inputs and inputs the fused
mode still owes (a queued result: reading it would run its segment now) go to the engine as before.
A signature called more than TIER_UP times goes to the engine too, which keeps its one exact program
(no host round trip, no wait for the inputs in a hot loop). On a TPU the exact program stays (the
TPU compile check sees it).
"""

from __future__ import annotations

import jax
import numpy as np
import torch

from ..storage.records import RECORDS, memory_order, new_tensor, storage_shape
from . import fusion, limits, tpu_check
from .build import _kept_strides, _layout_rule, _meta_call
from .executable import input_buffers

HOST_BYTES = 1 << 20  # the result's bytes at most (a copy of 1 MiB costs ~0.1 ms; a compile 20-70 ms)
TIER_UP = 16  # calls of one signature after which the engine builds its exact program
_MAX_KEPT = 1024
_calls: dict = {}  # signature -> calls served here
limits.FORGETTERS.append(_calls.clear)


def serve(kernel, args, kwargs, stack=False):
    """The result of `cat(tensors, dim)` (`stack` when `stack`) concatenated on the host, or None for
    the engine's exact program."""
    if not tpu_check.host_work_allowed():
        return None
    tensors = args[0] if args else kwargs.get("tensors")
    if kwargs.keys() - {"tensors", "dim"} or not isinstance(tensors, (list, tuple)) or not tensors:
        return None
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    first = tensors[0]
    if not isinstance(dim, int) or not isinstance(first, torch.Tensor):
        return None
    dtype, n = first.dtype, first.dim()
    if dtype == torch.complex32 or n == 0 or not -(n + stack) <= dim < n + stack:
        return None
    records = []
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.dim() != n or t.is_conj() or t.is_neg():
            return None
        r = RECORDS.get(t.untyped_storage().data_ptr())
        if r is None or r.dtype != dtype:
            return None
        records.append(r)
    if len({r.device_index for r in records}) != 1:
        return None
    if any(type(r._buffer) is fusion.Pending for r in records):  # (the fused mode's queued result: reading
        return None  # it here would run its segment now and break the step's fusion; the engine queues the cat)
    numel = sum(t.numel() for t in tensors)
    if numel * dtype.itemsize > HOST_BYTES:
        return None
    signature = (stack, dim, dtype, tuple((tuple(t.shape), t.stride()) for t in tensors))
    calls = _calls.get(signature, 0)
    if calls >= TIER_UP:
        return None
    try:
        _, meta_out = _meta_call(kernel, args, kwargs)
    except (RuntimeError, TypeError, IndexError, ValueError):  # (the engine raises it, as before)
        return None
    if len(_calls) >= _MAX_KEPT:
        _calls.clear()
    _calls[signature] = calls + 1
    shape = tuple(meta_out.shape)
    strides = _kept_strides(meta_out, _layout_rule(kernel, args, kwargs))
    buffers = input_buffers(records)
    d = dim % (n + stack)
    pieces = []
    for t, b in zip(tensors, buffers):
        flat = np.asarray(b).reshape(-1)
        v = np.lib.stride_tricks.as_strided(
            flat[t.storage_offset() :], tuple(t.shape), [s * flat.itemsize for s in t.stride()], writeable=False
        )
        pieces.append(np.expand_dims(v, d) if stack else v)
    out = np.concatenate(pieces, axis=d)
    if out.shape != shape:  # (PyTorch's answer is the result's shape: anything else is not ours to serve)
        return None
    if strides is not None:
        out = out.transpose(memory_order(shape, strides))
    out = np.ascontiguousarray(out).reshape(storage_shape(shape, strides))
    device = records[0].device_index
    return new_tensor(shape, dtype, device, jax.device_put(out, buffers[0].sharding), stride=strides)
