"""Division and dtype conversions against the CPU, bit for bit, and the places where tpu takes CUDA's
rule because the CPU's and CUDA's kernels differ (ops/dtypes.py `divide`, `true_divide`, `convert`)."""

import warnings

import pytest
import torch
from torch.testing import assert_close

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
HALVES = (torch.float16, torch.bfloat16)


def _opmath(dtype):
    return torch.float32 if dtype in HALVES else dtype


def _same_bits(got, want):
    assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("divisor_shape", [(64, 1), (1, 128), (), (64, 128), "expanded"])
def test_division_by_a_tensor_is_an_ieee_division_as_on_the_cpu(dtype, divisor_shape):
    # XLA rewrote x / broadcast(y) into x * broadcast(1 / y): 15-33% of float32 quotients an ulp off
    x = torch.randn(64, 128, dtype=dtype)
    if divisor_shape == "expanded":
        y = torch.randn(64, 1, dtype=dtype).expand(64, 128)
    else:
        y = torch.randn(divisor_shape, dtype=dtype)
    xt, yt = x.to("tpu"), y.to("tpu")
    _same_bits(xt / yt, x / y)
    _same_bits(torch.true_divide(xt, yt), torch.true_divide(x, y))
    _same_bits(torch.div(xt, yt, rounding_mode=None), torch.div(x, y, rounding_mode=None))
    _same_bits(xt.clone().div_(yt), x.clone().div_(y))
    _same_bits(torch.addcdiv(xt, xt, yt), torch.addcdiv(x, x, y))


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
@pytest.mark.parametrize("rounding_mode", ["trunc", "floor"])
def test_rounding_division_of_exact_multiples_by_a_broadcast_tensor(dtype, rounding_mode):
    # a quotient that is an integer came out an ulp below it by the reciprocal: trunc took one less
    y = torch.randint(1, 50, (256, 1)).to(dtype) * torch.where(torch.rand(256, 1) < 0.5, -1, 1).to(dtype)
    x = y * torch.randint(-1000, 1000, (256, 64)).to(dtype)
    want = torch.div(x, y, rounding_mode=rounding_mode)
    _same_bits(torch.div(x.to("tpu"), y.to("tpu"), rounding_mode=rounding_mode), want)


def test_compiled_division_by_a_broadcast_tensor_is_exact():
    x, y = torch.rand(256, 512), torch.rand(256, 1) + 0.5

    def f(a, b):
        return a / b, a / a.sum(-1, keepdim=True)

    got = torch.compile(f, backend="tpu")(x.to("tpu"), y.to("tpu"))
    _same_bits(got[0], x / y)
    _same_bits(got[1], x / x.to("tpu").sum(-1, keepdim=True).cpu())  # (the sum's own order aside)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("scalar", [3.0, 0.1, -7, 1e-3])
def test_division_by_a_python_scalar_multiplies_by_its_reciprocal_as_cuda(dtype, scalar):
    # CUDA (BinaryDivTrueKernel.cu): a CPU-scalar divisor becomes a * (1 / b), 1 / b in the opmath dtype;
    # the CPU divides
    x = torch.randn(4096, dtype=dtype)
    acc = _opmath(dtype)
    inverse = torch.tensor(1, dtype=acc) / torch.tensor(scalar, dtype=acc)
    want = (x.to(acc) * inverse).to(dtype)
    _same_bits(x.to("tpu") / scalar, want)
    _same_bits(torch.div(x.to("tpu"), scalar), want)
    if dtype not in HALVES:  # (CUDA truncates the float32 product there; tpu the quotient in the half type)
        _same_bits(torch.div(x.to("tpu"), scalar, rounding_mode="trunc"), torch.trunc(x * inverse))


def _subnormal_probe(dtype):
    """Fresh random values around float32's subnormal range (bits drawn), normal ones, zeros and specials."""
    bits = torch.randint(0, 0x00900000, (512,), dtype=torch.int32)
    tiny = bits.view(torch.float32) * torch.where(torch.rand(512) < 0.5, -1.0, 1.0)
    specials = torch.tensor([0.0, -0.0, 1.0, float("inf"), -float("inf"), 2.0**-126, 2.0**-149, 1e-46, 7e-46])
    halves = torch.randn(64).double() * 1e-5  # (float16's subnormals: below 6.1e-5)
    values = torch.cat(
        [tiny.double(), torch.randn(64).double() * 1e-38, halves, torch.randn(64).double(), specials.double()]
    )
    if dtype.is_complex:
        return torch.complex(values, values.flip(0)).to(dtype)
    return values.to(dtype)


