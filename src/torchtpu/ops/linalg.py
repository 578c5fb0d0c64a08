"""Lowerings: matrix products (mm, bmm, matmul, addmm, grouped and ragged dots), distances, and the
float32 matmul precision every product follows. Decompositions and solves: linalg_decompositions.py."""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from . import host_gemv
from .dtypes import WIDE_UNSIGNED, scalar_type_name
from .table import KIND, lowering

# reads of the setting: tracing an executable notes whether its computation read it (then the
# setting is part of that executable's cache key: eager/executable.py)
PRECISION_READS = [0]


# PyTorch's per-backend settings (torch.backends.fp32_precision and the like) in the legacy getter's terms
_FP32_PRECISION_AS_MATMUL = {"tf32": "high", "bf16": "medium"}


def matmul_precision():
    """torch.get_float32_matmul_precision(), the setting "tpu" matmuls follow and their executables are
    keyed on. PyTorch's getter raises when its per-backend settings disagree (say only
    `torch.backends.cuda.matmul.fp32_precision = "tf32"` was set): then the generic
    `torch.backends.fp32_precision` decides ("tf32" -> "high", "bf16" -> "medium", else "highest")."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        return _FP32_PRECISION_AS_MATMUL.get(getattr(torch.backends, "fp32_precision", None), "highest")


def precision():
    """PyTorch's float32 matmul setting as XLA precision (XLA's TPU default would be bf16 passes)."""
    PRECISION_READS[0] += 1
    setting = matmul_precision()
    return {"highest": lax.Precision.HIGHEST, "high": lax.Precision.HIGH}.get(setting, lax.Precision.DEFAULT)


def _acc(a):
    return jnp.float32 if a.dtype in (jnp.float16, jnp.bfloat16) else None


def operand_precision(*operands):
    """XLA precision of a product of `operands`: PyTorch's float32 setting (`precision()`) when one is
    wider than 16 bits; DEFAULT when all are bfloat16/float16, whose products are exact in the float32
    accumulator that `preferred_element_type` asks for (and XLA:TPU's ragged dot rejects HIGHEST for
    bfloat16 operands: Mosaic's "Bad lhs type")."""
    if all(x.dtype in (jnp.float16, jnp.bfloat16) for x in operands):
        return lax.Precision.DEFAULT
    return precision()


_HALF = (jnp.bfloat16, jnp.float16)
_WIDE_INTEGERS = (jnp.int64, jnp.uint64)


def matmul(a, b):
    if a.dtype in _WIDE_INTEGERS and _lowering_platform() == "tpu":
        return _wide_integer_matmul(a, b)
    if a.dtype in _HALF and b.dtype == a.dtype and _for_host():
        return _host_half_matmul(a, b)
    if _host_bf16_passes(a, b):
        return _matmul(a, b, operand_dtype=jnp.bfloat16)
    return _matmul(a, b)


# the smallest float32 product (m * n * k) run in bf16 on the host under "medium": a smaller one is not
# compute-bound, and the operand casts would cost what the bf16 dot saves
_BF16_PASS_MIN_WORK = 1 << 21


def _host_bf16_passes(a, b):
    """Whether a float32 product on XLA:CPU runs with bfloat16 operands and a float32 accumulator: where the
    user asked for it (`torch.set_float32_matmul_precision("medium")`, PyTorch's "bf16 for internal
    computations where a fast kernel has it") and the product is a matrix-matrix one. XLA:CPU ignores
    DEFAULT/HIGH precision for float32 dots (Eigen float32 either way); its YNNPACK bf16 dot does a
    512x512x1536 product in 0.6x the CPU time of Eigen's float32 one (benchmarks/RESULTS.md). A one-row
    or one-column product stays float32: Eigen's float32 GEMV streams the weight faster than YNNPACK's
    bf16 dot. On TPU DEFAULT already means one bf16 pass (precision())."""
    if a.dtype != jnp.float32 or b.dtype != jnp.float32 or a.ndim < 2 or b.ndim < 2 or not _for_host():
        return False
    if precision() != lax.Precision.DEFAULT:  # (reads the setting, so executables are keyed on it)
        return False
    rows, k, n = math.prod(a.shape[:-1]), a.shape[-1], b.shape[-1]
    if a.ndim == 2 and _peeled(a)[1]:
        # XLA:CPU (jax 0.10) has no bf16 dot whose lhs contracts its first dim (the weight gradient
        # dY.T @ X): it converts the rounded operands back to float32, slower than float32 itself
        return False
    return min(a.shape[-2], n) > 1 and rows * n * k >= _BF16_PASS_MIN_WORK


def _lowering_platform():
    from ..device.platform import lowering_platform

    return lowering_platform()


def _for_host():
    return _lowering_platform() == "cpu"


def _pad_rows(x, axis):
    """x with one row of zeros appended along `axis` (a second row/column for the product)."""
    zeros = jnp.zeros((*x.shape[:axis], 1, *x.shape[axis + 1 :]), x.dtype)
    return jnp.concatenate([x, zeros], axis=axis)


def _host_half_matmul(a, b):
    """A bfloat16/float16 product on XLA:CPU. XLA:CPU (jax 0.10) sends a dot with two or more rows and
    columns to its YNNPACK library fusion, which reads the half operands as they are and accumulates in
    float32; a matrix-vector product (one row of `a` or one column of `b`: every nn.Linear of a batch-1
    decode step) goes instead to Eigen's float32 GEMV after converting the whole weight to float32 at
    every call: 1x1024 by 151936x1024 (an LM head) 1.1-1.3 s against 0.11-0.15 s with a second row,
    and torch CPU's bf16 0.13 s (benchmarks/RESULTS.md, bf16 on the host). So such a product gains a
    row/column of zeros (the other rows' sums are unchanged) and keeps its own; the TPU trace, where
    bf16 dots are native, never comes here."""
    if b.ndim == 1:
        return _host_half_matmul(a, b[:, None])[..., 0]
    if a.ndim == 1:
        return _host_half_matmul(a[None], b)[..., 0, :]
    weight = _transposed_from(b) if b.ndim == 2 else None
    if weight is not None and host_gemv.eligible(a, weight):  # x @ W.T of a bf16 decode step: the C++ kernel
        return host_gemv.product(a, weight).astype(a.dtype)
    rows, cols = a.shape[-2], b.shape[-1]
    if rows == 1:
        a = _pad_rows(a, a.ndim - 2)
    if cols == 1:
        b = _pad_rows(b, b.ndim - 1)
    out = _matmul(a, b)
    return out[..., :rows, :cols] if (rows == 1 or cols == 1) else out


def _matmul(a, b, operand_dtype=None):
    """a @ b in a's dtype, accumulated in float32 for half operands; `operand_dtype`: the operands rounded
    to it first (bf16 passes of a float32 product)."""
    out_dtype = a.dtype
    if operand_dtype is not None and a.ndim == 2 and b.ndim == 2:
        return _rounded_product(a, b, operand_dtype).astype(out_dtype)
    a = host_row_major_lhs(a, b)
    source = _transposed_from(b) if a.dtype == b.dtype else None
    if operand_dtype is not None:
        a, b = a.astype(operand_dtype), b.astype(operand_dtype)
        source = None if source is None else source.astype(operand_dtype)
    if source is not None and b.ndim == 2:
        # x @ W.T (nn.Linear): contract W's own last dim rather than a transposed W. XLA:CPU folds a
        # transposed operand into the dot only where it calls Eigen (a matrix-matrix product); a
        # matrix-vector product (batch-1 decoding) kept the transpose and either looped over W column
        # by column or, with an add after it inside a fused segment, copied W transposed at every
        # call (0.3-1 ms per 1-2 MB weight: docs/design.md, "x @ W.T").
        out = lax.dot_general(
            a, source, (((a.ndim - 1,), (1,)), ((), ())), precision=precision(), preferred_element_type=_acc(a)
        )
    elif source is not None and a.shape[:-2] == b.shape[:-2]:
        # q @ k.transpose(-2, -1) (eager attention): the same, batched; XLA:CPU copied k transposed
        batch = tuple(range(a.ndim - 2))
        out = lax.dot_general(
            a,
            source,
            (((a.ndim - 1,), (a.ndim - 1,)), (batch, batch)),
            precision=precision(),
            preferred_element_type=_acc(a),
        )
    else:
        out = jnp.matmul(a, b, precision=precision(), preferred_element_type=_acc(a))
    return out.astype(out_dtype)


# the dtypes of XLA:CPU's YNNPACK dot (jax 0.10) that `host_row_major_lhs` lays the lhs out for
_YNN_DOT_DTYPES = (jnp.float32, jnp.bfloat16)


def host_row_major_lhs(a, b):
    """`a` laid out row-major before a product on XLA:CPU when it is traced as a transpose of its last two
    dims (the weight gradient `t(dY) @ X` of every nn.Linear; ops/attention.py's backward `P.T @ dO`, `dS.T @ Q`).
    XLA folds the transpose into the dot as a contraction over the lhs's first dim, which its YNNPACK
    dot (jax 0.10: `IsDotSupportedByYnn` wants the lhs contracting its last dim) does not take, so the
    product fell to Eigen's slower one; an optimization barrier keeps the transpose as a copy (m x k,
    against the product's m x k x n) and the dot goes to YNNPACK. One core, CPU ms, Eigen -> copy +
    YNNPACK: 1408x512x512 (an MLP weight's gradient) 12.6 -> 9.1, 512x512x512 5.3 -> 3.4, 8000x512x512
    (an LM head's) 70 -> 66, 512x512x16 0.73 -> 0.33, attention's 4x4 batch of 128x256x64 1.53 -> 1.17,
    512x1408x512 and 2048x512x2048 equal (docs/compile.md, benchmarks/RESULTS.md). XLA:TPU is not
    concerned: its dots take either layout."""
    if a.ndim < 2 or b.ndim < 2 or a.dtype not in _YNN_DOT_DTYPES or b.dtype != a.dtype:
        return a
    if min(a.shape[-2], b.shape[-1]) < 2 or not _for_host() or _transposed_from(a) is None:
        return a  # (a matrix-vector product is not YNNPACK's either)
    return lax.optimization_barrier(a)


def _rounded_product(a, b, operand_dtype):
    """a @ b (2-D, float32) with operands rounded to `operand_dtype`, float32 accumulation, contracting the
    arrays the transposes were taken of. XLA:CPU's bf16 dot (YNNPACK) takes `convert(W)` but not
    `convert(transpose(W))`, which it turns back into a float32 dot plus two conversions (the backward's
    dY @ W, where W arrives as t(t(W)): 1.2x the float32 time instead of 0.6x)."""
    a, a_swapped = _peeled(a)
    b, b_swapped = _peeled(b)
    dims = (((0 if a_swapped else 1,), (1 if b_swapped else 0,)), ((), ()))
    a, b = a.astype(operand_dtype), b.astype(operand_dtype)
    return lax.dot_general(a, b, dims, precision=precision(), preferred_element_type=jnp.float32)


def _peeled(x):
    """(x2, swapped): a 2-D `x` as the array its chain of transposes starts from, and whether that
    array holds x transposed."""
    swapped = False
    while (source := _transposed_from(x)) is not None and source.ndim == 2:
        x, swapped = source, not swapped
    return x, swapped


def _transposed_from(b):
    """x when `b` is being traced as x with its last two dims swapped (an eager op's view `W.t()` or
    `k.transpose(-2, -1)`, a graph's `t` node, or a graph's reshape of such a transpose that only
    merges leading dims, as matmul's decomposition into bmm does), else None. Reads the equation
    that made `b`, which JAX 0.10's tracers keep (`DynamicJaxprTracer.parent`, checked with jax
    0.10.2); a JAX without it, or a concrete array, gives None and jnp.matmul's form."""
    if b.ndim < 2:
        return None
    eqn, value = _made_by(b)
    if eqn is lax.reshape_p:  # a reshape of the leading dims of a transpose
        inner = value
        if (
            b.parent.params.get("dimensions") is not None
            or inner.ndim < 2
            or tuple(inner.shape[-2:]) != tuple(b.shape[-2:])
        ):
            return None
        eqn, value = _made_by(inner)
        if eqn is not lax.transpose_p or _perm(inner) != _swap_last(inner.ndim):
            return None
        return value.reshape((*b.shape[:-2], b.shape[-1], b.shape[-2]))
    if eqn is not lax.transpose_p or _perm(b) != _swap_last(b.ndim):
        return None
    return value  # (a transpose keeps the dtype; its permutation fixes the shape)


def _made_by(x):
    """(primitive, first input) of the equation that made the tracer `x`, or (None, None)."""
    eqn = getattr(x, "parent", None)
    inputs = getattr(eqn, "in_tracers", None)
    if not inputs or not hasattr(inputs[0], "shape"):
        return None, None
    return getattr(eqn, "primitive", None), inputs[0]


def _perm(x):
    return tuple(x.parent.params.get("permutation", ()))


def _swap_last(n):
    return (*range(n - 2), n - 1, n - 2)


def _name(t):
    return scalar_type_name(t.dtype)


def _mm_shapes(a, b):
    """The CPU's words for matrices that cannot be multiplied (PyTorch's meta kernels: "a and b must
    have same reduction dim, but got [2, 3] X [4, 5]")."""
    if a.dim() == 2 and b.dim() == 2 and a.shape[1] != b.shape[0]:
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and {b.shape[0]}x{b.shape[1]})"
        )


