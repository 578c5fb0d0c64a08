"""Lowerings: elementwise arithmetic, unary float math, copies and fills, with PyTorch's promotion and
integer rules (comparisons, logic and bitwise ops: comparisons.py)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .argument_checks import (
    bool_mask_check,
    fill_value_check,
    masked_fill_value_check,
    no_bool_check,
    pow_exponent_check,
    same_dtype_out_check,
)
from .dtypes import (
    NOT_FLOATING,
    WIDE_UNSIGNED,
    convert,
    divide,
    multiply,
    not_implemented_for,
    operand_facts,
    promote,
    scalar_type_name,
    true_divide,
)
from .elementwise_c import (
    c_lcm,
    cabs,
    cacos,
    cacosh,
    casin,
    casinh,
    catan,
    catanh,
    cexp,
    cexp2,
    clog_fixed,
    complex_add,
    complex_pow,
    creciprocal,
    crsqrt,
    csigmoid,
    csqrt,
    euclid_gcd,
    int_pow,
)
from .table import KIND, LOWERINGS, Lowering, WriteOverlap, apply, expanded_warning, lowering

# ---------------------------------------------------------------- arithmetic


def _alpha_check(a, b, alpha=1, *_, out=None, **__):
    """PyTorch's alpha_check on the op's result dtype, which its meta kernels make as a ValueError
    (or, for a bool result, not at all); and the CPU's message for an `out` the result cannot be cast to."""
    dtype = torch.result_type(a, b)
    if out is not None and not torch.can_cast(dtype, out.dtype):
        wanted = scalar_type_name(out.dtype)
        raise RuntimeError(f"result type {scalar_type_name(dtype)} can't be cast to the desired output type {wanted}")
    if type(alpha) is bool and dtype != torch.bool:
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if not (dtype.is_floating_point or dtype.is_complex) and isinstance(alpha, (float, complex)):
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")
    if not dtype.is_complex and isinstance(alpha, complex):
        raise RuntimeError("For non-complex input tensors, argument alpha must not be a complex number.")


def _sub_and_alpha_check(a, b, alpha=1, *_, out=None, **__):
    _sub_check(a, b)
    _alpha_check(a, b, alpha, out=out)


def _with_variants(check, *names):
    """A meta_check for overloads and their in-place and out= variants (facts are per overload)."""
    return dict.fromkeys(names, check)


@lowering(
    "add.Tensor",
    "add.Scalar",
    promote=KIND.DEFAULT,
    promote_args=(0, 1),
    flat_buckets=True,
    meta_check=_with_variants(_alpha_check, "add.Tensor", "add.Scalar", "add_.Tensor", "add_.Scalar", "add.out"),
)
def add(a, b, alpha=1):
    if jnp.iscomplexobj(a) or jnp.iscomplexobj(b):
        return complex_add(a, b, alpha)
    return a + b * alpha if not (isinstance(alpha, int) and alpha == 1) else a + b


def _sub_check(a, b, *_, **__):
    """PyTorch's sub_check, which its meta kernels leave out: bool operands are refused."""
    bools = sum(x.dtype == torch.bool if isinstance(x, torch.Tensor) else type(x) is bool for x in (a, b))
    if bools == 2:
        raise RuntimeError(
            "Subtraction, the `-` operator, with two bool tensors is not supported. "
            "Use the `^` or `logical_xor()` operator instead."
        )
    if bools:
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. "
            "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
        )


@lowering(
    "sub.Tensor",
    "sub.Scalar",
    promote=KIND.DEFAULT,
    promote_args=(0, 1),
    flat_buckets=True,
    meta_check=_with_variants(
        _sub_and_alpha_check, "sub.Tensor", "sub.Scalar", "sub_.Tensor", "sub_.Scalar", "sub.out"
    ),
)
def sub(a, b, alpha=1):
    if jnp.iscomplexobj(a) or jnp.iscomplexobj(b):
        return complex_add(a, b, -alpha)
    return a - b * alpha if not (isinstance(alpha, int) and alpha == 1) else a - b


@lowering(
    "rsub.Tensor",
    "rsub.Scalar",
    promote=KIND.DEFAULT,
    promote_args=(0, 1),
    meta_check=_with_variants(_sub_and_alpha_check, "rsub.Tensor", "rsub.Scalar"),
)
def rsub(a, b, alpha=1):
    if jnp.iscomplexobj(a) or jnp.iscomplexobj(b):
        return complex_add(b, a, -alpha)
    return b - a * alpha if not (isinstance(alpha, int) and alpha == 1) else b - a


@lowering("mul.Tensor", "mul.Scalar", promote=KIND.DEFAULT, loops_for=WIDE_UNSIGNED, flat_buckets=True)
def mul(a, b):
    if getattr(a, "dtype", None) == jnp.bool_:
        return jnp.logical_and(a, b)
    return multiply(a, b)  # (complex: the CPU's rounding)


def _is_int(x):
    return jnp.issubdtype(jnp.result_type(x), jnp.integer) or jnp.result_type(x) == jnp.bool_


@lowering("div.Tensor", "div.Scalar", promote=KIND.INT_TO_FLOAT)
def div(a, b):
    return divide(a, b)


