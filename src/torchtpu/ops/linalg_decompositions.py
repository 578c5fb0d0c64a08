"""Lowerings: matrix decompositions and solves (Cholesky, LU, LDL, QR, eigen- and singular value
decompositions, triangular and general solves, least squares, determinants, inverses) and the
device-side report of their failures. Products and the matmul precision are in linalg.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from ..device.platform import lowering_platform
from .argument_checks import cpp_type_name
from .checks import require
from .dtypes import not_implemented_for, scalar_type_name
from .table import lowering

# ---------------------------------------------------------------- batches (eager/matrix_batches.py)
# These ops compute each matrix of a batch alone: `matrix_batches=` names their batched arguments
# (name, core dims, pad) so that an eager call with batch dims runs on a flat batch padded to a size
# bucket, one program for every batch shape. The pads make the op well defined and are dropped:
# identity matrices (a rectangular identity for a non-square core), zero right-hand sides and
# Householder scales (tau 0: the reflector is the identity), the identity permutation's pivots. An
# argument marked _BROADCAST may have other batch dims than the rest (expanded to the broadcast ones:
# the results have those), where the op's results all take the broadcast batch shape.
_EYE, _ZEROS, _PIVOTS, _BROADCAST = "eye", "zeros", "pivots", "broadcast"


def _batched(*plan):
    return lambda *args, **kwargs: plan


_ONE_MATRIX = _batched(("self", 2, _EYE))


def _matrix_rhs(a_name, b_name, a_broadcasts=None):
    """The plan of a solve whose right-hand side may be a (batch of) vector(s): matrices only (a
    vector right-hand side has one dim less than A, and the call runs as it is). A's batch dims
    broadcast too where `a_broadcasts(*args, **kwargs)` says every result takes the common batch
    (else results such as solve's LU or lstsq's ranks keep A's)."""
    plan = ((a_name, 2, _EYE), (b_name, 2, _ZEROS, _BROADCAST))
    both = ((a_name, 2, _EYE, _BROADCAST), (b_name, 2, _ZEROS, _BROADCAST))

    def of(a, b, *args, **kwargs):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == b.dim()):
            return None
        return both if a_broadcasts is not None and a_broadcasts(a, b, *args, **kwargs) else plan

    return of


def _lstsq_gels(a, b, rcond=None, driver=None):
    """lstsq's "gels" (tpu's default): no ranks or singular values, the results take the common batch."""
    return driver in (None, "gels")


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


def _failure_reason(api_name):
    kind = next((k for k in _FAILURES if api_name.split(".")[-1].startswith(k)), None)
    return _FAILURES[kind] if kind else "the operation failed (info != 0)"


def _linalg_errors_on_host(info, api_name, is_matrix):
    """host_check of `check_errors=True` (linalg.inv, cholesky, solve, ...): as CUDA, `info` is read on
    the host (a sync) and a failure raises torch.linalg.LinAlgError at the op, as the CPU does, naming
    the batch element. (Inside a compiled graph the lowering's device-side assert stays.)"""
    flat = info.detach().reshape(-1).cpu()
    failed = torch.nonzero(flat).reshape(-1)
    if failed.numel():
        first = int(failed[0])
        where = "" if is_matrix else f"(Batch element {first}): "
        reason = _failure_reason(api_name)
        code = int(flat[first])  # (the CPU names the element or minor, which the host knows here)
        if "lu_factor" in api_name:  # the CPU's TORCH_CHECK: a RuntimeError, naming U's zero pivot
            raise RuntimeError(
                f"{api_name}: {where}U[{code},{code}] is zero and using it on lu_solve would result in a "
                f"division by zero. If you still want to perform the factorization, consider calling "
                f"linalg.lu(A, pivot) or linalg.lu_factor_ex(A, pivot)"
            )
        if not any(api_name.split(".")[-1].startswith(k) for k in _FAILURES):
            # ldl_factor: the CPU knows no reason for LAPACK's sytrf info (its internal assert)
            raise RuntimeError(f"{api_name}: Unknown error code: {code}.")
        reason = reason.replace("diagonal element is", f"diagonal element {code} is")
        if reason == _FAILURES["cholesky"]:
            reason += f" (the leading minor of order {code} is not positive-definite)"
        raise torch.linalg.LinAlgError(f"{api_name}: {where}{reason}.")


