"""`torch.compile(model, backend="tpu")`: AOTAutograd's functional ATen graphs, one XLA executable each.

Dynamo captures the Python code into an FX graph; AOTAutograd functionalizes it, splits forward and
backward and applies PyTorch's core ATen decompositions to the ops that have no lowering. Each
resulting graph becomes a `CompiledGraph`: the graph is interpreted through the same lowering table
as eager mode (ops/graph.py) inside one `jax.jit` function, compiled once per input signature.

A call passes the inputs' flat storage buffers (views are read inside the executable, so a
transposed or sliced input costs no separate step), writes input mutations (`copy_` into graph
inputs: BatchNorm statistics, KV caches, optimizer state) back through the inputs' views in the same
executable and gives the storages their new buffers, and wraps the outputs as new tpu tensors. No
value crosses to the host. A call whose tensors are the previous call's, or lie on other storages
the same way (a decode step: the same weights and cache, new token ids), reuses its key after a
few C-level checks (compile/fast_key.py) instead of keying input by input.
"""

from __future__ import annotations

import functools
import logging
import operator
import threading
import time
import warnings
from itertools import repeat

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..device import host_pages, platform
from ..device.state import current_device
from ..eager import asserts, tpu_check, xla_options
from ..eager.build import META_CHECKS
from ..eager.entry import DONATE_BYTES, scalar_key
from ..eager.executable import (
    Program,
    TensorArg,
    ValueArg,
    call_and_commit,
    input_buffers,
    is_partial,
    key_tensor,
    stored_output,
    tensor_arg,
    traced_function,
)
from ..eager.fastpath import graph_functions
from ..eager.limits import note_executable
from ..eager.random import next_rng_args
from ..eager.xla_options import ACTIVE as _xla_active
from ..metrics import counters as _counters
from ..ops import dtypes as dt
from ..ops.graph import GraphProgram, node_op_name
from ..ops.linalg import matmul_precision
from ..ops.resolve import NotLowered
from ..storage.records import RECORDS, covers, donatable, is_dense, new_tensor
from . import graph_placers, options
from .fast_key import FAST_GIVE_UP, FastKey, picker
from .graph_facts import dense_order, fill_aliases, host_int_outputs, output_aliases, value_int_inputs, with_aliases
from .host_writes import plan_host_writes
from .recompiles import log_recompile

log = logging.getLogger("torchtpu.compile")
_Tensor = torch.Tensor
_graph_ids = iter(range(1, 1 << 62))
# seconds spent tracing graphs to StableHLO and compiling them with XLA (this process, cumulative)
TIMES = {"trace_s": 0.0, "xla_compile_s": 0.0}


def _check_arguments(graph):
    """The argument checks PyTorch's CPU kernels make and its meta kernels (which traced the graph) do
    not (eager/build.py META_CHECKS): bad input gets PyTorch's error, as in eager mode."""

    def meta(a):
        return a.meta.get("val")

    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            check = META_CHECKS.get(node_op_name(node.target))
            if check is not None:
                # nodes nested in lists too (cat's tensors): the checks see values, as in eager mode
                check(*torch.fx.node.map_arg(node.args, meta), **torch.fx.node.map_arg(node.kwargs, meta))


def _out_layout(val):
    """(shape, dtype, stride, order) PyTorch expects for a graph output, from its meta value."""
    if not isinstance(val, _Tensor):
        return None
    shape, stride = tuple(val.shape), tuple(val.stride())
    if not all(type(x) is int for x in shape + stride) or type(val.storage_offset()) is not int:
        return None  # symbolic (dynamic-shape graph): contiguous outputs
    order = dense_order(shape, stride) if val.storage_offset() == 0 else None
    if order is None or order == list(range(len(shape))):
        return (shape, val.dtype, None, None)
    return (shape, val.dtype, stride, tuple(order))


