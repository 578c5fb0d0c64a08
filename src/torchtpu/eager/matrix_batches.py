"""Batched matrix ops (decompositions, solves) without a program per batch shape.

An executable's key holds its inputs' shapes, so `torch.linalg.lu_factor` of a (2, 3, 5, 5), a (6, 5, 5)
and a (3, 5, 5) input each compiled a decomposition of its own: 0.3-2 s of XLA:CPU compile each, and
PyTorch's linalg tests sweep batch shapes ((), (0,), (2,), (2, 3), (3, 2, 1), ...) for every matrix
shape and flag. These ops compute each matrix of the batch alone, so a lowering that declares
`matrix_batches=plan` (ops/table.py; plan(*args, **kwargs) names the batched tensor arguments, the
number of their trailing core dims and how to pad them, or None for a call it does not fit) runs a
call with batch dims as one call of the same op on a flat batch: each operand reshaped to
(n, *core) and padded to the count's size bucket (eager/bucketed_draws.py bucket_of; small
matrices at least 16 of them) with matrices
that make the op well defined (identity matrices, zero right-hand sides, the identity permutation's
pivots), whose results are dropped. So every batch shape with the same matrix shapes and flags
shares one program per bucket. The padding comes last, so the real elements keep their flat
indices: a singular matrix is reported as the CPU reports it (`info` of the `_ex` ops and the
"(Batch element i)" of `check_errors`, both read from the real elements only). The results are
the bucket's results' first n elements, reshaped to the batch shape (the strides the CPU gives a
batch): on XLA:CPU new storages of exactly those elements, cut on the host; elsewhere new tensors
(not views) over the bucket results' storages.

Operands whose batch shapes differ are expanded to the broadcast batch shape where the plan marks
them BROADCAST (the results then have that batch shape: a solve's right-hand side; not the factors of
`_linalg_solve_ex` or the ranks of `lstsq`, which keep A's). A call already flat (one batch dim whose
size is a bucket), without batch dims, with an empty batch, or with operands that are not plain tpu
tensors runs as before.

The flat operands are new storages of the bucket's shape (the engine keys a program by its storages'
shapes too: a reshaped view of a (2, 2, n, n) storage keyed another program than a (4, n, n) one).
On XLA:CPU, small ones (HOST_BYTES) are made on the host, as eager/host_cat.py makes a cat: each
operand read through its view from its storage's array, the pads appended, no program; elsewhere (a
TPU, the TPU compile check, large operands) by a reshape and a `cat` with an `eye`/`zeros` fill on
the device (a small program per batch shape and layout, where the op's own would compile).
"""

from __future__ import annotations

import math
import warnings

import jax
import numpy as np
import torch
from torch.utils import _pytree as pytree

from ..ops.table import declared_facts
from ..storage.records import RECORDS, new_tensor, storage_shape
from . import fusion, interrupts, tpu_check
from .bucketed_draws import bucket_of
from .build import META_CHECKS, META_OVERRIDES
from .executable import input_buffers

HOST_BYTES = 1 << 20  # the flat padded operands' bytes at most made on the host (as eager/host_cat.py's)

