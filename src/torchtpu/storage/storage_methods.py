"""`torch.UntypedStorage` methods whose C++ reads a storage's bytes through its data pointer, or makes
a storage with the storage's allocator: on a tpu storage (an address torchtpu invented, no allocator
of its own) they would crash the process. For tpu storages they do the same work with tensor ops on
the device, or raise a clear error; integrations/patches.py wraps them (ON_TPU)."""

from __future__ import annotations

import torch

from ..device import native


def _as_bytes(storage) -> torch.Tensor:
    """A uint8 tensor over all of `storage`: its bytes, shared."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _byteswap(self, elem_size):
    """Reverse the bytes of each `elem_size`-byte element, in place (PyTorch's C++ loops over host memory)."""
    if self.nbytes() % elem_size != 0:
        raise RuntimeError(f"the length of data is not a multiple of {elem_size}")
    if elem_size > 1 and self.nbytes():
        data = _as_bytes(self)
        data.copy_(data.view(-1, elem_size).flip(-1).reshape(-1))


def _new(self):
    """An empty storage on the same device (PyTorch's C++ would allocate it with this storage's allocator)."""
    return torch.UntypedStorage(0, device=self.device)


def _check_slice(self, index):
    """A slice from byte 0 shares the storage's address, and so its record: it works as on CUDA. One
    starting further in would be a storage at an address inside another's, which has no record."""
    start, stop, _ = index.indices(self.nbytes())
    if 0 < start < stop:
        raise NotImplementedError(
            f"slicing a tpu storage from byte {start} (storage[{start}:{stop}]) is not supported: a tpu "
            "storage's bytes are one device array, and a storage starting inside it has none of its own. "
            "Slice a tensor over it instead: torch.empty(0, dtype=torch.uint8, device=s.device).set_(s)[start:stop]"
        )


def _check_resizable():
    """Resizing goes through the C++ hooks (device/csrc/tpu_hooks.cpp); without them, PyTorch's
    message would name an interface to register rather than what is missing."""
    if not native.resizes_storages():
        raise NotImplementedError(
            "resizing a tpu storage needs torchtpu's C++ extension, which is not loaded: "
            f"{native.problem() or 'TORCHTPU_NATIVE=off'}. Install a C++ compiler (g++) and run "
            "`python -m torchtpu info`; tensor.resize_ works without it (onto a new storage)."
        )


def _getitem(original, self, index):
    if isinstance(index, slice):
        _check_slice(self, index)
    return original(self, index)


def _resize(original, self, size):
    _check_resizable()
    return original(self, size)


# what each wrapped `torch.UntypedStorage` method does for a tpu storage, given PyTorch's own method
# (integrations/patches.py installs them; other storages keep PyTorch's methods untouched)
ON_TPU = {
    "_byteswap": lambda original, self, elem_size: _byteswap(self, elem_size),
    "new": lambda original, self: _new(self),
    "__getitem__": _getitem,
    "resize_": _resize,
}
