"""Imports inside torchtpu point down the layer order of docs/design.md ("Layers"), never up.

Every `import` and `from ... import` of a torchtpu module is checked, at module level and inside
functions alike (a function-level import is a dependency all the same, only a later one)."""

from __future__ import annotations

import ast
import pathlib
import sys

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "src" / "torchtpu"

# lowest first; a module may import modules of its own layer or of a lower one
LAYERS = [
    {"metrics", "_import_hooks", "config"},  # counters, import hooks, TORCHTPU_* variables: no torchtpu imports
    {"device"},
    {"storage"},
    {"ops"},
    {"eager"},
    {"compile"},
    {"distributed", "kernels", "optim", "profiling"},
    {"integrations"},
    {"__init__", "__main__", "api"},  # the package's entry points and the torch.tpu facade
]
LEVEL = {name: i for i, names in enumerate(LAYERS) for name in names}

# Upward imports that remain, each with why (none today). Every entry would be a debt.
EXCEPTIONS: set = set()


def _top(module_path: pathlib.Path) -> str:
    rel = module_path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imported(path: pathlib.Path, tree: ast.AST):
    """(line, top-level torchtpu subpackage) of each torchtpu import in the module."""
    package_parts = list(path.relative_to(PACKAGE).parent.parts)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - (node.level - 1)] if node.level > 1 else package_parts
                target = base + (node.module.split(".") if node.module else [])
                if not target:  # `from . import x` at the package root
                    target = [node.names[0].name]
                elif not node.module and len(target) == len(base):
                    target = target + [node.names[0].name]
            elif node.module and node.module.split(".")[0] == "torchtpu":
                target = node.module.split(".")[1:] or [node.names[0].name]
            else:
                continue
            yield node.lineno, target[0]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "torchtpu" and len(parts) > 1:
                    yield node.lineno, parts[1]


def violations():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        here = _top(path)
        if here not in LEVEL:
            found.append(f"{rel}: not in any layer (add it to LAYERS and docs/design.md)")
            continue
        for line, target in _imported(path, ast.parse(path.read_text(), str(path))):
            if target not in LEVEL:
                continue  # a module of the package root not listed (caught by its own file)
            if LEVEL[target] > LEVEL[here] and (rel, target) not in EXCEPTIONS:
                found.append(f"{rel}:{line} imports {target} (layer {LEVEL[target]}) from layer {LEVEL[here]}")
    return found


def test_imports_point_down():
    assert violations() == []


# Folders whose modules import one another one way only: no circle, function-level imports counted.
ACYCLIC_FOLDERS = [
    "api",
    "compile",
    "device",
    "distributed",
    "eager",
    "integrations",
    "kernels",
    "ops",
    "optim",
    "profiling",
    "storage",
]


def _sibling_imports(path: pathlib.Path, tree: ast.AST) -> set:
    """The modules of `path`'s own folder that it imports."""
    folder = path.parent
    dotted = "torchtpu." + ".".join(folder.relative_to(PACKAGE).parts) + "."
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(dotted):
            names = [node.module[len(dotted) :].split(".")[0]]
        elif isinstance(node, ast.Import):
            names = [a.name[len(dotted) :].split(".")[0] for a in node.names if a.name.startswith(dotted)]
        else:
            continue
        found.update(n for n in names if (folder / f"{n}.py").exists() and n != path.stem)
    return found


def import_circles(folder: str):
    """Each circle of imports among the modules of `folder`, as a list of module names."""
    graph = {
        path.stem: _sibling_imports(path, ast.parse(path.read_text(), str(path)))
        for path in sorted((PACKAGE / folder).glob("*.py"))
    }
    circles, done = [], set()

    def visit(module, trail):
        if module in trail:
            circles.append(trail[trail.index(module) :] + [module])
            return
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, trail + [module])
        done.add(module)

    for module in graph:
        visit(module, [])
    return circles


def test_no_import_circles_in_acyclic_folders():
    assert {folder: import_circles(folder) for folder in ACYCLIC_FOLDERS} == {f: [] for f in ACYCLIC_FOLDERS}


def test_exceptions_are_still_needed():
    """An exception no import needs any more is removed from the list."""
    saved = set(EXCEPTIONS)
    try:
        for exc in saved:
            EXCEPTIONS.discard(exc)
            assert violations(), f"{exc} is no longer needed: remove it from EXCEPTIONS"
            EXCEPTIONS.add(exc)
    finally:
        EXCEPTIONS.clear()
        EXCEPTIONS.update(saved)


def test_the_circle_finder_sees_a_circle(tmp_path, monkeypatch):
    # the finder must report a circle, or its silence means nothing
    folder = tmp_path / "loop"
    folder.mkdir()
    (folder / "a.py").write_text("from . import b\n")
    (folder / "b.py").write_text("def f():\n    from .a import x\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert import_circles("loop") == [["a", "b", "a"]]


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    code = "def f():\n    from ..compile import backend\n    import torchtpu.eager.engine\n"
    tree = ast.parse(code)
    fake = PACKAGE / "ops" / "fake.py"
    assert [t for _, t in _imported(fake, tree)] == ["compile", "eager"]