def _mm_dtypes(a, b, *_, **__):
    """The CPU and CUDA kernels' shape and dtype checks, which PyTorch's meta kernels word otherwise or
    leave out (mixed dtypes would otherwise be promoted here)."""
    _mm_shapes(a, b)
    if a.dtype != b.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {_name(a)} != {_name(b)}")


def _mv_dtypes(mat, vec, *_, **__):
    if mat.dtype != vec.dtype:
        raise RuntimeError(
            f"addmv input tensors must have the same dtype, but got {_name(vec)}, {_name(mat)}, and {_name(vec)}"
        )


def _addmm_dtypes(c, a, b, *_, **__):
    if c.dtype != b.dtype:
        raise RuntimeError(f"self and mat2 must have the same dtype, but got {_name(c)} and {_name(b)}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got {_name(a)} and {_name(b)}")
    _mm_shapes(a, b)


# 8-bit limbs: a product of two is below 2**16, so an int32 accumulator holds the sum of this many
_LIMB_BITS, _LIMB_K = 8, (2**31 - 1) // (255 * 255)


def _wide_integer_matmul(a, b):
    """An int64/uint64 matrix product for XLA:TPU, which has no 64-bit integer dot (compiling one
    fails). Each operand is split into eight 8-bit limbs of its two's-complement bits; the int32 dots of
    the limb pairs whose shift stays below 64 bits (36 of them) are exact, and their sum shifted into
    place, wrapping in uint64, is the product modulo 2**64: PyTorch's wrapping int64 result. The
    contraction runs in chunks of `_LIMB_K` so an int32 sum cannot overflow."""
    d = a.dtype
    n_limbs = 64 // _LIMB_BITS
    k = a.shape[-1]
    ua, ub = lax.bitcast_convert_type(a, jnp.uint64), lax.bitcast_convert_type(b, jnp.uint64)

    def limbs(x):
        return [((x >> (_LIMB_BITS * i)) & 0xFF).astype(jnp.int32) for i in range(n_limbs)]

    total = None
    for start in range(0, max(k, 1), _LIMB_K):
        stop = min(k, start + _LIMB_K)
        pa = limbs(ua[..., start:stop])
        pb = limbs(ub[start:stop] if ub.ndim == 1 else ub[..., start:stop, :])
        for i in range(n_limbs):
            for j in range(n_limbs - i):
                part = jnp.matmul(pa[i], pb[j], preferred_element_type=jnp.int32)
                part = part.astype(jnp.uint64) << (_LIMB_BITS * (i + j))
                total = part if total is None else total + part
    return lax.bitcast_convert_type(total, d)


