"""Issue 24, the op-level items left: lowerings users hit (ctc_loss, LDL), batch norm's saved
statistics in eval mode, bfloat16 accumulation. Values and gradients against the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

D = "tpu"


def _same_error(fn, match=None):
    """fn("cpu") and fn("tpu") raise the same kind of error with the CPU's first line (or `match`)."""
    with pytest.raises(Exception) as on_cpu:
        fn("cpu")
    with pytest.raises(type(on_cpu.value)) as on_tpu:
        fn(D)
    expected = match if match is not None else str(on_cpu.value).splitlines()[0]
    assert expected in str(on_tpu.value), (str(on_cpu.value), str(on_tpu.value))


# ---------------------------------------------------------------- ctc_loss
def _ctc_case(dtype, flat, blank=0, il=(9, 6, 2, 7), tl=(4, 2, 3, 0), classes=6, steps=9):
    n, s = len(il), max(tl) + 1
    lp = torch.randn(steps, n, classes, dtype=dtype).log_softmax(2)
    tg = torch.randint(0, classes, (n, s))
    tg[::2, 0] = blank  # a target equal to blank, as the CPU accepts
    tg[1, 1] = tg[1, 0]  # a repeated label (needs a blank between)
    if flat:
        tg = torch.cat([tg[i, : tl[i]] for i in range(n)])
    return lp, tg, list(il), list(tl)


# Default run: six of the 24 combinations, a pairwise cover (every value of each parameter, and
# every pair of values of two parameters, occurs at least once); `-m slow` runs the other 18.
_CTC_DEFAULT = {
    ("none", False, False, torch.float32),
    ("none", True, True, torch.float64),
    ("mean", True, True, torch.float32),
    ("mean", False, False, torch.float64),
    ("sum", False, True, torch.float32),
    ("sum", True, False, torch.float64),
}


def _ctc_params():
    return [
        pytest.param(
            zero_infinity,
            reduction,
            flat,
            dtype,
            id=f"{zero_infinity}-{reduction}-{'concatenated' if flat else 'padded'}-dtype{i}",
            marks=() if (reduction, flat, zero_infinity, dtype) in _CTC_DEFAULT else pytest.mark.slow,
        )
        for zero_infinity in (False, True)
        for reduction in ("none", "mean", "sum")
        for flat in (False, True)
        for i, dtype in enumerate((torch.float32, torch.float64))
    ]


@pytest.mark.parametrize("zero_infinity,reduction,flat,dtype", _ctc_params())
def test_ctc_loss_and_gradient_match_the_cpu(dtype, flat, reduction, zero_infinity):
    # row 2 has a target longer than its input (infinite loss; NaN gradients unless zero_infinity)
    lp, tg, il, tl = _ctc_case(dtype, flat, blank=3 if flat else 0)
    blank = 3 if flat else 0
    grad_out, results = None, []
    for d in ("cpu", D):
        x = lp.detach().to(d).requires_grad_()
        loss = F.ctc_loss(x, tg.to(d), il, tl, blank=blank, reduction=reduction, zero_infinity=zero_infinity)
        grad_out = torch.randn(loss.shape, dtype=dtype) if grad_out is None else grad_out
        loss.backward(grad_out.to(d))
        results.append((loss.detach().cpu(), x.grad.cpu()))
    (loss_cpu, grad_cpu), (loss_tpu, grad_tpu) = results
    torch.testing.assert_close(loss_tpu, loss_cpu, equal_nan=True)
    torch.testing.assert_close(grad_tpu, grad_cpu, equal_nan=True)


def test_ctc_loss_tensor_lengths_unbatched_and_empty_inputs():
    lp, tg, il, tl = _ctc_case(torch.float32, False)
    for fn in (
        lambda d: F.ctc_loss(lp.to(d), tg.to(d), torch.tensor(il).to(d), torch.tensor(tl).to(d)),
        lambda d: F.ctc_loss(lp[:, 0].to(d), tg[0, : tl[0]].to(d), il[:1], tl[:1], reduction="none"),
        lambda d: F.ctc_loss(lp.to(d), tg.to(d), [0, 0, 5, 5], [0, 2, 0, 1], reduction="none"),
        # every target empty: one state (test_nn's test_CTCLoss_empty_target; the scans' shifts broke)
        lambda d: F.ctc_loss(lp.to(d), tg[:, :0].to(d), il, [0] * len(il), reduction="none"),
    ):
        torch.testing.assert_close(fn(D).cpu(), fn("cpu"))
    x = lp.detach().to(D).requires_grad_()
    F.ctc_loss(x, tg[:, :0].to(D), il, [0] * len(il)).backward()
    reference = lp.detach().requires_grad_()
    F.ctc_loss(reference, tg[:, :0], il, [0] * len(il)).backward()
    torch.testing.assert_close(x.grad.cpu(), reference.grad)


