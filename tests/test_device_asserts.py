"""Out-of-range indices and class targets: an error (a device-side assert, as on CUDA), never a
clamped gather, a dropped scatter or a NaN. Every case is checked against the CPU's verdict."""

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from torchtpu.eager import asserts

DEV = "tpu"


def _cases(dev, i):
    """op name -> a call that indexes a (4, 3) tensor at `i` along dim 0 (or 3 * i flat)."""
    x = torch.arange(12.0, device=dev).reshape(4, 3)
    t = torch.tensor([i], device=dev)
    t2 = torch.tensor([[i, 0, 0]], device=dev)
    ones = torch.ones(1, 3, device=dev)
    return {
        "index": lambda: x[t],
        "_unsafe_index": lambda: torch.ops.aten._unsafe_index(x, [t]),
        "index_put_": lambda: x.clone().index_put_((t,), ones[0]),
        "index_put_ accumulate": lambda: x.clone().index_put_((t,), ones[0], accumulate=True),
        "index_select": lambda: x.index_select(0, t),
        "index_copy_": lambda: x.clone().index_copy_(0, t, ones),
        "index_add_": lambda: x.clone().index_add_(0, t, ones),
        "index_fill_": lambda: x.clone().index_fill_(0, t, 2.0),
        "index_reduce_": lambda: x.clone().index_reduce_(0, t, ones, "prod"),
        "gather": lambda: x.gather(0, t2),
        "scatter_": lambda: x.clone().scatter_(0, t2, 1.0),
        "scatter_add_": lambda: x.clone().scatter_add_(0, t2, ones),
        "scatter_reduce_": lambda: x.clone().scatter_reduce_(0, t2, ones, "amax"),
        "take": lambda: x.take(torch.tensor([3 * i], device=dev)),
        "put_": lambda: x.clone().put_(torch.tensor([3 * i], device=dev), ones[0, :1]),
        "embedding": lambda: F.embedding(t, x),
        "embedding_bag": lambda: F.embedding_bag(torch.tensor([i, 0], device=dev), x, torch.tensor([0], device=dev)),
        "nll_loss": lambda: F.nll_loss(x[:1], t),
        "cross_entropy": lambda: F.cross_entropy(x[:1, :].repeat(1, 2)[:, :4], t),
        "one_hot": lambda: F.one_hot(t, 4),
    }


def _device_computed(values):
    """An index computed on the device: the host does not know its values, so an index op checks it on
    the device and reports at the next sync (an index the host knows raises at the op)."""
    return torch.tensor(values, device=DEV) + 0


def _outcome(fn):
    try:
        return "ok", fn().cpu()
    except (IndexError, RuntimeError) as e:
        return "error", e


@pytest.mark.parametrize("i", [-5, -4, -1, 0, 3, 4])
@pytest.mark.parametrize("op", list(_cases("cpu", 0)))
def test_index_range_matches_cpu(op, i):
    cpu_verdict, cpu_value = _outcome(_cases("cpu", i)[op])
    tpu_verdict, tpu_value = _outcome(_cases(DEV, i)[op])
    assert tpu_verdict == cpu_verdict, f"{op}[{i}]: CPU {cpu_verdict}, tpu {tpu_verdict}: {tpu_value}"
    if cpu_verdict == "ok":
        torch.testing.assert_close(tpu_value, cpu_value)
    else:
        # (index tensors the host knows raise PyTorch's IndexError at the op: eager/data_dependent.py)
        # (one_hot: the CPU's RuntimeError at the op, the values being known to the host)
        assert isinstance(tpu_value, (asserts.DeviceAssertError, IndexError, type(cpu_value))), tpu_value
        assert any(w in str(tpu_value) for w in ("out of", "Target", "Class values")), tpu_value


def test_index_errors_are_reported_at_the_next_sync_and_not_sticky():
    x = torch.zeros(4, 3, device=DEV)
    y = x.index_select(0, _device_computed([7]))  # queued: no error yet
    z = (x + 1).sum()  # unrelated work still queues
    with pytest.raises(IndexError, match=r"aten::index_select.*dimension 0 with size 4"):
        y.cpu()
    # better than CUDA's sticky assert: every other tensor keeps working
    assert z.item() == 12.0
    assert (x + 1).sum().item() == 12.0
    torch.tpu.synchronize()