# the pads a plan names: identity matrices (rectangular for a non-square core), zeros, and the pivots
# of the identity permutation (1-based, LAPACK's); a fourth element BROADCAST marks an argument whose
# batch dims the op broadcasts against the others' (expanded to the common batch shape first)
EYE, ZEROS, PIVOTS, BROADCAST = "eye", "zeros", "pivots", "broadcast"

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
    batch, located = located
    n = math.prod(batch)
    if not batch or n == 0:
        return None
    bucket = _bucket(n, max(math.prod(t.shape[t.dim() - core :]) for _, t, core, _ in located))
    if len(batch) == 1 and n == bucket:
        return None
    if not _meta_accepts(kernel, args, kwargs):
        return None  # (the call as it is raises PyTorch's error for these arguments, in its words)
    args, kwargs = list(args), dict(kwargs)
    on_host = _on_host(located, bucket)
    for where, t, core, fill in located:
        if on_host:
            flat = _host_flat(t, n, bucket, core, fill)
        else:
            flat = t.reshape(n, *t.shape[t.dim() - core :])
            if bucket > n:
                flat = torch.cat([flat, _pad(fill, bucket - n, flat)])
            elif flat.untyped_storage().nbytes() != flat.numel() * flat.element_size() or not flat.is_contiguous():
                flat = flat.clone(
                    memory_format=torch.contiguous_format
                )  # (the program is keyed by its storage's shape)
        if type(where) is int:
            args[where] = flat
        else:
            kwargs[where] = flat
    results = kernel(*args, **kwargs)
    if isinstance(results, torch.Tensor):
        return _unflat(results, bucket, n, batch, on_host)
    return type(results)(_unflat(r, bucket, n, batch, on_host) for r in results)


# small matrices are padded to at least SMALLEST_BUCKET of them (while the bucket holds at most
# SMALL_ELEMENTS elements): PyTorch's tests sweep batches (1,), (2,), (3,), (3, 5), each its own
# power-of-two bucket; a few more small matrices cost less than a program each
SMALLEST_BUCKET = 16
SMALL_ELEMENTS = 1 << 14


def _bucket(n, elements):
    """The flat batch count n is padded to, for matrices of at most `elements` elements each."""
    bucket = bucket_of(n, 1)
    while bucket < SMALLEST_BUCKET and 2 * bucket * max(elements, 1) <= SMALL_ELEMENTS:
        bucket *= 2
    return bucket


def _locate(kernel, args, kwargs, plan):
    """(the batch shape, [(position or name, tensor, core dims, fill)] of the plan's arguments), or
    None where one is missing or not a plain tpu tensor, or where the batch shapes differ and an
    argument whose batch shape the results keep (not BROADCAST in the plan) lacks the common one."""
    positions = {a.name: i for i, a in enumerate(kernel.op._schema.arguments)}
    found, shapes = [], []
    for name, core, fill, *broadcast in plan:
        i = positions[name]
        if i < len(args):
            where, t = i, args[i]
        elif name in kwargs:
            where, t = name, kwargs[name]
        else:
            return None
        if type(t) is not torch.Tensor or t.device.type != "tpu" or t.dim() < core or t.dtype == torch.complex32:
            return None
        shapes.append(t.shape[: t.dim() - core])
        found.append((where, t, core, fill, bool(broadcast)))
    batch = shapes[0]
    if any(shape != batch for shape in shapes):
        try:
            batch = torch.broadcast_shapes(*shapes)
        except RuntimeError:
            return None  # (the op raises PyTorch's error)
        if any(shape != batch and not broadcast for shape, (*_, broadcast) in zip(shapes, found)):
            return None
    return batch, [
        (where, t.expand(*batch, *t.shape[t.dim() - core :]), core, fill) for where, t, core, fill, _ in found
    ]


def _meta_accepts(kernel, args, kwargs):
    """Whether PyTorch's meta kernel (and the lowering's meta_check) takes the call as it is: a bad
    argument (pivots of another batch than LU, shapes that do not broadcast) is left to the engine,
    which raises the error the CPU raises for these arguments, not for the flat ones."""

    def meta(t):
        if isinstance(t, torch.Tensor):
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
        return t

    meta_args, meta_kwargs = pytree.tree_map(meta, (args, kwargs))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check = META_CHECKS.get(kernel.name)
            if check is not None:
                check(*meta_args, **meta_kwargs)
            META_OVERRIDES.get(kernel.name, kernel.op)(*meta_args, **meta_kwargs)
    except Exception as e:  # any error: the engine's own path raises it as it should
        if interrupts.from_signal(e):
            raise
        return False
    return True


