"""Make 🤗 Accelerate (and so the Transformers `Trainer`) pick "tpu" as its default device.

Accelerate's `PartialState.default_device` knows a fixed list of device types (mps, cuda, xpu,
npu, ...) and otherwise returns "cpu"; it does not ask `torch.accelerator`. When accelerate's own
list finds nothing and PyTorch's current accelerator is "tpu", we return "tpu" instead. Everything
else (an explicit `cpu=True`, `ACCELERATE_TORCH_DEVICE`, CUDA, ...) is left untouched.
"""
from __future__ import annotations

import torch

from .._import_hooks import when_imported

_installed = [False]


def _tpu_default() -> torch.device | None:
    try:
        acc = torch.accelerator.current_accelerator(check_available=True)
    except Exception:
        return None
    if acc is None or acc.type != "tpu":
        return None
    return torch.device("tpu", torch.tpu.current_device())


def _patch_state(module) -> None:
    cls = getattr(module, "PartialState", None)
    prop = cls.__dict__.get("default_device") if cls is not None else None
    if not isinstance(prop, property) or getattr(prop.fget, "_torchtpu", False):
        return
    original = prop.fget

    def default_device(self):
        device = original(self)
        if device.type == "cpu":
            return _tpu_default() or device
        return device

    default_device._torchtpu = True
    default_device.__doc__ = original.__doc__
    cls.default_device = property(default_device)


def install() -> None:
    """Idempotent; patches `accelerate.state` now or when it is first imported."""
    if _installed[0]:
        return
    _installed[0] = True
    when_imported("accelerate.state", _patch_state)
