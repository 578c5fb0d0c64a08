"""The eager engine: caching, traced scalars, promotion, autograd and optimizers against the CPU."""

import re

import pytest
import torch

import torchtpu
from torchtpu.eager import host_fills


def test_same_shapes_hit_the_cache_and_scalars_do_not_recompile():
    a = torch.randn(8, 8, device="tpu")
    b = torch.randn(8, 8, device="tpu")
    a.mul(b).add_(b, alpha=0.5)  # warm up
    before = torchtpu.metrics()
    for lr in (0.1, 0.01, 0.001):  # a changing Scalar must not recompile
        a.mul(b).add_(b, alpha=-lr)
    after = torchtpu.metrics()
    assert after["eager_compiles"] == before["eager_compiles"]
    assert after["eager_cache_hits"] - before["eager_cache_hits"] == 6
    torch.randn(9, 8, device="tpu").mul(2.0)  # a new shape compiles once
    assert torchtpu.metrics()["eager_compiles"] > after["eager_compiles"]


@pytest.mark.parametrize(
    "case", ["int+float", "f16+f32", "int32+int64 0-dim", "bool+int", "bf16*scalar", "int/int", "f32+f64 cpu scalar"]
)
def test_type_promotion_matches_pytorch(case):
    mk = {
        "int+float": lambda d: (torch.arange(6, device=d), 2.5),
        "f16+f32": lambda d: (torch.ones(3, dtype=torch.float16, device=d), torch.ones(3, device=d)),
        "int32+int64 0-dim": lambda d: (torch.arange(3, dtype=torch.int32, device=d), torch.tensor(5, device=d)),
        "bool+int": lambda d: (torch.tensor([True, False], device=d), 3),
        "bf16*scalar": lambda d: (torch.ones(3, dtype=torch.bfloat16, device=d), 1.5),
        "int/int": lambda d: (torch.arange(1, 5, device=d), torch.arange(2, 6, device=d)),
        "f32+f64 cpu scalar": lambda d: (torch.ones(3, device=d), torch.tensor(2.0, dtype=torch.float64)),
    }[case]
    op = torch.div if case == "int/int" else torch.add
    cpu = op(*mk("cpu"))
    dev = op(*mk("tpu"))
    assert dev.dtype == cpu.dtype
    torch.testing.assert_close(dev.cpu(), cpu)


def test_float32_stays_float32_with_python_scalars():
    x = torch.randn(4, device="tpu")
    for y in (x * 3.3, x + 1, x / 7, x**2, 1.5 - x, torch.exp(x) * 1e-3):
        assert y.dtype == torch.float32


def test_integer_semantics():
    a = torch.tensor([-7, -3, 3, 7], device="tpu")
    b = torch.tensor([2, -2, 2, -2], device="tpu")
    ca, cb = a.cpu(), b.cpu()
    assert torch.equal((a // b).cpu(), ca // cb)
    assert torch.equal((a % b).cpu(), ca % cb)
    assert torch.equal(torch.div(a, b, rounding_mode="trunc").cpu(), torch.div(ca, cb, rounding_mode="trunc"))
    big = torch.tensor([2**62], device="tpu")
    assert (big * 2).cpu().item() == (torch.tensor([2**62]) * 2).item()  # int64 wraps, no float detour


def test_matmul_precision_follows_pytorch_setting():
    a = torch.randn(64, 64)
    b = torch.randn(64, 64)
    torch.testing.assert_close((a.to("tpu") @ b.to("tpu")).cpu(), a @ b, rtol=1e-5, atol=1e-5)


def _mlp():
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Dropout(0.0), torch.nn.Linear(32, 5)
    )


@pytest.mark.parametrize("opt_name", ["SGD", "AdamW", "Adam-foreach-off"])
def test_training_loop_matches_cpu(opt_name):
    torch.manual_seed(0)
    cpu_model = _mlp()
    dev_model = _mlp()
    dev_model.load_state_dict(cpu_model.state_dict())
    dev_model.to("tpu")
    make = {
        "SGD": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        "AdamW": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
        "Adam-foreach-off": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    }[opt_name]
    copt, dopt = make(cpu_model.parameters()), make(dev_model.parameters())
    x, y = torch.randn(32, 16), torch.randint(0, 5, (32,))
    xd, yd = x.to("tpu"), y.to("tpu")
    for _ in range(6):
        for model, opt, xx, yy in ((cpu_model, copt, x, y), (dev_model, dopt, xd, yd)):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xx), yy)
            loss.backward()
            opt.step()
        torch.testing.assert_close(dev_model[0].weight.grad.cpu(), cpu_model[0].weight.grad, rtol=1e-4, atol=1e-5)
    for (name, p_cpu), p_dev in zip(cpu_model.named_parameters(), dev_model.parameters()):
        torch.testing.assert_close(p_dev.detach().cpu(), p_cpu.detach(), rtol=1e-4, atol=1e-5, msg=name)


