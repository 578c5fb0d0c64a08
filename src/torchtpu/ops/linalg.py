"""Lowerings: linalg."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .checks import require
from .dtypes import scalar_type_name
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


def matmul(a, b):
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
    return min(a.shape[-2], n) > 1 and rows * n * k >= _BF16_PASS_MIN_WORK


def _for_host():
    from ..device.platform import lowering_platform

    return lowering_platform() == "cpu"


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


def _mm_dtypes(a, b, *_, **__):
    """The CPU and CUDA kernels' dtype checks, which PyTorch's meta kernels leave out (mixed dtypes
    would otherwise be promoted here)."""
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


_WIDE_INTEGERS = (jnp.int64, jnp.uint64)


def _integer_product_check(x, kernel):
    """XLA:TPU has no 64-bit integer dot product (compiling one fails): refused at the op when tracing
    for a TPU, as CUDA refuses int64 matmuls ('"addmm_cuda" not implemented for 'Long''). XLA:CPU
    computes them: there they keep working."""
    if x.dtype in _WIDE_INTEGERS:
        from ..device.platform import lowering_platform

        if lowering_platform() == "tpu":
            raise RuntimeError(
                f"\"{kernel}_tpu\" not implemented for '{_name(x)}': XLA:TPU has no 64-bit "
                f"integer matrix product (compute it in int32 or a floating dtype on the TPU)"
            )


@lowering(
    "mm",
    "bmm",
    "matmul",
    "dot",
    "mv",
    meta_check={
        "mm": _mm_dtypes,
        "mm.out": _mm_dtypes,
        "matmul": _mm_dtypes,
        "matmul.out": _mm_dtypes,
        "mv": _mv_dtypes,
        "mv.out": _mv_dtypes,
    },
)
def mm(a, b):
    _integer_product_check(a, "mm")
    return matmul(a, b)


@lowering("vdot")
def vdot(a, b):
    _integer_product_check(a, "vdot")
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
    meta_check={"addmm": _addmm_dtypes, "addmm_": _addmm_dtypes, "addmm.out": _addmm_dtypes},
)
def addmm(c, a, b, beta=1, alpha=1):
    _integer_product_check(a, "addmm")
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
    "addbmm", blas=True, meta_check={"addbmm": _addmm_dtypes, "addbmm_": _addmm_dtypes, "addbmm.out": _addmm_dtypes}
)
def addbmm(c, a, b, beta=1, alpha=1):
    _integer_product_check(a, "addbmm")
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


@lowering("_cdist_forward")
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


@lowering("_pdist_forward")
def pdist(x, p=2.0):
    i, j = jnp.triu_indices(x.shape[0], 1)  # pairs i < j, row-major: PyTorch's order
    return _distance(x[i] - x[j], p)


@lowering("_pdist_backward")
def pdist_backward(grad, x, p, pdist):
    i, j = jnp.triu_indices(x.shape[0], 1)
    g = _dist_grad(x[i] - x[j], pdist[:, None], p) * grad[:, None]
    return jnp.zeros_like(x).at[i].add(g).at[j].add(-g)


# ---------------------------------------------------------------- decompositions: error reporting
_FAILURES = {  # PyTorch's wording, without the failing element's number (the check runs on the device)
    "cholesky": "The factorization could not be completed because the input is not positive-definite",
    "inv": "The diagonal element is zero, the inversion could not be completed because the input matrix is singular",
    "solve": "The solver failed because the input matrix is singular",
    "lu_factor": "The factorization could not be completed because the input matrix is singular (a zero pivot)",
    "eigh": "The algorithm failed to converge because the input matrix is ill-conditioned or has too many "
    "repeated eigenvalues",
    "svd": "The algorithm failed to converge because the input matrix is ill-conditioned or has too many "
    "repeated singular values",
}


@lowering("_linalg_check_errors")
def linalg_check_errors(info, api_name, is_matrix):
    """`check_errors=True` of the linalg ops: a nonzero `info` is a device-side assert (checks.py)."""
    kind = next((k for k in _FAILURES if api_name.split(".")[-1].startswith(k)), None)
    reason = _FAILURES[kind] if kind else "the operation failed (info != 0)"
    require(info == 0, f"{api_name}: {reason}")
    return ()


# ---------------------------------------------------------------- decompositions and solves
# LAPACK's factorizations and solves through XLA's (jax.lax.linalg: LAPACK on CPU, cuSOLVER on GPU,
# XLA's own expansions on TPU), returning what PyTorch's CPU kernels return: 1-based int32 pivots,
# int32 `info`, empty tensors for outputs that were not asked for. PyTorch's meta kernels have
# already checked shapes and dtypes (square, same dtype, floating or complex) before we get here.
_LOW_PRECISION = {jnp.dtype(jnp.float16): "Half", jnp.dtype(jnp.bfloat16): "BFloat16"}


def _lapack_dtype(a, kernel):
    """PyTorch has no half-precision decompositions (its meta kernels let them through): same error."""
    if a.dtype in _LOW_PRECISION:
        raise RuntimeError(f"\"{kernel}_tpu\" not implemented for '{_LOW_PRECISION[a.dtype]}'")


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _exact_mm(a, b):
    # products inside a decomposition keep full float32 precision whatever the matmul setting
    return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


def _broadcast_batch(*xs):
    """(array, number of non-batch dims) pairs -> the arrays with their batch dims broadcast together."""
    batch = jnp.broadcast_shapes(*(x.shape[:-core] for x, core in xs))
    return [jnp.broadcast_to(x, batch + x.shape[x.ndim - core :]) for x, core in xs]


def _empty(dtype):
    return jnp.zeros((0,), dtype)


def _tri_solve(a, b, *, upper, left=True, transpose=False, conjugate=False, unit=False):
    """op(a) x = b (left) or x op(a) = b, reading only a's upper or lower triangle."""
    a, b = _broadcast_batch((a, 2), (b, 2))
    return lax.linalg.triangular_solve(
        a, b, left_side=left, lower=not upper, transpose_a=transpose, conjugate_a=conjugate, unit_diagonal=unit
    )


