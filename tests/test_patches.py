"""integrations/patches.py: every patch of another library is installed on the releases it was checked
against, a release outside them warns once, a target that is gone is reported (never an error at import),
and the checked ranges agree with pyproject.toml and docs/transformers.md."""

from __future__ import annotations

import importlib
import pathlib
import re
import types
import warnings

import pytest
import torch

pytest.importorskip("accelerate")
pytest.importorskip("transformers")
# imported for their side effect: importing them applies the accelerate and transformers patches
import accelerate.accelerator
import accelerate.state  # noqa: F401
import jax.experimental.pallas  # noqa: F401  (imports jax._src.pallas.pallas_call)
import transformers.cache_utils
import transformers.generation.utils
import transformers.modeling_utils  # noqa: F401

import torchtpu.integrations
from torchtpu.integrations import patches

torchtpu.integrations.install()
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _resolve(dotted: str):
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise LookupError(dotted)


@pytest.mark.parametrize("patch", patches.PATCHES, ids=lambda p: p.marker)
def test_each_patch_is_installed_on_the_checked_releases(patch):
    version = patches.installed_version(patch.library)
    if not patches.in_checked_range(version, patch.checked):
        pytest.skip(f"{patch.library} {version} is outside {patch.checked}: the warning test covers it")
    if patch.needed is not None and not patch.needed():
        # (the storage constructor, needed without the C++ extension only: test_upstream_regressions.py's
        # test_storages_made_by_pytorch_itself_without_the_extension checks it there)
        pytest.skip(f"{patch.marker} is not needed in this process")
    target = _resolve(patch.marker)
    if isinstance(target, property):
        target = target.fget
    assert getattr(target, "_torchtpu", False), f"{patch.marker} is not torchtpu's replacement"


def test_no_patch_reports_a_problem():
    assert patches.problems() == []


def test_install_is_idempotent():
    before = patches.applied()
    patches._installed[0] = False
    try:
        patches.install()  # every patch sees its own marker and leaves the target alone
    finally:
        patches._installed[0] = True
    assert patches.applied() == before


def _fake_patch(module_name: str, checked: tuple[str, str], calls: list):
    def apply(module):
        calls.append(module)

    return patches.Patch(apply, "transformers", checked, f"{module_name}.Target.method", module_name)


def test_a_release_outside_the_checked_range_warns_once_and_still_patches(monkeypatch):
    version = patches.installed_version("transformers")
    outside = ("1.0", "1.1")
    assert not patches.in_checked_range(version, outside)
    calls = []
    first, second = _fake_patch("fake_one", outside, calls), _fake_patch("fake_two", outside, calls)
    monkeypatch.setattr(patches, "PATCHES", (*patches.PATCHES, first, second))
    monkeypatch.setattr(patches, "_warned_libraries", set())
    module = types.ModuleType("fake_one")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        patches._run(first, module)
        patches._run(second, module)
    assert calls == [module, module]  # both applied
    messages = [str(w.message) for w in seen]
    assert len(messages) == 1, messages
    assert f"transformers {version} is outside" in messages[0]
    assert "fake_one.Target.method (1.0..1.1)" in messages[0] and "fake_two.Target.method" in messages[0]


def test_a_target_that_is_gone_is_reported_not_raised(monkeypatch):
    monkeypatch.setattr(patches, "_problems", [])
    bare = types.ModuleType("transformers.cache_utils")  # a release without StaticSlidingWindowLayer
    row = next(p for p in patches.PATCHES if p.apply is patches._sliding_window_layer)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        patches._run(row, bare)
    assert len(patches.problems()) == 1 and "StaticSlidingWindowLayer" in patches.problems()[0]
    assert any("not patched" in str(w.message) and "StaticSlidingWindowLayer" in str(w.message) for w in seen)


def test_a_patch_that_fails_is_reported_not_raised(monkeypatch):
    monkeypatch.setattr(patches, "_problems", [])

    def broken(module):
        return module.PreTrainedModel  # an AttributeError while the library imports

    row = patches.Patch(broken, "transformers", patches.TRANSFORMERS_CHECKED, "fake.PreTrainedModel", "fake")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        patches._run(row, types.ModuleType("fake"))
    expected = (
        "fake.PreTrainedModel: the patch failed with AttributeError: module 'fake' has no attribute 'PreTrainedModel'"
    )
    assert patches.problems() == [expected]
    assert len(seen) == 1


def _library_ranges() -> dict[str, tuple[str, str]]:
    ranges = {}
    for library, low, high, _ in patches.table():
        lows, highs = ranges.get(library, (low, high))
        ranges[library] = (min(lows, low, key=patches._release), max(highs, high, key=patches._release))
    return ranges


def test_checked_ranges_agree_with_pyproject_and_the_docs():
    pyproject = (ROOT / "pyproject.toml").read_text()
    docs = (ROOT / "docs" / "transformers.md").read_text()
    for library, (low, high) in _library_ranges().items():
        lower_bounds = set(re.findall(rf'"{library}(?:\[[\w,]+\])?>=([0-9.]+)', pyproject))  # (jax[cpu]>=)
        assert lower_bounds == {low}, f"pyproject.toml's {library} lower bound(s) {lower_bounds} != checked {low}"
        assert f"| {library} | {low} .. {high} |" in docs, f"docs/transformers.md lacks the {library} row"
    for _, _, _, marker in patches.table():
        assert f"`{marker}`" in docs, f"docs/transformers.md does not list the patch of {marker}"


def test_storage_moves_go_through_the_patch():
    x = torch.randn(5)
    moved = x.untyped_storage().tpu()
    assert moved.device.type == "tpu"
    back = torch.empty(0, dtype=x.dtype, device="tpu").set_(moved.clone()).cpu()
    torch.testing.assert_close(back, x)


def test_a_module_asked_for_while_it_still_imports_is_patched_once_it_finishes(tmp_path, monkeypatch):
    """transformers.modeling_utils imports torch, which loads torchtpu, which asks for modeling_utils
    while that module's classes are not defined yet: the hook must wait for the module to finish."""
    from torchtpu import _import_hooks

    package = tmp_path / "half_loaded_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "asks.py").write_text(
        "from torchtpu._import_hooks import when_imported\n"
        "import sys\n"
        "seen = []\n"
        "when_imported('half_loaded_pkg.host', lambda m: seen.append(hasattr(m, 'Defined')))\n"
    )
    (package / "later.py").write_text("")
    (package / "host.py").write_text(
        "from . import asks\nclass Defined:\n    pass\nassert asks.seen == []\n"  # not called half-loaded
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("half_loaded_pkg.host")
    importlib.import_module("half_loaded_pkg.later")  # the next import anywhere runs it
    assert importlib.import_module("half_loaded_pkg.asks").seen == [True]
    assert not any(fn for _, fn in _import_hooks._unfinished)


def test_transformers_testing_utils_imported_before_torch_gets_every_patch():
    """Transformers' test suite imports transformers.testing_utils first: torch (and torchtpu) load
    in the middle of transformers.modeling_utils; the compiled-call patch used to be missed."""
    import subprocess
    import sys

    code = (
        "import transformers.testing_utils\n"
        "from torchtpu.integrations import patches\n"
        "assert patches.problems() == [], patches.problems()\n"
        "assert 'transformers.modeling_utils.PreTrainedModel.get_compiled_call' in patches.applied()\n"
    )
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