def test_autograd_through_views_and_inplace():
    base = torch.randn(4, 6, requires_grad=True)
    xd = base.detach().to("tpu").requires_grad_(True)

    def f(x):
        y = x.clone()
        y[:, 2:4] *= 3
        return (y.t() @ y).tanh().sum()

    f(base).backward()
    f(xd).backward()
    torch.testing.assert_close(xd.grad.cpu(), base.grad, rtol=1e-4, atol=1e-5)


def test_bad_input_gets_pytorch_errors():
    a = torch.randn(3, 4, device="tpu")
    with pytest.raises(RuntimeError, match="size of tensor a|broadcast a dimension of length 5"):
        a + torch.randn(5, device="tpu")
    with pytest.raises(RuntimeError, match="cannot be multiplied|same reduction dim"):
        a @ torch.randn(5, 2, device="tpu")
    with pytest.raises(RuntimeError, match="can't be cast|not possible"):
        torch.arange(3, device="tpu").add_(1.5)


def test_unimplemented_op_names_aten_op_and_cpu_fallback():
    a = torch.randn(6, 2).to("tpu")
    op = torch.ops.aten._histogramdd_bin_edges.default  # histogramdd's bin edges: not lowered
    with pytest.raises(NotImplementedError, match=r"aten::_histogramdd_bin_edges.*TORCHTPU_CPU_FALLBACK"):
        op(a, [3, 4])
    torchtpu.set_cpu_fallback(True)
    try:
        with pytest.warns(UserWarning, match="_histogramdd_bin_edges"):
            out = op(a, [3, 4])
        assert all(o.device.type == "tpu" for o in out)
        for got, expected in zip(out, op(a.cpu(), [3, 4]), strict=True):
            torch.testing.assert_close(got.cpu(), expected)
        assert torchtpu.metrics()["cpu_fallbacks"] >= 1
    finally:
        torchtpu.set_cpu_fallback(False)


def test_unsupported_dtype_is_a_clear_error():
    with pytest.raises((TypeError, RuntimeError), match="not supported on the tpu device"):
        torch.zeros(3, dtype=torch.float8_e4m3fnuz, device="tpu") + 1


def test_fused_adamw_with_lr_schedule_does_not_recompile():
    torch.manual_seed(0)
    cpu = torch.nn.Linear(8, 8)
    dev = torch.nn.Linear(8, 8).to("tpu")
    dev.load_state_dict(cpu.state_dict())
    copt = torch.optim.AdamW(cpu.parameters(), lr=1e-2, fused=True)
    dopt = torch.optim.AdamW(dev.parameters(), lr=1e-2, fused=True)
    x = torch.randn(4, 8)
    compiles = None
    for step in range(4):
        for model, opt, xx in ((cpu, copt, x), (dev, dopt, x.to("tpu"))):
            for group in opt.param_groups:
                group["lr"] = 1e-2 / (step + 1)  # a schedule
            opt.zero_grad()
            model(xx).square().mean().backward()
            opt.step()
        if step == 1:
            compiles = torchtpu.metrics()["eager_compiles"]
    assert torchtpu.metrics()["eager_compiles"] == compiles
    torch.testing.assert_close(dev.weight.detach().cpu(), cpu.weight.detach(), rtol=1e-5, atol=1e-6)


