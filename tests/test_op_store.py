"""The op-key cache (eager/op_store.py): eager executables loaded from disk without a trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import torchtpu
from torchtpu.compile.options import set_persistent_cache
from torchtpu.eager import build, dense_operands, flat_buckets, limits, op_store, persistent_cache, stand_ins


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh on-disk cache in tmp_path, no executable in memory, and a count of traces."""
    before = dict(persistent_cache._state)
    set_persistent_cache(tmp_path / "xla", min_compile_time_s=0.0)
    limits.forget_executables()
    # (small elementwise ops of new shapes share a flat program per size bucket, which is not stored:
    # these tests are about the ops' own stored executables)
    monkeypatch.setattr(flat_buckets, "HOST_BYTES", 0)
    traces = []
    real = build._options_jit

    def counted(*args):
        traces.append(1)
        return real(*args)

    monkeypatch.setattr(build, "_options_jit", counted)
    yield tmp_path / "xla" / op_store.SUBDIR, traces
    set_persistent_cache(before["cache_dir"], min_compile_time_s=persistent_cache.DEFAULT_MIN_COMPILE_TIME_S)
    persistent_cache._state.update(before)  # (not chosen yet: the default at the next build)
    limits.forget_executables()


def _ops(t):
    # (no matmul: its first trace makes the matmul precision part of its engine key in this process, so
    # "as a new process" it would miss; test_a_second_process_hits_bitwise has one)
    return [(t * 2.5 + 1).exp(), t.sum(1), t[1:3].softmax(-1), torch.cumsum(t, 0), torch.where(t > 0, t, -t)]


def _counts():
    m = torchtpu.metrics()
    return m["op_store_hits"], m["op_store_writes"], m["op_store_errors"]


def test_a_new_process_loads_what_the_first_stored_bitwise_without_tracing(store):
    where, traces = store
    x = torch.randn(5, 7)
    hits0, writes0, _ = _counts()
    first = [r.cpu() for r in _ops(x.to("tpu"))]
    hits1, writes1, _ = _counts()
    assert writes1 - writes0 >= 5 and hits1 == hits0 and len(os.listdir(where)) == writes1 - writes0
    limits.forget_executables()  # (as a new process starts: no executable in memory)
    traces.clear()
    again = [r.cpu() for r in _ops(x.to("tpu"))]
    hits2, writes2, _ = _counts()
    assert hits2 - hits1 == writes1 - writes0 and writes2 == writes1 and not traces
    for a, b, cpu in zip(first, again, _ops(x)):
        assert torch.equal(a, b)
        torch.testing.assert_close(b, cpu)


def test_a_changed_static_argument_or_layout_misses(store):
    where, traces = store
    x = torch.randn(6, 4, device="tpu")
    torch.cumsum(x, 0).cpu()
    limits.forget_executables()
    _, writes0, _ = _counts()
    traces.clear()
    torch.testing.assert_close(torch.cumsum(x, 1).cpu(), torch.cumsum(x.cpu(), 1))  # another dim
    torch.testing.assert_close(torch.cumsum(x.T, 0).cpu(), torch.cumsum(x.cpu().T, 0))  # a transposed view
    torch.testing.assert_close(torch.cumsum(x.double(), 0).cpu(), torch.cumsum(x.cpu().double(), 0))
    _, writes1, _ = _counts()
    assert len(traces) >= 3 and writes1 - writes0 >= 3


