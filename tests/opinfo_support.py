"""Parity of the tpu device with the CPU over PyTorch's OpInfo database (shared by the tests and
tools/op_coverage.py).

`check(op, dtype, kind)` runs up to a few OpInfo samples (fresh random values) of one op at one
dtype on the CPU and on "tpu" and compares them with `torch.testing.assert_close`:

- kind "forward":  the function variant: values, shapes, dtypes.
- kind "inplace":  `op.inplace_variant` on a copy of the input: the mutated input and the result.
- kind "out":      the out= variant (first sample only): the out tensor(s).
- kind "grad":     float32 and complex64: gradients of every input that requires grad, for random
                   cotangents, through `torch.autograd.grad`.

Random ops are compared on shape and dtype only (their values cannot match the CPU's generator;
their distributions are tested in tests/test_random_distributions.py). Ops out of scope are listed
in OUT_OF_SCOPE with the reason; nothing is skipped silently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import traceback

import torch
from torch.utils import _pytree as pytree

DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
]

# (rtol, atol) per dtype; integers and bool must match exactly
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.complex128: (1e-7, 1e-7),
    torch.complex64: (1e-4, 1e-5),
}
GRAD_TOLERANCE = (1e-3, 1e-4)
# gradients are checked at float32 and complex64 (complex autograd has its own conjugations)
GRAD_DTYPES = (torch.float32, torch.complex64)
# out= reuses the functional lowering plus a write: checked at one float and one integer dtype
OUT_DTYPES = (torch.float32, torch.int64)

# ops whose outputs are random (or uninitialised): compared on shape and dtype only
RANDOM_OPS = {
    "bernoulli",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
    "normal",
    "normal.in_place",
    "normal.number_mean",
    "uniform",
    "multinomial",
    "randn",
    "randn_like",
    "rand_like",
    "randint",
    "randint_like",
    "nn.functional.rrelu",
    "nn.functional.dropout",
    "nn.functional.dropout2d",
    "nn.functional.dropout3d",
    "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train",
    "empty",
    "empty_like",
    "new_empty",
    "new_empty_strided",
    "empty_strided",
    "empty_permuted",
    # draw their pooling regions from the device's generator (exact with given samples: test_ops_semantics)
    "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d",
}

# linalg ops without a lowering: geqrf has no meta kernel
LINALG_NOT_LOWERED = {"geqrf"}
# the general eigensolver: lowered where XLA has one (the CPU platform), not on TPU; its backward is not
# lowered. Compared with the CPU in tests/test_correctness_edge.py
LINALG_EIG = {"linalg.eig", "linalg.eigvals"}
# least squares: drivers "gels" (CUDA's default, and ours) and "gelsy" are lowered and compared with the
# CPU in tests/test_linalg.py; the OpInfo samples also ask for "gelsd"/"gelss", which raise on tpu
LINALG_LSTSQ = {"linalg.lstsq", "linalg.lstsq.grad_oriented"}
# decompositions defined up to signs/phases, so not comparable element by element: tests/test_linalg.py
# compares them through invariants (eigenvalues, reconstructions, projectors)
LINALG_GAUGE = {"linalg.eigh", "linalg.svd", "svd", "linalg.qr", "qr", "svd_lowrank", "pca_lowrank"}


def out_of_scope(name: str) -> str | None:
    """Why an OpInfo is not part of the parity sweep, or None when it is."""
    if name.startswith("sparse.") or name == "to_sparse":
        return "sparse layouts are not supported on tpu"
    if name in LINALG_NOT_LOWERED:
        return "linalg op without a lowering (geqrf)"
    if name in LINALG_EIG:
        return (
            "general eigensolver: XLA has one on the CPU platform only (not on TPU); forward compared in "
            "tests/test_correctness_edge.py"
        )
    if name in LINALG_LSTSQ:
        return (
            "least squares: drivers gels and gelsy are compared in tests/test_linalg.py; the samples' "
            "gelsd/gelss are not supported on tpu (data-dependent residuals)"
        )
    if name in LINALG_GAUGE:
        return "decomposition unique only up to signs/phases: compared through invariants in tests/test_linalg.py"
    if name.startswith(("torch.ops.aten._flash_attention", "torch.ops.aten._efficient_attention")):
        return "CUDA-only attention kernels"
    return None


def op_id(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def cpu_dtypes(op):
    supported = op.supported_dtypes("cpu")
    return [d for d in DTYPES if d in supported]


@dataclasses.dataclass
class Result:
    status: str  # pass | fail | error | not_lowered | timeout | no_samples | n/a
    reason: str = ""
    samples: int = 0


class Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds):
    """Raise Timeout in the main thread after `seconds` (checked between Python bytecodes)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def on_alarm(signum, frame):
        raise Timeout(f"timed out after {seconds}s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(seconds))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------ helpers
def _move_view(t, device):
    """A view keeps its whole storage and its offset on `device` (as_strided samples reach outside
    the view's own elements, as they may on a device where the sample was made)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    full = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,)).to(device)
    return full.as_strided(t.size(), t.stride(), t.storage_offset())


def _to(x, device):
    def move(t):
        if isinstance(t, torch.Tensor):
            if t.layout != torch.strided:
                raise _SampleOutOfScope("non-strided layout")
            moved = t.detach().to(device) if t._base is None else _move_view(t.detach(), device)
            return moved.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() else moved
        return t

    return pytree.tree_map(move, x)


def _clone(x):
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x)


class _SampleOutOfScope(Exception):
    pass


def _spread(samples, n):
    """Up to n samples spread over the list (the first ones are often the trivial shapes)."""
    if len(samples) <= n:
        return samples
    idx = sorted({round(i * (len(samples) - 1) / max(n - 1, 1)) for i in range(n)})
    return [samples[i] for i in idx]


def _samples(op, dtype, requires_grad, max_samples):
    out = []
    for s in op.sample_inputs("cpu", dtype, requires_grad=requires_grad):
        out.append(s)
        if len(out) >= 4 * max_samples:  # enough to choose a spread from; generation is cheap
            break
    return _spread(out, max_samples)


def _on(kwargs, device):
    """Factory samples name the device they were made for: point them at `device`."""
    if isinstance(kwargs, dict) and "device" in kwargs:
        kwargs = dict(kwargs, device=device)
    return kwargs


# Arguments that PyTorch requires on the CPU whatever the device (as its own device tests pass them).
_CPU_ONLY_ARGS = {"tensor_split": 0}


def _place(op, sample, device):
    """The sample's tensors on `device`; a device it names (the CPU it was made on) becomes `device`."""
    args = tuple(device if isinstance(a, torch.device) or a == "cpu" else a for a in sample.args)
    inp, args, kwargs = _to((sample.input, args, _on(sample.kwargs, device)), device)
    keep = _CPU_ONLY_ARGS.get(getattr(op, "name", None))
    if keep is not None and keep < len(args) and isinstance(sample.args[keep], torch.Tensor):
        args = args[:keep] + (sample.args[keep],) + args[keep + 1 :]
    return inp, args, kwargs


def _call(fn, sample, device):
    inp, args, kwargs = _place(fn, sample, device)
    return inp, args, kwargs, fn(inp, *args, **kwargs)


def compare(actual, expected, dtype, random=False, what="output"):
    """assert_close on every tensor leaf (after moving to cpu); other leaves must be equal."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if len(a_leaves) != len(e_leaves):
        raise AssertionError(f"{what}: {len(a_leaves)} leaves, expected {len(e_leaves)}")
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise AssertionError(f"{what}[{i}]: got {type(a).__name__}, expected a tensor")
            if a.device.type != "tpu" and e.device.type == "cpu" and e.numel() and a.numel():
                raise AssertionError(f"{what}[{i}]: result on {a.device}, expected tpu")
            if a.shape != e.shape or a.dtype != e.dtype:
                raise AssertionError(
                    f"{what}[{i}]: shape/dtype {tuple(a.shape)} {a.dtype}, expected {tuple(e.shape)} {e.dtype}"
                )
            if random:
                continue
            rtol, atol = TOLERANCES.get(e.dtype, (0, 0))
            try:
                torch.testing.assert_close(
                    a.detach().cpu(), e.detach(), rtol=rtol, atol=atol, equal_nan=True, check_device=False
                )
            except AssertionError as err:
                msg = str(err).strip().splitlines()
                raise AssertionError(
                    f"{what}[{i}] {tuple(e.shape)} {e.dtype}: " + " ".join(m.strip() for m in msg[:4])
                ) from None
        elif isinstance(e, float) and isinstance(a, float):
            if not (a == e or (a != a and e != e) or abs(a - e) <= 1e-5 + 1e-4 * abs(e)) and not random:
                raise AssertionError(f"{what}[{i}]: {a} != {e}")
        elif not random and a != e and not (isinstance(e, torch.dtype) or (e is None and a is None)):
            raise AssertionError(f"{what}[{i}]: {a!r} != {e!r}")


# Ops returning (values, indices) whose indices PyTorch leaves implementation-defined when values
# tie (unstable sorts, selection): the tpu's indices are accepted when they select exactly the
# values the CPU returned; values are always compared. arg position and default of `dim`:
TIE_AMBIGUOUS_INDICES = {
    "sort": (0, -1),
    "topk": (1, -1),
    "kthvalue": (1, -1),
    "mode": (0, -1),
    "median": (0, None),
    "nanmedian": (0, None),
}


def _reconcile_argsort(sample, actual, expected):
    """argsort without stable=True: any permutation that sorts the input as the CPU's does."""
    inp = sample.input
    if sample.kwargs.get("stable") or not isinstance(actual, torch.Tensor) or inp.dim() == 0:
        return actual
    dim = sample.kwargs.get("dim", sample.args[0] if sample.args else -1)
    try:
        idx = actual.detach().cpu()
        n = inp.shape[dim]
        perm = torch.arange(n).reshape([n if d == dim % inp.dim() else 1 for d in range(inp.dim())])
        torch.testing.assert_close(idx.sort(dim).values, perm.expand_as(idx), rtol=0, atol=0)
        torch.testing.assert_close(
            inp.detach().gather(dim, idx), inp.detach().gather(dim, expected), rtol=0, atol=0, equal_nan=True
        )
    except Exception:  # noqa: BLE001 - not a valid choice: leave it to the normal comparison
        return actual
    return expected.to(actual.device)


def _reconcile_indices(name, sample, actual, expected):
    if name == "argsort":
        return _reconcile_argsort(sample, actual, expected)
    spec = TIE_AMBIGUOUS_INDICES.get(name)
    if spec is None or not (isinstance(expected, tuple) and len(expected) == 2):
        return actual
    if name == "sort" and sample.kwargs.get("stable"):
        return actual  # stable sorts have one right answer
    pos, default = spec
    dim = sample.kwargs.get("dim", sample.args[pos] if len(sample.args) > pos else default)
    inp = sample.input
    if dim is None or not isinstance(inp, torch.Tensor) or inp.dim() == 0:
        return actual
    try:
        idx = actual[1].detach().cpu()
        if idx.shape != expected[1].shape:
            return actual
        gather_idx = idx if idx.dim() == inp.dim() else idx.unsqueeze(dim)
        picked = inp.detach().gather(dim, gather_idx)
        torch.testing.assert_close(picked, expected[0].reshape(picked.shape), rtol=0, atol=0, equal_nan=True)
    except Exception:  # noqa: BLE001 - not a valid choice: leave it to the normal comparison
        return actual
    return (actual[0], expected[1].to(actual[1].device))


# Batch norm's saved statistics (outputs 1 and 2): tpu follows CUDA and PyTorch's meta kernel, shape
# (C,) in the accumulation dtype (float32 for half types) in both modes; the CPU returns them in the
# input dtype, and empty (0,) in eval mode (docs/design.md, ops/normalization.py: _bn_forward). Checked here
# against CUDA's convention; the CPU's values are compared where it has them.
BATCH_NORM_SAVED_STATS = {"native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update"}


def _reconcile_saved_stats(name, sample, actual, expected):
    if name not in BATCH_NORM_SAVED_STATS or not isinstance(expected, tuple):
        return actual
    x = sample.input
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    fixed = list(actual)
    for i in (1, 2):
        a, e = actual[i], expected[i]
        assert a.shape == (x.shape[1],) and a.dtype == acc, f"saved statistic {i}: {tuple(a.shape)} {a.dtype}"
        fixed[i] = e.to(a.device) if e.numel() == 0 else a.to(e.dtype)
    return tuple(fixed)


# Ops whose CPU kernels round intermediate results to a half input's dtype where CUDA keeps float32:
# instance_norm's batch statistics (the CPU's batch_norm stores mean and 1/std in bfloat16/float16
# and folds them with the weight in that dtype; CUDA keeps them in float32). tpu follows CUDA, so at
# half dtypes these are compared with the CPU computing in float32 on the same values, rounded once.
FLOAT32_REFERENCE = {"nn.functional.instance_norm"}


def _float32_reference(op, sample, dtype, expected):
    if op_id(op) not in FLOAT32_REFERENCE or dtype not in (torch.float16, torch.bfloat16):
        return expected
    up = lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == dtype else t
    inp, args, kwargs = pytree.tree_map(up, (sample.input, sample.args, sample.kwargs))
    return pytree.tree_map(
        lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t,
        op(inp, *args, **kwargs),
    )


# A half-dtype result that misses the CPU's by more than the tolerance is still accepted when it is
# at least as close as the CPU's to the same computation in float64 (PyTorch's own reference tests,
# test_ops.py, judge a disagreement with a precise result the same way): the CPU's kernels often
# round intermediates to the half dtype where tpu, like CUDA, accumulates in float32.
HALF_DTYPES = (torch.float16, torch.bfloat16)


def _precise(fn, sample, dtype, inplace=False):
    """`fn` on the CPU with the sample's `dtype` tensors in float64 (for an in-place variant, the
    mutated input)."""
    up = lambda t: t.detach().double() if isinstance(t, torch.Tensor) and t.dtype == dtype else t
    inp, args, kwargs = pytree.tree_map(up, (sample.input, sample.args, sample.kwargs))
    if inplace:
        inp = _clone(inp)  # (an input not of `dtype` was not copied by `up`)
    with torch.no_grad():
        out = fn(inp, *args, **kwargs)
    return inp if inplace else out


def _distance(a, reference):
    a, reference = a.detach().cpu().double(), reference.detach().double()
    both_nan = a.isnan() & reference.isnan()
    d = (a - reference).abs().masked_fill(both_nan | (a == reference), 0)  # (equal infinities: 0)
    return d.nan_to_num(nan=float("inf")).max().item() if d.numel() else 0.0


def _no_less_accurate(actual, expected, precise, dtype):
    """Whether each half-dtype leaf of `actual` is as close to `precise` as the CPU's `expected` is
    (other leaves are compared as usual)."""
    a_leaves, e_leaves = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    p_leaves = pytree.tree_leaves(precise)
    if not (len(a_leaves) == len(e_leaves) == len(p_leaves)):
        return False
    for a, e, p in zip(a_leaves, e_leaves, p_leaves):
        if (
            isinstance(e, torch.Tensor)
            and e.dtype == dtype
            and isinstance(p, torch.Tensor)
            and p.shape == e.shape
            and p.is_floating_point()
        ):
            if _distance(a, p) > _distance(e, p):
                return False
        else:
            compare(a, e, dtype)
    return True


def _compare_half(fn, sample, dtype, actual, expected, random, what="output", inplace=False):
    """compare(), with the precise-reference rule above for half dtypes."""
    try:
        compare(actual, expected, dtype, random, what)
    except AssertionError:
        if dtype not in HALF_DTYPES or random:
            raise
        try:
            ok = _no_less_accurate(actual, expected, _precise(fn, sample, dtype, inplace), dtype)
        except Exception:  # noqa: BLE001 - no float64 computation to judge by: the CPU's result decides
            ok = False
        if not ok:
            raise


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(e).__name__}: {line}"[:300]


