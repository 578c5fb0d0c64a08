"""torch.tpu.optimizers: AdamW / SGD match torch.optim on CPU, in one executable per step."""

from __future__ import annotations

import copy

import jax
import pytest
import torch
from optimizer_support import paired_params, step_both

from torchtpu.optim import SGD, AdamW, Sgd

SHAPES = [(7, 5), (5,), (3, 4, 2)]


def _close(cpu, tpu, dtype):
    tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    for pc, pt in zip(cpu, tpu):
        torch.testing.assert_close(pt.detach().cpu(), pc.detach(), **tol)


ADAMW = [dict(), dict(weight_decay=0.1, amsgrad=True), dict(maximize=True, betas=(0.3, 0.9), eps=1e-6)]
SGDS = [
    dict(),
    dict(momentum=0.9),
    dict(momentum=0.9, nesterov=True, weight_decay=0.01),
    dict(momentum=0.5, dampening=0.3, maximize=True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kwargs", ADAMW)
def test_adamw_matches_torch(dtype, kwargs):
    cpu, tpu = paired_params(SHAPES, dtype)
    ref, opt = torch.optim.AdamW(cpu, lr=1e-2, **kwargs), AdamW(tpu, lr=1e-2, **kwargs)
    step_both(ref, opt, cpu, tpu, steps=4)
    _close(cpu, tpu, dtype)
    for pc, pt in zip(cpu, tpu):
        for k, v in ref.state[pc].items():
            tol = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
            torch.testing.assert_close(opt.state[pt][k].cpu(), v, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kwargs", SGDS)
def test_sgd_matches_torch(dtype, kwargs):
    cpu, tpu = paired_params(SHAPES, dtype)
    ref, opt = torch.optim.SGD(cpu, lr=0.1, **kwargs), Sgd(tpu, lr=0.1, **kwargs)
    step_both(ref, opt, cpu, tpu, steps=4)
    _close(cpu, tpu, dtype)


def test_one_executable_across_steps_and_lr_schedule():
    compiles = []

    def listener(event, duration, **kwargs):
        if "backend_compile" in event:
            compiles.append(event)

    cpu, tpu = paired_params(SHAPES, torch.float32)
    ref, opt = torch.optim.AdamW(cpu, lr=1e-2), AdamW(tpu, lr=1e-2)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        step_both(ref, opt, cpu, tpu, steps=1)
        assert opt.executables_built == 1 and compiles  # the listener sees XLA compiles
        compiles.clear()
        step_both(ref, opt, cpu, tpu, steps=5, seed=3, lrs=[1e-2, 5e-3, 2e-3, 1e-3, 3e-4])
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert opt.executables_built == 1
    assert compiles == []  # no XLA compile at all: lr and the step count are traced scalars
    _close(cpu, tpu, torch.float32)


def test_sgd_momentum_first_step_needs_no_second_executable():
    cpu, tpu = paired_params(SHAPES, torch.float32)
    ref, opt = torch.optim.SGD(cpu, lr=0.1, momentum=0.9), SGD(tpu, lr=0.1, momentum=0.9)
    step_both(ref, opt, cpu, tpu, steps=3, lrs=[0.1, 0.05, 0.01])
    assert opt.executables_built == 1
    _close(cpu, tpu, torch.float32)


def test_param_groups_mixed_states_and_params_without_grad():
    cpu, tpu = paired_params(SHAPES, torch.float32)
    groups = lambda ps: [{"params": ps[:1], "momentum": 0.9}, {"params": ps[1:], "lr": 0.3}]
    ref, opt = torch.optim.SGD(groups(cpu), lr=0.1), SGD(groups(tpu), lr=0.1)
    frozen_c, frozen_t = torch.randn(3), None
    frozen_t = frozen_c.to("tpu").requires_grad_()
    opt.add_param_group({"params": [frozen_t]})  # never gets a grad: skipped
    step_both(ref, opt, cpu, tpu, steps=2)
    _close(cpu, tpu, torch.float32)
    torch.testing.assert_close(frozen_t.detach().cpu(), frozen_c)
    assert frozen_t not in opt.state


def test_state_dict_round_trip_with_torch():
    cpu, tpu = paired_params(SHAPES, torch.float32)
    ref, opt = torch.optim.AdamW(cpu, lr=1e-2, amsgrad=True), AdamW(tpu, lr=1e-2, amsgrad=True)
    step_both(ref, opt, cpu, tpu, steps=2)
    sd = opt.state_dict()
    assert sd["state"][0].keys() == ref.state_dict()["state"][0].keys()
    assert sd["state"][0]["step"].device.type == "cpu" and float(sd["state"][0]["step"]) == 2
    # ours -> torch.optim on CPU, and torch.optim -> ours: both continue identically
    cpu2 = [p.detach().cpu().requires_grad_() for p in tpu]
    ref2 = torch.optim.AdamW(cpu2, lr=1e-2, amsgrad=True)
    ref2.load_state_dict(copy.deepcopy(sd))
    tpu2 = [p.detach().to("tpu").requires_grad_() for p in cpu]
    opt2 = AdamW(tpu2, lr=1e-2, amsgrad=True)
    opt2.load_state_dict(copy.deepcopy(ref.state_dict()))  # torch shares CPU "step" tensors
    assert opt2.state[tpu2[0]]["exp_avg"].device.type == "tpu"
    step_both(ref2, opt, cpu2, tpu, steps=2, seed=5)
    _close(cpu2, tpu, torch.float32)
    step_both(ref, opt2, cpu, tpu2, steps=2, seed=5)
    _close(cpu, tpu2, torch.float32)


def test_bad_params_are_clear_errors():
    with pytest.raises(RuntimeError, match="parameter 0 is on cpu"):
        p = torch.zeros(3, requires_grad=True)
        p.grad = torch.ones(3)
        SGD([p], lr=0.1).step()
    base = torch.zeros(4, 4, device="tpu")
    view = base[:, 1].requires_grad_()
    view.grad = torch.ones(4, device="tpu")
    with pytest.raises(RuntimeError, match="not a dense tensor covering its whole storage"):
        SGD([view], lr=0.1).step()
    with pytest.raises(ValueError, match="fused"):
        AdamW([torch.zeros(2, device="tpu", requires_grad=True)], fused=True)


def test_non_contiguous_grad_is_accepted():
    cpu, tpu = paired_params(SHAPES, torch.float32)
    ref, opt = torch.optim.SGD(cpu[:1], lr=0.1), SGD(tpu[:1], lr=0.1)
    g = torch.randn(5, 7)
    cpu[0].grad = g.t().contiguous()
    tpu[0].grad = g.to("tpu").t()
    ref.step(), opt.step()
    _close(cpu[:1], tpu[:1], torch.float32)


def test_public_names():
    optimizers = pytest.importorskip("torch.tpu.optimizers")
    assert optimizers.AdamW is AdamW and optimizers.Sgd is SGD and optimizers.SGD is SGD
    assert issubclass(AdamW, torch.optim.AdamW) and issubclass(SGD, torch.optim.Optimizer)


def test_failed_step_leaves_the_state_as_it_was():
    p = torch.randn(4, device="tpu", requires_grad=True)
    bad = torch.randn(4, requires_grad=True)  # on cpu: the step fails after p's group was prepared
    p.grad, bad.grad = torch.ones(4, device="tpu"), torch.ones(4)
    before = p.detach().cpu()
    adamw = AdamW([{"params": [p]}, {"params": [bad]}], lr=0.1)
    sgd = SGD([{"params": [p]}, {"params": [bad]}], lr=0.1, momentum=0.9)
    for opt in (adamw, sgd):
        with pytest.raises(RuntimeError, match="parameter 1 is on cpu"):
            opt.step()
    assert float(adamw.state[p]["step"]) == 0 and "momentum_buffer" not in sgd.state[p]
    torch.testing.assert_close(p.detach().cpu(), before)
