"""XLA compiler options of the executables built from now on (eager ops, compiled graphs, the fused
optimizers): `torch.tpu.compiler.custom_compiler_options` (a context) and
`torch.tpu.allow_excess_precision` (a process-wide setting) both land here.

The options in force are one sorted tuple (`active()`, () when none): every executable cache that
honours them keys on it, so entering a context builds (or finds) executables compiled with those
options and leaving it finds the old ones again; nothing is recompiled in place. `jax_options()` is
the same as the dict JAX's `jax.jit(..., compiler_options=)` / `Lowered.compile()` take.

Names: any field of XLA's DebugOptions (`xla_*`, as in XLA_FLAGS without the dashes), plus
TorchTPU's `xla_optimization_level` and `xla_memory_fitting_level` ('O0'..'O3', XLA's EffortLevel),
which are ExecutableBuildOptions and go to JAX as `optimization_level` / `memory_fitting_level`
(JAX's own spellings, and `exec_time_optimization_effort` / `memory_fitting_effort` (floats in
[-1, 1]), are accepted too). Values: strings as XLA parses them ('true'/'false' in any case are
booleans), or Python bools, ints and floats. A new set of options is checked once by compiling a
trivial function, so a misspelled name raises at the `with` line, naming it.

The state is process-wide (like torch.set_float32_matmul_precision), not per thread.
"""

from __future__ import annotations

# The options in force: sorted ((name, value), ...); part of cache keys. A one-element list, so the
# hot paths (cache keys, the C++ fast path) read ACTIVE[0] without a call.
ACTIVE = [()]
_active = ACTIVE  # (the name eager/engine.py and eager/fastpath.py read)
_jax = [None]  # the same as JAX's compiler_options dict, or None when there are none
_base: dict = {}  # process-wide settings (allow_excess_precision)
_stack: list = []  # the custom_compiler_options contexts, innermost last
_checked: set = set()
_op_defaults: list = []  # [with a reduction, the others' own, without one] once probed

# One eager op is a small program. XLA:CPU's LLVM IR fusion emitters compile one without a
# reduction ~30-45% faster than the MLIR fusion emitters XLA defaults to, and the code runs as fast
# or faster (elementwise, copies, indexing); with a reduction the compile times are about equal and
# the MLIR emitters' code is faster (softmax, layer_norm, max(dim): 1.4-1.7x at 512x1024); a whole
# graph (torch.compile's) compiles faster with the MLIR emitters. So only one-op executables
# without a reduction take the LLVM IR emitters, on XLA:CPU; the user's options still win
# (benchmarks/compile_time.py, docs/design.md).
# Every one-op executable takes LLVM's -O1 instead of XLA's default -O3 (its first call is mostly
# compile: benchmarks/cold_start.py): the random ops' programs (threefry, inlined) compile 3-5x
# faster (`randn`: 0.8-1.0 s -> 0.17-0.24 s), softmax ~2x, small ones 5-50%; the code runs as fast
# (0.8-1.2x at 1024x1024; a few reductions 1.1-1.36x) and the results are bitwise the same (517
# elementwise, cast and special-function programs over 9 dtypes, random draws, sums, softmax,
# variance, cumsum, argmax, matmul). Not -O0: it leaves products and sums unfused (no FMA), which
# changes float results.
_SMALL_PROGRAM_DEFAULTS = {"cpu": {"xla_backend_optimization_level": 1}}
_NO_REDUCTION_DEFAULTS = {"cpu": {"xla_cpu_use_fusion_emitters": False}}
_REDUCTIONS = frozenset(
    {
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_and",
        "reduce_or",
        "reduce_xor",
        "argmax",
        "argmin",
        "reduce",
    }
)

_LEVELS = {"O0": 9, "O1": 19, "O2": 29, "O3": 39}  # XLA's EffortLevel values
_BUILD_LEVELS = {
    "xla_optimization_level": "optimization_level",
    "xla_memory_fitting_level": "memory_fitting_level",
    "optimization_level": "optimization_level",
    "memory_fitting_level": "memory_fitting_level",
}
_BUILD_EFFORTS = ("exec_time_optimization_effort", "memory_fitting_effort")


def active() -> tuple:
    return ACTIVE[0]


def jax_options():
    return _jax[0]


def op_options(user, jaxpr=None):
    """The compiler options one eager op's executable is compiled with, given `user` (what
    jax_options() was when it was built: what keys it, and what the fused mode and the C++ fast path
    look at) and, when known, its jaxpr: the user's options merged over the platform's defaults for
    small programs (with or without a reduction), the user's winning."""
    reduces = jaxpr is not None and _reduces(jaxpr)  # (called when an op is built, not per call)
    merged = {**_small_program_defaults(reduces), **(user or {})}
    return merged or None


def graph_options(user):
    """The compiler options a whole graph's executable (torch.compile's) is compiled with: the user's
    over the platform's -O1 default. On XLA:CPU a Qwen3-0.6B-shape graph (28 layers, ~3,300 ATen
    nodes) compiles in 26-42% less CPU time at LLVM -O1 than at -O3, runs as fast (prefill 311 vs
    330 ms, decode step 77 vs 76 ms CPU) and computes bitwise the same there (odd shapes such as 7 x 100
    can differ in a reduction's last bit: docs/design.md); it keeps XLA's MLIR fusion emitters (the
    LLVM IR ones compiled that graph 2-4x slower)."""
    merged = {**_small_program_defaults(True), **(user or {})}
    return merged or None


