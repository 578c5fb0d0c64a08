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
    try:   # (the timer fires once: an interrupt after the loop, before disarming it, is caught too)
        signal.setitimer(signal.ITIMER_REAL, 0.002 + random.random() * 0.02)
        for _ in range(300):
            x.add_(1)
            done += 1
        signal.setitimer(signal.ITIMER_REAL, 0)
    except KeyboardInterrupt:
        interrupts += 1
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
def net():
    return torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 1))
cpu = net()
cpu[4].requires_grad_(False)   # a frozen layer: must stay exactly as it was
dev = net().to("tpu")
dev.load_state_dict(cpu.state_dict())
dev[4].requires_grad_(False)
trained = [n for n, p in cpu.named_parameters() if p.requires_grad]   # 4 tensors, one update op each
data = [(torch.randn(32, 32), torch.randn(32, 1)) for _ in range(4)]
def make_opt(model):
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
def step(model, opt, k, device):
    x, y = data[k % 4]
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
    opt.step()
opt = make_opt(dev)
# warm up on a copy (same shapes, same executables): an interrupt inside a first-time import or trace
# of JAX's own modules leaves JAX half-imported, a failure of JAX's (not of a tensor)
import copy, time
warm = copy.deepcopy(dev)
warm_opt = make_opt(warm)
for k in range(2):
    step(warm, warm_opt, k, "tpu")
    [p.cpu() for p in warm.parameters()]
times = []
for _ in range(3):   # (the fused mode compiles the segments of this pattern in the first rounds)
    t0 = time.perf_counter()
    for k in range(3):
        step(warm, warm_opt, k, "tpu")
    [p.cpu() for p in warm.parameters()]
    times.append(time.perf_counter() - t0)
# the timer fires within a round's first three steps, at a random point, however loaded the machine is
step_time = min(times) / 3
def ki(*a): raise KeyboardInterrupt
signal.signal(signal.SIGALRM, ki)
done = partial = applied = interrupts = 0
for t in range(12):
    start = {n: p.detach().cpu() for n, p in dev.named_parameters()}
    calls = 0
    try:   # (the timer fires once: an interrupt after the loop, before disarming it, is caught too)
        signal.setitimer(signal.ITIMER_REAL, 0.001 + random.random() * 3 * step_time)
        for _ in range(6):
            step(dev, opt, done + calls, "tpu")
            calls += 1
        signal.setitimer(signal.ITIMER_REAL, 0)
    except KeyboardInterrupt:
        interrupts += 1
        # PyTorch's optimizer turns grad mode off for its step and back on in a `finally` that first
        # calls torch._dynamo.graph_break(): an interrupt landing there leaves it off, on any device
        torch.set_grad_enabled(True)
    got = {n: p.detach().cpu() for n, p in dev.named_parameters()}   # every parameter readable
    # CPU replay of this round from the same start: `calls` completed steps, then the one that was
    # running when the interrupt came (it may have completed before `calls += 1`, or partly: SGD
    # updates one tensor per op). Each tensor must be its value after `calls` or after `calls + 1`
    # steps; the next round starts from the device's state, so rounding differences do not accumulate.
    ref = net()
    ref.load_state_dict(start)
    ref[4].requires_grad_(False)
    ref_opt = make_opt(ref)
    for k in range(calls):
        step(ref, ref_opt, done + k, "cpu")
    before = {n: p.detach().clone() for n, p in ref.named_parameters()}
    step(ref, ref_opt, done + calls, "cpu")
    after = dict(ref.named_parameters())
    which = set()
    for n in got:
        if n not in trained:
            assert torch.equal(got[n], start[n]), n
            continue
        d_before = (got[n] - before[n]).abs().max().item()
        d_after = (got[n] - after[n].detach()).abs().max().item()
        assert min(d_before, d_after) < 1e-4, (t, n, calls, d_before, d_after)
        which.add(d_after < d_before)
    done += calls
    if which == {True}:      # the running step completed (before `calls += 1` was reached)
        done += 1
        applied += 1
    elif len(which) == 2:    # the interrupt landed between two tensors' updates: a partial step, as on the CPU
        partial += 1
        done += 1            # (the next round's replay starts from the device's state anyway)
