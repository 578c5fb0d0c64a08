"""Helpers of elementwise.py's lowerings where PyTorch's kernels follow C and C++ rather than XLA:
integer and complex pow, complex add, gcd, lcm; and the complex functions of C99's Annex G, which the
CPU's kernels call (glibc's casin, cacos, ...) and CUDA's thrust follows: the sign of a zero part picks
the side of a branch cut (acos(2 - 0j) is +1.317j, XLA's -1.317j), and infinities and NaNs have fixed
answers (asin(0 + nanj) is 0 + nanj, XLA's nan + nanj). For those, XLA's function is used in the first
quadrant, where it is accurate, and the symmetries the standard states give the other three."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .dtypes import multiply


def int_pow(a, b):
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


def complex_pow(a, b):
    """exp(b * log(a)), as the CPU's (C's cpow) and CUDA's (thrust) complex pow. XLA's complex power
    multiplies |a|^re(b) by exp(-im(b) arg(a)) separately: 0 * inf = NaN where one underflows and the
    other overflows (43% of the results NaN for |a|, |b| ~ 1e5, where the CPU has 0 or inf)."""
    dtype = jnp.result_type(a, b)
    a = jnp.asarray(a, dtype)
    log = jnp.log(a)  # (C's clog: |a| is inf where a part is, NaN or not)
    log = jnp.where(
        jnp.isinf(jnp.real(a)) | jnp.isinf(jnp.imag(a)),
        lax.complex(jnp.full_like(jnp.real(log), jnp.inf), jnp.imag(log)),
        log,
    )
    w = _c_product(jnp.asarray(b, dtype), log)
    re, im = jnp.real(w), jnp.imag(w)
    scale = jnp.exp(re)
    result = lax.complex(scale * jnp.cos(im), scale * jnp.sin(im))
    return jnp.where(re == -jnp.inf, jnp.zeros((), dtype), result)  # C's cexp(-inf + iy): 0 for any y


def _c_product(p, q):
    """C's complex product (libgcc's __mulsc3, which glibc's cpow uses): where the plain product is
    NaN in both parts, infinite parts are boxed to +-1, NaN parts of the other operand to +-0, and the
    product taken again times inf ((-inf+nanj) * (inf+0.8j) is -inf+nanj, so cpow gives 0, not NaN)."""
    w = multiply(p, q)
    pr, pi, qr, qi = jnp.real(p), jnp.imag(p), jnp.real(q), jnp.imag(q)

    def box(x, y, other_inf):  # an infinite operand's parts as +-1/+-0; the other's NaNs as +-0
        inf = jnp.isinf(x) | jnp.isinf(y)
        x = jnp.where(inf, jnp.copysign(jnp.isinf(x).astype(x.dtype), x), x)
        y = jnp.where(inf, jnp.copysign(jnp.isinf(y).astype(y.dtype), y), y)
        x = jnp.where(other_inf & jnp.isnan(x), jnp.copysign(jnp.zeros_like(x), x), x)
        y = jnp.where(other_inf & jnp.isnan(y), jnp.copysign(jnp.zeros_like(y), y), y)
        return x, y, inf

    p_inf, q_inf = jnp.isinf(pr) | jnp.isinf(pi), jnp.isinf(qr) | jnp.isinf(qi)
    pr, pi, _ = box(pr, pi, q_inf)
    qr, qi, _ = box(qr, qi, p_inf)
    again = lax.complex(jnp.inf * (pr * qr - pi * qi), jnp.inf * (pr * qi + pi * qr))
    recover = jnp.isnan(jnp.real(w)) & jnp.isnan(jnp.imag(w)) & (p_inf | q_inf)
    return jnp.where(recover, again, w)


def euclid_gcd(a, b):
    """gcd as the CPU's and CUDA's calc_gcd: Euclid's loop on abs(a), abs(b) with C's remainder. jnp.gcd
    never ended for a signed type's minimum (abs keeps it negative, and its swap to keep the larger
    first then cycles): int8 gcd(55, -128) hung the process."""
    dtype = jnp.result_type(a, b)
    if not jnp.issubdtype(dtype, jnp.integer):
        return jnp.gcd(a, b)  # JAX refuses bool and floats, which the engine reports as the CPU's error
    a, b = jnp.broadcast_arrays(jnp.abs(jnp.asarray(a, dtype)), jnp.abs(jnp.asarray(b, dtype)))

    def step(ab):
        a, b = ab
        nonzero = a != 0
        return jnp.where(nonzero, lax.rem(b, jnp.where(nonzero, a, 1)), 0), jnp.where(nonzero, a, b)

    # (|b % a| < |a| as unsigned magnitudes, so each element reaches a == 0)
    return lax.while_loop(lambda ab: jnp.any(ab[0] != 0), step, (a, b))[1]


def complex_add(a, b, alpha):
    """a + alpha b as the CPU's and CUDA's kernels compute it, alpha 1 included: a complex product, so an
    infinite part of b gives NaN in the other part too (0 + infj is nan+infj there)."""
    dtype = jnp.result_type(a, b)
    return a + multiply(jnp.asarray(b, dtype), jnp.asarray(alpha, dtype))


def c_lcm(a, b):
    """lcm as C++ computes abs(a / gcd * b): (u)int8/int16 in int (integer promotion), wrapping only when
    stored (int16 lcm(1113, 10701) is -27625 on the CPU and CUDA, not abs of the wrapped product)."""
    dtype = jnp.result_type(a, b)
    wide = jnp.int32 if dtype != jnp.bool_ and jnp.iinfo(dtype).bits < 32 else dtype  # (bool: gcd refuses it)
    a, b = jnp.asarray(a, wide), jnp.asarray(b, wide)
    g = euclid_gcd(a, b)
    return jnp.abs(jnp.where(g == 0, 0, a // jnp.where(g == 0, 1, g) * b)).astype(dtype)


# ---------------------------------------------------------------- C99 Annex G complex functions

_HALF_PI, _QUARTER_PI = jnp.pi / 2, jnp.pi / 4


def _parts(z):
    return jnp.real(z), jnp.imag(z)


def _signed(value, like):
    """`value` (>= 0 or NaN) with the sign bit of `like`, -0 and NaNs' included."""
    return jnp.where(jnp.signbit(like), -value, value)


