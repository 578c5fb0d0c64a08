"""The TPU compile check (TORCHTPU_TPU_COMPILE_CHECK=<topology>, e.g. v5e:2x2): every program torchtpu
builds is also traced as it would be on that TPU and compiled by XLA:TPU (libtpu, no chip needed).

Results still come from the host platform; the check only proves that the same program, with every
TPU-only branch taken, compiles for the TPU. Each site that builds a program goes through this module:
`jit()` (a `jax.jit` whose first call per signature is checked, after the host run) or `check()` (a
program lowered and compiled ahead of time). The second trace runs inside `platform.tracing_for("tpu")`
(lowerings' `lowering_platform()` answers 'tpu') with a JAX configuration value set, so JAX's trace
caches, keyed on it, do not hand back the host's trace; it is lowered with `lowering_platforms=("tpu",)`.

XLA:TPU runs in a long-lived child process (eager/tpu_check_child.py): a compiler abort there (XLA's
CHECK failures end the process) is reported as that program's failure, and the next program starts a
new child. libtpu's start-up noise stays in the child's stderr, shown only when it died.

A program that fails raises TpuCompileCheckError (a RuntimeError) at the op or graph that built it;
`report()` has the counts, each program's XLA:TPU cost analysis ('flops', 'bytes accessed', ...) and
the failures. At exit one line says how many programs compiled and how many failed, followed by the
failed programs and the slowest compiles.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import threading
import warnings

import jax

from .. import config
from ..device import platform

_MESSAGE_LINES = 6  # lines of XLA's error in the exception's message (the whole text is in the report)
_CHILD_STDERR_TAIL = 4000  # characters of a dead child's stderr kept in its failure


class TpuCompileCheckError(RuntimeError):
    """A program torchtpu built does not compile for the TPU topology of TORCHTPU_TPU_COMPILE_CHECK.
    `program`: its name; `topology`; `xla_error`: the compiler's (or the TPU trace's) full message."""

    def __init__(self, program: str, topology: str, xla_error: str, in_trace: bool = False):
        self.program, self.topology, self.xla_error, self.in_trace = program, topology, xla_error, in_trace
        lines = [line for line in xla_error.strip().splitlines() if line.strip()]
        shown = "\n".join(lines[:_MESSAGE_LINES]) + ("\n..." if len(lines) > _MESSAGE_LINES else "")
        super().__init__(f"torchtpu: TPU compile check ({topology}): {program} does not compile for the TPU:\n{shown}")


@dataclasses.dataclass
class ProgramResult:
    """One checked program: `cost` is XLA:TPU's cost_analysis() ('flops', 'bytes accessed', ...)."""

    name: str
    ok: bool
    error: str | None
    cost: dict
    compile_seconds: float


@dataclasses.dataclass
class Report:
    topology: str | None
    compiled: int
    failed: int
    programs: list  # ProgramResult, in the order they were checked

    @property
    def failures(self) -> list:
        return [p for p in self.programs if not p.ok]


_lock = threading.RLock()  # one program at a time through the child
_results: list = []
_atexit = [False]
_EXIT_FAILURES = 20  # failed programs listed at exit
_EXIT_SLOWEST = 3  # the slowest compiles named at exit (a sweep's other finding: a program XLA:TPU takes minutes over)
_test_abort_next = [False]
_jax_state = []  # the JAX configuration value that keys JAX's caches on the TPU trace
# (topology, StableHLO digest, replicas, partitions) -> the child's answer: the same program built again
# (an op's donating form, an entry rebuilt after its cache was cleared) is not compiled again
_compiled: dict = {}


def topology() -> str | None:
    """The topology the check compiles for, or None when the check is off."""
    return config.get("TORCHTPU_TPU_COMPILE_CHECK")


def enabled() -> bool:
    on = topology() is not None
    if on and not _atexit[0]:
        _atexit[0] = True
        atexit.register(_at_exit)
    return on


def host_work_allowed() -> bool:
    """Whether the engine may do a device op's work on the host, on its buffers as they lie: where device
    buffers are host memory (XLA:CPU), and not under the TPU compile check, which must see the device
    program a TPU would run (on a TPU such work would be a round trip through the host)."""
    return platform.buffers_in_host_memory() and not enabled()


