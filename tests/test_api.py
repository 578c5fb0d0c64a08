"""The public `torch.tpu` surface: TorchTPU parity (names as data), no leaks, the forms TorchTPU
defines (EagerMode, eager_mode property, set_eager_mode context manager, Precision, device_of)."""

import importlib
import sys

import pytest
import torch

# TorchTPU 0.2.0's public table (torch_tpu/_internal/public_api.py), module -> names.
TORCHTPU = {
    "torch.tpu": [
        "EagerMode",
        "Event",
        "Precision",
        "Stream",
        "allow_excess_precision",
        "current_device",
        "current_stream",
        "default_generators",
        "default_stream",
        "device",
        "device_count",
        "device_of",
        "eager_mode",
        "get_amp_supported_dtype",
        "get_device_name",
        "get_device_properties",
        "get_rng_state",
        "initial_seed",
        "is_available",
        "is_initialized",
        "manual_seed",
        "manual_seed_all",
        "precision",
        "set_device",
        "set_eager_mode",
        "set_rng_state",
        "set_stream",
        "stream",
        "synchronize",
        "topology_aware_mesh",
    ],
    "torch.tpu.compiler": ["custom_compiler_options"],
    "torch.tpu.distributed": [
        "set_tpu_launch_env",
        "spmd_safe",
        "topology_aware_mesh",
        "window_num_stripes",
        "window_stripe_chunk_mb",
    ],
    "torch.tpu.ops": [
        "align_jagged_to_multiple",
        "all_gather_dim",
        "max_pool1d",
        "max_pool1d_backward",
        "max_pool2d",
        "max_pool2d_backward",
        "max_pool3d",
        "max_pool3d_backward",
        "optimization_barrier",
        "ragged_all_to_all",
        "ragged_dot",
        "ragged_dot_weight_grad",
        "recv",
        "reduce_scatter_dim",
        "send",
        "sparse_dense_matmul",
        "sparse_dense_matmul_activation_unstack",
        "sparse_dense_matmul_grad_with_adagrad",
        "sparse_dense_matmul_grad_with_adam",
        "sparse_dense_matmul_grad_with_sgd",
        "sparse_dense_matmul_gradient_stack",
        "sparse_gather",
        "sparse_gather_backward",
        "sparse_iota",
        "sparse_map_row",
        "splash_sdpa",
        "strip_jagged_padding",
    ],
    "torch.tpu.optimizers": ["AdamW", "Muon", "Optimizer", "Sgd", "SingleTraceTrainer"],
    "torch.tpu.pallas": ["get_pallas_mesh", "jax_op"],
    "torch.tpu.profiler": ["TpuProfilerConfig"],
}

# Deliberately absent from torch.tpu itself, with the reason (reviewed when one lands).
ABSENT: dict[str, str] = {}
# Present only with torchtpu's C++ extension (a compiler on the machine, docs/design.md).
NEEDS_NATIVE = {"default_generators"}
# Submodules: names we offer (or deliberately not, with the reason). ops/distributed/pallas are
# backed by other helpers' modules and offer what their __all__ lists.
SUBMODULE_ABSENT = {
    "torch.tpu.optimizers": {
        "Optimizer": "TorchTPU's is a stateless functional base for SingleTraceTrainer; ours are "
        "torch.optim.Optimizer subclasses (AdamW, SGD, Muon) with a fused step",
    },
}
NOT_YET = {"torch.tpu.distributed", "torch.tpu.ops", "torch.tpu.pallas"}


def test_declaration_is_sorted_and_is_the_whole_surface():
    from torchtpu import api

    assert list(api.PUBLIC) == sorted(api.PUBLIC)
    assert list(api.SUBMODULES) == sorted(api.SUBMODULES)
    assert torch.tpu.__all__ == sorted(set(api.PUBLIC) | set(api.PROPERTIES) | set(api.SUBMODULES))
    assert dir(torch.tpu) == torch.tpu.__all__
    for leaked in ("device_index", "contextlib", "dataclasses", "time", "torch", "os", "jax"):
        assert not hasattr(torch.tpu, leaked), leaked
    assert torch.get_device_module("tpu") is torch.tpu is sys.modules["torch.tpu"]


def test_torchtpu_parity():
    missing = [n for n in TORCHTPU["torch.tpu"] if n not in torch.tpu.__all__ and n not in ABSENT]
    assert missing == []
    from torchtpu.device import native

    for name in TORCHTPU["torch.tpu"]:
        if name in ABSENT or name == "topology_aware_mesh":
            continue
        if name in NEEDS_NATIVE and not native.generators_available():
            with pytest.raises(AttributeError, match="C\\+\\+ extension"):
                getattr(torch.tpu, name)
            continue
        getattr(torch.tpu, name)
    for module, names in TORCHTPU.items():
        if module == "torch.tpu":
            continue
        try:
            public = importlib.import_module(module)
        except ImportError as e:
            assert module in NOT_YET, f"{module}: {e}"
            continue
        assert public.__all__ == sorted(public.__all__)
        assert all(hasattr(public, n) for n in public.__all__)
        if module in SUBMODULE_ABSENT:
            absent = SUBMODULE_ABSENT[module]
            assert [n for n in names if n not in public.__all__ and n not in absent] == []


def test_missing_backing_module_is_a_clear_import_error(monkeypatch):
    from torchtpu import api

    monkeypatch.setitem(api.SUBMODULES, "nothere", "torchtpu.no_such_module")
    sys.modules.pop("torch.tpu.nothere", None)
    with pytest.raises(ImportError, match="torch.tpu.nothere needs torchtpu.no_such_module"):
        importlib.import_module("torch.tpu.nothere")


