"""The optional C++ extension (csrc/): built at run time, loaded with ctypes.

Two things PyTorch only reads from C++ need it:
- the device guard (csrc/tpu_guard.cpp). PyTorch's Python-level PrivateUse1 guard reports one device
  and index 0 to C++, so the autograd engine has one "tpu" queue and backward on tpu:1 fails its
  INTERNAL ASSERT;
- device-generic events and stream synchronization: `torch.Event(device="tpu")` and
  `torch.Stream(device="tpu")` call the device guard's event functions, which ask the runtime
  (set_event_callbacks; eager/device_module.py answers);
- the PrivateUse1 hooks with a generator (csrc/tpu_hooks.cpp): `torch.Generator("tpu")` and
  `torch.tpu.default_generators` need `getNewGenerator`/`getDefaultGenerator`, which the Python hooks
  object does not forward; the same hooks resize tpu storages (`resizePrivateUse1Bytes`). PyTorch
  accepts one hooks object per process, so the C++ one must be registered at `import torch`, before
  the Python one would be (registration.py).

It is compiled here, not at `pip install`: building at install time would need torch in pip's
isolated build environment (a multi-GB download) and a compiler on every machine. Instead:

- the sources are compiled once against the installed torch's headers (plain `c++`, no ninja, no
  pybind11; about 3.5 s of CPU with -O1) into
  ~/.cache/torchtpu/native (next to TORCHTPU_COMPILE_CACHE_DIR when that is set), keyed by torch
  version, ABI flag and source hash, and loaded with ctypes in milliseconds;
- TORCHTPU_NATIVE=auto (default) and =on: load the cached build at import, or build it then (once per
  torch version; a file lock makes concurrent processes wait for one build). =off: never;
- without a compiler, or with TORCHTPU_NATIVE=off, everything else works: the Python hooks and guard
  are registered, `torch.tpu.default_generators` raises naming the reason, `torch.Generator("tpu")`
  raises PyTorch's own "register PrivateUse1HooksInterface ... getNewGenerator" error (nothing in
  Python can intercept it), random ops use the Python default generators, and a multi-device setup
  gets one warning saying that backward on tpu:1.. needs the C++ guard.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings

from .. import config
from . import platform, state

_CSRC = pathlib.Path(__file__).with_name("csrc")
_SOURCES = (_CSRC / "tpu_guard.cpp", _CSRC / "tpu_hooks.cpp")
_ABI = 2  # tpu_hooks.cpp
_GUARD_ABI = 2  # tpu_guard.cpp
_AVAILABLE_FN = ctypes.CFUNCTYPE(ctypes.c_int)
# the device guard's event callbacks (tpu_guard.cpp: Callbacks)
_EVENT_FNS = (
    ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_int),  # record
    ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64),  # query
    ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64),  # synchronize
    ctypes.CFUNCTYPE(None, ctypes.c_int64),  # destroy
    ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_int64, ctypes.c_int64),  # elapsed ms
    ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int),  # sync device
    ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int),
)  # query device
_EVENT_FAILED = (-1, -1, -1, None, float("nan"), -1, -1)  # what each returns when it raised
_event_callbacks = [None]  # the Python functions, set before or after the library loads
_callbacks = []  # ctypes callbacks handed to C++: they must live as long as the process
_hooks = [False]  # whether the C++ PrivateUse1 hooks (generators) are registered
_lock = threading.Lock()
_lib = [None]
_tried_build = [False]
_problem = [None]
_warned = [False]


def _cache_dir() -> pathlib.Path:
    base = config.get("TORCHTPU_COMPILE_CACHE_DIR")
    root = pathlib.Path(base).parent if base else pathlib.Path.home() / ".cache" / "torchtpu"
    return root / "native"


# C++17, every warning of ours shown (torch's and Python's headers are system headers: theirs are not)
_FLAGS = ("-std=c++17", "-Wall", "-Wextra")


def _target(sources=_SOURCES, stem="tpu_native", python=False, flags=()) -> pathlib.Path:
    import torch

    key = hashlib.sha256(
        b"".join(p.read_bytes() for p in sources)
        + " ".join((*_FLAGS, *flags)).encode()
        + torch.__version__.encode()
        + str(torch._C._GLIBCXX_USE_CXX11_ABI).encode()
        + (sys.version.encode() if python else b"")
    ).hexdigest()[:16]
    return _cache_dir() / f"{stem}-{key}.so"


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build(sources=_SOURCES, stem="tpu_native", python=False, unity=False, flags=()) -> pathlib.Path:
    """Compile the extension (or, given `sources` and `stem`, another library of torchtpu's C++
    sources; `python`: one that includes Python's and torch's Python headers and links
    libtorch_python) into the cache (atomically, under a file lock: concurrent processes wait for
    one build). Headers among `sources` only key the cache. `unity`: the .cpp files compile as one
    translation unit, torch's headers parsed once (each parse costs ~10 s of CPU). `flags`: more
    compiler flags (another library's headers: they key the cache too)."""
    import torch

    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (install g++ or set CXX)")
    root = pathlib.Path(torch.__file__).parent
    target = _target(sources, stem, python, flags)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process built it while this one waited
            return target
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        compiled = [str(p) for p in sources if p.suffix == ".cpp"]
        if unity and len(compiled) > 1:
            fd, unit = tempfile.mkstemp(suffix=".cpp", dir=target.parent)
            with os.fdopen(fd, "w") as f:
                f.write("".join(f'#include "{p}"\n' for p in compiled))
            compiled = [unit]
        extra_includes, extra_libs = [], []
        if python:
            extra_includes = [
                f"-isystem{sysconfig.get_paths()['include']}",
                f"-isystem{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
            ]
            extra_libs = ["-ltorch", "-ltorch_python"]
        cmd = [
            cxx,
            "-O2" if python else "-O1",
            *_FLAGS,
            "-shared",
            "-fPIC",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-isystem{root / 'include'}",
            *extra_includes,
            *flags,
            *compiled,
            f"-L{root / 'lib'}",
            "-lc10",
            "-ltorch_cpu",
            *extra_libs,
            f"-Wl,-rpath,{root / 'lib'}",
            "-o",
            tmp,
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
            os.replace(tmp, target)
        finally:
            for leftover in {tmp, *compiled} - set(map(str, sources)):
                if os.path.exists(leftover):
                    os.unlink(leftover)
    return target


def _is_available() -> int:
    """torch's C++ asks the hooks whether the device is available: the platform answers."""
    try:
        return int(bool(platform.is_available()))
    except BaseException:  # noqa: BLE001 - an exception must not cross into C++
        return 0


def _load(path: pathlib.Path, device_count: int) -> None:
    lib = ctypes.CDLL(str(path))
    if lib.torchtpu_guard_abi() != _GUARD_ABI or lib.torchtpu_hooks_abi() != _ABI:
        raise RuntimeError(f"{path}: unexpected ABI version")
    lib.torchtpu_get_device.restype = ctypes.c_int
    index = state.current_device()
    callback = _AVAILABLE_FN(_is_available)
    _callbacks.append(callback)
    if lib.torchtpu_register_hooks(callback):
        _hooks[0] = True
    elif _problem[0] is None:
        _problem[0] = (
            "PyTorch's PrivateUse1 hooks were registered before the C++ extension loaded: no torch.Generator('tpu')"
        )
    lib.torchtpu_register_guard(device_count)
    lib.torchtpu_set_device(index)
    lib.torchtpu_guard_set_callbacks.argtypes = list(_EVENT_FNS)
    lib.torchtpu_guard_set_error.argtypes = [ctypes.c_char_p]
    _lib[0] = lib
    state.use_native(lib)
    if _event_callbacks[0] is not None:
        _install_event_callbacks(lib, _event_callbacks[0])
    if _storage_callbacks[0] is not None:
        _install_storage_callbacks(lib, *_storage_callbacks[0])


def set_event_callbacks(*functions) -> None:
    """The runtime's answers to the device guard's event and stream questions (record, query,
    synchronize, destroy, elapsed, synchronize device, query device: tpu_guard.cpp's Callbacks).
    An exception in one does not cross into C++: it becomes the message of the C++ error, which
    PyTorch raises as a RuntimeError."""
    _event_callbacks[0] = functions
    if _lib[0] is not None:
        _install_event_callbacks(_lib[0], functions)


def _install_event_callbacks(lib, functions) -> None:
    def guarded(fn, failed):
        def call(*args):
            try:
                return fn(*args)
            except BaseException as e:  # noqa: BLE001 - an exception must not cross into C++
                # (a Ctrl-C while waiting cannot leave as a KeyboardInterrupt: a ctypes callback
                # swallows any exception, and one signalled again lands inside the callback)
                message = (
                    "KeyboardInterrupt: interrupted while waiting for the device"
                    if isinstance(e, KeyboardInterrupt)
                    else str(e)
                    if isinstance(e, RuntimeError)
                    else f"{type(e).__name__}: {e}"
                )
                lib.torchtpu_guard_set_error(message.encode("utf-8", "replace"))
                return failed

        return call

    pointers = [kind(guarded(fn, failed)) for kind, fn, failed in zip(_EVENT_FNS, functions, _EVENT_FAILED)]
    _callbacks.extend(pointers)
    lib.torchtpu_guard_set_callbacks(*pointers)
    # events destroyed while the interpreter shuts down must not call into it
    atexit.register(lambda: lib.torchtpu_guard_set_callbacks(*(kind() for kind in _EVENT_FNS)))  # NULLs


_STORAGE_FNS = (
    ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int64)),  # allocate
    ctypes.CFUNCTYPE(None, ctypes.c_uint64),  # free
    ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64),  # resize
)
_storage_callbacks = [None]


