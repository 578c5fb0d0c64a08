"""Every TORCHTPU_* environment variable, read by one parser.

A bad value never breaks `import torch` (which loads torchtpu for everyone, CPU users included):
it is recorded here, a warning names the variable and the accepted values, and the first use of
the "tpu" device raises that error (`check()`), so `torch.tpu.is_available()` answers False instead
of raising. TorchTPU's variable names are accepted as aliases (ours win when both are set).

Booleans accept 1/0, true/false, yes/no, on/off in any case; an empty value means the default.
"""

from __future__ import annotations

import os
import re
import warnings

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

# name -> (kind, default, accepted values or None, meaning): the documented table (README).
VARIABLES: dict[str, tuple] = {
    "TORCHTPU_PLATFORM": (
        "choice",
        None,
        ("cpu", "gpu", "cuda", "tpu"),
        'which XLA platform backs "tpu" (default: TPU if JAX sees one, else CPU)',
    ),
    "TORCHTPU_NUM_DEVICES": ("int", None, None, "N virtual XLA:CPU devices (tpu:0 .. tpu:N-1), N >= 1"),
    "TORCHTPU_EAGER_MODE": ("choice", "fused", ("strict", "debug", "fused"), "the initial eager mode"),
    "TORCHTPU_FUSED_COMPILE": (
        "choice",
        "background",
        ("background", "now"),
        "where the fused mode compiles a segment",
    ),
    "TORCHTPU_CPU_FALLBACK": ("bool", False, None, "run ops without a tpu lowering on the CPU"),
    "TORCHTPU_COMPILE_CACHE": ("bool", True, None, "the on-disk XLA compilation cache"),
    "TORCHTPU_COMPILE_CACHE_DIR": ("path", None, None, "its directory (default ~/.cache/torchtpu/xla)"),
    "TORCHTPU_LOG_RECOMPILES": ("bool", False, None, "log why a graph compiled again"),
    "TORCHTPU_COMPILE_DONATE": ("bool", True, None, "compiled graphs donate the inputs they overwrite"),
    "TORCHTPU_COMPILE_EAGER_FALLBACK": ("bool", True, None, "a graph with an op without lowering runs op by op"),
    "TORCHTPU_MULTI_CONTROLLER": (
        "bool",
        True,
        None,
        "under torchrun (WORLD_SIZE > 1), join JAX's multi-controller job",
    ),
    "TORCHTPU_COORDINATOR_ADDRESS": (
        "text",
        None,
        None,
        "host:port of JAX's coordinator (default MASTER_ADDR:MASTER_PORT+1)",
    ),
    "TORCHTPU_COORDINATOR_TIMEOUT": (
        "seconds",
        300.0,
        None,
        "how long a distributed process waits for JAX's coordinator",
    ),
    "TORCHTPU_NATIVE": (
        "choice",
        "auto",
        ("auto", "on", "off"),
        "the C++ extension: device guard, generators (docs/design.md); auto/on build it once at import",
    ),
    "TORCHTPU_EAGER_FAST": (
        "bool",
        True,
        None,
        "the eager engine's C++ fast path (eager/fastpath.py; needs TORCHTPU_NATIVE not off)",
    ),
    "TORCHTPU_JAX_TRACEBACKS": (
        "bool",
        False,
        None,
        "jaxlib's Python traceback on every array and executable call (`jax.Array.traceback`; "
        "walking the stack costs ~0.7 µs of each eager op)",
    ),
    "TORCHTPU_TPU_COMPILE_CHECK": (
        "topology",
        None,
        None,
        "also compile every program for this TPU topology (e.g. v5e:2x2) with XLA:TPU "
        "(libtpu, no chip needed; docs/tpu.md)",
    ),
    "TORCHTPU_TPU_COMPILE_CHECK_LOG": (
        "text",
        None,
        None,
        "with the check on, a file the exit line and the failed programs are also appended to (for runs "
        "whose output is not kept, e.g. pytest subprocesses of tools/)",
    ),
}

