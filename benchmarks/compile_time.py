"""First-call latency of eager ops on "tpu": XLA compile time per new op signature, side by side.

    python benchmarks/compile_time.py [--rounds 3] [--shapes 6]

Every call below meets a shape it has not met before, so each one builds and compiles an
executable (the persistent cache is off here). Rounds alternate the eager engine's own compiler
options for one-op executables (on XLA:CPU: the LLVM IR fusion emitters) with XLA's defaults (the
MLIR fusion emitters, through `torch.tpu.compiler.custom_compiler_options`), and print the median
milliseconds per first call of each op and the ratio. The outputs are compared with the CPU, so a
faster compile that changed a result would show. Machines are noisy: compare the ratios.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ["TORCHTPU_COMPILE_CACHE"] = "0"   # every first call compiles (set before torch loads us)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from torchtpu.eager import xla_options  # noqa: E402

OPS = {
    "add": lambda a, b: a + b,
    "mul+tanh": lambda a, b: torch.tanh(a * b),
    "softmax": lambda a, b: torch.softmax(a, -1),
    "layer_norm": lambda a, b: F.layer_norm(a, a.shape[-1:]),
    "gelu": lambda a, b: F.gelu(a),
    "sum(dim)": lambda a, b: a.sum(0),
    "matmul": lambda a, b: a @ b.T,
    "cumsum": lambda a, b: a.cumsum(1),
    "where>": lambda a, b: torch.where(a > b, a, b),
    "index_select": lambda a, b: a.index_select(0, torch.arange(0, a.shape[0], 2, device=a.device)),
}


def first_calls(shape_base, shapes):
    """ms per first call of each op (median over `shapes` new shapes); checks against the CPU."""
    per = {name: [] for name in OPS}
    for i in range(shapes):
        rows, cols = shape_base + 2 * i, 17 + (shape_base + i) % 29
        a_c, b_c = torch.randn(rows, cols), torch.randn(rows, cols)
        a, b = a_c.to("tpu"), b_c.to("tpu")
        torch.tpu.synchronize()
        for name, fn in OPS.items():
            start = time.perf_counter()
            out = fn(a, b)
            torch.tpu.synchronize()
            per[name].append((time.perf_counter() - start) * 1e3)
            torch.testing.assert_close(out.cpu(), fn(a_c, b_c), rtol=1e-4, atol=1e-5)
    return {name: statistics.median(v) for name, v in per.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", type=int, default=6)
    args = parser.parse_args()
    print(f"platform {torch.tpu.platform()}; engine defaults for one-op executables: "
          f"{xla_options.op_options(None) or 'none'}")
    first_calls(3, 2)   # warm: imports, the first executables, the lowering caches
    results = {"engine": [], "xla": []}
    base = 40
    for _ in range(args.rounds):
        for mode in ("engine", "xla"):
            base += 2 * args.shapes + 1   # shapes nobody met before
            if mode == "engine":
                results[mode].append(first_calls(base, args.shapes))
            else:
                with torch.tpu.compiler.custom_compiler_options({"xla_cpu_use_fusion_emitters": True}):
                    results[mode].append(first_calls(base, args.shapes))
    print(f"{'op':14s} {'engine ms':>10s} {'XLA default ms':>15s} {'ratio':>6s}")
    totals = {}
    for name in OPS:
        e = statistics.median(r[name] for r in results["engine"])
        x = statistics.median(r[name] for r in results["xla"])
        totals[name] = (e, x)
        print(f"{name:14s} {e:10.1f} {x:15.1f} {e / x:6.2f}")
    e, x = sum(v[0] for v in totals.values()), sum(v[1] for v in totals.values())
    print(f"{'all ops':14s} {e:10.1f} {x:15.1f} {e / x:6.2f}")


if __name__ == "__main__":
    main()
