"""zero_kit.train.stopping: the exit code and the one last line of a run a signal stopped (what happened, the step,
the checkpoint left, the command that continues), read from the output directory alone."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

from zero_kit.checkpoints import store
from zero_kit.errors import EXIT_PREEMPTED
from zero_kit.train.stopping import EXIT_INTERRUPTED, LOG_FILE, continue_command, exit_code, stop_line


def test_exit_codes():
    assert exit_code(signal.SIGINT) == EXIT_INTERRUPTED == 130
    assert exit_code(signal.SIGTERM) == EXIT_PREEMPTED == 75


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