# TorchTPU's names -> (our name, value mapping): a set TorchTPU flag selects our setting.
ALIASES: dict[str, tuple[str, dict]] = {
    "TORCH_TPU_LAUNCH_BLOCKING": ("TORCHTPU_EAGER_MODE", {True: "debug"}),
    "TORCH_TPU_DEFER_AND_FUSE": ("TORCHTPU_EAGER_MODE", {True: "fused", False: "strict"}),
    "TORCH_TPU_TIER2_COMPILATION_CACHE": ("TORCHTPU_COMPILE_CACHE_DIR", None),  # its on-disk cache
}

_errors: dict[str, str] = {}
_warned: set[str] = set()


class ConfigError(ValueError):
    """A TORCHTPU_* variable holds a value we cannot use."""


def _raw(name: str):
    value = os.environ.get(name)
    if value is not None and value.strip() != "":
        return name, value.strip()
    for alias, (target, mapping) in ALIASES.items():
        if target != name:
            continue
        v = os.environ.get(alias)
        if v is None or v.strip() == "":
            continue
        if mapping is None:
            return alias, v.strip()
        low = v.strip().lower()
        if low in _TRUE or low in _FALSE:
            value = mapping.get(low in _TRUE)  # (a flag set to 0 selects something only where mapped)
            if value is None:
                continue
            return alias, value
        _record(alias, f"{alias}={v!r}: expected one of {', '.join(_TRUE + _FALSE)}")
    return name, None


def _record(name: str, message: str) -> None:
    _errors[name] = message
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"torchtpu: {message}; the tpu device is unusable until it is fixed", RuntimeWarning, stacklevel=3
        )


def get(name: str):
    """The parsed value of `name` (a key of VARIABLES); its default when unset or invalid (the
    error is recorded for `check()`)."""
    kind, default, choices, _ = VARIABLES[name]
    _errors.pop(name, None)
    for alias, (target, _mapping) in ALIASES.items():
        if target == name:
            _errors.pop(alias, None)
    source, raw = _raw(name)
    if raw is None:
        return default
    try:
        value = _parse(kind, raw, choices)
    except ConfigError as e:
        _record(name, f"{source}={raw!r}: {e}")
        return default
    return value


def _parse(kind, raw, choices):
    if kind == "bool":
        low = raw.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ConfigError(f"expected one of {', '.join(_TRUE + _FALSE)}")
    if kind == "int":
        try:
            n = int(raw)
        except ValueError:
            raise ConfigError("expected a whole number >= 1") from None
        if n < 1:
            raise ConfigError("expected a whole number >= 1")
        return n
    if kind == "seconds":
        try:
            seconds = float(raw)
        except ValueError:
            raise ConfigError("expected a number of seconds > 0") from None
        if not seconds > 0:
            raise ConfigError("expected a number of seconds > 0")
        return seconds
    if kind == "choice":
        low = raw.lower()
        if low not in choices:
            raise ConfigError(f"expected one of {', '.join(choices)}")
        return low
    if kind == "text":
        return raw
    if kind == "topology":  # libtpu's names: generation:chips, e.g. v5e:2x2, v4:2x2x1
        if raw.lower() in _FALSE:
            return None
        if not re.fullmatch(r"v\d+[a-z]*(:\d+(x\d+)*)?", raw.lower()):
            raise ConfigError("expected a TPU topology such as v5e:2x2, v6e:2x2 or v4:2x2x1")
        return raw.lower()
    return os.path.expanduser(raw)  # path


def check() -> None:
    """Raise the first recorded configuration error (called when the device is first used)."""
    for name in VARIABLES:  # re-read: the user may have fixed the environment since
        get(name)
    if _errors:
        raise ConfigError("torchtpu: " + "; ".join(_errors.values()))


def errors() -> dict[str, str]:
    return dict(_errors)
