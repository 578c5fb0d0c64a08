"""Run Transformers' own tests on "cpu" and on "tpu", as a new user would, and compare them by test id.

    python tools/transformers_tests.py run /path/to/transformers tests/generation tests/models/gpt2 \
        --out /tmp/tf_runs [-k EXPR] [--test-timeout 300] [--file-timeout 1800] [-- <more pytest args>]
    python tools/transformers_tests.py report /tmp/tf_runs [--markdown]

`run` takes a Transformers source checkout (nothing of it is copied here) and test files or folders
inside it. Each test file runs in its own pytest process, once per device, from the checkout's root:
"cpu" with TRANSFORMERS_TEST_DEVICE=cpu (the reference), "tpu" with TRANSFORMERS_TEST_DEVICE=tpu,
TRANSFORMERS_TEST_BACKEND=torchtpu and the device spec of `python -m
torchtpu.integrations.transformers_device_spec` (written into the checkout's root for the run, since
Transformers imports the spec by bare file name, and removed afterwards). Results are written one test
at a time by the pytest plugin below (a JSON line per test: a file that runs over --file-timeout keeps
what finished), so a hang costs one file, not the run. A test that runs over --test-timeout fails
with TestTimeoutError (a SIGALRM in the test's thread; a long XLA compile is interrupted when it returns
to Python; a test blocked in native code past the limit is ended by a watchdog, and its file resumes).

`report` prints, per test file, what passed, failed and was skipped on each device and the tests' time
(the sum of their own durations) on each, and the tests
that pass on the CPU but not on tpu, grouped by cause (the exception type and first line of its
message, with numbers and addresses blanked so that one cause groups many tests).

Note: a checkout's conftest.py puts its own `src/` first on sys.path, so the tests run against the
checkout's Transformers: check out the tag of the installed release (e.g. v5.25.0). For a machine
without a checkout, tools/transformers_suite/setup.sh lays out the release sdist's common tests with
tiny testers of ours; run it with this tool the same way.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

DEVICES = ("cpu", "tpu")
# One spec file per run (Transformers imports it by bare name from the checkout's root): runs that share a
# checkout must not remove each other's spec when they finish.
SPEC_NAME = f"torchtpu_device_spec_{os.getpid()}.py"
RESULTS_ENV = "TORCHTPU_TESTS_RESULTS"
TIMEOUT_ENV = "TORCHTPU_TESTS_TEST_TIMEOUT"
SYNC_ENV = "TORCHTPU_TESTS_SYNC_EACH"  # set: synchronize tpu after each test (_settle_tpu)
STALL_ENV = "TORCHTPU_TESTS_STALL"  # where the watchdog of `_time_limit` writes a stalled test's stacks
SKIP_ENV = "TORCHTPU_TESTS_SKIP_IDS"  # a file of test ids (one a line) to deselect: a resumed file's finished tests
# A test still running this long after its limit never returned to Python (the alarm lands only there): the
# watchdog dumps every thread's stack next to the results and ends the process; `run` resumes the file.
STALL_GRACE_ENV = "TORCHTPU_TESTS_STALL_GRACE"  # seconds (default STALL_GRACE_S)
STALL_GRACE_S = 60.0
STALL_MARK = "stalled: "


# ------------------------------------------------------------------ the pytest plugin (-p transformers_tests)
def _crash_message(report) -> str:
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message
    text = str(longrepr).strip().splitlines()
    errors = [line[1:].strip() for line in text if line.startswith("E ")]
    return errors[0] if errors else (text[-1] if text else "")


class _Recorder:
    """Writes each test's outcome as soon as it is known: {"id", "outcome", "message", "seconds"}."""

    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1)
        self.pending: dict[str, dict] = {}

    def _write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")

    def pytest_collectreport(self, report):
        if report.failed:
            self._write(
                {
                    "id": report.nodeid,
                    "outcome": "error",
                    "message": "collection: " + _crash_message(report),
                    "seconds": 0.0,
                }
            )

    def pytest_runtest_logreport(self, report):
        record = self.pending.setdefault(
            report.nodeid, {"id": report.nodeid, "outcome": "passed", "message": "", "seconds": 0.0}
        )
        record["seconds"] += report.duration
        if report.skipped and record["outcome"] == "passed":
            record.update(outcome="skipped", message=_crash_message(report))
        elif report.failed and record["outcome"] in ("passed", "skipped"):
            record.update(outcome="failed" if report.when == "call" else "error", message=_crash_message(report))
        if report.when == "teardown":
            self._write(self.pending.pop(report.nodeid))


