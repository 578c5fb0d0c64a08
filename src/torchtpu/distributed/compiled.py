"""Functional collectives inside compiled graphs: one SPMD executable over the process mesh.

`torch.compile(backend="tpu")` hands the backend graphs in which DTensor, FSDP2 and user code have
put `_c10d_functional.*` ops (all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
all_to_all_single, broadcast, their coalesced forms, wait_tensor). `place(gm)`, registered with the
compile layer (`compile.register_graph_placer`), takes such a graph over:

- the graph's groups (group name -> global ranks) become the axes of one JAX `Mesh` of the ranks'
  devices: one axis for a graph over one group; for several groups (the dimensions of a 2-D
  `DeviceMesh`) an N-D mesh in which each group is the line through this process along one axis;
- the executable builder's function (eager/executable.py, the same one every compiled graph uses)
  runs inside a `shard_map` over that mesh: every argument and result is this process's shard of a
  global array whose leading dimension is split over all mesh axes (flat buffers as they are,
  scalars as one element per process), so each process passes and gets back its local arrays;
- inside, the functional collectives lower to `lax.psum` / `pmax` / `pmin` / `all_gather` /
  `psum_scatter` / `all_to_all` over the group's axis (collectives.py's bodies, the same as the
  eager collectives); `wait_tensor` is the identity: XLA orders the collective itself.

Every process compiles the same program. Before the first run of a new executable, the ranks of
each group compare a digest of the collectives it traced (kind, reduce op, shape, dtype, axis) and
of the mesh through the c10d store, so a rank that traced something else raises a clear error
instead of hanging XLA; on XLA:CPU the run goes through the collective thread with the group's
timeout, as eager collectives do (collectives.call_bounded).

all_to_all_single with split sizes (constants of the graph; one rank's may be even while another's
are not) pads every block to one size the group's ranks agree on when the executable is built (one
eager all-reduce MAX), exchanges, unpads; where this rank's blocks already have that size it
exchanges them as they are.

What falls back to the op-by-op eager graph (with the compile layer's warning): a group whose
backend is not tpu_dist, groups that are not the axes of one mesh, unsupported reduce ops.
all_to_all_single with symbolic splits raises (a data-dependent shape, as elsewhere in compile).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import threading

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.distributed as dist
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..eager import tpu_check
from ..ops.graph import GRAPH_LOWERINGS
from ..ops.resolve import NotLowered
from . import collectives

NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")
_REDUCE = {
    "sum": "SUM",
    "avg": "AVG",
    "max": "MAX",
    "min": "MIN",
    "product": "PRODUCT",
    "band": "BAND",
    "bor": "BOR",
    "bxor": "BXOR",
}
_counts = {"compiles": 0, "calls": 0}
_tracing = threading.local()


def compiles() -> int:
    """How many SPMD graph executables (compiled graphs with collectives) this process compiled."""
    return _counts["compiles"]


def calls() -> int:
    """How many times this process ran one."""
    return _counts["calls"]


# ------------------------------------------------------------------ the placer
def place(gm):
    """The placement of FX graph `gm` if it has functional collectives, else None. Raises NotLowered
    (the graph then runs op by op on the device) for what one SPMD program cannot express."""
    nodes = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target.namespace in NAMESPACES
    ]
    if not nodes:
        return None
    _install_lowerings()
    names = []
    blocks = {}  # group name -> the largest block (rows) of its all_to_all_singles with given splits
    for n in nodes:
        short = n.target._schema.name.split("::")[1]
        if short not in _LOWERINGS:
            raise NotLowered(f"torchtpu.distributed: {n.target} has no lowering in compiled graphs")
        args = _named_args(n)
        op = args.get("reduce_op")
        if op is not None and op.lower() not in _REDUCE:
            raise NotLowered(f"torchtpu.distributed: reduce op {op!r} of {n.target} is not supported on tpu")
        if short == "all_to_all_single":
            splits = list(args["output_split_sizes"] or []) + list(args["input_split_sizes"] or [])
            if any(type(s) is not int for s in splits):
                raise NotLowered(
                    "torchtpu.distributed: all_to_all_single with data-dependent (symbolic) splits "
                    "cannot be one static XLA program"
                )
            if splits:  # this rank's splits may be even while another's are not: all ranks agree (Placement)
                name = args["group_name"]
                blocks[name] = max(blocks.get(name, 0), *splits)
        if "group_name" in args and args["group_name"] not in names:
            names.append(args["group_name"])
    return Placement(names, blocks)


def _named_args(node):
    schema = node.target._schema
    out = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    out.update({a.name: v for a, v in zip(schema.arguments, node.args)})
    out.update(node.kwargs)
    return out


def _tpu_group(name):
    """The tpu_dist backend of the process group called `name`, or None."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    from .process_group import TpuProcessGroup

    pg = _resolve_process_group(name)
    if isinstance(pg, TpuProcessGroup):
        return pg, pg
    try:
        backend = pg._get_backend(torch.device("tpu"))
    except RuntimeError:  # c10d's "No backend type associated with device type tpu": not a tpu group
        return pg, None
    return pg, backend if isinstance(backend, TpuProcessGroup) else None


