"""Small cats and stacks of new signatures concatenate on the host (eager/host_cat.py, XLA:CPU): the
CPU's values bit for bit, its shapes and strides (channels_last kept), its errors, and no XLA compile
per list of shapes; a signature called often, or a big result, gets the engine's exact program."""

import pytest
import torch

import torchtpu
from torchtpu.eager import host_cat, tpu_check

DEV = "tpu"


def _cases(x, y, z, m):
    return [
        torch.cat([x, y]),
        torch.cat([x, y, x[1:]], 0),
        torch.cat([x.t(), y.t()], dim=-1),  # permuted inputs
        torch.cat([x[:, 1:3], x[:, ::2]], 1),  # partial and strided views
        torch.stack([x, x * 1, x], 1),
        torch.hstack([x, x]),
        torch.vstack([x, y]),
        torch.dstack([x, x]),
        torch.cat([z, z], 1),  # channels_last stays channels_last
        torch.cat([z, z[:1]], 0),
        torch.stack([z, z], 2),
        torch.cat([m, m[:, :0]], 1),  # an empty piece
        torch.cat([x[:0], y[:0]]),  # an empty result
        torch.cat([m > 0, m < 0], 1),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_small_cats_match_the_cpu_without_a_compile(dtype, xla_compiles):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 7, generator=gen).mul(50).to(dtype), torch.randn(2, 7, generator=gen).mul(50).to(dtype)
    z = torch.randn(2, 3, 5, 4, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
    m = torch.randn(4, 3, generator=gen).to(dtype)
    moved = [t.to(DEV) for t in (x, y, z, m)]
    torch.tpu.synchronize()
    before = xla_compiles()
    got = _cases(*moved)
    if not tpu_check.enabled():
        # (`x * 1` and the comparisons are flat-bucketed elementwise ops: at most one program each)
        assert xla_compiles() - before <= 3
    for g, w in zip(got, _cases(x, y, z, m)):
        assert g.shape == w.shape and g.stride() == w.stride() and g.dtype == w.dtype
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)


def test_errors_are_the_cpus_types():
    a, b = torch.randn(2, 3), torch.randn(2, 4)
    for f in (lambda p, q: torch.cat([p, q]), lambda p, q: torch.stack([p, q]), lambda p, q: torch.cat([p, q], 2)):
        with pytest.raises(Exception) as cpu:
            f(a, b)
        with pytest.raises(type(cpu.value)):  # (the engine's error: PyTorch's meta kernel words cat's other)
            f(a.to(DEV), b.to(DEV))
    with pytest.raises(RuntimeError, match="same device"):
        torch.cat([a.to(DEV), a], 1)


def test_a_hot_signature_and_a_big_result_get_the_exact_program(monkeypatch):
    x = torch.randn(5, 9)
    t = x.to(DEV)
    want = torch.cat([x, x[:2]])
    built = lambda: torchtpu.metrics()["eager_compiles"]  # (engine builds: the disk cache may hold the programs)
    before = built()
    for _ in range(host_cat.TIER_UP + 2):
        torch.testing.assert_close(torch.cat([t, t[:2]]).cpu(), want, rtol=0, atol=0)
    if not tpu_check.enabled():
        assert built() - before == 1  # (the engine's exact program, after TIER_UP calls)
    monkeypatch.setattr(host_cat, "HOST_BYTES", 64)
    before = built()
    torch.testing.assert_close(torch.stack([t, t], 2).cpu(), torch.stack([x, x], 2), rtol=0, atol=0)
    assert built() - before == 1
