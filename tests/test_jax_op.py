"""torch.tpu.pallas.jax_op: JAX functions as PyTorch ops on "tpu" (eager, compiled, autograd, Pallas)."""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from typing import Literal, Optional

import jax
import jax.numpy as jnp
import pytest
import torch

import torchtpu
from torchtpu.kernels.pallas import custom_jax_kernel, jax_op

_names = itertools.count()


def _name(base):
    return f"test_jax_op::{base}_{next(_names)}"


def _tpu(*ts):
    return [t.to("tpu") for t in ts]


def test_eager_matches_cpu_and_is_one_cached_executable():
    @jax_op(_name("scaled_add"))
    def scaled_add(x: jax.Array, y: jax.Array, alpha: float = 1.0) -> jax.Array:
        return x + alpha * y

    a, b = torch.randn(33, 17), torch.randn(33, 17)
    ta, tb = _tpu(a, b)
    torchtpu.reset_metrics()
    for alpha in (0.5, 0.5, 0.5):
        out = scaled_add(ta, tb, alpha)
    assert out.device.type == "tpu"
    torch.testing.assert_close(out.cpu(), a + 0.5 * b)
    m = torchtpu.metrics()
    assert m["eager_compiles"] == 1 and m["eager_cache_hits"] >= 2
    # a new static value is a new executable; the CPU runs the same function on XLA:CPU
    torch.testing.assert_close(scaled_add(ta, tb, alpha=2.0).cpu(), a + 2.0 * b)
    torch.testing.assert_close(scaled_add(a, b, 2.0), a + 2.0 * b)
    # it is a real custom op
    ns, op = scaled_add._qualname.split("::")
    torch.testing.assert_close(getattr(getattr(torch.ops, ns), op)(ta, tb).cpu(), a + b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.bool])
