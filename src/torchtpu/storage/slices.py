"""Storages sliced out of a tpu storage (`storage[4:8]`), sharing its bytes as on CUDA.

PyTorch makes such a slice itself: a storage whose data pointer is the parent's plus the start, which
keeps the parent alive and cannot be resized. A slice starting inside its parent has an address no
record holds (a record is one device array: storage/records.py), so no tensor is ever left on it:
`set_` onto a slice (every storage method that reads or writes bytes goes through one: `s[i]`,
`s.fill_`, `s.copy_`, `s.tolist()`) sets the tensor onto the storage the slice was cut from, further
in by the slice's start. The tensor then shares the bytes, reads and writes them through the
parent's record, and has the data pointer it would have on CUDA; only `untyped_storage()` answers
the parent instead of the slice. A slice from byte 0 shares its parent's address and record and
stays as PyTorch makes it; it is known here only so that resizing it is refused, as CUDA does.
"""

from __future__ import annotations

import weakref

# slice storage (its Python object, which PyTorch keeps as long as the storage lives) ->
# (the storage it shares bytes with, not itself a slice; the byte where it starts there)
_SLICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register(sliced, parent, start: int) -> None:
    """`sliced` is `parent[start:...]` (PyTorch's slice): remember where its bytes are."""
    origin = _SLICES.get(parent)
    if origin is not None:  # a slice of a slice: of the same bytes, further in
        parent, start = origin[0], origin[1] + start
    _SLICES[sliced] = (parent, start)


def is_slice(storage) -> bool:
    return bool(_SLICES) and storage in _SLICES


def origin(storage):
    """(the storage `storage` was sliced from, its start byte there) for a slice starting inside
    its parent; None for any other storage (a slice from byte 0 is its parent's record itself)."""
    if not _SLICES:
        return None
    found = _SLICES.get(storage)
    return found if found is not None and found[1] else None


def on_parent(t):
    """`t`, over a storage PyTorch made at a slice's address itself (`_write_file`'s `from_blob` over
    the slice's data pointer: torch.save's legacy format, pickling a slice), as a tensor over the
    slice's parent; None where no live slice starts at that address."""
    address = t.untyped_storage().data_ptr()
    for sliced, (parent, start) in list(_SLICES.items()):
        if start and sliced.data_ptr() == address:
            if start % t.element_size():
                return None
            empty = t.new_empty(0)
            return empty.set_(parent, t.storage_offset() + start // t.element_size(), t.shape, t.stride())
    return None
