"""Helpers of elementwise.py's lowerings where PyTorch's kernels follow C and C++: integer and complex pow, complex
add, gcd, lcm."""

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
