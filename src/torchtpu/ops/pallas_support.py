"""What Pallas kernels need to run under torchtpu: 32-bit index arithmetic, and a host implementation.

- Mosaic (Pallas' TPU compiler) has no 64-bit integers. With `jax_enable_x64` on (torchtpu turns it on:
  PyTorch's default integer is int64) every Python int a kernel or a BlockSpec index map meets becomes an
  int64 constant, and the kernel fails to compile for TPU ("'arith.muli' op requires the same type for
  all operands", "failed to legalize operation 'func.return'"). `kernel_tracing()` traces with x64 off,
  which is what a Pallas TPU kernel is written for; `pallas_calls_in_32_bits()` does that for every
  `pl.pallas_call` made while it is active (jax_op wraps the functions it traces in it), whatever the
  process's x64 setting.
- XLA:CPU has no Pallas compiler: `enable_interpret_on_cpu()` registers a "cpu" lowering of `pallas_call`
  that runs the kernel through Pallas' HLO interpreter, so TPU kernels run (slowly, exactly) on the host.
  TPU and GPU keep their native lowerings.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import jax

_state = threading.local()
_interpret_ready = [False]


def kernel_tracing():
    """Trace a Pallas TPU kernel (its body and index maps) with 32-bit Python ints."""
    return jax.enable_x64(False)


def enable_interpret_on_cpu():
    """Register the host lowering of `pallas_call` (idempotent)."""
    if _interpret_ready[0]:
        return
    _interpret_ready[0] = True
    try:
        from jax._src.interpreters import mlir
        from jax._src.pallas import hlo_interpreter
        from jax._src.pallas.pallas_call import pallas_call_p
    except ImportError:  # a JAX without Pallas: nothing to enable
        return

    def cpu_lowering(ctx, *in_nodes, interpret=False, **params):
        impl = functools.partial(hlo_interpreter.pallas_call_hlo_interpret, **params)
        return mlir.lower_fun(impl, multiple_results=True)(ctx, *in_nodes)

    mlir.register_lowering(pallas_call_p, cpu_lowering, platform="cpu")


@contextlib.contextmanager
def pallas_calls_in_32_bits():
    """While active (in this thread), a `pl.pallas_call(...)(*args)` whose operands and outputs are all 32-bit
    or narrower traces its kernel and index maps with x64 off, through the patch of JAX 0.10's `_pallas_call`
    (`in_32_bits_when_asked`, applied when Pallas is imported); where that patch could not be applied
    (integrations.patches.problems() says so) nothing changes."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth = depth


_WIDE = frozenset(jax.numpy.dtype(t) for t in ("int64", "uint64", "float64", "complex128"))


def _has_64_bit_values(tree):
    """Whether a kernel reads or writes 64-bit values: then it is not a TPU kernel (Mosaic has none) and keeps
    the process's x64 tracing, under which its int64/float64 arithmetic stays 64-bit on the host."""
    return any(getattr(x, "dtype", None) in _WIDE for x in jax.tree_util.tree_leaves(tree))


def in_32_bits_when_asked(build):
    """`build` (JAX 0.10's `_pallas_call`, which `pl.pallas_call` makes its callable with), wrapped so that
    the callable traces with x64 off inside `pallas_calls_in_32_bits()`; integrations/patches.py installs it."""

    @functools.wraps(build)
    def build_32_bit(kernel, out_shape, *args, **kwargs):
        call = build(kernel, out_shape, *args, **kwargs)

        @functools.wraps(call)
        def run(*operands):
            if not getattr(_state, "depth", 0) or _has_64_bit_values((out_shape, operands)):
                return call(*operands)
            with kernel_tracing():
                return call(*operands)

        return run

    return build_32_bit
