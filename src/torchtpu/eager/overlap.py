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

from ..ops.argument_checks import warn_at_caller
from ..ops.resolve import functional_twin, op_name
from ..ops.table import LOWERINGS, declared_facts
from ..storage.records import RECORDS

INTERNAL = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)
PARTIAL = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
    "single memory location. Please clone() the tensor before performing the operation."
)

_EXTRA = {"copy_.default"}
# the other ops' rules, declared with their lowerings (`write_overlap=`): index_add_, scatter_, uniform_, ...
_RULES = declared_facts("write_overlap")
_INPLACE_OF = declared_facts("inplace_variant")  # elementwise writes whose functional twin has no promoting lowering


def elementwise(op) -> bool:
    """Whether `op` is a TensorIterator op on the CPU (an in-place or out= variant of one)."""
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


def assert_no_overlap(written: torch.Tensor, t: torch.Tensor):
    """ATen's assert_no_overlap(written, t) for a kernel that checks its out= by hand: the two may share
    no element (the same elements, same strides, raise too); layouts too hard to tell pass, as there."""
    if written.numel() == 0 or t.numel() == 0:
        return
    if written.untyped_storage().data_ptr() != t.untyped_storage().data_ptr():
        return
    if not (_dense(written) and _dense(t)):
        return
    spans = []
    for x in (written, t):
        start = x.storage_offset() * x.element_size()
        spans.append((start, start + (1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride()))) * x.element_size()))
    (wb, we), (tb, te) = spans
    if wb < te and tb < we:
        raise RuntimeError(PARTIAL)


def _rule(op):
    """The op's declared WriteOverlap (ops/table.py), by its own name, the functional op whose in-place
    variant it is, or its functional twin; None for an op that declares none."""
    name = op_name(op)
    rule = _RULES.get(name)
    if rule is None and name in _INPLACE_OF:
        rule = _RULES.get(_INPLACE_OF[name])
    if rule is None:
        twin = functional_twin(op)
        rule = _RULES.get(op_name(twin[0])) if twin is not None else None
    return rule


def _slots(kernel, args, kwargs):
    """(argument name, tensor, written) for every tpu tensor among the arguments, lists included."""
    written_names = {name for _, name, _ in kernel.mutable}
    names = [a.name for a in kernel.op._schema.arguments]
    out = []

    def add(name, value):
        for t in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(t, torch.Tensor) and RECORDS.get(t.untyped_storage().data_ptr()) is not None:
                out.append((name, t, name in written_names))

    for i, a in enumerate(args):
        add(names[i] if i < len(names) else None, a)
    for k, a in kwargs.items():
        add(k, a)
    return out


def checks_first(kernel) -> bool:
    """Whether the op's overlap checks come before its other argument checks: an elementwise op's
    (TensorIterator's) do; an op with declared rules checks its arguments first."""
    return bool(kernel.mutable) and _rule(kernel.op) is None and elementwise(kernel.op)


def _checked_rule(kernel):
    """(whether the CPU checks the op's written tensors for overlap, its declared WriteOverlap or None):
    elementwise ops and ops with a rule are checked, unless the rule says `unchecked`."""
    rule = _rule(kernel.op)
    return not ((rule is None and not elementwise(kernel.op)) or (rule is not None and rule.unchecked)), rule


def check_before_resize(kernel, tensors):
    """An out= tensor about to be resized that overlaps itself raises as the CPU's does: its kernels
    check the written tensor before resizing it (`index_select(..., out=expanded)`), and the resized
    tensor would not overlap any more."""
    checked, rule = _checked_rule(kernel)
    if not checked or (rule is not None and rule.expanded_warning is not None):
        return
    if any(t.numel() and has_internal_overlap(t) for t in tensors):
        raise RuntimeError(INTERNAL)


def guard(kernel, args, kwargs, dyn_offset):
    """At an executable's build: raise if a written tensor overlaps itself; return None, or a function
    of the call's traced offsets that raises where a written tensor overlaps an input it may not
    (and gives an op's per-call warning for an expanded written tensor)."""
    if not kernel.mutable:
        return None
    checked, rule = _checked_rule(kernel)
    if not checked:
        return None
    slots = _slots(kernel, args, kwargs)
    written = [t for _, t, w in slots if w]
    warning = None
    for t in written:
        if t.numel() and has_internal_overlap(t):
            if rule is None or rule.expanded_warning is None:
                raise RuntimeError(INTERNAL)
            warning = rule.expanded_warning
    pairs = []
    for w in written:
        for name, t, is_written in slots:
            if is_written or t.numel() == 0 or w.numel() == 0:
                continue
            full_raises = rule is not None and name in rule.no_overlap
            if rule is not None and not full_raises and name not in rule.no_partial_overlap:
                continue
            if t.untyped_storage().data_ptr() != w.untyped_storage().data_ptr():
                continue
            if not (_dense(t) and _dense(w)):
                continue  # "too hard" for PyTorch too: it does not raise
            same_strides = tuple(w.stride()) == tuple(t.stride())
            pairs.append((_extent(w, dyn_offset), _extent(t, dyn_offset), same_strides and not full_raises))
    if not pairs and warning is None:
        return None
    check = _WriteCheck(tuple(pairs), warning)
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


class _WriteCheck:
    __slots__ = ("pairs", "warning")

    def __init__(self, pairs, warning):
        self.pairs, self.warning = pairs, warning

    def __call__(self, offsets):
        if self.warning is not None:
            warn_at_caller(self.warning)
        # a full overlap (same elements, same strides) passes where only a partial one is refused
        for (wo, wn, wsize), (to, tn, tsize), full_passes in self.pairs:
            wb = (offsets[wo[1]] if type(wo) is tuple else wo) * wsize
            tb = (offsets[to[1]] if type(to) is tuple else to) * tsize
            we, te = wb + wn * wsize, tb + tn * tsize
            if wb == tb and we == te:
                if not full_passes:
                    raise RuntimeError(PARTIAL)
            elif wb < te and tb < we:
                raise RuntimeError(PARTIAL)