@lowering("_linalg_check_errors", host_check=_linalg_errors_on_host)
def linalg_check_errors(info, api_name, is_matrix):
    """`check_errors=True` of the linalg ops: a nonzero `info` is a device-side assert (checks.py),
    raised once and not sticky (a singular input is the user's data, not a corrupt device; CUDA raises
    these at the op from the host)."""
    require(info == 0, f"{api_name}: {_failure_reason(api_name)}", recoverable=True)
    return ()


# The `_ex` ops whose `check_errors=True` raises torch.linalg.LinAlgError at the op, as the CPU and CUDA
# do (they read `info` on the host) -> the name the CPU's error gives. eager/kernels.py runs them
# unchecked, then `_linalg_check_errors` on `info` (their last result), whose host_check reads it; a
# compiled graph keeps the lowering's device-side check.
CHECK_ERRORS_ON_HOST = {
    "linalg_cholesky_ex.default": "linalg.cholesky_ex",
    "linalg_inv_ex.default": "linalg.inv_ex",
    "_linalg_solve_ex.default": "torch.linalg.solve_ex",
    "linalg_lu_factor_ex.default": "torch.linalg.lu_factor_ex",
    "linalg_ldl_factor_ex.default": "torch.linalg.ldl_factor_ex",
}


def _out_dtype_check(functional, outs, fn_name=None):
    """meta_check of an out= overload in the CPU's words (PyTorch's meta kernels say "Attempting to cast
    from torch.float32 to out tensor ..."): the dtype each out tensor must take, from `functional` on the
    same (meta) inputs. A structured CPU kernel (`fn_name` None) wants the result's dtype exactly; the
    ones that check with ATen's checkLinalgCompatibleDtype take any dtype the result casts to safely
    and name the function and the out argument (`outs`: out= argument -> the CPU's name for it). Bad
    inputs are left to the meta kernel (the CPU checks them first)."""

    def check(*args, **kwargs):
        given = [kwargs.pop(name) for name in outs]
        names = list(outs.values())
        try:
            results = functional(*args, **kwargs)
        except Exception:  # noqa: BLE001 - the meta kernel raises the CPU's error for these
            return
        results = results if isinstance(results, (tuple, list)) else (results,)
        for name, out, result in zip(names, given, results):
            if fn_name is None and out.dtype != result.dtype:
                raise RuntimeError(
                    f"Expected out tensor to have dtype {cpp_type_name(result.dtype)}, but got "
                    f"{cpp_type_name(out.dtype)} instead"
                )
            if fn_name is not None and not torch.can_cast(result.dtype, out.dtype):
                raise RuntimeError(
                    f"{fn_name}: Expected {name} to be safely castable from {scalar_type_name(result.dtype)} "
                    f"dtype, but got {name} with dtype {scalar_type_name(out.dtype)}"
                )

    return check


# ---------------------------------------------------------------- decompositions and solves
# LAPACK's factorizations and solves through XLA's (jax.lax.linalg: LAPACK on CPU, cuSOLVER on GPU,
# XLA's own expansions on TPU), returning what PyTorch's CPU kernels return: 1-based int32 pivots,
# int32 `info`, empty tensors for outputs that were not asked for. PyTorch's meta kernels have
# already checked shapes and dtypes (square, same dtype, floating or complex) before we get here.
_LOW_PRECISION = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def _lapack_dtype(a, kernel):
    """PyTorch has no half-precision decompositions (its meta kernels let them through): the error of
    its dtype dispatch, a NotImplementedError."""
    if a.dtype in _LOW_PRECISION:
        raise not_implemented_for(kernel, a.dtype)


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


@lowering("linalg_cholesky_ex", matrix_batches=_ONE_MATRIX)
def linalg_cholesky_ex(a, upper=False, check_errors=False):
    factor, info = _cholesky(a, upper)
    if check_errors:
        linalg_check_errors(info, CHECK_ERRORS_ON_HOST["linalg_cholesky_ex.default"], a.ndim == 2)
    return factor, info


@lowering("cholesky", matrix_batches=_ONE_MATRIX)
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


@lowering(
    "_cholesky_solve_helper", matrix_batches=_batched(("self", 2, _ZEROS, _BROADCAST), ("A", 2, _EYE, _BROADCAST))
)
def cholesky_solve_helper(b, factor, upper):
    _lapack_dtype(b, "cholesky_solve")
    return _cholesky_solve(b, factor, upper)


