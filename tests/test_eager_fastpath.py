"""The eager engine's C++ fast path (eager/fastpath.py): it serves plain strict-mode calls with the
results the Python kernel gives, counts them as cache hits, and leaves everything else to the
Python kernel. (Ops whose inputs and results total at most 16 KiB keep their last results
(Entry.memo): most tests use larger tensors; one checks the memo on the fast path.)"""

import os
import subprocess
import sys

import pytest
import torch

import torchtpu
from torchtpu.eager import fastpath

pytestmark = pytest.mark.skipif(not fastpath.loaded(), reason=f"no C++ fast path: {fastpath.problem()}")


def _served(fn):
    """fn's result and how many of its calls the C++ fast path served."""
    before = fastpath.stats()["fast_calls"]
    out = fn()
    return out, fastpath.stats()["fast_calls"] - before


def test_plain_ops_take_the_fast_path_and_match_the_python_kernel():
    a_c, b_c = torch.randn(64, 64), torch.randn(64, 64)
    a, b = a_c.to("tpu"), b_c.to("tpu")
    a + b  # first call of the key: the Python kernel runs it and describes the entry
    out, served = _served(lambda: [a + b, a.add(b, alpha=-0.25), a[2:5] * b[2:5], a.t() - b.t(), a * 3.5])
    hits, compiles = torchtpu.metrics()["eager_cache_hits"], torchtpu.metrics()["eager_compiles"]
    out, served = _served(lambda: [a + b, a.add(b, alpha=0.75), a[3:6] * b[3:6], a.t() - b.t(), a * 1.5])
    assert served == 5
    assert torchtpu.metrics()["eager_cache_hits"] - hits == 5  # counted as hits, as in Python
    assert torchtpu.metrics()["eager_compiles"] == compiles
    expected = [a_c + b_c, a_c.add(b_c, alpha=0.75), a_c[3:6] * b_c[3:6], a_c.t() - b_c.t(), a_c * 1.5]
    for got, want in zip(out, expected):
        assert got.device.type == "tpu" and got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want)
    fastpath.set_enabled(False)
    try:
        slow, served = _served(lambda: [a + b, a.add(b, alpha=0.75), a[3:6] * b[3:6], a.t() - b.t(), a * 1.5])
    finally:
        fastpath.set_enabled(True)
    assert served == 0
    for got, want in zip(out, slow):
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=0, atol=0)


def test_inplace_on_a_view_updates_the_base():
    x_c = torch.randn(64, 64)
    src_c = torch.randn(64, 4)
    x, src = x_c.to("tpu"), src_c.to("tpu")
    x[:, 2:6].add_(src)
    x_c[:, 2:6].add_(src_c)
    for i in range(3):
        view = x[:, 2:6]
        r, served = _served(lambda: view.mul_(1.5).add_(src, alpha=0.5 * i))
        x_c[:, 2:6].mul_(1.5).add_(src_c, alpha=0.5 * i)
        assert r is view
    assert served == 2
    torch.testing.assert_close(x.cpu(), x_c)
    assert x[:, 2:6]._version == x[:, 2:6]._version  # (the version counter is PyTorch's: shared)


def test_out_variant_returns_its_out_argument():
    a, b = torch.randn(64, 64, device="tpu"), torch.randn(64, 64, device="tpu")
    out = torch.empty(64, 64, device="tpu")
    torch.add(a, b, out=out)
    r, served = _served(lambda: torch.add(a, b, out=out))
    assert r is out and served == 1
    torch.testing.assert_close(out.cpu(), a.cpu() + b.cpu())


def test_cpu_scalars_and_aliasing_key_the_call():
    a = torch.randn(4096, device="tpu")
    for value in (2.0, 3.0):
        got, _ = _served(lambda: a * torch.tensor(value, dtype=torch.float64))
        torch.testing.assert_close(got.cpu(), a.cpu() * value)
    for _ in range(2):
        same = a + a  # one storage in two slots: another key than a + b
        torch.testing.assert_close(same.cpu(), a.cpu() * 2)
        c = torch.randn(4096, device="tpu")
        other = a + c
        torch.testing.assert_close(other.cpu(), a.cpu() + c.cpu())


