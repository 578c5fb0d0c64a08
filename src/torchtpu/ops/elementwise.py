"""Lowerings: elementwise math, comparisons and logic, with PyTorch's promotion and integer rules."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .dtypes import convert, operand_facts, promote, scalar_type_name
from .table import KIND, Lowering, apply, lowering

# ---------------------------------------------------------------- arithmetic


@lowering("add.Tensor", "add.Scalar", promote=KIND.DEFAULT, promote_args=(0, 1))
def add(a, b, alpha=1):
    return a + b * alpha if not (isinstance(alpha, int) and alpha == 1) else a + b


@lowering("sub.Tensor", "sub.Scalar", promote=KIND.DEFAULT, promote_args=(0, 1))
def sub(a, b, alpha=1):
    return a - b * alpha if not (isinstance(alpha, int) and alpha == 1) else a - b


@lowering("rsub.Tensor", "rsub.Scalar", promote=KIND.DEFAULT, promote_args=(0, 1))
def rsub(a, b, alpha=1):
    return b - a * alpha if not (isinstance(alpha, int) and alpha == 1) else b - a


@lowering("mul.Tensor", "mul.Scalar", promote=KIND.DEFAULT)
def mul(a, b):
    if getattr(a, "dtype", None) == jnp.bool_:
        return jnp.logical_and(a, b)
    return a * b


def _is_int(x):
    return jnp.issubdtype(jnp.result_type(x), jnp.integer) or jnp.result_type(x) == jnp.bool_


@lowering("div.Tensor", "div.Scalar", promote=KIND.INT_TO_FLOAT)
def div(a, b):
    return a / b


def _int_trunc_div(a, b):
    a, b = jnp.broadcast_arrays(jnp.asarray(a), jnp.asarray(b, jnp.result_type(a)))
    return lax.div(a, b)


def _floor_div(a, b):
    if _is_int(a) and _is_int(b):
        # Python semantics (round toward -inf), as PyTorch's floor_divide on integers
        q = _int_trunc_div(a, b)
        r = a - q * b
        if jnp.issubdtype(jnp.result_type(a), jnp.unsignedinteger):
            return q
        return jnp.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)
    return _float_floor_div(a, b)


def _float_floor_div(a, b):
    # PyTorch's div_floor: computes via fmod to match CPU rounding exactly
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    return jnp.where(b == 0, a / b, jnp.where(div != 0, floordiv, jnp.copysign(jnp.zeros_like(div), a / b)))


def _trunc_div(a, b):
    if _is_int(a) and _is_int(b):
        return _int_trunc_div(a, b)
    return jnp.trunc(a / b)


def _div_mode(a, b, rounding_mode=None):
    if rounding_mode is None:
        if _is_int(a) and _is_int(b):
            return a.astype(jnp.float32) / b
        return a / b
    if rounding_mode == "trunc":
        return _trunc_div(a, b)
    return _floor_div(a, b)


_DIV_MODE = Lowering("div.Tensor_mode", _div_mode, promote=KIND.DEFAULT)


@lowering("div.Tensor_mode", "div.Scalar_mode")
def div_mode(a, b, rounding_mode=None):
    if rounding_mode == "trunc" and promote(KIND.DEFAULT, operand_facts((a, b)))[1] in (jnp.bfloat16, jnp.float16):
        # PyTorch truncates the quotient rounded to the half dtype, not the float32 opmath one
        return jnp.trunc(apply(_DIV_MODE, (a, b), {}))
    return apply(_DIV_MODE, (a, b), {"rounding_mode": rounding_mode})


@lowering("floor_divide", "floor_divide.Scalar", promote=KIND.DEFAULT)
def floor_divide(a, b):
    return _floor_div(a, b)


@lowering("remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor", promote=KIND.DEFAULT)
def remainder(a, b):
    if _is_int(a) and _is_int(b):
        r = jnp.fmod(a, b)
        return jnp.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
    r = jnp.fmod(a, b)
    return jnp.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@lowering("fmod.Tensor", "fmod.Scalar", promote=KIND.DEFAULT)
def fmod(a, b):
    return jnp.fmod(a, b)


@lowering("pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar", promote=KIND.DEFAULT)
def power(a, b):
    if _is_int(a) and _is_int(b):
        if isinstance(b, int) and b >= 0:
            return lax.integer_pow(a, b)
        return _int_pow(a, b)
    return jnp.power(a, b)


def _int_pow(a, b):
    """PyTorch's integer pow: square-and-multiply over every bit of the exponent (wrapping on
    overflow; jnp.power stops early), and for b < 0: 1 for a == 1, ±1 for a == -1, else 0."""
    dtype = jnp.result_type(a, b) if not isinstance(b, int) else jnp.result_type(a)
    if dtype == jnp.bool_:
        return jnp.logical_or(jnp.asarray(a), jnp.logical_not(b))
    a, b = jnp.broadcast_arrays(jnp.asarray(a, dtype), jnp.asarray(b, dtype))
    e = jnp.abs(b) if jnp.issubdtype(dtype, jnp.signedinteger) else b

    def step(_, carry):
        result, base, e = carry
        result = jnp.where((e & 1) == 1, result * base, result)
        return result, base * base, e >> 1

    bits = jnp.iinfo(dtype).bits
    result = lax.fori_loop(0, bits, step, (jnp.ones_like(a), a, e))[0]
    if jnp.issubdtype(dtype, jnp.signedinteger):
        neg = jnp.where(a == 1, 1, jnp.where(a == -1, jnp.where(b % 2 == 0, 1, -1), 0)).astype(dtype)
        result = jnp.where(b < 0, neg, result)
    return result


@lowering("neg", promote=KIND.DEFAULT)
def neg(a):
    return -a


@lowering("abs", promote=KIND.COMPLEX_TO_FLOAT)
def absolute(a):
    if a.dtype == jnp.bool_:   # as the CPU and CUDA kernels
        raise NotImplementedError("\"abs_tpu\" not implemented for 'Bool'")
    return jnp.abs(a)


@lowering("sign", promote=KIND.DEFAULT)
def sign(a):
    return jnp.sign(a) if a.dtype != jnp.bool_ else a


@lowering("sgn", promote=KIND.DEFAULT)
def sgn(a):
    return jnp.sign(a) if a.dtype != jnp.bool_ else a


@lowering("reciprocal", promote=KIND.INT_TO_FLOAT)
def reciprocal(a):
    return 1 / a


@lowering("square", promote=KIND.BOOL_TO_LONG)
def square(a):
    return a * a


@lowering("copysign.Tensor", "copysign.Scalar", promote=KIND.INT_TO_FLOAT)
def copysign(a, b):
    return jnp.copysign(a, b)


@lowering("hypot", promote=KIND.DEFAULT)
def hypot(a, b):
    return jnp.hypot(a, b)


@lowering("atan2", promote=KIND.INT_TO_FLOAT)
def atan2(a, b):
    return jnp.arctan2(a, b)


@lowering("maximum", promote=KIND.DEFAULT)
def maximum(a, b):
    return jnp.maximum(a, b)


@lowering("minimum", promote=KIND.DEFAULT)
def minimum(a, b):
    return jnp.minimum(a, b)


@lowering("fmax", promote=KIND.DEFAULT)
def fmax(a, b):
    return jnp.fmax(a, b)


@lowering("fmin", promote=KIND.DEFAULT)
def fmin(a, b):
    return jnp.fmin(a, b)


@lowering("xlogy.Tensor", "xlogy.Scalar_Other", "xlogy.Scalar_Self", promote=KIND.INT_TO_FLOAT)
def xlogy(a, b):
    return jax.scipy.special.xlogy(a, b)


@lowering("lerp.Scalar", "lerp.Tensor", promote=KIND.DEFAULT)
def lerp(a, b, w):
    return jnp.where(jnp.abs(w) < 0.5, a + w * (b - a), b - (b - a) * (1 - w))


@lowering("addcmul", promote=KIND.DEFAULT, promote_args=(0, 1, 2))
def addcmul(a, t1, t2, value=1):
    if not jnp.issubdtype(a.dtype, jnp.inexact):
        value = jnp.asarray(value).astype(a.dtype)   # the CPU converts value to the integer type: 0.5 -> 0
    return a + value * t1 * t2


@lowering("addcdiv", promote=KIND.DEFAULT, promote_args=(0, 1, 2))
def addcdiv(a, t1, t2, value=1):
    return a + value * (t1 / t2)


@lowering("clamp", "clamp.Tensor", promote=KIND.DEFAULT)
def clamp(a, min=None, max=None):
    if min is not None:
        a = jnp.where(jnp.isnan(a), a, jnp.maximum(a, min)) if jnp.issubdtype(a.dtype, jnp.floating) else jnp.maximum(a, min)
    if max is not None:
        a = jnp.where(jnp.isnan(a), a, jnp.minimum(a, max)) if jnp.issubdtype(a.dtype, jnp.floating) else jnp.minimum(a, max)
    return a


@lowering("clamp_min", "clamp_min.Tensor", promote=KIND.DEFAULT)
def clamp_min(a, min):
    return clamp(a, min=min)


@lowering("clamp_max", "clamp_max.Tensor", promote=KIND.DEFAULT)
def clamp_max(a, max):
    return clamp(a, max=max)


# ---------------------------------------------------------------- unary float math
def _unary(name, fn, kind=KIND.INT_TO_FLOAT):
    lowering(name, promote=kind)(fn)


for _name, _fn in {
    "exp": jnp.exp, "exp2": jnp.exp2, "expm1": jnp.expm1, "log": jnp.log, "log2": jnp.log2,
    "log10": jnp.log10, "log1p": jnp.log1p, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt,
    "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "asin": jnp.arcsin, "acos": jnp.arccos,
    "atan": jnp.arctan, "sinh": jnp.sinh, "cosh": jnp.cosh, "tanh": jnp.tanh,
    "asinh": jnp.arcsinh, "acosh": jnp.arccosh, "atanh": jnp.arctanh,
    "sigmoid": jax.nn.sigmoid, "erf": jax.scipy.special.erf, "erfc": jax.scipy.special.erfc,
    "erfinv": jax.scipy.special.erfinv, "lgamma": jax.scipy.special.gammaln,
    "digamma": lambda x: _digamma(x), "i0": jax.scipy.special.i0, "sinc": jnp.sinc,
    "deg2rad": jnp.deg2rad, "rad2deg": jnp.rad2deg,
}.items():
    _unary(_name, _fn)


@lowering("logit", promote=KIND.INT_TO_FLOAT)
def logit(a, eps=None):
    if eps is not None:
        a = jnp.clip(a, eps, 1 - eps)
    return jnp.log(a / (1 - a))


for _name, _fn in {"floor": jnp.floor, "ceil": jnp.ceil, "trunc": jnp.trunc, "frac": lambda x: x - jnp.trunc(x)}.items():
    lowering(_name, promote=KIND.DEFAULT)(lambda a, _fn=_fn: a if _is_int(a) else _fn(a))


@lowering("round", promote=KIND.DEFAULT)
def round_half_even(a):
    return a if _is_int(a) else jnp.round(a)


@lowering("round.decimals", promote=KIND.DEFAULT)
def round_decimals(a, decimals=0):
    scale = 10.0 ** decimals
    return jnp.round(a * scale) / scale


# ---------------------------------------------------------------- comparisons and logic
for _name, _fn in {"eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
                   "gt": jnp.greater, "ge": jnp.greater_equal}.items():
    lowering(f"{_name}.Tensor", f"{_name}.Scalar", promote=KIND.ALWAYS_BOOL, keep_result_dtype=False)(
        lambda a, b, _fn=_fn: _fn(a, b))

for _name, _fn in {"logical_and": jnp.logical_and, "logical_or": jnp.logical_or,
                   "logical_xor": jnp.logical_xor}.items():
    lowering(_name)(lambda a, b, _fn=_fn: _fn(a, b))


@lowering("logical_not")
def logical_not(a):
    return jnp.logical_not(a)


for _name in ("isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit"):
    lowering(_name)(lambda a, _f=getattr(jnp, _name): _f(a) if jnp.issubdtype(a.dtype, jnp.inexact)
                    else (jnp.ones_like(a, jnp.bool_) if _f is jnp.isfinite else
                          (a < 0) if _f is jnp.signbit else jnp.zeros_like(a, jnp.bool_)))

for _name, _fn in {"bitwise_and": jnp.bitwise_and, "bitwise_or": jnp.bitwise_or,
                   "bitwise_xor": jnp.bitwise_xor}.items():
    lowering(f"{_name}.Tensor", f"{_name}.Scalar", f"{_name}.Scalar_Tensor", promote=KIND.DEFAULT)(
        lambda a, b, _fn=_fn: _fn(a, b))


@lowering("bitwise_not", promote=KIND.DEFAULT)
def bitwise_not(a):
    return jnp.logical_not(a) if a.dtype == jnp.bool_ else jnp.bitwise_not(a)


@lowering("bitwise_left_shift.Tensor", "bitwise_left_shift.Tensor_Scalar", "bitwise_left_shift.Scalar_Tensor",
          "__lshift__.Tensor", "__lshift__.Scalar", promote=KIND.DEFAULT)
def lshift(a, b):
    bits = jnp.iinfo(a.dtype).bits
    return jnp.where((b >= bits) | (b < 0), jnp.zeros_like(a), jnp.left_shift(a, jnp.clip(b, 0, bits - 1)))


@lowering("bitwise_right_shift.Tensor", "bitwise_right_shift.Tensor_Scalar", "bitwise_right_shift.Scalar_Tensor",
          "__rshift__.Tensor", "__rshift__.Scalar", promote=KIND.DEFAULT)
def rshift(a, b):
    bits = jnp.iinfo(a.dtype).bits
    return jnp.right_shift(a, jnp.clip(b, 0, bits - 1))


@lowering("where.self")
def where(cond, a, b):
    return jnp.where(cond, a, b)


@lowering("nan_to_num")
def nan_to_num(a, nan=None, posinf=None, neginf=None):
    if not jnp.issubdtype(a.dtype, jnp.floating):
        return a
    return jnp.nan_to_num(a, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


# ---------------------------------------------------------------- copies and fills
@lowering("copy")
def copy(self, src, non_blocking=False):
    return convert(jnp.broadcast_to(src, self.shape), self.dtype)


@lowering("clone")
def clone(a, memory_format=None):
    return a


@lowering("fill.Scalar", "fill.Tensor")
def fill(a, value):
    return jnp.full(a.shape, value, a.dtype)


@lowering("zero")
def zero(a):
    return jnp.zeros(a.shape, a.dtype)


@lowering("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(a, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(a.dtype), a)


@lowering("lift_fresh_copy")
def lift_fresh_copy(a):
    return a


# ---------------------------------------------------------------- more math (special functions)
_special = jax.scipy.special

for _name, _fn in {
    "special_i0e": _special.i0e, "special_i1": _special.i1, "special_i1e": _special.i1e,
    "special_ndtr": _special.ndtr, "special_ndtri": _special.ndtri, "special_log_ndtr": _special.log_ndtr,
    "special_entr": _special.entr, "special_erfcx": _special.erfcx,
    "special_spherical_bessel_j0": lambda x: jnp.where(x == 0, jnp.ones_like(x), jnp.sin(x) / jnp.where(x == 0, 1, x)),
}.items():
    _unary(_name, _fn)


@lowering("angle", promote=KIND.INT_TO_FLOAT, keep_result_dtype=True)  # complex -> real
def angle(a):
    if jnp.iscomplexobj(a):
        return jnp.angle(a)   # atan2(imag, real): a real result
    return jnp.where(jnp.isnan(a), a, jnp.where(a < 0, jnp.pi, 0).astype(a.dtype))


@lowering("frexp.Tensor")
def frexp(a):
    m, e = jnp.frexp(a)
    return m, e.astype(jnp.int32)


@lowering("nextafter", promote=KIND.DEFAULT)
def nextafter(a, b):
    return jnp.nextafter(a, b)


@lowering("igamma", promote=KIND.INT_TO_FLOAT)
def igamma(a, x):
    return _special.gammainc(a, x)


@lowering("igammac", promote=KIND.INT_TO_FLOAT)
def igammac(a, x):
    return _special.gammaincc(a, x)


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


@lowering("special_xlog1py", "special_xlog1py.other_scalar", "special_xlog1py.self_scalar",
          promote=KIND.INT_TO_FLOAT)
def xlog1py(a, b):
    return _special.xlog1py(a, b)


@lowering("logaddexp", promote=KIND.INT_TO_FLOAT)
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


@lowering("logaddexp2", promote=KIND.INT_TO_FLOAT)
def logaddexp2(a, b):
    return jnp.logaddexp2(a, b)


@lowering("heaviside", promote=KIND.DEFAULT)
def heaviside(a, values):
    return jnp.where(a == 0, values, (a > 0).astype(a.dtype))


@lowering("ldexp.Tensor", promote=KIND.INT_TO_FLOAT)
def ldexp(a, b):
    return a * jnp.exp2(b)


@lowering("gcd", promote=KIND.DEFAULT)
def gcd(a, b):
    return jnp.gcd(a, b)


@lowering("lcm", promote=KIND.DEFAULT)
def lcm(a, b):
    g = jnp.gcd(a, b)
    return jnp.abs(jnp.where(g == 0, 0, a // jnp.where(g == 0, 1, g) * b))


def _isin(elements, tests, invert):
    flat = jnp.reshape(tests, (-1,))
    hit = jnp.any(jnp.expand_dims(elements, -1) == flat, axis=-1) if flat.size else jnp.zeros(jnp.shape(elements), jnp.bool_)
    return ~hit if invert else hit


@lowering("isin.Tensor_Tensor", "isin.Tensor_Scalar", "isin.Scalar_Tensor", promote=KIND.ALWAYS_BOOL,
          promote_args=(0, 1))
def isin(elements, tests, assume_unique=False, invert=False):
    return _isin(jnp.asarray(elements), jnp.asarray(tests), invert)


# ---------------------------------------------------------------- complex construction
@lowering("conj_physical")
def conj_physical(a):
    return jnp.conj(a) if jnp.iscomplexobj(a) else a


_COMPLEX_PARTS = {jnp.dtype(jnp.float16), jnp.dtype(jnp.float32), jnp.dtype(jnp.float64)}


def _complex_parts(a, b):
    """PyTorch's checks for the two real parts of torch.complex / torch.polar."""
    names = [scalar_type_name(x.dtype) for x in (a, b)]
    if not all(jnp.dtype(x.dtype) in _COMPLEX_PARTS for x in (a, b)):
        raise RuntimeError(f"Expected both inputs to be Half, Float or Double tensors but got {names[0]} and {names[1]}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"Expected object of scalar type {names[0]} but got scalar type {names[1]} for second argument")
    return jnp.broadcast_arrays(a, b)


@lowering("complex")
def make_complex(real, imag):
    return lax.complex(*_complex_parts(real, imag))


@lowering("polar")
def polar(abs_, angle_):
    abs_, angle_ = _complex_parts(abs_, angle_)
    return lax.complex(abs_ * jnp.cos(angle_), abs_ * jnp.sin(angle_))
