"""`x @ W.T` (every nn.Linear) contracts W as stored instead of transposing it (ops/linalg.py matmul):
the lowering's form, XLA:CPU's code for it, and results against the CPU in eager, fused and compiled
runs, forward and backward, for every dtype a linear layer takes; matmuls of mixed dtypes raise as
on the CPU."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import torchtpu
from torchtpu.device import platform
from torchtpu.eager import fusion
from torchtpu.ops import attention, linalg, views

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.complex64]


def _dots(fn, *args):
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    return jaxpr, [e for e in jaxpr.eqns if e.primitive is jax.lax.dot_general_p]


@pytest.mark.parametrize("x_shape", [(512,), (1, 512), (2, 3, 512)])
def test_a_transposed_weight_is_contracted_as_stored(x_shape):
    x, w = jnp.ones(x_shape, jnp.float32), jnp.ones((1024, 512), jnp.float32)
    jaxpr, (dot,) = _dots(lambda x, w: linalg.matmul(x, w.T), x, w)
    assert dot.invars[1] is jaxpr.invars[1]  # W itself, not its transpose
    assert dot.params["dimension_numbers"] == (((len(x_shape) - 1,), (1,)), ((), ()))
    assert dot.outvars[0].aval.shape == x_shape[:-1] + (1024,)


def test_a_transposed_batch_of_keys_is_contracted_as_stored():
    q, k = jnp.ones((2, 8, 3, 64), jnp.float32), jnp.ones((2, 8, 10, 64), jnp.float32)
    jaxpr, (dot,) = _dots(lambda q, k: linalg.matmul(q, jnp.swapaxes(k, -1, -2)), q, k)
    assert dot.invars[1] is jaxpr.invars[1]
    assert dot.params["dimension_numbers"] == (((3,), (3,)), ((0, 1), (0, 1)))
    # a graph's matmul decomposes into a reshape of the leading dims, then bmm
    jaxpr, (dot,) = _dots(
        lambda q, k: linalg.matmul(q.reshape(16, 3, 64), jnp.swapaxes(k, -1, -2).reshape(16, 64, 10)), q, k
    )
    assert not any(e.primitive is jax.lax.transpose_p and e.outvars[0] in dot.invars for e in jaxpr.eqns)
    assert dot.params["dimension_numbers"] == (((2,), (2,)), ((0,), (0,)))


def test_other_operands_keep_jnp_matmul_form():
    def same_as_jnp(transform, *shapes):
        args = [jnp.ones(s, jnp.float32) for s in shapes]
        ours = jax.make_jaxpr(lambda x, y: linalg.matmul(x, transform(y)))(*args)
        theirs = jax.make_jaxpr(lambda x, y: jnp.matmul(x, transform(y), precision=linalg.precision()))(*args)
        assert str(ours) == str(theirs)

    same_as_jnp(lambda w: w, (4, 512), (512, 1024))  # row-major W
    same_as_jnp(lambda y: jnp.swapaxes(y, 1, 2), (1, 4, 1024), (3, 512, 1024))  # broadcast batch
    same_as_jnp(lambda y: jnp.transpose(y, (1, 0, 2))[:3], (3, 4, 3), (3, 512, 1024))  # other dims
    same_as_jnp(lambda y: jnp.swapaxes(y, 1, 2).reshape(3, 512, 1024), (3, 4, 512), (3, 512, 1024))
    # concrete arrays (no trace) take jnp.matmul's form and give the same values
    a, b = np.random.randn(4, 512).astype(np.float32), np.random.randn(1024, 512).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(linalg.matmul(jnp.asarray(a), jnp.asarray(b).T)), a @ b.T, rtol=1e-4, atol=1e-4
    )


@pytest.mark.skipif(torchtpu.platform() != "cpu", reason="XLA:CPU's code for the eager view W.t()")
def test_the_eager_view_of_a_transposed_weight_compiles_without_a_transpose():
    # an eager op reads `W.t()` from W's flat storage (ops/views.py read); a residual add after the
    # product is the pattern that made XLA:CPU copy W transposed at every call inside fused segments
    layout = ((512, 1024), (1, 512), 0, jnp.float32, 1024 * 512)

    def step(flat_w, x, h):
        return h + linalg.matmul(jnp.where(x > 0, x, 0.5 * x), views.read(flat_w, layout))

    args = (jnp.ones(1024 * 512, jnp.float32), jnp.ones((1, 512), jnp.float32), jnp.ones((1, 1024), jnp.float32))
    hlo = jax.jit(step).lower(*args).compile().as_text()
    assert "transpose(" not in hlo


def _plain_dots(hlo):
    """The dots of an optimized XLA:CPU module that no YNNPACK fusion calls (Eigen's)."""
    ynn = set(re.findall(r"calls=%([\w.\-]+)[^\n]*__ynn_fusion", hlo))
    plain, comp = 0, None
    for line in hlo.splitlines():
        if line.endswith("{") and "%" in line:
            comp = line.split("%", 1)[1].split(" ", 1)[0]
        elif " dot(" in line and comp not in ynn:
            plain += 1
    return plain


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_a_transposed_lhs_is_laid_out_for_the_host_dot(dtype):
    # the weight gradient t(dY) @ X: on XLA:CPU the transpose stays a copy behind an optimization
    # barrier, so YNNPACK runs the dot (a transpose folded into the dot went to Eigen's, slower)
    dy, x = jnp.ones((64, 96), dtype), jnp.ones((64, 48), dtype)
    with platform.tracing_for("cpu"):
        jaxpr, (dot,) = _dots(lambda dy, x: linalg.matmul(dy.T, x), dy, x)
        barrier = next(e for e in jaxpr.eqns if e.primitive.name == "optimization_barrier")
        assert dot.invars[0] is barrier.outvars[0]
        assert dot.params["dimension_numbers"][0] == ((1,), (0,))
        if dtype == jnp.float32:  # a float32 matrix-vector product is not YNNPACK's (bf16 gains a column)
            jaxpr, _ = _dots(lambda dy, x: linalg.matmul(dy.T, x[:, :1]), dy, x)
            assert not any(e.primitive.name == "optimization_barrier" for e in jaxpr.eqns)
    with platform.tracing_for("tpu"):
        jaxpr, _ = _dots(lambda dy, x: linalg.matmul(dy.T, x), dy, x)
        assert not any(e.primitive.name == "optimization_barrier" for e in jaxpr.eqns)
    a, b = np.random.randn(64, 96).astype(np.float32), np.random.randn(64, 48).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(jax.jit(lambda a, b: linalg.matmul(a.T, b))(a, b)), a.T @ b, rtol=1e-4, atol=1e-4
    )


