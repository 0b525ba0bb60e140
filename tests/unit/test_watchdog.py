"""The stall watchdog's parts without a process group: when a job counts as stalled, the report, the marker
that only one guardian writes, a guardian ending a frozen (SIGSTOPped) process, and a rank's watcher thread
leaving with EXIT_STALLED while its main thread is blocked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from tests.support.jobs import wait_for
from zero_kit.watchdog import EXIT_STALLED, LONG_PHASE_FACTOR, describe, guard, read_marker, stalled, write_marker


def _beat(phase: str, age: float, now: float, step: int = 3) -> dict:
    return {"rank": 0, "phase": phase, "step": step, "time": now - age, "host": "elsewhere", "pid": 1}


def test_stalled_only_when_every_unfinished_rank_is_past_its_allowance():
    now = since = 1000.0
    assert stalled({0: _beat("train", 11, now), 1: _beat("train", 12, now)}, 10, now, since)
    assert not stalled({0: _beat("train", 11, now), 1: _beat("train", 2, now)}, 10, now, since)  # one moves
    assert not stalled({0: _beat("train", 11, now), 1: _beat("save", 30, now)}, 10, now, since)  # a long save
    assert stalled({0: _beat("train", 11, now), 1: _beat("save", 10 * LONG_PHASE_FACTOR + 1, now)}, 10, now, since)
    assert stalled({0: _beat("train", 11, now), 1: _beat("done", 500, now)}, 10, now, since)  # done ranks wait
    assert not stalled({0: _beat("done", 500, now)}, 10, now, since)  # everyone done: nothing to end
    assert not stalled({0: None, 1: _beat("train", 11, now)}, 10, now, since - 20)  # rank 0 still starting up


def test_report_names_each_unfinished_rank_and_its_phase():
    now = 1000.0
    text = describe({0: _beat("train", 41, now, step=12), 1: None, 2: _beat("done", 1, now)}, 30, now)
    assert "over 30 s" in text and "rank 0 on elsewhere: last in train at step 12, 41 s ago" in text
    assert "rank 1: no heartbeat yet" in text and "rank 2" not in text


def test_only_one_guardian_writes_the_marker(tmp_path):
    assert write_marker(tmp_path, "first") and not write_marker(tmp_path, "second")
    assert read_marker(tmp_path, since=time.time() - 5) == "first"
    assert read_marker(tmp_path, since=time.time() + 60) is None  # a marker from before this run is ignored


def _freeze(pid: int) -> None:
    """SIGSTOP `pid` and wait until it shows as stopped (delivered asynchronously: a loaded machine shows it late)."""
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, f"pid {pid} stopped", timeout=10, poll=0.05)


def test_guardian_kills_a_frozen_rank_and_reports_it(tmp_path):
    frozen = subprocess.Popen(["sleep", "120"])
    try:
        _freeze(frozen.pid)
        since = time.time() - 10
        beat = {"rank": 0, "phase": "train", "step": 5, "time": since, "host": os.uname().nodename, "pid": frozen.pid}
        (tmp_path / "rank0.json").write_text(json.dumps(beat))
        start = time.monotonic()
        assert guard(tmp_path, 0, 1, 2.0, frozen.pid, since) == EXIT_STALLED
        assert frozen.wait(timeout=10) == -signal.SIGKILL
        assert time.monotonic() - start < 12  # poll + grace
        report = read_marker(tmp_path, since)
        assert "rank 0" in report and "last in train at step 5" in report and "stopped" in report, report
    finally:
        if frozen.poll() is None:
            frozen.kill()


def test_a_stopped_rank_is_named_when_another_hosts_guardian_wrote_the_report(tmp_path):
    """The first guardian to notice writes the report; from another host it cannot see the frozen process, so the
    frozen rank's own guardian adds it before killing (across hosts each wins about half the time)."""
    frozen = subprocess.Popen(["sleep", "120"])
    try:
        _freeze(frozen.pid)
        since = time.time() - 10
        assert write_marker(tmp_path, "no rank made progress (written on the other host)")
        assert guard(tmp_path, 1, 2, 2.0, frozen.pid, since) == EXIT_STALLED
        assert frozen.wait(timeout=10) == -signal.SIGKILL
        report = read_marker(tmp_path, since)
        assert report.startswith("no rank made progress") and f"rank 1 on {os.uname().nodename}" in report, report
        assert f"(pid {frozen.pid}) was stopped" in report, report
    finally:
        if frozen.poll() is None:
            frozen.kill()


