"""Faults where clusters have them, on two real hosts (network namespaces, root), with a small two-node ZeRO-3 job
(fault_helpers.JOB: 8 steps, a checkpoint every 2, --stall-timeout 20):

- pdsh (`zero-kit train --hostfile H`): a whole node lost (every process of host 1 SIGKILLed, sshd included),
  the link cut (`ip link set ... down` on host 1), a rank frozen with SIGSTOP on host 1;
- SLURM (`zero-kit launch --slurm -- train`: srun starts every rank; sbatch --wait): a whole node lost (slurmd
  included), and preemption (`scancel --signal=TERM`: a complete checkpoint, exit 75), each ending the job; and
  Slurm's own requeue (a node lost, then `scontrol requeue`): the same job runs again, twice, and finishes.

Each asserts the time from fault to job exit against a stated bound, that no process of the job is left on either
host and, where the run is resumed (the same command again: `--resume auto` is the default), final fp32 weights
bitwise equal to an uninterrupted two-node run on the same kind of rig: after the pdsh node loss, and twice in
Slurm's requeue (after a node loss and after a preemption); the link cut and the preemption test check the
checkpoint they leave, whose resume is those tests' path. Prefixes zkfp/zkfq (pdsh, 10.78.61-62.x)
and zkfs/zkft (SLURM, 10.78.63-64.x); ports 29900-29919.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fault_helpers import (
    JOB,
    STALL_S,
    after_first_checkpoint,
    assert_finished_like,
    between_saves,
    job_pids,
    kill_host,
    kill_leftovers,
    rank_pid,
    start,
)

from tests.rigs import set_link, slurm_cluster, ssh_hosts, write_hostfile
from tests.rigs.slurm import job_id as slurm_job_id
from tests.support.jobs import VENV, Job, wait_for, zero_kit
from tests.support.rigs import rig_marks
from tests.support.runs import RESUMING, checkpoint_step, logged_steps, pointer, resumed_from
from zero_kit.errors import EXIT_PREEMPTED
from zero_kit.watchdog import EXIT_STALLED, KILL_GRACE_S, POLL_S

pytestmark = [*rig_marks(), pytest.mark.serial]  # faults timed against stated bounds: never beside another test
RUN_TIMEOUT_S = 420
# A node lost: the survivors' gloo connections are reset at once, their launcher ends them; measured 5-10 s.
NODE_LOSS_BOUND_S = 30
# Under SLURM the step ends only when slurmctld declares the lost node DOWN: SlurmdTimeout (10 s on the rig, 300 s
# by default: tests/rigs/slurm.py) after its last answer to a ping, plus the job's end and sbatch's poll.
SLURM_NODE_LOSS_BOUND_S = 60
# Stall detection polls every POLL_S; a stopped rank's guardian kills it at once, a running one gets KILL_GRACE_S;
# then the launchers and pdsh unwind (on a cut link the ssh keepalive, 3 x 5 s, ends host 1's session first).
STALL_BOUND_S = STALL_S + 2 * POLL_S + KILL_GRACE_S + 20


def _pdsh_argv(rig, tmp: Path, out: Path, port: int) -> list[str]:
    hostfile = write_hostfile(tmp / "hostfile", rig.hosts.names)
    train = zero_kit("train", "--hostfile", str(hostfile), "--master-port", str(port), "--output", str(out), *JOB)
    return rig.command(train)


@pytest.fixture(scope="module")
def pdsh_reference(tmp_path_factory, cpu_ops) -> Path:
    tmp = tmp_path_factory.mktemp("zkf_pdsh_ref")
    with ssh_hosts("zkfq", subnet=62) as rig:
        job = start(_pdsh_argv(rig, tmp, tmp / "run", 29900), tmp / "run.log", tmp)
        assert job.wait(RUN_TIMEOUT_S) == 0, job.text()[-4000:]
    print(f"\npdsh reference: {time.monotonic() - job.started:.0f} s")
    return tmp / "run"


def _resume_pdsh(rig, tmp: Path, out: Path, port: int, reference: Path, expect_from: int) -> None:
    job = start(_pdsh_argv(rig, tmp, out, port), tmp / "resume.log", tmp)
    assert job.wait(RUN_TIMEOUT_S) == 0, job.text()[-4000:]
    assert resumed_from(job.text()) == expect_from, job.text()[-3000:]
    assert_finished_like(out, reference)


def _ended(job, fault_at: float, bound: float, names: list[str]) -> tuple[int, float]:
    """Wait for the job's exit (at most bound + 60 s), then for every job process on both hosts to be gone by
    `bound` after the fault (a host cut off from the launcher ends its own ranks: its watchdog, its sshd)."""
    try:
        code = job.wait(bound + 60)
    except Exception:
        kill_leftovers(names)
        raise AssertionError(f"the job did not end within {bound + 60:.0f} s\n{job.text()[-4000:]}") from None
    took = time.monotonic() - fault_at
    while job_pids(names) and time.monotonic() < fault_at + bound:
        time.sleep(0.2)
    left = job_pids(names)
    kill_leftovers(names)
    assert not left, f"processes left {time.monotonic() - fault_at:.0f} s after the fault: {left}"
    return code, took


def test_pdsh_node_lost_ends_the_job_and_resume_is_bitwise(tmp_path, pdsh_reference):
    out = tmp_path / "run"
    with ssh_hosts("zkfp", subnet=61) as rig:
        job = start(_pdsh_argv(rig, tmp_path, out, 29901), tmp_path / "run.log", tmp_path)
        after_first_checkpoint(out, job)
        lost_at = time.monotonic()
        killed = kill_host(rig.hosts.names[1])
        last_step = logged_steps(out)[-1]
        code, took = _ended(job, lost_at, NODE_LOSS_BOUND_S, list(rig.hosts.names))
        print(f"\npdsh node lost ({killed} processes) after step {last_step}: exit {code} in {took:.1f} s")
        assert code != 0 and took <= NODE_LOSS_BOUND_S, (code, took, job.text()[-3000:])
        rig.start_sshd(1)  # the node is back (rebooted)
        complete, last_step = checkpoint_step(out), logged_steps(out)[-1]
        _resume_pdsh(rig, tmp_path, out, 29902, pdsh_reference, expect_from=complete)
    print(f"steps lost: {last_step - complete}")


def test_pdsh_link_cut_ends_the_job_at_the_stall_timeout_and_leaves_a_complete_checkpoint(tmp_path):
    """The resume after it is the node-loss test's (the same pdsh resume from the newest complete checkpoint)."""
    out = tmp_path / "run"
    with ssh_hosts("zkfp", subnet=61) as rig:
        job = start(_pdsh_argv(rig, tmp_path, out, 29903), tmp_path / "run.log", tmp_path)
        between_saves(out, job)
        set_link(rig.hosts, 1, up=False)
        cut_at = time.monotonic()
        last_step = logged_steps(out)[-1]
        code, took = _ended(job, cut_at, STALL_BOUND_S, list(rig.hosts.names))
        print(f"\nlink cut after step {last_step}: exit {code} in {took:.1f} s (stall timeout {STALL_S} s)")
        assert code == EXIT_STALLED and took <= STALL_BOUND_S, (code, took, job.text()[-3000:])
        assert "the stall watchdog ended the job" in job.text()
        set_link(rig.hosts, 1, up=True)
        complete, last_step = checkpoint_step(out), logged_steps(out)[-1]
        assert complete >= 2 and pointer(out) == f"checkpoint-{complete}", pointer(out)
    print(f"steps lost: {last_step - complete}")


