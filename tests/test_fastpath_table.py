"""The C++ fast path's contract with Python (eager/fastpath.py FastPathTable) and its build."""

import dataclasses
import pathlib
import subprocess
import sysconfig

import pytest
import torch

import torchtpu
from torchtpu.device import native
from torchtpu.eager import engine, fastpath, kernels


class _FakeLibrary:
    """Stands in for the built library: only its list of table names matters here."""

    def __init__(self, names):
        self.torchtpu_fast_table_names = lambda: tuple(names)


def _fields():
    return [f.name for f in dataclasses.fields(fastpath.FastPathTable)]


def test_a_table_name_only_one_side_knows_is_refused_with_both_lists():
    renamed = [n if n != "sync_count" else "syncs" for n in _fields()]
    with pytest.raises(RuntimeError, match=r"only in C\+\+ \['syncs'\], only in Python \['sync_count'\]"):
        fastpath._declare(_FakeLibrary(renamed))


@pytest.mark.skipif(not fastpath.loaded(), reason=f"no C++ fast path: {fastpath.problem()}")
def test_the_loaded_library_reads_exactly_the_declared_fields():
    assert set(fastpath._lib[0].torchtpu_fast_table_names()) == set(_fields())


def test_describe_names_the_plan_the_cpp_side_runs():
    # a first call runs the Python kernel, which then says what the C++ side may run for its key
    a = torch.arange(7.0, device="tpu")
    with torchtpu.eager_mode("strict"):
        b = a * 3
    kernel = kernels.kernel_for(torch.ops.aten.mul.Tensor)
    plan = engine.describe_last_call(kernel)
    assert type(plan) is fastpath.FastPlan
    assert plan.outs == (((7,), torch.float32),) and plan.written_slots == () and plan.where == "aten::mul.Tensor"
    assert engine.describe_last_call(kernels.kernel_for(torch.ops.aten.add.Tensor)) is True  # not its call
    torch.testing.assert_close(b.cpu(), torch.arange(7.0) * 3)


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_the_cpp_key_keeps_apart_views_that_do_and_do_not_lie_along_the_storage(mode):
    # the same sizes, strides and storage: only whether the view lies along the storage array's
    # dimensions differs (executable.lies_along); the C++ key (call_key.cpp) must tell them apart
    cpu = torch.arange(24.0).reshape(4, 6)
    tpu = cpu.to("tpu")
    with torchtpu.eager_mode(mode):
        for start in (1, 4, 1, 4, 2, 3, 4):  # [1:5] lies along a row, [4:8] crosses one
            got = tpu.view(-1)[start : start + 4] * 2
            torch.testing.assert_close(got.cpu(), cpu.view(-1)[start : start + 4] * 2)


def test_a_changed_source_or_flag_names_another_library(tmp_path):
    source = tmp_path / "x.cpp"
    source.write_text("int f() { return 1; }\n")
    first = native._target((source,), "x")
    source.write_text("int f() { return 2; }\n")
    assert native._target((source,), "x") != first  # (a changed .cpp is rebuilt, never loaded stale)


@pytest.mark.slow
@pytest.mark.skipif(native.compiler() is None, reason="no C++ compiler")
def test_the_cpp_sources_compile_without_warnings(tmp_path):
    root = pathlib.Path(torch.__file__).parent
    package = pathlib.Path(fastpath.__file__).resolve().parent.parent
    unity = tmp_path / "fast_path_unit.cpp"  # (the fast path builds as one unit: native.build unity=True)
    unity.write_text("".join(f'#include "{p}"\n' for p in fastpath._SOURCES if p.suffix == ".cpp"))
    for source in [*sorted((package / "device" / "csrc").glob("*.cpp")), unity]:
        cmd = [
            native.compiler(),
            "-fsyntax-only",
            *native._FLAGS,
            "-Werror",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-isystem{root / 'include'}",
            f"-isystem{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
            f"-isystem{sysconfig.get_paths()['include']}",
            str(source),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{source.name}:\n{done.stderr[-3000:]}"
