"""Per-op eager latency on "tpu" beside raw JAX eager and torch CPU, measured in one run.

    python benchmarks/eager_overhead.py [--iters 2000]

Each figure is the median over several timed batches of `iters` calls, synchronised at the end
of each batch (JAX dispatch is asynchronous). "tpu" runs each op in the strict eager mode (one
executable per op) and in the fused mode (ops queued and run as compiled segments; TorchTPU's
DEFER_AND_FUSE). Machines are noisy: compare the ratios.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F


def timed(fn, sync, iters, repeats=7):
    """Median µs per call; every result is kept until the batch's sync, so none is dead code (the
    fused mode skips ops whose results nobody can read, and XLA would drop them from a segment)."""
    for _ in range(50):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        kept = []
        keep = kept.append
        start = time.perf_counter()
        for _ in range(iters):
            keep(fn())
        sync()
        samples.append((time.perf_counter() - start) / iters * 1e6)
        del kept
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()
    n = args.iters

    a_c, b_c = torch.randn(64, 64), torch.randn(64, 64)
    x_c, w_c, bias_c = torch.randn(64, 256), torch.randn(256, 256), torch.randn(256)
    a_t, b_t, x_t, w_t, bias_t = (t.to("tpu") for t in (a_c, b_c, x_c, w_c, bias_c))
    a_j, b_j, x_j, w_j, bias_j = (jnp.asarray(t.numpy()) for t in (a_c, b_c, x_c, w_c, bias_c))
    view_src_t, view_src_c = b_t[:, :8], b_c[:, :8]
    box = {"j": a_j}

    def jax_inplace():
        box["j"] = box["j"].at[:, 4:12].add(b_j[:, :8])
        return box["j"]

    def no_sync():
        pass

    def tpu_sync():
        torch.tpu.synchronize()

    def jax_sync():
        box["j"].block_until_ready()
        a_j.block_until_ready()

    jit_add = jax.jit(jnp.add)
    jit_inplace_fn = jax.jit(lambda a, b: a.at[:, 4:12].add(b[:, :8]))
    jit_linear_gelu = jax.jit(lambda x, w, b: jax.nn.gelu(x @ w.T + b, approximate=False))

    def jit_inplace():
        box["j"] = jit_inplace_fn(box["j"], b_j)
        return box["j"]

    # (tpu, raw JAX eager, one precompiled jax.jit call, torch CPU)
    cases = {
        "add 64x64": (lambda: a_t + b_t, lambda: jnp.add(a_j, b_j), lambda: jit_add(a_j, b_j),
                      lambda: a_c + b_c),
        "in-place add on a view": (lambda: a_t[:, 4:12].add_(view_src_t), jax_inplace, jit_inplace,
                                   lambda: a_c[:, 4:12].add_(view_src_c)),
        "linear+gelu 64x256x256": (lambda: F.gelu(F.linear(x_t, w_t, bias_t)),
                                   lambda: jax.nn.gelu(x_j @ w_j.T + bias_j, approximate=False),
                                   lambda: jit_linear_gelu(x_j, w_j, bias_j),
                                   lambda: F.gelu(F.linear(x_c, w_c, bias_c))),
    }
    print(f"torch {torch.__version__}, jax {jax.__version__}, XLA platform {torch.tpu.platform()}, "
          f"{n} calls per batch, median of 7 batches (us per call)")
    print(f"{'op':24s} {'tpu':>8s} {'tpu fused':>10s} {'JAX eager':>10s} {'JAX jit':>8s} {'torch CPU':>10s} "
          f"{'tpu/JAX eager':>14s} {'fused/JAX eager':>16s} {'tpu/JAX jit':>12s} {'tpu/CPU':>8s}")
    for name, (tpu_fn, jax_fn, jit_fn, cpu_fn) in cases.items():
        with torch.tpu.set_eager_mode("strict"):
            t_tpu = timed(tpu_fn, tpu_sync, n)
        with torch.tpu.set_eager_mode("fused"):
            t_fused = timed(tpu_fn, tpu_sync, n)
        t_jax = timed(jax_fn, jax_sync, n)
        t_jit = timed(jit_fn, jax_sync, n)
        t_cpu = timed(cpu_fn, no_sync, n)
        print(f"{name:24s} {t_tpu:8.1f} {t_fused:10.1f} {t_jax:10.1f} {t_jit:8.1f} {t_cpu:10.1f} "
              f"{t_tpu / t_jax:14.2f} {t_fused / t_jax:16.2f} {t_tpu / t_jit:12.2f} {t_tpu / t_cpu:8.2f}")


if __name__ == "__main__":
    main()