def test_ctc_loss_bad_input_raises_as_on_the_cpu():
    lp, tg, il, tl = _ctc_case(torch.float32, False)
    for fn in (
        lambda d: F.ctc_loss(lp.to(d), tg.to(d), [10] + il[1:], tl),  # input length > T
        lambda d: F.ctc_loss(lp.to(d), tg.to(d), il, [6] + tl[1:]),  # target length > S
        lambda d: F.ctc_loss(lp.to(d), tg.to(d), [-1] + il[1:], tl),
        lambda d: F.ctc_loss(lp.to(d), tg.to(d), il[:3], tl),
        lambda d: F.ctc_loss(lp.to(d), tg.to(d), il, tl, blank=6),
        lambda d: F.ctc_loss(lp.to(d), tg.flatten()[:3].to(d), il, tl),
        lambda d: F.ctc_loss(lp[:0].to(d), tg.to(d), [0] * 4, [0] * 4),
    ):
        _same_error(fn)
    _same_error(lambda d: F.ctc_loss(lp.bfloat16().to(d), tg.to(d), il, tl), match="not implemented for 'BFloat16'")


@pytest.mark.slow
def test_ctc_loss_compiled_with_gradient():
    lp, tg, il, tl = _ctc_case(torch.float32, False)

    def fn(x, t):
        return F.ctc_loss(x.log_softmax(2), t, il, tl)

    x = lp.clone().requires_grad_()
    fn(x, tg).backward()
    xt = lp.to(D).requires_grad_()
    loss = torch.compile(fn, backend="tpu")(xt, tg.to(D))
    loss.backward()
    torch.testing.assert_close(loss.detach().cpu(), fn(lp, tg))
    torch.testing.assert_close(xt.grad.cpu(), x.grad, equal_nan=True)


def test_ctc_loss_target_out_of_range_is_a_device_assert():
    from torchtpu.eager.asserts import DeviceAssertError

    lp, tg, il, tl = _ctc_case(torch.float32, False)
    tg[1, 1] = 6
    with pytest.raises(DeviceAssertError, match="targets must be class indices"):
        F.ctc_loss(lp.to(D), tg.to(D), il, tl).item()


# ---------------------------------------------------------------- LDL (Bunch-Kaufman)
def _symmetric(n, dtype, batch=(), indefinite_start=False):
    a = torch.randn(*batch, n, n, dtype=dtype)
    a = a + a.mT
    if indefinite_start:  # zeros on the first diagonal entries: 2x2 pivots from the start
        a[..., 0, 0] = a[..., 1, 1] = 0
    return a


# Each (size, dtype) compiles its own factor and solve loops (~1 s each cold). Default run: every
# size / batch shape / 2x2-pivot start once and every dtype at least once (a diagonal of the grid);
# `-m slow` runs the other 18 combinations.
_LDL_DTYPES = [torch.float32, torch.float64, torch.complex64, torch.complex128]
_LDL_CASES = [(1, (), False), (2, (), True), (5, (), False), (9, (3,), True), (17, (2, 2), False), (70, (), False)]
_LDL_DEFAULT = {
    (1, torch.float32),
    (2, torch.complex64),
    (5, torch.float64),
    (9, torch.complex128),
    (17, torch.float32),
    (70, torch.float64),
}


def _ldl_params():
    return [
        pytest.param(
            n,
            batch,
            indefinite_start,
            dtype,
            id=f"{n}-batch{j}-{indefinite_start}-dtype{i}",
            marks=() if (n, dtype) in _LDL_DEFAULT else pytest.mark.slow,
        )
        for j, (n, batch, indefinite_start) in enumerate(_LDL_CASES)
        for i, dtype in enumerate(_LDL_DTYPES)
    ]


@pytest.mark.parametrize("n,batch,indefinite_start,dtype", _ldl_params())
def test_ldl_factor_matches_lapack_and_solves(dtype, n, batch, indefinite_start):
    a = _symmetric(n, dtype, batch, indefinite_start)
    ld, piv, info = torch.linalg.ldl_factor_ex(a)
    ld_t, piv_t, info_t = (x.cpu() for x in torch.linalg.ldl_factor_ex(a.to(D)))
    assert piv_t.dtype == torch.int32 and info_t.dtype == torch.int32
    torch.testing.assert_close(piv_t, piv)  # the same 1x1 and 2x2 pivots, same swaps
    torch.testing.assert_close(info_t, info)
    tol = dict(rtol=1e-3, atol=1e-3) if dtype in (torch.float32, torch.complex64) else {}
    torch.testing.assert_close(ld_t, ld, **tol)
    b = torch.randn(*batch, n, 3, dtype=dtype)
    x_t = torch.linalg.ldl_solve(ld.to(D), piv.to(D), b.to(D)).cpu()
    torch.testing.assert_close(x_t, torch.linalg.ldl_solve(ld, piv, b), **tol)
    torch.testing.assert_close(a @ x_t, b, **(tol or dict(rtol=1e-7, atol=1e-7)))


