"""The one builder of device executables, shared by eager ops, the fused mode and compiled graphs.

An executable takes the buffers of the storages it touches (each in its record's shape), then its traced values (Python
scalars, CPU scalars and host arrays, in argument order), then the PRNG state if the op draws
random numbers, then the traced storage offsets of partial views:

    (buffers..., values..., [rng], offsets...) -> (outputs..., mutated buffers..., extras..., [verdict])

Inside, it reads each tensor argument through its view (layout and lazy conj/neg bits), runs the
computation, casts each output to the dtype PyTorch expects and lays it out in memory order (a new
storage holds its tensor's array: storage/records.py), writes in-place results back through their
views, and returns the verdict of the device-side checks (ops/checks.py) the computation stated, if
any. The host side (`key_tensor`, `input_buffers`, `commit`) keys the cache, gathers the buffers and records
the results.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from itertools import chain, islice, repeat, starmap
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from ..device import platform
from ..ops import checks, linalg, views
from ..ops import dtypes as dt
from ..storage.records import Placeholder, allocation_failed, materialize
from . import errors, tpu_check
from .fusion import Pending

_TRACED = object()


# ---------------------------------------------------------------- argument specs
class DynOffset(NamedTuple):
    index: int  # which of the executable's traced offsets holds the view's storage offset
    # the view lies along the storage array's dimensions at every offset the executable is called with
    # (the key tells: key_tensor), so it is read there instead of from the flattened array (views.nd_plan)
    along: bool = False


class TensorArg(NamedTuple):
    slot: int  # which input buffer
    layout: tuple  # (shape, stride, offset | DynOffset, jax dtype, numel of the storage)
    bits: tuple = (False, False)  # (conjugate, negative): lazily conjugated/negated views


class ValueArg(NamedTuple):
    """An argument that travels as a traced value: a Python scalar, a CPU scalar tensor's value
    (made an array of `dtype`) or a host array (`dtype` None: as it comes)."""

    dtype: object = None
    static: object = _TRACED  # the value baked in instead (an op specialized on its scalars)


def is_partial(t, record):
    """A view of part of its storage: its offset travels as a traced value, so `x[i]` in a loop
    reuses one executable."""
    return bool(t.storage_offset()) or t.numel() != record.numel


def layout_of(t, record, dyn_index=None, along=False):
    """A view's layout; `along`: its traced offset may be read along the storage array's dimensions
    (eager executables, whose key says so: key_tensor)."""
    offset = t.storage_offset()
    if dyn_index is not None:
        offset = DynOffset(dyn_index, along and lies_along(t, offset, record))
    return (tuple(t.shape), tuple(t.stride()), offset, dt.element(t.dtype), record.numel)


def tensor_arg(t, slot, record, dyn_index=None, along=False):
    return TensorArg(slot, layout_of(t, record, dyn_index, along), (t.is_conj(), t.is_neg()))


def lies_along(t, offset, record):
    """Whether view `t` at `offset` lies along the dimensions of its storage's array (views.nd_plan)."""
    if len(record.shape) < 2 or t.dtype != record.dtype:
        return False
    return views.nd_plan(t.shape, t.stride(), offset, record.shape) is not None


def at(layout, offsets):
    """The layout with its traced offset filled in."""
    off = layout[2]
    if type(off) is not DynOffset:
        return layout
    value = offsets[off.index]
    return layout[:2] + ((views.AlongOffset(value) if off.along else value),) + layout[3:]


