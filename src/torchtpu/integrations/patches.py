"""Every change torchtpu makes to another library's code (torch, jax, accelerate, transformers), in one place.

`PATCHES` (at the end) is the table: for each patch, what it changes, the library and the releases it
was checked against (TORCH_CHECKED, JAX_CHECKED, ACCELERATE_CHECKED, TRANSFORMERS_CHECKED: the oldest is
pyproject.toml's lower bound), and the module whose import applies it. With an installed release
outside that range, `warnings.warn` says so once per library and the patch still applies where its
target exists. A patch whose target has gone missing or changed shape is not applied: it is listed in
`problems()` with a warning naming the target, never an error while torch or the library imports.
tests/test_patches.py imports accelerate and transformers and checks that every patch is installed,
so a new release that moves a target is caught in CI instead of silently changing behaviour.

torch.accelerator (torch 2.13): for a PrivateUse1 backend its `torch._C._accelerator_*` builtins reach
C++ interfaces a Python backend cannot provide (`empty_cache()`, `memory_stats()`, `synchronize()` raise;
`set_device_index()` is ignored): they are wrapped, answered from `torch.tpu` when the accelerator is
"tpu" (docs/design.md, "torch.accelerator").
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import re
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._import_hooks import run_finished, when_imported

# The releases the patches were checked against (major.minor, both included); the oldest is
# pyproject.toml's lower bound (tests/test_patches.py checks that they agree, and docs/transformers.md).
TORCH_CHECKED = ("2.13", "2.13")
JAX_CHECKED = ("0.10", "0.10")
ACCELERATE_CHECKED = ("1.16", "1.16")
TRANSFORMERS_CHECKED = ("5.24", "5.25")

_applied: list[str] = []
_problems: list[str] = []
_installed = [False]


def _is_tpu() -> bool:
    acc = _get_accelerator()
    return acc is not None and acc.type == "tpu"


_get_accelerator = torch._C._accelerator_getAccelerator


def _mark(new, old):
    """`new` replaces `old`: it says so (`_torchtpu`, so a second install skips it) and keeps the
    original reachable (`__wrapped__`) with its docstring."""
    new._torchtpu = True
    new.__wrapped__ = old
    new.__doc__ = old.__doc__
    return new


def _tpu():
    from ..eager import device_module

    return device_module


# ------------------------------------------------------------------ torch.accelerator
def _device_stats(index):
    """The nested form `torch.accelerator.memory_stats` flattens ("allocated_bytes.all.current")."""
    return _tpu().nested_memory_stats(index)


def _exchange_device(index):
    tpu = _tpu()
    previous = tpu.current_device()
    if index >= 0 and index != previous:
        tpu.set_device(index)
    return previous


def _set_device_index(index):
    if index >= 0:  # a negative index is a no-op, as on CUDA
        _tpu().set_device(index)


# builtin name -> replacement used when the current accelerator is "tpu"
_ACCELERATOR = {
    "_accelerator_isAllocatorInitialized": lambda: True,
    "_accelerator_emptyCache": lambda: _tpu().empty_cache(),
    "_accelerator_getDeviceStats": _device_stats,
    "_accelerator_resetAccumulatedStats": lambda index: _tpu().reset_accumulated_memory_stats(index),
    "_accelerator_resetPeakStats": lambda index: _tpu().reset_peak_memory_stats(index),
    "_accelerator_getMemoryInfo": lambda index: _tpu().mem_get_info(index),
    "_accelerator_synchronizeDevice": lambda index: _tpu().synchronize(index),
    "_accelerator_getDeviceIndex": lambda: _tpu().current_device(),
    "_accelerator_setDeviceIndex": _set_device_index,
    "_accelerator_exchangeDevice": _exchange_device,
    "_accelerator_maybeExchangeDevice": _exchange_device,
    "_accelerator_getStream": lambda index: _tpu().current_stream(index),
    "_accelerator_setStream": lambda stream: _tpu().set_stream(stream),
}


def _wrap(original, replacement):
    def wrapper(*args):
        if _is_tpu():
            return replacement(*args)
        return original(*args)

    wrapper.__name__ = original.__name__
    _mark(wrapper, original)
    return wrapper


def _patch_accelerator() -> None:
    for name, replacement in _ACCELERATOR.items():
        original = getattr(torch._C, name, None)
        if original is None:
            _problems.append(
                f"torch._C.{name} is missing (checked against torch "
                f"{'..'.join(TORCH_CHECKED)}, this is {torch.__version__})"
            )
            continue
        if getattr(original, "_torchtpu", False):
            continue
        if type(original).__name__ != "builtin_function_or_method":
            _problems.append(f"torch._C.{name} is no longer a builtin ({type(original).__name__})")
            continue
        setattr(torch._C, name, _wrap(original, replacement))
        _applied.append(f"torch._C.{name}")


# ------------------------------------------------------------------ accelerate (1.16)
def _accelerate_default_device(module) -> None:
    """`accelerate.state.PartialState.default_device` knows a fixed list of device types and
    otherwise answers "cpu"; when that list finds nothing and PyTorch's current accelerator is
    "tpu", answer "tpu" (an explicit `cpu=True`, `ACCELERATE_TORCH_DEVICE`, CUDA... win)."""
    cls = getattr(module, "PartialState", None)
    prop = cls.__dict__.get("default_device") if cls is not None else None
    if not isinstance(prop, property):
        _problems.append(
            "accelerate.state.PartialState.default_device is no longer a property (checked against accelerate 1.16)"
        )
        return
    if getattr(prop.fget, "_torchtpu", False):
        return
    original = prop.fget

    def default_device(self):
        device = original(self)
        if device.type == "cpu" and _is_tpu():
            return torch.device("tpu", _tpu().current_device())
        return device

    default_device._torchtpu = True
    default_device.__doc__ = original.__doc__
    cls.default_device = property(default_device)
    _applied.append("accelerate.state.PartialState.default_device")


# ------------------------------------------------------------------ accelerate: data parallel on tpu
_MULTI_TPU = "MULTI_TPU"


def _multi_tpu_member(distributed_type):
    """`DistributedType.MULTI_TPU`, added to accelerate's str enum (an enum cannot be extended by
    subclassing, and accelerate compares members by identity and by their string value)."""
    member = distributed_type._value2member_map_.get(_MULTI_TPU)
    if member is None:
        member = str.__new__(distributed_type, _MULTI_TPU)
        member._name_ = member._value_ = _MULTI_TPU
        distributed_type._member_map_[_MULTI_TPU] = member
        distributed_type._value2member_map_[_MULTI_TPU] = member
        distributed_type._member_names_.append(_MULTI_TPU)
        type.__setattr__(distributed_type, _MULTI_TPU, member)
    return member


def _accelerate_data_parallel(state_module) -> None:
    """accelerate (checked against 1.16) decides multi-process training from fixed lists of device
    types; under torchrun on "tpu" it finds none, reports DistributedType.NO, and Trainer trains each
    rank alone with no gradient synchronisation. Here "tpu" becomes one more such device type:
    `DistributedType.MULTI_TPU` with the `tpu_dist` process group, one device per process (each rank
    sees its chip as tpu:0), barriers, collectives and RNG broadcasts as for GPUs, and DDP."""
    import accelerate.utils.constants as constants
    from accelerate.utils.dataclasses import DistributedType

    cls = getattr(state_module, "PartialState", None)
    needed = (
        cls is not None
        and callable(getattr(cls, "set_device", None))
        and callable(getattr(cls, "wait_for_everyone", None))
        and isinstance(getattr(constants, "TORCH_DISTRIBUTED_BACKENDS", None), dict)
        and isinstance(getattr(constants, "CUDA_DISTRIBUTED_TYPES", None), list)
        and isinstance(getattr(constants, "TORCH_DISTRIBUTED_OPERATION_TYPES", None), list)
    )
    if not needed:
        _problems.append(
            "accelerate's PartialState.set_device/wait_for_everyone or its distributed constants "
            "changed (checked against accelerate 1.16)"
        )
        return
    if getattr(cls.set_device, "_torchtpu", False):
        return
    multi_tpu = _multi_tpu_member(DistributedType)
    constants.TORCH_DISTRIBUTED_BACKENDS.setdefault("tpu", "tpu_dist")
    for names in (
        constants.CUDA_DISTRIBUTED_TYPES,  # read only to broadcast RNG states on the device
        constants.TORCH_DISTRIBUTED_OPERATION_TYPES,
    ):
        if _MULTI_TPU not in names:
            names.append(_MULTI_TPU)
    set_device, wait_for_everyone = cls.set_device, cls.wait_for_everyone

    def new_set_device(self):
        if self.device is None and self.distributed_type == multi_tpu:
            self.device = torch.device("tpu", self.local_process_index % _tpu().device_count())
            _tpu().set_device(self.device)
            return
        return set_device(self)

    def new_wait_for_everyone(self):
        if self.distributed_type == multi_tpu:
            torch.distributed.barrier()
            return
        return wait_for_everyone(self)

    for new, old in ((new_set_device, set_device), (new_wait_for_everyone, wait_for_everyone)):
        _mark(new, old)
    cls.set_device, cls.wait_for_everyone = new_set_device, new_wait_for_everyone
    _applied.append("accelerate.state.PartialState.set_device/wait_for_everyone, DistributedType.MULTI_TPU")


def _accelerate_ddp(accelerator_module) -> None:
    """`Accelerator.multi_device` lists device types (checked against accelerate 1.16), and
    `prepare_model` gives DDP `device_ids=[local rank]`, right for one process per GPU of a host but
    not for "tpu", where every process sees its one chip as tpu:0: DDP gets no device_ids there (the
    model and its inputs are already on the process's device)."""
    from accelerate.utils.dataclasses import DistributedType

    cls = getattr(accelerator_module, "Accelerator", None)
    prop = cls.__dict__.get("multi_device") if cls is not None else None
    prepare_model = getattr(cls, "prepare_model", None)
    if not isinstance(prop, property) or not callable(prepare_model):
        _problems.append("accelerate.Accelerator.multi_device/prepare_model changed (checked against accelerate 1.16)")
        return
    if getattr(prop.fget, "_torchtpu", False):
        return
    multi_tpu = _multi_tpu_member(DistributedType)
    multi_device = prop.fget

    def new_multi_device(self):
        return multi_device(self) or (self.use_distributed and self.distributed_type == multi_tpu)

    def new_prepare_model(self, *args, **kwargs):
        if self.distributed_type != multi_tpu:
            return prepare_model(self, *args, **kwargs)
        import os

        bypass = os.environ.get("ACCELERATE_BYPASS_DEVICE_MAP")
        os.environ["ACCELERATE_BYPASS_DEVICE_MAP"] = "true"  # read there only: DDP without device_ids
        try:
            return prepare_model(self, *args, **kwargs)
        finally:
            if bypass is None:
                os.environ.pop("ACCELERATE_BYPASS_DEVICE_MAP", None)
            else:
                os.environ["ACCELERATE_BYPASS_DEVICE_MAP"] = bypass

    for new, old in ((new_multi_device, multi_device), (new_prepare_model, prepare_model)):
        _mark(new, old)
    cls.multi_device = property(new_multi_device)
    cls.prepare_model = new_prepare_model
    _applied.append("accelerate.Accelerator.multi_device/prepare_model")


# ------------------------------------------------------------------ DataLoader (torch 2.13)
_pin_warned = [False]


def _dataloader_pinning() -> None:
    """`DataLoader(pin_memory=True)` pins for the current accelerator, which for a PrivateUse1
    backend needs a C++ pinned-memory allocator ("implement `getPinnedMemoryAllocator`"). Host
    copies to "tpu" go through `jax.device_put` and gain nothing from page-locked memory, so the
    iterator turns pinning off with a one-time warning (what PyTorch does for MPS)."""
    from torch.utils.data import dataloader

    cls = getattr(dataloader, "_BaseDataLoaderIter", None)
    if cls is None:
        _problems.append("torch.utils.data.dataloader._BaseDataLoaderIter is missing")
        return
    original = cls.__init__
    if getattr(original, "_torchtpu", False):
        return

    def __init__(self, loader, *args, **kwargs):
        original(self, loader, *args, **kwargs)
        if getattr(self, "_pin_memory", False) and getattr(self, "_pin_memory_device", None) == "tpu":
            self._pin_memory = False
            if not _pin_warned[0]:
                _pin_warned[0] = True
                warnings.warn(
                    "torchtpu: 'pin_memory' is not used on tpu (host copies go through XLA); batches are not pinned.",
                    stacklevel=2,
                )

    __init__._torchtpu = True
    cls.__init__ = __init__
    _applied.append("torch.utils.data.dataloader._BaseDataLoaderIter.__init__")


# ------------------------------------------------------------------ torch.compile (torch 2.13)
def _on_tpu(model, inputs) -> bool:
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return True
    tensors = getattr(model, "parameters", None)
    return any(p.device.type == "tpu" for p in tensors()) if tensors else False


def _default_backend_for_tpu() -> None:
    """`torch.compile(model)` names no backend, so Dynamo hands each graph to Inductor's wrapper,
    which cannot generate code for "tpu" ("No module named 'torch_tpu'"). When a graph's inputs are
    tpu tensors the wrapper hands it to our backend instead (TorchTPU does the same); Inductor's
    `mode=`/`options=` configure Inductor's code generation, which XLA replaces: with tpu inputs they
    are ignored (compile/options.py, one info line), so `generate()`'s automatic compile with its
    default `mode="reduce-overhead"` works as on CUDA."""
    cls = getattr(torch, "_TorchCompileInductorWrapper", None)
    if cls is None or not callable(cls.__dict__.get("__call__")):
        _problems.append("torch._TorchCompileInductorWrapper.__call__ is missing (checked against torch 2.13)")
        return
    original = cls.__call__
    if getattr(original, "_torchtpu", False):
        return

    def __call__(self, model_, inputs_, **kwargs):
        if not _on_tpu(model_, inputs_):
            return original(self, model_, inputs_, **kwargs)
        from ..compile import options, tpu_backend

        # Inductor already checked mode and options against its own tables (torch.compile's wrapper)
        options.ignore_inductor_settings(options=dict(self.config) if self.config else None)
        return tpu_backend(model_, inputs_)

    __call__._torchtpu = True
    __call__.__wrapped__ = original
    cls.__call__ = __call__
    _applied.append("torch._TorchCompileInductorWrapper.__call__")


def _profiler_trace_window() -> None:
    """torch.profiler (torch 2.13) has no hook for a PrivateUse1 device trace: its
    `_KinetoProfile.start_trace`/`stop_trace` bracket the profiled window, and we start and stop JAX's
    profiler there (torchtpu/profiling: only for profiles that ask for PrivateUse1 activity or carry
    a TpuProfilerConfig; imported only when a profile starts)."""
    from torch.profiler import profiler as torch_profiler

    kineto = getattr(torch_profiler, "_KinetoProfile", None)
    if (
        kineto is None
        or not callable(getattr(kineto, "start_trace", None))
        or not callable(getattr(kineto, "stop_trace", None))
    ):
        _problems.append(
            "torch.profiler.profiler._KinetoProfile.start_trace/stop_trace are missing (checked against torch 2.13)"
        )
        return
    original_start, original_stop = kineto.start_trace, kineto.stop_trace
    if getattr(original_start, "_torchtpu", False):
        return

    def start_trace(self):
        original_start(self)
        from .. import profiling

        profiling.start(self)

    def stop_trace(self):
        try:
            from .. import profiling

            profiling.stop(self)
        finally:
            original_stop(self)

    for new, old in ((start_trace, original_start), (stop_trace, original_stop)):
        new._torchtpu = True
        new.__wrapped__ = old
    kineto.start_trace, kineto.stop_trace = start_trace, stop_trace
    _applied.append("torch.profiler.profiler._KinetoProfile.start_trace/stop_trace")


# ------------------------------------------------------------------ transformers (5.24 .. 5.25)
# Dynamo keeps these int attributes of Transformers' caches dynamic in tpu decode graphs
# (a regular expression over Dynamo's source names, as `torch.compiler.config.dynamic_sources` takes).
DYNAMIC_CACHE_INTS = r".*\.cumulative_length_int$"


def _sliding_window_decode(module) -> None:
    """`StaticSlidingWindowLayer` counts its tokens in a Python int, `cumulative_length_int`; `generate()`
    compiles tpu decode steps with `dynamic=False`, so Dynamo baked the int in and compiled a graph per
    token (Gemma 2/3/4, Mistral), then fell back to eager at its recompile limit. For tpu models the
    compiled call runs with that int marked dynamic (`torch.compiler.config.dynamic_sources`, scoped to
    the call; compile/backend.py passes it as a traced scalar): one decode graph."""
    cls = getattr(module, "PreTrainedModel", None)
    original = getattr(cls, "get_compiled_call", None) if cls is not None else None
    config = getattr(torch.compiler, "config", None)
    if original is None or config is None or not hasattr(config, "dynamic_sources"):
        _problems.append(
            "transformers PreTrainedModel.get_compiled_call or torch.compiler.config.dynamic_sources "
            "is missing (checked against transformers 5.24 .. 5.25, torch 2.13)"
        )
        return
    if getattr(original, "_torchtpu", False):
        return

    def get_compiled_call(self, compile_config):
        compiled = original(self, compile_config)
        device = getattr(self, "device", None)
        if getattr(device, "type", None) != "tpu":
            return compiled
        wrapped = getattr(self, "_torchtpu_compiled_call", None)
        if wrapped is not None and wrapped.__wrapped__ is compiled:
            return wrapped

        def call(*args, **kwargs):
            sources = config.dynamic_sources
            extra = sources + "," + DYNAMIC_CACHE_INTS if sources else DYNAMIC_CACHE_INTS
            with config.patch(dynamic_sources=extra):
                return compiled(*args, **kwargs)

        call.__wrapped__ = compiled
        self._torchtpu_compiled_call = call
        return call

    _mark(get_compiled_call, original)
    cls.get_compiled_call = get_compiled_call
    _applied.append("transformers.modeling_utils.PreTrainedModel.get_compiled_call")


def _sliding_window_layer(module) -> None:
    """With the count dynamic (above), `StaticSlidingWindowLayer.update` still branches on whether
    the window is full, so decoding compiles two graphs: one while the window fills, one after.
    For one-token updates of a tpu cache this replaces the branch by arithmetic that computes both
    outcomes and selects one (`torch.where`), and `get_mask_sizes` by its one-token case written
    with `max` (`kv_length` is the window either way): one decode graph for the whole generation,
    with the same cache contents and masks as the original. Prefill, multi-token updates and other
    devices run the original code. Checked against transformers 5.24 .. 5.25."""
    cls = getattr(module, "StaticSlidingWindowLayer", None)
    update = cls.__dict__.get("update") if cls is not None else None
    mask_sizes = cls.__dict__.get("get_mask_sizes") if cls is not None else None
    if update is None or mask_sizes is None:
        _problems.append(
            "transformers.cache_utils.StaticSlidingWindowLayer.update/get_mask_sizes is missing "
            "(checked against transformers 5.24 .. 5.25)"
        )
        return
    if getattr(update, "_torchtpu", False):
        return

    def _one_tpu_token(layer, key_states):
        return (
            layer.is_initialized
            and key_states.shape[-2] == 1
            and layer.keys.device.type == "tpu"
            and layer.keys.shape[-2] == layer.max_cache_len
        )

    def new_update(self, key_states, value_states, *args, **kwargs):
        if not _one_tpu_token(self, key_states):
            return update(self, key_states, value_states, *args, **kwargs)
        window = self.max_cache_len
        seen = self.cumulative_length_int
        self.cumulative_length_int = seen + 1
        position = torch.scalar_tensor(seen, dtype=torch.long, device=self.keys.device)
        full = position >= window
        slot = position.clamp(max=window - 1).reshape(1)
        for cache, new in ((self.keys, key_states), (self.values, value_states)):
            shifted = torch.cat((cache[:, :, 1:], new), dim=-2)  # full: drop the oldest
            filled = cache.index_copy(2, slot, new)  # filling: write at `seen`
            cache.copy_(torch.where(full, shifted, filled))
        self.cumulative_length.add_((~full).to(self.cumulative_length.dtype))
        return self.keys, self.values

    def new_get_mask_sizes(self, query_length):
        if not (
            query_length == 1
            and self.is_initialized
            and self.keys.device.type == "tpu"
            and self.keys.shape[-2] == self.max_cache_len
        ):
            return mask_sizes(self, query_length)
        return self.max_cache_len, max(self.cumulative_length_int - self.max_cache_len + 1, 0)

    # torchtpu's files are on Dynamo's skip list (a backend is not user code): these two are traced
    traced = getattr(torch._dynamo, "dont_skip_tracing", None)
    if traced is None:
        _problems.append("torch._dynamo.dont_skip_tracing is missing (checked against torch 2.13)")
        return
    new_update, new_get_mask_sizes = traced(new_update), traced(new_get_mask_sizes)
    for new, old in ((new_update, update), (new_get_mask_sizes, mask_sizes)):
        _mark(new, old)
    cls.update, cls.get_mask_sizes = new_update, new_get_mask_sizes
    _applied.append("transformers.cache_utils.StaticSlidingWindowLayer.update/get_mask_sizes")


def _deferred_stop_check(module) -> None:
    """`generate()` reads `unfinished_sequences.max() == 0` after every token, so the host waits for each
    step. Transformers 5.25's `DeferredStopCheck` reads it one step late (non-blocking copy + event) so
    the host queues step t+1 while the device runs step t; 5.25 enables it on "mps" only. Enabled for
    tpu with the same cache conditions (asked of the original as "mps"), its host slots pinned (a copy
    to pageable memory waits, as on CUDA): compiled small-Llama decode 8-25% faster (RESULTS.md).
    CUDA never takes this path, and rolling the extra step back breaks for caches `generate()` returns
    from encoder-decoder models (`EncoderDecoderCache.crop` refuses static caches, `finish` reads
    `cache.layers`) and leaves layers that `record_past` (Mamba 2, dynamic sliding windows) as views
    with new strides (the next compiled step recompiles). A returned cache of those kinds is checked
    every token, as on CUDA; without a returned cache nothing is rolled back and the check defers."""
    cls = getattr(module, "DeferredStopCheck", None)
    if cls is None:
        return
    supported, init = cls.__dict__.get("is_supported"), cls.__dict__.get("__init__")
    if not isinstance(supported, staticmethod) or init is None:
        _problems.append(
            "transformers DeferredStopCheck.is_supported/__init__ changed shape (checked against transformers 5.25)"
        )
        return
    if getattr(supported.__func__, "_torchtpu", False):
        return
    original_supported = supported.__func__
    mps = torch.device("mps")  # a device name only: asks the original about the cache, never touches mps
    signature = inspect.signature(original_supported)

    def rollback_works(cache) -> bool:
        # finish() reads cache.layers, which encoder-decoder caches (and caches of other shapes) lack
        layers = getattr(cache, "layers", None)
        if layers is None or hasattr(cache, "self_attention_cache"):
            return False
        # a layer that must record its past to be rolled back (linear attention, dynamic sliding window)
        # leaves its states as views of wider tensors: new strides, so a compiled decode step recompiles
        return not any(hasattr(layer, "record_past") for layer in layers)

    def is_supported(device, *args, **kwargs):
        if getattr(device, "type", None) != "tpu":
            return original_supported(device, *args, **kwargs)
        bound = signature.bind(mps, *args, **kwargs).arguments
        cache = bound.get("cache")
        if cache is not None and bound.get("cache_is_returned", True) and not rollback_works(cache):
            return False
        return original_supported(mps, *args, **kwargs)

    def __init__(self, input_ids, *args, **kwargs):
        init(self, input_ids, *args, **kwargs)
        slots = getattr(self, "slots", None)
        if input_ids.device.type == "tpu" and slots is not None:
            self.slots = type(slots)(
                tuple(x.pin_memory() if isinstance(x, torch.Tensor) and x.device.type == "cpu" else x for x in slot)
                for slot in slots
            )

    _mark(is_supported, original_supported)
    _mark(__init__, init)
    cls.is_supported, cls.__init__ = staticmethod(is_supported), __init__
    _applied.append("transformers.generation.utils.DeferredStopCheck.is_supported/__init__")


# ------------------------------------------------------------------ storage moves (torch 2.13)
def _host_storage_moves() -> None:
    """PyTorch moves a whole storage (`storage.to("tpu")`, `.tpu()`, `.clone()`, `torch.load(...,
    map_location="tpu")`) by allocating through the device's C++ allocator, which a backend written in
    Python cannot provide. `torch.storage._to` and `UntypedStorage.clone` are wrapped to go through
    storage/host_storage.py for tpu storages (the original otherwise), `UntypedStorage.tpu` is added, and
    a serialization location "tpu" is registered."""
    from ..storage import host_storage

    storage_module = torch.storage
    original_to = getattr(storage_module, "_to", None)
    original_clone = getattr(torch.UntypedStorage, "clone", None)
    register_package = getattr(torch.serialization, "register_package", None)
    if not callable(original_to) or not callable(original_clone) or not callable(register_package):
        _problems.append(
            "torch.storage._to, torch.UntypedStorage.clone or torch.serialization.register_package "
            f"is missing (checked against torch {'..'.join(TORCH_CHECKED)})"
        )
        return
    if getattr(original_to, "_torchtpu", False):
        return

    def _to(self, device, non_blocking=False):
        device = torch.device(device)
        if device.type == "tpu":
            return host_storage.storage_to_tpu(self, device, non_blocking)
        return original_to(self, device, non_blocking)

    def clone(self):
        return host_storage.clone_tpu_storage(self) if self.device.type == "tpu" else original_clone(self)

    def tpu(self, device=None, non_blocking=False):
        return host_storage.storage_to_tpu(self, device, non_blocking)

    _mark(_to, original_to)
    _mark(clone, original_clone)
    tpu._torchtpu = True
    storage_module._to = _to
    torch.UntypedStorage.clone = clone
    torch.UntypedStorage.tpu = tpu
    register_package(1, lambda obj: None, host_storage.deserialize)
    _applied.append("torch.storage._to, torch.UntypedStorage.clone/.tpu, torch.serialization location 'tpu'")


# ------------------------------------------------------------------ storage constructor (torch 2.13)
def _without_native() -> bool:
    from ..device import native

    return not native.loaded()


def _storage_constructor() -> None:
    """Without the C++ extension PyTorch has no allocator for "tpu": `torch.UntypedStorage(8, device="tpu")`
    (and `torch.tpu.FloatStorage(n)`, `TypedStorage(..., device="tpu")`) would segfault. Such storages are
    allocated through the empty kernel (storage/legacy.py); everything else goes to PyTorch's."""
    from ..storage import legacy

    base_new = getattr(getattr(torch._C, "StorageBase", None), "__new__", None)
    if base_new is None:
        _problems.append("torch._C.StorageBase.__new__ is missing (checked against torch 2.13)")
        return
    if getattr(torch.UntypedStorage.__new__, "_torchtpu", False):
        return

    def __new__(cls, *args, **kwargs):
        device = kwargs.get("device")
        if legacy.is_tpu_device(device) and _without_native() and cls is torch.UntypedStorage:
            if kwargs.get("allocator") is not None:
                raise RuntimeError("UntypedStorage(): a custom allocator is not supported for tpu storages")
            return legacy.untyped_storage_on_tpu(base_new, args, device)
        return base_new(cls, *args, **kwargs)

    torch.UntypedStorage.__new__ = _mark(__new__, base_new)
    _applied.append("torch.UntypedStorage.__new__ (without the C++ extension)")


def _storage_methods() -> None:
    """UntypedStorage methods that would crash on a tpu storage: storage/storage_methods.py ON_TPU."""
    from ..storage.storage_methods import ON_TPU

    def for_tpu_storages(original, on_tpu):
        def method(self, *args):
            return on_tpu(original, self, *args) if self.device.type == "tpu" else original(self, *args)

        method.__name__ = original.__name__
        return _mark(method, original)

    for name, on_tpu in ON_TPU.items():
        original = getattr(torch.UntypedStorage, name, None)
        if original is None:
            _problems.append(f"torch.UntypedStorage.{name} is missing (checked against torch 2.13)")
        elif not getattr(original, "_torchtpu", False):
            setattr(torch.UntypedStorage, name, for_tpu_storages(original, on_tpu))
            _applied.append(f"torch.UntypedStorage.{name} (tpu storages)")


# ------------------------------------------------------------------ gradcheck (torch 2.13)
def _gradcheck_in_strict_mode(module) -> None:
    """`torch.autograd.gradcheck`'s `_gradcheck_helper` (checked against torch 2.13: `gradcheck` and, through
    it, `gradgradcheck` call it by its module-level name) runs in the strict eager mode when an input is a
    tpu tensor. Its reentrancy check computes the Jacobian twice, row by row in a loop, and compares the two
    bit for bit (`nondet_tol=0`); in the fused mode a repeated segment runs op by op for its first four runs
    and compiled from its fifth, and the compiled program rounds in the last bit unlike its ops one by one
    (XLA:CPU contracts one op's multiply and the next op's add into an FMA; an optimization barrier does
    not survive its pipeline), so the first rows of the first pass differed from the second pass's
    ("Backward is not reentrant"). In strict mode every run of an op is the same executable: the two passes
    are equal, as on the CPU."""
    helper = getattr(module, "_gradcheck_helper", None)
    if not callable(helper):
        _problems.append("torch.autograd.gradcheck._gradcheck_helper is missing (checked against torch 2.13)")
        return
    if getattr(helper, "_torchtpu", False):
        return
    from torch.utils._pytree import tree_leaves

    from ..eager import modes

    def _gradcheck_helper(*args, **kwargs):
        inputs = kwargs.get("inputs", args[1] if len(args) > 1 else ())
        on_tpu = any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in tree_leaves(inputs))
        if not on_tpu or modes.get_eager_mode() != "fused":
            return helper(*args, **kwargs)
        with modes.eager_mode("strict"):
            return helper(*args, **kwargs)

    module._gradcheck_helper = _mark(_gradcheck_helper, helper)
    _applied.append("torch.autograd.gradcheck._gradcheck_helper (strict eager mode for tpu inputs)")


