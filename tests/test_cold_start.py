"""Cold start: what a first call on a new shape costs (benchmarks/cold_start.py measures it)."""

from __future__ import annotations

import itertools
import os

import jax
import pytest
import torch
import torch.nn.functional as F
from jax._src import compiler

import torchtpu
from torchtpu.device import platform
from torchtpu.eager import executable
from torchtpu.ops import dtypes as dt

_sizes = itertools.count(int.from_bytes(os.urandom(2), "little") % 1000 + 3000)


def _fresh_shape():
    """A shape no executable (in memory or in the on-disk cache) was built for."""
    return (5, next(_sizes))


@pytest.fixture
def xla_compiles(monkeypatch):
    """The XLA compiles that really ran (not served by a cache)."""
    seen = []
    real = compiler.backend_compile_and_load

    def counted(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "backend_compile_and_load", counted)
    return seen


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.int64, torch.float64, torch.bool, torch.complex64]
)
def test_small_zeros_come_from_the_host_without_a_compile(xla_compiles, dtype):
    shape = _fresh_shape()
    z = executable.zeros(shape, dtype, 0)
    assert not xla_compiles
    assert z.shape == shape and z.dtype == dt.to_jax(dtype) and z.devices() == {platform.jax_device(0)}
    assert not jax.numpy.any(z)


def test_large_zeros_are_made_on_the_device(xla_compiles):
    n = executable.HOST_ZEROS // 4 + next(_sizes)
    z = executable.zeros((n,), torch.float32, 0)
    assert len(xla_compiles) == 1 and z.shape == (n,) and not jax.numpy.any(z)


def test_a_never_written_storage_reads_as_zeros_with_a_new_shape():
    shape = _fresh_shape()
    t = torch.empty(shape, device="tpu", dtype=torch.float64)
    t.add_(1.5)  # reads the storage: its zeros, sent from the host
    torch.testing.assert_close(t.cpu(), torch.full(shape, 1.5, dtype=torch.float64))


@pytest.mark.skipif(torch.tpu.platform() != "cpu", reason="a default of XLA:CPU only")
@pytest.mark.parametrize(
    "op",
    [
        lambda x: torch.randn(x.shape, device=x.device),
        lambda x: torch.rand(x.shape, device=x.device, dtype=torch.float64),
        lambda x: torch.tanh(x * 2 + 1),
        lambda x: F.gelu(x),
        lambda x: torch.softmax(x, -1),
        lambda x: x.sum(0),
        lambda x: F.layer_norm(x, x.shape[-1:]),
        lambda x: x.to(torch.bfloat16) * 3,
        lambda x: torch.special.erfinv(x / 8),
    ],
    ids=["randn", "rand_f64", "tanh", "gelu", "softmax", "sum0", "layer_norm", "bf16", "erfinv"],
)
def test_one_op_executables_at_llvm_o1_give_the_bits_of_o3(op):
    """One-op executables compile at LLVM -O1 on XLA:CPU (less compile time); their results are
    bitwise those of XLA's default -O3."""
    cpu = torch.randn(_fresh_shape(), generator=torch.Generator().manual_seed(1)) * 3
    results = []
    for options in ({}, {"xla_backend_optimization_level": 3}):  # (strict: one op, one executable)
        with torch.tpu.compiler.custom_compiler_options(options), torchtpu.eager_mode("strict"):
            x = cpu.to("tpu")
            torch.manual_seed(7)
            results.append(op(x).cpu())
    assert torch.equal(results[0].view(torch.uint8), results[1].view(torch.uint8))


def test_only_reductions_of_numbers_take_the_reduction_emitters():
    """Reductions of booleans (device-side checks of index ops, any/all) keep the LLVM IR emitters."""
    from torchtpu.eager.xla_options import _reduces

    x, i = jax.numpy.ones((4, 5)), jax.numpy.ones((3,), "int32")
    flags = lambda i: jax.numpy.stack([i > 0, i < 9])
    assert _reduces(jax.make_jaxpr(lambda x: x.sum(0))(x))
    assert _reduces(jax.make_jaxpr(lambda x: x.argmax(0))(x))
    assert _reduces(jax.make_jaxpr(lambda x: (x > 0).sum())(x))  # (summed as integers)
    assert not _reduces(jax.make_jaxpr(lambda i: jax.numpy.all(flags(i)))(i))
    assert not _reduces(jax.make_jaxpr(lambda i: jax.numpy.argmin(flags(i)))(i))
    assert not _reduces(jax.make_jaxpr(lambda x: jax.numpy.any(x > 0, 1))(x))
