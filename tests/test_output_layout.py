"""New outputs of elementwise ops take the layout TensorIterator gives them on the CPU: the memory order
of their inputs (a permuted, transposed, channels_last input, a broadcast with one), dense, as PyTorch's
meta kernels compute it (eager/build.py _kept_strides); ops whose CPU kernels lay out otherwise say so
with their lowering (`output_layout`, ops/table.py). Values as on the CPU, on the Python kernel's first
call and on the C++ fast path's later ones."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

import torchtpu
from torchtpu.eager import fastpath

DEV = "tpu"


def _inputs():
    """name -> make(device) of a float tensor with some layout (the same values on both devices)."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 3, 5, 6, generator=g)
    return {
        "contiguous": lambda d: base.to(d),
        "permuted": lambda d: base.to(d).permute(2, 0, 3, 1),
        "transposed": lambda d: base[0, 0].to(d).t(),
        "sliced": lambda d: base.to(d)[:, :, ::2],
        "permuted_slice": lambda d: base.to(d).permute(3, 1, 0, 2)[1:],
        "expanded": lambda d: base[0, 0, 0].to(d).expand(5, 6),
        "channels_last": lambda d: base.to(d).contiguous(memory_format=torch.channels_last),
        "channels_last_3d": lambda d: base[None].to(d).contiguous(memory_format=torch.channels_last_3d),
        "size_one_dims": lambda d: base[:1, :, :1].to(d).permute(3, 2, 1, 0),
    }


def _ops():
    return {
        "exp": torch.exp,
        "neg": torch.neg,
        "relu": torch.relu,
        "sigmoid": torch.sigmoid,
        "add_contiguous": lambda x: x + torch.arange(x.numel(), dtype=x.dtype, device=x.device).reshape(x.shape),
        "add_contiguous_first": lambda x: torch.ones(x.shape, device=x.device) + x,
        "add_broadcast_row": lambda x: x + torch.linspace(0, 1, x.shape[-1], device=x.device),
        "mul_itself": lambda x: x * x,
        "lt_scalar": lambda x: x < 0.5,
        "where": lambda x: torch.where(x > 0, x, -x),
        "to_double": lambda x: x.double(),
        "pow_scalar": lambda x: x**2,
    }


@pytest.mark.parametrize("layout", list(_inputs()))
@pytest.mark.parametrize("op", list(_ops()))
def test_output_strides_and_values_match_the_cpu(op, layout):
    fn, make = _ops()[op], _inputs()[layout]
    expected = fn(make("cpu"))
    for _ in range(3):  # the first call builds the entry; later ones take the C++ fast path where it is built
        actual = fn(make(DEV))
        assert actual.shape == expected.shape and actual.stride() == expected.stride(), (
            actual.stride(),
            expected.stride(),
        )
        assert_close(actual.cpu(), expected)


def test_strict_mode_and_the_fast_path_make_the_same_layout():
    a, b = torch.randn(6, 5), torch.randn(5, 6)
    with torchtpu.eager_mode("strict"):
        ta, tb = a.to(DEV), b.to(DEV)
        if fastpath.loaded():
            before = fastpath._lib[0].torchtpu_fast_calls()
        for _ in range(4):
            got = ta.t() + tb
            assert got.stride() == (a.t() + b).stride() == (1, 5)
            assert_close(got.cpu(), a.t() + b)
        if fastpath.loaded():  # the permuted output did not send the op off the fast path
            assert fastpath._lib[0].torchtpu_fast_calls() > before
        chained = (ta.t() + tb).exp() * 2  # a permuted output read by the next op
        assert_close(chained.cpu(), (a.t() + b).exp() * 2)
        assert chained.stride() == ((a.t() + b).exp() * 2).stride()


def test_batch_norm_lays_out_as_the_cpu():
    # PyTorch's meta kernel keeps a permuted input's layout; the CPU's batch norm does not
    x = torch.randn(2, 5, 3).transpose(1, 2).contiguous().transpose(1, 2)
    for inp in (x, torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)):
        bn = torch.nn.BatchNorm1d(inp.shape[1]) if inp.dim() == 3 else torch.nn.BatchNorm2d(inp.shape[1])
        expected = bn(inp)
        actual = bn.to(DEV)(inp.to(DEV))
        assert actual.stride() == expected.stride()
        assert_close(actual.cpu(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dims", [(-1,), (1, 2), None])
def test_real_to_complex_fft_lays_out_as_the_cpu(dims):
    x = torch.randn(4, 5, 6).permute(2, 0, 1)
    expected = torch.fft.rfftn(x, dim=dims)
    actual = torch.fft.rfftn(x.to(DEV), dim=dims)
    assert_close(actual.cpu(), expected, atol=1e-4, rtol=1e-4)
    if dims is not None and len(dims) == 1:
        assert actual.stride() == expected.stride()
    else:  # (several dims: contiguous here; the CPU keeps the input's order for the other dims)
        assert actual.is_contiguous()
