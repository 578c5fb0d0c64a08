"""The eager engine: one PrivateUse1 kernel per ATen overload, running cached XLA executables.

A call builds a key from static facts (each tensor's dtype and view layout, which inputs share a
storage, the non-tensor arguments, the shape of each storage's array), finds the executable for it
and calls it with the storages' arrays and the `Scalar` arguments (traced, so a changing learning
rate does not recompile). The executable reads the views, runs the lowering and writes in-place results back through the
views, all in one XLA computation; outputs become new storages, mutated storages get new buffers.

On a cache miss the op runs once on "meta" tensors: that gives PyTorch's own output shapes and
dtypes and PyTorch's own error messages for bad input, before anything is traced.
"""

from __future__ import annotations

import threading
import warnings

import jax
import torch
from jax._src.array import ArrayImpl
from torch.utils import _pytree as pytree

from ..device.state import current_device
from ..metrics import counters
from ..ops.dtypes import scalar_type_name
from ..ops.linalg import matmul_precision as _matmul_precision
from ..storage.records import RECORDS, donatable, new_tensor
from . import asserts, errors, fastpath, fusion, interrupts, limits
from .asserts import FAILED as _failed
from .build import build_entry, follows_default_dtype, op_jit
from .entry import (
    _SCALAR_TYPES,
    CONSTANT_VALUES,
    FOREIGN,
    LIST,
    MEMO_GIVE_UP,
    MEMO_VALUES,
    SCALAR,
    TENSOR,
    NeedsResize,
    SpecializeScalars,
    arg_kind,
    scalar_key,
)
from .executable import call_and_commit, device_mismatch, input_buffers, key_tensor, traced_function
from .fusion import Pending
from .interrupts import PENDING as _interrupted
from .limits import note_executable
from .modes import _mode
from .random import generator_rng_args, next_rng_args
from .xla_options import _active as _xla_active

_Tensor = torch.Tensor
_default_dtype = torch.get_default_dtype
# argument types that only ever key the cache as they are (checked by exact type, before isinstance)
_PLAIN = frozenset({type(None), bool, str, torch.dtype, torch.layout, torch.memory_format})


class TpuOpError(RuntimeError):
    pass


class _CpuOperand(Exception):  # (control flow: never seen outside the engine)
    """A CPU tensor (not 0-dim) among the arguments of an op that declares cpu_operands."""

    def __init__(self, tensor, device):
        super().__init__()
        self.tensor, self.device = tensor, device


_KERNELS: list = []
# this thread's latest call: (kernel, entry), for the C++ fast path (describe_last_call), which asks
# right after the Python kernel returns, in the same thread
_last = threading.local()


def _forget_kernel_caches():
    for kernel in _KERNELS:
        kernel.cache.clear()


limits.FORGETTERS.append(_forget_kernel_caches)


def forget_last_call():
    """A kernel other than the engine's ran: the C++ fast path must not take the entry of an earlier
    call for it."""
    _last.call = None


def describe_last_call(kernel):
    """The C++ fast path's question once `kernel`'s Python kernel has run: eager/fastpath.py
    describe of the entry it ran, or True (ask again later) when the last call was not this
    kernel's."""
    kernel_and_entry = getattr(_last, "call", None)
    if kernel_and_entry is None or kernel_and_entry[0] is not kernel:
        return True
    return fastpath.describe(kernel, kernel_and_entry[1], memoizing, write_gate)


def _scalar_positions(schema):
    """Arguments whose Python numbers travel as traced values: the schema's numbers, and Tensor
    arguments, which get a Python number from an operator (`x * lr`): baked in, every new learning
    rate or temperature would compile a new executable. (Such a number is weakly typed, as PyTorch's
    wrapped numbers: ops/dtypes.py promotes it as a scalar.)"""
    pos, names = set(), set()
    for i, a in enumerate(schema.arguments):
        if str(a.type) in ("number", "Optional[number]", "Tensor", "Optional[Tensor]"):
            (names if a.kwarg_only else pos).add(a.name if a.kwarg_only else i)
    return pos, names


def _mutable_args(schema):
    """Names and positions of the arguments the op writes to, in schema order."""
    return [
        (i, a.name, a.kwarg_only)
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]


