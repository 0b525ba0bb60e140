"""Helpers of tests/dist/test_reliability*.py: start a real `zero-kit train --nproc N` job in its own process
group, watch its output directory, kill it (or one rank) at a chosen moment, and read what it left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from train_helpers import FAST, env, zero_kit

from zero_kit.train import checkpoint

FAULTS_DIR = Path(__file__).resolve().parent / "reliability_faults"
STEPS = 8
# Constant LR keeps the comparisons about restored state; every run of a test module uses the same job.
JOB = [
    "--stage",
    "3",
    "--max-steps",
    str(STEPS),
    "--save-steps",
    "2",
    "--save-total-limit",
    "10",
    "--lr-scheduler",
    "constant",
    *FAST,
]


@dataclass
class Job:
    proc: subprocess.Popen
    log_path: Path

    def text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            kill_group(self.proc)


def start(out: Path, port: int, *extra: str, pause: tuple[str, str, Path] | None = None, nproc: int = 2) -> Job:
    """`zero-kit train --nproc N` in a new session (so a test can kill the whole job at once); log to a file.
    pause=(point, checkpoint name, marker path): stall the save there (reliability_faults/sitecustomize.py)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.parent / f"{out.name}.{port}.log"
    extra_env = {}
    if pause:
        point, ckpt, marker = pause
        marker.unlink(missing_ok=True)
        extra_env = {"ZK_FAULT_PAUSE": point, "ZK_FAULT_CKPT": ckpt, "ZK_FAULT_MARKER": str(marker)}
        extra_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAULTS_DIR), os.environ.get("PYTHONPATH")) if p)
    launch = ["--nproc", str(nproc)] if nproc > 1 else []
    cmd = zero_kit("train", *launch, "--master-port", str(port), "--output", str(out), *JOB, *extra)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env(**extra_env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return Job(proc, log_path)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL every process of the job's session (launcher and ranks): what an OOM killer or a node loss does."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def survivors(pgid: int) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


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


def wait_until(job: Job, condition, what: str, timeout: float = 300.0, poll: float = 0.005):
    """Poll `condition()` until it returns something truthy; fail if the job ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if job.proc.poll() is not None:
            raise AssertionError(f"job exited {job.proc.returncode} before {what}\n{job.text()[-3000:]}")
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}\n{job.text()[-3000:]}")


def logged_steps(out: Path) -> list[int]:
    log = out / "train_log.jsonl"
    if not log.is_file():
        return []
    import json

    steps = []
    for line in log.read_text().splitlines():
        try:
            steps.append(json.loads(line)["step"])
        except ValueError:  # a line cut by SIGKILL
            continue
    return steps


def resumed_from(job_text: str) -> int | None:
    """The step `zero-kit train` says it resumed from (None when it started fresh)."""
    marker = "zero-kit train: resuming from "
    lines = [line for line in job_text.splitlines() if line.startswith(marker)]
    if not lines:
        assert "zero-kit train: starting fresh" in job_text, job_text[-3000:]
        return None
    return checkpoint.checkpoint_step(Path(lines[-1][len(marker) :].strip()))


def pointer(out: Path) -> str | None:
    path = out / checkpoint.POINTER
    return path.read_text().strip() if path.is_file() else None


def files_in(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())
