"""torch <-> JAX dtype mapping and PyTorch's type promotion, computed from static information."""

from __future__ import annotations

import functools
import warnings

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch
from jax import lax
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

TO_JAX = {
    torch.float32: jnp.dtype(jnp.float32),
    torch.float64: jnp.dtype(jnp.float64),
    torch.float16: jnp.dtype(jnp.float16),
    torch.bfloat16: jnp.dtype(jnp.bfloat16),
    torch.int64: jnp.dtype(jnp.int64),
    torch.int32: jnp.dtype(jnp.int32),
    torch.int16: jnp.dtype(jnp.int16),
    torch.int8: jnp.dtype(jnp.int8),
    torch.uint8: jnp.dtype(jnp.uint8),
    torch.uint16: jnp.dtype(jnp.uint16),
    torch.uint32: jnp.dtype(jnp.uint32),
    torch.uint64: jnp.dtype(jnp.uint64),
    torch.bool: jnp.dtype(jnp.bool_),
    torch.complex64: jnp.dtype(jnp.complex64),
    torch.complex128: jnp.dtype(jnp.complex128),
    torch.float8_e4m3fn: jnp.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: jnp.dtype(ml_dtypes.float8_e5m2),
}
TO_TORCH = {v: k for k, v in TO_JAX.items()}
# complex32 (torch.chalf): JAX has no such dtype. Its values are computed as complex64, as PyTorch's
# own kernels do (complex64 is its opmath type); its storage holds each element as one uint32 whose
# low half is the real part's float16 bits and high half the imaginary part's (PyTorch's little-endian
# layout), so element size, byte views (`view(torch.float16)`, `view_as_real`) and host copies are
# PyTorch's. A layout (ops/views.py) names the element COMPLEX32: read unpacks, write packs.
TO_JAX[torch.complex32] = jnp.dtype(jnp.complex64)
# numpy has no bfloat16/float8/complex32: move those through an integer view of the same width.
NUMPY_CARRIER = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.complex32: torch.int32,
}
_UINT32 = jnp.dtype(jnp.uint32)


class _Complex32:
    """complex32 as the element of a layout or a stored output (see TO_JAX): stored as uint32."""

    __slots__ = ()

    def __repr__(self):
        return "complex32"


COMPLEX32 = _Complex32()

KIND = ELEMENTWISE_TYPE_PROMOTION_KIND


def to_jax(dtype: torch.dtype):
    """The jnp dtype `dtype`'s values are computed in (complex64 for complex32: see TO_JAX)."""
    try:
        return TO_JAX[dtype]
    except KeyError:
        raise TypeError(
            f"torchtpu: dtype {dtype} is not supported on the tpu device "
            f"(supported: {', '.join(str(d).replace('torch.', '') for d in TO_JAX)})"
        ) from None


def element(dtype: torch.dtype):
    """What a layout or a stored output of torch `dtype` names: its jnp dtype, or COMPLEX32."""
    return COMPLEX32 if dtype == torch.complex32 else to_jax(dtype)


def stored(element):
    """The jnp dtype of the arrays holding `element` (a layout's: see `element`)."""
    return _UINT32 if element is COMPLEX32 else element


def storage_jax(dtype: torch.dtype):
    """The jnp dtype of the arrays a storage of torch `dtype` holds (uint32 for complex32)."""
    return stored(element(dtype))


def pack_complex32(v):
    """complex32 values as stored (uint32: float16 real part in the low half), each part rounded to
    float16 to nearest even as PyTorch's conversion does."""
    v = jnp.asarray(v)
    # (through float32, as PyTorch converts a double to Half: rounded twice)
    if jnp.issubdtype(v.dtype, jnp.complexfloating):
        v = v.astype(jnp.complex64)
        re, im = jnp.real(v), jnp.imag(v)
    else:
        re = convert(v, jnp.float32)
        im = jnp.zeros_like(re)
    # (same-width bitcasts and shifts: XLA folds a chain of width-changing bitcasts, u8 -> u32 -> f16
    # pairs from a byte storage, into one it then rejects)
    lo, hi = (lax.bitcast_convert_type(p.astype(jnp.float16), jnp.uint16).astype(jnp.uint32) for p in (re, im))
    return lo | (hi << 16)


def unpack_complex32(u):
    """Stored complex32 elements (uint32) as complex64 values."""
    half = (lax.bitcast_convert_type(h.astype(jnp.uint16), jnp.float16) for h in (u & 0xFFFF, u >> 16))
    re, im = (h.astype(jnp.float32) for h in half)
    return lax.complex(re, im)