# ---- Cholesky
def _first_bad_minor(a):
    """LAPACK's potrf `info` for each matrix of the batch: 1 + the first column whose pivot is not
    positive (or is NaN), 0 when there is none. XLA's Cholesky only says "failed" (it returns NaN),
    so the failing order is found again by an unblocked right-looking factorization of the lower
    triangle. Run only when some matrix failed."""
    n = a.shape[-1]
    rows = jnp.arange(n)

    def step(j, state):
        work, info = state
        pivot = jnp.real(work[..., j, j])
        bad = ~(pivot > 0)
        info = jnp.where((info == 0) & bad, j + 1, info)
        col = work[..., :, j] / jnp.sqrt(jnp.where(bad, 1, pivot))[..., None]
        col = jnp.where(rows > j, col, 0)
        return work - col[..., :, None] * jnp.conj(col[..., None, :]), info

    info = jnp.zeros(a.shape[:-2], jnp.int32)
    return lax.fori_loop(0, n, step, (jnp.tril(a), info))[1]


def _cholesky(a, upper):
    """(L or U, info) as linalg.cholesky_ex: the factor of the triangle PyTorch reads, NaN where the
    matrix is not positive-definite (LAPACK leaves a partial factor there: unspecified values)."""
    _lapack_dtype(a, "cholesky")
    zeros = jnp.zeros(a.shape[:-2], jnp.int32)
    if a.shape[-1] == 0:
        return a, zeros
    lower_part = _mH(a) if upper else a  # A = U^H U reads the upper triangle: that is A^H's lower
    low = lax.linalg.cholesky(lower_part, symmetrize_input=False)
    failed = ~jnp.all(jnp.isfinite(low), axis=(-2, -1))
    found = lax.cond(jnp.any(failed), lambda: _first_bad_minor(lower_part), lambda: zeros)
    # a failure XLA saw but the unblocked pass did not (rounding at the edge): still a failure
    info = jnp.where(failed, jnp.where(found == 0, a.shape[-1], found), 0).astype(jnp.int32)
    return (_mH(low) if upper else low), info


@lowering("linalg_cholesky_ex")
def linalg_cholesky_ex(a, upper=False, check_errors=False):
    factor, info = _cholesky(a, upper)
    if check_errors:
        linalg_check_errors(info, "linalg.cholesky", a.ndim == 2)
    return factor, info


@lowering("cholesky")
def cholesky(a, upper=False):
    """The deprecated torch.cholesky: always checks."""
    factor, info = _cholesky(a, upper)
    linalg_check_errors(info, "cholesky", a.ndim == 2)
    return factor


def _cholesky_solve(b, factor, upper):
    """x with (L L^H) x = b, or (U^H U) x = b: two triangular solves."""
    if upper:
        y = _tri_solve(factor, b, upper=True, transpose=True, conjugate=True)
        return _tri_solve(factor, y, upper=True)
    y = _tri_solve(factor, b, upper=False)
    return _tri_solve(factor, y, upper=False, transpose=True, conjugate=True)


@lowering("_cholesky_solve_helper")
def cholesky_solve_helper(b, factor, upper):
    _lapack_dtype(b, "cholesky_solve")
    return _cholesky_solve(b, factor, upper)


@lowering("cholesky_inverse")
def cholesky_inverse(factor, upper=False):
    _lapack_dtype(factor, "cholesky_inverse")
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return _cholesky_solve(eye, factor, upper)


