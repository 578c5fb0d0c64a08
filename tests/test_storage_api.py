"""The storage API on tpu behaves as on CUDA: what works there works here with the CPU's values, and
what CUDA rejects raises its error; nothing crashes the process (issue 47). Resizing a storage goes
through PyTorch's PrivateUse1 hook (device/csrc/tpu_hooks.cpp -> storage/records.py resize_storage)."""

from __future__ import annotations

import copy
import gc
import io
import pickle
import warnings

import pytest
import torch
from torch.testing import assert_close

from torchtpu.device import native

DEV = "tpu"

needs_extension = pytest.mark.skipif(not native.resizes_storages(), reason="the C++ extension is not built here")


def _bytes(storage):
    return list(storage.cpu())


def _both(make):
    """make(device) on the CPU and on tpu."""
    return make("cpu"), make(DEV)


# ------------------------------------------------------------------ resizing
@needs_extension
@pytest.mark.parametrize("nbytes", [0, 5, 24, 40, 1000])
def test_storage_resize_keeps_the_bytes_in_front(nbytes):
    values = torch.randn(6)
    cpu, tpu = values.clone().untyped_storage(), values.to(DEV).untyped_storage()
    before = tpu.data_ptr()
    assert cpu.resize_(nbytes) is cpu and tpu.resize_(nbytes) is tpu
    assert tpu.nbytes() == nbytes and tpu.device.type == DEV
    kept = min(nbytes, 24)
    assert _bytes(tpu)[:kept] == _bytes(cpu)[:kept]
    assert tpu.data_ptr() != before or nbytes == 24  # a new allocation, as CUDA's resize


@needs_extension
def test_storage_resize_is_seen_by_every_tensor_over_it():
    for device in ("cpu", DEV):
        t = torch.arange(6.0, device=device)
        view = t[2:4]
        t.untyped_storage().resize_(40)
        assert view.untyped_storage().nbytes() == 40
        assert view.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        whole = torch.empty(0, device=device).set_(t.untyped_storage())
        whole[6:] = 7.0  # written through the grown storage, read through the old views
        view.mul_(10)
        assert whole.tolist()[:6] == [0.0, 1.0, 20.0, 30.0, 4.0, 5.0]
        assert whole.tolist()[6:] == [7.0] * 4
        assert t.tolist() == [0.0, 1.0, 20.0, 30.0, 4.0, 5.0]


@needs_extension
def test_tensor_resize_grows_the_shared_storage():
    expected, actual = _both(lambda d: torch.arange(6.0, device=d))
    views = expected[1:3], actual[1:3]
    expected.resize_(3, 4)
    actual.resize_(3, 4)
    for v in views:
        v.add_(100)  # the view still shares the (grown) storage, as on the CPU and CUDA
    assert actual.shape == expected.shape and actual.stride() == expected.stride()
    assert actual.untyped_storage().nbytes() == expected.untyped_storage().nbytes() == 48
    assert_close(actual.cpu().reshape(-1)[:6], expected.reshape(-1)[:6])
    assert actual.untyped_storage().data_ptr() == views[1].untyped_storage().data_ptr()


@needs_extension
@pytest.mark.parametrize("allocated", [False, True], ids=["tensor_storage", "allocator_storage"])
def test_set_onto_a_storage_too_small_grows_it(allocated):
    # the CPU kernel would grow it with the CPU allocator: an error for a tensor's storage, a segfault
    # for one made by torch.UntypedStorage(n, device="tpu")
    results = []
    for device in ("cpu", DEV):
        if allocated:
            source = torch.UntypedStorage(8, device=device)
        else:
            source = torch.arange(6.0, device=device).untyped_storage()
        before = _bytes(source)
        t = torch.empty(0, device=device).set_(source, 1, (3, 3), (3, 1))
        assert t.untyped_storage().nbytes() == source.nbytes() == 40
        assert _bytes(source)[: len(before)] == before
        results.append((t.shape, t.stride(), t.storage_offset()))
    assert results[0] == results[1]


