"""Batched linalg ops share one program per flat batch bucket (eager/matrix_batches.py), and a flag left
at its default keys the same program as the flag passed (eager/engine.py OpKernel._canonical_call).
Results against the CPU on fresh random inputs."""

import pytest
import torch

from torchtpu.device import platform
from torchtpu.eager import tpu_check
from torchtpu.eager.kernels import kernel_for
from torchtpu.metrics import counters

aten = torch.ops.aten


def _close(tpu, cpu, **kw):
    tpu = torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, tpu)
    torch.testing.assert_close(tpu, cpu, **kw)


def _well_conditioned(*shape):
    n = shape[-1]
    return torch.randn(*shape) + n * torch.eye(n)


def test_a_flag_at_its_default_and_passed_key_one_program():
    a = torch.randn(5, 5).triu() + 5 * torch.eye(5)
    b = torch.randn(5, 3)
    ta, tb = a.to("tpu"), b.to("tpu")
    calls = [{}, {"unitriangular": False}, {"unitriangular": True}, {"left": True}]
    torch.linalg.solve_triangular(ta, tb, upper=True)
    before = counters.eager_compiles
    for kw in calls:
        _close(
            torch.linalg.solve_triangular(ta, tb, upper=True, **kw),
            torch.linalg.solve_triangular(a, b, upper=True, **kw),
        )
    assert counters.eager_compiles == before  # unitriangular travels as a value, its default filled in
    # a direct call of the engine's kernel with the defaults spelled out keys the dispatcher's entry
    kernel = kernel_for(aten.linalg_solve_triangular.default)
    entries = len(kernel.cache)
    x = kernel(ta, tb, upper=True, left=True, unitriangular=False)
    _close(x, torch.linalg.solve_triangular(a, b, upper=True))
    assert len(kernel.cache) == entries
    # a static flag at another value than its default is another program, and computes the other thing
    bl = torch.randn(3, 5)
    _close(
        torch.linalg.solve_triangular(ta, bl.to("tpu"), upper=True, left=False),
        torch.linalg.solve_triangular(a, bl, upper=True, left=False),
    )


def test_batch_shapes_share_one_program_per_bucket():
    kernel = kernel_for(aten.linalg_lu_factor_ex.default)
    shapes = [(2, 3), (5,), (3, 2, 1), (7,)]  # flat 6, 5, 6, 7: all in the bucket of 8
    entries = None
    for batch in shapes:
        a = torch.randn(*batch, 3, 3)
        _close(torch.linalg.lu_factor_ex(a.to("tpu")), torch.linalg.lu_factor_ex(a))
        if entries is None:
            entries = len(kernel.cache)
    assert len(kernel.cache) == entries
    lu, piv, info = torch.linalg.lu_factor_ex(torch.randn(2, 3, 3, 3).to("tpu"))
    cpu = torch.linalg.lu_factor_ex(torch.randn(2, 3, 3, 3))
    assert lu.stride() == cpu[0].stride() and lu._base is None and piv.shape == (2, 3, 3) and info.shape == (2, 3)


@pytest.mark.slow  # (a compile of each decomposition: ~10 s of CPU)
@pytest.mark.parametrize("batch", [(3,), (2, 1, 3)])
def test_batched_ops_as_on_the_cpu(batch):
    a = _well_conditioned(*batch, 4, 4)
    b = torch.randn(*batch, 4, 2)
    ta, tb = a.to("tpu"), b.to("tpu")
    tol = {"atol": 1e-4, "rtol": 1e-4}
    _close(torch.linalg.inv(ta), torch.linalg.inv(a), **tol)
    _close(torch.linalg.slogdet(ta), torch.linalg.slogdet(a), **tol)
    _close(torch.linalg.solve(ta, tb), torch.linalg.solve(a, b), **tol)
    lu, piv = torch.linalg.lu_factor(a)
    _close(torch.linalg.lu_solve(lu.to("tpu"), piv.to("tpu"), tb), torch.linalg.lu_solve(lu, piv, b), **tol)
    _close(torch.linalg.svdvals(ta), torch.linalg.svdvals(a), **tol)
    _close(torch.linalg.lstsq(ta, tb, driver="gels").solution, torch.linalg.lstsq(a, b, driver="gels").solution, **tol)
    spd = a @ a.mT
    _close(torch.linalg.cholesky(spd.to("tpu")), torch.linalg.cholesky(spd), **tol)


