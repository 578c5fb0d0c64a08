"""TPU kernels on a machine without a TPU: the TPU branches (`platform.tracing_for("tpu")`) computed on the host
through Pallas' interpreter and checked against torch CPU, and compiled by XLA:TPU (libtpu, compile only) in the
TPU compile check's child process (TORCHTPU_TPU_COMPILE_CHECK, eager/tpu_check.py).

- splash attention (ops/attention_splash.py): scaled_dot_product_attention's and torch.tpu.ops.splash_sdpa's TPU
  path, forward and backward, bfloat16 and float32, causal / sliding-window / full, any sequence length;
- ragged dot / _grouped_mm in bfloat16 (DEFAULT precision, float32 accumulation);
- a user's gridded Pallas kernel through jax_op (int32 index maps whatever the x64 setting).

Each TPU compile takes a few seconds; the variants beyond one per kernel family are marked slow.
"""

from __future__ import annotations

import itertools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("libtpu", reason="the TPU compile check needs libtpu (pip install torchtpu[tpu-check])")

from torchtpu.device import platform
from torchtpu.eager import tpu_check
from torchtpu.ops import attention as attention_ops
from torchtpu.ops import attention_splash, linalg

V5E, V6E = "v5e:2x2", "v6e:2x2"


@pytest.fixture
def compile_for(monkeypatch):
    """compile_for(topology, fn, *args): fn traced for the TPU and compiled by XLA:TPU; asserts it compiled."""

    def run(topology, fn, *args, name="test_tpu_kernels"):
        monkeypatch.setenv("TORCHTPU_TPU_COMPILE_CHECK", topology)
        tpu_check.reset_for_test()
        tpu_check.check(jax.jit(fn), args, name)  # raises TpuCompileCheckError naming XLA's error
        results = [p for p in tpu_check.report().programs if p.name == name]
        assert results and all(p.ok for p in results)
        tpu_check.reset_for_test()

    return run


def _tpu_text(fn, *args):
    with platform.tracing_for("tpu"):
        return jax.jit(lambda *a: fn(*a)).trace(*args).lower(lowering_platforms=("tpu",)).as_text()


def _host_as_tpu(fn, *args):
    """fn's TPU branch computed on the host (Pallas kernels in the interpreter). A fresh jit: JAX's trace
    cache does not know about tracing_for."""
    with platform.tracing_for("tpu"):
        return jax.jit(lambda *a: fn(*a))(*args)


def _to_jax(t):
    return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16 if t.dtype == torch.bfloat16 else jnp.float32)


def _to_torch(a, dtype):
    return torch.from_numpy(np.asarray(a.astype(jnp.float32))).to(dtype)


def _qkv(b, h, h_kv, s, t, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s, d, generator=g).to(dtype)
    k = torch.randn(b, h_kv, t, d, generator=g).to(dtype)
    v = torch.randn(b, h_kv, t, d, generator=g).to(dtype)
    grad = torch.randn(b, h, s, d, generator=g).to(dtype)
    return q, k, v, grad


def _reference(q, k, v, grad, is_causal=False, mask=None, enable_gqa=False):
    """torch CPU's attention in float32 (of the same, possibly bf16-rounded, inputs): output and gradients."""
    q, k, v = (x.float().requires_grad_() for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=enable_gqa)
    out.backward(grad.float())
    return out.detach(), q.grad, k.grad, v.grad


def _tol(dtype):
    # bf16: the kernel rounds q*scale and the probabilities to bf16 before its products (as TPUs do)
    return {"rtol": 2e-2, "atol": 3e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}


def _splash_sdpa_on_host(q, k, v, grad, is_causal):
    """aten's flash-attention lowerings (scaled_dot_product_attention's) traced for the TPU, run on the host."""
    jq, jk, jv, jg = (_to_jax(x) for x in (q, k, v, grad))

    def both(q, k, v, g):
        out, lse = attention_ops.sdpa_fused(q, k, v, 0.0, is_causal)
        grads = attention_ops.sdpa_fused_backward(g, q, k, v, out, lse, 0.0, is_causal)
        return out, lse, grads

    return _host_as_tpu(both, jq, jk, jv, jg)


