"""Eager modes: "strict" (asynchronous, the default), "debug" (every op waits for its result,
so an error surfaces at the op that caused it) and "fused" (ops are queued and each stretch of them
that repeats runs as one XLA executable: eager/fusion.py). TORCHTPU_EAGER_MODE sets the initial mode."""
from __future__ import annotations

import contextlib

from .. import config

_MODES = ("strict", "debug", "fused")
_mode = [config.get("TORCHTPU_EAGER_MODE")]  # a bad value: warned, the default, raised at first use


def set_eager_mode(mode: str):
    mode = str(mode).lower()
    if mode not in _MODES:
        raise ValueError(f"unknown eager mode {mode!r}: expected one of {', '.join(_MODES)}")
    _switch(mode)


def _switch(mode):
    if _mode[0] == "fused" and mode != "fused":  # queued ops run before the mode changes
        from .fusion import flush_all
        flush_all()
    _mode[0] = mode


def get_eager_mode() -> str:
    return _mode[0]


@contextlib.contextmanager
def eager_mode(mode: str):
    old = _mode[0]
    set_eager_mode(mode)
    try:
        yield
    finally:
        _switch(old)
