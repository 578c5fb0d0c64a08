"""Cold start: what a first call on a new shape costs (benchmarks/cold_start.py measures it)."""

from __future__ import annotations

import itertools
import os

import jax
import pytest
import torch
import torch.nn.functional as F
from jax._src import compiler

import torchtpu
from torchtpu.device import platform
from torchtpu.eager import bucketed_draws, executable, stand_ins
from torchtpu.ops import dtypes as dt

_sizes = itertools.count(int.from_bytes(os.urandom(2), "little") % 1000 + 3000)


def _fresh_shape():
    """A shape no executable (in memory or in the on-disk cache) was built for."""
    return (5, next(_sizes))


@pytest.fixture
def xla_compiles(monkeypatch):
    """The XLA compiles that really ran (not served by a cache)."""
    seen = []
    real = compiler.backend_compile_and_load

    def counted(*args, **kwargs):
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "backend_compile_and_load", counted)
    return seen


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.int64, torch.float64, torch.bool, torch.complex64]
)
def test_small_zeros_come_from_the_host_without_a_compile(xla_compiles, dtype):
    shape = _fresh_shape()
    z = executable.zeros(shape, dtype, 0)
    assert not xla_compiles
    assert z.shape == shape and z.dtype == dt.to_jax(dtype) and z.devices() == {platform.jax_device(0)}
    assert not jax.numpy.any(z)


def test_large_zeros_are_made_on_the_device(xla_compiles):
    n = executable.HOST_ZEROS // 4 + next(_sizes)
    z = executable.zeros((n,), torch.float32, 0)
    assert len(xla_compiles) == 1 and z.shape == (n,) and not jax.numpy.any(z)


def test_a_never_written_storage_reads_as_zeros_with_a_new_shape():
    shape = _fresh_shape()
    t = torch.empty(shape, device="tpu", dtype=torch.float64)
    t.add_(1.5)  # reads the storage: its zeros, sent from the host
    torch.testing.assert_close(t.cpu(), torch.full(shape, 1.5, dtype=torch.float64))


@pytest.mark.skipif(torch.tpu.platform() != "cpu", reason="a default of XLA:CPU only")
@pytest.mark.parametrize(
    "op",
    [
        lambda x: torch.randn(x.shape, device=x.device),
        lambda x: torch.rand(x.shape, device=x.device, dtype=torch.float64),
        lambda x: torch.tanh(x * 2 + 1),
        lambda x: F.gelu(x),
        lambda x: torch.softmax(x, -1),
        lambda x: x.sum(0),
        lambda x: F.layer_norm(x, x.shape[-1:]),
        lambda x: x.to(torch.bfloat16) * 3,
        lambda x: torch.special.erfinv(x / 8),
    ],
    ids=["randn", "rand_f64", "tanh", "gelu", "softmax", "sum0", "layer_norm", "bf16", "erfinv"],
)
def test_one_op_executables_at_llvm_o1_give_the_bits_of_o3(op):
    """One-op executables compile at LLVM -O1 on XLA:CPU (less compile time); their results are
    bitwise those of XLA's default -O3."""
    cpu = torch.randn(_fresh_shape(), generator=torch.Generator().manual_seed(1)) * 3
    results = []
    for options in ({}, {"xla_backend_optimization_level": 3}):  # (strict: one op, one executable)
        with torch.tpu.compiler.custom_compiler_options(options), torchtpu.eager_mode("strict"):
            x = cpu.to("tpu")
            torch.manual_seed(7)
            results.append(op(x).cpu())
    assert torch.equal(results[0].view(torch.uint8), results[1].view(torch.uint8))


def _decoder_block(x, w1, w2, w3, wq):
    """RMSNorm, attention over the rows, a gated SiLU MLP: the ops of a Transformer layer."""
    h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)
    q = h @ wq
    a = torch.softmax((q @ h.transpose(-1, -2)).float() / 8, -1).to(x.dtype) @ h
    h = x + a
    return h + (F.silu(h @ w1) * (h @ w3)) @ w2


