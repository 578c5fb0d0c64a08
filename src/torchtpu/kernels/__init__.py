"""Custom kernels on "tpu": JAX (and Pallas) functions as PyTorch ops, and ready-made ops.

- `torchtpu.kernels.pallas` (`torch.tpu.pallas`): `jax_op`, `custom_jax_kernel`, `get_pallas_mesh`.
- `torchtpu.kernels.ops` (`torch.tpu.ops`): `ragged_dot`, `ragged_dot_weight_grad`, `splash_sdpa`,
  `optimization_barrier`.

A `jax_op` is a lowering in the project's one lowering table (ops/table.py) under the custom op's
name, so the eager engine runs it like a built-in op (one cached executable per signature) and the
torch.compile backend inlines it into compiled graphs. This package sits above eager and compile;
its submodules load on first use (`import torch` stays fast).
"""

from __future__ import annotations

import importlib

__all__ = ["ops", "pallas"]


def __getattr__(name):
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
