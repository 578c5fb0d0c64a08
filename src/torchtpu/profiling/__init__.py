"""`torch.tpu.profiler`: device activity in `torch.profiler.profile`, recorded by JAX's profiler.

`torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
experimental_config=torch.tpu.profiler.TpuProfilerConfig(run_dir=...))` records, next to PyTorch's
own (Kineto) trace, an XLA trace of the same window with `jax.profiler.start_trace` /
`stop_trace`: `<run_dir>/plugins/profile/<time>/<host>[_<rank>].xplane.pb` (TensorBoard's profile
plugin, XProf) and `...trace.json.gz` / `perfetto_trace.json.gz` (Perfetto, chrome://tracing).
While it records, each ATen op that runs is wrapped in a `jax.profiler.TraceAnnotation` named after
it (`aten::mm`), so the XLA executions on the timeline carry PyTorch op names; outside a profile
nothing is wrapped and the eager path is untouched (the annotation is a dispatch mode pushed only for
the profiled window).

`start`/`stop` are called from `torch.profiler`'s trace window by a patch in
integrations/patches.py (installed with the backend, so a plain PrivateUse1 profile records too). A profile whose
activities include PrivateUse1 but that
has no TpuProfilerConfig records to `tempfile.gettempdir()/torchtpu_profile`. JAX allows one trace
at a time: while another one is running, the profile records only PyTorch's trace, with a warning.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["TpuProfilerConfig"]

DEFAULT_RUN_DIR = os.path.join(tempfile.gettempdir(), "torchtpu_profile")


class TpuProfilerConfig(torch.profiler._ExperimentalConfig):
    """TorchTPU's profiler configuration (same keyword arguments), for
    `torch.profiler.profile(experimental_config=...)`.

    host_tracer_level: 0 off, 1 user annotations (the op names), 2 + XLA's, 3 + low-level XLA's.
    device_tracer_level: accepted for TorchTPU's signature; JAX's profiler (0.10) has no switch for
        it, and traces the devices whenever it runs (on XLA:CPU, device work is host threads).
    python_tracer_level: 0 off, 1 every Python call (costly).
    run_dir: where the trace goes (default: `tempfile.gettempdir()/torchtpu_profile`).
    worker_rank: a string suffix for the trace file name (`<host>_<rank>`), e.g. the global rank.
    experimental_options: passed to XLA's profiler as its advanced configuration (int, bool or
    str values); check_experimental_options: reject keys that collide with the stable options.
    """

    _STABLE = ("host_tracer_level", "device_tracer_level", "python_tracer_level", "run_dir", "worker_rank")

    def __init__(
        self,
        *,
        host_tracer_level: int = 2,
        device_tracer_level: int = 1,
        python_tracer_level: int = 0,
        run_dir: os.PathLike[str] | str | None = None,
        worker_rank: str | None = None,
        experimental_options: Mapping[str, int | bool | str] | None = None,
        check_experimental_options: bool = True,
    ):
        for name, value, top in (
            ("host_tracer_level", host_tracer_level, 3),
            ("device_tracer_level", device_tracer_level, 1),
            ("python_tracer_level", python_tracer_level, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
                raise ValueError(f"TpuProfilerConfig: {name} must be an int in [0, {top}], got {value!r}")
        if worker_rank is not None:
            if not isinstance(worker_rank, str):
                raise TypeError(f"TpuProfilerConfig: worker_rank must be a string, got {type(worker_rank)}")
            if ":" in worker_rank or "," in worker_rank or os.sep in worker_rank:
                raise ValueError(
                    f"TpuProfilerConfig: worker_rank cannot contain ':', ',' or {os.sep!r}: {worker_rank!r}"
                )
        options = dict(experimental_options or {})
        for key, value in options.items():
            if not isinstance(key, str) or ":" in key or "," in key:
                raise ValueError(f"TpuProfilerConfig: experimental option keys are strings without ':' or ',': {key!r}")
            if check_experimental_options and key in self._STABLE:
                raise ValueError(
                    f"TpuProfilerConfig: experimental option {key!r} clashes with the stable argument of that name"
                )
            if not isinstance(value, (int, bool, str)):
                raise TypeError(
                    f"TpuProfilerConfig: experimental option {key!r} must be an int, bool or str, got {type(value)}"
                )
        self.host_tracer_level = host_tracer_level
        self.device_tracer_level = device_tracer_level
        self.python_tracer_level = python_tracer_level
        self.run_dir = os.fspath(run_dir) if run_dir is not None else None
        self.worker_rank = worker_rank
        self.experimental_options = options
        self.check_experimental_options = check_experimental_options
        # Kineto ignores a custom config it has no backend for; it is here for printing/debugging
        super().__init__(
            custom_profiler_config=",".join(
                f"{k}:{v}"
                for k, v in (
                    ("host_tracer_level", host_tracer_level),
                    ("device_tracer_level", device_tracer_level),
                    ("python_tracer_level", python_tracer_level),
                    ("run_dir", self.run_dir),
                    ("worker_rank", worker_rank),
                    *options.items(),
                )
                if v is not None
            )
        )

    def _jax_options(self):
        import jax

        o = jax.profiler.ProfileOptions()
        o.host_tracer_level = self.host_tracer_level
        o.python_tracer_level = self.python_tracer_level
        if self.experimental_options:
            o.advanced_configuration = dict(self.experimental_options)
        return o


class _OpNames(TorchDispatchMode):
    """Names each ATen op's work on the XLA timeline (pushed only while a profile records)."""

    def __init__(self, annotation):
        super().__init__()
        self._annotation = annotation

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        with self._annotation(func._schema.name):  # "aten::mm", as torch.profiler names it
            return func(*args, **(kwargs or {}))


