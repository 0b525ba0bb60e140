"""Issue 22 part 2: `zero-kit validate CFG --for hf-trainer -- SCRIPT ARGS` reports exactly the mismatches the HF
Trainer stops on. Each case runs transformers' own code on the same arguments (HfArgumentParser(TrainingArguments),
HfTrainerDeepSpeedConfig.trainer_config_process + trainer_config_finalize) and compares its error with the report.
The CPU traps' mechanisms run on two CPU ranks in tests/dist/test_hf_cpu_traps.py."""

from __future__ import annotations

import copy
import json
import re
from types import SimpleNamespace

import pytest

from zero_kit.cli import main
from zero_kit.config.presets import PRESETS_DIR
from zero_kit.lint import LintContext, lint
from zero_kit.lint.rules_trainer import STOP
from zero_kit.lint.script_args import parse_trainer_arguments

WORLD = 2
FIXED = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "bf16": {"enabled": True},
    "fp16": {"enabled": False},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-4, "warmup_num_steps": 10, "total_num_steps": 100},
    },
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 4_000_000},  # a CPU-sized bucket (rules_zero)
}
# The script arguments that give every fixed value above (on CPU: --use_cpu, which --bf16 needs there).
MATCHING = "--use_cpu --bf16 --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --learning_rate 1e-4"
MATCHING += " --adam_beta2 0.95 --weight_decay 0.1 --max_steps 100 --warmup_steps 10"


def _warmup_ratio_flags() -> str:
    """A warmup of 20% of the steps as the installed TrainingArguments spells it (4.x: --warmup_ratio; 5.x: a
    --warmup_steps below 1)."""
    import dataclasses

    from transformers import TrainingArguments

    has_ratio = "warmup_ratio" in {f.name for f in dataclasses.fields(TrainingArguments)}
    return "--warmup_steps 0 --warmup_ratio 0.2" if has_ratio else "--warmup_steps 0.2"


WARMUP_RATIO = _warmup_ratio_flags()
CASES = {
    "all-match": (FIXED, MATCHING),
    "lr-bf16-micro": (
        FIXED,
        MATCHING.replace("--bf16 ", "").replace("1e-4", "3e-4").replace("batch_size 4", "batch_size 2"),
    ),
    "defaults": (FIXED, "--use_cpu --output_dir out"),
    "betas-eps-clip-fp16": (
        {**FIXED, "gradient_clipping": 0.5, "fp16": {"enabled": True}, "bf16": {"enabled": False}},
        MATCHING.replace("--bf16", "--adam_epsilon 1e-6"),
    ),
    "warmup-ratio": (FIXED, MATCHING.replace("--warmup_steps 10", WARMUP_RATIO)),
    "no-scheduler-auto-batch": (
        {k: v for k, v in FIXED.items() if k not in ("scheduler", "train_batch_size")},
        MATCHING + " --auto_find_batch_size --per_device_train_batch_size 8",
    ),
    "hf-preset": (json.loads((PRESETS_DIR / "hf_zero3.json").read_text()), "--use_cpu --learning_rate 3e-4 --bf16"),
}


def _propagate_args_to_deepspeed(accelerator, args) -> None:
    """transformers' own step at the start of an auto-batch-size training loop: a function of
    transformers.integrations.deepspeed in 5.x, a Trainer method before (4.57, the oldest supported set)."""
    from transformers.integrations import deepspeed

    if hasattr(deepspeed, "propagate_args_to_deepspeed"):
        deepspeed.propagate_args_to_deepspeed(accelerator, args, True)
    else:
        from transformers import Trainer

        Trainer.propagate_args_to_deepspeed(SimpleNamespace(accelerator=accelerator, args=args), True)


