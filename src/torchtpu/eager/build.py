"""Cache misses of the eager engine: find the JAX function for an op and trace it with its views."""

from __future__ import annotations

import math
import re
import warnings
import zlib

import jax
import torch
from torch.utils import _pytree as pytree

from ..device import platform
from ..metrics import counters
from ..ops import checks
from ..ops import dtypes as dt
from ..ops.argument_checks import deterministic_alerts_off, warn_at_caller
from ..ops.resolve import functional_twin, resolve
from ..ops.table import LOWERINGS, declared_facts
from ..storage.records import RECORDS, contiguous_strides, is_dense, memory_order
from . import (
    bucketed_draws,
    bucketed_index,
    dense_operands,
    fastpath,
    flat_buckets,
    fusion,
    interrupts,
    matmul_buckets,
    op_store,
    overlap,
    reduction_buckets,
    set_buckets,
    tpu_check,
    xla_options,
)
from .entry import (
    CONSTANT_BYTES,
    DONATE_BYTES,
    FOREIGN,
    LIST,
    MEMO_BYTES,
    SCALAR,
    TENSOR,
    Entry,
    NeedsResize,
    SpecializeScalars,
    arg_kind,
)
from .executable import Program, ValueArg, count_values, is_partial, stored_output, tensor_arg, traced_function
from .persistent_cache import ensure_persistent_cache

# meta functions used instead of PyTorch's, and argument checks PyTorch's meta kernels do not make,
# run on the meta arguments before an op is built: declared with the ops' lowerings (`meta=`,
# `meta_check=`); Dynamo's fake tensors use the same (eager/kernels.py _register_fake_overrides)
META_OVERRIDES = declared_facts("meta")
META_CHECKS = declared_facts("meta_check")
OUTPUT_LAYOUTS = declared_facts("output_layout")


def _walk(kernel, args, kwargs, on_tensor, on_scalar, on_cpu_scalar, on_other):
    """Map the arguments as the engine keyed them (entry.arg_kind: the one classification)."""

    def one(a, is_scalar_arg):
        kind = arg_kind(a, is_scalar_arg)
        if kind is TENSOR:
            return on_tensor(a)
        if kind is FOREIGN:  # (the engine let through only CPU scalars)
            return on_cpu_scalar(a)
        if kind is SCALAR:
            return on_scalar(a)
        if kind is LIST:
            return [one(x, False) for x in a]
        return on_other(a)

    new_args = [one(a, i in kernel.scalar_pos) for i, a in enumerate(args)]
    new_kwargs = {k: one(a, k in kernel.scalar_names) for k, a in kwargs.items()}
    return new_args, new_kwargs


def _meta_other(o):
    if isinstance(o, torch.device):
        return torch.device("meta")
    return None if isinstance(o, torch.Generator) else o


def _meta_cpu_scalar(c):
    # a CPU 0-dim tensor mixes with tpu tensors as a scalar, as on CUDA (`masked_fill(m, torch.tensor(2.))`,
    # `index_fill(0, i, torch.tensor(1.))`): PyTorch's meta kernels would see two devices
    return torch.empty((), dtype=c.dtype, device="meta")


def _record(t):
    return RECORDS[t.untyped_storage().data_ptr()]


_cache_ready = [False]


