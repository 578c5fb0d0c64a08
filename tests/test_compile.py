"""torch.compile(backend="tpu"): compiled vs eager-on-device vs CPU, caching, mutations, training."""

import copy
import gc
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu
import torchtpu.compile

TOL = dict(rtol=2e-4, atol=2e-5)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _counts():
    m = torchtpu.metrics()
    return m["compiled_xla_compiles"], m["compiled_cache_hits"]


def _three_ways(make, *inputs, train=False):
    """(cpu, tpu eager, tpu compiled) outputs of the same module on the same inputs."""
    torch.manual_seed(0)
    cpu = make()
    if not train:
        cpu.eval()
    dev = copy.deepcopy(cpu).to("tpu")
    comp = torch.compile(copy.deepcopy(cpu).to("tpu"), backend="tpu")
    with torch.no_grad():
        ref = cpu(*inputs)
        eager = dev(*[i.to("tpu") for i in inputs]).cpu() if not train else None
        return ref, eager, comp(*[i.to("tpu") for i in inputs]).cpu()


def test_mlp_parity_and_no_recompile():
    x = torch.randn(8, 16)
    make = lambda: nn.Sequential(
        nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 4), nn.LogSoftmax(-1)
    )
    ref, eager, comp = _three_ways(make, x)
    torch.testing.assert_close(eager, ref, **TOL)
    torch.testing.assert_close(comp, ref, **TOL)

    torch.manual_seed(0)
    model = torch.compile(make().to("tpu").eval(), backend="tpu")
    xt = x.to("tpu")
    with torch.no_grad():
        model(xt)
        compiles, hits = _counts()
        for _ in range(3):
            model(torch.randn(8, 16, device="tpu"))
        assert _counts()[0] == compiles, "same-shape calls must not recompile"
        assert _counts()[1] == hits + 3
        model(torch.randn(5, 16, device="tpu"))  # a new shape: exactly one more executable
        assert _counts()[0] == compiles + 1
        model(torch.randn(5, 16, device="tpu"))
        assert _counts()[0] == compiles + 1


def test_recompile_log(capfd):
    torchtpu.compile.options.log_recompiles(True)
    try:
        f = torch.compile(lambda a: (a * 2).sum(0), backend="tpu", dynamic=False)
        f(torch.randn(4, 3, device="tpu"))
        # same shape and strides for Dynamo, but a view into a larger storage: a new executable
        f(torch.randn(6, 3, device="tpu")[:4])
    finally:
        torchtpu.compile.options.log_recompiles(False)
    err = capfd.readouterr().err
    assert "recompiling graph" in err and "storage" in err


def test_small_cnn():
    x = torch.randn(2, 3, 16, 16)
    make = lambda: nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2), nn.Flatten(), nn.Linear(8 * 7 * 7, 10)
    )
    ref, eager, comp = _three_ways(make, x)
    torch.testing.assert_close(comp, ref, **TOL)


