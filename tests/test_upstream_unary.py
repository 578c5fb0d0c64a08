"""Regressions found by test_unary_ufuncs.py on "tpu" and by comparing every unary OpInfo with the CPU at
special values (issue 47): compared against the CPU on the same inputs."""

import pytest
import torch
from torch.testing import assert_close

DEV = "tpu"
INF, NAN = float("inf"), float("nan")
# float32/float64 subnormals are left out: XLA:CPU flushes them (docs/upstream_tests.md)
_PARTS = (0.0, -0.0, 0.5, -1.0, 1.0, 2.0, -3.0, 1e4, -1e30, INF, -INF, NAN)


def _same(actual, expected, zero_signs=True):
    """Equal up to rounding, NaNs in the same places, and the sign of every zero the same."""
    if expected.is_complex():
        actual, expected = torch.view_as_real(actual), torch.view_as_real(expected)
    assert torch.equal(actual.isnan(), expected.isnan())
    zeros = expected == 0
    if zero_signs:
        assert torch.equal(actual[zeros].signbit(), expected[zeros].signbit())
    tiny = torch.finfo(actual.dtype).tiny  # (a subnormal result is 0 on XLA:CPU)
    assert_close(actual, expected, equal_nan=True, rtol=2e-6 if actual.dtype == torch.float32 else 1e-10, atol=tiny)


def _grid(dtype):
    return torch.tensor([complex(p, q) for p in _PARTS for q in _PARTS], dtype=dtype)


_UNARY_C = (torch.asin, torch.acos, torch.atan, torch.asinh, torch.acosh, torch.atanh, torch.sqrt, torch.exp, torch.log)
_UNARY_C += (torch.exp2, torch.rsqrt, torch.sigmoid)


@pytest.mark.parametrize("dtype", [torch.complex64, pytest.param(torch.complex128, marks=pytest.mark.slow)])
@pytest.mark.parametrize("fn", _UNARY_C)
def test_complex_branch_cuts_and_special_values_as_on_the_cpu(fn, dtype):
    # C99's functions (the CPU's glibc): the sign of a zero part picks the side of a branch cut (acos(2 - 0j)
    # is +1.317j, XLA's -1.317j); infinities and NaNs have C99's values (asin(0 + nanj) = 0 + nanj); rsqrt
    # and sigmoid divide as c10::complex (1 / (inf + inf j) is NaN); exp2 scales each part by log 2
    z = torch.cat([_grid(dtype), torch.randn(64, dtype=dtype) * 3])
    # the CPU's complex128 acos is pi/2 - asin(z) (its vectorized loop): +0j on the real axis where C99
    # (and its complex64 loop) has -0j; tpu follows C99
    _same(fn(z.to(DEV)).cpu(), fn(z), zero_signs=not (fn is torch.acos and dtype == torch.complex128))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_abs_is_inf_where_a_part_is(dtype):
    z = torch.cat([_grid(dtype), torch.randn(16, dtype=dtype)])
    _same(z.to(DEV).abs().cpu(), z.abs())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_sign_softshrink_and_spherical_bessel_at_special_values(dtype):
    # sign/sgn of NaN and -0 are +0 on the CPU ((0 < a) - (a < 0)); softshrink keeps NaN (its dead zone's
    # zero is -0 or +0 by the CPU's loop, scalar or vectorized: compared as a + 0); spherical_bessel_j0(+-inf) = 0
    x = torch.cat([torch.tensor([0.0, -0.0, NAN, -NAN, INF, -INF, 0.3, -0.3, 0.5, -0.5]), torch.randn(30) * 4])
    x = x.to(dtype)
    shrink = torch.nn.functional.softshrink
    fns = [torch.sign, torch.sgn, lambda t: shrink(t) + 0, lambda t: shrink(t, 1.5) + 0]
    if dtype in (torch.float32, torch.float64):
        fns.append(torch.special.spherical_bessel_j0)
    for fn in fns:
        _same(fn(x.to(DEV)).cpu().double(), fn(x).double())


@pytest.mark.parametrize("fn", [torch.igamma, torch.igammac])
def test_igamma_edge_cases_as_on_the_cpu(fn):
    a = torch.tensor([0.0, 1e-3, 1.0, INF, 0.0, -1e-3, -1.0, -INF, INF, NAN, 2.0, 0.0, 3.0])
    x = torch.tensor([1e-3, 0.0, 0.0, 1.0, 0.0, 1e-3, 1.0, INF, INF, 1.0, NAN, INF, INF])
    a = torch.cat([a, torch.rand(20) * 5]).double()
    x = torch.cat([x, torch.rand(20) * 5]).double()
    actual, expected = fn(a.to(DEV), x.to(DEV)).cpu(), fn(a, x)
    assert torch.equal(actual.isnan(), expected.isnan())
    assert_close(actual, expected, equal_nan=True)


def test_out_errors_in_the_cpus_words():
    x = torch.tensor([INF, -INF, 1.2], device=DEV)
    for op in (torch.isposinf, torch.isneginf):
        with pytest.raises(RuntimeError, match="does not support non-boolean outputs"):
            op(x, out=torch.empty(3, device=DEV))
    with pytest.raises(RuntimeError, match=r"expects mantissa to have dtype float but got double"):
        torch.frexp(
            x, out=(torch.empty(3, device=DEV, dtype=torch.float64), torch.empty(3, device=DEV, dtype=torch.int))
        )
    with pytest.raises(RuntimeError, match=r"expects exponent to have int dtype but got long int"):
        torch.frexp(x, out=(torch.empty(3, device=DEV), torch.empty(3, device=DEV, dtype=torch.long)))


