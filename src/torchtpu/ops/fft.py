"""Lowerings: the FFT primitives torch.fft.* and torch.stft/istft decompose into.

PyTorch's composites (fft_fft, fft_rfftn, stft, ...) pad, trim and promote the input, then call
one of three primitives: `_fft_c2c` (complex to complex), `_fft_r2c` (real to the Hermitian half
or the full spectrum) and `_fft_c2r` (Hermitian half to real). `normalization` is PyTorch's
fft_norm_mode: 0 none, 1 times 1/sqrt(n), 2 times 1/n, n the product of the signal sizes (the
real side's sizes: the input's for r2c, the output's for c2r). The result dtype follows the
input's precision (float32 <-> complex64, float64 <-> complex128), as jnp.fft's does.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from .dtypes import scalar_type_name
from .table import lowering

# jnp's norm= names for PyTorch's modes; an inverse transform scales the other way round
_FORWARD_NORM = {0: "backward", 1: "ortho", 2: "forward"}
_INVERSE_NORM = {0: "forward", 1: "ortho", 2: "backward"}
_SUPPORTED = {jnp.dtype(t) for t in (jnp.float32, jnp.float64, jnp.complex64, jnp.complex128)}
_DOUBLE = {jnp.dtype(jnp.float64), jnp.dtype(jnp.complex128)}


def _check_dtype(x, op):
    # the CPU has no half-precision FFTs (PyTorch's meta kernels let Half through to _fft_r2c)
    if x.dtype not in _SUPPORTED:
        raise RuntimeError(
            f"{op}: the tpu device, like the CPU, doesn't support FFTs of tensors of type: {scalar_type_name(x.dtype)}"
        )
    if x.dtype in _DOUBLE:
        from ..device.platform import lowering_platform

        if lowering_platform() == "tpu":
            # XLA:TPU's FFT takes complex64 only: a complex128 one fails to compile
            raise RuntimeError(
                f"{op}: FFTs of {scalar_type_name(x.dtype)} tensors are not supported on a TPU "
                f"(XLA:TPU computes FFTs in single precision only): use float32/complex64"
            )


def _axes(x, dim):
    return tuple(int(d) % x.ndim for d in dim)


@lowering("_fft_c2c")
def fft_c2c(self, dim, normalization, forward):
    _check_dtype(self, "_fft_c2c")
    if not dim:
        return self
    axes = _axes(self, dim)
    if forward:
        return jnp.fft.fftn(self, axes=axes, norm=_FORWARD_NORM[normalization])
    return jnp.fft.ifftn(self, axes=axes, norm=_INVERSE_NORM[normalization])


def _fft_r2c_check(a, *_, **__):
    """The CPU's words for a complex input to a real-to-complex FFT (ihfft2/ihfftn of a complex tensor);
    PyTorch's meta kernel fails it with an unworded check."""
    if a.is_complex():
        raise RuntimeError(f"Only supports floating-point dtypes, but found: {scalar_type_name(a.dtype)}")


def _r2c_layout(self, dim, *_, **__):
    """The CPU's real-to-complex output over several dims is not laid out as PyTorch's meta kernel says
    (the halved dim innermost, the others in the input's order): contiguous then, as before; over one
    dim the meta kernel's layout is the CPU's."""
    return "meta" if len(dim) == 1 else "memory_format"


@lowering("_fft_r2c", meta_check=_fft_r2c_check, output_layout=_r2c_layout)
def fft_r2c(self, dim, normalization, onesided):
    _check_dtype(self, "_fft_r2c")
    axes = _axes(self, dim)
    if onesided:
        return jnp.fft.rfftn(self, axes=axes, norm=_FORWARD_NORM[normalization])
    # the full spectrum: a complex transform of the real signal (the CPU mirrors the half instead)
    complex_dtype = jnp.complex64 if self.dtype == jnp.float32 else jnp.complex128
    return jnp.fft.fftn(self.astype(complex_dtype), axes=axes, norm=_FORWARD_NORM[normalization])


def _real_edges(x, axis, n):
    """The Hermitian half trimmed or zero-padded to n//2+1 bins, with the imaginary parts of the DC
    bin (and, n even, the Nyquist bin) dropped: a real signal has none, and the CPU ignores them."""
    half = n // 2 + 1
    m = x.shape[axis]
    if m > half:
        x = lax.slice_in_dim(x, 0, half, axis=axis)  # the CPU accepts a full-length spectrum
    elif m < half:  # the CPU asserts here; missing bins read as zero
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, half - m)
        x = jnp.pad(x, pad)
    k = jnp.arange(half).reshape([-1 if a == axis else 1 for a in range(x.ndim)])
    edge = (k == 0) | ((k == n // 2) & (n % 2 == 0))
    return jnp.where(edge, x.real.astype(x.dtype), x)


@lowering("_fft_c2r")
def fft_c2r(self, dim, normalization, last_dim_size):
    _check_dtype(self, "_fft_c2r")
    axes = _axes(self, dim)
    last, n_last = axes[-1], int(last_dim_size)
    # as the CPU: an unnormalized inverse c2c over the leading axes, then a 1-D c2r on the last
    x = jnp.fft.ifftn(self, axes=axes[:-1], norm="forward") if len(axes) > 1 else self
    x = _real_edges(x, last, n_last)
    out = jnp.fft.irfft(x, n=n_last, axis=last, norm="forward")
    n = n_last * math.prod(self.shape[a] for a in axes[:-1])
    if normalization == 1:
        out = out * (1.0 / math.sqrt(n))
    elif normalization == 2:
        out = out * (1.0 / n)
    return out
