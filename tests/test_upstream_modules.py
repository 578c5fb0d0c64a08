"""Regressions found by PyTorch's test_modules.py on "tpu" (issue 47), compared against the CPU on
the same inputs and parameters."""

import copy

import pytest
import torch
from torch.testing import assert_close

DEV = "tpu"


def _grads_of(module, inputs, dtype, create_graph=False):
    """The module's outputs and the gradients of a random projection of them (fixed seed), w.r.t. its
    inputs and parameters."""
    out = module(*inputs)
    flat = [t for t in (out if isinstance(out, tuple) else (out,)) for t in (t if isinstance(t, tuple) else (t,))]
    g = torch.Generator().manual_seed(3)
    loss = sum((t * torch.randn(t.shape, generator=g, dtype=dtype).to(t.device)).sum() for t in flat)
    wrt = [*inputs, *module.parameters()]
    grads = torch.autograd.grad(loss, wrt, create_graph=create_graph)
    return flat, grads


def _cpu_and_tpu(make, inputs, training=True):
    torch.manual_seed(0)
    cpu = make().train(training)
    tpu = copy.deepcopy(cpu).to(DEV)
    cpu_in = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    tpu_in = [t.to(DEV).requires_grad_(t.is_floating_point()) for t in inputs]
    return cpu, tpu, cpu_in, tpu_in


RNN_CASES = [
    ("lstm", lambda: torch.nn.LSTM(4, 3, num_layers=2, bidirectional=True), lambda: [torch.randn(5, 2, 4)]),
    ("lstm_proj", lambda: torch.nn.LSTM(4, 3, proj_size=2, batch_first=True), lambda: [torch.randn(2, 5, 4)]),
    ("lstm_no_bias", lambda: torch.nn.LSTM(4, 3, bias=False), lambda: [torch.randn(5, 2, 4)]),
    ("gru", lambda: torch.nn.GRU(4, 3, num_layers=2, bidirectional=True), lambda: [torch.randn(5, 2, 4)]),
    ("gru_no_bias", lambda: torch.nn.GRU(4, 3, bias=False), lambda: [torch.randn(5, 2, 4)]),
    ("lstm_cell", lambda: torch.nn.LSTMCell(4, 3), lambda: [torch.randn(2, 4)]),
    ("gru_cell", lambda: torch.nn.GRUCell(4, 3), lambda: [torch.randn(2, 4), torch.randn(2, 3)]),
    ("gru_cell_unbatched", lambda: torch.nn.GRUCell(4, 3, bias=False), lambda: [torch.randn(4)]),
]


@pytest.mark.parametrize("name,make,inputs", RNN_CASES, ids=[c[0] for c in RNN_CASES])
def test_rnn_cells_forward_backward_double_backward(name, make, inputs):
    # the fused LSTM/GRU cell ops ATen calls for PrivateUse1 (the CPU composes ordinary ops)
    dtype = torch.float64
    torch.manual_seed(1)
    xs = [t.to(dtype) for t in inputs()]
    cpu, tpu, cpu_in, tpu_in = _cpu_and_tpu(lambda: make().to(dtype), xs)
    cpu_out, cpu_grads = _grads_of(cpu, cpu_in, dtype, create_graph=True)
    tpu_out, tpu_grads = _grads_of(tpu, tpu_in, dtype, create_graph=True)
    for a, b in zip(tpu_out, cpu_out):
        assert_close(a.cpu(), b.detach())
    for a, b in zip(tpu_grads, cpu_grads):
        assert_close(a.cpu(), b.detach())
    # double backward through the gradients (ATen's differentiable cell backward)
    gg_cpu = torch.autograd.grad(sum((g * g).sum() for g in cpu_grads), cpu_in)
    gg_tpu = torch.autograd.grad(sum((g * g).sum() for g in tpu_grads), tpu_in)
    for a, b in zip(gg_tpu, gg_cpu):
        assert_close(a.cpu(), b)


