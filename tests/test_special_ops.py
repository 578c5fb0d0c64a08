"""torch.special polynomials, Bessel functions and Airy Ai on the tpu device vs PyTorch's CPU kernels.

The OpInfo sweep (tests/test_opinfo.py) samples small random inputs; these tests add the edges that
the CPU kernels special-case: negative / zero / one / large degrees, non-integer and non-finite
degrees, |x| == 1 (x == 0, 1 for the shifted family), x outside [-1, 1], x <= 0 for Y and K,
the branch points of the rational approximations, and +-inf / NaN.
"""

import math

import pytest
import torch
from conftest import assert_close_to_cpu

S = torch.special
TPU = "tpu"
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-7, atol=1e-7)}
INF, NAN = math.inf, math.nan

# ops whose CPU kernel returns an uninitialised variable for NaN x and n >= 2
NAN_X_UNDEFINED = {
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
}
POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]
UNARY = [
    "bessel_j0",
    "bessel_j1",
    "bessel_y0",
    "bessel_y1",
    "modified_bessel_i0",
    "modified_bessel_i1",
    "modified_bessel_k0",
    "modified_bessel_k1",
    "scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1",
    "airy_ai",
]

X_EDGES = [
    -INF,
    -7.5,
    -3.0,
    -1.5,
    -1.0,
    -0.999,
    -0.75,
    -0.5,
    -0.25,
    0.0,
    0.1,
    0.25,
    0.5,
    0.75,
    0.999,
    1.0,
    1.001,
    1.5,
    2.0,
    4.0,
    INF,
]
# degrees: negative, 0, 1, around the closed-form thresholds (4, 6, 8), large, and non-integer or
# non-finite ones (truncated, or treated as a negative degree, like static_cast<int64_t> on x86)
N_VALUES = [
    -3.0,
    -1.0,
    -0.5,
    0.0,
    1.0,
    2.0,
    3.0,
    4.0,
    5.0,
    6.0,
    7.0,
    8.0,
    9.0,
    12.0,
    25.0,
    50.0,
    2.7,
    NAN,
    INF,
    -INF,
    1e30,
]
N_LARGE = 25  # float32 only matches to a looser absolute tolerance above this degree (see below)


def _run(fn, *args, **kwargs):
    dev = [a.to(TPU) if isinstance(a, torch.Tensor) else a for a in args]
    return fn(*args, **kwargs), fn(*dev, **kwargs)


def _close(actual, expected, **tol):
    assert_close_to_cpu(actual, expected, equal_nan=True, **(tol or TOL[expected.dtype]))


