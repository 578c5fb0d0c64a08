"""The `tpu_dist` process group: torch.distributed's API on XLA collectives (collectives.py).

A Python `ProcessGroup` (PyTorch's extension point for process groups written in Python; DDP's C++
reducer and the c10d Python API call its methods). tpu tensors go through XLA collectives on their
device buffers, never through the host. CPU tensors given to the same group (object collectives,
`"cpu:gloo,tpu:tpu_dist"`) go to a gloo group created on first use over the same store.
"""

from __future__ import annotations

import datetime
import logging
import time

import torch
import torch.distributed as dist
from torch.futures import Future

from ..device import platform
from ..ops import dtypes
from ..storage import records
from . import api, collectives

_log = logging.getLogger("torchtpu.distributed")

_RED = {
    dist.ReduceOp.SUM: "SUM",
    dist.ReduceOp.AVG: "AVG",
    dist.ReduceOp.MAX: "MAX",
    dist.ReduceOp.MIN: "MIN",
    dist.ReduceOp.PRODUCT: "PRODUCT",
    dist.ReduceOp.BAND: "BAND",
    dist.ReduceOp.BOR: "BOR",
    dist.ReduceOp.BXOR: "BXOR",
}


def _op_name(reduce_op, dtype) -> str:
    """torch's ReduceOp as collectives' name, for tensors of `dtype`; the combinations gloo refuses
    raise its RuntimeError (a bitwise op of floats, an average of integers)."""
    op = getattr(reduce_op, "op", reduce_op)
    name = _RED.get(op)
    if name is None:
        raise ValueError(
            f"torchtpu.distributed: reduce op {op} is not supported on tpu (supported: {', '.join(_RED.values())})"
        )
    if name in ("BAND", "BOR", "BXOR") and (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(f"torchtpu.distributed: cannot use ReduceOp.{name} with non-integral dtype {dtype}")
    if name == "AVG" and not (dtype.is_floating_point or dtype.is_complex):
        raise RuntimeError(
            f"torchtpu.distributed: cannot use ReduceOp.AVG with integral dtype {dtype}: the average is not "
            "an integer (gloo refuses it too)"
        )
    return name


# ------------------------------------------------------------------ device buffers of tensors
def flat_value(t: torch.Tensor):
    """The values of tpu tensor `t` as a flat JAX array on its device, in row-major order."""
    r = records.record_of(t)
    if not records.covers(t, r):
        t = t.clone(memory_format=torch.contiguous_format)
        r = records.record_of(t)
    buf = r.buffer
    if buf is None:  # never written (torch.empty): any value is right, zeros are cheapest
        import jax
        import jax.numpy as jnp

        buf = jax.device_put(jnp.zeros((t.numel(),), dtypes.storage_jax(t.dtype)), platform.jax_device(r.device_index))
    return buf.reshape(-1) if buf.ndim != 1 else buf  # (a storage's array has its tensor's shape)


def assign(t: torch.Tensor, flat) -> torch.Tensor:
    """Give tpu tensor `t` the values of flat JAX array `flat` (same element count and dtype)."""
    r = records.record_of(t)
    if records.covers(t, r):
        records.set_buffer(r, flat)
    else:
        with torch.no_grad():
            t.copy_(records.new_tensor(tuple(t.shape), t.dtype, r.device_index, flat))
    return t


def _reduced(t: torch.Tensor) -> torch.Tensor:
    """The tensor a reduction works on: a complex32 tensor's storage holds float16 pairs as uint32
    (ops/dtypes.py), so it reduces its `view_as_real` (as ProcessGroupNCCL reduces complex tensors)."""
    return torch.view_as_real(t) if t.dtype == torch.complex32 else t


def _is_tpu(tensors) -> bool:
    kinds = {t.device.type for t in tensors}
    if kinds == {"tpu"}:
        return True
    if "tpu" in kinds:
        raise ValueError(
            f"torchtpu.distributed: tensors of one collective must all be on tpu or all "
            f"on the CPU, got devices {sorted(str(t.device) for t in tensors)}"
        )
    return False


def _check_dense(tensors):
    for t in tensors:
        if t.is_sparse:
            raise ValueError("torchtpu.distributed: sparse tensors are not supported on tpu")


# ------------------------------------------------------------------ work objects
class TpuWork(dist.Work):
    """A collective in flight: its results are JAX arrays computed asynchronously.
    `wait()` blocks until they are ready or the group's timeout passes (then raises)."""

    def __init__(self, arrays, result, timeout, what):
        super().__init__()
        self._arrays = arrays
        self._result = result
        self._timeout = timeout
        self._what = what
        self._done = not arrays

    def is_completed(self):
        if not self._done:
            self._done = all(a.is_ready() for a in self._arrays)
        return self._done

    def is_success(self):
        return self.is_completed()

    def exception(self):
        return None

    def wait(self, timeout=None):
        if self._done:
            return True
        limit = _seconds(timeout) or self._timeout
        start = time.monotonic()
        deadline = start + limit
        # A blocking wait on the arrays could not time out; poll instead: yield the GIL (not sleep)
        # for the first milliseconds, where collectives finish, then sleep in short steps.
        while not self.is_completed():
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(
                    f"torchtpu.distributed: {self._what} did not complete within {limit:.1f} s (the "
                    "process group's timeout): a rank may have died, not joined, or issued a "
                    "different collective"
                )
            time.sleep(0 if now - start < 0.02 else 5e-4)
        self._arrays = ()
        return True

    def get_future(self):
        fut = Future()
        fut.set_result(self._result)
        return fut

    def result(self):
        return self._result


def _seconds(timeout):
    if timeout is None:
        return 0.0
    if isinstance(timeout, datetime.timedelta):
        s = timeout.total_seconds()
    else:  # milliseconds, as C++ passes it
        s = float(timeout) / 1000.0
    return s if s > 0 else 0.0


# ------------------------------------------------------------------ the process group
class TpuProcessGroup(dist.ProcessGroup):
    """Process group of backend `tpu_dist` over ranks `global_ranks` (one JAX process each)."""

    def __init__(self, store, rank, size, timeout, global_ranks=None, group_name=""):
        super().__init__(rank, size)
        self._store = store
        self._timeout_s = _seconds(timeout) or 1800.0
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        self._mesh = None
        self._gloo = None
        self._pair_meshes = {}
        self._checked = set()
        self._checks = 0
        self._sig_prefix = None  # this incarnation's store namespace for the checks (_check_signature)
        self._group_name = group_name
        self._group_desc = ""

    # names and plumbing -------------------------------------------------------
    def getBackendName(self):
        return "tpu_dist"

    def _get_backend_name(self):
        return "tpu_dist"

    # PyTorch keeps a group's name and description in its C++ backends, which a Python group has
    # none of: keep them here (DeviceMesh and functional collectives look groups up by name)
    def _set_group_name(self, name):
        self._group_name = name

    def getGroupName(self):
        return self._group_name

    @property
    def group_name(self):
        return self._group_name

    def _set_group_desc(self, desc):
        self._group_desc = desc

    def getGroupDesc(self):
        return self._group_desc

    @property
    def group_desc(self):
        return self._group_desc

    @property
    def global_ranks(self):
        return list(self._global_ranks)

    def mesh(self) -> collectives.GroupMesh:
        if self._mesh is None:
            self._mesh = collectives.GroupMesh(self._global_ranks)
        return self._mesh

    def _cpu_group(self):
        """gloo over the same store, for CPU tensors given to this group."""
        if self._gloo is None:
            self._gloo = dist.ProcessGroupGloo(
                dist.PrefixStore("cpu_gloo/", self._store),
                self.rank(),
                self.size(),
                datetime.timedelta(seconds=self._timeout_s),
            )
        return self._gloo

    def _work(self, arrays, result, what):
        return TpuWork(arrays, result, self._timeout_s, what)

    def _check_signature(self, sig):
        """Before a collective first runs with new shapes, check that every rank calls the same one:
        a mismatch (different shapes or dtypes across ranks) raises here instead of corrupting or
        hanging the XLA collective. Later calls with these shapes skip the check (it costs a store
        round trip).

        The keys live in a namespace of their own per incarnation of the group: the store can outlive
        the group (env:// hands out a multi-tenant TCPStore, and a new one on the same port reuses the
        server while the old group's store is alive), so after destroy_process_group and a new
        init_process_group the previous group's `torchtpu_sig/1/r`... are still there and a rank would
        read another rank's old signature. Each rank counts the incarnations that checked a collective
        in its own store key; every rank of a group creates its incarnations in the same order and
        checks the first collective of each, so the counts agree."""
        if sig in self._checked or self.size() == 1 or api.in_spmd_safe():
            return
        if self._sig_prefix is None:
            self._sig_prefix = f"torchtpu_sig/{self._store.add(f'torchtpu_sig_incarnation/{self.rank()}', 1)}"
        self._checks += 1
        key = f"{self._sig_prefix}/{self._checks}"
        self._store.set(f"{key}/{self.rank()}", repr(sig))
        keys = [f"{key}/{r}" for r in range(self.size())]
        try:
            self._store.wait(keys, datetime.timedelta(seconds=self._timeout_s))
        except Exception as e:  # noqa: BLE001 - the store's timeout error, reworded
            raise RuntimeError(
                f"torchtpu.distributed: rank {self.rank()} waited {self._timeout_s:.0f} s for the other "
                f"ranks of its group to enter collective {sig[0]} (a rank died, did not join, or "
                f"issued a different collective): {e}"
            ) from None
        mine = repr(sig)
        for r in range(self.size()):
            other = self._store.get(f"{key}/{r}").decode()
            if other != mine:
                raise RuntimeError(
                    f"torchtpu.distributed: mismatched collective: rank {self.rank()} called {mine} "
                    f"but rank {r} called {other} (collective, element count, dtype must agree)"
                )
        self._checked.add(sig)

    def _run(self, kind, static, tensor_or_flat, dtype=None):
        flat = tensor_or_flat if dtype is not None else flat_value(tensor_or_flat)
        dtype = dtype if dtype is not None else tensor_or_flat.dtype
        self._check_signature((kind, static, int(flat.shape[0]), str(dtype)))
        return self.mesh().run(kind, static, flat, self._timeout_s)

    # collectives ---------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        if not _is_tpu(tensors):
            return self._cpu_group().allreduce(tensors, opts)
        _check_dense(tensors)
        ops = [_op_name(opts.reduceOp, t.dtype) for t in tensors]  # every tensor's op checked before any runs
        outs = []
        for t, op in zip(map(_reduced, tensors), ops):
            if t.numel():
                out = self._run("all_reduce", (op,), t)
                assign(t, out)
                outs.append(out)
        return self._work(outs, list(tensors), "all_reduce")

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        if not _is_tpu(tensors):
            return self._cpu_group().allreduce_coalesced(tensors, opts)
        o = dist.AllreduceOptions()
        o.reduceOp = opts.reduceOp
        return self.allreduce(tensors, o)

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        if not _is_tpu(tensors):
            return self._cpu_group().broadcast(tensors, opts)
        outs = []
        for t in tensors:
            if t.numel():
                out = self._run("broadcast", (int(opts.rootRank),), t)
                if self.rank() != opts.rootRank:
                    assign(t, out)
                outs.append(out)
        return self._work(outs, list(tensors), "broadcast")

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        if not _is_tpu(tensors):
            return self._cpu_group().reduce(tensors, opts)
        ops = [_op_name(opts.reduceOp, t.dtype) for t in tensors]  # every tensor's op checked before any runs
        outs = []
        for t, op in zip(map(_reduced, tensors), ops):
            if t.numel():
                out = self._run("all_reduce", (op,), t)
                if self.rank() == opts.rootRank:
                    assign(t, out)
                outs.append(out)
        return self._work(outs, list(tensors), "reduce")

    def all_gather_single(self, output, input, opts=None):
        if not _is_tpu([output, input]):
            return self._cpu_group()._allgather_base(output, input, opts or dist.AllgatherOptions())
        self._check_sizes(
            output.numel(),
            input.numel() * self.size(),
            "all_gather_into_tensor",
            "output",
            "input x world size",
            output.dtype,
            input.dtype,
        )
        if input.numel() == 0:
            return self._work([], output, "all_gather_into_tensor")
        out = self._run("all_gather", (), input)
        assign(output, out)
        return self._work([out], output, "all_gather_into_tensor")

    _allgather_base = all_gather_single

    def allgather(self, output_lists, inputs, opts=None):
        if not _is_tpu(list(inputs) + [t for lst in output_lists for t in lst]):
            return self._cpu_group().allgather(output_lists, inputs, opts or dist.AllgatherOptions())
        outs = []
        for outputs, t in zip(output_lists, inputs):
            if len(outputs) != self.size():
                raise ValueError(
                    f"torchtpu.distributed: all_gather needs {self.size()} output tensors, got {len(outputs)}"
                )
            for o in outputs:
                self._check_sizes(o.numel(), t.numel(), "all_gather", "each output", "input", o.dtype, t.dtype)
            if t.numel() == 0:
                continue
            out = self._run("all_gather", (), t)
            n = t.numel()
            for i, o in enumerate(outputs):
                assign(o, _slice(out, i * n, n))
            outs.append(out)
        return self._work(outs, output_lists, "all_gather")

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._work([a for w in works for a in w._arrays], outputs, "all_gather_into_tensor_coalesced")

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        return self.allgather(output_lists, inputs, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        if not _is_tpu([output, input]):
            return self._cpu_group()._reduce_scatter_base(output, input, opts)
        self._check_sizes(
            input.numel(),
            output.numel() * self.size(),
            "reduce_scatter_tensor",
            "input",
            "output x world size",
            input.dtype,
            output.dtype,
        )
        if output.numel() == 0:
            return self._work([], output, "reduce_scatter_tensor")
        out = self._run("reduce_scatter", (_op_name(opts.reduceOp, input.dtype),), _reduced(input))
        assign(_reduced(output), out)
        return self._work([out], output, "reduce_scatter_tensor")

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        if not _is_tpu(list(outputs) + [t for lst in input_lists for t in lst]):
            return self._cpu_group().reduce_scatter(outputs, input_lists, opts)
        outs = []
        for o, inputs in zip(outputs, input_lists):
            if len(inputs) != self.size():
                raise ValueError(
                    f"torchtpu.distributed: reduce_scatter needs {self.size()} input tensors, got {len(inputs)}"
                )
            for i in inputs:
                self._check_sizes(i.numel(), o.numel(), "reduce_scatter", "each input", "output", i.dtype, o.dtype)
            if o.numel() == 0:
                continue
            flat = _concat([flat_value(_reduced(i)) for i in inputs])
            op = _op_name(opts.reduceOp, o.dtype)
            out = self._run("reduce_scatter", (op,), flat, _reduced(o).dtype)
            assign(_reduced(o), out)
            outs.append(out)
        return self._work(outs, outputs, "reduce_scatter")

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._work([a for w in works for a in w._arrays], outputs, "reduce_scatter_tensor_coalesced")

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if not _is_tpu([output, input]):
            return self._cpu_group().alltoall_base(
                output, input, output_split_sizes, input_split_sizes, opts or dist.AllToAllOptions()
            )
        G = self.size()
        if output.dtype != input.dtype:
            raise ValueError(
                f"torchtpu.distributed: all_to_all_single: output dtype {output.dtype} != input dtype {input.dtype}"
            )
        in_row = input.numel() // max(input.shape[0], 1) if input.dim() else 1
        out_row = output.numel() // max(output.shape[0], 1) if output.dim() else 1
        if not input_split_sizes and not output_split_sizes:
            if input.numel() % G or input.numel() != output.numel():
                raise ValueError(
                    f"torchtpu.distributed: all_to_all_single: input of {input.numel()} and "
                    f"output of {output.numel()} elements cannot be split evenly over {G} ranks"
                )
            if input.numel() == 0:
                return self._work([], output, "all_to_all_single")
            out = self._run("all_to_all", (), input)
            assign(output, out)
            return self._work([out], output, "all_to_all_single")
        ins = list(input_split_sizes) or [input.shape[0] // G] * G
        outs_ = list(output_split_sizes) or [output.shape[0] // G] * G
        if sum(ins) != input.shape[0] or sum(outs_) != output.shape[0] or len(ins) != G or len(outs_) != G:
            raise ValueError(
                f"torchtpu.distributed: all_to_all_single: split sizes {ins} / {outs_} do not "
                f"match input rows {input.shape[0]} / output rows {output.shape[0]} over {G} ranks"
            )
        out = self._uneven_all_to_all(
            flat_value(input) if input.numel() else None,
            input.dtype,
            [s * in_row for s in ins],
            [s * out_row for s in outs_],
        )
        if output.numel():
            assign(output, out)
        return self._work([out] if out is not None else [], output, "all_to_all_single")

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        if not _is_tpu(list(output_tensors) + list(input_tensors)):
            return self._cpu_group().alltoall(output_tensors, input_tensors, opts or dist.AllToAllOptions())
        dtype = input_tensors[0].dtype
        flat = (
            _concat([flat_value(t) for t in input_tensors if t.numel()])
            if any(t.numel() for t in input_tensors)
            else None
        )
        out = self._uneven_all_to_all(
            flat, dtype, [t.numel() for t in input_tensors], [t.numel() for t in output_tensors]
        )
        start = 0
        for o in output_tensors:
            if o.numel():
                assign(o, _slice(out, start, o.numel()))
            start += o.numel()
        return self._work([out] if out is not None else [], output_tensors, "all_to_all")

    def _uneven_all_to_all(self, flat, dtype, in_counts, out_counts):
        """All-to-all of blocks of different sizes (element counts): every block is padded to the
        largest block of the group (rounded up to a power of two, so changing splits rarely
        recompile), exchanged with one XLA all-to-all, and unpadded. The packing and unpacking are
        gathers with index arrays made on the host, compiled per padded size only."""
        import jax
        import jax.numpy as jnp
        import numpy as np

        G = self.size()
        jd = dtypes.storage_jax(dtype)
        local = self.mesh().local_device
        biggest = jax.device_put(np.array([max(max(in_counts), max(out_counts), 1)], np.int64), local)
        m = int(np.asarray(self._run("all_reduce", ("MAX",), biggest, torch.int64))[0])
        m = 1 << (m - 1).bit_length()
        # pack: block j of my input goes to rows [j*m, j*m + in_counts[j]) of a (G*m,) buffer
        src = np.full(G * m, -1, np.int64)
        start = 0
        for j, c in enumerate(in_counts):
            src[j * m : j * m + c] = np.arange(start, start + c)
            start += c
        packed = _pack(
            flat if flat is not None else jax.device_put(jnp.zeros((1,), jd), local), jax.device_put(src, local)
        )
        got = self._run("all_to_all", (), packed, dtype)
        total = sum(out_counts)
        if total == 0:
            return None
        dst = np.concatenate([np.arange(j * m, j * m + c) for j, c in enumerate(out_counts)]).astype(np.int64)
        return _take(got, jax.device_put(dst, local))

    def gather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        if not _is_tpu(list(inputs) + [t for lst in output_lists for t in lst]):
            return self._cpu_group().gather(output_lists, inputs, opts)
        t = inputs[0]
        out = self._run("all_gather", (), t) if t.numel() else None
        if self.rank() == opts.rootRank:
            outputs = output_lists[0]
            n = t.numel()
            for i, o in enumerate(outputs):
                self._check_sizes(o.numel(), n, "gather", "each output", "input", o.dtype, t.dtype)
                if n:
                    assign(o, _slice(out, i * n, n))
        return self._work([out] if out is not None else [], output_lists, "gather")

    def scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        if not _is_tpu(list(outputs) + [t for lst in input_lists for t in lst]):
            return self._cpu_group().scatter(outputs, input_lists, opts)
        o = outputs[0]
        if not o.numel():
            return self._work([], outputs, "scatter")
        if self.rank() == opts.rootRank:
            for i in input_lists[0]:
                self._check_sizes(i.numel(), o.numel(), "scatter", "each input", "output", i.dtype, o.dtype)
            flat = _concat([flat_value(i) for i in input_lists[0]])
        else:  # the other ranks contribute zeros of the same size (the program is the same everywhere)
            import jax
            import jax.numpy as jnp

            flat = jax.device_put(
                jnp.zeros((o.numel() * self.size(),), dtypes.storage_jax(o.dtype)), self.mesh().local_device
            )
        out = self._run("scatter", (int(opts.rootRank),), flat, o.dtype)
        assign(o, out)
        return self._work([out], outputs, "scatter")

    def barrier(self, opts=None):
        import jax
        import numpy as np

        token = jax.device_put(np.zeros((1,), np.int32), self.mesh().local_device)
        out = self._run("all_reduce", ("SUM",), token, torch.int32)
        work = self._work([out], None, "barrier")
        work.wait()
        return work

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        return self.barrier()

    # point to point: a two-device program (ppermute) that the sender and the receiver both run
    def _pair(self, src, dst):
        key = (src, dst)
        mesh = self._pair_meshes.get(key)
        if mesh is None:
            mesh = self._pair_meshes[key] = collectives.GroupMesh([self._global_ranks[src], self._global_ranks[dst]])
        return mesh

    def send(self, tensors, dst, tag=0):
        if not _is_tpu(tensors):
            return self._cpu_group().send(tensors, dst, tag)
        outs = []
        for t in tensors:
            if t.numel():
                outs.append(self._pair(self.rank(), dst).run("permute", (((0, 1),),), flat_value(t), self._timeout_s))
        return self._work(outs, list(tensors), f"send to rank {dst}")

    def recv(self, tensors, src, tag=0):
        if not _is_tpu(tensors):
            return self._cpu_group().recv(tensors, src, tag)
        outs = []
        for t in tensors:
            if t.numel():
                out = self._pair(src, self.rank()).run("permute", (((0, 1),),), flat_value(t), self._timeout_s)
                assign(t, out)
                outs.append(out)
        return self._work(outs, list(tensors), f"recv from rank {src}")

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError(
            "torchtpu.distributed: recv without a source rank is not supported on tpu "
            "(an XLA collective needs both ends known); pass src="
        )

    # errors -----------------------------------------------------------------------
    def _check_sizes(self, got, want, what, got_name, want_name, got_dtype, want_dtype):
        if got != want:
            raise ValueError(f"torchtpu.distributed: {what}: {got_name} has {got} elements but {want_name} is {want}")
        if got_dtype != want_dtype:
            raise ValueError(f"torchtpu.distributed: {what}: dtypes differ ({got_dtype} vs {want_dtype})")

    def shutdown(self):
        self._mesh = None
        self._pair_meshes.clear()
        if self._gloo is not None:
            try:
                self._gloo.shutdown()
            except Exception as e:  # noqa: BLE001 - best effort at teardown: the peers may be gone already
                _log.debug("torchtpu.distributed: shutting down the gloo helper group failed: %s", e)
            self._gloo = None

    def abort(self):
        self.shutdown()


# small local device programs, jitted once per shape ------------------------------------------
_jitted = {}


def _local(name, fn):
    f = _jitted.get(name)
    if f is None:
        from ..eager import tpu_check

        f = _jitted[name] = tpu_check.jit(fn, f"process group helper {name}")
    return f


def _slice(flat, start, n):
    return _slice_jit(n)(flat, start)


_slices = {}


def _slice_jit(n):
    f = _slices.get(n)
    if f is None:
        from jax import lax

        from ..eager import tpu_check

        f = _slices[n] = tpu_check.jit(lambda x, s: lax.dynamic_slice_in_dim(x, s, n), f"process group slice of {n}")
    return f


def _concat(flats):
    import jax.numpy as jnp

    return _local("concat", lambda *xs: jnp.concatenate(xs))(*flats)


def _pack(flat, src):
    import jax.numpy as jnp

    return _local("pack", lambda x, i: jnp.where(i >= 0, x[jnp.clip(i, 0, x.shape[0] - 1)], jnp.zeros((), x.dtype)))(
        flat, src
    )


def _take(flat, idx):
    return _local("take", lambda x, i: x[i])(flat, idx)


# ------------------------------------------------------------------ registration
def create(dist_backend_opts, backend_options=None):
    """The creator PyTorch calls for backend `tpu_dist` (extended API: gives the global ranks)."""
    store = dist_backend_opts.store
    rank, size = dist_backend_opts.group_rank, dist_backend_opts.group_size
    global_ranks = list(dist_backend_opts.global_ranks_in_group) or list(range(size))
    timeout = dist_backend_opts.timeout
    _ensure_joined(store, rank, size, global_ranks, timeout)
    return TpuProcessGroup(store, rank, size, timeout, global_ranks)


def _ensure_joined(store, rank, size, global_ranks, timeout):
    """Make sure this process is in a JAX multi-controller job of the whole world (the default group
    makes it so; subgroups find it done)."""
    if size == 1 or platform.multi_controller() is not None:
        return
    if platform.is_initialized():
        raise RuntimeError(
            "torchtpu: the tpu device was initialised for a single process before "
            "init_process_group: call init_process_group before the first tpu tensor, or launch with "
            "torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)"
        )
    # Launched without torchrun's environment: rank 0 picks the coordinator's port and tells the others
    import os
    import socket

    key = "torchtpu/jax_coordinator"
    if rank == 0:
        host = os.environ.get("MASTER_ADDR") or _store_host(store) or "127.0.0.1"
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        store.set(key, f"{host}:{port}")
    coordinator = store.get(key).decode()
    platform.join_multi_controller(
        coordinator, size, global_ranks[rank] if global_ranks else rank, timeout_s=_seconds(timeout) or 300
    )
    platform.ensure()


def _store_host(store):
    while store is not None:
        host = getattr(store, "host", None)
        if host:
            return host
        store = getattr(store, "underlying_store", None)
    return None
