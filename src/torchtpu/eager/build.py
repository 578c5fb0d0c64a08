"""Cache misses of the eager engine: find the JAX function for an op and trace it with its views."""
from __future__ import annotations

import math
import zlib
from typing import NamedTuple

import jax
import torch
from torch.utils import _pytree as pytree

from ..device import platform
from ..ops import checks
from ..ops import dtypes as dt
from ..ops.resolve import resolve
from ..storage.records import RECORDS
from . import fusion, overlap, views
from .engine import CONSTANT_BYTES, DONATE_BYTES, MEMO_BYTES, Entry, NeedsResize, SpecializeScalars, _SCALAR_TYPES
from .kernels import META_CHECKS, META_OVERRIDES


def _walk(kernel, args, kwargs, on_tensor, on_scalar, on_cpu_scalar, on_other):
    """Map the arguments the way OpKernel._flatten classified them."""

    def one(a, is_scalar_arg):
        if isinstance(a, torch.Tensor):
            if RECORDS.get(a.untyped_storage().data_ptr()) is None:
                return on_cpu_scalar(a)
            return on_tensor(a)
        if type(a) in _SCALAR_TYPES and is_scalar_arg:
            return on_scalar(a)
        if type(a) in (list, tuple) and a and (isinstance(a[0], torch.Tensor) or a[0] is None and any(
                isinstance(x, torch.Tensor) for x in a)):
            return [one(x, False) for x in a]
        return on_other(a)

    new_args = [one(a, i in kernel.scalar_pos) for i, a in enumerate(args)]
    new_kwargs = {k: one(a, k in kernel.scalar_names) for k, a in kwargs.items()}
    return new_args, new_kwargs


class _TensorArg(NamedTuple):
    slot: int
    layout: tuple
    bits: tuple = (False, False)


def _bits(t):
    """(conjugate, negative): the lazy bits of `x.conj()` / `x.conj().imag` views, which hold the
    storage's values conjugated or negated (PyTorch resolves them only for ops that ignore them)."""
    return (t.is_conj(), t.is_neg())


class _ScalarArg(NamedTuple):
    value: object  # the Python value when the kernel specializes on scalars, else None


class _CpuScalar(NamedTuple):
    dtype: object


def _meta_other(o):
    if isinstance(o, torch.device):
        return torch.device("meta")
    return None if isinstance(o, torch.Generator) else o


class _DynOffset(NamedTuple):
    index: int  # which of the executable's traced offsets


def _partial(t):
    """A view into part of its storage: the engine traces its offset (see OpKernel.__call__)."""
    return t.storage_offset() or t.numel() != RECORDS[t.untyped_storage().data_ptr()].numel


def _layout(t, record, dyn_offset):
    off = t.storage_offset()
    return (tuple(t.shape), tuple(t.stride()), _DynOffset(dyn_offset[id(t)]) if _partial(t) else off,
            dt.to_jax(t.dtype), record.numel)


def _at(layout, offsets):
    """The layout with its traced offset filled in."""
    off = layout[2]
    return layout if type(off) is not _DynOffset else layout[:2] + (offsets[off.index],) + layout[3:]


_cache_ready = [False]