def test_set_without_arguments_empties_the_tensor():
    expected, actual = _both(lambda d: torch.arange(6.0, device=d))
    for t in (expected, actual):
        t.set_()
    assert actual.shape == expected.shape and actual.stride() == expected.stride()
    assert actual.untyped_storage().nbytes() == 0
    actual.resize_(3).fill_(2.0)
    assert actual.tolist() == [2.0] * 3


@needs_extension
def test_resize_to_nothing_and_back_as_fsdp2_does():
    gc.collect()
    before = torch.tpu.memory_allocated()
    t = torch.randn(256, device=DEV)
    storage = t.untyped_storage()
    storage.resize_(0)
    assert torch.tpu.memory_allocated() == before
    storage.resize_(1024)
    assert torch.tpu.memory_allocated() == before + 1024
    values = torch.randn(256)
    t.copy_(values)
    assert_close(t.cpu(), values)
    del t, storage
    gc.collect()
    assert torch.tpu.memory_allocated() == before


@needs_extension
def test_resize_of_a_result_still_being_computed():
    x = torch.randn(6, device=DEV)
    y = x * 2 + 1  # (in the fused mode, a queued result)
    y.untyped_storage().resize_(32)
    assert_close(y.cpu(), x.cpu() * 2 + 1)
    tail = torch.empty(0, device=DEV).set_(y.untyped_storage())[6:]
    assert tail.shape == (2,)


@needs_extension
def test_resize_to_a_partial_element():
    for device in ("cpu", DEV):
        t = torch.arange(6.0, device=device)
        t.untyped_storage().resize_(10)
        as_bytes = torch.empty(0, dtype=torch.uint8, device=device).set_(t.untyped_storage())
        assert as_bytes.shape == (10,)
        assert as_bytes.tolist() == torch.arange(6.0).view(torch.uint8)[:10].tolist()
        assert torch.empty(0, device=device).set_(t.untyped_storage(), 0, (2,), (1,)).tolist() == [0.0, 1.0]


def test_typed_storage_resize():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        if not native.resizes_storages():
            pytest.skip("the C++ extension is not built here")
        expected, actual = _both(lambda d: torch.arange(6.0, device=d))
        for t in (expected, actual):
            t.storage().resize_(8)
        assert actual.storage().size() == expected.storage().size() == 8
        assert actual.storage().tolist()[:6] == expected.storage().tolist()[:6]


# ------------------------------------------------------------------ the rest of the API, against the CPU
def _f32(device):
    return torch.arange(6, dtype=torch.float32, device=device)


