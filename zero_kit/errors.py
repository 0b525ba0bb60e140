"""Errors a user can cause. Library code raises these; only the CLI edge prints them and picks exit codes. Also the
path checks every command shares: a path it writes or reads is one line naming the flag, never a traceback."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

EXIT_PREEMPTED = 75
"""Exit code of a run stopped by SIGTERM (SLURM preemption) after it saved a complete checkpoint: EX_TEMPFAIL from
sysexits.h, "try again later"; relaunch with `--resume auto` to continue."""


class UserError(Exception):
    """A mistake in what the user gave us: names the flag, key, file or line, and says how to fix it."""

    exit_code = 2

    def __init__(self, message: str, fix: str = "", *, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class BatchSizeError(UserError):
    """The batch triple (micro batch, gradient accumulation, global batch) cannot hold at this world size."""


def raise_all(problems: list[UserError], when: str) -> None:
    """Report every problem at once, each with its own fix (a user fixes five mistakes in one round, not five).
    `when` says where they were found, e.g. "before training"."""
    if not problems:
        return
    if len(problems) == 1:
        raise problems[0]
    lines = [f"{len(problems)} problems {when}:"]
    lines += [f"  - {p.message}\n    fix: {p.fix}" if p.fix else f"  - {p.message}" for p in problems]
    raise UserError("\n".join(lines), "fix each problem above")


def existing_ancestor(path: Path) -> Path:
    """`path` itself if it exists, else its nearest existing parent (where a write would have to start)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def write_probe(directory: Path) -> OSError | None:
    """Create and delete a file: the one test that also holds for root, read-only mounts, root-squashed NFS and
    /proc (os.access says yes to root everywhere). Leaves the directory's contents as they were; the name is
    unique per call, so ranks and threads probing one directory at once never meet."""
    probe = directory / f".zero_kit_probe_{os.getpid()}_{os.urandom(4).hex()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        return err
    return None


def _check_writable_in(path: str | Path, flag: str, ancestor: Path) -> None:
    """`ancestor`, the nearest existing parent of what `flag` names, is a directory this process may write in."""
    if not ancestor.is_dir():
        raise UserError(f"{flag} {path}: {ancestor} is a file, not a directory", f"choose another {flag}")
    err = write_probe(ancestor)
    if err is not None:
        raise UserError(f"{flag} {path}: cannot write in {ancestor} ({err.strerror})", f"choose a writable {flag}")


def check_writable_file(path: str | Path, flag: str) -> Path:
    """`path` can be written as a file: not a directory, and its nearest existing parent is a directory this
    process may create files in (missing parents are made when the file is written). Creates nothing."""
    target = Path(path)
    if target.is_dir():
        raise UserError(f"{flag} {path}: is a directory", f"name a file, e.g. {flag} {target / 'out.json'}")
    _check_writable_in(path, flag, existing_ancestor(target.parent))
    return target


def check_writable_dir(path: str | Path, flag: str) -> Path:
    """`path` is, or can become, a directory this process may write in. Creates nothing."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise UserError(f"{flag} {path}: exists and is not a directory", f"remove the file or choose another {flag}")
    _check_writable_in(path, flag, existing_ancestor(target))
    return target


def refuse_overwrite(path: str | Path, flag: str, force: bool, ours: Callable[[Path], bool]) -> None:
    """An existing file, or a non-empty directory, that `ours` does not recognise as zero-kit's own output is
    kept unless the user passed --force. `ours` is the command's cheap mark (docs/mistakes.md, "What zero-kit
    overwrites"); it must not raise for unreadable or binary content."""
    target = Path(path)
    if force or not target.exists():
        return
    if target.is_dir() and not any(target.iterdir()):
        return
    if ours(target):
        return
    what = "a non-empty directory" if target.is_dir() else "a file"
    act = "writing into" if target.is_dir() else "overwriting"
    raise UserError(
        f"{flag} {path}: {what} that zero-kit did not write; not {act} it",
        f"pass --force to overwrite it, or choose another {flag}",
    )


def write_text(path: str | Path, text: str, flag: str) -> None:
    """Write `text` to `path` (parents made): any OS error is the user's path, said in one line."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UserError(f"{flag} {path}: cannot write ({err.strerror or err})", f"choose a writable {flag}") from None


def read_text(path: str | Path, flag: str, what: str) -> str:
    """The UTF-8 text of `path`; a missing, unreadable or binary file is one line naming the flag and `what`
    the file should be."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{flag} {path}: no such file", f"pass {what}") from None
    except IsADirectoryError:
        raise UserError(f"{flag} {path}: is a directory", f"pass {what}") from None
    except UnicodeDecodeError:
        raise UserError(f"{flag} {path}: not a text file (not UTF-8)", f"pass {what}") from None
    except OSError as err:
        raise UserError(f"{flag} {path}: cannot read it ({err.strerror or err})", f"pass {what}") from None
