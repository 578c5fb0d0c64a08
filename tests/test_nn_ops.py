"""nn / indexing / shape / data-dependent ops on the tpu device, checked against the CPU.

Every check runs the same function on CPU tensors and on tpu copies of them (fresh random data),
compares the outputs and then the gradients of a random cotangent through autograd.
"""

import re

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_matches_cpu

TPU = "tpu"
F32 = (torch.float32, {})
BF16 = (torch.bfloat16, dict(atol=3e-2, rtol=3e-2))
DTYPES = pytest.mark.parametrize("dtype,tol", [F32, BF16], ids=["f32", "bf16"])
# Every op on a new dtype compiles its own executables (forward and backward). Families marked
# SPLIT_DTYPES run every check in float32; their default bfloat16 run ("bf16", full=False) keeps the
# checks where bfloat16 rounds or accumulates differently (marked `if full` otherwise), and
# "bf16-full" under `-m slow` runs all of them in bfloat16.
SPLIT_DTYPES = pytest.mark.parametrize(
    "dtype,tol,full",
    [
        pytest.param(*F32, True, id="f32"),
        pytest.param(*BF16, False, id="bf16"),
        pytest.param(*BF16, True, id="bf16-full", marks=pytest.mark.slow),
    ],
)


def check(fn, *inputs, dtype=torch.float32, grad=True, atol=None, rtol=None):
    """fn on CPU vs fn on tpu: outputs, then gradients of every floating input.

    Given a tolerance (the half dtypes), its absolute part scales with the CPU result's largest
    magnitude: both sides round to 8 bits at every step and differently (one bfloat16 step at 8-16
    is 0.06), and an element where a sum cancels to near zero keeps no relative accuracy."""

    def prep(i, device):
        i = i.to(dtype) if i.is_floating_point() else i
        i = i.detach().clone().to(device)
        return i.requires_grad_(grad and i.is_floating_point())

    def close(actual, expected):
        scale = 1.0
        if atol is not None and expected.numel():
            scale = max(1.0, expected.abs().max().float().item())
        torch.testing.assert_close(actual, expected, atol=None if atol is None else atol * scale, rtol=rtol)

    cpu = [prep(i, "cpu") for i in inputs]
    dev = [prep(i, TPU) for i in inputs]
    out_c, out_d = fn(*cpu), fn(*dev)
    assert out_d.device.type == TPU
    close(out_d.cpu(), out_c)
    if not grad or not out_c.requires_grad:
        return
    g = torch.randn_like(out_c)
    out_c.backward(g)
    out_d.backward(g.to(TPU))
    for a, b in zip(cpu, dev):
        if a.requires_grad:
            close(b.grad.cpu(), a.grad)


def on(t, like):
    """A constant (index, mask, weight) on the device and dtype family of `like`."""
    return t.to(like.device, like.dtype) if t.is_floating_point() else t.to(like.device)


# ---------------------------------------------------------------- convolution
@SPLIT_DTYPES
def test_conv(dtype, tol, full):
    kw = dict(dtype=dtype, **tol)
    check(
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, dilation=2),
        torch.randn(2, 4, 9, 9),
        torch.randn(6, 4, 3, 3),
        torch.randn(6),
        **kw,
    )
    if full:
        check(
            lambda x, w: F.conv2d(x, w, groups=2, padding="same"),
            torch.randn(2, 4, 9, 9),
            torch.randn(6, 2, 3, 3),
            **kw,
        )
        check(
            lambda x, w, b: F.conv1d(x, w, b, stride=3, padding=2),
            torch.randn(2, 4, 17),
            torch.randn(6, 4, 5),
            torch.randn(6),
            **kw,
        )
    check(
        lambda x, w: F.conv3d(x, w, stride=(1, 2, 1), padding=1, groups=2),
        torch.randn(2, 4, 5, 6, 5),
        torch.randn(4, 2, 3, 3, 3),
        **kw,
    )
    if full:
        check(lambda x, w: F.conv2d(x, w), torch.randn(3, 9, 9), torch.randn(6, 3, 3, 3), **kw)  # unbatched


@SPLIT_DTYPES
def test_conv_transposed(dtype, tol, full):
    kw = dict(dtype=dtype, **tol)
    check(
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2),
        torch.randn(2, 4, 5, 5),
        torch.randn(4, 3, 3, 3),
        torch.randn(6),
        **kw,
    )
    if not full:
        return
    check(
        lambda x, w: F.conv_transpose1d(x, w, stride=3, padding=2, output_padding=1, dilation=2),
        torch.randn(2, 4, 7),
        torch.randn(4, 3, 3),
        **kw,
    )
    check(lambda x, w: F.conv_transpose3d(x, w, stride=2), torch.randn(1, 2, 3, 3, 3), torch.randn(2, 3, 2, 2, 2), **kw)


