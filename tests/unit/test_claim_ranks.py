"""Issue 52, ranks outlive no job: a relaunch's rank binds to its parent (checkpoints.claim.bind_rank) and leaves
within a second of its death; while ranks of a run whose holder died still hold OUTPUT/.zero_kit_claim.ranks, no run
takes the claim over (it waits, then refuses); a holder that is a zombie is dead. The real launch:
tests/mistakes/test_mistakes_signals.py (kill -9 of the `zero-kit train` process)."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from zero_kit.checkpoints import claim
from zero_kit.errors import EXIT_PREEMPTED, UserError

PY = sys.executable


def _holder_of(proc: subprocess.Popen) -> claim.Holder:
    """`proc` as a claim's holder on this host."""
    return dataclasses.replace(claim.me({}), pid=proc.pid, pid_started=psutil.Process(proc.pid).create_time())


def _dead_holder(output) -> claim.Holder:
    """A claim file whose holder is gone (a process that ran and was reaped)."""
    gone = subprocess.Popen([PY, "-c", "pass"])
    holder = _holder_of(gone)
    gone.wait()
    output.mkdir(parents=True, exist_ok=True)
    record = {key: value for key, value in dataclasses.asdict(holder).items() if key != "beat"}
    (output / claim.CLAIM).write_text(json.dumps(record), encoding="utf-8")
    return holder


def _rank_lock(output) -> int:
    """What a bound rank holds: a shared flock on OUTPUT/RANKS (another open file: it conflicts with this process's
    own exclusive attempts as another process's would)."""
    fd = os.open(output / claim.RANKS, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def test_no_take_over_while_the_dead_holders_ranks_run(tmp_path, capsys):
    _dead_holder(tmp_path)
    rank = _rank_lock(tmp_path)
    try:
        with pytest.raises(UserError) as refused:
            claim.take(tmp_path, claim.me({}), ranks_wait_s=0.5)
    finally:
        os.close(rank)
    line = str(refused.value)
    assert refused.value.exit_code == EXIT_PREEMPTED
    assert f"--output {tmp_path}: the ranks of a run that is gone (pid " in line
    assert "still run on this host after 0 s; nothing was changed" in line and str(tmp_path / claim.RANKS) in line
    assert "waiting up to 0 s for them to stop" in capsys.readouterr().err
    taken = claim.take(tmp_path, claim.me({}), ranks_wait_s=0.5)  # they stopped: the claim is this run's
    taken.release()
    assert not (tmp_path / claim.RANKS).exists() and not (tmp_path / claim.CLAIM).exists()


def test_the_take_over_waits_for_the_ranks_to_stop(tmp_path):
    gone = _dead_holder(tmp_path)
    rank = _rank_lock(tmp_path)
    threading.Timer(0.5, os.close, args=(rank,)).start()  # the orphaned ranks saw their parent gone and left
    started = time.monotonic()
    taken = claim.take(tmp_path, claim.me({}), ranks_wait_s=30)
    try:
        assert 0.4 < time.monotonic() - started < 10 and taken.holder.pid == os.getpid() != gone.pid
    finally:
        taken.release()


def test_the_holder_keeps_the_ranks_file_while_a_rank_holds_it(tmp_path):
    held = claim.take(tmp_path, claim.me({}))
    rank = _rank_lock(tmp_path)
    held.release()
    assert (tmp_path / claim.RANKS).exists(), "a later take must still find the ranks"
    os.close(rank)


BOUND_RANK = """
import os, pathlib, sys, time
from zero_kit.checkpoints import claim
print(claim.bind_rank(pathlib.Path(sys.argv[1]), os.environ), flush=True)
time.sleep(30)
"""


def test_a_bound_rank_holds_the_ranks_file_and_leaves_when_its_parent_dies(tmp_path):
    parent = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    env = {**os.environ, claim.PARENT_ENV: json.dumps(dataclasses.asdict(_holder_of(parent))), "RANK": "1"}
    rank = subprocess.Popen([PY, "-c", BOUND_RANK, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert rank.stdout.readline().strip() == "True"
        assert claim._is_held(tmp_path / claim.RANKS)
        parent.send_signal(signal.SIGKILL)  # not reaped yet: a zombie is gone too
        _, err = rank.communicate(timeout=10)
    finally:
        for proc in (parent, rank):
            proc.kill()
            proc.wait()
    assert rank.returncode == 1
    assert f"zero-kit train: rank 1 stops: the process that started the job (pid {parent.pid} on " in err
    assert not claim._is_held(tmp_path / claim.RANKS)


def test_only_a_relaunchs_ranks_on_its_host_bind(tmp_path):
    assert not claim.bind_rank(tmp_path, {})  # ranks of an outside launcher
    elsewhere = dataclasses.replace(claim.me({}), host="another-host")
    assert not claim.bind_rank(tmp_path, {claim.PARENT_ENV: json.dumps(dataclasses.asdict(elsewhere))})
    assert not (tmp_path / claim.RANKS).exists()
    record = json.loads(claim.parent_env()[claim.PARENT_ENV])
    assert claim.on_this_host(claim.Holder(**record)) and record["pid"] == os.getpid()