class TinyBlock(nn.Module):
    """Pre-norm attention + MLP, written by hand (masks, softmax, transposes, views)."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        self.emb = nn.Embedding(50, d)

    def forward(self, ids):
        x = self.emb(ids)
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


def test_transformer_forward():
    ids = torch.randint(0, 50, (2, 12))
    ref, eager, comp = _three_ways(TinyBlock, ids)
    torch.testing.assert_close(eager, ref, **TOL)
    torch.testing.assert_close(comp, ref, **TOL)


def test_transformer_encoder_layer():
    x = torch.randn(2, 10, 32)
    # training mode (dropout 0): the eval-mode fast path is one fused op, _transformer_encoder_layer_fwd
    make = lambda: nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    ref, _, comp = _three_ways(make, x, train=True)
    torch.testing.assert_close(comp, ref, **TOL)


def test_training_step_adamw():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 12))
    target = torch.randn(2, 12, 32)
    cpu = TinyBlock()
    dev = copy.deepcopy(cpu).to("tpu")
    # eps well above the 1e-9 noise of the key bias gradients (mathematically zero: softmax shift invariance)
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2, eps=1e-4)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2, eps=1e-4)
    cmodel = torch.compile(dev, backend="tpu")

    @torch.compile(backend="tpu")
    def opt_step():
        opt_dev.step()

    ids_t, target_t = ids.to("tpu"), target.to("tpu")
    for _ in range(3):
        opt_cpu.zero_grad()
        F.mse_loss(cpu(ids), target).backward()
        opt_cpu.step()
        opt_dev.zero_grad()
        loss = F.mse_loss(cmodel(ids_t), target_t)
        loss.backward()
        opt_step()
    for (n, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-3, atol=1e-4, msg=n)
    compiles = torchtpu.metrics()["compiled_xla_compiles"]
    opt_dev.zero_grad()
    F.mse_loss(cmodel(ids_t), target_t).backward()
    opt_step()
    assert torchtpu.metrics()["compiled_xla_compiles"] == compiles, "a steady training step must not recompile"


def test_compiled_optimizer_step_counters_stay_on_the_host():
    """torch.optim keeps `state["step"]` on the CPU; a compiled step() must update it there without
    reading the device (a read would make the host wait for every optimizer step)."""
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    dev = copy.deepcopy(cpu).to("tpu")
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2)
    step = torch.compile(opt_dev.step, backend="tpu")
    for i in range(4):
        x = torch.randn(8, 16)
        opt_cpu.zero_grad()
        cpu(x).square().mean().backward()
        opt_cpu.step()
        opt_dev.zero_grad()
        dev(x.to("tpu")).square().mean().backward()
        if i == 2:
            reads = torchtpu.metrics()["d2h_transfers"]
        step()
    assert torchtpu.metrics()["d2h_transfers"] == reads, "the compiled step read the device"
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.cpu(), p, rtol=1e-5, atol=1e-6)
        assert opt_dev.state[q]["step"].device.type == "cpu"
        assert opt_dev.state[q]["step"].item() == opt_cpu.state[p]["step"].item() == 4


def test_batchnorm_running_stats_mutation():
    x = torch.randn(8, 6)
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6))
    dev = copy.deepcopy(cpu).to("tpu")
    comp = torch.compile(dev, backend="tpu")
    with torch.no_grad():
        for _ in range(2):
            ref = cpu(x)
            out = comp(x.to("tpu"))
    torch.testing.assert_close(out.cpu(), ref, **TOL)
    bn_cpu, bn_dev = cpu[1], dev[1]
    torch.testing.assert_close(bn_dev.running_mean.cpu(), bn_cpu.running_mean, **TOL)
    torch.testing.assert_close(bn_dev.running_var.cpu(), bn_cpu.running_var, **TOL)
    assert int(bn_dev.num_batches_tracked.cpu()) == 2


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(4))
        self.register_buffer("cache", torch.zeros(3, 4))

    def forward(self, x, pos: int):
        self.total.add_(x.sum(0))
        self.cache[pos].copy_(x[0])  # a write through a view of a buffer, like a KV cache
        return self.total * 2


def test_buffer_mutation_visible():
    m = Counter().to("tpu")
    f = torch.compile(m, backend="tpu")
    xs = [torch.randn(2, 4) for _ in range(3)]
    for i, x in enumerate(xs):
        out = f(x.to("tpu"), i)
    total = sum(x.sum(0) for x in xs)
    torch.testing.assert_close(m.total.cpu(), total, **TOL)
    torch.testing.assert_close(out.cpu(), total * 2, **TOL)
    torch.testing.assert_close(m.cache.cpu(), torch.stack([x[0] for x in xs]), **TOL)


def test_dropout_in_graph_is_random_and_trains():
    torch.manual_seed(0)
    f = torch.compile(lambda a: F.dropout(a, 0.5, training=True), backend="tpu")
    x = torch.ones(64, 64, device="tpu")
    a, b = f(x).cpu(), f(x).cpu()
    assert not torch.equal(a, b), "each call draws a fresh mask"
    kept = (a != 0).float().mean().item()
    assert 0.4 < kept < 0.6
    torch.testing.assert_close(a[a != 0], torch.full_like(a[a != 0], 2.0))


def test_graph_break_falls_back_to_eager():
    def f(a):
        b = a * 2
        if b.sum().item() > 0:  # graph break: data-dependent Python control flow
            return b + 1
        return b - 1

    x = torch.randn(5)
    got = torch.compile(f, backend="tpu")(x.to("tpu"))
    torch.testing.assert_close(got.cpu(), f(x))


def test_data_dependent_fullgraph_message():
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    try:
        f = torch.compile(lambda a: a[a > 0].sum(), backend="tpu", fullgraph=True)
        with pytest.raises(Exception, match="static-shape alternative|torch.where"):
            f(torch.randn(6, device="tpu"))
    finally:
        torch._dynamo.config.capture_dynamic_output_shape_ops = False


def test_noncontiguous_inputs_and_outputs():
    f = torch.compile(lambda a, b: (a + b, (a * b).t()), backend="tpu")
    a = torch.randn(6, 4)
    b = torch.randn(4, 6)
    s, p = f(a.to("tpu")[:, 1:3].t(), b.to("tpu")[1:3])
    torch.testing.assert_close(s.cpu(), a[:, 1:3].t() + b[1:3])
    torch.testing.assert_close(p.cpu(), (a[:, 1:3].t() * b[1:3]).t())


def test_dump_stablehlo(tmp_path):
    torchtpu.compile.options.dump_stablehlo(tmp_path)
    try:
        torch.compile(lambda a: torch.tanh(a) @ a.t(), backend="tpu")(torch.randn(3, 3, device="tpu"))
    finally:
        torchtpu.compile.options.dump_stablehlo(False)
    texts = [p.read_text() for p in tmp_path.glob("*.mlir")]
    assert texts and any("stablehlo" in t for t in texts)


@pytest.mark.parametrize(
    "name,fn",
    [
        ("hardswish", lambda a, b: F.hardswish(a)),
        ("logaddexp", lambda a, b: torch.logaddexp(a, b)),
        ("softplus", lambda a, b: F.softplus(a, beta=2.0)),
        ("mse_loss", lambda a, b: F.mse_loss(a, b)),
        ("elu", lambda a, b: F.elu(a, 0.5)),
        ("stack", lambda a, b: torch.stack([a, b], 1)),
    ],
)
def test_eager_decompositions(name, fn):
    """Ops without a lowering run in eager mode through their traced PyTorch decomposition."""
    a, b = torch.randn(4, 6), torch.randn(4, 6)
    torch.testing.assert_close(fn(a.to("tpu"), b.to("tpu")).cpu(), fn(a, b), **TOL)


def test_resolve_reaches_decompositions_through_its_registry(monkeypatch):
    """resolve.py does not import decompose.py (that closes a circle through graph.py): importing the ops
    package registers decompose as resolve's last resort, and why it found nothing is chained to NotLowered."""
    from torchtpu.ops import decompose, resolve

    assert [(decompose.decomposed, decompose.last_failure)] == resolve.DECOMPOSERS
    op = torch.ops.aten.celu.default  # no lowering: PyTorch decomposes it
    assert resolve.op_name(op) not in resolve.LOWERINGS and resolve.functional_twin(op) is None
    why = RuntimeError("cannot trace")
    monkeypatch.setattr(resolve, "DECOMPOSERS", [(lambda op, args, kwargs: None, lambda: why)])
    with pytest.raises(resolve.NotLowered) as raised:
        resolve.resolve(op, (torch.empty(3, device="meta"),), {})
    assert raised.value.__cause__ is why


