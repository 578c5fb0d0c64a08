"""Python numbers as the device arrays JAX would make of them, kept once per value by the C++ fast
path (eager/fastpath.py) and the fused segments' replays (eager/fusion.py)."""

from __future__ import annotations

import jax

from ..device import platform


def device_scalar(value):
    """A Python number as the device array JAX would make of it for a call: the caller keeps one
    per value and passes it instead of the number, which JAX converts on every call (about 2.5 µs
    each: a learning rate, `alpha`, the offsets of views). Uncommitted, as JAX's own conversion is
    (a committed array is another argument mapping: a second compilation of every executable); the
    number itself where JAX's default device is not tpu:0's."""
    array = jax.device_put(value)
    return array if array.devices() == {platform.jax_device(0)} else value