# ---- triangular solves
@lowering("linalg_solve_triangular")
def linalg_solve_triangular(a, b, upper, left=True, unitriangular=False):
    _lapack_dtype(a, "triangular_solve")
    return _tri_solve(a, b, upper=upper, left=left, unit=unitriangular)


@lowering("triangular_solve")
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    """The deprecated torch.triangular_solve: op(A) X = B with op a plain transpose (no conjugate);
    also returns A broadcast to the batch (`cloned_coefficient`)."""
    _lapack_dtype(a, "triangular_solve")
    a, b = _broadcast_batch((a, 2), (b, 2))
    return _tri_solve(a, b, upper=upper, transpose=transpose, unit=unitriangular), a


# ---- LU
def _lu(a):
    """(LU, pivots, info, permutation) as LAPACK's getrf: pivots 1-based int32 row swaps, info the
    1-based index of the first zero on U's diagonal (a singular matrix still factors). The
    permutation (0-based) says which row of A each row of L U is: A[perm] = L U."""
    _lapack_dtype(a, "lu")
    if 0 in a.shape[-2:]:  # nothing to factor (XLA's LU wants a matrix)
        k = min(a.shape[-2:])
        return (
            a,
            jnp.zeros(a.shape[:-2] + (k,), jnp.int32),
            jnp.zeros(a.shape[:-2], jnp.int32),
            jnp.broadcast_to(jnp.arange(a.shape[-2], dtype=jnp.int32), a.shape[:-1]),
        )
    lu, pivots, perm = lax.linalg.lu(a)
    zero = jnp.diagonal(lu, axis1=-2, axis2=-1) == 0
    info = jnp.where(jnp.any(zero, axis=-1), jnp.argmax(zero, axis=-1) + 1, 0).astype(jnp.int32)
    return lu, (pivots + 1).astype(jnp.int32), info, perm


def _no_pivoting():
    raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the CPU")


def _pivots_to_perm(pivots, n):
    """LAPACK's 1-based row swaps as the permutation of n rows they make."""
    return lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, n)


