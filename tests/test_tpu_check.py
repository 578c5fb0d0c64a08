"""The TPU compile check (TORCHTPU_TPU_COMPILE_CHECK, eager/tpu_check.py): programs torchtpu builds are
also compiled by XLA:TPU for a topology (libtpu, no chip), while the results still come from the host."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

pytest.importorskip("libtpu", reason="the TPU compile check needs libtpu (pip install torchtpu[tpu-check])")

from torchtpu.eager import tpu_check

TOPOLOGY = "v5e:2x2"


@pytest.fixture
def check(monkeypatch):
    """The check on for this test (executables built meanwhile are checked); its results forgotten."""
    monkeypatch.setenv("TORCHTPU_TPU_COMPILE_CHECK", TOPOLOGY)
    tpu_check.reset_for_test()
    yield tpu_check
    tpu_check.reset_for_test()


_next_fresh = itertools.count(int.from_bytes(os.urandom(2), "little") % 64)


def _fresh_shape():
    """A shape no other test of this process used: a new executable (cached ones were built before the
    check was on). Odd sizes past 100, one per call: other tests' sizes (64, 128, ...) never collide."""
    k = next(_next_fresh)
    return (101 + 2 * k, 103 + 2 * k)


def _programs(report, prefix):
    return [p for p in report.programs if p.name.startswith(prefix)]


def test_eager_op_compiles_for_tpu_and_computes_on_host(check):
    x = torch.randn(_fresh_shape())
    y = torch.sin(x.to("tpu")) * 3
    torch.testing.assert_close(y.cpu(), torch.sin(x) * 3)
    report = torch.tpu.compiler.tpu_compile_check_report()
    sin = _programs(report, "aten::sin.default")
    assert sin and all(p.ok for p in sin), report.failures
    assert sin[-1].cost.get("bytes accessed", 0) > 0  # XLA:TPU's cost analysis of the program
    assert report.failed == 0 and report.topology == TOPOLOGY


def test_bucketed_random_fill_compiles_for_tpu(check):
    """A random fill of a new shape: its shared draw of a size bucket and its per-shape copy."""
    from torchtpu.eager import bucketed_draws

    bucketed_draws._draws.clear()  # (a draw built before the check was on would not be checked)
    x = torch.rand(_fresh_shape(), device="tpu")
    assert float(x.min()) >= 0 and float(x.max()) < 1
    report = torch.tpu.compiler.tpu_compile_check_report()
    programs = _programs(report, "aten::uniform_.default")
    assert {"draw" in p.name for p in programs} == {True, False}, [p.name for p in programs]
    assert all(p.ok for p in programs) and report.failed == 0, report.failures


@pytest.mark.parametrize("mode", ["strict", "debug", "fused", "compiled"])
def test_training_compiles_for_tpu_in_every_mode(check, mode):
    """A small MLP's training steps: every program of forward, backward and AdamW checked, results the CPU's."""
    torch.manual_seed(0)
    width = _fresh_shape()[1]
    cpu = torch.nn.Sequential(
        torch.nn.Linear(12, width), torch.nn.GELU(), torch.nn.LayerNorm(width), torch.nn.Linear(width, 3)
    )
    dev = _copy_to_tpu(cpu)
    step = (lambda m, x: m(x)) if mode != "compiled" else torch.compile(lambda m, x: m(x), backend="tpu")
    cpu_opt, dev_opt = torch.optim.AdamW(cpu.parameters(), lr=1e-2), torch.optim.AdamW(dev.parameters(), lr=1e-2)
    from torchtpu.eager.modes import eager_mode

    with eager_mode("fused" if mode == "compiled" else mode):
        for _ in range(3):
            x, y = torch.randn(8, 12), torch.randint(0, 3, (8,))
            for model, opt, xx, yy, fwd in (
                (cpu, cpu_opt, x, y, lambda m, x: m(x)),
                (dev, dev_opt, x.to("tpu"), y.to("tpu"), step),
            ):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(fwd(model, xx), yy).backward()
                opt.step()
    # AdamW divides each gradient element by its own running scale, so an element whose gradient is
    # near zero magnifies a last-bit difference of the backward (seen: 1.5e-5 on one of 201 elements).
    for p_cpu, p_dev in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.detach().cpu(), p_cpu.detach(), rtol=1e-3, atol=1e-4)
    report = check.report()
    assert report.failed == 0, report.failures
    assert report.compiled >= 10
    if mode == "compiled":
        assert _programs(report, "compiled graph")


