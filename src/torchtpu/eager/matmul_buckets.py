"""Small matrix products of a new shape without an XLA compile of their own (XLA:CPU only).

An executable's key holds its operands' shapes and layouts, so `torch.matmul` over PyTorch's shape
sweeps (test_linalg's matmul_small_brute_force: matrix dims 0-3, batch dims 0-2, contiguous or not,
with and without out=) compiled a program per shape pair and layout for each of mm, bmm, mv, dot and
their out= overloads (~25 ms each; 774 of the 1d_Nd test's 934 compiles), and test_bmm/test_baddbmm
one per layout of their operands and out=. A lowering declaring `matmul_buckets="mk,kn->mn"`
(ops/linalg.py: the letters of each tensor operand's dims and of the result's; addmm, addmv, baddbmm,
addbmm too, with their in-place and out= overloads) runs a small call on its operands read through
their views on the host and zero-padded, each letter's size to its size bucket (eager/bucketed_draws.py
bucket_of, from SMALLEST): one program per (op, padded shapes, dtypes) instead of one per shape and
layout. Zero padding is exact for every dim: pad rows and columns make only result elements that are
cut away, and along a contracted dim (K, and an addbmm's batch) the product's first operand pads with
-0.0 and the second with 0 (as does an addmm's `self`), so each pad product is -0.0 and `x + -0.0` is
`x` (integer products stay exact). The sum along the contracted dim may group its terms otherwise than
the exact program does: a float result can differ in its last bits (as between two BLAS blockings;
padding M or N alone changes them too), so an entry's result may change so at its tier-up. Broadcast
operands (addmm's 1-d bias) and calls past HOST_BYTES keep their exact program.

The result is cut on the host from the padded one; an out= write is applied on the host to a copy of
the written storage through the out view's layout. So this serves only where device buffers are host
memory (XLA:CPU, at most HOST_BYTES per call); on a TPU the exact program stays (the TPU compile check
sees it). An entry called more than TIER_UP times builds its own one-program executable; a fused
segment traces the one-program function (`__wrapped__`).
"""

from __future__ import annotations

import math

import jax
import numpy as np

from ..ops import dtypes as dt
from ..ops.table import declared_facts
from ..storage.records import contiguous_strides
from . import limits, tpu_check
from .bucketed_draws import bucket_of
from .executable import DynOffset, TensorArg
from .stand_ins import TieringStandIn, _map_specs, bucket_stand_in, copied, shared_key

SMALLEST = 4  # elements along a dim: the smallest bucket (PyTorch's sweeps: matrix dims 0-3)
HOST_BYTES = 1 << 19  # the padded operands and result of one call (and a written storage), in bytes, at most
PLANS = declared_facts("matmul_buckets")
_shared: dict = {}
limits.FORGETTERS.append(_shared.clear)


class MatmulBucket(TieringStandIn):
    """`entry.fn` of a bucketed matrix product, called as the one-program executable is:
    (buffers..., values..., offsets...) -> (outputs..., written buffers..., [verdict])."""

    __slots__ = ("n_buffers", "n_values", "reads", "result", "shared", "write")

    def __call__(self, *dyn):
        own = self._own_for(dyn)
        if own is not None:
            return own(*dyn)
        n_buffers = self.n_buffers
        values, offsets = dyn[n_buffers : n_buffers + self.n_values], dyn[n_buffers + self.n_values :]
        buffers = list(dyn[:n_buffers])
        for slot, layout, bits, padded, pad_value in self.reads:  # (host memory: XLA:CPU only, see _serves)
            v = _view(np.asarray(dyn[slot]), layout, offsets)
            if bits[0]:
                v = np.conj(v)
            if bits[1]:
                v = np.negative(v)
            a = np.full(padded, pad_value, v.dtype)
            a[tuple(slice(0, n) for n in v.shape)] = v
            buffers[slot] = jax.device_put(a, dyn[slot].sharding)
        write = self.write
        if write is not None and write[3]:  # (an out= storage the op does not read)
            slot, padded = write[0], write[2]
            buffers[slot] = jax.device_put(np.zeros(padded, np.asarray(dyn[slot]).dtype), dyn[slot].sharding)
        results = list(self.shared.fn(*buffers, *values))
        r = results[0]
        cut = np.asarray(r)[tuple(slice(0, n) for n in self.result)]
        if write is None:
            results[0] = jax.device_put(np.array(cut), r.sharding)  # (a 0-dim cut stays 0-dim)
        else:  # the written view's new values, in a copy of its storage
            slot, layout = write[0], write[1]
            old = dyn[slot]
            storage = np.array(np.asarray(old))
            _view(storage, layout, offsets, writeable=True)[...] = cut
            results[0] = jax.device_put(storage, old.sharding)
        self.entry.checks = self.shared.checks
        return results


def _view(storage, layout, offsets, writeable=False):
    """The view `layout` (shape, strides, offset, ...) of a storage's array, as numpy strides."""
    shape, stride, off = layout[0], layout[1], layout[2]
    if type(off) is DynOffset:
        off = int(np.asarray(offsets[off.index]))
    flat = storage.reshape(-1)
    return np.lib.stride_tricks.as_strided(
        flat[off:], tuple(shape), [s * flat.itemsize for s in stride], writeable=writeable
    )


def _letters(plan):
    inputs, result = plan.split("->")
    return inputs.split(","), result


