"""Run a function right after a module is imported, without importing it ourselves.

`when_imported("accelerate.state", patch)` calls `patch(module)` now if the module is loaded,
else once its import finishes. Importing torch stays as cheap as before: nothing is imported here.

A module can be in `sys.modules` while its own code still runs: `transformers.modeling_utils`
imports torch, which loads torchtpu, which asks for it. Its classes are not defined yet, so the
call waits until the module has finished, noticed at the next import anywhere.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_pending: dict[str, list] = {}
_unfinished: list[tuple[object, object]] = []  # (module still executing, fn)


def _initializing(module) -> bool:
    # importlib marks a module's spec while the module's code runs (CPython's import system).
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def run_finished() -> None:
    """Call the functions waiting for modules that have finished importing since they asked."""
    if not _unfinished:
        return
    ready = [(m, fn) for m, fn in _unfinished if not _initializing(m)]
    for entry in ready:
        _unfinished.remove(entry)
    for module, fn in ready:
        fn(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        run_finished()
        if name not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            for fn in _pending.pop(name, ()):
                fn(module)

        # A per-spec wrapper loader, so the shared loader object is not modified.
        spec.loader = _Loader(loader, exec_and_patch)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, exec_module):
        self._inner = inner
        self.exec_module = exec_module

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def __getattr__(self, item):
        return getattr(self._inner, item)


_finder = _Finder()


def when_imported(name: str, fn) -> None:
    module = sys.modules.get(name)
    if module is not None and not _initializing(module):
        fn(module)
        return
    if module is not None:
        _unfinished.append((module, fn))
    else:
        _pending.setdefault(name, []).append(fn)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
