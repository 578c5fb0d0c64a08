"""Training with torch.compile on tpu: losses and parameters after several steps equal the CPU's; the
compiled forward returns no copies of the weights it saves for the backward (they are views made on the
host); a compiled optimizer step whose donated buffers XLA would copy is compiled without donation."""

from __future__ import annotations

import copy

import pytest
import torch

import torchtpu  # noqa: F401
from torchtpu.compile import backend as B

STEPS = 4


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def _train(model, opt, opt_step, forward, batches, device):
    losses = []
    for ids in batches:
        ids = ids.to(device)
        opt.zero_grad(set_to_none=True)
        loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        opt_step()
        losses.append(loss.detach().cpu())
    return torch.stack(losses)


@pytest.fixture(scope="module")
def batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 128, (2, 16), generator=g) for _ in range(STEPS)]


@pytest.mark.parametrize("optimizer", ["eager", "compiled", "fused"])
def test_compiled_llama_training_matches_cpu(batches, optimizer):
    """`torch.compile(model)` with AdamW stepped eagerly (foreach), through `torch.compile(opt.step)`, or
    AdamW(fused=True): after STEPS steps the losses and every parameter equal the CPU's."""
    base = _llama()
    cpu = copy.deepcopy(base)
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-3, eps=1e-5)
    want = _train(cpu, opt_cpu, opt_cpu.step, cpu, batches, "cpu")

    dev = copy.deepcopy(base).to("tpu")
    opt = torch.optim.AdamW(dev.parameters(), lr=1e-3, eps=1e-5, fused=True if optimizer == "fused" else None)
    opt_step = torch.compile(opt.step, backend="tpu") if optimizer == "compiled" else opt.step
    got = _train(dev, opt, opt_step, torch.compile(dev, backend="tpu", dynamic=False), batches, "tpu")

    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-3, atol=2e-5, msg=name)
    for p, q in zip(opt_cpu.state.values(), opt.state.values()):
        torch.testing.assert_close(q["exp_avg"].cpu(), p["exp_avg"], rtol=1e-3, atol=1e-6)
        torch.testing.assert_close(q["exp_avg_sq"].cpu(), p["exp_avg_sq"], rtol=1e-3, atol=1e-9)


def _graphs(monkeypatch):
    made = []
    init = B.CompiledGraph.__init__

    def record(self, gm, kind):
        init(self, gm, kind)
        made.append(self)

    monkeypatch.setattr(B.CompiledGraph, "__init__", record)
    return made


def test_forward_saves_weights_as_views_not_copies(monkeypatch, batches):
    """The training forward returns the weights the backward needs (`primals`, `t(primals)`): those come
    back as views of the parameters (same storage), not as copies the executable makes."""
    made = _graphs(monkeypatch)
    dev = _llama().to("tpu")
    ids = batches[0].to("tpu")
    loss = torch.compile(dev, backend="tpu", dynamic=False)(input_ids=ids, labels=ids).loss
    forward = next(g for g in made if g.kind == "forward")
    from_inputs = [p for p in forward.alias_plan if p[1] == "in"]
    weights = sum(p.dim() == 2 for p in dev.parameters())
    assert len(from_inputs) >= weights, forward.alias_plan  # each matrix saved as itself or transposed
    entry = forward.last_entry
    assert entry.n_arrays == len(entry.outs) - len(forward.alias_plan)
    loss.backward()
    assert all(p.grad is not None for p in dev.parameters())


def _views(x, y):
    z = y * 2
    return x, x.t(), z, z.view(-1), z.detach(), x[1:, :2]


def test_outputs_that_alias_inputs_or_outputs(monkeypatch):
    """Outputs that are inputs, views of inputs or views of other outputs: the CPU's values and strides,
    and they share storage with what they view (as eager PyTorch's would)."""
    made = _graphs(monkeypatch)
    x, y = torch.randn(3, 4), torch.randn(2, 5)
    xt, yt = x.to("tpu"), y.to("tpu")
    fn = torch.compile(_views, backend="tpu", fullgraph=True)
    for _ in range(2):  # the second call takes the fast key
        got = fn(xt, yt)
        want = _views(x, y)
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w)
            assert g.stride() == w.stride() and g.storage_offset() == w.storage_offset()
    graph = made[-1]
    assert len(graph.alias_plan) >= 2, graph.alias_plan
    z_storage = got[2].untyped_storage().data_ptr()
    assert got[3].untyped_storage().data_ptr() == z_storage
    assert got[4].untyped_storage().data_ptr() == z_storage
    yt.mul_(0)  # the outputs are not views of y
    torch.testing.assert_close(got[2].cpu(), y * 2)


