"""Lowerings: reductions."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .argument_checks import cpp_type_name, same_scalar_type_out_check, warn_at_caller
from .checks import require
from .dtypes import NOT_FLOATING, WIDE_UNSIGNED, not_implemented_for, opmath, scalar_type_name, to_opmath
from .table import WriteOverlap, lowering, real_only_without_lowering


def _dims(a, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(d % max(a.ndim, 1) for d in dim) if a.ndim else None


def _acc_dtype(a, dtype):
    if dtype is not None:
        return dtype
    if a.dtype == jnp.bool_ or jnp.issubdtype(a.dtype, jnp.integer):
        return jnp.int64
    return a.dtype


def _dim_rank_check(a, dim=None, *args, **kwargs):
    """A reduction over given dims of a tensor of more than 64 dims: the CPU's kernels keep the dims in
    a 64-bit mask and refuse it (argmax, argmin, nansum, max/min.dim; without a dim they compute)."""
    if dim is not None and a.dim() > 64:
        raise RuntimeError("only tensors with up to 64 dims are supported")


def _wide_unsigned_result_check(kernel):
    """meta_check of sum/prod/nansum: the CPU's kernels (CUDA's too) dispatch on the result dtype and have
    no uint16/32/64 loop: a wide unsigned input sums into int64 and computes, but `dtype=` (or `out=`) of
    one raises (masked.sum and friends pass `dtype=`)."""

    def check(a, *args, dtype=None, out=None, **kwargs):
        _dim_rank_check(a, *args, **kwargs)
        result = dtype if dtype is not None else (out.dtype if isinstance(out, torch.Tensor) else None)
        if result in WIDE_UNSIGNED:
            raise not_implemented_for(kernel, result)

    return check


# ---------------------------------------------------------------- reduction buckets
# Which calls may run on an operand padded to a size bucket with the reduction's identity
# (eager/reduction_buckets.py): those whose result does not depend on the order of the reduction, so
# it is the exact-length program's bit for bit. Float and complex sums and products reassociate (XLA's
# reduce of a longer array sums in another tree: the last bit differs in about half the lengths), so
# they keep their program per length; integer and bool sums, extremes, arg-extremes (pads at the end
# never win a tie: the first index wins), any/all and every scan (pads after the real elements leave
# their prefix alone; JAX's scans on XLA:CPU combine position k's prefix in the same tree whatever the
# length) are served.
def _one_dim(a, dim):
    """The reduction's dims as one int, None for every element, or False (not one dim)."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    if isinstance(dim, (list, tuple)):
        dims = {d % max(a.dim(), 1) for d in dim}
        return dims.pop() if len(dims) == 1 and len(dim) == 1 and a.dim() else False
    return dim % a.dim() if a.dim() else False


def _order_free_sum(a, dtype):
    """An integer or bool accumulation (its result does not depend on the order; a float one does)."""
    d = dtype if dtype is not None else a.dtype
    return not (d.is_floating_point or d.is_complex)


def _reduce_plan(identity, exact=None):
    def plan(a, dim=None, keepdim=False, dtype=None):
        if exact is not None and not exact(a, dtype):
            return None
        d = _one_dim(a, dim)
        return None if d is False else (d, identity, False)

    return plan


def _scan_plan(identity):
    def plan(a, dim, dtype=None):
        return (dim % a.dim(), identity, True) if a.dim() else None

    return plan


@lowering(
    "sum",
    "sum.dim_IntList",
    meta_check=dict.fromkeys(
        ("sum", "sum.dim_IntList", "sum.IntList_out", "sum.out"), _wide_unsigned_result_check("sum")
    ),
    reduction_buckets=_reduce_plan("sum", exact=_order_free_sum),
)
def sum_reduction(a, dim=None, keepdim=False, dtype=None):
    d = _acc_dtype(a, dtype)
    acc = opmath(d)
    # the CPU casts each element to the result dtype first (a float32 input summed as float16 rounds
    # every element to float16), then accumulates in its opmath type
    return jnp.sum(a.astype(d).astype(acc), axis=_dims(a, dim), keepdims=keepdim).astype(d)


def _trace_check(a, *args, **kwargs):
    """The CPU's words for a non-matrix (PyTorch's meta kernel leaves out "trace: ")."""
    if isinstance(a, torch.Tensor) and a.dim() != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {a.dim()}")


# the CPU's trace sums the diagonal as sum does (integers into int64); it has no bool or wide unsigned loop
@lowering("trace", no_loop_for=(torch.bool, *WIDE_UNSIGNED), meta_check=_trace_check)
def trace(a):
    return sum_reduction(jnp.diagonal(a))


def _mean_complex_half_check(a, *args, **kwargs):
    # CUDA has no ComplexHalf mean kernel (PyTorch's test_reductions_large_half_tensors says so), though it
    # sums complex32: refused as there (the CPU refuses both, "sum_cpu")
    if isinstance(a, torch.Tensor) and a.dtype == torch.complex32:
        raise NotImplementedError("\"mean_tpu\" not implemented for 'ComplexHalf'")


def _mean_check(a, *args, dtype=None, **kwargs):
    """The CPU's words for mean of an integer input or into an integer dtype (PyTorch's meta kernel
    names the dtype torch.int64, the CPU Long), then _mean_complex_half_check."""
    if isinstance(a, torch.Tensor):
        which, d = ("Optional", dtype) if dtype is not None else ("Input", a.dtype)
        if not (d.is_floating_point or d.is_complex):
            raise RuntimeError(
                f"mean(): could not infer output dtype. {which} dtype must be either a floating point or complex "
                f"dtype. Got: {scalar_type_name(d)}"
            )
    _mean_complex_half_check(a, *args, **kwargs)


@lowering(
    "mean",
    "mean.dim",
    meta_check={"mean": _mean_check, "mean.dim": _mean_check, "mean.out": _mean_complex_half_check},
)
def mean(a, dim=None, keepdim=False, dtype=None):
    d = dtype or a.dtype
    acc = opmath(d)
    return jnp.mean(a.astype(acc), axis=_dims(a, dim), keepdims=keepdim).astype(d)


@lowering(
    "prod",
    "prod.dim_int",
    meta_check=dict.fromkeys(("prod", "prod.dim_int", "prod.int_out", "prod.out"), _wide_unsigned_result_check("prod")),
    reduction_buckets=_reduce_plan("prod", exact=_order_free_sum),
)
def prod(a, dim=None, keepdim=False, dtype=None):
    d = _acc_dtype(a, dtype)
    return jnp.prod(a.astype(opmath(d)), axis=_dims(a, dim), keepdims=keepdim).astype(d)


