"""What a captured graph says before it is traced: outputs that are host ints (computed on the host
from the graph's own int arithmetic), int inputs that may travel as traced values, and outputs that
are views of inputs (returned as views of the call's own tensors)."""

from __future__ import annotations

import torch

_Tensor = torch.Tensor


def dense_order(shape, stride):
    """Dims from outermost to innermost if (shape, stride) is a dense, non-overlapping layout."""
    dims = sorted(range(len(shape)), key=lambda d: (-stride[d], -d))
    expected = 1
    for d in reversed(dims):
        if shape[d] != 1 and stride[d] != expected:
            return None
        expected *= shape[d]
    return dims


def host_int_outputs(graph, out_vals):
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


def value_int_inputs(graph):
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
        and dense_order(shape, stride) is not None
    )


def output_aliases(graph, mutated, out_vals):
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


def with_aliases(made, positions, n_outs, plan, bases):
    """All outputs: the executable's (`made`, at `positions`) and the aliases of the plan."""
    outs = [None] * n_outs
    for p, t in zip(positions, made):
        outs[p] = t
    return fill_aliases(outs, plan, bases)


def fill_aliases(outs, plan, bases):
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
