"""Whole-storage moves between the host and tpu (torch.load, `storage.to("tpu")`, `storage.tpu()`).

PyTorch moves a storage by allocating `torch.UntypedStorage(n, device="tpu")` through the device's
C++ allocator, which a Python backend cannot provide. These paths instead allocate through the
"tpu" empty kernel (a storage we own) and copy the bytes into it.
"""
from __future__ import annotations

import torch

from ..device.state import device_index


def storage_to_tpu(storage, device=None, non_blocking=False):
    index = device_index(device)
    if storage.device.type == "tpu" and storage.device.index == index:
        return storage
    src = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage.untyped())
    dst = torch.empty(storage.nbytes(), dtype=torch.uint8, device=torch.device("tpu", index))
    dst.copy_(src, non_blocking=non_blocking)
    return dst.untyped_storage()


def clone_tpu_storage(storage):
    src = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    return src.clone().untyped_storage()


def _deserialize(obj, location):
    if location.startswith("tpu"):
        return storage_to_tpu(obj, torch.device(location))
    return None


def install():
    original_to = torch.storage._to

    def _to(self, device, non_blocking=False):
        device = torch.device(device)
        if device.type == "tpu":
            return storage_to_tpu(self, device, non_blocking)
        return original_to(self, device, non_blocking)

    torch.storage._to = _to
    original_clone = torch.UntypedStorage.clone

    def clone(self):
        return clone_tpu_storage(self) if self.device.type == "tpu" else original_clone(self)

    torch.UntypedStorage.clone = clone
    torch.UntypedStorage.tpu = lambda self, device=None, non_blocking=False: storage_to_tpu(self, device, non_blocking)
    torch.serialization.register_package(1, lambda obj: None, _deserialize)
