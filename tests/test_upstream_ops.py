"""Regressions found by PyTorch's test_ops.py (TestCommon, TestMathBits, TestFakeTensor) on "tpu" (issue
47), compared against the CPU on the same inputs."""

import pytest
import torch
from torch.testing import assert_close

DEV = "tpu"


def _on_both(fn):
    expected = fn("cpu")
    assert_close(fn(DEV).cpu(), expected)


@pytest.mark.parametrize(
    "op",
    [
        lambda x, i, s: x.scatter(0, i, s),
        lambda x, i, s: x.scatter(0, i, 2.0),
        lambda x, i, s: x.scatter(0, i, s, reduce="add"),
        lambda x, i, s: x.scatter_add(0, i, s),
        lambda x, i, s: x.scatter_reduce(0, i, s, "amax", include_self=False),
    ],
)
def test_scatter_with_an_empty_index_of_more_dims_leaves_self(op):
    # an empty index may have any number of dimensions (gather's backward scatters into a 1-d
    # gradient through a (2, 0) index): JAX refused the coordinates
    def run(dev):
        x = torch.arange(5.0, device=dev)
        return op(x, torch.zeros(2, 0, dtype=torch.int64, device=dev), torch.ones(2, 0, device=dev))

    _on_both(run)


def test_gather_backward_with_an_empty_index():
    def run(dev):
        x = torch.arange(5.0, device=dev).requires_grad_()
        torch.gather(x, 0, torch.zeros(2, 0, dtype=torch.int64, device=dev)).sum().backward()
        return x.grad

    _on_both(run)


EMPTY_SEARCHES = [((0, 0), (0, 0)), ((0, 0), (0, 3)), ((2, 0), (2, 3)), ((2, 3), (2, 0))]


@pytest.mark.parametrize("seq_shape, val_shape", EMPTY_SEARCHES)
def test_searchsorted_of_empty_batches_and_rows(seq_shape, val_shape):
    # reshape(-1, 0) has no answer: an empty batch or row raised ZeroDivisionError
    def run(dev):
        seq = torch.arange(float(torch.Size(seq_shape).numel()), device=dev).reshape(seq_shape)
        return torch.searchsorted(seq, torch.ones(val_shape, device=dev))

    _on_both(run)


@pytest.mark.parametrize(
    "call",
    [
        lambda a, o: torch.add(a, a, out=o),
        lambda a, o: torch.amax(a, out=o),
        lambda a, o: o.add_(a),
    ],
)
def test_a_cpu_0dim_output_is_a_device_mismatch(call):
    # CPU 0-dim tensors mix with tpu tensors as scalars (as on CUDA), but not as the tensor written: the
    # engine took the out= for a scalar and failed on its storage (KeyError)
    a = torch.tensor(1.5, device=DEV)
    out = torch.zeros(())
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        call(a, out)
    assert out.item() == 0.0


@pytest.mark.parametrize("index_shape", [(), (1,)])
def test_gather_backward_of_a_0dim_input(index_shape):
    # the backward scatters a 1-element gradient into a 0-dim one: JAX refused the (1,) update
    def run(dev):
        x = torch.tensor(2.5, device=dev).requires_grad_()
        (torch.gather(x, 0, torch.zeros(index_shape, dtype=torch.int64, device=dev)) * 3).sum().backward()
        return x.grad

    _on_both(run)
    _on_both(
        lambda dev: torch.zeros((), device=dev).scatter_add(
            0, torch.zeros(1, dtype=torch.int64, device=dev), torch.ones(1, device=dev)
        )
    )


CLAMP_OF_BOOL = [
    lambda b: torch.clamp(b, b, b),
    lambda b: torch.clamp(b, b, None),
    lambda b: torch.clamp(b, None, b),
    lambda b: torch.clamp(b, b, b.int()),
    lambda b: torch.clamp(b, True, False),
    lambda b: torch.clamp(b, False),
    lambda b: torch.clamp(b, None, True),
    lambda b: torch.clamp(b, 0, 1),
    lambda b: b.clone().clamp_(b, b),
]


@pytest.mark.parametrize("call", CLAMP_OF_BOOL)
def test_clamp_of_bool_raises_where_the_cpu_does(call):
    # test_dtypes: the CPU's clamp kernels have no bool loop (two bool tensor bounds, or bool Scalars);
    # one bool tensor bound is maximum/minimum, which has
    b = torch.tensor([True, False, True])
    try:
        expected = call(b)
    except NotImplementedError as e:
        with pytest.raises(NotImplementedError, match=str(e).replace("_cpu", "_tpu")):
            call(b.to(DEV))
    else:
        assert_close(call(b.to(DEV)).cpu(), expected)