def test_other_modes_and_states_take_the_python_kernel():
    a, b = torch.randn(4096, device="tpu"), torch.randn(4096, device="tpu")
    a + b
    a + b
    with torch.tpu.eager_mode("debug"):
        got, served = _served(lambda: a + b)
        assert served == 0
        torch.testing.assert_close(got.cpu(), a.cpu() + b.cpu())
    with torch.tpu.compiler.custom_compiler_options({"xla_cpu_enable_fast_math": False}):
        got, served = _served(lambda: a + b)
        assert served == 0
    got, served = _served(lambda: a + b)
    assert served == 1


def test_errors_still_come_from_the_python_kernel():
    a = torch.randn(4, device="tpu")
    a + a
    with pytest.raises(RuntimeError, match="must match the size of tensor b"):
        a + torch.randn(5, device="tpu")
    with pytest.raises(RuntimeError, match="same device"):
        a + torch.randn(4)


def test_autograd_through_the_fast_path():
    w_c = torch.randn(4096, requires_grad=True)
    w = w_c.detach().to("tpu").requires_grad_()
    for _ in range(3):
        ((w * w + w) * 0.5).sum().backward()
        ((w_c * w_c + w_c) * 0.5).sum().backward()
    torch.testing.assert_close(w.grad.cpu(), w_c.grad)


def test_forget_executables_clears_the_fast_entries():
    from torchtpu.eager.limits import forget_executables

    a, b = torch.randn(4096, device="tpu"), torch.randn(4096, device="tpu")
    a - b
    a - b
    forget_executables()
    got, served = _served(lambda: a - b)  # a key the C++ side no longer knows: Python first
    assert served == 0
    torch.testing.assert_close(got.cpu(), a.cpu() - b.cpu())
    got, served = _served(lambda: a - b)
    assert served == 1


def test_switched_off_by_environment():
    code = (
        "import torch; from torchtpu.eager import fastpath; a = torch.ones(3, device='tpu'); "
        "print(fastpath.loaded(), fastpath.problem(), (a + a).cpu().tolist())"
    )
    # both switches at once: each child spends seconds importing, on one core
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        for env in ({"TORCHTPU_EAGER_FAST": "0"}, {"TORCHTPU_NATIVE": "off"})
    ]
    try:
        for child in children:
            out, err = child.communicate(timeout=300)
            assert child.returncode == 0, err[-2000:]
            assert "False" in out and "[2.0, 2.0, 2.0]" in out, out
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_outputs_made_in_cpp_are_what_new_tensor_makes():
    import gc

    from torchtpu.storage import records as R

    a, b = torch.randn(64, 64, device="tpu"), torch.randn(64, 64, device="tpu")
    a + b
    a + b

    def stats():
        s = R._stats[0]
        return (s.allocated, s.num_alloc, s.num_free, s.materialized, s.peak, s.peak_materialized, s.failed)

    def make(native):
        was = fastpath.set_native_outputs(native)
        try:
            gc.collect()  # (storages earlier tests left to the collector are freed now, not below)
            before, n = stats(), len(R.RECORDS)
            c, served = _served(lambda: a + b)
            assert served == 1
            grown = tuple(x - y for x, y in zip(stats(), before))
            st = c.untyped_storage()
            rec = R.RECORDS[st.data_ptr()]
            facts = dict(
                keys=str(torch._C._dispatch_keys(c)),
                storage=(st.resizable(), st.nbytes(), str(st.device)),
                layout=(tuple(c.shape), c.stride(), c.storage_offset(), c.dtype, c._version),
                record=(
                    rec.dtype,
                    rec.numel,
                    rec.nbytes,
                    rec.device_index,
                    rec.oom,
                    rec.ref.address,
                    rec.ref() is not None,
                ),
                grown=grown,
                records=len(R.RECORDS) - n,
                value=c.cpu(),
            )
            address = st.data_ptr()
            facts["record"] = facts["record"][:5] + (facts["record"][5] == address,) + facts["record"][6:]
            del c, st, rec
            gc.collect()
            facts["freed"] = address not in R.RECORDS
            facts["after_free"] = tuple(x - y for x, y in zip(stats(), before))
            return facts
        finally:
            fastpath.set_native_outputs(was)

    cpp, python = make(True), make(False)
    torch.testing.assert_close(cpp.pop("value"), python.pop("value"), rtol=0, atol=0)
    assert cpp == python
    assert python["freed"] and python["grown"][0] == 64 * 64 * 4


