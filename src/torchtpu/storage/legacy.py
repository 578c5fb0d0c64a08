"""The legacy typed storage classes of "tpu" (`torch.tpu.FloatStorage`, ...), as torch.cuda has them:
`tensor.storage_type()` looks its class up by name in the device's module, and `isinstance(storage,
torch.tpu.FloatStorage)` and `torch.tpu.FloatStorage(n)` (a storage on the current tpu device, made
by the PrivateUse1 allocator: storage/records.py allocate_storage) work as on CUDA."""

from __future__ import annotations

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

# class name -> element dtype (torch.storage's names)
_DTYPES = {
    "BFloat16Storage": torch.bfloat16,
    "BoolStorage": torch.bool,
    "ByteStorage": torch.uint8,
    "CharStorage": torch.int8,
    "ComplexDoubleStorage": torch.complex128,
    "ComplexFloatStorage": torch.complex64,
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "IntStorage": torch.int32,
    "LongStorage": torch.int64,
    "ShortStorage": torch.int16,
}


def _legacy_class(name, dtype):
    def element_dtype(cls):
        _warn_typed_storage_removal()
        return dtype

    # torch.storage finds a legacy class's device from the last part of its module's name
    return type(
        name,
        (_LegacyStorage,),
        {
            "__module__": "torch.tpu",
            "__qualname__": name,
            "dtype": classproperty(element_dtype),
            "_dtype": classproperty(lambda cls: dtype),
        },
    )


for _name, _dtype in _DTYPES.items():
    globals()[_name] = _legacy_class(_name, _dtype)

__all__ = list(_DTYPES)  # (the classes made above)


# ------------------------------------------------------------------ torch.UntypedStorage(n, device="tpu")
def is_tpu_device(device) -> bool:
    if device is None:
        return False
    return (device if isinstance(device, torch.device) else torch.device(device)).type == "tpu"


def untyped_storage_on_tpu(base_new, args, device):
    """What the C++ allocator would make: a storage of n bytes (or of the given bytes) on `device`,
    allocated through the "tpu" empty kernel instead (for integrations/patches.py's wrapper of
    `torch.UntypedStorage.__new__`, used without the C++ extension)."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    if len(args) == 1 and isinstance(args[0], int) and args[0] >= 0:
        return torch.empty(args[0], dtype=torch.uint8, device=device).untyped_storage()
    # anything else is built on the host first: PyTorch's own argument checks, errors and byte values
    host = base_new(torch.UntypedStorage, *args)
    return torch.empty(0, dtype=torch.uint8).set_(host).to(device).untyped_storage()
