"""The rules about a user's own HF Trainer script (`zero-kit validate CFG --for hf-trainer -- SCRIPT ARGS`).

1. Every fixed config value the Trainer compares with its TrainingArguments: transformers' HfTrainerDeepSpeedConfig
   fills "auto" and records any other value that differs (fill_match, in trainer_config_process and
   trainer_config_finalize), then stops with "Please correct the following DeepSpeed config values that mismatch
   TrainingArguments values". Checked against that code in tests/unit/test_validate_script.py.
2. The traps of a CPU run, reproduced on two CPU ranks in tests/dist/test_hf_cpu_traps.py: without use_cpu,
   accelerate picks no backend and counts one process; ACCELERATE_USE_CPU makes accelerate skip DeepSpeed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zero_kit.lint.problem import LintContext, Problem, TrainerArguments, lookup

STOP = "the HF Trainer stops at start-up on it (its config values 'mismatch TrainingArguments values')"


@dataclass(frozen=True)
class _Compared:
    """One config key the Trainer compares, with what it compares it to."""

    path: str
    named: str
    """The Trainer's name for its value (as in its mismatch message)."""
    fields: tuple[str, ...]
    """The TrainingArguments fields behind it: the script flags."""
    value: Callable[[dict[str, Any], int | None], Any]
    """Its value from the parsed arguments and the world size (None: not known here)."""
    batch: bool = False
    """Not compared under --auto_find_batch_size (the Trainer passes must_match=False)."""


def _one(field: str) -> Callable[[dict[str, Any], int | None], Any]:
    return lambda values, world: values[field]


def _global_batch(values: dict[str, Any], world: int | None) -> int | None:
    if world is None:
        return None
    return world * values["per_device_train_batch_size"] * values["gradient_accumulation_steps"]


# In the order of trainer_config_process and trainer_config_finalize.
COMPARED = (
    _Compared(
        "train_micro_batch_size_per_gpu",
        "per_device_train_batch_size",
        ("per_device_train_batch_size",),
        _one("per_device_train_batch_size"),
        batch=True,
    ),
    _Compared(
        "gradient_accumulation_steps",
        "gradient_accumulation_steps",
        ("gradient_accumulation_steps",),
        _one("gradient_accumulation_steps"),
    ),
    _Compared(
        "train_batch_size",
        "train_batch_size (calculated: per_device_train_batch_size x gradient_accumulation_steps x world size)",
        ("per_device_train_batch_size", "gradient_accumulation_steps"),
        _global_batch,
        batch=True,
    ),
    _Compared("gradient_clipping", "max_grad_norm", ("max_grad_norm",), _one("max_grad_norm")),
    _Compared("optimizer.params.lr", "learning_rate", ("learning_rate",), _one("learning_rate")),
    _Compared(
        "optimizer.params.betas",
        "adam_beta1+adam_beta2",
        ("adam_beta1", "adam_beta2"),
        lambda values, world: [values["adam_beta1"], values["adam_beta2"]],
    ),
    _Compared("optimizer.params.eps", "adam_epsilon", ("adam_epsilon",), _one("adam_epsilon")),
    _Compared("optimizer.params.weight_decay", "weight_decay", ("weight_decay",), _one("weight_decay")),
    _Compared("scheduler.params.warmup_max_lr", "learning_rate", ("learning_rate",), _one("learning_rate")),
    _Compared(
        "fp16.enabled",
        "fp16|fp16_full_eval",
        ("fp16", "fp16_full_eval"),
        lambda values, world: values["fp16"] or values["fp16_full_eval"],
    ),
    _Compared(
        "bf16.enabled",
        "bf16|bf16_full_eval",
        ("bf16", "bf16_full_eval"),
        lambda values, world: values["bf16"] or values["bf16_full_eval"],
    ),
    _Compared(
        "scheduler.params.total_num_steps",
        "num_training_steps (calculated: --max_steps, else from the dataset length)",
        ("max_steps",),
        _one("num_training_steps"),
    ),
    _Compared(
        "scheduler.params.warmup_num_steps",
        "warmup_steps (calculated: TrainingArguments.get_warmup_steps, at least 1)",
        ("warmup_steps",),
        _one("warmup_num_steps"),
    ),
)


def trainer_rules(config: dict, context: LintContext) -> list[Problem]:
    """The script's mismatches and CPU traps; nothing without script arguments (`context.trainer_args`)."""
    script = context.trainer_args
    if script is None or context.target != "hf-trainer":
        return []
    problems = []
    for compared in COMPARED:
        if compared.batch and script.values["auto_find_batch_size"]:
            continue
        problems += _compare(config, compared, script, context.world_size)
    return problems + cpu_traps(script, context)


