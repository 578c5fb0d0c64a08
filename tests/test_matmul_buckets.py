"""Small matrix products of new shapes on operands zero-padded to size buckets (eager/matmul_buckets.py,
XLA:CPU) against the CPU: every dtype, strided and conjugated operands, out= (whole and a view of a
larger storage), empty dims; one program per bucket; and a fill of no elements builds no program
(eager/bucketed_draws.py EmptyFill)."""

import pytest
import torch

from torchtpu.eager import matmul_buckets, tpu_check

DEV = "tpu"
SERVES = not tpu_check.enabled()  # (the TPU compile check keeps the exact programs)

# (x shape, y shape): torch.matmul reaches mm, bmm, mv and dot (and their out= overloads)
_PAIRS = [
    ((3,), (3,)),
    ((2, 3), (3,)),
    ((3,), (3, 2)),
    ((2, 3), (3, 4)),
    ((2, 1, 3), (2, 3, 2)),
    ((3,), (2, 3, 1)),
    ((2, 2, 3), (3, 3)),
    ((2, 0), (0, 3)),  # (a product over nothing: zeros)
    ((0, 3), (3, 2)),
    ((5, 7), (7, 6)),  # (buckets of 8)
]


def _operand(shape, dtype, gen):
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * 4
    if dtype.is_complex:
        x = torch.complex(x, torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype)
    elif dtype.is_floating_point:
        x = x.to(dtype)
    else:
        x = (x * 2**20).to(dtype) if dtype == torch.int64 else x.to(dtype)  # (int64: wrapping sums)
    return x