@lowering(
    "cholesky_inverse",
    matrix_batches=_ONE_MATRIX,
    meta_check={
        "cholesky_inverse.out": _out_dtype_check(
            torch.ops.aten.cholesky_inverse.default, {"out": "result"}, "cholesky_inverse"
        )
    },
)
def cholesky_inverse(factor, upper=False):
    _lapack_dtype(factor, "cholesky_inverse")
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return _cholesky_solve(eye, factor, upper)


# ---- triangular solves
# Their flags travel as values (`traced=`): keyed by them, each shape compiled once per combination
# (test_linalg_solve_triangular: 4 programs per shape and layout for upper x unitriangular). One
# program solves a lower triangle for all of them (_flagged_tri_solve).
def _flagged_tri_solve(a, b, upper, unit, left=True, transpose=False):
    """op(a) x = b (left) or x op(a) = b, reading a's upper or lower triangle, with `upper`, `unit`
    and `transpose` Python bools or traced ones: a lower solve of a selected operand. The reversal P
    (rows and columns in reverse order) maps an upper triangle onto a lower one: U x = b is
    (P U P)(P x) = P b, and x U = b is (x P)(P U P) = b P. A unit diagonal is a diagonal of ones (a
    division by one is exact); a transposed upper (lower) triangle is a lower (upper) one."""
    if isinstance(upper, bool) and isinstance(unit, bool) and isinstance(transpose, bool):
        return _tri_solve(a, b, upper=upper, left=left, transpose=transpose, unit=unit)
    a, b = _broadcast_batch((a, 2), (b, 2))
    up = jnp.asarray(upper, jnp.bool_)
    if transpose is not False:
        t = jnp.asarray(transpose, jnp.bool_)
        a = jnp.where(t, _mT(a), a)
        up = up ^ t
    a = jnp.where(up, jnp.flip(a, (-2, -1)), a)  # (the flip keeps the diagonal on the diagonal)
    if unit is not False:
        diagonal = jnp.eye(a.shape[-1], dtype=jnp.bool_)
        a = jnp.where(jnp.asarray(unit, jnp.bool_) & diagonal, jnp.ones((), a.dtype), a)
    axis = -2 if left else -1
    x = lax.linalg.triangular_solve(a, jnp.where(up, jnp.flip(b, axis), b), left_side=left, lower=True)
    return jnp.where(up, jnp.flip(x, axis), x)


@lowering(
    "linalg_solve_triangular",
    matrix_batches=_batched(("self", 2, _EYE, _BROADCAST), ("B", 2, _ZEROS, _BROADCAST)),
    traced=("upper", "unitriangular"),
)
def linalg_solve_triangular(a, b, upper, left=True, unitriangular=False):
    _lapack_dtype(a, "triangular_solve")
    return _flagged_tri_solve(a, b, upper, unitriangular, left=left)


@lowering(
    "triangular_solve",
    matrix_batches=_batched(("self", 2, _ZEROS, _BROADCAST), ("A", 2, _EYE, _BROADCAST)),
    traced=("upper", "transpose", "unitriangular"),
    meta_check={"triangular_solve.X": _out_dtype_check(torch.ops.aten.triangular_solve.default, {"X": "", "M": ""})},
)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    """The deprecated torch.triangular_solve: op(A) X = B with op a plain transpose (no conjugate);
    also returns A broadcast to the batch (`cloned_coefficient`)."""
    _lapack_dtype(a, "triangular_solve")
    a, b = _broadcast_batch((a, 2), (b, 2))
    return _flagged_tri_solve(a, b, upper, unitriangular, transpose=transpose), a


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


@lowering("linalg_lu_factor_ex", matrix_batches=_batched(("A", 2, _EYE)))
def linalg_lu_factor_ex(a, pivot=True, check_errors=False):
    if not pivot:
        _no_pivoting()
    lu, pivots, info, _ = _lu(a)
    if check_errors:
        linalg_check_errors(info, CHECK_ERRORS_ON_HOST["linalg_lu_factor_ex.default"], a.ndim == 2)
    return lu, pivots, info


@lowering("linalg_lu", matrix_batches=_batched(("A", 2, _EYE)))
def linalg_lu(a, pivot=True):
    if not pivot:
        _no_pivoting()
    lu, _, _, perm = _lu(a)
    lower, upper = _unpack_lu(lu)
    return _permutation_matrix(perm, a.dtype), lower, upper


