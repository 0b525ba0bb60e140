"""`zero-kit validate`: exit codes 0/1/2, text and --json output, world size from flag or environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zero_kit.cli import main
from zero_kit.commands.validate import world_size_from

GOOD = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}
HF = Path(__file__).resolve().parents[1] / "fixtures" / "configs" / "hf-trainer" / "llamafactory_style_z3.json"


@pytest.fixture(autouse=True)
def _no_launcher_env(monkeypatch):
    for name in ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def write(tmp_path: Path, name: str, content) -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=2))
    return str(path)


def test_clean_config_exits_0(tmp_path, capsys):
    assert main(["validate", write(tmp_path, "ok.json", GOOD), "--world-size", "4"]) == 0
    assert "OK" in capsys.readouterr().out


def test_errors_exit_1_and_show_path_value_fix(tmp_path, capsys):
    path = write(tmp_path, "bad.json", {**GOOD, "zero_optimization": {"stage": 2, "overlap_com": True}})
    assert main(["validate", path, "--world-size", "8"]) == 1
    out = capsys.readouterr().out
    assert "zero_optimization.overlap_com" in out and "overlap_comm" in out
    assert "train_batch_size(16) != micro(2) * grad_accum(2) * world_size(8, --world-size)" in out
    assert "set train_batch_size to 32 or leave it out" in out


def test_warnings_only_exit_0(tmp_path, capsys):
    config = {**GOOD, "zero_optimization": {"stage": 2, "stage3_max_live_parameters": 10}}
    assert main(["validate", write(tmp_path, "w.json", config), "--world-size", "4"]) == 0
    assert "warning: zero_optimization.stage3_max_live_parameters" in capsys.readouterr().out


def test_missing_file_exits_2(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: no such file" in capsys.readouterr().err


def test_invalid_json_exits_2_with_line_and_column(tmp_path, capsys):
    path = write(tmp_path, "broken.json", '{\n  "train_batch_size": 8,\n  "bf16": {"enabled": tru}\n}\n')
    assert main(["validate", path]) == 2
    assert f"{path}:3:23: invalid JSON" in capsys.readouterr().err


def test_unreadable_beats_errors_and_all_files_are_checked(tmp_path, capsys):
    bad = write(tmp_path, "bad.json", {**GOOD, "steps_per_prnt": 1})
    assert main(["validate", bad, str(tmp_path / "missing.json"), "--world-size", "4"]) == 2
    captured = capsys.readouterr()
    assert "steps_per_prnt" in captured.out and "missing.json" in captured.err


def test_duplicate_keys_are_errors(tmp_path, capsys):
    path = write(
        tmp_path, "dup.json", '{"train_batch_size": 16, "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2}'
    )
    assert main(["validate", path, "--world-size", "1"]) == 1
    assert "appears twice" in capsys.readouterr().out


def test_json_output_is_a_list_of_problems(tmp_path, capsys):
    path = write(tmp_path, "bad.json", {**GOOD, "bf16": {"enabled": "true"}})
    assert main(["validate", path, "--world-size", "4", "--json"]) == 1
    problems = json.loads(capsys.readouterr().out)
    assert problems == [
        {
            "file": path,
            "severity": "error",
            "path": "bf16.enabled",
            "value": "true",
            "message": "expected true/false, found a string",
            "fix": "write true without quotes",
        }
    ]


def test_json_output_for_unreadable_file_has_line(tmp_path, capsys):
    path = write(tmp_path, "broken.json", '{"a": }')
    assert main(["validate", path, "--json"]) == 2
    (problem,) = json.loads(capsys.readouterr().out)
    assert (problem["line"], problem["column"]) == (1, 7)


def test_world_size_from_environment(tmp_path, capsys, monkeypatch):
    path = write(tmp_path, "ok.json", GOOD)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert main(["validate", path]) == 0
    monkeypatch.setenv("WORLD_SIZE", "2")  # WORLD_SIZE wins over SLURM_NTASKS
    assert main(["validate", path]) == 1
    assert "world_size(2, WORLD_SIZE)" in capsys.readouterr().out
    assert main(["validate", path, "--world-size", "4"]) == 0  # the flag wins over the environment


def test_world_size_resolution_order():
    assert world_size_from(None, {"OMPI_COMM_WORLD_SIZE": "3"}) == (3, "OMPI_COMM_WORLD_SIZE")
    assert world_size_from(None, {}) == (None, "")
    assert world_size_from(5, {"WORLD_SIZE": "2"}) == (5, "--world-size")


def test_bad_world_size_env_is_a_user_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    assert main(["validate", write(tmp_path, "ok.json", GOOD)]) == 2
    assert "WORLD_SIZE='two'" in capsys.readouterr().err


def test_for_flag_changes_the_auto_verdict(capsys):
    assert main(["validate", str(HF), "--for", "hf-trainer"]) == 0
    assert main(["validate", str(HF), "--for", "deepspeed"]) == 1
    capsys.readouterr()
    # accelerate fills "auto" batch keys itself; only a CPU-only host at world size > 1 trips over train_batch_size
    assert main(["validate", str(HF), "--for", "accelerate", "--world-size", "2"]) == 0
    assert "CPU-only host" in capsys.readouterr().out
    assert main(["validate", str(HF), "--for", "accelerate", "--world-size", "1"]) == 0
    assert "CPU-only host" not in capsys.readouterr().out


def test_real_console_script_end_to_end(tmp_path):
    """The installed entry point, as a user runs it: exit codes 0, 1, 2 and no traceback."""
    ok = write(tmp_path, "ok.json", GOOD)
    bad = write(tmp_path, "bad.json", {**GOOD, "fp16": {"enabled": True}, "bf16": {"enabled": True}})
    broken = write(tmp_path, "broken.json", "{")
    env = {**os.environ, "WORLD_SIZE": "4"}
    for path, code in ((ok, 0), (bad, 1), (broken, 2)):
        run = subprocess.run(
            [sys.executable, "-m", "zero_kit.cli", "validate", path],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert run.returncode == code, run.stderr
        assert "Traceback" not in run.stdout + run.stderr
