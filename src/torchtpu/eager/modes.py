"""Eager modes: "fused" (the default, TorchTPU's DEFER_AND_FUSE: ops are queued and each stretch of
them that repeats runs as one XLA executable, the rest op by op: eager/fusion.py), "strict" (every op
is called at once, asynchronously) and "debug" (every op waits for its result, so an error surfaces
at the op that caused it). TORCHTPU_EAGER_MODE sets the initial mode."""

from __future__ import annotations

import contextlib
import enum

from .. import config

_MODES = ("strict", "debug", "fused")
_mode = [config.get("TORCHTPU_EAGER_MODE")]  # a bad value: warned, the default, raised at first use
# what runs before the mode leaves "fused" (eager/fusion.py: its queued ops run first)
BEFORE_LEAVING_FUSED: list = []


class EagerMode(str, enum.Enum):
    """TorchTPU's names for the eager modes (the values are ours, so either form compares equal)."""

    DEFER_NEVER = "strict"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"
    DEFER_AND_FUSE = "fused"

    def __str__(self):
        return self.value

    def __call__(self, mode):
        """`torch.tpu.eager_mode("fused")` used as a context manager (our earlier form)."""
        return eager_mode(mode)


def _name(mode) -> str:
    if isinstance(mode, EagerMode):
        return mode.value
    name = str(mode).lower()
    if name not in _MODES:
        raise ValueError(f"unknown eager mode {mode!r}: expected one of {', '.join(_MODES)} or a torch.tpu.EagerMode")
    return name


class _ModeChange:
    """What `set_eager_mode` returns: the mode is set at once; used as a context manager, the
    previous mode comes back on exit (TorchTPU's form)."""

    def __init__(self, previous):
        self.previous = previous

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _switch(self.previous)
        return False


def set_eager_mode(mode) -> _ModeChange:
    name = _name(mode)
    previous = _mode[0]
    _switch(name)
    return _ModeChange(previous)


def _switch(mode):
    if _mode[0] == "fused" and mode != "fused":
        for run_queued_ops in BEFORE_LEAVING_FUSED:
            run_queued_ops()
    _mode[0] = mode


def get_eager_mode() -> str:
    return _mode[0]


def current_enum() -> EagerMode:
    return EagerMode(_mode[0])


@contextlib.contextmanager
def eager_mode(mode):
    old = _mode[0]
    set_eager_mode(mode)
    try:
        yield
    finally:
        _switch(old)