assert all(bool(torch.isfinite(p.detach().cpu()).all()) for p in dev.parameters())
print("OK", done, interrupts, applied, partial)
"""


def _run(code, *modes):
    """`code` once per mode, in that order, in one child (its own globals each time): the imports and
    the device start are paid once."""
    env = dict(
        os.environ,
        PYTHONPATH=os.path.abspath(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        TORCHTPU_FUSED_COMPILE="now",
    )
    script = "".join(
        f"exec({textwrap.dedent(code).replace('MODE', repr(mode))!r}, {{'__name__': '__main__'}})\n" for mode in modes
    )
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode == -6 and "terminate called without an active exception" in proc.stderr:
        # seen rarely before, not reproduced since (docs/design.md: what the message means, what was
        # contained); what this test checks (no tensor left damaged) it cannot tell then
        pytest.xfail("SIGABRT: 'terminate called without an active exception' (docs/design.md)")
    assert proc.returncode == 0 and proc.stdout.count("OK") == len(modes), proc.stdout[-2000:] + proc.stderr[-4000:]


# [strict] alone runs under `-m slow`: by default [fused] runs the strict loop first in the same child
# (then the fused one), so both modes are checked with one interpreter start.
_MODES = [pytest.param("strict", marks=pytest.mark.slow), "fused"]


def _modes(mode):
    return ("strict", "fused") if mode == "fused" else (mode,)


@pytest.mark.parametrize("mode", _MODES)
def test_interrupted_in_place_loop_keeps_whole_updates(mode):
    _run(ADD_LOOP, *_modes(mode))


@pytest.mark.parametrize("mode", _MODES)
def test_interrupted_training_matches_a_cpu_replay_of_the_completed_ops(mode):
    _run(TRAIN_LOOP, *_modes(mode))


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
import gc, signal, _thread, torch, torchtpu
# Python's own Ctrl-C handler, whatever this process inherited: a job started in the background
# ignores SIGINT, and then interrupt_main() does nothing
signal.signal(signal.SIGINT, signal.default_int_handler)
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


# ---------------------------------------------------------------- an exception at each line of the queue
# A signal handler's exception (a test runner's SIGALRM time limit raising TimeoutError, Ctrl-C) lands
# between any two lines. A trace function raises one at the k-th line that eager/fusion.py runs, for
# each k in turn: deterministic, and every line of defer/_flush/_run_segment/_undo is hit. Afterwards
# the device works, tensors made before or after are whole, and a synchronize raises nothing. (Once,
# an exception right after _flush marked its segment done left that segment open: every later op was
# queued into a segment that never ran, and every tensor of the process after it had "no value".)


class _Injected(Exception):
    pass


def _raise_at(k, functions):
    import linecache

    from torchtpu.eager import fusion

    count = [0]

    def local(frame, event, arg):
        # (not at a `try:` or a `with` line: Python raises a trace function's exception there outside
        # the try's handlers, or after the with block, outside its __exit__ (a lock left held), where
        # a signal handler, run only at calls and backward jumps, never lands)
        text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        if event == "line" and text != "try:" and not text.startswith("with "):
            count[0] += 1
            if count[0] == k:
                raise _Injected(k)
        return local

    def start(frame, event, arg):
        code = frame.f_code
        if code.co_filename == fusion.__file__ and (functions is None or code.co_name in functions):
            return local
        return None

    return start, count


def _sweep(functions, every=1):
    import torch

    import torchtpu
    from torchtpu.eager import fusion

    a_cpu = torch.randn(64)
    with torchtpu.eager_mode("fused"):
        a = a_cpu.to("tpu")

        def work(out):  # new tensors, in-place writes, reads: several segments
            out["y"] = y = a * 2
            y.add_(1)
            out["z"] = z = (y * a).sum()
            out["zc"] = z.cpu()

        for _ in range(4):  # warm: the ops are queued, not run at once as cold ops are
            work({})
        k, interrupted = 0, 0
        while True:
            k += every
            before = torch.arange(8.0, device="tpu") + 1
            start, count = _raise_at(k, functions)
            out = {}
            sys.settrace(start)
            try:
                work(out)
            except _Injected:
                interrupted += 1
            finally:
                sys.settrace(None)
            if count[0] < k:  # ran to the end without reaching line k: every line was hit
                break
            assert not fusion._lock._is_owned(), k
            torch.tpu.synchronize()
            # every tensor the interrupted work made has its value: none is lost
            if "y" in out:
                assert torch.equal(out["y"].cpu(), a_cpu * 2 + 1) or torch.equal(out["y"].cpu(), a_cpu * 2), k
            assert torch.equal(a.cpu(), a_cpu), k
            assert torch.equal(before.cpu(), torch.arange(8.0) + 1), k
            after = {}
            work(after)
            torch.testing.assert_close(after["zc"], ((a_cpu * 2 + 1) * a_cpu).sum())
    return interrupted


def test_an_exception_at_any_line_of_flush_loses_no_tensor(monkeypatch):
    # (the lines of the flush itself, segments run op by op: compiling none saves ~1 s of CPU; every
    # line of the module, compiled segments too: the slow test below)
    from torchtpu.eager import fusion

    monkeypatch.setattr(fusion, "COMPILE_AT", 1 << 30)
    assert _sweep(("_flush", "_run_segment", "_give_up", "_undo", "flush", "get")) > 10


@pytest.mark.slow
def test_an_exception_at_any_line_of_the_queue_loses_no_tensor():
    assert _sweep(None) > 50


def test_a_segment_that_keeps_failing_loses_only_its_own_results(monkeypatch):
    import torch

    import torchtpu
    from torchtpu.eager import fusion

    with torchtpu.eager_mode("fused"):
        x = torch.zeros(64, device="tpu")
        unrelated = torch.ones(64, device="tpu") * 2

        def step():
            y = x * 2
            x.add_(1)
            return y * x

        for _ in range(4):  # warm
            step()
            torch.tpu.synchronize()
        x.zero_()
        runs = [0]

        def failing(*args):
            runs[0] += 1
            raise RuntimeError("the steps failed")

        monkeypatch.setattr(fusion, "_run", failing)
        lost = step()
        with pytest.raises(RuntimeError, match="the steps failed"):
            lost.cpu()
        assert runs[0] == fusion.ATTEMPTS  # run again before giving it up (an interrupt does not recur)
        monkeypatch.undo()
        with pytest.raises(RuntimeError, match="no value"):
            lost.cpu()
        torch.tpu.synchronize()  # the given-up result, still held, is not waited for: nothing raised
        assert x.cpu().tolist() == [0.0] * 64  # its write was undone
        assert unrelated.cpu().tolist() == [2.0] * 64
        x.fill_(1)
        assert step().cpu().tolist() == [4.0] * 64  # the device keeps working
        assert x.cpu().tolist() == [2.0] * 64


def test_an_interrupted_run_completes_the_segment_and_raises_after(monkeypatch):
    import torch

    import torchtpu
    from torchtpu.eager import fusion

    with torchtpu.eager_mode("fused"):
        x = torch.arange(64.0, device="tpu")
        for _ in range(4):
            (x * 2 * x).cpu()
        run, calls = fusion._run, [0]

        def interrupted_once(*args):
            calls[0] += 1
            if calls[0] == 1:
                raise TimeoutError("test ran over 120 s")  # what a SIGALRM handler raises
            return run(*args)

        monkeypatch.setattr(fusion, "_run", interrupted_once)
        y = x * 2 * x
        with pytest.raises(TimeoutError):
            torch.tpu.synchronize()
        monkeypatch.undo()
        assert calls[0] == 2
        assert y.cpu().tolist() == [2.0 * i * i for i in range(64)]  # computed all the same


def test_a_signal_handlers_exception_in_a_weakref_callback_is_raised_at_the_next_op():
    # (a SIGALRM time limit raising TimeoutError inside a storage's weakref callback or JAX's gc
    # callback: Python prints "Exception ignored" and the test would run on past its limit)
    import signal
    import weakref

    import torch

    def handler(*_):
        raise TimeoutError("test ran over its limit")

    def spin():  # a Python call: the pending handler runs here, inside the callback
        return None

    x = torch.ones(2, device="tpu")
    previous = signal.signal(signal.SIGUSR1, handler)
    try:

        class Obj:
            pass

        o = Obj()
        ref = weakref.ref(o, lambda _: (signal.raise_signal(signal.SIGUSR1), spin()))
        del o
        with pytest.raises(TimeoutError, match="over its limit"):
            x + 1
        assert ref() is None
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert (x + 1).cpu().tolist() == [2.0, 2.0]


def test_a_jax_cache_left_in_progress_by_an_interrupt_is_cleared_and_the_segment_runs(monkeypatch):
    """An interrupt landing in JAX's weakref_lru_cache bookkeeping can leave an entry in progress for
    good: every later call of that program raised RecursionError("Recursively calling ...") (seen once
    in the fused Ctrl-C loop above). The segment's call clears JAX's caches and is made again."""
    import types

    import jax

    from torchtpu.eager import fusion

    cleared, calls = [], []
    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(1))

    def fn(external, scalars):
        calls.append(1)
        if len(calls) == 1:
            raise RecursionError("Recursively calling <weakref at 0x1; to 'Jaxpr' at 0x2>()")
        return ("values",)

    segment = types.SimpleNamespace(external=())
    assert fusion._run(fn, None, None, None, segment, []) == ("values",)
    assert cleared == [1] and len(calls) == 2

    def deep(external, scalars):  # any other RecursionError is not ours to hide
        raise RecursionError("maximum recursion depth exceeded")

    with pytest.raises(RecursionError, match="maximum recursion"):
        fusion._run(deep, None, None, None, segment, [])
    assert cleared == [1]
