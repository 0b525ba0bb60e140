"""The CPU traps of `zero-kit validate CFG --for hf-trainer -- ARGS`, reproduced on two CPU ranks under the real
`deepspeed` launcher with transformers' TrainingArguments and Trainer (hf_cpu_traps_probe.py), and the report
`zero-kit validate` gives for the same script arguments. ZeRO-3 with a train_batch_size key, the third trap:
test_hf_zero3_batch_key.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import env, shm_left
from zero_kit.cli import main
from zero_kit.config.presets import PRESETS_DIR
from zero_kit.dist import free_port

PROBE = Path(__file__).with_name("hf_cpu_traps_probe.py")
WORLD = 2


@pytest.mark.dist
def test_cpu_traps_happen_and_validate_names_them(tmp_path, capsys, monkeypatch):
    config = PRESETS_DIR / "hf_zero2.json"
    deepspeed = Path(sys.executable).with_name("deepspeed")
    port = free_port()
    cmd = [str(deepspeed), "--num_gpus", str(WORLD), "--master_port", str(port), str(PROBE)]
    cmd += ["--config", str(config), "--out", str(tmp_path)]
    done = subprocess.run(cmd, env=env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert shm_left(port) == []  # rank_probe keeps DeepSpeed's unused shm op from starting, as zero-kit's ranks do
    for rank in range(WORLD):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        without = record["without_use_cpu"]
        # two ranks in the process group, one process as far as accelerate (and so the Trainer) knows
        assert without["process_group_size"] == WORLD and without["args_world_size"] == 1, without
        assert without["args_process_index"] == 0  # every rank believes it is rank 0
        assert record["accelerate_use_cpu_env"]["is_deepspeed_enabled"] is False  # DeepSpeed silently off
        assert record["use_cpu"] == {
            "args_world_size": WORLD,
            "is_deepspeed_enabled": True,
            "distributed_type": "DistributedType.DEEPSPEED",
            "num_processes": WORLD,
        }

    # zero-kit validate names each trap for the same script arguments (in-process: one import of transformers)
    validate = ["validate", str(config), "--for", "hf-trainer", "--world-size", "2", "--device", "cpu", "--"]
    assert main([*validate, "--output_dir", "o"]) == 1
    bare = capsys.readouterr().out
    assert "error: TrainingArguments.use_cpu (found false)" in bare and "fix: pass --use_cpu to the script" in bare
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    assert main([*validate, "--use_cpu"]) == 1
    assert "error: ACCELERATE_USE_CPU (found '1')" in capsys.readouterr().out
    monkeypatch.delenv("ACCELERATE_USE_CPU")
    assert main([*validate, "--use_cpu"]) == 0
    assert "OK (0 error(s), 0 warning(s))" in capsys.readouterr().out