class TestTimeoutError(BaseException):
    """The per-test limit's exception. Not an Exception (as pytest's own Failed is not): library code's
    `except Exception` around its work (ours: a compile or a cache read that falls back) would take a
    TimeoutError for a failure of that work, go on, and the test would run unlimited."""

    __test__ = False  # (not a test class, for pytest)


def _stall_grace() -> float:
    return float(os.environ.get(STALL_GRACE_ENV, STALL_GRACE_S))


def _time_limit(test_timeout: float, stall_path: str | None = None):
    """The per-test limit: armed only while a phase of the test (setup, call, teardown) runs, with what
    is left of the test's time, so that the alarm lands in the test's code (a failure of that test);
    armed from setup to teardown, one landing in pytest's own reporting between phases ended the whole
    file's run with an INTERNALERROR. Past the deadline the alarm repeats (one swallowed by an `except
    BaseException` that goes on is raised again) until the phase ends. The alarm runs only when the main
    thread returns to Python: a test blocked in native code (a wait that never ends) outlives it. For
    those, a watchdog thread (faulthandler) writes the test's id and every thread's stack to `stall_path`
    _stall_grace() s after the limit and ends the process; the run goes on with the file's other tests
    (see `run`)."""
    import faulthandler

    import pytest

    def timed_out(signum, frame):
        raise TestTimeoutError(f"test ran over {test_timeout:g} s (--test-timeout)")

    class TimeLimit:
        deadline = 0.0
        stall = open(stall_path, "w", buffering=1) if stall_path else None

        def _phase(self, start):
            if start:
                self.deadline = time.monotonic() + test_timeout
            signal.signal(signal.SIGALRM, timed_out)
            signal.setitimer(signal.ITIMER_REAL, max(self.deadline - time.monotonic(), 1e-3), min(test_timeout, 10.0))
            try:
                return (yield)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)

        def _watch(self, nodeid):
            if self.stall is not None:
                self.stall.seek(0)
                self.stall.truncate()
                self.stall.write(nodeid + "\n")
                faulthandler.dump_traceback_later(test_timeout + _stall_grace(), exit=True, file=self.stall)

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_protocol(self, item, nextitem):
            self._watch(item.nodeid)
            try:
                return (yield)
            finally:
                if self.stall is not None:
                    faulthandler.cancel_dump_traceback_later()

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_setup(self, item):
            return (yield from self._phase(True))

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_call(self, item):
            return (yield from self._phase(False))

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_teardown(self, item):
            return (yield from self._phase(False))

    return TimeLimit()


def _deselect(path: str):
    class Deselect:
        def pytest_collection_modifyitems(self, session, config, items):
            done = set(pathlib.Path(path).read_text().split())
            config.hook.pytest_deselected(items=[i for i in items if i.nodeid in done])
            items[:] = [i for i in items if i.nodeid not in done]

    return Deselect()


def _settle_tpu():
    """A device-side assert a test left unreported (raised at the next sync: CUDA's contract) fails that
    test's teardown, not the next test; a sticky one is then cleared, as a fresh process would be."""
    import torch

    try:
        torch.tpu.synchronize()
    finally:
        torch.tpu.clear_device_assert()


def _settler():
    import pytest

    class Settle:
        @pytest.hookimpl(trylast=True)  # after pytest's own teardown, which an error here would cut short
        def pytest_runtest_teardown(self, item):
            _settle_tpu()

    return Settle()


def pytest_configure(config):
    path = os.environ.get(RESULTS_ENV)
    if path:
        config.pluginmanager.register(_Recorder(path), "torchtpu_recorder")
    test_timeout = float(os.environ.get(TIMEOUT_ENV, "0"))
    if path and test_timeout > 0:
        config.pluginmanager.register(_time_limit(test_timeout, os.environ.get(STALL_ENV)), "torchtpu_time_limit")
    if os.environ.get(SKIP_ENV):
        config.pluginmanager.register(_deselect(os.environ[SKIP_ENV]), "torchtpu_deselect")
    if os.environ.get(SYNC_ENV):
        config.pluginmanager.register(_settler(), "torchtpu_settle")


