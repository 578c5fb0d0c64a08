"""torchtpu.distributed.api (the names of torch.tpu.distributed), in one process."""
import os

import pytest
import torch

from torchtpu.distributed import api


def test_all_names():
    assert api.__all__ == ["set_tpu_launch_env", "topology_aware_mesh", "spmd_safe"]


def test_set_tpu_launch_env(monkeypatch):
    for k in ("TORCHTPU_NNODES", "TORCHTPU_NPROC_PER_NODE", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(torch.multiprocessing, "set_start_method", lambda *a, **k: None)
    api.set_tpu_launch_env(nproc_per_node=2)
    assert os.environ["TORCHTPU_NNODES"] == "1" and os.environ["TORCHTPU_NPROC_PER_NODE"] == "2"
    api.set_tpu_launch_env(nproc_per_node=4)       # never overwrites
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


def test_joining_after_the_device_started_raises_clearly():
    import datetime
    import torch.distributed as dist
    from torchtpu.distributed import process_group
    torch.ones(1, device="tpu").cpu()    # the device is up, for one process
    with pytest.raises(RuntimeError, match="call init_process_group before the first tpu tensor"):
        process_group._ensure_joined(dist.HashStore(), 0, 2, [0, 1], datetime.timedelta(seconds=5))
