"""A first `generate()` in a new process with a warm on-disk cache, for two source trees side by side.

    python benchmarks/warm_first_generate.py --tree base=/path/a/src --tree new=/path/b/src [--rounds 3]

A small Llama with random weights (hidden 256, 4 layers, vocab 2000; transformers' LlamaForCausalLM),
a greedy generate() of 16 tokens after a 32-token prompt. Each tree gets its own cache directory,
warmed by one process first; then the trees alternate, a fresh process per round. Each process
reports the process CPU time (all threads) of its first generate() and its executable counts
(eager builds, op-key cache hits, programs JAX lowered in the first generate()). Medians per
tree; CPU time, as wall time means little on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def child():
    import time

    import jax.monitoring
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import torchtpu

    lowered = []  # JAX's lowerings to StableHLO (what a program loaded from the op-key cache skips)
    lowering = "/jax/core/compile/jaxpr_to_mlir_module_duration"
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _s, **_kw: lowered.append(1) if event == lowering else None
    )

    cfg = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=2000,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval().to("tpu")
    ids = torch.randint(0, cfg.vocab_size, (1, 32)).to("tpu")
    t = time.process_time()
    lowered.clear()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False, min_new_tokens=16)
    tokens = out.cpu().tolist()
    cpu = time.process_time() - t
    m = torchtpu.metrics()
    print(
        json.dumps(
            {
                "cpu_s": cpu,
                "eager_compiles": m["eager_compiles"],
                "op_store_hits": m.get("op_store_hits", 0),
                "lowered": len(lowered),
                "tokens": tokens,
            }
        )
    )


def run(src, cache):
    env = dict(os.environ, PYTHONPATH=src, TORCHTPU_COMPILE_CACHE="1", TORCHTPU_COMPILE_CACHE_DIR=cache)
    done = subprocess.run(
        [sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, timeout=1800, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", default=[], help="name=path of a torchtpu src folder")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child()
    trees = [t.split("=", 1) for t in args.tree]
    root = tempfile.mkdtemp(prefix="warm_first_generate-")
    caches = {name: os.path.join(root, name) for name, _ in trees}
    for name, src in trees:  # warm each tree's cache
        run(src, caches[name])
    results = {name: [] for name, _ in trees}
    for _ in range(args.rounds):
        for name, src in trees:
            results[name].append(run(src, caches[name]))
    tokens = {name: rs[0]["tokens"] for name, rs in results.items()}
    for name, rs in results.items():
        cpu = statistics.median(r["cpu_s"] for r in rs)
        print(
            f"{name:>8}: first generate() {cpu:.2f} s CPU (median of {len(rs)}: "
            f"{', '.join(format(r['cpu_s'], '.2f') for r in rs)}), eager builds {rs[0]['eager_compiles']}, "
            f"op-key cache hits {rs[0]['op_store_hits']}, programs lowered {rs[0]['lowered']}"
        )
    print("same tokens:", len({json.dumps(t) for t in tokens.values()}) == 1)


if __name__ == "__main__":
    main()