def _int_trunc_div(a, b):
    return _int_trunc_divmod(a, b)[0]


def _int_trunc_divmod(a, b):
    """(quotient rounded toward zero, remainder with the sign of `a`) of integers, as C and PyTorch."""
    dtype = jnp.result_type(a, b)
    a, b = jnp.broadcast_arrays(jnp.asarray(a, dtype), jnp.asarray(b, dtype))
    if a.dtype in (jnp.int64, jnp.uint64) and _for_tpu():
        return _tpu_int64_divmod(a, b)
    return lax.div(a, b), lax.rem(a, b)


def _for_tpu():
    from ..device.platform import lowering_platform

    return lowering_platform() == "tpu"


_INT32_MAX = 2**31 - 1


def _tpu_int64_divmod(a, b):
    """int64 division for a TPU. XLA:TPU expands a 64-bit division into a large circuit: a program
    with a floor_divide and a remainder of int64 index tensors took 48-86 s to compile. Index values
    fit in 32 bits: then the division runs in int32 (exact: |a| < 2^31 leaves no overflow); otherwise
    a binary long division over the 64 bits of the magnitudes, a loop XLA compiles in a moment.
    uint64 the same way (XLA:TPU's own uint64 floor_divide: 214 s to compile one op under load 10)."""
    narrow = jnp.all((jnp.abs(a) <= _INT32_MAX) & (jnp.abs(b) <= _INT32_MAX))

    def in_int32(a, b):
        a32, b32 = a.astype(jnp.int32), b.astype(jnp.int32)
        return lax.div(a32, b32).astype(a.dtype), lax.rem(a32, b32).astype(a.dtype)

    return lax.cond(narrow, in_int32, _int64_long_division, a, b)


def _int64_long_division(a, b):
    """Truncating (quotient, remainder) of int64 (or uint64) arrays, one quotient bit per step from the
    top: unsigned magnitudes (|-2^63| = 2^63 is exact in uint64), signs applied at the end. A zero
    divisor gives -1 (or 1) and `a`, as a hardware divider might; PyTorch's CPU raises instead."""
    u64 = jnp.uint64
    top = jnp.asarray(63, u64)
    magnitude_a = jnp.where(a < 0, -a, a).astype(u64)
    magnitude_b = jnp.where(b < 0, -b, b).astype(u64)

    def step(i, qr):
        q, r = qr
        shift = top - i.astype(u64)
        r = (r << 1) | ((magnitude_a >> shift) & 1)
        take = r >= magnitude_b
        return q | (take.astype(u64) << shift), jnp.where(take, r - magnitude_b, r)

    zero = jnp.zeros_like(magnitude_a)
    q, r = lax.fori_loop(jnp.int32(0), jnp.int32(64), step, (zero, zero))
    if a.dtype == u64:
        return q, r
    q, r = q.astype(jnp.int64), r.astype(jnp.int64)
    return jnp.where((a < 0) != (b < 0), -q, q), jnp.where(a < 0, -r, r)


def _floor_div(a, b):
    if _is_int(a) and _is_int(b):
        # Python semantics (round toward -inf), as PyTorch's floor_divide on integers
        q, r = _int_trunc_divmod(a, b)
        if jnp.issubdtype(jnp.result_type(a), jnp.unsignedinteger):
            return q
        return jnp.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)
    return _float_floor_div(a, b)


def _float_floor_div(a, b):  # PyTorch's div_floor: via fmod, to match the CPU's rounding exactly
    mod = jnp.fmod(a, b)
    div = divide(a - mod, b)
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    q = divide(a, b)
    return jnp.where(b == 0, q, jnp.where(div != 0, floordiv, jnp.copysign(jnp.zeros_like(div), q)))


def _trunc_div(a, b):
    if _is_int(a) and _is_int(b):
        return _int_trunc_div(a, b)
    return jnp.trunc(divide(a, b))


def _div_mode(a, b, rounding_mode):
    if rounding_mode == "trunc":
        return _trunc_div(a, b)
    return _floor_div(a, b)


_DIV_MODE = Lowering("div.Tensor_mode", _div_mode, promote=KIND.DEFAULT)


def _div_mode_loop_check(a, b, rounding_mode=None, **_):
    """div with a rounding mode: the CPU's floor and trunc loops lack bool and the wide unsigned types
    and complex types (of the operands' common dtype: div(bool, 2, rounding_mode="floor") computes in
    int64); true division computes in float."""
    if rounding_mode is not None:
        dtype = torch.result_type(a, b)
        if dtype == torch.bool or dtype in WIDE_UNSIGNED or dtype in (torch.complex64, torch.complex128):
            raise not_implemented_for(f"div_{rounding_mode}", dtype)


