"""Why a compiled graph compiles again: the differences between two call keys, logged."""

from __future__ import annotations

import logging
import sys

import torch

log = logging.getLogger("torchtpu.compile")


def _inputs_of_key(key):
    """The per-input parts of a call key (tensor parts start with their dtype; see _key)."""
    return [p for p in key if isinstance(p[0], torch.dtype) or p[0] in ("C", "S", "V")]


def log_recompile(graph, old, new):
    reasons = []
    if old is None:
        reasons.append("first signature")
    else:
        oi, ni = _inputs_of_key(old), _inputs_of_key(new)
        if len(oi) != len(ni):
            reasons.append(f"number of inputs {len(oi)} -> {len(ni)}")
        for i, (a, b) in enumerate(zip(oi, ni)):
            if a != b:
                reasons.append(
                    f"input {i}: " + _tensor_change(a, b)
                    if isinstance(a[0], torch.dtype) and isinstance(b[0], torch.dtype)
                    else f"input {i}: {a[1:]} -> {b[1:]}"
                )
        if old[-1] != new[-1]:
            reasons.append(f"float32 matmul precision {old[-1][1]} -> {new[-1][1]}")
        if not reasons:
            reasons.append("input storages changed")
    msg = (
        f"torchtpu: recompiling graph {graph.id} ({graph.kind}, {len(graph.cache)} signature(s) cached): "
        + "; ".join(reasons)
    )
    log.warning(msg)
    print(msg, file=sys.stderr)


def _tensor_change(a, b):
    """What differs between two tensor keys (dtype, shape, stride, offset, slot, storage dtype, storage shape)."""
    what = []
    if a[0] != b[0]:
        what.append(f"dtype {a[0]} -> {b[0]}")
    if a[1] != b[1]:
        what.append(f"shape {list(a[1])} -> {list(b[1])}")
    if a[2] != b[2] or a[3] != b[3]:
        what.append(f"layout stride={a[2]} offset={a[3]} -> stride={b[2]} offset={b[3]}")
    if a[4] != b[4]:
        what.append("storage sharing with other inputs changed")
    if a[5:] != b[5:]:
        what.append(f"storage {list(a[6])} of {a[5]} -> {list(b[6])} of {b[5]}")
    return ", ".join(what or ["storage changed"])
