"""Hugging Face Transformers' generate() on "tpu" against the CPU: greedy, sampling and beam search, the
text-generation pipeline, static caches (eager, compiled, one decode graph), the deferred stop check,
Inductor compile settings, an encoder-decoder (T5), logits processors and stopping criteria.

Everything is built locally from tiny configs and a tiny word-level tokenizer (tests/tiny_llama.py): no
downloads.
"""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tiny_llama as tiny  # noqa: E402

import torchtpu  # noqa: E402
import torchtpu.integrations  # noqa: E402

# Installed at `import torch` once torchtpu/__init__.py calls it; idempotent.
torchtpu.integrations.install()


# ------------------------------------------------------------------ generation
@pytest.fixture(scope="module")
def pair():
    cpu = tiny.model(seed=5)
    return cpu, copy.deepcopy(cpu).to("tpu")


def _gen_inputs(seed, device="cpu"):
    ids, mask = tiny.left_padded(torch.Generator().manual_seed(seed))
    return dict(input_ids=ids.to(device), attention_mask=mask.to(device))


def test_greedy_matches_cpu_with_dynamic_cache(pair):
    from transformers import DynamicCache

    cpu, tpu = pair
    kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, return_dict_in_generate=True)
    ref = cpu.generate(**_gen_inputs(10), **kw)
    got = tpu.generate(**_gen_inputs(10, "tpu"), **kw)
    assert isinstance(got.past_key_values, DynamicCache)
    keys = got.past_key_values.layers[0].keys
    assert keys.device.type == "tpu" and keys.shape[-2] == 6 + 6 - 1
    assert got.sequences.cpu().tolist() == ref.sequences.tolist()


def test_sampling_is_seeded(pair):
    _, tpu = pair
    kw = dict(max_new_tokens=6, do_sample=True, temperature=1.5, top_k=0, top_p=1.0)
    runs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        runs.append(tpu.generate(**_gen_inputs(11, "tpu"), **kw).cpu())
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])  # 12 draws over 24 tokens: equal by chance ~never
    assert runs[0].min() >= 0 and runs[0].max() < tiny.VOCAB


def test_sampling_top_k_1_is_greedy(pair):
    cpu, tpu = pair
    torch.manual_seed(0)
    got = tpu.generate(**_gen_inputs(12, "tpu"), max_new_tokens=5, do_sample=True, top_k=1)
    ref = cpu.generate(**_gen_inputs(12), max_new_tokens=5, do_sample=False)
    assert got.cpu().tolist() == ref.tolist()


def test_beam_search_matches_cpu(pair):
    # one left-padded prompt and 2 beams: 2 rows of 6 tokens, the shapes the other generation tests
    # compile (batch 2, prompt 6, up to 6 new tokens), so only beam search's own ops compile here
    cpu, tpu = pair
    kw = dict(
        max_new_tokens=5,
        num_beams=2,
        num_return_sequences=2,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
    )
    first = lambda d: {k: v[:1] for k, v in d.items()}
    ref = cpu.generate(**first(_gen_inputs(13)), **kw)
    got = tpu.generate(**first(_gen_inputs(13, "tpu")), **kw)
    assert got.sequences.cpu().tolist() == ref.sequences.tolist()
    torch.testing.assert_close(got.sequences_scores.cpu(), ref.sequences_scores, rtol=1e-4, atol=1e-5)


def test_text_generation_pipeline(pair):
    from transformers import pipeline

    cpu, _ = pair
    tok = tiny.tokenizer()
    tpu_model = copy.deepcopy(cpu)
    pipe_t = pipeline("text-generation", model=tpu_model, tokenizer=tok, device="tpu")
    pipe_c = pipeline("text-generation", model=cpu, tokenizer=tok, device="cpu")
    assert pipe_t.device.type == "tpu" and next(tpu_model.parameters()).device.type == "tpu"
    # one batch of two prompts (5 and 6 words, left-padded to 6): the shapes the other generation tests
    # compile (batch 2, prompt 6), where one prompt at a time would compile every decode step twice more
    prompts = ["the cat sat on the", "a big red dog ran to"]
    kw = dict(max_new_tokens=5, do_sample=False, batch_size=2)
    got = [r[0]["generated_text"] for r in pipe_t(prompts, **kw)]
    want = [r[0]["generated_text"] for r in pipe_c(prompts, **kw)]
    assert got == want
    assert all(len(g.split()) > len(p.split()) for g, p in zip(got, prompts))


