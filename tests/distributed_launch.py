"""Start N ranks of tests/distributed_worker.py as torchrun would (127.0.0.1, free ports), bounded
by a timeout; every process is killed at the end, whatever happens."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def without_virtual_devices(xla_flags: str) -> str:
    """XLA_FLAGS less the virtual-device count that a parent process which used "tpu" with
    TORCHTPU_NUM_DEVICES passed on to XLA: each rank has one device, as on a TPU host."""
    return " ".join(f for f in xla_flags.split() if not f.startswith("--xla_force_host_platform_device_count"))


def launch(scenario, nprocs=2, timeout=120, env=None, script=None, args=()):
    """Run `scenario` on `nprocs` ranks; returns [(returncode, output)] per rank."""
    port, coordinator = free_port(), free_port()
    procs = []
    try:
        for rank in range(nprocs):
            e = dict(os.environ)
            e.pop("TORCHTPU_NUM_DEVICES", None)  # one device per process, as on a TPU host
            e["XLA_FLAGS"] = without_virtual_devices(e.get("XLA_FLAGS", ""))
            e.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(nprocs),
                LOCAL_WORLD_SIZE=str(nprocs),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
                TORCHTPU_COORDINATOR_ADDRESS=f"127.0.0.1:{coordinator}",
                PYTHONPATH=os.pathsep.join([str(SRC), str(HERE), e.get("PYTHONPATH", "")]),
            )
            e.update(env or {})
            cmd = [sys.executable, str(script or HERE / "distributed_worker.py"), scenario, *args]
            procs.append(
                subprocess.Popen(
                    cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
                )
            )
        deadline = time.monotonic() + timeout
        results = []
        for p in procs:
            left = max(1.0, deadline - time.monotonic())
            try:
                out, _ = p.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                _kill(p)
                out, _ = p.communicate()
                out += f"\n[launcher: killed after {timeout} s]"
            results.append((p.returncode, out))
        return results
    finally:
        for p in procs:
            _kill(p)


def _kill(p):
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def check(results, scenario):
    bad = [(r, rc, out) for r, (rc, out) in enumerate(results) if rc != 0 or f"OK {scenario} rank " not in out]
    if bad:
        rank, rc, out = bad[0]
        raise AssertionError(f"{scenario}: rank {rank} exited {rc}\n{out[-6000:]}")
