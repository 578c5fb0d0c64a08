"""Regressions found by running PyTorch's own device-generic test files on "tpu" (issue 47): each test
compares against the CPU on the same inputs, and runs the eager kernels (a second call of the same
signature is served by the C++ fast path where it is built)."""

import pytest
import torch
from error_parity import same_error
from torch.testing import assert_close

DEV = "tpu"


def both(fn):
    """fn(device) on the CPU and on tpu (twice: the cache miss and the cached executable), compared."""
    expected = fn("cpu")
    for _ in range(2):
        got = fn(DEV)
        assert_close(got.cpu() if isinstance(got, torch.Tensor) else got, expected, rtol=0, atol=0)


# ------------------------------------------------------------------ silent wrong results
@pytest.mark.parametrize(
    "factory",
    [
        lambda out: torch.arange(0, 4, out=out),
        lambda out: torch.linspace(-2.5, 3, 4, out=out),
        lambda out: torch.logspace(0, 3, 4, out=out),
    ],
)
def test_factory_out_into_a_non_contiguous_view(factory):
    def run(device):
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0)).to(device)
        factory(x.narrow(1, 1, 2))
        return x

    both(run)


@pytest.mark.parametrize("default", [torch.float64, torch.float16])
def test_cached_executables_follow_the_default_dtype(default):
    a, b = torch.randint(1, 100, (5,)), torch.randint(1, 100, (5,))
    value = torch.rand(()).item()

    def run(device):
        x, y = a.to(device), b.to(device)
        results = [
            torch.div(x, y),
            torch.scalar_tensor(value, device=device),
            x / 3,
            torch.full((3,), value, device=device),
            torch.linspace(0, value, 5, device=device),
        ]
        previous = torch.get_default_dtype()
        torch.set_default_dtype(default)
        try:
            results += [
                torch.div(x, y),
                torch.scalar_tensor(value, device=device),
                x / 3,
                torch.full((3,), value, device=device),
                torch.linspace(0, value, 5, device=device),
            ]
        finally:
            torch.set_default_dtype(previous)
        results.append(torch.div(x, y))
        return [r.cpu() for r in results]

    expected = run("cpu")
    for _ in range(2):
        got = run(DEV)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype
            assert_close(g, e)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_linspace_matches_the_cpu(dtype):
    both(lambda device: torch.linspace(0, 999999, 1000000, dtype=dtype, device=device))
    start, end = torch.randint(-1000, 1000, (2,)).tolist()
    steps = int(torch.randint(2, 50, ()))
    both(lambda device: torch.linspace(start, end, steps, dtype=dtype, device=device))
    both(lambda device: torch.logspace(0, 3, 7, base=2, dtype=dtype, device=device))


@pytest.mark.parametrize("steps", [1, 5])
def test_complex_linspace_keeps_the_imaginary_part(steps):
    start, end = complex(*torch.randn(2).tolist()), complex(*torch.randn(2).tolist())
    expected = torch.linspace(start, end, steps)
    for _ in range(2):
        got = torch.linspace(start, end, steps, device=DEV)
        assert got.dtype == expected.dtype
        assert_close(got.cpu(), expected)


@pytest.mark.parametrize(
    "op", [torch.relu, lambda t: torch.cat([t, t]), lambda t: torch.cat([t, t], 1), lambda t: t * 2 + t, torch.sigmoid]
)
@pytest.mark.parametrize("memory_format", [torch.channels_last, torch.channels_last_3d])
def test_channels_last_outputs_keep_their_layout(op, memory_format):
    shape = (2, 3, 4, 5) if memory_format is torch.channels_last else (2, 3, 4, 5, 2)
    x = torch.randn(shape).to(memory_format=memory_format)
    expected = op(x)
    for _ in range(2):
        got = op(x.to(DEV))
        assert got.stride() == expected.stride()
        assert_close(got.cpu(), expected)
        assert_close(got.sum(dim=1).cpu(), expected.sum(dim=1))  # read back through the strides


