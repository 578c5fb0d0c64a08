"""Lowerings: comparisons, logic, float classification (isnan, signbit, ...), bitwise ops and shifts,
`where` and `nan_to_num`, with PyTorch's promotion rules (elementwise.py has the arithmetic)."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from .argument_checks import same_dtype_out_check
from .dtypes import WIDE_UNSIGNED, default_dtype, to_jax
from .table import KIND, LOWERINGS, apply, lowering


@lowering("eq.Tensor", "eq.Scalar", promote=KIND.ALWAYS_BOOL, loops_for=WIDE_UNSIGNED, flat_buckets=True)
def eq(a, b):
    return jnp.equal(a, b)


@lowering("ne.Tensor", "ne.Scalar", promote=KIND.ALWAYS_BOOL, loops_for=WIDE_UNSIGNED, flat_buckets=True)
def ne(a, b):
    return jnp.not_equal(a, b)


@lowering("lt.Tensor", "lt.Scalar", promote=KIND.ALWAYS_BOOL, real_only=True, flat_buckets=True)
def lt(a, b):
    return jnp.less(a, b)


@lowering("le.Tensor", "le.Scalar", promote=KIND.ALWAYS_BOOL, real_only=True, flat_buckets=True)
def le(a, b):
    return jnp.less_equal(a, b)


@lowering("gt.Tensor", "gt.Scalar", promote=KIND.ALWAYS_BOOL, real_only=True, flat_buckets=True)
def gt(a, b):
    return jnp.greater(a, b)


@lowering("ge.Tensor", "ge.Scalar", promote=KIND.ALWAYS_BOOL, real_only=True, flat_buckets=True)
def ge(a, b):
    return jnp.greater_equal(a, b)


def _op(name, *args):
    """Another op's lowering with its promotion: isclose rounds where its ATen decomposition does."""
    return apply(LOWERINGS[name], args, {})


# ATen's isclose is a composite of ~12 ops (eq, isnan, sub, abs, mul, add, le, isfinite, and, or),
# each a new executable per shape: assert_close of two tpu tensors compiled a dozen programs per shape
# and dtype. Eager runs it whole (composite_in_eager), with the decomposition's steps and roundings.
@lowering("isclose", composite_in_eager=True, flat_buckets=True)
def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    close = _op("eq.Tensor", a, b)
    inexact = jnp.issubdtype(a.dtype, jnp.inexact)
    if equal_nan and inexact:
        close = close | (_op("isnan.default", a) & _op("isnan.default", b))
    if rtol == 0 and atol == 0:  # (an integer difference can wrap: |INT_MIN - 0| <= 0)
        return close
    if not inexact:  # `other` in the default dtype (a bool `self` too): the difference is a float's
        default = to_jax(default_dtype())  # (a counted read: the executable follows the setting)
        a, b = a.astype(default) if a.dtype == jnp.bool_ else a, b.astype(default)
    allowed = _op("add.Tensor", _op("abs.default", _op("mul.Tensor", b, rtol)), atol)
    actual = _op("abs.default", _op("sub.Tensor", a, b))
    return close | (_op("isfinite.default", actual) & _op("le.Tensor", actual, allowed))


@lowering("logical_and", no_loop_for=WIDE_UNSIGNED, flat_buckets=True)
def logical_and(a, b):
    return jnp.logical_and(a, b)


@lowering("logical_or", no_loop_for=WIDE_UNSIGNED, flat_buckets=True)
def logical_or(a, b):
    return jnp.logical_or(a, b)


@lowering("logical_xor", no_loop_for=WIDE_UNSIGNED, flat_buckets=True)
def logical_xor(a, b):
    return jnp.logical_xor(a, b)


@lowering("logical_not", no_loop_for=WIDE_UNSIGNED, flat_buckets=True)
def logical_not(a):
    return jnp.logical_not(a)


def _float_test(test, a, for_integers):
    """`test(a)` for floating and complex `a`; integers and bools are finite, never NaN nor infinite."""
    if jnp.issubdtype(a.dtype, jnp.inexact):
        return test(a)
    return jnp.ones_like(a, jnp.bool_) if for_integers else jnp.zeros_like(a, jnp.bool_)


@lowering("isnan", flat_buckets=True)
def isnan(a):
    return _float_test(jnp.isnan, a, False)


