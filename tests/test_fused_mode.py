"""The "fused" eager mode (eager/fusion.py): queued ops, repeated stretches run as one executable."""

import copy
import gc
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch.testing import assert_close

import torchtpu
from torchtpu.eager import fastpath, fusion, limits
from torchtpu.eager.fusion import Pending
from torchtpu.storage.records import record_of


@pytest.fixture
def fused(monkeypatch):
    # segments compile in the flush that decides to (not on the background thread), so the counts
    # below are exact; test_background_compiles_keep_the_loop_running covers the default
    monkeypatch.setattr(fusion, "COMPILE", "now")
    with torchtpu.eager_mode("fused"):
        yield
    torchtpu.eager.fusion.flush_all()


def _count(name):
    return torchtpu.metrics()[name]


def _step(a, b):
    c = a @ b
    c.add_(1.5)
    c[:, 1:3] *= -2
    return torch.nn.functional.gelu(c).softmax(-1).sum(0)


def test_a_repeated_loop_compiles_one_executable_and_matches_cpu(fused):
    # shapes no other test uses: the counts below are those of a loop whose ops are new to the process
    # (pytest-xdist may have run another test's _step loop in this worker just before)
    a, b = torch.randn(17, 31), torch.randn(31, 7)
    expected = _step(a, b)
    da, db = a.to("tpu"), b.to("tpu")
    compiles = _count("fused_compiles")
    runs = _count("fused_runs")
    for _ in range(6):
        assert_close(_step(da, db).cpu(), expected)
    # 1st iteration: each op's first call runs directly; 2nd: each op runs directly again, outside
    # any segment (not queued recently: "cold"); 3rd, 4th: one segment, run op by op (fusion.COMPILE_AT);
    # 5th: compiled; 6th: reused
    assert _count("fused_compiles") - compiles == 1
    assert _count("fused_runs") - runs == 2


def _warm_loop():
    """_step's inputs on tpu and its CPU result, once the loop is warm (its segment compiled)."""
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    da, db = a.to("tpu"), b.to("tpu")
    for _ in range(fusion.COMPILE_AT + 2):  # (first calls, cold ops, then the segment's runs)
        _step(da, db).cpu()
    return da, db, _step(a, b)


@pytest.mark.skipif(not fastpath.loaded(), reason="the C++ fast path is not built here")
def test_the_cpp_queue_makes_the_segments_the_python_queue_makes(fused):
    # the fast path queues a loop's warm calls itself (csrc/fast_kernel.cpp queue); OpKernel._run
    # queues the rest, and all of them when it is off: either way the same segment, so switching
    # between them compiles nothing new, and results match the CPU's
    da, db, expected = _warm_loop()
    compiles, runs = _count("fused_compiles"), _count("fused_runs")
    was = fastpath.set_fused_queue(True)
    try:
        for on in (False, True, False, True, True):
            fastpath.set_fused_queue(on)
            queued_here, queued = fastpath.stats()["queued_here"], _count("fused_ops")
            assert_close(_step(da, db).cpu(), expected)
            here = fastpath.stats()["queued_here"] - queued_here
            if on:  # (Python opens the segment; copy_ has no C++ kernel)
                assert here >= _count("fused_ops") - queued - 2 > 0
            else:
                assert here == 0
    finally:
        fastpath.set_fused_queue(was)
    assert _count("fused_compiles") == compiles
    assert _count("fused_runs") - runs == 5


@pytest.mark.skipif(not fastpath.loaded(), reason="the C++ fast path is not built here")
def test_segments_queued_in_cpp_are_freed_once_run(fused):
    # each step the C++ queue appends holds its segment only through its results: once the segment
    # ran and its tensors are gone, nothing keeps it (a reference counted twice kept every one)
    da, db, expected = _warm_loop()
    queued_here = fastpath.stats()["queued_here"]
    for _ in range(20):
        assert_close(_step(da, db).cpu(), expected)
    assert fastpath.stats()["queued_here"] > queued_here
    gc.collect()
    alive = [o for o in gc.get_objects() if type(o) is fusion._Segment]
    assert len(alive) <= 1  # (at most the open one)


def test_a_stretch_of_strict_mode_leaves_the_fused_loop_warm(fused):
    # the "cold" clock counts the fused mode's synchronizations only: reads in strict mode (a
    # compiled model's generate() in between, say) do not make a fused loop's ops cold again
    da, db, expected = _warm_loop()
    cold, runs = _count("fused_cold_ops"), _count("fused_runs")
    with torchtpu.eager_mode("strict"):
        for _ in range(2 * fusion.HOT_SYNCS):
            _step(da, db).cpu()
    assert_close(_step(da, db).cpu(), expected)
    assert _count("fused_cold_ops") == cold
    assert _count("fused_runs") - runs == 1


