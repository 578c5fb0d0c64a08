"""torch.compile backend "tpu" (see backend.py) and its options (`torch.tpu.compiler`, options.py).

Importing this package is cheap: it does not import torch._dynamo (seconds). `install_hooks()`
arranges that, whenever Dynamo is imported, (1) the backend "tpu" is registered in Dynamo's
registry and (2) Dynamo skips the device's own Python code (torchtpu, jax, jaxlib), which runs
after a graph break (`.item()` -> the tpu `_local_scalar_dense` kernel) and must never be traced.
"""

from __future__ import annotations

from .._import_hooks import when_imported
from . import options

__all__ = ["install_hooks", "options", "register", "register_graph_placer", "tpu_backend"]

# Higher layers that need a graph compiled as something other than one single-device program (the
# distributed layer: graphs with functional collectives become SPMD programs over a process mesh)
# register a placer here, so that compile never imports them. A placer is called with each FX graph
# before it is planned and returns None (not its business) or a placement: an object with
# `compile(traced, sample, xla_options) -> (call, lowered)`, where `traced` is the executable
# builder's function (eager/executable.py) for this process's buffers and `sample` its abstract
# arguments, and `call(*buffers_and_values)` returns this process's results in the builder's order.
# It may raise ops.resolve.NotLowered to send the graph to the eager fallback.
_PLACERS: list = []


def register_graph_placer(placer) -> None:
    if placer not in _PLACERS:
        _PLACERS.append(placer)


def graph_placers() -> tuple:
    return tuple(_PLACERS)


_SKIPPED = ("torchtpu", "jax", "jaxlib")


def tpu_backend(gm, example_inputs, **kwargs):
    """The Dynamo backend "tpu" (the heavy modules load on the first compile). `torch.compile(backend="tpu",
    mode=..., options=...)` passes Inductor's settings here: checked, then ignored (options.py)."""
    options.ignore_inductor_settings(kwargs.pop("mode", None), kwargs.pop("options", None))
    from .backend import tpu_backend as backend

    return backend(gm, example_inputs, **kwargs)


def _on_registry(registry):
    if "tpu" not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=tpu_backend, name="tpu")


def _on_trace_rules(trace_rules):
    for name in _SKIPPED:
        try:
            trace_rules.add(name)
        except (ImportError, ValueError):  # (importlib's find_spec on a broken package) not skipped, then:
            pass  # Dynamo would trace into it, slower but correct


_installed = [False]


def install_hooks():
    """Register the backend and the Dynamo skips now if Dynamo is loaded, else when it loads."""
    if _installed[0]:
        return
    _installed[0] = True
    when_imported("torch._dynamo.backends.registry", _on_registry)
    when_imported("torch._dynamo.trace_rules", _on_trace_rules)
    when_imported("torch._dynamo.device_interface", _on_device_interface)


def _on_device_interface(module):
    from .device_interface import register as register_device_interface

    register_device_interface(module)


def register():
    """Register the backend now (imports torch._dynamo)."""
    install_hooks()
    import torch._dynamo.backends.registry as registry
    import torch._dynamo.trace_rules as trace_rules

    _on_registry(registry)
    _on_trace_rules(trace_rules)


install_hooks()
