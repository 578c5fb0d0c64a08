"""Device-side asserts at run time: the conditions ops/checks.py collected, checked at sync points.

An executable with checks returns one extra int32 scalar (0, or 1 + the first failed condition);
`note` keeps it (it costs no wait) and the next synchronization (a copy to the host, `.item()`,
`torch.tpu.synchronize()`) raises that condition's message, as CUDA reports a device-side assert at
the next synchronizing call. In the "debug" eager mode the check runs at the op itself. Unlike
CUDA, the device stays usable after the error.
"""
from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np

from .fusion import Pending
from .modes import _mode

# Verdicts waiting for a synchronization, checked together: one executable stacks them (padded to a
# power of two, so at most log2(LIMIT) + 1 of them per device), one transfer brings them to the host
# (fetching each one costs ~25 µs). A loop that never reads a value back is checked every LIMIT
# checked ops, so the list stays short.
LIMIT = 256
_pending = []   # (verdict array, messages, where)
_lock = threading.Lock()
_stackers = {}


class DeviceAssertError(RuntimeError):
    """A device-side assert: an op was given values it does not accept (an index out of range)."""


def note(verdict, messages, where):
    """Keep an executable's verdict; `where` names the op or graph for the message."""
    _pending.append((verdict, messages, where))
    if len(_pending) >= LIMIT or _mode[0] == "debug":
        check()


def _stack(verdicts):
    device = next(iter(verdicts[0].devices()))
    key = (device, len(verdicts))
    fn = _stackers.get(key)
    if fn is None:
        fn = _stackers[key] = jax.jit(lambda *v: jnp.stack(v))
    return fn(*verdicts)


def check():
    """Raise the first failed pending check (waits for the ops that produced them)."""
    if not _pending:
        return
    with _lock:
        items = _pending[:]
        del _pending[:len(items)]
    items = [(v.get() if type(v) is Pending else v, m, w) for v, m, w in items]
    by_device = {}
    for item in items:
        by_device.setdefault(next(iter(item[0].devices())), []).append(item)
    for group in by_device.values():
        verdicts = [v for v, _, _ in group]
        if len(verdicts) > 1:   # pad to a power of two: a few stacking executables per device
            verdicts += [verdicts[-1]] * ((1 << (len(verdicts) - 1).bit_length()) - len(verdicts))
        values = np.asarray(_stack(verdicts) if len(verdicts) > 1 else verdicts[0]).reshape(-1)
        for value, (_, messages, where) in zip(values, group):
            if value:
                raise DeviceAssertError(
                    f"device-side assert triggered in {where}: {messages[value - 1]}. The op ran "
                    f"asynchronously, so this is reported at the next synchronization; "
                    f"torchtpu.set_eager_mode('debug') raises at the op itself")


def discard():
    """Forget pending checks (tests)."""
    with _lock:
        _pending.clear()