def test_reported_at_the_next_sync_sticky_until_cleared():
    x = torch.zeros(4, 3, device=DEV)
    other = torch.ones(2, device="tpu:1")
    y = torch.bernoulli(torch.full((3,), 2.0, device=DEV))  # queued: no error yet
    z = (x + 1).sum()  # unrelated work still queues
    with pytest.raises(asserts.DeviceAssertError, match=r"aten::bernoulli.*p_in"):
        y.cpu()
    # sticky, as on CUDA: every later op and sync on that device raises the same error, naming the op
    for later in (lambda: z.item(), lambda: x + 1, lambda: torch.ones(2, device=DEV), torch.tpu.synchronize):
        with pytest.raises(asserts.DeviceAssertError, match=r"aten::bernoulli.*p_in"):
            later()
    assert (other * 2).tolist() == [2.0, 2.0]  # another device is not in the error state
    torch.tpu.clear_device_assert()
    assert z.item() == 12.0  # usable again
    with pytest.raises(asserts.DeviceAssertError, match="gather"):
        x.gather(0, torch.tensor([[9, 0, 0]], device=DEV))
        torch.tpu.synchronize()


def test_debug_mode_raises_at_the_op():
    x = torch.zeros(4, 3, device=DEV)
    with torchtpu.eager_mode("debug"):
        with pytest.raises(asserts.DeviceAssertError, match="embedding"):
            F.embedding(torch.tensor([4], device=DEV), x)


def test_a_loop_without_syncs_still_reports():
    x = torch.zeros(4, 3, device=DEV)
    bad = torch.tensor([4], device=DEV)
    with pytest.raises(asserts.DeviceAssertError):
        for _ in range(asserts.LIMIT):
            x = x.index_fill(0, bad, 1.0)


def test_compiled_graph_checks_its_indices():
    emb = torch.nn.Embedding(10, 4).to(DEV)
    fn = torch.compile(lambda i, t: F.cross_entropy(emb(i), t), backend="tpu", fullgraph=True)
    i, t = torch.tensor([1, 9], device=DEV), torch.tensor([0, 3], device=DEV)
    ok = fn(i, t).cpu()
    torch.testing.assert_close(ok, F.cross_entropy(emb(i).cpu(), t.cpu()))
    with pytest.raises(asserts.DeviceAssertError, match="compiled graph.*out of range"):
        fn(torch.tensor([1, 10], device=DEV), t).cpu()
    torch.tpu.clear_device_assert()
    with pytest.raises(asserts.DeviceAssertError, match="Target is out of bounds"):
        fn(i, torch.tensor([0, 4], device=DEV)).cpu()
    torch.tpu.clear_device_assert()
    assert fn(i, t).cpu().isfinite()


def _value_cases(dev):
    """name -> (a call with values the op rejects, the same call with values it accepts)."""

    def T(*a, **k):
        return torch.tensor(*a, device=dev, **k)

    x = T([[0.1, 0.2, 0.7]])
    return {
        "multinomial negative": (
            lambda: torch.multinomial(T([0.5, -0.1, 0.6]), 1),
            lambda: torch.multinomial(T([0.0, 0.0, 0.6]), 1),
        ),
        "multinomial nan": (lambda: torch.multinomial(T([0.5, float("nan")]), 1, True), None),
        "multinomial inf": (lambda: torch.multinomial(T([[0.5, 0.1], [float("inf"), 1.0]]), 1), None),
        "multinomial zero row": (lambda: torch.multinomial(T([[0.0, 0.0], [1.0, 1.0]]), 1), None),
        "binary_cross_entropy": (
            lambda: F.binary_cross_entropy(T([0.5, 1.5]), T([1.0, 0.0])),
            lambda: F.binary_cross_entropy(T([0.5, 1.0]), T([1.0, 0.0])),
        ),
        "bernoulli tensor": (lambda: torch.bernoulli(T([0.5, 1.5])), lambda: torch.bernoulli(T([0.0, 1.0]))),
        "bernoulli_ scalar": (
            lambda: torch.zeros(2, device=dev).bernoulli_(1.5),
            lambda: torch.zeros(2, device=dev).bernoulli_(1.0),
        ),
        "multi_margin_loss": (lambda: F.multi_margin_loss(x, T([3])), lambda: F.multi_margin_loss(x, T([2]))),
        "multilabel_margin_loss": (
            lambda: F.multilabel_margin_loss(x, T([[0, 3, -1]])),
            lambda: F.multilabel_margin_loss(x, T([[0, -1, 2]])),
        ),
        "searchsorted sorter": (
            lambda: torch.searchsorted(T([1.0, 2.0]), T([1.5]), sorter=T([0, 5])),
            lambda: torch.searchsorted(T([2.0, 1.0]), T([1.5]), sorter=T([1, 0])),
        ),
        "max_unpool1d": (
            lambda: F.max_unpool1d(T([[[1.0, 2.0]]]), T([[[0, 9]]]), 2),
            lambda: F.max_unpool1d(T([[[1.0, 2.0]]]), T([[[0, 3]]]), 2),
        ),
    }