def test_conv_module_and_errors():
    conv = torch.nn.Conv2d(3, 5, 3, padding=1)
    dconv = torch.nn.Conv2d(3, 5, 3, padding=1).to(TPU)
    dconv.load_state_dict(conv.state_dict())
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(dconv(x.to(TPU)).cpu(), conv(x))
    with pytest.raises(RuntimeError, match="channel"):
        dconv(torch.randn(2, 4, 8, 8, device=TPU))


# ---------------------------------------------------------------- pooling
@SPLIT_DTYPES
def test_max_pool(dtype, tol, full):
    kw = dict(dtype=dtype, **tol)
    x = torch.randn(2, 3, 9, 10)
    check(lambda a: F.max_pool2d(a, 3, 2, 1), x, **kw)
    check(
        lambda a: F.max_pool2d(a, 2, ceil_mode=True, return_indices=True)[1],
        torch.randn(3, 7, 7),
        grad=False,
        dtype=dtype,
    )
    if not full:
        return
    check(lambda a: F.max_pool2d(a, (2, 3), (2, 2), (1, 0), dilation=(2, 1), ceil_mode=True), x, **kw)
    check(lambda a: F.max_pool1d(a, 3, 2), torch.randn(2, 3, 11), **kw)
    check(lambda a: F.max_pool3d(a, 2, padding=1), torch.randn(2, 2, 5, 4, 5), **kw)


@SPLIT_DTYPES
def test_avg_pool(dtype, tol, full):
    kw = dict(dtype=dtype, **tol)
    x = torch.randn(2, 3, 9, 10)
    check(lambda a: F.avg_pool2d(a, 3, 2, 1, ceil_mode=True, count_include_pad=False), x, **kw)
    check(lambda a: F.avg_pool2d(a, 2, divisor_override=3), x, **kw)
    if not full:
        return
    check(lambda a: F.avg_pool2d(a, 3, 2, 1), x, **kw)
    check(lambda a: F.avg_pool2d(a, 3, 2, 1, ceil_mode=True, count_include_pad=True), x, **kw)
    check(lambda a: F.avg_pool1d(a, 3, 2, 1), torch.randn(2, 3, 11), **kw)
    if dtype == torch.float32:  # the CPU has no bfloat16 avg_pool3d
        check(lambda a: F.avg_pool3d(a, 2, ceil_mode=True), torch.randn(2, 2, 5, 4, 5), **kw)


@SPLIT_DTYPES
def test_adaptive_pool(dtype, tol, full):
    kw = dict(dtype=dtype, **tol)
    x = torch.randn(2, 3, 9, 10)
    check(lambda a: F.adaptive_avg_pool2d(a, (4, 3)), x, **kw)
    check(lambda a: F.adaptive_max_pool2d(a, (4, 3)), x, **kw)
    if not full:
        return
    check(lambda a: F.adaptive_avg_pool1d(a, 4), torch.randn(2, 3, 11), **kw)
    check(lambda a: F.adaptive_avg_pool3d(a, (2, 3, 2)), torch.randn(2, 2, 5, 4, 5), **kw)
    check(lambda a: F.adaptive_max_pool2d(a, (4, 3), return_indices=True)[1], x, grad=False, dtype=dtype)
    check(lambda a: F.adaptive_max_pool3d(a, (2, 3, 2)), torch.randn(2, 2, 5, 4, 5), **kw)


# ---------------------------------------------------------------- normalization
@SPLIT_DTYPES
def test_norms(dtype, tol, full):
    kw = dict(dtype=dtype, **tol)
    x = torch.randn(4, 3, 5, 6) * 2 + 1
    check(
        lambda a, w, b: F.batch_norm(a, None, None, w, b, training=True), x, torch.rand(3) + 0.5, torch.randn(3), **kw
    )
    if full:
        check(lambda a: F.batch_norm(a, None, None, training=True), torch.randn(5, 4), **kw)
    check(lambda a, w, b: F.group_norm(a, 3, w, b), torch.randn(2, 6, 5, 4), torch.rand(6) + 0.5, torch.randn(6), **kw)
    if full:
        check(lambda a: F.group_norm(a, 2), torch.randn(2, 6, 7), **kw)
        check(lambda a: F.instance_norm(a), x, **kw)
    check(lambda a, w: F.rms_norm(a, (6,), w), x, torch.randn(6), **kw)
    check(lambda a, w, b: F.layer_norm(a, (5, 6), w, b), x, torch.randn(5, 6), torch.randn(5, 6), **kw)