def rng_key(rng):
    """The PRNG key of a draw: rng = (seed, stream, counter) (eager/random.py)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(rng[0]), rng[1]), rng[2])


def stored_output(v, dtype, shape=None, order=None, where="op"):
    """An output as its storage holds it: cast to `dtype`, broadcast to `shape` (a lowering may
    return a scalar or a broadcastable value), transposed to the memory `order` of a strided output
    (so its shape is storage_shape's for the output's layout)."""
    v = jnp.asarray(v)
    if dtype is dt.COMPLEX32:
        v = dt.pack_complex32(v)
    elif v.dtype != dtype:
        v = v.astype(dtype)
    if shape is not None and v.shape != shape:
        if v.size == 1 or v.ndim < len(shape):
            v = jnp.broadcast_to(v, shape)
        if v.shape != shape:
            raise AssertionError(f"torchtpu: lowering of {where} returned shape {v.shape}, PyTorch expects {shape}")
    if order is not None:
        v = jnp.transpose(v, order)
    return v


class Program(NamedTuple):
    """What an executable does, in the terms of its arguments."""

    n_buffers: int
    n_values: int
    random: bool
    n_offsets: int
    template: object  # the computation's arguments: a list (or (args, kwargs)) of specs and statics
    # run(arguments, rng key or None) -> (output values, values written through `writes`, extras)
    run: Callable
    outputs: Callable  # output values -> the arrays their storages hold (see stored_output)
    writes: list  # (slot, layout, bits) per written view, in the order run returns them
    mutated_slots: list  # buffers returned after the outputs, in this order
    # at trace time: the messages of the device-side checks, and whether the computation read
    # torch's float32 matmul precision (then that setting must key the executable)
    on_trace: Callable


def _fill(spec, buffers, values, offsets):
    t = type(spec)
    if t is TensorArg:
        return views.apply_bits(views.read(buffers[spec.slot], at(spec.layout, offsets)), spec.bits)
    if t is ValueArg:
        v = next(values)
        if spec.static is not _TRACED:
            return spec.static
        return v if spec.dtype is None else jnp.asarray(v, spec.dtype)
    if t is list:
        return [_fill(x, buffers, values, offsets) for x in spec]
    if t is tuple and spec and type(spec[0]) is list and type(spec[-1]) is dict:  # (args, kwargs)
        return (
            _fill(spec[0], buffers, values, offsets),
            {k: _fill(v, buffers, values, offsets) for k, v in spec[1].items()},
        )
    return spec


def count_values(spec):
    """How many traced values a template takes."""
    t = type(spec)
    if t is ValueArg:
        return 1
    if t is list:
        return sum(count_values(x) for x in spec)
    if t is tuple and spec and type(spec[0]) is list and type(spec[-1]) is dict:
        return count_values(spec[0]) + sum(count_values(v) for v in spec[1].values())
    return 0


def traced_function(p: Program, gated=False):
    """The function to jit for program `p` (see the module docstring for its signature). `gated`: it
    takes one more argument after the buffers, the verdict of device-side checks not yet read back
    (eager/asserts.py: poison), and each write keeps the view's old value unless it is 0 (the write
    stays a write of the view, so XLA still updates a donated buffer in place)."""
    nb, nv, n_off = p.n_buffers, p.n_values, p.n_offsets

    def executable(*dyn):
        platform.require_x64()  # (at trace time only: a cached executable never comes here)
        if gated:
            gate = dyn[nb]
            dyn = dyn[:nb] + dyn[nb + 1 :]
        buffers = list(dyn[:nb])
        values = iter(dyn[nb : nb + nv])
        key = rng_key(dyn[nb + nv]) if p.random else None
        offsets = dyn[len(dyn) - n_off :] if n_off else ()
        arguments = _fill(p.template, buffers, values, offsets)
        reads = linalg.PRECISION_READS[0]
        with checks.collecting() as found:
            outs, written, extras = p.run(arguments, key)
        flags, messages = checks.verdict(found)
        p.on_trace(messages, linalg.PRECISION_READS[0] != reads)
        flat = p.outputs(outs)
        # (lax.select of a scalar predicate, not jnp.where: no broadcast, no nested jit to lower)
        passed = None if flags is None or not p.writes else flags == 0
        for (slot, layout, bits), v in zip(p.writes, written):
            v = views.apply_bits(v, bits)
            if gated:
                old = views.read(buffers[slot], at(layout, offsets))
                v = jnp.where(gate == 0, jnp.asarray(v).astype(old.dtype), old)
            new = views.write(buffers[slot], at(layout, offsets), v)
            # a write whose check failed is not committed: the storage keeps its old value
            buffers[slot] = new if passed is None else lax.select(passed, new, buffers[slot])
        return (*flat, *(buffers[s] for s in p.mutated_slots), *extras, *(() if flags is None else (flags,)))

    return executable


# ---------------------------------------------------------------- host side
def device_mismatch(where, a, b):
    """PyTorch's error for tensors of two devices in one op (`where`: aten::add.Tensor)."""
    raise RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"{_name(a)} and {_name(b)}! (when checking arguments for {where})"
    )


def _name(d):
    return f"tpu:{d}" if type(d) is int else str(d)


def key_tensor(a, r, address, parts, slot_of, records, offsets, device, where):
    """Key tensor `a` (record `r` at storage `address`) into `parts`; returns the call's device.
    A storage seen before in the call reuses its slot, so aliasing is part of the key."""
    slot = slot_of.get(address)
    if slot is None:
        slot = slot_of[address] = len(records)
        records.append(r)
        if device != r.device_index:
            if device >= 0:
                device_mismatch(where, device, r.device_index)
            device = r.device_index
    off = a.storage_offset()
    if off or a.numel() != r.numel:  # part of its storage: the offset is traced
        offsets.append(off)
        off = -2 if lies_along(a, off, r) else -1
    # (torch.Size hashes and compares as the tuple of its sizes)
    parts.append((a.dtype, a.shape, a.stride(), off, slot, r.dtype, r.shape))
    if a.is_conj() or a.is_neg():
        parts.append((a.is_conj(), a.is_neg()))
    return device


