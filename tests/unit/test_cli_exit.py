"""A rank of a multi-rank job leaves with its exit code and flushed output, skipping interpreter teardown
(where gloo/DeepSpeed C++ destructors could abort with SIGABRT and hide the real code from the launcher)."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import atexit, sys
import torch  # a rank has torch loaded
atexit.register(lambda: print("TEARDOWN RAN", flush=True))
sys.argv = ["zero-kit", "config", "--stage", "4"]
from zero_kit.cli import console
print("before", end="")  # unflushed on purpose: must still come out
console()
"""


def _run(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env={**env, **env_extra})


def test_rank_of_multi_rank_job_exits_with_code_and_output_but_no_teardown():
    proc = _run({"WORLD_SIZE": "2", "RANK": "1"})
    assert proc.returncode == 2, proc.stderr  # --stage 4 is a user error
    assert "--stage" in proc.stderr
    assert proc.stdout.startswith("before")
    assert "TEARDOWN RAN" not in proc.stdout


def test_single_process_keeps_normal_teardown():
    proc = _run({})
    assert proc.returncode == 2
    assert "TEARDOWN RAN" in proc.stdout
