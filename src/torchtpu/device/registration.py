"""Make PrivateUse1 the "tpu" device: rename it, install the hooks and the device guard.
(`torch.tpu` itself is registered by torchtpu.api, above every layer.)"""

from __future__ import annotations

import sys
import types

import torch

from . import autocast, native, platform

_installed = [False]


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return platform.is_available()

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    # PyTorch's Python guard keeps device index 0 in C++; torchtpu tracks the current device itself
    # (torch.tpu.set_device) and every kernel takes its device from its tensors.
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _backends_module():
    m = types.ModuleType("torch.backends.tpu")
    m.is_built = lambda: True

    m.is_available = platform.is_available
    return m


def install():
    if _installed[0]:
        return
    _installed[0] = True
    if torch._C._get_privateuse1_backend_name() != "tpu":
        torch.utils.rename_privateuse1_backend("tpu")
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    # first: the C++ hooks (generators) and guard, when the extension loads or builds. PyTorch takes
    # one hooks object per process, so the Python ones below are registered only without it.
    native.at_import()
    torch._C._acc.register_python_privateuseone_hook(_Hooks())  # False (a no-op) after the C++ ones
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    autocast.install()
    torch.backends.tpu = _backends_module()
    sys.modules.setdefault("torch.backends.tpu", torch.backends.tpu)
