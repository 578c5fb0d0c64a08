"""Decompositions and solves (Cholesky, LU, triangular, det/slogdet, inverse, solve, eigh, QR, SVD,
Householder products, matrix exponential) on "tpu" against the CPU: values, shapes, dtypes, info
and pivots, batched and unbatched, forward and backward, and the errors bad input raises.

Inputs are fresh random, well-conditioned matrices (A A^H + n I for positive-definite ones,
B + n I for general square ones). eigh, QR and SVD are free up to the sign (phase) of each vector:
they are compared through quantities that do not depend on it, as PyTorch's own tests do.
"""

import warnings

import pytest
import torch
from torch.utils import _pytree as pytree

import torchtpu  # noqa: F401
from torchtpu.eager import asserts

DEV = "tpu"
REAL = [torch.float32, torch.float64]
ALL = REAL + [torch.complex64, torch.complex128]
BATCHES = [(), (2, 3)]


def _case_dtype_batch(cases, real_only=()):
    """The default run gives each case one real and one complex dtype, one batched and one not,
    rotating over the cases so that every dtype and both batch shapes run for every family (the
    lowerings are dtype-generic JAX code; what differs by dtype is precision and complex conjugation,
    which every case still meets once); cases in `real_only` run both real dtypes. Every (case,
    dtype, batch) triple runs with `pytest -m slow`."""
    out = []
    complex_ = [d for d in ALL if d.is_complex]
    for i, case in enumerate(cases):
        if case in real_only:
            default = {(REAL[0], BATCHES[i % 2]), (REAL[1], BATCHES[(i + 1) % 2])}
        else:
            default = {(REAL[i % 2], BATCHES[i % 2]), (complex_[(i // 2) % 2], BATCHES[(i + 1) % 2])}
        for d in ALL:
            for b in BATCHES:
                marks = () if (d, b) in default else pytest.mark.slow
                out.append(pytest.param(case, d, b, id=f"{case}-{d}-{b}", marks=marks))
    return out


def _tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype in (torch.float32, torch.complex64) else dict(rtol=1e-7, atol=1e-9)


def _pd(batch, n, dtype):
    x = torch.randn(*batch, n, n, dtype=dtype)
    return x @ x.mH + n * torch.eye(n, dtype=dtype)


def _square(batch, n, dtype):
    return torch.randn(*batch, n, n, dtype=dtype) + n * torch.eye(n, dtype=dtype)


def _rect(batch, m, n, dtype):
    return torch.randn(*batch, m, n, dtype=dtype)


def _one_triangle(a, uplo):
    garbage = 100 * torch.randn_like(a)
    return a.tril() + garbage.triu(1) if uplo == "L" else a.triu() + garbage.tril(-1)


def _cpu(x):
    return pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, x)


def _tpu(x):
    return pytree.tree_map(lambda t: t.to(DEV) if isinstance(t, torch.Tensor) else t, x)


def _same(fn, inputs, dtype, post=lambda out, *inputs: out):
    """fn on the CPU and on tpu; `post` (run on the CPU) maps each result to what must agree."""
    expected = post(fn(*inputs), *inputs)
    actual = post(_cpu(fn(*_tpu(inputs))), *inputs)
    torch.testing.assert_close(actual, expected, **_tol(dtype))


# ------------------------------------------------------------------ forward, exact outputs
# name -> (function, inputs(batch, dtype)); outputs are unique, so compared as they are
_mat = lambda b, d: (_square(b, 4, d),)
EXACT = {
    "cholesky_ex": (torch.linalg.cholesky_ex, lambda b, d: (_pd(b, 4, d),)),
    "cholesky_ex upper": (lambda a: torch.linalg.cholesky_ex(a, upper=True), lambda b, d: (_pd(b, 4, d),)),
    # only the triangle named is read: the other one holds garbage here
    "cholesky_ex one triangle": (torch.linalg.cholesky_ex, lambda b, d: (_one_triangle(_pd(b, 4, d), "L"),)),
    "cholesky_ex upper one triangle": (
        lambda a: torch.linalg.cholesky_ex(a, upper=True),
        lambda b, d: (_one_triangle(_pd(b, 4, d), "U"),),
    ),
    "eigvalsh one triangle": (
        lambda a: torch.linalg.eigvalsh(a, UPLO="U"),
        lambda b, d: (_one_triangle(_pd(b, 4, d), "U"),),
    ),
    "torch.cholesky": (lambda a: torch.cholesky(a), lambda b, d: (_pd(b, 4, d),)),
    "torch.cholesky upper": (lambda a: torch.cholesky(a, upper=True), lambda b, d: (_pd(b, 4, d),)),
    "solve_triangular upper": (
        lambda a, x: torch.linalg.solve_triangular(a, x, upper=True),
        lambda b, d: (_square(b, 4, d), _rect(b, 4, 3, d)),
    ),
    "solve_triangular lower right unit": (
        lambda a, x: torch.linalg.solve_triangular(a, x, upper=False, left=False, unitriangular=True),
        lambda b, d: (_square(b, 4, d), _rect(b, 3, 4, d)),
    ),
    "solve_triangular broadcast": (
        lambda a, x: torch.linalg.solve_triangular(a, x, upper=False),
        lambda b, d: (_square((), 4, d), _rect(b, 4, 2, d)),
    ),
    "triangular_solve": (lambda x, a: torch.triangular_solve(x, a), lambda b, d: (_rect(b, 4, 3, d), _square(b, 4, d))),
    "triangular_solve lower transpose unit": (
        lambda x, a: torch.triangular_solve(x, a, upper=False, transpose=True, unitriangular=True),
        lambda b, d: (_rect(b, 4, 3, d), _square((), 4, d)),
    ),
    "cholesky_solve": (
        lambda x, a: torch.cholesky_solve(x, torch.linalg.cholesky(a)),
        lambda b, d: (_rect(b, 4, 3, d), _pd(b, 4, d)),
    ),
    "cholesky_solve upper": (
        lambda x, a: torch.cholesky_solve(x, torch.linalg.cholesky(a, upper=True), upper=True),
        lambda b, d: (_rect(b, 4, 3, d), _pd(b, 4, d)),
    ),
    "cholesky_inverse": (lambda a: torch.cholesky_inverse(torch.linalg.cholesky(a)), lambda b, d: (_pd(b, 4, d),)),
    "cholesky_inverse upper": (
        lambda a: torch.cholesky_inverse(torch.linalg.cholesky(a, upper=True), upper=True),
        lambda b, d: (_pd(b, 4, d),),
    ),
    "lu_factor_ex": (torch.linalg.lu_factor_ex, _mat),
    "lu_factor_ex tall": (torch.linalg.lu_factor_ex, lambda b, d: (_rect(b, 5, 3, d),)),
    "lu_factor_ex wide": (torch.linalg.lu_factor_ex, lambda b, d: (_rect(b, 3, 5, d),)),
    "linalg.lu": (torch.linalg.lu, _mat),
    "linalg.lu tall": (torch.linalg.lu, lambda b, d: (_rect(b, 5, 3, d),)),
    "linalg.lu wide": (torch.linalg.lu, lambda b, d: (_rect(b, 3, 5, d),)),
    "lu_unpack": (lambda a: torch.lu_unpack(*torch.linalg.lu_factor(a)), lambda b, d: (_rect(b, 5, 3, d),)),
    "lu_unpack data only": (lambda a: torch.lu_unpack(*torch.linalg.lu_factor(a), unpack_pivots=False), _mat),
    "lu_unpack pivots only": (lambda a: torch.lu_unpack(*torch.linalg.lu_factor(a), unpack_data=False), _mat),
    "torch.lu": (lambda a: torch.lu(a, get_infos=True), _mat),
    "lu_solve": (
        lambda a, x: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), x),
        lambda b, d: (_square(b, 4, d), _rect(b, 4, 3, d)),
    ),
    "lu_solve adjoint": (
        lambda a, x: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), x, adjoint=True),
        lambda b, d: (_square(b, 4, d), _rect(b, 4, 3, d)),
    ),
    "lu_solve right": (
        lambda a, x: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), x, left=False),
        lambda b, d: (_square(b, 4, d), _rect(b, 3, 4, d)),
    ),
    "lu_solve right adjoint": (
        lambda a, x: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), x, left=False, adjoint=True),
        lambda b, d: (_square(b, 4, d), _rect(b, 3, 4, d)),
    ),
    "lu_solve broadcast": (
        lambda a, x: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), x),
        lambda b, d: (_square((), 4, d), _rect(b, 4, 2, d)),
    ),
    "torch.lu_solve": (
        lambda a, x: torch.lu_solve(x, *torch.linalg.lu_factor(a)),
        lambda b, d: (_square(b, 4, d), _rect(b, 4, 3, d)),
    ),
    "_linalg_det": (torch.ops.aten._linalg_det, _mat),
    "_linalg_slogdet": (torch.ops.aten._linalg_slogdet, _mat),
    "det": (torch.linalg.det, _mat),
    "slogdet": (torch.linalg.slogdet, _mat),
    "logdet": (torch.logdet, lambda b, d: (_pd(b, 4, d),)),
    "inv_ex": (torch.linalg.inv_ex, _mat),
    "inv": (torch.linalg.inv, _mat),
    "inverse": (torch.inverse, _mat),
    "_linalg_solve_ex": (torch.ops.aten._linalg_solve_ex, lambda b, d: (_square(b, 4, d), _rect(b, 4, 3, d))),
    "_linalg_solve_ex right": (
        lambda a, x: torch.ops.aten._linalg_solve_ex(a, x, left=False),
        lambda b, d: (_square(b, 4, d), _rect(b, 3, 4, d)),
    ),
    "solve": (torch.linalg.solve, lambda b, d: (_square(b, 4, d), _rect(b, 4, 3, d))),
    # B with A's shape minus the last dimension is a batch of vectors; a 1-D B is one vector
    "solve batch of vectors": (torch.linalg.solve, lambda b, d: (_square(b, 4, d), torch.randn(*b, 4, dtype=d))),
    "solve one vector": (torch.linalg.solve, lambda b, d: (_square(b, 4, d), torch.randn(4, dtype=d))),
    "solve broadcast matrix": (torch.linalg.solve, lambda b, d: (_square((), 4, d), _rect(b, 4, 2, d))),
    "solve_ex": (torch.linalg.solve_ex, lambda b, d: (_square(b, 4, d), _rect(b, 4, 3, d))),
    "tensorsolve": (
        lambda a, x: torch.linalg.tensorsolve(a.reshape(2, 2, 4), x.reshape(2, 2)),
        lambda b, d: (_square((), 4, d), torch.randn(4, dtype=d)),
    ),
    "eigvalsh": (torch.linalg.eigvalsh, lambda b, d: (_pd(b, 4, d),)),
    "eigvalsh upper": (lambda a: torch.linalg.eigvalsh(a, UPLO="U"), lambda b, d: (_pd(b, 4, d),)),
    "svdvals": (torch.linalg.svdvals, lambda b, d: (_rect(b, 5, 3, d),)),
    "matrix_rank": (torch.linalg.matrix_rank, lambda b, d: (_rect(b, 5, 3, d) @ _rect(b, 3, 4, d),)),
    "pinv": (torch.linalg.pinv, lambda b, d: (_rect(b, 5, 3, d),)),
    "cond": (torch.linalg.cond, _mat),
    "matrix_norm 2": (lambda a: torch.linalg.matrix_norm(a, ord=2), lambda b, d: (_rect(b, 5, 3, d),)),
    "householder_product": (torch.linalg.householder_product, lambda b, d: torch.geqrf(_rect(b, 5, 3, d))),
    "ormqr": (
        lambda a, tau, c: torch.ormqr(a, tau, c, transpose=True),
        lambda b, d: (*torch.geqrf(_rect(b, 5, 3, d)), _rect(b, 5, 2, d)),
    ),
    "ormqr right": (
        lambda a, tau, c: torch.ormqr(a, tau, c, left=False),
        lambda b, d: (*torch.geqrf(_rect(b, 5, 3, d)), _rect(b, 2, 5, d)),
    ),
    "matrix_exp": (torch.linalg.matrix_exp, lambda b, d: (_rect(b, 4, 4, d) / 2,)),
}