def _on_host(located, bucket):
    """Whether the flat, padded operands are made on the host: where device buffers are host memory
    (XLA:CPU; not under the TPU compile check) and they are small, their values known (not a fused
    segment's queued result) and stored as their dtype (a lazily conjugated or negated view is read
    with its bit applied, exactly: the op's program then keys no conj/neg bit). Else a reshape and a
    `cat` on the device: a small program per batch shape and layout (what the host saves)."""
    if not tpu_check.host_work_allowed():
        return False
    total = 0
    for _, t, core, _ in located:
        r = RECORDS.get(t.untyped_storage().data_ptr())
        if r is None or r.dtype != t.dtype or type(r._buffer) is fusion.Pending:
            return False
        total += bucket * math.prod(t.shape[t.dim() - core :]) * t.element_size()
    return total <= HOST_BYTES


def _host_flat(t, n, bucket, core, fill):
    """`t` (batch..., *core) as a new tensor (bucket, *core): its n matrices read through its view from
    its storage's array, then the pads; no program."""
    (buffer,) = input_buffers([RECORDS[t.untyped_storage().data_ptr()]])
    flat = np.asarray(buffer).reshape(-1)
    v = np.lib.stride_tricks.as_strided(
        flat[t.storage_offset() :], tuple(t.shape), [s * flat.itemsize for s in t.stride()], writeable=False
    )
    shape = tuple(t.shape[t.dim() - core :])
    out = np.empty((bucket, *shape), dtype=flat.dtype)
    v = v.reshape(n, *shape)
    if t.is_conj():  # (exact, as a negation: the flat operand carries no lazy bit)
        v = np.conj(v)
    if t.is_neg():
        v = -v
    out[:n] = v
    if bucket > n:
        if fill == EYE:
            out[n:] = np.eye(shape[0], shape[1], dtype=flat.dtype)
        elif fill == PIVOTS:
            out[n:] = np.arange(1, shape[0] + 1, dtype=flat.dtype)
        else:
            out[n:] = 0
    return new_tensor(out.shape, t.dtype, t.device.index, jax.device_put(out, buffer.sharding))


def _pad(fill, count, flat):
    """`count` padding elements for `flat` (n, *core)."""
    core = flat.shape[1:]
    if fill == EYE:
        return torch.eye(core[0], core[1], dtype=flat.dtype, device=flat.device).expand(count, *core)
    if fill == PIVOTS:
        return torch.arange(1, core[0] + 1, dtype=flat.dtype, device=flat.device).expand(count, *core)
    return torch.zeros(count, *core, dtype=flat.dtype, device=flat.device)


def _unflat(r, bucket, n, batch, on_host):
    """The first n elements of a bucket's result `r`, with the batch dims for its first; `r` itself
    where it has no batch dim (lstsq's empty residuals). `on_host`: a new storage of exactly those
    elements, cut on the host where `r`'s value is there (later ops key the result's storage as they
    keyed the batch's own result), else a tensor over `r`'s storage."""
    if not isinstance(r, torch.Tensor) or r.dim() == 0 or r.shape[0] != bucket:
        return r
    step = r.stride(0)
    strides = [step * math.prod(batch[i + 1 :]) for i in range(len(batch))]
    shape = (*batch, *r.shape[1:])
    stride = (*strides, *r.stride()[1:])
    record = RECORDS.get(r.untyped_storage().data_ptr())
    if (
        on_host
        and record is not None
        and type(record._buffer) is not fusion.Pending
        and r.storage_offset() == 0
        and step == math.prod(r.shape[1:])  # (the batch outermost: its first n elements are a dense prefix)
        and record.numel == r.numel()
    ):
        (buffer,) = input_buffers([record])
        prefix = np.asarray(buffer).reshape(-1)[: n * step]
        return new_tensor(
            shape,
            r.dtype,
            r.device.index,
            jax.device_put(prefix.reshape(storage_shape(shape, stride)), buffer.sharding),
            stride=stride,
        )
    out = torch.empty(0, dtype=r.dtype, device=r.device)
    return out.set_(r.untyped_storage(), r.storage_offset(), shape, stride)
