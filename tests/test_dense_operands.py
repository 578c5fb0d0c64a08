"""Small strided operands made dense before the op (eager/dense_operands.py) against the CPU: the
same bits as the one-program executable, output layouts as PyTorch's, writes through views kept,
and one op program shared by the layouts (the copies per layout shared by the ops)."""

import itertools

import pytest
import torch

from torchtpu.eager import dense_operands, matmul_buckets, stand_ins, tpu_check

DEV = "tpu"


@pytest.fixture(autouse=True)
def _no_matmul_buckets(monkeypatch):
    # (small products of these shapes would run padded to size buckets: eager/matmul_buckets.py)
    monkeypatch.setattr(matmul_buckets, "HOST_BYTES", -1)


def _inverse(p):
    return tuple(sorted(range(len(p)), key=lambda i: p[i]))


def _laid_out(t, perm):
    """`t` on the device stored in the memory order `perm` (PyTorch test_bmm's layouts)."""
    return t.to(DEV).permute(perm).contiguous().permute(_inverse(perm))


@pytest.fixture(params=["host", "device"])
def where(request, monkeypatch):
    if request.param == "device":  # the device copy (a TPU's path; on XLA:CPU small copies run on the host)
        monkeypatch.setattr(dense_operands, "HOST_DENSE_BYTES", -1)
    return request.param


def test_bmm_over_operand_layouts_shares_one_program(where, xla_compiles):
    gen = torch.Generator().manual_seed(0)
    shape_a, shape_b = (2, 5, 4), (2, 4, 3)  # (shapes no other test uses: the compiles counted are ours)
    if where == "device":
        shape_a, shape_b = (2, 6, 4), (2, 4, 5)
    a, b = torch.randn(shape_a, generator=gen), torch.randn(shape_b, generator=gen)
    want = torch.bmm(a, b)
    dense = torch.bmm(a.to(DEV), b.to(DEV)).cpu()
    perms = [(0, 2, 1), (2, 1, 0), (1, 2, 0)]
    operands = [(_laid_out(a, pa), _laid_out(b, pb)) for pa, pb in itertools.product(perms, repeat=2)]
    torch.tpu.synchronize()
    before = xla_compiles()
    results = [torch.bmm(x, y) for x, y in operands]
    # 9 layout pairs: without the dense step a program each; now one (a dense copy per layout on the
    # device; a scalar program or two of JAX's own may come with the first calls)
    if not tpu_check.enabled():  # (the TPU compile check compiles each program twice)
        assert xla_compiles() - before <= (3 + 2 * 3 if where == "device" else 3)
    for got in results:
        assert got.is_contiguous()
        assert torch.equal(got.cpu(), dense)  # bit for bit the dense operands' result
        torch.testing.assert_close(got.cpu(), want)


def test_elementwise_keeps_the_cpus_output_layout(where):
    gen = torch.Generator().manual_seed(1)
    n = 5 if where == "host" else 6  # (new keys for the device copies)
    x, y = torch.randn(n, 7, generator=gen), torch.randn(7, n, generator=gen)
    for got, want in [
        (x.to(DEV).t() + y.to(DEV), x.t() + y),  # a transposed operand with a contiguous one
        (x.to(DEV).t() * y.to(DEV).t().t(), x.t() * y),
        (x.to(DEV)[:, ::2] - 1, x[:, ::2] - 1),  # a strided view: contiguous output
        (torch.where(y.to(DEV).t() > 0, x.to(DEV), 0.5), torch.where(y.t() > 0, x, 0.5)),
    ]:
        assert got.stride() == want.stride() and got.shape == want.shape
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_writes_through_views_and_partial_reads(where):
    gen = torch.Generator().manual_seed(2)
    n = 8 if where == "host" else 9  # (new keys for the device copies)
    base = torch.randn(6, n, generator=gen)
    src = torch.randn(n, 6, generator=gen)
    # in place with a transposed operand; the written view itself strided
    got, want = base.to(DEV), base.clone()
    got[:, 1::2].add_(src.to(DEV)[:8:2].t())
    want[:, 1::2].add_(src[:8:2].t())
    assert torch.equal(got.cpu(), want)
    # out= of another layout, partial views with offsets (traced) read in a loop
    out = torch.empty(4, 6, device=DEV).t()
    for i in range(3):
        got = torch.mul(src.to(DEV)[i : i + 6, 1:5], base.to(DEV)[:, i : i + 4], out=out)
        want = torch.mul(src[i : i + 6, 1:5], base[:, i : i + 4])
        assert got is out and got.stride() == (1, 6)
        assert torch.equal(got.cpu(), want)
    # an operand that reads the written storage keeps its own read (PyTorch's overlap rules)
    got, want = base.to(DEV)[:6, :6], base[:6, :6].clone()
    got.add_(got.t())
    assert torch.equal(got.cpu(), want + want.t())


def test_an_entry_called_often_builds_its_own_program():
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(3, 7, generator=gen), torch.randn(3, 5, generator=gen)
    ta, tb = a.to(DEV), b.to(DEV)
    first = (ta.t() @ tb).cpu()
    torch.testing.assert_close(first, a.t() @ b)
    for _ in range(stand_ins.TIER_UP + 3):  # its own program reads the transposed view itself
        assert torch.equal((ta.t() @ tb).cpu(), first)


def test_conj_views_and_dtypes():
    gen = torch.Generator().manual_seed(4)
    z = torch.randn(4, 6, dtype=torch.complex64, generator=gen)
    w = torch.randn(6, 4, dtype=torch.complex64, generator=gen)
    torch.testing.assert_close((z.to(DEV).t().conj() * w.to(DEV)).cpu(), z.t().conj() * w)
    i = torch.randint(-9, 9, (5, 3), generator=gen, dtype=torch.int32)
    assert torch.equal((i.to(DEV).t() * 3).cpu(), i.t() * 3)
    assert torch.equal(i.to(DEV).t().sum(1).cpu(), i.t().sum(1))
