"""The schema is learned from DeepSpeed and transformers themselves: check what discovery finds."""

from __future__ import annotations

from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

from zero_kit.lint import LintContext, lint
from zero_kit.lint.discover import deepspeed_parse, discover, hf_trainer_auto_keys
from zero_kit.lint.installed import optimizer_parameters
from zero_kit.lint.problem import join


def test_discovers_top_level_keys_and_sections():
    schema = discover()
    top = schema.keys[""]
    assert {"train_batch_size", "steps_per_print", "gradient_clipping", "zero_optimization", "optimizer"} <= set(top)
    # the default DeepSpeed offers, which gives the expected type (0.0 up to 0.18, 1.0 from 0.19)
    assert top["gradient_clipping"] == GRADIENT_CLIPPING_DEFAULT
    assert "partition_activations" in schema.keys["activation_checkpointing"]
    assert "pipeline_stage" in schema.keys["checkpoint.parallel_write"]
    assert schema.models["zero_optimization"] is DeepSpeedZeroConfig
    assert schema.models["tensorboard"].__name__ == "TensorBoardConfig"


def test_hf_auto_keys_come_from_transformers():
    keys = hf_trainer_auto_keys()
    assert {
        "train_batch_size",
        "gradient_clipping",
        "optimizer.params.lr",
        "zero_optimization.reduce_bucket_size",
    } <= keys
    assert "zero_optimization.stage" not in keys


def test_optimizer_parameters_from_signatures():
    accepted, open_ = optimizer_parameters("AdamW")
    assert {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam"} <= set(accepted) and not open_
    assert optimizer_parameters("NoSuchOptimizer") is None


def test_deepspeed_parse_sees_the_world_size():
    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}
    assert deepspeed_parse(config, 2) is None
    assert "8 != 2 * 2 * 4" in deepspeed_parse(config, 4)


def test_deepspeed_native_auto_is_not_flagged():
    config = {"train_micro_batch_size_per_gpu": 1, "data_types": {"keep_in_fp32_modules": "auto"}}
    problems = lint(config, LintContext(world_size=2))
    if "keep_in_fp32_modules" in discover().keys["data_types"]:  # DeepSpeed 0.19 reads "auto" itself
        assert problems == []
    else:  # a release without the key ignores it, which the lint says
        (problem,) = problems
        assert problem.path == "data_types.keep_in_fp32_modules" and "unknown key" in problem.message


def test_key_paths():
    assert join("", "a") == "a" and join("a", "b") == "a.b" and join("a", 0) == "a[0]"
    assert join("a", "x.y") == 'a["x.y"]' and join("", "") == '[""]'
