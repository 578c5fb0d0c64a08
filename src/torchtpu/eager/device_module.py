"""The runtime's functions behind `torch.tpu` (the public module is built in torchtpu.api, on top of
every layer): CUDA's names where we offer the same thing. They live in the runtime layer because
synchronizing, memory statistics, the generator and streams need the eager engine and storages."""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
import warnings
import weakref

import jax as _jax
import torch

from ..device import native as _native
from ..device import platform as _platform
from ..device.platform import device_count, is_available, is_initialized  # noqa: F401
from ..device.state import current_device, device_index, set_device
from ..storage.records import live_buffers as _live_buffers
from ..storage.records import stats as _stats
from . import asserts as _asserts
from . import fusion as _fusion
from . import host_copies as _host_copies
from . import random as _random


def init() -> None:
    _platform.ensure()


def _index(device=None) -> int:
    index = device_index(device)
    _platform.jax_device(index)
    return index


class device:
    """Context manager that makes `tpu:i` the current device, like `torch.cuda.device`."""

    def __init__(self, device):
        self.index = _index(device) if device is not None else None
        self.prev = None

    def __enter__(self):
        self.prev = current_device()
        if self.index is not None:
            set_device(self.index)
        return self

    def __exit__(self, *exc):
        set_device(self.prev)
        return False


def synchronize(device=None) -> None:
    """Wait for all work queued on `device` (the current one by default)."""

    index = _index(device)
    _fusion.flush_all()
    _jax.block_until_ready(_live_buffers(index, computing=True))
    _host_copies.finish(index)
    _asserts.check()


def clear_device_assert(device=None) -> None:
    """Leave the error state a failed device-side assert put `device` in (every device when None).
    CUDA cannot (its context is corrupt); here the writes that depended on the failed check were
    not committed (eager/asserts.py), so the device's tensors hold consistent values."""

    _asserts.clear_error(_index(device) if device is not None else None)


