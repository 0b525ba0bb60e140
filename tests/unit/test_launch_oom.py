"""A rank killed by SIGKILL (what the kernel's OOM killer sends) is said by the supervisor in one line, with its
rank, its last sampled RSS and the plan with its fix, never a bare 137: as its own child, and through a launcher
that reports its rank's -9 as the deepspeed launcher does (exit 247). A kill of the supervisor's own is not."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from zero_kit.launch import Launch, supervise

PY = sys.executable
HOG = """
import os, signal, time
held = bytearray(96 * 2**20)  # resident: written, not only reserved
time.sleep(1.0)  # sampled by the supervisor every half second
os.kill(os.getpid(), signal.SIGKILL)
"""
LAUNCHER = """
import subprocess, sys
rank = subprocess.run([sys.executable, "-m", "zk_hog"])
sys.exit(rank.returncode)  # -9: exits 247, as the deepspeed launcher does
"""
NOTE = "planned peak 2.00 GiB per rank; fix: --micro-batch 1 --grad-accum 4"


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "zk_hog.py").write_text(HOG)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    return {**os.environ, "PYTHONPATH": str(tmp_path), "RANK": "1"}


def test_a_rank_killed_by_sigkill_is_named_with_its_rss_and_the_plan(tmp_path, capsys):
    launch = Launch("zk_hog", [[PY, "-m", "zk_hog"], [PY, "-c", "import time; time.sleep(30)"]])
    outcome = supervise(launch, env=_env(tmp_path), name="zero-kit train", memory_note=NOTE)
    assert outcome.codes[0] == -9 and outcome.exit_code == -9
    line = outcome.killed
    assert line.startswith("zero-kit train: rank 1 was killed (SIGKILL), probably for memory: last RSS 0.")
    assert line.endswith(f"GiB, {NOTE}") and float(line.split("last RSS ")[1].split(" GiB")[0]) >= 0.09
    assert capsys.readouterr().err.strip() == line


def test_through_a_launcher_the_rank_that_held_most_is_named(tmp_path):
    launch = Launch("zk_hog", [[PY, str(tmp_path / "launcher.py")]])
    outcome = supervise(launch, env=_env(tmp_path), memory_note=NOTE)
    assert outcome.exit_code == 247
    assert outcome.killed.startswith("zero-kit: rank 1 was killed (SIGKILL), probably for memory: last RSS ")


def test_the_supervisors_own_kill_is_not_a_memory_kill(tmp_path):
    launch = Launch("zk_hog", [[PY, "-m", "zk_hog"]])
    outcome = supervise(launch, env=_env(tmp_path), timeout=0.3, memory_note=NOTE)
    assert outcome.timed_out and outcome.killed is None
