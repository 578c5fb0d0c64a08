"""One rank of a multi-process test of torchtpu.distributed's process groups (run by
tests/test_distributed.py): every collective, subgroups, DDP, failure modes, multi-host start-up.

`python distributed_worker.py SCENARIO` with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT). Each scenario checks its results against the CPU with assert_close and exits non-zero
on the first failure; every rank computes all ranks' inputs from fixed seeds, so the expected values
are plain CPU arithmetic. The scenario registry and those helpers are shared with
tests/distributed_spmd_worker.py (DTensor, compiled SPMD, FSDP) and tests/distributed_hf_worker.py.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.testing import assert_close

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def make(rank, shape, dtype, salt=0):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def everyone(shape, dtype, salt=0):
    return [make(r, shape, dtype, salt) for r in range(WORLD)]


def reduce_cpu(xs, op):
    if op in ("BAND", "BOR", "BXOR"):
        out = xs[0]
        for x in xs[1:]:
            out = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op](out, x)
        return out
    if xs[0].dtype == torch.bool:
        s = torch.stack([x.to(torch.uint8) for x in xs])
        return (s.amax(0) if op in ("SUM", "MAX") else s.amin(0)).bool()
    s = torch.stack([x.double() if x.is_floating_point() else x for x in xs])
    out = {
        "SUM": lambda: s.sum(0),
        "AVG": lambda: s.mean(0),
        "MAX": lambda: s.amax(0),
        "MIN": lambda: s.amin(0),
        "PRODUCT": lambda: s.prod(0),
    }[op]()
    return out.to(xs[0].dtype)


def tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype in (torch.bfloat16, torch.float16) else {}


DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.bool]


@scenario
def collectives():
    dist.init_process_group()  # no backend: the default for the "tpu" accelerator
    assert dist.get_world_size() == WORLD and dist.get_rank() == RANK
    assert torch.tpu.device_count() == 1 and torch.accelerator.current_device_index() == 0
    dev = torch.device("tpu", 0)
    for dtype in DTYPES:
        shape = (3, 5)
        xs = everyone(shape, dtype)
        ops = ["SUM", "MAX", "MIN"] if dtype == torch.bool else ["SUM", "AVG", "MAX", "MIN", "PRODUCT"]
        if not dtype.is_floating_point:
            ops = [o for o in ops if o != "AVG"] + ["BAND", "BOR", "BXOR"]
        for op in ops:
            x = xs[RANK].to(dev)
            dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
            want = reduce_cpu([t.double() if dtype.is_floating_point else t for t in xs], op)
            assert_close(x.cpu(), want.to(dtype), **tol(dtype), msg=f"all_reduce {op} {dtype}")
        if dtype == torch.int64:  # past 32 bits (the TPU's MAX/MIN go through 32-bit words); same programs
            big = [x * (2**35 + 3) - 7 for x in xs]
            for op in ("SUM", "MAX", "MIN"):
                x = big[RANK].to(dev)
                dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
                assert_close(x.cpu(), reduce_cpu(big, op), rtol=0, atol=0, msg=f"all_reduce {op} of large int64")
        # all_gather (list and into one tensor)
        outs = [torch.empty(shape, dtype=dtype, device=dev) for _ in range(WORLD)]
        dist.all_gather(outs, xs[RANK].to(dev))
        for o, want in zip(outs, xs):
            assert_close(o.cpu(), want, msg=f"all_gather {dtype}")
        big = torch.empty((WORLD * 3, 5), dtype=dtype, device=dev)
        dist.all_gather_into_tensor(big, xs[RANK].to(dev))
        assert_close(big.cpu(), torch.cat(xs), msg=f"all_gather_into_tensor {dtype}")
        # broadcast from the last rank: exact bits
        b = xs[RANK].to(dev)
        dist.broadcast(b, src=WORLD - 1)
        assert_close(b.cpu(), xs[WORLD - 1], rtol=0, atol=0, msg=f"broadcast {dtype}")
        # all_to_all_single (even)
        ins = everyone((WORLD * 2, 3), dtype, salt=7)
        out = torch.empty((WORLD * 2, 3), dtype=dtype, device=dev)
        dist.all_to_all_single(out, ins[RANK].to(dev))
        assert_close(
            out.cpu(),
            torch.cat([ins[r][2 * RANK : 2 * RANK + 2] for r in range(WORLD)]),
            msg=f"all_to_all_single {dtype}",
        )
        if dtype == torch.bool:
            continue
        # reduce_scatter_tensor and the list form
        ins = everyone((WORLD * 4, 2), dtype, salt=3)
        o = torch.empty((4, 2), dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(o, ins[RANK].to(dev))
        want = reduce_cpu(ins, "SUM")[4 * RANK : 4 * RANK + 4]
        assert_close(o.cpu(), want, **tol(dtype), msg=f"reduce_scatter_tensor {dtype}")
        o2 = torch.empty((4, 2), dtype=dtype, device=dev)
        dist.reduce_scatter(o2, list(ins[RANK].to(dev).chunk(WORLD)), op=dist.ReduceOp.MAX)
        want = reduce_cpu(ins, "MAX")[4 * RANK : 4 * RANK + 4]
        assert_close(o2.cpu(), want, msg=f"reduce_scatter MAX {dtype}")

    dist.destroy_process_group()


@scenario
def collectives_more():
    from torchtpu.distributed import collectives as coll

    dist.init_process_group("tpu")
    dev = torch.device("tpu", 0)
    # views: a transposed slice all-reduced in place changes its base
    base = make(RANK, (4, 6), torch.float32).to(dev)
    view = base.t()[1:4]
    dist.all_reduce(view)
    want = make(RANK, (4, 6), torch.float32)
    want.t()[1:4] = sum(make(r, (4, 6), torch.float32).t()[1:4] for r in range(WORLD))
    assert_close(base.cpu(), want, msg="all_reduce of a view")

    # async_op: Work objects
    x = make(RANK, (8,), torch.float32).to(dev)
    work = dist.all_reduce(x, async_op=True)
    assert work.wait()
    assert work.is_completed()
    assert_close(x.cpu(), sum(everyone((8,), torch.float32)))
    fut = dist.all_reduce(x, async_op=True).get_future()
    assert_close(fut.wait()[0].cpu(), 2 * sum(everyone((8,), torch.float32)))

    # gather / scatter / reduce
    x = make(RANK, (5,), torch.float32).to(dev)
    gl = [torch.empty(5, device=dev) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(x, gl, dst=0)
    if RANK == 0:
        for o, want in zip(gl, everyone((5,), torch.float32)):
            assert_close(o.cpu(), want)
    chunks = [make(100 + r, (3,), torch.float32).to(dev) for r in range(WORLD)] if RANK == 1 else None
    o = torch.empty(3, device=dev)
    dist.scatter(o, chunks, src=1)
    assert_close(o.cpu(), make(100 + RANK, (3,), torch.float32), rtol=0, atol=0)
    x = make(RANK, (5,), torch.float32).to(dev)
    dist.reduce(x, dst=1)
    if RANK == 1:
        assert_close(x.cpu(), sum(everyone((5,), torch.float32)))

    # send / recv and isend / irecv around a ring
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    t = make(RANK, (6,), torch.bfloat16).to(dev)
    r = torch.empty(6, dtype=torch.bfloat16, device=dev)
    if RANK % 2 == 0:
        dist.send(t, nxt)
        dist.recv(r, prv)
    else:
        dist.recv(r, prv)
        dist.send(t, nxt)
    assert_close(r.cpu(), make(prv, (6,), torch.bfloat16), rtol=0, atol=0)
    if RANK % 2 == 0:
        w = dist.isend(t, nxt)
        w2 = dist.irecv(r, prv)
    else:
        w2 = dist.irecv(r, prv)
        w = dist.isend(t, nxt)
    w.wait()
    w2.wait()
    assert_close(r.cpu(), make(prv, (6,), torch.bfloat16), rtol=0, atol=0)

    # CPU tensors in the same group go through gloo
    c = make(RANK, (4,), torch.float32)
    dist.all_reduce(c)
    assert_close(c, sum(everyone((4,), torch.float32)))
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK})
    assert objs == [{"rank": r} for r in range(WORLD)]

    # one executable per (op, shape, dtype, group): repeating calls compiles nothing
    x = make(RANK, (16, 4), torch.float32).to(dev)
    dist.all_reduce(x)
    before = coll.compiles()
    for _ in range(5):
        dist.all_reduce(x)
        dist.all_gather_into_tensor(torch.empty(WORLD * 16, 4, device=dev), x)
        dist.broadcast(x, src=0)
    assert coll.compiles() == before + 2, (coll.compiles(), before)  # all_gather + broadcast, once each
    dist.barrier()
    dist.destroy_process_group()


@scenario
def subgroups():
    dist.init_process_group("tpu_dist")
    dev = torch.device("tpu", 0)
    assert WORLD == 4
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = pairs[RANK // 2]
    x = make(RANK, (7,), torch.float32).to(dev)
    dist.all_reduce(x, group=mine)
    lo = RANK // 2 * 2
    assert_close(x.cpu(), make(lo, (7,), torch.float32) + make(lo + 1, (7,), torch.float32))
    # broadcast's src is a global rank
    y = make(RANK, (3,), torch.int64).to(dev)
    dist.broadcast(y, src=lo + 1, group=mine)
    assert_close(y.cpu(), make(lo + 1, (3,), torch.int64))

    # a 2x2 device mesh: reduce along each dimension
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for _dim, name in enumerate(("dp", "tp")):
        grp = mesh.get_group(name)
        ranks = dist.get_process_group_ranks(grp)
        z = make(RANK, (2, 3), torch.float32).to(dev)
        dist.all_reduce(z, group=grp)
        assert_close(z.cpu(), sum(make(r, (2, 3), torch.float32) for r in ranks), msg=name)

    # topology_aware_mesh (torch.tpu.distributed): on XLA:CPU the layout is rank order
    from torchtpu.distributed.api import spmd_safe, topology_aware_mesh

    tmesh = topology_aware_mesh("tpu", (2, 2), mesh_dim_names=("a", "b"))
    assert tmesh.mesh.tolist() == [[0, 1], [2, 3]], tmesh.mesh
    z = make(RANK, (5,), torch.float32).to(dev)

    @spmd_safe
    def reduce_b(t):
        dist.all_reduce(t, group=tmesh.get_group("b"))
        return t

    reduce_b(z)
    assert_close(z.cpu(), make(lo, (5,), torch.float32) + make(lo + 1, (5,), torch.float32))

    # uneven all_to_all_single: rank i sends (i + j + 1) rows to rank j
    ins = [[i + j + 1 for j in range(WORLD)] for i in range(WORLD)]
    data = [make(i, (sum(ins[i]), 2), torch.float32) for i in range(WORLD)]
    out_splits = [ins[j][RANK] for j in range(WORLD)]
    out = torch.empty(sum(out_splits), 2, device=dev)
    dist.all_to_all_single(out, data[RANK].to(dev), out_splits, ins[RANK])
    want = torch.cat([data[j].split(ins[j])[RANK] for j in range(WORLD)])
    assert_close(out.cpu(), want)
    # list all_to_all with different sizes
    ins_l = [make(10 * RANK + j, (RANK + j + 1,), torch.float32).to(dev) for j in range(WORLD)]
    outs_l = [torch.empty(j + RANK + 1, device=dev) for j in range(WORLD)]
    dist.all_to_all(outs_l, ins_l)
    for j in range(WORLD):
        assert_close(outs_l[j].cpu(), make(10 * j + RANK, (j + RANK + 1,), torch.float32))
    dist.destroy_process_group()


@scenario
def backend_strings():
    """init_process_group("cpu:gloo,tpu:tpu_dist") over an explicit tcp:// store, without
    torchrun's coordinator variable: the JAX coordinator comes through the c10d store."""
    os.environ.pop("TORCHTPU_COORDINATOR_ADDRESS", None)
    addr, port = os.environ.pop("MASTER_ADDR"), os.environ.pop("MASTER_PORT")
    rank, world = int(os.environ.pop("RANK")), int(os.environ.pop("WORLD_SIZE"))
    dist.init_process_group("cpu:gloo,tpu:tpu_dist", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
    x = make(rank, (4,), torch.float32).to("tpu")
    dist.all_reduce(x)
    assert_close(x.cpu(), sum(make(r, (4,), torch.float32) for r in range(world)))
    c = make(rank, (4,), torch.float32)
    dist.all_reduce(c)
    assert_close(c, sum(make(r, (4,), torch.float32) for r in range(world)))
    dist.destroy_process_group()


@scenario
def mismatch():
    dist.init_process_group("tpu_dist", timeout=__import__("datetime").timedelta(seconds=20))
    x = torch.ones(4 + RANK, device="tpu")
    try:
        dist.all_reduce(x)
    except RuntimeError as e:
        assert "mismatched collective" in str(e), e
        print("MISMATCH-RAISED", flush=True)
    else:
        raise AssertionError("a collective with different shapes across ranks did not raise")


@scenario
def reinit():
    """destroy_process_group, then init_process_group again while something still holds the first
    group's store (a model's DeviceMesh would): env:// reuses that TCPStore server, so the first group's
    signature keys are still in it. The new group's first collective, of another shape than the old
    one's, must not read them (it raised "mismatched collective" against the old signature)."""
    dist.init_process_group()
    old_store = dist.distributed_c10d._get_default_store()
    x = make(RANK, (12,), torch.float32).to("tpu")
    dist.all_reduce(x)
    assert_close(x.cpu(), sum(make(r, (12,), torch.float32) for r in range(WORLD)))
    dist.destroy_process_group()
    dist.init_process_group()
    for shape in ((5,), (12,)):
        y = make(RANK, shape, torch.float32, salt=1).to("tpu")
        dist.all_reduce(y)
        assert_close(y.cpu(), sum(make(r, shape, torch.float32, salt=1) for r in range(WORLD)))
    dist.destroy_process_group()
    del old_store


@scenario
def straggler():
    """Rank 1 stops entering collectives: rank 0 raises within the group's timeout, both for a
    collective it has run before (the XLA launch waits with the timeout) and for a new one (the
    ranks' signature check through the store times out)."""
    import datetime
    import time

    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=5))
    dist.all_reduce(torch.ones(3, device="tpu"))
    torch.tpu.synchronize()
    if RANK == 1:
        time.sleep(40)
        os._exit(0)
    for shape in (3, 7):
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(shape, device="tpu"))
        except RuntimeError as e:
            assert time.monotonic() - t0 < 20
            print("TIMEOUT-RAISED", e, flush=True)
        else:
            raise AssertionError("no error")
    os._exit(0)


