"""Membership tests (`isin`) of new shapes and dtypes on operands padded to size buckets
(eager/set_buckets.py, XLA:CPU) against the CPU, bit for bit: every dtype pair, 0-dim and empty
operands, NaN, invert; one program for the shapes of a bucket and the dtype pairs of a common dtype."""

import itertools

import pytest
import torch

from torchtpu.eager import set_buckets, stand_ins, tpu_check

DEV = "tpu"
DTYPES = (
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
)


def _pair(gen, sa, sb, da, db):
    a = torch.randint(-4, 9, sa, generator=gen).to(da)
    b = torch.randint(-4, 9, sb, generator=gen).to(db)
    return a, b


def test_isin_matches_the_cpu_for_every_dtype_pair_and_shape():
    gen = torch.Generator().manual_seed(0)
    shapes = [((3,), (30,)), ((2, 3), (5,)), ((), (4, 2)), ((7, 1), ()), ((), ()), ((0,), (3,)), ((4,), (0,))]
    for i, (da, db) in enumerate(itertools.product(DTYPES, DTYPES)):
        for sa, sb in shapes[i % 2 :: 2] if da != db else shapes:  # (each pair meets half the shapes)
            a, b = _pair(gen, sa, sb, da, db)
            if torch.bool in (da, db):  # (the CPU's error, raised on tpu too)
                with pytest.raises(RuntimeError, match="Unsupported input type encountered for isin"):
                    torch.isin(a.to(DEV), b.to(DEV))
                with pytest.raises(RuntimeError, match="Unsupported input type encountered for isin"):
                    torch.isin(a, b)
                continue
            for invert in (False, True):
                want = torch.isin(a, b, invert=invert)
                got = torch.isin(a.to(DEV), b.to(DEV), invert=invert)
                assert got.shape == want.shape and got.dtype == want.dtype and got.stride() == want.stride()
                assert torch.equal(got.cpu(), want), (da, db, sa, sb, invert)


def test_nan_signed_zero_and_wrapping_zero_dim_operands():
    nan = float("nan")
    cases = [
        (torch.tensor([nan, 0.0, -0.0, 1.5, 2.0]), torch.tensor([nan, -0.0, 2.0, 7.0, 9.0, 1.0])),
        (torch.tensor([1.0, nan]), torch.tensor([nan])),
        # a 0-dim int64 set against int8 elements compares in int8 (300 wraps to 44), as on the CPU
        (torch.tensor([44, 1, -3], dtype=torch.int8), torch.tensor(300)),
        (torch.tensor(300), torch.tensor([44, 1, -3], dtype=torch.int8)),
        (torch.tensor([255, 1], dtype=torch.uint8), torch.tensor([-1, 1000, 1], dtype=torch.int16)),
        (torch.tensor([255, 2048], dtype=torch.int16), torch.tensor([2048.0, 7.0, 255.0], dtype=torch.float32)),
    ]
    for a, b in cases:
        for invert in (False, True):
            got = torch.isin(a.to(DEV), b.to(DEV), invert=invert).cpu()
            assert torch.equal(got, torch.isin(a, b, invert=invert)), (a, b, invert)


def test_new_shapes_and_dtype_pairs_of_a_bucket_build_no_new_program(xla_compiles):
    gen = torch.Generator().manual_seed(1)
    # shapes whose operands fall in the buckets of 16 and 32 elements (shapes no other test uses)
    first = [(torch.int16, torch.int16, (3, 4), (17,)), (torch.int8, torch.int16, (11,), (5, 5))]
    later = [
        (torch.int16, torch.uint8, (2, 7), (29,)),
        (torch.uint8, torch.int16, (13,), (3, 9)),
        (torch.int16, torch.int8, (5, 3), (31,)),
    ]
    cases = [(*_pair(gen, sa, sb, da, db), unique) for da, db, sa, sb in first + later for unique in (False, True)]
    moved = [(a.to(DEV), b.to(DEV)) for a, b, _ in cases]
    torch.tpu.synchronize()
    got = [torch.isin(a, b, assume_unique=u) for (a, b), (_, _, u) in zip(moved[:4], cases[:4])]
    torch.tpu.synchronize()
    before = xla_compiles()
    got += [torch.isin(a, b, assume_unique=u) for (a, b), (_, _, u) in zip(moved[4:], cases[4:])]
    torch.tpu.synchronize()
    if not tpu_check.enabled():  # (the TPU compile check keeps the exact programs)
        assert xla_compiles() - before == 0  # 6 without the buckets
    for g, (a, b, _) in zip(got, cases):
        assert torch.equal(g.cpu(), torch.isin(a, b))


def test_exact_casts_only_and_the_own_program_after_tier_up():
    assert set_buckets.exact_cast(torch.int8, torch.float16)
    assert set_buckets.exact_cast(torch.int32, torch.float64)
    assert not set_buckets.exact_cast(torch.int64, torch.float64)
    assert not set_buckets.exact_cast(torch.int16, torch.float16)
    assert not set_buckets.exact_cast(torch.float16, torch.bfloat16)
    assert set_buckets.exact_cast(torch.bfloat16, torch.float32)
    gen = torch.Generator().manual_seed(2)
    a, b = _pair(gen, (4, 5), (6,), torch.int32, torch.int8)
    ta, tb = a.to(DEV), b.to(DEV)
    want = torch.isin(a, b)
    for _ in range(stand_ins.TIER_UP + 2):  # the last calls run the entry's own program
        assert torch.equal(torch.isin(ta, tb).cpu(), want)


def test_isin_of_a_scalar_matches_the_cpu():
    """isin.Tensor_Scalar (flat-bucketed: eager/flat_buckets.py) and isin.Scalar_Tensor."""
    gen = torch.Generator().manual_seed(3)
    for shape in ((2, 3, 4), (7,), (3, 5)):
        for dtype in (torch.int64, torch.float32, torch.uint8):
            a = torch.randint(0, 9, shape, generator=gen).to(dtype)
            for invert in (False, True):
                assert torch.equal(torch.isin(a.to(DEV), 6, invert=invert).cpu(), torch.isin(a, 6, invert=invert))
                assert torch.equal(torch.isin(5, a.to(DEV), invert=invert).cpu(), torch.isin(5, a, invert=invert))