def build_entry(kernel, key, args, kwargs, records, device):
    """The cache entry of one call signature: PyTorch's meta answer, then the executable."""
    if not _cache_ready[0]:  # the on-disk XLA cache serves eager executables too
        ensure_persistent_cache()
        # at the first tpu executable, not at `import torch`: a process that never uses the device
        # keeps its own sys.unraisablehook
        interrupts.install()
        _cache_ready[0] = True
    slot_of = {id(r): i for i, r in enumerate(records)}
    dyn_offset = _dynamic_offsets(kernel, args, kwargs)
    # PyTorch's overlapping-write errors: an elementwise op (a TensorIterator) checks before anything
    # else (`x[:-1] <<= x[1:]` of floats: the overlap error, not the dtype one), the others after
    early = overlap.checks_first(kernel)
    guard = overlap.guard(kernel, args, kwargs, dyn_offset) if early else None
    compute, meta_out = _meta_call(kernel, args, kwargs)
    entry = Entry()
    note_build(kernel, entry)
    entry.default_dtype = torch.get_default_dtype()  # (what the meta call and the trace see)
    entry.overlap = guard if early else overlap.guard(kernel, args, kwargs, dyn_offset)
    entry.anchor = zlib.crc32(repr((kernel.name, key)).encode()) % fusion.ANCHOR_EVERY == 0
    outs = _returns_of(kernel, entry, meta_out, _layout_rule(kernel, args, kwargs))
    writes = _writes(kernel, compute, args, kwargs, slot_of, dyn_offset)
    entry.mutated_slots = sorted({slot for slot, _, _ in writes})

    # The executable must not hold on to this call's tensors (their storages would never be
    # freed): it closes over a template of slots, layouts and static values only.
    def tensor_slot(t):
        r = _record(t)
        return tensor_arg(t, slot_of[id(r)], r, dyn_offset.get(id(t)), along=True)

    specialize = kernel.specialize_scalars
    template = _walk(
        kernel,
        args,
        kwargs,
        tensor_slot,
        lambda s: ValueArg(static=s) if specialize else ValueArg(),
        lambda c: ValueArg(dt.to_jax(c.dtype)),
        lambda o: dt.to_jax(o) if isinstance(o, torch.dtype) else o,
    )
    n_values = count_values(template)
    program = Program(
        n_buffers=len(records),
        n_values=n_values,
        random=kernel.random,
        n_offsets=len(dyn_offset),
        template=template,
        run=_runner(kernel, entry, compute, len(outs), len(writes)),
        outputs=_output_caster(kernel, outs, entry.strides),
        writes=writes,
        mutated_slots=entry.mutated_slots,
        on_trace=lambda messages, read_precision: _traced(kernel, entry, messages, read_precision),
    )
    _choose_reuse(kernel, entry, records, outs, writes)
    fn = traced_function(program)
    entry.xla = xla_options.jax_options()  # the engine keyed this entry on them (OpKernel.__call__)
    name = f"{kernel.op._schema.name.split('::')[0]}::{kernel.name}"  # (a custom op's own namespace)
    if not records:
        index = device if device >= 0 else 0
        sharding = jax.sharding.SingleDeviceSharding(platform.jax_device(index))
        if _storable(kernel):
            entry.store = (kernel, (name, key))
        entry.fn = op_jit(entry, "fn", fn, name, out_shardings=sharding)
    else:
        # a random fill of a new shape draws through a shared executable per size bucket
        bucketed = bucketed_draws.fill(kernel, entry, program, fn, records, name, op_jit)
        # an indexed write through an index of a new length pads it to a size bucket
        bucketed = bucketed or bucketed_index.build(kernel, entry, program, fn, records, args, kwargs, name, op_jit)
        # a small elementwise op of a new shape runs on flat arrays padded to a size bucket (XLA:CPU)
        # (the op-key cache's name for the op's own program: the stand-ins below load it where an earlier
        # process stored it, and name the shared programs they build after it)
        store = (kernel, (name, key)) if not writes and _storable(kernel) else None
        caster = lambda o: _output_caster(kernel, o, None)
        bucketed = bucketed or flat_buckets.build(kernel, entry, program, fn, records, name, op_jit, caster, store)
        # a membership test of new shapes runs on both operands padded to size buckets (XLA:CPU)
        bucketed = bucketed or set_buckets.build(kernel, entry, program, fn, records, name, op_jit, caster, store)
        # a reduction or scan of a new length runs on its operand padded with the identity (XLA:CPU)
        bucketed = bucketed or reduction_buckets.build(
            kernel, entry, program, fn, records, args, kwargs, name, op_jit, caster, store
        )
        # a small matrix product of a new shape runs on operands zero-padded to size buckets (XLA:CPU)
        bucketed = bucketed or matmul_buckets.build(kernel, entry, program, fn, records, name, op_jit, caster, store)
        # small strided operands are made dense by a copy per layout, the op's program shared across layouts
        on_trace = lambda m, rp: _traced(kernel, entry, m, rp)
        bucketed = bucketed or dense_operands.build(kernel, entry, program, fn, records, name, op_jit, on_trace, store)
        # (not an op that writes: its executable is called by call_and_commit, where no Python code may
        # run between the call and the records taking its results, and _Stored is Python)
        if not bucketed and store is not None:
            entry.store = store
        entry.fn = bucketed or op_jit(entry, "fn", fn, name)
        if entry.mutated_slots:
            entry.source = program  # (its gated form: engine._gated)
        if any(records[s].nbytes >= DONATE_BYTES for s in entry.mutated_slots):
            entry.traced = fn
    return entry


def note_build(kernel, entry):
    """The fused mode's clock at a build: `entry` is fresh (eager/fusion.py FRESH_SYNCS) when its
    kernel also built an executable in an earlier sync window not long before."""
    now = fusion._syncs[0]
    before, last = kernel.build_windows
    if last != now:
        before, last = kernel.build_windows = (last, now)
    entry.fresh = before is not None and now - before <= fusion.FRESH_SYNCS


