"""Device-side asserts at run time: the conditions ops/checks.py collected, checked at sync points.

An executable with checks returns one extra int32 scalar (0, or 1 + the first failed condition);
`note` keeps it (it costs no wait) and the next synchronization (a copy to the host, `.item()`,
`torch.tpu.synchronize()`) raises that condition's message, as CUDA reports a device-side assert at
the next synchronizing call. In the "debug" eager mode the check runs at the op itself.

Three promises beyond "reported at the next sync":

- **Raised in the thread that caused it.** Verdicts wait in a per-thread list; a thread's sync
  checks its own, so another thread's `.item()` never receives it. (Backward runs on autograd's
  device threads for a caller we cannot name: its verdicts go to a shared list that the next sync of
  any thread reports; with one thread calling backward, that is the caller.)
- **Sticky, as on CUDA, except for bounds.** Once raised, every later op and sync on that device
  raises the same error (naming the op) until `clear_error(device)` (`torch.tpu.clear_device_assert`).
  CUDA never clears (its context is corrupt); here nothing was corrupted (next point), so clearing is
  safe. An index out of range (DeviceIndexError, an IndexError as the CPU raises), and the other
  bounds checks a lowering declares `recoverable` (masked_scatter's source too short), are raised once
  and leave the device working: only the failed op's own results are meaningless.
- **Writes that may depend on a failed check are not committed.** While unchecked verdicts exist,
  eager in-place writes into existing storages run gated (`poison`): the executable also takes the
  maximum of the verdicts the write may depend on (the thread's own and backward's; in backward,
  every thread's) and keeps each written storage's old value unless it is 0. So
  `embedding(bad ids) -> loss -> backward -> opt.step()` leaves the weights, gradients and AdamW
  moments as they were before the failed op. Not gated: new tensors (they are new, and the sticky
  error stops their use), host-side state (AdamW's `step` counter is a CPU tensor), and writes by
  compiled graphs and `torch.tpu.optimizers` (their executables have no gate yet).
"""

from __future__ import annotations

import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..device import platform
from ..ops.checks import RECOVERABLE
from . import fusion, tpu_check
from .fusion import Pending
from .modes import _mode

# Verdicts waiting for a synchronization, checked together: one executable stacks them (padded to a
# power of two, so at most log2(LIMIT) + 1 of them per device), one transfer brings them to the host
# (fetching each one costs ~25 µs); on XLA:CPU, where they already lie in host memory, each is read
# as it is (~2 µs: no executable to run and wait for). A loop that never reads a value back is
# checked every LIMIT checked ops, so the list stays short.
LIMIT = 256
_stackers = {}
# device index -> the DeviceAssertError that put it in the error state (sticky until clear_error)
FAILED: dict = {}


class _State:
    """One thread's unchecked verdicts."""

    __slots__ = ("__weakref__", "cleared", "pending", "poison", "scan")

    def __init__(self):
        self.pending = []  # (verdict array or Pending, messages, where, number), in noting order
        self.poison = {}  # device index -> (_version when computed, gate value or None)
        self.cleared = 0  # bumped when items leave `pending` (check, discard): `scan` starts over
        # device index -> [cleared, items of `pending` scanned, their verdicts on that device that
        # may still gate a write]: poison scans only the items noted since its last call, and on
        # XLA:CPU drops the verdicts it read as passed (a decode step notes a verdict per cache write)
        self.scan = {}


_local = threading.local()
_threads = weakref.WeakSet()  # every live thread's _State (discard, gating in autograd threads)
# Backward runs a tpu graph on autograd's device threads, for the thread that called backward (which
# waits): their verdicts go to this shared list, which the next check of any thread adopts.
_autograd = _State()
_in_backward = torch._C._current_graph_task_id
_unchecked = [0]  # verdicts pending in all threads together (gating is free when 0)
_version = [0]  # bumped whenever a pending list changes (poison caches on it)
_noted = [0]  # verdicts noted so far (each pending item carries its number: `check(upto=)`)


def _state():
    if _in_backward() != -1:
        return _autograd
    s = getattr(_local, "s", None)
    if s is None:
        s = _local.s = _State()
        _threads.add(s)
    return s


class DeviceAssertError(RuntimeError):
    """A device-side assert: an op was given values it does not accept (an index out of range)."""


class DeviceIndexError(DeviceAssertError, IndexError):
    """A device-side assert on an index out of range: an IndexError, as the CPU raises for it."""


def _error_type(message):
    return DeviceIndexError if "index" in message and "out of" in message else DeviceAssertError


def note(verdict, messages, where):
    """Keep an executable's verdict; `where` names the op or graph for the message."""
    pending = _state().pending
    _noted[0] += 1
    pending.append((verdict, messages, where, _noted[0]))
    _unchecked[0] += 1
    _version[0] += 1
    if len(pending) >= LIMIT or _mode[0] == "debug":
        check()


def _device_index(verdict):
    if type(verdict) is Pending:
        return verdict.segment.device
    return platform.devices().index(next(iter(verdict.devices())))


def gating() -> bool:
    """Whether some thread has verdicts not checked yet (then writes ask `poison` for their gate)."""
    return _unchecked[0] > 0


