"""How many executables the process holds, and forgetting them all when they crowd its memory map.

The modules that keep executables (the engine's kernels, the C++ fast path, the fused segments)
register how to forget theirs in FORGETTERS; `note_executable` counts each new one."""

from __future__ import annotations

import jax

from ..metrics import counters

# XLA:CPU maps each loaded executable into memory with about three mappings, and Linux caps a process
# at vm.max_map_count (65530 by default): a process that builds ~20,000 executables (a long test
# run, an op sweep, a server seeing many shapes) would abort inside XLA. Every CHECK_EVERY new
# executables the process's mappings are counted; past half the cap, every cached eager executable
# (and JAX's own caches) is forgotten at once, and those still needed come back from the persistent
# compilation cache. Where /proc is missing, MAX_EXECUTABLES stands in for the count.
CHECK_EVERY = 256
MAX_EXECUTABLES = 6000
_executables = [0, 0, 0]  # since the last check, since the last forget, since the last shed

# JAX's Python-side memo caches (traced jaxprs, jit parameters, and through them each program's
# lowering) keep ~1.2 MB per compiled program alive on XLA:CPU, which a compiled executable no
# longer needs: each op's jitted function keeps its executable in its own C++ cache, which
# `jax._src.util.clear_all_caches` (unlike `jax.clear_caches`) leaves alone. Shedding them every
# SHED_EVERY new executables takes a decode's ~200 executables from ~1.4 to ~0.2 MB each of host
# memory (checked with jax 0.10.2); the price is re-tracing JAX's own helpers once after each shed.
SHED_EVERY = 64


try:
    from jax._src.util import clear_all_caches as _clear_jax_memo_caches
except ImportError:  # (private to JAX: where it is gone, the memory is merely kept)
    _clear_jax_memo_caches = None


def _shed_jax_memo_caches():
    if _clear_jax_memo_caches is not None:
        _clear_jax_memo_caches()
        counters.jax_memo_caches_shed += 1


def _map_limit():
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


_MAP_LIMIT = _map_limit()


def note_executable():
    _executables[0] += 1
    _executables[1] += 1
    _executables[2] += 1
    if _executables[2] >= SHED_EVERY:
        _executables[2] = 0
        _shed_jax_memo_caches()
    if _executables[0] < CHECK_EVERY:
        return
    _executables[0] = 0
    crowded = _executables[1] > MAX_EXECUTABLES
    if _MAP_LIMIT is not None:
        try:
            with open("/proc/self/maps", "rb") as f:
                crowded = f.read().count(b"\n") > _MAP_LIMIT // 2
        except OSError:  # no /proc (not Linux): the executable count above decides alone
            pass
    if crowded:
        forget_executables()


# how to drop each cache of executables: registered by the modules that keep them
FORGETTERS: list = []


def forget_executables():
    """Drop every cached eager executable (and fused segment), freeing their device code."""
    for forget in FORGETTERS:
        forget()
    jax.clear_caches()
    _executables[1] = 0
    counters.executables_forgotten += 1