def test_ldl_indefinite_matrices_take_2x2_pivots():
    torch.manual_seed(0)
    seen_two = False
    for _ in range(5):
        a = _symmetric(8, torch.float64)
        ld, piv = torch.linalg.ldl_factor(a)
        ld_t, piv_t = (x.cpu() for x in torch.linalg.ldl_factor(a.to(D)))
        torch.testing.assert_close(piv_t, piv)
        torch.testing.assert_close(ld_t, ld)
        seen_two |= bool((piv < 0).any())
    assert seen_two


def test_ldl_hermitian_flag_singular_and_bad_input():
    a = _symmetric(6, torch.float32)
    for got, want in zip(
        torch.linalg.ldl_factor_ex(a.to(D), hermitian=True), torch.linalg.ldl_factor_ex(a, hermitian=True)
    ):
        torch.testing.assert_close(got.cpu(), want)
    s = _symmetric(4, torch.float64)
    s[:, 2] = s[2, :] = 0  # singular: info names the zero column
    for got, want in zip(torch.linalg.ldl_factor_ex(s.to(D)), torch.linalg.ldl_factor_ex(s)):
        torch.testing.assert_close(got.cpu(), want)
    _same_error(lambda d: torch.linalg.ldl_factor(torch.randn(3, 4, device=d)))
    _same_error(
        lambda d: torch.linalg.ldl_factor(torch.randn(3, 3, device=d).half()), match="not implemented for 'Half'"
    )
    _same_error(
        lambda d: torch.linalg.ldl_solve(
            torch.randn(3, 3, device=d), torch.ones(3, dtype=torch.int32, device=d), torch.randn(4, 2, device=d)
        )
    )


# Default run: each size once, both dtypes (alternating); `-m slow` runs the other three.
_HERM_DEFAULT = {(2, torch.complex64), (9, torch.complex128), (17, torch.complex64)}


def _herm_params():
    return [
        pytest.param(
            n,
            batch,
            indefinite_start,
            dtype,
            id=f"{n}-batch{j}-{indefinite_start}-dtype{i}",
            marks=() if (n, dtype) in _HERM_DEFAULT else pytest.mark.slow,
        )
        for j, (n, batch, indefinite_start) in enumerate([(2, (), True), (9, (3,), True), (17, (), False)])
        for i, dtype in enumerate((torch.complex64, torch.complex128))
    ]


@pytest.mark.parametrize("n,batch,indefinite_start,dtype", _herm_params())
def test_ldl_complex_hermitian_matches_lapack_and_solves(dtype, n, batch, indefinite_start):
    """hermitian=True (LAPACK's ?hetrf/?hetrs): conjugated updates, a real diagonal."""
    a = torch.randn(*batch, n, n, dtype=dtype)
    a = a + a.mH
    if indefinite_start:
        a[..., 0, 0] = a[..., 1, 1] = 0
    ld, piv, info = torch.linalg.ldl_factor_ex(a, hermitian=True)
    ld_t, piv_t, info_t = (x.cpu() for x in torch.linalg.ldl_factor_ex(a.to(D), hermitian=True))
    torch.testing.assert_close(piv_t, piv)
    torch.testing.assert_close(info_t, info)
    tol = dict(rtol=1e-3, atol=1e-3) if dtype == torch.complex64 else {}
    torch.testing.assert_close(ld_t, ld, **tol)
    b = torch.randn(*batch, n, 2, dtype=dtype)
    x_t = torch.linalg.ldl_solve(ld.to(D), piv.to(D), b.to(D), hermitian=True).cpu()
    torch.testing.assert_close(x_t, torch.linalg.ldl_solve(ld, piv, b, hermitian=True), **tol)
    torch.testing.assert_close(a @ x_t, b, **(tol or dict(rtol=1e-7, atol=1e-7)))