class OpKernel:
    """The PrivateUse1 kernel of one ATen overload."""

    def __init__(self, op: torch._ops.OpOverload):
        self.op = op
        schema = op._schema
        self.name = f"{schema.name.split('::')[1]}.{schema.overload_name or 'default'}"
        self.where = "aten::" + self.name
        self.scalar_pos, self.scalar_names = _scalar_positions(schema)
        self.mutable = _mutable_args(schema)
        # the same, as sets: a CPU 0-dim tensor here is written, so it cannot travel as a scalar
        self.written_pos = {i for i, _, kwarg_only in self.mutable if not kwarg_only}
        self.written_names = {name for _, name, _ in self.mutable}
        self.cache = {}
        # a return that aliases an argument is that argument itself (add_ returns self)
        self.aliased_returns = [_aliased_name(schema, r) for r in schema.returns]
        self.random = False  # set at registration: the lowering takes a PRNG key
        self.draws_by_index = False  # set at registration: eager/bucketed_draws.py may draw it
        self.index_buckets = None  # set at registration: eager/bucketed_index.py may pad its index
        self.specialize_scalars = False  # set when the op runs through a traced decomposition
        # set when its lowering read torch's float32 matmul precision: the setting keys the cache
        self.precision_sensitive = False
        # ops/argument_checks.py: a check of the op's Scalar arguments on the host, run per call
        self.host_check = None
        # ops/table.py cpu_operands: (positions, names) of the arguments whose CPU tensors the call
        # moves to its device (set at registration), or None
        self.cpu_operands = None
        # eager/kernels.py: a first call it serves another way (a cat of many tensors, in chunks), or None
        self.split_call = None
        # the sync windows of its last two builds (eager/build.py note_build)
        self.build_windows = (None, None)
        self.lock = threading.RLock()
        # the schema's defaults, to key a call as the dispatcher passes it (`_canonical_call`)
        self.positional_defaults, self.kwarg_defaults = _schema_defaults(schema)
        self.first_default = next((i for i, d in enumerate(self.positional_defaults) if d[0]), 1 << 30)
        # arguments traced as values (`traced=` of the lowering) that take their default when absent:
        # (positions, names); set at registration (set_filled_defaults)
        self.filled = None
        self.fill_end = 0  # the positional arguments a call always passes (the last filled one's, + 1)
        _KERNELS.append(self)

    def set_filled_defaults(self, names):
        """Arguments named in `names` (a lowering's `traced=`) that have a default travel as values
        in every call, the default filled in where the call leaves them out: keyed as passed, a flag
        left at its default (which the dispatcher leaves out) and a flag passed keyed two programs."""
        arguments = self.op._schema.arguments
        pos = {i for i, a in enumerate(arguments) if a.name in names and not a.kwarg_only and a.has_default_value()}
        kw = {a.name for a in arguments if a.name in names and a.kwarg_only and a.has_default_value()}
        pos = {i for i in pos if arguments[i].default_value is not None}
        kw = {n for n in kw if self.kwarg_defaults[n] is not None}
        self.filled = (frozenset(pos), frozenset(kw)) if pos or kw else None
        self.fill_end = max(pos) + 1 if pos else 0

    def _canonical_call(self, args, kwargs):
        """(args, kwargs) as the dispatcher passes a call (trailing positional arguments and keyword-only
        ones at their schema default left out), with the arguments of `filled` passed: one key for
        `op(x)` and `op(x, flag=default)` whichever way the call came (the dispatcher, or a kernel of
        this package calling another directly), and the same key as the C++ fast path's
        (csrc/call_key.cpp `present`)."""
        defaults = self.positional_defaults
        n = len(args)
        fill_end = self.fill_end
        while n > fill_end and n > 0 and _is_default(args[n - 1], defaults[n - 1]):
            n -= 1
        if n < fill_end:
            args = (*args, *(d[1] for d in defaults[n:fill_end]))
        elif n < len(args):
            args = args[:n]
        filled = self.filled
        names = filled[1] if filled is not None else ()
        if kwargs or names:
            kw_defaults = self.kwarg_defaults
            kept = {}
            for name, d in kw_defaults.items():  # (schema order, as the C++ key and the dispatcher)
                if name in kwargs:
                    a = kwargs[name]
                    if name in names or not _is_default(a, (True, d)):
                        kept[name] = a
                elif name in names:
                    kept[name] = d
            for name, a in kwargs.items():  # (a positional argument passed by name: as it came)
                if name not in kw_defaults:
                    kept[name] = a
            kwargs = kept
        return args, kwargs

    # ---------------------------------------------------------------- hot path
    def __call__(self, *args, **kwargs):
        if self.host_check is not None:
            self.host_check(*args, **kwargs)
        if kwargs or self.filled is not None or len(args) > self.first_default:
            args, kwargs = self._canonical_call(args, kwargs)
        parts = []
        slot_of = {}
        records = []
        scalars = []
        offsets = []  # non-zero storage offsets travel as traced values: x[i] in a loop compiles once
        device = -1
        scalar_pos = self.scalar_pos
        try:  # (free unless raised: Python 3.11's exceptions cost only when raised)
            for i, a in enumerate(args):
                if isinstance(a, _Tensor):  # the common case first
                    address = a.untyped_storage().data_ptr()
                    r = RECORDS.get(address)
                    if r is not None:
                        device = key_tensor(a, r, address, parts, slot_of, records, offsets, device, self.where)
                        continue
                device = self._flatten(
                    a, parts, slot_of, records, scalars, offsets, device, i in scalar_pos, i in self.written_pos
                )
            if kwargs:
                scalar_names, written_names = self.scalar_names, self.written_names
                for k, a in kwargs.items():
                    parts.append(k)
                    device = self._flatten(
                        a, parts, slot_of, records, scalars, offsets, device, k in scalar_names, k in written_names
                    )
        except _CpuOperand as e:
            return self._with_cpu_operands_moved(e.tensor, e.device, args, kwargs)
        keyed_precision = self.precision_sensitive
        if keyed_precision:
            parts.append(_matmul_precision())
        if _xla_active[0]:  # torch.tpu.compiler.custom_compiler_options / allow_excess_precision
            parts.append(_xla_active[0])
        if _failed:  # a device-side assert failed on this device: sticky until cleared (eager/asserts.py)
            asserts.raise_if_failed(device if device >= 0 else current_device())
        if _interrupted:  # a Ctrl-C Python could not raise where it landed (eager/interrupts.py)
            interrupts.raise_pending()
        key = tuple(parts)
        entry = self.cache.get(key)
        if entry is None:
            return self._first_call(key, keyed_precision, args, kwargs, records, scalars, offsets, device)
        dd = entry.default_dtype
        if dd is not None and dd is not _default_dtype():  # built under another torch default dtype
            key, entry = self._other_default_dtype(key, entry, args, kwargs)
            if entry is None:
                return self._first_call(key, keyed_precision, args, kwargs, records, scalars, offsets, device)
        counters.eager_cache_hits += 1
        _last.call = (self, entry)
        if entry.overlap is not None:  # PyTorch's partial-overlap error for writes (eager/overlap.py)
            entry.overlap(offsets)
        dev = device if device >= 0 else 0
        results = self._run(entry, records, scalars, offsets, dev, args, kwargs)
        if entry.spec is None and entry.strides is None:  # exactly one new contiguous tensor
            shape, dtype = entry.outs[0]
            return new_tensor(shape, dtype, dev, results[0])
        return self._returns(entry, results, dev, args, kwargs)

    def _other_default_dtype(self, key, entry, args, kwargs):
        """(key, entry or None) for a call whose key found an entry built under another default
        dtype: that entry, from now on for every default dtype, when neither its result dtypes nor
        its trace depend on the setting (eager/build.py follows_default_dtype); else the key with
        the default dtype in it (the C++ fast path's keys always hold it). Keying every op on it
        compiled everything twice in tests that switch it (PyTorch's do, per test)."""
        if not entry.follows_default_dtype:
            if not follows_default_dtype(self, entry, args, kwargs):
                entry.default_dtype = None
                return key, entry
            entry.follows_default_dtype = True
        key = (*key, ("D", _default_dtype()))
        return key, self.cache.get(key)

    def _first_call(self, key, keyed_precision, args, kwargs, records, scalars, offsets, device):
        """A cache miss: build the entry, run it (JAX traces it then), keep it."""
        if self.split_call is not None:
            interrupts.install()  # (as build_entry does: a process may serve all its first ops this way)
            results = self.split_call(self, args, kwargs)
            if results is not None:
                forget_last_call()  # (the C++ fast path keeps no entry for this key)
                return results
        try:
            entry = self._build(key, args, kwargs, records, device)
        except NeedsResize as e:
            for t, shape, strides in e.resizes:
                t.resize_(shape)
                if strides is not None and tuple(strides) != tuple(t.stride()):
                    t.as_strided_(shape, strides, t.storage_offset())
            return self(*args, **kwargs)
        except SpecializeScalars:
            return self(*args, **kwargs)
        counters.eager_compiles += 1
        note_executable()
        if self.host_check is not None:  # (the C++ fast path skips the check when it cannot raise)
            entry.host_checked = getattr(self.host_check, "can_raise", _always)(*args, **kwargs)
        _last.call = (self, entry)
        dev = device if device >= 0 else 0
        try:
            results = self._run(entry, records, scalars, offsets, dev, args, kwargs)
        except BaseException as e:
            if entry.n_results is None:  # failed or interrupted while JAX traced it: build afresh
                self.cache.pop(key, None)
            if isinstance(e, (ValueError, TypeError)) and _raised_in_jax(e):
                raise _as_torch_error(self, e, args, kwargs) from e
            raise
        if self.precision_sensitive and not keyed_precision:
            # the trace read the matmul precision: from now on the setting is part of the key
            self.cache[(*key, _matmul_precision())] = entry
        if entry.spec is None and entry.strides is None:
            shape, dtype = entry.outs[0]
            return new_tensor(shape, dtype, dev, results[0])
        return self._returns(entry, results, dev, args, kwargs)

    def _run(self, entry, records, scalars, offsets, dev, args, kwargs):
        """Call (or, in the fused mode, queue) the executable and give the written storages their
        new buffers; the results."""
        try:
            results = self._call(entry, records, scalars, offsets, dev, args, kwargs)
        except jax.errors.JaxRuntimeError as e:
            errors.raise_out_of_memory(e)  # torch.OutOfMemoryError, as on CUDA (`a.repeat(10**9)`)
            raise
        if entry.checks:
            asserts.note(results[-1], entry.checks, self.where)
        if _mode[0] == "debug":
            jax.block_until_ready(results)
        return results

    def _call(self, entry, records, scalars, offsets, dev, args, kwargs):
        mode = _mode[0]
        if entry.consts is not None:
            results = _constant(entry, scalars)
        else:
            # (an op built with XLA options runs as in strict mode: a fused segment has one set)
            deferred = mode == "fused" and entry.n_results is not None and entry.xla is None
            # a write whose storages were never written (`empty` then `uniform_`: randn, rand_like)
            # is a new tensor's first value: not gated, as new tensors are not (the gated form is a
            # program of its own per shape, which a random fill's bucketed draw would otherwise avoid)
            gated = entry.mutated_slots and entry.source is not None and asserts.gating()
            if gated and all(records[s]._buffer is None for s in entry.mutated_slots):
                gated = False
            inputs = input_buffers(records, deferred)
            if self.random:
                scalars.append(self._rng_args(args, kwargs, dev))
            results = None
            if deferred:
                fn = None
                queued = inputs
                if gated:
                    gate = asserts.poison(dev, queue=True)  # (eager/asserts.py; may be queued)
                    if gate is not None:
                        fn = entry.fn_gated or _gated(entry)
                        queued = [*inputs, gate]
                results = fusion.defer(
                    entry, queued, (*scalars, *offsets), dev, [records[s] for s in entry.mutated_slots], fn
                )
            if results is None:  # strict, or a "cold" op in fused mode: it runs now
                if deferred:
                    inputs = [b.get() if type(b) is Pending else b for b in inputs]
                results = _execute(entry, inputs, scalars, offsets, records, gated)
        return results

    def _rng_args(self, args, kwargs, device):
        gen = kwargs.get("generator")
        if gen is None:
            gen = next((a for a in args if isinstance(a, torch.Generator)), None)
        if gen is None:
            return next_rng_args(device if device >= 0 else 0)
        if gen.device.type not in ("tpu", "cpu"):
            raise RuntimeError(f"aten::{self.name}: expected a 'tpu' (or 'cpu') generator, got {gen.device}")
        # a tpu generator advances like the default one; a CPU generator seeds this draw instead
        # (reproducible, and it advances the generator): eager/random.py
        return generator_rng_args(gen)

    def _flatten(self, a, parts, slot_of, bufs, scalars, offsets, device, is_scalar_arg, written=False):
        ta = type(a)
        if ta in _PLAIN and not (is_scalar_arg and ta in _SCALAR_TYPES):  # dtype=, layout=, None, flags
            # (a bool is keyed by type too: True == 1 and hash(True) == hash(1), but `b * True` and
            # `b * 1` have different result dtypes)
            parts.append(("V", a) if ta is not bool else ("V", bool, a))
            return device
        kind = arg_kind(a, is_scalar_arg)
        if kind is TENSOR:
            address = a.untyped_storage().data_ptr()
            return key_tensor(a, RECORDS[address], address, parts, slot_of, bufs, offsets, device, self.where)
        if kind is FOREIGN:
            return self._foreign_tensor(a, parts, scalars, device, written)
        if kind is SCALAR:
            scalars.append(a)
            # decomposed ops bake scalars into their graph, so their values must key the cache
            parts.append(("S", *scalar_key((a,))) if self.specialize_scalars else ("S", type(a)))
        elif kind is LIST:
            parts.append(("L", len(a)))
            for x in a:
                device = self._flatten(x, parts, slot_of, bufs, scalars, offsets, device, False)
        elif ta is list or ta is tuple:
            parts.append(("V", tuple(a)))
        elif isinstance(a, torch.device):
            parts.append(("V", a))
            if a.type == "tpu":
                index = current_device() if a.index is None else a.index
                if device >= 0 and index != device:
                    device_mismatch(self.where, device, index)
                device = index
        elif isinstance(a, torch.Generator):
            parts.append(("G",))
        elif ta is float or ta is complex:
            # a baked-in float (`eps=`): the key must tell apart what == does not (-0.0 and 0.0) and
            # match NaN (ints compare exactly; bools took the first branch)
            parts.append(("V", *scalar_key((a,))))
        else:
            parts.append(("V", a))
        return device

    def _foreign_tensor(self, a, parts, scalars, device, written=False):
        if a.device.type == "cpu" and a.dim() == 0 and not written:
            # CPU scalars may mix with device tensors, as on CUDA; they travel as traced scalars.
            scalars.append(a.item())
            parts.append(("C", a.dtype))
            return device
        if a.device.type == "tpu":
            raise TpuOpError(f"torchtpu: aten::{self.name} got a tpu tensor whose storage torchtpu does not know")
        if self.cpu_operands is not None and a.device.type == "cpu":
            raise _CpuOperand(a, device)
        device_mismatch(self.where, max(device, 0), a.device)

    def _with_cpu_operands_moved(self, a, device, args, kwargs):
        """The call again with the CPU tensors of the arguments the op's lowering declares
        `cpu_operands` (index_select's index) moved to its tpu device, as CUDA's advanced indexing
        moves a CPU index; `a`, a CPU tensor found in another argument, raises PyTorch's device error."""
        positions, names = self.cpu_operands
        movable = [args[i] for i in positions if i < len(args)] + [kwargs[n] for n in names if n in kwargs]
        target = next(
            (t.device for t in (*args, *kwargs.values()) if isinstance(t, _Tensor) and t.device.type == "tpu"), None
        )
        if target is None or not any(m is a for m in movable):
            device_mismatch(self.where, max(device, 0) if target is None else target.index, a.device)

        def moved(t):
            return t.to(target) if isinstance(t, _Tensor) and t.device.type == "cpu" else t

        args = tuple(moved(t) if i in positions else t for i, t in enumerate(args))
        kwargs = {k: moved(t) if k in names else t for k, t in kwargs.items()}
        return self(*args, **kwargs)

    def _returns(self, entry, results, dev, args, kwargs):
        """The op's returns: new tensors over the results, the aliased arguments, Nones, as nested
        as the schema says."""
        strides = entry.strides or (None,) * len(entry.outs)
        it = (
            new_tensor(shape, dtype, dev, buf, stride)
            for (shape, dtype), buf, stride in zip(entry.outs, results, strides)
        )
        if entry.spec is None:
            return next(it)
        values = []
        nones = iter(entry.nones) if entry.nones is not None else None
        for aliased, ret in zip(self.aliased_returns, entry.spec):
            if aliased:
                values.append(_aliased_arg(self.op._schema, ret, args, kwargs))
            else:
                mask = next(nones) if nones is not None else (False,) * ret.num_leaves
                values.append(pytree.tree_unflatten([None if m else next(it) for m in mask], ret))
        if len(values) == 1:
            return values[0]
        return tuple(values) if values else None

    # ---------------------------------------------------------------- cache miss
    def _build(self, key, args, kwargs, bufs, device):
        with self.lock:
            entry = self.cache.get(key)
            if entry is None:
                entry = build_entry(self, key, args, kwargs, bufs, device)
                self.cache[key] = entry
        return entry


