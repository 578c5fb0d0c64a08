"""`torch.tpu.optimizers.SingleTraceTrainer`: forward, loss, backward AND the optimizer update of a
training step as ONE XLA executable.

TorchTPU's trainer (same name and signature) drives its functional optimizers. Ours drives the
fused `torch.tpu.optimizers` (AdamW, SGD, Muon): torch.optim subclasses whose update of one
parameter is a pure JAX function (`_FusedStep._update`). A step here is:

1. trace (once per input signature): `make_fx` of the loss of `torch.func.functional_call(model,
   ...)` and `torch.autograd.grad` on fake tensors, with the compile backend's decompositions and
   PyTorch's Python dispatcher (as AOTAutograd: BatchNorm's running statistics become declared
   mutations), then re-traced through `torch.func.functionalize`, so the graph is functional: model
   buffers the forward writes (running statistics) come back as `copy_` into their placeholders;
2. build (once per signature, optimizer configuration and parameter layout): one jitted function
   that evaluates the graph with the lowering table (ops/graph.py `GraphProgram.run`, as compiled
   graphs do) and feeds each gradient straight into the optimizer's per-parameter update; the
   parameter, optimizer-state and written buffer storages are donated;
3. call: the buffers of every storage involved, the optimizer's host scalars (learning rate, bias
   corrections, SGD's first-step flag: traced, so a scheduler never recompiles), the PRNG state if
   the model draws random numbers; the results are committed to the parameters', buffers' and
   optimizer states' own storages in one step (eager/executable.py `call_and_commit`). The
   Parameter objects, `optimizer.state` tensors and `state_dict()` stay the ones PyTorch knows, so
   a plain `optimizer.step()` or `torch.optim` can take over at any point.

Gradients never materialise as `param.grad` with an optimizer (they live inside the executable);
with `optimizer=None` the step computes them and accumulates them into `param.grad` as
`loss.backward()` does (set on the first step, added to after; `zero_grad()` resets as usual).
Parameters that do not reach the loss get no gradient and are skipped by the optimizer, as in
torch.optim (a None grad). The parameter set and the loss are fixed by the trainer; what the
model computes is traced once per input signature and `model.training` value (dropout and
BatchNorm follow the mode at trace time; switching `model.eval()` builds a second step), and so
does `torch.autocast("tpu")` around the call (its casts are traced).

`compile_fn` is accepted for TorchTPU compatibility and not used: the step is always compiled from
the traced ATen graph to one XLA executable, with the optimizer's update inside it, so there is no
Python step function to hand to another compiler. Passing one warns (Python shows it once per call
site).
"""

from __future__ import annotations

import collections.abc
import logging
import sys
import threading
import time
import warnings

import jax
import numpy as np
import torch
from torch.optim import optimizer as _optim
from torch.utils import _pytree as pytree

from ..compile import options
from ..device import platform
from ..eager import asserts, tpu_check, xla_options
from ..eager.entry import scalar_key
from ..eager.executable import (
    Program,
    ValueArg,
    call_and_commit,
    input_buffers,
    is_partial,
    key_tensor,
    stored_output,
    tensor_arg,
    traced_function,
)
from ..eager.random import next_rng_args
from ..metrics import counters
from ..ops import dtypes as dt
from ..ops.linalg import matmul_precision
from ..storage.records import RECORDS, donatable, new_tensor

__all__ = ["SingleTraceTrainer"]

log = logging.getLogger("torchtpu.optim")
_WHERE = "SingleTraceTrainer"
_STATIC_LEAVES = (bool, int, float, str, type(None), torch.dtype, torch.device)


# ------------------------------------------------------------------ the loss rule
def _field(out, name):
    """`out.loss` / `out["loss"]`: Hugging Face outputs are both; None when absent."""
    if isinstance(out, collections.abc.Mapping):
        return out.get(name)
    return getattr(out, name, None)


