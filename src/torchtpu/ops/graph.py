"""Interpret an FX graph of ATen ops as one JAX function: the shared core of torch.compile and of
eager decompositions.

`GraphProgram(graph, owner)` plans the graph once (which JAX function runs each node), and
`program.run(inputs, key)` evaluates it on JAX values inside a trace, so the whole graph becomes
one XLA computation. Every ATen op goes through the lowering table (`LOWERINGS`, via `resolve`,
which also derives in-place / out= variants and traces decompositions). The few ops a graph
needs that are about shape and structure rather than math have interpreter-only lowerings
(`GRAPH_LOWERINGS`, in graph_lowerings.py: views, factories, `prims.*`); `getitem`, `sym_size`,
`_foreach_*` and Python's operators are handled here. A lowering in the main table of the same name
always wins, so the interpreter-only ones step aside as the main table grows.
"""

from __future__ import annotations

import math
import operator

import jax
import jax.numpy as jnp
import torch
from torch import fx

from ..storage.records import record_of
from . import dtypes as dt
from .graph_lowerings import (
    GRAPH_LOWERINGS,
    RANDOM_GRAPH_OPS,
    UnsupportedInGraph,
    node_op_name,
    static_shape,
)
from .resolve import NotLowered, functional_twin, resolve
from .table import LOWERINGS, apply
from .views import read

__all__ = ["GRAPH_LOWERINGS", "GraphProgram", "UnsupportedInGraph", "node_op_name"]


# ---------------------------------------------------------------- the interpreter
def _meta_like(v):
    """A meta tensor with v's shape, strides and dtype (v: a FakeTensor or meta tensor)."""
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device="meta")
    if isinstance(v, (list, tuple)):
        return type(v)(_meta_like(x) for x in v)
    return v


def _meta_arg(a):
    if isinstance(a, fx.Node):
        return _meta_like(a.meta.get("val"))
    if isinstance(a, (list, tuple)):
        return type(a)(_meta_arg(x) for x in a)
    if isinstance(a, torch.device):
        return torch.device("meta")
    return a


class _Step:
    __slots__ = ("fn", "kind", "mutates", "node", "random_index")


def _static_convert(a):
    """Non-node arguments as lowerings expect them: torch dtypes become jnp dtypes."""
    if isinstance(a, torch.dtype):
        return dt.to_jax(a)
    if isinstance(a, (list, tuple)):
        return type(a)(_static_convert(x) for x in a)
    return a


def _foreach_fn(op):
    """An elementwise JAX function applying the per-tensor op of a `_foreach_*` overload."""
    schema = op._schema
    base = schema.name.split("::")[1][len("_foreach_") :]
    if base.endswith("_"):
        raise UnsupportedInGraph(f"in-place {schema.name} in a non-functional graph")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        raise UnsupportedInGraph(f"torchtpu: no per-tensor op for {schema.name}")
    pos_args = [a for a in schema.arguments if not a.kwarg_only]
    list_pos = {
        i
        for i, a in enumerate(pos_args)
        if str(a.type).startswith(("Tensor[]", "List[Tensor]"))
        or str(a.type) in ("Scalar[]", "List[Scalar]", "number[]")
    }
    # `_foreach_addcmul.Tensor(..., Tensor scalars)`: one value per list element, held in a tensor
    per_elem = {i for i, a in enumerate(pos_args) if a.name == "scalars" and i not in list_pos}
    chosen = {}

    def fn(args, kwargs):
        n = len(args[min(list_pos)])
        outs = []
        for i in range(n):
            elem = [a[i] if (j in list_pos or j in per_elem) else a for j, a in enumerate(args)]
            kinds = tuple(
                "S" if (j in per_elem or not hasattr(x, "shape") or getattr(x, "weak_type", False)) else "T"
                for j, x in enumerate(elem)
            )
            if kinds not in chosen:
                chosen[kinds] = _per_tensor_overload(packet, kinds, kwargs)
            low, extra_kw = chosen[kinds]
            k = dict(kwargs)
            pos = elem[: len(elem) - len(extra_kw)] if extra_kw else elem
            for name, v in zip(extra_kw, elem[len(pos) :]):
                k[name] = v
            outs.append(apply(low, pos, k))
        return tuple(outs)

    return fn


