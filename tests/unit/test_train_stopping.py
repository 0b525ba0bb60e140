"""zero_kit.train.stopping: the exit code and the one last line of a run a signal stopped (what happened, the step,
the checkpoint left, the command that continues), read from the output directory alone; a relaunch says it also
when the signal went to one rank only (issue 52)."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from zero_kit.checkpoints import store
from zero_kit.errors import EXIT_PREEMPTED
from zero_kit.launch import Launch, Outcome
from zero_kit.train import parent
from zero_kit.train.stopping import EXIT_INTERRUPTED, LOG_FILE, continue_command, exit_code, signal_of, stop_line


def test_exit_codes():
    assert exit_code(signal.SIGINT) == EXIT_INTERRUPTED == 130
    assert exit_code(signal.SIGTERM) == EXIT_PREEMPTED == 75
    assert signal_of(130) == signal.SIGINT and signal_of(75) == signal.SIGTERM
    assert signal_of(0) is signal_of(1) is signal_of(76) is None


def test_the_continue_command_replaces_any_resume_and_survives_the_shell(tmp_path):
    out = str(tmp_path / "my run")
    for resume in (["--resume", "never"], ["--resume=never"], []):
        line = continue_command(["train", "--output", out, *resume, "--nproc", "2"])
        assert shlex.split(line) == ["zero-kit", "train", "--output", out, "--nproc", "2", "--resume", "auto"]


def _saved(out: Path, step: int) -> Path:
    ckpt = out / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    store.write_manifest(ckpt, step=step, world_size=2)  # also moves the pointer
    return ckpt


def test_the_last_line_names_what_the_step_the_checkpoint_and_how_to_continue(tmp_path):
    ckpt = _saved(tmp_path, 4)
    (tmp_path / LOG_FILE).write_text("".join(json.dumps({"step": s}) + "\n" for s in (3, 4)) + '{"step": 5, "lo')
    line = stop_line(signal.SIGINT, tmp_path, ["train", "--output", str(tmp_path)])
    assert line == (
        f"zero-kit train: stopped by Ctrl-C (SIGINT) at step 4, exit 130; checkpoint left: {ckpt} "
        f"({tmp_path / store.POINTER}); continue with: zero-kit train --output {tmp_path} --resume auto"
    )
    assert stop_line(signal.SIGTERM, tmp_path, None).startswith(
        "zero-kit train: preempted (SIGTERM) at step 4, exit 75"
    )
    assert stop_line(signal.SIGTERM, tmp_path, None).endswith(
        "continue with: the same launch command with --resume auto"
    )


def test_before_the_first_step_and_checkpoint(tmp_path):
    line = stop_line(signal.SIGINT, tmp_path, ["train"])
    assert "before the first step, exit 130; no checkpoint written yet; continue with: zero-kit train" in line


@pytest.mark.parametrize(("code", "said"), [(75, "preempted (SIGTERM) at step 3, exit 75"), (1, None)])
def test_a_relaunch_says_the_last_line_when_one_rank_got_the_signal(tmp_path, monkeypatch, capsys, code, said):
    """`kill -TERM` to one rank: every rank saves and exits 75, the launchers pass that on, and no signal reached the
    parent; the last line is the same as after a SIGTERM to it. A failure is no stop: no such line."""
    ckpt = _saved(tmp_path, 3)
    (tmp_path / LOG_FILE).write_text(json.dumps({"step": 3}) + "\n")
    plan = SimpleNamespace(options=SimpleNamespace(master_port=29555, hostfile=None, nproc=2), output=tmp_path,
                           to_env=dict)  # fmt: skip
    monkeypatch.setattr(parent, "relaunch_plan", lambda *args, **kwargs: Launch("zero_kit.cli", [["deepspeed"]]))
    monkeypatch.setattr(parent, "supervise", lambda *args, **kwargs: Outcome([code], code))
    argv = ["train", "--nproc", "2", "--output", str(tmp_path)]
    assert parent.relaunch(plan, SimpleNamespace(for_ranks=dict), argv) == code
    err = capsys.readouterr().err
    if said is None:
        assert "zero-kit train: preempted" not in err and "stopped by" not in err
        return
    left = f"checkpoint left: {ckpt} ({tmp_path / store.POINTER})"
    again = f"zero-kit train --nproc 2 --output {tmp_path} --resume auto"
    assert err.strip().splitlines()[-1] == f"zero-kit train: {said}; {left}; continue with: {again}"


def test_a_one_process_run_takes_a_ctrl_c_delivered_twice_as_one(monkeypatch):
    """The only rank of a one-process run answers a second Ctrl-C itself (no supervisor above it): one delivered
    twice at once (the terminal's and a wrapper's) still saves; pressed again later, it stops at once."""
    from zero_kit.train.callbacks import PreemptionCallback

    preemption = PreemptionCallback(alone=True)
    try:
        preemption._on_signal(signal.SIGINT, None)
        preemption._on_signal(signal.SIGINT, None)
        assert preemption.signum == signal.SIGINT
        monkeypatch.setattr("zero_kit.train.callbacks.SAME_CTRL_C_S", -1.0)  # the next one comes "later"
        with pytest.raises(KeyboardInterrupt):
            preemption._on_signal(signal.SIGINT, None)
    finally:
        for signum, handler in preemption._previous.items():
            signal.signal(signum, handler)
