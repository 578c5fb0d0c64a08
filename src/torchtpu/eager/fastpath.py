"""The eager engine's C++ fast path (csrc/: fast_path.h names its files), in front of the Python kernels.

A strict-mode eager op used to cost, besides the executable call itself, PyTorch's boxing of the
arguments into Python objects, the engine's Python key building and lookup, and the output tensor:
about twice raw JAX eager for a small `a + b`. The fast path is a C++ boxed kernel on PrivateUse1
for each functional overload whose returns are all Tensors, and each in-place or out= overload;
the engine's Python kernel moves to the spare PrivateUse3 key, where the C++ kernel finds PyTorch's
own holder of it and falls back to it. The C++ kernel keys the call from the IValue stack (at least
as finely as OpKernel.__call__ does) and, for a key whose entry is plain (returns that are all new
outputs, or the written argument; no constants, overlap check, XLA options, random numbers, host
check that could fail, donated write), in strict mode calls the entry's jitted function itself
(through the entry's memo for small ops: engine.memoizing; a write in its gated form while
unchecked device-side verdicts exist: engine.write_gate), keeps its own verdict if it has checks,
and makes the outputs as `new_tensor` does. In the fused mode it appends a warm op's call to the
open segment itself, the step eager/fusion.py `defer` would append (about a third of a Python
queued call's cost), and hands anything with a decision to make (an op's first call in a sync
window that finds it cold, a segment to open or to end, a gated write, an input queued in another
segment not run yet, the fusion lock held by another thread) to `OpKernel._run`, which queues it;
either way it makes the outputs over the queued results.
Everything else runs the Python kernel, unchanged: a key seen for the first time (after which
`describe` tells the C++ side whether the entry the Python kernel ran is plain), the debug mode, a
failed device-side assert, a pending interrupt, XLA options in force, in strict mode an unwritten or
queued input buffer, any error in strict mode (the Python kernel runs the op again and raises).

What the C++ side reads of the Python side is one declared table, FastPathTable below (the live
state it checks, the types whose slots it reads, the callables it calls, fusion's limits), read by
name and checked at load; what a cache hit does there, step by step, is in docs/architecture.md.

TORCHTPU_EAGER_FAST=0 (or TORCHTPU_NATIVE=off, or no C++ compiler) registers the Python kernels on
PrivateUse1 as before. The library is compiled once per torch/Python version, source hash and
compiler flags, like the device extension (device/native.py), and links libtorch_python.
"""

from __future__ import annotations

import ctypes
import dataclasses
import pathlib
import warnings
from collections.abc import Callable
from typing import NamedTuple

from jax._src.array import ArrayImpl

from .. import config
from ..device import native
from ..metrics import counters
from ..storage import host_values, records
from ..storage.records import RECORDS, StorageRecord, new_tensor, storage_shape
from . import asserts, fusion, interrupts, limits, modes, xla_options
from .device_scalars import device_scalar
from .entry import Entry

# the fast path's files (csrc/fast_path.h names each one's step), compiled as one unit
_CSRC = pathlib.Path(__file__).with_name("csrc")
_SOURCES = tuple(
    _CSRC / name
    for name in ("fast_path.h", "call_key.cpp", "fused_queue.cpp", "outputs.cpp", "table.cpp", "fast_kernel.cpp")
)
_lib = [None]
_graph_functions = [None]
_tried = [False]
_problem = [None]


