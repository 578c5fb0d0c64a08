"""Small elementwise ops of a new shape without an XLA compile of their own (XLA:CPU only).

PyTorch's test files compare every result (`assertEqual`: isclose, then all) and make their inputs
(`make_tensor`: mul, masked_fill_) per shape, so each new shape compiled each of those programs
again (test_tensor_creation_ops: ~1,000 of its ~3,000 compiles). An op whose lowering declares
`flat_buckets=True` (ops/table.py: elementwise, the same computation on every element, nothing that
rounds by position: comparisons, isclose, where, masked_fill, mul, add, sub, abs, casts) and whose
result is a new contiguous tensor or a whole contiguous storage runs on flat arrays padded to the
element count's size bucket (eager/bucketed_draws.py bucket_of): one program per (op, bucket,
dtypes, static arguments) instead of one per shape. Each operand is 0-dim (kept as it is), the whole
contiguous storage of the result's shape (flattened), or, since the fifteenth session, a view of its
storage (every other element, a row at a traced offset) or an operand broadcasting to the result's
shape (test_binary_ufuncs' `(3, 1, 2)` against `(1, 3, 2)`): read on the host through its shape,
strides and offset and broadcast to the result's shape (a copy of elements: nothing computed), so
every layout and broadcast of a bucket shares the program. The padding repeats the first element
(whatever an op checks or raises on holds for the real elements already), and the results' first
elements are the exact-shape program's, bit for bit (tests/test_flat_buckets.py).

The padding and the slicing back run on the host, so this serves only where device buffers are host
memory (XLA:CPU, for storages of at most HOST_BYTES together): on a TPU, padding on the device
would be two more programs per shape, and the exact program stays (the TPU compile check sees it).
An entry called more than TIER_UP times builds its own one-program executable; a fused segment
traces the one-program function (`__wrapped__`).
"""

from __future__ import annotations

import math

import jax
import numpy as np

from ..ops import dtypes as dt
from ..ops.resolve import functional_twin
from ..ops.table import declared_facts
from ..storage.records import contiguous_strides
from . import limits, tpu_check
from .bucketed_draws import bucket_of
from .executable import TensorArg
from .stand_ins import TieringStandIn, _map_specs, _tensor_args, bucket_stand_in, copied, kept_offsets, shared_key

HOST_BYTES = 1 << 16  # the padded arrays of one call, in bytes, at most
FLAT = declared_facts("flat_buckets")
_shared: dict = {}
limits.FORGETTERS.append(_shared.clear)


class FlatBucket(TieringStandIn):
    """`entry.fn` of a flat-bucketed elementwise op, called as the one-program executable is:
    (buffers..., values..., offsets...) -> (outputs..., written buffers..., [verdict])."""

    __slots__ = (
        "bucket",
        "kept",
        "n",
        "n_buffers",
        "n_sliced",
        "n_values",
        "reads",
        "shape",
        "shapes",
        "shared",
        "slots",
    )

    def __call__(self, *dyn):
        own = self._own_for(dyn)
        if own is not None:
            return own(*dyn)
        n, shared, nb = self.n, self.shared, self.n_buffers
        buffers = list(dyn[:nb])
        offsets = dyn[nb + self.n_values :]
        bucket = self.bucket
        for s, read in zip(self.slots, self.reads):  # (host memory: XLA:CPU only, see _serves)
            b = buffers[s]
            flat = np.asarray(b).reshape(-1)
            if read is not None:  # a view of its storage, or an operand broadcast to the result's shape
                shape, stride, off = read
                if type(off) is not int:  # (a DynOffset: the view's traced storage offset)
                    off = int(offsets[off.index])  # (the C++ fast path may pass it as a kept device array)
                v = np.lib.stride_tricks.as_strided(
                    flat[off:], shape, [st * flat.itemsize for st in stride], writeable=False
                )
                flat = np.broadcast_to(v, self.shape).reshape(-1)
            padded = np.empty((bucket,), flat.dtype)
            padded[:n] = flat
            padded[n:] = flat[0]
            buffers[s] = jax.device_put(padded, b.sharding)
        results = list(shared.fn(*buffers, *dyn[nb : nb + self.n_values], *(offsets[i] for i in self.kept)))
        for i, shape in zip(range(self.n_sliced), self.shapes):
            r = results[i]
            results[i] = jax.device_put(np.asarray(r)[:n].reshape(shape), r.sharding)
        self.entry.checks = shared.checks
        return results


def declared(kernel) -> bool:
    """Whether the op (or the functional op of an in-place or out= overload) declares flat_buckets."""
    if FLAT.get(kernel.name):
        return True
    twin = functional_twin(kernel.op)
    if twin is None:
        return False
    schema = twin[0]._schema
    return bool(FLAT.get(f"{schema.name.split('::')[1]}.{schema.overload_name or 'default'}"))