@DTYPES
def test_batch_norm_running_stats(dtype, tol):
    m = torch.nn.BatchNorm2d(3).to(dtype)
    md = torch.nn.BatchNorm2d(3).to(dtype).to(TPU)
    md.load_state_dict(m.state_dict())
    for _ in range(2):
        x = torch.randn(4, 3, 5, 6).to(dtype) * 3 + 2
        torch.testing.assert_close(md(x.to(TPU)).cpu(), m(x), **tol)
    torch.testing.assert_close(md.running_mean.cpu(), m.running_mean, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(md.running_var.cpu(), m.running_var, atol=2e-2, rtol=2e-2)
    assert md.num_batches_tracked.item() == 2
    m.eval()
    md.eval()
    before = md.running_var.cpu()
    check(lambda a: md(a) if a.device.type == TPU else m(a), torch.randn(4, 3, 5, 6), dtype=dtype, **tol)
    assert torch.equal(md.running_var.cpu(), before)  # eval mode leaves the statistics alone


# ---------------------------------------------------------------- losses
@pytest.mark.parametrize(
    "dtype,tol,reduction", [F32 + ("mean",), F32 + ("none",), BF16 + ("sum",)], ids=["f32-mean", "f32-none", "bf16-sum"]
)
def test_losses(dtype, tol, reduction):
    kw = dict(dtype=dtype, **tol)
    x, t = torch.randn(6, 8) * 3, torch.randn(6, 8)
    w8 = torch.rand(8)
    check(lambda a, b: F.mse_loss(a, b, reduction=reduction), x, t, **kw)
    check(lambda a, b: F.l1_loss(a, b, reduction=reduction), x, t, **kw)
    check(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.7), x, t, **kw)
    check(lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=1.3), x, t, **kw)
    check(
        lambda a, b: F.binary_cross_entropy(a.sigmoid(), b, on(w8, a), reduction=reduction), x, torch.rand(6, 8), **kw
    )
    check(
        lambda a, b: F.binary_cross_entropy_with_logits(a, b, on(w8, a), reduction=reduction, pos_weight=on(w8 * 2, a)),
        x,
        torch.rand(6, 8),
        **kw,
    )
    check(lambda a, b: F.kl_div(a.log_softmax(-1), b, reduction=reduction), x, torch.rand(6, 8), **kw)
    target = torch.tensor([1, 0, 7, 3, 3, 2])
    check(lambda a: F.cross_entropy(a, on(target, a), reduction=reduction, label_smoothing=0.1), x, **kw)
    t2 = torch.randint(0, 3, (2, 4, 5))
    w3 = torch.rand(3)
    check(
        lambda a: F.cross_entropy(a, on(t2, a), on(w3, a), reduction=reduction, ignore_index=0),
        torch.randn(2, 3, 4, 5),
        **kw,
    )  # nll_loss2d
    check(lambda a: F.soft_margin_loss(a, on(torch.sign(t), a), reduction=reduction), x, **kw)


def test_cross_entropy_probabilities_and_errors():
    x, p = torch.randn(6, 8), torch.rand(6, 8).softmax(-1)
    check(lambda a: F.cross_entropy(a, on(p, a)), x)
    with pytest.raises((RuntimeError, IndexError, ValueError)):
        F.mse_loss(torch.randn(3, 4, device=TPU), torch.randn(5, 4, device=TPU))


# ---------------------------------------------------------------- activations
ACTIVATIONS = {
    "leaky_relu": lambda a: F.leaky_relu(a, 0.2),
    "elu": lambda a: F.elu(a, 0.7),
    "selu": F.selu,
    "celu": lambda a: F.celu(a, 1.3),
    "hardtanh": lambda a: F.hardtanh(a, -2.0, 1.5),
    "relu6": F.relu6,
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "softplus": lambda a: F.softplus(a, 2.0, 5.0),
    "mish": F.mish,
    "glu": lambda a: F.glu(a, 0),
    "logsigmoid": F.logsigmoid,
    "softshrink": lambda a: F.softshrink(a, 0.7),
    "hardshrink": lambda a: F.hardshrink(a, 0.7),
    "rrelu_eval": lambda a: F.rrelu(a, training=False),
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"),
    "tanhshrink": F.tanhshrink,
    "softsign": F.softsign,
    "relu": F.relu,
    "threshold": lambda a: F.threshold(a, 0.3, -2.0),
}


