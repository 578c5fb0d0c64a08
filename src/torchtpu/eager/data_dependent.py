"""Ops whose output shape depends on values (nonzero, masked_select, unique, ...): eager only.

They run on the device in two steps: a small executable computes the size (a sync point, as on
CUDA), then a second one, compiled for that size, computes the values.
"""
from __future__ import annotations


def register(impl):
    """Called by kernels.register_all with `impl(name_or_op, fn)` to add PrivateUse1 kernels."""
