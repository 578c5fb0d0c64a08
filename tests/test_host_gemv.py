"""bfloat16 x @ W.T with 1-4 rows on XLA:CPU through the C++ kernel (ops/host_gemv.py, ops/csrc/host_gemv.cpp):
results against torch CPU within bf16 tolerance (eager and compiled, every row count, K not a multiple of
the vector width, N not a multiple of anything, weights split over threads or not); the lowering's form on
the host (the custom call) and for a TPU (XLA's native dot)."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import torchtpu  # noqa: F401  (the tpu device)
from torchtpu.device import platform
from torchtpu.ops import host_gemv, linalg

pytestmark = pytest.mark.skipif(
    platform.platform() != "cpu" or not host_gemv.available(), reason="XLA:CPU on a CPU with AVX512-BF16 only"
)


def _pair(*shape, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    cpu = (scale * torch.randn(*shape, generator=g)).to(torch.bfloat16)
    return cpu, cpu.to("tpu")


def _close(tpu, cpu):
    # both accumulate in float32 and round once to bf16; the summation order differs
    assert tpu.dtype == cpu.dtype and tpu.shape == cpu.shape
    assert_close(tpu.cpu().float(), cpu.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("n,k", [(1003, 1000), (4099, 256), (257, 289)])  # (4099, 256): 2 MB, split over threads
def test_linear_against_cpu(rows, n, k):
    x, xt = _pair(rows, k, seed=rows)
    w, wt = _pair(n, k, seed=100 + n, scale=0.05)
    b, bt = _pair(n, seed=7)
    _close(F.linear(xt, wt), F.linear(x, w))
    _close(F.linear(xt, wt, bt), F.linear(x, w, b))  # addmm
    _close(F.linear(xt[None], wt), F.linear(x[None], w))  # a 3-D input


def test_float32_accumulation_is_exact_to_float32():
    # sums of 1024 products whose float32 rounding errors would show in bf16 if the kernel accumulated in bf16
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 1024)), jnp.bfloat16)
    w = jnp.asarray(np.random.default_rng(1).standard_normal((3000, 1024)), jnp.bfloat16)
    got = np.asarray(jax.jit(host_gemv.product)(x, w))
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    np.testing.assert_allclose(got, exact, rtol=0, atol=2e-4)


def test_compiled_decode_step_matches_cpu():
    torch.manual_seed(3)
    cpu = torch.nn.Sequential(torch.nn.Linear(512, 1536, bias=False), torch.nn.SiLU(), torch.nn.Linear(1536, 512))
    cpu = cpu.to(torch.bfloat16)
    tpu = torch.compile(copy.deepcopy(cpu).to("tpu"), backend="tpu")
    for seed in (11, 12):  # fresh inputs through the same executable
        x, xt = _pair(1, 1, 512, seed=seed)
        with torch.no_grad():
            _close(tpu(xt), cpu(x))


def _ops(fn, *args):
    return [e.primitive.name for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns]


def _linear():
    return lambda x, w: linalg.matmul(x, w.T)  # a new function per trace (JAX caches traces per function)


def test_host_trace_calls_the_kernel_only_where_it_applies():
    w = jnp.ones((384, 256), jnp.bfloat16)
    with platform.tracing_for("cpu"):
        assert "ffi_call" in _ops(_linear(), jnp.ones((1, 256), jnp.bfloat16), w)
        assert "ffi_call" in _ops(_linear(), jnp.ones((2, 2, 256), jnp.bfloat16), w)
        assert "ffi_call" not in _ops(_linear(), jnp.ones((5, 256), jnp.bfloat16), w)  # a GEMM: XLA's dot
        assert "ffi_call" not in _ops(_linear(), jnp.ones((1, 256), jnp.float16), w.astype(jnp.float16))
        assert "ffi_call" not in _ops(_linear(), jnp.ones((1, 256), jnp.bfloat16), w[:96])  # small: XLA's dot
        # x @ W with W stored (K, N): the kernel would need W transposed first
        assert "ffi_call" not in _ops(lambda x, w: linalg.matmul(x, w), jnp.ones((1, 384), jnp.bfloat16), w)


def test_tpu_trace_keeps_the_native_dot():
    x, w = jnp.ones((1, 256), jnp.bfloat16), jnp.ones((384, 256), jnp.bfloat16)
    with platform.tracing_for("tpu"):
        ops = _ops(_linear(), x, w)
        hlo = jax.jit(_linear()).lower(x, w).as_text()
    assert "ffi_call" not in ops and "dot_general" in ops
    assert "custom_call" not in hlo
