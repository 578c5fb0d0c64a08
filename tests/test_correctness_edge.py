"""Issue 24: edge cases where "tpu" gave silent wrong values or the wrong error, checked against the CPU.

Each test is the issue's repro (or a smaller one): values agree with the CPU by
torch.testing.assert_close, and where the CPU raises, "tpu" raises PyTorch's error.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

D = "tpu"


def _both(fn, *tensors):
    """fn on the CPU tensors and on tpu copies of them: (cpu result, tpu result moved to the CPU)."""
    expected = fn(*tensors)
    actual = fn(*(t.to(D) for t in tensors))
    return expected, (actual.cpu() if isinstance(actual, torch.Tensor) else [a.cpu() for a in actual])


def _same_error(fn_cpu, fn_tpu, match=None):
    """Both raise; the tpu message is the CPU's (or matches `match`)."""
    with pytest.raises(Exception) as on_cpu:
        fn_cpu()
    with pytest.raises(type(on_cpu.value)) as on_tpu:
        fn_tpu()
    expected = match if match is not None else str(on_cpu.value).splitlines()[0]
    assert expected in str(on_tpu.value), (str(on_cpu.value), str(on_tpu.value))


# ---------------------------------------------------------------- 8: SDPA, key/value broadcast + bool mask
@pytest.mark.parametrize("kv_heads", [1, 4])
@pytest.mark.parametrize("mask_kind", ["bool", "float", None])
def test_sdpa_broadcast_heads_mask(kv_heads, mask_kind):
    q, k, v = torch.randn(2, 4, 12, 16), torch.randn(2, kv_heads, 12, 16), torch.randn(2, kv_heads, 12, 16)
    m = torch.ones(12, 12, dtype=torch.bool).tril()
    if mask_kind == "float":
        m = torch.zeros(12, 12).masked_fill(~m, float("-inf"))
    masks = () if mask_kind is None else (m,)
    expected, actual = _both(lambda q, k, v, *m: F.scaled_dot_product_attention(q, k, v, *m), q, k, v, *masks)
    torch.testing.assert_close(actual, expected)


