"""Batched matrix ops (decompositions, solves) without a program per batch shape.

An executable's key holds its inputs' shapes, so `torch.linalg.lu_factor` of a (2, 3, 5, 5), a (6, 5, 5)
and a (3, 5, 5) input each compiled a decomposition of its own: 0.3-2 s of XLA:CPU compile each, and
PyTorch's linalg tests sweep batch shapes ((), (0,), (2,), (2, 3), (3, 2, 1), ...) for every matrix
shape and flag. These ops compute each matrix of the batch alone, so a lowering that declares
`matrix_batches=plan` (ops/table.py; plan(*args, **kwargs) names the batched tensor arguments, the
number of their trailing core dims and how to pad them, or None for a call it does not fit) runs a
call with batch dims as one call of the same op on a flat batch: each operand reshaped to
(n, *core) and padded to the count's size bucket (eager/bucketed_draws.py bucket_of) with matrices
that make the op well defined (identity matrices, zero right-hand sides, the identity permutation's
pivots), whose results are dropped. So every batch shape with the same matrix shapes and flags
shares one program per bucket. The padding comes last, so the real elements keep their flat
indices: a singular matrix is reported as the CPU reports it (`info` of the `_ex` ops and the
"(Batch element i)" of `check_errors`, both read from the real elements only). The results are
the bucket's results' first n elements, reshaped to the batch shape: new tensors over the bucket
results' storages (the same strides the CPU gives a batch), not views.

A call already flat (one batch dim whose size is a bucket), without batch dims, with an empty batch,
with operands whose batch shapes differ (broadcasting) or that are not plain tpu tensors, runs as
before. The padding and reshapes are small ops: the reshape of a contiguous operand is a view, the
padding a `cat` (made on the host for small tensors on XLA:CPU: eager/host_cat.py) of the operand
and an `eye`/`zeros` fill (eager/host_fills.py).
"""

from __future__ import annotations

import math

import torch

from ..ops.table import declared_facts
from .bucketed_draws import bucket_of

# the pads a plan names: identity matrices (rectangular for a non-square core), zeros, and the pivots
# of the identity permutation (1-based, LAPACK's)
EYE, ZEROS, PIVOTS = "eye", "zeros", "pivots"

PLANS = declared_facts("matrix_batches")


def serve(kernel, args, kwargs):
    """The op's results through a flat, bucket-padded batch, or None where the call runs as it is
    (eager/engine.py `split_call`)."""
    plan_of = PLANS.get(kernel.name)
    plan = plan_of(*args, **kwargs) if plan_of is not None else None
    if not plan:
        return None
    located = _locate(kernel, args, kwargs, plan)
    if located is None:
        return None
    batch = located[0][1].shape[: located[0][1].dim() - located[0][2]]
    n = math.prod(batch)
    if not batch or n == 0:
        return None
    bucket = bucket_of(n, 1)
    if len(batch) == 1 and n == bucket:
        return None
    args, kwargs = list(args), dict(kwargs)
    for where, t, core, fill in located:
        flat = t.reshape(n, *t.shape[t.dim() - core :])
        if bucket > n:
            flat = torch.cat([flat, _pad(fill, bucket - n, flat)])
        if type(where) is int:
            args[where] = flat
        else:
            kwargs[where] = flat
    results = kernel(*args, **kwargs)
    if isinstance(results, torch.Tensor):
        return _unflat(results, bucket, n, batch)
    return type(results)(_unflat(r, bucket, n, batch) for r in results)


def _locate(kernel, args, kwargs, plan):
    """[(position or name, tensor, core dims, fill)] of the plan's arguments, or None where one is
    missing, not a plain tpu tensor, or of another batch shape than the first."""
    positions = {a.name: i for i, a in enumerate(kernel.op._schema.arguments)}
    found, batch = [], None
    for name, core, fill in plan:
        i = positions[name]
        if i < len(args):
            where, t = i, args[i]
        elif name in kwargs:
            where, t = name, kwargs[name]
        else:
            return None
        if type(t) is not torch.Tensor or t.device.type != "tpu" or t.dim() < core or t.dtype == torch.complex32:
            return None
        shape = t.shape[: t.dim() - core]
        if batch is None:
            batch = shape
        elif shape != batch:
            return None
        found.append((where, t, core, fill))
    return found


def _pad(fill, count, flat):
    """`count` padding elements for `flat` (n, *core)."""
    core = flat.shape[1:]
    if fill == EYE:
        return torch.eye(core[0], core[1], dtype=flat.dtype, device=flat.device).expand(count, *core)
    if fill == PIVOTS:
        return torch.arange(1, core[0] + 1, dtype=flat.dtype, device=flat.device).expand(count, *core)
    return torch.zeros(count, *core, dtype=flat.dtype, device=flat.device)


def _unflat(r, bucket, n, batch):
    """The first n elements of a bucket's result `r`, with the batch dims for its first; `r` itself
    where it has no batch dim (lstsq's empty residuals)."""
    if not isinstance(r, torch.Tensor) or r.dim() == 0 or r.shape[0] != bucket:
        return r
    step = r.stride(0)
    strides = [step * math.prod(batch[i + 1 :]) for i in range(len(batch))]
    shape = (*batch, *r.shape[1:])
    out = torch.empty(0, dtype=r.dtype, device=r.device)
    return out.set_(r.untyped_storage(), r.storage_offset(), shape, (*strides, *r.stride()[1:]))