def _shares(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _storage_calls():
    def mutated(make, change):
        def run(device):
            s = make(device)
            change(s)
            return s

        return run

    u = torch.UntypedStorage
    return {
        "new_bytes": lambda d: u(8, device=d).nbytes(),
        "from_list": lambda d: u([1, 2, 3], device=d),
        "element_size": lambda d: _f32(d).untyped_storage().element_size(),
        "size": lambda d: _f32(d).untyped_storage().size(),
        "tolist": lambda d: _f32(d).untyped_storage().tolist(),
        "cpu": lambda d: _f32(d).untyped_storage().cpu(),
        "to_cpu": lambda d: _f32(d).untyped_storage().to(device="cpu"),
        "clone": lambda d: _f32(d).untyped_storage().clone(),
        "copy_from_host": mutated(lambda d: u(4, device=d), lambda s: s.copy_(u([1, 2, 3, 4]))),
        "copy_to_host": lambda d: u(4).copy_(u([1, 2, 3, 4], device=d)),
        "copy_size_mismatch": lambda d: u(4, device=d).copy_(u([1, 2])),
        "fill": mutated(lambda d: u(4, device=d), lambda s: s.fill_(9)),
        "getitem": lambda d: u([1, 2, 3], device=d)[1],
        "setitem": mutated(lambda d: u([1, 2, 3], device=d), lambda s: s.__setitem__(1, 7)),
        "slice_from_0": lambda d: u([1, 2, 3, 4], device=d)[0:2],
        "slice_empty": lambda d: u([1, 2, 3, 4], device=d)[2:2].nbytes(),
        "slice_inside": lambda d: u([1, 2, 3, 4, 5, 6], device=d)[2:5],
        "slice_of_slice": lambda d: u([1, 2, 3, 4, 5, 6, 7], device=d)[1:6][2:4],
        "slice_step": lambda d: u([1, 2, 3, 4], device=d)[0:4:2],
        "slice_getitem": lambda d: u([1, 2, 3, 4], device=d)[1:3][1],
        "slice_writes_parent": mutated(
            lambda d: u(list(range(8)), device=d), lambda s: (s[2:6].fill_(9), s[3:7].__setitem__(2, 7))
        ),
        "slice_copy_into": mutated(lambda d: u(list(range(8)), device=d), lambda s: s[4:8].copy_(u([5, 6, 7, 8]))),
        "slice_resize": lambda d: u([1, 2, 3, 4], device=d)[1:3].resize_(8),
        "slice_from_0_resize": lambda d: u([1, 2, 3, 4], device=d)[0:3].resize_(8),
        "slice_pickle_typed": lambda d: pickle.loads(
            pickle.dumps(torch.TypedStorage(wrap_storage=_f32(d).untyped_storage()[8:16], dtype=torch.float32))
        ),
        "slice_save": lambda d: _round_trip(_f32(d).untyped_storage()[6:18]),
        "slice_set_too_far": lambda d: torch.empty(0, device=d).set_(u(16, device=d)[4:12], 0, (3,), (1,)),
        "byteswap_f32": mutated(lambda d: _f32(d).untyped_storage(), lambda s: s.byteswap(torch.float32)),
        "byteswap_c64": mutated(lambda d: _f32(d).untyped_storage(), lambda s: s.byteswap(torch.complex64)),
        "byteswap_ragged": lambda d: u([1, 2, 3], device=d).byteswap(torch.float32),
        "byteswap_seen_by_tensor": lambda d: (lambda t: (t.untyped_storage().byteswap(torch.int16), t)[1])(
            torch.arange(4, dtype=torch.int16, device=d)
        ),
        "new": lambda d: (lambda s: (s.nbytes(), s.device.type == d))(_f32(d).untyped_storage().new()),
        "deepcopy": lambda d: copy.deepcopy(_f32(d).untyped_storage()),
        "copy": lambda d: copy.copy(_f32(d).untyped_storage()),
        "pickle": lambda d: pickle.loads(pickle.dumps(_f32(d).untyped_storage())),
        "nbytes_of_a_view": lambda d: _f32(d)[2:].untyped_storage().nbytes(),
        "len_iter": lambda d: (len(u([1, 2, 3], device=d)), list(u([1, 2, 3], device=d))),
        "typed_of_tensor": lambda d: _f32(d).storage(),
        "typed_getitem": lambda d: _f32(d).storage()[2],
        "typed_fill": lambda d: (lambda t: (t.storage().fill_(2.0), t)[1])(_f32(d)),
        "typed_setitem": lambda d: (lambda t: (t.storage().__setitem__(1, 9.0), t)[1])(_f32(d)),
        "typed_copy": lambda d: (lambda t: (t.storage().copy_(torch.ones(6).storage()), t)[1])(_f32(d)),
        "typed_double": lambda d: _f32(d).storage().double(),
        "typed_complex": lambda d: _f32(d).storage().complex_float(),
        "typed_pickle": lambda d: pickle.loads(pickle.dumps(_f32(d).storage())),
        "typed_new": lambda d: torch.TypedStorage(4, dtype=torch.float32, device=d).size(),
        "storage_offset": lambda d: _f32(d)[2:].storage_offset(),
        "set_storage": lambda d: torch.empty(0, device=d).set_(_f32(d).untyped_storage(), 1, (2, 2), (2, 1)),
        "set_typed": lambda d: torch.empty(0, device=d).set_(_f32(d).storage(), 1, (2, 2), (1, 2)),
        "set_tensor": lambda d: torch.empty(0, device=d).set_(_f32(d)[1:]),
        "set_wrong_dtype": lambda d: torch.empty(0, device=d).set_(torch.ones(3, device=d).double().storage()),
        "set_negative_offset": lambda d: torch.empty(0, device=d).set_(_f32(d).untyped_storage(), -1, (2,), (1,)),
        "set_negative_size": lambda d: torch.empty(0, device=d).set_(_f32(d).untyped_storage(), 0, (-2,), (1,)),
        "resize_shrink": lambda d: _f32(d).resize_(2, 2),
        "resize_as": lambda d: _f32(d).resize_as_(torch.ones(3, 3)).shape,
        "data_ptr_offset": lambda d: (lambda t: t[2:].data_ptr() - t.data_ptr())(_f32(d)),
        "pickle_tensor_view": lambda d: pickle.loads(pickle.dumps(_f32(d).view(2, 3).t())),
        "deepcopy_keeps_sharing": lambda d: _shares(*copy.deepcopy([_f32(d)] * 2)),
    }


def _comparable(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.cpu().tolist())
    if isinstance(value, torch.UntypedStorage):
        return ("untyped", value.nbytes(), _bytes(value))
    if isinstance(value, torch.TypedStorage):
        return ("typed", value.dtype, value.size(), value.cpu().tolist())
    return value


def _outcome(fn, device):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
            return _comparable(fn(device))
    except Exception as e:  # noqa: BLE001 - the CPU's exception is part of what is compared
        return type(e), str(e).replace(DEV, "cpu")


@pytest.mark.parametrize("name", list(_storage_calls()))
def test_storage_calls_match_the_cpu(name):
    fn = _storage_calls()[name]
    assert _outcome(fn, DEV) == _outcome(fn, "cpu")


def test_storages_report_their_device_as_cuda_does():
    s = _f32(DEV).untyped_storage()
    assert s.device == torch.device(DEV, 0) and s.get_device() == 0 and not s.is_cuda
    assert s.is_shared()  # device storages need no moving to be shared (CUDA answers the same)
    assert s.share_memory_() is s
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert _f32(DEV).storage_type() is torch.tpu.FloatStorage
        assert _f32(DEV).storage().type() == "torch.tpu.FloatStorage"


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.complex64, torch.bool])
def test_a_tensor_over_a_storage_slice_shares_its_bytes(dtype):
    """CUDA's slice `s[a:b]` is a storage at the parent's address plus a: tensors over it read and
    write the parent's bytes (here they sit on the parent itself, as far in: storage/slices.py)."""
    values = torch.randn(10).to(dtype)
    outcomes = []
    for device in ("cpu", DEV):
        t = values.clone().to(device)
        size = t.element_size()
        piece = t.untyped_storage()[2 * size : 8 * size][size : 5 * size]  # elements 3..6
        over = torch.empty(0, dtype=dtype, device=device).set_(piece)
        assert over.data_ptr() - t.data_ptr() == 3 * size and over.shape == (4,)
        read = over.cpu().clone()
        over[1:3] = over[0]  # written through the slice, seen by the parent tensor
        outcomes.append((read, t.cpu(), [piece[i] for i in range(piece.nbytes())]))
    for expected, actual in zip(*outcomes):
        assert_close(actual, expected)


