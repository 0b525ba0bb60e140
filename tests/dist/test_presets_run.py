"""Each preset drives real optimizer steps of a tiny LLaMA under the real `deepspeed` launcher (2 CPU ranks, gloo)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import shm_left

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("preset_steps.py")
STEPS = 3


def _deepspeed_launcher() -> list[str]:
    exe = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or shutil.which("deepspeed")
    assert exe, "the deepspeed launcher is not installed"
    return [exe]


def run_launcher(cmd: list[str], timeout: int = 420) -> subprocess.CompletedProcess:
    """Run a launcher in its own process group; on timeout kill the whole group so no rank outlives the test."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"launcher timed out after {timeout} s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


PRESETS = {
    "zero1": "DeepSpeedZeroOptimizer",
    "zero2": "DeepSpeedZeroOptimizer",
    "zero3": "DeepSpeedZeroOptimizer_Stage3",
    "zero3_offload": "DeepSpeedZeroOptimizer_Stage3",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """One launch for every preset: each gets its own model and engine in the same two ranks (preset_steps.py),
    which is what a preset decides; the launch is the fixed cost of each run (issue 23), paid once."""
    out = tmp_path_factory.mktemp("presets") / "result.json"
    configs = [arg for name in PRESETS for arg in ("--config", str(ROOT / "ds_configs" / f"{name}.json"))]
    cmd = [*_deepspeed_launcher(), "--num_gpus", "2", "--master_port", "29521", str(SCRIPT), *configs,
           "--steps", str(STEPS), "--out", str(out)]  # fmt: skip
    proc = run_launcher(cmd)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert shm_left(29521) == []  # preset_steps keeps DeepSpeed's unused shm op from starting, as zero-kit's ranks do
    return out


@pytest.mark.dist
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_real_steps_on_two_ranks(preset, results):
    config = ROOT / "ds_configs" / f"{preset}.json"
    ranks = [json.loads(Path(f"{results}.{preset}.rank{r}").read_text()) for r in (0, 1)]
    stage = json.loads(config.read_text())["zero_optimization"]["stage"]
    for rank, result in enumerate(ranks):
        assert result["rank"] == rank and result["world_size"] == 2
        assert result["stage"] == stage
        assert result["global_steps"] == STEPS, "each micro step must be an optimizer step (grad accum 1)"
        assert result["finite"] and len(result["losses"]) == STEPS
        assert result["optimizer"] == PRESETS[preset]
        assert result["dtype"] == "torch.bfloat16", "the preset asks for bf16"
    if "offload" in preset:
        assert ranks[0]["inner_optimizer"] == "DeepSpeedCPUAdam", "optimizer offload must run DeepSpeed's CPU Adam"