def test_pdsh_frozen_rank_ends_the_job_at_the_stall_timeout(tmp_path):
    out = tmp_path / "run"
    with ssh_hosts("zkfp", subnet=61) as rig:
        job = start(_pdsh_argv(rig, tmp_path, out, 29905), tmp_path / "run.log", tmp_path)
        between_saves(out, job)
        os.kill(rank_pid(rig.hosts.names[1]), signal.SIGSTOP)
        frozen_at = time.monotonic()
        code, took = _ended(job, frozen_at, STALL_BOUND_S, list(rig.hosts.names))
        print(f"\nrank on host 1 frozen: exit {code} in {took:.1f} s (stall timeout {STALL_S} s)")
        assert code == EXIT_STALLED and took <= STALL_BOUND_S, (code, took, job.text()[-3000:])
        # The outer `zero-kit train` prints the report after pdsh returned; host 1's guardian names its stopped
        # rank in it before the kill, whichever host's guardian wrote the report first.
        report = job.text().partition("zero-kit train: the stall watchdog ended the job: ")[2]
        assert f"on {rig.hosts.names[1]}" in report and "was stopped (SIGSTOP?)" in report, job.text()[-3000:]


# --- SLURM: the sbatch script of `zero-kit launch --slurm -- train` (deepspeed --no_ssh per node) ---