# ---------------------------------------------------------------- splash attention: numerics (interpreter)
def test_sdpa_splash_padded_causal_matches_cpu():
    """Causal attention at a length that is not a multiple of 128 (padded inside the kernel), forward,
    logsumexp and backward, against torch CPU."""
    q, k, v, grad = _qkv(1, 2, 2, 200, 200, 64, torch.float32, seed=1)
    out, lse, (dq, dk, dv) = _splash_sdpa_on_host(q, k, v, grad, True)
    ref_out, ref_dq, ref_dk, ref_dv = _reference(q, k, v, grad, is_causal=True)
    tol = _tol(torch.float32)
    torch.testing.assert_close(_to_torch(out, torch.float32), ref_out, **tol)
    torch.testing.assert_close(_to_torch(dq, torch.float32), ref_dq, **tol)
    torch.testing.assert_close(_to_torch(dk, torch.float32), ref_dk, **tol)
    torch.testing.assert_close(_to_torch(dv, torch.float32), ref_dv, **tol)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(64) + torch.full((200, 200), float("-inf")).triu(1)
    torch.testing.assert_close(_to_torch(lse, torch.float32), torch.logsumexp(scores, -1), **tol)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", ["full_gqa", "causal_cross", "exact_blocks"])
def test_sdpa_splash_matches_cpu(dtype, case):
    b, h, h_kv, s, t, causal = {
        "full_gqa": (2, 4, 2, 130, 300, False),
        "causal_cross": (1, 2, 2, 300, 140, True),
        "exact_blocks": (1, 1, 1, 256, 256, True),
    }[case]
    q, k, v, grad = _qkv(b, h, h_kv, s, t, 64, dtype, seed=2)
    out, _, (dq, dk, dv) = _splash_sdpa_on_host(q, k, v, grad, causal)
    ref = _reference(q, k, v, grad, is_causal=causal, enable_gqa=h != h_kv)
    for got, want in zip((out, dq, dk, dv), ref):
        torch.testing.assert_close(_to_torch(got, torch.float32), want, **_tol(dtype))


def _bottom_right_mask(s, t, is_causal, window):
    rows = torch.arange(s)[:, None] + (t - s)
    cols = torch.arange(t)[None, :]
    keep = torch.ones(s, t, dtype=torch.bool)
    if is_causal:
        keep &= cols <= rows
    if window is not None:
        keep &= cols > rows - window
    return keep


@pytest.mark.parametrize(
    "dtype,shape,causal,window",
    [
        (torch.float32, (1, 2, 1, 150, 190), True, 64),  # sliding window, GQA, padded, queries at the end of keys
        pytest.param(torch.bfloat16, (1, 2, 2, 256, 256), True, 100, marks=pytest.mark.slow),
        pytest.param(torch.float32, (1, 2, 2, 160, 160), False, 50, marks=pytest.mark.slow),
    ],
)
def test_splash_sdpa_op_tpu_branch_matches_cpu(dtype, shape, causal, window):
    """torch.tpu.ops.splash_sdpa's JAX function, TPU branch on the host: forward and jax.vjp backward."""
    from torchtpu.kernels import ops as kernel_ops

    b, h, h_kv, s, t = shape
    q, k, v, grad = _qkv(b, h, h_kv, s, t, 64, dtype, seed=3)
    fn = kernel_ops._splash_sdpa.jax_function
    with platform.tracing_for("tpu"):
        assert (
            attention_splash.plan(_to_jax(q), _to_jax(k), _to_jax(v), causal=causal, offset=t - s, window=window)
            is not None
        )

    def both(q, k, v, g):
        out, pullback = jax.vjp(lambda q, k, v: fn(q, k, v, 0.125, causal, window, 512, 512, 512), q, k, v)
        return out, pullback(g)

    out, (dq, dk, dv) = _host_as_tpu(both, *(_to_jax(x) for x in (q, k, v, grad)))
    ref = _reference(q, k, v, grad, mask=_bottom_right_mask(s, t, causal, window), enable_gqa=h != h_kv)
    # scale 0.125 = 1/sqrt(64): torch's default
    for got, want in zip((out, dq, dk, dv), ref):
        torch.testing.assert_close(_to_torch(got, torch.float32), want, **_tol(dtype))


