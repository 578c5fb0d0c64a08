"""What two XLA:CPU-only lowerings cost, side by side with what they replace, in one run:

- complex multiply with each real product rounded (ops/dtypes.py `multiply`) against XLA's own complex
  multiply (which LLVM contracts into FMAs), complex64, 2^20 elements;
- randperm by two sorts of packed uint64 words (ops/random.py `_packed_permutation`) against
  `jax.random.permutation`, n = 2^25 (test_tensor_creation_ops' test_randperm) by default;
- division by a broadcast tensor (ops/dtypes.py `true_divide`: IEEE divisions) against XLA's rewrite
  into a multiplication by the reciprocal, 1024x1024 / (1024, 1) and x / x.sum(-1, keepdims=True), as the
  eager op's program and inside a torch.compile(backend="tpu") graph (`a / b` against `a * (1 / b)`);
- float64 -> float32 and float32 -> float64 conversions keeping subnormals (ops/dtypes.py `convert`)
  against XLA's own, 2^22 elements.

Wall and process CPU time per call (median of --repeats, after one warm-up call), and their ratios.
    python benchmarks/cpu_parity_cost.py [--n 33554432] [--repeats 3] [--only division]
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
jax.config.update("jax_enable_x64", True)

from torchtpu.ops.dtypes import convert, rounded_complex_product, true_divide  # noqa: E402
from torchtpu.ops.random import _packed_permutation  # noqa: E402


def _timed(fn, args, repeats):
    jax.block_until_ready(fn(*args))  # compile
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn(*args))
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return float(np.median(walls)), float(np.median(cpus))


def _compare(title, new, old, args, repeats):
    (nw, nc), (ow, oc) = _timed(new, args, repeats), _timed(old, args, repeats)
    print(
        f"{title}: new {nw * 1e3:.2f} ms wall {nc * 1e3:.2f} ms CPU; "
        f"before {ow * 1e3:.2f} ms wall {oc * 1e3:.2f} ms CPU; new/before wall {nw / ow:.2f}x CPU {nc / oc:.2f}x"
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2**25)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["multiply", "randperm", "division"])
    args = parser.parse_args()
    if args.only == "division":
        return _division(max(args.repeats, 30))
    rng = np.random.default_rng(0)
    a, b = (
        jnp.asarray((rng.standard_normal(2**20) + 1j * rng.standard_normal(2**20)).astype(np.complex64))
        for _ in range(2)
    )
    _compare("complex64 multiply, 2^20", jax.jit(rounded_complex_product), jax.jit(lambda x, y: x * y), (a, b), 20)
    key = jax.random.key(0)
    n = args.n
    _compare(
        f"randperm, n={n}",
        jax.jit(lambda k: _packed_permutation(k, n)),
        jax.jit(lambda k: jax.random.permutation(k, n)),
        (key,),
        args.repeats,
    )


def _division(repeats):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.random((1024, 1024), np.float32))
    y = jnp.asarray(rng.random((1024, 1), np.float32) + 0.5)
    _compare("divide by (1024,1)", jax.jit(true_divide), jax.jit(lambda a, b: a / b), (x, y), repeats)

    def softmax_like(divide):
        return jax.jit(lambda a: divide(a, a.sum(-1, keepdims=True)))

    _compare("a / a.sum(-1)", softmax_like(true_divide), softmax_like(lambda a, b: a / b), (x,), repeats)
    import torch

    xt, yt = torch.from_numpy(np.array(x)).to("tpu"), torch.from_numpy(np.array(y)).to("tpu")
    for title, exact, rewritten in (
        ("compiled a / b", lambda a, b: a / b, lambda a, b: a * (1 / b)),
        (
            "compiled a / a.sum(-1)",
            lambda a, b: a / a.sum(-1, keepdim=True),
            lambda a, b: a * (1 / a.sum(-1, keepdim=True)),
        ),
    ):
        new, old = (torch.compile(f, backend="tpu") for f in (exact, rewritten))
        _compare(title, lambda *a, f=new: f(*a).sum().item(), lambda *a, f=old: f(*a).sum().item(), (xt, yt), repeats)
    wide = jnp.asarray(rng.standard_normal(2**22) * 1e-38)
    _compare(
        "float64 -> float32, 2^22",
        jax.jit(lambda v: convert(v, jnp.float32)),
        jax.jit(lambda v: v.astype(jnp.float32)),
        (wide,),
        repeats,
    )
    narrow = wide.astype(jnp.float32)
    _compare(
        "float32 -> float64, 2^22",
        jax.jit(lambda v: convert(v, jnp.float64)),
        jax.jit(lambda v: v.astype(jnp.float64)),
        (narrow,),
        repeats,
    )


if __name__ == "__main__":
    main()
