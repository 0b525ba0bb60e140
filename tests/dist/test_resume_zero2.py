"""ZeRO-2 with gradient accumulation on two CPU ranks through `zero-kit train --nproc 2`: a run resumed from the
step-2 checkpoint of an uninterrupted run ends with bitwise the same weights. ZeRO-2 keeps its gradient partitions
and fp32 master partitions apart from ZeRO-3's, so its checkpoint round trip is tested on its own (the CI
compatibility job runs this at the oldest supported DeepSpeed, whose ZeRO-2 accumulation had to be bisected)."""

from __future__ import annotations

import pytest
import torch
from train_helpers import FAST, assert_trained, load_safetensors_dir, run, zero_kit

pytestmark = pytest.mark.dist
STEPS = 4
JOB = ["--stage", "2", "--grad-accum", "2", "--max-steps", str(STEPS), "--save-steps", "2", "--lr-scheduler",
       "constant", *FAST]  # fmt: skip


def test_zero2_resumed_run_ends_bitwise_equal(tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run(zero_kit("train", "--nproc", "2", "--master-port", "29630", "--output", str(full), *JOB))
    assert_trained(full, STEPS, world_size=2, stage=2)
    checkpoint = full / "checkpoint-2"
    cmd = zero_kit(
        "train", "--nproc", "2", "--master-port", "29631", "--output", str(resumed), "--resume", str(checkpoint)
    )
    proc = run([*cmd, *JOB])
    assert "resuming from" in proc.stdout and "checkpoint-2" in proc.stdout.split("resuming from", 1)[1].split("\n")[0]
    reference, after_resume = load_safetensors_dir(full / "final"), load_safetensors_dir(resumed / "final")
    assert reference and after_resume.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(after_resume[name], tensor), f"{name} differs after a ZeRO-2 resume from step 2"