def _empty_reduction_check(name, *overloads, dim_at=1, all_dims_error=None, no_bool=False, then=None, default_dim=None):
    """meta_check of a reduction without identity (max, argmax, median, ...): the CPU's errors for a
    zero-size reduction dim (IndexError "max(): Expected reduction dim 1 to have non-zero size.") and,
    where `all_dims_error(name)` is given, for reducing every dim of an empty tensor. `dim_at`: the
    position of the dim argument. `no_bool`: bool inputs refused first, whatever their shape (argmax,
    argmin: the CPU and CUDA check it before the sizes). `then(a, *args, **kwargs)`: a check after them.
    `default_dim`: the dim of a call without one (kthvalue and mode: -1)."""

    def check(a, *args, **kwargs):
        if no_bool and a.dtype == torch.bool:
            raise RuntimeError(f"{name}: does not support bool input")
        dim = kwargs.get("dim", args[dim_at - 1] if len(args) >= dim_at else default_dim)
        dims = [] if dim is None else list(dim) if isinstance(dim, (list, tuple)) else [dim]
        if not dims and all_dims_error is not None and a.numel() == 0:
            raise all_dims_error(name)
        for d in dims:
            if a.dim() > 0 and a.shape[d % a.dim()] == 0:
                raise IndexError(f"{name}: Expected reduction dim {d % a.dim()} to have non-zero size.")
        if then is not None:
            then(a, *args, **kwargs)

    return dict.fromkeys(overloads, check)


def _no_bool_kernel(kernel, refuses=lambda a: True):
    """A check raising the CPU's dispatch error of a kernel without a bool version (median, kthvalue;
    CUDA's have none either) where `refuses(a)` (some of them return an empty or 0-dim input first)."""

    def check(a, *args, **kwargs):
        if a.dtype == torch.bool and refuses(a):
            raise not_implemented_for(kernel, torch.bool)

    return check


def _unspecified_dim(name):
    return RuntimeError(
        f"{name}: Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim "
        "with the 'dim' argument."
    )


def _unspecified_arg_dim(name):
    return IndexError(f"{name}: Expected reduction dim to be specified for input.numel() == 0.")


def _amax_out_check(a, *args, out=None, **kwargs):
    """amax/amin(out=) of another dtype than the input: the CPU's words (the meta casts)."""
    if out is not None and out.dtype != a.dtype:
        raise RuntimeError(
            f"Expected the dtype for input and out to match, but got {scalar_type_name(a.dtype)} for input's "
            f"dtype and {scalar_type_name(out.dtype)} for out's dtype."
        )


def _aminmax_out_check(a, *args, min=None, max=None, **kwargs):  # (aminmax.out's names)
    """aminmax(out=(min, max)): a structured kernel's outs take the input's dtype exactly (the meta
    computed into a wider one)."""
    for out in (min, max):
        if out is not None and out.dtype != a.dtype:
            want, got = cpp_type_name(a.dtype), cpp_type_name(out.dtype)
            raise RuntimeError(f"Expected out tensor to have dtype {want}, but got {got} instead")


def _empty_aminmax(name):
    return RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity.")


@lowering(
    "amax",
    real_only=True,
    meta_check=_empty_reduction_check(
        "amax()", "amax", "amax.out", all_dims_error=_unspecified_dim, then=_amax_out_check
    ),
    no_loop_for=WIDE_UNSIGNED,
    reduction_buckets=_reduce_plan("max"),
)
def amax(a, dim=(), keepdim=False):
    return jnp.max(a, axis=_dims(a, dim), keepdims=keepdim)


@lowering(
    "amin",
    real_only=True,
    meta_check=_empty_reduction_check(
        "amin()", "amin", "amin.out", all_dims_error=_unspecified_dim, then=_amax_out_check
    ),
    no_loop_for=WIDE_UNSIGNED,
    reduction_buckets=_reduce_plan("min"),
)
def amin(a, dim=(), keepdim=False):
    return jnp.min(a, axis=_dims(a, dim), keepdims=keepdim)


@lowering(
    "max",
    real_only=True,
    meta_check=_empty_reduction_check("max()", "max", "max.unary_out", all_dims_error=_unspecified_dim),
    no_loop_for=WIDE_UNSIGNED,
    reduction_buckets=_reduce_plan("max"),
)
def max_all(a):
    return jnp.max(a)


@lowering(
    "min",
    real_only=True,
    meta_check=_empty_reduction_check("min()", "min", "min.unary_out", all_dims_error=_unspecified_dim),
    no_loop_for=WIDE_UNSIGNED,
    reduction_buckets=_reduce_plan("min"),
)
def min_all(a):
    return jnp.min(a)


def _arg_reduce(a, dim, keepdim, fn):
    if dim is None:
        return fn(a.reshape(-1), axis=0).astype(jnp.int64).reshape((1,) * a.ndim if keepdim else ())
    d = dim % max(a.ndim, 1)
    return fn(a, axis=d, keepdims=keepdim).astype(jnp.int64) if a.ndim else jnp.zeros((), jnp.int64)


@lowering(
    "argmax",
    real_only="argmax(): does not support complex input",
    meta_check=_empty_reduction_check(
        "argmax()", "argmax", "argmax.out", all_dims_error=_unspecified_arg_dim, no_bool=True, then=_dim_rank_check
    ),
    no_loop_for=WIDE_UNSIGNED,
    reduction_buckets=_reduce_plan("max"),
)
def argmax(a, dim=None, keepdim=False):
    return _arg_reduce(a, dim, keepdim, jnp.argmax)


@lowering(
    "argmin",
    real_only="argmin(): does not support complex input",
    meta_check=_empty_reduction_check(
        "argmin()", "argmin", "argmin.out", all_dims_error=_unspecified_arg_dim, no_bool=True, then=_dim_rank_check
    ),
    no_loop_for=WIDE_UNSIGNED,
    reduction_buckets=_reduce_plan("min"),
)
def argmin(a, dim=None, keepdim=False):
    return _arg_reduce(a, dim, keepdim, jnp.argmin)


