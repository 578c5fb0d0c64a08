"""Lowerings: the FFT primitives torch.fft.* and torch.stft/istft decompose into.

PyTorch's composites (fft_fft, fft_rfftn, stft, ...) pad, trim and promote the input, then call
one of three primitives: `_fft_c2c` (complex to complex), `_fft_r2c` (real to the Hermitian half
or the full spectrum) and `_fft_c2r` (Hermitian half to real). `normalization` is PyTorch's
fft_norm_mode: 0 none, 1 times 1/sqrt(n), 2 times 1/n, n the product of the signal sizes (the
real side's sizes: the input's for r2c, the output's for c2r). The result dtype follows the
input's precision (float32 <-> complex64, float64 <-> complex128), as jnp.fft's does.
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np
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


# ---- double precision on a TPU: XLA:TPU's FFT takes complex64 only (a complex128 one fails to compile), so
# float64/complex128 transforms are DFTs as float64 matrix products (which XLA:TPU compiles, emulated):
# direct up to _DIRECT_DFT points, else split n = n1 * n2 (the four-step FFT: n1-point DFTs, twiddles,
# n2-point DFTs), O(n * (n1 + n2)) work. A prime length has no split: up to _MAX_PRIME_DFT its n x n matrix.
_DIRECT_DFT = 128
_MAX_PRIME_DFT = 4096


def _tpu_double(x):
    from ..device.platform import lowering_platform

    return x.dtype in _DOUBLE and lowering_platform() == "tpu"


def _roots(rows, cols, n, inverse):
    """exp(-+2 pi i r c / n) for r < rows, c < cols, from the exact r*c mod n (float64 pairs)."""
    angle = (np.outer(np.arange(rows), np.arange(cols)) % n) * ((2.0 if inverse else -2.0) * np.pi / n)
    return np.cos(angle), np.sin(angle)


def _dft_last(xr, xi, inverse, op):
    """The DFT of (xr + i xi) along the last axis, as float64 real and imaginary parts."""
    n = xr.shape[-1]
    n1 = next((f for f in range(math.isqrt(n), 1, -1) if n % f == 0), 1) if n > _DIRECT_DFT else 1
    if n1 == 1:
        if n > _MAX_PRIME_DFT:
            raise RuntimeError(
                f"{op}: a float64/complex128 FFT of prime length {n} is not supported on a TPU (XLA:TPU "
                f"computes FFTs in single precision only; torchtpu's double-precision DFT takes prime "
                f"lengths up to {_MAX_PRIME_DFT}): use float32/complex64, or pad the signal"
            )
        wr, wi = (jnp.asarray(w) for w in _roots(n, n, n, inverse))
        mm = functools.partial(jnp.matmul, precision=lax.Precision.HIGHEST)
        return mm(xr, wr) - mm(xi, wi), mm(xr, wi) + mm(xi, wr)
    n2 = n // n1
    lead = xr.shape[:-1]
    # x[j1 * n2 + j2] -> DFT over j1 -> times w_n^(j2 k1) -> DFT over j2 -> X[k1 + n1 * k2]
    br, bi = _dft_last(*(jnp.swapaxes(t.reshape(*lead, n1, n2), -1, -2) for t in (xr, xi)), inverse, op)
    tr, ti = (jnp.asarray(w) for w in _roots(n2, n1, n, inverse))
    br, bi = br * tr - bi * ti, br * ti + bi * tr
    cr, ci = _dft_last(jnp.swapaxes(br, -1, -2), jnp.swapaxes(bi, -1, -2), inverse, op)
    return (jnp.swapaxes(t, -1, -2).reshape(*lead, n) for t in (cr, ci))


def _fftn(x, axes, inverse, norm, op):
    """jnp.fft.fftn / ifftn (norm: jnp's name), or on a TPU in double precision the DFTs above."""
    if not _tpu_double(x):
        return (jnp.fft.ifftn if inverse else jnp.fft.fftn)(x, axes=axes, norm=norm)
    x = x.astype(jnp.complex128)
    xr, xi = jnp.real(x), jnp.imag(x)
    for axis in axes:
        xr, xi = _dft_last(jnp.moveaxis(xr, axis, -1), jnp.moveaxis(xi, axis, -1), inverse, op)
        xr, xi = jnp.moveaxis(xr, -1, axis), jnp.moveaxis(xi, -1, axis)
    n = math.prod(x.shape[a] for a in axes)
    scale = 1.0  # jnp's norms: "backward" scales the inverse by 1/n, "forward" the forward transform
    if n and norm == "ortho":
        scale = 1.0 / math.sqrt(n)
    elif n and norm == ("backward" if inverse else "forward"):
        scale = 1.0 / n
    return lax.complex(xr * scale, xi * scale)


def _axes(x, dim):
    return tuple(int(d) % x.ndim for d in dim)


@lowering("_fft_c2c")
def fft_c2c(self, dim, normalization, forward):
    _check_dtype(self, "_fft_c2c")
    if not dim:
        return self
    axes = _axes(self, dim)
    norm = (_FORWARD_NORM if forward else _INVERSE_NORM)[normalization]
    return _fftn(self, axes, not forward, norm, "_fft_c2c")


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
    if onesided and not _tpu_double(self):
        return jnp.fft.rfftn(self, axes=axes, norm=_FORWARD_NORM[normalization])
    # the full spectrum: a complex transform of the real signal (the CPU mirrors the half instead)
    complex_dtype = jnp.complex64 if self.dtype == jnp.float32 else jnp.complex128
    out = _fftn(self.astype(complex_dtype), axes, False, _FORWARD_NORM[normalization], "_fft_r2c")
    return lax.slice_in_dim(out, 0, self.shape[axes[-1]] // 2 + 1, axis=axes[-1]) if onesided else out


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
    x = _fftn(self, axes[:-1], True, "forward", "_fft_c2r") if len(axes) > 1 else self
    x = _real_edges(x, last, n_last)
    if _tpu_double(x):  # the whole Hermitian spectrum, X[n - k] = conj(X[k]), and a complex inverse
        rest = lax.rev(lax.slice_in_dim(x, 1, n_last - x.shape[last] + 1, axis=last), (last,))
        full = jnp.concatenate([x, jnp.conj(rest)], axis=last)
        out = jnp.real(_fftn(full, (last,), True, "forward", "_fft_c2r"))
    else:
        out = jnp.fft.irfft(x, n=n_last, axis=last, norm="forward")
    n = n_last * math.prod(self.shape[a] for a in axes[:-1])
    if normalization == 1:
        out = out * (1.0 / math.sqrt(n))
    elif normalization == 2:
        out = out * (1.0 / n)
    return out