def _copy_to_tpu(model):
    import copy

    return copy.deepcopy(model).to("tpu")


def test_fused_segment_compiles_for_tpu(check):
    """The fused mode's compiled segment of a loop's body is checked as one program."""
    x = torch.randn(_fresh_shape())
    xd = x.to("tpu")
    for _ in range(6):
        x, xd = (x * 0.5 + 1).tanh() - x.mean(), (xd * 0.5 + 1).tanh() - xd.mean()
        torch.testing.assert_close(xd.cpu(), x)
    segments = _programs(check.report(), "fused segment of")
    assert segments and all(p.ok for p in segments), check.report().failures
    assert "aten::tanh.default" in segments[-1].name


def test_compiled_graph_compiles_for_tpu(check):
    shape = _fresh_shape()

    def fn(a, b):
        return torch.tanh(a @ b.T).sum(dim=0) + 1

    a, b = torch.randn(shape), torch.randn(shape)
    out = torch.compile(fn, backend="tpu", dynamic=False)(a.to("tpu"), b.to("tpu"))
    torch.testing.assert_close(out.cpu(), fn(a, b), rtol=1e-4, atol=1e-4)
    graphs = _programs(check.report(), "compiled graph")
    assert graphs and all(p.ok for p in graphs), check.report().failures
    assert graphs[-1].cost.get("flops", 0) > 0


def test_data_dependent_helpers_compile_for_tpu():
    """(A process of its own: the helpers are jitted when their module loads.)"""
    done = _run_python(
        """
        import torch
        from torchtpu.eager import data_dependent
        data_dependent.HOST_NONZERO_ELEMENTS = 0  # (the device form, which small inputs skip)
        x = torch.randint(0, 4, (37,))
        torch.testing.assert_close(x.to("tpu").nonzero().cpu(), x.nonzero())
        print(sorted({p.name for p in torch.tpu.compiler.tpu_compile_check_report().programs if p.ok}))
        """,
        TORCHTPU_TPU_COMPILE_CHECK=TOPOLOGY,
    )
    assert done.returncode == 0, done.stderr
    assert "'data_dependent._count'" in done.stdout and "'data_dependent._nonzero'" in done.stdout, done.stdout


def test_data_dependent_helpers_checked_when_the_check_is_turned_on_after_import(check, monkeypatch):
    """The helpers are jitted when eager/data_dependent.py loads, with the check off in this process;
    turned on later (the `check` fixture sets the variable now), it covers them at their next call."""
    from torchtpu.eager import data_dependent

    monkeypatch.setattr(data_dependent, "HOST_NONZERO_ELEMENTS", 0)  # (the device form, which small inputs skip)
    assert data_dependent._nonzero  # (loaded before the check was on)
    # few elements: XLA:TPU's compile of unique's sort grows with them (131x133: ~30 s under load, 8x9: ~3 s)
    x = torch.randint(0, 3, (1, 1, _fresh_shape()[0]))
    torch.testing.assert_close(x.to("tpu").nonzero().cpu(), x.nonzero())
    torch.testing.assert_close(torch.unique(x.to("tpu")).cpu(), torch.unique(x))
    names = {p.name for p in check.report().programs if p.ok}
    assert {"data_dependent._count", "data_dependent._nonzero", "data_dependent._unique"} <= names, names
    assert check.report().failed == 0, check.report().failures


