"""A real model's size on "tpu": load time, warm greedy decode speed and peak host memory of torch CPU,
tpu eager and tpu compiled, in float32 and bfloat16, from a checkpoint on disk.

    python benchmarks/real_scale.py [--layers 28] [--dtypes float32,bfloat16] [--modes cpu,eager,compiled]
                                    [--rounds 3] [--repeats 2] [--prompt 32 --new-tokens 16]

The checkpoint has Qwen3-0.6B's shape (hidden 1024, 28 layers, 16 query / 8 key-value heads of 128,
MLP 3072, vocabulary 151,936, tied embeddings: 596 M parameters) with random weights, written as
safetensors (one checkpoint per dtype, in that dtype, as published checkpoints are) into a temporary
directory: no download. `--layers 2` makes a quick run (the vocabulary stays real-size).

Each configuration (mode x dtype) runs in a child process of its own, so that its peak RSS
(`ru_maxrss`, the whole process: Python, torch, JAX and the model) is its own: the child times
`from_pretrained(path, dtype=..., device_map=...)` (until the weights are on the device:
synchronized; wall and process CPU time), runs one greedy `generate()` to warm up (XLA compiles),
then `--repeats` timed ones (median). The modes:
  cpu       torch CPU eager, a plain `generate()`. The child sets TORCH_DEVICE_BACKEND_AUTOLOAD=0, so
            its memory is torch's alone (torchtpu is installed here and would otherwise load with torch).
  eager     "tpu" eager (the default eager mode), a plain `generate()` (dynamic cache).
  compiled  "tpu", `model.forward = torch.compile(model.forward, backend="tpu")`, static cache.
`--rounds` rounds each run every configuration once, in turn, so machine drift falls on all of them
alike; the figures printed are medians over rounds, and the ratios are medians of each round's
ratios (to torch CPU in the same dtype). Tokens are compared with the CPU's: float32 must agree;
bfloat16 rounds differently from torch CPU's kernels, so there the count of equal tokens is shown.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

QWEN3_0_6B = {
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "pad_token_id": 151643,
}


def write_checkpoint(path, layers, dtype_name):
    """config.json + model.safetensors with random weights (std 0.02, norms near 1) in `dtype_name`."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    dtype = getattr(torch, dtype_name)
    config = Qwen3Config(**{**QWEN3_0_6B, "num_hidden_layers": layers}, dtype=dtype_name)
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in Qwen3ForCausalLM(config).state_dict().items()}
    shapes.pop("lm_head.weight", None)  # tied to the embedding, as the published checkpoint
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            t = 1 + 0.1 * torch.randn(shape, generator=g)
        else:
            t = 0.02 * torch.randn(shape, generator=g)
        tensors[name] = t.to(dtype)
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(path)