def test_a_damaged_entry_is_dropped_and_the_op_built_as_usual(store):
    where, traces = store
    x = torch.randn(3, 9)
    expected = [r.cpu() for r in _ops(x.to("tpu"))]
    names = sorted(os.listdir(where))
    for i, name in enumerate(names):
        path = where / name
        data = bytearray(path.read_bytes())
        if i % 2:
            data[len(data) // 2] ^= 0xFF  # a flipped byte
        else:
            data = data[: len(data) // 3]  # cut short
        path.write_bytes(bytes(data))
    limits.forget_executables()
    _, _, errors0 = _counts()
    traces.clear()
    got = [r.cpu() for r in _ops(x.to("tpu"))]
    _, _, errors1 = _counts()
    assert errors1 - errors0 == len(names) and len(traces) == len(names)
    for a, b in zip(expected, got):
        assert torch.equal(a, b)
    limits.forget_executables()  # the rebuilt ones were stored again, whole
    traces.clear()
    assert all(torch.equal(a, b.cpu()) for a, b in zip(expected, _ops(x.to("tpu")))) and not traces


def test_a_time_limit_landing_in_a_load_is_raised_and_the_entry_kept(store, monkeypatch):
    """A signal handler's exception (a test runner's SIGALRM time limit) that lands while an entry is
    read is not damage: it was taken for it, the entry removed, and the limit lost (whisper's long-form
    tests ran on past their 150 s)."""
    import pickle
    import signal

    where, traces = store
    x = torch.randn(4, 3)
    expected = (x.to("tpu") * 2.5).cpu()
    entries = sorted(os.listdir(where))
    limits.forget_executables()
    traces.clear()

    def timed_out(signum, frame):
        raise TimeoutError("test ran over its limit")

    def interrupted_loads(data):
        signal.raise_signal(signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, timed_out)
    monkeypatch.setattr(pickle, "loads", interrupted_loads)
    try:
        with pytest.raises(TimeoutError):
            (x.to("tpu") * 2.5).cpu()
    finally:
        signal.signal(signal.SIGALRM, previous)
        monkeypatch.undo()
    assert sorted(os.listdir(where)) == entries
    assert torch.equal((x.to("tpu") * 2.5).cpu(), expected) and not traces


def test_another_device_with_the_same_key_runs_through_jax_jit(store):
    where, traces = store
    if torch.tpu.device_count() < 2:
        pytest.skip("one device")
    a = torch.randn(4, 5, device="tpu:0")
    torch.testing.assert_close((a * 3).cpu(), a.cpu() * 3)
    b = a.to("tpu:1")
    r = b * 3
    assert r.device == torch.device("tpu:1")
    torch.testing.assert_close(r.cpu(), a.cpu() * 3)


def test_off_without_a_cache_directory_and_under_the_tpu_compile_check(store, monkeypatch):
    set_persistent_cache(None)
    assert op_store.directory() is None
    set_persistent_cache(store[0].parent)
    assert op_store.directory() is not None
    monkeypatch.setattr(build.tpu_check, "enabled", lambda: True)
    assert op_store.directory() is None


def test_keys_hold_only_values_whose_text_identifies_them():
    assert op_store.text((0.0, 1, True, torch.float32)) != op_store.text((-0.0, 1, True, torch.float32))
    assert op_store.text((1,)) != op_store.text((True,)) != op_store.text((1.0,))
    with pytest.raises(op_store.Unkeyable):
        op_store.text((object(),))
    with pytest.raises(op_store.Unkeyable):
        op_store.text((torch.Tensor,))


_CHILD = r"""
import json, sys, torch, torchtpu
from torchtpu.eager import build
traces = []
real = build._options_jit
build._options_jit = lambda *a: (traces.append(1), real(*a))[1]
x = torch.load(sys.argv[1]).to("tpu")
out = [(x * 2.5 + 1).exp(), x.sum(1), x[1:3].softmax(-1), x @ x.T, torch.linalg.qr(x)[1]]  # (QR: LAPACK)
torch.save([r.cpu() for r in out], sys.argv[2])
print(json.dumps({"hits": torchtpu.metrics()["op_store_hits"], "traces": len(traces)}))
"""


@pytest.mark.slow  # (a QR's first compile: 2-8 s of CPU on the loaded VM)
def test_a_loaded_program_that_calls_lapack_initializes_it_first(store, monkeypatch):
    """A QR loaded from disk skips JAX's lowering, which is where jaxlib's LAPACK kernels get their
    function pointers: run so in a new process, it segfaulted. The load initializes them first."""
    from jax._src.lax import linalg

    where, traces = store
    calls = []
    monkeypatch.setattr(op_store, "_lapack_ready", [])
    monkeypatch.setattr(linalg, "initialize_lapack", lambda real=linalg.initialize_lapack: (calls.append(1), real()))
    x = torch.randn(6, 4)
    first = torch.linalg.qr(x.to("tpu"))[1].cpu()
    (x.to("tpu") * 2).cpu()
    assert not calls  # (compiled here: JAX's lowering initialized LAPACK)
    limits.forget_executables()
    traces.clear()
    again = [torch.linalg.qr(x.to("tpu"))[1].cpu(), (x.to("tpu") * 2).cpu()]
    assert not traces and len(calls) == 1, (traces, calls)  # (once, and not for a program without LAPACK)
    assert torch.equal(first, again[0])
    torch.testing.assert_close(again[0].abs(), torch.linalg.qr(x)[1].abs())


@pytest.mark.slow  # (two new processes: ~12 s of CPU)
def test_a_second_process_hits_bitwise(tmp_path):
    """Two processes: the second loads every executable the first stored, traces none, same bits."""
    from torchtpu.device import native

    env = dict(os.environ, TORCHTPU_COMPILE_CACHE="1", TORCHTPU_COMPILE_CACHE_DIR=str(tmp_path / "xla"))
    native._cache_dir().mkdir(parents=True, exist_ok=True)  # (share this process's C++ build)
    (tmp_path / "native").symlink_to(native._cache_dir(), target_is_directory=True)
    torch.save(torch.randn(4, 6), tmp_path / "x.pt")
    runs = []
    for i in range(2):
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, str(tmp_path / "x.pt"), str(tmp_path / f"out{i}.pt")],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0]["hits"] == 0 and runs[0]["traces"] >= 4, runs
    assert runs[1]["hits"] >= 4 and runs[1]["traces"] == 0, runs
    first, second = torch.load(tmp_path / "out0.pt"), torch.load(tmp_path / "out1.pt")
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_the_key_ignores_environment_variables_torchtpu_does_not_read(monkeypatch):
    import jax.numpy as jnp

    dyn = (jnp.ones((2, 3)), 1.5)
    monkeypatch.setitem(op_store._state, "process", None)
    first = op_store.key(("aten::add.Tensor", ()), dyn)
    monkeypatch.setenv("TORCHTPU_TESTS_RESULTS", "/tmp/another-run")  # (a test runner's, per run)
    monkeypatch.setitem(op_store._state, "process", None)
    assert op_store.key(("aten::add.Tensor", ()), dyn)[0] == first[0]
    monkeypatch.setenv("TORCHTPU_CPU_FALLBACK", "1")  # (one torchtpu reads)
    monkeypatch.setitem(op_store._state, "process", None)
    assert op_store.key(("aten::add.Tensor", ()), dyn)[0] != first[0]
    now = op_store.key(("aten::add.Tensor", ()), dyn)[0]
    assert op_store.key(("aten::add.Tensor", ()), (dyn[0], 2))[0] != now  # another argument type


