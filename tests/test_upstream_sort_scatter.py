"""Regressions found by PyTorch's test_scatter_gather_ops.py and test_sort_and_select.py on "tpu" (issue
47), compared against the CPU on the same inputs."""

import pytest
import torch
from torch.testing import assert_close

DEV = "tpu"
COMPLEX = [torch.complex64, torch.complex128]


def _bits_equal(a, b):
    """Bit for bit (assert_close with atol=0 lets -0 equal +0); NaNs equal."""
    a, b = torch.view_as_real(a.cpu()), torch.view_as_real(b.cpu())
    same = (a == b) & (torch.signbit(a) == torch.signbit(b))
    return bool((same | (a.isnan() & b.isnan())).all())


@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_mul_rounds_each_product_as_the_cpu(dtype):
    # PyTorch's vectorized CPU kernel rounds ac, bd, ad, bc before their sums; XLA:CPU contracted
    # them into FMAs (1 complex64 product in 2 differed in its last bit). (Sizes are multiples of 16:
    # the CPU's scalar loop for the last few elements of a row is compiled with FMAs.)
    a, b = torch.randn(4096, dtype=dtype), torch.randn(4096, dtype=dtype)
    a[:4] = torch.tensor([complex(0.0, -0.0), complex(float("inf"), 1), complex(float("nan"), 2), -0.0])
    assert _bits_equal((a.to(DEV) * b.to(DEV)).cpu(), a * b)
    assert _bits_equal((a.to(DEV) * (0.25 - 1.5j)).cpu(), a * (0.25 - 1.5j))
    # broadcast operands, and in place into a view
    x, y = torch.randn(64, 64, dtype=dtype), torch.randn(64, dtype=dtype)
    assert _bits_equal((x.to(DEV) * y.to(DEV)).cpu(), x * y)
    xt = x.to(DEV)
    xt[:, 16:48] *= y[:32].to(DEV)
    x[:, 16:48] *= y[:32]
    assert _bits_equal(xt.cpu(), x)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_addcmul_rounds_as_the_cpu(dtype):
    c, a, b = (torch.randn(4096, dtype=dtype) for _ in range(3))
    for value in (1, 0.5, 2 - 1j):
        got = torch.addcmul(c.to(DEV), a.to(DEV), b.to(DEV), value=value)
        assert _bits_equal(got, torch.addcmul(c, a, b, value=value))
    real = [torch.randn(100) for _ in range(3)]
    got = torch.addcmul(*(t.to(DEV) for t in real), value=0.5).cpu()
    assert_close(got, torch.addcmul(*real, value=0.5))


@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_pow_by_2_and_3_is_the_cpus_product(dtype):
    a = torch.randn(4096, dtype=dtype)
    for exponent in (2, 3, 2.0, 2 + 0j):
        assert _bits_equal(a.to(DEV) ** exponent, a**exponent)
    got = a.to(DEV)
    got.pow_(3)
    assert _bits_equal(got, a**3)
    # other exponents, and a 0-dim tensor exponent, take the CPU's general pow (close, not bit for bit)
    for exponent in (0.5, torch.tensor(2.0)):
        assert_close(a.to(DEV).pow(exponent.to(DEV) if torch.is_tensor(exponent) else exponent).cpu(), a.pow(exponent))


@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_scatter_multiply_agrees_with_mul(dtype):
    # test_scatter_reduce_prod / test_scatter__reductions: the scatter's product of each element must be
    # the elementwise `*=` one (the upstream test compares them with atol=0)
    x, src = torch.randn(6, 7, dtype=dtype), torch.randn(6, 7, dtype=dtype)
    index = torch.randint(0, 6, (6, 7))
    xt, st, it = x.to(DEV), src.to(DEV), index.to(DEV)
    for include_self in (True, False):
        got = xt.clone().scatter_reduce_(0, it, st, "prod", include_self=include_self)
        expected = xt.clone()
        seen = torch.zeros(6, 7, dtype=torch.bool)
        for i in range(6):
            for j in range(7):
                k = int(index[i, j])
                if not include_self and not seen[k, j]:
                    expected[k, j] = st[i, j]
                else:
                    expected[k, j] *= st[i, j]
                seen[k, j] = True
        assert _bits_equal(got, expected)
    legacy = xt.clone().scatter_(1, it, st, reduce="multiply")
    assert_close(legacy.cpu(), x.clone().scatter_(1, index, src, reduce="multiply"))
    empty = torch.tensor((), dtype=torch.long)  # (fewer dims than x: allowed when empty)
    assert_close(xt.scatter_reduce(0, empty.to(DEV), st[0], "prod").cpu(), x)
    scalar = xt.clone().scatter_(1, it, 0.5, reduce="multiply")
    assert _bits_equal(scalar, x.clone().scatter_(1, index, 0.5, reduce="multiply"))


def test_complex64_scatter_prod_is_the_cpus_bit_for_bit():
    # one update per element: the CPU's complex64 scatter rounds each product too (its complex128
    # scalar loop is compiled with FMAs, so only complex64 is compared bit for bit)
    x, src = torch.randn(5000, dtype=torch.complex64), torch.randn(5000, dtype=torch.complex64)
    index = torch.randperm(5000)
    got = x.to(DEV).scatter_reduce(0, index.to(DEV), src.to(DEV), "prod")
    assert _bits_equal(got, x.scatter_reduce(0, index, src, "prod"))
    zero_dim = torch.randn((), dtype=torch.complex64)
    got = zero_dim.to(DEV).scatter_reduce(0, torch.tensor(0, device=DEV), src[:1].to(DEV)[0], "prod")
    assert _bits_equal(got, zero_dim.scatter_reduce(0, torch.tensor(0), src[0], "prod"))


def test_index_fill_takes_a_cpu_index_tensor():
    # test_stable_sort_against_numpy's index_fill with a 1-element CPU index: moved to the device, as
    # advanced indexing moves one on CUDA (tests/test_upstream_indexing.py has the index_* family)
    x = torch.randn(10, 10, device=DEV)
    for index in (torch.tensor([3]), torch.tensor([3, 7])):
        assert_close(x.index_fill(0, index, float("inf")).cpu(), x.cpu().index_fill(0, index, float("inf")))
