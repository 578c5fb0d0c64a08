"""Appends to a growing tensor go into spare room of a bucketed storage (eager/growing.py): one program
per size bucket instead of one per length, for the append and for ops on the grown tensor's last
positions, with the exact cat's values."""

import pytest
import torch

import torchtpu
from torchtpu.eager import growing


def _compiles():
    return torchtpu.metrics()["eager_compiles"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_a_chain_of_appends_equals_the_cpu_and_compiles_once_per_bucket(dtype):
    torch.manual_seed(0)
    cpu = torch.randn(1, 1, 11, 4) > 0 if dtype == torch.bool else torch.randn(1, 1, 11, 4)
    tpu = cpu.to("tpu")
    steps = []
    for step in range(12):  # lengths 12..23: the exact first link, then buckets 16 and 32
        new = cpu[:, :, step : step + 1] if step % 2 else cpu[:, :, :1]
        cpu = torch.cat([cpu, new], dim=-2)
        before = _compiles()
        tpu = torch.cat([tpu, new.to("tpu")], dim=-2)
        steps.append(_compiles() - before)
        assert tpu.shape == cpu.shape and tpu.is_contiguous()
    torch.testing.assert_close(tpu.cpu(), cpu, rtol=0, atol=0)
    # per bucket: the append that moves into it (13: 16, 17: 32) and its first append inside it
    assert steps[3:5] == [0, 0] and steps[7:] == [0] * 5, steps


def test_ops_on_the_last_positions_compile_once_per_bucket():
    ids = torch.randint(0, 50, (1, 9)).to("tpu")
    ref = ids.cpu()
    eos = torch.tensor([3], device="tpu")
    compiles = []
    dones, lasts = [], []
    for _ in range(6):  # lengths 10..15: bucket 16 from 11 on
        new = torch.randint(0, 50, (1,))
        ref = torch.cat([ref, new[:, None]], dim=-1)
        ids = torch.cat([ids, new.to("tpu")[:, None]], dim=-1)
        before = _compiles()
        dones.append(torch.isin(ids[:, -1], eos))
        lasts.append(ids[:, -1:].clone())
        compiles.append(_compiles() - before)
    assert compiles[2:] == [0] * 4, compiles
    torch.testing.assert_close(torch.stack(dones).cpu(), torch.isin(ref[:, -6:].T, torch.tensor([3])))
    torch.testing.assert_close(torch.cat(lasts, dim=1).cpu(), ref[:, -6:])


def test_a_single_cat_stays_contiguous_and_a_grown_tensor_does_not_alias():
    a, b = torch.randn(1, 12, 3), torch.randn(1, 1, 3)
    first = torch.cat([a.to("tpu"), b.to("tpu")], dim=1)
    assert first.is_contiguous() and first.untyped_storage().nbytes() == first.numel() * 4
    second = torch.cat([first, b.to("tpu")[:, :, :3]], dim=1)  # a chain: room along dim 1
    third = torch.cat([second, torch.cat([b + 1, b], dim=2).to("tpu")[:, :, :3]], dim=1)  # a part of its storage
    assert second.untyped_storage().data_ptr() != third.untyped_storage().data_ptr()
    third[:, -2].fill_(7.0)  # a write to the newest tensor leaves the older ones as they were
    third.add_(1)
    expect = torch.cat([a, b, b], dim=1)
    torch.testing.assert_close(second.cpu(), expect, rtol=0, atol=0)
    torch.testing.assert_close(second.view(-1).cpu(), expect.view(-1), rtol=0, atol=0)
    grown = torch.cat([expect, b + 1], dim=1)
    grown[:, -2] = 7.0
    torch.testing.assert_close(third.cpu(), grown + 1, rtol=0, atol=0)


def test_appends_that_are_not_plain_go_to_the_engine_with_its_errors():
    x = torch.cat([torch.randn(2, 12).to("tpu"), torch.randn(2, 1).to("tpu")], dim=1)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
        torch.cat([x, torch.randn(3, 1).to("tpu")], dim=1)
    mixed = torch.cat([x, torch.ones(2, 1, dtype=torch.float64).to("tpu")], dim=1)  # promotes: the engine's cat
    assert mixed.dtype == torch.float64 and mixed.shape == (2, 14)
    assert growing.bucket(13) == 16 and growing.bucket(17) == 32 and growing.bucket(65) == 80


def test_appends_behind_a_longer_dimension_stay_contiguous_cats():
    """Room behind a dimension of more than one element would make the result non-contiguous (a
    CUDA cat's never is: `.view()` would raise): a batch of token ids grows by exact cats."""
    ids = torch.randint(0, 50, (2, 12))
    tpu = ids.to("tpu")
    for _ in range(6):
        new = torch.randint(0, 50, (2, 1))
        ids = torch.cat([ids, new], dim=-1)
        tpu = torch.cat([tpu, new.to("tpu")], dim=-1)
        assert tpu.is_contiguous() and tpu.stride() == ids.stride()
    torch.testing.assert_close(tpu.view(-1).cpu(), ids.view(-1), rtol=0, atol=0)


def _room(t, axis=-2):
    b = growing.room_of(t)
    return None if b is None else (b.array.shape[axis], b.length)


def test_a_cache_of_several_heads_grows_in_room_that_pytorch_never_sees():
    """(B, H, L, D) keys appended along L, reordered by beam (`index_select(0, ...)`) and read by
    attention: one program per capacity for each, results equal to the CPU's, and the tensors exact
    and contiguous as the CPU's cat makes them (the room is in the engine's record only)."""
    torch.manual_seed(0)
    k, v = torch.randn(2, 2, 10, 4), torch.randn(2, 2, 10, 4)
    tk, tv = k.to("tpu"), v.to("tpu")
    beams = torch.tensor([1, 0])
    compiles = []
    for step in range(6):  # lengths 11..16: the first link exact, then room 16 from 12 on
        nk, nv, q = torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4), torch.randn(2, 4, 1, 4)
        mask = torch.rand(2, 1, 1, k.shape[2] + 1) > 0.2 if step == 5 else None
        before = _compiles()
        k, v = torch.cat([k, nk], dim=-2), torch.cat([v, nv], dim=-2)
        tk, tv = torch.cat([tk, nk.to("tpu")], dim=-2), torch.cat([tv, nv.to("tpu")], dim=-2)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        tmask = None if mask is None else mask.to("tpu")
        tout = torch.nn.functional.scaled_dot_product_attention(q.to("tpu"), tk, tv, attn_mask=tmask, enable_gqa=True)
        k, v = k.index_select(0, beams), v.index_select(0, beams)
        tk, tv = tk.index_select(0, beams.to("tpu")), tv.index_select(0, beams.to("tpu"))
        compiles.append(_compiles() - before)
        torch.testing.assert_close(tout.cpu(), out)
        assert tk.shape == k.shape and tk.stride() == k.stride() and tk.is_contiguous()
        assert tk.untyped_storage().nbytes() == k.untyped_storage().nbytes()
    assert _room(tk) == (16, 16) and _room(tv) == (16, 16)
    # in the room nothing compiles per length; a mask over the keys is padded (a program per length)
    # and attention reads it at the room's capacity (a program per capacity and mask shape)
    assert compiles[2:5] == [0, 0, 0] and compiles[5] == 2, compiles
    torch.testing.assert_close(tk.cpu(), k, rtol=0, atol=0)
    torch.testing.assert_close(tv.cpu(), v, rtol=0, atol=0)