@lowering(
    "mm",
    "bmm",
    "matmul",
    "dot",
    "mv",
    no_loop_for=(torch.bool, *WIDE_UNSIGNED),
    meta_check={
        "mm": _mm_dtypes,
        "mm.out": _mm_dtypes,
        "matmul": _mm_dtypes,
        "matmul.out": _mm_dtypes,
        "mv": _mv_dtypes,
        "mv.out": _mv_dtypes,
    },
    matmul_buckets={
        **dict.fromkeys(("mm", "mm.out"), "mk,kn->mn"),
        **dict.fromkeys(("bmm", "bmm.out"), "bmk,bkn->bmn"),
        **dict.fromkeys(("mv", "mv.out"), "mk,k->m"),
        **dict.fromkeys(("dot", "dot.out"), "k,k->"),
    },
)
def mm(a, b):
    return matmul(a, b)


@lowering("vdot", no_loop_for=(torch.bool, *WIDE_UNSIGNED))
def vdot(a, b):
    return matmul(jnp.conj(a), b)  # conjugates its first argument (a no-op for real dtypes)


def _scaled_sum(c, prod, beta, alpha):
    """beta * c + alpha * prod, as PyTorch: integer results take integer alpha/beta (truncated), and
    beta == 0 ignores c entirely (NaN included). alpha/beta may be traced Scalars."""
    d = prod.dtype
    if not jnp.issubdtype(d, jnp.inexact):
        alpha = alpha if isinstance(alpha, int) else jnp.asarray(alpha).astype(d)
        beta = beta if isinstance(beta, int) else jnp.asarray(beta).astype(d)
    out = prod if (isinstance(alpha, int) and alpha == 1) else prod * alpha
    if isinstance(beta, (int, float)):
        if beta == 0:
            return out.astype(d)
        c = c if (isinstance(beta, int) and beta == 1) else c * beta
    else:
        c = jnp.where(beta == 0, jnp.zeros_like(c), c * beta)
    return (c + out).astype(d)


