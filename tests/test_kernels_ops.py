"""torch.tpu.ops: ragged_dot, ragged_dot_weight_grad, splash_sdpa, optimization_barrier against the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchtpu.kernels import ops


def _groups(m, g):
    sizes = torch.multinomial(torch.ones(g), m, replacement=True).bincount(minlength=g)
    return sizes.to(torch.int32)


def _ragged_ref(lhs, rhs, sizes):
    out, start = [], 0
    for i, n in enumerate(sizes.tolist()):
        out.append(lhs[start : start + n] @ rhs[i])
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ragged_dot_forward_and_grads(dtype):
    m, k, n, g = 24, 16, 8, 5
    lhs, rhs, sizes = torch.randn(m, k, dtype=dtype), torch.randn(g, k, n, dtype=dtype), _groups(m, g)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
    tl, tr = (t.to("tpu").requires_grad_() for t in (lhs, rhs))
    out = ops.ragged_dot(tl, tr, sizes.to("tpu"))
    ref_l, ref_r = lhs.clone().requires_grad_(), rhs.clone().requires_grad_()
    ref = _ragged_ref(ref_l, ref_r, sizes)
    torch.testing.assert_close(out.cpu(), ref, **tol)
    grad = torch.randn(m, n, dtype=dtype)
    out.backward(grad.to("tpu"))
    ref.backward(grad)
    torch.testing.assert_close(tl.grad.cpu(), ref_l.grad, **tol)
    torch.testing.assert_close(tr.grad.cpu(), ref_r.grad, **tol)
    torch.testing.assert_close(
        ops.ragged_dot_weight_grad(lhs.to("tpu"), grad.to("tpu"), sizes.to("tpu")).cpu(), ref_r.grad, **tol
    )
    # out=
    dst = torch.empty(m, n, dtype=dtype, device="tpu")
    assert ops.ragged_dot(lhs.to("tpu"), rhs.to("tpu"), sizes.to("tpu"), out=dst) is dst
    torch.testing.assert_close(dst.cpu(), ref.detach(), **tol)
    with pytest.raises(ValueError, match="shapes do not match"):
        ops.ragged_dot(lhs.to("tpu"), rhs[:, :3].to("tpu"), sizes.to("tpu"))


def test_ragged_dot_in_compiled_graph():
    m, k, n, g = 16, 8, 4, 3
    lhs, rhs, sizes = torch.randn(m, k), torch.randn(g, k, n), _groups(m, g)
    f = torch.compile(lambda a, b, s: ops.ragged_dot(a * 2, b, s).relu(), backend="tpu", fullgraph=True)
    torch.testing.assert_close(
        f(lhs.to("tpu"), rhs.to("tpu"), sizes.to("tpu")).cpu(), _ragged_ref(lhs * 2, rhs, sizes).relu()
    )


@pytest.mark.parametrize(
    "causal,window,gqa", [(True, None, False), (False, None, False), (True, 3, False), (True, None, True)]
)
def test_splash_sdpa_matches_sdpa(causal, window, gqa):
    b, h, s, d = 2, 4, 9, 16
    hk = 2 if gqa else h
    q, k, v = torch.randn(b, h, s, d), torch.randn(b, hk, s, d), torch.randn(b, hk, s, d)
    out = ops.splash_sdpa(*(t.to("tpu") for t in (q, k, v)), is_causal=causal, local_window_size=window, enable_gqa=gqa)
    kk, vv = (k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1))
    mask = None
    if window is not None:
        i = torch.arange(s)
        mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
    ref = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, is_causal=causal and mask is None)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="enable_gqa"):
        ops.splash_sdpa(q.to("tpu"), k[:, :1].to("tpu"), v[:, :1].to("tpu"))


def test_splash_sdpa_backward():
    q, k, v = (torch.randn(1, 2, 5, 8, requires_grad=True) for _ in range(3))
    tq, tk, tv = (t.detach().to("tpu").requires_grad_() for t in (q, k, v))
    ops.splash_sdpa(tq, tk, tv).sum().backward()
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    for a, b in ((tq, q), (tk, k), (tv, v)):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-5, atol=1e-5)


def test_optimization_barrier():
    a, b = torch.randn(3, 4), torch.randn(5)
    ta, tb = a.to("tpu"), b.to("tpu")
    oa, ob = ops.optimization_barrier([ta, tb])
    torch.testing.assert_close(oa.cpu(), a)
    torch.testing.assert_close(ob.cpu(), b)
    f = torch.compile(lambda x, y: [t * 2 for t in ops.optimization_barrier([x + 1, y])], backend="tpu", fullgraph=True)
    ra, rb = f(ta, tb)
    torch.testing.assert_close(ra.cpu(), (a + 1) * 2)
    ta.requires_grad_()
    ops.optimization_barrier([ta])[0].sum().backward()
    torch.testing.assert_close(ta.grad.cpu(), torch.ones_like(a))


def test_public_name():
    tpu_ops = pytest.importorskip("torch.tpu.ops")
    assert tpu_ops.ragged_dot is ops.ragged_dot
