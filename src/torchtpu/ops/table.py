"""The lowering table: ATen op -> pure JAX function. The single source of truth for eager and compile.

A lowering receives the op's arguments as the schema orders them, with tensors as JAX arrays,
`Scalar`s as Python numbers or weakly typed 0-d arrays, dtypes as jnp dtypes, and returns JAX
arrays (a tuple for several outputs). It holds no PyTorch objects.

    @lowering("add.Tensor", "add.Scalar", promote=KIND.DEFAULT)
    def add(a, b, alpha=1):
        return a + b * alpha

`promote=` applies PyTorch's elementwise type promotion before and after the function: tensor
operands arrive already cast to the computation dtype (float32 for half types, as PyTorch's opmath),
the result is cast to PyTorch's result dtype. In-place (`add_`) and `out=` variants are derived from
the functional op: nobody writes them by hand. `random=True` lowerings receive a `key=` PRNG key.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from .dtypes import KIND, operand_facts, promote

__all__ = ["lowering", "LOWERINGS", "Lowering", "KIND", "apply"]


@dataclasses.dataclass(frozen=True)
class Lowering:
    name: str
    fn: Callable
    promote: KIND | None = None
    promote_args: tuple | None = None   # positions of the operands that take part (default: all)
    random: bool = False
    keep_result_dtype: bool = False     # the function returns PyTorch's dtype itself
    mutates: tuple = ()                 # ((position, name), ...) written although the schema says not
    static_scalars: bool = False        # Scalars decide shapes (arange): compile per value
    traced: tuple = ()                  # names of float/int arguments to trace like Scalars (lr)


LOWERINGS: dict[str, Lowering] = {}


def lowering(*names, promote=None, promote_args=None, random=False, keep_result_dtype=False, mutates=(),
             static_scalars=False, traced=()):
    """Register `fn` as the lowering of the ATen ops `names` ("add.Tensor", "relu.default", ...)."""

    def register(fn):
        for name in names:
            full = name if "." in name else name + ".default"
            if full in LOWERINGS:
                raise ValueError(f"two lowerings for aten::{full}")
            LOWERINGS[full] = Lowering(full, fn, promote, promote_args, random, keep_result_dtype, mutates,
                                       static_scalars, tuple(traced))
        return fn

    return register


def _cast(v, dtype):
    if hasattr(v, "dtype") and not getattr(v, "weak_type", False):
        return v if v.dtype == dtype else v.astype(dtype)
    return v


def apply(low: Lowering, args, kwargs):
    """Call a lowering with PyTorch's type promotion applied around it."""
    if low.promote is None:
        return low.fn(*args, **kwargs)
    positions = low.promote_args if low.promote_args is not None else range(len(args))
    operands = [args[i] for i in positions if i < len(args)]
    compute, result = promote(low.promote, operand_facts(operands))
    args = list(args)
    for i in positions:
        if i < len(args) and args[i] is not None:
            args[i] = _cast(args[i], compute) if hasattr(args[i], "dtype") else args[i]
    out = low.fn(*args, **kwargs)
    if low.keep_result_dtype:
        return out
    if isinstance(out, tuple):
        return tuple(o.astype(result) if o.dtype != result else o for o in out)
    return out.astype(result) if out.dtype != result else out