@lowering(
    "max.dim",
    real_only=True,
    meta_check=_empty_reduction_check("max()", "max.dim", "max.dim_max", then=_dim_rank_check),
    no_loop_for=WIDE_UNSIGNED,
    reduction_buckets=_reduce_plan("max"),
)
def max_dim(a, dim, keepdim=False):
    d = dim % max(a.ndim, 1)
    if a.ndim == 0:
        return a, jnp.zeros((), jnp.int64)
    return jnp.max(a, axis=d, keepdims=keepdim), jnp.argmax(a, axis=d, keepdims=keepdim).astype(jnp.int64)


@lowering(
    "min.dim",
    real_only=True,
    meta_check=_empty_reduction_check("min()", "min.dim", "min.dim_min", then=_dim_rank_check),
    no_loop_for=WIDE_UNSIGNED,
    reduction_buckets=_reduce_plan("min"),
)
def min_dim(a, dim, keepdim=False):
    d = dim % max(a.ndim, 1)
    if a.ndim == 0:
        return a, jnp.zeros((), jnp.int64)
    return jnp.min(a, axis=d, keepdims=keepdim), jnp.argmin(a, axis=d, keepdims=keepdim).astype(jnp.int64)


def _bool_or_byte_out_check(name):
    """meta_check of any/all's out= overloads: the CPU's check_result_is_bytebool (the meta kernels
    accept an `out` of any dtype)."""

    def check(*args, out=None, **kwargs):
        if isinstance(out, torch.Tensor) and out.dtype not in (torch.bool, torch.uint8):
            raise RuntimeError(f"{name} only supports bool tensor for result, got: {scalar_type_name(out.dtype)}")

    return dict.fromkeys((f"{name}.out", f"{name}.dims_out", f"{name}.all_out"), check)


@lowering(
    "any", "any.dim", "any.dims", meta_check=_bool_or_byte_out_check("any"), reduction_buckets=_reduce_plan("any")
)
def any_reduction(a, dim=None, keepdim=False):
    return jnp.any(a, axis=_dims(a, dim), keepdims=keepdim)


@lowering(
    "all", "all.dim", "all.dims", meta_check=_bool_or_byte_out_check("all"), reduction_buckets=_reduce_plan("all")
)
def all_reduction(a, dim=None, keepdim=False):
    return jnp.all(a, axis=_dims(a, dim), keepdims=keepdim)


def _count(a, axis):
    if axis is None:
        return a.size
    n = 1
    for d in axis:
        n *= a.shape[d]
    return n


def _moments_check(words):
    """meta_check of var/std/var_mean/std_mean: the CPU and CUDA take floating and complex inputs only
    (even with no elements); `words` start their message."""

    def check(a, *args, **kwargs):
        if not (a.is_floating_point() or a.is_complex()):
            raise RuntimeError(f"{words} only support floating point and complex dtypes")

    return check


def _moments_checks(op, words):
    return dict.fromkeys((f"{op}.correction", f"{op}.correction_out"), _moments_check(words))


@lowering("var.correction", meta_check=_moments_checks("var", "std and var"))
def var(a, dim=None, correction=None, keepdim=False):
    axis = _dims(a, dim)
    x = a.astype(opmath(a.dtype))
    mu = jnp.mean(x, axis=axis, keepdims=True)
    centered = x - mu
    if jnp.iscomplexobj(centered):  # |x - mean|^2: the variance of a complex tensor is real
        centered = jnp.abs(centered)
    ss = jnp.sum(centered * centered, axis=axis, keepdims=keepdim)
    ddof = 1 if correction is None else correction
    # PyTorch divides by max(0, N - correction): inf or nan when nothing is left, never negative
    return (ss / jnp.maximum(_count(a, axis) - ddof, 0)).astype(ss.dtype if jnp.iscomplexobj(a) else a.dtype)


@lowering("std.correction", meta_check=_moments_checks("std", "std and var"))
def std(a, dim=None, correction=None, keepdim=False):
    return jnp.sqrt(var(a, dim, correction, keepdim))


@lowering("var_mean.correction", meta_check=_moments_checks("var_mean", "var_mean"))
def var_mean(a, dim=None, correction=None, keepdim=False):
    return var(a, dim, correction, keepdim), mean(a, dim, keepdim)


@lowering("std_mean.correction", meta_check=_moments_checks("std_mean", "std_mean"))
def std_mean(a, dim=None, correction=None, keepdim=False):
    return std(a, dim, correction, keepdim), mean(a, dim, keepdim)


@lowering(
    "nansum",
    real_only="nansum on CPU does not support complex inputs",
    meta_check=dict.fromkeys(("nansum", "nansum.out"), _wide_unsigned_result_check("sum")),
)
def nansum(a, dim=None, keepdim=False, dtype=None):
    d = _acc_dtype(a, dtype)
    x = a.astype(d).astype(opmath(d))  # (each element in the result dtype first, as sum)
    if jnp.issubdtype(x.dtype, jnp.floating):
        x = jnp.where(jnp.isnan(x), 0, x)
    return jnp.sum(x, axis=_dims(a, dim), keepdims=keepdim).astype(d)


@lowering(
    "aminmax",
    real_only=True,
    no_loop_for=WIDE_UNSIGNED,
    meta_check=_empty_reduction_check(
        "aminmax", "aminmax", "aminmax.out", all_dims_error=_empty_aminmax, then=_aminmax_out_check
    ),
)
def aminmax(a, dim=None, keepdim=False):
    axis = None if dim is None else _dims(a, dim)
    if dim is None and keepdim:
        return (jnp.min(a, keepdims=True).reshape((1,) * a.ndim), jnp.max(a, keepdims=True).reshape((1,) * a.ndim))
    return jnp.min(a, axis=axis, keepdims=keepdim), jnp.max(a, axis=axis, keepdims=keepdim)


_AMINMAX_DEPRECATED = (
    "_aminmax is deprecated as of PyTorch 1.11 and will be removed in a future release. Use aminmax "
    "instead. This warning will only appear once per process."
)
_aminmax_warned = {"_aminmax": False, "_aminmax.dim": False}


def _aminmax_deprecation(a, dim=None, keepdim=False):
    """host_check of `_aminmax`: the CPU's deprecation warning, once per process and overload (two
    TORCH_WARN_ONCEs) unless torch.set_warn_always(True)."""
    overload = "_aminmax" if dim is None else "_aminmax.dim"
    if torch.is_warn_always_enabled() or not _aminmax_warned[overload]:
        _aminmax_warned[overload] = True
        warn_at_caller(_AMINMAX_DEPRECATED)