class _Recording:
    def __init__(self, run_dir, mode):
        self.run_dir, self.mode = run_dir, mode


def _wants_device_trace(prof) -> bool:
    if isinstance(getattr(prof, "experimental_config", None), TpuProfilerConfig):
        return True
    return torch.profiler.ProfilerActivity.PrivateUse1 in (getattr(prof, "activities", None) or ())


def start(prof):
    """Start the XLA trace for `prof` (a torch.profiler profile that is starting its trace)."""
    if not _wants_device_trace(prof) or getattr(prof, "_torchtpu_recording", None) is not None:
        return
    import jax

    config = (
        prof.experimental_config if isinstance(prof.experimental_config, TpuProfilerConfig) else TpuProfilerConfig()
    )
    run_dir = config.run_dir or DEFAULT_RUN_DIR
    try:
        jax.profiler.start_trace(run_dir, create_perfetto_trace=True, profiler_options=config._jax_options())
    except RuntimeError as e:  # another trace (a jax.profiler one) is running
        warnings.warn(f"torch.profiler: the tpu device trace is not recorded: {e}", stacklevel=3)
        return
    mode = None
    if config.host_tracer_level >= 1:
        mode = _OpNames(jax.profiler.TraceAnnotation)
        mode.__enter__()
    prof._torchtpu_recording = _Recording(run_dir, mode)
    prof.tpu_trace_dir = run_dir


def stop(prof):
    """Stop the XLA trace that `start(prof)` began (and write it)."""
    recording = getattr(prof, "_torchtpu_recording", None)
    if recording is None:
        return
    import jax

    prof._torchtpu_recording = None
    if recording.mode is not None:
        recording.mode.__exit__(None, None, None)
    config = prof.experimental_config
    rank = config.worker_rank if isinstance(config, TpuProfilerConfig) else None
    before = _trace_files(recording.run_dir)
    jax.profiler.stop_trace()
    if rank is not None:  # `<host>.xplane.pb` -> `<host>_<rank>.xplane.pb`, as TorchTPU names it
        for path in sorted(_trace_files(recording.run_dir) - before):
            head, name = os.path.split(path)
            host, dot, rest = name.partition(".")
            if rest in ("xplane.pb", "trace.json.gz"):
                os.replace(path, os.path.join(head, f"{host}_{rank}.{rest}"))


def _trace_files(run_dir):
    found = set()
    for root, _, files in os.walk(run_dir):
        found.update(os.path.join(root, f) for f in files)
    return found