@lowering(
    "div.Tensor_mode",
    "div.Scalar_mode",
    meta_check=_with_variants(
        _div_mode_loop_check,
        "div.Tensor_mode",
        "div.Scalar_mode",
        "div_.Tensor_mode",
        "div_.Scalar_mode",
        "div.out_mode",
        "div.Scalar_mode_out",
    ),
)
def div_mode(a, b, rounding_mode=None):
    if rounding_mode is None:  # true division: integers promote to the default float dtype, as div.Tensor
        return apply(LOWERINGS["div.Tensor"], (a, b), {})
    if rounding_mode == "trunc" and promote(KIND.DEFAULT, operand_facts((a, b)))[1] in (jnp.bfloat16, jnp.float16):
        # PyTorch truncates the quotient rounded to the half dtype, not the float32 opmath one
        return jnp.trunc(apply(LOWERINGS["div.Tensor"], (a, b), {}))
    return apply(_DIV_MODE, (a, b), {"rounding_mode": rounding_mode})  # floor or trunc: result of a's kind


@lowering("floor_divide", "floor_divide.Scalar", promote=KIND.DEFAULT, real_only=True, no_loop_for=(torch.bool,))
def floor_divide(a, b):
    return _floor_div(a, b)


# (NO_OPMATH: as the CPU's and CUDA's kernels, a Python scalar is rounded to a half type first, and each
# step rounds to it; fmod itself is exact)
@lowering("remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor", promote=KIND.NO_OPMATH, real_only=True)
def remainder(a, b):
    if _is_int(a) and _is_int(b):
        r = _int_trunc_divmod(a, b)[1]
        return jnp.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
    r = jnp.fmod(a, b)
    return jnp.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@lowering("fmod.Tensor", "fmod.Scalar", promote=KIND.NO_OPMATH, real_only=True)
def fmod(a, b):
    if _is_int(a) and _is_int(b):
        return _int_trunc_divmod(a, b)[1]
    return jnp.fmod(a, b)


@lowering(
    "pow.Tensor_Scalar",
    no_loop_for=(torch.bool,),
    promote=KIND.DEFAULT,
    host_check={
        "pow.Tensor_Scalar": pow_exponent_check,
        "pow_.Scalar": pow_exponent_check,
        "pow.Tensor_Scalar_out": pow_exponent_check,
    },
)
def power_by_scalar(a, b):
    if not jnp.iscomplexobj(a):
        return power(a, b)
    # the CPU's complex pow by a Scalar 2 or 3 is its product a*a or a*a*a, by 0.5 its sqrt (by a 0-dim
    # tensor: pow)
    square = multiply(a, a)
    other = jnp.where(b == 0.5, jnp.sqrt(a), power(a, b))
    return jnp.where(b == 2, square, jnp.where(b == 3, multiply(square, a), other))


@lowering("pow.Tensor_Tensor", "pow.Scalar", promote=KIND.DEFAULT, no_loop_for=(torch.bool,))
def power(a, b):
    if _is_int(a) and _is_int(b):
        if isinstance(b, int) and b >= 0:
            return lax.integer_pow(a, b)
        return int_pow(a, b)
    if jnp.iscomplexobj(a) or jnp.iscomplexobj(b):
        return complex_pow(a, b)
    return jnp.power(a, b)


@lowering("neg", promote=KIND.DEFAULT, meta_check={"neg.out": same_dtype_out_check})
def neg(a):
    return -a


def _complex_out_meta(name):
    """The meta function of abs.out/angle.out on "tpu": the CPU writes a complex input's result into a
    complex `out` too (its real values, a zero imaginary part) or into a wider float one, where PyTorch's
    meta function refuses any `out` but the real dtype."""

    def meta(a, *, out):
        if not a.dtype.is_complex:
            return getattr(torch.ops.aten, name).out(a, out=out)
        result = getattr(torch.ops.aten, name).default(a)
        if not torch.can_cast(result.dtype, out.dtype):
            got, want = scalar_type_name(result.dtype), scalar_type_name(out.dtype)
            raise RuntimeError(f"result type {got} can't be cast to the desired output type {want}")
        if name == "abs" and out.dtype.is_complex and out.dtype != a.dtype:  # (abs's complex loop)
            raise RuntimeError(f"Found dtype {scalar_type_name(out.dtype)} but expected {scalar_type_name(a.dtype)}")
        torch._resize_output_(out, result.shape, out.device)  # (the CPU's warning for a non-empty `out`)
        return out

    return meta


def _abs_inplace_check(a, *_, **__):
    if a.dtype.is_complex:  # the CPU's words (the meta kernel's are about the dtype of `out`)
        raise RuntimeError("In-place abs is not supported for complex tensors.")


@lowering(
    "abs",
    promote=KIND.COMPLEX_TO_FLOAT,
    no_loop_for=(torch.bool,),
    meta={"abs.out": _complex_out_meta("abs")},
    meta_check={"abs_": _abs_inplace_check},
    flat_buckets=True,
)
def absolute(a):
    return cabs(a) if jnp.iscomplexobj(a) else jnp.abs(a)


def _real_sign(a):
    if a.dtype == jnp.bool_:
        return a
    if jnp.issubdtype(a.dtype, jnp.floating):  # the CPU's and CUDA's (0 < a) - (a < 0): NaN and -0 give +0
        return (a > 0).astype(a.dtype) - (a < 0).astype(a.dtype)
    return jnp.sign(a)


@lowering("sign", promote=KIND.DEFAULT, real_only=True, meta_check={"sign.out": same_dtype_out_check})
def sign(a):
    return _real_sign(a)


