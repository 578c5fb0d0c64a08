"""Regressions found by PyTorch's test_reductions.py and test_type_promotion.py on "tpu" (issue 47),
compared against the CPU on the same inputs."""

import warnings

import pytest
import torch
from error_parity import same_error
from torch.testing import assert_close

DEV = "tpu"


@pytest.mark.parametrize("op", [torch.all, torch.any])
@pytest.mark.parametrize("dims", [(), (0,), ((0, 1),)])
def test_all_any_out_must_be_bool_or_uint8(op, dims):
    same_error(lambda d: op(torch.ones(2, 3, device=d), *dims, out=torch.empty(3, device=d)))
    # a uint8 out is accepted for any input, as on the CPU
    x = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 5.0]])
    cpu_out, tpu_out = torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8, device=DEV)
    op(x, *dims, out=cpu_out)
    op(x.to(DEV), *dims, out=tpu_out)
    assert_close(tpu_out.cpu(), cpu_out)


def _aminmax_calls(device):
    x = torch.tensor([[3.0, -1.0, 2.0], [0.5, 7.0, -4.0]], device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.set_warn_always(True)
        try:
            results = [torch._aminmax(x), torch._aminmax(x, 1, True), torch._aminmax(x, 0)]
        finally:
            torch.set_warn_always(False)
    messages = [str(w.message).split(" (Triggered")[0] for w in caught]
    return [t.cpu() for r in results for t in r], messages


def test_deprecated_aminmax_values_and_warning():
    cpu_values, cpu_messages = _aminmax_calls("cpu")
    tpu_values, tpu_messages = _aminmax_calls(DEV)
    for tpu, cpu in zip(tpu_values, cpu_values):
        assert_close(tpu, cpu)
    assert len(cpu_messages) == 3 and tpu_messages == cpu_messages


@pytest.mark.parametrize(
    "values", [torch.tensor([1.0, 0.3]), torch.tensor([True, False]), torch.tensor([[1.0, 2.0]])], ids=str
)
def test_bincount_refuses_a_dtype_first(values):
    # the CPU's kernel names itself ("bincount_cpu"): the message's device word differs, as on CUDA
    with pytest.raises(NotImplementedError) as cpu_error:
        torch.bincount(values)
    with pytest.raises(NotImplementedError) as tpu_error:
        torch.bincount(values.to(DEV))
    assert str(tpu_error.value) == str(cpu_error.value).replace("bincount_cpu", "bincount_tpu")


def test_bincount_of_a_matrix_of_integers():
    same_error(lambda d: torch.bincount(torch.tensor([[1, 2], [3, 4]], device=d)))


def _searchsorted_warnings(device):
    boundaries = torch.tensor([1.0, 9.0, 2.0, 9.0, 3.0, 9.0, 4.0], device=device)[::2]
    values = torch.tensor([[1.5, 2.5], [3.5, 0.5]], device=device).t()
    sorter = torch.tensor([0, 9, 1, 9, 2, 9, 3], device=device)[::2]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.set_warn_always(True)
        try:
            results = [
                torch.bucketize(values, boundaries),
                torch.searchsorted(boundaries, values, sorter=sorter),
                torch.searchsorted(boundaries.contiguous(), values.contiguous()),
                torch.searchsorted(boundaries.contiguous(), values.contiguous()),
            ]
        finally:
            torch.set_warn_always(False)
    messages = [str(w.message).split(" (Triggered")[0][:60] for w in caught]
    return [r.cpu() for r in results], messages, [w.filename for w in caught]


def test_searchsorted_warns_of_non_contiguous_operands():
    cpu_results, cpu_messages, _ = _searchsorted_warnings("cpu")
    tpu_results, tpu_messages, files = _searchsorted_warnings(DEV)
    for tpu, cpu in zip(tpu_results, cpu_results):
        assert_close(tpu, cpu)
    assert len(cpu_messages) == 5 and tpu_messages == cpu_messages
    assert set(files) == {__file__}  # attributed to the caller's line, as PyTorch's C++ warnings are


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64, torch.int16, torch.uint8, torch.bool])
@pytest.mark.parametrize("op", [torch.median, torch.nanmedian])
def test_median_of_no_elements(op, dtype):
    assert_close(op(torch.tensor([], dtype=dtype, device=DEV)).cpu(), op(torch.tensor([], dtype=dtype)), equal_nan=True)