def test_sdpa_bool_mask_math_path_and_grad():
    """Shapes the fused op does not take (3-D query against 4-D keys) go through PyTorch's math path,
    which expects the bool mask already turned into 0/-inf; gradients of the broadcast keys too."""
    q, k, v = torch.randn(4, 3, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    m = torch.rand(3, 6) > 0.3
    m[:, 0] = True
    expected, actual = _both(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, m)
    torch.testing.assert_close(actual, expected)

    q, k, v = (
        torch.randn(2, 4, 5, 8, requires_grad=True),
        torch.randn(2, 1, 5, 8, requires_grad=True),
        torch.randn(2, 1, 5, 8, requires_grad=True),
    )
    m = torch.ones(5, 5, dtype=torch.bool).tril()
    g = torch.randn(2, 4, 5, 8)
    F.scaled_dot_product_attention(q, k, v, attn_mask=m).backward(g)
    tq, tk, tv = (t.detach().to(D).requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(tq, tk, tv, attn_mask=m.to(D)).backward(g.to(D))
    for cpu, tpu in ((q, tq), (k, tk), (v, tv)):
        torch.testing.assert_close(tpu.grad.cpu(), cpu.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_sdpa_broadcast_heads_bool_mask_compiled():
    q, k, v = torch.randn(2, 4, 12, 16), torch.randn(2, 1, 12, 16), torch.randn(2, 1, 12, 16)
    m = torch.ones(12, 12, dtype=torch.bool).tril()
    fn = torch.compile(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), backend="tpu")
    torch.testing.assert_close(
        fn(q.to(D), k.to(D), v.to(D), m.to(D)).cpu(), F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    )


# ---------------------------------------------------------------- 4: in-place ops with an impossible cast
@pytest.mark.parametrize(
    "case",
    [
        lambda x: x.mul_(2.5),
        lambda x: x.__imul__(2.5),
        lambda x: x.div_(2),
        lambda x: x.add_(torch.ones(3, device=x.device)),
        lambda x: x.sqrt_(),
        lambda x: x.clamp_(0.5),
    ],
)
def test_inplace_int_refuses_float_result(case):
    _same_error(
        lambda: case(torch.tensor([1, 2, 3])),
        lambda: case(torch.tensor([1, 2, 3], device=D)),
        "result type Float can't be cast to the desired output type Long",
    )


def test_inplace_float_refuses_complex_and_bool_refuses_int():
    _same_error(
        lambda: torch.randn(3).mul_(1j),
        lambda: torch.randn(3, device=D).mul_(1j),
        "result type ComplexFloat can't be cast to the desired output type Float",
    )
    z = torch.randn(3, dtype=torch.complex64)
    _same_error(lambda: torch.randn(3).mul_(z), lambda: torch.randn(3, device=D).mul_(z.to(D)))
    _same_error(lambda: torch.tensor([True]).add_(1), lambda: torch.tensor([True], device=D).add_(1))


def test_inplace_casts_the_cpu_allows_still_work():
    for fn in (lambda x: x.mul_(2), lambda x: x.lt_(1.5), lambda x: x.fill_(2.7), lambda x: x.masked_fill_(x > 1, 7.9)):
        expected = fn(torch.tensor([1, 2, 3]))
        actual = fn(torch.tensor([1, 2, 3], device=D))
        torch.testing.assert_close(actual.cpu(), expected)
    x = torch.randn(3, dtype=torch.float32)
    torch.testing.assert_close(x.to(D).mul_(torch.tensor(2.0, dtype=torch.float64)).cpu(), x * 2)


# ---------------------------------------------------------------- 6: overlapping / expanded writes
OVERLAPS = {
    "shifted_add": lambda x: x[1:].add_(x[:-1]),
    "copy_transpose": lambda x: x.view(3, 3).copy_(x.view(3, 3).t()),
    "add_transpose": lambda x: x.view(3, 3).add_(x.view(3, 3).t()),
    "expanded_add": lambda x: x[:3].unsqueeze(1).expand(3, 4).add_(1),
    "out_expanded": lambda x: torch.add(torch.ones(3, 4, device=x.device), 1, out=x[:3].unsqueeze(1).expand(3, 4)),
    "copy_partial": lambda x: x[:4].copy_(x[2:6]),
    "mul_out_partial": lambda x: torch.mul(x[:4], 2, out=x[2:6]),
}


@pytest.mark.parametrize("name", list(OVERLAPS))
def test_overlapping_writes_raise(name):
    fn = OVERLAPS[name]
    x = torch.randn(9)
    _same_error(lambda: fn(x.clone()), lambda: fn(x.to(D)), "unsupported operation:")
    # the same message as the CPU's
    with pytest.raises(RuntimeError) as on_cpu:
        fn(x.clone())
    with pytest.raises(RuntimeError) as on_tpu:
        fn(x.to(D))
    assert str(on_cpu.value).split(".")[0] == str(on_tpu.value).split(".")[0]


def test_overlap_check_follows_the_offsets():
    """The offsets of views travel as traced values (one executable for x[i] in a loop): the check
    is made per call, so a later call with overlapping offsets raises too, and the tensor is unchanged."""
    x = torch.arange(10.0)
    t = x.to(D)
    t[:3].add_(t[5:8])  # disjoint: fine
    x[:3].add_(x[5:8])
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        t[:3].add_(t[1:4])  # the same executable's key, overlapping offsets
    torch.testing.assert_close(t.cpu(), x)


def test_non_overlapping_and_full_overlap_writes_work():
    x = torch.randn(6)
    for fn in (
        lambda x: x.add_(x),
        lambda x: x[:3].copy_(x[3:]),
        lambda x: x.view(2, 3)[1:].mul_(x.view(2, 3)[:1]),
        lambda x: x.unsqueeze(0).expand(2, 6).sum(0).add_(1),
        lambda x: x.zero_().add_(2),
    ):
        expected = fn(x.clone())
        actual = fn(x.to(D))
        torch.testing.assert_close(actual.cpu(), expected)
    y = torch.randn(3, 1)
    torch.testing.assert_close(y.to(D).expand(3, 4).fill_(2.0).cpu(), y.clone().expand(3, 4).fill_(2.0))


# ---------------------------------------------------------------- 5: checks the CPU makes
def _raises_at_op_or_sync(fn, match):
    """The tpu call raises `match` at the op, or (a value on the device: a device-side assert, as on
    CUDA) at the next synchronization."""
    with pytest.raises(RuntimeError, match=match):
        out = fn()
        torch.tpu.synchronize()
        (out[0] if isinstance(out, tuple) else out).cpu()
    torch.tpu.clear_device_assert()  # (a device-side assert is sticky until cleared)


def test_masked_scatter_too_few_source_values():
    _raises_at_op_or_sync(
        lambda: torch.zeros(5, device=D).masked_scatter(
            torch.ones(5, dtype=torch.bool, device=D), torch.ones(2, device=D)
        ),
        "source < number of ones in mask",
    )
    m = torch.rand(6) > 0.5
    x, src = torch.randn(6), torch.randn(6)
    torch.testing.assert_close(x.to(D).masked_scatter(m.to(D), src.to(D)).cpu(), x.masked_scatter(m, src))


def test_pow_integer_negative_exponent():
    for base in (torch.tensor([1, 2, 3]), torch.tensor([True, False])):
        _same_error(lambda: torch.pow(base, -1), lambda: torch.pow(base.to(D), -1))
        _same_error(lambda: base.clone().pow_(-2), lambda: base.to(D).pow_(-2))
    x = torch.tensor([1, 2, 3])
    for e in (2, 0, -1.0):  # the same executable first, then values the CPU accepts
        torch.testing.assert_close(torch.pow(x.to(D), e).cpu(), torch.pow(x, e))
    e = torch.tensor([-1, 1, 2])
    torch.testing.assert_close(torch.pow(x.to(D), e.to(D)).cpu(), torch.pow(x, e))


def test_random_ranges():
    _same_error(lambda: torch.randint(5, 2, (3,)), lambda: torch.randint(5, 2, (3,), device=D))
    _same_error(lambda: torch.empty(3).random_(4, 4), lambda: torch.empty(3, device=D).random_(4, 4))
    _same_error(lambda: torch.empty(3).uniform_(2, 1), lambda: torch.empty(3, device=D).uniform_(2, 1))
    v = torch.empty(1000, device=D).uniform_(2, 2.5).cpu()
    assert v.min() >= 2 and v.max() <= 2.5
    r = torch.randint(2, 5, (1000,), device=D).cpu()
    assert set(r.tolist()) == {2, 3, 4}


@pytest.mark.parametrize(
    "dtype,value",
    [
        (torch.int8, 300),
        (torch.int8, -129),
        (torch.uint8, -256),
        (torch.int32, 2**31),
        (torch.float16, 1e6),
        (torch.int8, float("nan")),
        (torch.float32, 1 + 1j),
        (torch.bfloat16, 1e39),
    ],
)
def test_fill_value_overflow(dtype, value):
    _same_error(
        lambda: torch.zeros(3, dtype=dtype).fill_(value), lambda: torch.zeros(3, dtype=dtype, device=D).fill_(value)
    )
    _same_error(lambda: torch.full((3,), value, dtype=dtype), lambda: torch.full((3,), value, dtype=dtype, device=D))
    m = torch.tensor([True, False, True])
    _same_error(
        lambda: torch.zeros(3, dtype=dtype).masked_fill(m, value),
        lambda: torch.zeros(3, dtype=dtype, device=D).masked_fill(m.to(D), value),
    )


def test_fill_values_the_cpu_converts():
    for dtype, value in (
        (torch.uint8, -1),
        (torch.bool, 2),
        (torch.float16, float("inf")),
        (torch.int8, 127),
        (torch.int8, 5),
    ):
        expected = torch.zeros(3, dtype=dtype).fill_(value)
        torch.testing.assert_close(torch.zeros(3, dtype=dtype, device=D).fill_(value).cpu(), expected)


def test_segment_reduce_lengths_beyond_the_data():
    data = torch.randn(4)
    _raises_at_op_or_sync(
        lambda: torch.segment_reduce(data.to(D), "sum", lengths=torch.tensor([3, 3], device=D)), "sum to data.size"
    )
    _raises_at_op_or_sync(
        lambda: torch.segment_reduce(data.to(D), "sum", lengths=torch.tensor([5, -1], device=D)), "negative"
    )
    lengths = torch.tensor([1, 3])
    torch.testing.assert_close(
        torch.segment_reduce(data.to(D), "sum", lengths=lengths.to(D)).cpu(),
        torch.segment_reduce(data, "sum", lengths=lengths),
    )


def test_embedding_bag_offsets_beyond_the_input():
    w = torch.randn(5, 3)
    _raises_at_op_or_sync(
        lambda: F.embedding_bag(torch.tensor([1, 2], device=D), w.to(D), torch.tensor([0, 5], device=D)),
        "offsets\\[-1\\]",
    )
    _raises_at_op_or_sync(
        lambda: F.embedding_bag(torch.tensor([1, 2], device=D), w.to(D), torch.tensor([1, 2], device=D)),
        "offsets\\[0\\]",
    )
    i, o = torch.tensor([1, 2, 4]), torch.tensor([0, 1])
    torch.testing.assert_close(F.embedding_bag(i.to(D), w.to(D), o.to(D)).cpu(), F.embedding_bag(i, w, o))


def test_native_dropout_p_out_of_range():
    x = torch.randn(3)
    for p in (1.5, -0.5):
        _same_error(lambda: torch.native_dropout(x, p, True), lambda: torch.native_dropout(x.to(D), p, True))
    out, mask = torch.native_dropout(x.to(D), 1.5, False)  # not training: no draw, as on the CPU
    torch.testing.assert_close(out.cpu(), x)


def test_native_dropout_backward_promotes_as_on_the_cpu():
    # a bool or integer grad times the float scale is float32 (it was cast back: 2.0 became 1.0)
    mask = torch.rand(6) > 0.5
    for grad in (torch.rand(6) > 0.3, torch.randint(-3, 4, (6,)), torch.randn(6, dtype=torch.float16)):
        for scale in (0.0, 1.0, 2.0, 1.25):
            expected = torch.ops.aten.native_dropout_backward(grad, mask, scale)
            actual = torch.ops.aten.native_dropout_backward(grad.to(D), mask.to(D), scale).cpu()
            assert actual.dtype == expected.dtype
            torch.testing.assert_close(actual, expected)


def test_addcmul_integer_value_is_converted():
    a, b, c = torch.tensor([1, 2, -3]), torch.tensor([1, 2, 5]), torch.tensor([1, 2, 7])
    for value in (0.5, 2.7, -1.5, 3):
        torch.testing.assert_close(
            torch.addcmul(a.to(D), b.to(D), c.to(D), value=value).cpu(), torch.addcmul(a, b, c, value=value)
        )


# ---------------------------------------------------------------- 7: resize_ to the same shape
def test_resize_same_shape_keeps_strides():
    for make in (
        lambda d: torch.arange(6.0, device=d).reshape(2, 3).t(),
        lambda d: torch.arange(12.0, device=d).reshape(3, 4)[:, 1:3],
    ):
        expected, actual = make("cpu"), make(D)
        expected.resize_(expected.shape)
        actual.resize_(actual.shape)
        assert actual.stride() == expected.stride()
        torch.testing.assert_close(actual.cpu(), expected)
    expected = torch.arange(6.0).reshape(2, 3).t().resize_(3, 2, memory_format=torch.contiguous_format)
    actual = torch.arange(6.0, device=D).reshape(2, 3).t().resize_(3, 2, memory_format=torch.contiguous_format)
    assert actual.stride() == expected.stride()
    _same_error(
        lambda: torch.ones(2).resize_(2, memory_format=torch.preserve_format),
        lambda: torch.ones(2, device=D).resize_(2, memory_format=torch.preserve_format),
    )


# ---------------------------------------------------------------- 9: float8 e4m3fn saturates
def test_float8_e4m3fn_overflow_saturates():
    x = torch.tensor([100.0, 448.0, 464.0, 500.0, -1000.0, 1e30, float("inf"), -float("inf"), float("nan"), 0.3])
    for src in (x, x.bfloat16(), x.half()):
        expected = src.to(torch.float8_e4m3fn).float()
        torch.testing.assert_close(src.to(D).to(torch.float8_e4m3fn).float().cpu(), expected, equal_nan=True)
    i = torch.tensor([300, 1000, -5000])
    torch.testing.assert_close(i.to(D).to(torch.float8_e4m3fn).float().cpu(), i.to(torch.float8_e4m3fn).float())
    y = torch.tensor([57344.0, 60000.0, 61440.0, 1e6])
    torch.testing.assert_close(y.to(D).to(torch.float8_e5m2).float().cpu(), y.to(torch.float8_e5m2).float())
    compiled = torch.compile(lambda a: a.to(torch.float8_e4m3fn).float(), backend="tpu")
    torch.testing.assert_close(compiled(x.to(D)).cpu(), x.to(torch.float8_e4m3fn).float(), equal_nan=True)


# ---------------------------------------------------------------- 12: PyTorch's errors
@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.float32])
def test_index_tensor_dtype(dtype):
    x, i = torch.randn(5), torch.tensor([1, 2], dtype=dtype)
    _same_error(lambda: x[i], lambda: x.to(D)[i.to(D)])
    _same_error(
        lambda: x.clone().index_put_((i,), torch.tensor(1.0)),
        lambda: x.to(D).index_put_((i.to(D),), torch.tensor(1.0, device=D)),
    )