# ---------------------------------------------------------------- batch norm
@pytest.mark.parametrize("training", [False, True])
def test_batch_norm_float64_keeps_float64(training):
    """float64 input is normalized in float64 (the statistics were rounded to float32 before)."""
    x = torch.randn(4, 3, 5, dtype=torch.float64) * 100 + 1000
    w, b = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    rm, rv = torch.randn(3, dtype=torch.float64) + 1000, torch.rand(3, dtype=torch.float64) * 1e4 + 1
    rm_t, rv_t = rm.to(D), rv.to(D)
    out = torch.ops.aten.native_batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5)
    out_t = torch.ops.aten.native_batch_norm(x.to(D), w.to(D), b.to(D), rm_t, rv_t, training, 0.1, 1e-5)
    torch.testing.assert_close(out_t[0].cpu(), out[0])
    torch.testing.assert_close(rm_t.cpu(), rm)
    torch.testing.assert_close(rv_t.cpu(), rv)
    if training:
        torch.testing.assert_close(out_t[1].cpu(), out[1])
        torch.testing.assert_close(out_t[2].cpu(), out[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_eval_saved_statistics_follow_cuda(dtype):
    """Eval mode: the CPU returns empty (0,) saved statistics in the input dtype; CUDA (and PyTorch's
    meta kernel, which torch.compile's fake tensors use on every device) return running_mean and
    1/sqrt(running_var + eps), shape (C,), in the accumulation dtype. tpu follows CUDA."""
    x = torch.randn(4, 3, 5, dtype=dtype)
    w, b, rm, rv = (torch.randn(3, dtype=dtype) for _ in range(4))
    rv = rv.abs() + 0.5
    acc = torch.float32
    for fn in (
        lambda *a: torch.ops.aten.native_batch_norm(*a, False, 0.1, 1e-5),
        lambda *a: torch.ops.aten._native_batch_norm_legit_no_training(*a, 0.1, 1e-5),
        lambda *a: torch.ops.aten._batch_norm_no_update(*a, 0.1, 1e-5),
    ):
        cpu = fn(x, w, b, rm, rv)
        tpu = [t.cpu() for t in fn(*(t.to(D) for t in (x, w, b, rm, rv)))]
        torch.testing.assert_close(tpu[0], cpu[0])
        assert cpu[1].shape == (0,) and cpu[1].dtype == dtype
        torch.testing.assert_close(tpu[1], rm.to(acc))
        torch.testing.assert_close(tpu[2], torch.rsqrt(rv.to(acc) + 1e-5))


# ---------------------------------------------------------------- bfloat16 accumulation
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, -2), (0, 1)])
def test_addbmm_half_rounds_once_per_batch_as_pytorch(dtype, beta, alpha):
    """PyTorch's addbmm (CPU and CUDA share addbmm_impl_) adds one addmm per batch into the result,
    each rounded to the half type; summing every product in float32 first differed by several ulps."""
    c = torch.randn(5, 10, dtype=dtype) * 3
    x, y = torch.randn(8, 5, 7, dtype=dtype) * 3, torch.randn(8, 7, 10, dtype=dtype) * 3
    expected = torch.addbmm(c, x, y, beta=beta, alpha=alpha)
    actual = torch.addbmm(c.to(D), x.to(D), y.to(D), beta=beta, alpha=alpha).cpu()
    scale = float(expected.abs().max())
    # the same roundings: at most an ulp apart where the float32 products' summation orders differ
    torch.testing.assert_close(actual, expected, rtol=0, atol=scale * 2**-7)
    torch.testing.assert_close(
        actual.cpu(), expected, **({"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {})
    )
    t = c.to(D)
    t.addbmm_(x.to(D), y.to(D), beta=beta, alpha=alpha)
    torch.testing.assert_close(t.cpu(), actual, rtol=0, atol=0)


# ---------------------------------------------------------------- complex32
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.tensor([1 + 2j, -3.5j, 0.25], dtype=torch.complex64).chalf().to(d),
        lambda d: torch.zeros(2, 3, dtype=torch.chalf, device=d),
        lambda d: torch.full((2, 3), 1 - 1j, dtype=torch.chalf, device=d).t(),
        lambda d: torch.tensor([1.5, -2.0, 3.0], device=d).to(torch.chalf),
    ],
    ids=["from_cpu", "zeros", "full_t", "convert"],
)
def test_complex32_is_a_tpu_dtype(make):
    """complex32 is stored as float16 pairs (ops/dtypes.py): every way of making one gives PyTorch's
    bytes (tests/test_complex32.py covers its ops)."""
    t, c = make(D), make("cpu")
    assert t.dtype == torch.chalf and t.device.type == "tpu" and t.stride() == c.stride()
    assert torch.equal(t.cpu().contiguous().view(torch.int32), c.contiguous().view(torch.int32))
