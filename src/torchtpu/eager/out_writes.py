"""out= overloads of a new signature through their functional op's program, then a write into out=.

An out= overload's executable runs the functional lowering and writes its result through each out
tensor's view in one XLA program, keyed on the inputs' layouts and the out tensors' layouts: the
same computation compiled again for every out= layout (test_linalg's test_bmm: `bmm.out` 170
programs next to `bmm`'s own; linalg_solve_triangular 795 and its `.out` 792). Here a new signature
of an out= overload runs the functional overload (its program shared by every out= layout, and with
plain calls of the functional op) and writes each result into its out tensor as `copy_` does (a
whole contiguous out tensor of the result's dtype and shape just takes the result's buffer; another
layout is one copy program per layout pair, shared by every op).

out='s semantics stay the engine's: PyTorch's meta kernel for the out= overload runs first (its
errors in the CPU's words, its warnings, the resize of a wrong-shaped out and its warning:
eager/build.py _meta_call raises NeedsResize, which the engine answers as before). Served only
where the write is a pure copy of the same values: every out tensor has the functional result's
dtype and shape (an out= of another dtype may compute in that dtype: `sum(x, 0, out=float64)`), no
out tensor shares a storage with an input or another out tensor (no overlap question), the op draws
no random numbers, and neither overload has checks or wrappers of its own around the engine
(eager/kernels.py registers only those). A signature called more than TIER_UP times builds the
engine's one-program executable, as before (no second pass over the result in a hot loop).
"""

from __future__ import annotations

import warnings

import torch
from torch.utils import _pytree as pytree

from ..ops.resolve import functional_twin, op_name
from ..ops.table import LOWERINGS
from ..storage.records import RECORDS
from . import limits
from .build import _meta_call
from .engine import _aliased_name

TIER_UP = 64  # calls of one signature after which the engine builds the out= overload's own program
_MAX_KEPT = 1024
_calls: dict = {}
limits.FORGETTERS.append(_calls.clear)


def serve(kernel, args, kwargs, *, twin, outs, copy):
    """The out= overload `kernel`'s result through its functional overload's kernel `twin` and
    `copy(out, result)` per out tensor (named `outs`, keyword-only), or None for the engine."""
    if kernel.random or not outs or any(not isinstance(kwargs.get(n), torch.Tensor) for n in outs):
        return None
    targets = [kwargs[n] for n in outs]
    fkwargs = {k: v for k, v in kwargs.items() if k not in outs}
    inputs = [t for t in pytree.tree_leaves((args, fkwargs)) if isinstance(t, torch.Tensor)]
    written = set()
    device = targets[0].device
    for t in targets:
        address = t.untyped_storage().data_ptr()
        if t.device != device or device.type != "tpu" or address in written or RECORDS.get(address) is None:
            return None
        if t.is_conj() or t.is_neg() or t.dtype == torch.complex32:  # (the engine's write handles those)
            return None
        written.add(address)
    for t in inputs:  # (other devices: the engine's error, naming the out= overload)
        if t.device != device and not (t.device.type == "cpu" and t.dim() == 0):
            return None
        if t.untyped_storage().data_ptr() in written:
            return None
    signature = _signature(kernel, args, kwargs)
    if signature is None:
        return None
    calls = _calls.get(signature)
    if calls is None:  # a new signature: PyTorch's answers decide (then kept, as an engine entry is)
        if not _serves(kernel, args, kwargs, fkwargs, twin, targets):
            _calls[signature] = TIER_UP
            return None
        calls = 0
    if calls >= TIER_UP:
        return None
    if len(_calls) >= _MAX_KEPT:
        _calls.clear()
    _calls[signature] = calls + 1
    with warnings.catch_warnings(record=True):  # (said once already, by the out= overload's meta call)
        warnings.simplefilter("always")
        values = twin(*args, **fkwargs)
    values = values if isinstance(values, (tuple, list)) else (values,)
    for t, v in zip(targets, values):
        copy(t, v)
    returned = [kwargs[name] for name in kernel.aliased_returns]
    return returned[0] if len(returned) == 1 else tuple(returned)


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.memory_format, torch.layout, torch.device)


def _signature(kernel, args, kwargs):
    """What PyTorch's meta answers depend on: each tensor's shape, strides, dtype, device and lazy bits,
    the other arguments' values, the default dtype; None for an argument of another kind."""
    parts = [kernel.name, torch.get_default_dtype()]
    for a in pytree.tree_leaves((args, kwargs)):
        if isinstance(a, torch.Tensor):
            # (and its storage's array shape, as the engine's key: a signature is never coarser than
            # the out= overload's own executables, which a hot one builds)
            r = RECORDS.get(a.untyped_storage().data_ptr())
            parts.append((tuple(a.shape), a.stride(), a.dtype, a.device, a.is_conj(), a.is_neg(), r and r.shape))
        elif type(a) in _PLAIN:
            parts.append((type(a), a))
        else:
            return None
    parts.append(pytree.tree_structure((args, kwargs)))
    return tuple(parts)


def _serves(kernel, args, kwargs, fkwargs, twin, targets):
    """Whether the functional result is what the out tensors receive unconverted, after the out=
    overload's meta call (its errors, warnings and NeedsResize: the engine's). The functional op is
    asked quietly: the out= overload's meta call says the op's warnings."""
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            _, functional = _meta_call(twin, args, fkwargs)
    except (RuntimeError, TypeError, IndexError, ValueError):
        functional = None
    _meta_call(kernel, args, kwargs)
    if functional is None:
        return False
    results = functional if isinstance(functional, (tuple, list)) else (functional,)
    return len(results) == len(targets) and all(
        isinstance(r, torch.Tensor) and r.dtype == t.dtype and r.shape == t.shape for r, t in zip(results, targets)
    )


def eligible(op):
    """(functional overload, out= argument names) where `op` is an out= overload this serves: its
    out tensors keyword-only and all it returns, no lowering of its own, a lowered functional
    overload taking exactly the other arguments; else None."""
    twin = functional_twin(op)
    if twin is None or not twin[1] or twin[2] is not None or op_name(op) in LOWERINGS:
        return None
    functional, outs = twin[0], twin[1]
    schema = op._schema
    if op_name(functional) not in LOWERINGS or len(functional._schema.arguments) != len(schema.arguments) - len(outs):
        return None
    if not all(a.kwarg_only for a in schema.arguments if a.name in outs):
        return None
    aliased = [_aliased_name(schema, r) for r in schema.returns]
    if not aliased or any(name not in outs for name in aliased):
        return None
    return functional, outs
