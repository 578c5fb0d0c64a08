"""`torch.tpu.ops`: ready-made kernels, each a jax_op (`torch.ops.tpu.*`): eager ops on "tpu", inlined in
compiled graphs, run on XLA:CPU for "cpu" tensors.

- `ragged_dot(lhs, rhs, group_sizes, *, out=None)`: per-group matmuls (Mixture-of-Experts), XLA's ragged
  dot; differentiable in lhs and rhs. `ragged_dot_weight_grad(lhs, grad_output, group_sizes)`: its
  gradient with respect to rhs.
- `splash_sdpa(q, k, v, *, scale=None, is_causal=True, local_window_size=None, ...)`: attention with
  TorchTPU's signature: the Pallas splash-attention kernel on TPU, XLA's softmax attention elsewhere.
- `optimization_barrier(inputs)`: XLA's optimization barrier around a list of tensors.
"""
from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..ops import linalg
from .pallas import dynamo_traceable, jax_op

__all__ = ["ragged_dot", "ragged_dot_weight_grad", "splash_sdpa", "optimization_barrier"]


def _accumulate(a):
    return jnp.float32 if a.dtype in (jnp.float16, jnp.bfloat16) else a.dtype


@jax_op("tpu::_ragged_dot")
def _ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    out = linalg.ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32), precision=linalg.precision(),
                            preferred_element_type=_accumulate(lhs))
    return out.astype(lhs.dtype)


@jax_op("tpu::_ragged_dot_weight_grad")
def _ragged_dot_weight_grad(lhs: jax.Array, grad_output: jax.Array, group_sizes: jax.Array) -> jax.Array:
    # rows of lhs and grad_output split into groups: one (k, n) = lhs_g^T @ grad_g per group
    numbers = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(((1,), (0,)), ((), ())),
                                            lhs_ragged_dimensions=[1], rhs_group_dimensions=[])
    out = lax.ragged_dot_general(lhs.T, grad_output, group_sizes.astype(jnp.int32), numbers,
                                 precision=linalg.precision(), preferred_element_type=_accumulate(lhs))
    return out.astype(lhs.dtype)


@dynamo_traceable
def _check_ragged(lhs, rhs, group_sizes):
    if lhs.dim() != 2 or rhs.dim() != 3 or group_sizes.dim() != 1:
        raise ValueError(f"ragged_dot: expected lhs (m, k), rhs (g, k, n), group_sizes (g,); got {tuple(lhs.shape)}, "
                         f"{tuple(rhs.shape)}, {tuple(group_sizes.shape)}")
    if lhs.shape[1] != rhs.shape[1] or rhs.shape[0] != group_sizes.shape[0]:
        raise ValueError(f"ragged_dot: shapes do not match: lhs {tuple(lhs.shape)}, rhs {tuple(rhs.shape)}, "
                         f"group_sizes {tuple(group_sizes.shape)}")
    if group_sizes.dtype.is_floating_point or group_sizes.dtype.is_complex:
        raise TypeError(f"ragged_dot: group_sizes must be an integer tensor, got {group_sizes.dtype}")


@dynamo_traceable
def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, *,
               out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """result[start_i:end_i] = lhs[start_i:end_i] @ rhs[i], the groups' rows consecutive in lhs with
    `group_sizes[i]` rows each (they sum to at most m; rows past the last group are zero). lhs (m, k), rhs
    (g, k, n), group_sizes (g,) integers -> (m, n). Differentiable in lhs and rhs when `out` is not given."""
    _check_ragged(lhs, rhs, group_sizes)
    if out is None:
        return _ragged_dot(lhs, rhs, group_sizes)
    if torch.is_grad_enabled() and (lhs.requires_grad or rhs.requires_grad):
        raise RuntimeError("ragged_dot(): functions with out=... arguments don't support automatic "
                           "differentiation, but one of the arguments requires grad.")
    return out.copy_(_ragged_dot(lhs, rhs, group_sizes))


