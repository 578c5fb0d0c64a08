"""Membership tests (`isin`) of new shapes and dtypes without an XLA compile of their own (XLA:CPU only).

`isin(elements, test_elements)` compiled one program per (elements shape, test_elements shape, dtype
pair, assume_unique): test_sort_and_select's test_isin* made 503 of its sort slice's 951 compiles that
way (docs/upstream_tests.md, "Cold start, fifteenth session"). Its elements are elementwise and its
test elements a set: a lowering declaring `set_buckets=names` (ops/elementwise.py isin: operand 0
elementwise, operand 1 the set; `names`: static arguments the lowering does not read, left out of the key)
whose two operands are whole contiguous storages runs on both flattened and padded to their own
element count's size bucket (eager/bucketed_draws.py bucket_of, from 16): the elements with copies
of their first element (results sliced away), the set with copies of its first element (the same
set: every answer unchanged, NaN included). Operands of two dtypes are cast on the host to the dtype
the op compares in (torch.result_type of the real operands) where that cast keeps every value (bool
to anything, integers to wider integers or to floats holding all of their values, floats to wider
floats), else keep their dtype (the program promotes them as before, where the padded operands'
result type is the real one's). One program per (common dtype, two buckets, invert) instead of one
per shape and dtype pair, the same bits as the exact program (tests/test_set_buckets.py).

The padding, casts and slicing run on the host (at most HOST_BYTES per call), so this serves only
where device buffers are host memory (XLA:CPU), as flat buckets do; on a TPU the exact program stays
(the TPU compile check sees it). An entry called more than TIER_UP times builds its own one-program
executable; a fused segment traces the one-program function (`__wrapped__`).
"""

from __future__ import annotations

import math

import jax
import numpy as np
import torch

from ..ops import dtypes as dt
from ..ops.table import declared_facts
from . import limits, tpu_check
from .bucketed_draws import bucket_of
from .dense_operands import _is_dense
from .executable import TensorArg
from .flat_buckets import HOST_BYTES
from .stand_ins import TieringStandIn, _map_specs, _tensor_args, bucket_stand_in, copied, shared_key

SMALLEST = 16  # elements of either operand: the smallest bucket
MAX_PAIRS = 1 << 20  # padded (element, test element) pairs compared at most (the exact program's stays)
SETS = declared_facts("set_buckets")
_shared: dict = {}
limits.FORGETTERS.append(_shared.clear)


class SetBucket(TieringStandIn):
    """`entry.fn` of a set-bucketed op, called as the one-program executable is:
    (buffers..., values..., offsets...) -> (outputs...)."""

    __slots__ = ("n", "n_buffers", "pads", "shape", "shared")

    def __call__(self, *dyn):
        own = self._own_for(dyn)
        if own is not None:
            return own(*dyn)
        buffers = list(dyn[: self.n_buffers])
        for slot, bucket, cast in self.pads:  # (host memory: XLA:CPU only, see _serves)
            b = buffers[slot]
            flat = np.asarray(b).reshape(-1)
            padded = np.empty((bucket,), cast or flat.dtype)
            padded[: flat.size] = flat
            padded[flat.size :] = flat[0]
            buffers[slot] = jax.device_put(padded, b.sharding)
        results = list(self.shared.fn(*buffers, *dyn[self.n_buffers :]))
        r = results[0]
        results[0] = jax.device_put(np.asarray(r)[: self.n].reshape(self.shape), r.sharding)
        self.entry.checks = self.shared.checks
        return results


def exact_cast(source: torch.dtype, target: torch.dtype) -> bool:
    """Whether every value of `source` is one of `target` (a host cast between them is exact: the
    same bits as the program's own conversion)."""
    if source == target or source == torch.bool:
        return True
    if source.is_complex or target.is_complex or target == torch.bool:
        return False
    if source.is_floating_point:
        return (
            target.is_floating_point
            and torch.finfo(target).bits > torch.finfo(source).bits
            and (
                torch.finfo(target).eps <= torch.finfo(source).eps
                and torch.finfo(target).max >= torch.finfo(source).max
            )
        )
    info = torch.iinfo(source)
    if target.is_floating_point:  # every integer up to 2**digits is a float of `target`
        digits = -int(math.log2(torch.finfo(target).eps)) + 1
        return max(abs(info.min), info.max) <= 2**digits
    other = torch.iinfo(target)
    return other.min <= info.min and info.max <= other.max