# ---------------------------------------------------------------- 11: out of memory is PyTorch's error
def test_out_of_memory_is_torch_error_and_free_memory_is_not_negative():
    lazy = torch.empty(10**12, device=D)  # holds no device memory until written
    free, total = torch.tpu.mem_get_info()
    assert 0 <= free <= total
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        torch.zeros(10**12, device=D)
    with pytest.raises(torch.OutOfMemoryError):
        lazy.add_(1)
    del lazy
    x = torch.randn(4)
    torch.testing.assert_close((x.to(D) * 2).cpu(), x * 2)  # the device still works


def test_negative_sizes():
    for fn in (
        lambda d: torch.empty(-1, device=d),
        lambda d: torch.empty(2, -3, device=d),
        lambda d: torch.empty_strided((-1,), (1,), device=d),
        lambda d: torch.randn(-1, device=d),
        lambda d: torch.zeros(-2, device=d),
        lambda d: torch.ones(3, device=d).new_empty((-1,)),
    ):
        _same_error(lambda: fn("cpu"), lambda: fn(D))


# ---------------------------------------------------------------- 10: OpInfo edge cases
def test_gather_empty_index_of_any_rank():
    x = torch.randn(5)
    for shape in ((0, 2), (3, 0), (0,)):
        i = torch.empty(shape, dtype=torch.long)
        expected = torch.gather(x, 0, i)
        actual = torch.gather(x.to(D), 0, i.to(D)).cpu()
        assert actual.shape == expected.shape and actual.dtype == expected.dtype