@pytest.mark.parametrize("case", list(_value_cases("cpu")))
def test_value_checks_match_cpu(case):
    for dev in ("cpu", DEV):
        bad, good = _value_cases(dev)[case]
        verdict, error = _outcome(bad)
        assert verdict == "error", f"{case} on {dev}: accepted"
        if dev == DEV:
            assert isinstance(error, asserts.DeviceAssertError), error
            torch.tpu.clear_device_assert()
    bad, good = _value_cases("cpu")[case]
    if good is not None:
        torch.testing.assert_close(_value_cases(DEV)[case][1]().cpu(), good())


def test_assert_async_eager_and_compiled():
    torch._assert_async(torch.tensor(3, device=DEV))
    torch.tpu.synchronize()
    with pytest.raises(asserts.DeviceAssertError, match="custom message"):
        torch._assert_async(torch.tensor(0, device=DEV), "custom message")
        torch.tpu.synchronize()
    torch.tpu.clear_device_assert()

    def double_positive(a):
        torch._assert_async(a.sum() > 0, "sum must be positive")
        return a * 2

    fn = torch.compile(double_positive, backend="tpu")
    torch.testing.assert_close(fn(torch.ones(3, device=DEV)).cpu(), torch.full((3,), 2.0))
    with pytest.raises(asserts.DeviceAssertError, match="compiled graph.*sum must be positive"):
        fn(-torch.ones(3, device=DEV)).cpu()


def test_raised_in_the_thread_that_caused_it():
    import threading

    x = torch.zeros(4, 3, device=DEV)
    queued, synced, seen = threading.Event(), threading.Event(), {}

    def worker():
        y = x.index_select(0, _device_computed([7]))  # fails on the device, unreported yet
        queued.set()
        synced.wait(30)
        try:
            y.cpu()
        except asserts.DeviceAssertError as e:
            seen["worker"] = e

    t = threading.Thread(target=worker)
    t.start()
    queued.wait(30)
    seen["main"] = (x + 1).sum().item()  # this thread's sync does not receive the worker's error
    synced.set()
    t.join(30)
    assert seen["main"] == 12.0
    assert "index_select" in str(seen["worker"])
    assert isinstance(seen["worker"], IndexError)
    assert x.sum().item() == 0.0  # an index error is not sticky: the device keeps working for everyone


def _lm(dev, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10)).to(dev)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _step(model, opt, ids, target):
    opt.zero_grad(set_to_none=False)  # (grads accumulate in place: gated too)
    loss = F.cross_entropy(model(ids), target)
    loss.backward()
    opt.step()
    return loss


def _device_state(model, opt):
    return [p.detach().cpu().clone() for p in model.parameters()] + [
        v.cpu().clone() for p in model.parameters() for k, v in opt.state[p].items() if k != "step"
    ]


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_training_step_after_a_failed_check_commits_nothing(mode):
    """embedding(bad ids) -> loss -> backward -> AdamW step: the error is raised at the next sync,
    and the step that depended on the failed check changed no parameter, gradient or moment."""
    model, opt = _lm(DEV)
    ref, ref_opt = _lm("cpu")
    good = torch.randint(0, 10, (6,), generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 10, (6,), generator=torch.Generator().manual_seed(2))
    with torchtpu.eager_mode(mode):
        for _ in range(3):  # warm: in the fused mode these ops are queued now
            _step(model, opt, good.to(DEV), target.to(DEV)).item()
            _step(ref, ref_opt, good, target)
        before = _device_state(model, opt)
        bad = good.clone()
        bad[2] = 10
        loss = _step(model, opt, bad.to(DEV), target.to(DEV))
        with pytest.raises(asserts.DeviceAssertError, match="embedding"):
            loss.item()
        torch.tpu.clear_device_assert()
        after = _device_state(model, opt)
    for b, a in zip(before, after):
        assert torch.equal(a, b)
    for p in model.parameters():  # zero_grad ran before the failed op; the accumulation after it did not
        assert not p.grad.cpu().any()
    for p, q in zip(model.parameters(), ref.parameters()):  # and they are the CPU's good steps
        torch.testing.assert_close(p.detach().cpu(), q.detach())
    # (AdamW's `step` counts on the host: it did advance for the failed step, as it would on CUDA)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@torchtpu.eager_mode("strict")  # (it counts each write's donation: the fused mode queues them)
