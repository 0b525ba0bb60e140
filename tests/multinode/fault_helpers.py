"""The job of tests/multinode/test_cluster_faults.py: one small two-node ZeRO-3 run, started on a rig in the
background (tests.support.jobs: its own session, log to a file), watched through its output directory (shared by
both hosts, like a cluster's filesystem), the job's processes found and killed host by host, and compared with an
uninterrupted run."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from tests.rigs.base import namespace_pids, rig_env
from tests.support.jobs import FAST, Job, wait_for
from tests.support.jobs import start as start_job
from tests.support.runs import assert_bitwise_equal, logged_steps, pointer

STEPS = 8
STALL_S = 20
# ZeRO-3, the embedded tiny model, constant LR (the comparisons are about restored state), a save every 2 steps.
JOB = ["--stage", "3", "--max-steps", str(STEPS), "--save-steps", "2", "--save-total-limit", "10",
       "--lr-scheduler", "constant", *FAST, "--stall-timeout", str(STALL_S)]  # fmt: skip
JOB_PROCESS_WORDS = ("zero_kit", "deepspeed", "pdsh", "torch.distributed")


def start(argv: list[str], log: Path, cwd: Path) -> Job:
    """`argv` in the background with the rigs' environment (rig_env); a test looks for leftovers itself."""
    return start_job(argv, log, cwd=cwd, env=rig_env())


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


def assert_finished_like(resumed: Path, reference: Path) -> None:
    """The resumed run reached the last step with fp32 weights bitwise equal to the uninterrupted run's."""
    assert logged_steps(resumed)[-1] == STEPS
    assert_bitwise_equal(resumed / "final", reference / "final", "from the uninterrupted run")
