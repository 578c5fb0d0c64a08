"""Regressions found by PyTorch's test_indexing.py, test_shape_ops.py and test_sort_and_select.py on "tpu"
(issue 47): indexing, nonzero and unique, compared against the CPU on the same inputs."""

import warnings

import pytest
import torch
from error_parity import same_error
from torch.testing import assert_close

import torchtpu

DEV = "tpu"


def _byte_mask_warnings(device):
    v = torch.tensor([True, False, True], device=device)
    mask = torch.tensor([1, 0, 1], dtype=torch.uint8, device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        first = v[mask]
        second = v[mask]
    return first, second, [(w.category, str(w.message).split(" (Triggered")[0], w.lineno) for w in caught]


def test_byte_masks_warn_once_per_line_as_on_the_cpu():
    cpu_first, cpu_second, cpu_warnings = _byte_mask_warnings("cpu")
    tpu_first, tpu_second, tpu_warnings = _byte_mask_warnings(DEV)
    assert_close(tpu_first.cpu(), cpu_first)
    assert_close(tpu_second.cpu(), cpu_second)
    # one UserWarning per indexing line, attributed to the caller's line (not to torchtpu)
    assert len(cpu_warnings) == 2 and [w[:2] for w in tpu_warnings] == [w[:2] for w in cpu_warnings]
    assert [w[2] for w in tpu_warnings] == [w[2] for w in cpu_warnings]


@pytest.mark.parametrize(
    "call",
    [
        lambda x, d: x[:, [0, 1]],
        lambda x, d: x[:, torch.tensor([0, 1], device=d)],
    ],
)
def test_index_into_an_empty_dimension_raises_the_cpus_index_error(call):
    same_error(lambda d: call(torch.empty(10, 0, device=d), d))


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.zeros(5, 5, device=d)[[0, 1], [0, 1, 2]],
        lambda d: torch.zeros(5, 5, device=d).__setitem__(([0, 1], [0, 1, 2]), 0),
        lambda d: torch.ones(2, 3, 4, device=d)[False, [0, 1], ...],
    ],
)
def test_indices_that_do_not_broadcast_raise_the_cpus_index_error(call):
    same_error(call)


@pytest.mark.parametrize(
    "target, index, values",
    [
        ((4,), lambda d: torch.arange(4, device=d) > -1, (0,)),
        ((4,), lambda d: torch.arange(4, device=d) > -1, (3,)),
        ((4,), lambda d: torch.tensor([0, 1, 2, 3], device=d), (1, 4)),
        ((3, 4, 5), lambda d: torch.tensor([[True, False, True, True]] * 3, device=d), (2,)),
        ((3, 4, 5), lambda d: torch.tensor([0, 1], device=d), (3, 4, 5)),
    ],
)
def test_index_put_values_that_do_not_fit_raise_the_cpus_error(target, index, values):
    def run(device):
        x = torch.zeros(target, device=device)
        x.index_put_((index(device),), torch.ones(values, device=device))

    same_error(run)


def test_index_put_values_that_broadcast_still_compute():
    def run(device):
        x = torch.zeros(3, 4, 5, device=device)
        x[torch.tensor([0, 2], device=device), :, torch.tensor([1, 4], device=device)] = torch.ones(4, device=device)
        x[:, torch.tensor([0, 2], device=device), torch.tensor([1, 4], device=device)] = torch.ones(3, 1, device=device)
        x[torch.tensor([True, False, True], device=device)] = torch.arange(5.0, device=device)
        x.index_put_((torch.tensor([1], device=device),), torch.ones((), device=device), accumulate=True)
        return x

    expected = run("cpu")
    assert_close(run(DEV).cpu(), expected)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.nonzero(torch.tensor([1.0, 0, 2], device=d), out=torch.empty(0, device=d)),
        lambda d: torch.masked_select(
            torch.tensor([1.0, 0, 2], device=d),
            torch.tensor([True, False, True], device=d),
            out=torch.empty(0, dtype=torch.long, device=d),
        ),
    ],
)
def test_data_dependent_out_of_another_dtype_raises_the_cpus_error(call):
    same_error(call)