def op_jit(entry, attr, fn, name=None, store=None, **jit_kwargs):
    """`jax.jit(fn)` for `entry.<attr>`, compiled with the options eager/xla_options.py's op_options
    picks from what the op computes (known at its first call); the user's options (entry.xla) alone
    where the platform has no defaults. It keeps the arguments it does not read (`keep_unused`): JAX
    would prune a fill's unread target, and with no committed array left its results were uncommitted,
    another argument mapping for every later op, which then compiled again. An entry the op-key cache
    may keep (`entry.store`, or `store`: op_store.shared_name) gets a _Stored instead, unless the TPU
    compile check must see the program."""
    jit_kwargs.setdefault("keep_unused", True)
    store = store or getattr(entry, "store", None)
    if store is not None and not tpu_check.enabled() and op_store.directory() is not None:
        return _Stored(entry, attr, fn, store, jit_kwargs)
    if xla_options.op_options(entry.xla) == entry.xla:
        run = jax.jit(fn, compiler_options=entry.xla, **jit_kwargs)
    else:
        run = _OptionsAtFirstCall(entry, attr, fn, jit_kwargs)
    if tpu_check.enabled():  # (_OptionsAtFirstCall's first call then puts its jitted function in the wrapper)
        return tpu_check.wrap(run, fn, name or getattr(entry.fn, "check_name", "an eager op"), **jit_kwargs)
    return run


def _options_jit(entry, fn, jit_kwargs, dyn):
    """(jax.jit of `fn` under the compiler options op_options picks for it, its trace for `dyn`).
    Traced under the options of a program without a reduction (most ops), whose call reuses the
    trace (JAX keeps it); one that reduces is traced again under its own. (Traced under the user's
    options and jitted again, every op was traced twice: 2-4 ms each.)"""
    user = entry.xla
    guess = xla_options.op_options(user)
    jitted = jax.jit(fn, compiler_options=guess, **jit_kwargs)
    traced = jitted.trace(*dyn)
    chosen = xla_options.op_options(user, traced.jaxpr)
    if chosen != guess:
        jitted = jax.jit(fn, compiler_options=chosen, **jit_kwargs)
        traced = jitted.trace(*dyn)
    return jitted, traced


class _Stored:
    """An eager executable the op-key cache (eager/op_store.py) may serve: its first call looks the
    program up by a key made before any trace and loads it, or traces, compiles it afresh and stores
    it. Later calls go straight to the executable; a call with other argument types or devices than
    the first (which JAX's jit would compile again) moves it to JAX's jit for good. `__wrapped__`:
    what a fused segment traces (eager/fusion.py _nestable). `store`: (kernel, identity) of the
    entry's own program, or (kernel, identity, owner) of a shared program (op_store.shared_name) held by
    `entry` (its `fn`, `checks`, `xla`): the trace's effects are the owner's, the entry that built it."""

    __slots__ = ("__weakref__", "__wrapped__", "attr", "call", "entry", "jit_kwargs", "owner", "signature", "store")

    def __init__(self, entry, attr, fn, store, jit_kwargs):
        self.entry, self.attr, self.store, self.jit_kwargs = entry, attr, store[:2], jit_kwargs
        self.owner = store[2] if len(store) > 2 else entry
        self.__wrapped__ = fn
        self.call = self.signature = None

    def __call__(self, *dyn):
        call = self.call
        if call is None:
            return self._first(dyn)
        try:
            return call(*dyn)
        except (TypeError, ValueError):
            # JAX's refusal of arguments the executable was not compiled for (another device)
            if self.call is not call:  # another thread replaced the call meanwhile: use its
                return self(*dyn)
            if self.signature is None or _signature_or_none(dyn) == self.signature:
                raise
        # (the jit is published whole, then the signature dropped: a thread whose call of the old
        # executable fails meanwhile sees a new call and retries, never a signature of None)
        jitted = _options_jit(self.entry, self.__wrapped__, self.jit_kwargs, dyn)[0]
        self.call = jitted
        self.signature = None
        return jitted(*dyn)

    def _key(self, dyn):
        _, ident = self.store
        jit_kwargs = self.jit_kwargs
        shown = {k: jit_kwargs[k] for k in sorted(jit_kwargs)}
        return op_store.key((*ident, self.attr, shown, self.entry.xla, self.owner.default_dtype), dyn)

    def load_stored(self, dyn) -> bool:
        """Whether the op-key cache holds this executable for `dyn`: then it is loaded (no trace) and
        serves the next calls; else nothing is traced or compiled here."""
        if self.call is not None:
            return True
        k = self._key(dyn)
        loaded = op_store.load(k) if k is not None else None
        if loaded is None:
            return False
        self._loaded(*loaded)
        self.signature, self.call = k[2], _cpp_call_after_first(self, loaded[0])
        return True

    def _loaded(self, compiled, effects):
        _apply_effects(self.store[0], self.owner, effects)
        self.entry.checks = effects["checks"]  # (a shared program's holder: the owner's checks are its)
        counters.op_store_hits += 1

    def _first(self, dyn):
        kernel, _ = self.store
        jit_kwargs = self.jit_kwargs
        k = self._key(dyn)
        loaded = op_store.load(k) if k is not None else None
        if loaded is not None:
            compiled = loaded[0]
            self._loaded(*loaded)
        else:
            jitted, traced = _options_jit(self.entry, self.__wrapped__, jit_kwargs, dyn)
            if k is None or not op_store.BYPASS_INSTALLED[0]:
                self.call = jitted
                return jitted(*dyn)
            with op_store.fresh_compile():  # (op_store's docstring: why not from JAX's cache)
                compiled = traced.lower().compile()
            op_store.save(k, compiled, _effects(kernel, self.entry, self.owner))
        self.signature = k[2]
        self.call = compiled
        results = compiled(*dyn)
        self.call = getattr(compiled, "_call", None) or compiled  # (its C++ call, made at the first)
        return results