def _per_tensor_overload(packet, kinds, kwargs):
    """(lowering, names of kwarg-only parameters fed from trailing positional values)."""
    best = None
    short = packet._qualified_op_name.split("::")[1]
    for ov in packet.overloads():
        low = LOWERINGS.get(f"{short}.{ov}")
        if low is None:
            continue
        arguments = getattr(packet, ov)._schema.arguments
        pos = [a for a in arguments if not a.kwarg_only]
        kwo = [a for a in arguments if a.kwarg_only and a.name not in kwargs]
        extra = max(0, len(kinds) - len(pos))
        if extra > len(kwo):
            continue
        params = pos[: len(kinds)] + kwo[:extra]
        ok = True
        for k, a in zip(kinds, params):
            t = str(a.type)
            if k == "T" and not t.startswith(("Tensor", "Optional[Tensor]")):
                ok = False
            if k == "S" and t.startswith("Tensor"):
                ok = False
        if ok:
            cand = (low, tuple(a.name for a in kwo[:extra]))
            if best is None or ov in ("default", "Tensor", "List", "Scalar"):
                best = cand
    if best is None:
        raise UnsupportedInGraph(f"torchtpu: no lowering for the per-tensor op of _foreach_{short} {kinds}")
    return best


def _data_dependent(node):
    """Whether the node's value has a shape (or is a scalar) known only from the data."""
    val = node.meta.get("val")
    if val is None:
        return False
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    try:
        return bool(free_unbacked_symbols(val))
    except AssertionError:  # a value PyTorch holds no sizes for (a script object, say): no symbols to find
        return False


def _data_dependent_message(node):
    what = node.target if not isinstance(node.target, torch._ops.OpOverload) else f"aten::{node_op_name(node.target)}"
    return (
        f"torchtpu: {what} has a data-dependent output (its shape or value is known only after running), "
        f"which one static XLA computation cannot express. Use a static-shape alternative: "
        f"torch.where(mask, x, 0) or (x * mask).sum() instead of x[mask], a fixed-size torch.topk instead of "
        f"nonzero, keep values as tensors instead of .item(); or allow a graph break (fullgraph=False, and "
        f"leave torch._dynamo.config.capture_scalar_outputs / capture_dynamic_output_shape_ops off) so "
        f"the op runs in eager mode on the device."
    )


# torch's symbolic-int functions and their JAX forms: a graph's int input can be a traced value
# (compile/backend.py: ints no shape depends on), which torch.sym_max and friends reject
_TRACED_SYM_FUNCTIONS = {
    torch.sym_max: jnp.maximum,
    torch.sym_min: jnp.minimum,
    torch.sym_not: jnp.logical_not,
    torch.sym_ite: jnp.where,
}


def _sym_function(target):
    traced = _TRACED_SYM_FUNCTIONS[target]

    def sym(*args):
        if any(isinstance(a, jax.Array) for a in args):
            return traced(*args)
        return target(*args)

    return sym


def _invokes_subgraph(node):
    """Whether an auto_functionalized_v2 node calls a nested compile region (invoke_subgraph)."""
    return bool(node.args) and getattr(node.args[0], "__name__", "") == "invoke_subgraph"


def _rng_state_step(node):
    """(kind, lowering) of the RNG higher-order ops AOTAutograd emits for activation checkpointing
    (torch.utils.checkpoint recomputes a random op in the backward with the forward's draw), or the
    reason it cannot be lowered. The saved state is the op's JAX key data, so the replay draws the
    same numbers from the same key."""
    name = getattr(node.target, "__name__", str(node.target))
    kinds = {"run_and_save_rng_state": ("rng_save", 0), "run_with_rng_state": ("rng_replay", 1)}
    if name not in kinds:
        return f"torchtpu: higher-order op {name} is not supported in compiled graphs yet"
    kind, op_position = kinds[name]
    op = node.args[op_position]
    low = LOWERINGS.get(node_op_name(op)) if isinstance(op, torch._ops.OpOverload) else None
    if low is None or not low.random:
        return f"torchtpu: {name} of {op} is not supported in compiled graphs (no random lowering)"
    return kind, low