def set_storage_callbacks(allocate, free, resize) -> None:
    """The storage layer's answers to PyTorch's PrivateUse1 allocator and storage resize hook
    (tpu_hooks.cpp), which make the storages PyTorch creates itself (`torch.UntypedStorage(n,
    device="tpu")`) and resize any tpu storage: allocate(nbytes) -> (address, device index),
    free(address), resize(address, nbytes) -> new address. Without the extension PyTorch has no
    allocator for "tpu" and a storage's resize_ raises PyTorch's NotImplementedError."""
    _storage_callbacks[0] = (allocate, free, resize)
    if _lib[0] is not None:
        _install_storage_callbacks(_lib[0], allocate, free, resize)


def _install_storage_callbacks(lib, allocate, free, resize) -> None:
    def on_allocate(nbytes, index_out):
        try:
            address, index = allocate(nbytes)
        except BaseException:  # noqa: BLE001 - an exception must not cross into C++ (0: PyTorch raises)
            return 0
        index_out[0] = index
        return address

    def on_free(address):
        try:
            free(address)
        except BaseException:  # noqa: BLE001, S110 - nothing can be raised from a storage's deleter
            pass

    def on_resize(address, nbytes):
        try:
            return resize(address, nbytes)
        except BaseException as e:  # noqa: BLE001 - an exception must not cross into C++: its message does
            message = str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}"
            lib.torchtpu_set_storage_error(message.encode("utf-8", "replace"))
            return 0

    pointers = [kind(fn) for kind, fn in zip(_STORAGE_FNS, (on_allocate, on_free, on_resize))]
    _callbacks.extend(pointers)
    lib.torchtpu_set_storage_error.argtypes = [ctypes.c_char_p]
    lib.torchtpu_set_storage_callbacks(*pointers)
    # storages freed while the interpreter shuts down must not call into it
    atexit.register(lambda: lib.torchtpu_set_storage_callbacks(*(kind() for kind in _STORAGE_FNS)))