# ------------------------------------------------------------------ Pallas (jax 0.10)
def _pallas_calls_in_32_bits(module) -> None:
    """`pl.pallas_call(...)` builds its callable with the private `_pallas_call` (checked against jax 0.10);
    it is wrapped so that ops/pallas_support.py's `pallas_calls_in_32_bits()` block traces the kernels
    built inside it with x64 off (Mosaic has no 64-bit integers). Outside that block it is the original."""
    from ..ops import pallas_support

    build = getattr(module, "_pallas_call", None)
    if not callable(build):
        _problems.append("jax._src.pallas.pallas_call._pallas_call is missing (checked against jax 0.10)")
        return
    if getattr(build, "_torchtpu", False):
        return
    module._pallas_call = _mark(pallas_support.in_32_bits_when_asked(build), build)
    _applied.append("jax._src.pallas.pallas_call._pallas_call")


# ------------------------------------------------------------------ MLIR contexts (jax 0.10)
CONTEXT_MODULES = 256  # modules lowered per MLIR context; what a context interns is freed with it


def _reused_mlir_contexts(module) -> None:
    """JAX lowers each module in a new MLIR context (`ModuleContext(context=None)`: ~4.5 ms of CPU to make
    and first use, most of a small executable's lowering). A module lowered without a context given takes
    its thread's, made anew every CONTEXT_MODULES modules (types and constant attributes stay interned
    while a context lives); a module keeps its own context alive. Same IR, same cache keys."""
    cls, make = getattr(module, "ModuleContext", None), getattr(module, "make_ir_context", None)
    init = getattr(cls, "__init__", None)
    if make is None or init is None or "context" not in inspect.signature(init).parameters:
        _problems.append("jax._src.interpreters.mlir.ModuleContext(context=) is missing (checked against jax 0.10)")
        return
    if getattr(init, "_torchtpu", False):
        return
    local = threading.local()

    def __init__(self, *args, context=None, **kwargs):
        if context is None:
            uses = getattr(local, "uses", 0)
            if uses % CONTEXT_MODULES == 0:
                local.context = make()
            local.uses = uses + 1
            context = local.context
        init(self, *args, context=context, **kwargs)

    cls.__init__ = _mark(__init__, init)
    _applied.append("jax._src.interpreters.mlir.ModuleContext.__init__ (reused MLIR contexts)")


