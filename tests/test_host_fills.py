"""Small fills of a new shape come from the host without an executable (eager/host_fills.py), with
the CPU's values; reads of a few elements of a queued small tensor need no program either."""

import pytest
import torch

import torchtpu
from torchtpu.eager import host_fills

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.uint8,
          torch.bool, torch.complex64]  # fmt: skip


def _compiles():
    return torchtpu.metrics()["eager_compiles"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fills_of_new_shapes_match_the_cpu_without_compiling(dtype):
    before = _compiles()
    for shape in [(3,), (2, 7), (1, 3, 5)]:
        for value in [0, 1, -3, 2.75, -0.0, float("nan"), True]:
            if not dtype.is_floating_point and not dtype.is_complex and isinstance(value, float):
                continue  # (PyTorch's own overflow/NaN checks: the host check, as before)
            if dtype == torch.uint8 and value == -3:
                continue
            torch.testing.assert_close(
                torch.full(shape, value, dtype=dtype, device="tpu").cpu(),
                torch.full(shape, value, dtype=dtype),
                equal_nan=True,
            )
        torch.testing.assert_close(torch.ones(shape, dtype=dtype, device="tpu").cpu(), torch.ones(shape, dtype=dtype))
        torch.testing.assert_close(torch.zeros(shape, dtype=dtype, device="tpu").cpu(), torch.zeros(shape, dtype=dtype))
    assert _compiles() == before


def test_full_infers_the_dtype_and_keeps_signs():
    assert torch.full((2,), True, device="tpu").dtype == torch.bool
    assert torch.full((2,), 3, device="tpu").dtype == torch.int64
    assert torch.full((2,), 3.0, device="tpu").dtype == torch.get_default_dtype()
    assert torch.signbit(torch.full((4,), -0.0, device="tpu").cpu()).all()
    x = torch.full((2, 2), 2.5, device="tpu")
    x.add_(1)  # the written storage gets a new buffer; a later fill of the same value is unchanged
    torch.testing.assert_close(torch.full((2, 2), 2.5, device="tpu").cpu(), torch.full((2, 2), 2.5))
    torch.testing.assert_close(x.cpu(), torch.full((2, 2), 3.5))


def test_fill_of_a_view_or_shared_storage_writes_through():
    base = torch.randn(4, 5)
    t = base.to("tpu")
    alias = t.view(20)
    t.fill_(1.5)  # the whole storage: every alias sees it
    torch.testing.assert_close(alias.cpu(), torch.full((20,), 1.5))
    t[1].fill_(-2.0)  # a part: the engine's scatter, the rest kept
    expected = torch.full((4, 5), 1.5)
    expected[1] = -2.0
    torch.testing.assert_close(t.cpu(), expected)
    t.zero_()
    torch.testing.assert_close(alias.cpu(), torch.zeros(20))


def test_fill_keeps_the_cpu_errors():
    x = torch.zeros(3, dtype=torch.uint8, device="tpu")
    with pytest.raises(RuntimeError, match="overflow"):
        torch.full((3,), 300, dtype=torch.uint8, device="tpu")
    with pytest.raises(RuntimeError, match="overflow"):
        x.fill_(300)


def test_recurring_fill_gets_its_executable(monkeypatch):
    monkeypatch.setattr(host_fills, "HOST_CALLS", 2)
    before = _compiles()
    for i in range(4):
        torch.testing.assert_close(torch.full((3, 11), i, device="tpu").cpu(), torch.full((3, 11), i))
    assert _compiles() == before + 1


def test_large_fill_is_not_made_on_the_host():
    big = host_fills.HOST_BYTES // 4 + 1
    before = _compiles()
    torch.testing.assert_close(torch.ones(big, device="tpu")[-3:].cpu(), torch.ones(3))
    assert _compiles() > before


def test_fill_of_a_queued_tensor_and_reading_its_elements():
    """In the fused mode a tensor computed by queued ops can be refilled, and its elements read one by
    one (`all(verdicts)`), without a program per element view."""
    a = torch.randn(6, device="tpu")
    b = (a * 2).exp()  # queued or run: either way b has a value
    b.fill_(0.25)
    torch.testing.assert_close(b.cpu(), torch.full((6,), 0.25))
    v = torch.rand(5).to("tpu") > 0.5
    w = v | torch.full((5,), False, device="tpu")
    before = _compiles()
    assert [bool(e) for e in w] == [bool(e) for e in v.cpu()]
    assert _compiles() == before


FOLD_CASES = [
    (lambda a, b: a / 9, torch.float32, torch.float32),
    (lambda a, b: a | b, torch.bool, torch.bool),
    (lambda a, b: (a * 3 - b) == 2, torch.int64, torch.int64),
    (lambda a, b: a / b, torch.int64, torch.int8),  # integers' true division: the default float
    (lambda a, b: a + 2.5, torch.int8, torch.int8),  # a wrapped float promotes to the default float
    (lambda a, b: torch.add(a, b, alpha=3), torch.uint8, torch.uint8),
    (lambda a, b: a + 300, torch.uint8, torch.uint8),  # a wrapped int wraps into uint8 as on the CPU
    (lambda a, b: a / torch.zeros_like(b), torch.float64, torch.float64),
    (lambda a, b: torch.logical_not(a > b), torch.bfloat16, torch.float16),
]


@pytest.mark.parametrize("i", range(len(FOLD_CASES)))
def test_elementwise_ops_of_fills_fold_on_the_host_as_the_cpu(i):
    """`torch.ones(n) / n` and `full | full` (stopping criteria) of new shapes compile nothing."""
    op, dtype_a, dtype_b = FOLD_CASES[i]
    # (a shape no other test uses: the fold is a first call's; a shape another test ran already runs
    # its executable, whose result is no fill for the next op)
    shape = (3, 29 + i)
    expected = op(torch.ones(shape, dtype=dtype_a), torch.full((shape[1],), 1, dtype=dtype_b))
    before = _compiles()
    got = op(torch.ones(shape, dtype=dtype_a, device="tpu"), torch.full((shape[1],), 1, dtype=dtype_b, device="tpu"))
    assert _compiles() == before
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)


