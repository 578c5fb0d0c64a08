"""The blockwise (flash-style) attention lowering (ops/attention_blockwise.py) against the CPU.

Most tests shrink the block sizes so that small, odd shapes run many blocks whose lengths do not
divide L or S (the shifted last block), in both modes: keys in one piece and keys in blocks with the
online softmax. Every shape here is used by one test only: eager executables are cached per shape,
so a shape compiled under other block sizes would be reused.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchtpu.device.platform import lowering_platform
from torchtpu.ops import attention_blockwise as bw

TPU = "tpu"
TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-4),
    torch.float64: dict(atol=1e-10, rtol=1e-9),
    torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
    torch.float16: dict(atol=5e-3, rtol=5e-3),
}
MODE_NAMES = ["kv_blocks", "one_piece"]
DTYPE_IDS = dict(zip(TOL, ["f32", "f64", "bf16", "f16"]))


def modes_and_dtypes(default):
    """(mode, dtype) parameters of one test family: `default` (mode, dtype) pairs run by default, the
    rest of the 2 x 4 grid under `-m slow` (every pair compiles its own forward and backward, ~3 s).
    Over the four families below the default run has every family in both modes and every dtype
    (the float32, float64 and half accumulation paths) in both modes."""
    return pytest.mark.parametrize(
        "mode,dtype",
        [
            pytest.param(
                mode,
                dtype,
                id=f"{mode}-{DTYPE_IDS[dtype]}",
                marks=() if (mode, DTYPE_IDS[dtype]) in default else pytest.mark.slow,
            )
            for mode in MODE_NAMES
            for dtype in TOL
        ],
    )


@pytest.fixture
def used(monkeypatch):
    """Counts the host's traces of the blockwise forward and backward (they run only on an executable cache
    miss; the TPU compile check's second trace, for a TPU, is not counted)."""
    calls = {"forward": 0, "backward": 0}
    for name in calls:
        fn = getattr(bw, name)

        def counted(*a, _fn=fn, _name=name, **k):
            if lowering_platform() != "tpu":
                calls[_name] += 1
            return _fn(*a, **k)

        monkeypatch.setattr(bw, name, counted)
    return calls


def small_blocks(monkeypatch, mode):
    """Blocks of 16 rows; keys in blocks of 16 with tiles of several (batch, head) rows ("kv_blocks") or
    keys all at once, one row per tile ("one_piece")."""
    monkeypatch.setattr(bw, "MIN_SCORES", 0)
    monkeypatch.setattr(bw, "TILE", 256 if mode == "one_piece" else 2048)
    monkeypatch.setattr(bw, "GROUP", 1 if mode == "one_piece" else 8)
    monkeypatch.setattr(bw, "KV_ONE_PIECE", 16 if mode == "kv_blocks" else 1 << 30)
    monkeypatch.setattr(bw, "KV_BLOCK", 16)
    monkeypatch.setattr(bw, "CAUSAL_KV_BLOCK", 16 if mode == "kv_blocks" else 1 << 30)


def check(dtype, q, k, v, **kw):
    """SDPA output and q/k/v gradients on tpu vs CPU, for a random cotangent."""
    tol = TOL[dtype]
    cpu = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v)]
    dev = [t.detach().to(dtype).to(TPU).requires_grad_() for t in (q, k, v)]
    dkw = {n: (a.to(TPU) if isinstance(a, torch.Tensor) else a) for n, a in kw.items()}
    out_c = F.scaled_dot_product_attention(*cpu, **kw)
    out_d = F.scaled_dot_product_attention(*dev, **dkw)
    assert out_d.device.type == TPU and out_d.dtype == dtype
    torch.testing.assert_close(out_d.cpu(), out_c, **tol)
    g = torch.randn(out_c.shape).to(dtype)
    out_c.backward(g)
    out_d.backward(g.to(TPU))
    for a, b in zip(cpu, dev):
        torch.testing.assert_close(b.grad.cpu(), a.grad, **tol)


