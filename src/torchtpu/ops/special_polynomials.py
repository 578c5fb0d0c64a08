"""Lowerings: torch.special orthogonal polynomials (Chebyshev T/U/V/W and their shifted forms, Hermite
H/He, Laguerre L, Legendre P), each with its two overloads taking a Scalar.

Ports of PyTorch's CPU kernels (ATen/native/Math.h: three-term recurrences, and the closed forms
the CPU switches to), branch for branch and in the same operation order, so that results agree
with the CPU to rounding. Each scalar `if` becomes a `jnp.where` (lowest priority first, so the
later, earlier-returning branches win) and each data-dependent loop a masked `lax.while_loop`.
The Bessel functions and Airy Ai are in special.py.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .table import KIND, lowering

# ---------------------------------------------------------------- helpers


def _operands(x, n):
    """(x, integer degree) broadcast, x in the computation dtype.

    One of the two may be a weakly typed Scalar (the .x_scalar/.n_scalar overloads); the
    table's promotion already cast the tensor operand(s) to the computation dtype. n is cast to
    that dtype first, as the CPU's TensorIterator does, then truncated like
    static_cast<int64_t>: on x86 NaN, +-inf and out-of-range values become INT64_MIN, which the
    kernels treat as a negative degree (result 0).
    """
    strong = [v for v in (x, n) if hasattr(v, "dtype") and not getattr(v, "weak_type", False)]
    dt = strong[0].dtype if strong else jnp.result_type(float)
    x = jnp.asarray(x).astype(dt)
    n = jnp.asarray(n).astype(dt)
    x, n = jnp.broadcast_arrays(x, n)
    ok = jnp.isfinite(n) & (jnp.abs(n) < 2.0**63)
    k = jnp.where(ok, jnp.trunc(jnp.where(ok, n, 0)), -1).astype(jnp.int64)
    return x, k


def _f(k, like):
    """An int64 quantity converted to the float dtype, as C++ does in mixed arithmetic."""
    return k.astype(like.dtype)


def _recurrence(step, q, count, stop_on_nan=True):
    """p, q <- q, step(j, p, q) for j = 1..count (per element; count <= 0: none), from p = 1;
    j is an int64 scalar (the C++ loop index: convert with `_f` as C++ converts it).

    Every polynomial here is such a loop. Lanes take their own number of steps: the loop runs
    until the longest lane is done, and like the CPU loop (`k <= n && !isnan(q)`) a lane stops at
    NaN, so an overflowing lane with an enormous degree costs few iterations.
    """

    def live(j, q):
        m = j <= count
        return m & ~jnp.isnan(q) if stop_on_nan else m

    def cond(s):
        return jnp.any(live(s[0], s[2]))

    def body(s):
        j, p, q = s
        m = live(j, q)
        r = step(j, p, q)
        return j + 1, jnp.where(m, q, p), jnp.where(m, r, q)

    return lax.while_loop(cond, body, (jnp.asarray(1, jnp.int64), jnp.ones_like(q), q))[2]


def _binary_lowering(name):
    """The lowering of `name` (its tensor-tensor overload) and of its two overloads with a Scalar."""
    return lowering(name, f"{name}.x_scalar", f"{name}.n_scalar", promote=KIND.INT_TO_FLOAT)


# ---------------------------------------------------------------- Chebyshev polynomials
# Inside (-1, 1) and above a degree threshold the CPU switches from the recurrence to a
# trigonometric closed form in t = acos(s); the switch is kept so that results match there too.


def _chebyshev(x, n, s, q0, nmin, closed_form, edges):
    """One of the (shifted) Chebyshev polynomials in s (x, or 2x - 1 for the shifted family).

    q0: the degree-1 value that starts the recurrence r = 2s q - p; closed_form(t) the value for
    n > nmin and |s| < 1; edges: (mask, value) special cases in increasing priority.
    """
    closed = (n > nmin) & (jnp.abs(s) < 1)
    early = closed
    for mask, _ in edges:
        early = early | mask
    # lanes that return early take no steps (|x| == 1 would otherwise iterate up to n, finitely)
    out = _recurrence(lambda j, p, q: (s + s) * q - p, q0, jnp.where(early, 0, n - 1))
    out = jnp.where(n == 0, 1, out)
    out = jnp.where(closed, closed_form(jnp.arccos(s)), out)
    for mask, value in edges:
        out = jnp.where(mask, value, out)
    return jnp.where(n < 0, 0, out).astype(x.dtype)


def _t_closed(x, n):
    return lambda t: jnp.cos(_f(n, x) * t)


def _u_closed(x, n, s):
    def f(t):
        n1 = _f(n + 1, x)
        return jnp.where(jnp.sin(t) != 0, jnp.sin(n1 * t) / jnp.sin(t), n1 * jnp.cos(n1 * t) / s)

    return f


def _v_closed(x, n, fallback):
    return lambda t: jnp.where(jnp.sin(t / 2) != 1, jnp.cos((_f(n, x) + 0.5) * t) / jnp.cos(t / 2), fallback)


def _w_closed(x, n, fallback):
    return lambda t: jnp.where(jnp.cos(t / 2) != 1, jnp.sin((_f(n, x) + 0.5) * t) / jnp.sin(t / 2), fallback)


def _alternating(n, v):
    return jnp.where(n % 2 == 0, v, -v)


@_binary_lowering("special_chebyshev_polynomial_t")
def chebyshev_polynomial_t(x, n):
    x, n = _operands(x, n)
    edge = jnp.where((x > 0) | (n % 2 == 0), 1.0, -1.0)
    return _chebyshev(x, n, x, x, 6, _t_closed(x, n), [(jnp.abs(x) == 1, edge)])


@_binary_lowering("special_chebyshev_polynomial_u")
def chebyshev_polynomial_u(x, n):
    x, n = _operands(x, n)
    n1 = _f(n + 1, x)
    edge = jnp.where((x > 0) | (n % 2 == 0), n1, -n1)
    return _chebyshev(x, n, x, x + x, 8, _u_closed(x, n, x), [(jnp.abs(x) == 1, edge)])


@_binary_lowering("special_chebyshev_polynomial_v")
def chebyshev_polynomial_v(x, n):
    x, n = _operands(x, n)
    odd = _alternating(n, _f(n + n + 1, x))
    edge = jnp.where(x > 0, 1, odd)
    return _chebyshev(x, n, x, x + x - 1, 8, _v_closed(x, n, odd), [(jnp.abs(x) == 1, edge)])


@_binary_lowering("special_chebyshev_polynomial_w")
def chebyshev_polynomial_w(x, n):
    x, n = _operands(x, n)
    edge = jnp.where(x > 0, _f(n + n + 1, x), _alternating(n, jnp.ones_like(x)))
    return _chebyshev(x, n, x, x + x + 1, 8, _w_closed(x, n, edge), [(jnp.abs(x) == 1, edge)])


# The shifted family: the same in y = 2x - 1, with special cases at x == 0 and x == 1.


@_binary_lowering("special_shifted_chebyshev_polynomial_t")
def shifted_chebyshev_polynomial_t(x, n):
    x, n = _operands(x, n)
    y = x + x - 1
    return _chebyshev(x, n, y, y, 6, _t_closed(x, n), [(x == 0, _alternating(n, jnp.ones_like(x))), (x == 1, 1)])


@_binary_lowering("special_shifted_chebyshev_polynomial_u")
def shifted_chebyshev_polynomial_u(x, n):
    x, n = _operands(x, n)
    y = x + x - 1
    n1 = _f(n + 1, x)
    return _chebyshev(x, n, y, y + y, 6, _u_closed(x, n, y), [(x == 0, _alternating(n, n1)), (x == 1, n1)])


@_binary_lowering("special_shifted_chebyshev_polynomial_v")
def shifted_chebyshev_polynomial_v(x, n):
    x, n = _operands(x, n)
    y = x + x - 1
    odd = _alternating(n, _f(n + n + 1, x))
    return _chebyshev(x, n, y, y + y - 1, 6, _v_closed(x, n, odd), [(x == 0, odd), (x == 1, 1)])


@_binary_lowering("special_shifted_chebyshev_polynomial_w")
def shifted_chebyshev_polynomial_w(x, n):
    x, n = _operands(x, n)
    y = x + x - 1
    alternating = _alternating(n, jnp.ones_like(x))
    # the threshold is 4 here, not 6, as in PyTorch
    return _chebyshev(
        x, n, y, y + y + 1, 4, _w_closed(x, n, alternating), [(x == 0, alternating), (x == 1, _f(n + n + 1, x))]
    )


# ---------------------------------------------------------------- Hermite, Laguerre, Legendre


def _hermite_limit(x):
    # PyTorch returns NaN above this degree (getHermitianLimit), which also bounds the loop
    return 128 if x.dtype == jnp.float32 else 512


@_binary_lowering("special_hermite_polynomial_h")
def hermite_polynomial_h(x, n):
    x, n = _operands(x, n)
    big = n > _hermite_limit(x)
    out = _recurrence(
        lambda j, p, q: (x + x) * q - _f(j + j, x) * p, x + x, jnp.where(big, 0, n - 1), stop_on_nan=False
    )
    out = jnp.where(big, jnp.nan, out)
    out = jnp.where(n == 0, 1, out)
    return jnp.where(n < 0, 0, out).astype(x.dtype)


@_binary_lowering("special_hermite_polynomial_he")
def hermite_polynomial_he(x, n):
    x, n = _operands(x, n)
    big = n > _hermite_limit(x)
    out = _recurrence(lambda j, p, q: x * q - _f(j, x) * p, x, jnp.where(big, 0, n - 1), stop_on_nan=False)
    out = jnp.where(big, jnp.nan, out)
    out = jnp.where(n == 0, 1, out)
    return jnp.where(n < 0, 0, out).astype(x.dtype)


@_binary_lowering("special_laguerre_polynomial_l")
def laguerre_polynomial_l(x, n):
    x, n = _operands(x, n)
    one_minus_x = 1 - x
    out = _recurrence(
        lambda j, p, q: ((_f(j + j, x) + one_minus_x) * q - _f(j, x) * p) / _f(j + 1, x),
        one_minus_x,
        jnp.where(x == 0, 0, n - 1),
    )
    out = jnp.where((n == 0) | (x == 0), 1, out)
    return jnp.where(n < 0, 0, out).astype(x.dtype)


@_binary_lowering("special_legendre_polynomial_p")
def legendre_polynomial_p(x, n):
    x, n = _operands(x, n)
    edge = jnp.abs(x) == 1
    out = _recurrence(
        lambda j, p, q: (_f(j + j + 1, x) * x * q - _f(j, x) * p) / _f(j + 1, x), x, jnp.where(edge, 0, n - 1)
    )
    out = jnp.where(n == 0, 1, out)
    out = jnp.where(edge, jnp.where((x > 0) | (n % 2 == 0), 1, -1), out)
    return jnp.where(n < 0, 0, out).astype(x.dtype)
