"""Which XLA platform backs the "tpu" device, and the JAX device behind each `tpu:i`.

TPU when JAX sees one; otherwise what TORCHTPU_PLATFORM asks for (cpu, gpu or tpu), defaulting
to the CPU. TORCHTPU_NUM_DEVICES=N asks XLA:CPU for N virtual devices, for development and tests.
The choice is made once, lazily, the first time a device is needed.

Multi-controller (one process per chip, `torchrun`): JAX's distributed runtime must be joined before
JAX creates its backends, so when torchrun's environment names a job of several processes the first
device use joins it (`join_multi_controller`), and each process then owns its local device(s) only:
its chip is `tpu:0`. torchtpu.distributed calls `join_multi_controller` itself when
`init_process_group` comes first in a process launched without that environment.
"""

from __future__ import annotations

import contextlib
import glob
import os
import threading

from .. import config

_lock = threading.Lock()
_devices = None
_platform = None
_multi_controller = None  # (coordinator address, number of processes, this process's id) once joined
_ready_listeners = []  # called with the device count once the devices are known (when_ready)


def _launch_env():
    """(coordinator, num_processes, process_id) from torchrun's environment, or None for one process.
    The coordinator listens on MASTER_PORT + 1 (the c10d store has MASTER_PORT) unless
    TORCHTPU_COORDINATOR_ADDRESS says where; TORCHTPU_MULTI_CONTROLLER=0 turns joining off."""
    env = os.environ
    if not config.get("TORCHTPU_MULTI_CONTROLLER"):
        return None
    try:
        world, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
    except (KeyError, ValueError):
        return None
    if world <= 1:
        return None
    coordinator = config.get("TORCHTPU_COORDINATOR_ADDRESS")
    if not coordinator:
        if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
            return None
        coordinator = f"{env['MASTER_ADDR']}:{int(env['MASTER_PORT']) + 1}"
    return coordinator, world, rank


def join_multi_controller(coordinator: str, num_processes: int, process_id: int, timeout_s: float = 300.0):
    """Join JAX's multi-controller runtime (before any backend exists). Idempotent for the same job."""
    global _multi_controller
    job = (coordinator, int(num_processes), int(process_id))
    if _multi_controller is not None:
        if _multi_controller[1:] != job[1:]:
            raise RuntimeError(
                f"torchtpu: this process already joined a job of {_multi_controller[1]} "
                f"processes as process {_multi_controller[2]}; cannot join {job}"
            )
        return
    if _devices is not None:
        raise RuntimeError(
            "torchtpu: the tpu device was initialised for a single process before joining a job of "
            f"{num_processes} processes: call torch.distributed.init_process_group before the first "
            "tpu tensor, or launch with torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
        )
    import jax

    # XLA:CPU's cross-process collectives (harmless on TPU/GPU, where XLA brings its own)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=job[1],
        process_id=job[2],
        initialization_timeout=max(1, int(timeout_s)),
    )
    _multi_controller = job


def multi_controller():
    """(coordinator, num_processes, process_id) of the JAX job this process joined, or None."""
    return _multi_controller


def _configure_jax():
    """Settings that must be in place before JAX creates its backends."""
    n = config.get("TORCHTPU_NUM_DEVICES")
    if n:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={int(n)}".strip()
    import jax

    # PyTorch's default integer type is int64; without x64 JAX would silently truncate it. This is
    # JAX's process-wide setting: the user's own JAX code sees it too (README, "What `import torch`
    # changes"; docs/tpu.md, "64-bit types"). A thread-local policy (torchtpu's programs x64, the
    # user's not) would have to wrap every call into an executable, the C++ fast path's included.
    jax.config.update("jax_enable_x64", True)
    if not config.get("TORCHTPU_JAX_TRACEBACKS"):
        # jaxlib walks the Python stack at every executable call to keep a traceback on each array
        # (`jax.Array.traceback`): ~0.7 µs of an eager op at a model's stack depth, for arrays
        # users never see (tracing errors and JAX's own error messages do not use it)
        try:
            from jax._src.lib import _jax

            _jax.set_tracebacks_enabled(False)
        except (ImportError, AttributeError):  # (a jaxlib without the switch: nothing to save)
            pass
    if n:
        try:
            jax.config.update("jax_num_cpu_devices", int(n))
        except (AttributeError, RuntimeError):  # an older JAX without the option, or its backends already
            pass  # up: the XLA flag set above asks for the same devices
    return jax


