"""One rank of a multi-process Hugging Face test on "tpu" (run by tests/test_distributed_hf.py).

`python distributed_hf_worker.py SCENARIO` under torchrun's environment. Rank 0 saves a tiny random
checkpoint into TORCHTPU_TEST_TMP; every rank loads it sharded (or data-parallel) and compares with the
unsharded model on the CPU, built from the same seed.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from distributed_worker import RANK, WORLD, run_scenario, scenario  # the same registry and environment
from torch.testing import assert_close


def shared_checkpoint(reference):
    """Rank 0 saves `reference`; the others wait for the file (bounded)."""
    path = os.environ["TORCHTPU_TEST_TMP"]
    if RANK == 0:
        reference.save_pretrained(path)
        open(os.path.join(path, "saved"), "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(path, "saved")):
        assert time.monotonic() < deadline, "rank 0 never saved the checkpoint"
        time.sleep(0.2)
    return path


def causal_lm_tp_plan(config_class, model_class, **config):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    reference = model_class(
        config_class(
            vocab_size=128,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=64,
            **config,
        )
    ).eval()
    path = shared_checkpoint(reference)
    model = AutoModelForCausalLM.from_pretrained(path, tp_plan="auto").eval()
    assert next(model.parameters()).device.type == "tpu"
    q = model.model.layers[0].self_attn.q_proj.weight
    local = q.to_local() if hasattr(q, "to_local") else q
    assert local.shape[0] == 4 * 16 // WORLD, f"q_proj not sharded: {tuple(local.shape)}"
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert_close(model(ids.to("tpu")).logits.cpu(), reference(ids).logits, rtol=1e-4, atol=1e-4)
        tokens = model.generate(ids.to("tpu"), max_new_tokens=5, do_sample=False)
        want = reference.generate(ids, max_new_tokens=5, do_sample=False)
    assert tokens.cpu().tolist() == want.tolist()
    return model


@scenario
def llama_tp_plan():
    """A tiny Llama: attention and MLP projections both sharded; the unsharded model's logits and tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = causal_lm_tp_plan(LlamaConfig, LlamaForCausalLM, intermediate_size=128)
    gate = model.model.layers[0].mlp.gate_proj.weight
    local = gate.to_local() if hasattr(gate, "to_local") else gate
    assert local.shape[0] == 128 // WORLD, f"gate_proj not sharded: {tuple(local.shape)}"


@scenario
def qwen3_tp_plan():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    causal_lm_tp_plan(Qwen3Config, Qwen3ForCausalLM, intermediate_size=128)


@scenario
def qwen3_moe_tp_plan():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    model = causal_lm_tp_plan(
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    # The experts follow the model's own tensor-parallel plan, on any accelerator: Transformers <= 5.24
    # shards them (down_proj "rowwise", gate_up_proj "packed_colwise", "moe_tp_experts"); 5.25 dropped those
    # rules: Qwen3-MoE's experts are only in base_model_ep_plan, which tp_plan="auto" does not apply, so
    # every rank holds every expert whole.
    experts = model.model.layers[0].mlp.experts.down_proj
    local = experts.to_local() if hasattr(experts, "to_local") else experts
    if "layers.*.mlp.experts.down_proj" in (model.config.base_model_tp_plan or {}):
        assert local.shape[-1] == 32 // WORLD or local.shape[-2] == 32 // WORLD, tuple(local.shape)
    else:
        assert tuple(local.shape) == (8, 64, 32), tuple(local.shape)


@scenario
def flux_tensor_parallel():
    """Diffusers: FluxTransformer2DModel.from_pretrained(path, parallel_config=TensorParallelConfig(
    tp_degree=2)) shards while it loads; its output equals the unsharded transformer's on the CPU."""
    from diffusers import FluxTransformer2DModel, TensorParallelConfig

    dist.init_process_group()
    torch.manual_seed(0)
    reference = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    ).eval()
    path = shared_checkpoint(reference)
    model = FluxTransformer2DModel.from_pretrained(path, parallel_config=TensorParallelConfig(tp_degree=WORLD))
    weight = model.transformer_blocks[0].attn.to_q.weight
    local = weight.to_local() if hasattr(weight, "to_local") else weight
    assert local.device.type == "tpu" and local.shape[0] == 32 // WORLD, (local.device, tuple(local.shape))
    g = torch.Generator().manual_seed(5)
    inputs = dict(
        hidden_states=torch.randn(1, 16, 4, generator=g),
        encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
        pooled_projections=torch.randn(1, 32, generator=g),
        timestep=torch.tensor([0.5]),
        img_ids=torch.randn(16, 3, generator=g),
        txt_ids=torch.zeros(8, 3),
    )
    with torch.no_grad():
        want = reference(**inputs).sample
        got = model(**{k: v.to("tpu") for k, v in inputs.items()}).sample
    assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    dist.destroy_process_group()


@scenario
def trainer_data_parallel():
    """Transformers' Trainer under torchrun trains data-parallel on "tpu" (accelerate picks the tpu
    process group and DDP). Every example is the same sequence, so each step's gradient is the one of a
    single process whatever the sampler gives each rank: the parameters must match plain AdamW steps
    on the CPU, and agree across ranks."""
    import copy

    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=32,
        )
    )
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": ids, "labels": ids} for _ in range(8 * WORLD)]
    # Adam divides each gradient by its root mean square plus eps: with the default eps (1e-8), elements whose
    # gradient is ~1e-8 (a few of q_proj's at this initialisation) turn float32 rounding (XLA:CPU against
    # torch's CPU kernels, ~1e-10 absolute) into ~1e-5 in the parameter after 3 steps, in a single process on
    # "tpu" as well. eps=1e-6 keeps every parameter within ~1e-6.
    steps, lr, eps = 3, 1e-2, 1e-6
    args = TrainingArguments(
        output_dir=os.environ["TORCHTPU_TEST_TMP"],
        per_device_train_batch_size=2,
        max_steps=steps,
        learning_rate=lr,
        adam_epsilon=eps,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        optim="adamw_torch",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data)
    assert trainer.args.parallel_mode.value == "distributed", trainer.args.parallel_mode
    assert trainer.args.device.type == "tpu", trainer.args.device
    trainer.train()
    assert dist.is_initialized() and dist.get_world_size() == WORLD
    assert dist.get_backend() in ("tpu_dist", "tpu"), dist.get_backend()

    opt = torch.optim.AdamW(reference.parameters(), lr=lr, eps=eps, weight_decay=0.0)
    batch = torch.stack([ids, ids])
    for _ in range(steps):
        reference(input_ids=batch, labels=batch).loss.backward()
        opt.step()
        opt.zero_grad()
    trained = dict(model.named_parameters())
    for name, p in reference.named_parameters():
        assert_close(
            trained[name].detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )
        mine = trained[name].detach().clone()
        everyone = [torch.empty_like(mine) for _ in range(WORLD)]
        dist.all_gather(everyone, mine)
        for other in everyone[1:]:
            assert torch.equal(other.cpu(), everyone[0].cpu()), name


if __name__ == "__main__":
    run_scenario(sys.argv[1])
