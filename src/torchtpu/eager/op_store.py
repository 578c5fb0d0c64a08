"""The op-key cache: eager executables on disk under a key known before tracing.

JAX's on-disk cache (eager/persistent_cache.py) is keyed by the lowered program, so a first call in a
new process traces the lowering and lowers it to StableHLO (~80% of a warm first call's time) before
it can even look. This store sits beside it: each eager executable is kept under a hash of what
determines its program before the trace (the engine's in-memory key, which names the op, its
argument layouts, dtypes and static values; the executable's role and jit arguments; the arguments'
avals and shardings; the compiler options; the global settings a lowering may read; the platform;
the torchtpu variables its sources name and JAX's and XLA's environment; the versions of jax,
jaxlib, torch, numpy, Python and a hash of torchtpu's sources), with what its
trace left behind (device-side check messages, whether it read the default dtype or the matmul
precision). A new process loads the executable (jax.experimental.serialize_executable) and skips
tracing, lowering and JAX's cache.

Safety: a key holds only values whose text identifies them (anything else keeps the op off the
store); each file carries its full key text and a checksum, is written to a temporary name and
renamed (two processes writing one entry both leave a whole file), and any error reading or loading
one drops it and takes the normal path. An executable JAX loaded from its own cache cannot be
serialized again on XLA:CPU (the copy fails at run time: "Function ... not found"), so a program
stored here is compiled afresh, past JAX's cache (integrations/patches.py: the bypass). Ops that
write a tensor are left out: their executables run inside engine.call_and_commit, which lets no
Python code run between the call and the records taking its results (a Ctrl-C there would lose a
donated buffer), and the store's callable is Python (build._Stored). The store is
off with TORCHTPU_COMPILE_CACHE=0 (no cache directory) and under the TPU compile check, which must
check every program. Size: at most MAX_BYTES, least recently used entries removed first.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import pickle
import re
import sys
import threading
import time
from enum import Enum

import jax
import numpy as np
import torch
from jax._src.array import ArrayImpl

from ..metrics import counters
from . import interrupts, persistent_cache, tpu_check

SUBDIR = "torchtpu-ops"  # inside the on-disk cache's directory (JAX's cache does not look in folders)
SUFFIX = ".xop"
MAGIC = b"torchtpu-op-v1\n"
MAX_BYTES = 1 << 30  # the store's size limit; eviction takes it down to EVICT_TO of it
EVICT_TO = 0.8
STALE_TMP_S = 3600  # a temporary file this old was left by a process that died while writing

_local = threading.local()
_lock = threading.Lock()
_state = {"process": None, "total": None}
# set by integrations/patches.py once JAX's cache can be bypassed for one compile: without it no
# program is written (a program JAX loaded from its cache cannot be serialized again)
BYPASS_INSTALLED = [False]


class Unkeyable(Exception):
    """A value whose text does not identify it: the op takes the normal path."""


# ---------------------------------------------------------------- where
def directory():
    """The store's directory, or None when it is off."""
    base = persistent_cache.cache_dir()
    if base is None or tpu_check.enabled():
        return None
    return os.path.join(base, SUBDIR)


@contextlib.contextmanager
def fresh_compile():
    """In this block (this thread) JAX compiles without its on-disk cache (integrations/patches.py)."""
    outer = getattr(_local, "fresh", False)
    _local.fresh = True
    try:
        yield
    finally:
        _local.fresh = outer


def compiling_fresh() -> bool:
    return getattr(_local, "fresh", False)


# ---------------------------------------------------------------- the key
_PLAIN = (type(None), bool, int, str, bytes, torch.dtype, torch.layout, torch.memory_format, torch.device, np.dtype)


def text(x) -> str:
    """A text that identifies `x` (no two different keyable values share one), else Unkeyable."""
    t = type(x)
    if t is float:
        return "f" + x.hex()
    if t is complex:
        return f"c({x.real.hex()},{x.imag.hex()})"
    if t in (tuple, list, torch.Size):
        return t.__name__ + "(" + ",".join(map(text, x)) + ")"
    if t is dict:
        return "dict(" + ",".join(text(k) + ":" + text(v) for k, v in sorted(x.items(), key=repr)) + ")"
    if t in (frozenset, set):
        return t.__name__ + "(" + ",".join(sorted(map(text, x))) + ")"
    if t is type:
        if x.__module__ == "builtins":
            return "type:" + x.__qualname__
        raise Unkeyable(x)
    if t in _PLAIN or isinstance(x, Enum):
        r = repr(x)
        if " at 0x" not in r:
            return (t.__name__ + ":" + r) if isinstance(x, Enum) else r
    if isinstance(x, jax.sharding.Sharding):
        r = repr(x)
        if " at 0x" not in r:
            return r
    if isinstance(x, np.generic):
        return f"np:{x.dtype.str}:{x!r}"
    if t.__name__ == "AxisEnv":  # (in JAX's trace context: an object per set of bound axes)
        return "AxisEnv(" + ",".join(text(getattr(x, s, None)) for s in x.__slots__ if s != "__weakref__") + ")"
    if hasattr(x, "items") and t.__name__ == "FrozenDict":
        return "frozendict" + text(dict(x.items()))[4:]
    raise Unkeyable(x)


