"""out= overloads of a new signature run their functional op's program, then write into out=
(eager/out_writes.py): the functional result's bits, PyTorch's out= semantics (resize and its
warning, dtype errors, strides of out, aliasing an input, several outs), no program of their own."""

import warnings

import pytest
import torch

from torchtpu.eager import out_writes, tpu_check

DEV = "tpu"


def test_out_layouts_share_the_functional_program(xla_compiles):
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 4, 5, generator=gen), torch.randn(3, 5, 6, generator=gen)
    ta, tb = a.to(DEV), b.to(DEV)
    outs = [
        lambda dev: torch.empty(3, 4, 6, device=dev),
        lambda dev: torch.empty(3, 6, 4, device=dev).transpose(1, 2),
        lambda dev: torch.empty(0, device=dev),  # resized, without a warning
    ]
    torch.bmm(tb.transpose(1, 2), ta.transpose(1, 2))  # (the process's first programs also compile XLA's probes)
    torch.tpu.synchronize()
    before = xla_compiles()
    functional = torch.bmm(ta, tb).cpu()
    for make in outs:
        o, want = make(DEV), make("cpu")
        assert torch.bmm(ta, tb, out=o) is o
        torch.bmm(a, b, out=want)
        assert o.shape == want.shape and o.stride() == want.stride()
        torch.testing.assert_close(o.cpu(), functional, rtol=0, atol=0)
    torch.testing.assert_close(functional, torch.bmm(a, b))
    if not tpu_check.enabled():
        # bmm's program, the copy into the transposed out, its read for .cpu(), the resized out's
        # zeros (bmm.out: none; 2 more before)
        assert xla_compiles() - before <= 4
    with pytest.raises(RuntimeError, match="dtype"):
        torch.bmm(ta, tb, out=torch.empty(3, 4, 6, device=DEV, dtype=torch.float64))


def test_out_semantics_are_the_cpus():
    gen = torch.Generator().manual_seed(1)
    x, s = torch.randn(4, 4, generator=gen), torch.randn(3, 5, generator=gen)
    for dev in ("cpu", DEV):
        got = []
        o = torch.empty(2, 2, device=dev)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.mm(x.to(dev), x.to(dev), out=o)
        got.append((o.shape, o.stride(), len([w for w in caught if "resized" in str(w.message)])))
        y = x.to(dev)
        torch.mm(y, y, out=y)  # out= is an input
        got.append(y.cpu())
        so = torch.empty(5, dtype=torch.float64, device=dev)  # computed in out's dtype: the engine's program
        torch.sum(s.to(dev), 0, out=so)
        got.append(so.cpu())
        v, i = torch.empty(3, device=dev), torch.empty(3, dtype=torch.long, device=dev)
        r = torch.max(s.to(dev), 1, out=(v, i))
        assert r[0] is v and r[1] is i
        got.append((v.cpu(), i.cpu()))
        if dev == "cpu":
            want = got
    assert got[0] == want[0] and got[0][2] == 1
    for g, w in zip(got[1:], want[1:]):
        torch.testing.assert_close(g, w)


def test_a_hot_signature_gets_the_out_overloads_program(xla_compiles):
    x = torch.randn(6, 6).to(DEV)
    o = torch.empty(6, 6, device=DEV).t()
    first = torch.mm(x, x).cpu()
    for _ in range(out_writes.TIER_UP + 2):
        torch.testing.assert_close(torch.mm(x, x, out=o).cpu(), first, rtol=0, atol=0)
    assert torch.mm(x, x, out=o) is o
