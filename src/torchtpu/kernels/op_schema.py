"""A jax_op's operator schema, read from its JAX function's signature, and the way back: a schema's
static values as the JAX function takes them (`Spec`).

Parameters annotated `jax.Array` / `torch.Tensor` (optional, or a sequence of them) are tensors; every
other supported annotation is a static value (`classify`)."""

from __future__ import annotations

import collections.abc
import enum
import functools
import inspect
import types
import typing
from typing import Any, NamedTuple, Union

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..ops import dtypes as dt
from ..ops import pallas_support

TENSOR_TYPES = (jax.Array, torch.Tensor)


# ---------------------------------------------------------------- annotations -> schema
class Param(NamedTuple):
    name: str
    kind: str  # "tensor", "tensors" (a list), "static"
    schema_type: Any  # the torch annotation PyTorch's infer_schema understands
    default: Any  # inspect.Parameter.empty when required
    keyword_only: bool
    annotation: Any  # the user's annotation (to rebuild enums)


def _unwrap(t):
    while typing.get_origin(t) is typing.Annotated:
        t = typing.get_args(t)[0]
    return t


def _split_optional(t):
    t = _unwrap(t)
    if typing.get_origin(t) in (Union, types.UnionType):
        args = [_unwrap(a) for a in typing.get_args(t)]
        rest = [a for a in args if a is not type(None)]
        if len(rest) < len(args):
            return (rest[0] if len(rest) == 1 else Union[tuple(rest)]), True  # noqa: UP007 (a Union built at run time)
    return t, False


def _sequence_element(t):
    origin = typing.get_origin(t)
    args = typing.get_args(t)
    if origin in (list, collections.abc.Sequence) and len(args) == 1:
        return args[0]
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        if all(a == args[0] for a in args):
            return args[0]
    return None


def _is_dtype_annotation(t):
    return t in (torch.dtype, np.dtype) or (isinstance(t, type) and issubclass(t, (np.dtype, np.generic)))


def _static_base(t):
    """The torch annotation of a static scalar annotation, or None if unsupported."""
    if t in (bool, int, float, str, torch.device):
        return t
    if t is torch.types.Number:
        return float
    if _is_dtype_annotation(t):
        return torch.dtype
    if isinstance(t, type) and issubclass(t, enum.Enum):
        values = [m.value for m in t]
        for kind in (bool, int, float, str):
            if values and all(type(v) is kind for v in values):
                return kind
        return None
    origin = typing.get_origin(t)
    if origin is typing.Literal:
        values = typing.get_args(t)
        for kind in (bool, int, float, str):
            if values and all(type(v) is kind for v in values):
                return kind
        return None
    if origin in (Union, types.UnionType):
        args = set(typing.get_args(t))
        if args <= {int, float, bool}:
            return float if float in args else int
        if all(_is_dtype_annotation(a) for a in args):
            return torch.dtype
    return None


def classify(param: inspect.Parameter, where: str) -> Param:
    ann = param.annotation
    if ann is inspect.Parameter.empty:
        raise TypeError(
            f"jax_op {where}: parameter {param.name!r} has no type annotation. Annotate tensors "
            f"as jax.Array (or torch.Tensor, or a sequence of them) and static arguments with "
            f"their Python type (int, float, bool, str, a dtype, ...)"
        )
    if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
        raise TypeError(f"jax_op {where}: *args/**kwargs ({param.name!r}) cannot form an operator schema")
    if isinstance(ann, str):
        raise TypeError(
            f"jax_op {where}: the annotation {ann!r} of parameter {param.name!r} cannot be evaluated "
            f"(a name that is not a module-level global, under `from __future__ import annotations`?)"
        )
    base, optional = _split_optional(ann)
    kw = param.kind is param.KEYWORD_ONLY
    default = param.default
    if base in TENSOR_TYPES:
        if kw:
            raise TypeError(
                f"jax_op {where}: tensor parameter {param.name!r} is keyword-only; PyTorch custom "
                f"ops take tensors positionally"
            )
        return Param(
            param.name,
            "tensor",
            typing.Optional[torch.Tensor] if optional else torch.Tensor,
            None if default is not inspect.Parameter.empty and default is None else default,
            kw,
            ann,
        )
    elem = _sequence_element(base)
    if elem is not None:
        elem_base, elem_optional = _split_optional(elem)
        if elem_base in TENSOR_TYPES:
            if kw:
                raise TypeError(
                    f"jax_op {where}: tensor parameter {param.name!r} is keyword-only; PyTorch custom "
                    f"ops take tensors positionally"
                )
            inner = typing.Optional[torch.Tensor] if elem_optional else torch.Tensor
            st = typing.Sequence[inner]
            return Param(param.name, "tensors", typing.Optional[st] if optional else st, default, kw, ann)
        mapped = _static_base(elem_base)
        if mapped in (int, float, bool) and not elem_optional:
            st = typing.Sequence[mapped]
            return Param(
                param.name, "static", typing.Optional[st] if optional else st, _schema_default(default), kw, ann
            )
    else:
        mapped = _static_base(base)
        if mapped is not None:
            return Param(
                param.name, "static", typing.Optional[mapped] if optional else mapped, _schema_default(default), kw, ann
            )
    raise TypeError(
        f"jax_op {where}: parameter {param.name!r}: annotation {ann!r} is not supported (use "
        f"jax.Array / torch.Tensor, sequences of them, or int, float, bool, str, a dtype, "
        f"torch.device, Literal, Enum, or sequences of int/float/bool)"
    )


