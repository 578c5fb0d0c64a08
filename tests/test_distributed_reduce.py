"""The reductions of torchtpu.distributed (distributed/collectives.py `_reduce`, reduce-scatter): every
torch.distributed ReduceOp x every dtype gloo reduces, over 2 and 3 ranks (host devices of this process,
one shard each), against CPU arithmetic. The host's programs and the TPU's (64-bit MAX/MIN as two 32-bit
all-reduces, float64 reduce-scatter as an all-reduce and a slice: XLA:TPU lowers neither directly) are
both run here, the TPU's forced with `platform.tracing_for("tpu")`; with libtpu, XLA:TPU compiles them."""

from __future__ import annotations

import contextlib

import jax
import numpy as np
import pytest
import torch
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from torch.testing import assert_close

from torchtpu.device import platform
from torchtpu.distributed import collectives
from torchtpu.ops import dtypes

DTYPES = [
    torch.int64,
    torch.uint8,
    torch.int8,
    torch.int32,
    torch.bool,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,  # (reduce_scatter_tensor passes complex tensors as they are; all_reduce as real views)
    torch.complex128,
]
OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
N = 24  # elements per rank


def _defined(op, dtype):
    """The (op, dtype) pairs gloo reduces (it refuses bitwise ops of floats and averages of integers)."""
    if dtype.is_complex:
        return op in ("SUM", "AVG")
    if op in ("BAND", "BOR", "BXOR"):
        return not dtype.is_floating_point
    if op == "AVG":
        return dtype.is_floating_point
    return True


