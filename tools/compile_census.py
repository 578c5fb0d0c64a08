"""A pytest plugin that counts the XLA compiles of each test and says which op made them.

    TORCHTPU_COMPILE_CACHE=0 CENSUS_OUT=/tmp/census.jsonl python tools/transformers_tests.py run \
        /tmp/transformers-src tests/models/mixtral/test_modeling_mixtral.py --devices tpu --out /tmp/x \
        -k EXPR -- -p compile_census          # (tools/upstream_tests.py takes `-- -p compile_census` too)
    python tools/compile_census.py /tmp/census.jsonl [TEST-SUBSTRING]   # per op: compiles, seconds

One JSON line per test: its wall and process CPU time, JAX's compile events (trace, lowering, XLA
compile: counts and seconds), each XLA compile as [op, its eager cache key or the stack that made it,
seconds, JAX's log line], and `dups`: compiles of an HLO text this process had compiled before (one
program under two keys). Turn the on-disk cache off to see what a cold process compiles.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import sys
import threading
import time
import traceback

import pytest

_events: collections.Counter = collections.Counter()
_compiles: list = []
_dups: list = []
_seen_hlo: dict = {}
_ctx = threading.local()


def _current():
    return getattr(_ctx, "op", None)


def _where():
    op = _current()
    if op is not None:
        return op
    frames = [f for f in traceback.extract_stack()[-14:-3] if "jax/_src" not in f.filename]
    stack = " < ".join(f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in reversed(frames))
    return ("?" + threading.current_thread().name, stack)


def _listener(event, duration, **_):
    _events[event + ":n"] += 1
    _events[event + ":s"] += duration
    if event == "/jax/core/compile/backend_compile_duration":
        op, key = _where()
        _compiles.append([op, key, duration, getattr(_ctx, "log", "")])


class _LogLine(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Compiling "):
            _ctx.log = message[10:300]


def _wrap_first_calls():
    from torchtpu.eager import engine

    real = engine.OpKernel._first_call

    def first_call(self, key, *args, **kwargs):
        outer = _current()
        _ctx.op = (self.name, repr(key)[:600])
        try:
            return real(self, key, *args, **kwargs)
        finally:
            _ctx.op = outer

    engine.OpKernel._first_call = first_call


def _wrap_compiler():
    from jax._src import compiler

    real = compiler.compile_or_get_cached

    def compile_or_get_cached(backend, computation, *args, **kwargs):
        digest = hashlib.sha1(computation.operation.get_asm(enable_debug_info=False).encode()).hexdigest()
        op = (_current() or ("?",))[0]
        if digest in _seen_hlo:
            _dups.append([op, _seen_hlo[digest]])
        else:
            _seen_hlo[digest] = op
        return real(backend, computation, *args, **kwargs)

    compiler.compile_or_get_cached = compile_or_get_cached


def pytest_configure(config):
    import jax

    jax.monitoring.register_event_duration_secs_listener(_listener)
    jax.config.update("jax_log_compiles", True)
    logging.getLogger("jax._src.interpreters.pxla").addHandler(_LogLine())
    logging.getLogger("jax").propagate = False  # (the compile log lines, not on the console)
    _wrap_compiler()
    _wrap_first_calls()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _events.clear()
    _compiles.clear()
    _dups.clear()
    wall, cpu = time.time(), time.process_time()
    yield
    record = {
        "test": item.nodeid,
        "wall": time.time() - wall,
        "cpu": time.process_time() - cpu,
        "events": dict(_events),
        "compiles": list(_compiles),
        "dups": list(_dups),
    }
    with open(os.environ["CENSUS_OUT"], "a") as f:
        f.write(json.dumps(record) + "\n")


def _report(path, which=""):
    for line in open(path):
        test = json.loads(line)
        if which not in test["test"]:
            continue
        compiles = test["compiles"]
        seconds, dups = sum(c[2] for c in compiles), len(test["dups"])
        print(f"{test['test']}: cpu {test['cpu']:.1f} s, {len(compiles)} compiles ({seconds:.1f} s), dups {dups}")
        count, spent = collections.Counter(), collections.Counter()
        for op, key, duration, _ in compiles:
            name = op if not op.startswith("?") else f"{op} {key[:80]}"
            count[name] += 1
            spent[name] += duration
        for name, n in count.most_common(20):
            print(f"  {n:4d} {spent[name]:7.2f} s  {name}")


if __name__ == "__main__":
    _report(*sys.argv[1:])
