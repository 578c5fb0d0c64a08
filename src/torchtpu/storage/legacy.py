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