def test_fused_cells_without_gradients_and_in_float32():
    torch.manual_seed(2)
    for make in (lambda: torch.nn.LSTM(6, 5), lambda: torch.nn.GRU(6, 5)):
        cpu = make()
        tpu = copy.deepcopy(cpu).to(DEV)
        x = torch.randn(7, 3, 6)
        with torch.no_grad():
            cpu_out, tpu_out = cpu(x), tpu(x.to(DEV))
        assert_close(tpu_out[0].cpu(), cpu_out[0])
        for a, b in zip(
            tpu_out[1] if isinstance(tpu_out[1], tuple) else (tpu_out[1],),
            cpu_out[1] if isinstance(cpu_out[1], tuple) else (cpu_out[1],),
        ):
            assert_close(a.cpu(), b)


def test_fused_cells_check_sizes_as_cuda():
    # the CPU has no fused cells: CUDA's size checks, for cells with and without biases
    gru, lstm = torch.ops.aten._thnn_fused_gru_cell, torch.ops.aten._thnn_fused_lstm_cell
    with pytest.raises(RuntimeError, match=r"torch.Size\(\[2, 9\]\) != torch.Size\(\[2, 6\]\)"):
        gru(torch.randn(2, 9, device=DEV), torch.randn(2, 6, device=DEV), torch.randn(2, 3, device=DEV))
    with pytest.raises(RuntimeError, match=r"8 != 2 \* 12 // 4 \(aka 6\)"):
        lstm(torch.randn(2, 12, device=DEV), torch.randn(2, 12, device=DEV), torch.randn(2, 4, device=DEV))
    hy, workspace = gru(torch.randn(2, 9, device=DEV), torch.randn(2, 9, device=DEV), torch.randn(2, 3, device=DEV))
    assert hy.shape == (2, 3) and workspace.shape == (2, 15)


CL = {4: torch.channels_last, 5: torch.channels_last_3d}


def _strides_values_and_grad(fn, x):
    """fn(x)'s strides and values, and the gradient's (of a random contiguous incoming gradient)."""
    x = x.detach().requires_grad_()
    y = fn(x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(4)).to(x.device)
    (gx,) = torch.autograd.grad(y, x, g)
    return y.stride(), gx.stride(), y.detach().cpu(), gx.cpu()


