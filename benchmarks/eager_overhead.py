"""Per-op eager cost on "tpu" beside raw JAX eager and torch CPU, measured in one run (issue 50 item 3).

    python benchmarks/eager_overhead.py [--iters 1000 --rounds 7 --ops add,sum(dim=1,keepdim)]
    taskset -c 1 python benchmarks/eager_overhead.py      (one core: less disturbed by other processes)

Each round times a batch of `iters` calls of every variant of an op in turn, each batch synchronised
at its end on every result it made (JAX dispatch is asynchronous). The measure is the process's CPU
time per call (all its threads: XLA:CPU's workers too), the minimum over the rounds (on a shared
machine the load only adds); ratios are of those minima. "tpu" runs each op in the strict eager mode
(one executable per op) and in the fused mode (the default: ops queued and run as compiled
segments). JAX eager is `jnp` / `jax.nn` on arrays already on the device, the same values; "JAX jit"
(where given) one precompiled `jax.jit` call of the same computation. 64x64 float32 operands: past
the engine's 16 KiB result memo, so every call really runs.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F


def interleaved(variants, iters, rounds=7, clock=time.process_time):
    """µs per call of each variant in each round. A round times one batch of `iters` calls of every
    variant in turn, so drift of a shared machine hits all of them alike; each batch ends with its
    variant's sync, which waits for every result it kept (none is dead code: the fused mode skips
    ops whose results nobody can read, and XLA:CPU runs larger ops asynchronously)."""

    def batch(fn, sync, mode, n):
        kept = []
        keep = kept.append
        with mode():
            start = clock()
            for _ in range(n):
                keep(fn())
            sync(kept)
            return (clock() - start) / n * 1e6

    for fn, sync, mode in variants.values():
        batch(fn, sync, mode, 50)
    samples = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (fn, sync, mode) in variants.items():
            samples[name].append(batch(fn, sync, mode, iters))
    return samples


def _cases():
    """op -> (tpu, JAX eager, precompiled jax.jit call or None, torch CPU) callables on the same values."""
    a_c, b_c = torch.randn(64, 64), torch.randn(64, 64)
    x_c, w_c, bias_c = torch.randn(64, 256), torch.randn(256, 256), torch.randn(256)
    idx_c = torch.randint(0, 64, (32,))
    a_t, b_t, x_t, w_t, bias_t, known_t = (t.to("tpu") for t in (a_c, b_c, x_c, w_c, bias_c, idx_c))
    # an index as a model makes it, on the device; `known_t`, just copied from the CPU, is one whose
    # values the host knows (storage/host_values.py): index_select checks those on the host per call
    idx_t = known_t.clone()
    a_j, b_j, x_j, w_j, bias_j, idx_j = (jnp.asarray(t.numpy()) for t in (a_c, b_c, x_c, w_c, bias_c, idx_c))
    # in-place targets of their own (the written values grow; their cost does not)
    acc_c, acc_t = a_c.clone(), a_t.clone()
    box = {"j": a_j, "w": a_j}

    def jax_add_():
        box["w"] = box["w"] + b_j
        return box["w"]

    def jax_inplace_view():
        box["j"] = box["j"].at[:, 4:12].add(b_j[:, :8])
        return box["j"]

    jit_add = jax.jit(jnp.add)
    jit_inplace_fn = jax.jit(lambda a, b: a.at[:, 4:12].add(b[:, :8]))
    jit_linear_gelu = jax.jit(lambda x, w, b: jax.nn.gelu(x @ w.T + b, approximate=False))

    def jit_inplace_view():
        box["j"] = jit_inplace_fn(box["j"], b_j)
        return box["j"]

    return {
        "add": (lambda: a_t + b_t, lambda: jnp.add(a_j, b_j), lambda: jit_add(a_j, b_j), lambda: a_c + b_c),
        "mul": (lambda: a_t * b_t, lambda: a_j * b_j, None, lambda: a_c * b_c),
        "matmul": (lambda: a_t @ b_t, lambda: a_j @ b_j, None, lambda: a_c @ b_c),
        "relu": (lambda: torch.relu(a_t), lambda: jax.nn.relu(a_j), None, lambda: torch.relu(a_c)),
        "sum(1)": (lambda: a_t.sum(1), lambda: jnp.sum(a_j, axis=1), None, lambda: a_c.sum(1)),
        "sum(dim=1,keepdim)": (
            lambda: a_t.sum(dim=1, keepdim=True),
            lambda: jnp.sum(a_j, axis=1, keepdims=True),
            None,
            lambda: a_c.sum(dim=1, keepdim=True),
        ),
        "softmax(-1)": (
            lambda: torch.softmax(a_t, -1),
            lambda: jax.nn.softmax(a_j, axis=-1),
            None,
            lambda: torch.softmax(a_c, -1),
        ),
        "gelu(approximate=tanh)": (
            lambda: F.gelu(a_t, approximate="tanh"),
            lambda: jax.nn.gelu(a_j, approximate=True),
            None,
            lambda: F.gelu(a_c, approximate="tanh"),
        ),
        "index_select(0)": (
            lambda: a_t.index_select(0, idx_t),
            lambda: jnp.take(a_j, idx_j, axis=0),
            None,
            lambda: a_c.index_select(0, idx_c),
        ),
        "index_select, known idx": (
            lambda: a_t.index_select(0, known_t),
            lambda: jnp.take(a_j, idx_j, axis=0),
            None,
            lambda: a_c.index_select(0, idx_c),
        ),
        "t() + b": (lambda: a_t.t() + b_t, lambda: a_j.T + b_j, None, lambda: a_c.t() + b_c),
        "cat(2)": (
            lambda: torch.cat([a_t, b_t]),
            lambda: jnp.concatenate([a_j, b_j]),
            None,
            lambda: torch.cat([a_c, b_c]),
        ),
        "add_": (lambda: acc_t.add_(b_t), jax_add_, None, lambda: acc_c.add_(b_c)),
        "add_ on a view": (
            lambda: a_t[:, 4:12].add_(b_t[:, :8]),
            jax_inplace_view,
            jit_inplace_view,
            lambda: a_c[:, 4:12].add_(b_c[:, :8]),
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
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", default="", help="comma-separated names of the ops to run (default: all)")
    args = parser.parse_args()
    n = args.iters
    cases = _cases()
    if args.ops:
        cases = {k: cases[k] for k in args.ops.split(",")}
    print(
        f"torch {torch.__version__}, jax {jax.__version__}, XLA platform {torch.tpu.platform()}, "
        f"{n} calls per batch, {args.rounds} rounds of every variant in turn; process CPU µs per call "
        "(min over rounds) and ratios of those; 64x64 float32 operands"
    )
    print(
        f"{'op':24s} {'strict':>7s} {'fused':>7s} {'JAX':>7s} {'JAX jit':>7s} {'CPU':>7s} "
        f"{'strict/JAX':>10s} {'fused/JAX':>10s} {'fused/CPU':>10s}"
    )
    plain = contextlib.nullcontext
    worst = 0.0
    for name, (tpu_fn, jax_fn, jit_fn, cpu_fn) in cases.items():
        variants = {
            "strict": (tpu_fn, _tpu_sync, lambda: torch.tpu.set_eager_mode("strict")),
            "fused": (tpu_fn, _tpu_sync, lambda: torch.tpu.set_eager_mode("fused")),
            "jax": (jax_fn, _jax_sync, plain),
            "cpu": (cpu_fn, _no_sync, plain),
        }
        if jit_fn is not None:
            variants["jit"] = (jit_fn, _jax_sync, plain)
        t = {k: min(v) for k, v in interleaved(variants, n, args.rounds).items()}
        jit = f"{t['jit']:7.1f}" if "jit" in t else f"{'-':>7s}"
        worst = max(worst, t["strict"] / t["jax"], t["fused"] / t["jax"])
        print(
            f"{name:24s} {t['strict']:7.1f} {t['fused']:7.1f} {t['jax']:7.1f} {jit} {t['cpu']:7.1f} "
            f"{t['strict'] / t['jax']:10.2f} {t['fused'] / t['jax']:10.2f} {t['fused'] / t['cpu']:10.2f}"
        )
    print(f"worst tpu / JAX eager: {worst:.2f}")


if __name__ == "__main__":
    main()
