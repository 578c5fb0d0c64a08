"""The current device (per thread, as CUDA's) and device-index validation.

With the C++ device guard loaded (native.py) the index lives there, so PyTorch's C++ (the autograd
engine's device threads, torch.accelerator) and torchtpu read the same value."""

from __future__ import annotations

import threading

from . import platform

_local = threading.local()
_native = [None]


def use_native(lib) -> None:
    _native[0] = lib


def current_device() -> int:
    lib = _native[0]
    if lib is not None:
        return lib.torchtpu_get_device()
    return getattr(_local, "index", 0)


def set_device(device) -> None:
    index = device_index(device)
    platform.jax_device(index)  # validates
    lib = _native[0]
    if lib is not None:
        lib.torchtpu_set_device(index)
    else:
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
