"""One rank of a multi-process test of DTensor, compiled SPMD collectives and FSDP on "tpu" (run by
tests/test_distributed_spmd.py).

`python distributed_spmd_worker.py SCENARIO` under torchrun's environment, like tests/distributed_worker.py,
whose scenario registry and CPU-arithmetic helpers it shares: every rank checks its results against the
unsharded model or plain CPU arithmetic on inputs all ranks compute from fixed seeds.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from distributed_worker import RANK, WORLD, everyone, make, run_scenario, scenario, tol
from torch.testing import assert_close


@scenario
def dtensor():
    """DTensor on a 1-D and a 2-D mesh: distribute_tensor, redistribute, Colwise/Rowwise."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    dist.init_process_group()
    mesh = init_device_mesh("tpu", (WORLD,))
    full = make(0, (4 * WORLD, 6), torch.float32)
    d = distribute_tensor(full.to("tpu"), mesh, [Shard(0)])
    assert d.to_local().shape == (4, 6)
    assert_close(d.to_local().cpu(), full[4 * RANK : 4 * RANK + 4])
    assert_close(d.full_tensor().cpu(), full)
    assert_close(d.redistribute(mesh, [Replicate()]).to_local().cpu(), full)
    assert_close((d * 2).sum().full_tensor().cpu(), (full * 2).sum())

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8 * WORLD), torch.nn.ReLU(), torch.nn.Linear(8 * WORLD, 5))
    reference = __import__("copy").deepcopy(model)
    tp = parallelize_module(model.to("tpu"), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = make(5, (3, 6), torch.float32)
    out = tp(x.to("tpu"))
    assert_close(out.cpu(), reference(x), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    reference(x).sum().backward()
    assert_close(tp[0].weight.grad.full_tensor().cpu(), reference[0].weight.grad, rtol=1e-5, atol=1e-5)
    from torchtpu.distributed import collectives

    assert collectives.calls() >= 5, collectives.calls()  # the collectives ran as XLA programs

    dist.destroy_process_group()


def _one_executable(fn, *args):
    """Call compiled `fn` once more (it ran before) and check that it ran as one SPMD executable:
    no new compile, no eager collective, no per-op fallback warning; returns its result."""
    import warnings

    from torchtpu import metrics
    from torchtpu.distributed import collectives, compiled

    before = (compiled.compiles(), compiled.calls(), collectives.calls(), metrics()["compiled_xla_compiles"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the eager fallback warns
        out = fn(*args)
    after = (compiled.compiles(), compiled.calls(), collectives.calls(), metrics()["compiled_xla_compiles"])
    assert after == (before[0], before[1] + 1, before[2], before[3]), (before, after)
    return out


@scenario
def compiled_collectives():
    """Functional collectives under torch.compile(backend="tpu", fullgraph=True) lower into ONE
    executable (an SPMD program over the process mesh): same values as eager and the CPU, no graph
    break, no eager collective, no fallback; a mismatch across ranks raises."""
    import warnings

    import torch.distributed._functional_collectives as funcol

    dist.init_process_group()
    W = dist.group.WORLD

    def f(t, u):
        s = funcol.all_reduce(t * 2, "sum", W)
        m = funcol.all_reduce(t, "max", W)
        g = funcol.all_gather_tensor(t, 0, W)
        rs = funcol.reduce_scatter_tensor(g * 3, "sum", 0, W)
        a2a = funcol.all_to_all_single(g, None, None, W)
        b = funcol.broadcast(u, 1, W)
        return s + 1, m, g, rs, a2a, b

    cf = torch.compile(f, backend="tpu", fullgraph=True)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        xs, us = everyone((4, 3), dtype, salt=1), everyone((5,), dtype, salt=2)
        x, u = xs[RANK].to("tpu"), us[RANK].to("tpu")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = [o.cpu() for o in cf(x, u)]  # compiles the SPMD executable
        got = [o.cpu() for o in _one_executable(cf, x, u)]  # and runs it again, alone
        eager = [o.cpu() for o in f(x, u)]  # the eager functional collectives
        whole = torch.cat(xs)
        want = [
            sum(t * 2 for t in xs) + 1,
            torch.stack(xs).amax(0),
            whole,
            (whole * 3 * WORLD)[4 * RANK : 4 * RANK + 4],
            torch.cat([whole[4 * RANK : 4 * RANK + 4]] * WORLD),  # block RANK of every rank's g
            us[1],
        ]
        for i, (g_, e_, w_) in enumerate(zip(got, eager, want)):
            assert_close(g_, w_.to(dtype), **tol(dtype), msg=f"output {i} {dtype} vs CPU")
            assert_close(g_, e_, **tol(dtype), msg=f"output {i} {dtype} vs eager")

    # all_to_all_single with uneven splits (graph constants): rank r sends 2 + (r * j) % 3 rows to
    # rank j, so rank 0's splits are even and rank 1's are not (both must exchange one block size)
    def a2a(t, out_splits, in_splits):
        return funcol.all_to_all_single(t, out_splits, in_splits, W) * 1

    ca2a = torch.compile(a2a, backend="tpu", fullgraph=True)
    ins = [[2 + (r * j) % 3 for j in range(WORLD)] for r in range(WORLD)]
    for dtype in (torch.float32,):  # it moves rows: the dtype does not matter (bits, as above)
        xs = [make(r, (sum(ins[r]), 2), dtype, salt=3) for r in range(WORLD)]
        want = torch.cat([xs[j][sum(ins[j][:RANK]) : sum(ins[j][: RANK + 1])] for j in range(WORLD)])
        outs_ = [ins[j][RANK] for j in range(WORLD)]
        x = xs[RANK].to("tpu")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ca2a(x, outs_, ins[RANK])
        got = _one_executable(ca2a, x, outs_, ins[RANK]).cpu()
        assert_close(got, want, msg=f"uneven all_to_all_single {dtype}")
        assert_close(got, a2a(x, outs_, ins[RANK]).cpu(), msg=f"uneven all_to_all_single {dtype} vs eager")

    # no graph break, one graph
    x = make(RANK, (4, 3), torch.float32).to("tpu")
    explained = torch._dynamo.explain(f)(x, make(RANK, (5,), torch.float32).to("tpu"))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained

    # a rank that traced different collectives raises a clear error instead of hanging XLA
    @torch.compile(backend="tpu", fullgraph=True)
    def g(t):
        return funcol.all_reduce(t, "sum", W)

    try:
        g(torch.ones(3 + RANK, device="tpu"))
    except RuntimeError as e:
        assert "mismatched collective" in str(e), e
    else:
        raise AssertionError("a mismatched compiled collective did not raise")
    dist.destroy_process_group()


@scenario
def compiled_dtensor():
    """DTensor ColwiseParallel then RowwiseParallel, compiled with fullgraph: the inference graph is
    one executable with its all_reduce inside; training (forward and backward graphs, each with a
    collective) matches one process."""
    import warnings

    from torchtpu.distributed import compiled

    dist.init_process_group()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("tpu", (WORLD,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8 * WORLD), torch.nn.ReLU(), torch.nn.Linear(8 * WORLD, 5))
    reference = __import__("copy").deepcopy(model)
    tp = parallelize_module(model.to("tpu"), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    ctp = torch.compile(tp, backend="tpu", fullgraph=True)
    x = make(5, (3, 6), torch.float32)
    with torch.no_grad():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ctp(x.to("tpu"))
        out = _one_executable(ctp, x.to("tpu"))
        assert_close(out.cpu(), reference(x), rtol=1e-5, atol=1e-5)
    before = compiled.compiles()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*runs in eager mode")  # the op-by-op fallback
        # training: the forward graph has the all_reduce, the backward one too (the input's gradient
        # is the sum of the ranks' partial ones, ColwiseParallel's replicated input)
        xt = x.to("tpu").requires_grad_()
        out = ctp(xt)
        out.sum().backward()
    assert compiled.compiles() == before + 2, (before, compiled.compiles())
    xr = x.clone().requires_grad_()
    reference(xr).sum().backward()
    assert_close(xt.grad.cpu(), xr.grad, rtol=1e-5, atol=1e-5)
    assert_close(out.detach().cpu(), reference(x).detach(), rtol=1e-5, atol=1e-5)
    assert_close(tp[0].weight.grad.full_tensor().cpu(), reference[0].weight.grad, rtol=1e-5, atol=1e-5)
    assert_close(tp[2].weight.grad.full_tensor().cpu(), reference[2].weight.grad, rtol=1e-5, atol=1e-5)
    dist.destroy_process_group()


def _sequence_parallel_block(tp_mesh):
    """A norm -> up -> relu -> down block sharded on `tp_mesh` (SequenceParallel norm, Colwise up,
    Rowwise down, sequence dim 1), and its unsharded copy on the CPU."""
    import copy

    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(8)
            self.up = torch.nn.Linear(8, 16)
            self.down = torch.nn.Linear(16, 8)

        def forward(self, x):
            return self.down(torch.relu(self.up(self.norm(x))))

    torch.manual_seed(0)
    block = Block()
    reference = copy.deepcopy(block)
    parallelize_module(
        block.to("tpu"),
        tp_mesh,
        {
            "norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1)),
        },
    )
    return block, reference


@scenario
def compiled_collectives_2d():
    """4 ranks, a 2x2 dp x tp mesh: one compiled graph with collectives over both dimensions runs
    as one executable on a 2-D process mesh; a DTensor block (SequenceParallel + Colwise/Rowwise on
    "tp") compiled with fullgraph matches the unsharded model."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group()
    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    tp_group, dp_group = mesh["tp"].get_group(), mesh["dp"].get_group()

    def f(t):
        s = funcol.all_reduce(t, "sum", tp_group)  # over the ranks of my dp row
        return funcol.all_gather_tensor(s * 2, 0, dp_group), funcol.all_reduce(t, "max", dp_group)

    cf = torch.compile(f, backend="tpu", fullgraph=True)
    xs = everyone((2, 3), torch.float32)
    x = xs[RANK].to("tpu")
    cf(x)
    got = _one_executable(cf, x)
    rank_at = lambda d, t: 2 * d + t
    row_sum = lambda d: xs[rank_at(d, 0)] + xs[rank_at(d, 1)]
    assert_close(got[0].cpu(), torch.cat([row_sum(0) * 2, row_sum(1) * 2]))
    assert_close(got[1].cpu(), torch.maximum(xs[rank_at(0, tp)], xs[rank_at(1, tp)]))

    block, reference = _sequence_parallel_block(mesh["tp"])
    cblock = torch.compile(block, backend="tpu", fullgraph=True)
    x = make(dp, (2, 6, 8), torch.float32)
    with torch.no_grad():
        cblock(x[:, 3 * tp : 3 * tp + 3].to("tpu"))
        out = _one_executable(cblock, x[:, 3 * tp : 3 * tp + 3].to("tpu"))
        assert_close(out.cpu(), reference(x)[:, 3 * tp : 3 * tp + 3], rtol=1e-5, atol=1e-5)
    dist.destroy_process_group()


@scenario
def dtensor_2d():
    """A 2-D data x tensor mesh on 4 ranks: SequenceParallel + Colwise/Rowwise on the "tp" dimension,
    different data per "dp" row; outputs and gradients match the unsharded model."""
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group()
    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()

    block, reference = _sequence_parallel_block(mesh["tp"])
    x = make(dp, (2, 6, 8), torch.float32)  # one batch per dp row, sequence of 6
    local_in = x[:, 3 * tp : 3 * tp + 3]  # this tp rank's half of the sequence
    out = block(local_in.to("tpu"))
    want = reference(x)
    assert_close(out.cpu(), want[:, 3 * tp : 3 * tp + 3], rtol=1e-5, atol=1e-5)
    out.sum().backward()
    want[:, 3 * tp : 3 * tp + 3].sum().backward()  # this rank's share of the loss
    # the tp group's gradient is the sum over its ranks' shares: compare the full (gathered) grads
    g = block.up.weight.grad.full_tensor().cpu()
    shares = [reference.up.weight.grad.clone()]
    dist.all_reduce(shares[0], group=mesh["tp"].get_group())  # CPU tensors: gloo in the same group
    assert_close(g, shares[0], rtol=1e-4, atol=1e-5)
    dist.destroy_process_group()


@scenario
def fsdp():
    """FSDP2 (fully_shard with a MixedPrecisionPolicy) trains like one process on the full batch."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dist.init_process_group()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    reference = __import__("copy").deepcopy(model)
    model.to("tpu")
    policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    for layer in (model[0], model[2]):
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(2):
        g = torch.Generator().manual_seed(step)
        xb, yb = torch.randn(4 * WORLD, 8, generator=g), torch.randn(4 * WORLD, 4, generator=g)
        mine = slice(4 * RANK, 4 * RANK + 4)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb[mine].to("tpu")), yb[mine].to("tpu")).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(xb), yb).backward()
        ref_opt.step()
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        assert_close(p.full_tensor().cpu(), q.detach(), rtol=1e-5, atol=1e-5, msg=n)

    # bfloat16 compute, float32 gradient reduction: within bfloat16 rounding of the fp32 run
    torch.manual_seed(0)
    low = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    fresh = __import__("copy").deepcopy(low)
    fully_shard(low.to("tpu"), mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    xb, yb = torch.randn(4 * WORLD, 8), torch.randn(4 * WORLD, 4)
    dist.broadcast(xb, 0)
    dist.broadcast(yb, 0)
    out = low(xb[4 * RANK : 4 * RANK + 4].to("tpu"))
    assert out.dtype == torch.bfloat16
    torch.nn.functional.mse_loss(out.float(), yb[4 * RANK : 4 * RANK + 4].to("tpu")).backward()
    torch.nn.functional.mse_loss(fresh(xb), yb).backward()
    for (n, p), q in zip(low.named_parameters(), fresh.parameters()):
        assert p.grad.dtype == torch.float32
        assert_close(p.grad.full_tensor().cpu(), q.grad, rtol=5e-2, atol=2e-2, msg=n)

    # distributed checkpoint: save the sharded model, load it into a fresh sharded one
    import torch.distributed.checkpoint as dcp

    path = os.environ["TORCHTPU_TEST_TMP"]
    dcp.save({"model": model.state_dict()}, checkpoint_id=path)
    torch.manual_seed(1)
    other = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to("tpu")
    fully_shard(other)
    state = {"model": other.state_dict()}
    dcp.load(state, checkpoint_id=path)
    other.load_state_dict(state["model"])
    for (n, p), q in zip(other.named_parameters(), reference.parameters()):
        assert p.to_local().device.type == "tpu"
        assert_close(p.full_tensor().cpu(), q.detach(), rtol=1e-5, atol=1e-5, msg=n)
    dist.destroy_process_group()


if __name__ == "__main__":
    run_scenario(sys.argv[1])