def test_views_at_changing_offsets_share_one_executable():
    ts = torch.linspace(1, 0, 10, device="tpu")
    x = torch.randn(4, 4, device="tpu")
    x * ts[1]  # compiles the dynamic-offset executable
    before = torchtpu.metrics()["eager_compiles"]
    outs = [x * ts[i] for i in range(1, 10)]
    assert torchtpu.metrics()["eager_compiles"] == before
    for i, o in enumerate(outs, 1):
        torch.testing.assert_close(o.cpu(), x.cpu() * ts.cpu()[i])
    y, yc = torch.zeros(6, 5, device="tpu"), torch.zeros(6, 5)
    for i in range(5):  # strided and contiguous writes at moving offsets
        y[:, i] += i + 1.0
        yc[:, i] += i + 1.0
        y[i, 1:4] = torch.arange(3.0, device="tpu")
        yc[i, 1:4] = torch.arange(3.0)
    torch.testing.assert_close(y.cpu(), yc)


def test_crowded_memory_maps_forget_executables_and_work_goes_on(monkeypatch):
    # XLA:CPU maps every executable; past half of vm.max_map_count the engine drops its caches
    # (a long test run or op sweep would otherwise abort inside XLA at the kernel's cap).
    from torchtpu.eager import limits

    with open("/proc/self/maps", "rb") as f:
        now = f.read().count(b"\n")
    monkeypatch.setattr(limits, "_MAP_LIMIT", 2 * now)  # already crowded
    monkeypatch.setattr(limits, "CHECK_EVERY", 4)
    forgotten = torchtpu.metrics()["executables_forgotten"]
    x = torch.arange(12.0, device="tpu")
    outs = [(x[:n] * 3 + n).sum() for n in range(1, 12)]  # new shapes: new executables
    assert torchtpu.metrics()["executables_forgotten"] > forgotten
    assert [o.item() for o in outs] == [float((torch.arange(n * 1.0) * 3 + n).sum()) for n in range(1, 12)]
    torch.testing.assert_close((x * 2).cpu(), torch.arange(12.0) * 2)


def test_shedding_jax_memo_caches_keeps_every_executable(monkeypatch):
    # Every SHED_EVERY new executables JAX's Python memo caches are cleared (they keep each program's
    # lowering alive, ~1.2 MB of host memory each); the executables themselves must survive it: the
    # same ops on the same shapes afterwards compile nothing and give the same results.
    from jax._src import monitoring, pjit

    from torchtpu.eager import limits

    monkeypatch.setattr(limits, "SHED_EVERY", 3)
    shed = torchtpu.metrics()["jax_memo_caches_shed"]
    x = torch.arange(40.0, device="tpu")

    def ops():
        return [((x[:n] - 0.5) * n).exp().sum() for n in range(31, 39)]  # new shapes: new executables

    first = [o.item() for o in ops()]
    assert torchtpu.metrics()["jax_memo_caches_shed"] > shed
    limits._shed_jax_memo_caches()
    assert pjit._infer_params_cached.cache_info().currsize == 0
    compiles = torchtpu.metrics()["eager_compiles"]
    jax_work = []  # JAX tracing, lowering or compiling anything again

    def listen(event, _secs, **_kw):
        jax_work.append(event)

    monitoring.register_event_duration_secs_listener(listen)
    try:
        again = [o.item() for o in ops()]
    finally:
        monitoring.unregister_event_duration_listener(listen)
    assert torchtpu.metrics()["eager_compiles"] == compiles
    assert not [e for e in jax_work if "compile" in e or "trace" in e or "lower" in e], jax_work
    assert again == first
    torch.testing.assert_close(
        torch.tensor(first), torch.tensor([((torch.arange(n * 1.0) - 0.5) * n).exp().sum() for n in range(31, 39)])
    )