def _aminmax_meta(a, dim=None, keepdim=False):
    """PyTorch ships `_aminmax` without a Meta kernel: aminmax's shapes and errors."""
    return torch.aminmax(a) if dim is None else torch.aminmax(a, dim=dim, keepdim=keepdim)


@lowering(
    "_aminmax",
    "_aminmax.dim",
    real_only=True,
    host_check=_aminmax_deprecation,
    missing_meta={"_aminmax": _aminmax_meta, "_aminmax.dim": _aminmax_meta},
)
def deprecated_aminmax(a, dim=None, keepdim=False):
    """`_aminmax(a)` and `_aminmax(a, dim, keepdim)`: `aminmax` under its old name."""
    return aminmax(a, dim, keepdim)


@lowering("count_nonzero", "count_nonzero.dim_IntList", no_loop_for=WIDE_UNSIGNED)
def count_nonzero(a, dim=None):
    return jnp.sum(a != 0, axis=_dims(a, dim), dtype=jnp.int64)


@lowering("logsumexp")
def logsumexp(a, dim, keepdim=False):
    if not jnp.issubdtype(a.dtype, jnp.inexact):
        a = a.astype(jnp.float32)
    x = a.astype(opmath(a.dtype))
    axis = _dims(a, dim)
    # the shift is the largest real part (complex too: log's principal branch does not depend on it)
    re = x.real if jnp.iscomplexobj(x) else x
    m = jnp.max(re, axis=axis, keepdims=True) if x.size else jnp.zeros((1,) * x.ndim, re.dtype)
    m = jnp.where(jnp.isinf(m), 0, m)  # all -inf (or an inf) rows: PyTorch's answer comes from the sum
    out = jnp.log(jnp.sum(jnp.exp(x - m), axis=axis, keepdims=True)) + m
    if not keepdim:
        out = jnp.squeeze(out, axis) if axis is not None else out.reshape(())
    return out.astype(a.dtype)


# ---------------------------------------------------------------- scans
def _axis(a, dim):
    return dim % a.ndim if a.ndim else None


def _no_bool_scan_check(kernel):
    """meta_check of cumsum/cumprod: their CPU and CUDA kernels have no bool version, so a bool result
    (dtype=torch.bool, a bool `out`, a bool tensor scanned in place) of a scan that runs (an input with
    elements and dims) raises; a bool input scanned into int64 (the default) is fine."""

    def result_dtype(a, args, dtype, out, inplace):
        dtype = args[1] if dtype is None and len(args) > 1 else dtype
        if out is not None or inplace:
            return (out if out is not None else a).dtype
        if dtype is not None:
            return dtype
        return torch.int64 if a.dtype == torch.bool or not (a.is_floating_point() or a.is_complex()) else a.dtype

    def check(inplace):
        def run(a, *args, dtype=None, out=None, **kwargs):
            result = result_dtype(a, args, dtype, out, inplace)
            if a.dim() and a.numel() and result in (torch.bool, *WIDE_UNSIGNED):
                raise not_implemented_for(kernel, result)

        return run

    return {kernel: check(False), f"{kernel}.out": check(False), f"{kernel}_": check(True)}


@lowering("cumsum", meta_check=_no_bool_scan_check("cumsum"), reduction_buckets=_scan_plan("sum"))
def cumsum(a, dim, dtype=None):
    d = _acc_dtype(a, dtype)
    x = a.astype(opmath(d))
    return (jnp.cumsum(x, axis=_axis(a, dim)) if a.ndim else x).astype(d)


@lowering("cumprod", meta_check=_no_bool_scan_check("cumprod"), reduction_buckets=_scan_plan("prod"))
def cumprod(a, dim, dtype=None):
    d = _acc_dtype(a, dtype)
    x = a.astype(opmath(d))
    return (jnp.cumprod(x, axis=_axis(a, dim)) if a.ndim else x).astype(d)


def _logcumsumexp_check(a, *args, out=None, **kwargs):
    # the out dtype first, then the input's: the CPU and CUDA kernels take floating and complex types
    # only, even for no elements (a 0-dim or empty integer input raises too)
    if out is not None:
        same_scalar_type_out_check(a, *args, out=out, **kwargs)
    if not (a.is_floating_point() or a.is_complex()):
        raise not_implemented_for("logcumsumexp", a.dtype)


@lowering(
    "logcumsumexp",
    meta_check=dict.fromkeys(("logcumsumexp", "logcumsumexp.out"), _logcumsumexp_check),
    reduction_buckets=_scan_plan("max"),
)
def logcumsumexp(a, dim):
    x = a.astype(opmath(a.dtype))
    if not (a.ndim and a.size):
        return x.astype(a.dtype)
    from ..device.platform import lowering_platform

    if x.dtype == jnp.float64 and lowering_platform() == "tpu":
        # JAX lowers the scan for a TPU as a reduce_window over a logaddexp body, which XLA:TPU (emulating
        # float64) took 189 s to compile for 20 elements, this log-depth scan of the same combine 67 s
        return lax.associative_scan(jnp.logaddexp, x, axis=_axis(a, dim))
    return lax.cumlogsumexp(x, axis=_axis(a, dim)).astype(a.dtype)


def _cum_extreme(a, dim, better):
    """cummax/cummin with indices: the later element wins ties and NaN beats everything (PyTorch)."""
    if a.ndim == 0:
        return a, jnp.zeros((), jnp.int64)
    axis = _axis(a, dim)
    idx = lax.broadcasted_iota(jnp.int64, a.shape, axis)
    nan = jnp.isnan(a) if jnp.issubdtype(a.dtype, jnp.floating) else None

    def combine(left, right):
        lv, li = left[0], left[1]
        rv, ri = right[0], right[1]
        take = better(rv, lv)
        if nan is not None:
            take = jnp.isnan(rv) | (~jnp.isnan(lv) & take)
        return jnp.where(take, rv, lv), jnp.where(take, ri, li)

    if a.size == 0:
        return a, idx
    v, i = lax.associative_scan(combine, (a, idx), axis=axis)
    return v, i


@lowering(
    "cummax",
    real_only=True,
    meta_check={"cummax.out": same_scalar_type_out_check},
    no_loop_for=WIDE_UNSIGNED,
    reduction_buckets=_scan_plan("max"),
)
def cummax(a, dim):
    return _cum_extreme(a, dim, lambda r, l: r >= l)