def test_threads_queueing_into_one_segment_match_cpu(fused):
    # every thread's warm calls are queued by the C++ fast path into the device's one open segment
    # (under the fusion lock, or by Python when another thread holds it): chains and in-place
    # writes from four threads at once keep each thread's values
    errors = []

    def work(seed):
        try:
            g = torch.Generator().manual_seed(seed)
            x_c, y_c = torch.randn(16, 8, generator=g), torch.randn(16, 8, generator=g)
            x, y = x_c.to("tpu"), y_c.to("tpu")
            for i in range(40):
                x_c = x_c * 0.5 + y_c
                x_c.add_(1.0)
                x_c[:, :2] *= -1
                x = x * 0.5 + y
                x.add_(1.0)
                x[:, :2] *= -1
                if i % 10 == 9:
                    assert_close(x.cpu(), x_c)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.skipif(not fastpath.loaded(), reason="the C++ fast path is not built here")
def test_strict_mode_reads_results_of_fused_segments_on_the_fast_path():
    # after a fused stretch, storages hold their segments' results (Pending buffers with values)
    # until written again: strict mode's C++ fast path reads those values instead of falling back
    x = torch.randn(64, 64)
    d = x.to("tpu")
    with torchtpu.eager_mode("strict"):
        d + 1.5  # (the key's first call: the fast path learns it)
        d + 1.5
    with torchtpu.eager_mode("fused"):
        # (two synced windows first: after another test built a `mul`, this one is "fresh", cold
        # through the window of its build and the next: fusion.FRESH_SYNCS)
        for _ in range(2):
            (d * 2.0).cpu()
        for _ in range(6):
            y = d * 2.0
        assert type(record_of(y)._buffer) is Pending
    with torchtpu.eager_mode("strict"):
        before = fastpath.stats()
        z = y + 1.5
        after = fastpath.stats()
    assert after["fast_calls"] - before["fast_calls"] == 1
    assert after["fallbacks"] == before["fallbacks"]
    assert_close(z.cpu(), x * 2.0 + 1.5)


def test_background_compiles_keep_the_loop_running(monkeypatch):
    monkeypatch.setattr(fusion, "COMPILE", "background")
    a, b = torch.randn(24, 32), torch.randn(32, 8)  # shapes no other test compiles
    expected = _step(a, b)
    da, db = a.to("tpu"), b.to("tpu")
    handed = []
    real = fusion._compile_later
    monkeypatch.setattr(fusion, "_compile_later", lambda *args: (handed.append(args[0]), real(*args)))
    with torchtpu.eager_mode("fused"):
        compiles, runs = _count("fused_compiles"), _count("fused_runs")
        for _ in range(6):  # the segment runs op by op while the thread compiles it
            assert_close(_step(da, db).cpu(), expected)
        assert len(handed) == 1
        fusion.wait_for_compiles(timeout=300)
        assert _count("fused_compiles") - compiles == 1
        for _ in range(2):  # ... and as one executable once it is ready
            assert_close(_step(da, db).cpu(), expected)
        assert _count("fused_runs") - runs >= 2
    fusion.flush_all()


def test_which_runs_are_compiled_does_not_depend_on_the_compile_timing(monkeypatch):
    """A compiled segment can differ from its op-by-op replay in the last bit (XLA contracts one op's
    multiply and the next op's add into an FMA), so the run where a loop switches to it must not
    depend on when the background compile finishes: a seeded program gives the same results each
    time it runs (`python -m torchtpu`'s sample text changed from run to run)."""
    monkeypatch.setattr(fusion, "COMPILE", "background")
    gen = torch.Generator().manual_seed(5)
    a, w, b = (torch.randn(40, 24, generator=gen).to("tpu") for _ in range(3))  # shapes no other test compiles

    def loop(after_each_run):
        limits.forget_executables()  # each loop starts cold, as a new process would
        outs = []
        with torchtpu.eager_mode("fused"):
            for _ in range(fusion.COMPILE_AT + fusion.USE_AFTER + 3):
                y = a
                for _ in range(4):
                    y = (y * w + b).tanh() * 0.9 + y * 0.1
                outs.append(y.cpu())
                after_each_run()
        fusion.flush_all()
        return outs

    runs = _count("fused_runs")
    prompt = loop(lambda: fusion.wait_for_compiles(timeout=300))  # each compile done before the next run
    assert _count("fused_runs") > runs  # the compiled segment ran
    real = fusion._Job.compile

    def slow(job):
        time.sleep(0.5)  # the compile finishes runs later than above
        return real(job)

    monkeypatch.setattr(fusion._Job, "compile", slow)
    late = loop(lambda: None)
    assert all(torch.equal(p, q) for p, q in zip(prompt, late, strict=True))