def _first_quadrant(fn, z):
    x, y = _parts(z)
    ax, ay = jnp.abs(x), jnp.abs(y)
    u, v = _parts(fn(lax.complex(ax, ay)))
    return x, y, ax, ay, u, v


def _nan(x):
    return jnp.full_like(x, jnp.nan)


def _finite(x):
    return jnp.isfinite(x)


def casinh(z):
    """asinh: odd and conj-symmetric; G.6.2.2's special values in the first quadrant."""
    x, y, ax, ay, u, v = _first_quadrant(jnp.arcsinh, z)
    inf, nan, zero = jnp.full_like(ax, jnp.inf), _nan(ax), jnp.zeros_like(ax)
    xi, yi, xn, yn = jnp.isinf(ax), jnp.isinf(ay), jnp.isnan(ax), jnp.isnan(ay)
    u = jnp.where(xi | (yi & ~xn) | (xn & yi), inf, u)
    v = jnp.where(xi & _finite(ay), zero, v)
    v = jnp.where(yi & _finite(ax), jnp.full_like(ax, _HALF_PI), v)
    v = jnp.where(xi & yi, jnp.full_like(ax, _QUARTER_PI), v)
    v = jnp.where(yn | (xn & (ay != 0)), nan, v)
    u = jnp.where((yn & ~xi) | (xn & ~yi), nan, u)
    v = jnp.where(xn & (ay == 0), zero, v)
    return lax.complex(_signed(u, x), _signed(v, y))


def _through_i(hyperbolic, z):
    """-i f(i z): a trigonometric function from its hyperbolic twin, the factors of i exchanging parts
    exactly (no complex products)."""
    x, y = _parts(z)
    w = hyperbolic(lax.complex(-y, x))
    return lax.complex(jnp.imag(w), -jnp.real(w))


def casin(z):
    """asin(z) = -i asinh(i z)."""
    return _through_i(casinh, z)