def test_histc_of_no_elements():
    for lo, hi in ((0, 0), (1, 3)):
        assert_close(
            torch.histc(torch.tensor([], device=DEV), 4, lo, hi).cpu(), torch.histc(torch.tensor([]), 4, lo, hi)
        )


@pytest.mark.parametrize(
    "values_dtype, indices_dtype", [(torch.int8, torch.int64), (torch.uint8, torch.int8), (torch.float64, torch.int64)]
)
def test_mode_out_dtypes(values_dtype, indices_dtype):
    def call(device):
        x = torch.ones(10, dtype=torch.uint8 if values_dtype != torch.float64 else torch.float32, device=device)
        out = (torch.ones(10, dtype=values_dtype, device=device), torch.ones(10, dtype=indices_dtype, device=device))
        torch.mode(x, -1, True, out=out)

    same_error(call)


@pytest.mark.parametrize("op", [torch.sum, torch.mean, torch.var, torch.logsumexp, torch.amax])
@pytest.mark.parametrize("dim", [(0, 0), (1, -2)])
def test_repeated_reduction_dim(op, dim):
    same_error(lambda d: op(torch.ones(3, 3, 3, device=d), dim=dim))


_EMPTY_REDUCTIONS = {
    "argmax": lambda x: torch.argmax(x),
    "argmin_dim": lambda x: torch.argmin(x, 1, True),
    "max": lambda x: torch.max(x),
    "max_dim": lambda x: torch.max(x, 1),
    "amax_all": lambda x: torch.amax(x, ()),
    "amin_dims": lambda x: torch.amin(x, (2, 1)),
    "aminmax": lambda x: torch.aminmax(x),
    "aminmax_dim": lambda x: torch.aminmax(x, dim=1),
    "nanmedian_dim": lambda x: torch.nanmedian(x, 1),
    "kthvalue": lambda x: torch.kthvalue(x, 1, 1),
    "mode": lambda x: torch.mode(x, -2),
}


@pytest.mark.parametrize("call", _EMPTY_REDUCTIONS.values(), ids=_EMPTY_REDUCTIONS.keys())
def test_reductions_without_identity_over_nothing(call):
    same_error(lambda d: call(torch.ones(2, 0, 4, device=d)))


def test_reductions_without_identity_over_a_nonempty_dim_of_an_empty_tensor():
    x = torch.ones(2, 0, 4)
    for call in (lambda t: torch.max(t, 2).values, lambda t: torch.argmax(t, -1, True), lambda t: torch.amin(t, 0)):
        assert call(x.to(DEV)).shape == call(x).shape


def _searchsorted_argument_errors():
    values_1d = lambda d: torch.tensor([1, 2, 3, 4], device=d)
    matrix = lambda d: torch.tensor([[1, 2, 3], [4, 5, 6]], device=d)
    return {
        "side": lambda d: torch.searchsorted(values_1d(d), values_1d(d), side="bad"),
        "side_and_right": lambda d: torch.searchsorted(values_1d(d), values_1d(d), right=True, side="left"),
        "sorter_size": lambda d: torch.searchsorted(values_1d(d), values_1d(d), sorter=values_1d(d)[:-1]),
        "sorter_dtype": lambda d: torch.searchsorted(values_1d(d), values_1d(d), sorter=values_1d(d).float()),
        "scalar_value": lambda d: torch.searchsorted(matrix(d), 1),
        "out_dtype": lambda d: torch.searchsorted(values_1d(d), values_1d(d), out=values_1d(d).int()),
        "out_int32": lambda d: torch.searchsorted(values_1d(d), 2, out=values_1d(d)[:1], out_int32=True),
        "bucketize_2d": lambda d: torch.bucketize(values_1d(d), matrix(d)),
        "bucketize_scalar_2d": lambda d: torch.bucketize(1, matrix(d)),
    }


@pytest.mark.parametrize("call", _searchsorted_argument_errors().values(), ids=_searchsorted_argument_errors().keys())
def test_searchsorted_argument_errors(call):
    same_error(call)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("shape, dim", [((), 0), ((), -1), ((3, 4), 1), ((2, 3, 0), 1)])
