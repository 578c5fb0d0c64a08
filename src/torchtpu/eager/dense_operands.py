"""Ops on small strided operands without an XLA compile per operand layout.

An executable reads each input through its view, so every storage layout of every operand (the
strides, a partial view's place) is part of its key: `bmm` of two permuted inputs into a permuted
out= compiled a program per combination (PyTorch's test_bmm: 36 input-layout pairs x 6 out= layouts
x 2 batch sizes, 1,414 compiles). Here a new key whose read-only operands include small tensors that
are not their whole storage in row-major order runs as two steps: each such operand made dense by a
small program keyed on its layout alone (shared by every op that reads that layout), then the op's
program on dense operands, shared by every layout that densifies to them (keyed on the op, the dense
template, the written views, the output layouts). Products of layouts become sums. On XLA:CPU
(device buffers are host memory) a small operand is made dense on the host (numpy: the same bits,
no program to compile); on a TPU the dense copy is a device program (the TPU compile check sees it).

Only what the lowering reads changes: it sees the same logical values, so results are the one-program
executable's bit for bit; output layouts come from PyTorch's meta answer for the real arguments, as
before. Written operands (in-place self, out=) keep their layouts; an operand whose storage the op
also writes or reads through another view keeps its read. An entry that keeps being called builds its
own one-program executable after TIER_UP calls (as bucketed draws and index writes do), and a fused
segment traces the one-program function (`__wrapped__`).
"""

from __future__ import annotations

import math

import jax
import numpy as np

from ..device import platform
from ..ops import dtypes as dt
from ..ops import views
from ..ops.linalg import matmul_precision
from ..storage.records import contiguous_strides
from . import limits, op_store, tpu_check
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
)

DENSE_BYTES = 1 << 18  # an operand of at most this many bytes is made dense (a copy costs ~nothing)
HOST_DENSE_BYTES = 1 << 16  # ... on the host, where device buffers are host memory (XLA:CPU)
# the copies themselves (their programs are what the others share) and ops that read storages
_NOT_FOR = frozenset({"clone.default", "copy_.default", "_to_copy.default", "_copy_from.default"})
_shared: dict = {}
_copies: dict = {}
limits.FORGETTERS.append(_shared.clear)
limits.FORGETTERS.append(_copies.clear)


class DenseOperands(TieringStandIn):
    """`entry.fn` (or `entry.fn_gated`: `attr`) of an op with densified operands, called as the
    one-program executable is: (buffers..., [gate], values..., offsets...). `__wrapped__`: the
    one-program function, which a fused segment traces instead and the entry jits after TIER_UP calls."""

    __slots__ = ("copies", "gated", "kept", "n_buffers", "n_values", "shared")

    def __call__(self, *dyn):
        own = self._own_for(dyn)
        if own is not None:
            return own(*dyn)
        nb, g = self.n_buffers, self.gated
        buffers = list(dyn[:nb])
        head = dyn[nb : nb + g + self.n_values]
        offsets = dyn[nb + g + self.n_values :]
        for slot, copy, off in self.copies:
            buffers[slot] = copy.fn(buffers[slot], *((offsets[off],) if off is not None else ()))
        shared = self.shared
        run = shared.fn_gated if g else shared.fn
        results = run(*buffers, *head, *(offsets[i] for i in self.kept))
        self.entry.checks = shared.checks
        return results


def build(kernel, entry, program, fn, records, name, op_jit, on_trace, store):
    """`entry.fn` as DenseOperands when some operands are worth making dense (and `entry.fn_gated`
    too for an op that writes), else None. `fn`: the one-program function; `on_trace`: what the
    shared program's trace tells the entry that builds it (build._traced). `store`: the op-key cache's
    name for the op's own program (eager/op_store.py), or None when it may not be stored: a warm
    process loads that program at the first call, and the shared program that this entry builds is
    stored under a name of its own (op_store.shared_name).

    Only the second layout of a dense form shares: an op whose operands come in one layout only (a
    model's `linear` reading its weight transposed) keeps its one program (one compile, no copy per
    call); a dense entry's own program is the shared one for the layouts that come after it."""
    if kernel.name in _NOT_FOR or program.random or not records or "as_strided" in kernel.name:
        return None
    found = _candidates(program, records)
    template, writes, kept = _dense_form(program, found)
    shapes = [tuple(r.shape) for r in records]
    for spec in found:
        shapes[spec.slot] = spec.layout[0]
    key = shared_key(
        kernel,
        entry,
        program,
        template,
        writes,
        shapes,
        len(kept),
        tuple(entry.outs),
        entry.strides,
        matmul_precision(),  # (not torch's getter: it raises while per-backend settings disagree)
    )
    try:
        hash(key)
    except TypeError:  # an unhashable static argument: keep the one-program executable
        return None
    shared = _shared.get(key)
    if len(_shared) >= _MAX_KEPT and shared is None:
        _shared.clear()
    if not found:  # a dense entry: its program serves the layouts that densify to it
        if shared is None and not program.mutated_slots:
            _shared[key] = _OfEntry(entry)
        return None
    if shared is None:  # the first layout of this dense form: its own program, as before
        _shared[key] = _SEEN
        return None
    if shared is _SEEN or (program.mutated_slots and type(shared) is _OfEntry):
        shared = _shared[key] = _Jitted(entry.xla)
        jit_shared(
            shared,
            program,
            op_jit,
            f"{name} (dense operands)",
            store=op_store.shared_name(store, entry, "dense operands"),
            on_trace=on_trace,
            template=template,
            writes=writes,
            n_offsets=len(kept),
        )
    copies = [_dense_copy(spec, records[spec.slot], entry.xla, op_jit) for spec in found]
    parts = (entry, name, op_jit, shared, copies, kept, program)
    if program.mutated_slots:
        entry.fn_gated = _composite(*parts, "fn_gated", traced_function(program, gated=True), None)
    return _composite(*parts, "fn", fn, op_jit(entry, "fn", fn, name, store=store) if store else None)