def build(kernel, entry, program, fn, records, name, op_jit, caster, store):
    """`entry.fn` as a MatmulBucket, or None. `caster(outs)`: the output cast of new contiguous outputs
    ((shape, dtype) each), as the engine builds it; `store`: the op-key cache's name for the op's own
    program (as flat_buckets.build)."""
    plan = PLANS.get(kernel.name)
    if plan is None or not _serves(entry, program, records):
        return None
    operands, result = _letters(plan)
    args, kwargs = program.template
    specs = [a for a in args if type(a) is TensorArg]
    out_spec = kwargs.get("out")
    if len(specs) != len(operands) or any(type(a) is TensorArg for k, a in kwargs.items() if k != "out"):
        return None
    sizes: dict = {}
    for spec, letters in zip(specs, operands):
        shape = tuple(spec.layout[0])
        if len(shape) != len(letters) or np.dtype(spec.layout[3]) != np.dtype(dt.element(records[spec.slot].dtype)):
            return None  # (a broadcast operand: addmm's bias; a view of another dtype)
        for letter, n in zip(letters, shape):
            if sizes.setdefault(letter, n) != n:
                return None  # (the op raises PyTorch's error; a plan's sizes agree otherwise)
    real = tuple(sizes[c] for c in result)
    bucket = {c: bucket_of(n, SMALLEST) for c, n in sizes.items()}
    padded_of = [tuple(bucket[c] for c in letters) for letters in operands]
    padded_result = tuple(bucket[c] for c in result)
    if all(tuple(s.layout[0]) == p for s, p in zip(specs, padded_of)) and real == padded_result:
        return None  # (already its bucket's shapes: the program is shared as it is)
    contracted = set("".join(operands)) - set(result)
    slots = [s.slot for s in specs]
    if len(set(slots)) != len(slots):
        return None  # (one storage read twice: its padded forms would differ)
    if program.writes:  # out=, or an in-place op writing its first operand (as it read it)
        if len(program.writes) != 1 or entry.outs:
            return None
        (slot, layout, bits) = program.writes[0]
        if bits != (False, False) or tuple(layout[0]) != real:
            return None
        if np.dtype(layout[3]) != np.dtype(dt.element(records[slot].dtype)):
            return None
        if out_spec is not None:
            if slot != out_spec.slot or slot in slots:
                return None
        elif slot != slots[0] or operands[0] != result or layout != specs[0].layout:
            return None
        out_dtype = layout[3]
    else:
        if out_spec is not None or len(entry.outs) != 1 or tuple(entry.outs[0][0]) != real:
            return None
        out_dtype = dt.element(entry.outs[0][1])
    itemsize = np.dtype(out_dtype).itemsize
    total = sum(math.prod(p) * np.dtype(s.layout[3]).itemsize for s, p in zip(specs, padded_of))
    total += math.prod(padded_result) * itemsize
    if program.writes:
        total += records[program.writes[0][0]].nbytes
    if total > HOST_BYTES:
        return None

    padded_shapes = dict(zip(slots, padded_of))
    if out_spec is not None:
        padded_shapes[out_spec.slot] = padded_result

    def padded(spec):  # (a whole contiguous storage of the padded shape, read without conj/neg bits)
        p = padded_shapes.get(spec.slot)
        if p is None:
            return spec
        return TensorArg(spec.slot, (p, tuple(contiguous_strides(p)), 0, spec.layout[3], math.prod(p)), (False, False))

    template = _map_specs(copied(program.template), padded)
    shapes = [tuple(r.shape) for r in records]
    for s, p in zip(specs, padded_of):
        shapes[s.slot] = p
    writes, outs = [], []
    if program.writes:
        slot = program.writes[0][0]
        shapes[slot] = padded_result
        layout = (padded_result, tuple(contiguous_strides(padded_result)), 0, out_dtype, math.prod(padded_result))
        writes = [(slot, layout, (False, False))]
    else:
        outs = [(padded_result, entry.outs[0][1])]
    program = program._replace(n_offsets=0)
    key = shared_key(kernel, entry, program, template, writes, shapes, "matmul", tuple(outs))
    label = lambda: f"{name} (padded to {'x'.join(map(str, padded_result)) or 'a scalar'})"
    changes = dict(template=template, writes=writes, outputs=caster(outs))
    c = bucket_stand_in(MatmulBucket, _shared, key, "matmul", label, entry, program, fn, name, op_jit, store, **changes)
    if c is None:
        return None
    c.n_buffers, c.n_values, c.result = program.n_buffers, program.n_values, real
    c.reads = []
    first = next(i for i, letters in enumerate(operands) if contracted & set(letters))
    for i, (s, p) in enumerate(zip(specs, padded_of)):
        # the product's first operand pads with -0.0 (0 for integers), the rest with 0: a pad product is -0.0
        c.reads.append((s.slot, s.layout, s.bits, p, -0.0 if i == first else 0))
    c.write = None
    if program.writes:
        slot, layout, _ = program.writes[0]
        c.write = (slot, layout, padded_result, slot not in slots)
    return c


def _serves(entry, program, records) -> bool:
    if not tpu_check.host_work_allowed() or program.random or not records:
        return False
    if entry.strides is not None or entry.nones is not None:
        return False
    return not any(dt.element(d) is dt.COMPLEX32 for _, d in entry.outs)
