"""`torch.autocast("tpu")`: the AutocastPrivateUse1 kernels PyTorch ships for CUDA but not for us.

Ops on the lower-precision list run with floating inputs cast to the autocast dtype; ops on the
float32 list run in float32; everything else passes through untouched. Same lists as CUDA's.
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey, DispatchKeySet
from torch.utils._pytree import tree_map

LOWER_PRECISION = [
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "convolution",
    "_convolution",
    "prelu",
    "addmm",
    "addmv",
    "addr",
    "matmul",
    "einsum",
    "mm",
    "mv",
    "linear",
    "addbmm",
    "baddbmm",
    "bmm",
    "chain_matmul",
    "linalg_multi_dot",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "scaled_dot_product_attention",
]
FLOAT32 = [
    "acos",
    "asin",
    "cosh",
    "erfinv",
    "exp",
    "expm1",
    "log",
    "log10",
    "log2",
    "log1p",
    "reciprocal",
    "rsqrt",
    "sinh",
    "tan",
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "softplus",
    "layer_norm",
    "native_layer_norm",
    "group_norm",
    "frobenius_norm.dim",
    "nuclear_norm",
    "cosine_similarity",
    "poisson_nll_loss",
    "cosine_embedding_loss",
    "nll_loss",
    "nll_loss2d",
    "hinge_embedding_loss",
    "kl_div",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "mse_loss",
    "margin_ranking_loss",
    "multilabel_margin_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    "multi_margin_loss",
    "binary_cross_entropy_with_logits",
    "dist",
    "pdist",
    "cdist",
    "renorm",
    "logsumexp",
    "softmax.int",
    "log_softmax.int",
    "cross_entropy_loss",
    "cumsum",
    "cumprod",
    "sum",
    "prod",
    "rms_norm",
]
_AUTOCAST_KEYS = DispatchKeySet(DispatchKey.AutocastPrivateUse1)
_libs = []


def _caster(dtype_of):
    def cast(x):
        if (
            isinstance(x, torch.Tensor)
            and x.is_floating_point()
            and x.dtype != torch.float64
            and x.device.type == "tpu"
        ):
            return x.to(dtype_of())
        return x

    return cast


def _kernel(op, dtype_of):
    cast = _caster(dtype_of)

    def kernel(*args, **kwargs):
        args, kwargs = tree_map(cast, (args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            return op(*args, **kwargs)

    return kernel


def install():
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    lib = torch.library.Library("aten", "IMPL")
    _libs.extend([fallthrough, lib])
    for names, dtype_of in (
        (LOWER_PRECISION, lambda: torch.get_autocast_dtype("tpu")),
        (FLOAT32, lambda: torch.float32),
    ):
        for name in names:
            packet, _, overload = name.partition(".")
            op = getattr(getattr(torch.ops.aten, packet, None), overload or "default", None)
            if op is None:
                continue  # absent in this torch release
            lib.impl(op, _kernel(op, dtype_of), "AutocastPrivateUse1")