_SYM_QUERIES = ("sym_size.int", "sym_stride.int", "sym_numel.default", "sym_storage_offset.default")
# ops whose output shape is known only from the data, even when the graph's meta value hides it
_DATA_DEPENDENT_OPS = (
    "_local_scalar_dense.default",
    "nonzero.default",
    "masked_select.default",
    "unique2.default",
    "_unique2.default",
)


def _plan(node):
    """How a call_function node runs: (kind, fn, whether it draws random numbers, the position of the
    argument an in-place op writes or None), or why it cannot run in one static computation."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return _plan_aten(node, target)
    if target is operator.getitem:
        return "getitem", None, False, None
    if isinstance(target, torch._ops.HigherOrderOperator):
        if getattr(target, "__name__", "") == "invoke_subgraph":
            return "subgraph", None, False, None  # GraphProgram plans the region's graph
        if getattr(target, "__name__", "") == "auto_functionalized_v2" and _invokes_subgraph(node):
            return "subgraph_writes", None, False, None  # a region that writes its inputs (a KV cache)
        rng = _rng_state_step(node)
        if isinstance(rng, str):
            return rng
        kind, low = rng
        return kind, low, kind == "rng_save", None
    if callable(target) and getattr(target, "__module__", "") in ("_operator", "operator", "math", "builtins"):
        return "python", target, False, None
    if isinstance(target, type) and issubclass(target, tuple):  # return_types namedtuples
        return "python", lambda *a, **k: tuple(a) + tuple(k.values()), False, None
    if target in _TRACED_SYM_FUNCTIONS:
        return "python", _sym_function(target), False, None
    if callable(target) and "sym" in getattr(target, "__name__", ""):
        return "python", target, False, None
    return f"torchtpu: cannot interpret graph node {node.format_node()}"


def _plan_aten(node, target):
    """_plan for an ATen overload: the lowering table first, then the interpreter's own lowerings,
    then a twin or decomposition (resolve)."""
    name = node_op_name(target)
    low = LOWERINGS.get(name)
    if low is not None:
        return "lowering", low, low.random, None
    if name == "copy_.default":
        return "copy_", None, False, None
    if name in GRAPH_LOWERINGS:
        return "graph", GRAPH_LOWERINGS[name], name in RANDOM_GRAPH_OPS, None
    if name.startswith("_foreach_"):
        try:
            return "call", _foreach_fn(target), False, None
        except UnsupportedInGraph as e:
            return str(e)
    if name in _SYM_QUERIES:
        return "sym", name, False, None
    if name in _DATA_DEPENDENT_OPS:
        return _data_dependent_message(node)
    meta_args = _meta_arg(node.args)
    meta_kwargs = {k: _meta_arg(v) for k, v in node.kwargs.items()}
    try:
        fn = resolve(target, list(meta_args), meta_kwargs)
    except NotLowered as e:
        return str(e)
    twin = functional_twin(target)
    mutates = None
    if twin is not None and not twin[1]:
        # in-place op in a non-functional trace: the first mutable argument gets the value
        mutates = next(
            i for i, a in enumerate(target._schema.arguments) if a.alias_info is not None and a.alias_info.is_write
        )
    twin_lowering = LOWERINGS.get(node_op_name(twin[0])) if twin is not None else None
    return "call", fn, twin_lowering is not None and twin_lowering.random, mutates


class GraphProgram:
    """A planned FX graph: `run(inputs, key)` evaluates it on JAX values (inside a trace).

    `owner` is the GraphModule holding get_attr constants (or None). Returns (outputs, mutations)
    where mutations maps a placeholder index to its new value (from `copy_` into graph inputs).
    """

    def __init__(self, graph: fx.Graph, owner=None):
        self.graph = graph
        self.owner = owner
        self.placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        self.ph_index = {n: i for i, n in enumerate(self.placeholders)}
        self.steps = []
        n_random = 0
        unsupported = []
        regions = {}  # a nested compile region's GraphModule -> its GraphProgram, planned once
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            planned = _data_dependent_message(node) if _data_dependent(node) else _plan(node)
            if isinstance(planned, str):
                unsupported.append(planned)
                continue
            s = _Step()
            s.node = node
            s.kind, s.fn, draws, s.mutates = planned
            if s.kind in ("subgraph", "subgraph_writes"):
                s.fn = self._region(node, regions)
                if isinstance(s.fn, str):
                    unsupported.append(s.fn)
                    continue
                draws = s.fn[0].random
            s.random_index = n_random if draws else None  # each random step folds its own index into the key
            n_random += draws
            self.steps.append(s)
        self.mutated_placeholders = []  # placeholder indices written by copy_ or an in-place op
        for s in self.steps:
            dst = s.node.args[0] if s.kind == "copy_" else (s.node.args[s.mutates] if s.mutates is not None else None)
            written = self.ph_index.get(dst) if isinstance(dst, fx.Node) else None
            if written is not None and written not in self.mutated_placeholders:
                self.mutated_placeholders.append(written)
        self.n_random = n_random
        self.random = n_random > 0
        if unsupported:
            raise NotLowered("\n".join(dict.fromkeys(unsupported)))

    def _region(self, node, regions):
        """How an `invoke_subgraph` node (torch.compiler.nested_compile_region) runs its region:
        (the region's GraphProgram, planned once however many nodes call it: a model's repeated layers;
        the operands' sources; the base each written operand is), or why it cannot run.

        A region that writes its inputs (a decoder layer writing its KV cache) arrives functionalized:
        `auto_functionalized_v2(invoke_subgraph, subgraph=, argN=..., _argN_base_index=i, _all_bases=[...])`,
        whose written operands are given as bases; it returns the region's outputs and then each
        base's new value. Operands that are views of a base (not the whole of it) are not supported."""
        writes = node.target is not torch.ops.higher_order.invoke_subgraph
        sub = node.kwargs.get("subgraph") if writes else node.args[0]
        module = getattr(self.owner, sub.target, None) if isinstance(sub, fx.Node) and sub.op == "get_attr" else None
        if not isinstance(module, fx.GraphModule):
            return f"torchtpu: invoke_subgraph without its graph module: {node.format_node()}"
        program = regions.get(id(module))
        if program is None:
            try:
                program = GraphProgram(module.graph, module)
            except NotLowered as e:
                return str(e)
            regions[id(module)] = program
        if not writes:
            if program.mutated_placeholders:  # (AOTAutograd functionalizes written operands: not expected)
                return "torchtpu: invoke_subgraph whose region writes its inputs is not supported in compiled graphs"
            return program, None, None
        sources, base_of = [], {}
        for i in range(len(program.placeholders)):
            name = f"arg{i}"
            if name in node.kwargs:
                sources.append(name)
                continue
            base = node.kwargs.get(f"_{name}_base_index")
            if base is None or any(k.startswith(f"_{name}_") and k != f"_{name}_base_index" for k in node.kwargs):
                return f"torchtpu: a nested compile region writing a view of its operand {name} is not supported"
            sources.append(base)
            base_of[i] = base
        return program, sources, base_of

    def run(self, inputs, key=None):
        env = {}
        for n, v in zip(self.placeholders, inputs):
            env[n] = v
        mutations = {}

        def load(a):
            if isinstance(a, fx.Node):
                return env[a]
            if isinstance(a, (list, tuple)):
                return type(a)(load(x) for x in a)
            if isinstance(a, torch.dtype):
                return dt.to_jax(a)
            return a

        for n in self.graph.nodes:
            if n.op == "get_attr":
                env[n] = _constant(getattr(self.owner, n.target))
        for s in self.steps:
            node = s.node
            args = [load(a) for a in node.args]
            kwargs = {k: load(v) for k, v in node.kwargs.items()}
            kind = s.kind
            val = node.meta.get("val")
            if kind == "lowering":
                if s.random_index is not None:
                    kwargs["key"] = jax.random.fold_in(key, s.random_index)
                out = apply(s.fn, args, kwargs)
            elif kind == "graph":
                if s.random_index is not None:
                    kwargs["key"] = jax.random.fold_in(key, s.random_index)
                out = s.fn(val, *args, **kwargs)
            elif kind == "call":
                if s.random_index is not None:
                    kwargs["key"] = jax.random.fold_in(key, s.random_index)
                out = s.fn(args, kwargs)
                if s.mutates is not None:
                    target_node = node.args[s.mutates]
                    if isinstance(target_node, fx.Node):
                        env[target_node] = out
                        if target_node in self.ph_index:
                            mutations[self.ph_index[target_node]] = out
            elif kind == "subgraph":  # invoke_subgraph(region, identifier, *operands): traced inline
                region_key = jax.random.fold_in(key, s.random_index) if s.random_index is not None else None
                out = tuple(s.fn[0].run(args[2:], region_key)[0])
            elif kind == "subgraph_writes":  # (_region): the region's outputs, then the bases' new values
                program, sources, base_of = s.fn
                bases = kwargs["_all_bases"]
                operands = [bases[src] if type(src) is int else kwargs[src] for src in sources]
                region_key = jax.random.fold_in(key, s.random_index) if s.random_index is not None else None
                outputs, written = program.run(operands, region_key)
                new_bases = list(bases)
                for i, value in written.items():
                    new_bases[base_of[i]] = value
                outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
                out = (*outputs, *new_bases)
            elif kind == "rng_save":  # run_and_save_rng_state(op, *args): (state, op's value)
                op_key = jax.random.fold_in(key, s.random_index)
                out = (jax.random.key_data(op_key), apply(s.fn, args[1:], dict(kwargs, key=op_key)))
            elif kind == "rng_replay":  # run_with_rng_state(state, op, *args): op's value again
                out = apply(s.fn, args[2:], dict(kwargs, key=jax.random.wrap_key_data(args[0])))
            elif kind == "getitem":
                out = args[0][args[1]]
            elif kind == "copy_":
                dst, src = args[0], args[1]
                out = jnp.broadcast_to(jnp.asarray(src).astype(dst.dtype), dst.shape)
                dst_node = node.args[0]
                env[dst_node] = out
                if dst_node in self.ph_index:
                    mutations[self.ph_index[dst_node]] = out
            elif kind == "sym":
                a = args[0]
                if s.fn == "sym_size.int":
                    out = int(a.shape[args[1]])
                elif s.fn == "sym_numel.default":
                    out = int(a.size)
                elif s.fn == "sym_stride.int":
                    out = int(_contig_stride(a.shape)[args[1]])
                else:
                    out = 0
            else:  # python operator on static ints
                out = s.fn(*args, **kwargs)
            env[node] = _fix(out, val) if kind in ("lowering", "call", "graph") else out
        out_node = next(n for n in reversed(self.graph.nodes) if n.op == "output")
        return load(out_node.args[0]), mutations


def _contig_stride(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return tuple(reversed(st))


def _fix(out, val):
    """Make a lowering's value agree with PyTorch's meta value (dtype, broadcast shape)."""
    if isinstance(val, torch.Tensor) and hasattr(out, "dtype") and hasattr(out, "shape"):
        d = dt.to_jax(val.dtype)
        if val.dtype == torch.complex32:  # computed as complex64, rounded at each op as eager rounds
            out = dt.round_complex32(out)
        elif out.dtype != d:
            out = out.astype(d)
        shape = static_shape(val.shape)
        if shape is None:  # symbolic: the traced value is the truth
            return out
        if tuple(out.shape) != shape and math.prod(shape) == math.prod(out.shape) == 1:
            out = out.reshape(shape)
        elif tuple(out.shape) != shape and len(out.shape) <= len(shape):
            out = jnp.broadcast_to(out, shape)
        return out
    if isinstance(val, (list, tuple)) and isinstance(out, (list, tuple)) and len(val) == len(out):
        return type(out)(_fix(o, v) for o, v in zip(out, val))
    return out


def _constant(t):
    """A get_attr constant (a tensor attribute of the graph module) as a JAX value."""
    if not isinstance(t, torch.Tensor):
        return t
    if t.device.type == "tpu":
        r = record_of(t)
        flat = r.buffer if r.buffer is not None else jnp.zeros(r.shape, dt.storage_jax(r.dtype))
        return read(flat, (tuple(t.shape), tuple(t.stride()), t.storage_offset(), dt.element(t.dtype), r.numel))
    if t.dtype == torch.complex32:
        t = t.to(torch.complex64)
    host = dt.numpy_from_cpu(t.detach().contiguous())
    return jnp.asarray(host, dt.to_jax(t.dtype))