def _classify(e: BaseException) -> Result:
    from torchtpu.ops.resolve import NotLowered

    if isinstance(e, Timeout):
        return Result("timeout", str(e))
    if isinstance(e, NotLowered) or (isinstance(e, NotImplementedError) and "not implemented for the tpu" in str(e)):
        msg = str(e)
        start = msg.find("aten::")
        name = msg[start:].split(" ")[0] if start >= 0 else msg
        return Result("not_lowered", f"{name} has no tpu lowering")
    if isinstance(e, AssertionError):
        return Result("fail", _first_line(e))
    return Result("error", _first_line(e))


# ------------------------------------------------------------------ one check
def check(op, dtype, kind="forward", max_samples=3, timeout=120) -> Result:
    """Run `kind` for `op` at `dtype`; never raises (exceptions become Results)."""
    name = op_id(op)
    random = name in RANDOM_OPS
    try:
        with time_limit(timeout):
            if kind == "forward":
                return _check_forward(op, dtype, max_samples, random)
            if kind == "inplace":
                return _check_inplace(op, dtype, max_samples, random)
            if kind == "out":
                return _check_out(op, dtype, random)
            if kind == "grad":
                return _check_grad(op, dtype, max_samples, random)
            raise ValueError(kind)
    except Exception as e:  # noqa: BLE001 - every failure becomes a result
        r = _classify(e)
        if r.status == "error" and "torchtpu" not in r.reason:
            r.reason += " @ " + _where(e)
        return r