def _cpp_call_after_first(stored, compiled):
    """A loaded executable (a jax.stages.Compiled) as `stored.call`: its first call makes its C++
    call, which then replaces it (calling the Compiled goes through its Python `__call__`: one more
    frame, ~1 µs, on every eager call of an executable the op store served), as `_first` does."""

    def first(*dyn):
        results = compiled(*dyn)
        if stored.call is first:
            stored.call = getattr(compiled, "_call", None) or compiled
        return results

    return first


def _signature_or_none(dyn):
    try:
        return op_store.signature(dyn)
    except op_store.Unkeyable:
        return None


def _effects(kernel, entry, owner):
    """What tracing the op left behind (eager/executable.py Program.on_trace, _runner), for a process
    that loads the program without tracing it: the checks the program `entry` holds states, what the
    trace told the entry that built it (`owner`, the same but for a shared program)."""
    return {
        "checks": tuple(entry.checks),
        "recoverable": tuple(m for m in entry.checks if m in checks.RECOVERABLE),
        "follows_default_dtype": bool(owner.follows_default_dtype),
        "precision_sensitive": bool(kernel.precision_sensitive),
    }


def _apply_effects(kernel, entry, effects):
    entry.checks = effects["checks"]
    checks.RECOVERABLE.update(effects["recoverable"])
    if effects["follows_default_dtype"]:
        entry.follows_default_dtype = True
    if effects["precision_sensitive"]:
        kernel.precision_sensitive = True


_STORED_NAMESPACES = ("aten", "prims")
_own_lowerings = [-1, False]  # (how many lowerings were registered, whether all are torchtpu's)


def _storable(kernel):
    """Whether the op-key cache may keep `kernel`'s executables: an ATen (or prims) op while every
    registered lowering is torchtpu's own or JAX's (their sources and versions key the store; a user's do not)."""
    if kernel.op._schema.name.split("::")[0] not in _STORED_NAMESPACES:
        return False
    if _own_lowerings[0] != len(LOWERINGS):
        own = all(getattr(low.fn, "__module__", "").startswith(("torchtpu.", "jax.")) for low in LOWERINGS.values())
        _own_lowerings[:] = [len(LOWERINGS), own]
    return _own_lowerings[1]


class _OptionsAtFirstCall:
    """An op's executable until its first call, which traces the op, picks the compiler options from
    its jaxpr, and puts the jitted function in `entry.<attr>` (the later calls go straight to it).
    `__wrapped__`: what a fused segment traces (eager/fusion.py _nestable)."""

    __slots__ = ("__wrapped__", "attr", "entry", "jit_kwargs", "jitted")

    def __init__(self, entry, attr, fn, jit_kwargs):
        self.entry, self.attr, self.jit_kwargs, self.jitted = entry, attr, jit_kwargs, None
        self.__wrapped__ = fn

    def __call__(self, *dyn):
        jitted = self.jitted
        if jitted is None:
            jitted = self.jitted = _options_jit(self.entry, self.__wrapped__, self.jit_kwargs, dyn)[0]
            current = getattr(self.entry, self.attr)
            if getattr(current, "run", None) is self:  # the TPU compile check's wrapper: it keeps checking
                current.run = jitted
            else:
                setattr(self.entry, self.attr, jitted)
        return jitted(*dyn)


