"""Helpers of tests/multinode/test_cluster_faults.py: one small two-node ZeRO-3 job, started on a rig in the
background (its own session, log to a file), watched through its output directory (shared by both hosts, like
a cluster's filesystem), and compared with an uninterrupted run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks.rigs.base import namespace_pids, rig_env

VENV = Path(sys.executable).parent.parent
ZERO_KIT = str(VENV / "bin" / "zero-kit")
STEPS = 8
STALL_S = 20
# ZeRO-3, the embedded tiny model, constant LR (the comparisons are about restored state), a save every 2 steps.
JOB = ["--stage", "3", "--max-steps", str(STEPS), "--save-steps", "2", "--save-total-limit", "10",
       "--lr-scheduler", "constant", "--max-length", "64", "--micro-batch", "2", "--log-steps", "1",
       "--stall-timeout", str(STALL_S)]  # fmt: skip
JOB_PROCESS_WORDS = ("zero_kit", "deepspeed", "pdsh", "torch.distributed")


@dataclass
class Job:
    proc: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.monotonic)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.is_file() else ""

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)


def start(argv: list[str], log: Path, cwd: Path, env: dict | None = None) -> Job:
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env or rig_env(),
                                start_new_session=True)  # fmt: skip
    return Job(proc, log)


def logged_steps(out: Path) -> list[int]:
    path = out / "train_log.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            steps.append(json.loads(line)["step"])
        except ValueError:  # a line cut by SIGKILL
            continue
    return steps


def pointer(out: Path) -> str | None:
    path = out / "latest_complete"
    return path.read_text().strip() if path.is_file() else None


def checkpoint_step(out: Path) -> int:
    """The step of the newest complete checkpoint (what `--resume auto` takes)."""
    return int(pointer(out).rsplit("-", 1)[1])


def wait_for(condition, what: str, job: Job | None = None, timeout: float = 300, poll: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if job is not None and job.proc.poll() is not None:
            raise AssertionError(f"job exited {job.proc.returncode} before {what}\n{job.text()[-3000:]}")
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{job.text()[-3000:]}" if job else ""))


def after_first_checkpoint(out: Path, job: Job | None = None) -> int:
    """Wait until checkpoint-2 is complete (the resume point is known); returns the last logged step then."""
    wait_for(lambda: pointer(out) == "checkpoint-2" and logged_steps(out), "checkpoint-2 complete", job)
    return logged_steps(out)[-1]


def between_saves(out: Path, job: Job | None = None) -> int:
    """Wait until checkpoint-2 is complete and every rank's last heartbeat is `train` at the same step past it (each
    rank finished that step and is not saving), and return that step. A fault now meets the plain --stall-timeout; in
    a save (rank 1 can still be in checkpoint-2's last barrier when rank 0 writes the pointer) it would meet the
    save's 6x allowance."""
    from zero_kit.watchdog import HEARTBEAT_DIR, read_beats

    def step() -> int | None:
        beats = read_beats(out / HEARTBEAT_DIR, 2, since=0).values()
        if pointer(out) is None or any(b is None or b["phase"] != "train" for b in beats):
            return None
        steps = {b["step"] for b in beats}
        return steps.pop() if len(steps) == 1 and min(steps) > 2 else None

    return wait_for(step, "both ranks between two saves after checkpoint-2", job, poll=0.01)


def resumed_from(text: str) -> int | None:
    marker = "zero-kit train: resuming from "
    lines = [line for line in text.splitlines() if marker in line]
    return int(lines[-1].rsplit("checkpoint-", 1)[1].split()[0]) if lines else None


def job_pids(namespaces: list[str]) -> list[tuple[int, str]]:
    """Processes of the job (ranks, guardians, launchers, pdsh/srun sessions) left in the namespaces."""
    found = []
    for namespace in namespaces:
        for pid in namespace_pids(namespace):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            rig_daemon = cmdline.startswith(("sshd", "/usr/sbin/sshd", "slurm", "munged", "env SLURM_CONF"))
            if state != "Z" and not rig_daemon and any(word in cmdline for word in JOB_PROCESS_WORDS):
                found.append((pid, cmdline[:160]))
    return found


def rank_pid(namespace: str) -> int:
    """A training rank on that host: `zero_kit.cli train`, neither a launcher nor a guardian."""
    for pid, cmdline in job_pids([namespace]):
        if "zero_kit.cli" in cmdline and "deepspeed.launcher" not in cmdline and "zero_kit.watchdog" not in cmdline:
            return pid
    raise AssertionError(f"no rank in {namespace}")


def kill_host(namespace: str) -> int:
    """A node lost: SIGKILL every process of the host (ranks, launcher, sshd or slurmd). Returns how many."""
    pids = namespace_pids(namespace)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def kill_leftovers(namespaces: list[str]) -> None:
    for pid, _ in job_pids(namespaces):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def load_final(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted((out / "final").glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def assert_bitwise_equal(resumed: Path, reference: Path) -> None:
    assert logged_steps(resumed)[-1] == STEPS
    got, want = load_final(resumed), load_final(reference)
    assert got.keys() == want.keys() and want
    for name, tensor in want.items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(got[name], tensor), f"{name} differs from the uninterrupted run"