@lowering(
    "cummin",
    real_only=True,
    meta_check={"cummin.out": same_scalar_type_out_check},
    no_loop_for=WIDE_UNSIGNED,
    reduction_buckets=_scan_plan("min"),
)
def cummin(a, dim):
    return _cum_extreme(a, dim, lambda r, l: r <= l)


# ---------------------------------------------------------------- sorting and selection
# unique's values decide its shape (eager/data_dependent.py implements it)
real_only_without_lowering("_unique2", "unique_dim", "unique_consecutive")


def _sort(a, axis, descending):
    """Stable sort along `axis` -> (values, int64 indices); NaN sorts as the largest value."""
    if a.ndim == 0:
        return a, jnp.zeros((), jnp.int64)
    keys = a.astype(jnp.uint8) if a.dtype == jnp.bool_ else a
    idx = lax.broadcasted_iota(jnp.int64, a.shape, axis)
    if descending:
        # reverse, sort ascending stably, reverse back: descending order with ties in index order
        keys, idx = jnp.flip(keys, axis), jnp.flip(idx, axis)
    keys, idx = lax.sort((keys, idx), dimension=axis, is_stable=True, num_keys=1)
    if descending:
        keys, idx = jnp.flip(keys, axis), jnp.flip(idx, axis)
    return keys.astype(a.dtype), idx


# the CPU's words for complex input (a RuntimeError, leading space and all)
_SORT_COMPLEX = " Sort does not support complex dtypes on CPU"


@lowering("sort", real_only=_SORT_COMPLEX)
def sort(a, dim=-1, descending=False):
    return _sort(a, _axis(a, dim), descending)


@lowering("sort.stable", real_only=_SORT_COMPLEX)
def sort_stable(a, stable=None, dim=-1, descending=False):
    return _sort(a, _axis(a, dim), descending)


def _topk_bool_check(a, *_, **__):
    if a.dtype == torch.bool:
        raise RuntimeError("topk does not support bool dtypes on CPU")  # (its words; no dtype dispatch)


@lowering(
    "topk",
    real_only=" topk does not support complex dtypes on CPU",
    no_loop_for=WIDE_UNSIGNED,
    meta_check=dict.fromkeys(("topk", "topk.values"), _topk_bool_check),
)
def topk(a, k, dim=-1, largest=True, sorted=True):
    if a.ndim == 0:
        return a, jnp.zeros((), jnp.int64)
    axis = _axis(a, dim)
    v, i = _sort(a, axis, largest)
    return lax.slice_in_dim(v, 0, k, axis=axis), lax.slice_in_dim(i, 0, k, axis=axis)


def _pick(v, i, pos, axis, keepdim):
    """Take position `pos` (an int or an array broadcast against the reduced shape) along axis."""
    if isinstance(pos, int):
        v, i = lax.index_in_dim(v, pos, axis, keepdims=True), lax.index_in_dim(i, pos, axis, keepdims=True)
    else:
        pos = jnp.expand_dims(pos, axis)
        v, i = jnp.take_along_axis(v, pos, axis), jnp.take_along_axis(i, pos, axis)
    if not keepdim:
        v, i = jnp.squeeze(v, axis), jnp.squeeze(i, axis)
    return v, i


@lowering(
    "kthvalue",
    no_loop_for=WIDE_UNSIGNED,
    real_only=True,
    meta_check=_empty_reduction_check(
        "kthvalue()",
        "kthvalue",
        "kthvalue.values",
        dim_at=2,
        default_dim=-1,
        then=_no_bool_kernel("kthvalue", lambda a: a.dim()),
    ),
    write_overlap=WriteOverlap(no_overlap=("self",)),  # the CPU's assert_no_overlap(self, values)
)
def kthvalue(a, k, dim=-1, keepdim=False):
    if a.ndim == 0:
        return a, jnp.zeros((), jnp.int64)
    axis = _axis(a, dim)
    v, i = _sort(a, axis, False)
    return _pick(v, i, k - 1, axis, keepdim)


