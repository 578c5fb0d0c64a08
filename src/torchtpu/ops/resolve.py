"""Find the JAX function for an ATen overload: its lowering, or one derived from its functional twin.

In-place (`foo_`) and `out=` overloads are the functional op plus a write into the mutated
arguments, so only functional ops need lowerings. Ops with neither go through a PyTorch
decomposition traced into ops that have lowerings (see decompose.py).
"""
from __future__ import annotations

import functools

import torch

from .table import LOWERINGS, apply


class NotLowered(NotImplementedError):
    pass


def op_name(op) -> str:
    return f"{op._schema.name.split('::')[1]}.{op._schema.overload_name or 'default'}"


def _out_names(op):
    return [a.name for a in op._schema.arguments if a.kwarg_only and a.alias_info is not None
            and a.alias_info.is_write]


# in-place ops whose functional variant does not follow the `foo_` -> `foo` naming
_INPLACE_TWINS = {"normal_.default": "normal_functional.default", "bernoulli_.float": "bernoulli.p"}


@functools.lru_cache(maxsize=None)
def functional_twin(op):
    """(functional overload, names of out= arguments) for an in-place or out= overload, or None."""
    schema = op._schema
    if not any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return None
    base = schema.name.split("::")[1]
    outs = _out_names(op)
    if outs:
        packet = getattr(torch.ops.aten, base, None)
        want = [(a.name, str(a.type)) for a in schema.arguments if a.name not in outs]
        for overload in (packet.overloads() if packet else ()):
            cand = getattr(packet, overload)
            if _out_names(cand) or any(a.alias_info is not None for a in cand._schema.arguments):
                continue
            if [(a.name, str(a.type)) for a in cand._schema.arguments] == want:
                return cand, tuple(outs)
        return None
    if base.endswith("_") and not base.endswith("__"):
        overload = schema.overload_name or "default"
        for candidate in (_INPLACE_TWINS.get(f"{base}.{overload}"), f"{base[:-1]}.{overload}"):
            if candidate is None:
                continue
            name, _, ov = candidate.partition(".")
            packet = getattr(torch.ops.aten, name, None)
            if packet is not None and ov in packet.overloads():
                return getattr(packet, ov), ()
    return None


def resolve(op, meta_args, meta_kwargs):
    """A function (args, kwargs) -> outputs (+ new values of mutated arguments) in JAX."""
    name = op_name(op)
    low = LOWERINGS.get(name)
    if low is not None:
        fn = functools.partial(_call_lowering, low)
        fn.extra_mutations = low.mutates
        fn.specialize_scalars = low.static_scalars
        return fn
    twin = functional_twin(op)
    if twin is not None:
        func, outs = twin
        kw = {k: v for k, v in meta_kwargs.items() if k not in outs}
        inner = resolve(func, meta_args, kw)
        if not outs:
            return inner
        return lambda a, k: inner(a, {n: v for n, v in k.items() if n not in outs})
    from .decompose import decomposed
    fn = decomposed(op, meta_args, meta_kwargs)
    if fn is not None:
        return fn
    raise NotLowered(
        f"torchtpu: aten::{name} is not implemented for the tpu device. Set TORCHTPU_CPU_FALLBACK=1 "
        f"(or torchtpu.set_cpu_fallback(True)) to run it on the CPU, or file an issue.")


def _call_lowering(low, a, k):
    return apply(low, a, k)