def test_nonzero_out_on_another_device_says_so():
    with pytest.raises(RuntimeError, match="on the same device"):
        torch.nonzero(torch.tensor([1.0, 0, 2], device=DEV), out=torch.empty(0, dtype=torch.long))
    out = torch.empty(4, 4, dtype=torch.long, device=DEV)[:, ::2]
    x = torch.tensor([[1, 0], [0, 3], [5, 0], [0, 0]])
    torch.nonzero(x.to(DEV), out=out)
    assert_close(out.cpu(), torch.nonzero(x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int32])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_mean_divides_the_rounded_sum_as_the_cpu(dtype, reduce, include_self):
    # duplicate indices: the CPU sums a half tensor in float32, stores the sum as a half, then divides it
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(12, 9, generator=g) * 18 - 9).to(dtype)
    src = (torch.rand(12, 9, generator=g) * 18 - 9).to(dtype)
    index = torch.randint(0, 9, (12, 6), generator=g)

    def run(device):
        updates = src[:, :6].to(device)
        return x.to(device).scatter_reduce(1, index.to(device), updates, reduce, include_self=include_self)

    expected = run("cpu")
    assert_close(run(DEV).cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "values",
    [
        [[float("nan")], [0.0], [0.0], [float("nan")], [float("nan")], [1.0]],
        [[3.0], [float("nan")], [1.0], [float("nan")], [0.0], [2.0], [1.0]],
        [[3.0, float("nan")], [1, 2], [float("nan"), 1], [1, 2], [3, float("nan")], [0, 5]],
        [[2.0, 1.0], [0.0, 1.0], [2.0, 0.0], [0.0, 1.0]],
    ],
)
@pytest.mark.parametrize("dim", [0, 1])
def test_unique_dim_orders_nan_slices_as_the_cpu(values, dim):
    # NaN is unordered: the CPU's order of slices holding one is its insertion sort's (up to 16 slices)
    x = torch.tensor(values)

    def run(device):
        return torch.unique(x.to(device), dim=dim, return_inverse=True, return_counts=True)

    expected = run("cpu")
    for got, want in zip(run(DEV), expected):
        assert_close(got.cpu(), want, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("shape, dim", [((5, 0, 0), 1), ((5, 0, 5), 2), ((0, 0), 0), ((5, 0, 5), 0)])
def test_unique_dim_of_empty_tensors_raises_the_cpus_error(shape, dim):
    same_error(lambda device: torch.unique(torch.empty(shape, device=device), dim=dim, return_inverse=True))


@pytest.mark.parametrize(
    "assign",
    [
        lambda x, d: x.__setitem__(torch.tensor([True, False, True]), 5),
        lambda x, d: x.__setitem__(torch.tensor([True, False, True], device=d), torch.tensor(7.0, device=d)),
        lambda x, d: x.__setitem__(torch.rand(3, 4, generator=torch.Generator().manual_seed(0)) > 0.5, float("nan")),
        lambda x, d: x.__setitem__(torch.tensor([True, False, True]), torch.tensor([[[1.0]]], device=d)),
        lambda x, d: x.index_put_((torch.tensor([True, False, True]),), torch.tensor(2.0, device=d), accumulate=True),
        lambda x, d: x.__setitem__(torch.tensor([True, False, True]), torch.arange(4.0, device=d)),
    ],
)
def test_mask_assignments_of_one_value(assign):
    # `x[mask] = v` with one value is a masked fill: no count of the mask's elements is needed
    def run(device):
        x = torch.arange(12.0, device=device).reshape(3, 4)
        assign(x, device)
        return x

    expected = run("cpu")
    assert_close(run(DEV).cpu(), expected, equal_nan=True)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.zeros(3, 4, device=d).__setitem__(torch.tensor([1, 0, 1], dtype=torch.uint8), 2.0),
        lambda d: torch.zeros(3, device=d).masked_fill(torch.tensor([1, 0, 1], device=d), 1.0),
        lambda d: torch.zeros(3, device=d).masked_fill_(torch.ones(3, dtype=torch.bfloat16, device=d), 1.0),
    ],
)
def test_masks_that_are_not_bool_raise_the_cpus_error(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the byte mask's deprecation warning)
        same_error(call)


# ------------------------------------------------------------------ compiles per shape (cold start)
def _isclose_operands(dtype):
    if dtype.is_floating_point or dtype.is_complex:
        a = torch.randn(40, dtype=dtype)
        b = a + (torch.randn(40, dtype=dtype) * 1e-3).to(dtype)
        a[:3] = torch.tensor([float("nan"), float("inf"), float("inf")], dtype=dtype)
        b[:3] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
        return a, b
    if dtype == torch.bool:
        return torch.randint(0, 2, (40,)).bool(), torch.randint(0, 2, (40,)).bool()
    info = torch.iinfo(dtype)
    a = torch.randint(info.min, info.max, (40,), dtype=dtype)
    b = a.clone()
    b[::3] = torch.randint(info.min, info.max, (14,), dtype=dtype)
    a[0], b[0], b[1] = info.min, 0, a[1] + 1  # (|min - 0| wraps in the integer type: not close)
    return a, b


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.complex64,
        torch.int64,
        torch.int8,
        torch.uint8,
        torch.bool,
    ],
)
def test_isclose_is_one_executable_with_the_cpus_result(dtype):
    """isclose (ATen: a composite of ~12 ops, each compiled per shape) runs whole on tpu, with the
    decomposition's roundings: the CPU's answer for every tolerance, NaN and integer-overflow case."""
    a, b = _isclose_operands(dtype)
    for kwargs in (
        {},
        {"rtol": 0, "atol": 0},
        {"rtol": 1e-2, "atol": 1e-3},
        {"rtol": 0, "atol": 1},
        {"equal_nan": True},
    ):
        before = torchtpu.metrics()["eager_compiles"]
        got = torch.isclose(a.to(DEV), b.to(DEV), **kwargs)
        assert torchtpu.metrics()["eager_compiles"] - before <= 1
        assert_close(got.cpu(), torch.isclose(a, b, **kwargs), rtol=0, atol=0)
    assert torch.allclose(a.to(DEV), a.to(DEV), equal_nan=True) == torch.allclose(a, a, equal_nan=True)


