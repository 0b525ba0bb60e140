"""Unit tests for zero_kit.metrics: ring accounting, storage counting, MFU arithmetic, the collective counter."""

from __future__ import annotations

import pytest
import torch

from zero_kit import metrics
from zero_kit.metrics import CommCounter, flops_per_token, mfu, peak_flops, ring_bytes, storage_bytes


class FakeClock:
    """Stands in for the `time` module of the code under test (it reads `time.perf_counter()`): the clock moves
    only when the test sleeps, by exactly that much, so timings are exact whatever the machine's load. Whole
    seconds keep the float arithmetic exact."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


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
    # Fake collectives under the counter, on a fake clock: a blocking all-reduce that takes 3 s, an async
    # all-gather whose call takes 1 s and whose Work.wait another 4 s (the part a prefetch did not hide), and a
    # send (2 s, not timed).
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    clock = FakeClock()
    monkeypatch.setattr(metrics, "time", clock)  # the counter's time.perf_counter() reads the fake clock

    def slow_all_reduce(tensor, group=None, async_op=False):
        clock.sleep(3)

    def async_all_gather(output_tensor, input_tensor, group=None, async_op=False):
        clock.sleep(1)
        return c10d._all_gather_base_original(output_tensor, input_tensor, async_op=True)

    def slow_send(tensor, dst=None, group=None):
        clock.sleep(2)

    real_wait = c10d.Work.wait

    def slow_wait(work, *args, **kwargs):
        clock.sleep(4)
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
            assert counter.seconds == {"reduction": 3, "gather": 1, "alltoall": 0}  # the call so far, not yet its wait
            work.wait()
            work.wait()  # a second wait of the same Work is not counted again
            dist.send(t, dst=0)
            counter.active = False
            late = dist.all_gather_into_tensor(torch.empty(8), t, async_op=True)
            late.wait()  # issued and waited while inactive
        finally:
            counter.uninstall()
        assert c10d.Work.wait is slow_wait  # the wrapper is gone, the class's own wait back
        assert clock.now == 1000 + 3 + (3 + 1 + 4 + 4 + 2) + (1 + 4)  # every fake collective ran, inactive too
        # the active all-reduce; the all-gather's call and its first wait, not the second wait, the send, the
        # inactive all-reduce, nor the all-gather issued and waited while inactive
        assert counter.seconds == {"reduction": 3, "gather": 1 + 4, "alltoall": 0}
        assert set(counter.seconds) == {"reduction", "gather", "alltoall"}  # the send is not timed
        summary = counter.summary(steps=2)
        assert summary["exposed_seconds_by_phase"] == {"reduction": 1.5, "gather": 2.5, "alltoall": 0}
        counter.reset()
        assert counter.seconds == {"reduction": 0.0, "gather": 0.0, "alltoall": 0.0}
    finally:
        dist.destroy_process_group()


def test_phase_clock_splits_a_step_into_phases_that_add_up(monkeypatch):
    # On a fake clock, a fake counter whose exposed seconds grow while the windows run: per micro batch a 10 s
    # forward holding 5 s of gather and a 20 s backward holding 7 s of reduction; then a 4 s step holding 2 s of
    # gather; 1 s before the first window and 3 s after the last (other).
    from zero_kit.bench import phases as phases_module
    from zero_kit.bench.phases import PHASES, PhaseClock

    time = FakeClock()
    monkeypatch.setattr(phases_module, "time", time)  # PhaseClock's time.perf_counter() reads the fake clock

    class Counter:
        def __init__(self) -> None:
            self.seconds = {"reduction": 0.0, "gather": 0.0, "alltoall": 0.0}

    counter = Counter()
    clock = PhaseClock(counter)
    start = time.perf_counter()
    time.sleep(1)  # before the first window: other
    clock.begin()
    for _ in range(2):  # two micro batches: their windows add up
        time.sleep(10)
        counter.seconds["gather"] += 5
        clock.mark("forward")
        time.sleep(20)
        counter.seconds["reduction"] += 7
        clock.mark("backward")
    time.sleep(4)
    counter.seconds["gather"] += 2
    clock.mark("step")
    time.sleep(3)  # after the last window: other
    step_seconds = time.perf_counter() - start
    assert step_seconds == 1 + 2 * (10 + 20) + 4 + 3
    split = clock.end(step_seconds)
    phases, windows = split["phases"], split["windows"]
    assert tuple(phases) == PHASES
    assert windows == {
        "forward": {"wall": 20, "reduction": 0, "gather": 10, "alltoall": 0},
        "backward": {"wall": 40, "reduction": 14, "gather": 0, "alltoall": 0},
        "step": {"wall": 4, "reduction": 0, "gather": 2, "alltoall": 0},
    }
    # forward, backward, step: the window's wall minus the collectives inside it; reduction and gather wherever
    # they fell; other the rest of the step
    assert phases == {
        "forward": 10,
        "backward": 26,
        "reduction": 14,
        "step": 2,
        "gather": 12,
        "alltoall": 0,
        "other": 4,
    }
    assert sum(phases.values()) == step_seconds

    clock.begin()  # a pipeline: one schedule window, reported as forward, no backward of its own
    time.sleep(6)
    counter.seconds["gather"] += 1
    clock.mark("forward_backward")
    time.sleep(2)
    clock.mark("step")
    phases = clock.end(9)["phases"]
    assert phases == {"forward": 5, "backward": None, "reduction": 0, "step": 2, "gather": 1, "alltoall": 0, "other": 1}