@lowering("lu_unpack", matrix_batches=_batched(("LU_data", 2, _EYE), ("LU_pivots", 1, _PIVOTS)))
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


@lowering(
    "linalg_lu_solve",
    matrix_batches=_batched(
        ("LU", 2, _EYE, _BROADCAST), ("pivots", 1, _PIVOTS, _BROADCAST), ("B", 2, _ZEROS, _BROADCAST)
    ),
)
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

    def body(state):
        k, m, piv, info = state
        zero, kstep, kp = _bunch_kaufman_pivot(m, k, herm)
        kk = k + kstep - 1
        # interchange rows and columns kk and kp of the trailing block
        p = jnp.where(idx == kk, kp, jnp.where(idx == kp, kk, idx))
        trailing = (idx[:, None] >= k) & (idx[None, :] >= k)
        m = jnp.where(trailing, m[p][:, p], m)
        m = jnp.where(zero, m, jnp.where(kstep == 1, _eliminate_1x1(m, k, zero, herm), _eliminate_2x2(m, k, herm)))
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


def _conj_if(x, herm):
    return jnp.conj(x) if herm else x


def _bunch_kaufman_pivot(m, k, herm):
    """Column k's pivot by Bunch-Kaufman's rule, as ?sytf2 picks it: (zero: the column is zero or NaN,
    nothing to eliminate; kstep: a 1x1 or a 2x2 pivot; kp: the row swapped into place)."""
    n = m.shape[-1]
    idx = jnp.arange(n)
    col = m[:, k]
    absakk = jnp.abs(m[k, k].real) if herm else _cabs1(m[k, k])
    mags = jnp.where(idx > k, _cabs1(col), -1)
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
    return zero, kstep, kp


def _eliminate_1x1(m, k, zero, herm):
    """A 1x1 pivot at (k, k): L's column is the column over d11; the trailing block loses its rank-1
    part."""
    below = jnp.arange(m.shape[-1]) > k
    col = m[:, k]
    d11 = 1 / jnp.where(zero, 1, m[k, k].real if herm else m[k, k])
    x = jnp.where(below, col, 0)
    one = m + x[:, None] * (-d11 * _conj_if(x, herm))[None, :]
    return one.at[:, k].set(jnp.where(below, col * d11, col))


def _eliminate_2x2(m, k, herm):
    """A 2x2 pivot at rows and columns k, k+1 (LAPACK's update through wk, wkp1)."""
    n = m.shape[-1]
    k1 = jnp.minimum(k + 1, n - 1)
    col = m[:, k]
    col1 = m[:, k + 1 if n > 1 else 0]
    d21 = m[k1, k]
    d21s = jnp.where(d21 == 0, 1, d21)
    below2 = jnp.arange(n) > k + 1
    if herm:  # ?hetf2: scaled by |d21|, the off-diagonal's phase kept in d21 / |d21|
        dd = jnp.abs(d21s)
        e11 = m[k1, k1].real / dd
        e22 = m[k, k].real / dd
        t = 1 / (e11 * e22 - 1)
        ph = d21s / dd
        dd = t / dd
        wk = jnp.where(below2, dd * (e11 * col - ph * col1), 0)
        wkp1 = jnp.where(below2, dd * (e22 * col1 - jnp.conj(ph) * col), 0)
    else:
        e11 = m[k1, k1] / d21s
        e22 = m[k, k] / d21s
        t = 1 / (e11 * e22 - 1)
        d21t = t / d21s
        wk = jnp.where(below2, d21t * (e11 * col - col1), 0)
        wkp1 = jnp.where(below2, d21t * (e22 * col1 - col), 0)
    two = m - (
        jnp.where(below2, col, 0)[:, None] * _conj_if(wk, herm)[None, :]
        + jnp.where(below2, col1, 0)[:, None] * _conj_if(wkp1, herm)[None, :]
    )
    two = two.at[:, k].set(jnp.where(below2, wk, col))
    return two.at[:, k1].set(jnp.where(below2, wkp1, col1))


def _ldl_dtype(a, kernel):
    _lapack_dtype(a, f"{kernel}_kernel")


@lowering("linalg_ldl_factor_ex", matrix_batches=_ONE_MATRIX)
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
        linalg_check_errors(info, CHECK_ERRORS_ON_HOST["linalg_ldl_factor_ex.default"], a.ndim == 2)
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