EXPANDED_OUT = [
    lambda x, out: torch.index_select(x, 1, torch.tensor([0, 1], device=x.device), out=out),  # resized: (3, 2)
    lambda x, out: torch.add(x[:2], 1, out=out),
    lambda x, out: torch.bernoulli(torch.rand(2, 6, device=x.device), out=out),
]


@pytest.mark.parametrize("call", EXPANDED_OUT)
def test_an_expanded_out_raises_before_any_resize(call):
    # test_errors: the CPU checks the written tensor for internal overlap before resizing it; tpu resized
    # it first (then nothing overlapped) or, for bernoulli, did not check
    for dev in ("cpu", DEV):
        out = torch.zeros(1, 6, device=dev).expand(2, 6)
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            call(torch.randn(3, 6, device=dev), out)


CPU_ERRORS = [
    lambda d: torch.randn(3, device=d).masked_scatter(torch.ones(3, device=d).byte(), torch.ones(3, device=d)),
    lambda d: torch.randn(3, device=d).masked_scatter_(torch.ones(3, device=d), torch.ones(3, device=d)),
    lambda d: torch.multinomial(torch.rand(2, 4, device=d), 2, out=torch.empty(2, 2, device=d)),
    lambda d: torch.arange(4, device=d).mean(),
    lambda d: torch.randn(4, device=d).mean(0, dtype=torch.int64),
    lambda d: torch.trace(torch.arange(3.0, device=d)),  # (the meta kernel leaves out "trace: ")
]


CAT_ERRORS = [
    lambda d: torch.cat([torch.ones(4, 0, device=d), torch.ones(5, 0, 3, device=d)], 1),
    lambda d: torch.cat([torch.ones(2, 3, device=d), torch.ones(3, device=d)]),
    lambda d: torch.cat([torch.tensor(1.0, device=d), torch.tensor(2.0, device=d)]),
    lambda d: torch.cat([torch.ones(0, device=d), torch.tensor(2.0, device=d)]),
    lambda d: torch.hstack([torch.ones(3, device=d), torch.ones(2, 2, device=d)]),
    lambda d: torch.cat([torch.ones(2, device=d), torch.ones(2, 2, device=d)], out=torch.empty(0, device=d)),
]


@pytest.mark.parametrize("call", CPU_ERRORS + CAT_ERRORS)
def test_argument_errors_in_the_cpus_words(call):
    # test_errors: tpu computed masked_scatter with a uint8 mask and multinomial into a float out=; mean
    # named the dtype "torch.int64" (PyTorch's meta kernel) where the CPU says "Long"; test_errors_cat,
    # hstack, dstack: PyTorch's meta kernel words these otherwise (an IndexError for 0-dim)
    with pytest.raises(RuntimeError) as cpu:
        call("cpu")
    with pytest.raises(RuntimeError) as tpu:
        call(DEV)
    assert str(tpu.value) == str(cpu.value)


def _raises_as_cpu(fn):
    """fn(device) raises on tpu the CPU's exception type and words."""
    errors = []
    for dev in ("cpu", DEV):
        with pytest.raises(Exception) as info:
            fn(dev)
        errors.append((type(info.value), str(info.value)))
    assert errors[1] == errors[0]


_CONV = torch.ops.aten.convolution.default


@pytest.mark.parametrize(
    "case",
    [
        ((2, 4, 5, 5), (6, 4, 3, 3), 6, [0], [0], [1], False, [0], 1),  # stride before the channels
        ((2, 4, 5, 5, 5), (6, 4, 3, 3, 3), 6, [1], [-1], [1], False, [0], 1),  # computed before
        ((2, 4, 5, 5), (6, 4, 3, 3), 6, [1], [0], [-1], False, [0], 1),
        ((2, 4, 5, 5), (6, 4, 3, 3), 6, [1], [0], [0], False, [0], 1),
        ((2, 4, 5, 5), (6, 4), 6, [1], [0], [1], False, [0], 1),
        ((2, 4, 5, 5), (6, 4, 3, 3), 6, [1], [0], [1], False, [0], 7),
        ((2, 4, 5, 5), (6, 4, 3, 3), 6, [1], [0], [1], False, [0], 4),
        ((2, 4, 5, 5), (6, 2, 3, 3), 6, [1], [0], [1], False, [0], 1),
        ((2, 4, 5, 5), (6, 4, 3, 3), 5, [1], [0], [1], False, [0], 1),
        ((2, 4, 2, 2), (6, 4, 3, 3), 6, [1], [0], [1], False, [0], 1),
        ((2, 4, 5), (6, 4, 3, 3), 6, [1], [0], [1], False, [0], 1),
        ((2, 4, 5, 5), (6, 4, 3, 3), 6, [1, 1, 1], [0], [1], False, [0], 1),
        ((2, 4, 5, 5), (5, 3, 3, 3), 3, [1], [0], [1], True, [0], 1),
        ((2, 4, 5, 5), (4, 3, 3, 3), 6, [1], [0], [1], True, [0], 1),
        ((2, 4, 5, 5), (4, 3, 3, 3), 3, [2], [0], [1], True, [2], 1),  # computed before
        ((2, 4, 5), (4, 3, 3), 3, [2], [0], [1], True, [2], 1),
    ],
)
def test_convolution_checks_arguments_in_the_cpu_order_and_words(case):
    x, w, b, *rest = case

    def run(dev):
        return _CONV(torch.randn(x, device=dev), torch.randn(w, device=dev), torch.randn(b, device=dev), *rest)

    _raises_as_cpu(run)