def catanh(z):
    """atanh: odd and conj-symmetric; G.6.2.3's special values in the first quadrant."""
    x, y, ax, ay, u, v = _first_quadrant(jnp.arctanh, z)
    nan, zero, half_pi = _nan(ax), jnp.zeros_like(ax), jnp.full_like(ax, _HALF_PI)
    xi, yi, xn, yn = jnp.isinf(ax), jnp.isinf(ay), jnp.isnan(ax), jnp.isnan(ay)
    u = jnp.where((ax == 1) & (ay == 0), jnp.full_like(ax, jnp.inf), u)
    v = jnp.where((ax == 1) & (ay == 0), zero, v)
    u = jnp.where(xi | yi, zero, u)
    v = jnp.where(yi | (xi & ~yn), half_pi, v)
    u = jnp.where(yn & (ax == 0), zero, u)
    u = jnp.where((yn & ~xi & (ax != 0)) | (xn & ~yi), nan, u)
    v = jnp.where(yn | (xn & ~yi), nan, v)
    return lax.complex(_signed(u, x), _signed(v, y))


def catan(z):
    """atan(z) = -i atanh(i z)."""
    return _through_i(catanh, z)


def cacos(z):
    """acos: conj-symmetric, acos(-z) = pi - acos(z); G.6.1.1's special values."""
    x, y, ax, ay, u, v = _first_quadrant(jnp.arccos, z)
    nan, inf = _nan(ax), jnp.full_like(ax, jnp.inf)
    xi, yi, xn, yn = jnp.isinf(ax), jnp.isinf(ay), jnp.isnan(ax), jnp.isnan(ay)
    v = -jnp.abs(v)  # (first quadrant: the imaginary part is <= 0)
    u = jnp.where((ax == 0) & (ay == 0) | (ax == 0) & yn | yi & _finite(ax), jnp.full_like(ax, _HALF_PI), u)
    v = jnp.where((ax == 0) & (ay == 0), -jnp.zeros_like(ax), v)  # (pi/2 - 0j)
    v = jnp.where(yi | xi & ~yn, -inf, v)
    u = jnp.where(xi & _finite(ay), jnp.zeros_like(ax), u)
    u = jnp.where(xi & yi, jnp.full_like(ax, _QUARTER_PI), u)
    u = jnp.where(xn | yn & (ax != 0), nan, u)
    v = jnp.where((xn & ~yi) | (yn & ~xi), nan, v)
    v = jnp.where(xi & yn, -inf, v)
    u = jnp.where(jnp.signbit(x) & ~xn, jnp.pi - u, u)
    return lax.complex(u, jnp.where(jnp.signbit(y), -v, v))


def cacosh(z):
    """acosh(z) = +-i acos(z), the sign that makes the real part >= 0: |Im acos| + i copysign(Re acos, Im z)."""
    w = cacos(z)
    return lax.complex(jnp.abs(jnp.imag(w)), _signed(jnp.abs(jnp.real(w)), jnp.imag(z)))


def csqrt(z):
    """sqrt: conj-symmetric; G.6.4.2's special values (an infinite imaginary part gives inf + inf j)."""
    x, y = _parts(z)
    ay = jnp.abs(y)
    u, v = _parts(jnp.sqrt(lax.complex(x, ay)))
    inf = jnp.full_like(ay, jnp.inf)
    yi, xn, yn = jnp.isinf(ay), jnp.isnan(x), jnp.isnan(ay)
    neg_inf, pos_inf = jnp.isneginf(x), jnp.isposinf(x)
    u = jnp.where(neg_inf & _finite(ay), jnp.zeros_like(ay), u)
    v = jnp.where(neg_inf & ~yn, inf, v)
    u = jnp.where(pos_inf, inf, u)
    v = jnp.where(pos_inf & _finite(ay), jnp.zeros_like(ay), v)
    u = jnp.where(neg_inf & yn, _nan(ay), u)
    v = jnp.where(neg_inf & yn, inf, v)
    u = jnp.where(yi, inf, u)
    v = jnp.where(yi, inf, v)
    u = jnp.where(xn & ~yi, _nan(ay), u)
    v = jnp.where(xn & ~yi, _nan(ay), v)
    return lax.complex(u, _signed(v, y))