def _schema_defaults(schema):
    """([(has a default, the default)] per positional argument, {name: default} of the keyword-only
    arguments: those without a default map to _REQUIRED)."""
    positional, kwarg_only = [], {}
    for a in schema.arguments:
        default = a.default_value if a.has_default_value() else _REQUIRED
        if a.kwarg_only:
            kwarg_only[a.name] = default
        else:
            positional.append((default is not _REQUIRED, default))
    return positional, kwarg_only


_REQUIRED = object()


def _is_default(value, default):
    """Whether `value` is the schema default of `default` (has one, the value), as the dispatcher
    compares them (IValue equality: the same kind of value, equal); a tensor never is."""
    has, d = default
    if not has:
        return False
    if d is None:
        return value is None
    return type(value) is type(d) and type(d) in _DEFAULT_TYPES and value == d


# the kinds of schema defaults compared (a Tensor, a Generator, a device never are defaults)
_DEFAULT_TYPES = frozenset({bool, int, float, str, list, complex})


def _always(*args, **kwargs):
    return True


def _raised_in_jax(error):
    """Whether `error`, raised while the lowering was traced, is JAX's (a jnp function refusing a
    dtype; JAX filters its own frames out of the traceback) rather than one of ours, which name
    torchtpu."""
    return not str(error).startswith("torchtpu")


