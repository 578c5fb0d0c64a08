"""Hugging Face Diffusers on "tpu": pipelines at parity with the CPU, a compiled denoiser without
recompilations, one copy of the weights in device memory.

Every pipeline is built from tiny random components (torchtpu/integrations/diffusers_tiny.py): no downloads.
Images are compared with the CPU's for the same seed (a CPU generator draws the latents).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
import torch._dynamo.utils as dynamo_utils

import torchtpu
import torchtpu.integrations

# Tied parameters (T5's shared embedding) stay tied across `.to("tpu")`; idempotent.
torchtpu.integrations.install()

from torchtpu.integrations import diffusers_tiny as tiny  # noqa: E402

STEPS = 2
F32_TOL = dict(atol=2e-4, rtol=0)
# bfloat16 end to end (text encoders, denoiser, VAE): the two devices round differently
BF16_MAX, BF16_MEAN = 0.08, 0.01


def _images(pipe, kind, **kw):
    out = pipe(**tiny.call_kwargs(kind, **kw)).images
    return out.float().cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)


@pytest.fixture(scope="module")
def cpu_ref():
    """CPU images per (kind, dtype, steps, size): computed once, on a fresh pipeline."""
    cache = {}

    def get(kind, dtype=torch.float32, steps=STEPS, size=32):
        key = (kind, dtype, steps, size)
        if key not in cache:
            cache[key] = _images(tiny.build(kind, dtype), kind, steps=steps, size=size)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def tpu_pipes():
    """One float32 pipeline per kind on "tpu", shared by the eager and the compiled tests (in that order)."""
    pipes = {}

    def get(kind):
        if kind not in pipes:
            pipes[kind] = tiny.build(kind).to("tpu")
        return pipes[kind]

    yield get
    pipes.clear()
    gc.collect()


def _not_trivial(img):
    assert img.shape[-1] == 3 and np.isfinite(img).all()
    assert img.std() > 1e-3, "a constant image cannot tell devices apart"


def _compile_counts():
    m = torchtpu.metrics()
    return (m["compiled_graphs"], m["compiled_xla_compiles"], dynamo_utils.counters["stats"]["unique_graphs"])


def _delta(before):
    return tuple(a - b for a, b in zip(_compile_counts(), before))


# ------------------------------------------------------------------ eager parity
@pytest.mark.parametrize("kind", tiny.KINDS)
def test_pipeline_matches_cpu_float32(kind, cpu_ref, tpu_pipes):
    ref = cpu_ref(kind)
    pipe = tpu_pipes(kind)
    assert tiny.denoiser(pipe).device.type == "tpu" and pipe.vae.device.type == "tpu"
    img = _images(pipe, kind, steps=STEPS)
    _not_trivial(ref)
    np.testing.assert_allclose(img, ref, **F32_TOL)
    # another seed gives another image on both devices (the generator really drives the latents)
    other = _images(pipe, kind, steps=STEPS, seed=1)
    assert np.abs(other - img).max() > 1e-2


# bfloat16 parity of every pipeline runs under `-m slow`; the default run keeps flux (the cheapest).
@pytest.mark.parametrize("kind", [k if k == "flux" else pytest.param(k, marks=pytest.mark.slow) for k in tiny.KINDS])
def test_pipeline_matches_cpu_bfloat16(kind, cpu_ref):
    ref = cpu_ref(kind, torch.bfloat16)
    pipe = tiny.build(kind, torch.bfloat16).to("tpu")
    assert tiny.denoiser(pipe).dtype == torch.bfloat16
    img = _images(pipe, kind, steps=STEPS)
    _not_trivial(ref)
    diff = np.abs(img - ref)
    assert diff.max() < BF16_MAX and diff.mean() < BF16_MEAN, (diff.max(), diff.mean())


def test_output_type_pt_stays_on_device(cpu_ref):
    kind = "flux"
    ref = cpu_ref(kind)
    pipe = tiny.build(kind).to("tpu")
    out = pipe(**tiny.call_kwargs(kind, steps=STEPS, output_type="pt")).images
    assert isinstance(out, torch.Tensor) and out.device.type == "tpu"
    torch.testing.assert_close(out.permute(0, 2, 3, 1).cpu(), torch.from_numpy(ref), **F32_TOL)


# ------------------------------------------------------------------ compiled denoiser
@pytest.mark.parametrize("kind", tiny.KINDS)
def test_compiled_denoiser_matches_and_does_not_recompile(kind, cpu_ref, tpu_pipes):
    ref = cpu_ref(kind)
    ref48 = cpu_ref(kind, steps=3, size=48)
    pipe = tpu_pipes(kind)
    den = tiny.denoiser(pipe)
    den.compile(backend="tpu", fullgraph=True, dynamic=False)

    before = _compile_counts()
    img = _images(pipe, kind, steps=STEPS)
    graphs, _, dyn_graphs = _delta(before)
    assert graphs >= 1 and dyn_graphs == 1, "the denoiser is one Dynamo graph (fullgraph=True)"
    np.testing.assert_allclose(img, ref, **F32_TOL)

    # the same size again: nothing new anywhere (Dynamo, AOTAutograd, XLA)
    before = _compile_counts()
    img2 = _images(pipe, kind, steps=STEPS)
    assert _delta(before) == (0, 0, 0)
    np.testing.assert_allclose(img2, ref, **F32_TOL)

    # a new size: one new Dynamo graph, and one XLA executable serves its 3 steps (each feeds a new
    # timestep/sigma), what test_scheduler_steps_do_not_recompile checks on a fresh pipeline
    before = _compile_counts()
    img48 = _images(pipe, kind, steps=3, size=48)
    graphs, xla, dyn_graphs = _delta(before)
    assert dyn_graphs == 1 and graphs == 1
    assert xla == 1, f"{xla} XLA compilations for 3 steps of one graph"
    np.testing.assert_allclose(img48, ref48, **F32_TOL)
    # another step count (other timesteps, other sigma table) reuses the executable, what
    # test_other_step_count_reuses_the_executable checks; the UNet pipeline's does not (its xfail
    # there), so "sd" repeats the same call instead
    before = _compile_counts()
    _images(pipe, kind, steps=3 if kind == "sd" else 4, size=48)
    assert _delta(before) == (0, 0, 0)


_UNET_STEP_COUNT_XFAIL = pytest.mark.xfail(
    strict=True,
    reason="the UNet pipeline passes `t` = scheduler.timesteps[i], a view into a storage whose size is the "
    "number of steps; buffer sizes are part of an XLA executable's signature, so another step count "
    "compiles once more (offsets are traced, sizes are not)",
)


# Both run under `-m slow`: by default test_compiled_denoiser_matches_and_does_not_recompile makes the same
# checks (one executable for 3 steps at a new size, another step count compiles nothing) on its pipelines;
# the UNet's step-count xfail is kept by the slow run only.
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sd3", "flux", "sd"])
def test_scheduler_steps_do_not_recompile(kind, tpu_pipes):
    """Each denoising step feeds a new timestep/sigma: one XLA executable serves them all."""
    pipe = tiny.build(kind).to("tpu")
    tiny.denoiser(pipe).compile(backend="tpu", fullgraph=True, dynamic=False)
    before = _compile_counts()
    _images(pipe, kind, steps=3, size=40)
    graphs, xla, dyn = _delta(before)
    assert dyn == 1 and graphs == 1
    assert xla == 1, f"{xla} XLA compilations for 3 steps of one graph"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sd3", "flux", pytest.param("sd", marks=_UNET_STEP_COUNT_XFAIL)])
def test_other_step_count_reuses_the_executable(kind, tpu_pipes):
    """A different number of steps (other timesteps, other sigma table) reuses the executable."""
    pipe = tiny.build(kind).to("tpu")
    tiny.denoiser(pipe).compile(backend="tpu", fullgraph=True, dynamic=False)
    _images(pipe, kind, steps=3, size=40)
    before = _compile_counts()
    _images(pipe, kind, steps=4, size=40)
    assert _delta(before) == (0, 0, 0)


# ------------------------------------------------------------------ memory
def _live_bytes():
    gc.collect()
    torch.tpu.synchronize()
    return torch.tpu.memory_allocated()


def test_one_copy_of_weights_in_device_memory():
    pipe = tiny.build("sd3")
    cpu_bytes = tiny.param_bytes(pipe)
    base = _live_bytes()
    pipe.to("tpu")
    moved = _live_bytes() - base
    on_tpu = tiny.param_bytes(pipe)
    assert on_tpu == cpu_bytes
    assert all(p.device.type == "tpu" for p in pipe.transformer.parameters())
    t5 = pipe.text_encoder_3
    assert t5.shared.weight is t5.encoder.embed_tokens.weight, "tied embedding duplicated by .to('tpu')"
    # one copy: the device holds the parameters and buffers, plus at most a few small scheduler tensors
    assert on_tpu <= moved <= on_tpu + 4096, (moved, on_tpu)
    # a call leaves nothing behind except the scheduler's timesteps/sigmas
    pipe(**tiny.call_kwargs("sd3", steps=STEPS))
    after = _live_bytes() - base
    assert after - moved <= 4096, (after, moved)
    del pipe, t5
    assert _live_bytes() - base <= 4096


def test_vae_decode_larger_image():
    pipe = tiny.build("sd")
    gen = torch.Generator("cpu").manual_seed(0)
    latents = torch.randn(1, 4, 96, 96, generator=gen)  # a 192 x 192 image
    with torch.no_grad():
        ref = pipe.vae.decode(latents).sample
        pipe.vae.to("tpu")
        got = pipe.vae.decode(latents.to("tpu")).sample
    assert got.shape == (1, 3, 192, 192) and got.device.type == "tpu"
    torch.testing.assert_close(got.cpu(), ref, atol=1e-4, rtol=1e-4)
    assert ref.std() > 1e-3


def test_attention_slicing_matches(cpu_ref):
    from diffusers.models.attention_processor import SlicedAttnProcessor

    kind = "sd"
    ref = cpu_ref(kind)
    pipe = tiny.build(kind).to("tpu")
    pipe.enable_attention_slicing(1)
    procs = pipe.unet.attn_processors.values()
    assert procs and all(isinstance(p, SlicedAttnProcessor) for p in procs)
    img = _images(pipe, kind, steps=STEPS)
    np.testing.assert_allclose(img, ref, **F32_TOL)
    pipe.disable_attention_slicing()
    assert not any(isinstance(p, SlicedAttnProcessor) for p in pipe.unet.attn_processors.values())
    np.testing.assert_allclose(_images(pipe, kind, steps=STEPS), ref, **F32_TOL)
