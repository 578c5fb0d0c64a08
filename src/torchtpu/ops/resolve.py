"""Find the JAX function for an ATen overload: its lowering, or one derived from its functional twin.

In-place (`foo_`) and `out=` overloads are the functional op plus a write into the mutated
arguments, so only functional ops need lowerings. Ops with neither go through a PyTorch
decomposition traced into ops that have lowerings (decompose.py, which registers itself in
DECOMPOSERS: it sits above this module, planning its traces with graph.py, which resolves here).
"""

from __future__ import annotations

import functools

import torch

from .dtypes import scalar_type_name, to_jax
from .table import LOWERINGS, apply, declared_facts, reject_complex, reject_missing_loop


class NotLowered(NotImplementedError):
    pass


# The last resort for an op with neither a lowering nor a functional twin: (decomposed, last_failure)
# pairs, filled at import by decompose.py (ops/__init__ imports it). `decomposed(op, meta_args,
# meta_kwargs)` gives a JAX function or None; `last_failure()` says why it gave None (chained to
# the NotLowered raised).
DECOMPOSERS: list = []


def op_name(op) -> str:
    """ "add.Tensor" for aten ops, "ns.op.default" for other namespaces (a jax_op's "ns::op"), as in graphs
    (graph.py: node_op_name), so a custom op's lowering cannot collide with an aten op of the same name."""
    ns, _, name = op._schema.name.partition("::")
    base = f"{name}.{op._schema.overload_name or 'default'}"
    return base if ns == "aten" else f"{ns}.{base}"


def _out_names(op):
    return [a.name for a in op._schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]


# in-place ops whose functional variant does not follow the `foo_` -> `foo` naming (declared with
# `inplace_variant=` on the functional op's lowering)
_INPLACE_TWINS = declared_facts("inplace_variant")
_FACTORY_KWARGS = {"dtype", "layout", "device", "pin_memory"}


def _signature(args):
    return [(a.name, str(a.type)) for a in args]


def _overloads(name):
    packet = getattr(torch.ops.aten, name, None)
    return [getattr(packet, ov) for ov in packet.overloads()] if packet is not None else []


@functools.cache
def functional_twin(op):
    """(functional overload, names of out= arguments, argument order) for an in-place or out=
    overload, or None. The order is None when the twin takes the arguments in the same order,
    else the twin's argument names (polygamma_(self, n) vs polygamma(n, self))."""
    schema = op._schema
    if not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return None
    base = schema.name.split("::")[1]
    overload = schema.overload_name or "default"
    outs = _out_names(op)
    if outs:
        want = _signature(a for a in schema.arguments if a.name not in outs)
        for cand in _overloads(base):
            if _out_names(cand) or any(a.alias_info is not None for a in cand._schema.arguments):
                continue
            sig = _signature(cand._schema.arguments)
            extra = [a.name for a in cand._schema.arguments if (a.name, str(a.type)) not in want]
            # factories: the functional overload also takes dtype/layout/device/pin_memory
            if sig == want or (sig[: len(want)] == want and set(extra) <= _FACTORY_KWARGS):
                return cand, tuple(outs), None
        return None
    if base.startswith("__i") and base.endswith("__"):  # __ilshift__ / __irshift__: in-place __lshift__
        cand = getattr(getattr(torch.ops.aten, "__" + base[3:], None), overload, None)
        if cand is not None and _signature(cand._schema.arguments) == _signature(schema.arguments):
            return cand, (), None
        return None
    if not base.endswith("_") or base.endswith("__"):
        return None
    want = _signature(schema.arguments)
    special = _INPLACE_TWINS.get(f"{base}.{overload}")
    named = [getattr(getattr(torch.ops.aten, base[:-1], None), overload, None)]
    candidates = ([_resolve_name(special)] if special else []) + named + _overloads(base[:-1])
    for cand in candidates:
        if cand is None or any(a.alias_info is not None for a in cand._schema.arguments):
            continue
        sig = _signature(cand._schema.arguments)
        if sig == want or (cand is candidates[0] and special):
            return cand, (), None
        if sorted(sig) == sorted(want):
            return cand, (), tuple(a.name for a in cand._schema.arguments)
    return None


def _resolve_name(qualified):
    name, _, ov = qualified.partition(".")
    return getattr(getattr(torch.ops.aten, name, None), ov, None)


