"""Whole-storage moves between the host and tpu (torch.load, `storage.to("tpu")`, `storage.tpu()`).

PyTorch moves a storage by allocating `torch.UntypedStorage(n, device="tpu")` through the device's
C++ allocator, which a Python backend cannot provide. These paths instead allocate through the
"tpu" empty kernel (a storage we own) and copy the bytes into it. integrations/patches.py routes
PyTorch's storage moves here (`torch.storage._to`, `UntypedStorage.clone`/`.tpu`, torch.load).
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


def deserialize(obj, location):
    """torch.load's restore function for the location "tpu" (registered by integrations/patches.py)."""
    if location.startswith("tpu"):
        return storage_to_tpu(obj, torch.device(location))
    return None
