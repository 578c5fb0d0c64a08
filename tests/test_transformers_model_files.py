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