@lowering(
    "linalg_ldl_solve",
    matrix_batches=_batched(
        ("LD", 2, _EYE, _BROADCAST), ("pivots", 1, _PIVOTS, _BROADCAST), ("B", 2, _ZEROS, _BROADCAST)
    ),
)
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


@lowering("_linalg_det", matrix_batches=_batched(("A", 2, _EYE)))
def linalg_det(a):
    lu, pivots, _, _ = _det_lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return (_pivot_sign(pivots) * jnp.prod(diag, axis=-1)).astype(a.dtype), lu, pivots


@lowering("_linalg_slogdet", matrix_batches=_batched(("A", 2, _EYE)))
def linalg_slogdet(a):
    lu, pivots, _, _ = _det_lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    size = jnp.abs(diag)
    # a zero pivot: sign 0 (times the rest, as PyTorch: -0.0 may come out), log|det| = -inf
    phase = jnp.prod(diag / jnp.where(size == 0, 1, size).astype(diag.dtype) * (size != 0), axis=-1)
    sign = (_pivot_sign(pivots) * phase).astype(a.dtype)
    return sign, jnp.sum(jnp.log(size), axis=-1), lu, pivots


@lowering("linalg_inv_ex", matrix_batches=_batched(("A", 2, _EYE)))
def linalg_inv_ex(a, check_errors=False):
    lu, _, info, perm = _lu(a)
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    if check_errors:
        linalg_check_errors(info, CHECK_ERRORS_ON_HOST["linalg_inv_ex.default"], a.ndim == 2)
    return _lu_solve(lu, perm, eye), info


