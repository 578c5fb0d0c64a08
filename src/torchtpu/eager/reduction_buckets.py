"""Reductions and scans of a new length without an XLA compile of their own (XLA:CPU only).

A reduction or scan along one dim (or over every element) compiled one program per length of that
dim, and PyTorch's tests sweep lengths (test_index_put_accumulate_duplicate_indices: `cumsum` and
`max` once for each of 511 lengths). A lowering declaring `reduction_buckets=plan` (ops/reductions.py;
plan(*args, **kwargs) -> (dim or None, identity, scan) where the result does not depend on the
reduction's order) whose operand is the whole of a contiguous storage runs on that operand padded
along `dim` (flattened where dim is None) to the length's size bucket (eager/bucketed_draws.py
bucket_of, from 16) with the reduction's identity: -0.0 / 0 / False for sums (x + -0.0 is x, -0.0
included), 1 for products, the lowest value (-inf, the integer minimum, False) for max and argmax,
the highest for min, False for any, True for all. Pads come after the real elements, so an argmax's
ties go to the real one (the first index wins) and a scan's prefix is the real elements' alone (its
first `n` positions are kept). One program per (op, padded shape, dtypes, static arguments) instead
of one per length, the same bits as the exact program (tests/test_reduction_buckets.py).

The padding and the slicing run on the host (at most HOST_BYTES per call), so this serves only where
device buffers are host memory (XLA:CPU), as flat buckets do; on a TPU the exact program stays (the
TPU compile check sees it). An entry called more than TIER_UP times builds its own one-program
executable; a fused segment traces the one-program function (`__wrapped__`).
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
from .executable import TensorArg
from .flat_buckets import HOST_BYTES, _whole
from .stand_ins import TieringStandIn, _map_specs, _tensor_args, bucket_stand_in, copied, shared_key

SMALLEST = 16  # elements along the reduced dim: the smallest bucket
PLANS = declared_facts("reduction_buckets")
_shared: dict = {}
limits.FORGETTERS.append(_shared.clear)


class ReductionBucket(TieringStandIn):
    """`entry.fn` of a bucketed reduction or scan, called as the one-program executable is:
    (buffers..., values..., offsets...) -> (outputs..., [verdict])."""

    __slots__ = ("axis", "bucket", "cuts", "fill", "flatten", "n", "n_buffers", "shared", "slot")

    def __call__(self, *dyn):
        own = self._own_for(dyn)
        if own is not None:
            return own(*dyn)
        buffers = list(dyn[: self.n_buffers])
        b = buffers[self.slot]  # (host memory: XLA:CPU only, see _serves)
        x = np.asarray(b)
        if self.flatten:
            x = x.reshape(-1)
        axis = self.axis
        pad_shape = list(x.shape)
        pad_shape[axis] = self.bucket - self.n
        padded = np.concatenate([x, np.full(pad_shape, self.fill, x.dtype)], axis=axis)
        buffers[self.slot] = jax.device_put(padded, b.sharding)
        results = list(self.shared.fn(*buffers, *dyn[self.n_buffers :]))
        for i, (shape, cut) in enumerate(self.cuts):
            r = results[i]
            if cut:  # a scan's first n positions
                v = np.asarray(r)[(slice(None),) * axis + (slice(0, self.n),)]
            elif tuple(r.shape) != shape:  # a whole reduction's keepdim ones
                v = np.asarray(r).reshape(shape)
            else:
                continue
            results[i] = jax.device_put(np.ascontiguousarray(v), r.sharding)
        self.entry.checks = self.shared.checks
        return results


def identity(kind: str, dtype: np.dtype):
    """The pad value of a reduction `kind` for elements of numpy `dtype`, or None where it has none
    we use (floats without an infinity: float8 types)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return kind in ("prod", "min", "all")
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return {"sum": 0, "any": 0, "prod": 1, "all": 1, "max": info.min, "min": info.max}[kind]
    if np.issubdtype(dtype, np.complexfloating):
        return {"sum": complex(-0.0, -0.0), "any": 0, "all": 1}.get(kind)  # (a complex product is not served)
    if not np.isinf(np.array(np.inf, dtype)):
        return None
    return {"sum": -0.0, "any": 0.0, "prod": 1.0, "all": 1.0, "max": -np.inf, "min": np.inf}[kind]