def _where(e):
    tb = traceback.extract_tb(e.__traceback__)
    frames = [f for f in tb if "torchtpu" in f.filename]
    f = frames[-1] if frames else (tb[-1] if tb else None)
    return f"{f.filename.split('/')[-1]}:{f.lineno}" if f else "?"


def _run_samples(op, dtype, max_samples, requires_grad, one):
    """Apply `one(sample)` to each sample the CPU accepts; returns the number compared."""
    n = 0
    for sample in _samples(op, dtype, requires_grad, max_samples):
        try:
            if one(sample) is False:
                continue
        except _SampleOutOfScope:
            continue
        n += 1
    return n


def _cpu_or_none(fn):
    try:
        return True, fn()
    except Exception:  # noqa: BLE001 - the CPU rejects this sample: nothing to compare
        return False, None


def _draws_random(sample):
    """A sample that asks for dropout: its values are random on any device."""
    return any(isinstance(sample.kwargs.get(k), float) and sample.kwargs[k] > 0 for k in ("dropout_p", "dropout")) or (
        sample.kwargs.get("training") is True
        and ("dropout_p" in sample.kwargs or any(isinstance(a, float) and 0 < a < 1 for a in sample.args))
    )  # MHA passes dropout_p by position


def _check_forward(op, dtype, max_samples, random):
    def one(sample):
        ok, expected = _cpu_or_none(lambda: _call(op, sample, "cpu")[3])
        if not ok:
            return False
        _, _, _, actual = _call(op, sample, "tpu")
        actual = _reconcile_indices(op.name, sample, actual, expected)
        actual = _reconcile_saved_stats(op_id(op), sample, actual, expected)
        expected = _float32_reference(op, sample, dtype, expected)
        _compare_half(op, sample, dtype, actual, expected, random or _draws_random(sample))

    n = _run_samples(op, dtype, max_samples, False, one)
    return Result("pass", samples=n) if n else Result("no_samples", "the CPU accepts no sample")