def test_isclose_errors_as_on_the_cpu():
    same_error(lambda d: torch.isclose(torch.ones(3, device=d), torch.ones(3, dtype=torch.float64, device=d)))
    same_error(lambda d: torch.isclose(torch.ones(3, device=d), torch.ones(3, device=d), rtol=-1.0))
    same_error(lambda d: torch.isclose(torch.ones(3, device=d), torch.ones(3, device=d), atol=-1.0))


def test_random_fill_of_a_new_tensor_after_a_checked_op_is_not_gated(monkeypatch):
    """`rand_like`/`randn` after an indexing op (its bounds verdict unchecked): the fill writes a storage
    never written, so it takes the bucketed draw rather than compiling a gated program per shape; a
    write into an existing tensor is still gated."""
    from torchtpu.eager import engine

    built = []
    real = engine._gated
    monkeypatch.setattr(engine, "_gated", lambda entry, *a: built.append(entry) or real(entry, *a))
    x = torch.arange(30.0, device=DEV).reshape(5, 6)
    for n in (13, 14, 15):
        picked = x[[0, 2, 4]]  # leaves a verdict unchecked
        fresh = torch.rand(n, 3, device=DEV)
        assert fresh.shape == (n, 3) and bool(((fresh >= 0) & (fresh < 1)).all())
        assert_close(picked.cpu(), torch.arange(30.0).reshape(5, 6)[[0, 2, 4]])
    assert built == []
    y = torch.zeros(7, 3, device=DEV)
    y.cpu()
    x[[1]].sum()  # unchecked again, then a write into the existing y
    y.uniform_()
    torch.tpu.synchronize()
    assert len(built) >= 1 and bool(((y >= 0) & (y < 1)).all())