def _transformers_mismatches(config: dict, argv: list[str]) -> set[str]:
    """The keys the HF Trainer's own HfTrainerDeepSpeedConfig stops on for these script arguments."""
    from transformers import HfArgumentParser, TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    class AtWorldSize(TrainingArguments):
        @property
        def world_size(self) -> int:
            return WORLD

    (args, _) = HfArgumentParser(AtWorldSize).parse_args_into_dataclasses(argv, return_remaining_strings=True)
    hf = HfTrainerDeepSpeedConfig(copy.deepcopy(config))
    try:
        hf.trainer_config_process(args)
        if args.auto_find_batch_size:  # Trainer._update_auto_batch_size, as every training loop starts
            plugin = SimpleNamespace(hf_ds_config=hf)
            _propagate_args_to_deepspeed(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)), args)
            hf = plugin.hf_ds_config
        model = SimpleNamespace(config=SimpleNamespace(hidden_size=64))
        # num_training_steps: --max_steps, else the Trainer's count from the data (here: 37 batches)
        hf.trainer_config_finalize(args, model, args.max_steps if args.max_steps > 0 else 37)
    except ValueError as err:
        return set(re.findall(r"^- ds (\S+)=", str(err), flags=re.MULTILINE))
    finally:
        unset_hf_deepspeed_config()
    return set()


def _reported(config: dict, argv: list[str]):
    trainer_args, _, _ = parse_trainer_arguments(argv)
    context = LintContext(world_size=WORLD, target="hf-trainer", device="cpu", trainer_args=trainer_args)
    return lint(copy.deepcopy(config), context)


@pytest.mark.parametrize("case", list(CASES))
def test_report_equals_what_the_trainer_stops_on(case):
    config, args = CASES[case]
    argv = args.split()
    problems = _reported(config, argv)
    stops = {p.path for p in problems if p.severity == "error" and p.message.startswith(STOP)}
    unknown_here = {p.path for p in problems if p.severity == "warning" and "unknown here" in p.message}
    trainer_stops = _transformers_mismatches(config, argv)
    assert stops <= trainer_stops and trainer_stops - stops <= unknown_here, [str(p) for p in problems]
    assert not [p for p in problems if p.severity == "error" and not p.message.startswith(STOP)], problems
    if case == "all-match":
        assert problems == []
    if case == "lr-bf16-micro":
        assert stops >= {"optimizer.params.lr", "bf16.enabled", "train_micro_batch_size_per_gpu", "train_batch_size"}


def test_an_error_names_key_value_flag_and_fix():
    problems = _reported(FIXED, MATCHING.replace("1e-4", "3e-4").split())
    (lr,) = [p for p in problems if p.path == "optimizer.params.lr"]
    assert lr.value == 1e-4 and "learning_rate = 0.0003 (given as --learning_rate 0.0003)" in lr.message
    assert (
        lr.fix == 'write "auto" (the Trainer fills it from its arguments), or pass --learning_rate 0.0001 to the script'
    )
    (betas,) = [p for p in _reported(FIXED, ["--use_cpu", "--bf16"]) if p.path == "optimizer.params.betas"]
    assert "the default: the script passes no --adam_beta1/--adam_beta2" in betas.message
    assert "pass --adam_beta1 0.9 --adam_beta2 0.95 to the script" in betas.fix


def test_steps_that_depend_on_the_data_are_warnings_without_max_steps():
    problems = _reported(FIXED, MATCHING.replace("--max_steps 100", "").replace("--warmup_steps 10", "").split())
    by_path = {p.path: p for p in problems}
    assert by_path["scheduler.params.total_num_steps"].severity == "warning"
    assert "--max_steps" in by_path["scheduler.params.total_num_steps"].fix
    # --warmup_steps 0 (the default) is 1 step at any length (max(1, ...)): checked, and 10 != 1 stops the Trainer
    assert by_path["scheduler.params.warmup_num_steps"].severity == "error"


def test_values_that_depend_on_the_world_size_are_warnings_without_it():
    trainer_args, _, _ = parse_trainer_arguments(MATCHING.split())
    context = LintContext(target="hf-trainer", device="cpu", trainer_args=trainer_args)  # no --world-size
    problems = [p for p in lint(copy.deepcopy(FIXED), context) if p.path == "train_batch_size"]
    assert [p.severity for p in problems] == ["warning"] and "depends on the world size" in problems[0].message
    assert "--world-size N" in problems[0].fix
    assert _reported({**FIXED, "train_batch_size": 24}, MATCHING.split())[0].severity == "error"  # at world size 2


