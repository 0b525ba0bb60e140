"""ZeRO-2 with gradient accumulation on two CPU ranks through `zero-kit train --nproc 2`, one run read three ways:

- a run resumed from its step-2 checkpoint ends with bitwise the same weights;
- the export of a ZeRO-2 checkpoint holds DeepSpeed's own reading of it;
- the step-2 checkpoint resumes at ONE rank through DeepSpeed's universal checkpoint conversion
  (zero_kit/checkpoints/universal.py), its losses continuing the two-rank run's within LOSS_RTOL. The micro batch keeps
  the global batch at 8 (2 ranks x 2 x 2 accumulation -> 1 x 4 x 2), so the resumed steps see the same examples.
  Before the fix the conversion failed: `Required universal_checkpoint_info state is missing in checkpoint`
  (DeepSpeed's tool wants --inject_missing_state for checkpoints not written by Megatron-DeepSpeed; DeepSpeed issues
  #5405, #5430). The LoRA (ZeRO-3) case is test_resume_universal.py's; full-model ZeRO-3 is test_reliability.py's.

ZeRO-2 keeps its gradient partitions and fp32 master partitions apart from ZeRO-3's, so its checkpoint round trip is
tested on its own (the CI compatibility job runs the ZeRO-3 one at the oldest supported DeepSpeed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zero_kit.launch.chatter import is_chatter
from zero_kit.log import RUN_LOG

from tests.support.jobs import FAST, run, zero_kit
from tests.support.runs import (
    assert_bitwise_equal,
    assert_export_is_deepspeeds,
    assert_losses_continue,
    assert_trained,
    resumed_from,
)

pytestmark = pytest.mark.dist
STEPS, SAVED = 4, 2
LOSS_RTOL = 1e-4  # as test_reliability.py's test_6
JOB = ["--stage", "2", "--grad-accum", "2", "--max-steps", str(STEPS), "--save-steps", "2", "--lr-scheduler",
       "constant", *FAST]  # fmt: skip


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("zero2") / "full"
    proc = run(zero_kit("train", "--nproc", "2", "--master-port", "29630", "--output", str(out), *JOB))
    (out.parent / "terminal.json").write_text(json.dumps({"stdout": proc.stdout, "stderr": proc.stderr}))
    assert_trained(out, STEPS, world_size=2, stage=2)
    return out


def test_the_terminal_shows_zero_kits_lines_and_the_log_keeps_the_launchers(full):
    """Issue 50: 25 of the quick start's 73 lines were the deepspeed launcher's and torch's FutureWarnings about
    DeepSpeed's collectives. They go to OUTPUT/zero_kit.log; the terminal keeps zero-kit's lines and the progress."""
    terminal = json.loads((full.parent / "terminal.json").read_text())
    lines = (terminal["stdout"] + terminal["stderr"]).splitlines()
    assert not [line for line in lines if is_chatter(line) or "Warning" in line], "\n".join(lines)
    assert all(line.startswith(("zero-kit train: ", "[")) for line in lines if line.strip()), "\n".join(lines)
    assert sum(" step " in line and " loss " in line for line in lines) == STEPS
    log = (full / RUN_LOG).read_text()
    assert "[launch.py:" in log and "Setting CUDA_VISIBLE_DEVICES" in log  # kept, not lost
    assert "zero-kit train: exported" in log  # the log has every line of the launch, the terminal's too


def test_zero2_export_is_deepspeeds_reading(full):
    assert_export_is_deepspeeds(full / "final", full / f"checkpoint-{STEPS}")  # ZeRO-2's layout, read by export


def test_zero2_resumed_run_ends_bitwise_equal(full, tmp_path):
    resumed = tmp_path / "resumed"
    cmd = zero_kit("train", "--nproc", "2", "--master-port", "29631", "--output", str(resumed),
                   "--resume", str(full / f"checkpoint-{SAVED}"))  # fmt: skip
    proc = run([*cmd, *JOB])
    assert resumed_from(proc.stdout) == SAVED
    assert_bitwise_equal(resumed / "final", full / "final", f"after a ZeRO-2 resume from step {SAVED}", fp32=False)


def test_zero2_two_rank_checkpoint_resumes_at_one_rank(full, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    shutil.copytree(full / f"checkpoint-{SAVED}", out / f"checkpoint-{SAVED}")  # the shared run stays untouched
    proc = run([*zero_kit("train", "--output", str(out), *JOB), "--micro-batch", "4", "--no-export"], timeout=300)
    text = proc.stdout + proc.stderr
    assert f"checkpoint-{SAVED} was written by 2 rank(s), this run has 1" in text
    assert resumed_from(text) == SAVED
    latest = (out / f"checkpoint-{SAVED}" / "latest_universal").read_text().strip()
    assert latest == f"global_step{SAVED}_universal"
    assert_losses_continue(out, full, range(SAVED + 1, STEPS + 1), LOSS_RTOL)
