"""`torch.tpu` names that belong to no single layer: Precision/precision, device_of."""

from __future__ import annotations

import contextlib
import enum

import torch

from ..eager import device_module as tpu_module
from ..ops.linalg import matmul_precision


class Precision(enum.Enum):
    """XLA's dot/convolution precision (StableHLO `precision_config`), TorchTPU's names. Each is
    one of PyTorch's float32 matmul settings: DEFAULT = "medium" (one bf16 pass on TPU),
    HIGH = "high" (three), HIGHEST = "highest" (full float32)."""

    DEFAULT = "medium"
    HIGH = "high"
    HIGHEST = "highest"


@contextlib.contextmanager
def precision(mode: Precision):
    """Run matmuls and convolutions in the block at `mode`, then restore the previous setting.
    The same knob as `torch.set_float32_matmul_precision`, scoped to a block."""
    if not isinstance(mode, Precision):
        raise ValueError(f"expected a torch.tpu.Precision (DEFAULT, HIGH or HIGHEST), got {mode!r}")
    previous = matmul_precision()
    torch.set_float32_matmul_precision(mode.value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


class device_of(tpu_module.device):
    """Make the device of `obj` (a tensor or storage) current inside the block; a no-op for
    objects that are not on a tpu (CUDA's `torch.cuda.device_of`)."""

    def __init__(self, obj):
        dev = getattr(obj, "device", None)
        super().__init__(dev if isinstance(dev, torch.device) and dev.type == "tpu" else None)