@lowering("_linalg_solve_ex", matrix_batches=_matrix_rhs("A", "B"))
def linalg_solve_ex(a, b, left=True, check_errors=False):
    """A X = B (or X A = B) with PyTorch's rule for vectors: B is a (batch of) vector(s) when it is
    1-D, or when it has A's shape without the last dimension."""
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    lu, pivots, info, perm = _lu(a)
    x = _lu_solve(lu, perm, b[..., None] if vector else b, left)
    if check_errors:
        linalg_check_errors(info, CHECK_ERRORS_ON_HOST["_linalg_solve_ex.default"], a.ndim == 2)
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
    torch._check(b.dim() >= 1, lambda: "torch.linalg.lstsq: other must have at least 1 dimension.")
    torch._check(
        a.dim() >= b.dim() and a.dim() - b.dim() <= 1,
        lambda: (
            "torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() "
            "and (input.dim() - other.dim()) <= 1"
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


@lowering("linalg_lstsq", matrix_batches=_matrix_rhs("self", "b", _lstsq_gels), meta=_lstsq_meta)
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
@lowering(
    "_linalg_eigh",
    matrix_batches=_batched(("A", 2, _EYE)),
    meta_check={
        "_linalg_eigh.eigenvalues": _out_dtype_check(
            torch.ops.aten._linalg_eigh.default, {"eigenvalues": "", "eigenvectors": ""}
        )
    },
)
def linalg_eigh(a, UPLO="L", compute_v=True):
    _lapack_dtype(a, "linalg_eigh")
    lower = UPLO.upper() == "L"  # (PyTorch takes either case; its meta refused anything else)
    vectors, values = lax.linalg.eigh(a, lower=lower, symmetrize_input=False, sort_eigenvalues=True)
    return values, (vectors if compute_v else _empty(a.dtype))


def _general_eig(a, kernel, vectors):
    """XLA's nonsymmetric eigensolver (LAPACK geev, PyTorch's CPU kernel too: unit-norm eigenvectors)
    exists on the CPU platform only; on TPU the op says so instead of failing inside XLA."""
    _lapack_dtype(a, kernel)
    target = lowering_platform()
    if target != "cpu":
        raise NotImplementedError(
            f"torchtpu: aten::{kernel} (torch.linalg.eig/eigvals) has no XLA lowering on the "
            f"{target} platform (XLA's general eigensolver runs on CPU only): compute it on "
            f"the CPU (x.cpu()), or use torch.linalg.eigh for symmetric/Hermitian matrices"
        )
    w, v = jnp.linalg.eig(a)
    return (w, v) if vectors else w


def _eig_finite_check(a, *_, **__):
    """host_check of linalg.eig: the CPU and CUDA read the input on the host (a sync) and refuse NaN and
    infinite entries (LAPACK's geev fails on them)."""
    if not bool(torch.isfinite(a).all()):
        raise RuntimeError("torch.linalg.eig: input tensor should not contain infs or NaNs.")


@lowering(
    "linalg_eig",
    matrix_batches=_ONE_MATRIX,
    host_check=_eig_finite_check,
    meta_check={
        "linalg_eig.out": _out_dtype_check(
            torch.ops.aten.linalg_eig.default,
            {"eigenvalues": "eigenvalues", "eigenvectors": "eigenvectors"},
            "torch.linalg.eig",
        )
    },
)
def linalg_eig(a):
    return _general_eig(a, "linalg_eig", True)


@lowering(
    "_linalg_eigvals",
    matrix_batches=_ONE_MATRIX,
    meta_check={
        "linalg_eigvals.out": _out_dtype_check(
            torch.ops.aten._linalg_eigvals.default, {"out": "eigenvalues"}, "torch.linalg.eigvals"
        )
    },
)
def linalg_eigvals(a):
    return _general_eig(a, "linalg_eigvals", False)


@lowering("linalg_qr", matrix_batches=_batched(("A", 2, _EYE)))
def linalg_qr(a, mode="reduced"):
    _lapack_dtype(a, "geqrf")
    if mode == "r":
        return _empty(a.dtype), _real_diagonal(None, jnp.linalg.qr(a, mode="r"))[1]
    return _real_diagonal(*jnp.linalg.qr(a, mode=mode))


def _real_diagonal(q, r):
    """LAPACK's convention for complex QR, which PyTorch's backward assumes: R's diagonal is real.
    XLA:TPU leaves a phase there; move it into Q's columns (Q D, D^H R keep the product), turning each
    diagonal entry to the nearer of +-|r_ii|. A diagonal that is real already (XLA:CPU calls LAPACK)
    keeps its signs: R and Q are LAPACK's own, those of geqrf/ormqr (made positive, Q's columns had
    flipped signs against the CPU's, and `Q @ C` differed from `ormqr(geqrf(A), C)`)."""
    if not jnp.issubdtype(r.dtype, jnp.complexfloating):
        return q, r
    k = min(r.shape[-2], r.shape[-1])
    diag = jnp.diagonal(r[..., :k, :k], axis1=-2, axis2=-1)
    size = jnp.abs(diag) * jnp.where(jnp.real(diag) < 0, -1, 1)
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
    tpu_svd = _tpu_svd_module() if lowering_platform() == "tpu" else None
    if tpu_svd is None or a.dtype not in (jnp.float32, jnp.complex64) or a.size == 0:
        return jnp.linalg.svd(a, full_matrices=full_matrices, compute_uv=compute_uv)
    with jax.enable_x64(False):
        out = tpu_svd._svd_tpu(a, full_matrices=full_matrices, compute_uv=compute_uv, subset_by_index=None)
    return (out[1], out[0], out[2]) if compute_uv else out[0]


@lowering("_linalg_svd", matrix_batches=_batched(("A", 2, _EYE)))
def linalg_svd(a, full_matrices=False, compute_uv=True, driver=None):
    _lapack_dtype(a, "linalg_svd")
    if not compute_uv:
        return _empty(a.dtype), _svd(a, compute_uv=False), _empty(a.dtype)
    return tuple(_svd(a, full_matrices=full_matrices))


# ---- Householder products (the Q of geqrf's packed reflectors) and the matrix exponential
def _geqrf_meta(a):
    """PyTorch has no meta kernel for geqrf: its checks, and the CPU's outputs (the packed matrix
    column-major, as LAPACK leaves it)."""
    torch._check(a.dim() >= 2, lambda: "torch.geqrf: input must have at least 2 dimensions.")
    if not (a.dtype.is_floating_point or a.dtype.is_complex):
        raise not_implemented_for("geqrf", a.dtype)
    m, n = a.shape[-2:]
    packed = a.new_empty((*a.shape[:-2], n, m)).mT
    return packed, a.new_empty((*a.shape[:-2], min(m, n)))


@lowering("geqrf", matrix_batches=_ONE_MATRIX, meta=_geqrf_meta)
def geqrf(a):
    """LAPACK's packed QR: R above the diagonal, the reflectors below it, and their scales."""
    _lapack_dtype(a, "geqrf")
    from jax._src.lax.linalg import geqrf as jax_geqrf  # jax 0.10 exports its ormqr, not its geqrf

    return tuple(jax_geqrf(a))


@lowering("linalg_householder_product", matrix_batches=_batched(("input", 2, _EYE), ("tau", 1, _ZEROS)))
def linalg_householder_product(reflectors, tau):
    _lapack_dtype(reflectors, "orgqr")
    return lax.linalg.householder_product(reflectors, tau)


def _ormqr_check(reflectors, tau, other, left=True, transpose=False, **out):
    """meta_check: the CPU's shape checks, in its order, before PyTorch's meta kernel's: tau has
    exactly min(m, k) reflectors (the meta takes fewer, which the CPU refuses)."""
    side = -2 if left else -1
    for ok, message in (
        (reflectors.dim() >= 2, "input must have at least 2 dimensions."),
        (other.dim() >= 2, "other must have at least 2 dimensions."),
        (lambda: other.shape[side] == reflectors.shape[-2], f"other.shape[{side}] must be equal to input.shape[-2]"),
        (
            lambda: tau.dim() == 0 or tau.shape[-1] == min(other.shape[side], reflectors.shape[-1]),
            f"tau.shape[-1] must be equal to min(other.shape[{side}], input.shape[-1])",
        ),
        (
            lambda: reflectors.dim() - tau.dim() == 1,
            f"Expected tau to have one dimension less than input, but got tau.ndim equal to {tau.dim()} "
            f"and input.ndim is equal to {reflectors.dim()}",
        ),
        (
            lambda: reflectors.dim() == other.dim(),
            f"Expected other to have the same number of dimensions as input, but got other.ndim equal to "
            f"{other.dim()} and input.ndim is equal to {reflectors.dim()}",
        ),
        (
            lambda: tau.shape[:-1] == reflectors.shape[:-2],
            f"Expected batch dimensions of tau to be equal to input.shape[:-2], but got {list(tau.shape[:-1])}",
        ),
        (
            lambda: other.shape[:-2] == reflectors.shape[:-2],
            f"Expected batch dimensions of other to be equal to input.shape[:-2], but got {list(other.shape[:-2])}",
        ),
    ):
        if not (ok() if callable(ok) else ok):
            raise RuntimeError(f"torch.ormqr: {message}")


@lowering(
    "ormqr",
    matrix_batches=_batched(("self", 2, _EYE), ("input2", 1, _ZEROS), ("input3", 2, _ZEROS)),
    meta_check=dict.fromkeys(("ormqr", "ormqr.out"), _ormqr_check),
)
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


_EXPM_DEGREE = 18  # Taylor terms: at 1-norm <= 1 the truncation (1/19! ~ 8e-18) is below float64's epsilon


def _expm(a):
    """exp(A) by scaling and squaring of a degree-18 Taylor polynomial, as PyTorch's CPU and CUDA kernels
    (a Taylor expansion, not a Pade approximant): each matrix is scaled by 2^-s to a 1-norm of at most 1,
    expanded (Horner), then squared s times. JAX's float32 expm (Pade of degree 7) was 100-400x less
    accurate than the CPU's (a relative error of 1e-4 at norm 6)."""
    norm = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1, initial=0.0)
    squarings = jnp.clip(jnp.ceil(jnp.log2(jnp.nan_to_num(norm, posinf=2.0**64))), 0, 64).astype(jnp.int32)
    x = a / (2.0 ** squarings.astype(jnp.real(a).dtype))[..., None, None]
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    # (Horner's steps as one loop, not 18 unrolled products: the program compiles ~2x faster, the same bits)
    real = jnp.real(a).dtype
    horner = lambda i, p: eye + _exact_mm(x, p) / (_EXPM_DEGREE - i).astype(real)
    poly = lax.fori_loop(0, _EXPM_DEGREE, horner, eye)
    square = lambda i, p: jnp.where((i < squarings)[..., None, None], _exact_mm(p, p), p)
    return lax.fori_loop(0, jnp.max(squarings, initial=0), square, poly)


@lowering("linalg_matrix_exp", matrix_batches=_ONE_MATRIX)  # (each matrix scaled and squared alone)
def linalg_matrix_exp(a):
    # unlike the decompositions, PyTorch's CPU takes half types here: compute in float32, as its opmath
    if a.dtype in _LOW_PRECISION:
        return _expm(a.astype(jnp.float32)).astype(a.dtype)
    return _expm(a)
