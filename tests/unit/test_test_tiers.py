"""The test suite's own machinery (scripts/test_tiers.py, tests/support/shared.py): the tiers and budgets that
docs/testing.md states, the per-file seconds that order the launch tier, reference runs trained once per test run,
and ports that no two launcher test files running side by side share."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import test_tiers
from tests.support import shared

ROOT = Path(__file__).resolve().parents[2]


def test_docs_state_every_tier_and_its_budget():
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \|[^|]*\| (\d+) \|", text, re.M))
    assert rows == {tier.name: str(tier.budget_s) for tier in test_tiers.TIERS}
    total = re.search(r"^\| total \|[^|]*\| (\d+) \|", text, re.M)
    assert total and int(total.group(1)) == sum(tier.budget_s for tier in test_tiers.TIERS)


def test_every_launcher_and_rig_test_runs_in_exactly_one_tier():
    """The launch tier takes what is not `serial`, the serial tier takes the rest: nothing twice, nothing left out."""
    launch = dict(zip(*[iter(test_tiers.LAUNCH)] * 2, strict=False))["-m"]
    serial = dict(zip(*[iter(test_tiers.SERIAL)] * 2, strict=False))["-m"]
    for marks in ({"dist"}, {"multinode"}, {"dist", "serial"}, {"multinode", "serial"}, set(), {"gpu"}):
        names = {m: m in marks for m in ("dist", "multinode", "serial")}
        chosen = [bool(eval(expr, {}, names)) for expr in (launch, serial)]  # pytest's -m is a Python expression
        assert sum(chosen) == 1, (marks, chosen)


def test_record_sums_each_files_test_times(tmp_path):
    junit = tmp_path / "junit"
    junit.mkdir()
    (junit / "launch.xml").write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.dist.test_resume_zero2" name="a" time="40.5"/>'
        '<testcase classname="tests.dist.test_resume_zero2" name="b" time="1.5"/>'
        '<testcase classname="tests.unit.test_test_tiers.TestKind" name="c" time="3"/>'
        '<testcase classname="tests.gone.test_nothing" name="d" time="9"/>'
        "</testsuite></testsuites>"
    )
    out = tmp_path / "file_seconds.json"
    assert test_tiers.record_file_seconds(junit, out, ROOT) == 0
    assert json.loads(out.read_text()) == {
        "tests/dist/test_resume_zero2.py": 42.0,
        "tests/unit/test_test_tiers.py": 3.0,
    }
    assert test_tiers.record_file_seconds(tmp_path / "none", out, ROOT) == 1  # no reports: says so, writes nothing


def test_file_seconds_name_files_that_exist():
    seconds = json.loads((ROOT / "tests" / "file_seconds.json").read_text())
    assert seconds and all((ROOT / path).is_file() for path in seconds), sorted(seconds)


def test_a_shared_run_is_trained_once_and_a_failed_one_again(tmp_path_factory, monkeypatch):
    monkeypatch.setenv(shared.SHARED_DIR, str(tmp_path_factory.mktemp("runs")))
    calls = []

    def train(directory: Path) -> None:
        calls.append(directory)
        (directory / "weights").write_text("w")

    first = shared.shared_run(tmp_path_factory, "ref", train)
    assert shared.shared_run(tmp_path_factory, "ref", train) == first and len(calls) == 1
    assert (first / "weights").read_text() == "w"

    def broken(directory: Path) -> None:
        (directory / "half").write_text("h")
        raise RuntimeError("rank 1 exited 1")

    with pytest.raises(RuntimeError):
        shared.shared_run(tmp_path_factory, "other", broken)
    again = shared.shared_run(tmp_path_factory, "other", train)
    assert not (again / "half").exists() and len(calls) == 2  # trained anew, from an empty directory


RACER = """
import sys, time
from pathlib import Path
from tests.support.shared import shared_run

class Factory:
    def getbasetemp(self):
        raise AssertionError("SHARED_DIR is set")

def train(directory):
    with open(sys.argv[1], "a") as f:
        f.write("trained\\n")
    time.sleep(1)

shared_run(Factory(), "ref", train)
"""


def test_processes_racing_for_a_shared_run_train_it_once(tmp_path):
    count = tmp_path / "count"
    env = {"ZERO_KIT_TEST_SHARED_RUNS": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(count)], env=env, cwd=ROOT) for _ in range(3)]
    assert [p.wait(timeout=120) for p in racers] == [0, 0, 0]
    assert count.read_text() == "trained\n"


PORT = re.compile(r"\b29[5-9]\d\d\b")


def test_no_two_launch_tier_files_take_the_same_port():
    """Files of the launch tier run two at a time: an explicit --master-port must be one file's own. Serial files
    run alone, and a launched probe script shares its test's port (helpers and references count as files)."""
    files = [
        path
        for tier in ("dist", "multinode")
        for path in sorted((ROOT / "tests" / tier).glob("*.py"))
        if (path.name.startswith("test_") and "pytest.mark.serial" not in path.read_text())
        or path.name.endswith(("_helpers.py", "_reference.py"))
    ]
    owners: dict[str, set[str]] = {}
    for path in files:
        for port in set(PORT.findall(path.read_text())):
            owners.setdefault(port, set()).add(path.name)
    shared_ports = {port: sorted(names) for port, names in owners.items() if len(names) > 1}
    assert not shared_ports, shared_ports