def _unpack_lu(lu):
    """L (unit lower, m x k) and U (upper, k x n) of a packed m x n LU, k = min(m, n)."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    return lower, jnp.triu(lu[..., :k, :])


def _permutation_matrix(perm, dtype):
    """P with A = P L U, from A[perm] = L U: P[perm[i], i] = 1."""
    return _mT(jax.nn.one_hot(perm, perm.shape[-1], dtype=dtype))


@lowering("linalg_lu_factor_ex")
def linalg_lu_factor_ex(a, pivot=True, check_errors=False):
    if not pivot:
        _no_pivoting()
    lu, pivots, info, _ = _lu(a)
    if check_errors:
        linalg_check_errors(info, "linalg.lu_factor_ex", a.ndim == 2)
    return lu, pivots, info


@lowering("linalg_lu")
def linalg_lu(a, pivot=True):
    if not pivot:
        _no_pivoting()
    lu, _, _, perm = _lu(a)
    lower, upper = _unpack_lu(lu)
    return _permutation_matrix(perm, a.dtype), lower, upper


@lowering("lu_unpack")
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    lower, upper = _unpack_lu(lu) if unpack_data else (_empty(lu.dtype), _empty(lu.dtype))
    if not unpack_pivots:
        return _empty(lu.dtype), lower, upper
    return _permutation_matrix(_pivots_to_perm(pivots, lu.shape[-2]), lu.dtype), lower, upper


def _lu_solve_left(lu, perm, b, adjoint):
    """x with A x = b (or A^H x = b) for A[perm] = L U packed in `lu`."""
    lu, perm, b = _broadcast_batch((lu, 2), (perm, 1), (b, 2))
    if not adjoint:  # L U x = b[perm]
        y = _tri_solve(lu, jnp.take_along_axis(b, perm[..., None], axis=-2), upper=False, unit=True)
        return _tri_solve(lu, y, upper=True)
    # A^H = U^H L^H P^T: x = P L^-H U^-H b, and (P z)[perm] = z
    y = _tri_solve(lu, b, upper=True, transpose=True, conjugate=True)
    z = _tri_solve(lu, y, upper=False, transpose=True, conjugate=True, unit=True)
    return jnp.take_along_axis(z, jnp.argsort(perm, axis=-1)[..., None], axis=-2)


def _lu_solve(lu, perm, b, left=True, adjoint=False):
    if left:
        return _lu_solve_left(lu, perm, b, adjoint)
    # x op(A) = b  <=>  op(A)^H x^H = b^H
    return _mH(_lu_solve_left(lu, perm, _mH(b), not adjoint))


@lowering("linalg_lu_solve")
def linalg_lu_solve(lu, pivots, b, left=True, adjoint=False):
    _lapack_dtype(lu, "lu_solve")
    return _lu_solve(lu, _pivots_to_perm(pivots, lu.shape[-1]), b, left, adjoint)


# ---- LDL (Bunch-Kaufman), LAPACK's ?sytf2 with uplo='L' as PyTorch calls it
_BK_ALPHA = (1 + 17**0.5) / 8


def _cabs1(x):
    """LAPACK's pivot magnitude: |re| + |im| for complex (zsytf2's CABS1), |x| for real."""
    return jnp.abs(x.real) + jnp.abs(x.imag) if jnp.iscomplexobj(x) else jnp.abs(x)


def _ldl_one(a, herm=False):
    """One n x n symmetric matrix (its lower triangle): (LD, 1-based int32 pivots, info) as ?sytf2
    (?hetf2 for a complex Hermitian one, `herm`: conjugated mirror and updates, a real diagonal).
    A column loop: at column k pick a 1x1 or 2x2 pivot by Bunch-Kaufman's rule, swap it into place
    by a symmetric row/column interchange of the trailing block only (LAPACK's convention: earlier
    columns of L are not permuted), then eliminate. The trailing block is kept symmetric by mirroring
    its lower triangle, which is all LAPACK reads."""
    n = a.shape[-1]
    idx = jnp.arange(n)
    lower = idx[:, None] >= idx[None, :]

    def sym(m):
        if not herm:
            return jnp.where(lower, m, _mT(m))
        m = jnp.where(lower, m, jnp.conj(_mT(m)))
        return jnp.where(idx[:, None] == idx[None, :], m.real.astype(m.dtype), m)  # ?hetf2 drops Im(diag)

    re = (lambda v: v.real) if herm else (lambda v: v)
    cj = jnp.conj if herm else (lambda v: v)

    def body(state):
        k, m, piv, info = state
        col = m[:, k]
        absakk = jnp.abs(m[k, k].real) if herm else _cabs1(m[k, k])
        below = idx > k
        mags = jnp.where(below, _cabs1(col), -1)
        imax = jnp.argmax(mags)  # the first largest, as LAPACK's i?amax
        colmax = jnp.where(k < n - 1, jnp.max(mags), 0).astype(absakk.dtype)
        row = m[imax]  # the matrix is symmetric: row imax = column imax
        rowmax = jnp.max(jnp.where((idx >= k) & (idx != imax), _cabs1(row), 0)).astype(absakk.dtype)
        zero = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        one_here = zero | (absakk >= _BK_ALPHA * colmax) | (absakk * rowmax >= _BK_ALPHA * colmax * colmax)
        diag_imax = jnp.abs(m[imax, imax].real) if herm else _cabs1(m[imax, imax])
        take_imax = ~one_here & (diag_imax >= _BK_ALPHA * rowmax)
        kstep = jnp.where(one_here | take_imax, 1, 2)
        kp = jnp.where(one_here, k, imax)
        kk = k + kstep - 1
        # interchange rows and columns kk and kp of the trailing block
        p = jnp.where(idx == kk, kp, jnp.where(idx == kp, kk, idx))
        trailing = (idx[:, None] >= k) & (idx[None, :] >= k)
        m = jnp.where(trailing, m[p][:, p], m)
        col = m[:, k]
        # 1x1 pivot: L's column is the column over d11; the trailing block loses its rank-1 part
        d11 = 1 / jnp.where(zero, 1, re(m[k, k]))
        x = jnp.where(below, col, 0)
        one = m + x[:, None] * (-d11 * cj(x))[None, :]
        one = one.at[:, k].set(jnp.where(below, col * d11, col))
        # 2x2 pivot (LAPACK's update through wk, wkp1)
        col1 = m[:, k + 1 if n > 1 else 0]
        d21 = m[jnp.minimum(k + 1, n - 1), k]
        d21s = jnp.where(d21 == 0, 1, d21)
        below2 = idx > k + 1
        if herm:  # ?hetf2: scaled by |d21|, the off-diagonal's phase kept in d21 / |d21|
            dd = jnp.abs(d21s)
            e11 = m[jnp.minimum(k + 1, n - 1), jnp.minimum(k + 1, n - 1)].real / dd
            e22 = m[k, k].real / dd
            t = 1 / (e11 * e22 - 1)
            ph = d21s / dd
            dd = t / dd
            wk = jnp.where(below2, dd * (e11 * col - ph * col1), 0)
            wkp1 = jnp.where(below2, dd * (e22 * col1 - jnp.conj(ph) * col), 0)
        else:
            e11 = m[jnp.minimum(k + 1, n - 1), jnp.minimum(k + 1, n - 1)] / d21s
            e22 = m[k, k] / d21s
            t = 1 / (e11 * e22 - 1)
            d21t = t / d21s
            wk = jnp.where(below2, d21t * (e11 * col - col1), 0)
            wkp1 = jnp.where(below2, d21t * (e22 * col1 - col), 0)
        two = m - (
            jnp.where(below2, col, 0)[:, None] * cj(wk)[None, :]
            + jnp.where(below2, col1, 0)[:, None] * cj(wkp1)[None, :]
        )
        two = two.at[:, k].set(jnp.where(below2, wk, col))
        two = two.at[:, jnp.minimum(k + 1, n - 1)].set(jnp.where(below2, wkp1, col1))
        m = jnp.where(zero, m, jnp.where(kstep == 1, one, two))
        m = sym(m)
        kp = kp.astype(jnp.int32)
        piv = jnp.where(
            kstep == 1, piv.at[k].set(kp + 1), piv.at[k].set(-(kp + 1)).at[jnp.minimum(k + 1, n - 1)].set(-(kp + 1))
        )
        info = jnp.where(zero & (info == 0), k + 1, info)
        return k + kstep, m, piv, info

    _, m, piv, info = lax.while_loop(
        lambda s: s[0] < n, body, (jnp.int32(0), sym(a), jnp.zeros((n,), jnp.int32), jnp.int32(0))
    )
    return jnp.tril(m), piv, info


def _ldl_dtype(a, kernel):
    if a.dtype in _LOW_PRECISION:  # the CPU's error for these kernels is a NotImplementedError
        raise NotImplementedError(f"\"{kernel}_kernel_tpu\" not implemented for '{_LOW_PRECISION[a.dtype]}'")


@lowering("linalg_ldl_factor_ex")
def linalg_ldl_factor_ex(a, hermitian=False, check_errors=False):
    _ldl_dtype(a, "ldl_factor")
    n = a.shape[-1]
    if n == 0:
        return a, jnp.zeros(a.shape[:-1], jnp.int32), jnp.zeros(a.shape[:-2], jnp.int32)
    herm = bool(hermitian) and jnp.iscomplexobj(a)
    fn = lambda m: _ldl_one(m, herm)
    for _ in range(a.ndim - 2):
        fn = jax.vmap(fn)
    ld, piv, info = fn(a)
    if check_errors:
        linalg_check_errors(info, "torch.linalg.ldl_factor_ex", a.ndim == 2)
    return ld, piv, info


def _ldl_solve_one(ld, piv, b, herm=False):
    """?sytrs (?hetrs for `herm`), uplo='L': solve L D X = P B column by column of the factorization,
    then L^T X = ... (L^H for ?hetrs)."""
    n = ld.shape[-1]
    idx = jnp.arange(n)

    def swap(b, i, j):
        p = jnp.where(idx == i, j, jnp.where(idx == j, i, idx))
        return b[p]

    def forward(state):
        k, b = state
        two = piv[k] < 0
        kp = jnp.where(two, -piv[k], piv[k]) - 1
        k1 = jnp.minimum(k + 1, n - 1)
        b = swap(b, jnp.where(two, k1, k), kp)
        col, col1 = ld[:, k], ld[:, k1]
        # 1x1
        one = b - jnp.where(idx > k, col, 0)[:, None] * b[k][None, :]
        one = one.at[k].set(one[k] / ld[k, k])
        # 2x2
        below2 = idx > k + 1
        tw = b - (
            jnp.where(below2, col, 0)[:, None] * b[k][None, :] + jnp.where(below2, col1, 0)[:, None] * b[k1][None, :]
        )
        akm1k = ld[k1, k]
        akm1k = jnp.where(akm1k == 0, 1, akm1k)
        akm1kc = jnp.conj(akm1k) if herm else akm1k
        akm1, ak = ld[k, k] / akm1kc, ld[k1, k1] / akm1k  # D = [[d1, conj(c)], [c, d2]], c below
        denom = akm1 * ak - 1
        bkm1, bk = tw[k] / akm1kc, tw[k1] / akm1k
        tw = tw.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return k + jnp.where(two, 2, 1), jnp.where(two, tw, one)

    _, b = lax.while_loop(lambda s: s[0] < n, forward, (jnp.int32(0), b))

    def backward(state):
        k, b = state
        two = piv[k] < 0
        kp = jnp.where(two, -piv[k], piv[k]) - 1
        km1 = jnp.maximum(k - 1, 0)
        below = jnp.where(idx > k, 1, 0).astype(b.dtype)[:, None]
        lc = jnp.conj(ld) if herm else ld
        bk = b[k] - jnp.sum(lc[:, k][:, None] * below * b, 0)
        bkm1 = b[km1] - jnp.sum(lc[:, km1][:, None] * below * b, 0)
        b = b.at[k].set(bk)
        b = jnp.where(two, b.at[km1].set(bkm1), b)
        b = swap(b, k, kp)
        return k - jnp.where(two, 2, 1), b

    _, b = lax.while_loop(lambda s: s[0] >= 0, backward, (jnp.int32(n - 1), b))
    return b


@lowering("linalg_ldl_solve")
def linalg_ldl_solve(ld, pivots, b, hermitian=False):
    _ldl_dtype(ld, "ldl_solve")
    if ld.shape[-1] == 0 or b.shape[-1] == 0:
        return jnp.broadcast_to(b, jnp.broadcast_shapes(ld.shape[:-2], b.shape[:-2]) + b.shape[-2:])
    (ld, b), piv = _broadcast_batch((ld, 2), (b, 2)), pivots
    piv = jnp.broadcast_to(piv, ld.shape[:-1])
    herm = bool(hermitian) and jnp.iscomplexobj(ld)
    fn = lambda l_, p_, b_: _ldl_solve_one(l_, p_, b_, herm)
    for _ in range(ld.ndim - 2):
        fn = jax.vmap(fn)
    return fn(ld, piv, b.astype(ld.dtype))


# ---- determinants, inverse, solve
def _det_lu(a):
    """The LU PyTorch's det/slogdet keep for their backward: of A^T for real A (their kernels factor
    the transpose of a contiguous real A; their backward then solves without the adjoint), of A for
    complex A. A lowering does not see strides: a non-contiguous real A would get A's own LU there."""
    return _lu(a if jnp.iscomplexobj(a) else _mT(a))