def build(kernel, entry, program, fn, records, name, op_jit, caster, store):
    """`entry.fn` as a SetBucket, or None. `caster(outs)`, `store`: as flat_buckets.build's."""
    ignored = SETS.get(kernel.name)
    if ignored is None or not _serves(entry, program, records):
        return None
    args, kwargs = program.template
    if len(args) < 2 or type(args[0]) is not TensorArg or type(args[1]) is not TensorArg:
        return None
    specs = (args[0], args[1])
    if specs[0].slot == specs[1].slot or any(s.bits != (False, False) for s in specs):
        return None
    shapes = [tuple(s.layout[0]) for s in specs]
    if not all(
        _is_dense(s.layout, records[s.slot].numel) and s.layout[3] == dt.element(records[s.slot].dtype) for s in specs
    ):
        return None  # (a whole storage in row-major order, of any shape: flattened either way)
    (out_shape, out_dtype), *more = entry.outs
    if more or tuple(out_shape) != shapes[0]:
        return None
    torch_dtypes = [records[s.slot].dtype for s in specs]
    if any(d.is_complex for d in torch_dtypes):
        return None
    metas = [torch.empty(shape, dtype=d, device="meta") for shape, d in zip(shapes, torch_dtypes)]
    common = torch.result_type(*metas)
    counts = [math.prod(shape) for shape in shapes]
    if min(counts) == 0:
        return None
    buckets = [bucket_of(n, SMALLEST) for n in counts]
    if buckets[0] * buckets[1] > MAX_PAIRS:
        return None
    casts = [common if d != common and exact_cast(d, common) else None for d in torch_dtypes]
    kept = [c or d for c, d in zip(casts, torch_dtypes)]
    padded_metas = [torch.empty((b,), dtype=d, device="meta") for b, d in zip(buckets, kept)]
    if torch.result_type(*padded_metas) != common:
        return None  # (flattening a 0-dim operand would change what it compares in)
    nbytes = sum(b * dt.to_jax(d).itemsize for b, d in zip(buckets, kept)) + buckets[0] * dt.element(out_dtype).itemsize
    if nbytes > HOST_BYTES:
        return None
    if all(c is None for c in casts) and buckets == counts and all(len(s) == 1 for s in shapes):
        if not any(kwargs.get(k) for k in ignored):
            return None  # (already its bucket's program)

    def flat(spec):
        i = 0 if spec is specs[0] else 1 if spec is specs[1] else None
        if i is None:
            return spec
        b, jd = buckets[i], dt.to_jax(kept[i])
        return TensorArg(spec.slot, ((b,), (1,), 0, jd, b), spec.bits)

    template = _map_specs(copied(program.template), flat)
    for k in ignored:  # (arguments the lowering does not read: keyed as left out)
        template[1].pop(k, None)
    outs = [((buckets[0],), out_dtype)]
    buffer_shapes = [tuple(r.shape) for r in records]
    for s, b in zip(specs, buckets):
        buffer_shapes[s.slot] = (b,)
    key = shared_key(kernel, entry, program, template, [], buffer_shapes, "set", tuple(outs))
    label = lambda: f"{name} (set, {buckets[0]} x {buckets[1]})"
    changes = dict(template=template, outputs=caster(outs))
    c = bucket_stand_in(SetBucket, _shared, key, "set", label, entry, program, fn, name, op_jit, store, **changes)
    if c is None:
        return None
    c.n, c.shape, c.n_buffers = counts[0], shapes[0], program.n_buffers
    c.pads = tuple(
        (s.slot, b, None if cast is None else np.dtype(dt.to_jax(cast))) for s, b, cast in zip(specs, buckets, casts)
    )
    return c


def _serves(entry, program, records) -> bool:
    if not tpu_check.host_work_allowed() or program.random or len(records) != 2:
        return False
    if entry.strides is not None or entry.nones is not None or program.writes or program.mutated_slots:
        return False
    return type(program.template) is tuple and len(_tensor_args(program.template)) == 2