def _as_torch_error(kernel, error, args, kwargs=None):
    """JAX's ValueError/TypeError as the error type PyTorch raises: a tensor past JAX's rank limit
    is a RuntimeError naming the limit, a dtype the op does not take NotImplementedError (a
    RuntimeError) named as the CPU names it ("gcd_cpu" not implemented for 'Float'), anything else a
    RuntimeError naming the op."""
    rank = errors.too_many_dims(f"aten::{kernel.name}", (args, tuple((kwargs or {}).values())))
    if rank is not None:
        return rank
    message = str(error)
    first = next((a for a in args if isinstance(a, _Tensor)), None)
    if first is not None and ("dtype" in message or "must be integer" in message):
        base = kernel.name.split(".")[0].rstrip("_")
        return NotImplementedError(f"\"{base}_tpu\" not implemented for '{scalar_type_name(first.dtype)}'")
    return TpuOpError(f"torchtpu: aten::{kernel.name}: {message}")


def _constant(entry, scalars):
    """The results of a small op without tensor inputs (a factory): they depend on the scalar values
    only, so the arrays of the last few values are kept and shared by the new storages (arrays are
    immutable; a write gives a storage a new buffer) instead of running the executable again."""
    ck = scalar_key(scalars)
    results = entry.consts.get(ck)
    if results is None:
        results = entry.fn(*scalars)
        entry.n_results = len(results)
        if entry.checks:  # a verdict per call: never kept
            entry.consts = None
        elif len(entry.consts) < CONSTANT_VALUES:
            entry.consts[ck] = results
    else:
        counters.eager_constants_reused += 1
    return results


