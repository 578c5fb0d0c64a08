"""torch.accelerator on "tpu": memory, device index, streams, events, synchronize; patch guards."""

import gc

import pytest
import torch


def test_no_patch_target_changed():
    from torchtpu.integrations import patches

    # A new torch/accelerate release that moves a patched target must fail here, not silently.
    assert patches.problems() == []
    assert "torch._C._accelerator_emptyCache" in patches.applied()


def test_memory_functions_follow_allocations():
    acc = torch.accelerator
    assert acc.current_accelerator().type == "tpu"
    gc.collect()  # earlier tests' cyclic garbage frees now, not between the counts below
    acc.empty_cache()
    acc.reset_peak_memory_stats()
    before = acc.memory_allocated()
    x = torch.ones(4096, device="tpu")
    assert acc.memory_allocated() == before + 4096 * 4
    assert acc.max_memory_allocated() >= before + 4096 * 4
    stats = acc.memory_stats()
    assert stats["allocated_bytes.all.current"] == acc.memory_allocated()
    assert list(stats) == sorted(stats)
    assert acc.memory_reserved() >= acc.memory_allocated()
    del x
    assert acc.memory_allocated() == before
    acc.reset_peak_memory_stats()
    assert acc.max_memory_allocated() == before
    free, total = acc.get_memory_info()
    assert 0 <= free <= total and total > 0
    acc.reset_accumulated_memory_stats()
    assert acc.memory_stats()["allocation.all.freed"] == 0


def test_accelerate_clear_device_cache():
    memory = pytest.importorskip("accelerate.utils.memory")
    memory.clear_device_cache(garbage_collection=True)


def test_synchronize_waits_and_raises_device_asserts():
    x = torch.randn(64, 64, device="tpu")
    y = x @ x
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(0)
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu())


def test_streams_and_events_are_torch_types():
    s = torch.accelerator.current_stream()
    assert isinstance(s, torch.Stream) and isinstance(s, torch.tpu.Stream)
    assert s.device == torch.device("tpu", 0)
    torch.accelerator.set_stream(s)
    with torch.tpu.stream(torch.tpu.Stream()):
        y = torch.ones(3, device="tpu") * 2
    s.synchronize()
    assert s.query()
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    assert isinstance(start, torch.Event)
    start.record()
    (y @ y).item()
    end.record()
    end.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0
    with pytest.raises(ValueError):
        torch.tpu.set_stream(torch.Stream(device="cpu"))


def test_device_index_follows_set_device():
    torch.accelerator.set_device_index(0)
    assert torch.accelerator.current_device_index() == 0 == torch.tpu.current_device()
    with torch.accelerator.device_index(0):
        assert torch.accelerator.current_device_index() == 0
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.accelerator.set_device_index(torch.tpu.device_count())
    assert torch.get_device_module("tpu") is torch.tpu


def test_dynamo_device_interface_is_the_runtime():
    """Dynamo/Inductor look devices up here (streams, events, properties, dtype support); torch's
    own TpuInterface, written for Google's torch_tpu package, reports "tpu" unavailable."""
    from torch._dynamo.device_interface import get_interface_for_device

    interface = get_interface_for_device(torch.device("tpu"))
    assert interface.is_available()
    assert interface.device_count() == torch.tpu.device_count()
    assert interface.current_device() == torch.tpu.current_device()
    assert issubclass(interface.Stream, torch.Stream) and issubclass(interface.Event, torch.Event)
    assert interface.current_stream().device.type == "tpu"
    assert interface.get_device_properties().multi_processor_count >= 1
    assert interface.is_dtype_supported(torch.bfloat16) and interface.is_dtype_supported(torch.complex32)
    assert not interface.is_dtype_supported(torch.qint8)
    if torch.tpu.platform() != "tpu":
        assert interface.is_dtype_supported(torch.float64)
    assert interface.exchange_device(0) == torch.tpu.current_device()
    interface.synchronize()