def resolve(op, meta_args, meta_kwargs):
    """A function (args, kwargs) -> outputs (+ new values of mutated arguments) in JAX."""
    name = op_name(op)
    # before any lowering, twin or decomposition: a decomposed real-only op would compute on complex. Not
    # `out`: the CPU writes a real result into a complex `out` (floor_divide(int16, int32, out=complex64))
    reject_complex(name, (*meta_args, *(v for k, v in meta_kwargs.items() if k != "out")))
    low = LOWERINGS.get(name)
    if low is not None:
        reject_missing_loop(low, meta_args, meta_kwargs)
        fn = functools.partial(_call_lowering, low)
        if low.half_parts and any(
            isinstance(t, torch.Tensor) and t.dtype == torch.complex32 for t in (*meta_args, *meta_kwargs.values())
        ):
            fn = functools.partial(_call_lowering_half_parts, low)
        fn.extra_mutations = low.mutates
        fn.specialize_scalars = low.static_scalars
        return fn
    twin = functional_twin(op)
    if twin is not None:
        func, outs, order = twin
        adapt = functools.partial(_twin_args, op, func, outs, order)
        if not outs:
            _check_inplace_cast(op, func, meta_args, meta_kwargs, adapt)
        inner = resolve(func, *adapt(meta_args, meta_kwargs))
        fn = functools.partial(_call_twin, inner, adapt)
        fn.extra_mutations = getattr(inner, "extra_mutations", ())
        fn.specialize_scalars = getattr(inner, "specialize_scalars", False)
        return fn
    failure = None
    for decomposed, last_failure in DECOMPOSERS:
        fn = decomposed(op, meta_args, meta_kwargs)
        if fn is not None:
            return fn
        failure = last_failure() or failure
    raise NotLowered(
        f"torchtpu: aten::{name} is not implemented for the tpu device. Set TORCHTPU_CPU_FALLBACK=1 "
        f"(or torchtpu.set_cpu_fallback(True)) to run it on the CPU, or file an issue."
    ) from failure


def _check_inplace_cast(op, func, meta_args, meta_kwargs, adapt):
    """An elementwise in-place op (`x *= 2.5` on an int64 x) whose result type cannot be cast to its
    tensor's type raises, as PyTorch's TensorIterator does on the CPU and CUDA (its meta kernels do not
    check, and a cast in the executable would silently truncate)."""
    low = LOWERINGS.get(op_name(func))
    if low is None or low.promote is None:
        return
    own_check = declared_facts("meta_check").get(op_name(op))
    if own_check is not None:  # the op's own argument checks come first (heaviside_: "different dtypes")
        own_check(*meta_args, **meta_kwargs)
    written = next(
        (meta_args[i] if i < len(meta_args) else meta_kwargs.get(a.name))
        for i, a in enumerate(op._schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    )
    try:
        twin_args, twin_kwargs = adapt(meta_args, meta_kwargs)
        result = func(*twin_args, **twin_kwargs)
    except Exception:  # noqa: BLE001 - the op's own checks report bad arguments later
        return
    result = result[0] if isinstance(result, (tuple, list)) else result
    if (
        isinstance(written, torch.Tensor)
        and isinstance(result, torch.Tensor)
        and not torch.can_cast(result.dtype, written.dtype)
    ):
        raise RuntimeError(
            f"result type {scalar_type_name(result.dtype)} can't be cast to the desired output "
            f"type {scalar_type_name(written.dtype)}"
        )


def _twin_args(op, func, outs, order, args, kwargs):
    """The in-place/out= op's arguments as its functional twin takes them."""
    out = kwargs.get(outs[0]) if outs else None
    kwargs = {k: v for k, v in kwargs.items() if k not in outs}
    if (
        out is not None
        and kwargs.get("dtype") is None
        and any(a.name == "dtype" and a.kwarg_only for a in func._schema.arguments)
    ):
        # an out= factory (arange.out, linspace.out): the values take the out tensor's dtype
        kwargs["dtype"] = to_jax(out.dtype) if isinstance(out.dtype, torch.dtype) else out.dtype
    if order is None:
        return args, kwargs
    by_name = dict(zip((a.name for a in op._schema.arguments), args), **kwargs)
    twin_args = [by_name[a.name] for a in func._schema.arguments if not a.kwarg_only and a.name in by_name]
    twin_kwargs = {a.name: by_name[a.name] for a in func._schema.arguments if a.kwarg_only and a.name in by_name}
    return twin_args, twin_kwargs


def _call_twin(inner, adapt, a, k):
    return inner(*adapt(a, k))


def _call_lowering(low, a, k):
    return apply(low, a, k)


def _call_lowering_half_parts(low, a, k):
    return apply(low, a, dict(k, half_parts=True))
