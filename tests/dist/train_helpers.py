"""Shared helpers for the `zero-kit train` / `export` distributed tests: real launchers, CPU, gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

VENV_BIN = Path(sys.executable).parent
# Small and quick: the embedded tiny model, short sequences, 2 examples per rank.
FAST = ["--max-length", "64", "--micro-batch", "2", "--log-steps", "1"]


PROBE_SITE = Path(__file__).with_name("probe")  # sitecustomize: the logits probe, see there


def env(**extra: str) -> dict[str, str]:
    base = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if "ZERO_KIT_PROBE_LOGITS" in extra:
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROBE_SITE), os.environ.get("PYTHONPATH")]))
    return {**base, **extra}


def run(cmd: list[str], *, timeout: int = 240, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(**(extra_env or {})))
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def zero_kit(*args: str) -> list[str]:
    return [str(VENV_BIN / "zero-kit"), *args]


def log_records(output: Path) -> list[dict]:
    return [json.loads(line) for line in (output / "train_log.jsonl").read_text().splitlines()]


def run_info(output: Path) -> dict:
    return json.loads((output / "zero_kit_run.json").read_text())


def assert_trained(output: Path, steps: int, world_size: int, stage: int) -> list[float]:
    """The run took `steps` optimizer steps at the expected world size and stage, with finite losses."""
    records = log_records(output)
    assert [r["step"] for r in records][-1] == steps
    losses = [r["loss"] for r in records]
    assert all(0 < loss < 20 for loss in losses), losses
    info = run_info(output)
    assert (info["world_size"], info["zero_stage"]) == (world_size, stage)
    return losses


def load_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors
