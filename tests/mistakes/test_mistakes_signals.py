"""Issue 30, cases 3 and 4, and issue 52: a signal stops a two-rank `zero-kit train --nproc 2` (the real deepspeed
launcher, the embedded model, gloo on CPU) once and cleanly, however it is sent:
  1. SIGINT to the `zero-kit` process only (a wrapper script, a notebook's stop button): exit 130;
  2. SIGINT to the whole process group of a `setsid` job (Ctrl-C in a terminal: the launchers and both ranks get it
     too), and once more 0.2 s later (a wrapper in the group forwarding it): exit 130, one Ctrl-C, with a save slower
     than the deepspeed launcher's patience (see SLOW_SAVE).
Each time every rank finishes its step and saves it, the last line (printed once) names what happened, the step, the
checkpoint left and the command that continues, there is no traceback, and no process of the job (the launcher, both
ranks, their watchdogs) is alive afterwards. The cases share one output directory and each runs the command the
previous one printed, so `--resume auto` is proven to continue exactly where the signal stopped the run.
Last, kill -9 of the `zero-kit` process (the OOM killer, a lost session), started with the command case 2 printed
(it resumes at that stop): every process of the job is gone within 30 s, and a run taking the output over waits
until no rank of the killed job lives.

SIGTERM to the `zero-kit` process (a scheduler's notice: exit 75, EXIT_PREEMPTED), once a third case here with a
launch of its own, is checked the same way (the last line, printed once, no traceback, no process of the job left,
the printed command, the stop time) on a launch the suite makes anyway: tests/dist/test_reliability.py's test 3
(ZeRO-3, the same `zero-kit train` signal path), whose test 4 resumes it to the weights of an uninterrupted run.
"""

from __future__ import annotations

import os
import shlex
import signal
import time

import psutil
import pytest

from tests.support.jobs import (
    FAST,
    Descendants,
    assert_stopped_cleanly,
    env,
    kill_group,
    start,
    survivors,
    wait_for,
    zero_kit,
)
from tests.support.runs import logged_steps, pointer, resumed_from
from zero_kit.checkpoints import claim