def build(kernel, entry, program, fn, records, name, op_jit, caster, store):
    """`entry.fn` as a FlatBucket, or None. `caster(outs)`: the output cast of new contiguous outputs
    `outs` ((shape, dtype) each), as the engine builds it (build._output_caster). `store`: the op-key
    cache's name for the op's own program (eager/op_store.py), or None when it may not be stored: a warm
    process loads that program at the first call instead of the bucket's, and the bucket's program
    that this entry builds is stored under a name of its own (op_store.shared_name)."""
    reads = _serves(kernel, entry, program, records)
    if reads is None:
        return None
    shape = entry.outs[0][0] if entry.outs else program.writes[0][1][0]
    n = math.prod(shape)
    bucket = bucket_of(n)
    flat_slots = sorted(set(reads) | {slot for slot, _, _ in program.writes})
    if (
        sum(bucket * records[s].dtype.itemsize for s in flat_slots)
        + sum(bucket * dt.element(d).itemsize for _, d in entry.outs)
        > HOST_BYTES
    ):
        return None
    kept, moved = kept_offsets(program, set(flat_slots))

    def flat(spec):
        if spec.slot not in flat_slots:
            return spec._replace(layout=moved(spec.layout))
        dtype = spec.layout[3]
        return TensorArg(spec.slot, ((bucket,), (1,), 0, dtype, bucket), spec.bits)

    template = _map_specs(copied(program.template), flat)
    writes = [(slot, ((bucket,), (1,), 0, lay[3], bucket), bits) for slot, lay, bits in program.writes]
    outs = [((bucket,), d) for _, d in entry.outs]
    shapes = [tuple(r.shape) for r in records]
    for s in flat_slots:
        shapes[s] = (bucket,)
    key = shared_key(kernel, entry, program, template, writes, shapes, bucket, tuple(outs), len(kept))
    label = lambda: f"{name} (flat, {bucket} elements)"
    changes = dict(template=template, writes=writes, outputs=caster(outs), n_offsets=len(kept))
    c = bucket_stand_in(FlatBucket, _shared, key, "flat", label, entry, program, fn, name, op_jit, store, **changes)
    if c is None:
        return None
    c.n, c.shape, c.kept = n, tuple(shape), tuple(kept)
    c.n_buffers, c.n_values, c.slots, c.bucket = program.n_buffers, program.n_values, tuple(flat_slots), bucket
    c.reads = tuple(reads.get(s) for s in flat_slots)
    c.shapes = [s for s, _ in entry.outs] + [tuple(records[slot].shape) for slot in program.mutated_slots]
    c.n_sliced = len(c.shapes)
    return c


def _whole(layout, shape, record):
    """A contiguous view of the whole of its storage, of `shape` and the storage's dtype."""
    s, stride, off, dtype, numel = layout
    return (
        s == shape
        and type(off) is int
        and off == 0
        and numel == math.prod(shape)
        and tuple(record.shape) == tuple(shape)
        and tuple(stride) == tuple(contiguous_strides(shape))
        and dtype == dt.element(record.dtype)
        and dtype is not dt.COMPLEX32
    )


def _read(layout, shape, record):
    """How the host reads an operand that is not the whole of its storage as the result's `shape`:
    (its shape, strides, storage offset: an int or its DynOffset), or None where it is not a plain
    view of its storage (another dtype, packed complex32) broadcasting to `shape`."""
    s, stride, off, dtype, _ = layout
    if dtype != dt.element(record.dtype) or dtype is dt.COMPLEX32 or len(s) > len(shape):
        return None
    if any(a != b and a != 1 for a, b in zip(reversed(s), reversed(shape))):
        return None
    return tuple(s), tuple(stride), off


def _serves(kernel, entry, program, records):
    """{slot: None (the whole storage) or how the host reads it (_read)} of the operands flattened, or
    None where the op is not served."""
    if not tpu_check.host_work_allowed() or program.random or not records:
        return None
    if entry.strides is not None or entry.nones is not None or not declared(kernel):
        return None
    if any(dt.element(d) is dt.COMPLEX32 for _, d in entry.outs):  # (stored packed: no flat array of it)
        return None
    shapes = {tuple(s) for s, _ in entry.outs} | {tuple(lay[0]) for _, lay, _ in program.writes}
    if len(shapes) != 1:
        return None
    (shape,) = shapes
    n = math.prod(shape)
    if n < 2 or len(shape) == 0:
        return None
    if any(records[slot].numel != n for slot in program.mutated_slots):
        return None
    if any(not _whole(lay, shape, records[slot]) for slot, lay, _ in program.writes):
        return None
    specs = _tensor_args(program.template)
    written = {slot for slot, _, _ in program.writes}
    reads = {}
    for s in specs:
        if s.layout[0] == ():
            continue
        if s.slot in reads:  # (a storage read twice: its padded array is one of the reads only)
            return None
        reads[s.slot] = None if _whole(s.layout, shape, records[s.slot]) else _read(s.layout, shape, records[s.slot])
        if reads[s.slot] is not None and s.slot in written:
            return None  # (a written storage read through another view)
        if reads[s.slot] is None and not _whole(s.layout, shape, records[s.slot]):
            return None
    if bucket_of(n) == n and len(shape) == 1 and all(r is None for r in reads.values()):
        return None  # (already its bucket's flat array)
    # (a 0-dim operand broadcasts over the flat array as over the shape, unless it is an element of a
    # flattened storage: `ts == ts[i]` reads one storage twice, and the padded array is not its layout)
    flat = set(reads) | written
    if any(s.layout[0] == () and s.slot in flat for s in specs):
        return None
    return reads