@pytest.mark.parametrize(
    "name,fn,shape",
    [
        ("reflect2d", lambda x: torch.nn.functional.pad(x, (1, 2, 2, 1), mode="reflect"), (2, 3, 5, 6)),
        ("replicate2d", lambda x: torch.nn.functional.pad(x, (1, 2, 2, 1), mode="replicate"), (2, 3, 5, 6)),
        ("reflect3d", lambda x: torch.nn.functional.pad(x, (1,) * 6, mode="reflect"), (2, 3, 4, 5, 6)),
        ("replicate3d", lambda x: torch.nn.functional.pad(x, (1,) * 6, mode="replicate"), (2, 3, 4, 5, 6)),
        ("reflect2d_unbatched", lambda x: torch.nn.functional.pad(x[0], (1, 2, 2, 1), mode="reflect"), (2, 3, 5, 6)),
        ("pixel_shuffle", lambda x: torch.nn.functional.pixel_shuffle(x, 2), (2, 8, 3, 3)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_channels_last_layout_kept_as_on_the_cpu(name, fn, shape):
    # ReflectionPad2d's test_memory_format: the CPU's pads (and their gradients, laid out as the
    # input) and pixel_shuffle keep a channels_last input's layout; PyTorch's meta kernels do not
    x = torch.randn(shape).contiguous(memory_format=CL[len(shape)])
    cpu = _strides_values_and_grad(fn, x)
    tpu = _strides_values_and_grad(fn, x.to(DEV))
    assert tpu[:2] == cpu[:2]
    assert_close(tpu[2], cpu[2])
    assert_close(tpu[3], cpu[3])


@pytest.mark.parametrize("shape", [(0, 5, 2, 2), (0, 5, 2, 2, 3), (2, 0, 3, 4)])
def test_empty_tensor_clone_keeps_its_strides(shape):
    # BatchNorm2d's test_memory_format (zero_batch): an empty batch goes through clone(), which keeps
    # a channels_last layout on the CPU
    x = torch.randn(shape).contiguous(memory_format=CL[len(shape)])
    assert x.to(DEV).clone().stride() == x.clone().stride()
    assert x.to(DEV).permute(0, 2, 1, 3, *range(4, len(shape))).clone().stride() == (
        x.permute(0, 2, 1, 3, *range(4, len(shape))).clone().stride()
    )
    assert x.to(DEV).clone(memory_format=torch.contiguous_format).stride() == (
        x.clone(memory_format=torch.contiguous_format).stride()
    )
    # (with affine=True the CPU multiplies the clone by weight[0], and its TensorIterator keeps an empty
    # channels_last layout there where PyTorch's meta kernels do not: not matched on tpu)
    torch.manual_seed(0)
    bn = (torch.nn.BatchNorm2d if len(shape) == 4 else torch.nn.BatchNorm3d)(shape[1], affine=False)
    for training in (True, False):
        bn.train(training)
        assert bn.to(DEV)(x.to(DEV)).stride() == bn.cpu()(x).stride()


@pytest.mark.parametrize("shape,groups", [((4, 6, 5), 3), ((4, 9, 2, 3), 3), ((150, 6), 1)])
def test_group_norm_float64_keeps_weight_and_bias_in_float64(shape, groups):
    # GroupNorm's test_grad: gradcheck's central differences of 1e-6 in the weight vanished when the
    # lowering multiplied by the weight in float32
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64)
    w = torch.rand(shape[1], dtype=torch.float64) + 0.5
    b = torch.randn(shape[1], dtype=torch.float64)

    def slope(d):
        xs, ws, bs = x.to(d), w.to(d), b.to(d)
        step = torch.zeros_like(ws)
        step[1] = 1e-6
        up = torch.nn.functional.group_norm(xs, groups, ws + step, bs + step)
        down = torch.nn.functional.group_norm(xs, groups, ws - step, bs - step)
        return ((up - down) / 2e-6).cpu()

    assert_close(slope(DEV), slope("cpu"))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("shape", [(10,), (4, 10)])
def test_multilabel_margin_loss_of_one_sample_is_0_dim(shape, reduction):
    # MultiLabelMarginLoss's test_cpu_gpu_parity: PyTorch's meta kernel shapes one sample's unreduced loss [1]
    torch.manual_seed(0)
    x, y = torch.randn(shape), torch.randint(-1, 10, shape)
    xc, xt = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    cpu = torch.nn.functional.multilabel_margin_loss(xc, y, reduction=reduction)
    tpu = torch.nn.functional.multilabel_margin_loss(xt, y.to(DEV), reduction=reduction)
    assert tpu.shape == cpu.shape
    assert_close(tpu.detach().cpu(), cpu.detach())
    assert_close(torch.autograd.grad(tpu.sum(), xt)[0].cpu(), torch.autograd.grad(cpu.sum(), xc)[0])


def test_lazy_module_converts_dtype_on_the_device_before_its_first_call():
    # LazyConv*'s test_forward (float64): `.to("tpu").double()` converts the uninitialized parameters,
    # whose `shape` raises
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, dtype=torch.float64)
    for cls in (torch.nn.LazyConv1d, torch.nn.LazyConvTranspose1d):
        tpu = cls(4, 2).to(DEV).double()
        out = tpu(x.to(DEV))  # (initialised on the device: the CPU's module takes its parameters)
        assert tpu.weight.dtype == torch.float64 and tpu.weight.device.type == DEV
        cpu = cls(4, 2).double()
        cpu(x)
        cpu.load_state_dict({k: v.cpu() for k, v in tpu.state_dict().items()})
        assert_close(out.cpu(), cpu(x))


def test_fractional_max_pool3d_unbatched_with_a_batch_of_samples():
    # FractionalMaxPool3d's test_forward (no_batch_dim): samples for 2 batches, an unbatched input;
    # the first row serves
    torch.manual_seed(0)
    x = torch.randn(4, 5, 5, 5, dtype=torch.float64)
    samples = torch.rand(2, 4, 3, dtype=torch.float64)
    xc, xt = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    cpu = torch.nn.functional.fractional_max_pool3d(xc, 2, output_ratio=0.5, _random_samples=samples)
    tpu = torch.nn.functional.fractional_max_pool3d(xt, 2, output_ratio=0.5, _random_samples=samples.to(DEV))
    assert_close(tpu.detach().cpu(), cpu.detach())
    g = torch.randn(cpu.shape, dtype=torch.float64)
    assert_close(torch.autograd.grad(tpu, xt, g.to(DEV))[0].cpu(), torch.autograd.grad(cpu, xc, g)[0])


def test_sdpa_backward_of_an_undefined_gradient_is_undefined():
    """gradcheck's undefined-gradient check (test_grad of TransformerEncoderLayer) calls the fused
    attention backward with no incoming gradient: the CPU's kernel answers three undefined gradients,
    tpu's lowering read the missing gradient's dtype. With a gradient, the values and the CPU's layout."""
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    back = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    q, k, v = (torch.randn(2, 3, 4, 5, dtype=torch.float64) for _ in range(3))
    results = []
    for dev in ("cpu", DEV):
        qd, kd, vd = q.to(dev), k.to(dev), v.to(dev)
        out, lse = op(qd, kd, vd, is_causal=True)[:2]
        assert back(None, qd, kd, vd, out, lse, 0.0, True) == (None, None, None)
        results.append(back(out * 0.5, qd, kd, vd, out, lse, 0.0, True))
    for c, t in zip(*results):
        assert t.stride() == c.stride()
        assert_close(t.cpu(), c)


def test_group_norm_of_an_empty_batch_as_the_cpu():
    """test_nn's GroupNorm of an empty batch: the lowering reshaped (0, groups, -1) and divided by zero."""
    for shape in ((0, 4, 3), (0, 4, 2, 2)):
        cpu = torch.nn.GroupNorm(2, 4)
        tpu = torch.nn.GroupNorm(2, 4).to("tpu")
        x = torch.randn(*shape, requires_grad=True)
        xt = x.detach().to("tpu").requires_grad_()
        cpu(x).sum().backward()
        out = tpu(xt)
        out.sum().backward()
        assert out.shape == shape and xt.grad.shape == shape
        torch.testing.assert_close(tpu.weight.grad.cpu(), cpu.weight.grad)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32])
