"""End-to-end Diffusers pipeline time: torch CPU vs "tpu" eager vs "tpu" with a compiled denoiser.

    TORCHTPU_COMPILE_CACHE=0 python benchmarks/diffusers_pipeline.py [--kinds sd3,sd,flux] [--size 64] [--steps 4]
    [--reps 3]
                                                                     [--scale tiny|small]

Tiny random components (torchtpu/integrations/diffusers_tiny.py), so absolute numbers measure framework overhead
plus small convolutions/matmuls, not a real model. `--scale small` (use `--size 256`) builds
components with the real pipelines' proportions at 1-9 M parameters (see `small_build`). For each
pipeline, in one process: the first call (eager executables / Dynamo + XLA compile) and the steady
state (median of --reps calls, the variants interleaved), all with output_type="np" (which
synchronizes). Ratios are against the compiled steady state. "tpu compiled" compiles the denoiser
only (the usage docs/diffusers.md shows);
"tpu compiled all" also compiles the VAE decoder and the text encoders, which otherwise run eagerly
(at 64x64 they cost Flux about as much as its four denoiser steps).
"""

import argparse
import statistics
import time

import numpy as np
import torch

import torchtpu
import torchtpu.integrations
from torchtpu.integrations import diffusers_tiny as tiny


# --scale small: the proportions of the real pipelines at a few million parameters: a VAE that
# downsamples 8x (so a 256x256 image is a 32x32 latent, 256 tokens after SD3's 2x2 patches or Flux's
# packing), attention heads of 64 channels, a few transformer layers, wider text encoders. The tiny
# test components (--scale tiny) have a VAE without downsampling (a 64x64 image is 4,096 tokens)
# and 8-channel heads: their SD3 is one head-dim-8 attention over 4,096 tokens and little else.
def small_vae(latent_channels, **kw):
    return tiny._vae((16, 32, 32, 32), latent_channels, 16, **kw)


def _small_sd3():
    """Stable Diffusion 3: a 4-layer SD3 transformer, two CLIP text encoders and a T5 one."""
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection

    parts = dict(
        transformer=SD3Transformer2DModel(
            sample_size=32,
            patch_size=2,
            in_channels=16,
            num_layers=4,
            attention_head_dim=64,
            num_attention_heads=4,
            caption_projection_dim=256,
            joint_attention_dim=256,
            pooled_projection_dim=128,
            out_channels=16,
        ),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=small_vae(16, shift_factor=0.0609, scaling_factor=1.5035, use_quant_conv=False, use_post_quant_conv=False),
        text_encoder=CLIPTextModelWithProjection(tiny.clip_text_config(hidden=64, projection=64)),
        tokenizer=tiny.clip_tokenizer(),
        text_encoder_2=CLIPTextModelWithProjection(tiny.clip_text_config(hidden=64, projection=64)),
        tokenizer_2=tiny.clip_tokenizer(),
        text_encoder_3=tiny.t5_encoder(d_model=256),
        tokenizer_3=tiny.t5_tokenizer(),
    )
    return diffusers.StableDiffusion3Pipeline(**parts)


def _small_sd():
    """Stable Diffusion 1.x: a two-block UNet and a CLIP text encoder."""
    import diffusers
    from diffusers import EulerDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel

    parts = dict(
        unet=UNet2DConditionModel(
            block_out_channels=(32, 64),
            layers_per_block=1,
            sample_size=32,
            in_channels=4,
            out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=64,
            norm_num_groups=32,
            attention_head_dim=1,
        ),
        scheduler=EulerDiscreteScheduler(
            beta_start=0.00085,
            beta_end=0.012,
            beta_schedule="scaled_linear",
            timestep_spacing="leading",
            steps_offset=1,
        ),
        vae=small_vae(4),
        text_encoder=CLIPTextModel(tiny.clip_text_config(hidden=64, projection=64)),
        tokenizer=tiny.clip_tokenizer(),
        safety_checker=None,
        feature_extractor=None,
        image_encoder=None,
    )
    return diffusers.StableDiffusionPipeline(**parts, requires_safety_checker=False)


