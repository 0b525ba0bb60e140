"""ZeRO-2 with gradient accumulation on two CPU ranks through `zero-kit train --nproc 2`: a run resumed from the
step-2 checkpoint of an uninterrupted run ends with bitwise the same weights, and the export of a ZeRO-2 checkpoint
holds DeepSpeed's own reading of it. ZeRO-2 keeps its gradient partitions
and fp32 master partitions apart from ZeRO-3's, so its checkpoint round trip is tested on its own (the CI
compatibility job runs this at the oldest supported DeepSpeed, whose ZeRO-2 accumulation had to be bisected)."""

from __future__ import annotations

import pytest

from tests.support.jobs import FAST, run, zero_kit
from tests.support.runs import assert_bitwise_equal, assert_export_is_deepspeeds, assert_trained, resumed_from

pytestmark = pytest.mark.dist
STEPS = 4
JOB = ["--stage", "2", "--grad-accum", "2", "--max-steps", str(STEPS), "--save-steps", "2", "--lr-scheduler",
       "constant", *FAST]  # fmt: skip


def test_zero2_resumed_run_ends_bitwise_equal(tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run(zero_kit("train", "--nproc", "2", "--master-port", "29630", "--output", str(full), *JOB))
    assert_trained(full, STEPS, world_size=2, stage=2)
    assert_export_is_deepspeeds(full / "final", full / f"checkpoint-{STEPS}")  # ZeRO-2's layout, read by export
    checkpoint = full / "checkpoint-2"
    cmd = zero_kit(
        "train", "--nproc", "2", "--master-port", "29631", "--output", str(resumed), "--resume", str(checkpoint)
    )
    proc = run([*cmd, *JOB])
    assert resumed_from(proc.stdout) == 2
    assert_bitwise_equal(resumed / "final", full / "final", "after a ZeRO-2 resume from step 2", fp32=False)
