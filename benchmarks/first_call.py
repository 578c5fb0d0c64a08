"""First-call latency of the small Llama, with a cold and a warm on-disk compile cache.

    python benchmarks/first_call.py [--runs 2]

compile_llama.py's model (hidden 512, 4 layers, vocab 8000). The script runs itself in fresh
processes that share one new cache directory (TORCHTPU_COMPILE_CACHE_DIR): the first finds it empty
(cold), the next ones find what the first wrote (warm). Each process times, in this order:

  eager forward      the first eager forward, batch 1 x 32 tokens (its ops' executables)
  compiled forward   the first `torch.compile(model, backend="tpu")` call, batch 4 x 128
  compiled decode    a static-cache greedy decode through a compiled `model.forward`: the first
                     prefill (16 tokens), the first decode step, then 14 more steps

and counts, for each phase, the XLA compiles that really ran (`backend_compile_and_load`) and the
executables the on-disk cache served. A warm process should compile nothing the cache could serve:
its remaining first-call time is Dynamo and AOTAutograd's tracing, our lowering to JAX, and reading
the cache, none of which PyTorch or JAX keeps across processes for an out-of-tree backend.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PHASES = [
    "eager forward",
    "compiled forward",
    "compiled prefill",
    "compiled first decode step",
    "compiled 14 more steps",
]


def child():
    import torch
    from jax._src import compiler, monitoring
    from transformers import StaticCache

    import torchtpu  # noqa: F401

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from compile_llama import build

    from torchtpu.compile import backend

    counts = {"compiles": 0, "hits": 0}
    real_compile = compiler.backend_compile_and_load

    names = []

    def counted_compile(*a, **k):
        counts["compiles"] += 1
        names.append(str(a[1].operation.attributes["sym_name"]) if len(a) > 1 else "?")
        return real_compile(*a, **k)

    compiler.backend_compile_and_load = counted_compile

    def on_event(event, **kw):
        if event == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1

    monitoring.register_event_listener(on_event)

    rows = {}

    def phase(name, fn):
        c0, h0, times0 = counts["compiles"], counts["hits"], dict(backend.TIMES)
        t0 = time.perf_counter()
        out = fn()
        torch.tpu.synchronize()
        rows[name] = dict(
            s=time.perf_counter() - t0,
            compiles=counts["compiles"] - c0,
            hits=counts["hits"] - h0,
            **{k: backend.TIMES[k] - times0[k] for k in times0},
        )
        if os.environ.get("FIRST_CALL_SHOW_COMPILES") and rows[name]["compiles"]:
            print(name, [n for n in names[c0:]], file=sys.stderr)
        return out

    model = build("sdpa").to("tpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        phase("eager forward", lambda: model(torch.randint(0, 8000, (1, 32), generator=g).to("tpu")).logits.cpu())
        compiled = torch.compile(model, backend="tpu", dynamic=False)
        phase(
            "compiled forward", lambda: compiled(torch.randint(0, 8000, (4, 128), generator=g).to("tpu")).logits.cpu()
        )

        fwd = torch.compile(model.forward, backend="tpu", fullgraph=True)
        cache = StaticCache(config=model.config, max_cache_len=32)
        state = {"ids": torch.randint(0, 8000, (1, 16), generator=g).to("tpu"), "pos": torch.arange(16, device="tpu")}

        def step():
            logits = fwd(
                input_ids=state["ids"], past_key_values=cache, cache_position=state["pos"], use_cache=True
            ).logits
            state["ids"] = logits[:, -1].argmax(-1, keepdim=True)
            state["pos"] = state["pos"][-1:] + 1
            return int(state["ids"].item())

        phase("compiled prefill", step)
        phase("compiled first decode step", step)
        phase("compiled 14 more steps", lambda: [step() for _ in range(14)])
    print("ROWS " + json.dumps(rows))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2, help="processes: the first cold, the rest warm")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child:
        return child()
    runs = []
    # beside the default cache, so the processes find the C++ libraries already built there
    # (device/native.py keeps them next to the compile cache's directory)
    base = os.environ.get("TORCHTPU_COMPILE_CACHE_DIR")
    root = os.path.dirname(os.path.abspath(base)) if base else os.path.expanduser("~/.cache/torchtpu")
    os.makedirs(root, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="first-call-", dir=root) as cache_dir:
        env = dict(os.environ, TORCHTPU_COMPILE_CACHE="1", TORCHTPU_COMPILE_CACHE_DIR=cache_dir)
        for _r in range(opts.runs):
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child"],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode:
                sys.exit(f"child process failed:\n{out.stderr[-4000:]}")
            line = next(ln for ln in out.stdout.splitlines() if ln.startswith("ROWS "))
            runs.append((time.perf_counter() - t0, json.loads(line[5:])))
    names = ["cold"] + [f"warm {i}" for i in range(1, opts.runs)]
    print(
        "first-call latency, small Llama (hidden 512, 4 layers): seconds (XLA compiles run / "
        "executables served by the on-disk cache)"
    )
    ratio = len(runs) > 1  # the first warm process over the cold one, side by side
    print(f"{'':28s}" + "".join(f"{n:>24s}" for n in names) + ("   warm 1 / cold" if ratio else ""))
    for p in PHASES:
        print(
            f"{p:28s}"
            + "".join(f"{r[p]['s']:9.2f} s ({r[p]['compiles']:3d} / {r[p]['hits']:3d})" for _, r in runs)
            + (f"{runs[1][1][p]['s'] / runs[0][1][p]['s']:17.2f}" if ratio else "")
        )
    compiled = [p for p in PHASES if p.startswith("compiled")]
    for label, key in (("compiled: lowering to JAX", "trace_s"), ("compiled: XLA or its cache", "xla_compile_s")):
        print(f"{label:28s}" + "".join(f"{sum(r[p][key] for p in compiled):9.2f} s{'':13s}" for _, r in runs))
    print(
        f"{'compiled: Dynamo, AOT, rest':28s}"
        + "".join(
            f"{sum(r[p]['s'] - r[p]['trace_s'] - r[p]['xla_compile_s'] for p in compiled):9.2f} s{'':13s}"
            for _, r in runs
        )
    )
    print(
        f"{'whole process':28s}"
        + "".join(f"{t:9.2f} s{'':13s}" for t, _ in runs)
        + (f"{runs[1][0] / runs[0][0]:17.2f}" if ratio else "")
    )


if __name__ == "__main__":
    main()
