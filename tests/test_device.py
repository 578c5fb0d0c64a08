"""The device itself: autoload, torch.tpu, device indices, streams and events."""

import subprocess
import sys

import pytest
import torch


def test_plain_import_torch_autoloads_the_backend():
    code = (
        "import torch; x = torch.randn(2, 3, device='tpu'); "
        "assert type(x) is torch.Tensor and x.device == torch.device('tpu', 0); "
        "assert 'torchtpu' in __import__('sys').modules; print(torch.tpu.platform())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("cpu", "gpu", "tpu")


def test_native_tensor_not_a_subclass():
    x = torch.randn(4, 4, device="tpu")
    assert type(x) is torch.Tensor
    assert x.device == torch.device("tpu:0") and x.is_floating_point()
    assert x.untyped_storage().device == torch.device("tpu", 0)
    p = torch.nn.Parameter(torch.randn(3))
    m = torch.nn.Linear(3, 2).to("tpu")
    assert isinstance(m.weight, torch.nn.Parameter) and m.weight.device.type == "tpu"
    assert p.tpu().device.type == "tpu"  # generated Tensor.tpu() method


def test_device_module_api():
    tpu = torch.tpu
    assert tpu.is_available() and tpu.is_initialized()
    assert tpu.device_count() == 2  # tests/conftest.py asks for two virtual devices
    assert tpu.platform() in ("cpu", "gpu", "tpu")
    assert tpu.current_device() == 0
    with tpu.device(1):
        assert tpu.current_device() == 1
        assert torch.empty(2, device="tpu").device == torch.device("tpu", 1)
    assert tpu.current_device() == 0
    tpu.set_device("tpu:1")
    try:
        assert tpu.current_device() == 1
    finally:
        tpu.set_device(0)
    assert isinstance(tpu.get_device_name(), str) and tpu.get_device_name(0)
    props = tpu.get_device_properties(0)
    assert props.total_memory > 0 and props.platform == tpu.platform()
    assert torch.bfloat16 in tpu.get_amp_supported_dtype()
    assert torch.backends.tpu.is_available() and torch.backends.tpu.is_built()
    tpu.synchronize()
    tpu.empty_cache()


def test_second_device_and_cross_device_copy():
    a = torch.randn(5, 3)
    x1 = a.to("tpu:1")
    assert x1.device == torch.device("tpu", 1)
    y1 = x1 * 2 + 1
    assert y1.device == torch.device("tpu", 1)
    x0 = y1.to("tpu:0")
    assert x0.device == torch.device("tpu", 0)
    torch.testing.assert_close(x0.cpu(), a * 2 + 1)


def test_bad_device_index_names_index_and_count():
    with pytest.raises(RuntimeError, match=r"tpu:99.*2 tpu device"):
        torch.empty(3, device="tpu:99")
    with pytest.raises(RuntimeError, match=r"tpu:99"):
        torch.randn(3).to("tpu:99")
    with pytest.raises(RuntimeError, match=r"tpu:5"):
        torch.tpu.set_device(5)


def test_mixing_cpu_and_tpu_raises_like_cuda():
    x = torch.randn(3, device="tpu")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.randn(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.randn(3, device="tpu:1")
    # CPU 0-dim tensors mix with device tensors, as on CUDA
    torch.testing.assert_close((x * torch.tensor(2.0)).cpu(), x.cpu() * 2)


def test_events_time_device_work():
    a = torch.randn(256, 256, device="tpu")
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        a = a @ a / 16
    end.record()
    end.synchronize()
    assert end.query()
    assert start.elapsed_time(end) > 0
    s = torch.tpu.current_stream()
    assert s.device == torch.device("tpu", 0)
    s.synchronize()
    assert s.query()


def test_autocast_bfloat16():
    lin = torch.nn.Linear(8, 4).to("tpu")
    x = torch.randn(2, 8, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = lin(x)
    assert y.dtype == torch.bfloat16
    ref = torch.nn.functional.linear(x.cpu().bfloat16(), lin.weight.cpu().bfloat16(), lin.bias.cpu().bfloat16())
    torch.testing.assert_close(y.cpu(), ref, atol=2e-2, rtol=2e-2)


def test_debug_mode_is_synchronous_and_switchable(monkeypatch):
    import torchtpu

    assert torchtpu.get_eager_mode() == "fused"  # the default
    with torchtpu.eager_mode("debug"):
        assert torch.tpu.get_eager_mode() == "debug"
        x = torch.randn(3, device="tpu") + 1
        from torchtpu.storage.records import record_of

        assert record_of(x).buffer.is_ready()
    assert torchtpu.get_eager_mode() == "fused"
    with pytest.raises(ValueError):
        torchtpu.set_eager_mode("turbo")
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.tpu.get_eager_mode())"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "TORCHTPU_EAGER_MODE": "debug"},
    )
    assert out.stdout.strip() == "debug", out.stderr


def test_module_to_keeps_parameter_objects_like_cuda():
    """`model.to("tpu")` moves parameters in place (as CPU <-> CUDA does): references taken before the
    move, such as an optimizer's, see the device tensors."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 2)
    model = torch.nn.Linear(3, 2)
    model.load_state_dict(ref.state_dict())
    weight = model.weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    model.to("tpu")
    assert model.weight is weight and weight.device.type == "tpu" and isinstance(weight, torch.nn.Parameter)
    x = torch.randn(4, 3)
    for m, o, inp in ((model, opt, x.to("tpu")), (ref, ref_opt, x)):
        m(inp).sum().backward()
        o.step()
    torch.testing.assert_close(weight.detach().cpu(), ref.weight.detach())
    model.to("tpu:1").to("cpu")
    assert model.weight is weight and weight.device.type == "cpu"
    assert torch._has_compatible_shallow_copy_type(torch.zeros(1), torch.zeros(1, device="tpu"))
    assert not torch._has_compatible_shallow_copy_type(torch.zeros(1, device="meta"), torch.zeros(1, device="tpu"))