def _tpu_backend_ready():
    return "tpu" in torch._dynamo.list_backends()


def test_static_cache_eager_matches_cpu(pair):
    from transformers import StaticCache

    cpu, tpu = pair
    kw = dict(
        max_new_tokens=5,
        min_new_tokens=5,
        do_sample=False,
        cache_implementation="static",
        return_dict_in_generate=True,
        disable_compile=True,
    )  # on "tpu" generate() would compile
    ref = cpu.generate(**_gen_inputs(14), **kw)
    got = tpu.generate(**_gen_inputs(14, "tpu"), **kw)
    assert isinstance(got.past_key_values, StaticCache)
    assert got.past_key_values.layers[0].keys.device.type == "tpu"
    assert got.sequences.cpu().tolist() == ref.sequences.tolist()


@pytest.mark.skipif(
    not _tpu_backend_ready(),
    reason="torch.compile backend 'tpu' is not registered "
    "(torch._dynamo.list_backends() has no 'tpu'; compile/ in progress)",
)
def test_static_cache_compiled_forward_matches_cpu(pair):
    cpu, _ = pair
    model = copy.deepcopy(cpu).to("tpu")
    kw = dict(
        max_new_tokens=5, min_new_tokens=5, do_sample=False, cache_implementation="static", disable_compile=True
    )  # only our fullgraph-compiled forward, not generate()'s own compile
    ref = cpu.generate(**_gen_inputs(14), **kw)
    model.forward = torch.compile(model.forward, backend="tpu", fullgraph=True)
    before = torchtpu.metrics()["compiled_graphs"]
    got = model.generate(**_gen_inputs(14, "tpu"), **kw)
    assert got.cpu().tolist() == ref.tolist()
    assert torchtpu.metrics()["compiled_graphs"] > before


@pytest.mark.skipif(
    not _tpu_backend_ready(),
    reason="torch.compile backend 'tpu' is not registered "
    "(torch._dynamo.list_backends() has no 'tpu'; compile/ in progress)",
)
def test_generate_auto_compiles_static_cache_on_tpu(pair):
    # transformers compiles the decode step itself for a static cache on "tpu" (CompileConfig(backend="tpu"))
    cpu, _ = pair
    model = copy.deepcopy(cpu).to("tpu")
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, cache_implementation="static")
    ref = cpu.generate(**_gen_inputs(15), **kw)
    before = torchtpu.metrics()["compiled_graphs"]
    got = model.generate(**_gen_inputs(15, "tpu"), **kw)
    assert got.cpu().tolist() == ref.tolist()
    assert torchtpu.metrics()["compiled_graphs"] > before


def test_generate_reads_its_stop_flag_one_step_late_on_tpu(pair, monkeypatch):
    """transformers' DeferredStopCheck on tpu (integrations/patches.py): the host queues the next
    step instead of waiting for each token's stop flag; early stops (EOS), the returned cache and a
    streamer come out as on the CPU, which checks every step."""
    from transformers.generation import utils as generation
    from transformers.generation.streamers import BaseStreamer

    from torchtpu.eager import kernels

    cpu, tpu = pair
    deferred, reads = [0], [0]
    call, to_host = generation.DeferredStopCheck.__call__, kernels.to_host

    def counted_call(self, *args):
        deferred[0] += 1
        return call(self, *args)

    def counted_read(t):
        reads[0] += 1
        return to_host(t)

    monkeypatch.setattr(generation.DeferredStopCheck, "__call__", counted_call)
    monkeypatch.setattr(kernels, "to_host", counted_read)

    class Collect(BaseStreamer):
        def __init__(self):
            self.seen = []

        def put(self, value):
            self.seen.append(value.tolist())

        def end(self):
            self.seen.append("end")

    kw = dict(max_new_tokens=8, do_sample=False)
    free = cpu.generate(**_gen_inputs(16), **kw)
    eos = int(free[1, 6 + 3])  # the second row's 4th new token: it stops there, the first row goes on
    for extra in (
        dict(),
        dict(return_dict_in_generate=True, output_scores=True, output_logits=True),
        dict(cache_implementation="static", disable_compile=True),
    ):
        ref_stream, got_stream = Collect(), Collect()
        ref = cpu.generate(**_gen_inputs(16), eos_token_id=eos, streamer=ref_stream, **kw, **extra)
        deferred[0] = reads[0] = 0
        got = tpu.generate(**_gen_inputs(16, "tpu"), eos_token_id=eos, streamer=got_stream, **kw, **extra)
        assert deferred[0] > 0
        if extra.get("return_dict_in_generate"):
            assert got.sequences.cpu().tolist() == ref.sequences.tolist()
            assert got.past_key_values.get_seq_length() == ref.past_key_values.get_seq_length()
            assert len(got.scores) == len(ref.scores) and len(got.logits) == len(ref.logits)  # the extra step undone
            for mine, theirs in zip(got.scores + got.logits, ref.scores + ref.logits):
                torch.testing.assert_close(mine.cpu(), theirs, atol=1e-4, rtol=1e-4)
        else:
            assert got.cpu().tolist() == ref.tolist()
        assert got_stream.seen == ref_stream.seen
    # without a streamer, no blocking read per token (generate()'s set-up reads remain; with a dynamic
    # cache and padding the model's own mask code reads `padding_mask.all()` every step, as on CUDA)
    reads[0] = 0
    tpu.generate(
        **_gen_inputs(16, "tpu"),
        max_new_tokens=8,
        min_new_tokens=8,
        do_sample=False,
        cache_implementation="static",
        disable_compile=True,
    )
    assert reads[0] < 8


