"""The planner's per-GPU peak for DDP and FSDP2 against PyTorch's own memory trackers (MemTracker,
FSDPMemTracker over a fake process group of 8 ranks) under FakeTensorMode on CPU, at a reduced size: a 2-layer
LLaMA, hidden 256, vocabulary 4096, sequence 512. benchmarks/plan_memtracker/run.py does the real sizes.

It runs in a subprocess: the fake process group and the private trackers stay out of this test process.
Tolerance ±5% for both strategies, with and without activation checkpointing: the planner charges only the
largest of the moments that can be the peak (zero_kit.plan.memory._peak_phases); measured here within 1.5%, and
within 1% at Llama-3.2-1B (benchmarks/plan_memtracker/README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_planner_against_pytorch_memory_trackers():
    argv = ["--models", "tiny", "--seqs", "512", "--checkpointing", "off,on", "--json"]
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.plan_memtracker.run", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert {(row["strategy"], row["checkpointing"]) for row in rows} == {
        (strategy, ckpt) for strategy in ("ddp", "fsdp") for ckpt in (False, True)
    }
    for row in rows:
        assert "error" not in row, row["error"]
        assert abs(row["diff_pct"]) <= 5, row