def _memoized(entry, inputs, scalars, offsets):
    """Run a small deterministic op, or return the results of its call with the same input buffers
    and scalar values if it is among the last MEMO_VALUES (see MEMO_BYTES)."""
    return _memo(entry, (*map(id, inputs), *scalar_key((*scalars, *offsets))), inputs, (*inputs, *scalars, *offsets))


def memoizing(entry):
    """entry's executable as the C++ fast path calls it, (buffers..., numbers...), through the
    entry's memo, with the key _memoized makes (the fast path passes this function the numbers
    themselves, not kept device arrays: eager/fastpath.py describe)."""

    def call(*argv):
        if entry.memo is None:  # given up
            return entry.fn(*argv)
        n = 0
        for a in argv:  # the buffers come first, then the numbers (scalars, offsets)
            if type(a) is not ArrayImpl:
                break
            n += 1
        inputs = argv[:n]
        return _memo(entry, (*map(id, inputs), *scalar_key(argv[n:])), inputs, argv)

    return call


def _memo(entry, mkey, keep, argv):
    """entry.fn(*argv), or its kept results for the memo key `mkey` (`keep`: what keeps the ids in
    the key alive while the results are kept)."""
    memo = entry.memo
    hit = memo.get(mkey)
    if hit is not None:
        counters.eager_results_reused += 1
        entry.memo_misses = -1  # it repeats: keep the memo for good
        return hit[1]
    results = entry.fn(*argv)
    entry.n_results = len(results)
    if (
        entry.checks or entry.memo_misses >= MEMO_GIVE_UP
    ):  # a verdict per call (an index out of range must raise every time): never kept
        entry.memo = None
    else:
        if entry.memo_misses >= 0:
            entry.memo_misses += 1
        if len(memo) >= MEMO_VALUES:
            memo.pop(next(iter(memo)), None)
        memo[mkey] = (keep, results)  # `keep` holds the input buffers, and so their ids, alive
    return results