def round_complex32(v):
    """Complex values rounded to complex32's precision, kept as complex64."""
    return unpack_complex32(pack_complex32(v))


_E4M3FN = jnp.dtype(ml_dtypes.float8_e4m3fn)
_E4M3FN_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)


def convert(v, dtype):
    """`v` converted to the jnp `dtype` as PyTorch converts: float8_e4m3fn (no infinity) saturates to
    +-448 where XLA gives NaN (infinities too, as PyTorch's CPU kernel); NaN stays NaN."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(v.dtype, jnp.complexfloating) and dtype == jnp.bool_:
        return v != 0  # (PyTorch: nonzero, the imaginary part included: 2j is True)
    if jnp.issubdtype(v.dtype, jnp.complexfloating) and not jnp.issubdtype(dtype, jnp.complexfloating):
        v = jnp.real(v)  # (PyTorch keeps the real part; JAX's astype deprecates doing it implicitly)
    if dtype == _E4M3FN and v.dtype != _E4M3FN and v.dtype != jnp.bool_:
        v = (
            jnp.clip(v, -_E4M3FN_MAX, _E4M3FN_MAX)
            if jnp.issubdtype(v.dtype, jnp.integer)
            else jnp.where(jnp.isnan(v), v, jnp.clip(v, -_E4M3FN_MAX, _E4M3FN_MAX))
        )
    if jnp.issubdtype(v.dtype, jnp.floating) and dtype in _TRUNCATED_THROUGH:
        v = _truncate_as_x86(v, _TRUNCATED_THROUGH[dtype])
    if (v.dtype in _F64 and dtype in _F32_RANGE) or (v.dtype in _F32_RANGE and dtype in _F64):
        return _keeping_subnormals(v, dtype)
    if v.dtype == jnp.bool_ and jnp.issubdtype(dtype, jnp.inexact):
        # through uint8: XLA's simplifier turns `x * convert(bool)` into `select(bool, x, 0)`, which
        # gives 0 for inf * False and NaN * False where IEEE and PyTorch give NaN (JAX issue 12233);
        # it does not look through the second convert, which fuses at no cost (XLA:CPU and XLA:TPU)
        return v.astype(jnp.uint8).astype(dtype)
    return v.astype(dtype)


# XLA:CPU runs its programs with the x86 flush-to-zero and denormals-are-zero modes on (no flag turns
# them off), so its float64 <-> float32 conversions (bfloat16's go through float32) turn float32's
# subnormals (below 2^-126) into zeros, where the CPU's and CUDA's keep them: 1e-40 became 0. Those
# values are converted with integer operations instead; the float16 ones are exact already (float16's
# subnormals are float32 normals, and the conversion is F16C's). On XLA:CPU only (elsewhere the
# hardware's own rules stand: a TPU flushes subnormals in its arithmetic, JAX's accuracy notes).
_F64 = (jnp.dtype(jnp.float64), jnp.dtype(jnp.complex128))
_F32_RANGE = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.complex64))
_MIN_NORMAL32 = 2.0**-126
_SUBNORMAL32_STEP = 2.0**-149


def _keeping_subnormals(v, dtype):
    from ..device.platform import lowering_platform

    if lowering_platform() != "cpu":
        return v.astype(dtype)
    if jnp.issubdtype(v.dtype, jnp.complexfloating):
        real = jnp.float64 if dtype in _F64 else jnp.float32
        parts = (_keeping_subnormals(p, real) for p in (jnp.real(v), jnp.imag(v)))
        return lax.complex(*parts).astype(dtype)
    if dtype in _F64:  # (from float32 or bfloat16, whose subnormals float32 holds exactly)
        v = v.astype(jnp.float32)
        bits = lax.bitcast_convert_type(v, jnp.uint32)
        magnitude = bits & 0x7FFFFFFF
        # a subnormal is its integer significand times 2^-149: both factors are float64 normals
        tiny = magnitude.astype(jnp.float64) * _SUBNORMAL32_STEP
        tiny = jnp.where(bits >> 31 == 1, -tiny, tiny)
        return jnp.where(magnitude < 0x00800000, tiny, v.astype(jnp.float64)).astype(dtype)
    # to float32 (then bfloat16, as PyTorch rounds a double: through float): below 2^-126 the result
    # is the rounded count of 2^-149 steps, whose bits are those of the float32 (2^23 steps: 2^-126)
    steps = jnp.round(jnp.abs(v) * (1 / _SUBNORMAL32_STEP)).astype(jnp.uint32)  # (half to even, as IEEE)
    bits = steps | (jnp.signbit(v).astype(jnp.uint32) << 31)
    tiny = lax.bitcast_convert_type(bits, jnp.float32)
    return jnp.where(jnp.abs(v) < _MIN_NORMAL32, tiny, v.astype(jnp.float32)).astype(dtype)


# A float out of an integer type's range has no defined conversion in C++; PyTorch's CPU kernels (and
# NumPy) get x86's: cvttss2si/cvttsd2si to int32 or int64 gives the most negative value for anything
# out of range (NaN too), and the 8- and 16-bit types keep the low bits of the int32. XLA saturates
# instead (float32 max -> 127 for int8, where the CPU gives 0). Unsigned 32/64-bit targets: XLA's.
_TRUNCATED_THROUGH = {
    jnp.dtype(d): w
    for d, w in (
        (jnp.int8, jnp.int32),
        (jnp.int16, jnp.int32),
        (jnp.uint8, jnp.int32),
        (jnp.uint16, jnp.int32),
        (jnp.int32, jnp.int32),
        (jnp.int64, jnp.int64),
    )
}


def _truncate_as_x86(v, wide):
    if v.dtype.itemsize < 4:
        v = v.astype(jnp.float32)  # (exact; +-2^31 is not representable in a 16-bit float)
    limit = float(2 ** (jnp.iinfo(wide).bits - 1))
    inside = (v >= -limit) & (v < limit)
    return jnp.where(inside, v, -limit).astype(wide)


def multiply(a, b):
    """a * b. A complex product on XLA:CPU rounds each of its four real products before their sum, as
    PyTorch's vectorized CPU kernel: LLVM would contract `ac - bd` into an FMA (1 complex64 product
    in 2 differed in its last bit), and would do it differently in a scatter's combiner than in an
    elementwise loop. copysign(p, p) is p, but LLVM does not see through it (no measurable cost on a
    2^20-element product: benchmarks/cpu_parity_cost.py)."""
    dtype = jnp.result_type(a, b)
    if not jnp.issubdtype(dtype, jnp.complexfloating):
        return a * b
    from ..device.platform import lowering_platform

    if lowering_platform() != "cpu":
        return a * b
    return rounded_complex_product(jnp.asarray(a, dtype), jnp.asarray(b, dtype))


def is_python_scalar(v) -> bool:
    """Whether a lowering's operand is a Python number: as one, or traced (a weakly typed 0-d array)."""
    return isinstance(v, (bool, int, float, complex)) or (getattr(v, "weak_type", False) and v.ndim == 0)