# Default run: every activation in float32, and in bfloat16 the ones built from transcendental
# functions or thresholds (where bfloat16 rounding shows) plus glu (halves its input); `-m slow`
# runs the other bfloat16 ones.
BF16_ACTIVATIONS = {"elu", "gelu", "gelu_tanh", "glu", "hardswish", "mish", "softplus", "threshold"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_piecewise_activations_at_their_kinks(dtype):
    """Values and gradients exactly at the break points, where PyTorch picks one piece (hardswish's
    gradient is 0 at -3 and 1 at 3): random inputs rarely land there, bfloat16 ones sometimes do."""
    points = torch.tensor([-20.0, -6.0, -3.0, -2.0, -1.0, -0.7, -0.5, 0.0, 0.3, 0.5, 0.7, 1.0, 1.5, 3.0, 6.0, 20.0])
    for name in (
        "hardswish",
        "hardsigmoid",
        "hardtanh",
        "relu6",
        "relu",
        "leaky_relu",
        "elu",
        "threshold",
        "softplus",
        "hardshrink",
        "softshrink",
    ):
        check(ACTIVATIONS[name], points, dtype=dtype)


@pytest.mark.parametrize(
    "dtype,tol,name",
    [
        pytest.param(
            *dt,
            name,
            id=f"{dt_id}-{name}",
            marks=pytest.mark.slow if dt_id == "bf16" and name not in BF16_ACTIVATIONS else (),
        )
        for name in sorted(ACTIVATIONS)
        for dt, dt_id in ((F32, "f32"), (BF16, "bf16"))
    ],
)
def test_activation(dtype, tol, name):
    check(ACTIVATIONS[name], torch.randn(6, 8) * 3, dtype=dtype, **tol)


@DTYPES
def test_prelu(dtype, tol):
    check(lambda a, w: F.prelu(a, w), torch.randn(2, 4, 5), torch.randn(4), dtype=dtype, **tol)


def test_rrelu_training():
    x = torch.randn(200, device=TPU, requires_grad=True)
    y = F.rrelu(x, 0.1, 0.3, training=True)
    ratio = (y / x).detach().cpu()
    neg = (x < 0).cpu()
    assert torch.all(ratio[~neg] == 1)
    assert torch.all((ratio[neg] >= 0.1) & (ratio[neg] <= 0.3)) and ratio[neg].std() > 0
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), ratio)


# ---------------------------------------------------------------- attention
@SPLIT_DTYPES
def test_scaled_dot_product_attention(dtype, tol, full):
    tol = tol or dict(atol=1e-5, rtol=1e-4)
    kw = dict(dtype=dtype, **tol)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8)
    sdpa = F.scaled_dot_product_attention
    check(lambda q, k, v: sdpa(q, k, v, is_causal=True, scale=0.3), q, k, v, **kw)
    check(lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), q, k, v, torch.randn(2, 1, 5, 7), **kw)
    if not full:
        return
    check(lambda q, k, v: sdpa(q, k, v), q, k, v, **kw)
    bool_mask = torch.rand(5, 7) > 0.3
    check(lambda q, k, v: sdpa(q, k, v, attn_mask=on(bool_mask, q)), q, k, v, **kw)
    check(lambda q, k, v: sdpa(q, k, v, enable_gqa=True), q, k[:, :2], v[:, :2], **kw)
    check(lambda q, k, v: sdpa(q, k, v), q, k, torch.randn(2, 4, 7, 6), **kw)  # value head dim differs


def test_scaled_dot_product_attention_edges():
    q = torch.randn(2, 4, 5, 8)
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[2] = False  # a query that sees no key gives zeros
    check(lambda q: F.scaled_dot_product_attention(q, q, q, attn_mask=on(mask, q)), q)
    with pytest.raises(RuntimeError, match="attn_mask should not be set when is_causal"):
        F.scaled_dot_product_attention(*(q.to(TPU),) * 3, attn_mask=mask.to(TPU), is_causal=True)
    qd = q.to(TPU).requires_grad_()
    out = F.scaled_dot_product_attention(qd, qd, qd, dropout_p=0.5)
    out.sum().backward()
    assert out.shape == q.shape and torch.isfinite(qd.grad.cpu()).all()


# ---------------------------------------------------------------- indexing
@SPLIT_DTYPES
def test_advanced_index(dtype, tol, full):
    """Indexing moves elements without arithmetic (the backward accumulates): bfloat16 by default
    runs the broadcast gather (accumulating backward) and the boolean mask."""
    kw = dict(dtype=dtype, **tol)
    x = torch.randn(5, 6, 7)
    i1, i2 = torch.tensor([0, -1, 3]), torch.tensor([[1], [2]])
    check(lambda a: a[on(i2, a), on(i1, a)], x, **kw)  # broadcast index tensors
    check(lambda a: a[a > 0], x, **kw)  # boolean mask (data-dependent)
    if not full:
        return
    check(lambda a: a[on(i1, a)], x, **kw)
    check(lambda a: a[:, on(i1, a)], x, **kw)
    check(lambda a: a[on(i1, a), :, on(i1, a)], x, **kw)  # separated: indexed dims go first
    check(lambda a: a[None, 1:, on(i1, a), None], x, **kw)
    cols = torch.rand(6) > 0.5
    check(lambda a: a[:, on(cols, a)], x, **kw)
    check(lambda a: a[i2, i1], x, **kw)  # CPU index tensors, as CUDA accepts


