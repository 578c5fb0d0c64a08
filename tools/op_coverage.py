"""ATen coverage of the tpu device measured against PyTorch's OpInfo database.

    python tools/op_coverage.py                 # full sweep -> docs/op_coverage.md
    python tools/op_coverage.py --resume        # continue an interrupted sweep
    python tools/op_coverage.py --rerun-failed  # keep the passes, rerun the rest (after fixes)
    python tools/op_coverage.py --report-only   # rewrite the markdown from stored results
    python tools/op_coverage.py --ops 'cum|sort' --dtypes float32 --out /tmp/x.md   # a slice

The sweep runs in worker subprocesses, each over a chunk of OpInfos (bounded memory, and JAX's
compile caches start empty). Each (op, dtype, check) result is appended to a JSON-lines file under
build/op_coverage/ as soon as it is known, so an interrupted run resumes where it stopped. A check
that hangs past --hard-timeout kills its worker; it is recorded as a timeout and the chunk goes on
in a fresh worker.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
DEFAULT_STATE = os.path.join(ROOT, "build", "op_coverage")
DTYPE_NAMES = [
    "float32",
    "bfloat16",
    "float16",
    "float64",
    "int64",
    "int32",
    "uint8",
    "bool",
    "complex64",
    "complex128",
]
KINDS = ["forward", "inplace", "out", "grad"]


# ------------------------------------------------------------------ worker
def worker(args):
    os.environ.setdefault("TORCHTPU_CPU_FALLBACK", "0")
    import opinfo_support as S
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    torch.manual_seed(args.seed)
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    kinds = args.kinds.split(",")
    done = _done_keys(args.state)
    results = open(os.path.join(args.state, f"results-{args.chunk}.jsonl"), "a")
    progress = os.path.join(args.state, f"progress-{args.chunk}")
    for index in [int(i) for i in args.indices.split(",")]:
        op = op_db[index]
        name = S.op_id(op)
        if S.out_of_scope(name):
            continue
        for dtype in S.cpu_dtypes(op):
            if dtype not in dtypes:
                continue
            for kind in S.kinds_for(op, dtype):
                if kind not in kinds:
                    continue
                key = (name, str(dtype).replace("torch.", ""), kind)
                if key in done:
                    continue
                with open(progress, "w") as f:
                    json.dump(key, f)
                start = time.time()
                r = S.check(op, dtype, kind, max_samples=args.max_samples, timeout=args.timeout)
                results.write(
                    json.dumps(
                        {
                            "op": key[0],
                            "dtype": key[1],
                            "kind": kind,
                            "status": r.status,
                            "reason": r.reason,
                            "samples": r.samples,
                            "seconds": round(time.time() - start, 3),
                        }
                    )
                    + "\n"
                )
                results.flush()
    if os.path.exists(progress):
        os.remove(progress)


def _load(state):
    rows = {}
    for path in sorted(glob.glob(os.path.join(state, "results-*.jsonl"))):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a killed worker
                rows[(r["op"], r["dtype"], r["kind"])] = r
    return rows


def _done_keys(state):
    return set(_load(state))


# ------------------------------------------------------------------ driver
def _forget_failures(state, ops):
    """--rerun-failed: keep the passes (and the results of ops `ops` leaves out), forget the rest."""
    pat = re.compile(ops) if ops else None
    for path in glob.glob(os.path.join(state, "results-*.jsonl")):
        keep = []
        for line in open(path):
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a killed worker
            if r["status"] == "pass" or (pat is not None and not pat.search(r["op"])):
                keep.append(line if line.endswith("\n") else line + "\n")
        open(path, "w").writelines(keep)


def _worker_command(args, cid, idx, seed):
    return [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--chunk",
        str(cid),
        "--indices",
        ",".join(map(str, idx)),
        "--state",
        args.state,
        "--dtypes",
        args.dtypes,
        "--kinds",
        args.kinds,
        "--max-samples",
        str(args.max_samples),
        "--timeout",
        str(args.timeout),
        "--seed",
        str(seed),
    ]


def sweep(args):
    import opinfo_support as S
    import torch  # noqa: F401  (op_db needs torch; the driver itself runs nothing on tpu)
    from torch.testing._internal.common_methods_invocations import op_db

    os.makedirs(args.state, exist_ok=True)
    if not args.resume and not args.rerun_failed:
        for path in glob.glob(os.path.join(args.state, "*")):
            os.remove(path)
    if args.rerun_failed:
        _forget_failures(args.state, args.ops)
    meta_path = os.path.join(args.state, "meta.json")
    meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {"seconds": 0.0, "seed": args.seed}
    pattern = re.compile(args.ops) if args.ops else None
    indices = [
        i
        for i, op in enumerate(op_db)
        if not S.out_of_scope(S.op_id(op)) and (pattern is None or pattern.search(S.op_id(op)))
    ]
    chunks = [indices[i : i + args.chunk] for i in range(0, len(indices), args.chunk)]
    pending = collections.deque(enumerate(chunks))
    running = {}  # chunk id -> (Popen, indices, last progress time, last progress content)
    start = time.time()
    log = open(os.path.join(args.state, "workers.log"), "a")

    def launch(cid, idx):
        cmd = _worker_command(args, cid, idx, meta["seed"] + cid)
        running[cid] = [subprocess.Popen(cmd, stdout=log, stderr=log), idx, time.time(), None]

    finished = 0
    while pending or running:
        while pending and len(running) < args.jobs:
            launch(*pending.popleft())
        time.sleep(1.0)
        for cid, (proc, idx, _last_t, last_p) in list(running.items()):
            progress = os.path.join(args.state, f"progress-{cid}")
            current = open(progress).read() if os.path.exists(progress) else None
            if current != last_p:
                running[cid][2], running[cid][3] = time.time(), current
            if proc.poll() is not None:
                del running[cid]
                if current is not None and proc.returncode != 0:
                    # the worker died inside a check (crash or out of memory): record it, go on
                    _record_abort(args.state, cid, current, f"worker died (exit {proc.returncode})")
                    pending.appendleft((cid, idx))
                else:
                    finished += 1
                    print(f"[{time.time() - start:7.0f}s] chunk {cid + 1}/{len(chunks)} done", flush=True)
            elif time.time() - running[cid][2] > args.hard_timeout:
                proc.kill()
                proc.wait()
                del running[cid]
                _record_abort(args.state, cid, current, f"hard timeout ({args.hard_timeout}s), worker killed")
                pending.appendleft((cid, idx))
    meta["seconds"] += time.time() - start
    json.dump(meta, open(meta_path, "w"))
    return meta


def _record_abort(state, cid, current, reason):
    if current is None:
        return
    op, dtype, kind = json.loads(current)
    with open(os.path.join(state, f"results-{cid}.jsonl"), "a") as f:
        f.write(
            "\n"
            + json.dumps(
                {
                    "op": op,
                    "dtype": dtype,
                    "kind": kind,
                    "status": "timeout",
                    "reason": reason,
                    "samples": 0,
                    "seconds": 0,
                }
            )
            + "\n"
        )
    os.remove(os.path.join(state, f"progress-{cid}"))


# ------------------------------------------------------------------ report
_COUNTED = {"pass", "fail", "error", "not_lowered", "timeout"}


def _pct(a, b):
    return f"{100.0 * a / b:.1f}% ({a}/{b})" if b else "n/a"


def _counts_by_kind_dtype(rows):
    by_kind_dtype = collections.defaultdict(collections.Counter)
    for (_op, dtype, kind), r in rows.items():
        if r["status"] in _COUNTED:
            by_kind_dtype[(kind, dtype)]["total"] += 1
            by_kind_dtype[(kind, dtype)]["pass"] += r["status"] == "pass"
    return by_kind_dtype


def _total(by_kind_dtype, kind):
    t = sum(c["total"] for (k, _), c in by_kind_dtype.items() if k == kind)
    p = sum(c["pass"] for (k, _), c in by_kind_dtype.items() if k == kind)
    return p, t


def _header(L, args, meta, command):
    import jax
    import torch

    L.append("# ATen coverage of the tpu device, measured against PyTorch's OpInfo database\n")
    L.append(
        f"Generated by `{command}` on {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} "
        f"in {meta['seconds'] / 60:.1f} min of wall time ({args.jobs} worker processes); "
        f"torch {torch.__version__}, jax {jax.__version__}, backend XLA:{jax.default_backend().upper()}, "
        f"seed {meta['seed']} (samples are fresh random tensors; up to {args.max_samples} per "
        f"(op, dtype), spread over the OpInfo's sample list).\n"
    )
    L.append(
        "Each (op, dtype) runs the OpInfo samples on the CPU and on `tpu` and compares values, shapes "
        "and dtypes with `torch.testing.assert_close` (float32 rtol 1e-4/atol 1e-5, float16 1e-2/1e-3, "
        "bfloat16 1.6e-2/1e-2, float64 1e-7, complex64/complex128 as float32/float64, integers and bool exact); "
        "a float16/bfloat16 result beyond those tolerances still matches when it is at least as close as the "
        "CPU's to the same computation in float64 (the CPU rounds intermediates to the half dtype; PyTorch's "
        "reference tests judge the same way). *In-place* also compares the "
        "mutated input, *out=* the out tensor(s), *gradient* (float32, complex64) the gradients of every input "
        "for random cotangents. Random ops are compared on shape and dtype only. Denominators count "
        "(op, dtype) pairs whose samples the CPU accepts. Test harness: `tests/opinfo_support.py`; "
        "the same checks run under `pytest -m slow tests/test_opinfo.py`.\n"
    )


def _summary(L, rows, ops, scoped, oos, by_kind_dtype):
    ops_all_pass = collections.defaultdict(lambda: True)
    for (op, _dtype, kind), r in rows.items():
        if kind == "forward" and r["status"] in _COUNTED:
            ops_all_pass[op] &= r["status"] == "pass"
    L.append("## Summary\n")
    L.append(f"- OpInfos: {len(ops)}; in scope: {len(scoped)}; out of scope: {len(oos)} (listed below)")
    L.append(f"- **Forward parity: {_pct(*_total(by_kind_dtype, 'forward'))}** of (op, dtype) pairs")
    L.append(
        f"- **Gradient parity (float32, complex64): {_pct(*_total(by_kind_dtype, 'grad'))}** of (differentiable op, "
        "dtype) pairs"
    )
    L.append(
        f"- In-place variants: {_pct(*_total(by_kind_dtype, 'inplace'))}; out= variants: "
        f"{_pct(*_total(by_kind_dtype, 'out'))}"
    )
    L.append(f"- OpInfos passing forward at every dtype: {_pct(sum(ops_all_pass.values()), len(ops_all_pass))}")
    L.append("")
    L.append("| dtype | forward | in-place | out= | gradient |")
    L.append("|---|---|---|---|---|")
    for d in DTYPE_NAMES:
        cells = []
        for k in KINDS:
            c = by_kind_dtype.get((k, d))
            cells.append(_pct(c["pass"], c["total"]) if c else "–")
        L.append(f"| {d} | " + " | ".join(cells) + " |")
    L.append("")
    status_counts = collections.Counter(r["status"] for r in rows.values())
    L.append(
        "Results by status (all checks): " + ", ".join(f"{k} {v}" for k, v in sorted(status_counts.items())) + "\n"
    )


def _missing_lowerings(L, rows):
    missing = collections.defaultdict(set)
    for (op, dtype, kind), r in rows.items():
        if r["status"] == "not_lowered":
            missing[r["reason"].split(" ")[0]].add(op + ("" if kind == "forward" else f" ({kind})"))
    L.append("## ATen ops without a tpu lowering\n")
    L.append(
        "Each ATen op that a check reached without finding a lowering (nor a decomposition), with "
        "the OpInfos it blocks (a check stops at its first missing op, so fixing one can reveal "
        "another behind it).\n"
    )
    L.append("| ATen op | blocked OpInfos |")
    L.append("|---|---|")
    for name, blocked in sorted(missing.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        names = sorted(blocked)
        shown = ", ".join(names[:12]) + (f", … (+{len(names) - 12})" if len(names) > 12 else "")
        L.append(f"| `{name}` | {len(names)}: {shown} |")
    L.append("")


def _failures(L, rows):
    L.append("## Failing checks\n")
    L.append(
        "Every failing (op, dtype, check) except missing lowerings (above), with the first line of "
        "the error. `fail` = values/shapes/dtypes differ from the CPU; `error` = the tpu run raised "
        "(the CPU did not); `timeout` = over the time limit.\n"
    )
    L.append("| op | check | dtypes | status | reason |")
    L.append("|---|---|---|---|---|")
    grouped = collections.defaultdict(list)
    for (op, dtype, kind), r in rows.items():
        if r["status"] in ("fail", "error", "timeout"):
            reason = re.sub(r"\s+", " ", r["reason"]).replace("|", "\\|")
            grouped[(op, kind, r["status"], reason[:220])].append(dtype)
    for (op, kind, status, reason), dts in sorted(grouped.items()):
        dts = sorted(dts, key=DTYPE_NAMES.index)
        L.append(f"| {op} | {kind} | {', '.join(dts)} | {status} | {reason} |")
    L.append("")


def _out_of_scope(L, oos, S):
    L.append("## Out of scope\n")
    L.append("| OpInfo | reason |")
    L.append("|---|---|")
    for name, why in oos:
        L.append(f"| {name} | {why} |")
    L.append("")
    L.append(
        "Random ops (compared on shape and dtype only; their distributions are tested in "
        "`tests/test_random_ops.py`): " + ", ".join(sorted(S.RANDOM_OPS)) + ".\n"
    )


def report(args, meta, command):
    import opinfo_support as S
    from torch.testing._internal.common_methods_invocations import op_db

    rows = _load(args.state)
    pattern = re.compile(args.ops) if args.ops and not args.rerun_failed else None
    ops = [op for op in op_db if pattern is None or pattern.search(S.op_id(op))]
    scoped = [op for op in ops if not S.out_of_scope(S.op_id(op))]
    oos = [(S.op_id(op), S.out_of_scope(S.op_id(op))) for op in ops if S.out_of_scope(S.op_id(op))]
    by_kind_dtype = _counts_by_kind_dtype(rows)
    L = []
    _header(L, args, meta, command)
    _summary(L, rows, ops, scoped, oos, by_kind_dtype)
    _missing_lowerings(L, rows)
    _failures(L, rows)
    _out_of_scope(L, oos, S)
    no_samples = sorted({(op, d, k) for (op, d, k), r in rows.items() if r["status"] == "no_samples"})
    if no_samples:
        L.append("## Not compared: the CPU accepted no sample\n")
        L.append(", ".join(f"{op}/{d}/{k}" for op, d, k in no_samples) + "\n")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(L))
    fwd, grad = _total(by_kind_dtype, "forward"), _total(by_kind_dtype, "grad")
    print(f"wrote {args.out}: forward {_pct(*fwd)}, gradient {_pct(*grad)}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=2, help="worker processes at a time")
    p.add_argument("--chunk", type=int, default=40, help="OpInfos per worker process")
    p.add_argument("--max-samples", type=int, default=2)
    p.add_argument("--timeout", type=int, default=90, help="soft limit per check (s)")
    p.add_argument("--hard-timeout", type=int, default=300, help="kill a worker stuck this long (s)")
    p.add_argument("--ops", default=None, help="regex on OpInfo names (default: all)")
    p.add_argument("--dtypes", default=",".join(DTYPE_NAMES))
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--state", default=DEFAULT_STATE, help="where results are kept between runs")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "op_coverage.md"))
    p.add_argument("--resume", action="store_true", help="keep stored results, run only what is missing")
    p.add_argument("--rerun-failed", action="store_true", help="keep stored passes, rerun every other check")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--indices", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.seed is None:
        args.seed = int(time.time()) % 100000
    if args.worker:
        args.chunk = int(args.chunk)
        return worker(args)
    command = "python tools/op_coverage.py" + ("".join(" " + a for a in sys.argv[1:]) if sys.argv[1:] else "")
    if args.report_only:
        meta_path = os.path.join(args.state, "meta.json")
        meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {"seconds": 0.0, "seed": args.seed}
    else:
        meta = sweep(args)
    report(args, meta, command)


if __name__ == "__main__":
    main()
