"""torch.tpu.profiler and torch.profiler.profile on tpu work: an XLA trace with PyTorch op names."""

from __future__ import annotations

import glob
import gzip
import json
import os

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from torchtpu.profiling import TpuProfilerConfig


def _event_names(run_dir):
    traces = glob.glob(os.path.join(run_dir, "plugins", "profile", "*", "*.trace.json.gz"))
    assert traces, os.listdir(run_dir)
    names = set()
    for path in traces:
        with gzip.open(path) as trace:
            names |= {e.get("name") for e in json.load(trace)["traceEvents"]}
    return traces, names


def test_trace_is_written_with_op_names(tmp_path):
    a = torch.randn(32, 16, device="tpu")
    b = torch.randn(16, 8, device="tpu")
    config = TpuProfilerConfig(run_dir=tmp_path, worker_rank="3")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=config) as prof:
        c = torch.relu(a @ b).sum()
        c.item()
    assert prof.tpu_trace_dir == str(tmp_path)
    traces, names = _event_names(str(tmp_path))
    assert any(os.path.basename(t).endswith("_3.trace.json.gz") for t in traces)
    assert glob.glob(os.path.join(tmp_path, "plugins", "profile", "*", "*_3.xplane.pb"))
    assert {"aten::mm", "aten::relu", "aten::sum"} <= names
    # PyTorch's own view of the same window is intact
    assert "aten::mm" in {e.key for e in prof.key_averages()}
    torch.testing.assert_close(c.cpu(), torch.relu(a.cpu() @ b.cpu()).sum())


def test_private_use1_activity_does_not_fail_and_annotates_only_while_profiling(tmp_path, monkeypatch):
    from torchtpu import profiling

    monkeypatch.setattr(profiling, "DEFAULT_RUN_DIR", str(tmp_path))
    x = torch.randn(8, 8, device="tpu")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        y = (x * 2).sum().item()
    assert y == pytest.approx((x.cpu() * 2).sum().item(), rel=1e-5)
    assert "aten::mul" in {e.key for e in prof.key_averages()}
    assert "aten::mul" in _event_names(str(tmp_path))[1]
    assert torch._C._len_torch_dispatch_stack() == 0  # no annotation mode left behind
    with profile(activities=[ProfilerActivity.CPU]):  # CPU only: no device trace
        (x + 1).sum().item()
    assert len(glob.glob(os.path.join(tmp_path, "plugins", "profile", "*"))) == 1


def test_config_signature_and_errors():
    import inspect

    params = inspect.signature(TpuProfilerConfig).parameters
    assert list(params) == [
        "host_tracer_level",
        "device_tracer_level",
        "python_tracer_level",
        "run_dir",
        "worker_rank",
        "experimental_options",
        "check_experimental_options",
    ]
    assert all(p.kind is p.KEYWORD_ONLY for p in params.values())
    assert isinstance(TpuProfilerConfig(), torch.profiler._ExperimentalConfig)
    with pytest.raises(TypeError, match="worker_rank must be a string"):
        TpuProfilerConfig(worker_rank=1)
    with pytest.raises(ValueError, match="clashes"):
        TpuProfilerConfig(experimental_options={"run_dir": "x"})
    with pytest.raises(ValueError, match="host_tracer_level"):
        TpuProfilerConfig(host_tracer_level=7)


def test_public_name():
    profiler = pytest.importorskip("torch.tpu.profiler")
    assert profiler.TpuProfilerConfig is TpuProfilerConfig and profiler.__all__ == ["TpuProfilerConfig"]


def test_profiling_changes_no_result(tmp_path):
    config = TpuProfilerConfig(run_dir=tmp_path)
    compiled = torch.compile(lambda x: torch.sin(x) * 2 + 1)

    def work():
        torch.manual_seed(0)
        x = torch.randn(16, device="tpu")
        return [t.cpu() for t in (x, torch.nn.functional.dropout(x, 0.5), compiled(x))]

    plain = work()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=config):
        profiled = work()
    for a, b in zip(plain, profiled):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(plain[2], torch.sin(plain[0]) * 2 + 1)