def test_eager_batch_norm_decomposition_updates_running_stats():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(6)
    dev = copy.deepcopy(bn).to("tpu")
    x = torch.randn(8, 6)
    torch.testing.assert_close(dev(x.to("tpu")).cpu(), bn(x), **TOL)
    torch.testing.assert_close(dev.running_mean.cpu(), bn.running_mean, **TOL)
    torch.testing.assert_close(dev.running_var.cpu(), bn.running_var, **TOL)


def test_dynamic_shapes_specialize_per_shape():
    """Default dynamic=None: Dynamo may hand over a symbolic graph; it is compiled per concrete shape."""
    torch.manual_seed(0)
    m = TinyBlock().eval()
    f = torch.compile(copy.deepcopy(m).to("tpu"), backend="tpu")
    with torch.no_grad():
        for b, t in [(2, 12), (3, 12), (4, 9)]:
            ids = torch.randint(0, 50, (b, t))
            torch.testing.assert_close(f(ids.to("tpu")).cpu(), m(ids), **TOL)


def test_compiled_opt_step_capturable_stays_on_device():
    torch.manual_seed(0)
    m = nn.Linear(8, 4)
    d = copy.deepcopy(m).to("tpu")
    oc = torch.optim.AdamW(m.parameters(), lr=1e-2, eps=1e-4)
    od = torch.optim.AdamW(d.parameters(), lr=1e-2, eps=1e-4, capturable=True)
    step = torch.compile(od.step, backend="tpu")
    x = torch.randn(16, 8)
    xt = x.to("tpu")
    for i in range(3):
        oc.zero_grad()
        m(x).square().mean().backward()
        oc.step()
        od.zero_grad()
        d(xt).square().mean().backward()
        if i == 2:
            before = torchtpu.metrics()
        step()
    after = torchtpu.metrics()
    assert after["d2h_transfers"] == before["d2h_transfers"] and after["h2d_transfers"] == before["h2d_transfers"]
    assert after["compiled_xla_compiles"] == before["compiled_xla_compiles"]
    torch.testing.assert_close(d.weight.detach().cpu(), m.weight.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(d.bias.detach().cpu(), m.bias.detach(), rtol=1e-4, atol=1e-5)


def test_conjugate_views_inside_and_into_compiled_graphs():
    x = torch.randn(3, 3, dtype=torch.complex64)
    t = x.to("tpu")
    matmul = torch.compile(lambda a, b: a @ b + 1, backend="tpu")
    for a_cpu, a_tpu in ((x.conj(), t.conj()), (x.mH, t.mH)):  # lazily conjugated graph inputs
        torch.testing.assert_close(matmul(a_tpu, t).cpu(), a_cpu @ x + 1)
    inside = torch.compile(lambda a: (a.conj() * 2, a.conj().imag * 3, a.mH @ a), backend="tpu")
    for got, expected in zip(inside(t), (x.conj() * 2, x.conj().imag * 3, x.mH @ x)):
        torch.testing.assert_close(got.cpu(), expected)

    def scale(a):
        a.mul_(2)
        return a.sum()

    z, zc = t.clone(), x.clone()
    torch.compile(scale, backend="tpu")(z.conj())  # a mutation written back through the conjugate view
    scale(zc.conj())
    torch.testing.assert_close(z.cpu(), zc)


def test_grouped_query_attention_compiled():
    """SDPA with enable_gqa=True: the graph hands the 2 key/value heads to the attention op as they are
    (ops/attention.py pairs each with its 4 query heads), forward and backward equal to the CPU's."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 8, 6, 16), torch.randn(2, 2, 6, 16), torch.randn(2, 2, 6, 16)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    dev = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    out_c, out_d = attend(*cpu), torch.compile(attend, backend="tpu", fullgraph=True)(*dev)
    torch.testing.assert_close(out_d.cpu(), out_c, **TOL)
    g = torch.randn(out_c.shape)
    out_c.backward(g)
    out_d.backward(g.to("tpu"))
    for a, b in zip(cpu, dev):
        torch.testing.assert_close(b.grad.cpu(), a.grad, **TOL)


def test_bad_input_in_a_graph_gets_pytorch_errors():
    """Checks PyTorch's meta kernels leave out (bool subtraction) still give PyTorch's error when
    the op is inside a compiled graph, as in eager mode and on the CPU."""
    b = torch.tensor([True, False])
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with a bool tensor") as cpu:
        b - 1
    for fn in (lambda t: t - 1, lambda t: torch.rsub(t, 2)):
        with pytest.raises(Exception, match="Subtraction, the `-` operator, with a bool tensor"):
            torch.compile(fn, backend="tpu", fullgraph=True)(b.to("tpu"))
    torch._dynamo.reset()
    assert torch.compile(lambda t: t - 1, backend="tpu", fullgraph=True)(torch.arange(3, device="tpu")).tolist() == [
        -1,
        0,
        1,
    ]
    assert cpu.type is RuntimeError


@pytest.mark.parametrize("write", ["slice", "strided_slice", "select", "negative_select", "whole_dim"])
def test_compiled_slab_writes_into_a_large_cache_match_cpu(write):
    # small slabs go as scatters at flat offsets (ops/graph.py), large ones as slab updates: both
    # must leave the cache, and what the graph reads back, as the CPU's
    def step(cache, k):
        if write == "slice":
            cache[:, :, 100:101] = k
        elif write == "strided_slice":
            cache[:, :, 7:13:3] = k
        elif write == "select":
            cache[:, :, 100] = k
        elif write == "negative_select":
            cache[:, :, -3] = k
        else:
            cache[:, 1] = k
        return (cache * 0.5).sum(-1)

    shapes = {
        "slice": (1, 4, 1, 32),
        "strided_slice": (1, 4, 2, 32),
        "select": (1, 4, 32),
        "negative_select": (1, 4, 32),
        "whole_dim": (1, 512, 32),
    }
    cache, k = torch.randn(1, 4, 512, 32), torch.randn(*shapes[write])
    expected_cache = cache.clone()
    expected = step(expected_cache, k)
    device_cache = cache.to("tpu")
    got = torch.compile(step, backend="tpu", fullgraph=True, dynamic=False)(device_cache, k.to("tpu"))
    torch.testing.assert_close(got.cpu(), expected)
    torch.testing.assert_close(device_cache.cpu(), expected_cache)


@pytest.mark.parametrize(
    "shape,dim,size,step",
    [((10,), 0, 3, 2), ((4, 9, 3), 1, 4, 1), ((4, 9, 3), -1, 3, 3), ((2, 5), 0, 2, 5), ((), 0, 1, 1)],
)
def test_compiled_unfold_windows(shape, dim, size, step):
    # overlapping windows (step < size) and a 0-d input, inside a graph with a consumer
    x = torch.randn(shape)
    f = lambda t: t.unfold(dim, size, step) * 2
    torch.testing.assert_close(torch.compile(f, backend="tpu", fullgraph=True)(x.to("tpu")).cpu(), f(x))


class _Counter:
    def __init__(self, n):
        self.n = n


def _step(x, buf, state):
    # an int attribute Dynamo keeps dynamic (as Transformers' cache position): it updates, it is
    # returned, it offsets values and it selects a branch, next to an in-place write of an input
    n = state.n
    state.n = n + 1
    buf.add_(1)
    shifted = x + torch.arange(4, device=x.device) + max(n - 3, 0)
    return (shifted * 2 if n >= 3 else shifted - n), n + 1


def test_dynamic_int_input_is_a_traced_value_not_a_recompile():
    with torch.compiler.config.patch(dynamic_sources=r".*\.n$"):
        step = torch.compile(_step, backend="tpu", dynamic=False)
        x, buf = torch.randn(4), torch.zeros(3)
        xt, buft = x.to("tpu"), buf.to("tpu")
        s_cpu, s_tpu = _Counter(0), _Counter(0)
        before = _counts()
        for _ in range(7):
            want, n_cpu = _step(x, buf, s_cpu)
            got, n_tpu = step(xt, buft, s_tpu)
            torch.testing.assert_close(got.cpu(), want)
            assert type(n_tpu) is int and n_tpu == n_cpu == s_tpu.n
        torch.testing.assert_close(buft.cpu(), buf)
    compiles = _counts()[0] - before[0]
    # Dynamo makes a graph per branch (n < 3, n >= 3); our backend one executable per graph,
    # at most one more for a first call whose written buffer is shared (not donatable)
    assert compiles <= 4, compiles


def _narrow_step(x, state):
    n = state.n
    state.n = n + 1
    return x.narrow(0, n, 2) * 2


def test_dynamic_int_that_an_op_needs_static_is_baked_in():
    with torch.compiler.config.patch(dynamic_sources=r".*\.n$"):
        step = torch.compile(_narrow_step, backend="tpu", dynamic=False)
        x = torch.randn(8)
        s_cpu, s_tpu = _Counter(0), _Counter(0)
        for _ in range(4):
            torch.testing.assert_close(step(x.to("tpu"), s_tpu).cpu(), _narrow_step(x, s_cpu))


def test_activation_checkpoint_with_dropout_replays_the_same_draw():
    """torch.utils.checkpoint under torch.compile: AOTAutograd saves the RNG state of a random op
    (run_and_save_rng_state) and the backward recomputes it with that state (run_with_rng_state);
    both must be lowered, and the backward must see the forward's dropout mask."""
    from torch.utils.checkpoint import checkpoint

    p = 0.5
    w = torch.randn(256, device="tpu", requires_grad=True)
    x, c = torch.randn(256, device="tpu"), torch.randn(256, device="tpu")

    def f(x):
        return checkpoint(lambda y: F.dropout(y * w, p, training=True), x, use_reentrant=False)

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="torchtpu")
        out = torch.compile(f, backend="tpu", fullgraph=True)(x)
        (out * c).sum().backward()
    kept = (out != 0).float()
    assert 0 < kept.sum() < 256
    torch.testing.assert_close(w.grad.cpu(), (c * x * kept / (1 - p)).cpu())


