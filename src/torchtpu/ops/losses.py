"""Lowerings: loss functions (nll, mse, smooth L1, Huber, binary cross entropy, margin losses, CTC)
and their backward ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .checks import require, require_index
from .dtypes import INTEGERS, NOT_FLOATING, WIDE_UNSIGNED, not_implemented_for, scalar_type_name, to_opmath
from .nn_common import _grad_input_meta
from .table import lowering

# the CPU computes these losses in floating types only (multi_margin and multilabel_margin not in half ones)
_HALF_TOO = (*NOT_FLOATING, torch.float16, torch.bfloat16)


def _sizes(t):
    return "[" + ", ".join(str(n) for n in t.shape) + "]"


def _check_target_dtype(target):
    if target.dtype not in (torch.int64, torch.uint8):
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {scalar_type_name(target.dtype)}")


def _long_target(op, target_at):
    """meta= of the nll losses: PyTorch's meta kernel gathers with the target, which refuses the uint8
    class indices the CPU's and CUDA's kernels take; their meaning is the same as int64's."""

    def meta(*args, **kwargs):
        if args[target_at].dtype == torch.uint8:
            args = (*args[:target_at], args[target_at].long(), *args[target_at + 1 :])
        return op(*args, **kwargs)

    return meta


def _nll_loss_check(a, target, weight, reduction, ignore_index, **out):
    """The CPU's checks of nll_loss_forward, in its order and words (PyTorch's meta kernel asserts)."""
    _check_target_dtype(target)
    if not 0 < a.dim() <= 2:
        raise RuntimeError("input tensor should be 1D or 2D")
    if target.dim() > 1:
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if not (a.dim() == 1 and target.dim() == 0) and a.shape[0] != target.shape[0]:
        raise RuntimeError(f"size mismatch (got input: {_sizes(a)}, target: {_sizes(target)})")
    classes = a.shape[-1]
    if weight is not None and (weight.dim() != 1 or weight.numel() != classes):
        raise RuntimeError(
            f"weight tensor should be defined either for all {classes} classes or no classes but got weight "
            f"tensor of shape: {_sizes(weight)}"
        )


def _nll_loss2d_check(a, target, weight, reduction, ignore_index, **out):
    """The CPU's checks of nll_loss2d_forward, in its order and words."""
    _check_target_dtype(target)
    if target.dim() != 3:
        raise RuntimeError(
            f"only batches of spatial targets supported (3D tensors) but got targets of dimension: {target.dim()}"
        )
    if a.dim() != 4:
        raise RuntimeError(
            f"only batches of spatial inputs supported (4D tensors), but got input of dimension: {a.dim()}"
        )
    if weight is not None and weight.numel() != a.shape[1]:
        raise RuntimeError("weight tensor should be defined either for all or no classes")
    if (a.shape[0], *a.shape[2:]) != tuple(target.shape):
        raise RuntimeError(f"size mismatch (got input: {_sizes(a)} , target: {_sizes(target)}")
    if target.dtype != torch.int64:
        raise RuntimeError(f"expected scalar type Long but found {scalar_type_name(target.dtype)}")


