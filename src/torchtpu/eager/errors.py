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


# A tpu storage holds a JAX array in its tensor's shape, and JAX's arrays (numpy's shapes) have at most
# 64 dimensions. Where the CPU computes with more (elementwise ops, copies, random fills), tpu raises a
# RuntimeError naming the limit, as CUDA does past its own (25 dims where dimensions do not coalesce),
# instead of numpy's "maximum supported dimension for an ndarray" or DLPack's "maxdims" from inside.
MAX_DIMS = 64


def too_many_dims(name: str, tensors) -> RuntimeError | None:
    """The RuntimeError for op `name` when a tensor of `tensors` (nested lists allowed) has more
    dimensions than a tpu array can, else None."""
    dims = max((t.dim() for t in _tensors(tensors)), default=0)
    if dims <= MAX_DIMS:
        return None
    return RuntimeError(
        f"torchtpu: {name}: tpu tensors have at most {MAX_DIMS} dimensions (XLA's array rank limit "
        f"through JAX), got a tensor with {dims}"
    )


def _tensors(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)