def _gemma4(seed=0):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    torch.manual_seed(seed)
    cfg = Gemma4TextConfig(
        vocab_size=tiny.VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        vocab_size_per_layer_input=tiny.VOCAB,
        hidden_size_per_layer_input=8,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return Gemma4ForCausalLM(cfg).eval()


def _decode_counts(model, ids, mask, new_tokens):
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, cache_implementation="static")
    before = torchtpu.metrics()
    out = model.generate(input_ids=ids, attention_mask=mask, **kw)
    after = torchtpu.metrics()
    return out, {
        k: after[k] - before[k]
        for k in ("compiled_graphs", "compiled_xla_compiles", "compiled_cache_hits", "eager_compiles")
    }


# llama runs under `-m slow` where Gemma 4 exists: gemma4's default run asserts the same (one decode
# graph, nothing compiled in the steady state) on a model that also has sliding-window layers, and
# test_generate_auto_compiles_static_cache_on_tpu keeps llama's compiled static-cache decode by default
@pytest.mark.skipif(not _tpu_backend_ready(), reason="torch.compile backend 'tpu' is not registered")
@pytest.mark.parametrize(
    "arch",
    [pytest.param("llama", marks=[pytest.mark.slow] if hasattr(transformers, "Gemma4ForCausalLM") else []), "gemma4"],
)
def test_static_cache_decode_compiles_one_graph(arch):
    # generate() compiles the decode step itself for a static cache on "tpu". Gemma 4's sliding-window
    # layers count tokens in a Python int: without our integration every token of the first window
    # was a new graph. A 3-token prompt and 6 new tokens cross from a filling window (4) to a full one.
    if arch == "gemma4" and not hasattr(transformers, "Gemma4ForCausalLM"):
        pytest.skip("this transformers has no Gemma 4")
    cpu = tiny.model(seed=5) if arch == "llama" else _gemma4(seed=5)
    model = copy.deepcopy(cpu).to("tpu")
    torch._dynamo.reset()
    for round_, seed in enumerate((3, 4)):
        ids, mask = tiny.left_padded(torch.Generator().manual_seed(seed), seq=3)
        ref = cpu.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=6,
            min_new_tokens=6,
            do_sample=False,
            cache_implementation="static",
        )
        got, counts = _decode_counts(model, ids.to("tpu"), mask.to("tpu"), 6)
        assert got.cpu().tolist() == ref.tolist(), (arch, round_)
        if round_ == 0:
            # one decode graph (prefill runs eager); at most a second executable of it for a first
            # call whose cache buffers are shared (not donatable)
            assert counts["compiled_graphs"] == 1 and counts["compiled_xla_compiles"] <= 2, counts
        else:
            # steady state: the same shapes again compile nothing, eager or compiled; one executable
            # per decode step
            assert counts == {
                "compiled_graphs": 0,
                "compiled_xla_compiles": 0,
                "compiled_cache_hits": 5,
                "eager_compiles": 0,
            }, counts