def _median(a, dim, keepdim, ignore_nan):
    if a.ndim == 0:
        return a, jnp.zeros((), jnp.int64)
    axis = _axis(a, dim)
    v, i = _sort(a, axis, False)
    n = a.shape[axis]
    if ignore_nan and jnp.issubdtype(a.dtype, jnp.floating):
        valid = jnp.sum(~jnp.isnan(a), axis=axis)
        pos = jnp.maximum((valid - 1) // 2, 0)
        return _pick(v, i, pos, axis, keepdim)
    if jnp.issubdtype(a.dtype, jnp.floating):
        # any NaN makes the median NaN: the first NaN of the sorted row (NaNs sort last)
        nans = jnp.sum(jnp.isnan(a), axis=axis)
        pos = jnp.where(nans > 0, n - nans, (n - 1) // 2)
        return _pick(v, i, pos, axis, keepdim)
    return _pick(v, i, (n - 1) // 2, axis, keepdim)


@lowering(
    "median.dim",
    real_only=True,
    meta_check=_empty_reduction_check("median()", "median.dim", "median.dim_values", then=_no_bool_kernel("median")),
)
def median_dim(a, dim, keepdim=False):
    return _median(a, dim, keepdim, False)


@lowering(
    "nanmedian.dim",
    real_only=True,
    meta_check=_empty_reduction_check(
        "median()", "nanmedian.dim", "nanmedian.dim_values", then=_no_bool_kernel("median")
    ),
)
def nanmedian_dim(a, dim, keepdim=False):
    return _median(a, dim, keepdim, True)


# The CPU's median of no elements is NaN converted to the dtype by x86's truncating conversions (NaN
# becomes the "integer indefinite" 0x80...0 of the 32- or 64-bit conversion, narrower types keep its
# low bits, 0); XLA converts NaN to 0, so the integer results are spelled out.
_EMPTY_MEDIAN = {jnp.dtype(jnp.int32): -(2**31), jnp.dtype(jnp.int64): -(2**63), jnp.dtype(jnp.uint64): 2**63}


def _whole_median(a, ignore_nan):
    if a.size == 0:
        if jnp.issubdtype(a.dtype, jnp.inexact):
            return jnp.full((), jnp.nan, a.dtype)
        return jnp.full((), True if a.dtype == jnp.bool_ else _EMPTY_MEDIAN.get(a.dtype, 0), a.dtype)
    return _median(a.reshape(-1), 0, False, ignore_nan)[0]


_WHOLE_MEDIAN_CHECK = _no_bool_kernel("median", lambda a: a.numel())  # (no elements: True, as the CPU)


@lowering("median", real_only=True, meta_check=_WHOLE_MEDIAN_CHECK, no_loop_for=WIDE_UNSIGNED)
def median(a):
    return _whole_median(a, False)


@lowering("nanmedian", real_only=True, meta_check=_WHOLE_MEDIAN_CHECK, no_loop_for=WIDE_UNSIGNED)
def nanmedian(a):
    return _whole_median(a, True)


def _mode_out_check(a, *args, values=None, indices=None, **kwargs):
    """meta_check of mode.values: the CPU's dtype checks of its outputs (the meta kernel has none)."""
    for out, want, what in ((values, a.dtype, "values"), (indices, torch.int64, "indices")):
        if isinstance(out, torch.Tensor) and out.dtype != want:
            raise RuntimeError(
                f"expected scalar type '{scalar_type_name(want)}' but got '{scalar_type_name(out.dtype)}' "
                f"for {what} output"
            )


def _mode_check(a, *args, **kwargs):
    _mode_out_check(a, *args, **kwargs)
    _empty_reduction_check("mode()", "mode", default_dim=-1)["mode"](a, *args, **kwargs)


@lowering(
    "mode", real_only=True, meta_check={"mode": _mode_check, "mode.values": _mode_check}, no_loop_for=WIDE_UNSIGNED
)
def mode(a, dim=-1, keepdim=False):
    """Most frequent value (the smallest among equally frequent ones) and its last index."""
    if a.ndim == 0:
        return a, jnp.zeros((), jnp.int64)
    axis = _axis(a, dim)
    v, i = _sort(a, axis, False)
    n = a.shape[axis]
    pos = lax.broadcasted_iota(jnp.int64, a.shape, axis)
    prev = jnp.concatenate([lax.slice_in_dim(v, 0, 1, axis=axis), lax.slice_in_dim(v, 0, n - 1, axis=axis)], axis)
    nxt = jnp.concatenate([lax.slice_in_dim(v, 1, n, axis=axis), lax.slice_in_dim(v, n - 1, n, axis=axis)], axis)
    starts = (pos == 0) | (v != prev)
    ends = (pos == n - 1) | (v != nxt)
    run_start = lax.cummax(jnp.where(starts, pos, 0), axis=axis)
    run_end = lax.cummin(jnp.where(ends, pos, n - 1), axis=axis, reverse=True)
    count = run_end - run_start + 1
    best = jnp.argmax(count, axis=axis)  # first (smallest value) among the most frequent
    last = jnp.take_along_axis(run_end, jnp.expand_dims(best, axis), axis).squeeze(axis)
    # PyTorch reports the largest original index of the mode; the sort is stable, so the run's end
    idx = jnp.max(jnp.where((v == jnp.take_along_axis(v, jnp.expand_dims(last, axis), axis)), i, -1), axis=axis)
    val = jnp.take_along_axis(v, jnp.expand_dims(last, axis), axis).squeeze(axis)
    if keepdim:
        val, idx = jnp.expand_dims(val, axis), jnp.expand_dims(idx, axis)
    return val, idx


# ---------------------------------------------------------------- norms
def _is_static(x):
    return isinstance(x, (int, float, bool))


def _norm(x, ord, axis, keepdim):
    """sum(|x|^ord)^(1/ord) and its limits; `ord` may be a traced Scalar (all branches, selected)."""
    ax = jnp.abs(x)
    if _is_static(ord):
        if ord == float("inf"):
            return jnp.max(ax, axis=axis, keepdims=keepdim)
        if ord == float("-inf"):
            return jnp.min(ax, axis=axis, keepdims=keepdim)
        if ord == 0:
            return jnp.sum((ax != 0).astype(x.dtype), axis=axis, keepdims=keepdim)
        if ord == 1:
            return jnp.sum(ax, axis=axis, keepdims=keepdim)
        if ord == 2:
            return jnp.sqrt(jnp.sum(ax * ax, axis=axis, keepdims=keepdim))
        return jnp.sum(ax**ord, axis=axis, keepdims=keepdim) ** (1.0 / ord)
    ord = jnp.asarray(ord, x.dtype)
    safe = jnp.where((ord == 0) | jnp.isinf(ord), 1, ord)
    general = jnp.sum(ax**safe, axis=axis, keepdims=keepdim) ** (1 / safe)
    two = jnp.sqrt(jnp.sum(ax * ax, axis=axis, keepdims=keepdim))
    general = jnp.where(ord == 2, two, general)
    zero = jnp.sum((ax != 0).astype(x.dtype), axis=axis, keepdims=keepdim)
    if x.size:
        hi, lo = jnp.max(ax, axis=axis, keepdims=keepdim), jnp.min(ax, axis=axis, keepdims=keepdim)
    else:
        hi = lo = zero
    return jnp.where(ord == 0, zero, jnp.where(ord == jnp.inf, hi, jnp.where(ord == -jnp.inf, lo, general)))


def _norm_dtype(d):
    """A norm's result type: real, a complex input's real counterpart (casting the complex value to it
    would warn in JAX)."""
    return jnp.finfo(d).dtype if jnp.issubdtype(d, jnp.complexfloating) else d


@lowering("linalg_vector_norm", static_scalars=True)
def vector_norm(a, ord=2, dim=None, keepdim=False, dtype=None):
    d = dtype or a.dtype
    x = a.astype(opmath(d))
    return _norm(x, ord, _dims(a, dim), keepdim).astype(_norm_dtype(d))


@lowering("norm.Scalar", "norm.ScalarOpt_dim", "norm.ScalarOpt_dim_dtype", "norm.ScalarOpt_dtype", static_scalars=True)
def norm(a, p=2, dim=None, keepdim=False, dtype=None):
    if p is None:
        p = 2
    d = dtype or a.dtype
    return _norm(a.astype(opmath(d)), p, _dims(a, dim), keepdim).astype(_norm_dtype(d))


@lowering("dist", static_scalars=True)
def dist(a, b, p=2):
    diff = a - b
    return _norm(diff.astype(opmath(diff.dtype)), p, None, False).astype(_norm_dtype(diff.dtype))


@lowering("renorm", static_scalars=True)
def renorm(a, p, dim, maxnorm):
    x = a.astype(opmath(a.dtype))
    axis = tuple(d for d in range(a.ndim) if d != dim % a.ndim)
    n = _norm(x, p, axis, True)
    scale = jnp.where(n > maxnorm, maxnorm / (n + 1e-7), 1.0)
    return (x * scale).astype(a.dtype)


def _histc_bounds_check(a, bins=100, min=0, max=0, **kwargs):
    """host_check of histc: given bounds (min != max) with a NaN or infinite end raise at the op with the
    CPU's words (C++ stream formatting: %g); a range taken from the data is checked on the device."""
    if min != max and not (math.isfinite(min) and math.isfinite(max)):
        raise RuntimeError(f"torch.histc: range of [{float(min):g}, {float(max):g}] is not finite")


@lowering(
    "histc",
    real_only=True,
    host_check=dict.fromkeys(("histc", "histc.out"), _histc_bounds_check),
    # the CPU has no integer loop, CUDA has (its kernel takes every integer but the wide unsigned), and
    # Transformers' MoE counts experts with `histc(expert_ids.int())` on every device but the CPU: as CUDA
    no_loop_for=(torch.bool, *WIDE_UNSIGNED),
)
def histc(a, bins=100, min=0, max=0):
    # PyTorch: min == max means the data's own range; values outside [min, max] are ignored
    x = a.astype(jnp.float32) if not jnp.issubdtype(a.dtype, jnp.floating) else a
    if x.size == 0:  # nothing to count (and no range to take from the data)
        return jnp.zeros((bins,), a.dtype)
    lo = jnp.where(min == max, jnp.min(x), min).astype(x.dtype)
    hi = jnp.where(min == max, jnp.max(x), max).astype(x.dtype)
    # the CPU and CUDA read the range back and refuse NaN or infinite ends; here a device-side check
    # (raised at the next sync, as CUDA's asserts) instead of a sync per call
    require(
        jnp.isfinite(lo) & jnp.isfinite(hi),
        "torch.histc: range is not finite (a NaN or infinite min or max)",
        recoverable=True,
    )
    same = hi == lo  # PyTorch widens an empty range by one on each side
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    idx = jnp.floor((x - lo) * bins / (hi - lo)).astype(jnp.int64)
    idx = jnp.where(x == hi, bins - 1, idx)
    valid = (x >= lo) & (x <= hi)
    counts = (
        jnp.zeros((bins,), jnp.float32)
        .at[jnp.where(valid, idx, 0).reshape(-1)]
        .add(valid.reshape(-1).astype(jnp.float32))
    )
    return counts.astype(a.dtype)


def _histogram_counts(x, idx, valid, weight, bins, density, edges):
    w = jnp.ones_like(x) if weight is None else weight.astype(x.dtype).reshape(-1)
    hist = jnp.zeros((bins,), x.dtype).at[jnp.where(valid, idx, 0)].add(jnp.where(valid, w, 0))
    if density:
        hist = hist / (jnp.sum(hist) * jnp.diff(edges))
    return hist


# Meta kernels of histogram, which PyTorch ships without one (the engine needs the output shapes)
def _histogram_bin_ct_meta(self, bins=100, *, range=None, weight=None, density=False):
    return self.new_empty((bins,)), self.new_empty((bins + 1,))


def _histogram_bin_ct_out_meta(self, bins=100, *, range=None, weight=None, density=False, hist, bin_edges):
    return hist.resize_((bins,)), bin_edges.resize_((bins + 1,))


def _histogram_bins_tensor_meta(self, bins, *, weight=None, density=False):
    return self.new_empty((bins.shape[0] - 1,)), self.new_empty((bins.shape[0],))


def _histogram_bins_tensor_out_meta(self, bins, *, weight=None, density=False, hist, bin_edges):
    return hist.resize_((bins.shape[0] - 1,)), bin_edges.resize_((bins.shape[0],))


# histogramdd, the CPU kernel of every histogram overload, computes in float32 and float64 only
HISTOGRAM_NO_LOOP = (*NOT_FLOATING, torch.float16, torch.bfloat16)


@lowering(
    "histogram.bin_ct",
    missing_meta={"histogram.bin_ct": _histogram_bin_ct_meta, "histogram.bin_ct_out": _histogram_bin_ct_out_meta},
    no_loop_for=HISTOGRAM_NO_LOOP,
)
def histogram(a, bins=100, range=None, weight=None, density=False):
    from .factories import linspace

    x = a.reshape(-1)
    if range is not None:
        lo, hi = jnp.asarray(range[0], jnp.float64), jnp.asarray(range[1], jnp.float64)
    elif x.size:
        lo, hi = jnp.min(x).astype(jnp.float64), jnp.max(x).astype(jnp.float64)
    else:
        lo, hi = jnp.asarray(0.0, jnp.float64), jnp.asarray(1.0, jnp.float64)
    same = lo == hi  # PyTorch widens an empty range by half a unit each way
    lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
    edges = linspace(lo, hi, bins + 1, dtype=a.dtype)
    # the linear guess, then one step of local search against the actual edges (PyTorch's CPU way)
    pos = jnp.clip(jnp.floor((x - edges[0]) * bins / (edges[-1] - edges[0])).astype(jnp.int64), 0, bins - 1)
    pos = jnp.where((x < edges[pos]) & (pos > 0), pos - 1, pos)
    pos = jnp.where((x >= edges[jnp.minimum(pos + 1, bins)]) & (pos + 1 < bins), pos + 1, pos)
    valid = (x >= edges[0]) & (x <= edges[-1])
    return _histogram_counts(x, pos, valid, weight, bins, density, edges), edges


@lowering(
    "histogram.bins_tensor",
    missing_meta={
        "histogram.bins_tensor": _histogram_bins_tensor_meta,
        "histogram.bins_tensor_out": _histogram_bins_tensor_out_meta,
    },
    no_loop_for=HISTOGRAM_NO_LOOP,
)
def histogram_bins_tensor(a, bins, weight=None, density=False):
    x, edges = a.reshape(-1), bins.astype(a.dtype)
    n = edges.shape[0] - 1
    pos = jnp.searchsorted(edges, x, side="right") - 1
    pos = jnp.where(x == edges[-1], n - 1, pos)  # the last bin is closed on the right
    valid = (x >= edges[0]) & (x <= edges[-1])
    return _histogram_counts(x, pos, valid, weight, n, density, edges), edges


def nonzero_indices(a, size, fill_value=None):
    """`jnp.nonzero(a, size=size, fill_value=fill_value)` as int64 arrays, with the positions counted and
    unravelled in int32 where they fit: JAX's form unravels int64 flat positions with 64-bit `//` and `%`,
    which XLA:TPU compiles as a long emulation (a bfloat16 masked_select of 50 elements: 38 s for v5e
    against 4 s this way, side by side under load ~15). Same values, padding included."""
    fills = fill_value if isinstance(fill_value, tuple) else (fill_value,) * a.ndim
    if a.size == 0 and fill_value is not None:  # all padding (JAX's form gave zeros there)
        return tuple(jnp.full((size,), f, jnp.int64) for f in fills)
    if a.ndim == 0 or a.size == 0 or size == 0 or a.size >= 2**31:
        return tuple(i.astype(jnp.int64) for i in jnp.nonzero(a, size=size, fill_value=fill_value))
    mask = (a if a.dtype == jnp.bool_ else a != 0).reshape(-1)
    rank = jnp.cumsum(mask, dtype=jnp.int32)  # the true elements up to and including each one
    # position of the (j+1)-th true element: how many elements have fewer than j+1 true up to them
    flat = jnp.cumsum(jnp.zeros(size, jnp.int32).at[rank].add(1, mode="drop"), dtype=jnp.int32)
    out = []
    for n in reversed(a.shape):
        out.append((flat % n).astype(jnp.int64))
        flat = flat // n
    out.reverse()
    if fill_value is not None:
        pad = jnp.arange(size, dtype=jnp.int32) >= rank[-1]
        out = [jnp.where(pad, jnp.asarray(f, jnp.int64), i) for f, i in zip(fills, out)]
    return tuple(out)


@lowering("nonzero_static")
def nonzero_static(a, size, fill_value=-1):
    if a.ndim == 0:
        return jnp.full((size, 0), fill_value, jnp.int64)
    return jnp.stack(nonzero_indices(a, size, fill_value), axis=1)


def _segment_reduce(data, reduce, lengths, offsets, axis, initial):
    """PyTorch's segment_reduce: segments along `axis` given by lengths (or offsets), batched over
    the dimensions before `axis`. Each output is a masked reduction over a (segments, N) one-hot."""
    axis = axis % data.ndim
    if offsets is not None:
        lengths = jnp.diff(offsets, axis=-1)
    lead, n = data.shape[:axis], data.shape[axis]
    s = lengths.shape[-1]
    ends = jnp.cumsum(lengths, axis=-1)  # (lead..., S)
    pos = jnp.arange(n)
    member = (pos >= (ends - lengths)[..., None]) & (pos < ends[..., None])  # (lead..., S, N)
    x = to_opmath(data)
    x = jnp.expand_dims(x, axis)  # (lead..., 1, N, rest...)
    rest = data.ndim - axis - 1
    m = member.reshape(member.shape + (1,) * rest)  # (lead..., S, N, 1...)
    count = jnp.sum(member, axis=-1).reshape(lead + (s,) + (1,) * rest).astype(x.dtype)
    if reduce in ("sum", "mean"):
        out = jnp.sum(jnp.where(m, x, 0), axis=axis + 1)
        if initial is not None:
            out = out + initial
        if reduce == "mean":
            out = jnp.where(
                count > 0, out / jnp.where(count > 0, count, 1), initial if initial is not None else jnp.nan
            )
    elif reduce == "prod":
        out = jnp.prod(jnp.where(m, x, 1), axis=axis + 1)
        if initial is not None:
            out = out * initial
    elif reduce in ("max", "min"):
        fill = -jnp.inf if reduce == "max" else jnp.inf
        pick = jnp.max if reduce == "max" else jnp.min
        out = pick(jnp.where(m, x, fill), axis=axis + 1)
        if initial is not None:
            out = (jnp.maximum if reduce == "max" else jnp.minimum)(out, initial)
    else:
        raise ValueError(f"segment_reduce: unsupported reduction {reduce}")
    return out.astype(data.dtype)


@lowering("segment_reduce", real_only=True, no_loop_for=NOT_FLOATING)
def segment_reduce(data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    size = data.shape[axis % data.ndim]
    if lengths is not None:
        require(lengths >= 0, "segment_reduce(): lengths contains negative value!")
        if not unsafe:
            require(
                jnp.sum(lengths, axis=-1) == size,
                "segment_reduce(): Expected all rows of lengths along "
                "axis to sum to data.size(lengths.dim()-1) when !unsafe.",
            )
    elif offsets is not None and offsets.shape[-1] and not unsafe:
        require(jnp.diff(offsets, axis=-1) >= 0, "segment_reduce(): lengths contains negative value!")
        require(
            (offsets[..., 0] == 0) & (offsets[..., -1] == size),
            "segment_reduce(): Expected all rows of offsets to start at 0 and end at data.size(axis) when !unsafe.",
        )
    return _segment_reduce(data, reduce, lengths, offsets, axis, initial)


@lowering("_segment_reduce_backward")
def segment_reduce_backward(grad, output, data, reduce, lengths=None, offsets=None, axis=0, initial=None):
    x = to_opmath(data)
    _, vjp = jax.vjp(lambda v: _segment_reduce(v, reduce, lengths, offsets, axis, initial).astype(v.dtype), x)
    return vjp(grad.astype(x.dtype))[0].astype(data.dtype)


@lowering("hash_tensor", real_only=True, no_loop_for=WIDE_UNSIGNED)
def hash_tensor(x, dim=(), keepdim=False, mode=0):
    """The xor of the elements' 64-bit patterns (floats widened to float64, integers to 64 bits), as a
    uint64: PyTorch's mode 0, the only one."""
    if mode != 0:
        raise RuntimeError(f"hash_tensor only supports mode=0 (xor_sum), got {mode}")
    if jnp.issubdtype(x.dtype, jnp.floating):
        wide = x.astype(jnp.float64)
    else:
        wide = x.astype(jnp.uint64 if jnp.issubdtype(x.dtype, jnp.unsignedinteger) else jnp.int64)
    bits = lax.bitcast_convert_type(wide, jnp.uint64)
    # a 0-dim tensor's dim 0 is itself: nothing to reduce
    axes = tuple(sorted({d % x.ndim for d in dim})) if dim and x.ndim else tuple(range(x.ndim))
    out = lax.reduce(bits, jnp.uint64(0), lax.bitwise_xor, axes) if axes else bits
    return jnp.expand_dims(out, axes) if keepdim and axes else out