def follows_default_dtype(kernel, entry, args, kwargs):
    """Whether `entry`, built under another default dtype, computes otherwise under the current one:
    its trace read the setting (ops/dtypes.py: default_dtype, promote), the op runs a traced PyTorch
    decomposition (which may read it anywhere), or PyTorch's meta kernel now gives other result
    dtypes (`int / int`, `scalar_tensor(1)`, factories without dtype=) or raises."""
    if entry.follows_default_dtype or kernel.specialize_scalars:
        return True
    try:
        _, meta_out = _meta_call(kernel, args, kwargs)
    except Exception:  # noqa: BLE001 - (a build under this default dtype raises it again)
        return True
    schema = kernel.op._schema
    rets = meta_out if len(schema.returns) != 1 else (meta_out,)
    dtypes = [
        m.dtype
        for alias_name, value in zip(kernel.aliased_returns, rets if schema.returns else ())
        if alias_name is None
        for m in pytree.tree_leaves(value)
        if m is not None
    ]
    return dtypes != [dtype for _, dtype in entry.outs]


def _traced(kernel, entry, messages, read_precision):
    entry.checks = messages
    if read_precision:  # from now on the setting keys this op's executables (the C++ fast path's
        kernel.precision_sensitive = True  # keys always hold it)


def _dynamic_offsets(kernel, args, kwargs):
    """id(tensor) -> index of its traced offset: the engine passes the storage offsets of partial
    views as traced values, in argument order."""
    dyn_offset = {}

    def count(t):
        if is_partial(t, _record(t)) and id(t) not in dyn_offset:
            dyn_offset[id(t)] = len(dyn_offset)

    _walk(kernel, args, kwargs, count, lambda s: s, lambda c: c, lambda o: o)
    return dyn_offset


def _meta_call(kernel, args, kwargs):
    """PyTorch's own answer for shapes, dtypes and errors: run the op on meta tensors. Returns the
    JAX computation and the meta result."""
    bases = {}

    def meta_tensor(t):
        r = _record(t)
        base = bases.get(id(r))
        if base is None:
            base = bases[id(r)] = torch.empty(r.numel, dtype=r.dtype, device="meta")
        src = base if t.dtype == r.dtype else base.view(t.dtype)
        return src.as_strided(t.shape, t.stride(), t.storage_offset())

    meta_args, meta_kwargs = _walk(kernel, args, kwargs, meta_tensor, lambda s: s, _meta_cpu_scalar, _meta_other)
    with deterministic_alerts_off():  # (the meta kernels' CUDA alerts; the tpu's are host checks)
        compute = resolve(kernel.op, meta_args, meta_kwargs)  # first: an op we cannot lower fails here
    if getattr(compute, "specialize_scalars", False) and not kernel.specialize_scalars:
        kernel.specialize_scalars = True
        kernel.cache.clear()
        fastpath.clear()
        raise SpecializeScalars()
    originals = [
        (m, tuple(m.shape)) for m in pytree.tree_leaves((meta_args, meta_kwargs)) if isinstance(m, torch.Tensor)
    ]
    meta_check = META_CHECKS.get(kernel.name)
    if meta_check is not None:
        meta_check(*meta_args, **meta_kwargs)
    try:
        with deterministic_alerts_off(), warnings.catch_warnings(record=True) as meta_warnings:
            warnings.simplefilter("always")
            meta_out = META_OVERRIDES.get(kernel.name, kernel.op)(*meta_args, **meta_kwargs)
    except (RuntimeError, AssertionError) as e:
        raise _as_cpu_error(_as_cpu_cast_error(e), kernel, meta_args, meta_kwargs) from None
    finally:
        warned_resize = _pass_on(meta_warnings)
    resized = [(m, shape) for m, shape in originals if tuple(m.shape) != shape]
    if resized:
        _check_inplace_not_resized(kernel, meta_args, resized)
        if warned_resize:
            _warn_resized(resized)
        _raise_resize(kernel, args, kwargs, meta_args, meta_kwargs, resized)
    return compute, meta_out


_RESIZE_WARNING = "An output with one or more elements was resized"


def _pass_on(caught):
    """The meta kernel's warnings, but its out= resize warning (said by _warn_resized): whether it gave one."""
    resize = False
    for w in caught:
        if str(w.message).startswith(_RESIZE_WARNING):
            resize = True
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return resize


