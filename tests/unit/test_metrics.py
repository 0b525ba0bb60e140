"""Unit tests for zero_kit.metrics: ring accounting, storage counting, MFU arithmetic, the collective counter."""

from __future__ import annotations

import pytest
import torch

from zero_kit.metrics import CommCounter, flops_per_token, mfu, peak_flops, ring_bytes, storage_bytes


def test_ring_bytes_follow_the_zero_paper_accounting():
    psi = 1000
    # DDP all-reduce = reduce-scatter + all-gather: 2x the data of either half.
    assert ring_bytes("allreduce", psi, 2) == 2 * ring_bytes("reducescatter", psi, 2) == psi
    # ZeRO-3 = all-gather (fwd) + all-gather (bwd) + reduce-scatter = 1.5 x DDP.
    zero3 = 2 * ring_bytes("allgather", psi, 8) + ring_bytes("reducescatter", psi, 8)
    assert zero3 / ring_bytes("allreduce", psi, 8) == pytest.approx(1.5)
    assert ring_bytes("allreduce", psi, 1) == 0.0


def test_storage_bytes_counts_a_flat_buffer_once_and_skips_empty_tensors():
    flat = torch.zeros(100)
    views = [flat[:10], flat[10:50], flat[50:]]
    assert storage_bytes(views) == 400
    assert storage_bytes([torch.zeros(3, dtype=torch.bfloat16), torch.empty(0), None]) == 6


def test_flops_per_token_and_mfu_from_the_peak_table():
    assert flops_per_token(n_params=10, layers=2, hidden=4, seq_len=8) == 6 * 10 + 12 * 2 * 4 * 8
    peak = peak_flops("NVIDIA H100 80GB HBM3", "bf16")
    assert peak == 989e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak_flops("Some CPU", "bf16") is None
    assert mfu(1000.0, 1e9, 1e13) == pytest.approx(0.1)
    assert mfu(1000.0, 1e9, None) is None


def test_counter_sees_calls_only_while_active_and_uninstalls(tmp_path):
    import torch.distributed as dist

    original = dist.all_reduce
    counter = CommCounter().install()
    try:
        assert dist.all_reduce is not original
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
        t = torch.ones(256)
        dist.all_reduce(t)  # inactive: not counted
        counter.active = True
        dist.all_reduce(t)
        dist.all_gather_into_tensor(torch.empty(256), t)
        assert counter.calls == {"all_reduce": 1, "all_gather_into_tensor": 1}
        assert counter.payload == {"all_reduce": 1024, "all_gather_into_tensor": 1024}
        assert counter.sent == 0.0  # one rank sends nothing
        summary = counter.summary(steps=2)
        assert summary["payload_bytes_by_op"]["all_reduce"] == 512
    finally:
        counter.uninstall()
        if dist.is_initialized():
            dist.destroy_process_group()
    assert dist.all_reduce is original


def test_ring_link_tiers_in_rank_order():
    from zero_kit.metrics import ring_link_tier

    world = [0, 1, 2, 3]  # two nodes of two ranks: the ring crosses nodes twice (1 -> 2 and 3 -> 0)
    assert [ring_link_tier(world, r, 2) for r in world] == ["intra_node", "inter_node", "intra_node", "inter_node"]
    assert {ring_link_tier([2, 3], r, 2) for r in (2, 3)} == {"intra_node"}  # a group inside one node
    assert {ring_link_tier([1, 3], r, 2) for r in (1, 3)} == {"inter_node"}  # one rank per node
    assert {ring_link_tier(world, r, 4) for r in world} == {"intra_node"}  # one node