def _check_inplace(op, dtype, max_samples, random):
    fn = op.inplace_variant
    if fn is None:
        return Result("n/a")

    def one(sample):
        def cpu():
            inp, args, kwargs = _place(op, sample, "cpu")
            inp = _clone(inp)
            with torch.no_grad():
                out = fn(inp, *args, **kwargs)
            return inp, out

        ok, expected = _cpu_or_none(cpu)
        if not ok:
            return False
        inp, args, kwargs = _place(op, sample, "tpu")
        inp = _clone(inp)
        with torch.no_grad():
            out = fn(inp, *args, **kwargs)
        _compare_half(fn, sample, dtype, inp, expected[0], random, "mutated input", inplace=True)
        if isinstance(out, torch.Tensor) and out is not inp and not isinstance(inp, torch.Tensor):
            compare(out, expected[1], dtype, random, "inplace output")

    n = _run_samples(op, dtype, max_samples, False, one)
    return Result("pass", samples=n) if n else Result("no_samples", "the CPU accepts no in-place sample")


def _check_out(op, dtype, random):
    if not op.supports_out:
        return Result("n/a")

    def one(sample):
        ok, expected = _cpu_or_none(lambda: _call(op, sample, "cpu")[3])
        if not ok:
            return False
        if isinstance(expected, torch.Tensor):
            out = torch.empty_like(expected, device="tpu")
        elif isinstance(expected, tuple) and expected and all(isinstance(e, torch.Tensor) for e in expected):
            out = tuple(torch.empty_like(e, device="tpu") for e in expected)
        else:
            return False
        inp, args, kwargs = _place(op, sample, "tpu")
        ret = op(inp, *args, out=out, **kwargs)
        compare(_reconcile_indices(op.name, sample, out, expected), expected, dtype, random, "out=")
        if isinstance(out, torch.Tensor) and ret is not out:
            raise AssertionError("out= variant did not return its out tensor")

    n = _run_samples(op, dtype, 1, False, one)
    return Result("pass", samples=n) if n else Result("no_samples", "no out= sample the CPU accepts")