def test_nll_loss_target_dtypes_as_the_cpu(dtype):
    """uint8 class indices are taken by the CPU's (and CUDA's) nll_loss; other integer types are refused."""
    a = torch.randn(4, 6)
    target = torch.randint(0, 6, (4,)).to(dtype)
    results = []
    for device in ("cpu", "tpu"):
        x = a.clone().to(device).requires_grad_()
        try:
            loss = torch.nn.functional.nll_loss(x.log_softmax(1), target.to(device), ignore_index=3)
        except RuntimeError as e:
            results.append(str(e))
            continue
        loss.backward()
        results.append((loss.cpu(), x.grad.cpu()))
    if dtype == torch.uint8:
        torch.testing.assert_close(results[1], results[0])
    else:
        assert results[0] == results[1] and "Long or Byte" in results[0]


@pytest.mark.parametrize("shape", [(1,), (10,), (1, 10)])
def test_addbmm_inplace_resizes_a_broadcast_self_as_the_cpu(shape):
    """ATen's addbmm_ writes addbmm.out into `self`: a `self` that broadcasts to (n, p) is resized
    (OpInfo's addbmm in-place samples); PyTorch's meta kernel refused it on tpu."""
    b1, b2 = torch.randn(3, 5, 4), torch.randn(3, 4, 10)
    cpu = torch.randn(shape)
    tpu = cpu.to("tpu")
    cpu.addbmm_(b1, b2, beta=0.5, alpha=2)
    assert tpu.addbmm_(b1.to("tpu"), b2.to("tpu"), beta=0.5, alpha=2) is tpu
    torch.testing.assert_close(tpu.cpu(), cpu)


def test_threshold_inplace_writes_an_expanded_tensor_as_the_cpu():
    """threshold_ is idempotent: the CPU's kernel skips the memory-overlap checks (test_nn's
    test_threshold_inplace_overlap); relu_ of the same tensor is still refused on both."""
    base = torch.randn(1, 6)
    results = []
    for device in ("cpu", "tpu"):
        x = base.clone().to(device).expand(6, 6)
        torch.nn.functional.threshold(x, 0.5, 0.5, inplace=True)
        torch.nn.functional.threshold_(x, 0.1, -1.0)
        results.append(x.cpu())
        with pytest.raises(RuntimeError, match="more than one element"):
            x.relu_()
    torch.testing.assert_close(results[1], results[0])
