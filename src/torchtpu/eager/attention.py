"""scaled_dot_product_attention on "tpu": one fused executable forward and one backward.

SDPA is CompositeImplicitAutograd, and PyTorch's backend choice (`_fused_sdp_choice`) cannot be
extended from Python, so a kernel on the AutogradPrivateUse1 key routes it to the ATen
flash-attention op pair, which has PyTorch's autograd formula and meta kernel and is lowered.
"""

from __future__ import annotations

import torch

from . import growing

aten = torch.ops.aten
_libs = []


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """AutogradPrivateUse1 kernel of the (CompositeImplicit) SDPA: PyTorch's math path decomposes into
    a dozen eager ops; this runs one fused forward and one fused backward executable instead, through
    the ATen flash-attention op pair (which has PyTorch's autograd formula and meta kernel)."""
    fused = (
        query.dim() == 4
        and key.dim() == 4
        and value.dim() == 4
        and dropout_p == 0.0
        and query.size(-1) == key.size(-1) == value.size(-1)
        and (attn_mask is None or not attn_mask.requires_grad)
        and query.dtype == key.dtype == value.dtype
        and query.dtype.is_floating_point
        and not (query.is_nested or key.is_nested or value.is_nested)
    )
    if not fused:
        return _math(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if attn_mask is not None and is_causal:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    hq, hk = query.size(-3), key.size(-3)
    if hq != hk and hk == value.size(-3) == 1 and not enable_gqa:
        # one key/value head broadcast over the query heads (Falcon): a stride-0 view, no copy
        key, value = (
            key.expand(*key.shape[:-3], hq, *key.shape[-2:]),
            value.expand(*value.shape[:-3], hq, *value.shape[-2:]),
        )
        hk = hq
    if hq != hk or hk != value.size(-3):
        if not enable_gqa or hq % hk or value.size(-3) != hk:
            return _math(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        # grouped-query attention goes to the op as it is: the lowerings pair each key/value head with
        # its query heads (ops/attention.py: _heads), so k and v are not repeated in memory
    grown = _over_room(query, key, value, attn_mask, is_causal)
    if grown is not None:
        key, value, attn_mask = grown
    # bool masks go to the op as they are (the lowerings select -inf): no float copy of an (L, S) mask
    return aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale
    )[0]


def _over_room(query, key, value, attn_mask, is_causal):
    """Keys and values grown into room (eager/growing.py: a decode step's cache) read whole, with a mask
    of their valid positions: one attention program per capacity instead of one per key length; the
    positions past the length score -inf, so they add exact zeros to the softmax's sums (the order
    of the sums, not their terms, differs from the exact program's). (key, value, mask) or None."""
    if is_causal or query.requires_grad or key.requires_grad or value.requires_grad:
        return None
    rk, rv = growing.room_of(key), growing.room_of(value)
    if rk is None or rv is None or rk.axis != 2 or rv.axis != 2 or rk.length != rv.length:
        return None
    capacity = rk.array.shape[2]
    if rv.array.shape[2] != capacity:
        return None
    if attn_mask is None:
        mask = growing.valid_positions(key.device, capacity, rk.length)
    elif attn_mask.dim() >= 1 and attn_mask.size(-1) == rk.length and not attn_mask.requires_grad:
        # the caller's mask over the keys (padded rows of a batch), closed over the room: a pad, a small
        # program per length in place of the attention's
        fill = False if attn_mask.dtype == torch.bool else float("-inf")
        mask = aten.constant_pad_nd(attn_mask, [0, capacity - rk.length], fill)
    else:
        return None
    return growing.padded(key, rk), growing.padded(value, rv), mask


def _math(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """PyTorch's math path, given the mask as PyTorch's own SDPA gives it: `_scaled_dot_product_attention_math`
    adds its mask to the scores, so a boolean mask (True = attend) must first become 0 / -inf, as the
    CompositeImplicit SDPA does before it picks a backend (added as 1 / 0 it would mask nothing)."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros((), dtype=query.dtype, device=attn_mask.device).masked_fill(
            attn_mask.logical_not(), float("-inf")
        )
    return aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
    )[0]


def register():
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradPrivateUse1")
    _libs.append(lib)