# ------------------------------------------------------------------ Inductor settings and encoder-decoder caches
def _compile_configs():
    from transformers import CompileConfig

    return {
        # generate()'s CompileConfig defaults: Inductor, mode="reduce-overhead" (CUDA graphs)
        "inductor-reduce-overhead": CompileConfig(),
        "inductor-max-autotune-fullgraph": CompileConfig(fullgraph=True, mode="max-autotune"),
        "tpu-with-inductor-options": CompileConfig(backend="tpu", mode=None, options={"triton.cudagraphs": True}),
    }


@pytest.mark.skipif(not _tpu_backend_ready(), reason="torch.compile backend 'tpu' is not registered")
@pytest.mark.parametrize(
    "name", ["inductor-reduce-overhead", "inductor-max-autotune-fullgraph", "tpu-with-inductor-options"]
)
def test_generate_compiles_with_inductor_settings_on_tpu(pair, name, caplog, monkeypatch):
    """Transformers' own compile tests pass CompileConfig() (mode="reduce-overhead") or Inductor modes and
    options: on tpu they compile with the "tpu" backend, ignored with one info line, same tokens and
    logits as the CPU (which does not compile)."""
    from torchtpu.compile import options

    cpu, _ = pair
    model = copy.deepcopy(cpu).to("tpu")
    monkeypatch.setattr(options, "_inductor_settings_logged", [False])
    kw = {
        "max_new_tokens": 4,
        "min_new_tokens": 4,
        "do_sample": False,
        "cache_implementation": "static",
        "return_dict_in_generate": True,
        "output_scores": True,
        "output_logits": True,
    }
    ref = cpu.generate(**_gen_inputs(17), **kw)
    torch._dynamo.reset()
    before = torchtpu.metrics()["compiled_graphs"]
    with caplog.at_level("INFO", logger="torchtpu.compile"):
        got = model.generate(**_gen_inputs(17, "tpu"), compile_config=_compile_configs()[name], **kw)
        model.generate(**_gen_inputs(17, "tpu"), compile_config=_compile_configs()[name], **kw)
    assert torchtpu.metrics()["compiled_graphs"] > before
    assert got.sequences.cpu().tolist() == ref.sequences.tolist()
    for mine, theirs in zip(got.logits, ref.logits, strict=True):
        torch.testing.assert_close(mine.cpu(), theirs, atol=1e-4, rtol=1e-4)
    ignored = [r for r in caplog.records if r.name == "torchtpu.compile" and "ignored" in r.getMessage()]
    assert len(ignored) == 1 and ignored[0].levelname == "INFO"
    assert "triton.cudagraphs" in ignored[0].getMessage() or "max_autotune" in ignored[0].getMessage()


@pytest.mark.skipif(not _tpu_backend_ready(), reason="torch.compile backend 'tpu' is not registered")
def test_torch_compile_accepts_every_inductor_mode_on_tpu():
    from torch._inductor import list_mode_options

    torch.manual_seed(3)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    ref = mlp(x)
    on_tpu = copy.deepcopy(mlp).to("tpu")
    for mode in list_mode_options():
        for backend in ("inductor", "tpu"):
            torch._dynamo.reset()
            got = torch.compile(on_tpu, backend=backend, mode=mode)(x.to("tpu"))
            torch.testing.assert_close(got.cpu(), ref, atol=1e-5, rtol=1e-4, msg=f"{backend} {mode}")
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown mode=.fastest."):
        torch.compile(on_tpu, backend="tpu", mode="fastest")(x.to("tpu"))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown Inductor option"):
        torch.compile(on_tpu, backend="tpu", options={"triton.cudagrafs": True})(x.to("tpu"))
    torch._dynamo.reset()


_CACHE_NAME = (
    "cache"
    if "cache" in getattr(transformers.generation.utils.GenerateEncoderDecoderOutput, "__dataclass_fields__", {})
    else "past_key_values"
)