def _compare(config: dict, compared: _Compared, script: TrainerArguments, world: int | None) -> list[Problem]:
    """fill_match's verdict: "auto" is filled, an absent key or section is left alone, any other value must equal."""
    found = lookup(config, compared.path)
    if found is None or found == "auto":
        return []
    wanted = compared.value(script.values, world)
    if wanted is None:
        why = "the world size" if compared.path == "train_batch_size" else "the dataset length (no --max_steps)"
        message = f"the HF Trainer compares it with {compared.named}, which depends on {why}, unknown here"
        fix = f'write "auto" (the Trainer fills it), or pass {_unknown_fix(compared)} to check it'
        return [Problem("warning", compared.path, found, message, fix)]
    if found == wanted:
        return []
    message = f"{STOP}: TrainingArguments {compared.named} = {wanted!r} ({_source(compared, script, world)})"
    fix = f'write "auto" (the Trainer fills it from its arguments), or {_flag_fix(compared, found, script)}'
    return [Problem("error", compared.path, found, message, fix)]


def _source(compared: _Compared, script: TrainerArguments, world: int | None) -> str:
    """Where the Trainer's value comes from: the flags given, or their defaults."""
    if compared.path == "train_batch_size":
        micro, accum = (script.values[f] for f in compared.fields)
        return f"{micro} x {accum} x world size {world}"
    given = [f"{script.flags[f]} {script.values[f]}" for f in compared.fields if f in script.flags]
    if given:
        return "given as " + " ".join(given).replace(" True", "")
    return "the default: the script passes no " + "/".join(script.flag(f) for f in compared.fields)


def _unknown_fix(compared: _Compared) -> str:
    return "--world-size N to zero-kit validate" if compared.path == "train_batch_size" else "--max_steps N"


def _flag_fix(compared: _Compared, found: Any, script: TrainerArguments) -> str:
    """The script arguments that give `found`."""
    flags = [script.flag(f) for f in compared.fields]
    if compared.path == "train_batch_size":
        return "remove train_batch_size (DeepSpeed derives it), or pass a batch size and accumulation that give it"
    if isinstance(found, bool):
        return f"pass {flags[0]} to the script" if found else f"drop {' and '.join(flags)} from the script"
    if compared.path == "optimizer.params.betas" and isinstance(found, list) and len(found) == 2:
        return f"pass {flags[0]} {found[0]} {flags[1]} {found[1]} to the script"
    return f"pass {flags[0]} {found} to the script"


def cpu_traps(script: TrainerArguments, context: LintContext) -> list[Problem]:
    """What breaks a Trainer script on CPU ranks although DeepSpeed accepts the config."""
    problems = []
    if script.refused is not None:
        severity = "error" if context.device == "cpu" else "warning"
        where = "" if context.device == "cpu" else " on this machine (judge a GPU run on a GPU host)"
        message = f"transformers' TrainingArguments refuses the script arguments{where}: {script.refused}"
        problems.append(Problem(severity, "TrainingArguments", None, message, "change the script arguments it names"))
    if accelerate_use_cpu(context.accelerate_use_cpu):
        message = (
            "accelerate then builds its state with cpu=True and never selects DeepSpeed (AcceleratorState): the"
            " Trainer trains without DeepSpeed and ignores this config, silently"
        )
        fix = "unset ACCELERATE_USE_CPU; on a CPU host pass --use_cpu to the script instead (it keeps DeepSpeed)"
        problems.append(Problem("error", "ACCELERATE_USE_CPU", context.accelerate_use_cpu, message, fix))
    elif context.device == "cpu" and not script.values["use_cpu"]:
        message = (
            "on a host without CUDA, accelerate (inside TrainingArguments) picks no distributed backend unless"
            " use_cpu and counts one process: with train_batch_size DeepSpeed's batch check fails; without it every"
            " rank trains as rank 0 on the same batches and writes the same files, and exits 0"
        )
        fix = f"pass {script.flag('use_cpu')} to the script (TrainingArguments(use_cpu=True))"
        problems.append(Problem("error", "TrainingArguments.use_cpu", False, message, fix))
    return problems


def accelerate_use_cpu(value: str | None) -> bool:
    """Whether accelerate reads ACCELERATE_USE_CPU=`value` as set (its own parse_flag_from_env: str_to_bool)."""
    if value is None:
        return False
    from accelerate.utils.environment import str_to_bool

    try:
        return bool(str_to_bool(value))
    except ValueError:
        return False  # accelerate's parse_flag_from_env raises here; the run fails loudly, not silently