@pytest.mark.skipif(torch.tpu.platform() != "cpu", reason="a default of XLA:CPU only")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 32])
def test_a_compiled_graph_at_llvm_o1_gives_the_bits_of_o3(dtype, rows):
    """Compiled graphs compile at LLVM -O1 on XLA:CPU too (a 28-layer model's graphs: ~30% less
    compile time). A decode step's and a prefill's rows over a model's widths give the bits of -O3
    (odd shapes, 7 x 100, can differ in a reduction's last bit: docs/design.md); the CPU's within
    rounding."""
    g = torch.Generator().manual_seed(3)
    width = 256
    cpu = [torch.randn(rows, width, generator=g)] + [
        torch.randn(width, width, generator=g) / width**0.5 for _ in range(4)
    ]
    cpu = [t.to(dtype) for t in cpu]
    f = torch.compile(_decoder_block, backend="tpu")
    results = []
    for options in ({}, {"xla_backend_optimization_level": 3}):
        with torch.tpu.compiler.custom_compiler_options(options):
            results.append(f(*[t.to("tpu") for t in cpu]).cpu())
    assert torch.equal(results[0].view(torch.uint8), results[1].view(torch.uint8))
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(results[0], _decoder_block(*cpu), **tol)


def test_only_reductions_of_numbers_take_the_reduction_emitters():
    """Reductions of booleans (device-side checks of index ops, any/all) keep the LLVM IR emitters."""
    from torchtpu.eager.xla_options import _reduces

    x, i = jax.numpy.ones((4, 5)), jax.numpy.ones((3,), "int32")
    flags = lambda i: jax.numpy.stack([i > 0, i < 9])
    assert _reduces(jax.make_jaxpr(lambda x: x.sum(0))(x))
    assert _reduces(jax.make_jaxpr(lambda x: x.argmax(0))(x))
    assert _reduces(jax.make_jaxpr(lambda x: (x > 0).sum())(x))  # (summed as integers)
    assert not _reduces(jax.make_jaxpr(lambda i: jax.numpy.all(flags(i)))(i))
    assert not _reduces(jax.make_jaxpr(lambda i: jax.numpy.argmin(flags(i)))(i))
    assert not _reduces(jax.make_jaxpr(lambda x: jax.numpy.any(x > 0, 1))(x))


# ---------------------------------------------------------------- random fills drawn by size bucket
_FILLS = {
    "randn": lambda shape, d: torch.randn(shape, device=d),
    "rand_f64": lambda shape, d: torch.rand(shape, device=d, dtype=torch.float64),
    "randint": lambda shape, d: torch.randint(-3, 10, shape, device=d),
    "uniform_bf16": lambda shape, d: torch.empty(shape, device=d, dtype=torch.bfloat16).uniform_(-2, 2),
    "exponential": lambda shape, d: torch.empty(shape, device=d).exponential_(),
    "random_int32": lambda shape, d: torch.empty(shape, device=d, dtype=torch.int32).random_(),
    "bool": lambda shape, d: torch.randint(0, 2, shape, device=d, dtype=torch.bool),
    "randn_c64": lambda shape, d: torch.randn(shape, device=d, dtype=torch.complex64),
    # (make_tensor's complex draw: a fill of the real view, placed on the host as (re, im) pairs)
    "uniform_c128": lambda shape, d: _as_real_filled(torch.empty(shape, device=d, dtype=torch.complex128)),
}


def _as_real_filled(t):
    torch.view_as_real(t).uniform_(-1, 1)
    return t


def _bits(t):
    return t.view(torch.uint8) if t.dtype != torch.bool else t


@pytest.mark.parametrize("mode", ["strict", "fused"])
@pytest.mark.parametrize("fill", list(_FILLS))
def test_a_bucketed_fill_gives_the_bits_of_the_exact_shape_executable(monkeypatch, mode, fill):
    """The first call draws a shared size bucket and keeps its first elements; the entry's own
    one-program executable (built at the tier-up) draws exactly the same numbers."""
    monkeypatch.setattr(stand_ins, "TIER_UP", 1)
    monkeypatch.setattr(bucketed_draws, "HOST_TIER_UP", 1)  # (small fills placed on the host)
    shape = (3, *_fresh_shape())
    results = []
    with torchtpu.eager_mode(mode):
        for _ in range(3):  # bucketed, then the tier-up's own executable, then it again
            torch.manual_seed(11)
            results.append(_FILLS[fill](shape, "tpu").cpu())
    cpu = _FILLS[fill](shape, "cpu")  # (another stream: compared in what does not depend on it)
    assert results[0].shape == cpu.shape and results[0].dtype == cpu.dtype
    assert torch.equal(_bits(results[0]), _bits(results[1])) and torch.equal(_bits(results[1]), _bits(results[2]))
    if fill in ("randint", "bool"):  # the same range as the CPU's draw
        assert results[0].min() == cpu.min() and results[0].max() == cpu.max()
    if fill == "uniform_bf16":
        assert -2 <= results[0].min() < -1.9 and 1.9 < results[0].max() <= 2