@lowering("sgn", promote=KIND.DEFAULT, meta_check={"sgn.out": same_dtype_out_check})
def sgn(a):
    return jnp.sign(a) if jnp.iscomplexobj(a) else _real_sign(a)


@lowering("reciprocal", promote=KIND.INT_TO_FLOAT)
def reciprocal(a):
    return creciprocal(a) if jnp.iscomplexobj(a) else 1 / a


@lowering("square", promote=KIND.BOOL_TO_LONG)
def square(a):
    return a * a


@lowering("copysign.Tensor", "copysign.Scalar", promote=KIND.INT_TO_FLOAT, real_only=True)
def copysign(a, b):
    return jnp.copysign(a, b)


@lowering("hypot", promote=KIND.DEFAULT, no_loop_for=(*NOT_FLOATING, torch.complex64, torch.complex128))
def hypot(a, b):
    return jnp.hypot(a, b)


@lowering("atan2", promote=KIND.INT_TO_FLOAT, real_only=True)
def atan2(a, b):
    return jnp.arctan2(a, b)


@lowering("maximum", promote=KIND.DEFAULT, real_only="maximum not implemented for complex tensors.")
def maximum(a, b):
    return jnp.maximum(a, b)


@lowering("minimum", promote=KIND.DEFAULT, real_only="minimum not implemented for complex tensors.")
def minimum(a, b):
    return jnp.minimum(a, b)


@lowering("fmax", promote=KIND.DEFAULT, real_only="fmax not implemented for complex tensors.")
def fmax(a, b):
    return jnp.fmax(a, b)


@lowering("fmin", promote=KIND.DEFAULT, real_only="fmin not implemented for complex tensors.")
def fmin(a, b):
    return jnp.fmin(a, b)


@lowering("xlogy.Tensor", "xlogy.Scalar_Other", "xlogy.Scalar_Self", promote=KIND.INT_TO_FLOAT, real_only=True)
def xlogy(a, b):
    # PyTorch's rule: a NaN `b` gives NaN even where `a` is 0 (JAX's xlogy gave 0 for a bool False)
    return jnp.where(jnp.isnan(b), b, jax.scipy.special.xlogy(a, b))


# the CPU's loop is picked by self and end (one dtype, checked by the meta kernel): the weight is no operand
@lowering("lerp.Scalar", "lerp.Tensor", promote=KIND.DEFAULT, promote_args=(0, 1), no_loop_for=NOT_FLOATING)
def lerp(a, b, w):
    if hasattr(w, "dtype") and not getattr(w, "weak_type", False):
        w = w.astype(a.dtype)  # (a weight tensor computes in the opmath type too)
    return jnp.where(jnp.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1 - w))


@lowering("addcmul", promote=KIND.DEFAULT, promote_args=(0, 1, 2), no_loop_for=(torch.bool,))
def addcmul(a, t1, t2, value=1):
    if not jnp.issubdtype(a.dtype, jnp.inexact):
        value = jnp.asarray(value).astype(a.dtype)  # the CPU converts value to the integer type: 0.5 -> 0
    return a + multiply(multiply(value, t1), t2)  # (complex: the CPU's rounding, in its order)


def _integer_addcdiv_check(a, t1, t2, *_, **__):
    """The CPU's refusal of integer addcdiv; PyTorch's meta kernel makes it with a garbled message."""
    if not (t1.dtype.is_floating_point or t1.dtype.is_complex) and not (
        t2.dtype.is_floating_point or t2.dtype.is_complex
    ):
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future  release addcdiv will perform "
            "a true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as "
            "(input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as "
            "(input + value * tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the latter "
            "implementation: (input + value * tensor1 / tensor2), for all dtypes."
        )


@lowering(
    "addcdiv",
    promote=KIND.DEFAULT,
    promote_args=(0, 1, 2),
    meta_check=_with_variants(_integer_addcdiv_check, "addcdiv", "addcdiv_", "addcdiv.out"),
)
def addcdiv(a, t1, t2, value=1):
    return a + value * true_divide(t1, t2)  # (CUDA's order; the CPU's is (value * t1) / t2)


def _clamp_check(a, min=None, max=None, *_, **__):
    """PyTorch's clamp checks this before its meta kernel, whose own error is a ValueError. And the CPU's
    Scalar clamp kernels have no bool loop: clamp of a bool tensor by bool Scalars (bool tensor bounds:
    _clamp_tensors_check)."""
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    bounds = [b for b in (min, max) if b is not None]
    if a.dtype != torch.bool or not all(type(b) is bool for b in bounds):
        return
    if len(bounds) == 2:
        raise not_implemented_for("clamp_scalar", torch.bool)
    raise not_implemented_for("clamp_min_scalar" if min is not None else "clamp_max_scalar", torch.bool)


def _clamp_tensors_check(a, min=None, max=None, *_, **__):
    """clamp.Tensor: the CPU has no bool loop where both bounds are given (one bound is clamp_min's
    or clamp_max's kernel, which has one)."""
    _clamp_check(a, min, max)
    if min is not None and max is not None:
        dtype = torch.promote_types(torch.result_type(a, min), torch.result_type(a, max))
        if dtype == torch.bool:
            raise not_implemented_for("clamp", dtype)