@dataclasses.dataclass(frozen=True)
class FastPathTable:
    """Everything the C++ fast path reads of the Python side, by name: csrc/table.cpp reads
    each field as an attribute (its kTableNames lists the same names; `load` refuses a library whose
    list differs) and checks its type at init. The lists and dicts are the live objects the Python
    engine reads and writes, so both sides see one state."""

    # the eager state a call checks before it may go fast (a change of any sends calls to Python)
    records: dict  # storage address -> StorageRecord
    mode: list  # [the eager mode's name]
    strict_mode: str
    fused_mode: str
    failed_asserts: dict  # failed device-side asserts not raised yet
    pending_interrupts: list
    xla_active: list  # [XLA options in force]
    unchecked_verdicts: list  # [device-side verdicts not checked yet]: writes are gated meanwhile
    counters: object  # metrics.counters: eager_cache_hits, fused_ops
    # the objects a cache hit reads and makes
    record_type: type  # StorageRecord: _buffer, dtype, numel, shape, device_index slots
    array_type: type  # the jax.Array implementation a record's plain buffer has
    entry_type: type  # the engine's Entry: memo, and for the fused queue fn, last_sync, cold, ...
    new_tensor: Callable  # storage/records.py new_tensor: outputs not made in C++
    describe: Callable  # describe(kernel): the plan of the entry it just ran, True, or False
    device_scalar: Callable  # a number as the device array kept for it
    note_verdict: Callable  # asserts.note(verdict, messages, where)
    run_method: str  # the OpKernel method that runs or queues a keyed call
    # making new outputs on tpu:0 in C++ (as new_tensor does), while StorageRecord has the slots it fills
    native_outputs: bool
    address_counter: list  # [the next storage address]
    memory_stats: dict  # device index -> MemoryStats
    storage_ref_type: type
    memory_stats_type: type
    page_bytes: int  # storage/records.py's address spacing (a guard page after each storage)
    # the fused mode's queue (eager/fusion.py defer), with fusion's own limits
    open_segments: dict  # device index -> open _Segment
    sync_count: list
    fusion_lock: object
    pending_type: type
    segment_type: type
    min_ops: int
    limit: int
    cold_calls: int
    hot_syncs: int
    plan_type: type  # FastPlan: C++ finds each of its fields by name at load
    # storage/host_values.py KNOWN (storage address -> values): a plan with `host_values` runs the
    # Python kernel for a call with one of those storages
    host_values: dict


class FastPlan(NamedTuple):
    """What `describe` says of a plain entry: what the C++ fast path runs for its key (csrc/fast_path.h
    kPlanFields names the same fields; the load refuses a FastPlan that lacks one)."""

    fn: Callable  # the jitted function (through the entry's memo for a small op: engine.memoizing)
    outs: tuple  # ((shape, dtype[, strides, form]) of each new output, ...); () for an in-place or out= op
    written_slots: tuple  # the storage slots it writes
    checks: tuple | None  # device-side check messages (fn returns a verdict last), or None
    where: str  # the op's name, for those messages
    gate: Callable | None  # the write's gate while unchecked verdicts exist (engine.write_gate), or None
    entry: object  # the engine's Entry (the fused mode queues it)
    unmemoized_fn: Callable | None  # for a memo plan, the executable called once the memo gives up
    fused_only: bool  # a write to a large storage, which strict mode's Python kernel donates
    # the op's host check raises only for values the host knows (its `reads_host_values`): a call
    # with an input in storage/host_values.py KNOWN runs the Python kernel, any other skips the check
    host_values: bool


# the StorageRecord slots the C++ side fills when it makes an output
_RECORD_SLOTS = {"_buffer", "dtype", "numel", "nbytes", "device_index", "ref", "oom", "shape", "__weakref__"}


def _table(describe, run_method) -> FastPathTable:
    return FastPathTable(
        records=RECORDS,
        mode=modes._mode,
        strict_mode="strict",
        fused_mode="fused",
        failed_asserts=asserts.FAILED,
        pending_interrupts=interrupts.PENDING,
        xla_active=xla_options.ACTIVE,
        unchecked_verdicts=asserts._unchecked,
        counters=counters,
        record_type=StorageRecord,
        array_type=ArrayImpl,
        entry_type=Entry,
        new_tensor=new_tensor,
        describe=describe,
        device_scalar=device_scalar,
        note_verdict=asserts.note,
        run_method=run_method,
        native_outputs=set(StorageRecord.__slots__) == _RECORD_SLOTS,
        address_counter=records._bump,
        memory_stats=records._stats,
        storage_ref_type=records._StorageRef,
        memory_stats_type=records.MemoryStats,
        page_bytes=records.PAGE_BYTES,
        open_segments=fusion._open,
        sync_count=fusion._syncs,
        fusion_lock=fusion._lock,
        pending_type=fusion.Pending,
        segment_type=fusion._Segment,
        min_ops=fusion.MIN_OPS,
        limit=fusion.LIMIT,
        cold_calls=fusion.COLD_CALLS,
        hot_syncs=fusion.HOT_SYNCS,
        plan_type=FastPlan,
        host_values=host_values.KNOWN,
    )