class Placement:
    """A graph's process mesh: group name -> (mesh axis, group size); compiles the SPMD executable."""

    def __init__(self, group_names, local_blocks=None):
        self.local_blocks = dict(local_blocks or {})
        self.blocks = {}  # group name -> block (rows) its all_to_alls pad to, agreed per build
        self.groups = {}  # group name -> (axis name, size)
        self.backends = []  # one TpuProcessGroup per distinct group: signature checks, timeouts
        lines = []  # distinct groups' global ranks, in group-rank order
        for name in group_names:
            pg, backend = _tpu_group(name)
            if backend is None:
                raise NotLowered(
                    f"torchtpu.distributed: process group {name!r} of a compiled graph has no "
                    "tpu_dist backend; its collectives cannot be lowered into the executable"
                )
            ranks = tuple(dist.get_process_group_ranks(pg))
            if ranks not in lines:
                lines.append(ranks)
                self.backends.append(backend)
            self.groups[name] = (f"g{lines.index(ranks)}", len(ranks))
        self.grid, self.axis_names = _mesh_grid(lines)
        self.mesh = Mesh(np.vectorize(collectives.device_of_process, otypes=[object])(self.grid), self.axis_names)
        self.size = self.grid.size
        # a world of one has no peer to wait for: no hand-off to the collective thread
        self.timeout_s = max(b._timeout_s for b in self.backends) if self.grid.size > 1 else 0.0
        self.local_device = collectives.device_of_process(jax.process_index())

    def axis(self, group_name):
        try:
            return self.groups[group_name]
        except KeyError:
            raise RuntimeError(
                f"torchtpu.distributed: group {group_name!r} is not one this graph was "
                f"placed for ({sorted(self.groups)})"
            ) from None

    def compile(self, traced, sample, xla, name="compiled graph"):
        """(call, lowered): `traced` (this process's buffers and values -> results) as one SPMD
        executable over the mesh, and the function that calls it with this process's arrays."""
        spec = P(self.axis_names)  # the leading dimension split over every mesh axis
        sharding = NamedSharding(self.mesh, spec)
        G = self.size
        scalar_in = [len(s.shape) == 0 for s in sample]
        scalar_out = []

        def body(*dyn):
            outs = traced(*[d.reshape(()) if sc else d for d, sc in zip(dyn, scalar_in)])
            scalar_out[:] = [jnp.ndim(o) == 0 for o in outs]
            return tuple(jnp.reshape(o, (1,)) if jnp.ndim(o) == 0 else o for o in outs)

        check = {"check_vma": False} if collectives._has_check_vma() else {"check_rep": False}
        fn = collectives._shard_map(body, mesh=self.mesh, in_specs=(spec,) * len(sample), out_specs=spec, **check)
        local_shapes = [(1,) if sc else tuple(s.shape) for s, sc in zip(sample, scalar_in)]
        global_sample = [
            jax.ShapeDtypeStruct(
                (G * shp[0],) + shp[1:], s.dtype, sharding=sharding, weak_type=getattr(s, "weak_type", False)
            )
            for s, shp in zip(sample, local_shapes)
        ]
        self.blocks = {name: self._agreed_block(name, rows) for name, rows in self.local_blocks.items()}
        _tracing.plan, _tracing.log = self, []
        try:
            lowered = jax.jit(fn).lower(*global_sample)
            traced_collectives = tuple(_tracing.log)
        finally:
            _tracing.plan = _tracing.log = None
        self._agree(traced_collectives)
        exe = lowered.compile(xla)
        _counts["compiles"] += 1
        if tpu_check.enabled():  # the same SPMD program, traced and compiled for the TPU topology
            _tracing.plan, _tracing.log = self, []
            try:
                tpu_check.check(jax.jit(fn), global_sample, f"{name} over ranks {self.grid.reshape(-1).tolist()}")
            finally:
                _tracing.plan = _tracing.log = None
        dtypes = [s.dtype for s in sample]
        globals_of = [(G * shp[0],) + shp[1:] for shp in local_shapes]
        device, timeout_s, platform_name = self.local_device, self.timeout_s, self.local_device.platform
        where = f"compiled graph over ranks {self.grid.reshape(-1).tolist()}"

        def call(*dyn):
            args = [
                jax.make_array_from_single_device_arrays(g, sharding, [_local(d, shp, dtype, device)])
                for d, g, shp, dtype in zip(dyn, globals_of, local_shapes, dtypes)
            ]
            _counts["calls"] += 1
            try:
                outs = collectives.call_bounded(exe, args, timeout_s, platform_name)
            except concurrent.futures.TimeoutError:
                raise RuntimeError(
                    f"torchtpu.distributed: {where} did not complete within {timeout_s:.1f} s (the process "
                    "group's timeout): a rank may have died, not joined, or run a different graph"
                ) from None
            return [
                o.addressable_data(0).reshape(()) if sc else o.addressable_data(0) for o, sc in zip(outs, scalar_out)
            ]

        return call, lowered

    def _agreed_block(self, name, rows):
        """The block size (rows) every rank of group `name` pads its all_to_all blocks to: the largest
        block of any rank (one eager all-reduce MAX at build time, as all ranks build the graph
        together; the splits are constants of the graph, so new splits mean a new build anyway)."""
        _, backend = _tpu_group(name)
        local = jax.device_put(np.array([rows], np.int64), self.local_device)
        return int(np.asarray(backend._run("all_reduce", ("MAX",), local, torch.int64))[0])

    def _agree(self, traced_collectives):
        """Every rank of every group must have traced the same collectives on the same mesh."""
        digest = hashlib.sha1(repr((self.grid.tolist(), self.axis_names, traced_collectives)).encode())
        sig = ("compiled_graph", len(traced_collectives), digest.hexdigest()[:16])
        for backend in self.backends:
            backend._check_signature(sig)