def test_in_place_writes_through_views_are_kept(fused):
    x = torch.zeros(4, 5, device="tpu")
    view = x[:, 1]
    for _ in range(3):
        view += 10
        x[0].mul_(2)
    cpu = torch.zeros(4, 5)
    for _ in range(3):
        cpu[:, 1] += 10
        cpu[0].mul_(2)
    assert_close(x.cpu(), cpu)
    assert_close(view.cpu(), cpu[:, 1])


def _chain(x):
    return (x * 2).relu().sum()


def test_segments_seen_once_run_op_by_op_without_compiling():
    with torchtpu.eager_mode("strict"):
        inputs = [torch.randn(n + 1, device="tpu") for n in range(6)]
        for x in inputs:  # every executable has run once
            _chain(x).cpu()
        compiles = _count("fused_compiles")
        with torchtpu.eager_mode("fused"):
            for x in inputs:  # a new shape each step, as with a growing KV cache: no segment repeats
                assert_close(_chain(x).cpu(), _chain(x.cpu()))
        assert _count("fused_compiles") == compiles


def test_random_ops_draw_what_strict_mode_draws():
    def draw():
        torch.manual_seed(7)
        return [(torch.randn(3, 4, device="tpu") + torch.rand(3, 4, device="tpu")).cpu() for _ in range(4)]

    with torchtpu.eager_mode("strict"):
        strict = draw()
    with torchtpu.eager_mode("fused"):
        fused = draw()
    for s, f in zip(strict, fused):  # the same draws; XLA's fusion may round the arithmetic differently
        assert_close(f, s, rtol=1e-6, atol=1e-6)


def test_a_long_stream_is_cut_into_segments(fused):
    x = torch.ones(8, device="tpu")
    for _ in range(fusion.LIMIT * 2 + 5):
        x = x + 1
    assert_close(x.cpu(), torch.full((8,), fusion.LIMIT * 2 + 6.0))


def test_device_side_asserts_report_at_the_next_sync(fused):
    from torchtpu.eager.asserts import DeviceAssertError

    x = torch.randn(5, device="tpu")
    for bad in (False, False, True):
        # (computed on the device: an index the host knows is checked at the op instead)
        idx = torch.tensor([0, 4], device="tpu") * (2 if bad else 1) + (1 if bad else 0)
        y = x[idx] * 2
        if bad:
            with pytest.raises(DeviceAssertError, match="index out of bounds"):
                y.cpu()
        else:
            y.cpu()


@torchtpu.eager_mode("strict")
def test_switching_mode_and_synchronize_run_the_queue():
    x = torch.arange(6.0, device="tpu")
    (x * 3).cpu()  # the executable has run once
    with torchtpu.eager_mode("fused"):
        (x * 3).cpu()  # not queued recently ("cold"): it runs at once; from the next sync window on it is queued
        y = x * 3
        assert type(record_of(y)._buffer) is Pending
        torch.tpu.synchronize()
        assert type(record_of(y)._buffer) is not Pending
        z = y * 3
        assert type(record_of(z)._buffer) is Pending and record_of(z)._buffer.value is None
    assert record_of(z)._buffer.value is not None  # leaving the mode ran the queue
    assert_close(z.cpu(), torch.arange(6.0) * 9)


