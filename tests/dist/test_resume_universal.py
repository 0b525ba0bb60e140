"""Resume at another world size beyond full-model ZeRO-3 (test_reliability.py's test_6): a LoRA (ZeRO-3)
checkpoint written by two ranks and resumed at one through DeepSpeed's universal checkpoint conversion
(zero_kit/checkpoints/universal.py). The micro batch keeps the global batch at 4 (2x2 -> 1x4), so the resumed steps see
the same examples; the losses must continue the uninterrupted two-rank run within test_6's tolerance. The ZeRO-2
case reads the run test_resume_zero2.py makes anyway (its last test).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from reliability_helpers import start

from tests.support.runs import assert_losses_continue, resumed_from

pytestmark = pytest.mark.dist
LOSS_RTOL = 1e-4  # as test_reliability.py's test_6
STEPS, SAVED, TIMEOUT_S = 6, 4, 300
# Ports 29690-29699: none of them is taken by another launcher test that may run beside this one.
PORTS = 29690
CASES = {"lora-zero3": ["--stage", "3", "--lora-r", "8"]}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_two_rank_checkpoint_resumes_at_one_rank(tmp_path, case):
    job_args = [*CASES[case], "--max-steps", str(STEPS)]
    reference = tmp_path / "reference"
    job = start(reference, PORTS + list(CASES).index(case), *job_args)
    assert job.wait(TIMEOUT_S) == 0, job.text()[-4000:]
    out = tmp_path / "run"
    out.mkdir()
    shutil.copytree(reference / f"checkpoint-{SAVED}", out / f"checkpoint-{SAVED}")
    job = start(out, PORTS + 5 + list(CASES).index(case), *job_args, "--micro-batch", "4", nproc=1)
    assert job.wait(TIMEOUT_S) == 0, job.text()[-4000:]
    assert f"checkpoint-{SAVED} was written by 2 rank(s), this run has 1" in job.text()
    assert resumed_from(job.text()) == SAVED
    latest = (out / f"checkpoint-{SAVED}" / "latest_universal").read_text().strip()
    assert latest == f"global_step{SAVED}_universal"
    assert_losses_continue(out, reference, range(SAVED + 1, STEPS + 1), LOSS_RTOL)
