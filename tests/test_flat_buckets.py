"""Small elementwise ops of new shapes on flat arrays padded to a size bucket (eager/flat_buckets.py,
XLA:CPU) against the CPU and against the op's own one-program executable: the same bits, PyTorch's
shapes and strides, in-place writes, one program for the shapes of a bucket."""

import torch

from torchtpu.eager import stand_ins, tpu_check

DEV = "tpu"


def _ops(a, b):
    gt = a > b
    return [
        torch.isclose(a, b, rtol=0.25, atol=0.5, equal_nan=True),
        a * b,
        gt,
        torch.where(gt, a, b).masked_fill(gt, -2.5),
    ]


def test_small_elementwise_ops_match_the_cpu_and_share_a_program(xla_compiles):
    gen = torch.Generator().manual_seed(0)
    # shapes in the bucket of 16 elements (shapes no other test uses)
    shapes = [(3, 5), (13,), (5, 1, 3), (1, 11)]
    cpu = []
    for shape in shapes:
        a, b = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
        a.view(-1)[0], b.view(-1)[1] = float("nan"), -0.0
        cpu.append((a, b))
    moved = [(a.to(DEV), b.to(DEV)) for a, b in cpu]
    torch.tpu.synchronize()
    before = xla_compiles()
    got = [_ops(a, b) for a, b in moved]
    # one program per op for the bucket (and a scalar program or two of JAX's own); 20 without
    if not tpu_check.enabled():  # (the TPU compile check keeps the exact programs, compiled twice)
        assert xla_compiles() - before <= 5 + 2
    for (a, b), results in zip(cpu, got):
        for g, w in zip(results, _ops(a, b)):
            assert g.shape == w.shape and g.stride() == w.stride() and g.dtype == w.dtype
            torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True)


def test_same_bits_as_the_one_program_executable_and_in_place():
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float16, torch.int32, torch.complex64):
        a = torch.randn(3, 6, generator=gen).mul(10).to(dtype)
        b = torch.randn(3, 6, generator=gen).mul(10).to(dtype)
        ta, tb = a.to(DEV), b.to(DEV)
        first = [(ta * tb).cpu(), (ta + tb * 3).cpu(), (ta == tb).cpu()]
        for _ in range(stand_ins.TIER_UP + 1):  # the last calls run the entries' own programs
            assert all(
                torch.equal(x, y) for x, y in zip(first, [(ta * tb).cpu(), (ta + tb * 3).cpu(), (ta == tb).cpu()])
            )
        torch.testing.assert_close(first[0], a * b, rtol=0, atol=0)
        torch.testing.assert_close(first[1], a + b * 3)
        # in place on a whole storage, and a 0-dim operand
        x, y = a.clone(), ta.clone()
        x.mul_(b)
        y.mul_(tb)
        assert torch.equal(y.cpu(), x)
        s = torch.tensor(3, dtype=dtype)
        assert torch.equal((ta * s.to(DEV)).cpu(), a * s)


def test_an_element_of_the_flattened_storage_is_not_flattened_with_it():
    """`ts == ts[i]` (a diffusers scheduler's step index) reads one storage as the whole operand and as a
    0-dim element: the element must stay that element, not become the padded flat array (gave every index)."""
    ts = torch.randn(5, device="tpu")
    cpu = ts.cpu()
    for i in range(5):
        for op in (torch.eq, torch.lt, torch.mul):
            assert torch.equal(op(ts, ts[i]).cpu(), op(cpu, cpu[i]))
        assert (ts == ts[i]).nonzero().cpu().tolist() == [[i]]


def test_abs_and_conversions_share_a_program_and_match_the_cpu(xla_compiles):
    """abs and `x.to(dtype)` (eager `_to_copy`): exact per element, so flat-bucketed too (test_indexing's
    random walks compiled both for each new index length)."""
    gen = torch.Generator().manual_seed(2)
    # lengths in the bucket of 64 elements (lengths no other test uses), and a complex and a 2-d case
    cpu = [torch.empty(n, dtype=torch.float64).uniform_(-9, 9, generator=gen) for n in (41, 43, 47)]
    cpu[0][0], cpu[1][1] = float("nan"), -0.0
    moved = [x.to(DEV) for x in cpu]
    z = torch.randn(5, 7, dtype=torch.complex64, generator=gen)
    tz = z.to(DEV)
    torch.tpu.synchronize()

    def ops(x):
        return [x.abs(), x.long().abs(), x.to(torch.float32)]

    before = xla_compiles()
    got = [ops(x) for x in moved]
    if not tpu_check.enabled():  # one program per (op, dtypes) for the bucket; 12 without
        assert xla_compiles() - before <= 4 + 2
    for x, results in zip(cpu, got):
        for g, w in zip(results, ops(x)):
            assert g.shape == w.shape and g.stride() == w.stride() and g.dtype == w.dtype
            torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True)
    # complex abs (within an ulp of the CPU's, as the exact program): the last calls run the entry's own program
    first = tz.abs().cpu()
    torch.testing.assert_close(first, z.abs())
    for _ in range(stand_ins.TIER_UP + 1):
        assert torch.equal(tz.abs().cpu(), first)


