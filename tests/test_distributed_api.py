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