def test_hash_tensor_along_a_dim(shape, dim, keepdim):
    x = torch.arange(24, dtype=torch.float32)[: torch.Size(shape).numel()].reshape(shape)
    assert_close(
        torch.hash_tensor(x.to(DEV), dim=dim, keepdim=keepdim).cpu(), torch.hash_tensor(x, dim=dim, keepdim=keepdim)
    )


@pytest.mark.parametrize("op", [torch.sum, torch.nansum])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dim", [None, 1])
def test_sum_into_a_narrower_dtype_rounds_each_element_first(op, dtype, dim):
    # (test_nansum_out_dtype) the CPU casts every element to `dtype` before it accumulates in float32:
    # summing the float32 values themselves differed in the last bit of the half result
    x = torch.randn(7, 9, 8, generator=torch.Generator().manual_seed(0)) * 100
    x[0, 0, 0] = float("nan") if op is torch.nansum else x[0, 0, 0]
    args = () if dim is None else (dim,)
    expected = op(x, *args, dtype=dtype)
    actual = op(x.to(DEV), *args, dtype=dtype)
    assert actual.dtype == expected.dtype
    assert torch.equal(actual.cpu(), expected)


def _same_refusal(fn, cpu_kernel, tpu_kernel):
    """fn(device) raises the same exception type on both devices, the kernel's name aside (the CPU's
    names its CPU kernel)."""
    with pytest.raises(Exception) as cpu_error:
        fn("cpu")
    with pytest.raises(type(cpu_error.value)) as tpu_error:
        fn(DEV)
    assert str(tpu_error.value) == str(cpu_error.value).replace(cpu_kernel, tpu_kernel)


_BOOLS = torch.tensor([[True, False, True], [False, False, True]])


@pytest.mark.parametrize("op", [torch.argmax, torch.argmin])
@pytest.mark.parametrize("x, dims", [(_BOOLS, (1,)), (_BOOLS, ()), (torch.tensor(True), ()), (_BOOLS[:, :0], (1,))])
def test_argmax_argmin_refuse_bool_and_complex_inputs(op, x, dims):
    # bool was computed before (found by torch.masked.argmax/argmin, which pass the input's dtype through)
    same_error(lambda d: op(x.to(d), *dims))
    same_error(lambda d: op(x.to(d, torch.complex64), *dims))  # (the CPU's words, not a dispatch error)


@pytest.mark.parametrize("op, kernel", [(torch.cumsum, "cumsum"), (torch.cumprod, "cumprod")])
def test_scans_refuse_a_bool_result(op, kernel):
    x = torch.tensor([[1, 0, 2], [3, 1, 0]])
    calls = [
        lambda d: op(x.to(d).bool(), 1, dtype=torch.bool),
        lambda d: op(x.to(d), 1, dtype=torch.bool),
        lambda d: op(x.to(d, torch.float), 0, out=torch.empty(0, dtype=torch.bool, device=d)),
        lambda d: getattr(x.to(d).bool(), kernel + "_")(1),
    ]
    for call in calls:
        _same_refusal(call, f"{kernel}_out_cpu", f"{kernel}_tpu")
    # a bool input scans into int64 (or a given out), and nothing to scan is no kernel call
    for call in (
        lambda d: op(x.to(d).bool(), 1),
        lambda d: op(x.to(d).bool(), 1, out=torch.empty(0, dtype=torch.int32, device=d)),
        lambda d: op(torch.ones(0, 3, dtype=torch.bool, device=d), 1, dtype=torch.bool),
        lambda d: op(torch.tensor(True, device=d), 0, dtype=torch.bool),
    ):
        assert_close(call(DEV).cpu(), call("cpu"))


@pytest.mark.parametrize("x", [torch.tensor([[1, 2], [3, 4]]), torch.tensor(3), torch.ones(0, dtype=torch.int32)])
def test_logcumsumexp_refuses_integers(x):
    _same_refusal(lambda d: torch.logcumsumexp(x.to(d), 0), "logcumsumexp_out_cpu", "logcumsumexp_tpu")
    _same_refusal(lambda d: torch.logcumsumexp(x.to(d).bool(), 0), "logcumsumexp_out_cpu", "logcumsumexp_tpu")