@pytest.mark.parametrize("channels_last_input, channels_last_weight", [(True, False), (False, True)])
@pytest.mark.parametrize(
    "dims, dtype",
    [
        (2, torch.float32),
        (2, torch.float64),
        (2, torch.complex64),
        (3, torch.bfloat16),
        (3, torch.float64),
        (3, torch.float16),
    ],
)
def test_convolution_of_channels_last_operands_is_channels_last(channels_last_input, channels_last_weight, dims, dtype):
    # PyTorch's meta kernel leaves a convolution's output contiguous; its CPU and CUDA kernels do not
    layout = torch.channels_last if dims == 2 else torch.channels_last_3d
    conv = torch.nn.functional.conv2d if dims == 2 else torch.nn.functional.conv3d
    x = torch.randn((2, 3) + (6,) * dims, dtype=dtype)
    w = torch.randn((4, 3) + (3,) * dims, dtype=dtype)
    bias = torch.randn(4, dtype=dtype)
    x = x.to(memory_format=layout) if channels_last_input else x
    w = w.to(memory_format=layout) if channels_last_weight else w
    expected = conv(x, w, bias, padding=1)
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype in (torch.bfloat16, torch.float16) else {}
    for _ in range(2):
        got = conv(x.to(DEV), w.to(DEV), bias.to(DEV), padding=1)
        assert got.stride() == expected.stride()
        assert_close(got.cpu(), expected, **tolerance)


@pytest.mark.parametrize("shape", [(2, 0, 3), (0, 3), (2, 0), (3, 0, 0, 2)])
def test_empty_tensors_have_the_cpus_strides(shape):
    expected = torch.empty(shape).stride()
    for _ in range(2):
        assert torch.empty(shape, device=DEV).stride() == expected
        assert torch.zeros(shape, device=DEV).stride() == expected
        assert (torch.ones(shape, device=DEV) * 2).stride() == (torch.ones(shape) * 2).stride()


# ------------------------------------------------------------------ inputs the CPU rejects


@pytest.mark.parametrize("op", [torch.neg, torch.floor, torch.round, torch.sign, torch.trunc, torch.frac])
def test_same_dtype_unary_out_rejects_another_dtype(op):
    x = torch.randn(4)
    same_error(lambda device: op(x.to(device), out=torch.empty(4, dtype=torch.float64, device=device)))
    expected = op(x)
    out = torch.empty(4, device=DEV)
    op(x.to(DEV), out=out)
    assert_close(out.cpu(), expected)


def test_index_put_rejects_mismatched_dtypes():
    values = torch.randn(2, dtype=torch.float64)
    same_error(
        lambda device: torch.zeros(5, device=device).index_put_(
            (torch.tensor([1, 3], device=device),), values.to(device)
        )
    )
    same_error(
        lambda device: torch.zeros(5, device=device).index_put_(
            (torch.tensor([1, 3], device=device),), values.to(device), accumulate=True
        )
    )
    x = torch.randn(5)
    both(lambda device: x.to(device).index_put((torch.tensor([1, 3], device=device),), values.float().to(device)))


def test_rand_rejects_integer_dtypes():
    same_error(lambda device: torch.rand(3, dtype=torch.int64, device=device))
    same_error(lambda device: torch.empty(3, dtype=torch.int32, device=device).uniform_())


@pytest.mark.parametrize(
    "dtype, low, high",
    [
        (torch.int8, 0, 1000),
        (torch.int8, -200, 5),
        (torch.uint8, 0, 300),
        (torch.int16, 0, 1 << 16),
        (torch.float16, 0, 1 << 17),
        (torch.bool, 0, 3),
    ],
)
def test_random_bounds_follow_the_dtype(dtype, low, high):
    same_error(lambda device: torch.empty(3, dtype=dtype, device=device).random_(low, high))
    if dtype.is_floating_point:  # within the type but beyond its mantissa: a warning, as on the CPU
        with pytest.warns(UserWarning, match="out of bounds"):
            torch.empty(3, dtype=dtype, device=DEV).random_(0, (1 << 11) + 2)
    values = torch.empty(100, dtype=dtype, device=DEV).random_(0, 2).cpu()
    assert ((values == 0) | (values == 1)).all()


def test_cat_out_overlapping_an_input_raises():
    x = torch.randn(6)

    def overlapping(device):
        t = x.to(device)
        return torch.cat([t[:2], t[2:4]], out=t[1:5])

    same_error(overlapping)
    base = torch.randn(4, 4)

    def disjoint(device):  # the same storage, other elements: allowed
        t = base.to(device)
        torch.cat([t[0], t[1]], out=t[2:].reshape(-1))
        return t

    both(disjoint)


@pytest.mark.parametrize("shape, dim", [((0, 3), 0), ((3, 0), 1), ((2, 0, 3), 1), ((0, 3), 1)])
def test_unique_dim_of_an_empty_tensor(shape, dim):
    if shape[dim] != 0:
        same_error(lambda device: torch.unique(torch.empty(shape, device=device), dim=dim))
        return
    expected = torch.unique(torch.empty(shape), dim=dim, return_inverse=True, return_counts=True)
    got = torch.unique(torch.empty(shape, device=DEV), dim=dim, return_inverse=True, return_counts=True)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype


# ------------------------------------------------------------------ crashes
def test_storages_made_by_pytorch_itself():
    import gc

    from torchtpu.device import native

    if not native.loaded():
        pytest.skip("the C++ extension (the PrivateUse1 allocator) is not built here")
    gc.collect()  # (earlier tests' garbage must not be freed inside the measurement)
    before = torch.tpu.memory_allocated()
    values = torch.randint(0, 256, (8,), dtype=torch.uint8)
    storage = torch.UntypedStorage(8, device=DEV)
    assert storage.device.type == "tpu" and storage.nbytes() == 8
    assert torch.tpu.memory_allocated() == before + 8
    storage.copy_(values.untyped_storage())
    assert storage.tolist() == values.tolist()
    view = torch.tensor([], dtype=torch.uint8, device=DEV).set_(storage)
    view.add_(1)
    assert_close(torch.frombuffer(bytearray(storage.cpu()), dtype=torch.uint8), values + 1)
    storage.fill_(3)
    assert storage.clone().tolist() == [3] * 8
    typed = torch.TypedStorage(4, dtype=torch.float32, device=DEV)
    assert typed.size() == 4 and typed.device.type == "tpu"
    del storage, view, typed
    gc.collect()
    assert torch.tpu.memory_allocated() == before


_STORAGES_WITHOUT_THE_EXTENSION = """
import torch, warnings
from torchtpu.device import native
from torchtpu.integrations import patches
assert not native.loaded()
assert getattr(torch.UntypedStorage.__new__, "_torchtpu", False), patches.applied()
values = torch.randint(0, 256, (8,), dtype=torch.uint8)
storage = torch.UntypedStorage(8, device="tpu")
assert storage.device.type == "tpu" and storage.nbytes() == 8, storage
storage.copy_(values.untyped_storage())
assert storage.tolist() == values.tolist()
view = torch.tensor([], dtype=torch.uint8, device="tpu").set_(storage)
view.add_(1)
assert bytes(storage.cpu()) == bytes((values + 1).tolist())
assert torch.UntypedStorage([5, 6, 7], device="tpu").tolist() == [5, 6, 7]
assert torch.UntypedStorage(device="tpu").nbytes() == 0
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    typed = torch.TypedStorage(4, dtype=torch.float32, device="tpu")
    assert typed.size() == 4 and typed.device.type == "tpu"
    assert torch.tpu.FloatStorage(3).size() == 3
assert torch.UntypedStorage([1, 300, -1], device="tpu").tolist() == list(torch.UntypedStorage([1, 300, -1]))
for bad, error in (((-1,), RuntimeError), ((1, 2), TypeError), ((["a"],), RuntimeError)):
    try:
        torch.UntypedStorage(*bad, device="tpu")
    except error:
        pass
    else:
        raise AssertionError(f"UntypedStorage{bad} did not raise {error.__name__}")
assert torch.UntypedStorage(3).device.type == "cpu"
print("ok")
"""


def test_storages_made_by_pytorch_itself_without_the_extension():
    # Without the C++ extension PyTorch has no allocator for "tpu": this segfaulted the process.
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCHTPU_NATIVE="off")
    done = subprocess.run(
        [sys.executable, "-c", _STORAGES_WITHOUT_THE_EXTENSION], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


# ------------------------------------------------------------------ not lowered before
@pytest.mark.parametrize(
    "args, dtype",
    [((0, 5, 2), None), ((0, 5, 2), torch.int64), ((0, 1, 0.3), None), ((5, -3, -1.5), torch.float64), ((0, 4), None)],
)
def test_range(args, dtype):
    with pytest.warns(UserWarning):
        expected = torch.range(*args, dtype=dtype)
    for _ in range(2):
        with pytest.warns(UserWarning):
            got = torch.range(*args, dtype=dtype, device=DEV)
        assert got.dtype == expected.dtype
        assert_close(got.cpu(), expected)
    with pytest.raises(RuntimeError, match="step must be nonzero"), pytest.warns(UserWarning):
        torch.range(0, 3, 0, device=DEV)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(3, 3).to_sparse().to(DEV),
        lambda: torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.tensor([1.0]), (2, 2), device=DEV),
    ],
)
def test_sparse_layouts_raise_a_clear_error(make):
    with pytest.raises(NotImplementedError, match="sparse layouts are not supported on the tpu device"):
        make()
    assert_close(torch.ones(3, device=DEV).sum().cpu(), torch.tensor(3.0))