# ------------------------------------------------------------------ JAX's on-disk cache (jax 0.10)
def _compile_cache_bypass(module) -> None:
    """`compilation_cache.is_cache_used(backend)` (checked against jax 0.10: `compiler.compile_or_get_cached`
    asks it per compile) answers False inside eager/op_store.py's `fresh_compile()` block, so the op-key
    cache stores a program compiled afresh: on XLA:CPU an executable JAX loaded from its own cache and
    serialized again fails when run ("Function ... not found"). Outside that block it is the original."""
    from ..eager import op_store

    used = getattr(module, "is_cache_used", None)
    if not callable(used):
        _problems.append("jax._src.compilation_cache.is_cache_used is missing (checked against jax 0.10)")
        return
    if getattr(used, "_torchtpu", False):
        op_store.BYPASS_INSTALLED[0] = True
        return

    def is_cache_used(backend):
        return False if op_store.compiling_fresh() else used(backend)

    module.is_cache_used = _mark(is_cache_used, used)
    op_store.BYPASS_INSTALLED[0] = True
    _applied.append("jax._src.compilation_cache.is_cache_used (the op-key cache's fresh compiles)")


# ------------------------------------------------------------------ printing (torch 2.13)
PRINT_FROM_HOST_BYTES = 1 << 24  # a tpu tensor of at most this many bytes is printed from a host copy


