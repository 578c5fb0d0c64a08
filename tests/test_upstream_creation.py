"""Regressions found by PyTorch's test_tensor_creation_ops.py and test_shape_ops.py on "tpu" (issue 47):
factories and shape ops, compared against the CPU on the same inputs."""

import warnings

import pytest
import torch
from error_parity import same_error
from torch.testing import assert_close

DEV = "tpu"


def _out_warnings(factory, device, shape):
    out = torch.zeros(shape, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        factory(out)
    messages = [(w.category, str(w.message).split(" (Triggered")[0]) for w in caught]
    return out, messages, [w.filename for w in caught]


@pytest.mark.parametrize(
    "factory",
    [
        lambda out: torch.arange(-1, 1, 2.0 / 49, dtype=torch.float32, out=out),  # 50 values by rounding
        lambda out: torch.arange(5, out=out),
        lambda out: torch.linspace(0, 1, 5, out=out),
        lambda out: torch.logspace(0, 1, 5, out=out),
    ],
)
@pytest.mark.parametrize("shape", [(1, 49), (0,)])
def test_factory_out_resize_warns_as_on_the_cpu(factory, shape):
    # arange warns when it resizes a non-empty `out`; linspace and logspace resize it silently
    cpu_out, cpu_messages, _ = _out_warnings(factory, "cpu", shape)
    for _ in range(2):
        tpu_out, tpu_messages, files = _out_warnings(factory, DEV, shape)
        assert tpu_messages == cpu_messages
        assert all(f == __file__ for f in files)  # attributed to the caller, as PyTorch's C++ warnings
        assert_close(tpu_out.cpu(), cpu_out)


_FLOAT32_MAX = torch.finfo(torch.float32).max
_OUT_OF_RANGE = [-_FLOAT32_MAX, -2, -1.5, -0.5, 0, 0.5, 1.5, 2, _FLOAT32_MAX, float("inf"), float("-inf")]
_OUT_OF_RANGE += [float("nan"), 3e9, -3e9, 1e19, 2.0**63, 2.0**31, -(2.0**31), 70000.0, -129.7, 300.5]


@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "target", [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64], ids=str
)
def test_float_to_integer_conversion_out_of_range_matches_the_cpu(source, target):
    # out of the integer type's range the CPU gives x86's value (the most negative int32/int64, the
    # low bits of it for 8/16 bits), where XLA saturates
    values = torch.tensor(_OUT_OF_RANGE, dtype=source)
    expected = values.to(target)
    for _ in range(2):
        on_device = values.to(DEV)
        assert torch.equal(on_device.to(target).cpu(), expected)
        out = torch.empty(len(_OUT_OF_RANGE), dtype=target, device=DEV)
        assert torch.equal(out.copy_(on_device).cpu(), expected)


@pytest.mark.parametrize("factory", [torch.linspace, torch.logspace], ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "ends", [(0, 1j), (0j, 1), (torch.tensor(1j), 2)], ids=["real-complex", "complex-real", "tensor"]
)
def test_complex_ends_with_a_real_dtype_raise_the_cpus_error(factory, ends):
    same_error(lambda device: factory(*ends, 5, device=device, dtype=torch.float32))


def _sliced_with_size_one_dims(device):
    sliced = torch.randn(4, 3, 2, device=device)[:, :, ::2]  # (4, 3, 1), strides (6, 2, 2)
    gapped = torch.empty_strided((4, 3, 2), (4, 2, 1), device=device)[:, :, ::2]
    return [sliced.permute(0, 2, 1), gapped.permute(2, 0, 1)]


@pytest.mark.parametrize(
    "like",
    [torch.empty_like, torch.zeros_like, lambda t: torch.full_like(t, 7), torch.randn_like],
    ids=["empty", "zeros", "full", "randn"],
)
def test_like_factories_keep_the_cpus_strides_of_size_one_dims(like):
    # a dense layout whose size-1 dims have other strides than the contiguous ones: PyTorch keeps them
    for cpu, tpu in zip(_sliced_with_size_one_dims("cpu"), _sliced_with_size_one_dims(DEV)):
        assert like(tpu).stride() == like(cpu).stride()
    assert torch.empty_strided((4, 1, 3), (3, 1, 1), device=DEV).stride() == (3, 1, 1)


