"""`torch.tpu.pallas`: JAX functions (Pallas kernels inside them or not) as PyTorch ops.

    @jax_op("mylib::scaled_add")
    def scaled_add(x: jax.Array, y: jax.Array, alpha: float = 1.0) -> jax.Array:
        return x + alpha * y

    scaled_add(a, b, alpha=0.5)          # a PyTorch op: torch.ops.mylib.scaled_add

Parameters annotated `jax.Array` / `torch.Tensor` (optional, or a sequence of them) are tensors;
every other annotated parameter (int, float, bool, str, dtypes, Literal, Enum, sequences of
numbers...) is static: part of the compiled executable's key, handed to the function as a Python
value (dtypes as JAX dtypes). The op is a `torch.library.custom_op`; its JAX function is registered
as the op's lowering in the project's one lowering table (ops/table.py), so:

- eager "tpu": the op gets an `OpKernel` on PrivateUse1 like every built-in op (one cached
  executable per shapes/dtypes/layouts/static values, views read inside it);
- `torch.compile(backend="tpu")`: the op is a node of the ATen graph, lowered inline into the
  graph's single XLA computation (no graph break; XLA fuses it with its neighbours);
- "cpu" tensors: the function runs on XLA:CPU (its default implementation);
- fake/meta tensors: shapes and dtypes from `jax.eval_shape` (JAX's abstract evaluation);
- autograd: `jax.vjp` of the function (a second op, `ns::<name>_jax_vjp`, recomputing the forward
  inside the backward executable) unless `op.register_autograd(...)` gives a backward.

Pallas: a `pl.pallas_call` inside the function compiles natively on TPU (Mosaic) and GPU (Triton);
on XLA:CPU, which has no Pallas compiler, this module registers a CPU lowering of `pallas_call`
that runs the kernel through Pallas' interpreter, so the same code runs everywhere unchanged. A
`pallas_call` made by a jax_op's function traces its kernel and BlockSpec index maps with x64 off
(ops/pallas_support.py): Mosaic has no 64-bit integers, and torchtpu's x64 setting would make every
Python int in them an int64.
"""

from __future__ import annotations

import enum
import functools
import inspect
import types
import typing
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..eager import kernels as eager_kernels
from ..eager import tpu_check
from ..eager.engine import OpKernel
from ..ops import dtypes as dt
from ..ops import pallas_support
from ..ops.table import LOWERINGS, Lowering
from ..storage.records import RECORDS
from .op_schema import (
    Param,
    Spec,
    bound_keywords,
    caller_value,
    classify,
    evaluated_signature,
    operator_schema,
    return_schema,
)

__all__ = ["custom_jax_kernel", "get_pallas_mesh", "jax_op"]


# ---------------------------------------------------------------- Pallas on XLA:CPU
def enable_pallas_interpret_on_cpu():
    """Register a CPU lowering of `pallas_call` that runs the kernel through Pallas' interpreter (XLA:CPU
    has no Pallas compiler; JAX would raise "Only interpret mode is supported on CPU backend"). TPU and
    GPU keep their native lowerings: the rule is registered for the "cpu" platform only."""
    pallas_support.enable_interpret_on_cpu()


# ---------------------------------------------------------------- registration
_OPS: dict[str, Any] = {}  # "ns::name" -> CustomOpDef (keeps the registrations alive)


def _to_jax_cpu(t):
    return (
        jnp.asarray(dt.numpy_from_cpu(t.contiguous())) if t.numel() else jnp.zeros(tuple(t.shape), dt.to_jax(t.dtype))
    )


def _to_torch_cpu(a):
    a = np.asarray(a)
    return dt.cpu_from_numpy(a, dt.to_torch(a.dtype)).clone()


def _map_tensors(value, f):
    if isinstance(value, torch.Tensor):
        return f(value)
    if isinstance(value, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in value):
        return [None if x is None else f(x) for x in value]
    return value


def _abstract(t):
    return jax.ShapeDtypeStruct(tuple(int(s) for s in t.shape), dt.to_jax(t.dtype))


def _check_static_shapes(args, name):
    for a in args:
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in t.shape):
                raise RuntimeError(
                    f"{name}: symbolic (dynamic) shapes are not supported by a jax_op's shape "
                    f"function; compile with dynamic=False or register a fake with "
                    f"op.register_fake(...)"
                )