def _print_from_host(module) -> None:
    """`torch._tensor_str._tensor_str(self, indent)` (checked against torch 2.13: `_str_intern` calls it by
    its module-level name for a dense tensor's contents) formats a tpu tensor of at most
    PRINT_FROM_HOST_BYTES from a host copy, as PyTorch itself does for its xla, lazy, ipu and mtia devices.
    Its `_Formatter` runs isfinite, ne, masked_select, abs, min, max and a 0-dim ceil per element on the
    tensor: on tpu a dozen programs for each new shape (a cold compile each; masked_select's is keyed on
    its count too), where PyTorch's test files print every small input and result into their messages
    (test_binary_ufuncs' `_test_reference_numerics`). The copy prints what the CPU prints for the same
    values; the suffixes (device, dtype, grad_fn) are still `_str_intern`'s, read from the tpu tensor."""
    original = getattr(module, "_tensor_str", None)
    if not callable(original) or list(inspect.signature(original).parameters) != ["self", "indent"]:
        _problems.append("torch._tensor_str._tensor_str(self, indent) is missing (checked against torch 2.13)")
        return
    if getattr(original, "_torchtpu", False):
        return

    def _tensor_str(self, indent):
        if (
            self.device.type == "tpu"
            and self.layout == torch.strided
            and type(self) in (torch.Tensor, torch.nn.Parameter)
            and self.numel() * self.element_size() <= PRINT_FROM_HOST_BYTES
        ):
            self = _host_copy(self.detach())
        return original(self, indent)

    def _host_copy(t):
        # a conjugate or negative view is copied as its storage's values and viewed alike on the host (a
        # copy of the view itself would resolve the bit in a program on the device)
        conj, neg = t.is_conj(), t.is_neg()
        if conj:
            t = t.conj()
        if neg:
            t = torch._neg_view(t)
        t = t.to("cpu")
        if neg:
            t = torch._neg_view(t)
        return t.conj() if conj else t

    module._tensor_str = _mark(_tensor_str, original)
    _applied.append("torch._tensor_str._tensor_str (tpu tensors printed from a host copy)")