def get_device_name(device=None) -> str:
    d = _platform.jax_device(_index(device))
    return f"{d.device_kind} (XLA {d.platform}:{d.id})"


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    name: str
    platform: str
    device_kind: str
    jax_device_id: int
    total_memory: int
    multi_processor_count: int = 1  # TensorCores of a TPU chip; host cores on XLA:CPU
    major: int = 0
    minor: int = 0

    def __repr__(self):
        return (
            f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
            f"total_memory={self.total_memory // (1 << 20)}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


_warned_total_memory: set = set()  # JAX device ids already warned about


def get_device_properties(device=None) -> DeviceProperties:
    d = _platform.jax_device(_index(device))
    total, problem = 0, "no bytes_limit in its memory statistics"
    try:
        total = int((d.memory_stats() or {}).get("bytes_limit", 0))
    except (RuntimeError, NotImplementedError, AttributeError) as e:  # (JaxRuntimeError is a RuntimeError)
        problem = f"{type(e).__name__}: {e}"
    if not total:
        # XLA:CPU's device memory is the host's RAM (its memory_stats() is None): the right answer there
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if d.platform != "cpu" and d.id not in _warned_total_memory:
            _warned_total_memory.add(d.id)
            warnings.warn(
                f"torchtpu: could not read the memory size of {d} ({problem}); total_memory reports "
                "the host's RAM instead",
                RuntimeWarning,
                stacklevel=2,
            )
    cores = getattr(d, "num_cores", None) or (os.cpu_count() if d.platform == "cpu" else 1) or 1
    return DeviceProperties(get_device_name(device), d.platform, d.device_kind, d.id, total, int(cores))


def get_device_capability(device=None):
    return (0, 0)


# TorchTPU's list (autocast accepts any of them as its target dtype); bf16 is the one to use.
_AMP_DTYPES = (
    torch.bfloat16,
    torch.bool,
    torch.complex128,
    torch.complex64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.int8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.uint8,
)


def get_amp_supported_dtype():
    return list(_AMP_DTYPES)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# ------------------------------------------------------------------ random numbers
def manual_seed(seed: int) -> None:
    _random.manual_seed(seed, current_device())


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _random.manual_seed(seed, i)


def seed() -> int:
    return _random.seed(current_device())


def seed_all() -> None:
    value = _random.seed(0)
    for i in range(1, device_count()):
        _random.manual_seed(value, i)


def initial_seed() -> int:
    return _random.initial_seed(current_device())


def get_rng_state(device="tpu") -> torch.Tensor:
    return _random.get_rng_state(_index(device))


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _random.set_rng_state(new_state, _index(device))


def _default_generators() -> tuple:
    """One `torch.Generator` per device, each the state behind the device's default random draws
    (CUDA's `torch.cuda.default_generators`); needs the C++ extension (device/native.py)."""

    if not _native.generators_available():
        _native.new_default_generator(0)  # raises, naming why there is none
    return tuple(_random.default(i) for i in range(device_count()))


def __getattr__(name):
    if name == "default_generators":  # built on first access: it needs the devices and the extension
        try:
            return _default_generators()
        except RuntimeError as e:
            raise AttributeError(str(e)) from e
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, s in enumerate(new_states):
        set_rng_state(s, i)


# ------------------------------------------------------------------ memory
def memory_allocated(device=None) -> int:
    return _stats(_index(device)).allocated


def max_memory_allocated(device=None) -> int:
    return _stats(_index(device)).peak


def reset_peak_memory_stats(device=None) -> None:
    s = _stats(_index(device))
    s.peak = s.allocated - s.failed  # (storages whose first write failed never count: MemoryStats)
    s.peak_materialized = s.materialized


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_reserved(device=None) -> int:
    # Nothing is cached: freed storages release their XLA buffers at once.
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def nested_memory_stats(device=None) -> dict:
    """Allocator statistics in the nested form of c10's DeviceStats (what the
    `torch._C._accelerator_getDeviceStats` builtin returns; `memory_stats` flattens it)."""

    s = _stats(_index(device))
    current = s.num_alloc - s.num_free
    # Nothing is cached: reserved == allocated, one segment per live buffer.
    count = {"current": current, "allocated": s.num_alloc, "freed": s.num_free}
    s_bytes = {"current": s.allocated, "peak": s.peak}
    return {
        "allocation": {"all": dict(count)},
        "segment": {"all": dict(count)},
        "active": {"all": dict(count)},
        "allocated_bytes": {"all": dict(s_bytes)},
        "reserved_bytes": {"all": dict(s_bytes)},
        "active_bytes": {"all": dict(s_bytes)},
        "requested_bytes": {"all": dict(s_bytes)},
        "materialized_bytes": {"all": {"current": s.materialized}},
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }


def memory_stats(device=None) -> dict:
    """Flat statistics as `torch.cuda.memory_stats` names them ("allocated_bytes.all.current")."""
    flat = {}

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat[prefix] = value

    walk("", nested_memory_stats(device))
    return dict(sorted(flat.items()))


def reset_accumulated_memory_stats(device=None) -> None:
    s = _stats(_index(device))
    s.num_alloc -= s.num_free
    s.num_free = 0


def empty_cache() -> None:
    """Nothing to release: buffers are freed when PyTorch frees their storages."""


def mem_get_info(device=None):
    """(free, total) bytes. Free counts the storages that hold a buffer (a lazy `empty(<huge>)` holds
    no device memory until written), never below zero."""

    props = get_device_properties(device)
    return max(props.total_memory - _stats(_index(device)).materialized, 0), props.total_memory


# ------------------------------------------------------------------ streams and events
class _Mark:
    """What an event recorded: the device's buffers then (the work queued so far: XLA runs it in
    data-dependency order, so "done" is "every buffer that existed is ready"), the newest
    non-blocking host copy and device-side check then (eager/host_copies.py, asserts.py), and for a
    timing event the time. The buffers are held weakly: a strong reference would keep later ops and
    compiled graphs from donating them (a refcount check: storage/records.py), so a decode step
    after `generate()`'s per-token event would copy its whole KV cache. A buffer freed or donated
    since has no values left to wait for."""

    __slots__ = ("buffers", "copies", "device", "time", "verdicts")

    def __init__(self, device, timing):
        self.device = device
        if timing:  # the time the queued work ended: wait for it
            synchronize(device)
            self.buffers, self.time = [], time.perf_counter()
        else:
            self.buffers, self.time = _unfinished(device), None
        self.copies = _host_copies.last(device)
        self.verdicts = _asserts.noted()

    def _alive(self):
        return [b for ref in self.buffers if (b := ref()) is not None and not b.is_deleted()]

    def done(self) -> bool:
        """Whether the marked work is done (then its host copies are written: `query` is a sync point)."""

        if not (all(b.is_ready() for b in self._alive()) and _host_copies.ready(self.device, self.copies)):
            return False
        self.wait()
        return True

    def wait(self):
        if self.buffers:
            alive = self._alive()
            try:
                _jax.block_until_ready(alive)
            except _jax.errors.JaxRuntimeError:  # (one donated meanwhile by another thread; else raises again)
                for b in alive:
                    if not b.is_deleted():
                        b.block_until_ready()
            self.buffers = []
        _host_copies.finish(self.device, self.copies)
        _asserts.check(upto=self.verdicts)  # (not the checks of ops queued after the event: no wait for them)


def _unfinished(device):
    """Weak references to the buffers of `device` still being computed (one already computed needs
    no wait, ever: most of them, the weights, are)."""

    return [weakref.ref(b) for b in _live_buffers(device, computing=True)]


def _idle(index) -> bool:
    _fusion.flush_all()
    return _Mark(index, False).done()


class Stream(torch.Stream):
    """The device's single in-order queue, a `torch.Stream`. XLA orders work by data
    dependencies, so every stream is the default stream; `synchronize`/`query` are honest about
    queued work."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        index = _index(device)
        return super().__new__(cls, device=torch.device("tpu", index), priority=priority)

    def __init__(self, device=None, priority: int = 0, **kwargs):
        pass

    def synchronize(self):
        synchronize(self.device_index)

    def query(self) -> bool:
        return _idle(self.device_index)

    def wait_stream(self, stream):
        pass  # one queue: work on `stream` is already ordered before work queued later

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other):
        return isinstance(other, torch.Stream) and other.device == self.device

    def __hash__(self):
        return hash(self.device)

    def __repr__(self):
        return f"<torch.tpu.Stream device={self.device}>"


_streams = {}  # device index -> its stream (every stream is the default one)


def current_stream(device=None) -> Stream:
    # Dynamo's compiled frames ask for it at every call: one Stream per device, made once
    index = device_index(device)
    stream = _streams.get(index)
    if stream is None:
        stream = _streams[index] = Stream(index)
    return stream


def default_stream(device=None) -> Stream:
    return Stream(device)


def set_stream(stream) -> None:
    """Every stream is the default stream; only the device must be a tpu."""
    if not isinstance(stream, torch.Stream) or stream.device.type != "tpu":
        raise ValueError(f"set_stream expects a tpu stream, got {stream!r}")
    _index(stream.device)


class StreamContext:
    """`with torch.tpu.stream(s):` — work inside is queued on `s` (every stream is the default)."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        if self.stream is not None:
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        return False


def stream(stream) -> StreamContext:
    return StreamContext(stream)


def _elapsed_ms(start, end) -> float:
    if start is None or end is None or start.time is None or end.time is None:
        raise RuntimeError("elapsed_time needs two recorded events created with enable_timing=True")
    return (end.time - start.time) * 1000.0


class Event(torch.Event):
    """Marks the work queued so far, a `torch.Event`. With enable_timing=True, `record` waits
    for that work and notes the time, so `elapsed_time` measures device work between two events
    (in ms). (`torch.Event(device="tpu")` is the same event, through the C++ device guard.)"""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self = super().__new__(
            cls, device="tpu", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess
        )
        self._mark = None
        self._timing = enable_timing
        return self

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        pass

    @property
    def enable_timing(self) -> bool:
        return self._timing

    def record(self, stream=None):
        self._mark = _Mark(stream.device_index if stream is not None else current_device(), self._timing)

    def query(self) -> bool:
        return self._mark is None or self._mark.done()

    def synchronize(self):
        if self._mark is not None:
            self._mark.wait()

    def wait(self, stream=None):
        self.synchronize()

    def elapsed_time(self, end_event) -> float:
        return _elapsed_ms(self._mark, getattr(end_event, "_mark", None))

    def __repr__(self):
        return f"<torch.tpu.Event enable_timing={self._timing}>"


# `torch.Event(device="tpu")` and `torch.Stream(device="tpu")` reach the C++ device guard
# (device/csrc/tpu_guard.cpp), which asks these: an event there is a number naming its _Mark.
_native_marks: dict[int, _Mark] = {}
_native_numbers = itertools.count(1)


def _native_record(handle: int, device: int, timing: int) -> int:
    if handle <= 0:
        handle = next(_native_numbers)
    _native_marks[handle] = _Mark(_index(device), bool(timing))
    return handle


def _native_query(handle: int) -> int:
    mark = _native_marks.get(handle)
    return int(mark is None or mark.done())


def _native_synchronize(handle: int) -> int:
    mark = _native_marks.get(handle)
    if mark is not None:
        mark.wait()
    return 0


def _native_elapsed(start: int, end: int) -> float:
    return _elapsed_ms(_native_marks.get(start), _native_marks.get(end))


def _native_synchronize_device(device: int) -> int:
    synchronize(device)
    return 0


def _native_query_device(device: int) -> int:
    return int(_idle(_index(device)))


_native.set_event_callbacks(
    _native_record,
    _native_query,
    _native_synchronize,
    lambda handle: _native_marks.pop(handle, None),
    _native_elapsed,
    _native_synchronize_device,
    _native_query_device,
)


# ------------------------------------------------------------------ backend-specific
def platform() -> str:
    """The XLA platform backing "tpu": 'tpu', 'gpu' or 'cpu'."""
    return _platform.platform()


def _is_in_bad_fork() -> bool:
    return False
