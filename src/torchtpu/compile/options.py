"""`torch.tpu.compiler`: options of the torch.compile backend "tpu".

    torch.tpu.compiler.dump_stablehlo("/tmp/hlo")   # write each compiled graph's StableHLO there
    torch.tpu.compiler.dump_stablehlo(True)         # ... or print it
    torch.tpu.compiler.set_xla_flags("--xla_cpu_use_thunk_runtime=false")  # before the first XLA use
    torch.tpu.compiler.set_persistent_cache("/path")  # or None to turn it off
    torch.tpu.compiler.log_recompiles(True)         # also env TORCHTPU_LOG_RECOMPILES=1

Environment: TORCHTPU_COMPILE_CACHE=0 turns the on-disk XLA cache off (default directory
~/.cache/torchtpu/xla, or TORCHTPU_COMPILE_CACHE_DIR); TORCHTPU_LOG_RECOMPILES=1 logs why a graph
compiled again (which input's shape, dtype or layout changed); TORCHTPU_COMPILE_DONATE=0 turns
buffer donation off; TORCHTPU_COMPILE_EAGER_FALLBACK=0 makes a graph with an op that has no
lowering an error instead of running that graph op by op in eager mode.
"""
from __future__ import annotations

import os
import pathlib
import sys

from ..eager.persistent_cache import (DEFAULT_MIN_COMPILE_TIME_S, cache_dir, ensure_persistent_cache,  # noqa: F401
                                      set_persistent_cache)
from .. import config

__all__ = ["dump_stablehlo", "set_xla_flags", "set_persistent_cache", "log_recompiles", "donate_buffers",
           "eager_fallback", "cache_dir", "counters"]


_state = {
    "dump": None,
    "log_recompiles": config.get("TORCHTPU_LOG_RECOMPILES"),
    "donate": config.get("TORCHTPU_COMPILE_DONATE"),
    "eager_fallback": config.get("TORCHTPU_COMPILE_EAGER_FALLBACK"),
}


def dump_stablehlo(path_or_bool=True):
    """Dump the StableHLO of every graph compiled from now on: to files under a directory
    (`graph<id>_<n>.mlir`), to stderr with True, or stop with False/None."""
    if path_or_bool in (False, None):
        _state["dump"] = None
    elif path_or_bool is True:
        _state["dump"] = True
    else:
        p = pathlib.Path(path_or_bool)
        p.mkdir(parents=True, exist_ok=True)
        _state["dump"] = p


def _maybe_dump(graph, lowered):
    target = _state["dump"]
    if target is None:
        return
    text = lowered.as_text()
    if target is True:
        print(f"// torchtpu graph {graph.id} ({graph.kind})\n{text}", file=sys.stderr)
    else:
        n = len(graph.cache)
        (target / f"graph{graph.id}_{graph.kind}_{n}.mlir").write_text(text)


def set_xla_flags(flags: str):
    """Append XLA flags (XLA_FLAGS). XLA reads them when the backend starts: call before the first
    tensor is created on the device (or set XLA_FLAGS in the environment)."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()


def log_recompiles(enabled: bool = True):
    """Log why a graph compiles again: a new executable for a graph (input shape/dtype/layout/storage
    changes seen by torchtpu), and Dynamo's own guard failures (TORCH_LOGS=recompiles)."""
    _state["log_recompiles"] = bool(enabled)
    _state["dynamo_logs_set"] = False
    _sync_dynamo_logs()


def _sync_dynamo_logs():
    if _state.get("dynamo_logs_set") or "torch._dynamo" not in sys.modules:
        return
    _state["dynamo_logs_set"] = True
    try:
        import torch._logging
        torch._logging.set_logs(recompiles=_state["log_recompiles"])
    except Exception:  # noqa: BLE001
        pass


def donate_buffers(enabled: bool = True):
    """Let compiled graphs reuse the memory of inputs they overwrite (optimizer state, caches)."""
    _state["donate"] = bool(enabled)


def eager_fallback(enabled: bool = True):
    _state["eager_fallback"] = bool(enabled)


def recompile_logging_enabled():
    return _state["log_recompiles"]


def donation_enabled():
    return _state["donate"]


def eager_fallback_enabled():
    return _state["eager_fallback"]


def counters():
    """The compile counters (compiled_graphs, compiled_xla_compiles, compiled_cache_hits)."""
    from ..metrics import metrics
    m = metrics()
    return {k: v for k, v in m.items() if k.startswith("compiled_")}


def _ensure_persistent_cache():
    """Called at the first graph compile: Dynamo's recompile logs as asked, the on-disk cache."""
    _sync_dynamo_logs()
    ensure_persistent_cache()
