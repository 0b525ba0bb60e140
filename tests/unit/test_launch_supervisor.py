"""zero_kit.launch's supervisor with tiny `python` children: the first failure ends the rest, the timeout ends
everything, SIGTERM and SIGINT reach every rank (also ranks a launcher put into sessions of their own) and the launch
then exits 128 + the signal's number, a rank that ignores the signal is killed after the grace, a second SIGINT kills
at once while one Ctrl-C delivered twice is one, launchers in our group block a terminal's SIGINT (a handler of their
own does not fire), a launcher gets SIGTERM when the process that started it dies, a stall marker becomes the
watchdog's exit code, and no child outlives the supervisor."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from zero_kit.launch import EXIT_TIMED_OUT, Launch, Output, supervise
from zero_kit.launch.supervisor import exit_code_for
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


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler in this process for the test (KeyboardInterrupt), whatever an earlier test in the
    same pytest worker left installed; restored after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_reaches_every_rank_and_no_child_survives(tmp_path, signum, default_sigint):
    launch, env = _rank_job(tmp_path)
    _when_ranks_run(tmp_path, lambda: os.kill(os.getpid(), signum))
    outcome = supervise(launch, env=env, timeout=60)
    ranks = _pids(tmp_path, "pid")
    assert len(ranks) == 2 and sorted(_pids(tmp_path, "sig")) == sorted(ranks)
    assert {p.read_text() for p in tmp_path.glob("*.sig")} == {str(int(signum))}
    # The ranks exited 75, the launcher passed that on; what the user did decides (issue 30: 130 / 143).
    assert outcome.codes == [75] and outcome.exit_code == 128 + signum
    assert outcome.signal == signum and not outcome.timed_out
    assert not any(_alive(pid) for pid in ranks)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the supervisor put the caller's back
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


@pytest.mark.parametrize(
    ("signum", "report", "timed_out", "first_failure", "expected"),
    [
        (signal.SIGINT, None, False, 1, 130),  # the deepspeed launcher's 1 after a terminal's Ctrl-C
        (signal.SIGTERM, None, False, 75, 143),
        (signal.SIGINT, "rank 1 stopped", True, 1, 130),  # the user's action comes first
        (None, "rank 1 stopped", False, 1, EXIT_STALLED),
        (None, None, True, -9, EXIT_TIMED_OUT),
        (None, None, False, 3, 3),
        (None, None, False, 0, 0),
    ],
)
def test_exit_code_mapping(signum, report, timed_out, first_failure, expected):
    assert exit_code_for(signum, report, timed_out, first_failure) == expected


STUBBORN = """
import pathlib, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
pathlib.Path(sys.argv[1]).write_text("")
time.sleep(60)
"""


def _stubborn(tmp_path: Path) -> Launch:
    (tmp_path / "zk_stubborn.py").write_text(STUBBORN)
    return Launch("zk_stubborn", [[PY, "-m", "zk_stubborn", str(tmp_path / "ready")]])


def test_a_rank_that_does_not_stop_is_killed_after_the_grace(tmp_path):
    launch = _stubborn(tmp_path)
    threading.Thread(target=_signal_when(tmp_path / "ready", signal.SIGTERM), daemon=True).start()
    started = time.monotonic()
    outcome = supervise(launch, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=60, grace=1.0)
    assert outcome.exit_code == 143 and outcome.codes == [-signal.SIGKILL]
    assert time.monotonic() - started < 20


def test_a_second_sigint_kills_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("zero_kit.launch.supervisor.SAME_CTRL_C_S", 0.1)  # pressed again 0.3 s later: a second Ctrl-C
    launch = _stubborn(tmp_path)
    threading.Thread(target=_signal_when(tmp_path / "ready", signal.SIGINT, times=2), daemon=True).start()
    started = time.monotonic()
    outcome = supervise(launch, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=60, grace=50.0)
    assert outcome.exit_code == 130 and outcome.codes == [-signal.SIGKILL]
    assert time.monotonic() - started < 20, "the second Ctrl-C waited for the grace"
    assert "zero-kit: a second Ctrl-C: stopping every process at once" in capsys.readouterr().err


SAVING = """
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
heard = []
signal.signal(signal.SIGINT, lambda signum, frame: heard.append(signum))
(out / f"{os.getpid()}.pid").write_text("")
while not heard:
    time.sleep(0.01)
time.sleep(1.0)  # the save
(out / f"{os.getpid()}.saved").write_text(str(len(heard)))
sys.exit(75)
"""


def test_one_ctrl_c_delivered_twice_is_one(tmp_path, capsys):
    """A terminal's Ctrl-C reaches the whole process group, and a wrapper in it (an IDE's runner, a script's trap) may
    forward it once more: a SIGINT within SAME_CTRL_C_S of the first is that Ctrl-C again, and the ranks save. (0.2 s
    apart: two signals at the same instant reach Python's handler once.)"""
    launch, env = _rank_job(tmp_path)
    (tmp_path / "zk_rank.py").write_text(SAVING)
    _when_ranks_run(tmp_path, lambda: [(os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)) for _ in range(2)])
    outcome = supervise(launch, env=env, timeout=60, grace=30.0)
    assert outcome.exit_code == 130 and outcome.codes == [75]
    assert sorted(_pids(tmp_path, "saved")) == sorted(_pids(tmp_path, "pid")), "a rank was killed before its save"
    assert "second Ctrl-C" not in capsys.readouterr().err