def test_a_new_shape_in_a_drawn_bucket_compiles_only_its_copy(xla_compiles):
    """On XLA:CPU a new tensor's draw is its bucket's first elements, copied on the host: no program
    per shape; a fill of a view (or on a TPU) compiles the per-shape copy only."""
    n = 5 * next(_sizes)
    m = n - 1 if bucketed_draws.bucket_of(n - 1) == bucketed_draws.bucket_of(n) else n + 1
    torch.randn(n, device="tpu").cpu()  # (the bucket's draw, if no earlier test drew it)
    xla_compiles.clear()
    for shape in ((1, n), (m,)):  # new shapes, one bucket
        torch.randn(shape, device="tpu").cpu()
        assert len(xla_compiles) == (0 if platform.buffers_in_host_memory() else 1), shape
        xla_compiles.clear()
    _as_real_filled(torch.empty(n, device="tpu", dtype=torch.complex64)).cpu()  # (its bucket's draw)
    xla_compiles.clear()
    for shape in ((1, n), (m,)):  # a complex storage filled through its real view (make_tensor's)
        _as_real_filled(torch.empty(shape, device="tpu", dtype=torch.complex64)).cpu()
        assert len(xla_compiles) == (0 if platform.buffers_in_host_memory() else 1), shape
        xla_compiles.clear()
    x = torch.zeros(n + 1, device="tpu")
    xla_compiles.clear()
    x[1:].normal_()  # a part of its storage: the per-shape copy writes it
    assert x[0].item() == 0 and len(xla_compiles) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_a_shape_drawn_a_few_times_compiles_no_program_of_its_own(xla_compiles, dtype):
    """On XLA:CPU a host-placed fill's own program (a threefry compile) waits HOST_TIER_UP calls:
    PyTorch's test_atleast draws each shape 9-20 times, and each tier-up cost 0.3-1.3 s."""
    if not platform.buffers_in_host_memory():
        pytest.skip("the host-placed fill is XLA:CPU's")
    shape = (3, *_fresh_shape())

    def fill(seed):
        torch.manual_seed(seed)
        x = torch.empty(shape, device="tpu", dtype=dtype)
        return (x.uniform_() if dtype.is_floating_point else x.random_(0, 1000)).cpu()

    first = fill(1)
    xla_compiles.clear()
    draws = [fill(seed) for seed in [1, 2] * 10]  # (20 calls of one entry, each a new tensor)
    assert xla_compiles == []
    assert all(torch.equal(d, first) for d in draws[::2]) and not torch.equal(draws[1], first)


def test_a_bucketed_fill_of_a_view_writes_only_the_view(monkeypatch):
    monkeypatch.setattr(stand_ins, "TIER_UP", 1)
    monkeypatch.setattr(bucketed_draws, "HOST_TIER_UP", 1)  # (small fills placed on the host)
    base = torch.randn(_fresh_shape(), generator=torch.Generator().manual_seed(2))
    results = []
    for _ in range(2):
        x = base.to("tpu")
        torch.manual_seed(5)
        x[:, 1::3].normal_(2.0, 0.5)
        results.append(x.cpu())
    untouched = torch.ones_like(base, dtype=torch.bool)
    untouched[:, 1::3] = False
    torch.testing.assert_close(results[0][untouched], base[untouched], rtol=0, atol=0)
    assert torch.equal(results[0], results[1]) and not torch.equal(results[0][:, 1::3], base[:, 1::3])