def test_dtypes_and_views(dtype):
    @jax_op(_name("mix"))
    def mix(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.where(y, x, jnp.zeros_like(x)) if x.dtype == jnp.bool_ else x * 2 + y

    def ref(x, y):
        return torch.where(y, x, torch.zeros_like(x)) if x.dtype == torch.bool else x * 2 + y

    a = (torch.randn(8, 12) * 5).to(dtype)
    b = (torch.randn(12, 8) * 5).to(dtype).t()  # a transposed view
    ta, tb = _tpu(a, b.t().contiguous())
    tb = tb.t()
    torch.testing.assert_close(mix(ta, tb).cpu(), ref(a, b))
    torch.testing.assert_close(mix(ta[2:5], tb[2:5]).cpu(), ref(a[2:5], b[2:5]))


class Mode(enum.Enum):
    SUM = "sum"
    MAX = "max"


def test_static_kinds_sequences_and_multiple_outputs():
    @jax_op(_name("reduce"))
    def reduce(
        xs: Sequence[jax.Array],
        axes: Sequence[int],
        mode: Mode,
        dtype: torch.dtype,
        flag: Literal["a", "b"] = "a",
        *,
        scale: float = 1.0,
    ) -> tuple[jax.Array, jax.Array]:
        stacked = jnp.stack(xs)
        red = stacked.sum(axis=tuple(axes)) if mode is Mode.SUM else stacked.max(axis=tuple(axes))
        assert isinstance(axes, tuple) and flag in ("a", "b")
        return (red * scale).astype(dtype), stacked.mean(0)

    xs = [torch.randn(4, 6) for _ in range(3)]
    s, m = reduce(_tpu(*xs), [0, 2], Mode.MAX, torch.float16, scale=2.0)
    st = torch.stack(xs)
    torch.testing.assert_close(s.cpu(), (st.amax(dim=(0, 2)) * 2).half())
    torch.testing.assert_close(m.cpu(), st.mean(0))
    s, _ = reduce(_tpu(*xs), [1], Mode.SUM, jnp.float32, "b")  # JAX dtypes accepted too
    torch.testing.assert_close(s.cpu(), st.sum(1))


def test_list_return_and_optional_tensor():
    @jax_op(_name("split"))
    def split(x: jax.Array, bias: Optional[jax.Array], n: int) -> Sequence[jax.Array]:
        if bias is not None:
            x = x + bias
        return list(jnp.split(x, n))

    x, bias = torch.randn(6, 3), torch.randn(3)
    outs = split(*_tpu(x), None, 3)
    assert isinstance(outs, list) and len(outs) == 3
    torch.testing.assert_close(torch.cat([o.cpu() for o in outs]), x)
    outs = split(*_tpu(x, bias), 2)
    torch.testing.assert_close(torch.cat([o.cpu() for o in outs]), x + bias)


def test_unannotated_and_bad_signatures_are_clear_errors():
    def f(x, y: jax.Array) -> jax.Array:
        return x + y

    with pytest.raises(TypeError, match="parameter 'x' has no type annotation"):
        jax_op(_name("bad"), f)

    def g(x: jax.Array):
        return x

    with pytest.raises(TypeError, match="return annotation"):
        jax_op(_name("bad"), g)

    def h(x: jax.Array, d: dict) -> jax.Array:
        return x

    with pytest.raises(TypeError, match="'d'.*not supported"):
        jax_op(_name("bad"), h)
    with pytest.raises(ValueError, match="namespace::name"):
        jax_op("no_namespace", lambda x: x)


def test_fake_comes_from_jax_abstract_evaluation():
    @jax_op(_name("outer"))
    def outer(x: jax.Array, y: jax.Array) -> jax.Array:
        return (x[:, None] * y[None, :]).astype(jnp.bfloat16)

    out = outer(torch.empty(3, device="meta"), torch.empty(5, device="meta"))
    assert out.shape == (3, 5) and out.dtype == torch.bfloat16 and out.device.type == "meta"
    with pytest.raises(ValueError, match="Incompatible shapes"):  # JAX's own shape error
        _ = outer(torch.empty(3, 2, device="meta"), torch.empty(5, device="meta")).shape


def test_gradients_through_jax_vjp_and_registered_backward():
    @jax_op(_name("softplus_mul"))
    def softplus_mul(x: jax.Array, w: jax.Array, idx: jax.Array, beta: float) -> jax.Array:
        return jax.nn.softplus(beta * x) * w + idx.astype(x.dtype)

    x, w = torch.randn(5, 7, requires_grad=True), torch.randn(7, requires_grad=True)
    idx = torch.randint(0, 3, (5, 7))
    tx, tw = (t.detach().to("tpu").requires_grad_() for t in (x, w))
    softplus_mul(tx, tw, idx.to("tpu"), 2.0).pow(2).sum().backward()
    (torch.nn.functional.softplus(2.0 * x) * w + idx).pow(2).sum().backward()
    torch.testing.assert_close(tx.grad.cpu(), x.grad)
    torch.testing.assert_close(tw.grad.cpu(), w.grad)

    @jax_op(_name("square"))
    def square(x: jax.Array) -> jax.Array:
        return x * x

    def setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 100 * x  # deliberately not 2x: proves the user's backward runs

    square.register_autograd(backward, setup_context=setup)
    t = torch.randn(4, device="tpu", requires_grad=True)
    square(t).sum().backward()
    torch.testing.assert_close(t.grad.cpu(), 100 * t.detach().cpu())


def test_inlined_in_compiled_graph_without_break():
    import torch._dynamo

    @jax_op(_name("gelu_scale"))
    def gelu_scale(x: jax.Array, s: float) -> jax.Array:
        return jax.nn.gelu(x, approximate=True) * s

    def f(x, w):
        return gelu_scale(x @ w, 0.5).sum(-1) + 1

    x, w = torch.randn(8, 16), torch.randn(16, 4)
    tx, tw = _tpu(x, w)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(f)(tx, tw)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    compiled = torch.compile(f, backend="tpu", fullgraph=True)
    ref = (torch.nn.functional.gelu(x @ w, approximate="tanh") * 0.5).sum(-1) + 1
    torch.testing.assert_close(compiled(tx, tw).cpu(), ref, rtol=1e-5, atol=1e-5)
    # the backward graph too (jax.vjp op in the joint graph)
    tx.requires_grad_()
    xr = x.clone().requires_grad_()
    torch.compile(f, backend="tpu", fullgraph=True)(tx, tw).sum().backward()
    f2 = (torch.nn.functional.gelu(xr @ w, approximate="tanh") * 0.5).sum(-1) + 1
    f2.sum().backward()
    torch.testing.assert_close(tx.grad.cpu(), xr.grad, rtol=1e-5, atol=1e-5)


def test_pallas_kernel_runs_in_interpret_mode_on_cpu():
    from jax.experimental import pallas as pl

    def add_kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + 2 * y_ref[...]

    @jax_op(_name("pallas_add"))
    def pallas_add(x: jax.Array, y: jax.Array) -> jax.Array:
        # no interpret=True: the platform decides (interpreter on XLA:CPU, Mosaic/Triton on TPU/GPU)
        return pl.pallas_call(add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x, y)

    x, y = torch.randn(8, 128), torch.randn(8, 128)
    torch.testing.assert_close(pallas_add(*_tpu(x, y)).cpu(), x + 2 * y)
    torch.testing.assert_close(pallas_add(x, y), x + 2 * y)
    compiled = torch.compile(lambda a, b: pallas_add(a, b) * 3, backend="tpu", fullgraph=True)
    torch.testing.assert_close(compiled(*_tpu(x, y)).cpu(), (x + 2 * y) * 3)


def test_donate_argnums_donates_the_buffer():
    @jax_op(_name("inc"), donate_argnums=(0,))
    def inc(x: jax.Array) -> jax.Array:
        return x + 1

    x = torch.randn(256, 256)
    tx = x.to("tpu")
    out = inc(tx)
    torch.testing.assert_close(out.cpu(), x + 1)
    from torchtpu.storage.records import record_of

    assert record_of(tx).buffer.is_deleted()

    def two(x: jax.Array, n: int) -> jax.Array:
        return x * n

    with pytest.raises(ValueError, match="not a tensor parameter"):
        jax_op(_name("bad_donate"), two, donate_argnums=(1,))


def test_mesh_of_one_device_runs_and_wider_mesh_is_explicit():
    import numpy as np

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))

    @jax_op(_name("meshed"), mesh=mesh, input_partition_specs=(("x",),), output_partition_specs=(("x",),))
    def meshed(x: jax.Array) -> jax.Array:
        return x * 3

    x = torch.randn(4)
    torch.testing.assert_close(meshed(x.to("tpu")).cpu(), x * 3)

    def ident(x: jax.Array) -> jax.Array:
        return x

    with pytest.raises(ValueError, match="partition specs need a mesh"):
        jax_op(_name("meshed2"), ident, input_partition_specs=(("x",),))


def test_custom_jax_kernel_is_the_deprecated_alias():
    def fn(x, y, power):
        return {"sum": x + y, "pow": x**power}

    with pytest.warns(DeprecationWarning):
        kernel = custom_jax_kernel(fn, static_argnums=(2,))
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    out = kernel(*_tpu(a, b), 2)
    torch.testing.assert_close(out["sum"].cpu(), a + b)
    torch.testing.assert_close(out["pow"].cpu(), a**2)


def test_public_name():
    pallas = pytest.importorskip("torch.tpu.pallas")
    assert pallas.jax_op is jax_op