def test_isclose_under_dynamo_functorch_and_dispatch_modes():
    """The whole-op kernel sits on the Autograd key: fake tensors (torch.compile), functorch's wrappers
    and a TorchDispatchMode get PyTorch's decomposition, as they did."""
    from torch.utils._python_dispatch import TorchDispatchMode

    a = torch.randn(4, 5)
    b = a + torch.randn(4, 5) * 1e-3
    want = torch.isclose(a, b, rtol=1e-3)
    x, y = a.to(DEV), b.to(DEV)
    compiled = torch.compile(lambda p, q: torch.isclose(p, q, rtol=1e-3), backend="tpu")
    assert_close(compiled(x, y).cpu(), want, rtol=0, atol=0)
    assert_close(torch.vmap(lambda p, q: torch.isclose(p, q, rtol=1e-3))(x, y).cpu(), want, rtol=0, atol=0)
    grad = torch.func.grad(lambda p: (p * torch.isclose(p, y, rtol=1e-3)).sum())(x)
    assert_close(grad.cpu(), want.float(), rtol=0, atol=0)
    seen = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Seen():
        assert_close(torch.isclose(x, y, rtol=1e-3).cpu(), want, rtol=0, atol=0)
    assert torch.ops.aten.eq.Tensor in seen


# The index_* family takes a CPU index on a tpu tensor (moved to the device, as CUDA's advanced
# indexing moves one: test_sort_and_select's index_fill with a CPU `randint`), of 3 and of 0 entries.
_CPU_INDEX_CALLS = {
    "index_fill": lambda x, i, s: x.index_fill(1, i, -1.5),
    "index_fill_": lambda x, i, s: x.clone().index_fill_(1, i, torch.tensor(2.0)),
    "index_select": lambda x, i, s: x.index_select(1, i),
    "index_add_": lambda x, i, s: x.clone().index_add_(1, i, s, alpha=2),
    "index_copy": lambda x, i, s: x.index_copy(1, i, s),
    "index_reduce": lambda x, i, s: x.index_reduce(1, i, s, "amax", include_self=False),
}


@pytest.mark.parametrize("name", sorted(_CPU_INDEX_CALLS))
@pytest.mark.parametrize("index", [[3, 0, 3], []])
def test_index_ops_take_a_cpu_index(name, index):
    call = _CPU_INDEX_CALLS[name]
    i = torch.tensor(index, dtype=torch.long)
    x = torch.randn(3, 5)
    s = torch.randn(3, i.numel())
    expected = call(x, i, s)
    got = call(x.to(DEV), i, s.to(DEV))
    assert got.device.type == DEV
    assert_close(got.cpu(), expected, rtol=0, atol=0)


def test_index_select_gradient_with_a_cpu_index():
    i = torch.tensor([1, 1, 3])
    x = torch.randn(4, 3)
    a, b = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    (a.index_select(0, i) ** 2).sum().backward()
    (b.index_select(0, i) ** 2).sum().backward()
    assert_close(b.grad.cpu(), a.grad)


@pytest.mark.parametrize(
    "call",
    [
        lambda x, i, s: x.index_add(0, i, s),  # a CPU source
        lambda x, i, s: x.index_copy_(0, i, s),
        lambda x, i, s: x.index_reduce(0, i, s, "prod"),
        lambda x, i, s: torch.index_select(x.cpu(), 0, i, out=torch.empty(2, 3, device=DEV)),  # a CPU self
        lambda x, i, s: x.cpu().index_select(0, i.to(DEV)),
    ],
)
def test_index_ops_refuse_other_cpu_operands(call):
    x, i, s = torch.randn(4, 3, device=DEV), torch.tensor([0, 2]), torch.randn(2, 3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least two"):
        call(x, i, s)