def test_a_storage_slice_not_on_an_element_boundary_is_refused_clearly():
    piece = torch.arange(4.0, device=DEV).untyped_storage()[2:10]
    assert list(piece) == list(torch.arange(4.0).untyped_storage()[2:10])  # its bytes read as on the CPU
    with pytest.raises(NotImplementedError, match="starting at byte 2"):
        torch.empty(0, device=DEV).set_(piece)


@needs_extension
def test_resizable_answers_as_cuda():
    s = _f32(DEV).untyped_storage()
    assert s.resizable() and torch.UntypedStorage(4, device=DEV).resizable()
    assert not s[4:8].resizable() and not s[0:8].resizable()  # PyTorch's slices never resize
    assert s.resize_(64).nbytes() == 64


def test_what_cuda_rejects_raises_the_same():
    t = _f32(DEV)
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        t.pin_memory()
    with pytest.raises(TypeError, match="only CPU memory can be pinned"):
        t.untyped_storage().pin_memory()
    with pytest.raises(RuntimeError, match="only available on CPU"):
        t.untyped_storage()._share_filename_cpu_()
    with pytest.raises(RuntimeError, match="only available on CPU"):
        t.untyped_storage()._share_fd_cpu_()
    with pytest.raises(RuntimeError, match="the devices must match"):
        torch.empty(0, device=DEV).set_(torch.UntypedStorage(8))
    assert not t.is_pinned()