def test_a_section_of_the_wrong_type_is_not_compared():
    broken = {**FIXED, "fp16": True, "optimizer": {"type": "AdamW", "params": [1]}, "zero_optimization": 3}
    problems = _reported(broken, MATCHING.replace("1e-4", "3e-4").split())  # lr differs; optimizer params no object
    stops = [p.path for p in problems if p.message.startswith(STOP)]
    assert stops == ["scheduler.params.warmup_max_lr"], [str(p) for p in problems]
    offload = {**FIXED, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": ["cpu"]}}}
    assert [p.path for p in _reported(offload, MATCHING.split()) if p.message.startswith(STOP)] == []


def test_cpu_traps(monkeypatch):
    trainer_args, _, _ = parse_trainer_arguments(["--output_dir", "out"])
    config = json.loads((PRESETS_DIR / "hf_zero3.json").read_text())
    cpu = LintContext(world_size=WORLD, target="hf-trainer", device="cpu", trainer_args=trainer_args)
    (use_cpu,) = lint(config, cpu)
    assert use_cpu.path == "TrainingArguments.use_cpu" and use_cpu.severity == "error"
    assert use_cpu.fix.startswith("pass --use_cpu to the script")
    assert (
        lint(config, LintContext(world_size=WORLD, target="hf-trainer", device="cuda", trainer_args=trainer_args)) == []
    )
    for value, trap in (("1", True), ("true", True), ("False", False)):
        context = LintContext(
            world_size=WORLD, target="hf-trainer", device="cuda", trainer_args=trainer_args, accelerate_use_cpu=value
        )
        found = [p for p in lint(config, context) if p.path == "ACCELERATE_USE_CPU"]
        assert bool(found) is trap, value
    with_key = {**config, "train_batch_size": "auto"}
    on_cpu = [p for p in lint(with_key, cpu) if p.path == "train_batch_size"]
    assert [p.severity for p in on_cpu] == ["error"] and on_cpu[0].fix.startswith("remove train_batch_size")


def test_bf16_without_use_cpu_is_transformers_own_refusal_on_a_cpu_run():
    from transformers import TrainingArguments

    with pytest.raises(ValueError) as own:  # what TrainingArguments itself says on this host (no GPU here)
        TrainingArguments(output_dir="out", bf16=True)
    trainer_args, _, _ = parse_trainer_arguments(["--bf16"])
    assert trainer_args.refused == str(own.value)  # 5.x names use_cpu; 4.57: "Your setup doesn't support bf16/gpu."
    config = json.loads((PRESETS_DIR / "hf_zero2.json").read_text())
    problems = lint(config, LintContext(world_size=WORLD, target="hf-trainer", device="cpu", trainer_args=trainer_args))
    (refused,) = [p for p in problems if p.path == "TrainingArguments"]
    assert refused.severity == "error" and trainer_args.refused in refused.message


def test_cli_ignores_script_arguments_in_one_line_and_exits_1(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(FIXED))
    argv = ["validate", str(path), "--for", "hf-trainer", "--world-size", "2", "--device", "cpu", "--"]
    assert main([*argv, *MATCHING.split(), "--model_name_or_path", "m", "--deepspeed", str(path)]) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if "note:" in line]
    assert notes == [
        "zero-kit validate: note: not TrainingArguments, ignored (your script's own): --model_name_or_path m"
    ]
    assert main([*argv, "--learning_rate", "3e-4", "--use_cpu"]) == 1
    assert "error: optimizer.params.lr (found 0.0001)" in capsys.readouterr().out


def test_cli_refuses_script_arguments_for_other_consumers_and_bad_values(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(FIXED))
    assert main(["validate", str(path), "--", "--learning_rate", "1e-4"]) == 2
    err = capsys.readouterr().err
    assert "--for is deepspeed" in err and "fix: add --for hf-trainer" in err
    assert main(["validate", str(path), "--for", "hf-trainer", "--", "--learning_rate", "fast"]) == 2
    err = capsys.readouterr().err
    assert "error: the script arguments after --: argument --learning_rate" in err and "fix:" in err
    assert "Traceback" not in err
