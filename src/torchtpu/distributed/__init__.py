"""torch.distributed on "tpu": the `tpu_dist` process group over JAX's multi-controller runtime.

`register()` runs when torchtpu loads (cheap: the process group module is imported only when a
group is created), so `init_process_group()`, `init_process_group("tpu_dist")`,
`"cpu:gloo,tpu:tpu_dist"` and `init_device_mesh("tpu", ...)` work without importing this package.
"""

from __future__ import annotations


def _create(dist_backend_opts, backend_options=None):
    from .process_group import create

    return create(dist_backend_opts, backend_options)


def _place(gm):
    """Compile-layer placer (compile.register_graph_placer): graphs with functional collectives
    become SPMD executables over the process mesh (compiled.py)."""
    if not any(
        getattr(n.target, "namespace", None) in ("_c10d_functional", "_c10d_functional_autograd")
        for n in gm.graph.nodes
        if n.op == "call_function"
    ):
        return None
    from .compiled import place

    return place(gm)


def register():
    import torch.distributed as dist

    if not dist.is_available() or "TPU_DIST" in dist.Backend._plugins:
        return
    for name in ("tpu_dist", "tpu"):
        dist.Backend.register_backend(name, _create, extended_api=True, devices=["tpu", "cpu"])
    # register_backend keeps a device's existing default: "tpu" defaults to ours
    dist.Backend.default_device_backend_map["tpu"] = "tpu_dist"
    from . import fsdp

    fsdp.install()  # FSDP2's storage resizes, for tpu tensors (when FSDP2 is imported)
    from ..compile import register_graph_placer

    register_graph_placer(_place)  # functional collectives inside compiled graphs