_SECOND_PROCESS = r"""
import json
import jax.monitoring
import torch
counts = {"hits": 0, "misses": 0}
def listen(event, **kw):
    if event == "/jax/compilation_cache/cache_hits": counts["hits"] += 1
    if event == "/jax/compilation_cache/cache_misses": counts["misses"] += 1
jax.monitoring.register_event_listener(listen)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
x = torch.randn(8, 16, device="tpu")
model(x).sum().item()                                                   # eager ops
torch.compile(model, backend="tpu", fullgraph=True)(x).sum().item()    # a compiled graph
print(json.dumps(counts))
"""


def test_second_process_compiles_nothing_the_disk_cache_holds(tmp_path):
    """The persistent XLA cache is on by default: a second process running the same eager ops and
    compiled graph loads every executable from disk instead of compiling it again."""
    import json
    import os
    import subprocess
    import sys

    from torchtpu.device import native

    env = dict(os.environ, TORCHTPU_COMPILE_CACHE="1", TORCHTPU_COMPILE_CACHE_DIR=str(tmp_path / "xla"))
    # the C++ extensions live beside the XLA cache: share this process's build instead of compiling
    # them again (~20 s of CPU) in the first child
    native._cache_dir().mkdir(parents=True, exist_ok=True)
    (tmp_path / "native").symlink_to(native._cache_dir(), target_is_directory=True)
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", _SECOND_PROCESS],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        for _ in range(2)
    ]
    assert runs[0]["misses"] > 0 and runs[0]["hits"] == 0, runs
    assert runs[1] == {"hits": runs[0]["misses"], "misses": 0}, runs


