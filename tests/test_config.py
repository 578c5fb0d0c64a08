"""TORCHTPU_* variables: one parser, errors that name the variable, `import torch` never broken;
the C++ device guard that makes backward on tpu:1 work (issue 24 items 2 and 13)."""

import os
import subprocess
import sys

import pytest

from torchtpu import config


@pytest.mark.parametrize(
    "value,expected",
    [
        ("off", False),
        ("no", False),
        ("FALSE", False),
        ("0", False),
        ("", False),
        ("on", True),
        ("Yes", True),
        ("1", True),
    ],
)
def test_boolean_flags(monkeypatch, value, expected):
    monkeypatch.setenv("TORCHTPU_CPU_FALLBACK", value)
    assert config.get("TORCHTPU_CPU_FALLBACK") is expected
    assert "TORCHTPU_CPU_FALLBACK" not in config.errors()


@pytest.mark.parametrize(
    "name,value,accepted",
    [
        ("TORCHTPU_NUM_DEVICES", "abc", "whole number >= 1"),
        ("TORCHTPU_NUM_DEVICES", "2.5", "whole number"),
        ("TORCHTPU_NUM_DEVICES", "0", ">= 1"),
        ("TORCHTPU_NUM_DEVICES", "-1", ">= 1"),
        ("TORCHTPU_EAGER_MODE", "bogus", "strict, debug, fused"),
        ("TORCHTPU_CPU_FALLBACK", "maybe", "off"),
        ("TORCHTPU_PLATFORM", "ipu", "cpu, gpu, cuda, tpu"),
    ],
)
def test_bad_values_name_the_variable(monkeypatch, name, value, accepted):
    monkeypatch.setenv(name, value)
    with pytest.warns(RuntimeWarning, match=name):
        config._warned.discard(name)
        config.get(name)
    with pytest.raises(config.ConfigError, match=f"{name}='{value}'.*{accepted}"):
        config.check()
    monkeypatch.delenv(name)
    config.check()  # fixed in the environment: no stale error


