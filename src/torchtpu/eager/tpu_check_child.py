"""The TPU compile check's compiler process (eager/tpu_check.py starts it as a script, so it imports JAX
only: not torch, not torchtpu). It loads libtpu for a TPU topology, without a chip, and compiles the
StableHLO programs the parent sends, one at a time.

Protocol, over the process's stdin and its original stdout (kept away from the libraries: their
prints go to stderr, which the parent keeps in a file): each message is an 8-byte big-endian length
and a pickle. Request: (name, bytecode, num_replicas, num_partitions, abort_for_test). Reply:
(error text or None, cost_analysis dict, compile seconds). The first reply, after libtpu has loaded, is
(None or the error that stops it, {"devices": n, "kind": device kind}, seconds).
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
import time


def _read(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack(">Q", head)
    return pickle.loads(stream.read(n))


def _write(stream, message):
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack(">Q", len(data)) + data)
    stream.flush()


def _cost(executable):
    try:
        cost = executable.cost_analysis()
    except Exception:  # noqa: BLE001 -- a program XLA:TPU has no cost model for still compiled
        return {}
    if isinstance(cost, list):  # (older jaxlibs: one dict per partition)
        cost = cost[0] if cost else {}
    return {str(k): float(v) for k, v in dict(cost or {}).items() if isinstance(v, (int, float))}


def main(topology: str, reply_fd: int) -> None:
    requests = sys.stdin.buffer
    replies = os.fdopen(reply_fd, "wb")
    start = time.perf_counter()
    try:
        import numpy as np
        from jax._src import compiler
        from jax._src.interpreters import mlir
        from jax._src.lib import xla_client
        from jax.experimental import topologies

        devices = topologies.get_topology_desc(topology, "tpu").devices
    except Exception as e:  # noqa: BLE001 -- a topology libtpu does not know, or no libtpu: said once
        _write(replies, (f"{type(e).__name__}: {e}", {}, time.perf_counter() - start))
        return
    _write(replies, (None, {"devices": len(devices), "kind": devices[0].device_kind}, time.perf_counter() - start))
    client = devices[0].client
    while True:
        request = _read(requests)
        if request is None:  # the parent closed the pipe: it is exiting
            return
        name, bytecode, num_replicas, num_partitions, abort_for_test = request
        if abort_for_test:  # tests: a compiler abort, as XLA:TPU's CHECK failures end the process
            print(f"tpu_check_child: aborting on {name!r} as the test asked", file=sys.stderr, flush=True)
            os.abort()
        start = time.perf_counter()
        n = num_replicas * num_partitions
        if n > len(devices):
            _write(replies, (f"the program needs {n} devices; topology {topology} has {len(devices)}", {}, 0.0))
            continue
        try:
            with mlir.make_ir_context():
                module = mlir.ir.Module.parse(bytecode)
            assignment = np.arange(n).reshape(num_replicas, num_partitions)
            options = compiler.get_compile_options(
                num_replicas=num_replicas, num_partitions=num_partitions, device_assignment=assignment
            )
            executable = client.compile(
                module, executable_devices=xla_client.DeviceList(tuple(devices[:n])), compile_options=options
            )
            reply = (None, _cost(executable), time.perf_counter() - start)
        except Exception as e:  # noqa: BLE001 -- XLA's rejection, reported as the program's failure
            reply = (f"{type(e).__name__}: {e}", {}, time.perf_counter() - start)
        _write(replies, reply)


def _die_with_parent():
    """Linux: end with the parent (a parent killed by a signal never closes the pipe in time for a long
    compile to notice)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the closed pipe still ends the child, later
        pass


if __name__ == "__main__":
    _die_with_parent()
    # Ctrl-C (or `timeout -s INT`) reaches the whole process group: the parent decides whether to stop,
    # and the child ends with it; dying here would count the program being compiled as a TPU failure
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the libraries' prints on stdout go to stderr; replies have their own descriptor
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    main(sys.argv[-1], reply_fd)  # (the last argument: run by path through runpy, argv keeps "-c" first)
