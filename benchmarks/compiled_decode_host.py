"""Host work of a compiled decode step: `CompiledGraph.__call__` minus the XLA executable call, and
what surrounds it in the step.

    python benchmarks/compiled_decode_host.py [--rounds 6] [--steps 20] [--guards] [--profile | profile]

compile_llama.py's model (hidden 512, 4 layers), a static cache, batch 1, greedy decoding (each
step's token ids are the previous step's argmax, a new tensor, as in `generate`). After warm-up,
rounds of `--steps` decode steps alternate between the graph's fast key off (every call keyed
input by input, as before the fast key) and on (`CompiledGraph.fast_key`), so both run
under the same machine load; the cache is reset between rounds (outside the timings). Per step:
the median over rounds of wall time (perf_counter) and of main-thread CPU time (thread_time: what
the Python host work costs the calling thread, far less noisy than wall time on a loaded machine,
where the executable's compute threads preempt the host thread), and the CPU time of the best
round (each row's minimum over rounds):

  step          the whole decode step: cache position tensor, compiled forward, argmax
  forward       the torch.compile'd `model.forward` call
   pre          forward entry to CompiledGraph.__call__ entry: Dynamo's guards, AOTAutograd's wrappers
   __call__     CompiledGraph.__call__
    executable  the XLA executable call inside it (jax's Compiled.__call__)
    host work   __call__ minus the executable: keying, input buffers, donation check, outputs
   post         __call__ exit to forward return: AOTAutograd's wrappers, the output object
  outside       the step outside the forward (eager ops: position tensor, argmax)

With --guards, a third mode skips Dynamo's guards (unsafe in general; here the same tensors and
the same cache entry every step), so `pre` less theirs is the cost of the guards, and what `pre` keeps
is AOTAutograd's runtime wrappers and Dynamo's frame handling.
With --profile, a cProfile of 40 more steps (fast key on) in main-thread CPU time, by internal time.
Run with PYTHONPATH pointing at an older checkout's src to compare against it (`fast_key` is then
an attribute nothing reads: both columns are the old code).
"""

import argparse
import cProfile
import gc
import pstats
import statistics
import time

import torch
from jax._src import stages
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

import torchtpu  # noqa: F401
from torchtpu.compile import backend as B

ap = argparse.ArgumentParser()
ap.add_argument("--rounds", type=int, default=6, help="rounds per mode (fast key off / on), alternating")
ap.add_argument("--steps", type=int, default=20, help="decode steps per round (the cache holds 128)")
ap.add_argument("--profile", action="store_true")
ap.add_argument(
    "--guards",
    action="store_true",
    help="a third mode: fast key on with Dynamo's guard evaluation skipped (torch.compiler."
    "set_stance(skip_guard_eval_unsafe=True)); its `pre` less the second's is what the guards cost",
)
ap.add_argument("profile_word", nargs="?", help="`profile`: as --profile (the old spelling)")
opts = ap.parse_args()
opts.profile = opts.profile or opts.profile_word == "profile"

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
m = LlamaForCausalLM(cfg).eval().to("tpu")
cache = StaticCache(config=cfg, max_batch_size=1, max_cache_len=128, device="tpu", dtype=torch.float32)
fwd = torch.compile(m.forward, backend="tpu", fullgraph=True)
ids0 = torch.randint(0, 8000, (1, 1), device="tpu")

pc, tt = time.perf_counter, time.thread_time
acc = {}  # name -> [wall, cpu] summed over the round's steps
mark = {"cw": 0.0, "cc": 0.0, "fw": 0.0, "fc": 0.0}
calls = [0]


def add(name, w, c):
    a = acc.setdefault(name, [0.0, 0.0])
    a[0] += w
    a[1] += c


orig_exec = stages.Compiled.__call__


def timed_exec(*a, **k):
    w, c = pc(), tt()
    try:
        return orig_exec(*a, **k)
    finally:
        add("executable", pc() - w, tt() - c)


orig_call = B.CompiledGraph.__call__