def test_splash_plan_routes_what_the_kernel_cannot_take_to_xla():
    f32 = jax.ShapeDtypeStruct
    q, k = f32((1, 2, 256, 64), jnp.float32), f32((1, 2, 256, 64), jnp.float32)
    short = f32((1, 2, 8, 64), jnp.float32)
    with platform.tracing_for("tpu"):
        assert attention_splash.plan(q, k, k, causal=True) is not None
        assert attention_splash.plan(short, k, k, causal=True) is None  # a decode step: XLA attention
        assert attention_splash.plan(q, short, short, causal=False) is None
        assert attention_splash.plan(q, k, k, causal=True, offset=-1) is None  # row 0 would see no key
        wide = f32((1, 2, 256, 64), jnp.float16)
        assert attention_splash.plan(wide, wide, wide, causal=True) is None  # float16: not a splash dtype
        # the last query row's window starts after the last key
        assert attention_splash.plan(q, k, k, causal=False, offset=300, window=10) is None
        assert attention_splash.plan(q, k, k, causal=False, offset=-300, window=10) is not None
    assert attention_splash.plan(q, k, k, causal=True) is None  # tracing for the host


def test_sdpa_on_tpu_traces_the_mosaic_kernel_and_elsewhere_does_not():
    q = jax.ShapeDtypeStruct((1, 2, 200, 64), jnp.bfloat16)
    fwd = lambda q, k, v: attention_ops.sdpa_fused(q, k, v, 0.0, True)
    assert "tpu_custom_call" in _tpu_text(fwd, q, q, q)
    assert "tpu_custom_call" not in jax.jit(fwd).trace(q, q, q).lower(lowering_platforms=("tpu",)).as_text()
    # the backward runs splash's fused backward kernel on the forward's residuals: one kernel, no recomputation
    lse = jax.ShapeDtypeStruct((1, 2, 200), jnp.float32)
    bwd = lambda g, q, k, v, o, lse: attention_ops.sdpa_fused_backward(g, q, k, v, o, lse, 0.0, True)
    assert _tpu_text(bwd, q, q, q, q, q, lse).count("tpu_custom_call") == 1
    mask = jax.ShapeDtypeStruct((200, 200), jnp.bool_)  # an explicit mask: XLA attention
    masked = lambda q, k, v, m: attention_ops.sdpa_fused(q, k, v, 0.0, False, m)
    assert "tpu_custom_call" not in _tpu_text(masked, q, q, q, mask)


# ---------------------------------------------------------------- splash attention: XLA:TPU compiles
def _sdpa_train_step(is_causal):
    def step(q, k, v, g):
        out, lse = attention_ops.sdpa_fused(q, k, v, 0.0, is_causal)
        return out, lse, attention_ops.sdpa_fused_backward(g, q, k, v, out, lse, 0.0, is_causal)

    return step