def qkv(b, h, l, s, e, seed):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, h, l, e, generator=gen),
        torch.randn(b, h, s, e, generator=gen),
        torch.randn(b, h, s, e, generator=gen),
    )


# each (dtype, mode) gets its own sizes: see the module docstring
def sizes(dtype, mode, base):
    return base + 2 * list(TOL).index(dtype) + (1 if mode == "one_piece" else 0) * 9


@modes_and_dtypes({("kv_blocks", "f32"), ("one_piece", "bf16")})
def test_plain_and_scale(monkeypatch, used, dtype, mode):
    small_blocks(monkeypatch, mode)
    n = sizes(dtype, mode, 37)
    check(dtype, *qkv(2, 3, n, n + 16, 8, 0))
    check(dtype, *qkv(1, 2, n + 1, n + 3, 8, 1), scale=0.27)
    assert used["forward"] == 2 and used["backward"] == 2


@modes_and_dtypes({("kv_blocks", "f16"), ("one_piece", "f64")})
def test_causal(monkeypatch, used, dtype, mode):
    small_blocks(monkeypatch, mode)
    n = sizes(dtype, mode, 41)
    check(dtype, *qkv(1, 2, n, n, 8, 2), is_causal=True)
    check(dtype, *qkv(1, 2, n - 11, n + 6, 8, 3), is_causal=True)  # L < S: top-left aligned, as PyTorch
    check(dtype, *qkv(1, 2, n + 7, n - 5, 8, 4), is_causal=True)  # L > S
    assert used["forward"] == 3 and used["backward"] == 3


@modes_and_dtypes({("kv_blocks", "bf16"), ("one_piece", "f32")})
def test_bool_mask(monkeypatch, used, dtype, mode):
    small_blocks(monkeypatch, mode)
    n = sizes(dtype, mode, 43)
    q, k, v = qkv(2, 2, n, n + 5, 8, 5)
    gen = torch.Generator().manual_seed(6)
    mask = torch.rand(n, n + 5, generator=gen) > 0.4
    mask[3] = False  # a query that sees no key: zeros, as the CPU
    check(dtype, q, k, v, attn_mask=mask)
    head_mask = torch.rand(1, 2, 1, n + 5, generator=gen) > 0.5  # broadcast over batch and queries
    check(dtype, q, k, v, attn_mask=head_mask)
    assert used["forward"] == 2 and used["backward"] == 2


@modes_and_dtypes({("kv_blocks", "f64"), ("one_piece", "f16")})
def test_float_mask(monkeypatch, used, dtype, mode):
    small_blocks(monkeypatch, mode)
    n = sizes(dtype, mode, 45)
    q, k, v = qkv(2, 3, n, n + 2, 8, 7)
    gen = torch.Generator().manual_seed(8)
    check(dtype, q, k, v, attn_mask=torch.randn(2, 1, n, n + 2, generator=gen).to(dtype))
    mask = torch.randn(1, 3, 1, n + 2, generator=gen)
    mask[..., :5] = float("-inf")  # additive -inf masking, as the eager layer sends bool masks
    check(dtype, q, k, v, attn_mask=mask.to(dtype))
    assert used["forward"] == 2 and used["backward"] == 2


def test_logsumexp_matches_cpu(monkeypatch, used):
    """The ATen op's second output (what the backward reads), a fully masked row included."""
    small_blocks(monkeypatch, "kv_blocks")
    q, k, v = qkv(2, 2, 33, 29, 8, 9)
    mask = torch.randn(33, 29)
    mask[4] = float("-inf")
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out_c, lse_c = op(q, k, v, attn_mask=mask)
    out_d, lse_d = op(q.to(TPU), k.to(TPU), v.to(TPU), attn_mask=mask.to(TPU))
    assert used["forward"] == 1
    torch.testing.assert_close(out_d.cpu(), out_c, atol=2e-5, rtol=2e-4)
    torch.testing.assert_close(lse_d.cpu(), lse_c, atol=2e-5, rtol=2e-4)
    assert (lse_d.cpu()[:, :, 4] == 0).all()  # PyTorch's CPU kernel gives 0 there


