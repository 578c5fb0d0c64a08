"""torch.compile backend "tpu" (see backend.py) and its options (`torch.tpu.compiler`).

Importing this package registers the backend with Dynamo (which imports torch._dynamo, about a
second or more); the `torch_dynamo_backends` entry point registers it lazily instead.
"""
from __future__ import annotations

from . import options  # noqa: F401


def tpu_backend(gm, example_inputs, **kwargs):
    """Entry point of the `torch_dynamo_backends` group (imports the backend on first use)."""
    from .backend import tpu_backend as backend
    return backend(gm, example_inputs, **kwargs)


def register():
    from .backend import register as _register
    _register()


register()
