"""What the engine's stand-ins share: entries served through programs shared by many entries (a
random fill's size bucket: eager/bucketed_draws.py; an index write's padded length:
eager/bucketed_index.py; small strided operands made dense: eager/dense_operands.py; small
elementwise ops on flat arrays: eager/flat_buckets.py) until they tier up to their own program.

Each shared program is a `_Jitted` kept in its module's table under a key of what its trace reads
(shared_key), built from the entry's Program with another template (jit_shared); the template
helpers walk the (args, kwargs) templates of eager/executable.py.
"""

from __future__ import annotations

import torch

from . import op_store
from .executable import DynOffset, TensorArg, ValueArg, traced_function

TIER_UP = 8  # calls of one entry after which it builds its own one-program executable
_MAX_KEPT = 512  # shared programs kept per table, then forgotten like the engine's caches


class TieringStandIn:
    """An entry's function (`entry.<attr>`) served through shared programs (a size bucket's, a dense
    form's) until the entry has been called TIER_UP times; then the entry's own one-program
    executable (`jit` of `__wrapped__`, donating `donate` when set) serves its calls. The stand-in
    stays the entry's function throughout and keeps that executable (`own`): a fused segment holding
    the op (eager/fusion.py keys steps on the function) stays the same segment when strict-mode calls
    tier it up, and traces `__wrapped__` either way. `stored`: the entry's own program through the
    op-key cache (build._Stored), or None where it may not be stored: at the first call it is loaded
    when an earlier process stored it (no trace of the shared programs), and it is what tiers up (so
    stored for the next process). Subclasses call `_own_for(dyn)` first in `__call__`."""

    __slots__ = ("__weakref__", "__wrapped__", "attr", "calls", "entry", "jit", "name", "own", "stored", "xla")
    donate = None

    def _stand_in(self, entry, attr, name, op_jit, wrapped, stored=None):
        """Set the common fields; `stored`: an op_jit result (kept only where it is a _Stored)."""
        self.entry, self.attr, self.name, self.jit, self.__wrapped__ = entry, attr, name, op_jit, wrapped
        self.calls, self.own, self.xla = 0, None, entry.xla
        self.stored = stored if hasattr(stored, "load_stored") else None  # (no op-key cache: off, or the TPU check)

    def _own_for(self, dyn):
        """The entry's own executable where it serves this call (an earlier process stored it, or the
        entry has tiered up), else None: the stand-in's shared programs serve it."""
        calls = self.calls = self.calls + 1
        if calls == 1:
            stored = self.stored
            if stored is not None and stored.load_stored(dyn):  # (a warm process)
                self.own, self.calls = stored, self._tier_up()
                return stored
            return None
        if calls > self._tier_up():
            return self.own or self._own_program()
        return None

    def _tier_up(self) -> int:
        """The calls after which the entry builds its own program (TIER_UP, read when called: tests
        patch it; a subclass may wait longer)."""
        return TIER_UP

    def _own_program(self):
        """The entry's own one-program executable, kept in `own` (op_jit's first call may put its
        jitted function there: build._OptionsAtFirstCall)."""
        own = self.own
        if own is None:
            if self.stored is not None:
                own = self.own = self.stored
            elif self.donate:  # (a new function: JAX keys its trace cache on the function, as engine._donating)
                wrapped = self.__wrapped__
                own = self.own = self.jit(
                    self, "own", lambda *dyn: wrapped(*dyn), self.name, donate_argnums=self.donate
                )
            else:
                own = self.own = self.jit(self, "own", self.__wrapped__, self.name)
        return own


def shared_program(table: dict, key, xla):
    """(`_Jitted` of `table` for `key`, whether it is new: its `fn` still to build); (None, False) for a
    key holding an unhashable static argument. A full table is forgotten, like the engine's caches."""
    try:
        hash(key)
    except TypeError:
        return None, False
    shared = table.get(key)
    if shared is not None:
        return shared, False
    if len(table) >= _MAX_KEPT:
        table.clear()
    shared = table[key] = _Jitted(xla)
    return shared, True


class _Jitted:
    """A shared executable (`fn`, `fn_gated`) and what its trace found: the messages of its
    device-side checks. `xla`: the compiler options it is built with (build.op_jit reads them)."""

    __slots__ = ("checks", "fn", "fn_gated", "xla")

    def __init__(self, xla):
        self.checks, self.fn, self.fn_gated, self.xla = (), None, None, xla


