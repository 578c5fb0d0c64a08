"""torch.Generator("tpu") and torch.tpu.default_generators (the C++ hooks of device/native.py), with
CUDA's semantics: a seed and an offset per generator, 16-byte state, reproducible draws."""

import copy
import os
import subprocess
import sys

import pytest
import torch

from torchtpu.device import native

pytestmark = pytest.mark.skipif(
    not native.generators_available(), reason=f"no C++ extension: {native.problem()} (documented degradation)"
)

DEFAULT_SEED = 67280421310721  # PyTorch's default_rng_seed_val, CUDA's initial seed too


def test_new_generator_like_cuda():
    g = torch.Generator("tpu")
    assert g.device == torch.device("tpu", 0)  # "tpu" without index: the current device
    assert g.initial_seed() == DEFAULT_SEED and g.get_offset() == 0
    assert torch.Generator(device="tpu:0").device == torch.device("tpu:0")
    assert g.manual_seed(5) is g and g.initial_seed() == 5
    s = g.seed()
    assert s == g.initial_seed() and g.get_offset() == 0
    g.manual_seed(-1)  # PyTorch wraps negative seeds, as for CUDA generators
    assert g.initial_seed() == 2**64 - 1


def _draws(g):
    out = [
        torch.randn(64, device="tpu", generator=g),
        torch.rand(3, 5, device="tpu", generator=g),
        torch.randint(0, 100, (32,), device="tpu", generator=g),
        torch.empty(40, device="tpu").normal_(2.0, 3.0, generator=g),
        torch.empty(40, device="tpu").uniform_(-1, 1, generator=g),
        torch.empty(40, device="tpu").bernoulli_(0.3, generator=g),
        torch.empty(40, device="tpu").exponential_(generator=g),
        torch.randperm(20, device="tpu", generator=g),
        torch.multinomial(torch.rand(4, 9, device="tpu", generator=g), 3, generator=g),
    ]
    return [t.cpu() for t in out]


def test_generator_draws_are_reproducible_and_independent_of_the_default():
    g = torch.Generator("tpu").manual_seed(1234)
    torch.tpu.manual_seed(0)
    default_state = torch.tpu.get_rng_state()
    first = _draws(g)
    assert g.get_offset() > 0
    assert torch.equal(torch.tpu.get_rng_state(), default_state)  # g's draws leave the default alone
    g.manual_seed(1234)
    again = _draws(g)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    other = _draws(torch.Generator("tpu").manual_seed(1235))
    assert not torch.equal(first[0], other[0])
    assert torch.equal(first[7].sort().values, torch.arange(20))


def test_state_round_trip_and_clone():
    g = torch.Generator("tpu").manual_seed(77)
    torch.randn(10, device="tpu", generator=g)
    state = g.get_state()
    assert state.dtype == torch.uint8 and state.shape == (16,) and state.device.type == "cpu"
    a = torch.randn(100, device="tpu", generator=g).cpu()
    g.set_state(state)
    torch.testing.assert_close(torch.randn(100, device="tpu", generator=g).cpu(), a, rtol=0, atol=0)
    h = torch.Generator("tpu")
    h.set_state(state)
    assert h.initial_seed() == 77
    torch.testing.assert_close(torch.randn(100, device="tpu", generator=h).cpu(), a, rtol=0, atol=0)
    c = copy.deepcopy(g)
    assert c.initial_seed() == g.initial_seed() and c.get_offset() == g.get_offset() and c is not g
    with pytest.raises(RuntimeError, match="wrong size"):
        g.set_state(torch.zeros(8, dtype=torch.uint8))


def test_default_generators_are_the_default_state():
    gens = torch.tpu.default_generators
    assert isinstance(gens, tuple) and len(gens) == torch.tpu.device_count()
    assert all(isinstance(x, torch.Generator) and x.device == torch.device("tpu", i) for i, x in enumerate(gens))
    d = gens[0]
    torch.tpu.manual_seed(7)
    assert d.initial_seed() == 7 == torch.tpu.initial_seed() and d.get_offset() == 0
    d.manual_seed(9)
    assert torch.tpu.initial_seed() == 9
    torch.manual_seed(11)  # torch.manual_seed seeds every device generator
    assert d.initial_seed() == 11
    assert torch.equal(torch.tpu.get_rng_state(), d.get_state())
    # the default stream of seed 11 is the stream of any tpu generator seeded 11
    a = torch.randn(50, device="tpu").cpu()
    b = torch.randn(50, device="tpu", generator=torch.Generator("tpu").manual_seed(11)).cpu()
    assert torch.equal(a, b) and d.get_offset() == 1
    state = torch.tpu.get_rng_state()
    x = torch.nn.functional.dropout(torch.ones(1000, device="tpu"), 0.5).cpu()
    d.set_state(state)
    assert torch.equal(torch.nn.functional.dropout(torch.ones(1000, device="tpu"), 0.5).cpu(), x)
    with torch.random.fork_rng(devices=[0], device_type="tpu"):
        torch.randn(3, device="tpu")
    assert torch.equal(torch.tpu.get_rng_state(), d.get_state()) and d.get_offset() == 2


def test_without_the_extension_random_ops_work_and_the_error_names_the_reason():
    code = (
        "import torch\n"
        "torch.manual_seed(3); a = torch.randn(8, device='tpu').cpu()\n"
        "torch.manual_seed(3); b = torch.randn(8, device='tpu').cpu()\n"
        "assert torch.equal(a, b)\n"
        "s = torch.tpu.get_rng_state(); c = torch.rand(4, device='tpu').cpu()\n"
        "torch.tpu.set_rng_state(s); assert torch.equal(torch.rand(4, device='tpu').cpu(), c)\n"
        "try:\n    torch.tpu.default_generators\nexcept AttributeError as e:\n    print('E1', e)\n"
        "try:\n    torch.Generator('tpu')\nexcept RuntimeError as e:\n    print('E2', 'getNewGenerator' in str(e))\n"
    )
    env = dict(os.environ, TORCHTPU_NATIVE="off")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "E1 torch.Generator('tpu') and torch.tpu.default_generators need torchtpu's C++ extension" in done.stdout
    assert "TORCHTPU_NATIVE=off" in done.stdout and "E2 True" in done.stdout