def _local(d, shape, dtype, device):
    """Argument `d` (a device buffer, a host scalar, a host or device array) as an array of `shape`
    on this process's device."""
    if isinstance(d, jax.Array):
        if d.shape != shape:
            d = d.reshape(shape)
        if d.dtype != dtype:
            d = d.astype(dtype)
        return d if d.devices() == {device} else jax.device_put(d, device)
    return jax.device_put(np.asarray(d, dtype).reshape(shape), device)


def _mesh_grid(lines):
    """(ranks grid, axis names): the N-D arrangement of global ranks in which each of `lines` (the
    graph's distinct groups, this process in each) is the line through this process along one axis.
    Every process computes the same grid when the groups are the dimensions of one DeviceMesh (ranks
    in arithmetic progression, as init_device_mesh lays them out); ranks of other layouts raise."""
    if len(lines) == 1:
        return np.array(lines[0], dtype=np.int64), ("g0",)
    me = jax.process_index()
    axes = []
    for i, ranks in enumerate(lines):
        stride = ranks[1] - ranks[0] if len(ranks) > 1 else 0
        if any(r != ranks[0] + j * stride for j, r in enumerate(ranks)):
            raise NotLowered(
                f"torchtpu.distributed: the ranks {list(ranks)} of a compiled graph's group are not "
                "evenly spaced, so its groups are not the dimensions of one device mesh"
            )
        axes.append((abs(stride), stride, ranks.index(me), len(ranks), f"g{i}"))
    axes.sort(key=lambda a: -a[0])  # outer dimension first: the same order on every process
    origin = me - sum(stride * pos for _, stride, pos, _, _ in axes)
    grid = np.full(tuple(a[3] for a in axes), origin, np.int64)
    for d, (_, stride, _, n, _) in enumerate(axes):
        shape = [1] * len(axes)
        shape[d] = n
        grid = grid + (np.arange(n) * stride).reshape(shape)
    if len(set(grid.reshape(-1).tolist())) != grid.size or grid.min() < 0 or grid.max() >= jax.process_count():
        raise NotLowered(
            f"torchtpu.distributed: the groups {[list(r) for r in lines]} of a compiled graph are "
            "not the dimensions of one device mesh"
        )
    return grid, tuple(a[4] for a in axes)