def _schema_default(value):
    if value is inspect.Parameter.empty or value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return tuple(value)
    if isinstance(value, torch.dtype):
        return value
    try:
        return dt.to_torch(jnp.dtype(value))
    except (TypeError, KeyError):
        raise TypeError(f"jax_op: default value {value!r} cannot be part of an operator schema") from None


def return_schema(ann, where):
    if ann is inspect.Signature.empty:
        raise TypeError(
            f"jax_op {where}: the function needs a return annotation (jax.Array, a tuple of "
            f"jax.Array, or Sequence[jax.Array])"
        )
    ann = _unwrap(ann)
    if ann is None or ann is type(None):
        return "()"
    if ann in TENSOR_TYPES:
        return "Tensor"
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if all(_unwrap(a) in TENSOR_TYPES for a in args):
            return "(" + ", ".join("Tensor" for _ in args) + ")"
    elem = _sequence_element(ann)
    if elem is not None and _unwrap(elem) in TENSOR_TYPES:
        return "Tensor[]"
    raise TypeError(
        f"jax_op {where}: return annotation {ann!r} is not supported (jax.Array, a tuple of "
        f"jax.Array, Sequence[jax.Array] or None)"
    )


def operator_schema(params: list[Param], returns: str) -> str:
    def dummy(*args, **kwargs):
        pass

    sig_params = []
    for p in params:
        kind = inspect.Parameter.KEYWORD_ONLY if p.keyword_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        sig_params.append(inspect.Parameter(p.name, kind, annotation=p.schema_type, default=p.default))
    dummy.__signature__ = inspect.Signature(sig_params, return_annotation=torch.Tensor)
    inferred = torch.library.infer_schema(dummy, mutates_args=())
    return inferred.rsplit(" -> ", 1)[0] + " -> " + returns


def bound_keywords(fn):
    names = set()
    while True:
        if isinstance(fn, functools.partial):
            names.update(fn.keywords or {})
            fn = fn.func
        elif hasattr(fn, "__wrapped__"):
            fn = fn.__wrapped__
        else:
            return names


def evaluated_signature(fn):
    target = fn
    if not isinstance(fn, functools.partial):
        target = inspect.unwrap(fn)
    try:
        return inspect.signature(target, eval_str=True)
    except (NameError, TypeError):
        pass
    # a name in some annotation is not a global (a class local to a function, with
    # `from __future__ import annotations`): evaluate the others one by one
    sig = inspect.signature(target)
    namespace = getattr(
        inspect.unwrap(target) if not isinstance(target, functools.partial) else target.func, "__globals__", {}
    )

    def evaluate(ann):
        if not isinstance(ann, str):
            return ann
        try:
            return eval(ann, namespace)
        except Exception:  # noqa: BLE001 - reported by classify with the annotation's text
            return ann

    params = [p.replace(annotation=evaluate(p.annotation)) for p in sig.parameters.values()]
    return sig.replace(parameters=params, return_annotation=evaluate(sig.return_annotation))


# ---------------------------------------------------------------- static values: schema -> JAX
def _jax_static(value, p: Param):
    """A static argument as the JAX function expects it (dtypes as JAX dtypes, sequences as tuples,
    enum members rebuilt)."""
    if value is None:
        return None
    if isinstance(value, torch.dtype):
        return dt.to_jax(value)
    if isinstance(value, list):
        return tuple(value)
    base, _ = _split_optional(p.annotation)
    if isinstance(base, type) and issubclass(base, enum.Enum) and not isinstance(value, base):
        return base(value)
    return value


def caller_value(v):
    """A caller's argument as PyTorch's schema takes it: JAX/numpy dtypes become torch dtypes, enum
    members their values."""
    if isinstance(v, enum.Enum):
        return v.value
    if v is None or isinstance(v, (torch.Tensor, bool, int, float, str, torch.dtype)):
        return v
    if isinstance(v, (np.dtype, type)) and not isinstance(v, (list, tuple)):
        try:
            return dt.to_torch(jnp.dtype(v))
        except (TypeError, KeyError):
            return v
    return v


class Spec:
    """What a jax_op's lowering needs: how schema arguments map onto the JAX function."""

    def __init__(self, fn, params: list[Param], returns: str):
        self.fn = fn
        self.params = params
        self.positional = [p for p in params if not p.keyword_only]
        self.by_name = {p.name: p for p in params}
        self.returns = returns

    def call_args(self, args, kwargs):
        """(args, kwargs) of the JAX function from the schema's (args, kwargs); static values converted.
        Arguments PyTorch left out (equal to their defaults) take the function's own defaults."""
        out_kw = {}
        for p, v in zip(self.positional, args):
            out_kw[p.name] = v if p.kind != "static" else _jax_static(v, p)
        for k, v in kwargs.items():
            p = self.by_name[k]
            out_kw[k] = v if p.kind != "static" else _jax_static(v, p)
        return out_kw

    def run(self, args, kwargs):
        # a pl.pallas_call inside traces its kernel and index maps with 32-bit ints (Mosaic has no int64)
        with pallas_support.pallas_calls_in_32_bits():
            out = self.fn(**self.call_args(args, kwargs))
        return self.normalize(out)

    def normalize(self, out):
        if self.returns == "()":
            return ()
        if self.returns == "Tensor":
            if isinstance(out, (tuple, list)) and len(out) == 1:
                out = out[0]
            return jnp.asarray(out)
        if self.returns == "Tensor[]":
            return [jnp.asarray(o) for o in out]
        return tuple(jnp.asarray(o) for o in out)
