"""Host work of a compiled decode step: `CompiledGraph.__call__` minus the XLA executable call.

    python benchmarks/compiled_decode_host.py [profile]

compile_llama.py's model (hidden 512, 4 layers), a static cache, batch 1, 40 decode steps after 6
warm-up steps; with an argument, a cProfile of 40 more steps.
"""
import time, sys, torch, torchtpu, cProfile, pstats
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache
from torchtpu.compile import backend as B
import gc
cfg = LlamaConfig(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                  vocab_size=8000, intermediate_size=1408, max_position_embeddings=512)
torch.manual_seed(0)
m = LlamaForCausalLM(cfg).eval().to("tpu")
cache = StaticCache(config=cfg, max_batch_size=1, max_cache_len=128, device="tpu", dtype=torch.float32)
fwd = torch.compile(m.forward, backend="tpu", fullgraph=True)
ids = torch.randint(0, 8000, (1, 1), device="tpu")
def step(i):
    pos = torch.tensor([i], device="tpu")
    with torch.no_grad():
        out = fwd(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True)
    return out.logits
for i in range(6): step(i)
torch.tpu.synchronize()
# host time inside CompiledGraph.__call__ minus the executable call
from jax._src import stages
orig = stages.Compiled.__call__
spent = {"call": 0.0}
def timed(*a, **k):
    t = time.perf_counter(); r = orig(*a, **k); spent["call"] += time.perf_counter() - t; return r
stages.Compiled.__call__ = timed
orig_call = B.CompiledGraph.__call__
tot = {"t": 0.0, "n": 0}
def wrap(self, *a):
    t = time.perf_counter(); r = orig_call(self, *a); tot["t"] += time.perf_counter() - t; tot["n"] += 1; return r
B.CompiledGraph.__call__ = wrap
n = 40
t0 = time.perf_counter()
for i in range(6, 6 + n): step(i)
torch.tpu.synchronize()
el = time.perf_counter() - t0
print(f"per step {el/n*1e3:.2f} ms; CompiledGraph.__call__ {tot['t']/n*1e3:.3f} ms/step ({tot['n']/n:.0f} calls/step), "
      f"of which the executable call {spent['call']/n*1e3:.3f} ms: host work {(tot['t']-spent['call'])/n*1e3:.3f} ms/step")
if len(sys.argv) > 1:
    cProfile.run("for i in range(46, 86): step(i)", "compiled_decode_host.prof")
    pstats.Stats("compiled_decode_host.prof").sort_stats("tottime").print_stats(20)
