"""PyTorch's memory-overlap checks for in-place and out= writes (ATen's MemOverlap.cpp rules).

An elementwise op (a TensorIterator op on the CPU and CUDA: the lowerings with PyTorch's type
promotion except those declared `blas=True`, and copy_) refuses to write
- into a tensor whose elements share memory (`x.expand(3, 4).add_(1)`, `out=` an expanded view):
  "more than one element of the written-to tensor refers to a single memory location";
- into a tensor that partly overlaps one of its inputs (`x[1:].add_(x[:-1])`, `x.copy_(x.t())`):
  "some elements of the input tensor and the written-to tensor refer to a single memory location".
Our executables read every input before they write, so without the checks such calls would
silently compute something the CPU refuses to compute.

The first check depends on sizes and strides only, which key the eager cache: it runs when the
executable is built. The second depends on storage offsets too, which travel as traced values:
`guard` returns a check the engine runs per call, and only for keys where a written tensor shares
its storage with another tensor argument (anything else costs nothing).
"""

from __future__ import annotations

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as _dense

from ..ops.resolve import functional_twin, op_name
from ..ops.table import LOWERINGS
from ..storage.records import RECORDS

INTERNAL = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)
PARTIAL = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
    "single memory location. Please clone() the tensor before performing the operation."
)

_EXTRA = {"copy_.default"}  # elementwise writes whose functional twin has no promoting lowering


def _elementwise(op) -> bool:
    name = op_name(op)
    if name in _EXTRA:
        return True
    twin = functional_twin(op)
    if twin is None:
        return False
    name = op_name(twin[0])
    low = LOWERINGS.get(name)
    # promoting lowerings declared blas=True (addmm, ...) are BLAS calls on the CPU, not TensorIterator loops
    return low is not None and low.promote is not None and not low.blas


def has_internal_overlap(t: torch.Tensor) -> bool:
    """ATen's has_internal_overlap == Yes: a dimension of size > 1 with stride 0 (a dense tensor never
    overlaps itself; other layouts are "too hard" and pass, as in PyTorch)."""
    if _dense(t):
        return False
    return any(s == 0 and n > 1 for n, s in zip(t.shape, t.stride()))


def _tensors(kernel, args, kwargs):
    """(tensor, written) for every tpu tensor among the arguments, lists included."""
    written_names = {name for _, name, _ in kernel.mutable}
    names = [a.name for a in kernel.op._schema.arguments]
    out = []

    def add(value, written):
        for t in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(t, torch.Tensor) and RECORDS.get(t.untyped_storage().data_ptr()) is not None:
                out.append((t, written))

    for i, a in enumerate(args):
        add(a, i < len(names) and names[i] in written_names)
    for k, a in kwargs.items():
        add(a, k in written_names)
    return out


def guard(kernel, args, kwargs, dyn_offset):
    """At an executable's build: raise if a written tensor overlaps itself; return None, or a function
    of the call's traced offsets that raises where a written tensor partly overlaps an input."""
    if not kernel.mutable or not _elementwise(kernel.op):
        return None
    tensors = _tensors(kernel, args, kwargs)
    written = [t for t, w in tensors if w]
    for t in written:
        if t.numel() and has_internal_overlap(t):
            raise RuntimeError(INTERNAL)
    pairs = []
    for w in written:
        for t, is_written in tensors:
            if t is w or is_written or t.numel() == 0 or w.numel() == 0:
                continue
            if t.untyped_storage().data_ptr() != w.untyped_storage().data_ptr():
                continue
            if not (_dense(t) and _dense(w)):
                continue  # "too hard" for PyTorch too: it does not raise
            pairs.append((_extent(w, dyn_offset), _extent(t, dyn_offset), tuple(w.stride()) == tuple(t.stride())))
    if not pairs:
        return None
    check = _PartialOverlap(tuple(pairs))
    check(_current_offsets(args, kwargs, dyn_offset))
    return check


def _extent(t, dyn_offset):
    """(offset: an int, or ("dyn", index into the traced offsets), number of elements it spans)."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    index = dyn_offset.get(id(t))
    return (t.storage_offset() if index is None else ("dyn", index)), span, t.element_size()


def _current_offsets(args, kwargs, dyn_offset):
    found = {}
    for a in (*args, *kwargs.values()):
        for t in a if isinstance(a, (list, tuple)) else [a]:
            if isinstance(t, torch.Tensor) and id(t) in dyn_offset:
                found[dyn_offset[id(t)]] = t.storage_offset()
    return tuple(found.get(i, 0) for i in range(max(found, default=-1) + 1))


class _PartialOverlap:
    __slots__ = ("pairs",)

    def __init__(self, pairs):
        self.pairs = pairs

    def __call__(self, offsets):
        for (wo, wn, wsize), (to, tn, tsize), same_strides in self.pairs:
            wb = (offsets[wo[1]] if type(wo) is tuple else wo) * wsize
            tb = (offsets[to[1]] if type(to) is tuple else to) * tsize
            we, te = wb + wn * wsize, tb + tn * tsize
            if wb == tb and we == te:
                if not same_strides:
                    raise RuntimeError(PARTIAL)
            elif wb < te and tb < we:
                raise RuntimeError(PARTIAL)
