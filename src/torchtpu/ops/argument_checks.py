"""Checks on an op's Scalar arguments that PyTorch's CPU and CUDA kernels make on the host.

A Scalar argument travels into the eager executable as a traced value (a changing fill value or
exponent must not recompile), so its value is not known when the executable is built: these checks
run per call, before the op, and only for the ops that declare one (`@lowering(..., host_check=...)`,
gathered in CHECKS; a check costs about a microsecond). A check's optional `can_raise(*args,
**kwargs)` says whether it can raise for some value of the numbers, given everything else about the
call (types, dtypes): when it cannot, the eager engine's C++ fast path may skip it. Values known at
build time (ints and floats that key the cache) are checked by the lowerings themselves; values on
the device by device-side asserts (ops/checks.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import warnings

import torch

from .table import declared_facts

__all__ = [
    "CHECKS",
    "bool_mask_check",
    "check_convertible",
    "cpp_type_name",
    "deterministic_alert",
    "deterministic_alerts_off",
    "factory_value_check",
    "fill_value_check",
    "index_fill_value_check",
    "no_internal_overlap",
    "out_overlaps_inputs_check",
    "overflows",
    "pow_exponent_check",
    "random_bounds_check",
    "random_type_name",
    "same_dtype_out_check",
    "same_scalar_type_out_check",
    "warn_at_caller",
    "wrap",
]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def warn_at_caller(message, category=UserWarning):
    """A warning attributed to the first frame outside torchtpu, where PyTorch's C++ warnings land:
    the "default" filter then shows one per line of user code, as on the CPU."""
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def deterministic_alert(caller, applies=None):
    """host_check of an op whose CPU kernel calls alertNotDeterministic(caller) (where `applies(*args,
    **kwargs)`, if given): under torch.use_deterministic_algorithms(True) the CPU's RuntimeError, with
    warn_only its warning, per call (the setting may change between calls of one cached executable)."""

    def check(*args, **kwargs):
        if not torch.are_deterministic_algorithms_enabled() or (applies is not None and not applies(*args, **kwargs)):
            return
        if torch.is_deterministic_algorithms_warn_only_enabled():
            warn_at_caller(
                f"{caller} does not have a deterministic implementation, but you set "
                "'torch.use_deterministic_algorithms(True, warn_only=True)'. You can file an issue at "
                "https://github.com/pytorch/pytorch/issues to help us prioritize adding deterministic support "
                "for this operation."
            )
            return
        raise RuntimeError(
            f"{caller} does not have a deterministic implementation, but you set "
            "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this operation, "
            "or you can use the 'warn_only=True' option, if that's acceptable for your application. You can also "
            "file an issue at https://github.com/pytorch/pytorch/issues to help us prioritize adding deterministic "
            "support for this operation."
        )

    return check


@contextlib.contextmanager
def deterministic_alerts_off():
    """PyTorch's meta kernels and decompositions, run on meta tensors, take the device for CUDA and
    raise CUDA's nondeterminism alerts (histc, median with indices); run once per executable, they
    cannot alert per call anyway: the ops that alert on tpu declare `deterministic_alert` instead."""
    if not torch.are_deterministic_algorithms_enabled():
        yield
        return
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)


# the C++ type names PyTorch's "value cannot be converted to type ... without overflow" prints
_CPP_NAMES = {
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
    torch.int16: "int16_t",
    torch.uint16: "uint16_t",
    torch.int32: "int",
    torch.uint32: "uint32_t",
    torch.int64: "int64_t",
    torch.uint64: "uint64_t",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.float32: "float",
    torch.float64: "double",
    torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
    torch.complex32: "c10::complex<c10::Half>",
    torch.float8_e4m3fn: "c10::Float8_e4m3fn",
    torch.float8_e5m2: "c10::Float8_e5m2",
}
_NO_INFINITY = (torch.float8_e4m3fn,)
_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16}


def overflows(value, dtype: torch.dtype) -> bool:
    """Whether PyTorch's checked conversion of the Python number `value` to `dtype` overflows
    (c10's `overflows<To, From>`): integers out of range (unsigned types let negatives down to -max
    wrap), finite floats beyond the largest finite value, NaN into an integer type, a complex value
    with an imaginary part into a real type. Nothing overflows bool."""
    if dtype == torch.bool or isinstance(value, bool):
        return False
    if isinstance(value, complex):
        if not dtype.is_complex and value.imag != 0:
            return True
        return overflows(value.real, dtype) or (dtype.is_complex and overflows(value.imag, dtype))
    dtype = _REAL_OF.get(dtype, dtype)
    if dtype.is_floating_point:
        if math.isnan(value):
            return False
        if math.isinf(value):
            return dtype in _NO_INFINITY
        info = torch.finfo(dtype)
        return value < info.min or value > info.max
    info = torch.iinfo(dtype)
    if isinstance(value, float) and math.isnan(value):
        return True
    if info.min == 0 and isinstance(value, int) and value < 0:
        return value > info.max or -value > info.max
    return value < info.min or value > info.max


def check_convertible(value, dtype):
    """Raise PyTorch's error where the number `value` does not fit `dtype`."""
    if isinstance(value, (bool, int, float, complex)) and overflows(value, dtype):
        raise RuntimeError(f"value cannot be converted to type {_CPP_NAMES.get(dtype, dtype)} without overflow")


