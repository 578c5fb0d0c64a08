"""Regressions found by test_binary_ufuncs.py's OpInfo templates in dtypes other than float32 on "tpu"
(issue 47), compared against the CPU on the same inputs."""

import pytest
import torch
from torch.testing import assert_close

DEV = "tpu"
INF, NAN = float("inf"), float("nan")


def _all_pairs(values, dtype):
    x = torch.tensor(values, dtype=dtype)
    return x.repeat_interleave(len(values)), x.repeat(len(values))


def _same_nan_pattern(actual, expected):
    # complex NaN/inf results: which real parts are NaN, and the rest close
    a, e = torch.view_as_real(actual), torch.view_as_real(expected)
    assert torch.equal(a.isnan(), e.isnan())
    assert_close(a, e, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32])
def test_lcm_of_small_ints_wraps_as_on_the_cpu(dtype):
    # C++ computes a / gcd * b of (u)int8/int16 in int and wraps only when storing: int16 lcm(1113, 10701)
    # is -27625 on the CPU; tpu took abs of the wrapped product (27625)
    hi = 120 if dtype in (torch.int8, torch.uint8) else 11000
    lo = 0 if dtype == torch.uint8 else -hi
    a = torch.cat([torch.tensor([1113, -10701, 10701] if hi > 200 else [7, -9, 11]), torch.randint(lo, hi, (60,))])
    b = torch.cat([torch.tensor([10701, 1113, -1113] if hi > 200 else [117, 13, -13]), torch.randint(lo, hi, (60,))])
    a, b = a.to(dtype), b.to(dtype)
    assert torch.equal(torch.lcm(a.to(DEV), b.to(DEV)).cpu(), torch.lcm(a, b))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_add_sub_of_infinities_as_on_the_cpu(dtype):
    # the CPU's and CUDA's kernels compute a + alpha * b with a complex product, alpha = 1 included, so
    # an infinite part gives NaN in the other part (0 + infj is nan+infj); tpu added the parts
    x, y = _all_pairs([complex(p, q) for p in (0, -1, INF, -INF, NAN) for q in (0, 2, INF, -INF, NAN)], dtype)
    for fn in (
        torch.add,
        torch.sub,
        torch.rsub,
        lambda p, q: torch.sub(p, q, alpha=2),
        lambda p, q: p - (1 + 2j),
        lambda p, q: (1 + 2j) - p,
    ):
        _same_nan_pattern(fn(x.to(DEV), y.to(DEV)).cpu(), fn(x, y))
    a, b = torch.randn(100, dtype=dtype), torch.randn(100, dtype=dtype)
    assert torch.equal((a.to(DEV) - b.to(DEV)).cpu(), a - b)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_pow_of_large_values_as_on_the_cpu(dtype):
    # XLA's complex power multiplies |a|^re(b) by exp(-im(b) arg(a)): 0 * inf = NaN where the CPU's
    # exp(b log a) underflows to 0 (or overflows to inf)
    torch.manual_seed(0)
    a = torch.randn(400, dtype=dtype) * 1e4
    b = torch.randn(400, dtype=dtype) * 1e4
    expected = torch.pow(a, b)
    actual = torch.pow(a.to(DEV), b.to(DEV)).cpu()
    zero = expected == 0  # (an overflow's signs depend on the angle's last bits: compared where 0)
    assert zero.sum() > 100
    assert torch.equal(actual[zero], expected[zero])
    assert not actual.isnan().any()
    x = torch.randn(300, dtype=dtype) * 3
    y = torch.randn(300, dtype=dtype) * 3
    assert_close(torch.pow(x.to(DEV), y.to(DEV)).cpu(), torch.pow(x, y))
    assert_close((x.to(DEV) ** 0.5).cpu(), x**0.5)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_pow_of_infinities_and_nans_as_on_the_cpu(dtype):
    # C's cpow: clog(inf+nanj) has an infinite real part, and C's complex product recovers infinities
    # where the plain one gives NaN+NaNj; (inf+infj) ** (-inf+nanj) is 0 on the CPU, NaN on tpu before
    parts = (0.0, 1.0, -2.5, INF, -INF, NAN)
    x, y = _all_pairs([complex(p, q) for p in parts for q in parts], dtype)
    assert_close(torch.pow(x.to(DEV), y.to(DEV)).cpu(), torch.pow(x, y), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64, torch.uint8])
