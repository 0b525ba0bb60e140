"""The AutoTP world-size rule (zero_kit.lint.rules_tp) on real ranks: DeepSpeed builds a (world // tp, tp) mesh, so
with autotp_size 2 on 3 ranks the rank outside it fails at start-up (IndexError in torch's DeviceMesh.get_group) and
the launch fails, while ranks 0 and 1 get their tp group. Real `deepspeed` launcher, CPU ranks, gloo. (The passing
case, tp dividing the world, is the same call without the rank left over; it is not launched again: CI time.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.jobs import env, shm_left, start
from zero_kit.dist import free_port
from zero_kit.lint import LintContext, check_rules

PROBE = Path(__file__).with_name("autotp_world_probe.py")


def _launch(tmp_path: Path, ranks: int, tp: int):
    deepspeed = Path(sys.executable).with_name("deepspeed")
    port = free_port()
    argv = [str(deepspeed), "--num_gpus", str(ranks), "--master_port", str(port), str(PROBE), str(tp)]
    job = start(argv, tmp_path / f"{ranks}.log", env=env(OMP_NUM_THREADS="1"), reap=True)
    code = job.wait(timeout=180)
    assert shm_left(port) == []  # the probe keeps DeepSpeed's unused shm op from starting, as zero-kit's ranks do
    return code, job.text()


@pytest.mark.dist
def test_autotp_size_not_dividing_the_world_fails_at_start_up(tmp_path):
    config = {"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 2}}
    code, text = _launch(tmp_path, 3, 2)
    assert code != 0 and "[rank2]: IndexError" in text, text[-3000:]
    assert "rank 0: tp group of 2 up" in text and "rank 1: tp group of 2 up" in text, text[-3000:]
    (error,) = [p for p in check_rules(config, LintContext(world_size=3)) if p.severity == "error"]
    assert "does not divide the world size(3" in error.message and "1 rank(s) outside it" in error.message
    assert not [p for p in check_rules(config, LintContext(world_size=4)) if p.severity == "error"]
