"""unique of a small input runs on a host copy on XLA:CPU (eager/data_dependent.py _unique_on_host):
the CPU's answer without a device program per (shape, count); the device form, which a TPU keeps,
still gives the CPU's answer."""

from __future__ import annotations

import pytest
import torch
from jax._src import compiler

from torchtpu.eager import data_dependent

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.uint8, torch.bool]


def _input(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 3, (6, 5), generator=g).to(dtype)
    x[4] = x[1]  # a repeated row: unique along dim 0 merges it
    x[:, 3] = x[:, 0]  # and a repeated column
    if dtype.is_floating_point:
        x[2, 2] = float("nan")
        x[5, 1] = -0.0
    return x


def _calls(dim):
    both = dict(return_inverse=True, return_counts=True)
    return [
        lambda a: torch.unique(a, dim=dim),
        lambda a: torch.unique(a, dim=dim, **both),
        lambda a: torch.unique(a, sorted=True, return_counts=True, dim=dim),
        lambda a: torch.unique_consecutive(a, dim=dim),
        lambda a: torch.unique_consecutive(a, dim=dim, **both),
    ]


def _check(dtype, dim, seed):
    x = _input(dtype, seed)
    xt = x.to("tpu")
    for i, f in enumerate(_calls(dim)):
        want, got = f(x), f(xt.t().contiguous().t() if i == 1 else xt)  # (a strided input too)
        want, got = (want,) if torch.is_tensor(want) else want, (got,) if torch.is_tensor(got) else got
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.device.type == "tpu"
            torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [None, 0, 1])
def test_unique_of_a_small_input_matches_the_cpu(dtype, dim):
    assert data_dependent._unique_on_host(_input(dtype, 0).to("tpu"))
    _check(dtype, dim, seed=1)


@pytest.mark.parametrize("dtype, dim", [(torch.float32, None), (torch.int64, 0), (torch.bfloat16, 1)])
def test_the_device_form_matches_the_cpu(monkeypatch, dtype, dim):
    monkeypatch.setattr(data_dependent, "_unique_on_host", lambda t: False)  # (a TPU's path)
    _check(dtype, dim, seed=2)


def test_unique_of_a_small_input_compiles_no_program_per_count(monkeypatch):
    compiles = []
    real = compiler.backend_compile_and_load

    def counted(*args, **kwargs):
        compiles.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "backend_compile_and_load", counted)
    xs = [torch.arange(n).remainder(k).to("tpu") for n, k in [(40, 3), (41, 5), (43, 7)]]
    compiles.clear()
    # a new count and shape each: the device form compiled two programs per call
    results = [torch.unique(x, return_inverse=True, return_counts=True) for x in xs]
    assert compiles == []
    for x, (v, inv, cnt) in zip(xs, results):
        for got, want in zip((v, inv, cnt), torch.unique(x.cpu(), return_inverse=True, return_counts=True)):
            assert got.device.type == "tpu"
            torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_unique_of_a_large_input_stays_on_the_device(monkeypatch):
    x = torch.randint(0, 50, (data_dependent.HOST_NONZERO_ELEMENTS + 1,))
    assert not data_dependent._unique_on_host(x.to("tpu"))
    monkeypatch.setattr(data_dependent, "_host_unique", None)  # (called, it would raise)
    got = torch.unique(x.to("tpu"), return_counts=True)
    for g, w in zip(got, torch.unique(x, return_counts=True)):
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)


def test_unique_errors_are_the_cpus():
    with pytest.raises(NotImplementedError, match="not implemented for 'ComplexFloat'"):
        torch.unique(torch.ones(3, dtype=torch.complex64, device="tpu"))
    with pytest.raises(IndexError):
        torch.unique(torch.tensor(1.0, device="tpu"), dim=0)
