"""Cold start on "tpu": first calls of ops on new shapes, and a model's first forward, against torch CPU.

    python benchmarks/cold_start.py [--shapes 8] [--rounds 2] [--qwen-layers 28] [--skip-qwen]

Nothing is served by the on-disk compile cache here (TORCHTPU_COMPILE_CACHE=0): every figure is what a
new process meets the first time. Side by side, in one run:

  new shapes   one process; for each of --shapes new shapes (n x m), a mix of ten ops (randn, a
               multiply-add-tanh chain, softmax, sum(0), matmul, layer_norm, cat, an index, a compare
               and where) and a copy of every result to the host, run by torch CPU, by "tpu" and by
               JAX (each op its own `jax.jit`, as an eager backend compiles them), each meeting the
               shape for the first time. Median milliseconds per shape, wall and process CPU time
               (the CPU time is steadier on a loaded machine); "tpu" results are compared with the
               CPU's (randn excepted: another stream).
  Llama        a fresh process per device and round: compile_llama.py's small Llama (hidden 512,
               4 layers), its first forward (1 x 32 tokens) then a second one.
  Qwen3-0.6B   a fresh process per device and round: Qwen3-0.6B's shape with random weights (built
               from its config, no download; --qwen-layers to shorten), the first token of a greedy
               `generate()` (prompt 32), i.e. the prefill's first call, then a second first token.

The ratios are tpu / CPU of the medians (and tpu / JAX for the new shapes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ["TORCHTPU_COMPILE_CACHE"] = "0"  # every first call compiles (set before torch loads us)

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- new shapes
def torch_mix(torch, x, device):
    import torch.nn.functional as F

    n, m = x.shape
    r = torch.randn(n, m, device=device)
    y = torch.tanh(x * 2 + 1)
    return [
        r,
        y,
        torch.softmax(x, -1),
        x.sum(0),
        x @ x.T,
        F.layer_norm(x, (m,)),
        torch.cat([x, y], 0),
        x[torch.arange(0, n, 2, device=device)],
        torch.where(x > y, x, y),
    ]


def jax_mix(jax, jnp, fns, x, key):
    n, m = x.shape
    r = fns["randn"](key, (n, m))
    y = fns["tanh"](x)
    return [
        r,
        y,
        fns["softmax"](x),
        fns["sum"](x),
        fns["matmul"](x),
        fns["layer_norm"](x),
        fns["cat"](x, y),
        fns["index"](x, jnp.arange(0, n, 2)),
        fns["where"](x, y),
    ]


def jax_fns(jax, jnp):
    def layer_norm(x):
        mean = x.mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

    return {
        "randn": jax.jit(lambda k, shape: jax.random.normal(k, shape), static_argnums=1),
        "tanh": jax.jit(lambda x: jnp.tanh(x * 2 + 1)),
        "softmax": jax.jit(lambda x: jax.nn.softmax(x, -1)),
        "sum": jax.jit(lambda x: x.sum(0)),
        "matmul": jax.jit(lambda x: x @ x.T),
        "layer_norm": jax.jit(layer_norm),
        "cat": jax.jit(lambda x, y: jnp.concatenate([x, y], 0)),
        "index": jax.jit(lambda x, i: x[i]),
        "where": jax.jit(lambda x, y: jnp.where(x > y, x, y)),
    }


def new_shapes(n_shapes):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    import torchtpu  # noqa: F401

    fns = jax_fns(jax, jnp)
    times = {"cpu": [], "tpu": [], "jax": []}
    mismatches = 0
    for i in range(n_shapes + 1):  # the first shape warms up each backend's one-time costs
        n, m = 24 + 3 * i, 40 + 5 * i
        x = torch.randn(n, m)
        for backend in ("cpu", "tpu", "jax"):
            w, c = time.perf_counter(), time.process_time()
            if backend == "jax":
                outs = [np.asarray(v) for v in jax_mix(jax, jnp, fns, jnp.asarray(x.numpy()), jax.random.key(i))]
            else:
                outs = [v.cpu() for v in torch_mix(torch, x.to(backend), backend)]
            elapsed = (time.perf_counter() - w, time.process_time() - c)
            if i:
                times[backend].append(elapsed)
            if backend == "cpu":
                expected = outs
            elif backend == "tpu":
                for got, want in zip(outs[1:], expected[1:]):
                    try:
                        torch.testing.assert_close(got, want)
                    except AssertionError:
                        mismatches += 1
    return times, mismatches


# ---------------------------------------------------------------- models (child processes)
def model_child(kind, device, qwen_layers):
    import torch

    if device == "tpu":
        import torchtpu  # noqa: F401
    if kind == "llama":
        sys.path.insert(0, HERE)
        from compile_llama import build

        model = build("sdpa")
        ids = torch.randint(0, 8000, (1, 32), generator=torch.Generator().manual_seed(0))
    else:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        sys.path.insert(0, HERE)
        from real_scale import QWEN3_0_6B

        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config(**{**QWEN3_0_6B, "num_hidden_layers": qwen_layers})).eval()
        ids = torch.randint(1000, 100000, (1, 32), generator=torch.Generator().manual_seed(1))
    model = model.to(device).eval()
    ids = ids.to(device)
    if device == "tpu":
        torch.tpu.synchronize()

    def step():
        with torch.no_grad():
            if kind == "llama":
                return model(ids).logits[:, -1].argmax(-1).cpu()
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, do_sample=False)
            return out[:, -1].cpu()

    result = {}
    for name in ("first", "second"):
        w, c = time.perf_counter(), time.process_time()
        token = step()
        result[name] = (time.perf_counter() - w, time.process_time() - c)
    result["token"] = token.tolist()
    print(json.dumps(result), flush=True)


def run_model(kind, device, qwen_layers):
    env = dict(os.environ, TORCHTPU_COMPILE_CACHE="0")
    if device == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # torch CPU alone, as a CPU user has it
    cmd = [sys.executable, __file__, "--child", kind, "--device", device, "--qwen-layers", str(qwen_layers)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{kind} on {device} failed:\n{out.stderr[-3000:]}")


# ---------------------------------------------------------------- report
def med(pairs, k):
    return statistics.median(p[k] for p in pairs) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="model processes per device (alternating)")
    ap.add_argument("--qwen-layers", type=int, default=28)
    ap.add_argument("--skip-qwen", action="store_true")
    ap.add_argument("--skip-models", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--device", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return model_child(args.child, args.device, args.qwen_layers)

    print(f"load: {os.getloadavg()[0]:.1f} (1-min average), {os.cpu_count()} CPUs")
    times, mismatches = new_shapes(args.shapes)
    print(f"\nnew shapes ({args.shapes}), ten ops + host copies, median ms per shape (wall / process CPU):")
    for b in ("cpu", "tpu", "jax"):
        print(f"  {b:4s} {med(times[b], 0):9.1f} / {med(times[b], 1):9.1f}")
    for k, label in ((0, "wall"), (1, "CPU")):
        tpu = med(times["tpu"], k)
        print(
            f"  tpu / cpu ({label}) {tpu / med(times['cpu'], k):7.1f}x   tpu / jax {tpu / med(times['jax'], k):5.2f}x"
        )
    print(f"  tpu results not close to the CPU's: {mismatches}")

    kinds = [] if args.skip_models else ["llama"] + ([] if args.skip_qwen else ["qwen"])
    for kind in kinds:
        res = {"cpu": [], "tpu": []}
        for _ in range(args.rounds):
            for device in ("cpu", "tpu"):
                res[device].append(run_model(kind, device, args.qwen_layers))
        label = (
            "small Llama, first forward"
            if kind == "llama"
            else f"Qwen3-0.6B shape ({args.qwen_layers} layers), first token"
        )
        print(f"\n{label}, median ms (wall / process CPU) over {args.rounds} processes each:")
        for device in ("cpu", "tpu"):
            first = [r["first"] for r in res[device]]
            second = [r["second"] for r in res[device]]
            print(
                f"  {device}: first {med(first, 0):8.1f} / {med(first, 1):8.1f}   "
                f"second {med(second, 0):8.1f} / {med(second, 1):8.1f}"
            )
        for k, name in ((0, "wall"), (1, "CPU")):
            ratio = med([r["first"] for r in res["tpu"]], k) / med([r["first"] for r in res["cpu"]], k)
            print(f"  first call tpu / cpu ({name}): {ratio:.2f}x")
        same = all(t["token"] == c["token"] for t, c in zip(res["tpu"], res["cpu"]))
        print(f"  tokens equal the CPU's: {same}")


if __name__ == "__main__":
    main()
