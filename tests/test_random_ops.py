"""Random ops on tpu: shapes, dtypes, supports and distributions (moments within a few standard
errors for 20k draws). Their values cannot match the CPU generator, so the OpInfo sweep compares
them on shape and dtype only; this file checks that the numbers are the right numbers."""

from __future__ import annotations

import math

import pytest
import torch

N = 20000
SE = 5.0 / math.sqrt(N)  # 5 standard errors of a mean with unit variance


def _t(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="tpu")


def test_uniform_and_normal():
    u = _t(N).uniform_(-2.0, 4.0).cpu()
    assert u.min() >= -2.0 and u.max() < 4.0
    assert abs(u.mean() - 1.0) < 6 * SE * math.sqrt(3)
    z = torch.randn(N, device="tpu").cpu()
    assert abs(z.mean()) < SE and abs(z.std() - 1) < 0.03
    n = _t(N).normal_(3.0, 0.5).cpu()
    assert abs(n.mean() - 3.0) < SE and abs(n.std() - 0.5) < 0.02


def test_exponential_cauchy_geometric_lognormal():
    e = _t(N).exponential_(2.0).cpu()
    assert e.min() >= 0 and abs(e.mean() - 0.5) < 0.5 * SE * 1.2
    c = _t(N).cauchy_(1.0, 2.0).cpu()
    assert abs(c.median() - 1.0) < 0.1  # the median is the only stable statistic
    q = ((c > -1.0) & (c < 3.0)).float().mean()  # P(|X - median| < sigma) = 1/2
    assert abs(q - 0.5) < 0.02
    g = _t(N).geometric_(0.25).cpu()
    assert g.min() >= 1 and torch.equal(g, g.round()) and abs(g.mean() - 4.0) < 0.15
    ln = _t(N).log_normal_(0.5, 0.25).cpu()
    assert ln.min() > 0 and abs(ln.log().mean() - 0.5) < 0.25 * SE and abs(ln.log().std() - 0.25) < 0.01


def test_bernoulli_and_dropout():
    b = torch.bernoulli(torch.full((N,), 0.3, device="tpu")).cpu()
    assert set(b.unique().tolist()) <= {0.0, 1.0} and abs(b.mean() - 0.3) < SE
    x = torch.ones(N, device="tpu")
    d = torch.nn.functional.dropout(x, 0.25, training=True).cpu()
    kept = d != 0
    assert abs(kept.float().mean() - 0.75) < SE and torch.allclose(d[kept], torch.tensor(1 / 0.75))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.float32])
def test_random_integers(dtype):
    r = _t(N, dtype=dtype).random_(3, 9).cpu()
    assert r.dtype == dtype and set(r.unique().tolist()) == {3, 4, 5, 6, 7, 8}
    r = _t(N, dtype=dtype).random_(5).cpu()
    assert set(r.unique().tolist()) == {0, 1, 2, 3, 4}
    r = torch.randint(-4, 4, (N,), device="tpu").cpu()
    assert r.dtype == torch.int64 and r.min() == -4 and r.max() == 3 and abs(r.float().mean() + 0.5) < 0.1


def test_random_default_range():
    f = _t(N).random_().cpu()
    assert f.min() >= 0 and f.max() <= 2**24 and torch.equal(f, f.round()) and f.max() > 2**23
    u8 = _t(N, dtype=torch.uint8).random_().cpu()
    assert u8.min() == 0 and u8.max() == 255


def test_randperm():
    p = torch.randperm(1000, device="tpu").cpu()
    assert p.dtype == torch.int64 and torch.equal(p.sort().values, torch.arange(1000))
    assert not torch.equal(p, torch.arange(1000))


def test_multinomial():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25]], device="tpu")
    draws = torch.multinomial(probs, N, replacement=True).cpu()
    assert draws.shape == (2, N) and draws.dtype == torch.int64
    freq = torch.stack([torch.bincount(row, minlength=4).float() / N for row in draws])
    assert (freq - probs.cpu()).abs().max() < 0.02 and freq[0, 1] == 0
    no_rep = torch.multinomial(probs, 3).cpu()
    assert all(len(set(row.tolist())) == 3 for row in no_rep) and 1 not in no_rep[0].tolist()


def test_generator_state_reproducible():
    torch.tpu.manual_seed(123)
    a = torch.rand(100, device="tpu").cpu()
    torch.tpu.manual_seed(123)
    b = torch.rand(100, device="tpu").cpu()
    c = torch.rand(100, device="tpu").cpu()
    assert torch.equal(a, b) and not torch.equal(b, c)


def test_multinomial_of_one_sample_is_the_first_of_the_top_k():
    """One sample without replacement takes an argmax (no sort): the same draw as the first of a
    larger Gumbel-top-k with the same generator state, and frequencies that follow the weights."""
    probs = torch.rand(300, 7, dtype=torch.float64)
    probs[:, 3] = 0.0  # a zero weight is never drawn
    d = probs.to("tpu")
    one = torch.multinomial(d, 1, generator=torch.Generator("tpu").manual_seed(5)).cpu()
    top = torch.multinomial(d, 4, generator=torch.Generator("tpu").manual_seed(5)).cpu()
    assert one.shape == (300, 1) and one.dtype == torch.int64
    assert torch.equal(one, top[:, :1])
    assert not (one == 3).any()
    w = torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64)
    draws = torch.multinomial(w.to("tpu").expand(20000, 3).contiguous(), 1).cpu().flatten()
    torch.testing.assert_close(torch.bincount(draws, minlength=3).double() / 20000, w, atol=0.02, rtol=0)