def test_convolution_of_no_input_channels_has_no_output_channels():
    x, w, b = torch.randn(2, 0, 5, 5), torch.randn(6, 0, 3, 3), torch.randn(6)
    _on_both(lambda dev: _CONV(x.to(dev), w.to(dev), b.to(dev), [1], [0], [1], False, [0], 1))


@pytest.mark.parametrize("weight, dtype", [((3,), torch.int64), ((2, 3, 4), torch.int64), ((3, 3), torch.float32)])
def test_embedding_checks_in_the_cpu_words(weight, dtype):
    # the device's legacy type name, as CUDA's message names torch.cuda.FloatTensor
    def run(dev):
        torch.nn.functional.embedding(torch.tensor([1, 0], dtype=dtype, device=dev), torch.randn(weight, device=dev))

    if dtype.is_floating_point:
        with pytest.raises(RuntimeError, match=r"Long, Int; but got torch\.tpu\.FloatTensor instead \(while checking"):
            run(DEV)
    else:
        _raises_as_cpu(run)


@pytest.mark.parametrize(
    "op", [torch.sub, torch.mul, lambda a, b: a.add_(b), lambda a, b: torch.addcmul(a, b, b), torch.maximum]
)
def test_operands_that_do_not_broadcast_in_the_cpu_words(op):
    shapes = [((10, 2, 3), (10, 2, 2)), ((4, 1, 3), (2, 3, 3))]
    for sa, sb in shapes:
        _raises_as_cpu(lambda dev: op(torch.randn(sa, device=dev), torch.randn(sb, device=dev)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
@pytest.mark.parametrize(
    "loss, target_shape",
    [(torch.nn.functional.multi_margin_loss, (5,)), (torch.nn.functional.multilabel_margin_loss, (5, 3))],
)
def test_margin_losses_take_an_int64_target_only(loss, target_shape, dtype):
    # an int32 target computed (multilabel), a float one failed in JAX
    _raises_as_cpu(lambda dev: loss(torch.randn(5, 3, device=dev), torch.zeros(target_shape, dtype=dtype, device=dev)))


@pytest.mark.parametrize(
    "dtype, value",
    [
        (torch.int64, torch.tensor(2j)),  # PyTorch's reference kernel: "could not convert to type <class 'int'>"
        (torch.int8, torch.tensor(300)),  # computed, wrapped to 44
        (torch.int32, torch.tensor(1e50, dtype=torch.float64)),  # computed, saturated
        (torch.float32, torch.tensor([1.0])),
    ],
)
def test_masked_fill_value_tensor_is_checked_as_the_cpu(dtype, value):
    def run(dev):
        x = torch.zeros(4, dtype=dtype, device=dev)
        return x.masked_fill(torch.tensor([True, False, True, False], device=dev), value.to(dev))

    _raises_as_cpu(run)


@pytest.mark.parametrize(
    "dtype, value", [(torch.bool, 1 + 2j), (torch.bool, torch.tensor(2j)), (torch.int64, torch.tensor(1 + 0j))]
)
def test_masked_fill_takes_a_complex_value_that_converts(dtype, value):
    # the CPU converts a complex value into a bool tensor (True) and one without an imaginary part into
    # an integer one; PyTorch's reference kernel refused both by their type
    mask = torch.rand(4) > 0.5

    def run(dev):
        v = value.to(dev) if isinstance(value, torch.Tensor) else value
        return torch.zeros(4, dtype=dtype, device=dev).masked_fill(mask.to(dev), v)

    _on_both(run)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.kthvalue(x, 5, out=(x, torch.zeros((), dtype=torch.int64, device=x.device))),
        lambda x: torch.kthvalue(x, 11, out=(x, torch.zeros((), dtype=torch.int64, device=x.device))),
        # the values overlap the input: computed before
        lambda x: torch.kthvalue(x.view(2, 5), 2, 1, out=(x[:2], torch.empty(2, dtype=torch.int64, device=x.device))),
        # an out= that is an input is not resized (TensorIterator): resized and computed before
        lambda x: torch.add(x, x.new_ones(2, 10), out=x),
        lambda x: torch.mul(x.new_ones(2, 10), x, out=x),
    ],
)
def test_written_tensor_is_checked_against_the_inputs_before_a_resize(fn):
    _raises_as_cpu(lambda dev: fn(torch.randn(10, device=dev)))


