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


def test_counter_times_collectives_by_kind_with_the_async_wait(tmp_path, monkeypatch):
    # Fake collectives under the counter: a blocking all-reduce that takes 30 ms, an async all-gather whose call
    # takes 10 ms and whose Work.wait another 40 ms (the part a prefetch did not hide), and a send (not timed).
    import time

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def slow_all_reduce(tensor, group=None, async_op=False):
        time.sleep(0.03)

    def async_all_gather(output_tensor, input_tensor, group=None, async_op=False):
        time.sleep(0.01)
        return c10d._all_gather_base_original(output_tensor, input_tensor, async_op=True)

    def slow_send(tensor, dst=None, group=None):
        time.sleep(0.02)

    real_wait = c10d.Work.wait

    def slow_wait(work, *args, **kwargs):
        time.sleep(0.04)
        return real_wait(work, *args, **kwargs)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        monkeypatch.setattr(c10d, "_all_gather_base_original", c10d.all_gather_into_tensor, raising=False)
        for name, fake in (("all_reduce", slow_all_reduce), ("all_gather_into_tensor", async_all_gather),
                           ("send", slow_send)):  # fmt: skip
            monkeypatch.setattr(c10d, name, fake)
            monkeypatch.setattr(dist, name, fake)
        monkeypatch.setattr(c10d.Work, "wait", slow_wait)
        counter = CommCounter().install()
        try:
            t = torch.ones(8)
            dist.all_reduce(t)  # inactive: not timed
            counter.active = True
            dist.all_reduce(t)
            work = dist.all_gather_into_tensor(torch.empty(8), t, async_op=True)
            assert 0.01 <= counter.seconds["gather"] < 0.04  # the call so far, not yet its wait
            work.wait()
            work.wait()  # a second wait of the same Work is not counted again
            dist.send(t, dst=0)
            counter.active = False
            late = dist.all_gather_into_tensor(torch.empty(8), t, async_op=True)
            late.wait()  # issued and waited while inactive
        finally:
            counter.uninstall()
        assert c10d.Work.wait is slow_wait  # the wrapper is gone, the class's own wait back
        # sleeps overshoot on a loaded machine, never undershoot; the bounds above leave out a second wait (0.04)
        assert 0.03 <= counter.seconds["reduction"] < 0.03 + 0.05
        assert 0.05 <= counter.seconds["gather"] < 0.05 + 0.04
        assert set(counter.seconds) == {"reduction", "gather"}  # the send is not timed
        summary = counter.summary(steps=2)
        assert summary["exposed_seconds_by_phase"]["reduction"] == pytest.approx(counter.seconds["reduction"] / 2)
        counter.reset()
        assert counter.seconds == {"reduction": 0.0, "gather": 0.0}
    finally:
        dist.destroy_process_group()


def test_phase_clock_splits_a_step_into_phases_that_add_up():
    # A fake counter whose exposed seconds grow while the windows run: 5 ms of gather inside forward, 7 ms of
    # reduction inside backward, 2 ms of gather inside the step.
    import time

    from zero_kit.bench.phases import PHASES, PhaseClock

    class Counter:
        seconds = {"reduction": 0.0, "gather": 0.0}

    counter = Counter()
    clock = PhaseClock(counter)
    start = time.perf_counter()
    clock.begin()
    for _ in range(2):  # two micro batches: their windows add up
        time.sleep(0.01)
        counter.seconds["gather"] += 0.005
        clock.mark("forward")
        time.sleep(0.02)
        counter.seconds["reduction"] += 0.007
        clock.mark("backward")
    time.sleep(0.004)  # between windows: other
    counter.seconds["gather"] += 0.002
    clock.mark("step")
    split = clock.end(time.perf_counter() - start)
    phases, windows = split["phases"], split["windows"]
    assert tuple(phases) == PHASES
    assert sum(phases.values()) == pytest.approx(time.perf_counter() - start, abs=0.002)
    assert phases["reduction"] == pytest.approx(0.014) and phases["gather"] == pytest.approx(0.012)
    assert windows["forward"]["gather"] == pytest.approx(0.010) and windows["step"]["gather"] == pytest.approx(0.002)
    assert phases["forward"] == pytest.approx(windows["forward"]["wall"] - 0.010)
    assert phases["backward"] == pytest.approx(windows["backward"]["wall"] - 0.014)
    assert phases["step"] == pytest.approx(windows["step"]["wall"] - 0.002)
    assert windows["forward"]["wall"] >= 0.02 and windows["backward"]["wall"] >= 0.04
    assert min(phases.values()) >= 0

    clock.begin()  # a pipeline: one schedule window, reported as forward, no backward of its own
    clock.mark("forward_backward")
    clock.mark("step")
    phases = clock.end(0.001)["phases"]
    assert phases["backward"] is None and phases["forward"] >= 0