@lowering(
    "nll_loss_forward",
    "nll_loss2d_forward",
    real_only=True,
    meta_check={
        "nll_loss_forward.default": _nll_loss_check,
        "nll_loss_forward.output": _nll_loss_check,
        "nll_loss2d_forward.default": _nll_loss2d_check,
        "nll_loss2d_forward.output": _nll_loss2d_check,
    },
    meta={"nll_loss_forward": _long_target(torch.ops.aten.nll_loss_forward.default, 1)},
    no_loop_for=NOT_FLOATING,
)
def nll_loss_forward(a, target, weight, reduction, ignore_index):
    x = a if a.ndim > 1 else a[None]
    t = (target if target.ndim else target[None]).astype(jnp.int32 if target.dtype == jnp.uint8 else target.dtype)
    valid = t != ignore_index
    classes = x.shape[1]
    require(
        ~valid | ((t >= 0) & (t < classes)),
        f"Target is out of bounds: class indices must be in 0..{classes - 1} (or ignore_index={ignore_index})",
    )
    safe = jnp.where(valid, t, 0)
    picked = to_opmath(jnp.take_along_axis(x, jnp.expand_dims(safe, 1), axis=1).squeeze(1))
    w = to_opmath(weight)[safe] if weight is not None else jnp.ones_like(picked)
    w = jnp.where(valid, w, 0)
    losses = -picked * w
    if reduction == 0:
        return (losses if a.ndim > 1 else losses[0]).astype(a.dtype), jnp.zeros((), a.dtype)
    total = jnp.sum(w)  # accumulated in float32, also for half inputs
    if reduction == 1:
        return (jnp.sum(losses) / total).astype(a.dtype), total.astype(a.dtype)
    return jnp.sum(losses).astype(a.dtype), total.astype(a.dtype)


@lowering(
    "nll_loss_backward",
    "nll_loss2d_backward",
    meta={"nll_loss_backward": _long_target(torch.ops.aten.nll_loss_backward.default, 2)},
)
def nll_loss_backward(grad, a, target, weight, reduction, ignore_index, total_weight):
    x = a if a.ndim > 1 else a[None]
    t = (target if target.ndim else target[None]).astype(jnp.int32 if target.dtype == jnp.uint8 else target.dtype)
    valid = t != ignore_index
    classes = x.shape[1]
    require(
        ~valid | ((t >= 0) & (t < classes)),
        f"Target is out of bounds: class indices must be in 0..{classes - 1} (or ignore_index={ignore_index})",
    )
    safe = jnp.where(valid, t, 0)
    w = weight[safe] if weight is not None else jnp.ones(safe.shape, a.dtype)
    w = jnp.where(valid, w, 0).astype(a.dtype)
    g = grad if reduction == 0 else jnp.broadcast_to(grad, w.shape)
    if reduction == 1:
        g = g / total_weight
    if reduction == 0 and a.ndim == 1:
        g = g[None]
    onehot = jax.nn.one_hot(safe, x.shape[1], dtype=a.dtype, axis=1)
    shape = (x.shape[0], 1) + x.shape[2:]
    out = -onehot * (g * w).reshape(shape)
    return out if a.ndim > 1 else out[0]


def _reduce(loss, reduction, dtype):
    if reduction == 1:
        loss = jnp.mean(loss)
    elif reduction == 2:
        loss = jnp.sum(loss)
    return loss.astype(dtype)


def _loss_grad(grad, x, reduction):
    g = to_opmath(grad)
    return g / x.size if reduction == 1 else g


@lowering("mse_loss", real_only=True, no_loop_for=NOT_FLOATING)
def mse_loss(x, t, reduction=1):
    return _reduce(jnp.square(to_opmath(x) - to_opmath(t)), reduction, x.dtype)


@lowering("mse_loss_backward")
def mse_loss_backward(grad, x, t, reduction):
    return (2 * (to_opmath(x) - to_opmath(t)) * _loss_grad(grad, x, reduction)).astype(x.dtype)


def _smooth_l1(d, beta):
    a = jnp.abs(d)
    return jnp.where(a < beta, 0.5 * d * d / jnp.where(beta == 0, 1, beta), a - 0.5 * beta)


@lowering("smooth_l1_loss", real_only=True, no_loop_for=NOT_FLOATING)
def smooth_l1_loss(x, t, reduction=1, beta=1.0):
    d = to_opmath(x) - to_opmath(t)
    return _reduce(jnp.abs(d) if beta == 0 else _smooth_l1(d, beta), reduction, x.dtype)