@pytest.mark.skipif(torchtpu.platform() != "cpu", reason="XLA:CPU's dot libraries")
def test_attention_backward_products_run_in_the_host_dot_library():
    # attention's backward (grouped heads) on XLA:CPU: P.T @ dO and dS.T @ Q laid out for YNNPACK, no
    # product left to Eigen's dot (values: the sdpa tests against the CPU)
    q, k, v = (jnp.asarray(np.random.RandomState(h).randn(2, h, 16, 8), jnp.float32) for h in (4, 2, 2))
    out, lse = jax.jit(lambda q, k, v: attention.sdpa_fused(q, k, v, 0.0, True))(q, k, v)
    backward = jax.jit(lambda gr, q, k, v, o, lse: attention.sdpa_fused_backward(gr, q, k, v, o, lse, 0.0, True))
    assert _plain_dots(backward.lower(jnp.ones_like(out), q, k, v, out, lse).compile().as_text()) == 0


def _case(dtype, shape, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    kw = dict(generator=g, dtype=dtype)
    return (torch.randn(*shape, 48, **kw), torch.randn(40, 48, **kw), torch.randn(40, **kw) if bias else None)


def _tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype in (torch.bfloat16, torch.float16) else dict(rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (3, 5)], ids=["1d", "row", "batched"])
def test_linear_forward_and_backward_match_cpu(dtype, shape):
    x, w, b = _case(dtype, shape)
    grads = dtype in (torch.float32, torch.complex64)
    leaves = [t.clone().requires_grad_(grads) for t in (x, w, b)]
    ref = F.linear(*leaves)
    dev = [t.detach().to("tpu").requires_grad_(grads) for t in leaves]
    out = F.linear(*dev)
    assert_close(out.cpu(), ref.detach(), **_tol(dtype))
    assert_close((x.to("tpu") @ w.to("tpu").t()).cpu(), x @ w.t(), **_tol(dtype))
    if x.dim() == 2:
        assert_close(
            torch.addmm(b.to("tpu"), x.to("tpu"), w.to("tpu").t(), beta=0.5, alpha=-2).cpu(),
            torch.addmm(b, x, w.t(), beta=0.5, alpha=-2),
            **_tol(dtype),
        )
    if grads:
        g = torch.randn(ref.shape, dtype=dtype)
        ref.backward(g)
        out.backward(g.to("tpu"))
        for a, e in zip(dev, leaves):
            assert_close(a.grad.cpu(), e.grad, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k_batch", [2, 1], ids=["same-batch", "broadcast"])
def test_attention_scores_of_transposed_keys_match_cpu(dtype, k_batch):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 3, 16, generator=g, dtype=dtype)
    k = torch.randn(k_batch, 4, 7, 16, generator=g, dtype=dtype)
    expected = torch.matmul(q, k.transpose(2, 3))
    qd, kd = q.to("tpu"), k.to("tpu")
    assert_close(torch.matmul(qd, kd.transpose(2, 3)).cpu(), expected, **_tol(dtype))
    assert_close(torch.bmm(qd[0], kd[0].transpose(1, 2)).cpu(), torch.bmm(q[0], k[0].transpose(1, 2)), **_tol(dtype))
    compiled = torch.compile(lambda a, b: torch.matmul(a, b.transpose(2, 3)), backend="tpu", fullgraph=True)
    assert_close(compiled(qd, kd).cpu(), expected, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_layers_match_cpu_compiled_and_fused(dtype, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 48)).to(dtype)
    x = torch.randn(1, 48, dtype=dtype)
    expected = x + model(x)
    tpu = model.to("tpu")
    xd = x.to("tpu")
    compiled = torch.compile(lambda v: v + tpu(v), backend="tpu", fullgraph=True)
    with torch.no_grad():
        assert_close(compiled(xd).cpu(), expected.detach(), **_tol(dtype))
        monkeypatch.setattr(fusion, "COMPILE", "now")
        runs = torchtpu.metrics()["fused_runs"]
        with torchtpu.eager_mode("fused"):
            for _ in range(6):  # queued, then run as one compiled segment
                assert_close((xd + tpu(xd)).cpu(), expected.detach(), **_tol(dtype))
        assert torchtpu.metrics()["fused_runs"] > runs


