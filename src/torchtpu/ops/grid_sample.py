"""Lowerings: grid_sampler_2d and grid_sampler_3d (F.grid_sample) and their backward ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .dtypes import WIDE_UNSIGNED, to_opmath
from .shape import cubic_coeffs
from .table import lowering


def _rounding(dtype):
    """PyTorch's CPU grid sampler computes half types in the half type itself: every operation
    rounds. `r` reproduces that on float32 values (identity for float32/float64)."""
    if dtype in (jnp.float16, jnp.bfloat16):
        # reduce_precision, not a convert pair: XLA may fold f32->f16->f32 converts away under jit
        info = jnp.finfo(dtype)
        return lambda v: lax.reduce_precision(v, info.nexp, info.nmant)
    return lambda v: v


def _grid_unnormalize(coord, size, align_corners, r=lambda v: v, vectorized=True):
    if align_corners:
        return r(r(r(coord + 1) / 2) * (size - 1))
    if vectorized:  # the form of PyTorch's vectorized 2-D CPU kernel, which rounds this way
        return r(r(r(coord + 1) * (size / 2)) - 0.5)
    return r(r(r(r(coord + 1) * size) - 1) / 2)  # its scalar kernel (3-D)


def _grid_pad(x, size, padding_mode, align_corners, r=lambda v: v):
    """PyTorch's padding modes on pixel coordinates: border clips, reflection mirrors then clips."""
    if padding_mode == 1:  # border
        x = jnp.clip(x, 0, size - 1)
    elif padding_mode == 2:  # reflection
        lo, hi = (0.0, 2.0 * (size - 1)) if align_corners else (-1.0, 2.0 * size - 1)
        if lo == hi:
            x = jnp.zeros_like(x)
        else:
            mn, span = lo / 2, (hi - lo) / 2
            d = r(jnp.abs(x - mn))
            extra = r(jnp.fmod(d, span))
            flips = jnp.floor(r(d / span))
            x = r(jnp.where(jnp.fmod(flips, 2) == 0, extra + mn, span - extra + mn))
        x = jnp.clip(x, 0, size - 1)
    return x


def _grid_coord(coord, size, padding_mode, align_corners, r=lambda v: v, vectorized=True):
    """Normalized [-1, 1] grid coordinates to pixel coordinates, with PyTorch's padding modes."""
    return _grid_pad(_grid_unnormalize(coord, size, align_corners, r, vectorized), size, padding_mode, align_corners, r)


def _grid_bicubic(xf, gx, gy, padding_mode, align_corners, r=lambda v: v):
    n, c, h, w = xf.shape
    ix = _grid_unnormalize(gx, w, align_corners, r)
    iy = _grid_unnormalize(gy, h, align_corners, r)
    x0, y0 = jnp.floor(ix), jnp.floor(iy)
    cx, cy = cubic_coeffs(r(ix - x0), r=r), cubic_coeffs(r(iy - y0), r=r)

    def tap(yy, xx):
        if padding_mode != 0:  # padded taps are read at their mirrored/clipped position
            yy = _grid_pad(yy, h, padding_mode, align_corners, r)
            xx = _grid_pad(xx, w, padding_mode, align_corners, r)
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        yc, xc = jnp.clip(yy, 0, h - 1).astype(jnp.int32), jnp.clip(xx, 0, w - 1).astype(jnp.int32)
        vals = jax.vmap(lambda img, a, b: img[:, a, b])(xf, yc, xc)
        return jnp.where(inside[:, None], vals, 0)

    def interp(p, coeffs):  # x0*c0 + x1*c1 + x2*c2 + x3*c3, left to right
        acc = r(p[0] * coeffs[0][:, None])
        for k in range(1, 4):
            acc = r(acc + r(p[k] * coeffs[k][:, None]))
        return acc

    rows = [interp([tap(y0 - 1 + j, x0 - 1 + i) for i in range(4)], cx) for j in range(4)]
    return interp(rows, cy)


def _grid_sample(x, grid, mode, padding_mode, align_corners):
    n, c, h, w = x.shape
    g = to_opmath(grid)
    r = _rounding(x.dtype)
    ix = _grid_coord(g[..., 0], w, padding_mode, align_corners, r)
    iy = _grid_coord(g[..., 1], h, padding_mode, align_corners, r)
    xf = to_opmath(x)

    def tap(yy, xx):
        """x at integer (yy, xx) per batch, zero outside: (N, C, Ho, Wo)."""
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        yc, xc = jnp.clip(yy, 0, h - 1).astype(jnp.int32), jnp.clip(xx, 0, w - 1).astype(jnp.int32)
        vals = jax.vmap(lambda img, a, b: img[:, a, b])(xf, yc, xc)
        return jnp.where(inside[:, None], vals, 0)

    if mode == 1:  # nearest (round half to even, as nearbyint)
        return tap(jnp.round(iy), jnp.round(ix))
    if mode == 2:
        return _grid_bicubic(xf, g[..., 0], g[..., 1], padding_mode, align_corners, r)
    x0, y0 = jnp.floor(ix), jnp.floor(iy)
    weights = (
        (y0, x0, r(r(x0 + 1 - ix) * r(y0 + 1 - iy))),
        (y0, x0 + 1, r(r(ix - x0) * r(y0 + 1 - iy))),
        (y0 + 1, x0, r(r(x0 + 1 - ix) * r(iy - y0))),
        (y0 + 1, x0 + 1, r(r(ix - x0) * r(iy - y0))),
    )
    out = 0
    for yy, xx, wt in weights:
        out = r(out + r(tap(yy, xx) * wt[:, None]))
    return out


