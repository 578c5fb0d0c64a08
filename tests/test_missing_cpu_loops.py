"""Where the CPU kernel has no loop for a dtype (uint16/32/64, bool), tpu raises its NotImplementedError
instead of computing (`no_loop_for=` / `loops_for=` of the lowerings, ops/table.py); the ops the CPU
does have loops for keep computing the CPU's values (issue 47)."""

from __future__ import annotations

import re

import pytest
import torch

import torchtpu  # noqa: F401

U16, U32, U64 = torch.uint16, torch.uint32, torch.uint64
I64, C64, F32 = torch.int64, torch.complex64, torch.float32
F = torch.nn.functional


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
    # float-only CPU kernels (NOT_FLOATING): integers too
    "gelu int64": lambda d: F.gelu(_t(d, I64)),
    "leaky_relu int32": lambda d: F.leaky_relu(_t(d, torch.int32)),
    "elu int8": lambda d: F.elu(_t(d, torch.int8)),
    "softplus uint8": lambda d: F.softplus(_t(d, torch.uint8)),
    "logsigmoid int64": lambda d: F.logsigmoid(_t(d, I64)),
    "sigmoid_backward int16": lambda d: torch.ops.aten.sigmoid_backward(_t(d, torch.int16), _t(d, torch.int16)),
    "frac int32": lambda d: torch.frac(_t(d, torch.int32)),
    "round decimals int64": lambda d: torch.round(_t(d, I64), decimals=1),
    "hypot int64": lambda d: torch.hypot(_t(d, I64), _t(d, I64)),
    "hypot complex64": lambda d: torch.hypot(_t(d, C64), _t(d, C64)),
    "logaddexp int64": lambda d: torch.logaddexp(_t(d, I64), _t(d, I64)),
    "lerp bool": lambda d: torch.lerp(_t(d, torch.bool), _t(d, torch.bool), 0.5),
    "lerp_ int32": lambda d: _t(d, torch.int32).lerp_(_t(d, torch.int32), 0.5),
    "mse_loss int64": lambda d: F.mse_loss(_t(d, I64), _t(d, I64)),
    "huber_loss uint8": lambda d: F.huber_loss(_t(d, torch.uint8), _t(d, torch.uint8)),
    "nll_loss int64": lambda d: F.nll_loss(_t(d, I64, (2, 3)), torch.tensor([0, 2], device=d)),
    "bce int64": lambda d: F.binary_cross_entropy(_t(d, I64) * 0, _t(d, I64) * 0),
    "multi_margin float16": lambda d: F.multi_margin_loss(_t(d, torch.float16, (2, 3)), torch.tensor([0, 2], device=d)),
    "soft_margin int64": lambda d: F.soft_margin_loss(_t(d, I64), _t(d, I64)),
    "soft_margin u32": lambda d: F.soft_margin_loss(_t(d, U32), _t(d, U32)),
    "histc bool": lambda d: torch.histc(_t(d, torch.bool), 4),
    "histogram float16": lambda d: torch.histogram(_t(d, torch.float16), 4),
    "segment_reduce int64": lambda d: torch.segment_reduce(_t(d, I64), "sum", lengths=torch.tensor([2, 3], device=d)),
    "max_unpool2d int64": lambda d: F.max_unpool2d(_t(d, I64, (1, 1, 1, 1)), _t(d, I64, (1, 1, 1, 1)) * 0, 2),
    "adaptive_max_pool2d int64": lambda d: F.adaptive_max_pool2d(_t(d, I64, (1, 2, 2)), 1),
    "avg_pool2d int8": lambda d: F.avg_pool2d(_t(d, torch.int8, (1, 2, 2)), 2),
    "avg_pool3d float16": lambda d: F.avg_pool3d(_t(d, torch.float16, (1, 2, 2, 2)), 2),
    "max_pool2d bool": lambda d: F.max_pool2d(_t(d, torch.bool, (1, 2, 2)), 2),
    "unfold int32": lambda d: F.unfold(_t(d, torch.int32, (1, 1, 3, 3)), 2),
    "conv_transpose2d int32": lambda d: F.conv_transpose2d(
        _t(d, torch.int32, (1, 1, 2, 2)), _t(d, torch.int32, (1, 1, 2, 2))
    ),
    "cdist float16": lambda d: torch.cdist(_t(d, torch.float16, (1, 2, 2)), _t(d, torch.float16, (1, 2, 2))),
    # the dtype a factory makes (its dtype= or out=)
    "arange u32": lambda d: torch.arange(3, dtype=U32, device=d),
    "arange bool": lambda d: torch.arange(3, dtype=torch.bool, device=d),
    "linspace bool": lambda d: torch.linspace(0, 1, 3, dtype=torch.bool, device=d),
    "logspace out u32": lambda d: torch.logspace(0, 1, 3, out=torch.empty(3, dtype=U32, device=d)),
    "eye u32": lambda d: torch.eye(3, dtype=U32, device=d),
    "randperm bool": lambda d: torch.randperm(3, dtype=torch.bool, device=d),
    "randn int64": lambda d: torch.randn(3, dtype=I64, device=d),
    "normal_ int32": lambda d: _t(d, torch.int32).normal_(),
    "log_normal_ complex64": lambda d: _t(d, C64).log_normal_(),
    "geometric_ bool": lambda d: _t(d, torch.bool).geometric_(0.5),
    "bernoulli int64": lambda d: torch.bernoulli(_t(d, I64) * 0),
    "bernoulli_ u32": lambda d: _t(d, U32).bernoulli_(0.5),
    # checks that depend on more than one dtype (meta_check) and ops without a lowering before
    "clamp bool tensors": lambda d: _t(d, torch.bool).clamp(_t(d, torch.bool), _t(d, torch.bool)),
    "div trunc u32": lambda d: torch.div(_t(d, U32), 2, rounding_mode="trunc"),
    "div floor bool": lambda d: torch.div(_t(d, torch.bool), _t(d, torch.bool), rounding_mode="floor"),
    "div floor complex64": lambda d: torch.div(_t(d, C64), _t(d, C64), rounding_mode="floor"),
    "floor_divide bool": lambda d: _t(d, torch.bool) // _t(d, torch.bool),
    "searchsorted bool": lambda d: torch.searchsorted(_t(d, torch.bool).sort().values, _t(d, torch.bool)),
    "bucketize u32": lambda d: torch.bucketize(_t(d, U32), _t(d, U32).sort().values),
    "scatter_reduce mean bool": lambda d: _t(d, torch.bool).scatter_reduce(
        0, torch.tensor([0, 1], device=d), _t(d, torch.bool)[:2], "mean"
    ),
    "reflection_pad bool": lambda d: F.pad(_t(d, torch.bool, (1, 1, 5)), (2, 2), mode="reflect"),
    "replication_pad u32": lambda d: F.pad(_t(d, U32, (1, 1, 5)), (2, 2), mode="replicate"),
    "pixel_shuffle u32": lambda d: F.pixel_shuffle(_t(d, U32, (1, 4, 2, 2)), 2),
    "trace bool": lambda d: _t(d, torch.bool, (3, 3)).trace(),
    "trace u32": lambda d: _t(d, U32, (3, 3)).trace(),
    "cross bool": lambda d: torch.linalg.cross(_t(d, torch.bool, (2, 3)), _t(d, torch.bool, (2, 3))),
    "cross u32": lambda d: torch.linalg.cross(_t(d, U32, (2, 3)), _t(d, U32, (2, 3))),
    "nonzero u32": lambda d: _t(d, U32).nonzero(),
    "masked_select u32": lambda d: _t(d, U32).masked_select(_t(d, torch.bool)),
    "count_nonzero u32": lambda d: _t(d, U32).count_nonzero(),
    "hash_tensor u32": lambda d: torch.hash_tensor(_t(d, U32)),
    # tenth session: nearest resampling of integers but uint8 (CUDA's kernels neither), reductions into a
    # wide unsigned dtype (the CPU's and CUDA's sum/prod dispatch on the result dtype)
    "nearest int32": lambda d: F.interpolate(_t(d, torch.int32, (1, 2, 3, 3)), scale_factor=2),
    "nearest int64 1d": lambda d: F.interpolate(_t(d, I64, (1, 2, 3)), scale_factor=2),
    "nearest-exact int16 3d": lambda d: F.interpolate(
        _t(d, torch.int16, (1, 1, 2, 2, 2)), scale_factor=2, mode="nearest-exact"
    ),
    "sum dtype u32": lambda d: torch.sum(_t(d, F32), dtype=U32),
    "sum dim dtype u64": lambda d: torch.sum(_t(d, torch.int32, (2, 3)), 0, dtype=U64),
    "sum out u16": lambda d: torch.sum(_t(d, F32, (2, 3)), 0, out=torch.empty(3, dtype=U16, device=d)),
    "nansum dtype u32": lambda d: torch.nansum(_t(d, F32), dtype=U32),
    "prod dtype u32": lambda d: torch.prod(_t(d, F32), dtype=U32),
    "prod out u32": lambda d: torch.prod(_t(d, F32, (2, 3)), 0, out=torch.empty(3, dtype=U32, device=d)),
    "prod dim dtype u16": lambda d: torch.prod(_t(d, F32, (2, 3)), 1, dtype=U16),
    "cumsum dtype u32": lambda d: torch.cumsum(_t(d, F32), 0, dtype=U32),
    "cumsum_ u64": lambda d: _t(d, U64).cumsum_(0),
    "cumprod dtype u32": lambda d: torch.cumprod(_t(d, F32), 0, dtype=U32),
    # RuntimeErrors in the CPU's own words
    "native_dropout_backward u32": lambda d: torch.ops.aten.native_dropout_backward(_t(d, U32), _t(d, torch.bool), 2.0),
    "sort complex64": lambda d: _t(d, C64).sort(),
    "topk bool": lambda d: _t(d, torch.bool).topk(2),
    "topk complex64": lambda d: _t(d, C64).topk(2),
    "nansum complex64": lambda d: _t(d, C64).nansum(),
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
    "cumsum u32": lambda d: _t(d, U32).cumsum(0),
    "prod dim u16": lambda d: _t(d, U16, (2, 3)).prod(1),
    "sum dtype int64 of u32": lambda d: torch.sum(_t(d, U32), dtype=I64),
    "interpolate uint8 3d": lambda d: F.interpolate(_t(d, torch.uint8, (1, 1, 2, 2, 2)), scale_factor=2),
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
    # where the CPU's check depends on more than the dtype, the other side computes
    "clamp bool min tensor": lambda d: _t(d, torch.bool).clamp(min=_t(d, torch.bool)),
    "div floor bool scalar": lambda d: torch.div(_t(d, torch.bool), 2, rounding_mode="floor"),
    "div trunc u32 float": lambda d: torch.div(_t(d, U32), _t(d, torch.float32), rounding_mode="trunc"),
    "round int64": lambda d: torch.round(_t(d, I64)),
    "lerp float16": lambda d: torch.lerp(_t(d, torch.float16), _t(d, torch.float16) * 3, 0.3),
    "lerp weight tensor": lambda d: torch.lerp(_t(d, F32), _t(d, F32) * 3, _t(d, F32) / 7),
    "avg_pool2d int64": lambda d: F.avg_pool2d(_t(d, I64, (1, 2, 2)), 2),
    "unfold bool": lambda d: F.unfold(_t(d, torch.bool, (1, 1, 3, 3)), 2),
    "scatter_reduce sum bool": lambda d: _t(d, torch.bool).scatter_reduce(
        0, torch.tensor([0, 1], device=d), _t(d, torch.bool)[:2], "sum"
    ),
    "bucketize float in u32": lambda d: torch.bucketize(_t(d, torch.float32), _t(d, U32).sort().values),
    "trace int8": lambda d: _t(d, torch.int8, (3, 4)).trace(),
    "cross int64": lambda d: torch.linalg.cross(_t(d, I64, (2, 3)), _t(d, I64, (1, 3)) + 2),
    "histc float16": lambda d: torch.histc(_t(d, torch.float16), 4),
    "bernoulli_ int64 zero": lambda d: _t(d, I64).bernoulli_(0.0),
    # the CPU returns before its dtype dispatch: a ramp of fewer than two steps, an empty search or fill
    "linspace one step bool": lambda d: torch.linspace(0, 1, 1, dtype=torch.bool, device=d),
    "searchsorted empty u32": lambda d: torch.searchsorted(_t(d, U32), _t(d, U32)[:0]),
    "bernoulli_ empty u32": lambda d: _t(d, U32)[:0].bernoulli_(0.5),
}


@pytest.mark.parametrize("name", sorted(COMPUTED))
def test_ops_with_cpu_loops_still_compute(name):
    fn = COMPUTED[name]
    torch.testing.assert_close(fn("tpu").cpu(), fn("cpu"))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_of_integers_computes_as_on_cuda(dtype):
    # the CPU has no integer histc loop, CUDA has one, and Transformers' MoE counts experts with
    # `torch.histc(expert_ids.int(), ...)` on every device but the CPU: tpu computes, as CUDA does
    ids = torch.randint(0, 8, (64,))
    expected = torch.histc(ids.float(), bins=8, min=0, max=7).to(dtype)
    assert torch.equal(torch.histc(ids.to(dtype).to("tpu"), bins=8, min=0, max=7).cpu(), expected)


def test_unsigned_promotion_error_as_on_the_cpu():
    def fn(d):
        return _t(d, U32) + _t(d, torch.int64)

    with pytest.raises(RuntimeError) as cpu:
        fn("cpu")
    with pytest.raises(RuntimeError) as tpu:
        fn("tpu")
    assert str(tpu.value) == str(cpu.value)