def _sbatch_script(tmp: Path, out: Path, port: int, *train: str) -> Path:
    script = tmp / "train.sbatch"
    argv = [*zero_kit("launch"), "--slurm", "--nodes", "2", "--gpus-per-node", "1", "--master-port", str(port),
            "--venv", str(VENV), "--time", "00:10:00", "-o", str(script), "--", "train", "--output", str(out), *JOB,
            *train]  # fmt: skip
    done = subprocess.run(argv, cwd=tmp, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return script


def _sbatch(cluster, script: Path, tmp: Path, name: str, *options: str) -> Job:
    """`sbatch --wait SCRIPT` in the background on node 0; the job's own output goes to TMP/NAME.out."""
    argv = cluster.command(["sbatch", "--wait", f"--output={tmp / name}.out", *options, str(script)])
    return start(argv, tmp / f"{name}.sbatch.log", tmp)


def _job_id(job: Job) -> int:
    return wait_for(lambda: slurm_job_id(job.text()), "sbatch's job id", job, timeout=60)


def _slurm_output(tmp: Path, name: str) -> str:
    path = tmp / f"{name}.out"
    return path.read_text(errors="replace") if path.is_file() else ""


@pytest.fixture(scope="module")
def slurm_reference(tmp_path_factory, cpu_ops) -> Path:
    tmp = tmp_path_factory.mktemp("zkf_slurm_ref")
    with slurm_cluster("zkft", subnet=64) as cluster:
        job = _sbatch(cluster, _sbatch_script(tmp, tmp / "run", 29910), tmp, "ref")
        assert job.wait(RUN_TIMEOUT_S) == 0, job.text()[-2000:] + _slurm_output(tmp, "ref")[-4000:]
    print(f"\nslurm reference: {time.monotonic() - job.started:.0f} s")
    return tmp / "run"


def test_slurm_preemption_saves_exits_75_and_leaves_its_checkpoint(tmp_path):
    """The resume from a preemption's checkpoint (bitwise to the end) is the requeue test's second restart."""
    out = tmp_path / "run"
    script = _sbatch_script(tmp_path, out, 29912)
    with slurm_cluster("zkfs", subnet=63) as cluster:
        job = _sbatch(cluster, script, tmp_path, "run")
        job_id = _job_id(job)
        after_first_checkpoint(out, job)
        done = cluster.run(["scancel", "--signal=TERM", str(job_id)], timeout=30)
        assert done.returncode == 0, done.stderr
        term_at = time.monotonic()
        code = job.wait(RUN_TIMEOUT_S)
        took = time.monotonic() - term_at
        text = _slurm_output(tmp_path, "run")
        stopped_at = logged_steps(out)[-1]
        print(f"\nscancel --signal=TERM after step 2+: sbatch exit {code} in {took:.1f} s, stopped at {stopped_at}")
        print(text[-3000:])
        assert "SIGTERM received" in text, text[-3000:]
        assert checkpoint_step(out) == stopped_at, (pointer(out), stopped_at)
        assert code == EXIT_PREEMPTED, (code, text[-3000:])


# --- Slurm's own requeue (JobRequeue=1, `#SBATCH --requeue` in zero-kit's script): the same job runs again ---


def _requeued(cluster, job_id: int, restarts: int, job: Job) -> None:
    """Slurm counted `restarts` requeues of the job (at a node failure: once it declared the node DOWN)."""
    wait_for(lambda: cluster.job_state(job_id)[1] >= restarts, f"requeue {restarts} of job {job_id}", job, poll=0.5)


def _said(tmp: Path, needle: str, job: Job) -> str:
    """Wait for `needle` in the job's output (appended to by every run of the script) and return that output."""
    return wait_for(lambda: needle in (text := _slurm_output(tmp, "run")) and text, repr(needle), job, poll=0.2)


def test_slurm_requeues_the_job_itself_after_node_loss_and_preemption_and_it_finishes_bitwise(
    tmp_path, slurm_reference
):
    """A node lost: Slurm requeues the job once the node is DOWN and starts it again when the node is back; then
    `scontrol requeue` (what PreemptMode=REQUEUE does: SIGTERM, the ranks save and exit 75, then the job is requeued).
    The same job id runs the script again each time (SLURM_RESTART_COUNT 1, then 2); although the script says
    --resume never, each restart continues from the job's newest complete checkpoint; `sbatch --wait` returns 0 once
    the last run finished, with weights bitwise equal to an uninterrupted run."""
    out = tmp_path / "run"
    script = _sbatch_script(tmp_path, out, 29913, "--resume", "never")
    took: dict[str, float] = {}
    with slurm_cluster("zkfs", subnet=63) as cluster:
        job = _sbatch(cluster, script, tmp_path, "run")
        job_id = _job_id(job)
        after_first_checkpoint(out, job)
        at = lost_at = time.monotonic()
        kill_host(cluster.hosts.names[1])
        for what, step in (
            ("node lost -> requeued (node DOWN)", lambda: _requeued(cluster, job_id, 1, job)),
            ("-> node back", lambda: cluster.restart_slurmd(1)),
            ("-> restart 1 started", lambda: _said(tmp_path, f"restart 1 of job {job_id} on", job)),
            ("-> resumed", lambda: _said(tmp_path, RESUMING, job)),
        ):
            step()
            took[what], at = time.monotonic() - at, time.monotonic()
        complete_at_loss, records = checkpoint_step(out), len(logged_steps(out))
        wait_for(lambda: len(logged_steps(out)) > records, "a step of restart 1", job)
        at = preempted_at = time.monotonic()
        done = cluster.run(["scontrol", "requeue", str(job_id)], timeout=30)
        assert done.returncode == 0, done.stderr
        for what, step in (
            ("scontrol requeue -> requeued", lambda: _requeued(cluster, job_id, 2, job)),
            ("-> restart 2 started", lambda: _said(tmp_path, f"restart 2 of job {job_id} on", job)),
        ):
            step()
            took[what], at = time.monotonic() - at, time.monotonic()
        code = job.wait(RUN_TIMEOUT_S)
        took["-> finished"] = time.monotonic() - at
        assert cluster.job_state(job_id) == ("COMPLETED", 2), cluster.job_state(job_id)
    text = _slurm_output(tmp_path, "run")
    print("\nslurm requeue: " + "; ".join(f"{what} {seconds:.1f} s" for what, seconds in took.items()))
    print(
        f"node loss to finish {time.monotonic() - lost_at:.0f} s, preemption to finish {time.monotonic() - preempted_at:.0f} s"
    )
    assert code == 0, (code, text[-4000:])
    assert took["node lost -> requeued (node DOWN)"] <= SLURM_NODE_LOSS_BOUND_S, took
    stopped = re.search(r"preempted \(SIGTERM\) at step (\d+), exit 75; checkpoint left: \S+/checkpoint-(\d+) ", text)
    assert stopped and stopped.group(1) == stopped.group(2), text[-4000:]
    resumed = [int(line.rsplit("checkpoint-", 1)[1].split()[0]) for line in text.splitlines() if RESUMING in line]
    assert resumed == [complete_at_loss, int(stopped.group(1))], text[-4000:]
    assert "zero-kit train: starting fresh" in text.split(f"restart 1 of job {job_id}")[0], text[-4000:]
    for restart, step in ((1, complete_at_loss), (2, int(stopped.group(1)))):
        said = f"requeued by Slurm: restart {restart} of job {job_id}; continuing from {out}/checkpoint-{step},"
        assert said in text, text[-4000:]
    assert_finished_like(out, slurm_reference)