def signature(dyn) -> str:
    """What JAX keys an executable's arguments by: each array's aval, sharding and commitment, each
    Python number's type, each NumPy value's dtype and shape (so a hit is never called with others)."""
    parts = []
    for a in dyn:
        t = type(a)
        if t is ArrayImpl:
            parts.append(f"A({a.dtype.str},{a.shape},{a.weak_type},{a.sharding!r},{a.committed})")
        elif t in (bool, int, float, complex):
            parts.append(t.__name__)
        elif t is np.ndarray or isinstance(a, np.generic):
            parts.append(f"N({a.dtype.str},{a.shape})")
        elif t is tuple or t is list:
            parts.append(t.__name__ + "[" + signature(a) + "]")
        else:
            raise Unkeyable(a)
    return ";".join(parts)


# environment variables named in torchtpu's sources that cannot change a program (paths of outputs)
_ENV_NOT_KEYED = (
    b"TORCHTPU_COMPILE_CACHE_DIR",
    b"TORCH_TPU_TIER2_COMPILATION_CACHE",
    b"TORCHTPU_TPU_COMPILE_CHECK_LOG",
)


def _sources():
    """A hash of torchtpu's sources (Python and the native fast path's C++), and the TORCHTPU_ (and
    TORCH_TPU_) environment variables they name: those key the store, not every variable of the
    prefix (tools/transformers_tests.py's per-run results path made every run miss)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    h = hashlib.blake2b(digest_size=16)
    names = set()
    for p in sorted(root.rglob("*")):
        if p.suffix in (".py", ".c", ".cc", ".cpp", ".h") and p.is_file():
            data = p.read_bytes()
            h.update(str(p.relative_to(root)).encode() + b"\0")
            h.update(data)
            names.update(re.findall(rb"\bTORCH_?TPU_[A-Z0-9_]+", data))
    return h.hexdigest(), {n.decode() for n in names if n not in _ENV_NOT_KEYED}


def _process_facts():
    """The part of every key that is fixed for the process: versions, sources, platform, environment."""
    facts = _state["process"]
    if facts is None:
        import jaxlib

        from ..device import platform

        devices = jax.devices()
        source_hash, names = _sources()
        env = sorted(
            (k, v) for k, v in os.environ.items() if k in names or k.startswith(("JAX_", "XLA_", "LIBTPU", "TPU_"))
        )
        facts = _state["process"] = "\n".join(
            (
                f"torchtpu {source_hash}",
                f"jax {jax.__version__} jaxlib {jaxlib.__version__} torch {torch.__version__}",
                f"numpy {np.__version__} python {sys.version}",
                f"platform {platform.platform()} {platform.lowering_platform()} {devices[0].client.platform}",
                f"{devices[0].client.platform_version} {[(d.id, d.device_kind) for d in devices]}",
                f"processes {jax.process_count()} {jax.process_index()}",
                f"env {env!r}",
            )
        )
    return facts


def _call_facts():
    """The global settings a lowering may read, as they are at this first call."""
    from jax._src import config as jax_config

    from ..ops.linalg import matmul_precision
    from .modes import _mode

    return "\n".join(
        (
            f"default dtype {torch.get_default_dtype()} precision {matmul_precision()}",
            f"deterministic {torch.are_deterministic_algorithms_enabled()} "
            f"{torch.is_deterministic_algorithms_warn_only_enabled()} mode {_mode[0]}",
            f"x64 {jax.config.jax_enable_x64} trace {text(jax_config.trace_context())}",
        )
    )


def key(ident, dyn):
    """(digest, key text, argument signature) of an executable with identity `ident` (the caller's
    static facts) called with `dyn`, or None when something in them has no identifying text."""
    try:
        sig = signature(dyn)
        body = "\n".join((text(ident), sig, _call_facts(), _process_facts()))
    except Unkeyable:
        return None
    return hashlib.blake2b(body.encode(), digest_size=20).hexdigest(), body, sig


def shared_name(store, entry, role):
    """The store's name (build.op_jit's `store`) for a program shared by many entries (a size
    bucket's, a dense form's) that `entry` builds, or None where `store`, the name of the entry's own
    program ((kernel, identity) or None), is None: the shared program is a function of what the
    entry's identity names and `role`, so a process that builds the same entries loads it untraced."""
    if store is None:
        return None
    kernel, ident = store
    return kernel, (*ident, role), entry


