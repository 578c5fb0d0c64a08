"""`torch.tpu.distributed`: TorchTPU's distributed names where torchtpu offers the same thing.

- `set_tpu_launch_env(*, nnodes=None, nproc_per_node=None)`: in the launching (parent) process,
  check and record the job's shape before workers spawn; never overwrites a variable already set.
- `topology_aware_mesh(device_type, mesh_shape, *, ...)`: a `DeviceMesh` whose rank layout follows
  the devices' physical topology (JAX's `mesh_utils`); its `.mesh` is the rank tensor TorchTPU's
  function of the same name returns.
- `spmd_safe(func)`: marks a function as issuing the same collectives, in the same order and with
  the same shapes, on every rank.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import threading

__all__ = ["set_tpu_launch_env", "spmd_safe", "topology_aware_mesh"]


# ------------------------------------------------------------------ launch
def _attached_chips() -> int:
    # TPU VMs expose their chips as /dev/accel* (older) or /dev/vfio/<n> (newer); counting them does
    # not open the devices, which the workers must own
    chips = glob.glob("/dev/accel*") or [p for p in glob.glob("/dev/vfio/*") if os.path.basename(p).isdigit()]
    return len(chips)


def set_tpu_launch_env(*, nnodes: int | None = None, nproc_per_node: int | None = None) -> None:
    """Set the environment a multi-process "tpu" job needs, in the parent process, before workers
    spawn (torchrun, torch.multiprocessing). Idempotent; a variable already set is left alone.

    nnodes: expected number of hosts; checked against TPU_WORKER_HOSTNAMES when that is set.
    nproc_per_node: ranks per host; defaults to the TPU chips attached to this host (one process per
    chip), or 1 where there are none (XLA:CPU).

    Sets TORCHTPU_NNODES and TORCHTPU_NPROC_PER_NODE, and asks torch.multiprocessing for the "spawn"
    start method (a forked child of a process whose XLA runtime is up cannot use it).
    """
    hosts = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
    if nnodes is not None:
        if nnodes < 1:
            raise ValueError(f"set_tpu_launch_env(): nnodes must be at least 1, got {nnodes}")
        if hosts and nnodes != len(hosts):
            raise ValueError(
                f"set_tpu_launch_env(): nnodes={nnodes} but TPU_WORKER_HOSTNAMES lists "
                f"{len(hosts)} hosts ({','.join(hosts)})"
            )
    if nproc_per_node is not None and nproc_per_node < 1:
        raise ValueError(f"set_tpu_launch_env(): nproc_per_node must be at least 1, got {nproc_per_node}")
    os.environ.setdefault("TORCHTPU_NNODES", str(nnodes or len(hosts) or 1))
    os.environ.setdefault("TORCHTPU_NPROC_PER_NODE", str(nproc_per_node or _attached_chips() or 1))
    import torch.multiprocessing as mp

    try:
        mp.set_start_method("spawn")
    except RuntimeError:  # already chosen: keep the caller's choice
        pass


# ------------------------------------------------------------------ meshes
def topology_aware_mesh(
    device_type: str,
    mesh_shape,
    *,
    dcn_mesh_shape=None,
    allow_split_physical_axes: bool = False,
    contiguous_submeshes: bool = False,
    mesh_dim_names=None,
):
    """A `DeviceMesh` of shape `mesh_shape` over all ranks, laid out along the physical topology.

    Every rank's device is found in JAX's global device list (one device per rank); JAX's
    `mesh_utils.create_device_mesh` (or `create_hybrid_device_mesh` when `dcn_mesh_shape` splits the
    mesh across slices) arranges the devices so that neighbouring mesh coordinates are neighbouring
    chips, and the mesh holds the rank of each device. On XLA:CPU the layout is rank order.
    Requires an initialized process group; every rank computes the same layout.
    """
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if not dist.is_initialized():
        raise RuntimeError(
            "topology_aware_mesh: initialize the process group first (torch.distributed.init_process_group)"
        )
    mesh_shape = tuple(int(s) for s in mesh_shape)
    world = dist.get_world_size()
    if int(np.prod(mesh_shape)) != world:
        raise ValueError(
            f"topology_aware_mesh: mesh_shape {mesh_shape} has {int(np.prod(mesh_shape))} "
            f"ranks but the world size is {world}"
        )
    import jax
    from jax.experimental import mesh_utils

    devices = jax.devices()
    if len(devices) != world:
        raise RuntimeError(
            f"topology_aware_mesh: JAX sees {len(devices)} devices for {world} ranks (expected one device per rank)"
        )
    if dcn_mesh_shape is not None:
        dcn_mesh_shape = tuple(int(s) for s in dcn_mesh_shape)
        if len(dcn_mesh_shape) != len(mesh_shape) or any(m % d for m, d in zip(mesh_shape, dcn_mesh_shape)):
            raise ValueError(
                f"topology_aware_mesh: dcn_mesh_shape {dcn_mesh_shape} must have the rank of "
                f"mesh_shape {mesh_shape} and divide it"
            )
        ici = tuple(m // d for m, d in zip(mesh_shape, dcn_mesh_shape))
        if int(np.prod(dcn_mesh_shape)) > 1:
            grid = mesh_utils.create_hybrid_device_mesh(
                ici, dcn_mesh_shape, devices, allow_split_physical_axes=allow_split_physical_axes
            )
        else:
            grid = mesh_utils.create_device_mesh(
                mesh_shape,
                devices,
                allow_split_physical_axes=allow_split_physical_axes,
                contiguous_submeshes=contiguous_submeshes,
            )
    else:
        grid = mesh_utils.create_device_mesh(
            mesh_shape,
            devices,
            allow_split_physical_axes=allow_split_physical_axes,
            contiguous_submeshes=contiguous_submeshes,
        )
    ranks = torch.tensor(np.vectorize(lambda d: d.process_index, otypes=[np.int64])(grid))
    return DeviceMesh(device_type, ranks, mesh_dim_names=mesh_dim_names)


# ------------------------------------------------------------------ spmd_safe
_spmd = threading.local()


def in_spmd_safe() -> bool:
    """Whether the current thread runs inside a function decorated with `spmd_safe`."""
    return getattr(_spmd, "depth", 0) > 0


@contextlib.contextmanager
def _spmd_region():
    _spmd.depth = getattr(_spmd, "depth", 0) + 1
    try:
        yield
    finally:
        _spmd.depth -= 1


def spmd_safe(func):
    """Mark `func` as SPMD-safe: every rank runs it identically (same tpu ops and collectives, same
    order, same shapes; no rank-dependent control flow).

    Before a collective first runs with new shapes, the tpu_dist group checks through its store
    that all ranks call the same one (a mismatch then raises instead of corrupting the XLA
    collective). Inside an spmd_safe function that promise is the user's and the check is skipped,
    saving a store round trip per new collective shape.
    """
    if not callable(func):
        raise TypeError(f"spmd_safe expects a function, got {type(func).__name__}")

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with _spmd_region():
            return func(*args, **kwargs)

    wrapper.__torchtpu_spmd_safe__ = True
    return wrapper
