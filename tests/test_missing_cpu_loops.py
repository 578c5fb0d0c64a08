"""Where the CPU kernel has no loop for a dtype (uint16/32/64, bool), tpu raises its NotImplementedError
instead of computing (`no_loop_for=` / `loops_for=` of the lowerings, ops/table.py); the ops the CPU
does have loops for keep computing the CPU's values (issue 47)."""

from __future__ import annotations

import re

import pytest
import torch

import torchtpu  # noqa: F401

U16, U32, U64 = torch.uint16, torch.uint32, torch.uint64


def _t(device, dtype, shape=(5,)):
    base = torch.arange(1, 1 + torch.Size(shape).numel()).reshape(shape) % 7
    return (base % 2).bool().to(device) if dtype == torch.bool else base.to(dtype).to(device)


# name -> fn(device): raises on the CPU ("... not implemented for '<dtype>'")
REFUSED = {
    "add u32": lambda d: _t(d, U32) + 1,
    "add_ u16": lambda d: _t(d, U16).add_(_t(d, U16)),
    "add out u64": lambda d: torch.add(_t(d, U64), 1, out=torch.empty(5, dtype=U64, device=d)),
    "sub u32": lambda d: _t(d, U32) - 1,
    "rshift u32": lambda d: _t(d, U32) >> 1,
    "lshift u16": lambda d: torch.bitwise_left_shift(_t(d, U16), 1),
    "floor_divide u32": lambda d: _t(d, U32) // 2,
    "lt u64": lambda d: _t(d, U64) < 3,
    "maximum u32": lambda d: torch.maximum(_t(d, U32), _t(d, U32)),
    "neg u32": lambda d: -_t(d, U32),
    "abs u16": lambda d: _t(d, U16).abs(),
    "max u32": lambda d: _t(d, U32).max(),
    "max.dim u32": lambda d: _t(d, U32).max(0),
    "flip u32": lambda d: _t(d, U32).flip(0),
    "flip innermost u32": lambda d: _t(d, U32, (2, 3)).flip(0, 1),
    "cummax u32": lambda d: _t(d, U32).cummax(0),
    "masked_fill u32": lambda d: _t(d, U32).masked_fill(_t(d, torch.bool), 3),
    "logical_and u32": lambda d: torch.logical_and(_t(d, U32), _t(d, U32)),
    "mm u32": lambda d: _t(d, U32, (2, 2)) @ _t(d, U32, (2, 2)),
    "index_select u32": lambda d: _t(d, U32).index_select(0, torch.tensor([0, 2], device=d)),
    "gather u64": lambda d: _t(d, U64).gather(0, torch.tensor([0, 2], device=d)),
    "tril u32": lambda d: _t(d, U32, (3, 3)).tril(),
    "amax u16": lambda d: _t(d, U16).amax(),
    "argmax u32": lambda d: _t(d, U32).argmax(),
    "conv2d bool": lambda d: torch.nn.functional.conv2d(
        _t(d, torch.bool, (1, 1, 3, 3)), _t(d, torch.bool, (1, 1, 2, 2))
    ),
    "avg_pool2d bool": lambda d: torch.nn.functional.avg_pool2d(_t(d, torch.bool, (1, 1, 4, 4)), 2),
    "grid_sample int64": lambda d: torch.nn.functional.grid_sample(
        _t(d, torch.int64, (1, 1, 3, 3)), _t(d, torch.int64, (1, 2, 2, 2)), align_corners=False
    ),
    "matmul bool": lambda d: _t(d, torch.bool, (2, 2)) @ _t(d, torch.bool, (2, 2)),
    "dot bool": lambda d: torch.dot(_t(d, torch.bool), _t(d, torch.bool)),
    "addmm bool": lambda d: torch.addmm(*(_t(d, torch.bool, (2, 2)) for _ in range(3))),
    "abs bool": lambda d: _t(d, torch.bool).abs(),
    "floor bool": lambda d: _t(d, torch.bool).floor(),
    "addcmul bool": lambda d: torch.addcmul(*(_t(d, torch.bool) for _ in range(3))),
    "pow bool": lambda d: torch.pow(_t(d, torch.bool), _t(d, torch.bool)),
    "relu bool": lambda d: torch.relu(_t(d, torch.bool)),
    "relu_ bool": lambda d: torch.relu_(_t(d, torch.bool)),
    "hardswish bool": lambda d: torch.nn.functional.hardswish(_t(d, torch.bool)),
}


def _dtype_words(message):
    """The part of the CPU's message that does not name its kernel (tpu names its own: "add_tpu")."""
    return re.sub(r'^"[^"]*"', '"<kernel>"', message)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_tpu_raises_where_the_cpu_has_no_loop(name):
    fn = REFUSED[name]
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    for _ in range(2):  # a second call must raise too (nothing cached from the first)
        with pytest.raises(type(cpu.value)) as tpu:
            fn("tpu")
        assert _dtype_words(str(tpu.value)) == _dtype_words(str(cpu.value))


# the CPU computes these: so does tpu, with its values
COMPUTED = {
    "mul u32": lambda d: _t(d, U32) * 3,
    "eq u64": lambda d: _t(d, U64) == 3,
    "ne u16": lambda d: _t(d, U16) != _t(d, U16),
    "bitwise_and u32": lambda d: _t(d, U32) & 6,
    "bitwise_xor u64": lambda d: _t(d, U64) ^ _t(d, U64),
    "floor u32": lambda d: _t(d, U32).floor(),
    "sqrt u32": lambda d: _t(d, U32).sqrt(),
    "div u16": lambda d: _t(d, U16) / 2,
    "sum u32": lambda d: _t(d, U32).sum(),
    "where u32": lambda d: torch.where(_t(d, torch.bool), _t(d, U32), 0),
    "interpolate uint8": lambda d: torch.nn.functional.interpolate(_t(d, torch.uint8, (1, 1, 2, 2)), scale_factor=2),
    "cat u64": lambda d: torch.cat([_t(d, U64), _t(d, U64)]),
    "index u32": lambda d: _t(d, U32)[1:4],
    "flip outer u32": lambda d: _t(d, U32, (2, 3)).flip(0),
    "add bool": lambda d: _t(d, torch.bool) + _t(d, torch.bool),
    "mul bool": lambda d: _t(d, torch.bool) * _t(d, torch.bool),
    "pow bool int": lambda d: torch.pow(_t(d, torch.bool), 2),
    "clamp bool": lambda d: _t(d, torch.bool).clamp(0, 1),
    "abs int64": lambda d: (-_t(d, torch.int64)).abs(),
    "add c32": lambda d: _t(d, torch.float32).to(torch.complex32) + 1,
}


@pytest.mark.parametrize("name", sorted(COMPUTED))
def test_ops_with_cpu_loops_still_compute(name):
    fn = COMPUTED[name]
    torch.testing.assert_close(fn("tpu").cpu(), fn("cpu"))


def test_unsigned_promotion_error_as_on_the_cpu():
    def fn(d):
        return _t(d, U32) + _t(d, torch.int64)

    with pytest.raises(RuntimeError) as cpu:
        fn("cpu")
    with pytest.raises(RuntimeError) as tpu:
        fn("tpu")
    assert str(tpu.value) == str(cpu.value)