def _execute(entry, inputs, scalars, offsets, records, gated):
    """Run the executable now; the written storages get their new buffers even if an interrupt
    arrives as it returns (a donated input is gone: the record must not keep it)."""
    if entry.memo is not None:
        return _memoized(entry, inputs, scalars, offsets)
    fn = entry.fn
    slots = entry.mutated_slots
    if not slots:
        results = fn(*inputs, *scalars, *offsets)
        entry.n_results = len(results)
        return results
    gate = asserts.poison(records[slots[0]].device_index) if gated else None  # (None once all are checked)
    if gate is not None:
        # unchecked device-side asserts: the writes keep the old values unless all of them passed
        donating = entry.traced is not None and donatable(inputs, slots)
        fn = (entry.fn_gated_donating or _gated(entry, True)) if donating else (entry.fn_gated or _gated(entry))
        if donating:
            counters.eager_donations += 1
        try:
            results = call_and_commit(
                fn, (*inputs, gate, *scalars, *offsets), [records[s] for s in slots], len(entry.outs)
            )
        except BaseException:
            if not entry.gated_ran & (1 + donating):  # failed or interrupted while JAX traced it: a fresh jit
                if donating:
                    entry.fn_gated_donating = None
                else:
                    entry.fn_gated = None
            raise
        entry.gated_ran |= 1 + donating
        entry.n_results = len(results)
        return results
    donating = entry.traced is not None and donatable(inputs, slots)
    if donating:
        fn = entry.fn_donating or _donating(entry)
        counters.eager_donations += 1
    try:
        results = call_and_commit(fn, (*inputs, *scalars, *offsets), [records[s] for s in slots], len(entry.outs))
    except BaseException:
        if donating and not entry.donating_ran:
            entry.fn_donating = None  # failed or interrupted while JAX traced it: a fresh jit next time
        raise
    if donating:
        entry.donating_ran = True
    entry.n_results = len(results)
    return results