def describe(kernel, entry, memoizing, write_gate):
    """What the C++ fast path may do with `entry`, the entry `kernel` just ran (`memoizing` and
    `write_gate`: the engine's, eager/engine.py): its FastPlan, or False for an entry that is not
    plain. Plain: a functional op whose returns are all new tensors, or an in-place or out= op (no
    new output; the written argument returned)."""
    if kernel.random or kernel.specialize_scalars:  # (the C++ key holds the matmul precision)
        return False
    # a host check that may raise: only one that reads nothing but host-known values (index_select's
    # bounds) lets the C++ side serve the calls whose inputs the host does not know
    reads_host_values = bool(entry.host_checked) and getattr(kernel.host_check, "reads_host_values", False)
    if (
        entry.consts is not None
        or entry.overlap is not None
        or entry.xla is not None
        or entry.fn is None
        or (entry.host_checked and not reads_host_values)
    ):
        return False
    checks = tuple(entry.checks) if entry.checks else None
    if entry.mutated_slots:
        return _describe_write(kernel, entry, checks, write_gate, reads_host_values)
    n_returns = len(kernel.op._schema.returns)
    if (
        entry.nones is not None
        or len(entry.outs) != n_returns
        or entry.n_results != n_returns + bool(checks)
        or (entry.spec is not None and not all(type(s) is not str and s.is_leaf() for s in entry.spec))
    ):
        return False
    # (shape, dtype) per new output; (shape, dtype, strides, its storage's array shape) for one laid
    # out otherwise than contiguously
    strides = entry.strides or (None,) * len(entry.outs)
    outs = tuple(
        (tuple(shape), dtype) if st is None else (tuple(shape), dtype, st, storage_shape(shape, st))
        for (shape, dtype), st in zip(entry.outs, strides)
    )
    if entry.memo is not None:  # a small op keeps its last results, keyed on the numbers' values:
        # memoizing takes the numbers themselves, not kept device arrays
        return FastPlan(
            memoizing(entry), outs, (), checks, kernel.where, None, entry, entry.fn, False, reads_host_values
        )
    return FastPlan(entry.fn, outs, (), checks, kernel.where, None, entry, None, False, reads_host_values)


def _describe_write(kernel, entry, checks, write_gate, reads_host_values=False):
    """describe for an in-place or out= entry: it returns the one argument it writes."""
    if (
        entry.outs
        or entry.nones is not None
        or entry.spec is None
        or len(entry.spec) != 1
        or not isinstance(entry.spec[0], str)
        or entry.n_results != len(entry.mutated_slots) + bool(checks)
    ):
        return False
    gate = write_gate(entry) if entry.source is not None else None
    # (entry.traced: a large storage, donated when nothing else holds its buffer: strict mode's
    # Python kernel)
    slots = tuple(entry.mutated_slots)
    return FastPlan(
        entry.fn, (), slots, checks, kernel.where, gate, entry, None, entry.traced is not None, reads_host_values
    )


def set_cache_scalars(on: bool = True) -> bool:
    """Pass kept device arrays for traced numbers (the default) or the numbers; the previous setting."""
    lib = _lib[0]
    return bool(lib.torchtpu_fast_cache_scalars(int(bool(on)))) if lib is not None else False