def divide(a, b):
    """a / b as PyTorch's device kernels divide floats: by a Python scalar, CUDA multiplies by its
    reciprocal, computed in the operands' (opmath) dtype (BinaryDivTrueKernel.cu, the trunc and floor
    kernels alike; the CPU divides); by a tensor, both divide (true_divide)."""
    if is_python_scalar(b):
        return multiply(a, 1 / jnp.asarray(b, jnp.result_type(a, b)))
    return true_divide(a, b)


def true_divide(a, b):
    """a / b, each element an IEEE division, as the CPU's and CUDA's kernels compute it. XLA's algebraic
    simplifier turns a division by a broadcast into a multiplication by the broadcast reciprocal (a
    float32 quotient an ulp off in 15-33% of elements), and its other rewrites can make a broadcast of
    a divisor that was none in the program (an expanded view; `exp` of one): so the divisor, at the
    quotient's shape, passes an optimization barrier. XLA removes the barrier after simplifying and
    fuses the broadcast into the division: no array is made, only divisions replace multiplications
    (no measurable cost at 1024x1024 / (1024, 1): benchmarks/RESULTS.md). On XLA:CPU only: elsewhere
    XLA's division is not correctly rounded itself (XLA:GPU's float32 one is PTX div.full,
    openxla/xla#37181), so a division per element would cost time without the CPU's answer."""
    from ..device.platform import lowering_platform

    if lowering_platform() != "cpu" or not jnp.issubdtype(jnp.result_type(a, b), jnp.inexact):
        return a / b
    dtype = jnp.result_type(a, b)
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b))
    a = jnp.broadcast_to(jnp.asarray(a, dtype), shape)
    return a / lax.optimization_barrier(jnp.broadcast_to(jnp.asarray(b, dtype), shape))


def rounded_complex_product(a, b):
    """The complex product of `multiply` with each real product rounded, on any platform."""
    ar, ai, br, bi = jnp.real(a), jnp.imag(a), jnp.real(b), jnp.imag(b)

    def rounded(p):
        return jnp.copysign(p, p)

    return lax.complex(rounded(ar * br) - rounded(ai * bi), rounded(ar * bi) + rounded(ai * br))


