"""The "fused" eager mode: queue ops, run each repeated stretch of them as one XLA executable.

In this mode an op does not call its executable; it appends (executable, where its inputs come
from, its traced scalars) to the device's open segment and returns tensors whose storages hold
`Pending` placeholders (storage/records.py). Anything that needs a value (a copy to the host,
`.item()`, a compiled graph's inputs, a data-dependent op, `torch.tpu.synchronize()`, leaving the
mode) reads the storage's buffer, which flushes the segment; long streams are cut where the ops
say (see MIN_OPS). Flushing is where the gain is:

- a segment's key is its sequence of (executable, input wiring) plus which of its results are
  still referenced. A loop (a training step, a sampling step) issues the same segments every
  iteration; a segment that comes back within RECENT flushes (its COMPILE_AT-th run in a row) is
  compiled as one jitted function that calls the ops' executables in order. XLA inlines and
  fuses them: one dispatch replaces dozens, and results nobody holds any more (temporaries,
  buffers an in-place op replaced) are never written out;
- any other segment runs op by op through the same executables, compiling nothing, so code whose
  shapes change every step (a growing KV cache, generate()'s growing token list) costs what the
  "strict" mode costs instead of compiling a graph per step, the trap of torch_xla's lazy tensors.

The compile of a segment (seconds for a long one) happens on a background thread while the
segment keeps running op by op, so a loop's first iterations cost what "strict" mode costs instead of
stalling while XLA compiles (TORCHTPU_FUSED_COMPILE=now compiles in the flush). The compiled form is
first used at a fixed run (USE_AFTER), waiting there for the thread if needed, never "as soon as it is
ready": a segment's compiled form and its op-by-op replay can differ in the last bit (XLA contracts
one op's multiply and the next op's add into one FMA), so which runs are fused must depend on the
program alone, not on the compile's timing, for a seeded program to give the same results each run.

Only executables that already ran once are queued (their number of results is known then), so an
op's first call, and PyTorch's errors for bad arguments, happen at the op as in "strict" mode; an
executable not queued recently ("cold", below) is not queued either but runs at once.

`defer` has a twin in C++ (csrc/fused_queue.cpp queue), which appends a warm op's step
when nothing is to decide and leaves every decision here: a change to the layout of a step, a
`_Segment` or a `Pending`, or to when an op is cold, is a change to both.
"""

from __future__ import annotations

import atexit
import queue
import threading
import warnings
import weakref
from collections import deque
from itertools import chain, compress, repeat
from operator import is_not, itemgetter

import jax

from .. import config
from ..device import platform
from ..metrics import counters
from ..storage.records import Placeholder
from . import interrupts, limits, modes, tpu_check
from .device_scalars import device_scalar
from .limits import note_executable
from .modes import _mode
from .random import is_draw_key