@lowering(
    "addmm",
    "baddbmm",
    "addmv",
    promote=KIND.DEFAULT,
    promote_args=(0, 1, 2),
    blas=True,
    no_loop_for=(torch.bool,),
    meta_check={"addmm": _addmm_dtypes, "addmm_": _addmm_dtypes, "addmm.out": _addmm_dtypes},
    matmul_buckets={
        **dict.fromkeys(("addmm", "addmm_", "addmm.out"), "mn,mk,kn->mn"),
        **dict.fromkeys(("baddbmm", "baddbmm_", "baddbmm.out"), "bmn,bmk,bkn->bmn"),
        **dict.fromkeys(("addmv", "addmv_", "addmv.out"), "m,mk,k->m"),
    },
)
def addmm(c, a, b, beta=1, alpha=1):
    return _scaled_sum(c, matmul(a, b), beta, alpha)


def _addbmm_half(c, a, b, beta, alpha):
    """addbmm for float16/bfloat16: PyTorch's kernel (addbmm_impl_, the same for CPU and CUDA) adds one
    addmm per batch into the result, each accumulated in float32 and rounded to the half type, so
    the result carries a rounding per batch; summing every product in float32 first (as before)
    differed from both by several ulps of the largest values."""
    d = c.dtype
    prods = matmul(a.astype(jnp.float32), b.astype(jnp.float32))  # float32 products, as opmath
    acc = jnp.broadcast_to(c, prods.shape[1:]).astype(jnp.float32)
    first = _scaled_sum(acc, prods[0] if prods.shape[0] else jnp.zeros_like(acc), beta, alpha).astype(d)
    out, _ = lax.scan(lambda r, p: (_scaled_sum(r.astype(jnp.float32), p, 1, alpha).astype(d), None), first, prods[1:])
    return out