def test_kept_device_scalars_give_the_same_results_and_compile_nothing():
    import jax

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event) if "backend_compile" in event else None
    )
    a_c, b_c = torch.randn(64, 64), torch.randn(64, 64)
    a, b = a_c.to("tpu"), b_c.to("tpu")
    was = fastpath.set_cache_scalars(False)
    try:
        for alpha in (0.5, 0.25):  # Python numbers: the executables are built and called
            a[:, 4:12].add_(b[:, :8], alpha=alpha)
            a_c[:, 4:12].add_(b_c[:, :8], alpha=alpha)
            (a * 2.5)[5:9] + b[5:9]
        fastpath.set_cache_scalars(True)
        del compiles[:]
        for alpha in (0.5, 0.75, 0.5):  # kept device arrays (uncommitted, as JAX makes them)
            _, served = _served(lambda: a[:, 4:12].add_(b[:, :8], alpha=alpha))
            a_c[:, 4:12].add_(b_c[:, :8], alpha=alpha)
            assert served == 1
            got = (a * 2.5)[5:9] + b[5:9]
        assert not compiles, compiles
    finally:
        fastpath.set_cache_scalars(was)
    torch.testing.assert_close(a.cpu(), a_c)
    torch.testing.assert_close(got.cpu(), (a_c * 2.5)[5:9] + b_c[5:9])


def test_matmuls_take_the_fast_path_and_the_matmul_precision_keys_them():
    """Matmul lowerings read torch.get_float32_matmul_precision(): the C++ key holds it, so a matmul
    is served after its first call at each setting, and a change of setting is a new executable."""
    a_c, b_c, w_c = torch.randn(64, 48), torch.randn(48, 64), torch.randn(32, 48)
    a, b, w = a_c.to("tpu"), b_c.to("tpu"), w_c.to("tpu")
    ops = [
        lambda x, y, z: x @ y,
        lambda x, y, z: torch.nn.functional.linear(x, z),
        lambda x, y, z: torch.bmm(x[None], y[None]),
    ]
    was = torch.get_float32_matmul_precision()
    try:
        for setting in ("highest", "medium", "highest"):
            torch.set_float32_matmul_precision(setting)
            compiles = torchtpu.metrics()["eager_compiles"]
            first = [op(a, b, w) for op in ops]
            new_executables = torchtpu.metrics()["eager_compiles"] - compiles
            out, served = _served(lambda: [op(a, b, w) for op in ops])
            assert served == len(ops), setting
            for got, again, op in zip(first, out, ops):
                want = op(a_c, b_c, w_c)
                torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(again.cpu(), got.cpu(), atol=0, rtol=0)
            if setting == "medium":
                assert new_executables >= len(ops)  # not the executables built for "highest"
    finally:
        torch.set_float32_matmul_precision(was)
    assert new_executables == 0  # back at "highest": the first executables, from the fast table


def test_threads_running_one_op_on_different_shapes():
    import threading

    errors = []

    def work(rows):
        try:
            p_c, q_c = torch.randn(rows, 64), torch.randn(rows, 64)
            p, q = p_c.to("tpu"), q_c.to("tpu")
            for _ in range(60):
                r = p * q
                assert r.shape == (rows, 64)
            torch.testing.assert_close(r.cpu(), p_c * q_c)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(rows,)) for rows in (64, 96, 128, 160)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_ops_with_several_results_take_the_fast_path():
    """Functional ops whose returns are all new tensors (attention, var_mean, max.dim, layer norm)."""
    F = torch.nn.functional
    q_c, k_c, v_c, x_c = (
        torch.randn(1, 8, 1, 64),
        torch.randn(1, 8, 40, 64),
        torch.randn(1, 8, 40, 64),
        torch.randn(64, 300),
    )
    q, k, v, x = q_c.to("tpu"), k_c.to("tpu"), v_c.to("tpu"), x_c.to("tpu")
    ops = [
        lambda q, k, v, x: F.scaled_dot_product_attention(q, k, v),
        lambda q, k, v, x: torch.var_mean(x, dim=1),
        lambda q, k, v, x: tuple(x.max(dim=1)),
        lambda q, k, v, x: F.layer_norm(x, (300,)),
    ]
    first = [op(q, k, v, x) for op in ops]
    out, served = _served(lambda: [op(q, k, v, x) for op in ops])
    assert served == len(ops)
    for got, again, op in zip(first, out, ops):
        want = op(q_c, k_c, v_c, x_c)
        torch.testing.assert_close(torch.utils._pytree.tree_map(lambda t: t.cpu(), again), want)
        torch.testing.assert_close(torch.utils._pytree.tree_map(lambda t: t.cpu(), got), want)


