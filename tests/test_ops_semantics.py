"""Op semantics the OpInfo sweep found wrong once: each compared with the CPU on fresh inputs."""

import pytest
import torch
from conftest import assert_matches_cpu

DEV = "tpu"


def same(fn, *args, tol=None):
    return assert_matches_cpu(fn, *args, equal_nan=True, **(tol or {}))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_integer_pow_wraps_and_negative_exponents(dtype):
    signed = dtype != torch.uint8
    low = -3 if signed else 0
    exps = torch.randint(-4 if signed else 0, 80, (200,)).to(dtype)
    bases = torch.randint(low, 6, (200,)).to(dtype)
    same(torch.pow, bases, exps)
    same(lambda e: 3**e, exps)
    same(lambda b: b**70, bases)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_trunc_division_rounds_the_half_quotient_first(dtype):
    a, b = (torch.randn(5000) * 10).to(dtype), torch.randn(5000).to(dtype)
    same(lambda x, y: torch.div(x, y, rounding_mode="trunc"), a, b)


def test_bool_scatter_add_is_a_logical_or():
    x = torch.rand(6, 5) > 0.7
    src = torch.rand(6, 5) > 0.5
    index = torch.randint(0, 6, (6, 5))
    same(lambda x, i, s: torch.scatter_add(x, 0, i, s), x, index, src)
    same(lambda x, i, s: torch.scatter_reduce(x, 0, i, s, "sum"), x, index, src)
    same(lambda x, i, s: torch.scatter_reduce(x, 0, i, s, "prod"), x, index, src)
    same(lambda x, i, s: x.index_add(0, i[:, 0], s), x, index, src)
    same(lambda x, i, s: x.index_put((i[:, 0],), s[:, 0], accumulate=True), x[:, 0], index, src)
    same(torch.sgn, x)


@pytest.mark.parametrize("mode", ["replicate", "reflect"])
def test_pad_with_negative_widths_crops(mode):
    x = torch.randn(2, 3, 7, 6, requires_grad=True)
    pad = (-1, 3, 2, -2)
    out = same(lambda t: torch.nn.functional.pad(t, pad, mode=mode), x)
    g = torch.randn(out.shape)
    (expected,) = torch.autograd.grad(torch.nn.functional.pad(x, pad, mode=mode), x, g)
    xt = x.detach().to(DEV).requires_grad_()
    (actual,) = torch.autograd.grad(torch.nn.functional.pad(xt, pad, mode=mode), xt, g.to(DEV))
    torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("value", [0.0, 2.5])
def test_nonzero_of_a_zero_dim_tensor(value):
    same(torch.nonzero, torch.tensor(value))
    same(torch.argwhere, torch.tensor(value))


def test_non_blocking_copy_to_cpu():
    x = torch.randn(4, 5, device=DEV)
    y = x.to("cpu", non_blocking=True)
    assert y.device.type == "cpu"
    torch.testing.assert_close(y, x.cpu())
    torch.testing.assert_close(x.to("cpu", torch.float64, non_blocking=True), x.cpu().double())


_P_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")]
# cdist and pdist share the p-norm and its gradient (one branch per kind of p): the default run checks
# cdist for every p and pdist (its own pair indexing and scatter-add) for three; `-m slow` runs pdist
# for the others (test_pdist_gradients_other_p).
_PDIST_DEFAULT = (1.0, 2.0, 3.0)


def _check_dist_gradients(p, cdist=True, pdist=True):
    x1, x2 = torch.randn(2, 5, 4), torch.randn(2, 6, 4)
    x2[0, 0] = x1[0, 0]  # a zero distance: the gradient there is 0, not NaN
    rows = torch.randn(7, 4)
    rows[3] = rows[1]
    cases = (
        (lambda a, b: torch.cdist(a, b, p), (x1, x2)) if cdist else None,
        (lambda a: torch.pdist(a, p), (rows,)) if pdist else None,
    )
    for fn, inputs in filter(None, cases):
        cpu = [t.clone().requires_grad_() for t in inputs]
        dev = [t.to(DEV).requires_grad_() for t in inputs]
        out = fn(*cpu)
        g = torch.randn(out.shape)
        expected = torch.autograd.grad(out, cpu, g)
        actual_out = fn(*dev)
        actual = torch.autograd.grad(actual_out, dev, g.to(DEV))
        torch.testing.assert_close(actual_out.detach().cpu(), out.detach())
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a.cpu(), e)