def _main_output(out):
    """The tensor a default loss is taken from: the output itself, its `logits` (Transformers), its
    `sample` (Diffusers), else its first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    for name in ("logits", "sample"):
        value = _field(out, name)
        if isinstance(value, torch.Tensor):
            return value
    for leaf in pytree.tree_leaves(list(out.values()) if isinstance(out, collections.abc.Mapping) else out):
        if isinstance(leaf, torch.Tensor):
            return leaf
    raise TypeError(
        f"{_WHERE}: the model returned {type(out).__name__} with no tensor to take a loss "
        f"from; pass compute_loss_fn=(model, args, kwargs) -> loss"
    )


def default_loss(out, targets):
    """TorchTPU's rule: mse_loss(output, targets) with targets; else `out.loss` if the model computed
    one; else the mean of `out.logits` / `out.sample` / the first tensor of the output."""
    if targets is not None:
        return torch.nn.functional.mse_loss(_main_output(out), targets)
    loss = _field(out, "loss")
    if isinstance(loss, torch.Tensor):
        return loss
    return _main_output(out).mean()


class _LossOf(torch.nn.Module):
    """The model as a submodule, so `functional_call` swaps the traced tensors into the model
    itself before `compute_loss_fn(model, args, kwargs)` (or the default rule) runs."""

    def __init__(self, model, compute_loss_fn):
        super().__init__()
        self.model = model
        self.compute_loss_fn = compute_loss_fn

    def forward(self, args, kwargs, targets):
        if self.compute_loss_fn is not None:
            return self.compute_loss_fn(self.model, args, kwargs)
        return default_loss(self.model(*args, **kwargs), targets)


def _as_call(inputs):
    """TorchTPU's convention: a mapping is keyword arguments, a tuple/list positional ones, anything
    else the one argument."""
    if isinstance(inputs, collections.abc.Mapping):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def _static_key(value):
    if type(value) in (bool, int, float):
        return scalar_key((value,))[0]  # -0.0 apart from 0.0, True apart from 1
    if isinstance(value, _STATIC_LEAVES):
        return (type(value), value)
    raise TypeError(
        f"{_WHERE}: train_step inputs may hold tensors, Python scalars, strings, None, "
        f"dtypes and devices (in dicts, tuples and lists); got {type(value).__name__}"
    )


# ------------------------------------------------------------------ the traced graph
class _Graph:
    """The functional ATen graph of loss + gradients for one input signature."""

    __slots__ = ("gm", "grad_meta", "grad_of", "loss_meta", "mutated", "program")


def _trace(loss_module, params, buffers, inputs, rebuild, diff):
    """make_fx of (params, buffers, input tensors) -> [loss, gradients of the `diff` parameters
    that reach it], functionalized. Returns the graph and which of `diff` got a gradient."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..compile.backend import decompositions  # (here: importing torch.tpu.optimizers stays cheap)

    names = [f"model.{n}" for n in params]
    bnames = [f"model.{n}" for n in buffers]
    n_p, n_b = len(names), len(bnames)
    reached = []

    def joint(*flat):
        state = dict(zip(names, flat[:n_p]))
        state.update(zip(bnames, flat[n_p : n_p + n_b]))
        args, kwargs, targets = rebuild(flat[n_p + n_b :])
        with torch.enable_grad():
            loss = torch.func.functional_call(loss_module, state, (args, kwargs, targets))
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
                what = (
                    f"{loss.dtype} tensor of shape {tuple(loss.shape)}"
                    if isinstance(loss, torch.Tensor)
                    else type(loss).__name__
                )
                raise TypeError(f"{_WHERE}: the loss must be a floating-point tensor of one element; got a {what}")
            if not loss.requires_grad:
                raise RuntimeError(
                    f"{_WHERE}: the loss does not depend on any trainable parameter "
                    f"(all frozen, or the optimizer holds none of the model's)"
                )
            grads = torch.autograd.grad(loss, [flat[i] for i in diff], allow_unused=True)
        reached[:] = [i for i, g in zip(diff, grads) if g is not None]
        return [loss.detach(), *(g for g in grads if g is not None)]

    flat = [*params.values(), *buffers.values(), *inputs]
    table = decompositions()
    try:
        with enable_python_dispatcher():
            gm = make_fx(joint, tracing_mode="fake", decomposition_table=table)(*flat)
            with torch.no_grad():
                gm = make_fx(
                    torch.func.functionalize(gm, remove="mutations"), tracing_mode="fake", decomposition_table=table
                )(*flat)
    except (
        torch._subclasses.fake_tensor.DataDependentOutputException,
        torch.fx.experimental.symbolic_shapes.GuardOnDataDependentSymNode,
    ) as e:
        raise RuntimeError(
            f"{_WHERE}: the step reads a tensor's value on the host while it is traced "
            f"(`.item()`, `if tensor:`, a data-dependent shape); the whole step must be "
            f"one graph: {e}"
        ) from e
    return gm, list(reached)