def _arg(args, kwargs, position, name):
    return args[position] if len(args) > position else kwargs.get(name)


def fill_value_check(position):
    """The fill value (argument `position`) must fit the filled tensor's dtype."""

    def check(*args, **kwargs):
        self, value = args[0], _arg(args, kwargs, position, "value")
        if isinstance(self, torch.Tensor):
            check_convertible(value, self.dtype)

    return check


def masked_fill_value_check(self, mask, value):
    """masked_fill's 0-dim tensor value: the CPU (and CUDA) read it on the host and convert it with the
    overflow check of a Scalar. Read here too where it can fail to fit: a CPU value, or one of a dtype
    `self`'s does not hold (a complex value fits a real tensor when its imaginary part is 0; bool takes
    anything). A value of a dtype that fits is not read (no synchronisation)."""
    if not isinstance(self, torch.Tensor) or not isinstance(value, torch.Tensor):
        return
    if value.dim() != 0:
        raise RuntimeError(
            f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with {value.dim()} dimension(s)."
        )
    if value.device.type == "cpu" or torch.promote_types(value.dtype, self.dtype) != self.dtype:
        check_convertible(value.item(), self.dtype)


def index_fill_value_check(self, dim, index, value):
    """index_fill's value (a Scalar, or a 0-dim tensor the CPU reads as one): a complex one into a real
    tensor is refused by its type, before any overflow check (1 + 0j too); then it must fit."""
    if not isinstance(self, torch.Tensor):
        return
    if isinstance(value, torch.Tensor):
        if value.dim() != 0:
            raise RuntimeError(
                "index_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                f"{value.dim()} dimension(s)."
            )
        complex_value = value.is_complex()
    else:
        complex_value = isinstance(value, complex)
    if complex_value and not self.is_complex():
        raise RuntimeError("index_fill_(): Converting complex Scalar to non-complex type is not supported")
    if not isinstance(value, torch.Tensor):
        check_convertible(value, self.dtype)


def factory_value_check(position, name):
    """The value (argument `position`, or keyword `name`) must fit the dtype asked for (or out='s)."""

    def check(*args, **kwargs):
        out = kwargs.get("out")
        dtype = out.dtype if isinstance(out, torch.Tensor) else kwargs.get("dtype")
        if dtype is not None:
            check_convertible(_arg(args, kwargs, position, name), dtype)

    return check


def pow_exponent_check(*args, **kwargs):
    self, exponent = args[0], _arg(args, kwargs, 1, "exponent")
    if (
        isinstance(exponent, int)
        and exponent < 0
        and isinstance(self, torch.Tensor)
        and not self.dtype.is_floating_point
        and not self.dtype.is_complex
    ):
        raise RuntimeError("Integers to negative integer powers are not allowed.")


def _pow_check_can_raise(*args, **kwargs):
    """Whether pow_exponent_check can raise for some value of an exponent of this type (the engine
    runs it per call only then; the eager cache keys the type and the tensor's dtype)."""
    self, exponent = args[0], _arg(args, kwargs, 1, "exponent")
    return (
        type(exponent) is int
        and isinstance(self, torch.Tensor)
        and not self.dtype.is_floating_point
        and not self.dtype.is_complex
    )


pow_exponent_check.can_raise = _pow_check_can_raise


def same_dtype_out_check(self, *args, out=None, **kwargs):
    """meta_check of the out= overloads of the unary ops whose CPU kernels require `out` in the input's
    dtype (neg, sign, floor, round, bitwise_not, ...: TensorIterator's check_all_same_dtype), which
    PyTorch's meta kernels do not check."""
    if isinstance(out, torch.Tensor) and isinstance(self, torch.Tensor) and out.dtype != self.dtype:
        from .dtypes import scalar_type_name

        raise RuntimeError(f"Found dtype {scalar_type_name(out.dtype)} but expected {scalar_type_name(self.dtype)}")


def no_bool_check(name):
    """A meta_check: `name`'s CPU kernel has no bool loop (lcm); PyTorch's meta kernel says something else."""

    def check(a, b, *_, **__):
        if torch.result_type(a, b) == torch.bool:
            from .dtypes import not_implemented_for

            raise not_implemented_for(name, torch.bool)

    return check


def input_loop_check(kernels, has_loop):
    """meta_checks of kernels whose CPU kernel has loops for some input dtypes only (PyTorch's meta
    kernels accept every dtype): an input for which `has_loop(input, kernel)` is false raises the
    CPU's NotImplementedError; for each kernel and its out= overload."""

    def check_for(kernel):
        def check(a, *_, **__):
            if not has_loop(a, kernel):
                from .dtypes import not_implemented_for

                raise not_implemented_for(kernel, a.dtype)

        return check

    return {f"{k}{suffix}": check_for(k) for k in kernels for suffix in ("", ".out")}