def _build_library() -> pathlib.Path:
    target = native._target(_SOURCES, "tpu_fast", python=True)
    failed = target.with_suffix(".failed")
    if target.exists():
        return target
    # a build that failed (no Python headers, say) is not tried again at every import (~20 s):
    # delete the .failed file next to the library to retry
    if failed.exists():
        raise RuntimeError(f"building the fast path failed before; see {failed}")
    try:
        return native.build(_SOURCES, "tpu_fast", python=True, unity=True)
    except Exception as e:
        if native.compiler() is not None:
            try:
                failed.write_text(f"{type(e).__name__}: {e}\n")
            except OSError:  # (a read-only cache: the build is tried again next time, nothing lost)
                pass
        raise


def _declare(lib) -> None:
    """The ctypes signatures of the library's entry points, and its table matching FastPathTable."""
    lib.torchtpu_fast_table_names.restype = ctypes.py_object
    fields = {f.name for f in dataclasses.fields(FastPathTable)}
    names = set(lib.torchtpu_fast_table_names())
    if names != fields:
        raise RuntimeError(
            "csrc/fast_path.h kTableNames and fastpath.py FastPathTable differ: "
            f"only in C++ {sorted(names - fields)}, only in Python {sorted(fields - names)}"
        )
    lib.torchtpu_fast_init.argtypes = [ctypes.py_object]
    lib.torchtpu_fast_attach.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.py_object,
        ctypes.py_object,
        ctypes.c_int,
    ]
    lib.torchtpu_fast_attach_metadata.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.torchtpu_fast_set_enabled.argtypes = [ctypes.c_int]
    lib.torchtpu_fast_calls.restype = ctypes.c_longlong
    lib.torchtpu_fast_fallbacks.restype = ctypes.c_longlong
    lib.torchtpu_fast_queued_here.restype = ctypes.c_longlong
    lib.torchtpu_graph_functions.restype = ctypes.py_object
    lib.torchtpu_storage_freed.restype = ctypes.py_object


def load(describe_last_call, run_method: str) -> bool:
    """Build (once) and load the library; whether the fast path is available. `describe_last_call(kernel)`
    answers the C++ side's question after a Python kernel ran (`describe`, or True: ask again
    later); `run_method`: the OpKernel method that runs or queues a keyed call."""
    if _lib[0] is not None:
        return True
    if _tried[0]:
        return False
    _tried[0] = True
    if not config.get("TORCHTPU_EAGER_FAST"):
        _problem[0] = "TORCHTPU_EAGER_FAST=0"
        return False
    if config.get("TORCHTPU_NATIVE") == "off":
        _problem[0] = "TORCHTPU_NATIVE=off"
        return False
    try:
        lib = ctypes.PyDLL(str(_build_library()))
        _declare(lib)
        lib.torchtpu_fast_init(_table(describe_last_call, run_method))
    except Exception as e:  # noqa: BLE001 - the Python kernels work without it
        _problem[0] = f"{type(e).__name__}: {e}"
        # No compiler is the documented degradation, and a build that failed before was reported then:
        # both stay quiet (`python -m torchtpu info` names the reason); anything else is said once here
        if native.compiler() is not None and not str(e).startswith("building the fast path failed before"):
            warnings.warn(
                f"torchtpu: the C++ eager fast path is off ({_problem[0]}); eager ops run through the "
                "Python kernels, about 2x slower per small op. TORCHTPU_EAGER_FAST=0 stops trying.",
                RuntimeWarning,
                stacklevel=2,
            )
        return False
    _lib[0] = lib
    _graph_functions[0] = lib.torchtpu_graph_functions()
    freed = lib.torchtpu_storage_freed()
    if freed is not None:  # every storage made from now on, in Python too, is freed by it
        records._on_free = freed
    lib.torchtpu_fast_set_enabled(1)
    return True