@pytest.mark.parametrize("case,dtype,batch", _case_dtype_batch(EXACT, real_only={"matrix_rank"}))
def test_matches_cpu(case, dtype, batch):
    fn, make = EXACT[case]
    if case == "matrix_rank" and dtype.is_complex:
        pytest.skip("matrix_rank compares |singular values| against a tolerance: same as svdvals")
    torch.manual_seed(0)
    _same(fn, make(batch, dtype), dtype)


# ------------------------------------------------------------------ forward, gauge-invariant
def _eigh_invariants(out, a):
    w, v = out
    return w, v @ torch.diag_embed(w).to(v.dtype) @ v.mH, v.mH @ v  # eigenvalues, A, orthonormality


def _svd_invariants(out, a):
    u, s, vh = out
    k = s.shape[-1]
    return s, u[..., :, :k] @ torch.diag_embed(s).to(u.dtype) @ vh[..., :k, :], u.mH @ u, vh @ vh.mH


def _qr_invariants(out, a):
    q, r = out
    return q @ r, q.mH @ q, r.abs(), q.abs()  # Householder QR: unique up to a phase per column


INVARIANT = {
    "eigh": (torch.linalg.eigh, lambda b, d: (_pd(b, 4, d),), _eigh_invariants),
    "eigh upper": (lambda a: torch.linalg.eigh(a, UPLO="U"), lambda b, d: (_pd(b, 4, d),), _eigh_invariants),
    # UPLO in lower case: the triangle named is read (a non-Hermitian input tells which)
    "eigh lower case": (
        lambda a: (torch.linalg.eigh(a, UPLO="l")[0], torch.linalg.eigvalsh(a, UPLO="u")),
        lambda b, d: (_rect(b, 3, 3, d),),
        lambda out, a: out,
    ),
    "svd": (lambda a: torch.linalg.svd(a, full_matrices=False), lambda b, d: (_rect(b, 5, 3, d),), _svd_invariants),
    "svd full": (torch.linalg.svd, lambda b, d: (_rect(b, 3, 5, d),), _svd_invariants),
    "torch.svd": (
        lambda a: (lambda u, s, v: (u, s, v.mH))(*torch.svd(a)),
        lambda b, d: (_rect(b, 5, 3, d),),
        _svd_invariants,
    ),
    "qr": (torch.linalg.qr, lambda b, d: (_rect(b, 5, 3, d),), _qr_invariants),
    "qr wide": (torch.linalg.qr, lambda b, d: (_rect(b, 3, 5, d),), _qr_invariants),
    "qr complete": (
        lambda a: torch.linalg.qr(a, mode="complete"),
        lambda b, d: (_rect(b, 5, 3, d),),
        lambda out, a: (out[0] @ out[1], out[0].mH @ out[0], out[1].abs()),
    ),
    "qr r": (
        lambda a: torch.linalg.qr(a, mode="r"),
        lambda b, d: (_rect(b, 5, 3, d),),
        lambda out, a: (out[0].shape, out[1].abs()),
    ),
    # geqrf's packed reflectors give back A (Q R) and |R|; its layout is the CPU's (column-major)
    "geqrf": (torch.geqrf, lambda b, d: (_rect(b, 5, 3, d),), lambda out, a: _geqrf_invariants(out)),
    "geqrf wide": (torch.geqrf, lambda b, d: (_rect(b, 3, 5, d),), lambda out, a: _geqrf_invariants(out)),
}