def _rss_now_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(args):
    """One configuration: prints one JSON line."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, args.dtype)
    device = "cpu" if args.mode == "cpu" else "tpu"
    start, start_cpu = time.perf_counter(), time.process_time()
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=dtype, device_map=device).eval()
    if device == "tpu":
        torch.tpu.synchronize()
    load_s, load_cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
    rss_after_load = _rss_now_mb()
    peak_after_load = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kw = {}
    if args.mode == "compiled":
        model.forward = torch.compile(model.forward, backend="tpu")
        kw = {"cache_implementation": "static", "disable_compile": True}
    ids = torch.randint(1000, 100000, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)

    def run():
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

    start = time.perf_counter()
    tokens = run()
    first_s = time.perf_counter() - start
    if device == "tpu":
        from torchtpu.eager import fusion

        fusion.wait_for_compiles()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "load_s": load_s,
                "load_cpu_s": load_cpu_s,
                "first_s": first_s,
                "tok_s": args.new_tokens / statistics.median(times),
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "peak_after_load_mb": peak_after_load,
                "rss_after_load_mb": rss_after_load,
                "tokens": tokens[0, args.prompt :].tolist(),
            }
        ),
        flush=True,
    )


def run_child(args, checkpoint, mode, dtype):
    env = dict(os.environ)
    if mode == "cpu":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--checkpoint",
        checkpoint,
        "--mode",
        mode,
        "--dtype",
        dtype,
        "--prompt",
        str(args.prompt),
        "--new-tokens",
        str(args.new_tokens),
        "--repeats",
        str(args.repeats),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    print(f"  {mode} {dtype}: failed (exit {proc.returncode}): {' | '.join(tail)[:400]}", flush=True)
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=QWEN3_0_6B["num_hidden_layers"])
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--modes", default="cpu,eager,compiled")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2, help="timed generate() calls per child (median)")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--dtype", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    dtypes, modes = args.dtypes.split(","), args.modes.split(",")
    with tempfile.TemporaryDirectory(prefix="real_scale_") as tmp:
        checkpoints = {}
        for dtype in dtypes:
            checkpoints[dtype] = os.path.join(tmp, dtype)
            # (in a child: the parent stays small while the children measure their memory)
            write = (
                f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import real_scale; "
                f"real_scale.write_checkpoint({checkpoints[dtype]!r}, {args.layers}, {dtype!r})"
            )
            subprocess.run(
                [sys.executable, "-c", write], check=True, env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
            )
        size = sum(os.path.getsize(os.path.join(checkpoints[d], "model.safetensors")) for d in dtypes[:1])
        print(
            f"Qwen3-0.6B shape, {args.layers} layers, random weights ({size / 2**20:.0f} MiB as {dtypes[0]}); "
            f"{args.new_tokens} new tokens after {args.prompt}; {args.rounds} rounds x {args.repeats} repeats",
            flush=True,
        )
        results = {}  # (mode, dtype) -> list of per-round dicts
        for r in range(args.rounds):
            for dtype in dtypes:
                for mode in modes:
                    res = run_child(args, checkpoints[dtype], mode, dtype)
                    results.setdefault((mode, dtype), []).append(res)
                    if res:
                        print(
                            f"  round {r + 1} {mode:<8} {dtype:<8} load {res['load_s']:6.1f} s "
                            f"({res['load_cpu_s']:.1f} s CPU)  first {res['first_s']:6.1f} s  "
                            f"{res['tok_s']:6.2f} tok/s  peak RSS {res['peak_mb']:6.0f} MB "
                            f"(after load {res['peak_after_load_mb']:.0f})",
                            flush=True,
                        )
    report(results, dtypes, modes)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def report(results, dtypes, modes):
    print(f"\n{'':<18}" + "".join(f"{m:>28}" for m in modes))
    for dtype in dtypes:
        cpu_rounds = results.get(("cpu", dtype), [])
        for key, label, _unit in (
            ("tok_s", "decode tok/s", ""),
            ("load_s", "load s", ""),
            ("load_cpu_s", "load CPU s", ""),
            ("peak_mb", "peak RSS MB", ""),
        ):
            cells = []
            for mode in modes:
                rounds = results.get((mode, dtype), [])
                value = _median([r[key] for r in rounds if r])
                ratios = [r[key] / c[key] for r, c in zip(rounds, cpu_rounds) if r and c and c[key]]
                ratio = f" ({_median(ratios):.2f}x)" if mode != "cpu" and ratios else ""
                cells.append(f"{value:.2f}{ratio}" if key != "peak_mb" else f"{value:.0f}{ratio}")
            print(f"{dtype + ' ' + label:<18}" + "".join(f"{c:>28}" for c in cells))
        reference = next((r["tokens"] for r in cpu_rounds if r), None)
        if reference:
            agree = []
            for mode in modes[1:] if modes[0] == "cpu" else modes:
                got = next((r["tokens"] for r in results.get((mode, dtype), []) if r), None)
                if got is not None:
                    agree.append(f"{mode} {sum(a == b for a, b in zip(got, reference))}/{len(reference)}")
            print(f"{dtype} tokens equal to torch CPU's: " + ", ".join(agree))
    print("(ratios: to torch CPU in the same dtype, median of the rounds' ratios)")


if __name__ == "__main__":
    main()