def _t5_pair():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(6)
    config = T5Config(
        vocab_size=99,
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    cpu = T5ForConditionalGeneration(config).eval()
    return cpu, copy.deepcopy(cpu).to("tpu")


@pytest.mark.parametrize(
    "cache",
    ["not-returned", "dynamic-returned", "user-encoder-decoder-cache", "static-returned", "finish-without-isinstance"],
)
def test_t5_generate_matches_cpu_with_and_without_a_returned_cache(cache, monkeypatch):
    """generate() on an encoder-decoder model: on tpu the stop check is deferred (integrations/patches.py)
    when no cache is returned, and checked every token, as on CUDA, when an EncoderDecoderCache is returned
    (Transformers cannot roll it back: a TypeError for a static cache, and an AttributeError in revisions
    whose DeferredStopCheck.finish reads `cache.layers` without testing for EncoderDecoderCache, which
    "finish-without-isinstance" reproduces). Tokens, scores and the cache's length as on the CPU."""
    from transformers import DynamicCache, EncoderDecoderCache
    from transformers.generation import utils as generation

    cpu, tpu = _t5_pair()
    deferred = [0]
    call = generation.DeferredStopCheck.__call__

    def counted_call(self, *args):
        deferred[0] += 1
        return call(self, *args)

    monkeypatch.setattr(generation.DeferredStopCheck, "__call__", counted_call)
    if cache == "finish-without-isinstance":  # a finish() that reads cache.layers whatever the cache
        finish = generation.DeferredStopCheck.finish

        def finish_reading_layers(self):
            if self.cache is not None:
                _ = self.cache.layers
            return finish(self)

        monkeypatch.setattr(generation.DeferredStopCheck, "finish", finish_reading_layers)
    ids = torch.randint(2, 99, (2, 7), generator=torch.Generator().manual_seed(4))
    free = cpu.generate(ids, max_new_tokens=6, do_sample=False)
    eos = int(free[1, 3])  # the second row stops early: a deferred check must undo its extra step
    kw = {"max_new_tokens": 6, "do_sample": False, "eos_token_id": eos}
    if cache != "not-returned":
        kw.update(return_dict_in_generate=True, output_scores=True)
    if cache == "static-returned":
        kw.update(cache_implementation="static", disable_compile=True)
    results = []
    for model, device in ((cpu, "cpu"), (tpu, "tpu")):
        extra = {}
        if cache == "user-encoder-decoder-cache":
            # transformers 5.25 names generate()'s cache argument `cache` (5.24: `past_key_values`)
            extra[_CACHE_NAME] = EncoderDecoderCache(DynamicCache(), DynamicCache())
        deferred[0] = 0
        results.append(model.generate(ids.to(device), **kw, **extra))
    ref, got = results
    assert (deferred[0] > 0) == (cache == "not-returned")
    if cache == "not-returned":
        assert got.cpu().tolist() == ref.tolist()
        return
    assert got.sequences.cpu().tolist() == ref.sequences.tolist()
    assert len(got.scores) == len(ref.scores)
    for mine, theirs in zip(got.scores, ref.scores):
        torch.testing.assert_close(mine.cpu(), theirs, atol=1e-4, rtol=1e-4)
    assert getattr(got, _CACHE_NAME).get_seq_length() == getattr(ref, _CACHE_NAME).get_seq_length()


# ------------------------------------------------------------------ logits processors and stopping criteria
_VOCAB, _PROMPT = 40, 3


def _logits_processors(device):
    """Transformers' logits processors and warpers (those with no model, no randomness), built for `device`."""
    from transformers import generation as g

    encoder_ids = torch.tensor([[5, 6, 7, 5], [9, 9, 2, 11], [3, 4, 5, 6]], device=device)
    return {
        "min_length": g.MinLengthLogitsProcessor(10, eos_token_id=0, device=device),
        "min_new_tokens": g.MinNewTokensLengthLogitsProcessor(_PROMPT, 5, eos_token_id=[0, 3], device=device),
        "temperature": g.TemperatureLogitsWarper(0.7),
        "repetition_penalty": g.RepetitionPenaltyLogitsProcessor(1.3),
        "encoder_repetition_penalty": g.EncoderRepetitionPenaltyLogitsProcessor(1.5, encoder_input_ids=encoder_ids),
        "top_k": g.TopKLogitsWarper(5),
        "top_p": g.TopPLogitsWarper(0.8),
        "top_h": g.TopHLogitsWarper(0.5),
        "min_p": g.MinPLogitsWarper(0.1),
        "typical": g.TypicalLogitsWarper(0.7),
        "epsilon": g.EpsilonLogitsWarper(0.02),
        "eta": g.EtaLogitsWarper(0.05, device=device),
        "no_repeat_ngram": g.NoRepeatNGramLogitsProcessor(2),
        "encoder_no_repeat_ngram": g.EncoderNoRepeatNGramLogitsProcessor(2, encoder_input_ids=encoder_ids),
        "no_bad_words": g.NoBadWordsLogitsProcessor([[5], [6, 7]], eos_token_id=0),
        "sequence_bias": g.SequenceBiasLogitsProcessor([[[5], 2.0], [[6, 7], -3.0]]),
        "forced_bos": g.ForcedBOSTokenLogitsProcessor(1),
        "forced_eos": g.ForcedEOSTokenLogitsProcessor(8, eos_token_id=[0, 2], device=device),
        "inf_nan_remove": g.InfNanRemoveLogitsProcessor(),
        "exponential_decay_length": g.ExponentialDecayLengthPenalty(
            (2, 1.5), eos_token_id=0, input_ids_seq_length=_PROMPT
        ),
        "logit_normalization": g.LogitNormalization(),
        "prefix_constrained": g.PrefixConstrainedLogitsProcessor(lambda batch, ids: [int(ids[-1]) % 7, 11], 1),
        "suppress_tokens": g.SuppressTokensLogitsProcessor([3, 4], device=device),
        "suppress_tokens_at_begin": g.SuppressTokensAtBeginLogitsProcessor([3], begin_index=7, device=device),
    }


def test_logits_processors_match_cpu():
    """Every model-free, deterministic logits processor on tpu scores, against the CPU: fresh random
    scores (with an inf and a nan for InfNanRemove), ids that repeat (n-grams, penalties), lengths on
    both sides of the length thresholds."""
    gen = torch.Generator().manual_seed(31)
    cpu_processors, tpu_processors = _logits_processors("cpu"), _logits_processors("tpu")
    for length in (4, 7, 9):
        ids = torch.randint(0, 12, (3, length), generator=gen)
        ids[0, -2:] = torch.tensor([6, 7])  # a bad word sequence ends here
        ids[1, -3:] = torch.tensor([5, 8, 5])  # "5" repeats: n-gram bans
        scores = torch.randn(3, _VOCAB, generator=gen) * 3
        scores[2, 9], scores[2, 10] = float("inf"), float("nan")
        for name, processor in cpu_processors.items():
            given = scores if name == "inf_nan_remove" else torch.nan_to_num(scores, nan=0.0, posinf=5.0)
            ref = processor(ids.clone(), given.clone())
            got = tpu_processors[name](ids.to("tpu"), given.to("tpu"))
            assert got.device.type == "tpu", name
            torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5, msg=f"{name} at length {length}")