def write_gate(entry):
    """For the C++ fast path: gate(device index, queue=False) of an in-place entry's write while
    unchecked device-side verdicts exist: None when none of them can gate it there, else (entry's
    executable in its gated form, the gate: an argument after the buffers), as _execute calls them
    (`queue`: as the fused mode queues them, OpKernel._call)."""

    def gate(device_index, queue=False):
        value = asserts.poison(device_index, queue=queue)
        return None if value is None else (entry.fn_gated or _gated(entry), value)

    return gate


def _gated(entry, donating=False):
    """entry's executable in its gated form (eager/executable.py: traced_function), donating the
    written buffers or not; built on first use."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        fn = op_jit(
            entry,
            "fn_gated_donating" if donating else "fn_gated",
            traced_function(entry.source, gated=True),
            donate_argnums=tuple(entry.mutated_slots) if donating else (),
        )
    if donating:
        entry.fn_gated_donating = fn
    else:
        entry.fn_gated = fn
    return fn


def _donating(entry):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        traced = entry.traced
        # (a new function each time: JAX keys its trace cache on the function)
        entry.fn_donating = op_jit(
            entry, "fn_donating", lambda *dyn: traced(*dyn), donate_argnums=tuple(entry.mutated_slots)
        )
    return entry.fn_donating


def _aliased_name(schema, ret):
    if ret.alias_info is None:
        return None
    for a in schema.arguments:
        if a.alias_info is not None and a.alias_info.before_set == ret.alias_info.before_set:
            return a.name
    return None


def _aliased_arg(schema, name, args, kwargs):
    for i, a in enumerate(schema.arguments):
        if a.name == name:
            return kwargs[name] if a.kwarg_only or i >= len(args) else args[i]
    raise AssertionError(name)
