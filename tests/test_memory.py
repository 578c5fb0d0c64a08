"""The memory model: storages, views that alias, in-place writes through views, lifetime, stats."""

import gc

import torch


def _pair(*shape, dtype=torch.float32):
    c = torch.randn(*shape).to(dtype)
    return c, c.to("tpu")


def test_inplace_through_views_updates_base():
    c, x = _pair(4, 6)
    x[:, 1] += 10
    c[:, 1] += 10
    x[2] = 7.0
    c[2] = 7.0
    x.t()[1:3, ::2].mul_(3)
    c.t()[1:3, ::2].mul_(3)
    torch.testing.assert_close(x.cpu(), c)


def test_views_of_views_share_storage():
    c, x = _pair(2, 3, 8)
    vx = x.transpose(0, 2)[1::2].unsqueeze(1).narrow(2, 1, 2)
    vc = c.transpose(0, 2)[1::2].unsqueeze(1).narrow(2, 1, 2)
    assert vx.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert vx.stride() == vc.stride() and vx.storage_offset() == vc.storage_offset()
    torch.testing.assert_close(vx.cpu(), vc)
    vx.fill_(-1.5)
    vc.fill_(-1.5)
    torch.testing.assert_close(x.cpu(), c)
    # diagonal, expand, as_strided, view with dtype, unfold (overlapping windows)
    c2, x2 = _pair(5, 5)
    x2.diagonal().add_(100)
    c2.diagonal().add_(100)
    torch.testing.assert_close(x2.cpu(), c2)
    torch.testing.assert_close(x2[:1].expand(3, 5).cpu(), c2[:1].expand(3, 5))
    torch.testing.assert_close(x2.as_strided((3, 2), (4, 3), 2).cpu(), c2.as_strided((3, 2), (4, 3), 2))
    torch.testing.assert_close(x2.view(torch.int32).cpu(), c2.view(torch.int32))
    torch.testing.assert_close(x2.reshape(-1).unfold(0, 4, 2).cpu(), c2.reshape(-1).unfold(0, 4, 2))


def test_ops_on_noncontiguous_inputs_and_outputs():
    c, x = _pair(6, 8)
    torch.testing.assert_close((x.t() @ x[:, :6]).cpu(), c.t() @ c[:, :6], rtol=1e-5, atol=1e-5)
    out_c = torch.empty(8, 12)[:, ::2]
    out_x = torch.empty(8, 12, device="tpu")[:, ::2]
    torch.add(c.t()[:, :6], 1, out=out_c)
    torch.add(x.t()[:, :6], 1, out=out_x)
    torch.testing.assert_close(out_x.cpu(), out_c)
    # the same storage read twice and written once
    x[1:].add_(x[0])
    c[1:].add_(c[0])
    torch.testing.assert_close(x.cpu(), c)


def test_out_resizes_like_pytorch():
    a = torch.randn(3, 4)
    out = torch.empty(0, device="tpu")
    torch.mul(a.to("tpu"), 2, out=out)
    assert out.shape == (3, 4)
    torch.testing.assert_close(out.cpu(), a * 2)


def test_empty_does_not_materialise_device_memory():
    gc.collect()  # storages of earlier tests must not be freed in the middle of the measurement
    before = torch.tpu.memory_stats()["materialized_bytes.all.current"]
    big = torch.empty(64, 1024, 1024, device="tpu")  # 256 MiB, never written
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.current"] >= big.numel() * 4
    assert stats["materialized_bytes.all.current"] == before
    big[0, 0, :4] = 1.0  # the first write materialises it
    grown = torch.tpu.memory_stats()["materialized_bytes.all.current"] - before
    assert big.numel() * 4 <= grown < big.numel() * 4 + 1024  # (plus the scalar written)
    torch.testing.assert_close(big[0, 0, :5].cpu(), torch.tensor([1.0, 1, 1, 1, 0]))
    del big


def test_memory_returns_to_start_after_1000_steps():
    w = torch.randn(32, 32, device="tpu", requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-3)
    x = torch.randn(8, 32, device="tpu")
    for _ in range(3):  # warm up (optimizer state, grads)
        opt.zero_grad()
        (x @ w).square().mean().backward()
        opt.step()
    gc.collect()
    start = torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats()
    for _ in range(1000):
        opt.zero_grad()
        (x @ w).square().mean().backward()
        opt.step()
    gc.collect()
    assert torch.tpu.memory_allocated() == start
    assert torch.tpu.max_memory_allocated() < start + 64 * 1024  # no growth over the loop
    from torchtpu.storage.records import RECORDS

    assert len(RECORDS) < 10_000


def test_memory_allocated_counts_bytes():
    gc.collect()
    start = torch.tpu.memory_allocated()
    t = torch.empty(1000, dtype=torch.float64, device="tpu")
    assert torch.tpu.memory_allocated() == start + 8000
    del t
    gc.collect()
    assert torch.tpu.memory_allocated() == start


def test_first_call_of_a_new_executable_does_not_keep_its_tensors():
    gc.collect()
    start = torch.tpu.memory_allocated()
    x = torch.randn(1000, 103).to("tpu")  # shapes no other test uses: these calls compile
    y = torch.sin(x).to(torch.bfloat16)
    del x, y
    gc.collect()
    assert torch.tpu.memory_allocated() == start


def test_peak_statistics_do_not_count_failed_allocations():
    import pytest

    gc.collect()
    torch.tpu.reset_peak_memory_stats()
    base = torch.tpu.max_memory_allocated()
    a = torch.randn(1000, device="tpu")
    base += 4000
    assert torch.tpu.max_memory_allocated() == base
    huge = 10**12  # elements: far beyond this machine's memory
    lazy = torch.empty(huge, device="tpu")  # lazy: holds nothing yet, counted as allocated (as on CUDA)
    failures = [
        lambda: lazy.fill_(1),
        lambda: torch.zeros(huge, device="tpu"),
        lambda: a.repeat(huge // 1000),
        lambda: torch.randn(huge, device="tpu"),
    ]
    for fail in failures:
        with pytest.raises(torch.OutOfMemoryError):
            fail().cpu()
        assert torch.tpu.max_memory_allocated() == base
        assert torch.tpu.memory_stats()["allocated_bytes.all.peak"] == base
    b = torch.ones(10, device="tpu")  # a later allocation does not bring the failed one back
    assert torch.tpu.max_memory_allocated() == base + 40
    del lazy, b
    gc.collect()
    c = torch.empty(500, device="tpu").fill_(1.0)  # a lazy storage whose first write succeeds counts
    assert torch.tpu.max_memory_allocated() == base + 2000
    del a, c
