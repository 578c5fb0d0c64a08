"""Giving back the host pages of a memory-mapped file once its bytes are on the device.

`from_pretrained(..., device_map="tpu")` reads a safetensors checkpoint through a memory map that stays
open until loading ends; each weight's pages become resident as they are copied to the device. On
torch CPU those pages *are* the weights (the model aliases the map), but on "tpu" the device holds its
own copy, so at the end of loading the process held the model twice (XLA:CPU's buffers are host
memory too). After a large host-to-device copy, the whole pages of the source that are clean pages of
a file mapping are unmapped from the process (`madvise(MADV_DONTNEED)`): their bytes stay in the page
cache and in the file, and a later read of the source maps them again, with the same values. A page
the process wrote (a private mapping's copy-on-write page) or anonymous memory is never touched:
`/proc/self/pagemap` tells them apart, page by page. Linux only; elsewhere nothing happens.

A weight larger than CHUNK_BYTES (an LM head: 311 MB in bf16 for a 152k vocabulary) goes over in
chunks, each chunk's pages given back before the next is read, into a device buffer that each chunk
updates in place (donated): otherwise its pages and its device copy were both resident at once, and
that one tensor set the peak of the whole load.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import sys

import numpy as np

MIN_BYTES = 1 << 20   # smaller copies: not worth the two system calls
CHUNK_BYTES = 32 << 20
_MADV_DONTNEED = 4
_FILE_OR_SHARED = np.uint64(1 << 61)   # pagemap: a file page (or shared anonymous memory)
_SWAPPED = np.uint64(1 << 62)
_PRESENT = np.uint64(1 << 63)
_PAGE = mmap.PAGESIZE
_state = {}   # "madvise": libc's madvise, or None once unavailable


def _madvise():
    fn = _state.get("madvise", False)
    if fn is False:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
                with open("/proc/self/pagemap", "rb"):
                    pass
            except (OSError, AttributeError):
                fn = None
        _state["madvise"] = fn
    return fn


def _only_clean_file_pages(start: int, end: int) -> bool:
    """Whether every page in [start, end) is a file page or not resident: none written by this process
    (a written page of a private mapping is anonymous), none swapped out."""
    with open("/proc/self/pagemap", "rb", buffering=0) as f:
        f.seek(start // _PAGE * 8)
        first = np.frombuffer(f.read(8), np.uint64)   # anonymous memory (the usual CPU tensor): one read
        if first.size != 1 or (first[0] & _PRESENT and not first[0] & _FILE_OR_SHARED) or first[0] & _SWAPPED:
            return False
        entries = np.frombuffer(f.read((end - start) // _PAGE * 8 - 8), np.uint64)
    if entries.size != (end - start) // _PAGE - 1:
        return False
    anonymous = ((entries & _PRESENT) != 0) & ((entries & _FILE_OR_SHARED) == 0)
    return not (anonymous.any() or ((entries & _SWAPPED) != 0).any())


def _page_range(host):
    address = host.__array_interface__["data"][0]
    start = -(-address // _PAGE) * _PAGE              # whole pages only: neighbours may share the edges
    return start, (address + host.nbytes) // _PAGE * _PAGE


def release_file_pages(host: np.ndarray) -> int:
    """Unmap the whole pages of `host`'s bytes (already copied elsewhere) that are clean pages of a
    mapped file; returns the bytes given back (0 when `host` is small, anonymous memory, or written)."""
    if host.nbytes < MIN_BYTES or not host.flags.c_contiguous:
        return 0
    madvise = _madvise()
    if madvise is None:
        return 0
    start, end = _page_range(host)
    if end - start < _PAGE:
        return 0
    try:
        if not _only_clean_file_pages(start, end):
            return 0
    except OSError:
        return 0
    return end - start if madvise(start, end - start, _MADV_DONTNEED) == 0 else 0


def _maps_a_file(flat: np.ndarray) -> bool:
    start, end = _page_range(flat)
    try:
        return end - start >= _PAGE and _madvise() is not None and _only_clean_file_pages(start, start + _PAGE)
    except OSError:
        return False


@functools.lru_cache(maxsize=64)
def _chunk_programs(n, part, dtype):
    import jax
    import jax.numpy as jnp
    from jax import lax

    first = jax.jit(lambda p: lax.dynamic_update_slice(jnp.zeros((n,), dtype), p, (0,)))
    rest = jax.jit(lambda full, p, at: lax.dynamic_update_slice(full, p, (at,)), donate_argnums=0)
    return first, rest


def put_releasing(flat: np.ndarray, put):
    """`put(flat)` (a flat host array to a device buffer), giving back `flat`'s mapped file pages:
    in chunks when `flat` is large and maps a file (see the module's docstring), else after the copy."""
    if flat.nbytes <= CHUNK_BYTES or not _maps_a_file(flat):
        moved = put(flat)
        if flat.nbytes >= MIN_BYTES:
            release_file_pages(flat)
        return moved
    n, part = flat.size, max(1, CHUNK_BYTES // flat.itemsize)
    first, rest = _chunk_programs(n, part, flat.dtype)
    full, done = None, 0
    for at in range(0, n, part):
        at = min(at, n - part)   # the last chunk overlaps its predecessor: one program for every chunk
        piece = put(flat[at:at + part])
        full = first(piece) if full is None else rest(full, piece, np.int64(at))
        full.block_until_ready()   # (the chunk read and consumed: one chunk alive at a time)
        release_file_pages(flat[done:at + part])   # (from the last chunk's start: the pages across the seam)
        done = at
    return full