def _geqrf_invariants(out):
    packed, tau = out
    k = tau.shape[-1]
    r = packed[..., :k, :].triu()
    q = torch.linalg.householder_product(packed[..., :, :k], tau)
    return q @ r, r.abs(), packed.stride()


@pytest.mark.parametrize("case,dtype,batch", _case_dtype_batch(INVARIANT))
def test_gauge_invariants_match_cpu(case, dtype, batch):
    fn, make, post = INVARIANT[case]
    torch.manual_seed(0)
    _same(lambda *a: tuple(fn(*a)), make(batch, dtype), dtype, post)


def test_output_dtypes_and_shapes():
    a = _square((2,), 3, torch.complex64).to(DEV)
    lu, pivots, info = torch.linalg.lu_factor_ex(a)
    assert (lu.dtype, pivots.dtype, info.dtype) == (torch.complex64, torch.int32, torch.int32)
    assert (pivots.shape, info.shape) == ((2, 3), (2,))
    sign, logabsdet = torch.linalg.slogdet(a)
    assert (sign.dtype, logabsdet.dtype) == (torch.complex64, torch.float32)
    w, v = torch.linalg.eigh(_pd((), 3, torch.complex128).to(DEV))
    assert (w.dtype, v.dtype) == (torch.float64, torch.complex128)
    assert torch.linalg.cholesky_ex(_pd((4,), 3, torch.float32).to(DEV)).info.dtype == torch.int32


@pytest.mark.parametrize("shape", [(0, 0), (2, 0, 0), (0, 3, 3)], ids=str)
@pytest.mark.parametrize(
    "fn",
    [
        torch.linalg.cholesky_ex,
        torch.linalg.inv_ex,
        torch.linalg.det,
        torch.linalg.slogdet,
        torch.linalg.lu_factor_ex,
        torch.linalg.eigvalsh,
        torch.linalg.svdvals,
        torch.linalg.qr,
    ],
    ids=lambda f: f.__name__,
)
def test_empty_matrices(fn, shape):
    a = torch.zeros(shape)
    torch.testing.assert_close(_cpu(fn(a.to(DEV))), fn(a))


