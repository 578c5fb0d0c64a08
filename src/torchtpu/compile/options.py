"""`torch.tpu.compiler`: options of the torch.compile backend "tpu".

    torch.tpu.compiler.dump_stablehlo("/tmp/hlo")   # write each compiled graph's StableHLO there
    torch.tpu.compiler.dump_stablehlo(True)         # ... or print it
    torch.tpu.compiler.set_xla_flags("--xla_cpu_use_thunk_runtime=false")  # before the first XLA use
    torch.tpu.compiler.set_persistent_cache("/path")  # or None to turn it off
    torch.tpu.compiler.log_recompiles(True)         # also env TORCHTPU_LOG_RECOMPILES=1
    with torch.tpu.compiler.custom_compiler_options({"xla_optimization_level": "O1"}):
        ...                                         # executables built here use those XLA options

Environment: TORCHTPU_COMPILE_CACHE=0 turns the on-disk XLA cache off (default directory
~/.cache/torchtpu/xla, or TORCHTPU_COMPILE_CACHE_DIR); TORCHTPU_LOG_RECOMPILES=1 logs why a graph
compiled again (which input's shape, dtype or layout changed); TORCHTPU_COMPILE_DONATE=0 turns
buffer donation off; TORCHTPU_COMPILE_EAGER_FALLBACK=0 makes a graph with an op that has no
lowering an error instead of running that graph op by op in eager mode.

Inductor's settings (`torch.compile(mode="reduce-overhead" | "max-autotune" | ..., options={...})`) are
accepted for tpu tensors and ignored: they configure Inductor's code generation (Triton, CUDA graphs,
autotuning), which XLA replaces. Libraries pass them on their own (Transformers' `generate()` compiles
with `mode="reduce-overhead"`), so refusing them would break code that works on CUDA. The first time
it happens one info-level line on the "torchtpu.compile" logger says what was ignored.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import re
import sys

from .. import config
from ..eager import xla_options
from ..eager.persistent_cache import (  # noqa: F401
    DEFAULT_MIN_COMPILE_TIME_S,
    cache_dir,
    ensure_persistent_cache,
    set_persistent_cache,
)

__all__ = [
    "cache_dir",
    "counters",
    "custom_compiler_options",
    "donate_buffers",
    "dump_stablehlo",
    "eager_fallback",
    "ignore_inductor_settings",
    "log_recompiles",
    "set_persistent_cache",
    "set_xla_flags",
]

_log = logging.getLogger("torchtpu.compile")


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
    except Exception:  # noqa: BLE001, S110 -- recompile logging is a convenience: never fail a compile for it
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


@contextlib.contextmanager
def custom_compiler_options(options: dict[str, str]):
    """Compile the executables built inside the block with these XLA compiler options (TorchTPU's
    `torch.tpu.compiler.custom_compiler_options`).

    `options` maps XLA option names to values: any DebugOptions field (`"xla_cpu_enable_fast_math":
    "false"`, `"xla_dump_to": "/tmp/dump"`, ...) and `"xla_optimization_level"` /
    `"xla_memory_fitting_level"` ('O0'..'O3'). Eager ops, compiled graphs (torch.compile(backend="tpu"))
    and the fused optimizers run in the block with executables compiled with these options; their
    caches key on the options, so code outside the block keeps its executables. Nested blocks merge,
    the inner options winning. A misspelled option raises here, naming it. In the fused eager mode the
    ops inside the block run op by op (a fused segment is compiled with one set of options). Not for
    use inside a function being compiled by torch.compile (a graph is one executable: wrap the call).
    The setting is process-wide, not per thread. Executables outside the one builder keep XLA's
    defaults: the size steps of data-dependent ops (nonzero, masked_select) and jax_op/Pallas kernels.
    """
    import torch

    if torch.compiler.is_compiling():
        raise RuntimeError(
            "torch.tpu.compiler.custom_compiler_options cannot be used inside a function "
            "being compiled: a compiled graph is one executable with one set of XLA "
            "options; enter the context around the call of the compiled function"
        )
    layer = xla_options.push(options)
    try:
        yield
    finally:
        xla_options.pop(layer)


_EXCESS = "xla_allow_excess_precision"


def _excess_precision_from_flags():
    """XLA_FLAGS' --xla_allow_excess_precision, or XLA's default (True) when it is not set."""
    found = re.findall(r"--xla_allow_excess_precision(?:=(\S*))?", os.environ.get("XLA_FLAGS", ""))
    if not found:
        return True
    return found[-1].lower() not in ("false", "0")


def get_allow_excess_precision() -> bool:
    """`torch.tpu.allow_excess_precision`: whether XLA may keep intermediate values in a wider type
    than the program's (bf16 math carried out in f32 without rounding between ops): the value set
    through the property, else XLA_FLAGS' --xla_allow_excess_precision, else XLA's default, True."""
    value = xla_options.base(_EXCESS)
    return _excess_precision_from_flags() if value is None else value


def set_allow_excess_precision(value: bool):
    """Set it for every executable built from now on (each cache keys on it: a changed value builds
    new executables once, the old ones are found again when it changes back)."""
    if not isinstance(value, bool):
        raise TypeError(f"torch.tpu.allow_excess_precision must be True or False, got {value!r}")
    # the same value as XLA's own setting needs no option (and keeps the executables already built)
    xla_options.set_base(_EXCESS, None if value == _excess_precision_from_flags() else value)


_inductor_settings_logged = [False]


def _inductor_modes() -> dict:
    from torch._inductor import list_mode_options

    return list_mode_options()


def ignore_inductor_settings(mode=None, options=None) -> dict:
    """Accept torch.compile's Inductor settings for a tpu graph and drop them (see the module doc).

    `mode` is one of Inductor's mode names (None and "default" mean none); `options` a dict of Inductor
    config names, as `torch.compile(options=...)` takes. Checks them as Inductor would (an unknown mode
    or option name is an error naming it: a typo should not pass silently on tpu and fail on CUDA), logs
    the first non-empty settings once at info level, and returns the Inductor config they stand for."""
    settings = {}
    if mode is not None:
        modes = _inductor_modes()
        if not isinstance(mode, str) or mode not in modes:
            raise ValueError(f"torch.compile: unknown mode={mode!r}; Inductor's modes are {sorted(modes)}")
        settings.update(modes[mode])
    if options is not None:
        if not isinstance(options, dict) or not all(isinstance(k, str) for k in options):
            raise TypeError(f"torch.compile: options must be a dict of Inductor option names, got {options!r}")
        from torch._inductor import config as inductor_config

        known = inductor_config.get_config_copy()
        unknown = sorted(k for k in options if k not in known)
        if unknown:
            raise ValueError(f"torch.compile: unknown Inductor option(s) {unknown} in options=")
        settings.update(options)
    if settings and not _inductor_settings_logged[0]:
        _inductor_settings_logged[0] = True
        shown = f"mode={mode!r}, " if mode not in (None, "default") else ""
        _log.info(
            "torch.compile on tpu: %sInductor options %s ignored (XLA compiles tpu graphs; they configure "
            "Inductor's code generation); logged once",
            shown,
            sorted(settings),
        )
    return settings


# ---------------------------------------------------------------- the TPU compile check (docs/tpu.md)
from ..eager.tpu_check import TpuCompileCheckError  # noqa: E402  (here: one block for the whole feature)

__all__ += ["TpuCompileCheckError", "tpu_compile_check_report"]


def tpu_compile_check_report():
    """What TORCHTPU_TPU_COMPILE_CHECK=<topology> found so far: `.topology`, `.compiled`, `.failed`,
    `.programs` (each `.name`, `.ok`, `.error`, `.cost`: XLA:TPU's cost analysis, e.g. 'flops' and
    'bytes accessed', `.compile_seconds`) and `.failures`."""
    from ..eager import tpu_check

    return tpu_check.report()
