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
few C-level checks (_FastKey) instead of keying input by input.
"""

from __future__ import annotations

import functools
import logging
import operator
import sys
import threading
import time
import warnings
from itertools import compress, repeat
from operator import ne

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch._C._dynamo.guards import TensorGuards

from ..device import platform
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
from ..eager.random import next_rng_args
from ..eager.xla_options import ACTIVE as _xla_active
from ..metrics import counters as _counters
from ..ops import dtypes as dt
from ..ops.graph import GraphProgram, node_op_name
from ..ops.linalg import matmul_precision
from ..ops.resolve import NotLowered
from ..storage.records import RECORDS, covers, donatable, is_dense, new_tensor
from . import graph_placers, options

log = logging.getLogger("torchtpu.compile")
_Tensor = torch.Tensor
_graph_ids = iter(range(1, 1 << 62))
# seconds spent tracing graphs to StableHLO and compiling them with XLA (this process, cumulative)
TIMES = {"trace_s": 0.0, "xla_compile_s": 0.0}


def _check_arguments(graph):
    """The argument checks PyTorch's CPU kernels make and its meta kernels (which traced the graph) do
    not (eager/build.py META_CHECKS): bad input gets PyTorch's error, as in eager mode."""

    def meta(a):
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

    for node in graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            check = META_CHECKS.get(node_op_name(node.target))
            if check is not None:
                check(*[meta(a) for a in node.args], **{k: meta(v) for k, v in node.kwargs.items()})


def _dense_order(shape, stride):
    """Dims from outermost to innermost if (shape, stride) is a dense, non-overlapping layout."""
    dims = sorted(range(len(shape)), key=lambda d: (-stride[d], -d))
    expected = 1
    for d in reversed(dims):
        if shape[d] != 1 and stride[d] != expected:
            return None
        expected *= shape[d]
    return dims


def _out_layout(val):
    """(shape, dtype, stride, order) PyTorch expects for a graph output, from its meta value."""
    if not isinstance(val, _Tensor):
        return None
    shape, stride = tuple(val.shape), tuple(val.stride())
    if not all(type(x) is int for x in shape + stride) or type(val.storage_offset()) is not int:
        return None  # symbolic (dynamic-shape graph): contiguous outputs
    order = _dense_order(shape, stride) if val.storage_offset() == 0 else None
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
        returns or an alias made on the host ("A", _output_aliases), builds the returned ones in one
        C-level pass; `array_positions` says where they go when aliases sit between them."""
        self.outs = list(outs_meta)
        self.n_arrays = sum(o[0] == "T" for o in self.outs)
        slots = self.mutated_slots
        self.written = (lambda records: ()) if not slots else _picker(slots)
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


def _host_int_outputs(graph, out_vals):
    """For each graph output that is a symbolic int (`cache.cumulative_length_int += 1` returns its
    new value): a function of the call's arguments computing it on the host from the graph's own
    int arithmetic, so the value comes back without a device round trip. {output index: fn}."""
    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    outs = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    ph_index = {n: i for i, n in enumerate(n for n in graph.nodes if n.op == "placeholder")}
    found = {}
    for i, (node, val) in enumerate(zip(outs, out_vals)):
        if isinstance(val, torch.SymInt) and isinstance(node, torch.fx.Node):
            fn = _host_int_fn(node, ph_index)
            if fn is not None:
                found[i] = fn
    return found


def _host_int_fn(node, ph_index):
    """`args -> int` evaluating `node` from int placeholders and Python arithmetic, or None."""
    if node.op == "placeholder":
        i = ph_index[node]
        return lambda args: args[i]
    val = node.meta.get("val")
    if type(val) is int:
        return lambda args: val
    target = node.target
    if (
        node.op != "call_function"
        or node.kwargs
        or not (
            getattr(target, "__module__", "") in ("_operator", "operator", "math", "builtins")
            or target in (torch.sym_max, torch.sym_min, torch.sym_not)
        )
    ):
        return None
    parts = []
    for a in node.args:
        if isinstance(a, torch.fx.Node):
            f = _host_int_fn(a, ph_index)
            if f is None:
                return None
            parts.append(f)
        elif type(a) in (int, bool):
            parts.append(lambda args, a=a: a)
        else:
            return None
    return lambda args: target(*[f(args) for f in parts])


class _Rekey(Exception):
    """The graph stopped tracing its int inputs: the call's key must be built again."""


