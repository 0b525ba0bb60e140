"""The stall watchdog on a real two-rank ZeRO-3 job (`zero-kit train --nproc 2`, gloo): a rank frozen with SIGSTOP
mid-run used to hang the job until the scheduler's wall clock (gloo's collective timeout does not fire on it);
now the job ends within --stall-timeout + a stated margin, exits 76 with a report naming the frozen rank, and
leaves no process behind. A healthy run with the same watchdog is not disturbed."""

from __future__ import annotations

import os
import signal
import time

import pytest
from reliability_helpers import rank_pid, start

from tests.support.jobs import kill_group, survivors, wait_for
from tests.support.runs import logged_steps
from zero_kit.watchdog import EXIT_STALLED, KILL_GRACE_S, POLL_S

# serial: stall timeouts measured in wall time; never beside another test
pytestmark = [pytest.mark.dist, pytest.mark.serial]
STALL_S = 15
# Detection polls every POLL_S, the frozen rank's guardian waits KILL_GRACE_S for it, then the launchers react.
MARGIN_S = 2 * POLL_S + KILL_GRACE_S + 15


def test_a_frozen_rank_ends_the_job_within_the_stall_timeout(tmp_path):
    out = tmp_path / "run"
    job = start(out, 29850, "--max-steps", "400", "--save-steps", "1000", "--stall-timeout", str(STALL_S))
    try:
        wait_for(lambda: len(logged_steps(out)) >= 3, "three steps", job, poll=0.005)
        frozen = rank_pid(job, 1)
        signal_at = time.monotonic()
        os.kill(frozen, signal.SIGSTOP)
        code = job.proc.wait(timeout=STALL_S + MARGIN_S + 60)
        took = time.monotonic() - signal_at
        assert code == EXIT_STALLED, job.text()[-3000:]
        assert took <= STALL_S + MARGIN_S, f"{took:.1f} s from SIGSTOP to exit"
        text = job.text()
        assert "the stall watchdog ended the job" in text and "rank 1" in text and "stopped" in text, text[-3000:]
        print(f"SIGSTOP -> exit {code} in {took:.1f} s (stall timeout {STALL_S} s)")
    finally:
        if job.proc.poll() is None:
            kill_group(job.proc)
    assert not survivors(job.proc.pid)


def test_a_healthy_run_is_not_ended_by_the_watchdog(tmp_path):
    out = tmp_path / "run"
    job = start(out, 29851, "--max-steps", "4", "--stall-timeout", "30")
    assert job.wait(timeout=300) == 0, job.text()[-3000:]
    assert "stall watchdog" not in job.text()