def test_index_errors():
    x = torch.randn(4, 5, device=TPU)
    with pytest.raises(IndexError, match="shape of the mask"):
        x[torch.ones(3, dtype=torch.bool, device=TPU)]
    with pytest.raises(IndexError):
        x.gather(2, torch.zeros(4, 5, dtype=torch.long, device=TPU))
    with pytest.raises(RuntimeError, match="expected BoolTensor|Bool"):
        x.masked_select(torch.ones(4, 5, dtype=torch.long, device=TPU))
    with pytest.raises(IndexError, match="Index is supposed to be a vector"):
        x.index_select(0, torch.zeros(2, 2, dtype=torch.long, device=TPU))


@SPLIT_DTYPES
def test_index_put(dtype, tol, full):
    kw = dict(dtype=dtype, **tol)
    x = torch.randn(5, 6, 7)
    idx = (torch.tensor([0, 2, 0]), torch.tensor([1, 1, 1]))
    vals = torch.arange(3.0).unsqueeze(-1) + 1

    def put(a, acc):
        return (a * 1).index_put((on(idx[0], a), on(idx[1], a)), on(vals, a), accumulate=acc)

    check(lambda a: put(a, True), x, **kw)
    if full:
        check(lambda a: put(a, False)[1:], x, **kw)

    def set_mask(a):
        a = a * 1
        a[a > 0.5] = 2.0
        return a

    def set_index(a, v):
        a = a * 1
        a[:, on(torch.tensor([4, 0]), a)] = v
        return a

    check(set_mask, x, **kw)
    if full:
        check(set_index, x, torch.randn(5, 2, 7), **kw)


@SPLIT_DTYPES
def test_gather_scatter(dtype, tol, full):
    kw = dict(dtype=dtype, **tol)
    x, s = torch.randn(5, 6, 7), torch.randn(5, 4, 7)
    g = torch.randint(0, 6, (5, 4, 7))
    perm = torch.stack([torch.randperm(6)[:4] for _ in range(35)]).reshape(5, 7, 4).transpose(1, 2)
    if full:
        check(lambda a: a.gather(1, on(g, a)), x, **kw)
        check(lambda a, b: a.scatter(1, on(perm, a), b), x, s, **kw)
    check(lambda a, b: a.scatter_add(1, on(g, a), b), x, s, **kw)
    if full:
        check(lambda a: a.scatter(1, on(g, a), 2.5), x, **kw)
    assert_matches_cpu(lambda a, b: a.scatter(1, on(g, a), b, reduce="multiply"), x.to(dtype), s.to(dtype), **tol)
    # bfloat16: one include_self per reduction; by default the accumulating reductions (amax and
    # amin in bfloat16 run under `-m slow`)
    for red in ("sum", "prod", "mean", "amax", "amin") if full else ("sum", "prod", "mean"):
        for include_self in (True, False) if dtype == torch.float32 else (red == "mean",):
            check(
                lambda a, b: a.scatter_reduce(1, on(g, a), b, red, include_self=include_self),
                x,
                s,
                grad=red in ("sum", "mean"),
                **kw,
            )


