"""Interrupts Python cannot raise where they land, raised at the next tpu op instead.

A Ctrl-C (KeyboardInterrupt) is raised by its signal handler between two bytecodes of the main
thread, wherever they are. When that is inside a garbage-collector callback (JAX registers
`_xla_gc_callback`, which runs at every collection), a weakref callback (a storage's `_on_free`) or
a `__del__`, Python cannot propagate it: it hands it to `sys.unraisablehook`, which prints
"Exception ignored in ..." and the interrupt is lost. Our hook keeps such an interrupt instead, and
the next tpu op or host read in the main thread raises it (`raise_pending`), so a Ctrl-C during a
training loop still stops the loop. So is any exception a Python signal handler raised there (a test
runner's time limit: a SIGALRM handler raising TimeoutError, tools/upstream_tests.py), found by the
handler's frame in its traceback. Any other unraisable exception goes to the previous hook.
"""

from __future__ import annotations

import signal
import sys
import threading

PENDING: list = []  # interrupts that landed where Python could not raise them
_previous = []


def _raised_by_signal_handler(tb):
    """Whether the traceback `tb` runs through a Python signal handler installed now."""
    codes = set()
    for number in signal.valid_signals():
        try:
            handler = signal.getsignal(number)
        except (ValueError, OSError):
            continue
        code = getattr(getattr(handler, "__func__", handler), "__code__", None)
        if code is not None:
            codes.add(code)
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def from_signal(error: BaseException) -> bool:
    """Whether `error` was raised by a Python signal handler (a time limit's SIGALRM): an interrupt of
    the work it landed in, not that work's failure. A fallback's `except Exception` re-raises it: taken
    for the work's failure, it was lost (the caller's time limit with it) and the fallback ran instead."""
    return _raised_by_signal_handler(error.__traceback__)


def cleared_a_stuck_jax_cache(error: BaseException) -> bool:
    """Whether `error` is JAX's weakref_lru_cache refusing a call ("Recursively calling ...") because an
    earlier call of that key in this thread never finished: an interrupt that landed in the cache's own
    bookkeeping (seen once, in a Ctrl-C loop of the fused mode) leaves the entry marked in progress, and
    every later call of that program fails. JAX's caches are cleared then, and the call can be made again."""
    if isinstance(error, RecursionError) and str(error).startswith("Recursively calling"):
        import jax

        jax.clear_caches()
        return True
    return False


def _hook(unraisable):
    exc_type = unraisable.exc_type
    if exc_type is not None and (
        issubclass(exc_type, KeyboardInterrupt) or _raised_by_signal_handler(unraisable.exc_traceback)
    ):
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
