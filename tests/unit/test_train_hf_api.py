"""The Python API for people with their own Trainer script (zero_kit.hf)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from zero_kit.errors import UserError
from zero_kit.hf import ThroughputCallback, deepspeed_config
from zero_kit.train.options import TrainOptions
from zero_kit.train.run import adopt_file_values


def test_deepspeed_config_from_cli_options_leaves_batch_to_the_trainer():
    config = deepspeed_config(stage=3, offload_optimizer="cpu")
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert config["train_micro_batch_size_per_gpu"] == "auto"


def test_ds_config_file_is_linted_and_bad_files_are_user_errors(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(deepspeed_config(stage=2)))
    assert deepspeed_config(ds_config=str(good))["zero_optimization"]["stage"] == 2
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        deepspeed_config(ds_config=str(broken))
    with pytest.raises(UserError, match="cannot read"):
        deepspeed_config(ds_config=str(tmp_path / "missing.json"))


def test_concrete_file_values_win_over_untouched_flags():
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 2,
        "optimizer": {"params": {"lr": 3e-5}},
    }
    opts = adopt_file_values(TrainOptions(grad_accum=2), config)
    assert (opts.micro_batch, opts.grad_accum, opts.lr) == (8, 2, 3e-5)
    with pytest.raises(UserError, match="--grad-accum 4 vs 2"):
        adopt_file_values(TrainOptions(grad_accum=4, ds_config="f.json"), config)


def test_throughput_callback_adds_tokens_per_second():
    callback = ThroughputCallback()
    state = SimpleNamespace(num_input_tokens_seen=0)
    args = SimpleNamespace(world_size=2, bf16=False, fp16=False)
    callback.on_train_begin(args, state, None)
    state.num_input_tokens_seen = 5000
    logs = {"loss": 1.0}
    callback.on_log(args, state, None, logs=logs)
    assert logs["tokens_per_s"] > 0 and "mfu" not in logs  # no GPU: MFU is not claimed