@dynamo_traceable
def ragged_dot_weight_grad(lhs: torch.Tensor, grad_output: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """The gradient of `ragged_dot` with respect to rhs: result[i] = lhs[start_i:end_i].T @
    grad_output[start_i:end_i], shape (g, k, n)."""
    return _ragged_dot_weight_grad(lhs, grad_output, group_sizes)


@jax_op("tpu::_optimization_barrier")
def _optimization_barrier(inputs: Sequence[jax.Array]) -> Sequence[jax.Array]:
    return list(lax.optimization_barrier(list(inputs)))


@dynamo_traceable
def optimization_barrier(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors through XLA's optimization barrier: the same values, but XLA moves no computation
    across it and does not fuse or deduplicate work on its two sides (use the returned tensors)."""
    return _optimization_barrier(list(inputs))


# ---------------------------------------------------------------- attention
def _on_tpu() -> bool:
    from ..device import platform
    return platform.jax_device(0).platform == "tpu"


def _xla_attention(q, k, v, scale, is_causal, local_window_size):
    """Softmax attention in XLA (float32 softmax), q (b, h, s, d), k/v (b, h, t, d)."""
    s, t = q.shape[-2], k.shape[-2]
    logits = jnp.einsum("bhsd,bhtd->bhst", q, k, precision=linalg.precision(),
                        preferred_element_type=jnp.float32) * scale
    mask = None
    rows = jnp.arange(s)[:, None] + (t - s)     # queries aligned to the end of the keys
    cols = jnp.arange(t)[None, :]
    if is_causal:
        mask = cols <= rows
    if local_window_size is not None:
        window = cols > rows - local_window_size
        mask = window if mask is None else mask & window
    if mask is not None:
        logits = jnp.where(mask, logits, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=-1)
    weights = jnp.where(jnp.isnan(weights), 0.0, weights)   # fully masked rows give zeros
    out = jnp.einsum("bhst,bhtd->bhsd", weights.astype(v.dtype) if v.dtype != jnp.float32 else weights, v,
                     precision=linalg.precision(), preferred_element_type=jnp.float32)
    return out.astype(q.dtype)


def _splash_attention(q, k, v, scale, is_causal, local_window_size, block_q, block_kv, block_kv_compute):
    """The Pallas splash-attention kernel (TPU only). Written against JAX's
    jax.experimental.pallas.ops.tpu.splash_attention; not exercised on this machine (no TPU)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    b, h, s, d = q.shape
    t = k.shape[2]
    if local_window_size is not None:
        one = sm.LocalMask((s, t), (local_window_size - 1, 0 if is_causal else None), 0)
    elif is_causal:
        one = sm.CausalMask((s, t))
    else:
        one = sm.FullMask((s, t))
    mask = sm.MultiHeadMask([one] * h)
    sizes = sk.BlockSizes(block_q=min(block_q, s), block_kv=min(block_kv, t),
                          block_kv_compute=min(block_kv_compute, t))
    kernel = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes)
    return jax.vmap(kernel)(q * scale, k, v).astype(q.dtype)


@jax_op("tpu::_splash_sdpa")
def _splash_sdpa(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, is_causal: bool,
                 local_window_size: Optional[int], block_q: int, block_kv: int, block_kv_compute: int) -> jax.Array:
    if _on_tpu():
        return _splash_attention(q, k, v, scale, is_causal, local_window_size, block_q, block_kv, block_kv_compute)
    return _xla_attention(q, k, v, scale, is_causal, local_window_size)


@dynamo_traceable
def splash_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: Optional[float] = None,
                is_causal: bool = True, local_window_size: Optional[int] = None, enable_gqa: bool = False,
                block_q: int = 512, block_kv: int = 512, block_dkv: int = 512, block_kv_compute: int = 512,
                block_q_dkv: int = 512, block_kv_dkv: int = 512, block_kv_dkv_compute: int = 512,
                block_q_dq: Optional[int] = None, block_kv_dq: Optional[int] = None,
                use_fused_bwd_kernel: bool = True, use_vmap_bwd: bool = True, q_layout: str = "HEAD_DIM_MINOR",
                k_layout: str = "HEAD_DIM_MINOR", v_layout: str = "HEAD_DIM_MINOR") -> torch.Tensor:
    """`F.scaled_dot_product_attention` for q (b, h, s, d), k/v (b, h_kv, t, d): TorchTPU's splash
    attention signature. On TPU the Pallas splash-attention kernel, elsewhere XLA's softmax attention, with
    the same results. GQA (h_kv dividing h) needs enable_gqa=True, as TorchTPU. The backward is jax.vjp of
    the kernel (the backward block sizes and layouts are accepted for compatibility)."""
    n_heads, n_kv = q.shape[1], k.shape[1]
    if enable_gqa != (n_heads != n_kv):
        raise ValueError(f"enable_gqa ({enable_gqa}) does not match inputs: n_heads={n_heads}, n_kv_heads={n_kv}")
    if n_heads != n_kv:
        k = k.repeat_interleave(n_heads // n_kv, dim=1)
        v = v.repeat_interleave(n_heads // n_kv, dim=1)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    return _splash_sdpa(q, k, v, float(scale), bool(is_causal), local_window_size, block_q, block_kv,
                        block_kv_compute)