def test_device_side_checks_on_the_fast_path_still_raise_at_the_next_sync():
    """An op with a device-side assert (embedding's index range) is served, its verdict kept: a bad
    index raises at the next synchronization, naming the op, as from the Python kernel."""
    from torchtpu.eager.asserts import DeviceAssertError

    w_c = torch.randn(10, 4096)
    w = w_c.to("tpu")
    good, bad = torch.tensor([1, 2], device="tpu"), torch.tensor([1, 12], device="tpu")
    torch.nn.functional.embedding(good, w)
    out, served = _served(lambda: torch.nn.functional.embedding(good, w))
    assert served == 1
    torch.testing.assert_close(out.cpu(), w_c[[1, 2]])
    _, served = _served(lambda: torch.nn.functional.embedding(bad, w))
    assert served == 1
    try:
        with pytest.raises(DeviceAssertError, match="aten::embedding.default: index out of range"):
            torch.tpu.synchronize()
    finally:
        torch.tpu.clear_device_assert()


def test_index_select_is_served_unless_the_host_knows_its_index():
    """index_select's host check raises only for an index whose values the host knows (one just
    copied from the CPU): a call with an index made on the device is served, its range checked on the
    device; one with a known index runs the Python kernel, which raises at the op as the CPU does."""
    from torchtpu.eager.asserts import DeviceAssertError

    x_c = torch.randn(64, 64)
    x = x_c.to("tpu")
    known = torch.tensor([3, 60, 7]).to("tpu")  # the host keeps its values (storage/host_values.py)
    made = known.clone()  # the same values in a storage of its own, which the host does not know
    x.index_select(0, known)
    out, served = _served(lambda: x.index_select(0, made))
    assert served == 1
    torch.testing.assert_close(out.cpu(), x_c.index_select(0, torch.tensor([3, 60, 7])), rtol=0, atol=0)
    _, served = _served(lambda: x.index_select(0, known))
    assert served == 0
    with pytest.raises(IndexError, match="index out of range in self"):
        x.index_select(0, torch.tensor([3, 64, 7]).to("tpu"))
    bad = torch.tensor([3, 64, 7]).to("tpu").clone()
    _, served = _served(lambda: x.index_select(0, bad))
    assert served == 1
    try:
        with pytest.raises(DeviceAssertError, match="aten::index_select.default: index out of bounds"):
            torch.tpu.synchronize()
    finally:
        torch.tpu.clear_device_assert()


def test_host_checked_scalars_and_memoized_small_ops_take_the_fast_path():
    """pow's exponent check cannot fail for a float tensor, so the call is served (an integer tensor
    to a negative power still raises at every call); small ops keep their last results (Entry.memo)
    and reuse them on the fast path, for the same inputs and numbers only."""
    big_c, small_c = torch.randn(8192), torch.randn(64)
    big, small = big_c.to("tpu"), small_c.to("tpu")
    big.pow(2)
    out, served = _served(lambda: big.pow(2))
    assert served == 1
    torch.testing.assert_close(out.cpu(), big_c.pow(2))
    ints = torch.arange(5, device="tpu")
    for _ in range(3):
        with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
            ints.pow(-1)
    for value in (1.5, 2.5):
        small + value
    reused = torchtpu.metrics()["eager_results_reused"]
    out, served = _served(lambda: [small + v for v in (1.5, 2.5, 1.5, -0.0, 0.0, 2.5)])
    assert served == 6
    assert torchtpu.metrics()["eager_results_reused"] > reused
    for got, v in zip(out, (1.5, 2.5, 1.5, -0.0, 0.0, 2.5)):
        torch.testing.assert_close(got.cpu(), small_c + v, rtol=0, atol=0)
    small.add_(1.0)  # a new buffer: nothing kept for the old one applies
    torch.testing.assert_close((small + 1.5).cpu(), small_c + 1.0 + 1.5, rtol=0, atol=0)


