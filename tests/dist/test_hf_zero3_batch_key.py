"""Why the generated HF configs leave train_batch_size out: under ZeRO-3 the Trainer's from_pretrained runs
deepspeed.zero.Init, which on CPU ranks parses the config before DeepSpeed's communication is up and counts one
rank. Any train_batch_size key then fails DeepSpeed's batch check; without it the model builds, and DeepSpeed
derives the same global batch the Trainer fills for "auto". Real `deepspeed` launcher, 2 CPU ranks, real
transformers and DeepSpeed code (hf_zero3_batch_probe.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import env, shm_left
from zero_kit.config.presets import PRESETS_DIR
from zero_kit.dist import free_port

PROBE = Path(__file__).with_name("hf_zero3_batch_probe.py")
MICRO, ACCUM, WORLD = 2, 3, 2  # the probe's TrainingArguments; two ranks


@pytest.mark.dist
def test_zero3_from_pretrained_fails_with_train_batch_size_and_works_without(tmp_path):
    config = PRESETS_DIR / "hf_zero3.json"
    assert "train_batch_size" not in json.loads(config.read_text())  # the generated preset leaves it out
    deepspeed = Path(sys.executable).with_name("deepspeed")
    port = free_port()
    cmd = [str(deepspeed), "--num_gpus", str(WORLD), "--master_port", str(port), str(PROBE)]
    cmd += ["--config", str(config), "--out", str(tmp_path)]
    done = subprocess.run(cmd, env=env(OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert shm_left(port) == []  # rank_probe keeps DeepSpeed's unused shm op from starting, as zero-kit's ranks do
    expected = MICRO * ACCUM * WORLD
    for rank in range(WORLD):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["auto"]["args_world_size"] == WORLD
        assert record["auto"]["filled_train_batch_size"] == expected  # the Trainer counts both ranks
        for variant in ("auto", "number"):
            assert not record[variant]["built"], (rank, variant)
            # DeepSpeed's batch assertion, at the one rank zero.Init counted
            assert f"{expected} != {MICRO} * {ACCUM} * 1" in record[variant]["error"], record[variant]["error"]
        absent = record["absent"]
        assert absent["built"] and absent["partitioned"], absent
        assert absent["filled_train_batch_size"] is None and absent["ds_world_size"] == WORLD
        # DeepSpeed derives the value the Trainer fills for "auto": same global batch with or without the key
        assert absent["derived_train_batch_size"] == expected
        # where the communication is up before the model (GPU hosts), "auto" builds too, with the same value
        after = record["auto_after_comm_up"]
        assert after["built"] and after["derived_train_batch_size"] == expected == after["filled_train_batch_size"]
