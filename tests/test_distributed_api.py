"""torchtpu.distributed.api (the names of torch.tpu.distributed), in one process."""

import os

import pytest
import torch

from torchtpu.distributed import api


def test_all_names():
    assert sorted(api.__all__) == ["set_tpu_launch_env", "spmd_safe", "topology_aware_mesh"]


def test_set_tpu_launch_env(monkeypatch):
    for k in ("TORCHTPU_NNODES", "TORCHTPU_NPROC_PER_NODE", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(torch.multiprocessing, "set_start_method", lambda *a, **k: None)
    api.set_tpu_launch_env(nproc_per_node=2)
    assert os.environ["TORCHTPU_NNODES"] == "1" and os.environ["TORCHTPU_NPROC_PER_NODE"] == "2"
    api.set_tpu_launch_env(nproc_per_node=4)  # never overwrites
    assert os.environ["TORCHTPU_NPROC_PER_NODE"] == "2"
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "h0,h1")
    with pytest.raises(ValueError, match="TPU_WORKER_HOSTNAMES lists 2 hosts"):
        api.set_tpu_launch_env(nnodes=3)
    with pytest.raises(ValueError, match="nproc_per_node"):
        api.set_tpu_launch_env(nproc_per_node=0)


def test_spmd_safe_wraps():
    @api.spmd_safe
    def f(x, *, k=1):
        """doc"""
        assert api.in_spmd_safe()
        return x + k

    assert f(1, k=2) == 3 and f.__name__ == "f" and f.__doc__ == "doc"
    assert not api.in_spmd_safe()
    with pytest.raises(TypeError):
        api.spmd_safe(3)


def test_topology_aware_mesh_needs_a_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        api.topology_aware_mesh("tpu", (1,))


def test_public_facade():
    tdist = pytest.importorskip("torch.tpu.distributed")
    assert tdist.topology_aware_mesh is api.topology_aware_mesh
    assert tdist.set_tpu_launch_env is api.set_tpu_launch_env and tdist.spmd_safe is api.spmd_safe


def test_single_process_group_in_process():
    """A world of one, in this process: every collective is the identity, on the device."""
    import torch.distributed as dist
    from torch.testing import assert_close

    from torchtpu.distributed import collectives

    dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert dist.get_backend() == "tpu_dist"
        x = torch.randn(3, 4)
        t = x.to("tpu")
        calls = collectives.calls()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        assert_close(t.cpu(), x)
        out = torch.empty(3, 4, device="tpu")
        dist.all_gather_into_tensor(out, t)
        assert_close(out.cpu(), x)
        dist.reduce_scatter_tensor(out, t * 2)
        assert_close(out.cpu(), x * 2)
        o = torch.empty(3, 4, device="tpu")
        dist.all_to_all_single(o, t, [3], [3])
        assert_close(o.cpu(), x)
        assert collectives.calls() > calls
        with pytest.raises(ValueError, match="all_gather_into_tensor"):
            dist.all_gather_into_tensor(torch.empty(5, device="tpu"), t)
    finally:
        dist.destroy_process_group()


def test_reduce_ops_gloo_refuses_raise_its_error_type():
    """A bitwise ReduceOp of floats and an average of integers: RuntimeError on tpu as from gloo (the
    same group's CPU tensors), before any collective runs."""
    import torch.distributed as dist

    dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=1)
    try:
        cases = [(op, torch.float32, "non-integral") for op in ("BAND", "BOR", "BXOR")]
        cases += [("AVG", torch.int64, "AVG"), ("AVG", torch.bool, "AVG")]
        for op, dtype, words in cases:
            x = torch.ones(3, dtype=dtype)
            with pytest.raises(RuntimeError):
                dist.all_reduce(x, op=getattr(dist.ReduceOp, op))  # gloo's
            with pytest.raises(RuntimeError, match=words):
                dist.all_reduce(x.to("tpu"), op=getattr(dist.ReduceOp, op))
            with pytest.raises(RuntimeError, match=words):
                dist.reduce_scatter_tensor(
                    torch.empty(3, dtype=dtype, device="tpu"), x.to("tpu"), op=getattr(dist.ReduceOp, op)
                )
        x = torch.tensor([5, -3], device="tpu")
        dist.all_reduce(x, op=dist.ReduceOp.BXOR)  # integers: fine
        assert x.tolist() == [5, -3]
    finally:
        dist.destroy_process_group()


def test_joining_after_the_device_started_raises_clearly():
    import datetime

    import torch.distributed as dist

    from torchtpu.distributed import process_group

    torch.ones(1, device="tpu").cpu()  # the device is up, for one process
    with pytest.raises(RuntimeError, match="call init_process_group before the first tpu tensor"):
        process_group._ensure_joined(dist.HashStore(), 0, 2, [0, 1], datetime.timedelta(seconds=5))


def test_compiled_functional_collectives_world_of_one():
    """A world of one, in this process: a compiled graph with functional collectives runs as one
    SPMD executable (no fallback warning, no eager collective), with the identity's values."""
    import warnings

    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.testing import assert_close

    from torchtpu.distributed import collectives, compiled

    dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=1)
    try:
        W = dist.group.WORLD

        def f(t):
            s = funcol.all_reduce(t * 2, "avg", W)
            g = funcol.all_gather_tensor(t, 0, W)
            return s + 1, funcol.reduce_scatter_tensor(g, "max", 0, W), funcol.broadcast(t, 0, W)

        cf = torch.compile(f, backend="tpu", fullgraph=True)
        for dtype in (torch.float32, torch.bfloat16, torch.int64):
            x = (torch.randn(4, 3) * 10).to(dtype)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # the op-by-op fallback warns
                cf(x.to("tpu"))
                before = (compiled.compiles(), compiled.calls(), collectives.calls())
                s, rs, b = cf(x.to("tpu"))
            assert (compiled.compiles(), compiled.calls(), collectives.calls()) == (before[0], before[1] + 1, before[2])
            assert_close(s.cpu(), x * 2 + 1)
            assert_close(rs.cpu(), x)
            assert_close(b.cpu(), x)
    finally:
        dist.destroy_process_group()
