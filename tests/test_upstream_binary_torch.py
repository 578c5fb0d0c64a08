"""Regressions found by PyTorch's test_binary_ufuncs.py and test_torch.py on "tpu" (issue 47),
compared against the CPU on the same inputs."""

import pytest
import torch
from error_parity import same_error
from torch.testing import assert_close

DEV = "tpu"


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int64])
def test_shifts_out_of_range_as_on_the_cpu(dtype):
    # a shift by a negative amount or by the width or more: a signed value keeps its sign, an unsigned
    # one becomes 0 (tpu shifted by the clipped amount)
    info = torch.iinfo(dtype)
    values = torch.tensor([info.min, -1 if info.min else 1, 1, info.max], dtype=dtype)
    amounts = torch.tensor([-1, info.bits, info.bits + 1, info.bits - 1], dtype=torch.int64)
    if not dtype.is_signed:
        amounts = torch.tensor([200, info.bits, info.bits + 1, info.bits - 1])
    amounts = amounts.to(dtype)
    for shift in (torch.bitwise_right_shift, torch.bitwise_left_shift):
        assert_close(shift(values.to(DEV), amounts.to(DEV)).cpu(), shift(values, amounts))
    assert_close((values.to(DEV) >> -1).cpu(), values >> -1)


@pytest.mark.parametrize("op", ["add_", "pow_", "atan2_", "mul_"])
def test_inplace_op_never_resizes_self(op):
    # PyTorch's meta kernels of pow_ and atan2_ resize `self` to the broadcast shape: the CPU raises
    same_error(lambda d: getattr(torch.ones(1, device=d), op)(torch.ones(3, device=d)))
    same_error(lambda d: getattr(torch.ones(2, 1, device=d), op)(torch.ones(1, 3, device=d)))
