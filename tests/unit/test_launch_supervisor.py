"""zero_kit.launch's supervisor with tiny `python` children: the first failure ends the rest, the timeout ends
everything, SIGTERM and SIGINT reach every rank (also ranks a launcher put into sessions of their own), a stall
marker becomes the watchdog's exit code, and no child outlives the supervisor."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from zero_kit.launch import EXIT_TIMED_OUT, Launch, Output, supervise
from zero_kit.watchdog import EXIT_STALLED, MARKER

PY = sys.executable
RANK = """
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def stop(signum, frame):
    (out / f"{os.getpid()}.sig").write_text(str(signum))
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
(out / f"{os.getpid()}.pid").write_text("")
time.sleep(60)
"""
# Like torchrun: every rank in a session of its own; the launcher's exit code is its first failing rank's.
LAUNCHER = """
import subprocess, sys, time
ranks = [subprocess.Popen([sys.executable, "-m", "zk_rank", sys.argv[1]], start_new_session=True) for _ in range(2)]
if sys.argv[2] == "orphan":
    time.sleep(1.5)
    sys.exit(1)
sys.exit(max(rank.wait() for rank in ranks))
"""


def _rank_job(tmp_path: Path, mode: str = "wait") -> tuple[Launch, dict[str, str]]:
    (tmp_path / "zk_rank.py").write_text(RANK)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return Launch("zk_rank", [[PY, str(tmp_path / "launcher.py"), str(tmp_path), mode]]), env


def _pids(tmp_path: Path, suffix: str) -> list[int]:
    return [int(p.stem) for p in tmp_path.glob(f"*.{suffix}")]


def _when_ranks_run(tmp_path: Path, action) -> threading.Thread:
    def watch() -> None:
        deadline = time.monotonic() + 30
        while len(_pids(tmp_path, "pid")) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        action()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_first_failure_ends_the_others():
    started = time.monotonic()
    launch = Launch("m", [[PY, "-c", "import time; time.sleep(60)"], [PY, "-c", "import sys; sys.exit(3)"]])
    outcome = supervise(launch)
    assert outcome.exit_code == 3 and outcome.codes == [-signal.SIGKILL, 3]
    assert time.monotonic() - started < 20


def test_the_timeout_ends_everything_and_says_so():
    outcome = supervise(Launch("m", [[PY, "-c", "import time; time.sleep(60)"]]), timeout=0.5)
    assert outcome.timed_out and outcome.exit_code == EXIT_TIMED_OUT


def test_output_goes_line_by_line_to_the_caller():
    lines = []
    launch = Launch("m", [[PY, "-c", "print('a'); print('b')"], [PY, "-c", "print('c')"]])
    assert supervise(launch, output=Output(on_line=lambda i, line: lines.append((i, line)))).exit_code == 0
    assert sorted(lines) == [(0, "a\n"), (0, "b\n"), (1, "c\n")]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_reaches_every_rank_and_no_child_survives(tmp_path, signum):
    launch, env = _rank_job(tmp_path)
    _when_ranks_run(tmp_path, lambda: os.kill(os.getpid(), signum))
    outcome = supervise(launch, env=env, timeout=60)
    ranks = _pids(tmp_path, "pid")
    assert len(ranks) == 2 and sorted(_pids(tmp_path, "sig")) == sorted(ranks)
    assert {p.read_text() for p in tmp_path.glob("*.sig")} == {str(int(signum))}
    assert outcome.exit_code == 75 and outcome.signal == signum and not outcome.timed_out
    assert not any(_alive(pid) for pid in ranks)
    if signum == signal.SIGINT:
        with pytest.raises(KeyboardInterrupt):
            outcome.reraise()


def test_ranks_orphaned_by_their_launcher_are_killed(tmp_path):
    launch, env = _rank_job(tmp_path, "orphan")
    outcome = supervise(launch, env=env, timeout=60)
    ranks = _pids(tmp_path, "pid")
    assert outcome.exit_code == 1 and len(ranks) == 2
    assert not any(_alive(pid) for pid in ranks), "a rank outlived the supervisor"


def test_a_stall_marker_turns_the_exit_code_into_exit_stalled(tmp_path, capsys):
    write = (
        f"import pathlib, sys; pathlib.Path({str(tmp_path)!r}, {MARKER!r}).write_text('rank 1 stopped'); sys.exit(1)"
    )
    outcome = supervise(Launch("m", [[PY, "-c", write]]), own_groups=False, stall_dir=tmp_path, name="zero-kit train")
    assert outcome.exit_code == EXIT_STALLED and outcome.stall_report == "rank 1 stopped"
    assert "zero-kit train: the stall watchdog ended the job: rank 1 stopped" in capsys.readouterr().err
    clean = supervise(Launch("m", [[PY, "-c", "pass"]]), stall_dir=tmp_path)
    assert clean.exit_code == 0 and clean.stall_report is None