# ---------------------------------------------------------------- read and write
def _path(digest):
    where = directory()
    return None if where is None else os.path.join(where, digest + SUFFIX)


def _initialize_lapack():
    """Give jaxlib's LAPACK kernels their function pointers (taken from SciPy) before a program that
    calls them runs. JAX does it when it lowers a decomposition, which a program loaded here skips:
    run uninitialized, XLA:CPU's LAPACK custom call (a QR's geqrf, ...) segfaults the process. JAX's
    own deserialization (jax.export) does the same; 0.2 s of CPU once, so only for such programs."""
    if not _lapack_ready:
        from jax._src.lax import linalg  # jax 0.10: initialize_lapack() is not public

        linalg.initialize_lapack()
        _lapack_ready.append(True)


_lapack_ready = []


def load(k):
    """(jax.stages.Compiled, effects) stored under key `k`, or None. A file that cannot be read,
    checked or loaded is removed (the caller then builds the program as usual)."""
    path = _path(k[0])
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not an op-key cache entry")
        digest, payload = data[len(MAGIC) : len(MAGIC) + 32], data[len(MAGIC) + 32 :]
        if hashlib.blake2b(payload, digest_size=32).digest() != digest:
            raise ValueError("checksum mismatch")
        body, serialized, in_tree, out_tree, device_ids, effects = pickle.loads(payload)
        if body != k[1]:
            raise ValueError("another key")
        from jax.experimental.serialize_executable import deserialize_and_load

        if b"lapack_" in serialized:
            _initialize_lapack()
        by_id = {d.id: d for d in jax.local_devices()}
        devices = [by_id[i] for i in device_ids]  # (the devices it was compiled for, in its order)
        compiled = deserialize_and_load(serialized, in_tree, out_tree, execution_devices=devices)
    except Exception as e:  # any damaged entry: dropped, and the op is built as usual
        if interrupts.from_signal(e):  # not damage: the entry stays
            raise
        counters.op_store_errors += 1
        with contextlib.suppress(OSError):
            os.remove(path)
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # (least recently used goes first)
    return compiled, effects


def save(k, compiled, effects):
    """Store `compiled` (compiled afresh: fresh_compile) under key `k`; False when it could not be."""
    path = _path(k[0])
    if path is None or not BYPASS_INSTALLED[0]:
        return False
    try:
        from jax.experimental.serialize_executable import serialize

        serialized, in_tree, out_tree = serialize(compiled)
        device_ids = [d.id for d in compiled.runtime_executable().local_devices()]
        payload = pickle.dumps(
            (k[1], serialized, in_tree, out_tree, device_ids, effects), protocol=pickle.HIGHEST_PROTOCOL
        )
        data = MAGIC + hashlib.blake2b(payload, digest_size=32).digest() + payload
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # atomic: a reader sees the old file, the new one, or none
    except Exception as e:  # not stored (an unwritable directory, a program JAX cannot serialize)
        if interrupts.from_signal(e):
            with contextlib.suppress(OSError, UnboundLocalError):
                os.remove(tmp)
            raise
        counters.op_store_errors += 1
        with contextlib.suppress(OSError, UnboundLocalError):
            os.remove(tmp)
        return False
    counters.op_store_writes += 1
    _grew(os.path.dirname(path), len(data))
    return True


def _grew(where, nbytes):
    with _lock:
        total = _state["total"]
        if total is None:
            total = _scan_total(where)
        else:
            total += nbytes
        if total > MAX_BYTES:
            total = evict(where, int(MAX_BYTES * EVICT_TO))
        _state["total"] = total


def _entries(where):
    found = []
    now = time.time()
    with os.scandir(where) as it:
        for e in it:
            try:
                st = e.stat()
            except OSError:
                continue
            if e.name.endswith(SUFFIX):
                found.append((st.st_mtime, st.st_size, e.path))
            elif e.name.endswith(".tmp") and now - st.st_mtime > STALE_TMP_S:
                with contextlib.suppress(OSError):
                    os.remove(e.path)
    return found


def _scan_total(where):
    return sum(size for _, size, _ in _entries(where))


def evict(where, limit):
    """Remove the least recently used entries of `where` until at most `limit` bytes remain; the bytes left."""
    found = sorted(_entries(where))
    total = sum(size for _, size, _ in found)
    for _, size, path in found:
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            os.remove(path)
            total -= size
    return total