def build(kernel, entry, program, fn, records, args, kwargs, name, op_jit, caster, store):
    """`entry.fn` as a ReductionBucket, or None. `caster(outs)`: the output cast of new contiguous
    outputs ((shape, dtype) each), as the engine builds it; `store`: the op-key cache's name for the
    op's own program (as flat_buckets.build)."""
    plan = PLANS.get(kernel.name)
    if plan is None or not _serves(entry, program, records):
        return None
    try:
        found = plan(*args, **kwargs)
    except TypeError:  # (a call the plan's signature does not take)
        return None
    if found is None:
        return None
    dim, kind, scan = found
    (spec,) = _tensor_args(program.template)
    shape, dtype = tuple(spec.layout[0]), spec.layout[3]
    record = records[spec.slot]
    if not _whole(spec.layout, shape, record) or not shape or math.prod(shape) == 0:
        return None
    flatten = dim is None
    axis = 0 if flatten else dim
    padded_shape = (math.prod(shape),) if flatten else shape
    n = padded_shape[axis]
    bucket = bucket_of(n, SMALLEST)
    if bucket == n and (not flatten or len(shape) == 1):
        return None  # (already its bucket's shape)
    fill = identity(kind, np.dtype(dtype))
    if fill is None:
        return None
    padded_shape = padded_shape[:axis] + (bucket,) + padded_shape[axis + 1 :]
    numel = math.prod(padded_shape)
    out_shapes = []
    cuts = []
    for out_shape, _ in entry.outs:
        out_shape = tuple(out_shape)
        if scan:
            if out_shape != shape:
                return None
            out_shapes.append(padded_shape)
            cuts.append((out_shape, True))
        elif flatten:
            if math.prod(out_shape) != 1:
                return None
            out_shapes.append(() if not out_shape else (1,))  # (keepdim over one flat dim)
            cuts.append((out_shape, False))
        else:
            out_shapes.append(out_shape)
            cuts.append((out_shape, False))
    if (
        numel * np.dtype(dtype).itemsize
        + sum(math.prod(s) * dt.element(d).itemsize for s, (_, d) in zip(out_shapes, entry.outs))
        > HOST_BYTES
    ):
        return None

    def padded(s):
        if s.slot != spec.slot:
            return s
        return TensorArg(s.slot, (padded_shape, tuple(contiguous_strides(padded_shape)), 0, dtype, numel), s.bits)

    template = _map_specs(copied(program.template), padded)
    outs = [(s, d) for s, (_, d) in zip(out_shapes, entry.outs)]
    shapes = [tuple(r.shape) for r in records]
    shapes[spec.slot] = padded_shape
    key = shared_key(kernel, entry, program, template, [], shapes, "reduction", tuple(outs))
    label = lambda: f"{name} ({bucket} along dim {'*' if flatten else axis})"
    changes = dict(template=template, outputs=caster(outs))
    c = bucket_stand_in(
        ReductionBucket, _shared, key, "reduction", label, entry, program, fn, name, op_jit, store, **changes
    )
    if c is None:
        return None
    c.n, c.bucket, c.axis, c.flatten, c.fill = n, bucket, axis, flatten, fill
    c.n_buffers, c.slot, c.cuts = program.n_buffers, spec.slot, cuts
    return c


def _serves(entry, program, records) -> bool:
    if not tpu_check.host_work_allowed() or program.random or not records:
        return False
    if entry.strides is not None or entry.nones is not None or program.writes or program.mutated_slots:
        return False
    if any(dt.element(d) is dt.COMPLEX32 for _, d in entry.outs):
        return False
    specs = _tensor_args(program.template)
    return len(specs) == 1 and len(records) == 1 and specs[0].bits == (False, False)
