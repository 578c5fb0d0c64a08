"""torch.fft.*, torch.stft and torch.istft on the tpu device vs the CPU.

Everything decomposes into three primitives (_fft_c2c, _fft_r2c, _fft_c2r, ops/fft.py); these
tests go through the public API with padding and truncation (n=, s=), every norm, several dims,
even and odd lengths, plus the primitives themselves on input that is not Hermitian (whose
imaginary DC/Nyquist parts the CPU's c2r ignores), gradients, torch.compile and dtype errors.
"""

import functools

import pytest
import torch
from conftest import assert_matches_cpu

import torchtpu.compile  # noqa: F401  (registers the backend where the entry point is not installed)

TPU = "tpu"
FFT = torch.fft
REAL = [torch.float32, torch.float64]
COMPLEX = [torch.complex64, torch.complex128]
NORMS = [None, "backward", "ortho", "forward"]


def _tol(dtype):
    single = dtype in (torch.float32, torch.complex64)
    return dict(rtol=1e-4, atol=1e-4) if single else dict(rtol=1e-9, atol=1e-9)


def _check(fn, *inputs, **kwargs):
    """fn(*inputs, **kwargs) on the CPU and on the tpu device: same dtype, shape and values."""
    return assert_matches_cpu(functools.partial(fn, **kwargs), *inputs, tol_for=_tol)


@pytest.mark.parametrize("dtype", REAL + COMPLEX, ids=str)
@pytest.mark.parametrize("n", [None, 12, 5], ids=["n=None", "pad", "trunc"])
def test_fft_ifft_n(dtype, n):
    x = torch.randn(3, 8, dtype=dtype)
    _check(FFT.fft, x, n=n)
    _check(FFT.ifft, x, n=n)


@pytest.mark.parametrize("norm", NORMS)
def test_norms(norm):
    real, spectrum = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.complex128)
    for fn in (FFT.fft, FFT.ifft, FFT.rfft, FFT.ihfft, FFT.fft2):
        _check(fn, real, norm=norm)
    for fn in (FFT.irfft, FFT.hfft, FFT.irfftn, FFT.ifftn):
        _check(fn, spectrum, norm=norm)


@pytest.mark.parametrize("dim", [0, 1, -1, -3])
def test_fft_dim(dim):
    x = torch.randn(2, 3, 5, dtype=torch.complex64)
    _check(FFT.fft, x, dim=dim)
    _check(FFT.ifft, x, n=4, dim=dim, norm="ortho")


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex128], ids=str)
@pytest.mark.parametrize(
    "fn,kwargs",
    [
        (FFT.fft2, {}),
        (FFT.fft2, dict(s=(3, 7))),
        (FFT.ifft2, dict(dim=(0, 2), norm="forward")),
        (FFT.fftn, {}),
        (FFT.fftn, dict(s=(6, 2), dim=(2, 0))),
        (FFT.fftn, dict(dim=(1,), norm="ortho")),
        (FFT.ifftn, dict(s=(5, 3, 4))),
        (FFT.ifftn, dict(dim=(-1, -2), norm="backward")),
    ],
    ids=["fft2", "fft2-s", "ifft2-dim", "fftn", "fftn-s-dim", "fftn-1d", "ifftn-s", "ifftn-dim"],
)
def test_nd(fn, kwargs, dtype):
    x = torch.randn(4, 3, 5, dtype=dtype)
    _check(fn, x, **kwargs)


@pytest.mark.parametrize("dtype", REAL, ids=str)
@pytest.mark.parametrize("length", [8, 9])
@pytest.mark.parametrize("n", [None, 6, 13], ids=["n=None", "n6", "n13"])
def test_rfft_irfft(dtype, length, n):
    x = torch.randn(2, length, dtype=dtype)
    spectrum = _check(FFT.rfft, x, n=n)
    _check(FFT.irfft, spectrum.cpu(), n=n)
    # round trip on the device
    back = FFT.irfft(FFT.rfft(x.to(TPU)), n=length)
    torch.testing.assert_close(back.cpu(), x, **_tol(dtype))


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("n", [None, 7, 10], ids=["n=None", "odd", "even"])
def test_irfft_not_hermitian(dtype, n):
    # random spectra: the imaginary parts of the DC and Nyquist bins must be ignored as on the CPU
    x = torch.randn(3, 6, dtype=dtype)
    _check(FFT.irfft, x, n=n)
    _check(FFT.hfft, x, n=n)