def _grad_inputs(x):
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor) and t.requires_grad]


def _check_grad(op, dtype, max_samples, random):
    if random:
        return Result("n/a", "random op")

    def grads(sample, device, cotangents=None):
        inp, args, kwargs = _place(op, sample, device)
        out = op(inp, *args, **kwargs)
        out = sample.output_process_fn_grad(out)
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        leaves = _grad_inputs((inp, args, kwargs))
        if not outs or not leaves:
            return None
        if cotangents is None:
            cotangents = [torch.randn_like(t.detach().cpu()) for t in outs]
        got = torch.autograd.grad(outs, leaves, [c.to(device) for c in cotangents], allow_unused=True)
        return cotangents, [None if g is None else g.detach() for g in got]

    def one(sample):
        ok, expected = _cpu_or_none(lambda: grads(sample, "cpu"))
        if not ok or expected is None:
            return False
        _, actual = grads(sample, "tpu", expected[0])
        for i, (a, e) in enumerate(zip(actual, expected[1])):
            if (a is None) != (e is None):
                raise AssertionError(
                    f"grad[{i}]: {'None' if a is None else 'a tensor'}, expected {'None' if e is None else 'a tensor'}"
                )
            if e is None:
                continue
            if a.shape != e.shape or a.dtype != e.dtype:
                raise AssertionError(f"grad[{i}]: {tuple(a.shape)} {a.dtype}, expected {tuple(e.shape)} {e.dtype}")
            if _draws_random(sample):
                continue  # dropout: gradients are as random as the outputs
            try:
                torch.testing.assert_close(a.cpu(), e, rtol=GRAD_TOLERANCE[0], atol=GRAD_TOLERANCE[1], equal_nan=True)
            except AssertionError as err:
                msg = str(err).strip().splitlines()
                raise AssertionError(f"grad[{i}] {tuple(e.shape)}: " + " ".join(m.strip() for m in msg[:4])) from None

    n = _run_samples(op, dtype, max_samples, True, one)
    return Result("pass", samples=n) if n else Result("no_samples", "no differentiable sample")


def kinds_for(op, dtype):
    """The checks that apply to (op, dtype)."""
    kinds = ["forward"]
    if op.inplace_variant is not None:
        kinds.append("inplace")
    if op.supports_out and dtype in OUT_DTYPES:
        kinds.append("out")
    if dtype in GRAD_DTYPES and op.supports_autograd and op_id(op) not in RANDOM_OPS:
        kinds.append("grad")
    return kinds
