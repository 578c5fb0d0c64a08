"""`torch.UntypedStorage` methods whose C++ reads a storage's bytes through its data pointer, or makes
a storage with the storage's allocator: on a tpu storage (an address torchtpu invented, no allocator
of its own) they would crash the process. For tpu storages they do the same work with tensor ops on
the device, or raise a clear error; slicing and `resizable` answer as on CUDA (storage/slices.py).
integrations/patches.py wraps them (ON_TPU)."""

from __future__ import annotations

import torch

from ..device import native
from . import slices


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
    result = original(self, index)
    if isinstance(index, slice):  # PyTorch's slice shares the bytes; tensors set onto it: storage/slices.py
        slices.register(result, self, result.data_ptr() - self.data_ptr())
    return result


def _resize(original, self, size):
    if slices.is_slice(self):  # (PyTorch makes slices non-resizable; the hook would move the parent's record)
        raise RuntimeError("Trying to resize storage that is not resizable")
    _check_resizable()
    return original(self, size)


def _resizable(original, self):
    """As on CUDA: a storage resizes (through the C++ hooks) unless it is a slice of another. PyTorch's
    flag is False for every storage torchtpu makes over an invented address, though resize_ works."""
    return native.resizes_storages() and not slices.is_slice(self)


# what each wrapped `torch.UntypedStorage` method does for a tpu storage, given PyTorch's own method
# (integrations/patches.py installs them; other storages keep PyTorch's methods untouched)
ON_TPU = {
    "_byteswap": lambda original, self, elem_size: _byteswap(self, elem_size),
    "new": lambda original, self: _new(self),
    "__getitem__": _getitem,
    "resize_": _resize,
    "resizable": _resizable,
}
