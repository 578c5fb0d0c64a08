"""The 64-bit policy: what torchtpu's process-wide `jax_enable_x64` does to the user's JAX code (README,
"What `import torch` changes"; docs/tpu.md, "64-bit types"), int64/float64 matching the CPU, the
errors for what XLA:TPU cannot compile (only when tracing for a TPU), and the TPU programs of SVD,
lstsq and int64 division that XLA:TPU compiles (and compiles quickly)."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from torchtpu.device import platform
from torchtpu.ops import convolution, elementwise, fft, linalg, linalg_decompositions

D = "tpu"


def _fresh(low=3, high=40):
    """A size no other test used: a new executable, traced now (not one cached by an earlier test)."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    return int(torch.randint(low, high, (1,), generator=g))


# ---------------------------------------------------------------- the switch and its effects
def test_user_jax_code_sees_x64_after_tpu_int64_work_and_can_scope_it_off():
    a = torch.randint(-(2**40), 2**40, (7,))
    torch.testing.assert_close((a.to(D) * 3 + 1).cpu(), a * 3 + 1)  # torchtpu at work: x64 is on
    # the documented effects on JAX code elsewhere in the process (JAX's default is 32-bit)
    assert jax.config.jax_enable_x64
    assert jnp.arange(3).dtype == jnp.int64
    assert jnp.asarray(1.5).dtype == jnp.float64
    assert jnp.zeros(2).dtype == jnp.float64
    assert (jnp.ones(2, jnp.float32) * 0.1).dtype == jnp.float32  # weak Python scalars still keep float32
    # the documented way to give one's own JAX code JAX's default: a thread-local block
    with jax.enable_x64(False):
        assert jnp.arange(3).dtype == jnp.int32 and jnp.asarray(1.5).dtype == jnp.float32
    assert jnp.arange(3).dtype == jnp.int64
    torch.testing.assert_close((a.to(D) * 5 - 2).cpu(), a * 5 - 2)


def test_tpu_ops_inside_an_x64_off_block_raise_instead_of_truncating():
    """A program traced inside a user's `jax.enable_x64(False)` block would compute int64 in 32 bits
    (`a + 1` gave 1 everywhere): it raises instead. Executables compiled before run as compiled."""
    a = torch.randint(2**33, 2**40, (_fresh(),))
    t = a.to(D)
    torch.testing.assert_close((t + 1).cpu(), a + 1)
    with jax.enable_x64(False):
        try:
            cached = (t + 1).cpu()
        except RuntimeError as e:
            assert "64-bit types turned off" in str(e)
        else:
            torch.testing.assert_close(cached, a + 1)
        with pytest.raises(RuntimeError, match="64-bit types turned off"):
            (t * 3 - 7).cpu()  # a program traced now
    torch.testing.assert_close((t * 3 - 7).cpu(), a * 3 - 7)  # and after the block, as before


# ---------------------------------------------------------------- int64 and float64 match the CPU
@pytest.mark.parametrize("op", ["floor_divide", "remainder", "fmod", "trunc", "floor", "mul_add"])
def test_int64_ops_match_cpu(op):
    n = _fresh()
    a = torch.randint(-(2**62), 2**62, (n, n))
    b = torch.randint(1, 2**31, (n, n)) * torch.where(torch.rand(n, n) < 0.5, -1, 1)
    fns = {
        "floor_divide": torch.floor_divide,
        "remainder": torch.remainder,
        "fmod": torch.fmod,
        "trunc": lambda x, y: torch.div(x, y, rounding_mode="trunc"),
        "floor": lambda x, y: torch.div(x, y, rounding_mode="floor"),
        "mul_add": lambda x, y: x * 3 + y * (2**33),
    }
    expected = fns[op](a, b)
    actual = fns[op](a.to(D), b.to(D)).cpu()
    assert actual.dtype == torch.int64
    torch.testing.assert_close(actual, expected)


def test_float64_keeps_double_precision_and_float32_stays_float32():
    x = torch.rand(_fresh(), dtype=torch.float64) * 1e-12
    torch.testing.assert_close((x.to(D) + 1.0).cpu() - 1.0, (x + 1.0) - 1.0, rtol=0, atol=0)
    y = torch.randn(_fresh())
    out = (y.to(D) * 0.1 + 2.5).cpu()
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, y * 0.1 + 2.5)


# ---------------------------------------------------------------- what XLA:TPU cannot compile: errors
_REFUSED = {
    "int64 conv": (
        lambda a: convolution.convolution(a, a[:2, :, :2, :2], None, [1], [0], [1], False, [0], 1),
        np.int64,
        (2, 3, 5, 5),
        r'"convolution_tpu" not implemented for \'Long\'',
    ),
    "complex128 fft of a long prime length": (
        lambda a: fft.fft_c2c(a.astype(jnp.complex128), [0], 0, True),
        np.float64,
        (4099,),
        "FFT of prime length 4099 is not supported on a TPU",
    ),
}


