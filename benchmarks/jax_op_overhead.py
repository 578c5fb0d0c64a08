"""Host time of one eager jax_op call against a built-in op of the same arity (two tensors and a float).

    python benchmarks/jax_op_overhead.py [n]     (n x n operands, default 64)

Both run their cached executable asynchronously; the loop measures the host work per call (dispatch,
cache key, executable call, output tensor) as the calling thread's CPU time (`time.thread_time`: on a
loaded machine wall time mostly measures the other processes), 64x64 operands (past the engine's 16 KiB result memo,
so both really run) with XLA's own work
on its threads, out of the measure. Medians of interleaved rounds.
"""

from __future__ import annotations

import statistics
import time

import jax
import torch

from torchtpu.kernels.pallas import jax_op


@jax_op("bench::scaled_add")
def scaled_add(x: jax.Array, y: jax.Array, alpha: float = 1.0) -> jax.Array:
    return x + alpha * y


def per_call_us(fn, n=2000):
    fn()
    torch.tpu.synchronize()
    t0 = time.thread_time()
    for _ in range(n):
        fn()
    t1 = time.thread_time()
    torch.tpu.synchronize()
    return (t1 - t0) / n * 1e6


def main():
    import sys

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    # n=64: past the engine's 16 KiB result memo, both run their executable; n=8: both return their kept
    # results (same input buffers), which leaves nothing but the host path: dispatch, key, lookup, tensor
    a = torch.randn(n, n, device="tpu")
    b = torch.randn(n, n, device="tpu")
    print(f"{n}x{n} float32 operands")
    cases = {
        "built-in torch.add(a, b, alpha=0.5)": lambda: torch.add(a, b, alpha=0.5),
        "built-in torch.ops.aten.add.Tensor(a, b, alpha=0.5)": lambda: torch.ops.aten.add.Tensor(a, b, alpha=0.5),
        "jax_op scaled_add(a, b, 0.5)": lambda: scaled_add(a, b, 0.5),
        "jax_op torch.ops.bench.scaled_add(a, b, 0.5)": lambda: torch.ops.bench.scaled_add(a, b, 0.5),
    }
    for fn in cases.values():
        per_call_us(fn, 200)
    results = {k: [] for k in cases}
    for _ in range(7):
        for name, fn in cases.items():
            results[name].append(per_call_us(fn))
    base = statistics.median(results["built-in torch.add(a, b, alpha=0.5)"])
    for name, times in results.items():
        m = statistics.median(times)
        print(f"{name:54s} {m:7.1f} us/call  ({m / base:.2f}x built-in)")


if __name__ == "__main__":
    main()
