"""torch.get_default_dtype() keys only the executables that depend on it (eager/engine.py
OpKernel._other_default_dtype): switching it gives the CPU's dtypes and values, and an op whose
result does not follow it compiles once for every default dtype."""

from __future__ import annotations

import contextlib
import itertools
import os

import pytest
import torch
from torch.testing import assert_close

import torchtpu  # noqa: F401
from torchtpu.metrics import counters

DEV = "tpu"
_sizes = itertools.count(int.from_bytes(os.urandom(2), "little") % 1000 + 5000)


@contextlib.contextmanager
def default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _mix(device, ints, floats, halves):
    """Ops whose result dtype follows the default dtype (int / int, int * float, unary float ops on
    ints, complex scalars, factories without dtype=) and ops whose result does not."""
    i, f, h = (t.to(device) for t in (ints, floats, halves))
    n = ints.shape[1]
    return [
        i / (i + 1),  # true division of integers
        torch.div(i, 3),
        i * 1.5,  # an integer tensor with a float scalar
        (i > 2) * 2.5,  # bool with a float scalar
        torch.sqrt(i.abs()),  # a float op of integers
        i * 1j,  # the default complex dtype
        torch.scalar_tensor(2.5, device=device),
        torch.full((2, n), 1.5, device=device),
        torch.full((2, n), 1j, device=device),
        torch.linspace(0, 2.5, n, device=device),
        torch.zeros(2, n, device=device) + 1,
        f / (f.abs() + 1),  # float32 in, float32 out under any default dtype
        h * 1.5,  # float16 stays float16
        i + 1,
        i // 2,
        f.sum(1),
        torch.where(i > 2, f, 0.5),
        torch.mean(i.double(), 1),
    ]


@pytest.mark.parametrize("order", [(torch.float32, torch.float64, torch.float32), (torch.float64, torch.bfloat16)])
def test_switching_the_default_dtype_gives_the_cpu_dtypes(order):
    n = next(_sizes)  # a new shape: the executables are built under the first default dtype
    ints = torch.randint(-9, 9, (2, n))
    floats = torch.randn(2, n)
    halves = torch.randn(2, n, dtype=torch.float16)
    for dtype in [*order, *order]:
        with default_dtype(dtype):
            expected = _mix("cpu", ints, floats, halves)
            got = _mix(DEV, ints, floats, halves)
        for k, (g, e) in enumerate(zip(got, expected)):
            assert g.dtype == e.dtype, (dtype, k, g.dtype, e.dtype)
            # (f.sum(1) adds ~5000 values in XLA's order, not the CPU's: a float32 sum's rounding)
            tol = {"rtol": 1e-5, "atol": 1e-4} if k == 15 else {}
            assert_close(g.cpu(), e, **tol, msg=lambda m, k=k, dtype=dtype: f"{dtype} op {k}: {m}")


def test_an_op_that_does_not_follow_the_default_dtype_compiles_once():
    n = next(_sizes)
    x, y = torch.randn(3, n, device=DEV), torch.randn(3, n, device=DEV)
    a, b = torch.randint(1, 9, (3, n), device=DEV), torch.randint(1, 9, (3, n), device=DEV)
    x * y + 1
    a + b
    before = counters.eager_compiles
    with default_dtype(torch.float64):
        same = [x * y + 1, a + b]
    assert counters.eager_compiles == before  # no new executable: neither result follows it
    assert same[0].dtype == torch.float32 and same[1].dtype == torch.int64
    with default_dtype(torch.float64):
        q = a / b  # built under float64: float64
    r = a / b  # the same key under float32: its own executable
    assert q.dtype == torch.float64 and r.dtype == torch.float32
    assert_close(r.cpu(), a.cpu() / b.cpu())
    with default_dtype(torch.float64):
        assert_close((a / b).cpu(), a.cpu().double() / b.cpu())
    compiles = counters.eager_compiles
    for dtype in (torch.float32, torch.float64, torch.float32):
        with default_dtype(dtype):
            a / b
            x * y + 1
    assert counters.eager_compiles == compiles  # each found its own again


def test_integer_isclose_measures_in_the_current_default_dtype():
    # isclose of integers takes their difference in the default float dtype (a bool result either way):
    # 2**40 + 1 and 2**40 are one apart in float64 but equal in float32
    n = next(_sizes)
    a = torch.full((n,), 2**40 + 1, dtype=torch.int64)
    b = torch.full((n,), 2**40, dtype=torch.int64)
    for dtype in (torch.float32, torch.float64, torch.float32):
        with default_dtype(dtype):
            got = torch.isclose(a.to(DEV), b.to(DEV), rtol=0, atol=0.5).cpu()
            assert_close(got, torch.isclose(a, b, rtol=0, atol=0.5))
