"""Causes found by running Transformers' own model test files on "tpu" (docs/transformers.md, "Transformers'
own test suite"), each reduced to a tiny model built from a config and compared with the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import torchtpu.integrations  # noqa: E402

torchtpu.integrations.install()


def _mamba2_pair():
    config = transformers.Mamba2Config(
        vocab_size=99,
        hidden_size=32,
        state_size=8,
        num_heads=8,
        head_dim=8,
        n_groups=1,
        expand=2,
        conv_kernel=4,
        chunk_size=8,
        num_hidden_layers=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(5)
    cpu = transformers.Mamba2ForCausalLM(config).eval()
    return cpu, copy.deepcopy(cpu).to("tpu")


def _conv_state_layouts(cache):
    return [
        [(tuple(state.shape), state.stride()) for state in layer.conv_states.values() if state is not None]
        for layer in cache.layers
    ]


def test_mamba2_generate_returns_the_cpus_cache_layout():
    """A returned Mamba 2 cache rolls back a deferred stop check by recording its past, which leaves its
    conv states as views of wider tensors (new strides: the next compiled decode step recompiled). On tpu
    such a cache is checked every token, as on CUDA: same tokens, scores and state layout as the CPU."""
    cpu, tpu = _mamba2_pair()
    ids = torch.randint(3, 99, (2, 6), generator=torch.Generator().manual_seed(7))
    kw = dict(max_new_tokens=3, do_sample=False, return_dict_in_generate=True, output_scores=True)
    ref = cpu.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    got = tpu.generate(ids.to("tpu"), attention_mask=torch.ones_like(ids).to("tpu"), **kw)
    assert got.sequences.cpu().tolist() == ref.sequences.tolist()
    for mine, theirs in zip(got.scores, ref.scores, strict=True):
        torch.testing.assert_close(mine.cpu(), theirs, atol=1e-4, rtol=1e-4)
    name = "cache" if hasattr(ref, "cache") else "past_key_values"
    assert _conv_state_layouts(getattr(got, name)) == _conv_state_layouts(getattr(ref, name))


def _gpt_oss_pair():
    # alternating sliding-window (4) and full layers, attention sinks, 4 experts with biases
    config = transformers.GptOssConfig(
        vocab_size=99,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(11)
    cpu = transformers.GptOssForCausalLM(config).eval()
    return cpu, copy.deepcopy(cpu).to("tpu")


_COUNTS = ("compiled_graphs", "compiled_xla_compiles", "compiled_cache_hits", "eager_compiles")


def test_gpt_oss_static_cache_decode_is_one_graph_without_per_token_recompiles():
    """`test_generate_with_static_cache` of the gpt_oss file ran over its time limit on tpu. The compiled
    decode step (generate() compiles it for tpu, as for CUDA) is not why: one graph for the whole decode
    of a model mixing sliding-window and full layers, sinks and experts, none again for the same shapes,
    tokens equal to the CPU's. (The time goes to compiling the eager reference's new shapes, once each.)"""
    import torchtpu

    cpu, tpu = _gpt_oss_pair()
    torch._dynamo.reset()
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, cache_implementation="static")
    for round_, seed in enumerate((3, 4)):
        ids = torch.randint(3, 99, (2, 3), generator=torch.Generator().manual_seed(seed))
        mask = torch.ones_like(ids)
        ref = cpu.generate(input_ids=ids, attention_mask=mask, **kw)
        before = torchtpu.metrics()
        got = tpu.generate(input_ids=ids.to("tpu"), attention_mask=mask.to("tpu"), **kw)
        after = torchtpu.metrics()
        counts = {k: after[k] - before[k] for k in _COUNTS}
        assert got.cpu().tolist() == ref.tolist(), round_
        if round_ == 0:  # the window (4) fills during the decode: still one graph
            assert counts["compiled_graphs"] == 1 and counts["compiled_xla_compiles"] <= 2, counts
        else:  # the same shapes again: nothing compiles, eager or compiled; one executable call per step
            assert counts == dict(compiled_graphs=0, compiled_xla_compiles=0, compiled_cache_hits=5, eager_compiles=0)
