"""Counters of what the backend did: compilations, cache hits, transfers. `torchtpu.metrics()`."""

from __future__ import annotations


class Counters:
    __slots__ = (
        "compiled_cache_hits",
        "compiled_graphs",
        "compiled_xla_compiles",
        "cpu_fallbacks",
        "d2h_bytes",
        "d2h_transfers",
        "eager_cache_hits",
        "eager_compiles",
        "eager_constants_reused",
        "eager_donations",
        "eager_results_reused",
        "executables_forgotten",
        "fused_cold_ops",
        "fused_compile_failures",
        "fused_compiles",
        "fused_ops",
        "fused_runs",
        "h2d_bytes",
        "h2d_transfers",
        "jax_memo_caches_shed",
        "op_store_errors",
        "op_store_hits",
        "op_store_writes",
    )

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
