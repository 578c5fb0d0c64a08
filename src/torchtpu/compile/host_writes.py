"""CPU tensors a compiled graph writes, computed on the host when only CPU values feed them.

`torch.compile(opt.step)` writes each parameter's `state["step"]`, a CPU tensor unless the optimizer
is capturable: the graph reads it, adds one and copies the sum back into it. Returned by the
executable, that sum comes back by a device-to-host read after every call, so the host waits for the
whole optimizer step before it can queue the next forward. When the new value of a CPU input depends
only on CPU inputs and constants (here `step + 1`), the host computes it instead, from the same FX
nodes with PyTorch's CPU kernels, as eager mode would, and the executable no longer returns it. The
graph still computes the value for its own use (the bias corrections), from the value it was given.
"""

from __future__ import annotations

import operator

import torch
from torch import fx


def _on_host(node: fx.Node) -> bool:
    """Whether `node`'s value is a CPU tensor or a Python number (its FakeTensor says so)."""
    return _host_value(node.meta.get("val"))


def _host_value(val) -> bool:
    if isinstance(val, torch.Tensor):
        return val.device.type == "cpu"
    if isinstance(val, (list, tuple)):  # a foreach op's results
        return all(_host_value(v) for v in val)
    return isinstance(val, (int, float, bool))


class HostWrites:
    """The CPU placeholders (`written`, placeholder indices) whose new values the host computes, and
    `apply(values)` doing it: `values` maps each CPU placeholder index to the tensor passed for it;
    the written ones get their new values by `copy_`."""

    def __init__(self, written, steps, placeholders):
        self.written = written
        self._steps = steps
        self._placeholders = placeholders

    def apply(self, values):
        env = {self._placeholders[i]: v for i, v in values.items()}

        def load(a):
            if isinstance(a, fx.Node):
                return env[a]
            if isinstance(a, (list, tuple)):
                return type(a)(load(x) for x in a)
            return a

        for node in self._steps:
            args = [load(a) for a in node.args]
            if node.target is torch.ops.aten.copy_.default:
                # as the graph reads it (ops/graph.py GraphProgram.run): later reads see the new value
                dst, src = args[0], args[1]
                src = torch.as_tensor(src, dtype=dst.dtype)
                env[node.args[0]] = env[node] = src.expand(dst.shape).clone()
            else:
                env[node] = node.target(*args, **{k: load(v) for k, v in node.kwargs.items()})
        with torch.no_grad():
            for i in self.written:
                values[i].copy_(env[self._placeholders[i]])


def plan_host_writes(graph: fx.Graph, cpu_placeholders) -> HostWrites | None:
    """The host's share of `graph`'s writes to CPU placeholders (indices in `cpu_placeholders`,
    inputs given as CPU tensors), or None when the device must compute every one of them."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    index = {n: i for i, n in enumerate(placeholders)}
    host = {n for n in placeholders if index[n] in cpu_placeholders}
    steps = []
    writes = {}  # placeholder index -> how many writes, and whether the host can make each
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        inputs = node.all_input_nodes
        if node.target is operator.getitem:  # of a foreach op's results
            if inputs and all(n in host for n in inputs):
                host.add(node)
                steps.append(node)
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema
        if node.target is torch.ops.aten.copy_.default:
            dst = node.args[0]
            if dst in index and index[dst] in cpu_placeholders:
                ok = all(n in host for n in inputs) and writes.get(index[dst], True)
                writes[index[dst]] = ok
                if ok:
                    steps.append(node)
                else:
                    host.discard(dst)  # its value from here on is the device's
            continue
        if schema.is_mutable:
            for a, arg in zip(node.args, schema.arguments):
                if arg.alias_info is not None and arg.alias_info.is_write and a in index:
                    writes[index[a]] = False  # written in place: left to the graph
                    host.discard(a)
            continue
        if inputs and all(n in host for n in inputs) and _on_host(node) and not node.target.is_view:
            if torch.Tag.nondeterministic_seeded in node.target.tags:
                continue
            host.add(node)
            steps.append(node)
    written = sorted(i for i, ok in writes.items() if ok)
    if not written:
        return None
    # only what the written values need, in graph order
    needed = set()
    for node in reversed(steps):
        is_write = node.target is torch.ops.aten.copy_.default and index.get(node.args[0]) in written
        if is_write or node in needed:
            needed.add(node)
            needed.update(node.all_input_nodes)
    return HostWrites(written, [n for n in steps if n in needed], placeholders)