def _free_symbols(value):
    """The shape symbols a graph value's sizes, strides and offset use (empty when all are ints)."""
    found = set()
    if isinstance(value, (list, tuple)):
        for v in value:
            found |= _free_symbols(v)
    elif isinstance(value, _Tensor):
        for x in (*value.shape, *value.stride(), value.storage_offset()):
            if isinstance(x, torch.SymInt):
                found |= x.node.expr.free_symbols
    return found


def _value_int_inputs(graph):
    """Placeholders holding a symbolic int that no tensor's shape depends on (a cache position, an
    offset Dynamo was told to keep dynamic): they travel as traced scalars, so a new value reuses
    the executable instead of compiling one per value. Ints a shape depends on stay baked in."""
    in_shapes = set()
    for node in graph.nodes:
        in_shapes |= _free_symbols(node.meta.get("val"))
    found = set()
    for i, node in enumerate(n for n in graph.nodes if n.op == "placeholder"):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol and val.node.expr not in in_shapes:
            found.add(i)
    return frozenset(found)


_ALIAS_ONLY = frozenset({torch.ops.aten._unsafe_view.default})  # not views by schema; views on the device


def _view_step(node):
    """(op, other args, kwargs) if `node` is a view op (by schema, or `_unsafe_view`) of its first argument
    whose other arguments are plain values (no graph values, no symbolic sizes), else None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    if not (target.is_view or target in _ALIAS_ONLY) or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None

    def plain(a):
        if isinstance(a, (list, tuple)):
            return all(plain(x) for x in a)
        return not isinstance(a, (torch.fx.Node, torch.SymInt, torch.SymFloat, torch.SymBool))

    rest = tuple(node.args[1:])
    if not plain(rest) or not plain(tuple(node.kwargs.values())):
        return None
    return target, rest, dict(node.kwargs)


def _dense_at_zero(val):
    """True when the backend returns the output `val` with exactly its meta strides (_out_layout)."""
    if not isinstance(val, _Tensor):
        return False
    shape, stride = tuple(val.shape), tuple(val.stride())
    return (
        all(type(x) is int for x in shape + stride)
        and val.storage_offset() == 0
        and _dense_order(shape, stride) is not None
    )


def _output_aliases(graph, mutated, out_vals):
    """Graph outputs that are a graph input or another output, directly or through view ops: a training
    forward returns every weight it saves for the backward (`primals_5`, `t(primals_5)`) and outputs
    twice (`detach(rsqrt)` beside `rsqrt`, a cache tensor returned and saved). Returned by the executable,
    each is a copy XLA makes per call (the forward of a 4-layer Llama copied 79 buffers, every weight);
    made on the host as views of the input or of the other output, they cost a few microseconds each.

    Returns (plan, input positions): the plan lists (output position, "in" or "out", index, view steps)
    in an order where an output another one views comes first; "in" indexes the input positions."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    ph_index = {n: i for i, n in enumerate(placeholders)}
    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    outs = out_node.args[0] if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    mutated = set(mutated)

    def to_input(node):
        """(placeholder index, view steps from it) if `node` is an unmutated tpu input or a view of one."""
        steps = []
        while node.op != "placeholder":
            step = _view_step(node)
            if step is None:
                return None
            steps.append(step)
            node = node.args[0]
        val = node.meta.get("val")
        if ph_index[node] in mutated or not isinstance(val, _Tensor) or val.device.type != "tpu":
            return None
        return ph_index[node], steps[::-1]

    found = {}
    first = {}  # node -> position of the output the executable returns for it
    for pos, node in enumerate(outs):
        if not isinstance(node, torch.fx.Node) or not isinstance(out_vals[pos], _Tensor):
            continue
        src = to_input(node)
        if src is not None:
            found[pos] = ("in", src[0], src[1])
        elif node in first:
            found[pos] = ("out", first[node], [])
        else:
            first[node] = pos
    for pos, node in enumerate(outs):  # views of returned outputs
        if pos in found or not isinstance(node, torch.fx.Node) or first.get(node) != pos:
            continue
        steps, cur = [], node
        while True:
            step = _view_step(cur)
            if step is None:
                break
            steps.append(step)
            cur = cur.args[0]
            base = first.get(cur)
            if base is not None and base not in found and _dense_at_zero(out_vals[base]):
                found[pos] = ("out", base, steps[::-1])
                break
    inputs = sorted({src for kind, src, _ in found.values() if kind == "in"})
    plan = [
        (pos, kind, inputs.index(src) if kind == "in" else src, steps)
        for pos, (kind, src, steps) in sorted(found.items())
    ]
    # an output viewing another output: a base an alias points at is never an alias itself (above)
    return plan, inputs