def _define(qualname: str, spec: Spec, schema: str, fake=None, tags=()):
    """Define the custom op, its lowering, its fake, its CPU implementation and its tpu kernels."""
    ns, _, opname = qualname.partition("::")
    table_name = f"{ns}.{opname}.default"
    if table_name in LOWERINGS or qualname in _OPS:
        raise RuntimeError(f"jax_op: an operator named {qualname!r} is already registered")

    def cpu_impl(*args, **kwargs):
        jargs = [_map_tensors(a, _to_jax_cpu) for a in args]
        jkw = {k: _map_tensors(v, _to_jax_cpu) for k, v in kwargs.items()}
        out = _cpu_executable(spec, jargs, jkw)
        if isinstance(out, (list, tuple)):
            res = [_to_torch_cpu(o) for o in out]
            return res if spec.returns == "Tensor[]" else (tuple(res) if spec.returns != "()" else None)
        return _to_torch_cpu(out)

    cpu_impl.__name__ = opname
    cdef = torch.library.custom_op(qualname, cpu_impl, mutates_args=(), schema=schema)
    op = cdef._opoverload

    if fake is None:

        def fake(*args, **kwargs):
            _check_static_shapes(list(args) + list(kwargs.values()), qualname)
            device = next(
                (
                    t.device
                    for a in (*args, *kwargs.values())
                    for t in (a if isinstance(a, (list, tuple)) else (a,))
                    if isinstance(t, torch.Tensor)
                ),
                torch.device("meta"),
            )
            jargs = [_map_tensors(a, _abstract) for a in args]
            jkw = {k: _map_tensors(v, _abstract) for k, v in kwargs.items()}
            leaves, tree = jax.tree_util.tree_flatten((jargs, jkw), is_leaf=lambda x: x is None)
            arrays = tuple(i for i, v in enumerate(leaves) if isinstance(v, jax.ShapeDtypeStruct))
            statics = tuple(
                (i, v if not isinstance(v, list) else tuple(v)) for i, v in enumerate(leaves) if i not in arrays
            )
            shapes = jax.eval_shape(_runner(spec, tree, arrays, statics), *[leaves[i] for i in arrays])

            def empty(s):
                return torch.empty(s.shape, dtype=dt.to_torch(s.dtype), device=device)

            if spec.returns == "()":
                return None
            if spec.returns == "Tensor":
                return empty(shapes)
            outs = [empty(s) for s in shapes]
            return outs if spec.returns == "Tensor[]" else tuple(outs)

    cdef.register_fake(fake)

    LOWERINGS[table_name] = Lowering(table_name, lambda *a, **k: spec.run(a, k))
    kernel = eager_kernels.kernel_for(op)
    # every non-tensor argument is static (keyed by value and baked in), never a traced Scalar
    kernel.scalar_pos = set()
    kernel.scalar_names = set()
    cdef._lib.impl(cdef._name, kernel, "PrivateUse1")
    _OPS[qualname] = cdef
    return cdef, kernel