def test_nested_tensors_raise_a_clear_error():
    # test_nn's test_TransformerEncoderLayer_empty: the fast path's op on a nested tpu tensor
    nt = torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)], device=DEV)
    with pytest.raises(NotImplementedError, match=r"aten::add.Tensor: nested tensors \(the NestedTensor layout\)"):
        nt + 1
    with pytest.raises(NotImplementedError, match="nested tensors"):
        nt.cpu()
    # the empty one has dim 1: MultiheadAttention's own assert, as on the CPU
    layer = torch.nn.TransformerEncoderLayer(8, 2, batch_first=True).to(DEV).eval()
    with torch.no_grad(), pytest.raises(AssertionError, match="does not support NestedTensor outside"):
        layer(torch.nested.nested_tensor([], device=DEV))


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("index", [[5], [0, -4], [[1], [3]]])
def test_host_indices_out_of_range_raise_index_error_at_the_op(index):
    x = torch.randn(3, 4)
    idx = torch.tensor(index)
    same_error(lambda device: x.to(device)[idx])
    same_error(lambda device: x.to(device).index_put_((idx,), torch.tensor(1.0, device=device)))
    good = torch.tensor([2, -1])
    both(lambda device: x.to(device)[good])


def test_device_indices_out_of_range_raise_an_index_error_and_the_device_keeps_working():
    x = torch.randn(3, device=DEV)
    y = x * 2
    with pytest.raises(IndexError, match="out of bounds"):
        x[torch.tensor([5], device=DEV)].cpu()
    assert_close((x + 1).cpu(), x.cpu() + 1)  # not sticky (CUDA's assert would be)
    assert_close(y.cpu(), x.cpu() * 2)
    with pytest.raises(IndexError, match="out of range"):  # and raised again by the next bad index (at the op)
        x.index_select(0, torch.tensor([-4], device=DEV)).cpu()


@pytest.mark.parametrize(
    "op",
    [
        lambda t, s: t + s,
        lambda t, s: s * t,
        lambda t, s: torch.where(t > 0, t, s),
        lambda t, s: torch.maximum(t, s),
        lambda t, s: t.masked_fill(t > 0, s),
        lambda t, s: t.index_fill(0, torch.tensor([0, 2], device=t.device), s),
        lambda t, s: torch.lerp(t, t * 2, s),
        lambda t, s: torch.addcmul(t, t, t, value=2) * s,
    ],
)
def test_cpu_scalar_tensors_mix_with_tpu_tensors(op):
    x, s = torch.randn(5), torch.randn(())
    both(lambda device: op(x.to(device), s))


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: torch.nn.LazyLinear(3), (2, 5)),
        (lambda: torch.nn.LazyConv2d(4, 3), (2, 3, 8, 8)),
        (lambda: torch.nn.LazyBatchNorm1d(), (4, 6)),
    ],
)
def test_lazy_modules_move_to_tpu(make, shape):
    torch.manual_seed(0)
    module = make().to(DEV)
    x = torch.randn(shape)
    y = module(x.to(DEV))
    assert all(p.device.type == "tpu" for p in module.parameters())
    torch.manual_seed(0)
    reference = make()
    reference(x)  # initialise the same shapes, then take the tpu module's values
    reference.load_state_dict({k: v.cpu() for k, v in module.state_dict().items()})
    if isinstance(reference, torch.nn.modules.batchnorm._BatchNorm):
        reference.running_mean.zero_()
        reference.running_var.fill_(1)
        reference.num_batches_tracked.zero_()
    assert_close(y.cpu(), reference(x))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_inplace_shift_operators(dtype):
    x = torch.randint(0, 50, (6,), dtype=dtype)
    shifts = torch.randint(0, 3, (6,), dtype=dtype)

    def run(device):
        a = x.clone().to(device)
        a <<= 2
        b = a.clone()
        b >>= torch.tensor(1, dtype=dtype)
        c = a.clone()
        c[1:4] <<= shifts.to(device)[1:4]
        c >>= shifts.to(device)
        return torch.stack([a, b, c])

    both(run)


@pytest.mark.parametrize(
    "op, dtype",
    [
        (lambda t: torch.gcd(t, t), torch.float32),
        (lambda t: torch.bitwise_and(t, t), torch.float64),
        (lambda t: torch.remainder(t, True), torch.bool),
    ],
)
def test_dtypes_jax_refuses_raise_torchs_error_type(op, dtype):
    x = torch.randn(4).to(dtype)
    with pytest.raises(Exception) as cpu_error:
        op(x)
    for _ in range(2):
        with pytest.raises(type(cpu_error.value)) as tpu_error:
            op(x.to(DEV))
        assert str(tpu_error.value) == str(cpu_error.value).replace("_cpu", "_tpu")