@pytest.mark.parametrize("dtype", REAL, ids=str)
@pytest.mark.parametrize(
    "kwargs",
    [{}, dict(s=(4, 7)), dict(dim=(0, 2), norm="ortho"), dict(s=(3,), dim=(1,))],
    ids=["default", "s", "dim", "1d"],
)
def test_rfftn_irfftn(dtype, kwargs):
    x = torch.randn(4, 3, 6, dtype=dtype)
    spectrum = _check(FFT.rfftn, x, **kwargs)
    _check(FFT.irfftn, spectrum.cpu(), **kwargs)


@pytest.mark.parametrize("dtype", REAL, ids=str)
def test_rfft2_irfft2(dtype):
    x = torch.randn(2, 5, 6, dtype=dtype)
    spectrum = _check(FFT.rfft2, x, s=(4, 9))
    _check(FFT.irfft2, spectrum.cpu(), s=(4, 9))
    _check(FFT.irfft2, torch.randn(3, 4, dtype=spectrum.dtype), s=(5, 6))  # not Hermitian


@pytest.mark.parametrize("dtype", REAL, ids=str)
def test_hfft_ihfft(dtype):
    x = torch.randn(3, 7, dtype=dtype)
    half = _check(FFT.ihfft, x)
    _check(FFT.hfft, half.cpu(), n=7)
    _check(FFT.hfft2, torch.randn(4, 5, dtype=half.dtype), s=(4, 8))
    _check(FFT.hfftn, torch.randn(2, 3, 4, dtype=half.dtype), s=(3, 6), norm="ortho")
    _check(FFT.ihfft2, x.reshape(7, 3))  # ihfft2/ihfftn end in conj_physical
    _check(FFT.ihfftn, torch.randn(2, 3, 4, dtype=dtype), dim=(0, 2))


def test_integer_and_view_inputs():
    # integers promote to the default float type; views (transposed, sliced) are read as laid out
    _check(FFT.fft, torch.randint(-5, 5, (4, 6)))
    _check(FFT.rfft, torch.randint(-5, 5, (4, 6)))
    x = torch.randn(6, 8)
    _check(lambda a: FFT.rfft(a.t()[1:, ::2], dim=0), x)
    _check(lambda a: FFT.fft2(a.t()), torch.randn(6, 5, dtype=torch.complex64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.complex128], ids=str)
@pytest.mark.parametrize("norm", [0, 1, 2])
def test_primitives(dtype, norm):
    aten = torch.ops.aten
    x = torch.randn(3, 4, 6, dtype=dtype)
    if dtype.is_complex:
        _check(lambda a: aten._fft_c2c(a, [0, 2], norm, True), x)
        _check(lambda a: aten._fft_c2c(a, [1], norm, False), x)
        _check(lambda a: aten._fft_c2c(a, [], norm, True), x)
        for last in (10, 11):  # the input is not Hermitian along any dim
            _check(lambda a: aten._fft_c2r(a, [1, 0, 2], norm, last), x)
        _check(lambda a: aten._fft_c2r(a, [2], norm, 6), x)  # a full-length input
    else:
        for onesided in (True, False):
            _check(lambda a: aten._fft_r2c(a, [2, 0], norm, onesided), x)
            _check(lambda a: aten._fft_r2c(a, [1], norm, onesided), x)


@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("onesided", [True, False])
def test_stft_istft(center, onesided):
    window = torch.hann_window(8, dtype=torch.float64)
    signal = torch.randn(2, 50, dtype=torch.float64)
    kw = dict(n_fft=8, hop_length=2, window=window, center=center, onesided=onesided)
    spec = torch.stft(signal, return_complex=True, **kw)
    spec_tpu = torch.stft(signal.to(TPU), return_complex=True, **{**kw, "window": window.to(TPU)})
    torch.testing.assert_close(spec_tpu.cpu(), spec, **_tol(spec.dtype))
    if center:
        back = torch.istft(spec_tpu, length=50, **{**kw, "window": window.to(TPU)})
        torch.testing.assert_close(back.cpu(), torch.istft(spec, length=50, **kw), **_tol(back.dtype))
        torch.testing.assert_close(back.cpu(), signal, **_tol(back.dtype))
    else:
        # hann's zero first sample fails istft's overlap-add check on both devices
        with pytest.raises(RuntimeError, match="window overlap add min"):
            torch.istft(spec, **kw)
        with pytest.raises(RuntimeError, match="window overlap add min"):
            torch.istft(spec_tpu, **{**kw, "window": window.to(TPU)})