# ---------------------------------------------------------------- the fast key (compile/fast_key.py)
def _graph_of(fn, *args):
    """The CompiledGraph `torch.compile(fn)` runs on `args`, and the argument list it got."""
    from torchtpu.compile import backend as B

    seen = {}
    orig = B.CompiledGraph.__call__

    def grab(self, *a):
        seen["g"], seen["args"] = self, list(a[0]) if len(a) == 1 and type(a[0]) is list else list(a)
        return orig(self, *a)

    B.CompiledGraph.__call__ = grab
    try:
        torch.compile(fn, backend="tpu", dynamic=False)(*args)
    finally:
        B.CompiledGraph.__call__ = orig
    return seen["g"], seen["args"]


def _matadd(x, y):
    return x @ y + 1


@pytest.fixture(params=["cpp", "guards"])
def fast_key_kind(request, monkeypatch):
    """The fast key's one C++ pass (eager/fastpath.py graph_functions) or, without the C++
    library, PyTorch's TensorGuards and data pointers."""
    from torchtpu.eager import fastpath

    if request.param == "cpp" and fastpath.graph_functions() is None:
        pytest.skip(f"no C++ fast path: {fastpath.problem()}")
    if request.param == "guards":
        monkeypatch.setattr(fastpath, "_graph_functions", [None])
    return request.param


