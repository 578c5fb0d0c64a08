"""The per-device default generator: a seed and a counter (Philox-style, like CUDA's).

Each random op takes the next counter value; the executable derives its PRNG key from
(seed, counter) on the device, so drawing numbers costs no extra dispatch and never recompiles.
"""
from __future__ import annotations

import random as _pyrandom

import numpy as np
import torch

_DEFAULT_SEED = 67280421310721  # PyTorch's default_rng_seed_val


class GeneratorState:
    __slots__ = ("seed", "offset")

    def __init__(self, seed=_DEFAULT_SEED):
        self.seed = seed
        self.offset = 0


_states: dict[int, GeneratorState] = {}


def state(device_index: int) -> GeneratorState:
    s = _states.get(device_index)
    if s is None:
        s = _states[device_index] = GeneratorState()
    return s


def next_rng_args(device_index: int):
    s = _states.get(device_index) or state(device_index)
    offset = s.offset
    s.offset += 1
    return np.array([s.seed & 0xFFFFFFFF, s.seed >> 32, offset & 0xFFFFFFFF], dtype=np.uint32)


def manual_seed(seed: int, device_index: int):
    s = state(device_index)
    s.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    s.offset = 0


def seed(device_index: int) -> int:
    value = _pyrandom.getrandbits(63)
    manual_seed(value, device_index)
    return value


def initial_seed(device_index: int) -> int:
    return state(device_index).seed


def get_rng_state(device_index: int) -> torch.Tensor:
    s = state(device_index)
    return torch.tensor([s.seed, s.offset], dtype=torch.int64).view(torch.uint8)


def set_rng_state(new_state: torch.Tensor, device_index: int):
    values = new_state.detach().cpu().contiguous().view(torch.int64)
    s = state(device_index)
    s.seed, s.offset = int(values[0]), int(values[1])


def generator_rng_args(gen: torch.Generator):
    """(seed lo, seed hi, 0) drawn from a CPU generator, for a random op given `generator=`."""
    seed = int(torch.randint(0, 2**63 - 1, (1,), generator=gen))
    return np.array([seed & 0xFFFFFFFF, seed >> 32, 0], dtype=np.uint32)
