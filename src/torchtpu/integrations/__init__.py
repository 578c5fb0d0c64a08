"""Integrations with libraries on top of PyTorch (Hugging Face Transformers, Accelerate).

`install()` is cheap and imports none of those libraries: it arranges for small adjustments to
be made when (and if) they are imported: DataLoader pinning is skipped for "tpu", Accelerate's
default device is "tpu". See docs/transformers.md.
"""
from __future__ import annotations


def install() -> None:
    from . import accelerate, dataloader
    dataloader.install()
    accelerate.install()


__all__ = ["install"]
