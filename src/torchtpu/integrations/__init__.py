"""Integrations with PyTorch's own extension points and the libraries on top of it.

`install()` is cheap and imports none of those libraries: every change to another library's code
lives in `patches.py` (with the releases it was checked against); patches of libraries that are not
imported yet are applied when (and if) they are. See docs/transformers.md.
"""

from __future__ import annotations


def install() -> None:
    from . import patches

    patches.install()


__all__ = ["install"]