# Where a segment ends without being asked. The cuts depend on the ops, not on a count from wherever
# the stream began, so a loop that never synchronizes (an eager training loop read every 50 steps) is
# cut at the same places every iteration and its segments repeat (a fixed-size cut would shift phase
# from one iteration to the next and never see the same segment twice). Once a segment holds MIN_OPS:
# before an op with the executable the segment began with (a loop's next iteration), or after an
# "anchor" op (one executable key in ANCHOR_EVERY, by a hash stable across processes, which resyncs
# loops longer than LIMIT); at LIMIT ops in any case, which also bounds a segment's compile time.
MIN_OPS = 16
ANCHOR_EVERY = 64
LIMIT = 384
# A segment is compiled when it comes back within RECENT flushes of its last run: a loop's body;
# segments that recur only far apart keep running op by op rather than compiling one executable each.
# (A segment of one op is never compiled: it already is one executable.)
# An op whose executable was not queued within the last HOT_SYNCS synchronizations (host reads of
# device values) is "cold": generate()'s `cat` onto the token list has a new shape at every position,
# so each of its executables runs once per call, many syncs apart. A cold op is not queued: it runs at
# once, outside any segment (only its inputs still queued end the open segment first), so the
# segments around it repeat from one decoding step to the next and get compiled. (Syncs, not
# flushes, are the clock: a training loop read every 50 steps keeps all its ops warm however many
# segments a step has.) An executable that is cold at its first call in a sync window stays cold for
# its next calls in that window, up to COLD_CALLS: one decoding step appends to the tokens and to the
# position ids with the same executable (both have the step's length), and the second call must not
# look warm and pull a once-per-length op into the repeating segment. A loop that never synchronizes
# warms up after COLD_CALLS iterations.
RECENT = 16
# ... and compiled at its COMPILE_AT-th run in a row (each within RECENT flushes of the one before): a
# segment that runs exactly twice (a test calling generate() twice on the same shapes) compiled an
# executable (~1 s of XLA:CPU compile for a decoder step) that never ran; a loop's body waits one more
# iteration, replayed op by op.
COMPILE_AT = 3
# ... or at its COMPILE_AT_DRAWS-th for a segment that draws random numbers: each draw inlines a
# threefry hash, ~1.5 s of XLA:CPU compile (a segment of two draws and a bmm: 3.3 s of CPU; the draw's
# own executable is compiled once per size bucket and shared), so a sweep over layouts or shapes that
# repeats each case's segment a few times (PyTorch's test_baddbmm: 216 permutations of device-drawn
# operands, 67 s of process CPU, 4 s in "strict" mode) compiled a segment it used once or twice. A
# training loop's step with dropout still compiles, a few steps later.
COMPILE_AT_DRAWS = 8
# A segment compiled in the background replays op by op for USE_AFTER - 1 more runs, then runs
# compiled from its (COMPILE_AT + USE_AFTER)-th run on, waiting there for the compile if it is not done
# (a warm on-disk cache loads it in milliseconds; a cold compile overlaps USE_AFTER runs).
USE_AFTER = 2
HOT_SYNCS = 8
COLD_CALLS = 4
# ... except a "fresh" executable, built in a sync window at most FRESH_SYNCS after its kernel built
# another (eager/build.py note_build): a new shape per decoding position (the growing KV cache's
# `cat`, attention over it), called by every layer of its step. Cold at its first call in a window,
# it stays cold all that window: else each layer's segment, a new key per position, was compiled
# once per position (16 of a 16-token generate()'s 20 compiles; at 1-2 s of XLA:CPU each, mostly
# ready after their step, of use only to a later generate() of exactly those lengths).
FRESH_SYNCS = 8
_MAX_KEYS = 4096  # segments remembered as seen before that memory is cleared
# "background" (default): segments compile on a worker thread while they keep running op by op;
# "now": in the flush that decides to compile (deterministic counts, for tests).
COMPILE = config.get("TORCHTPU_FUSED_COMPILE")


class Pending(Placeholder):
    """A buffer that a queued op will produce: `get()` runs the segment it belongs to, if it has not
    run yet, and returns the array."""

    __slots__ = ("__weakref__", "index", "segment", "step", "value")

    def __init__(self, segment, step, index):
        self.segment = segment
        self.step = step
        self.index = index
        self.value = None

    def get(self):
        if self.value is None:
            self.segment.flush()
            if self.value is None:
                raise RuntimeError(
                    "torchtpu: this tensor has no value: the queued ops that compute it "
                    "failed when they ran (see the earlier error)"
                )
        return self.value

    def failed(self):
        return self.value is None and self.segment.failed


class _Segment:
    __slots__ = ("device", "done", "external", "external_ids", "failed", "steps", "undo", "undo_ids")

    def __init__(self, device):
        self.device = device
        # per step, one tuple (appended in one C call, so an interrupt queues a step whole or not at
        # all): (executable, sources, traced scalars, weak references to its Pending results);
        # (executable, sources) of each step, with the live results, make the segment's key
        self.steps = []
        self.external = []  # concrete input arrays, in first-use order
        self.external_ids = {}  # id(array) -> index in external
        self.undo = []  # (record, buffer before this segment) of each storage it writes
        self.undo_ids = set()
        self.done = False  # run, or being run (flush)
        self.failed = False  # given up: its runs failed (_give_up)

    def flush(self):
        with _lock:
            _syncs[0] += 1
            _flush(self)


_open: dict[int, _Segment] = {}
_lock = threading.RLock()
_seen: dict[tuple, tuple] = {}  # segment key -> (the flush that last ran it op by op, recent runs)
_flushes = [0]
_syncs = [0]  # host reads of device values, and flushes asked for by synchronize or a mode switch
_compiled: dict[tuple, object] = {}
_compiling: dict = {}  # keys handed to the compile thread, not used yet -> their _Job
_epoch = [0]  # bumped by forget(): compiles started before it are dropped
_unnoted: deque = deque()  # background compiles not yet counted by limits.note_executable
_consume = deque(maxlen=0).extend
_FAILED = object()  # a segment whose compile failed: it keeps running op by op
failures: list = []  # (segment key, exception) of the last background compiles that failed