def test_clone_and_whole_copies_share_buffers_but_stay_independent():
    """clone() and copy_ of a whole storage share the source's (immutable) buffer instead of running an
    executable; a later write to either side must not show in the other."""
    a = torch.randn(4, 5)
    ta = a.to("tpu")
    compiles = torchtpu.metrics()["eager_compiles"]
    tb = ta.clone()
    tc = torch.empty(4, 5, device="tpu").copy_(ta)
    assert torchtpu.metrics()["eager_compiles"] == compiles
    ta.add_(1)
    tb.mul_(2)
    torch.testing.assert_close(ta.cpu(), a + 1)
    torch.testing.assert_close(tb.cpu(), a * 2)
    torch.testing.assert_close(tc.cpu(), a)
    # what cannot share still copies: views, casts, partial destinations, other layouts
    torch.testing.assert_close(ta[1:, ::2].clone().cpu(), (a + 1)[1:, ::2])
    torch.testing.assert_close(torch.empty(4, 5, dtype=torch.float64, device="tpu").copy_(ta).cpu(), (a + 1).double())
    part = torch.zeros(4, 10, device="tpu")
    part[:, :5].copy_(ta)
    torch.testing.assert_close(part.cpu()[:, :5], a + 1)
    assert part.cpu()[:, 5:].abs().sum() == 0
    img = torch.randn(2, 3, 4, 4).to("tpu")
    cl = img.clone(memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(cl.cpu(), img.cpu())
    tt = (a + 1).t()
    kept = tt.to("tpu").clone()  # preserve_format keeps a dense tensor's strides, as CUDA
    assert kept.stride() == tt.clone().stride()
    torch.testing.assert_close(kept.cpu(), tt)


def test_to_copy_on_the_same_device_is_a_clone():
    """`x.to(copy=True)` (generate() copies the last logits so every step) runs as clone: one executable
    for a view, none for a whole storage, and the copy stays independent of its source; casts and
    layout changes still take PyTorch's path."""
    a = torch.randn(2, 3, 8)
    ta = a.to("tpu")
    last = ta[:, -1, :].to(copy=True, dtype=torch.float32)
    whole = ta.to(copy=True)
    ta.mul_(3)
    torch.testing.assert_close(last.cpu(), a[:, -1, :])
    torch.testing.assert_close(whole.cpu(), a)
    assert last.is_contiguous() and last.shape == (2, 8)
    torch.testing.assert_close(ta[:, -1, :].to(copy=True, dtype=torch.float64).cpu(), (a * 3)[:, -1, :].double())
    tt = ta.transpose(1, 2).to(copy=True)  # preserve_format: strides as PyTorch's CPU
    assert tt.stride() == (a * 3).transpose(1, 2).to(copy=True).stride()
    torch.testing.assert_close(tt.cpu(), (a * 3).transpose(1, 2))
    z = torch.randn(3, dtype=torch.complex64)
    zc = z.to("tpu").conj().to(copy=True)  # a lazily conjugated view comes out resolved
    assert zc.is_conj() == z.conj().to(copy=True).is_conj()
    torch.testing.assert_close(zc.cpu(), z.conj())
    m = torch.ones(2, 1, dtype=torch.long, device="tpu")  # kept zero buffers: fresh storages stay fresh
    for _ in range(3):
        n = m.new_ones((2, 1))
        n.add_(1)
        assert n.cpu().tolist() == [[2], [2]]
    assert m.new_zeros((2, 1)).cpu().tolist() == [[0], [0]]


def test_small_factories_reuse_constants_exactly(monkeypatch):
    """Tensor-free ops keep the arrays of recent scalar values; -0.0 and 0.0, True and 1, NaN each
    key their own result, and writing to one result leaves the cached value alone."""
    monkeypatch.setattr(host_fills, "HOST_CALLS", 0)  # the executables' path (host fills: test_host_fills.py)
    before = torchtpu.metrics()["eager_constants_reused"]
    x = torch.full((3,), 2.0, device="tpu")
    x.add_(1)
    y = torch.full((3,), 2.0, device="tpu")
    torch.testing.assert_close(y.cpu(), torch.full((3,), 2.0))
    assert torchtpu.metrics()["eager_constants_reused"] > before
    assert torch.signbit(torch.full((2,), -0.0, device="tpu").cpu()).all()
    assert not torch.signbit(torch.full((2,), 0.0, device="tpu").cpu()).any()
    assert torch.full((2,), True, device="tpu").dtype == torch.bool
    assert torch.full((2,), 1, device="tpu").dtype == torch.int64
    assert torch.isnan(torch.full((2,), float("nan"), device="tpu").cpu()).all()
    for value in range(20):  # more values than are kept: every result is still right
        assert torch.scalar_tensor(value, device="tpu").item() == value


def test_python_numbers_in_tensor_positions_key_exactly():
    """`x * 0.5` bakes the number into its executable: -0.0 and 0.0, True and 1 each get their own,
    and NaN finds its executable again instead of compiling one per call."""
    x = torch.zeros(3, device="tpu")
    assert torch.signbit((x * -0.0).cpu()).all()
    assert not torch.signbit((x * 0.0).cpu()).any()
    b = torch.tensor([True, False], device="tpu")
    assert (b * True).dtype == (b.cpu() * True).dtype == torch.bool
    assert (b * 1).dtype == (b.cpu() * 1).dtype == torch.int64
    y = x * float("nan")
    before = torchtpu.metrics()["eager_compiles"]
    for _ in range(3):
        y = x * float("nan")
    assert torchtpu.metrics()["eager_compiles"] == before
    assert torch.isnan(y.cpu()).all()


def test_python_numbers_travel_traced_with_pytorch_promotion():
    """`x * lr`: a new Python number reuses the executable (a learning rate or a sampler's step size
    that changes every step compiles nothing), with PyTorch's wrapped-number promotion."""
    x = torch.randn(5)
    xd = x.to("tpu")
    (xd * 0.5).cpu()
    before = torchtpu.metrics()["eager_compiles"]
    for lr in (0.1, 0.2, 1e-3, -2.5, 7.0):
        torch.testing.assert_close((xd * lr).cpu(), x * lr)
        torch.testing.assert_close((xd - lr).cpu(), x - lr)
    for n in (2, 3):
        torch.testing.assert_close((xd * n).cpu(), x * n)
    assert torchtpu.metrics()["eager_compiles"] <= before + 2  # sub's first call; int other once
    cases = [
        torch.arange(4),
        torch.tensor([True, False]),
        torch.tensor(3),
        torch.ones(2, dtype=torch.float16),
        torch.ones(2, dtype=torch.bfloat16),
    ]
    for t in cases:
        for number in (2, 2.5, True, 1e5, -3):
            for op in (lambda a, b: a * b, lambda a, b: a + b, lambda a, b: b - a, lambda a, b: a / b):
                try:
                    want = op(t, number)
                except RuntimeError as e:  # bool - bool: the device refuses it as the CPU does
                    with pytest.raises(RuntimeError, match=re.escape(str(e).split(".")[0])):
                        op(t.to("tpu"), number)
                    continue
                got = op(t.to("tpu"), number)
                assert got.dtype == want.dtype, (t.dtype, number)
                torch.testing.assert_close(got.cpu(), want, equal_nan=True)


def test_small_ops_reuse_results_of_the_same_buffers():
    """A small deterministic op called again on the same input buffers and scalars returns the kept
    result (generate() asks for isin(arange(vocab), eos) twice per token); a write to an input, a
    different scalar or a write to the result itself all behave as if it had run again, and an op
    with a device-side assert raises every time."""
    vocab = torch.arange(1024, device="tpu")
    eos = torch.tensor([2, 7], device="tpu")
    before = torchtpu.metrics()["eager_results_reused"]
    first = torch.isin(vocab, eos)
    again = torch.isin(vocab, eos)
    assert torchtpu.metrics()["eager_results_reused"] == before + 1
    assert again.nonzero().flatten().tolist() == [2, 7]
    again[3] = True  # a write to a kept result is its own
    assert first.nonzero().flatten().tolist() == [2, 7]
    assert torch.isin(vocab, eos).nonzero().flatten().tolist() == [2, 7]
    eos[0] = 5  # the input changed: computed again
    assert torch.isin(vocab, eos).nonzero().flatten().tolist() == [5, 7]
    assert torch.add(vocab, 1, alpha=2)[:2].tolist() == [2, 3]
    assert torch.add(vocab, 1, alpha=3)[:2].tolist() == [3, 4]  # scalars are part of the key
    z = torch.zeros(4, device="tpu")
    assert not torch.signbit(torch.add(z, 0.0, alpha=-0.0).cpu()).any()
    assert not torch.signbit(torch.add(z, 0.0, alpha=0.0).cpu()).any()
    table = torch.randn(8, 4, device="tpu")
    bad = torch.tensor([9], device="tpu")
    for _ in range(2):
        torch.tpu.synchronize()
        with pytest.raises(Exception, match="out of"):
            table[bad].cpu()
        torch.tpu.clear_device_assert()  # (sticky until cleared, as on CUDA)


@pytest.mark.parametrize(
    "shape,dim,n",
    [((1, 4, 4096, 8), 2, 1), ((2, 3, 1024, 8), 2, 3), ((4096, 8), 0, 2), ((8, 4096), 1, 5), ((3, 4, 1500), -1, 1)],
)
def test_index_copy_of_a_slab_into_a_large_array(shape, dim, n):
    """A static KV cache's update (index_copy_ along the sequence, or index_put): large arrays take the
    flat-scatter form (ops/indexing.py); values equal the CPU's in eager mode and in a compiled graph,
    for float, half and integer dtypes, and an index out of range is still a device-side assert."""
    gen = torch.Generator().manual_seed(3)
    d = dim % len(shape)
    idx = torch.randperm(shape[d], generator=gen)[:n]
    src_shape = list(shape)
    src_shape[d] = n
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        x = (torch.randn(shape, generator=gen) * 10).to(dtype)
        src = (torch.randn(src_shape, generator=gen) * 10).to(dtype)
        want = x.clone().index_copy_(dim, idx, src)
        got = x.to("tpu").index_copy_(dim, idx.to("tpu"), src.to("tpu"))
        assert torch.equal(got.cpu(), want)
        at = [slice(None)] * len(shape)  # the same write as x[:, :, idx] = src (index_put),
        at[d] = idx - shape[d]  # with negative indices
        put = x.to("tpu")
        put[tuple(i.to("tpu") if isinstance(i, torch.Tensor) else i for i in at)] = src.to("tpu")
        assert torch.equal(put.cpu(), want)
    step = torch.compile(lambda c, i, s: c.index_copy_(dim, i, s), backend="tpu")
    cache = x.to("tpu")
    step(cache, idx.to("tpu"), src.to("tpu"))
    assert torch.equal(cache.cpu(), want)
    bad = torch.tensor([shape[d]])
    with pytest.raises(Exception, match="index out of bounds"):
        one = list(shape)
        one[d] = 1
        x.to("tpu").index_copy_(dim, bad.to("tpu"), torch.zeros(one, dtype=x.dtype).to("tpu"))
        torch.tpu.synchronize()


def test_writes_through_small_views_of_large_storages():
    """A slice of one position in a (1, 4, 4096, 8) cache, a column of a wide matrix, a strided patch:
    views covering a small part of a large block are written as a scatter at their own offsets
    (ops/views.py); values equal the CPU's, at fixed and at changing (traced) offsets."""
    gen = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        c = (torch.randn(1, 4, 4096, 8, generator=gen) * 10).to(dtype)
        k = (torch.randn(1, 4, 1, 8, generator=gen) * 10).to(dtype)
        ct, kt = c.to("tpu"), k.to("tpu")
        c[:, :, 5:6] = k
        ct[:, :, 5:6] = kt
        for p in range(3):  # the storage offset changes: one executable, offset traced
            c.narrow(2, 100 + p, 1).copy_(k + p)
            ct.narrow(2, 100 + p, 1).copy_(kt + p)
        assert torch.equal(ct.cpu(), c)
    x = torch.randn(64, 1024, generator=gen)
    xt = x.to("tpu")
    x[:, 3] = 7
    xt[:, 3] = 7
    x[10:20, 100:110:3] += 1
    xt[10:20, 100:110:3] += 1
    assert torch.equal(xt.cpu(), x)


def test_in_place_ops_on_large_storages_donate_unshared_buffers():
    """An in-place op on a storage of at least DONATE_BYTES gives XLA the old buffer when nothing else
    refers to it (eager/engine.py); a buffer shared with a clone is kept, and every tensor involved
    reads the right values afterwards."""
    from torchtpu.eager.entry import DONATE_BYTES

    n = DONATE_BYTES // 4
    base = torch.randn(4, n // 4)
    big = base.to("tpu")
    view = big[1]
    before = torchtpu.metrics()["eager_donations"]
    big.add_(1)
    assert torchtpu.metrics()["eager_donations"] == before + 1
    twin = big.clone()  # shares the buffer: the next write must not donate it
    big[:, :3] = 0
    assert torchtpu.metrics()["eager_donations"] == before + 1
    twin.mul_(2)  # big has a new buffer now: twin's is its own again
    assert torchtpu.metrics()["eager_donations"] == before + 2
    want = base + 1
    torch.testing.assert_close(twin.cpu(), want * 2)
    want[:, :3] = 0
    torch.testing.assert_close(big.cpu(), want)
    torch.testing.assert_close(view.cpu(), want[1])
    small = torch.zeros(8, device="tpu")
    small.add_(1)
    assert torchtpu.metrics()["eager_donations"] == before + 2  # small storages are copied