def cabs(z):
    """|z| as C's cabs (hypot): inf where either part is infinite, NaN or not."""
    x, y = _parts(z)
    return jnp.where(jnp.isinf(x) | jnp.isinf(y), jnp.inf, jnp.abs(z)).astype(jnp.abs(z).dtype)


def cexp(z):
    """exp: G.6.3.1's values where XLA's exp(x) cis(y) gives NaN: a zero imaginary part stays (inf + 0j,
    NaN + 0j), exp(-inf + i y) is 0 for y infinite or NaN, exp(+inf + i y) is inf + nan j."""
    x, y = _parts(z)
    u, v = _parts(jnp.exp(z))
    bad_y = ~jnp.isfinite(y)
    u = jnp.where(y == 0, jnp.exp(x), u)
    v = jnp.where(y == 0, y, v)
    u = jnp.where(jnp.isneginf(x) & bad_y, jnp.zeros_like(x), u)
    v = jnp.where(jnp.isneginf(x) & bad_y, _signed(jnp.zeros_like(x), y), v)  # (glibc's sign)
    u = jnp.where(jnp.isposinf(x) & bad_y, jnp.full_like(x, jnp.inf), u)
    v = jnp.where(jnp.isposinf(x) & bad_y, _nan(x), v)
    return lax.complex(u, v)


def clog_fixed(fn):
    """fn (log, log2, log10) of complex z with C's clog at inf + nan j and nan + inf j: |z| is inf, so the
    real part is inf (XLA's is NaN)."""

    def log(z):
        x, y = _parts(z)
        w = fn(z)
        inf_nan = (jnp.isinf(x) & jnp.isnan(y)) | (jnp.isnan(x) & jnp.isinf(y))
        return lax.complex(jnp.where(inf_nan, jnp.inf, jnp.real(w)).astype(x.dtype), jnp.imag(w))

    return log


def cexp2(z):
    """exp2 of complex z: exp(z log 2) through cexp's C99 values."""
    x, y = _parts(z)
    ln2 = jnp.log(2).astype(x.dtype)  # (each part times a real: a complex product makes inf * 0 = NaN)
    return cexp(lax.complex(x * ln2, y * ln2))


def csigmoid(z):
    """1 / (1 + exp(-z)), the CPU's complex sigmoid, through cexp's C99 values (XLA's logistic gives NaN
    where exp(-z) overflows)."""
    return creciprocal(1 + cexp(-z))


def crsqrt(z):
    """1 / sqrt(z), the CPU's complex rsqrt (a complex division: 1 / (inf + inf j) is NaN there)."""
    return creciprocal(csqrt(z))


def creciprocal(b):
    """1 / b as c10::complex's division of 1 + 0j (Smith's, NumPy's too): 1 / (inf + inf j) is NaN, where
    XLA's is 0. Spelled out for the numerator 1 + 0j: XLA folds `x + 0` to x, which the sign of a zero
    part would notice (1 / -1j is +0 + 1j)."""
    c, d = _parts(b)
    c_wide = jnp.abs(c) >= jnp.abs(d)
    rat = jnp.where(c_wide, d / c, c / d)
    scl = 1 / jnp.where(c_wide, c + d * rat, d + c * rat)
    one_or_nan = jnp.where(jnp.isfinite(rat), 1, jnp.nan).astype(c.dtype)  # (1 + 0 * rat, -(0 * rat - 1))
    plus_zero = jnp.where(rat == 0, jnp.zeros_like(rat), rat)  # rat + 0: -0 becomes +0
    re = jnp.where(c_wide, one_or_nan, plus_zero) * scl
    im = jnp.where(c_wide, jnp.where(rat == 0, jnp.zeros_like(rat), -rat), -one_or_nan) * scl
    both_zero = (c == 0) & (d == 0)
    re = jnp.where(both_zero, jnp.inf, re)
    im = jnp.where(both_zero, jnp.nan, im)
    return lax.complex(re, im)