def test_a_singular_element_reported_as_on_the_cpu():
    a = _well_conditioned(2, 3, 3, 3)
    a[1, 0] = 0  # flat batch element 3 singular; the padding (to 8) must report nothing
    ta = a.to("tpu")
    inv, info = torch.linalg.inv_ex(ta)
    cpu_inv, cpu_info = torch.linalg.inv_ex(a)
    _close(info, cpu_info)
    _close(inv[0], cpu_inv[0], atol=1e-4, rtol=1e-4)
    with pytest.raises(torch.linalg.LinAlgError, match=r"\(Batch element 3\)") as raised:
        torch.linalg.inv(ta)
    with pytest.raises(torch.linalg.LinAlgError) as on_cpu:
        torch.linalg.inv(a)
    assert str(raised.value) == str(on_cpu.value)
    _close(torch.linalg.lu_factor_ex(ta)[2], torch.linalg.lu_factor_ex(a)[2])


def test_broadcast_batches_flatten_where_the_results_take_them():
    a = torch.randn(2, 1, 5, 5).triu() + 5 * torch.eye(5)
    b = torch.randn(3, 5, 3)
    _close(
        torch.linalg.solve_triangular(a.to("tpu"), b.to("tpu"), upper=True),
        torch.linalg.solve_triangular(a, b, upper=True),
    )
    # lu_solve's pivots of another batch than LU: the CPU's error, as before
    lu, piv = torch.linalg.lu_factor(torch.randn(2, 3, 3))
    with pytest.raises(RuntimeError, match="Expected LU.shape"):
        torch.linalg.lu_solve(lu.to("tpu"), piv[:1].to("tpu"), torch.randn(2, 3, 1).to("tpu"))


def test_matrix_exp_batches_share_one_program():
    kernel = kernel_for(aten.linalg_matrix_exp.default)
    gen = torch.Generator().manual_seed(7)
    entries = None
    for batch in [(3,), (3, 3), (2, 5), (4,)]:  # (flat 3, 9, 10, 4: all in the bucket of 16)
        for dtype in (torch.float32, torch.complex64):
            a = torch.randn(*batch, 3, 3, generator=gen).to(dtype) * 0.8
            got = torch.linalg.matrix_exp(a.to("tpu"))
            want = torch.linalg.matrix_exp(a)
            assert got.shape == want.shape and got.stride() == want.stride()
            _close(got, want, atol=1e-5, rtol=1e-4)
        if entries is None:
            entries = len(kernel.cache)
    assert len(kernel.cache) == entries


def test_conjugated_and_negated_batches_key_the_plain_program():
    # a lazily conjugated (or negated) batched operand is flattened on the host with its bit applied
    # (XLA:CPU), not by a reshape and a `cat` on the device: a program per batch shape, layout and bit
    a = torch.randn(3, 5, 5, dtype=torch.complex64).triu() + 5 * torch.eye(5)
    b = torch.randn(3, 5, 2, dtype=torch.complex64)
    ta, tb = a.to("tpu"), b.to("tpu")
    _close(torch.linalg.solve_triangular(ta, tb, upper=True), torch.linalg.solve_triangular(a, b, upper=True))
    compiles = 0
    for conj_a, conj_b, neg_b in [(True, False, False), (False, True, False), (True, True, True)]:
        xa, xb, ca, cb = ta, tb, a, b
        if conj_a:
            xa, ca = xa.conj(), ca.conj()
        if conj_b:
            xb, cb = xb.conj(), cb.conj()
        if neg_b:
            xb, cb = xb._neg_view(), cb._neg_view()
        before = counters.eager_compiles
        x = torch.linalg.solve_triangular(xa, xb, upper=True)
        compiles += counters.eager_compiles - before
        _close(x, torch.linalg.solve_triangular(ca, cb, upper=True))
    on_host = platform.buffers_in_host_memory() and not tpu_check.enabled()  # (else flattened on the device)
    assert compiles == 0 or not on_host
