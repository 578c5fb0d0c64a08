"""Issue 24: edge cases where "tpu" gave silent wrong values or the wrong error, checked against the CPU.

Each test is the issue's repro (or a smaller one): values agree with the CPU by
torch.testing.assert_close, and where the CPU raises, "tpu" raises PyTorch's error.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

D = "tpu"


def _both(fn, *tensors):
    """fn on the CPU tensors and on tpu copies of them: (cpu result, tpu result moved to the CPU)."""
    expected = fn(*tensors)
    actual = fn(*(t.to(D) for t in tensors))
    return expected, (actual.cpu() if isinstance(actual, torch.Tensor) else [a.cpu() for a in actual])


def _same_error(fn_cpu, fn_tpu, match=None):
    """Both raise; the tpu message is the CPU's (or matches `match`)."""
    with pytest.raises(Exception) as on_cpu:
        fn_cpu()
    with pytest.raises(type(on_cpu.value)) as on_tpu:
        fn_tpu()
    expected = match if match is not None else str(on_cpu.value).splitlines()[0]
    assert expected in str(on_tpu.value), (str(on_cpu.value), str(on_tpu.value))


# ---------------------------------------------------------------- 8: SDPA, key/value broadcast + bool mask
@pytest.mark.parametrize("kv_heads", [1, 4])
@pytest.mark.parametrize("mask_kind", ["bool", "float", None])
def test_sdpa_broadcast_heads_mask(kv_heads, mask_kind):
    q, k, v = torch.randn(2, 4, 12, 16), torch.randn(2, kv_heads, 12, 16), torch.randn(2, kv_heads, 12, 16)
    m = torch.ones(12, 12, dtype=torch.bool).tril()
    if mask_kind == "float":
        m = torch.zeros(12, 12).masked_fill(~m, float("-inf"))
    masks = () if mask_kind is None else (m,)
    expected, actual = _both(lambda q, k, v, *m: F.scaled_dot_product_attention(q, k, v, *m), q, k, v, *masks)
    torch.testing.assert_close(actual, expected)


def test_sdpa_bool_mask_math_path_and_grad():
    """Shapes the fused op does not take (3-D query against 4-D keys) go through PyTorch's math path,
    which expects the bool mask already turned into 0/-inf; gradients of the broadcast keys too."""
    q, k, v = torch.randn(4, 3, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    m = torch.rand(3, 6) > 0.3
    m[:, 0] = True
    expected, actual = _both(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), q, k, v, m)
    torch.testing.assert_close(actual, expected)

    q, k, v = (torch.randn(2, 4, 5, 8, requires_grad=True), torch.randn(2, 1, 5, 8, requires_grad=True),
               torch.randn(2, 1, 5, 8, requires_grad=True))
    m = torch.ones(5, 5, dtype=torch.bool).tril()
    g = torch.randn(2, 4, 5, 8)
    F.scaled_dot_product_attention(q, k, v, attn_mask=m).backward(g)
    tq, tk, tv = (t.detach().to(D).requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(tq, tk, tv, attn_mask=m.to(D)).backward(g.to(D))
    for cpu, tpu in ((q, tq), (k, tk), (v, tv)):
        torch.testing.assert_close(tpu.grad.cpu(), cpu.grad, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- 4: in-place ops with an impossible cast
@pytest.mark.parametrize("case", [
    lambda x: x.mul_(2.5),
    lambda x: x.__imul__(2.5),
    lambda x: x.div_(2),
    lambda x: x.add_(torch.ones(3, device=x.device)),
    lambda x: x.sqrt_(),
    lambda x: x.clamp_(0.5),
])
def test_inplace_int_refuses_float_result(case):
    _same_error(lambda: case(torch.tensor([1, 2, 3])), lambda: case(torch.tensor([1, 2, 3], device=D)),
                "result type Float can't be cast to the desired output type Long")


def test_inplace_float_refuses_complex_and_bool_refuses_int():
    _same_error(lambda: torch.randn(3).mul_(1j), lambda: torch.randn(3, device=D).mul_(1j),
                "result type ComplexFloat can't be cast to the desired output type Float")
    z = torch.randn(3, dtype=torch.complex64)
    _same_error(lambda: torch.randn(3).mul_(z), lambda: torch.randn(3, device=D).mul_(z.to(D)))
    _same_error(lambda: torch.tensor([True]).add_(1), lambda: torch.tensor([True], device=D).add_(1))


def test_inplace_casts_the_cpu_allows_still_work():
    for fn in (lambda x: x.mul_(2), lambda x: x.lt_(1.5), lambda x: x.fill_(2.7),
               lambda x: x.masked_fill_(x > 1, 7.9)):
        expected = fn(torch.tensor([1, 2, 3]))
        actual = fn(torch.tensor([1, 2, 3], device=D))
        torch.testing.assert_close(actual.cpu(), expected)
    x = torch.randn(3, dtype=torch.float32)
    torch.testing.assert_close(x.to(D).mul_(torch.tensor(2.0, dtype=torch.float64)).cpu(), x * 2)


# ---------------------------------------------------------------- 6: overlapping / expanded writes
OVERLAPS = {
    "shifted_add": lambda x: x[1:].add_(x[:-1]),
    "copy_transpose": lambda x: x.view(3, 3).copy_(x.view(3, 3).t()),
    "add_transpose": lambda x: x.view(3, 3).add_(x.view(3, 3).t()),
    "expanded_add": lambda x: x[:3].unsqueeze(1).expand(3, 4).add_(1),
    "out_expanded": lambda x: torch.add(torch.ones(3, 4, device=x.device), 1, out=x[:3].unsqueeze(1).expand(3, 4)),
    "copy_partial": lambda x: x[:4].copy_(x[2:6]),
    "mul_out_partial": lambda x: torch.mul(x[:4], 2, out=x[2:6]),
}


@pytest.mark.parametrize("name", list(OVERLAPS))
def test_overlapping_writes_raise(name):
    fn = OVERLAPS[name]
    x = torch.randn(9)
    _same_error(lambda: fn(x.clone()), lambda: fn(x.to(D)), "unsupported operation:")
    # the same message as the CPU's
    with pytest.raises(RuntimeError) as on_cpu:
        fn(x.clone())
    with pytest.raises(RuntimeError) as on_tpu:
        fn(x.to(D))
    assert str(on_cpu.value).split(".")[0] == str(on_tpu.value).split(".")[0]


def test_overlap_check_follows_the_offsets():
    """The offsets of views travel as traced values (one executable for x[i] in a loop): the check
    is made per call, so a later call with overlapping offsets raises too, and the tensor is unchanged."""
    x = torch.arange(10.)
    t = x.to(D)
    t[:3].add_(t[5:8])          # disjoint: fine
    x[:3].add_(x[5:8])
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        t[:3].add_(t[1:4])     # the same executable's key, overlapping offsets
    torch.testing.assert_close(t.cpu(), x)


def test_non_overlapping_and_full_overlap_writes_work():
    x = torch.randn(6)
    for fn in (lambda x: x.add_(x), lambda x: x[:3].copy_(x[3:]), lambda x: x.view(2, 3)[1:].mul_(x.view(2, 3)[:1]),
               lambda x: x.unsqueeze(0).expand(2, 6).sum(0).add_(1), lambda x: x.zero_().add_(2)):
        expected = fn(x.clone())
        actual = fn(x.to(D))
        torch.testing.assert_close(actual.cpu(), expected)
    y = torch.randn(3, 1)
    torch.testing.assert_close(y.to(D).expand(3, 4).fill_(2.0).cpu(), y.clone().expand(3, 4).fill_(2.0))