def test_a_training_loop_matches_strict_mode():
    def train():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1)).to("tpu")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        data = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)).to("tpu")
        target = torch.randn(32, 1, generator=torch.Generator().manual_seed(2)).to("tpu")
        losses = []
        for _ in range(6):
            loss = torch.nn.functional.mse_loss(model(data), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return torch.stack(losses).cpu(), [p.detach().cpu() for p in model.parameters()]

    with torchtpu.eager_mode("strict"):
        strict_losses, strict_params = train()
    with torchtpu.eager_mode("fused"):
        fused_losses, fused_params = train()
    assert_close(fused_losses, strict_losses)
    for s, f in zip(strict_params, fused_params):
        assert_close(f, s)


def test_a_training_loop_that_rarely_syncs_compiles_nothing_once_warm(fused):
    # cross_entropy and the embedding check their indices on the device: each step notes verdicts
    # that stay unchecked until the loop reads a value (every 50 steps, say), and backward's
    # in-place writes (the embedding's gradient) are gated on them. The gate must not combine one
    # more verdict at every step: that compiled a new executable in every step (~40 ms each)
    import jax

    compiles = []
    listener = lambda event, duration, **kwargs: (
        compiles.append(event) if event.endswith("backend_compile_duration") else None
    )
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
        data, target = torch.randint(0, 16, (32,)), torch.randint(0, 4, (32,))
        models = [model, copy.deepcopy(model).to("tpu")]
        opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
        inputs = [(data, target), (data.to("tpu"), target.to("tpu"))]
        per_step = []
        for _step in range(20):
            before = len(compiles)
            for m, opt, (x, y) in zip(models, opts, inputs):
                loss = torch.nn.functional.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            per_step.append(len(compiles) - before)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    # (the gates' combinations are compiled per power of two of their count: steps 8 and 16 may)
    assert sum(per_step[-10:]) <= 2, str(per_step)
    for p_cpu, p_tpu in zip(*(m.parameters() for m in models)):
        assert_close(p_tpu.detach().cpu(), p_cpu.detach(), rtol=1e-4, atol=1e-5)


def test_greedy_generation_matches_cpu(fused):
    pytest.importorskip("transformers")
    import tiny_llama

    model = tiny_llama.model(vocab_size=64)
    ids = torch.randint(3, 64, (1, 6))
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
    with torch.no_grad():
        expected = model.generate(ids, **kw)
        got = model.to("tpu").generate(ids.to("tpu"), **kw, cache_implementation="static")
    assert torch.equal(got.cpu(), expected)


def test_a_growing_token_list_compiles_nothing_per_position(fused):
    w = torch.randn(8, 8)

    def decode(h, steps):  # generate()-like: a fixed-shape step, and a token list that grows
        tokens = torch.zeros(1, 1, device=h.device)
        for _ in range(steps):
            h = torch.tanh(h @ w.to(h.device)) * 0.5 + 0.1
            h = h.softmax(-1)
            tokens = torch.cat([tokens, h[:, :1]], dim=1)  # a new shape each step
            if tokens.sum().item() < -1:  # a sync every step, as a stopping criterion
                break
        return tokens

    h0 = torch.randn(1, 8)
    expected = decode(h0, 12)
    for _call in range(4):
        compiles = _count("fused_compiles")
        assert_close(decode(h0.to("tpu"), 12).cpu(), expected)
    assert _count("fused_compiles") == compiles  # nothing compiled per position in steady state


def test_two_growing_appends_per_step_leave_the_rest_of_the_step_compiled(fused):
    """generate() appends to its tokens and its position ids with one executable (both have the step's
    length): that executable is "cold" for both calls of a step, runs at once outside any segment, and
    the fixed-shape ops between the appends repeat as a compiled segment every step."""
    w = torch.randn(8, 8)

    def decode(h, steps):
        tokens = torch.zeros(1, 1, dtype=torch.long, device=h.device)
        pos = torch.zeros(1, 1, dtype=torch.long, device=h.device)
        for _ in range(steps):
            nxt = h.argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)  # length L+1 ...
            pos = torch.cat([pos, pos[:, -1:] + 1], dim=1)  # ... the same executable, the same step
            h = (torch.tanh(h @ w.to(h.device)) * 0.5 + 0.1).softmax(-1)  # fixed shapes, after the appends
            if (h[:, 0] > 2).any().item():  # a sync every step
                break
        return tokens, pos, h

    h0 = torch.randn(1, 8)
    expected = decode(h0, 10)
    for _call in range(4):
        compiles, runs, cold = _count("fused_compiles"), _count("fused_runs"), _count("fused_cold_ops")
        got = decode(h0.to("tpu"), 10)
        for g, e in zip(got, expected):
            assert_close(g.cpu(), e)
    assert _count("fused_compiles") == compiles  # steady state: nothing new
    assert _count("fused_cold_ops") - cold >= 20  # both appends of every step ran at once
    assert _count("fused_runs") - runs >= 10, _count("fused_runs") - runs  # every step ran a compiled segment


