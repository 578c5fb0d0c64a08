"""Facts about an op are declared with its lowering (`@lowering(..., real_only=True, meta=..., ...)`), and
the tables other layers read are derived from those declarations. A fact about an overload that no
lowering reaches would never be read, and a fact declared twice would leave one declaration silently
ignored: both fail here."""

from __future__ import annotations

import pytest
import torch

import torchtpu  # noqa: F401  (fills the table)
from torchtpu.eager import build, data_dependent, kernels
from torchtpu.ops import argument_checks, resolve
from torchtpu.ops.graph_lowerings import GRAPH_LOWERINGS, RANDOM_GRAPH_OPS
from torchtpu.ops.table import (
    _REAL_ONLY_WITHOUT_LOWERING,
    FACT_KINDS,
    FACT_OWNERS,
    LOWERINGS,
    REAL_ONLY,
    declared_facts,
    lowering,
    real_only_without_lowering,
)


def _overload(key):
    name, _, overload = key.partition(".")
    return getattr(getattr(torch.ops.aten, name, None), overload, None)


# out= variants whose functional twin is a composite that calls the owner (the engine checks the out=
# call before the composite runs): not visible from the lowering table
_THROUGH_COMPOSITES = {"linalg_eigvals.out": "_linalg_eigvals.default"}


def _reaches(name, owner):
    """Whether the overload `name` is run by the lowering registered as `owner`: it is one of that
    lowering's names, or an in-place/out= variant whose functional twin is."""
    if _THROUGH_COMPOSITES.get(name) == owner:
        return True
    if name in LOWERINGS:
        return LOWERINGS[name].fn is LOWERINGS[owner].fn
    op = _overload(name)
    twin = resolve.functional_twin(op) if op is not None else None
    if twin is None:
        return False
    twin_name = resolve.op_name(twin[0])
    return twin_name in LOWERINGS and LOWERINGS[twin_name].fn is LOWERINGS[owner].fn


@pytest.mark.parametrize("kind", FACT_KINDS)
def test_every_fact_names_an_overload_its_lowering_runs(kind):
    facts = declared_facts(kind)
    assert facts, f"no op declares {kind}: a derived table would be empty"
    bad = [name for name in facts if _overload(name) is None or not _reaches(name, FACT_OWNERS[kind][name])]
    assert bad == []


def test_inplace_variant_names_an_inplace_overload():
    for inplace, functional in declared_facts("inplace_variant").items():
        assert inplace.split(".")[0].endswith("_") and functional in LOWERINGS


def test_real_only_is_declared_on_every_lowering_of_the_op():
    """REAL_ONLY holds base names (every overload, in-place and out= variant of the op); a base whose
    lowerings disagree would be real-only for all of them, whatever the others declare."""
    declared_by_lowering = {key.split(".")[0] for key, low in LOWERINGS.items() if low.real_only}
    disagreeing = sorted(
        key for key, low in LOWERINGS.items() if key.split(".")[0] in declared_by_lowering and not low.real_only
    )
    assert disagreeing == []
    assert set(REAL_ONLY) == declared_by_lowering | _REAL_ONLY_WITHOUT_LOWERING


def test_real_only_without_lowering_names_unlowered_aten_ops():
    lowered_bases = {key.split(".")[0] for key in LOWERINGS}
    assert sorted(_REAL_ONLY_WITHOUT_LOWERING & lowered_bases) == []  # declare it on the lowering instead
    assert [n for n in sorted(_REAL_ONLY_WITHOUT_LOWERING) if not hasattr(torch.ops.aten, n)] == []


def test_derived_tables_are_read_only_views_of_the_declarations():
    for table, kind in (
        (argument_checks.CHECKS, "host_check"),
        (build.META_CHECKS, "meta_check"),
        (build.META_OVERRIDES, "meta"),
        (kernels._MISSING_META, "missing_meta"),
        (data_dependent.MASK_ARGUMENT_OPS, "mask_args"),
        (resolve._INPLACE_TWINS, "inplace_variant"),
    ):
        assert dict(table) == dict(declared_facts(kind))
        with pytest.raises(TypeError):
            table["x.default"] = None
    assert set(GRAPH_LOWERINGS) >= RANDOM_GRAPH_OPS


def test_a_fact_declared_twice_is_refused_and_registers_nothing():
    before = len(LOWERINGS)
    with pytest.raises(ValueError, match="declared twice"):
        lowering("torchtpu_test_never_an_op", host_check={"pow_.Scalar": lambda *a, **k: None})(lambda a: a)
    with pytest.raises(ValueError, match="two lowerings"):
        lowering("abs", real_only=True)(lambda a: a)
    with pytest.raises(ValueError, match="declared twice"):
        real_only_without_lowering("unique_dim")
    with pytest.raises(TypeError, match="unknown op facts"):
        lowering("torchtpu_test_never_an_op", meta_chek=None)
    assert len(LOWERINGS) == before and "torchtpu_test_never_an_op.default" not in LOWERINGS
    assert "abs" not in REAL_ONLY


def test_a_fact_for_an_overload_without_lowering_would_be_caught():
    owner = "pow.Tensor_Scalar"
    assert _reaches("pow_.Scalar", owner) and _reaches("pow.Tensor_Scalar_out", owner)
    assert not _reaches("sub.Tensor", owner)  # another lowering's op
    assert not _reaches("unique_dim.default", owner)  # no lowering at all


def test_no_lowering_is_named_like_an_inplace_op():
    """A trailing `_` means in-place (ops/resolve.py derives `foo_` from `foo`): a lowering of a functional
    op named `pow_` would read as the in-place one."""
    named = {getattr(low.fn, "__name__", "") for low in LOWERINGS.values()}
    assert sorted(n for n in named if n.endswith("_") and not n.endswith("__")) == []
