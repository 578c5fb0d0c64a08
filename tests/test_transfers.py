"""Moving data: to/cpu, copy_ across devices and layouts, factories, save/load."""

import io

import numpy as np
import pytest
import torch

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]


def _random(shape, dtype):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_roundtrip_every_dtype(dtype):
    c = _random((3, 5), dtype)
    x = c.to("tpu")
    assert x.dtype == dtype and x.device.type == "tpu"
    assert torch.equal(x.cpu(), c)
    assert torch.equal(x.t().cpu(), c.t())  # a strided read
    assert torch.equal(x[1:, ::2].contiguous().cpu(), c[1:, ::2])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_conversion_on_device(dtype):
    c = _random((4, 4), torch.float32) * 3
    if dtype in (torch.uint8, torch.bool):
        c = c.abs()  # float -> uint8 of a negative value is undefined behaviour in PyTorch itself
    torch.testing.assert_close(c.to("tpu").to(dtype).cpu(), c.to(dtype))


def test_copy_across_layouts_and_devices():
    src = torch.randn(6, 4)
    dst = torch.zeros(4, 6, device="tpu")
    dst.t().copy_(src)  # cpu -> strided tpu view
    torch.testing.assert_close(dst.cpu(), src.t())
    cpu_dst = torch.zeros(6, 4)
    cpu_dst.copy_(dst.t())  # strided tpu -> cpu
    torch.testing.assert_close(cpu_dst, src)
    other = torch.zeros(6, 4, device="tpu:1")
    other.copy_(dst.t())  # tpu:0 -> tpu:1
    torch.testing.assert_close(other.cpu(), src)
    bcast = torch.zeros(3, 4, device="tpu")
    bcast.copy_(torch.arange(4.0))  # broadcasting copy from the host
    torch.testing.assert_close(bcast.cpu(), torch.arange(4.0).expand(3, 4))
    half = torch.zeros(6, 4, dtype=torch.bfloat16, device="tpu")
    half.copy_(dst.t())  # cast while copying
    torch.testing.assert_close(half.cpu(), src.bfloat16())


def test_factories_and_non_blocking():
    x = torch.tensor([[1, 2], [3, 4]], device="tpu")
    assert x.dtype == torch.int64 and x.device.type == "tpu"
    assert x.cpu().tolist() == [[1, 2], [3, 4]]
    y = torch.randn(100).to("tpu", non_blocking=True)
    torch.tpu.synchronize()
    assert y.shape == (100,)
    assert torch.zeros(2, 3, device="tpu").cpu().abs().sum() == 0
    torch.testing.assert_close(
        torch.ones(2, 3, device="tpu", dtype=torch.float16).cpu(), torch.ones(2, 3, dtype=torch.float16)
    )
    torch.testing.assert_close(torch.full((2, 2), 3.5, device="tpu").cpu(), torch.full((2, 2), 3.5))
    torch.testing.assert_close(torch.arange(0, 10, 3, device="tpu").cpu(), torch.arange(0, 10, 3))
    torch.testing.assert_close(torch.zeros_like(x).cpu(), torch.zeros(2, 2, dtype=torch.int64))
    assert x[1, 0].item() == 3 and isinstance(x.sum().item(), int)


def test_save_and_load():
    t = {"w": torch.randn(3, 4).to("tpu"), "step": torch.tensor(7, device="tpu")}
    buf = io.BytesIO()
    torch.save(t, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert loaded["w"].device.type == "tpu"
    torch.testing.assert_close(loaded["w"].cpu(), t["w"].cpu())
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert on_cpu["w"].device.type == "cpu"
    torch.testing.assert_close(on_cpu["w"], t["w"].cpu())
    cpu_buf = io.BytesIO()
    torch.save(on_cpu, cpu_buf)
    cpu_buf.seek(0)
    moved = torch.load(cpu_buf, map_location="tpu")
    assert moved["w"].device.type == "tpu"
    torch.testing.assert_close(moved["w"].cpu(), on_cpu["w"])


def test_numpy_raises_like_cuda():
    x = torch.randn(3, device="tpu")
    with pytest.raises(TypeError, match="tpu"):
        x.numpy()
    np.testing.assert_allclose(x.cpu().numpy(), x.cpu().numpy())


def test_transfer_metrics_count_bytes():
    import torchtpu

    before = torchtpu.metrics()
    x = torch.randn(256).to("tpu")
    x.cpu()
    after = torchtpu.metrics()
    assert after["h2d_bytes"] - before["h2d_bytes"] >= 1024
    assert after["d2h_bytes"] - before["d2h_bytes"] >= 1024


def test_device_copy_is_independent_of_the_host_tensor():
    # XLA:CPU can alias host memory on device_put; a later write to the CPU tensor must not leak.
    c = torch.randn(64, 64)
    x = c.to("tpu")
    expected = c.clone()
    c.add_(100)
    torch.testing.assert_close(x.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_every_host_to_device_path_copies(dtype):
    """`.to`, `copy_` into a tpu tensor, `torch.tensor(..., device=)` of a numpy array and a compiled
    graph's CPU input all leave the device value alone when the host memory is written afterwards
    (XLA:CPU would alias host memory if asked to)."""
    import numpy as np

    c = torch.randn(32, 48).to(dtype) if dtype is not torch.bool else torch.randn(32, 48) > 0
    want = c.clone()
    moved = c.to("tpu")
    into = torch.empty_like(c, device="tpu").copy_(c)
    strided = c[:, ::3].to("tpu")
    n = np.ascontiguousarray(torch.arange(12).numpy())
    from_numpy = torch.tensor(n, device="tpu")
    scalar = torch.tensor(7, dtype=torch.int64)
    graph = torch.compile(lambda x, s: x + s, backend="tpu")
    out = graph(torch.ones(3, device="tpu"), scalar)  # a CPU scalar tensor: a traced host value
    scalar.fill_(0)
    c.zero_() if dtype is not torch.bool else c.fill_(False)
    n[:] = -1
    for got, expected in ((moved, want), (into, want), (strided, want[:, ::3]), (from_numpy, torch.arange(12))):
        torch.testing.assert_close(got.cpu(), expected)
    torch.testing.assert_close(out.cpu(), torch.full((3,), 8.0))


def test_a_cpu_tensor_copied_to_tpu_stays_resizable():
    """Tensor.numpy() marks a storage non-resizable for good: the host-to-device copy read through it,
    and the user's CPU tensor could no longer be resized (nor be an out= that resizes), unlike on CUDA."""
    x = torch.randn(3)
    expected = x.clone()
    y = x.to("tpu")
    x.resize_(10)
    x.resize_(0)
    torch.add(torch.ones(4), 1, out=x)
    assert x.shape == (4,)
    assert torch.equal(y.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float32, torch.bfloat16, torch.complex64])
def test_single_elements_of_views_read_from_the_host_copy(dtype):
    """`bool(cond[i])` / `.item()` of one element of a view (a loop over a tensor) reads the storage's
    host copy at the element's offset: every layout gives the CPU's value."""
    cpu = (torch.randn(6, 5, generator=torch.Generator().manual_seed(1)) * 50).to(dtype)
    x = cpu.to("tpu")
    for view in (lambda t: t[2, 3], lambda t: t.t()[4, 1], lambda t: t[1:, ::2][4:, 2:], lambda t: t[5, 4:].view(1, 1)):
        assert view(x).item() == view(cpu).item()
    assert [bool(v) for v in x[:, 1]] == [bool(v) for v in cpu[:, 1]]
    if dtype.is_complex:
        assert x.conj()[1, 2].item() == cpu.conj()[1, 2].item()