def _cpu_executable(spec, args, kwargs):
    """Run the JAX function on XLA:CPU (the op's implementation for "cpu" tensors)."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=lambda x: x is None)
    arrays = [i for i, v in enumerate(leaves) if isinstance(v, jax.Array)]
    statics = tuple((i, v if not isinstance(v, list) else tuple(v)) for i, v in enumerate(leaves) if i not in arrays)
    fn = _cpu_jit(spec, tree, tuple(arrays), statics)
    return fn(*[leaves[i] for i in arrays])


@functools.lru_cache(maxsize=256)
def _cpu_jit(spec, tree, array_positions, statics):
    return jax.jit(_runner(spec, tree, array_positions, statics))


def _runner(spec, tree, array_positions, statics):
    """The JAX function of the arrays alone, the static leaves of (args, kwargs) closed over."""

    def run(*arrays):
        leaves = [None] * (len(array_positions) + len(statics))
        for i, a in zip(array_positions, arrays):
            leaves[i] = a
        for i, v in statics:
            leaves[i] = v
        a, k = jax.tree_util.tree_unflatten(tree, leaves)
        return spec.run(a, k)

    return run


def _autograd_function(cdef):
    """An autograd.Function running the op below autograd and differentiating it with the op's registered
    backward (`register_autograd`: the jax.vjp one unless the user gave their own)."""
    from torch._library import autograd as library_autograd
    from torch._library import utils as library_utils

    op = cdef._opoverload
    below = torch._C._AutoDispatchBelowAutograd
    keyword_only = library_utils.has_kwarg_only_args(op._schema)

    def forward(ctx, *args):
        kwargs = args[-1]
        args = args[:-1]
        with below():
            result = op(*args, **kwargs)
        if cdef._setup_context_fn:
            inputs, kw = library_utils.fill_defaults(op._schema, args, kwargs)
            if keyword_only:
                cdef._setup_context_fn(ctx=ctx, inputs=inputs, keyword_only_inputs=kw, output=result)
            else:
                cdef._setup_context_fn(ctx=ctx, inputs=inputs, output=result)
        return result

    def backward(ctx, *grads):
        if cdef._backward_fn is None:
            raise RuntimeError(f"Trying to backward through {op} but no autograd formula was registered")
        needs = ctx.needs_input_grad
        try:
            ctx.needs_input_grad = needs[:-1]
            result = cdef._backward_fn(ctx, *grads)
        finally:
            ctx.needs_input_grad = needs
        return (*result, None) if isinstance(result, tuple) else (result, None)

    fn = type(
        f"JaxOpBackward_{op._namespace}_{op._opname}",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )
    if any(library_utils.is_tensorlist_like_type(a.type) for a in (*op._schema.arguments, *op._schema.returns)):
        fn = library_autograd.supports_tensorlist(fn)
    return fn


def _autograd_fast_path(cdef, kernel):
    """The op's autograd kernel on "tpu". Without a tensor that requires grad, plain tpu tensors and no
    Python dispatch mode it calls the op's engine kernel itself: one Python frame between the
    dispatcher and the engine, as a built-in op has behind its C++ autograd kernel (going through
    PyTorch's generated custom-op autograd kernel and a redispatch crosses into Python twice, ~12 us
    more per call). Under torch.compile (fake tensors, modes) it calls the op below autograd; with
    gradients it runs the op's autograd.Function."""
    function = _autograd_function(cdef)
    below = torch._C._AutoDispatchBelowAutograd
    any_requires_grad = torch._C._any_requires_grad
    is_grad_enabled = torch._C.is_grad_enabled
    modes = torch._C._len_torch_dispatch_stack
    op = cdef._opoverload
    tensor = torch.Tensor

    def plain(args):
        for a in args:
            if isinstance(a, tensor):
                if type(a) is not tensor:
                    return False
            elif type(a) is list or type(a) is tuple:
                if any(isinstance(t, tensor) and type(t) is not tensor for t in a):
                    return False
        return True

    def autograd_kernel(*args, **kwargs):
        if is_grad_enabled() and any_requires_grad(*args):
            return function.apply(*args, kwargs)
        if not modes() and plain(args):
            return kernel(*args, **kwargs)
        with below():
            return op(*args, **kwargs)

    return autograd_kernel


def _install_autograd(cdef, kernel, spec: Spec, vjp_op):
    """Gradients through `jax.vjp` (a second op that recomputes the forward inside its executable), until
    the user registers a backward with `op.register_autograd`."""

    def setup_context(ctx, inputs, output, keyword_only_inputs=None):
        ctx.jax_inputs = inputs
        ctx.jax_kwargs = keyword_only_inputs or {}
        outs = list(output) if isinstance(output, (list, tuple)) else [output]
        ctx.jax_outputs = [(o.shape, o.dtype, o.device) for o in outs]

    def backward(ctx, *grads):
        inputs = ctx.jax_inputs
        if spec.returns == "Tensor[]":  # one list of gradients for the list of outputs
            grads = list(grads[0])
        cotangents = [
            torch.zeros(shape, dtype=dtype, device=device) if g is None else g
            for g, (shape, dtype, device) in zip(grads, ctx.jax_outputs)
        ]
        flat = vjp_op(cotangents, *inputs, **ctx.jax_kwargs)
        it = iter(flat)
        result = []
        for i, (p, v) in enumerate(zip(spec.positional, inputs)):
            if p.kind == "tensor":
                g = next(it) if v is not None else None
                result.append(g if v is not None and ctx.needs_input_grad[i] and v.is_floating_point() else None)
            elif p.kind == "tensors":
                gs = [next(it) if x is not None else None for x in (v or [])]
                result.append(
                    [g if x is not None and x.is_floating_point() else None for g, x in zip(gs, v or [])]
                    if ctx.needs_input_grad[i]
                    else None
                )
            else:
                result.append(None)
        return tuple(result)

    cdef.register_autograd(backward, setup_context=setup_context)
    fast = _autograd_fast_path(cdef, kernel)
    cdef._lib.impl(cdef._name, fast, "AutogradPrivateUse1")


