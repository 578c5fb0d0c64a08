"""Non-blocking copies to pinned host memory and the device-generic `torch.Event`/`torch.Stream`:
the copy returns at once and lands at the device's next sync point, as on CUDA."""

import pytest
import torch

from torchtpu.eager import asserts, host_copies

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool]


def _random(shape, dtype):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(-1000, 1000, shape, dtype=dtype)


def _pending():
    return sum(len(q) for q in host_copies.PENDING.values())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_blocking_copy_to_pinned_memory_lands_at_the_event(dtype):
    c = _random((64, 33), dtype)
    x = c.to("tpu")
    y = x.t()  # a strided view: its values are gathered on the device first
    dst = torch.zeros(33, 64, dtype=dtype, pin_memory=True)
    assert dst.is_pinned()
    event = torch.Event(device="tpu")
    before = _pending()
    assert dst.copy_(y, non_blocking=True) is dst
    assert _pending() == before + 1  # started, not written: the host did not wait
    event.record()
    event.synchronize()
    assert _pending() == before
    assert torch.equal(dst, c.t())


def test_each_sync_point_completes_earlier_copies():
    c = torch.randn(128, 128)
    x = c.to("tpu")
    torch.tpu.synchronize()

    def torch_tpu_event():
        event = torch.tpu.Event()
        event.record()
        event.synchronize()

    for sync in (
        lambda: torch.tpu.synchronize(),
        lambda: torch.accelerator.synchronize(),
        lambda: torch.Stream(device="tpu").synchronize(),
        lambda: torch.tpu.current_stream().synchronize(),
        lambda: (x * 2).sum().item(),  # a blocking read: stream order
        torch_tpu_event,
    ):
        dst = torch.zeros(128, 128, pin_memory=True)
        dst.copy_(x @ x, non_blocking=True)
        assert _pending() == 1
        sync()
        assert _pending() == 0
        torch.testing.assert_close(dst, c @ c)
    # query() that answers True has written the copies the event covers
    dst = torch.zeros(128, 128, pin_memory=True)
    dst.copy_(x + 1, non_blocking=True)
    event = torch.Event(device="tpu")
    event.record()
    while not event.query():
        pass
    torch.testing.assert_close(dst, c + 1)


def test_conversions_and_pageable_destinations():
    c = torch.randn(5, 7)
    x = c.to("tpu")
    wide = torch.zeros(5, 7, dtype=torch.float64, pin_memory=True)  # converted on arrival
    wide.copy_(x, non_blocking=True)
    torch.tpu.synchronize()
    torch.testing.assert_close(wide, c.double())
    pageable = torch.zeros(5, 7)  # not pinned: the copy waits, as CUDA's does
    pageable.copy_(x * 3, non_blocking=True)
    assert _pending() == 0
    torch.testing.assert_close(pageable, c * 3)
    row = torch.zeros(7, pin_memory=True)  # broadcasting: also synchronous
    with pytest.raises(RuntimeError):
        row.copy_(x, non_blocking=True)
    row.copy_(x[2], non_blocking=True)
    torch.tpu.synchronize()
    torch.testing.assert_close(row, c[2])
    # `.to("cpu", non_blocking=True)` returns a tensor with its values (no pinned result to read early)
    torch.testing.assert_close(x.to("cpu", non_blocking=True), c)


def test_device_generic_events_and_streams():
    a = torch.randn(256, 256, device="tpu")
    start = torch.Event(device="tpu", enable_timing=True)
    end = torch.Event(device="tpu", enable_timing=True)
    plain = torch.Event(device="tpu")
    assert plain.query()  # never recorded
    plain.synchronize()
    start.record()
    for _ in range(4):
        a = a @ a / 16
    plain.record()
    end.record()
    plain.synchronize()
    assert plain.query() and end.query()
    assert start.elapsed_time(end) >= 0
    with pytest.raises(ValueError, match="enable_timing"):
        plain.elapsed_time(end)
    s = torch.Stream(device="tpu")
    b = a @ a
    s.synchronize()
    assert s.query()
    assert torch.accelerator.current_stream().query()
    from torchtpu.storage.records import record_of

    assert record_of(b).buffer.is_ready()  # the stream's synchronize waited for it


def test_event_reports_device_asserts_of_the_work_it_covers_only():
    asserts.discard()
    table = torch.randn(10, 4, device="tpu")
    bad = torch.tensor([3, 12], device="tpu")
    event = torch.Event(device="tpu")
    event.record()  # before the failing op: its synchronize does not raise
    out = torch.nn.functional.embedding(bad, table)
    event.synchronize()
    after = torch.Event(device="tpu")
    dst = torch.zeros(2, 4, pin_memory=True)
    dst.copy_(out, non_blocking=True)
    after.record()
    with pytest.raises(RuntimeError, match="device-side assert"):
        after.synchronize()
    torch.tpu.clear_device_assert()
    asserts.discard()
    torch.tpu.synchronize()


@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_later_writes_do_not_reach_a_copy_in_flight(mode):
    """The copy reads the values of the moment it was issued, as in CUDA's stream order: an in-place
    write queued after it (which could otherwise reuse the source's buffer) does not change it."""
    c = torch.randn(32, 32)
    with torch.tpu.eager_mode(mode):
        x = c.to("tpu")
        dst = torch.zeros(32, 32, pin_memory=True)
        dst.copy_(x * 2, non_blocking=True)
        src = x + 0
        dst2 = torch.zeros(32, 32, pin_memory=True)
        dst2.copy_(src, non_blocking=True)
        src.add_(1)  # the copy's source storage, written in place
        src.mul_(3)
        torch.tpu.synchronize()
    torch.testing.assert_close(dst, c * 2)
    torch.testing.assert_close(dst2, c)
    torch.testing.assert_close(src.cpu(), (c + 1) * 3)


def test_errors_in_a_generic_event_reach_the_caller(monkeypatch):
    """The C++ guard asks Python; what Python raises there comes out of `torch.Event` as PyTorch's
    RuntimeError naming it (a Ctrl-C while waiting too: no exception can leave a ctypes callback
    as itself)."""
    from torchtpu.eager import device_module

    event = torch.Event(device="tpu")
    event.record()

    def fails(self):
        raise ValueError("no such thing")

    monkeypatch.setattr(device_module._Mark, "wait", fails)
    with pytest.raises(RuntimeError, match="ValueError: no such thing"):
        event.synchronize()

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(device_module._Mark, "wait", interrupted)
    with pytest.raises(RuntimeError, match="KeyboardInterrupt: interrupted while waiting"):
        event.synchronize()