def _with_aliases(made, positions, n_outs, plan, bases):
    """All outputs: the executable's (`made`, at `positions`) and the aliases of the plan."""
    outs = [None] * n_outs
    for p, t in zip(positions, made):
        outs[p] = t
    return _fill_aliases(outs, plan, bases)


def _fill_aliases(outs, plan, bases):
    """Fill the plan's positions of `outs` with views of the inputs `bases` or of other outputs."""
    alias = torch.ops.aten.alias.default
    for pos, kind, src, steps in plan:
        value = bases[src] if kind == "in" else outs[src]
        if not steps:
            value = alias(value)  # its own tensor object, sharing the storage
        for op, rest, kwargs in steps:
            value = op(value, *rest, **kwargs)
        outs[pos] = value
    return outs


class CompiledGraph:
    """One AOTAutograd graph; called with the real (boxed) inputs."""

    _boxed_call = True
    capture = False  # benchmarks: keep (executable, raw inputs) of the last call in `captured`
    fast_key = True  # key a call like the last one in a few C-level passes (_FastKey); off: input by input
    alias_outputs = True  # outputs that are inputs or views of inputs/outputs made on the host (_output_aliases)

    def __init__(self, gm: torch.fx.GraphModule, kind: str):
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
        self.value_ints = _value_int_inputs(gm.graph)
        self.host_ints = _host_int_outputs(gm.graph, self.out_vals) if self.value_ints else {}
        self.alias_plan, self.alias_inputs = [], []
        if CompiledGraph.alias_outputs and self.placement is None:
            self.alias_plan, self.alias_inputs = _output_aliases(
                gm.graph, self.program.mutated_placeholders, self.out_vals
            )
        self.aliased = frozenset(p[0] for p in self.alias_plan)
        self.written_inputs = frozenset(self.program.mutated_placeholders)
        self.cache = {}
        self.last_key = None
        self._fast = None  # _FastKey of the last call (see there), or None
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
        if entry.tensor_outs is not None:
            made = entry.make_outputs(*entry.tensor_outs, dev, results)
            if bases is None:
                return made
            return _with_aliases(made, entry.array_positions, len(entry.outs), self.alias_plan, bases)
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
            _fill_aliases(outputs, self.alias_plan, bases)
        return outputs

    def _remember(self, args, key, entry, records, offsets, device, reshapes):
        """Keep what keying this call found as the graph's fast key (_FastKey), where the call fits
        one: every argument a tpu tensor with elements, on its own storage, or an int `value_ints`
        traces. A graph whose calls keep missing it stops building them (and trying them)."""
        if self._fast_misses > _FAST_GIVE_UP or not self.fast_key:
            self._fast = None
            return
        self._fast_misses += 1
        self._fast = _FastKey.of(args, key, entry, records, offsets, device, self.value_ints)
        if self._fast is not None:
            self._fast.reshapes = reshapes  # (its records keep their shapes: _FastKey checks)

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
                _log_recompile(self, self.last_key, key)
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
        program = self.program
        template, n_cpu, n_off = _template(args, records, value_ints)
        nb = len(records)
        # which buffers the graph writes: its mutated placeholders, through their views
        written = [i for i in program.mutated_placeholders if type(template[i]) is TensorArg]
        mutated_slots = sorted({template[i].slot for i in written})
        # CPU inputs the graph writes (the optimizer's `step` counters): new values go back by copy_
        cpu_mutations = [i for i in program.mutated_placeholders if type(template[i]) is ValueArg]
        outs_meta = []  # filled while tracing

        aliased = self.aliased

        def run(inputs, key):
            outputs, mutations = program.run(inputs, key)
            outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
            if aliased:  # made on the host as views (_output_aliases): not returned, so not copied
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
        # (engine.DONATE_BYTES); a small one (a cache's position counter), often shared with a kept
        # memo result, must not keep the others from being donated
        entry.donated_slots = tuple(s for s in mutated_slots if records[s].nbytes >= DONATE_BYTES)
        entry.donate = bool(entry.donated_slots) and options.donation_enabled()
        entry.n_cpu = n_cpu
        cpu_index = [i for i, v in enumerate(template) if type(v) is ValueArg]
        entry.cpu_mutations = [cpu_index.index(i) for i in cpu_mutations]
        entry.fused = traced
        dev = device if device >= 0 else current_device()
        sharding = jax.sharding.SingleDeviceSharding(platform.jax_device(dev))
        entry.sample = _sample(args, records, sharding, program.random, n_off, value_ints, self.written_inputs)
        if self.placement is not None:
            return self._placed(entry, traced, outs_meta)
        jitted = jax.jit(
            traced,
            donate_argnums=entry.donated_slots if entry.donate else (),
            out_shardings=sharding if nb == 0 else None,
        )
        # trace and compile now: the output metadata is known, and compile time lands here
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            t0 = time.perf_counter()
            lowered = jitted.lower(*entry.sample)
            t1 = time.perf_counter()
            options._maybe_dump(self, lowered)
            entry.xla = xla_options.jax_options()  # keyed in _key
            entry.fn = lowered.compile(entry.xla)
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
        tpu_check.check(jitted, entry.sample, self.where)
        entry.fn_plain = plain if entry.donate else entry.fn
        entry.finish(outs_meta)
        return entry

    def _placed(self, entry, traced, outs_meta):
        """The executable as the graph's placement compiles it (no donation: its buffers are this
        process's shards of global arrays)."""
        entry.donate = False
        entry.xla = xla_options.jax_options()  # keyed in _key
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


