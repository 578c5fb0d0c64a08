"""torch.compile(backend="tpu") on a small Llama: compiled vs eager on the device vs CPU vs raw JAX.

    python benchmarks/compile_llama.py [--iters 5] [--decode-tokens 16] [--no-decode]

Builds LlamaForCausalLM from a config (hidden 512, 4 layers, 8 heads, 4 KV heads, vocab 8000,
intermediate 1408), runs a forward on a batch of 4 x 128 tokens and prints, side by side in one run:
the first compiled call (Dynamo + AOTAutograd + XLA compile), steady-state time of the compiled
forward, of the same XLA executable called directly from JAX on the raw buffers (the floor: what
the backend's Python wrapping costs is the difference), of eager mode on the device and of PyTorch
CPU eager. Then greedy decoding with a static KV cache: compiled forward vs eager on the device.
Needs `pip install "transformers>=5"`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import torch

import torchtpu
import torchtpu.compile
from torchtpu.compile import backend as tpu_backend


def sync():
    torch.tpu.synchronize() if hasattr(torch, "tpu") and hasattr(torch.tpu, "synchronize") else None


def build(attn):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=8000,
        intermediate_size=1408,
        max_position_embeddings=512,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--no-decode", action="store_true")
    args = ap.parse_args()

    cpu_model = build(args.attn)
    dev_model = build(args.attn).to("tpu")
    dev_model.load_state_dict(cpu_model.state_dict())
    ids = torch.randint(0, 8000, (args.batch, args.seq))
    ids_t = ids.to("tpu")

    def dev_sync(out=None):
        if out is not None:
            leaf = out.logits if hasattr(out, "logits") else out
            jax.block_until_ready(torchtpu.storage.records.record_of(leaf).buffer)
        sync()

    res = {}
    with torch.no_grad():
        ref = cpu_model(ids).logits
        eager_logits = dev_model(ids_t).logits  # warms the eager executables

        compiled = torch.compile(dev_model, backend="tpu", dynamic=False)
        tpu_backend.CompiledGraph.capture = True
        t0 = time.perf_counter()
        out = compiled(ids_t)
        dev_sync(out)
        res["compiled first call"] = [time.perf_counter() - t0]
        first_call_parts = dict(tpu_backend.TIMES)
        comp_logits = out.logits
        graph = tpu_backend.last_captured()
        fn, dyn = graph.captured
        tpu_backend.CompiledGraph.capture = False
        m0 = torchtpu.metrics()

        variants = {
            "cpu eager": (lambda: cpu_model(ids), lambda out: None),
            "tpu eager": (lambda: dev_model(ids_t), dev_sync),
            "tpu compiled": (lambda: compiled(ids_t), dev_sync),
            "raw JAX (same executable)": (lambda: fn(*dyn), jax.block_until_ready),
        }
        # interleaved rounds, median per variant: the machine's load hits every variant alike
        for f, s in variants.values():
            s(f())
        for _ in range(args.iters):
            for name, (f, s) in variants.items():
                t0 = time.perf_counter()
                s(f())
                res.setdefault(name, []).append(time.perf_counter() - t0)
        m1 = torchtpu.metrics()
    res = {k: statistics.median(v) for k, v in res.items()}

    err_c = (comp_logits.cpu() - ref).abs().max().item()
    err_e = (eager_logits.cpu() - ref).abs().max().item()
    print(
        f"\nLlama forward, batch {args.batch} x {args.seq} tokens, attn={args.attn}, "
        f"{jax.devices()[0].platform} backend, {args.iters} iters"
    )
    print(f"max |logits - cpu|: compiled {err_c:.2e}, eager {err_e:.2e}")
    print(
        f"recompiles during steady state: {m1['compiled_xla_compiles'] - m0['compiled_xla_compiles']}, "
        f"cache hits: {m1['compiled_cache_hits'] - m0['compiled_cache_hits']}"
    )
    print(
        f"first compiled call {res['compiled first call']:.2f} s, of which JAX tracing "
        f"{first_call_parts['trace_s']:.2f} s and XLA compile {first_call_parts['xla_compile_s']:.2f} s "
        f"(the rest: Dynamo + AOTAutograd); on-disk cache: {torchtpu.compile.options.cache_dir()}"
    )
    base = res["tpu compiled"]
    print(f"{'(median of interleaved runs)':28s} {'ms':>10s} {'x compiled':>11s}")
    for k, v in res.items():
        print(f"{k:28s} {v * 1e3:10.1f} {v / base:11.2f}")

    if not args.no_decode:
        decode(cpu_model, dev_model, args)


def decode(cpu_model, dev_model, args):
    """Greedy decoding with a static KV cache: compiled forward vs eager on the device."""
    from transformers import StaticCache

    n_new = args.decode_tokens
    prompt = torch.randint(0, 8000, (1, 16))
    max_len = prompt.shape[1] + n_new

    def greedy(model, fwd, device):
        cache = StaticCache(config=model.config, max_cache_len=max_len)
        ids = prompt.to(device)
        pos = torch.arange(ids.shape[1], device=device)
        out_tokens = []
        times = []
        for _step in range(n_new):
            t0 = time.perf_counter()
            logits = fwd(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True).logits
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out_tokens.append(int(nxt.item()))  # sync point, as a real decoding loop has
            times.append(time.perf_counter() - t0)
            ids = nxt
            pos = pos[-1:] + 1
        return out_tokens, times

    with torch.no_grad():
        ref_tokens, _ = greedy(cpu_model, cpu_model, "cpu")
        greedy(dev_model, dev_model, "tpu")  # warm the eager executables too
        eager_tokens, eager_times = greedy(dev_model, dev_model, "tpu")
        compiled = torch.compile(dev_model, backend="tpu", dynamic=False)
        comp_tokens, comp_times = greedy(dev_model, compiled, "tpu")
        comp_tokens2, comp_times2 = greedy(dev_model, compiled, "tpu")  # warm: no compiles
    steady = lambda ts: sum(ts[1:]) / max(len(ts) - 1, 1)
    print(f"\ngreedy decoding, static cache, {n_new} tokens after a 16-token prompt")
    print(f"tokens match cpu: eager {eager_tokens == ref_tokens}, compiled {comp_tokens2 == ref_tokens}")
    print(f"{'':28s} {'ms/token':>10s}")
    print(f"{'tpu eager (warm)':28s} {steady(eager_times) * 1e3:10.1f}")
    print(f"{'tpu compiled (warm)':28s} {steady(comp_times2) * 1e3:10.1f}")
    print(f"{'compiled first pass total':28s} {sum(comp_times) * 1e3:10.1f}")
    print(f"eager / compiled per token: {steady(eager_times) / steady(comp_times2):.2f}x")


if __name__ == "__main__":
    main()
