"""Complex tensors on the tpu device vs the CPU: the edges the OpInfo samples (small random values)
do not reach — infinities and NaNs in logaddexp/angle, real results of complex reductions, views
that alias a complex storage as floats and back — and PyTorch's errors for torch.complex/polar."""

import functools
import math

import pytest
import torch
from conftest import assert_matches_cpu

TPU = "tpu"
COMPLEX = [torch.complex64, torch.complex128]
INF, NAN = math.inf, math.nan


_same = functools.partial(assert_matches_cpu, equal_nan=True)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_logaddexp_infinities_and_nans(dtype):
    special = [
        complex(-INF, 1),
        complex(INF, 2),
        complex(NAN, 0),
        complex(1, NAN),
        1 + 1j,
        complex(-INF, 0),
        complex(INF, -1),
        3 - 2j,
    ]
    other = [complex(-INF, 3), complex(INF, 1), 1, 1, 1 + 1j, 2 + 5j, 0.5j, complex(-INF, 2)]
    a = torch.cat([torch.tensor(special, dtype=dtype), torch.randn(40, dtype=dtype) * 4])
    b = torch.cat([torch.tensor(other, dtype=dtype), torch.randn(40, dtype=dtype) * 4])
    _same(torch.logaddexp, a, b)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_angle_is_real_and_keeps_signed_zeros(dtype):
    x = torch.tensor([complex(NAN, 1), complex(-1, 0.0), complex(-1, -0.0), 0j, complex(-0.0, 0), 1j, -2j], dtype=dtype)
    _same(torch.angle, torch.cat([x, torch.randn(20, dtype=dtype)]))


@pytest.mark.parametrize("dtype", COMPLEX)
@pytest.mark.parametrize("fn", ["var", "std", "var_mean", "std_mean"])
def test_complex_variance_is_real(dtype, fn):
    x = torch.randn(5, 7, dtype=dtype) * 3 + (2 - 1j)
    f = getattr(torch, fn)
    for kwargs in ({}, {"dim": 1}, {"dim": 0, "correction": 0}, {"dim": (0, 1), "keepdim": True}):
        _same(lambda t: torch.stack(f(t, **kwargs)) if fn.endswith("_mean") else f(t, **kwargs), x)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_logsumexp_principal_branch_and_vdot_conjugates(dtype):
    x = torch.randn(4, 9, dtype=dtype) * 5
    _same(lambda t: torch.logsumexp(t, 1), x)
    _same(lambda t: torch.logsumexp(t, (0, 1)), x)
    v, w = torch.randn(11, dtype=dtype), torch.randn(11, dtype=dtype)
    _same(torch.vdot, v, w)
    _same(lambda a, b: torch.linalg.vecdot(a, b), x, x.flip(0))


