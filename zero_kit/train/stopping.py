"""How a run that a signal stopped ends: its exit code and the one last line a user reads.

SIGINT (Ctrl-C) and SIGTERM (a scheduler's notice) ask the same of every rank: finish the step, save a complete
checkpoint of it, stop. Ctrl-C saves too, so that stopping loses no step and `--resume auto` continues where the
user stopped; a second Ctrl-C kills every process at once (then the newest periodic checkpoint is what is left).
The codes differ: 130 for Ctrl-C (what a shell reports for it), EXIT_PREEMPTED (75) for SIGTERM (a scheduler
requeues on it). The last line is printed once: by the plain `zero-kit train` that relaunched the ranks, or by the
only rank of a one-process run; it names what happened, the step reached, the checkpoint left and the command that
continues, also when the signal went to one rank only (`signal_of` its exit code). Light on purpose: the
relaunching parent imports it (no torch, no transformers).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
from pathlib import Path

from zero_kit.checkpoints import claim, store
from zero_kit.errors import EXIT_PREEMPTED
from zero_kit.log import warn

EXIT_INTERRUPTED = 130
"""Exit code of a run stopped by Ctrl-C (SIGINT): 128 + 2, what a shell reports."""
LOG_FILE = "train_log.jsonl"
"""Rank 0's record of every logged step in OUTPUT (written by callbacks.ProgressCallback)."""


def exit_code(signum: int) -> int:
    return EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_PREEMPTED


def signal_of(code: int) -> int | None:
    """The signal whose stop ends a rank with exit code `code` (`exit_code`'s inverse), else None: what a job's
    ranks say when the signal went to one of them (`kill -TERM` to a rank, a scheduler's notice on one node)."""
    return {EXIT_INTERRUPTED: signal.SIGINT, EXIT_PREEMPTED: signal.SIGTERM}.get(code)


def continue_command(argv: list[str]) -> str:
    """`zero-kit ARGV` (the arguments after the program) with `--resume auto` in place of any `--resume`."""
    kept: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--resume":
            next(args, None)
        elif not arg.startswith("--resume="):
            kept.append(arg)
    return shlex.join(["zero-kit", *kept, "--resume", "auto"])


def last_logged_step(output: Path) -> int | None:
    """The step of the last complete record in OUTPUT/train_log.jsonl (a line cut by a kill is skipped)."""
    try:
        lines = (output / LOG_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def stop_line(signum: int, output: Path, argv: list[str] | None) -> str:
    """The last line of a stopped run. argv: the command's arguments (None: ranks an outside launcher started,
    whose command this process does not know)."""
    what = "stopped by Ctrl-C (SIGINT)" if signum == signal.SIGINT else "preempted (SIGTERM)"
    step = last_logged_step(output)
    at = f" at step {step}" if step is not None else " before the first step"
    ckpt = store.newest_complete(output)
    left = f"checkpoint left: {ckpt} ({output / store.POINTER})" if ckpt else "no checkpoint written yet"
    again = continue_command(argv) if argv is not None else "the same launch command with --resume auto"
    return f"zero-kit train: {what}{at}, exit {exit_code(signum)}; {left}; continue with: {again}"


def leave_at_once_on_signal(output: Path, speak: bool) -> None:
    """A rank of a multi-rank job before its training starts: SIGINT or SIGTERM ends it at once (there is nothing
    to save yet, and a KeyboardInterrupt inside a start-up collective would leave its peers waiting for it until
    the supervisor's grace runs out). callbacks.PreemptionCallback takes over when the Trainer is built. speak: this
    process prints the last line (rank 0 of ranks an outside launcher started; a relaunching parent prints its own).
    SIGINT, blocked in a relaunch's launchers and inherited so (zero_kit.launch.supervisor), is unblocked once the
    handler is in place; a Ctrl-C that came meanwhile ends the rank now. And the rank is bound to its relaunching
    parent (checkpoints.claim.bind_rank): it leaves when that parent is gone, and no run takes over its output
    before it has."""

    def leave(signum, frame):
        if speak:
            with contextlib.suppress(RuntimeError):  # a reentrant write, if the signal came inside a print
                warn(stop_line(signum, output, None))
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(exit_code(signum))

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, leave)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    claim.bind_rank(output, os.environ)
