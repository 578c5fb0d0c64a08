"""DTensor, compiled SPMD collectives and FSDP on "tpu": multi-process tests, 2 and 4 ranks on 127.0.0.1.

Each test starts its ranks as torchrun would (tests/distributed_launch.py) and runs one scenario of
tests/distributed_spmd_worker.py, where every rank checks its results against the unsharded model or
CPU arithmetic."""

import pytest
from distributed_launch import HERE, check, launch

WORKER = HERE / "distributed_spmd_worker.py"


@pytest.mark.parametrize(
    "scenario,nprocs",
    [
        ("dtensor", 2),  # distribute_tensor, redistribute, Colwise/Rowwise
        ("compiled_collectives", 2),  # funcol under torch.compile(fullgraph): one SPMD executable
        ("compiled_dtensor", 2),  # DTensor Colwise/Rowwise compiled: forward and backward graphs
        ("compiled_collectives_2d", 4),  # one graph over both axes of a 2x2 mesh; SequenceParallel block
        ("fsdp", 2),  # fully_shard + MixedPrecisionPolicy parity, distributed checkpoint save/load
        ("dtensor_2d", 4),  # dp x tp mesh: SequenceParallel + Colwise/Rowwise, outputs and grads
    ],
)
def test_scenario(scenario, nprocs, tmp_path):
    env = {"TORCHTPU_TEST_TMP": str(tmp_path)}
    check(launch(scenario, nprocs, timeout=150, env=env, script=WORKER), scenario)