@SPLIT_DTYPES
def test_index_ops(dtype, tol, full):
    """bfloat16 by default: the ops that add or multiply (index_add, index_reduce, put_ accumulate)
    and embedding; the pure data movement ones run in bfloat16 under `-m slow`."""
    kw = dict(dtype=dtype, **tol)
    x = torch.randn(5, 6, 7)
    ii, ic = torch.tensor([4, 0, 2, 2]), torch.tensor([4, 0, 2])
    if full:
        check(lambda a: a.index_select(1, on(ii, a)), x, **kw)
    check(lambda a, b: a.index_add(1, on(ii, a), b, alpha=2), x, torch.randn(5, 4, 7), **kw)
    if full:
        check(lambda a, b: a.index_copy(1, on(ic, a), b), x, torch.randn(5, 3, 7), **kw)
        check(lambda a: a.index_fill(2, on(ic, a), -1.5), x, **kw)
    for red, inc in (("amax", False), ("mean", True), ("prod", True)):
        assert_matches_cpu(
            lambda a, b: a.index_reduce(1, on(ii, a), b, red, include_self=inc),
            x.to(dtype),
            torch.randn(5, 4, 7).to(dtype),
            **tol,
        )
    mask = torch.rand(5, 6, 7) > 0.5
    take = torch.tensor([[0, 5], [-1, 100]])
    if full:
        check(lambda a, b: a.masked_scatter(on(mask, a), b), x, torch.randn(5, 6, 7), **kw)
        check(lambda a: a.masked_select(on(mask, a)), x, **kw)
        check(lambda a: a.take(on(take, a)), x, **kw)
    assert_matches_cpu(
        lambda a: a.clone().put_(on(take, a), on(torch.tensor([1.0, 2, 3, 4]), a), accumulate=True), x.to(dtype)
    )
    check(lambda w: F.embedding(on(torch.tensor([[1, 3], [3, 0]]), w), w), torch.randn(4, 5), **kw)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode):
    i = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets, last = torch.tensor([0, 3, 3, 6]), torch.tensor([0, 3, 3, 6, 8])
    w = torch.randn(10, 3)
    check(lambda w: F.embedding_bag(on(i, w), w, on(offsets, w), mode=mode), w)
    check(lambda w: F.embedding_bag(on(i, w), w, on(last, w), mode=mode, include_last_offset=True), w)
    check(
        lambda w: F.embedding_bag(on(i, w), w, on(offsets, w), mode=mode, padding_idx=4),
        w,
        **BF16[1],
        dtype=torch.bfloat16,
    )
    check(lambda w: F.embedding_bag(on(i.reshape(2, 4), w), w, mode=mode), w)  # 2-D input: fixed-size bags
    if mode == "sum":
        check(
            lambda w, p: F.embedding_bag(on(i, w), w, on(offsets, w), mode="sum", per_sample_weights=p),
            w,
            torch.rand(8),
        )
    # (scale_grad_by_freq is not compared: the CPU kernel scales embedding_bag gradients inconsistently)


def test_repeat_interleave():
    r = torch.tensor([1, 0, 3])
    check(lambda a: torch.repeat_interleave(a, on(r, a), dim=0), torch.randn(3, 2))
    check(lambda a: torch.repeat_interleave(a, 2, dim=1), torch.randn(3, 2))
    assert_matches_cpu(lambda a: torch.repeat_interleave(a), r)


def test_integer_indexing_and_data_dependent():
    x = torch.randint(-50, 50, (5, 6))
    assert_matches_cpu(lambda a: a[on(torch.tensor([1, -2]), a)], x)
    rows = torch.randint(0, 5, (3, 6))
    assert_matches_cpu(lambda a: a.scatter_reduce(0, on(rows, a), a[:3] * 1, "mean"), x)
    assert_matches_cpu(
        lambda a: a.index_put((on(torch.tensor([0, 0, 1]), a),), on(torch.tensor(5), a), accumulate=True), x
    )
    assert_matches_cpu(lambda a: a[a > 0], x)
    assert_matches_cpu(lambda a: torch.nonzero(a > 10), x)
    assert_matches_cpu(lambda a: torch.argwhere(a > 10), x)
    assert_matches_cpu(lambda a: torch.where(a > 10), x)
    assert_matches_cpu(lambda a: a.masked_select(a < 0), x)
    assert_matches_cpu(lambda a: torch.nonzero(a > 1000), x)  # empty result
    assert_matches_cpu(lambda a: a[a.bool()], torch.tensor([True, False, True]))


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_unique(dim):
    u = torch.randint(0, 3, (6, 4))
    u[3] = u[1]
    for kw in (dict(), dict(return_inverse=True, return_counts=True)):
        assert_matches_cpu(lambda a: torch.unique(a, dim=dim, **kw), u)
        assert_matches_cpu(lambda a: torch.unique_consecutive(a, dim=dim, **kw), u)
    assert_matches_cpu(lambda a: torch.unique(a, return_counts=True), torch.randn(30).round())


# ---------------------------------------------------------------- shape
@SPLIT_DTYPES
def test_cat_stack_split(dtype, tol, full):
    kw = dict(dtype=dtype, **tol)
    t = torch.randn(4, 5)
    check(lambda a, b: torch.cat([a, b], 1), t, torch.randn(4, 2), **kw)
    if full:
        check(
            lambda a, b: torch.cat([a, b, torch.zeros(0, device=a.device, dtype=a.dtype)]), t, torch.randn(2, 5), **kw
        )
        check(lambda a, b: torch.stack([a, b], -1), t, torch.randn(4, 5), **kw)
    check(lambda a: torch.split(a, [1, 3], 0)[1] * 2 + torch.chunk(a, 3, 1)[2].sum(), t, **kw)
    if full:
        check(lambda a: torch.unbind(a, 1)[2], t, **kw)
    assert_matches_cpu(lambda a, b: torch.cat([a, b]), torch.randint(0, 9, (2, 3)), torch.randn(1, 3))  # promotion
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        torch.cat([torch.randn(2, 3, device=TPU), torch.randn(2, 4, device=TPU)])


