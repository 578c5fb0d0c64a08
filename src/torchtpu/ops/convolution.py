"""Lowerings: convolution (plain and transposed, any groups) and its backward."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax
from torch._prims_common import suggest_memory_format

from .dtypes import WIDE_UNSIGNED, not_implemented_for, scalar_type_name
from .nn_common import _low, _precision
from .table import lowering


def _conv_dims(nd):
    spatial = "DHW"[3 - nd :] if nd <= 3 else None
    return ("NC" + spatial, "OI" + spatial, "NC" + spatial)


def _integer_convolution_check(x):
    """XLA:TPU has no 64-bit integer convolution (compiling one fails): refused at the op when tracing
    for a TPU, in CUDA's words for a dtype a kernel lacks. XLA:CPU computes it, as the CPU does."""
    if x.dtype in (jnp.int64, jnp.uint64):
        from ..device.platform import lowering_platform

        if lowering_platform() == "tpu":
            raise RuntimeError(
                f"\"convolution_tpu\" not implemented for '{scalar_type_name(x.dtype)}': XLA:TPU "
                f"has no 64-bit integer convolution (compute it in int32 or a floating dtype "
                f"on the TPU)"
            )


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    """PyTorch's convolution (no bias) on batched input: the output in float32 for half inputs."""
    _integer_convolution_check(x)
    nd = x.ndim - 2
    stride, padding, dilation = (list(v) * nd if len(v) == 1 else list(v) for v in (stride, padding, dilation))
    acc = jnp.float32 if _low(x) else None
    if not transposed:
        return lax.conv_general_dilated(
            x,
            w,
            window_strides=stride,
            padding=[(p, p) for p in padding],
            rhs_dilation=dilation,
            feature_group_count=groups,
            dimension_numbers=_conv_dims(nd),
            precision=_precision(),
            preferred_element_type=acc,
        )
    output_padding = list(output_padding) * nd if len(output_padding) == 1 else list(output_padding)
    # transposed: a dilated-input convolution with the kernel flipped and its in/out swapped per group
    cin, cout_g = w.shape[0], w.shape[1]
    k = w.shape[2:]
    w = w.reshape((groups, cin // groups, cout_g) + k)
    w = jnp.swapaxes(w, 1, 2).reshape((groups * cout_g, cin // groups) + k)
    w = jnp.flip(w, axis=tuple(range(2, 2 + nd)))
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op) for kk, d, p, op in zip(k, dilation, padding, output_padding)]
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=[1] * nd,
        padding=pads,
        lhs_dilation=stride,
        rhs_dilation=dilation,
        feature_group_count=groups,
        dimension_numbers=_conv_dims(nd),
        precision=_precision(),
        preferred_element_type=acc,
    )


def _convolution_meta(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """PyTorch's meta kernel leaves a convolution's output contiguous (it cannot tell the device); the
    CPU kernels lay it out channels_last when the input or the weight is, except the 3-d ones in
    (complex) double precision, and in half precision where this CPU has no oneDNN path for it
    (bf16 needs AVX512; fp16 AMX-FP16): those have no channels_last path on the CPU."""
    out = torch.ops.aten.convolution.default(x, w, bias, stride, padding, dilation, transposed, output_padding, groups)
    if out.dim() == 5 and x.dtype in _contiguous_3d_dtypes():
        return out
    for t in (x, w):
        layout = suggest_memory_format(t)
        if layout is not torch.contiguous_format and t.dim() == out.dim():
            return out.contiguous(memory_format=layout)
    return out


@functools.cache
def _contiguous_3d_dtypes():
    dtypes = {torch.float64, torch.complex128}
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        dtypes.add(torch.bfloat16)
    if not torch.ops.mkldnn._is_mkldnn_fp16_supported():
        dtypes.add(torch.float16)
    return frozenset(dtypes)


def _expanded(values, name, nd):
    """One value per spatial dimension, as the CPU expands a convolution's parameter (or refuses it)."""
    values = list(values)
    if len(values) == 1:
        return values * nd
    if len(values) != nd:
        raise RuntimeError(
            f"expected {name} to be a single integer value or a list of {nd} values to match the "
            f"convolution dimensions, but got {name}={values}"
        )
    return values


def _convolution_check(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """The CPU's argument checks of a convolution, in its order and words (PyTorch's meta kernel checks
    the channels first, in other words, and computes a negative padding of a 3-d convolution); then
    the transposed convolutions' missing loops."""
    nd = w.dim() - 2
    if nd <= 0:
        raise RuntimeError("weight should have at least three dimensions")
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    stride, padding, dilation = (
        _expanded(v, n, nd) for v, n in ((stride, "stride"), (padding, "padding"), (dilation, "dilation"))
    )
    output_padding = _expanded(output_padding, "output_padding", nd)
    shape = list(w.shape)
    for bad, words in (
        (any(p < 0 for p in padding), "negative padding is not supported"),
        (any(p < 0 for p in output_padding), "negative output_padding is not supported"),
        (any(s <= 0 for s in stride), "non-positive stride is not supported"),
        (any(d < 0 for d in dilation), "dilation should be greater than zero"),
        (
            x.dim() != w.dim(),
            f"Expected {w.dim()}-dimensional input for {w.dim()}-dimensional weight {shape}, but "
            f"got {x.dim()}-dimensional input of size {list(x.shape)} instead",
        ),
        (
            shape[0] < groups,
            f"Given groups={groups}, expected weight to be at least {groups} at dimension 0, but "
            f"got weight of size {shape} instead",
        ),
        (
            shape[0] % groups != 0,
            f"Given groups={groups}, expected weight to be divisible by {groups} at dimension "
            f"0, but got weight of size [{shape}] instead",
        ),
    ):
        if bad:
            raise RuntimeError(words)
    channels = shape[0] if transposed else shape[1] * groups
    if x.shape[1] != channels:
        given = f"transposed={int(transposed)}" if transposed else f"groups={groups}"
        raise RuntimeError(
            f"Given {given}, weight of size {shape}, expected input{list(x.shape)} to have {channels} channels, "
            f"but got {x.shape[1]} channels instead"
        )
    outs = shape[1] * groups if transposed else shape[0]
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != outs):
        given = f"transposed={int(transposed)}, weight" if transposed else "weight"
        raise RuntimeError(
            f"Given {given} of size {shape}, expected bias to be 1-dimensional with {outs} elements, but got "
            f"bias of size {list(bias.shape)} instead"
        )
    if not transposed:
        padded = [n + 2 * p for n, p in zip(x.shape[2:], padding)]
        kernel = [d * (k - 1) + 1 for k, d in zip(shape[2:], dilation)]
        if any(n < k for n, k in zip(padded, kernel)):
            raise RuntimeError(
                f"Calculated padded input size per channel: ({' x '.join(map(str, padded))}). Kernel size: "
                f"({' x '.join(map(str, kernel))}). Kernel size can't be greater than actual input size"
            )
    if any(d == 0 for d in dilation):
        raise RuntimeError("non-positive dilation is not supported")
    if transposed and not all(o < s or o < d for o, s, d in zip(output_padding, stride, dilation)):
        # the CPU runs a 1-d one as a 2-d one of height 1
        axes = ("depth", "height", "width")[3 - max(nd, 2) :]
        lead = [[0], [1], [1]] if nd == 1 else [[], [], []]
        got = " ".join(
            f"{name}_{axis}: {v}"
            for name, vs, pre in zip(("output_padding", "stride", "dilation"), (output_padding, stride, dilation), lead)
            for axis, v in zip(axes, pre + vs)
        )
        raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got {got}")
    # the CPU's transposed convolutions have no uint8/int8/int16/int32 loop (its other ones do)
    if transposed and x.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32):
        raise not_implemented_for(f"slow_conv_transpose{x.dim() - 2 if x.dim() == 5 else 2}d_out", x.dtype)


@lowering(
    "convolution",
    "convolution_overrideable",
    meta=_convolution_meta,
    no_loop_for=(torch.bool, *WIDE_UNSIGNED),
    meta_check=dict.fromkeys(("convolution", "convolution_overrideable"), _convolution_check),
)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * (x.ndim - 2))
    if x.shape[1] == 0:  # no input channels: no output channels either, as on the CPU
        out = out[:, :0]
    return out.astype(x.dtype)


@lowering("convolution_backward", "convolution_backward_overrideable")
def convolution_backward(grad, x, w, *rest):
    if len(rest) == 8:  # convolution_backward: bias_sizes first
        _, stride, padding, dilation, transposed, output_padding, groups, mask = rest
    else:  # convolution_backward_overrideable has no bias_sizes
        stride, padding, dilation, transposed, output_padding, groups, mask = rest
    dtype = x.dtype
    acc = jnp.float32 if _low(x) else dtype

    def f(x_, w_):
        return _conv(x_, w_, stride, padding, dilation, transposed, output_padding, groups).astype(acc)

    _, vjp = jax.vjp(f, x, w)
    gx, gw = vjp(grad.astype(acc))
    gb = jnp.sum(grad.astype(acc), axis=(0,) + tuple(range(2, grad.ndim))).astype(dtype) if mask[2] else None
    return (gx.astype(dtype) if mask[0] else None, gw.astype(w.dtype) if mask[1] else None, gb)