def _clamp_out_check(a, min=None, max=None, *_, out=None, **__):
    _clamp_check(a, min, max)
    same_dtype_out_check(a, out=out)  # (clamp by Scalars only: the CPU's "Found dtype Double but expected Float")


@lowering(
    "clamp",
    "clamp.Tensor",
    promote=KIND.DEFAULT,
    real_only=True,
    meta_check={
        **dict.fromkeys(("clamp", "clamp_"), _clamp_check),
        **dict.fromkeys(("clamp.Tensor", "clamp_.Tensor", "clamp.Tensor_out"), _clamp_tensors_check),
        "clamp.out": _clamp_out_check,
    },
)
def clamp(a, min=None, max=None):
    if min is not None:
        a = (
            jnp.where(jnp.isnan(a), a, jnp.maximum(a, min))
            if jnp.issubdtype(a.dtype, jnp.floating)
            else jnp.maximum(a, min)
        )
    if max is not None:
        a = (
            jnp.where(jnp.isnan(a), a, jnp.minimum(a, max))
            if jnp.issubdtype(a.dtype, jnp.floating)
            else jnp.minimum(a, max)
        )
    return a


@lowering("clamp_min", "clamp_min.Tensor", promote=KIND.DEFAULT, real_only=True)
def clamp_min(a, min):
    return clamp(a, min=min)


@lowering("clamp_max", "clamp_max.Tensor", promote=KIND.DEFAULT, real_only=True)
def clamp_max(a, max):
    return clamp(a, max=max)


# ---------------------------------------------------------------- unary float math
def _real_or(real_fn, complex_fn):
    """jnp's function for real arrays, C99's (elementwise_c.py) for complex ones."""

    def fn(a):
        return complex_fn(a) if jnp.iscomplexobj(a) else real_fn(a)

    fn.__name__ = real_fn.__name__
    return fn


def _unary(name, fn, kind=KIND.INT_TO_FLOAT, **facts):
    """Register the JAX function `fn` itself as the lowering of `name` (a declaration per line, so the
    op's name finds it)."""
    lowering(name, promote=kind, **facts)(fn)


_unary("exp", _real_or(jnp.exp, cexp))
_unary("exp2", _real_or(jnp.exp2, cexp2))
_unary("expm1", jnp.expm1)
_unary("log", _real_or(jnp.log, clog_fixed(jnp.log)))
_unary("log2", _real_or(jnp.log2, clog_fixed(jnp.log2)))
_unary("log10", _real_or(jnp.log10, clog_fixed(jnp.log10)))
_unary("log1p", jnp.log1p)
_unary("sqrt", _real_or(jnp.sqrt, csqrt))
_unary("rsqrt", _real_or(lax.rsqrt, crsqrt))
_unary("sin", jnp.sin)
_unary("cos", jnp.cos)
_unary("tan", jnp.tan)
_unary("asin", _real_or(jnp.arcsin, casin))
_unary("acos", _real_or(jnp.arccos, cacos))
_unary("atan", _real_or(jnp.arctan, catan))
_unary("sinh", jnp.sinh)
_unary("cosh", jnp.cosh)
_unary("tanh", jnp.tanh)
_unary("asinh", _real_or(jnp.arcsinh, casinh))
_unary("acosh", _real_or(jnp.arccosh, cacosh))
_unary("atanh", _real_or(jnp.arctanh, catanh))
_unary("sigmoid", _real_or(jax.nn.sigmoid, csigmoid))
_unary("erf", jax.scipy.special.erf, real_only=True)
_unary("erfc", jax.scipy.special.erfc, real_only=True)
_unary("erfinv", jax.scipy.special.erfinv, real_only=True)
_unary("lgamma", jax.scipy.special.gammaln, real_only=True)
_unary("i0", jax.scipy.special.i0)
_unary("sinc", jnp.sinc)
_unary("deg2rad", jnp.deg2rad)
_unary("rad2deg", jnp.rad2deg)


@lowering("digamma", promote=KIND.INT_TO_FLOAT, real_only=True)
def digamma(x):
    return _digamma(x)


@lowering("logit", promote=KIND.INT_TO_FLOAT, real_only=True)
def logit(a, eps=None):
    if eps is not None:
        a = jnp.clip(a, eps, 1 - eps)
    return jnp.log(a / (1 - a))


@lowering(
    "floor",
    promote=KIND.DEFAULT,
    real_only=True,
    loops_for=WIDE_UNSIGNED,
    no_loop_for=(torch.bool,),
    meta_check={"floor.out": same_dtype_out_check},
)
def floor(a):
    return a if _is_int(a) else jnp.floor(a)


@lowering(
    "ceil",
    promote=KIND.DEFAULT,
    real_only=True,
    loops_for=WIDE_UNSIGNED,
    no_loop_for=(torch.bool,),
    meta_check={"ceil.out": same_dtype_out_check},
)
def ceil(a):
    return a if _is_int(a) else jnp.ceil(a)