class Entry:
    __slots__ = (
        "array_positions",
        "checks",
        "cpu_mutations",
        "donate",
        "donated_slots",
        "fn",
        "fn_plain",
        "fused",
        "host_inputs",
        "host_writes",
        "make_outputs",
        "mutated_slots",
        "n_arrays",
        "n_cpu",
        "outs",
        "sample",
        "tensor_outs",
        "written",
        "xla",
    )

    def finish(self, outs_meta):
        """The per-call helpers, once the outputs are known: `written` picks the records the call
        writes; `tensor_outs` (shapes, dtypes, strides), when every output is a tensor the executable
        returns or an alias made on the host ("A", output_aliases), builds the returned ones in one
        C-level pass; `array_positions` says where they go when aliases sit between them."""
        self.outs = list(outs_meta)
        self.n_arrays = sum(o[0] == "T" for o in self.outs)
        slots = self.mutated_slots
        self.written = (lambda records: ()) if not slots else picker(slots)
        arrays = [o for o in self.outs if o[0] == "T"]
        if arrays and all(o[0] in "TA" for o in self.outs):
            self.tensor_outs = tuple(zip(*[o[1:] for o in arrays]))
        else:
            self.tensor_outs = None
        self.array_positions = [i for i, o in enumerate(self.outs) if o[0] == "T"]
        functions = graph_functions()
        self.make_outputs = functions[2] if functions is not None else _new_tensors


def _new_tensors(shapes, dtypes, strides, device, results):
    """The outputs over `results` (what the C++ library's graph_outputs does, one by one)."""
    return list(map(new_tensor, shapes, dtypes, repeat(device), results, strides))


class _Rekey(Exception):
    """The graph stopped tracing its int inputs: the call's key must be built again."""