def to_torch(dtype) -> torch.dtype:
    return TO_TORCH[jnp.dtype(dtype)]


# PyTorch's C++ ScalarType names, which its kernels' dtype errors print ("... not implemented for 'Half'")
_SCALAR_TYPE_NAMES = {
    torch.float16: "Half",
    torch.float32: "Float",
    torch.float64: "Double",
    torch.bfloat16: "BFloat16",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
    torch.complex32: "ComplexHalf",
    torch.bool: "Bool",
    torch.uint8: "Byte",
    torch.int8: "Char",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.uint16: "UInt16",
    torch.uint32: "UInt32",
    torch.uint64: "UInt64",
}

# the unsigned types wider than uint8: PyTorch's CPU kernels have loops for them in a few ops only
# (copies, fills, views, indexing, mul, eq/ne, bitwise and/or/xor, rounding), so an elementwise
# (promoting) lowering refuses them unless it names them in `loops_for=` (ops/table.py). complex32 is
# not one of them here: it follows CUDA's kernels (docs/design.md, "complex32")
WIDE_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)
# the integer types a CPU kernel that dispatches on floating types only has no loop for (gelu, the
# losses, lerp, histc); with bool, NOT_FLOATING. PyTorch's tensors of these dtypes raise there:
# "\"gelu_cpu\" not implemented for 'Long'"
INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, *WIDE_UNSIGNED)
NOT_FLOATING = (torch.bool, *INTEGERS)


def scalar_type_name(dtype) -> str:
    """PyTorch's ScalarType name of a torch or JAX dtype, as its error messages spell it."""
    if not isinstance(dtype, torch.dtype):
        dtype = TO_TORCH.get(jnp.dtype(dtype), dtype)
    return _SCALAR_TYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def not_implemented_for(kernel: str, dtype) -> NotImplementedError:
    """The error the CPU raises for a kernel with no loop for `dtype`, in tpu's words."""
    return NotImplementedError(f"\"{kernel}_tpu\" not implemented for '{scalar_type_name(dtype)}'")


_META_BY_KIND = {}


def _meta(dtype, ndim):
    key = (dtype, ndim == 0)
    t = _META_BY_KIND.get(key)
    if t is None:
        t = _META_BY_KIND[key] = torch.empty(() if ndim == 0 else (1,), dtype=dtype, device="meta")
    return t


# Reads of torch.get_default_dtype() that decided a traced computation: the eager engine shares an
# executable across default dtypes unless its trace read the setting here (or PyTorch's meta
# answer differs under another one: eager/engine.py OpKernel._other_default_dtype)
DEFAULT_DTYPE_READS = [0]


def default_dtype():
    """torch.get_default_dtype(), for a lowering whose computation follows it (counted: see
    DEFAULT_DTYPE_READS)."""
    DEFAULT_DTYPE_READS[0] += 1
    return torch.get_default_dtype()


_SCALAR_SAMPLE = {bool: True, int: 1, float: 1.0, complex: 1j}  # (a Python scalar of each type)


def promote(kind, operands):
    """(computation dtype, result dtype) as jnp dtypes for PyTorch's elementwise promotion.

    `operands` is a tuple of ('t', torch dtype, is_0dim) for tensors and ('s', python type) for
    scalars: static facts, so the answer is cached and costs nothing at run time. The default dtype
    is part of the question (`int / int`, `tensor + 1.5` follow it), and a read of it when the
    answer follows it (DEFAULT_DTYPE_READS).
    """
    compute, result, follows = _promote(kind, operands, torch.get_default_dtype())
    if follows:
        DEFAULT_DTYPE_READS[0] += 1
    return compute, result


@functools.lru_cache(maxsize=4096)
def _promote(kind, operands, default_dtype):
    args = []
    for op in operands:
        if op[0] == "t":
            args.append(_meta(op[1], 0 if op[2] else 1))
        else:
            args.append(_SCALAR_SAMPLE[op[1]])
    compute, result = elementwise_dtypes(*args, type_promotion_kind=kind)
    # a float or complex answer follows the default dtype unless a float or complex tensor (of any
    # dimension) gave it: PyTorch promotes by category, and within one the tensors' dtypes win
    inexact = compute.is_floating_point or compute.is_complex or result.is_floating_point or result.is_complex
    follows = inexact and not any(op[0] == "t" and (op[1].is_floating_point or op[1].is_complex) for op in operands)
    return to_jax(compute), to_jax(result), follows


