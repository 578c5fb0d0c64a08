"""Random numbers on the device: seeding, reproducibility, distributions."""

import math

import torch


def test_manual_seed_reproduces_and_advances():
    torch.manual_seed(123)
    a = torch.randn(1000, device="tpu")
    b = torch.randn(1000, device="tpu")
    torch.manual_seed(123)
    a2 = torch.randn(1000, device="tpu")
    assert torch.equal(a.cpu(), a2.cpu())
    assert not torch.equal(a.cpu(), b.cpu())
    torch.tpu.manual_seed(7)
    assert torch.tpu.initial_seed() == 7


def test_rng_state_roundtrip():
    state = torch.tpu.get_rng_state()
    x = torch.rand(100, device="tpu")
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(100, device="tpu").cpu(), x.cpu())


def test_distributions():
    torch.manual_seed(0)
    n = 200_000
    z = torch.randn(n, device="tpu").cpu()
    assert abs(z.mean().item()) < 0.02 and abs(z.std().item() - 1) < 0.02
    u = torch.rand(n, device="tpu").cpu()
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    nz = torch.empty(n, device="tpu").normal_(3.0, 2.0).cpu()
    assert abs(nz.mean().item() - 3) < 0.05 and abs(nz.std().item() - 2) < 0.05
    uz = torch.empty(n, device="tpu").uniform_(-2, 5).cpu()
    assert uz.min() >= -2 and uz.max() < 5 and abs(uz.mean().item() - 1.5) < 0.05
    bern = torch.empty(n, device="tpu").bernoulli_(0.3).cpu()
    assert set(bern.unique().tolist()) <= {0.0, 1.0} and abs(bern.mean().item() - 0.3) < 0.01
    half = torch.randn(n, device="tpu", dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and abs(half.float().cpu().std().item() - 1) < 0.03


def test_dropout_keeps_expected_fraction_and_scales():
    torch.manual_seed(1)
    x = torch.ones(100_000, device="tpu")
    y = torch.nn.functional.dropout(x, p=0.25, training=True).cpu()
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.75) < 0.01
    torch.testing.assert_close(y[y != 0], torch.full_like(y[y != 0], 1 / 0.75))
    assert math.isclose(torch.nn.functional.dropout(x, p=0.25, training=False).cpu().sum().item(), 100_000)


def test_cpu_generator_seeds_device_draws():
    g = torch.Generator().manual_seed(42)
    a = torch.empty(1000, device="tpu").normal_(generator=g)
    g.manual_seed(42)
    b = torch.empty(1000, device="tpu").normal_(generator=g)
    assert torch.equal(a.cpu(), b.cpu())
    c = torch.empty(1000, device="tpu").normal_(generator=g)  # the generator advanced
    assert not torch.equal(b.cpu(), c.cpu())