def test_torchtpu_aliases(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_LAUNCH_BLOCKING", "1")
    assert config.get("TORCHTPU_EAGER_MODE") == "debug"
    monkeypatch.setenv("TORCHTPU_EAGER_MODE", "fused")  # ours wins
    assert config.get("TORCHTPU_EAGER_MODE") == "fused"
    monkeypatch.delenv("TORCHTPU_EAGER_MODE")
    monkeypatch.setenv("TORCH_TPU_LAUNCH_BLOCKING", "0")
    monkeypatch.setenv("TORCH_TPU_DEFER_AND_FUSE", "true")
    assert config.get("TORCHTPU_EAGER_MODE") == "fused"
    monkeypatch.setenv("TORCH_TPU_DEFER_AND_FUSE", "0")  # the default is fused: 0 selects strict
    assert config.get("TORCHTPU_EAGER_MODE") == "strict"
    monkeypatch.delenv("TORCH_TPU_DEFER_AND_FUSE")
    assert config.get("TORCHTPU_EAGER_MODE") == "fused"


def _run(code, **env):
    full = dict(os.environ, PYTHONWARNINGS="ignore", **env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=300)


def test_bad_configuration_does_not_break_import_torch():
    done = _run(
        "import torch\nprint(torch.tpu.is_available())\nprint(torch.ones(2).sum().item())\n"
        "try:\n    torch.ones(1, device='tpu')\nexcept ValueError as e:\n    print(e)",
        TORCHTPU_EAGER_MODE="bogus",
        TORCHTPU_NUM_DEVICES="abc",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["False", "2.0"]
    assert "TORCHTPU_NUM_DEVICES='abc'" in lines[2] and "TORCHTPU_EAGER_MODE='bogus'" in lines[2]


def test_backward_and_device_index_on_second_device():
    from torchtpu.device import native

    if native.compiler() is None:
        pytest.skip("no C++ compiler: the C++ device guard cannot be built (documented degradation)")
    done = _run(
        "import torch\n"
        "x = torch.ones(3, device='tpu:1', requires_grad=True)\n"
        "w = torch.randn(3, 3, device='tpu:1', requires_grad=True)\n"
        "(x @ w).square().sum().backward()\n"
        "ref = torch.ones(3) @ w.detach().cpu()\n"
        "torch.testing.assert_close(x.grad.cpu(), 2 * (w.detach().cpu() @ ref))\n"
        "assert x.grad.device == torch.device('tpu:1') and w.grad.device == torch.device('tpu:1')\n"
        "torch.accelerator.set_device_index(1)\n"
        "assert torch.accelerator.current_device_index() == 1 == torch.tpu.current_device()\n"
        "torch.tpu.set_device(0)\n"
        "assert torch.accelerator.current_device_index() == 0\n"
        "with torch.accelerator.device_index(1):\n"
        "    assert torch.tpu.current_device() == 1 and torch.ones(1, device='tpu').device.index == 1\n"
        "assert torch.tpu.current_device() == 0\n"
        "print('ok')\n",
        TORCHTPU_NUM_DEVICES="2",
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_jax_tracebacks_are_off_unless_asked_for():
    """jaxlib keeps a Python traceback on every array it makes (a stack walk per eager op): off once
    the device is up, on again with TORCHTPU_JAX_TRACEBACKS=1; results are the same either way.
    This process (the device up under the run's own environment) is the first case; a fresh
    interpreter with the variable set, the second (one interpreter less: ~25 s of a loaded 2-core run)."""
    import torch
    from jax._src.lib import _jax

    x = torch.arange(6.0, device="tpu")
    assert (x * 2).sum().item() == 30.0
    assert _jax.tracebacks_enabled() is bool(config.get("TORCHTPU_JAX_TRACEBACKS"))
    code = (
        "import torch, torchtpu; from jax._src.lib import _jax; "
        "x = torch.arange(6.0, device='tpu'); assert (x * 2).sum().item() == 30.0; "
        "print(_jax.tracebacks_enabled())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TORCHTPU_JAX_TRACEBACKS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True"


README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")


def _readme_environment_rows():
    """variable name -> its row in the README's "## Environment" table (first cell: the name)."""
    import re

    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## Environment\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = re.match(r"\| `(TORCHTPU_[A-Z0-9_]+)[^|]*\|", line)
        if found:
            assert found.group(1) not in rows, f"README lists {found.group(1)} twice"
            rows[found.group(1)] = line
    return rows


def test_readme_environment_table_lists_every_variable():
    """One table, one row per variable, the same set as config.VARIABLES: neither can drift."""
    rows = _readme_environment_rows()
    missing = sorted(set(config.VARIABLES) - set(rows))
    unknown = sorted(set(rows) - set(config.VARIABLES))
    assert not missing and not unknown, (
        f"README.md's Environment table lacks {missing} and lists {unknown} that config.VARIABLES does not define"
    )
    for name, (kind, _default, choices, _meaning) in config.VARIABLES.items():
        if kind == "choice":  # every accepted value is documented (an alias like cuda for gpu included)
            absent = [c for c in choices if f"`{c}`" not in rows[name]]
            assert not absent, f"README.md's row for {name} does not mention {absent}"
    for alias in config.ALIASES:  # TorchTPU's names are documented next to ours
        assert alias in "".join(rows.values()), f"README.md's Environment table does not mention {alias}"


def _environment_names_in_source():
    """(read, set): the literal environment variable names src/torchtpu reads and sets, found in the
    syntax tree (os.environ[...], .get/.pop/.setdefault, os.getenv, `in os.environ`, and names bound
    to os.environ). TORCHTPU_* variables are read through config.get with a name, not a literal."""
    import ast
    import pathlib
    import re

    read, written = set(), set()
    for path in pathlib.Path(config.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        environ = {"os.environ"} | {
            ast.unparse(t)
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign)
            for t in n.targets
            if ast.unparse(n.value) == "os.environ"
        }
        for node in ast.walk(tree):
            key, into = None, read
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                if ast.unparse(func) == "os.getenv":
                    key = node.args[0]
                elif isinstance(func, ast.Attribute) and ast.unparse(func.value) in environ:
                    key, into = node.args[0], (written if func.attr == "setdefault" else read)
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in environ:
                key, into = node.slice, (written if isinstance(node.ctx, ast.Store) else read)
            elif isinstance(node, ast.Compare) and ast.unparse(node.comparators[0]) in environ:
                key = node.left
            if isinstance(key, ast.Constant) and re.fullmatch(r"[A-Z][A-Z0-9_]+", str(key.value)):
                into.add(key.value)
    return read, written


def test_readme_lists_every_other_environment_variable():
    """Besides config.VARIABLES, the README's Environment section lists exactly the variables the code
    reads or sets by name: nothing missing, nothing the code does not touch."""
    import re

    read, written = _environment_names_in_source()
    assert read and written, "the scan found nothing: it no longer matches how the code reads os.environ"
    assert not {n for n in read if n.startswith(("TORCHTPU_", "TORCH_TPU_"))}, "read through config.get"
    with open(README, encoding="utf-8") as f:
        section = f.read().split("\n## Environment\n", 1)[1].split("\n## ", 1)[0]
    listed = set()
    for line in section.split("Other variables", 1)[1].splitlines():
        if line.startswith(("- ", "  ")):
            listed |= set(re.findall(r"`([A-Z][A-Z0-9_]+)`", line))
    listed -= set(config.VARIABLES)  # (a bullet may name one of the table's variables)
    touched = (read | written) - set(config.VARIABLES)
    assert listed == touched, f"README lacks {sorted(touched - listed)}; lists {sorted(listed - touched)}"
