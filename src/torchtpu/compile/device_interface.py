"""Dynamo's device interface for "tpu" (`torch._dynamo.device_interface`).

Dynamo and Inductor look a device up here to trace streams and events, query properties and
dtype support, and in generic code such as activation checkpointing and FSDP2 under
torch.compile. torch 2.13 ships a `TpuInterface` of its own, written for Google's torch_tpu
package: it reports the device unavailable unless that package is installed, device 0 only and
no float64. Ours answers from the runtime, and replaces it once Dynamo registers its defaults.
"""

from __future__ import annotations

import torch

from ..device import platform
from ..eager import device_module as tpu
from ..ops.dtypes import TO_JAX

_EMULATED_ON_TPU_CHIPS = (torch.float64, torch.complex128)


def _interface_base():
    from torch._dynamo.device_interface import DeviceInterface

    return DeviceInterface


def make_interface():
    """Built on first use: DeviceInterface lives in torch._dynamo, which `import torch` skips."""
    base = _interface_base()

    class TpuDeviceInterface(base):
        device = tpu.device
        Event = tpu.Event
        Stream = tpu.Stream

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                tpu.set_device(device)

            @staticmethod
            def current_device() -> int:
                return tpu.current_device()

            @staticmethod
            def get_device_properties(device=None):
                return tpu.get_device_properties(device)

        current_device = staticmethod(tpu.current_device)
        set_device = staticmethod(tpu.set_device)
        device_count = staticmethod(tpu.device_count)
        is_available = staticmethod(tpu.is_available)
        stream = staticmethod(tpu.stream)
        current_stream = staticmethod(tpu.current_stream)
        set_stream = staticmethod(tpu.set_stream)
        synchronize = staticmethod(tpu.synchronize)
        memory_allocated = staticmethod(tpu.memory_allocated)
        get_compute_capability = staticmethod(tpu.get_device_capability)

        @staticmethod
        def exchange_device(device: int) -> int:
            previous = tpu.current_device()
            if device >= 0 and device != previous:
                tpu.set_device(device)
            return previous

        maybe_exchange_device = exchange_device

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            # one in-order queue per device: selecting a stream selects nothing but its device
            tpu.set_stream(tpu.Stream(device_index))

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return tpu.current_stream(device_idx).stream_id

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True

        @classmethod
        def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
            if dtype not in TO_JAX:
                return False
            # TPU chips have no 64-bit floating point units; XLA emulates them slowly.
            if dtype in _EMULATED_ON_TPU_CHIPS and platform.platform() == "tpu":
                return including_emulation
            return True

    TpuDeviceInterface.__name__ = TpuDeviceInterface.__qualname__ = "TpuDeviceInterface"
    return TpuDeviceInterface


def register(device_interface_module) -> None:
    """Called when torch._dynamo.device_interface is imported: let Dynamo register its defaults
    first (its one-time initialisation would put torch's own TpuInterface back), then ours."""
    device_interface_module.get_registered_device_interfaces()
    device_interface_module.register_interface_for_device("tpu", make_interface())