def _pivot_sign(pivots):
    swaps = jnp.sum(pivots != jnp.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype), axis=-1)
    return jnp.where(swaps % 2 == 0, 1, -1)


@lowering("_linalg_det")
def linalg_det(a):
    lu, pivots, _, _ = _det_lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return (_pivot_sign(pivots) * jnp.prod(diag, axis=-1)).astype(a.dtype), lu, pivots


@lowering("_linalg_slogdet")
def linalg_slogdet(a):
    lu, pivots, _, _ = _det_lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    size = jnp.abs(diag)
    # a zero pivot: sign 0 (times the rest, as PyTorch: -0.0 may come out), log|det| = -inf
    phase = jnp.prod(diag / jnp.where(size == 0, 1, size).astype(diag.dtype) * (size != 0), axis=-1)
    sign = (_pivot_sign(pivots) * phase).astype(a.dtype)
    return sign, jnp.sum(jnp.log(size), axis=-1), lu, pivots


@lowering("linalg_inv_ex")
def linalg_inv_ex(a, check_errors=False):
    lu, _, info, perm = _lu(a)
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    if check_errors:
        linalg_check_errors(info, "linalg.inv_ex", a.ndim == 2)
    return _lu_solve(lu, perm, eye), info


@lowering("_linalg_solve_ex")
def linalg_solve_ex(a, b, left=True, check_errors=False):
    """A X = B (or X A = B) with PyTorch's rule for vectors: B is a (batch of) vector(s) when it is
    1-D, or when it has A's shape without the last dimension."""
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    lu, pivots, info, perm = _lu(a)
    x = _lu_solve(lu, perm, b[..., None] if vector else b, left)
    if check_errors:
        linalg_check_errors(info, "linalg.solve_ex", a.ndim == 2)
    return (x[..., 0] if vector else x), lu, pivots, info