def defer(entry, inputs, scalars, device, mutated=(), fn=None):
    """Queue `entry.fn(*inputs, *scalars)` (or `fn`, its gated form: eager/engine.py _gated) and return
    one Pending per result, giving the storages in `mutated` (the op's written records) their Pending
    buffers; None for a cold op, which the caller runs now as in "strict" mode (its queued inputs are
    ready by then)."""
    fn = fn or entry.fn
    with _lock:
        now = _syncs[0]
        if entry.last_sync != now:  # its first call in this sync window decides
            entry.cold = now - entry.last_sync > HOT_SYNCS
            entry.last_sync = now
            entry.window_calls = 0
        entry.window_calls += 1
        segment = _open.get(device)
        if entry.cold and (entry.window_calls <= COLD_CALLS or entry.fresh):
            if entry.fresh:  # cold all window (the C++ queue asks here while calls <= COLD_CALLS)
                entry.window_calls = 1
            # run now, outside any segment, so the segments around it repeat from one step to the
            # next: only its inputs still queued in the open segment end that segment first
            if segment is not None and any(type(b) is Pending and b.segment is segment for b in inputs):
                _flush(segment)
            counters.fused_cold_ops += 1
            return None
        if segment is None:
            segment = _open[device] = _Segment(device)
        elif len(segment.steps) >= MIN_OPS and segment.steps[0][0] is fn:
            _flush(segment)
            segment = _open[device] = _Segment(device)
        sources = tuple(_sources(segment, inputs))
        step = len(segment.steps)
        results = tuple([Pending(segment, step, i) for i in range(entry.n_results)])
        for r in mutated:  # what to restore if the segment cannot run
            if id(r) not in segment.undo_ids:
                segment.undo.append((r, r._buffer))
                segment.undo_ids.add(id(r))
        segment.steps.append((fn, sources, scalars, [weakref.ref(p) for p in results]))
        if mutated:  # (their buffers are never None here: eager/executable.py input_buffers)
            n = len(entry.outs)
            _consume(map(setattr, mutated, repeat("_buffer"), results[n : n + len(mutated)]))
        counters.fused_ops += 1
        if step + 1 >= MIN_OPS and (entry.anchor or step + 1 >= LIMIT):
            _flush(segment)
        return results


def run_inputs(buffers):
    """Run the segments that still owe any of `buffers` (Pending), as a cold op's queued inputs are run
    (`defer`): without a tick of the sync clock, which a host read (`Pending.get`) counts."""
    with _lock:
        for b in buffers:
            if type(b) is Pending and b.value is None and not b.segment.done:
                _flush(b.segment)


class _Combination:
    """The maximum of `n` int32 verdicts on one device (eager/asserts.py poison: a write's gate), an
    executable that is queued like an op (`queued_maximum`) or called at once (`maximum`)."""

    __slots__ = ("anchor", "cold", "fn", "fresh", "last_sync", "n_results", "window_calls")

    def __init__(self, device, n):
        sharding = jax.sharding.SingleDeviceSharding(platform.jax_device(device))
        self.fn = tpu_check.jit(
            lambda *v: (jax.numpy.max(jax.numpy.stack(v)),), f"maximum of {n} assert verdicts", out_shardings=sharding
        )
        self.n_results = 1
        self.anchor = False
        self.last_sync = -1 << 40
        self.cold = True
        self.fresh = False
        self.window_calls = 0


_combinations: dict = {}


def _combination(device, n) -> _Combination:
    entry = _combinations.get((device, n))
    if entry is None:
        entry = _combinations[(device, n)] = _Combination(device, n)
    return entry


def maximum(verdicts, device):
    """The maximum of the arrays `verdicts`, computed now."""
    verdicts = _padded(verdicts)
    return _combination(device, len(verdicts)).fn(*verdicts)[0]


def queued_maximum(verdicts, device):
    """The maximum of `verdicts` (arrays and this device's queued results) as a queued result, or None
    where it cannot be queued now (a cold op: the caller computes it at once)."""
    verdicts = _padded(verdicts)
    results = defer(_combination(device, len(verdicts)), verdicts, (), device)
    return None if results is None else results[0]