def test_stft_normalized_float32():
    signal, window = torch.randn(40), torch.hann_window(10, periodic=False)
    kw = dict(n_fft=16, hop_length=4, win_length=10, normalized=True, return_complex=True)
    expected = torch.stft(signal, window=window, **kw)
    actual = torch.stft(signal.to(TPU), window=window.to(TPU), **kw)
    torch.testing.assert_close(actual.cpu(), expected, **_tol(expected.dtype))
    back = torch.istft(actual, 16, 4, 10, window.to(TPU), normalized=True, length=40)
    torch.testing.assert_close(
        back.cpu(), torch.istft(expected, 16, 4, 10, window, normalized=True, length=40), **_tol(back.dtype)
    )


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: FFT.rfft(x).abs().sum(),
        lambda x: FFT.irfft(FFT.fft(x.to(torch.complex128)) * 1j, n=9).pow(2).sum(),
        lambda x: FFT.fftn(x, norm="ortho").real.sum() + FFT.ihfft(x).imag.pow(2).sum(),
    ],
    ids=["rfft", "fft-irfft", "fftn-ihfft"],
)
def test_backward(fn):
    x = torch.randn(3, 10, dtype=torch.float64, requires_grad=True)
    xt = x.detach().to(TPU).requires_grad_()
    fn(x).backward()
    fn(xt).backward()
    torch.testing.assert_close(xt.grad.cpu(), x.grad, **_tol(x.dtype))


def test_compile():
    x = torch.randn(4, 16)
    f = torch.compile(lambda a: FFT.rfft(a).abs(), backend="tpu", fullgraph=True)
    torch.testing.assert_close(f(x.to(TPU)).cpu(), FFT.rfft(x).abs(), **_tol(x.dtype))
    g = torch.compile(lambda a: (FFT.fft2(a, norm="ortho"), FFT.irfft(FFT.fft(a), n=15)), backend="tpu", fullgraph=True)
    actual = g(x.to(TPU))
    expected = (FFT.fft2(x, norm="ortho"), FFT.irfft(FFT.fft(x), n=15))
    assert actual[0].dtype == torch.complex64
    torch.testing.assert_close([a.cpu() for a in actual], list(expected), **_tol(x.dtype))


def test_compiled_stft_stays_in_the_graph():
    # stft frames the signal with unfold: a compiled graph lowers it (no fallback to eager)
    import warnings

    x, w = torch.randn(2, 400), torch.hann_window(64)
    f = lambda a, win: torch.stft(a, 64, hop_length=16, window=win, return_complex=True).abs()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        actual = torch.compile(f, backend="tpu", fullgraph=True)(x.to(TPU), w.to(TPU))
    torch.testing.assert_close(actual.cpu(), f(x, w), **_tol(x.dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fn", [FFT.fft, FFT.rfft, FFT.irfft, FFT.fftn], ids=lambda f: f.__name__)
def test_low_precision_raises_like_cpu(fn, dtype):
    x = torch.randn(8).to(dtype)
    with pytest.raises(RuntimeError) as on_cpu:
        fn(x)
    with pytest.raises(RuntimeError) as on_tpu:
        fn(x.to(TPU))
    assert str(on_tpu.value) == str(on_cpu.value)


def test_low_precision_primitive_raises():
    # PyTorch's meta kernel lets a Half/BFloat16 _fft_r2c through; the CPU kernel refuses it
    x = torch.randn(8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="BFloat16"):
        torch.ops.aten._fft_r2c(x, [0], 0, True)
    with pytest.raises(RuntimeError, match="BFloat16"):
        torch.ops.aten._fft_r2c(x.to(TPU), [0], 0, True)