MIXED = {
    "mm": lambda d, a, b, c: torch.mm(a.to(d), b.double().to(d)),
    "matmul": lambda d, a, b, c: a.to(d) @ b.double().to(d),
    "linear": lambda d, a, b, c: F.linear(a.to(d), b.t().to(torch.bfloat16).to(d)),
    "mm_out": lambda d, a, b, c: torch.mm(a.to(d), b.half().to(d), out=torch.empty(3, 5, device=d)),
    "mv": lambda d, a, b, c: torch.mv(a.to(d), b[:, 0].double().to(d)),
    "addmm_self": lambda d, a, b, c: torch.addmm(c.double().to(d), a.to(d), b.to(d)),
    "addmm_mat1": lambda d, a, b, c: torch.addmm(c.to(d), a.double().to(d), b.to(d)),
    "addmm_": lambda d, a, b, c: c.clone().to(d).addmm_(a.to(d), b.double().to(d)),
    "addbmm": lambda d, a, b, c: torch.addbmm(c.to(d), a[None].to(d), b[None].double().to(d)),
}


@pytest.mark.parametrize("case", MIXED)
def test_matmuls_of_mixed_dtypes_raise_as_on_cpu(case):
    # PyTorch's meta kernels leave these checks out: before, "tpu" promoted and returned a result
    a, b, c = torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 5)
    with pytest.raises(RuntimeError, match="same dtype") as on_cpu:
        MIXED[case]("cpu", a, b, c)
    with pytest.raises(RuntimeError, match="same dtype") as on_tpu:
        MIXED[case]("tpu", a, b, c)
    # the same words; the CPU's mm spells the types as C++ does ("float != double")
    assert str(on_tpu.value).split(",")[0].lower() == str(on_cpu.value).split(",")[0].lower()