def _padded(verdicts):
    """`verdicts` padded to a power-of-two count with copies of the first (the maximum is the same):
    a list that grows between syncs (backward gates on every verdict the forward noted since the
    last one: a training loop reading its loss every 50 steps adds one per step) compiles a
    combination per power of two, not one per length (~40 ms each, in the step that meets it)."""
    n = len(verdicts)
    size = 1 << (n - 1).bit_length()
    return verdicts if size == n else [*verdicts, *[verdicts[0]] * (size - n)]


def queued(b) -> bool:
    """Whether `b` is a result of a segment still open (not run yet)."""
    return type(b) is Pending and b.value is None and not b.segment.done


def _sources(segment, inputs):
    """Where each input comes from: (step, index) of a result queued in `segment`, or the index of a
    concrete array in its external inputs."""
    for b in inputs:
        if type(b) is Pending:
            if b.segment is segment:
                yield (b.step, b.index)
                continue
            b = b.get()
        index = segment.external_ids.get(id(b))
        if index is None:
            segment.external.append(b)  # (then the index: an interrupt leaves no index to nothing)
            index = segment.external_ids[id(b)] = len(segment.external) - 1
        yield index


def count_sync():
    """A host read of a value that was not queued: a sync point all the same (the clock of "cold").
    Only in the fused mode: the clock is the fused mode's own, and a stretch of strict mode (a
    compiled forward's generate(), say) must not find every op cold when the fused mode comes back."""
    if _mode[0] == "fused":
        _syncs[0] += 1


def count_read(buffer):
    """A host read of `buffer` (a copy to the host, blocking or not): a sync point, counted here
    unless reading it runs its queued segment, which counts itself. (A value that is not queued, or
    whose segment already ran, ended by a cold op that took another of its results, was not counted:
    generate()'s stop flag, computed by cold ops, then stopped the clock, and every op stayed cold.)"""
    if type(buffer) is not Pending or buffer.value is not None:
        count_sync()


def forget():
    """Forget compiled segments (limits.forget_executables); queued segments still run."""
    with _lock:
        _compiled.clear()
        _seen.clear()
        _compiling.clear()
        _epoch[0] += 1


def wait_for_compiles(timeout=None):
    """Block until the background compiles started so far are done (tests, benchmarks)."""
    with _lock:
        if not _compiling:
            return
        done = threading.Event()
        _jobs().put((None, done))
    done.wait(timeout)


def flush_all():
    with _lock:
        _syncs[0] += 1
        for segment in list(_open.values()):
            _flush(segment)


limits.FORGETTERS.append(forget)
modes.BEFORE_LEAVING_FUSED.append(flush_all)  # queued ops run before the mode changes


def _flush(segment: _Segment):
    """Run the segment's queued steps and give their live Pending results their values, or none.

    An exception raised while it runs is either asynchronous (Ctrl-C, or a signal handler's: a test
    runner's time limit raising TimeoutError from SIGALRM), landing anywhere in this code, or a
    failure of the steps, which recurs: its steps are pure functions of arrays the segment holds
    (the queue never donates them), so running them again is safe. So a failed run is run again: a
    run that completes makes the segment whole and the first exception is raised after; ATTEMPTS
    failures give the segment up (`_give_up`) and raise the last. An interrupt outside a run (in
    the bookkeeping here) leaves the segment closed and not run, run by the next read of one of its
    results. Either way the device's other tensors and later ops are untouched (docs/design.md)."""
    if segment.done:  # another thread ran it while this one waited for the lock
        return
    # Out of the open segments first, then done: an interrupt between the two leaves a closed segment
    # not run yet (a later read runs it). The other order left a done segment open, and every later
    # op was queued into a segment that never runs: all of them lost their results.
    if _open.get(segment.device) is segment:
        del _open[segment.device]
    first = None
    ran = False
    try:
        segment.done = True
        for attempt in range(ATTEMPTS):
            try:
                _run_segment(segment)
                ran = True
                break
            except BaseException as e:
                if first is None:
                    first = e
                if attempt == ATTEMPTS - 1:
                    _give_up(segment)
                    raise
    finally:
        if not ran and not segment.failed:  # interrupted outside a run: still to run
            segment.done = False
    # A result still held (a parameter's new value, until the next step replaces it) keeps its
    # segment: let it keep nothing else. The steps' tuples and weak references would otherwise live a
    # whole training step, get promoted to the GC's oldest generation by the thousand, and set off a
    # full collection of the process's heap (~250 ms with torch and JAX loaded) every ~100 steps.
    segment.steps = segment.external = segment.external_ids = segment.undo = None
    if _tpu_check_failure:  # raised once the segment's results are in place
        raise _tpu_check_failure.pop()
    if first is not None:
        raise first


