"""torch.tpu.optimizers.SingleTraceTrainer: forward + loss + backward + optimizer update as one
executable per step, matching the same model trained on the CPU with torch.optim."""

from __future__ import annotations

import copy

import jax
import pytest
import torch
import torch.nn.functional as F

from torchtpu.optim import SGD, AdamW, Muon, SingleTraceTrainer


def _mlp(seed=0, bias=True):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16, bias=bias), torch.nn.Tanh(), torch.nn.Linear(16, 4, bias=bias))


def _batches(n, seed=1, shape_x=(6, 8), shape_y=(6, 4)):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape_x, generator=g), torch.randn(shape_y, generator=g)) for _ in range(n)]


def _close_params(cpu_model, tpu_model, **tol):
    for (name, pc), pt in zip(cpu_model.named_parameters(), tpu_model.parameters()):
        torch.testing.assert_close(pt.detach().cpu(), pc.detach(), msg=name, **tol)


class _Compiles:
    """XLA compiles seen by JAX's monitoring (every executable JAX builds reports one)."""

    def __enter__(self):
        self.events = []
        self._listener = lambda event, duration, **kw: "backend_compile" in event and self.events.append(event)
        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listener)


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_mlp_matches_cpu_one_executable_across_lr_schedule(kind):
    cpu = _mlp()
    tpu = copy.deepcopy(cpu).to("tpu")
    if kind == "adamw":
        ref = torch.optim.AdamW(cpu.parameters(), lr=1e-2, weight_decay=0.1)
        opt = AdamW(tpu.parameters(), lr=1e-2, weight_decay=0.1)
    else:
        ref = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
        opt = SGD(tpu.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.7) for o in (ref, opt)]
    trainer = SingleTraceTrainer(tpu, opt)
    data = _batches(6)
    step = trainer.make_compiled_train_step(data[0][0].to("tpu"), data[0][1].to("tpu"))
    # clones of whole storages share the parameters' buffers: the step copies those it donates,
    # so the clones keep the old values (and no second executable is built for them)
    snapshot = [p.detach().clone() for p in tpu.parameters()]
    initial = [p.detach().clone() for p in cpu.parameters()]
    losses = []
    with _Compiles() as compiles:
        for i, (x, y) in enumerate(data):
            ref.zero_grad()
            loss = F.mse_loss(cpu(x), y)
            loss.backward()
            ref.step()
            losses.append((loss.detach(), step(x.to("tpu"), y.to("tpu"))))
            for s in scheds:
                s.step()  # a new lr every step: a traced scalar
            if i == 0:
                assert trainer.executables_built == 1 and compiles.events
                compiles.events.clear()
    assert compiles.events == []  # steps 2..6 (each with another lr): no XLA compile at all
    assert trainer.executables_built == 1 and trainer.graphs_traced == 1
    assert trainer.buffers_copied == len(snapshot)
    for old, want in zip(snapshot, initial):
        torch.testing.assert_close(old.cpu(), want)
    for lc, lt in losses:
        assert lt.device.type == "tpu" and lt.shape == ()
        torch.testing.assert_close(lt.cpu(), lc)
    _close_params(cpu, tpu)
    # the optimizer's own state is the one updated: state_dict matches torch's, key by key
    sd_ref, sd = ref.state_dict(), opt.state_dict()
    assert sd["param_groups"] == sd_ref["param_groups"]
    for i, st in sd_ref["state"].items():
        assert set(sd["state"][i]) == set(st)
        for k, v in st.items():
            torch.testing.assert_close(sd["state"][i][k].cpu(), v)


def test_plain_optimizer_step_continues_after_trainer_steps():
    cpu = _mlp(3)
    tpu = copy.deepcopy(cpu).to("tpu")
    ref, opt = torch.optim.AdamW(cpu.parameters(), lr=5e-3), AdamW(tpu.parameters(), lr=5e-3)
    data = _batches(5, seed=4)
    step = SingleTraceTrainer(tpu, opt).make_compiled_train_step(data[0][0].to("tpu"), data[0][1].to("tpu"))
    for i, (x, y) in enumerate(data):
        ref.zero_grad()
        F.mse_loss(cpu(x), y).backward()
        ref.step()
        if i < 3:
            step(x.to("tpu"), y.to("tpu"))
        else:  # the eager loop takes over from the same parameters and optimizer state
            opt.zero_grad()
            F.mse_loss(tpu(x.to("tpu")), y.to("tpu")).backward()
            opt.step()
    _close_params(cpu, tpu)