def same_scalar_type_out_check(self, *args, out=None, values=None, indices=None, **kwargs):
    """meta_check of the out= overloads whose CPU kernels call check_scalar_type_device_layout_equal
    (logcumsumexp: `out` in the input's dtype; cummax/cummin: `values` in it, `indices` int64), which
    PyTorch's meta kernels leave out: they cast the result into `out` instead."""
    from .dtypes import scalar_type_name

    expected = ((out, self.dtype), (values, self.dtype), (indices, torch.int64))
    for written, dtype in expected:
        if isinstance(written, torch.Tensor) and written.dtype != dtype:
            raise RuntimeError(
                f"expected scalar_type {scalar_type_name(dtype)} but found {scalar_type_name(written.dtype)}"
            )


_INTERNAL_OVERLAP = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)
_INPUT_OVERLAP = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
    "single memory location. Please clone() the tensor before performing the operation."
)


def _byte_range(t):
    start = t.storage_offset() * t.element_size()
    return start, start + t.numel() * t.element_size()


def _dense(t):
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    return is_non_overlapping_and_dense_or_false(t)


def no_internal_overlap(t):
    """ATen's assert_no_internal_overlap: a written tensor whose elements share memory (an expanded
    view: a dimension of size > 1 with stride 0) is refused."""
    if not _dense(t) and any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride())):
        raise RuntimeError(_INTERNAL_OVERLAP)


def out_overlaps_inputs_check(tensors, *args, out=None, **kwargs):
    """host_check of `cat(out=)`: as ATen's assert_no_internal_overlap and assert_no_overlap, `out`
    may neither overlap itself nor share any element with an input (storage offsets are traced
    values in the eager key, so this runs per call)."""
    if not isinstance(out, torch.Tensor) or out.numel() == 0:
        return
    no_internal_overlap(out)
    storage = out.untyped_storage().data_ptr()
    for t in tensors:
        if (
            isinstance(t, torch.Tensor)
            and t.numel()
            and t.untyped_storage().data_ptr() == storage
            and _dense(out)
            and _dense(t)
        ):
            (a, b), (c, d) = _byte_range(out), _byte_range(t)
            if a < d and c < b:
                raise RuntimeError(_INPUT_OVERLAP)


# the C++ type names of random_'s bounds errors
_RANDOM_TYPE_NAMES = {
    "int8": "signed char",
    "uint8": "unsigned char",
    "int16": "short int",
    "int32": "int",
    "int64": "long int",
    "uint16": "short unsigned int",
    "uint32": "unsigned int",
    "uint64": "long unsigned int",
    "float16": "c10::Half",
    "bfloat16": "c10::BFloat16",
    "float32": "float",
    "float64": "double",
    "bool": "bool",
}


def random_type_name(dtype):
    """The C++ type name random_'s and uniform_'s bounds errors print for a JAX dtype."""
    return _RANDOM_TYPE_NAMES.get(str(dtype), str(dtype))


def random_bounds_check(dtype_name, low, high, lowest, highest, bits=None, warn=True):
    """random_(from, to)'s range against the tensor's dtype, as the CPU checks it: `from` and `to - 1`
    within [lowest, highest] of the type, else an error; for a float type with `bits` of mantissa,
    a warning (per call, as the CPU's: `warn` only from the per-call host check) beyond +-2^bits,
    where not every integer is representable."""

    name = _RANDOM_TYPE_NAMES.get(dtype_name, dtype_name)
    for value, what in ((low, "from"), (None if high is None else high - 1, "to - 1")):
        if value is None:
            continue
        if not lowest <= value <= highest:
            raise RuntimeError(f"{what} is out of bounds for {name}")
        if warn and bits is not None and not -(1 << bits) <= value <= 1 << bits:
            warn_at_caller(
                f"{what} is out of bounds [-(2^{bits}), 2^{bits}]. Due to precision limitations {name} "
                f"can support discrete uniform distribution only within this range. This warning will "
                f"become an error in version 1.7 release, please fix the code in advance"
            )


# the C++ type names the CPU's masked_fill error spells a mask's dtype with
_CPP_TYPE_NAMES = {
    torch.uint8: "unsigned char",
    torch.int8: "signed char",
    torch.int16: "short int",
    torch.uint16: "short unsigned int",
    torch.int32: "int",
    torch.int64: "long int",
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
    torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}


def cpp_type_name(dtype: torch.dtype) -> str:
    """A dtype as PyTorch's C++ errors print its TypeMeta ("float", "long int", "c10::complex<float>")."""
    return "bool" if dtype == torch.bool else _CPP_TYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def bool_mask_check(a, mask, *_, **__):
    """The CPU's error for a mask that is not bool (the meta kernel words it otherwise)."""
    if mask.dtype != torch.bool:
        name = cpp_type_name(mask.dtype)
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype {name}")


# ATen overload -> check of its (args, kwargs), as declared with the lowerings
CHECKS = declared_facts("host_check")


def wrap(name: str, kernel):
    """`kernel` with the host check of the overload `name` in front, or `kernel` itself without one."""
    check = CHECKS.get(name)
    if check is None:
        return kernel

    def checked(*args, **kwargs):
        check(*args, **kwargs)
        return kernel(*args, **kwargs)

    return checked
