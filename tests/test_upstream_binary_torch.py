"""Regressions found by PyTorch's test_binary_ufuncs.py and test_torch.py on "tpu" (issue 47),
compared against the CPU on the same inputs."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from error_parity import same_error
from torch.testing import assert_close

DEV = "tpu"
LONG = torch.long


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int64])
def test_shifts_out_of_range_as_on_the_cpu(dtype):
    # a shift by a negative amount or by the width or more: a signed value keeps its sign, an unsigned
    # one becomes 0 (tpu shifted by the clipped amount)
    info = torch.iinfo(dtype)
    values = torch.tensor([info.min, -1 if info.min else 1, 1, info.max], dtype=dtype)
    amounts = torch.tensor([-1, info.bits, info.bits + 1, info.bits - 1], dtype=torch.int64)
    if not dtype.is_signed:
        amounts = torch.tensor([200, info.bits, info.bits + 1, info.bits - 1])
    amounts = amounts.to(dtype)
    for shift in (torch.bitwise_right_shift, torch.bitwise_left_shift):
        assert_close(shift(values.to(DEV), amounts.to(DEV)).cpu(), shift(values, amounts))
    assert_close((values.to(DEV) >> -1).cpu(), values >> -1)


@pytest.mark.parametrize("op", ["add_", "pow_", "atan2_", "mul_"])
def test_inplace_op_never_resizes_self(op):
    # PyTorch's meta kernels of pow_ and atan2_ resize `self` to the broadcast shape: the CPU raises
    same_error(lambda d: getattr(torch.ones(1, device=d), op)(torch.ones(3, device=d)))
    same_error(lambda d: getattr(torch.ones(2, 1, device=d), op)(torch.ones(1, 3, device=d)))


def test_is_set_to_compares_storage_and_layout():
    def answers(device):
        x, y = torch.zeros(3, device=device), torch.zeros(3, device=device)
        return [x.is_set_to(x[:]), x.is_set_to(y), x.is_set_to(x[1:]), x.is_set_to(x.view(1, 3))]

    assert answers(DEV) == answers("cpu")


def _expanded(d):
    return torch.rand(1).to(d).expand(6)


def _index(d):
    return torch.tensor([2, 1, 0], device=d)


@pytest.mark.parametrize(
    "write",
    [
        lambda d: _expanded(d).index_add_(0, _index(d), torch.ones(3, device=d)),
        lambda d: (lambda y: y.index_add_(0, _index(d), y[:3]))(torch.rand(6).to(d)),
        lambda d: (lambda i: i.index_copy_(0, i, i.clone()))(_index(d)),
        lambda d: (lambda i: i.index_copy_(0, i.clone(), i))(_index(d)),
        lambda d: _expanded(d).put_(_index(d), torch.ones(3, device=d)),
        lambda d: (lambda y: y.put_(_index(d)[0], y[0]))(torch.rand(6).to(d)),
        lambda d: (lambda i: i.put_(i, i))(_index(d)),
        lambda d: _expanded(d).scatter_(0, _index(d), torch.ones(3, device=d)),
        lambda d: (lambda s: s.scatter_(0, _index(d), s))(torch.rand(3).to(d)),
        lambda d: (lambda i: i.scatter_(0, i, 1))(_index(d)),
        lambda d: _expanded(d).masked_scatter_(torch.ones(6, dtype=torch.bool, device=d), torch.ones(6, device=d)),
        lambda d: _expanded(d).uniform_(),
        lambda d: _expanded(d).bernoulli_(0.5),
        lambda d: (lambda y: y[1:].bernoulli_(y[:-1]))(torch.rand(6).to(d)),
        lambda d: (lambda i: i.index_fill_(0, i, 0))(_index(d)),
        lambda d: (lambda y: y.index_put_((_index(d),), y[0]))(torch.rand(6).to(d)),
        lambda d: (lambda m: m[1:].masked_fill_(m[:-1], False))(torch.ones(6, dtype=torch.bool, device=d)),
        lambda d: (lambda y: torch.index_select(y, 0, _index(d)[:2], out=y[1:3]))(torch.rand(6).to(d)),
        lambda d: (lambda y: torch.take(y, _index(d)[:2], out=y[1:3]))(torch.rand(6).to(d)),
    ],
)
def test_indexed_and_random_writes_refuse_overlap_as_on_the_cpu(write):
    # these wrote silently on tpu: the CPU refuses an expanded `self` and an index/source sharing its memory
    same_error(write)


@pytest.mark.parametrize(
    "write",
    [
        lambda d: _expanded(d).index_put_((_index(d),), torch.ones(3, device=d)),
        lambda d: _expanded(d).masked_fill_(torch.ones(6, dtype=torch.bool, device=d), 0.0),
        lambda d: _expanded(d).index_fill_(0, _index(d), 1.0),
    ],
)
def test_indexed_fills_of_expanded_tensors_warn_as_on_the_cpu(write):
    for device in ("cpu", DEV, DEV):  # twice on tpu: a cached executable warns too
        with pytest.warns(UserWarning, match="on expanded tensors is deprecated") as caught:
            write(device)
        assert len([w for w in caught if "expanded tensors" in str(w.message)]) == 1
        assert all(w.filename == __file__ for w in caught if "expanded tensors" in str(w.message))


def test_writes_that_do_not_overlap_still_run():
    def writes(device):
        y = torch.arange(6.0, device=device)
        y.index_add_(0, _index(device), y[3:].clone())
        y.scatter_(0, _index(device), y.flip(0)[:3].clone())
        y[:3].index_copy_(0, _index(device), y[3:])  # another part of the same storage
        return y.masked_fill_(y > 3, 0.0)

    assert_close(writes(DEV).cpu(), writes("cpu"))


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.multinomial(torch.ones(2, device=d), 3),
        lambda d: torch.multinomial(torch.ones(2, device=d), 0),
        lambda d: torch.multinomial(torch.ones(2, 2, 2, device=d), 1),
        lambda d: torch.multinomial(torch.ones(0, device=d), 1),
        lambda d: torch.multinomial(torch.ones(2, dtype=torch.long, device=d), 1),
    ],
)
def test_multinomial_argument_errors_as_on_the_cpu(call):
    same_error(call)


def test_nextafter_steps_half_types_in_their_own_precision():
    for dtype in (torch.bfloat16, torch.float16):
        a = torch.tensor([1.0, 0.0, 0.0, -1.0, float("inf")], dtype=dtype)
        b = torch.tensor([2.0, -1.0, 1.0, -2.0, 0.0], dtype=dtype)
        expected = torch.nextafter(a, b)  # one ulp of the half type (tpu stepped in float32: 1.0 stayed 1.0)
        assert torch.equal(torch.nextafter(a.to(DEV), b.to(DEV)).cpu().view(torch.int16), expected.view(torch.int16))


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.maximum(torch.tensor([1j], device=d), torch.tensor([1j], device=d)),
        lambda d: torch.fmin(torch.tensor([1j], device=d), torch.tensor([1j], device=d)),
        lambda d: torch.heaviside(torch.tensor([1j], device=d), torch.tensor([1.0], device=d)),
        lambda d: torch.heaviside(torch.tensor([1.0], device=d), torch.tensor([1], device=d)),
        lambda d: torch.tensor([1, 0], device=d).heaviside_(torch.tensor([0.5, 0.5], device=d)),
        lambda d: torch.heaviside(torch.tensor([1.0], device=d), torch.tensor(1.0, dtype=torch.float64, device=d)),
        lambda d: torch.heaviside(
            torch.tensor([1.0], device=d), torch.tensor([1.0], device=d), out=torch.empty(1, dtype=torch.long, device=d)
        ),
    ],
)
def test_heaviside_and_maximum_refuse_as_on_the_cpu(call):
    same_error(call)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int64, torch.float16, torch.float32])
@pytest.mark.parametrize("rounding_mode", [None, "trunc", "floor"])
def test_div_with_a_rounding_mode_argument_as_on_the_cpu(dtype, rounding_mode):
    # rounding_mode=None given explicitly (div.Tensor_mode) is true division: integers gave truncated
    # quotients on tpu
    a = torch.tensor([100, 50, 7, 0], dtype=dtype)
    b = torch.tensor([3, 7, 2, 5], dtype=dtype)
    for other_cpu, other_tpu in ((b, b.to(DEV)), (3, 3)):
        expected = torch.divide(a, other_cpu, rounding_mode=rounding_mode)
        actual = torch.divide(a.to(DEV), other_tpu, rounding_mode=rounding_mode)
        assert actual.dtype == expected.dtype
        assert_close(actual.cpu(), expected)


def test_int_true_division_follows_the_default_dtype_after_a_float32_call():
    # the cached promotion answer ignored the default dtype: int64 / int64 under float64 was computed
    # in float32 once the same division had run under float32 (float64 result, float32 digits)
    a, b = torch.tensor([7, 10**18 + 3]), torch.tensor([3, 47])
    torch.divide(a.to(DEV), b.to(DEV))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        expected, actual = torch.divide(a, b), torch.divide(a.to(DEV), b.to(DEV))
    finally:
        torch.set_default_dtype(previous)
    assert actual.dtype == expected.dtype == torch.float64
    assert_close(actual.cpu(), expected, rtol=1e-15, atol=0)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: F.nll_loss(
            torch.randn(10, 3, device=d), torch.zeros(10, dtype=LONG, device=d), weight=torch.ones(4, device=d)
        ),
        lambda d: F.nll_loss(
            torch.randn(10, 3, 2, 2, device=d),
            torch.zeros(10, 2, 2, dtype=LONG, device=d),
            weight=torch.ones(4, device=d),
        ),
        lambda d: F.nll_loss(torch.randn(10, 3, device=d), torch.zeros(10, 2, dtype=LONG, device=d)),
        lambda d: torch.ops.aten.nll_loss_forward(
            torch.randn(2, 2, 2, device=d), torch.zeros(2, dtype=LONG, device=d), None, 1, -100
        ),
        lambda d: torch.ops.aten.nll_loss_forward(
            torch.randn(2, 2, device=d), torch.zeros(3, dtype=LONG, device=d), None, 1, -100
        ),
    ],
)
def test_nll_loss_argument_errors_as_on_the_cpu(call):
    # PyTorch's meta kernel asserts (an AssertionError) or words them otherwise
    same_error(call)


def test_elementwise_overlap_error_comes_before_the_dtype_error():
    # TensorIterator checks memory overlap first: a float `x[:-1] <<= x[1:]` is refused for overlapping
    same_error(lambda d: (lambda x: x[:-1].__ilshift__(x[1:]))(torch.rand(3).to(d)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.int64])
@pytest.mark.parametrize("value", [1 + 1j, 1 + 0j, lambda: torch.tensor(1 + 1j), lambda: torch.tensor([1.0])])
def test_index_fill_refuses_complex_and_non_scalar_values_as_on_the_cpu(dtype, value):
    # tpu filled a bool tensor with 1+1j (True), a tensor value's complex part was dropped, and a
    # complex Scalar got the overflow error instead of the CPU's type error
    def fill(d):
        x = torch.tensor([[1, 2], [4, 5]], dtype=dtype, device=d)
        return x.index_fill_(1, torch.tensor([0], device=d), value() if callable(value) else value)

    same_error(fill)


def test_index_fill_with_a_tensor_value_still_fills():
    x, index = torch.randn(3, 4), torch.tensor([2, 0])
    for value in (torch.tensor(-1.5), -2.5, torch.tensor(3, dtype=torch.int32)):
        expected = x.index_fill(1, index, value)
        assert_close(x.to(DEV).index_fill(1, index.to(DEV), value).cpu(), expected)


_SHORT = "Number of elements of source < number of ones in mask"


def test_masked_scatter_short_source_of_a_device_mask_raises_once_and_the_device_keeps_working():
    # a mask computed on the device is checked there without a sync (as CUDA) and reported at the
    # next sync. It put the device in the sticky error state: every later test of test_torch failed.
    mask = torch.tensor([0, 1, 1, 0, 1], dtype=torch.bool)
    dest = torch.zeros(5, device=DEV)
    dest.masked_scatter_(mask.to(DEV).logical_not().logical_not(), torch.ones(2, device=DEV))
    with pytest.raises(RuntimeError, match=_SHORT):
        dest.cpu()
    x = torch.randn(5)
    source = torch.randn(3)
    assert_close(x.to(DEV).masked_scatter(mask.to(DEV), source.to(DEV)).cpu(), x.masked_scatter(mask, source))
    torch.tpu.synchronize()


@pytest.mark.parametrize("mask_shape", [(4,), (6, 1), (6, 4)])
def test_masked_scatter_short_source_of_a_host_mask_raises_at_the_op_as_on_the_cpu(mask_shape):
    # a mask just copied from the host: its ones are counted there (storage/host_values.py)
    mask = torch.rand(mask_shape) < 0.5
    mask.view(-1)[0] = True
    ones = int(mask.broadcast_to(6, 4).sum())
    dest = torch.randn(6, 4)
    for device in ("cpu", DEV):
        with pytest.raises(RuntimeError, match=_SHORT):
            dest.to(device).masked_scatter_(mask.to(device), torch.ones(ones - 1, device=device))
    source = torch.randn(ones)
    expected = dest.masked_scatter(mask, source)
    assert_close(dest.to(DEV).masked_scatter(mask.to(DEV), source.to(DEV)).cpu(), expected)
    out = torch.empty(6, 4, device=DEV)
    with pytest.raises(RuntimeError, match=_SHORT):
        torch.ops.aten.masked_scatter.out(dest.to(DEV), mask.to(DEV), source[:-1].to(DEV), out=out)
    torch.tpu.synchronize()  # nothing left to report


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.logcumsumexp(
            torch.randn(5, 2, device=d, dtype=torch.float64), 1, out=torch.zeros(5, 2, device=d)
        ),
        lambda d: torch.logcumsumexp(
            torch.randn(5, 2, device=d), 1, out=torch.zeros(5, 2, device=d, dtype=torch.float64)
        ),
        lambda d: torch.cummax(torch.randn(3, device=d), 0, out=(torch.zeros(3, device=d), torch.zeros(3, device=d))),
        lambda d: torch.cummin(
            torch.randn(3, device=d), 0, out=(torch.zeros(3, device=d), torch.zeros(3, dtype=torch.int32, device=d))
        ),
    ],
)
def test_cumulative_out_in_another_dtype_is_refused_as_on_the_cpu(call):
    # tpu cast the result into `out`; the CPU's check_scalar_type_device_layout_equal refuses
    same_error(call)


def test_cumulative_out_in_the_same_dtype_still_writes():
    x = torch.randn(4, 3, dtype=torch.float64)
    out, values, indices = (
        torch.empty(4, 3, dtype=torch.float64),
        torch.empty(4, 3, dtype=torch.float64),
        torch.empty(4, 3, dtype=LONG),
    )
    torch.logcumsumexp(x, 1, out=out)
    torch.cummax(x, 0, out=(values, indices))
    t_out, t_values, t_indices = (t.to(DEV) for t in (out, values, indices))
    torch.logcumsumexp(x.to(DEV), 1, out=t_out)
    torch.cummax(x.to(DEV), 0, out=(t_values, t_indices))
    for actual, expected in ((t_out, out), (t_values, values), (t_indices, indices)):
        assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("op", ["grid_sampler", "grid_sampler_2d", "grid_sampler_3d"])
@pytest.mark.parametrize(
    "shapes",
    [
        ((5, 5, 5, 5), (1, 1, 4, 4), 0),
        ((5, 5, 5, 5, 5), (1, 1, 1, 4, 4), 0),
        ((2, 3, 4, 4), (2, 3, 3, 3), 0),
        ((2, 3, 0, 4), (2, 3, 3, 2), 0),
        ((2, 3, 4, 4, 4), (2, 3, 3, 3, 3), 2),
        ((2, 3, 4, 4, 4), (2, 3, 3, 3), 0),
    ],
)
def test_grid_sampler_argument_errors_as_on_the_cpu(op, shapes):
    # the meta kernel of grid_sampler_2d is a decomposition: an AssertionError or a ValueError from
    # unpacking; the 3-D one printed torch.Size([...]) where the CPU prints [...]
    x_shape, grid_shape, mode = shapes
    same_error(
        lambda d: getattr(torch, op)(torch.randn(x_shape, device=d), torch.randn(grid_shape, device=d), mode, 0, True)
    )


def test_max_unpool_lowered_matches_the_cpu():
    # max_unpool2d/3d ran as PyTorch's decomposition, which (an unchecked index_put) dropped an index out
    # of range silently, and under deterministic mode failed as "not implemented"
    x, x3 = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4, 4)
    (v, i), (v3, i3) = F.max_pool2d(x, 2, return_indices=True), F.max_pool3d(x3, 2, return_indices=True)
    assert_close(F.max_unpool2d(v.to(DEV), i.to(DEV), 2).cpu(), F.max_unpool2d(v, i, 2))
    assert_close(F.max_unpool3d(v3.to(DEV), i3.to(DEV), 2).cpu(), F.max_unpool3d(v3, i3, 2))
    v1, i1 = F.max_pool1d(x[0], 2, return_indices=True)
    assert_close(F.max_unpool1d(v1.to(DEV), i1.to(DEV), 2).cpu(), F.max_unpool1d(v1, i1, 2))
    bad = torch.tensor([[[0, 9]]])
    with pytest.raises(RuntimeError, match="Found an invalid max index"):
        F.max_unpool1d(torch.ones(1, 1, 2), bad, 2)
    with pytest.raises(RuntimeError, match=r"Found an invalid max index.*4x1"):
        F.max_unpool1d(torch.ones(1, 1, 2, device=DEV), bad.to(DEV), 2).cpu()
    assert (torch.ones(2, device=DEV) + 1).sum().item() == 4.0  # the device keeps working


@pytest.mark.parametrize("warn_only", [False, True])
@pytest.mark.parametrize(
    "call",
    [
        lambda d: F.max_unpool1d(torch.ones(1, 1, 7, device=d), torch.zeros(1, 1, 7, dtype=LONG, device=d), 3, 1),
        lambda d: F.max_unpool3d(
            torch.ones(1, 1, 2, 2, 2, device=d), torch.zeros(1, 1, 2, 2, 2, dtype=LONG, device=d), 2
        ),
        lambda d: torch.zeros(5, device=d).put_(torch.tensor([0, 0], device=d), torch.tensor([1.0, 2.0], device=d)),
        lambda d: torch.zeros(5, device=d).put(torch.tensor([0, 0], device=d), torch.ones(2, device=d), True),
        lambda d: torch.histc(torch.tensor([1.0, 2.0], device=d), bins=4, min=0, max=3),
        lambda d: torch.median(torch.arange(10.0, device=d), 0),
    ],
)
def test_nondeterministic_alerts_as_on_the_cpu(call, warn_only):
    # tpu gave CUDA's alerts (histc, median: PyTorch's meta kernels take a meta tensor for CUDA) and none
    # of the CPU's (put_, max_unpool); each call alerts, cached executable or not
    def alerts(device):
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    call(device)
                    error = None
                except RuntimeError as e:
                    error = str(e)
        finally:
            torch.use_deterministic_algorithms(False)
        return error, [str(w.message).split(" (Triggered")[0] for w in caught if "deterministic" in str(w.message)]

    call(DEV)  # a cached executable, built without the alerts
    expected = alerts("cpu")
    assert alerts(DEV) == expected == alerts(DEV)


def _loss_and_grad_as_on_the_cpu(loss):
    """`loss(device)` -> (loss, input grad): the CPU's shape and values on tpu, or the CPU's error."""
    try:
        expected = loss("cpu")
    except RuntimeError:
        same_error(lambda d: [t.cpu() for t in loss(d)])
        return
    out, grad = loss(DEV)
    assert out.shape == expected[0].shape
    assert_close(out.cpu(), expected[0])
    assert_close(grad.cpu(), expected[1])


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize(
    "shapes", [((), ()), ((), (1,)), ((1,), ()), ((1, 1), (1, 1)), ((3, 4), (3, 4)), ((4,), (4,)), ((), (1, 1))]
)
def test_multilabel_margin_loss_shapes_as_on_the_cpu(shapes, reduction):
    # PyTorch's meta kernel (its decomposition) makes input and target 2-D first: a 0-d input gave a (1,)
    # loss without reduction and refused a one-element 1-D target, which the CPU accepts
    x_shape, t_shape = shapes
    x = torch.randn(x_shape, dtype=torch.float64)
    target = torch.randint(-1, x.shape[-1] if x.dim() else 1, t_shape)

    def loss(device):
        v = x.detach().to(device).requires_grad_()  # (a fresh leaf per device)
        out = F.multilabel_margin_loss(v, target.to(device), reduction=reduction)
        out.sum().backward()
        return out, v.grad

    _loss_and_grad_as_on_the_cpu(loss)


@pytest.mark.parametrize("reduction", ["none", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(
    "shapes", [((), ()), ((1,), (1,)), ((1, 1), ()), ((3, 4), (3,)), ((4,), ()), ((3, 4), (1,)), ((4,), (3,))]
)
def test_multi_margin_loss_shapes_as_on_the_cpu(shapes, weighted, reduction):
    # without reduction the CPU's loss is 0-d for a 0-d target (PyTorch's meta kernel: (1,)); its
    # argument errors in its words
    x_shape, t_shape = shapes
    x = torch.randn(x_shape, dtype=torch.float64)
    classes = x.shape[-1] if x.dim() else 1
    target = torch.randint(0, classes, t_shape)
    weight = torch.rand(classes, dtype=torch.float64) if weighted else None

    def loss(device):
        v = x.detach().to(device).requires_grad_()  # (a fresh leaf per device)
        w = None if weight is None else weight.to(device)
        out = F.multi_margin_loss(v, target.to(device), weight=w, reduction=reduction)
        out.sum().backward()
        return out, v.grad

    _loss_and_grad_as_on_the_cpu(loss)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last, torch.preserve_format, None])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_to_dtype_honours_an_explicit_memory_format(memory_format, dtype):
    # x.to(dtype, memory_format=torch.contiguous_format) of a channels_last tensor kept channels_last
    x = torch.randn(4, 3, 5, 6).contiguous(memory_format=torch.channels_last)
    kwargs = {} if memory_format is None else {"memory_format": memory_format}
    expected, actual = x.to(dtype, **kwargs), x.to(DEV).to(dtype, **kwargs)
    assert actual.stride() == expected.stride()
    assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fn", [torch.fmod, torch.remainder])
def test_fmod_remainder_round_a_scalar_to_a_half_type_as_on_the_cpu(fn, dtype):
    # the CPU rounds the Python scalar to the tensor's half type first; tpu divided by 2.3 in float32
    x = (torch.rand(10, 10) * 18 - 9).to(dtype)
    other = (torch.rand(10, 10) * 18 - 9).to(dtype)
    other[other == 0] = 1
    for mod in (2.3, -2.3, 3, other, other.t()):
        expected = fn(x, mod)
        actual = fn(x.to(DEV), mod.to(DEV) if isinstance(mod, torch.Tensor) else mod).cpu()
        assert actual.dtype == expected.dtype
        assert torch.equal(actual, expected)


@pytest.mark.parametrize("fn", [torch.xlogy, torch.special.xlog1py])
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int32])
def test_xlogy_of_zero_and_nan_is_nan_as_on_the_cpu(fn, dtype):
    # a bool/int 0 times log(NaN) gave 0 on tpu; PyTorch: NaN wherever `other` is NaN
    nan = float("nan")
    x = torch.tensor([0, 0, 1, 1, 2, -1]).to(dtype)
    y = torch.tensor([nan, 1.0, nan, 0.0, 3.0, 2.0])
    for a, b in ((x, y), (y, x)):
        assert_close(fn(a.to(DEV), b.to(DEV)).cpu(), fn(a, b), equal_nan=True)


_ELEMENTWISE_OUT = {
    "exp": (lambda x, out: torch.exp(x, out=out), torch.float32),
    "add": (lambda x, out: torch.add(x, x, out=out), torch.float32),
    "eq": (lambda x, out: torch.eq(x, 0.5, out=out), torch.bool),
}


@pytest.mark.parametrize("name", list(_ELEMENTWISE_OUT))
@pytest.mark.parametrize("dims", [(2, 0, 1, 3), (1, 2, 3, 0), (0, 1, 2, 3)])
def test_out_resized_by_an_elementwise_op_takes_its_layout_as_on_the_cpu(name, dims):
    # TensorIterator restrides an out= tensor it resizes like the functional result (size-1 dims
    # included); PyTorch's meta kernels leave it contiguous (test_torch's test_strides_propagation)
    op, dtype = _ELEMENTWISE_OUT[name]
    base = torch.randn(1, 3, 4, 12)
    results = []
    for device in ("cpu", DEV):
        x = base.to(device)[..., ::2].permute(dims)
        results.append(op(x, torch.empty(0, device=device, dtype=dtype)))
    assert results[1].stride() == results[0].stride()
    assert_close(results[1].cpu(), results[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int16])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce_folds_as_the_cpu(dtype, reduce, include_self):
    # the CPU combines the source's slices one at a time in self's dtype: in half types each step
    # rounds (tpu's scatter rounded once: a bfloat16 mean 3% off); include_self travels as a value
    gen = torch.Generator().manual_seed(7)
    for dim in range(3):
        x = (torch.randn(3, 4, 5, generator=gen) * 3).to(dtype)
        shape = [3, 4, 5]
        shape[dim] = 9
        src = (torch.randn(shape, generator=gen) * 3).to(dtype)
        idx = torch.randint(0, x.shape[dim], (9,), generator=gen)
        expected = x.clone().index_reduce_(dim, idx, src, reduce, include_self=include_self)
        got = x.to(DEV).index_reduce_(dim, idx.to(DEV), src.to(DEV), reduce, include_self=include_self)
        assert torch.equal(got.cpu(), expected), (dim, got.cpu() - expected)
        noncontig = src.to(DEV).transpose(0, 2).contiguous().transpose(0, 2)  # another layout
        got = torch.index_reduce(x.to(DEV), dim, idx.to(DEV), noncontig, reduce, include_self=include_self)
        assert torch.equal(got.cpu(), expected)