def build_entry(kernel, key, args, kwargs, bufs, device):
    if not _cache_ready[0]:  # the on-disk XLA cache serves eager executables too
        from ..compile import options
        options._ensure_persistent_cache()
        _cache_ready[0] = True
    slot_of = {id(r): i for i, r in enumerate(bufs)}
    # the engine passes each non-zero storage offset as a traced value, in argument order
    dyn_offset = {}
    n_offsets = 0

    def count_offset(t):
        nonlocal n_offsets
        if _partial(t):
            dyn_offset.setdefault(id(t), n_offsets)
            n_offsets += 1

    _walk(kernel, args, kwargs, count_offset, lambda s: s, lambda c: c, lambda o: o)
    # 1. PyTorch's own answer for shapes, dtypes and errors: run the op on meta tensors.
    bases = {}

    def meta_tensor(t):
        r = RECORDS[t.untyped_storage().data_ptr()]
        base = bases.get(id(r))
        if base is None:
            base = bases[id(r)] = torch.empty(r.numel, dtype=r.dtype, device="meta")
        src = base if t.dtype == r.dtype else base.view(t.dtype)
        return src.as_strided(t.shape, t.stride(), t.storage_offset())

    meta_args, meta_kwargs = _walk(kernel, args, kwargs, meta_tensor, lambda s: s, lambda c: c, _meta_other)
    compute = resolve(kernel.op, meta_args, meta_kwargs)  # first: an op we cannot lower fails here
    if getattr(compute, "specialize_scalars", False) and not kernel.specialize_scalars:
        kernel.specialize_scalars = True
        kernel.cache.clear()
        raise SpecializeScalars()
    originals = [(m, tuple(m.shape)) for m in pytree.tree_leaves((meta_args, meta_kwargs))
                 if isinstance(m, torch.Tensor)]
    meta_check = META_CHECKS.get(kernel.name)
    if meta_check is not None:
        meta_check(*meta_args, **meta_kwargs)
    meta_out = META_OVERRIDES.get(kernel.name, kernel.op)(*meta_args, **meta_kwargs)
    resized = [(m, shape) for m, shape in originals if tuple(m.shape) != shape]
    if resized:
        _raise_resize(kernel, args, kwargs, meta_args, meta_kwargs, resized)

    # 2. which outputs are new tensors, and how the returns nest
    schema = kernel.op._schema
    rets = meta_out if len(schema.returns) != 1 else (meta_out,)
    outs, spec, nones = [], [], []
    for alias_name, value in zip(kernel.aliased_returns, rets if schema.returns else ()):
        if alias_name is not None:
            spec.append(alias_name)
        else:
            leaves, s = pytree.tree_flatten(value)
            # undefined outputs (None: a backward's output_mask False) stay None, on both sides
            outs.extend((tuple(m.shape), m.dtype) for m in leaves
                        if m is not None)
            nones.append(tuple(m is None for m in leaves))
            spec.append(s)
    n_fn = len(outs)
    entry = Entry()
    entry.overlap = overlap.guard(kernel, args, kwargs, dyn_offset)  # PyTorch's overlapping-write errors
    entry.anchor = zlib.crc32(repr((kernel.name, key)).encode()) % fusion.ANCHOR_EVERY == 0
    entry.outs = outs
    entry.nones = tuple(nones) if any(any(n) for n in nones) else None
    # None: the op returns exactly one new tensor (the fast path)
    entry.spec = None if (len(spec) == 1 and not isinstance(spec[0], str) and spec[0].num_leaves == 1
                          and spec[0].is_leaf() and len(schema.returns) == 1) else spec

    # 3. where in-place results go
    mutable_targets = []  # (slot, layout, bits) for each written tensor, in schema order
    for i, name, kwarg_only in kernel.mutable:
        value = kwargs.get(name) if (kwarg_only or i >= len(args)) else args[i]
        for t in (value if isinstance(value, (list, tuple)) else [value]):
            if t is None:
                continue
            r = RECORDS[t.untyped_storage().data_ptr()]
            mutable_targets.append((slot_of[id(r)], _layout(t, r, dyn_offset), _bits(t)))
    for i, name in getattr(compute, "extra_mutations", ()):
        t = kwargs.get(name) if i >= len(args) else args[i]
        if t is not None:
            r = RECORDS[t.untyped_storage().data_ptr()]
            mutable_targets.append((slot_of[id(r)], _layout(t, r, dyn_offset), _bits(t)))
    mutated_slots = sorted({s for s, _, _ in mutable_targets})
    entry.mutated_slots = mutated_slots
    nb = len(bufs)
    out_dtypes = [dt.to_jax(o[1]) for o in outs]

    # The executable must not hold on to this call's tensors (their storages would never be
    # freed): it closes over a template of slots, layouts and static values only.
    def tensor_slot(t):
        r = RECORDS[t.untyped_storage().data_ptr()]
        return _TensorArg(slot_of[id(r)], _layout(t, r, dyn_offset), _bits(t))

    template = _walk(kernel, args, kwargs, tensor_slot,
                     lambda s: _ScalarArg(s if kernel.specialize_scalars else None),
                     lambda c: _CpuScalar(dt.to_jax(c.dtype)),
                     lambda o: dt.to_jax(o) if isinstance(o, torch.dtype) else o)

    def traced_args(buffers, scalars, offsets):
        it = iter(scalars)

        def fill(v):
            if isinstance(v, _TensorArg):
                return views.apply_bits(views.read(buffers[v.slot], _at(v.layout, offsets)), v.bits)
            if isinstance(v, _ScalarArg):
                traced = next(it)
                return v.value if kernel.specialize_scalars else traced  # specialized: value is in the key
            if isinstance(v, _CpuScalar):
                return jax.numpy.asarray(next(it), v.dtype)
            if type(v) is list:
                return [fill(x) for x in v]
            return v

        t_args, t_kwargs = template
        return [fill(v) for v in t_args], {k: fill(v) for k, v in t_kwargs.items()}

    def fused(*dyn):
        buffers = list(dyn[:nb])
        scalars = dyn[nb:len(dyn) - n_offsets]
        offsets = dyn[len(dyn) - n_offsets:]
        rng = scalars[-1] if kernel.random else None
        a, k = traced_args(buffers, scalars[:-1] if kernel.random else scalars, offsets)
        if rng is not None:
            k["key"] = jax.random.fold_in(jax.random.fold_in(jax.random.key(rng[0]), rng[1]), rng[2])
        with checks.collecting() as found:
            result = compute(a, k)
        flags, entry.checks = checks.verdict(found)
        leaves = [v for v in pytree.tree_leaves(result) if v is not None]
        if len(leaves) != n_fn + len(mutable_targets):
            raise AssertionError(f"torchtpu: lowering of aten::{kernel.name} returned {len(leaves)} "
                                 f"values, expected {n_fn} outputs + {len(mutable_targets)} mutations")
        functional = []
        for v, (shape, _), d in zip(leaves[:n_fn], outs, out_dtypes):
            v = jax.numpy.asarray(v)
            if v.dtype != d:
                v = v.astype(d)
            if v.shape != shape:
                v = jax.numpy.broadcast_to(v, shape) if v.size == 1 or v.ndim < len(shape) else v
                if v.shape != shape:
                    raise AssertionError(f"torchtpu: lowering of aten::{kernel.name} returned shape "
                                         f"{v.shape}, PyTorch expects {shape}")
            functional.append(v.reshape(-1))  # storages hold flat buffers
        for (slot, layout, bits), v in zip(mutable_targets, leaves[n_fn:]):
            buffers[slot] = views.write(buffers[slot], _at(layout, offsets), views.apply_bits(v, bits))
        return tuple(functional) + tuple(buffers[s] for s in mutated_slots) + (() if flags is None else (flags,))

    out_bytes = sum(math.prod(shape) * dtype.itemsize for shape, dtype in outs)
    if nb == 0 and not kernel.random and not mutable_targets and out_bytes <= CONSTANT_BYTES:
        entry.consts = {}
    elif nb and not kernel.random and not mutable_targets and \
            out_bytes + sum(r.nbytes for r in bufs) <= MEMO_BYTES:
        entry.memo = {}
    if nb == 0:
        index = device if device >= 0 else 0
        entry.fn = jax.jit(fused, out_shardings=jax.sharding.SingleDeviceSharding(platform.jax_device(index)))
    else:
        entry.fn = jax.jit(fused)
        if any(bufs[s].nbytes >= DONATE_BYTES for s in mutated_slots):
            entry.traced = fused
    return entry


def _raise_resize(kernel, args, kwargs, meta_args, meta_kwargs, resized):
    by_meta = {id(m): shape for m, shape in resized}
    pairs = []

    def collect(real, meta):
        if isinstance(real, torch.Tensor) and id(meta) in by_meta:
            pairs.append((real, tuple(meta.shape)))
        elif isinstance(real, (list, tuple)) and isinstance(meta, (list, tuple)):
            for r, m in zip(real, meta):
                collect(r, m)

    for r, m in zip(args, meta_args):
        collect(r, m)
    for k in kwargs:
        collect(kwargs[k], meta_kwargs[k])
    raise NeedsResize(pairs)