def test_forgetting_executables_drops_compiles_in_flight(monkeypatch):
    monkeypatch.setattr(fusion, "COMPILE", "background")
    a, b = torch.randn(20, 32), torch.randn(32, 8)  # shapes no other test compiles
    expected = _step(a, b)
    da, db = a.to("tpu"), b.to("tpu")
    gate = threading.Event()
    real_lower = fusion._fuse

    def slow_fuse(*args):  # hold the compile thread until forget() has run
        fused = real_lower(*args)

        class Held:
            def lower(self, *a):
                gate.wait(60)
                return fused.lower(*a)

        return Held()

    monkeypatch.setattr(fusion, "_fuse", slow_fuse)
    with torchtpu.eager_mode("fused"):
        for _ in range(fusion.COMPILE_AT + 2):  # (first calls, cold ops, then the segment's runs)
            assert_close(_step(da, db).cpu(), expected)
        assert fusion._compiling
        fusion.forget()
        gate.set()
        fusion.wait_for_compiles(timeout=300)
        assert not fusion._compiled  # the compile started before forget() was not installed
        assert_close(_step(da, db).cpu(), expected)
    fusion.flush_all()


def test_exiting_with_a_compile_in_flight_exits_cleanly():
    script = (
        "import torch, torchtpu\n"
        "from torchtpu.eager import fusion\n"
        "a, b = torch.randn(28, 32, device='tpu'), torch.randn(32, 8, device='tpu')\n"
        "with torchtpu.eager_mode('fused'):\n"
        "    for _ in range(5):\n"
        "        (torch.nn.functional.gelu(a @ b).softmax(-1) * 2 + 1).sum(0).cpu()\n"
        "assert fusion.COMPILE == 'background'\n"
        "print('queued', len(fusion._compiling) + len(fusion._compiled))\n"
    )
    env = dict(os.environ, TORCHTPU_COMPILE_CACHE="0")
    env.pop("TORCHTPU_FUSED_COMPILE", None)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "queued 1" in done.stdout
    assert "terminate" not in done.stderr and "Fatal" not in done.stderr


@pytest.mark.parametrize("mode", ["now", "background"])
def test_compiled_segments_take_numbers_as_kept_arrays_and_keep_their_values(monkeypatch, mode):
    """A compiled segment gets each step's Python numbers as kept device arrays (JAX would convert
    every number at every call): the values still change per call, -0.0 and 0.0 stay apart (1 / x),
    integers and floats keep their types, and the compile thread lowers for the same arguments."""
    monkeypatch.setattr(fusion, "COMPILE", mode)
    a = torch.randn(8, 16)
    da = a.to("tpu")
    scales = [0.5, 2.0, 3.25, 1.0, 7.0, -1.5, -0.0, 0.0, 0.25, -0.0]  # (zeros once compiled)
    with torchtpu.eager_mode("fused"):
        runs = _count("fused_runs")
        for i, s in enumerate(scales):
            y = ((da * s + i) / (s + 0.0)).clamp(-1e30, 1e30).sum(1) + (i % 3)
            assert_close(y.cpu(), ((a * s + i) / (s + 0.0)).clamp(-1e30, 1e30).sum(1) + (i % 3))
            if mode == "background" and i == 4:
                fusion.wait_for_compiles()
        assert _count("fused_runs") > runs  # compiled segments ran
    assert not fusion.failures or all("kept" not in str(e) for _, e in fusion.failures)
    kept = [k for k in fusion._kept if k[0] is float]
    assert (float, (-0.0).hex()) in kept and (float, (0.0).hex()) in kept


def test_a_segment_that_ran_keeps_nothing_but_its_results(fused):
    """A queued result that stays referenced (a parameter's new value, until the next step replaces
    it) keeps its segment; once the segment has run, that must not keep its steps, inputs and weak
    references alive: a training loop would promote thousands of them per step to the GC's oldest
    generation and pay a full collection of the heap (~250 ms with torch and JAX loaded) every ~100
    steps."""
    w_cpu, g_cpu = torch.randn(32), torch.randn(32)
    w, g = w_cpu.to("tpu"), g_cpu.to("tpu")
    for _ in range(6):
        for x, y in ((w, g), (w_cpu, g_cpu)):
            x.add_(y, alpha=-0.1)
            x.mul_(0.99)
        (w * w).sum().item()  # the segment runs; w's storage still holds its queued result
    pending = record_of(w)._buffer
    assert type(pending) is Pending and pending.value is not None
    assert pending.segment.steps is None and pending.segment.external is None
    assert_close(w.cpu(), w_cpu)