def poison(device_index, queue=False):
    """The gate of a write on tpu:`device_index`: the maximum of the unchecked verdicts it may depend
    on (an int32 scalar array; a gated write keeps the old value unless it is 0), or None when there
    are none. Those are this thread's and backward's; in backward (autograd's device threads work for
    a thread we cannot name) every thread's. On XLA:CPU the verdicts already computed are read instead
    of combined (_read_ready): no gate when they all passed and none is still running (not in the
    fused mode).

    `queue` (a write the fused mode queues): verdicts still queued in this thread's list stay queued
    and the gate may be a queued result (the maximum is queued too), so a gated write does not cut the
    segment it joins (a decode step's cache writes would cut it eight times); none is read
    (_queued_gate). Otherwise queued verdicts are run first (their segment flushes; no host wait)."""
    state = _state()
    # (the fused mode never reads them: whether a write is gated, and so which executable a segment
    # queues, must not depend on which verdicts happen to be computed yet: _queued_gate)
    reads = _host_reads() and not queue and _mode[0] != "fused"
    cached = state.poison.get(device_index)
    if cached is not None and cached[0] == _version[0] and cached[1] == (queue, reads):
        return cached[2]
    if state is _autograd:
        sources = [_autograd, *_threads]
    else:
        sources = [state, _autograd]
    fresh = []
    value = None
    for src in sources:
        # (another thread's list is read and left as it is: its owner may be scanning it)
        verdicts = _scanned(src, device_index, queue) if src is state else _on_device(src, device_index, queue)
        if reads and verdicts:
            value = _read_ready(verdicts)
            if value is not None:
                break
        fresh += verdicts
    if value is None and fresh:
        if queue and any(fusion.queued(v) for v in fresh):
            value = _queued_gate(fresh, device_index)
        else:
            fresh = [v.get() if type(v) is Pending else v for v in fresh]
            value = fresh[0] if len(fresh) == 1 else fusion.maximum(fresh, device_index)
        if len(fresh) > 1 or value is not fresh[0]:
            # the maximum stands for this thread's verdicts from now on: the next gate combines it
            # with the newer ones only (it may hold backward's too: more than needed, never less)
            scan = state.scan.get(device_index)
            if scan is not None:
                scan[2][:] = [value]
    state.poison[device_index] = (_version[0], (queue, reads), value)
    return value


def _queued_gate(fresh, device_index):
    """The gate of a queued write when some verdicts are still queued: their maximum, queued in the
    same segment, with that of the others (computed now; a zero when there are none) as one more
    input. What is queued depends only on the order of the
    ops, never on which verdicts happen to be computed yet (poison does not read them here: a write
    gated or not as they were ready made two segments that alternated, one of them never compiled),
    so a loop's segments repeat and stay compiled."""
    queued, done = [], []
    for v in fresh:
        (queued if fusion.queued(v) else done).append(v)
    done = [v.get() if type(v) is Pending else v for v in done]
    if not done:
        base = _zeros.get(device_index)
        if base is None:
            base = _zeros[device_index] = jax.device_put(np.int32(0), platform.jax_device(device_index))
    else:
        base = done[0] if len(done) == 1 else fusion.maximum(done, device_index)
    value = fusion.queued_maximum([base, *queued], device_index)
    if value is None:  # (not queued now: cold)
        value = fusion.maximum([base, *(v.get() for v in queued)], device_index)
    return value


_zeros: dict = {}


# Where arrays live in host memory (XLA:CPU), reading a verdict that is already computed costs ~2 µs
# against ~20-40 µs for the executable that combines them: poison reads the ready ones, which
# usually leaves nothing to combine (all passed: no gate; one failed: it is the gate). Elsewhere the
# read is a device-to-host transfer: the combining executable, which needs no wait, is cheaper.
_host_reads = platform.buffers_in_host_memory


def _scanned(src, device_index, queue=False):
    """The verdicts of `src`'s pending items on tpu:`device_index` that may still gate a write (a
    list poison may shorten: _read_ready), scanning only the items noted since the last call; with
    `queue`, those still queued stay queued results."""
    while True:
        cleared = src.cleared
        scan = src.scan.get(device_index)
        if scan is None or scan[0] != cleared:
            scan = src.scan[device_index] = [cleared, 0, []]
        items = src.pending[scan[1] :]
        if src.cleared != cleared:  # another thread checked src meanwhile (backward's list): again
            continue
        for v, *_ in items:
            if type(v) is Pending and not (queue and fusion.queued(v)):
                v = v.get()
            if _device_index(v) == device_index:
                scan[2].append(v)
        scan[1] += len(items)
        return scan[2]


