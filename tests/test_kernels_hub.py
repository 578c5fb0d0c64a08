"""The Hub-layout kernel repository kernels/torchtpu-kernels: loads with `kernels`, swaps layers through
`kernelize(model, device="tpu")` and serves Transformers' experts interface, with the outputs unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

kernels = pytest.importorskip("kernels")
transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1] / "kernels" / "torchtpu-kernels"


@pytest.fixture(scope="module")
def hub():
    return kernels.get_local_kernel(REPO)


def _tiny_qwen3_moe(experts_implementation="grouped_mm"):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        max_position_embeddings=64,
    )
    config._experts_implementation = experts_implementation
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config).eval()
    for p in model.parameters():  # experts are created empty: give every weight real values
        torch.nn.init.normal_(p, std=0.05)
    return model


def test_kernels_match_cpu_references(hub):
    tol = dict(rtol=1e-4, atol=1e-4)  # matmul sums in another order
    x, w = torch.randn(5, 16), torch.randn(16)
    ref = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(hub.rms_norm(x.to("tpu"), w.to("tpu"), 1e-6).cpu(), ref)
    g, u, d = torch.randn(32, 16), torch.randn(32, 16), torch.randn(16, 32)
    ref = (torch.nn.functional.silu(x @ g.T) * (x @ u.T)) @ d.T
    torch.testing.assert_close(hub.swiglu_mlp(*(t.to("tpu") for t in (x, g, u, d))).cpu(), ref, **tol)
    q, k, v = (torch.randn(2, 3, 7, 8) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(hub.attention(*(t.to("tpu") for t in (q, k, v)), 8**-0.5, True).cpu(), ref, **tol)


def test_kernelize_swaps_rmsnorm_with_identical_outputs():
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    from kernels import LocalLayerRepository, Mode, kernelize, replace_kernel_forward_from_hub, use_kernel_mapping

    # Transformers 5.24 declares its hub layers only with kernels >= 0.18.2 (0.17 is installed): declare
    # the RMSNorm class's hub name with kernels' own API, as the @use_kernel_forward_from_hub("RMSNorm")
    # in modeling_qwen3_moe.py does with a newer kernels
    replace_kernel_forward_from_hub(modeling_qwen3_moe.Qwen3MoeRMSNorm, "RMSNorm")
    model = _tiny_qwen3_moe()
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        ref = model(ids).logits
    model = model.to("tpu")
    mapping = {"RMSNorm": {"tpu": LocalLayerRepository(repo_path=REPO, layer_name="RMSNorm")}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        model = kernelize(model, device="tpu", mode=Mode.INFERENCE)
    norm = model.model.norm
    assert norm.forward.__func__.__module__.endswith("torchtpu-kernels.layers")  # the hub layer's forward
    with torch.no_grad():
        out = model(ids.to("tpu")).logits
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)


def test_experts_interface_kernel_identical_tokens(hub):
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register("torchtpu_kernels", hub.experts_forward)
    model = _tiny_qwen3_moe()
    ids = torch.randint(0, 128, (3, 5))
    with torch.no_grad():
        ref = model(ids).logits
        model = model.to("tpu")
        model.config._experts_implementation = "torchtpu_kernels"
        out = model(ids.to("tpu")).logits
        model.config._experts_implementation = "grouped_mm"
        default = model(ids.to("tpu")).logits
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.cpu(), default.cpu(), rtol=1e-4, atol=1e-4)


def test_metadata_is_a_tpu_variant():
    import json

    meta = json.loads((REPO / "build" / "torch-tpu" / "metadata.json").read_text())
    assert meta["backend"] == {"type": "tpu"} and {"id", "name", "version", "license", "python-depends"} <= set(meta)
