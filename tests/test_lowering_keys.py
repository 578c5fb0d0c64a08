"""Every key of the lowering table names a real operator overload of the installed torch, spelled as
`ops.resolve.op_name` spells it: a key with a typo, or one whose overload a torch release removed,
would otherwise be a lowering that nothing ever reaches."""

from __future__ import annotations

import torch

import torchtpu  # noqa: F401  (fills the table)
from torchtpu.ops.resolve import op_name
from torchtpu.ops.table import LOWERINGS


def _overload(key: str):
    parts = key.split(".")
    if len(parts) == 3:  # "ns.op.overload": an operator outside aten (a jax_op)
        ns, name, overload = parts
    elif len(parts) == 2:  # "op.overload": aten
        ns, (name, overload) = "aten", parts
    else:
        return None
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError):
        return None


def test_every_lowering_key_is_a_real_overload():
    bad = [key for key in LOWERINGS if (op := _overload(key)) is None or op_name(op) != key]
    assert bad == []


def test_a_misspelt_key_would_be_caught():
    assert _overload("add.Tensr") is None and _overload("addd.Tensor") is None
    assert op_name(_overload("add.Tensor")) == "add.Tensor"