def test_a_new_length_per_step_in_every_layer_compiles_nothing_per_position(fused):
    """A decoding step whose every layer appends to its own cache and reads the whole of it (the
    dynamic KV cache's `cat` and attention: one new shape per step, called once per layer): those
    executables run at once all step ("fresh": their kernels built others one step before), so the
    layer's segment does not become a new key per position, compiled once per position."""
    w = torch.randn(11, 11)  # (shapes no other test uses)

    def decode(h, steps, layers=10):
        caches = [torch.zeros(1, 1, 11, device=h.device) for _ in range(layers)]
        for _ in range(steps):
            for i in range(layers):
                x = torch.tanh(h @ w.to(h.device)) * 0.5 + 0.1  # fixed shapes
                caches[i] = torch.cat([caches[i], x[:, None]], dim=1)  # length L + 1, in every layer
                h = (caches[i] * x[:, None]).sum(1).softmax(-1)  # over the whole cache
            if h.sum().item() < -1:  # a sync every step
                break
        return h

    h0 = torch.randn(1, 11)
    expected = decode(h0, 14)
    compiles = _count("fused_compiles")
    for _call in range(2):
        assert_close(decode(h0.to("tpu"), 14).cpu(), expected)
    # the fixed-shape stretches between the appends: a few segments, whatever the number of steps
    # (4-6 here, with the earlier tests' executables or without; before: 17, one or more per position)
    assert _count("fused_compiles") - compiles <= 8, _count("fused_compiles") - compiles


def test_every_host_read_counts_on_the_sync_clock(fused):
    """The clock of "cold" counts host reads; a read of a value whose segment already ran, and a
    non-blocking copy of a value not queued, counted nothing, so a loop whose stop flag was computed
    at once (by cold ops) stopped the clock and found its ops cold forever."""
    a = torch.randn(6, 5)
    x = a.to("tpu")
    for _ in range(3):  # warm: queued from now on
        y = (x * 3).exp()
        y.cpu()
    y = (x * 3).exp()
    assert type(record_of(y)._buffer) is Pending
    torch.tpu.synchronize()  # runs the segment (one sync); y's buffer keeps its Pending, with a value
    syncs = fusion._syncs[0]
    assert_close(y.cpu(), (a * 3).exp())
    assert fusion._syncs[0] == syncs + 1
    dst = torch.zeros(6, 5, pin_memory=True)
    dst.copy_(x, non_blocking=True)  # x: not queued
    torch.tpu.synchronize()
    assert fusion._syncs[0] == syncs + 3  # the copy, then synchronize
    assert_close(dst, a)


def test_gradcheck_and_gradgradcheck_pass_in_the_fused_mode():
    # their reentrancy check computes the Jacobian twice, row by row, and compares bit for bit; a
    # repeated segment runs op by op for its first runs and compiled after, and the compiled program
    # contracts a multiply and the next op's add into an FMA: the passes differed in the last bit
    # (integrations/patches.py runs the check in the strict mode for tpu inputs)
    torch.manual_seed(0)
    a, b = (torch.randn(2, 4, dtype=torch.float64, device="tpu", requires_grad=True) for _ in range(2))
    with torchtpu.eager_mode("fused"):
        assert torch.autograd.gradgradcheck(lambda a, b: (a * b + b) * a.exp() - b * 1.5, (a, b))
        assert torchtpu.get_eager_mode() == "fused"


def test_a_segment_that_draws_compiles_at_a_later_run(fused):
    # each draw inlines a threefry hash into a compiled segment (~1.5 s of XLA:CPU compile), so a sweep
    # that repeats each case's segment a few times (test_linalg's test_baddbmm: 216 layouts of
    # device-drawn operands) compiles a segment with draws at its COMPILE_AT_DRAWS-th run, not its
    # COMPILE_AT-th; the loop's values are the strict mode's either way (same seed)
    x = torch.randn(11, 3).to("tpu")

    def body():
        return (torch.rand(11, 3, device="tpu") * x + 0.5).t().contiguous().sum(0).cpu()

    compiles = _count("fused_compiles")
    torch.manual_seed(7)
    got = [body() for _ in range(fusion.COMPILE_AT + 2)]  # (a loop without draws compiles by now)
    assert _count("fused_compiles") == compiles
    got += [body() for _ in range(fusion.COMPILE_AT_DRAWS - fusion.COMPILE_AT)]
    assert _count("fused_compiles") - compiles == 1
    with torchtpu.eager_mode("strict"):
        torch.manual_seed(7)
        expected = [body() for _ in got]
    for g, e in zip(got, expected):
        assert_close(g, e)
