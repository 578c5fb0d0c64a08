"""JAX's on-disk compilation cache, on by default: it serves eager executables, fused segments and
compiled graphs alike, so it lives here, below both the eager engine and the compile backend.

Environment: TORCHTPU_COMPILE_CACHE=0 turns it off; the default directory is ~/.cache/torchtpu/xla,
or TORCHTPU_COMPILE_CACHE_DIR. `torch.tpu.compiler.set_persistent_cache` chooses another one.
"""

from __future__ import annotations

import os
import pathlib

from .. import config

_state = {"cache_dir": None, "cache_set": False}

# Executables that took at least this long to compile go to the default on-disk cache (JAX's own
# default, 1 s, would skip almost every eager op and many graphs; an eager op's compile is ~50 ms and
# its entry a few KB: a second process replaying a decoding loop measured 16.0 s -> 5.3 s).
DEFAULT_MIN_COMPILE_TIME_S = 0.0


def cache_dir():
    """The on-disk XLA compilation cache in use, or None."""
    return _state["cache_dir"]


def set_persistent_cache(path=None, min_compile_time_s: float | None = None):
    """Use `path` for JAX's persistent compilation cache (None turns it off)."""
    import jax

    try:
        from jax._src import compilation_cache as cc
    except ImportError:  # pragma: no cover
        cc = None
    if path is None:
        jax.config.update("jax_compilation_cache_dir", None)
        _state["cache_dir"] = None
    else:
        pathlib.Path(path).mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(path))
        _state["cache_dir"] = str(path)
    if min_compile_time_s is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    if cc is not None and hasattr(cc, "reset_cache"):
        cc.reset_cache()  # JAX decides once whether to use a cache: make it look again
    _state["cache_set"] = True


def ensure_persistent_cache():
    """Called at the first eager build or graph compile: the default on-disk cache unless turned off."""
    if _state["cache_set"]:
        return
    _state["cache_set"] = True
    if not config.get("TORCHTPU_COMPILE_CACHE"):
        return
    import jax

    if jax.config.jax_compilation_cache_dir:  # the user configured JAX directly
        _state["cache_dir"] = jax.config.jax_compilation_cache_dir
        return
    path = config.get("TORCHTPU_COMPILE_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "torchtpu", "xla"
    )
    try:
        set_persistent_cache(path, min_compile_time_s=DEFAULT_MIN_COMPILE_TIME_S)
    except OSError:  # an unwritable home must not break compilation: no on-disk cache then
        _state["cache_dir"] = None