def test_tiny_llama_matches_cpu_adamw():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    cpu = transformers.LlamaForCausalLM(config)
    tpu = copy.deepcopy(cpu).to("tpu")
    assert tpu.lm_head.weight is tpu.model.embed_tokens.weight  # one parameter under two names
    ref, opt = torch.optim.AdamW(cpu.parameters(), lr=3e-3), AdamW(tpu.parameters(), lr=3e-3)
    trainer = SingleTraceTrainer(tpu, opt)
    g = torch.Generator().manual_seed(5)
    data = torch.randint(0, 64, (6, 8), generator=g)
    on_tpu = data.to("tpu")  # each batch a view into it: its storage offset travels traced
    step = trainer.make_compiled_train_step({"input_ids": on_tpu[0:2], "labels": on_tpu[0:2]})
    for i in range(0, 6, 2):
        ids = data[i : i + 2]
        ref.zero_grad()
        loss = cpu(input_ids=ids, labels=ids).loss  # out.loss: the default rule's choice
        loss.backward()
        ref.step()
        got = step({"input_ids": on_tpu[i : i + 2], "labels": on_tpu[i : i + 2]})
        torch.testing.assert_close(got.cpu(), loss.detach(), rtol=1e-5, atol=1e-5)
    # AdamW divides by sqrt(v): last-bit differences of the gradients move parameters by ~1e-6 * lr
    _close_params(cpu, tpu, rtol=1e-4, atol=5e-5)
    assert trainer.executables_built == 1
    assert "model.embed_tokens.weight" in trainer.params and trainer.param_group is opt.param_groups[0]


def test_without_optimizer_grads_accumulate_like_backward():
    cpu = _mlp(2)
    tpu = copy.deepcopy(cpu).to("tpu")
    (x1, y1), (x2, y2) = _batches(2, seed=6)
    step = SingleTraceTrainer(tpu).make_compiled_train_step(x1.to("tpu"), y1.to("tpu"))
    loss = step(x1.to("tpu"), y1.to("tpu"))
    ref = F.mse_loss(cpu(x1), y1)
    ref.backward()
    torch.testing.assert_close(loss.cpu(), ref.detach())
    for pc, pt in zip(cpu.parameters(), tpu.parameters()):
        assert pt.grad is not None and pt.grad.device.type == "tpu"
        torch.testing.assert_close(pt.grad.cpu(), pc.grad)
    grad_before = tpu[0].weight.grad
    step(x2.to("tpu"), y2.to("tpu"))  # a second step adds, into the same .grad tensor
    F.mse_loss(cpu(x2), y2).backward()
    assert tpu[0].weight.grad is grad_before
    for pc, pt in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(pt.grad.cpu(), pc.grad)
    tpu.zero_grad()
    step(x1.to("tpu"), y1.to("tpu"))
    cpu.zero_grad()
    F.mse_loss(cpu(x1), y1).backward()
    for pc, pt in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(pt.grad.cpu(), pc.grad)