ATTEMPTS = 3  # runs of a segment before an exception in them is taken as the steps' own failure


def _give_up(segment):
    """A segment whose runs failed: its results have no value (reading one says so; a synchronize
    skips them: storage/records.py live_buffers), and the storages it wrote get back their buffers
    from before it. An interrupt during the undo does not cut it short (it is idempotent)."""
    segment.failed = True
    for _ in range(ATTEMPTS):
        try:
            _undo(segment)
            return
        except BaseException:  # noqa: BLE001 -- an interrupt: undo the rest, raise the segment's error
            continue


# (a step is (executable, sources, numbers, weak references to its results): eager/fusion.py defer)
_step_plan = itemgetter(0, 1)
_step_numbers = itemgetter(2)
_step_refs = itemgetter(3)
_deref = weakref.ref.__call__


def _run_segment(segment):
    if _open.get(segment.device) is segment:
        del _open[segment.device]
    steps = segment.steps
    if not steps:
        return
    _flushes[0] += 1
    # (C-level passes: a decoding step flushes ~7 segments of ~40 ops per token)
    held = list(map(_deref, chain.from_iterable(map(_step_refs, steps))))  # each result's Pending, or None
    live = bytes(map(is_not, held, repeat(None)))  # which results someone still holds
    if 1 not in live:  # nothing anyone can observe: every result was dropped or overwritten
        return
    if len(steps) == 1:  # one op is already one executable: nothing to key, compile or remember
        fn, sources, numbers, _ = steps[0]
        external = segment.external
        values = list(compress(fn(*[external[s] for s in sources], *numbers), live))
        _consume(map(setattr, filter(None, held), repeat("value"), values))
        return
    plan = tuple(map(_step_plan, steps))
    key = (segment.device, plan, live)
    fn = _executable_for(segment, key, plan, live)
    values = _run(fn, key, plan, live, segment, list(map(_step_numbers, steps)))
    # in C: every Pending gets its value, or (an interrupt before this line) none
    _consume(map(setattr, filter(None, held), repeat("value"), values))


def _results(steps, live):
    """(step, index) of each live result, in order, for `live` (one byte per result of `steps`)."""
    where = [(s, i) for s, step in enumerate(steps) for i in range(len(step[3]))]
    return tuple(compress(where, live))


def _undo(segment):
    """The storages the segment wrote get back their buffers from before it (those no later write
    replaced)."""
    if not segment.undo:
        return
    undo = [
        (r, old)
        for r, old in segment.undo
        if type(r._buffer) is Pending and r._buffer.segment is segment and r._buffer.value is None
    ]
    list(map(setattr, [r for r, _ in undo], repeat("_buffer"), [old for _, old in undo]))
    segment.undo = []


def _executable_for(segment, key, plan, live):
    """The segment's compiled executable if it has one, else None (it runs op by op); decides
    whether to compile it (see RECENT)."""
    fn = _compiled.get(key)
    if _unnoted:
        _note_background_compiles()
    if fn is not None:  # (a compiled segment is never also compiling)
        return fn
    job = _compiling.get(key)
    if job is not None:
        job.last = _flushes[0]  # still wanted: the compile thread skips segments gone stale
        if job.runs_left:
            job.runs_left -= 1
        else:  # its run to switch (USE_AFTER), whether or not the thread is done
            fn = _compiled[key] = _finished(job)
            del _compiling[key]
    elif len(plan) > 1:  # (one op is already one executable)
        last, runs = _seen.get(key, (None, 0))
        recent = last is not None and _flushes[0] - last <= RECENT
        if recent and runs + 1 >= COMPILE_AT and (runs + 1 >= COMPILE_AT_DRAWS or not _draws(segment.steps)):
            del _seen[key]
            results = _results(segment.steps, live)
            if tpu_check.enabled():
                _check_for_tpu(segment, plan, results)
            if COMPILE == "now":
                fn = _compiled[key] = _fuse(plan, results, segment.device)
                counters.fused_compiles += 1
                note_executable()
            else:
                _compile_later(key, segment, plan, results)
        else:
            if len(_seen) >= _MAX_KEYS:
                _seen.clear()
            _seen[key] = (_flushes[0], runs + 1 if recent else 1)
    return fn


