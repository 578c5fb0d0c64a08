"""torch.tpu.optimizers.Muon matches torch.optim.Muon on the CPU, in one executable per step."""

from __future__ import annotations

import pytest
import torch
from optimizer_support import paired_params, step_both

from torchtpu.optim import Muon

SHAPES = [(16, 8), (8, 24), (12, 12)]  # tall (transposed inside Newton-Schulz), wide, square


KWARGS = [
    dict(lr=0.02),
    dict(lr=0.05, nesterov=False, weight_decay=0.01, adjust_lr_fn="match_rms_adamw"),
    dict(lr=0.01, momentum=0.5, ns_steps=3, ns_coefficients=(3.0, -3.2, 1.2), eps=1e-5),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kwargs", KWARGS)
def test_muon_matches_torch(dtype, kwargs):
    cpu, tpu = paired_params(SHAPES, dtype)
    ref, opt = torch.optim.Muon(cpu, **kwargs), Muon(tpu, **kwargs)
    step_both(ref, opt, cpu, tpu, steps=3)
    # Newton-Schulz runs in bfloat16 on both sides and matches op by op, but the float32 sums inside
    # the matmuls add in another order: now and then one bfloat16 ulp of the update differs (x lr)
    tol = dict(atol=3e-4, rtol=1e-3) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for pc, pt in zip(cpu, tpu):
        torch.testing.assert_close(pt.detach().cpu(), pc.detach(), **tol)
        torch.testing.assert_close(opt.state[pt]["momentum_buffer"].cpu(), ref.state[pc]["momentum_buffer"], **tol)
    assert opt.executables_built == 1


def test_muon_lr_schedule_does_not_recompile_and_state_dict_is_torchs():
    cpu, tpu = paired_params(SHAPES, torch.float32)
    ref, opt = torch.optim.Muon(cpu, lr=0.02), Muon(tpu, lr=0.02)
    step_both(ref, opt, cpu, tpu, steps=4, lrs=[0.02, 0.015, 0.01, 0.005])
    assert opt.executables_built == 1
    for pc, pt in zip(cpu, tpu):
        torch.testing.assert_close(pt.detach().cpu(), pc.detach(), atol=3e-4, rtol=1e-3)
    sd = opt.state_dict()
    assert sd["param_groups"][0].keys() == ref.state_dict()["param_groups"][0].keys()
    fresh = Muon([p for p in tpu], lr=0.02)
    fresh.load_state_dict(sd)
    torch.testing.assert_close(
        fresh.state[tpu[0]]["momentum_buffer"].cpu(), ref.state[cpu[0]]["momentum_buffer"], atol=3e-4, rtol=1e-3
    )


def test_muon_errors_like_torch():
    with pytest.raises(ValueError, match="Muon only supports 2D parameters"):
        Muon([torch.zeros(3, device="tpu", requires_grad=True)])
    with pytest.raises(ValueError, match="Adjust learning rate function"):
        Muon([torch.zeros(3, 3, device="tpu", requires_grad=True)], adjust_lr_fn="other")
    p = torch.zeros(3, 3, requires_grad=True)
    p.grad = torch.ones(3, 3)
    with pytest.raises(RuntimeError, match="update tpu tensors only"):
        Muon([p]).step()
    assert torch.tpu.optimizers.Muon is Muon
