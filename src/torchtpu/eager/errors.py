"""PyTorch's exception types for failures XLA reports as its own.

XLA reports an allocation it cannot make as `jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: ...`;
PyTorch code (training loops that halve the batch, accelerate's `find_executable_batch_size`,
Transformers' generation fallbacks) catches `torch.OutOfMemoryError`, as CUDA raises it.
"""

from __future__ import annotations

import torch


def raise_out_of_memory(error: BaseException):
    """Inside `except`: raise torch.OutOfMemoryError (a RuntimeError) for XLA's out-of-memory error;
    return for any other error (the caller re-raises it)."""
    message = str(error)
    if "RESOURCE_EXHAUSTED" in message or "Out of memory" in message:
        first = message.strip().splitlines()[0] if message.strip() else "RESOURCE_EXHAUSTED"
        raise torch.OutOfMemoryError(f"tpu out of memory: {first}") from error