def _poly_grid(name, dtype, gen):
    x = torch.tensor(X_EDGES + [NAN], dtype=torch.float64)
    x = torch.cat([x, torch.rand(12, generator=gen, dtype=torch.float64) * 2.4 - 1.2])
    if name.startswith("shifted"):
        x = torch.cat([x, torch.rand(8, generator=gen, dtype=torch.float64)])  # the shifted domain [0, 1]
    n = torch.tensor(N_VALUES, dtype=torch.float64)
    return x.to(dtype)[:, None], n.to(dtype)[None, :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_float(name, dtype):
    x, n = _poly_grid(name, dtype, torch.Generator().manual_seed(0))
    expected, actual = _run(getattr(S, name), x, n)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if name in NAN_X_UNDEFINED:
        # NaN x with a degree >= 2: the CPU returns an uninitialised variable; tpu returns NaN,
        # the value of the recurrence. The defined cases (n < 2) are compared below.
        undefined = x.isnan() & (n >= 2) & n.isfinite() & (n < 2.0**63)
        assert actual.cpu()[undefined].isnan().all()
        expected = torch.where(undefined, actual.cpu(), expected)
    if dtype == torch.float32:
        # At high degree the result inherits ~n ulps of rounding in acos/cos (closed forms) or in
        # the recurrence, and the CPU's libm differs from XLA's by an ulp or two: compare the large
        # degrees to a looser absolute tolerance (the polynomials are O(1) to O(n^2) there).
        small = (n.abs() <= N_LARGE)[0]
        _close(actual[:, small], expected[:, small])
        _close(actual[:, ~small], expected[:, ~small], rtol=1e-4, atol=1e-4)
    else:
        _close(actual, expected)


# (x dtype, n dtype): each op gets one combination, every integer dtype and bool occur as x and as n
INT_PAIRS = [
    (torch.int64, torch.int32),
    (torch.uint8, torch.int64),
    (torch.bool, torch.int32),
    (torch.int32, torch.uint8),
    (torch.int64, torch.bool),
    (torch.int16, torch.int64),
]


def _int_params(names, dtypes, ids):
    """One integer dtype (pair) per op, rotating through `dtypes`. Integer operands take one
    cast-to-float path for every op: the default run keeps the first round (every dtype once),
    `-m slow` the ops after it (each op's float path is checked by its float tests)."""
    return [
        pytest.param(
            name,
            dtypes[i % len(dtypes)],
            id=f"{name}-{ids(dtypes[i % len(dtypes)])}",
            marks=pytest.mark.slow if i >= len(dtypes) else (),
        )
        for i, name in enumerate(names)
    ]


@pytest.mark.parametrize("name,dtypes", _int_params(POLYNOMIALS, INT_PAIRS, lambda v: "-".join(str(d)[6:] for d in v)))
def test_polynomial_integer(name, dtypes):
    """Integer and bool operands compute in the default float dtype, as on the CPU."""

    def values(dtype, lo, hi, shape):
        if dtype == torch.bool:
            return torch.tensor([False, True]).reshape((1, 2) if shape[0] == 1 else (2, 1))
        lo = max(lo, 0) if dtype == torch.uint8 else lo
        return torch.randint(lo, hi, shape, generator=gen).to(dtype)

    gen = torch.Generator().manual_seed(1)
    x = values(dtypes[0], -4, 5, (9, 1))
    n = values(dtypes[1], -2, 14, (1, 10))
    expected, actual = _run(getattr(S, name), x, n)
    _close(actual, expected)


@pytest.mark.parametrize("name", ["chebyshev_polynomial_t", "hermite_polynomial_h"])
def test_polynomial_scalar_overloads_and_out(name):
    """.x_scalar / .n_scalar overloads, promotion with Python scalars and 0-d tensors, and the
    out= variants (derived by the engine from the functional op)."""
    fn = getattr(S, name)
    x = torch.tensor([-2.0, -1.0, -0.3, 0.0, 0.6, 1.0, 3.0])
    n = torch.tensor([-1, 0, 1, 2, 5, 9, 30])
    cases = [
        (x, 7.9),
        (True, n),
        (x, n),
        (-1.0, n.double()),
        (n, x.double()),
        (x, torch.tensor(4.0, dtype=torch.float64)),
    ]
    for i, args in enumerate(cases):
        expected, actual = _run(fn, *args)
        _close(actual, expected)
        if i < 3:
            out = torch.empty_like(expected, device=TPU)
            ret = fn(*[a.to(TPU) if isinstance(a, torch.Tensor) else a for a in args], out=out)
            assert ret is out
            _close(out, expected)


def test_polynomial_huge_degree_stops_early():
    """Lanes whose recurrence overflows to NaN stop, as the CPU loop does: a degree of 1e12 with
    |x| > 1 costs a few hundred iterations, not 1e12; lanes that return early (x == -1) take none.
    (A regression here shows as a hang.)"""
    x = torch.tensor([1.5, -3.0, 2.0, -1.0], dtype=torch.float64)
    n = torch.tensor([1e12, 1e12, 4e18, 1e12 + 1], dtype=torch.float64)
    for name in [
        "chebyshev_polynomial_t",
        "chebyshev_polynomial_u",
        "shifted_chebyshev_polynomial_v",
        "hermite_polynomial_he",
    ]:
        expected, actual = _run(getattr(S, name), x, n)
        _close(actual, expected)


def _unary_inputs(dtype, gen):
    edges = [
        -INF,
        -200.0,
        -50.0,
        -10.0,
        -5.0,
        -2.5,
        -2.09,
        -2.0,
        -1.0,
        -1e-6,
        -0.0,
        0.0,
        1e-6,
        1e-3,
        0.5,
        1.0,
        2.0,
        2.09,
        2.5,
        5.0,
        5.0001,
        8.0,
        8.5,
        20.0,
        50.0,
        103.0,
        104.0,
        700.0,
        1e30,
        INF,
        NAN,
    ]
    x = torch.cat(
        [
            torch.tensor(edges, dtype=torch.float64),
            torch.randn(24, generator=gen, dtype=torch.float64) * 6,
            torch.rand(24, generator=gen, dtype=torch.float64) * 30,
        ]
    )
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", UNARY)
def test_unary_float(name, dtype):
    expected, actual = _run(getattr(S, name), _unary_inputs(dtype, torch.Generator().manual_seed(2)))
    _close(actual, expected)


@pytest.mark.parametrize(
    "name,dtype", _int_params(UNARY, (torch.int64, torch.uint8, torch.bool, torch.int32), lambda v: str(v)[6:])
)
def test_unary_integer(name, dtype):
    """Integer and bool inputs compute in the default float dtype (one integer dtype per op: they
    share the cast-then-float32 path, and the OpInfo sweep runs every (op, dtype) pair)."""
    x = {torch.bool: torch.tensor([False, True]), torch.uint8: torch.arange(0, 256, 5)}.get(
        dtype, torch.arange(-12, 40)
    )
    expected, actual = _run(getattr(S, name), x.to(dtype))
    _close(actual, expected)


@pytest.mark.parametrize("name", ["bessel_y1", "airy_ai"])
def test_unary_out(name):
    x = _unary_inputs(torch.float64, torch.Generator().manual_seed(3))
    expected = getattr(S, name)(x)
    out = torch.empty_like(expected, device=TPU)
    assert getattr(S, name)(x.to(TPU), out=out) is out
    _close(out, expected)