def timed_call(self, *a):
    w, c = pc(), tt()
    calls[0] += 1
    add("pre", w - mark["fw"], c - mark["fc"])
    try:
        return orig_call(self, *a)
    finally:
        mark["cw"], mark["cc"] = pc(), tt()
        add("__call__", mark["cw"] - w, mark["cc"] - c)


def step(i, ids):
    w0, c0 = pc(), tt()
    pos = torch.tensor([i], device="tpu")
    mark["fw"], mark["fc"] = pc(), tt()
    with torch.no_grad():
        out = fwd(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True)
    w1, c1 = pc(), tt()
    add("forward", w1 - mark["fw"], c1 - mark["fc"])
    add("post", w1 - mark["cw"], c1 - mark["cc"])
    nxt = out.logits[:, -1:].argmax(-1)
    add("step", pc() - w0, tt() - c0)
    return nxt


def run_round(steps):
    cache.reset()
    torch.tpu.synchronize()
    gc.collect()
    ids = ids0
    for i in range(steps):
        ids = step(i, ids)
    torch.tpu.synchronize()


for _ in range(2):  # warm-up: compile, then the fast key's first calls
    run_round(6)
stages.Compiled.__call__ = timed_exec
B.CompiledGraph.__call__ = timed_call
MODES = [("fast key off", False, False), ("fast key on", True, False)]
if opts.guards:
    MODES.append(("on, no guards", True, True))
results = {name: [] for name, _, _ in MODES}
for _r in range(opts.rounds):
    for name, fast, skip in MODES:
        B.CompiledGraph.fast_key = fast
        acc.clear()
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=skip):
            run_round(opts.steps)
        row = {k: (v[0] / opts.steps, v[1] / opts.steps) for k, v in acc.items()}
        row["host work"] = (row["__call__"][0] - row["executable"][0], row["__call__"][1] - row["executable"][1])
        row["outside"] = (row["step"][0] - row["forward"][0], row["step"][1] - row["forward"][1])
        results[name].append(row)
B.CompiledGraph.fast_key = True

names = ["step", "forward", " pre", " __call__", "  executable", "  host work", " post", "outside"]
print(
    f"per decode step, ms, over {opts.rounds} rounds x {opts.steps} steps: wall median | main-thread CPU "
    f"median | CPU of the best round (the least disturbed: on a loaded machine the steadiest figure)"
)
print(f"{'':14s}" + "".join(f" {name:>25s}  " for name, _, _ in MODES))
for n in names:
    k = n.strip()
    cells = []
    for name, _, _ in MODES:
        w, c = (statistics.median(r[k][j] for r in results[name]) * 1e3 for j in (0, 1))
        best = min(r[k][1] for r in results[name]) * 1e3
        cells.append(f" {w:7.3f} | {c:6.3f} | {best:6.3f}  ")
    print(f"{n:14s}" + "".join(cells))
print(f"CompiledGraph calls per step: {calls[0] / (len(MODES) * opts.rounds * opts.steps):.2f}")

# the modes decode the same tokens
tokens = {}
for fast in (False, True):
    B.CompiledGraph.fast_key = fast
    cache.reset()
    ids, seq = ids0, []
    for i in range(opts.steps):
        ids = step(i, ids)
        seq.append(ids)
    tokens[fast] = torch.cat(seq).flatten().tolist()
assert tokens[False] == tokens[True], tokens
print(f"same {opts.steps} tokens with the fast key off and on")
if opts.profile:
    # main-thread CPU time per function (the C guard evaluation of Dynamo shows in compile_wrapper's
    # own time; AOTAutograd's wrappers as _runtime_wrapper and eval_frame's _fn around our __call__)
    stages.Compiled.__call__ = orig_exec
    B.CompiledGraph.__call__ = orig_call
    cache.reset()
    prof = cProfile.Profile(tt)
    ids = ids0
    prof.enable()
    for i in range(40):
        ids = step(i, ids)
    prof.disable()
    print("\ncProfile of 40 decode steps (fast key on), main-thread CPU seconds:")
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
