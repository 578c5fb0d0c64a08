"""Lowerings: the fused LSTM and GRU cells and their backward ops.

ATen's RNN cells (`nn.LSTM`, `nn.GRU`, `nn.LSTMCell`, `nn.GRUCell`, RNN.cpp) call the fused cell ops
for CUDA, XPU and PrivateUse1 inputs, where the CPU adds the two gate products and applies the
activations op by op. The gate products and the optional projection stay ordinary ops; these take
the pre-activation gates. The workspace each forward saves for its backward is CUDA's layout
(activated gates, then for the GRU `hx` and the hidden `n` gate), so a workspace means the same on
every device. The double backward goes through ATen's `_thnn_differentiable_*_cell_backward`, which
are composites of ordinary ops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .dtypes import to_opmath
from .table import lowering


def _gates(input_gates, hidden_gates, input_bias, hidden_bias, n):
    """The two gate products (with their biases) in opmath, each split into its `n` gates."""
    ig, hg = to_opmath(input_gates), to_opmath(hidden_gates)
    if input_bias is not None:
        ig = ig + to_opmath(input_bias)
    if hidden_bias is not None:
        hg = hg + to_opmath(hidden_bias)
    return jnp.split(ig, n, axis=1), jnp.split(hg, n, axis=1)


def _check_cell_sizes(input_gates, hidden_gates, input_bias, hidden_bias, factor, prev_hidden):
    """CUDA's checkSizes of a fused cell. PyTorch's meta version compares the devices of the biases
    even when they are None (a cell without bias: AttributeError), so the defined ones only here."""
    torch._check(input_gates.ndim == 2, lambda: f"{input_gates.ndim} != 2")
    torch._check(input_gates.shape == hidden_gates.shape, lambda: f"{input_gates.shape} != {hidden_gates.shape}")
    gates_size = input_gates.size(1)
    if input_bias is not None:
        torch._check(input_bias.ndim == 1, lambda: f"{input_bias.ndim} != 1")
        torch._check(input_bias.numel() == gates_size, lambda: f"{input_bias.numel()} != {gates_size}")
        torch._check(input_bias.shape == hidden_bias.shape, lambda: f"{input_bias.shape} != {hidden_bias.shape}")
    torch._check(prev_hidden.ndim == 2, lambda: f"{prev_hidden.ndim} != 2")
    expected = input_gates.size(0) * gates_size // factor
    torch._check(
        prev_hidden.numel() == expected,
        lambda: f"{prev_hidden.numel()} != {input_gates.size(0)} * {gates_size} // {factor} (aka {expected})",
    )
    others = [t for t in (hidden_gates, input_bias, hidden_bias, prev_hidden) if t is not None]
    torch._check(all(t.device == input_gates.device for t in others), lambda: "expected all inputs to be same device")


def _lstm_meta(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    _check_cell_sizes(input_gates, hidden_gates, input_bias, hidden_bias, 4, cx)
    hy = torch.empty_like(cx, memory_format=torch.contiguous_format)
    return hy, torch.empty_like(hy), torch.empty_like(input_gates, memory_format=torch.contiguous_format)


@lowering("_thnn_fused_lstm_cell", meta=_lstm_meta, real_only=True)
def thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    (ii, fi, gi, oi), (ih, fh, gh, oh) = _gates(input_gates, hidden_gates, input_bias, hidden_bias, 4)
    i, f, g, o = jax.nn.sigmoid(ii + ih), jax.nn.sigmoid(fi + fh), jnp.tanh(gi + gh), jax.nn.sigmoid(oi + oh)
    cy = f * to_opmath(cx) + i * g
    hy = o * jnp.tanh(cy)
    dt = input_gates.dtype
    return hy.astype(dt), cy.astype(dt), jnp.concatenate([i, f, g, o], axis=1).astype(dt)


@lowering("_thnn_fused_lstm_cell_backward_impl", real_only=True)
def thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return None, None, None  # as CUDA: nothing flows back
    dt = workspace.dtype
    i, f, g, o = jnp.split(to_opmath(workspace), 4, axis=1)
    c = to_opmath(cx)
    tanh_cy = jnp.tanh(to_opmath(cy))
    gh = to_opmath(grad_hy) if grad_hy is not None else jnp.zeros_like(c)
    gcy = to_opmath(grad_cy) if grad_cy is not None else jnp.zeros_like(c)
    # CUDA's kernel: the cell state's gradient first, then each gate's through its activation
    gc = gh * o * (1 - tanh_cy * tanh_cy) + gcy
    grad_gates = jnp.concatenate(
        [gc * g * (1 - i) * i, gc * c * (1 - f) * f, gc * i * (1 - g * g), gh * tanh_cy * (1 - o) * o], axis=1
    ).astype(dt)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, (gc * f).astype(dt), grad_bias


def _gru_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """PyTorch ships `_thnn_fused_gru_cell` without a Meta kernel: CUDA's checks and shapes."""
    _check_cell_sizes(input_gates, hidden_gates, input_bias, hidden_bias, 3, hx)
    hy = torch.empty_like(hx, memory_format=torch.contiguous_format)
    workspace = input_gates.new_empty((hx.shape[0], 5 * hx.shape[1]))
    return hy, workspace


def _gru_backward_meta(grad_hy, workspace, has_bias):
    """PyTorch ships `_thnn_fused_gru_cell_backward` without a Meta kernel: CUDA's shapes."""
    torch._check(grad_hy.dim() == 2 and workspace.dim() == 2, lambda: "grad_hy and workspace must be 2-d")
    n, h = grad_hy.shape
    torch._check(tuple(workspace.shape) == (n, 5 * h), lambda: "workspace must be of size [batch, 5 * hidden]")
    biases = (grad_hy.new_empty((3 * h,)), grad_hy.new_empty((3 * h,))) if has_bias else (None, None)
    return (grad_hy.new_empty((n, 3 * h)), grad_hy.new_empty((n, 3 * h)), grad_hy.new_empty((n, h)), *biases)


@lowering("_thnn_fused_gru_cell", missing_meta=_gru_meta, real_only=True)
def thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    (ri, zi, ni), (rh, zh, nh) = _gates(input_gates, hidden_gates, input_bias, hidden_bias, 3)
    r, z = jax.nn.sigmoid(ri + rh), jax.nn.sigmoid(zi + zh)
    n = jnp.tanh(ni + r * nh)
    h = to_opmath(hx)
    hy = n + z * (h - n)
    dt = input_gates.dtype
    return hy.astype(dt), jnp.concatenate([r, z, n, h, nh], axis=1).astype(dt)


@lowering("_thnn_fused_gru_cell_backward", missing_meta=_gru_backward_meta, real_only=True)
def thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    dt = grad_hy.dtype
    r, z, n, h, nh = jnp.split(to_opmath(workspace), 5, axis=1)
    go = to_opmath(grad_hy)
    gz = go * (h - n) * (1 - z) * z
    gn = go * (1 - z) * (1 - n * n)
    gr = gn * nh * (1 - r) * r
    grad_input_gates = jnp.concatenate([gr, gz, gn], axis=1).astype(dt)
    grad_hidden_gates = jnp.concatenate([gr, gz, gn * r], axis=1).astype(dt)
    grad_hx = (go * z).astype(dt)
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return grad_input_gates, grad_hidden_gates, grad_hx, grad_input_gates.sum(0), grad_hidden_gates.sum(0)