def report() -> Report:
    with _lock:
        programs = list(_results)
    failed = sum(not p.ok for p in programs)
    return Report(topology(), len(programs) - failed, failed, programs)


def summary_line() -> str:
    r = report()
    return f"tpu compile check ({r.topology}): {r.compiled} programs compiled, {r.failed} failed"


def _at_exit():
    _child.stop()
    if topology() is not None:
        lines = [summary_line()]
        # the failed programs' names and first error lines: a sweep's errors may have been caught
        # (a test comparing exceptions with the CPU's), and this is all a long run leaves
        failures = report().failures
        for p in failures[:_EXIT_FAILURES]:
            first = next((line.strip() for line in (p.error or "").splitlines() if line.strip()), "")
            lines.append(f"  failed: {p.name}: {first[:300]}")
        if len(failures) > _EXIT_FAILURES:
            lines.append(f"  ... and {len(failures) - _EXIT_FAILURES} more")
        slowest = sorted(report().programs, key=lambda p: -p.compile_seconds)[:_EXIT_SLOWEST]
        if slowest:
            lines.append("  slowest: " + ", ".join(f"{p.name} {p.compile_seconds:.1f} s" for p in slowest))
        print("\n".join(lines), file=sys.stderr, flush=True)
        log = config.get("TORCHTPU_TPU_COMPILE_CHECK_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"[pid {os.getpid()}] " + "\n".join(lines) + "\n")


# ---------------------------------------------------------------- building programs
def jit(fn, name: str, **jit_kwargs):
    """`jax.jit(fn, **jit_kwargs)`; with the check on, a callable that checks each new signature of its
    calls (after the host run, so an error the host raises keeps its type). `__wrapped__` is fn's."""
    jitted = jax.jit(fn, **jit_kwargs)
    if not enabled():
        return jitted
    return wrap(jitted, fn, name, **jit_kwargs)


def jitting(**jit_kwargs):
    """`jit` as a decorator (`@functools.partial(jax.jit, ...)`'s place) for functions jitted once, when
    their module loads: the program is named after the function, and checked whenever the check is on
    at a call (turned on after the import too), not only when it was on at the decoration."""

    def decorate(fn):
        return wrap(jax.jit(fn, **jit_kwargs), fn, f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}", **jit_kwargs)

    return decorate


def wrap(run, fn, name: str, **jit_kwargs):
    """`run` (fn's executable as the site built it) checked per signature; the check traces fn itself,
    jitted with `jit_kwargs` (compiler options dropped: they are the host's)."""
    jit_kwargs.pop("compiler_options", None)
    return _Checked(run, jax.jit(fn, **jit_kwargs), name, getattr(fn, "__wrapped__", fn))


class _Checked:
    __slots__ = ("__weakref__", "__wrapped__", "check_name", "run", "seen", "traceable")  # (weakref: fusion._twins)

    def __init__(self, run, traceable, name, wrapped):
        self.run, self.traceable, self.check_name, self.seen = run, traceable, name, {}
        self.__wrapped__ = wrapped

    def __call__(self, *args, **kwargs):
        if not enabled():  # the check is off (turned off after this program was built, or not on yet)
            return self.run(*args, **kwargs)
        leaves = jax.tree_util.tree_leaves((args, kwargs))
        if any(isinstance(x, jax.core.Tracer) for x in leaves):  # inside a trace: the outer program is checked
            return self.run(*args, **kwargs)
        key = (topology(), _signature(leaves))  # (a later switch to another topology checks again)
        failure = self.seen.get(key, False)
        if failure is False:  # checked before the host runs it: a failure leaves donated inputs intact
            failure = self.seen[key] = _check_failure(self.traceable, args, kwargs, self.check_name)
        if failure is None:
            return self.run(*args, **kwargs)
        if failure.in_trace:  # an error of the host's own trace keeps its type: the host traces first
            try:
                self.run(*args, **kwargs)
            except Exception:
                _forget(failure.result)  # bad input on every platform (an op's own error): not the TPU's
                raise
        raise failure.with_traceback(None)  # (the same error again: not the previous raise's frames)

    def lower(self, *args, **kwargs):
        return self.run.lower(*args, **kwargs)

    def trace(self, *args, **kwargs):
        return self.run.trace(*args, **kwargs)


def _signature(leaves):
    key = []
    for x in leaves:
        shape = getattr(x, "shape", None)
        if shape is not None and hasattr(x, "dtype"):
            key.append((tuple(shape), str(x.dtype), getattr(x, "weak_type", False), getattr(x, "sharding", None)))
        else:
            try:
                hash(x)
                key.append(x)
            except TypeError:
                key.append(type(x))
    return tuple(key)


def check_failure(traceable, args, name: str, kwargs=None):
    """`check`'s error instead of raising it (None when the program compiled or the check is off): for
    sites that must finish their host work before raising (eager/fusion.py's segments)."""
    if not enabled():
        return None
    if not hasattr(traceable, "trace"):
        traceable = jax.jit(traceable)
    return _check_failure(traceable, args, kwargs or {}, name)


def check(traceable, args, name: str, kwargs=None):
    """Check one program built ahead of time: `traceable` (a `jax.jit` object, or a function to jit) at
    `args` (arrays, ShapeDtypeStructs or static values, as its `.trace` takes them). No-op when the check
    is off; raises TpuCompileCheckError when the program does not compile for the TPU."""
    if not enabled():
        return
    if not hasattr(traceable, "trace"):
        traceable = jax.jit(traceable)
    failure = _check_failure(traceable, args, kwargs or {}, name)
    if failure is not None:
        raise failure


def _check_failure(traceable, args, kwargs, name):
    """The check's error for one program, or None when XLA:TPU compiled it; records the result."""
    topo = topology()
    try:
        bytecode, replicas, partitions = _lower_for_tpu(traceable, args, kwargs)
    except Exception as e:  # noqa: BLE001 -- the TPU trace itself failed: a TPU-only branch, or a TPU lowering
        error = f"tracing for the TPU failed: {type(e).__name__}: {e}"
        failure = TpuCompileCheckError(name, topo, error, in_trace=True)
        failure.result = ProgramResult(name, False, error, {}, 0.0)
        _record(failure.result)
        return failure
    key = (topo, hashlib.sha256(bytecode).digest(), replicas, partitions)
    known = _compiled.get(key)
    if known is None or _test_abort_next[0]:
        known = _child.compile(topo, name, bytecode, replicas, partitions)
        if not known[0] or "compiler process died" not in known[0]:  # (a crash may be the machine's: retried)
            _compiled[key] = known
    error, cost, seconds = known
    _record(ProgramResult(name, error is None, error, cost, seconds))
    return None if error is None else TpuCompileCheckError(name, topo, error)


def _record(result):
    with _lock:
        _results.append(result)


def _forget(result):
    with _lock:
        _results[:] = [r for r in _results if r is not result]


def _trace_key():
    """A JAX configuration value in JAX's trace and jit cache keys: set while tracing for the TPU, so
    nested `jax.jit`s are traced again instead of reusing the host's jaxprs."""
    if not _jax_state:
        from jax._src import config as jax_config

        _jax_state.append(
            jax_config.bool_state(
                "torchtpu_tracing_for_tpu",
                False,
                "torchtpu's TPU compile check is tracing a program for a TPU",
                include_in_jit_key=True,
                include_in_trace_context=True,
            )
        )
    return _jax_state[0]


def _lower_for_tpu(traceable, args, kwargs):
    from jax._src.interpreters import mlir

    with platform.tracing_for("tpu"), _trace_key()(True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        lowered = traceable.trace(*args, **kwargs).lower(lowering_platforms=("tpu",))
        module = lowered.compiler_ir("stablehlo")
        attributes = module.operation.attributes
        replicas = int(attributes["mhlo.num_replicas"].value) if "mhlo.num_replicas" in attributes else 1
        partitions = int(attributes["mhlo.num_partitions"].value) if "mhlo.num_partitions" in attributes else 1
        return mlir.module_to_bytecode(module), replicas, partitions


def _abort_next_for_test():
    """Tests: the child aborts (as XLA:TPU does on a CHECK failure) on the next program it is sent."""
    _test_abort_next[0] = True


# ---------------------------------------------------------------- the compiler process
class _Child:
    """The long-lived XLA:TPU compiler process: started on the first program, restarted after a crash."""

    def __init__(self):
        self.proc = None
        self.topology = None
        self.stderr = None
        self.start_error = None  # a topology libtpu refused: every program fails with it

    def _start(self, topo):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tpu_check_child.py")
        workdir = tempfile.mkdtemp(prefix="torchtpu-tpu-check-")
        self.stderr = open(os.path.join(workdir, "stderr"), "w+b")  # noqa: SIM115 -- the child's lifetime
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)  # the host's XLA:CPU flags are unknown to XLA:TPU, which aborts on them
        env["JAX_PLATFORMS"] = "cpu"  # libtpu loads for the topology only, never as a backend
        env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # compile-only: other processes may hold libtpu's chip lock
        # (run by path from an empty directory: the package's own modules must not shadow the stdlib's)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')", script, topo],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            cwd=workdir,
            env=env,
        )
        self.topology = topo
        reply = self._receive()
        if reply is None:
            return self._died("starting")
        error, _info, _ = reply
        if error is not None:
            self.start_error = f"libtpu could not provide topology {topo!r}: {error}"
            self.stop()
        return None

    def compile(self, topo, name, bytecode, replicas, partitions):
        with _lock:
            if self.start_error is not None and self.topology == topo:
                return self.start_error, {}, 0.0
            if self.proc is None or self.proc.poll() is not None or self.topology != topo:
                self.stop()
                self.start_error = None
                died = self._start(topo)
                if died is not None or self.start_error is not None:
                    return died or self.start_error, {}, 0.0
            abort = _test_abort_next[0]
            _test_abort_next[0] = False
            try:
                self._send((name, bytecode, replicas, partitions, abort))
                reply = self._receive()
            except BrokenPipeError:  # the child is gone: its exit status says why
                reply = None
            except BaseException:
                # interrupted mid-exchange (Ctrl-C, `timeout -s INT`, a test's time limit: a SIGALRM
                # handler's TimeoutError is an OSError, not a dead child): a half-written request leaves
                # both processes waiting on each other, an unread reply would answer the next program;
                # the next program gets a new child
                self.stop(kill=True)
                raise
            if reply is None:
                return self._died(f"compiling {name}"), {}, 0.0
            return reply

    def _send(self, message):
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.write(struct.pack(">Q", len(data)) + data)
        self.proc.stdin.flush()

    def _receive(self):
        head = self.proc.stdout.read(8)
        if len(head) < 8:
            return None
        (n,) = struct.unpack(">Q", head)
        return pickle.loads(self.proc.stdout.read(n))

    def _died(self, doing):
        """The child ended while `doing`: its exit status and the end of its stderr, as the failure.
        (Its replies' pipe closed: a child still running after that is killed, never waited on forever.)"""
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.stderr.seek(0)
        tail = self.stderr.read().decode(errors="replace")[-_CHILD_STDERR_TAIL:]
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.proc = None
        self.stderr.close()
        return f"the XLA:TPU compiler process died ({how}) while {doing}; its stderr ended with:\n{tail.strip()}"

    def stop(self, kill=False):
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                if kill:
                    proc.kill()
                proc.stdin.close()
                proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 -- at exit: a child that does not end is killed
                proc.kill()
                proc.wait()
            proc.stdout.close()
        if self.stderr is not None and not self.stderr.closed:
            self.stderr.close()


_child = _Child()


def reset_for_test():
    """Tests: forget the results (the child stays)."""
    with _lock:
        _results.clear()


def cost_of(name: str) -> list:
    """XLA:TPU's cost analysis of each checked program named `name`, in order."""
    with _lock:
        return [p.cost for p in _results if p.name == name]