def _make_vjp_spec(spec: Spec):
    """The backward op of a jax_op: its forward's arguments plus the output cotangents -> one gradient
    per tensor argument (zeros for non-float ones, which get no gradient)."""
    fwd = spec

    def vjp_fn(**named):
        cots = named.pop("_cotangents")
        names = [p.name for p in fwd.positional if p.kind != "static"]
        leaves, where = [], []
        for n in names:
            v = named.get(n)
            if isinstance(v, (list, tuple)):
                for j, x in enumerate(v):
                    if x is not None:
                        leaves.append(x)
                        where.append((n, j))
            elif v is not None:
                leaves.append(v)
                where.append((n, None))
        diff = [i for i, x in enumerate(leaves) if jnp.issubdtype(x.dtype, jnp.inexact)]

        def f(*xs):
            vals = list(leaves)
            for i, x in zip(diff, xs):
                vals[i] = x
            call = dict(named)
            for (n, j), x in zip(where, vals):
                if j is None:
                    call[n] = x
                else:
                    call[n] = list(call[n])
                    call[n][j] = x
            out = fwd.normalize(fwd.fn(**call))
            return list(out) if isinstance(out, (list, tuple)) else [out]

        outs, pullback = jax.vjp(f, *[leaves[i] for i in diff])
        cts = [jnp.asarray(c).astype(o.dtype).reshape(o.shape) for c, o in zip(cots, outs)]
        grads = pullback(cts)
        result = [jnp.zeros_like(x) for x in leaves]
        for i, g in zip(diff, grads):
            result[i] = g
        return result

    # the cotangents first: the forward's parameters may end with defaults
    params = [
        Param(
            "_cotangents",
            "tensors",
            typing.Sequence[torch.Tensor],
            inspect.Parameter.empty,
            False,
            typing.Sequence[jax.Array],
        )
    ] + list(fwd.params)
    return Spec(vjp_fn, params, "Tensor[]")


def jax_op(
    name, fn=None, /, *, donate_argnums=None, mesh=None, input_partition_specs=None, output_partition_specs=None
):
    """Register the annotated JAX function `fn` as the PyTorch custom op `name` ("namespace::op").

    Works bare (`op = jax_op("ns::f", f)`) and as a decorator (`@jax_op("ns::f")`); returns the
    `torch.library.CustomOpDef` (call it like a function; `op.register_autograd(...)` overrides the
    jax.vjp gradient). See the module docstring for the semantics.

    donate_argnums: positions of tensor arguments whose device buffers are donated to the executable
    (XLA may write the results into them); afterwards those tensors are invalid and must not be read.
    mesh, input_partition_specs, output_partition_specs: a `jax.sharding.Mesh` and per-tensor
    partition specs for a sharded kernel. Accepted and validated; a mesh of one device runs as the
    single-device op. Sharded execution over several devices needs torchtpu's distributed backend and
    raises NotImplementedError until it exists.
    """
    if not isinstance(name, str) or name.count("::") != 1 or not all(name.split("::")):
        raise ValueError(f"jax_op: the op name must be 'namespace::name', got {name!r}")

    def register(fn):
        return _register(name, fn, donate_argnums, mesh, input_partition_specs, output_partition_specs)

    if fn is None:
        return register
    return register(fn)


def _register(name, fn, donate_argnums, mesh, input_partition_specs, output_partition_specs):
    if not callable(fn):
        raise TypeError(f"jax_op {name}: expected a function, got {fn!r}")
    enable_pallas_interpret_on_cpu()
    sig = evaluated_signature(fn)
    bound = bound_keywords(fn)
    params = [classify(p, name) for p in sig.parameters.values() if p.name not in bound]
    returns = return_schema(sig.return_annotation, name)
    n_tensor_args = sum(p.kind != "static" for p in params)
    _check_sharding(name, mesh, input_partition_specs, output_partition_specs, n_tensor_args)
    donate = _donated_positions(name, donate_argnums, params)
    spec = Spec(fn, params, returns)
    cdef, kernel = _define(name, spec, operator_schema(params, returns))
    if mesh is not None and _mesh_size(mesh) > 1:
        kernel = _unsupported_sharded(name, mesh)
        cdef._lib.impl(cdef._name, kernel, "PrivateUse1")
    elif donate:
        kernel.donate_positions = donate
        kernel.__class__ = _DonatingKernel
    if returns != "()":
        vspec = _make_vjp_spec(spec)
        vname = f"{name}_jax_vjp"
        vcdef, _ = _define(vname, vspec, operator_schema(vspec.params, "Tensor[]"))
        _install_autograd(cdef, kernel, spec, vcdef)
    if any(p.kind == "static" for p in params):
        cdef.__class__ = JaxOpDef
    cdef.mesh = mesh
    cdef.input_partition_specs = input_partition_specs
    cdef.output_partition_specs = output_partition_specs
    cdef.jax_function = fn
    return cdef


def dynamo_traceable(fn):
    """`fn` with its code marked as coming from outside torchtpu. Dynamo skips torchtpu's files (they run
    the device, compile/__init__.py), so a call into them from compiled code is a graph break; a thin
    wrapper that only converts arguments and calls torch ops must be traced instead, so that the ops land
    in the graph. (`torch._dynamo.dont_skip_tracing` would do it too, at ~20 us per eager call.) The
    function must call nothing else of torchtpu on the traced path."""
    code = fn.__code__.replace(co_filename=f"<torchtpu.kernels:{fn.__name__}>")
    traced = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    traced.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(traced, fn, updated=())
    del traced.__wrapped__
    return traced


_SCHEMA_VALUES = (torch.Tensor, bool, int, float, str, torch.dtype, torch.device, type(None))


class JaxOpDef(torch._library.custom_ops.CustomOpDef):
    """The CustomOpDef of a jax_op with static parameters: a call also takes what the JAX function would
    (JAX/numpy dtypes, Enum members) and hands PyTorch's schema its types."""

    @dynamo_traceable
    def __call__(self, *args, **kwargs):
        for a in (*args, *kwargs.values()):
            if not isinstance(a, _SCHEMA_VALUES) and not (
                type(a) in (list, tuple) and all(isinstance(x, _SCHEMA_VALUES) for x in a)
            ):
                return self._convert_and_call(args, kwargs)
        return self._opoverload(*args, **kwargs)

    def _convert_and_call(self, args, kwargs):
        return self._opoverload(*[caller_value(a) for a in args], **{k: caller_value(v) for k, v in kwargs.items()})


def _donated_positions(name, donate_argnums, params):
    if not donate_argnums:
        return ()
    positions = tuple(sorted(set(int(i) for i in donate_argnums)))
    positional = [p for p in params if not p.keyword_only]
    for i in positions:
        if not 0 <= i < len(positional) or positional[i].kind != "tensor":
            raise ValueError(
                f"jax_op {name}: donate_argnums={tuple(donate_argnums)}: argument {i} is not a tensor parameter"
            )
    return positions


def _mesh_size(mesh):
    return int(np.prod(list(mesh.shape.values()))) if hasattr(mesh, "shape") else 1


def _check_sharding(name, mesh, in_specs, out_specs, n_tensor_args):
    if mesh is None:
        if in_specs is not None or out_specs is not None:
            raise ValueError(f"jax_op {name}: partition specs need a mesh")
        return
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"jax_op {name}: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if in_specs is not None and len(in_specs) != n_tensor_args:
        raise ValueError(f"jax_op {name}: {len(in_specs)} input partition specs for {n_tensor_args} tensor arguments")


