"""Hugging Face Transformers on "tpu": loading (device_map, dtype, memory), Trainer and fine-tuning, against
the CPU. Generation is in tests/test_transformers_generate.py.

Everything is built locally from tiny configs and a tiny word-level tokenizer (tests/tiny_llama.py): no
downloads.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

transformers = pytest.importorskip("transformers")
import tiny_llama as tiny  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import torchtpu.integrations  # noqa: E402

# Installed at `import torch` once torchtpu/__init__.py calls it; idempotent.
torchtpu.integrations.install()


def _params_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )


# ------------------------------------------------------------------ loading
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    model = tiny.model(seed=3)
    model.save_pretrained(path)
    tiny.tokenizer().save_pretrained(path)
    return path, model


def _assert_same_weights(got, ref, exact=True):
    sd_g, sd_r = got.state_dict(), ref.state_dict()
    assert sd_g.keys() == sd_r.keys()
    for k in sd_r:
        if exact:
            assert torch.equal(sd_g[k].cpu(), sd_r[k].cpu()), k
        else:
            torch.testing.assert_close(sd_g[k].cpu(), sd_r[k].cpu())


def _checkpoint_bytes(path):
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def _load_measured(path, **kw):
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    model = AutoModelForCausalLM.from_pretrained(path, **kw)
    torch.tpu.synchronize()
    return model, torch.tpu.max_memory_allocated() - before, torch.tpu.memory_allocated() - before


def test_from_pretrained_device_map_tpu_bf16(tmp_path):
    # hidden size 40: shapes no other test uses, so every executable here is built fresh
    tiny.model(seed=4, hidden_size=40, intermediate_size=80).to(torch.bfloat16).save_pretrained(tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    model, peak, resident = _load_measured(tmp_path, device_map="tpu", dtype=torch.bfloat16)
    size = _params_bytes(model)
    assert {p.device for p in model.parameters()} == {torch.device("tpu", 0)}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    _assert_same_weights(model, ref)
    # peak device memory while loading == the model itself: no second copy, no staging buffers
    assert size <= _checkpoint_bytes(tmp_path)
    assert resident == size and peak == size, (peak, resident, size, _checkpoint_bytes(tmp_path))
    ids, mask = tiny.left_padded(torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids.to("tpu"), attention_mask=mask.to("tpu")).logits
        want = ref(ids, attention_mask=mask).logits
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=2e-2, atol=2e-2)


def test_from_pretrained_casting_checkpoint_frees_float32_copies(tmp_path):
    # a float32 checkpoint loaded as bfloat16: each tensor is staged in float32 then cast; fresh
    # shapes (hidden 48), so the executables are built here (docs/design.md, "The eager engine")
    tiny.model(seed=4, hidden_size=48, intermediate_size=96).save_pretrained(tmp_path)
    model, peak, resident = _load_measured(tmp_path, device_map="tpu", dtype=torch.bfloat16)
    size = _params_bytes(model)
    largest = max(p.numel() for p in model.parameters()) * 4
    assert resident == size, (resident, size)
    assert peak <= size + 2 * largest, (peak, size, largest)


def test_from_pretrained_second_device(checkpoint):
    path, ref = checkpoint
    model = AutoModelForCausalLM.from_pretrained(path, device_map="tpu:1", dtype=torch.float32)
    assert {p.device for p in model.parameters()} == {torch.device("tpu", 1)}
    _assert_same_weights(model, ref)
    ids, mask = tiny.left_padded(torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(ids.to("tpu:1"), attention_mask=mask.to("tpu:1")).logits
        want = ref(ids, attention_mask=mask).logits
    assert got.device == torch.device("tpu", 1)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)


def test_device_map_split_across_two_devices(checkpoint):
    path, ref = checkpoint
    model = AutoModelForCausalLM.from_pretrained(
        path, device_map={"model": "tpu:0", "lm_head": "tpu:1"}, dtype=torch.float32
    )
    assert model.lm_head.weight.device == torch.device("tpu", 1)
    assert model.model.embed_tokens.weight.device == torch.device("tpu", 0)
    ids, mask = tiny.left_padded(torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = model(ids.to("tpu:0"), attention_mask=mask.to("tpu:0")).logits
        want = ref(ids, attention_mask=mask).logits
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)


def test_device_map_auto_places_on_tpu_and_splits_with_max_memory(checkpoint):
    path, ref = checkpoint
    # no max_memory: Accelerate asks torch.accelerator ("tpu") for the device and its free memory
    whole = AutoModelForCausalLM.from_pretrained(path, device_map="auto", dtype=torch.float32)
    assert {p.device for p in whole.parameters()} == {torch.device("tpu", 0)}
    # a budget that holds the embedding and one decoder layer (each ~17 KB here; Accelerate also keeps room
    # for the largest layer): the rest is offloaded to the CPU with hooks that stream weights in, as on CUDA
    split = AutoModelForCausalLM.from_pretrained(
        path, device_map="auto", max_memory={0: "60KB", "cpu": "1GB"}, dtype=torch.float32
    )
    placed = set(split.hf_device_map.values())
    assert 0 in placed and "cpu" in placed, split.hf_device_map
    assert split.model.embed_tokens.weight.device == torch.device("tpu", 0)
    ids, mask = tiny.left_padded(torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
        for model in (whole, split):
            got = model(ids.to("tpu"), attention_mask=mask.to("tpu")).logits
            assert got.device == torch.device("tpu", 0)
            torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)
    kw = dict(max_new_tokens=4, do_sample=False)
    tokens = split.generate(input_ids=ids.to("tpu"), attention_mask=mask.to("tpu"), **kw)
    assert torch.equal(tokens.cpu(), ref.generate(input_ids=ids, attention_mask=mask, **kw))


def test_model_to_tpu_and_save_pretrained_round_trip(checkpoint, tmp_path):
    _, ref = checkpoint
    model = copy.deepcopy(ref).to("tpu")
    assert all(p.device.type == "tpu" for p in model.parameters())
    with torch.no_grad():  # change the weights on the device, so the round trip cannot pass by accident
        for p in model.parameters():
            p.mul_(1.5)
    model.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    expected = copy.deepcopy(ref)
    with torch.no_grad():
        for p in expected.parameters():
            p.mul_(1.5)
    _assert_same_weights(back, expected)


# ------------------------------------------------------------------ training
def _train_data(n=8, seq=8, seed=21):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(len(tiny.SPECIAL), tiny.VOCAB, (n, seq), generator=gen)


def test_finetune_loop_matches_cpu_step_for_step():
    cpu = tiny.model(seed=9, tie_word_embeddings=True).train()
    tpu = copy.deepcopy(cpu).to("tpu")
    assert tpu.lm_head.weight is tpu.model.embed_tokens.weight  # tied weights stay tied on .to("tpu")
    data = _train_data()
    losses = {}
    for name, model, dev in (("cpu", cpu, "cpu"), ("tpu", tpu, "tpu")):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=4)
        out = []
        for step in range(4):
            batch = data[2 * step : 2 * step + 2].to(dev)
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            out.append(loss.item())
        losses[name] = out
    torch.testing.assert_close(torch.tensor(losses["tpu"]), torch.tensor(losses["cpu"]), rtol=1e-4, atol=1e-5)
    assert losses["cpu"][-1] != losses["cpu"][0]
    for (n, pc), pt in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(pt.detach().cpu(), pc.detach(), rtol=1e-3, atol=1e-4, msg=lambda m: f"{n}: {m}")


def test_module_to_keeps_tied_parameters():
    lin, emb = torch.nn.Linear(4, 3, bias=False), torch.nn.Embedding(3, 4)
    lin.weight = emb.weight
    m = torch.nn.ModuleDict(dict(head=lin, emb=emb))
    for device in ("tpu:0", "tpu:1", "cpu"):
        m = m.to(device)
        assert m.head.weight is m.emb.weight and m.head.weight.device == torch.device(device)
        assert len(list(m.parameters())) == 1
    m = m.to("tpu").to(torch.bfloat16)
    assert m.head.weight is m.emb.weight and m.head.weight.dtype == torch.bfloat16


def test_accelerate_and_training_arguments_pick_tpu(tmp_path):
    pytest.importorskip("accelerate")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from transformers import TrainingArguments

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        assert Accelerator().device.type == "tpu"
        AcceleratorState._reset_state(reset_partial_state=True)
        args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
        assert args.device.type == "tpu"
        # one process trains on one device however many are visible (as on XPU/NPU; CUDA alone wraps
        # the model in nn.DataParallel): data parallel is torchrun's DDP, one device per rank
        # (tests/test_distributed_hf.py::test_trainer_data_parallel_matches_one_process)
        assert torch.tpu.device_count() == int(os.environ.get("TORCHTPU_NUM_DEVICES", "2"))
        assert args.n_gpu == 1 and args.parallel_mode.value == "not_parallel"
        assert args.train_batch_size == args.per_device_train_batch_size
        AcceleratorState._reset_state(reset_partial_state=True)
        assert TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True).device.type == "cpu"
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


# fp32 runs under `-m slow`: by default bf16 runs the Trainer end to end on tpu, and the fp32 parity of
# what it drives is kept by test_finetune_loop_matches_cpu_step_for_step (AdamW, grad clipping, linear
# schedule, tied weights, tight tolerances), test_fused_adam_matches_cpu (fused AdamW, Trainer's default)
# and test_dataloader_pin_memory_on_tpu (the pinned-memory DataLoader)
@pytest.mark.parametrize("precision", [pytest.param("fp32", marks=pytest.mark.slow), "bf16"])
def test_trainer_on_tpu_matches_cpu(tmp_path, precision):
    # Trainer defaults throughout (fused AdamW, pinned-memory DataLoader, linear schedule)
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState
    from transformers import Trainer, TrainingArguments

    data = _train_data(n=6)
    dataset = [{"input_ids": row, "labels": row} for row in data]
    base = tiny.model(seed=17, tie_word_embeddings=True)
    histories, models = {}, {}
    for name, use_cpu in (("cpu", True), ("tpu", False)):
        AcceleratorState._reset_state(reset_partial_state=True)
        args = TrainingArguments(
            output_dir=str(tmp_path / name),
            per_device_train_batch_size=2,
            max_steps=3,
            learning_rate=2e-3,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=use_cpu,
            seed=5,
            disable_tqdm=True,
            bf16=precision == "bf16",
        )
        model = copy.deepcopy(base)
        trainer = Trainer(model=model, args=args, train_dataset=dataset)
        trainer.train()
        assert next(trainer.model.parameters()).device.type == name
        histories[name] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        models[name] = trainer.model
    AcceleratorState._reset_state(reset_partial_state=True)
    assert len(histories["tpu"]) == 3
    # bf16 autocast: both sides round matmuls to bfloat16, not necessarily at the same places; Adam's
    # normalized update turns a sign flip of a tiny gradient into a 2*lr step, so parameters may
    # differ by up to 3 steps * 2 * lr in a few elements
    loss_tol, param_tol = (
        (dict(rtol=1e-4, atol=1e-4), dict(rtol=1e-3, atol=1e-4))
        if precision == "fp32"
        else (dict(rtol=2e-2, atol=2e-2), dict(rtol=0, atol=3 * 2 * 2e-3 + 1e-3))
    )
    torch.testing.assert_close(torch.tensor(histories["tpu"]), torch.tensor(histories["cpu"]), **loss_tol)
    for pc, pt in zip(models["cpu"].parameters(), models["tpu"].parameters()):
        torch.testing.assert_close(pt.detach().cpu(), pc.detach(), **param_tol)


def test_device_spec_file():
    from torchtpu.integrations import transformers_device_spec as spec

    assert spec.DEVICE_NAME == "tpu"
    spec.MANUAL_SEED_FN(3)
    a = torch.randn(4, device="tpu").cpu()
    spec.MANUAL_SEED_FN(3)
    assert torch.equal(torch.randn(4, device="tpu").cpu(), a)
    assert spec.DEVICE_COUNT_FN() == int(os.environ.get("TORCHTPU_NUM_DEVICES", "2"))


@pytest.mark.parametrize(
    "cls,kw",
    [
        (torch.optim.AdamW, dict(weight_decay=0.1)),
        (torch.optim.Adam, dict(weight_decay=0.05, amsgrad=True)),
        (torch.optim.AdamW, dict(maximize=True, betas=(0.8, 0.95))),
    ],
)
def test_fused_adam_matches_cpu(cls, kw):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    tpu = copy.deepcopy(cpu).to("tpu")
    opts = [cls(m.parameters(), lr=1e-2, fused=True, **kw) for m in (cpu, tpu)]
    scheds = [torch.optim.lr_scheduler.StepLR(o, 1, 0.5) for o in opts]
    for _ in range(3):
        x = torch.randn(4, 5)
        cpu(x).pow(2).sum().backward()
        tpu(x.to("tpu")).pow(2).sum().backward()
        for o, s in zip(opts, scheds):
            o.step()
            o.zero_grad()
            s.step()
    for a, b in zip(cpu.parameters(), tpu.parameters()):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-5, atol=1e-6)
    for sa, sb in zip(opts[0].state.values(), opts[1].state.values()):
        torch.testing.assert_close(sb["exp_avg_sq"].cpu(), sa["exp_avg_sq"], rtol=1e-5, atol=1e-7)


def test_transformers_testing_utils_load_the_device_spec(tmp_path):
    """What TRANSFORMERS_TEST_DEVICE_SPEC does in transformers' own suite, in a fresh process."""
    import subprocess
    import sys

    env = dict(
        os.environ,
        TRANSFORMERS_TEST_BACKEND="torchtpu",
        TRANSFORMERS_TEST_DEVICE="tpu",
        TRANSFORMERS_TEST_DEVICE_SPEC="tpu_spec.py",
        PYTHONPATH=str(tmp_path),
    )
    # one child (torch and the device start once): the spec module's command line, as `python -m
    # torchtpu.integrations.transformers_device_spec tpu_spec.py` runs it, writes the spec that
    # transformers.testing_utils then imports
    code = (
        "import runpy, sys\n"
        "sys.argv = ['transformers_device_spec', 'tpu_spec.py']\n"
        "runpy.run_module('torchtpu.integrations.transformers_device_spec', run_name='__main__', alter_sys=True)\n"
        "import os; assert os.path.isfile('tpu_spec.py')\n"
        "import torch, transformers.testing_utils as t\n"
        "t.backend_manual_seed('tpu', 5); a = torch.randn(3, device='tpu').cpu()\n"
        "t.backend_manual_seed('tpu', 5); assert torch.equal(a, torch.randn(3, device='tpu').cpu())\n"
        "print(t.torch_device, t.backend_device_count('tpu'), t.BACKEND_EMPTY_CACHE['tpu'] is torch.tpu.empty_cache)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    wrote, result = out.stdout.strip().splitlines()
    assert wrote.startswith("wrote tpu_spec.py"), wrote
    assert result.split() == ["tpu", os.environ.get("TORCHTPU_NUM_DEVICES", "2"), "True"]


def test_dataloader_pin_memory_on_tpu():
    # pinning needs a C++ pinned allocator a Python backend cannot provide: the iterator skips it
    data = torch.randn(8, 3)
    loader = torch.utils.data.DataLoader(data, batch_size=4, pin_memory=True)
    batches = [b.to("tpu") for b in loader]
    assert [b.device.type for b in batches] == ["tpu", "tpu"]
    torch.testing.assert_close(torch.cat(batches).cpu(), data)
