"""`zero-kit bench` stopped by a signal (zero_kit.bench.driver._stop): one last line naming the signal and the
strategy that ran, then the exit a shell expects (130, 143). How the signal reaches every rank: the supervisor's
tests (tests/unit/test_launch_supervisor.py)."""

from __future__ import annotations

import signal

import pytest

from zero_kit.bench.driver import _stop


@pytest.mark.parametrize(("signum", "said"), [(signal.SIGINT, "Ctrl-C (SIGINT)"), (signal.SIGTERM, "SIGTERM")])
def test_a_stopped_bench_says_so_and_exits_as_the_signal_would(tmp_path, capsys, signum, said):
    with pytest.raises(SystemExit) as stopped:
        _stop(signum, "zero2", [], tmp_path)
    assert stopped.value.code == 128 + signum
    assert capsys.readouterr().err == (
        f"zero-kit bench: stopped by {said} during zero2, exit {128 + signum}; no strategy had finished\n"
    )
    assert list(tmp_path.iterdir()) == []
