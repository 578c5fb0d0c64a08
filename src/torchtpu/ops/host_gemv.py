"""bfloat16 matrix-vector products on XLA:CPU through a C++ kernel (csrc/host_gemv.cpp, an XLA FFI custom call).

A batch-1 decode step's nn.Linear is x (1..4 rows) @ W.T with a bf16 weight. XLA:CPU's bf16 dot (YNNPACK,
given a zero row: linalg._host_half_matmul) prepares the whole weight at every call; the kernel streams
W once with AVX512-BF16 dot products accumulated in float32, split over XLA's intra-op threads. Qwen3-0.6B's
LM head (1x1024 by 151936x1024): 26 ms of CPU against YNNPACK's 38 (benchmarks/RESULTS.md).

Only where it helps and exists: traced for XLA:CPU (never for a TPU, whose bf16 dots are native), a CPU
with AVX512-BF16, the C++ library built (device/native.py; TORCHTPU_NATIVE=off: never), a weight of
`MIN_WEIGHT_ELEMENTS` or more. Elsewhere the product is XLA's dot, as before.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import pathlib

import jax
import jax.numpy as jnp

log = logging.getLogger(__name__)

_SOURCE = pathlib.Path(__file__).with_name("csrc") / "host_gemv.cpp"
_TARGET = "torchtpu_bf16_gemv"
_ABI = 1
MAX_ROWS = 4  # the kernel's register blocking (csrc/host_gemv.cpp: rows<M>)
# a smaller weight is a fraction of a microsecond's work either way: XLA's dot, fused with its neighbours
MIN_WEIGHT_ELEMENTS = 1 << 16


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether the kernel is registered with XLA:CPU (built once per machine, then loaded)."""
    from .. import config
    from ..device import native

    if config.get("TORCHTPU_NATIVE") == "off" or native.compiler() is None:
        return False
    try:
        include = f"-isystem{jax.ffi.include_dir()}"
        lib = ctypes.CDLL(str(native.build((_SOURCE,), "tpu_host_gemv", flags=("-O3", include))))
        if lib.torchtpu_host_gemv_abi() != _ABI or not lib.torchtpu_host_gemv_supported():
            return False
        jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(lib.TorchtpuBf16Gemv), platform="cpu")
    except Exception as e:  # noqa: BLE001 - no kernel: XLA's dot, as without it
        log.debug("torchtpu: the host bf16 GEMV is not available: %s", e)
        return False
    return True


def eligible(a, w) -> bool:
    """Whether a (..., K) @ w (N, K).T runs in the kernel (the caller traces for XLA:CPU)."""
    rows = math.prod(a.shape[:-1])
    return (
        a.dtype == jnp.bfloat16
        and w.dtype == jnp.bfloat16
        and w.ndim == 2
        and a.shape[-1] == w.shape[1]
        and 1 <= rows <= MAX_ROWS
        and w.size >= MIN_WEIGHT_ELEMENTS
        and available()
    )


def product(a, w):
    """a (..., K) @ w (N, K).T in float32 (the kernel's accumulator)."""
    x = a.reshape(-1, a.shape[-1])
    out = jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), jnp.float32))(x, w)
    return out.reshape(*a.shape[:-1], w.shape[0])
