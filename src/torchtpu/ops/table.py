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
the functional op: nobody writes them by hand. `random=True` lowerings receive a `key=` PRNG key;
`draws_by_index=True` says each element of the result is a function of the key, the op's scalars and
its flat index alone (counter-based draws that read no tensor values), so the eager engine may draw
a whole size bucket and keep the first elements (eager/bucketed_draws.py). `index_buckets=f` says the
op writes through an index whose length does not shape the result: f(*args, **kwargs) names the
arguments that may be padded to a size bucket with entries the op drops (eager/bucketed_index.py).

Every other fact about an op is declared here too, as an argument of `@lowering`, so the op's name
finds all of them (docs/design.md, "Adding an op"):

    real_only=True          complex inputs raise, as PyTorch's CPU and CUDA kernels (reject_complex); a
                            string: the RuntimeError message the CPU raises instead of its dtype error
    blas=True               a promoting op whose CPU kernel is a BLAS call, not an elementwise loop: its
                            in-place and out= writes skip the memory-overlap checks (eager/overlap.py)
    host_check=f            f(*args, **kwargs) checks Scalar arguments on the host per call (argument_checks.py)
    meta_check=f            an argument check PyTorch's meta kernel leaves out, run before the op is built
    meta=f                  the meta function the engine and Dynamo's fake tensors use on "tpu" instead of PyTorch's
    missing_meta=f          a Meta kernel registered for an op PyTorch ships without one
    mask_args=i             position of an index list whose boolean masks become indices first (eager)
    inplace_variant="foo_.ov"  the in-place overload whose functional twin this is, where the names do not say
    write_overlap=WriteOverlap(...)  ATen's memory-overlap rules for the op's in-place and out= writes,
                            where it is not an elementwise op (those follow TensorIterator's: eager/overlap.py)
    output_layout="memory_format"  the CPU kernel lays its new outputs out contiguously, or channels_last
                            for a channels_last input, where PyTorch's meta kernel keeps another input
                            layout (the engine otherwise takes the meta kernel's strides); or f(*args,
                            **kwargs) -> "memory_format" or "meta", per call
    no_loop_for=dtypes      torch dtypes the CPU kernel has no loop for (its NotImplementedError "... not
                            implemented for 'UInt32'"), where the lowering would compute: checked on the
                            dtype the CPU dispatches on (dispatch_dtype), once per executable. A promoting
                            (elementwise) lowering lacks WIDE_UNSIGNED (uint16/32/64) too, but
    loops_for=WIDE_UNSIGNED an elementwise lowering whose CPU kernel has loops for them (mul, eq, bitwise_and)
    cpu_operands=("index",) tensor arguments that may live on the CPU when the op runs on tpu: the eager
                            engine moves them to the op's device (the index of index_select and the
                            index_* writes, as advanced indexing takes a CPU index on CUDA); a CPU
                            tensor in any other argument raises PyTorch's device error
    flat_buckets=True       an elementwise op computing each element alike (no rounding by position): small
                            new shapes run on flat arrays padded to a size bucket on XLA:CPU (eager/flat_buckets.py)
    reduction_buckets=f     a reduction or scan along one dim (or over every element) whose result does not depend
                            on the reduction's order (max, argmax, any, integer sums, scans' prefixes): f(*args,
                            **kwargs) -> (dim or None, identity, scan) or None; small new lengths run on an operand
                            padded with the identity to a size bucket on XLA:CPU (eager/reduction_buckets.py)
    set_buckets=names       a membership test (isin): operand 0 elementwise, operand 1 a set (a copy of one of its
                            elements added changes no answer); small new shapes run on both flattened and padded
                            to size buckets on XLA:CPU (eager/set_buckets.py); `names`: static arguments the
                            lowering does not read (left out of the key there)
    matrix_batches=f        an op computing each matrix of a batch alone: f(*args, **kwargs) names the batched
                            tensor arguments ((name, core dims, pad), or None where the call does not fit); a
                            call with batch dims runs on a flat batch padded to a size bucket (eager/matrix_batches.py)
    matmul_buckets="mk,kn->mn"  a matrix product (the letters of each tensor operand's dims -> the result's): small
                            new shapes run on operands zero-padded to size buckets on XLA:CPU (eager/matmul_buckets.py)
    composite_in_eager=True an ATen CompositeImplicit op (it decomposes before a backend sees it) that
                            eager runs whole, one executable instead of one per step; for ops without a
                            gradient only (the kernel sits on the Autograd key too)

