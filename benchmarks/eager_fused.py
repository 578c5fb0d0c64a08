"""Eager loops on "tpu" in the "strict" and "fused" eager modes beside torch CPU, in one run.

    python benchmarks/eager_fused.py [--steps 40 --rounds 3]

Two loops from the main job (`python -m torchtpu`): an eager AdamW training step of the 106k-parameter
character Transformer (read back every `--steps` steps, as a loss print would), and its sampling
step (argmax of logits + Gumbel noise, read back at the end). Each round runs every variant once,
interleaved; a warm-up round first compiles (eager executables, and the fused mode's segments, whose
background compiles the script then waits for).
Prints the median ms per step and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import torchtpu
from torchtpu.__main__ import TEXT, TinyLM
from torchtpu.eager import fusion


def setup(device):
    torch.manual_seed(0)
    chars = sorted(set(TEXT))
    model = TinyLM(len(chars), context=32).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return model, opt, len(chars)


def train(model, opt, vocab, batches, device):
    for x, y in batches:
        loss = F.cross_entropy(model(x.to(device)).reshape(-1, vocab), y.to(device).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loss.item()


def sample(model, steps, device):
    window = torch.zeros(1, 32, dtype=torch.long, device=device)
    gen = torch.Generator().manual_seed(0)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(window)[:, -1] / 0.5
            noise = torch.rand(logits.shape, generator=gen).to(device)
            nxt = (logits - torch.log(-torch.log(noise.clamp_min(1e-9)))).argmax(-1, keepdim=True)
            window = torch.cat([window[:, 1:], nxt], dim=1)
            out.append(nxt)
    return torch.cat(out, 1).tolist()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    chars = sorted(set(TEXT))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in TEXT])
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(args.steps):
        ix = torch.randint(0, len(data) - 33, (16,), generator=g)
        batches.append((torch.stack([data[i : i + 32] for i in ix]), torch.stack([data[i + 1 : i + 33] for i in ix])))

    variants = {"torch CPU": ("cpu", "strict"), "tpu strict": ("tpu", "strict"), "tpu fused": ("tpu", "fused")}
    state = {name: setup(device) for name, (device, _) in variants.items()}
    times = {name: {"train": [], "sample": []} for name in variants}
    losses = {}
    for round_ in range(args.rounds + 1):
        for name, (device, mode) in variants.items():
            model, opt, vocab = state[name]
            with torchtpu.eager_mode(mode):
                model.train()
                t = time.perf_counter()
                losses[name] = train(model, opt, vocab, batches, device)
                dt_train = time.perf_counter() - t
                model.eval()
                t = time.perf_counter()
                sample(model, args.steps, device)
                dt_sample = time.perf_counter() - t
            if round_:  # round 0 warms up
                times[name]["train"].append(dt_train / args.steps * 1e3)
                times[name]["sample"].append(dt_sample / args.steps * 1e3)
            else:
                print(
                    f"warm-up round, {name}: train {dt_train / args.steps * 1e3:.2f} ms/step, "
                    f"sample {dt_sample / args.steps * 1e3:.2f} ms/step",
                    flush=True,
                )
        if not round_:
            # the fused mode compiles its segments on a background thread: time the steady state
            t = time.perf_counter()
            fusion.wait_for_compiles()
            print(f"fused segments still compiling after the warm-up round: waited {time.perf_counter() - t:.1f} s")
    print(f"{'variant':<12}{'train ms/step':>15}{'sample ms/step':>16}{'last loss':>11}")
    for name in variants:
        tr, sa = statistics.median(times[name]["train"]), statistics.median(times[name]["sample"])
        print(f"{name:<12}{tr:>15.2f}{sa:>16.2f}{losses[name]:>11.4f}")
    s, f, c = (statistics.median(times[n]["train"]) for n in ("tpu strict", "tpu fused", "torch CPU"))
    ss, fs, cs = (statistics.median(times[n]["sample"]) for n in ("tpu strict", "tpu fused", "torch CPU"))
    print(f"\nfused vs strict: train {s / f:.2f}x faster, sample {ss / fs:.2f}x faster")
    print(f"fused vs torch CPU: train {c / f:.2f}x, sample {cs / fs:.2f}x (above 1: faster than CPU)")
    print(f"metrics: { ({k: v for k, v in torchtpu.metrics().items() if k.startswith('fused')}) }")


if __name__ == "__main__":
    main()
