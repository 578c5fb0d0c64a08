"""Regressions found by PyTorch's test_tensor_creation_ops.py and test_shape_ops.py on "tpu" (issue 47):
factories and shape ops, compared against the CPU on the same inputs."""

import warnings

import pytest
import torch
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