def test_as_strided_of_partial_views():
    base = torch.randn(20)
    for view in (lambda t: t[3:], lambda t: t[2:17].view(3, 5)[1:]):
        for size, stride, offset in (((3, 3), (2, 1), 1), ((2, 4), (1, 2), 5), ((4,), (3,), None)):
            cpu, tpu = view(base.clone()), view(base.to(D))
            torch.testing.assert_close(tpu.as_strided(size, stride, offset).cpu(), cpu.as_strided(size, stride, offset))


def _bf16_ops():
    b = torch.bfloat16
    return {
        "conv_transpose2d": (
            lambda x, w: F.conv_transpose2d(x, w, stride=2),
            (torch.randn(2, 4, 5, 5, dtype=b) * 3, torch.randn(4, 3, 3, 3, dtype=b) * 3),
        ),
        "instance_norm": (lambda x: F.instance_norm(x), (torch.randn(3, 2, 3, 4, dtype=b) * 3,)),
    }


@pytest.mark.parametrize("name", ["conv_transpose2d", "instance_norm"])
def test_bf16_accumulates_in_float32(name):
    """bfloat16 products and normalizations accumulate in float32 and round once: the result is within
    half a bfloat16 ulp of the exact (float64) value, and never further from it than the CPU's.
    (addbmm rounds once per batch, as PyTorch's CPU and CUDA kernel does: tests/test_ops_edge2.py.)"""
    fn, xs = _bf16_ops()[name]
    exact = fn(*(x.double() for x in xs))
    cpu = fn(*xs).double()
    tpu = fn(*(x.to(D) for x in xs)).cpu()
    assert tpu.dtype == torch.bfloat16
    err = (tpu.double() - exact).abs()
    assert bool((err <= 2**-8 * exact.abs() + 2e-3).all()), err.max()
    assert err.max() <= (cpu - exact).abs().max() + 1e-6
    # and near the CPU's, on the scale of the values (the CPU's roundings add up where partial sums cancel)
    torch.testing.assert_close(tpu.double(), cpu, rtol=0, atol=2**-6 * float(exact.abs().max()))