class CompiledGraph:
    """One AOTAutograd graph; called with the real (boxed) inputs."""

    _boxed_call = True
    capture = False  # benchmarks: keep (executable, raw inputs) of the last call in `captured`
    fast_key = True  # key a call like the last one in a few C-level passes (FastKey); off: input by input
    alias_outputs = True  # outputs that are inputs or views of inputs/outputs made on the host (output_aliases)

    def __init__(self, gm: torch.fx.GraphModule, kind: str):
        # also on the instance: AOTAutograd wraps the backward in torch._dynamo.disable, whose
        # functools.wraps copies the instance's __dict__ only (without it: an unboxed call and a warning)
        self._boxed_call = True
        self.gm = gm
        self.kind = kind
        self.id = next(_graph_ids)
        self.where = f"compiled graph {self.id} ({kind})"  # names it in device-side assert messages
        _check_arguments(gm.graph)
        # a higher layer may take the graph over (distributed: functional collectives make it an
        # SPMD program over the process mesh; compile/__init__.py: register_graph_placer)
        self.placement = None
        for placer in graph_placers():
            self.placement = placer(gm)
            if self.placement is not None:
                break
        self.program = GraphProgram(gm.graph, gm)
        out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        outs = out_node.args[0]
        self.out_vals = [
            n.meta.get("val") if isinstance(n, torch.fx.Node) else n
            for n in (outs if isinstance(outs, (list, tuple)) else [outs])
        ]
        self.value_ints = value_int_inputs(gm.graph)
        self.host_ints = host_int_outputs(gm.graph, self.out_vals) if self.value_ints else {}
        self.alias_plan, self.alias_inputs = [], []
        if CompiledGraph.alias_outputs and self.placement is None:
            self.alias_plan, self.alias_inputs = output_aliases(
                gm.graph, self.program.mutated_placeholders, self.out_vals
            )
        self.aliased = frozenset(p[0] for p in self.alias_plan)
        self.written_inputs = frozenset(self.program.mutated_placeholders)
        self.cache = {}
        self.last_key = None
        self._fast = None  # FastKey of the last call (see there), or None
        self._fast_misses = 0  # calls keyed the slow way since the last fast hit
        self.lock = threading.RLock()
        _counters.compiled_graphs += 1

    # ------------------------------------------------------------------ hot path
    def __call__(self, *call_args):
        # boxed (one list, which we clear) or, when Dynamo's wrappers hide `_boxed_call`, unboxed
        args = call_args[0] if len(call_args) == 1 and type(call_args[0]) is list else list(call_args)
        fast = self._fast
        hit = fast.match(self, args) if fast is not None and len(args) == fast.n and self.fast_key else None
        if hit is not None:
            entry, records, dyn, cpu_vals, offsets = hit
            if dyn is None:
                dyn = _input_buffers(records)
            reshapes = fast.reshapes
            dev = fast.device
            _counters.compiled_cache_hits += 1
        else:
            key, records, cpu_vals, offsets, device, reshapes = self._key(args)
            entry = self.cache.get(key)
            if entry is None:
                try:
                    entry = self._build(key, args, records, device)
                except _Rekey:
                    key, records, cpu_vals, offsets, device, reshapes = self._key(args)
                    entry = self._build(key, args, records, device)
            else:
                _counters.compiled_cache_hits += 1
            dev = device if device >= 0 else current_device()
            self._remember(args, key, entry, records, offsets, dev, reshapes)
            offsets = [np.int64(o) for o in offsets]
            dyn = _input_buffers(records)
        if reshapes:  # inputs whose storage holds their elements in another shape (_key)
            for slot, shape in reshapes:
                dyn[slot] = dyn[slot].reshape(shape)
        # `dyn` holds the only extra reference to each buffer, so donation safety is a refcount check
        for c in cpu_vals:
            dyn.append(c if type(c) is int else _host_value(c, dev))
        if self.program.random:
            dyn.append(next_rng_args(dev))
        dyn.extend(offsets)
        fn = entry.fn
        if entry.donate and not donatable(dyn, entry.donated_slots):
            fn = entry.fn_plain or self._plain(entry)
        if CompiledGraph.capture and not entry.mutated_slots:
            self.captured = (fn, list(dyn))
            self.captured_inputs = list(args)
            _last_captured[0] = self
        host_ints = {i: f(args) for i, f in self.host_ints.items()} if self.value_ints else None
        bases = [args[i] for i in self.alias_inputs] if self.alias_plan else None
        if isinstance(args, list):
            args.clear()  # boxed calling convention: the caller's list no longer keeps inputs alive
        results = _call(fn, dyn, entry, records)
        if entry.checks:
            asserts.note(results[-1], entry.checks, self.where)
        if entry.cpu_mutations:  # a sync point: the host waits for these values
            _copy_to_host(entry, results, cpu_vals)
        if entry.host_writes is not None:
            entry.host_writes.apply({i: cpu_vals[pos] for i, pos in entry.host_inputs})
        if entry.tensor_outs is not None:
            made = entry.make_outputs(*entry.tensor_outs, dev, results)
            if bases is None:
                return made
            return with_aliases(made, entry.array_positions, len(entry.outs), self.alias_plan, bases)
        outputs = []
        it = iter(results[: entry.n_arrays])
        for o in entry.outs:
            if o[0] == "T":
                _, shape, dtype, stride = o
                outputs.append(new_tensor(shape, dtype, dev, next(it), stride=stride))
            elif o[0] == "H":
                outputs.append(host_ints[len(outputs)])
            elif o[0] == "A":
                outputs.append(None)  # filled below
            else:
                outputs.append(o[1])
        if bases is not None:
            fill_aliases(outputs, self.alias_plan, bases)
        return outputs

    def _remember(self, args, key, entry, records, offsets, device, reshapes):
        """Keep what keying this call found as the graph's fast key (FastKey), where the call fits
        one: every argument a tpu tensor with elements, on its own storage, or an int `value_ints`
        traces. A graph whose calls keep missing it stops building them (and trying them)."""
        if self._fast_misses > FAST_GIVE_UP or not self.fast_key:
            self._fast = None
            return
        self._fast_misses += 1
        self._fast = FastKey.of(args, key, entry, records, offsets, device, self.value_ints)
        if self._fast is not None:
            self._fast.reshapes = reshapes  # (its records keep their shapes: FastKey checks)

    def _key(self, args):
        """The cache key of a call (the same tensor keys as eager ops: executable.key_tensor), the
        storages' records, the CPU tensors, the traced offsets, the device and the (slot, shape) of each
        input whose storage's array must be reshaped for the executable.

        An input that is all of its storage (and not written) is passed as an array of its own shape,
        whatever the shape its storage's array has (`x.reshape(...)` of a copy, a view of a 0-d
        scalar): the key holds that shape, so such calls share one executable (_input_forms)."""
        parts = []
        reshapes = []
        written = self.written_inputs
        slot_of = {}
        records = []
        cpu_vals = []
        offsets = []  # non-zero storage offsets are traced: `unet(x, timesteps[i])` compiles once
        device = -1
        value_ints = self.value_ints
        for i, a in enumerate(args):
            if isinstance(a, _Tensor):
                # a storage address in RECORDS is a tpu storage (addresses are invented, never host
                # memory: storage/records.py); look there first, the device only for the others
                address = a.untyped_storage().data_ptr()
                r = RECORDS.get(address)
                if r is not None:
                    k, n = len(parts), len(records)
                    device = key_tensor(a, r, address, parts, slot_of, records, offsets, device, self.where)
                    if len(records) > n and i not in written and covers(a, r):
                        shape = tuple(a.shape)
                        parts[k] = parts[k][:6] + (shape,)
                        if shape != r.shape:
                            reshapes.append((n, shape))
                elif a.device.type == "tpu":
                    raise RuntimeError("torchtpu: compiled graph got a tpu tensor whose storage torchtpu does not know")
                else:
                    cpu_vals.append(a)
                    parts.append(("C", a.dtype, tuple(a.shape)))
            elif i in value_ints:
                cpu_vals.append(int(a))  # traced: its value is not part of the key
                parts.append(("I",))
            elif isinstance(a, (bool, int, float)) or a is None:
                parts.append(("S", *scalar_key((a,))))  # exact: -0.0 and 0.0 apart, NaN matching NaN
            elif isinstance(a, torch.SymInt):
                parts.append(("S", int, int(a)))
            else:
                parts.append(("V", repr(a)))
        parts.append(("P", matmul_precision()))  # the lowerings of matmuls read it
        if _xla_active[0]:  # XLA compiler options (eager/xla_options.py)
            parts.append(("X", _xla_active[0]))
        return tuple(parts), records, cpu_vals, offsets, device, reshapes

    # ------------------------------------------------------------------ cache miss
    def _build(self, key, args, records, device):
        with self.lock:
            entry = self.cache.get(key)
            if entry is not None:
                return entry
            if self.cache and options.recompile_logging_enabled():
                log_recompile(self, self.last_key, key)
            t0 = time.perf_counter()
            entry = self._trace(key, args, records, device)
            self.cache[key] = entry
            self.last_key = key
            self.last_entry = entry
            _counters.compiled_xla_compiles += 1
            log.debug("torchtpu compile: graph %d (%s) built in %.3fs", self.id, self.kind, time.perf_counter() - t0)
            return entry

    def _trace(self, key, args, records, device):
        try:
            return self._trace_with(key, args, records, device, self.value_ints)
        except Exception:
            if not self.value_ints:
                raise
            # an op needs one of those ints as a Python value (a concretization error, usually):
            # bake them all in from now on, the key then holding their values
            log.debug("torchtpu compile: graph %d needs its int inputs static", self.id, exc_info=True)
            self.value_ints = frozenset()
            self._fast = None
            raise _Rekey() from None

    def _trace_with(self, key, args, records, device, value_ints):
        """The entry for this call form: the graph traced into one function over the storages'
        buffers (_traced), compiled for the call's device (_compile, or the graph's placement)."""
        entry, traced, outs_meta, n_off = self._traced(args, records, value_ints)
        dev = device if device >= 0 else current_device()
        sharding = jax.sharding.SingleDeviceSharding(platform.jax_device(dev))
        entry.sample = _sample(args, records, sharding, self.program.random, n_off, value_ints, self.written_inputs)
        if self.placement is not None:
            return self._placed(entry, traced, outs_meta)
        jitted, plain = self._compile(entry, traced, sharding, records)
        tpu_check.check(jitted, entry.sample, self.where)
        entry.fn_plain = plain if entry.donate else entry.fn
        entry.finish(outs_meta)
        return entry

    def _traced(self, args, records, value_ints):
        """A new entry, the traced function of the graph as eager/executable.py builds it (read each
        input's view from its storage, run the graph, write the mutated inputs back), the outputs'
        metadata (filled while it traces) and the number of traced offsets."""
        program = self.program
        template, n_cpu, n_off = _template(args, records, value_ints)
        nb = len(records)
        # which buffers the graph writes: its mutated placeholders, through their views
        written = [i for i in program.mutated_placeholders if type(template[i]) is TensorArg]
        mutated_slots = sorted({template[i].slot for i in written})
        # CPU inputs the graph writes (the optimizer's `step` counters): new values go back by copy_
        cpu_mutations = [i for i in program.mutated_placeholders if type(template[i]) is ValueArg]
        cpu_tensors = {i for i, a in enumerate(args) if type(template[i]) is ValueArg and isinstance(a, _Tensor)}
        host_writes = plan_host_writes(program.graph, cpu_tensors) if cpu_mutations else None
        if host_writes is not None:  # computed on the host instead: no device-to-host read (host_writes.py)
            cpu_mutations = [i for i in cpu_mutations if i not in host_writes.written]
        outs_meta = []  # filled while tracing

        aliased = self.aliased

        def run(inputs, key):
            outputs, mutations = program.run(inputs, key)
            outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
            if aliased:  # made on the host as views (output_aliases): not returned, so not copied
                outputs = [None if i in aliased else v for i, v in enumerate(outputs)]
            return outputs, [mutations[i] for i in written], [jnp.asarray(mutations[i]) for i in cpu_mutations]

        entry = Entry()
        entry.checks = ()
        traced = traced_function(
            Program(
                n_buffers=nb,
                n_values=n_cpu,
                random=program.random,
                n_offsets=n_off,
                template=template,
                run=run,
                outputs=_output_caster(
                    [_out_layout(v) for v in self.out_vals],
                    outs_meta,
                    self.host_ints if value_ints else {},
                    self.aliased,
                ),
                writes=[tuple(template[i]) for i in written],
                mutated_slots=mutated_slots,
                on_trace=lambda messages, _: setattr(entry, "checks", messages),
            )
        )
        entry.mutated_slots = mutated_slots
        # the large written storages (a KV cache) are updated in place, as eager in-place ops do
        # (entry.DONATE_BYTES); a small one (a cache's position counter), often shared with a kept
        # memo result, must not keep the others from being donated
        entry.donated_slots = tuple(s for s in mutated_slots if records[s].nbytes >= DONATE_BYTES)
        entry.donate = bool(entry.donated_slots) and options.donation_enabled()
        entry.n_cpu = n_cpu
        cpu_index = [i for i, v in enumerate(template) if type(v) is ValueArg]
        entry.cpu_mutations = [cpu_index.index(i) for i in cpu_mutations]
        entry.host_writes = host_writes
        entry.host_inputs = [(i, pos) for pos, i in enumerate(cpu_index) if i in cpu_tensors]
        entry.fused = traced
        return entry, traced, outs_meta, n_off

    def _compile(self, entry, traced, sharding, records):
        """Trace and compile `traced` now (the output metadata is known, and compile time lands
        here), donating the large written buffers unless XLA would copy them; (the jitted function,
        the executable without donation or None)."""
        nb = len(records)
        jitted = jax.jit(
            traced,
            donate_argnums=entry.donated_slots if entry.donate else (),
            out_shardings=sharding if nb == 0 else None,
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            t0 = time.perf_counter()
            lowered = jitted.lower(*entry.sample)
            t1 = time.perf_counter()
            options._maybe_dump(self, lowered)
            entry.xla = xla_options.graph_options(xla_options.jax_options())  # the user's part keyed in _key
            host_pages.give_back_heap()  # (tracing's garbage: the compile's transient is not added to it)
            entry.fn = lowered.compile(entry.xla)
            del lowered
            host_pages.give_back_heap()
            t2 = time.perf_counter()
            plain = None
            donated_nbytes = [records[s].nbytes for s in entry.donated_slots]
            if entry.donate and _copies_donations(entry.fn, donated_nbytes):
                # XLA may copy the donated buffers instead of updating them in place (a fusion still
                # reads an old value after the in-place write: an optimizer step recomputes its new
                # moments from the old ones inside the parameter's update). The copies live in a
                # temporary allocated, and page-faulted afresh, at every call: compiled AdamW of a
                # 20M-parameter model had 175 MB of it, 43k page faults and a 3.5x slower step than
                # without donating. The same executable without donation tells whether the temporary
                # is the donation's (a bf16 decode step's is attention's float32 copy of its KV cache,
                # there either way: that one keeps donating, and updates its cache in place).
                plain_jitted = jax.jit(traced, out_shardings=sharding if nb == 0 else None)
                plain = plain_jitted.lower(*entry.sample).compile(entry.xla)
                _counters.compiled_xla_compiles += 1
                if _donation_adds_temporary(entry.fn, plain, donated_nbytes):
                    log.debug("torchtpu compile: graph %d copies its donated buffers: not donating", self.id)
                    entry.donate = False
                    entry.fn, jitted = plain, plain_jitted
                t2 = time.perf_counter()
        TIMES["trace_s"] += t1 - t0
        TIMES["xla_compile_s"] += t2 - t1
        note_executable()
        return jitted, plain

    def _placed(self, entry, traced, outs_meta):
        """The executable as the graph's placement compiles it (no donation: its buffers are this
        process's shards of global arrays)."""
        entry.donate = False
        entry.xla = xla_options.graph_options(xla_options.jax_options())  # the user's part keyed in _key
        t0 = time.perf_counter()
        entry.fn, lowered = self.placement.compile(traced, entry.sample, entry.xla, self.where)
        options._maybe_dump(self, lowered)
        TIMES["xla_compile_s"] += time.perf_counter() - t0
        entry.fn_plain = entry.fn
        entry.finish(outs_meta)
        return entry

    def _plain(self, entry):
        """The same executable without donation, for calls whose buffers are shared elsewhere."""
        entry.fn_plain = jax.jit(entry.fused).lower(*entry.sample).compile(entry.xla)
        _counters.compiled_xla_compiles += 1
        return entry.fn_plain


_last_captured = [None]


# glibc serves an allocation this large or larger with a fresh mapping (its largest mmap threshold on 64-bit):
# a temporary of that size is page-faulted afresh at every call; smaller ones are reused from the heap
_FRESH_MAPPING_BYTES = 32 << 20


def _copies_donations(compiled, donated_nbytes):
    """True when the executable needs a large temporary (one page-faulted at every call) as large as a
    quarter of what it was given to update in place: XLA copies the donated buffers rather than writing
    them in place, and the copies cost more than not donating (a fresh output reuses freed memory)."""
    try:
        temp = compiled.memory_analysis().temp_size_in_bytes
    except Exception:  # noqa: BLE001 - a backend without memory analysis: keep the donation
        return False
    return temp >= _FRESH_MAPPING_BYTES and temp * 4 >= sum(donated_nbytes)


def _donation_adds_temporary(donating, plain, donated_nbytes):
    """True when the donating executable's temporary exceeds the plain one's by a quarter of what it was
    given to update in place or more (the copies of the donated buffers); True too when either has no
    memory analysis (the first check saw a large temporary: as before, no donation)."""
    try:
        added = donating.memory_analysis().temp_size_in_bytes - plain.memory_analysis().temp_size_in_bytes
    except Exception:  # noqa: BLE001 - a backend without memory analysis: the first check decides
        return True
    return added * 4 >= sum(donated_nbytes)


_get_buffer = operator.attrgetter("_buffer")
try:
    from jax._src.array import ArrayImpl as _ArrayImpl

    _ARRAYS = frozenset({_ArrayImpl})  # the concrete type of jax arrays
except ImportError:  # pragma: no cover (another jax layout: input_buffers every time)
    _ARRAYS = frozenset()


def _input_buffers(records):
    """executable.input_buffers in C-level passes when every record holds a plain array (no storage
    never written, no queued result of the fused mode): the same list."""
    dyn = list(map(_get_buffer, records))
    if set(map(type, dyn)) <= _ARRAYS:
        return dyn
    return input_buffers(records)


def last_captured():
    """The CompiledGraph whose call was captured last (with `CompiledGraph.capture = True`)."""
    return _last_captured[0]


def _template(args, records, value_ints):
    """The executable's argument specs, one per graph input (eager/executable.py), the number of
    traced values (CPU tensors and `value_ints`) and of traced offsets."""
    template = []
    n_cpu = n_off = 0
    for i, a in enumerate(args):
        if isinstance(a, _Tensor) and a.device.type == "tpu":
            r = RECORDS[a.untyped_storage().data_ptr()]
            dyn = None
            if is_partial(a, r):
                dyn, n_off = n_off, n_off + 1
            template.append(tensor_arg(a, records.index(r), r, dyn))
        elif isinstance(a, _Tensor) or i in value_ints:
            template.append(ValueArg())
            n_cpu += 1
        else:
            template.append(int(a) if isinstance(a, torch.SymInt) else a)
    return template, n_cpu, n_off


def _input_forms(args, records, written):
    """The shape each storage's array is passed in (CompiledGraph._key): the shape of the first
    input on it where that input is all of it and not written, else the storage's own."""
    forms = [None] * len(records)
    slot_of = {id(r): s for s, r in enumerate(records)}
    for i, a in enumerate(args):
        if isinstance(a, _Tensor) and a.device.type == "tpu":
            r = RECORDS[a.untyped_storage().data_ptr()]
            s = slot_of[id(r)]
            if forms[s] is None:
                forms[s] = tuple(a.shape) if i not in written and covers(a, r) else r.shape
    return forms


def _sample(args, records, sharding, random, n_off, value_ints, written=frozenset()):
    """Abstract arguments to lower the executable with, in its calling order."""
    forms = _input_forms(args, records, written)
    sample = [jax.ShapeDtypeStruct(f, dt.storage_jax(r.dtype), sharding=sharding) for f, r in zip(forms, records)]
    for i, a in enumerate(args):
        if isinstance(a, _Tensor) and a.device.type != "tpu":
            sample.append(jax.ShapeDtypeStruct(tuple(a.shape), dt.to_jax(a.dtype), sharding=sharding))
        elif i in value_ints:  # a Python int: weakly typed, as JAX takes it
            sample.append(jax.ShapeDtypeStruct((), np.int64, weak_type=True))
    if random:
        sample.append(jax.ShapeDtypeStruct((3,), np.uint32))
    sample.extend(jax.ShapeDtypeStruct((), np.int64) for _ in range(n_off))
    return sample


def _output_caster(layouts, outs_meta, host_ints, aliased=frozenset()):
    """Outputs in the memory order PyTorch expects (a transposed output stays transposed); fills
    `outs_meta` with ("T", shape, dtype, stride), ("V", value), ("H",) (an int the host computes:
    `host_ints`) or ("A",) (a view the host makes: `aliased`) per graph output while tracing."""

    def cast(outputs):
        flat = []
        outs_meta.clear()
        for i, v in enumerate(outputs):
            if i in host_ints:
                outs_meta.append(("H",))
                continue
            if i in aliased:
                outs_meta.append(("A",))
                continue
            if not (hasattr(v, "shape") and hasattr(v, "dtype")) or isinstance(v, (int, float, bool)):
                outs_meta.append(("V", v))
                continue
            lay = layouts[i] if i < len(layouts) else None
            tdtype = lay[1] if lay is not None else dt.to_torch(jnp.asarray(v).dtype)
            shape = tuple(v.shape)
            # (a dense layout keeps the output's shape: size-1 dimensions' strides do not move elements)
            strided = lay is not None and lay[2] is not None and lay[0] == shape and not is_dense(shape, lay[2])
            flat.append(stored_output(v, dt.element(tdtype), order=lay[3] if strided else None))
            outs_meta.append(("T", shape, tdtype, lay[2] if strided else None))
        return flat

    return cast


def _call(fn, dyn, entry, records):
    """Run the executable; the written storages get their new buffers in the same C-level step
    (eager/executable.py: call_and_commit), so an interrupt cannot leave donated buffers behind."""
    try:
        return call_and_commit(fn, dyn, entry.written(records), entry.n_arrays)
    finally:
        del dyn[:]


def _copy_to_host(entry, results, cpu_vals):
    base = entry.n_arrays + len(entry.mutated_slots)
    for j, value in zip(entry.cpu_mutations, results[base:]):
        c = cpu_vals[j]
        host = np.asarray(value)
        _counters.d2h_bytes += host.nbytes
        _counters.d2h_transfers += 1
        c.copy_(dt.cpu_from_numpy(host.reshape(tuple(c.shape)), c.dtype))


def _host_value(t, dev):
    if t.dtype == torch.complex32:  # a graph computes complex32 as complex64 (ops/dtypes.py TO_JAX)
        t = t.to(torch.complex64)
    host = dt.numpy_from_cpu(t.detach().contiguous())
    _counters.h2d_bytes += host.nbytes
    _counters.h2d_transfers += 1
    return platform.put(host, dev)


# ------------------------------------------------------------------ the Dynamo backend
def _compiler(kind):
    def compile_graph(gm, example_inputs):
        options._ensure_persistent_cache()
        try:
            return CompiledGraph(gm, kind)
        except NotLowered as e:
            if "data-dependent" in str(e):
                raise
            if not options.eager_fallback_enabled():
                raise
            warnings.warn(f"torchtpu: graph {kind} runs in eager mode on the device: {e}", stacklevel=2)
            return _eager_graph(gm)

    compile_graph.__name__ = f"torchtpu_{kind}_compiler"
    return compile_graph


def _eager_graph(gm):
    def run(args):
        a = list(args)
        args.clear()
        out = gm(*a)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    run._boxed_call = True
    return run


@functools.lru_cache(maxsize=1)
def decompositions():
    from ..ops.decompose import decomposition_table_for_lowering

    return decomposition_table_for_lowering()


def tpu_backend(gm, example_inputs, **kwargs):
    """The Dynamo backend "tpu": AOTAutograd + one XLA executable per graph and input signature."""
    from torch._dynamo.backends.common import aot_autograd

    backend = aot_autograd(
        fw_compiler=_compiler("forward"),
        bw_compiler=_compiler("backward"),
        inference_compiler=_compiler("inference"),
        decompositions=decompositions(),
        keep_inference_input_mutations=True,
    )
    return backend(gm, example_inputs, **kwargs)


def register():
    """Register "tpu" with Dynamo now (see compile/__init__.py for the lazy hooks)."""
    from . import register as _register

    _register()