def test_a_grown_cache_reads_exactly_through_any_op_and_keeps_the_cpu_errors():
    torch.manual_seed(1)
    k = torch.randn(3, 2, 12, 4)
    tk = k.to("tpu")
    for _ in range(3):
        n = torch.randn(3, 2, 1, 4)
        k, tk = torch.cat([k, n], dim=-2), torch.cat([tk, n.to("tpu")], dim=-2)
    assert _room(tk) == (16, 15)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match except in dimension 2"):
        torch.cat([tk, torch.randn(3, 1, 1, 4, device="tpu")], dim=-2)  # (the engine's cat, as before)
    torch.testing.assert_close(tk[:, :, -1].cpu(), k[:, :, -1], rtol=0, atol=0)
    assert tk.view(3, -1).shape == (3, 120)  # a view of an exact contiguous tensor
    tk.add_(1)  # a write takes the exact values: the room is gone, the next append is exact
    n = torch.randn(3, 2, 1, 4)
    k, tk = torch.cat([k + 1, n], dim=-2), torch.cat([tk, n.to("tpu")], dim=-2)
    torch.testing.assert_close(tk.cpu(), k, rtol=0, atol=0)


def test_a_grown_batch_keeps_its_room_after_a_reader_takes_its_exact_values():
    """generate()'s padded batch: the (2, L) mask grows by an append per step, converted to bool and
    summed (Transformers' `fast_all`) at a program per capacity, and a reader takes its exact values
    each step. The room stays (it was dropped by the read, so the next append was an exact cat again:
    a program per length in two steps of three); a write still ends it."""
    cpu = torch.ones(2, 12, dtype=torch.int64)
    cpu[1, :4] = 0
    tpu = cpu.to("tpu")
    steps = []
    for _ in range(10):  # lengths 13..22: the first link exact, room 16, then room 32 from 17 on
        cpu = torch.cat([cpu, cpu.new_ones((2, 1))], dim=-1)
        before = _compiles()
        tpu = torch.cat([tpu, tpu.new_ones((2, 1))], dim=-1)
        as_bool = tpu.to(torch.bool)
        total = as_bool.sum()
        steps.append(_compiles() - before)
        assert total.item() == cpu.to(torch.bool).sum().item()
        torch.testing.assert_close(as_bool.cpu(), cpu.to(torch.bool), rtol=0, atol=0)
        torch.testing.assert_close(tpu.cpu(), cpu, rtol=0, atol=0)
    assert _room(tpu, -1) == (32, 22) and _room(as_bool, -1) == (32, 22)
    # (the first write into each capacity may build its append program: once per capacity, and not
    # at all where an earlier test of the process built it)
    assert steps[2] <= 1 and steps[3] == 0 and steps[5] <= 1 and steps[6:] == [0] * 4, steps
    tpu[0, -1] = 0  # a write: the room is gone, the next append is exact
    cpu[0, -1] = 0
    assert _room(tpu, -1) is None
    cpu, tpu = torch.cat([cpu, cpu[:, :1]], dim=-1), torch.cat([tpu, tpu[:, :1]], dim=-1)
    torch.testing.assert_close(tpu.cpu(), cpu, rtol=0, atol=0)
    assert tpu.sum().item() == cpu.sum().item()