# ---------------------------------------------------------------- 14: lowerings users hit
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_embedding_max_norm_renormalizes_the_named_rows(dtype, norm_type):
    w = torch.randn(6, 4, dtype=dtype) * 2
    i = torch.tensor([[1, 2], [2, 5]])
    wt = w.to(D)
    expected = F.embedding(i, w, max_norm=1.5, norm_type=norm_type)
    actual = F.embedding(i.to(D), wt, max_norm=1.5, norm_type=norm_type)
    torch.testing.assert_close(actual.cpu(), expected)
    torch.testing.assert_close(wt.cpu(), w)  # the weight itself is renormalized in place, as on the CPU
    layer = torch.nn.Embedding(6, 4, max_norm=1.0)
    layer_t = torch.nn.Embedding(6, 4, max_norm=1.0).to(D)
    layer_t.load_state_dict(layer.state_dict())
    torch.testing.assert_close(layer_t(i.to(D)).cpu(), layer(i))


def test_linalg_eig_on_the_cpu_platform():
    from torchtpu.device import platform

    a = torch.randn(2, 4, 4)
    if platform.platform() != "cpu":
        with pytest.raises(NotImplementedError, match="no XLA lowering"):
            torch.linalg.eigvals(a.to(D))
        return
    w, v = torch.linalg.eig(a)
    wt, vt = torch.linalg.eig(a.to(D))
    assert wt.dtype == w.dtype and vt.dtype == v.dtype

    def ordered(values):  # the solvers may list eigenvalues in different orders
        key = values.real * 1e4 + values.imag
        return values.gather(-1, key.argsort(-1))

    torch.testing.assert_close(ordered(wt.cpu()), ordered(w), rtol=1e-4, atol=1e-4)
    # eigenvectors (free up to a phase): unit norm, and A v = w v
    vc = vt.cpu()
    torch.testing.assert_close(torch.linalg.vector_norm(vc, dim=-2), torch.ones(2, 4), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(a.to(torch.complex64) @ vc, vc * wt.cpu().unsqueeze(-2), rtol=1e-3, atol=1e-3)
    c = torch.randn(3, 3, dtype=torch.complex64)
    torch.testing.assert_close(
        ordered(torch.linalg.eigvals(c.to(D)).cpu()), ordered(torch.linalg.eigvals(c)), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("fallback", [False, True])
def test_sparse_and_quantized_say_the_layout_is_not_supported(fallback):
    import torchtpu

    x = torch.randn(3, device=D)
    torchtpu.set_cpu_fallback(fallback)
    try:
        for fn, what in (
            (lambda: x.to_sparse(), "sparse layouts"),
            (lambda: x.to_sparse_csr(), "sparse layouts"),
            (lambda: torch.quantize_per_tensor(x, 0.1, 0, torch.qint8), "quantized tensors"),
        ):
            with pytest.raises(NotImplementedError, match=f"{what} are not supported on the tpu device"):
                fn()
    finally:
        torchtpu.set_cpu_fallback(False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_multiply_by_a_bool_keeps_ieee_nan(dtype):
    """inf * False and NaN * False are NaN (IEEE, the CPU); XLA's simplifier rewrites a product with a
    converted bool into a select, which gave 0: in the eager op's promotion, in a compiled graph's cast
    (and so in the norm backward's `mask` product: complex renorm with p=inf)."""
    x = torch.tensor([float("inf"), float("nan"), -1.0, 1.0, -float("inf")], dtype=dtype)
    m = torch.tensor([False, False, False, True, False])
    expect = x * m
    torch.testing.assert_close((x.to("tpu") * m.to("tpu")).cpu(), expect, equal_nan=True, rtol=0, atol=0)

    def f(x, m):
        return x * m.to(x.dtype)

    compiled = torch.compile(f, backend="tpu")
    torch.testing.assert_close(compiled(x.to("tpu"), m.to("tpu")).cpu(), f(x, m), equal_nan=True, rtol=0, atol=0)