# ------------------------------------------------------------------ tools/upstream_tests.py
_GENERIC_FILE = """
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, dtypes, dtypesIfCPU, onlyCPU
from torch.testing._internal.common_utils import TestCase


class TestTiny(TestCase):
    @dtypes(torch.float32, torch.int64)
    def test_add(self, device, dtype):
        x = torch.ones(3, dtype=dtype, device=device)
        self.assertEqual((x + x).cpu(), torch.full((3,), 2, dtype=dtype))

    @onlyCPU
    def test_for_the_cpu_only(self, device):
        pass

    @dtypesIfCPU(torch.float32, torch.float64)
    @dtypes(torch.float32)
    def test_more_dtypes_on_the_cpu(self, device, dtype):
        pass

    def test_only_cpu_passes(self, device):
        if device != "cpu":
            raise ValueError(f"not on {device}")


instantiate_device_type_tests(TestTiny, globals())
"""


def test_upstream_tests_tool_compares_the_devices_by_test_name(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    tools = Path(__file__).resolve().parents[1] / "tools"
    sys.path.insert(0, str(tools))
    try:
        import upstream_tests
    finally:
        sys.path.remove(str(tools))
    assert (
        upstream_tests.common_name("t.py::TestFooPRIVATEUSE1::test_only_cpu_x_tpu_float32")
        == upstream_tests.common_name("t.py::TestFooCPU::test_only_cpu_x_cpu_float32")
        == "t.py::TestFoo::test_only_cpu_x_DEV_float32"
    )
    (tmp_path / "pytorch" / "test").mkdir(parents=True)
    (tmp_path / "pytorch" / "test" / "test_tiny_generic.py").write_text(_GENERIC_FILE)
    done = subprocess.run(
        [
            sys.executable,
            str(tools / "upstream_tests.py"),
            "run",
            str(tmp_path / "pytorch"),
            "test/test_tiny_generic.py",
            "--out",
            str(tmp_path / "runs"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env={**os.environ, **_LEAN_PYTEST},
    )
    # the @onlyCPU test and the float64 one the file makes for the CPU only are not tpu failures
    assert "3/4 cpu-passing tests pass on tpu" in done.stdout, done.stdout + done.stderr
    assert "2 cpu-passing tests are for other devices only" in done.stdout
    assert "ValueError: not on tpu:N" in done.stdout
    assert "time " in done.stdout and "s (" in done.stdout  # both devices' wall times, side by side
    # --resume runs only what a device lacks: nothing here, and the report (both devices') stays the same;
    # one device is enough for that (each device's child pytest is a fresh interpreter: ~1/4 of the test)
    resumed = subprocess.run(
        [
            sys.executable,
            str(tools / "upstream_tests.py"),
            "run",
            str(tmp_path / "pytorch"),
            "test/test_tiny_generic.py",
        ]
        + ["--out", str(tmp_path / "runs"), "--resume", "--devices", "tpu"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env={**os.environ, **_LEAN_PYTEST},
    )
    assert "3/4 cpu-passing tests pass on tpu" in resumed.stdout, resumed.stdout + resumed.stderr


_DEFERRED_ASSERT_FILE = """
import unittest
import torch


class TestDeferred(unittest.TestCase):
    def test_a_leaves_an_assert(self):
        mask = torch.arange(5, device="tpu") > 1  # computed on the device: checked there
        torch.zeros(5, device="tpu").masked_scatter_(mask, torch.ones(2, device="tpu"))

    def test_b_next(self):
        self.assertEqual(torch.ones(3, device="tpu").add(1).sum().item(), 6.0)
"""


def test_upstream_tests_tool_fails_the_test_that_left_a_device_assert(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    tools = Path(__file__).resolve().parents[1] / "tools"
    (tmp_path / "pytorch" / "test").mkdir(parents=True)
    (tmp_path / "pytorch" / "test" / "test_deferred.py").write_text(_DEFERRED_ASSERT_FILE)
    command = [sys.executable, str(tools / "upstream_tests.py"), "run", str(tmp_path / "pytorch"), "test_deferred.py"]
    subprocess.run(command + ["--devices", "tpu", "--out", str(tmp_path / "runs")], capture_output=True, timeout=600)
    lines = (tmp_path / "runs" / "tpu" / "test_deferred.py.jsonl").read_text().splitlines()
    outcomes = {json.loads(line)["id"].split("::")[-1]: json.loads(line) for line in lines}
    assert outcomes["test_a_leaves_an_assert"]["outcome"] == "error"
    assert "Number of elements of source" in outcomes["test_a_leaves_an_assert"]["message"]
    assert outcomes["test_b_next"]["outcome"] == "passed"


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.complex64])
def test_storage_type_names_the_tpu_legacy_class(dtype):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        cpu_class = torch.empty(2, dtype=dtype).storage_type()
        tpu_class = torch.empty(2, dtype=dtype, device=DEV).storage_type()
        assert tpu_class is getattr(torch.tpu, cpu_class.__name__)
        assert tpu_class.dtype == dtype
        assert isinstance(torch.ones(2, dtype=dtype, device=DEV).storage(), tpu_class)
        x = torch.randn(3).to(dtype)
        assert x.to(DEV).storage().tolist() == x.storage().tolist()


@pytest.mark.parametrize(
    "dtype, kwargs",
    [
        (torch.float32, {}),
        (torch.float16, {"dim": 1}),
        (torch.float64, {"dim": [0], "keepdim": True}),
        (torch.int32, {}),
        (torch.uint8, {"dim": 0}),
        (torch.bool, {}),
    ],
)
def test_hash_tensor(dtype, kwargs):
    x = (torch.randn(4, 5) * 100).to(dtype)
    expected = torch.hash_tensor(x, **kwargs)
    for _ in range(2):
        got = torch.hash_tensor(x.to(DEV), **kwargs)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got.cpu(), expected)


def test_index_lists_and_uploaded_indices_are_checked_at_the_op():
    x = torch.randn(3, 4)
    same_error(lambda device: x.to(device)[[1, 5]])
    same_error(lambda device: x.to(device)[torch.tensor([[0], [-7]], device=device)])
    same_error(lambda device: x.to(device)[:, [4]])
    both(lambda device: x.to(device)[[2, -1]])
    idx = torch.tensor([1], device=DEV)
    idx.add_(10)  # computed on the device: the host no longer knows it, the device checks it
    y = x.to(DEV)[idx]
    with pytest.raises(IndexError, match="out of bounds"):
        y.cpu()
    assert_close(x.to(DEV)[torch.tensor([0, 2], device=DEV)].cpu(), x[[0, 2]])


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_training_double_backward(affine):
    """Correct (gradcheck and gradgradcheck against finite differences), in the default mode: their
    reentrancy check compares two backward passes bit for bit and the fused mode's compiled segments
    round differently from the same ops run one by one, so they run in strict mode for tpu inputs
    (integrations/patches.py; docs/upstream_tests.md)."""
    x = torch.randn(4, 3, 5, dtype=torch.float64, device=DEV, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, device=DEV, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, device=DEV, requires_grad=True)
    inputs = (x, w, b) if affine else (x,)

    def fn(x, w=None, b=None):
        return torch.nn.functional.batch_norm(x, None, None, w, b, training=True)

    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_complex32_zeros_and_copies():
    """complex32 (once refused with a TypeError) is a tpu dtype: tests/test_complex32.py."""
    assert torch.zeros(3, dtype=torch.complex32, device=DEV).cpu().view(torch.int32).eq(0).all()
    x = torch.randn(3, dtype=torch.complex64).to(torch.complex32)
    assert torch.equal(x.to(DEV).cpu().view(torch.int32), x.view(torch.int32))


def test_tensor_subclasses_move_to_tpu():
    class Tagged(torch.Tensor):
        pass

    x = torch.randn(3).as_subclass(Tagged)
    moved = x.to(DEV)
    assert type(moved) is Tagged
    assert_close(moved.cpu().as_subclass(torch.Tensor), x.as_subclass(torch.Tensor))
    on_device = torch.randn(4, device=DEV)
    view = on_device.as_subclass(Tagged)
    assert type(view) is Tagged and view.untyped_storage().data_ptr() == on_device.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    "factory",
    [
        lambda out: torch.arange(0, 3, out=out),
        lambda out: torch.linspace(0, 1, 3, out=out),
        lambda out: torch.logspace(0, 1, 3, out=out),
        lambda out: torch.cat([torch.ones(2, device=out.device), torch.ones(1, device=out.device)], out=out),
    ],
)
def test_factory_out_into_an_expanded_tensor_raises(factory):
    same_error(lambda device: factory(torch.zeros(1, device=device).expand(3)))


@pytest.mark.parametrize(
    "call",
    [
        lambda x: x.clamp(),
        lambda x: x.clamp_(),
        lambda x: torch.clamp(x, None, None, out=torch.empty_like(x)),
        lambda x: torch.clip(x),
    ],
)
def test_clamp_without_bounds_raises_the_cpus_error(call):
    # PyTorch's meta kernel for clamp raises a ValueError; its CPU and CUDA kernels a RuntimeError
    same_error(lambda device: call(torch.randn(4, device=device)))
    x = torch.randn(16)
    both(lambda device: x.to(device).clamp(min=-0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.complex64])
@pytest.mark.parametrize(
    "sizes, dim, size, step", [([7], 0, 3, 2), ([5, 6, 4], -1, 4, 3), ([], 0, 1, 1), ([8], 0, 2, 4)]
)
def test_unfold_backward(sizes, dim, size, step, dtype):
    grad = torch.randn(torch.randn(sizes).unfold(dim, size, step).shape).to(dtype)
    both(lambda device: torch.ops.aten.unfold_backward(grad.to(device), sizes, dim, size, step))


def test_unfold_backward_bad_window_raises_the_cpus_errors():
    same_error(lambda device: torch.ops.aten.unfold_backward(torch.randn(2, 3, device=device), [6], 0, 3, 0))
    same_error(lambda device: torch.ops.aten.unfold_backward(torch.randn(2, 3, device=device), [6], 0, -1, 1))


def _ints(device, dtype=torch.int32):
    return torch.randint(1, 9, (4,), dtype=dtype, device=device)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch.addcdiv(_ints(d), _ints(d), _ints(d)),
        lambda d: _ints(d).addcdiv_(_ints(d), _ints(d)),
        lambda d: torch.addcdiv(_ints(d), _ints(d), _ints(d), out=_ints(d)),
        lambda d: torch.add(_ints(d), _ints(d), alpha=1.5),
        lambda d: _ints(d).add_(_ints(d), alpha=1.5),
        lambda d: torch.add(_ints(d), 2, alpha=0.5),
        lambda d: torch.add(_ints(d, torch.bool), _ints(d, torch.bool), alpha=1.5),  # (computed before)
        lambda d: torch.add(_ints(d), _ints(d), alpha=True),
        lambda d: torch.add(_ints(d).float(), _ints(d).float(), alpha=1j),
        lambda d: torch.sub(_ints(d), _ints(d), alpha=1.5),
        lambda d: torch.rsub(_ints(d), _ints(d), alpha=1.5),
        lambda d: _ints(d, torch.bool).sub_(_ints(d, torch.bool)),
        lambda d: torch.add(_ints(d).float(), _ints(d), out=_ints(d, torch.int64)),
        lambda d: torch.sub(_ints(d).cfloat(), _ints(d), out=_ints(d).float()),
    ],
)
def test_alpha_and_integer_addcdiv_raise_the_cpus_errors(call):
    # PyTorch's meta kernels raise ValueErrors (or a garbled message) for these, or nothing for a bool result
    same_error(call)