def _mutate_and_return(x, buf):
    buf.add_(x)
    return buf, buf.t(), x


def test_mutated_input_returned_has_its_new_value():
    buf_c, x_c = torch.zeros(3, 3), torch.randn(3, 3)
    buf, x = buf_c.to("tpu"), x_c.to("tpu")
    fn = torch.compile(_mutate_and_return, backend="tpu", fullgraph=True)
    for _ in range(3):
        got = fn(x, buf)
        want = _mutate_and_return(x_c, buf_c)
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w)
    torch.testing.assert_close(buf.cpu(), buf_c)


def test_optimizer_step_that_xla_would_copy_is_not_donated(monkeypatch):
    """Compiled AdamW: XLA recomputes the new moments from the old ones inside the parameter update, so
    donated moments would be copied into a temporary at every call (page-faulted afresh once it is large:
    the threshold is lowered here to keep the model small). Either XLA updates the donated state in place
    (storages holding arrays of their tensors' shapes: it does on XLA:CPU) or the step is compiled without
    donation: no temporary as large as the state, and the parameters still equal the CPU's."""
    made = _graphs(monkeypatch)
    monkeypatch.setattr(B, "_FRESH_MAPPING_BYTES", 1 << 16)
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256))
    dev = copy.deepcopy(cpu).to("tpu")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3, eps=1e-4, capturable=(m is dev)) for m in (cpu, dev)]
    step = torch.compile(opts[1].step, backend="tpu")
    for _ in range(3):
        x = torch.randn(8, 256)
        for m, o in zip((cpu, dev), opts):
            o.zero_grad()
            m(x.to(next(m.parameters()).device)).square().mean().backward()
        opts[0].step()
        step()
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)
    entry = next(g for g in made if g.program.mutated_placeholders).last_entry
    state_bytes = sum(p.numel() * 4 * 3 for p in dev.parameters())
    temp = entry.fn.memory_analysis().temp_size_in_bytes
    assert temp * 4 < state_bytes, (temp, state_bytes, entry.donate)


def test_copies_donations_rule():
    class Analysis:
        def __init__(self, temp):
            self.temp_size_in_bytes = temp

    class Compiled:
        def __init__(self, temp):
            self.temp = temp

        def memory_analysis(self):
            return Analysis(self.temp)

    big = B._FRESH_MAPPING_BYTES
    assert B._copies_donations(Compiled(big), [4 * big])
    assert not B._copies_donations(Compiled(big), [4 * big + 1])  # a temporary smaller than a quarter
    assert not B._copies_donations(Compiled(big - 1), [big - 1])  # small temporaries are reused
    assert not B._copies_donations(object(), [4 * big])  # no memory analysis: keep donating
    # a large temporary the plain executable has too (attention's float32 copy of a bf16 KV cache) is not
    # the donation's: keep donating; one the donation adds (copies of the donated buffers): stop
    assert not B._donation_adds_temporary(Compiled(big), Compiled(big), [4 * big])
    assert not B._donation_adds_temporary(Compiled(2 * big), Compiled(big + 1), [4 * big])
    assert B._donation_adds_temporary(Compiled(2 * big), Compiled(big), [4 * big])
    assert B._donation_adds_temporary(Compiled(big), object(), [4 * big])  # no analysis: as before


def test_backward_is_called_boxed_without_a_warning():
    # AOTAutograd wraps the compiled backward in torch._dynamo.disable; the wrapper must still say it
    # takes boxed arguments, or every backward warns (and its inputs stay alive through the call)
    import warnings

    from torch.testing import assert_close

    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    tpu = copy.deepcopy(cpu).to("tpu")
    compiled = torch.compile(tpu, backend="tpu", dynamic=False)
    x = torch.randn(4, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            compiled(x.to("tpu")).sum().backward()
    cpu(x).sum().backward()
    cpu(x).sum().backward()
    assert not [w for w in caught if "boxed arguments" in str(w.message)]
    for p_cpu, p_tpu in zip(cpu.parameters(), tpu.parameters()):
        assert_close(p_tpu.grad.cpu(), p_cpu.grad)