def _small_flux():
    """Flux: a 2 + 2 layer Flux transformer, a CLIP and a T5 text encoder."""
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextModel

    parts = dict(
        transformer=FluxTransformer2DModel(
            patch_size=1,
            in_channels=64,
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=64,
            num_attention_heads=4,
            joint_attention_dim=256,
            pooled_projection_dim=64,
            axes_dims_rope=[16, 24, 24],
        ),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=small_vae(16, shift_factor=0.0609, scaling_factor=1.5035, use_quant_conv=False, use_post_quant_conv=False),
        text_encoder=CLIPTextModel(tiny.clip_text_config(hidden=64, projection=64)),
        tokenizer=tiny.clip_tokenizer(),
        text_encoder_2=tiny.t5_encoder(d_model=256),
        tokenizer_2=tiny.t5_tokenizer(),
    )
    return diffusers.FluxPipeline(**parts)


def small_build(kind):
    builders = {"sd3": _small_sd3, "sd": _small_sd, "flux": _small_flux}
    if kind not in builders:
        raise ValueError(kind)
    torch.manual_seed(0)
    pipe = builders[kind]()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def call(pipe, kind, args):
    t0 = time.perf_counter()
    img = pipe(**tiny.call_kwargs(kind, steps=args.steps, size=args.size)).images
    return time.perf_counter() - t0, img


def compile_all(pipe):
    pipe.vae.decoder.compile(backend="tpu", fullgraph=True, dynamic=False)
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        # not fullgraph: transformers' hidden-state capture (output_hidden_states=True, SD3) takes a lock
        if getattr(pipe, name, None) is not None:
            getattr(pipe, name).compile(backend="tpu", dynamic=False)
    return pipe


def bench(kind, args):
    build = tiny.build if args.scale == "tiny" else small_build
    cpu = build(kind)
    eager = build(kind).to("tpu")
    comp = build(kind).to("tpu")
    tiny.denoiser(comp).compile(backend="tpu", fullgraph=True, dynamic=False)
    comp_all = build(kind).to("tpu")
    tiny.denoiser(comp_all).compile(backend="tpu", fullgraph=True, dynamic=False)
    variants = {"torch CPU": cpu, "tpu eager": eager, "tpu compiled": comp, "tpu compiled all": compile_all(comp_all)}
    first, imgs = {}, {}
    for name, pipe in variants.items():
        m0 = torchtpu.metrics()
        first[name], imgs[name] = call(pipe, kind, args)
        if name == "tpu compiled":
            xla_first = torchtpu.metrics()["compiled_xla_compiles"] - m0["compiled_xla_compiles"]
    steady = {name: [] for name in variants}
    m0 = torchtpu.metrics()
    for _ in range(args.reps):
        for name, pipe in variants.items():
            steady[name].append(call(pipe, kind, args)[0])
    xla_steady = torchtpu.metrics()["compiled_xla_compiles"] - m0["compiled_xla_compiles"]  # all variants
    med = {k: statistics.median(v) for k, v in steady.items()}
    base = med["tpu compiled"]
    print(f"\n{kind}: {args.size}x{args.size}, {args.steps} steps, batch 1 (+ CFG where the pipeline uses it)")
    print(f"  {'variant':<18}{'first call ms':>15}{'steady ms':>12}{'x compiled':>12}{'max |d| vs CPU':>16}")
    for name in variants:
        d = np.abs(imgs[name] - imgs["torch CPU"]).max()
        print(f"  {name:<18}{first[name] * 1e3:>15.1f}{med[name] * 1e3:>12.1f}{med[name] / base:>12.2f}{d:>16.1e}")
    print(f"  compiled denoiser: {xla_first} XLA compile(s) on the first call, {xla_steady} in {args.reps} more calls")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kinds", default="sd3,sd,flux")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--scale", choices=("tiny", "small"), default="tiny")
    args = p.parse_args()
    torchtpu.integrations.install()
    print(f"torch {torch.__version__}, XLA platform {torch.tpu.platform()}, {torch.get_num_threads()} CPU threads")
    for kind in args.kinds.split(","):
        bench(kind, args)


if __name__ == "__main__":
    main()