def test_fast_key_reuses_the_key_of_the_same_tensors_and_rekeys_what_changed(fast_key_kind):
    x, y = torch.randn(4, 4, device="tpu"), torch.randn(4, 4, device="tpu")
    g, args = _graph_of(_matadd, x, y)
    assert [a is b for a, b in zip(args, (x, y))] == [True, True]

    def check(a, b, cpu_a, cpu_b):
        (out,) = g([a, b])
        torch.testing.assert_close(out.cpu(), cpu_a @ cpu_b + 1, **TOL)

    xc, yc = x.cpu(), y.cpu()
    compiles = _counts()[0]
    check(x, y, xc, yc)
    check(x, y, xc, yc)
    assert g._fast is not None and g._fast_misses == 0, "the same tensors again: a fast hit"
    assert g._fast.match(g, [x, y]) is not None
    z = torch.randn(4, 4, device="tpu")
    check(z, y, z.cpu(), yc)  # a new tensor, same layout: re-keyed alone, same executable
    assert g._fast_misses == 0
    check(y, x, yc, xc)  # swapped storages: both re-keyed, the same key
    assert g._fast_misses == 0
    check(x.t(), y, xc.t(), yc)  # same data pointer, other strides: the guards miss
    check(x, x, xc, xc)  # one storage twice: another key (slots alias)
    check(x, y, xc, yc)
    base = torch.randn(3, 4, 4)
    bt = base.to("tpu")
    for i in range(3):  # partial views: the traced offset moves with the pointer
        check(bt[i], y, base[i], yc)
    assert g._fast_misses == 0, "bt[1], bt[2]: the same key, the offset traced"
    w = torch.randn(4, 4, device="tpu")
    x2 = torch.empty(4, 4, device="tpu")
    x2.set_(w.untyped_storage(), 0, (4, 4), (4, 1))  # the same tensor object on another storage
    check(x2, y, w.cpu(), yc)
    check(w.view(torch.int32).view(torch.float32), y, w.cpu(), yc)
    # x.t(), the alias and the partial views are new signatures; nothing else compiled
    assert _counts()[0] - compiles <= 4


def test_fast_key_follows_matmul_precision_and_conjugate_bits(fast_key_kind):
    x, y = torch.randn(8, 8, device="tpu"), torch.randn(8, 8, device="tpu")
    g, _ = _graph_of(_matadd, x, y)
    g([x, y])
    keys = len(g.cache)
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high" if old != "high" else "highest")
        g([x, y])
        assert len(g.cache) == keys + 1, "the precision is part of the key, fast or not"
    finally:
        torch.set_float32_matmul_precision(old)
    g([x, y])
    assert len(g.cache) == keys + 1
    a = torch.randn(3, 3, dtype=torch.complex64)
    b = torch.randn(3, 3, dtype=torch.complex64)
    at, bt = a.to("tpu"), b.to("tpu")
    gc_, _ = _graph_of(_matadd, at, bt)
    for _ in range(2):
        (out,) = gc_([at, bt])
        torch.testing.assert_close(out.cpu(), a @ b + 1, **TOL)
    (out,) = gc_([at.conj(), bt])  # the same pointer with the conjugate bit
    torch.testing.assert_close(out.cpu(), a.conj() @ b + 1, **TOL)


def _kv_write(cache, x, pos):
    cache[:, pos].copy_(x)
    return cache.sum(1)