def _lstsq_meta(a, b, rcond=None, *, driver=None):
    """Output of `linalg_lstsq` on "tpu" (PyTorch has no meta kernel): CUDA's default driver "gels"
    (the CPU's is "gelsy"), and PyTorch's argument checks. See linalg_lstsq below."""
    driver = "gels" if driver is None else driver
    torch._check(
        driver in ("gels", "gelsy", "gelsd", "gelss"),
        lambda: (
            f"torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss), but got {driver}"
        ),
    )
    if driver in ("gelsd", "gelss"):
        raise NotImplementedError(
            f"torch.linalg.lstsq: driver {driver!r} is not supported on tpu (its residuals "
            f"exist only for full-rank inputs, a shape that depends on the values); "
            f"use 'gels' or 'gelsy'"
        )
    torch._check(a.dim() >= 2, lambda: "torch.linalg.lstsq: input must have at least 2 dimensions.")
    torch._check(
        a.dim() >= b.dim() and a.dim() - b.dim() <= 1,
        lambda: (
            "torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and (input.dim() - other.dim()) <= 1"  # noqa: E501
        ),
    )
    torch._check(
        a.dtype.is_floating_point or a.dtype.is_complex,
        lambda: f"torch.linalg.lstsq: Expected input to have floating point or complex dtype, but got {a.dtype}",
    )
    torch._check(
        a.dtype == b.dtype,
        lambda: (
            f"torch.linalg.lstsq: Expected input and other to have the same dtype, but got input with dtype "
            f"{a.dtype} and other with dtype {b.dtype}"
        ),
    )
    vector = b.dim() == a.dim() - 1
    m, n = a.shape[-2:]
    torch._check(
        b.shape[-1 if vector else -2] == m,
        lambda: f"torch.linalg.lstsq: input.size(-2) should match other.size({-1 if vector else -2})",
    )
    k = 1 if vector else b.shape[-1]
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[: -1 if vector else -2])
    real = a.dtype.to_real()
    solution = a.new_empty((*batch, n) if vector else (*batch, n, k))
    residuals = a.new_empty((*batch, k) if driver == "gels" and m > n else (0,), dtype=real)
    rank = a.new_empty(a.shape[:-2] if driver == "gelsy" else (0,), dtype=torch.int64)  # A's batch
    return solution, residuals, rank, a.new_empty((0,), dtype=real)


