"""Training step of a small Llama: torch CPU vs tpu eager (fused, strict) vs torch.compile, side by side.

    python benchmarks/train_step.py [--steps 3] [--rounds 5] [--variants cpu,fused,strict,compiled,compiled+opt]
                                    [--matmul-precision highest|high|medium]

LlamaForCausalLM from a config (hidden 512, 4 layers, 8 heads, 4 KV heads, vocab 8000, MLP 1408), batch
4 x 128 tokens, labels = input ids (`out.loss`), `torch.optim.AdamW(lr=1e-3)` with its defaults. A step is
`zero_grad(set_to_none=True)`, forward, `loss.backward()`, `opt.step()`. Variants:

- cpu: the model on the CPU (torch's default intra-op threads);
- fused / strict: the model on "tpu" in that eager mode;
- compiled: `torch.compile(model, backend="tpu")`, the optimizer's `step()` eager (the default fused mode);
- compiled+opt: the same, plus the user's `torch.compile(opt.step, backend="tpu")`-style wrapper;
- compiled+fusedadamw: compiled model, `torch.optim.AdamW(..., fused=True)` (one `_fused_adamw_` op).

`--matmul-precision` is `torch.set_float32_matmul_precision` for every variant, torch CPU's included ("medium":
float32 products with bfloat16 operands where a fast kernel has them, on "tpu"'s host platform XLA:CPU's
YNNPACK bf16 dot; losses then differ from the CPU's by more than float32 rounding).

Every variant is warmed up (compiles; the fused mode's background compiles waited for), then the variants
take turns for --rounds rounds of --steps steps each; a round ends with a sync (the loss read to the host),
so the device's work is timed. Prints each variant's median ms per step over the rounds (wall, and the process's
CPU time: under load torch CPU's OpenMP threads spin), the ratios, the
steady-state compile counters, and each variant's losses against the CPU's (same data every step).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import torchtpu
from torchtpu.eager import fusion


def build():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=8000,
        intermediate_size=1408,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def make(kind, base, batches):
    """A `step(i) -> loss` for the variant, and the eager mode it runs in."""
    device = "cpu" if kind == "cpu" else "tpu"
    model = copy.deepcopy(base).to(device)
    model.train()
    fused = kind == "compiled+fusedadamw"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True if fused else None)
    forward = torch.compile(model, backend="tpu", dynamic=False) if kind.startswith("compiled") else model
    opt_step = opt.step
    if kind == "compiled+opt":
        opt_step = torch.compile(opt.step, backend="tpu", dynamic=False)
    inputs = [b.to(device) for b in batches]

    def step(i):
        ids = inputs[i % len(inputs)]
        opt.zero_grad(set_to_none=True)
        loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        opt_step()
        return loss

    mode = "strict" if kind in ("strict", "cpu") else "fused"
    return step, mode, model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="cpu,fused,strict,compiled,compiled+opt")
    ap.add_argument("--matmul-precision", default="highest", choices=("highest", "high", "medium"))
    args = ap.parse_args()
    torch.set_float32_matmul_precision(args.matmul_precision)
    kinds = args.variants.split(",")
    base = build()
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 8000, (4, 128), generator=g) for _ in range(4)]

    steps, losses, times, cpu_times, models = {}, {}, {}, {}, {}
    for kind in kinds:
        t0 = time.perf_counter()
        step, mode, model = make(kind, base, batches)
        with torchtpu.eager_mode(mode):
            losses[kind] = [step(i).item() for i in range(2)]
        steps[kind], models[kind] = (step, mode), model
        print(f"{kind:22s} warm-up (compile + 2 steps): {time.perf_counter() - t0:6.1f} s", flush=True)
    fusion.wait_for_compiles()
    m0 = torchtpu.metrics()
    done = 2
    for _ in range(args.rounds):
        for kind in kinds:
            step, mode = steps[kind]
            with torchtpu.eager_mode(mode):
                t0, c0 = time.perf_counter(), time.process_time()
                for i in range(done, done + args.steps):
                    loss = step(i)
                    losses[kind].append(loss.detach())
                torch.tpu.synchronize()
                losses[kind][-1] = losses[kind][-1].item()  # the round's sync point: the device's work is timed
                times.setdefault(kind, []).append((time.perf_counter() - t0) / args.steps)
                cpu_times.setdefault(kind, []).append((time.process_time() - c0) / args.steps)
        done += args.steps
    m1 = torchtpu.metrics()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    cpu_med = {k: statistics.median(v) * 1e3 for k, v in cpu_times.items()}

    print(
        f"\nsmall Llama training step (hidden 512, 4 layers, batch 4x128, AdamW), median of {args.rounds} "
        f"interleaved rounds of {args.steps} steps; torch threads {torch.get_num_threads()}; float32 matmul "
        f"precision {args.matmul_precision!r}"
    )
    print(f"{'variant':22s} {'ms/step':>9s} {'CPU ms/step':>12s} {'rounds (ms)':>40s}")
    for kind in kinds:
        rounds = " ".join(f"{t * 1e3:.0f}" for t in times[kind])
        print(f"{kind:22s} {med[kind]:9.1f} {cpu_med[kind]:12.1f}   {rounds:>37s}")
    ratios = []
    for kind in kinds:
        if kind.startswith("compiled"):
            for ref in ("fused", "strict", "cpu"):
                if ref in med:
                    ratios.append(f"{kind}/{ref} {med[kind] / med[ref]:.2f}")
    if "fused" in med and "cpu" in med:
        ratios.append(f"fused/cpu {med['fused'] / med['cpu']:.2f}")
    print("ratios: " + ", ".join(ratios))
    cpu_ratios = [
        f"{kind}/{ref} {cpu_med[kind] / cpu_med[ref]:.2f}"
        for kind in kinds
        if kind.startswith("compiled")
        for ref in ("fused", "cpu")
        if ref in cpu_med
    ]
    print("process CPU time ratios: " + ", ".join(cpu_ratios))
    print(
        "steady state: "
        + ", ".join(
            f"{k} {m1[k] - m0[k]}"
            for k in ("compiled_xla_compiles", "compiled_cache_hits", "fused_compiles", "eager_compiles")
            if k in m1
        )
    )
    if "cpu" in losses:
        ref = [float(x) for x in losses["cpu"]]
        for kind in kinds:
            got = [float(x) for x in losses[kind]]
            print(
                f"losses {kind:22s} max |loss - cpu| {max(abs(a - b) for a, b in zip(got, ref)):.2e} "
                f"(first {got[0]:.4f}, last {got[-1]:.4f})"
            )
        cpu_params = dict(models["cpu"].named_parameters())
        for kind in kinds:
            worst = max(
                (p.detach().cpu() - cpu_params[n].detach()).abs().max().item()
                for n, p in models[kind].named_parameters()
            )
            print(f"params {kind:22s} max |param - cpu| after {done} steps {worst:.2e}")


if __name__ == "__main__":
    main()
