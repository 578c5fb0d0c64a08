"""Greedy decoding tokens/s of a small Llama-shaped model: "tpu" eager, "tpu" compiled with a static
cache, and torch CPU eager, measured side by side in one run.

    python benchmarks/generate.py [--preset smollm-135m|tiny] [--hidden ... --layers ... --vocab ...]
                                  [--prompt 32 --new-tokens 32 --batch 1 --rounds 8]

The model is built from a config (random weights, no download). The default preset has the shape of
SmolLM-135M (hidden 576, 30 layers, 9 heads / 3 key-value heads, MLP 1536, vocabulary 49,152, tied
embeddings: 134.5 M parameters), the smallest Llama-architecture model in common use; about 8
minutes on 2 cores, most of it the first runs' compiles. `--preset tiny` (hidden 256, 4 layers,
vocabulary 1,024: 2.9 M parameters) measures per-token framework overhead: there the forward is a
fraction of a millisecond of arithmetic and `generate()`'s own ~30 small per-token ops set the
pace. Flags given explicitly override the preset's values.

The rows name the eager mode they run in: "strict" or "fused" (the default; for a compiled forward,
the mode of generate()'s own per-token ops). Each "tpu" mode runs once to warm up (XLA compiles per shape; with the
dynamic cache every decode
step is a new shape), then `--repeats` timed runs; the median is printed. Generation ends in a host
copy of the tokens, so each timed run includes all device work. All modes must produce the CPU's
tokens. The last line alternates torch CPU, the compiled forward, the compiled forward with
generate()'s own per-token ops in the "fused" eager mode, the eager model (static cache) in the
"strict" mode and in the default "fused" mode, and the eager model as a user's plain `generate()`
runs it (default "fused" mode, generate()'s default dynamic cache), `--rounds` times in the same
process: the ratios to trust on a shared machine whose speed drifts between the sequential rows.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch

from torchtpu.eager import fusion

# Model shapes; the flags of the same names override them.
PRESETS = {
    "smollm-135m": dict(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152, tied=True),
    "tiny": dict(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=512, vocab=1024, tied=False),
}


def build(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        tie_word_embeddings=args.tied,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def run(model, ids, args, **kw):
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,
            do_sample=False,
            **kw,
        )
    return out.cpu()


def measure(name, model, ids, args, results, reference=None, **kw):
    start = time.perf_counter()
    try:
        run(model, ids, args, **kw)
    except Exception as e:  # noqa: BLE001 -- report and go on: one mode failing should not hide the others
        print(f"{name:<34} failed: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
        return None
    cold = time.perf_counter() - start
    fusion.wait_for_compiles()  # the fused mode compiles its segments on a background thread
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = run(model, ids, args, **kw)
        times.append(time.perf_counter() - start)
    t = statistics.median(times)
    tokens = args.new_tokens * args.batch
    same = "" if reference is None else ("  tokens == cpu" if torch.equal(out, reference) else "  TOKENS DIFFER")
    print(f"{name:<34} {tokens / t:9.1f} tok/s   (first run {cold:6.1f} s){same}", flush=True)
    results[name] = tokens / t
    return out


def _arguments():
    p = argparse.ArgumentParser()
    p.add_argument("--preset", choices=sorted(PRESETS), default="smollm-135m")
    p.add_argument("--hidden", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int, help="key/value heads")
    p.add_argument("--intermediate", type=int, help="MLP width")
    p.add_argument("--vocab", type=int)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-compiled", action="store_true")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--rounds",
        type=int,
        default=8,
        help="interleaved rounds of cpu eager vs tpu compiled forward at the end (0: none)",
    )
    args = p.parse_args()
    for name, value in PRESETS[args.preset].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    return args


def main():
    args = _arguments()
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = build(args)
    ids = torch.randint(3, args.vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(1))
    n_params = sum(p.numel() for p in cpu.parameters())
    print(
        f"Llama-shaped model ({args.preset}): {n_params / 1e6:.2f} M params, hidden {args.hidden}, "
        f"{args.layers} layers; batch {args.batch}, prompt {args.prompt}, {args.new_tokens} new tokens; "
        f"XLA platform {torch.tpu.platform()}, torch threads {torch.get_num_threads()}"
    )
    results = {}
    ref = measure("cpu eager (dynamic cache)", cpu, ids, args, results)
    tpu = copy.deepcopy(cpu).to("tpu")
    ids_t = ids.to("tpu")
    static = dict(cache_implementation="static", disable_compile=True)
    with torch.tpu.eager_mode("strict"):  # (the default eager mode, fused, is measured below)
        measure("tpu strict eager (dynamic cache)", tpu, ids_t, args, results, ref)
        # transformers auto-compiles the decode step of a static cache on "tpu" (backend "tpu"):
        # disable_compile=True keeps this mode eager
        measure("tpu strict eager (static cache)", tpu, ids_t, args, results, ref, **static)
    compiled = _compiled_modes(args, cpu, ids_t, results, ref, static)
    with torch.tpu.eager_mode("fused"):  # the default eager mode
        measure("tpu fused eager (dynamic cache)", tpu, ids_t, args, results, ref)
        measure("tpu fused eager (static cache)", tpu, ids_t, args, results, ref, **static)

    base = results.get("cpu eager (dynamic cache)")
    if base:
        print("\nratios to cpu eager:")
        for name, v in results.items():
            print(f"  {name:<32} {v / base:6.2f}x")
    if args.rounds and compiled is not None:
        _interleaved(args, (cpu, ids), (tpu, compiled, ids_t), static)


def _compiled_modes(args, cpu, ids_t, results, ref, static):
    """The compiled forward (strict and fused eager around it) and generate()'s own auto-compile; returns
    the compiled model, or None when skipped."""
    if args.skip_compiled:
        return None
    if "tpu" not in torch._dynamo.list_backends():
        print(f"{'tpu compiled (static cache)':<34} skipped: torch.compile backend 'tpu' is not registered")
        return None
    compiled = copy.deepcopy(cpu).to("tpu")
    compiled.forward = torch.compile(compiled.forward, backend="tpu", fullgraph=True)
    with torch.tpu.eager_mode("strict"):  # (generate()'s own per-token ops)
        measure("tpu compiled fwd (static cache)", compiled, ids_t, args, results, ref, **static)
        auto = copy.deepcopy(cpu).to("tpu")
        measure("tpu generate auto-compile (static)", auto, ids_t, args, results, ref, cache_implementation="static")
    # the same compiled forward, with generate()'s own per-token ops in the "fused" eager mode
    with torch.tpu.eager_mode("fused"):
        measure("tpu compiled fwd + fused eager", compiled, ids_t, args, results, ref, **static)
    return compiled


def _interleaved(args, on_cpu, on_tpu, static):
    """Shared machines drift between the sequential measurements: alternate the modes, medians."""
    (cpu, ids), (tpu, compiled, ids_t) = on_cpu, on_tpu
    modes = (
        ("cpu", cpu, ids, {}, "strict"),
        ("tpu", compiled, ids_t, static, "strict"),
        ("tpu fused", compiled, ids_t, static, "fused"),
        ("tpu eager", tpu, ids_t, static, "strict"),
        ("tpu stop every token", compiled, ids_t, static, "every token"),
        ("tpu fused eager", tpu, ids_t, static, "fused"),
        ("tpu fused eager dynamic", tpu, ids_t, {}, "fused"),
    )
    tps = {name: [] for name, *_ in modes}
    for _ in range(args.rounds):
        for name, model, inputs, kw, mode in modes:
            with (
                stop_flag_read_every_token(mode == "every token"),
                torch.tpu.eager_mode("strict" if mode == "every token" else mode),
            ):
                start = time.perf_counter()
                run(model, inputs, args, **kw)
                tps[name].append(args.new_tokens * args.batch / (time.perf_counter() - start))
            if mode == "fused":  # (its background compiles must not run into the next mode's time)
                fusion.wait_for_compiles()
    c, t, f, e, w, fe, fd = (statistics.median(tps[name]) for name, *_ in modes)
    print(
        f"\ninterleaved, {args.rounds} rounds: cpu eager {c:.1f} tok/s, tpu compiled fwd {t:.1f} tok/s, "
        f"ratio {t / c:.2f}x; with generate()'s own ops fused {f:.1f} tok/s, ratio {f / c:.2f}x; "
        f"tpu strict eager (static cache) {e:.1f} tok/s, {e / t:.2f} of compiled; fused eager (the "
        f"default) {fe:.1f} tok/s, {fe / t:.2f} of compiled, with generate()'s default dynamic cache {fd:.1f} "
        f"tok/s, {fd / t:.2f} of compiled; compiled fwd with the stop flag read at every token "
        f"{w:.1f} tok/s, ratio {w / c:.2f}x"
    )


@contextlib.contextmanager
def stop_flag_read_every_token(on):
    """generate() as before torchtpu enabled transformers' DeferredStopCheck for tpu
    (integrations/patches.py): the host waits for each token's stop flag."""
    from transformers.generation import utils

    cls = getattr(utils, "DeferredStopCheck", None)
    if not on or cls is None:
        yield
        return
    supported = cls.__dict__["is_supported"]
    cls.is_supported = staticmethod(lambda *args, **kwargs: False)
    try:
        yield
    finally:
        cls.is_supported = supported


if __name__ == "__main__":
    main()