def test_a_rank_blocked_in_its_main_thread_leaves_with_exit_stalled(tmp_path):
    """The watcher thread ends the process while the main thread waits (as in a collective)."""
    script = textwrap.dedent(f"""
        import threading
        from pathlib import Path
        from zero_kit.watchdog import Heartbeat, write_marker
        beat = Heartbeat(Path({str(tmp_path)!r}), rank=0, world_size=2, stall_timeout=3600).start()
        write_marker(beat.directory, "rank 1 stopped")
        threading.Event().wait()  # blocked for good
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_STALLED, done.stderr
    assert "rank 0 stops: rank 1 stopped" in done.stderr


def _written(directory) -> dict:
    return json.loads((directory / "rank0.json").read_text())


def test_beats_of_one_phase_wait_with_their_own_time_and_a_new_phase_is_written_at_once(tmp_path):
    """A beat at every step rewrote the file every step (0.4-4 ms each on ext4: benchmarks/train_overhead): beats
    of an unchanged phase now wait for write_every_s, keeping the time of the progress they record."""
    from zero_kit.watchdog import Heartbeat

    heartbeat = Heartbeat(tmp_path, 0, 1, stall_timeout=300, write_every_s=60)
    heartbeat.beat("train", 1)  # a new phase: written at once
    for step in range(2, 50):
        heartbeat.beat("train", step)
    assert _written(tmp_path)["step"] == 1
    before = time.time()
    heartbeat.beat("train", 50)
    time.sleep(0.05)
    heartbeat.flush()  # what the watcher thread does every POLL_S
    last = _written(tmp_path)
    assert last["step"] == 50 and before <= last["time"] < before + 0.05  # the beat's time, not the write's
    heartbeat.beat("save", 50)  # a long phase's allowance is in the file before the save starts
    assert _written(tmp_path)["phase"] == "save"
    heartbeat.beat("train", 51)
    assert (_written(tmp_path)["phase"], _written(tmp_path)["step"]) == ("train", 51)
    heartbeat.flush()  # nothing waits: nothing rewritten
    assert _written(tmp_path)["step"] == 51


def test_a_started_heartbeat_writes_the_last_step_beat_from_its_watcher_thread(tmp_path):
    """`start` turns the waiting on (a tenth of --stall-timeout, at most WRITE_EVERY_S); the watcher thread writes
    the last beat within POLL_S, so a rank that stops making progress is reported at the step it reached."""
    script = textwrap.dedent(f"""
        import json, time
        from pathlib import Path
        from zero_kit.watchdog import POLL_S, Heartbeat
        directory = Path({str(tmp_path)!r})
        beat = Heartbeat(directory, rank=0, world_size=1, stall_timeout=3600).start()
        beat.beat("train", 1)
        for step in range(2, 200):
            beat.beat("train", step)
        print(json.loads((directory / "rank0.json").read_text())["step"])
        time.sleep(POLL_S + 0.5)
        print(json.loads((directory / "rank0.json").read_text())["step"])
        beat.stop()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    during, after = (int(line) for line in done.stdout.split())
    assert during < 199 and after == 199


def test_nccl_gets_the_same_timeout_and_async_error_handling():
    from zero_kit.watchdog import nccl_watchdog_env

    env = nccl_watchdog_env(120)
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "120"
    assert "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC" not in nccl_watchdog_env(0)  # watchdog off: torch's default
