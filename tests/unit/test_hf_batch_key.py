"""Issue 22 part 1: the generated HF configs leave train_batch_size out, and that changes nothing the Trainer or
DeepSpeed computes; a ZeRO-3 config that keeps it gets the linter's warning. Each against the upstream code:
transformers' HfTrainerDeepSpeedConfig with real TrainingArguments, DeepSpeed's own DeepSpeedConfig (as zero.Init
calls it, with no process group), accelerate's DeepSpeedPlugin. The launch itself: tests/dist/test_hf_zero3_batch_key.py."""

from __future__ import annotations

import copy
import json
from unittest import mock

import pytest

from zero_kit.cli import main
from zero_kit.config.presets import PRESETS_DIR
from zero_kit.lint import LintContext, lint
from zero_kit.lint.discover import _FakeDist, import_deepspeed

HF_PRESETS = sorted(PRESETS_DIR.glob("hf_*.json"))


def _arguments(world_size: int, micro: int, accum: int):
    """Real TrainingArguments at a world size (a property that asks the process group; here it is given)."""
    from transformers import TrainingArguments

    class AtWorldSize(TrainingArguments):
        @property
        def world_size(self) -> int:
            return world_size

    return AtWorldSize(
        output_dir="unused", per_device_train_batch_size=micro, gradient_accumulation_steps=accum, report_to=[]
    )


def _trainer_filled(config: dict, args) -> dict:
    """The config after the Trainer's own trainer_config_process (what TrainingArguments(deepspeed=...) does)."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    hf = HfTrainerDeepSpeedConfig(copy.deepcopy(config))
    try:
        hf.trainer_config_process(args)
        return hf.config
    finally:
        unset_hf_deepspeed_config()


def _deepspeed_batch(config: dict, world_size: int) -> int:
    """DeepSpeed's own train_batch_size for `config` at `world_size` (as deepspeed.initialize computes it)."""
    import_deepspeed()
    import deepspeed.runtime.config as ds_config

    with mock.patch.object(ds_config, "dist", _FakeDist(world_size)):
        return ds_config.DeepSpeedConfig(copy.deepcopy(config)).train_batch_size


@pytest.mark.parametrize("path", HF_PRESETS, ids=[p.stem for p in HF_PRESETS])
def test_presets_leave_train_batch_size_out(path):
    config = json.loads(path.read_text())
    assert "train_batch_size" not in config
    assert config["train_micro_batch_size_per_gpu"] == config["gradient_accumulation_steps"] == "auto"


@pytest.mark.parametrize(("world_size", "micro", "accum"), [(1, 1, 1), (2, 2, 3), (8, 4, 2)])
def test_without_the_key_deepspeed_derives_what_the_trainer_fills_for_auto(world_size, micro, accum):
    """The same global batch on every code path (CPU or GPU: only the world size enters)."""
    args = _arguments(world_size, micro, accum)
    generated = json.loads((PRESETS_DIR / "hf_zero3.json").read_text())
    with_auto = _trainer_filled({**generated, "train_batch_size": "auto"}, args)
    without = _trainer_filled(generated, args)
    assert with_auto["train_batch_size"] == micro * accum * world_size
    assert "train_batch_size" not in without  # the Trainer fills only what the config names
    assert without["train_micro_batch_size_per_gpu"] == micro and without["gradient_accumulation_steps"] == accum
    assert _deepspeed_batch(without, world_size) == with_auto["train_batch_size"]
    assert _deepspeed_batch(with_auto, world_size) == with_auto["train_batch_size"]


def test_zero3_init_parse_counts_one_rank_and_fails_on_the_key():
    """zero.Init runs DeepSpeedConfig before DeepSpeed's communication is up: it counts one rank (no patching
    here, no process group), so a key filled for two ranks fails, and the config without it passes."""
    import_deepspeed()
    from deepspeed.runtime.config import DeepSpeedConfig

    args = _arguments(2, 2, 3)
    generated = json.loads((PRESETS_DIR / "hf_zero3.json").read_text())
    with pytest.raises(AssertionError, match=r"12 != 2 \* 3 \* 1"):
        DeepSpeedConfig(_trainer_filled({**generated, "train_batch_size": "auto"}, args))
    assert DeepSpeedConfig(_trainer_filled(generated, args)).train_batch_size == 2 * 3  # one rank counted

    problems = lint({**generated, "train_batch_size": "auto"}, LintContext(world_size=2, target="hf-trainer"))
    (warning,) = [p for p in problems if p.path == "train_batch_size"]
    assert warning.severity == "warning" and "zero.Init" in warning.message
    assert warning.fix.startswith("remove train_batch_size")
    assert not [p for p in problems if p.severity == "error"]


@pytest.mark.parametrize(
    ("change", "target", "world_size", "warned"),
    [
        ({"train_batch_size": 12}, "hf-trainer", None, True),
        ({"train_batch_size": 12}, "accelerate", 2, True),
        ({"train_batch_size": "auto"}, "hf-trainer", 1, False),  # one rank: zero.Init's count is right
        ({"train_batch_size": "auto", "zero_optimization": {"stage": 2}}, "hf-trainer", 2, False),  # no zero.Init
        ({}, "hf-trainer", 2, False),
        ({"train_batch_size": 12}, "deepspeed", 2, False),  # a plain script initializes before it builds
    ],
)
def test_zero3_batch_key_warning_cases(change, target, world_size, warned):
    config = json.loads((PRESETS_DIR / "hf_zero3.json").read_text())
    if target == "deepspeed":
        config = json.loads((PRESETS_DIR / "zero3.json").read_text())
    config.update(change)
    problems = lint(config, LintContext(world_size=world_size, target=target))
    assert any("zero.Init" in p.message for p in problems) is warned, [str(p) for p in problems]


def test_accelerate_drops_an_auto_key_before_zero3_init_itself():
    """accelerate's DeepSpeedPlugin hands zero.Init (through transformers' HfDeepSpeedConfig) the config without an
    "auto" train_batch_size, so the linter warns accelerate users only about a number."""
    from accelerate.utils import DeepSpeedPlugin
    from transformers.integrations.deepspeed import deepspeed_config, unset_hf_deepspeed_config

    config = {**json.loads((PRESETS_DIR / "hf_zero3.json").read_text()), "train_batch_size": "auto"}
    plugin = DeepSpeedPlugin(hf_ds_config=copy.deepcopy(config), zero3_init_flag=True)
    try:
        plugin.set_deepspeed_weakref()
        assert "train_batch_size" not in deepspeed_config()
    finally:
        unset_hf_deepspeed_config()
    assert not [p for p in lint(config, LintContext(world_size=2, target="accelerate")) if "zero.Init" in p.message]


def test_accelerate_yaml_json_and_hf_auto_leave_the_key_out(tmp_path, capsys):
    out, yaml = tmp_path / "ds.json", tmp_path / "acc.yaml"
    assert main(["config", "--stage", "3", "--world-size", "2", "--global-batch", "8", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["train_batch_size"] == 8  # plain DeepSpeed at a given world size: kept
    out.unlink()
    flags = ["config", "--stage", "3", "--world-size", "2", "--global-batch", "8"]
    assert main([*flags, "-o", str(out), "--accelerate-yaml", str(yaml)]) == 0
    config = json.loads(out.read_text())
    assert "train_batch_size" not in config
    assert config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * 2 == 8
    assert main(["config", "--stage", "3", "--hf-auto", "--world-size", "2", "--micro-batch", "2"]) == 0
    pinned = json.loads(capsys.readouterr().out)
    assert "train_batch_size" not in pinned and pinned["train_micro_batch_size_per_gpu"] == 2
