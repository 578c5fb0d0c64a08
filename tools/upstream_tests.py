"""Run PyTorch's own device-generic test files on "cpu" and on "tpu", and compare them by test name.

    python tools/upstream_tests.py run /path/to/pytorch test/test_view_ops.py test/test_indexing.py \
        --out /tmp/pt_runs [-k EXPR] [--test-timeout 300] [--file-timeout 3600] [--resume] [-- <more pytest args>]
    python tools/upstream_tests.py report /tmp/pt_runs [--markdown]

`run` takes a PyTorch source checkout (only its `test/` folder is needed, at the tag of the installed
torch: docs/upstream_tests.md; nothing of it is copied here) and test files inside it. Each file runs
in its own pytest process once per device, from the checkout's `test/` folder (PyTorch's test files
import their neighbours by bare name), with PYTORCH_TESTING_DEVICE_ONLY_FOR set to that device:
`torch.testing._internal.common_device_type` then instantiates each device-generic class for that
device only (TestFooCPU, or TestFooTPU through PrivateUse1TestBase once torch.tpu.is_available()).
The checkout's conftest.py is not loaded (it wants PyTorch's CI plugins); the tests are unittest
classes and need none of its fixtures. Results are written one test at a time by the recorder of
tools/transformers_tests.py (a JSON line per test), so a file that hangs or crashes the process keeps
what finished, and the run says how the process ended (a negative return code is the signal that
killed it: -11 a segfault). `--resume` keeps the results in --out and runs only the tests they lack,
so a file that ran out of time is finished by another process.

`report` matches the two devices' results by test name with the device taken out (TestFooCPU::
test_bar_cpu_float32 and TestFooTPU::test_bar_tpu_float32 are one test), prints per file how many of
the tests that pass on the CPU also pass on tpu, and groups the rest by cause (the exception type and
the first line of its message, numbers and addresses blanked). Tests the file runs on other devices
only (skipped on tpu with "Only runs on ...", or not made for tpu at all when the tpu process ended
normally) leave the comparison; the wall times of both devices' processes are shown side by side.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import sys
import time

from transformers_tests import RESULTS_ENV, SYNC_ENV, TIMEOUT_ENV, cause_of, run_file, tools_first_on_path

DEVICES = ("cpu", "tpu")
# PrivateUse1TestBase names its classes TestFooPRIVATEUSE1 (older releases: TestFooTPU)
_CLASS_DEVICE = re.compile(r"(CPU|TPU|PRIVATEUSE1)(?=::|$)")
_NAME_DEVICE = re.compile(r"(?<=_)(cpu|tpu)(?=_|$|\[)")


def common_name(test_id: str) -> str:
    """The test's name without its device: TestFooTPU::test_bar_tpu_float32 -> TestFoo::test_bar_DEV_float32."""
    parts = test_id.split("::")
    parts = [_CLASS_DEVICE.sub("", p) if i == len(parts) - 2 else p for i, p in enumerate(parts)]
    found = list(_NAME_DEVICE.finditer(parts[-1]))
    if found:  # the device suffix is the last device word (test_only_cpu_x_tpu_float32: the "tpu")
        last = found[-1]
        parts[-1] = parts[-1][: last.start()] + "DEV" + parts[-1][last.end() :]
    return "::".join(parts)


# ------------------------------------------------------------------ run
def _test_files(test_root: pathlib.Path, paths: list[str]) -> list[str]:
    files = []
    for given in paths:
        path = pathlib.Path(given)
        path = (test_root.parent / path) if path.parts and path.parts[0] == "test" else (test_root / path)
        if path.is_dir():
            files += sorted(str(p.relative_to(test_root)) for p in path.glob("test_*.py"))
        elif path.is_file():
            files.append(str(path.resolve().relative_to(test_root.resolve())))
        else:
            raise SystemExit(f"no test file or folder {given!r} under {test_root}")
    return files


