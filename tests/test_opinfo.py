"""tpu vs CPU parity over PyTorch's OpInfo database (see tests/opinfo_support.py).

Default run: a representative subset (elementwise arithmetic with PyTorch's integer rules, unary
math, comparisons, reductions, scans, sorting, linalg, foreach, factories) at float32, int64 and
bfloat16 plus float32 gradients; a few minutes on 2 cores.
Full sweep: `pytest -m slow tests/test_opinfo.py` (every in-scope OpInfo, every CPU dtype among
float32, bfloat16, float16, float64, int64, int32, uint8, bool). `python tools/op_coverage.py`
runs the same checks in chunked subprocesses and writes docs/op_coverage.md.
"""
from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import opinfo_support as S

OPS = {S.op_id(op): op for op in op_db}

FAST_OPS = [
    "add", "sub", "mul", "div.no_rounding_mode", "div.trunc_rounding", "div.floor_rounding",
    "floor_divide", "remainder", "fmod", "pow", "bitwise_left_shift", "bitwise_right_shift",
    "neg", "abs", "exp", "log1p", "sigmoid", "tanh", "rsqrt", "atan2", "clamp", "where", "lerp",
    "addcmul", "addcdiv", "eq", "logical_xor", "isnan",
    "sum", "mean", "prod", "amax", "argmax", "max.reduction_with_dim", "var", "std", "logsumexp",
    "cumsum", "cumprod", "logcumsumexp", "cummax", "sort", "topk", "kthvalue", "searchsorted",
    "matmul", "addmm", "_foreach_add", "_foreach_addcdiv", "_foreach_norm", "arange", "full",
]
FAST_DTYPES = [torch.float32, torch.int64, torch.bfloat16]


def _params(names, dtypes, max_per_op=None):
    out = []
    for name in names:
        op = OPS[name]
        why = S.out_of_scope(name)
        if why:
            out.append(pytest.param(op, torch.float32, "forward", id=f"{name}-out_of_scope",
                                    marks=pytest.mark.skip(reason=why)))
            continue
        for dtype in S.cpu_dtypes(op):
            if dtype not in dtypes:
                continue
            for kind in S.kinds_for(op, dtype):
                out.append(pytest.param(op, dtype, kind, id=f"{name}-{str(dtype)[6:]}-{kind}"))
    return out


def _run(op, dtype, kind, max_samples):
    r = S.check(op, dtype, kind, max_samples=max_samples, timeout=90)
    if r.status in ("n/a", "no_samples"):
        pytest.skip(r.reason or "not applicable")
    assert r.status == "pass", f"{S.op_id(op)} {dtype} {kind}: {r.status}: {r.reason}"


@pytest.mark.parametrize("op,dtype,kind", _params(FAST_OPS, FAST_DTYPES))
def test_opinfo_fast(op, dtype, kind):
    _run(op, dtype, kind, max_samples=2)


@pytest.mark.slow
@pytest.mark.parametrize("op,dtype,kind", _params(list(OPS), S.DTYPES))
def test_opinfo_sweep(op, dtype, kind):
    _run(op, dtype, kind, max_samples=3)


def test_harness_detects_wrong_results(monkeypatch):
    """The comparison must be able to fail: a deliberately wrong lowering is caught."""
    from torchtpu.ops import table

    low = table.LOWERINGS["neg.default"]
    wrong = type(low)(low.name, lambda a: a, low.promote, low.promote_args, low.random,
                      low.keep_result_dtype, low.mutates)
    monkeypatch.setitem(table.LOWERINGS, "neg.default", wrong)
    from torchtpu.eager.kernels import KERNELS
    for k in KERNELS.values():
        if k.name == "neg.default":
            monkeypatch.setattr(k, "cache", {})
    r = S.check(OPS["neg"], torch.float32, "forward", max_samples=1)
    assert r.status == "fail", r


def test_out_of_scope_is_explicit():
    """Every OpInfo either runs or has a stated reason; complex-only ops have no dtype to run."""
    for name, op in OPS.items():
        why = S.out_of_scope(name)
        assert why is None or len(why) > 10
    assert S.out_of_scope("linalg.svd") and S.out_of_scope("to_sparse") and S.out_of_scope("fft.fft")
    assert S.out_of_scope("linalg.vector_norm") is None and S.out_of_scope("sum") is None