def input_buffers(records, deferred=False):
    """The buffers to call an executable with. `deferred` (the fused mode queues the call) keeps
    queued results as they are; otherwise reading a queued buffer runs its queue. A storage never
    written reads as zeros (and keeps them)."""
    inputs = []
    for r in records:
        b = r._buffer
        if b is None:
            try:
                b = zeros(r.shape, r.dtype, r.device_index)
            except BaseException as e:
                if isinstance(e, torch.OutOfMemoryError):
                    allocation_failed(r)  # never counted in the peak (storage/records.py: MemoryStats)
                raise
            materialize(r)
            r._buffer = b
        elif isinstance(b, Placeholder) and not (deferred and type(b) is Pending):
            # a queued result runs its queue (kept as it is where the call is queued too); a grown
            # tensor gives its exact values out of its room (eager/growing.py)
            b = r.buffer
        inputs.append(b)
    return inputs


def commit(records, buffers):
    """Give `records` their new `buffers` (the assignments run in C)."""
    for r in records:
        if r._buffer is None:
            materialize(r)
    _consume(map(setattr, records, repeat("_buffer"), buffers))


_consume = deque(maxlen=0).extend


def call_and_commit(fn, args, records, first):
    """`fn(*args)`, giving `records` (none of them unwritten) the results from index `first` on.
    The call and the assignments happen inside one C-level iteration, with no Python code between
    them where a signal handler could raise (Ctrl-C): either the records keep their old buffers (the
    call did not happen), or they hold the new ones. Never a buffer the executable took over."""
    try:
        if not records:
            return fn(*args)
        box = {}
        results = map(box.setdefault, repeat(0), starmap(fn, (args,)))
        _consume(map(setattr, records, repeat("_buffer"), islice(chain.from_iterable(results), first, None)))
        return box[0]
    except jax.errors.JaxRuntimeError as e:
        errors.raise_out_of_memory(e)  # torch.OutOfMemoryError, as on CUDA
        raise


# Zero buffers of at most SMALL_ZEROS bytes are kept (arrays are immutable, and a kept one is never
# donated: its refcount is too high): `new_ones`, `empty(...).fill_()` and copies into a fresh
# `empty` write a storage that was never written, whose zeros would otherwise cost a call each time.
SMALL_ZEROS = 1 << 14
# Zeros of at most HOST_ZEROS bytes are sent from the host: a compiled zeros program costs an XLA
# compile per new shape (30-70 ms on XLA:CPU: every `torch.randn` of a new shape paid one), a
# transfer of 1 MiB 0.1-0.3 ms here and well under a millisecond over PCIe; bigger ones are made on
# the device, where a transfer would cost more than the compile.
HOST_ZEROS = 1 << 20
_zeros_fns = {}
_zeros_kept = {}


def zeros(shape, dtype, device_index):
    """A buffer of zeros of `shape` and torch dtype `dtype` on tpu:`device_index`."""
    if type(shape) is int:
        shape = (shape,)
    nbytes = math.prod(shape) * dtype.itemsize
    small = nbytes <= SMALL_ZEROS
    if small:
        kept = _zeros_kept.get((shape, dtype, device_index))
        if kept is not None:
            return kept
    # (numpy's arrays have at most 64 dims; XLA's take more)
    make = _host_zeros if nbytes <= HOST_ZEROS and len(shape) <= 64 else _device_zeros
    try:
        z = make(shape, dtype, device_index)
    except jax.errors.JaxRuntimeError as e:
        errors.raise_out_of_memory(e)
        raise
    if small:
        if len(_zeros_kept) >= 256:
            _zeros_kept.clear()
        _zeros_kept[(shape, dtype, device_index)] = z
    return z


def _host_zeros(shape, dtype, device_index):
    platform.require_x64()  # (else JAX would narrow a 64-bit array)
    sharding = jax.sharding.SingleDeviceSharding(platform.jax_device(device_index))
    return jax.device_put(np.zeros(shape, dt.storage_jax(dtype)), sharding)


def _device_zeros(shape, dtype, device_index):
    fn = _zeros_fns.get((dtype, device_index))
    if fn is None:
        sharding = jax.sharding.SingleDeviceSharding(platform.jax_device(device_index))
        jd = dt.storage_jax(dtype)

        def make_zeros(shape):
            platform.require_x64()
            return jnp.zeros(shape, jd)

        fn = _zeros_fns[(dtype, device_index)] = tpu_check.jit(
            make_zeros, f"zeros of {dtype}", static_argnums=0, out_shardings=sharding
        )
    return fn(shape)