def test_a_fused_loop_of_bucketed_fills_gives_the_strict_bits():
    """A loop's segment traces the fill's one-program function (fusion._nestable)."""
    shape = _fresh_shape()

    def step():
        torch.manual_seed(4)
        return (torch.rand(shape, device="tpu") * 2 + 1).cpu()

    with torchtpu.eager_mode("strict"):
        want = step()
    with torchtpu.eager_mode("fused"):
        got = [step() for _ in range(12)]
    for g in got:
        assert torch.equal(g, want)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_a_large_bucketed_fill_donates_and_gives_the_exact_bits(monkeypatch, mode):
    """A storage of DONATE_BYTES or more: its copy program updates the old buffer in place."""
    from torchtpu.eager.entry import DONATE_BYTES
    from torchtpu.metrics import counters

    monkeypatch.setattr(stand_ins, "TIER_UP", 1)
    monkeypatch.setattr(bucketed_draws, "HOST_TIER_UP", 1)  # (small fills placed on the host)
    shape = (DONATE_BYTES // 4 // 1000 + 1, next(_sizes) // 3)
    results = []
    with torchtpu.eager_mode(mode):
        for _ in range(3):  # bucketed, then the tier-up's own executable, then it again
            x = torch.zeros(shape, device="tpu")  # (written: its buffer can be donated)
            before = counters.eager_donations
            torch.manual_seed(8)
            x.normal_()
            results.append(x.cpu())
            if mode == "strict":
                assert counters.eager_donations == before + 1
    assert torch.equal(results[0], results[1]) and torch.equal(results[1], results[2])
    assert results[0].std() > 0.9


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float32, torch.bfloat16, torch.complex64])
def test_small_nonzero_compiles_nothing_per_count(xla_compiles, dtype):
    """A small input's nonzero indices come from the host: a new count (an MoE layer's tokens per
    expert) compiles no program (eager/data_dependent.py)."""
    shape = _fresh_shape()
    for density in (0.5, 0.3, 0.7):  # a new count each time: only the first round may compile (view copies)
        values = torch.randn(shape) * (torch.rand(shape) > density)
        values[0, 0] = float("nan")
        x = values.to(dtype).to("tpu")
        torch.tpu.synchronize()
        for rows in (slice(None), slice(1, None), slice(None, 3)):
            expected = values.to(dtype)[rows]
            torch.testing.assert_close(x[rows].nonzero().cpu(), expected.nonzero())
            if density == 0.5:  # (reading where's columns copies strided views: a program per count)
                for got, want in zip(torch.where(x[rows]), torch.where(expected)):
                    torch.testing.assert_close(got.cpu(), want)
        if density == 0.5:
            xla_compiles.clear()
    assert not xla_compiles, len(xla_compiles)


def test_large_nonzero_runs_on_the_device(monkeypatch):
    from torchtpu.eager import data_dependent

    monkeypatch.setattr(data_dependent, "HOST_NONZERO_ELEMENTS", 8)
    x = torch.randn(_fresh_shape()) > 0.3
    torch.testing.assert_close(x.to("tpu").nonzero().cpu(), x.nonzero())
    y = torch.randn(x.shape)
    torch.testing.assert_close(y.to("tpu")[x.to("tpu")].cpu(), y[x])


@pytest.mark.parametrize("dtype", [None, torch.int32, torch.uint8, torch.float32, torch.float64, torch.bfloat16])
def test_short_arange_of_a_new_length_compiles_nothing(xla_compiles, dtype):
    """A short arange is computed on the host in PyTorch's arithmetic (eager/kernels.py _host_arange)."""
    n = next(_sizes) % 997 + 5
    for start, end, step in ((0, n, 1), (3, n, 2), (n, -1, -3), (0.5, n / 7, 0.3), (-2.5, 2.5, 0.125)):
        want = torch.arange(start, end, step, dtype=dtype)
        got = torch.arange(start, end, step, dtype=dtype, device="tpu").cpu()
        # (a step of 0.3: the CPU's vectorized kernel rounds some elements otherwise, as XLA did; bf16
        # elements by one bf16 step)
        torch.testing.assert_close(got, want, rtol=1.6e-2 if dtype is torch.bfloat16 else 1e-5, atol=0)
    assert not xla_compiles


