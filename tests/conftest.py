"""Shared test set-up. In CI (CI=true) a skipped test is a failure: multi-process and multi-node
tests must RUN there; only GPU tests may skip, and only when CUDA is absent."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and item.get_closest_marker("gpu") is None:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must run it: {report.longrepr}"
