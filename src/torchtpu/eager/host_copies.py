"""Device-to-host copies that do not wait: `pinned.copy_(x, non_blocking=True)`.

As on CUDA, a non-blocking copy from "tpu" into pinned host memory returns at once and the host
tensor holds the values once the device is synchronized with: `torch.tpu.synchronize()`, the
stream's `synchronize()`, an event recorded after the copy (`synchronize()`, or `query()` returning
True), or any blocking read from the same device (`.item()`, `.cpu()`), which on CUDA's in-order
stream also waits for the earlier copy. Until then the host tensor keeps its old values. A copy
into pageable memory waits, as on CUDA. The transfer starts at once (`copy_to_host_async`), so the
host can queue more work while the device computes the value and sends it (XLA:CPU's buffers are
host memory: nothing to send, the value is read in place at the sync point): transformers'
`generate()` reads its stop flag one token late this way (integrations/patches.py).
"""

from __future__ import annotations

import collections
import itertools
import threading

import jax
import numpy as np

from .. import metrics
from ..device import platform
from ..ops import dtypes as dt
from . import errors

_lock = threading.Lock()
_numbers = itertools.count(1)
# device index -> copies not yet written to host memory, oldest first: (number, dst, array, shape, dtype)
PENDING: dict[int, collections.deque] = {}
_last: dict[int, int] = {}  # device index -> number of its newest copy


def start(dst, array, shape, dtype, device: int) -> None:
    """Start sending `array` (a tpu tensor's values: `shape`, `dtype`) to the host; written into
    the CPU tensor `dst` (same shape) at the next sync point of `device`."""
    # (XLA:CPU's buffers are host memory: nothing to send, and starting a transfer of a value still
    # being computed costs ~30 µs: generate()'s stop flag, every token)
    if not platform.buffers_in_host_memory():
        array.copy_to_host_async()
    with _lock:
        number = next(_numbers)
        PENDING.setdefault(device, collections.deque()).append((number, dst, array, shape, dtype))
        _last[device] = number


def last(device: int) -> int:
    """The number of the newest copy from `device` (0: none yet): what an event recorded now covers."""
    return _last.get(device, 0)


def ready(device: int, upto: int) -> bool:
    """Whether the copies from `device` numbered up to `upto` have arrived (writing them waits for nothing)."""
    with _lock:
        queue = PENDING.get(device)
        return queue is None or all(array.is_ready() for number, _, array, _, _ in queue if number <= upto)


def finish(device: int, upto: int | None = None) -> None:
    """Write the copies from `device` (those numbered up to `upto`; all by default) into their host
    tensors, oldest first, waiting for each value."""
    while True:
        with _lock:
            queue = PENDING.get(device)
            if not queue or (upto is not None and queue[0][0] > upto):
                if queue is not None and not queue:
                    del PENDING[device]
                return
            _, dst, array, shape, dtype = queue.popleft()
        try:
            host = np.asarray(array).reshape(shape)
        except jax.errors.JaxRuntimeError as e:  # the computation failed (out of memory...): say so here
            errors.raise_out_of_memory(e)
            raise
        metrics.counters.d2h_bytes += host.nbytes
        metrics.counters.d2h_transfers += 1
        dst.copy_(dt.cpu_from_numpy(host, dtype))