def test_gated_writes_commit_after_passed_checks_and_not_after_failed_ones(dtype):
    """While a check is unchecked, in-place writes run gated: a large storage (donated, written through
    a partial view as a KV cache is) gets the write when the check passed, keeps its value when not."""
    from torchtpu import metrics

    cache = torch.zeros(4, 65536, dtype=dtype, device=DEV)  # >= 256 KiB: donated in place
    table = torch.arange(12, device=DEV).reshape(4, 3).to(dtype)
    expected = torch.zeros(4, 65536, dtype=dtype)
    for step, bad in enumerate((False, False, True)):
        row = table.index_select(0, _device_computed([7 if bad else step]))  # a checked op
        donations = metrics()["eager_donations"]
        cache[1 + step, :3] = row[0]  # a slab write through a view, gated
        cache.add_(1)  # a whole-storage write, gated
        if bad:
            with pytest.raises(asserts.DeviceAssertError, match="index_select"):
                cache.cpu()
            torch.tpu.clear_device_assert()
        else:
            expected[1 + step, :3] = table.cpu()[step]
            expected += 1
            assert metrics()["eager_donations"] > donations  # (the gated form still donates)
        torch.testing.assert_close(cache.cpu(), expected)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_failed_check_after_many_passed_ones_still_gates_the_writes_after_it(mode):
    """poison scans only the verdicts noted since its last call and forgets those it read as passed
    (a decode step notes one per cache write): a failed check noted after many passed ones, each read
    by a write, still gates every later write, and the next sync still reports it."""
    table = torch.arange(24.0, device=DEV).reshape(8, 3)
    with torch.tpu.eager_mode(mode):
        acc = torch.zeros(8, 3, device=DEV)
        expected = torch.zeros(8, 3)
        for i in range(6):  # passed checks, each followed by a gated write
            acc[i] += table.index_select(0, _device_computed([i]))[0]
            expected[i] += table.cpu()[i]
        bad = table.index_select(0, _device_computed([9]))
        for i in range(3):  # writes after the failed check: none is committed
            acc[i] += 100.0
            acc.mul_(2.0)
        with pytest.raises(asserts.DeviceAssertError, match="index_select"):
            acc.cpu()
        torch.tpu.clear_device_assert()
        torch.testing.assert_close(acc.cpu(), expected)
        acc += 1.0  # after the sync nothing gates: committed
        torch.testing.assert_close(acc.cpu(), expected + 1)
    del bad