# ------------------------------------------------------------------ lowerings (inside the shard_map)
def _group(group_name, kind, x, *static):
    plan = getattr(_tracing, "plan", None)
    if plan is None:
        raise RuntimeError(
            f"torchtpu.distributed: functional collective {kind} outside a compiled graph's process mesh"
        )
    axis, size = plan.axis(group_name)
    _tracing.log.append((kind, static, tuple(x.shape), str(x.dtype), axis))
    return axis, size


def _check_size(group_size, size, kind):
    if group_size != size:
        raise ValueError(f"torchtpu.distributed: {kind}: group_size {group_size} but the group has {size} ranks")


def _all_reduce(val, x, reduce_op, group_name):
    op = _REDUCE[reduce_op.lower()]
    axis, size = _group(group_name, "all_reduce", x, op)
    return collectives._reduce(x, op, size, axis)


def _all_gather(val, x, group_size, group_name):
    axis, size = _group(group_name, "all_gather", x)
    _check_size(group_size, size, "all_gather_into_tensor")
    return lax.all_gather(x.reshape(1) if x.ndim == 0 else x, axis, axis=0, tiled=True)


def _reduce_scatter(val, x, reduce_op, group_size, group_name):
    op = _REDUCE[reduce_op.lower()]
    axis, size = _group(group_name, "reduce_scatter", x, op)
    _check_size(group_size, size, "reduce_scatter_tensor")
    return collectives._body("reduce_scatter", (op,), size, axis)(x)


def _all_to_all(val, x, output_split_sizes, input_split_sizes, group_name):
    plan = _tracing.plan
    m = plan.blocks.get(group_name) if plan is not None else None
    if m is None or (set(input_split_sizes) | set(output_split_sizes)) == {m}:
        # even splits of the agreed block (or none given: even): block j of dim 0 goes to rank j
        axis, size = _group(group_name, "all_to_all", x)
        return collectives._body("all_to_all", (), size, axis)(x.reshape(-1)).reshape(x.shape)
    # uneven: pad every block to the group's agreed block size m, exchange, drop the padding (the
    # split sizes are constants of the graph, so the packing and unpacking are static gathers)
    size = plan.axis(group_name)[1]
    rows_in = list(input_split_sizes) or [x.shape[0] // size] * size
    rows_out = list(output_split_sizes) or [val.shape[0] // size] * size
    rest = tuple(x.shape[1:])
    src = np.full(size * m, -1, np.int64)
    start = 0
    for j, c in enumerate(rows_in):
        src[j * m : j * m + c] = np.arange(start, start + c)
        start += c
    if x.shape[0]:
        valid = jnp.asarray(src >= 0).reshape((-1,) + (1,) * len(rest))
        packed = jnp.where(valid, x[np.clip(src, 0, x.shape[0] - 1)], jnp.zeros((), x.dtype))
    else:
        packed = jnp.zeros((size * m,) + rest, x.dtype)
    axis, size = _group(group_name, "all_to_all", packed)
    got = collectives._body("all_to_all", (), size, axis)(packed.reshape(-1)).reshape((size * m,) + rest)
    dst = np.concatenate([np.arange(j * m, j * m + c) for j, c in enumerate(rows_out)] + [np.zeros(0, np.int64)])
    return got[dst.astype(np.int64)]


def _broadcast(val, x, src, group_name):
    axis, size = _group(group_name, "broadcast", x, src)
    return collectives._body("broadcast", (int(src),), size, axis)(x.reshape(-1)).reshape(x.shape)


def _coalesced(single):
    def lowering(val, xs, *rest):
        return [single(None, x, *rest) for x in xs]

    return lowering


def _wait(val, x):
    return x  # XLA orders the collective that produced x before its uses


_LOWERINGS = {
    "all_reduce": _all_reduce,
    "all_reduce_coalesced": _coalesced(_all_reduce),
    "all_gather_into_tensor": _all_gather,
    "all_gather_into_tensor_coalesced": _coalesced(_all_gather),
    "reduce_scatter_tensor": _reduce_scatter,
    "reduce_scatter_tensor_coalesced": _coalesced(_reduce_scatter),
    "all_to_all_single": _all_to_all,
    "broadcast": _broadcast,
    "wait_tensor": _wait,
}


def _install_lowerings():
    for ns in NAMESPACES:
        for name, fn in _LOWERINGS.items():
            GRAPH_LOWERINGS.setdefault(f"{ns}.{name}.default", fn)