def test_writes_with_checks_and_gated_writes_take_the_fast_path():
    """index_copy_ (a write with a device-side check) is served; while a failed verdict is not yet
    checked, a later write is served in its gated form and keeps the old value, as from the Python
    kernel (eager/asserts.py)."""
    from torchtpu.eager.asserts import DeviceAssertError

    cache_c, src_c, x_c = torch.zeros(4, 64, 32), torch.randn(4, 1, 32), torch.randn(2048)
    cache, src, x, acc = cache_c.to("tpu"), src_c.to("tpu"), x_c.to("tpu"), torch.zeros(2048, device="tpu")
    table = torch.randn(10, 2048, device="tpu")
    good, bad = torch.tensor([1, 2], device="tpu"), torch.tensor([1, 12], device="tpu")
    for position in (5, 6):
        _, served = _served(lambda: cache.index_copy_(1, torch.tensor([position], device="tpu"), src))
        cache_c.index_copy_(1, torch.tensor([position]), src_c)
    assert served == 1
    torch.testing.assert_close(cache.cpu(), cache_c, rtol=0, atol=0)
    torch.nn.functional.embedding(good, table)
    acc.add_(x)
    torch.tpu.synchronize()
    torch.nn.functional.embedding(bad, table)  # its verdict (failed) is not checked yet
    _, served = _served(lambda: acc.add_(x))
    assert served == 1
    try:
        with pytest.raises(DeviceAssertError, match="index out of range"):
            torch.tpu.synchronize()
    finally:
        torch.tpu.clear_device_assert()
    torch.testing.assert_close(acc.cpu(), x_c, rtol=0, atol=0)  # the gated add_ was not committed
    _, served = _served(lambda: acc.add_(x))
    assert served == 1
    torch.testing.assert_close(acc.cpu(), x_c * 2)