@pytest.mark.parametrize("source", (*FLOATS, torch.complex64, torch.complex128))
@pytest.mark.parametrize("target", (*FLOATS, torch.complex64, torch.complex128))
def test_conversions_keep_subnormals_as_on_the_cpu(source, target):
    # XLA:CPU runs with flush-to-zero: float64 -> float32 made 1e-40 a 0, float32 -> float64 read one as 0
    if source == target or (source.is_complex and not target.is_complex):
        return
    x = _subnormal_probe(source)
    want = x.to(target)
    got = x.to("tpu").to(target).cpu()
    if target.is_complex:
        got, want = torch.view_as_real(got), torch.view_as_real(want)
    _same_bits(got, want)
    assert torch.equal(got.signbit(), want.signbit())


def test_compiled_conversions_keep_subnormals():
    x = _subnormal_probe(torch.float64)
    got = torch.compile(lambda t: (t.float(), t.float().double()), backend="tpu")(x.to("tpu"))
    _same_bits(got[0], x.float())
    _same_bits(got[1], x.float().double())


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("op", ["add", "sub", "rsub", "add_alpha"])
def test_half_tensor_and_python_float_add_in_float32_as_cuda(dtype, op):
    # CUDA reads the scalar in float32 (PR 98820); the CPU rounds it to the half type first for add/sub
    x = torch.randn(4096).to(dtype)
    s = 1e-3
    s32 = torch.tensor(s, dtype=torch.float32)
    calls = {
        "add": (lambda t: t + s, lambda t: t + s32),
        "sub": (lambda t: t - s, lambda t: t - s32),
        "rsub": (lambda t: s - t, lambda t: s32 - t),
        "add_alpha": (lambda t: torch.add(t, s, alpha=3), lambda t: t + 3 * s32),
    }
    on_device, in_float32 = calls[op]
    _same_bits(on_device(x.to("tpu")), in_float32(x.float()).to(dtype))


def test_vmap_of_isclose_as_on_the_cpu():
    # the CPU has no batching rule for isclose either: both run functorch's per-sample fallback and warn
    p, q = torch.randn(5, 7), torch.randn(5, 7)
    q[::2] = p[::2]
    results, messages = {}, {}
    for device in ("cpu", "tpu"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results[device] = torch.vmap(lambda a, b: torch.isclose(a, b))(p.to(device), q.to(device)).cpu()
        messages[device] = sorted({str(w.message).split(".")[0] for w in caught})
    assert torch.equal(results["tpu"], results["cpu"])
    assert messages["tpu"] == messages["cpu"]


def test_a_cpu_scalar_tensor_after_a_python_number_promotes_by_its_dtype():
    # the C++ fast path keyed `x / 1.0` (a wrapped CPU double) and `x / torch.tensor(2.0, dtype=float64)`
    # alike: the second reused the first's executable, a float32 result where the CPU's is float64
    x = torch.randint(-9, 9, (5,))
    calls = [
        lambda t: t / 1.0,
        lambda t: t / torch.tensor(3.0, dtype=torch.float64),
        lambda t: t + 2.5,
        lambda t: t + torch.tensor(2.5, dtype=torch.float64),
        lambda t: t.float() * 3.0,
        lambda t: t.float() * torch.tensor(3.0, dtype=torch.float64),
    ]
    for call in calls:
        want = call(x)
        got = call(x.to("tpu"))
        assert got.dtype == want.dtype
        _same_bits(got, want)


@pytest.mark.parametrize("dtype", FLOATS)
def test_round_with_decimals_divides_as_on_the_cpu(dtype):
    # nearbyint(x * 10^d) / 10^d: XLA multiplied by the constant's reciprocal (20-57% of float32 off)
    x = (torch.randn(4096) * 100).to(dtype)
    for decimals in (1, 2, 3, -1, -2, 400):
        _same_bits(torch.round(x.to("tpu"), decimals=decimals), torch.round(x, decimals=decimals))
