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

Where device buffers are host memory (XLA:CPU), a mapped weight of STAGE_BYTES or more is copied into
an aligned host array of its own whose pages were made resident in one system call, and the device
buffer then adopts that array (no second copy). PJRT's own copy wrote into fresh pages, one page fault
each: with 586k faults, a float32 checkpoint's load was mostly the kernel's fault path (2.4 GB: 1.1 s
of system time). One larger than CHUNK_BYTES (an LM head: 311 MB in bf16 for a 152k vocabulary) is
copied in chunks, each chunk's file pages given back as it goes: otherwise its pages and its device
copy were both resident at once, and that one tensor set the peak of the whole load. The staged pages are
filled by reading the file itself (`_read_file`) where /proc/self/maps names it and none of the weight's
pages was written: the page cache's bytes are copied once, without faulting them into the loader's mapping
first (f32 weights: ~10% less CPU). Zero copies (the device buffer adopting the file's own pages, as torch
CPU's weights alias them) is out of reach: XLA:CPU adopts only 64-byte aligned memory, and a safetensors
file's tensors start at its header's length plus their offsets (8 mod 64 in the Qwen3 checkpoints here). (Assembling the
chunks on the device instead, into a donated buffer, took 2.4 s for 311 MB against 1.1 s for one copy.)
A weight loaded in another floating dtype (a bfloat16 checkpoint as float32) is converted by torch
CPU straight into such staged pages (`put_converted`): one pass, not a host copy in the file's dtype and
then a conversion on the device into fresh buffers.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

import numpy as np
import torch

from . import platform

MIN_BYTES = 1 << 20  # smaller copies: not worth the two system calls
STAGE_BYTES = 1 << 20  # smaller weights: PJRT's own copy
CHUNK_BYTES = 32 << 20
_MADV_DONTNEED = 4
_FILE_OR_SHARED = np.uint64(1 << 61)  # pagemap: a file page (or shared anonymous memory)
_SWAPPED = np.uint64(1 << 62)
_PRESENT = np.uint64(1 << 63)
_PAGE = mmap.PAGESIZE
_state = {}  # "madvise": libc's madvise, or None once unavailable


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
        first = np.frombuffer(f.read(8), np.uint64)  # anonymous memory (the usual CPU tensor): one read
        if first.size != 1 or (first[0] & _PRESENT and not first[0] & _FILE_OR_SHARED) or first[0] & _SWAPPED:
            return False
        entries = np.frombuffer(f.read((end - start) // _PAGE * 8 - 8), np.uint64)
    if entries.size != (end - start) // _PAGE - 1:
        return False
    anonymous = ((entries & _PRESENT) != 0) & ((entries & _FILE_OR_SHARED) == 0)
    return not (anonymous.any() or ((entries & _SWAPPED) != 0).any())


def _page_range(host):
    address = host.__array_interface__["data"][0]
    start = -(-address // _PAGE) * _PAGE  # whole pages only: neighbours may share the edges
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


def _aligned_empty(nbytes: int, align: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + align, np.uint8)  # (XLA:CPU adopts only aligned host memory; else it copies)
    offset = (-raw.__array_interface__["data"][0]) % align
    return raw[offset : offset + nbytes]


def _staging(nbytes: int) -> np.ndarray:
    """An empty host array of `nbytes` (page-aligned), its pages made resident in one system call
    (MAP_POPULATE): faulting 311 MB in page by page took most of an LM head's copy here (numpy's
    `empty` 2.2 s of CPU per GB, PJRT's own copy 0.53, this 0.48). It stays mapped while the array
    (or the device buffer that adopts it) lives."""
    flags = getattr(mmap, "MAP_POPULATE", None)
    if flags is None:
        return _aligned_empty(nbytes)
    try:
        pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags)
    except OSError:
        return _aligned_empty(nbytes)
    return np.frombuffer(pages, np.uint8, nbytes)


def give_back_heap():
    """Return the free memory glibc's heaps hold to the system (`malloc_trim`). A compiled graph's
    tracing and XLA compile free hundreds of MB that glibc kept (a 28-layer decode graph: ~140 MB
    after its compile, and the next compile's transient then came on top); 5-40 ms each, so only
    around large compiles. Elsewhere (no glibc) nothing happens."""
    trim = _state.get("malloc_trim", False)
    if trim is False:
        trim = None
        if sys.platform.startswith("linux"):
            try:
                trim = ctypes.CDLL(None).malloc_trim
                trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
            except (OSError, AttributeError):  # musl: no malloc_trim
                trim = None
        _state["malloc_trim"] = trim
    if trim is not None:
        trim(0)


def _adopt(staging: np.ndarray, index: int):
    import jax

    # the device buffer is `staging` itself, which nothing else refers to: immutable from here on
    return jax.device_put(staging, platform.jax_device(index), may_alias=True)


def _stages(flat: np.ndarray) -> bool:
    return flat.nbytes >= STAGE_BYTES and platform.buffers_in_host_memory() and _maps_a_file(flat)


def _file_region(flat: np.ndarray):
    """(path, file offset, (device major, minor, inode)) of `flat`'s bytes when one mapping of a regular
    file holds them all and none of their pages (edges included) was written by this process or swapped: a
    read of the file at that offset then gives exactly `flat`'s values. None otherwise (or where
    /proc/self/maps is unreadable)."""
    address = flat.__array_interface__["data"][0]
    try:
        with open("/proc/self/maps", "rb") as f:
            for line in f:
                span, _perms, offset, devno, inode, *path = line.split(maxsplit=5)
                lo, _, hi = span.partition(b"-")
                if int(lo, 16) <= address < int(hi, 16):
                    break
            else:
                return None
        if address + flat.nbytes > int(hi, 16) or int(inode) == 0 or not path:
            return None
        start, end = address // _PAGE * _PAGE, -(-(address + flat.nbytes) // _PAGE) * _PAGE
        if not _only_clean_file_pages(start, end):
            return None
        major, _, minor = devno.partition(b":")
        file = (int(major, 16), int(minor, 16), int(inode))
        return path[0].rstrip(b"\n"), int(offset, 16) + address - int(lo, 16), file
    except (OSError, ValueError):
        return None


def _read_file(staging: np.ndarray, region) -> bool:
    """Fill `staging` (bytes) from the file `region` names (`_file_region`) by reads, not through the
    mapping: the page cache's bytes are copied once, without faulting them into this process and then
    unmapping them (f32 Qwen3-0.6B: 2.4 GB). False (nothing read) when the path no longer names the
    mapped file (renamed, replaced, deleted)."""
    path, offset, (major, minor, inode) = region
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if (st.st_ino, os.major(st.st_dev), os.minor(st.st_dev)) != (inode, major, minor):
            return False
        view, done = memoryview(staging).cast("B"), 0
        while done < len(view):  # (Linux reads at most ~2 GiB per call)
            n = os.preadv(fd, [view[done:]], offset + done)
            if n <= 0:
                return False
            done += n
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def put_releasing(host: np.ndarray, index: int, put):
    """`put(host)` (a C-contiguous host array to a device buffer of tpu:`index`, of the same shape),
    giving back `host`'s mapped file pages: through an adopted host array of its own when `host` is
    large and maps a file on XLA:CPU (see the module's docstring), else after the copy."""
    flat = host.reshape(-1)
    if not _stages(flat):
        moved = put(host)
        if flat.nbytes >= MIN_BYTES:
            release_file_pages(flat)
        return moved
    staging = _staging(flat.nbytes).view(flat.dtype)
    region = _file_region(flat)
    if region is not None and _read_file(staging.view(np.uint8), region):
        release_file_pages(flat)  # (pages the loader's own reads made resident)
        return _adopt(staging.reshape(host.shape), index)
    part = max(1, CHUNK_BYTES // flat.itemsize)
    for at in range(0, flat.size, part):
        staging[at : at + part] = flat[at : at + part]
        release_file_pages(flat[max(0, at - part) : at + part])  # (from the last chunk: the page across the seam)
    return _adopt(staging.reshape(host.shape), index)


_CONVERTIBLE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def put_converted(src, dtype, carrier, index: int):
    """A device buffer of tpu:`index` holding CPU tensor `src` (contiguous) converted to torch `dtype`,
    stored as numpy dtype `carrier`, converted by torch CPU into staged pages the buffer adopts (see the
    module's docstring); None where that does not apply (small, not on XLA:CPU, not a float-to-float
    conversion), the caller then converting on the device."""
    if (
        src.dtype not in _CONVERTIBLE
        or dtype not in _CONVERTIBLE
        or src.numel() * dtype.itemsize < STAGE_BYTES
        or not platform.buffers_in_host_memory()
    ):
        return None
    nbytes = src.numel() * dtype.itemsize
    staging = _staging(nbytes)
    torch.frombuffer(staging, dtype=dtype, count=src.numel()).view(src.shape).copy_(src)
    if src.is_contiguous() and src.nbytes >= MIN_BYTES:
        release_file_pages(src.detach().view(-1).view(torch.uint8).numpy())
    return _adopt(staging.view(carrier).reshape(tuple(src.shape)), index)