# ------------------------------------------------------------------ gradients
def _sym(a):
    return (a + a.mH) / 2  # the gradient then flows to both triangles, as PyTorch's tests do


GRADS = {
    "cholesky": (lambda a: torch.linalg.cholesky(_sym(a)), lambda b, d: (_pd(b, 4, d),)),
    "cholesky upper": (lambda a: torch.linalg.cholesky(_sym(a), upper=True), lambda b, d: (_pd(b, 4, d),)),
    "cholesky_ex": (lambda a: torch.linalg.cholesky_ex(_sym(a)).L, lambda b, d: (_pd(b, 4, d),)),
    "solve": (torch.linalg.solve, lambda b, d: (_square(b, 4, d), _rect(b, 4, 2, d))),
    "solve vector": (torch.linalg.solve, lambda b, d: (_square(b, 4, d), torch.randn(*b, 4, dtype=d))),
    "solve right": (
        lambda a, x: torch.linalg.solve(a, x, left=False),
        lambda b, d: (_square(b, 4, d), _rect(b, 2, 4, d)),
    ),
    "inv": (torch.linalg.inv, lambda b, d: (_square(b, 4, d),)),
    "det": (torch.linalg.det, lambda b, d: (_square(b, 4, d),)),
    "slogdet": (lambda a: torch.linalg.slogdet(a).logabsdet, lambda b, d: (_square(b, 4, d),)),
    "logdet": (torch.logdet, lambda b, d: (_pd(b, 4, d),)),
    "solve_triangular": (
        lambda a, x: torch.linalg.solve_triangular(a.triu(), x, upper=True),
        lambda b, d: (_square(b, 4, d), _rect(b, 4, 2, d)),
    ),
    "triangular_solve": (
        lambda x, a: torch.triangular_solve(x, a.tril(), upper=False, transpose=True).solution,
        lambda b, d: (_rect(b, 4, 2, d), _square(b, 4, d)),
    ),
    "cholesky_solve": (
        lambda x, a: torch.cholesky_solve(x, torch.linalg.cholesky(_sym(a))),
        lambda b, d: (_rect(b, 4, 2, d), _pd(b, 4, d)),
    ),
    "cholesky_inverse": (
        lambda a: torch.cholesky_inverse(torch.linalg.cholesky(_sym(a))),
        lambda b, d: (_pd(b, 4, d),),
    ),
    "lu_factor": (lambda a: torch.linalg.lu_factor(a).LU, lambda b, d: (_square(b, 4, d),)),
    "lu": (lambda a: torch.linalg.lu(a)[1:], lambda b, d: (_rect(b, 5, 3, d),)),
    "lu_solve": (
        lambda a, x: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), x),
        lambda b, d: (_square(b, 4, d), _rect(b, 4, 2, d)),
    ),
    "eigh": (
        lambda a: (lambda w, v: (w, v @ torch.diag_embed(w).to(v.dtype) @ v.mH))(*torch.linalg.eigh(_sym(a))),
        lambda b, d: (_pd(b, 4, d),),
    ),
    "svd": (
        lambda a: (lambda u, s, vh: (s, u @ vh))(*torch.linalg.svd(a, full_matrices=False)),
        lambda b, d: (_rect(b, 5, 3, d),),
    ),
    "qr": (
        lambda a: (lambda q, r: (q @ r, q * r.diagonal(dim1=-2, dim2=-1).sgn().unsqueeze(-2)))(*torch.linalg.qr(a)),
        lambda b, d: (_rect(b, 5, 3, d),),
    ),
    "pinv": (torch.linalg.pinv, lambda b, d: (_rect(b, 5, 3, d),)),
    "matrix_exp": (torch.linalg.matrix_exp, lambda b, d: (_rect(b, 4, 4, d) / 2,)),
    "MultivariateNormal.log_prob": (
        lambda m, a: torch.distributions.MultivariateNormal(m, covariance_matrix=_sym(a)).log_prob(m * 0.5),
        lambda b, d: (torch.randn(*b, 4, dtype=d), _pd(b, 4, d)),
    ),
}


def _grads(fn, inputs, device, cotangents=None):
    xs = [x.detach().to(device).requires_grad_(True) for x in inputs]
    out = fn(*xs)
    outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if o.requires_grad]
    if cotangents is None:
        cotangents = [torch.randn_like(o.detach().cpu()) for o in outs]
    got = torch.autograd.grad(outs, xs, [c.to(device) for c in cotangents])
    return cotangents, [g.cpu() for g in got]