# ------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Patch:
    """One row of PATCHES: `apply` changes `marker` (a dotted name whose object then carries `_torchtpu`),
    checked against releases `checked[0]` .. `checked[1]` (major.minor, both included) of `library`;
    `module` names the module whose import applies it (None: `install()`); `needed`: does this process need it."""

    apply: Callable
    library: str
    checked: tuple[str, str]
    marker: str
    module: str | None = None
    needed: Callable[[], bool] | None = None


# one patch per row or two, so the table reads as a table
# fmt: off
PATCHES: tuple[Patch, ...] = (
    Patch(_patch_accelerator, "torch", TORCH_CHECKED, "torch._C._accelerator_emptyCache"),
    Patch(_dataloader_pinning, "torch", TORCH_CHECKED, "torch.utils.data.dataloader._BaseDataLoaderIter.__init__"),
    Patch(_default_backend_for_tpu, "torch", TORCH_CHECKED, "torch._TorchCompileInductorWrapper.__call__"),
    Patch(_profiler_trace_window, "torch", TORCH_CHECKED, "torch.profiler.profiler._KinetoProfile.start_trace"),
    Patch(_host_storage_moves, "torch", TORCH_CHECKED, "torch.UntypedStorage.clone"),
    Patch(_storage_constructor, "torch", TORCH_CHECKED, "torch.UntypedStorage.__new__", needed=_without_native),
    Patch(_storage_methods, "torch", TORCH_CHECKED, "torch.UntypedStorage._byteswap"),
    Patch(_print_from_host, "torch", TORCH_CHECKED, "torch._tensor_str._tensor_str", "torch._tensor_str"),
    Patch(_gradcheck_in_strict_mode, "torch", TORCH_CHECKED,
          "torch.autograd.gradcheck._gradcheck_helper", "torch.autograd.gradcheck"),
    Patch(_pallas_calls_in_32_bits, "jax", JAX_CHECKED,
          "jax._src.pallas.pallas_call._pallas_call", "jax._src.pallas.pallas_call"),
    Patch(_reused_mlir_contexts, "jax", JAX_CHECKED,
          "jax._src.interpreters.mlir.ModuleContext.__init__", "jax._src.interpreters.mlir"),
    Patch(_compile_cache_bypass, "jax", JAX_CHECKED,
          "jax._src.compilation_cache.is_cache_used", "jax._src.compilation_cache"),
    Patch(_accelerate_default_device, "accelerate", ACCELERATE_CHECKED,
          "accelerate.state.PartialState.default_device", "accelerate.state"),
    Patch(_accelerate_data_parallel, "accelerate", ACCELERATE_CHECKED,
          "accelerate.state.PartialState.set_device", "accelerate.state"),
    Patch(_accelerate_ddp, "accelerate", ACCELERATE_CHECKED,
          "accelerate.accelerator.Accelerator.prepare_model", "accelerate.accelerator"),
    Patch(_sliding_window_decode, "transformers", TRANSFORMERS_CHECKED,
          "transformers.modeling_utils.PreTrainedModel.get_compiled_call", "transformers.modeling_utils"),
    Patch(_sliding_window_layer, "transformers", TRANSFORMERS_CHECKED,
          "transformers.cache_utils.StaticSlidingWindowLayer.update", "transformers.cache_utils"),
    # DeferredStopCheck is new in 5.25: on 5.24 there is nothing to patch (and nothing is reported)
    Patch(_deferred_stop_check, "transformers", ("5.25", "5.25"),
          "transformers.generation.utils.DeferredStopCheck.is_supported", "transformers.generation.utils"),
)
# fmt: on

