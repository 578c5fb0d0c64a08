"""Transformers pipelines on device "tpu" give the CPU's results (issue 48, item 4).

Tiny models built from configs with tokenizers built in memory: no downloads. Text generation is
in tests/test_transformers_generate.py (test_text_generation_pipeline).
"""

import copy

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "mat",
    "a",
    "big",
    "red",
    "dog",
    "ran",
    "to",
    "park",
    "under",
    "blue",
    "sky",
    "fast",
]


def _wordpiece_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    special = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(special + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        unk_token="[UNK]",
        mask_token="[MASK]",
    )


def _pipelines(task, model, **kw):
    cpu = transformers.pipeline(task, model=model, device="cpu", **kw)
    tpu = transformers.pipeline(task, model=copy.deepcopy(model), device="tpu", **kw)
    assert tpu.device.type == "tpu" and next(tpu.model.parameters()).device.type == "tpu"
    return cpu, tpu


def test_fill_mask_pipeline_matches_cpu():
    tok = _wordpiece_tokenizer()
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    cpu, tpu = _pipelines("fill-mask", transformers.BertForMaskedLM(config).eval(), tokenizer=tok, top_k=3)
    texts = ["the cat [MASK] on the mat", "a big [MASK] dog ran to the park"]
    want, got = cpu(texts), tpu(texts)
    for w_text, g_text in zip(want, got, strict=True):
        assert [r["token"] for r in g_text] == [r["token"] for r in w_text]
        np.testing.assert_allclose([r["score"] for r in g_text], [r["score"] for r in w_text], rtol=1e-4)


def _whisper_tokenizer():
    # a byte-level vocabulary of letters and the special tokens Whisper's decoding looks up
    vocab = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz\u0120")}
    for name in ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]:
        vocab[name] = len(vocab)
    return transformers.WhisperTokenizer(vocab=vocab, merges=[])


def test_automatic_speech_recognition_pipeline_matches_cpu():
    tok = _whisper_tokenizer()
    end, start = tok.convert_tokens_to_ids(["<|endoftext|>", "<|startoftranscript|>"])
    torch.manual_seed(1)
    config = transformers.WhisperConfig(
        vocab_size=len(tok),
        num_mel_bins=8,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=50,  # one-second chunks: 100 mel frames, halved by the encoder's stride
        max_target_positions=32,
        pad_token_id=end,
        bos_token_id=end,
        eos_token_id=end,
        decoder_start_token_id=start,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    features = transformers.WhisperFeatureExtractor(feature_size=8, chunk_length=1)
    cpu, tpu = _pipelines(
        "automatic-speech-recognition",
        transformers.WhisperForConditionalGeneration(config).eval(),
        tokenizer=tok,
        feature_extractor=features,
    )
    rng = np.random.default_rng(7)
    audio = [(0.1 * rng.standard_normal(n)).astype(np.float32) for n in (9000, 12000)]

    def clips():  # the pipeline pops "raw" from each dict it is given
        return [{"raw": a, "sampling_rate": 16000} for a in audio]

    kw = {"generate_kwargs": {"max_new_tokens": 6, "do_sample": False}}
    want, got = cpu(clips(), **kw), tpu(clips(), **kw)
    assert got == want
    assert all(r["text"] for r in got)


def test_image_text_to_text_pipeline_with_llava_matches_cpu():
    from PIL import Image
    from tokenizers import Tokenizer, models, pre_tokenizers

    special = ["<pad>", "<s>", "</s>", "<unk>", "<image>"]
    vocab = {w: i for i, w in enumerate(special + WORDS + ["what", "is", "this"])}
    words = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        extra_special_tokens={"image_token": "<image>"},
    )
    images = transformers.CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    # 16x16 images in 4x4 patches: 16 image tokens per <image> (the CLS feature is dropped by "default")
    processor = transformers.LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=4,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        image_token="<image>",
    )
    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=16, patch_size=4
    )
    text = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = transformers.LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=vocab["<image>"],
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    torch.manual_seed(2)
    model = transformers.LlavaForConditionalGeneration(config).eval()
    cpu, tpu = _pipelines("image-text-to-text", model, processor=processor)
    rng = np.random.default_rng(3)
    pictures = [Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)) for _ in range(2)]
    prompts = ["<image> what is this", "<image> the cat sat"]
    kw = {"generate_kwargs": {"max_new_tokens": 5, "do_sample": False}}
    want = cpu(images=pictures, text=prompts, **kw)
    got = tpu(images=pictures, text=prompts, **kw)
    assert got == want
    assert all(len(g["generated_text"]) > len(p) for g, p in zip(got, prompts, strict=True))