def _signal_when(ready: Path, signum: int, times: int = 1):
    def send() -> None:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        for _ in range(times):
            os.kill(os.getpid(), signum)
            time.sleep(0.3)

    return send


LAUNCHER_WITH_A_HANDLER = """
import os, signal, time
heard = []
signal.signal(signal.SIGINT, lambda signum, frame: heard.append(signum))  # as the deepspeed launch.py does
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.2)
print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []), bool(heard))
"""


def test_launchers_in_our_group_block_a_terminals_sigint():
    """own_groups=False: a launcher must not act on the terminal's Ctrl-C, neither die of it (the local deepspeed
    runner has no handler) nor run a handler of its own (the deepspeed launch.py SIGKILLs ranks still saving 30 s
    later); the supervisor forwards the stop to the ranks instead. Blocked, so that an installed handler stays deaf."""
    lines: list[str] = []
    collect = Output(on_line=lambda i, line: lines.append(line.strip()))
    launch = Launch("m", [[PY, "-c", LAUNCHER_WITH_A_HANDLER]])
    assert supervise(launch, own_groups=False, output=collect).exit_code == 0
    supervise(launch, output=collect)
    assert lines == ["True False", "False True"], "own sessions keep Python's own SIGINT handling"


ORPHANING = """
import os, signal, subprocess, sys, time
from zero_kit.launch.supervisor import _launcher_setup
child = "import pathlib, signal, sys, time; out = pathlib.Path(sys.argv[1]); "
child += "signal.signal(signal.SIGTERM, lambda s, f: (out / 'term').write_text('') or sys.exit(0)); "
child += "import os; (out / 'pid').write_text(str(os.getpid())); (out / 'ready').write_text(''); time.sleep(30)"
subprocess.Popen([sys.executable, "-c", child, sys.argv[1]], preexec_fn=_launcher_setup(shield=True))
while not os.path.exists(os.path.join(sys.argv[1], "ready")):
    time.sleep(0.01)
os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does to the process that started the launcher
"""


def test_a_launcher_gets_sigterm_when_the_process_that_started_it_dies(tmp_path):
    """The parent-death signal: after a kill -9 of the supervising process its launchers stop, not train on."""
    ended = subprocess.run([PY, "-c", ORPHANING, str(tmp_path)], timeout=30, check=False)
    assert ended.returncode == -signal.SIGKILL
    child = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 20
    while not (tmp_path / "term").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    status = ["gone"]
    with contextlib.suppress(psutil.Error):
        launcher = psutil.Process(child)
        if str(tmp_path) in launcher.cmdline():  # not a reused pid: show what its state was, then end it
            status = Path(f"/proc/{child}/status").read_text().splitlines()
            status = [line for line in status if line.startswith(("State", "PPid", "Sig", "ShdPnd"))]
            launcher.kill()
    assert (tmp_path / "term").exists(), f"the launcher did not get SIGTERM when its parent died: {status}"


DEAF_ONCE = """
import pathlib, signal, sys, time
heard = []
def hear(signum, frame):
    heard.append(signum)
    if len(heard) > 1:
        sys.exit(75)
signal.signal(signal.SIGTERM, hear)
pathlib.Path(sys.argv[1]).write_text("")
while True:
    time.sleep(0.05)
"""


def test_a_rank_that_missed_the_signal_gets_it_again(tmp_path, monkeypatch):
    """A rank still starting up may lose the first signal (library code that swallows a KeyboardInterrupt): the
    supervisor repeats it during the grace, and a rank takes the repeat as the same request."""
    monkeypatch.setattr("zero_kit.launch.supervisor.RESEND_S", 0.5)
    (tmp_path / "zk_deaf.py").write_text(DEAF_ONCE)
    launch = Launch("zk_deaf", [[PY, "-m", "zk_deaf", str(tmp_path / "ready")]])
    threading.Thread(target=_signal_when(tmp_path / "ready", signal.SIGTERM), daemon=True).start()
    outcome = supervise(launch, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=60, grace=30.0)
    assert outcome.codes == [75] and outcome.exit_code == 143


@pytest.mark.parametrize(
    "deaf",
    ["signal.signal(signal.SIGINT, signal.SIG_IGN)", "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})"],
    ids=["ignores", "blocks"],
)
def test_a_rank_deaf_to_sigint_while_it_starts_gets_sigterm(tmp_path, deaf):
    """Ranks below a launcher started with SIGINT blocked inherit that until they install a handler (an ignored
    SIGINT is inherited likewise): the forwarded Ctrl-C must still end one that is starting up."""
    script = STUBBORN.replace("signal.signal(signal.SIGTERM, signal.SIG_IGN)", "")
    (tmp_path / "zk_starting.py").write_text(script.replace("signal.signal(signal.SIGINT, signal.SIG_IGN)", deaf))
    launch = Launch("zk_starting", [[PY, "-m", "zk_starting", str(tmp_path / "ready")]])
    threading.Thread(target=_signal_when(tmp_path / "ready", signal.SIGINT), daemon=True).start()
    started = time.monotonic()
    outcome = supervise(launch, env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=60, grace=30.0)
    assert outcome.codes == [-signal.SIGTERM] and outcome.exit_code == 130
    assert time.monotonic() - started < 15