def test_fold_needs_whole_unwritten_fills():
    """A written fill, part of one, a random tensor or a subnormal result take the engine's path."""
    x = torch.ones(3, 4, device="tpu")
    x.add_(1)  # a new buffer: no longer the fill's
    torch.testing.assert_close((x / 2).cpu(), torch.ones(3, 4))
    torch.testing.assert_close((torch.ones(3, 6, device="tpu")[1] * 4).cpu(), torch.full((6,), 4.0))
    r = torch.randn(3, 7)
    torch.testing.assert_close((torch.ones(3, 7, device="tpu") + r.to("tpu")).cpu(), r + 1)
    # a subnormal result is the engine's (XLA:CPU flushes it), as for a tensor that is no fill
    engine = torch.tensor([1e-38] * 9).to("tpu") * 0.01
    torch.testing.assert_close((torch.full((9,), 1e-38, device="tpu") * 0.01).cpu(), engine.cpu())
    before = _compiles()
    product = torch.full((3, 9), 2.0, device="tpu").mul(torch.full((3, 9), 3.0, device="tpu"))
    assert _compiles() == before
    assert product.sum().item() == 162


def test_eye_of_new_shapes_matches_the_cpu_without_compiling():
    before = _compiles()
    for dtype in (torch.float32, torch.int8, torch.bool, torch.complex64, torch.bfloat16):
        for args in ((3,), (2, 5), (4, 1)):
            got = torch.eye(*args, dtype=dtype, device="tpu")
            assert got.dtype == dtype and got.is_contiguous()
            assert torch.equal(got.cpu(), torch.eye(*args, dtype=dtype))
    assert torch.eye(2, 3, device="tpu").dtype == torch.get_default_dtype()
    assert _compiles() == before
    assert torch.eye(0, 3, device="tpu").shape == (0, 3)  # (empty: the engine's path)
    with pytest.raises(RuntimeError, match="n must be greater or equal to 0, got -1"):
        torch.eye(-1, device="tpu")


def test_a_causal_mask_over_a_short_arange_folds_on_the_host_as_the_cpu():
    """Transformers' mask of a decode step from host shapes (`arange(kv_length) + offset`, `kv <= q`,
    `ones & causal`): a short integer arange's values are known, and folds of them stay known, so
    nothing compiles per key length; a float result, and a tensor that is no known array, take the
    engine's path."""
    n = 43  # (a length no other test uses: a shape another test ran runs its executable)

    def mask(device):
        kv = torch.arange(n, device=device) + 0
        q = torch.arange(1, device=device) + (n - 1)
        causal = kv[None, None, None, :] <= q[None, None, :, None]
        return q.new_ones((), dtype=torch.bool) & causal, kv * 2 - 5

    before = _compiles()
    got, ints = mask("tpu")
    assert _compiles() == before
    expected, expected_ints = mask("cpu")
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    torch.testing.assert_close(ints.cpu(), expected_ints, rtol=0, atol=0)
    halves = torch.arange(n - 2, device="tpu") / 2  # (a float result: the engine's division)
    torch.testing.assert_close(halves.cpu(), torch.arange(n - 2) / 2)
    r = torch.randint(0, 9, (n - 1,))
    torch.testing.assert_close((torch.arange(n - 1, device="tpu") + r.to("tpu")).cpu(), torch.arange(n - 1) + r)