def test_gcd_of_a_signed_minimum_ends_and_matches_the_cpu(dtype):
    # jnp.gcd's loop never ended for a signed type's minimum (int8 gcd(55, -128) hung the process)
    info = torch.iinfo(dtype)
    v = torch.tensor([0, 1, 55, 12, 18, info.max, info.min, info.min + 1 if info.min else 128], dtype=dtype)
    if info.min:
        v = torch.cat([v, -v[1:5]])
    a, b = v.repeat_interleave(len(v)), v.repeat(len(v))
    assert torch.equal(torch.gcd(a.to(DEV), b.to(DEV)).cpu(), torch.gcd(a, b))


@pytest.mark.parametrize(
    "call",
    [
        lambda d, out: torch.floor_divide(torch.tensor([7, -9], dtype=torch.int16, device=d), 2, out=out),
        lambda d, out: torch.ge(torch.tensor([1.0, 2.0], device=d), 1.5, out=out),
        lambda d, out: torch.bitwise_and(torch.tensor([6, 3], device=d), 5, out=out),
        lambda d, out: torch.clamp(torch.tensor([0.2, 2.0], device=d), 0.5, 1.0, out=out),
    ],
)
@pytest.mark.parametrize("out_dtype", [torch.complex64, torch.float64])
def test_real_only_ops_write_into_a_complex_out_as_on_the_cpu(call, out_dtype):
    # the CPU computes in the inputs' dtype and casts into `out`; tpu's real-only check read `out` too.
    # clamp by Scalars refuses any other dtype of `out` on the CPU ("Found dtype ... but expected Float")
    results = []
    for d in ("cpu", DEV):
        try:
            results.append(call(d, torch.zeros(2, dtype=out_dtype, device=d)).cpu())
        except RuntimeError as e:
            results.append(str(e))
    if isinstance(results[0], str):
        assert results[0] == results[1]
    else:
        assert_close(results[1], results[0])


def test_lcm_of_bools_refused_as_on_the_cpu():
    # PyTorch's meta kernel raised its own RuntimeError ("Tensor with dtype torch.int64 is not the expected ...")
    a = torch.tensor([True, False], device=DEV)
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.lcm(a, a)
    assert torch.equal(torch.lcm(a, torch.tensor([4, 6], device=DEV)).cpu(), torch.tensor([4, 0]))


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("other", [torch.int32, torch.int64, torch.uint8])
def test_a_tensor_beside_a_half_tensor_is_rounded_to_it_first(half, other):
    # The CPU and CUDA load every tensor operand in the common dtype (the half type) and compute in
    # float32: int32 2049 == float16 2048 is True there, and 2049 - 2048.0 is 0. tpu converted the int
    # straight to float32 (isin, comparisons and arithmetic all wrong where the int does not fit)
    hi = 255 if other == torch.uint8 else 100_000
    x = torch.cat([torch.tensor([2049, 2047, 3, 255]), torch.randint(0, hi, (200,))]).to(other)
    y = x.to(half)[torch.randperm(len(x))]
    y[:4] = torch.tensor([2048.0, 2048.0, 3.0, 256.0], dtype=half)
    xd, yd = x.to(DEV), y.to(DEV)
    for op in (torch.eq, torch.ne, torch.lt, torch.add, torch.sub, torch.mul, torch.maximum, torch.atan2):
        for a, b, ad, bd in ((x, y, xd, yd), (y, x, yd, xd)):
            assert_close(op(ad, bd).cpu(), op(a, b), rtol=0, atol=0, equal_nan=True, msg=op.__name__)
    assert torch.equal(torch.isin(xd, yd).cpu(), torch.isin(x, y))
    assert torch.equal(torch.isin(yd, xd).cpu(), torch.isin(y, x))
    # a half 0-dim tensor beside an int tensor: the common dtype is still the half type
    s = torch.tensor(1.0, dtype=half)
    assert_close((xd * s.to(DEV)).cpu(), x * s, rtol=0, atol=0)
