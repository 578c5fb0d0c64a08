"""Reductions and scans of new lengths on an operand padded with the reduction's identity to a size
bucket (eager/reduction_buckets.py, XLA:CPU) against the CPU and against the op's own one-program
executable: the same bits, NaN, ties, -0.0 and integer wrap-around as before, one program per bucket."""

import pytest
import torch

from torchtpu.eager import reduction_buckets, stand_ins, tpu_check

DEV = "tpu"
SERVES = not tpu_check.enabled()  # (the TPU compile check keeps the exact programs)


def _shared_ops():
    return sorted(k[0] for k in reduction_buckets._shared)


def _equal(got, want):
    if isinstance(want, tuple):
        for g, w in zip(got, want):
            _equal(g, w)
        return
    assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
    # (float scans: the CPU sums in order, XLA in a tree, padded or not: the last bit may differ)
    exact = {} if want.is_floating_point() else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(got.cpu(), want, equal_nan=True, **exact)


def test_lengths_of_a_bucket_share_one_program(xla_compiles):
    gen = torch.Generator().manual_seed(0)
    xs = [torch.empty(n, dtype=torch.float64).uniform_(-1, 1, generator=gen) for n in range(40, 44)]
    moved = [x.to(DEV) for x in xs]
    torch.tpu.synchronize()
    before = xla_compiles()
    got = [(t.cumsum(0), t.cumsum(0).long().abs().max()) for t in moved]
    if SERVES:  # cumsum and max once for the bucket of 64 (the cast and abs: flat buckets)
        assert xla_compiles() - before <= 6  # (8 without)
    for x, (c, m) in zip(xs, got):
        _equal(c, x.cumsum(0))
        _equal(m, x.cumsum(0).long().abs().max())


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INTS = (torch.uint8, torch.int8, torch.int32, torch.int64)
_FAST = (torch.float32,)  # (the other dtypes: slow)


def _input(dtype, shape, gen):
    x = torch.randn(shape, generator=gen).mul(20)
    if dtype.is_floating_point:
        x = x.to(dtype)
        flat = x.view(-1)
        flat[1], flat[2], flat[3] = -0.0, float("-inf"), float("inf")
        return x
    if dtype == torch.bool:
        return x > 0
    return x.to(dtype)


def _reductions(x):
    out = [x.amax(), x.max(0), x.amin(1, keepdim=True), x.cummax(0), x.cummin(1)]
    if x.dtype != torch.bool:
        out += [x.argmax(), x.argmin(0, keepdim=True), x.argmax(None, keepdim=True), x.cumsum(1), x.cumprod(0)]
    if not x.is_floating_point():
        out += [x.sum(), x.sum(0), x.prod(1)]
    else:
        out += [x.logcumsumexp(0)]
    out += [x.any(), x.all(0), (x > 1).any(1, keepdim=True)]
    return out


@pytest.mark.parametrize(
    "dtype",
    [
        *_FAST,
        *(pytest.param(d, marks=pytest.mark.slow) for d in (*_FLOATS, *_INTS, torch.bool) if d not in _FAST),
    ],
)
def test_reductions_and_scans_match_the_cpu(dtype):
    gen = torch.Generator().manual_seed(2)
    x = _input(dtype, (19, 3), gen)
    got = _reductions(x.to(DEV))
    for g, w in zip(got, _reductions(x)):
        _equal(g, w)


def test_nan_and_ties():
    x = torch.tensor([1.0, float("nan"), 3.0, float("nan")] + [0.0] * 17)
    tied = torch.full((21,), float("-inf"))
    ints = torch.full((21,), torch.iinfo(torch.int32).min, dtype=torch.int32)
    for t in (x, tied, ints):
        d = t.to(DEV)
        _equal(d.max(0), t.max(0))  # (values and argmax)
        _equal(d.cummax(0), t.cummax(0))
    big = torch.full((37,), 100, dtype=torch.int8)  # (wraps around in int8, as on the CPU)
    _equal(big.to(DEV).cumsum(0, dtype=torch.int8), big.cumsum(0, dtype=torch.int8))
    _equal(big.to(DEV).sum(dtype=torch.int8), big.sum(dtype=torch.int8))


def test_same_bits_as_the_one_program_executable():
    gen = torch.Generator().manual_seed(3)
    ops = [
        lambda t: t.cumsum(0),
        lambda t: t.logcumsumexp(0),
        lambda t: t.cumprod(1),
        lambda t: t.max(1),
        lambda t: t.argmin(),
    ]
    x = torch.randn(27, 5, generator=gen).to(DEV)
    others = [torch.randn(27, 5, generator=gen).to(DEV) for _ in range(stand_ins.TIER_UP)]
    first = [f(x) for f in ops]  # (bucketed)
    for y in others[1:]:
        for f in ops:
            f(y)
    again = [f(x) for f in ops]  # (the entries' own programs; a memo holds only the last inputs' results)
    if SERVES:
        assert {"cumsum.default", "logcumsumexp.default", "cumprod.default", "max.dim"} <= set(_shared_ops())
    for a, b in zip(first, again):
        if isinstance(a, tuple):
            assert all(torch.equal(p.cpu(), q.cpu()) for p, q in zip(a, b))
        else:
            assert a.cpu().view(torch.int32).equal(b.cpu().view(torch.int32)) if a.is_floating_point() else a.equal(b)


def test_float_sums_keep_their_program_and_errors_are_the_cpus():
    x = torch.randn(23, 2).to(DEV)
    before = len(reduction_buckets._shared)
    torch.testing.assert_close(x.sum().cpu(), x.cpu().sum())
    torch.testing.assert_close(x.prod(0).cpu(), x.cpu().prod(0))
    assert len(reduction_buckets._shared) == before  # (their order decides the last bit)
    with pytest.raises(RuntimeError, match="argmax\\(\\): does not support bool input"):
        torch.zeros(23, dtype=torch.bool, device=DEV).argmax()
    with pytest.raises(IndexError, match="Expected reduction dim 1 to have non-zero size"):
        torch.zeros(23, 0, device=DEV).max(1)
