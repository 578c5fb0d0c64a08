"""torch.tpu.compiler.custom_compiler_options and torch.tpu.allow_excess_precision: XLA compiler
options reach the executables of eager ops, compiled graphs and the fused optimizers, and key their
caches. XLA's `xla_dump_to` option makes it visible: XLA writes each module's DebugOptions there."""

import itertools
import os
import pathlib

import pytest
import torch

import torchtpu
from torchtpu.eager import xla_options

_shapes = itertools.count(int.from_bytes(os.urandom(2), "little") % 1000 + 1000)


def _fresh_shape():
    """A shape no executable (in memory or in the on-disk cache) was built for: a dump needs a compile."""
    return (3, next(_shapes))


def _debug_options(d: pathlib.Path):
    return [p.read_text() for p in d.glob("*debug_options")]


def test_eager_ops_compile_with_the_options_and_key_on_them(tmp_path):
    x = torch.randn(_fresh_shape(), device="tpu")
    ref = (x * 3 - 1).cpu()
    opts = {"xla_dump_to": str(tmp_path), "xla_allow_excess_precision": "false", "xla_optimization_level": "O1"}
    with torch.tpu.compiler.custom_compiler_options(opts):
        assert xla_options.active() == (
            ("optimization_level", 19),
            ("xla_allow_excess_precision", False),
            ("xla_dump_to", str(tmp_path)),
        )
        before = torchtpu.metrics()["eager_compiles"]
        y = (x * 3 - 1).cpu()
        assert torchtpu.metrics()["eager_compiles"] == before + 2  # keyed apart from the ones outside
    torch.testing.assert_close(y, ref)
    dumped = _debug_options(tmp_path)
    assert dumped and all("xla_allow_excess_precision: false" in t for t in dumped)
    assert xla_options.active() == ()
    before = torchtpu.metrics()["eager_compiles"]
    torch.testing.assert_close((x * 3 - 1).cpu(), ref)
    assert torchtpu.metrics()["eager_compiles"] == before  # the executables from before


def test_compiled_graph_compiles_with_the_options(tmp_path):
    f = torch.compile(lambda a: torch.sin(a) * 2 + a, backend="tpu")
    x = torch.randn(_fresh_shape(), device="tpu")
    ref = f(x).cpu()
    compiles = torchtpu.metrics()["compiled_xla_compiles"]
    with torch.tpu.compiler.custom_compiler_options(
        {"xla_dump_to": str(tmp_path), "xla_allow_excess_precision": False}
    ):
        torch.testing.assert_close(f(x).cpu(), ref)
    assert torchtpu.metrics()["compiled_xla_compiles"] == compiles + 1
    assert any("xla_allow_excess_precision: false" in t for t in _debug_options(tmp_path))
    f(x)
    assert torchtpu.metrics()["compiled_xla_compiles"] == compiles + 1  # outside: the first one again


@pytest.mark.skipif(torch.tpu.platform() != "cpu", reason="a default of XLA:CPU only")
def test_one_op_executables_take_the_small_program_emitters_on_xla_cpu(tmp_path):
    """One eager op without a reduction compiles with XLA:CPU's LLVM IR fusion emitters (less compile
    time for a small program); a reduction keeps XLA's emitters; both take LLVM's -O1; a compiled
    graph keeps XLA's emitters and takes -O1 too; the user's option wins."""
    cco = torch.tpu.compiler.custom_compiler_options
    x = torch.randn(_fresh_shape(), device="tpu")
    with cco({"xla_dump_to": str(tmp_path / "op")}):
        torch.testing.assert_close((x * 3 - 1).cpu(), x.cpu() * 3 - 1)
    dumped = _debug_options(tmp_path / "op")
    assert dumped and all("xla_cpu_use_fusion_emitters: false" in t for t in dumped)
    assert all("xla_backend_optimization_level: 1" in t for t in dumped)
    with cco({"xla_dump_to": str(tmp_path / "reduction")}):  # a reduction keeps XLA's emitters
        torch.testing.assert_close(torch.softmax(x, -1).cpu(), torch.softmax(x.cpu(), -1))
    dumped = _debug_options(tmp_path / "reduction")
    assert dumped and not any("xla_cpu_use_fusion_emitters: false" in t for t in dumped)
    assert all("xla_backend_optimization_level: 1" in t for t in dumped)

    f = torch.compile(lambda a: torch.sin(a) * 2 + a, backend="tpu")
    with cco({"xla_dump_to": str(tmp_path / "graph")}):
        torch.testing.assert_close(f(x).cpu(), torch.sin(x.cpu()) * 2 + x.cpu())
    dumped = _debug_options(tmp_path / "graph")
    assert dumped and not any("xla_cpu_use_fusion_emitters" in t for t in dumped)
    assert all("xla_backend_optimization_level: 1" in t for t in dumped)
    assert xla_options.graph_options({"xla_backend_optimization_level": 3}) == {"xla_backend_optimization_level": 3}

    with cco({"xla_dump_to": str(tmp_path / "user"), "xla_cpu_use_fusion_emitters": True}):
        assert xla_options.op_options(xla_options.jax_options())["xla_cpu_use_fusion_emitters"] is True
        torch.testing.assert_close((x * 3 - 1).cpu(), x.cpu() * 3 - 1)
    dumped = _debug_options(tmp_path / "user")  # (XLA's own default is not written out)
    assert dumped and not any("xla_cpu_use_fusion_emitters: false" in t for t in dumped)
    assert xla_options.op_options(None) == {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}