def test_a_flat_bucketed_op_loads_its_own_stored_program_in_a_new_process(store, monkeypatch):
    """Small elementwise ops of new shapes run through a flat bucket's shared program (eager/flat_buckets.py),
    but where the op-key cache holds the op's own program (stored by an earlier process) that is loaded
    at the first call, with no trace: a warm process must not trace and lower the buckets instead."""
    where, traces = store
    x = torch.randn(6, 5)
    ops = lambda t: [t * 2.5, t + 1, torch.where(t > 0, t, t * 3)]
    first = [r.cpu() for r in ops(x.to("tpu"))]  # stored (flat buckets off in the fixture)
    _, writes1, _ = _counts()
    limits.forget_executables()
    monkeypatch.setattr(flat_buckets, "HOST_BYTES", 1 << 16)
    traces.clear()
    hits0, _, _ = _counts()
    again = [r.cpu() for r in ops(x.to("tpu"))]
    hits1, writes2, _ = _counts()
    assert hits1 - hits0 >= 4 and writes2 == writes1 and not traces
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_a_loaded_program_is_called_through_its_cpp_call(store, monkeypatch):
    """A program the op store loads for a stand-in is called, after its first call, through the C++
    call that call made, not through jax.stages.Compiled.__call__ (one more Python frame, ~0.7 µs, on
    every eager call in a warm process)."""
    import jax

    from torchtpu.eager import engine

    x_c = torch.randn(6, 5)
    x = x_c.to("tpu")
    (x * 2.5).cpu()  # stored (flat buckets off in the fixture)
    limits.forget_executables()
    monkeypatch.setattr(flat_buckets, "HOST_BYTES", 1 << 16)
    hits0 = _counts()[0]
    out = [x * 2.5 for _ in range(3)]
    assert _counts()[0] > hits0
    kernel = next(k for k in engine._KERNELS if k.name == "mul.Tensor")
    loaded = [e.fn.own for e in kernel.cache.values() if getattr(e.fn, "own", None)]
    assert loaded and not any(isinstance(s.call, jax.stages.Compiled) for s in loaded)
    for r in out:
        torch.testing.assert_close(r.cpu(), x_c * 2.5)


