"""Bytes an eager op moves on a TPU, against the same jnp program (issue 46 item 5).

Runs a few eager ops on "tpu" under the TPU compile check (XLA:TPU from libtpu, compile-only: no chip
needed) and compares XLA:TPU's `cost_analysis()` 'bytes accessed' of each op's executable with that of
the same computation written in jax.numpy on arrays of the op's shapes, compiled the same way.

    python benchmarks/tpu_layout.py [--topology v5e:2x2] [--size 1024]
"""

from __future__ import annotations

import argparse
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="v5e:2x2")
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    os.environ["TORCHTPU_TPU_COMPILE_CHECK"] = args.topology
    os.environ.setdefault("TORCHTPU_EAGER_MODE", "strict")  # one executable per op, nothing fused

    import jax.numpy as jnp
    import torch

    from torchtpu.eager import tpu_check

    n = args.size
    cases = {
        # name: (torch op on tpu tensors, jnp twin, shapes, dtype)
        "matmul": (lambda a, b: a @ b, lambda a, b: a @ b, [(n, n), (n, n)], torch.bfloat16),
        "add": (lambda a, b: a + b, lambda a, b: a + b, [(n, n), (n, n)], torch.float32),
        "softmax": (lambda a: a.softmax(-1), lambda a: jax.nn.softmax(a, axis=-1), [(n, n)], torch.float32),
        "transposed copy": (lambda a: a.t().contiguous(), lambda a: a.T.copy(), [(n, n)], torch.float32),
        "linear (x @ W.T)": (
            lambda x, w: torch.nn.functional.linear(x, w),
            lambda x, w: x @ w.T,
            [(8, n), (4 * n, n)],
            torch.bfloat16,
        ),
    }
    import jax

    globals()["jax"] = jax
    print(f"XLA:TPU ({args.topology}) bytes accessed per program, eager op vs jnp on shaped arrays")
    print(f"{'op':18s} {'eager MB':>10s} {'jnp MB':>10s} {'ratio':>7s}")
    worst = 0.0
    for name, (op, twin, shapes, dtype) in cases.items():
        inputs = [torch.randn(s, dtype=dtype).to("tpu") for s in shapes]
        torch.tpu.synchronize()
        tpu_check.reset_for_test()
        op(*inputs)
        torch.tpu.synchronize()
        eager = [p for p in tpu_check.report().programs if p.ok]
        eager_bytes = max(p.cost.get("bytes accessed", 0.0) for p in eager)
        tpu_check.reset_for_test()
        arrays = [jnp.asarray(t.cpu().float().numpy()).astype(jnp.dtype(str(dtype).split(".")[1])) for t in inputs]
        tpu_check.jit(twin, f"jnp {name}")(*arrays)
        ref_bytes = tpu_check.cost_of(f"jnp {name}")[0].get("bytes accessed", 0.0)
        ratio = eager_bytes / ref_bytes
        worst = max(worst, ratio)
        print(f"{name:18s} {eager_bytes / 1e6:10.2f} {ref_bytes / 1e6:10.2f} {ratio:7.2f}x")
    print(f"worst ratio {worst:.2f}x (issue 46 item 5: within 1.1x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