@pytest.mark.parametrize("dtype", [torch.int64, torch.int16, torch.float32])
def test_random_bounds_travel_as_values(xla_compiles, dtype):
    """random_(from, to) with new bounds reuses its executables (make_tensor's index tensors draw in
    [0, size) of each dimension); the range checks stay the CPU's, per call."""
    x = torch.empty(_fresh_shape(), dtype=dtype, device="tpu")
    x.random_(0, 3)
    x.random_(3)  # (random_(to) has its own executables: a draw per size bucket, a take per shape)
    torch.tpu.synchronize()
    xla_compiles.clear()
    for low, high in ((0, 4), (0, 5), (-7, 2), (3, 4), (-100, 100)):
        values = x.random_(low, high).cpu()
        assert values.min() >= low and values.max() < high, (low, high)
        assert len(values.unique()) == high - low  # (5 x 3000 draws cover every value)
        assert x.random_(high).cpu().max() < high
    assert not xla_compiles, len(xla_compiles)
    with pytest.raises(RuntimeError, match="expects 'from' to be less than 'to'"):
        x.random_(5, 2)
    if dtype is torch.int16:
        with pytest.raises(RuntimeError, match="to - 1 is out of bounds for short"):
            x.random_(0, 1 << 20)


def _close_pair(dtype, shape):
    if dtype.is_floating_point or dtype.is_complex:
        a = torch.randn(shape, dtype=dtype)
        b = a + torch.randn(shape, dtype=dtype) * 1e-3
        if dtype.is_floating_point:  # NaN against NaN, inf against inf and against -inf
            a[0, :3] = torch.tensor([float("nan"), float("inf"), float("inf")], dtype=dtype)
            b[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
        return a, b
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5, torch.rand(shape) > 0.5
    a = torch.randint(0, 100, shape)
    return a.to(dtype), (a + torch.randint(-3, 4, shape)).clamp(0, 127).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.uint8, torch.bool])
def test_isclose_and_allclose_compile_one_program_and_match_the_cpu(xla_compiles, dtype):
    a, b = _close_pair(dtype, _fresh_shape())
    ta, tb = a.to("tpu"), b.to("tpu")
    # tolerances a half holds exactly: the CPU rounds `atol` to the half type before adding it, CUDA
    # (and tpu) add it in float32, so with atol=1e-3 a pair at the boundary can differ (CI, seed-bound)
    for kw in ({}, {"rtol": 2**-7, "atol": 2**-10}, {"rtol": 0.0, "atol": 2.0}, {"equal_nan": True}):
        xla_compiles.clear()
        torch.testing.assert_close(torch.isclose(ta, tb, **kw).cpu(), torch.isclose(a, b, **kw))
        assert len(xla_compiles) <= 2  # the isclose program (and the host copy's), not PyTorch's dozen ops
        assert torch.allclose(ta, tb, **kw) == torch.allclose(a, b, **kw)
        assert torch.allclose(ta, ta, **kw) == torch.allclose(a, a, **kw)
    assert torch.allclose(ta[1:], tb[1:], rtol=1.0, atol=10.0)


def test_isclose_under_a_dispatch_mode_or_fake_tensors_is_the_composite():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    a = torch.randn(3, 4)
    b = a + torch.randn(3, 4) * 1e-6
    with Record():
        got = torch.isclose(a.to("tpu"), b.to("tpu"))
    assert torch.ops.aten.eq.Tensor in seen  # the mode saw the composite's ops
    torch.testing.assert_close(got.cpu(), torch.isclose(a, b))
    with FakeTensorMode():
        f = torch.empty(3, 4, device="tpu")
        assert torch.isclose(f, f).shape == (3, 4)
    with pytest.raises(RuntimeError, match="did not match"):
        torch.isclose(a.to("tpu"), a.to("tpu", torch.float64))


@pytest.mark.parametrize("op", ["cat", "stack"])
@pytest.mark.parametrize("dim", [1, -1])
def test_a_cat_of_many_tensors_compiles_chunks_not_a_program_per_count(xla_compiles, op, dim):
    n = 64 * 2 + next(_sizes) % 50 + 1  # over two chunks, a new count
    xs = [torch.randn(3, 5) for _ in range(n)]
    ts = [x.to("tpu") for x in xs]
    xla_compiles.clear()
    got = getattr(torch, op)(ts, dim)
    assert len(xla_compiles) <= 4  # a full chunk's program, the last chunk's, their cat (the program
    # of all n tensors has n parameters, and compiles in time that grows with n)
    torch.testing.assert_close(got.cpu(), getattr(torch, op)(xs, dim), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="tensor number 100 in the list|stack expects each tensor"):
        getattr(torch, op)([*ts[:100], torch.randn(3, 6, device="tpu"), *ts[100:]], 0)