def _draws(steps):
    """Whether a step of the segment draws random numbers (its traced values hold a PRNG key)."""
    return any(is_draw_key(v) for step in steps for v in step[2])


# (type, value) of a Python number -> the device array a compiled segment gets for it, or None for a
# number seen once: a decoding step's numbers repeat, an optimizer's bias corrections change at every
# step, and making an array (~15 µs) for a number used once costs more than JAX's conversion
_kept: dict = {}


def _as_arrays(scalars):
    """Each step's Python numbers as kept device arrays, for a compiled segment, from their second
    use: JAX converts a number at every call (~1.7 µs each; a decoder layer's segment has ~8), and
    takes a weakly typed array of the same dtype where it was lowered for a number. The op-by-op
    replay keeps the numbers: its ops' executables were traced with them (device_scalars.py)."""
    return [_step_as_arrays(step) if step else step for step in scalars]


def _step_as_arrays(step):
    converted = []
    for v in step:
        t = type(v)
        if t is int or t is float or t is bool:
            k = (t, v.hex() if t is float else v)  # (-0.0 and 0.0, True and 1 kept apart)
            if k not in _kept:  # first use: the number itself
                if len(_kept) >= _MAX_KEYS:
                    _kept.clear()
                _kept[k] = None
            else:
                a = _kept[k]
                if a is None:
                    a = _kept[k] = device_scalar(v)
                v = a
        converted.append(v)
    return tuple(converted)


def _run(fn, key, plan, live, segment, scalars):
    if fn is not None and fn is not _FAILED:
        try:
            try:
                values = fn(segment.external, _as_arrays(scalars))
            except RecursionError as e:
                if not interrupts.cleared_a_stuck_jax_cache(e):
                    raise
                values = fn(segment.external, _as_arrays(scalars))  # (nothing ran: traced afresh)
            counters.fused_runs += 1
            return values
        except TypeError:
            # an executable compiled ahead of time takes exactly the argument types it was lowered
            # for (a Python scalar's type, say); a mismatch is refused before it runs: replay instead
            _compiled[key] = _FAILED
    # op by op through the ops' own executables
    return _replay(plan, _results(segment.steps, live), segment.external, scalars)


def _replay(plan, live, external, scalars):
    """Call the steps' executables in order; the live results. Traced by `_fuse`, it is one graph."""
    results = []
    for (fn, sources), sc in zip(plan, scalars):
        args = [external[s] if type(s) is int else results[s[0]][s[1]] for s in sources]
        results.append(fn(*args, *sc))
    return [results[s][i] for s, i in live]


def _fuse(plan, live, device):
    sharding = jax.sharding.SingleDeviceSharding(platform.jax_device(device))
    plan = [(_nestable(fn), sources) for fn, sources in plan]
    return jax.jit(lambda external, scalars: _replay(plan, live, external, scalars), out_shardings=sharding)


_twins: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _nestable(fn):
    """An op's executable as a segment's trace calls it: the same function jitted without compiler
    options (JAX takes them on a top-level jit only, and one-op executables carry the engine's:
    eager/xla_options.py op_options); the segment is compiled with its own."""
    twin = _twins.get(fn)
    if twin is None:
        inner = getattr(fn, "__wrapped__", None)
        twin = _twins[fn] = jax.jit(inner) if inner is not None else fn
    return twin


# ---------------------------------------------------------------- background compiles
_thread: list = []  # (queue, thread) of the compile thread, started on first use
_STOP = object()  # the job that ends the compile thread (at exit)


def _jobs():
    if not _thread:
        q = queue.SimpleQueue()
        t = threading.Thread(target=_compile_loop, args=(q,), name="torchtpu-fused-compile", daemon=True)
        t.start()
        _thread.append((q, t))
        atexit.register(_stop)
    return _thread[0][0]


