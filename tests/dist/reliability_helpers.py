"""The job of tests/dist/test_reliability*.py, test_resume_zero3.py, test_stall_watchdog.py and
test_resume_universal.py: a real `zero-kit train --nproc N` ZeRO-3 run started in its own session
(tests.support.jobs), so a test can kill the whole job or one rank at a chosen moment, and can stall a save at a
chosen point (reliability_faults/); and its uninterrupted two-rank run, trained once per test run."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from tests.support.jobs import FAST, FAULTS_SITE, PROBE_SITE, Job, env, run, zero_kit
from tests.support.jobs import start as start_job
from tests.support.shared import shared_run
from zero_kit.train.startup import MEMORY_ENV

STEPS = 8
# Secrets planted in the reference run's environment (under umask 0): tests/dist/test_secrets_scan.py scans what the
# run left and printed for them, on this run instead of a train launch of its own. zero-kit's ranks never read them.
PLANTED = {
    "HF_TOKEN": "hf_PLANTEDscan0123456789abcdef",
    "WANDB_API_KEY": "PLANTEDwandb0123456789abcdef",
    "MY_SERVICE_PASSWORD": "PLANTEDpassword-0123456789",
}
# Constant LR keeps the comparisons about restored state; every run of a test module uses the same job.
JOB = ["--stage", "3", "--max-steps", str(STEPS), "--save-steps", "2", "--save-total-limit", "10",
       "--lr-scheduler", "constant", *FAST]  # fmt: skip


def zero3_reference(factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted two-rank run of JOB, trained once per test run (tests/support/shared.py) for every test that
    compares with it: RUN/run is its output, RUN/probe.pt the logits its ranks computed at the end of training
    (tests/dist/probe), RUN/output.txt what it printed. Readers copy a checkpoint before resuming it. It runs with
    PLANTED in its environment and under umask 0, for test_secrets_scan.py."""

    def train(directory: Path) -> None:
        cmd = zero_kit("train", "--nproc", "2", "--master-port", "29801", "--output", str(directory / "run"), *JOB)
        # the logits at the end; memory by start-up stage; ranks that fail if they resolve their run again
        probe = {"ZERO_KIT_PROBE_LOGITS": str(directory / "probe.pt"), MEMORY_ENV: "1", "ZERO_KIT_PROBE_NO_REPLAN": "1"}
        umask = os.umask(0)  # as test_secrets_scan.py's umask_zero: a file left world-readable would show
        try:
            proc = run(cmd, timeout=300, extra_env={**probe, **PLANTED}, site=PROBE_SITE)
        finally:
            os.umask(umask)
        assert f"step {STEPS}/{STEPS}" in proc.stdout
        (directory / "output.txt").write_text(proc.stdout + proc.stderr)

    return shared_run(factory, "zero3_two_ranks", train)


def start(out: Path, port: int, *extra: str, pause: tuple[str, str, Path] | None = None, nproc: int = 2) -> Job:
    """`zero-kit train --nproc N` in a new session, logged to OUT.PORT.log beside `out`; `wait` reaps the session.
    pause=(point, checkpoint name, marker path): stall the save there (reliability_faults/sitecustomize.py)."""
    fault_env, site = {}, None
    if pause:
        point, ckpt, marker = pause
        marker.unlink(missing_ok=True)
        fault_env, site = {"ZK_FAULT_PAUSE": point, "ZK_FAULT_CKPT": ckpt, "ZK_FAULT_MARKER": str(marker)}, FAULTS_SITE
    launch = ["--nproc", str(nproc)] if nproc > 1 else []
    cmd = zero_kit("train", *launch, "--master-port", str(port), "--output", str(out), *JOB, *extra)
    return start_job(cmd, out.parent / f"{out.name}.{port}.log", env=env(site, **fault_env), reap=True)


def rank_pid(job: Job, rank: int) -> int:
    """The pid of one training rank (a `zero_kit.cli train` process whose environment says RANK=rank)."""
    for child in psutil.Process(job.proc.pid).children(recursive=True):
        try:
            cmdline = child.cmdline()
            if "zero_kit.cli" in cmdline and child.environ().get("RANK") == str(rank):
                return child.pid
        except psutil.Error:
            continue
    raise AssertionError(f"no rank {rank} process under {job.proc.pid}")