def test_fused_mode_queues_through_the_fast_path():
    """In the "fused" mode the C++ side keys the call and makes the outputs, and the engine queues
    it (OpKernel._run): results and in-place writes as in strict mode, segments compiled as before,
    an error raised where the Python kernel raises it."""
    from torchtpu.eager import fusion

    x_c, w_c = torch.randn(64, 256), torch.randn(256, 256)
    x, w = x_c.to("tpu"), w_c.to("tpu")
    step = lambda x, w: (torch.tanh(x @ w * 0.05), torch.var_mean(x, dim=1))
    step(x, w)  # (the strict first calls describe the entries)
    runs = torchtpu.metrics()["fused_runs"]
    with torch.tpu.eager_mode("fused"):
        for i in range(40):
            (out, (var, mean)), served = _served(lambda: step(x, w))
            (out_c, (var_c, _)) = step(x_c, w_c)
            x.add_(out, alpha=0.1)
            x_c.add_(out_c, alpha=0.1)
            if i == 20:
                fusion.wait_for_compiles()
        torch.testing.assert_close(x.cpu(), x_c, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(var.cpu(), var_c, rtol=1e-4, atol=1e-4)
        assert served == 4  # mm, mul, tanh, var_mean
        assert torchtpu.metrics()["fused_runs"] > runs  # the repeating segment ran compiled
        with pytest.raises(RuntimeError):
            x @ torch.randn(3, 3, device="tpu")


def test_clones_of_views_take_the_fast_path_and_whole_storages_still_share():
    """generate() clones a slice of its token ids every step: after the first call that clone is
    served in C++; a clone of a whole storage still shares its buffer (no executable), and
    preserve_format still keeps a transposed tensor's strides."""
    from torchtpu.storage.records import record_of

    c = torch.randn(3, 40)
    x = c.to("tpu")
    for i in range(4):
        piece, served = _served(lambda: x[:, -1:].clone(memory_format=torch.contiguous_format))
        if i:
            assert served == 1
        assert piece.is_contiguous() and torch.equal(piece.cpu(), c[:, -1:])
        whole = x.clone()
        assert record_of(whole)._buffer is record_of(x)._buffer  # shared, nothing ran
        t = x.t().clone()
        assert t.stride() == (1, 40) and torch.equal(t.cpu(), c.t())
        t2 = x.t().clone(memory_format=torch.contiguous_format)
        assert t2.stride() == (3, 1) and torch.equal(t2.cpu(), c.t())


def test_metadata_ops_are_served_in_cpp_and_share_the_storage():
    """view, as_strided, _unsafe_view and friends (every composite view op ends in one of them) get a
    C++ kernel on PrivateUse1 that hands them to the CPU kernel: no Python frame per view, the same
    aliasing as before (a write through any view reaches the base)."""
    for name in ("aten::view", "aten::as_strided", "aten::_unsafe_view", "aten::_reshape_alias", "aten::alias"):
        line = [s for s in torch._C._dispatch_dump(name).splitlines() if s.startswith("PrivateUse1:")]
        assert line and "metadata-only op" in line[0], (name, line)
    c = torch.randn(4, 6)
    x = c.to("tpu")
    views = [
        x.view(6, 4),
        x.t(),
        x.unsqueeze(0),
        x[1:3, ::2],
        x.as_strided((2, 2), (6, 1), 1),
        x.reshape(24),
        x.unfold(1, 2, 2),
        x.view(torch.int32),
    ]
    expected = [
        c.view(6, 4),
        c.t(),
        c.unsqueeze(0),
        c[1:3, ::2],
        c.as_strided((2, 2), (6, 1), 1),
        c.reshape(24),
        c.unfold(1, 2, 2),
        c.view(torch.int32),
    ]
    for v, e in zip(views, expected):
        assert v.device.type == "tpu" and v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert v.shape == e.shape and v.stride() == e.stride() and v.storage_offset() == e.storage_offset()
        torch.testing.assert_close(v.cpu(), e)
    x.t()[2, 1].fill_(7.0)
    c.t()[2, 1].fill_(7.0)
    torch.testing.assert_close(x.cpu(), c)
    with pytest.raises(RuntimeError, match="view size is not compatible|invalid for input of size"):
        x.t().view(24)


_CONVERSIONS = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.complex64])
def test_dtype_conversions_take_the_fast_path_and_match_the_cpu(src):
    """`x.to(dtype)` on the device (a bfloat16 model's norms convert twice each) is one engine
    executable that the C++ fast path serves from the second call, with the CPU's values (a fresh
    random input per dtype, fractions and negatives within every target's range: out of range a
    float-to-integer conversion is undefined in PyTorch, and CPU and CUDA differ); complex to real
    keeps PyTorch's path (it warns), a transposed tensor keeps its strides, `.to("cpu")` is unchanged."""
    c = (torch.randn(6, 10) * 40).clamp(-120, 120).to(src) if src != torch.bool else torch.rand(6, 10) > 0.5
    for dtype in _CONVERSIONS:
        if dtype == src or (src.is_complex and not dtype.is_complex):
            continue
        if dtype == torch.uint8 and src != torch.bool:
            c = c.abs()
        x = c.to("tpu")
        for i in range(3):
            y, served = _served(lambda: x.to(dtype))
            if i:
                assert served == 1, dtype
            assert y.dtype == dtype and y.device.type == "tpu"
            torch.testing.assert_close(y.cpu(), c.to(dtype), rtol=0, atol=0)
        t = x.t().to(dtype)
        assert t.stride() == c.t().to(dtype).stride()
        torch.testing.assert_close(t.cpu(), c.t().to(dtype), rtol=0, atol=0)
        torch.testing.assert_close(x[2:4].to(dtype).cpu(), c[2:4].to(dtype), rtol=0, atol=0)
    back = c.to("tpu").to("cpu", torch.complex128)
    assert back.device.type == "cpu"
    torch.testing.assert_close(back, c.to(torch.complex128))


def test_dtype_conversion_keeps_autograd_and_complex_to_real_warns_as_on_cpu():
    c = torch.randn(4, 5)
    x = c.to("tpu").requires_grad_()
    (x.to(torch.bfloat16).float() * 3).sum().backward()
    assert x.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad.cpu(), torch.full((4, 5), 3.0))
    z = torch.randn(3, dtype=torch.complex64)
    with pytest.warns(UserWarning, match="discards the imaginary part") as caught:
        r = z.to("tpu").to(torch.float32)
    torch.testing.assert_close(r.cpu(), z.real)
    # (JAX's own deprecation of an implicit complex-to-real astype is not what the user sees)
    assert not [w for w in caught if "jnp.real" in str(w.message)]
