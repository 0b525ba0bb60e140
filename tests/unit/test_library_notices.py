"""Issues 50 and 53: a library's deprecation that another library's call caused (torch's FutureWarning for each
collective DeepSpeed calls: 13,872 of them in one accelerate loop) goes to OUTPUT/zero_kit.log, each once, and not to
the terminal; a deprecation the user's own call caused, and any other kind of warning, still reaches it
(zero_kit.log.library_notices_to_log). The libraries here are real packages in a site-packages folder the test
makes: `lowlib` deprecates a function, `highlib` calls it."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from zero_kit import log

LOWLIB = """
import warnings

def old_collective():
    warnings.warn("`lowlib.old_collective` is deprecated. Please use `lowlib.new_collective`", FutureWarning,
                  stacklevel=2)

def noisy():
    warnings.warn("lowlib found something about your run", UserWarning)
"""
HIGHLIB = """
import lowlib

def train_step():
    lowlib.old_collective()
"""


@pytest.fixture
def libs(monkeypatch, tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    for name, text in (("lowlib", LOWLIB), ("highlib", HIGHLIB)):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(text)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(log.VERBOSE_ENV, raising=False)
    with warnings.catch_warnings():  # restores showwarning and the filters afterwards
        warnings.simplefilter("always")
        warnings.showwarning = _python_shows  # Python's own (pytest records warnings through its own)
        yield importlib.import_module("lowlib"), importlib.import_module("highlib")
    for name in ("lowlib", "highlib"):
        sys.modules.pop(name, None)


def _python_shows(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def test_a_deprecation_one_library_causes_in_another_goes_to_the_runs_log_once(libs, tmp_path, capsys):
    _, highlib = libs
    log.library_notices_to_log()  # at import: held until the output is known
    highlib.train_step()
    assert capsys.readouterr().err == ""
    out = tmp_path / "out"
    out.mkdir()
    log.library_notices_to_log(out)
    for _ in range(3):
        highlib.train_step()
    assert capsys.readouterr().err == ""
    lines = (out / log.RUN_LOG).read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith("FutureWarning: `lowlib.old_collective` is deprecated. Please use "
                                                 "`lowlib.new_collective`")  # fmt: skip
    assert "highlib" in lines[0]  # stacklevel=2: the line that called it


def test_a_deprecation_the_users_own_call_causes_is_shown(libs, tmp_path, capsys):
    lowlib, _ = libs
    log.library_notices_to_log(tmp_path)
    lowlib.old_collective()  # this file is the user's script here
    assert "`lowlib.old_collective` is deprecated" in capsys.readouterr().err
    assert not (tmp_path / log.RUN_LOG).exists()


def test_a_librarys_other_warnings_are_shown(libs, tmp_path, capsys):
    lowlib, _ = libs
    log.library_notices_to_log(tmp_path)
    lowlib.noisy()
    assert "lowlib found something about your run" in capsys.readouterr().err


def test_verbose_shows_the_librarys_notices_too(libs, tmp_path, capsys, monkeypatch):
    _, highlib = libs
    monkeypatch.setenv(log.VERBOSE_ENV, "1")
    log.library_notices_to_log(tmp_path)
    highlib.train_step()
    assert "`lowlib.old_collective` is deprecated" in capsys.readouterr().err