def test_an_op_on_dense_operands_loads_every_program_in_a_new_process(store, monkeypatch):
    """Small strided operands made dense per layout share the op's program across layouts
    (eager/dense_operands.py). The shared program is stored under the name of the entry that built
    it, and an entry that tiered up stores its own: a new process meeting the same layouts loads
    them all, with no trace (a warm process traced and lowered them again)."""
    _, traces = store
    served = []
    real = dense_operands.DenseOperands.__call__
    monkeypatch.setattr(dense_operands.DenseOperands, "__call__", lambda self, *d: served.append(1) or real(self, *d))
    gen = torch.Generator().manual_seed(7)
    y = torch.randn(7, 5, generator=gen)
    bases = [torch.randn(5, 7, generator=gen), torch.randn(5, 14, generator=gen), torch.randn(10, 7, generator=gen)]
    views = [lambda t: t.t(), lambda t: t[:, ::2].t(), lambda t: t[::2].t()]  # three layouts, one dense form

    def run():
        ty = [y.to("tpu")]
        got = [(v(b.to("tpu")) + ty[0]).cpu() for v, b in zip(views, bases)]
        for _ in range(stand_ins.TIER_UP + 1):  # this entry tiers up (new buffers: no memo): its own program
            again = (views[2](bases[2].to("tpu")) + ty[0]).cpu()
        return [*got, again]

    with torchtpu.eager_mode("strict"):  # (op by op: the fused mode would run the loop as a segment)
        first = run()
    assert len(served) > stand_ins.TIER_UP
    _, writes1, _ = _counts()
    limits.forget_executables()  # (as a new process starts: no executable in memory)
    traces.clear()
    hits0, _, errors0 = _counts()
    with torchtpu.eager_mode("strict"):
        again = run()
    hits1, writes2, errors1 = _counts()
    assert not traces and writes2 == writes1 and hits1 - hits0 >= 4 and errors1 == errors0
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    for got, v, b in zip(first, [*views, views[2]], [*bases, bases[2]]):
        torch.testing.assert_close(got, v(b) + y)


def test_threads_calling_with_other_argument_types_while_one_moves_to_jit(monkeypatch):
    """A stored executable called with other argument types moves to JAX's jit (a trace). Threads
    whose call of the old executable failed meanwhile retried nothing and raised JAX's TypeError
    ("compiled with int64[] and called with float64[]"): the signature was dropped before the trace."""
    import threading
    import time

    import jax
    import numpy as np

    class Entry:
        xla = None

    def fn(x, s):
        return x * s

    x = jax.numpy.ones((4,), np.float32)
    stored = build._Stored(Entry(), "fn", fn, (None, ()), {})
    stored.call = jax.jit(fn).lower(x, np.int64(2)).compile()
    stored.signature = op_store.signature((x, np.int64(2)))
    real = build._options_jit
    tracing = threading.Event()

    def slow(*args):
        tracing.set()
        time.sleep(0.3)
        return real(*args)

    monkeypatch.setattr(build, "_options_jit", slow)
    errors, results = [], []

    def call():
        try:
            results.append(np.asarray(stored(x, np.float64(0.5))))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    first = threading.Thread(target=call)
    first.start()
    tracing.wait(5)
    call()  # while the first thread traces
    first.join()
    assert not errors, errors
    for r in results:
        np.testing.assert_allclose(r, np.full((4,), 0.5, np.float32))
