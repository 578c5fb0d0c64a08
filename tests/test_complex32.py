"""complex32 (torch.chalf) on tpu vs the CPU, in the strict and the fused eager mode and compiled.

tpu stores a complex32 element as two float16 halves in PyTorch's byte layout and computes in complex64
(ops/dtypes.py TO_JAX). The reference is the CPU's complex32 kernel where it has one, else the CPU's
complex64 result rounded to complex32 (PyTorch's CUDA kernels compute complex32 in complex64 too).
Values are compared bit for bit (through an int32 view) where both sides round one exact result."""

import io
import math
import warnings

import pytest
import torch

import torchtpu

TPU = "tpu"
CHALF = torch.complex32

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")


@pytest.fixture(params=["strict", "fused"], autouse=True)
def mode(request):
    with torchtpu.eager_mode(request.param):
        yield request.param


def _chalf(*shape):
    """Fresh random complex32 values (CPU)."""
    return (torch.randn(*shape, dtype=torch.complex64) * 3).to(CHALF)


def _bits(t):
    t = t.cpu() if t.device.type == TPU else t
    return t.contiguous().view(torch.int32 if t.dtype == CHALF else t.dtype)


def assert_same(actual, expected):
    """Same dtype, shape and bits (NaNs compare by bits too, as both sides round the same value)."""
    assert actual.device.type == TPU
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if expected.dtype == CHALF:
        torch.testing.assert_close(_bits(actual), _bits(expected), rtol=0, atol=0)
    else:
        torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0, equal_nan=True)


def assert_close_chalf(actual, expected, **tol):
    """complex32 results compared as complex64 with float16's tolerances (one rounding apart)."""
    assert actual.device.type == TPU and actual.dtype == expected.dtype == CHALF
    torch.testing.assert_close(
        actual.cpu().to(torch.complex64), expected.to(torch.complex64), **(tol or {"rtol": 2e-3, "atol": 1e-4})
    )


def test_host_round_trip_is_exact():
    x = _chalf(5, 7)
    special = torch.tensor([complex(math.inf, -math.inf), complex(math.nan, 0), 6.0e-8 + 65504j, -0.0 - 0.0j])
    x.view(-1)[:4] = special.to(CHALF)
    t = x.to(TPU)
    assert t.dtype == CHALF and t.element_size() == 4
    assert_same(t, x)
    assert t.untyped_storage().nbytes() == x.untyped_storage().nbytes() == 5 * 7 * 4
    assert t[1, 2].item() == x[1, 2].item()
    assert t[1:].tolist() == x[1:].tolist()  # (row 0 holds a NaN)
    out = torch.empty(5, 7, dtype=CHALF).copy_(t)  # device -> an existing host tensor
    assert torch.equal(_bits(out), _bits(x))
    assert torch.equal(_bits(t.cpu(memory_format=torch.preserve_format)), _bits(x))


def test_byte_views_share_pytorch_layout():
    x = _chalf(4, 6)
    t = x.to(TPU)
    assert_same(torch.view_as_real(t), torch.view_as_real(x))
    assert_same(t.view(torch.float16), x.view(torch.float16))
    assert_same(t.view(torch.int32), x.view(torch.int32))
    assert_same(t.view(torch.uint8), x.view(torch.uint8))
    assert_same(t[1:3].view(torch.complex64), x[1:3].view(torch.complex64))
    h = torch.randn(3, 8, dtype=torch.float16)
    assert_same(torch.view_as_complex(h.to(TPU).view(3, 4, 2)), torch.view_as_complex(h.view(3, 4, 2)))
    assert_same(h.to(TPU).view(CHALF), h.view(CHALF))
    # writes through a float16 view change the complex32 tensor (one storage)
    r, rx = torch.view_as_real(t), torch.view_as_real(x)
    r[:, :, 1] = 2.5
    rx[:, :, 1] = 2.5
    r[1].mul_(3)
    rx[1].mul_(3)
    assert_same(t, x)
    # untyped storage bytes are PyTorch's; a storage made from bytes (torch.load) reads as complex32
    data = bytes(t.untyped_storage().cpu())
    assert data == bytes(x.untyped_storage())
    buf = io.BytesIO()
    torch.save(t, buf)
    loaded = torch.load(io.BytesIO(buf.getvalue()))
    assert_same(loaded, x)
    assert_same(loaded * 2, x * 2)