def test_views_alias_complex_storage():
    x = torch.randn(4, dtype=torch.complex64)
    xt = x.to(TPU)
    for t in (x, xt):
        torch.view_as_real(t)[1, 0] = 7.0
        t.real.mul_(2)
        t.imag[2] = -3
    torch.testing.assert_close(xt.cpu(), x, rtol=0, atol=0)
    f = torch.randn(3, 2)
    ft = f.to(TPU)
    for t in (f, ft):
        torch.view_as_complex(t).mul_(1j)
    torch.testing.assert_close(ft.cpu(), f, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_complex_polar_conj_physical(dtype):
    r, i = torch.randn(3, 4, dtype=dtype), torch.randn(4, dtype=dtype)
    _same(torch.complex, r, i)
    _same(torch.polar, r.abs(), i)
    c = torch.complex(r, r.flip(0))
    _same(torch.conj_physical, c)
    _same(lambda t: t.clone().conj_physical_(), c)


@pytest.mark.parametrize("fn", [torch.complex, torch.polar])
def test_complex_constructors_reject_mixed_dtypes_as_the_cpu(fn):
    a, b = torch.rand(3), torch.rand(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="Expected object of scalar type Float but got scalar type Double"):
        fn(a, b)
    with pytest.raises(RuntimeError, match="Expected object of scalar type Float but got scalar type Double"):
        fn(a.to(TPU), b.to(TPU))


def test_abs_of_bool_raises_as_the_cpu():
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.abs(torch.ones(2, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        torch.abs(torch.ones(2, dtype=torch.bool, device=TPU))


def test_compiled_complex_graph():
    def f(x):
        spec = torch.fft.rfft(x)
        return spec.abs() + torch.angle(spec) + torch.view_as_real(spec * (1 - 2j)).sum(-1)

    x = torch.randn(3, 16)
    compiled = torch.compile(f, backend="tpu", fullgraph=True)
    torch.testing.assert_close(compiled(x.to(TPU)).cpu(), f(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.Adam(p, lr=0.1),
        lambda p: torch.optim.AdamW(p, lr=0.1, foreach=False),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    ],
    ids=["adam", "adamw", "sgd"],
)
def test_optimizer_steps_on_complex_parameters(make):
    # the optimizers view complex parameters and states as real pairs (view_as_real)
    results = []
    for device in ("cpu", TPU):
        torch.manual_seed(0)
        w = torch.randn(4, 3, dtype=torch.complex64).to(device).requires_grad_()
        x = torch.randn(5, 4, dtype=torch.complex64).to(device)
        opt = make([w])
        for _ in range(3):
            opt.zero_grad()
            (x @ w).abs().pow(2).sum().backward()
            opt.step()
        results.append(w.detach().cpu())
    torch.testing.assert_close(results[1], results[0], rtol=1e-4, atol=1e-5)


REAL_ONLY_CALLS = {
    "lt": lambda c: torch.lt(c, c),
    "gt_": lambda c: c.clone().gt_(0),
    "maximum": lambda c: torch.maximum(c, c),
    "clamp": lambda c: torch.clamp(c, 0, 1),
    "max": lambda c: c.max(),
    "max.dim": lambda c: c.max(0),
    "argmax": lambda c: c.argmax(),
    "sort": lambda c: c.sort(),
    "argsort": lambda c: c.argsort(),
    "topk": lambda c: c.topk(2),
    "median": lambda c: c.median(),
    "cummax": lambda c: c.cummax(0),
    "unique": lambda c: torch.unique(c),
    "round": lambda c: c.round(),
    "sign": lambda c: c.sign(),
    "floor": lambda c: c.floor(),
    "remainder": lambda c: c % c,
    "relu": lambda c: torch.relu(c),
    "softmax": lambda c: c.softmax(0),
    "erf": lambda c: torch.erf(c),
    "nansum": lambda c: c.nansum(),
    "bitwise_and": lambda c: torch.bitwise_and(c, c),
    "leaky_relu": lambda c: torch.nn.functional.leaky_relu(c),
    "mse_loss": lambda c: torch.nn.functional.mse_loss(c, c),
    "avg_pool1d": lambda c: torch.nn.functional.avg_pool1d(c.reshape(1, 1, -1), 2),
    "interpolate": lambda c: torch.nn.functional.interpolate(c.reshape(1, 1, -1), scale_factor=2.0),
}


@pytest.mark.parametrize("name", list(REAL_ONLY_CALLS))
def test_ops_without_complex_meaning_raise_as_the_cpu(name):
    # orderings, rounding, activations: the CPU and CUDA refuse complex inputs, and so does tpu
    # (JAX would order complex numbers lexicographically and answer)
    fn, c = REAL_ONLY_CALLS[name], torch.randn(6, dtype=torch.complex64)
    with pytest.raises((NotImplementedError, RuntimeError)) as on_cpu:
        fn(c)
    with pytest.raises((NotImplementedError, RuntimeError)) as on_tpu:
        fn(c.to(TPU))
    if on_tpu.type is RuntimeError:  # an op with its own words on the CPU (maximum, heaviside): those
        assert str(on_tpu.value) == str(on_cpu.value)
    else:
        assert "not implemented for 'ComplexFloat'" in str(on_tpu.value)


def test_compiled_ops_without_complex_meaning_raise():
    c = torch.randn(6, dtype=torch.complex128, device=TPU)
    with pytest.raises(Exception, match="not implemented for 'ComplexDouble'"):
        torch.compile(lambda t: t.floor() * 2, backend="tpu", fullgraph=True)(c)
    with pytest.raises(Exception, match="Sort does not support complex dtypes"):  # (the CPU's words)
        torch.compile(lambda t: t.sort().values * 2, backend="tpu", fullgraph=True)(c)


def test_complex_to_bool_is_nonzero_including_the_imaginary_part():
    """`.bool()` of a complex tensor is True where the number is nonzero (2j too); only the real part
    was converted. Other real types keep the real part, as the CPU."""
    x = torch.tensor([2j, 0j, 1 + 0j, 0.5j, -0.0j, 3 - 1j])
    for dtype in (torch.bool, torch.int32, torch.float32):
        torch.testing.assert_close(x.to("tpu").to(dtype).cpu(), x.to(dtype))
    torch.testing.assert_close(
        torch.zeros(6, dtype=torch.bool).to("tpu").masked_fill(x.abs().to("tpu") > 0, 2j).cpu(),
        torch.zeros(6, dtype=torch.bool).masked_fill(x.abs() > 0, 2j),
    )