def _warn_resized(resized):
    """The CPU's warning for each non-empty out= tensor of another shape, one per tensor and in its words
    (PyTorch's Python meta kernels print their message unformatted, "... output shape {str(shape)}", so
    Python's default filter showed one for two outputs)."""
    for m, shape in resized:
        if math.prod(shape) != 0:
            warn_at_caller(
                f"{_RESIZE_WARNING} since it had shape {_shape_words(shape)}, which does not match the "
                f"required output shape {_shape_words(m.shape)}. This behavior is deprecated, and in a future "
                f"PyTorch release outputs will not be resized unless they have zero elements. You can "
                f"explicitly reuse an out tensor t by resizing it, inplace, to zero elements with t.resize_(0)."
            )


_META_CAST = re.compile(r"Attempting to cast from torch\.(\w+) to out tensor with dtype torch\.(\w+), but")
_META_INPLACE_BROADCAST = re.compile(
    r"output with shape torch\.Size\((\[.*?\])\) doesn't match the broadcast shape \((.*)\)"
)
# in-place ops whose `self` changes shape by design
_RESHAPING_INPLACE = ("resize_", "resize_as_", "set_", "_resize_output_")


def _shape_words(shape):
    return "[" + ", ".join(str(n) for n in shape) + "]"


def _inplace_broadcast_error(self_shape, broadcast_shape):
    """The CPU's (TensorIterator's) error for an in-place op whose other operands broadcast beyond `self`."""
    self_words, broadcast_words = _shape_words(self_shape), _shape_words(broadcast_shape)
    return RuntimeError(f"output with shape {self_words} doesn't match the broadcast shape {broadcast_words}")


def _check_inplace_not_resized(kernel, meta_args, resized):
    """An in-place op never resizes `self` (some of PyTorch's meta kernels do, e.g. pow_ and atan2_
    with a larger `other`): the CPU raises instead."""
    if not meta_args or kernel.name.split(".")[0] in _RESHAPING_INPLACE:
        return
    writes_self = any(i == 0 and name == "self" for i, name, _ in kernel.mutable)
    for m, shape in resized:
        if writes_self and m is meta_args[0]:
            raise _inplace_broadcast_error(shape, tuple(m.shape))


def _as_cpu_cast_error(e):
    """The CPU's (and CUDA's) words for an `out=` tensor the result cannot be cast to, or an in-place
    op's operands that broadcast beyond `self`, where PyTorch's meta kernels word them otherwise; any
    other error as it is."""
    m = _META_INPLACE_BROADCAST.search(str(e))
    if m is not None:
        self_shape = [int(n) for n in m.group(1).strip("[]").split(",") if n.strip()]
        broadcast = [int(n) for n in m.group(2).split(",") if n.strip()]
        return _inplace_broadcast_error(self_shape, broadcast)
    m = _META_CAST.search(str(e))
    if m is None:
        return e
    src, dst = (dt.scalar_type_name(getattr(torch, name)) for name in m.groups())
    return RuntimeError(f"result type {src} can't be cast to the desired output type {dst}")


_LOW_RANK_MATRIX = re.compile(r"(.+): The input tensor must have at least 2 dimensions, got \d+")


def _as_cpu_error(e, kernel, args, kwargs):
    """The CPU's words for a repeated reduction dim ("dim 0 appears multiple times in the list of
    dims": its dim bitset names the first repeat, wrapped), where PyTorch's meta kernels say "duplicate
    value in the list of dims"), and the CPU's RuntimeError for a linear-algebra input of fewer than 2
    dims, where PyTorch's meta kernels (squareCheckInputs) raise an AssertionError; any other error as
    it is."""
    if isinstance(e, AssertionError):
        low_rank = _LOW_RANK_MATRIX.fullmatch(str(e))
        return RuntimeError(f"{low_rank[1]}: The input tensor A must have at least 2 dimensions.") if low_rank else e
    if str(e).startswith("Attempting to broadcast a dimension of length"):
        return _broadcast_error(e, args)
    if str(e) != "duplicate value in the list of dims":
        return e
    named = dict(zip((a.name for a in kernel.op._schema.arguments), args)) | kwargs
    dims, tensor = named.get("dim"), next((a for a in args if isinstance(a, torch.Tensor)), None)
    if not isinstance(dims, (list, tuple)) or tensor is None:
        return e
    seen = set()
    for d in dims:
        wrapped = d % max(tensor.dim(), 1)
        if wrapped in seen:
            return RuntimeError(f"dim {wrapped} appears multiple times in the list of dims")
        seen.add(wrapped)
    return e


