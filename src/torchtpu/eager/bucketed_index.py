"""Indexed writes through an index of a new length without an XLA compile of their own.

`index_put_`, `index_add_`, `index_copy_`, `index_fill_`, `index_reduce_`, `put_` and the scatters
write into `self` through an index whose length does not shape the result, yet each new length (and
each layout of the index and the source) was a program of its own: 0.1-0.25 s of XLA:CPU compile
each (a bounds check makes it a reduction, which compiles slowly), and PyTorch's tests sweep lengths
(`test_index_put_accumulate_duplicate_indices`: 511 of them). A lowering that declares
`index_buckets` (ops/indexing.py) names the arguments that may be padded: the index, and the source
along the index's axis. Such an op runs as two steps: per padded tensor a small program that reads
it through its view and pads it to the length's size bucket (bucket_of) with entries the op drops
(the index one past the end of its dimension; XLA's scatters drop out-of-range updates), shared by
every op that pads an index of that layout; then the op's program on the padded arrays, compiled
once per bucket (and the layouts of the other arguments) and taking the real length as a traced
value, so its index checks leave the padding out (ops/checks.py `padded`). Padding at the end keeps
the order of the real updates, so sums accumulate and duplicate writes win as before. An entry that
keeps being called builds its own one-program executable after TIER_UP calls, as bucketed draws do
(eager/bucketed_draws.py).
"""

from __future__ import annotations

import math
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..device import platform
from ..ops import checks, views
from ..ops import dtypes as dt
from ..storage.records import contiguous_strides
from . import bucketed_draws, limits
from .executable import DynOffset, TensorArg, at, traced_function
from .stand_ins import (
    _MAX_KEPT,
    TieringStandIn,
    _Jitted,
    _map_specs,
    _tensor_args,
    copied,
    jit_shared,
    kept_offsets,
    shared_key,
    shared_program,
)

SMALLEST_BUCKET = 16  # index entries: a shorter index is padded to this many
_shared: dict = {}
_pads: dict = {}
limits.FORGETTERS.append(_shared.clear)
limits.FORGETTERS.append(_pads.clear)
_tracing = threading.local()  # the traced real length while a shared program is traced


def bucket_of(n: int) -> int:
    """The padded length of an index of `n` entries: the buckets of random draws, from SMALLEST_BUCKET."""
    return bucketed_draws.bucket_of(n, SMALLEST_BUCKET)


class BucketedIndex(TieringStandIn):
    """`entry.fn` (or `entry.fn_gated`: `attr`) of a padded indexed write, called as the one-program
    executable is: (buffers..., [gate], values..., offsets...). `__wrapped__`: the one-program
    function, which a fused segment traces instead (eager/fusion.py _nestable) and which the entry
    jits for itself after TIER_UP calls."""

    __slots__ = ("gated", "kept", "n", "n_buffers", "n_values", "pads", "shared")

    def __call__(self, *dyn):
        own = self._own_for(dyn)
        if own is not None:
            return own(*dyn)
        nb, g = self.n_buffers, self.gated
        buffers = list(dyn[:nb])
        head = dyn[nb : nb + g + self.n_values]
        offsets = dyn[nb + g + self.n_values :]
        pad, slots, offs = self.pads
        if pad is not None:
            padded = pad.fn(*(buffers[s] for s in slots), *(offsets[i] for i in offs))
            for s, v in zip(slots, padded):
                buffers[s] = v
        shared = self.shared
        run = shared.fn_gated if g else shared.fn
        results = run(*buffers, *head, self.n, *(offsets[i] for i in self.kept))
        self.entry.checks = shared.checks
        return results


def build(kernel, entry, program, fn, records, args, kwargs, name, op_jit):
    """`entry.fn` as a BucketedIndex when the op's lowering names arguments it may pad (and
    `entry.fn_gated` too for an in-place write), else None. `fn`: the one-program function."""
    plan_of = kernel.index_buckets
    if plan_of is None or program.random or not records:
        return None
    plan = plan_of(*args, **kwargs)
    if not plan:
        return None
    found = _locate(kernel, program.template, plan)
    if found is None:
        return None
    n = found[0][2]
    bucket = bucket_of(n)
    template, writes, kept, padded = _shared_form(program, found, bucket)
    if template is None:
        return None
    shapes = [tuple(r.shape) for r in records]
    for (_, spec, *_), shape in zip(found, padded):
        shapes[spec.slot] = shape
    key = shared_key(kernel, entry, program, template, writes, shapes, bucket)
    shared, new = shared_program(_shared, key, entry.xla)
    if shared is None:  # an unhashable static argument: keep the exact-shape path
        return None
    if new:
        jit_shared(
            shared,
            program,
            op_jit,
            f"{name} (an index of {bucket})",
            wrap=lambda traced, gated: _with_length(traced, program, gated),
            template=template,
            writes=writes,
            n_offsets=len(kept),
            run=_masked_run(program.run, [(loc, axis) for loc, _, _, axis, _, _ in found]),
        )
    pads = _pad(found, records, n, padded, entry.xla, op_jit)
    parts = (entry, name, op_jit, shared, pads, kept, n, program)
    if program.mutated_slots:
        entry.fn_gated = _composite(*parts, "fn_gated", traced_function(program, gated=True))
    return _composite(*parts, "fn", fn)