@pytest.mark.parametrize(
    "out",
    [
        lambda x, m: x[:3],  # overlaps the input: computed before
        lambda x, m: x,
        lambda x, m: x.view(2, 3)[1],
        lambda x, m: x.new_empty(1).expand(6),
        lambda x, m: x.new_empty(2, dtype=torch.int64),
    ],
)
def test_masked_select_out_checks_as_the_cpu(out):
    def run(dev):
        x = torch.randn(6, device=dev)
        m = torch.arange(6, device=dev) % 2 == 0
        return torch.masked_select(x, m, out=out(x, m))

    _raises_as_cpu(run)


def test_masked_select_mask_dtype_in_the_cpu_words():
    _raises_as_cpu(
        lambda dev: torch.masked_select(torch.randn(6, device=dev), torch.ones(6, dtype=torch.uint8, device=dev))
    )


def test_tensors_of_more_than_64_dims_as_on_the_cpu():
    # test_reductions' and test_errors' 65-dim inputs: numpy's arrays take at most 64 dims (XLA's
    # more), and the zeros, draws, copies and reads went through numpy ("maximum supported dimension
    # for an ndarray", DLPack's "maxdims"); compared flat (assert_close takes 64 dims at most too)
    x = torch.randn([1] * 33 + [2] + [1] * 32 + [3])
    xt = x.to(DEV)
    for fn in (
        lambda t: t,
        lambda t: t.nonzero(),
    ):
        assert_close(fn(xt).cpu().reshape(-1), fn(x).reshape(-1))
    assert torch.randn([1] * 65, device=DEV).cpu().shape == (1,) * 65
    assert torch.zeros([1] * 65, device=DEV).item() == 0
    # a reduction over given dims of more than 64 raises the CPU's error (its 64-bit dim mask)
    for reduce in (lambda t: t.amax(-1), lambda t: t.argmax(0), lambda t: t.nansum(0), lambda t: t.max(0)):
        with pytest.raises(RuntimeError, match="only tensors with up to 64 dims are supported"):
            reduce(xt)


def test_a_jax_failure_past_the_rank_limit_names_it():
    from torchtpu.eager import errors

    error = errors.too_many_dims("aten::foo", ([torch.empty([1] * 65)],))
    assert isinstance(error, RuntimeError) and "at most 64 dimensions" in str(error)
    assert errors.too_many_dims("aten::foo", (torch.empty([1] * 64),)) is None


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_max_pool1d_of_integers_raises_as_on_the_cpu(dtype):
    # the CPU's max_pool1d has floating loops only; tpu took max_pool2d_with_indices, which computes
    x = torch.arange(24).reshape(2, 3, 4).to(dtype)
    with pytest.raises(NotImplementedError, match="max_pool1d_impl"):
        torch.nn.functional.max_pool1d(x, 2)
    with pytest.raises(NotImplementedError, match="max_pool1d_impl"):
        torch.nn.functional.max_pool1d(x.to(DEV), 2)
    # with indices it computes on both, as does the floating case with a gradient
    assert_close(
        torch.nn.functional.max_pool1d(x.to(DEV), 2, return_indices=True)[0].cpu(),
        torch.nn.functional.max_pool1d(x, 2, return_indices=True)[0],
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda x: torch.amax(x, 0, out=torch.empty(5, dtype=torch.int32, device=x.device)),
        lambda x: torch.amin(x, 0, out=torch.empty(5, dtype=torch.int32, device=x.device)),
        lambda x: torch.aminmax(
            x, dim=0, out=(torch.empty(5, device=x.device), torch.empty(5, dtype=torch.float64, device=x.device))
        ),
    ],
    ids=["amax", "amin", "aminmax"],
)
def test_reduction_out_dtypes_raise_as_on_the_cpu(call):
    # test_errors of amax/amin (the meta's cast message) and aminmax (a float64 max out computed)
    x = torch.randn(4, 5)
    with pytest.raises(RuntimeError) as cpu:
        call(x)
    with pytest.raises(RuntimeError) as tpu:
        call(x.to(DEV))
    assert str(tpu.value) == str(cpu.value)


