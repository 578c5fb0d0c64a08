"""`DataLoader(pin_memory=True)` when "tpu" is the current accelerator: pinning is skipped.

PyTorch's DataLoader pins batches for the current accelerator (`torch.accelerator`), which for a
PrivateUse1 backend asks the C++ hooks for a pinned-memory allocator; a backend written in Python
cannot provide one, so every `pin_memory=True` loader (the Transformers Trainer's default) fails
with "implement `getPinnedMemoryAllocator`". Host-to-device copies on "tpu" go through
`jax.device_put` and gain nothing from page-locked memory, so we do what PyTorch itself does for
MPS: the iterator turns pinning off, with a one-time warning.
"""
from __future__ import annotations

import warnings

_installed = [False]
_warned = [False]


def install() -> None:
    if _installed[0]:
        return
    _installed[0] = True
    from torch.utils.data import dataloader

    cls = dataloader._BaseDataLoaderIter
    original = cls.__init__
    if getattr(original, "_torchtpu", False):
        return

    def __init__(self, loader, *args, **kwargs):
        original(self, loader, *args, **kwargs)
        if getattr(self, "_pin_memory", False) and getattr(self, "_pin_memory_device", None) == "tpu":
            self._pin_memory = False
            if not _warned[0]:
                _warned[0] = True
                warnings.warn("torchtpu: 'pin_memory' is not used on tpu (host copies go through XLA); "
                              "batches are not pinned.", stacklevel=2)

    __init__._torchtpu = True
    cls.__init__ = __init__
