"""Printing a tpu tensor formats a host copy (integrations/patches.py `_print_from_host`): the CPU's text for
the same values, the tpu suffixes, and no XLA compile for a new shape."""

from __future__ import annotations

import re

import torch

from torchtpu.integrations import patches

_SUFFIX = re.compile(r",\s*device='tpu:0'")


def _cases():
    g = torch.Generator().manual_seed(13)
    x = torch.randn(3, 5, generator=g) * 100
    x[0, 1], x[1, 2], x[2, 3] = float("nan"), float("inf"), 0.0
    z = torch.randn(4, 3, dtype=torch.complex64, generator=g)
    return [
        x,
        (x * 7).round(),
        torch.randint(-50, 50, (2, 3, 2), generator=g),
        torch.rand(5, generator=g) > 0.5,
        torch.tensor([1e-9, 3.0, 2e9]),
        torch.tensor(2.5),
        torch.empty(0, 3),
        z,
    ], [lambda t: t, lambda t: t.mT[..., ::2] if t.dim() > 1 else t]


def test_prints_the_cpu_text_without_compiling(xla_compiles):
    tensors, views = _cases()
    copies = [t.to("tpu") for t in tensors]
    z, x = copies[7], copies[0]
    made = xla_compiles()  # (the copies to the device)
    for t, on_tpu in zip(tensors, copies):
        for view in views:
            text = str(view(on_tpu))
            assert "device='tpu:0'" in text
            assert _SUFFIX.sub("", text) == str(view(t))
    assert _SUFFIX.sub("", str(z.conj())) == str(tensors[7].conj())
    assert _SUFFIX.sub("", str(torch._neg_view(x))) == str(torch._neg_view(tensors[0]))
    assert xla_compiles() == made


def test_suffixes_are_the_tpu_tensors():
    w = torch.ones(2, 3, device="tpu", requires_grad=True)
    y = w * 2
    assert str(y).endswith("device='tpu:0', grad_fn=<MulBackward0>)")
    assert "requires_grad=True" in str(w) and "device='tpu:0'" in str(w)
    assert str(torch.nn.Parameter(torch.zeros(2, device="tpu"))).startswith("Parameter containing:\ntensor([0., 0.]")


def test_over_the_limit_prints_on_the_device(monkeypatch):
    monkeypatch.setattr(patches, "PRINT_FROM_HOST_BYTES", 8)  # (bool: its formatter only reads elements)
    t = torch.tensor([[True, False, True], [False, False, True], [True, True, True]])
    assert _SUFFIX.sub("", str(t.to("tpu"))) == str(t)
    assert "torch._tensor_str._tensor_str (tpu tensors printed from a host copy)" in patches.applied()