@pytest.mark.parametrize("case,dtype,batch", _case_dtype_batch(GRADS, real_only={"MultivariateNormal.log_prob"}))
def test_backward_matches_cpu(case, dtype, batch):
    if case == "MultivariateNormal.log_prob" and dtype.is_complex:
        pytest.skip("a real distribution")
    fn, make = GRADS[case]
    torch.manual_seed(0)
    inputs = make(batch, dtype)
    cotangents, expected = _grads(fn, inputs, "cpu")
    _, actual = _grads(fn, inputs, DEV, cotangents)
    tol = dict(rtol=1e-3, atol=1e-4) if dtype in (torch.float32, torch.complex64) else dict(rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(actual, expected, **tol)


@pytest.mark.xfail(
    strict=True,
    reason="det/slogdet keep the LU of A^T for a contiguous real A and of A "
    "otherwise, and their backward picks the solve from A's strides; a lowering sees values, "
    "not strides, and always assumes a contiguous A",
)
def test_det_backward_of_non_contiguous_matrix():
    a = _square((), 4, torch.float64)
    _, expected = _grads(lambda x: torch.linalg.det(x.mT), (a,), "cpu", [torch.tensor(1.0, dtype=torch.float64)])
    _, actual = _grads(lambda x: torch.linalg.det(x.mT), (a,), DEV, [torch.tensor(1.0, dtype=torch.float64)])
    torch.testing.assert_close(actual, expected)


def test_solve_backward_of_non_contiguous_matrix():
    a, b = _square((), 4, torch.float64), _rect((), 4, 2, torch.float64)
    cot, expected = _grads(lambda x, y: torch.linalg.solve(x.mT, y), (a, b), "cpu")
    _, actual = _grads(lambda x, y: torch.linalg.solve(x.mT, y), (a, b), DEV, cot)
    torch.testing.assert_close(actual, expected)


# ------------------------------------------------------------------ failures: info and errors
def _not_positive_definite():
    # leading minors that fail at orders 2, 2, none, 3 (the CPU's info)
    return torch.tensor(
        [
            [[1.0, 0, 0], [0, -1, 0], [0, 0, 1]],
            [[1.0, 2, 0], [2, 1, 0], [0, 0, 1]],
            [[4.0, 0, 0], [0, 4, 0], [0, 0, 4]],
            [[1.0, 0, 0], [0, 1, 0], [0, 0, -1]],
        ]
    )


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_ex_reports_info_without_error(upper):
    a = _not_positive_definite()
    expected = torch.linalg.cholesky_ex(a, upper=upper).info
    out = torch.linalg.cholesky_ex(a.to(DEV), upper=upper)
    torch.testing.assert_close(out.info.cpu(), expected)
    assert expected.tolist() == [2, 2, 0, 3]
    torch.testing.assert_close(out.L[2].cpu(), torch.linalg.cholesky(a[2], upper=upper))


@pytest.mark.parametrize("call", ["linalg.cholesky", "cholesky_ex check_errors", "torch.cholesky"])
def test_cholesky_of_non_positive_definite_raises(call):
    fn = {
        "linalg.cholesky": torch.linalg.cholesky,
        "cholesky_ex check_errors": lambda a: torch.linalg.cholesky_ex(a, check_errors=True).L,
        "torch.cholesky": torch.cholesky,
    }[call]
    with pytest.raises(RuntimeError) as cpu:
        fn(_not_positive_definite())
    # (ATen's _linalg_check_errors: read on the host, as CUDA does; the deprecated torch.cholesky too)
    with pytest.raises(torch.linalg.LinAlgError) as tpu:  # at the op, in the CPU's words
        fn(_not_positive_definite().to(DEV))
    assert str(tpu.value) == str(cpu.value)


def test_singular_matrices():
    s = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    inverse, info = torch.linalg.inv_ex(s.to(DEV))
    assert info.item() == torch.linalg.inv_ex(s).info.item() == 2
    _, _, info = torch.linalg.lu_factor_ex(torch.zeros(2, 3, 3, device=DEV))
    assert info.tolist() == [1, 1]
    sign, logabsdet = torch.linalg.slogdet(s.to(DEV))
    assert sign.item() == 0 and logabsdet.item() == float("-inf")
    assert torch.linalg.det(s.to(DEV)).item() == 0
    for fn in (
        torch.linalg.inv,
        lambda a: torch.linalg.solve(a, torch.ones(2, device=a.device)),
        lambda a: torch.linalg.lu_factor(a).LU,
    ):
        with pytest.raises(RuntimeError) as cpu:
            fn(s)
        with pytest.raises(type(cpu.value), match="singular|is zero"):  # at the op, as on CUDA (a sync)
            fn(s.to(DEV))


@pytest.mark.parametrize(
    "call",
    [
        lambda a: torch.linalg.inv_ex(a, check_errors=True),
        lambda a: torch.linalg.solve_ex(a, torch.ones(2, 3, device=a.device), check_errors=True),
        lambda a: torch.linalg.inv_ex(a[0], check_errors=True),
        lambda a: torch.linalg.lu_factor_ex(a, check_errors=True),
        lambda a: torch.linalg.lu_factor_ex(a[0], check_errors=True),
        lambda a: torch.linalg.ldl_factor_ex(a, check_errors=True),
    ],
    ids=["inv_ex", "solve_ex", "inv_ex matrix", "lu_factor_ex", "lu_factor_ex matrix", "ldl_factor_ex"],
)
def test_ex_ops_check_errors_at_the_op(call):
    # test_inv_ex_singular, test_cholesky_ex_non_pd: `check_errors=True` raises at the op in the CPU's
    # type and words (CUDA reads `info` on the host too), not a device-side assert at the next sync
    # (lu_factor_ex: a RuntimeError naming U's zero pivot; ldl_factor_ex: the CPU's "Unknown error code",
    # without its internal-assert preamble)
    singular = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 1.0]]).expand(2, 3, 3)
    with pytest.raises(RuntimeError) as cpu:
        call(singular)
    with pytest.raises(type(cpu.value)) as tpu:
        call(singular.to(DEV))
    assert type(tpu.value) is type(cpu.value)
    assert str(cpu.value).endswith(str(tpu.value))
    good = torch.eye(3).expand(2, 3, 3) * 2
    torch.testing.assert_close(call(good.to(DEV))[0].cpu(), call(good)[0])


def test_a_linalg_failure_checked_on_the_device_is_not_sticky():
    # the lowering of lu_factor_ex(check_errors=True) checks on the device (eager calls check `info` on
    # the host instead; a compiled graph keeps it): raised at the next sync, once; a singular input is
    # the user's data, so the device keeps working
    from torchtpu.eager.kernels import kernel_for

    lowered = kernel_for(torch.ops.aten.linalg_lu_factor_ex.default)
    out = lowered(torch.zeros(2, 3, 3, device=DEV), check_errors=True)
    with pytest.raises(asserts.DeviceAssertError, match="lu_factor_ex"):
        out[0].cpu()
    assert (torch.ones(3, device=DEV) * 2).tolist() == [2.0, 2.0, 2.0]


