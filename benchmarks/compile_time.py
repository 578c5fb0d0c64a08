"""First-call latency of eager ops on "tpu": XLA compile time per new op signature, side by side.

    python benchmarks/compile_time.py [--shapes 12]

Every call below meets a signature it has not met before, so each one builds and compiles an
executable (the persistent cache is off here). Each shape runs every op twice, in alternating
order: with the eager engine's own choice for one-op executables (on XLA:CPU: LLVM -O1, and the
LLVM IR fusion emitters for an op without a reduction) and with XLA's default (the MLIR fusion
emitters, LLVM -O3, through `torch.tpu.compiler.custom_compiler_options`); it prints the median
milliseconds per first call of each op and the ratio. The outputs are compared with the CPU, so a
faster compile that changed a result would show. Machines are noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ["TORCHTPU_COMPILE_CACHE"] = "0"  # every first call compiles (set before torch loads us)

import torch
import torch.nn.functional as F

from torchtpu.eager import xla_options

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


def first_call_ms(fn, a, b, a_c, b_c):
    """ms of one op's first call on a signature nobody met (compile included); checked against the CPU."""
    start = time.perf_counter()
    out = fn(a, b)
    torch.tpu.synchronize()
    ms = (time.perf_counter() - start) * 1e3
    torch.testing.assert_close(out.cpu(), fn(a_c, b_c), rtol=1e-4, atol=1e-5)
    return ms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", type=int, default=12)
    args = parser.parse_args()
    print(
        f"platform {torch.tpu.platform()}; engine defaults for one-op executables: "
        f"{xla_options.op_options(None) or 'none'}"
    )
    xla_default = {"xla_cpu_use_fusion_emitters": True, "xla_backend_optimization_level": 3}
    warm = torch.randn(3, 5).to("tpu")
    for fn in OPS.values():  # imports, lowering caches
        fn(warm, warm)
    times = {name: {"engine": [], "xla": []} for name in OPS}
    for i in range(args.shapes):
        # each shape is compiled under both settings (the options key executables apart), in
        # alternating order, so both meet the same shapes and the same machine load
        rows, cols = 40 + 3 * i, 17 + (7 * i) % 29
        a_c, b_c = torch.randn(rows, cols), torch.randn(rows, cols)
        a, b = a_c.to("tpu"), b_c.to("tpu")
        for name, fn in OPS.items():
            for mode in ("engine", "xla") if i % 2 == 0 else ("xla", "engine"):
                if mode == "engine":
                    times[name][mode].append(first_call_ms(fn, a, b, a_c, b_c))
                else:
                    with torch.tpu.compiler.custom_compiler_options(xla_default):
                        times[name][mode].append(first_call_ms(fn, a, b, a_c, b_c))
    print(f"median ms per first call over {args.shapes} shapes")
    print(f"{'op':14s} {'engine':>8s} {'XLA default':>12s} {'ratio':>6s}")
    sums = [0.0, 0.0]
    for name in OPS:
        e, x = statistics.median(times[name]["engine"]), statistics.median(times[name]["xla"])
        sums[0] += e
        sums[1] += x
        print(f"{name:14s} {e:8.1f} {x:12.1f} {e / x:6.2f}")
    print(f"{'sum of medians':14s} {sums[0]:8.1f} {sums[1]:12.1f} {sums[0] / sums[1]:6.2f}")


if __name__ == "__main__":
    main()