_data_ptr = _Tensor.data_ptr
_FAST_GIVE_UP = 64  # slow keyings in a row after which a graph stops building fast keys


class _FastKey:
    """The previous call's key and what it was built from, to key the next call in a few C-level
    passes instead of one Python step per input (a decode step passes the same weights and cache
    tensors each time: keying them was most of the call's host work).

    A call matches when its tensors are what the remembered ones were (dtype, device, conjugate and
    negative bits, sizes and strides; eager/fastpath.py graph_functions, one C++ pass; without
    the C++ library PyTorch's TensorGuards, which check that and more) and lie where they lay: each
    its storage address and offset (the data pointer, without the library). An address names one
    storage forever and storages' address ranges never overlap (storage/records.py), and a tensor
    with elements lies inside its storage, so an unchanged place is the same storage at the same
    offset: the same record, slot and traced offset. A tensor that moved (the next token's ids,
    `timesteps[i]`) is keyed again alone: its storage's record must have the remembered dtype, size
    and device, its partial-view status must be the same, and no two arguments may share a storage;
    otherwise the call is keyed the slow way. Matmul precision and XLA options, which the key holds,
    are compared too. Nothing here keeps a tensor, a record or a buffer alive: storages are
    remembered by address and looked up in RECORDS.

    `state` (where the tensors lie: the C++ fingerprint or the data pointers; storage addresses,
    traced offsets and their int64 scalars) is replaced whole, never changed in place, so a thread
    reads one consistent snapshot."""

    __slots__ = (
        "device",
        "entry",
        "graph_match",
        "graph_records",
        "guards",
        "ints",
        "key",
        "meta",
        "n",
        "partial",
        "pick",
        "precision",
        "reshapes",
        "state",
        "xla",
    )

    @classmethod
    def of(cls, args, key, entry, records, offsets, device, value_ints):
        tensor_at, int_at = [], []
        for i, a in enumerate(args):
            if isinstance(a, _Tensor):
                tensor_at.append(i)
            elif i in value_ints and type(a) is int:
                int_at.append(i)
            else:
                return None
        tensors = [args[i] for i in tensor_at]
        if len(records) != len(tensors) or not tensors:  # storages shared between arguments; CPU tensors
            return None
        f = cls()
        f.n = len(args)
        f.pick = None if not int_at else _picker(tensor_at)
        f.ints = _picker(int_at) if int_at else None
        addresses = []
        f.meta = []
        f.partial = []
        k = 0
        for t, r in zip(tensors, records):
            if t.numel() == 0:
                return None  # its data pointer may lie past its storage
            addresses.append(t.untyped_storage().data_ptr())
            f.meta.append((r.dtype, r.numel, r.device_index, r.shape))
            if t.storage_offset() or t.numel() != r.numel:  # as key_tensor: a traced offset
                f.partial.append(k)
                k += 1
            else:
                f.partial.append(-1)
        if k != len(offsets) or any(RECORDS.get(a) is not r for a, r in zip(addresses, records)):
            return None
        functions = graph_functions()
        if functions is not None:
            where = functions[0](tensors)
            if where is None:
                return None
            f.guards, f.graph_match, f.graph_records = None, functions[1], functions[3]
        else:
            f.guards = TensorGuards(
                *tensors,
                dynamic_dims_sizes=[list(t.shape) for t in tensors],
                dynamic_dims_strides=[list(t.stride()) for t in tensors],
            )
            where = list(map(_data_ptr, tensors))
        f.state = (where, addresses, list(offsets), [np.int64(o) for o in offsets])
        f.key = key
        f.entry = entry
        f.device = device
        f.precision = key[-1][1] if key[-1][0] == "P" else key[-2][1]  # ("P", ...), then ("X", ...) if set
        f.xla = _xla_active[0]
        return f

    def match(self, graph, args):
        """(entry, records, their buffers or None (then input_buffers reads them), CPU values,
        traced offsets) for `args` if they key as the remembered call did, else None."""
        tensors = args if self.pick is None else self.pick(args)
        state = self.state
        if self.guards is None:
            moved = self.graph_match(state[0], tensors)  # None, () or (fingerprint, moves)
            if moved is None:
                return None
        else:
            if not self.guards.check(*tensors):
                return None
            ptrs = list(map(_data_ptr, tensors))
            moved = (
                ()
                if ptrs == state[0]
                else (
                    ptrs,
                    [
                        (j, tensors[j].untyped_storage().data_ptr(), tensors[j].storage_offset())
                        for j in compress(range(len(ptrs)), map(ne, ptrs, state[0]))
                    ],
                )
            )
        if matmul_precision() != self.precision or _xla_active[0] != self.xla:
            return None
        if moved:
            state = self._moved(tensors, moved, state)
            if state is None:
                return None
            self.state = state
        if self.ints is None:
            cpu_vals = []
        else:
            cpu_vals = list(self.ints(args))
            if not all(type(v) is int for v in cpu_vals):
                return None
        graph._fast_misses = 0
        if self.guards is None:
            records, buffers = self.graph_records(state[1])
            return self.entry, records, buffers, cpu_vals, state[3]
        return self.entry, list(map(RECORDS.__getitem__, state[1])), None, cpu_vals, state[3]

    def _moved(self, tensors, moved, state):
        """The state for `tensors`, some of which moved to other storages or offsets (`moved`: where
        they all lie now, and (index, storage address, offset) of each that moved), or None if that
        changes the key."""
        where, moves = moved
        _, addresses, offsets, offset_vals = state
        addresses = addresses.copy()
        new_offsets = None
        stored = False
        for j, address, off in moves:
            meta = self.meta[j]
            if address != addresses[j]:
                r = RECORDS.get(address)
                if r is None or r.dtype != meta[0] or r.shape != meta[3] or r.device_index != meta[2]:
                    return None
                addresses[j] = address
                stored = True
            k = self.partial[j]
            if (k >= 0) != bool(off or tensors[j].numel() != meta[1]):
                return None
            if k >= 0:
                if new_offsets is None:
                    new_offsets = offsets.copy()
                new_offsets[k] = off
        if stored and any(addresses.count(a) > 1 for _, a, _ in moves):  # two arguments on one storage
            return None
        if new_offsets is None or new_offsets == offsets:
            return where, addresses, offsets, offset_vals
        return where, addresses, new_offsets, [np.int64(o) for o in new_offsets]


