"""The tier of mistakes (tests/mistakes): run a `zero-kit` command the way a user who got something wrong would,
and check what issue 30 promises: a non-zero exit, one `zero-kit CMD: error: ...` line naming what was wrong and
the fix, no traceback, an answer within seconds, and nothing changed on disk (`snapshot` before and after)."""

from __future__ import annotations

import hashlib
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.jobs import env, zero_kit

FAST_ERROR_S = 5.0
"""Issue 30: no input error takes longer than this to report on the 2-core CI machine."""


@dataclass(frozen=True)
class Answer:
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def errors(self) -> list[str]:
        """The `zero-kit ...: error: ...` lines (argparse's usage errors read `zero-kit ...: error: ...` too)."""
        return [line for line in self.stderr.splitlines() if ": error: " in line]

    @property
    def message(self) -> str:
        """The first error line and its `  fix: ...` line (how zero_kit.cli prints a UserError)."""
        lines = self.stderr.splitlines()
        at = next((i for i, line in enumerate(lines) if ": error: " in line), None)
        if at is None:
            return ""
        fix = lines[at + 1] if at + 1 < len(lines) and lines[at + 1].lstrip().startswith("fix:") else ""
        return f"{lines[at]}\n{fix}"


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every path under `root` (also empty directories and the root itself) with its mode and a hash of the file's
    bytes: equal snapshots before and after a command mean it changed, created and deleted nothing there."""
    found: dict[str, tuple[int, str]] = {}
    if not root.exists():
        return found
    for path in [root, *sorted(root.rglob("*"))]:
        stat = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else ""
        found[str(path.relative_to(root))] = (stat.st_mode, digest)
    return found


def answer(*args: str, cwd: Path | None = None, timeout: float = 120, **extra_env: str) -> Answer:
    """Run `zero-kit ARGS` to its end in the offline test environment."""
    start = time.monotonic()
    proc = subprocess.run(zero_kit(*args), cwd=cwd, env={**env(), **extra_env}, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
    return Answer(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def assert_refused(found: Answer, *needles: str, code: int | None = None, within_s: float = FAST_ERROR_S) -> None:
    """A user's mistake, answered as issue 30 says: exit `code` (any non-zero when None), no traceback, one error
    line whose message (with its fix line) contains every needle (a flag, a key, a path, the fix), within
    `within_s` seconds."""
    shown = f"exit {found.code} after {found.seconds:.1f} s\nstdout:\n{found.stdout[-2000:]}\nstderr:\n{found.stderr[-3000:]}"
    assert found.code != 0 if code is None else found.code == code, shown
    assert "Traceback" not in found.stderr + found.stdout, shown
    assert len(found.errors) == 1, shown
    for needle in needles:
        assert needle in found.message, f"{needle!r} not in the error\n{shown}"
    assert found.seconds < within_s, shown


__all__ = ["FAST_ERROR_S", "Answer", "answer", "assert_refused", "snapshot"]