@pytest.mark.parametrize("shape", [(1, 6, 10), (4, 6, 10)])
def test_unfold_backward_broadcasts_a_size_one_grad_as_on_the_cpu(shape):
    # _refs.istft (test_compare_cpu) passes unfold_backward a grad of (1, windows, size) for a (4, 20) input
    g = torch.randn(shape)
    _on_both(lambda dev: torch.ops.aten.unfold_backward(g.to(dev), [4, 20], 1, 10, 2))


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax])
def test_softmax_of_a_0d_non_finite_input_is_nan_as_on_the_cpu(fn):
    # masked.log_softmax of a 0-d input with a False mask (test_compare_cpu): -inf gave 0 (1 for softmax)
    x = torch.tensor([float("-inf"), float("inf"), float("nan"), torch.randn(()).item()])
    got = torch.stack([fn(v, 0) for v in x.to(DEV)]).cpu()
    assert_close(got, torch.stack([fn(v, 0) for v in x]), equal_nan=True)


@pytest.mark.parametrize(
    "call",
    [
        lambda x, dev: torch.index_select(x, 1, torch.tensor([0.0], device=dev)),
        lambda x, dev: torch.index_select(x, 4, torch.tensor([0], device=dev)),
        lambda x, dev: torch.index_select(x, 1, torch.tensor([1, 7], device=dev)),
        lambda x, dev: torch.index_select(x, 0, torch.tensor([-1], device=dev)),
        lambda x, dev: torch.index_select(x, -1, torch.tensor([9])),  # a CPU index on tpu, as CUDA takes one
        lambda x, dev: torch.cat([x, torch.zeros(2, 4, 4, 6, device=dev)], 1),
    ],
    ids=["float_index", "dim", "dim1_bounds", "dim0_bounds", "cpu_index_bounds", "cat_sizes"],
)
def test_index_select_and_cat_errors_raise_at_the_op_as_on_the_cpu(call):
    # an index the host knows is checked at the op (issue 47 item 3), in the CPU's type and words
    x = torch.randn(2, 3, 4, 5)
    with pytest.raises((RuntimeError, IndexError)) as cpu:
        call(x, "cpu")
    with pytest.raises((RuntimeError, IndexError)) as tpu:
        call(x.to(DEV), DEV)
    assert type(tpu.value) is type(cpu.value) and str(tpu.value) == str(cpu.value)


@pytest.mark.parametrize("fn", [torch.igamma, torch.igammac])
def test_igamma_of_a_large_a_near_x_ends_and_agrees_with_the_cpu(fn):
    # test_compare_cpu_igamma's extremal sample (a = x = 1e20): JAX's series added 1 / eps terms of 1 (a + 1
    # == a) and never ended; x near a large a now takes Temme's uniform expansion, as the CPU does (float32
    # near a = x: tests/test_upstream_unary.py)
    a = torch.tensor([25.0, 300.0, 1e4, 4.988e6]).repeat_interleave(8).double()
    x = a * (1 + (torch.rand(32, dtype=torch.float64) - 0.5) * 4 / a.sqrt())
    x[::8] = a[::8]
    huge = torch.full((3,), 1e20, dtype=torch.float64)
    a, x = torch.cat([a, huge]), torch.cat([x, huge + torch.tensor([0.0, -1e8, 3e10], dtype=torch.float64)])
    actual, expected = fn(a.to(DEV), x.to(DEV)).cpu(), fn(a, x)
    assert_close(actual[:32], expected[:32])
    # a + 1 == a: the CPU's own answer is ~4e-7 from the exact one (0.4960109807... at x - a = -99991552)
    assert_close(actual[32:], expected[32:], atol=1e-6, rtol=0)


@pytest.mark.parametrize("shape", [(5, 0, 5), (0,)])
def test_nonzero_static_of_an_empty_input_is_all_fill_value_as_on_the_cpu(shape):
    # test_compare_cpu_nonzero_static: JAX's nonzero gave zeros, not fill_value, for an empty input
    _on_both(lambda dev: torch.nonzero_static(torch.zeros(shape, device=dev), size=2, fill_value=7))
    _on_both(lambda dev: torch.nonzero_static(torch.zeros(shape, device=dev), size=1))
