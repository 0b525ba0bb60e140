"""One strict config reader: a key given twice is refused the same way by `zero-kit validate`, `zero-kit train
--ds-config`, `zero-kit export` and the Python API, naming the full key path and both values.

Why it matters: DeepSpeed refuses such a file, but the HF Trainer parses it with plain json.load, where the last
value silently wins (reproduced below), so `train --ds-config` used to train at a stage nobody chose."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zero_kit.checkpoints import store
from zero_kit.errors import UserError
from zero_kit.hf import deepspeed_config
from zero_kit.lint import read_config

TWICE = """{
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "zero_optimization": {"stage": 3, "stage": 2}
}
"""
SAID = ["zero_optimization.stage", "first 3, then 2"]


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zero_kit.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


@pytest.fixture
def twice(tmp_path):
    path = tmp_path / "twice.json"
    path.write_text(TWICE)
    return path


def test_the_hf_trainer_alone_silently_keeps_the_last_value(twice):
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    assert HfDeepSpeedConfig(str(twice)).config["zero_optimization"]["stage"] == 2


def test_deepspeed_itself_refuses_duplicate_keys(twice):
    from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys

    with pytest.raises(ValueError, match="Duplicate key"):
        json.loads(TWICE, object_pairs_hook=dict_raise_error_on_duplicate_keys)


def test_reader_names_the_full_path_and_both_values(twice):
    config, problems = read_config(twice)
    assert config["zero_optimization"] == {"stage": 2}
    assert [(p.path, p.value) for p in problems] == [("zero_optimization.stage", [3, 2])]
    nested = twice.with_name("nested.json")
    nested.write_text('{"a": [{"b": {"c": 1, "c": {"d": 2}}}], "a2": 1}')
    assert [(p.path, p.value) for p in read_config(nested)[1]] == [("a[0].b.c", [1, {"d": 2}])]


def test_validate_refuses_it(twice):
    done = _cli("validate", str(twice), "--for", "hf-trainer")
    assert done.returncode == 1, done.stdout + done.stderr
    assert all(s in done.stdout for s in SAID), done.stdout


def test_train_refuses_it_before_any_work(twice, tmp_path):
    out = tmp_path / "out"
    done = _cli("train", "--ds-config", str(twice), "--max-steps", "1", "--output", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert all(s in done.stderr for s in SAID), done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


def test_python_api_refuses_it(twice):
    with pytest.raises(UserError) as caught:
        deepspeed_config(ds_config=str(twice))
    assert all(s in str(caught.value) for s in SAID)


def test_export_refuses_a_run_record_with_a_key_given_twice(tmp_path):
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    (ckpt / "weights.bin").write_bytes(b"0" * 8)
    (ckpt / store.RUN_INFO).write_text('{"world_size": 1, "zero_stage": 3, "zero_stage": 2, "options": {}}')
    store.write_manifest(ckpt, step=1, world_size=1)
    done = _cli("export", str(ckpt), "--out", str(tmp_path / "hf"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "zero_stage" in done.stderr and "first 3, then 2" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