def loaded() -> bool:
    return _lib[0] is not None


def problem() -> str | None:
    """Why the C++ extension (or its generator hooks) is not in use; None when it is."""
    return _problem[0]


def generators_available() -> bool:
    """Whether `torch.Generator("tpu")` works: the C++ hooks are registered."""
    return _hooks[0]


def resizes_storages() -> bool:
    """Whether `UntypedStorage.resize_` works on tpu storages: the C++ hooks are registered."""
    return _hooks[0]


def new_default_generator(index: int):
    """A Python `torch.Generator` over the C++ default generator of tpu:index (the one PyTorch's
    `getDefaultGenerator` returns), or an error naming why there is none."""
    import torch

    if not _hooks[0]:
        raise RuntimeError(
            "torch.Generator('tpu') and torch.tpu.default_generators need torchtpu's C++ extension, "
            f"which is not loaded: {_problem[0] or 'TORCHTPU_NATIVE=off'}. Install a C++ compiler "
            "(g++, or set CXX) and run `python -m torchtpu info`; random ops still work with the "
            "default seed (torch.manual_seed) or a CPU torch.Generator passed as generator=."
        )
    lib = _lib[0]
    lib.torchtpu_next_new_is_default(1)
    try:
        return torch.Generator(f"tpu:{index}")
    finally:
        lib.torchtpu_next_new_is_default(0)