@pytest.mark.parametrize("case", sorted(_REFUSED))
def test_tpu_only_errors_raise_only_when_tracing_for_a_tpu(case):
    fn, dtype, shape, message = _REFUSED[case]
    x = (np.arange(np.prod(shape)) % 7).reshape(shape).astype(dtype)
    with platform.tracing_for("tpu"), pytest.raises(RuntimeError, match=message) as raised:
        jax.jit(lambda a: fn(a))(x)  # (a new lambda: a fresh trace, not the host's cached one)
    assert "TPU" in str(raised.value)
    jax.block_until_ready(jax.jit(lambda a: fn(a))(x))  # the host platform computes it


def test_int64_conv_on_the_host_matches_cpu():
    """XLA:CPU computes it as the CPU does; under TORCHTPU_TPU_COMPILE_CHECK the TPU trace refuses it."""
    from torchtpu.eager import tpu_check

    a = torch.randint(-1000, 1000, (2, 3, _fresh(6, 12), 6))
    w = torch.randint(-1000, 1000, (4, 3, 2, 2))
    expected = torch.nn.functional.conv2d(a, w)
    if tpu_check.enabled():
        with pytest.raises(RuntimeError, match=r'"convolution_tpu" not implemented for \'Long\''):
            torch.nn.functional.conv2d(a.to(D), w.to(D)).cpu()
    else:
        torch.testing.assert_close(torch.nn.functional.conv2d(a.to(D), w.to(D)).cpu(), expected)


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_tpu_branch_of_64_bit_integer_matmul_is_exact_and_wraps(dtype):
    """XLA:TPU has no 64-bit integer dot: on a TPU the product is int32 dots of 8-bit limbs
    (linalg._wide_integer_matmul). Run here on the host and compared over the whole range, where the
    products wrap modulo 2**64 as PyTorch's do; batched, matrix-vector, vector-vector, empty and
    chunked (a contraction longer than one int32-exact chunk) shapes."""
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    info = np.iinfo(dtype)
    k = _fresh(2, 9)
    a = rng.integers(info.min, info.max, (2, 3, k), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, (2, k, 4), dtype=dtype, endpoint=True)
    v = rng.integers(info.min, info.max, (k,), dtype=dtype, endpoint=True)
    torch.tpu.is_available()  # (the 64-bit types on)
    cases = [(a, b), (a[0], v), (v, v), (a[:, :, :0], b[:, :0])]
    if dtype == np.int64:  # a contraction of two int32-exact chunks (the same code for uint64)
        w = rng.integers(info.min, info.max, (linalg._LIMB_K + 5,), dtype=dtype, endpoint=True)
        cases.append((w, w))
    for x, y in cases:
        with platform.tracing_for("tpu"):
            got = jax.jit(lambda p, q: linalg.matmul(p, q))(x, y)
        want = jax.jit(lambda p, q: jnp.matmul(p, q))(x, y)
        assert got.dtype == want.dtype == dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# ---------------------------------------------------------------- the TPU branches compute the right values
