"""The whole test suite, tier by tier, with the wall time of each against its budget (docs/testing.md).

Run from the repository root, in the venv:  python -m scripts.test_tiers [TIER ...]
After a run, `python -m scripts.test_tiers --record` writes each test file's wall seconds from that run's JUnit
reports (build/junit/) to tests/file_seconds.json, the order the launch tier starts files in.

- lint: ruff check; format: ruff format --check (it honours `# fmt: skip`);
- unit: tests/unit, its files shared out over one pytest-xdist worker per core;
- launch: every launcher and two-host test not marked `serial` (tests/dist, tests/multinode), two files at a time:
  a file's ranks leave a core idle a good part of the time (start-up, rendezvous, Slurm's polls), and the other
  file fills it. Longest files first (tests/conftest.py), so no long file starts last;
- serial: one test at a time: launcher tests marked `serial` (kills, wall-clock bounds, machine-wide counts, the
  fault tests of the two-host rigs), tests/mistakes (answers within seconds) and tests/gpu (skipped without CUDA).

DeepSpeed's CPU ops (tests/support/ops.py) build in the background from the start, beside ruff and the unit tier,
and the launch tier waits for them. The first failing tier ends the run (exit 1), like an `&&` list; every pytest
prints its 25 slowest tests (pyproject's addopts). The budgets are wall seconds on the 2-core CI machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tests.support import ops, shared

ROOT = Path(__file__).resolve().parent.parent
JUNIT = ROOT / "build" / "junit"
FILE_SECONDS = ROOT / "tests" / "file_seconds.json"


@dataclass(frozen=True)
class Tier:
    name: str
    argv: tuple[str, ...]
    budget_s: int
    needs_ops: bool = False


PYTEST = ("pytest", "-q")
# loadfile keeps a file's module fixtures (a reference run) on one worker; the files' own order (longest first,
# tests/conftest.py) instead of xdist's reordering by number of tests.
BY_FILE = ("--dist", "loadfile", "--no-loadscope-reorder")
LAUNCH = ("-m", "(dist or multinode) and not serial", "tests/dist", "tests/multinode")
SERIAL = ("-m", "serial or not (dist or multinode)", "--ignore=tests/unit", "tests")
TIERS = (
    Tier("lint", ("ruff", "check", "."), 15),
    # the formatter honours the `# fmt: skip` lines (tables, argument lists kept as written); Markdown's code blocks
    # are prose, not formatted
    Tier("format", ("ruff", "format", "--check", "zero_kit", "tests", "benchmarks", "scripts"), 15),
    Tier("unit", (*PYTEST, "-n", "auto", "--dist", "loadfile", "tests/unit"), 330),
    Tier("launch", (*PYTEST, "-n", "2", *BY_FILE, *LAUNCH), 1000, needs_ops=True),
    Tier("serial", (*PYTEST, *SERIAL), 1000, needs_ops=True),
)


@dataclass(frozen=True)
class OpBuild:
    proc: subprocess.Popen
    started: float
    log: Path


def main(argv: list[str] | None = None) -> int:
    names = [t.name for t in TIERS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tiers", nargs="*", metavar="TIER", help=f"tiers to run, of {', '.join(names)} (all)")
    parser.add_argument("--record", action="store_true", help=f"write {FILE_SECONDS.relative_to(ROOT)}, run nothing")
    args = parser.parse_args(argv)
    if args.record:
        return record_file_seconds()
    chosen = set(args.tiers) or set(names)
    if chosen - set(names):
        parser.error(f"unknown tier(s) {', '.join(sorted(chosen - set(names)))}; choose from {', '.join(names)}")
    tiers = [t for t in TIERS if t.name in chosen]
    runs = ROOT / "build" / "shared_runs" / str(os.getpid())  # reference runs trained once for every tier
    try:
        return _run_tiers(tiers, {**os.environ, shared.SHARED_DIR: str(runs)})
    finally:
        shutil.rmtree(runs, ignore_errors=True)


def _run_tiers(tiers: list[Tier], env: dict[str, str]) -> int:
    builder = _start_op_build() if any(t.needs_ops for t in tiers) else None
    times: dict[str, float] = {}
    failed = None
    try:
        for tier in tiers:
            if tier.needs_ops and builder is not None:
                env, builder = _ops_ready(builder, env), None
                if env is None:
                    failed = f"{tier.name} (DeepSpeed's CPU ops did not build)"
                    break
            code = _run_tier(tier, env, times)
            if code != 0:
                failed = tier.name
                break
    finally:
        if builder is not None:  # never leave a build killed halfway: its lock would block the next build
            print("== waiting for DeepSpeed's CPU op build to finish", flush=True)
            builder.proc.wait()
    _summary(tiers, times, failed)
    return 1 if failed else 0


def _run_tier(tier: Tier, env: dict[str, str], times: dict[str, float]) -> int:
    print(f"\n== {tier.name}: {' '.join(tier.argv)}", flush=True)
    start = time.monotonic()
    junit = JUNIT / f"{tier.name}.xml"
    argv = [*tier.argv, f"--junitxml={junit}"] if tier.argv[0] == "pytest" else list(tier.argv)
    code = subprocess.run(argv, cwd=ROOT, env=env).returncode
    times[tier.name] = time.monotonic() - start
    print(f"== {tier.name} took {times[tier.name]:.0f} s (budget {tier.budget_s} s), exit status {code}", flush=True)
    return code


def _start_op_build() -> OpBuild | None:
    if ops.ready():
        return None
    log = ROOT / "build" / "test_tiers_ops.log"
    log.parent.mkdir(exist_ok=True)
    from tests.rigs.base import clear_stale_build_lock

    clear_stale_build_lock()
    with open(log, "w") as out:
        # its own session: a Ctrl-C meant for the tests must not kill a compile halfway (this script waits for it)
        proc = subprocess.Popen(ops.build_argv(), cwd=ROOT, env=ops.op_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    print(f"== DeepSpeed CPU ops: building in the background (log: {log.relative_to(ROOT)})", flush=True)
    return OpBuild(proc, time.monotonic(), log)


def _ops_ready(builder: OpBuild, env: dict[str, str]) -> dict[str, str] | None:
    """Wait for the background op build; the environment that tells later pytests so, or None when it failed."""
    code = builder.proc.wait()
    took = time.monotonic() - builder.started
    if code != 0:
        print(f"== DeepSpeed CPU ops failed to build (exit {code}):\n{builder.log.read_text()[-4000:]}", flush=True)
        return None
    print(f"== DeepSpeed CPU ops ready, {took:.0f} s after the start", flush=True)
    return {**ops.op_env(env), ops.READY: "1"}


def _summary(tiers: list[Tier], times: dict[str, float], failed: str | None) -> None:
    print("\n| tier | seconds | budget | |\n|---|---|---|---|")
    for tier in tiers:
        seen = times.get(tier.name)
        state = "passed" if seen is not None else "not run"
        if failed and failed.split()[0] == tier.name:
            state = f"FAILED{failed[len(tier.name) :]}"
        over = " (over budget)" if seen is not None and seen > tier.budget_s else ""
        print(f"| {tier.name} | {'' if seen is None else f'{seen:.0f}'} | {tier.budget_s} | {state}{over} |")
    print(f"| total | {sum(times.values()):.0f} | {sum(t.budget_s for t in tiers)} | |", flush=True)


def record_file_seconds(junit: Path = JUNIT, out: Path = FILE_SECONDS, root: Path = ROOT) -> int:
    """Sum each test file's test times (setup and teardown included) over the JUnit reports in `junit`."""
    seconds: dict[str, float] = defaultdict(float)
    reports = sorted(junit.glob("*.xml"))
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            parts = case.get("classname", "").split(".")  # tests.dist.test_x, or tests.dist.test_x.TestClass
            paths = ["/".join(parts[:end]) + ".py" for end in range(len(parts), 0, -1)]
            path = next((p for p in paths if (root / p).is_file()), None)
            if path is not None:
                seconds[path] += float(case.get("time", 0))
    if not seconds:
        print(f"no JUnit report with test times under {junit}: run the tiers first")
        return 1
    ordered = {path: round(s, 1) for path, s in sorted(seconds.items(), key=lambda item: -item[1])}
    out.write_text(json.dumps(ordered, indent=1) + "\n", encoding="utf-8")
    print(f"{len(ordered)} files from {len(reports)} report(s) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