@lowering("smooth_l1_loss_backward")
def smooth_l1_loss_backward(grad, x, t, reduction, beta):
    d = to_opmath(x) - to_opmath(t)
    g = jnp.sign(d) if beta == 0 else jnp.where(jnp.abs(d) < beta, d / (beta or 1), jnp.sign(d))
    return (g * _loss_grad(grad, x, reduction)).astype(x.dtype)


@lowering("huber_loss", real_only=True, no_loop_for=NOT_FLOATING)
def huber_loss(x, t, reduction=1, delta=1.0):
    d = to_opmath(x) - to_opmath(t)
    a = jnp.abs(d)
    return _reduce(jnp.where(a < delta, 0.5 * d * d, delta * (a - 0.5 * delta)), reduction, x.dtype)


@lowering("huber_loss_backward")
def huber_loss_backward(grad, x, t, reduction, delta):
    d = to_opmath(x) - to_opmath(t)
    g = jnp.where(d < -delta, -delta, jnp.where(d > delta, delta, d))
    return (g * _loss_grad(grad, x, reduction)).astype(x.dtype)


@lowering("binary_cross_entropy", real_only=True, no_loop_for=NOT_FLOATING)
def binary_cross_entropy(x, t, weight=None, reduction=1):
    xf, tf = to_opmath(x), to_opmath(t)
    require((xf >= 0) & (xf <= 1), "all elements of input should be between 0 and 1")
    # PyTorch clamps the logs at -100 so that 0 and 1 give finite losses
    loss = -(tf * jnp.maximum(jnp.log(xf), -100) + (1 - tf) * jnp.maximum(jnp.log1p(-xf), -100))
    if weight is not None:
        loss = loss * to_opmath(weight)
    return _reduce(loss, reduction, x.dtype)


@lowering("binary_cross_entropy_backward")
def binary_cross_entropy_backward(grad, x, t, weight=None, reduction=1):
    xf, tf = to_opmath(x), to_opmath(t)
    g = (xf - tf) / jnp.maximum((1 - xf) * xf, 1e-12) * _loss_grad(grad, x, reduction)
    if weight is not None:
        g = g * to_opmath(weight)
    return g.astype(x.dtype)


@lowering("binary_cross_entropy_with_logits", real_only=True, no_loop_for=NOT_FLOATING)
def binary_cross_entropy_with_logits(x, t, weight=None, pos_weight=None, reduction=1):
    xf, tf = to_opmath(x), to_opmath(t)
    softplus_neg = jnp.log1p(jnp.exp(-jnp.abs(xf))) + jnp.maximum(-xf, 0)  # log(1 + exp(-x))
    if pos_weight is not None:
        loss = (1 - tf) * xf + (1 + (to_opmath(pos_weight) - 1) * tf) * softplus_neg
    else:
        loss = (1 - tf) * xf + softplus_neg
    if weight is not None:
        loss = loss * to_opmath(weight)
    return _reduce(loss, reduction, x.dtype)


def _soft_margin_loop_check(x, t, *_, **__):
    """The CPU computes soft_margin_loss as in-place steps on -x in x's dtype: an integer x fails at its
    exp_ ("result type Float can't be cast"), a wide unsigned one at neg."""
    if x.dtype in WIDE_UNSIGNED:
        raise not_implemented_for("neg", x.dtype)
    if x.dtype in INTEGERS:
        raise RuntimeError(f"result type Float can't be cast to the desired output type {scalar_type_name(x.dtype)}")


@lowering(
    "soft_margin_loss", meta_check=dict.fromkeys(("soft_margin_loss", "soft_margin_loss.out"), _soft_margin_loop_check)
)
def soft_margin_loss(x, t, reduction=1):
    return _reduce(jnp.log1p(jnp.exp(-to_opmath(t) * to_opmath(x))), reduction, x.dtype)


@lowering("soft_margin_loss_backward")
def soft_margin_loss_backward(grad, x, t, reduction):
    z = jnp.exp(-to_opmath(t) * to_opmath(x))
    return (-to_opmath(t) * z / (1 + z) * _loss_grad(grad, x, reduction)).astype(x.dtype)