_SEEN = object()  # a dense form seen once, in another layout


class _OfEntry:
    """The program of a dense entry (no written storage), shared: its function and checks."""

    __slots__ = ("entry",)

    def __init__(self, entry):
        self.entry = entry

    @property
    def fn(self):
        return self.entry.fn

    @property
    def checks(self):
        return self.entry.checks


def _composite(entry, name, op_jit, shared, copies, kept, program, attr, wrapped, stored):
    c = DenseOperands()
    c._stand_in(entry, attr, name, op_jit, wrapped, stored)
    c.shared, c.kept = shared, kept
    c.copies = [(spec.slot, copy, _offset_index(spec)) for spec, copy in copies]
    c.n_buffers, c.n_values, c.gated = program.n_buffers, program.n_values, 1 if attr == "fn_gated" else 0
    return c


def _offset_index(spec):
    off = spec.layout[2]
    return off.index if type(off) is DynOffset else None


def _is_dense(layout, record_numel):
    shape, stride, offset = layout[:3]
    return (
        type(offset) is int
        and offset == 0
        and math.prod(shape) == record_numel
        and (tuple(stride) == tuple(contiguous_strides(shape)))
    )


def _candidates(program, records):
    """The TensorArgs to make dense: read-only views of small storages, each the only read of its
    storage, that are not the whole storage in row-major order (or that read it as another dtype)."""
    specs = _tensor_args(program.template)
    written = {slot for slot, _, _ in program.writes}
    reads = {}
    for s in specs:
        reads[s.slot] = reads.get(s.slot, 0) + 1
    found = []
    for s in specs:
        shape, _, _, dtype, _ = s.layout
        r = records[s.slot]
        if s.slot in written or reads[s.slot] > 1 or dtype is dt.COMPLEX32 or not math.prod(shape):
            continue
        if dtype != dt.element(r.dtype) or any(s.bits):  # (a view as another dtype, lazy conj/neg bits)
            continue
        if _is_dense(s.layout, r.numel) or math.prod(shape) * dtype.itemsize > DENSE_BYTES:
            continue
        found.append(s)
    return found


def _dense_form(program, found):
    """The shared program's template (the found operands dense, whole storages of their shape), its
    writes and the traced offsets it keeps (renumbered)."""
    dense_slots = {s.slot for s in found}
    used, moved = kept_offsets(program, dense_slots)

    def dense(spec):
        if spec.slot in dense_slots:
            shape, dtype = spec.layout[0], spec.layout[3]
            return TensorArg(spec.slot, (shape, tuple(contiguous_strides(shape)), 0, dtype, math.prod(shape)))
        return spec._replace(layout=moved(spec.layout))

    template = _map_specs(copied(program.template), dense)
    writes = [(slot, moved(layout), bits) for slot, layout, bits in program.writes]
    return template, writes, used


def _dense_copy(spec, record, xla, op_jit):
    """(spec, the copy making its view a dense array of the view's shape): `fn(buffer, [offset])`."""
    layout = spec.layout
    off = layout[2]
    if type(off) is DynOffset:
        layout = layout[:2] + (off._replace(index=0),) + layout[3:]
    dtype = layout[3]
    if _on_host(layout, record):
        return spec, _HostDense(layout)
    key = (layout, tuple(record.shape), xla and tuple(sorted(xla.items())))
    copy = _copies.get(key)
    if copy is None:
        if len(_copies) >= _MAX_KEPT:
            _copies.clear()
        copy = _copies[key] = _Jitted(xla)

        def dense(buffer, *offsets):
            platform.require_x64()
            return views.read(buffer, at(layout, offsets)).astype(dt.stored(dtype))

        copy.fn = op_jit(copy, "fn", dense, f"a dense copy of a {layout[0]} view")
    return spec, copy


def _on_host(layout, record):
    """Whether the copy runs on the host: only where device buffers are host memory (XLA:CPU; a TPU
    keeps its device program, which the TPU compile check sees), for a small plain view."""
    if not tpu_check.host_work_allowed():
        return False
    dtype = layout[3]
    return math.prod(layout[0]) * dtype.itemsize <= HOST_DENSE_BYTES and dtype == dt.stored(dtype)


class _HostDense:
    """`fn(buffer, [offset])`: the view made dense on the host (XLA:CPU only: see _on_host), put back
    where the buffer lies. The same bits as the device copy: a copy of the elements, nothing computed."""

    __slots__ = ("layout",)

    def __init__(self, layout):
        self.layout = layout

    def fn(self, buffer, *offsets):
        shape, stride, off = self.layout[:3]
        if type(off) is DynOffset:
            off = int(offsets[0])  # (the C++ fast path may pass it as a kept device array)
        flat = np.asarray(buffer).reshape(-1)
        v = np.lib.stride_tricks.as_strided(flat[off:], shape, [st * flat.itemsize for st in stride], writeable=False)
        return jax.device_put(np.ascontiguousarray(v), buffer.sharding)
