"""torchtpu-kernels: Hub kernels for the "tpu" device (a noarch Python variant, `build/torch-tpu/`).

Each kernel is a `torch.tpu.pallas.jax_op` (one XLA executable per call in eager mode, inlined into
`torch.compile(backend="tpu")` graphs, run on XLA:CPU for "cpu" tensors):

- `rms_norm(x, weight, eps)`           Transformers' RMSNorm (float32 statistics)
- `swiglu_mlp(x, gate, up, down)`      down(silu(gate x) * up x)
- `moe_experts(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj)`
                                       a whole Mixture-of-Experts experts block: sort by expert,
                                       two ragged dots, gating, weighted sum — one executable
- `attention(q, k, v, scale, is_causal)` softmax attention (torch.tpu.ops.splash_sdpa's XLA path)

`layers` holds the `kernelize` layers (RMSNorm, SwiGLUMLP, MoEExperts) and `experts_forward` is the
experts function for Transformers' `ExpertsInterface`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from torchtpu.kernels.pallas import jax_op

from . import layers

__all__ = ["rms_norm", "swiglu_mlp", "moe_experts", "attention", "experts_forward", "layers"]


def _f32(x):
    return x.astype(jnp.float32)


@jax_op("torchtpu_kernels::rms_norm")
def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    h = _f32(x)
    h = h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
    out_dtype = jnp.promote_types(weight.dtype, x.dtype)
    return (weight.astype(out_dtype) * h.astype(x.dtype).astype(out_dtype))


@jax_op("torchtpu_kernels::swiglu_mlp")
def swiglu_mlp(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
    # weights as nn.Linear stores them: (out_features, in_features)
    g = jnp.matmul(x, gate.T, precision=lax.Precision.HIGHEST)
    u = jnp.matmul(x, up.T, precision=lax.Precision.HIGHEST)
    return jnp.matmul(jax.nn.silu(g) * u, down.T, precision=lax.Precision.HIGHEST).astype(x.dtype)


@jax_op("torchtpu_kernels::moe_experts")
def moe_experts(hidden: jax.Array, top_k_index: jax.Array, top_k_weights: jax.Array, gate_up_proj: jax.Array,
                down_proj: jax.Array) -> jax.Array:
    """hidden (T, H), top_k_index/top_k_weights (T, K), gate_up_proj (E, 2I, H), down_proj (E, H, I)."""
    tokens, k = top_k_index.shape
    experts = gate_up_proj.shape[0]
    ids = top_k_index.reshape(-1)
    order = jnp.argsort(ids, stable=True)
    rows = hidden[order // k]                                   # (T*K, H), grouped by expert
    sizes = jnp.bincount(ids, length=experts).astype(jnp.int32)
    prec = lax.Precision.HIGHEST
    gate_up = lax.ragged_dot(rows, jnp.swapaxes(gate_up_proj, 1, 2), sizes, precision=prec)   # (T*K, 2I)
    gate, up = jnp.split(gate_up, 2, axis=-1)
    act = jax.nn.silu(gate) * up
    out = lax.ragged_dot(act, jnp.swapaxes(down_proj, 1, 2), sizes, precision=prec)           # (T*K, H)
    out = out * top_k_weights.reshape(-1)[order][:, None].astype(out.dtype)
    result = jnp.zeros((tokens, hidden.shape[1]), out.dtype).at[order // k].add(out)
    return result.astype(hidden.dtype)


@jax_op("torchtpu_kernels::attention")
def attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, is_causal: bool) -> jax.Array:
    logits = jnp.einsum("bhsd,bhtd->bhst", q, k, precision=lax.Precision.HIGHEST,
                        preferred_element_type=jnp.float32) * scale
    if is_causal:
        s, t = q.shape[-2], k.shape[-2]
        mask = jnp.arange(t)[None, :] <= jnp.arange(s)[:, None] + (t - s)
        logits = jnp.where(mask, logits, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("bhst,bhtd->bhsd", weights, v.astype(jnp.float32),
                      precision=lax.Precision.HIGHEST).astype(q.dtype)


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Transformers' experts function (`ExpertsInterface`): the experts block in one kernel."""
    return moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj)
