"""The current device (per thread, as CUDA's) and device-index validation."""
from __future__ import annotations

import threading

from . import platform

_local = threading.local()


def current_device() -> int:
    return getattr(_local, "index", 0)


def set_device(device) -> None:
    index = device_index(device)
    platform.jax_device(index)  # validates
    _local.index = index


def device_index(device, optional=False) -> int:
    """The index of `device` given as int, str ("tpu:1") or torch.device; None -> current."""
    import torch

    if device is None:
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "tpu":
            raise ValueError(f"Expected a tpu device, but got: {device}")
        return current_device() if device.index is None else device.index
    return int(device)
