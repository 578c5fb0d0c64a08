"""Stable Diffusion 3 (tiny, random weights) on the "tpu" device: eager, then a compiled transformer.

    python examples/diffusers_tiny.py [--kind sd3|sd|flux] [--size 32] [--steps 4]

Runs on XLA:CPU in about a minute. The components are tiny and random (torchtpu/integrations/diffusers_tiny.py builds
them without downloads), so the "images" are noise; with real weights the code is the same:

    pipe = StableDiffusion3Pipeline.from_pretrained(path, torch_dtype=torch.bfloat16).to("tpu")
    pipe.transformer.compile(backend="tpu", fullgraph=True, dynamic=False)
"""

import argparse
import time

import numpy as np
import torch

import torchtpu
import torchtpu.integrations
from torchtpu.integrations import diffusers_tiny as tiny


def timed(pipe, kind, args):
    t0 = time.perf_counter()
    img = pipe(**tiny.call_kwargs(kind, steps=args.steps, size=args.size)).images  # numpy: synchronizes
    return time.perf_counter() - t0, img


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kind", default="sd3", choices=tiny.KINDS)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    torchtpu.integrations.install()  # keeps tied weights (T5's embedding) tied across .to("tpu")

    pipe = tiny.build(args.kind)
    t_cpu, ref = timed(pipe, args.kind, args)
    print(f"{args.kind}: {args.size}x{args.size}, {args.steps} steps; XLA platform {torch.tpu.platform()}")
    print(f"  torch CPU              {t_cpu * 1e3:8.1f} ms")

    pipe.to("tpu")
    print(
        f"  weights on tpu: {torch.tpu.memory_allocated() / 2**20:.2f} MiB "
        f"(parameters+buffers {tiny.param_bytes(pipe) / 2**20:.2f} MiB)"
    )
    first, img = timed(pipe, args.kind, args)
    steady, img = timed(pipe, args.kind, args)
    print(
        f"  tpu eager   first call {first * 1e3:8.1f} ms   steady {steady * 1e3:8.1f} ms   "
        f"max |tpu - cpu| {np.abs(img - ref).max():.1e}"
    )

    den = tiny.denoiser(pipe)
    den.compile(backend="tpu", fullgraph=True, dynamic=False)
    m0 = torchtpu.metrics()
    first, img = timed(pipe, args.kind, args)
    m1 = torchtpu.metrics()
    steady, img = timed(pipe, args.kind, args)
    m2 = torchtpu.metrics()
    print(
        f"  tpu compiled first call {first * 1e3:7.1f} ms   steady {steady * 1e3:8.1f} ms   "
        f"max |tpu - cpu| {np.abs(img - ref).max():.1e}"
    )
    print(
        f"  XLA compiles: first call {m1['compiled_xla_compiles'] - m0['compiled_xla_compiles']}, "
        f"second call {m2['compiled_xla_compiles'] - m1['compiled_xla_compiles']}"
    )


if __name__ == "__main__":
    main()