def test_fast_key_keeps_donation_a_refcount_check():
    import numpy as np

    from torchtpu.storage.records import record_of

    # (256 KiB: smaller written storages are not donated, as in eager in-place ops)
    cache, x = torch.zeros(2, 32768, device="tpu"), torch.ones(2, device="tpu")
    g, args = _graph_of(_kv_write, cache, x, 0)
    assert len(args) == 2, args  # pos is baked in (dynamic=False)
    for _ in range(3):
        g([cache, x])
    assert g._fast is not None and g._fast_misses == 0
    entry = g._fast.entry
    assert entry.donate
    held = record_of(cache).buffer  # a second reference: this call must not donate
    before = np.asarray(held).copy()
    x.fill_(5.0)
    g([cache, x])
    assert entry.fn_plain is not None
    np.testing.assert_array_equal(np.asarray(held), before)  # still alive and unchanged
    assert float(cache[:, 0].sum().cpu()) == 10.0
    del held
    g([cache, x])
    torch.testing.assert_close(cache.cpu()[:, 0], torch.full((2,), 5.0))


def _cache_step(cache, pos, k):
    cache.index_copy_(0, pos, k)
    pos.add_(1)
    return cache.sum()


def test_large_written_storages_are_donated_when_a_small_one_is_shared(monkeypatch):
    """A decode step writes its KV cache (large) and a position counter (small, often shared with a
    kept memo result or a clone): the cache is still updated in place, not copied every call; an
    event recorded in between (generate()'s per-token stop check) does not prevent it either."""
    from torchtpu.compile import backend as B

    verdicts = []
    donatable = B.donatable
    monkeypatch.setattr(B, "donatable", lambda dyn, slots: verdicts.append(donatable(dyn, slots)) or verdicts[-1])
    step = torch.compile(_cache_step, backend="tpu", fullgraph=True)
    cache_c, pos_c = torch.zeros(512, 256), torch.zeros(1, dtype=torch.long)  # 512 KiB
    cache, pos = cache_c.to("tpu"), pos_c.to("tpu")
    events = []
    for i in range(4):
        k = torch.randn(1, 256)
        shared = pos.clone()  # shares the counter's buffer: the counter cannot be donated
        events.append(torch.Event(device="tpu"))
        events[-1].record()  # (still to be waited for while the step runs)
        got = step(cache, pos, k.to("tpu"))
        want = _cache_step(cache_c, pos_c, k)
        torch.testing.assert_close(got.cpu(), want)
        assert shared.item() == i
    torch.testing.assert_close(cache.cpu(), cache_c)
    assert len(verdicts) == 4 and all(verdicts), verdicts


def test_fast_key_with_traced_ints(monkeypatch, fast_key_kind):
    from torchtpu.compile.fast_key import FastKey

    hits = []
    match = FastKey.match
    monkeypatch.setattr(FastKey, "match", lambda self, g, a: hits.append(match(self, g, a)) or hits[-1])
    with torch.compiler.config.patch(dynamic_sources=r".*\.n$"):
        step = torch.compile(_step, backend="tpu", dynamic=False)
        x, buf = torch.randn(4), torch.zeros(3)
        xt, buft = x.to("tpu"), buf.to("tpu")
        s_cpu, s_tpu = _Counter(0), _Counter(0)
        for _ in range(8):
            want, n_cpu = _step(x, buf, s_cpu)
            got, n_tpu = step(xt, buft, s_tpu)
            torch.testing.assert_close(got.cpu(), want)
            assert n_tpu == n_cpu
        torch.testing.assert_close(buft.cpu(), buf)
    assert sum(h is not None for h in hits) >= 3, hits  # the int travels; the key stays


def _two_layouts(x):
    return x + 1, (x * 2).t(), x.sum(0)


@pytest.mark.parametrize("native", [True, False], ids=["cpp_outputs", "new_tensor"])
def test_compiled_outputs_are_counted_freed_and_keep_their_layout(native, monkeypatch):
    """A compiled graph's outputs (made in C++ where the fast path's library is loaded, else by
    new_tensor) match the CPU's values and strides, count in memory_allocated and free with it."""
    from torchtpu.eager import fastpath

    if not native:
        monkeypatch.setattr(fastpath, "_graph_functions", [None])
    elif fastpath.graph_functions() is None:
        pytest.skip(f"no C++ fast path: {fastpath.problem()}")
    fn = torch.compile(_two_layouts, backend="tpu", fullgraph=True)
    x_cpu = torch.randn(6, 5)
    x = x_cpu.to("tpu")
    fn(x)  # compile
    gc.collect()  # tensors in reference cycles left by earlier tests in this process free now, not mid-count
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    outs = fn(x)
    want = _two_layouts(x_cpu)
    for got, w in zip(outs, want):
        torch.testing.assert_close(got.cpu(), w)
        assert got.device.type == "tpu" and got.stride() == w.stride() and got.shape == w.shape
    assert torch.tpu.memory_allocated() - before == sum(w.numel() * w.element_size() for w in want)
    del outs, got
    assert torch.tpu.memory_allocated() == before


