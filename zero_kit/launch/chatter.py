"""A launch's terminal and its log (issue 50): every line the launcher and its ranks write goes to the run's log, and
to the terminal each line but the launcher's own chatter.

The `deepspeed` launcher (runner.py, launch.py) logs through DeepSpeed's logger on standard output: the command
lines it runs, "Setting CUDA_VISIBLE_DEVICES=0,1" on a host without a GPU, "Unable to find hostfile", each rank's
"exits successfully", and "Setting accelerator to CPU" from each launcher process. 13 of the quick start's 73 lines;
none is about the user's run, which zero-kit's own lines describe. Its ERROR lines (a rank's exit code) stay on the
terminal; the one that names a failed rank's whole command (`sigkill_handler`: its argv list, hundreds of characters)
shows there without the argv, which the log keeps. `--verbose` (ZERO_KIT_VERBOSE=1) shows everything.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

from zero_kit.launch.supervisor import Output

LAUNCHER_LINE = re.compile(
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\] \[(INFO|WARNING)\] "
    r"\[(runner|launch|multinode_runner|real_accelerator)\.py:\d+:\w+\] "
)
"""A DeepSpeed logger line of the launcher's own modules, at INFO or WARNING (deepspeed/utils/logging.py's format)."""


RANK_COMMAND_FAILED = re.compile(r"^(\[[^\]]+\] \[ERROR\] \[launch\.py:\d+:sigkill_handler\] )\[.*\] (exits with .*)$")
"""The launcher's line for a rank that failed: `[...] [ERROR] [launch.py:N:sigkill_handler] ['python', '-u', '-m',
..., every flag] exits with return code = 1`."""
FAILED = re.compile(r"^zero-kit \w+: error: ")
"""A rank's own line for why it stopped (zero_kit's errors: out of memory, a full disk, a diverged loss)."""
AFTERMATH = re.compile(r"^\[rank\d+\]:")
"""torch's prefix on the lines of a rank's uncaught exception. After a rank said why it stopped, its peers' are the
consequence (gloo's "Connection closed by peer" in the collective they were in): the log keeps them, the terminal
ends on the cause."""


def is_chatter(line: str) -> bool:
    return LAUNCHER_LINE.match(line) is not None


class RunLog:
    """The lines of a launch (`output()` for zero_kit.launch.supervise): each one appended to `path`, and written
    to this process's stdout or stderr unless it is the launcher's chatter or, once a rank said why it stopped, the
    other ranks' tracebacks (`aftermath` counts those; all lines reach the terminal when `verbose`)."""

    def __init__(self, path: Path, verbose: bool = False) -> None:
        self.path, self.verbose = path, verbose
        self.lock = threading.Lock()
        self.handle = None
        self.hidden = 0
        self.failed = False
        self.aftermath = 0

    def output(self) -> Output:
        return Output(
            on_line=lambda _i, line: self.line(line, sys.stdout), on_err=lambda _i, line: self.line(line, sys.stderr)
        )

    def line(self, line: str, terminal) -> None:
        with self.lock:
            self._log(line)
            self.failed = self.failed or FAILED.match(line) is not None
            if is_chatter(line) and not self.verbose:
                self.hidden += 1
                return
            if self.failed and AFTERMATH.match(line) and not self.verbose:
                self.aftermath += 1
                return
            command = None if self.verbose else RANK_COMMAND_FAILED.match(line.rstrip("\n"))
            if command:
                line = f"{command[1]}a rank's command (in {self.path}) {command[2]}\n"
            terminal.write(line)
            terminal.flush()

    def _log(self, line: str) -> None:
        try:
            if self.handle is None:
                self.handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the launch's life
            self.handle.write(line)
            self.handle.flush()
        except OSError:
            pass  # an output gone away: the terminal still gets the line, the run says what happened

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