def test_alpha_and_addcdiv_still_compute():
    a, b, c = torch.randn(5), torch.randn(5), torch.rand(5) + 0.5
    both(lambda d: torch.add(a.to(d), b.to(d), alpha=2.5))
    both(lambda d: torch.sub(a.to(d), 3, alpha=-2))
    both(lambda d: torch.addcdiv(a.to(d), b.to(d), c.to(d), value=0.5))
    both(lambda d: torch.add(a.to(d) > 0, b.to(d) > 0, alpha=True))


@pytest.mark.parametrize(
    "inputs, out", [((torch.float32, torch.int64), torch.uint8), ((torch.complex64,), torch.float32)]
)
def test_cat_out_of_another_kind_raises_the_cpus_type_error(inputs, out):
    def run(device):
        tensors = [torch.randn(3).to(dtype).to(device) for dtype in inputs]
        torch.cat(tensors, out=torch.zeros(3 * len(tensors), dtype=out, device=device))

    same_error(run)
    x, y = torch.randint(0, 9, (3,)), torch.randn(2)
    both(lambda device: torch.cat([x.to(device), y.to(device)], out=torch.zeros(5, dtype=torch.float64, device=device)))


@pytest.mark.parametrize(
    "call",
    [
        lambda a, out: torch.exp(a, out=out),
        lambda a, out: torch.mul(a, 1.5, out=out),
        lambda a, out: torch.true_divide(a, a, out=out),
        lambda a, out: torch.sigmoid(a, out=out),
    ],
)
def test_out_cast_errors_are_the_cpus(call):
    """An `out=` tensor the result cannot be cast to: the CPU's message, not the meta kernel's."""
    errors = []
    for dev in ("cpu", DEV):
        a = torch.arange(1, 4, device=dev)
        with pytest.raises(RuntimeError) as info:
            call(a, torch.empty(3, dtype=torch.int64, device=dev))
        errors.append(str(info.value))
    assert errors[1] == errors[0] and "can't be cast to the desired output type Long" in errors[0]


