"""The public `torch.tpu` package: one sorted declaration of its surface, on top of every layer.

`PUBLIC` maps each public name to the internal object behind it ("module:attribute"), resolved on
first access so `import torch` stays fast; `SUBMODULES` maps each `torch.tpu.<sub>` to the internal
module that backs it (its `__all__` is the public surface). Nothing else is visible: `dir()` and
`__all__` list exactly these names, and a name that is not declared raises AttributeError. PyTorch's
generic code reaches a few private hooks of device modules (`_is_in_bad_fork`, ...); underscore names
are served from the device layer without being listed. `eager_mode` is a property (TorchTPU's form).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

_DEVICE = "torchtpu.eager.device_module"
_FACADE = "torchtpu.api.tpu"

# name -> "module:attribute" (keep sorted; tests/test_api.py checks the order and TorchTPU parity)
PUBLIC: dict[str, str] = {
    "BFloat16Storage": "torchtpu.storage.legacy:BFloat16Storage",
    "BoolStorage": "torchtpu.storage.legacy:BoolStorage",
    "ByteStorage": "torchtpu.storage.legacy:ByteStorage",
    "CharStorage": "torchtpu.storage.legacy:CharStorage",
    "ComplexDoubleStorage": "torchtpu.storage.legacy:ComplexDoubleStorage",
    "ComplexFloatStorage": "torchtpu.storage.legacy:ComplexFloatStorage",
    "DoubleStorage": "torchtpu.storage.legacy:DoubleStorage",
    "EagerMode": "torchtpu.eager.modes:EagerMode",
    "Event": f"{_DEVICE}:Event",
    "FloatStorage": "torchtpu.storage.legacy:FloatStorage",
    "HalfStorage": "torchtpu.storage.legacy:HalfStorage",
    "IntStorage": "torchtpu.storage.legacy:IntStorage",
    "LongStorage": "torchtpu.storage.legacy:LongStorage",
    "Precision": f"{_FACADE}:Precision",
    "ShortStorage": "torchtpu.storage.legacy:ShortStorage",
    "Stream": f"{_DEVICE}:Stream",
    "clear_device_assert": f"{_DEVICE}:clear_device_assert",
    "current_device": f"{_DEVICE}:current_device",
    "current_stream": f"{_DEVICE}:current_stream",
    "default_generators": f"{_DEVICE}:default_generators",
    "default_stream": f"{_DEVICE}:default_stream",
    "device": f"{_DEVICE}:device",
    "device_count": f"{_DEVICE}:device_count",
    "device_of": f"{_FACADE}:device_of",
    "empty_cache": f"{_DEVICE}:empty_cache",
    "get_amp_supported_dtype": f"{_DEVICE}:get_amp_supported_dtype",
    "get_device_capability": f"{_DEVICE}:get_device_capability",
    "get_device_name": f"{_DEVICE}:get_device_name",
    "get_device_properties": f"{_DEVICE}:get_device_properties",
    "get_eager_mode": "torchtpu.eager.modes:get_eager_mode",
    "get_rng_state": f"{_DEVICE}:get_rng_state",
    "get_rng_state_all": f"{_DEVICE}:get_rng_state_all",
    "init": f"{_DEVICE}:init",
    "initial_seed": f"{_DEVICE}:initial_seed",
    "is_available": f"{_DEVICE}:is_available",
    "is_bf16_supported": f"{_DEVICE}:is_bf16_supported",
    "is_initialized": f"{_DEVICE}:is_initialized",
    "manual_seed": f"{_DEVICE}:manual_seed",
    "manual_seed_all": f"{_DEVICE}:manual_seed_all",
    "max_memory_allocated": f"{_DEVICE}:max_memory_allocated",
    "max_memory_reserved": f"{_DEVICE}:max_memory_reserved",
    "mem_get_info": f"{_DEVICE}:mem_get_info",
    "memory_allocated": f"{_DEVICE}:memory_allocated",
    "memory_reserved": f"{_DEVICE}:memory_reserved",
    "memory_stats": f"{_DEVICE}:memory_stats",
    "platform": f"{_DEVICE}:platform",
    "precision": f"{_FACADE}:precision",
    "reset_accumulated_memory_stats": f"{_DEVICE}:reset_accumulated_memory_stats",
    "reset_max_memory_allocated": f"{_DEVICE}:reset_max_memory_allocated",
    "reset_peak_memory_stats": f"{_DEVICE}:reset_peak_memory_stats",
    "seed": f"{_DEVICE}:seed",
    "seed_all": f"{_DEVICE}:seed_all",
    "set_device": f"{_DEVICE}:set_device",
    "set_eager_mode": "torchtpu.eager.modes:set_eager_mode",
    "set_rng_state": f"{_DEVICE}:set_rng_state",
    "set_rng_state_all": f"{_DEVICE}:set_rng_state_all",
    "set_stream": f"{_DEVICE}:set_stream",
    "stream": f"{_DEVICE}:stream",
    "synchronize": f"{_DEVICE}:synchronize",
    "topology_aware_mesh": "torchtpu.distributed.api:topology_aware_mesh",
}

PROPERTIES = ("allow_excess_precision", "eager_mode")

# torch.tpu.<name> -> the internal module behind it (owned by the helper that wrote it)
SUBMODULES: dict[str, str] = {
    "compiler": "torchtpu.compile.options",
    "distributed": "torchtpu.distributed.api",
    "ops": "torchtpu.kernels.ops",
    "optimizers": "torchtpu.optim",
    "pallas": "torchtpu.kernels.pallas",
    "profiler": "torchtpu.profiling",
}


def _resolve(target: str):
    module, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise ImportError(f"torch.tpu: {module} is not part of this torchtpu installation") from e
        raise
    return getattr(obj, attr)


class TpuModule(types.ModuleType):
    """The type of `torch.tpu`: lazy attributes, and `eager_mode` as a property."""

    @property
    def allow_excess_precision(self) -> bool:
        """Whether XLA may compute in a wider type than the program's (TorchTPU's property; maps to
        XLA's xla_allow_excess_precision for every executable built after a change)."""
        from ..compile import options

        return options.get_allow_excess_precision()

    @allow_excess_precision.setter
    def allow_excess_precision(self, value: bool):
        from ..compile import options

        options.set_allow_excess_precision(value)

    @property
    def eager_mode(self):
        from ..eager import modes

        return modes.current_enum()

    @eager_mode.setter
    def eager_mode(self, mode):
        from ..eager import modes

        modes.set_eager_mode(mode)

    def __getattr__(self, name):
        target = PUBLIC.get(name)
        if target is not None:
            try:
                value = _resolve(target)
            except ImportError as e:
                raise AttributeError(f"torch.tpu.{name} is unavailable: {e}") from e
            setattr(self, name, value)
            return value
        if name in SUBMODULES:
            return importlib.import_module(f"torch.tpu.{name}")
        if name.startswith("_") and not name.startswith("__"):
            device = importlib.import_module(_DEVICE)
            if hasattr(device, name):
                return getattr(device, name)
        raise AttributeError(f"module 'torch.tpu' has no attribute '{name}'")

    def __setattr__(self, name, value):
        if name in PROPERTIES:  # the property's setter, never a silent replacement
            return object.__setattr__(self, name, value)
        super().__setattr__(name, value)

    def __dir__(self):
        return list(self.__all__)


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes `import torch.tpu.pallas` (and friends) work, resolving the backing module lazily."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, sub = fullname.rpartition(".")
        if prefix != "torch.tpu" or sub not in SUBMODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        sub = spec.name.rpartition(".")[2]
        backing = SUBMODULES[sub]
        try:
            internal = importlib.import_module(backing)
        except ModuleNotFoundError as e:
            if e.name and backing.startswith(e.name):
                raise ImportError(
                    f"{spec.name} needs {backing}, which this torchtpu installation does not include", name=spec.name
                ) from e
            raise
        names = getattr(internal, "__all__", None)
        if names is None:
            raise ImportError(f"{backing} declares no __all__: its public surface is undefined")
        public = types.ModuleType(spec.name, internal.__doc__)
        for n in names:
            setattr(public, n, getattr(internal, n))
        public.__all__ = sorted(names)
        return public

    def exec_module(self, module):
        parent = sys.modules.get("torch.tpu")
        if parent is not None:
            setattr(parent, module.__name__.rpartition(".")[2], module)


def build() -> TpuModule:
    module = TpuModule(
        "torch.tpu",
        "The \"tpu\" device (torchtpu): CUDA's names where we offer the same thing, TorchTPU's where it defines them.",
    )
    module.__all__ = sorted(set(PUBLIC) | set(PROPERTIES) | set(SUBMODULES))
    module.__path__ = []  # a package: torch.tpu.<sub> imports go through _SubmoduleFinder
    module.__package__ = "torch.tpu"
    return module


_installed = [None]


def install():
    """Register `torch.tpu` (once): the device module PyTorch's generic code asks for."""
    if _installed[0] is not None:
        return _installed[0]
    import torch

    module = _installed[0] = build()
    if not any(isinstance(f, _SubmoduleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _SubmoduleFinder())
    torch._register_device_module("tpu", module)
    sys.modules["torch.tpu"] = module
    return module
