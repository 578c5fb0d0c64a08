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

__all__ = ["attention", "experts_forward", "layers", "moe_experts", "rms_norm", "swiglu_mlp"]


def _f32(x):
    return x.astype(jnp.float32)


def _dot_options(*operands):
    """Precision and accumulation of a product: bfloat16/float16 operands at DEFAULT precision accumulating
    in float32 (their products are exact there; XLA:TPU's ragged dot rejects HIGHEST for them), wider ones
    at PyTorch's float32 matmul setting (torch.get_float32_matmul_precision())."""
    from torchtpu.ops.linalg import operand_precision

    half = all(x.dtype in (jnp.bfloat16, jnp.float16) for x in operands)
    return {"precision": operand_precision(*operands), "preferred_element_type": jnp.float32 if half else None}


@jax_op("torchtpu_kernels::rms_norm")
def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    h = _f32(x)
    h = h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
    out_dtype = jnp.promote_types(weight.dtype, x.dtype)
    return weight.astype(out_dtype) * h.astype(x.dtype).astype(out_dtype)


@jax_op("torchtpu_kernels::swiglu_mlp")
def swiglu_mlp(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
    # weights as nn.Linear stores them: (out_features, in_features)
    g = jnp.matmul(x, gate.T, **_dot_options(x, gate))
    u = jnp.matmul(x, up.T, **_dot_options(x, up))
    h = (jax.nn.silu(g) * u).astype(jnp.promote_types(x.dtype, down.dtype))
    return jnp.matmul(h, down.T, **_dot_options(h, down)).astype(x.dtype)


@jax_op("torchtpu_kernels::moe_experts")
def moe_experts(
    hidden: jax.Array, top_k_index: jax.Array, top_k_weights: jax.Array, gate_up_proj: jax.Array, down_proj: jax.Array
) -> jax.Array:
    """hidden (T, H), top_k_index/top_k_weights (T, K) (distinct experts per token, as top-k gives),
    gate_up_proj (E, 2I, H), down_proj (E, H, I) -> (T, H).

    On TPU: XLA's ragged dot over the rows sorted by expert. Elsewhere XLA lowers a ragged dot as if every
    group spanned all rows (measured on XLA:CPU, (512, 256) x (64, 256, 256): 398 ms against 2.1 ms for the
    rows' actual work), so there each expert gets a batch of T slots instead (a token picks an expert at
    most once, so T slots always suffice): E x T rows of work instead of E x T x K."""
    from torchtpu.device import platform

    if platform.lowering_platform() != "tpu":
        return _experts_by_slots(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj)
    tokens, k = top_k_index.shape
    experts = gate_up_proj.shape[0]
    ids = top_k_index.reshape(-1)
    order = jnp.argsort(ids, stable=True)
    rows = hidden[order // k]  # (T*K, H), grouped by expert
    sizes = jnp.bincount(ids, length=experts).astype(jnp.int32)
    gate_up = lax.ragged_dot(
        rows, jnp.swapaxes(gate_up_proj, 1, 2), sizes, **_dot_options(rows, gate_up_proj)
    )  # (T*K, 2I)
    gate, up = jnp.split(gate_up, 2, axis=-1)
    act = (jax.nn.silu(gate) * up).astype(jnp.promote_types(hidden.dtype, down_proj.dtype))
    out = lax.ragged_dot(act, jnp.swapaxes(down_proj, 1, 2), sizes, **_dot_options(act, down_proj))  # (T*K, H)
    out = out * top_k_weights.reshape(-1)[order][:, None].astype(out.dtype)
    result = jnp.zeros((tokens, hidden.shape[1]), out.dtype).at[order // k].add(out)
    return result.astype(hidden.dtype)


def _experts_by_slots(hidden, ids, weights, gate_up_proj, down_proj):
    tokens = ids.shape[0]
    experts = gate_up_proj.shape[0]
    chosen = jax.nn.one_hot(ids, experts, dtype=jnp.int32).sum(1)  # (T, E): 0/1
    slot = jnp.take_along_axis(jnp.cumsum(chosen, axis=0) - chosen, ids, axis=1)  # (T, K): row in the expert's batch
    rows = jnp.broadcast_to(hidden[:, None, :], ids.shape + hidden.shape[-1:])
    batch = jnp.zeros((experts, tokens, hidden.shape[1]), hidden.dtype).at[ids, slot].set(rows)
    gate, up = jnp.split(
        jnp.einsum("eth,eoh->eto", batch, gate_up_proj, **_dot_options(batch, gate_up_proj)), 2, axis=-1
    )
    act = (jax.nn.silu(gate) * up).astype(jnp.promote_types(hidden.dtype, down_proj.dtype))
    out = jnp.einsum("eti,ehi->eth", act, down_proj, **_dot_options(act, down_proj))  # (E, T, H)
    picked = out[ids, slot] * weights[..., None].astype(out.dtype)  # (T, K, H)
    return picked.sum(1).astype(hidden.dtype)


@jax_op("torchtpu_kernels::attention")
def attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, is_causal: bool) -> jax.Array:
    logits = (
        jnp.einsum(
            "bhsd,bhtd->bhst", q, k, precision=_dot_options(q, k)["precision"], preferred_element_type=jnp.float32
        )
        * scale
    )
    if is_causal:
        s, t = q.shape[-2], k.shape[-2]
        mask = jnp.arange(t)[None, :] <= jnp.arange(s)[:, None] + (t - s)
        logits = jnp.where(mask, logits, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum(
        "bhst,bhtd->bhsd", weights, v.astype(jnp.float32), precision=_dot_options(weights)["precision"]
    ).astype(q.dtype)


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Transformers' experts function (`ExpertsInterface`): the experts block in one kernel."""
    return moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj)