@pytest.mark.parametrize("fill", [torch.ones, torch.zeros, lambda s, device: torch.empty(s, device=device).fill_(2.5)])
def test_a_filled_tensor_is_committed_as_a_drawn_one(xla_compiles, fill):
    # a fill reads no array: JAX left its result uncommitted, another argument mapping for every later
    # op, which then compiled once for it and once for a drawn or copied tensor
    shape = _fresh_shape()
    x, filled = torch.randn(shape, device="tpu"), fill(shape, device="tpu")
    torch.testing.assert_close((x * filled).cpu(), x.cpu() * filled.cpu())
    xla_compiles.clear()
    y = x.clone()
    torch.testing.assert_close((x * y).cpu(), x.cpu() * y.cpu())
    assert not xla_compiles


@pytest.mark.skipif(torch.tpu.device_count() < 2, reason="needs two tpu devices")
def test_a_fill_on_the_second_device_stays_there():
    from torchtpu.storage.records import record_of

    t = torch.empty(_fresh_shape(), device="tpu:1").fill_(2.5)  # its target on tpu:1 was pruned: on tpu:0
    assert record_of(t).buffer.devices() == {platform.jax_device(1)}
    torch.testing.assert_close((t * 2).cpu(), torch.full(t.shape, 5.0))


@pytest.mark.skipif(torch.tpu.device_count() < 2, reason="needs two tpu devices")
def test_a_drawn_fill_on_the_second_device_stays_there():
    from torchtpu.storage.records import record_of

    shape = _fresh_shape()
    torch.randn(shape, device="tpu:0").cpu()  # builds the fill's entry, which tpu:1 then reuses
    for _ in range(3):
        t = torch.randn(shape, device="tpu:1")  # drawn on tpu:0, placed there
        assert record_of(t).buffer.devices() == {platform.jax_device(1)}
        torch.testing.assert_close((t * 2).cpu(), t.cpu() * 2)


def test_lowerings_share_their_threads_mlir_context():
    """integrations/patches.py: JAX's lowering reuses one MLIR context per thread (renewed every
    CONTEXT_MODULES modules) instead of making one per module; results are unchanged."""
    import threading

    from torchtpu.integrations import patches

    def context_of(n):
        lowered = jax.jit(lambda x: x * n + 1).lower(jax.ShapeDtypeStruct((n,), jax.numpy.float32))
        return lowered.compiler_ir().context

    first, second = context_of(3), context_of(4)
    other = []
    thread = threading.Thread(target=lambda: other.append(context_of(5)))
    thread.start()
    thread.join()
    if first is not second:  # the context was renewed between the two: then the next two share
        first, second = context_of(6), context_of(7)
    assert first is second
    assert other[0] is not first
    assert patches.CONTEXT_MODULES >= 16
    x = torch.randn(_fresh_shape())
    for fn in (torch.tanh, lambda t: torch.where(t > 0, t.exp(), t * 2).sum(1)):
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), fn(x))


def test_views_at_traced_offsets_along_the_arrays_dimensions():
    """ops/views.py _traced_starts (lax div/rem, no nested jits; dynamic slices without negative
    starts): reads and writes of views that lie along a 4-d storage's dimensions, at offsets that
    travel as traced values, match the CPU."""
    n = next(_sizes) % 7 + 3
    x = torch.randn(2, 3, n, 4)
    y = x.to("tpu")
    for i in (0, 1, n - 1):
        torch.testing.assert_close(y[:, :, i].cpu(), x[:, :, i])
        torch.testing.assert_close((y[1, :, i] * 2).cpu(), x[1, :, i] * 2)
        v = torch.randn(2, 3, 4)
        x[:, :, i] = v
        y[:, :, i] = v.to("tpu")
    torch.testing.assert_close(y.cpu(), x)
