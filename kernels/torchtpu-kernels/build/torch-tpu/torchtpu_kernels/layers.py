"""Layers for `kernels.kernelize`: each replaces the forward of a Transformers layer that declares the
hub kernel of the same name (`@use_kernel_forward_from_hub("RMSNorm")`), using that layer's own weights."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    weight: torch.Tensor
    variance_epsilon: float

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        from . import rms_norm

        return rms_norm(hidden_states, self.weight, float(self.variance_epsilon))


class SwiGLUMLP(nn.Module):
    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from . import swiglu_mlp

        return swiglu_mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight)


class MoEExperts(nn.Module):
    gate_up_proj: torch.Tensor
    down_proj: torch.Tensor

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        from . import moe_experts

        return moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj)


__all__ = ["MoEExperts", "RMSNorm", "SwiGLUMLP"]
