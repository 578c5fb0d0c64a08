"""Integrations with libraries on top of PyTorch (Hugging Face Transformers, Accelerate).

`install()` is cheap and imports none of those libraries: it arranges for small adjustments to
be made when (and if) they are imported. See docs/transformers.md.
"""
from __future__ import annotations


def install() -> None:
    from . import accelerate, tied_parameters
    from ..ops import misc  # noqa: F401  (fused optimizer steps; idempotent once ops/__init__ imports it)
    tied_parameters.install()
    accelerate.install()


__all__ = ["install"]
