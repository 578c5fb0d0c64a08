"""Lowerings: scaled_dot_product_attention, and the nn.MultiheadAttention / TransformerEncoderLayer fast paths.

scaled_dot_product_attention on tpu runs as one fused executable forward and one backward: the
eager layer (eager/attention.py) routes it to these ATen ops, whose autograd formula and
meta kernel PyTorch already has. Masks arrive additive (float) or as bool (True = attend).
Large score matrices (B*H*L*S >= attention_blockwise.MIN_SCORES, e.g. SD3's joint attention) go
blockwise with an online softmax instead of being materialised (ops/attention_blockwise.py).
Traced for a TPU, causal or full attention without a mask or dropout runs JAX's Pallas splash-attention
kernel, forward and backward (ops/attention_splash.py: any sequence length from its MIN_LENGTH up).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from . import attention_blockwise as _blockwise
from . import attention_splash as _splash
from .dtypes import to_opmath
from .linalg import host_row_major_lhs
from .nn_common import _low, _precision
from .table import lowering


def _heads(x, n):
    """(..., H, L, F) viewed with n heads. Grouped-query attention: (..., H, L, F) -> (..., Hkv, H/Hkv * L,
    F), so each key/value head meets its query heads in one product and k, v are never repeated (query
    head h reads key/value head h // (H/Hkv), as PyTorch's enable_gqa and transformers' repeat_kv);
    and back to H heads after the product."""
    return x if x.shape[-3] == n else x.reshape(x.shape[:-3] + (n, -1, x.shape[-1]))


def _attn_scores(q, k, is_causal, mask, scale):
    e = q.shape[-1]
    s = (1.0 / math.sqrt(e)) if scale is None else scale
    scores = (
        jnp.einsum(
            "...le,...se->...ls",
            _heads(q, k.shape[-3]),
            k,
            precision=_precision(),
            preferred_element_type=_blockwise.acc_dtype(q.dtype),
        )
        * s
    )  # float64 stays float64
    scores = _heads(scores, q.shape[-3])
    if mask is not None:
        scores = scores + (jnp.where(mask, 0.0, -jnp.inf) if mask.dtype == jnp.bool_ else to_opmath(mask))
    if is_causal:
        l, sk = scores.shape[-2], scores.shape[-1]
        scores = jnp.where(jnp.tril(jnp.ones((l, sk), jnp.bool_)), scores, -jnp.inf)
    return scores, s


def _splash_plan(q, k, v, dropout_p, is_causal, attn_mask):
    """The splash plan when tracing for a TPU and the kernel takes the problem (PyTorch's causal mask is
    top-left: offset 0), else None."""
    if attn_mask is not None or dropout_p:
        return None
    return _splash.plan(q, k, v, causal=bool(is_causal))


def _scale(q, scale):
    return (1.0 / math.sqrt(q.shape[-1])) if scale is None else scale


def _host_one_row(q, k):
    """Whether each key/value head meets one query row (a decode step without grouped heads) in a bf16/f16
    product on XLA:CPU. XLA:CPU runs such a batched one-row dot as Eigen's float32 GEMV after converting
    the whole half cache to float32 at every step: 16 heads x 2048 positions, one layer, 25 ms of CPU
    against 3.1 with a second (zero) query row, which YNNPACK's half dot takes (as linalg's one-row
    products). The TPU trace, where half dots are native, keeps the plain form."""
    if q.dtype not in (jnp.bfloat16, jnp.float16) or q.ndim < 3 or k.ndim != q.ndim:
        return False
    if q.shape[-2] * (q.shape[-3] // max(1, k.shape[-3])) != 1:
        return False
    from ..device.platform import lowering_platform

    return lowering_platform() == "cpu"


@lowering("_scaled_dot_product_flash_attention_for_cpu")
def sdpa_fused(q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    if not dropout_p and _host_one_row(q, k):  # the zero row's output is dropped; its softmax stays finite
        zeros = jnp.zeros_like(q)
        out, lse = sdpa_fused(jnp.concatenate([q, zeros], axis=-2), k, v, 0.0, is_causal, attn_mask, scale)
        return out[..., :1, :], lse[..., :1]
    splash = _splash_plan(q, k, v, dropout_p, is_causal, attn_mask)
    if splash is not None:
        return _splash.forward(splash, q, k, v, _scale(q, scale))
    if _blockwise.eligible(q, k, v):
        return _blockwise.forward(q, k, v, attn_mask, is_causal, scale, _precision())
    scores, _ = _attn_scores(q, k, is_causal, attn_mask, scale)
    m = jnp.max(scores, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0)  # rows with every key masked give 0, as _safe_softmax
    p = jnp.exp(scores - m)
    total = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum(
        "...ls,...se->...le",
        _heads(p.astype(v.dtype) if _low(v) else p, v.shape[-3]),
        v,
        precision=_precision(),
        preferred_element_type=p.dtype,
    )
    out = _heads(out, q.shape[-3])
    out = jnp.where(total > 0, out / jnp.where(total > 0, total, 1), 0)
    lse = jnp.where(total[..., 0] > 0, jnp.log(jnp.where(total[..., 0] > 0, total[..., 0], 1)) + m[..., 0], 0)  # as CPU
    return out.astype(q.dtype), lse


def _sdpa_fused_backward_meta(grad, *args, **kwargs):
    if grad is None:  # an undefined incoming gradient (gradcheck asks): undefined results, as the CPU's kernel
        return None, None, None
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(grad, *args, **kwargs)


@lowering("_scaled_dot_product_flash_attention_for_cpu_backward", meta=_sdpa_fused_backward_meta)
def sdpa_fused_backward(grad, q, k, v, out, lse, dropout_p, is_causal, attn_mask=None, scale=None):
    if grad is None:
        return None, None, None
    splash = _splash_plan(q, k, v, dropout_p, is_causal, attn_mask)
    if splash is not None:
        return _splash.backward(splash, grad, q, k, v, out, lse, _scale(q, scale))
    if _blockwise.eligible(q, k, v):
        return _blockwise.backward(grad, q, k, v, out, lse, attn_mask, is_causal, scale, _precision())
    scores, s = _attn_scores(q, k, is_causal, attn_mask, scale)
    lse_ = lse[..., None]
    p = jnp.where(jnp.isfinite(lse_), jnp.exp(scores - jnp.where(jnp.isfinite(lse_), lse_, 0)), 0)
    g, o = to_opmath(grad), to_opmath(out)
    prec = _precision()
    hq, hk = q.shape[-3], k.shape[-3]
    g_g, p_g = _heads(g, hk), _heads(p, hk)  # GQA: sums over a key/value head's query heads
    # the products over the query rows (l) take P and dS transposed, laid out for XLA:CPU's YNNPACK dot
    dv = jnp.einsum("...sl,...le->...se", host_row_major_lhs(jnp.swapaxes(p_g, -1, -2), g_g), g_g, precision=prec)
    dp = _heads(jnp.einsum("...le,...se->...ls", g_g, to_opmath(v), precision=prec), hq)
    ds = p * (dp - jnp.sum(g * o, axis=-1, keepdims=True))
    ds_g = _heads(ds, hk)
    dq = _heads(jnp.einsum("...ls,...se->...le", ds_g, to_opmath(k), precision=prec), hq) * s
    q_g = _heads(to_opmath(q), hk)
    dk = jnp.einsum("...sl,...le->...se", host_row_major_lhs(jnp.swapaxes(ds_g, -1, -2), q_g), q_g, precision=prec) * s
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# ---------------------------------------------------------------- nn.MultiheadAttention / Transformer fast paths
# (taken in eval mode under no_grad: PyTorch counts PrivateUse1 among the fast-path devices)
def _linear(x, w, b):
    y = jnp.einsum("...i,oi->...o", x, w, precision=_precision(), preferred_element_type=jnp.float32)
    return y + to_opmath(b) if b is not None else y


def _mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type):
    """(output in float32, attention probabilities (B, H, L, S) in float32)."""
    d = embed_dim
    wq, wk, wv = qkv_weight[:d], qkv_weight[d : 2 * d], qkv_weight[2 * d :]
    bq, bk, bv = qkv_bias[:d], qkv_bias[d : 2 * d], qkv_bias[2 * d :]
    b, l, _ = query.shape
    s = key.shape[1]
    hd = d // num_head

    def heads(x, n):
        return x.reshape(b, n, num_head, hd).transpose(0, 2, 1, 3)

    q = heads(_linear(query, wq, bq), l) / math.sqrt(hd)
    k = heads(_linear(key, wk, bk), s)
    v = heads(_linear(value, wv, bv), s)
    scores = jnp.einsum("bhle,bhse->bhls", q, k, precision=_precision())
    if mask is not None:
        masked = mask.astype(jnp.bool_)  # PyTorch's fast path: any nonzero mask entry masks
        if mask_type == 1 or (mask_type is None and masked.ndim == 2 and masked.shape == (b, s) and l != s):
            masked = masked.reshape(b, 1, 1, s)
        scores = jnp.where(masked, -jnp.inf, scores)
    m = jnp.max(scores, axis=-1, keepdims=True)
    p = jnp.exp(scores - jnp.where(jnp.isfinite(m), m, 0))
    total = jnp.sum(p, axis=-1, keepdims=True)
    p = jnp.where(total > 0, p / jnp.where(total > 0, total, 1), 0)
    ctx = jnp.einsum("bhls,bhse->bhle", p, v, precision=_precision())
    ctx = ctx.transpose(0, 2, 1, 3).reshape(b, l, d)
    return _linear(ctx, proj_weight, proj_bias), p


@lowering("_native_multi_head_attention")
def native_multi_head_attention(
    query,
    key,
    value,
    embed_dim,
    num_head,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    mask=None,
    need_weights=True,
    average_attn_weights=True,
    mask_type=None,
):
    out, p = _mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)
    if not need_weights:
        return out.astype(query.dtype), jnp.zeros((0,), query.dtype)
    w = jnp.mean(p, axis=1) if average_attn_weights else p
    return out.astype(query.dtype), w.astype(query.dtype)


def _layer_norm(x, w, b, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * to_opmath(w) + to_opmath(b)


@lowering("_transformer_encoder_layer_fwd")
def transformer_encoder_layer_fwd(
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    eps,
    norm_weight_1,
    norm_bias_1,
    norm_weight_2,
    norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
):
    x = to_opmath(src)
    h = _layer_norm(x, norm_weight_1, norm_bias_1, eps) if norm_first else x
    attn, _ = _mha(h, h, h, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, mask_type)
    x = x + attn
    if not norm_first:
        x = _layer_norm(x, norm_weight_1, norm_bias_1, eps)
    h = _layer_norm(x, norm_weight_2, norm_bias_2, eps) if norm_first else x
    h = _linear(h, ffn_weight_1, ffn_bias_1)
    h = jax.nn.gelu(h, approximate=False) if use_gelu else jnp.maximum(h, 0)
    x = x + _linear(h, ffn_weight_2, ffn_bias_2)
    if not norm_first:
        x = _layer_norm(x, norm_weight_2, norm_bias_2, eps)
    return x.astype(src.dtype)