@lowering(
    "addbmm",
    blas=True,
    no_loop_for=(torch.bool, *WIDE_UNSIGNED),
    meta_check={"addbmm": _addmm_dtypes, "addbmm_": _addmm_dtypes, "addbmm.out": _addmm_dtypes},
    matmul_buckets=dict.fromkeys(("addbmm", "addbmm_", "addbmm.out"), "mn,bmk,bkn->mn"),
)
def addbmm(c, a, b, beta=1, alpha=1):
    if c.dtype in (jnp.bfloat16, jnp.float16):
        return _addbmm_half(c, a, b, beta, alpha)
    return _scaled_sum(c, matmul(a, b).sum(0), beta, alpha)


@lowering("addr", promote=KIND.DEFAULT, promote_args=(0, 1, 2), blas=True)
def addr(c, a, b, beta=1, alpha=1):
    return _scaled_sum(c, jnp.outer(a, b), beta, alpha)


def ragged_dot(a, b, sizes, **kw):
    """`lax.ragged_dot(a, b, sizes)`: rows of `a` (m, k) in consecutive groups of `sizes` (g,), each
    multiplied by its own `b[i]` (k, n); rows past the groups are zero. TPUs have a ragged-dot unit;
    XLA:CPU and XLA:GPU expand it to every group over every row (g times the work: 100x slower on a
    Mixture-of-Experts decode step), so there the rows go through in tiles of one group each."""
    from ..device.platform import lowering_platform

    if lowering_platform() == "tpu" or b.shape[0] == 1:
        return lax.ragged_dot(a, b, sizes, **kw)
    return _ragged_dot_tiled(a, b, sizes, **kw)


