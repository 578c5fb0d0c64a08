"""Training steps/s on a tiny Llama: SingleTraceTrainer vs an eager loop vs torch.compile(model), all
three with the fused `torch.tpu.optimizers.AdamW`, and torch CPU eager with torch.optim.AdamW.

    python benchmarks/single_trace_trainer.py [--steps 20] [--rounds 3] [--hidden 64] [--layers 2]

LlamaForCausalLM from a config (vocab 256, hidden --hidden, --layers layers, 4 heads, 2 KV heads),
batch 4 x 32 tokens, labels = input ids (out.loss). Each variant is warmed up (its compiles are
timed and printed), then the variants take turns for --rounds rounds of --steps steps each, ending
each round with a sync (loss.item()); the figure is the best round's steps/s. Ratios are against
the eager loop. The CPU variant runs with one intra-op thread (see `make`).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import torchtpu  # noqa: F401
from torchtpu.optim import AdamW, SingleTraceTrainer


def _step_function(kind, base, ids_cpu, ids):
    """One training step of `kind` on a fresh copy of `base`, as a function returning the loss."""
    if kind == "cpu eager + torch.optim.AdamW":
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            # one intra-op thread: on a shared 2-core VM torch's spinning OpenMP threads made this
            # variant 10x slower (1-3 steps/s) than with one
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                opt.zero_grad()
                loss = model(input_ids=ids_cpu, labels=ids_cpu).loss
                loss.backward()
                opt.step()
            finally:
                torch.set_num_threads(threads)
            return loss

        return step
    model = copy.deepcopy(base).to("tpu")
    opt = AdamW(model.parameters(), lr=1e-3)
    if kind == "SingleTraceTrainer":
        train_step = SingleTraceTrainer(model, opt).make_compiled_train_step({"input_ids": ids, "labels": ids})
        return lambda: train_step({"input_ids": ids, "labels": ids})
    forward = torch.compile(model, backend="tpu") if kind.startswith("torch.compile") else model

    def step():
        opt.zero_grad()
        loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=a.hidden,
        intermediate_size=2 * a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg)
    ids_cpu = torch.randint(0, 256, (4, 32))
    ids = ids_cpu.to("tpu")
    kinds = [
        "eager + fused AdamW",
        "torch.compile(model) + fused AdamW",
        "SingleTraceTrainer",
        "cpu eager + torch.optim.AdamW",
    ]
    steps = {}
    for kind in kinds:
        t0 = time.perf_counter()
        steps[kind] = _step_function(kind, base, ids_cpu, ids)
        for _ in range(3):
            loss = steps[kind]()
        loss.item()
        print(
            f"{kind:40s} warm-up (trace + compile + 3 steps): {time.perf_counter() - t0:6.1f} s, "
            f"loss {loss.item():.4f}",
            flush=True,
        )
    best = {k: 0.0 for k in kinds}
    for _ in range(a.rounds):
        for kind in kinds:
            t0 = time.perf_counter()
            for _ in range(a.steps):
                loss = steps[kind]()
            loss.item()
            best[kind] = max(best[kind], a.steps / (time.perf_counter() - t0))
    ref = best["eager + fused AdamW"]
    print(
        f"\ntiny Llama (hidden {a.hidden}, {a.layers} layers, batch 4x32), best of {a.rounds} rounds of {a.steps} steps"
    )
    for kind in kinds:
        print(f"{kind:40s} {best[kind]:8.1f} steps/s   {best[kind] / ref:5.2f}x eager")


if __name__ == "__main__":
    main()