@pytest.mark.parametrize("op", [torch.softmax, torch.log_softmax, torch.masked.softmax, torch.masked.log_softmax])
@pytest.mark.parametrize("x, dim", [(torch.tensor([[1, 2, 0], [3, 1, 1]]), 1), (torch.tensor([[1, 2]]), 0)])
def test_softmax_refuses_integer_inputs(op, x, dim):
    # the CPU's kernel names differ by dim (softmax_lastdim_kernel_impl, softmax_kernel_impl): types compared
    with pytest.raises(NotImplementedError):
        op(x, dim)
    with pytest.raises(NotImplementedError, match="softmax_tpu\" not implemented for 'Long'"):
        op(x.to(DEV), dim)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float16])
def test_softmax_of_no_elements_returns_them(dtype):
    x = torch.zeros(2, 0, dtype=dtype)
    assert_close(torch.softmax(x.to(DEV), 1).cpu(), torch.softmax(x, 1))


@pytest.mark.parametrize("op", [torch.var, torch.std, torch.var_mean, torch.std_mean])
@pytest.mark.parametrize("x", [torch.tensor([[1, 2], [3, 5]]), torch.ones(0, dtype=torch.int32), torch.tensor(True)])
def test_moments_refuse_integer_and_bool_inputs(op, x):
    same_error(lambda d: op(x.to(d)))


def _median_kthvalue_calls():
    b = torch.tensor([[True, False, True], [False, False, True]])
    return {
        "median": (lambda d: torch.median(b.to(d)), "median_cpu"),
        "nanmedian": (lambda d: torch.nanmedian(b.to(d)), "median_cpu"),
        "median.dim": (lambda d: torch.median(b.to(d), 0), "median_out"),
        "median.dim 0-dim": (lambda d: torch.median(b[0, 0].to(d), 0), "median_out"),
        "nanmedian.dim": (lambda d: torch.nanmedian(b.to(d), 1), "median_out"),
        "kthvalue": (lambda d: torch.kthvalue(b.to(d), 1), "kthvalue_cpu"),
        "kthvalue of no rows": (lambda d: torch.kthvalue(b[:0].to(d), 1), "kthvalue_cpu"),
        # the empty-dim check comes first, with the default dim too
        "kthvalue of an empty dim": (lambda d: torch.kthvalue(b[:, :0].to(d), 1), None),
        "mode of an empty dim": (lambda d: torch.mode(b[:, :0].to(d)), None),
    }


@pytest.mark.parametrize("call, kernel", _median_kthvalue_calls().values(), ids=_median_kthvalue_calls().keys())
def test_median_kthvalue_refuse_bool_inputs(call, kernel):
    if kernel is None:
        same_error(call)
    else:
        _same_refusal(call, kernel, kernel.split("_")[0] + "_tpu")


def test_median_kthvalue_of_bools_without_a_kernel_call():
    # what the CPU returns before choosing a kernel: the whole median of nothing, a 0-dim kthvalue
    empty, one = torch.ones(0, dtype=torch.bool), torch.tensor(True)
    assert_close(torch.median(empty.to(DEV)).cpu(), torch.median(empty))
    for tpu, cpu in zip(torch.kthvalue(one.to(DEV), 1), torch.kthvalue(one, 1)):
        assert_close(tpu.cpu(), cpu)


def test_histc_refuses_a_range_that_is_not_finite():
    # given bounds: at the op, in the CPU's words; a range taken from the data: the CPU reads it back,
    # tpu checks it on the device and raises at the next sync (as CUDA's asserts); the device keeps working
    for bounds in ((0.0, float("inf")), (float("nan"), 1.0)):
        same_error(lambda d: torch.histc(torch.tensor([1.0, 2.0], device=d), 4, *bounds))
    x = torch.tensor([1.0, float("nan"), 3.0])
    with pytest.raises(RuntimeError, match="range of .* is not finite"):
        torch.histc(x, 4)
    with pytest.raises(RuntimeError, match="torch.histc: range is not finite"):
        torch.histc(x.to(DEV), 4).cpu()
    y = torch.tensor([1.0, 2.0, 2.5])
    assert_close(torch.histc(y.to(DEV), 4).cpu(), torch.histc(y, 4))