# ------------------------------------------------------------------ run
def _test_files(checkout: pathlib.Path, paths: list[str]) -> list[str]:
    files = []
    for given in paths:
        path = (checkout / given).resolve()
        if path.is_dir():
            files += sorted(str(p.relative_to(checkout)) for p in path.rglob("test_*.py"))
        elif path.is_file():
            files.append(str(path.relative_to(checkout)))
        else:
            raise SystemExit(f"no test file or folder {given!r} in {checkout}")
    return files


def _device_env(device: str) -> dict:
    env = dict(os.environ)
    env["TRANSFORMERS_TEST_DEVICE"] = device
    for name in ("TRANSFORMERS_TEST_BACKEND", "TRANSFORMERS_TEST_DEVICE_SPEC"):
        env.pop(name, None)
    if device == "tpu":
        env["TRANSFORMERS_TEST_BACKEND"] = "torchtpu"
        env["TRANSFORMERS_TEST_DEVICE_SPEC"] = SPEC_NAME
    env["PYTHONPATH"] = tools_first_on_path(env)
    return env


def tools_first_on_path(env: dict) -> str:
    """PYTHONPATH for a test process started in a checkout: this folder first, then the caller's entries
    made absolute (the process runs from the checkout, where `PYTHONPATH=src` would name nothing and the
    installed torchtpu would be tested instead of the tree the caller meant)."""
    tools = str(pathlib.Path(__file__).resolve().parent)
    given = [str(pathlib.Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([tools, *given])


def _results_path(out: pathlib.Path, device: str, test_file: str) -> pathlib.Path:
    return out / device / (test_file.replace("/", "+") + ".jsonl")


def run(args) -> int:
    checkout = pathlib.Path(args.checkout).resolve()
    if not (checkout / "tests").is_dir():
        raise SystemExit(f"{checkout} is not a Transformers checkout (no tests/ folder)")
    out = pathlib.Path(args.out).resolve()
    files = _test_files(checkout, args.paths)
    devices = args.devices.split(",")
    unknown = [d for d in devices if d not in DEVICES]
    if unknown:
        raise SystemExit(f"--devices: unknown {unknown}; choose from {DEVICES}")
    spec = checkout / SPEC_NAME
    subprocess.run(
        [sys.executable, "-m", "torchtpu.integrations.transformers_device_spec", str(spec)],
        check=True,
        capture_output=True,
    )
    meta = {"checkout": str(checkout), "files": files, "k": args.k, "pytest_args": args.pytest_args}
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(meta, indent=1))
    try:
        for test_file in files:
            for device in devices:
                results = _results_path(out, device, test_file)
                results.parent.mkdir(parents=True, exist_ok=True)
                results.unlink(missing_ok=True)
                env = _device_env(device)
                env[RESULTS_ENV], env[TIMEOUT_ENV] = str(results), str(args.test_timeout)
                start = time.time()
                status = run_file_resuming(test_file, checkout, env, args, results)
                if status is None:
                    status = f"file ran over {args.file_timeout} s (--file-timeout): results so far kept"
                    with open(results, "a") as f:
                        f.write(
                            json.dumps(
                                {
                                    "id": test_file,
                                    "outcome": "error",
                                    "seconds": args.file_timeout,
                                    "message": "TimeoutError: " + status,
                                }
                            )
                            + "\n"
                        )
                print(f"{device:4} {test_file}: {time.time() - start:.0f} s, {status}", flush=True)
    finally:
        spec.unlink(missing_ok=True)
    print()
    return report(argparse.Namespace(out=str(out), markdown=args.markdown, by_class=args.by_class))


def run_file_resuming(test_file, cwd, env, args, results: pathlib.Path) -> str | None:
    """run_file within --file-timeout; when a test stalled (its process ended by the watchdog of
    `_time_limit`), that test is recorded as failed and the file runs again without the tests recorded."""
    end = time.monotonic() + args.file_timeout
    stall = pathlib.Path(f"{results}.stall")
    env = {**env, STALL_ENV: str(stall)}
    for attempt in itertools.count(1):
        stall.unlink(missing_ok=True)
        status = run_file(test_file, cwd, env, args.k, args.pytest_args, max(end - time.monotonic(), 1.0))
        lines = stall.read_text().splitlines() if stall.exists() else []
        if len(lines) < 2:  # no stack dumped: the process ended by itself (or ran over the file's limit)
            stall.unlink(missing_ok=True)
            return status
        kept = stall.rename(f"{results}.stall{attempt}")
        with open(results, "a") as f:
            limit = f"{args.test_timeout:g} + {_stall_grace():g} s"
            message = f"TimeoutError: {STALL_MARK}{limit} without returning to Python; every thread's stack: {kept}"
            record = {"id": lines[0], "outcome": "failed", "message": message, "seconds": args.test_timeout}
            f.write(json.dumps(record) + "\n")
        if time.monotonic() >= end:
            return None
        skip = pathlib.Path(f"{results}.skip")
        skip.write_text("".join(r["id"] + "\n" for r in map(json.loads, results.read_text().splitlines())))
        env = {**env, SKIP_ENV: str(skip)}


def run_file(test_file, cwd, env, k, pytest_args, file_timeout, pytest_flags=()) -> str | None:
    """Run one test file in its own pytest process with the recorder (-p transformers_tests; `env`
    names its results file): how the process ended ("rc=N", with the output's last lines when the
    code is not pytest's passed/failed/no tests: a negative code is the signal that killed it), or
    None when it ran over `file_timeout` (the results recorded so far stay)."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        *pytest_flags,
        "-p",
        "no:cacheprovider",
        "-p",
        "transformers_tests",
        *(["-n0"] if _has_xdist() else []),
        test_file,
    ]
    if k:
        command += ["-k", k]
    command += pytest_args
    try:
        done = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=file_timeout
        )
    except subprocess.TimeoutExpired:
        return None
    ending = f"rc={done.returncode}"
    if done.returncode not in (0, 1, 5):  # 2: interrupted, 3: internal error, 4: usage, < 0: a signal
        ending += " " + " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
    return ending


def _has_xdist() -> bool:
    import importlib.util

    return importlib.util.find_spec("xdist") is not None


# ------------------------------------------------------------------ report
def _load(out: pathlib.Path, device: str, by_class: bool = False) -> dict[str, dict[str, dict]]:
    """{test file (or file::class): {test id: record}} for one device."""
    groups: dict[str, dict[str, dict]] = {}
    for path in sorted((out / device).glob("*.jsonl")):
        test_file = path.name[: -len(".jsonl")].replace("+", "/")
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                parts = record["id"].split("::")
                group = "::".join(parts[:2]) if by_class and len(parts) > 2 else test_file
                groups.setdefault(group, {})[record["id"]] = record
    return groups


def cause_of(message: str) -> str:
    """A failure's cause: the first line of its message with numbers, addresses and long quotes blanked."""
    first = (message or "no message").strip().splitlines()[0] if (message or "").strip() else "no message"
    first = re.sub(r"0x[0-9a-fA-F]+", "ADDRESS", first)
    first = re.sub(r"(?<![A-Za-z_])\d+(\.\d+)?(e[-+]?\d+)?", "N", first)
    first = re.sub(r"'[^']{60,}'", "'…'", first)
    return first[:160]


def _test_seconds(records: dict[str, dict]) -> int:
    """The time the file's tests took (a file cut by --file-timeout: only those that finished)."""
    return round(sum(r["seconds"] for test_id, r in records.items() if "::" in test_id))


def _counts(records: dict[str, dict]) -> collections.Counter:
    return collections.Counter("failed" if r["outcome"] == "error" else r["outcome"] for r in records.values())


_HEADER = (
    "file",
    "cpu run",
    "cpu pass",
    "cpu fail",
    "cpu skip",
    "tpu run",
    "tpu pass",
    "tpu fail",
    "tpu skip",
    "cpu-passing that pass on tpu",
    "cpu s",
    "tpu s",
)


def _compare(test_file, c, t, found):
    """The file's row of the table; appends its tests to `found`'s lists (regressions, tpu_only_fail,
    fixed, tpu_only, both)."""
    cc, tc = _counts(c), _counts(t)
    lost = [i for i, r in c.items() if r["outcome"] == "passed" and t.get(i, {}).get("outcome") != "passed"]
    missing = {"outcome": "missing", "message": "not run on tpu (timeout or crash)"}
    found["regressions"] += [(i, t.get(i, missing)) for i in lost]
    cpu_skipped = lambda i: c.get(i, {}).get("outcome", "skipped") == "skipped"  # (or absent)
    found["tpu_only_fail"] += [(i, r) for i, r in t.items() if r["outcome"] in ("failed", "error") and cpu_skipped(i)]
    found["tpu_only"] += [r["outcome"] for i, r in t.items() if r["outcome"] != "skipped" and cpu_skipped(i)]
    found["fixed"] += [i for i, r in t.items() if r["outcome"] == "passed" and c.get(i, {}).get("outcome") == "failed"]
    found["both"] += [
        (i, r)
        for i, r in c.items()
        if r["outcome"] in ("failed", "error") and t.get(i, {}).get("outcome") in ("failed", "error")
    ]
    passing = sum(r["outcome"] == "passed" for r in c.values())
    return (
        test_file,
        len(c),
        cc["passed"],
        cc["failed"],
        cc["skipped"],
        len(t),
        tc["passed"],
        tc["failed"],
        tc["skipped"],
        f"{passing - len(lost)}/{passing}",
        _test_seconds(c),
        _test_seconds(t),
    )


def report(args) -> int:
    out = pathlib.Path(args.out)
    by_class = getattr(args, "by_class", False)
    cpu, tpu = _load(out, "cpu", by_class), _load(out, "tpu", by_class)
    found = {name: [] for name in ("regressions", "tpu_only_fail", "fixed", "tpu_only", "both")}
    rows = [_compare(f, cpu.get(f, {}), tpu.get(f, {}), found) for f in sorted(set(cpu) | set(tpu))]
    if args.markdown:
        print("| " + " | ".join(_HEADER) + " |")
        print("|" + "---|" * len(_HEADER))
        for row in rows:
            print("| " + " | ".join(str(x) for x in row) + " |")
    else:
        for row in rows:
            print(
                f"{row[0]}: cpu {row[2]} pass {row[3]} fail {row[4]} skip; tpu {row[6]} pass {row[7]} fail "
                f"{row[8]} skip; cpu-passing tests passing on tpu {row[9]}; test time cpu {row[10]} s, tpu {row[11]} s"
            )
    totals = [sum(r[i] for r in rows) for i in range(1, 9)]
    tpu_only = found["tpu_only"]
    print(
        f"\ntotal: cpu {totals[1]} pass / {totals[2]} fail / {totals[3]} skip; tpu {totals[5]} pass / "
        f"{totals[6]} fail / {totals[7]} skip; {totals[1] - len(found['regressions'])} of {totals[1]} cpu-passing "
        f"tests pass on tpu; {len(found['fixed'])} fail on cpu and pass on tpu; {len(tpu_only)} run on tpu only "
        f"(skipped or absent on cpu: accelerator-only tests), {tpu_only.count('passed')} of them pass"
    )
    for title, failures in (
        ("cpu-passing tests that fail on tpu, by cause", found["regressions"]),
        ("tests run on tpu only (skipped on cpu) that fail, by cause", found["tpu_only_fail"]),
        ("tests that fail on both devices (cpu's cause), by cause", found["both"]),
    ):
        if not failures:
            continue
        groups = collections.defaultdict(list)
        for test_id, record in failures:
            groups[cause_of(record.get("message", ""))].append(test_id)
        print(f"\n{title}:")
        for cause, ids in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            print(f"  [{len(ids)}] {cause}")
            for test_id in ids:
                print(f"      {test_id}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run test files of a checkout on cpu and tpu, then report")
    p.add_argument("checkout", help="a Transformers source checkout (the folder that holds tests/)")
    p.add_argument("paths", nargs="+", help="test files or folders, relative to the checkout")
    p.add_argument("--out", default="transformers_test_runs", help="where the per-test results go")
    p.add_argument("--devices", default="cpu,tpu")
    p.add_argument("-k", default=None, help="pytest -k expression, for every file")
    p.add_argument("--test-timeout", type=float, default=300, help="seconds per test (0: none)")
    p.add_argument("--file-timeout", type=float, default=1800, help="seconds per test file and device")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--by-class", action="store_true", help="one report row per test class instead of per file")
    r = sub.add_parser("report", help="compare the results of a run")
    r.add_argument("out")
    r.add_argument("--markdown", action="store_true")
    r.add_argument("--by-class", action="store_true", help="one report row per test class instead of per file")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []  # after --: more pytest arguments (-x, ...)
    args = parser.parse_args(argv[: len(argv) - len(extra) - (1 if "--" in argv else 0)])
    if args.command == "run":
        args.pytest_args = extra
        return run(args)
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