def test_eager_mode_forms():
    tpu = torch.tpu
    assert tpu.eager_mode == tpu.EagerMode.DEFER_AND_FUSE == "fused"  # the default
    with tpu.set_eager_mode(tpu.EagerMode.DEFER_NEVER):
        assert tpu.eager_mode is tpu.EagerMode.DEFER_NEVER
        x = torch.ones(4, device="tpu") * 3
    assert tpu.get_eager_mode() == "fused" and x.sum().item() == 12
    tpu.eager_mode = "debug"
    try:
        assert tpu.eager_mode == tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
        assert callable(tpu.set_eager_mode)  # the property setter did not replace anything
    finally:
        tpu.eager_mode = tpu.EagerMode.DEFER_AND_FUSE
    with tpu.eager_mode("strict"):  # our earlier form still works
        assert tpu.get_eager_mode() == "strict"
    assert tpu.get_eager_mode() == "fused"
    with pytest.raises(ValueError, match="unknown eager mode 'eager'"):
        tpu.set_eager_mode("eager")


def test_precision_scopes_float32_matmul():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    assert torch.get_float32_matmul_precision() == "highest"
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
        assert torch.get_float32_matmul_precision() == "medium"
    assert torch.get_float32_matmul_precision() == "highest"
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        out = (a.to("tpu") @ b.to("tpu")).cpu()
    torch.testing.assert_close(out, a @ b)
    with pytest.raises(ValueError, match="Precision"):
        with torch.tpu.precision("high"):
            pass


def test_pytorch_per_backend_fp32_precision_settings_do_not_break_tpu_ops():
    """PyTorch 2.9+'s `torch.backends.*.fp32_precision` settings: while they disagree PyTorch's own
    `get_float32_matmul_precision()` raises; "tpu" ops (eager, C++ fast path, compiled) still run and
    match the CPU, following the generic `torch.backends.fp32_precision`."""
    from torchtpu.ops.linalg import matmul_precision

    backends = torch.backends
    saved = (backends.fp32_precision, backends.cuda.matmul.fp32_precision, backends.mkldnn.matmul.fp32_precision)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    ta, tb = a.to("tpu"), b.to("tpu")
    compiled = torch.compile(lambda x, y: (x @ y).tanh(), backend="tpu")
    # (torch.testing._internal freezes these flags when imported; its own tests mutate them so)
    mutable = getattr(backends, "__allow_nonbracketed_mutation")
    try:
        with mutable():
            backends.cuda.matmul.fp32_precision = "tf32"  # CUDA's matmuls only: the backends now disagree
        with pytest.raises(RuntimeError):
            torch.get_float32_matmul_precision()
        assert matmul_precision() == "highest"
        with mutable():
            backends.fp32_precision = "tf32"
        assert matmul_precision() == "high"
        for _ in range(2):  # the second time from the engine's caches
            torch.testing.assert_close((ta + tb).cpu(), a + b)
            torch.testing.assert_close((ta @ tb).cpu(), a @ b, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(compiled(ta, tb).cpu(), (a @ b).tanh(), atol=1e-4, rtol=1e-4)
    finally:
        with mutable():
            torch.set_float32_matmul_precision("highest")
            (backends.fp32_precision, backends.cuda.matmul.fp32_precision, backends.mkldnn.matmul.fp32_precision) = (
                saved
            )
    assert torch.get_float32_matmul_precision() == "highest"


def test_device_properties_and_amp_dtypes():
    p = torch.tpu.get_device_properties(0)
    assert p.multi_processor_count >= 1 and p.total_memory > 0 and p.name
    dtypes = torch.tpu.get_amp_supported_dtype()
    assert len(dtypes) == 20 and torch.bfloat16 in dtypes and torch.float16 in dtypes
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(torch.randn(2, 4, device="tpu"), torch.randn(3, 4, device="tpu"))
    assert y.dtype == torch.bfloat16


def test_device_of():
    x = torch.ones(2, device="tpu")
    with torch.tpu.device_of(x):
        assert torch.tpu.current_device() == x.device.index
    with torch.tpu.device_of(torch.ones(2)):  # not a tpu tensor: no change
        assert torch.tpu.current_device() == 0


def test_plain_torch_compile_uses_the_tpu_backend():
    import torchtpu

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    ref = m(x)
    ref.sum().backward()
    grad = m[0].weight.grad.clone()
    m.zero_grad()
    m.to("tpu")
    before = torchtpu.metrics()["compiled_graphs"]
    out = torch.compile(m)(x.to("tpu"))  # no backend named
    out.sum().backward()
    assert torchtpu.metrics()["compiled_graphs"] > before
    torch.testing.assert_close(out.cpu(), ref, rtol=2e-4, atol=2e-5)
    torch.testing.assert_close(m[0].weight.grad.cpu(), grad, rtol=1e-3, atol=1e-4)
    # Inductor's modes configure its code generation: ignored for tpu graphs (compile/options.py)
    torch.testing.assert_close(torch.compile(m, mode="max-autotune")(x.to("tpu")).cpu(), ref, rtol=2e-4, atol=2e-5)


def test_info_reports_versions_devices_and_self_check(capsys):
    from torchtpu.__main__ import info

    assert info() == 0
    out = capsys.readouterr().out
    for needle in (
        "torch ",
        "jax ",
        "platform: XLA:",
        "tpu:0",
        "eager mode: fused",
        "C++ device guard:",
        "self-check: ok (matmul, autograd, torch.compile, synchronize)",
    ):
        assert needle in out, needle