def test_views_and_broadcast_operands_are_read_on_the_host_and_share_a_program(xla_compiles):
    """Operands that are views (every other element, a row at a traced offset) or that broadcast to the
    result's shape (test_binary_ufuncs' broadcasting samples) are read on the host into the bucket's flat
    array: the same bits as the CPU, one program per op for the bucket (and one per op with a 0-dim operand)."""
    gen = torch.Generator().manual_seed(3)
    pairs = [((2, 1), (2,)), ((1, 3, 2), (3, 2)), ((3, 1, 2), (1, 3, 2)), ((2, 3, 2), ()), ((4, 5), (4, 5))]
    views = [
        (lambda t: t, lambda s: s),
        (lambda t: t[..., 1::2], lambda s: (*s[:-1], 2 * s[-1] + 1)),
        (lambda t: t[1], lambda s: (3, *s)),
    ]
    ops = lambda a, b: (a + b, a * b, torch.isclose(a, b, rtol=0.5), a.abs())
    for dtype in (torch.float32, torch.int64, torch.complex64):
        cases = []
        for i, (sa, sb) in enumerate(pairs * 3):
            (va, ba), (vb, bb) = views[i % 3], views[(i + 1) % 3] if sb else views[0]
            ta = torch.randn(ba(sa), generator=gen).mul(4).to(dtype)
            tb = torch.randn(bb(sb), generator=gen).mul(4).to(dtype)
            cases.append((va, ta, vb, tb))
        moved = [(va, ta.to(DEV), vb, tb.to(DEV)) for va, ta, vb, tb in cases]
        torch.tpu.synchronize()
        before = xla_compiles()
        got = [ops(va(a), vb(b)) for va, a, vb, b in moved]
        compiles = xla_compiles() - before
        for g, (va, a, vb, b) in zip(got, cases):
            for x, y in zip(g, ops(va(a), vb(b))):
                assert x.shape == y.shape and x.dtype == y.dtype and x.stride() == y.stride()
                torch.testing.assert_close(x.cpu(), y, rtol=0, atol=0)
        if not tpu_check.enabled():  # (JAX's own scalar programs besides); ~40 without
            assert compiles <= 4 + 3 + 3, (dtype, compiles)


def test_float_tests_and_bitwise_ops_match_the_cpu_over_broadcasts():
    """isnan/isinf/isfinite/isposinf/isneginf/signbit and bitwise and/or/xor declare flat buckets (no
    rounding): NaN, infinities and signed zeros, broadcast and every-other-element operands."""
    gen = torch.Generator().manual_seed(4)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0])
    for sa, sb in [((3, 1, 2), (1, 3, 2)), ((2, 5), (5,)), ((7,), ())]:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            a = torch.randn(sa, generator=gen).mul(3)
            a.view(-1)[: min(5, a.numel())] = special[: min(5, a.numel())]
            a = a.to(dtype)
            wide = torch.stack([a, a], -1).flatten(-2)  # (a[..., ::2] is `a`, read as a view)
            for x, y in ((a.to(DEV), a), (wide.to(DEV)[..., ::2], a)):
                for f in (torch.isnan, torch.isinf, torch.isfinite, torch.isposinf, torch.isneginf, torch.signbit):
                    assert torch.equal(f(x).cpu(), f(y)), (f, sa, dtype)
        for dtype in (torch.int16, torch.int64, torch.uint8, torch.bool):
            a = torch.randint(0, 200, sa, generator=gen).to(dtype)
            b = torch.randint(0, 200, sb, generator=gen).to(dtype)
            for f in (torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor):
                assert torch.equal(f(a.to(DEV), b.to(DEV)).cpu(), f(a, b)), (f, sa, sb, dtype)