@lowering("isinf", flat_buckets=True)
def isinf(a):
    return _float_test(jnp.isinf, a, False)


@lowering("isfinite", flat_buckets=True)
def isfinite(a):
    return _float_test(jnp.isfinite, a, True)


def _bool_out_check(name):
    """The CPU's own words for a non-bool `out` of isposinf/isneginf (the meta kernel's differ)."""

    def check(a, *_, out=None, **__):
        if out is not None and out.dtype != torch.bool:
            raise RuntimeError(f"{name} does not support non-boolean outputs.")

    return check


@lowering("isposinf", meta_check={"isposinf.out": _bool_out_check("isposinf")}, flat_buckets=True)
def isposinf(a):
    return _float_test(jnp.isposinf, a, False)


@lowering("isneginf", meta_check={"isneginf.out": _bool_out_check("isneginf")}, flat_buckets=True)
def isneginf(a):
    return _float_test(jnp.isneginf, a, False)


@lowering("signbit", real_only=True, flat_buckets=True)
def signbit(a):
    return jnp.signbit(a) if jnp.issubdtype(a.dtype, jnp.inexact) else a < 0


@lowering(
    "bitwise_and.Tensor",
    "bitwise_and.Scalar",
    "bitwise_and.Scalar_Tensor",
    promote=KIND.DEFAULT,
    real_only=True,
    loops_for=WIDE_UNSIGNED,
    flat_buckets=True,
)
def bitwise_and(a, b):
    return jnp.bitwise_and(a, b)


@lowering(
    "bitwise_or.Tensor",
    "bitwise_or.Scalar",
    "bitwise_or.Scalar_Tensor",
    promote=KIND.DEFAULT,
    real_only=True,
    loops_for=WIDE_UNSIGNED,
    flat_buckets=True,
)
def bitwise_or(a, b):
    return jnp.bitwise_or(a, b)


@lowering(
    "bitwise_xor.Tensor",
    "bitwise_xor.Scalar",
    "bitwise_xor.Scalar_Tensor",
    promote=KIND.DEFAULT,
    real_only=True,
    loops_for=WIDE_UNSIGNED,
    flat_buckets=True,
)
def bitwise_xor(a, b):
    return jnp.bitwise_xor(a, b)


@lowering("bitwise_not", promote=KIND.DEFAULT, real_only=True, meta_check={"bitwise_not.out": same_dtype_out_check})
def bitwise_not(a):
    return jnp.logical_not(a) if a.dtype == jnp.bool_ else jnp.bitwise_not(a)


@lowering(
    "bitwise_left_shift.Tensor",
    "bitwise_left_shift.Tensor_Scalar",
    "bitwise_left_shift.Scalar_Tensor",
    promote=KIND.DEFAULT,
    real_only=True,
)
@lowering("__lshift__.Tensor", "__lshift__.Scalar", promote=KIND.DEFAULT)
def lshift(a, b):
    bits = jnp.iinfo(a.dtype).bits
    return jnp.where((b >= bits) | (b < 0), jnp.zeros_like(a), jnp.left_shift(a, jnp.clip(b, 0, bits - 1)))


@lowering(
    "bitwise_right_shift.Tensor",
    "bitwise_right_shift.Tensor_Scalar",
    "bitwise_right_shift.Scalar_Tensor",
    promote=KIND.DEFAULT,
    real_only=True,
)
@lowering("__rshift__.Tensor", "__rshift__.Scalar", promote=KIND.DEFAULT)
def rshift(a, b):
    # the CPU's rule for a shift out of range (negative or >= the width): a signed value keeps only its
    # sign (0 or -1), an unsigned one becomes 0
    bits = jnp.iinfo(a.dtype).bits
    shifted = jnp.right_shift(a, jnp.clip(b, 0, bits - 1))
    signed = jnp.issubdtype(a.dtype, jnp.signedinteger)
    overflow = jnp.right_shift(a, bits - 1) if signed else jnp.zeros_like(a)
    return jnp.where((b >= bits) | (b < 0), overflow, shifted)


@lowering("where.self", flat_buckets=True)
def where(cond, a, b):
    return jnp.where(cond, a, b)


@lowering("nan_to_num")
def nan_to_num(a, nan=None, posinf=None, neginf=None):
    if not jnp.issubdtype(a.dtype, jnp.floating):
        return a
    return jnp.nan_to_num(a, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)
