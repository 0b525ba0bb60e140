"""One job per output (issue 39), through `zero-kit train --nproc 2` (the relaunching parent holds the claim): a
second identical run on the output is refused in seconds with one line and changes nothing, while `zero-kit
export OUTPUT` exports the live run's newest complete checkpoint; the first run finishes as if alone. Then a run
killed with SIGKILL leaves a claim the next run takes over, and that run, resumed with --max-steps 20 --lr 1e-2
--lr-scheduler constant, says so in one line and trains steps 11-20 at 1e-2. Two full launches (the killed one
is killed as its ranks start); the claim's cases without a launch are in tests/unit/test_output_claim.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.jobs import FAST, env, kill_group, start, survivors, wait_for, zero_kit
from tests.support.runs import log_records, logged_steps, resumed_from, run_info
from zero_kit.checkpoints import store
from zero_kit.checkpoints.claim import CLAIM

pytestmark = pytest.mark.dist

ARGS = [*FAST, "--nproc", "2", "--stage", "2", "--save-steps", "5", "--no-export"]


def _tree(path: Path) -> dict:
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}


def _run(argv: list[str], timeout: int = 120) -> tuple[subprocess.CompletedProcess, float]:
    start_s = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env(), timeout=timeout)
    return done, time.monotonic() - start_s


def _wait_stopped(pgid: int, timeout: float = 10.0) -> None:
    """Until every process of the group is stopped (state T), so the tree taken next cannot change under us."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        group = [p for p in psutil.process_iter() if _pgid(p.pid) == pgid]
        if all(_status(p) in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, None) for p in group):
            time.sleep(0.2)  # a rename the kernel already took is visible by now
            return
        time.sleep(0.05)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _status(process) -> str | None:
    try:
        return process.status()
    except Exception:  # psutil.Error: gone
        return None


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> SimpleNamespace:
    """The first run (10 steps), frozen with SIGSTOP once its first checkpoint is complete, so that while it is
    stopped the output can change only through the second run and the export."""
    root = tmp_path_factory.mktemp("claim")
    out = root / "out"
    job = start(zero_kit("train", *ARGS, "--max-steps", "10", "--output", str(out)), root / "first.log", env=env(),
                reap=True)  # fmt: skip
    wait_for(lambda: store.newest_complete(out), "the first run's first complete checkpoint", job, timeout=300)
    os.killpg(job.proc.pid, signal.SIGSTOP)
    try:
        _wait_stopped(job.proc.pid)  # SIGSTOP lands asynchronously: a heartbeat thread may be writing its file
        before = _tree(out)
        second, second_s = _run(zero_kit("train", *ARGS, "--max-steps", "10", "--output", str(out)))
        after_second = _tree(out)
        export, _ = _run(zero_kit("export", str(out), "--out", str(root / "exported")), timeout=180)
        after_export = _tree(out)
    finally:
        os.killpg(job.proc.pid, signal.SIGCONT)
    code = job.wait(timeout=300)
    return SimpleNamespace(out=out, job=job, code=code, before=before, second=second, second_s=second_s,
                           after_second=after_second, export=export, after_export=after_export)  # fmt: skip


def test_a_second_run_on_the_output_is_refused_in_seconds_with_one_line(first):
    second = first.second
    assert second.returncode == 2 and first.second_s < 15, (second.returncode, first.second_s, second.stderr)
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and second.stdout == "", second.stdout + second.stderr
    line = lines[0]
    assert line.startswith(f"zero-kit train: error: --output {first.out} is in use by another run (pid ")
    assert f"pid {first.job.proc.pid} on " in line and "since " in line
    assert "Wait for it to end, pass another --output, or stop it with `kill " in line
    assert first.after_second == first.before  # nothing written, deleted or touched by the refused run


def test_an_export_of_the_live_runs_output_takes_its_newest_complete_checkpoint(first):
    assert first.export.returncode == 0, first.export.stdout[-2000:] + first.export.stderr[-3000:]
    assert f"zero-kit export: the run in {first.out} is still going (pid {first.job.proc.pid} on" in first.export.stdout
    assert "exporting checkpoint-5, its newest complete checkpoint" in first.export.stdout
    assert first.after_export == first.before  # a reader writes nothing into the run's output


def test_the_first_run_finishes_alone(first):
    assert first.code == 0, first.job.text()[-3000:]
    assert [r["step"] for r in log_records(first.out)] == list(range(1, 11))
    assert resumed_from(first.job.text()) is None
    record = run_info(first.out)
    for step in (5, 10):
        ckpt = first.out / f"checkpoint-{step}"
        assert store.is_complete(ckpt) and json.loads((ckpt / store.RUN_INFO).read_text()) == record
    assert not (first.out / CLAIM).exists()  # released at the end


def test_a_killed_holder_is_taken_over_and_the_changed_flags_are_said_and_used(first, tmp_path):
    """kill -9 of the whole job (parent and ranks) as its ranks start; the next run takes the claim over at once,
    resumes checkpoint-10 and trains steps 11-20 at the lr its one line announced."""
    assert first.code == 0
    argv = zero_kit("train", *ARGS, "--max-steps", "20", "--lr", "1e-2", "--lr-scheduler", "constant",
                    "--output", str(first.out))  # fmt: skip
    killed = start(argv, tmp_path / "killed.log", env=env())
    wait_for(lambda: "zero-kit train: launching" in killed.text(), "the killed run's launch", killed, timeout=120)
    holder = json.loads((first.out / CLAIM).read_text())
    assert holder["pid"] == killed.proc.pid
    kill_group(killed.proc)
    assert survivors(killed.proc.pid) == [] and (first.out / CLAIM).exists()

    done, _ = _run(argv, timeout=400)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-4000:]
    assert f"zero-kit train: took over {first.out} from a run that is gone (pid {killed.proc.pid} on" in done.stderr
    changes = [line for line in done.stderr.splitlines() if "with flags that differ from its run" in line]
    assert len(changes) == 1, done.stderr[-3000:]
    assert "--lr 0.001 -> 0.01; --lr-scheduler cosine -> constant; --max-steps 10 -> 20" in changes[0]
    assert resumed_from(text) == 10
    resumed = log_records(first.out)[-10:]
    assert [r["step"] for r in resumed] == list(range(11, 21))
    assert [r["lr"] for r in resumed] == [pytest.approx(1e-2)] * 10
    assert logged_steps(first.out)[:10] == list(range(1, 11)) and not (first.out / CLAIM).exists()
