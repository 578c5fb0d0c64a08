"""Which XLA platform backs the "tpu" device, and the JAX device behind each `tpu:i`.

TPU when JAX sees one; otherwise what TORCHTPU_PLATFORM asks for (cpu, gpu or tpu), defaulting
to the CPU. TORCHTPU_NUM_DEVICES=N asks XLA:CPU for N virtual devices, for development and tests.
The choice is made once, lazily, the first time a device is needed.
"""
from __future__ import annotations

import os
import threading

from .. import config

_lock = threading.Lock()
_devices = None
_platform = None


def _configure_jax():
    """Settings that must be in place before JAX creates its backends."""
    n = config.get("TORCHTPU_NUM_DEVICES")
    if n:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={int(n)}".strip()
    import jax

    # PyTorch's default integer type is int64; without x64 JAX would silently truncate it.
    jax.config.update("jax_enable_x64", True)
    if n:
        try:
            jax.config.update("jax_num_cpu_devices", int(n))
        except Exception:  # older JAX, or backends already up: the XLA flag above does the same
            pass
    return jax


def _pick():
    jax = _configure_jax()
    requested = config.get("TORCHTPU_PLATFORM")
    if requested == "cuda":
        requested = "gpu"
    order = [requested] if requested else ["tpu", "cpu"]
    errors = []
    for name in order:
        try:
            devs = jax.devices(name)
        except RuntimeError as e:
            errors.append(f"{name}: {e}")
            continue
        if devs:
            if name == "cpu" and config.get("TORCHTPU_NUM_DEVICES"):
                devs = devs[: config.get("TORCHTPU_NUM_DEVICES")]
            return name, list(devs)
    raise RuntimeError("torchtpu: no XLA platform available (" + "; ".join(errors) + ")")


def ensure():
    global _devices, _platform
    if _devices is None:
        with _lock:
            if _devices is None:
                config.check()  # a bad TORCHTPU_* value surfaces here, naming the variable
                _platform, _devices = _pick()
                from . import native
                native.at_platform_ready(len(_devices))
    return _devices


def devices():
    return _devices if _devices is not None else ensure()


def platform() -> str:
    """The XLA platform backing "tpu": 'tpu', 'gpu' or 'cpu'."""
    ensure()
    return _platform


def is_initialized() -> bool:
    return _devices is not None


def device_count() -> int:
    return len(devices())


def jax_device(index: int):
    devs = devices()
    if not 0 <= index < len(devs):
        raise RuntimeError(
            f"Invalid device index tpu:{index}: there are {len(devs)} tpu device(s) "
            f"(valid indices 0..{len(devs) - 1}, XLA platform {_platform!r})")
    return devs[index]