def _long_target_check(target):
    """The CPU reads a margin loss's target as int64 once the shapes are checked (any other dtype raises)."""
    if target.dtype != torch.int64:
        raise RuntimeError(f"expected scalar type Long but found {scalar_type_name(target.dtype)}")


def _multi_margin(x, target, p, margin, weight, reduction):
    c = x.shape[-1] if x.ndim else 1  # a 0-d input is one sample of one class
    x2 = to_opmath(x).reshape(-1, c)
    t = target.reshape(-1)
    picked = jnp.take_along_axis(x2, t[:, None], axis=1)
    z = margin - picked + x2
    h = jnp.where(z > 0, jnp.where(p == 1, z, z * z), 0)  # p is a traced Scalar
    if weight is not None:
        h = h * to_opmath(weight)[t][:, None]
    h = jnp.where(jnp.arange(x2.shape[1])[None, :] == t[:, None], 0, h)  # the target class itself
    loss = jnp.sum(h, axis=1) / x2.shape[1]
    # (no reduction: one loss per sample, 0-d for a 0-d target, as the CPU's)
    return _reduce(loss.reshape(target.shape), reduction, x.dtype)


def _multi_margin_meta(x, target, p=1, margin=1, weight=None, reduction=1):
    """The CPU's shape rules (multi_margin_loss_shape_check): the loss is 0-d for a 0-d target even
    without reduction (PyTorch's meta kernel gives (1,)), and its errors in its words."""
    n = x.dim()
    if not ((n == 2 and x.shape[1] != 0) or (n == 1 and x.shape[0] != 0) or n == 0):
        raise RuntimeError(
            f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {list(x.shape)}"
        )
    frames, dim = (1, x.shape[0] if n else 1) if n <= 1 else tuple(x.shape)
    if not (target.dim() <= 1 and target.numel() == frames):
        raise RuntimeError(
            "multi_margin_loss: target tensor should be 1-D with size equal to the number of input samples "
            f"(batch size). Expected target size [{frames}], but got {list(target.shape)}. Input has shape "
            f"{list(x.shape)}."
        )
    if weight is not None and not (weight.dim() <= 1 and weight.numel() == dim):
        raise RuntimeError(f"inconsistent weight size, expected {dim} but got {list(weight.shape)}")
    _long_target_check(target)
    return x.new_empty((frames,) if reduction == 0 and target.dim() > 0 else ())


@lowering("multi_margin_loss", real_only=True, meta=_multi_margin_meta, no_loop_for=_HALF_TOO)
def multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=1):
    require_index(target, x.shape[-1] if x.ndim else 1, False, "target out of range")
    return _multi_margin(x, target, p, margin, weight, reduction)


@lowering("multi_margin_loss_backward", missing_meta=_grad_input_meta)
def multi_margin_loss_backward(grad, x, target, p, margin, weight=None, reduction=1):
    v = to_opmath(x)  # (float64 stays float64: a float32 loss refused a float64 cotangent)
    _, vjp = jax.vjp(lambda v: _multi_margin(v, target, p, margin, weight, reduction).astype(v.dtype), v)
    return vjp(to_opmath(grad).astype(v.dtype))[0].astype(x.dtype)


def _multilabel_margin(x, target, reduction, is_target=None):
    c = x.shape[-1] if x.ndim else 1
    x2, t = to_opmath(x).reshape(-1, c), target.reshape(-1, c)
    valid = jnp.cumprod(t != -1, axis=1).astype(bool)  # the targets are the prefix before the first -1
    if is_target is None:
        is_target = jnp.any((t[:, :, None] == jnp.arange(c)) & valid[:, :, None], axis=1).astype(x.dtype)
    picked = jnp.take_along_axis(x2, jnp.where(valid, t, 0), axis=1)  # (N, targets)
    z = jnp.maximum(1 - picked[:, :, None] + x2[:, None, :], 0)  # (N, targets, C)
    z = z * valid[:, :, None] * (1 - to_opmath(is_target).reshape(-1, c))[:, None, :]
    loss = jnp.sum(z, axis=(1, 2)) / c
    # (a 0-d input may come with a one-element 1-D target: is_target takes the target's shape)
    return _reduce(loss.reshape(x.shape[:-1]), reduction, x.dtype), is_target.reshape(target.shape)


