"""Shared test set-up. In CI (CI=true) a skipped test is a failure: multi-process and multi-node
tests must RUN there; only GPU tests may skip, and only when CUDA is absent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import ops

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


# DeepSpeed's CPU op builds go to one private, cached directory per torch/DeepSpeed pair, built by this
# environment's ninja (tests/support/ops.py): every launcher a test starts inherits both.
os.environ.update(ops.op_env())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and item.get_closest_marker("gpu") is None:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must run it: {report.longrepr}"


@pytest.fixture
def umask_zero():
    """The test runs under umask 0, so a file zero_kit forgot to make private comes out world-readable (the secrets
    tests: tests/unit/test_secrets.py, tests/dist/test_secrets_scan.py)."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


# Wall seconds per test file, written by `python -m scripts.test_tiers --record` from a run's JUnit reports.
FILE_SECONDS: dict[str, float] = json.loads((Path(__file__).parent / "file_seconds.json").read_text())


def pytest_collection_modifyitems(session, config, items):
    """In an xdist worker, the longest files first, so that no long file starts last while the other worker idles
    (scripts/test_tiers.py turns xdist's own reordering, by number of tests, off). Then build DeepSpeed's CPU ops
    once, before any launcher test, so no test's timeout pays for a compile (tests/support/ops.py; nothing to do
    when scripts/test_tiers.py built them already)."""
    if hasattr(config, "workerinput"):  # stable: a file's tests stay together and in their order
        items.sort(key=lambda item: -FILE_SECONDS.get(item.nodeid.split("::")[0], 0.0))
    tiers = {m for item in items for m in ("dist", "multinode") if item.get_closest_marker(m)}
    whole_suite = not config.args or [Path(a).resolve() for a in config.args] == [Path(config.rootpath, "tests")]
    if IN_CI and whole_suite and tiers != {"dist", "multinode"}:
        raise pytest.UsageError(f"CI collected no {sorted({'dist', 'multinode'} - tiers)} tests: check norecursedirs")
    if not tiers:
        return
    took = ops.build()
    print(f"\nDeepSpeed CPU ops ready in {took:.0f} s" if took is not None else "\nDeepSpeed CPU ops built before")
