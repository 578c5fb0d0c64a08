"""Per-op eager latency on "tpu" beside raw JAX eager and torch CPU, measured in one run.

    python benchmarks/eager_overhead.py [--iters 2000 --rounds 7]

Each round times a batch of `iters` calls of every variant in turn, each batch synchronised at its
end on every result it made (JAX dispatch is asynchronous); figures are medians over the rounds.
"tpu" runs each op in the strict eager mode (one executable per op) and in the fused mode (ops
queued and run as compiled segments; TorchTPU's DEFER_AND_FUSE). Machines are noisy: compare the
ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F


def interleaved(variants, iters, rounds=7):
    """µs per call of each variant in each round. A round times one batch of `iters` calls of every
    variant in turn, so drift of a shared machine hits all of them alike; each batch ends with its
    variant's sync, which waits for every result it kept (none is dead code: the fused mode skips
    ops whose results nobody can read, and XLA:CPU runs larger ops asynchronously)."""

    def batch(fn, sync, mode, n):
        kept = []
        keep = kept.append
        with mode():
            start = time.perf_counter()
            for _ in range(n):
                keep(fn())
            sync(kept)
            return (time.perf_counter() - start) / n * 1e6

    for fn, sync, mode in variants.values():
        batch(fn, sync, mode, 50)
    samples = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (fn, sync, mode) in variants.items():
            samples[name].append(batch(fn, sync, mode, iters))
    return samples


def _cases():
    """op -> (tpu, raw JAX eager, one precompiled jax.jit call, torch CPU) callables on the same values."""
    a_c, b_c = torch.randn(64, 64), torch.randn(64, 64)
    x_c, w_c, bias_c = torch.randn(64, 256), torch.randn(256, 256), torch.randn(256)
    a_t, b_t, x_t, w_t, bias_t = (t.to("tpu") for t in (a_c, b_c, x_c, w_c, bias_c))
    a_j, b_j, x_j, w_j, bias_j = (jnp.asarray(t.numpy()) for t in (a_c, b_c, x_c, w_c, bias_c))
    view_src_t, view_src_c = b_t[:, :8], b_c[:, :8]
    box = {"j": a_j}

    def jax_inplace():
        box["j"] = box["j"].at[:, 4:12].add(b_j[:, :8])
        return box["j"]

    jit_add = jax.jit(jnp.add)
    jit_inplace_fn = jax.jit(lambda a, b: a.at[:, 4:12].add(b[:, :8]))
    jit_linear_gelu = jax.jit(lambda x, w, b: jax.nn.gelu(x @ w.T + b, approximate=False))

    def jit_inplace():
        box["j"] = jit_inplace_fn(box["j"], b_j)
        return box["j"]

    return {
        "add 64x64": (lambda: a_t + b_t, lambda: jnp.add(a_j, b_j), lambda: jit_add(a_j, b_j), lambda: a_c + b_c),
        "in-place add on a view": (
            lambda: a_t[:, 4:12].add_(view_src_t),
            jax_inplace,
            jit_inplace,
            lambda: a_c[:, 4:12].add_(view_src_c),
        ),
        "linear+gelu 64x256x256": (
            lambda: F.gelu(F.linear(x_t, w_t, bias_t)),
            lambda: jax.nn.gelu(x_j @ w_j.T + bias_j, approximate=False),
            lambda: jit_linear_gelu(x_j, w_j, bias_j),
            lambda: F.gelu(F.linear(x_c, w_c, bias_c)),
        ),
    }


def _no_sync(kept):
    pass


def _tpu_sync(kept):
    torch.tpu.synchronize()


def _jax_sync(kept):
    jax.block_until_ready(kept)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    n = args.iters
    cases = _cases()
    print(
        f"torch {torch.__version__}, jax {jax.__version__}, XLA platform {torch.tpu.platform()}, "
        f"{n} calls per batch, {args.rounds} rounds of every variant in turn; µs per call and ratios: "
        "medians over the rounds (a ratio is taken within each round)"
    )
    print(
        f"{'op':24s} {'tpu':>8s} {'tpu fused':>10s} {'JAX eager':>10s} {'JAX jit':>8s} {'torch CPU':>10s} "
        f"{'tpu/JAX eager':>14s} {'fused/JAX eager':>16s} {'tpu/JAX jit':>12s} {'tpu/CPU':>8s}"
    )
    plain = contextlib.nullcontext
    for name, (tpu_fn, jax_fn, jit_fn, cpu_fn) in cases.items():
        t = interleaved(
            {
                "tpu": (tpu_fn, _tpu_sync, lambda: torch.tpu.set_eager_mode("strict")),
                "fused": (tpu_fn, _tpu_sync, lambda: torch.tpu.set_eager_mode("fused")),
                "jax": (jax_fn, _jax_sync, plain),
                "jit": (jit_fn, _jax_sync, plain),
                "cpu": (cpu_fn, _no_sync, plain),
            },
            n,
            args.rounds,
        )

        def median(key, over=None, t=t):
            if over is None:
                return statistics.median(t[key])
            return statistics.median(a / b for a, b in zip(t[key], t[over]))

        print(
            f"{name:24s} {median('tpu'):8.1f} {median('fused'):10.1f} {median('jax'):10.1f} "
            f"{median('jit'):8.1f} {median('cpu'):10.1f} {median('tpu', 'jax'):14.2f} "
            f"{median('fused', 'jax'):16.2f} {median('tpu', 'jit'):12.2f} {median('tpu', 'cpu'):8.2f}"
        )


if __name__ == "__main__":
    main()