@lowering("linalg_lstsq", meta=_lstsq_meta)
def linalg_lstsq(a, b, rcond=None, driver=None):
    """min ||A X - B||. The default driver is "gels", as on CUDA (the CPU's default is "gelsy"): QR of a
    full-rank A, residuals when m > n, rank and singular values empty. "gelsy" (rank-revealing, here
    through the SVD with singular values at most rcond * the largest treated as zero: the minimum-norm
    solution of the truncated problem) returns the rank and no residuals, as LAPACK's. "gelsd" and
    "gelss" return residuals only when every matrix has full rank, a shape that depends on the values:
    not supported (CUDA supports only "gels")."""
    _lapack_dtype(a, "linalg_lstsq")  # (the other checks: eager/kernels.py, _lstsq_meta)
    driver = "gels" if driver is None else driver
    vector = b.ndim == a.ndim - 1
    b = b[..., None] if vector else b
    m, n = a.shape[-2:]
    real = jnp.finfo(a.dtype).dtype
    no_rank, no_sv = _empty(jnp.int64), _empty(real)
    if driver == "gels":
        a, b = _broadcast_batch((a, 2), (b, 2))
        if m >= n:  # R x = Q^H b
            q, r = jnp.linalg.qr(a)
            x = _tri_solve(r, _exact_mm(_mH(q), b), upper=True)
        else:  # the minimum-norm solution: A^H = Q R, x = Q R^-H b
            q, r = jnp.linalg.qr(_mH(a))
            x = _exact_mm(q, _tri_solve(r, b, upper=True, transpose=True, conjugate=True))
        residuals = (jnp.abs(_exact_mm(a, x) - b) ** 2).sum(-2) if m > n else _empty(real)
        return (x[..., 0] if vector else x), residuals, no_rank, no_sv
    u, sv, vh = _svd(a, full_matrices=False)  # A's own batch: the rank is A's, not broadcast
    cutoff = (jnp.finfo(real).eps * max(m, n) if rcond is None or rcond < 0 else rcond) * sv[..., :1]
    keep = sv > cutoff
    inverse = jnp.where(keep, 1 / jnp.where(keep, sv, 1), 0).astype(a.dtype)
    u, inverse, vh, b = _broadcast_batch((u, 2), (inverse, 1), (vh, 2), (b, 2))
    x = _exact_mm(_mH(vh), inverse[..., None] * _exact_mm(_mH(u), b))
    return (x[..., 0] if vector else x), _empty(real), keep.sum(-1).astype(jnp.int64), no_sv


# ---- spectral decompositions and QR (signs and phases are free: PyTorch documents them so)
@lowering("_linalg_eigh")
def linalg_eigh(a, UPLO="L", compute_v=True):
    _lapack_dtype(a, "linalg_eigh")
    vectors, values = lax.linalg.eigh(a, lower=UPLO == "L", symmetrize_input=False, sort_eigenvalues=True)
    return values, (vectors if compute_v else _empty(a.dtype))


def _general_eig(a, kernel, vectors):
    """XLA's nonsymmetric eigensolver (LAPACK geev, PyTorch's CPU kernel too: unit-norm eigenvectors)
    exists on the CPU platform only; on TPU the op says so instead of failing inside XLA."""
    _lapack_dtype(a, kernel)
    from ..device.platform import lowering_platform

    target = lowering_platform()
    if target != "cpu":
        raise NotImplementedError(
            f"torchtpu: aten::{kernel} (torch.linalg.eig/eigvals) has no XLA lowering on the "
            f"{target} platform (XLA's general eigensolver runs on CPU only): compute it on "
            f"the CPU (x.cpu()), or use torch.linalg.eigh for symmetric/Hermitian matrices"
        )
    w, v = jnp.linalg.eig(a)
    return (w, v) if vectors else w