@pytest.mark.parametrize("p", _P_VALUES)
def test_cdist_and_pdist_gradients(p):
    _check_dist_gradients(p, pdist=p in _PDIST_DEFAULT)


def test_cdist_gradient_with_nothing_to_compute():
    # an empty broadcast batch, or no points on one side: zeros of each input's own shape
    for sa, sb in [
        ((0, 4, 5), (3, 5)),
        ((4, 5), (2, 0, 5)),
        ((1, 4, 5), (0, 3, 5)),
        ((2, 4, 0), (2, 3, 0)),
        ((4, 5), (2, 3, 5)),
    ]:
        a, b = torch.randn(sa, requires_grad=True), torch.randn(sb, requires_grad=True)
        ad, bd = (t.detach().to(DEV).requires_grad_() for t in (a, b))
        out = torch.cdist(a, b)
        g = torch.randn(out.shape)
        out.backward(g)
        torch.cdist(ad, bd).backward(g.to(DEV))
        torch.testing.assert_close(ad.grad.cpu(), a.grad)
        torch.testing.assert_close(bd.grad.cpu(), b.grad)


@pytest.mark.slow
@pytest.mark.parametrize("p", [p for p in _P_VALUES if p not in _PDIST_DEFAULT])
def test_pdist_gradients_other_p(p):
    _check_dist_gradients(p, cdist=False)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_margin_losses_and_gradients(reduction):
    x = torch.randn(4, 6)
    target = torch.randint(0, 6, (4,))
    weight = torch.rand(6)
    multilabel = torch.tensor([[1, 4, -1, 0, 0, 0], [0, 1, 2, 3, 4, 5], [5, -1, 2, 2, 2, 2], [-1, 0, 0, 0, 0, 0]])
    F = torch.nn.functional
    cases = [
        lambda t: F.multi_margin_loss(t, target.to(t.device), reduction=reduction),
        lambda t: F.multi_margin_loss(
            t, target.to(t.device), p=2, margin=0.5, weight=weight.to(t.device), reduction=reduction
        ),
        lambda t: F.multilabel_margin_loss(t, multilabel.to(t.device), reduction=reduction),
    ]
    for fn in cases:
        xc, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
        out = fn(xc)
        g = torch.randn(out.shape)
        (expected,) = torch.autograd.grad(out, xc, g)
        out_d = fn(xd)
        (actual,) = torch.autograd.grad(out_d, xd, g.to(DEV))
        torch.testing.assert_close(out_d.detach().cpu(), out.detach())
        torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_histogram(dtype):
    x = torch.randn(500, dtype=dtype)
    weight = torch.rand(500, dtype=dtype)
    for kwargs in (dict(bins=13), dict(bins=5, range=(-1.0, 0.5)), dict(bins=7, weight=weight, density=True)):
        expected = torch.histogram(x, **kwargs)
        actual = torch.histogram(
            x.to(DEV), **{k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        )
        torch.testing.assert_close(actual.hist.cpu(), expected.hist)
        torch.testing.assert_close(actual.bin_edges.cpu(), expected.bin_edges)
    edges = torch.tensor([-2.0, -0.5, 0.0, 0.1, 3.0], dtype=dtype)
    expected = torch.histogram(x, edges)
    actual = torch.histogram(x.to(DEV), edges.to(DEV))
    torch.testing.assert_close(actual.hist.cpu(), expected.hist)


def test_bincount_and_data_dependent_out_forms():
    x = torch.randint(0, 9, (40,))
    w = torch.rand(40)
    same(torch.bincount, x)
    same(lambda t: torch.bincount(t, minlength=20), x)
    same(torch.bincount, x, w)
    same(torch.bincount, x, w.double())
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(torch.tensor([1, -1], device=DEV))
    m = torch.rand(5, 4) > 0.5
    out = torch.empty(0, dtype=torch.long, device=DEV)
    torch.nonzero(m.to(DEV), out=out)
    torch.testing.assert_close(out.cpu(), torch.nonzero(m))
    vals = torch.randn(5, 4)
    out = torch.empty(0, device=DEV)
    torch.masked_select(vals.to(DEV), m.to(DEV), out=out)
    torch.testing.assert_close(out.cpu(), torch.masked_select(vals, m))
    same(lambda t: torch.nonzero_static(t, size=12, fill_value=-3), m)


def test_arange_matches_cpu_and_traces_its_start():
    import torchtpu

    for args in [(3, 8), (3.0, 8, 0.5), (0, 10, 3), (10, 0, -3), (0.5, 3), (0, 0), (5,), (2.7, 9.1, 1.3)]:
        for dtype in [None, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.uint8]:
            expected = torch.arange(*args, dtype=dtype)
            torch.testing.assert_close(torch.arange(*args, dtype=dtype, device=DEV).cpu(), expected)
    for bad, msg in [((0, 5, 0), "nonzero"), ((0, 5, -1), "inconsistent"), ((0, float("inf")), "unsupported range")]:
        with pytest.raises(RuntimeError, match=msg):
            torch.arange(*bad, device=DEV)
    torch.arange(1, 6, device=DEV)
    before = torchtpu.metrics()["eager_compiles"]
    for pos in range(40, 60):  # a decoding loop's positions: one executable for all of them
        torch.testing.assert_close(torch.arange(pos, pos + 5, device=DEV).cpu(), torch.arange(pos, pos + 5))
    assert torchtpu.metrics()["eager_compiles"] == before


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.5])
def test_segment_reduce_with_gradients(reduce, initial):
    data = torch.randn(3, 9, 2)
    lengths = torch.tensor([[2, 0, 4, 3], [9, 0, 0, 0], [1, 1, 1, 6]])
    for kwargs in (
        dict(lengths=lengths),
        dict(offsets=torch.cat([torch.zeros(3, 1, dtype=torch.long), lengths.cumsum(1)], 1)),
    ):
        x = data.clone().requires_grad_()
        out = torch.segment_reduce(x, reduce, axis=1, initial=initial, **kwargs)
        g = torch.randn(out.shape)
        (expected,) = torch.autograd.grad(out, x, g)
        xd = data.to(DEV).requires_grad_()
        out_d = torch.segment_reduce(xd, reduce, axis=1, initial=initial, **{k: v.to(DEV) for k, v in kwargs.items()})
        torch.testing.assert_close(out_d.detach().cpu(), out.detach(), equal_nan=True)
        if "lengths" in kwargs:  # PyTorch's CPU backward takes lengths; offsets have no grad formula here
            (actual,) = torch.autograd.grad(out_d, xd, g.to(DEV))
            torch.testing.assert_close(actual.cpu(), expected, equal_nan=True)


