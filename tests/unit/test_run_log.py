"""A launch's terminal and its log (zero_kit.launch.chatter.RunLog): the log keeps every line; the terminal drops the
launcher's chatter and, once a rank said why it stopped, its peers' tracebacks, which follow from it."""

from __future__ import annotations

import io

from zero_kit.launch.chatter import RunLog

LAUNCHER = "[2026-11-29 03:00:41,528] [INFO] [launch.py:253:sigkill_handler] Killing subprocess 20419\n"
CAUSE = "zero-kit train: error: out of memory at step 0: planned peak 4.16 GiB, measured peak 1.27 GiB (peak RSS)\n"
PEER = [
    "[rank0]: Traceback (most recent call last):\n",
    "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:33444.\n",
]


def _feed(tmp_path, lines, verbose=False) -> tuple[RunLog, str]:
    log, terminal = RunLog(tmp_path / "zero_kit.log", verbose=verbose), io.StringIO()
    for line in lines:
        log.line(line, terminal)
    log.close()
    return log, terminal.getvalue()


def test_after_a_ranks_own_error_its_peers_tracebacks_go_to_the_log_only(tmp_path):
    log, shown = _feed(tmp_path, ["step 1\n", LAUNCHER, CAUSE, *PEER, "[2026-11-29 03:00:41,528] [ERROR] x\n"])
    assert shown == "step 1\n" + CAUSE + "[2026-11-29 03:00:41,528] [ERROR] x\n"
    assert (log.hidden, log.aftermath) == (1, 2)
    assert log.path.read_text() == "".join(
        ["step 1\n", LAUNCHER, CAUSE, *PEER, "[2026-11-29 03:00:41,528] [ERROR] x\n"]
    )


def test_a_traceback_with_no_cause_said_before_it_is_shown(tmp_path):
    """A crash zero-kit did not name (a bug, a library's error) is the cause itself: the terminal shows it whole."""
    log, shown = _feed(tmp_path, [*PEER, CAUSE, *PEER])
    assert shown == "".join([*PEER, CAUSE]) and log.aftermath == 2


def test_verbose_shows_every_line(tmp_path):
    log, shown = _feed(tmp_path, [LAUNCHER, CAUSE, *PEER], verbose=True)
    assert shown == "".join([LAUNCHER, CAUSE, *PEER]) and (log.hidden, log.aftermath) == (0, 0)


def test_a_failed_ranks_command_is_named_on_the_terminal_and_kept_whole_in_the_log(tmp_path):
    argv = (
        "['/venv/bin/python', '-u', '-m', 'zero_kit.cli', '--local_rank=1', 'train', '--stage', '3', '--lr', '0.001']"
    )
    failed = f"[2026-11-29 03:00:42,001] [ERROR] [launch.py:259:sigkill_handler] {argv} exits with return code = 1\n"
    log, shown = _feed(tmp_path, [CAUSE, failed])
    assert shown == CAUSE + (
        "[2026-11-29 03:00:42,001] [ERROR] [launch.py:259:sigkill_handler] a rank's command"
        f" (in {tmp_path / 'zero_kit.log'}) exits with return code = 1\n"
    )
    assert log.path.read_text() == CAUSE + failed
    assert _feed(tmp_path / "v", [failed], verbose=True)[1] == failed