def _broadcast_error(e, args):
    """The CPU's words for operands that do not broadcast (TensorIterator folds their shapes in order and
    names the first pair that differs, "tensor a" being the shape so far), where PyTorch's reference
    kernels say "Attempting to broadcast a dimension of length ..."."""
    shape = ()
    for t in (a for a in args if isinstance(a, torch.Tensor)):
        ndim = max(len(shape), t.dim())
        a, b = (1,) * (ndim - len(shape)) + tuple(shape), (1,) * (ndim - t.dim()) + tuple(t.shape)
        for i in reversed(range(ndim)):
            if a[i] != b[i] and a[i] != 1 and b[i] != 1:
                return RuntimeError(
                    f"The size of tensor a ({a[i]}) must match the size of tensor b ({b[i]}) at non-singleton "
                    f"dimension {i}"
                )
        shape = tuple(y if x == 1 else x for x, y in zip(a, b))
    return e


def _returns_of(kernel, entry, meta_out, layout):
    """Which returns are new tensors, and how they nest; fills entry.outs/spec/nones."""
    schema = kernel.op._schema
    rets = meta_out if len(schema.returns) != 1 else (meta_out,)
    outs, spec, nones, strides = [], [], [], []
    for alias_name, value in zip(kernel.aliased_returns, rets if schema.returns else ()):
        if alias_name is not None:
            spec.append(alias_name)
        else:
            leaves, s = pytree.tree_flatten(value)
            # undefined outputs (None: a backward's output_mask False) stay None, on both sides
            outs.extend((tuple(m.shape), m.dtype) for m in leaves if m is not None)
            strides.extend(_kept_strides(m, layout) for m in leaves if m is not None)
            nones.append(tuple(m is None for m in leaves))
            spec.append(s)
    entry.outs = outs
    entry.strides = tuple(strides) if any(st is not None for st in strides) else None
    entry.nones = tuple(nones) if any(any(n) for n in nones) else None
    # None: the op returns exactly one new tensor (the fast path)
    entry.spec = (
        None
        if (
            len(spec) == 1
            and not isinstance(spec[0], str)
            and spec[0].num_leaves == 1
            and spec[0].is_leaf()
            and len(schema.returns) == 1
        )
        else spec
    )
    return outs


def _layout_rule(kernel, args, kwargs):
    """How the CPU lays out the op's new outputs: "meta" (as PyTorch's meta kernel says) unless the
    lowering declares otherwise (`output_layout`, ops/table.py)."""
    rule = OUTPUT_LAYOUTS.get(kernel.name, "meta")
    return rule(*args, **kwargs) if callable(rule) else rule


_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _kept_strides(m, layout):
    """The strides of a new output that PyTorch does not lay out contiguously, as its meta kernel
    gives them, else None (contiguous). TensorIterator gives an elementwise op's output the memory
    order of its inputs (a permuted or channels_last input, a broadcast with one), and PyTorch's meta
    kernels compute the same strides; a layout that is not a permutation of a dense one is not kept.
    With layout "memory_format" only a channels_last layout is kept."""
    shape, stride = tuple(m.shape), m.stride()
    if list(stride) == contiguous_strides(shape) or not m.numel():
        return None
    if layout == "memory_format":
        channels_last = _CHANNELS_LAST.get(m.dim())
        return tuple(stride) if channels_last and m.is_contiguous(memory_format=channels_last) else None
    order = memory_order(shape, stride)
    if not is_dense(tuple(shape[d] for d in order), tuple(stride[d] for d in order)):
        return None
    return tuple(stride)


def _writes(kernel, compute, args, kwargs, slot_of, dyn_offset):
    """(slot, layout, bits) of each tensor the op writes, in schema order, then the lowering's extra
    mutations."""
    targets = [
        (kwargs.get(name) if (kwarg_only or i >= len(args)) else args[i]) for i, name, kwarg_only in kernel.mutable
    ]
    targets += [kwargs.get(name) if i >= len(args) else args[i] for i, name in getattr(compute, "extra_mutations", ())]
    writes = []
    for value in targets:
        for t in value if isinstance(value, (list, tuple)) else [value]:
            if t is not None:
                r = _record(t)
                writes.append(tuple(tensor_arg(t, slot_of[id(r)], r, dyn_offset.get(id(t)), along=True)))
    return writes