_warned_libraries: set[str] = set()


def _release(version: str) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def installed_version(library: str) -> str | None:
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return None


def in_checked_range(version: str | None, checked: tuple[str, str]) -> bool:
    release = _release(version or "")
    return release is not None and _release(checked[0]) <= release <= _release(checked[1])


def _warn_outside_range(patch: Patch) -> None:
    version = installed_version(patch.library)
    if in_checked_range(version, patch.checked) or patch.library in _warned_libraries:
        return
    _warned_libraries.add(patch.library)
    rows = [f"{p.marker} ({p.checked[0]}..{p.checked[1]})" for p in PATCHES if p.library == patch.library]
    warnings.warn(
        f"torchtpu: {patch.library} {version} is outside the releases torchtpu's patches of it were "
        f"checked against: {', '.join(rows)}. They are applied where their targets exist; "
        "torchtpu.integrations.patches.problems() lists those that could not be.",
        stacklevel=3,
    )


def _run(patch: Patch, *module) -> None:
    """Apply one patch: warn (once per library) outside its checked releases, and turn a target that is
    gone or an exception into a problem and a warning, never an error while a library imports."""
    if patch.needed is not None and not patch.needed():
        return
    _warn_outside_range(patch)
    known = len(_problems)
    try:
        patch.apply(*module)
    except Exception as e:  # noqa: BLE001 - a patch must never break the import of the library it patches
        _problems.append(f"{patch.marker}: the patch failed with {type(e).__name__}: {e}")
    for problem in _problems[known:]:
        warnings.warn(
            f"torchtpu: not patched: {problem} (installed: {patch.library} {installed_version(patch.library)})",
            stacklevel=3,
        )


def install() -> None:
    """Idempotent and cheap: imports none of the patched libraries that are not loaded yet."""
    if _installed[0]:
        return
    _installed[0] = True
    for patch in PATCHES:
        if patch.module is None:
            _run(patch)
        else:
            when_imported(patch.module, functools.partial(_run, patch))


def applied() -> list[str]:
    run_finished()
    return list(_applied)


def problems() -> list[str]:
    """Patches that could not be applied because their target changed (empty when all is well)."""
    run_finished()
    return list(_problems)


def table() -> list[tuple[str, str, str, str]]:
    """(library, oldest, newest checked release, what is patched): the rows docs/transformers.md lists."""
    return [(p.library, p.checked[0], p.checked[1], p.marker) for p in PATCHES]
