"""torch.distributed on "tpu" (backend tpu_dist, XLA collectives) beside gloo on CPU tensors, in one run.

    python benchmarks/distributed.py [--nprocs 2] [--max-mb 64] [--ddp-steps 20]

Starts `nprocs` ranks on 127.0.0.1 (as torchrun would) and measures, side by side:
1. all_reduce (SUM, float32) bus bandwidth, 4 KB to `--max-mb` MB: tpu tensors through tpu_dist
   (one XLA all-reduce over JAX's multi-controller runtime; on XLA:CPU the bytes move over gloo
   inside XLA) against CPU tensors through torch's own ProcessGroupGloo in the same job.
   Bus bandwidth = bytes * 2 (n - 1) / n / time (NCCL's convention). Every timed call is waited on.
2. A DDP training step (an MLP, SGD, batch 64 per rank) on `nprocs` ranks against the same
   step on one process (no DDP): the step time and the samples per second of the whole job.
Machines are noisy and here "tpu" is XLA:CPU sharing the CPU cores with the ranks: compare ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(nprocs, args, role):
    port, coordinator = _port(), _port()
    procs = []
    for rank in range(nprocs):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(nprocs),
            LOCAL_WORLD_SIZE=str(nprocs),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TORCHTPU_COORDINATOR_ADDRESS=f"127.0.0.1:{coordinator}",
            OMP_NUM_THREADS="1",
        )
        env.pop("TORCHTPU_NUM_DEVICES", None)
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--role", role, *args], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed:\n{outs}")
    return next(json.loads(line[len("RESULT ") :]) for line in outs[0].splitlines() if line.startswith("RESULT "))


def _wait_all(t):
    if t.device.type == "tpu":
        torch.tpu.synchronize()


def bench_all_reduce(max_mb):
    import torch.distributed as dist

    dist.init_process_group("cpu:gloo,tpu:tpu_dist")
    n = dist.get_world_size()
    rows = []
    size = 4096
    while size <= max_mb * 2**20:
        row = {"bytes": size}
        for device in ("tpu", "cpu"):
            x = torch.randn(size // 4, device=device)
            for _ in range(3):
                dist.all_reduce(x)
            _wait_all(x)
            iters = max(3, min(200, int(2e8 // size)))
            samples = []
            for _ in range(3):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(x)  # waits for each (the Work is waited on)
                _wait_all(x)
                samples.append((time.perf_counter() - t0) / iters)
            t = statistics.median(samples)
            row[device] = {"us": t * 1e6, "busbw_GBps": size * 2 * (n - 1) / n / t / 1e9}
        rows.append(row)
        size *= 4
    dist.destroy_process_group()
    return rows


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 10),
    )


def bench_ddp(steps, distributed):
    import torch.distributed as dist

    model = _mlp().to("tpu")
    if distributed:
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group()
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256, device="tpu"), torch.randint(0, 10, (64,), device="tpu")

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    torch.tpu.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.tpu.synchronize()
    t = (time.perf_counter() - t0) / steps
    world = dist.get_world_size() if distributed else 1
    if distributed:
        dist.destroy_process_group()
    return {"step_ms": t * 1e3, "samples_per_s": 64 * world / t, "ranks": world}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--max-mb", type=int, default=64)
    p.add_argument("--ddp-steps", type=int, default=20)
    p.add_argument("--role", default="main")
    a = p.parse_args()
    passthrough = ["--max-mb", str(a.max_mb), "--ddp-steps", str(a.ddp_steps)]
    if a.role == "allreduce":
        r = bench_all_reduce(a.max_mb)
        if int(os.environ["RANK"]) == 0:
            print("RESULT " + json.dumps(r), flush=True)
        return
    if a.role in ("ddp", "single"):
        r = bench_ddp(a.ddp_steps, a.role == "ddp")
        if int(os.environ.get("RANK", "0")) == 0:
            print("RESULT " + json.dumps(r), flush=True)
        return
    print(f"all_reduce SUM float32 over {a.nprocs} ranks: tpu_dist (XLA collectives) vs gloo (CPU tensors)")
    print(f"{'bytes':>10} {'tpu us':>10} {'tpu GB/s':>9} {'gloo us':>10} {'gloo GB/s':>9} {'tpu/gloo time':>14}")
    for row in spawn(a.nprocs, passthrough, "allreduce"):
        t, c = row["tpu"], row["cpu"]
        print(
            f"{row['bytes']:>10} {t['us']:>10.1f} {t['busbw_GBps']:>9.3f} {c['us']:>10.1f} "
            f"{c['busbw_GBps']:>9.3f} {t['us'] / c['us']:>14.2f}"
        )
    single = spawn(1, passthrough, "single")
    multi = spawn(a.nprocs, passthrough, "ddp")
    print("\nDDP training step (MLP 256-1024-1024-10, batch 64 per rank, SGD):")
    print(f"  1 process        : {single['step_ms']:8.2f} ms/step  {single['samples_per_s']:9.0f} samples/s")
    print(
        f"  DDP, {a.nprocs} ranks     : {multi['step_ms']:8.2f} ms/step  {multi['samples_per_s']:9.0f} samples/s"
        f"  ({multi['samples_per_s'] / single['samples_per_s']:.2f}x the job's throughput)"
    )


if __name__ == "__main__":
    import torch

    main()