def test_grouped_query_lowering():
    """GQA straight through the lowerings (the eager layer hands grouped key/value heads to the op):
    dense and blockwise, against the dense lowering of explicitly repeated heads."""
    import jax.numpy as jnp

    from torchtpu.ops import attention

    rng = np.random.default_rng(10)
    q = jnp.asarray(rng.standard_normal((2, 4, 51, 8), np.float32))
    k = jnp.asarray(rng.standard_normal((2, 2, 46, 8), np.float32))
    v = jnp.asarray(rng.standard_normal((2, 2, 46, 6), np.float32))
    g = jnp.asarray(rng.standard_normal((2, 4, 51, 6), np.float32))
    ke, ve = jnp.repeat(k, 2, axis=1), jnp.repeat(v, 2, axis=1)
    names = "MIN_SCORES", "TILE", "KV_ONE_PIECE", "KV_BLOCK", "CAUSAL_KV_BLOCK", "GROUP"
    old = [getattr(bw, n) for n in names]
    try:
        out, lse = attention.sdpa_fused(q, ke, ve, 0.0, True)  # dense reference
        grads = attention.sdpa_fused_backward(g, q, ke, ve, out, lse, 0.0, True)
        out_g, lse_g = attention.sdpa_fused(q, k, v, 0.0, True)  # dense, grouped heads
        grads_g = attention.sdpa_fused_backward(g, q, k, v, out_g, lse_g, 0.0, True)
        for n, value in zip(names, (0, 1024, 16, 16, 16, 4)):
            setattr(bw, n, value)
        assert bw._plan(2, 4, 51, 46, True)[0] == 4  # tiles of 4 heads, key blocks of 16
        out_b, lse_b = bw.forward(q, k, v, None, True)
        dq, dk, dv = bw.backward(g, q, k, v, out_b, lse_b, None, True)
    finally:
        for n, value in zip(names, old):
            setattr(bw, n, value)
    np.testing.assert_allclose(out_g, out, atol=2e-6)
    np.testing.assert_allclose(lse_g, lse, atol=2e-6)
    np.testing.assert_allclose(grads_g[0], grads[0], atol=5e-6)
    np.testing.assert_allclose(grads_g[1], grads[1].reshape(2, 2, 2, 46, 8).sum(2), atol=5e-6)
    np.testing.assert_allclose(grads_g[2], grads[2].reshape(2, 2, 2, 46, 6).sum(2), atol=5e-6)
    np.testing.assert_allclose(out_b, out, atol=2e-6)
    np.testing.assert_allclose(lse_b, lse, atol=2e-6)
    np.testing.assert_allclose(dq, grads[0], atol=5e-6)
    np.testing.assert_allclose(dk, grads[1].reshape(2, 2, 2, 46, 8).sum(2), atol=5e-6)
    np.testing.assert_allclose(dv, grads[2].reshape(2, 2, 2, 46, 6).sum(2), atol=5e-6)


def test_default_blocks_long_sequence(used):
    """The real thresholds: a 2 x 1100 x 1100 score matrix goes blockwise, keys in one piece."""
    assert bw.MIN_SCORES <= 1 * 2 * 1100 * 1100
    check(torch.float32, *qkv(1, 2, 1100, 1100, 8, 11))
    check(torch.float32, *qkv(1, 2, 1100, 1100, 8, 12), is_causal=True)
    assert used["forward"] == 2 and used["backward"] == 2


def test_short_sequences_stay_dense(used):
    check(torch.float32, *qkv(2, 2, 40, 40, 8, 13))
    assert used["forward"] == 0 and used["backward"] == 0