@pytest.mark.parametrize("x64", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_sdpa_splash_compiles_for_tpu(compile_for, x64):
    """bf16 causal attention at a padded length, forward and backward, for v5e (whatever the x64 setting)."""
    x = jax.ShapeDtypeStruct((1, 2, 200, 128), jnp.bfloat16)
    with jax.enable_x64(x64):
        compile_for(V5E, _sdpa_train_step(True), x, x, x, x)


@pytest.mark.slow
@pytest.mark.parametrize("topology", [V5E, V6E])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("is_causal,heads,s,t,d", [(True, (8, 2), 1000, 1000, 128), (False, (4, 4), 384, 520, 64)])
def test_sdpa_splash_compiles_for_tpu_variants(compile_for, topology, dtype, is_causal, heads, s, t, d):
    q = jax.ShapeDtypeStruct((2, heads[0], s, d), dtype)
    kv = jax.ShapeDtypeStruct((2, heads[1], t, d), dtype)
    compile_for(topology, _sdpa_train_step(is_causal), q, kv, kv, q)


@pytest.mark.slow
@pytest.mark.parametrize("topology", [V5E, V6E])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("causal,window", [(True, 256), (False, 128), (True, None), (False, None)])
def test_splash_sdpa_op_compiles_for_tpu(compile_for, topology, dtype, causal, window):
    from torchtpu.kernels import ops as kernel_ops

    fn = kernel_ops._splash_sdpa.jax_function

    def step(q, k, v, g):
        out, pullback = jax.vjp(lambda q, k, v: fn(q, k, v, 0.1, causal, window, 512, 512, 512), q, k, v)
        return out, pullback(g)

    q = jax.ShapeDtypeStruct((1, 4, 700, 128), dtype)
    kv = jax.ShapeDtypeStruct((1, 2, 900, 128), dtype)
    assert "tpu_custom_call" in _tpu_text(step, q, kv, kv, q)
    compile_for(topology, step, q, kv, kv, q)


def test_sdpa_on_tpu_device_under_the_compile_check(monkeypatch):
    """End to end: F.scaled_dot_product_attention on "tpu" tensors with the check on: the eager forward and
    backward executables (splash on the TPU trace) compile for v5e; the host's results equal torch CPU's."""
    monkeypatch.setenv("TORCHTPU_TPU_COMPILE_CHECK", V5E)
    tpu_check.reset_for_test()
    s = 129 + int.from_bytes(os.urandom(1), "little") % 100  # a fresh shape: a new executable, checked
    q, k, v, grad = _qkv(1, 2, 2, s, s, 64, torch.bfloat16, seed=4)
    leaves = [x.to("tpu").requires_grad_() for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    out.backward(grad.to("tpu"))
    ref = _reference(q, k, v, grad, is_causal=True)
    for got, want in zip((out, *(x.grad for x in leaves)), ref):
        torch.testing.assert_close(got.detach().cpu().float(), want, **_tol(torch.bfloat16))
    names = {p.name: p.ok for p in tpu_check.report().programs}
    tpu_check.reset_for_test()
    assert names.get("aten::_scaled_dot_product_flash_attention_for_cpu.default") is True, names
    assert names.get("aten::_scaled_dot_product_flash_attention_for_cpu_backward.default") is True, names


# ---------------------------------------------------------------- ragged dot / _grouped_mm in bf16
def _ragged_inputs(m, k, n, g, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.multinomial(torch.ones(g), m, replacement=True, generator=gen).bincount(minlength=g)
    lhs = torch.randn(m, k, generator=gen).to(dtype)
    rhs = torch.randn(g, k, n, generator=gen).to(dtype)
    grad = torch.randn(m, n, generator=gen).to(dtype)
    return lhs, rhs, sizes.to(torch.int32), grad


def _ragged_reference(lhs, rhs, sizes):
    out, start = [], 0
    for i, size in enumerate(sizes.tolist()):
        out.append(lhs[start : start + size].double() @ rhs[i].double())
        start += size
    return torch.cat(out)


def test_bf16_ragged_dot_and_grouped_mm_tpu_branch_match_float_references():
    lhs, rhs, sizes, grad = _ragged_inputs(96, 64, 48, 5, torch.bfloat16, seed=5)
    from torchtpu.kernels import ops as kernel_ops

    fwd = _host_as_tpu(
        lambda a, b, s: kernel_ops._ragged_dot.jax_function(a, b, s),
        _to_jax(lhs),
        _to_jax(rhs),
        jnp.asarray(sizes.numpy()),
    )
    wgrad = _host_as_tpu(
        lambda a, g, s: kernel_ops._ragged_dot_weight_grad.jax_function(a, g, s),
        _to_jax(lhs),
        _to_jax(grad),
        jnp.asarray(sizes.numpy()),
    )
    offs = jnp.asarray(sizes.cumsum(0).to(torch.int32).numpy())
    grouped = _host_as_tpu(lambda a, b, o: linalg.grouped_mm(a, b, o), _to_jax(lhs), _to_jax(rhs), offs)
    assert fwd.dtype == grouped.dtype == jnp.bfloat16
    want = _ragged_reference(lhs, rhs, sizes).float()
    tol = {"rtol": 1.6e-2, "atol": 5e-2}  # one bf16 rounding of a float32-accumulated sum of 64 products
    torch.testing.assert_close(_to_torch(fwd, torch.float32), want, **tol)
    torch.testing.assert_close(_to_torch(grouped, torch.float32), want, **tol)
    starts = [0, *sizes.cumsum(0).tolist()]
    want_w = torch.stack([lhs[a:b].double().T @ grad[a:b].double() for a, b in itertools.pairwise(starts)]).float()
    torch.testing.assert_close(_to_torch(wgrad, torch.float32), want_w, **tol)


def test_bf16_ragged_dot_and_grouped_mm_compile_for_tpu(compile_for):
    from torchtpu.kernels import ops as kernel_ops

    def programs(lhs, rhs, sizes, grad, weight_t, act):
        offs = jnp.cumsum(sizes).astype(jnp.int32)
        return (
            kernel_ops._ragged_dot.jax_function(lhs, rhs, sizes),
            kernel_ops._ragged_dot_weight_grad.jax_function(lhs, grad, sizes),
            linalg.grouped_mm(lhs, rhs, offs),  # 2D x 3D: the experts' forward
            linalg.grouped_mm(lhs, jnp.swapaxes(weight_t, 1, 2), offs),  # ... on Transformers' transposed view
            linalg.grouped_mm(lhs.T, grad, offs),  # 2D x 2D: their weight gradient
            linalg.grouped_mm(act, grad, offs),
        )  # 3D x 2D: b's columns in groups

    bf = jnp.bfloat16
    m, k, n, g = 256, 128, 256, 8
    args = (
        jax.ShapeDtypeStruct((m, k), bf),
        jax.ShapeDtypeStruct((g, k, n), bf),
        jax.ShapeDtypeStruct((g,), jnp.int32),
        jax.ShapeDtypeStruct((m, n), bf),
        jax.ShapeDtypeStruct((g, n, k), bf),
        jax.ShapeDtypeStruct((g, 64, m), bf),
    )
    text = _tpu_text(programs, *args)
    assert "ragged" in text and "HIGHEST" not in text  # bf16 operands: DEFAULT precision
    compile_for(V5E, programs, *args)


def test_float32_ragged_dot_follows_the_matmul_precision_setting():
    from torchtpu.kernels import ops as kernel_ops

    f32 = jax.ShapeDtypeStruct
    args = (f32((64, 32), jnp.float32), f32((4, 32, 16), jnp.float32), f32((4,), jnp.int32))
    fn = kernel_ops._ragged_dot.jax_function
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert "HIGHEST" in _tpu_text(fn, *args)
        torch.set_float32_matmul_precision("medium")
        assert "HIGHEST" not in _tpu_text(fn, *args)
    finally:
        torch.set_float32_matmul_precision(previous)


def _hub():
    """The Hub kernel package, loaded as tests/test_kernels_hub.py loads it (`kernels` caches it: its ops
    are registered once per process)."""
    import pathlib

    kernels = pytest.importorskip("kernels")
    return kernels.get_local_kernel(pathlib.Path(__file__).resolve().parent.parent / "kernels" / "torchtpu-kernels")


def test_hub_moe_experts_tpu_branch_compiles_for_tpu(compile_for):
    """The Hub kernel's MoE block in bf16, TPU branch (XLA's ragged dot at DEFAULT precision), for v5e."""
    bf = jnp.bfloat16
    args = (
        jax.ShapeDtypeStruct((32, 128), bf),
        jax.ShapeDtypeStruct((32, 2), jnp.int32),
        jax.ShapeDtypeStruct((32, 2), bf),
        jax.ShapeDtypeStruct((4, 128, 128), bf),
        jax.ShapeDtypeStruct((4, 128, 64), bf),
    )
    fn = _hub().moe_experts.jax_function
    assert "ragged_dot" in _tpu_text(fn, *args)
    compile_for(V5E, fn, *args)


@pytest.mark.slow
@pytest.mark.parametrize("topology", [V5E, V6E])
def test_hub_moe_experts_tpu_branch_compiles_and_matches(compile_for, topology):
    """The Hub kernel's MoE block: its TPU branch (XLA's ragged dot) in bf16 compiles for the TPU and, on the
    host, matches its float32 computation within bf16 tolerance."""
    fn = _hub().moe_experts.jax_function
    gen = torch.Generator().manual_seed(6)
    tokens, hidden, inter, experts, top_k = 64, 128, 64, 8, 2
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen)
    x = torch.randn(tokens, hidden, generator=gen)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    down = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    args16 = [
        _to_jax(x.bfloat16()),
        jnp.asarray(ids.numpy()),
        _to_jax(weights),
        _to_jax(gate_up.bfloat16()),
        _to_jax(down.bfloat16()),
    ]
    got = _host_as_tpu(fn, *args16)
    want = _host_as_tpu(fn, *[a.astype(jnp.float32) if a.dtype == jnp.bfloat16 else a for a in args16])
    torch.testing.assert_close(_to_torch(got, torch.float32), _to_torch(want, torch.float32), rtol=3e-2, atol=3e-2)
    compile_for(topology, fn, *[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args16])


# ---------------------------------------------------------------- a user's gridded Pallas kernel through jax_op
def _scaled_rows_kernel(x_ref, y_ref, o_ref):
    # a loop whose index meets Python ints, and index maps returning Python ints: int64 under x64
    from jax.experimental import pallas as pl

    def body(i, acc):
        return acc + y_ref[pl.ds(i * 8, 8), :].sum()

    total = jax.lax.fori_loop(0, 4, body, jnp.float32(0))
    o_ref[...] = x_ref[...] * 2 + total


def _gridded(x, y):
    from jax.experimental import pallas as pl

    return pl.pallas_call(
        _scaled_rows_kernel,
        grid=(x.shape[0] // 128,),
        in_specs=[pl.BlockSpec((128, 128), lambda i: (i, 0)), pl.BlockSpec((32, 128), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((128, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, y)


@pytest.fixture(scope="module")
def gridded_op():
    from torch.tpu.pallas import jax_op

    def gridded(x: jax.Array, y: jax.Array) -> jax.Array:
        return _gridded(x, y)

    return jax_op("test_tpu_kernels::gridded", gridded)


@pytest.mark.parametrize("x64", [True, False])
def test_jax_op_gridded_pallas_kernel_compiles_for_tpu_whatever_x64(compile_for, gridded_op, x64):
    from torchtpu.ops.table import LOWERINGS

    lowering = LOWERINGS["test_tpu_kernels.gridded.default"].fn
    x, y = jax.ShapeDtypeStruct((256, 128), jnp.float32), jax.ShapeDtypeStruct((32, 128), jnp.float32)
    with jax.enable_x64(x64):
        compile_for(V5E, lambda x, y: lowering(x, y), x, y)


def test_jax_op_gridded_pallas_kernel_on_tpu_device_under_the_compile_check(monkeypatch, gridded_op):
    monkeypatch.setenv("TORCHTPU_TPU_COMPILE_CHECK", V5E)
    tpu_check.reset_for_test()
    rows = 128 * (3 + int.from_bytes(os.urandom(1), "little") % 20)  # a fresh shape: a new executable, checked
    x, y = torch.randn(rows, 128), torch.randn(32, 128)
    out = gridded_op(x.to("tpu"), y.to("tpu"))
    torch.testing.assert_close(out.cpu(), x * 2 + y.sum(), rtol=1e-5, atol=1e-4)
    names = {p.name: p.ok for p in tpu_check.report().programs}
    tpu_check.reset_for_test()
    assert names.get("test_tpu_kernels::gridded.default") is True, names


def test_jax_op_pallas_kernel_with_64_bit_values_keeps_them_on_the_host(monkeypatch):
    """A kernel reading int64 or float64 is no TPU kernel: it is traced with the process's x64, so its values
    stay 64-bit on the host (only kernels of 32-bit values are traced with x64 off). (Host semantics: under
    the TPU compile check it fails to compile for the TPU, as it should.)"""
    monkeypatch.delenv("TORCHTPU_TPU_COMPILE_CHECK", raising=False)
    from jax.experimental import pallas as pl
    from torch.tpu.pallas import jax_op

    def affine(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 3 + 1

    def pallas_affine(x: jax.Array) -> jax.Array:
        return pl.pallas_call(affine, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    op = jax_op("test_tpu_kernels::affine64", pallas_affine)
    big = torch.randint(-(2**40), 2**40, (8, 128))
    torch.testing.assert_close(op(big.to("tpu")).cpu(), big * 3 + 1, rtol=0, atol=0)
    wide = torch.randn(8, 128, dtype=torch.float64)
    torch.testing.assert_close(op(wide.to("tpu")).cpu(), wide * 3 + 1)


def test_splash_sdpa_on_tpu_device_under_the_compile_check(monkeypatch):
    """torch.tpu.ops.splash_sdpa on "tpu" tensors with the check on (GQA, sliding window, a padded length):
    the op and its jax.vjp backward op compile for v5e with splash on the TPU trace; the host's results
    equal torch CPU's."""
    from torch.tpu.ops import splash_sdpa

    monkeypatch.setenv("TORCHTPU_TPU_COMPILE_CHECK", V5E)
    tpu_check.reset_for_test()
    s = 129 + int.from_bytes(os.urandom(1), "little") % 100  # a fresh shape: new executables, checked
    q, k, v, grad = _qkv(1, 4, 2, s, s, 64, torch.float32, seed=7)
    leaves = [x.to("tpu").requires_grad_() for x in (q, k, v)]
    out = splash_sdpa(*leaves, is_causal=True, local_window_size=48, enable_gqa=True)
    out.backward(grad.to("tpu"))
    ref = _reference(q, k, v, grad, mask=_bottom_right_mask(s, s, True, 48), enable_gqa=True)
    for got, want in zip((out, *(x.grad for x in leaves)), ref):
        torch.testing.assert_close(got.detach().cpu(), want, **_tol(torch.float32))
    names = {p.name: p.ok for p in tpu_check.report().programs}
    tpu_check.reset_for_test()
    assert names.get("tpu::_splash_sdpa.default") is True, names
    assert names.get("tpu::_splash_sdpa_jax_vjp.default") is True, names