# A child pytest without the installed plugins' entry points (hypothesis alone: ~2 s of CPU per start);
# xdist named, for the tool's -n0.
_LEAN_PYTEST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTEST_PLUGINS": "xdist.plugin"}

_TIMED_FILE = """
import time
import pytest


@pytest.fixture
def slow_teardown():
    yield
    time.sleep(30)


def test_slow_call():
    time.sleep(30)


def test_slow_teardown(slow_teardown):
    pass


def test_swallows_exceptions():
    for _ in range(4):  # a library's retry of work that failed
        try:
            time.sleep(4)
        except Exception:
            pass


def test_swallows_everything():
    try:
        time.sleep(30)
    except BaseException:
        pass
    time.sleep(30)


def test_after():
    pass
"""


def test_the_per_test_time_limit_fails_that_test_and_the_run_goes_on(tmp_path):
    """The tools' recorder plugin (tools/transformers_tests.py, used by upstream_tests.py too) arms the
    limit only inside a test's phases: a slow call fails, a slow teardown errors, the next test runs; an
    `except Exception` (or BaseException) in the test's code does not take the limit away."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    tools = Path(__file__).resolve().parents[1] / "tools"
    (tmp_path / "test_timed.py").write_text(_TIMED_FILE)
    results = tmp_path / "results.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # (the outer run's plugins)
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(tools), env.get("PYTHONPATH")) if p),
        TORCHTPU_TESTS_RESULTS=str(results),
        TORCHTPU_TESTS_TEST_TIMEOUT="0.5",
        **_LEAN_PYTEST,
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "transformers_tests", "test_timed.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # failures, not an INTERNALERROR (3)
    got = {r["id"].split("::")[1]: r for r in map(json.loads, results.read_text().splitlines())}
    assert got["test_slow_call"]["outcome"] == "failed" and "TimeoutError" in got["test_slow_call"]["message"]
    assert got["test_slow_teardown"]["outcome"] == "error"
    for name in ("test_swallows_exceptions", "test_swallows_everything"):  # the limit is not taken for their failure
        assert got[name]["outcome"] == "failed" and got[name]["seconds"] < 10, got[name]
    assert got["test_after"]["outcome"] == "passed"


_STALLING_FILE = """
import signal
import time