def at_import() -> None:
    """Called by `import torch` (through registration.install): cheap unless a build is needed."""
    platform.when_ready(at_platform_ready)
    policy = config.get("TORCHTPU_NATIVE")
    if policy == "off":
        return
    if not all(p.exists() for p in _SOURCES):
        _problem[0] = "the C++ sources are not part of this installation"
        return
    configured = config.get("TORCHTPU_NUM_DEVICES") or 0
    try:
        # Until the platform is up the device count is unknown: an upper bound (the engine starts
        # one idle thread per counted device); set exactly by at_platform_ready.
        _build_and_load(configured or 8)
    except Exception as e:  # noqa: BLE001 -- never break `import torch`
        _problem[0] = f"{type(e).__name__}: {e}"
        # without a compiler this is the documented degradation (quiet under auto); a compiler that
        # failed, or a library that would not load, is a problem worth one line
        if policy == "on" or compiler() is not None:
            warnings.warn(
                f"torchtpu: the C++ extension failed ({_problem[0]}): no torch.Generator('tpu'), "
                "no backward on tpu:1 and above. TORCHTPU_NATIVE=off stops trying.",
                RuntimeWarning,
                stacklevel=2,
            )


def _build_and_load(device_count: int) -> None:
    with _lock:
        if _lib[0] is not None or _tried_build[0]:
            return
        _tried_build[0] = True
        target = _target()
        if not target.exists():
            build()
        _load(target, device_count)


def at_platform_ready(device_count: int) -> None:
    """Called once the XLA devices are known (platform.when_ready): the exact count; a build if
    several devices need it."""
    if _lib[0] is not None:
        _lib[0].torchtpu_set_device_count(device_count)
        return
    if device_count <= 1 or config.get("TORCHTPU_NATIVE") == "off":
        return
    try:
        _build_and_load(device_count)
    except Exception as e:  # noqa: BLE001 -- degrade: everything but multi-device backward works
        _problem[0] = f"{type(e).__name__}: {e}"
    if _lib[0] is None and not _warned[0]:
        _warned[0] = True
        warnings.warn(
            f"torchtpu: {device_count} tpu devices but no C++ device guard "
            f"({_problem[0] or 'TORCHTPU_NATIVE=off'}); backward on tpu:1 and above will fail. "
            "Install a C++ compiler (g++) and run `python -m torchtpu info`.",
            RuntimeWarning,
            stacklevel=3,
        )