@lowering(
    "trunc",
    promote=KIND.DEFAULT,
    real_only=True,
    loops_for=WIDE_UNSIGNED,
    no_loop_for=(torch.bool,),
    meta_check={"trunc.out": same_dtype_out_check},
)
def trunc(a):
    return a if _is_int(a) else jnp.trunc(a)


@lowering(
    "frac",
    promote=KIND.DEFAULT,
    real_only=True,
    meta_check={"frac.out": same_dtype_out_check},
    no_loop_for=NOT_FLOATING,
)
def frac(a):
    return a if _is_int(a) else a - jnp.trunc(a)


@lowering(
    "round",
    promote=KIND.DEFAULT,
    real_only=True,
    loops_for=WIDE_UNSIGNED,
    no_loop_for=(torch.bool,),
    meta_check={"round.out": same_dtype_out_check},
)
def round_half_even(a):
    return a if _is_int(a) else jnp.round(a)


@lowering(
    "round.decimals",
    promote=KIND.DEFAULT,
    real_only=True,
    meta_check={"round.decimals_out": same_dtype_out_check},
    no_loop_for=NOT_FLOATING,  # (round.default has integer loops: a copy)
)
def round_decimals(a, decimals=0):
    # the CPU's and CUDA's steps, an IEEE division (XLA would multiply by the reciprocal: 20-57% were off)
    scale = jnp.asarray(10.0 ** abs(decimals) if abs(decimals) <= 308 else float("inf"), a.dtype)
    if decimals < 0:
        return jnp.round(true_divide(a, scale)) * scale
    return true_divide(jnp.round(a * scale), scale)


# ---------------------------------------------------------------- copies and fills
@lowering("copy")
def copy(self, src, non_blocking=False):
    return convert(jnp.broadcast_to(src, self.shape), self.dtype)


@lowering("clone")
def clone(a, memory_format=None):
    return a


@lowering("_to_copy", flat_buckets=True)
def to_copy(a, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """A conversion on the device: eager `x.to(dtype)` (eager/kernels.py `_to_copy` sends other copies,
    to the host or another layout, elsewhere) and graphs' casts; the same conversion as `copy`."""
    a = a if hasattr(a, "astype") else jnp.asarray(a)
    return a if dtype is None else convert(a, dtype)  # (a jnp dtype: eager and graphs convert torch's)


@lowering(
    "fill.Scalar", "fill.Tensor", host_check={"fill.Scalar": fill_value_check(1), "fill_.Scalar": fill_value_check(1)}
)
def fill(a, value):
    return jnp.full(a.shape, value, a.dtype)


@lowering("zero")
def zero(a):
    return jnp.zeros(a.shape, a.dtype)


@lowering(
    "masked_fill.Scalar",
    "masked_fill.Tensor",
    no_loop_for=WIDE_UNSIGNED,
    flat_buckets=True,
    host_check={
        "masked_fill.Scalar": fill_value_check(2),
        "masked_fill_.Scalar": fill_value_check(2),
        "masked_fill.Tensor": masked_fill_value_check,
        "masked_fill_.Tensor": masked_fill_value_check,
    },
    meta_check=_with_variants(
        bool_mask_check, "masked_fill.Scalar", "masked_fill.Tensor", "masked_fill_.Scalar", "masked_fill_.Tensor"
    ),
    # PyTorch's reference kernel refuses a complex value for a real tensor by its type, where the CPU
    # converts the value (the host checks have checked it fits): its meta runs with a fill of 0
    meta={
        name: functools.partial(lambda op, a, mask, value: op(a, mask, 0), op)
        for name, op in (
            ("masked_fill.Scalar", torch.ops.aten.masked_fill.Scalar),
            ("masked_fill.Tensor", torch.ops.aten.masked_fill.Scalar),
            ("masked_fill_.Scalar", torch.ops.aten.masked_fill_.Scalar),
            ("masked_fill_.Tensor", torch.ops.aten.masked_fill_.Scalar),
        )
    },
    write_overlap=WriteOverlap(expanded_warning("masked_fill_", "tensor[mask] = scalar"), no_partial_overlap=("mask",)),
)
def masked_fill(a, mask, value):
    return jnp.where(mask, convert(jnp.asarray(value), a.dtype), a)  # (a complex value: its real part)


@lowering("lift_fresh_copy")
def lift_fresh_copy(a):
    return a


# ---------------------------------------------------------------- more math (special functions)
_special = jax.scipy.special

_unary("special_i0e", _special.i0e)
_unary("special_i1", _special.i1)
_unary("special_i1e", _special.i1e)
_unary("special_ndtr", _special.ndtr)
_unary("special_ndtri", _special.ndtri)
_unary("special_log_ndtr", _special.log_ndtr)
_unary("special_entr", _special.entr)
_unary("special_erfcx", _special.erfcx, real_only=True)


@lowering("special_spherical_bessel_j0", promote=KIND.INT_TO_FLOAT, real_only=True)
def spherical_bessel_j0(x):
    j0 = jnp.where(x == 0, jnp.ones_like(x), jnp.sin(x) / jnp.where(x == 0, 1, x))
    return jnp.where(jnp.isinf(x), jnp.zeros_like(x), j0)  # the CPU's limit at +-inf (sin(inf) is NaN)


@lowering("angle", promote=KIND.INT_TO_FLOAT, keep_result_dtype=True, meta={"angle.out": _complex_out_meta("angle")})
def angle(a):
    if jnp.iscomplexobj(a):
        return jnp.angle(a)  # atan2(imag, real): a real result
    return jnp.where(jnp.isnan(a), a, jnp.where(a < 0, jnp.pi, 0).astype(a.dtype))


def _frexp_out_check(a, *_, mantissa=None, exponent=None, **__):
    # the CPU's checks of frexp's outputs, which PyTorch's meta kernel casts into instead
    from .argument_checks import _CPP_TYPE_NAMES

    if mantissa is not None and mantissa.dtype != a.dtype:
        got, want = (_CPP_TYPE_NAMES.get(t, str(t).replace("torch.", "")) for t in (mantissa.dtype, a.dtype))
        raise RuntimeError(f"torch.frexp() expects mantissa to have dtype {want} but got {got}")
    if exponent is not None and exponent.dtype != torch.int32:
        got = _CPP_TYPE_NAMES.get(exponent.dtype, str(exponent.dtype).replace("torch.", ""))
        raise RuntimeError(f"torch.frexp() expects exponent to have int dtype but got {got}")


@lowering("frexp.Tensor", meta_check={"frexp.Tensor_out": _frexp_out_check})
def frexp(a):
    m, e = jnp.frexp(a)
    return m, e.astype(jnp.int32)


@lowering("nextafter", promote=KIND.NO_OPMATH, no_loop_for=(torch.bool,))  # half types step in their own precision
def nextafter(a, b):
    return jnp.nextafter(a, b)


def _digamma(x):
    # PyTorch (like SciPy and C++): digamma(+-0) = -+inf, NaN at the negative integers
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x).astype(x.dtype), jax.scipy.special.digamma(x))


