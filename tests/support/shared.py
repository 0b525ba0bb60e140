"""Reference runs trained once per test run, read by every test that compares against them (DeepSpeed's
`DistributedFixture` trains `baseline_ws2` once for the tests that load it; torchtitan chains its launches over one
output folder).

`shared_run(name, train)` gives the directory of the run `name`: the first caller trains it (`train(directory)`)
under an flock, later callers in any pytest process or xdist worker of the same test run wait for the lock and read
it. A failed or interrupted training leaves no completion mark, so the next caller trains it again from an empty
directory. The directory lives under SHARED_DIR, which `python -m scripts.test_tiers` sets for all its tiers (and
removes at the end); without it, under this pytest session's base temporary directory (shared by its xdist workers).
A reader must never write into a shared run: copy what it changes (a checkpoint it resumes) into its own tmp_path.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

SHARED_DIR = "ZERO_KIT_TEST_SHARED_RUNS"
DONE = ".shared_run_done"


def root(factory: pytest.TempPathFactory) -> Path:
    """Where this test run's shared runs live (created on first use)."""
    if os.environ.get(SHARED_DIR):
        base = Path(os.environ[SHARED_DIR])
    else:
        base = factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base is popen-gwN inside the session's own
            base = base.parent
        base = base / "shared_runs"
    base.mkdir(parents=True, exist_ok=True)
    return base


def shared_run(factory: pytest.TempPathFactory, name: str, train: Callable[[Path], None]) -> Path:
    """The directory of reference run `name`, trained by `train(directory)` unless this test run trained it already."""
    base = root(factory)
    directory = base / name
    with open(base / f"{name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if this process dies while training
        if (directory / DONE).is_file():
            print(f"\n[shared run] {name}: trained before in this test run, reused")
            return directory
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        start = time.monotonic()
        train(directory)
        took = time.monotonic() - start
        (directory / DONE).write_text(json.dumps({"seconds": round(took, 1), "pid": os.getpid()}))
        print(f"\n[shared run] {name}: trained in {took:.0f} s")
    return directory