def _pick():
    jax = _configure_jax()
    if _multi_controller is None:
        job = _launch_env()
        if job is not None:
            join_multi_controller(*job, timeout_s=config.get("TORCHTPU_COORDINATOR_TIMEOUT"))
    requested = config.get("TORCHTPU_PLATFORM")
    if requested == "cuda":
        requested = "gpu"
    if requested:
        order = [requested]
        if requested == "cpu":
            _host_only(jax)
    elif tpu_chip_visible():
        order = ["tpu", "cpu"]
    else:
        order = ["cpu"]
        _host_only(jax)
    errors = []
    for name in order:
        try:
            # in a multi-controller job a process drives its own devices only: they are its tpu:0..
            devs = jax.local_devices(backend=name) if _multi_controller else jax.devices(name)
        except RuntimeError as e:
            errors.append(f"{name}: {e}")
            continue
        if devs:
            if name == "cpu" and config.get("TORCHTPU_NUM_DEVICES"):
                devs = devs[: config.get("TORCHTPU_NUM_DEVICES")]
            return name, list(devs)
    raise RuntimeError("torchtpu: no XLA platform available (" + "; ".join(errors) + ")")


def tpu_chip_visible() -> bool:
    """Whether this machine has a TPU chip: a PCI device of Google's vendor id (0x1ae0), as TPU VMs
    expose their chips. Asked before JAX's "tpu" backend, which on a machine with libtpu installed and
    no chip prints libtpu's start-up warnings to stderr at every first use of the device. (Also the
    device nodes TPU VMs have: /dev/accel* on v4/v5p, /dev/vfio/* on v5e/v6e.)"""
    if glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"):
        return True
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == "0x1ae0":
                    return True
        except OSError:  # an unreadable PCI entry is not a TPU we could use
            continue
    return False


def _host_only(jax):
    """No chip and no platform asked for: JAX initialises the CPU backend alone (its default would
    initialise every installed plugin, libtpu's included, to find no TPU). Left alone when the user
    chose JAX's platforms, a GPU is present, or JAX's backends already exist."""
    if os.environ.get("JAX_PLATFORMS") or os.path.exists("/dev/nvidia0") or os.path.exists("/dev/dxg"):
        return
    try:
        from jax._src import xla_bridge

        if xla_bridge.backends_are_initialized():
            return
    except (ImportError, AttributeError):  # a JAX without that query: leave its platform choice alone
        return
    jax.config.update("jax_platforms", "cpu")


def ensure():
    global _devices, _platform
    if _devices is None:
        with _lock:
            if _devices is None:
                config.check()  # a bad TORCHTPU_* value surfaces here, naming the variable
                _platform, _devices = _pick()
                for listener in _ready_listeners:
                    listener(len(_devices))
    return _devices


def when_ready(listener) -> None:
    """Call `listener(device_count)` once the XLA devices are known (now, if they already are). Layers
    above the platform (the C++ extension, native.py) learn the device count this way, so the platform
    imports none of them."""
    with _lock:
        if _devices is None:
            _ready_listeners.append(listener)
            return
    listener(len(_devices))


def devices():
    return _devices if _devices is not None else ensure()


def platform() -> str:
    """The XLA platform backing "tpu": 'tpu', 'gpu' or 'cpu'."""
    ensure()
    return _platform


_trace_target = threading.local()


def lowering_platform() -> str:
    """The platform the program being traced is for: `platform()`, except while the TPU compile
    check (TORCHTPU_TPU_COMPILE_CHECK) traces a program a second time as it would be on a TPU, when
    it is 'tpu'. Lowerings that take a platform-specific branch (splash attention, Mosaic kernels,
    bf16 arithmetic on the host) ask this, never `platform()`, so the check sees the TPU branch."""
    return getattr(_trace_target, "name", None) or platform()


