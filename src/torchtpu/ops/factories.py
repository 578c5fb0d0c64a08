"""Lowerings: factories."""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from .argument_checks import factory_value_check, no_internal_overlap
from .dtypes import WIDE_UNSIGNED, default_dtype, not_implemented_for, scalar_type_name, to_jax
from .table import lowering

# the CPU's ramps (arange, linspace, logspace) have no bool or wide unsigned loops
_RAMP_NO_LOOP = (torch.bool, *WIDE_UNSIGNED)
ARANGE_NO_LOOP = (*_RAMP_NO_LOOP, torch.complex32, torch.complex64, torch.complex128)


def default_float():
    """torch.get_default_dtype() as a JAX dtype (a counted read: the eager engine then keys the
    executable on it, ops/dtypes.py default_dtype)."""
    return to_jax(default_dtype())


def _inferred_dtype(*values):
    """The dtype PyTorch gives a factory without dtype= from its values: bool, int64, the default
    complex dtype or the default float dtype."""
    kinds = {jnp.asarray(v).dtype.kind for v in values}
    if kinds == {"b"}:
        return jnp.bool_
    if kinds <= {"b", "i", "u"}:
        return jnp.int64
    if "c" in kinds:
        return jnp.complex128 if default_float() == jnp.float64 else jnp.complex64
    return default_float()


@lowering(
    "full",
    host_check={"full.default": factory_value_check(1, "fill_value"), "full.out": factory_value_check(1, "fill_value")},
)
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, dtype or _inferred_dtype(fill_value))


@lowering("_efficientzerotensor")
def efficient_zero_tensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    # PyTorch's ZeroTensor is a CPU/CUDA storage-free optimisation; a dense zero is equivalent
    return jnp.zeros(tuple(size), dtype or default_float())


@lowering("scalar_tensor", host_check=factory_value_check(0, "s"))
def scalar_tensor(s, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s, dtype or default_float())


def arange_dtype(start, end, step, dtype=None):
    return dtype or (jnp.int64 if all(isinstance(v, int) for v in (start, end, step)) else default_float())