def test_factories():
    assert_same(torch.zeros(3, 4, dtype=CHALF, device=TPU), torch.zeros(3, 4, dtype=CHALF))
    assert_same(torch.ones(3, 4, dtype=CHALF, device=TPU), torch.ones(3, 4, dtype=CHALF))
    for value in (1.5 - 2.25j, 3, -0.1, 1e-5j, True):
        assert_same(torch.full((2, 5), value, dtype=CHALF, device=TPU), torch.full((2, 5), value, dtype=CHALF))
    x = _chalf(3, 2)
    t = x.to(TPU)
    assert_same(torch.zeros_like(t), torch.zeros_like(x))
    assert_same(torch.ones_like(t), torch.ones_like(x))
    assert_same(torch.full_like(t, 2 - 1j), torch.full_like(x, 2 - 1j))
    assert_same(t.new_ones(4), x.new_ones(4))
    assert_same(t.new_full((2,), 7j), x.new_full((2,), 7j))
    e = torch.empty(2, 3, dtype=CHALF, device=TPU)
    assert e.shape == (2, 3) and e.dtype == CHALF and e.stride() == (3, 1)
    for shape in ((5, 0, 1), (0,)):
        assert torch.empty(shape, dtype=CHALF, device=TPU).shape == shape
        assert torch.empty_strided(shape, (0,) * len(shape), dtype=CHALF, device=TPU).shape == shape
    with pytest.raises(RuntimeError, match=r"c10::complex<c10::Half> without overflow"):
        torch.full((2,), 70000.0, dtype=CHALF, device=TPU)


def test_random_factories():
    for fn in (torch.rand, torch.randn):
        t = fn(200, 50, dtype=CHALF, device=TPU)
        assert t.dtype == CHALF
        v = t.cpu().to(torch.complex64)
        assert torch.isfinite(torch.view_as_real(v)).all()
        assert torch.equal(v, v.to(CHALF).to(torch.complex64))  # representable in complex32
        re, im = v.real, v.imag
        if fn is torch.rand:
            assert re.min() >= 0 and re.max() < 1 and im.min() >= 0 and im.max() < 1
            assert abs(re.mean() - 0.5) < 0.02 and abs(im.mean() - 0.5) < 0.02
        else:  # PyTorch's complex normal: each part has variance 1/2
            assert abs(re.mean()) < 0.03 and abs(re.var() - 0.5) < 0.05 and abs(im.var() - 0.5) < 0.05
        torch.manual_seed(3)
        a = fn(7, dtype=CHALF, device=TPU)
        torch.manual_seed(3)
        b = torch.empty(0, dtype=CHALF, device=TPU)
        fn(7, out=b)
        assert torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("dtype", [CHALF, torch.complex64, torch.float16])
def test_random_factories_compiled(dtype):
    """rand/randn inside a compiled graph (graph_lowerings.py): complex draws fill both parts, half
    parts never round up to 1."""
    f = torch.compile(
        lambda: (torch.rand(400, 50, dtype=dtype, device=TPU), torch.randn(400, 50, dtype=dtype, device=TPU)),
        backend="tpu",
    )
    u, n = (v.cpu().to(torch.complex64) for v in f())
    for part in (u.real, u.imag) if dtype.is_complex else (u.real,):
        assert part.min() >= 0 and part.max() < 1 and abs(part.mean() - 0.5) < 0.02
    if dtype.is_complex:
        assert abs(n.real.var() - 0.5) < 0.05 and abs(n.imag.var() - 0.5) < 0.05
    else:
        assert abs(n.real.var() - 1) < 0.1


ALL_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