def _zeta(x, q):
    """Hurwitz zeta with PyTorch's (Cephes') edge values."""
    pole = (q <= 0) & (q == jnp.floor(q))
    q = jnp.where(pole, 1, q)
    # XLA's zeta is inaccurate for q < 0: shift q by m = ceil(-q) with zeta(x, q) =
    # zeta(x, q + m) + sum_{k<m} (q + k)^-x (the loop runs max(m) times, usually zero)
    m = jnp.where(q < 0, jnp.ceil(-q), 0)
    x, q = jnp.broadcast_arrays(x, q)
    m = jnp.broadcast_to(m, q.shape)

    def body(k, acc):
        return acc + jnp.where(k < m, (q + k) ** -x, 0)

    head = lax.fori_loop(0, jnp.max(m, initial=0).astype(jnp.int32), body, jnp.zeros_like(q))
    out = _special.zeta(x, q + m) + head
    out = jnp.where(pole, jnp.inf, out)
    return jnp.where(x == 1, jnp.inf, jnp.where(x < 1, jnp.nan, out)).astype(out.dtype)


@lowering("polygamma", promote=KIND.INT_TO_FLOAT, promote_args=(1,))
def polygamma(n, a):
    if n == 0:
        return _digamma(a)
    sign = 1.0 if n % 2 else -1.0
    return sign * jnp.exp(jax.scipy.special.gammaln(n + 1.0)).astype(a.dtype) * _zeta(jnp.asarray(n + 1.0, a.dtype), a)


@lowering("mvlgamma", promote=KIND.INT_TO_FLOAT, promote_args=(0,))
def mvlgamma(a, p):
    return _special.multigammaln(a, p)


@lowering("special_zeta", "special_zeta.other_scalar", "special_zeta.self_scalar", promote=KIND.INT_TO_FLOAT)
def zeta(x, q):
    return _zeta(x, q)


@lowering(
    "special_xlog1py",
    "special_xlog1py.other_scalar",
    "special_xlog1py.self_scalar",
    promote=KIND.INT_TO_FLOAT,
    real_only=True,
)
def xlog1py(a, b):
    # (a NaN `b` gives NaN even where `a` is 0, as xlogy)
    return jnp.where(jnp.isnan(b), b, _special.xlog1py(a, b))


@lowering("logaddexp", promote=KIND.INT_TO_FLOAT, no_loop_for=NOT_FLOATING)
def logaddexp(a, b):
    if jnp.iscomplexobj(a):
        return _complex_logaddexp(a, b)
    return jnp.logaddexp(a, b)


def _complex_logaddexp(a, b):
    # as PyTorch's CPU kernel: max + log1p(exp(min - max)), max/min by real part, so the imaginary
    # part is not folded into (-pi, pi]; a NaN anywhere gives NaN; equal infinite real parts use the
    # plain formula (-inf: min itself)
    a, b = jnp.broadcast_arrays(a, b)
    a_first = a.real < b.real
    lo, hi = jnp.where(a_first, a, b), jnp.where(a_first, b, a)
    out = hi + jnp.log1p(jnp.exp(lo - hi))
    both_inf = jnp.isinf(lo.real) & (lo.real == hi.real)
    out = jnp.where(both_inf, jnp.where(lo.real < 0, lo, jnp.log(jnp.exp(lo) + jnp.exp(hi))), out)
    nan = jnp.isnan(a.real) | jnp.isnan(a.imag) | jnp.isnan(b.real) | jnp.isnan(b.imag)
    return jnp.where(nan, jnp.full_like(out, complex(jnp.nan, jnp.nan)), out)


