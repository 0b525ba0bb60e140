"""zero-kit's own lines on the terminal, through `logging`: one logger ("zero_kit") whose handler writes each message
as it is, one line at a time and flushed (a launcher interleaves its ranks' lines by line), a line for the user's
eyes to stdout (`say`) and a warning, a refusal or the last line of a stopped run to stderr (`warn`).

Library code says what it does through these; only the command edge (zero_kit.commands, zero_kit.cli) prints. A
user's own script on zero_kit's Python API gets the same lines, and may add handlers to the "zero_kit" logger or
raise its level to silence them; they do not reach the root logger (no line twice under basicConfig).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

LOGGER = logging.getLogger("zero_kit")


class _Lines(logging.Handler):
    """INFO to stdout, WARNING and above to stderr, each looked up when the line is written (a test's capture, a
    redirected stream)."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except BrokenPipeError:  # a reader that stopped reading (`| head`): the CLI edge handles it
            raise
        except Exception:  # noqa: BLE001 - logging's own rule: a line that cannot be written never fails the run
            self.handleError(record)


def _logger() -> logging.Logger:
    if not any(isinstance(handler, _Lines) for handler in LOGGER.handlers):
        LOGGER.addHandler(_Lines())
        LOGGER.setLevel(logging.INFO)
        LOGGER.propagate = False
    return LOGGER


def say(line: str) -> None:
    """A line for the user, on stdout."""
    _logger().info(line)


def warn(line: str) -> None:
    """A warning, a refusal or the last line of a stopped run, on stderr."""
    _logger().warning(line)


RUN_LOG = "zero_kit.log"
"""The run's log in --output: what is kept off the terminal (launcher chatter, libraries' deprecations of each
other), line by line, so that nothing said is lost."""
VERBOSE_ENV = "ZERO_KIT_VERBOSE"
"""Set to 1 (`--verbose`): what goes to the run's log only is shown on the terminal too."""
LIBRARY_NOTICES = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
"""Warnings meant for the authors of the code that made the call: a user acts on one only when it points at their
own code."""


class _Notices:
    """`warnings.showwarning` for this process: a library's deprecation that another library's call caused (the first
    caller outside the warning's own package is in an installed package other than zero_kit: torch warning about a
    collective DeepSpeed calls) goes to the run's log, each message once, and not to the terminal. Every other
    warning is shown as Python would: a deprecation the user's own code (or zero_kit) caused, and any other kind."""

    def __init__(self, shown) -> None:
        self.shown = shown
        self.log: Path | None = None
        self.held: list[str] = []  # said before the log's path was known
        self.seen: set[str] = set()

    def __call__(self, message, category, filename, lineno, file=None, line=None) -> None:
        if _verbose() or not issubclass(category, LIBRARY_NOTICES) or not _between_libraries(filename):
            self.shown(message, category, filename, lineno, file, line)
            return
        text = f"{filename}:{lineno}: {category.__name__}: {message}"
        if text in self.seen:
            return
        self.seen.add(text)
        self.held.append(text)
        self.flush()

    def flush(self) -> None:
        if self.log is None or not self.held:
            return
        try:
            with open(self.log, "a", encoding="utf-8") as handle:  # O_APPEND: ranks' lines never interleave mid-line
                handle.write("".join(f"{line}\n" for line in self.held))
            self.held.clear()
        except OSError:
            pass  # an output not made yet, or gone (the run itself says so): kept, written at the next one


def _verbose() -> bool:
    import os

    return os.environ.get(VERBOSE_ENV) == "1"


def _package(filename: str) -> str | None:
    """The installed package a file belongs to (the folder after site-packages/dist-packages), else None."""
    parts = Path(filename).parts
    for index, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages"):
            return parts[index + 1].removesuffix(".py")
    return None


def _between_libraries(filename: str) -> bool:
    """The warning (attributed to `filename`) was caused by another library: walking out from the warning, past the
    frames of its own package, of the standard library and of code made at run time ("<string>"), the first caller
    is an installed package other than zero_kit. A caller in the user's script or in zero_kit: False."""
    import sys
    import sysconfig

    own = _package(filename)
    if own is None or own == "zero_kit":
        return False
    stdlib = sysconfig.get_paths()["stdlib"]
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        package = _package(name)
        if package is not None and package != own:
            return package != "zero_kit"
        if package is None and not name.startswith(("<", stdlib)) and Path(name) != Path(__file__):
            return False  # the user's own code
        frame = frame.f_back
    return False


def library_notices_to_log(output: str | Path | None = None) -> None:
    """Route libraries' deprecations of each other to OUTPUT/zero_kit.log (see _Notices); idempotent. Without
    `output` they are held until a later call names it. `ZERO_KIT_VERBOSE=1` shows them on the terminal too."""
    import warnings

    notices = warnings.showwarning
    if not isinstance(notices, _Notices):
        notices = _Notices(warnings.showwarning)
        warnings.showwarning = notices
    if output is not None:
        notices.log = Path(output) / RUN_LOG
        notices.flush()
