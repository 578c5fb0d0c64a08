"""What two XLA:CPU-only lowerings cost, side by side with what they replace, in one run:

- complex multiply with each real product rounded (ops/dtypes.py `multiply`) against XLA's own complex
  multiply (which LLVM contracts into FMAs), complex64, 2^20 elements;
- randperm by two sorts of packed uint64 words (ops/random.py `_packed_permutation`) against
  `jax.random.permutation`, n = 2^25 (test_tensor_creation_ops' test_randperm) by default.

Wall and process CPU time per call (median of --repeats, after one warm-up call), and their ratios.
    python benchmarks/cpu_parity_cost.py [--n 33554432] [--repeats 3]
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

from torchtpu.ops.dtypes import rounded_complex_product  # noqa: E402
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
        f"{title}: new {nw * 1e3:.1f} ms wall {nc * 1e3:.1f} ms CPU; "
        f"before {ow * 1e3:.1f} ms wall {oc * 1e3:.1f} ms CPU; new/before wall {nw / ow:.2f}x CPU {nc / oc:.2f}x"
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2**25)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