def test_bad_input_raises_as_on_cpu():
    cases = {
        "non-square": lambda d: torch.linalg.cholesky(torch.randn(3, 2, device=d)),
        "integer": lambda d: torch.linalg.det(torch.ones(3, 3, dtype=torch.long, device=d)),
        "half": lambda d: torch.linalg.cholesky(torch.eye(3, dtype=torch.half, device=d)),
        "half qr": lambda d: torch.linalg.qr(torch.eye(3, dtype=torch.bfloat16, device=d)),
        "half geqrf": lambda d: torch.geqrf(torch.eye(3, dtype=torch.half, device=d)),
        "integer geqrf": lambda d: torch.geqrf(torch.ones(3, 3, dtype=torch.long, device=d)),
        "vector geqrf": lambda d: torch.geqrf(torch.ones(3, device=d)),
        "vector cholesky": lambda d: torch.linalg.cholesky(torch.ones(3, device=d)),
        "vector eig": lambda d: torch.linalg.eig(torch.ones(3, device=d)),
        "mixed dtypes": lambda d: torch.linalg.solve(
            torch.eye(3, device=d), torch.ones(3, dtype=torch.float64, device=d)
        ),
        "vector right side": lambda d: torch.linalg.solve(torch.eye(3, device=d), torch.ones(3, device=d), left=False),
        "shapes": lambda d: torch.linalg.solve(torch.eye(3, device=d), torch.ones(2, 4, device=d)),
        "lu without pivoting": lambda d: torch.linalg.lu_factor(torch.eye(3, device=d), pivot=False),
        "linalg.lu without pivoting": lambda d: torch.linalg.lu(torch.eye(3, device=d), pivot=False),
    }
    for name, fn in cases.items():
        with pytest.raises((RuntimeError, NotImplementedError)) as cpu:
            fn("cpu")
        with pytest.raises(type(cpu.value)) as tpu:
            fn(DEV)
        worded_alike = ("non-square", "integer", "mixed dtypes", "shapes", "lu without pivoting", "geqrf", "vector")
        if any(w in name for w in worded_alike):
            assert _aten_dtype_names(str(tpu.value)) == str(cpu.value).replace("_cpu", "_tpu"), name


def _outs(d, *dtypes):
    return tuple(torch.empty(0, dtype=t, device=d) for t in dtypes)


@pytest.mark.parametrize(
    "call",
    [
        lambda a, d: torch.linalg.eigvalsh(a, out=_outs(d, torch.int)[0]),
        lambda a, d: torch.linalg.eigh(a, out=_outs(d, torch.float, torch.int64)),
        lambda a, d: torch.linalg.eig(a, out=_outs(d, torch.float, torch.cfloat)),
        lambda a, d: torch.linalg.eig(a, out=_outs(d, torch.cfloat, torch.int)),
        lambda a, d: torch.linalg.eigvals(a, out=_outs(d, torch.double)[0]),
        lambda a, d: torch.cholesky_inverse(a, out=_outs(d, torch.int)[0]),
        lambda a, d: torch.triangular_solve(a, a, out=_outs(d, torch.float, torch.cdouble)),
        lambda a, d: torch.linalg.cond(a, "fro", out=_outs(d, torch.int)[0]),
        lambda a, d: torch.linalg.lstsq(a, torch.tensor(1.0, device=d)),
        lambda a, d: torch.mm(a, a[:2]),
        lambda a, d: torch.addmm(a[:0, :0], a[:0, :1], a[:0, :0]),
        lambda a, d: torch.linalg.eig(a.masked_fill(a > 0.5, float("nan"))),
        lambda a, d: torch.linalg.eig(a.masked_fill(a < -0.5, float("-inf"))),
        lambda a, d: torch.ormqr(a, a[0, :2], a),
        lambda a, d: torch.ormqr(a, a[0, :2], a[:2], False),
        lambda a, d: torch.ormqr(a.expand(2, 3, 3), a[:1], a.expand(2, 3, 3)),
    ],
    ids=[
        "eigvalsh out",
        "eigh out",
        "eig out",
        "eig vectors out",
        "eigvals out",
        "cholesky_inverse out",
        "triangular_solve out",
        "cond out",
        "lstsq 0-dim other",
        "mm shapes",
        "addmm empty shapes",
        "eig nan",
        "eig inf",
        "ormqr fewer reflectors",  # (the meta takes them; the CPU refuses)
        "ormqr right fewer reflectors",
        "ormqr tau batch",
    ],
)
def test_errors_in_the_cpu_words(call):
    # test_linalg's *_errors_and_warnings, test_eig_with_nan, test_addmm_sizes, test_linalg_lstsq_input_checks:
    # the CPU's type and words, where PyTorch's meta kernels word them otherwise (out= dtypes, shapes)
    # or where only the host can tell (eig of NaN or infinite entries: a sync, as on the CPU and CUDA)
    a = torch.randn(3, 3)
    with pytest.raises(RuntimeError) as cpu:
        call(a, "cpu")
    with pytest.raises(RuntimeError) as tpu:
        call(a.to(DEV), DEV)
    assert (type(tpu.value), str(tpu.value)) == (type(cpu.value), str(cpu.value))


