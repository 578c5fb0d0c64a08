"""Tiny, random, download-free Diffusers pipelines for tests, examples/diffusers_tiny.py and
benchmarks/diffusers_pipeline.py (imported by none of torchtpu: diffusers and transformers are optional).

Every component is built from a small config with a fixed seed; the tokenizers are built from
small vocabularies in memory (a byte-level BPE CLIP tokenizer, a Unigram T5 tokenizer), so nothing
is read from the Hub. `build("sd3" | "sd" | "flux", dtype=...)` returns a pipeline on the CPU.
"""

from __future__ import annotations

import functools

import torch

KINDS = ("sd3", "sd", "flux")
# The CLIP encoders of the pipelines pad prompts to 77 tokens (tokenizer.model_max_length).
CLIP_MAX_LEN = 77
T5_MAX_LEN = 16  # pass max_sequence_length=T5_MAX_LEN to SD3 / Flux
WORDS = [
    "a",
    "photo",
    "of",
    "cat",
    "dog",
    "red",
    "blue",
    "house",
    "tree",
    "on",
    "the",
    "mat",
    "astronaut",
    "riding",
    "horse",
    "painting",
    "sky",
    "big",
    "small",
    "green",
]


# ------------------------------------------------------------------ tokenizers
def _bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode map (the alphabet of a byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


@functools.cache
def _clip_vocab():
    chars = _bytes_to_unicode()
    vocab = {}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    for c in chars:
        vocab.setdefault(c + "</w>", len(vocab))
    merges = []
    # Merge a few whole words so real prompts tokenize to words, not only letters.
    for w in WORDS:
        cur = w[0]
        for i, ch in enumerate(w[1:], 1):
            nxt = ch + "</w>" if i == len(w) - 1 else ch
            merges.append((cur, nxt))
            cur = cur + nxt
            vocab.setdefault(cur, len(vocab))
    merges = list(dict.fromkeys(merges))
    for tok in ("<|startoftext|>", "<|endoftext|>"):
        vocab.setdefault(tok, len(vocab))
    return vocab, merges


def clip_tokenizer():
    from transformers import CLIPTokenizer

    vocab, merges = _clip_vocab()
    return CLIPTokenizer(vocab=dict(vocab), merges=list(merges), model_max_length=CLIP_MAX_LEN)


def t5_tokenizer():
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("\u2581" + w, -float(i + 1)) for i, w in enumerate(WORDS)]
    pieces += [(c, -100.0 - i) for i, c in enumerate("abcdefghijklmnopqrstuvwxyz\u2581")]
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=512)


CLIP_VOCAB = 1000  # >= the tokenizer's vocabulary (about 560)
T5_VOCAB = 128  # >= the T5 tokenizer's vocabulary (about 50)


# ------------------------------------------------------------------ text encoders
def clip_text_config(hidden=32, projection=32, layers=2):
    from transformers import CLIPTextConfig

    vocab, _ = _clip_vocab()
    return CLIPTextConfig(
        vocab_size=CLIP_VOCAB,
        hidden_size=hidden,
        intermediate_size=37,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=CLIP_MAX_LEN,
        projection_dim=projection,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<|endoftext|>"],
    )


def t5_encoder(d_model=32):
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(
        vocab_size=T5_VOCAB,
        d_model=d_model,
        d_ff=37,
        d_kv=8,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        dropout_rate=0.0,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return T5EncoderModel(cfg)


# ------------------------------------------------------------------ pipelines
def _vae(block_out_channels, latent_channels, norm_num_groups, **kw):
    from diffusers import AutoencoderKL

    n = len(block_out_channels)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=tuple(block_out_channels),
        down_block_types=("DownEncoderBlock2D",) * n,
        up_block_types=("UpDecoderBlock2D",) * n,
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=norm_num_groups,
        sample_size=32,
        **kw,
    )


def sd3_components():
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(
        sample_size=32,
        patch_size=1,
        in_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=32,
        pooled_projection_dim=64,
        out_channels=4,
    )
    torch.manual_seed(0)
    text_encoder = CLIPTextModelWithProjection(clip_text_config())
    torch.manual_seed(1)
    text_encoder_2 = CLIPTextModelWithProjection(clip_text_config())
    torch.manual_seed(0)
    text_encoder_3 = t5_encoder(d_model=32)
    torch.manual_seed(0)
    vae = _vae((4,), 4, 1, shift_factor=0.0609, scaling_factor=1.5035, use_quant_conv=False, use_post_quant_conv=False)
    return dict(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=clip_tokenizer(),
        text_encoder_2=text_encoder_2,
        tokenizer_2=clip_tokenizer(),
        text_encoder_3=text_encoder_3,
        tokenizer_3=t5_tokenizer(),
    )


def sd_components():
    from diffusers import EulerDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(4, 8),
        layers_per_block=1,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        norm_num_groups=2,
        attention_head_dim=2,
    )
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", timestep_spacing="leading", steps_offset=1
    )
    torch.manual_seed(0)
    vae = _vae((4, 8), 4, 2)
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(clip_text_config())
    return dict(
        unet=unet,
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=clip_tokenizer(),
        safety_checker=None,
        feature_extractor=None,
        image_encoder=None,
    )


def flux_components():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextModel

    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    )
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(clip_text_config())
    torch.manual_seed(0)
    text_encoder_2 = t5_encoder(d_model=32)
    torch.manual_seed(0)
    vae = _vae((4,), 1, 1, shift_factor=0.0609, scaling_factor=1.5035, use_quant_conv=False, use_post_quant_conv=False)
    return dict(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=clip_tokenizer(),
        text_encoder_2=text_encoder_2,
        tokenizer_2=t5_tokenizer(),
    )


def build(kind: str, dtype=torch.float32):
    """A tiny random pipeline of `kind` ("sd3", "sd", "flux") on the CPU, in `dtype`."""
    import diffusers

    if kind == "sd3":
        pipe = diffusers.StableDiffusion3Pipeline(**sd3_components())
    elif kind == "sd":
        pipe = diffusers.StableDiffusionPipeline(**sd_components(), requires_safety_checker=False)
    elif kind == "flux":
        pipe = diffusers.FluxPipeline(**flux_components())
    else:
        raise ValueError(kind)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(dtype=dtype) if dtype != torch.float32 else pipe


def denoiser(pipe):
    return pipe.unet if hasattr(pipe, "unet") else pipe.transformer


def call_kwargs(kind: str, seed=0, steps=2, size=32, prompt="a photo of a red cat on the mat", output_type="np"):
    """Arguments of one pipeline call; the generator is a CPU generator, so tpu and CPU draw the same latents."""
    kw = dict(
        prompt=prompt,
        num_inference_steps=steps,
        height=size,
        width=size,
        output_type=output_type,
        generator=torch.Generator("cpu").manual_seed(seed),
    )
    if kind in ("sd3", "sd"):
        kw["guidance_scale"] = 5.0
    if kind == "sd3":
        kw["max_sequence_length"] = T5_MAX_LEN
    if kind == "flux":
        kw["guidance_scale"] = 3.5
        kw["max_sequence_length"] = T5_MAX_LEN
    return kw


def param_bytes(pipe) -> int:
    """Bytes of every parameter and buffer of the pipeline's modules, each storage counted once."""
    seen, total = set(), 0
    for _, comp in pipe.components.items():
        if isinstance(comp, torch.nn.Module):
            for t in list(comp.parameters()) + list(comp.buffers()):
                key = (t.untyped_storage().data_ptr(), t.device)
                if key not in seen:
                    seen.add(key)
                    total += t.untyped_storage().nbytes()
    return total