def test_an_error_raised_while_a_temporary_storage_dies_is_kept():
    # the allocator's deleter calls into Python while PyTorch's error is pending: it used to clear
    # it, and Python reported "SystemError: error return without exception set"
    with pytest.raises(RuntimeError, match="size does not match"):
        torch.UntypedStorage(4, device=DEV).copy_(torch.UntypedStorage([1, 2]))


# ------------------------------------------------------------------ torch.save / torch.load
def _round_trip(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer, **({"_use_new_zipfile_serialization": False} if load_kwargs.pop("legacy", False) else {}))
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


@pytest.mark.parametrize(
    "kwargs, device",
    [
        ({}, "tpu:0"),
        ({"legacy": True}, "tpu:0"),
        ({"weights_only": True}, "tpu:0"),
        ({"map_location": "cpu"}, "cpu"),
        ({"map_location": {"tpu:0": "cpu"}}, "cpu"),
        ({"map_location": lambda storage, location: storage}, "cpu"),
        ({"map_location": "tpu:1"}, "tpu:1"),
    ],
    ids=["default", "legacy", "weights_only", "map_cpu", "map_dict", "map_fn", "map_tpu1"],
)
def test_save_and_load_keep_values_views_and_sharing(kwargs, device):
    base = torch.randn(4, 3, device=DEV)
    loaded = _round_trip({"base": base, "view": base.t()[1:], "storage_user": base[2]}, **kwargs)
    assert loaded["base"].device == torch.device(device)
    assert_close(loaded["base"].cpu(), base.cpu())
    assert_close(loaded["view"].cpu(), base.t()[1:].cpu())
    assert loaded["view"].stride() == base.t()[1:].stride()
    assert loaded["view"].storage_offset() == base.t()[1:].storage_offset()
    assert loaded["view"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()
    loaded["storage_user"].fill_(5.0)  # still shares its storage with the loaded base
    assert loaded["base"][2].tolist() == [5.0] * 3


def test_save_and_load_storages_and_dtypes():
    for value in (
        torch.randn(5, device=DEV).bfloat16(),
        torch.randn(5, device=DEV) > 0,
        torch.randn(5, dtype=torch.complex64, device=DEV).conj(),
    ):
        loaded = _round_trip(value)
        assert loaded.device.type == DEV and loaded.dtype == value.dtype
        assert_close(loaded.cpu().resolve_conj(), value.cpu().resolve_conj())
    storage = torch.randn(6, device=DEV).untyped_storage()
    loaded = _round_trip(storage)
    assert loaded.device.type == DEV and _bytes(loaded) == _bytes(storage)
    moved = _round_trip(torch.arange(3.0), map_location=DEV)
    assert moved.device.type == DEV and moved.tolist() == [0.0, 1.0, 2.0]


_WITHOUT_THE_EXTENSION = """
import torch
from torchtpu.device import native
assert not native.resizes_storages()
t = torch.arange(6.0, device="tpu")
try:
    t.untyped_storage().resize_(40)
except NotImplementedError as e:
    assert "C++ extension" in str(e), e
else:
    raise AssertionError("resize_ did not raise")
t.resize_(3, 4)  # onto a new storage holding the old elements
assert t.cpu().reshape(-1)[:6].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
t.set_()
assert t.shape == (0,)
print("ok")
"""


def test_without_the_extension_storage_resize_says_why():
    import os
    import subprocess
    import sys

    env = dict(os.environ, TORCHTPU_NATIVE="off")
    command = [sys.executable, "-c", _WITHOUT_THE_EXTENSION]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