@lowering("logaddexp2", promote=KIND.INT_TO_FLOAT, no_loop_for=NOT_FLOATING)
def logaddexp2(a, b):
    return jnp.logaddexp2(a, b)


def _heaviside_check(a, values, *, out=None):
    """The CPU's check after the complex one: one dtype for the input, the values and `out` (no
    promotion, not even of a 0-dim tensor)."""
    tensors = [t for t in (a, values, out) if isinstance(t, torch.Tensor)]
    if len({t.dtype for t in tensors}) > 1:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")


@lowering(
    "heaviside",
    promote=KIND.DEFAULT,
    real_only="heaviside is not yet implemented for complex tensors.",
    meta_check=_with_variants(_heaviside_check, "heaviside.default", "heaviside_.default", "heaviside.out"),
)
def heaviside(a, values):
    return jnp.where(a == 0, values, (a > 0).astype(a.dtype))


@lowering("ldexp.Tensor", promote=KIND.INT_TO_FLOAT)
def ldexp(a, b):
    return a * jnp.exp2(b)


@lowering("gcd", promote=KIND.DEFAULT, real_only=True)
def gcd(a, b):
    return euclid_gcd(a, b)


@lowering(
    "lcm",
    promote=KIND.DEFAULT,
    real_only=True,
    meta_check=_with_variants(no_bool_check("lcm"), "lcm", "lcm_", "lcm.out"),
)
def lcm(a, b):
    return c_lcm(a, b)


def _isin(elements, tests, invert):
    flat = jnp.reshape(tests, (-1,))
    hit = (
        jnp.any(jnp.expand_dims(elements, -1) == flat, axis=-1)
        if flat.size
        else jnp.zeros(jnp.shape(elements), jnp.bool_)
    )
    return ~hit if invert else hit


@lowering(
    "isin.Tensor_Tensor",
    "isin.Tensor_Scalar",
    "isin.Scalar_Tensor",
    promote=KIND.ALWAYS_BOOL,
    promote_args=(0, 1),
    # (assume_unique is a hint: the answer is the same either way, so the lowering does not read it)
    set_buckets={"isin.Tensor_Tensor": ("assume_unique",)},
    flat_buckets={"isin.Tensor_Scalar": True},
)
def isin(elements, tests, assume_unique=False, invert=False):
    return _isin(jnp.asarray(elements), jnp.asarray(tests), invert)


# ---------------------------------------------------------------- complex construction
@lowering("conj_physical")
def conj_physical(a):
    return jnp.conj(a) if jnp.iscomplexobj(a) else a


# (torch dtypes in the meta check, JAX dtypes in the lowering)
_COMPLEX_PARTS = {jnp.dtype(jnp.float16), jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)}
_COMPLEX_PARTS |= {torch.float16, torch.float32, torch.float64}


def _complex_parts(a, b):
    _check_complex_parts(a, b)
    return jnp.broadcast_arrays(a, b)


def _check_complex_parts(a, b):
    """PyTorch's checks for the two real parts of torch.complex / torch.polar."""
    names = [scalar_type_name(x.dtype) for x in (a, b)]
    if not all(x.dtype in _COMPLEX_PARTS for x in (a, b)):
        raise RuntimeError(
            f"Expected both inputs to be Half, Float or Double tensors but got {names[0]} and {names[1]}"
        )
    if a.dtype != b.dtype:
        raise RuntimeError(
            f"Expected object of scalar type {names[0]} but got scalar type {names[1]} for second argument"
        )


_COMPLEX_OF = {torch.float16: torch.complex32, torch.float32: torch.complex64, torch.float64: torch.complex128}


def _complex_parts_check(a, b, *, out=None):
    """meta_check: the CPU's checks of torch.complex / torch.polar, before PyTorch's meta asserts."""
    _check_complex_parts(a, b)
    expected = _COMPLEX_OF[a.dtype]
    if isinstance(out, torch.Tensor) and out.dtype != expected:
        raise RuntimeError(
            f"Expected object of scalar type {scalar_type_name(expected)} but got scalar type "
            f"{scalar_type_name(out.dtype)} for argument 'out'"
        )


@lowering("complex", meta_check={"complex": _complex_parts_check, "complex.out": _complex_parts_check})
def make_complex(real, imag):
    real, imag = _complex_parts(real, imag)
    if real.dtype == jnp.float16:  # complex32, computed as complex64 (ops/dtypes.py); the output rounds
        real, imag = real.astype(jnp.float32), imag.astype(jnp.float32)
    return lax.complex(real, imag)


@lowering("polar", meta_check={"polar": _complex_parts_check, "polar.out": _complex_parts_check})
def polar(abs_, angle_):
    abs_, angle_ = _complex_parts(abs_, angle_)
    return lax.complex(abs_ * jnp.cos(angle_), abs_ * jnp.sin(angle_))
