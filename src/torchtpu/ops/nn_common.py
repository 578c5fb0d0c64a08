"""Helpers shared by the nn lowering modules (activations, convolution, pooling, normalization,
losses, embedding, attention, grid_sample)."""

from __future__ import annotations

import jax.numpy as jnp
import torch


def _low(a):
    return a.dtype in (jnp.float16, jnp.bfloat16)


def _precision():
    from .linalg import precision

    return precision()


def _grad_input_meta(grad, self, *args, **kwargs):
    """Meta kernel (PyTorch ships none) of a backward op whose result has its input's shape and dtype."""
    return torch.empty_like(self)