def test_eager_attention_over_a_grown_cache_in_the_fused_mode_reads_exact_keys():
    """A model's own attention (`q @ k.transpose(-1, -2)`, GPT-2's eager path) reads a (B, H, L, D)
    cache grown into room. In later generate()s the ops meet warm entries of the first at each length,
    and the C++ fused queue took the record's Room as an array (TypeError when the segment ran; the
    third round here); it now leaves it to Python, which reads the exact values."""
    torch.manual_seed(0)
    for _ in range(3):
        k, v = torch.randn(2, 2, 10, 4), torch.randn(2, 2, 10, 4)
        tk, tv = k.to("tpu"), v.to("tpu")
        for _ in range(4):
            nk, nv, q = torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4)
            k, v = torch.cat([k, nk], -2), torch.cat([v, nv], -2)
            tk, tv = torch.cat([tk, nk.to("tpu")], -2), torch.cat([tv, nv.to("tpu")], -2)
            expected = (q @ k.transpose(-1, -2) * 0.5).softmax(-1) @ v
            got = (q.to("tpu") @ tk.transpose(-1, -2) * 0.5).softmax(-1) @ tv
            torch.testing.assert_close(got.cpu(), expected)


def test_a_warm_op_queued_in_cpp_reads_a_grown_cache_exactly(monkeypatch):
    """The fused mode's C++ queue (csrc/fused_queue.cpp) sends an input whose buffer is a Room to the
    Python kernel (which slices its exact values): queued as it is, the segment handed JAX the Room
    (gemma3's `test_generate_from_random_inputs_embeds` after other generate tests)."""
    from torchtpu.eager import fusion

    monkeypatch.setattr(fusion, "COMPILE", "now")  # (no background compile left to count in a later test)
    torch.manual_seed(2)
    q = torch.randn(3, 2, 13, 5)
    tq = q.to("tpu")
    with torchtpu.eager_mode("fused"):
        for _ in range(6):  # (the mul warms up, then queues behind the add in one segment)
            k = torch.randn(3, 2, 10, 5)
            tk = k.to("tpu")
            for _ in range(3):
                n = torch.randn(3, 2, 1, 5)
                k, tk = torch.cat([k, n], dim=-2), torch.cat([tk, n.to("tpu")], dim=-2)
            assert _room(tk) == (16, 13)
            torch.testing.assert_close(((tq + 1) * tk).cpu(), (q + 1) * k, rtol=0, atol=0)
        fusion.flush_all()
