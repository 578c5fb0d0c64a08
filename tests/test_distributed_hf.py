"""Hugging Face libraries under torchrun on "tpu" (2 ranks, loopback, bounded): Transformers'
tp_plan="auto" on Qwen3 and Qwen3-MoE, Diffusers' TensorParallelConfig on a Flux transformer, and
Trainer's data parallelism through accelerate. Each rank checks against the unsharded model or a
single-process run on the CPU (tests/distributed_hf_worker.py)."""
import pytest

from distributed_launch import HERE, Batch, check, launch

WORKER = HERE / "distributed_hf_worker.py"


# The default scenarios share one launch (distributed_launch.Batch): Transformers and Diffusers are
# imported once per rank instead of once per test.
BATCH = Batch(["qwen3_moe_tp_plan", "flux_tensor_parallel", "trainer_data_parallel"], nprocs=2, timeout=480,
              script=WORKER)


def test_qwen3_moe_tp_plan_auto(tmp_path_factory):
    BATCH.check("qwen3_moe_tp_plan", tmp_path_factory)


def test_flux_transformer_tensor_parallel_config(tmp_path_factory):
    BATCH.check("flux_tensor_parallel", tmp_path_factory)


def test_trainer_data_parallel_matches_one_process(tmp_path_factory):
    BATCH.check("trainer_data_parallel", tmp_path_factory)


@pytest.mark.slow   # the dense model's path is the MoE test's attention and Llama's (slow) test
def test_qwen3_tp_plan_auto(tmp_path):
    check(launch("qwen3_tp_plan", 2, timeout=240, env={"TORCHTPU_TEST_TMP": str(tmp_path)}, script=WORKER),
          "qwen3_tp_plan")
