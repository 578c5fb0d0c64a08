"""`torch.tpu.ops`: ready-made kernels, each a jax_op (`torch.ops.tpu.*`): eager ops on "tpu", inlined in
compiled graphs, run on XLA:CPU for "cpu" tensors.

- `ragged_dot(lhs, rhs, group_sizes, *, out=None)`: per-group matmuls (Mixture-of-Experts), XLA's ragged
  dot; differentiable in lhs and rhs. `ragged_dot_weight_grad(lhs, grad_output, group_sizes)`: its
  gradient with respect to rhs.
- `splash_sdpa(q, k, v, *, scale=None, is_causal=True, local_window_size=None, ...)`: attention with
  TorchTPU's signature: the Pallas splash-attention kernel on TPU (ops/attention_splash.py), XLA's softmax
  attention elsewhere and for what the kernel does not take (sequences under 128, rows with no key).
- `optimization_barrier(inputs)`: XLA's optimization barrier around a list of tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..ops import attention_splash, linalg
from ..ops.dtypes import opmath
from .pallas import dynamo_traceable, jax_op

__all__ = ["optimization_barrier", "ragged_dot", "ragged_dot_weight_grad", "splash_sdpa"]


@jax_op("tpu::_ragged_dot")
def _ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    out = linalg.ragged_dot(
        lhs,
        rhs,
        group_sizes.astype(jnp.int32),
        precision=linalg.operand_precision(lhs, rhs),
        preferred_element_type=opmath(lhs.dtype),
    )
    return out.astype(lhs.dtype)


@jax_op("tpu::_ragged_dot_weight_grad")
def _ragged_dot_weight_grad(lhs: jax.Array, grad_output: jax.Array, group_sizes: jax.Array) -> jax.Array:
    # rows of lhs and grad_output split into groups: one (k, n) = lhs_g^T @ grad_g per group
    numbers = lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(((1,), (0,)), ((), ())), lhs_ragged_dimensions=[1], rhs_group_dimensions=[]
    )
    out = lax.ragged_dot_general(
        lhs.T,
        grad_output,
        group_sizes.astype(jnp.int32),
        numbers,
        precision=linalg.operand_precision(lhs, grad_output),
        preferred_element_type=opmath(lhs.dtype),
    )
    return out.astype(lhs.dtype)


@dynamo_traceable
def _check_ragged(lhs, rhs, group_sizes):
    if lhs.dim() != 2 or rhs.dim() != 3 or group_sizes.dim() != 1:
        raise ValueError(
            f"ragged_dot: expected lhs (m, k), rhs (g, k, n), group_sizes (g,); got {tuple(lhs.shape)}, "
            f"{tuple(rhs.shape)}, {tuple(group_sizes.shape)}"
        )
    if lhs.shape[1] != rhs.shape[1] or rhs.shape[0] != group_sizes.shape[0]:
        raise ValueError(
            f"ragged_dot: shapes do not match: lhs {tuple(lhs.shape)}, rhs {tuple(rhs.shape)}, "
            f"group_sizes {tuple(group_sizes.shape)}"
        )
    if group_sizes.dtype.is_floating_point or group_sizes.dtype.is_complex:
        raise TypeError(f"ragged_dot: group_sizes must be an integer tensor, got {group_sizes.dtype}")


@dynamo_traceable
def ragged_dot(
    lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, *, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """result[start_i:end_i] = lhs[start_i:end_i] @ rhs[i], the groups' rows consecutive in lhs with
    `group_sizes[i]` rows each (they sum to at most m; rows past the last group are zero). lhs (m, k), rhs
    (g, k, n), group_sizes (g,) integers -> (m, n). Differentiable in lhs and rhs when `out` is not given."""
    _check_ragged(lhs, rhs, group_sizes)
    if out is None:
        return _ragged_dot(lhs, rhs, group_sizes)
    if torch.is_grad_enabled() and (lhs.requires_grad or rhs.requires_grad):
        raise RuntimeError(
            "ragged_dot(): functions with out=... arguments don't support automatic "
            "differentiation, but one of the arguments requires grad."
        )
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
def _xla_attention(q, k, v, scale, is_causal, local_window_size):
    """Softmax attention in XLA (float32 softmax), q (b, h, s, d), k/v (b, h_kv, t, d), queries aligned to
    the end of the keys."""
    if k.shape[1] != q.shape[1]:  # grouped-query attention: query head i reads key head i // (h / h_kv)
        k = jnp.repeat(k, q.shape[1] // k.shape[1], axis=1)
        v = jnp.repeat(v, q.shape[1] // v.shape[1], axis=1)
    s, t = q.shape[-2], k.shape[-2]
    logits = (
        jnp.einsum(
            "bhsd,bhtd->bhst", q, k, precision=linalg.operand_precision(q, k), preferred_element_type=jnp.float32
        )
        * scale
    )
    mask = None
    rows = jnp.arange(s)[:, None] + (t - s)  # queries aligned to the end of the keys
    cols = jnp.arange(t)[None, :]
    if is_causal:
        mask = cols <= rows
    if local_window_size is not None:
        window = cols > rows - local_window_size
        mask = window if mask is None else mask & window
    if mask is not None:
        logits = jnp.where(mask, logits, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=-1)
    weights = jnp.where(jnp.isnan(weights), 0.0, weights)  # fully masked rows give zeros
    weights = weights.astype(v.dtype) if v.dtype != jnp.float32 else weights
    out = jnp.einsum(
        "bhst,bhtd->bhsd",
        weights,
        v,
        precision=linalg.operand_precision(weights, v),
        preferred_element_type=jnp.float32,
    )
    return out.astype(q.dtype)


@jax_op("tpu::_splash_sdpa")
def _splash_sdpa(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    scale: float,
    is_causal: bool,
    local_window_size: int | None,
    block_q: int,
    block_kv: int,
    block_kv_compute: int,
) -> jax.Array:
    # TorchTPU's splash_sdpa aligns the queries to the end of the keys: query i sits at key i + (t - s)
    plan = attention_splash.plan(
        q,
        k,
        v,
        causal=is_causal,
        offset=k.shape[2] - q.shape[2],
        window=local_window_size,
        block_q=block_q,
        block_kv=block_kv,
    )
    if plan is not None:
        return attention_splash.attention(plan, q, k, v, scale)
    return _xla_attention(q, k, v, scale, is_causal, local_window_size)


@dynamo_traceable
def splash_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: Optional[float] = None,
    is_causal: bool = True,
    local_window_size: Optional[int] = None,
    enable_gqa: bool = False,
    block_q: int = 512,
    block_kv: int = 512,
    block_dkv: int = 512,
    block_kv_compute: int = 512,
    block_q_dkv: int = 512,
    block_kv_dkv: int = 512,
    block_kv_dkv_compute: int = 512,
    block_q_dq: Optional[int] = None,
    block_kv_dq: Optional[int] = None,
    use_fused_bwd_kernel: bool = True,
    use_vmap_bwd: bool = True,
    q_layout: str = "HEAD_DIM_MINOR",
    k_layout: str = "HEAD_DIM_MINOR",
    v_layout: str = "HEAD_DIM_MINOR",
) -> torch.Tensor:
    """`F.scaled_dot_product_attention` for q (b, h, s, d), k/v (b, h_kv, t, d), queries aligned to the end of
    the keys: TorchTPU's splash attention signature. On TPU the Pallas splash-attention kernel, forward and
    backward (any sequence length from 128: padded inside; bfloat16 or float32), elsewhere XLA's softmax
    attention, with the same results. GQA (h_kv dividing h) needs enable_gqa=True, as TorchTPU; on TPU the key
    heads are not repeated (splash's MQA kernel per key head). block_q / block_kv are used when they divide
    the padded lengths; the backward uses the forward's blocks in splash's fused backward kernel, and the other
    block sizes and the layouts are accepted for compatibility."""
    n_heads, n_kv = q.shape[1], k.shape[1]
    if enable_gqa != (n_heads != n_kv):
        raise ValueError(f"enable_gqa ({enable_gqa}) does not match inputs: n_heads={n_heads}, n_kv_heads={n_kv}")
    if n_kv == 0 or n_heads % n_kv:
        raise ValueError(f"splash_sdpa: the query heads ({n_heads}) must be a multiple of the key heads ({n_kv})")
    if local_window_size is not None and local_window_size < 1:
        raise ValueError(f"splash_sdpa: local_window_size must be at least 1, got {local_window_size}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    return _splash_sdpa(q, k, v, float(scale), bool(is_causal), local_window_size, block_q, block_kv, block_kv_compute)