def test_tpu_int64_division_is_exact():
    """The TPU branch of int64 division (int32 when every operand fits, else a long division), run on
    the host: exact against the CPU for values that fit 32 bits and for the whole int64 range."""
    g = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    n = 512
    wide = (
        np.concatenate([g.integers(-(2**63), 2**63 - 1, n, dtype=np.int64), [-(2**63), 2**63 - 1, -7, 7]]),
        np.concatenate([g.integers(-(2**40), 2**40, n // 2), g.integers(-60, 60, n // 2), [3, -2, 2**63 - 1, -3]]),
    )
    narrow = (g.integers(-(2**31) + 1, 2**31 - 1, n + 4, dtype=np.int64), g.integers(-5000, 5000, n + 4))
    for a, b in (wide, narrow):
        b = np.where(b == 0, 9, b).astype(np.int64)

        def program(x, y):
            return (
                elementwise.floor_divide(x, y),
                elementwise.remainder(x, y),
                elementwise.fmod(x, y),
                elementwise._int_trunc_div(x, y),
            )

        with platform.tracing_for("tpu"):
            got = jax.jit(lambda x, y: program(x, y))(a, b)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        expected = (
            torch.floor_divide(ta, tb),
            torch.remainder(ta, tb),
            torch.fmod(ta, tb),
            torch.div(ta, tb, rounding_mode="trunc"),
        )
        for value, reference in zip(got, expected):
            torch.testing.assert_close(torch.from_numpy(np.asarray(value)), reference, rtol=0, atol=0)


@pytest.mark.parametrize(
    "shape, full, dtype",
    [
        ((3, 6, 4), False, torch.float32),
        ((2, 4, 7), True, torch.float32),
        ((5, 5), False, torch.float32),
        ((2, 5, 3), False, torch.complex64),
    ],
)
def test_tpu_svd_matches_cpu(shape, full, dtype):
    """The TPU branch of the SVD (JAX's QDWH algorithm traced with x64 off locally), run on the host."""
    a = torch.randn(shape, dtype=dtype)
    with platform.tracing_for("tpu"):
        u, s, vh = (
            torch.from_numpy(np.array(v))
            for v in jax.jit(lambda x: linalg_decompositions.linalg_svd(x, full_matrices=full))(a.numpy())
        )
    assert u.dtype == vh.dtype == dtype and s.dtype == torch.float32
    torch.testing.assert_close(s, torch.linalg.svdvals(a), rtol=1e-4, atol=1e-4)
    k = s.shape[-1]
    torch.testing.assert_close((u[..., :k] * s[..., None, :].to(dtype)) @ vh[..., :k, :], a, rtol=1e-4, atol=1e-4)
    eye = torch.eye(u.shape[-1], dtype=dtype).expand(*u.shape[:-2], u.shape[-1], u.shape[-1])
    torch.testing.assert_close(u.mH @ u, eye, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- XLA:TPU compiles them (libtpu, no chip)
@pytest.fixture
def tpu_compile_check(monkeypatch):
    pytest.importorskip("libtpu", reason="compiling for a TPU needs libtpu (pip install torchtpu[tpu-check])")
    from torchtpu.eager import tpu_check

    monkeypatch.setenv("TORCHTPU_TPU_COMPILE_CHECK", "v5e:2x2")
    tpu_check.reset_for_test()
    yield tpu_check
    tpu_check.reset_for_test()


def _checked(check, prefix):
    programs = [p for p in check.report().programs if p.name.startswith(prefix)]
    assert programs, [p.name for p in check.report().programs]
    assert all(p.ok for p in programs), [p.error for p in programs if not p.ok]
    return programs


def test_svd_compiles_for_tpu(tpu_compile_check):
    a = torch.randn(3, _fresh(5, 12), 4)
    s = torch.linalg.svd(a.to(D), full_matrices=False)[1]
    torch.testing.assert_close(s.cpu(), torch.linalg.svdvals(a), rtol=1e-4, atol=1e-4)
    _checked(tpu_compile_check, "aten::_linalg_svd")


def test_svd_lstsq_backward_compile_for_tpu(tpu_compile_check):
    m = _fresh(5, 12)
    a, b = torch.randn(2, m, 4), torch.randn(2, m, 3)
    torch.linalg.svd(a.to(D), full_matrices=True)[0].cpu()
    for fn in (
        torch.linalg.svdvals,
        lambda x: torch.linalg.matrix_norm(x, ord=2),
        lambda x: torch.linalg.lstsq(x, b.to(x.device)).solution,
        lambda x: torch.linalg.lstsq(x, b.to(x.device), driver="gelsy").solution,
    ):
        x, ref = a.to(D).requires_grad_(), a.clone().requires_grad_()
        fn(x).sum().backward()
        fn(ref).sum().backward()
        torch.testing.assert_close(x.grad.cpu(), ref.grad, rtol=1e-3, atol=1e-3)
    report = tpu_compile_check.report()
    assert report.failed == 0, report.failures
    _checked(tpu_compile_check, "aten::_linalg_svd")
    _checked(tpu_compile_check, "aten::linalg_lstsq")


def test_int64_index_arithmetic_compiles_for_tpu_in_seconds(tpu_compile_check):
    n = _fresh(100, 400)
    i = torch.randint(-(10**6), 10**6, (n,))
    j = torch.randint(1, 1000, (n,))
    ti, tj = i.to(D), j.to(D)
    out = (
        torch.floor_divide(ti, tj) * 7
        + torch.remainder(ti, tj)
        + torch.fmod(ti, 16)
        + torch.div(ti, tj, rounding_mode="trunc")
    ).cpu()
    torch.testing.assert_close(
        out,
        torch.floor_divide(i, j) * 7
        + torch.remainder(i, j)
        + torch.fmod(i, 16)
        + torch.div(i, j, rounding_mode="trunc"),
    )
    for prefix in ("aten::floor_divide", "aten::remainder", "aten::fmod", "aten::div"):
        for program in _checked(tpu_compile_check, prefix):
            # XLA:TPU's own int64 division: 6-7 s for one op, 15-36 s for a few together
            assert program.compile_seconds < 5, (program.name, program.compile_seconds)


def test_int64_matmul_compiles_for_the_tpu(tpu_compile_check):
    a = torch.randint(-(2**62), 2**62, (_fresh(), 3))
    b = torch.randint(-(2**62), 2**62, (3, 2))
    torch.testing.assert_close((a.to(D) @ b.to(D)).cpu(), a @ b, rtol=0, atol=0)
    c = torch.randint(-(2**62), 2**62, (a.shape[0], 2))
    got = torch.addmm(c.to(D), a.to(D), b.to(D), beta=3, alpha=-2).cpu()
    torch.testing.assert_close(got, torch.addmm(c, a, b, beta=3, alpha=-2), rtol=0, atol=0)
    for prefix in ("aten::mm", "aten::addmm"):
        for program in _checked(tpu_compile_check, prefix):
            assert program.compile_seconds < 20, (program.name, program.compile_seconds)