def _unsupported_sharded(name, mesh):
    def kernel(*args, **kwargs):
        raise NotImplementedError(
            f"{name}: a jax_op with a mesh of {_mesh_size(mesh)} devices runs sharded under torchtpu's "
            f"distributed backend, which is not available in this build; use a one-device mesh or no mesh"
        )

    return kernel


class _DonatingKernel(OpKernel):
    """The engine kernel of a jax_op with donate_argnums: its executables are compiled with the donated
    arguments' storage buffers donated to XLA (the engine passes one buffer per storage, in slot order)."""

    donate_positions = ()

    def _build(self, key, args, kwargs, bufs, device):
        entry = super()._build(key, args, kwargs, bufs, device)
        if getattr(entry.fn, "_torchtpu_donating", False):
            return entry
        slots = []
        for i in self.donate_positions:
            t = args[i] if i < len(args) else None
            if isinstance(t, torch.Tensor):
                r = RECORDS.get(t.untyped_storage().data_ptr())
                if r is not None:
                    slots.append(next(j for j, b in enumerate(bufs) if b is r))
        traced = getattr(entry.fn, "__wrapped__", None)
        if slots and traced is not None:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                fn = tpu_check.jit(
                    traced,
                    getattr(entry.fn, "check_name", f"jax_op {self.name}"),
                    donate_argnums=tuple(sorted(set(slots))),
                )
            entry.fn = _Donating(fn)
            entry.memo = None  # a kept result would hold the donated (deleted) input
            entry.consts = None
        return entry


class _Donating:
    _torchtpu_donating = True
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *a):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            return self.fn(*a)


# ---------------------------------------------------------------- TorchTPU's older API
def custom_jax_kernel(
    jax_fn=None,
    name=None,
    static_argnums=(),
    donate_argnums=None,
    input_output_aliases=None,
    mesh=None,
    input_partition_specs=None,
    output_partition_specs=None,
    *,
    static_argnames=(),
    warn_deprecated=True,
):
    """Deprecated (TorchTPU's name): use `jax_op`. Wraps `jax_fn` as a callable on torch tensors; the
    arguments at `static_argnums` / `static_argnames` are static, every other one a tensor (or a list of
    tensors). Each distinct arrangement of arguments becomes a jax_op (`torchtpu_jax::<name>_<n>`), so
    calls run as eager engine ops and inline into compiled graphs like any jax_op."""
    if warn_deprecated:
        warnings.warn("custom_jax_kernel is deprecated; use torch.tpu.pallas.jax_op", DeprecationWarning, stacklevel=2)
    if input_output_aliases:
        raise NotImplementedError(
            "custom_jax_kernel: input_output_aliases is not supported (deprecated in TorchTPU too); use donate_argnums"
        )

    def wrap(fn):
        return _JaxCallable(
            fn,
            name or getattr(fn, "__name__", "kernel"),
            tuple(static_argnums),
            tuple(static_argnames),
            donate_argnums,
            mesh,
            input_partition_specs,
            output_partition_specs,
        )

    return wrap if jax_fn is None else wrap(jax_fn)


_callable_ids = iter(range(1 << 62))


