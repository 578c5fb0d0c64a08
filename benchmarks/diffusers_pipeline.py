"""End-to-end Diffusers pipeline time: torch CPU vs "tpu" eager vs "tpu" with a compiled denoiser.

    TORCHTPU_COMPILE_CACHE=0 python benchmarks/diffusers_pipeline.py [--kinds sd3,sd,flux] [--size 64] [--steps 4] [--reps 3]

Tiny random components (tests/diffusers_tiny.py), so absolute numbers measure framework overhead
plus small convolutions/matmuls, not a real model. For each pipeline, in one process: the first call
(eager executables / Dynamo + XLA compile) and the steady state (median of --reps calls, the three
variants interleaved), all with output_type="np" (which synchronizes). Ratios are against the
compiled steady state. "tpu compiled" compiles the denoiser only (the usage docs/diffusers.md shows);
"tpu compiled all" also compiles the VAE decoder and the text encoders, which otherwise run eagerly
(at 64x64 they cost Flux about as much as its four denoiser steps).
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

import torchtpu
import torchtpu.integrations

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import diffusers_tiny as tiny  # noqa: E402


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
    cpu = tiny.build(kind)
    eager = tiny.build(kind).to("tpu")
    comp = tiny.build(kind).to("tpu")
    tiny.denoiser(comp).compile(backend="tpu", fullgraph=True, dynamic=False)
    comp_all = tiny.build(kind).to("tpu")
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
    xla_steady = torchtpu.metrics()["compiled_xla_compiles"] - m0["compiled_xla_compiles"]   # all variants
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
    args = p.parse_args()
    torchtpu.integrations.install()
    print(f"torch {torch.__version__}, XLA platform {torch.tpu.platform()}, {torch.get_num_threads()} CPU threads")
    for kind in args.kinds.split(","):
        bench(kind, args)


if __name__ == "__main__":
    main()
