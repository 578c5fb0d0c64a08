import os

# Two virtual XLA:CPU devices, so tpu:1 is testable on any machine (read when torch loads the backend).
os.environ.setdefault("TORCHTPU_NUM_DEVICES", "2")


import sys

import pytest

# Memory one pytest-xdist worker of the default run may need at its peak (torch, JAX, XLA:CPU's
# compiled executables, the tiny Hugging Face models, the 2-4 rank children of the distributed
# tests): measured 2026-12-04, two workers took 9.7 GB together, the largest process 5.7 GB.
_WORKER_PEAK_BYTES = 6 << 30


def _available_memory_bytes():
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _owns_an_accelerator():
    """Whether "tpu" will run on TPU chips or a GPU: one process holds a TPU's chips (libtpu locks
    them) and JAX takes most of a GPU's memory, so parallel workers would fail to start or share."""
    import glob

    platform = os.environ.get("TORCHTPU_PLATFORM", "").lower()
    if platform in ("tpu", "gpu", "cuda"):
        return True
    # the default platform is TPU whenever JAX sees one: TPU VMs expose their chips as these nodes
    return not platform and bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per CPU core this process may run on (xdist's own default counts
    physical cores where psutil is installed: one on a 2-vCPU VM), fewer where memory would not
    hold them all; one where the tests run on TPU chips or a GPU. PYTEST_XDIST_AUTO_NUM_WORKERS
    still decides when set (xdist reads it)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    if _owns_an_accelerator():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    memory = _available_memory_bytes()
    fit = cores if memory is None else max(1, memory // _WORKER_PEAK_BYTES)
    return max(1, min(cores, fit))


@pytest.fixture(autouse=True)
def _seeded(request):
    """Each test draws its random inputs from a seed of its own id, as PyTorch's suite seeds every
    test: the inputs do not depend on which tests ran before it in the same process (pytest-xdist
    hands tests to workers in a different order each run), so a failure reproduces alone."""
    import random
    import zlib

    import torch

    seed = zlib.crc32(request.node.nodeid.encode())
    random.seed(seed)
    torch.manual_seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles its own modules: forget earlier ones, as PyTorch's own suite does, so
    Dynamo's per-code-object recompile limit (8) counts one test's recompilations only."""
    yield
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()
    # a test that queued a bad index without reading back must not fail the next test's first sync
    asserts = sys.modules.get("torchtpu.eager.asserts")
    if asserts is not None:
        asserts.discard()


# ------------------------------------------------------------------ parity with the CPU
# The one helper the op tests compare a tpu result with PyTorch's CPU through (`from conftest import
# assert_matches_cpu`); files that compare the same way everywhere bind their tolerances to it once.
def _results(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def assert_close_to_cpu(actual, expected, tol_for=None, **close):
    """Each tpu result in `actual` (a tensor or a tuple/list of them) is on tpu and equal to the CPU's
    in `expected`: same dtype, then torch.testing.assert_close with `close` (shape, values), or with
    `tol_for(dtype)`, the tolerances for the CPU result's dtype."""
    import torch

    actual, expected = _results(actual), _results(expected)
    assert len(actual) == len(expected), (len(actual), len(expected))
    for a, e in zip(actual, expected):
        assert a.device.type == "tpu", a.device
        assert a.dtype == e.dtype, (a.dtype, e.dtype)
        torch.testing.assert_close(a.cpu(), e, **close, **(tol_for(e.dtype) if tol_for else {}))


def assert_matches_cpu(fn, *inputs, tol_for=None, **close):
    """fn on the CPU inputs and on tpu copies of them (other arguments as they are) agree, as
    assert_close_to_cpu says. Returns the tpu result."""
    import torch

    expected = fn(*inputs)
    actual = fn(*[x.to("tpu") if isinstance(x, torch.Tensor) else x for x in inputs])
    assert_close_to_cpu(actual, expected, tol_for, **close)
    return actual


_xla_compiles = [0]


def _count_xla_compile(event, duration, **_):
    if event == "/jax/core/compile/backend_compile_duration":
        _xla_compiles[0] += 1


@pytest.fixture
def xla_compiles():
    """A function giving the XLA compiles (JAX's compile events) since the test began."""
    import jax.monitoring

    if not getattr(_count_xla_compile, "registered", False):  # (JAX keeps a listener for good: one)
        jax.monitoring.register_event_duration_secs_listener(_count_xla_compile)
        _count_xla_compile.registered = True
    start = _xla_compiles[0]
    return lambda: _xla_compiles[0] - start
