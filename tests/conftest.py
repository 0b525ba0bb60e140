"""Shared test set-up. In CI (CI=true) a skipped test is a failure: multi-process and multi-node
tests must RUN there; only GPU tests may skip, and only when CUDA is absent."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from benchmarks.rigs.base import private_extensions_dir

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


# DeepSpeed's CPU op builds go to one private, cached directory per torch/DeepSpeed pair (see there), built by
# this environment's ninja: with another ninja first on PATH (the system's), each rebuilds the other's builds.
os.environ["TORCH_EXTENSIONS_DIR"] = str(private_extensions_dir())
os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and item.get_closest_marker("gpu") is None:
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which must run it: {report.longrepr}"


def pytest_collection_modifyitems(session, config, items):
    """Build DeepSpeed's CPU ops once, before any launcher test, so no test's timeout pays for a compile.

    DeepSpeed compiles them on first use (shm all-reduce, fused Adam, CPU Adam for offload; ~2 min each on
    2 cores) into ~/.cache/torch_extensions; two ranks racing for the same build just wait on its lock.
    """
    tiers = {m for item in items for m in ("dist", "multinode") if item.get_closest_marker(m)}
    whole_suite = not config.args or [Path(a).resolve() for a in config.args] == [Path(config.rootpath, "tests")]
    if IN_CI and whole_suite and tiers != {"dist", "multinode"}:
        raise pytest.UsageError(f"CI collected no {sorted({'dist', 'multinode'} - tiers)} tests: check norecursedirs")
    if not tiers:
        return
    import subprocess
    import time

    start = time.monotonic()
    # ZERO_KIT_TEST_OPS narrows the list for a run that needs fewer: CI's compatibility slice trains with torch's
    # AdamW and no optimizer offload, so only the shm op (~1 of the ~5 min on 2 cores); any other op would still be
    # built by DeepSpeed on first use.
    builders = os.environ.get("ZERO_KIT_TEST_OPS", "ShareMemCommBuilder,FusedAdamBuilder,CPUAdamBuilder")
    names = [name.strip() for name in builders.split(",") if name.strip()]
    code = (
        f"from deepspeed.ops.op_builder import {', '.join(names)}\n"
        f"for b in ({', '.join(names)},): b().load(verbose=False)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=1800)
    print(f"\nDeepSpeed CPU ops ready in {time.monotonic() - start:.0f} s")
