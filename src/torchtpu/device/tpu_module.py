"""`torch.tpu`: the device module, with CUDA's names where we offer the same thing."""
from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

from . import platform as _platform
from .platform import is_initialized, device_count  # noqa: F401
from .state import current_device, set_device, device_index
from ..compile import options as compiler  # noqa: F401  (torch.tpu.compiler)


def is_available() -> bool:
    try:
        return _platform.device_count() > 0
    except RuntimeError:
        return False


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
    import jax

    from ..eager import asserts, fusion
    from ..storage.records import live_buffers
    fusion.flush_all()
    jax.block_until_ready(live_buffers(_index(device)))
    asserts.check()


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

    def __repr__(self):
        return (f"_TpuDeviceProperties(name='{self.name}', platform='{self.platform}', "
                f"total_memory={self.total_memory // (1 << 20)}MB)")


def get_device_properties(device=None) -> DeviceProperties:
    d = _platform.jax_device(_index(device))
    total = 0
    try:
        total = int((d.memory_stats() or {}).get("bytes_limit", 0))
    except Exception:
        pass
    if not total:
        import os
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return DeviceProperties(get_device_name(device), d.platform, d.device_kind, d.id, total)


def get_device_capability(device=None):
    return (0, 0)


def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# ------------------------------------------------------------------ random numbers
def manual_seed(seed: int) -> None:
    from ..eager import random
    random.manual_seed(seed, current_device())


def manual_seed_all(seed: int) -> None:
    from ..eager import random
    for i in range(device_count()):
        random.manual_seed(seed, i)


def seed() -> int:
    from ..eager import random
    return random.seed(current_device())


def seed_all() -> None:
    from ..eager import random
    value = random.seed(0)
    for i in range(1, device_count()):
        random.manual_seed(value, i)


def initial_seed() -> int:
    from ..eager import random
    return random.initial_seed(current_device())


def get_rng_state(device="tpu") -> torch.Tensor:
    from ..eager import random
    return random.get_rng_state(_index(device))


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    from ..eager import random
    random.set_rng_state(new_state, _index(device))


def get_rng_state_all():
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, s in enumerate(new_states):
        set_rng_state(s, i)


# ------------------------------------------------------------------ memory
def memory_allocated(device=None) -> int:
    from ..storage.records import stats
    return stats(_index(device)).allocated


def max_memory_allocated(device=None) -> int:
    from ..storage.records import stats
    return stats(_index(device)).peak


def reset_peak_memory_stats(device=None) -> None:
    from ..storage.records import stats
    s = stats(_index(device))
    s.peak = s.allocated


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def memory_reserved(device=None) -> int:
    # Nothing is cached: freed storages release their XLA buffers at once.
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def memory_stats(device=None) -> dict:
    from ..storage.records import stats
    s = stats(_index(device))
    return {
        "allocated_bytes.all.current": s.allocated,
        "allocated_bytes.all.peak": s.peak,
        "allocation.all.allocated": s.num_alloc,
        "allocation.all.freed": s.num_free,
        "allocation.all.current": s.num_alloc - s.num_free,
        "reserved_bytes.all.current": s.allocated,
        "materialized_bytes.all.current": s.materialized,
    }


def empty_cache() -> None:
    """Nothing to release: buffers are freed when PyTorch frees their storages."""


def mem_get_info(device=None):
    """(free, total) bytes. Free counts the storages that hold a buffer (a lazy `empty(<huge>)` holds
    no device memory until written), never below zero."""
    from ..storage.records import stats
    props = get_device_properties(device)
    return max(props.total_memory - stats(_index(device)).materialized, 0), props.total_memory


# ------------------------------------------------------------------ streams and events
class Stream:
    """The device's single in-order queue. XLA orders work by data dependencies, so every
    stream is the default stream; `synchronize`/`query` are honest about queued work."""

    def __init__(self, device=None, priority: int = 0):
        self.device = torch.device("tpu", _index(device))
        self.priority = priority

    def synchronize(self):
        synchronize(self.device)

    def query(self) -> bool:
        from ..storage.records import live_buffers
        return all(b.is_ready() for b in live_buffers(self.device.index))

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def __eq__(self, other):
        return isinstance(other, Stream) and other.device == self.device

    def __hash__(self):
        return hash(self.device)

    def __repr__(self):
        return f"<torch.tpu.Stream device={self.device}>"


def current_stream(device=None) -> Stream:
    return Stream(device)


def default_stream(device=None) -> Stream:
    return Stream(device)


@contextlib.contextmanager
def stream(s):
    yield s


class Event:
    """Marks the work queued so far. With enable_timing=True, `record` waits for that work and
    notes the time, so `elapsed_time` measures device work between two events (in ms)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._pending = None
        self._time = None

    def record(self, stream=None):
        from ..storage.records import live_buffers
        index = stream.device.index if stream is not None else current_device()
        if self.enable_timing:
            synchronize(index)
            self._time = time.perf_counter()
            self._pending = []
        else:
            self._pending = live_buffers(index)

    def query(self) -> bool:
        return all(b.is_ready() for b in self._pending or ())

    def synchronize(self):
        import jax
        from ..eager import asserts
        if self._pending:
            jax.block_until_ready(self._pending)
        self._pending = []
        asserts.check()

    def wait(self, stream=None):
        self.synchronize()

    def elapsed_time(self, end: "Event") -> float:
        if self._time is None or end._time is None:
            raise RuntimeError("elapsed_time needs two recorded events created with enable_timing=True")
        return (end._time - self._time) * 1000.0


# ------------------------------------------------------------------ backend-specific
def platform() -> str:
    """The XLA platform backing "tpu": 'tpu', 'gpu' or 'cpu'."""
    return _platform.platform()


def set_eager_mode(mode: str) -> None:
    from ..eager.modes import set_eager_mode as _set
    _set(mode)


def get_eager_mode() -> str:
    from ..eager.modes import get_eager_mode as _get
    return _get()


def eager_mode(mode: str):
    """Context manager: run the block in eager mode `mode` ("strict", "debug" or "fused")."""
    from ..eager.modes import eager_mode as _ctx
    return _ctx(mode)


def _is_in_bad_fork() -> bool:
    return False