def arange_length(start, end, step, dtype):
    """PyTorch's length of arange (its int64 kernel truncates start/end/step to integers and
    divides in integer arithmetic; other dtypes use doubles)."""
    if dtype == jnp.int64:
        s, e, st = int(start), int(end), int(step)
        sgn = (st > 0) - (st < 0)
        num = e - s + st - sgn
        return max(abs(num) // abs(st) * (1 if (num >= 0) == (st > 0) else -1), 0)  # C++ truncation
    size = math.ceil((float(end) - float(start)) / float(step))
    if size > float(2**63 - 1):  # the CPU's check of the double length against int64
        raise RuntimeError("invalid size, possible overflow?")
    return max(0, size)


@lowering("arange.start_step", static_scalars=True, no_loop_for=ARANGE_NO_LOOP)
def arange(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    # compiled graphs only: eager arange allocates `out` at the length above and runs arange.start_out
    d = arange_dtype(start, end, step, dtype)
    return _arange_values(start, step, arange_length(start, end, step, d), d)


def _arange_values(start, step, n, d):
    if jnp.issubdtype(d, jnp.integer) or d == jnp.bool_:
        as_int = lambda v: v if isinstance(v, int) else jnp.trunc(jnp.asarray(v)).astype(jnp.int64)
        return (as_int(start) + jnp.arange(n, dtype=jnp.int64) * as_int(step)).astype(d)
    acc = jnp.float32 if d in (jnp.float16, jnp.bfloat16) else jnp.float64  # PyTorch's CPU acc_type
    return (jnp.asarray(start, acc) + jnp.arange(n, dtype=acc) * jnp.asarray(step, acc)).astype(d)


def _fill_out_meta(packet, overload):
    """The meta function of a factory's out= overload on "tpu". PyTorch's CPU and CUDA kernels resize
    `out` only when its element count differs from the result's, and otherwise fill it in its own
    shape (a (2, 2) view of a wider tensor takes `arange(4)` row by row); PyTorch's meta function
    resizes whenever the shape differs, which would move a view's writes onto other elements. The
    scratch tensor is empty, so PyTorch's meta resizes it without its resize warning: linspace and
    logspace resize silently on the CPU (arange's own warning: eager/kernels.py, _arange_start_out)."""

    def meta(*args, out, **kwargs):
        no_internal_overlap(out)  # (an expanded `out`: the CPU refuses to write it)
        scratch = torch.empty(0, dtype=out.dtype, device="meta")
        getattr(getattr(torch.ops.aten, packet), overload)(*args, out=scratch, **kwargs)
        if scratch.numel() != out.numel():
            out.resize_(scratch.shape)
        return out

    return meta


@lowering("arange.start_out", meta=_fill_out_meta("arange", "start_out"), no_loop_for=ARANGE_NO_LOOP)
def arange_out(start, end, step=1, *, out):
    # `out` arrives sized to PyTorch's length, so start and step stay traced: a decoding loop's
    # `arange(pos, pos + n)` reuses one executable for every position
    return _arange_values(start, step, out.size, out.dtype).reshape(out.shape)


@lowering("range.step", static_scalars=True)
def range_step(start, end, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    """torch.range (deprecated, end included): floor((end - start) / step) + 1 values, computed in
    int64 for integer dtypes and in double otherwise, as PyTorch's CPU kernel."""
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if not all(math.isfinite(float(v)) for v in (start, end)):
        raise RuntimeError(f"unsupported range: {start} -> {end}")
    if not ((step > 0 and end >= start) or (step < 0 and end <= start)):
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    d = dtype or default_float()
    n = math.floor((float(end) - float(start)) / float(step)) + 1
    acc = jnp.int64 if jnp.issubdtype(d, jnp.integer) else jnp.float64
    return (jnp.asarray(start, acc) + jnp.arange(n, dtype=acc) * jnp.asarray(step, acc)).astype(d)


@lowering(
    "range.out",
    "range.out_",
    static_scalars=True,
    meta={"range.out": _fill_out_meta("range", "out"), "range.out_": _fill_out_meta("range", "out_")},
)
def range_out(start, end, step=1, *, out):
    # filled in `out`'s own shape, as arange.start_out (a non-contiguous view of as many elements)
    return range_step(start, end, step, dtype=out.dtype).reshape(out.shape)


def _compute_dtype(d):
    # PyTorch's CPU kernel steps in double for integers and in the (op-math) float type otherwise
    if jnp.issubdtype(d, jnp.complexfloating):
        return d
    if jnp.issubdtype(d, jnp.integer) or d == jnp.bool_ or d == jnp.float64:
        return jnp.float64
    return jnp.float32


def _ramp(start, end, steps, d):
    """PyTorch's linspace: start + i*step for the first half, end - (steps-1-i)*step after."""
    c = _compute_dtype(d)
    s = jnp.asarray(start).astype(d).astype(c)
    e = jnp.asarray(end).astype(d).astype(c)
    if steps == 1:
        return jnp.reshape(s, (1,))
    i = jnp.arange(steps, dtype=c)
    # a true division: XLA turns a division by a constant into a multiplication by its reciprocal,
    # and (999999 / 999999) became 0.99999..., truncating half of an integer ramp one too low
    step = (e - s) / lax.optimization_barrier(jnp.asarray(steps - 1, c))
    return jnp.where(i < steps // 2, s + step * i, e - step * (steps - 1 - i))


def _ramp_dtype(start, end):
    # linspace/logspace without dtype=: the default complex dtype for complex ends, else the default
    complex_ends = jnp.iscomplexobj(start) or jnp.iscomplexobj(end)
    return _inferred_dtype(1j if complex_ends else 1.0)


def _ramp_loop_check(name, steps, dtype):
    """linspace/logspace: the CPU fills a ramp of two or more values by dtype (none for bool or the wide
    unsigned types); fewer steps return before its dispatch (an empty result, or `start` filled in)."""
    if dtype in _RAMP_NO_LOOP and isinstance(steps, int) and steps > 1:
        raise not_implemented_for(name, dtype)


def _ramp_out_loop_check(name):
    def check(start, end, steps, *args, out=None, **kwargs):
        _ramp_loop_check(name, steps, out.dtype if isinstance(out, torch.Tensor) else None)

    return check


def _complex_ends_check(name):
    """The CPU's error for complex ends with a real dtype= (it names the default complex dtype,
    whatever the ends' own precision); PyTorch's meta words it otherwise."""

    def check(start, end, steps=None, *args, dtype=None, **kwargs):
        _ramp_loop_check(name, steps, dtype)
        complex_ends = any(
            v.dtype.is_complex if isinstance(v, torch.Tensor) else isinstance(v, complex) for v in (start, end)
        )
        if complex_ends and dtype is not None and not dtype.is_complex:
            inferred = "c10::complex<double>" if torch.get_default_dtype() == torch.float64 else "c10::complex<float>"
            raise RuntimeError(
                f"torch.{name}(): inferred dtype {inferred} can't be safely cast to passed dtype "
                f"{scalar_type_name(dtype)}"
            )

    return check


@lowering(
    "linspace",
    "linspace.Tensor_Tensor",
    "linspace.Tensor_Scalar",
    "linspace.Scalar_Tensor",
    meta_check=_complex_ends_check("linspace"),
)
def linspace(start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    d = dtype or _ramp_dtype(start, end)
    if steps == 0:
        return jnp.zeros((0,), d)
    return _ramp(start, end, steps, d).astype(d)


@lowering(
    "logspace",
    "logspace.Tensor_Tensor",
    "logspace.Tensor_Scalar",
    "logspace.Scalar_Tensor",
    meta_check=_complex_ends_check("logspace"),
)
def logspace(start, end, steps, base=10.0, dtype=None, layout=None, device=None, pin_memory=None):
    d = dtype or _ramp_dtype(start, end)
    if steps == 0:
        return jnp.zeros((0,), d)
    c = _compute_dtype(d)
    return jnp.power(jnp.asarray(base, c), _ramp(start, end, steps, d)).astype(d)


# out= factories have no functional twin with the same arguments (their dtype comes from `out`)
_LINSPACE_OUTS = (
    "linspace.out",
    "linspace.Tensor_Tensor_out",
    "linspace.Tensor_Scalar_out",
    "linspace.Scalar_Tensor_out",
)
_LOGSPACE_OUTS = tuple(n.replace("linspace", "logspace") for n in _LINSPACE_OUTS)


@lowering(
    *_LINSPACE_OUTS,
    meta={n: _fill_out_meta(*n.split(".")) for n in _LINSPACE_OUTS},
    meta_check=_ramp_out_loop_check("linspace"),
)
def linspace_out(start, end, steps, *, out):
    return linspace(start, end, steps, dtype=out.dtype).reshape(out.shape)


@lowering(
    *_LOGSPACE_OUTS,
    meta={n: _fill_out_meta(*n.split(".")) for n in _LOGSPACE_OUTS},
    meta_check=_ramp_out_loop_check("logspace"),
)
def logspace_out(start, end, steps, base=10.0, *, out):
    return logspace(start, end, steps, base, dtype=out.dtype).reshape(out.shape)


@lowering("eye", "eye.m", no_loop_for=WIDE_UNSIGNED)
def eye(n, m=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=dtype or default_float())
