"""The device generators: a seed and a counter (Philox-style, like CUDA's).

Each random op takes the generator's next counter value (`offset`); the executable derives its PRNG
key from (seed, offset) on the device, so drawing numbers costs no extra dispatch and never
recompiles.

With torchtpu's C++ extension loaded (device/native.py) the state lives in C++ `GeneratorImpl`s:
`torch.Generator("tpu")` makes one, and the default generator of each device is the one PyTorch's
`getDefaultGenerator` returns, wrapped once as a Python `torch.Generator`
(`torch.tpu.default_generators`). Without it, each device's default state is a `HostGenerator`
with the same methods, so seeding and random ops work the same; only `torch.Generator("tpu")`
and `default_generators` are missing.

State layout (get_rng_state/set_rng_state, Generator.get_state/set_state): CUDA's 16 bytes, the
seed (uint64) then the offset (int64).
"""

from __future__ import annotations

import random as _pyrandom

import numpy as np
import torch

from ..device import native

_DEFAULT_SEED = 67280421310721  # PyTorch's default_rng_seed_val
_STATE_BYTES = 16


class HostGenerator:
    """A device's default generator state kept in Python (no C++ extension): the subset of
    `torch.Generator`'s methods the device uses."""

    __slots__ = ("_offset", "_seed", "device")

    def __init__(self, index: int):
        self._seed = _DEFAULT_SEED
        self._offset = 0
        self.device = torch.device("tpu", index)

    def initial_seed(self) -> int:
        return self._seed

    def manual_seed(self, seed):
        self._seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        self._offset = 0
        return self

    def seed(self) -> int:
        value = _pyrandom.getrandbits(64)
        self.manual_seed(value)
        return value

    def get_offset(self) -> int:
        return self._offset

    def set_offset(self, offset: int):
        self._offset = int(offset)
        return self

    def get_state(self) -> torch.Tensor:
        raw = np.array([self._seed], np.uint64).tobytes() + np.array([self._offset], np.int64).tobytes()
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8)

    def set_state(self, new_state: torch.Tensor):
        if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 or new_state.device.type != "cpu":
            raise TypeError("RNG state must be a torch.ByteTensor on the CPU")
        if new_state.numel() != _STATE_BYTES:
            raise RuntimeError(
                f"RNG state is wrong size: expected {_STATE_BYTES} bytes (seed, offset) for a "
                f"tpu generator, got {new_state.numel()}"
            )
        raw = new_state.contiguous().numpy().tobytes()
        offset = int(np.frombuffer(raw[8:], np.int64)[0])
        if offset < 0:
            raise RuntimeError(f"RNG state has a negative offset: {offset}")
        self._seed = int(np.frombuffer(raw[:8], np.uint64)[0])
        self._offset = offset
        return self


_defaults: dict[int, object] = {}


def default(device_index: int):
    """The default generator of tpu:device_index (a torch.Generator, or a HostGenerator)."""
    g = _defaults.get(device_index)
    if g is None:
        g = native.new_default_generator(device_index) if native.generators_available() else HostGenerator(device_index)
        g = _defaults.setdefault(device_index, g)
    return g


def _draw(g):
    """The (seed lo, seed hi, counter) of the next draw from `g`, which advances by one."""
    seed = g.initial_seed()
    offset = g.get_offset()
    g.set_offset(offset + 1)
    return np.array([seed & 0xFFFFFFFF, seed >> 32, offset & 0xFFFFFFFF], dtype=np.uint32)


def is_draw_key(value) -> bool:
    """Whether a random op's traced value is the key of its draw (`_draw`, `generator_rng_args`)."""
    return type(value) is np.ndarray and value.dtype == np.uint32 and value.shape == (3,)


def next_rng_args(device_index: int):
    return _draw(_defaults.get(device_index) or default(device_index))


def manual_seed(seed: int, device_index: int):
    default(device_index).manual_seed(int(seed))


def seed(device_index: int) -> int:
    return default(device_index).seed()


def initial_seed(device_index: int) -> int:
    return default(device_index).initial_seed()


def get_rng_state(device_index: int) -> torch.Tensor:
    return default(device_index).get_state()


def set_rng_state(new_state: torch.Tensor, device_index: int):
    if not isinstance(new_state, torch.Tensor):
        raise TypeError(f"expected a torch.ByteTensor as the RNG state, got {type(new_state).__name__}")
    default(device_index).set_state(new_state.detach().to("cpu").contiguous())


def generator_rng_args(gen: torch.Generator):
    """The draw of a random op given `generator=`: a tpu generator advances like the default one; a
    CPU generator seeds this draw instead ((seed lo, seed hi, 0) from its next random number)."""
    if gen.device.type == "tpu":
        return _draw(gen)
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=gen))
    return np.array([seed & 0xFFFFFFFF, seed >> 32, 0], dtype=np.uint32)