def _check(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.is_floating_point() or want.is_complex():
        tol = {"atol": 0.05, "rtol": 0.02} if want.dtype in (torch.float16, torch.bfloat16) else {}
        torch.testing.assert_close(got.cpu(), want, **tol)
    else:  # integer products stay exact
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


_FAST = (torch.float32, torch.int64, torch.complex64)
_SLOW = (torch.float64, torch.complex128, torch.float16, torch.bfloat16, torch.int32)


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")  # (1-d @ 2-d out=: as on the CPU)
@pytest.mark.parametrize("dtype", [*_FAST, *(pytest.param(d, marks=pytest.mark.slow) for d in _SLOW)])
def test_products_of_new_shapes_match_the_cpu(dtype):
    gen = torch.Generator().manual_seed(3)
    for sx, sy in _PAIRS:
        x, y = _operand(sx, dtype, gen), _operand(sy, dtype, gen)
        tx, ty = x.to(DEV), y.to(DEV)
        want = torch.matmul(x, y)
        _check(torch.matmul(tx, ty), want)
        out = torch.empty_like(want, device=DEV)
        assert torch.matmul(tx, ty, out=out) is out
        _check(out, want)
        # strided operands: every other element of a larger storage, a transposed one
        sx2 = torch.repeat_interleave(tx, 2, dim=-1)[..., ::2]
        ty2 = ty.mT.contiguous().mT if ty.dim() > 1 else ty
        _check(torch.matmul(sx2, ty2), want)
        if dtype.is_complex:  # (a lazily conjugated view)
            _check(torch.matmul(tx.conj(), ty), torch.matmul(x.conj(), y))


# (op, self shape, operand shapes): addmm, addmv, baddbmm, addbmm (the last contracts the batch too)
_SCALED = [
    ("addmm", (2, 3), (2, 5), (5, 3)),
    ("addmv", (3,), (3, 2), (2,)),
    ("baddbmm", (2, 3, 1), (2, 3, 4), (2, 4, 1)),
    ("addbmm", (3, 2), (3, 3, 1), (3, 1, 2)),
]


@pytest.mark.parametrize("dtype", [*_FAST, *(pytest.param(d, marks=pytest.mark.slow) for d in _SLOW)])
def test_scaled_products_match_the_cpu(dtype):
    gen = torch.Generator().manual_seed(6)
    scale = {"beta": 2, "alpha": 3} if not (dtype.is_floating_point or dtype.is_complex) else {"beta": 0.5, "alpha": -2}
    for op, sc, sa, sb in _SCALED:
        c, a, b = (_operand(s, dtype, gen) for s in (sc, sa, sb))
        tc, ta, tb = c.to(DEV), a.to(DEV), b.to(DEV)
        f = getattr(torch, op)
        _check(f(tc, ta, tb), f(c, a, b))
        _check(f(tc, ta, tb, **scale), f(c, a, b, **scale))
        out = torch.empty_like(tc)
        f(tc, ta.mT.contiguous().mT if ta.dim() > 1 else ta, tb, out=out)
        _check(out, f(c, a, b))
        want = c.clone()
        getattr(want, op + "_")(a, b, **scale)
        got = tc.clone()
        assert getattr(got, op + "_")(ta, tb, **scale) is got
        _check(got, want)
    if dtype.is_floating_point:  # beta=0 ignores self, NaN included
        nan = torch.full((2, 3), float("nan"), dtype=dtype)
        a, b = _operand((2, 5), dtype, gen), _operand((5, 3), dtype, gen)
        _check(torch.addmm(nan.to(DEV), a.to(DEV), b.to(DEV), beta=0), torch.addmm(nan, a, b, beta=0))


def test_out_view_of_a_larger_storage():
    gen = torch.Generator().manual_seed(4)
    a, b = _operand((3, 2), torch.float32, gen), _operand((2, 3), torch.float32, gen)
    base = _operand((3, 5), torch.float32, gen)
    big = base.to(DEV)
    torch.mm(a.to(DEV), b.to(DEV), out=big[:, 1:4])  # (a strided view: the rest of the storage stays)
    want = base.clone()
    torch.mm(a, b, out=want[:, 1:4])
    _check(big, want)


def test_shapes_of_a_bucket_share_one_program(xla_compiles):
    gen = torch.Generator().manual_seed(5)
    pairs = [((2, 3), (3, 2)), ((3, 1), (1, 4)), ((1, 4), (4, 3)), ((4, 2), (2, 1))]
    pairs += [((2, 2, 3), (2, 3, 1)), ((3, 1, 2), (3, 2, 2)), ((3, 2), (2,)), ((1, 3), (3,))]
    cpu = [(_operand(sx, torch.float32, gen), _operand(sy, torch.float32, gen)) for sx, sy in pairs]
    moved = [(x.to(DEV), y.to(DEV)) for x, y in cpu]
    torch.tpu.synchronize()
    warm = [torch.matmul(*moved[0]), torch.matmul(*moved[4]), torch.matmul(*moved[6])]  # mm, bmm, mv
    torch.tpu.synchronize()
    before = xla_compiles()
    got = [torch.matmul(x, y) for x, y in moved]
    torch.tpu.synchronize()
    if SERVES:  # every shape in the bucket of 4 runs the program the first three built
        assert xla_compiles() - before == 0
        assert {k[0] for k in matmul_buckets._shared} >= {"mm.default", "bmm.default", "mv.default"}
    for (x, y), g in zip(cpu, got):
        _check(g, torch.matmul(x, y))
    for w, (x, y) in zip(warm, [cpu[0], cpu[4], cpu[6]]):
        _check(w, torch.matmul(x, y))


def test_a_fill_of_no_elements_builds_no_program(xla_compiles):
    empties = [torch.empty(s, device=DEV) for s in [(0,), (2, 0), (0, 3, 1), (4, 0, 2)]]
    torch.tpu.synchronize()
    before = xla_compiles()
    for t in empties:
        t.uniform_(-1, 1)
        t.normal_()
    torch.tpu.synchronize()
    if SERVES:
        assert xla_compiles() - before == 0
    for t in empties:
        assert t.numel() == 0
    x = torch.zeros(6, device=DEV)
    x[3:3].uniform_()  # (an empty view of a storage: the storage keeps its values)
    assert (x.cpu() == 0).all()