A per-overload fact is one value for every name of the decorator, or a dict from overload names (the
decorator's own, or their in-place and out= variants, named explicitly) to values. The tables other
layers read (REAL_ONLY, declared_facts(...)) are read-only views derived from these declarations.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable

import torch
from torch._prims_common import elementwise_dtypes

from .dtypes import (
    KIND,
    WIDE_UNSIGNED,
    convert,
    not_implemented_for,
    operand_facts,
    promote,
    round_to,
    rounded_operand_dtype,
    to_torch,
)

__all__ = [
    "INDEXED_WRITE",
    "KIND",
    "LOWERINGS",
    "Lowering",
    "WriteOverlap",
    "apply",
    "declared_facts",
    "expanded_warning",
    "lowering",
    "real_only_without_lowering",
]


@dataclasses.dataclass(frozen=True)
class Lowering:
    name: str
    fn: Callable
    promote: KIND | None = None
    promote_args: tuple | None = None  # positions of the operands that take part (default: all)
    random: bool = False
    keep_result_dtype: bool = False  # the function returns PyTorch's dtype itself
    mutates: tuple = ()  # ((position, name), ...) written although the schema says not
    static_scalars: bool = False  # Scalars decide shapes (arange): compile per value
    traced: tuple = ()  # names of float/int arguments to trace like Scalars (lr)
    real_only: bool | str = False  # complex inputs raise (REAL_ONLY)
    blas: bool = False  # promotes, but the CPU kernel is a BLAS call, not an elementwise loop
    draws_by_index: bool = False  # random draws whose element i depends on (key, scalars, i) only
    # called with half_parts=True where its tensor is complex32, which it sees as complex64 (ops/dtypes.py)
    half_parts: bool = False
    index_buckets: Callable | None = None  # the arguments a size bucket pads (eager/bucketed_index.py)


LOWERINGS: dict[str, Lowering] = {}

# the facts declared per overload with `@lowering(..., kind=value)`: kind -> {overload: value}
FACT_KINDS = (
    "host_check",
    "meta_check",
    "meta",
    "missing_meta",
    "mask_args",
    "inplace_variant",
    "write_overlap",
    "output_layout",
    "composite_in_eager",
    "no_loop_for",
    "loops_for",
    "cpu_operands",
    "flat_buckets",
    "matrix_batches",
    "reduction_buckets",
    "set_buckets",
    "matmul_buckets",
)
_FACTS: dict[str, dict] = {kind: {} for kind in FACT_KINDS}
# overload -> the lowering (its first name) that declared a fact about it, for tests/test_op_facts.py
FACT_OWNERS: dict[str, dict[str, str]] = {kind: {} for kind in FACT_KINDS}
_REAL_ONLY: dict[str, bool | str] = {}  # base name -> True, or the CPU's message
_REAL_ONLY_WITHOUT_LOWERING: set = set()


@dataclasses.dataclass(frozen=True)
class WriteOverlap:
    """How an op's CPU kernel guards the tensor it writes (ATen's MemOverlap checks): a written tensor
    that overlaps itself (an expanded view) raises, or gives this deprecation warning where
    `expanded_warning` is set; the arguments named in `no_overlap` may not share any element with
    it (assert_no_overlap), those in `no_partial_overlap` only all of them, with the same strides.
    `unchecked`: the CPU's kernel makes none of these checks (threshold_, idempotent, writes an
    expanded tensor)."""

    expanded_warning: str | None = None
    no_overlap: tuple = ()
    no_partial_overlap: tuple = ()
    unchecked: bool = False


def expanded_warning(op: str, example: str) -> str:
    """The CPU's deprecation warning for an indexed write into an expanded tensor."""
    return (
        f"Use of {op} on expanded tensors is deprecated. Please clone() the tensor before performing this "
        f"operation. This also applies to advanced indexing e.g. {example}"
    )


# index_add_, index_copy_, put_, scatter_, ...: no expanded `self`, no index or source sharing its memory
INDEXED_WRITE = WriteOverlap(no_overlap=("index", "source", "src"))


def _full_name(name):
    return name if "." in name else name + ".default"


def lowering(
    *names,
    promote=None,
    promote_args=None,
    random=False,
    keep_result_dtype=False,
    mutates=(),
    static_scalars=False,
    traced=(),
    real_only=False,
    blas=False,
    draws_by_index=False,
    half_parts=False,
    index_buckets=None,
    **facts,
):
    """Register `fn` as the lowering of the ATen ops `names` ("add.Tensor", "relu.default", ...), with
    the facts about those ops (the module docstring lists them)."""
    unknown = set(facts) - set(FACT_KINDS)
    if unknown:
        raise TypeError(f"unknown op facts {sorted(unknown)}")
    full_names = [_full_name(n) for n in names]
    declared = {kind: _per_overload(kind, value, full_names) for kind, value in facts.items()}

    def register(fn):
        # every check before the first write: a refused declaration leaves the tables as they were
        for full in full_names:
            if full in LOWERINGS:
                raise ValueError(f"two lowerings for aten::{full}")
        for kind, values in declared.items():
            for name in values:
                if name in _FACTS[kind]:
                    raise ValueError(f"{kind} of aten::{name} declared twice")
        for full in full_names:
            LOWERINGS[full] = Lowering(
                full,
                fn,
                promote,
                promote_args,
                random,
                keep_result_dtype,
                mutates,
                static_scalars,
                tuple(traced),
                real_only,
                blas,
                draws_by_index,
                half_parts,
                index_buckets,
            )
            if real_only:
                _REAL_ONLY[full.split(".")[0]] = real_only
        for kind, values in declared.items():
            _FACTS[kind].update(values)
            FACT_OWNERS[kind].update(dict.fromkeys(values, full_names[0]))
        return fn

    return register


def _per_overload(kind, value, full_names):
    """{overload: fact} from one value (for every name of the decorator) or a dict by overload name."""
    if kind == "inplace_variant":  # maps the in-place overload to this (single) functional one
        (functional,) = full_names
        return {_full_name(value): functional}
    if not isinstance(value, dict):
        return dict.fromkeys(full_names, value)
    return {_full_name(name): fact for name, fact in value.items()}


def declared_facts(kind: str) -> types.MappingProxyType:
    """{overload: value} of one fact kind, as declared with the lowerings (a read-only view)."""
    return types.MappingProxyType(_FACTS[kind])


def real_only_without_lowering(*names):
    """Declare real-only ATen ops (base names) that have no lowering of their own: composites that
    decompose before reaching the backend, and ops the eager layer implements by hand."""
    for name in names:
        if name in _REAL_ONLY_WITHOUT_LOWERING:
            raise ValueError(f"real_only of aten::{name} declared twice")
        _REAL_ONLY_WITHOUT_LOWERING.add(name)
        _REAL_ONLY[name] = True


def _cast(v, dtype):
    if hasattr(v, "dtype") and not getattr(v, "weak_type", False):
        return v if v.dtype == dtype else (convert(v, dtype) if v.dtype == bool else v.astype(dtype))
    return v


# ATen ops (base names) whose CPU and CUDA kernels reject complex inputs (orderings, rounding,
# activations and special functions with no complex meaning), from `real_only=True` on their lowerings
# and real_only_without_lowering(...). Their lowerings would compute something (JAX orders complex
# numbers lexicographically), so complex inputs raise here, as on those devices.
REAL_ONLY = types.MappingProxyType(_REAL_ONLY)


def reject_complex(name, values):
    """Raise as PyTorch's kernels do when an op of REAL_ONLY (`name` its ATen name, an in-place or out=
    variant included) gets a complex tensor or array among `values`."""
    base = name.split(".")[0]
    base = base[:-1] if base.endswith("_") and not base.endswith("__") else base
    if base not in REAL_ONLY:
        return
    for v in values:  # torch (meta) tensors or JAX arrays: their dtype names agree
        kind = str(getattr(v, "dtype", "")).replace("torch.", "")
        if kind in ("complex64", "complex128", "complex32"):  # (complex32: meta tensors; its arrays are complex64)
            if isinstance(REAL_ONLY[base], str):  # the op's own words on the CPU
                raise RuntimeError(REAL_ONLY[base])
            raise not_implemented_for(base, v.dtype)


def dispatch_dtype(low: Lowering, args, kwargs, kind=KIND.NO_OPMATH):
    """The dtype the CPU kernel of `low` picks its loop by, from meta arguments: for a promoting op the
    common dtype of its operands (TensorIterator's; with `kind` INT_TO_FLOAT, an integral one becomes
    the float it computes in), else the `dtype=` it makes (a factory), else the dtype of its first tensor
    argument; None without one."""
    if low.promote is not None:
        positions = low.promote_args if low.promote_args is not None else range(len(args))
        numbers = (torch.Tensor, bool, int, float, complex)
        operands = [args[i] for i in positions if i < len(args) and isinstance(args[i], numbers)]
        if operands:
            tensors = [t for t in operands if isinstance(t, torch.Tensor)]
            for i, a in enumerate(tensors):  # the CPU's promotion errors (uint32 with int64)
                for b in tensors[i + 1 :]:
                    torch.result_type(a, b)
            return elementwise_dtypes(*operands, type_promotion_kind=kind)[1]
    made = kwargs.get("dtype")
    if made is not None:  # a factory's (arange, linspace, eye, and their out= through their twin)
        return made if isinstance(made, torch.dtype) else to_torch(made)
    return next((a.dtype for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)


def reject_missing_loop(low: Lowering, args, kwargs):
    """Raise the CPU's NotImplementedError where `low`'s op has no CPU loop for the dtype it dispatches
    on: `no_loop_for` of the lowering, and for an elementwise (promoting) one WIDE_UNSIGNED less its
    `loops_for` (meta arguments, once per executable)."""
    lacking = _FACTS["no_loop_for"].get(low.name, ())
    wide = low.promote is not None and low.name not in _FACTS["loops_for"]
    if not lacking and not wide:
        return
    if low.random and args and isinstance(args[0], torch.Tensor) and args[0].numel() == 0:
        return  # a random fill of an empty tensor returns before the CPU's dispatch (normal_, bernoulli_)
    out = kwargs.get("out")
    kwargs = {k: v for k, v in kwargs.items() if k != "out"}
    dtype = dispatch_dtype(low, args, kwargs)
    if dtype is None and isinstance(out, torch.Tensor):  # a factory's out= (arange(out=)): its dtype
        dtype = out.dtype
    if dtype not in lacking and wide and low.promote == KIND.INT_TO_FLOAT:
        dtype = dispatch_dtype(low, args, kwargs, KIND.INT_TO_FLOAT)  # sqrt(uint32) computes in float
    if dtype in lacking or (wide and dtype in WIDE_UNSIGNED):
        raise not_implemented_for(low.name.split(".")[0].strip("_"), dtype)


def apply(low: Lowering, args, kwargs):
    """Call a lowering with PyTorch's type promotion applied around it."""
    # (at tracing time only: no cost per call; not `out`: see resolve)
    reject_complex(low.name, (*args, *(v for k, v in kwargs.items() if k != "out")))
    if low.promote is None:
        return low.fn(*args, **kwargs)
    positions = low.promote_args if low.promote_args is not None else range(len(args))
    operands = [args[i] for i in positions if i < len(args)]
    facts = operand_facts(operands)
    compute, result = promote(low.promote, facts)
    rounded = rounded_operand_dtype(low.promote, facts)
    args = list(args)
    for i in positions:
        if i < len(args) and args[i] is not None and hasattr(args[i], "dtype"):
            v = args[i]
            if rounded is not None and v.ndim and v.dtype not in (rounded, bool):
                v = round_to(v, rounded)  # (a tensor of another dtype beside a half one: see rounded_operand_dtype)
            args[i] = _cast(v, compute)
    out = low.fn(*args, **kwargs)
    if low.keep_result_dtype:
        return out
    if isinstance(out, tuple):
        return tuple(o.astype(result) if o.dtype != result else o for o in out)
    return out.astype(result) if out.dtype != result else out