def _runner(kernel, entry, compute, n_out, n_writes):
    def run(arguments, key):
        a, k = arguments
        if key is not None:
            k["key"] = key
        reads = dt.DEFAULT_DTYPE_READS[0]
        result = compute(a, k)
        if dt.DEFAULT_DTYPE_READS[0] != reads:  # the computation follows torch's default dtype
            entry.follows_default_dtype = True
        leaves = [v for v in pytree.tree_leaves(result) if v is not None]
        if len(leaves) != n_out + n_writes:
            raise AssertionError(
                f"torchtpu: lowering of aten::{kernel.name} returned {len(leaves)} "
                f"values, expected {n_out} outputs + {n_writes} mutations"
            )
        return leaves[:n_out], leaves[n_out:], ()

    return run


def _output_caster(kernel, outs, strides):
    dtypes = [dt.element(dtype) for _, dtype in outs]
    orders = [None] * len(outs)
    if strides is not None:  # (the order storage_shape gives the output's storage)
        orders = [memory_order(shape, st) if st is not None else None for (shape, _), st in zip(outs, strides)]
    where = f"aten::{kernel.name}"

    def cast(values):
        return [
            stored_output(v, d, shape, order, where=where)
            for v, (shape, _), d, order in zip(values, outs, dtypes, orders)
        ]

    return cast


def _choose_reuse(kernel, entry, records, outs, writes):
    """Small ops without tensor inputs keep their results per scalar value (Entry.consts), other
    small deterministic ones their last results per input buffers (Entry.memo)."""
    if kernel.random or writes:
        return
    out_bytes = sum(math.prod(shape) * dtype.itemsize for shape, dtype in outs)
    if not records and out_bytes <= CONSTANT_BYTES:
        entry.consts = {}
    elif records and out_bytes + sum(r.nbytes for r in records) <= MEMO_BYTES:
        entry.memo = {}


def _raise_resize(kernel, args, kwargs, meta_args, meta_kwargs, resized):
    by_meta = {id(m): shape for m, shape in resized}
    strides = _iterator_strides(kernel, meta_args, meta_kwargs)
    pairs = []

    def collect(real, meta):
        if isinstance(real, torch.Tensor) and id(meta) in by_meta:
            pairs.append((real, tuple(meta.shape), strides.get(id(meta))))
        elif isinstance(real, (list, tuple)) and isinstance(meta, (list, tuple)):
            for r, m in zip(real, meta):
                collect(r, m)

    for r, m in zip(args, meta_args):
        collect(r, m)
    for k in kwargs:
        collect(kwargs[k], meta_kwargs[k])
    if overlap.elementwise(kernel.op):
        _check_read_write_not_resized(kernel, args, kwargs, pairs)
    overlap.check_before_resize(kernel, [real for real, _, _ in pairs])
    # the CPU checks a written tensor against its inputs before resizing it too (`kthvalue(t, k,
    # out=(t, i))`: resized first, t itself would change and the op compute on a resized input)
    overlap.guard(kernel, args, kwargs, {})
    raise NeedsResize(pairs)


def _check_read_write_not_resized(kernel, args, kwargs, pairs):
    """TensorIterator resizes no out= tensor that is also an input (`add(a, b, out=a)` with `a` of
    fewer elements than the broadcast): the CPU raises, where tpu resized `a` and computed."""
    written = {name for _, name, _ in kernel.mutable}
    names = [a.name for a in kernel.op._schema.arguments]
    inputs = [a for i, a in enumerate(args) if i >= len(names) or names[i] not in written]
    inputs += [a for k, a in kwargs.items() if k not in written]
    for real, shape, _ in pairs:
        if any(real is a for a in inputs):
            raise RuntimeError(f"output with shape {list(real.shape)} doesn't match the broadcast shape {list(shape)}")


def _iterator_strides(kernel, meta_args, meta_kwargs):
    """{id(meta out=): strides} for an elementwise op: TensorIterator lays out an out= tensor it
    resizes as the functional op's result (`exp(x.permute(1, 0, 2), out=empty(0))` is permuted too),
    where PyTorch's meta kernels leave it contiguous."""
    twin = functional_twin(kernel.op) if overlap.elementwise(kernel.op) else None
    if twin is None or not twin[1]:
        return {}
    op, outs, order = twin
    if order is not None:
        return {}
    inputs = {k: v for k, v in meta_kwargs.items() if k not in outs}
    with deterministic_alerts_off():
        result = op(*meta_args, **inputs)
    results = result if isinstance(result, (tuple, list)) else (result,)
    return {id(meta_kwargs[name]): r.stride() for name, r in zip(outs, results) if name in meta_kwargs}
