"""One job per output (issue 39), at the claim's level: a second run refused in one line naming the holder and the
ways on, with nothing changed; a holder killed with SIGKILL, one that died elsewhere (its heartbeat stopped) and one
whose pid was reused are taken over; a requeued Slurm job waits for its own earlier run instead of being refused;
a relaunch's rank 0 checks the claim it was handed; `zero-kit export` of a live run's output takes its newest
complete checkpoint. The launches themselves: tests/dist/test_output_claim_runs.py; across two hosts on one
filesystem: tests/multinode/test_cluster_train.py (the pdsh launch)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import docs
from zero_kit.checkpoints import claim, store
from zero_kit.errors import EXIT_PREEMPTED, UserError
from zero_kit.export.checks import live_run_checkpoint


def _me(**changes) -> claim.Holder:
    return dataclasses.replace(claim.me({}), **changes)


@pytest.fixture
def no_waiting(monkeypatch):
    """claim's clock, with a sleep that fails the test: a take that must answer at once makes no poll (no wall-clock
    bound to miss on a loaded machine). The flock itself is tried once (flock_within(fd, 0))."""

    def sleep(seconds: float) -> None:
        raise AssertionError(f"claim waited ({seconds} s) where it must answer at once")

    monkeypatch.setattr(claim, "time", SimpleNamespace(time=time.time, sleep=sleep))


def _tree(path) -> dict:
    """Every entry under `path` with its size and mtime: what a refused run must leave as it was."""
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}


def _plant(output, beat_age_s: float = 0.0, **fields) -> claim.Holder:
    """A claim file as another run left it (no flock held), its heartbeat `beat_age_s` old."""
    record = {"host": "elsewhere", "pid": 4242, "pid_started": 1.0, "job_id": None, "restart": 0,
              "started": time.time() - 60, **fields}  # fmt: skip
    output.mkdir(parents=True, exist_ok=True)
    path = output / claim.CLAIM
    path.write_text(json.dumps(record), encoding="utf-8")
    beat = time.time() - beat_age_s
    os.utime(path, (beat, beat))
    return claim.read(path)


def test_a_second_run_is_refused_in_one_line_and_changes_nothing(tmp_path):
    out = tmp_path / "out"
    first = claim.take(out, _me())
    try:
        (out / "train_log.jsonl").write_text('{"step": 1}\n')
        before = _tree(out)
        with pytest.raises(UserError) as refused:
            claim.take(out, _me(pid=first.holder.pid + 1))  # another open of the file: its flock is held
        assert _tree(out) == before
    finally:
        first.release()
    line = str(refused.value)
    assert refused.value.exit_code == 2 and "\n" not in line
    assert f"--output {out} is in use by another run" in line
    assert f"pid {os.getpid()} on {first.holder.host}" in line and "since " in line
    assert "Wait for it to end, pass another --output, or stop it with `kill" in line
    assert not (out / claim.CLAIM).exists()  # released: the next run finds the output free
    claim.take(out, _me()).release()


def test_the_refusal_names_the_slurm_job_and_scancel(tmp_path):
    holder = _plant(tmp_path, job_id="777", restart=2)
    line = str(claim.refusal(tmp_path, holder, time.time()))
    assert "pid 4242 on elsewhere, Slurm job 777 restart 2" in line
    assert "`kill 4242` on elsewhere or `scancel 777`" in line
    on_node1 = claim.refusal(
        Path("out"), _plant(tmp_path / "node1", beat_age_s=3, host="node1", job_id="777"), time.time()
    )
    sample = docs.covered("in-use").text  # docs/training.md's, its time of day and heartbeat age any number
    assert docs.missing_lines(sample, f"zero-kit train: error: {on_node1}", shape=True) == []


_HOLDER = """
import sys, time
from pathlib import Path
from zero_kit.checkpoints import claim
held = claim.take(Path(sys.argv[1]), claim.me({}))
print("held", flush=True)
time.sleep(600)
"""


def test_a_holder_killed_with_sigkill_is_taken_over_at_once(tmp_path, capsys, no_waiting):
    """The kernel drops the dead holder's flock, and its pid no longer runs: no wait, one line says so."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"pid {proc.pid} on"):
            claim.take(tmp_path, _me())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    taken = claim.take(tmp_path, _me())  # no_waiting: any poll fails the test
    try:
        assert claim.read(tmp_path / claim.CLAIM).token == taken.holder.token
        assert f"took over {tmp_path} from a run that is gone (pid {proc.pid} on" in capsys.readouterr().err
    finally:
        taken.release()


def test_a_reused_pid_is_not_the_holder(tmp_path):
    """Same host, a pid that runs again but as another process (another start time): dead."""
    mine = _me()
    holder = _plant(tmp_path, host=mine.host, pid=os.getpid(), pid_started=mine.pid_started - 100)
    assert not claim.is_alive(holder, time.time(), mine.host)
    assert claim.is_alive(dataclasses.replace(holder, pid_started=mine.pid_started), time.time(), mine.host)
    claim.take(tmp_path, mine).release()