def _ragged_dot_tiled(a, b, sizes, preferred_element_type=None, precision=None):
    """Static shapes whatever the routing: with tiles of `t` rows, group i needs ceil(sizes[i] / t)
    tiles, so ceil(m / t) + g tiles always suffice; a scan multiplies each tile by its group's matrix
    (rows beyond the group masked) and adds it into its rows. Work: m + g * t rows instead of m * g."""
    m, g = a.shape[0], b.shape[0]
    t = min(128, max(8, 1 << max(0, (m // g - 1)).bit_length()))
    sizes = sizes.astype(jnp.int32)
    tiles = (sizes + t - 1) // t
    tiles_end = jnp.cumsum(tiles)
    first_row = jnp.cumsum(sizes) - sizes
    tile = jnp.arange(-(-m // t) + g, dtype=jnp.int32)
    group = jnp.minimum(jnp.searchsorted(tiles_end, tile, side="right"), g - 1).astype(jnp.int32)
    within = tile - (tiles_end[group] - tiles[group])
    row = first_row[group] + within * t
    rows_used = jnp.where(tile < tiles_end[-1], jnp.clip(sizes[group] - within * t, 0, t), 0)
    acc = preferred_element_type or a.dtype
    padded = jnp.concatenate([a, jnp.zeros((t, a.shape[1]), a.dtype)])

    def add_tile(out, step):
        i, r, used = step
        y = jnp.dot(lax.dynamic_slice_in_dim(padded, r, t), b[i], precision=precision, preferred_element_type=acc)
        y = jnp.where((jnp.arange(t) < used)[:, None], y, jnp.zeros((), y.dtype))
        return lax.dynamic_update_slice_in_dim(out, lax.dynamic_slice_in_dim(out, r, t) + y, r, 0), None

    out, _ = lax.scan(add_tile, jnp.zeros((m + t, b.shape[2]), acc), (group, row, rows_used))
    return out[:m]


def _grouped_mm_meta(a, b, offs=None, bias=None, out_dtype=None):
    """Output of `_grouped_mm`. PyTorch's meta states the CUDA kernel's limits (bf16 only, 16-byte
    aligned strides); the lowering takes every floating dtype and layout, which Transformers relies on
    for "tpu" (eager and compiled)."""
    torch._check(
        a.dim() in (2, 3) and b.dim() in (2, 3),
        lambda: f"Multiplicands must be 2D or 3D but got mat_a.dim()={a.dim()} and mat_b.dim()={b.dim()}",
    )
    torch._check(
        (a.dim() == 2 and b.dim() == 2) or a.size(-1) == b.size(-2),
        lambda: "contraction dimension of mat_a and mat_b must match",
    )
    torch._check(
        (offs is not None) == (a.dim() == 2 or b.dim() == 2),
        lambda: "offs must be given exactly when mat_a or mat_b is 2D",
    )
    torch._check(
        offs is None or (offs.dim() == 1 and offs.dtype == torch.int32), lambda: "offs must be a 1D int32 tensor"
    )
    torch._check(bias is None, lambda: "Bias not supported yet")
    if a.dim() == 2 and b.dim() == 2:
        shape = (offs.size(0), a.size(0), b.size(1))
    elif a.dim() == 3 and b.dim() == 3:
        torch._check(a.size(0) == b.size(0), lambda: "batch sizes of mat_a and mat_b must match")
        shape = (a.size(0), a.size(1), b.size(2))
    else:
        shape = (a.size(-2), b.size(-1))
    return a.new_empty(shape, dtype=out_dtype or a.dtype)


@lowering("_grouped_mm", meta=_grouped_mm_meta)
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """Mixture-of-experts matmuls with static shapes: `offs` (cumulative group ends, on the device)
    splits one dimension into groups, and XLA's ragged dot multiplies each group by its own matrix, so
    routing never becomes a data-dependent shape. Modes as PyTorch's: 2D x 3D splits a's rows (the
    experts' forward), 2D x 2D splits the contraction (their weight gradient: one output per group),
    3D x 2D splits b's columns, 3D x 3D is a batched matmul. Rows/columns past the last offset are
    zero (PyTorch leaves them undefined)."""
    if bias is not None:
        raise NotImplementedError("_grouped_mm: Bias not supported yet")
    dtype = out_dtype or a.dtype
    kw = dict(precision=operand_precision(a, b), preferred_element_type=_acc(a) or a.dtype)
    if a.ndim == 3 and b.ndim == 3:
        return matmul(a, b).astype(dtype)
    sizes = jnp.diff(offs.astype(jnp.int32), prepend=0)
    if a.ndim == 2 and b.ndim == 3:
        out = ragged_dot(a, b, sizes, **kw)
    elif a.ndim == 3 and b.ndim == 2:
        out = lax.ragged_dot(b.T, jnp.swapaxes(a, 1, 2), sizes, **kw).T
    else:
        numbers = lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(((1,), (0,)), ((), ())), lhs_ragged_dimensions=[1], rhs_group_dimensions=[]
        )
        out = lax.ragged_dot_general(a, b, sizes, numbers, **kw)
    return out.astype(dtype)


def _pair_diff(x1, x2):
    return jnp.expand_dims(x1, -2) - jnp.expand_dims(x2, -3)  # (..., P, R, M)


def _distance(diff, p):
    """p-norm over the last axis (the coordinates) of point differences."""
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    from .reductions import _norm

    return _norm(diff, p, (diff.ndim - 1,), False)


@lowering("_cdist_forward", no_loop_for=(torch.float16, torch.bfloat16))
def cdist(x1, x2, p, compute_mode=None):
    return _distance(_pair_diff(x1, x2), p)


def _dist_grad(diff, dist, p):
    """d dist / d diff for a p-norm distance, as PyTorch's cdist/pdist backward kernels define it
    (zero where the distance is zero, so coincident points get no NaN)."""
    safe = jnp.where(dist == 0, 1, dist)
    if p == 0:
        g = jnp.zeros_like(diff)
    elif p == 1:
        g = jnp.sign(diff)
    elif p == 2:
        g = diff / safe
    elif p == float("inf"):
        g = jnp.sign(diff) * (jnp.abs(diff) == dist)
    elif p < 2:
        g = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) / safe ** (p - 1)
        g = jnp.where((p < 1) & (diff == 0), 0, g)
    else:
        g = diff * jnp.abs(diff) ** (p - 2) / safe ** (p - 1)
    return jnp.where(dist == 0, 0, g)


@lowering("_cdist_backward")
def cdist_backward(grad, x1, x2, p, cdist):
    """The gradient for x1 over the broadcast batch (autograd sums it down to x1's own batch), except
    where there is nothing to compute (an empty broadcast batch or no points): zeros of x1's own
    shape, as PyTorch's kernel returns."""
    if 0 in (*cdist.shape, x1.shape[-1]):
        return jnp.zeros(x1.shape, x1.dtype)
    g = _dist_grad(_pair_diff(x1, x2), jnp.expand_dims(cdist, -1), p) * jnp.expand_dims(grad, -1)
    return jnp.sum(g, axis=-2).astype(x1.dtype)


@lowering("_pdist_forward", no_loop_for=(torch.float16, torch.bfloat16))
def pdist(x, p=2.0):
    i, j = jnp.triu_indices(x.shape[0], 1)  # pairs i < j, row-major: PyTorch's order
    return _distance(x[i] - x[j], p)


@lowering("_pdist_backward")
def pdist_backward(grad, x, p, pdist):
    i, j = jnp.triu_indices(x.shape[0], 1)
    g = _dist_grad(x[i] - x[j], pdist[:, None], p) * grad[:, None]
    return jnp.zeros_like(x).at[i].add(g).at[j].add(-g)


# (PyTorch's decomposition computed it; a lowering of its own carries the CPU's missing loops)
@lowering("linalg_cross", no_loop_for=(torch.bool, *WIDE_UNSIGNED))
def linalg_cross(a, b, dim=-1):
    a, b = jnp.broadcast_arrays(a, b)
    return jnp.cross(a, b, axis=dim % a.ndim)