def test_bad_input_raises_the_hosts_error_and_is_no_tpu_failure(check):
    """An op whose own trace refuses its input (on every platform) raises the host's error, and the
    check does not count that program as failing to compile for the TPU."""
    n = _fresh_shape()[0]
    with pytest.raises(NotImplementedError, match="not implemented for 'Half'") as tpu:
        torch.linalg.cholesky(torch.eye(n, dtype=torch.half, device="tpu"))
    assert not isinstance(tpu.value, tpu_check.TpuCompileCheckError)
    report = check.report()
    assert report.failed == 0 and not _programs(report, "aten::linalg_cholesky"), report.failures


def test_fused_optimizer_step_compiles_for_tpu(check):
    from torchtpu.optim import AdamW

    shape = _fresh_shape()
    cpu = [torch.randn(shape, requires_grad=True)]
    tpu = [cpu[0].detach().to("tpu").requires_grad_()]
    cpu_opt, tpu_opt = torch.optim.AdamW(cpu, lr=1e-2), AdamW(tpu, lr=1e-2)
    for _ in range(2):
        grad = torch.randn(shape)
        cpu[0].grad, tpu[0].grad = grad.clone(), grad.to("tpu")
        cpu_opt.step()
        tpu_opt.step()
    torch.testing.assert_close(tpu[0].detach().cpu(), cpu[0].detach())
    steps = _programs(check.report(), "fused AdamW step")
    assert steps and all(p.ok for p in steps), check.report().failures


def _tpu_only_custom_call(name):
    """A jax_op whose TPU branch calls a custom call XLA:TPU does not have (the host's branch is fine)."""
    from torch.tpu.pallas import jax_op

    from torchtpu.device.platform import lowering_platform

    def f(x: jax.Array) -> jax.Array:
        if lowering_platform() == "tpu":
            return jax.ffi.ffi_call("torchtpu_test_no_such_target", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
        return x * 2

    return jax_op(name, f)


def test_program_xla_tpu_rejects_raises_naming_it(check):
    op = _tpu_only_custom_call(f"tpucheck::rejected_{os.getpid()}")
    x = torch.randn(_fresh_shape())
    with pytest.raises(tpu_check.TpuCompileCheckError) as info:
        op(x.to("tpu"))
    error = info.value
    assert isinstance(error, RuntimeError)
    assert f"tpucheck::rejected_{os.getpid()}" in str(error) and TOPOLOGY in str(error)
    assert "torchtpu_test_no_such_target" in str(error)  # XLA:TPU's own message
    assert check.report().failed == 1
    # the same op without the check computes on the host
    os.environ.pop("TORCHTPU_TPU_COMPILE_CHECK")
    y = torch.randn(_fresh_shape())
    torch.testing.assert_close(op(y.to("tpu")).cpu(), y * 2)


def test_compiler_abort_is_the_programs_failure_not_the_processes(check):
    check._abort_next_for_test()
    x = torch.randn(_fresh_shape())
    with pytest.raises(tpu_check.TpuCompileCheckError, match=r"died \(signal 6\)") as info:
        torch.cos(x.to("tpu"))
    assert "aten::cos.default" in str(info.value)
    assert "aborting" in info.value.xla_error  # the dead child's stderr is in the failure
    # the process lives on, and the next program gets a new compiler process
    y = torch.randn(_fresh_shape())
    torch.testing.assert_close(torch.cos(y.to("tpu")).cpu(), torch.cos(y))
    report = check.report()
    assert report.failed == 1 and report.compiled >= 1


def test_interrupt_of_the_process_group_is_no_compile_failure(check):
    """SIGINT to the compiler process (Ctrl-C reaches the whole group) does not end it, so a run
    interrupted mid-compile does not count that program as failed."""
    import signal
    import time

    torch.sin(torch.randn(_fresh_shape()).to("tpu"))
    child = tpu_check._child.proc
    os.kill(child.pid, signal.SIGINT)
    time.sleep(0.5)
    x = torch.randn(_fresh_shape())
    torch.testing.assert_close(torch.cos(x.to("tpu")).cpu(), torch.cos(x))
    assert child.poll() is None and tpu_check._child.proc is child
    assert check.report().failed == 0, check.report().failures


def _run_python(code, **env):
    full = {k: v for k, v in os.environ.items() if k != "TORCHTPU_TPU_COMPILE_CHECK"}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env=full,
    )