def test_complex_norm_is_real_without_a_cast_warning():
    # test_cond_errors_and_warnings (complex): the norm of a complex matrix computed a complex value and
    # cast it to the real result, which JAX warns about when it compiles (one warning too many)
    a = torch.randn(2, 3, 3, dtype=torch.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in (
            lambda x: torch.linalg.vector_norm(x, 3.0, dim=(-2, -1)),
            lambda x: torch.linalg.norm(x, "fro", dim=(-2, -1)),
            lambda x: torch.dist(x, x.flip(0), 2.5),
            lambda x: torch.linalg.cond(x, "fro"),
        ):
            torch.testing.assert_close(fn(a.to(DEV)).cpu(), fn(a))


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.complex64, marks=pytest.mark.slow)])
def test_matrix_exp_as_accurate_as_the_cpu(dtype):
    # test_linalg_matrix_exp_compare_with_taylor: JAX's float32 expm (Pade, degree 7) was 100-400x less
    # accurate than the CPU's Taylor expansion at 1-norms near 6 (a relative error of 1e-4)
    n = torch.tensor([0.5, 2.0, 6.0, 20.0])[:, None, None]
    a = torch.randn(4, 4, 4, dtype=dtype)
    a = a / torch.linalg.matrix_norm(a, 1)[:, None, None] * n
    exact = torch.linalg.matrix_exp(a.to(torch.complex128 if dtype.is_complex else torch.float64))
    scale = exact.abs().amax(dim=(-2, -1), keepdim=True)
    tpu_error = ((torch.linalg.matrix_exp(a.to(DEV)).cpu() - exact) / scale).abs().amax()
    cpu_error = ((torch.linalg.matrix_exp(a) - exact) / scale).abs().amax()
    assert tpu_error < max(4 * cpu_error, 2e-6), (tpu_error, cpu_error)
    torch.testing.assert_close(torch.linalg.matrix_exp(a[:, :0, :0].to(DEV)).cpu(), a[:, :0, :0])


def test_matrix_exp_is_one_small_program():
    # test_linalg_matrix_exp_compare_with_taylor ran over 120 s: one program per shape, each with the
    # Taylor polynomial's 18 products unrolled (~0.7 s of XLA:CPU compile, again inside each fused
    # segment holding it); Horner's steps are one loop now (~0.3 s)
    import jax
    import jax.numpy as jnp

    from torchtpu.ops.linalg_decompositions import _expm

    text = jax.jit(_expm).lower(jnp.zeros((3, 4, 4), jnp.float32)).as_text()
    assert text.count("stablehlo.dot_general") <= 2, text.count("stablehlo.dot_general")


@pytest.mark.parametrize("dtype", [torch.complex64, pytest.param(torch.complex128, marks=pytest.mark.slow)])
def test_complex_qr_is_lapacks_as_geqrf(dtype):
    # test_ormqr (complex): R's diagonal was made positive, so Q's columns had other signs than the
    # CPU's (LAPACK's real diagonal keeps its sign) and `Q @ C` differed from ormqr(geqrf(A), C)
    a, c = torch.randn(2, 5, 3, dtype=dtype), torch.randn(2, 5, 4, dtype=dtype)
    q, r = torch.linalg.qr(a.to(DEV), mode="complete")
    expected_q, expected_r = torch.linalg.qr(a, mode="complete")
    torch.testing.assert_close(q.cpu(), expected_q)
    torch.testing.assert_close(r.cpu(), expected_r)
    torch.testing.assert_close(torch.linalg.qr(a.to(DEV), mode="r").R.cpu(), torch.linalg.qr(a, mode="r").R)
    reflectors, tau = torch.geqrf(a.to(DEV))
    torch.testing.assert_close(torch.ormqr(reflectors, tau, c.to(DEV)).cpu(), expected_q @ c)


def test_resized_out_warns_once_per_output():
    # test_eigh_errors_and_warnings, test_eig_errors_and_warnings: PyTorch's Python meta kernels word the
    # resize warning unformatted ("... shape {str(shape)}"), so Python's default filter showed one of two
    a = torch.randn(3, 3)
    a = a + a.mT
    counts = []
    for d in ("cpu", DEV):
        with warnings.catch_warnings(record=True) as w:
            torch.linalg.eigh(a.to(d), out=(torch.empty(7, 7, device=d), torch.empty(7, 7, device=d)))
            torch.linalg.eig(
                a.to(d),
                out=(torch.ones(1, dtype=torch.cdouble, device=d), torch.ones(1, dtype=torch.cdouble, device=d)),
            )
        counts.append(sorted(str(x.message)[:140] for x in w))
    assert counts[0] == counts[1] and len(counts[0]) == 4


def _aten_dtype_names(message):
    # PyTorch's meta kernels (which check shapes and dtypes on tpu) name dtypes as Python does
    for python, aten in (("torch.float32", "Float"), ("torch.float64", "Double"), ("torch.int64", "Long")):
        message = message.replace(python, aten)
    return message


# ------------------------------------------------------------------ what users call
def test_multivariate_normal_sample_and_log_prob():
    torch.manual_seed(0)
    mean, cov = torch.randn(4), _pd((), 4, torch.float32)
    dist = torch.distributions.MultivariateNormal(mean.to(DEV), covariance_matrix=cov.to(DEV))
    sample = dist.sample((1000,))
    assert sample.device.type == DEV and sample.shape == (1000, 4)
    assert torch.isfinite(sample.cpu()).all()
    # the empirical covariance is near cov (1000 draws: a loose bound)
    torch.testing.assert_close(torch.cov(sample.cpu().T), cov, rtol=0.3, atol=0.3 * cov.diagonal().max().item())
    x = torch.randn(5, 4)
    expected = torch.distributions.MultivariateNormal(mean, covariance_matrix=cov).log_prob(x)
    torch.testing.assert_close(dist.log_prob(x.to(DEV)).cpu(), expected)


def test_positive_definite_constraint():
    # what Hugging Face's resize_token_embeddings checks before drawing new embeddings
    from torch.distributions import constraints

    a = torch.stack([_pd((), 3, torch.float32), -torch.eye(3)])
    assert constraints.positive_definite.check(a.to(DEV)).cpu().tolist() == [True, False]


def test_compiled_solve_and_cholesky():
    def f(a, b):
        return torch.linalg.solve(a, b) + torch.linalg.cholesky(a @ a.mT + 4 * torch.eye(4, device=a.device)).sum()

    torch.manual_seed(0)
    a, b = _square((2,), 4, torch.float32), torch.randn(2, 4, 3)
    compiled = torch.compile(f, backend="tpu")
    torch.testing.assert_close(compiled(a.to(DEV), b.to(DEV)).cpu(), f(a, b), rtol=1e-4, atol=1e-4)