@pytest.mark.parametrize("cpp_queue", [True, False], ids=["cpp-queue", "python-queue"])
def test_fused_mode_gates_queued_writes_on_queued_checks_without_cutting_the_segment(monkeypatch, request, cpp_queue):
    """A decode-like step: a checked gather, then writes into existing tensors (a cache row, an
    accumulator) gated on it. In the fused mode the gate is queued with them, so the step stays one
    segment (one flush, compiled from its second run); a failed check in such a step still leaves
    every write uncommitted and is reported at the sync. The same whether the C++ fast path queues
    the writes (the default) or OpKernel._run does."""
    from torchtpu.eager import fastpath, fusion

    monkeypatch.setattr(fusion, "COMPILE", "now")
    if fastpath.loaded():
        was = fastpath.set_fused_queue(cpp_queue)
        request.addfinalizer(lambda: fastpath.set_fused_queue(was))
    elif cpp_queue:
        pytest.skip("the C++ fast path is not built here")
    torch.manual_seed(0)
    table = torch.randn(16, 8)
    cache, acc = torch.zeros(6, 8), torch.zeros(8)
    d_table, d_cache, d_acc = table.to(DEV), cache.to(DEV), acc.to(DEV)

    def step(t, c, a, i, token):
        row = t.index_select(0, token)  # checked (an id outside the table fails)
        c.index_copy_(0, torch.tensor([i % 6], device=c.device), row)  # checked, and gated
        a.add_(row[0] * 0.5)  # gated
        a.mul_(0.9)  # gated

    with torch.tpu.eager_mode("fused"):
        flushes, compiled_runs = [], []
        for i in range(12):
            token = torch.tensor([(5 * i) % 16])
            step(table, cache, acc, i, token)
            before, runs = fusion._flushes[0], torchtpu.metrics()["fused_runs"]
            queued_here = fastpath.stats()["queued_here"]
            step(d_table, d_cache, d_acc, i, token.to(DEV))
            if i == 11:  # the three gated writes queued by the C++ fast path, or none of them
                assert (fastpath.stats()["queued_here"] - queued_here >= 3) == cpp_queue
            torch.testing.assert_close(d_acc.cpu(), acc)  # the sync: one flush, checks read
            flushes.append(fusion._flushes[0] - before)
            compiled_runs.append(torchtpu.metrics()["fused_runs"] - runs)
        assert flushes[-4:] == [1, 1, 1, 1], flushes
        assert compiled_runs[-4:] == [1, 1, 1, 1], compiled_runs
        torch.testing.assert_close(d_cache.cpu(), cache)
        step(d_table, d_cache, d_acc, 12, _device_computed([16]))  # out of range
        with pytest.raises(asserts.DeviceAssertError, match="index_select"):
            d_acc.cpu()
        torch.tpu.clear_device_assert()
    torch.testing.assert_close(d_acc.cpu(), acc)
    torch.testing.assert_close(d_cache.cpu(), cache)


def test_fused_mode_gates_do_not_depend_on_which_verdicts_are_computed():
    """While a verdict is unchecked, the fused mode gates every write, whether the verdict is computed
    yet or not: the executable a segment queues must not depend on timing (a training step used to
    alternate between a gated and an ungated segment, one of them never compiled). Strict mode on
    XLA:CPU reads a computed verdict and drops the gate when it passed."""
    table = torch.arange(12.0, device=DEV).reshape(4, 3)
    with torch.tpu.eager_mode("strict"):
        table.index_select(0, _device_computed([1]))  # a checked op: one unchecked verdict
    verdict = asserts._state().pending[-1][0]
    verdict.block_until_ready()  # computed, passed, not checked
    with torch.tpu.eager_mode("fused"):
        assert asserts.poison(0, queue=True) is not None
        assert asserts.poison(0) is not None
    with torch.tpu.eager_mode("strict"):
        expected = None if torch.tpu.platform() == "cpu" else asserts.poison(0)
        assert asserts.poison(0) is expected
    torch.tpu.synchronize()
    assert not asserts.gating()


@pytest.mark.parametrize(
    "values, classes", [([3, 4, -1, 0], -1), ([3, 4, 1, 0], 3), ([1, 2], 0), ([1, 2], -2), ([[3, 4], [1, 0]], -1)]
)
def test_one_hot_checks_host_known_classes_at_the_op(values, classes):
    # the CPU's RuntimeError and words at the op when the host knows the values (test_nn's test_one_hot)
    cpu_verdict, cpu_value = _outcome(lambda: F.one_hot(torch.tensor(values), classes))
    tpu_verdict, tpu_value = _outcome(lambda: F.one_hot(torch.tensor(values, device=DEV), classes))
    assert tpu_verdict == cpu_verdict
    if cpu_verdict == "ok":
        torch.testing.assert_close(tpu_value, cpu_value)
    else:
        assert type(tpu_value) is RuntimeError and str(tpu_value) == str(cpu_value)


def test_one_hot_device_values():
    x = torch.arange(5, device=DEV) + 1  # computed on the device: the host does not know the values
    torch.testing.assert_close(F.one_hot(x).cpu(), F.one_hot(torch.arange(5) + 1))  # -1: a sync, as CUDA
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
        F.one_hot(x, -2)  # read by that sync: at the op
    y = F.one_hot(x, 3)  # checked on the device: at the next sync, not sticky
    with pytest.raises(asserts.DeviceAssertError, match="Class values must be smaller than num_classes"):
        y.cpu()
    assert F.one_hot(x, 6).sum().item() == 5
    with pytest.raises(RuntimeError, match="only applicable to index tensor of type LongTensor"):
        F.one_hot(x.int(), 6)
    assert F.one_hot(torch.empty(0, dtype=torch.long, device=DEV), 3).shape == (0, 3)