def test_stopping_criteria_match_cpu():
    from transformers import generation as g

    gen = torch.Generator().manual_seed(32)
    criteria = {
        "max_length": lambda device: g.MaxLengthCriteria(max_length=8),
        "eos": lambda device: g.EosTokenCriteria(eos_token_id=[0, 3]),
        "list": lambda device: g.StoppingCriteriaList([g.MaxLengthCriteria(9), g.EosTokenCriteria(0)]),
    }
    for length in (5, 8, 9):
        ids = torch.randint(0, 6, (4, length), generator=gen)
        ids[0, -1], ids[1, -1] = 0, 3
        scores = torch.randn(4, _VOCAB, generator=gen)
        for name, make in criteria.items():
            ref = make("cpu")(ids, scores)
            got = make("tpu")(ids.to("tpu"), scores.to("tpu"))
            assert got.device.type == "tpu" and got.dtype == torch.bool, name
            assert got.cpu().tolist() == ref.tolist(), f"{name} at length {length}"


def test_time_limited_criteria_compile_nothing_on_new_shapes():
    """test_stopping_criteria.py's test_list_criteria: a 0.1 s MaxTimeCriteria window spans the first
    calls of new shapes (`full` verdicts, their `|`, `ones((3, n)) / n`); none compiles (host folds)."""
    from transformers import generation as g

    for length in (11, 23):
        criteria = g.StoppingCriteriaList([g.MaxLengthCriteria(max_length=23), g.MaxTimeCriteria(max_time=60)])
        before = torchtpu.metrics()["eager_compiles"]
        scores = torch.ones((3, length), device="tpu") / length
        verdicts = criteria(torch.zeros((3, length), dtype=torch.long, device="tpu"), scores)
        assert torchtpu.metrics()["eager_compiles"] == before
        assert verdicts.cpu().tolist() == [length >= 23] * 3
        torch.testing.assert_close(scores.cpu(), torch.ones((3, length)) / length)
