"""Counters of what the backend did: compilations, cache hits, transfers. `torchtpu.metrics()`."""
from __future__ import annotations


class Counters:
    __slots__ = ("eager_compiles", "eager_cache_hits", "h2d_bytes", "d2h_bytes", "h2d_transfers",
                 "d2h_transfers", "cpu_fallbacks", "compiled_graphs", "compiled_xla_compiles",
                 "compiled_cache_hits", "fused_ops", "fused_compiles", "fused_runs", "fused_cold_ops", "fused_compile_failures",
                 "executables_forgotten", "eager_constants_reused", "eager_donations",
                 "eager_results_reused")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}


counters = Counters()


def metrics() -> dict:
    """A snapshot of the counters (a plain dict)."""
    return counters.as_dict()


def reset_metrics():
    for name in Counters.__slots__:
        setattr(counters, name, 0)
