"""A tiny Llama and a word-level tokenizer, built locally (no downloads), for the Transformers tests.

Shared by tests/test_transformers.py (loading, training) and tests/test_transformers_generate.py.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "ran",
    "to",
    "big",
    "red",
    "house",
    "and",
    "saw",
    "bird",
    "tree",
    "under",
    "blue",
    "sky",
    "fast",
]
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
VOCAB = len(SPECIAL) + len(WORDS)


def config(**kw):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    base.update(kw)
    return LlamaConfig(**base)


def model(seed=0, **kw):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config(**kw)).eval()


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
    )


def left_padded(gen, batch=2, seq=6):
    ids = torch.randint(len(SPECIAL), VOCAB, (batch, seq), generator=gen)
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = 0, 0  # left padding
    return ids, mask