def _composite(entry, name, op_jit, shared, pads, kept, n, program, attr, wrapped):
    c = BucketedIndex()
    c._stand_in(entry, attr, name, op_jit, wrapped)
    c.shared, c.pads, c.kept, c.n = shared, pads, kept, n
    c.n_buffers, c.n_values, c.gated = program.n_buffers, program.n_values, 1 if attr == "fn_gated" else 0
    return c


def _locate(kernel, template, plan):
    """[(location in the template, its TensorArg, length, axis, flatten, fill)] of the plan's
    tensors, the first one's length common to all, or None where the plan does not fit this call."""
    positions = {a.name: i for i, a in enumerate(kernel.op._schema.arguments)}
    args, kwargs = template
    found, slots = [], set()
    for arg_name, element, axis, flatten, fill in plan:
        if arg_name in kwargs:
            loc = (1, arg_name)
        elif positions.get(arg_name, len(args)) < len(args):
            loc = (0, positions[arg_name])
        else:
            return None
        spec = args[loc[1]] if loc[0] == 0 else kwargs[loc[1]]
        if element is not None:
            if type(spec) is not list or element >= len(spec):
                return None
            loc, spec = (*loc, element), spec[element]
        if type(spec) is not TensorArg or spec.layout[3] is dt.COMPLEX32 or spec.slot in slots:
            return None
        slots.add(spec.slot)
        shape = spec.layout[0]
        length = math.prod(shape) if flatten else (shape[axis] if len(shape) > axis else 0)
        found.append((loc, spec, length, 0 if flatten else axis, flatten, fill))
    n = found[0][2]
    if n == 0 or any(length < n for _, _, length, _, _, _ in found):
        return None
    # a padded storage must be read by nothing else (the shared program sees only the padded array)
    others = [s.slot for s in _tensor_args(template)]
    if any(others.count(slot) > 1 for slot in slots):
        return None
    return [(loc, spec, n, axis, flatten, fill) for loc, spec, _, axis, flatten, fill in found]


def _shared_form(program, found, bucket):
    """The shared program's template (padded tensors contiguous, whole storages of their padded
    shape), writes (traced offsets renumbered), the traced offsets it keeps, the padded shapes."""
    padded_slots = {spec.slot for _, spec, *_ in found}
    if any(slot in padded_slots for slot, _, _ in program.writes):
        return None, None, None, None
    used, moved = kept_offsets(program, padded_slots)
    args, kwargs = copied(program.template)
    shapes = []
    for loc, spec, _, axis, flatten, _ in found:
        shape = list(spec.layout[0])
        shape = [bucket] if flatten else shape[:axis] + [bucket] + shape[axis + 1 :]
        shape = tuple(shape)
        shapes.append(shape)
        layout = (shape, tuple(contiguous_strides(shape)), 0, spec.layout[3], math.prod(shape))
        _set((args, kwargs), loc, TensorArg(spec.slot, layout))
    template = _map_specs((args, kwargs), lambda s: s if s.slot in padded_slots else s._replace(layout=moved(s.layout)))
    writes = [(slot, moved(layout), bits) for slot, layout, bits in program.writes]
    return template, writes, used, shapes


def _set(template, loc, value):
    container = template[loc[0]][loc[1]] if len(loc) == 3 else template[loc[0]]
    container[loc[-1]] = value


def _with_length(traced, program, gated):
    """traced(...) taking the real length after the values: (buffers..., [gate], values..., n, offsets...)."""
    k = program.n_buffers + gated + program.n_values

    def run(*dyn):
        _tracing.n = dyn[k]
        try:
            return traced(*dyn[:k], *dyn[k + 1 :])
        finally:
            _tracing.n = None

    return run


