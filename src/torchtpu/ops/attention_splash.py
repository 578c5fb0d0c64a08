"""Splash attention: JAX's Pallas TPU kernel (jax.experimental.pallas.ops.tpu.splash_attention), the TPU path of
scaled_dot_product_attention (ops/attention.py) and of torch.tpu.ops.splash_sdpa (kernels/ops.py).

Taken when the program is traced for a TPU (`platform.lowering_platform() == "tpu"`) and `plan()` accepts the
problem: 4-D bfloat16/float32 q, k, v of one dtype and one head dim, key heads dividing query heads, both
sequences at least MIN_LENGTH long, causal / sliding-window / full masking, and no query row left without a
key (splash would return garbage there). Anything else goes to the caller's XLA attention.

Any sequence length: q and k/v are padded with zeros to a multiple of BLOCK, and the kernel's mask (computed
inside it, never materialised) keeps each real query row to its real keys; a padded query row attends key 0
only, so that no row of the kernel is empty (an empty row's logsumexp is -inf, and its gradient would turn the
padded rows' zero cotangents into NaN). The padded rows are cut off the result.

x64: the kernel is traced with 32-bit Python ints (pallas_support.kernel_tracing), forward and backward, so it
compiles for TPU whatever torchtpu's x64 setting. Gradients: scaled_dot_product_attention's backward lowering runs
splash's fused dq/dk/dv kernel on the forward's output and logsumexp (`backward`); `attention` (splash_sdpa, a
jax_op differentiated by jax.vjp) is a custom_vjp with the same forward residuals and backward.

On the host (XLA:CPU, tests under `platform.tracing_for("tpu")`) the kernel runs in Pallas' interpreter.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from . import pallas_support

BLOCK = 128  # splash's smallest block (the TPU's lane width): lengths are padded to a multiple of it
MIN_LENGTH = 128  # shorter query or key sequences (decode steps) go to XLA attention: mostly padding here
_BLOCK_CHOICES = (512, 256, 128)
_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))


class Plan(NamedTuple):
    """Everything static about one splash call (hashable: the key of the kernel's mask processing)."""

    batch: int
    heads: int  # query heads
    kv_heads: int
    q_len: int
    kv_len: int
    q_pad: int
    kv_pad: int
    causal: bool
    offset: int  # query row i sits at key position i + offset (0: top-left, kv_len - q_len: bottom-right)
    window: int | None  # keys at positions > row - window, or None
    block_q: int
    block_kv: int


def _round_up(n, m):
    return -(-n // m) * m


def _block(n, wanted):
    """The largest of `wanted` (if given) and _BLOCK_CHOICES that divides n (a multiple of BLOCK)."""
    for b in ((wanted,) if wanted else ()) + _BLOCK_CHOICES:
        if b and b % BLOCK == 0 and n % b == 0:
            return b
    return BLOCK


def _rows_all_see_a_key(q_len, kv_len, causal, offset, window):
    """Whether every query row i (at key position i + offset) has a key in [0, kv_len): rows attend keys
    p <= i + offset when causal and p > i + offset - window with a window."""
    if causal and offset < 0:  # row 0 sees keys <= offset < 0
        return False
    # the last row's window must reach a key
    return window is None or q_len - 1 + offset - window + 1 <= kv_len - 1


def plan(
    q,
    k,
    v,
    *,
    causal: bool,
    offset: int = 0,
    window: int | None = None,
    block_q: int | None = None,
    block_kv: int | None = None,
) -> Plan | None:
    """The splash plan for q (b, h, s, d), k/v (b, h_kv, t, d), or None when splash does not apply (not tracing
    for a TPU, or a problem it does not take: see the module docstring)."""
    from ..device.platform import lowering_platform

    if lowering_platform() != "tpu" or not _splash_available():
        return None
    if not (q.ndim == k.ndim == v.ndim == 4) or not (q.dtype == k.dtype == v.dtype) or q.dtype not in _DTYPES:
        return None
    b, h, s, d = q.shape
    if k.shape[0] != b or v.shape[:3] != k.shape[:3] or k.shape[3] != d or v.shape[3] != d:
        return None
    h_kv, t = k.shape[1], k.shape[2]
    if h_kv == 0 or h % h_kv or s < MIN_LENGTH or t < MIN_LENGTH:
        return None
    if window is not None and window < 1:
        return None
    if not _rows_all_see_a_key(s, t, causal, offset, window):
        return None
    q_pad, kv_pad = _round_up(s, BLOCK), _round_up(t, BLOCK)
    return Plan(
        b,
        h,
        h_kv,
        s,
        t,
        q_pad,
        kv_pad,
        bool(causal),
        int(offset),
        window,
        _block(q_pad, block_q),
        _block(kv_pad, block_kv),
    )


@functools.lru_cache(maxsize=1)
def _splash_available():
    """Whether this JAX has the splash kernel with the pieces used here (else: XLA attention)."""
    try:
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    except ImportError:
        return False
    return all(hasattr(sk, n) for n in ("make_splash_mha", "make_splash_mqa", "BlockSizes")) and hasattr(
        sm, "_ComputableMask"
    )


def _mask_class():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    class PaddedMask(sm._ComputableMask):
        """Causal / sliding-window / full attention of q_len rows over kv_len keys, inside a (q_pad, kv_pad)
        kernel: real rows see only real keys, padded rows see key 0. Computed in the kernel from row and
        key indices (numpy at trace time, int32 arrays inside the kernel)."""

        def __init__(self, p: Plan):
            self.plan_key = (p.q_len, p.kv_len, p.q_pad, p.kv_pad, p.causal, p.offset, p.window)
            q_len, kv_len, causal, offset, window = p.q_len, p.kv_len, p.causal, p.offset, p.window

            def mask_function(rows, keys):
                position = rows + offset
                keep = keys < kv_len
                if causal:
                    keep = keep & (keys <= position)
                if window is not None:
                    keep = keep & (keys > position - window)
                if p.q_pad == q_len:
                    return keep
                real = rows < q_len
                return (real & keep) | (~real & (keys == 0))

            super().__init__(shape=(p.q_pad, p.kv_pad), mask_function=mask_function)

        def __eq__(self, other):
            return isinstance(other, PaddedMask) and other.plan_key == self.plan_key

        def __hash__(self):
            return hash((PaddedMask, self.plan_key))

    return PaddedMask


_PADDED_MASK = []


def _kernel(p: Plan, residuals: bool):
    """The splash kernel for one (batch element, key head): MHA over all heads, or MQA over a key head's
    query heads (grouped-query attention without repeating k and v). Built per trace: it holds arrays made
    in the trace (splash caches the mask processing itself, keyed on the mask)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    if not _PADDED_MASK:
        _PADDED_MASK.append(_mask_class())
    heads = p.heads if p.kv_heads == p.heads else p.heads // p.kv_heads
    mask = sm.MultiHeadMask([_PADDED_MASK[0](p)] * heads)
    bq, bkv = p.block_q, p.block_kv
    sizes = sk.BlockSizes(
        block_q=bq,
        block_kv=bkv,
        block_kv_compute=bkv,
        block_q_dkv=bq,
        block_kv_dkv=bkv,
        block_kv_dkv_compute=bkv,
        use_fused_bwd_kernel=True,
    )
    make = sk.make_splash_mha if p.kv_heads == p.heads else sk.make_splash_mqa
    with pallas_support.kernel_tracing():
        return make(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, save_residuals=residuals)


def _pad(x, length):
    return x if x.shape[2] == length else jnp.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)))


def _run(p: Plan, q, k, v, residuals):
    """The kernel over padded, pre-scaled q (b, h, q_pad, d) and k/v (b, h_kv, kv_pad, d)."""
    pallas_support.enable_interpret_on_cpu()
    kernel = _kernel(p, residuals)
    with pallas_support.kernel_tracing():
        if p.kv_heads == p.heads:
            return jax.vmap(kernel)(q, k, v)
        # (b, h_kv, rep, s, d) queries against (b, h_kv, t, d) keys: one MQA call per (batch, key head)
        rep = p.heads // p.kv_heads
        qg = q.reshape(p.batch, p.kv_heads, rep, p.q_pad, q.shape[-1])
        out = jax.vmap(jax.vmap(kernel))(qg, k, v)
        merge = lambda a: a.reshape((p.batch, p.heads) + a.shape[3:])
        return jax.tree_util.tree_map(merge, out)


def _prepare(p: Plan, q, k, v, scale):
    # the scale goes into q (splash has none); in q's dtype, as the kernel reads q
    qs = (q.astype(jnp.float32) * scale).astype(q.dtype)
    return _pad(qs, p.q_pad), _pad(k, p.kv_pad), _pad(v, p.kv_pad)


def forward(p: Plan, q, k, v, scale):
    """(out (b, h, s, d) in q's dtype, logsumexp (b, h, s) float32 of the scaled logits)."""
    out, (lse,) = _run(p, *_prepare(p, q, k, v, scale), residuals=True)
    return out[:, :, : p.q_len].astype(q.dtype), lse[:, :, : p.q_len].astype(jnp.float32)


def attention(p: Plan, q, k, v, scale):
    """The attention output, differentiable in q, k, v (splash's fused backward kernel)."""
    return _attention(q, k, v, p, float(scale))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _attention(q, k, v, p, scale):
    out = _run(p, *_prepare(p, q, k, v, scale), residuals=False)
    return out[:, :, : p.q_len].astype(q.dtype)


def _attention_fwd(q, k, v, p, scale):
    out, lse = forward(p, q, k, v, scale)
    return out, (q, k, v, out, lse)


def _attention_bwd(p, scale, saved, grad):
    q, k, v, out, lse = saved
    return backward(p, grad, q, k, v, out, lse, scale)


def _recomputing_backward(p, grad, q, k, v, scale):
    """(dq, dk, dv) through splash's own VJP, recomputing the forward (when its residual backward is absent)."""

    def padded(q, k, v):
        return _run(p, *_prepare(p, q, k, v, scale), residuals=False)[:, :, : p.q_len]

    # the kernel's custom_vjp traces its backward kernels when the pullback is called: keep it in the scope
    with pallas_support.kernel_tracing():
        _, pullback = jax.vjp(padded, q, k, v)
        return pullback(grad.astype(q.dtype))


_attention.defvjp(_attention_fwd, _attention_bwd)


def backward(p: Plan, grad, q, k, v, out, lse, scale):
    """(dq, dk, dv) of `forward` for the output cotangent `grad`, given forward's `out` and `lse`: splash's
    backward kernel on those residuals (its private `_splash_attention_bwd`; JAX versions without it recompute
    the forward instead)."""
    try:
        return _backward_from_residuals(p, grad, q, k, v, out, lse, scale)
    except (AttributeError, TypeError):  # the private entry point moved or changed its signature
        return _recomputing_backward(p, grad, q, k, v, scale)


def _backward_from_residuals(p: Plan, grad, q, k, v, out, lse, scale):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    splash_backward = sk._splash_attention_bwd
    pallas_support.enable_interpret_on_cpu()
    qs, kp, vp = _prepare(p, q, k, v, scale)
    pad = p.q_pad - p.q_len
    o, g = _pad(out.astype(q.dtype), p.q_pad), _pad(grad.astype(q.dtype), p.q_pad)
    # padded rows: logsumexp +inf makes their probabilities exp(-inf) = 0 (their cotangents are 0 too)
    lse = jnp.pad(lse.astype(jnp.float32), ((0, 0), (0, 0), (0, pad)), constant_values=jnp.inf)
    with pallas_support.kernel_tracing():
        kernel = _kernel(p, residuals=False)
        kw = kernel.kwargs

        def one(q1, k1, v1, o1, lse1, g1):
            residuals = (q1, k1, v1, None, None, o1, lse1, kernel.dq_mask_info, kernel.dkv_mask_info)
            grads = splash_backward(
                False,
                kw["mask_value"],
                kw["is_mqa"],
                kw["block_sizes"],
                None,
                kw["mask_function"],
                kw["attn_logits_soft_cap"],
                kw["interpret"],
                residuals,
                g1,
            )
            return grads[3:6]

        if p.kv_heads == p.heads:
            dq, dk, dv = jax.vmap(one)(qs, kp, vp, o, lse, g)
        else:
            rep = p.heads // p.kv_heads
            grouped = lambda a: a.reshape((p.batch, p.kv_heads, rep) + a.shape[2:])
            dq, dk, dv = jax.vmap(jax.vmap(one))(grouped(qs), kp, vp, grouped(o), grouped(lse), grouped(g))
            dq = dq.reshape((p.batch, p.heads) + dq.shape[3:])
    # q entered as q * scale
    dq = (dq[:, :, : p.q_len].astype(jnp.float32) * scale).astype(q.dtype)
    return dq, dk[:, :, : p.kv_len].astype(k.dtype), dv[:, :, : p.kv_len].astype(v.dtype)