def _multilabel_margin_meta(x, target, reduction):
    """The CPU's shape rules (multilabel_margin_loss_shape_check): a 0-d input takes a 0-d or one-element
    target, and the loss is 0-d for targets of at most one dimension even without reduction. PyTorch's
    meta kernel (its decomposition) makes both 2-D first: a (1,) loss, or an "inconsistent target size"."""
    n = x.dim()
    if not ((n == 2 and x.shape[1] != 0) or (n == 1 and x.shape[0] != 0) or n == 0):
        raise RuntimeError(
            f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {list(x.shape)}"
        )
    frames, dim = (1, x.shape[0] if n else 1) if n <= 1 else tuple(x.shape)
    fits = target.dim() <= 1 and target.numel() == dim if n <= 1 else tuple(target.shape) == (frames, dim)
    if not fits:
        raise RuntimeError(f"inconsistent target size: {list(target.shape)} for input of size: {list(x.shape)}")
    _long_target_check(target)
    loss_shape = () if reduction != 0 or target.dim() <= 1 else (frames,)
    return x.new_empty(loss_shape), x.new_empty(target.shape)


@lowering("multilabel_margin_loss_forward", real_only=True, meta=_multilabel_margin_meta, no_loop_for=_HALF_TOO)
def multilabel_margin_loss_forward(x, target, reduction):
    c = x.shape[-1] if x.ndim else 1
    require((target >= -1) & (target < c), "argument #2 'target' is out of range")  # -1 ends the list
    return _multilabel_margin(x, target, reduction)


@lowering("multilabel_margin_loss_backward", missing_meta=_grad_input_meta)
def multilabel_margin_loss_backward(grad, x, target, reduction, is_target):
    v = to_opmath(x)  # (float64 stays float64: a float32 loss refused a float64 cotangent)
    _, vjp = jax.vjp(lambda v: _multilabel_margin(v, target, reduction, is_target)[0].astype(v.dtype), v)
    return vjp(to_opmath(grad).astype(v.dtype))[0].astype(x.dtype)


# ---------------------------------------------------------------- CTC loss
# PyTorch's CPU kernel (LossCTC.cpp), vectorized over the batch: log-space alpha (forward) and beta
# (backward) recursions over time (Graves et al. 2006, eq. 6-16) with lax.scan. The extended target
# l' is blank, l1, blank, l2, ..., blank (2 * max_target_length + 1 states); states beyond a row's
# 2 * target_length and steps beyond its input_length take no part. The lengths are int lists in the
# schema (ctc_loss moves tensor lengths to the host first, as on CUDA), so they are baked in.
def _ctc_lse3(a, b, c):
    """log(e^a + e^b + e^c) as the CPU kernel computes it (shift by the max, 0 when all are -inf)."""
    m = jnp.maximum(jnp.maximum(a, b), c)
    m = jnp.where(m == -jnp.inf, 0, m)
    return jnp.log(jnp.exp(a - m) + jnp.exp(b - m) + jnp.exp(c - m)) + m