def test_exit_line_printed_once_and_libtpu_noise_kept_away(tmp_path):
    log = tmp_path / "check.log"
    done = _run_python(
        """
        import jax, torch
        from torch.tpu.pallas import jax_op
        from torchtpu.device.platform import lowering_platform
        x = torch.randn(5, 7, device="tpu")
        print(float((x @ x.T).sum()))
        def f(x: jax.Array) -> jax.Array:  # a custom call XLA:TPU lacks, on its TPU branch only
            if lowering_platform() == "tpu":
                return jax.ffi.ffi_call("torchtpu_no_such_target", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
            return x
        try:
            jax_op("tpucheck::exit_listed", f)(x)
        except RuntimeError:
            pass
        """,
        TORCHTPU_TPU_COMPILE_CHECK=TOPOLOGY,
        TORCHTPU_TPU_COMPILE_CHECK_LOG=str(log),
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("tpu compile check")]
    assert len(lines) == 1, done.stderr
    m = re.fullmatch(rf"tpu compile check \({TOPOLOGY}\): (\d+) programs compiled, 1 failed", lines[0])
    assert m and int(m.group(1)) >= 2, lines
    # the failed program is listed after the line, and both go to the log file too
    listed = done.stderr[done.stderr.index(lines[0]) :]
    assert "failed: tpucheck::exit_listed" in listed and "torchtpu_no_such_target" in listed, listed
    assert re.search(r"slowest: \S.* \d+\.\d s", listed), listed  # the slowest compiles, for sweeps
    assert lines[0] in log.read_text() and "failed: tpucheck::exit_listed" in log.read_text()
    assert "TPU_ACCELERATOR_TYPE" not in done.stderr and "libtpu" not in done.stderr, done.stderr