class _Net(torch.nn.Module):
    """BatchNorm (running statistics: a buffer the forward writes), a frozen parameter, a parameter
    the loss never reaches, a dict output and keyword inputs."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(8, 12, bias=False)  # (a bias before BatchNorm has no gradient but noise)
        self.bn = torch.nn.BatchNorm1d(12)
        self.frozen = torch.nn.Linear(12, 12)
        self.frozen.requires_grad_(False)
        self.out = torch.nn.Linear(12, 3)
        self.unused = torch.nn.Parameter(torch.randn(5))

    def forward(self, x, scale=1.0):
        return {"logits": self.out(torch.relu(self.frozen(self.bn(self.inp(x))))) * scale}


def test_buffers_frozen_and_unused_parameters_and_logits_rule():
    torch.manual_seed(7)
    cpu = _Net()
    tpu = copy.deepcopy(cpu).to("tpu")
    ref, opt = torch.optim.AdamW(cpu.parameters(), lr=1e-2), AdamW(tpu.parameters(), lr=1e-2)
    trainer = SingleTraceTrainer(tpu, opt)
    xs = [x for x, _ in _batches(3, seed=8, shape_x=(10, 8))]
    step = trainer.make_compiled_train_step({"x": xs[0].to("tpu"), "scale": 0.5})
    for x in xs:
        ref.zero_grad()
        loss = cpu(x, scale=0.5)["logits"].mean()  # no targets, no loss field: mean of the logits
        loss.backward()
        ref.step()
        torch.testing.assert_close(step({"x": x.to("tpu"), "scale": 0.5}).cpu(), loss.detach())
    _close_params(cpu, tpu)
    for name, b in cpu.named_buffers():
        torch.testing.assert_close(dict(tpu.named_buffers())[name].cpu(), b, msg=name)
    assert tpu.unused not in opt.state and tpu.frozen.weight not in opt.state  # skipped, as in torch
    assert len(opt.state) == len(ref.state)
    # another Python value in the inputs is another trace; the same structure is required
    step({"x": xs[0].to("tpu"), "scale": 2.0})
    assert trainer.graphs_traced == 2
    with pytest.raises(ValueError, match="another structure"):
        step({"x": xs[0].to("tpu")})


def test_compute_loss_fn_sees_the_traced_parameters_and_muon():
    cpu = _mlp(9, bias=False)
    tpu = copy.deepcopy(cpu).to("tpu")

    def loss_fn(model, args, kwargs):
        x, y = args
        return F.smooth_l1_loss(model(x), y) + 1e-3 * model[0].weight.square().sum()

    ref = torch.optim.Muon(cpu.parameters(), lr=0.02, weight_decay=0.1)
    opt = Muon(tpu.parameters(), lr=0.02, weight_decay=0.1)
    data = _batches(3, seed=10)
    step = SingleTraceTrainer(tpu, opt, compute_loss_fn=loss_fn).make_compiled_train_step(
        tuple(t.to("tpu") for t in data[0])
    )
    for x, y in data:
        ref.zero_grad()
        loss = loss_fn(cpu, (x, y), {})
        loss.backward()
        ref.step()
        torch.testing.assert_close(step((x.to("tpu"), y.to("tpu"))).cpu(), loss.detach())
    _close_params(cpu, tpu, rtol=2e-2, atol=2e-3)  # Newton-Schulz runs in bfloat16


def test_dropout_draws_new_masks_each_step():
    torch.manual_seed(11)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Dropout(0.5), torch.nn.Linear(64, 1)).to("tpu")
    trainer = SingleTraceTrainer(model)
    x = torch.randn(4, 8, device="tpu")
    step = trainer.make_compiled_train_step(x)
    step(x)
    first = model[0].weight.grad.clone()
    model.zero_grad()
    step(x)
    assert not torch.equal(first.cpu(), model[0].weight.grad.cpu())  # same input, another mask
    model.eval()  # eval mode: no dropout, a second trace, deterministic
    model.zero_grad()
    step(x)
    a = model[0].weight.grad.clone()
    model.zero_grad()
    step(x)
    torch.testing.assert_close(model[0].weight.grad.cpu(), a.cpu())
    assert trainer.graphs_traced == 2


def test_autocast_around_the_call_selects_its_own_trace():
    cpu = _mlp(14)
    tpu = copy.deepcopy(cpu).to("tpu")
    trainer = SingleTraceTrainer(tpu)
    x = torch.randn(5, 8)
    step = trainer.make_compiled_train_step(x.to("tpu"))
    with torch.autocast("tpu", dtype=torch.bfloat16):
        loss = step(x.to("tpu"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = cpu(x).mean()
    ref.backward()
    assert loss.dtype == ref.dtype == torch.bfloat16 and trainer.graphs_traced == 2
    torch.testing.assert_close(loss.cpu(), ref.detach())
    for pc, pt in zip(cpu.parameters(), tpu.parameters()):
        assert pt.grad.dtype == torch.float32
        torch.testing.assert_close(pt.grad.cpu(), pc.grad, rtol=2e-2, atol=2e-2)


class _NoTensorOut(torch.nn.Module):
    def forward(self, x):
        return {"count": 3}


def test_bad_input_is_a_clear_error():
    model = _mlp().to("tpu")
    x, y = (t.to("tpu") for t in _batches(1)[0])
    with pytest.raises(TypeError, match="torch.tpu.optimizers.AdamW, SGD or Muon"):
        SingleTraceTrainer(model, torch.optim.AdamW(model.parameters()))
    with pytest.raises(ValueError, match="not one of the model's"):
        SingleTraceTrainer(model, AdamW([torch.nn.Parameter(torch.randn(3, device="tpu"))]))
    trainer = SingleTraceTrainer(model, SGD(model.parameters(), lr=0.1))
    step = trainer.make_compiled_train_step(x)  # no targets: the mean of the output
    with pytest.raises(ValueError, match="got targets, but make_compiled_train_step's example had none"):
        step(x, y)
    with_targets = trainer.make_compiled_train_step(x, y)
    with pytest.raises(ValueError, match="got no targets"):
        with_targets(x)
    with pytest.raises(RuntimeError, match="an input tensor .shape .6, 8.. is on cpu; the step takes tpu tensors"):
        with_targets(x.cpu(), y)
    with pytest.raises(TypeError, match="may hold tensors, Python scalars"):
        trainer.make_compiled_train_step((x, object()))
    with pytest.raises(RuntimeError, match="parameter '0.weight' .shape .16, 8.. is on cpu"):
        SingleTraceTrainer(_mlp()).make_compiled_train_step(x.cpu())
    with pytest.raises(TypeError, match="loss must be a floating-point tensor of one element"):
        SingleTraceTrainer(model, compute_loss_fn=lambda m, a, k: m(*a)).make_compiled_train_step(x)
    with pytest.raises(RuntimeError, match="reads a tensor's value on the host while it is traced"):
        SingleTraceTrainer(
            model, compute_loss_fn=lambda m, a, k: m(*a).mean() * float(m(*a).sum() > 0)
        ).make_compiled_train_step(x)
    with pytest.raises(TypeError, match="no tensor to take a loss from"):
        SingleTraceTrainer(_NoTensorOut()).make_compiled_train_step(x)
    with pytest.warns(UserWarning, match="compile_fn is accepted for TorchTPU compatibility and not used"):
        SingleTraceTrainer(model, compile_fn=torch.compile)


def test_failed_step_leaves_parameters_and_optimizer_state_as_they_were(monkeypatch):
    from torchtpu.optim import trainer as trainer_module

    model = _mlp(12).to("tpu")
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    adamw = AdamW(model.parameters(), lr=0.1)
    x, y = (t.to("tpu") for t in _batches(1, seed=13)[0])
    before = [p.detach().cpu() for p in model.parameters()]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module, "call_and_commit", interrupted)
    for o in (opt, adamw):
        step = SingleTraceTrainer(model, o).make_compiled_train_step(x, y)
        with pytest.raises(KeyboardInterrupt):
            step(x, y)
    assert not any("momentum_buffer" in st for st in opt.state.values())  # SGD's first-step buffers taken back
    assert all(float(st["step"]) == 0 for st in adamw.state.values())  # AdamW's count did not move
    for old, p in zip(before, model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), old)
    monkeypatch.undo()
    step(x, y)  # and the step runs from there
    assert all(float(st["step"]) == 1 for st in adamw.state.values())


def test_device_side_assert_is_reported_and_commits_nothing():
    from torchtpu.eager.asserts import DeviceAssertError

    torch.manual_seed(15)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.Linear(8, 1)).to("tpu")
    step = SingleTraceTrainer(model, AdamW(model.parameters(), lr=0.1)).make_compiled_train_step(
        torch.tensor([1, 2, 3], device="tpu")
    )
    step(torch.tensor([1, 2, 3], device="tpu"))
    before = [p.detach().cpu() for p in model.parameters()]
    with pytest.raises(DeviceAssertError, match="SingleTraceTrainer step: index out of range"):
        step(torch.tensor([1, 20, 3], device="tpu"))  # as on CUDA: reported at the next sync
        torch.tpu.synchronize()
    torch.tpu.clear_device_assert()  # the error is sticky, as CUDA's
    for old, p in zip(before, model.parameters()):
        assert torch.equal(p.detach().cpu(), old)  # the failed step wrote nothing