def shared_key(kernel, entry, program, template, writes, shapes, *more):
    """The key of a shared program built from `program` with `template` and `writes` over buffers of
    `shapes`, and what else decides its trace (`more`)."""
    return (
        kernel.name,
        _frozen(template),
        tuple(writes),
        tuple(program.mutated_slots),
        tuple(tuple(s) for s in shapes),
        program.n_values,
        entry.xla and tuple(sorted(entry.xla.items())),
        torch.get_default_dtype(),
        *more,
    )


def jit_shared(shared, program, op_jit, label, *, store=None, gated=None, on_trace=None, wrap=None, **changes):
    """Build `shared.fn` (and `shared.fn_gated` where `gated`, by default for a program that writes)
    from `program` with `changes` (its template, writes, ...): its trace leaves the messages of its
    device-side checks in `shared.checks` (and tells `on_trace`). `wrap(function, gated)`: what jits
    instead of the traced function; `store`: the op-key cache's name of `shared.fn`
    (op_store.shared_name), or None."""

    def traced(messages, read_precision):
        shared.checks = messages
        if on_trace is not None:
            on_trace(messages, read_precision)

    source = program._replace(on_trace=traced, **changes)
    wrap = wrap or (lambda f, _gated: f)
    shared.fn = op_jit(shared, "fn", wrap(traced_function(source), False), label, store=store)
    if program.mutated_slots if gated is None else gated:
        shared.fn_gated = op_jit(shared, "fn_gated", wrap(traced_function(source, gated=True), True), label)


def bucket_stand_in(cls, table, key, kind, label, entry, program, fn, name, op_jit, store, **changes):
    """A new `cls` stand-in for `entry` whose calls run the shared program `table[key]` (built here from
    `program` with `changes` where new, named `label()` and stored as op_store.shared_name(store, entry,
    `kind`)), with the entry's own program through the op-key cache where `store` names it; None for a
    key holding an unhashable static argument (the entry keeps its one-program executable)."""
    shared, new = shared_program(table, key, entry.xla)
    if shared is None:
        return None
    if new:
        stored = op_store.shared_name(store, entry, kind)
        jit_shared(shared, program, op_jit, label(), store=stored, gated=False, **changes)
    c = cls()
    c._stand_in(entry, "fn", name, op_jit, fn, op_jit(entry, "fn", fn, name, store=store) if store else None)
    c.shared = shared
    return c


def kept_offsets(program, left_out):
    """(the traced storage offsets that the reads of slots not in `left_out` and the writes use, in
    order; `moved(layout)`: the layout with its traced offset renumbered among those)."""
    used = sorted(
        {
            lay[2].index
            for lay in [s.layout for s in _tensor_args(program.template) if s.slot not in left_out]
            + [w[1] for w in program.writes]
            if type(lay[2]) is DynOffset
        }
    )
    renumber = {old: new for new, old in enumerate(used)}

    def moved(layout):
        off = layout[2]
        return (
            layout
            if type(off) is not DynOffset
            else layout[:2] + (off._replace(index=renumber[off.index]),) + layout[3:]
        )

    return used, moved


# ---------------------------------------------------------------- templates
def copied(template):
    """(args, kwargs) of `template` with its lists copied (to be changed in place)."""
    args, kwargs = template
    return [_copy(a) for a in args], {k: _copy(v) for k, v in kwargs.items()}


def _tensor_args(spec, found=None):
    found = [] if found is None else found
    t = type(spec)
    if t is TensorArg:
        found.append(spec)
    elif t is list:
        for x in spec:
            _tensor_args(x, found)
    elif _is_args_kwargs(spec):
        _tensor_args(spec[0], found)
        for v in spec[1].values():
            _tensor_args(v, found)
    return found


def _copy(spec):
    return [_copy(x) for x in spec] if type(spec) is list else spec


def _map_specs(spec, f):
    t = type(spec)
    if t is TensorArg:
        return f(spec)
    if t is list:
        return [_map_specs(x, f) for x in spec]
    if t is tuple and spec and type(spec[0]) is list and type(spec[-1]) is dict:
        return (_map_specs(spec[0], f), {k: _map_specs(v, f) for k, v in spec[1].items()})
    return spec


def _frozen(spec):
    t = type(spec)
    if t is list:
        return ("[", *map(_frozen, spec))
    if _is_args_kwargs(spec):
        return ("(", _frozen(spec[0]), tuple((k, _frozen(v)) for k, v in sorted(spec[1].items())))
    if t is ValueArg:
        return (ValueArg, spec.dtype, _frozen(spec.static))
    if t is float:  # (-0.0 and 0.0 apart)
        return (float, spec.hex())
    return (t, spec)


def _is_args_kwargs(spec):
    return type(spec) is tuple and spec and type(spec[0]) is list and type(spec[-1]) is dict