@pytest.mark.parametrize("fn", [torch.abs, torch.angle])
def test_abs_angle_of_complex_into_complex_or_wider_out(fn):
    # the CPU writes a complex input's abs/angle into a complex `out` (zero imaginary part) or any float
    # `out`; PyTorch's meta function refused all but the real dtype (and angle wrote an int `out`)
    t = torch.randn(7, dtype=torch.complex64)
    for dtype in (torch.complex64, torch.float64, torch.bfloat16):
        out, expected = torch.empty(0, dtype=dtype, device=DEV), torch.empty(0, dtype=dtype)
        assert_close(fn(t.to(DEV), out=out).cpu(), fn(t, out=expected))
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Int"):
        fn(t.to(DEV), out=torch.empty(7, dtype=torch.int32, device=DEV))
    if fn is torch.abs:
        with pytest.raises(RuntimeError, match="In-place abs is not supported for complex tensors"):
            t.to(DEV).abs_()


@pytest.mark.parametrize("fn", [torch.igamma, torch.igammac])
def test_float32_igamma_near_a_equals_x_as_precise_as_the_cpu(fn):
    # JAX's float32 series were 1.5e-5 off near a = x ~ 50 (test_igamma_common: atol 1e-5, rtol 1.3e-6)
    a = torch.rand(200) * 60 + 1
    x = a * (1 + (torch.rand(200) - 0.5) * 0.2)
    assert_close(fn(a.to(DEV), x.to(DEV)).cpu(), fn(a, x), atol=2e-6, rtol=1.3e-6)


def test_inplace_activation_backward_with_a_negative_slope_refused():
    # test_nn's test_{elu,leaky_relu}_inplace_with_neg_*: the CPU's backward from the saved result cannot
    # invert a negative slope and refuses on the host; tpu computed a gradient
    fns = (
        lambda a: torch.nn.functional.elu_(a, alpha=-2),
        lambda a: torch.nn.functional.celu_(a, alpha=-2),
        lambda a: torch.nn.functional.leaky_relu_(a, -2),
        lambda a: torch.nn.functional.rrelu_(a, -5.0, 1.0),  # rrelu_with_noise_ was not lowered
    )
    for fn in fns:
        a = torch.tensor([-1.0, 1.0], device=DEV, requires_grad=True)
        with pytest.raises(RuntimeError, match="call out-of-place version"):
            fn(a.clone()).backward(torch.ones(2, device=DEV))
    a = torch.tensor([-1.0, 1.0], device=DEV, requires_grad=True)
    torch.nn.functional.leaky_relu_(a.clone(), 0.5).backward(torch.ones(2, device=DEV))
    assert_close(a.grad.cpu(), torch.tensor([0.5, 1.0]))


@pytest.mark.parametrize("training", [False, True])
def test_rrelu_inplace_as_the_cpu(training):
    x = torch.randn(64)
    cpu = x.clone().requires_grad_()
    tpu = x.to(DEV).requires_grad_()
    out_cpu = torch.nn.functional.rrelu_(cpu.clone(), 0.1, 0.3, training=training)
    y = tpu.clone()
    out = torch.nn.functional.rrelu_(y, 0.1, 0.3, training=training)
    assert out is y
    out.sum().backward()
    out_cpu.sum().backward()
    slope = (out.detach().cpu() / x)[x < 0]  # drawn in [lower, upper] in training, their mean else
    assert_close(out.detach().cpu()[x >= 0], x[x >= 0])
    assert ((slope >= 0.1) & (slope <= 0.3)).all() if training else torch.allclose(slope, torch.tensor(0.2))
    assert_close(tpu.grad.cpu(), out.detach().cpu() / x)  # the noise the forward drew
    if not training:
        assert_close(tpu.grad.cpu(), cpu.grad)


@pytest.mark.parametrize("mode,antialias", [("bilinear", False), ("bilinear", True), ("bicubic", False)])
def test_uint8_image_resize_rounds_each_pass_as_the_cpu(mode, antialias):
    """test_nn's test_upsamplingBiLinear2d_consistency: a uint8 image resized is its float resize rounded
    (the CPU's fixed-point kernel stores each pass rounded and saturated); tpu truncated (mean error 0.5)."""
    torch.manual_seed(0)
    x = torch.randint(0, 256, (1, 3, 40, 40), dtype=torch.uint8)
    for size in (17, 61):
        kw = dict(size=(size, size), mode=mode, antialias=antialias, align_corners=False)
        cpu = torch.nn.functional.interpolate(x, **kw).int()
        tpu = torch.nn.functional.interpolate(x.to("tpu"), **kw).cpu()
        assert tpu.dtype == torch.uint8
        assert (tpu.int() - cpu).abs().max() <= 1
        if mode == "bilinear":  # (a cubic's passes saturate in between, the CPU's as well)
            exact = torch.nn.functional.interpolate(x.float(), **kw).round()
            assert (tpu.float() - exact).abs().mean() < 0.3


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.bool])
def test_integer_resize_without_a_cpu_loop_raises_as_the_cpu(dtype):
    x = torch.zeros(1, 2, 6, 6, dtype=dtype)
    with pytest.raises(NotImplementedError):
        torch.nn.functional.interpolate(x, size=(4, 4), mode="bilinear")
    with pytest.raises(NotImplementedError, match="not implemented for"):
        torch.nn.functional.interpolate(x.to("tpu"), size=(4, 4), mode="bilinear")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_softshrink_lambda_out_of_range_in_the_cpus_words(dtype):
    messages = []
    for device in ("cpu", "tpu"):
        with pytest.raises(RuntimeError) as error:
            torch.nn.functional.softshrink(torch.randn(3, device=device, dtype=dtype), -0.5)
        messages.append(str(error.value))
    assert messages[0] == messages[1]