@lowering("linalg_eig")
def linalg_eig(a):
    return _general_eig(a, "linalg_eig", True)


@lowering("_linalg_eigvals")
def linalg_eigvals(a):
    return _general_eig(a, "linalg_eigvals", False)


@lowering("linalg_qr")
def linalg_qr(a, mode="reduced"):
    _lapack_dtype(a, "geqrf")
    if mode == "r":
        return _empty(a.dtype), _real_diagonal(None, jnp.linalg.qr(a, mode="r"))[1]
    return _real_diagonal(*jnp.linalg.qr(a, mode=mode))


def _real_diagonal(q, r):
    """LAPACK's convention for complex QR, which PyTorch's backward assumes: R's diagonal is real.
    XLA leaves a phase there; move it into Q's columns (Q D, D^H R keep the product)."""
    if not jnp.issubdtype(r.dtype, jnp.complexfloating):
        return q, r
    k = min(r.shape[-2], r.shape[-1])
    diag = jnp.diagonal(r[..., :k, :k], axis1=-2, axis2=-1)
    size = jnp.abs(diag)
    phase = jnp.where(size == 0, 1, diag / jnp.where(size == 0, 1, size))
    r = r.at[..., :k, :].multiply(jnp.conj(phase)[..., :, None])
    if q is not None:
        q = q.at[..., :, :k].multiply(phase[..., None, :])
    return q, r


def _tpu_svd_module():
    """JAX's TPU SVD (QDWH polar decomposition + eigh), the computation XLA:TPU's lowering of
    lax.linalg.svd traces; None in a JAX without it."""
    try:
        from jax._src.tpu.linalg import svd as tpu_svd
    except ImportError:
        return None
    return tpu_svd if hasattr(tpu_svd, "_svd_tpu") else None


def _svd(a, full_matrices=False, compute_uv=True):
    """(u, s, vh), or s alone, of `a`, as jnp.linalg.svd. For a TPU, single precision: JAX lowers its
    SVD primitive for TPU by tracing the QDWH algorithm at lowering time, under the process's x64
    setting, which torchtpu turns on: a sign matrix there becomes int64 and meets a float32 dot, which
    XLA:TPU cannot compile (it aborts the process). Traced here instead, with 64-bit types off for
    this computation only, the same algorithm has int32 indices; its float32 values are unchanged."""
    from ..device.platform import lowering_platform

    tpu_svd = _tpu_svd_module() if lowering_platform() == "tpu" else None
    if tpu_svd is None or a.dtype not in (jnp.float32, jnp.complex64) or a.size == 0:
        return jnp.linalg.svd(a, full_matrices=full_matrices, compute_uv=compute_uv)
    with jax.enable_x64(False):
        out = tpu_svd._svd_tpu(a, full_matrices=full_matrices, compute_uv=compute_uv, subset_by_index=None)
    return (out[1], out[0], out[2]) if compute_uv else out[0]


@lowering("_linalg_svd")
def linalg_svd(a, full_matrices=False, compute_uv=True, driver=None):
    _lapack_dtype(a, "linalg_svd")
    if not compute_uv:
        return _empty(a.dtype), _svd(a, compute_uv=False), _empty(a.dtype)
    return tuple(_svd(a, full_matrices=full_matrices))


# ---- Householder products (the Q of geqrf's packed reflectors) and the matrix exponential
@lowering("linalg_householder_product")
def linalg_householder_product(reflectors, tau):
    _lapack_dtype(reflectors, "orgqr")
    return lax.linalg.householder_product(reflectors, tau)


@lowering("ormqr")
def ormqr(reflectors, tau, other, left=True, transpose=False):
    """op(Q) C or C op(Q), Q = H_1 ... H_k the full m x m product (LAPACK's ormqr): the reflectors
    padded to m with tau = 0 (H = I) give it through orgqr."""
    _lapack_dtype(reflectors, "ormqr")
    m, k = reflectors.shape[-2], tau.shape[-1]
    square = jnp.zeros(reflectors.shape[:-1] + (m,), reflectors.dtype).at[..., :k].set(reflectors[..., :k])
    q = lax.linalg.householder_product(square, jnp.pad(tau, [(0, 0)] * (tau.ndim - 1) + [(0, m - k)]))
    q = _mH(q) if transpose else q
    q, other = _broadcast_batch((q, 2), (other, 2))
    return _exact_mm(q, other) if left else _exact_mm(other, q)


@lowering("linalg_matrix_exp")
def linalg_matrix_exp(a):
    # unlike the decompositions, PyTorch's CPU takes half types here: compute in float32, as its opmath
    if a.dtype in _LOW_PRECISION:
        return jax.scipy.linalg.expm(a.astype(jnp.float32)).astype(a.dtype)
    return jax.scipy.linalg.expm(a)
