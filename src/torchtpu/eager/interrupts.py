"""Interrupts Python cannot raise where they land, raised at the next tpu op instead.

A Ctrl-C (KeyboardInterrupt) is raised by its signal handler between two bytecodes of the main
thread, wherever they are. When that is inside a garbage-collector callback (JAX registers
`_xla_gc_callback`, which runs at every collection), a weakref callback (a storage's `_on_free`) or
a `__del__`, Python cannot propagate it: it hands it to `sys.unraisablehook`, which prints
"Exception ignored in ..." and the interrupt is lost. Our hook keeps such an interrupt instead, and
the next tpu op or host read in the main thread raises it (`raise_pending`), so a Ctrl-C during a
training loop still stops the loop. Any other unraisable exception goes to the previous hook.
"""

from __future__ import annotations

import sys
import threading

PENDING: list = []  # KeyboardInterrupts that landed where Python could not raise them
_previous = []


def _hook(unraisable):
    exc_type = unraisable.exc_type
    if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
        PENDING.append(unraisable.exc_value)
        return
    (_previous[0] if _previous else sys.__unraisablehook__)(unraisable)


def install():
    if sys.unraisablehook is not _hook:
        _previous[:] = [sys.unraisablehook]
        sys.unraisablehook = _hook


def raise_pending():
    """Raise a kept interrupt (in the main thread only, where Python raises signals)."""
    if PENDING and threading.current_thread() is threading.main_thread():
        error = PENDING[-1]
        PENDING.clear()
        raise error if isinstance(error, BaseException) else KeyboardInterrupt()