def _grid_sample_params():
    # Default run: every mode in float32 (values and gradients) and one low-precision case per
    # rounding path, each over the three (padding, alignment) pairs _grid_default_pairs picks for its
    # mode; `-m slow` runs the full dtype x mode grid over all six pairs ("-all").
    fast = {(torch.float32, m, d) for m, d in _GRID_MODES} | {
        (torch.bfloat16, "bilinear", 2),
        (torch.float16, "nearest", 3),
    }
    params = []
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for m, d in _GRID_MODES:
            name = f"{str(dt)[6:]}-{m}-{d}d"
            if (dt, m, d) in fast:
                params.append(pytest.param(dt, m, d, False, id=name))
            params.append(pytest.param(dt, m, d, True, id=f"{name}-all", marks=pytest.mark.slow))
    return params


_GRID_MODES = [("bilinear", 2), ("nearest", 2), ("bicubic", 2), ("bilinear", 3), ("nearest", 3)]
_GRID_PAIRS = [(p, a) for p in ("zeros", "border", "reflection") for a in (True, False)]


def _grid_default_pairs(mode, dims):
    """Every (padding, alignment) pair compiles its own forward and backward executables. The default
    run takes three per mode: every padding, the alignments alternating, so that over the five modes
    every padding meets both alignments; gradients are checked (float32) on the same three pairs.
    The other pairs run under `-m slow` (values in the "-all" parameters, gradients in
    test_grid_sample_gradients_every_padding_and_alignment)."""
    shift = _GRID_MODES.index((mode, dims))
    return {(p, (i + shift) % 2 == 0) for i, p in enumerate(("zeros", "border", "reflection"))}


def _grid_sample_inputs(dtype, dims):
    x = torch.randn((2, 3, 5, 7, 6) if dims == 3 else (2, 3, 5, 9)).to(dtype)
    grid = (torch.rand((2, 4, 3, 5, 3) if dims == 3 else (2, 4, 3, 2)) * 2.6 - 1.3).to(dtype)  # some outside
    return x, grid