def _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank):
    """(l' labels (N, S'), log_probs at l' (T, N, S') with -inf beyond each row's states, the mask of
    states s whose s-2 transition is allowed (N, S'), input and target lengths as arrays)."""
    if log_probs.size == 0:  # the CPU kernel's check; PyTorch's meta kernel does not make it
        raise RuntimeError("log_probs tensor must not be empty")
    n, classes = log_probs.shape[1], log_probs.shape[2]
    tl = np.asarray(target_lengths, np.int64)
    width = 2 * (int(tl.max()) if n else 0) + 1
    j = np.arange(width // 2)
    valid = j[None, :] < tl[:, None]  # (N, max_target_length)
    if targets.ndim == 1:  # concatenated targets
        offsets = np.concatenate([[0], np.cumsum(tl)[:-1]]).astype(np.int64)
        labels = (
            targets[np.where(valid, offsets[:, None] + j[None, :], 0)]
            if valid.size
            else jnp.zeros(valid.shape, targets.dtype)
        )
    else:
        labels = targets[:, : width // 2]
    labels = labels.astype(jnp.int32)
    require(
        ~jnp.asarray(valid) | ((labels >= 0) & (labels < classes)),
        f"ctc_loss: targets must be class indices in [0, {classes})",
    )
    labels = jnp.where(jnp.asarray(valid), labels, blank)
    ext = jnp.full((n, width), blank, jnp.int32).at[:, 1::2].set(labels)
    s = np.arange(width)
    states = jnp.asarray(s[None, :] <= 2 * tl[:, None])  # (N, S')
    lp_ext = jnp.take_along_axis(log_probs, jnp.broadcast_to(ext[None], (log_probs.shape[0],) + ext.shape), 2)
    lp_ext = jnp.where(states[None], lp_ext, -jnp.inf)
    skip = (
        jnp.concatenate([jnp.zeros((n, 2), bool), ext[:, 2:] != ext[:, :-2]], 1)
        if width > 2
        else jnp.zeros((n, width), bool)
    )
    return ext, lp_ext, skip, jnp.asarray(np.asarray(input_lengths, np.int64)), jnp.asarray(tl)


def _ctc_shifted(x, by, fill):
    """x[:, s - by] over the states s (a negative `by` looks ahead), `fill` where that is outside;
    the width stays x's, also when it is under |by| (every target empty: one state)."""
    width = x.shape[1]
    pad = ((0, 0), (by, 0)) if by > 0 else ((0, 0), (0, -by))
    padded = jnp.pad(x, pad, constant_values=fill)
    return padded[:, :width] if by > 0 else padded[:, -by : -by + width]


def _ctc_alpha(lp_ext, skip, il):
    """log alpha (T, N, S'); rows t >= input_length repeat the last computed one."""
    first = jnp.full(lp_ext.shape[1:], -jnp.inf, lp_ext.dtype)
    first = first.at[:, :2].set(lp_ext[0, :, :2])

    def step(alpha, xs):
        t, lp_t = xs
        a1 = _ctc_shifted(alpha, 1, -jnp.inf)
        a2 = jnp.where(skip, _ctc_shifted(alpha, 2, -jnp.inf), -jnp.inf)
        new = jnp.where((t < il)[:, None], _ctc_lse3(alpha, a1, a2) + lp_t, alpha)
        return new, new

    ts = jnp.arange(1, lp_ext.shape[0])
    last, rest = lax.scan(step, first, (ts, lp_ext[1:]))
    return jnp.concatenate([first[None], rest], 0), last


def _ctc_nll(last, il, tl):
    """-log p(l|x) from alpha at each row's last step: eq. (8)."""
    n = last.shape[0]
    idx = (2 * tl).astype(jnp.int32)
    l1 = last[jnp.arange(n), idx]
    l2 = jnp.where(tl > 0, last[jnp.arange(n), jnp.maximum(idx - 1, 0)], -jnp.inf)
    m = jnp.maximum(l1, l2)
    m = jnp.where(m == -jnp.inf, 0, m)
    ll = jnp.log(jnp.exp(l1 - m) + jnp.exp(l2 - m)) + m
    # no input steps: the empty target has probability 1, any other 0 (as the CPU kernel)
    ll = jnp.where(il > 0, ll, jnp.where(tl == 0, 0, -jnp.inf).astype(ll.dtype))
    return -ll


def _ctc_loss_backward_meta(grad, log_probs, *args, **kwargs):
    return torch.empty_like(log_probs)


@lowering("_ctc_loss")
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _, lp_ext, skip, il, tl = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    alpha, last = _ctc_alpha(lp_ext, skip, il)
    # zero_infinity is applied by the composite ctc_loss around this op (where(res == inf, 0, res))
    return _ctc_nll(last, il, tl), jnp.transpose(alpha, (1, 0, 2))


@lowering("_ctc_loss_backward", missing_meta=_ctc_loss_backward_meta)
def ctc_loss_backward(
    grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank, zero_infinity=False
):
    ext, lp_ext, skip, il, tl = _ctc_setup(log_probs, targets, input_lengths, target_lengths, blank)
    steps, n, width = lp_ext.shape
    alpha = jnp.transpose(log_alpha, (1, 0, 2))
    s = jnp.arange(width)
    # beta at each row's last step: eq. (10), the final blank and the last label
    end = jnp.where(
        (s[None, :] == 2 * tl[:, None]) | ((s[None, :] == 2 * tl[:, None] - 1) & (tl[:, None] > 0)), 0, -jnp.inf
    ).astype(lp_ext.dtype)
    skip_up = _ctc_shifted(skip, -2, False)  # s -> s+2 allowed

    def step(beta, xs):
        t, lp_t = xs
        b1 = _ctc_shifted(beta, -1, -jnp.inf)
        b2 = jnp.where(skip_up, _ctc_shifted(beta, -2, -jnp.inf), -jnp.inf)
        new = jnp.where(
            (t == il - 1)[:, None],
            end + lp_t,
            jnp.where((t < il - 1)[:, None], _ctc_lse3(beta, b1, b2) + lp_t, -jnp.inf),
        )
        return new, new

    _, beta = lax.scan(step, jnp.full((n, width), -jnp.inf, lp_ext.dtype), (jnp.arange(steps), lp_ext), reverse=True)
    # log of sum over the states s with l'_s = c of alpha_t(s) beta_t(s): eq. (16)'s sum, per class
    ab = alpha + beta  # (T, N, S')
    # a last target equal to blank (invalid input the CPU accepts): at the last step the CPU kernel
    # assigns the last label's term over the final blank's instead of adding them; do the same
    last_label = jnp.take_along_axis(ext, jnp.maximum(2 * tl - 1, 0).astype(jnp.int32)[:, None], 1)[:, 0]
    overwritten = (tl > 0) & (last_label == blank)
    ab = jnp.where(
        (jnp.arange(steps)[:, None, None] == il[None, :, None] - 1)
        & overwritten[None, :, None]
        & (s == 2 * tl[:, None])[None],
        -jnp.inf,
        ab,
    )
    t_idx, n_idx = jnp.arange(steps)[:, None, None], jnp.arange(n)[None, :, None]
    c_idx = jnp.broadcast_to(ext[None], ab.shape)
    peak = jnp.full(log_probs.shape, -jnp.inf, ab.dtype).at[t_idx, n_idx, c_idx].max(ab)
    shift = jnp.where(peak == -jnp.inf, 0, peak)
    total = jnp.zeros(log_probs.shape, ab.dtype).at[t_idx, n_idx, c_idx].add(jnp.exp(ab - shift[t_idx, n_idx, c_idx]))
    lab = jnp.log(total) + shift
    # the CPU's gradient (as if log_probs came from log_softmax): exp(lp) - exp(lab + nll - lp)
    g = (jnp.exp(log_probs) - jnp.exp(lab + nll[None, :, None] - log_probs)) * grad[None, :, None]
    keep = jnp.arange(steps)[:, None] < il[None, :]
    if zero_infinity:
        keep = keep & (nll != jnp.inf)[None, :]
    return jnp.where(keep[..., None], g, 0).astype(log_probs.dtype)