def _alias_arg(op, kernel):
    """The index of the argument an in-place or out= overload returns; -1 for new tensors (one or
    more); None when the fast path cannot serve the overload."""
    schema = op._schema
    if (
        not schema.name.startswith("aten::")
        or not schema.returns
        or any(str(r.type) != "Tensor" for r in schema.returns)
    ):
        return None
    writes = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if all(r.alias_info is None for r in schema.returns):
        return -1 if not writes else None
    if len(schema.returns) != 1:
        return None
    name = kernel.aliased_returns[0]
    for i, a in enumerate(schema.arguments):
        if a.name == name and str(a.type) == "Tensor" and a.alias_info is not None and a.alias_info.is_write:
            return i
    return None


def eligible(op, kernel) -> bool:
    """Overloads the fast path may serve: aten, Tensor returns, which are all new (a functional op)
    or one, the argument it writes (an in-place or out= op)."""
    return _alias_arg(op, kernel) is not None


def attach(op, kernel) -> bool:
    """Put the C++ kernel on PrivateUse1 in front of `kernel` (already registered on PrivateUse3)."""
    lib = _lib[0]
    schema = op._schema
    filled = kernel.filled or ((), ())
    flags = bytes(
        (2 if i in filled[0] else i in kernel.scalar_pos)
        if not a.kwarg_only
        else (2 if a.name in filled[1] else a.name in kernel.scalar_names)
        for i, a in enumerate(schema.arguments)
    )
    name = schema.name.split("::", 1)[1].encode()
    try:
        return bool(
            lib.torchtpu_fast_attach(name, schema.overload_name.encode(), kernel, flags, _alias_arg(op, kernel))
        )
    except Exception:  # noqa: BLE001 - the Python kernel is registered instead
        return False


def attach_metadata(op) -> bool:
    """Put a C++ kernel on PrivateUse1 that hands a metadata-only op (view, as_strided, ...) to its
    CPU kernel, which shares the storage; False where the Python redispatch must serve it."""
    lib = _lib[0]
    if lib is None:
        return False
    schema = op._schema
    try:
        return bool(
            lib.torchtpu_fast_attach_metadata(schema.name.split("::", 1)[1].encode(), schema.overload_name.encode())
        )
    except Exception:  # noqa: BLE001 - the Python redispatch is registered instead
        return False


def loaded() -> bool:
    return _lib[0] is not None


def graph_functions():
    """(graph_fingerprint, graph_match, graph_outputs, graph_records) for compiled graphs
    (compile/backend.py): the fast key in one C++ pass over a call's tensors (_FastKey), the outputs
    made as the fast path's are, and the records and buffers of a call's storages; None without the
    library."""
    return _graph_functions[0]


def problem():
    """Why the fast path is not in use, or None."""
    return _problem[0]


def set_enabled(on: bool = True) -> bool:
    """Turn the fast path on or off at run time (every call takes the Python kernel when off);
    the previous setting."""
    lib = _lib[0]
    if lib is None:
        return False
    was = bool(lib.torchtpu_fast_enabled())
    lib.torchtpu_fast_set_enabled(int(bool(on)))
    return was


def set_fused_queue(on: bool = True) -> bool:
    """Queue fused-mode calls in C++ (the default) or through OpKernel._run; the previous setting."""
    lib = _lib[0]
    return bool(lib.torchtpu_fast_fused_queue(int(bool(on)))) if lib is not None else False


def set_native_outputs(on: bool = True) -> bool:
    """Make new outputs (tpu:0) in C++ (the default) or through `new_tensor`; the previous setting."""
    lib = _lib[0]
    return bool(lib.torchtpu_fast_native_outputs(int(bool(on)))) if lib is not None else False


def clear():
    """Forget every fast entry: the Python caches were cleared, or what keys them changed."""
    if _lib[0] is not None:
        _lib[0].torchtpu_fast_clear()


limits.FORGETTERS.append(clear)


def stats() -> dict:
    lib = _lib[0]
    if lib is None:
        return {"fast_calls": 0, "fallbacks": 0, "queued_here": 0}
    return {
        "fast_calls": lib.torchtpu_fast_calls(),
        "fallbacks": lib.torchtpu_fast_fallbacks(),
        "queued_here": lib.torchtpu_fast_queued_here(),
    }
