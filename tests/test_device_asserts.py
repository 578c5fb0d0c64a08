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
        "embedding_bag": lambda: F.embedding_bag(torch.tensor([i, 0], device=dev), x,
                                                 torch.tensor([0], device=dev)),
        "nll_loss": lambda: F.nll_loss(x[:1], t),
        "cross_entropy": lambda: F.cross_entropy(x[:1, :].repeat(1, 2)[:, :4], t),
        "one_hot": lambda: F.one_hot(t, 4),
    }


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
        assert isinstance(tpu_value, asserts.DeviceAssertError), tpu_value
        assert "out of" in str(tpu_value) or "Target" in str(tpu_value)


def test_reported_at_the_next_sync_and_the_device_stays_usable():
    x = torch.zeros(4, 3, device=DEV)
    y = x.index_select(0, torch.tensor([7], device=DEV))    # queued: no error yet
    z = (x + 1).sum()                                         # unrelated work still queues
    with pytest.raises(asserts.DeviceAssertError, match=r"aten::index_select.*dimension 0 with size 4"):
        y.cpu()
    assert z.item() == 12.0                                   # reported once, then gone
    with pytest.raises(asserts.DeviceAssertError):
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
    with pytest.raises(asserts.DeviceAssertError, match="Target is out of bounds"):
        fn(i, torch.tensor([0, 4], device=DEV)).cpu()
    assert fn(i, t).cpu().isfinite()


def _value_cases(dev):
    """name -> (a call with values the op rejects, the same call with values it accepts)."""
    def T(*a, **k):
        return torch.tensor(*a, device=dev, **k)
    x = T([[0.1, 0.2, 0.7]])
    return {
        "multinomial negative": (lambda: torch.multinomial(T([0.5, -0.1, 0.6]), 1),
                                 lambda: torch.multinomial(T([0.0, 0.0, 0.6]), 1)),
        "multinomial nan": (lambda: torch.multinomial(T([0.5, float("nan")]), 1, True), None),
        "multinomial inf": (lambda: torch.multinomial(T([[0.5, 0.1], [float("inf"), 1.0]]), 1), None),
        "multinomial zero row": (lambda: torch.multinomial(T([[0.0, 0.0], [1.0, 1.0]]), 1), None),
        "binary_cross_entropy": (lambda: F.binary_cross_entropy(T([0.5, 1.5]), T([1.0, 0.0])),
                                 lambda: F.binary_cross_entropy(T([0.5, 1.0]), T([1.0, 0.0]))),
        "bernoulli tensor": (lambda: torch.bernoulli(T([0.5, 1.5])), lambda: torch.bernoulli(T([0.0, 1.0]))),
        "bernoulli_ scalar": (lambda: torch.zeros(2, device=dev).bernoulli_(1.5),
                              lambda: torch.zeros(2, device=dev).bernoulli_(1.0)),
        "multi_margin_loss": (lambda: F.multi_margin_loss(x, T([3])), lambda: F.multi_margin_loss(x, T([2]))),
        "multilabel_margin_loss": (lambda: F.multilabel_margin_loss(x, T([[0, 3, -1]])),
                                   lambda: F.multilabel_margin_loss(x, T([[0, -1, 2]]))),
        "searchsorted sorter": (lambda: torch.searchsorted(T([1.0, 2.0]), T([1.5]), sorter=T([0, 5])),
                                lambda: torch.searchsorted(T([2.0, 1.0]), T([1.5]), sorter=T([1, 0]))),
        "max_unpool1d": (lambda: F.max_unpool1d(T([[[1.0, 2.0]]]), T([[[0, 9]]]), 2),
                         lambda: F.max_unpool1d(T([[[1.0, 2.0]]]), T([[[0, 3]]]), 2)),
    }


@pytest.mark.parametrize("case", list(_value_cases("cpu")))
def test_value_checks_match_cpu(case):
    for dev in ("cpu", DEV):
        bad, good = _value_cases(dev)[case]
        verdict, error = _outcome(bad)
        assert verdict == "error", f"{case} on {dev}: accepted"
        if dev == DEV:
            assert isinstance(error, asserts.DeviceAssertError), error
    bad, good = _value_cases("cpu")[case]
    if good is not None:
        torch.testing.assert_close(_value_cases(DEV)[case][1]().cpu(), good())


def test_assert_async_eager_and_compiled():
    torch._assert_async(torch.tensor(3, device=DEV))
    torch.tpu.synchronize()
    with pytest.raises(asserts.DeviceAssertError, match="custom message"):
        torch._assert_async(torch.tensor(0, device=DEV), "custom message")
        torch.tpu.synchronize()

    def double_positive(a):
        torch._assert_async(a.sum() > 0, "sum must be positive")
        return a * 2

    fn = torch.compile(double_positive, backend="tpu")
    torch.testing.assert_close(fn(torch.ones(3, device=DEV)).cpu(), torch.full((3,), 2.0))
    with pytest.raises(asserts.DeviceAssertError, match="compiled graph.*sum must be positive"):
        fn(-torch.ones(3, device=DEV)).cpu()