def _picker(positions):
    """`args -> tuple of args[i] for i in positions` in C (itemgetter returns a lone item bare)."""
    if len(positions) == 1:
        i = positions[0]
        return lambda args: (args[i],)
    return operator.itemgetter(*positions)


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
    sample = [jax.ShapeDtypeStruct(f, dt.to_jax(r.dtype), sharding=sharding) for f, r in zip(forms, records)]
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
            flat.append(stored_output(v, dt.to_jax(tdtype), order=lay[3] if strided else None))
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
    host = dt.numpy_from_cpu(t.detach().contiguous())
    _counters.h2d_bytes += host.nbytes
    _counters.h2d_transfers += 1
    return platform.put(host, dev)


def _inputs_of_key(key):
    """The per-input parts of a call key (tensor parts start with their dtype; see _key)."""
    return [p for p in key if isinstance(p[0], torch.dtype) or p[0] in ("C", "S", "V")]


def _log_recompile(graph, old, new):
    reasons = []
    if old is None:
        reasons.append("first signature")
    else:
        oi, ni = _inputs_of_key(old), _inputs_of_key(new)
        if len(oi) != len(ni):
            reasons.append(f"number of inputs {len(oi)} -> {len(ni)}")
        for i, (a, b) in enumerate(zip(oi, ni)):
            if a != b:
                reasons.append(
                    f"input {i}: " + _tensor_change(a, b)
                    if isinstance(a[0], torch.dtype) and isinstance(b[0], torch.dtype)
                    else f"input {i}: {a[1:]} -> {b[1:]}"
                )
        if old[-1] != new[-1]:
            reasons.append(f"float32 matmul precision {old[-1][1]} -> {new[-1][1]}")
        if not reasons:
            reasons.append("input storages changed")
    msg = (
        f"torchtpu: recompiling graph {graph.id} ({graph.kind}, {len(graph.cache)} signature(s) cached): "
        + "; ".join(reasons)
    )
    log.warning(msg)
    print(msg, file=sys.stderr)


def _tensor_change(a, b):
    """What differs between two tensor keys (dtype, shape, stride, offset, slot, storage dtype, storage shape)."""
    what = []
    if a[0] != b[0]:
        what.append(f"dtype {a[0]} -> {b[0]}")
    if a[1] != b[1]:
        what.append(f"shape {list(a[1])} -> {list(b[1])}")
    if a[2] != b[2] or a[3] != b[3]:
        what.append(f"layout stride={a[2]} offset={a[3]} -> stride={b[2]} offset={b[3]}")
    if a[4] != b[4]:
        what.append("storage sharing with other inputs changed")
    if a[5:] != b[5:]:
        what.append(f"storage {list(a[6])} of {a[5]} -> {list(b[6])} of {b[5]}")
    return ", ".join(what or ["storage changed"])


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
