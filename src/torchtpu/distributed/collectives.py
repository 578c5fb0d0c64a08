"""XLA collectives across the processes of a JAX multi-controller job, on flat device buffers.

A collective takes a tensor's values as a flat 1-D JAX array on this process's device
(process_group.flat_value: a storage's array flattened, which on a TPU is a relayout copy unless the
storage is 1-D). A collective over a group
of processes sees the group's buffers as one global array of shape (G * n,) sharded over a 1-D mesh
of the group's devices (one shard per process, no copy: `make_array_from_single_device_arrays`),
and runs a `shard_map` of `lax.psum` / `all_gather` / `psum_scatter` / `all_to_all` / `ppermute`
over it. On XLA:CPU the bytes move over gloo (`jax_cpu_collectives_implementation`), on a TPU slice
over ICI/DCN; the program is the same.

Each executable is compiled once per (op, static arguments, element count, dtype, group) and kept;
`compiles()` counts the compilations, so tests can check that repeated calls never recompile.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..device import platform
from ..eager import tpu_check

try:
    from jax import shard_map as _shard_map
except ImportError:  # older JAX
    from jax.experimental.shard_map import shard_map as _shard_map

AXIS = "g"
_lock = threading.Lock()
_counts = {"compiles": 0, "calls": 0}


def compiles() -> int:
    """How many collective executables this process has compiled."""
    return _counts["compiles"]


def calls() -> int:
    return _counts["calls"]


def device_of_process(process_index: int):
    """The (first) device owned by JAX process `process_index` (= the torch global rank)."""
    for d in jax.devices():
        if d.process_index == process_index:
            return d
    raise RuntimeError(
        f"torchtpu.distributed: no JAX device belongs to process {process_index} "
        f"(the job has {jax.process_count()} processes)"
    )


# The unsigned integer of each width: broadcast and scatter move bits, so values arrive exactly
# (-0.0, NaN payloads) through an integer sum where every other contribution is zero.
_BITS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _to_bits(x):
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.stack([x.real, x.imag], axis=-1).reshape(-1)
    return lax.bitcast_convert_type(x, _BITS[x.dtype.itemsize])


def _from_bits(b, dtype):
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return b != 0
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = jnp.float32 if dtype == jnp.complex64 else jnp.float64
        r = lax.bitcast_convert_type(b, part).reshape(-1, 2)
        return lax.complex(r[:, 0], r[:, 1])
    return lax.bitcast_convert_type(b, dtype)


def _reduce(x, op, size, axis=AXIS):
    """All-reduce of this shard's x over mesh axis `axis` (the group's) with torch's ReduceOp name
    `op` (compiled graphs name their group's axis; eager collectives use AXIS)."""
    if x.dtype == jnp.bool_:
        # torch reduces bools as bytes: SUM/MAX/BOR are "any", MIN/PRODUCT/BAND "all", BXOR the parity
        b = x.astype(jnp.uint8)
        if op == "BXOR":
            return (lax.psum(b.astype(jnp.int32), axis) & 1) != 0
        return (lax.pmax(b, axis) if op in ("SUM", "MAX", "AVG", "BOR") else lax.pmin(b, axis)) != 0
    if op == "SUM":
        return lax.psum(x, axis)
    if op == "AVG":
        s = lax.psum(x, axis)
        if jnp.issubdtype(x.dtype, jnp.integer):
            return (s // size).astype(x.dtype)
        return (s / size).astype(x.dtype)
    if op in ("MAX", "MIN"):
        if x.dtype.itemsize == 8 and platform.lowering_platform() == "tpu":
            return _extremum_by_words(x, op, axis)
        return lax.pmax(x, axis) if op == "MAX" else lax.pmin(x, axis)
    if op == "PRODUCT":
        # XLA has no product all-reduce: gather the group's shards and multiply them locally
        return jnp.prod(lax.all_gather(x, axis), axis=0).astype(x.dtype)
    if op in ("BAND", "BOR", "BXOR"):
        g = lax.all_gather(x, axis)
        f = {"BAND": jnp.bitwise_and, "BOR": jnp.bitwise_or, "BXOR": jnp.bitwise_xor}[op]
        out = g[0]
        for i in range(1, size):
            out = f(out, g[i])
        return out
    raise ValueError(f"torchtpu.distributed: unsupported reduce op {op}")


_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min


def _extremum_by_words(x, op, axis):
    """MAX/MIN all-reduce of a 64-bit x (int64, uint64, float64) as 32-bit all-reduces, which XLA:TPU
    lowers (it lowers 64-bit all-reduces only as sums): the high words first (signed, or unsigned for
    uint64), then the low words (unsigned) of the ranks whose high word is the extremum; the others
    offer the low word that cannot win. float64 goes through an integer key of the same order."""
    key = _float_order_key(x, op) if jnp.issubdtype(x.dtype, jnp.floating) else x
    signed = key.dtype == jnp.int64
    high = (key >> 32).astype(jnp.int32 if signed else jnp.uint32)
    low = (key & 0xFFFFFFFF).astype(jnp.uint32)
    reduce = lax.pmax if op == "MAX" else lax.pmin
    best_high = reduce(high, axis)
    loser = jnp.uint32(0 if op == "MAX" else 0xFFFFFFFF)
    best_low = reduce(jnp.where(high == best_high, low, loser), axis)
    key = (best_high.astype(key.dtype) << 32) | best_low.astype(key.dtype)
    return _float_of_order_key(key, x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else key


def _float_order_key(x, op):
    """float64 -> int64 whose signed order is the floats' order (-0.0 just below 0.0). A NaN becomes
    the key that wins `op`, so the result is NaN wherever a rank has one, as XLA's max/min give."""
    bits = lax.bitcast_convert_type(x, jnp.int64)
    key = jnp.where(bits < 0, bits ^ _INT64_MAX, bits)  # negative floats: larger magnitude, smaller key
    return jnp.where(jnp.isnan(x), jnp.int64(_INT64_MAX if op == "MAX" else _INT64_MIN), key)


def _float_of_order_key(key, dtype):
    return lax.bitcast_convert_type(jnp.where(key < 0, key ^ _INT64_MAX, key), dtype)


def _body(kind, static, size, axis=AXIS):
    """The per-shard function of collective `kind` over mesh axis `axis` (x is this process's flat
    buffer; all_gather and reduce_scatter also take any shape, working on dim 0)."""
    if kind == "all_reduce":
        (op,) = static
        return lambda x: _reduce(x, op, size, axis)
    if kind == "all_gather":
        return lambda x: lax.all_gather(x, axis, tiled=True)
    if kind == "reduce_scatter":
        (op,) = static

        def rs(x):
            n = x.shape[0] // size
            if op == "SUM" and _scatter_lowers(x.dtype):
                return lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True)
            if op == "AVG" and jnp.issubdtype(x.dtype, jnp.inexact) and _scatter_lowers(x.dtype):
                return (lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True) / size).astype(x.dtype)
            # other reductions: reduce everything, keep this rank's block
            full = _reduce(x, op, size, axis)
            return lax.dynamic_slice_in_dim(full, lax.axis_index(axis) * n, n)

        return rs
    if kind == "broadcast":
        (src,) = static

        def bc(x):
            b = _to_bits(x)
            b = jnp.where(lax.axis_index(axis) == src, b, jnp.zeros_like(b))
            return _from_bits(lax.psum(b, axis), x.dtype)

        return bc
    if kind == "scatter":
        (src,) = static

        def sc(x):  # x: src's G blocks (others: anything of the same size)
            b = _to_bits(x)
            b = jnp.where(lax.axis_index(axis) == src, b, jnp.zeros_like(b))
            return _from_bits(lax.psum_scatter(b, axis, scatter_dimension=0, tiled=True), x.dtype)

        return sc
    if kind == "all_to_all":

        def a2a(x):
            return lax.all_to_all(x.reshape(size, -1), axis, 0, 0, tiled=True).reshape(-1)

        return a2a
    if kind == "permute":
        (pairs,) = static
        return lambda x: lax.ppermute(x, axis, perm=list(pairs))
    raise ValueError(kind)


def _scatter_lowers(dtype):
    """Whether a sum reduce-scatter of `dtype` lowers on the platform traced for: XLA:TPU has none for
    float64 and complex types (the all-reduce and a slice do it there)."""
    if dtype == jnp.bool_:
        return False
    if platform.lowering_platform() != "tpu":
        return True
    return dtype != jnp.float64 and not jnp.issubdtype(dtype, jnp.complexfloating)


class GroupMesh:
    """The devices of one process group, in group-rank order, and its compiled collectives."""

    def __init__(self, global_ranks):
        self.ranks = tuple(int(r) for r in global_ranks)
        self.size = len(self.ranks)
        me = jax.process_index()
        if me not in self.ranks:
            raise RuntimeError(f"torchtpu.distributed: process {me} is not in group {self.ranks}")
        self.devices = [device_of_process(r) for r in self.ranks]
        self.local_device = self.devices[self.ranks.index(me)]
        self.mesh = Mesh(np.array(self.devices, dtype=object), (AXIS,))
        self.sharding = NamedSharding(self.mesh, P(AXIS))
        self._executables = {}

    def executable(self, kind, static, n, dtype):
        """The compiled collective for a shard of n elements of JAX dtype `dtype`."""
        key = (kind, static, n, dtype)
        exe = self._executables.get(key)
        if exe is None:
            with _lock:
                exe = self._executables.get(key)
                if exe is None:
                    check = {"check_vma": False} if _has_check_vma() else {"check_rep": False}
                    fn = _shard_map(
                        _body(kind, static, self.size), mesh=self.mesh, in_specs=P(AXIS), out_specs=P(AXIS), **check
                    )
                    aval = jax.ShapeDtypeStruct((self.size * n,), dtype, sharding=self.sharding)
                    exe = jax.jit(fn).lower(aval).compile()
                    tpu_check.check(jax.jit(fn), (aval,), f"collective {kind} of {n} x {dtype} over ranks {self.ranks}")
                    self._executables[key] = exe
                    _counts["compiles"] += 1
        return exe

    def run(self, kind, static, local, timeout_s=None):
        """Run collective `kind` on this process's flat buffer `local`; this process's flat result.
        Raises RuntimeError if it has not started within `timeout_s` seconds (see _call)."""
        n = local.shape[0]
        exe = self.executable(kind, static, n, local.dtype)
        if local.devices() != {self.local_device}:
            local = jax.device_put(local, self.local_device)
        g = jax.make_array_from_single_device_arrays((self.size * n,), self.sharding, [local])
        _counts["calls"] += 1
        try:
            out = _call(exe, g, timeout_s)
        except concurrent.futures.TimeoutError:
            raise RuntimeError(
                f"torchtpu.distributed: {kind} over ranks {list(self.ranks)} did not complete within "
                f"{timeout_s:.1f} s (the process group's timeout): a rank may have died, not joined, or "
                "issued a different collective"
            ) from None
        except Exception as e:
            raise RuntimeError(
                f"torchtpu.distributed: {kind} over ranks {list(self.ranks)} failed (a rank "
                f"may have died or left the job): {e}"
            ) from e
        return out.addressable_data(0)


# XLA:CPU runs a collective inside the call that launches it (the call returns when the peers have
# taken part), so a peer that never arrives would block the caller forever, past any timeout. There
# the call goes to one daemon thread (one, so collectives keep their order) and the caller waits for
# it with the group's timeout. On TPU/GPU a launch returns at once and Work.wait polls readiness.
_queue = None


def _collective_thread():
    while True:
        fut, exe, args = _queue.get()
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            fut.set_result(exe(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
            fut.set_exception(e)


def _call(exe, arg, timeout_s):
    return call_bounded(exe, (arg,), timeout_s, arg.sharding.mesh.devices.flat[0].platform)


def call_bounded(exe, args, timeout_s, platform_name):
    """`exe(*args)` for an executable containing collectives; on XLA:CPU on the collective thread,
    raising concurrent.futures.TimeoutError when it has not completed within `timeout_s` seconds.
    Eager collectives and compiled graphs share the thread, so their collectives keep their order."""
    global _queue
    if not timeout_s or platform_name != "cpu":
        return exe(*args)
    if _queue is None:
        with _lock:
            if _queue is None:
                _queue = queue.SimpleQueue()
                threading.Thread(target=_collective_thread, name="torchtpu-collectives", daemon=True).start()
    fut = concurrent.futures.Future()
    _queue.put((fut, exe, args))
    return fut.result(timeout_s)


_has_vma = []


def _has_check_vma():
    if not _has_vma:
        import inspect

        try:
            _has_vma.append("check_vma" in inspect.signature(_shard_map).parameters)
        except (TypeError, ValueError):
            _has_vma.append(False)
    return _has_vma[0]
