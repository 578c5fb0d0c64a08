"""The lowering table: ATen op -> pure JAX function. The single source of truth for eager and compile.

A lowering receives the op's arguments as the schema orders them, with tensors as JAX arrays,
`Scalar`s as Python numbers or weakly typed 0-d arrays, dtypes as jnp dtypes, and returns JAX
arrays (a tuple for several outputs). It holds no PyTorch objects.

    @lowering("add.Tensor", "add.Scalar", promote=KIND.DEFAULT)
    def add(a, b, alpha=1):
        return a + b * alpha

`promote=` applies PyTorch's elementwise type promotion before and after the function: tensor
operands arrive already cast to the computation dtype (float32 for half types, as PyTorch's opmath),
the result is cast to PyTorch's result dtype. In-place (`add_`) and `out=` variants are derived from
the functional op: nobody writes them by hand. `random=True` lowerings receive a `key=` PRNG key.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from .dtypes import KIND, operand_facts, promote, scalar_type_name

__all__ = ["lowering", "LOWERINGS", "Lowering", "KIND", "apply"]


@dataclasses.dataclass(frozen=True)
class Lowering:
    name: str
    fn: Callable
    promote: KIND | None = None
    promote_args: tuple | None = None   # positions of the operands that take part (default: all)
    random: bool = False
    keep_result_dtype: bool = False     # the function returns PyTorch's dtype itself
    mutates: tuple = ()                 # ((position, name), ...) written although the schema says not
    static_scalars: bool = False        # Scalars decide shapes (arange): compile per value
    traced: tuple = ()                  # names of float/int arguments to trace like Scalars (lr)


LOWERINGS: dict[str, Lowering] = {}


def lowering(*names, promote=None, promote_args=None, random=False, keep_result_dtype=False, mutates=(),
             static_scalars=False, traced=()):
    """Register `fn` as the lowering of the ATen ops `names` ("add.Tensor", "relu.default", ...)."""

    def register(fn):
        for name in names:
            full = name if "." in name else name + ".default"
            if full in LOWERINGS:
                raise ValueError(f"two lowerings for aten::{full}")
            LOWERINGS[full] = Lowering(full, fn, promote, promote_args, random, keep_result_dtype, mutates,
                                       static_scalars, tuple(traced))
        return fn

    return register


def _cast(v, dtype):
    if hasattr(v, "dtype") and not getattr(v, "weak_type", False):
        return v if v.dtype == dtype else v.astype(dtype)
    return v


# ATen ops whose CPU and CUDA kernels reject complex inputs (orderings, rounding, activations and
# special functions with no complex meaning). Their lowerings would compute something (JAX orders
# complex numbers lexicographically), so complex inputs raise here, as on those devices.
REAL_ONLY = frozenset({
    "lt", "le", "gt", "ge", "maximum", "minimum", "fmax", "fmin", "clamp", "clamp_min", "clamp_max",
    "max", "min", "amax", "amin", "aminmax", "argmax", "argmin", "sort", "topk", "kthvalue", "median",
    "nanmedian", "mode", "cummax", "cummin", "_unique2", "unique_dim", "unique_consecutive",
    "searchsorted", "bucketize", "histc", "round", "sign", "signbit", "floor", "ceil", "trunc", "frac",
    "remainder", "fmod", "floor_divide", "copysign", "heaviside", "atan2", "xlogy", "special_xlog1py",
    "logit", "nansum", "erf", "erfc", "erfinv", "lgamma", "digamma", "relu", "_softmax", "_log_softmax",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift",
    "elu", "glu", "hardshrink", "softshrink", "hardtanh", "leaky_relu", "log_sigmoid_forward", "mish",
    "softplus", "threshold", "_prelu_kernel", "rrelu_with_noise", "hardsigmoid", "hardswish",
    "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "_batch_norm_with_update", "_batch_norm_no_update", "native_group_norm", "native_layer_norm",
    "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "max_pool2d_with_indices",
    "max_pool3d_with_indices", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "upsample_bicubic2d", "upsample_trilinear3d",
    "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa", "mse_loss", "smooth_l1_loss", "huber_loss",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "nll_loss_forward", "nll_loss2d_forward",
    "multi_margin_loss", "multilabel_margin_loss_forward", "segment_reduce", "index_reduce",
    "special_airy_ai", "special_bessel_j0", "special_bessel_j1", "special_bessel_y0", "special_bessel_y1",
    "special_erfcx", "special_modified_bessel_i0", "special_modified_bessel_i1", "special_modified_bessel_k0",
    "special_modified_bessel_k1", "special_scaled_modified_bessel_k0", "special_scaled_modified_bessel_k1",
    "special_spherical_bessel_j0", "gcd", "lcm", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "adaptive_max_pool3d", "hash_tensor",
})


def reject_complex(name, values):
    """Raise as PyTorch's kernels do when an op of REAL_ONLY (`name` its ATen name, an in-place or out=
    variant included) gets a complex tensor or array among `values`."""
    base = name.split(".")[0]
    base = base[:-1] if base.endswith("_") and not base.endswith("__") else base
    if base not in REAL_ONLY:
        return
    for v in values:   # torch (meta) tensors or JAX arrays: their dtype names agree
        kind = str(getattr(v, "dtype", "")).replace("torch.", "")
        if kind in ("complex64", "complex128"):
            raise NotImplementedError(f'"{base}_tpu" not implemented for \'{scalar_type_name(kind)}\'')


def apply(low: Lowering, args, kwargs):
    """Call a lowering with PyTorch's type promotion applied around it."""
    reject_complex(low.name, (*args, *kwargs.values()))   # (at tracing time only: no cost per call)
    if low.promote is None:
        return low.fn(*args, **kwargs)
    positions = low.promote_args if low.promote_args is not None else range(len(args))
    operands = [args[i] for i in positions if i < len(args)]
    compute, result = promote(low.promote, operand_facts(operands))
    args = list(args)
    for i in positions:
        if i < len(args) and args[i] is not None:
            args[i] = _cast(args[i], compute) if hasattr(args[i], "dtype") else args[i]
    out = low.fn(*args, **kwargs)
    if low.keep_result_dtype:
        return out
    if isinstance(out, tuple):
        return tuple(o.astype(result) if o.dtype != result else o for o in out)
    return out.astype(result) if out.dtype != result else out