def _on_device(src, device_index, queue=False):
    """Another thread's verdicts on tpu:`device_index`, read and never changed (its owner may be
    scanning them): what its own gates last combined them to and those noted since, or its whole
    list when it has not scanned since it was last checked; with `queue`, those still queued stay
    queued results. (Backward gates on the forward's verdicts: a training loop that reads its loss
    every 50 steps would otherwise combine one more at every step, a new gate and a new segment.)"""
    cleared = src.cleared
    scan = src.scan.get(device_index)
    if scan is not None and scan[0] == cleared:
        start = scan[1]  # (first: items the owner scans meanwhile are read twice, never missed)
        combined = list(scan[2])
        items = src.pending[start:]
        if src.cleared != cleared:  # checked meanwhile: the whole list
            combined, items = [], list(src.pending)
    else:
        combined, items = [], list(src.pending)
    verdicts = combined + [v for v, *_ in items]
    verdicts = [v.get() if type(v) is Pending and not (queue and fusion.queued(v)) else v for v in verdicts]
    return [v for v in verdicts if _device_index(v) == device_index]


def _read_ready(verdicts):
    """A failed verdict among the computed ones, or None; the computed verdicts that passed leave the
    list (they no longer gate anything; `check` still reads them at the next synchronization).
    Queued verdicts (fused mode) count as not computed yet."""
    unread = []
    for v in verdicts:
        if type(v) is Pending:
            if fusion.queued(v):
                unread.append(v)
                continue
            v = v.get()
        if not v.is_ready():
            unread.append(v)
        elif int(np.asarray(v)):
            return v  # a failed check: a non-zero gate is all a write needs
    verdicts[:] = unread
    return None


def _stack(verdicts):
    device = next(iter(verdicts[0].devices()))
    key = (device, len(verdicts))
    fn = _stackers.get(key)
    if fn is None:
        fn = _stackers[key] = tpu_check.jit(lambda *v: jnp.stack(v), f"stack of {len(verdicts)} assert verdicts")
    return fn(*verdicts)


def raise_if_failed(device_index=None):
    """Raise the sticky error of tpu:`device_index` (of any device when None), if it has one."""
    if FAILED:
        error = FAILED.get(device_index) if device_index is not None else next(iter(FAILED.values()))
        if error is not None:
            raise type(error)(str(error))


def noted() -> int:
    """The number of the newest verdict noted so far: `check(upto=noted())` later checks the ops
    issued until now and waits for nothing issued after (an event's synchronize)."""
    return _noted[0]


def check(device_index=None, upto=None):
    """Raise the sticky error, or this thread's first failed pending check (waits for the ops that
    produced them; with `upto`, only for the verdicts numbered up to it: see `noted`)."""
    if FAILED:
        raise_if_failed(device_index)
    state = _state()
    items = []
    for src in (state, _autograd) if state is not _autograd else (state,):
        if src.pending:
            taken = src.pending[:] if upto is None else [item for item in src.pending if item[3] <= upto]
            if not taken:
                continue
            del src.pending[: len(taken)]  # (a prefix: the list is in noting order)
            src.cleared += 1
            items += taken
    if not items:
        return
    _unchecked[0] -= len(items)
    _version[0] += 1
    items = [(v.get() if type(v) is Pending else v, m, w) for v, m, w, _ in items]
    by_device = {}
    for item in items:
        by_device.setdefault(next(iter(item[0].devices())), []).append(item)
    for group in by_device.values():
        verdicts = [v for v, _, _ in group]
        if len(verdicts) == 1 or _host_reads():
            # in host memory (XLA:CPU) reading each costs ~2 us; stacking them first is an executable
            # call and a wait for it (~40-180 us for a decode step's 2-9 verdicts)
            values = [int(np.asarray(v)) for v in verdicts]
        else:
            # pad to a power of two: a few stacking executables per device
            verdicts += [verdicts[-1]] * ((1 << (len(verdicts) - 1).bit_length()) - len(verdicts))
            values = np.asarray(_stack(verdicts)).reshape(-1)
        for value, (verdict, messages, where) in zip(values, group):
            if value:
                kind = _error_type(messages[value - 1])
                # an index out of range (the IndexError the CPU raises at the op, reported here) or
                # another bounds check leaves the device working; other asserts put it in the error
                # state, as on CUDA
                recoverable = kind is DeviceIndexError or messages[value - 1] in RECOVERABLE
                after = (
                    "the device keeps working; the values this op produced are meaningless"
                    if recoverable
                    else "the device stays in this error state (every op raises this) until "
                    "torch.tpu.clear_device_assert()"
                )
                error = kind(
                    f"device-side assert triggered in {where}: {messages[value - 1]}. The op ran "
                    f"asynchronously, so this is reported at the next synchronization; "
                    f"torchtpu.set_eager_mode('debug') raises at the op itself. Writes into existing "
                    f"tensors issued after it were not committed; {after}"
                )
                if not recoverable:
                    FAILED.setdefault(_device_index(verdict), error)
                raise error


def clear_error(device=None):
    """Leave the error state of tpu:`device` (all devices when None), so the device can be used
    again; tensors hold the values they had before the failed op's dependent writes."""
    if device is None:
        FAILED.clear()
    else:
        FAILED.pop(device, None)


def discard():
    """Forget pending checks of every thread and the error state (tests)."""
    for state in [_autograd, *_threads]:
        state.pending.clear()
        state.poison.clear()
        state.cleared += 1
    _unchecked[0] = 0
    _version[0] += 1
    FAILED.clear()
