"""Shared by the upstream-regression tests: the tpu raises what the CPU raises."""

from __future__ import annotations

import pytest


def same_error(fn, device="tpu"):
    """fn(device) raises on the CPU and on `device`, with the same exception type and message
    (twice on the device: a cached executable must raise as the first call did)."""
    with pytest.raises(Exception) as cpu_error:
        fn("cpu")
    for _ in range(2):
        with pytest.raises(type(cpu_error.value)) as tpu_error:
            fn(device)
        assert str(tpu_error.value) == str(cpu_error.value)