def _device_env(device: str, results: pathlib.Path, test_timeout: float, eager_mode: str | None) -> dict:
    env = dict(os.environ)
    env["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = device
    if eager_mode:
        env["TORCHTPU_EAGER_MODE"] = eager_mode
    env[RESULTS_ENV], env[TIMEOUT_ENV] = str(results), str(test_timeout)
    if device == "tpu":  # a deferred device-side assert fails the test that caused it, not the next one
        env[SYNC_ENV] = "1"
    env["PYTHONPATH"] = tools_first_on_path(env)
    return env


def run(args) -> int:
    checkout = pathlib.Path(args.checkout).resolve()
    test_root = checkout / "test" if (checkout / "test").is_dir() else checkout
    if not (test_root / "test_torch.py").is_file() and not any(test_root.glob("test_*.py")):
        raise SystemExit(f"{checkout} holds no PyTorch test files (expected a checkout with test/)")
    out = pathlib.Path(args.out).resolve()
    files = _test_files(test_root, args.paths)
    devices = args.devices.split(",")
    unknown = [d for d in devices if d not in DEVICES]
    if unknown:
        raise SystemExit(f"--devices: unknown {unknown}; choose from {DEVICES}")
    out.mkdir(parents=True, exist_ok=True)
    previous = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
    endings, seconds = previous.get("endings", {}), previous.get("seconds", {})
    for test_file in files:
        for device in devices:
            results = out / device / (test_file.replace("/", "+") + ".jsonl")
            results.parent.mkdir(parents=True, exist_ok=True)
            done_before = _recorded_ids(results) if args.resume else []
            if not args.resume:
                results.unlink(missing_ok=True)
            # --resume: only what a file that ran out of time left
            deselected = [arg for test_id in done_before for arg in ("--deselect", test_id)]
            start = time.time()
            ending = run_file(
                test_file,
                test_root,
                _device_env(device, results, args.test_timeout, args.eager_mode),
                args.k,
                deselected + args.pytest_args,
                args.file_timeout,
                pytest_flags=("--noconftest",),  # (the checkout's conftest wants PyTorch's CI plugins)
            )
            if ending is None:
                ending = f"ran over {args.file_timeout:g} s (--file-timeout): results so far kept"
            key = f"{device} {test_file}"
            endings[key] = ending
            # wall time of the file's processes (a --resume adds its process to the earlier ones)
            seconds[key] = (seconds.get(key, 0) if done_before else 0) + time.time() - start
            print(f"{device:4} {test_file}: {time.time() - start:.0f} s, {ending}", flush=True)
            (out / "run.json").write_text(
                json.dumps(
                    {
                        "checkout": str(checkout),
                        "files": sorted(set(previous.get("files", [])) | set(files)),
                        "k": args.k,
                        "pytest_args": args.pytest_args,
                        "endings": endings,
                        "seconds": seconds,
                    },
                    indent=1,
                )
            )
    print()
    return report(argparse.Namespace(out=str(out), markdown=args.markdown))


def _recorded_ids(results: pathlib.Path) -> list[str]:
    if not results.is_file():
        return []
    return [json.loads(line)["id"] for line in results.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------ report
# skips that say a test is for other devices (@onlyCPU, @onlyOn, @onlyCUDA, ...): not a tpu failure
_DEVICE_ONLY_SKIP = re.compile(r"Only runs on|onlyCPU|onlyCUDA|onlyNativeDeviceTypes|not supported on PRIVATEUSE1")


def _device_only_skip(record: dict) -> bool:
    return record["outcome"] == "skipped" and bool(_DEVICE_ONLY_SKIP.search(record.get("message", "")))


def _load(out: pathlib.Path, device: str) -> dict[str, dict[str, dict]]:
    """{test file: {common test name: record}} for one device."""
    files: dict[str, dict[str, dict]] = {}
    for path in sorted((out / device).glob("*.jsonl")):
        test_file = path.name[: -len(".jsonl")].replace("+", "/")
        records = files.setdefault(test_file, {})
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                records[common_name(record["id"])] = record
    return files


_MISSING = {"outcome": "missing", "message": "not run on tpu (the process crashed or ran out of time before it)"}
_HEADER = (
    "file",
    "cpu pass",
    "of those, tpu pass",
    "rate",
    "tpu fail",
    "tpu skip",
    "cpu-passing, not for tpu",
    "time tpu / cpu",
    "tpu process",
)


def _file_row(test_file, c, t, endings, seconds):
    """(the file's row of the table, its cpu-passing tests that do not pass on tpu with their tpu records)."""
    # A tpu process that ended normally ran every test the file makes for tpu: a cpu test it lacks
    # was not made for tpu (per-device dtype lists: @dtypesIfCPU), not lost to a crash or a timeout.
    finished = endings.get(f"tpu {test_file}", "").startswith(("rc=0", "rc=1", "rc=5"))

    def other_devices_only(name, record):
        return _device_only_skip(t.get(name, record)) or (finished and name not in t)

    # tests the CPU passes, less those the file itself runs on other devices only
    passing = [name for name, r in c.items() if r["outcome"] == "passed" and not other_devices_only(name, r)]
    device_only = sum(1 for name, r in c.items() if r["outcome"] == "passed" and other_devices_only(name, r))
    lost = [(name, t.get(name, _MISSING)) for name in passing if t.get(name, {}).get("outcome") != "passed"]
    counts = collections.Counter(r["outcome"] for r in t.values())
    rate = f"{(len(passing) - len(lost)) / len(passing):.1%}" if passing else "-"
    cpu_s, tpu_s = seconds.get(f"cpu {test_file}"), seconds.get(f"tpu {test_file}")
    times = f"{tpu_s:.0f} s / {cpu_s:.0f} s ({tpu_s / cpu_s:.1f}x)" if cpu_s and tpu_s else "-"
    row = (
        test_file,
        len(passing),
        len(passing) - len(lost),
        rate,
        counts["failed"] + counts["error"],
        counts["skipped"],
        device_only,
        times,
        endings.get(f"tpu {test_file}", ""),
    )
    return row, lost


def _print_causes(lost_all):
    groups = collections.defaultdict(list)
    for name, record in lost_all:
        missing = record["outcome"] == "missing"
        groups["missing: " + record["message"] if missing else cause_of(record.get("message", ""))].append(name)
    if groups:
        print("\ncpu-passing tests that do not pass on tpu, by cause:")
        for cause, names in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            print(f"  [{len(names)}] {cause}")
            for name in names[:5]:
                print(f"      {name}")
            if len(names) > 5:
                print(f"      ... {len(names) - 5} more")


def report(args) -> int:
    out = pathlib.Path(args.out)
    run_info = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
    endings, seconds = run_info.get("endings", {}), run_info.get("seconds", {})
    cpu, tpu = _load(out, "cpu"), _load(out, "tpu")
    rows, lost_all = [], []
    for test_file in sorted(set(cpu) | set(tpu)):
        row, lost = _file_row(test_file, cpu.get(test_file, {}), tpu.get(test_file, {}), endings, seconds)
        rows.append(row)
        lost_all += lost
    if args.markdown:
        print("| " + " | ".join(_HEADER) + " |")
        print("|" + "---|" * len(_HEADER))
        for row in rows:
            print("| " + " | ".join(str(x) for x in row) + " |")
    else:
        for row in rows:
            print(
                f"{row[0]}: {row[2]}/{row[1]} cpu-passing tests pass on tpu ({row[3]}); tpu {row[4]} fail, "
                f"{row[5]} skip; {row[6]} cpu-passing tests are for other devices only; time {row[7]}; {row[8]}"
            )
    total = sum(r[1] for r in rows)
    print(f"\ntotal: {total - len(lost_all)} of {total} cpu-passing tests pass on tpu")
    _print_causes(lost_all)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run test files of a PyTorch checkout on cpu and tpu, then report")
    p.add_argument("checkout", help="a PyTorch source checkout (or its test/ folder)")
    p.add_argument("paths", nargs="+", help="test files, relative to the checkout (test/test_x.py) or to test/")
    p.add_argument("--out", default="upstream_test_runs", help="where the per-test results go")
    p.add_argument("--devices", default="cpu,tpu")
    p.add_argument("-k", default=None, help="pytest -k expression, for every file")
    p.add_argument("--test-timeout", type=float, default=300, help="seconds per test (0: none)")
    p.add_argument("--file-timeout", type=float, default=3600, help="seconds per test file and device")
    p.add_argument(
        "--eager-mode",
        default=None,
        choices=("fused", "strict", "debug"),
        help="TORCHTPU_EAGER_MODE for the run (gradcheck's reentrancy check wants strict: a fused "
        "segment rounds differently from its ops run one by one)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the results in --out and run only the tests they lack (a file that ran out of time goes on)",
    )
    p.add_argument("--markdown", action="store_true")
    r = sub.add_parser("report", help="compare the results of a run")
    r.add_argument("out")
    r.add_argument("--markdown", action="store_true")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []  # after --: more pytest arguments (-x, ...)
    args = parser.parse_args(argv[: len(argv) - len(extra) - (1 if "--" in argv else 0)])
    if args.command == "run":
        args.pytest_args = extra
        return run(args)
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