pytestmark = [pytest.mark.dist, pytest.mark.serial]  # signals and bounded stop times: never beside another test
STOP_S = 60  # from the signal to the command's exit: one step, one small save, the launcher's 1 s poll
TIMEOUT_S = 300
GONE_S = 30  # from a kill -9 of the command to the last process of its job gone
SLOW_SAVE = """
import os
_cmdline = open("/proc/self/cmdline", "rb").read().split(b"\\0")
if b"deepspeed.launcher.launch" in _cmdline:
    import psutil
    _wait_procs = psutil.wait_procs
    psutil.wait_procs = lambda procs, timeout=None, callback=None: _wait_procs(procs, min(timeout or 1, 1), callback)
elif os.environ.get("RANK") == "0" and b"zero_kit.cli" in _cmdline:
    import time
    _makedirs, _slept = os.makedirs, []
    def _slow_makedirs(name, *args, **kwargs):
        _makedirs(name, *args, **kwargs)
        if os.path.basename(os.path.normpath(str(name))).startswith("checkpoint-") and not _slept:
            _slept.append(name)
            time.sleep(3)
    os.makedirs = _slow_makedirs
"""
"""Time compressed for the terminal's Ctrl-C: the deepspeed launch.py answers a SIGINT by SIGTERMing each rank and
SIGKILLing it 30 s later (psutil.wait_procs), here 1 s later; rank 0's save takes 3 s more, as a real model's takes
longer than 30 s. A launcher that acts on the terminal's Ctrl-C kills rank 0 in its save: nothing is left."""
# (case, signal, to the whole process group, exit code, the last line starts with)
CASES = [
    ("sigint_to_the_command", signal.SIGINT, False, 130, "zero-kit train: stopped by Ctrl-C (SIGINT) at step "),
    ("ctrl_c_in_a_terminal", signal.SIGINT, True, 130, "zero-kit train: stopped by Ctrl-C (SIGINT) at step "),
]


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("zk_signals") / "run"
    # No periodic save within reach: a checkpoint of the stop step proves the stop saved it.
    argv = zero_kit("train", "--nproc", "2", "--output", str(out), "--max-steps", "200", "--save-steps", "100", *FAST)
    site = tmp_path_factory.mktemp("zk_slow_save")
    (site / "sitecustomize.py").write_text(SLOW_SAVE, encoding="utf-8")
    return {"out": out, "argv": argv, "slow_save": site}


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case[0] for case in CASES])
def test_a_signal_stops_every_rank_once(chain, index, tmp_path):
    name, signum, whole_group, code, last_line = CASES[index]
    out = chain["out"]
    started = time.monotonic()
    job = start(chain.get("continue", chain["argv"]), tmp_path / f"{name}.log",
                env=env(chain["slow_save"] if whole_group else None))  # fmt: skip
    watch = Descendants(job.proc.pid)
    try:
        steps_before = len(logged_steps(out))
        wait_for(lambda: len(logged_steps(out)) >= steps_before + 2, "two steps", job, timeout=TIMEOUT_S)
        (os.killpg if whole_group else os.kill)(job.proc.pid, signum)
        sent = time.monotonic()
        if whole_group:  # the same Ctrl-C once more, as a wrapper in the terminal's group that forwards it sends it
            time.sleep(0.2)
            os.killpg(job.proc.pid, signum)
        exit_code = job.proc.wait(timeout=STOP_S)
        stop_s = time.monotonic() - sent
    finally:
        left = watch.alive()
        kill_group(job.proc)
    text = job.text()
    print(f"\n{name}: exit {exit_code} {stop_s:.1f} s after the signal; {time.monotonic() - started:.1f} s in all")
    assert exit_code == code, text[-3000:]
    step = logged_steps(out)[-1]
    command = assert_stopped_cleanly(text, out, step, code, last_line, left, job.proc.pid)
    assert "interrupted" not in text, "a rank reported the Ctrl-C on its own"
    assert "second Ctrl-C" not in text, "one Ctrl-C delivered twice counted as two"
    assert pointer(out) == f"checkpoint-{step}", "the stop did not leave a complete checkpoint of its step"
    if "stopped_at" in chain:
        assert resumed_from(text) == chain["stopped_at"], "the printed command did not continue at the stop"
    chain["stopped_at"] = step
    chain["continue"] = zero_kit(*shlex.split(command)[1:])
    assert stop_s < STOP_S


def test_a_killed_command_leaves_no_rank_behind(chain, tmp_path):
    out = chain["out"]
    job = start(chain.get("continue", chain["argv"]), tmp_path / "kill_9.log", env=env())
    watch = Descendants(job.proc.pid)
    try:
        steps_before = len(logged_steps(out))
        wait_for(lambda: len(logged_steps(out)) >= steps_before + 2, "two steps", job, timeout=TIMEOUT_S)
        if "stopped_at" in chain:  # the command the last signal case printed continues at its stop
            assert resumed_from(job.text()) == chain["stopped_at"], job.text()[-3000:]
        ranks = [p for p in list(watch.seen.values()) if _running(p) and "zero_kit.cli" in p.cmdline()[:4]]
        assert len(ranks) == 2 and claim._is_held(out / claim.RANKS), "the ranks did not bind to their job"
        os.kill(job.proc.pid, signal.SIGKILL)
        job.proc.wait()
        killed = time.monotonic()
        taken = claim.take(out, claim.me({}), ranks_wait_s=GONE_S)  # a new run on the same output
        live_ranks = [rank.pid for rank in ranks if _running(rank)]
        taken.release()
        deadline = killed + GONE_S
        while any(_running(p) for p in list(watch.seen.values())) and time.monotonic() < deadline:
            time.sleep(0.1)
        gone_s = time.monotonic() - killed
    finally:
        left = watch.alive()
        kill_group(job.proc)
    print(f"\nkill -9: every process of the job gone {gone_s:.1f} s after the kill")
    assert live_ranks == [], "the output was taken over while a rank of the killed job still ran"
    assert left == [] and survivors(job.proc.pid) == [], f"outlived a kill -9 of the command: {left}"
    assert gone_s < GONE_S
    # Which of the parent-death signal (the launcher), the closed pipe of the parent's relay or a rank's own watch
    # (checkpoints.claim.bind_rank, which says so in OUTPUT/zero_kit.log) ends the ranks first is a race: any is fine.


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
