"""FSDP2 on "tpu": its storage helpers.

FSDP2 frees an unsharded parameter after use with `untyped_storage().resize_(0)` and brings it back
with `resize_(nbytes)` before the next all-gather writes it. PyTorch resizes a PrivateUse1 storage
through a C++ hook (`resizePrivateUse1Bytes`), which torchtpu has only with its C++ extension
(device/csrc/tpu_hooks.cpp), and a resize moves the storage to a new address. For tpu tensors the
storage keeps its size and address and the device buffer is what gets freed: dropping the record's
buffer releases the device memory exactly as the resize would, with or without the extension, and
the all-gather gives it a new one. CPU/CUDA tensors keep PyTorch's helpers.
"""

from __future__ import annotations

from .._import_hooks import when_imported
from ..storage import records


def _free_tpu_buffer(tensor) -> None:
    record = records.RECORDS.get(tensor.untyped_storage().data_ptr())
    if record is not None and record._buffer is not None:
        records.stats(record.device_index).materialized -= record.nbytes
        record.buffer = None


def _patch(module) -> None:
    alloc, free = module.alloc_storage, module.free_storage
    if getattr(alloc, "_torchtpu", False):
        return

    def alloc_storage(tensor):
        if tensor.device.type != "tpu":
            alloc(tensor)

    def free_storage(tensor):
        if tensor.device.type == "tpu":
            _free_tpu_buffer(tensor)
        else:
            free(tensor)

    alloc_storage._torchtpu = free_storage._torchtpu = True
    module.alloc_storage, module.free_storage = alloc_storage, free_storage


def _patch_group(module) -> None:
    import torch.distributed.fsdp._fully_shard._fsdp_param as param

    _patch(param)
    module.alloc_storage = param.alloc_storage


def install() -> None:
    when_imported("torch.distributed.fsdp._fully_shard._fsdp_param", _patch)
    when_imported("torch.distributed.fsdp._fully_shard._fsdp_param_group", _patch_group)