# ---- least squares: "gels" (the default on tpu, as on CUDA) and "gelsy", against the CPU's same driver
@pytest.mark.parametrize("driver", [None, "gels", "gelsy"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "shapes",
    [
        ((5, 3), (5, 2)),
        ((3, 5), (3, 2)),
        ((4, 4), (4, 1)),
        ((5, 3), (5,)),
        ((2, 1, 6, 3), (2, 4, 6, 2)),
        ((2, 3, 5, 3), (2, 3, 5)),
    ],
)
def test_lstsq_matches_cpu(driver, dtype, shapes):
    gen = torch.Generator().manual_seed(3)
    a, b = (torch.randn(*s, dtype=dtype, generator=gen) for s in shapes)
    expected = torch.linalg.lstsq(a, b, driver=driver or "gels")
    got = torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver=driver)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else {}
    for g, e in zip(got, expected):  # solution, residuals, rank, singular values: shapes and dtypes too
        torch.testing.assert_close(g.cpu(), e, **tol)


def test_lstsq_rank_deficient_gelsy_backward_and_errors():
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(6, 2, generator=gen) @ torch.randn(2, 4, generator=gen)  # rank 2
    b = torch.randn(6, 3, generator=gen)
    expected = torch.linalg.lstsq(a, b, driver="gelsy")
    got = torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver="gelsy")
    assert got.rank.item() == expected.rank.item() == 2
    torch.testing.assert_close(got.solution.cpu(), expected.solution, rtol=1e-4, atol=1e-4)

    a = torch.randn(5, 3, generator=gen, requires_grad=True)
    b = torch.randn(5, 2, generator=gen)
    torch.linalg.lstsq(a, b, driver="gels").solution.square().sum().backward()
    at = a.detach().to("tpu").requires_grad_()
    torch.linalg.lstsq(at, b.to("tpu")).solution.square().sum().backward()
    torch.testing.assert_close(at.grad.cpu(), a.grad, rtol=1e-4, atol=1e-4)

    x = torch.randn(5, 3, device="tpu")
    with pytest.raises(NotImplementedError, match="gelsd"):
        torch.linalg.lstsq(x, torch.randn(5, 2, device="tpu"), driver="gelsd")
    with pytest.raises(RuntimeError, match="should match"):
        torch.linalg.lstsq(x, torch.randn(4, 2, device="tpu"))
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.linalg.lstsq(x, torch.randn(5, 2, device="tpu", dtype=torch.float64))
    with pytest.raises(RuntimeError, match="driver"):
        torch.linalg.lstsq(x, torch.randn(5, 2, device="tpu"), driver="foo")


def test_compiled_lstsq_breaks_the_graph_and_runs_eagerly():
    # PyTorch tags linalg_lstsq "dynamic_output_shape" (the CPU's gelsd residuals), so Dynamo will not
    # trace it: without fullgraph it is a graph break and the op runs eagerly on tpu
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(6, 3, generator=gen), torch.randn(6, 2, generator=gen)
    f = torch.compile(lambda a, b: torch.linalg.lstsq(a, b).solution * 2, backend="tpu")
    torch.testing.assert_close(
        f(a.to("tpu"), b.to("tpu")).cpu(), torch.linalg.lstsq(a, b, driver="gels").solution * 2, rtol=1e-4, atol=1e-4
    )


def test_compute_linear_combination_as_on_the_cpu():
    # test_linalg_matrix_exp_utils: ATen's matrix_exp helper was not lowered; its out= adds into out
    c, x = torch.rand(5, 3), torch.rand(3, 2, 2, dtype=torch.complex64)
    torch.testing.assert_close(
        torch._compute_linear_combination(x.to(DEV), c.to(DEV)).cpu(), torch._compute_linear_combination(x, c)
    )
    out = torch.ones(5, 2, 2, dtype=torch.complex64)
    out_tpu = out.to(DEV)
    torch._compute_linear_combination(x, c, out=out)
    torch._compute_linear_combination(x.to(DEV), c.to(DEV), out=out_tpu)
    torch.testing.assert_close(out_tpu.cpu(), out)
    with pytest.raises(RuntimeError, match="Empty tensor not supported"):
        torch._compute_linear_combination(torch.rand((), device=DEV), c.to(DEV))


def test_triangular_solve_flags_share_one_program_and_match_the_cpu(xla_compiles):
    # upper and unitriangular (and triangular_solve's transpose) travel as values: one program for
    # every combination on a shape (test_linalg_solve_triangular compiled 4 per shape and layout),
    # a lower solve of the flipped matrix for upper; results as the CPU's for each combination.
    # (A flag at its default reaches the kernel absent, a static False: another program.)
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(5, 5, generator=gen, dtype=torch.complex64) + 4 * torch.eye(5)
    b = torch.randn(5, 3, generator=gen, dtype=torch.complex64)
    a_d, b_d = a.to(DEV), b.to(DEV)
    counts = []
    for upper in (True, False):
        start = xla_compiles()
        got = torch.linalg.solve_triangular(a_d, b_d, upper=upper, unitriangular=True)
        counts.append(xla_compiles() - start)
        torch.testing.assert_close(got.cpu(), torch.linalg.solve_triangular(a, b, upper=upper, unitriangular=True))
    assert counts[1] == 0  # upper=False runs upper=True's program
    x, m = torch.triangular_solve(b_d, a_d, upper=False, transpose=True, unitriangular=True)
    want = torch.triangular_solve(b, a, upper=False, transpose=True, unitriangular=True)
    torch.testing.assert_close(x.cpu(), want.solution)
    torch.testing.assert_close(m.cpu(), want.cloned_coefficient)