@pytest.mark.parametrize("env", [{}, {"TORCHTPU_PLATFORM": "cpu"}], ids=["default", "cpu-asked"])
def test_no_chip_chooses_the_cpu_quietly(env):
    """libtpu installed, no chip: the device is XLA:CPU and libtpu's start-up warnings never print."""
    from torchtpu.device.platform import tpu_chip_visible

    if tpu_chip_visible():
        pytest.skip("this machine has a TPU chip")
    done = _run_python(
        """
        import torch
        print(torch.tpu.platform(), float(torch.ones(3, device="tpu").sum()))
        """,
        **env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cpu", "3.0"]
    assert "TPU_ACCELERATOR_TYPE" not in done.stderr and "libtpu" not in done.stderr, done.stderr
    assert "tpu compile check" not in done.stderr


def test_bad_topology_is_a_config_error(monkeypatch):
    from torchtpu import config

    monkeypatch.setenv("TORCHTPU_TPU_COMPILE_CHECK", "a TPU please")
    with pytest.warns(RuntimeWarning, match="TORCHTPU_TPU_COMPILE_CHECK"):
        assert config.get("TORCHTPU_TPU_COMPILE_CHECK") is None
    assert "TORCHTPU_TPU_COMPILE_CHECK" in config.errors()
    monkeypatch.setenv("TORCHTPU_TPU_COMPILE_CHECK", "V6E:2x2")
    assert config.get("TORCHTPU_TPU_COMPILE_CHECK") == "v6e:2x2"
    monkeypatch.setenv("TORCHTPU_TPU_COMPILE_CHECK", "0")
    assert config.get("TORCHTPU_TPU_COMPILE_CHECK") is None


@pytest.mark.slow  # (XLA:TPU takes seconds per float64 DFT program; the values are checked below)
def test_double_precision_ffts_compile_for_tpu(check):
    """XLA:TPU's FFT is complex64-only: float64/complex128 ones are float64 DFT products there (ops/fft.py)."""
    r = torch.randn(3, 9 + 2 * next(_next_fresh), dtype=torch.float64)
    spectrum = torch.fft.rfft(r.to("tpu"))
    torch.testing.assert_close(spectrum.cpu(), torch.fft.rfft(r))
    torch.testing.assert_close(torch.fft.irfft(spectrum, n=r.shape[1]).cpu(), r)
    programs = _programs(check.report(), "aten::_fft")
    assert len(programs) >= 2 and all(p.ok for p in programs), check.report().failures


def test_double_precision_ffts_tpu_branch_matches_cpu():
    """The TPU branch of float64/complex128 FFTs (direct DFTs and the four-step split), traced on the host."""
    from torchtpu.device import platform
    from torchtpu.ops import fft

    x = torch.randn(2, 150, dtype=torch.complex128)  # past _DIRECT_DFT: 10 x 15
    r = torch.randn(3, 9, dtype=torch.float64)
    with platform.tracing_for("tpu"):  # (a new lambda each: not the host's cached trace)
        tpu = jax.jit(lambda a: fft.fft_c2c(a, [1], 1, False))(x.numpy())
        half = jax.jit(lambda a: fft.fft_r2c(a, [0, 1], 2, True))(r.numpy())
        back = jax.jit(lambda a: fft.fft_c2r(a, [0, 1], 0, 9))(np.asarray(half))
    torch.testing.assert_close(torch.from_numpy(np.asarray(tpu)), torch._fft_c2c(x, [1], 1, False))
    torch.testing.assert_close(torch.from_numpy(np.asarray(half)), torch._fft_r2c(r, [0, 1], 2, True))
    torch.testing.assert_close(torch.from_numpy(np.asarray(back)), r)  # (half was scaled by 1/27)


def test_uint64_division_tpu_branch_is_exact_and_has_no_64_bit_divide():
    """uint64 floor_divide/remainder/fmod take the int64 TPU branch (int32 when every value fits, else a
    long division): XLA:TPU's own 64-bit divide took minutes to compile. Exact against NumPy."""
    from torchtpu.device import platform
    from torchtpu.ops import elementwise

    g = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    n, top = 256, np.iinfo(np.uint64).max
    wide = (
        np.concatenate([g.integers(0, top, n, dtype=np.uint64, endpoint=True), np.array([top, top, 0, 7], np.uint64)]),
        np.concatenate([g.integers(1, top, n // 2, dtype=np.uint64), g.integers(1, 60, n // 2, dtype=np.uint64)]),
    )
    wide = (wide[0], np.concatenate([wide[1], np.array([1, top, 3, 2**63], np.uint64)]))
    narrow = (g.integers(0, 2**31 - 1, n, dtype=np.uint64), g.integers(1, 5000, n, dtype=np.uint64))

    def program(x, y):
        return elementwise.floor_divide(x, y), elementwise.remainder(x, y), elementwise.fmod(x, y)

    for a, b in (wide, narrow):
        with platform.tracing_for("tpu"):
            jitted = jax.jit(program)
            got = jitted(a, b)
            hlo = jitted.lower(a, b).as_text()
        assert not re.search(r"stablehlo\.(divide|remainder).*ui64", hlo)
        for value, reference in zip(got, (a // b, a % b, np.fmod(a, b))):
            np.testing.assert_array_equal(np.asarray(value), reference)


def test_float64_logcumsumexp_tpu_branch_is_a_log_depth_scan():
    """float64 logcumsumexp on a TPU: JAX's TPU lowering (a reduce_window over logaddexp) took XLA:TPU
    189 s to compile 20 elements; the TPU branch is an associative scan (67 s), equal to the CPU's values."""
    from torchtpu.device import platform
    from torchtpu.ops import reductions

    x = torch.randn(3, 37, dtype=torch.float64) * 30
    x[0, 5], x[1, :4] = float("-inf"), float("-inf")
    with platform.tracing_for("tpu"):
        jitted = jax.jit(lambda v: reductions.logcumsumexp(v, 1))
        got = jitted(x.numpy())
        hlo = jitted.lower(x.numpy()).as_text()
    assert "reduce_window" not in hlo
    torch.testing.assert_close(torch.from_numpy(np.array(got)), torch.logcumsumexp(x, 1))


def test_interrupted_exchange_with_the_compiler_starts_a_new_one(check, monkeypatch):
    """An interrupt while the request is written or the reply awaited (Ctrl-C, `timeout -s INT`, a
    test's time limit) ends that compiler process: a half-written request had left both processes waiting
    on each other (a sweep hung), an unread reply would have answered the next program."""
    torch.sin(torch.randn(_fresh_shape()).to("tpu"))
    child = tpu_check._child.proc
    real_send = tpu_check._Child._send

    def interrupted(self, message):
        self.proc.stdin.write(b"\0\0\0")  # part of a length, as a write cut short leaves it
        raise KeyboardInterrupt

    monkeypatch.setattr(tpu_check._Child, "_send", interrupted)
    with pytest.raises(KeyboardInterrupt):
        torch.cos(torch.randn(_fresh_shape()).to("tpu"))
    assert tpu_check._child.proc is None and child.poll() is not None
    monkeypatch.setattr(tpu_check._Child, "_send", real_send)
    x = torch.randn(_fresh_shape())
    torch.testing.assert_close(torch.tan(x.to("tpu")).cpu(), torch.tan(x))
    assert tpu_check._child.proc is not None and tpu_check._child.proc is not child
    assert check.report().failed == 0, check.report().failures


def test_time_limit_while_awaiting_the_compiler_is_an_interrupt_not_a_dead_compiler(check, monkeypatch):
    """A test's time limit (a SIGALRM handler raising TimeoutError, an OSError) while the reply is
    awaited ends that compiler process and propagates: it had been taken for a dead child, whose exit
    the check then awaited forever (an upstream test file hung for an hour)."""
    torch.sin(torch.randn(_fresh_shape()).to("tpu"))
    child = tpu_check._child.proc
    real_receive = tpu_check._Child._receive

    def timed_out(self):
        raise TimeoutError("test ran over its time limit")

    monkeypatch.setattr(tpu_check._Child, "_receive", timed_out)
    with pytest.raises(TimeoutError):
        torch.cos(torch.randn(_fresh_shape()).to("tpu"))
    assert tpu_check._child.proc is None and child.poll() is not None
    monkeypatch.setattr(tpu_check._Child, "_receive", real_receive)
    x = torch.randn(_fresh_shape())
    torch.testing.assert_close(torch.tan(x.to("tpu")).cpu(), torch.tan(x))
    assert check.report().failed == 0, check.report().failures


def test_nonzero_indices_match_jax_and_have_no_64_bit_divide():
    """The data-dependent helpers' nonzero (masked_select, nonzero, unique, nonzero_static) counts and
    unravels positions in int32: JAX's form divides int64 positions, which XLA:TPU took ~10x as long to
    compile (a bfloat16 masked_select: 38 s against 4 s). The same values as jnp.nonzero, padding included."""
    from torchtpu.ops.reductions import nonzero_indices

    torch.zeros(1, device="tpu")  # (JAX's 64-bit types on, as at any first use)
    g = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    cases = [((3, 4, 5), 0.3, 1, None), ((3, 4, 5), 0.3, 70, None), ((3, 4, 5), 0.3, 70, -1), ((2, 7), 0.0, 3, 5)]
    for shape, p, size, fill in cases:
        vals = np.where(g.random(shape) < p, g.standard_normal(shape), 0.0).astype(np.float32)
        got = jax.jit(lambda x, s=size, f=fill: nonzero_indices(x, s, f))(vals)
        for gi, wi in zip(got, np.nonzero(vals)):  # (JAX's padding: the zero index, or fill_value)
            want = np.concatenate([wi, np.full(size, 0 if fill is None else fill)])[:size]
            assert gi.dtype == jnp.int64
            np.testing.assert_array_equal(np.asarray(gi), want)
    hlo = jax.jit(lambda m, x: x[nonzero_indices(m, 9)[0]]).lower(np.ones(40, bool), np.ones(40, np.float32)).as_text()
    assert not re.search(r"stablehlo\.(divide|remainder).*i64", hlo), hlo