def _key(t, parts, slot_of, records, offsets, device, what="a tensor"):
    """key_tensor (eager/executable.py) for a tensor of the step, with the trainer's error for others."""
    address = t.untyped_storage().data_ptr()
    r = RECORDS.get(address)
    if r is None:
        if t.device.type != "tpu":
            raise RuntimeError(
                f"{_WHERE}: {what} (shape {tuple(t.shape)}) is on {t.device}; the step "
                f"takes tpu tensors (move the model and the inputs to tpu)"
            )
        raise RuntimeError(f"{_WHERE}: a tpu tensor (shape {tuple(t.shape)}) whose storage torchtpu does not know")
    return key_tensor(t, r, address, parts, slot_of, records, offsets, device, _WHERE)


class _Call:
    """One call's inputs: the graph's placeholders (parameters, buffers, input tensors) keyed as
    eager ops key theirs, the Python values baked into the trace, and the graph's cache key."""

    __slots__ = (
        "device",
        "diff",
        "graph_key",
        "inputs",
        "offsets",
        "parts",
        "placeholders",
        "rebuild",
        "records",
        "slot_of",
    )

    def __init__(self, trainer, leaves, spec):
        inputs, mask, statics = [], [], []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                inputs.append(leaf)
                mask.append(True)
            else:
                statics.append(leaf)
                mask.append(False)
        optimizer = trainer.optimizer  # (read per call: a param group may be added later)
        in_optimizer = None if optimizer is None else {id(p) for g in optimizer.param_groups for p in g["params"]}
        self.diff = tuple(
            i
            for i, p in enumerate(trainer._params)
            if p.requires_grad and (in_optimizer is None or id(p) in in_optimizer)
        )
        self.inputs = inputs
        self.placeholders = [*trainer._params, *trainer._buffers, *inputs]
        self.parts, self.slot_of, self.records, self.offsets = [], {}, [], []
        device = -1
        for i, t in enumerate(self.placeholders):
            try:
                device = _key(t, self.parts, self.slot_of, self.records, self.offsets, device, "an input tensor")
            except RuntimeError:
                names = (*trainer._names, *trainer._buffer_names)
                if i < len(names):  # the error again, naming the parameter or buffer
                    what = f"{'parameter' if i < len(trainer._names) else 'buffer'} {names[i]!r}"
                    _key(t, [], {}, [], [], -1, what)
                raise
        self.device = device
        # autocast is traced into the graph (its casts are ATen ops), so its state selects the trace
        autocast = torch.is_autocast_enabled("tpu") and torch.get_autocast_dtype("tpu")
        self.graph_key = (
            spec,
            tuple(mask),
            tuple(_static_key(s) for s in statics),
            trainer.model.training,
            autocast,
            self.diff,
            tuple(self.parts),
        )

        def rebuild(traced):
            it, st = iter(traced), iter(statics)
            return pytree.tree_unflatten([next(it) if m else next(st) for m in mask], spec)

        self.rebuild = rebuild


class _Entry:
    __slots__ = ("checks", "donate", "fn", "mutated_slots", "outs", "where")