def test_compiled_cat_with_symbolic_sizes_and_a_legacy_empty_tensor_matches_cpu():
    """The backend hands cat's argument check the meta values of the nodes in its list (symbolic
    sizes under dynamic=True): it adds no guard and does not refuse a legacy empty 1-d tensor."""

    def f(a, b, e):
        return torch.cat([a, e, b]) * 2

    g = torch.compile(f, backend="tpu", dynamic=True)
    for n in (3, 5):
        a, b, e = torch.randn(n, 4), torch.randn(n + 1, 4), torch.empty(0)
        torch.testing.assert_close(g(a.to("tpu"), b.to("tpu"), e.to("tpu")).cpu(), f(a, b, e))


class _RegionBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 16)

    @torch.compiler.nested_compile_region
    def forward(self, x):
        return x + self.b(F.gelu(self.a(x))).softmax(-1)


def _region_programs(monkeypatch):
    """The GraphProgram of every CompiledGraph made from now on."""
    from torchtpu.compile import backend as be

    programs = []
    init = be.CompiledGraph.__init__

    def spy(self, gm, kind):
        init(self, gm, kind)
        programs.append(self.program)

    monkeypatch.setattr(be.CompiledGraph, "__init__", spy)
    return programs


def test_nested_compile_region_runs_in_the_graph(monkeypatch):
    """torch.compiler.nested_compile_region: repeated blocks are invoke_subgraph calls of one region,
    lowered in the executable (not the eager fallback), each region planned once however many blocks
    call it."""
    programs = _region_programs(monkeypatch)
    torch.manual_seed(0)
    cpu = nn.Sequential(*[_RegionBlock() for _ in range(3)]).eval()
    x = torch.randn(4, 16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="torchtpu")  # no graph runs in eager mode
        out = torch.compile(copy.deepcopy(cpu).to("tpu"), backend="tpu")(x.to("tpu"))
        torch.testing.assert_close(out.cpu(), cpu(x), **TOL)
    calls = [s for p in programs for s in p.steps if s.kind == "subgraph"]
    assert len(calls) >= 2
    assert len({id(s.fn[0]) for s in calls}) < len(calls)  # a region called twice is planned once


@torch.compiler.nested_compile_region
def _writing_region(w, b, cache, x, pos):
    y = F.linear(x, w, b)
    cache.index_copy_(0, pos, y)  # a KV cache's write
    return cache.sum(0, keepdim=True) + y


class _CacheBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        for i in range(3):
            self.register_buffer(f"cache{i}", torch.zeros(4, 8))

    def forward(self, x, pos):
        for i, lin in enumerate(self.lin):
            x = _writing_region(lin.weight, lin.bias, getattr(self, f"cache{i}"), x, pos)
        return x


def test_nested_compile_region_writing_its_inputs(monkeypatch):
    """A region that writes its inputs (a decoder layer's KV cache) arrives as auto_functionalized_v2 of
    invoke_subgraph: lowered too; the writes reach the buffers."""
    programs = _region_programs(monkeypatch)
    torch.manual_seed(0)
    cpu = _CacheBlocks()
    dev = copy.deepcopy(cpu).to("tpu")
    comp = torch.compile(dev, backend="tpu")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("error", message="torchtpu")
        for p in range(2):
            x, pos = torch.randn(1, 8), torch.tensor([p])
            torch.testing.assert_close(comp(x.to("tpu"), pos.to("tpu")).cpu(), cpu(x, pos), **TOL)
    for i in range(3):
        torch.testing.assert_close(getattr(dev, f"cache{i}").cpu(), getattr(cpu, f"cache{i}"), **TOL)
    assert any(s.kind == "subgraph_writes" for p in programs for s in p.steps)


@pytest.mark.slow
def test_nested_compile_region_training(monkeypatch):
    """The same with a backward: the regions' forward and backward graphs run in the executables."""
    programs = _region_programs(monkeypatch)
    torch.manual_seed(0)
    cpu = nn.Sequential(*[_RegionBlock() for _ in range(3)])
    dev = copy.deepcopy(cpu).to("tpu")
    x = torch.randn(4, 16)
    xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="torchtpu")
        out = torch.compile(dev, backend="tpu")(xt)
        out.pow(2).sum().backward()
    ref = cpu(xc)
    ref.pow(2).sum().backward()
    torch.testing.assert_close(out.cpu(), ref, **TOL)
    torch.testing.assert_close(xt.grad.cpu(), xc.grad, **TOL)
    torch.testing.assert_close(dev[1].a.weight.grad.cpu(), cpu[1].a.weight.grad, **TOL)
    assert sum(s.kind == "subgraph" for p in programs for s in p.steps) >= 4