def rounded_operand_dtype(kind, operands):
    """The half dtype (float16, bfloat16) that PyTorch rounds tensor operands of other dtypes to before it
    computes in float32 (`promote`'s computation dtype), or None. The CPU and CUDA load a tensor operand
    in the common dtype and widen it to the opmath type: int32 2049 - float16 2048 is 0 there, not 1.
    Only tensors of one or more dimensions are rounded (`apply`): Python scalars and 0-dim tensors are
    read unrounded in the opmath type by the CPU's mul and div and CUDA's kernels for CPU scalars
    (the CPU's add, sub and atan2 round them: one last bit of difference there)."""
    if not any(op[0] == "t" and op[1] in (torch.float16, torch.bfloat16) for op in operands):
        return None
    return _rounded_operand_dtype(kind, operands, torch.get_default_dtype())


@functools.lru_cache(maxsize=4096)
def _rounded_operand_dtype(kind, operands, default_dtype):
    compute = _promote(kind, operands, default_dtype)[0]
    args = [_meta(op[1], 0 if op[2] else 1) if op[0] == "t" else _SCALAR_SAMPLE[op[1]] for op in operands]
    common = elementwise_dtypes(*args, type_promotion_kind=KIND.DEFAULT)[1]
    if common in (torch.float16, torch.bfloat16) and compute == jnp.float32:
        return to_jax(common)
    return None


def round_to(a, dtype):
    """`a` (float32 or wider) rounded to the half `dtype` and widened back to float32, as PyTorch's
    conversions do (through float32). Not `reduce_precision` (it flushes float16 subnormals to zero),
    and a barrier between the two converts: under XLA's excess precision (its default) the pair is
    folded away."""
    return lax.optimization_barrier(a.astype(jnp.float32).astype(dtype)).astype(jnp.float32)


def operand_facts(values):
    """Static facts of traced operands for `promote`: jax arrays/tracers and python scalars."""
    facts = []
    for v in values:
        if isinstance(v, (bool, int, float, complex)):
            facts.append(("s", type(v)))
        elif v is None:
            continue
        elif getattr(v, "weak_type", False) and v.ndim == 0:
            # a Python scalar that travelled as a traced argument
            facts.append(("s", _PY_TYPE[jnp.dtype(v.dtype).kind]))
        else:
            facts.append(("t", to_torch(v.dtype), v.ndim == 0))
    return tuple(facts)


_PY_TYPE = {"b": bool, "i": int, "u": int, "f": float, "c": complex}


def opmath(dtype):
    """The dtype PyTorch computes `dtype`'s arithmetic in (its "opmath" type, on CPU and CUDA alike):
    float32 for float16 and bfloat16, `dtype` itself otherwise."""
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


def to_opmath(a):
    """Array `a` in its opmath dtype (see opmath): float16 and bfloat16 become float32."""
    return a.astype(jnp.float32) if a.dtype in (jnp.float16, jnp.bfloat16) else a


def is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def numpy_from_cpu(t: torch.Tensor) -> np.ndarray:
    """A numpy array with `t`'s values (bfloat16 and float8 through an integer view), through DLPack:
    `Tensor.numpy()` marks the CPU storage non-resizable for good, and a user's tensor copied to tpu
    could then no longer be resized (nor written by an out= that resizes), unlike one copied to CUDA."""
    t = t.detach()  # kernels see the user's Python object, autograd metadata and all
    carrier = NUMPY_CARRIER.get(t.dtype)
    if carrier is None:
        return np.from_dlpack(t)
    return np.from_dlpack(t.view(carrier)).view(storage_jax(t.dtype))


def cpu_from_numpy(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor over `a`. Arrays from JAX are read-only; callers only read the tensor (it is
    the source of a copy), so PyTorch's warning about non-writable arrays does not apply."""
    carrier = NUMPY_CARRIER.get(dtype)
    if carrier is not None:
        a = a.view(TO_JAX[carrier])
    if a.flags.writeable or (_read_only_seen[0] and not torch.is_warn_always_enabled()):
        t = torch.from_numpy(a)
    else:
        with warnings.catch_warnings():  # (~15 µs: only until PyTorch's warning has fired once)
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            t = torch.from_numpy(a)
        _read_only_seen[0] = True  # PyTorch gives that warning once per process (TORCH_WARN_ONCE, or always
        # under torch.set_warn_always(True): suppressed on every call then)
    return t if carrier is None else t.view(dtype)


_read_only_seen = [False]