@SPLIT_DTYPES
def test_pad(dtype, tol, full):
    kw = dict(dtype=dtype, **tol)
    x = torch.randn(2, 3, 6, 7)
    check(lambda a: F.pad(a, (1, 2, -1, 3), value=2.5), x, **kw)
    # bfloat16 by default: reflect (its backward adds the reflected gradients)
    for mode in ("reflect", "replicate", "circular") if full else ("reflect",):
        check(lambda a: F.pad(a, (2, 1, 1, 3), mode=mode), x, **kw)
        if dtype == torch.float32 and mode != "circular":
            check(lambda a: F.pad(a, (2, 1), mode=mode), torch.randn(2, 3, 6), **kw)
            check(lambda a: F.pad(a, (1, 1, 2, 0, 1, 1), mode=mode), torch.randn(1, 2, 4, 4, 3), **kw)


@SPLIT_DTYPES
def test_rearrange(dtype, tol, full):
    """bfloat16 by default: the ones whose backward sums overlapping elements (repeat, unfold, fold)."""
    kw = dict(dtype=dtype, **tol)
    x, t = torch.randn(2, 3, 6, 7), torch.randn(4, 5)
    if full:
        check(lambda a: torch.flip(a, [0, -1]), x, **kw)
        check(lambda a: torch.roll(a, (2, -1), (1, 3)), x, **kw)
        check(lambda a: torch.roll(a, 3), x, **kw)
    check(lambda a: a.repeat(2, 1, 3), t, **kw)
    if full:
        check(lambda a: a.tril(1) + a.triu(-1), x, **kw)
        check(lambda a: torch.diag_embed(a, 1, 0, 2), t, **kw)
        check(lambda a: F.pixel_shuffle(a, 2), torch.randn(2, 8, 3, 4), **kw)
        check(lambda a: F.pixel_unshuffle(a, 2), torch.randn(2, 2, 4, 6), **kw)
    check(lambda a: F.unfold(a, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)), x, **kw)
    check(lambda a: F.fold(a, (5, 6), (2, 3), padding=1, stride=(2, 1)), torch.randn(2, 12, 18), **kw)
    assert_matches_cpu(lambda a: a.flip(0).roll(1, 1).tril(), torch.randint(0, 9, (4, 4)))


# Default run: every mode in float32 (three sizes each), bfloat16 (one size) for the interpolating
# modes in both alignments; the nearest modes in bfloat16 run under `-m slow`.
@pytest.mark.parametrize(
    "dtype,tol,mode",
    [
        pytest.param(
            *dt,
            mode,
            id=f"{dt_id}-{mode}",
            marks=pytest.mark.slow if dt_id == "bf16" and mode.startswith("nearest") else (),
        )
        for mode in ["nearest", "nearest-exact", "bilinear", "bilinear-ac", "bicubic", "bicubic-ac"]
        for dt, dt_id in ((F32, "f32"), (BF16, "bf16"))
    ],
)
def test_interpolate_2d(dtype, tol, mode):
    align = {"align_corners": True} if mode.endswith("-ac") else {}
    mode = mode.replace("-ac", "")
    x = torch.randn(2, 3, 6, 7)
    sizes = (dict(scale_factor=2), dict(size=(5, 11)), dict(scale_factor=(1.7, 0.6)))
    for size in sizes if dtype == torch.float32 else sizes[2:]:
        check(lambda a: F.interpolate(a, mode=mode, **size, **align), x, dtype=dtype, **tol)


def test_interpolate_1d_3d():
    check(lambda a: F.interpolate(a, scale_factor=2.5, mode="linear"), torch.randn(2, 3, 7))
    check(lambda a: F.interpolate(a, size=4, mode="nearest"), torch.randn(2, 3, 7))
    check(lambda a: F.interpolate(a, scale_factor=(2, 1.5, 0.5), mode="trilinear"), torch.randn(1, 2, 3, 4, 6))
    check(lambda a: F.interpolate(a, scale_factor=2, mode="nearest"), torch.randn(1, 2, 3, 4, 6))


def test_interpolate_float64_keeps_float64_weights():
    # the CPU computes source positions and weights in double for float64 data; weights rounded to
    # float32 were ~1e-6 off
    for fn, shape in [
        (lambda a: F.interpolate(a, size=(8, 7), mode="bilinear"), (2, 3, 5, 5)),
        (lambda a: F.interpolate(a, size=(8, 7), mode="bilinear", align_corners=True), (2, 3, 5, 5)),
        (lambda a: F.interpolate(a, scale_factor=1.7, mode="bicubic"), (2, 3, 5, 6)),
        (lambda a: F.interpolate(a, size=9, mode="linear"), (2, 3, 5)),
        (lambda a: F.interpolate(a, scale_factor=1.6, mode="trilinear"), (1, 2, 4, 4, 4)),
    ]:
        x = torch.randn(shape, dtype=torch.float64)
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), fn(x), rtol=1e-12, atol=1e-12)