@scenario
def dies():
    """Rank 1 dies after joining: rank 0's next collective raises within the group's timeout."""
    import datetime
    import time

    dist.init_process_group("tpu_dist", timeout=datetime.timedelta(seconds=5))
    x = torch.ones(3, device="tpu")
    dist.all_reduce(x)  # both alive: works
    torch.tpu.synchronize()
    if RANK == 1:
        os._exit(3)
    time.sleep(1)
    for shape in (3, 5):  # a collective already compiled (XLA's transport notices), and a new one
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(shape, device="tpu"))
        except RuntimeError as e:
            assert time.monotonic() - t0 < 20
            print("DEAD-RANK-RAISED", e, flush=True)
        else:
            raise AssertionError("no error")
    os._exit(0)  # (a normal exit would wait for the dead rank at JAX's shutdown barrier)


@scenario
def ddp():
    """DDP on WORLD ranks, each on its slice of the batch, equals one process on the whole batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    reference = __import__("copy").deepcopy(model)
    ddp = DDP(model.to("tpu"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        xb, yb = torch.randn(4 * WORLD, 8, generator=g), torch.randn(4 * WORLD, 4, generator=g)
        mine = slice(4 * RANK, 4 * RANK + 4)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(xb[mine].to("tpu")), yb[mine].to("tpu")).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(xb), yb).backward()
        ref_opt.step()
    for (n, p), q in zip(ddp.module.named_parameters(), reference.parameters()):
        assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-5, msg=n)
    dist.destroy_process_group()


@scenario
def multihost():
    """Under torchrun --nnodes 2 (two agents on this machine, c10d rendezvous): the JAX coordinator
    comes from torchrun's MASTER_ADDR/MASTER_PORT; every rank sees one device as tpu:0."""
    assert "TORCHTPU_COORDINATOR_ADDRESS" not in os.environ
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    x = make(rank, (6,), torch.float32).to("tpu")  # the first tpu op joins the JAX job
    import jax

    assert jax.process_count() == world and jax.process_index() == rank
    assert torch.tpu.device_count() == 1
    dist.init_process_group()
    dist.all_reduce(x)
    assert_close(x.cpu(), sum(make(r, (6,), torch.float32) for r in range(world)))
    mesh = __import__("torch.distributed.device_mesh", fromlist=["x"]).init_device_mesh(
        "tpu", (2, world // 2), mesh_dim_names=("node", "local")
    )
    y = make(rank, (3,), torch.float32).to("tpu")
    grp = mesh.get_group("local")
    dist.all_reduce(y, group=grp)
    assert_close(y.cpu(), sum(make(r, (3,), torch.float32) for r in dist.get_process_group_ranks(grp)))
    dist.destroy_process_group()
    print(f"OK multihost rank {rank}", flush=True)


def run_scenario(name):
    """Run one scenario; "OK name rank R" says it passed. One scenario per launch: when scenarios
    shared a launch, a re-created default group read the old group's signatures (fixed: `reinit`) and
    one run also hit a gloo read timeout in the scenario after ddp, not explained yet."""
    SCENARIOS[name]()
    print(f"OK {name} rank {RANK}", flush=True)


if __name__ == "__main__":
    run_scenario(sys.argv[1])