def _check_grid_sample_gradients(x, grid, **kwargs):
    F = torch.nn.functional
    xc, gc = x.clone().requires_grad_(), grid.clone().requires_grad_()
    out = F.grid_sample(xc, gc, **kwargs)
    cot = torch.randn(out.shape)
    expected = torch.autograd.grad(out, (xc, gc), cot)
    xd, gd = x.to(DEV).requires_grad_(), grid.to(DEV).requires_grad_()
    actual = torch.autograd.grad(F.grid_sample(xd, gd, **kwargs), (xd, gd), cot.to(DEV))
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.cpu(), e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,mode,dims,every_pair", _grid_sample_params())
def test_grid_sample_matches_cpu_rounding_and_gradients(dtype, mode, dims, every_pair):
    F = torch.nn.functional
    x, grid = _grid_sample_inputs(dtype, dims)
    default = _grid_default_pairs(mode, dims)
    for padding, align in _GRID_PAIRS:
        if not every_pair and (padding, align) not in default:
            continue
        kwargs = dict(mode=mode, padding_mode=padding, align_corners=align)
        # float16 may differ by an ulp in a rare element (the OpInfo tolerance for float16)
        tol = dict(atol=1e-3, rtol=1e-2) if dtype == torch.float16 else None
        same(lambda a, g: F.grid_sample(a, g, **kwargs), x, grid, tol=tol)
        if dtype == torch.float32 and (padding, align) in default:
            _check_grid_sample_gradients(x, grid, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("mode,dims", _GRID_MODES)
def test_grid_sample_gradients_every_padding_and_alignment(mode, dims):
    x, grid = _grid_sample_inputs(torch.float32, dims)
    for padding, align in _GRID_PAIRS:
        if (padding, align) not in _grid_default_pairs(mode, dims):
            _check_grid_sample_gradients(x, grid, mode=mode, padding_mode=padding, align_corners=align)


# Default run: a pairwise cover of mode x size x alignment (each size with both modes and both
# alignments, each mode with both alignments), six of the twelve; `-m slow` runs the other six.
_ANTIALIAS_DEFAULT = {
    ("bilinear", 0, False),
    ("bicubic", 0, True),
    ("bilinear", 1, True),
    ("bicubic", 1, False),
    ("bilinear", 2, False),
    ("bicubic", 2, True),
}


def _antialias_params():
    return [
        pytest.param(
            align,
            size,
            mode,
            id=f"{align}-size{i}-{mode}",
            marks=() if (mode, i, align) in _ANTIALIAS_DEFAULT else pytest.mark.slow,
        )
        for align in (False, True)
        for i, size in enumerate([(3, 4), (20, 30), (9, 13)])
        for mode in ("bilinear", "bicubic")
    ]


@pytest.mark.parametrize("align_corners,size,mode", _antialias_params())
def test_antialiased_interpolation_and_gradient(mode, size, align_corners):
    F = torch.nn.functional
    kwargs = dict(size=size, mode=mode, antialias=True, align_corners=align_corners)
    x = torch.randn(2, 3, 9, 13, requires_grad=True)
    out = F.interpolate(x, **kwargs)
    g = torch.randn(out.shape)
    (expected,) = torch.autograd.grad(out, x, g)
    xd = x.detach().to(DEV).requires_grad_()
    out_d = F.interpolate(xd, **kwargs)
    (actual,) = torch.autograd.grad(out_d, xd, g.to(DEV))
    torch.testing.assert_close(out_d.detach().cpu(), out.detach())
    torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize(
    "nd,shape,kernel,output",
    [
        (2, (2, 3, 9, 11), (2, 3), (5, 4)),
        (2, (3, 9, 11), (3, 2), (4, 7)),
        (3, (2, 2, 7, 8, 9), (2, 2, 3), (3, 4, 5)),
        (2, (1, 2, 5, 5), (2, 2), (1, 1)),
    ],
)
def test_fractional_max_pool_with_given_samples(nd, shape, kernel, output):
    F = torch.nn.functional
    x = torch.randn(*shape)
    x.view(-1)[3] = float("nan")  # NaN wins its window, as on the CPU
    samples = torch.rand(shape[0] if len(shape) == nd + 2 else 1, shape[-nd - 1], nd)
    pool = F.fractional_max_pool2d if nd == 2 else F.fractional_max_pool3d
    xc = x.clone().requires_grad_()
    out, idx = pool(xc, kernel, output_size=output, return_indices=True, _random_samples=samples)
    xd = x.to(DEV).requires_grad_()
    out_d, idx_d = pool(xd, kernel, output_size=output, return_indices=True, _random_samples=samples.to(DEV))
    torch.testing.assert_close(idx_d.cpu(), idx)
    torch.testing.assert_close(out_d.detach().cpu(), out.detach(), equal_nan=True)
    g = torch.randn(out.shape)
    (expected,) = torch.autograd.grad(out, xc, g)
    (actual,) = torch.autograd.grad(out_d, xd, g.to(DEV))
    torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize(
    "shapes",
    [
        ((12, 16), (3, 16, 8), [4, 8, 12]),  # experts' forward: groups of rows
        ((16, 12), (12, 8), [4, 8, 12]),  # their weight gradient
        ((3, 12, 16), (16, 12), [4, 8, 12]),  # groups of columns
        ((3, 12, 16), (3, 16, 8), None),
    ],
)  # batched
def test_grouped_mm_modes_and_gradients(shapes):
    sa, sb, offs = shapes
    a, b = torch.randn(*sa, requires_grad=True), torch.randn(*sb, requires_grad=True)
    o = None if offs is None else torch.tensor(offs, dtype=torch.int32)
    ta, tb = (x.detach().to(DEV).requires_grad_() for x in (a, b))
    expected = torch._grouped_mm(a, b, offs=o)
    actual = torch._grouped_mm(ta, tb, offs=None if o is None else o.to(DEV))
    torch.testing.assert_close(actual.cpu(), expected)
    weight = torch.randn(expected.shape)
    (expected * weight).sum().backward()
    (actual * weight.to(DEV)).sum().backward()
    torch.testing.assert_close(ta.grad.cpu(), a.grad)
    torch.testing.assert_close(tb.grad.cpu(), b.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("routing", ["random", "one expert", "empty tail"])
def test_grouped_mm_with_many_uneven_groups(routing, dtype):
    """Mixture-of-experts routing: 16 experts, empty groups, one expert taking every row, rows past
    the last offset (the tiled path off TPU must cover each group's rows exactly once)."""
    m, g = 70, 16
    counts = {
        "random": torch.bincount(torch.randint(0, g, (m,)), minlength=g),
        "one expert": torch.zeros(g, dtype=torch.long).index_fill_(0, torch.tensor([5]), m),
        "empty tail": torch.bincount(torch.randint(0, g - 3, (m - 9,)), minlength=g),
    }[routing]
    offs = counts.cumsum(0).to(torch.int32)
    a, b = torch.randn(m, 24, dtype=dtype), torch.randn(g, 24, 40, dtype=dtype)
    expected = torch._grouped_mm(a, b, offs=offs)
    actual = torch._grouped_mm(a.to(DEV), b.to(DEV), offs=offs.to(DEV)).cpu()
    used = int(offs[-1])
    torch.testing.assert_close(actual[:used], expected[:used])
    assert not actual[used:].any()


def test_lazily_conjugated_and_negated_views():
    """x.conj(), x.mH and x.conj().imag are views with PyTorch's conjugate/negative bits: every read,
    write and copy through them sees the conjugated (negated) values."""
    x = torch.randn(4, 3, dtype=torch.complex64)
    t = x.to(DEV)
    checks = {
        "conj": lambda v: v.conj(),
        "conj + 1": lambda v: v.conj() + 1,
        "resolve_conj": lambda v: v.conj().resolve_conj(),
        "mH @ x": lambda v: v.mH @ v,
        "conj().imag": lambda v: v.conj().imag,
        "real, imag": lambda v: torch.stack([v.real, v.imag]),
        "view_as_real": lambda v: torch.view_as_real(v.conj().resolve_conj()),
        "clone": lambda v: v.conj().clone(),
    }
    for name, fn in checks.items():
        torch.testing.assert_close(fn(t).cpu(), fn(x), msg=lambda m: f"{name}: {m}")
    z, zc = t.clone(), x.clone()
    for v in (z, zc):
        v.conj().copy_(torch.full((4, 3), 1 + 2j, dtype=torch.complex64, device=v.device))
        v.imag.mul_(3)
    torch.testing.assert_close(z.cpu(), zc)
    host = torch.zeros(4, 3, dtype=torch.complex64)
    host.copy_(t.conj())
    torch.testing.assert_close(host, x.conj())
    torch.testing.assert_close(x.conj().to(DEV).cpu(), x.conj())
    r = torch.randn(4, 2)
    torch.testing.assert_close(torch.view_as_complex(r.to(DEV)).cpu(), torch.view_as_complex(r))