def _random_bound_warnings(device, dtype, low, high):
    t = torch.empty(8, dtype=dtype, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t.random_(low, high)
    return [(w.category, str(w.message).split(" (Triggered")[0]) for w in caught]


_MANTISSA_BITS = {torch.float32: 24, torch.bfloat16: 8, torch.float16: 11, torch.float64: 53}


@pytest.mark.parametrize("dtype", list(_MANTISSA_BITS), ids=str)
@pytest.mark.parametrize("side", ["to", "from", "both"])
def test_random_bounds_beyond_a_floats_precision_warn_on_every_call(dtype, side):
    beyond = 2 ** _MANTISSA_BITS[dtype] + 10
    bounds = {"to": (-42, beyond), "from": (-beyond, 0), "both": (-beyond, beyond)}[side]
    expected = _random_bound_warnings("cpu", dtype, *bounds)
    assert expected
    for _ in range(3):  # the cached executable's calls warn too
        assert _random_bound_warnings(DEV, dtype, *bounds) == expected


def test_range_out_into_a_non_contiguous_view():
    def run(device):
        x = torch.zeros(2, 3, device=device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (torch.range is deprecated)
            torch.range(0, 3, out=x.narrow(1, 1, 2))
            square = torch.ones(2, 2, device=device, dtype=torch.int64)
            torch.range(1, 7, 2, out=square)
        return x, square

    expected = run("cpu")
    for _ in range(2):
        for got, want in zip(run(DEV), expected):
            assert_close(got.cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize(
    "make",
    [
        lambda device: torch.empty_strided((1,), (), device=device),
        lambda device: torch.empty_strided((1, 2), (1,), device=device),
        lambda device: torch.zeros(5, 5, device=device).new_empty_strided((2,), ()),
    ],
)
def test_empty_strided_with_mismatched_lengths_raises_the_cpus_error(make):
    same_error(make)


@pytest.mark.parametrize(
    "shifts, dims", [((1,), (1, 2)), ((1, 2), (1,)), ((1, 2), ()), ((), ()), ((1, 2), (0, 5))], ids=str
)
def test_roll_argument_errors_are_the_cpus(shifts, dims):
    same_error(lambda device: torch.arange(8, device=device).view(2, 4).roll(shifts, dims))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.int64, torch.complex64], ids=str)
def test_element_reads_of_views_match_the_cpu(dtype):
    # a few elements of a small storage are read from its host copy (a loop like `all(mask)`)
    base = torch.randn(5, 6, 4, generator=torch.Generator().manual_seed(0)).to(dtype)
    device_base = base.to(DEV)
    for view in (lambda t: t.permute(2, 0, 1), lambda t: t[1:, ::2, 3], lambda t: t.transpose(0, 2)[2]):
        cpu_view, tpu_view = view(base), view(device_base)
        assert [v.item() for v in tpu_view.reshape(-1)[:7]] == [v.item() for v in cpu_view.reshape(-1)[:7]]
        assert torch.equal(tpu_view[1, :2].cpu(), cpu_view[1, :2])
        # lazily conjugated views: their values are not the stored ones
        assert torch.equal(tpu_view.conj()[1, :2].cpu(), cpu_view.conj()[1, :2].resolve_conj())
        corner = (1,) * tpu_view.dim()
        assert tpu_view.conj()[corner].item() == cpu_view.conj()[corner].item()
    device_base[1, 2, 3] = base[0, 0, 0]  # a write replaces the buffer: the next read sees it
    assert device_base[1, 2, 3].item() == base[0, 0, 0].item()
    assert all(device_base[0, 1]) == all(base[0, 1])


def _parts(device, dtype, other=None):
    return torch.tensor([1, 2], device=device, dtype=dtype), torch.tensor([3, 4], device=device, dtype=other or dtype)


@pytest.mark.parametrize("op", [torch.complex, torch.polar], ids=lambda op: op.__name__)
@pytest.mark.parametrize(
    "call",
    [
        lambda op, device: op(*_parts(device, torch.int64)),
        lambda op, device: op(*_parts(device, torch.bool)),
        lambda op, device: op(*_parts(device, torch.complex64)),
        lambda op, device: op(*_parts(device, torch.float32, torch.float64)),
        lambda op, device: op(*_parts(device, torch.float32), out=torch.zeros(2, device=device)),
        lambda op, device: op(*_parts(device, torch.float64), out=torch.zeros(2, device=device, dtype=torch.complex64)),
    ],
)
def test_complex_and_polar_argument_errors_are_the_cpus(op, call):
    same_error(lambda device: call(op, device))


@pytest.mark.parametrize("op", [torch.complex, torch.polar], ids=lambda op: op.__name__)
def test_complex_and_polar_still_compute(op):
    expected = op(*_parts("cpu", torch.float64), out=torch.empty(2, dtype=torch.complex128))
    got = op(*_parts(DEV, torch.float64), out=torch.empty(2, dtype=torch.complex128, device=DEV))
    assert_close(got.cpu(), expected)
    assert_close(op(*_parts(DEV, torch.float32)).cpu(), op(*_parts("cpu", torch.float32)))


@pytest.mark.parametrize(
    "call",
    [
        lambda device: torch.normal(0, -1, (10,), device=device),
        lambda device: torch.normal(torch.zeros((), device=device), -1.5),
        lambda device: torch.empty(3, device=device).normal_(0, -1e-7),
        lambda device: torch.normal(torch.zeros((), device=device), torch.tensor(-1.0, device=device)),
        lambda device: torch.normal(2.0, torch.tensor([1.0, float("nan")], device=device)),
        lambda device: torch.normal(torch.zeros(3, device=device), torch.tensor([1.0, -1.0, 1.0], device=device)),
    ],
)
def test_normal_with_a_negative_std_raises_at_the_op(call):
    torch.empty(3, device=DEV).normal_(0, 1)  # a cached executable for a valid std must still check
    same_error(call)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bounds", [(5, 1), (-3e38, 3e38), (-1e308, 1e308), (-40000, 40000), (-1e39, 0), (0, 1e39)])
def test_uniform_bounds_errors_are_the_cpus(dtype, bounds):
    def call(device):
        return torch.empty(4, dtype=dtype, device=device).uniform_(*bounds)

    try:
        call("cpu")
    except RuntimeError:
        same_error(call)
    else:
        assert call(DEV).shape == (4,)


@pytest.mark.parametrize(
    "dtype, n", [(torch.uint8, 2**8 + 1), (torch.half, 2**11 + 2), (torch.float, 2**24 + 2), (torch.double, 2**53 + 2)]
)
def test_randperm_too_large_for_the_out_dtype_raises_the_cpus_error(dtype, n):
    same_error(lambda device: torch.randperm(n, out=torch.empty(0, dtype=dtype, device=device)))
    largest = n - 1 if dtype in (torch.uint8, torch.half) else 5
    assert torch.randperm(largest, out=torch.empty(0, dtype=dtype, device=DEV)).numel() == largest


@pytest.mark.parametrize(
    "call",
    [
        lambda device: torch.arange(1.175494351e-38, 3.402823466e38, device=device),
        lambda device: torch.arange(1.175494351e-38, 3.402823466e38, out=torch.empty(3, device=device)),
        lambda device: torch.arange(0, float("inf"), device=device),
    ],
)
def test_arange_of_an_overflowing_length_raises_the_cpus_error(call):
    same_error(call)


@pytest.mark.parametrize("dtype", [torch.long, torch.float, torch.double, torch.uint8])
def test_randperm_is_a_uniform_permutation(dtype):
    # test_randperm ran over its limit on 2^24+1 and 2^25 elements: randperm now sorts packed words
    # (random high bits, the position below) twice; check what that must keep
    for n in (1, 2, 7, 256) if dtype == torch.uint8 else (1, 2, 7, 255, 4097):
        p = torch.randperm(n, dtype=dtype, device=DEV)
        assert p.dtype == dtype and p.device.type == DEV
        assert_close(p.cpu().long().sort().values, torch.arange(n))
    with torch.random.fork_rng(devices=[DEV]):
        first = torch.randperm(100, dtype=dtype, device=DEV)
    out = torch.empty(0, dtype=dtype, device=DEV)
    assert_close(torch.randperm(100, out=out, dtype=dtype, device=DEV).cpu(), first.cpu())
    strided = torch.zeros(2, 3, dtype=dtype, device=DEV).t()
    torch.randperm(6, out=strided)
    assert_close(strided.cpu().reshape(-1).long().sort().values, torch.arange(6))


def test_randperm_draws_every_order_about_equally_often():
    # of the 6 orders of 3 elements (1200 draws: 200 each, sd 13)
    draws = torch.stack([torch.randperm(3, device=DEV) for _ in range(1200)]).cpu()
    counts = torch.unique(draws, dim=0, return_counts=True)[1]
    assert counts.numel() == 6 and int(counts.min()) > 140 and int(counts.max()) < 260