def _reduces(jaxpr) -> bool:
    """Whether a (closed) jaxpr or any jaxpr nested in its equations reduces numbers. Reductions of
    booleans do not count: the device-side checks of index ops (ops/checks.py: all/argmin over their
    flags) would otherwise take every gather, scatter and embedding to the MLIR emitters, whose
    compile is ~40% longer there (embedding with its check 83 -> 47 ms; `any(dim)` runs 1.5x faster
    with the LLVM IR emitters too)."""
    from jax.extend.core import jaxprs_in_params

    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _REDUCTIONS and not all(_is_bool(v) for v in eqn.invars):
            return True
        if any(_reduces(sub) for sub in jaxprs_in_params(eqn.params)):
            return True
    return False


def _is_bool(var) -> bool:
    dtype = getattr(getattr(var, "aval", None), "dtype", None)
    return dtype is not None and dtype.kind == "b"


def _small_program_defaults(reduces: bool) -> dict:
    if not _op_defaults:
        from ..device import platform

        name = platform.platform()
        for table in (_SMALL_PROGRAM_DEFAULTS, _NO_REDUCTION_DEFAULTS):
            defaults = table.get(name, {})
            if defaults:  # a jaxlib whose XLA no longer has the option: XLA's own defaults
                try:
                    _check(defaults, "")
                except ValueError:
                    defaults = {}
            _op_defaults.append(defaults)
        _op_defaults.append({**_op_defaults[0], **_op_defaults[1]})
    return _op_defaults[0] if reduces else _op_defaults[2]


def normalize(options, where="torch.tpu.compiler.custom_compiler_options") -> dict:
    """The options as JAX takes them; a clear error for a malformed name or value."""
    if not isinstance(options, dict):
        raise TypeError(f"{where}: expected a dict of XLA option names to values, got {type(options).__name__}")
    out = {}
    for name, value in options.items():
        if not isinstance(name, str):
            raise TypeError(f"{where}: option names are strings, got {name!r}")
        if name in _BUILD_LEVELS:
            level = value.upper() if isinstance(value, str) else value
            if level not in _LEVELS:
                raise ValueError(f"{where}: {name} must be one of 'O0', 'O1', 'O2', 'O3', got {value!r}")
            out[_BUILD_LEVELS[name]] = _LEVELS[level]
            continue
        if name in _BUILD_EFFORTS:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise TypeError(f"{where}: {name} must be a float in [-1, 1], got {value!r}")
            try:
                effort = float(value)
            except ValueError:
                raise ValueError(f"{where}: {name} must be a float in [-1, 1], got {value!r}") from None
            if not -1.0 <= effort <= 1.0:
                raise ValueError(f"{where}: {name} must be a float in [-1, 1], got {value!r}")
            out[name] = effort
            continue
        if not name.startswith("xla_"):
            raise ValueError(
                f"{where}: unknown option {name!r}: XLA's options are DebugOptions fields named "
                "xla_* (as in XLA_FLAGS, without the dashes), or xla_optimization_level / "
                "xla_memory_fitting_level"
            )
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        elif not isinstance(value, (str, bool, int, float)):
            raise TypeError(f"{where}: the value of {name} must be a string, bool, int or float, got {value!r}")
        out[name] = value
    return out


def _check(options: dict, where: str):
    """Compile a trivial function with these options once: XLA names a bad option or value."""
    key = tuple(sorted(options.items()))
    if not options or key in _checked:
        return
    import jax
    import numpy as np

    probe = {k: v for k, v in options.items() if not k.startswith("xla_dump")}  # no stray dumps
    try:
        jax.jit(lambda x: x + 1, compiler_options=probe or None).lower(np.float32(0)).compile()
    except Exception as e:  # noqa: BLE001 - JaxRuntimeError: INVALID_ARGUMENT: No such compile option
        raise ValueError(f"{where}: XLA rejected {options}: {e}") from None
    _checked.add(key)


def _refresh():
    merged = dict(_base)
    for layer in _stack:
        merged.update(layer)
    ACTIVE[0] = tuple(sorted(merged.items()))
    _jax[0] = merged or None


def push(options: dict, where="torch.tpu.compiler.custom_compiler_options") -> dict:
    """Enter a context of options (merged over the outer ones, the inner ones winning)."""
    layer = normalize(options, where)
    _check(layer, where)
    _stack.append(layer)
    _refresh()
    return layer


def pop(layer: dict):
    for i in range(len(_stack) - 1, -1, -1):
        if _stack[i] is layer:
            del _stack[i]
            break
    _refresh()


def set_base(name: str, value):
    """A process-wide option (None removes it)."""
    if value is None:
        _base.pop(name, None)
    else:
        _base[name] = value
    _refresh()


def base(name: str):
    return _base.get(name)