def _stop():
    """At exit: let the compile in progress finish (a daemon thread killed inside XLA aborts the
    process) and drop the queued ones."""
    q, t = _thread[0]
    _epoch[0] += 1
    q.put((_STOP, None))
    # A Ctrl-C here must not cut the wait short: Python would then finalize with the thread inside
    # XLA, and a thread that re-takes the GIL during finalization is ended with pthread_exit, whose
    # unwinding through jaxlib's C++ aborts ("terminate called without an active exception").
    interrupted = None
    while t.is_alive():
        try:
            t.join()
        except KeyboardInterrupt as e:
            interrupted = e
    if interrupted is not None:
        raise interrupted


def _abstract(x):
    """What a lowering needs of an argument: shape, dtype and placement of an array (holding the array
    would keep its buffer alive and defeat donation); Python and NumPy scalars as they are."""
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding, weak_type=x.weak_type)
    if type(x) is tuple:
        return tuple(_abstract(y) for y in x)
    return x


_tpu_check_failure: list = []  # a segment's TPU compile check error, raised after it ran (_run_segment)


def _check_for_tpu(segment, plan, live):
    """The TPU compile check of a segment about to be compiled (eager/tpu_check.py)."""
    fused = _fuse(plan, live, segment.device)
    external = [_abstract(a) for a in segment.external]
    scalars = [_abstract(step[2]) for step in segment.steps]  # (not _as_arrays: it counts uses)
    ops = [getattr(fn, "check_name", "?") for fn, _ in plan]
    name = f"fused segment of {len(plan)} ops ({', '.join(ops[:4])}{', ...' if len(ops) > 4 else ''})"
    failure = tpu_check.check_failure(fused, (external, scalars), name)
    if failure is not None:
        _tpu_check_failure[:] = [failure]


class _Job:
    """A segment handed to the compile thread: what to compile, and (`done`) its executable, or None
    where the thread skipped it."""

    __slots__ = ("done", "epoch", "executable", "external", "fused", "key", "last", "runs_left", "scalars")

    def __init__(self, key, fused, external, scalars):
        self.key, self.fused, self.external, self.scalars = key, fused, external, scalars
        self.epoch = _epoch[0]
        self.last = _flushes[0]  # the flush that last ran the segment
        self.runs_left = USE_AFTER - 1  # op-by-op runs before the compiled form is used
        self.executable = None
        self.done = threading.Event()

    def compile(self):
        try:
            return self.fused.lower(self.external, self.scalars).compile()
        except Exception as e:  # any compile failure: the segment keeps running op by op
            if interrupts.from_signal(e):
                raise
            _note_failure(self.key, e)
            return _FAILED


def _compile_later(key, segment, plan, live):
    fused = _fuse(plan, live, segment.device)
    external = [_abstract(a) for a in segment.external]
    scalars = [_abstract(step) for step in _as_arrays([step[2] for step in segment.steps])]
    job = _compiling[key] = _Job(key, fused, external, scalars)
    _jobs().put((job, None))


def _finished(job):
    """The job's executable, at the run where its segment switches to it: waits for the compile thread
    (which takes no lock of this module, so the caller may hold `_lock`), or compiles here a job the
    thread skipped as stale."""
    job.done.wait()
    if job.executable is None:
        job.executable = job.compile()
        if job.executable is not _FAILED:
            counters.fused_compiles += 1
            note_executable()
    return job.executable


def _compile_loop(q):
    while True:
        job, done = q.get()
        if job is _STOP:
            return
        if job is None:  # wait_for_compiles: every job queued before it has finished
            done.set()
            continue
        # (read without `_lock`: a run waiting in _finished holds it. Skipping changes when the
        # segment compiles, not which of its runs are compiled: _finished compiles a skipped one.)
        stale = _flushes[0] - job.last > RECENT  # not run since it was queued: not a loop's body after all
        if job.epoch == _epoch[0] and not stale:
            job.executable = job.compile()
            if job.executable is not _FAILED:
                counters.fused_compiles += 1
                _unnoted.append(None)
        job.done.set()


def _note_failure(key, error):
    """A segment that failed to compile keeps running op by op (as correct, only slower): say so once
    per segment, and keep the last few errors in `failures` for inspection."""
    counters.fused_compile_failures += 1
    failures.append((key, error))
    del failures[:-8]
    warnings.warn(
        f"torchtpu: a fused segment of {len(key[1])} ops failed to compile and runs op by op: "
        f"{type(error).__name__}: {error}",
        RuntimeWarning,
        stacklevel=1,
    )


def _note_background_compiles():
    while _unnoted:
        _unnoted.popleft()
        note_executable()