def test_nesting_merges_inner_wins_and_restores():
    cco = torch.tpu.compiler.custom_compiler_options
    with cco({"xla_optimization_level": "O1", "xla_cpu_enable_fast_math": "false"}):
        with cco({"xla_optimization_level": "O3"}):
            assert dict(xla_options.active()) == {"optimization_level": 39, "xla_cpu_enable_fast_math": False}
        assert dict(xla_options.active()) == {"optimization_level": 19, "xla_cpu_enable_fast_math": False}
    assert xla_options.active() == ()
    with pytest.raises(KeyError):
        with cco({"xla_memory_fitting_level": "O2"}):
            raise KeyError("the block's own error")
    assert xla_options.active() == ()


def test_bad_options_raise_naming_the_problem():
    cco = torch.tpu.compiler.custom_compiler_options
    with pytest.raises(ValueError, match="No such compile option: 'xla_no_such_option'"):
        with cco({"xla_no_such_option": "1"}):
            pass
    with pytest.raises(ValueError, match="xla_optimization_level must be one of 'O0', 'O1', 'O2', 'O3', got 'O7'"):
        with cco({"xla_optimization_level": "O7"}):
            pass
    with pytest.raises(ValueError, match="unknown option 'fast'"):
        with cco({"fast": "yes"}):
            pass
    with pytest.raises(ValueError, match="xla_cpu_enable_fast_math"):
        with cco({"xla_cpu_enable_fast_math": "maybe"}):
            pass
    with pytest.raises(TypeError, match="expected a dict"):
        with cco([("xla_optimization_level", "O1")]):
            pass
    assert xla_options.active() == ()


def test_fused_optimizer_step_keys_on_the_options():
    p = torch.nn.Parameter(torch.randn(4, 5, device="tpu"))
    opt = torch.tpu.optimizers.AdamW([p], lr=0.1)
    p.grad = torch.ones_like(p)
    opt.step()
    assert opt.executables_built == 1
    with torch.tpu.compiler.custom_compiler_options({"xla_optimization_level": "O0"}):
        opt.step()
    assert opt.executables_built == 2
    opt.step()
    assert opt.executables_built == 2


def test_allow_excess_precision_property(tmp_path, monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    tpu = torch.tpu
    assert "allow_excess_precision" in tpu.__all__
    assert tpu.allow_excess_precision is True  # XLA's own default
    try:
        tpu.allow_excess_precision = False
        assert tpu.allow_excess_precision is False
        assert xla_options.active() == (("xla_allow_excess_precision", False),)
        x = torch.randn(_fresh_shape(), device="tpu", dtype=torch.bfloat16)
        with tpu.compiler.custom_compiler_options({"xla_dump_to": str(tmp_path)}):
            y = (x * x + 1).cpu()
        torch.testing.assert_close(y, x.cpu() * x.cpu() + 1)
        dumped = _debug_options(tmp_path)
        assert dumped and all("xla_allow_excess_precision: false" in t for t in dumped)
        with pytest.raises(TypeError, match="True or False"):
            tpu.allow_excess_precision = "no"
    finally:
        tpu.allow_excess_precision = True
    assert tpu.allow_excess_precision is True and xla_options.active() == ()
    monkeypatch.setenv("XLA_FLAGS", "--xla_allow_excess_precision=false")
    assert tpu.allow_excess_precision is False  # the effective setting XLA reads
