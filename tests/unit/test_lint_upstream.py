"""Issue 11: each linter verdict changed there, next to the upstream behaviour that justifies it, reproduced by
running DeepSpeed's, transformers' and accelerate's own code (no process group, no launch)."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

from zero_kit.cli import main
from zero_kit.lint import LintContext, lint, read_config
from zero_kit.lint.discover import _FakeDist, deepspeed_parse, import_deepspeed
from zero_kit.lint.installed import deepspeed_version, zero_section_keys

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "realworld"
AUTO_BATCH = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 2},
}


def _at(problems, path):
    return [p for p in problems if p.path == path]


def _deepspeed_config(config: dict, world_size: int = 1):
    import_deepspeed()
    import deepspeed.runtime.config as ds_config

    with mock.patch.object(ds_config, "dist", _FakeDist(world_size)):
        return ds_config.DeepSpeedConfig(config)


# 1. accelerate + "auto" train_batch_size ------------------------------------------------------------------------


def _accelerate_fill(config: dict, num_processes: int, micro: int = 4) -> dict:
    """What accelerate's Accelerator._prepare_deepspeed gives DeepSpeed (accelerator.py: train_batch_size =
    batch_size_per_device * gradient_accumulation_steps * self.num_processes), through its own DeepSpeedPlugin."""
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(hf_ds_config=copy.deepcopy(config))
    plugin.fill_match("gradient_accumulation_steps", must_match=False, gradient_accumulation_steps=1)
    accum = plugin.get_value("gradient_accumulation_steps")
    batch = {"train_micro_batch_size_per_gpu": micro, "train_batch_size": micro * accum * num_processes}
    plugin.deepspeed_config_process(must_match=False, **batch)
    return plugin.deepspeed_config


def test_accelerate_auto_train_batch_fails_only_where_accelerate_has_no_backend():
    from accelerate.state import PartialState

    PartialState._reset_state()
    try:
        state = PartialState()  # this CPU-only test process: no distributed backend, as on a CPU-only host
        assert state.backend is None and state.num_processes == 1
        cpu_only = _accelerate_fill(AUTO_BATCH, state.num_processes)
    finally:
        PartialState._reset_state()
    assert "train_batch_size is not equal" in deepspeed_parse(cpu_only, 2)
    assert deepspeed_parse(_accelerate_fill(AUTO_BATCH, 2), 2) is None  # a GPU host: num_processes = world size
    without = {k: v for k, v in AUTO_BATCH.items() if k != "train_batch_size"}
    assert deepspeed_parse(_accelerate_fill(without, 1), 2) is None  # fill_match fills only keys that exist

    problems = lint(copy.deepcopy(AUTO_BATCH), LintContext(world_size=2, target="accelerate"))
    assert not [p for p in problems if p.severity == "error"], [str(p) for p in problems]
    (warning,) = _at(problems, "train_batch_size")
    assert (
        warning.severity == "warning"
        and "CPU-only host" in warning.message
        and "leave train_batch_size out" in warning.fix
    )
    assert not _at(lint(copy.deepcopy(AUTO_BATCH), LintContext(world_size=1, target="accelerate")), "train_batch_size")
    assert not _at(lint(without, LintContext(world_size=2, target="accelerate")), "train_batch_size")


# 2. zero_optimization keys at the top level -----------------------------------------------------------------------


def test_top_level_offload_is_silently_ignored_by_deepspeed_and_an_error_here():
    misplaced = {"train_batch_size": 8, "zero_optimization": {"stage": 2}, "offload_optimizer": {"device": "cpu"}}
    assert _deepspeed_config(misplaced).zero_config.offload_optimizer is None  # accepted, and no offload
    placed = {"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert _deepspeed_config(placed).zero_config.offload_optimizer.device == "cpu"

    (problem,) = _at(lint(misplaced), "offload_optimizer")
    assert problem.severity == "error" and "move it under zero_optimization" in problem.fix


@pytest.mark.parametrize("key", ["offload_param", "stage3_max_live_parameters", "overlap_comm", "reduce_bucket_size"])
def test_every_zero_key_at_the_top_level_is_an_error(key):
    assert key in zero_section_keys()  # learned from DeepSpeedZeroConfig's fields and aliases
    config = {"train_batch_size": 8, "zero_optimization": {"stage": 3}, key: 1}
    assert deepspeed_parse(config, 1) is None
    (problem,) = _at(lint(config), key)
    assert problem.severity == "error" and "zero_optimization" in problem.fix


# 3. top-level scalars DeepSpeed reads without a schema ------------------------------------------------------------


def test_steps_per_print_as_string_passes_the_parse_and_breaks_the_first_step():
    from deepspeed.runtime.engine import DeepSpeedEngine

    parsed = _deepspeed_config({"train_batch_size": 8, "steps_per_print": "10"})
    value = DeepSpeedEngine.steps_per_print(SimpleNamespace(_config=parsed))
    assert value == "10"
    assert "(self.global_steps + 1) % self.steps_per_print()" in inspect.getsource(DeepSpeedEngine._take_model_step)
    with pytest.raises(TypeError):
        (0 + 1) % value  # noqa: B018  the engine's expression with the value DeepSpeed kept

    (problem,) = _at(lint({"train_batch_size": 8, "steps_per_print": "10"}), "steps_per_print")
    assert problem.severity == "error" and "expected a number, found a string" in problem.message
    assert problem.fix == "write 10 without quotes"
    assert not _at(lint({"train_batch_size": 8, "steps_per_print": 10}), "steps_per_print")


# 4. hjson -------------------------------------------------------------------------------------------------------


def test_deepspeed_reads_hjson_paths_while_trainer_and_accelerate_do_not(capsys):
    path = CORPUS / "issues" / "lightning-17790-offload-optimizer.json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    with pytest.raises(AssertionError, match="train_batch_size or train_micro_batch_size_per_gpu"):
        _deepspeed_config(str(path))  # DeepSpeed's hjson read succeeds; its batch check then speaks
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    with pytest.raises(json.JSONDecodeError):
        HfDeepSpeedConfig(str(path))

    assert main(["validate", str(path), "--world-size", "1"]) == 1
    assert "not strict JSON" in capsys.readouterr().out
    assert main(["validate", str(path), "--for", "hf-trainer"]) == 2
    assert "hjson would accept it" in capsys.readouterr().err


def test_hjson_read_still_reports_duplicate_keys(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{\n  "train_batch_size": 8\n  "train_batch_size": 16,\n}\n')  # missing and trailing comma
    config, problems = read_config(path, "deepspeed")
    assert config == {"train_batch_size": 16}
    assert {p.severity for p in problems} == {"warning", "error"}
    assert any("appears twice" in p.message for p in problems)


# 5. optimizer.params.max_grad_norm --------------------------------------------------------------------------------


def test_max_grad_norm_bites_only_when_deepspeed_builds_the_optimizer():
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine

    engine = mock.MagicMock(has_moe_layers=False)
    engine.optimizer_params.return_value = {"lr": 1e-3, "max_grad_norm": 1.0}
    build = mock.Mock(side_effect=lambda params: DeepSpeedEngine._configure_basic_optimizer(engine, params))
    engine._configure_basic_optimizer = build
    with pytest.raises(ValueError, match="max_grad_norm"):
        DeepSpeedEngine._configure_optimizer(engine, None, [])
    build.reset_mock()
    client = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    try:
        DeepSpeedEngine._configure_optimizer(engine, client, [])
    except Exception as err:  # the stand-in engine runs out later; the point is what was never called
        assert "max_grad_norm" not in str(err)
    build.assert_not_called()

    config = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "max_grad_norm": 1.0}}}
    assert _at(lint(copy.deepcopy(config)), "optimizer.params.max_grad_norm")[0].severity == "warning"
    for target in ("hf-trainer", "accelerate"):
        (problem,) = _at(lint(copy.deepcopy(config), LintContext(target=target)), "optimizer.params.max_grad_norm")
        assert problem.severity == "error" and "build the optimizer" in problem.message


def test_hf_trainer_hands_deepspeed_the_optimizer_section_to_build():
    from accelerate.utils import DummyOptim
    from transformers.integrations.deepspeed import deepspeed_optim_sched

    ds = SimpleNamespace(config={"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})
    trainer = SimpleNamespace(lr_scheduler=None)
    args = SimpleNamespace(optim="adamw_torch")  # transformers 4.x reads args.optim here
    optimizer, _ = deepspeed_optim_sched(trainer, ds, args, 10, [])
    assert isinstance(optimizer, DummyOptim)  # DeepSpeed builds it from the section (and refuses max_grad_norm)


# 6. removed keys and 1-bit optimizers ----------------------------------------------------------------------------


def test_removed_keys_name_the_installed_release():
    config = {"train_batch_size": 8, "elasticity": {"enabled": True}}
    problems = _at(lint(copy.deepcopy(config)), "elasticity")
    if "has been removed" in (deepspeed_parse(config, 1) or ""):  # DeepSpeed 0.19 removed elasticity
        (problem,) = problems
        assert problem.severity == "error" and f"DeepSpeed {deepspeed_version()}" in problem.message
        assert "older DeepSpeed releases" in problem.message
    else:  # a release that still has elasticity: the lint must not call it removed
        assert not any("older DeepSpeed releases" in p.message for p in problems), [str(p) for p in problems]


def test_one_bit_optimizer_passes_the_parse_and_is_an_error():
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    config = {"train_batch_size": 8, "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3}}}
    assert deepspeed_parse(config, 1) is None
    if "onebitadam" in DEEPSPEED_OPTIMIZERS:  # DeepSpeed <= 0.18 still builds it: no error is right there
        from deepspeed.runtime.fp16.onebit.adam import OnebitAdam

        assert not [p for p in _at(lint(config), "optimizer.type") if p.severity == "error"]
        bad = {**config, "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3, "freeze_stepz": 2}}}
        (problem,) = _at(lint(bad), "optimizer.params.freeze_stepz")  # its real signature is read, as for Adam
        assert "freeze_step" in problem.fix and "freeze_step" in inspect.signature(OnebitAdam).parameters
        return
    import torch

    with pytest.raises(AttributeError):
        torch.optim.OneBitAdam  # noqa: B018  what _configure_basic_optimizer falls back to
    (problem,) = _at(lint(config), "optimizer.type")
    assert problem.severity == "error" and deepspeed_version() in problem.message


# 7. HF Trainer with hard-coded batch values ------------------------------------------------------------------------


def _trainer_arguments(world_size: int, per_device: int, accum: int) -> SimpleNamespace:
    from transformers import TrainingArguments

    fields = {f.name: f.default for f in dataclasses.fields(TrainingArguments) if f.init}
    fields.update(per_device_train_batch_size=per_device, gradient_accumulation_steps=accum)
    args = SimpleNamespace(**fields, world_size=world_size)
    args.get_warmup_steps = lambda steps: 0
    return args


def test_hf_trainer_hard_coded_train_batch_must_match_its_arguments():
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    config = {**AUTO_BATCH, "train_batch_size": 32}
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=64))
    hf = HfTrainerDeepSpeedConfig(copy.deepcopy(config))
    hf.trainer_config_process(_trainer_arguments(2, 4, 1))
    with pytest.raises(ValueError, match="train_batch_size=32 vs hf train_batch_size"):
        hf.trainer_config_finalize(_trainer_arguments(2, 4, 1), model, 10)
    matching = HfTrainerDeepSpeedConfig(copy.deepcopy(config))
    matching.trainer_config_process(_trainer_arguments(2, 4, 4))
    matching.trainer_config_finalize(_trainer_arguments(2, 4, 4), model, 10)

    problems = lint(copy.deepcopy(config), LintContext(world_size=2, target="hf-trainer"))
    (problem,) = _at(problems, "train_batch_size")
    assert (
        problem.severity == "warning" and "per_device_train_batch_size x gradient_accumulation_steps" in problem.message
    )
    assert not [p for p in problems if p.severity == "error"]
