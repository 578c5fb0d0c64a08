"""Greedy MoE decoding tokens/s: a Qwen3-MoE-shaped model (2 layers, 64 experts, top-8, hidden 256), batch
64, on "tpu" (eager and compiled) and torch CPU, with each experts implementation, in one run.

    python benchmarks/moe_decode.py [--new-tokens 16 --batch 64 --repeats 2] [--profile]

The model is built from a config (random weights, no download). Experts implementations:
  loop        Transformers' experts_implementation="eager": a Python loop over the hit experts
  grouped_mm  Transformers' default on "tpu": torch._grouped_mm, lowered to XLA's ragged dot
  hub kernel  kernels/torchtpu-kernels' `moe_experts` (a jax_op: sort, two ragged dots, gating and the
              weighted sum in one executable), through Transformers' ExpertsInterface
Every mode must produce the CPU grouped_mm run's tokens. The compiled modes compile the model's forward
with torch.compile(backend="tpu", fullgraph=True) over a static cache. `--profile` prints, per decode step
of the eager modes, the executables called, the compiles and the host syncs (device->host copies).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
from generate import run  # greedy generate() of exactly args.new_tokens tokens (benchmarks/generate.py)

import torchtpu

REPO = Path(__file__).resolve().parents[1] / "kernels" / "torchtpu-kernels"


def build(args):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        moe_intermediate_size=args.expert_width,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=args.hidden // 8,
        num_experts=args.experts,
        num_experts_per_tok=args.top_k,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # the experts' weights are created empty
            p.normal_(0, 0.05)
    return model


def set_experts(model, impl):
    for m in model.modules():
        if hasattr(m, "config"):
            m.config._experts_implementation = impl


def measure(name, model, ids, args, results, reference=None, **kw):
    start = time.perf_counter()
    try:
        out = run(model, ids, args, **kw)
    except Exception as e:  # noqa: BLE001 - one mode failing must not hide the others
        print(f"{name:<40} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
        return None
    cold = time.perf_counter() - start
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = run(model, ids, args, **kw)
        times.append(time.perf_counter() - start)
    tps = args.new_tokens * args.batch / statistics.median(times)
    same = "" if reference is None else ("  tokens == cpu" if torch.equal(out, reference) else "  TOKENS DIFFER")
    print(f"{name:<40} {tps:9.1f} tok/s   (first run {cold:6.1f} s){same}", flush=True)
    results[name] = tps
    return out


def profile(name, model, ids, args, **kw):
    """Executables called, compiles and host syncs per decoded token (one warm generate)."""
    run(model, ids, args, **kw)
    torchtpu.reset_metrics()
    start = time.perf_counter()
    run(model, ids, args, **kw)
    seconds = time.perf_counter() - start
    m = torchtpu.metrics()
    steps = args.new_tokens
    calls = m.get("eager_cache_hits", 0) + m.get("eager_compiles", 0)
    print(
        f"  {name:<38} per step: {calls / steps:6.1f} eager op calls, "
        f"{m.get('eager_compiles', 0) / steps:5.2f} compiles, {m.get('d2h_transfers', 0) / steps:5.1f} host syncs, "
        f"{m.get('eager_results_reused', 0) / steps + m.get('eager_constants_reused', 0) / steps:5.1f} reused "
        f"results; {seconds / steps * 1e3:7.1f} ms/step",
        flush=True,
    )


def _arguments():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--expert-width", type=int, default=128, help="moe_intermediate_size")
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--skip-loop", action="store_true", help="skip the slow expert-loop modes")
    p.add_argument("--skip-compiled", action="store_true")
    p.add_argument("--profile", action="store_true")
    return p.parse_args()


def main():
    args = _arguments()
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    from kernels import get_local_kernel

    hub = get_local_kernel(REPO)
    ALL_EXPERTS_FUNCTIONS.register("torchtpu_hub", hub.experts_forward)

    cpu = build(args)
    ids = torch.randint(3, args.vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(1))
    n = sum(p.numel() for p in cpu.parameters())
    print(
        f"Qwen3-MoE-shaped model: {n / 1e6:.2f} M params, {args.layers} layers, {args.experts} experts, "
        f"top-{args.top_k}, hidden {args.hidden}; batch {args.batch}, prompt {args.prompt}, {args.new_tokens} "
        f"new tokens; XLA platform {torch.tpu.platform()}, torch threads {torch.get_num_threads()}",
        flush=True,
    )
    results = {}
    set_experts(cpu, "grouped_mm")
    ref = measure("cpu grouped_mm", cpu, ids, args, results)
    if not args.skip_loop:
        set_experts(cpu, "eager")
        measure("cpu expert loop", cpu, ids, args, results, ref)
        set_experts(cpu, "grouped_mm")
    eager_modes = [("loop", "eager"), ("grouped_mm", "grouped_mm"), ("hub kernel", "torchtpu_hub")]
    if args.skip_loop:
        eager_modes = eager_modes[1:]
    tpu, ids_t = _tpu_modes(args, cpu, ids, eager_modes, results, ref)
    _summary(results)
    if args.profile:
        print("\nwhere eager decode time goes (one warm generate, per decoded token):")
        for label, impl in eager_modes:
            set_experts(tpu, impl)
            profile(f"tpu eager {label}", tpu, ids_t, args)
        set_experts(tpu, "torchtpu_hub")
        profile(
            "tpu eager hub kernel (static cache)", tpu, ids_t, args, cache_implementation="static", disable_compile=True
        )


def _tpu_modes(args, cpu, ids, eager_modes, results, ref):
    """Eager (dynamic and static cache) and compiled decode on tpu per experts implementation; returns
    the eager tpu model and its inputs."""
    tpu = copy.deepcopy(cpu).to("tpu")
    ids_t = ids.to("tpu")
    static = dict(cache_implementation="static", disable_compile=True)
    for label, impl in eager_modes:
        set_experts(tpu, impl)
        measure(f"tpu eager {label}", tpu, ids_t, args, results, ref)
    for label, impl in eager_modes[-2:]:
        set_experts(tpu, impl)
        measure(f"tpu eager {label} (static cache)", tpu, ids_t, args, results, ref, **static)
    if not args.skip_compiled:
        for label, impl in eager_modes[-2:]:
            compiled = copy.deepcopy(cpu).to("tpu")
            set_experts(compiled, impl)
            # dynamic=False: prefill and decode are two static graphs (a jax_op's shapes come from
            # jax.eval_shape, which needs concrete sizes)
            compiled.forward = torch.compile(compiled.forward, backend="tpu", fullgraph=True, dynamic=False)
            measure(f"tpu compiled {label} (static cache)", compiled, ids_t, args, results, ref, **static)
    return tpu, ids_t


def _summary(results):
    loop = results.get("tpu eager loop")
    cpu_best = max((v for k, v in results.items() if k.startswith("cpu")), default=None)
    tpu_best = max(((v, k) for k, v in results.items() if k.startswith("tpu")), default=None)
    print()
    if loop:
        for name, v in results.items():
            if name.startswith("tpu"):
                print(f"  {name:<40} {v / loop:6.1f}x the tpu eager expert loop")
    if cpu_best and tpu_best:
        print(f"  best tpu ({tpu_best[1]}) / best cpu: {tpu_best[0] / cpu_best:.2f}x")


if __name__ == "__main__":
    main()