def _values(dtype):
    if dtype == torch.bool:
        return torch.rand(6, 5) > 0.5
    if not dtype.is_floating_point and not dtype.is_complex:
        return torch.randint(-100 if dtype != torch.uint8 else 0, 100, (6, 5), dtype=dtype)
    return (torch.randn(6, 5, dtype=dtype) * 100).to(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_conversions_and_copy_from_every_dtype(dtype):
    src = _values(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex -> real discards the imaginary part
        assert_same(src.to(TPU).to(CHALF), src.to(CHALF))
        x = _chalf(6, 5)
        assert_same(x.to(TPU).to(dtype), x.to(dtype))
        # copy_ into complex32 (whole, a transposed view, a slice), and from complex32
        for pick in (lambda t: t, lambda t: t.t(), lambda t: t[1:4, ::2]):
            dst, dst_cpu = torch.zeros(6, 5, dtype=CHALF, device=TPU), torch.zeros(6, 5, dtype=CHALF)
            s = pick(src)
            pick(dst).copy_(s.to(TPU))
            pick(dst_cpu).copy_(s)
            assert_same(dst, dst_cpu)
            out, out_cpu = torch.zeros(6, 5, dtype=dtype, device=TPU), torch.zeros(6, 5, dtype=dtype)
            pick(out).copy_(pick(x.to(TPU)))
            pick(out_cpu).copy_(pick(x))
            assert_same(out, out_cpu)
        if dtype == torch.float64:  # rounded through float32 (twice), as PyTorch converts a double
            tie = torch.tensor([1 + 2**-11 + 2**-40], dtype=dtype)
            assert_same(tie.to(TPU).to(CHALF), tie.to(CHALF))
            assert_same(tie.to(TPU).to(torch.complex128).to(CHALF), tie.to(torch.complex128).to(CHALF))
        # host complex32 straight into a tpu tensor of another dtype, and back
        assert_same(torch.zeros(6, 5, dtype=dtype, device=TPU).copy_(x), torch.zeros(6, 5, dtype=dtype).copy_(x))
        assert_same(torch.zeros(6, 5, dtype=CHALF, device=TPU).copy_(src), torch.zeros(6, 5, dtype=CHALF).copy_(src))


def test_clone_contiguous_views_and_indexing():
    x = _chalf(4, 6)
    t = x.to(TPU)
    for f in (
        lambda a: a.clone(),
        lambda a: a.t().contiguous(),
        lambda a: a[1:, ::2].clone(),
        lambda a: a[2],
        lambda a: a[:, 3],
        lambda a: a[None].expand(3, 4, 6).contiguous(),
        lambda a: a.reshape(2, 12),
        lambda a: a.permute(1, 0).reshape(-1),
        lambda a: a[torch.tensor([3, 0, 3], device=a.device)],
        lambda a: a[a.real > 0],
        lambda a: a.index_select(1, torch.tensor([5, 1], device=a.device)),
        lambda a: a.masked_fill(a.imag < 0, 1 - 1j),
        lambda a: torch.where(a.real > 0, a, a.conj_physical()),
        lambda a: -a,
        lambda a: a.conj().clone(),
        lambda a: a.roll(1, 0),
        lambda a: a.tril(),
        lambda a: torch.diag_embed(a[0]),
        lambda a: a.repeat(2, 1),
        lambda a: torch.stack([a, a.t().t()]),
    ):
        assert_same(f(t), f(x))
    for f in (lambda a: a == a.roll(1, 1), lambda a: a != 0, lambda a: a.isfinite(), lambda a: a.real):
        assert_same(f(t), f(x))
    assert_same(t.abs(), x.abs())
    t2, x2 = t.clone(), x.clone()
    t2[1] = 3 + 4j
    x2[1] = 3 + 4j
    t2[:, 2] = t2[:, 4]
    x2[:, 2] = x2[:, 4]
    t2[0, ::2] = torch.tensor(1.5, dtype=torch.float16, device=TPU)
    x2[0, ::2] = torch.tensor(1.5, dtype=torch.float16)
    assert_same(t2, x2)


def test_fill_and_zero():
    x = _chalf(5, 4)
    for value in (2 - 3j, 0.25, 7, False):
        t, c = x.to(TPU), x.clone()
        t.fill_(value)
        c.fill_(value)
        assert_same(t, c)
        t, c = x.to(TPU), x.clone()
        t[:, 1::2].fill_(value)
        c[:, 1::2].fill_(value)
        assert_same(t, c)
    t, c = x.to(TPU), x.clone()
    t.t()[1].zero_()
    c.t()[1].zero_()
    assert_same(t, c)
    t.fill_(torch.tensor(1 + 1j, device=TPU))
    c.fill_(torch.tensor(1 + 1j))
    assert_same(t, c)


def test_cat():
    a, b = _chalf(2, 3), _chalf(4, 3)
    assert_same(torch.cat([a.to(TPU), b.to(TPU)]), torch.cat([a, b]))
    assert_same(torch.cat([a.to(TPU).t(), b.to(TPU).t()], 1), torch.cat([a.t(), b.t()], 1))
    h = torch.randn(1, 3, dtype=torch.float16)
    assert_same(torch.cat([a.to(TPU), h.to(TPU)]), torch.cat([a, h]))  # promotes to complex32
    out = torch.empty(0, dtype=CHALF, device=TPU)
    torch.cat([a.to(TPU), b.to(TPU)], out=out)
    assert_same(out, torch.cat([a, b]))


def test_type_promotion():
    h = torch.randn(5, dtype=torch.float16)
    s = torch.tensor(1.5 - 2j, dtype=torch.complex64)
    for other in (s, s.to(CHALF), s.to(torch.complex128), 1.5 - 2j):
        o = other.to(TPU) if isinstance(other, torch.Tensor) else other
        assert torch.result_type(h.to(TPU), o) == torch.result_type(h, other) == CHALF
        assert_same(h.to(TPU) + o, h + other)
        assert_same(o * h.to(TPU), other * h)
    x = _chalf(5)
    assert (x.to(TPU) + torch.randn(5, device=TPU)).dtype == torch.complex64
    assert (x.to(TPU) * torch.tensor(2.0, dtype=torch.float64, device=TPU)).dtype == CHALF


def _rounded(fn, *args):
    """fn computed in complex64 on the CPU, rounded to complex32."""
    up = [a.to(torch.complex64) if isinstance(a, torch.Tensor) and a.dtype == CHALF else a for a in args]
    return fn(*up).to(CHALF)


def test_arithmetic():
    a, b = _chalf(6, 5), _chalf(6, 5)
    ta, tb = a.to(TPU), b.to(TPU)
    # (the CPU has complex32 add/sub/mul kernels: one rounding of the same exact values)
    for f in (torch.add, torch.sub, lambda p, q: torch.add(p, q, alpha=2), lambda p, q: p - 1.5j * q):
        assert_same(f(ta, tb), f(a, b))
    assert_close_chalf(ta * tb, a * b)
    assert_close_chalf(ta * 0.3, a * 0.3)
    assert_close_chalf(ta / tb, _rounded(torch.div, a, b))  # (no CPU kernel: complex64, rounded)
    assert_close_chalf(ta / (2 - 1j), _rounded(torch.div, a, 2 - 1j))
    t, c = ta.clone(), a.clone()
    t += tb
    c += b
    t.mul_(2j)
    c.mul_(2j)
    assert_same(t, c)
    t.sub_(tb[0])  # broadcast
    c.sub_(b[0])
    assert_same(t, c)
    t.div_(3)
    assert_close_chalf(t, _rounded(torch.div, c, 3))


@pytest.mark.parametrize("exponent", [2, 0.5, -1.5, 1 + 1j, 3])
def test_pow_with_a_scalar(exponent):
    a = _chalf(4, 5)
    assert_close_chalf(a.to(TPU) ** exponent, _rounded(torch.pow, a, exponent), rtol=4e-3, atol=1e-3)
    s = 1.25 - 0.5j if isinstance(exponent, int) else exponent
    assert_close_chalf(torch.pow(s, a.to(TPU) / 4), _rounded(lambda e: torch.pow(s, e / 4), a), rtol=4e-3, atol=1e-3)


def test_compiled():
    a, b = _chalf(8, 3), _chalf(8, 3)
    h = torch.randn(8, 3, dtype=torch.float16)

    def f(p, q, r):
        return torch.cat([p * q + r, torch.view_as_real(p - q).sum(-1).to(CHALF)]) + 1j

    expected = _rounded(
        lambda p, q, r: (
            torch.cat([(p * q).to(CHALF).to(torch.complex64) + r, torch.view_as_real((p - q).to(CHALF)).sum(-1)])
            .to(CHALF)
            .to(torch.complex64)
            + 1j
        ),
        a,
        b,
        h,
    )
    got = torch.compile(f, backend="tpu")(a.to(TPU), b.to(TPU), h.to(TPU))
    assert_close_chalf(got, expected)


@pytest.mark.filterwarnings("default")
def test_experimental_warning():
    t = torch.ones(2, dtype=CHALF, device=TPU)
    torch.set_warn_always(True)
    try:
        for make in (
            lambda: torch.empty(3, dtype=CHALF, device=TPU),
            lambda: torch.randn(3, dtype=CHALF, device=TPU),
            lambda: torch.zeros_like(t),
            lambda: torch.empty_strided((2, 2), (1, 2), dtype=CHALF, device=TPU),
        ):
            with pytest.warns(UserWarning, match="ComplexHalf support is experimental"):
                make()
    finally:
        torch.set_warn_always(False)


def test_real_only_ops_name_complex_half():
    """Ops that refuse complex tensors name complex32 as the CPU does (its kernel name aside)."""
    x = _chalf(4)
    for f in (lambda a: a < a, lambda a: torch.atan2(a, a)):
        with pytest.raises(NotImplementedError) as cpu:
            f(x)
        with pytest.raises(NotImplementedError, match="not implemented for 'ComplexHalf'") as tpu:
            f(x.to(TPU))
        assert str(cpu.value).split('"')[-1] == str(tpu.value).split('"')[-1]


def test_sum_and_mean():
    """CUDA sums complex32 (the CPU does not) but has no ComplexHalf mean (PyTorch's own test says so)."""
    x = _chalf(6, 5)
    assert_close_chalf(x.to(TPU).sum(), _rounded(torch.sum, x), rtol=4e-3, atol=1e-2)
    assert_close_chalf(x.to(TPU).sum(1), _rounded(lambda a: a.sum(1), x), rtol=4e-3, atol=1e-2)
    with pytest.raises(NotImplementedError, match="not implemented for 'ComplexHalf'"):
        x.to(TPU).mean()


def test_complex_from_half_parts():
    re, im = torch.randn(4, 3, dtype=torch.float16), torch.randn(4, 3, dtype=torch.float16)
    assert_same(torch.complex(re.to(TPU), im.to(TPU)), torch.complex(re, im))
    with pytest.raises(NotImplementedError, match="not implemented for 'Half'"):  # as the CPU's polar
        torch.polar(re.abs().to(TPU), im.to(TPU))


def test_collectives_in_a_world_of_one(monkeypatch):
    """complex32 reductions go through view_as_real (distributed/process_group.py). In a world of one a
    reduction is the identity, so a stand-in second rank with the same values doubles each SUM: a sum
    of the stored uint32 words instead of the float16 parts would not give 2x."""
    import torch.distributed as dist

    from torchtpu.distributed import collectives

    run = collectives.GroupMesh.run

    def two_equal_ranks(self, kind, static, local, timeout_s=None):
        out = run(self, kind, static, local, timeout_s)
        return out * 2 if kind in ("all_reduce", "reduce_scatter") and static[0] == "SUM" else out

    monkeypatch.setattr(collectives.GroupMesh, "run", two_equal_ranks)
    dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = _chalf(3, 4)
        t = x.to(TPU)
        dist.all_reduce(t)
        assert_same(t, x * 2)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        assert_same(t, x * 2)
        out = torch.empty(3, 4, dtype=CHALF, device=TPU)
        dist.reduce_scatter_tensor(out, t)
        assert_same(out, x * 4)
        dist.all_gather_into_tensor(out, x.to(TPU))
        assert_same(out, x)
    finally:
        dist.destroy_process_group()