def _masked_run(run, where):
    """The program's run, telling index checks which entries of the padded arguments are real."""

    def masked(arguments, key):
        n = _tracing.n
        masks = {}
        for loc, axis in where:
            v = arguments[loc[0]][loc[1]]
            if len(loc) == 3:
                v = v[loc[2]]
            masks[id(v)] = (v, lax.broadcasted_iota(jnp.int64, v.shape, axis) < n)
        with checks.padded(masks):
            return run(arguments, key)

    return masked


def _pad(found, records, n, shapes, xla, op_jit):
    """(the shared program padding the tensors of `found` to `shapes`, or None where every storage
    already is its padded array; their slots; the indices of their traced offsets)."""
    parts, slots, offs = [], [], []
    for (_, spec, _, axis, flatten, fill), shape in zip(found, shapes):
        layout, bits, buffer_shape = spec.layout, spec.bits, tuple(records[spec.slot].shape)
        off = layout[2]
        if (
            not any(bits)
            and type(off) is int
            and off == 0
            and buffer_shape == shape == layout[0]
            and tuple(layout[1]) == tuple(contiguous_strides(shape))
        ):
            continue
        if type(off) is DynOffset:
            layout = layout[:2] + (off._replace(index=len(offs)),) + layout[3:]
            offs.append(off.index)
        slots.append(spec.slot)
        parts.append((layout, bits, buffer_shape, axis, flatten, repr(fill), fill, shape))
    if not parts:
        return None, (), ()
    if _on_host(parts, records, slots):
        return _HostPad(parts, n), tuple(slots), tuple(offs)
    key = (tuple(p[:6] + p[7:] for p in parts), n, xla and tuple(sorted(xla.items())))
    pad = _pads.get(key)
    if pad is not None:
        return pad, tuple(slots), tuple(offs)
    if len(_pads) >= _MAX_KEPT:
        _pads.clear()
    pad = _pads[key] = _Jitted(xla)

    def padding(*dyn):
        platform.require_x64()
        offsets = dyn[len(parts) :]
        out = []
        for buffer, (layout, bits, _, axis, flatten, _, fill, shape) in zip(dyn, parts):
            v = views.apply_bits(views.read(buffer, at(layout, offsets)), bits)
            if flatten:
                v = v.reshape(-1)
            v = lax.slice_in_dim(v, 0, n, axis=axis)
            widths = [(0, 0)] * v.ndim
            widths[axis] = (0, shape[axis] - n)
            out.append(
                jnp.pad(v, widths, constant_values=jnp.asarray(fill).astype(v.dtype)).astype(dt.stored(layout[3]))
            )
        return tuple(out)

    pad.fn = op_jit(pad, "fn", padding, f"a pad of index arguments to {shapes}")
    return pad, tuple(slots), tuple(offs)


# Padded tensors of at most HOST_PAD_BYTES in all are padded on the host: a program per new length
# costs an XLA compile (50-100 ms on XLA:CPU, as much as the op's own program for a small index_put),
# a round trip of a few KiB microseconds. It waits for the index's value (a stall, once per new
# length until the entry tiers up), cheaper than the compile it saves.
HOST_PAD_BYTES = 1 << 16


def _on_host(parts, records, slots):
    total = 0
    for (layout, *_, shape), slot in zip(parts, slots):
        dtype = layout[3]
        if dtype != dt.stored(dt.element(records[slot].dtype)):  # (a view as another dtype: the device reads it)
            return False
        total += math.prod(shape) * dtype.itemsize
    return total <= HOST_PAD_BYTES


class _HostPad:
    """`fn(*buffers, *offsets)`: the padded arrays of `parts`, made on the host and sent back."""

    __slots__ = ("n", "parts")

    def __init__(self, parts, n):
        self.parts, self.n = parts, n

    def fn(self, *dyn):
        offsets = dyn[len(self.parts) :]
        out = []
        for buffer, (layout, bits, _, axis, flatten, _, fill, shape) in zip(dyn, self.parts):
            view_shape, stride, off, dtype = layout[:4]
            if type(off) is DynOffset:
                off = int(offsets[off.index])  # (the C++ fast path may pass it as a kept device array)
            flat = np.asarray(buffer).reshape(-1)
            v = np.lib.stride_tricks.as_strided(
                flat[off:], view_shape, [st * flat.itemsize for st in stride], writeable=False
            )
            if bits[0]:
                v = np.conj(v)
            if bits[1]:
                v = -v
            if flatten:
                v = v.reshape(-1)
            padded = np.full(shape, fill, dtype=flat.dtype)
            cut = tuple(slice(0, self.n) if d == axis else slice(None) for d in range(v.ndim))
            padded[cut] = v[cut]
            out.append(jax.device_put(padded, buffer.sharding))
        return tuple(out)