@contextlib.contextmanager
def tracing_for(name: str):
    """Trace (in this thread) as if the device were XLA platform `name`: see lowering_platform()."""
    previous = getattr(_trace_target, "name", None)
    _trace_target.name = name
    try:
        yield
    finally:
        _trace_target.name = previous


def require_x64(program: str = "a tpu program"):
    """Called while torchtpu traces a program: JAX's 64-bit types must be on in this thread. Inside a
    user's `jax.enable_x64(False)` block (or after `jax.config.update("jax_enable_x64", False)`) JAX
    would trace int64/float64 tensors' arithmetic and Python scalars in 32 bits and silently compute
    wrong values; a cached executable is keyed on the setting, so only a new trace comes here."""
    from jax._src import config as jax_config

    if not jax_config.enable_x64.value:
        raise RuntimeError(
            f"torchtpu: {program} was traced with JAX's 64-bit types turned off (jax.enable_x64(False) or "
            f"jax_enable_x64=False); tpu tensors need them (PyTorch's int64 and float64): run torch "
            f"operations on the tpu device outside that block, or scope only your own JAX code with it"
        )


def buffers_in_host_memory() -> bool:
    """Whether device buffers are host memory (XLA:CPU): reading one is a host read, sending one to
    the host has nothing to send. (Asked on hot paths: answered once.)"""
    host = _host_memory[0]
    if host is None:
        host = _host_memory[0] = platform() == "cpu"
    return host


_host_memory = [None]


def is_initialized() -> bool:
    return _devices is not None


def device_count() -> int:
    return len(devices())


def jax_device(index: int):
    devs = devices()
    if not 0 <= index < len(devs):
        raise RuntimeError(
            f"Invalid device index tpu:{index}: there are {len(devs)} tpu device(s) "
            f"(valid indices 0..{len(devs) - 1}, XLA platform {_platform!r})"
        )
    return devs[index]


_places = {}  # device index -> (jax device, its sharding)
_avals = {}  # (shape, numpy dtype) -> jax aval
_batched_put = []  # [(jaxlib's batched_device_put, IMMUTABLE_ONLY_DURING_CALL) or None] once looked up


def put(host, index: int):
    """numpy array `host` as a committed array on tpu:`index` holding its own copy: the caller may
    write `host` afterwards (it is often a view of a user's CPU tensor), and XLA:CPU would otherwise
    alias it. What `jax.device_put(copy, device)` makes, by the jaxlib call under it
    (batched_device_put) with the runtime copying during the call (IMMUTABLE_ONLY_DURING_CALL)
    instead of a numpy copy first: ~3 µs instead of ~30 for a small tensor, where JAX's Python
    dispatch was most of `torch.tensor([i], device="tpu")`."""
    place = _places.get(index)
    if place is None:
        import jax

        device = jax_device(index)
        place = _places[index] = (device, jax.sharding.SingleDeviceSharding(device))
    if not _batched_put:
        try:
            from jax._src.lib import _jax

            _batched_put.append((_jax.batched_device_put, _jax.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL))
        except (ImportError, AttributeError):  # another jaxlib layout: JAX's own way
            _batched_put.append(None)
    if _batched_put[0] is None:
        import jax
        import numpy as np

        return jax.device_put(np.array(host, order="C", copy=True), place[0])
    key = (host.shape, host.dtype)
    aval = _avals.get(key)
    if aval is None:
        from jax._src import core

        aval = _avals.setdefault(key, core.ShapedArray(host.shape, host.dtype))
    put_fn, during_call = _batched_put[0]
    return put_fn(aval, place[1], [host], [place[0]], True, host_buffer_semantics=during_call)


def is_available() -> bool:
    try:
        return device_count() > 0
    except (RuntimeError, ValueError):  # no XLA platform, or a bad TORCHTPU_* setting
        return False
