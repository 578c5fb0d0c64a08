"""Indexed writes through an index padded to a size bucket (eager/bucketed_index.py) against the CPU:
several index lengths in one bucket and across buckets, duplicates, negative zeros, views, dtypes;
the padding never written, never checked, and one shared program per bucket."""

import pytest
import torch

from torchtpu.eager import bucketed_index, limits, stand_ins

DEV = "tpu"
LENGTHS = (1, 3, 7, 16, 17, 30, 33)  # buckets 16, 16, 16, 16, 32, 32, 64
REAL = [torch.bool, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _same(got, want):
    """Bit for bit: -0.0 apart from 0.0, NaNs equal."""
    got = got.cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    if not want.is_floating_point():
        return torch.equal(got, want)
    same = (got == want) & (torch.signbit(got) == torch.signbit(want))
    return bool((same | (got.isnan() & want.isnan())).all())


def _values(shape, dtype, gen):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-50, 50, shape, generator=gen, dtype=dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    v[torch.rand(shape, generator=gen) < 0.2] = -0.0  # a padded 0.0 added would turn these into 0.0
    return v


@pytest.mark.parametrize("dtype", REAL)
def test_index_put_over_lengths_matches_the_cpu(dtype):
    gen = torch.Generator().manual_seed(1)
    for n in LENGTHS:
        x = _values((12, 3), dtype, gen)
        index = torch.randint(-12, 12, (n,), generator=gen)  # duplicates and negatives
        v = _values((n, 3), dtype, gen)
        for accumulate in (True, False):
            if not accumulate:  # (the CPU's winner among duplicates: the last)
                index = torch.randperm(12, generator=gen)[: min(n, 12)]
                v = v[: index.shape[0]]
            got = x.to(DEV).index_put((index.to(DEV),), v.to(DEV), accumulate=accumulate)
            assert _same(got, x.index_put((index,), v, accumulate=accumulate)), (n, accumulate)
            # a broadcast row, and in place along the second dim
            y = x.clone().to(DEV)
            y[:, index.remainder(3).to(DEV)] = v[:, :1].T.contiguous().to(DEV)[:, :1]
            want = x.clone()
            want[:, index.remainder(3)] = v[:, :1].T.contiguous()[:, :1]
            assert _same(y, want), n


@pytest.mark.parametrize("dtype", [torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_index_add_copy_fill_over_lengths_match_the_cpu(dtype):
    gen = torch.Generator().manual_seed(2)
    for n in LENGTHS:
        for dim in (0, 1):
            x = _values((10, 9), dtype, gen)
            size = x.shape[dim]
            index = torch.randint(0, size, (n,), generator=gen)
            src_shape = (n, 9) if dim == 0 else (10, n)
            src = _values(src_shape, dtype, gen)
            xt, it, st = x.to(DEV), index.to(DEV), src.to(DEV)
            assert _same(xt.index_add(dim, it, st), x.index_add(dim, index, src)), (n, dim)
            unique = torch.randperm(size, generator=gen)[: min(n, size)]
            src_u = src.narrow(dim, 0, unique.shape[0])
            got = xt.index_add(dim, unique.to(DEV), src_u.to(DEV), alpha=2)
            assert _same(got, x.index_add(dim, unique, src_u, alpha=2)), (n, dim)
            got = xt.index_copy(dim, unique.to(DEV), src_u.to(DEV))
            assert _same(got, x.index_copy(dim, unique, src_u)), (n, dim)
            assert _same(xt.index_fill(dim, it - size, -0.0), x.index_fill(dim, index - size, -0.0)), (n, dim)
            # a non-contiguous source and index (the pad program reads them through their views)
            wide = _values((2 * src_shape[0], 2 * src_shape[1]), dtype, gen)[::2, ::2]
            stepped = torch.stack([index, index]).T.reshape(-1)[::2]
            got = xt.index_add(dim, stepped.to(DEV), wide.to(DEV))
            assert _same(got, x.index_add(dim, stepped, wide)), (n, dim)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce_over_lengths_matches_the_cpu(dtype, reduce):
    gen = torch.Generator().manual_seed(3)
    for n in (1, 5, 9, 17):
        for include_self in (True, False):
            x = _values((4, 5), dtype, gen)
            index = torch.randint(0, 5, (n,), generator=gen, dtype=torch.int32)
            src = _values((4, n), dtype, gen)
            got = x.to(DEV).index_reduce_(1, index.to(DEV), src.to(DEV), reduce, include_self=include_self)
            want = x.clone().index_reduce_(1, index, src, reduce, include_self=include_self)
            assert _same(got, want), (n, include_self)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float16, torch.float32])
def test_put_and_scatters_over_lengths_match_the_cpu(dtype):
    gen = torch.Generator().manual_seed(4)
    for n in LENGTHS:
        x = _values((6, 5), dtype, gen)
        index = torch.randint(-30, 30, (n,), generator=gen)
        src = _values((n,), dtype, gen)
        for accumulate in (True, False) if dtype != torch.bool else (True,):
            idx = index if accumulate else torch.randperm(30, generator=gen)[: min(n, 30)]
            s = src[: idx.shape[0]]
            got = x.to(DEV).put(idx.to(DEV), s.to(DEV), accumulate=accumulate)
            assert _same(got, x.put(idx, s, accumulate=accumulate)), (n, accumulate)
        if n % 2 == 0:  # a 2-d index, flattened as put reads it
            idx2 = index.remainder(30).reshape(2, -1)
            assert _same(x.to(DEV).put(idx2.to(DEV), src.to(DEV), True), x.put(idx2, src, True)), n
        if dtype == torch.bool:
            continue
        rows = torch.randint(0, 6, (n, 5), generator=gen)
        vals = _values((n + 2, 5), dtype, gen)  # (scatter reads the leading part of a larger src)
        xt = x.to(DEV)
        assert _same(xt.scatter_add(0, rows.to(DEV), vals.to(DEV)), x.scatter_add(0, rows, vals)), n
        for reduce in ("sum", "amax", "mean"):
            got = xt.scatter_reduce(0, rows.to(DEV), vals.to(DEV), reduce, include_self=False)
            assert _same(got, x.scatter_reduce(0, rows, vals, reduce, include_self=False)), (n, reduce)
        cols = torch.stack([torch.randperm(5, generator=gen)[: min(n, 5)] for _ in range(6)])
        rows6 = _values((6, 5), dtype, gen)
        assert _same(xt.scatter(1, cols.to(DEV), rows6.to(DEV)), x.scatter(1, cols, rows6)), n
        assert _same(xt.scatter(1, cols.to(DEV), -0.0), x.scatter(1, cols, -0.0)), n


def test_padded_results_are_the_exact_programs(monkeypatch):
    """Bucketed and one-program executables agree bit for bit (float sums in the same order)."""
    gen = torch.Generator().manual_seed(5)
    cases = []
    for n in (5, 11, 100, 300):
        x = torch.randn(40, generator=gen)
        index = torch.randint(0, 40, (n,), generator=gen)
        v = torch.randn(n, generator=gen) * 1e3
        cases.append((x, index, v))

    def run():
        return [x.to(DEV).index_put((i.to(DEV),), v.to(DEV), accumulate=True).cpu() for x, i, v in cases]

    limits.forget_executables()
    padded = run()
    limits.forget_executables()
    monkeypatch.setattr(bucketed_index, "build", lambda *a, **k: None)
    exact = run()
    limits.forget_executables()
    for p, e in zip(padded, exact):
        assert _same(p, e)


def test_one_shared_program_per_bucket_and_checks_skip_the_padding():
    x = torch.randn(7, 3, device=DEV)
    before = len(bucketed_index._shared)
    for n in range(1, 17):  # one bucket: one shared program
        index = torch.randint(0, 7, (n,), device=DEV)
        x.index_add_(0, index, torch.randn(n, 3, device=DEV))
    torch.tpu.synchronize()  # (no index error: the padding is one past the end)
    assert len(bucketed_index._shared) - before <= 1
    index = torch.arange(5, device=DEV) + 3  # 7 is out of range: the CPU's error, at the next sync
    with pytest.raises(IndexError, match="out of bounds"):
        x.index_add_(0, index, torch.ones(5, 3, device=DEV))
        torch.tpu.synchronize()
    x.index_add_(0, index - 3, torch.ones(5, 3, device=DEV))  # the same bucket, in range: no error
    torch.tpu.synchronize()


def test_tier_up_after_repeated_calls():
    x = torch.zeros(9, device=DEV)
    index = torch.tensor([1, 1, 4], device=DEV)
    for _ in range(stand_ins.TIER_UP + 3):
        x.index_put_((index,), torch.ones(3, device=DEV), accumulate=True)
    want = torch.zeros(9)
    want[1], want[4] = 2 * (stand_ins.TIER_UP + 3), stand_ins.TIER_UP + 3
    assert _same(x, want)


def test_padding_on_the_device_matches_the_cpu(monkeypatch):
    """Bigger indices and sources are padded by a program on the device (views read there)."""
    monkeypatch.setattr(bucketed_index, "HOST_PAD_BYTES", 0)
    bucketed_index._pads.clear()
    gen = torch.Generator().manual_seed(6)
    for n in (3, 9, 20):
        x = _values((8, 6), torch.float32, gen)
        index = torch.stack([torch.randint(0, 8, (n,), generator=gen)] * 2).T.reshape(-1)[::2]
        src = _values((2 * n, 12), torch.float32, gen)[::2, ::2]
        got = x.to(DEV).index_add(0, index.to(DEV), src.to(DEV))
        assert _same(got, x.index_add(0, index, src)), n
        neg = src.to(DEV).to(torch.complex64).conj()  # a lazily conjugated view, padded as its value
        xc = x.to(torch.complex64)
        assert _same(
            torch.view_as_real(xc.to(DEV).index_add(0, index.to(DEV), neg)),
            torch.view_as_real(xc.index_add(0, index, src.to(torch.complex64).conj())),
        ), n
        flat = torch.randint(-48, 48, (2, n), generator=gen)
        vals = _values((2, n), torch.float32, gen)
        assert _same(x.to(DEV).put(flat.to(DEV), vals.to(DEV), True), x.put(flat, vals, True)), n
    assert bucketed_index._pads  # (the device programs ran)


def test_repeated_calls_with_views_at_offsets():
    """The C++ fast path calls the bucketed executable again (offsets of views as it passes them)."""
    gen = torch.Generator().manual_seed(7)
    base = torch.randint(0, 9, (40,), generator=gen)
    src = _values((40, 4), torch.float32, gen)
    x = _values((9, 4), torch.float32, gen)
    xt, bt, st = x.to(DEV), base.to(DEV), src.to(DEV)
    for start in range(1, 12):  # the same shapes, another offset each call
        xt.index_add_(0, bt[start : start + 5], st[start : start + 5])
        x.index_add_(0, base[start : start + 5], src[start : start + 5])
    assert _same(xt, x)
