"""The README's quick start as a new user runs it, in a folder of its own: `zero-kit train --nproc 2 --stage 3` as
written (the default job: the embedded tiny LLaMA, the shipped data, ZeRO-3 on two CPU ranks; only a port added,
this file's own), then the README's snippet that loads `zero-kit-out/final` and generates, then docs/training.md's
`zero-kit export` of the run's last checkpoint. One launch serves the three blocks (tests/support/docs.py:
`quickstart`, `readme-generate`, `export-force`). The terminal is the one the first-run issue set: at most 45 lines,
no launcher line and no FutureWarning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zero_kit.launch.chatter import is_chatter

from tests.support import docs
from tests.support.jobs import VENV_BIN, env, run
from tests.support.runs import load_safetensors_dir

pytestmark = pytest.mark.dist
PORT = "29890"
LINES = 45  # the first-run issue: the quick start prints at most this many lines


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("quickstart")
    argv = docs.command("quickstart", 1)
    assert argv[0] == "zero-kit", argv
    proc = run([str(VENV_BIN / "zero-kit"), *argv[1:], "--master-port", PORT], cwd=folder, timeout=420)
    return folder, proc.stdout + proc.stderr


def test_the_quick_start_trains_and_prints_only_zero_kits_lines(quickstart):
    folder, terminal = quickstart
    lines = terminal.splitlines()
    assert len(lines) <= LINES, terminal
    assert not [line for line in lines if is_chatter(line) or "FutureWarning" in line], terminal
    assert "exported checkpoint-" in terminal and (folder / "zero-kit-out" / "final" / "config.json").is_file()


def test_the_readme_snippet_loads_the_export_and_generates(quickstart):
    folder, _ = quickstart
    snippet = docs.covered("readme-generate").text
    proc = subprocess.run(
        [sys.executable, "-c", snippet], cwd=folder, env=env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ZeRO stage 3" in proc.stdout and proc.stdout.strip() != "ZeRO stage 3", proc.stdout  # prompt + new tokens


def test_the_docs_export_line_writes_the_final_weights_again(quickstart):
    folder, _ = quickstart
    argv = docs.command("export-force")
    assert argv[:2] == ["zero-kit", "export"], argv
    run([str(VENV_BIN / "zero-kit"), *argv[1:]], cwd=folder, timeout=300)
    exported = load_safetensors_dir(folder / "exported")
    final = load_safetensors_dir(folder / "zero-kit-out" / "final")
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)
