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
