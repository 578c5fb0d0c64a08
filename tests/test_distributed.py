"""torch.distributed on "tpu" (backend tpu_dist), process groups: multi-process tests, 2 and 4 ranks on
127.0.0.1. DTensor, compiled SPMD collectives and FSDP are in tests/test_distributed_spmd.py.

Each test starts its ranks as torchrun would (tests/distributed_launch.py) and runs one scenario of
tests/distributed_worker.py, where every rank checks its results against CPU arithmetic."""

import pytest
import torch.distributed as dist
from distributed_launch import check, launch


def test_backend_registered_for_tpu():
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu_dist"
    assert "tpu_dist" in dist.Backend.backend_list and "tpu" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["tpu_dist"] == ["tpu", "cpu"]


@pytest.mark.parametrize(
    "scenario,nprocs",
    [
        ("collectives", 2),  # every collective x dtype against CPU arithmetic
        ("collectives_more", 2),  # views, async Work, gather/scatter/reduce, p2p, CPU tensors, no recompiles
        ("subgroups", 4),  # new_group, a 2x2 DeviceMesh, uneven all_to_all
        ("ddp", 2),  # DDP on 2 ranks == one process on the full batch
        ("backend_strings", 2),  # "cpu:gloo,tpu:tpu_dist" through a tcp:// store, no torchrun env
        ("reinit", 2),  # a second default group over the first one's store: no stale signatures
    ],
)
def test_scenario(scenario, nprocs, tmp_path):
    check(launch(scenario, nprocs, timeout=150, env={"TORCHTPU_TEST_TMP": str(tmp_path)}), scenario)


def test_mismatched_shapes_raise():
    results = launch("mismatch", 2, timeout=120)
    check(results, "mismatch")
    assert all("MISMATCH-RAISED" in out for _, out in results)


def test_rank_that_dies_makes_others_raise():
    results = launch("dies", 2, timeout=120)
    rc, out = results[0]
    assert rc == 0 and "DEAD-RANK-RAISED" in out, out[-4000:]
    assert results[1][0] == 3


def test_rank_that_never_joins_makes_others_raise():
    results = launch("straggler", 2, timeout=120)
    rc, out = results[0]
    assert rc == 0 and out.count("TIMEOUT-RAISED") == 2, out[-4000:]


@pytest.mark.slow  # two torchrun agents and four ranks: ~1-2 min on a loaded 2-core machine
def test_two_hosts_through_torchrun_rendezvous(tmp_path):
    """Two "hosts" of two processes each: two torchrun agents meeting at a c10d rendezvous."""
    import os
    import subprocess
    import sys

    from distributed_launch import HERE, SRC, _kill, free_port, without_virtual_devices

    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), str(HERE)]), OMP_NUM_THREADS="1")
    env.pop("TORCHTPU_NUM_DEVICES", None)
    env.pop("TORCHTPU_COORDINATOR_ADDRESS", None)
    env["XLA_FLAGS"] = without_virtual_devices(env.get("XLA_FLAGS", ""))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "t",
        "--master-addr",
        "127.0.0.1",
        str(HERE / "distributed_worker.py"),
        "multihost",
    ]
    agents = [
        subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        for _ in range(2)
    ]
    try:
        outs = [a.communicate(timeout=240)[0] for a in agents]
    finally:
        for a in agents:
            _kill(a)
    text = "\n".join(outs)
    assert all(a.returncode == 0 for a in agents), text[-6000:]
    for r in range(4):
        assert f"OK multihost rank {r}" in text, text[-6000:]
