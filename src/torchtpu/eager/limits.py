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

# Two of JAX's Python memo caches, of traced jaxprs and of jit parameters, keep each compiled
# program's trace and lowering alive together (~1.2 MB of host memory per program on XLA:CPU), which
# a compiled executable no longer needs: each op's jitted function keeps its executable in its own C++
# cache, which clearing them leaves alone. Shedding them every SHED_EVERY new executables takes a
# real-size eager decode's peak RSS down by ~240 MB; the price is ~5% more time for first calls,
# which re-trace JAX's own helpers after a shed (benchmarks/RESULTS.md; checked with jax 0.10.2).
SHED_EVERY = 16
try:  # (private to JAX: where they are gone, the memory is merely kept)
    from jax._src.interpreters.partial_eval import trace_to_jaxpr as _jaxpr_memo
    from jax._src.pjit import _infer_params_cached as _jit_params_memo

    _MEMO_CACHES = tuple(c for c in (_jaxpr_memo, _jit_params_memo) if hasattr(c, "cache_clear"))
except ImportError:
    _MEMO_CACHES = ()


def _shed_jax_memo_caches():
    for cache in _MEMO_CACHES:
        cache.cache_clear()
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