def test_before():
    pass


def test_stalls():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # as a wait in native code: the alarm never lands
    time.sleep(30)


def test_after():
    pass
"""


def test_a_test_that_outlives_its_alarm_is_recorded_and_the_file_resumes(tmp_path):
    """A test blocked where the limit's alarm cannot land (it runs only in Python) kept the whole file's
    process until --file-timeout (whisper's long-form test, thirteenth session): the watchdog dumps the
    stacks and ends the process, the test is recorded as failed, and the file's other tests still run."""
    import argparse
    import json
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import transformers_tests as tool

    (tmp_path / "test_stall.py").write_text(_STALLING_FILE)
    results = tmp_path / "results.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env.update(
        PYTHONPATH=tool.tools_first_on_path(env),
        TORCHTPU_TESTS_RESULTS=str(results),
        TORCHTPU_TESTS_TEST_TIMEOUT="0.3",
        TORCHTPU_TESTS_STALL_GRACE="0.3",
        **_LEAN_PYTEST,
    )
    args = argparse.Namespace(k=None, pytest_args=[], file_timeout=60, test_timeout=0.3)
    tool.run_file_resuming("test_stall.py", tmp_path, env, args, results)
    got = {r["id"].split("::")[1]: r for r in map(json.loads, results.read_text().splitlines())}
    assert got["test_before"]["outcome"] == got["test_after"]["outcome"] == "passed", got
    assert got["test_stalls"]["outcome"] == "failed" and tool.STALL_MARK in got["test_stalls"]["message"]
    dump = Path(f"{results}.stall1").read_text()
    assert dump.startswith("test_stall.py::test_stalls\n") and "test_stall.py" in dump.split("\n", 1)[1]
