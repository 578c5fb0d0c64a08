"""Ops without a lowering that PyTorch can decompose: traced into ops that have one.

`decomposed(op, meta_args, meta_kwargs)` is the last step of `resolve` (registered in
`resolve.DECOMPOSERS` at import: resolve cannot import this module, which plans with graph.py,
which resolves). In order it tries:
1. an interpreter-only lowering of `ops/graph.py` (`cat`, `index`, `gather`, factories, ...);
2. PyTorch's decomposition of the op (`torch._decomp`), or its CompositeExplicitAutograd /
   CompositeImplicitAutograd kernel, traced with `make_fx` on the meta arguments. Inner ops that
   lack a lowering and have a decomposition are decomposed while tracing; the rest are resolved
   (recursively) when the graph is planned.
The result is a function (args, kwargs) -> outputs on JAX values that interprets the graph. The
trace bakes the Scalar arguments in, so the function says `specialize_scalars = True` and the
engine keys its cache on their values.
"""

from __future__ import annotations

import functools
import threading

import torch
from torch._C import DispatchKey
from torch.utils import _pytree as pytree

from . import resolve
from .graph import GraphProgram
from .graph_lowerings import GRAPH_LOWERINGS, RANDOM_GRAPH_OPS, node_op_name
from .table import LOWERINGS

__all__ = ["decomposed", "decomposition_table_for_lowering", "lowered"]

_active = threading.local()


def lowered(op) -> bool:
    """Whether `op` (or its functional twin) has a lowering, in the main table or the interpreter's."""
    name = node_op_name(op)
    if name in LOWERINGS or name in GRAPH_LOWERINGS:
        return True
    twin = resolve.functional_twin(op)
    return twin is not None and (node_op_name(twin[0]) in LOWERINGS or node_op_name(twin[0]) in GRAPH_LOWERINGS)


def decomposition_table_for_lowering(base=None):
    """PyTorch decompositions (core ATen by default) restricted to ops that have no lowering."""
    if base is None:
        from torch._decomp import core_aten_decompositions

        base = core_aten_decompositions()
    out = {}
    for op, fn in base.items():
        if isinstance(op, torch._ops.OpOverload) and not lowered(op):
            out[op] = fn
    return out


@functools.lru_cache(maxsize=1)
def _inner_table():
    # everything torch._decomp knows, restricted to unlowered ops: used while tracing a decomposition
    return decomposition_table_for_lowering(dict(torch._decomp.decomposition_table))


def _has(op, key):
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)


def _implementation(op):
    """A Python callable that runs op in terms of other ops, or None."""
    fn = torch._decomp.decomposition_table.get(op)
    if fn is not None:
        return fn
    for key in (DispatchKey.CompositeImplicitAutograd, DispatchKey.CompositeExplicitAutograd):
        if _has(op, key.name):
            return functools.partial(op._op_dk, key)
    return None


def decomposed(op, meta_args, meta_kwargs):
    schema = op._schema
    if any(r.alias_info is not None for r in schema.returns):
        return None  # views and in-place returns: metadata or twins, never a traced copy
    mutable = [
        (i, a.name, a.kwarg_only)
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write
    ]
    if mutable and any(a.kwarg_only for _, a_name, kw in mutable for a in schema.arguments if a.name == a_name and kw):
        return None  # out= variants go through their functional twin
    name = node_op_name(op)
    if name in GRAPH_LOWERINGS and name not in RANDOM_GRAPH_OPS:
        return _graph_lowering_fn(op, GRAPH_LOWERINGS[name], meta_args, meta_kwargs)
    impl = _implementation(op)
    if impl is None:
        return None
    stack = getattr(_active, "stack", None)
    if stack is None:
        stack = _active.stack = []
    if op in stack:
        return None  # a decomposition that needs itself
    stack.append(op)
    _active.failure = None
    try:
        return _trace(op, impl, meta_args, meta_kwargs, mutable)
    except AssertionError:  # our own invariant broke while tracing: a bug, not a missing op
        raise
    except Exception as e:  # noqa: BLE001 - what PyTorch cannot trace means "no decomposition";
        _active.failure = e  # resolve() chains it to its NotLowered, so the reason is not lost
        return None
    finally:
        stack.pop()


def last_failure():
    """Why the last `decomposed` call in this thread found no decomposition (an exception), or None."""
    return getattr(_active, "failure", None)


resolve.DECOMPOSERS.append((decomposed, last_failure))


def _graph_lowering_fn(op, fn, meta_args, meta_kwargs):
    val = op(*meta_args, **meta_kwargs)

    def run(args, kwargs):
        return fn(val, *args, **kwargs)

    return run


def schema_name(op, pos):
    return op._schema.arguments[pos].name


def _trace(op, impl, meta_args, meta_kwargs, mutable=()):
    from torch.fx.experimental.proxy_tensor import make_fx

    leaves, spec = pytree.tree_flatten((list(meta_args), dict(meta_kwargs)))
    tensor_pos = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def f(*tensors):
        filled = list(leaves)
        for i, t in zip(tensor_pos, tensors):
            filled[i] = t
        a, k = pytree.tree_unflatten(filled, spec)
        out = impl(*a, **k)
        if not mutable:
            return out
        # the engine expects the outputs, then the new values of the mutated arguments in schema order
        written = []
        for i, n, _ in mutable:
            v = k.get(n) if i >= len(a) else a[i]
            written.extend(x for x in (v if isinstance(v, (list, tuple)) else [v]) if x is not None)
        return (*pytree.tree_leaves(out), *written)

    if mutable:
        f = torch.func.functionalize(f, remove="mutations_and_views")
    gm = make_fx(f, decomposition_table=_inner_table(), tracing_mode="real")(*[leaves[i] for i in tensor_pos])
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    if len(calls) == 1 and calls[0].target is op:
        return None  # tracing did not decompose anything
    program = GraphProgram(gm.graph, gm)  # raises NotLowered for inner ops nobody can run
    if program.random:
        return None  # eager kernels get a PRNG key only for random lowerings of the table

    # arguments the decomposition writes although the schema does not say so (native_batch_norm's
    # running stats): reported to the engine as extra mutations, their values after the outputs
    extra = []
    if not mutable:
        n_pos = len(meta_args)
        for ph in program.mutated_placeholders:
            leaf = tensor_pos[ph]
            pos = next((i for i, a in enumerate(meta_args) if a is leaves[leaf]), None)
            if pos is None or pos >= n_pos:
                return None
            extra.append((ph, pos, schema_name(op, pos)))

    def run(args, kwargs):
        values = pytree.tree_leaves((list(args), dict(kwargs)))
        outputs, mutations = program.run([values[i] for i in tensor_pos])
        if extra:
            return (*pytree.tree_leaves(outputs), *[mutations[ph] for ph, _, _ in extra])
        return outputs

    if extra:
        run.extra_mutations = tuple((pos, name) for _, pos, name in extra)

    run.specialize_scalars = True
    run.graph_module = gm
    return run
