"""Hugging Face libraries under torchrun on "tpu" (2 ranks, loopback, bounded): Transformers'
tp_plan="auto" on Llama, Qwen3 and Qwen3-MoE, Diffusers' TensorParallelConfig on a Flux transformer, and
Trainer's data parallelism through accelerate. Each rank checks against the unsharded model or a
single-process run on the CPU (tests/distributed_hf_worker.py)."""

import pytest
from distributed_launch import HERE, check, launch

WORKER = HERE / "distributed_hf_worker.py"


def run(name, tmp_path, timeout=240):
    check(launch(name, 2, timeout=timeout, env={"TORCHTPU_TEST_TMP": str(tmp_path)}, script=WORKER), name)


def test_qwen3_moe_tp_plan_auto(tmp_path):
    run("qwen3_moe_tp_plan", tmp_path)


def test_flux_transformer_tensor_parallel_config(tmp_path):
    run("flux_tensor_parallel", tmp_path)


def test_trainer_data_parallel_matches_one_process(tmp_path):
    run("trainer_data_parallel", tmp_path)


@pytest.mark.slow  # the dense model's path is the MoE test's attention and Llama's (slow) test
def test_qwen3_tp_plan_auto(tmp_path):
    run("qwen3_tp_plan", tmp_path)


@pytest.mark.slow  # ~1-2.5 min on a loaded 2-core machine (Transformers' import and load on 2 ranks)
def test_llama_tp_plan_auto(tmp_path):
    run("llama_tp_plan", tmp_path)
