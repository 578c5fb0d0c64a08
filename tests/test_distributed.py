"""torch.distributed on "tpu" (backend tpu_dist): multi-process tests, 2 and 4 ranks on 127.0.0.1.

Each test starts its ranks as torchrun would (tests/distributed_launch.py) and runs one scenario of
tests/distributed_worker.py, where every rank checks its results against CPU arithmetic."""
import pytest
import torch
import torch.distributed as dist

from distributed_launch import check, launch


def test_backend_registered_for_tpu():
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu_dist"
    assert "tpu_dist" in dist.Backend.backend_list and "tpu" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["tpu_dist"] == ["tpu", "cpu"]


@pytest.mark.parametrize("scenario,nprocs", [
    ("collectives", 2),   # every collective, dtypes, views, async Work, CPU tensors, no recompiles
    ("subgroups", 4),     # new_group, a 2x2 DeviceMesh, uneven all_to_all
    ("ddp", 2),           # DDP on 2 ranks == one process on the full batch
    ("backend_strings", 2),   # "cpu:gloo,tpu:tpu_dist" through a tcp:// store, no torchrun env
    ("dtensor", 2),       # distribute_tensor, redistribute, ColwiseParallel/RowwiseParallel
    ("fsdp", 2),          # fully_shard + MixedPrecisionPolicy parity, distributed checkpoint save/load
])
def test_scenario(scenario, nprocs, tmp_path):
    check(launch(scenario, nprocs, timeout=150, env={"TORCHTPU_TEST_TMP": str(tmp_path)}), scenario)


def test_mismatched_shapes_raise():
    results = launch("mismatch", 2, timeout=120)
    check(results, "mismatch")
    assert all("MISMATCH-RAISED" in out for _, out in results)


def test_rank_that_never_joins_makes_others_raise():
    results = launch("straggler", 2, timeout=120)
    rc, out = results[0]
    assert rc == 0 and "TIMEOUT-RAISED" in out, out[-4000:]


@pytest.mark.slow   # ~1-2.5 min on a loaded 2-core machine (Transformers' import and load on 2 ranks)
def test_transformers_tp_plan_auto(tmp_path):
    check(launch("hf_tp_plan", 2, timeout=300, env={"TORCHTPU_TEST_TMP": str(tmp_path)}), "hf_tp_plan")