# ------------------------------------------------------------------ the trainer
class SingleTraceTrainer:
    """A whole training step as one XLA executable (TorchTPU's `torch.tpu.optimizers.SingleTraceTrainer`).

    `optimizer` is a `torch.tpu.optimizers.AdamW` / `SGD` / `Muon` over the model's parameters (or
    None: the step computes gradients into `param.grad`). `compute_loss_fn(model, args, kwargs) ->
    loss` replaces the default loss rule (see `default_loss`). `compile_fn` is accepted and unused
    (module docstring)."""

    def __init__(self, model, optimizer=None, compile_fn=None, compute_loss_fn=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{_WHERE}: model must be a torch.nn.Module, got {type(model).__name__}")
        from . import _FusedStep

        if optimizer is not None and not isinstance(optimizer, _FusedStep):
            raise TypeError(
                f"{_WHERE}: optimizer must be a torch.tpu.optimizers.AdamW, SGD or Muon "
                f"(their update is traced into the step); got {type(optimizer).__module__}."
                f"{type(optimizer).__qualname__}. Use optimizer=None to get gradients in "
                f"param.grad and step any optimizer yourself"
            )
        if compute_loss_fn is not None and not callable(compute_loss_fn):
            raise TypeError(f"{_WHERE}: compute_loss_fn must be callable (model, args, kwargs) -> loss")
        self.model = model
        self.optimizer = optimizer
        self.compute_loss_fn = compute_loss_fn
        self._note_compile_fn(compile_fn)
        self._loss_module = _LossOf(model, compute_loss_fn)
        # The parameter and buffer set is fixed here, as an optimizer fixes its parameters (a walk of
        # the module tree per step would cost more than the rest of the host side).
        named = dict(model.named_parameters())  # tied parameters once, under their first name
        self._names = list(named)
        self._params = list(named.values())
        self._buffer_names = [n for n, _ in model.named_buffers()]
        self._buffers = [b for _, b in model.named_buffers()]
        self._index = {id(p): i for i, p in enumerate(self._params)}
        if optimizer is not None:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    self._index_of(p)
        self._graphs = {}
        self._entries = {}
        self._lock = threading.RLock()
        self.graphs_traced = 0  # traces of forward + backward (one per input signature)
        self.executables_built = 0  # XLA executables (tests count recompiles)
        self.buffers_copied = 0  # shared buffers copied so that the step could donate them

    def _index_of(self, p):
        i = self._index.get(id(p))
        if i is None:
            raise ValueError(
                f"{_WHERE}: the optimizer holds a parameter (shape {tuple(p.shape)}) that is "
                f"not one of the model's; build it on model.parameters()"
            )
        return i

    @staticmethod
    def _note_compile_fn(compile_fn):
        if compile_fn is not None:
            warnings.warn(
                f"{_WHERE}: compile_fn is accepted for TorchTPU compatibility and not used; "
                f"the step is always compiled to one XLA executable",
                stacklevel=3,
            )

    @property
    def params(self):
        """The model's parameters by their original names."""
        return dict(zip(self._names, self._params))

    @property
    def param_group(self):
        """The optimizer's param group (its hyperparameters: set `["lr"]` here or with a scheduler),
        or None without an optimizer; with several groups, see `optimizer.param_groups`."""
        if self.optimizer is None:
            return None
        groups = self.optimizer.param_groups
        if len(groups) != 1:
            raise RuntimeError(
                f"{_WHERE}: the optimizer has {len(groups)} param groups; use trainer.optimizer.param_groups"
            )
        return groups[0]

    def make_compiled_train_step(self, example_inputs, example_targets=None, compile_fn=None):
        """`train_step(inputs, targets=None) -> loss` for inputs shaped like `example_inputs`. The
        forward and backward are traced now (errors in the model show here); the executable is
        built at the first call, when the optimizer's state exists. Inputs of another shape trace
        and build again; another structure (or targets the example had not) is an error."""
        self._note_compile_fn(compile_fn)
        with_targets = example_targets is not None
        if with_targets and self.compute_loss_fn is not None:
            raise ValueError(
                f"{_WHERE}: compute_loss_fn is called as (model, args, kwargs); pass the "
                f"targets inside the inputs instead of as targets"
            )
        args, kwargs = _as_call(example_inputs)
        leaves, spec = pytree.tree_flatten((args, kwargs, example_targets))
        call = _Call(self, leaves, spec)
        self._graph_for(call)

        def train_step(inputs, targets=None):
            if (targets is not None) != with_targets:
                raise ValueError(
                    f"{_WHERE}: train_step got {'targets' if targets is not None else 'no targets'}"
                    f", but make_compiled_train_step's example had "
                    f"{'targets' if with_targets else 'none'}; make a train step for this form"
                )
            call_args, call_kwargs = _as_call(inputs)
            leaves, call_spec = pytree.tree_flatten((call_args, call_kwargs, targets))
            if call_spec != spec:
                raise ValueError(
                    f"{_WHERE}: train_step inputs have another structure than the example "
                    f"given to make_compiled_train_step (example {spec}, got {call_spec})"
                )
            return self._step(_Call(self, leaves, spec))

        train_step.trainer = self
        return train_step

    # ---------------------------------------------------------------- the graph of a call
    def _graph_for(self, call):
        graph = self._graphs.get(call.graph_key)
        if graph is not None:
            return graph
        with self._lock:
            graph = self._graphs.get(call.graph_key)
            if graph is None:
                graph = self._graphs[call.graph_key] = self._trace_graph(call)
                self.graphs_traced += 1
            return graph

    def _trace_graph(self, call):
        from ..compile.backend import _check_arguments
        from ..ops.graph import GraphProgram

        t0 = time.perf_counter()
        n_p = len(self._params)
        gm, reached = _trace(
            self._loss_module,
            dict(zip(self._names, self._params)),
            dict(zip(self._buffer_names, self._buffers)),
            call.inputs,
            call.rebuild,
            list(call.diff),
        )
        _check_arguments(gm.graph)
        graph = _Graph()
        graph.gm = gm
        graph.program = GraphProgram(gm.graph, gm)
        graph.grad_of = {i: j for j, i in enumerate(reached)}  # param index -> gradient output
        out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        metas = [n.meta.get("val") for n in out_node.args[0]]
        graph.loss_meta, graph.grad_meta = metas[0], metas[1:]
        graph.mutated = list(graph.program.mutated_placeholders)
        for i in graph.mutated:
            if i < n_p and i in graph.grad_of:
                raise RuntimeError(
                    f"{_WHERE}: the forward writes parameter {self._names[i]!r} in place; "
                    f"a trained parameter cannot also be a written one"
                )
        log.debug(
            "%s: traced forward+backward in %.2fs (%d nodes)", _WHERE, time.perf_counter() - t0, len(gm.graph.nodes)
        )
        return graph

    # ---------------------------------------------------------------- a step
    def _step(self, call):
        graph = self._graph_for(call)
        params = self._params
        optimizer = self.optimizer
        grads_in, states, scalars, static = [], [], [], []
        if optimizer is not None:
            for hook in (*_optim._global_optimizer_pre_hooks.values(), *optimizer._optimizer_step_pre_hooks.values()):
                hook(optimizer, (), {})  # a trainer step is the optimizer's step (no arguments to change)
            optimizer._after, optimizer._undo = [], []
        try:
            if optimizer is not None:
                grad_of, index_of = graph.grad_of, self._index_of
                updated, states, scalars, static = optimizer._plan(lambda i, p: index_of(p) in grad_of)
                if not updated:
                    raise RuntimeError(f"{_WHERE}: no parameter of the optimizer gets a gradient from the loss")
                plan = [index_of(p) for p in updated]
            else:
                plan = list(graph.grad_of)
                grads_in = [params[i].grad for i in plan]
                for i, g in zip(plan, grads_in):
                    if g is not None and (
                        g.dtype != params[i].dtype or g.shape != params[i].shape or g.device != params[i].device
                    ):
                        raise RuntimeError(
                            f"{_WHERE}: parameter {self._names[i]!r}'s grad ({g.dtype}, "
                            f"{tuple(g.shape)}, {g.device}) does not match it"
                        )
            loss = self._call(call, graph, plan, grads_in, states, scalars, static)
        except BaseException:
            if optimizer is not None:
                for undo in optimizer._undo:
                    undo()
                optimizer._after, optimizer._undo = [], []
            raise
        if optimizer is not None:
            after, optimizer._after, optimizer._undo = optimizer._after, [], []
            for done in after:
                done()  # AdamW's CPU step counters
            optimizer._opt_called = True  # what LRScheduler's wrapper of step() records: no warning
            for hook in (*optimizer._optimizer_step_post_hooks.values(), *_optim._global_optimizer_post_hooks.values()):
                hook(optimizer, (), {})
        return loss

    def _call(self, call, graph, plan, grads_in, states, scalars, static):
        parts, records, offsets = call.parts, call.records, call.offsets
        device = call.device
        extra = [*(g for g in grads_in if g is not None), *(s for per in states for s in per)]
        for t in extra:
            device = _key(t, parts, call.slot_of, records, offsets, device)
        tensors = call.placeholders + extra
        counts = tuple(len(per) for per in states)
        host = np.asarray(scalars, dtype=np.float64).astype(np.float32) if self.optimizer is not None else None
        key = (
            id(graph),
            tuple(parts),
            tuple(plan),
            tuple(g is not None for g in grads_in),
            tuple(static),
            counts,
            matmul_precision(),
            xla_options.active(),
        )
        entry = self._entries.get(key)
        if entry is None:
            entry = self._build(
                key, graph, tensors, len(call.placeholders), plan, grads_in, counts, static, host, records, device
            )
        dyn = input_buffers(records)
        if entry.donate:
            # a buffer held elsewhere too (a clone of a whole storage shares its source's buffer; small
            # constants are kept and shared) is copied rather than given up: one executable, always donating
            for s in entry.mutated_slots:
                if not donatable(dyn, (s,)):
                    dyn[s] = jax.device_put(dyn[s], dyn[s].sharding, may_alias=False)
                    self.buffers_copied += 1
        if host is not None:
            dyn.append(host)
        if graph.program.random:
            dyn.append(next_rng_args(device))
        dyn.extend(np.int64(o) for o in offsets)
        try:
            results = call_and_commit(entry.fn, dyn, [records[s] for s in entry.mutated_slots], len(entry.outs))
        finally:
            del dyn[:]
        if entry.checks:
            asserts.note(results[-1], entry.checks, entry.where)
        outs = [new_tensor(shape, dtype, device, buffer) for (shape, dtype), buffer in zip(entry.outs, results)]
        if self.optimizer is None:
            fresh = iter(outs[1:])
            for i, g in zip(plan, grads_in):
                if g is None:
                    self._params[i].grad = next(fresh)
        return outs[0]

    def _build(self, key, graph, tensors, n_ph, plan, grads_in, counts, static, host, records, device):
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                return entry
            if self._entries and options.recompile_logging_enabled():
                msg = (
                    f"torchtpu: {_WHERE} builds step executable {len(self._entries) + 1} (new input "
                    f"signature, optimizer configuration or parameter layout)"
                )
                log.warning(msg)
                print(msg, file=sys.stderr)
            entry = self._trace_executable(graph, tensors, n_ph, plan, grads_in, counts, static, host, records, device)
            self._entries[key] = entry
            self.executables_built += 1
            counters.compiled_xla_compiles += 1
            return entry

    def _trace_executable(self, graph, tensors, n_ph, plan, grads_in, counts, static, host, records, device):
        program = graph.program
        optimizer = self.optimizer
        template, n_off = _template(tensors, records)
        if optimizer is not None:
            template.append(ValueArg())  # the host scalars, one row per updated parameter
        writes = _written_views(template, graph, n_ph, plan, counts, grads_in, optimizer is not None)
        mutated_slots = sorted({w.slot for w in writes})
        grad_of = graph.grad_of
        accumulate = [g is not None for g in grads_in]
        out_specs = [(tuple(graph.loss_meta.shape), graph.loss_meta.dtype)]
        if optimizer is None:
            out_specs += [
                (tuple(graph.grad_meta[grad_of[i]].shape), graph.grad_meta[grad_of[i]].dtype)
                for i, acc in zip(plan, accumulate)
                if not acc
            ]

        def cast(outs):
            return [stored_output(v, dt.element(dtype)) for v, (_, dtype) in zip(outs, out_specs)]

        entry = _Entry()
        entry.checks = ()
        entry.where = f"{_WHERE} step"
        traced = traced_function(
            Program(
                n_buffers=len(records),
                n_values=1 if optimizer is not None else 0,
                random=program.random,
                n_offsets=n_off,
                template=template,
                run=_step_function(graph, n_ph, plan, counts, static, accumulate, optimizer),
                outputs=cast,
                writes=[tuple(w) for w in writes],
                mutated_slots=mutated_slots,
                on_trace=lambda messages, _: setattr(entry, "checks", messages),
            )
        )
        entry.mutated_slots = mutated_slots
        entry.donate = bool(mutated_slots) and options.donation_enabled()
        entry.outs = out_specs
        host_scalars = host if optimizer is not None else None
        entry.fn = _compile(traced, entry, records, host_scalars, program.random, n_off, device)
        return entry


def _template(tensors, records):
    """(the step's tensor arguments as executable.tensor_arg templates, the number of traced offsets)."""
    template, n_off = [], 0
    slot_of = {id(r): i for i, r in enumerate(records)}
    for t in tensors:
        r = RECORDS[t.untyped_storage().data_ptr()]
        dyn = None
        if is_partial(t, r):  # the same order as key_tensor's offsets
            dyn, n_off = n_off, n_off + 1
        template.append(tensor_arg(t, slot_of[id(r)], r, dyn))
    return template, n_off


def _written_views(template, graph, n_ph, plan, counts, grads_in, with_optimizer):
    """The views a step writes, in the order its function returns their values: each updated parameter
    and its optimizer states (or the accumulated .grads), then the graph's mutated inputs."""
    writes = []
    at = n_ph
    if with_optimizer:
        for i, n in zip(plan, counts):
            writes.append(template[i])
            writes += template[at : at + n]
            at += n
    else:
        for g in grads_in:
            if g is not None:
                writes.append(template[at])
                at += 1
    return writes + [template[i] for i in graph.mutated]


def _step_function(graph, n_ph, plan, counts, static, accumulate, optimizer):
    """The step as executable.Program's `run`: the joint graph, then the optimizer's update of each
    parameter (or the gradients accumulated into .grad, or returned)."""
    program, grad_of, mutated = graph.program, graph.grad_of, graph.mutated
    update = optimizer._update if optimizer is not None else None

    def run(arguments, key):
        values = arguments[:n_ph]
        outputs, mutations = program.run(values, key)
        loss, grads = outputs[0], outputs[1:]
        written, outs = [], [loss]
        at = n_ph
        if optimizer is not None:
            rows = arguments[-1]
            for k, (i, n) in enumerate(zip(plan, counts)):
                param = values[i]
                grad = grads[grad_of[i]].astype(param.dtype).reshape(-1)
                new_param, new_states = update(
                    static[k], param.reshape(-1), grad, [s.reshape(-1) for s in arguments[at : at + n]], rows[k]
                )
                written.append(new_param.reshape(param.shape))
                written += [s.reshape(old.shape) for s, old in zip(new_states, arguments[at : at + n])]
                at += n
        else:
            for i, acc in zip(plan, accumulate):
                grad = grads[grad_of[i]]
                if acc:  # += into the existing .grad, in its dtype (AccumulateGrad)
                    old = arguments[at]
                    written.append((old + grad.astype(old.dtype)).astype(old.dtype))
                    at += 1
                else:
                    outs.append(grad)
        written += [mutations[i] for i in mutated]
        return outs, written, []

    return run


def _compile(traced, entry, records, host, random, n_off, device):
    """`traced` compiled ahead of time for the step's buffers (donating the written ones when
    entry.donate), the optimizer's host scalars `host` (None without an optimizer), a PRNG key when
    `random`, and `n_off` traced offsets; checked for a TPU when TORCHTPU_TPU_COMPILE_CHECK asks."""
    sharding = jax.sharding.SingleDeviceSharding(platform.jax_device(device))
    sample = [jax.ShapeDtypeStruct(r.shape, dt.storage_jax(r.dtype), sharding=sharding) for r in records]
    if host is not None:
        sample.append(jax.ShapeDtypeStruct(host.shape, np.float32))
    if random:
        sample.append(jax.ShapeDtypeStruct((3,), np.uint32))
    sample.extend(jax.ShapeDtypeStruct((), np.int64) for _ in range(n_off))
    jitted = jax.jit(traced, donate_argnums=tuple(entry.mutated_slots) if entry.donate else ())
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        compiled = jitted.lower(*sample).compile(xla_options.jax_options())
    tpu_check.check(jitted, sample, entry.where)
    return compiled
