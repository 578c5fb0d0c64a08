"""Entries served through shared programs (eager/bucketed_draws.py TieringStandIn: bucketed draws,
bucketed index writes, dense operands, flat buckets) tier up to their own program without replacing
the entry's function: a fused loop's segment stays the one segment when strict-mode calls in
between tier its ops up (a bucketed draw or index write compiled a second segment and ran op by op),
with the same results. (Dense operands and flat buckets: test_fused_mode's strict stretch.)"""

import pytest
import torch

import torchtpu
from torchtpu.eager import bucketed_draws, fusion, stand_ins


def _count(name):
    return torchtpu.metrics()[name]


def _steps(kind, n):
    """A step (new shapes per test: its ops build stand-ins, not reused entries) and its CPU result."""
    g = torch.Generator().manual_seed(n)
    x, idx, src = torch.randn(n, 4, generator=g), torch.randint(0, n, (7,), generator=g), torch.randn(7, 4, generator=g)
    if kind == "draw":
        return lambda: (torch.rand(n, 5, device="tpu") * 2 + 1).sum(0).cpu(), None
    dx, didx, dsrc = x.to("tpu"), idx.to("tpu"), src.to("tpu")
    return lambda: (dx * 1.5).index_add_(0, didx, dsrc).sum(0).cpu(), (x * 1.5).index_add_(0, idx, src).sum(0)


@pytest.mark.parametrize("kind", ["draw", "index"])
def test_strict_calls_that_tier_an_op_up_keep_the_fused_segment(monkeypatch, kind):
    monkeypatch.setattr(bucketed_draws, "HOST_TIER_UP", stand_ins.TIER_UP)  # (a draw on the host waits longer)
    monkeypatch.setattr(fusion, "COMPILE", "now")  # (compiled in the flush that decides to: exact counts)
    step, want = _steps(kind, {"draw": 29, "index": 31}[kind])
    with torchtpu.eager_mode("fused"):
        # first calls, cold ops, then the segment's runs (one that draws compiles later)
        for _ in range((fusion.COMPILE_AT_DRAWS if kind == "draw" else fusion.COMPILE_AT) + 2):
            torch.manual_seed(3)
            first = step()
        compiles, runs = _count("fused_compiles"), _count("fused_runs")
        with torchtpu.eager_mode("strict"):
            for _ in range(stand_ins.TIER_UP + 2):  # the entries tier up
                torch.manual_seed(3)
                torch.testing.assert_close(step(), first)  # (a segment may round the sum otherwise)
        for _ in range(2):
            torch.manual_seed(3)
            assert torch.equal(step(), first)
    assert _count("fused_compiles") == compiles and _count("fused_runs") - runs == 2
    if want is not None:
        torch.testing.assert_close(first, want)