# Default run: every padding mode with one alignment each (both alignments occur); the other
# three pairs run under `-m slow` (tests/test_ops_semantics.py sweeps grid_sample's modes further).
@pytest.mark.parametrize(
    "padding_mode,align",
    [
        pytest.param(
            p,
            a,
            id=f"{p}-{a}",
            marks=() if (p, a) in {("zeros", False), ("border", True), ("reflection", False)} else pytest.mark.slow,
        )
        for p in ["zeros", "border", "reflection"]
        for a in (False, True)
    ],
)
def test_grid_sample(padding_mode, align):
    x = torch.randn(2, 3, 5, 6)
    grid = torch.rand(2, 4, 7, 2) * 2.4 - 1.2  # some points fall outside the image
    check(
        lambda a, g: F.grid_sample(a, g, padding_mode=padding_mode, align_corners=align), x, grid, atol=1e-4, rtol=1e-4
    )
    check(
        lambda a: F.grid_sample(a, on(grid, a), mode="nearest", padding_mode=padding_mode, align_corners=align),
        x,
        atol=1e-4,
        rtol=1e-4,
    )
    if align:
        return
    theta = torch.randn(2, 2, 3) * 0.3 + torch.tensor([[1.0, 0, 0], [0, 1, 0]])
    check(
        lambda a, t: F.grid_sample(
            a, F.affine_grid(t, (2, 3, 4, 5), align_corners=False), align_corners=False, padding_mode=padding_mode
        ),
        x,
        theta,
        atol=1e-4,
        rtol=1e-4,
    )


# ---------------------------------------------------------------- printing
def test_print():
    for t in (
        torch.randn(3, 3),
        torch.randint(-5, 5, (2, 3)),
        torch.rand(4) > 0.5,
        torch.tensor([1e10, 1.5, float("nan"), float("inf")]),
        torch.randn(300, 300),
    ):
        s = str(t.to(TPU))
        assert "device='tpu:0'" in s
        assert re.sub(r",\s*device='tpu:0'", "", s) == str(t)


# ---------------------------------------------------------------- whole models
def _train(model, x, y, device, steps=2):
    import copy

    m = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(m(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
    return loss.item(), [p.detach().cpu() for p in m.parameters()] + [b.cpu() for b in m.buffers()]


def _same_training(model, x, y):
    loss_c, state_c = _train(model, x, y, "cpu")
    loss_d, state_d = _train(model, x, y, TPU)
    assert abs(loss_c - loss_d) < 1e-4
    for a, b in zip(state_c, state_d):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_cnn_training():
    nn = torch.nn
    cnn = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, stride=2),
        nn.GroupNorm(4, 16),
        nn.SiLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    _same_training(cnn, torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,)))


class _TinyTransformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 16)
        self.layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, t):
        mask = torch.nn.Transformer.generate_square_subsequent_mask(t.shape[1], device=t.device)
        return self.head(self.layer(self.emb(t), src_mask=mask, is_causal=True)[:, -1])


def test_transformer_training():
    _same_training(_TinyTransformer(), torch.randint(0, 20, (4, 6)), torch.randint(0, 10, (4,)))


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_fast_path(norm_first):
    """Eval under no_grad takes PyTorch's fused encoder-layer / MHA kernels (PrivateUse1 is a fast-path device)."""
    import copy

    nn = torch.nn
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first, activation="gelu"),
        2,
        enable_nested_tensor=False,
    ).eval()
    dev = copy.deepcopy(enc).to(TPU)
    x = torch.randn(3, 6, 16)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 5 + [True]])
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    with torch.no_grad():
        for kw in (dict(), dict(src_key_padding_mask=pad), dict(mask=causal, src_key_padding_mask=pad)):
            out = dev(x.to(TPU), **{k: v.to(TPU) for k, v in kw.items()})
            torch.testing.assert_close(out.cpu(), enc(x, **kw), atol=1e-4, rtol=1e-4)
        mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
        dmha = copy.deepcopy(mha).to(TPU)
        q, k = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
        for kw in (dict(), dict(average_attn_weights=False)):
            c, d = mha(q, k, k, **kw), dmha(q.to(TPU), k.to(TPU), k.to(TPU), **kw)
            torch.testing.assert_close(d[0].cpu(), c[0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(d[1].cpu(), c[1], atol=1e-4, rtol=1e-4)