def _grid_sample_3d(x, grid, mode, padding_mode, align_corners):
    n, c, d, h, w = x.shape
    g = to_opmath(grid)
    r = _rounding(x.dtype)
    ix = _grid_coord(g[..., 0], w, padding_mode, align_corners, r, vectorized=False)
    iy = _grid_coord(g[..., 1], h, padding_mode, align_corners, r, vectorized=False)
    iz = _grid_coord(g[..., 2], d, padding_mode, align_corners, r, vectorized=False)
    xf = to_opmath(x)

    def tap(zz, yy, xx):
        """x at integer (zz, yy, xx) per batch, zero outside: (N, C, Do, Ho, Wo)."""
        inside = (zz >= 0) & (zz < d) & (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        zc = jnp.clip(zz, 0, d - 1).astype(jnp.int32)
        yc, xc = jnp.clip(yy, 0, h - 1).astype(jnp.int32), jnp.clip(xx, 0, w - 1).astype(jnp.int32)
        vals = jax.vmap(lambda vol, a, b, e: vol[:, a, b, e])(xf, zc, yc, xc)
        return jnp.where(inside[:, None], vals, 0)

    if mode == 1:  # nearest
        return tap(jnp.round(iz), jnp.round(iy), jnp.round(ix))
    if mode != 0:
        raise NotImplementedError("torchtpu: 3-D grid_sample supports 'bilinear' and 'nearest' (as PyTorch)")
    x0, y0, z0 = jnp.floor(ix), jnp.floor(iy), jnp.floor(iz)
    out = 0
    # PyTorch's corner order (tnw, tne, tsw, tse, bnw, bne, bsw, bse), each weight a rounded product
    for dz in (0, 1):
        wz = r(z0 + 1 - iz) if dz == 0 else r(iz - z0)
        for dy in (0, 1):
            wy = r(y0 + 1 - iy) if dy == 0 else r(iy - y0)
            for dx in (0, 1):
                wx = r(x0 + 1 - ix) if dx == 0 else r(ix - x0)
                wt = r(r(wx * wy) * wz)
                out = r(out + r(tap(z0 + dz, y0 + dy, x0 + dx) * wt[:, None]))
    return out


def _grid_sampler_backward(sample, grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    _, vjp = jax.vjp(
        lambda a, b: sample(a, b, interpolation_mode, padding_mode, align_corners), to_opmath(x), to_opmath(grid)
    )
    gx, gg = vjp(to_opmath(grad))
    # (the meta kernel always returns a grad_grid, even when output_mask[1] is False)
    return (
        gx.astype(x.dtype) if output_mask[0] else None,
        gg.astype(grid.dtype) if output_mask[1] else jnp.zeros(grid.shape, grid.dtype),
    )


def _sampler(x):
    return _grid_sample if x.ndim == 4 else _grid_sample_3d  # (N, C, H, W) or (N, C, D, H, W)


def _sizes(t):
    return list(t.shape)  # as C++ prints sizes: [5, 5, 5, 5]


def _grid_sampler_check(dims):
    """The CPU's argument checks of grid_sampler_{dims}d (check_grid_sampler_common, then its own), in
    its words: PyTorch's meta kernel of grid_sampler_2d is its decomposition, which asserts or fails to
    unpack, and the 3-D one prints torch.Size."""
    want = dims + 2

    def check(x, grid, interpolation_mode, *args, **kwargs):
        n = x.dim()
        if x.shape[0] != grid.shape[0]:
            raise RuntimeError(
                "grid_sampler(): expected grid and input to have same batch size, but got input with sizes "
                f"{_sizes(x)} and grid with sizes {_sizes(grid)}"
            )
        if grid.shape[-1] != n - 2:
            raise RuntimeError(
                f"grid_sampler(): expected grid to have size {n - 2} in last dimension, but got grid with sizes "
                f"{_sizes(grid)}"
            )
        for i in range(2, n):
            if x.shape[i] <= 0:
                raise RuntimeError(
                    "grid_sampler(): expected input to have non-empty spatial dimensions, but input has sizes "
                    f"{_sizes(x)} with dimension {i} being empty"
                )
        if n != want or n != grid.dim():
            raise RuntimeError(
                f"grid_sampler(): expected {want}D input and grid with same number of dimensions, but got "
                f"input with sizes {_sizes(x)} and grid with sizes {_sizes(grid)}"
            )
        if want == 5 and interpolation_mode == 2:
            raise RuntimeError("grid_sampler(): bicubic interpolation only supports 4D input")

    return check


@lowering(
    "grid_sampler_2d",
    "grid_sampler_3d",
    meta_check={"grid_sampler_2d": _grid_sampler_check(2), "grid_sampler_3d": _grid_sampler_check(3)},
    no_loop_for=(torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, *WIDE_UNSIGNED),
)
def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    return _sampler(x)(x, grid, interpolation_mode, padding_mode, align_corners).astype(x.dtype)


@lowering("grid_sampler_2d_backward", "grid_sampler_3d_backward")
def grid_sampler_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    return _grid_sampler_backward(
        _sampler(x), grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask
    )
