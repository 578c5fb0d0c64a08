"""The host values of small index and mask tensors just copied from the host, so that ops can check
them on the host at the op, as the CPU does, instead of a device-side assert at the next sync.

`x[[5]]`: PyTorch makes the index list a CPU tensor and copies it to the device; `torch.tensor(mask,
device="tpu")` likewise. Kept per storage address: (the buffer they became, the values), valid while
the storage still holds that buffer (a write gives it a new one).
"""

from __future__ import annotations

import torch

from .records import RECORDS

ELEMENTS = 1024  # the most elements kept per tensor
DTYPES = (torch.int64, torch.int32, torch.bool)  # those of index lists and masks
KNOWN: dict = {}  # storage address -> (buffer, numpy values); at most 64, the oldest dropped first


def remember(address, buffer, values, dtype):
    """Keep `values` (numpy, of torch dtype `dtype`) as the host copy of the storage at `address`
    while it holds `buffer`, if it may be an index list or a mask."""
    if dtype in DTYPES and values.size <= ELEMENTS:
        if len(KNOWN) >= 64:
            KNOWN.pop(next(iter(KNOWN)))
        KNOWN[address] = (buffer, values)


def values_of(t):
    """A tpu tensor's values as a CPU tensor if the host still knows them (`t` all of its storage, in
    order), else None."""
    values = numpy_of(t)
    return None if values is None else torch.from_numpy(values)


def numpy_of(t):
    """values_of as a numpy array (of `t`'s shape), or None: a host check per call reads them without
    a torch tensor (each torch CPU op costs ~10 µs)."""
    if not KNOWN or t.numel() > ELEMENTS:
        return None
    address = t.untyped_storage().data_ptr()
    kept = KNOWN.get(address)
    if kept is None:
        return None
    r = RECORDS.get(address)
    if r is None or r._buffer is not kept[0] or t.storage_offset() or not t.is_contiguous() or t.numel() != r.numel:
        return None
    return kept[1].reshape(t.shape)