class _JaxCallable:
    def __init__(self, fn, name, static_argnums, static_argnames, donate_argnums, mesh, in_specs, out_specs):
        self.fn, self.name = fn, "".join(c if c.isalnum() else "_" for c in name)
        self.static_argnums, self.static_argnames = static_argnums, static_argnames
        self.options = dict(
            donate_argnums=donate_argnums, mesh=mesh, input_partition_specs=in_specs, output_partition_specs=out_specs
        )
        self.ops = {}
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        layout = (
            tuple(self._kind(i, a) for i, a in enumerate(args)),
            tuple((k, self._kind(k, v)) for k, v in sorted(kwargs.items())),
        )
        entry = self.ops.get(layout)
        if entry is None:
            entry = self.ops[layout] = self._make(args, kwargs, layout)
        op, structure = entry
        flat = op(*[caller_value(a) for a in args], **{k: caller_value(v) for k, v in kwargs.items()})
        return structure(flat)

    def _kind(self, key, a):
        if key in self.static_argnums if isinstance(key, int) else key in self.static_argnames:
            return ("static", _static_type(a))
        if isinstance(a, torch.Tensor):
            return ("tensor",)
        if isinstance(a, (list, tuple)) and all(isinstance(x, torch.Tensor) for x in a):
            return ("tensors",)
        raise TypeError(
            f"custom_jax_kernel {self.name}: argument {key!r} ({type(a).__name__}) is neither a "
            f"tensor nor listed in static_argnums/static_argnames"
        )

    def _make(self, args, kwargs, layout):
        fn = self.fn
        pos_kinds, kw_kinds = layout
        parameters = []
        names = [f"a{i}" for i in range(len(pos_kinds))]
        kinds = list(zip(names, pos_kinds)) + list(kw_kinds)
        for n, kind in kinds:
            ann = {"tensor": jax.Array, "tensors": typing.Sequence[jax.Array]}.get(kind[0]) or kind[1]
            parameters.append(inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ann))
        # outputs: a flat list, rebuilt into the function's own structure
        example_args = [_abstract_value(a) for a in args]
        example_kwargs = {k: _abstract_value(v) for k, v in kwargs.items()}
        tree = jax.tree_util.tree_structure(
            jax.eval_shape(lambda *a, **k: fn(*a, **k), *example_args, **example_kwargs)
        )
        n_pos = len(pos_kinds)

        def flat_fn(**named):
            a = [named[f"a{i}"] for i in range(n_pos)]
            k = {n: named[n] for n, _ in kw_kinds}
            a = [tuple(x) if isinstance(x, list) and pos_kinds[i][0] == "static" else x for i, x in enumerate(a)]
            return list(jax.tree_util.tree_leaves(fn(*a, **k)))

        flat_fn.__signature__ = inspect.Signature(parameters, return_annotation=typing.Sequence[jax.Array])
        op = jax_op(f"torchtpu_jax::{self.name}_{next(_callable_ids)}", flat_fn, **self.options)
        return op, lambda flat: jax.tree_util.tree_unflatten(tree, list(flat))


def _static_type(a):
    if isinstance(a, (list, tuple)):
        kinds = {type(x) for x in a}
        elem = kinds.pop() if len(kinds) == 1 else float
        return typing.Sequence[elem if elem in (int, float, bool) else float]
    if isinstance(a, (torch.dtype, np.dtype)) or (isinstance(a, type) and issubclass(a, np.generic)):
        return torch.dtype
    if isinstance(a, enum.Enum):
        return type(a)
    if type(a) in (bool, int, float, str):
        return type(a)
    raise TypeError(
        f"custom_jax_kernel: static argument {a!r} of type {type(a).__name__} cannot be part of an operator schema"
    )


def _abstract_value(a):
    if isinstance(a, torch.Tensor):
        return _abstract(a)
    if isinstance(a, (list, tuple)) and a and all(isinstance(x, torch.Tensor) for x in a):
        return [_abstract(x) for x in a]
    if isinstance(a, torch.dtype):
        return dt.to_jax(a)
    return a


# ---------------------------------------------------------------- meshes
def get_pallas_mesh(axis_names, mesh_shape=None, process_group=None):
    """A `jax.sharding.Mesh` over the job's devices, rank-aligned (TorchTPU's name). Needs an initialized
    torch.distributed whose world size equals JAX's device count (one process with one device: a
    one-device mesh)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "get_pallas_mesh: torch.distributed is not initialized; call torch.distributed.init_process_group() first"
        )
    world = dist.get_world_size(process_group)
    devices = jax.devices()
    if len(devices) != world:
        raise RuntimeError(
            f"get_pallas_mesh: the process group has {world} ranks but JAX sees {len(devices)} "
            f"devices; multi-process meshes need torchtpu's distributed backend"
        )
    if isinstance(axis_names, str):
        axis_names = (axis_names,)
    if mesh_shape is None:
        if len(axis_names) > 1:
            raise ValueError("get_pallas_mesh: mesh_shape must be given for more than one axis")
        mesh_shape = (world,)
    if len(mesh_shape) != len(axis_names):
        raise ValueError(f"get_pallas_mesh: {len(axis_names)} axis names for a mesh of shape {tuple(mesh_shape)}")
    return jax.sharding.Mesh(np.array(devices).reshape(tuple(mesh_shape)), tuple(axis_names))