def _inputs(dtype, ranks, seed):
    """Each rank's values: random, plus (64-bit) values past 2**32, negatives, values whose high 32-bit
    words are equal on every rank and differ only in the low word (and vice versa), and the extremes."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return [torch.rand(N, generator=g) > 0.5 for _ in range(ranks)]
    if dtype.is_complex:
        return [torch.randn(N, generator=g, dtype=dtype) * 3 for _ in range(ranks)]
    if dtype.is_floating_point:
        xs = [(torch.randn(N, generator=g, dtype=torch.float64) * 3) for _ in range(ranks)]
        if dtype == torch.float64:
            for r, x in enumerate(xs):  # equal high words, low words differing; signed zeros; infinities
                x[:4] = torch.tensor([1.0 + r * 2**-50, -(1.0 + r * 2**-50), 0.0 if r else -0.0, -1e300 * (r + 1)])
                x[4] = float("inf") if r == ranks - 1 else float("-inf")
                x[5] = 2.0**40 + r
        return [x.to(dtype) for x in xs]
    info = torch.iinfo(dtype)
    if dtype != torch.int64:
        return [torch.randint(info.min, info.max + 1, (N,), generator=g, dtype=dtype) for _ in range(ranks)]
    xs = [torch.randint(-(2**62), 2**62, (N,), generator=g, dtype=torch.int64) for _ in range(ranks)]
    small = [torch.randint(-50, 50, (4,), generator=g) for _ in range(ranks)]
    for r, x in enumerate(xs):
        x[:4] = small[r]  # near zero: high words 0 and -1
        x[4] = (7 << 32) + r * 5  # equal high words, the low words decide
        x[5] = -(7 << 32) + (ranks - r) * 5  # the same with a negative high word
        x[6] = ((r + 1) << 32) + (0xFFFFFFFF - r)  # the high words decide against the low words
        x[7] = info.max if r == 0 else info.min
        x[8] = -(2**33) - r  # negative, past 2**32
        x[9] = 2**32 + r  # just past 2**32
    return xs


def _reference(xs, op):
    """What gloo gives: torch's CPU arithmetic over the ranks' tensors."""
    s = torch.stack(xs)
    if s.dtype == torch.bool:
        b = s.to(torch.uint8)
        any_, all_ = b.amax(0).bool(), b.amin(0).bool()
        return {
            "SUM": any_,
            "MAX": any_,
            "BOR": any_,
            "MIN": all_,
            "PRODUCT": all_,
            "BAND": all_,
            "BXOR": (b.sum(0) % 2).bool(),
        }[op]
    if op == "SUM":
        return s.sum(0, dtype=s.dtype)
    if op == "AVG":
        return (s.sum(0, dtype=s.dtype) / len(xs)).to(s.dtype)
    if op == "PRODUCT":
        return s.prod(0, dtype=s.dtype)
    if op == "MAX":
        return s.amax(0)
    if op == "MIN":
        return s.amin(0)
    fold = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
    out = xs[0]
    for x in xs[1:]:
        out = fold(out, x)
    return out


def _mesh(ranks):
    devices = [platform.jax_device(i) for i in range(ranks)]
    mesh = Mesh(np.array(devices, dtype=object), (collectives.AXIS,))
    return mesh, NamedSharding(mesh, P(collectives.AXIS))


def _body(kind, ops, ranks):
    """One program for every op of `ops`: collective `kind` with each, on the same input."""
    bodies = [collectives._body(kind, (op,), ranks) for op in ops]
    return lambda x: tuple(b(x) for b in bodies)


def _program(kind, ops, ranks):
    mesh, _ = _mesh(ranks)
    check = {"check_vma": False} if collectives._has_check_vma() else {"check_rep": False}
    spec = P(collectives.AXIS)
    return jax.jit(collectives._shard_map(_body(kind, ops, ranks), mesh=mesh, in_specs=spec, out_specs=spec, **check))


def _run(kind, ops, xs, lowering):
    """Collective `kind` with each of `ops` over the ranks' tensors xs, traced for `lowering` ("host", or
    "tpu": the TPU's branches); {op: each rank's result as a CPU tensor}. Two ranks are two host devices
    under a `shard_map` (XLA's all-reduce runs); more ranks than devices are a `vmap` over a named axis."""
    ranks = len(xs)
    host = [dtypes.numpy_from_cpu(x) for x in xs]
    with platform.tracing_for("tpu") if lowering == "tpu" else contextlib.nullcontext():
        if ranks > platform.device_count():
            outs = jax.jit(jax.vmap(_body(kind, ops, ranks), axis_name=collectives.AXIS))(np.stack(host))
            results = [[out[r] for r in range(ranks)] for out in outs]
        else:
            _, sharding = _mesh(ranks)
            shards = [jax.device_put(h, platform.jax_device(r)) for r, h in enumerate(host)]
            arr = jax.make_array_from_single_device_arrays((ranks * N,), sharding, shards)
            outs = _program(kind, ops, ranks)(arr)
            results = [[out.addressable_data(r) for r in range(ranks)] for out in outs]
    return {op: [dtypes.cpu_from_numpy(np.array(a), xs[0].dtype) for a in res] for op, res in zip(ops, results)}


def _tolerance(xs, op):
    """Exact, except float sums and products: XLA may add the ranks in another order than gloo's
    one-after-the-other, or round 16-bit sums once instead of at each step; a few roundings apart."""
    dtype = xs[0].dtype
    if not ((dtype.is_floating_point or dtype.is_complex) and op in ("SUM", "AVG", "PRODUCT")):
        return {"rtol": 0, "atol": 0}
    eps = torch.finfo(dtype).eps * len(xs)
    scale = torch.stack(xs).abs().double().nan_to_num(posinf=0.0).amax().item()
    return {"rtol": eps, "atol": eps * (scale if op != "PRODUCT" else scale ** len(xs))}


def _cases():
    """Every dtype x (all-reduce over 2 ranks, reduce-scatter) x (host, tpu); 3 ranks by default only
    for the 64-bit types on the TPU's path (the 32-bit words), the rest under -m slow."""
    for dtype in DTYPES:
        for kind, ranks in (("all_reduce", 2), ("all_reduce", 3), ("reduce_scatter", 2)):
            for lowering in ("host", "tpu"):
                wide = dtype in (torch.int64, torch.float64) and lowering == "tpu"
                marks = [pytest.mark.slow] if ranks == 3 and not wide else []
                yield pytest.param(dtype, kind, ranks, lowering, marks=marks, id=f"{dtype}-{kind}-{ranks}-{lowering}")


@pytest.mark.parametrize("dtype,kind,ranks,lowering", list(_cases()))
def test_reductions_match_cpu(dtype, kind, ranks, lowering):
    ops = [op for op in OPS if _defined(op, dtype)]
    xs = _inputs(dtype, ranks, seed=10 * ranks + len(kind))
    for op, results in _run(kind, ops, xs, lowering).items():
        want = _reference(xs, op)
        for r, got in enumerate(results):
            assert_close(
                got,
                want.chunk(ranks)[r] if kind == "reduce_scatter" else want,
                equal_nan=True,
                **_tolerance(xs, op),
                msg=lambda m, op=op, r=r: f"{kind} {op} {dtype} rank {r}: {m}",
            )


def test_64_bit_extremes_use_32_bit_words_on_tpu_only():
    """The TPU's program has no 64-bit max/min all-reduce (XLA:TPU lowers only sums of 64 bits); the
    host's keeps the one all-reduce."""
    x = jax.ShapeDtypeStruct((2 * N,), np.int64, sharding=_mesh(2)[1])
    host = _program("all_reduce", ["MAX"], 2).trace(x).jaxpr
    with platform.tracing_for("tpu"):
        tpu = _program("all_reduce", ["MAX"], 2).trace(x).jaxpr
    assert "pmax" in str(host) and "i64[" in str(host)
    text = str(tpu)
    assert text.count("pmax") == 2 and "i32[" in text and "u32[" in text


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reductions_compile_for_tpu(dtype, monkeypatch):
    """XLA:TPU compiles every reduction of `dtype` (all-reduce and reduce-scatter, one program) for 2
    devices of a v5e; before the 32-bit words, int64 and float64 MAX/MIN did not compile."""
    pytest.importorskip("libtpu", reason="the TPU compile check needs libtpu (pip install torchtpu[tpu-check])")
    if dtype == torch.complex128:
        pytest.skip("XLA:TPU (libtpu 0.0.52) crashes on any multi-device program with complex128 arrays (docs/tpu.md)")
    from torchtpu.eager import tpu_check

    monkeypatch.setenv("TORCHTPU_TPU_COMPILE_CHECK", "v5e:2x2")
    ops = [op for op in OPS if _defined(op, dtype)]
    mesh, sharding = _mesh(2)
    check = {"check_vma": False} if collectives._has_check_vma() else {"check_rep": False}
    spec = P(collectives.AXIS)
    both = [_body("all_reduce", ops, 2), _body("reduce_scatter", ops, 2)]
    program = jax.jit(
        collectives._shard_map(lambda x: both[0](x) + both[1](x), mesh=mesh, in_specs=spec, out_specs=spec, **check)
    )
    x = jax.ShapeDtypeStruct((2 * N,), dtypes.to_jax(dtype), sharding=sharding)
    tpu_check.check(program, (x,), f"test: every reduction of {dtype}")  # raises TpuCompileCheckError