def test_a_hostname_two_machines_share_is_not_one_host(tmp_path):
    """Same hostname, another boot id (another machine, or this one before a reboot): its pid means nothing here, so
    the heartbeat decides; a record without a boot id (older zero-kit) is judged by the hostname as before."""
    mine = _me()
    assert mine.boot_id == claim.boot_id() and mine.boot_id  # Linux: /proc/sys/kernel/random/boot_id
    alive_pid = {"host": mine.host, "pid": os.getpid(), "pid_started": mine.pid_started}
    twin = _plant(tmp_path, beat_age_s=claim.STALE_S + 1, boot_id="another-machine", **alive_pid)
    assert not claim.is_alive(twin, time.time(), mine.host, mine.boot_id)  # not this pid: a stale heartbeat
    fresh = _plant(tmp_path, beat_age_s=1, pid=1, pid_started=1.0, host=mine.host, boot_id="another-machine")
    assert claim.is_alive(fresh, time.time(), mine.host, mine.boot_id)  # pid 1 here is not it: a live heartbeat
    with pytest.raises(UserError, match=f"pid 1 on {mine.host}"):
        claim.take(tmp_path, mine)
    legacy = _plant(tmp_path, beat_age_s=1, **alive_pid)
    assert legacy.boot_id is None and claim.is_alive(legacy, time.time(), mine.host, mine.boot_id)
    taken = claim.take(tmp_path / "fresh", mine)
    try:
        assert claim.read(tmp_path / "fresh" / claim.CLAIM).boot_id == mine.boot_id
    finally:
        taken.release()


def test_another_hosts_claim_lives_while_its_heartbeat_does(tmp_path):
    """flock may be local to each host on a shared filesystem: another host's holder is judged by its heartbeat."""
    _plant(tmp_path, beat_age_s=5)
    with pytest.raises(UserError, match="pid 4242 on elsewhere"):
        claim.take(tmp_path, _me())
    _plant(tmp_path, beat_age_s=claim.STALE_S + 1)
    claim.take(tmp_path, _me()).release()


def test_a_holder_beats_while_it_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(claim, "HEARTBEAT_S", 0.05)
    held = claim.take(tmp_path, _me())
    try:
        path = tmp_path / claim.CLAIM
        os.utime(path, (1.0, 1.0))
        deadline = time.monotonic() + 30  # a bound against a heartbeat that never comes, not a speed target
        while path.stat().st_mtime == 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert time.time() - path.stat().st_mtime < 5  # the heartbeat touched it again (to now)
    finally:
        held.release()


def test_a_requeued_job_waits_for_its_earlier_run_then_takes_the_claim(tmp_path, monkeypatch, capsys):
    """Slurm requeued job 42 while its restart 0 was still saving on another node: restart 1 is never refused for
    it; it waits, saying so, and takes the claim once the earlier run's heartbeat stops."""
    monkeypatch.setattr(claim, "POLL_S", 0.05)
    _plant(tmp_path, job_id="42", restart=0, beat_age_s=1)
    threading.Timer(0.5, lambda: _plant(tmp_path, job_id="42", restart=0, beat_age_s=claim.STALE_S + 1)).start()
    start = time.monotonic()
    taken = claim.take(tmp_path, _me(job_id="42", restart=1), wait_s=30)
    try:
        assert 0.4 < time.monotonic() - start < 10
        err = capsys.readouterr().err
        assert f"requeued job 42 (restart 1): waiting up to 30 s for its earlier run to let go of {tmp_path}" in err
        assert "took over" in err
        assert claim.read(tmp_path / claim.CLAIM).restart == 1
    finally:
        taken.release()


def test_a_requeued_job_whose_earlier_run_never_lets_go_exits_75_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(claim, "POLL_S", 0.05)
    earlier = _plant(tmp_path, job_id="42", restart=0)
    with pytest.raises(UserError) as later:
        claim.take(tmp_path, _me(job_id="42", restart=1), wait_s=0.3)
    assert later.value.exit_code == EXIT_PREEMPTED and "still holds it after 0 s" in str(later.value)
    assert claim.read(tmp_path / claim.CLAIM) == dataclasses.replace(earlier, beat=earlier.beat)


def test_another_job_or_the_same_restart_is_refused_at_once(tmp_path, no_waiting):
    _plant(tmp_path, job_id="42", restart=0)
    for mine in (_me(job_id="43", restart=1), _me(job_id="42", restart=0), _me()):
        with pytest.raises(UserError, match="is in use by another run") as refused:
            claim.take(tmp_path, mine, wait_s=30)  # no_waiting: a poll (the requeue wait) fails the test
        assert refused.value.exit_code == 2


def test_rank_0_of_a_relaunch_checks_the_claim_it_was_handed(tmp_path):
    held = claim.take(tmp_path, _me())
    try:
        claim.check_handed(tmp_path, held.holder.token)  # the parent holds it; rank 0 only checks the plan's token
        assert claim.hold_claim(tmp_path, {"RANK": "1", "WORLD_SIZE": "2"}).holder is None  # not RANK 0's to take
        with pytest.raises(UserError, match="the claim this run's launcher took is gone"):
            claim.check_handed(tmp_path, "otherhost:1:2.0")
    finally:
        held.release()


def _complete_checkpoint(output, step: int) -> None:
    ckpt = output / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "weights.bin").write_bytes(b"w")
    store.write_manifest(ckpt, step=step, world_size=1)


def test_export_of_a_live_runs_output_takes_its_newest_complete_checkpoint(tmp_path):
    _complete_checkpoint(tmp_path, 5)
    store.mark_partial(tmp_path / "checkpoint-10")  # being written now
    assert live_run_checkpoint(tmp_path) is None  # no run holds it: export's own checks say what to do
    held = claim.take(tmp_path, _me())
    try:
        ckpt, line = live_run_checkpoint(tmp_path)
        assert ckpt == tmp_path / "checkpoint-5"
        assert line.startswith(f"the run in {tmp_path} is still going (pid {os.getpid()}")
        assert line.endswith("exporting checkpoint-5, its newest complete checkpoint")
        assert live_run_checkpoint(tmp_path / "checkpoint-5") is None  # a checkpoint named: exported as named
    finally:
        held.release()
