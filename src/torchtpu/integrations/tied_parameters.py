"""Keep shared (tied) parameters shared when a module moves to or from "tpu".

`nn.Module._apply` (behind `.to()`, `.tpu()`, `.cpu()`, `.half()`) converts parameters in place
(`param.data = new`) only when `torch._has_compatible_shallow_copy_type(old, new)` holds. In
PyTorch's C++ that check knows the dense backends CPU, CUDA, MPS, HIP, XPU, HPU and MTIA but not
PrivateUse1, so moving to "tpu" creates a *new* Parameter per owning module: a parameter shared
by two modules (a language model's tied input embedding and output head) becomes two, and
training then updates them separately. PyTorch's own `.to("meta")` has the same behaviour.

We wrap `Module._apply`: parameters shared before the outermost call stay shared after it, when
the conversion involved a tpu tensor. Modules whose parameters were converted in place (no new
objects) are unaffected.
"""
from __future__ import annotations

import threading

import torch

_installed = [False]
_state = threading.local()


def _wrap(original):
    def _apply(self, fn, *args, **kwargs):
        if getattr(_state, "depth", 0):
            return original(self, fn, *args, **kwargs)
        groups: dict[int, tuple] = {}  # id(parameter) -> (parameter, [(module, name), ...])
        for module in self.modules():
            for name, p in module._parameters.items():
                if p is not None:
                    groups.setdefault(id(p), (p, []))[1].append((module, name))
        shared = [(p, places) for p, places in groups.values() if len(places) > 1]
        _state.depth = 1
        try:
            result = original(self, fn, *args, **kwargs)
        finally:
            _state.depth = 0
        for old, places in shared:
            module, name = places[0]
            new = module._parameters[name]
            if new is None or new is old or "tpu" not in (old.device.type, new.device.type):
                continue
            for m, n in places[1:]:
                if m._parameters[n] is not None:
                    m._parameters[n] = new
        return result

    _apply._torchtpu = True
    return _apply


def install() -> None:
    if _installed[0]:
        return
    _installed[0] = True
    if not getattr(torch.nn.Module._apply, "_torchtpu", False):
        torch.nn.Module._apply = _wrap(torch.nn.Module._apply)
