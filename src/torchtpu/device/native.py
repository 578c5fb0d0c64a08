"""The optional C++ device guard (csrc/tpu_guard.cpp): built at run time, loaded with ctypes.

PyTorch's Python-level PrivateUse1 guard reports one device and index 0 to C++, so the autograd
engine has one "tpu" queue and backward on tpu:1 fails its INTERNAL ASSERT. The fix needs a C++
`DeviceGuardImplInterface`. It is compiled here, not at `pip install`: building at install time would
need torch in pip's isolated build environment (a multi-GB download) and a compiler on every
machine. Instead:

- the source is compiled once against the installed torch's c10 headers (about 2.5 s of CPU, plain
  `c++`, no ninja, no pybind11) into ~/.cache/torchtpu/native (next to TORCHTPU_COMPILE_CACHE_DIR
  when that is set), keyed by torch version and source hash, and loaded with ctypes in milliseconds;
- TORCHTPU_NATIVE=auto (default): load a cached build at import; build it when more than one device
  is configured (TORCHTPU_NUM_DEVICES > 1, or the platform finds several devices). With one device
  the Python guard is exact, so a machine without a compiler loses nothing there;
- without a compiler, or with TORCHTPU_NATIVE=off, everything else works and a multi-device setup
  gets one warning saying that backward on tpu:1.. needs the C++ guard.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
import warnings

_SOURCE = pathlib.Path(__file__).with_name("csrc") / "tpu_guard.cpp"
_ABI = 1
_lock = threading.Lock()
_lib = [None]
_tried_build = [False]
_problem = [None]
_warned = [False]


def _cache_dir() -> pathlib.Path:
    from .. import config
    base = config.get("TORCHTPU_COMPILE_CACHE_DIR")
    root = pathlib.Path(base).parent if base else pathlib.Path.home() / ".cache" / "torchtpu"
    return root / "native"


def _target() -> pathlib.Path:
    import torch
    key = hashlib.sha256(_SOURCE.read_bytes() + torch.__version__.encode()
                         + str(torch._C._GLIBCXX_USE_CXX11_ABI).encode()).hexdigest()[:16]
    return _cache_dir() / f"tpu_guard-{key}.so"


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build() -> pathlib.Path:
    """Compile the guard into the cache (atomically: concurrent processes may race)."""
    import torch
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (install g++ or set CXX)")
    root = pathlib.Path(torch.__file__).parent
    target = _target()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           f"-I{root / 'include'}", str(_SOURCE), f"-L{root / 'lib'}", "-lc10",
           f"-Wl,-rpath,{root / 'lib'}", "-o", tmp]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _load(path: pathlib.Path, device_count: int) -> None:
    lib = ctypes.CDLL(str(path))
    if lib.torchtpu_guard_abi() != _ABI:
        raise RuntimeError(f"{path}: unexpected ABI version")
    lib.torchtpu_get_device.restype = ctypes.c_int
    from . import state
    index = state.current_device()
    lib.torchtpu_register_guard(device_count)
    lib.torchtpu_set_device(index)
    _lib[0] = lib
    state.use_native(lib)


def loaded() -> bool:
    return _lib[0] is not None


def problem() -> str | None:
    """Why the C++ guard is not in use (None when it is, or was not needed yet)."""
    return _problem[0]


def at_import() -> None:
    """Called by `import torch` (through registration.install): cheap unless a build is needed."""
    from .. import config
    policy = config.get("TORCHTPU_NATIVE")
    if policy == "off" or not _SOURCE.exists():
        return
    configured = config.get("TORCHTPU_NUM_DEVICES") or 0
    try:
        target = _target()
        if target.exists():
            # Until the platform is up the device count is unknown: an upper bound (the engine
            # starts one idle thread per counted device); set exactly by at_platform_ready.
            _load(target, configured or 8)
        elif policy == "on" or configured > 1:
            _build_and_load(max(configured, 1))
    except Exception as e:  # never break `import torch`
        _problem[0] = f"{type(e).__name__}: {e}"
        if policy == "on":
            warnings.warn(f"torchtpu: TORCHTPU_NATIVE=on but the C++ device guard failed: {e}",
                          RuntimeWarning, stacklevel=2)


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
    """Called once the XLA devices are known: the exact count; a build if several devices need it."""
    from .. import config
    if _lib[0] is not None:
        _lib[0].torchtpu_set_device_count(device_count)
        return
    if device_count <= 1 or config.get("TORCHTPU_NATIVE") == "off":
        return
    try:
        _build_and_load(device_count)
    except Exception as e:  # degrade: everything but multi-device backward works
        _problem[0] = f"{type(e).__name__}: {e}"
    if _lib[0] is None and not _warned[0]:
        _warned[0] = True
        warnings.warn(
            f"torchtpu: {device_count} tpu devices but no C++ device guard "
            f"({_problem[0] or 'TORCHTPU_NATIVE=off'}); backward on tpu:1 and above will fail. "
            "Install a C++ compiler (g++) and run `python -m torchtpu info`.", RuntimeWarning, stacklevel=3)
